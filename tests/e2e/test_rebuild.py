"""Index rebuild from the LSM (doc/casbox-storage.md, "Rebuild").

After every dovecot.index* and dovecot.list.index* file under the root is
removed, casbox brings back the same mailboxes, mailbox GUIDs,
UIDVALIDITY, UIDNEXT, UIDs, message GUIDs, flags, keywords, received and
save dates, sizes and bytes; modseqs do not go down. `doveadm
force-resync` rebuilds through the same code. The same steps on sdbox are
the control: it keeps UIDs and GUIDs but loses flags, keywords,
UIDVALIDITY and the mailbox GUID (as doc/casbox-storage.md says), so the
comparison can fail."""

import os
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
USER = "user1"
BOXES = ("INBOX", "Work")
FETCH = ("mailbox-guid mailbox uid guid flags date.received date.saved "
         "size.physical modseq")
STATUS = "guid uidvalidity uidnext highestmodseq messages"
LOST_LOG = r"casbox: Index files were lost: recovered \d+ messages"
REBUILT_LOG = r"casbox: Rebuilt index from the LSM records"


def index_files(root):
    """Every Dovecot index and list index file under root."""
    found = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.startswith(("dovecot.index", "dovecot.list.index")):
                found.append(os.path.join(dirpath, name))
    return sorted(found)


def parse_tab(text):
    lines = text.splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"))) for line in lines[1:]]


def strip_recent(flags):
    """\\Recent is session state, not kept by any rebuild."""
    return " ".join(sorted(f for f in flags.split() if f != "\\Recent"))


class Snapshot:
    """What a user can see of the mailboxes, taken with doveadm + IMAP."""

    def __init__(self, dc):
        # doveadm logs to its stderr, not to the server log
        self.stderr = ""
        self.mailboxes = self.doveadm(dc, "mailbox", "list", "-u",
                                      USER).split()
        self.status = {}
        self.msgs = {}
        for box in BOXES:
            out = self.doveadm(dc, "-f", "tab", "mailbox", "status", "-u",
                               USER, STATUS, box)
            self.status[box] = parse_tab(out)[0]
            out = self.doveadm(dc, "-f", "tab", "fetch", "-u", USER, FETCH,
                               "mailbox", box, "all")
            self.msgs[box] = {int(m["uid"]): m for m in parse_tab(out)}
        self.bodies = fetch_bodies(dc)

    def doveadm(self, dc, *args):
        r = dc.doveadm(*args)
        self.stderr += r.stderr
        return r.stdout

    def rebuilds(self, regex):
        return len(re.findall(regex, self.stderr))

    def durable(self, box):
        """Per message: everything except modseq and \\Recent."""
        out = {}
        for uid, m in self.msgs[box].items():
            d = dict(m)
            del d["modseq"]
            d["flags"] = strip_recent(d["flags"])
            out[uid] = d
        return out


def fetch_bodies(dc):
    imap = dc.imap_login(USER)
    bodies = {}
    try:
        for box in BOXES:
            typ, _ = imap.select(box, readonly=True)
            assert typ == "OK", box
            typ, data = imap.uid("FETCH", "1:*", "(BODY.PEEK[])")
            assert typ == "OK", data
            for item in data:
                if not isinstance(item, tuple):
                    continue
                uid = int(re.search(rb"UID (\d+)", item[0]).group(1))
                bodies[(box, uid)] = item[1]
    finally:
        imap.logout()
    return bodies


def populate(dc):
    """~100 corpus messages in INBOX (LMTP) and Work (APPEND), flags,
    keywords and \\Deleted on some, a few expunged (UID gaps)."""
    inbox = []
    for path in corpus_files("usrp-users-3000", limit=60, step=7):
        with open(path, "rb") as f:
            inbox.append(f.read())
    dc.lmtp_deliver_many(USER, inbox)
    dc.doveadm("mailbox", "create", "-u", USER, "Work")
    imap = dc.imap_login(USER)
    try:
        n = 0
        for path in corpus_files("mime-edge", limit=45):
            with open(path, "rb") as f:
                data = f.read()
            if not data.strip():
                continue
            flags = ("(\\Flagged $Label1)" if n % 5 == 0 else
                     "(\\Seen)" if n % 3 == 0 else None)
            typ, resp = imap.append("Work", flags,
                                    '"14-Jul-2021 02:44:25 +0200"', data)
            assert typ == "OK", resp
            n += 1
        imap.select("INBOX")
        for cmd in ((b"1:10", "+FLAGS", r"(\Seen Todo)"),
                    (b"5:15", "+FLAGS", r"(\Answered $Forwarded)"),
                    (b"20:25", "+FLAGS", r"(\Deleted)"),
                    (b"8", "-FLAGS", r"(\Seen)")):
            typ, resp = imap.uid("STORE", *cmd)
            assert typ == "OK", resp
    finally:
        imap.logout()
    dc.doveadm("flags", "add", "-u", USER, r"\Draft Project-X", "mailbox",
               "Work", "uid", "2:6")
    dc.doveadm("flags", "remove", "-u", USER, "$Label1", "mailbox", "Work",
               "uid", "11")
    # UID gaps, including the highest UID of INBOX
    dc.doveadm("expunge", "-u", USER, "mailbox", "INBOX", "uid", "3,30:32,60")
    dc.doveadm("expunge", "-u", USER, "mailbox", "Work", "uid", "7")


class RebuildTest(unittest.TestCase):

    maxDiff = None

    def assert_recovered(self, before, after):
        self.assertEqual(after.mailboxes, before.mailboxes)
        for box in BOXES:
            self.assertEqual(after.durable(box), before.durable(box))
            for key in ("guid", "uidvalidity", "uidnext", "messages"):
                self.assertEqual(after.status[box][key],
                                 before.status[box][key], (box, key))
            for uid, m in before.msgs[box].items():
                self.assertGreaterEqual(int(after.msgs[box][uid]["modseq"]),
                                        int(m["modseq"]), (box, uid))
            # the highest modseq never falls below any message's modseq
            top = max(int(m["modseq"]) for m in before.msgs[box].values())
            self.assertGreaterEqual(int(after.status[box]["highestmodseq"]),
                                    top, box)
        self.assertEqual(after.bodies, before.bodies)

    def assert_sane(self, snap):
        """The corpus is what the comparisons rest on."""
        inbox, work = snap.msgs["INBOX"], snap.msgs["Work"]
        self.assertEqual(len(inbox), 55)
        self.assertGreater(len(work), 30)
        self.assertNotIn(3, inbox)
        self.assertEqual(snap.status["INBOX"]["uidnext"], "61")
        self.assertIn("Todo", inbox[1]["flags"])
        self.assertIn("\\Deleted", inbox[21]["flags"])
        self.assertIn("Project-X", work[2]["flags"])
        self.assertIn("$Label1", work[1]["flags"])
        self.assertGreater(int(inbox[10]["modseq"]), 1)

    def lose_index_files(self, dc, root):
        lost = index_files(root)
        # dovecot.index.log of INBOX and Work at least; the list index
        self.assertGreaterEqual(len(lost), 4, lost)
        self.assertTrue(any("dovecot.list.index" in p for p in lost), lost)
        for path in lost:
            os.unlink(path)

    def test_casbox_rebuild(self):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            root = os.path.join(dc.home(USER), "casbox")
            populate(dc)
            before = Snapshot(dc)
            self.assert_sane(before)

            # 1. lost index files: the first access rebuilds
            self.lose_index_files(dc, root)
            after = Snapshot(dc)
            self.assert_recovered(before, after)
            self.assertEqual(after.rebuilds(LOST_LOG), 2, after.stderr)

            # 2. doveadm force-resync with the index in place: the same
            # code, flags of the live index win over the mirror
            dc.doveadm("flags", "add", "-u", USER, "Late", "mailbox",
                       "INBOX", "uid", "40")
            before = Snapshot(dc)
            self.assertIn("Late", before.msgs["INBOX"][40]["flags"])
            r = dc.doveadm("force-resync", "-u", USER, "*")
            self.assertEqual(len(re.findall(REBUILT_LOG, r.stderr)), 2,
                             r.stderr)
            after = Snapshot(dc)
            self.assert_recovered(before, after)
            self.assertEqual(after.rebuilds(LOST_LOG), 0, after.stderr)
            self.assertEqual(after.rebuilds(REBUILT_LOG), 0, after.stderr)

            # 3. lost files, then force-resync first
            self.lose_index_files(dc, root)
            r = dc.doveadm("force-resync", "-u", USER, "*")
            self.assertEqual(len(re.findall(LOST_LOG, r.stderr)), 2,
                             r.stderr)
            self.assertEqual(len(re.findall(REBUILT_LOG, r.stderr)), 2,
                             r.stderr)
            self.assert_recovered(before, Snapshot(dc))

            # expunged UIDs are not handed out again
            dc.lmtp_deliver(USER, b"Subject: new\r\n\r\nnew\r\n")
            r = dc.doveadm("-f", "tab", "fetch", "-u", USER, "uid",
                           "mailbox", "INBOX", "all")
            uids = [int(m["uid"]) for m in parse_tab(r.stdout)]
            self.assertEqual(uids[-1], 61)

            # 4. the Work directory and the list index lost: force-resync
            # restores the directory from the mailbox record
            before = Snapshot(dc)
            shutil.rmtree(os.path.join(root, "mailboxes", "Work"))
            for path in index_files(root):
                os.unlink(path)
            r = dc.doveadm("force-resync", "-u", USER, "*")
            self.assertIn("Mailbox Work: casbox: Mailbox directory was "
                          "lost: restored it", r.stderr)
            self.assert_recovered(before, Snapshot(dc))

            # 5. the whole mailboxes/ tree lost: the first access creates
            # INBOX under its old GUID and restores the other directories
            shutil.rmtree(os.path.join(root, "mailboxes"))
            for path in index_files(root):
                os.unlink(path)
            r = dc.doveadm("mailbox", "status", "-u", USER, "messages",
                           "INBOX")
            self.assertEqual(r.stdout.split(), ["INBOX", "messages=56"],
                             r.stderr)
            self.assertIn("Mailbox INBOX: casbox: Mailbox directory was "
                          "lost: recreating it", r.stderr)
            self.assertIn("Mailbox Work: casbox: Mailbox directory was "
                          "lost: restored it", r.stderr)
            self.assert_recovered(before, Snapshot(dc))

    def test_unreleased_expunge_left_out(self):
        """A record the intact index expunged (its release lost, here by
        putting back the LSM from before the expunge) stays out of a
        force-resync, which also finishes its release: lost index files
        afterwards do not bring the expunged message back."""
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            root = os.path.join(dc.home(USER), "casbox")
            dc.lmtp_deliver_many(USER, [b"Subject: m%d\r\n\r\nbody %d\r\n"
                                        % (n, n) for n in range(1, 6)])
            dc.doveadm("flags", "add", "-u", USER, r"\Seen", "mailbox",
                       "INBOX", "uid", "2:3")
            lsm = os.path.join(root, "lsm")
            saved = os.path.join(dc.tmp, "lsm-before-expunge")
            # cp -a keeps the mail user's ownership
            subprocess.run(["cp", "-a", lsm, saved], check=True)
            dc.doveadm("expunge", "-u", USER, "mailbox", "INBOX", "uid", "3")
            shutil.rmtree(lsm)
            subprocess.run(["cp", "-a", saved, lsm], check=True)

            r = dc.doveadm("force-resync", "-u", USER, "INBOX")
            self.assertIn("4 messages", r.stderr)
            self.assertIn("1 expunged records left out and released",
                          r.stderr)
            # the record is gone and its blobs' references with it
            dump = subprocess.run(
                [os.path.join(os.environ.get("CASBOX_TOP_BUILDDIR", "."),
                              "tests", "storage-dump"), root],
                user=dc.uid, group=dc.gid, capture_output=True, text=True)
            self.assertEqual(dump.returncode, 0, dump.stdout + dump.stderr)
            self.assertEqual(re.findall(r"^m \S+ (\d+) ", dump.stdout,
                                        re.M), ["1", "2", "4", "5"])
            r = dc.doveadm("-f", "tab", "fetch", "-u", USER, "uid flags",
                           "mailbox", "INBOX", "all")
            self.assertEqual([m["uid"] for m in parse_tab(r.stdout)],
                             ["1", "2", "4", "5"])

            for path in index_files(root):
                os.unlink(path)
            r = dc.doveadm("-f", "tab", "fetch", "-u", USER, "uid flags",
                           "mailbox", "INBOX", "all")
            self.assertIn("recovered 4 messages", r.stderr)
            msgs = parse_tab(r.stdout)
            self.assertEqual([m["uid"] for m in msgs], ["1", "2", "4", "5"])
            self.assertIn("\\Seen", msgs[1]["flags"])

    def test_sdbox_control(self):
        """sdbox after the same loss: UIDs, GUIDs and bytes survive;
        flags, keywords, UIDVALIDITY and mailbox GUIDs do not."""
        with Dovecot(mail_location="sdbox:~/sdbox", mail_plugins=[]) as dc:
            root = os.path.join(dc.home(USER), "sdbox")
            populate(dc)
            before = Snapshot(dc)
            self.assert_sane(before)
            self.lose_index_files(dc, root)
            dc.doveadm("force-resync", "-u", USER, "*")
            after = Snapshot(dc)

            self.assertEqual(after.mailboxes, before.mailboxes)
            self.assertEqual(after.bodies, before.bodies)
            for box in BOXES:
                b, a = before.durable(box), after.durable(box)
                self.assertEqual(sorted(a), sorted(b))
                for uid in b:
                    for key in ("guid", "date.received", "size.physical"):
                        self.assertEqual(a[uid][key], b[uid][key])
                    self.assertEqual(a[uid]["flags"], "", (box, uid))
                self.assertTrue(any(m["flags"] for m in b.values()))
                for key in ("guid", "uidvalidity"):
                    self.assertNotEqual(after.status[box][key],
                                        before.status[box][key], (box, key))
                self.assertEqual(after.status[box]["messages"],
                                 before.status[box]["messages"])


if __name__ == "__main__":
    unittest.main()
