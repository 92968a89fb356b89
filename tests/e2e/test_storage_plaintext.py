"""No bytes a user wrote reach the casbox root in plaintext: after
delivering corpus messages plus one with distinctive markers, no file
under the root (packs, LSM, Dovecot's index and cache) contains a
subject, a body line or the markers. As a control, the same search over
an sdbox root finds them."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (Dovecot, corpus_files,  # noqa: E402
                             distinctive_strings, found_in)

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
MARKER_SUBJECT = b"Zanzibar quokka telemetry 7731"
MARKER_BODY = b"the-plaintext-canary-QX9Z-body-line"
MARKER_MSG = (b"From: a@example.com\r\nSubject: " + MARKER_SUBJECT +
              b"\r\n\r\n" + MARKER_BODY + b"\r\n")


def needles(messages):
    """Subjects and the longest plain text line of each message."""
    return {MARKER_SUBJECT, MARKER_BODY} | distinctive_strings(messages)


class StoragePlaintextTest(unittest.TestCase):

    def test_no_plaintext_on_disk(self):
        msgs = []
        for path in corpus_files("usrp-users-3000", limit=40, step=70):
            with open(path, "rb") as f:
                msgs.append(f.read())
        strings = needles(msgs)
        self.assertGreater(len(strings), 40)

        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            dc.lmtp_deliver_many("user1", msgs + [MARKER_MSG])
            imap = dc.imap_login("user1")
            imap.select("INBOX")
            # make Dovecot want to cache headers and BODYSTRUCTUREs
            typ, _ = imap.fetch("1:*", "(ENVELOPE BODYSTRUCTURE "
                                "BODY.PEEK[HEADER.FIELDS (SUBJECT)])")
            self.assertEqual(typ, "OK")
            typ, data = imap.search(None, "SUBJECT", '"quokka telemetry"')
            self.assertEqual(data[0], b"%d" % (len(msgs) + 1))
            imap.close()
            imap.logout()
            root = os.path.join(dc.home("user1"), "casbox")
            self.assertTrue(os.path.isdir(os.path.join(root, "packs")))
            self.assertEqual(found_in(root, strings), [])

        # control: the same search does find the strings in sdbox
        with Dovecot(mail_location="sdbox:~/sdbox", mail_plugins=[]) as sd:
            sd.lmtp_deliver_many("user1", msgs + [MARKER_MSG])
            hits = found_in(os.path.join(sd.home("user1"), "sdbox"),
                            strings)
            self.assertGreater(len({s for _, s in hits}),
                               len(strings) // 2)


if __name__ == "__main__":
    unittest.main()
