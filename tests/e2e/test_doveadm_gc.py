"""doveadm casbox gc: after expunges it rewrites the packs past
casbox_gc_dead_ratio, reclaims their dead bytes, and every remaining
message still FETCHes byte-exact; scrub stays clean."""

import hashlib
import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files, ok  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
CONF = "lmtp_add_received_header = no\n"


def table(dc, *args):
    res = dc.doveadm("-f", "tab", "casbox", *args)
    lines = res.stdout.strip().split("\n")
    return [dict(zip(lines[0].split("\t"), ln.split("\t")))
            for ln in lines[1:]]


def packs_size(root):
    d = os.path.join(root, "packs")
    return sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d)
               if n.startswith("pack-"))


def digest(data):
    return hashlib.sha256(data).hexdigest()


def fetch_all(dc, user="user1"):
    imap = dc.imap_login(user)
    ok(imap.select("INBOX"))
    data = ok(imap.uid("FETCH", "1:*", "(UID BODY.PEEK[])"))
    imap.logout()
    out = {}
    for item in data:
        if isinstance(item, tuple):
            uid = int(item[0].split(b"UID ")[1].split()[0])
            out[uid] = item[1]
    return out


class DoveadmGcTest(unittest.TestCase):

    def test_gc_after_expunge(self):
        msgs = []
        for path in corpus_files("usrp-users-3000", limit=40, step=50):
            with open(path, "rb") as f:
                msgs.append(f.read())
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            root = os.path.join(dc.home("user1"), "casbox")
            dc.lmtp_deliver_many("user1", msgs)
            before = fetch_all(dc)
            self.assertEqual(len(before), len(msgs))

            # nothing dead yet: gc selects nothing
            r = table(dc, "gc", "-u", "user1")[0]
            self.assertEqual(r["packs_selected"], "0")
            self.assertEqual(r["bytes_reclaimed"], "0")

            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            gone = [u for u in before if u % 3 != 0]
            ok(imap.uid("STORE", ",".join(map(str, gone)), "+FLAGS",
                        "(\\Deleted)"))
            ok(imap.expunge())
            imap.logout()

            s1 = table(dc, "stats", "-u", "user1")[0]
            self.assertGreater(float(s1["dead_ratio"]), 0.3)
            size1 = packs_size(root)

            r = table(dc, "gc", "-u", "user1")[0]
            self.assertGreaterEqual(int(r["packs_deleted"]), 1)
            self.assertGreater(int(r["bytes_reclaimed"]), size1 // 3)
            s2 = table(dc, "stats", "-u", "user1")[0]
            self.assertEqual(int(s2["stored_bytes"]), packs_size(root))
            self.assertLess(int(s2["stored_bytes"]), size1 * 2 // 3)
            self.assertLess(float(s2["dead_ratio"]), 0.05)
            self.assertEqual(s2["messages"], s1["messages"])

            after = fetch_all(dc)
            self.assertEqual(sorted(after),
                             sorted(u for u in before if u % 3 == 0))
            for uid, body in after.items():
                self.assertEqual(body, before[uid], "uid %d" % uid)

            res = dc.doveadm("-f", "tab", "casbox", "scrub", "-u", "user1",
                             check=False)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)

            # new deliveries still work and dedup against moved blobs
            dc.lmtp_deliver("user1", msgs[2])
            s3 = table(dc, "stats", "-u", "user1")[0]
            self.assertEqual(s3["unique_blobs"], s2["unique_blobs"])
            after2 = fetch_all(dc)
            self.assertEqual(len(after2), len(after) + 1)

            # --all rewrites everything, still byte-exact
            r = table(dc, "gc", "-u", "user1", "--all")[0]
            self.assertGreaterEqual(int(r["packs_deleted"]), 1)
            self.assertEqual(fetch_all(dc), after2)

    def test_gc_races_deliveries(self):
        """gc --all over and over while LMTP delivers copies of stored
        messages (each one reuses blobs gc is moving) and new ones: no
        message is lost or altered, refcounts stay exact."""
        msgs = []
        for path in corpus_files("usrp-users-3000", limit=30, step=70):
            with open(path, "rb") as f:
                msgs.append(f.read())
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            dc.lmtp_deliver_many("user1", msgs[:20])
            # what IMAP returns for each of the first 20 (LMTP's headers,
            # CRLF); a second delivery of one gives the same bytes
            base = [digest(b) for _, b in sorted(fetch_all(dc).items())]
            # the same for the 10 new ones, delivered to another user
            # (only Delivered-To, the first "userN" in the bytes, differs)
            dc.lmtp_deliver_many("user2", msgs[20:])
            base_new = [digest(b.replace(b"user2", b"user1", 1))
                        for _, b in sorted(fetch_all(dc, "user2").items())]
            errors = []

            def deliver():
                try:
                    for m in msgs[:20] + msgs[20:]:
                        dc.lmtp_deliver("user1", m)
                except Exception as e:  # reported by the main thread
                    errors.append(e)

            t = threading.Thread(target=deliver)
            t.start()
            runs = kept = 0
            while t.is_alive() or runs < 3:
                r = table(dc, "gc", "-u", "user1", "--all")[0]
                # a pack that got a new blob after gc's census (before
                # its rotation) must be kept, never deleted
                kept += int(r["packs_selected"]) - int(r["packs_deleted"])
                runs += 1
            t.join()
            self.assertEqual(errors, [])
            r = table(dc, "gc", "-u", "user1", "--all")[0]
            self.assertEqual(r["packs_selected"], r["packs_deleted"])
            print("\ngc runs racing deliveries: %d, packs kept: %d"
                  % (runs, kept))

            got = sorted(fetch_all(dc).items())
            self.assertEqual(len(got), 50)
            # UIDs 1-20 and 21-40 are the first 20 twice, byte-exact;
            # 41-50 the new ones
            self.assertEqual([digest(b) for _, b in got[:20]], base)
            self.assertEqual([digest(b) for _, b in got[20:40]], base)
            self.assertEqual([digest(b) for _, b in got[40:]], base_new)
            res = dc.doveadm("-f", "tab", "casbox", "scrub", "-u", "user1",
                             check=False)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)


if __name__ == "__main__":
    unittest.main()
