"""Records v2 (issue 15): message and flag records authenticated.

- The committed v1 fixture store (tests/fixtures/casbox-v1) is upgraded
  in place by `doveadm casbox upgrade`; a second run has nothing to do;
  the mail then reads byte-exact and scrub is clean.
- A message record edited without the record key (its last part
  swapped for another message's, header and MAC kept) fails for that
  message only: its FETCH fails with a log line naming it, the other
  messages FETCH byte-exact, and scrub names mailbox, UID and the
  authentication failure (exit 65).
"""

import imaplib
import os
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dovecot_harness  # noqa: E402
from dovecot_harness import Dovecot, ok  # noqa: E402

# refcounts here are message references only (no deltas: cross-message
# compression adds a reference per dependent, test_storage_xmsg.py)
KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes",
        "casbox_cross_message": "no"}
CONF = "lmtp_add_received_header = no\n"


def table(dc, *args, check=True):
    res = dc.doveadm("-f", "tab", "casbox", *args, check=check)
    lines = res.stdout.rstrip("\n").split("\n")
    if lines == [""]:
        return res, []
    header = ["username" if h in ("", "Username") else h
              for h in lines[0].split("\t")]
    return res, [dict(zip(header, ln.split("\t"))) for ln in lines[1:]]


def msg(n):
    return (b"From: a@example.com\r\nSubject: records %d\r\n\r\n" % n +
            b"".join(b"line %d of message %d\r\n" % (i, n)
                     for i in range(200)))


def fetch_body(dc, uid, mailbox="INBOX"):
    """BODY[] of uid, or None if the server refused it (Dovecot answers
    a FETCH that fails with NO or, by imap_fetch_failure, hangs up)."""
    imap = dc.imap_login("user1")
    try:
        imap.select(mailbox)
        typ, data = imap.uid("FETCH", str(uid), "(BODY.PEEK[])")
        if typ != "OK" or not isinstance(data[0], tuple):
            return None
        imap.logout()
        return data[0][1]
    except imaplib.IMAP4.abort:
        return None


def tool(name):
    return os.path.join(dovecot_harness.TOP_BUILDDIR, "tests", name)


META_ITEMS = "(BODYSTRUCTURE BODY ENVELOPE)"


class RecordsV2Test(unittest.TestCase):

    def test_fixture_upgrade(self):
        fixture = os.path.join(dovecot_harness.TOP_SRCDIR, "tests",
                               "fixtures", "casbox-v1")

        def read(name):
            with open(os.path.join(fixture, name), "rb") as f:
                return f.read()
        served = {n: read("served%d.eml" % n) for n in (1, 3, 4)}
        with Dovecot(plugin_settings=KEYS, extra_conf=CONF) as dc:
            home = dc.home("user1")
            shutil.rmtree(home, ignore_errors=True)
            shutil.copytree(os.path.join(fixture, "home"), home)
            for root, dirs, files in os.walk(home):
                for name in dirs + files:
                    os.chown(os.path.join(root, name), dc.uid, dc.gid)
            os.chown(home, dc.uid, dc.gid)
            os.chmod(os.path.join(home, "casbox.key"), 0o600)
            dump = tool("storage-dump")
            root = os.path.join(home, "casbox")

            _, rows = table(dc, "upgrade", "-u", "user1")
            self.assertEqual(len(rows), 1, rows)
            # 3 message records (INBOX 1 and 3, Work 1) and the flag
            # record of INBOX 3 (\Flagged after delivery)
            self.assertEqual(rows[0]["records_upgraded"], "4", rows)
            self.assertEqual(rows[0]["records_malformed"], "0", rows)
            self.assertEqual(rows[0]["marker_was_missing"], "0", rows)
            _, rows = table(dc, "upgrade", "-u", "user1")
            self.assertEqual(rows[0]["records_upgraded"], "0", rows)
            self.assertEqual(rows[0]["batches"], "0", rows)

            self.assertEqual(fetch_body(dc, 1), served[1])
            self.assertEqual(fetch_body(dc, 3), served[3])
            self.assertEqual(fetch_body(dc, 1, "Work"), served[4])
            # the fixture's sealed metadata is version 1 (BODY stored):
            # it opens (no warning) and answers as sdbox does from the
            # same bytes
            imap = dc.imap_login("user1")
            imap.select("INBOX")
            got = [ok(imap.uid("FETCH", str(uid), META_ITEMS))[0]
                   for uid in (1, 3)]
            imap.logout()
            self.assertFalse(re.search(r"sealed metadata",
                                       dc.log_text()))
            imap = dc.imap_login("user1")
            imap.select("INBOX")
            typ, data = imap.uid("FETCH", "3", "(FLAGS)")
            imap.logout()
            self.assertEqual(typ, "OK")
            self.assertIn(b"\\Flagged", data[0])
            self.assertEqual(dc.casbox_audit("user1"), [])
            res = subprocess.run([dump, root], user=dc.uid, group=dc.gid,
                                 capture_output=True, text=True)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        with Dovecot(mail_location="sdbox:~/sdbox", mail_plugins=[],
                     extra_conf=CONF) as sd:
            imap = sd.imap_login("user1")
            for n in (1, 3):
                ok(imap.append("INBOX", None, None, served[n]))
            imap.select("INBOX")
            want = [ok(imap.uid("FETCH", str(uid), META_ITEMS))[0]
                    for uid in (1, 2)]
            imap.logout()
        for answer in got + want:
            self.assertIn(b"BODYSTRUCTURE (", answer)
            self.assertIn(b"ENVELOPE (", answer)
        strip = re.compile(rb"^\d+ \(UID \d+ ")
        self.assertEqual([strip.sub(b"", g) for g in got],
                         [strip.sub(b"", w) for w in want])

    def test_swapped_part_refused_and_named(self):
        with Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=["casbox"], plugin_settings=KEYS,
                     extra_conf=CONF) as dc:
            root = os.path.join(dc.home("user1"), "casbox")
            for n in range(1, 4):
                dc.lmtp_deliver("user1", msg(n))
            bodies = {n: fetch_body(dc, n) for n in range(1, 4)}
            self.assertEqual(table(dc, "scrub", "-u", "user1")[1], [])
            subprocess.run([tool("doveadm-tamper"), root, "swap-parts"],
                           user=dc.uid, group=dc.gid, check=True)
            dc.allow_log(r"authentication failed")
            dc.allow_log(r"FETCH .* failed")

            self.assertIsNone(fetch_body(dc, 1))
            self.assertIsNotNone(dc.wait_log(
                r"casbox.*message record of mailbox [0-9a-f]{32} uid 1: "
                r"authentication failed"))
            for n in (2, 3):
                self.assertEqual(fetch_body(dc, n), bodies[n])

            res, rows = table(dc, "scrub", "-u", "user1", check=False)
            self.assertEqual(res.returncode, 65, res.stdout + res.stderr)
            named = [(r["mailbox"], r["uid"]) for r in rows
                     if r["mailbox"] != "-"]
            self.assertEqual(named, [("INBOX", "1")], rows)
            self.assertIn("authentication failed", rows[0]["cause"])
            # the refcounts the edit put out of step: message 1's own
            # last blob is no longer referenced by any record that
            # verifies...
            lost = [r["blob"] for r in rows
                    if r["cause"] == "refcount 1, but 0 references"]
            self.assertEqual(len(lost), 1, rows)
            # ...and a repair must not lower it (gc would delete the
            # attachment of the message whose record was edited)
            dc.allow_log(r"refcounts are not lowered")
            table(dc, "scrub", "-u", "user1", "--repair", check=False)
            res, rows = table(dc, "scrub", "-u", "user1", check=False)
            self.assertIn(lost[0], [r["blob"] for r in rows], rows)
            # gc does not run over a record it cannot trust (it could
            # drop the recovery record of that message): it names it
            dc.allow_log(r"casbox gc: .*uid 1: authentication failed")
            res = dc.doveadm("casbox", "gc", "-u", "user1", "--all",
                             check=False)
            self.assertEqual(res.returncode, 75, res.stdout + res.stderr)
            self.assertRegex(res.stderr, r"uid 1: authentication failed")
            for n in (2, 3):
                self.assertEqual(fetch_body(dc, n), bodies[n])


if __name__ == "__main__":
    unittest.main()
