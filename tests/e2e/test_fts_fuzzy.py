"""SEARCH FUZZY (RFC 6203) with casidx: accent folding, prefixes and one
typo per word, as definite answers in BM25 order, while the same search
without FUZZY keeps IMAP's exact substring semantics (compared with
Dovecot without FTS on the same mail).

On Dovecot 2.3 the SEARCH=FUZZY capability is advertised only with
`imap_capability = +SEARCH=FUZZY` (the core builds CAPABILITY before the
FTS backend exists); doc/settings.md has the line."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (NO_LMTP_RECEIVED, is_dovecot24,  # noqa: E402,E501
                             sdbox_casidx, sdbox_oracle)

USER = "fuzzy"

# UID order
BODIES = [
    "Señor Muñoz sent the report.",             # 1 folded
    "Mr Munoz sent it too.",                    # 2 plain
    "The firmware update, firmware notes.",     # 3 exact, twice
    "New firmwares are out.",                   # 4 prefix
    "A fimrware typo (swapped letters).",       # 5 one swap
    "Nothing about that here.",                 # 6 none
    "Firmware once in a long body " + "filler " * 20,  # 7 exact, longer
]


def message(i, text):
    return ("From: s%d@example.com\r\nTo: u@example.com\r\n"
            "Subject: note %d\r\n\r\n%s\r\n" % (i, i, text)).encode()


def uids(imap, *criteria):
    if any(ord(c) > 127 for c in criteria[-1]):
        # imaplib sends .literal after the last argument
        imap.literal = criteria[-1].encode("utf-8")
        typ, data = imap.uid("SEARCH", "CHARSET", "UTF-8", *criteria[:-1])
    else:
        typ, data = imap.uid("SEARCH", *criteria)
    if typ != "OK":
        raise AssertionError("SEARCH %s: %s %s" % (criteria, typ, data))
    return sorted(int(x) for x in data[0].split())


def sort_uids(imap, *criteria):
    typ, data = imap.uid("SORT", "(RELEVANCY)", "UTF-8", *criteria)
    if typ != "OK":
        raise AssertionError("SORT %s: %s %s" % (criteria, typ, data))
    return [int(x) for x in data[0].split()]


EXACT = [("BODY", "munoz"), ("BODY", "muñoz"), ("BODY", "fimware"),
         ("BODY", "firmware"), ("BODY", "firmwar"), ("TEXT", "report"),
         ("BODY", "fimrware")]


class Fuzzy(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        msgs = [message(i + 1, b) for i, b in enumerate(BODIES)]
        with sdbox_oracle() as dc:
            dc.lmtp_deliver_many(USER, msgs)
            imap = dc.imap_login(USER)
            imap.select("INBOX")
            cls.oracle = {q: uids(imap, *q) for q in EXACT}
            imap.logout()
        cls.msgs = msgs

    def test_fuzzy(self):
        # RFC 6203 capability: the admin line 2.3 needs
        extra = NO_LMTP_RECEIVED
        if not is_dovecot24():
            extra += "protocol imap {\n  imap_capability = +SEARCH=FUZZY\n}\n"
        with sdbox_casidx(no_fsync=False, extra_conf=extra) as dc:
            dc.lmtp_deliver_many(USER, self.msgs)
            dc.doveadm("index", "-u", USER, "INBOX")
            imap = dc.imap_login(USER)
            if not is_dovecot24():
                typ, data = imap.capability()
                self.assertIn(b"SEARCH=FUZZY", data[0].split())
            imap.select("INBOX")

            # without FUZZY: exactly Dovecot's own substring answers
            for q in EXACT:
                self.assertEqual(uids(imap, *q), self.oracle[q], q)
            self.assertEqual(self.oracle[("BODY", "munoz")], [2])
            self.assertEqual(self.oracle[("BODY", "fimware")], [])

            # folding: both spellings either way
            self.assertEqual(uids(imap, "FUZZY", "BODY", "munoz"), [1, 2])
            self.assertEqual(uids(imap, "FUZZY", "BODY", "muñoz"), [1, 2])
            # one typo (deletion) at the start of a word: exact,
            # prefix and swapped spellings of "firmware"
            self.assertEqual(uids(imap, "FUZZY", "BODY", "fimware"),
                             [3, 4, 5, 7])
            # a prefix and a swap of the query itself
            self.assertEqual(uids(imap, "FUZZY", "BODY", "firmware"),
                             [3, 4, 5, 7])
            self.assertEqual(uids(imap, "FUZZY", "BODY", "fimrware"),
                             [3, 4, 5, 7])
            # short words get no typo tolerance (too many neighbours)
            self.assertEqual(uids(imap, "FUZZY", "BODY", "sant"), [])
            # FUZZY never loses an exact match
            for q in EXACT:
                self.assertTrue(set(self.oracle[q])
                                <= set(uids(imap, "FUZZY", *q)), q)
            # combined with other keys and under NOT (exact there)
            self.assertEqual(uids(imap, "FUZZY", "BODY", "munoz",
                                  "SUBJECT", "note"), [1, 2])
            self.assertEqual(uids(imap, "NOT", "BODY", "munoz"),
                             [1, 3, 4, 5, 6, 7])

            # BM25 order: two exact hits in a short body first, the
            # typo (weighted lowest) last
            order = sort_uids(imap, "FUZZY", "BODY", "firmware")
            self.assertEqual(sorted(order), [3, 4, 5, 7])
            self.assertEqual(order[0], 3)
            self.assertEqual(order[-1], 5)
            imap.logout()


if __name__ == "__main__":
    unittest.main()
