"""casbox_dict_autotrain on a real Dovecot: a store trains its first
compression dictionary by itself once it holds that many small blobs
(doc/settings.md), from header blocks only, once, and later small mail
is compressed with it (its packs grow less than without one); every
message reads back byte-identical and the store audits clean. With 0,
nothing is trained. In password mode LMTP (no password) never trains;
the user's next IMAP session with the password does. A store without
enough small blobs is checked ever more seldom. A value too small to
train on is refused with the setting's name."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files, load, ok  # noqa: E402
from test_key_password import (PASS_PW, delivered_tail,  # noqa: E402
                               fetch_all, packs_size)
from test_key_password import SETTINGS as PW_SETTINGS  # noqa: E402

USER = "user1"
KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
CONF = "lmtp_add_received_header = no\n"
TRAINED_RE = r"casbox: Trained compression dictionary (\d+) "


def dict_files(dc):
    packs = os.path.join(dc.home(USER), "casbox", "packs")
    return sorted(n for n in os.listdir(packs) if n.startswith("dict-"))


class DictAutotrainTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        # small mail (the dictionary's blobs are up to 16 KiB), two
        # kinds of it
        paths = (corpus_files("spamassassin/easy-ham-1", limit=60) +
                 corpus_files("spamassassin/spam-1", limit=60))
        msgs = [m for m in load(paths) if 0 < len(m) < 12 * 1024]
        cls.first, cls.rest = msgs[0:80:2], msgs[1:80:2]
        assert len(cls.first) == 40 and len(cls.rest) == 40

    def run_store(self, autotrain):
        """Deliver first, then rest; (dictionary files after first,
        after rest, packs growth by rest, trained log lines)."""
        settings = dict(KEYS, casbox_dict_autotrain=autotrain)
        with Dovecot(plugin_settings=settings, extra_conf=CONF) as dc:
            dc.lmtp_deliver_many(USER, self.first)
            after_first = dict_files(dc)
            root = os.path.join(dc.home(USER), "casbox")
            before = packs_size(root)
            dc.lmtp_deliver_many(USER, self.rest)
            growth = packs_size(root) - before
            after_rest = dict_files(dc)
            imap = dc.imap_login(USER)
            expected = self.first + self.rest
            self.assertEqual(int(ok(imap.select("INBOX"))[0]),
                             len(expected))
            got = fetch_all(imap, len(expected))
            imap.logout()
            for i, msg in enumerate(expected):
                self.assertTrue(got[i].rstrip(b"\r\n").endswith(
                    delivered_tail(msg)), "message %d differs" % (i + 1))
            self.assertEqual(dc.casbox_audit(USER), [])
            trained = [ln for ln in dc.log_lines()
                       if "Trained compression dictionary" in ln]
        return after_first, after_rest, growth, trained

    def test_trains_once_and_uses_it(self):
        first_on, rest_on, growth_on, trained_on = self.run_store("20")
        # 40 small messages passed 20 small blobs: trained during the
        # first batch, once, whatever the later checks found
        self.assertEqual(first_on, ["dict-00000001.cbd"])
        self.assertEqual(rest_on, ["dict-00000001.cbd"])
        self.assertEqual(len(trained_on), 1, trained_on)
        self.assertRegex(trained_on[0], TRAINED_RE)

        first_off, rest_off, growth_off, trained_off = self.run_store("0")
        self.assertEqual(first_off + rest_off, [])
        self.assertEqual(trained_off, [])
        # the same 40 messages after the training: smaller with it
        self.assertLess(growth_on, growth_off)

    def test_password_mode(self):
        settings = dict(PW_SETTINGS, casbox_dict_autotrain="20")
        with Dovecot(plugin_settings=settings, extra_conf=CONF,
                     passdb_extra=PASS_PW) as dc:
            # the first login creates the key file
            imap = dc.imap_login(USER)
            ok(imap.select("INBOX"))
            imap.logout()
            dc.lmtp_deliver_many(USER, self.first)
            # LMTP cannot read the blobs it would train on
            self.assertEqual(dict_files(dc), [])
            self.assertFalse([ln for ln in dc.log_lines()
                              if "casbox_dict_autotrain" in ln])
            # a session with the password trains at its saves
            imap = dc.imap_login(USER)
            ok(imap.create("Appended"))
            for msg in self.rest[:4]:
                ok(imap.append("Appended", None, None, msg))
            imap.logout()
            self.assertEqual(dict_files(dc), ["dict-00000001.cbd"])
            # and LMTP keeps delivering next to the sealed dictionary
            dc.lmtp_deliver_many(USER, self.rest[4:8])
            imap = dc.imap_login(USER)
            self.assertEqual(int(ok(imap.select("INBOX"))[0]), 44)
            got = fetch_all(imap, 44)
            imap.logout()
            for i, msg in enumerate(self.first + self.rest[4:8]):
                self.assertTrue(got[i].rstrip(b"\r\n").endswith(
                    delivered_tail(msg)), "message %d differs" % (i + 1))

    def test_backs_off_without_small_blobs(self):
        """A store of large messages never has enough small blobs: the
        process checks it twice as seldom after each check (at saves 2,
        6, 14, 30, 62 at N=20), not every N/8 saves (50 checks)."""
        big = [b"From: a@example.com\r\nSubject: big %d\r\n\r\n" % i +
               b"".join(b"line %d of message %d, long enough\r\n" % (j, i)
                        for j in range(800)) for i in range(100)]
        self.assertTrue(all(len(m) > 16 * 1024 for m in big))
        with Dovecot(plugin_settings=dict(KEYS, casbox_dict_autotrain="20"),
                     extra_conf=CONF, mail_debug=True) as dc:
            dc.lmtp_deliver_many(USER, big)
            checks = [ln for ln in dc.log_lines()
                      if "Dictionary check: nothing to train" in ln]
            self.assertEqual(dict_files(dc), [])
        self.assertGreaterEqual(len(checks), 3, checks)
        self.assertLessEqual(len(checks), 6, checks)
        self.assertRegex(checks[-1], r"next check in (32|64) saves")

    def test_too_small_is_refused(self):
        with Dovecot(plugin_settings=dict(KEYS, casbox_dict_autotrain="5"),
                     extra_conf=CONF) as dc:
            dc.allow_log(r"casbox_dict_autotrain")
            res = dc.doveadm("mailbox", "list", "-u", USER, check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("casbox_dict_autotrain", res.stdout + res.stderr)


if __name__ == "__main__":
    unittest.main()
