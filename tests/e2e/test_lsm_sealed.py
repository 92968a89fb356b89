"""The LSM is sealed (doc/casbox-lsm.md "Sealing", issue 15): after
deliveries, a keyword set over IMAP, a new mailbox and a flag change, no
file of the casbox root's lsm/ contains the keyword, the mailbox name or
a message GUID (hex or binary); another store's key is refused at open
with an error naming the key file; a format-1 (plaintext) store, the
committed fixture tests/fixtures/casbox-v1, is readable and resealed in
place on its first open (its keyword and mailbox name are plaintext in
the fixture's LSM before, and gone after)."""

import imaplib
import os
import re
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dovecot_harness  # noqa: E402
from dovecot_harness import Dovecot, ok  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
KEYWORD = b"$QuokkaKeyword7731"
MAILBOX = b"ZanzibarTelemetryFolder"
MSG = (b"From: a@example.com\r\nTo: b@example.com\r\n"
       b"Subject: sealed lsm\r\nMessage-ID: <sealed@example.com>\r\n"
       b"\r\nbody\r\n")


def lsm_files(root):
    lsm = os.path.join(root, "lsm")
    return [os.path.join(lsm, n) for n in sorted(os.listdir(lsm))
            if n != "LOCK"]


def found(root, needles):
    """(file, needle) for each needle in any file of root/lsm."""
    hits = []
    for path in lsm_files(root):
        with open(path, "rb") as f:
            data = f.read()
        hits += [(os.path.basename(path), n) for n in needles if n in data]
    return hits


def guids(dc, user, mailbox):
    res = dc.doveadm("-f", "tab", "fetch", "-u", user, "guid", "mailbox",
                     mailbox, "all")
    return [ln.strip() for ln in res.stdout.splitlines()[1:] if ln.strip()]


class LsmSealedTest(unittest.TestCase):

    def test_nothing_readable_in_lsm(self):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            for _ in range(3):
                dc.lmtp_deliver("user1", MSG)
            imap = dc.imap_login("user1")
            ok(imap.create(MAILBOX.decode()))
            ok(imap.select("INBOX"))
            ok(imap.uid("STORE", "1:*", "+FLAGS",
                        "(%s \\Flagged)" % KEYWORD.decode()))
            ok(imap.uid("COPY", "2", MAILBOX.decode()))
            imap.logout()
            msg_guids = guids(dc, "user1", "INBOX")
            self.assertEqual(len(msg_guids), 3)
            self.assertTrue(all(re.fullmatch(r"[0-9a-f]{32}", g)
                                for g in msg_guids), msg_guids)
            box_guid = re.search(
                r"guid=([0-9a-f]{32})",
                dc.doveadm("mailbox", "status", "-u", "user1", "guid",
                           "INBOX").stdout).group(1)
            # the records are there (read through the key)...
            dump = dc.casbox_audit("user1")
            self.assertEqual(dump, [])
            root = os.path.join(dc.home("user1"), "casbox")
            # ...and the flag change went through the LSM's WAL
            self.assertTrue(any(p.endswith(".wal") and
                                os.path.getsize(p) > 32
                                for p in lsm_files(root)))
            needles = [KEYWORD, KEYWORD[1:], MAILBOX, b"Flagged",
                       bytes.fromhex(box_guid), box_guid.encode()]
            for g in msg_guids:
                needles += [g.encode(), bytes.fromhex(g)]
            self.assertEqual(found(root, needles), [])
            with open(os.path.join(root, "lsm", "MANIFEST"), "rb") as f:
                self.assertEqual(f.read(8), b"CBXMAN02")

    def test_wrong_key_refused(self):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            dc.lmtp_deliver("user1", MSG)
            dc.lmtp_deliver("user2", MSG)
            key1 = os.path.join(dc.home("user1"), "casbox.key")
            key2 = os.path.join(dc.home("user2"), "casbox.key")
            shutil.copy(key1, key1 + ".saved")
            shutil.copy(key2, key1)
            dc.allow_log(r"is not the key of store|casbox")
            res = dc.doveadm("fetch", "-u", "user1", "text", "mailbox",
                             "INBOX", "all", check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertNotIn("body", res.stdout)
            res = dc.doveadm("casbox", "stats", "-u", "user1",
                             check=False)
            self.assertEqual(res.returncode, 65, res.stderr)
            self.assertRegex(res.stderr, r"key file %s is not the key of "
                             r"store .*fingerprint" % re.escape(key1))
            # IMAP: the message does not read, the log names the key
            imap = dc.imap_login("user1")
            try:
                imap.select("INBOX")
                typ, data = imap.uid("FETCH", "1", "(BODY.PEEK[])")
                self.assertFalse(typ == "OK" and b"body" in repr(
                    data).encode(), data)
                imap.logout()
            except imaplib.IMAP4.abort:
                pass
            self.assertIsNotNone(dc.wait_log(
                r"key file %s is not the key of store" % re.escape(key1)))
            # the right key again: everything reads
            shutil.copy(key1 + ".saved", key1)
            res = dc.doveadm("fetch", "-u", "user1", "text", "mailbox",
                             "INBOX", "all")
            self.assertIn("body", res.stdout)

    def test_plaintext_fixture_resealed(self):
        fixture = os.path.join(dovecot_harness.TOP_SRCDIR, "tests",
                               "fixtures", "casbox-v1")
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS,
                     extra_conf="lmtp_add_received_header = no\n") as dc:
            home = dc.home("user1")
            shutil.rmtree(home, ignore_errors=True)
            shutil.copytree(os.path.join(fixture, "home"), home)
            for top, dirs, files in os.walk(home):
                for name in dirs + files:
                    os.chown(os.path.join(top, name), dc.uid, dc.gid)
            os.chown(home, dc.uid, dc.gid)
            os.chmod(os.path.join(home, "casbox.key"), 0o600)
            root = os.path.join(home, "casbox")
            # control: the format-1 LSM has them in plaintext
            self.assertEqual(sorted({n for _, n in found(
                root, [b"$Fixture", b"Work"])}), [b"$Fixture", b"Work"])
            with open(os.path.join(fixture, "served4.eml"), "rb") as f:
                served4 = f.read()
            res = dc.doveadm("fetch", "-u", "user1", "text", "mailbox",
                             "Work", "all")
            self.assertIn(served4.split(b"\r\n\r\n", 1)[1][:20].decode(),
                          res.stdout.replace("\n", "\r\n"))
            self.assertEqual(found(root, [b"$Fixture", b"Work"]), [])
            with open(os.path.join(root, "lsm", "MANIFEST"), "rb") as f:
                self.assertEqual(f.read(8), b"CBXMAN02")
            self.assertEqual(dc.casbox_audit("user1"), [])
            imap = dc.imap_login("user1")
            ok(imap.select("Work"))
            data = ok(imap.uid("FETCH", "1:*", "(FLAGS)"))
            self.assertIn(b"$Fixture", data[0])
            imap.logout()


if __name__ == "__main__":
    unittest.main()
