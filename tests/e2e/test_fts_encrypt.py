"""fts-casidx segments are sealed with the user's casbox key: with
casbox storage and casidx, no file under the user's home (casbox root,
Dovecot indexes, casidx directories) contains the distinctive words of
the delivered mail, neither as written nor as the tokenizer's normalised
terms, while SEARCH still answers from the index. The control run (sdbox
+ casidx, no key) indexes the same mail unencrypted and finds every one
of those normalised terms in its casidx files, which proves the needles
are what an unencrypted index would hold. A missing key file fails FTS
with a clear error instead of writing plaintext."""

import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (Dovecot, corpus_files,  # noqa: E402
                             files_under, found_in)

USER = "user1"
KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
FTS = {"fts": "casidx", "fts_enforced": "yes", "fts_casidx_no_fsync": "yes"}
MARKER = (
    "From: Quentin Zabriskie <qzabriskie@frobozzco.example>\r\n"
    "To: list@example.com\r\n"
    "Subject: Xylophonic telemetry Zanzibarquokka\r\n"
    "Content-Type: text/plain; charset=utf-8\r\n"
    "Content-Transfer-Encoding: 8bit\r\n\r\n"
    "Plumbiferous wombatcanary ÉCLAIRSPLENDIDE in Münchenstraße.\r\n"
).encode("utf-8")
# (criteria, normalised term the tokenizer stores for it)
MARKER_TERMS = [
    (["BODY", "plumbiferous"], b"plumbiferous"),
    (["BODY", "WombatCanary"], b"wombatcanary"),
    (["SUBJECT", "zanzibarquokka"], b"zanzibarquokka"),
    (["SUBJECT", "xylophonic"], b"xylophonic"),
    (["FROM", "zabriskie"], b"zabriskie"),
    (["FROM", "frobozzco"], b"frobozzco"),
]
# accent-folded forms: not in the raw message at all
FOLDED = [b"eclairsplendide", b"munchenstrasse"]


def corpus():
    msgs = []
    for path in corpus_files("usrp-users-3000", limit=60, step=40):
        with open(path, "rb") as f:
            msgs.append(f.read())
    return msgs


def long_words(messages):
    """Lower-cased alphabetic words of 11+ letters from plain text lines
    of the messages: candidates for normalised index terms."""
    words = set()
    for msg in messages:
        body = msg.split(b"\r\n\r\n", 1)[-1].split(b"\n\n", 1)[-1]
        if b"base64" in msg.lower():
            continue
        for w in re.findall(rb"(?<![A-Za-z0-9=+/_-])[A-Za-z]{11,24}"
                            rb"(?![A-Za-z0-9=+/_-])", body):
            words.add(w.lower())
    return words


def casidx_segments(home):
    return [p for p in files_under(home)
            if "/casidx/" in p and p.endswith(".cxs")]


def uid_search(imap, criteria):
    typ, data = imap.uid("SEARCH", *criteria)
    if typ != "OK":
        raise AssertionError("SEARCH %r: %s %r" % (criteria, typ, data))
    return [int(x) for x in data[0].split()]


class FtsEncryptTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.messages = corpus() + [MARKER]
        cls.marker_uid = len(cls.messages)

    def index_and_search(self, dc):
        dc.lmtp_deliver_many(USER, self.messages)
        dc.doveadm("index", "-u", USER, "INBOX")
        # answered by the index itself, not by Dovecot's fallback (the
        # subject: the body has folded words, "Éclair", so a body word
        # is only maybe)
        r = dc.doveadm("fts", "lookup", "-u", USER, "mailbox", "INBOX",
                       "subject", "zanzibarquokka")
        self.assertIn("INBOX: %d" % self.marker_uid, r.stdout)
        self.assertNotIn("maybe", r.stdout)
        imap = dc.imap_login(USER)
        imap.select("INBOX")
        for criteria, _ in MARKER_TERMS:
            self.assertEqual(uid_search(imap, criteria), [self.marker_uid],
                             criteria)
        # the index stores the folded form, but only as maybe (issue
        # 17): IMAP's substring search, Dovecot's own included, does not
        # find "munchenstrasse" in "Münchenstraße", while the exact
        # spelling is found
        self.assertEqual(uid_search(imap, ["BODY", "munchenstrasse"]), [])
        imap.literal = "Münchenstraße".encode("utf-8")
        typ, data = imap.uid("SEARCH", "CHARSET", "UTF-8", "BODY")
        self.assertEqual([int(x) for x in data[0].split()],
                         [self.marker_uid])
        self.assertGreater(len(uid_search(imap, ["BODY", "usrp"])), 10)
        imap.logout()

    def test_plaintext_control_then_sealed(self):
        raw = {c[-1].encode() for c, _ in MARKER_TERMS}
        raw |= {b"Plumbiferous", b"Zanzibarquokka", b"Xylophonic"}
        terms = {t for _, t in MARKER_TERMS} | set(FOLDED)
        candidates = long_words(self.messages[:-1])
        self.assertGreater(len(candidates), 50)

        # control: sdbox + casidx, no casbox key -> plaintext segments
        with Dovecot(mail_location="sdbox:~/sdbox",
                     mail_plugins=["fts", "fts_casidx"],
                     plugin_settings=FTS) as dc:
            self.index_and_search(dc)
            segs = casidx_segments(dc.home(USER))
            self.assertTrue(segs)
            for p in segs:
                with open(p, "rb") as f:
                    self.assertEqual(f.read(8), b"CXSEG001", p)
            # dictionary blocks are front-coded, so a term shares its
            # prefix with the one before it: only some terms are stored
            # verbatim (those starting a block or after an unrelated
            # one), enough to show the grep would catch a plaintext index
            idx_dir = os.path.dirname(segs[0])
            self.assertGreaterEqual(
                len({n for _, n in found_in(idx_dir, terms)}), 3)
            corpus_terms = {n for _, n in found_in(idx_dir, candidates)}
        self.assertGreater(len(corpus_terms), 20)

        # casbox + casidx: sealed segments, nothing readable anywhere;
        # the key file as "~/", which both plugins must expand alike
        settings = dict(FTS, **KEYS)
        settings["casbox_key_file"] = "~/casbox.key"
        with Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=["casbox", "fts", "fts_casidx"],
                     plugin_settings=settings, mail_debug=True) as dc:
            self.index_and_search(dc)
            # what test_key_password counts: a key load is logged
            self.assertIsNotNone(dc.wait_log(
                r"fts-casidx: Loaded the index key from .* "
                r"\(server mode\)"))
            # more segments and a merge, then optimize: all sealed
            dc.lmtp_deliver_many(USER, self.messages[:5])
            dc.doveadm("index", "-u", USER, "INBOX")
            dc.doveadm("fts", "optimize", "-u", USER)
            home = dc.home(USER)
            segs = casidx_segments(home)
            self.assertTrue(segs)
            for p in segs:
                with open(p, "rb") as f:
                    self.assertEqual(f.read(8), b"CXSEGENC", p)
            needles = raw | terms | candidates
            self.assertEqual(sorted(found_in(home, needles)), [])
            # the index still answers after the merge
            r = dc.doveadm("fts", "lookup", "-u", USER, "mailbox", "INBOX",
                           "subject", "zanzibarquokka")
            self.assertIn("INBOX: %d" % self.marker_uid, r.stdout)

    def test_tampered_sealed_segment_is_rebuilt(self):
        """One flipped byte in a sealed segment fails authentication
        before anything is parsed; the index is dropped and rebuilt
        and SEARCH still answers right."""
        settings = dict(FTS, **KEYS)
        with Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=["casbox", "fts", "fts_casidx"],
                     plugin_settings=settings) as dc:
            dc.allow_log(r"fts-casidx: .*seg-[0-9a-f]+\.cxs: sealed file: "
                         r"authentication failed .* - rebuilding the index")
            dc.lmtp_deliver_many(USER, self.messages)
            dc.doveadm("index", "-u", USER, "INBOX")
            [seg] = casidx_segments(dc.home(USER))
            with open(seg, "r+b") as f:
                f.seek(os.path.getsize(seg) // 2)
                b = f.read(1)
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([b[0] ^ 0x01]))
            imap = dc.imap_login(USER)
            imap.select("INBOX")
            self.assertEqual(uid_search(imap, ["BODY", "plumbiferous"]),
                             [self.marker_uid])
            imap.logout()
            self.assertIsNotNone(dc.wait_log(r"authentication failed"))
            dc.doveadm("index", "-u", USER, "INBOX")
            r = dc.doveadm("fts", "lookup", "-u", USER, "mailbox", "INBOX",
                           "from", "zabriskie")
            self.assertIn("INBOX: %d" % self.marker_uid, r.stdout)
            for p in casidx_segments(dc.home(USER)):
                with open(p, "rb") as f:
                    self.assertEqual(f.read(8), b"CXSEGENC", p)

    def test_missing_key_fails_fts(self):
        """casbox_key_file set but absent (the FTS plugin never creates
        keys): indexing fails with a clear error, no segment written."""
        settings = dict(FTS, casbox_key_file="%h/missing.key")
        with Dovecot(mail_location="sdbox:~/sdbox",
                     mail_plugins=["fts", "fts_casidx"],
                     plugin_settings=settings) as dc:
            dc.allow_log(r"fts-casidx: casbox_key_file .*missing\.key "
                         r"does not exist")
            dc.lmtp_deliver_many(USER, [MARKER])
            r = dc.doveadm("index", "-u", USER, "INBOX", check=False)
            self.assertNotEqual(r.returncode, 0)
            self.assertRegex(r.stderr + dc.log_text(),
                             r"fts-casidx: casbox_key_file \S+missing\.key "
                             r"does not exist")
            self.assertEqual(casidx_segments(dc.home(USER)), [])

    def test_encrypt_yes_without_key_is_an_error(self):
        settings = dict(FTS, fts_casidx_encrypt="yes")
        with Dovecot(mail_location="sdbox:~/sdbox",
                     mail_plugins=["fts", "fts_casidx"],
                     plugin_settings=settings) as dc:
            dc.allow_log(r"Failed to initialize backend 'casidx': "
                         r"fts-casidx: fts_casidx_encrypt=yes, but "
                         r"casbox_key_file is not set")
            dc.lmtp_deliver_many(USER, [MARKER])
            # Dovecot's fts plugin disables FTS for the namespace when
            # the backend fails to initialise: it logs, nothing is
            # indexed (not even in plaintext)
            r = dc.doveadm("index", "-u", USER, "INBOX", check=False)
            self.assertIn("fts-casidx: fts_casidx_encrypt=yes, but "
                          "casbox_key_file "
                          "is not set", r.stderr + dc.log_text())
            self.assertEqual(casidx_segments(dc.home(USER)), [])


if __name__ == "__main__":
    unittest.main()
