"""fts-casidx property test: for thousands of searches generated from the
messages themselves, IMAP SEARCH with the casidx index returns exactly
the UIDs of the same Dovecot without FTS (the oracle of IMAP's substring
semantics). Any false negative of the index (a message Dovecot finds but
casidx neither returns as definite nor as maybe) or any wrong definite
answer shows up as a UID difference.

Values are random substrings, of every length from 1 byte up, of what
Dovecot's own search reads: header lines ("Name: value", unfolded,
encoded words decoded), decoded text parts including the raw markup of
HTML parts, in every script and charset the sample contains. Messages
come from every corpus folder.

Plus CASIDX_EQ_PHRASES (240) searches aimed at what positions and
single-term proofs answer definitely (doc/search-semantics.md): runs of
2-4 ASCII words one space apart, cut inside their first and last word;
two words of one message in random order (mostly not adjacent: a wrong
definite answer would show); whitespace-free runs with punctuation
(URLs, paths, markup).

Bounded by default (CI): CASIDX_EQ_MESSAGES messages (240), CASIDX_EQ_QUERIES
searches (1000), seed CASIDX_EQ_SEED (17). The longer run and its result
are in doc/testing.md.
"""

import email
import email.header
import os
import random
import re
import sys
import unittest
from email import policy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (corpus_dir, load,  # noqa: E402
                             sdbox_casidx, sdbox_oracle)

USER = "user1"
N_MESSAGES = int(os.environ.get("CASIDX_EQ_MESSAGES", "240"))
N_QUERIES = int(os.environ.get("CASIDX_EQ_QUERIES", "1000"))
N_PHRASES = int(os.environ.get("CASIDX_EQ_PHRASES", "240"))
SEED = int(os.environ.get("CASIDX_EQ_SEED", "17"))
# Messages bigger than this are left out of the sample: each search of
# the oracle reads every message, so a few 3 MB logs would dominate.
MAX_MESSAGE = int(os.environ.get("CASIDX_EQ_MAX_BYTES", str(256 * 1024)))
# substring length: mostly short (the hardest cases for a word index),
# some across several words and punctuation
LENGTHS = [(1, 3, 20), (4, 8, 35), (9, 20, 30), (21, 60, 15)]


def _folder_files(folder):
    """Every non-empty message under a corpus folder, its subfolders
    included (spamassassin keeps its mail in spam-1/, easy_ham/, ...)."""
    root = os.path.join(corpus_dir(), folder)
    out = []
    for dirpath, dirs, names in os.walk(root):
        dirs.sort()
        out.extend(os.path.join(dirpath, n) for n in sorted(names)
                   if not n.startswith(".")
                   and os.path.getsize(os.path.join(dirpath, n)) > 0)
    return out


def sample_messages(rng):
    """About N_MESSAGES messages, from every folder of the corpus in
    proportion to its size (at least 10 of each), seeded."""
    folders = sorted(d for d in os.listdir(corpus_dir())
                     if os.path.isdir(os.path.join(corpus_dir(), d)))
    files = {f: [p for p in _folder_files(f)
                 if os.path.getsize(p) <= MAX_MESSAGE] for f in folders}
    total = sum(len(v) for v in files.values())
    out = []
    for f in folders:
        k = max(10, N_MESSAGES * len(files[f]) // max(total, 1))
        out.extend(rng.sample(files[f], min(k, len(files[f]))))
    rng.shuffle(out)
    return load(out)


def part_text(part):
    payload = part.get_payload(decode=True)
    if not isinstance(payload, bytes):
        return None
    charset = part.get_content_charset() or "us-ascii"
    try:
        text = payload.decode(charset)
    except (LookupError, UnicodeDecodeError):
        text = payload.decode("latin-1")
    return text


def message_sources(raw):
    """(search key, text) pairs Dovecot's own search reads in raw."""
    msg = email.message_from_bytes(raw, policy=policy.compat32)
    sources = []
    top = True
    for part in msg.walk():
        for name, value in part.items():
            value = re.sub(r"\r?\n[ \t]", " ", str(value))
            try:
                value = str(email.header.make_header(
                    email.header.decode_header(value)))
            except Exception:  # broken encoded words: the raw value
                pass
            sources.append(("TEXT", "%s: %s" % (name, value)))
            lname = name.lower()
            if top and lname == "subject":
                sources.append(("SUBJECT", value))
            elif top and lname in ("from", "to", "cc"):
                sources.append((lname.upper(), value))
        top = False
        maintype = part.get_content_maintype()
        if maintype in ("text", "message") and not part.is_multipart():
            text = part_text(part)
            if text:
                sources.append(("BODY", text))
                sources.append(("TEXT", text))
    return sources


def random_value(rng, text):
    """A random substring of one line of text, or None."""
    lines = [ln for ln in re.split(r"[\r\n]+", text) if ln.strip()]
    if not lines:
        return None
    line = rng.choice(lines)
    lo, hi, _ = rng.choices(LENGTHS, weights=[w for _, _, w in LENGTHS])[0]
    n = min(len(line), rng.randint(lo, hi))
    start = rng.randrange(0, len(line) - n + 1)
    value = line[start:start + n].replace("\0", "")
    # an empty or blank value matches everything and is never sent to
    # the index; the replacement character means undecodable input
    if not value.strip() or "\ufffd" in value:
        return None
    return value


def non_ascii_value(rng, text):
    """A random substring of text around one of its non-ASCII
    characters, or None."""
    lines = [ln for ln in re.split(r"[\r\n]+", text)
             if any(ord(c) > 127 for c in ln)]
    if not lines:
        return None
    line = rng.choice(lines)
    at = rng.choice([i for i, c in enumerate(line) if ord(c) > 127])
    lo, hi, _ = rng.choices(LENGTHS, weights=[w for _, _, w in LENGTHS])[0]
    n = rng.randint(lo, hi)
    start = max(0, at - rng.randrange(0, n))
    value = line[start:start + n].replace("\0", "")
    if not value.strip() or "\ufffd" in value:
        return None
    return value


# share of the searches cut around a non-ASCII character (the corpus is
# ~98 % English: without this, other scripts would hardly be searched)
NON_ASCII_SHARE = 0.15


def generate_queries(rng, messages, count):
    """count criteria lists: mostly one leaf, some NOT/OR/AND of two.
    The last atom is the generated value (sent as a literal)."""
    sources = [message_sources(m) for m in messages]
    non_ascii = [(key, text) for srcs in sources for key, text in srcs
                 if any(ord(c) > 127 for c in text)]
    queries = []
    seen = set()
    tries = 0
    while len(queries) < count and tries < count * 20:
        tries += 1
        srcs = rng.choice(sources)
        if not srcs:
            continue
        key, text = rng.choice(srcs)
        if non_ascii and rng.random() < NON_ASCII_SHARE:
            key, text = rng.choice(non_ascii)
            value = non_ascii_value(rng, text)
        else:
            value = random_value(rng, text)
        if value is None:
            continue
        r = rng.random()
        if r < 0.06:
            q = ("NOT", key, value)
        elif r < 0.10:
            # an ASCII word of another message OR'd with the value
            other = random_value(rng, rng.choice(rng.choice(sources) or
                                                 [("BODY", "usrp")])[1])
            words = re.findall(r"[A-Za-z0-9]{3,}", other or "")
            if not words:
                continue
            q = ("OR", "BODY", rng.choice(words), key, value)
        elif r < 0.14:
            words = re.findall(r"[A-Za-z0-9]{2,}", text)
            if not words:
                continue
            q = ("BODY", rng.choice(words), key, value)
        else:
            q = (key, value)
        if q not in seen:
            seen.add(q)
            queries.append(q)
    return queries


ASCII_WORD = re.compile(r"^[A-Za-z0-9]+$")


def phrase_value(rng, text):
    """2-4 consecutive ASCII words of a line that are one space apart,
    the first cut at a random start, the last at a random end."""
    lines = [ln for ln in re.split(r"[\r\n]+", text) if " " in ln]
    if not lines:
        return None
    words = rng.choice(lines).split(" ")
    runs = [i for i in range(len(words) - 1)
            if ASCII_WORD.match(words[i]) and ASCII_WORD.match(words[i + 1])]
    if not runs:
        return None
    i = rng.choice(runs)
    n = 2
    while (n < 4 and i + n < len(words) and ASCII_WORD.match(words[i + n])
           and rng.random() < 0.5):
        n += 1
    ws = words[i:i + n]
    ws[0] = ws[0][rng.randrange(0, len(ws[0])):]
    ws[-1] = ws[-1][:rng.randint(1, len(ws[-1]))]
    return " ".join(ws)


def swapped_value(rng, text):
    """Two ASCII words of the text, one space apart, in random order."""
    words = sorted(set(re.findall(r"[A-Za-z0-9]{2,}", text)))
    if len(words) < 2:
        return None
    a, b = rng.sample(words, 2)
    return "%s %s" % (a, b)


def punct_value(rng, text):
    """A whitespace-free run of printable ASCII with punctuation, or a
    piece of one."""
    runs = [r for r in re.findall(r"[!-~]{3,}", text)
            if re.search(r"[^A-Za-z0-9]", r)]
    if not runs:
        return None
    run = rng.choice(runs)
    n = rng.randint(2, min(len(run), 40))
    start = rng.randrange(0, len(run) - n + 1)
    return run[start:start + n]


def generate_phrase_queries(rng, messages, count, seen):
    """count more criteria lists from the three generators above."""
    sources = [message_sources(m) for m in messages]
    gens = [phrase_value, phrase_value, swapped_value, punct_value]
    queries = []
    tries = 0
    while len(queries) < count and tries < count * 20:
        tries += 1
        srcs = rng.choice(sources)
        if not srcs:
            continue
        key, text = rng.choice(srcs)
        value = rng.choice(gens)(rng, text)
        if value is None or not value.strip():
            continue
        q = ("NOT", key, value) if rng.random() < 0.05 else (key, value)
        if q not in seen:
            seen.add(q)
            queries.append(q)
    return queries


def uid_search(imap, criteria):
    """UID SEARCH with the last atom as a UTF-8 literal (any bytes but
    CR/LF, no quoting rules to get wrong)."""
    imap.literal = criteria[-1].encode("utf-8")
    typ, data = imap.uid("SEARCH", "CHARSET", "UTF-8", *criteria[:-1])
    if typ != "OK":
        raise AssertionError("SEARCH %r: %s %r" % (criteria, typ, data))
    return sorted(int(x) for x in data[0].split())


def run_queries(dc, queries):
    imap = dc.imap_login(USER)
    try:
        imap.select("INBOX", readonly=True)
        return [uid_search(imap, q) for q in queries]
    finally:
        imap.logout()


class FtsCasidxEquivalence(unittest.TestCase):

    def test_generated_searches_equal_dovecot_without_fts(self):
        rng = random.Random(SEED)
        messages = sample_messages(rng)
        queries = generate_queries(rng, messages, N_QUERIES)
        self.assertGreaterEqual(len(queries), N_QUERIES * 9 // 10)
        phrases = generate_phrase_queries(random.Random(SEED + 1),
                                          messages, N_PHRASES,
                                          set(queries))
        self.assertGreaterEqual(len(phrases), N_PHRASES * 9 // 10)
        queries += phrases
        with sdbox_oracle() as dc:
            dc.lmtp_deliver_many(USER, messages)
            oracle = run_queries(dc, queries)
        # the values come from the mail: most must match something, or
        # the comparison proves little
        matched = sum(1 for uids in oracle if uids)
        self.assertGreater(matched, len(queries) * 6 // 10,
                           "%d of %d generated searches match"
                           % (matched, len(queries)))
        scripts = {"non-ASCII": 0}
        for q in queries:
            if any(ord(c) > 127 for c in q[-1]):
                scripts["non-ASCII"] += 1
        self.assertGreater(scripts["non-ASCII"], len(queries) // 20)

        with sdbox_casidx() as dc:
            dc.lmtp_deliver_many(USER, messages)
            dc.doveadm("index", "-u", USER, "INBOX")
            got = run_queries(dc, queries)

        diffs = []
        for q, want, have in zip(queries, oracle, got):
            if want != have:
                diffs.append("%r: only oracle %r, only fts %r" % (
                    q, sorted(set(want) - set(have))[:8],
                    sorted(set(have) - set(want))[:8]))
        print("%d messages, %d searches (%d match, %d non-ASCII), "
              "%d differ" % (len(messages), len(queries), matched,
                             scripts["non-ASCII"], len(diffs)))
        self.assertEqual(diffs, [], "%d of %d searches differ:\n%s" % (
            len(diffs), len(queries), "\n".join(diffs[:60])))


if __name__ == "__main__":
    unittest.main()
