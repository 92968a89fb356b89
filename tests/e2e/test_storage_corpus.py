"""A few hundred real messages saved into casbox (LMTP and APPEND) read
back byte-exact, and every FETCH answer (RFC822.SIZE, INTERNALDATE,
BODYSTRUCTURE, BODY, ENVELOPE, BODY[]) identical to an sdbox instance
given the same messages, before and after Dovecot's cache is thrown away
(then BODYSTRUCTURE and ENVELOPE come from casbox's sealed metadata and
BODY is derived from its BODYSTRUCTURE, or all are parsed from the
blobs for messages below casbox_metadata_min_size); with the default
and with metadata for every message."""

import glob
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (Dovecot, TOP_BUILDDIR, corpus_files,  # noqa: E402
                             ok, load, crlf)

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
# LMTP's Received header carries a session id and time: leave it out so
# both instances get identical bytes
CONF = "lmtp_add_received_header = no\n"
DATE = '"14-Nov-2023 22:13:20 +0100"'
ITEMS = "(RFC822.SIZE INTERNALDATE BODYSTRUCTURE BODY ENVELOPE BODY.PEEK[])"


def fill(dc, lmtp_msgs, append_msgs):
    dc.lmtp_deliver_many("user1", lmtp_msgs)
    imap = dc.imap_login("user1")
    ok(imap.create("Appended"))
    for msg in append_msgs:
        ok(imap.append("Appended", r"(\Seen)", DATE, msg))
    return imap


def fetch_all(imap, box):
    count = int(ok(imap.select(box, readonly=True))[0])
    answers = []
    for uid in range(1, count + 1):
        answers.append(ok(imap.uid("FETCH", str(uid), ITEMS)))
    return answers


def without_internaldate(answers):
    """LMTP deliveries get the delivery time as INTERNALDATE."""
    out = []
    for answer in answers:
        first = answer[0]
        if isinstance(first, tuple):
            first = (re.sub(rb'INTERNALDATE "[^"]*" ', b"", first[0]),
                     first[1])
        out.append([first] + list(answer[1:]))
    return out


def literal_body(answer):
    """The BODY[] literal: the last tuple whose prefix ends in BODY[]."""
    for entry in answer:
        if isinstance(entry, tuple) and re.search(rb"BODY\[\] \{\d+\}$",
                                                  entry[0]):
            return entry[1]
    raise AssertionError("no BODY[] in %r" % (answer[:1],))


class StorageCorpusTest(unittest.TestCase):

    def test_corpus_matches_sdbox(self):
        lmtp_msgs = load(corpus_files("usrp-users-3000", limit=200, step=15))
        # IMAP refuses zero-byte messages
        append_msgs = [m for m in load(corpus_files("mime-edge")) if m]
        self.assertEqual(len(lmtp_msgs), 200)
        self.assertGreater(len(append_msgs), 150)
        self.assertTrue(any(len(m) > 256 * 1024 for m in lmtp_msgs),
                        "need large attachments to exercise splitting")

        with Dovecot(mail_location="sdbox:~/sdbox", mail_plugins=[],
                     extra_conf=CONF) as sd:
            imap = fill(sd, lmtp_msgs, append_msgs)
            want_inbox = fetch_all(imap, "INBOX")
            want_app = fetch_all(imap, "Appended")
            imap.logout()

        # the default (sealed metadata for messages of 32 KiB and more),
        # and every message with it
        for min_size in (None, "0"):
            with self.subTest(casbox_metadata_min_size=min_size):
                self.check_casbox(lmtp_msgs, append_msgs, want_inbox,
                                  want_app, min_size)

    def check_meta_sizes(self, dc, min_size):
        """Sealed metadata exactly on the messages of min_size bytes and
        more (tests/storage-dump's m lines: size= and meta=)."""
        exe = os.path.join(TOP_BUILDDIR, "tests", "storage-dump")
        dump = subprocess.run([exe, os.path.join(dc.home("user1"),
                                                 "casbox")],
                              user=dc.uid, group=dc.gid,
                              capture_output=True, text=True)
        self.assertEqual(dump.returncode, 0, dump.stderr)
        sizes = re.findall(r"^m \S+ \d+ .*? size=(\d+) .*? meta=(\d+) ",
                           dump.stdout, re.M)
        self.assertGreater(len(sizes), 300)
        small = [int(m) for sz, m in sizes if int(sz) < min_size]
        large = [int(m) for sz, m in sizes if int(sz) >= min_size]
        self.assertTrue(large, "no message over %d bytes" % min_size)
        self.assertEqual([m for m in small if m != 0], [])
        self.assertEqual([m for m in large if m == 0], [])

    def check_casbox(self, lmtp_msgs, append_msgs, want_inbox, want_app,
                     min_size):
        settings = dict(KEYS)
        if min_size is not None:
            settings["casbox_metadata_min_size"] = min_size
        with Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=["casbox"], plugin_settings=settings,
                     extra_conf=CONF) as dc:
            imap = fill(dc, lmtp_msgs, append_msgs)
            self.check_meta_sizes(dc, 32 * 1024 if min_size is None
                                  else int(min_size))
            got_inbox = fetch_all(imap, "INBOX")
            got_app = fetch_all(imap, "Appended")
            imap.logout()

            self.assertEqual(len(got_inbox), len(lmtp_msgs))
            self.assertEqual(len(got_app), len(append_msgs))
            for i, msg in enumerate(lmtp_msgs):
                # LMTP rewrites Return-Path/Delivered-To only, and
                # smtplib ends a message not ending in CRLF with one:
                # the rest must come back as delivered
                body = literal_body(got_inbox[i]).rstrip(b"\r\n")
                tail = crlf(msg).rstrip(b"\r\n")
                tail = tail[tail.find(b"\r\n\r\n"):]
                self.assertTrue(body.endswith(tail),
                                "LMTP message %d differs" % (i + 1))
                self.assertEqual(without_internaldate(got_inbox[i:i + 1]),
                                 without_internaldate(want_inbox[i:i + 1]),
                                 "INBOX uid %d differs from sdbox" % (i + 1))
            for i, msg in enumerate(append_msgs):
                self.assertEqual(literal_body(got_app[i]), crlf(msg),
                                 "APPEND message %d differs" % (i + 1))
                self.assertEqual(got_app[i], want_app[i],
                                 "Appended uid %d differs from sdbox"
                                 % (i + 1))

            # without the cache: the sealed metadata, else the blobs
            for path in glob.glob(os.path.join(
                    dc.home("user1"), "casbox", "mailboxes", "*",
                    "casbox-Mails", "dovecot.index.cache")):
                os.unlink(path)
            imap = dc.imap_login("user1")
            self.assertEqual(without_internaldate(fetch_all(imap, "INBOX")),
                             without_internaldate(want_inbox))
            self.assertEqual(fetch_all(imap, "Appended"), want_app)
            imap.logout()

            r = dc.doveadm("fetch", "-u", "user1", "date.received",
                           "mailbox", "Appended", "all")
            self.assertEqual(len(re.findall(r"date.received: 2023-11-14",
                                            r.stdout)), len(append_msgs))


if __name__ == "__main__":
    unittest.main()
