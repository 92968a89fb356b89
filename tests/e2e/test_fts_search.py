"""fts-casidx end to end: IMAP SEARCH answers with the casidx index equal
the answers of the same Dovecot without FTS (the oracle for IMAP's
substring semantics), on real list mail plus a few non-ASCII messages;
then after an expunge, and after the index is deleted and rebuilt.
"""

import email
import os
import random
import re
import shutil
import sys
import unittest
from email import policy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dovecot_harness as harness  # noqa: E402
from dovecot_harness import Dovecot, corpus_files, ok  # noqa: E402

N_CORPUS = int(os.environ.get("CASIDX_E2E_MESSAGES", "300"))
USER = "user1"
# The oracle and the FTS runs are different Dovecot instances. LMTP's
# Received header carries the instance's session id (random, the same
# for every message of one connection) and the delivery time, and TEXT
# searches headers: a 3-letter TEXT query that happens to occur in one
# instance's id (TEXT "Sam" in "...SaMx...") matches every message there
# and none in the other. So the oracle runs deliver without it.
NO_LMTP_RECEIVED = "lmtp_add_received_header = no\n"
LMTP_ID_RE = re.compile(r"with LMTP\s+id ([A-Za-z0-9+/]+)")

EXTRA = [
    "From: Jürgen Müller <juergen@example.de>\r\n"
    "To: list@example.com\r\n"
    "Subject: =?UTF-8?Q?Gr=C3=BC=C3=9Fe_aus_M=C3=BCnchen?=\r\n"
    "Content-Type: text/plain; charset=utf-8\r\n"
    "Content-Transfer-Encoding: 8bit\r\n\r\n"
    "Ein café crème in München, naïve Grüße.\r\n",
    "From: Taro <taro@example.jp>\r\n"
    "To: list@example.com\r\n"
    "Subject: Tokyo\r\n"
    "Content-Type: text/plain; charset=utf-8\r\n"
    "Content-Transfer-Encoding: 8bit\r\n\r\n"
    "東京都に住んでいます。 USRP B210 works.\r\n",
    # an address header with a group and a comment: the FTS build hands
    # over only the normalised addresses, TEXT reads the raw line
    "From: Some One <one@example.com> (the first)\r\n"
    "To: unlisted-recipients:; (no To-header on input)\r\n"
    "Subject: group\r\n\r\nbody\r\n",
    "From: empty@example.com\r\n"
    "To: list@example.com\r\n"
    "Subject: \r\n\r\n",
]

# (criteria as a list of IMAP atoms; a str with non-ASCII is sent as a
# UTF-8 literal)
QUERIES = [
    ["BODY", "usrp"],
    ["BODY", "USRP"],
    ["BODY", "uhd"],
    ["BODY", "firmware"],
    ["BODY", "firm"],            # prefix
    ["BODY", "rmwar"],           # inside a word
    ["BODY", "ettus"],
    ["BODY", "b210"],
    ["BODY", "sample rate"],     # two words: maybe, verified
    ["BODY", "zzzqqqxxx"],       # nothing
    ["TEXT", "gnuradio"],
    ["TEXT", "received"],        # header names count for TEXT
    ["SUBJECT", "usrp"],
    ["SUBJECT", "re"],
    ["FROM", "ettus"],
    ["FROM", "gmail"],
    ["FROM", "@"],
    ["TO", "usrp-users"],
    ["CC", "usrp"],
    ["OR", "BODY", "fpga", "BODY", "x310"],
    ["BODY", "fpga", "BODY", "x310"],
    ["NOT", "BODY", "usrp"],
    ["NOT", "SUBJECT", "usrp"],
    ["BODY", "usrp", "NOT", "FROM", "ettus"],
    ["UNDELETED", "BODY", "driver"],
    ["SINCE", "1-Jan-2000", "BODY", "thanks"],
    ["HEADER", "Message-ID", "mail"],   # not claimed: Dovecot answers
    ["BODY", "café"],
    ["BODY", "cafe"],
    ["BODY", "München"],
    ["SUBJECT", "Grüße"],
    ["FROM", "Müller"],
    ["BODY", "東京"],
    ["TEXT", "eader "],
    ["TEXT", "no To-header on"],
    ["TEXT", "the first"],
    ["TO", "unlisted"],
    ["FROM", "first"],
    ["BODY", "京"],
]


def generated_queries(count=60):
    """Words and pieces of words from the corpus text, seeded: whole
    words, 3-5 byte substrings from inside words, and word prefixes
    under TEXT."""
    rng = random.Random(42)
    files = corpus_files("usrp-users-3000", limit=N_CORPUS)
    queries = []
    for i in range(count):
        with open(rng.choice(files), "rb") as f:
            msg = email.message_from_binary_file(f, policy=policy.default)
        text = []
        for part in msg.walk():
            if part.get_content_type() == "text/plain":
                try:
                    text.append(part.get_content())
                except (LookupError, ValueError):
                    pass
        words = re.findall(r"[A-Za-z0-9]{3,20}", " ".join(text))
        if not words:
            continue
        w = rng.choice(words)
        if i % 3 == 0:
            q = ["BODY", w]
        elif i % 3 == 1 and len(w) > 4:
            a = rng.randrange(0, len(w) - 3)
            q = ["BODY", w[a:a + 3 + rng.randrange(0, 3)]]
        else:
            q = ["TEXT", w[:max(3, len(w) - 2)]]
        if q not in queries and q not in QUERIES:
            queries.append(q)
    return queries


QUERIES.extend(generated_queries())


def corpus_messages():
    msgs = []
    for path in corpus_files("usrp-users-3000", limit=N_CORPUS):
        with open(path, "rb") as f:
            msgs.append(f.read())
    msgs.extend(m.encode("utf-8") for m in EXTRA)
    return msgs


def uid_search(imap, criteria):
    args = []
    literal = None
    for atom in criteria:
        if any(ord(c) > 127 for c in atom):
            literal = atom.encode("utf-8")
        else:
            args.append('"%s"' % atom if " " in atom or atom == ""
                        else atom)
    if literal is not None:
        # imaplib sends .literal after the last argument
        assert criteria[-1].encode("utf-8") == literal
        imap.literal = literal
        typ, data = imap.uid("SEARCH", "CHARSET", "UTF-8", *args)
    else:
        typ, data = imap.uid("SEARCH", *args)
    if typ != "OK":
        raise AssertionError("SEARCH %r: %s %r" % (criteria, typ, data))
    return sorted(int(x) for x in data[0].split())


def run_queries(dc, queries=None):
    imap = dc.imap_login(USER)
    try:
        imap.select("INBOX")
        return {tuple(q): uid_search(imap, q)
                for q in (QUERIES if queries is None else queries)}
    finally:
        imap.logout()


def casidx_sdbox():
    """sdbox with fts = casidx and nothing else set (the old-format
    fixture tests and tests/fixtures/make-casidx-fixture.py)."""
    return Dovecot(mail_location="sdbox:~/sdbox",
                   mail_plugins=["fts", "fts_casidx"],
                   plugin_settings={"fts": "casidx"},
                   extra_conf=NO_LMTP_RECEIVED)


def casidx_dirs(dc):
    found = []
    for root, dirs, files in os.walk(dc.home(USER)):
        if "manifest" in files and "casidx" in root:
            found.append(root)
    return found


def index_state(dc):
    """What a failed comparison needs to be explained: the index files
    (segments, manifest) and the LMTP ids the mails carry."""
    lines = []
    for d in casidx_dirs(dc):
        for f in sorted(os.listdir(d)):
            st = os.stat(os.path.join(d, f))
            lines.append("  %s/%s %d bytes" % (d, f, st.st_size))
        # plaintext (doc/casidx-format.md "Manifest"): segment ids,
        # UID ranges, generation
        with open(os.path.join(d, "manifest"), "rb") as f:
            lines.append("  manifest: %s" % f.read().hex())
    imap = dc.imap_login(USER)
    try:
        imap.select("INBOX", readonly=True)
        typ, data = imap.uid("FETCH", "1:*",
                             "BODY.PEEK[HEADER.FIELDS (RECEIVED)]")
        ids = {m.group(1) for item in data if isinstance(item, tuple)
               for m in LMTP_ID_RE.finditer(item[1].decode("latin-1"))}
    finally:
        imap.logout()
    lines.append("  LMTP ids in INBOX headers: %r" % sorted(ids))
    return "index state:\n" + "\n".join(lines)


# Raw address values (segment version 4): tests/fixtures/casidx-seg3 has
# msg1-3 indexed by the version-3 code; msg4 has "gmail" only in its raw
# From (a comment after a display name), msg5 only in Received and
# Message-ID.
SEG3_FIXTURE = os.path.join(harness.TOP_SRCDIR, "tests", "fixtures",
                            "casidx-seg3")
RAW_MSGS = [
    b"From: X Person <x@example.com> (gmail club)\r\n"
    b"To: list@example.com\r\nSubject: four\r\n\r\nbody four\r\n",
    b"Received: from smtp.gmail.com by mx.example.org; "
    b"Mon, 1 Jan 2024 00:00:00 +0000\r\n"
    b"From: y@example.com\r\nMessage-ID: <abc@gmail.com>\r\n"
    b"Subject: five\r\n\r\nthe first\r\n",
    b"From: z@example.com\r\nTo: undisclosed-recipients:;\r\n"
    b"Cc: \"Doe, Jane (Lab)\" <jane@example.com>\r\n"
    b"Subject: six\r\n\r\nsix\r\n",
]
RAW_QUERIES = [
    ["FROM", "first"], ["FROM", "the first"], ["FROM", "gmail"],
    ["FROM", "club"], ["FROM", "one"], ["FROM", "example"],
    ["TO", "input"], ["TO", "unlisted"], ["TO", "alpha"],
    ["TO", "team alpha"], ["CC", "comment"], ["CC", "carol"],
    ["TEXT", "first"], ["TEXT", "gmail"], ["TEXT", "input"],
    ["TEXT", "club"], ["NOT", "FROM", "gmail"], ["NOT", "TO", "input"],
    ["TO", "undisclosed"], ["TO", "recipients:;"], ["CC", "doe, jane"],
    ["CC", "jane (lab"], ["CC", "lab"],
]


# Part codes (segment version 5): tests/fixtures/casidx-seg4 has msg1-3
# indexed by the version-4 code (parts without codes); msg4 is msg1 again,
# indexed by the current code.
SEG4_FIXTURE = os.path.join(harness.TOP_SRCDIR, "tests", "fixtures",
                            "casidx-seg4")
PART_QUERIES = [
    ["BODY", "this list"], ["TEXT", "this list"], ["BODY", "com/blog"],
    ["TEXT", "com/blog"], ["BODY", "read this"], ["BODY", "list or"],
    ["BODY", "this checklist"], ["NOT", "BODY", "this list"],
]


def seg4_messages():
    msgs = []
    for i in (1, 2, 3, 1):
        with open(os.path.join(SEG4_FIXTURE, "msg%d.eml" % i), "rb") as f:
            msgs.append(f.read())
    return msgs


def seg3_messages():
    msgs = []
    for i in (1, 2, 3):
        with open(os.path.join(SEG3_FIXTURE, "msg%d.eml" % i), "rb") as f:
            msgs.append(f.read())
    return msgs + RAW_MSGS


def fts_lookup(dc, key, value):
    """(definite, maybe) UIDs of doveadm fts lookup <key> <value>."""
    r = dc.doveadm("fts", "lookup", "-u", USER, "mailbox", "INBOX",
                   key, value)
    out = {"INBOX:": set(), "- maybe:": set()}
    for line in r.stdout.splitlines():
        line = line.strip()
        for prefix in out:
            if line.startswith(prefix) and "no results" not in line:
                for item in line[len(prefix):].split(","):
                    a, _, b = item.strip().partition(":")
                    if a:
                        out[prefix].update(range(int(a), int(b or a) + 1))
    return out["INBOX:"], out["- maybe:"]


class FtsCasidxSearch(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.messages = corpus_messages()
        with Dovecot(mail_location="sdbox:~/sdbox",
                     mail_plugins=[], extra_conf=NO_LMTP_RECEIVED) as dc:
            dc.lmtp_deliver_many(USER, cls.messages)
            cls.oracle = run_queries(dc)
            imap = dc.imap_login(USER)
            imap.select("INBOX")
            imap.uid("STORE", "1:10", "+FLAGS", "(\\Deleted)")
            imap.expunge()
            imap.close()
            imap.logout()
            cls.oracle_after_expunge = run_queries(dc)

    def fts_dovecot(self):
        return Dovecot(mail_location="sdbox:~/sdbox",
                       mail_plugins=["fts", "fts_casidx"],
                       plugin_settings={"fts": "casidx",
                                        "fts_autoindex": "yes",
                                        "fts_enforced": "yes"},
                       extra_conf=NO_LMTP_RECEIVED)

    def assert_same(self, got, expected, what, dc=None):
        diffs = []
        for q, uids in expected.items():
            only_fts = sorted(set(got[q]) - set(uids))
            only_oracle = sorted(set(uids) - set(got[q]))
            if only_fts or only_oracle:
                diffs.append("%s %r: fts %d uids, oracle %d; only fts %r, "
                             "only oracle %r"
                             % (what, q, len(got[q]), len(uids),
                                only_fts[:10], only_oracle[:10]))
        if diffs and dc is not None:
            diffs.append(index_state(dc))
        self.assertEqual(diffs, [], "\n".join(diffs))

    def test_search_equals_oracle(self):
        # the oracle must exercise both matches and non-matches
        self.assertGreater(len(self.oracle[("BODY", "usrp")]), 50)
        self.assertGreater(len(self.oracle[("BODY", "München")]), 0)
        self.assertGreater(len(self.oracle[("NOT", "BODY", "usrp")]), 0)
        with self.fts_dovecot() as dc:
            dc.lmtp_deliver_many(USER, self.messages)
            dc.doveadm("index", "-u", USER, "INBOX")
            dirs = casidx_dirs(dc)
            self.assertEqual(len(dirs), 1, dirs)
            # the index answers by itself
            r = dc.doveadm("fts", "lookup", "-u", USER,
                           "mailbox", "INBOX", "body", "firmware")
            self.assertRegex(r.stdout, r"INBOX: [0-9]")
            # maybe only for messages with text no term covers (encoded
            # runs in their bodies): the definite UIDs are most of them
            print("fts lookup body firmware: %s" % r.stdout.strip())
            # Dovecot 2.3.19 builds the CAPABILITY string before the
            # namespaces (and so the FTS backend) exist, so SEARCH=FUZZY
            # is never advertised; the FUZZY key itself works.
            imap = dc.imap_login(USER)
            imap.select("INBOX")
            typ, data = imap.uid("SEARCH", "FUZZY", "BODY", "usrp")
            self.assertEqual(typ, "OK")
            self.assertEqual(sorted(int(x) for x in data[0].split()),
                             self.oracle[("BODY", "usrp")])
            imap.logout()

            self.assert_same(run_queries(dc), self.oracle, "indexed", dc)

            imap = dc.imap_login(USER)
            imap.select("INBOX")
            imap.uid("STORE", "1:10", "+FLAGS", "(\\Deleted)")
            imap.expunge()
            imap.close()
            imap.logout()
            self.assert_same(run_queries(dc), self.oracle_after_expunge,
                             "after expunge")

            dc.doveadm("fts", "optimize", "-u", USER)
            self.assert_same(run_queries(dc), self.oracle_after_expunge,
                             "after optimize")

            # derived data: delete it, the indexer rebuilds it
            dc.doveadm("fts", "rescan", "-u", USER)
            self.assertEqual(casidx_dirs(dc), [])
            dc.doveadm("index", "-u", USER, "INBOX")
            self.assertEqual(len(casidx_dirs(dc)), 1)
            self.assert_same(run_queries(dc), self.oracle_after_expunge,
                             "rebuilt")

    def test_memory_budget_flushes_and_merges(self):
        """A 1 MB writer budget forces several segment flushes and merges
        inside one indexing run; answers stay identical."""
        dc = Dovecot(mail_location="sdbox:~/sdbox",
                     mail_plugins=["fts", "fts_casidx"],
                     plugin_settings={"fts": "casidx",
                                      "fts_enforced": "yes",
                                      "fts_casidx_memory_budget": "1M",
                                      "fts_casidx_merge_segments": "2"},
                     extra_conf=NO_LMTP_RECEIVED)
        with dc:
            dc.lmtp_deliver_many(USER, self.messages)
            r = dc.doveadm("-D", "index", "-u", USER, "INBOX")
            commits = [line for line in dc.log_lines()
                       + r.stderr.splitlines() + r.stdout.splitlines()
                       if "budget_flushes=" in line]
            flushes = [int(line.rsplit("budget_flushes=", 1)[1])
                       for line in commits]
            self.assertTrue(flushes and max(flushes) >= 2, commits)
            # at most merge_segments live, merged-away ones unlinked
            segs = [f for d in casidx_dirs(dc) for f in os.listdir(d)
                    if f.endswith(".cxs")]
            self.assertLessEqual(len(segs), 2, segs)
            self.assert_same(run_queries(dc), self.oracle, "budget", dc)

    def test_old_format_index_rebuilt(self):
        """An index written by the format-1 or format-2 code (the
        committed fixtures, manifest versions 1 and 2) is never used for
        answers: the backend says so as info, drops it, and the searches
        equal Dovecot's own; the rebuilt index has the current version."""
        for version in (1, 2):
            with self.subTest(version=version):
                self._old_format_index_rebuilt(version)

    def _old_format_index_rebuilt(self, version):
        fixture = os.path.join(harness.TOP_SRCDIR, "tests", "fixtures",
                               "casidx-v%d" % version)
        msgs = [b"From: a@example.com\r\nTo: b@example.com\r\n"
                b"Subject: fixture one\r\n\r\nThe quick brown fox jumps.\r\n",
                b"From: c@example.com\r\nTo: d@example.com\r\n"
                b"Subject: fixture two\r\n\r\nlazy dog sleeps.\r\n"]
        dc = casidx_sdbox()
        with dc:
            dc.lmtp_deliver_many(USER, msgs)
            dc.doveadm("index", "-u", USER, "INBOX")
            dirs = casidx_dirs(dc)
            self.assertEqual(len(dirs), 1, dirs)
            for f in os.listdir(dirs[0]):
                os.unlink(os.path.join(dirs[0], f))
            for f in ("manifest", "seg-00000001.cxs"):
                shutil.copy(os.path.join(fixture, f), dirs[0])
                os.chown(os.path.join(dirs[0], f),
                         os.stat(dirs[0]).st_uid, os.stat(dirs[0]).st_gid)
            imap = dc.imap_login(USER)
            imap.select("INBOX")
            self.assertEqual(uid_search(imap, ["BODY", "quick"]), [1])
            self.assertEqual(uid_search(imap, ["BODY", "sleeps"]), [2])
            imap.logout()
            dc.wait_log(r"old index format version %d \(now 3\) - "
                        % version +
                        r"rebuilding the index in the current format")
            dc.doveadm("index", "-u", USER, "INBOX")
            with open(os.path.join(dirs[0], "manifest"), "rb") as f:
                head = f.read(12)
            self.assertEqual(head[:8], b"CXMANIF1")
            self.assertEqual(int.from_bytes(head[8:12], "little"), 3)
            r = dc.doveadm("fts", "lookup", "-u", USER,
                           "mailbox", "INBOX", "body", "quick")
            self.assertIn("INBOX: 1", r.stdout)

    def test_raw_addresses(self):
        """FROM/TO/CC look up the raw values of the same header only
        (segment version 4): a value in Received or Message-ID alone is
        no candidate, one in a raw From comment is. A version-3 index
        (the committed fixture) is answered the old way, also merged with
        a version-4 segment; all equal to Dovecot without FTS."""
        msgs = seg3_messages()
        with Dovecot(mail_location="sdbox:~/sdbox", mail_plugins=[],
                     extra_conf=NO_LMTP_RECEIVED) as dc:
            dc.lmtp_deliver_many(USER, msgs)
            oracle = run_queries(dc, RAW_QUERIES)
        dc = casidx_sdbox()
        with dc:
            dc.lmtp_deliver_many(USER, msgs)
            dc.doveadm("index", "-u", USER, "INBOX")
            self.assertEqual(fts_lookup(dc, "from", "gmail"), ({2}, {4}))
            self.assertEqual(fts_lookup(dc, "from", "first"), (set(), {1}))
            self.assert_same(run_queries(dc, RAW_QUERIES), oracle,
                             "version 4")
        dc = casidx_sdbox()
        with dc:
            dc.lmtp_deliver_many(USER, msgs[:3])
            dc.doveadm("mailbox", "update", "-u", USER, "--uid-validity",
                       "1700000000", "INBOX")
            dc.doveadm("index", "-u", USER, "INBOX")
            [d] = casidx_dirs(dc)
            for f in os.listdir(d):
                os.unlink(os.path.join(d, f))
            for f in ("manifest", "seg-00000001.cxs"):
                shutil.copy(os.path.join(SEG3_FIXTURE, f), d)
                os.chown(os.path.join(d, f), os.stat(d).st_uid,
                         os.stat(d).st_gid)
            # the old way: 3's Received and Message-ID count
            self.assertEqual(fts_lookup(dc, "from", "gmail"), ({2}, {3}))
            # a version-4 segment beside it (tiered merges may have
            # merged them already)
            dc.lmtp_deliver_many(USER, msgs[3:])
            dc.doveadm("index", "-u", USER, "INBOX")
            self.assertEqual(fts_lookup(dc, "from", "gmail"),
                             ({2}, {3, 4}))
            self.assert_same(run_queries(dc, RAW_QUERIES), oracle, "3 + 4")
            dc.doveadm("fts", "optimize", "-u", USER)
            self.assertEqual(len([f for f in os.listdir(d)
                                  if f.endswith(".cxs")]), 1)
            self.assertEqual(fts_lookup(dc, "from", "gmail"),
                             ({2}, {3, 4}))
            self.assert_same(run_queries(dc, RAW_QUERIES), oracle, "merged")

    def test_part_codes(self):
        """A phrase whose words occur only as parts of compounds is no
        candidate in a version-5 segment; a version-4 index (the
        committed fixture) is answered as before (maybe), also merged
        with a version-5 segment; all equal to Dovecot without FTS."""
        msgs = seg4_messages()
        with Dovecot(mail_location="sdbox:~/sdbox", mail_plugins=[],
                     extra_conf=NO_LMTP_RECEIVED) as dc:
            dc.lmtp_deliver_many(USER, msgs)
            oracle = run_queries(dc, PART_QUERIES)
        dc = casidx_sdbox()
        with dc:
            dc.lmtp_deliver_many(USER, msgs[:3])
            dc.doveadm("mailbox", "update", "-u", USER, "--uid-validity",
                       "1700000000", "INBOX")
            dc.doveadm("index", "-u", USER, "INBOX")
            self.assertEqual(fts_lookup(dc, "body", "this list"),
                             ({2}, set()))
            [d] = casidx_dirs(dc)
            for f in os.listdir(d):
                os.unlink(os.path.join(d, f))
            for f in ("manifest", "seg-00000001.cxs"):
                shutil.copy(os.path.join(SEG4_FIXTURE, f), d)
                os.chown(os.path.join(d, f), os.stat(d).st_uid,
                         os.stat(d).st_gid)
            # version 4: 1's "list" parts have no codes
            self.assertEqual(fts_lookup(dc, "body", "this list"),
                             ({2}, {1}))
            dc.lmtp_deliver_many(USER, msgs[3:])
            dc.doveadm("index", "-u", USER, "INBOX")
            self.assertEqual(fts_lookup(dc, "body", "this list"),
                             ({2}, {1}))
            self.assert_same(run_queries(dc, PART_QUERIES), oracle,
                             "4 + 5")
            dc.doveadm("fts", "optimize", "-u", USER)
            self.assertEqual(len([f for f in os.listdir(d)
                                  if f.endswith(".cxs")]), 1)
            self.assertEqual(fts_lookup(dc, "body", "this list"),
                             ({2}, {1}))
            self.assert_same(run_queries(dc, PART_QUERIES), oracle,
                             "merged")

    def test_lmtp_id_matches_every_mail_of_its_instance(self):
        """Why the oracle runs deliver without LMTP's Received header: a
        TEXT query for a piece of the instance's LMTP session id matches
        every message delivered over that connection, in casidx and in
        Dovecot without FTS alike (the answer is right), and the id
        differs between instances. Also checks that NO_LMTP_RECEIVED
        takes effect, so the other tests' comparisons are sound."""
        n = 40
        with Dovecot(mail_location="sdbox:~/sdbox",
                     mail_plugins=["fts", "fts_casidx"],
                     plugin_settings={"fts": "casidx",
                                      "fts_enforced": "yes"}) as dc:
            dc.lmtp_deliver_many(USER, self.messages[:n])
            dc.doveadm("index", "-u", USER, "INBOX")
            imap = dc.imap_login(USER)
            imap.select("INBOX")
            typ, data = imap.uid("FETCH", "1",
                                 "BODY.PEEK[HEADER.FIELDS (RECEIVED)]")
            m = LMTP_ID_RE.search(data[0][1].decode("latin-1"))
            self.assertIsNotNone(m, data)
            lmtp_id = m.group(1)
            piece = next(lmtp_id[i:i + 3] for i in range(len(lmtp_id) - 2)
                         if lmtp_id[i:i + 3].isalnum()).lower()
            fts = uid_search(imap, ["TEXT", piece])
            imap.logout()
            self.assertEqual(fts, list(range(1, n + 1)), (lmtp_id, piece))
            # the same mails searched by Dovecot itself, without FTS
            r = dc.doveadm("-o", "mail_plugins=", "search", "-u", USER,
                           "mailbox", "INBOX", "text", piece)
            plain = sorted(int(line.split()[1])
                           for line in r.stdout.splitlines())
            self.assertEqual(plain, fts, (lmtp_id, piece))
        with self.fts_dovecot() as dc:
            dc.lmtp_deliver_many(USER, self.messages[:1])
            imap = dc.imap_login(USER)
            imap.select("INBOX")
            typ, data = imap.uid("FETCH", "1",
                                 "BODY.PEEK[HEADER.FIELDS (RECEIVED)]")
            imap.logout()
            hdr = data[0][1].decode("latin-1")
            self.assertIsNone(LMTP_ID_RE.search(hdr), hdr)
            self.assertNotIn(lmtp_id, hdr)

    def test_virtual_mailbox(self):
        """A virtual mailbox over INBOX is searched through the backend
        of another namespace (lookup per backing box: result->box,
        unique sorted scores) and gives INBOX's answers."""
        extra = ("namespace virtual {\n  prefix = Virtual/\n"
                 "  separator = /\n  location = virtual:~/virtual\n}\n")
        with Dovecot(mail_location="sdbox:~/sdbox",
                     mail_plugins=["fts", "fts_casidx", "virtual"],
                     plugin_settings={"fts": "casidx",
                                      "fts_enforced": "yes"},
                     extra_conf=extra + NO_LMTP_RECEIVED) as dc:
            dc.lmtp_deliver_many(USER, self.messages)
            dc.doveadm("index", "-u", USER, "INBOX")
            vdir = os.path.join(dc.home(USER), "virtual", "All")
            os.makedirs(vdir)
            with open(os.path.join(vdir, "dovecot-virtual"), "w") as f:
                f.write("INBOX\n  all\n")
            for d in (os.path.dirname(vdir), vdir,
                      os.path.join(vdir, "dovecot-virtual")):
                os.chown(d, dc.uid, dc.gid)
            imap = dc.imap_login(USER)
            for q in (["BODY", "usrp"], ["BODY", "rmwar"],
                      ["FROM", "ettus"], ["NOT", "BODY", "usrp"],
                      ["BODY", "sample rate"]):
                imap.select("Virtual/All", readonly=True)
                typ, vdata = imap.search(
                    None, *['"%s"' % a if " " in a else a for a in q])
                self.assertEqual(typ, "OK")
                # INBOX seqs = UIDs here: nothing was expunged
                self.assertEqual(sorted(int(x) for x in vdata[0].split()),
                                 self.oracle[tuple(q)], q)
            imap.logout()

    def test_corrupt_index_is_rebuilt(self):
        """A flipped byte in a segment is detected by its CRC; the index
        is dropped and rebuilt and SEARCH answers stay right."""
        with self.fts_dovecot() as dc:
            dc.allow_log(r"fts-casidx: .*corrupted segment: .*"
                         r"rebuilding the index")
            dc.lmtp_deliver_many(USER, self.messages)
            dc.doveadm("index", "-u", USER, "INBOX")
            [d] = casidx_dirs(dc)
            # autoindex may have committed several: damage the largest,
            # in its doc bitmap (verified when the snapshot is loaded)
            path = max((os.path.join(d, f) for f in os.listdir(d)
                        if f.endswith(".cxs")), key=os.path.getsize)
            with open(path, "r+b") as f:
                f.seek(20)
                b = f.read(1)
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([b[0] ^ 0x10]))
            self.assert_same(run_queries(dc), self.oracle, "corrupted")
            self.assertIsNotNone(dc.wait_log(r"rebuilding the index"))
            dc.doveadm("index", "-u", USER, "INBOX")
            r = dc.doveadm("fts", "lookup", "-u", USER,
                           "mailbox", "INBOX", "body", "firmware")
            self.assertRegex(r.stdout, r"INBOX: [0-9]")

    def test_uid_validity_change_rebuilds(self):
        """An index whose UIDs belong to an older UIDVALIDITY is dropped
        and rebuilt instead of being trusted."""
        with self.fts_dovecot() as dc:
            dc.lmtp_deliver_many(USER, self.messages[:40])
            dc.doveadm("index", "-u", USER, "INBOX")
            dc.doveadm("mailbox", "update", "-u", USER,
                       "--uid-validity", "12345", "INBOX")
            imap = dc.imap_login(USER)
            imap.select("INBOX")
            for q in (["BODY", "usrp"], ["NOT", "BODY", "usrp"]):
                typ, data = imap.uid("SEARCH", *q)
                self.assertEqual(sorted(int(x) for x in data[0].split()),
                                 [u for u in self.oracle[tuple(q)]
                                  if u <= 40], q)
            imap.logout()
            self.assertIsNotNone(dc.wait_log(r"UIDVALIDITY changed"))

    def test_new_mail_is_searchable(self):
        with self.fts_dovecot() as dc:
            dc.lmtp_deliver_many(USER, self.messages[:20])
            dc.doveadm("index", "-u", USER, "INBOX")
            dc.lmtp_deliver(USER, b"From: a@example.com\r\n"
                            b"Subject: late\r\n\r\nquokkaword here\r\n")
            # not indexed yet: fts_enforced makes SEARCH index first
            imap = dc.imap_login(USER)
            imap.select("INBOX")
            typ, data = imap.uid("SEARCH", "BODY", "quokka")
            self.assertEqual(data[0].split(), [b"21"])
            typ, data = imap.uid("SEARCH", "BODY", "okkawo")
            self.assertEqual(data[0].split(), [b"21"])
            imap.logout()
            # a long hyphenated identifier is words, not base64
            dc.lmtp_deliver(USER, b"From: a@example.com\r\n"
                            b"X-Zorg-CrossTenant-originalarrivalzorgtime: 1"
                            b"\r\nSubject: ids\r\n\r\n"
                            b"Header-Like-Identifier-"
                            b"Zorgblatquuxification-Extra\r\n")
            dc.doveadm("index", "-u", USER, "INBOX")
            for field, word in (("body", "zorgblatquux"),
                                ("text", "originalarrivalzorgtime")):
                r = dc.doveadm("fts", "lookup", "-u", USER, "mailbox",
                               "INBOX", field, word)
                self.assertIn("INBOX: 22", r.stdout, (field, word))
            imap = dc.imap_login(USER)
            imap.select("INBOX")
            typ, data = imap.uid("SEARCH", "BODY", "zorgblatquux")
            self.assertEqual(data[0].split(), [b"22"])
            typ, data = imap.uid("SEARCH", "TEXT", "originalarrivalzorg")
            self.assertEqual(data[0].split(), [b"22"])
            imap.logout()

    def test_expunge_before_and_after_everything_indexed(self):
        """Expunges reach the backend in whichever process syncs them.
        An IMAP EXPUNGE or doveadm expunge in a mailbox nothing was
        indexed in yet used to panic the process (a manifest with no
        segment); so did an optimize that merged every document away.
        Both must work, and search must stay right afterwards."""
        marker = (b"From: a@example.com\r\nSubject: late\r\n\r\n"
                  b"wombatquill here\r\n")
        with Dovecot(mail_location="sdbox:~/sdbox",
                     mail_plugins=["fts", "fts_casidx"],
                     plugin_settings={"fts": "casidx",
                                      "fts_autoindex": "no",
                                      "fts_enforced": "yes"},
                     extra_conf=NO_LMTP_RECEIVED) as dc:
            dc.lmtp_deliver_many(USER, self.messages[:6])
            imap = dc.imap_login(USER)
            ok(imap.select("INBOX"))
            ok(imap.uid("STORE", "1:2", "+FLAGS", "(\\Deleted)"))
            ok(imap.expunge())
            imap.logout()
            dc.doveadm("expunge", "-u", USER, "mailbox", "INBOX", "uid", "3")
            imap = dc.imap_login(USER)
            ok(imap.select("INBOX"))
            typ, data = imap.uid("SEARCH", "BODY", "usrp")
            self.assertEqual(
                (typ, sorted(int(x) for x in data[0].split())),
                ("OK", [u for u in self.oracle[("BODY", "usrp")]
                        if 4 <= u <= 6]))
            # everything indexed is expunged, then merged away
            ok(imap.uid("STORE", "4:6", "+FLAGS", "(\\Deleted)"))
            ok(imap.expunge())
            imap.logout()
            dc.doveadm("fts", "optimize", "-u", USER)
            dc.lmtp_deliver(USER, marker)
            imap = dc.imap_login(USER)
            ok(imap.select("INBOX"))
            typ, data = imap.uid("SEARCH", "BODY", "wombatquill")
            self.assertEqual((typ, data[0]), ("OK", b"7"))
            typ, data = imap.uid("SEARCH", "BODY", "usrp")
            self.assertEqual((typ, data[0]), ("OK", b""))
            imap.logout()
            dc.stop()
            self.assertFalse([line for line in dc.log_lines()
                              if "Panic" in line or "killed" in line])


if __name__ == "__main__":
    unittest.main()
