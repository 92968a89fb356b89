"""casidx ranking through IMAP: SEARCH RETURN (RELEVANCY) and
SORT (RELEVANCY) order documents the way BM25 does.

The oracle is SQLite FTS5's bm25() (tokenizer unicode61, diacritics
removed) over the same message bodies, an implementation we did not
write. The documents are built so that BM25's order is unambiguous
(term frequency and document length differ in clear steps), so any
correct BM25 agrees with FTS5 here, whatever its parameters."""

import os
import re
import sqlite3
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot  # noqa: E402

FILLER = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet "
          "kilo lima mike november oscar papa quebec romeo sierra tango "
          "uniform victor whiskey xray yankee zulu").split()
TERM = "quasar"


def body(tf, length):
    """length words: tf times TERM spread among filler words."""
    words = [FILLER[i % len(FILLER)] for i in range(length - tf)]
    step = max(1, len(words) // (tf + 1))
    for i in range(tf):
        words.insert((i + 1) * step + i, TERM)
    return " ".join(words)


# (subject, body) per message, in delivery (UID) order.
DOCS = [
    ("note one", body(1, 40)),
    ("note two", body(3, 40)),
    ("note three", body(0, 40)),
    ("note four", body(5, 40)),
    ("note five", body(2, 40)),
    ("note six", body(2, 400)),
]


def message(subject, text):
    return ("From: r@example.com\r\nTo: u@example.com\r\n"
            "Subject: %s\r\n\r\n%s\r\n" % (subject, text)).encode()


def fts5_order(bodies, term):
    """1-based positions of bodies matching term, best bm25 first."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(body, tokenize="
               "'unicode61 remove_diacritics 2')")
    db.executemany("INSERT INTO t(rowid, body) VALUES (?, ?)",
                   [(i + 1, b) for i, b in enumerate(bodies)])
    rows = db.execute("SELECT rowid FROM t WHERE t MATCH ? "
                      "ORDER BY bm25(t)", (term,)).fetchall()
    return [r[0] for r in rows]


class Relevancy(unittest.TestCase):
    def test_relevancy_matches_bm25_oracle(self):
        expected = fts5_order([b for _, b in DOCS], TERM)
        # sanity of the oracle itself: more occurrences rank higher,
        # and the long document ranks below the short one with equal tf
        self.assertEqual(expected[0], 4)
        self.assertLess(expected.index(5), expected.index(6))
        self.assertNotIn(3, expected)

        with Dovecot(mail_location="sdbox:~/sdbox",
                     mail_plugins=["fts", "fts_casidx"],
                     plugin_settings={"fts": "casidx",
                                      "fts_autoindex": "yes"}) as dc:
            for subject, text in DOCS:
                dc.lmtp_deliver("u", message(subject, text))
            dc.doveadm("index", "-u", "u", "INBOX")
            imap = dc.imap_login("u")
            imap.select("INBOX")

            typ, data = imap.uid("SORT", "(RELEVANCY)", "UTF-8",
                                 "FUZZY", "BODY", TERM)
            self.assertEqual(typ, "OK")
            got = [int(u) for u in data[0].split()]
            self.assertEqual(got, expected)

            typ, _ = imap.uid("SEARCH", "RETURN", "(RELEVANCY ALL)",
                              "FUZZY", "BODY", TERM)
            self.assertEqual(typ, "OK")
            esearch = b" ".join(imap.untagged_responses.pop("ESEARCH"))
            m = re.search(rb"UID ALL (\S+) RELEVANCY \(([\d ]+)\)",
                          esearch)
            self.assertIsNotNone(m, esearch)
            uids = []
            for part in m.group(1).split(b","):
                lo, _, hi = part.partition(b":")
                uids.extend(range(int(lo), int(hi or lo) + 1))
            scores = [int(s) for s in m.group(2).split()]
            self.assertEqual(sorted(uids), sorted(expected))
            self.assertEqual(len(scores), len(uids))
            by_score = [u for _, u in sorted(zip(scores, uids),
                                             reverse=True)]
            self.assertEqual(by_score, expected)
            imap.logout()


if __name__ == "__main__":
    unittest.main(verbosity=2)
