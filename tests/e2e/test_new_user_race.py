"""A new user's first deliveries, several at once (a user created by the
admin gets two mails in the same second): each LMTP process finds no
key file and creates one with casbox_key_autocreate. Only one create can
win (the key file is never replaced); the others must load the winner's
key and deliver. Before that fix 43 of 160 such deliveries failed with
451, logging "link(...casbox.key...) failed: File exists".

Dovecot's own first-time setup of a user has races of its own here:
mailbox_create() holds mailboxes.lock while another process's list
index sync holds dovecot.list.index.log and opens the half-created
INBOX for its GUID; the kernel then reports EDEADLK and Dovecot panics
("Resource deadlock avoided"), or the create reports "Mailbox already
exists". sdbox, with no casbox code at all, loses 4-9 of these 80
deliveries on a loaded 2-core machine (2026-12-02, this test with
mail_location=sdbox:~/sdbox, three runs) and casbox 2-4 in the same
runs. Those failures are tolerated and logged; what the test asserts
is that no error names the key file, that every Panic is that core
race, that every acknowledged delivery is stored, and that at least
80% of the deliveries succeed."""

import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, ok  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
USERS = 20
AT_ONCE = 4
# Dovecot core's own first-time races (see above): not ours to assert
CORE_RACES = (r"Mailbox already exists", r"file_dotlock", r"Raw backtrace",
              r"killed with signal", r"Panic: ")
CORE_PANIC = "dovecot.list.index.log, write-lock, F_SETLKW) locking failed"


class NewUserRaceTest(unittest.TestCase):

    def test_concurrent_first_deliveries(self):
        failures = []
        with Dovecot(plugin_settings=KEYS) as dc:
            for race in CORE_RACES:
                dc.allow_log(race)
            for u in range(USERS):
                user = "new%d" % u
                barrier = threading.Barrier(AT_ONCE)

                def deliver(n, user=user, barrier=barrier):
                    barrier.wait()
                    try:
                        dc.lmtp_deliver(user, b"Subject: %d\r\n\r\nhi\r\n"
                                        % n)
                    except Exception as e:  # noqa: BLE001
                        failures.append((user, repr(e)))
                threads = [threading.Thread(target=deliver, args=(n,))
                           for n in range(AT_ONCE)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            if failures:
                print("\nDovecot core races: %r" % failures, file=sys.stderr)
            key_errors = [ln for ln in dc.log_lines()
                          if ": Error: " in ln and "casbox.key" in ln]
            self.assertEqual(key_errors, [])
            panics = [ln for ln in dc.log_lines()
                      if ": Panic: " in ln and CORE_PANIC not in ln]
            self.assertEqual(panics, [])
            self.assertLessEqual(len(failures), USERS * AT_ONCE // 5)
            for u in range(USERS):
                user = "new%d" % u
                lost = sum(1 for f in failures if f[0] == user)
                imap = dc.imap_login(user)
                exists = int(ok(imap.select("INBOX"))[0])
                imap.logout()
                # a delivery cut off after its save may be stored too
                self.assertGreaterEqual(exists, AT_ONCE - lost, user)
                self.assertLessEqual(exists, AT_ONCE, user)


if __name__ == "__main__":
    unittest.main()
