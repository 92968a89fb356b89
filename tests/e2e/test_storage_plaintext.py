"""No bytes a user wrote reach the casbox root in plaintext: after
delivering corpus messages plus one with distinctive markers, no file
under the root (packs, LSM, Dovecot's index and cache) contains a
subject, a body line or the markers. As a control, the same search over
an sdbox root finds them."""

import os
import socket
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (PASSWORD, Dovecot, corpus_files,  # noqa: E402
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


class SaveSpoolTest(unittest.TestCase):

    def test_big_save_spools_encrypted(self):
        """A save holds the message until its transaction commits; what
        does not fit in memory (8 MiB per transaction) goes to an
        unlinked file in mail_temp_dir, which must not hold plaintext.
        MULTIAPPEND with a synchronising literal for the second message
        stops the client while the first one sits in the spool: the
        imap process's open files under mail_temp_dir are read through
        /proc, then the append completes and the message reads back."""
        line = b"Wombatquill spool canary line %07d of the big message\r\n"
        body = b"".join(line % i for i in range(200000))  # 11.2 MB
        big = (b"From: a@example.com\r\nSubject: big spool test\r\n\r\n" +
               body)
        small = b"Subject: second\r\n\r\nsmall\r\n"
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS,
                     extra_conf="mail_temp_dir = %h/mailtmp\n") as dc:
            home = dc.home("user1")
            tmpdir = os.path.join(home, "mailtmp")
            for d in (home, tmpdir):
                os.makedirs(d, 0o700, exist_ok=True)
                os.chown(d, dc.uid, dc.gid)

            with socket.create_connection(("127.0.0.1", dc.imap_port)) as s:
                f = s.makefile("rwb")
                f.readline()
                f.write(b"a LOGIN user1 %s\r\n" % PASSWORD.encode())
                f.flush()
                self.assertTrue(f.readline().startswith(b"a OK"))
                f.write(b"b APPEND INBOX {%d+}\r\n" % len(big) + big +
                        b" {%d}\r\n" % len(small))
                f.flush()
                # the continuation comes once the big one is saved
                self.assertTrue(f.readline().startswith(b"+ "))
                spooled = []
                for pid in dc.pids("imap"):
                    fd_dir = "/proc/%d/fd" % pid
                    for fd in os.listdir(fd_dir):
                        try:
                            target = os.readlink(os.path.join(fd_dir, fd))
                        except OSError:
                            continue
                        if target.startswith(tmpdir):
                            with open(os.path.join(fd_dir, fd), "rb") as t:
                                spooled.append((target, t.read()))
                self.assertEqual(len(spooled), 1, spooled)
                target, data = spooled[0]
                self.assertTrue(target.endswith(" (deleted)"), target)
                # what did not fit in memory, none of it readable
                self.assertGreater(len(data), len(big) - 9 * 1024 * 1024)
                self.assertNotIn(b"Wombatquill", data)
                self.assertNotIn(b"canary line", data)
                self.assertEqual(os.listdir(tmpdir), [])
                f.write(small + b"\r\n")
                f.flush()
                self.assertTrue(f.readline().startswith(b"b OK"))
                f.write(b"c LOGOUT\r\n")
                f.flush()

            imap = dc.imap_login("user1")
            imap.select("INBOX")
            typ, data = imap.uid("FETCH", "1:2", "(BODY.PEEK[])")
            self.assertEqual(typ, "OK")
            bodies = [bytes(d[1]) for d in data if isinstance(d, tuple)]
            self.assertEqual(bodies, [big, small])
            imap.logout()
            self.assertEqual(os.listdir(tmpdir), [])


if __name__ == "__main__":
    unittest.main()
