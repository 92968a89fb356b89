"""Base64 leaf bodies stored decoded (doc/casbox-storage.md, "Part
transforms"): a body that re-encodes exactly is stored decoded, so the
same attachment wrapped another way (72 or 64 columns, LF, no final line
end) adds no blob, while every odd form (trailing spaces, bad padding, non-canonical bits, foreign characters, unequal
lines, a blank last line) is stored as it is; either way every read is
byte-exact: BODY[], partial BODY[]<o.n>, BINARY[], RFC822.SIZE and
BODYSTRUCTURE (against sdbox), after rebuild --from-packs and of COPYs
too. Then
every message of the whole shared corpus with a base64 leaf of at least
64 KiB (the split size) goes in by APPEND and comes back byte-exact."""

import base64
import os
import re
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_dir, crlf, ok  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
USER = "user1"
DATE = '"14-Nov-2023 22:13:20 +0100"'


def wrap(data, cols=76, eol=b"\r\n", final=True):
    enc = base64.b64encode(data)
    lines = [enc[i:i + cols] for i in range(0, len(enc), cols)]
    return eol.join(lines) + (eol if final else b"")


def message(name, body, eol=b"\r\n"):
    head = (b"From: a@example.com\nSubject: " + name +
            b"\nMIME-Version: 1.0\n"
            b"Content-Type: multipart/mixed; boundary=XyZ\n\n"
            b"--XyZ\nContent-Type: text/plain\n\nsee attached\n"
            b"--XyZ\nContent-Type: application/octet-stream\n"
            b"Content-Transfer-Encoding: base64\n\n")
    return head.replace(b"\n", eol) + body + eol + b"--XyZ--" + eol


def cases():
    """(name, data, encoded body, eol of the rest, stored decoded?)"""
    # 57 bytes a 76-column line: a short last line with "==" padding
    data = os.urandom(120 * 1024 + 1)
    full = os.urandom(57 * 2000)   # the last line exactly full
    c = wrap(data)
    lines = c.split(b"\r\n")
    out = [
        ("canonical", data, c, b"\r\n", True),
        ("full-last-line", full, wrap(full), b"\r\n", True),
        ("cols72-lf", data, wrap(data, 72, b"\n"), b"\n", True),
        ("cols64-no-final-eol", data, wrap(data, 64, final=False),
         b"\r\n", True),
        ("cols4", data, wrap(data, 4), b"\r\n", True),
        ("trailing-space", data,
         b"\r\n".join(lines[:5] + [lines[5] + b" "] + lines[6:]),
         b"\r\n", False),
        # casbox saves every line with one line end (LF, or CRLF with
        # mail_save_crlf): a mix never reaches the check, which refuses
        # it (check-b64); here it is stored decoded and read back
        ("crlf-lf-mix", data,
         b"\r\n".join(lines[:5]) + b"\n" + b"\r\n".join(lines[5:]),
         b"\r\n", True),
        ("bad-padding", data, c.replace(b"==\r\n", b"=\r\n"), b"\r\n",
         False),
        ("no-padding", data, c.replace(b"==\r\n", b"\r\n"), b"\r\n",
         False),
        # "==" leaves 4 low bits of the character before it unused: set
        ("noncanonical-bits", data,
         re.sub(rb"(.)==\r\n$",
                lambda m: bytes([b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijkl"
                                 b"mnopqrstuvwxyz0123456789+/"[
                                     (b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefgh"
                                      b"ijklmnopqrstuvwxyz0123456789+/"
                                      .index(m.group(1)) ^ 1)]]) +
                b"==\r\n", c), b"\r\n", False),
        ("foreign-char", data,
         b"\r\n".join(lines[:7] + [lines[7][:10] + b"*" + lines[7][11:]] +
                      lines[8:]), b"\r\n", False),
        ("unequal-lines", data,
         b"\r\n".join(lines[:3] + [lines[3][:72], lines[3][72:] +
                                   lines[4]] + lines[5:]),
         b"\r\n", False),
        ("blank-last-line", data, c + b"\r\n", b"\r\n", False),
        ("padding-inside", data,
         b"\r\n".join(lines[:2] + [lines[2][:72] + b"QQ=="] + lines[3:]),
         b"\r\n", False),
    ]
    return out


def save(dc, msg):
    """doveadm save: the bytes reach the storage as they are (IMAP
    APPEND and LMTP hand it CRLF lines)."""
    dc.doveadm("save", "-u", USER, "-m", "INBOX", input=msg, text=False)


def packs_size(root):
    total = 0
    for dirpath, _, files in os.walk(os.path.join(root, "packs")):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def literal(answer, item):
    for entry in answer:
        if isinstance(entry, tuple) and item in entry[0]:
            return entry[1]
    raise AssertionError("no %r in %r" % (item, answer[:1]))


def sizes(imap, uid, binary):
    """RFC822.SIZE, BODYSTRUCTURE and (valid base64 only: Dovecot fails
    the others) BINARY.SIZE[2] of uid."""
    typ, data = imap.uid("FETCH", str(uid),
                         "(RFC822.SIZE BODYSTRUCTURE%s)" %
                         (" BINARY.SIZE[2]" if binary else ""))
    assert typ == "OK", data
    raw = b"".join(b"".join(x) if isinstance(x, tuple) else x
                   for x in data)
    return raw[raw.index(b"("):]


class StorageB64Test(unittest.TestCase):

    def check_reads(self, imap, uid, msg, binary=None):
        want = crlf(msg)
        got = literal(ok(imap.uid("FETCH", str(uid), "(BODY.PEEK[])")),
                      b"BODY[]")
        self.assertEqual(got, want, "uid %d BODY[]" % uid)
        for off, n in ((0, 300), (len(want) // 3, 1000),
                       (len(want) // 2 + 77, 4096), (len(want) - 50, 100),
                       (len(want) - 1, 10)):
            got = literal(ok(imap.uid("FETCH", str(uid),
                                      "(BODY.PEEK[]<%d.%d>)" % (off, n))),
                          b"BODY[]<%d>" % off)
            self.assertEqual(got, want[off:off + n],
                             "uid %d BODY[]<%d.%d>" % (uid, off, n))
        if binary is not None:
            got = literal(ok(imap.uid("FETCH", str(uid),
                                      "(BINARY.PEEK[2])")), b"BINARY[2]")
            self.assertEqual(got, binary, "uid %d BINARY[2]" % uid)

    def test_forms(self):
        all_cases = cases()
        with Dovecot(mail_location="sdbox:~/sdbox", mail_plugins=[]) as sd:
            for name, data, body, eol, _ in all_cases:
                save(sd, message(name.encode(), body, eol))
            imap = sd.imap_login(USER)
            ok(imap.select("INBOX", readonly=True))
            want = [sizes(imap, i + 1, c[4]) for i, c in enumerate(all_cases)]
            imap.logout()

        with Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=["casbox"], plugin_settings=KEYS) as dc:
            root = os.path.join(dc.home(USER), "casbox")
            growth = {}
            for name, data, body, eol, _ in all_cases:
                before = packs_size(root) if os.path.isdir(
                    os.path.join(root, "packs")) else 0
                save(dc, message(name.encode(), body, eol))
                growth[name] = packs_size(root) - before
            imap = dc.imap_login(USER)
            ok(imap.select("INBOX", readonly=True))
            for i, (name, data, body, eol, decoded) in enumerate(all_cases):
                self.check_reads(imap, i + 1,
                                 message(name.encode(), body, eol),
                                 data if decoded else None)
                self.assertEqual(sizes(imap, i + 1, decoded), want[i],
                                 "%s: sizes differ from sdbox" % name)
            imap.logout()
            print("\npack growth per form: %r" % growth, file=sys.stderr)
            # the attachment is random: a stored copy costs > 120 KiB,
            # a deduplicated one only the message's own few hundred bytes
            # and its recovery record
            for name, data, body, eol, decoded in all_cases:
                if name in ("canonical", "full-last-line"):
                    self.assertGreater(growth[name], len(data), name)
                elif decoded:
                    self.assertLess(growth[name], 8 * 1024,
                                    "%s: not stored decoded" % name)
                else:
                    self.assertGreater(growth[name], len(data),
                                       "%s: not stored as it is" % name)

            # the recovery records carry the transforms
            shutil.rmtree(os.path.join(root, "lsm"))
            r = dc.doveadm("-f", "tab", "casbox", "rebuild",
                           "--from-packs", "-u", USER)
            self.assertIn("lost_messages", r.stdout)
            imap = dc.imap_login(USER)
            ok(imap.select("INBOX", readonly=True))
            for i, (name, data, body, eol, decoded) in enumerate(all_cases):
                self.check_reads(imap, i + 1,
                                 message(name.encode(), body, eol),
                                 data if decoded else None)
            # COPY shares the blobs and keeps the transforms
            ok(imap.create("Copy"))
            ok(imap.uid("COPY", "1:*", "Copy"))
            ok(imap.select("Copy", readonly=True))
            for i, (name, data, body, eol, decoded) in enumerate(all_cases):
                if i % 3 == 0:
                    self.check_reads(imap, i + 1,
                                     message(name.encode(), body, eol),
                                     data if decoded else None)
            imap.logout()
            dc.doveadm("casbox", "scrub", "-u", USER)

    def test_decode_off(self):
        data = os.urandom(100 * 1024)
        with Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=["casbox"],
                     plugin_settings=dict(KEYS,
                                          casbox_decode_base64="no")) as dc:
            root = os.path.join(dc.home(USER), "casbox")
            imap = dc.imap_login(USER)
            ok(imap.append("INBOX", None, DATE,
                           message(b"a", wrap(data))))
            before = packs_size(root)
            m2 = message(b"b", wrap(data, 72, b"\n"), b"\n")
            ok(imap.append("INBOX", None, DATE, m2))
            # stored as it is: the other wrapping is another blob
            self.assertGreater(packs_size(root) - before, len(data))
            ok(imap.select("INBOX", readonly=True))
            self.check_reads(imap, 2, m2, data)
            imap.logout()

    def test_corpus_base64_messages(self):
        msgs = []
        for dirpath, _, files in os.walk(corpus_dir()):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                if name.startswith(".") or os.path.getsize(path) < 65536:
                    continue
                with open(path, "rb") as f:
                    data = f.read()
                if re.search(rb"(?i)content-transfer-encoding:\s*base64",
                             data):
                    msgs.append(data)
        self.assertGreater(len(msgs), 150)
        with Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=["casbox"], plugin_settings=KEYS) as dc:
            root = os.path.join(dc.home(USER), "casbox")
            imap = dc.imap_login(USER)
            for msg in msgs:
                ok(imap.append("INBOX", None, DATE, msg))
            ok(imap.select("INBOX", readonly=True))
            for i, msg in enumerate(msgs):
                got = literal(ok(imap.uid("FETCH", str(i + 1),
                                          "(RFC822.SIZE BODY.PEEK[])")),
                              b"BODY[]")
                self.assertEqual(got, crlf(msg), "message %d" % (i + 1))
            imap.logout()
            raw = sum(len(m) for m in msgs)
            print("\n%d corpus messages with base64 leaves, %d bytes: "
                  "packs %d (%.3f)" % (len(msgs), raw, packs_size(root),
                                       packs_size(root) / raw),
                  file=sys.stderr)
            # the decoded path was taken: stored as delivered these
            # messages take 0.445 of their bytes, decoded 0.396
            # (doc/benchmarks.md)
            self.assertLess(packs_size(root) / raw, 0.42)


if __name__ == "__main__":
    unittest.main()
