"""A flipped bit in a pack fails only the message whose blob it hits,
with a logged error naming the damage; the other messages stay
readable, and the damaged one never returns garbage."""

import imaplib
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}


def msg(n):
    # a sender each: no message is a delta of another (cross-message
    # compression; a damaged base fails its dependents too, which
    # tests/e2e/test_storage_xmsg.py checks)
    return (b"From: a%d@example.com\r\nSubject: message %d\r\n\r\n" % (n, n) +
            b"".join(b"line %d of message %d\r\n" % (i, n)
                     for i in range(200)))


def pack_files(root):
    out = {}
    for dirpath, _, files in os.walk(os.path.join(root, "packs")):
        for name in files:
            path = os.path.join(dirpath, name)
            out[path] = os.path.getsize(path)
    return out


def first_frame_middle(path, start):
    """Offset of the middle of the blob frame at start: a delivery
    appends its blob frames, then its recovery record (a meta frame,
    doc/casbox-format.md), so the middle of what it wrote may be the
    record."""
    with open(path, "rb") as f:
        f.seek(start)
        hdr = f.read(12)
    assert hdr[:4] == b"CBFR", hdr
    return start + int.from_bytes(hdr[8:12], "little") // 2


def fetch_body(dc, uid):
    """BODY[] of uid, or None if the server refused or hung up."""
    imap = dc.imap_login("user1")
    try:
        imap.select("INBOX")
        typ, data = imap.uid("FETCH", str(uid), "(BODY.PEEK[])")
        if typ != "OK" or not isinstance(data[0], tuple):
            return None
        imap.logout()
        return data[0][1]
    except imaplib.IMAP4.abort:
        return None


class StorageCorruptTest(unittest.TestCase):

    def test_flipped_bit_fails_one_message(self):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            root = os.path.join(dc.home("user1"), "casbox")
            dc.lmtp_deliver("user1", msg(1))
            before = pack_files(root)
            dc.lmtp_deliver("user1", msg(2))
            after = pack_files(root)
            dc.lmtp_deliver("user1", msg(3))
            grown = [p for p in after if after[p] != before.get(p, 0)]
            self.assertEqual(len(grown), 1)
            path = grown[0]
            start, end = before.get(path, 0), after[path]
            self.assertGreater(end - start, 64)
            mid = first_frame_middle(path, start)
            with open(path, "r+b") as f:
                f.seek(mid)
                b = f.read(1)
                f.seek(mid)
                f.write(bytes([b[0] ^ 0x10]))

            dc.allow_log(r"casbox|%s" % re.escape(os.path.basename(path)))
            dc.allow_log(r"FETCH .* failed")
            self.assertTrue(fetch_body(dc, 1).endswith(msg(1)[-40:]))
            self.assertTrue(fetch_body(dc, 3).endswith(msg(3)[-40:]))
            self.assertIsNone(fetch_body(dc, 2))
            self.assertIsNotNone(
                dc.wait_log(r": Error: .*(uid|UID)=2\b"),
                [ln for ln in dc.log_lines() if ": Error: " in ln])


if __name__ == "__main__":
    unittest.main()
