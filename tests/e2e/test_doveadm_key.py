"""doveadm casbox key init|destroy: init creates the key only for an
empty store and never over an existing key; destroy needs the explicit
flag and makes the store's mail unreadable (crypto-shredding)."""

import imaplib
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot  # noqa: E402

MSG = b"From: a@example.com\r\nSubject: key\r\n\r\nsecret body\r\n"


def fetch1(dc, user):
    """BODY[] of message 1, or None if the server refused or hung up."""
    imap = dc.imap_login(user)
    try:
        typ, _ = imap.select("INBOX")
        if typ != "OK":
            return None
        typ, data = imap.fetch("1", "(BODY.PEEK[])")
        if typ != "OK" or not isinstance(data[0], tuple):
            return None
        return data[0][1]
    except imaplib.IMAP4.abort:
        return None
    finally:
        try:
            imap.logout()
        except Exception:
            pass


class DoveadmKeyTest(unittest.TestCase):

    def test_init_then_refuse(self):
        keys = {"casbox_key_file": "%h/keys/casbox.key",
                "casbox_key_autocreate": "no"}
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=keys) as dc:
            key = os.path.join(dc.home("user1"), "keys", "casbox.key")
            res = dc.doveadm("-f", "tab", "casbox", "key", "init",
                             "-u", "user1")
            self.assertIn("created", res.stdout)
            self.assertTrue(os.path.exists(key))
            self.assertEqual(os.stat(key).st_mode & 0o777, 0o600)
            with open(key, "rb") as f:
                image = f.read()

            dc.lmtp_deliver("user1", MSG)
            self.assertTrue(fetch1(dc, "user1").endswith(b"secret body\r\n"))

            # a second init never replaces the key
            res = dc.doveadm("casbox", "key", "init", "-u", "user1",
                             check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("already exists", res.stderr)
            with open(key, "rb") as f:
                self.assertEqual(f.read(), image)

            # a store with data whose key is lost: refuse, don't create
            os.unlink(key)
            res = dc.doveadm("casbox", "key", "init", "-u", "user1",
                             check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("already has data", res.stderr)
            self.assertFalse(os.path.exists(key))

    def test_destroy(self):
        keys = {"casbox_key_file": "%h/casbox.key",
                "casbox_key_autocreate": "yes"}
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=keys) as dc:
            key = os.path.join(dc.home("user1"), "casbox.key")
            dc.lmtp_deliver("user1", MSG)
            res = dc.doveadm("casbox", "key", "destroy", "-u", "user1",
                             check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("--yes-destroy-all-mail", res.stderr)
            self.assertTrue(os.path.exists(key))

            res = dc.doveadm("-f", "tab", "casbox", "key", "destroy",
                             "-u", "user1", "--yes-destroy-all-mail")
            self.assertIn("destroyed", res.stdout)
            self.assertFalse(os.path.exists(key))
            dc.allow_log(r"casbox|FETCH|key file")
            self.assertIsNone(fetch1(dc, "user1"))
            # and no new key was silently created over the data
            self.assertFalse(os.path.exists(key))


if __name__ == "__main__":
    unittest.main()
