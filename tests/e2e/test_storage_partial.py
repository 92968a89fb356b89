"""Partial fetches and BODYSTRUCTURE read only the chunks they need.

Message records carry BODYSTRUCTURE, BODY, ENVELOPE and the MIME part
tree sealed with the index key (casbox-meta.h), so BODYSTRUCTURE and
ENVELOPE decode no chunk and BODY[n]<o.l> / BINARY[n]<o.l> decode only
part n's chunks instead of parsing the whole message first. The evidence is the per-mail count of
decoded chunks that casbox logs with mail_debug (decoder statistic, not
timing). Every partial range of the mime-edge corpus must answer exactly
as sdbox does."""

import base64
import os
import random
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
CHUNK = 65536
DECODED_RE = re.compile(r"casbox: uid=(\d+): decoded (\d+) chunks")


def ok(typ_data):
    typ, data = typ_data
    if typ != "OK":
        raise AssertionError("IMAP command failed: %r %r" % (typ, data))
    return data


def big_message(att_size):
    rnd = random.Random(att_size)
    att = bytes(rnd.getrandbits(8) for _ in range(att_size))
    b64 = base64.encodebytes(att).replace(b"\n", b"\r\n")
    return (b"From: a@example.com\r\nTo: b@example.com\r\n"
            b"Subject: big attachment\r\nMIME-Version: 1.0\r\n"
            b"Content-Type: multipart/mixed; boundary=XX\r\n\r\n"
            b"--XX\r\nContent-Type: text/plain\r\n\r\nhello\r\n"
            b"--XX\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Transfer-Encoding: base64\r\n\r\n"
            + b64 + b"--XX--\r\n"), att, b64


TIMING_RE = re.compile(rb" \(\d+\.\d+( \+ \d+\.\d+)* secs\)")


def untimed(answer):
    """An IMAP answer without Dovecot's command timing text."""
    typ, data = answer
    return typ, [TIMING_RE.sub(b"", x) if isinstance(x, bytes) else x
                 for x in data]


def literals(data):
    return [x[1] for x in data if isinstance(x, tuple)]


class DecodeCounter:
    """Chunks decoded per FETCH, from the mail_debug log lines casbox
    writes when a mail that opened its stream is closed."""

    def __init__(self, dc, imap):
        self.dc, self.imap = dc, imap

    def fetch(self, uid, items):
        before = len(self.dc.log_lines())
        data = ok(self.imap.uid("FETCH", str(uid), items))
        # the mail is closed when the next command selects again
        ok(self.imap.select("INBOX"))
        lines = self.dc.log_lines()[before:]
        counts = [int(m.group(2)) for m in map(DECODED_RE.search, lines)
                  if m and int(m.group(1)) == uid]
        return data, sum(counts)


class PartialFetchTest(unittest.TestCase):

    def test_decodes_only_needed_chunks(self):
        msg, att, b64 = big_message(3 * 1024 * 1024)
        total_chunks = len(msg) // CHUNK
        with Dovecot(plugin_settings=KEYS, mail_debug=True) as dc:
            imap = dc.imap_login("user1")
            ok(imap.append("INBOX", None, None, msg))
            ok(imap.select("INBOX"))
            dec = DecodeCounter(dc, imap)

            # the whole message: the control that the counter counts
            data, full = dec.fetch(1, "BODY.PEEK[]")
            self.assertEqual(literals(data), [msg])
            self.assertGreaterEqual(full, total_chunks)

            data, n = dec.fetch(1, "BODYSTRUCTURE")
            self.assertIn(b'"application" "octet-stream"', data[0].lower())
            self.assertEqual(n, 0, "BODYSTRUCTURE decoded chunks")
            data, n = dec.fetch(1, "BODY")
            self.assertEqual(n, 0, "BODY decoded chunks")
            data, n = dec.fetch(1, "ENVELOPE")
            self.assertIn(b'"big attachment"', data[0])
            self.assertEqual(n, 0, "ENVELOPE decoded chunks")

            # BODY[2]<o.l>: Dovecot counts CRLFs from the part start,
            # so the chunks of part 2 up to the offset, plus the one
            # holding the part's header; nothing of a whole-message
            # parse
            off, size = 2000000, 1000
            data, n = dec.fetch(1, "BODY.PEEK[2]<%d.%d>" % (off, size))
            self.assertEqual(literals(data), [b64[off:off + size]])
            self.assertLessEqual(n, (off + size) // CHUNK + 2)
            self.assertLess(n, full)

            # BODY[]<o.l>: Dovecot counts CRLFs from the message start
            # (LF-stored mail, as sdbox): the chunks up to the offset,
            # never the rest, and no parse
            off2 = 3000000
            data, n = dec.fetch(1, "BODY.PEEK[]<%d.%d>" % (off2, size))
            self.assertEqual(literals(data), [msg[off2:off2 + size]])
            self.assertLessEqual(n, (off2 + size) // CHUNK + 2)
            self.assertLess(n, full)

            # BINARY[2]<o.l> decodes part 2 (all of it: Dovecot must
            # know the decoded size), not the rest of the message
            data, n = dec.fetch(1, "BINARY.PEEK[2]<%d.%d>" % (off, size))
            self.assertEqual(literals(data), [att[off:off + size]])
            self.assertLessEqual(n, len(b64) // CHUNK + 3)
            imap.logout()

    def test_partials_match_sdbox(self):
        msgs = []
        for path in corpus_files("mime-edge"):
            with open(path, "rb") as f:
                data = f.read()
            if data:
                msgs.append(data)
        msgs.append(big_message(300 * 1024)[0])
        self.assertGreater(len(msgs), 150)
        with Dovecot(mail_location="sdbox:~/sdbox", mail_plugins=[]) as sd:
            want = self.fetch_partials(sd, msgs)
        with Dovecot(plugin_settings=KEYS) as dc:
            got = self.fetch_partials(dc, msgs)
        self.assertEqual(len(got), len(want))
        for i, (g, w) in enumerate(zip(got, want)):
            self.assertEqual(g, w, "message %d differs from sdbox" % (i + 1))

    SECTIONS = ["", "TEXT", "HEADER", "1", "2", "1.1", "2.MIME", "3"]

    def fetch_partials(self, dc, msgs):
        imap = dc.imap_login("user1")
        for msg in msgs:
            ok(imap.append("INBOX", None, None, msg))
        ok(imap.select("INBOX"))
        answers = []
        for uid, msg in enumerate(msgs, 1):
            size = len(msg)
            ranges = sorted({0, 1, size // 3, size // 2, size - 1, size,
                             size + 10})
            items = ["ENVELOPE", "BODYSTRUCTURE", "BODY"]
            items += ["BODY.PEEK[%s]<%d.%d>" % (sec, off, ln)
                      for sec in self.SECTIONS for off in ranges
                      for ln in (1, 77, CHUNK + 5)]
            answers.append(untimed(imap.uid("FETCH", str(uid),
                                            "(%s)" % " ".join(items))))
            for sec in ("", "1", "2", "1.1"):
                for off in (0, size // 4, size // 2):
                    answers.append(untimed(imap.uid(
                        "FETCH", str(uid),
                        "BINARY.PEEK[%s]<%d.%d>" % (sec, off, 1000))))
        imap.logout()
        return answers


if __name__ == "__main__":
    unittest.main()
