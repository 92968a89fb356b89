"""A few hundred real messages saved into casbox (LMTP and APPEND) read
back byte-exact, and every FETCH answer (RFC822.SIZE, INTERNALDATE,
BODYSTRUCTURE, BODY[]) identical to an sdbox instance given the same
messages, before and after Dovecot's cache is thrown away."""

import glob
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files, ok, load, crlf  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
# LMTP's Received header carries a session id and time: leave it out so
# both instances get identical bytes
CONF = "lmtp_add_received_header = no\n"
DATE = '"14-Nov-2023 22:13:20 +0100"'
ITEMS = "(RFC822.SIZE INTERNALDATE BODYSTRUCTURE BODY.PEEK[])"


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

        with Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=["casbox"], plugin_settings=KEYS,
                     extra_conf=CONF) as dc:
            imap = fill(dc, lmtp_msgs, append_msgs)
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

            # without the cache, everything is parsed from the blobs
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
