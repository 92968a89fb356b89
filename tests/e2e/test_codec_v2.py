"""Codec v2 through a real Dovecot (doc/casbox-format.md, "Frame version
2"; doc/settings.md): casbox_cipher picks the chunk cipher of new frames
and frames of both ciphers stay readable whatever it says later;
casbox_dedup = no writes a part the user already has again (a disk
watcher sees a full frame appended, as for new bytes), every message
still FETCHes byte-exact, gc then reclaims the replaced frame, and scrub
stays clean; doveadm casbox dict train learns from header blocks only,
so body text of the user's mail does not make a chosen later message
compress better."""

import base64
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, is_dovecot24, ok  # noqa: E402
from casbox_packs import frame_bytes  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
CONF = "lmtp_add_received_header = no\n"
CIPHER_ID = {"xchacha20-poly1305": 1, "aes-256-gcm": 2}


def cpu_has_aesni():
    """What libsodium's crypto_aead_aes256gcm_is_available() needs."""
    with open("/proc/cpuinfo") as f:
        flags = next((ln.split(":", 1)[1].split() for ln in f
                      if ln.startswith("flags")), [])
    return "aes" in flags and "pclmulqdq" in flags


def blob_frames(root):
    """[(version, cipher, frame_size)] of every blob frame in the packs."""
    return [(head[4], head[5], size)
            for _, _, magic, size, head in frame_bytes(root, 6)
            if magic == b"CBFR"]


def packs_bytes(root):
    packs = os.path.join(root, "packs")
    return sum(os.path.getsize(os.path.join(packs, n))
               for n in os.listdir(packs) if n.startswith("pack-"))


def message(subject, text, attachment):
    return (b"From: a@example.com\r\nSubject: " + subject +
            b"\r\nMIME-Version: 1.0\r\n"
            b"Content-Type: multipart/mixed; boundary=XyZ\r\n\r\n"
            b"--XyZ\r\nContent-Type: text/plain\r\n\r\n" + text +
            b"\r\n--XyZ\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Transfer-Encoding: base64\r\n\r\n" + attachment +
            b"\r\n--XyZ--\r\n")


def save_with(dc, message, **settings):
    """doveadm save one message with casbox settings overridden for
    that one run (2.3: plugin/<name>, 2.4: the setting's own name)."""
    argv = []
    for name, value in settings.items():
        key = name if is_dovecot24() else "plugin/" + name
        argv += ["-o", "%s=%s" % (key, value)]
    dc.doveadm(*argv, "save", "-u", "user1", "-m", "INBOX", input=message,
               text=False)


def assert_bodies(test, got, sent):
    """LMTP adds Return-Path and Delivered-To: each body ends with what
    was sent (compared by length and ends, not by difflib on 160 KB)."""
    test.assertEqual(len(got), len(sent))
    for g, m in zip(got, sent):
        test.assertTrue(g.endswith(m), "body differs (%d vs %d bytes)"
                        % (len(g), len(m)))
        test.assertLess(len(g) - len(m), 512)


def fetch_all(dc):
    imap = dc.imap_login("user1")
    ok(imap.select("INBOX"))
    data = ok(imap.uid("FETCH", "1:*", "(UID BODY.PEEK[])"))
    imap.logout()
    return [item[1] for item in data if isinstance(item, tuple)]


def doveadm_row(dc, *args):
    res = dc.doveadm("-f", "tab", "casbox", *args)
    lines = res.stdout.strip().split("\n")
    return dict(zip(lines[0].split("\t"), lines[1].split("\t")))


class CodecV2Test(unittest.TestCase):

    def test_cipher_setting_and_mixed_frames(self):
        ciphers = ["xchacha20-poly1305"]
        if cpu_has_aesni():
            ciphers.append("aes-256-gcm")
        else:
            print("\nno AES-NI here: only xchacha20-poly1305 frames "
                  "written", file=sys.stderr)
        msgs = []
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            root = os.path.join(dc.home("user1"), "casbox")
            for i, cipher in enumerate(ciphers + ["auto"]):
                m = message(b"cipher %d" % i, b"text %d" % i,
                            base64.encodebytes(os.urandom(90000 + i))
                            .replace(b"\n", b"\r\n"))
                # one sender for all: without this the later leads are
                # delta frames (version 3, test_storage_xmsg's subject)
                save_with(dc, m, casbox_cipher=cipher,
                          casbox_cross_message="no")
                msgs.append(m)
                frames = blob_frames(root)
                want = CIPHER_ID.get(cipher, 2 if cpu_has_aesni() else 1)
                # this delivery's frames (the attachment, the rest)
                self.assertEqual({c for _, c, _ in frames[-2:]}, {want})
                self.assertEqual({v for v, _, _ in frames}, {2})
            # every message, of every cipher, with the last setting
            got = fetch_all(dc)
            self.assertEqual(len(got), len(msgs))
            self.assertTrue(got == msgs, "a message came back changed")
            res = dc.doveadm("casbox", "scrub", "-u", "user1", check=False)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)

    def test_dedup_no_writes_again(self):
        rnd = os.urandom(120 * 1024)
        att = base64.encodebytes(rnd).replace(b"\n", b"\r\n")
        m1 = message(b"first", b"one", att)
        m2 = message(b"second", b"two", att)
        settings = dict(KEYS, casbox_dedup="no")
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=settings, extra_conf=CONF) as dc:
            root = os.path.join(dc.home("user1"), "casbox")
            dc.lmtp_deliver("user1", m1)
            first = packs_bytes(root)
            frames1 = len(blob_frames(root))
            dc.lmtp_deliver("user1", m2)
            growth = packs_bytes(root) - first
            # the shared attachment was written again: the random bytes
            # (incompressible) once more, not just the second text
            self.assertGreater(growth, len(rnd))
            self.assertEqual(len(blob_frames(root)), 2 * frames1)
            assert_bodies(self, fetch_all(dc), [m1, m2])
            stats = doveadm_row(dc, "stats", "-u", "user1")
            # blob ids: each message's head, and the attachment and the
            # closing boundary, shared (each referenced twice)
            self.assertEqual(int(stats["unique_blobs"]), 4)
            # the replaced frame is dead: gc drops it, both still read
            gc = doveadm_row(dc, "gc", "-u", "user1", "--all")
            self.assertGreater(int(gc["bytes_reclaimed"]), len(rnd))
            assert_bodies(self, fetch_all(dc), [m1, m2])
            self.assertLess(packs_bytes(root), first + growth - len(rnd))
            res = dc.doveadm("casbox", "scrub", "-u", "user1", check=False)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)


    def test_dictionary_learns_no_bodies(self):
        # every training mail carries the same body text B, headers vary;
        # a dictionary trained on whole blobs would hold B, and a new
        # message with body B would then compress to almost nothing
        alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789"

        def text(n):
            return bytes(alphabet[b % 36] for b in os.urandom(n))

        def small(i, body):
            return (b"From: sender%d@example.org\r\nTo: user1@example.com"
                    b"\r\nSubject: note %d %s\r\nMessage-ID: <%d.%s@x>\r\n"
                    b"\r\n" % (i, i, text(20), i, text(12))) + body

        shared = b"\r\n".join(text(70) for _ in range(30)) + b"\r\n"
        other = b"\r\n".join(text(70) for _ in range(30)) + b"\r\n"
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            root = os.path.join(dc.home("user1"), "casbox")
            dc.lmtp_deliver_many("user1",
                                 [small(i, shared) for i in range(60)])
            dc.doveadm("casbox", "dict", "train", "-u", "user1")
            dc.lmtp_deliver("user1", small(100, shared))
            probe = blob_frames(root)[-1][2]
            dc.lmtp_deliver("user1", small(101, other))
            control = blob_frames(root)[-1][2]
            # random text: about 6 bits per byte without B in the
            # dictionary, far less with it
            self.assertGreater(probe, len(shared) * 0.6)
            self.assertLess(abs(probe - control), 300)


if __name__ == "__main__":
    unittest.main()
