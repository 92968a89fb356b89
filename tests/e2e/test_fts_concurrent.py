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
        self.run_race({})

    def test_race_with_merges(self):
        """The same race with every commit merging (merge_segments=2):
        the indexer-worker's and doveadm's segments are merged while
        searches read them; each marker must still hit its one mail."""
        self.run_race({"fts_casidx_merge_segments": "2"})

    def run_race(self, settings):
        plugin_settings = {"casbox_key_file": "%h/casbox.key",
                           "casbox_key_autocreate": "yes",
                           "fts": "casidx",
                           "fts_autoindex": "yes"}
        plugin_settings.update(settings)
        with Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=["casbox", "fts", "fts_casidx"],
                     plugin_settings=plugin_settings) as dc:
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
                        index_runs[0] += 1
                except Exception as e:
                    errors.append("index: %r" % e)

            seen = []
            index_runs = [0]

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
            # a race needs both writers: doveadm index ran while
            # deliveries (and their autoindexing) went on
            self.assertGreater(index_runs[0], 1)
            print("index runs %d, searches %d" % (index_runs[0], len(seen)),
                  file=sys.stderr)

            dc.doveadm("index", "-u", "u", "INBOX")
            if "fts_casidx_merge_segments" in settings:
                segs = [f for root, _, files in os.walk(dc.home("u"))
                        for f in files if f.endswith(".cxs")]
                self.assertTrue(0 < len(segs) <= 2, segs)
            imap = dc.imap_login("u")
            imap.select("INBOX", readonly=True)
            typ, data = imap.uid("SEARCH", "BODY", COMMON)
            self.assertEqual(len(data[0].split()), COUNT)
            # every one: a doc id mapped to the wrong UID across
            # segments shows up as a marker hitting another mail
            for i in range(COUNT):
                typ, data = imap.uid("SEARCH", "BODY", "w%05dq" % i)
                typ, subj = imap.uid("FETCH", data[0].decode() or "0",
                                     "BODY.PEEK[HEADER.FIELDS (SUBJECT)]")
                self.assertEqual(len(data[0].split()), 1,
                                 "marker w%05dq: %r" % (i, data))
                self.assertIn(b"concurrent %d\r" % i, subj[0][1],
                              "marker w%05dq" % i)
            imap.logout()


if __name__ == "__main__":
    unittest.main(verbosity=2)
