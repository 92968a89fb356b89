"""doveadm casbox dict train: a dictionary trained on the user's small
blobs compresses held-out blobs better than plain zstd, and every message
reads back byte-exact before and after, including ones saved with it."""

import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files  # noqa: E402
from test_doveadm_stats import CONF, packs_size  # noqa: E402
from test_doveadm_stats import KEYS as STATS_KEYS  # noqa: E402

# this command's dictionary is the first one: the store does not train
# one by itself (casbox_dict_autotrain; test_dict_autotrain.py tests that)
KEYS = dict(STATS_KEYS, casbox_dict_autotrain="0")


def read_all(paths):
    msgs = []
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        if data.strip():
            msgs.append(data)
    return msgs


def bodies(dc, user):
    """UID -> BODY[] of INBOX, without the per-user Delivered-To."""
    imap = dc.imap_login(user)
    try:
        typ, _ = imap.select("INBOX", readonly=True)
        assert typ == "OK"
        typ, data = imap.uid("FETCH", "1:*", "(BODY.PEEK[])")
        assert typ == "OK", data
    finally:
        imap.logout()
    out = {}
    for item in data:
        if isinstance(item, tuple):
            uid = int(re.search(rb"UID (\d+)", item[0]).group(1))
            out[uid] = re.sub(rb"^Delivered-To: [^\r\n]*\r\n", b"", item[1],
                              count=1, flags=re.M)
    return out


class DoveadmDictTest(unittest.TestCase):

    def test_train_gain_and_byte_exact(self):
        old = (read_all(corpus_files("mime-edge", limit=100)) +
               read_all(corpus_files("spamassassin/easy-ham-1", limit=100,
                                     step=3)))
        new = read_all(corpus_files("spamassassin/easy-ham-2", limit=40,
                                    step=5))
        self.assertGreater(len(old), 180)
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            dc.lmtp_deliver_many("user1", old)
            before = bodies(dc, "user1")
            self.assertEqual(len(before), len(old))

            r = dc.doveadm("-f", "tab", "casbox", "dict", "train", "-u",
                           "user1")
            lines = r.stdout.strip().split("\n")
            res = dict(zip(lines[0].split("\t"), lines[1].split("\t")))
            self.assertEqual(res["dict_id"], "1", r.stdout)
            self.assertGreater(int(res["samples"]), 100, r.stdout)
            self.assertGreater(int(res["heldout"]), 20, r.stdout)
            self.assertLess(int(res["dict_bytes"]), int(res["zstd_bytes"]))
            self.assertGreater(float(res["gain"]), 1.0, r.stdout)
            packs = os.path.join(dc.home("user1"), "casbox", "packs")
            self.assertTrue(os.path.exists(
                os.path.join(packs, "dict-00000001.cbd")), os.listdir(packs))

            # what was stored before still reads the same
            self.assertEqual(bodies(dc, "user1"), before)

            # new deliveries: user1 has the dictionary, user2 (its own
            # store) has none; the same messages read back the same and
            # take less pack space with it
            root1 = os.path.join(dc.home("user1"), "casbox")
            size1 = packs_size(root1)
            dc.lmtp_deliver_many("user1", new)
            dc.lmtp_deliver_many("user2", new)
            grown1 = packs_size(root1) - size1
            grown2 = packs_size(os.path.join(dc.home("user2"), "casbox"))
            after = bodies(dc, "user1")
            ref = bodies(dc, "user2")
            self.assertEqual(len(ref), len(new))
            self.assertEqual([after[uid] for uid in sorted(after)
                              if uid > len(old)],
                             [ref[uid] for uid in sorted(ref)])
            self.assertEqual({u: after[u] for u in before}, before)
            self.assertLess(grown1, grown2, (grown1, grown2))

    def test_too_few_blobs(self):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            dc.lmtp_deliver_many("user1", read_all(
                corpus_files("mime-edge", limit=2)))
            r = dc.doveadm("casbox", "dict", "train", "-u", "user1",
                           check=False)
            self.assertEqual(r.returncode, 65, r)
            self.assertIn("too few small blobs", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
