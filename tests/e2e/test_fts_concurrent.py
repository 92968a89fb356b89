"""casidx under concurrency, on casbox: LMTP deliveries, doveadm index
runs and IMAP searches in separate processes at the same time. No
search may see a message that was not delivered yet or lose one it saw
before; at the end every message is found by its own word, and Dovecot
logged no error (the harness fails the test otherwise)."""

import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot  # noqa: E402

COUNT = 120
COMMON = "zebracorn"


def message(i):
    return ("From: s%d@example.com\r\nTo: u@example.com\r\n"
            "Subject: concurrent %d\r\n\r\n"
            "The %s grazes near marker w%05dq today.\r\n"
            % (i, i, COMMON, i)).encode()


class ConcurrentIndexing(unittest.TestCase):
    def test_deliver_index_search_at_once(self):
        with Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=["casbox", "fts", "fts_casidx"],
                     plugin_settings={
                         "casbox_key_file": "%h/casbox.key",
                         "casbox_key_autocreate": "yes",
                         "fts": "casidx",
                         "fts_autoindex": "yes",
                     }) as dc:
            # create the store and key before the races start
            dc.lmtp_deliver("u", message(0))
            delivered = [1]
            done = threading.Event()
            errors = []

            def deliver():
                try:
                    for i in range(1, COUNT):
                        dc.lmtp_deliver("u", message(i))
                        delivered[0] = i + 1
                except Exception as e:  # reported by the main thread
                    errors.append("deliver: %r" % e)
                finally:
                    done.set()

            def index():
                try:
                    while not done.is_set():
                        dc.doveadm("index", "-u", "u", "INBOX")
                except Exception as e:
                    errors.append("index: %r" % e)

            seen = []

            def search():
                try:
                    imap = dc.imap_login("u")
                    imap.select("INBOX", readonly=True)
                    while not done.is_set():
                        before = delivered[0]
                        typ, data = imap.uid("SEARCH", "BODY", COMMON)
                        after = delivered[0]
                        n = len(data[0].split())
                        # deliveries are sequential: at most one more
                        # (committed, its 250 reply not yet read by
                        # deliver()) can be visible than counted
                        if typ != "OK" or n > after + 1:
                            errors.append("search: %s, %d hits with %d "
                                          "delivered" % (typ, n, after))
                        if seen and n < seen[-1][0]:
                            errors.append("search: hits went from %d "
                                          "to %d" % (seen[-1][0], n))
                        seen.append((n, before))
                        imap.noop()
                    imap.logout()
                except Exception as e:
                    errors.append("search: %r" % e)

            threads = [threading.Thread(target=f)
                       for f in (deliver, index, search)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=600)
            self.assertFalse(any(t.is_alive() for t in threads))
            self.assertEqual(errors, [])
            self.assertGreater(len(seen), 0)

            dc.doveadm("index", "-u", "u", "INBOX")
            imap = dc.imap_login("u")
            imap.select("INBOX", readonly=True)
            typ, data = imap.uid("SEARCH", "BODY", COMMON)
            self.assertEqual(len(data[0].split()), COUNT)
            for i in (0, 1, COUNT // 2, COUNT - 1):
                typ, data = imap.uid("SEARCH", "BODY", "w%05dq" % i)
                self.assertEqual(len(data[0].split()), 1,
                                 "marker w%05dq" % i)
            imap.logout()


if __name__ == "__main__":
    unittest.main(verbosity=2)
