"""Lost index files: the mailbox comes back from the LSM records with
the same mailbox GUID, UIDVALIDITY, UIDs, message GUIDs, flags and
keywords, and UIDs of expunged messages are not handed out again."""

import glob
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
FIELDS = "uid guid flags date.received size.virtual text"


def msg(n):
    return b"From: a@example.com\r\nSubject: m%d\r\n\r\nbody %d\r\n" % (n, n)


class StorageRecoverTest(unittest.TestCase):

    def state(self, dc):
        out = []
        for box in ("INBOX", "Work"):
            out.append(dc.doveadm("mailbox", "status", "-u", "user1",
                                  "guid uidvalidity uidnext messages",
                                  box).stdout)
            out.append(dc.doveadm("fetch", "-u", "user1", FIELDS,
                                  "mailbox", box, "all").stdout)
        return out

    def test_lost_index_files(self):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            for n in range(1, 4):
                dc.lmtp_deliver("user1", msg(n))
            dc.doveadm("mailbox", "create", "-u", "user1", "Work")
            dc.doveadm("copy", "-u", "user1", "Work", "mailbox", "INBOX",
                       "uid", "1:2")
            dc.doveadm("flags", "add", "-u", "user1", r"\Seen $Label1 Todo",
                       "mailbox", "Work", "uid", "2")
            dc.doveadm("expunge", "-u", "user1", "mailbox", "INBOX",
                       "uid", "3")
            before = self.state(dc)
            self.assertIn("uidnext=4", before[0])
            self.assertIn("$Label1", before[3])

            root = os.path.join(dc.home("user1"), "casbox")
            lost = glob.glob(os.path.join(root, "mailboxes", "*",
                                          "casbox-Mails", "dovecot.index*"))
            self.assertGreaterEqual(len(lost), 2)
            for path in lost:
                os.unlink(path)
            # doveadm logs to its stderr: the first open recovers
            for box in ("INBOX", "Work"):
                r = dc.doveadm("mailbox", "status", "-u", "user1",
                               "messages", box)
                self.assertIn("Index files were lost: recovered 2 "
                              "messages", r.stderr)
            self.assertEqual(self.state(dc), before)
            # UID 3 was expunged: it must not come back
            dc.lmtp_deliver("user1", msg(4))
            r = dc.doveadm("fetch", "-u", "user1", "uid", "mailbox",
                           "INBOX", "all")
            self.assertEqual(r.stdout.split(), ["uid:", "1", "uid:", "2",
                                                "uid:", "4"])


if __name__ == "__main__":
    unittest.main()
