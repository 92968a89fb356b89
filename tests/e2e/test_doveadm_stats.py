"""doveadm casbox stats: the numbers follow what was delivered."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
CONF = "lmtp_add_received_header = no\n"


def stats(dc, user="user1"):
    out = dc.doveadm("-f", "tab", "casbox", "stats", "-u", user).stdout
    lines = out.strip().split("\n")
    return dict(zip(lines[0].split("\t"), lines[1].split("\t")))


def packs_size(root):
    d = os.path.join(root, "packs")
    return sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d)
               if n.startswith("pack-"))


class DoveadmStatsTest(unittest.TestCase):

    def test_stats_follow_deliveries(self):
        msgs = []
        for path in corpus_files("usrp-users-3000", limit=20, step=100):
            with open(path, "rb") as f:
                msgs.append(f.read())
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            root = os.path.join(dc.home("user1"), "casbox")
            dc.lmtp_deliver_many("user1", msgs)
            s1 = stats(dc)
            self.assertEqual(int(s1["messages"]), len(msgs))
            # physical sizes: the bytes delivered plus LMTP's
            # Return-Path and Delivered-To
            raw = sum(len(m) for m in msgs)
            self.assertGreaterEqual(int(s1["logical_bytes"]), raw)
            self.assertLess(int(s1["logical_bytes"]), raw + 120 * len(msgs))
            self.assertEqual(int(s1["stored_bytes"]), packs_size(root))
            self.assertGreaterEqual(int(s1["unique_blobs"]), len(msgs))
            self.assertGreaterEqual(int(s1["packs"]), 1)
            self.assertAlmostEqual(float(s1["dedup_ratio"]), 1.0, delta=0.05)
            self.assertGreater(float(s1["compression_ratio"]), 1.0)
            self.assertLess(float(s1["dead_ratio"]), 0.05)
            self.assertGreater(int(s1["lsm_bytes"]), 0)

            # the same messages again: stored bytes barely grow and the
            # dedup ratio doubles
            dc.lmtp_deliver_many("user1", msgs)
            s2 = stats(dc)
            self.assertEqual(int(s2["messages"]), 2 * len(msgs))
            self.assertEqual(int(s2["logical_bytes"]),
                             2 * int(s1["logical_bytes"]))
            self.assertEqual(s2["unique_blobs"], s1["unique_blobs"])
            self.assertLess(int(s2["stored_bytes"]) -
                            int(s1["stored_bytes"]),
                            int(s1["stored_bytes"]) // 20 + 4096)
            self.assertAlmostEqual(float(s2["dedup_ratio"]), 2.0,
                                   delta=0.1)

            # the record counts come from the LSM, which is sealed with
            # the key: without it, a clear error naming the key file
            key = os.path.join(dc.home("user1"), "casbox.key")
            os.rename(key, key + ".away")
            try:
                res = dc.doveadm("-f", "tab", "casbox", "stats", "-u",
                                 "user1", check=False)
            finally:
                os.rename(key + ".away", key)
            self.assertEqual(res.returncode, 75, res.stderr)
            self.assertIn("key file %s does not exist" % key, res.stderr)
            self.assertEqual(stats(dc), s2)

            # json formatter works too
            out = dc.doveadm("-f", "json", "casbox", "stats", "-u",
                             "user1").stdout
            self.assertIn('"messages"', out)

    def test_stats_user_without_store_fails(self):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            res = dc.doveadm("casbox", "stats", "-u", "user2", check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("no casbox store", res.stderr)

    def test_all_users(self):
        """doveadm -A walks every user of the userdb. One without a
        store yet (a new user, or one on another format) is skipped,
        not a failure that would make every nightly `scrub -A` exit
        non-zero; with -u it still fails (68)."""
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF,
                     users=["user1", "user2", "user3"]) as dc:
            msgs = [b"Subject: m%d\r\n\r\nbody %d\r\n" % (i, i)
                    for i in range(5)]
            dc.lmtp_deliver_many("user1", msgs[:3])
            dc.lmtp_deliver_many("user2", msgs[3:])
            res = dc.doveadm("-f", "tab", "casbox", "stats", "-A")
            lines = res.stdout.strip().split("\n")
            head = lines[0].split("\t")
            rows = [dict(zip(head, ln.split("\t"))) for ln in lines[1:]]
            self.assertEqual(sorted(r["messages"] for r in rows),
                             ["2", "3"], res.stdout)
            for cmd in (["casbox", "scrub"], ["casbox", "gc"],
                        ["casbox", "key", "rotate"],
                        ["casbox", "key", "rotate", "--finish"]):
                res = dc.doveadm(*cmd, "-A", check=False)
                self.assertEqual(res.returncode, 0, (cmd, res.stderr))
                self.assertNotIn("user3", res.stdout + res.stderr)
            res = dc.doveadm("casbox", "stats", "-u", "user3", check=False)
            self.assertEqual(res.returncode, 68)
            self.assertIn("no casbox store", res.stderr)
            # server mode: the rebuild from the packs needs no password
            # and runs over all users too
            res = dc.doveadm("casbox", "rebuild", "--from-packs", "-A",
                             check=False)
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertNotIn("user3", res.stdout + res.stderr)
            self.assertEqual(stats(dc, "user1")["messages"], "3")
            # a command that reads one user's passwords from stdin
            # refuses to run over all users (64), before reading them
            res = dc.doveadm("casbox", "key", "password", "-A", check=False,
                             input="old-secret\nnew-secret\n")
            self.assertEqual(res.returncode, 64, res.stderr)
            self.assertNotIn("secret", res.stdout + res.stderr)


if __name__ == "__main__":
    unittest.main()
