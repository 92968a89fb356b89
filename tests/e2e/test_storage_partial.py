"""Partial fetches and BODYSTRUCTURE read only the chunks they need.

Message records carry BODYSTRUCTURE, BODY, ENVELOPE and the MIME part
tree sealed with the index key (casbox-meta.h), so BODYSTRUCTURE and
ENVELOPE decode no chunk and BODY[n]<o.l> / BINARY[n]<o.l> decode only
part n's chunks instead of parsing the whole message first. The evidence is the per-mail count of
decoded chunks that casbox logs with mail_debug (decoder statistic, not
timing). Every partial range of the mime-edge corpus must answer exactly
as sdbox does.

With mail_save_crlf = yes casbox stores CRLF line endings (as maildir
does; sdbox always stores LF), so physical size = virtual size and
Dovecot skips straight to the offset of BODY[]<o.l> and BODY[TEXT]<o.l>
instead of counting LFs from the start."""

import base64
import os
import random
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files, ok  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
CHUNK = 65536
DECODED_RE = re.compile(r"casbox: uid=(\d+): decoded (\d+) chunks")


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


def crlf_conf(crlf):
    return "mail_save_crlf = %s\n" % ("yes" if crlf else "no")


def raw_append(imap, msg, mailbox="INBOX"):
    """APPEND msg byte for byte: imaplib's append() turns every CR and
    LF into CRLF, which would hide what the storage does with them."""
    imap.literal = msg
    return ok(imap._simple_command("APPEND", mailbox))


def sizes(dc, user="user1", mailbox="INBOX"):
    """(physical, virtual) size of every mail, in UID order."""
    out = dc.doveadm("fetch", "-u", user, "size.physical size.virtual",
                     "mailbox", mailbox).stdout
    phys = [int(x) for x in re.findall(r"size\.physical: (\d+)", out)]
    virt = [int(x) for x in re.findall(r"size\.virtual: (\d+)", out)]
    return list(zip(phys, virt))


BINARY_SIZE_RE = re.compile(rb"BINARY\.SIZE\[[0-9.]*\] (\d+)")


def binary_sizes(answer):
    """(BINARY.SIZE, length of the BINARY[] literal) pairs of one
    (BINARY.SIZE[s] BINARY.PEEK[s]) answer."""
    typ, data = answer
    pairs = []
    for item in data:
        if not isinstance(item, tuple):
            continue
        m = BINARY_SIZE_RE.search(item[0])
        if m is not None:
            pairs.append((int(m.group(1)), len(item[1])))
    return pairs


def wrong_binary_sizes(answer):
    return [(size, sent) for size, sent in binary_sizes(answer)
            if size != sent]


def crlf_normalized(msg):
    """msg as imaplib's append() sends it: every CR and LF a CRLF."""
    return re.sub(rb"\r\n|\r|\n", b"\r\n", msg)


def corpus_messages(step=1):
    msgs = []
    for path in corpus_files("mime-edge", step=step):
        with open(path, "rb") as f:
            data = f.read()
        if data:
            msgs.append(data)
    return msgs


class DecodeCounter:
    """Chunks decoded per FETCH, from the mail_debug log lines casbox
    writes when a mail that opened its stream is closed."""

    def __init__(self, dc, imap):
        self.dc, self.imap = dc, imap

    # logged by the SELECT after the fetch, behind the decode line: the
    # log service writes one process's lines in order, so once this one
    # is in the file the fetch's decode line is too
    OPENED_RE = r"imap\(user1\).*: Mailbox INBOX: Mailbox opened"

    def fetch(self, uid, items):
        before = len(self.dc.log_lines())
        opened = self.dc.wait_log_count(self.OPENED_RE, 0)
        data = ok(self.imap.uid("FETCH", str(uid), items))
        # the mail is closed when the next command selects again
        ok(self.imap.select("INBOX"))
        if self.dc.wait_log_count(self.OPENED_RE, opened + 1) <= opened:
            raise AssertionError("SELECT after FETCH %s never logged"
                                 % items)
        lines = self.dc.log_lines()[before:]
        counts = [int(m.group(2)) for m in map(DECODED_RE.search, lines)
                  if m and int(m.group(1)) == uid]
        return data, sum(counts)


class PartialFetchTest(unittest.TestCase):

    def test_decodes_only_needed_chunks(self):
        msg, att, b64 = big_message(3 * 1024 * 1024)
        # the attachment is stored decoded (casbox_decode_base64): 57
        # bytes for each 78-byte line
        total_chunks = len(msg) * 57 // 78 // CHUNK
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
            # (LF-stored mail, mail_save_crlf = no): the chunks up to
            # the offset, never the rest, and no parse
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

    def test_crlf_stored_partials_skip_to_offset(self):
        """mail_save_crlf = yes stores CRLF, so physical size = virtual
        size and Dovecot skips straight to a partial's offset: only the
        chunks of the range are decoded, wherever it lies. The same
        fetches of the LF-stored mail are the control: they decode
        everything from the section start up to the offset."""
        msg, att, b64 = big_message(3 * 1024 * 1024)
        text = msg[msg.index(b"\r\n\r\n") + 4:]
        size = 1000
        fetches = [("BODY.PEEK[]<%d.%d>", msg, 3000000),
                   ("BODY.PEEK[TEXT]<%d.%d>", text, 2500000),
                   ("BODY.PEEK[2]<%d.%d>", b64, 2000000)]
        counts = {}
        for crlf in (True, False):
            with Dovecot(plugin_settings=KEYS, mail_debug=True,
                         extra_conf=crlf_conf(crlf)) as dc:
                imap = dc.imap_login("user1")
                ok(imap.append("INBOX", None, None, msg))
                ok(imap.select("INBOX"))
                (phys, virt), = sizes(dc)
                self.assertEqual(virt, len(msg))
                self.assertEqual(phys, len(msg) if crlf else
                                 len(msg) - msg.count(b"\r\n"))
                dec = DecodeCounter(dc, imap)
                data, full = dec.fetch(1, "BODY.PEEK[]")
                self.assertEqual(literals(data), [msg])
                for item, section, off in fetches:
                    data, n = dec.fetch(1, item % (off, size))
                    self.assertEqual(literals(data),
                                     [section[off:off + size]], item)
                    counts[crlf, item] = n
                imap.logout()
        for item, section, off in fetches:
            # LF-stored: at least the stored bytes before the offset
            # (the attachment stored decoded: 57 bytes a 77-byte line)
            lf_off = off - section[:off].count(b"\r\n")
            self.assertGreaterEqual(counts[False, item],
                                    lf_off * 57 // 77 // CHUNK, item)
            # CRLF-stored: the range's chunk(s), one more at most
            self.assertLessEqual(counts[True, item], 2, item)
            self.assertGreaterEqual(counts[True, item], 1, item)

    def test_partials_match_sdbox(self):
        """Every answer as sdbox gives it, for either mail_save_crlf
        (sdbox stores LF whatever it says), but one: BINARY.SIZE of an
        LF-stored part counts the decoded bytes without the CRs that
        BINARY[] then sends (Dovecot 2.3, sdbox and maildir alike).
        CRLF-stored, casbox answers as maildir with mail_save_crlf =
        yes, whose BINARY.SIZE is the length BINARY[] sends. Stored
        sizes as sdbox's (LF) or as that maildir's (CRLF)."""
        msgs = corpus_messages()
        msgs.append(big_message(300 * 1024)[0])
        self.assertGreater(len(msgs), 150)
        for crlf in (False, True):
            conf = crlf_conf(crlf)
            with Dovecot(mail_location="sdbox:~/sdbox", mail_plugins=[],
                         extra_conf=conf) as sd:
                want = self.fetch_partials(sd, msgs)
                want_sizes = sizes(sd)
            with Dovecot(plugin_settings=KEYS, extra_conf=conf) as dc:
                got = self.fetch_partials(dc, msgs)
                got_sizes = sizes(dc)
            self.assertEqual(len(got), len(want))
            self.assertEqual(len(got_sizes), len(msgs))
            if not crlf:
                for i, (g, w) in enumerate(zip(got, want)):
                    self.assertEqual(g, w, "answer %d differs from sdbox"
                                     % (i + 1))
                self.assertEqual(got_sizes, want_sizes)
                continue
            for i, (g, w) in enumerate(zip(got, want)):
                if g != w:
                    # only a BINARY.SIZE, now the length BINARY[] sends
                    self.assertNotEqual(wrong_binary_sizes(w), [],
                                        "answer %d differs from sdbox"
                                        % (i + 1))
            self.assertGreater(sum(len(binary_sizes(g)) for g in got),
                               len(msgs))
            self.assertEqual([wrong_binary_sizes(g) for g in got],
                             [[]] * len(got))
            with Dovecot(mail_location="maildir:~/Maildir", mail_plugins=[],
                         extra_conf=conf) as md:
                md_answers = self.fetch_partials(md, msgs)
                md_sizes = sizes(md)
            for i, (g, m) in enumerate(zip(got, md_answers)):
                self.assertEqual(g, m, "answer %d differs from maildir"
                                 % (i + 1))
            self.assertEqual(got_sizes, md_sizes)
            self.assertEqual([v for p, v in got_sizes],
                             [v for p, v in want_sizes])
            self.assertTrue(all(p == v for p, v in got_sizes))

    def test_mixed_line_endings(self):
        """Mails saved with mail_save_crlf = no, then the same mails
        with yes, then all copied: one mailbox of LF- and CRLF-stored
        mails. Each answers from its own record's sizes, exactly as
        sdbox answers for the same saves."""
        msgs = [crlf_normalized(m) for m in corpus_messages(step=6)]
        msgs.append(big_message(300 * 1024)[0])
        n = len(msgs)
        results = []
        for loc, plugins, keys in (("sdbox:~/sdbox", [], {}),
                                   ("casbox:~/casbox", None, KEYS)):
            with Dovecot(mail_location=loc, mail_plugins=plugins,
                         plugin_settings=keys,
                         extra_conf=crlf_conf(False)) as dc:
                imap = dc.imap_login("user1")
                for msg in msgs:
                    ok(imap.append("INBOX", None, None, msg))
                for msg in msgs:
                    dc.doveadm("-o", "mail_save_crlf=yes", "save", "-u",
                               "user1", input=msg, text=False)
                ok(imap.create("Copy"))
                ok(imap.select("INBOX"))
                ok(imap.uid("COPY", "1:*", "Copy"))
                answers = (self.fetch_answers(imap, msgs + msgs) +
                           self.fetch_answers(imap, msgs + msgs, "Copy"))
                imap.logout()
                results.append((answers, sizes(dc), sizes(dc, mailbox="Copy")))
        (want, sd_sizes, _), (got, got_sizes, copy_sizes) = results
        self.assertEqual(len(got), len(want))
        for i, (g, w) in enumerate(zip(got, want)):
            self.assertEqual(g, w, "answer %d differs from sdbox" % (i + 1))
        self.assertEqual(len(got_sizes), 2 * n)
        self.assertEqual(copy_sizes, got_sizes)
        # saved LF: as sdbox; saved CRLF: physical = virtual = sdbox's
        self.assertEqual(got_sizes[:n], sd_sizes[:n])
        self.assertEqual(got_sizes[n:], [(v, v) for p, v in sd_sizes[n:]])
        self.assertEqual(sd_sizes[:n], sd_sizes[n:])
        self.assertGreater(sum(v - p for p, v in got_sizes[:n]), 0)

    # Line ends no client normally sends (imaplib's append would turn
    # each CR and LF into CRLF): stored with mail_save_crlf = yes, a CR
    # before CRLF is kept, as maildir keeps it; LF-stored (sdbox too)
    # it is lost.
    RAW = [b"From: a@example.com\r\nSubject: cr cr lf\r\n\r\n"
           b"one\r\r\ntwo\r\r\r\nthree\r\n",
           b"From: a@example.com\r\nSubject: bare cr\r\n\r\n"
           b"one\rtwo\r\nthree\rfour\n",
           b"From: a@example.com\nSubject: lf only\n\none\ntwo\n",
           b"From: a@example.com\r\nSubject: mixed\n\r\none\ntwo\r\nend",
           b"From: a@example.com\r\nSubject: cr at end\r\n\r\none\r",
           b"From: a@example.com\r\nSubject: parts\r\nMIME-Version: 1.0"
           b"\r\nContent-Type: multipart/mixed; boundary=B\n\n--B\r\n"
           b"Content-Type: text/plain\r\r\n\r\none\r\r\n--B\n"
           b"Content-Type: text/plain\n\ntwo\r\n\r\n--B--\r\n"]

    def test_raw_line_endings_match_maildir(self):
        for crlf in (False, True):
            refs = [("maildir:~/Maildir", [], {})]
            if not crlf:
                refs.append(("sdbox:~/sdbox", [], {}))
            results = []
            for loc, plugins, keys in refs + [("casbox:~/casbox", None,
                                               KEYS)]:
                with Dovecot(mail_location=loc, mail_plugins=plugins,
                             plugin_settings=keys,
                             extra_conf=crlf_conf(crlf)) as dc:
                    imap = dc.imap_login("user1")
                    for msg in self.RAW:
                        raw_append(imap, msg)
                    answers = self.fetch_answers(imap, self.RAW)
                    imap.logout()
                    results.append((loc, answers, sizes(dc)))
            got = results.pop()
            for loc, answers, ref_sizes in results:
                self.assertEqual(got[1], answers, "mail_save_crlf=%s: "
                                 "differs from %s" % (crlf, loc))
                self.assertEqual(got[2], ref_sizes, "mail_save_crlf=%s: "
                                 "sizes differ from %s" % (crlf, loc))

    SECTIONS = ["", "TEXT", "HEADER", "1", "2", "1.1", "2.MIME", "3"]

    def fetch_partials(self, dc, msgs):
        imap = dc.imap_login("user1")
        for msg in msgs:
            ok(imap.append("INBOX", None, None, msg))
        answers = self.fetch_answers(imap, msgs)
        imap.logout()
        return answers

    def fetch_answers(self, imap, msgs, mailbox="INBOX"):
        ok(imap.select(mailbox))
        answers = []
        for uid, msg in enumerate(msgs, 1):
            size = len(msg)
            ranges = sorted({0, 1, size // 3, size // 2, size - 1, size,
                             size + 10})
            items = ["RFC822.SIZE", "ENVELOPE", "BODYSTRUCTURE", "BODY"]
            items += ["BODY.PEEK[%s]<%d.%d>" % (sec, off, ln)
                      for sec in self.SECTIONS for off in ranges
                      for ln in (1, 77, CHUNK + 5)]
            answers.append(untimed(imap.uid("FETCH", str(uid),
                                            "(%s)" % " ".join(items))))
            for sec in ("", "1", "2", "1.1"):
                answers.append(untimed(imap.uid(
                    "FETCH", str(uid),
                    "(BINARY.SIZE[%s] BINARY.PEEK[%s])" % (sec, sec))))
                for off in (0, size // 4, size // 2):
                    answers.append(untimed(imap.uid(
                        "FETCH", str(uid),
                        "BINARY.PEEK[%s]<%d.%d>" % (sec, off, 1000))))
        return answers


if __name__ == "__main__":
    unittest.main()
