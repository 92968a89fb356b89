"""fts-casidx end to end: multi-word values and values with punctuation.

casidx proves "w1 w2 ..." (ASCII words one space apart) with positions
and a value with punctuation inside one indexed term
(doc/search-semantics.md). Every search here is compared with the same
Dovecot without FTS, on hand-made messages that put the words next to
each other in every way that must not count (two spaces, a tab, a line
break, punctuation, markup, two MIME parts, non-ASCII neighbours) and
ways that must (case, quoted-printable soft breaks, base64, inside
longer words), plus list mail with phrases taken from its own text. Then
`doveadm fts lookup` shows that the index answers the provable ones by
itself (definite), so the test fails if the proofs stop working.
"""

import email
import os
import random
import re
import sys
import unittest
from email import policy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (corpus_files, sdbox_casidx,  # noqa: E402
                             sdbox_oracle)

USER = "user1"
N_CORPUS = int(os.environ.get("CASIDX_PHRASE_MESSAGES", "150"))


def plain(subject, body, extra=""):
    return ("From: a@example.com\r\nTo: b@example.com\r\n"
            "Subject: %s\r\n%s"
            "Content-Type: text/plain; charset=utf-8\r\n"
            "Content-Transfer-Encoding: 8bit\r\n\r\n%s\r\n"
            % (subject, extra, body))


def multipart(subject, parts):
    out = ("From: a@example.com\r\nTo: b@example.com\r\n"
           "Subject: %s\r\nMIME-Version: 1.0\r\n"
           "Content-Type: multipart/mixed; boundary=\"BB\"\r\n\r\n"
           % subject)
    for ctype, cte, body in parts:
        out += ("--BB\r\nContent-Type: %s; charset=utf-8\r\n"
                "Content-Transfer-Encoding: %s\r\n\r\n%s\r\n"
                % (ctype, cte, body))
    return out + "--BB--\r\n"


# (name, message); the names document what each one is for
MESSAGES = [
    ("adjacent", plain("m1", "the sample rate is high")),
    ("two spaces", plain("m2", "sample  rate twice")),
    ("tab", plain("m3", "sample\trate tab")),
    ("line break", plain("m4", "sample\r\nrate break")),
    ("hyphen", plain("m5", "sample-rate hyphen")),
    ("comma", plain("m6", "sample, rate comma")),
    ("two parts", multipart("m7", [("text/plain", "8bit", "a sample"),
                                   ("text/plain", "8bit", "rate b")])),
    ("html tags between", multipart("m8", [
        ("text/html", "8bit", "<b>sample</b> <i>rate</i>")])),
    ("html text", multipart("m9", [
        ("text/html", "8bit", "<p>sample rate</p><a href=\"http://"
         "example.com/x?y=1\">link</a>")])),
    ("non-ascii before", plain("m10", "caf\u00e9 sample rate")),
    ("non-ascii glued", plain("m11", "sample rate\u20ac and "
                              "na\u00efve rate")),
    ("qp soft break", multipart("m12", [
        ("text/plain", "quoted-printable", "sample=\r\n rate qp")])),
    ("base64", multipart("m13", [
        ("text/plain", "base64", "c2FtcGxlIHJhdGUgaW4gYmFzZTY0")])),
    ("case", plain("m14", "Sample RATE upper")),
    ("inside words", plain("m15", "resample rates")),
    ("repeated", plain("m16", "sample sample rate rate")),
    ("long word", plain("m17", "a" * 100 + " rate " + "b" * 70)),
    ("subject only", plain("sample rate", "nothing here")),
    ("three words", plain("m19", "one two three four")),
    ("numbers", plain("m20", "1,000 dollars and 3.14 pi")),
    ("url path", plain("m21", "see http://example.com/a/b.c?d=e and "
                       "www.example.org/x, mail foo.bar@baz.com")),
    ("underscore", plain("m22", "a_b c and snake_case word")),
    ("nbsp", plain("m23", "sample\u00a0rate nbsp")),
    ("folded", plain("m24", "sampl\u00e9 rate")),
    ("markup", multipart("m25", [
        ("text/html", "8bit", "<div class=\"x\">href=\"y\"</div>")])),
    # words joined by '_': excluded where no term holds them, except
    # where an address or a URL scheme cuts them
    ("underscore cut", plain("m26", "mail x@gnu_radio.org and "
                             "gnu_radio://host/ ok")),
    ("underscore apart", plain("m27", "gnu radio, gnu-radio, gnu_ radio")),
    ("underscore superscript", plain("m28", "gnu\u00b2_radio x\u2082_y")),
    ("underscore fullwidth", plain("m29", "\uff27NU\uff3fRadio")),
    ("underscore plain", plain("m30", "run GNU_Radio_Companion now")),
    # parts of compounds have codes (segment version 5): "list" only
    # inside a URL and an address is no whole token after "this "; a
    # whole token ending with "this" (the URL) is; a joined part
    # ("x2" of "x²") has no code
    ("parts only", plain("m31", "read this\r\nhttp://lists.example.org/"
                         "mailman/listinfo/dev and mail "
                         "ann.list@example.org")),
    ("compound ends", plain("m32", "see http://x.org/this list.info")),
    ("joined part", plain("m33", "x\u00b2 this")),
    # '.' joins letters like '_'; a symbol Dovecot reads as letters
    # ("\u2122" is "TM") is no letter to UAX #29 and cuts the word at
    # the joiner; an encoded run can end at a '.'
    ("symbol at joiner", plain("m34", "gnu_\u2122 and www.\u2122 and "
                               "\u2122_radio x")),
    ("dot joined", plain("m35", "see www.linux.org, e.g. this")),
    ("dot apart", plain("m36", "www linux and www. linux")),
    ("dot fullwidth", plain("m37", "www\uff0elinux")),
    ("dot encoded edge", plain("m38", "aB3dE5fG7hJ9kL1mN2pQ4rS6tU8vW0xY"
                               "2zA4bC6www.linux")),
    # words with punctuation between: adjacent tokens
    ("slash words", plain("m39", "lwn.com/blog and com-blog and/or")),
    ("slash apart", plain("m40", "com blog and blog/com")),
    ("header words", plain("band exchange", "and then change")),
]

VALUES = [
    "sample rate", "SAMPLE Rate", "ample rat", "sample rates",
    "resample rate", "sample sample rate", "rate rate", "rate sample",
    "one two", "two three", "one two three", "two three four",
    "one three", "three two", "aaaa rate", "rate bbbb",
    "1,000 dollars", "000 dollars", "3.14", "http://", "www.",
    "example.com/a", "//example.com/a/b.c?d=e", "foo.bar@baz.com",
    "bar@baz", "<div", "href=", "class=\"x\"", "a_b c", "snake_case",
    "e and", "dollars and", "na\u00efve rate", "sample rate\u20ac",
    "caf\u00e9 sample", "GNU_Radio", "gnu__radio", "gnu2_radio", "x2_y",
    "radio_companion", "gnu_rad", "this list", "list and", "x2 this",
    "org/this list", "com/blog", "gnu_tm", "tm_radio", "www.tm",
    "m_radio", "www.linux", "e.g", "w.l", "and/or", "blog/com",
    "com-blog", "and change",
]

# the index must answer these messages' BODY searches definitely (a
# word longer than 64 bytes is indexed as windows without positions:
# "aaaa rate" stays maybe)
DEFINITE = {
    # not "non-ascii glued": "rate€" is one piece for the ICU
    # word breaker, whose words are not RAW, so it stays maybe
    "sample rate": ["adjacent", "html text", "non-ascii before",
                    "qp soft break", "base64", "case", "inside words",
                    "repeated"],
    "one two three": ["three words"],
    "two three four": ["three words"],
    "http://": ["html text", "url path"],
    "www.": ["url path"],
    "foo.bar@baz.com": ["url path"],
    "1,000 dollars": ["numbers"],
    "snake_case": ["underscore"],
    "GNU_Radio": ["underscore plain"],
    "radio_companion": ["underscore plain"],
    "this list": ["compound ends"],
    "org/this list": ["compound ends"],
    "www.linux": ["dot joined"],
    "e.g": ["dot joined"],
}

# and must not return these at all (the words only as parts)
EXCLUDED = {
    "this list": ["parts only"],
    "list and": ["parts only"],
    "www.linux": ["dot apart"],
    "com/blog": ["slash apart"],
    "and change": ["header words"],
}


def corpus_messages():
    out = []
    for path in corpus_files("usrp-users-3000", limit=N_CORPUS):
        with open(path, "rb") as f:
            out.append(f.read())
    return out


def corpus_phrases(raw_messages, count=80):
    """Two or three ASCII words one space apart from the corpus's text
    parts, seeded, and as many with their words in reverse order."""
    rng = random.Random(23)
    found = []
    for raw in raw_messages:
        msg = email.message_from_bytes(raw, policy=policy.compat32)
        for part in msg.walk():
            if part.get_content_type() != "text/plain":
                continue
            payload = part.get_payload(decode=True) or b""
            text = payload.decode("utf-8", "replace")
            found.extend(m.group(0) for m in re.finditer(
                r"(?<![A-Za-z0-9])[A-Za-z0-9]{2,12}( [A-Za-z0-9]{2,12})"
                r"{1,2}(?![A-Za-z0-9])", text))
    found = sorted(set(found))
    picked = rng.sample(found, min(count, len(found)))
    return picked + [" ".join(reversed(p.split(" "))) for p in picked]


def uid_search(imap, key, value):
    imap.literal = value.encode("utf-8")
    typ, data = imap.uid("SEARCH", "CHARSET", "UTF-8", key)
    if typ != "OK":
        raise AssertionError("SEARCH %s %r: %s %r" % (key, value, typ,
                                                        data))
    return sorted(int(x) for x in data[0].split())


def parse_seqset(text):
    out = set()
    if text.strip() == "no results":
        return out
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if ":" in item:
            a, b = item.split(":")
            out.update(range(int(a), int(b) + 1))
        else:
            out.add(int(item))
    return out


def fts_lookup(dc, value, key="body"):
    """(definite, maybe) UIDs of doveadm fts lookup <key> <value>."""
    r = dc.doveadm("fts", "lookup", "-u", USER, "mailbox", "INBOX",
                   key, value)
    definite, maybe = set(), set()
    for line in r.stdout.splitlines():
        line = line.strip()
        if line.startswith("INBOX:"):
            definite = parse_seqset(line[len("INBOX:"):])
        elif line.startswith("- maybe:"):
            maybe = parse_seqset(line[len("- maybe:"):])
    return definite, maybe


class FtsCasidxPhrase(unittest.TestCase):

    def test_phrases_equal_dovecot_without_fts(self):
        raw = [m.encode("utf-8") for _, m in MESSAGES]
        corpus = corpus_messages()
        phrases = corpus_phrases(corpus)
        self.assertGreater(len(phrases), 100)
        searches = ([(k, v) for v in VALUES for k in ("BODY", "TEXT")] +
                    [("BODY", p) for p in phrases] +
                    [("TEXT", p) for p in phrases[::4]])
        uid_of = {name: i + 1 for i, (name, _) in enumerate(MESSAGES)}

        with sdbox_oracle() as dc:
            dc.lmtp_deliver_many(USER, raw + corpus)
            imap = dc.imap_login(USER)
            imap.select("INBOX", readonly=True)
            oracle = [uid_search(imap, k, v) for k, v in searches]
            imap.logout()
        matched = sum(1 for o in oracle if o)
        self.assertGreater(matched, len(searches) // 2)

        with sdbox_casidx() as dc:
            dc.lmtp_deliver_many(USER, raw + corpus)
            dc.doveadm("index", "-u", USER, "INBOX")
            imap = dc.imap_login(USER)
            imap.select("INBOX", readonly=True)
            got = [uid_search(imap, k, v) for k, v in searches]
            imap.logout()
            diffs = ["%s %r: oracle %r, fts %r" % (k, v, o, g)
                     for (k, v), o, g in zip(searches, oracle, got)
                     if o != g]
            self.assertEqual(diffs, [], "\n".join(diffs))

            want = dict(zip(searches, oracle))
            proven = total = 0
            for value in VALUES + phrases:
                definite, maybe = fts_lookup(dc, value)
                # definite answers are right ones
                self.assertLessEqual(definite, set(want[("BODY", value)]),
                                     value)
                for name in DEFINITE.get(value, []):
                    self.assertIn(uid_of[name], definite,
                                  "%r in %s" % (value, name))
                for name in EXCLUDED.get(value, []):
                    self.assertNotIn(uid_of[name], definite | maybe,
                                     "%r in %s" % (value, name))
                if value in phrases:
                    total += len(want[("BODY", value)])
                    proven += len(definite)
            # list mail: most phrase matches need no re-check by
            # Dovecot (the rest: HTML converted, headers, folded words)
            print("corpus phrases: %d of %d matches definite"
                  % (proven, total))
            self.assertGreater(proven, total * 8 // 10)


if __name__ == "__main__":
    unittest.main()
