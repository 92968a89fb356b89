"""fts-casidx: non-ASCII values equal Dovecot without FTS (issue 17 (a)).

casidx answers a value with non-ASCII characters through its dtgrams
(doc/search-semantics.md): the code point pairs of Dovecot's decomposed
titlecase form. This compares, with the same Dovecot without FTS:

* values cut around non-ASCII characters of corpus messages, from body
  text and header lines, in every script the sample holds (Latin with
  marks, Cyrillic, Greek, CJK, symbols, ...), 1 to 8 characters;
* hand-made messages for the edges: a character split by a
  quoted-printable soft break, Latin-1 and base64 bodies, encoded words
  in Subject and other headers (two adjacent ones joined), address
  headers with non-ASCII display names and comments, decomposed (NFD)
  text and values, ligatures and special case mappings, HTML markup,
  invalid UTF-8, an attached message's headers, CJK next to Latin, and
  two MIME parts whose characters must not join.

`doveadm fts lookup` must answer the values whose image is one dtgram
definitely where the body has it, and never definitely where Dovecot
finds nothing.
"""

import os
import random
import re
import sys
import unicodedata
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import sdbox_casidx, sdbox_oracle  # noqa: E402
import test_fts_equivalence as equivalence  # noqa: E402
from test_fts_equivalence import message_sources, sample_messages  # noqa
from test_fts_phrase import fts_lookup  # noqa: E402

USER = "user1"
SEED = int(os.environ.get("CASIDX_NONASCII_SEED", "23"))
N_PER_SCRIPT = int(os.environ.get("CASIDX_NONASCII_PER_SCRIPT", "24"))
N_SAMPLE = int(os.environ.get("CASIDX_NONASCII_SAMPLE", "2000"))
N_MAX = int(os.environ.get("CASIDX_NONASCII_MESSAGES", "200"))


def plain(subject, body, charset="utf-8", cte="8bit", extra="",
          extra_raw=b""):
    head = ("From: a@example.com\r\nTo: b@example.com\r\n"
            "Subject: %s\r\n%s" % (subject, extra)).encode("utf-8")
    head += extra_raw + ("MIME-Version: 1.0\r\n"
                         "Content-Type: text/plain; charset=%s\r\n"
                         "Content-Transfer-Encoding: %s\r\n\r\n"
                         % (charset, cte)).encode("ascii")
    if isinstance(body, str):
        body = body.encode("utf-8")
    return head + body + b"\r\n"


def multipart(subject, parts, extra=""):
    out = ("From: a@example.com\r\nTo: b@example.com\r\n"
           "Subject: %s\r\n%sMIME-Version: 1.0\r\n"
           "Content-Type: multipart/mixed; boundary=\"BB\"\r\n\r\n"
           % (subject, extra)).encode("ascii")
    for ctype, cte, body in parts:
        out += ("--BB\r\nContent-Type: %s\r\n"
                "Content-Transfer-Encoding: %s\r\n\r\n"
                % (ctype, cte)).encode("ascii")
        out += (body.encode("utf-8") if isinstance(body, str) else body)
        out += b"\r\n"
    return out + b"--BB--\r\n"


ATTACHED = (b"From: =?utf-8?q?Se=C3=B1or?= (\xc2\xa1comentario!) "
            b"<s@example.com>\r\nTo: undisclosed-recipients:;\r\n"
            b"Cc: \"Quoted Name\" (aparte) <q@example.org>\r\n"
            b"Subject: =?utf-8?q?adjunto_=C2=BB?=\r\n"
            b"Content-Type: text/plain; charset=utf-8\r\n\r\n"
            b"dentro \xc3\xa0 la p\xc3\xa1gina\r\n")

# (name, message); the names say what each is for
MESSAGES = [
    ("qp soft break", plain(
        "m1", "Se=C3=\r\n=B1or caf=C3=A9 =C2=BB=\r\n=C3=B9 fin",
        cte="quoted-printable")),
    ("latin-1", plain("m2", b"x \xbb\xf9 y \xa1\xb0hola\xa1\xb1",
                      charset="iso-8859-1")),
    ("encoded words", plain(
        "=?utf-8?q?=C2=A1=C2=B0_Hola?=", "cuerpo",
        extra="X-Note: =?iso-8859-1?q?=BB?= =?iso-8859-1?q?=F9?=\r\n"
              "X-Raw: caf\u00e9 8bit \u00bb\u00f9\r\n",
        extra_raw=b"X-Latin1: \xbb\xf9 raw\r\n")),
    ("address names", plain(
        "m4", "hi",
        extra="Cc: =?utf-8?q?Jos=C3=A9_M=C3=BA=C3=B1oz?= <jm@example.com>,"
              " \"=?utf-8?q?=C3=91and=C3=BA?=\" (=?utf-8?q?=C2=A1ojo!?=)"
              " <n@example.com>\r\n")),
    ("nfd text", plain("m5", "Jose\u0301 and\u0301 e\u0301te\u0301")),
    ("case mappings", plain(
        "m6", "\ufb01nance \u01c5emal stra\u00dfe \u03a3\u03af\u03c3\u03c5"
              "\u03c6\u03bf\u03c2 \u0130stanbul \u00c5ngstr\u00f6m")),
    ("html", multipart("m7", [(
        "text/html; charset=utf-8", "8bit",
        "<p title=\"\u00bb\u00f9\">\u00a1\u00b0h\u00e9 &eacute;</p>")])),
    ("invalid utf-8", plain("m8", b"ab\xff\xc3\xb1x \xc3 \xe2\x82 \xc2\xbb"
                                  b"\xed\xa0\x80\xc3\xb9")),
    ("attached message", multipart("m9", [
        ("text/plain; charset=utf-8", "8bit", "see attached"),
        ("message/rfc822", "8bit", ATTACHED)])),
    ("cjk and latin", plain(
        "m10", "\u6771\u4eac\u00bb\u30bf\u30ef\u30fc caf\u00e9\u4e2d\u6587")),
    ("base64", plain(
        "m11", "wrvDuSDCocKw4oKsIMOxYW5kw7o=", cte="base64")),
    ("superscript", plain("m13", "more than n\u00b2 space, \u0131l\u0131k")),
    ("two parts", multipart("m12", [
        ("text/plain; charset=utf-8", "8bit", "end \u00bb"),
        ("text/plain; charset=utf-8", "8bit", "\u00f9 start")])),
]

VALUES = [
    "\u00bb\u00f9", "\u00a1\u00b0", "\u00f1", "\u00d1", "\u00e9",
    "e\u0301", "E\u0301", "caf\u00e9", "cafe\u0301", "\u00f1or",
    "Se\u00f1or", "\u00bb", "\u00f9", "\u00b0H", "\u00a1\u00b0h",
    "\u00b0hola\u00a1", "\ufb01", "fi", "\u01c6", "\u01c4", "\u00df",
    "ss", "\u03c3", "\u03c2", "\u03a3\u03af", "\u0130", "i\u0307",
    "\u00c5ng", "\u212bng", "\u6771\u4eac\u00bb", "\u00bb\u30bf",
    "\u00e9\u4e2d", "M\u00fa\u00f1", "\u00d1and\u00fa", "\u00a1ojo!",
    "\u00a1o", "Hola", "\u00a1comentario", "\u00f1x", "b\u00f1",
    "\u00bb\u00f9 fin", "Jos\u00e9", "\u00e0 la", "\u00e1g",
    "adjunto \u00bb", "\u20ac \u00f1", "\u00f1and\u00fa", "\u00fa",
    ": \u00a1", "\u00b1", "\u00e9te\u0301", "\u00bb\u0020\u00f9",
    "\u0301", "x \u00bb", "\u0131", "\u0131n", "than n\u00b2 ", "n\u00b2", "n2", "n2 s",
    "\u00b2 s",
]

# in the attached message's address headers (a comment, a group name,
# a quoted display name, all of which Dovecot's normalised address list
# drops or changes): TEXT must answer these words definitely there
# (non-ASCII values and phrases are maybe in headers anyway: headers
# keep no positions)
ATTACHED_TEXT = ["comentario", "undisclosed", "Quoted", "aparte"]

# the index must answer these definitely (their image is one dtgram,
# found in a body)
DEFINITE = {
    "\u00a1\u00b0": ["latin-1", "html", "base64"],
    "e\u0301": ["qp soft break", "nfd text"],
    "\u00b0H": ["latin-1", "html"],
    "\u00f1": ["qp soft break", "invalid utf-8", "base64"],
}


def script_of(c):
    """A coarse script name of a non-ASCII character."""
    cat = unicodedata.category(c)
    if not cat.startswith("L"):
        return "symbol" if not cat.startswith("M") else "mark"
    name = unicodedata.name(c, "UNKNOWN").split()
    return name[0]


def corpus_values(rng, messages):
    """(key, value) searches cut around non-ASCII characters of the
    messages' body text and header lines, up to N_PER_SCRIPT per
    script and key kind."""
    by_script = {}
    for raw in messages:
        for key, text in message_sources(raw):
            if key not in ("BODY", "TEXT", "SUBJECT"):
                continue
            for line in re.split(r"[\r\n]+", text):
                idx = [i for i, c in enumerate(line) if ord(c) > 127]
                if not idx:
                    continue
                at = rng.choice(idx)
                n = rng.randint(1, 8)
                start = max(0, at - rng.randrange(0, n))
                value = line[start:start + n].replace("\0", "")
                if not value.strip() or "\ufffd" in value:
                    continue
                by_script.setdefault((script_of(line[at]), key),
                                     []).append(value)
    out = []
    for (script, key), values in sorted(by_script.items()):
        values = sorted(set(values))
        rng.shuffle(values)
        out.extend((key, v) for v in values[:N_PER_SCRIPT])
    return out, sorted({s for s, _ in by_script})


class FtsCasidxNonAscii(unittest.TestCase):

    def test_non_ascii_values_equal_dovecot_without_fts(self):
        rng = random.Random(SEED)
        # a large sample of every folder, then the mail in it with
        # 8-bit bytes or encoded words
        equivalence.N_MESSAGES = N_SAMPLE
        corpus = sample_messages(rng)
        corpus = [m for m in corpus
                  if any(b >= 0x80 for b in m) or b"=?" in m][:N_MAX]
        raw = [m for _, m in MESSAGES] + corpus
        generated, scripts = corpus_values(rng, corpus)
        # the corpus has Latin, Cyrillic, CJK, ... and symbols
        self.assertGreaterEqual(len(scripts), 4, scripts)
        self.assertGreater(len(generated), 100)
        searches = ([(k, v) for v in VALUES
                     for k in ("BODY", "TEXT", "SUBJECT", "CC")] +
                    generated)
        searches += [("NOT BODY", v) for v in VALUES[:12]]
        searches += [("TEXT", v) for v in ATTACHED_TEXT
                     if ("TEXT", v) not in searches]
        uid_of = {name: i + 1 for i, (name, _) in enumerate(MESSAGES)}

        with sdbox_oracle() as dc:
            dc.lmtp_deliver_many(USER, raw)
            oracle = run_not(dc, searches)
        matched = sum(1 for o in oracle if o)
        self.assertGreater(matched, len(searches) // 3)

        with sdbox_casidx() as dc:
            dc.lmtp_deliver_many(USER, raw)
            dc.doveadm("index", "-u", USER, "INBOX")
            got = run_not(dc, searches)
            diffs = ["%s %r: only oracle %r, only fts %r" % (
                k, v, sorted(set(o) - set(g))[:8],
                sorted(set(g) - set(o))[:8])
                for (k, v), o, g in zip(searches, oracle, got) if o != g]
            print("%d messages, %d searches (%d match), scripts %s, "
                  "%d differ" % (len(raw), len(searches), matched,
                                 ",".join(scripts), len(diffs)))
            self.assertEqual(diffs, [], "\n".join(diffs[:60]))

            want = dict(zip(searches, oracle))
            definite_total = 0
            for value in VALUES + [v for k, v in generated
                                   if k == "BODY"][:80]:
                definite, maybe = fts_lookup(dc, value)
                self.assertLessEqual(definite,
                                     set(want.get(("BODY", value), [])),
                                     value)
                for name in DEFINITE.get(value, []):
                    self.assertIn(uid_of[name], definite,
                                  "%r in %s" % (value, name))
                definite_total += len(definite)
            self.assertGreater(definite_total, 0)

            # an attached message's address headers: their raw values
            # (comments, encoded words) are read from the part's header
            # and indexed, so TEXT answers them definitely instead of
            # keeping the message as maybe
            for value in ATTACHED_TEXT:
                definite, maybe = fts_lookup(dc, value, "text")
                self.assertIn(uid_of["attached message"],
                              want[("TEXT", value)], value)
                self.assertIn(uid_of["attached message"], definite,
                              (value, definite, maybe))
                self.assertLessEqual(definite, set(want[("TEXT", value)]),
                                     value)


def run_not(dc, searches):
    """Like run(), with "NOT BODY" keys sent as NOT + BODY."""
    imap = dc.imap_login(USER)
    try:
        imap.select("INBOX", readonly=True)
        out = []
        for key, value in searches:
            imap.literal = value.encode("utf-8")
            typ, data = imap.uid("SEARCH", "CHARSET", "UTF-8",
                                 *key.split(" "))
            if typ != "OK":
                raise AssertionError("SEARCH %s %r: %s %r" % (
                    key, value, typ, data))
            out.append(sorted(int(x) for x in data[0].split()))
        return out
    finally:
        imap.logout()


if __name__ == "__main__":
    unittest.main()
