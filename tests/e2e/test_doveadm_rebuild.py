"""doveadm casbox rebuild: mailbox indexes rebuilt from the LSM records
give back what the user saw (the same checks as test_rebuild.py does for
doveadm force-resync, with its corpus and snapshot helpers)."""

import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot  # noqa: E402
# its assertions only: a TestCase class bound here would run again
import test_rebuild  # noqa: E402
from test_rebuild import (KEYS, REBUILT_LOG, USER, Snapshot,  # noqa: E402
                          index_files, parse_tab, populate)


def rebuild(dc, *mailboxes, check=True):
    r = dc.doveadm("-f", "tab", "casbox", "rebuild", "-u", USER,
                   *mailboxes, check=check)
    return r, {row["mailbox"]: row for row in parse_tab(r.stdout)}


class DoveadmRebuildTest(unittest.TestCase):

    maxDiff = None

    def test_rebuild_after_lost_index_files(self):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            root = os.path.join(dc.home(USER), "casbox")
            populate(dc)
            before = Snapshot(dc)
            test_rebuild.RebuildTest.assert_sane(self, before)

            lost = index_files(root)
            self.assertGreaterEqual(len(lost), 4, lost)
            for path in lost:
                os.unlink(path)
            r, rows = rebuild(dc)
            self.assertEqual(sorted(rows), ["INBOX", "Work"], r.stdout)
            for box in ("INBOX", "Work"):
                self.assertEqual(rows[box]["result"], "rebuilt")
                self.assertEqual(rows[box]["messages"],
                                 before.status[box]["messages"])
            self.assertGreaterEqual(
                len(re.findall(REBUILT_LOG, r.stderr)), 2, r.stderr)
            after = Snapshot(dc)
            test_rebuild.RebuildTest.assert_recovered(self, before, after)

            # one named mailbox, index in place: only that one
            r, rows = rebuild(dc, "Work")
            self.assertEqual(list(rows), ["Work"])
            self.assertEqual(len(re.findall(REBUILT_LOG, r.stderr)), 1,
                             r.stderr)
            test_rebuild.RebuildTest.assert_recovered(self, before,
                                                      Snapshot(dc))

    def test_failure_is_reported(self):
        """A mailbox that cannot be rebuilt fails the command; the
        others are still rebuilt."""
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            dc.lmtp_deliver_many(USER, [b"Subject: x\n\nhi\n"])
            dc.doveadm("mailbox", "create", "-u", USER, "Work")
            path = os.path.join(dc.home(USER), "casbox", "mailboxes",
                                "Work", "casbox-Mails")
            os.chmod(path, 0)
            try:
                r, rows = rebuild(dc, check=False)
            finally:
                os.chmod(path, 0o700)
            self.assertEqual(r.returncode, 75, r)
            self.assertTrue(rows["Work"]["result"].startswith(
                "failed: ") and "Permission denied" in
                rows["Work"]["result"], rows)
            self.assertEqual(rows["INBOX"]["result"], "rebuilt")
            self.assertEqual(rows["INBOX"]["messages"], "1")

    def test_changed_guid_survives_rebuild(self):
        """A mailbox GUID change (as dsync makes it) keeps the messages,
        and a rebuild from the LSM alone brings the new GUID back."""
        new_guid = "0123456789abcdef0123456789abcdef"
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            root = os.path.join(dc.home(USER), "casbox")
            populate(dc)
            old = Snapshot(dc)
            self.assertNotEqual(old.status["Work"]["guid"], new_guid)
            dc.doveadm("mailbox", "update", "-u", USER, "--mailbox-guid",
                       new_guid, "Work")
            before = Snapshot(dc)
            self.assertEqual(before.status["Work"]["guid"], new_guid)
            self.assertEqual(before.bodies, old.bodies)
            self.assertEqual(len(before.msgs["Work"]), len(old.msgs["Work"]))
            for path in index_files(root):
                os.unlink(path)
            r, rows = rebuild(dc)
            self.assertEqual(rows["Work"]["result"], "rebuilt")
            after = Snapshot(dc)
            self.assertEqual(after.status["Work"]["guid"], new_guid)
            test_rebuild.RebuildTest.assert_recovered(self, before, after)

    def test_old_guid_given_to_a_new_mailbox(self):
        """After a GUID change the old GUID is still the storage id of
        the mailbox's records; a mailbox created later with that GUID
        gets its own records, before and after a rebuild."""
        new_guid = "fedcba9876543210fedcba9876543210"
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            populate(dc)
            before = Snapshot(dc)
            old_guid = before.status["Work"]["guid"]
            dc.doveadm("mailbox", "update", "-u", USER, "--mailbox-guid",
                       new_guid, "Work")
            dc.doveadm("mailbox", "create", "-u", USER, "-g", old_guid,
                       "Other")
            imap = dc.imap_login(USER)
            try:
                for i in range(3):
                    typ, resp = imap.append(
                        "Other", None, None,
                        b"Subject: other %d\r\n\r\nbody %d\r\n" % (i, i))
                    self.assertEqual(typ, "OK", resp)
            finally:
                imap.logout()
            r = dc.doveadm("-f", "tab", "mailbox", "status", "-u", USER,
                           "guid messages", "Other")
            status = parse_tab(r.stdout)[0]
            self.assertEqual((status["guid"], status["messages"]),
                             (old_guid, "3"))
            self.assertEqual(Snapshot(dc).bodies, before.bodies)
            r, rows = rebuild(dc)
            self.assertEqual(rows["Other"]["messages"], "3")
            after = Snapshot(dc)
            self.assertEqual(after.status["Work"]["guid"], new_guid)
            self.assertEqual(after.bodies, before.bodies)
            self.assertEqual(len(after.msgs["Work"]),
                             len(before.msgs["Work"]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
