"""Cross-message compression (issue 16 step 4) through a real Dovecot: a
thread delivered by LMTP is stored as deltas of its first message and
FETCHes byte-exact; a flipped byte in the base makes scrub name every
dependent while the other mail reads fine, scrub --repair quarantines and
marks them all and releases them once the frame is restored; gc killed with SIGKILL while
it moves a base (whose own message is expunged) loses nothing; rebuild
--from-packs brings the chains back; casbox_cross_message = no stores
every message alone."""

import imaplib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, crlf  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
CONF = "lmtp_add_received_header = no\n"
NREPLIES = 4


def body(seed, lines=300):
    rnd = random.Random(seed)
    return b"".join(b"line %d of the thread: %08x %d\r\n"
                    % (i, rnd.getrandbits(32), rnd.randrange(977))
                    for i in range(lines))


PARENT = (b"From: Alice <alice@example.org>\r\nTo: list@example.org\r\n"
          b"Message-ID: <parent@example.org>\r\nSubject: thread\r\n\r\n" +
          body(1))


def reply(n):
    quoted = b"".join(b"> " + ln + b"\r\n"
                      for ln in body(1).split(b"\r\n")[:-1])
    return (b"From: r%d@example.net\r\nTo: list@example.org\r\n" % n +
            b"Message-ID: <reply%d@example.net>\r\n" % n +
            b"In-Reply-To: <parent@example.org>\r\n"
            b"References: <parent@example.org>\r\n"
            b"Subject: Re: thread\r\n\r\nreply %d on top\r\n\r\n" % n +
            quoted)


OTHER = (b"From: other@example.com\r\nMessage-ID: <other@example.com>\r\n"
         b"Subject: unrelated\r\n\r\n" + body(99, 100))

# uid -> message: 1 the parent, 2.. the replies, then the unrelated one
MESSAGES = dict([(1, PARENT)] +
                [(n + 2, reply(n)) for n in range(NREPLIES)] +
                [(NREPLIES + 2, OTHER)])


def storage_dump(dc):
    exe = os.path.join(os.environ.get("CASBOX_TOP_BUILDDIR", "."),
                       "tests", "storage-dump")
    root = os.path.join(dc.home("user1"), "casbox")
    res = subprocess.run([exe, root], user=dc.uid, group=dc.gid,
                         capture_output=True, text=True)
    parts, locs, deltas, refs = {}, {}, {}, {}
    for ln in res.stdout.splitlines():
        f = ln.split()
        if f[0] == "p":
            parts.setdefault(int(f[2]), []).append(f[3])
        elif f[0] == "l":
            kv = dict(x.split("=") for x in f[2:])
            locs[f[1]] = (int(kv["pack"]), int(kv["offset"]),
                          int(kv["frame_size"]))
        elif f[0] == "d":
            deltas[f[1]] = f[2].split("=")[1]
        elif f[0] == "b":
            refs[f[1]] = int(f[2].split("=")[1])
    return res, parts, locs, deltas, refs


def fetch_all(dc):
    """uid -> BODY[] (None where the server refused)."""
    imap = dc.imap_login("user1")
    imap.select("INBOX")
    out = {}
    typ, data = imap.uid("SEARCH", None, "ALL")
    for uid in data[0].split():
        try:
            typ, data = imap.uid("FETCH", uid, "(BODY.PEEK[])")
        except imaplib.IMAP4.abort:
            # the server hung up on a damaged message: reconnect
            out[int(uid)] = None
            imap = dc.imap_login("user1")
            imap.select("INBOX")
            continue
        out[int(uid)] = (data[0][1] if typ == "OK" and
                         isinstance(data[0], tuple) else None)
    imap.logout()
    return out


def scrub(dc, *extra):
    res = dc.doveadm("-f", "tab", "casbox", "scrub", "-u", "user1", *extra,
                     check=False)
    lines = res.stdout.strip("\n").split("\n")
    header = ["username" if h in ("", "Username") else h
              for h in lines[0].split("\t")]
    rows = [dict(zip(header, ln.split("\t"))) for ln in lines[1:] if ln]
    return res, rows


def expunge(dc, uid):
    imap = dc.imap_login("user1")
    imap.select("INBOX")
    imap.uid("STORE", str(uid), "+FLAGS", r"(\Deleted)")
    imap.expunge()
    imap.logout()


class StorageXmsgTest(unittest.TestCase):

    def deliver(self, dc):
        for uid in sorted(MESSAGES):
            dc.lmtp_deliver("user1", MESSAGES[uid])

    def assert_thread_deltas(self, dc):
        res, parts, locs, deltas, refs = storage_dump(dc)
        self.assertEqual(res.returncode, 0, res.stdout[-2000:])
        base = parts[1][0]
        for uid in range(2, NREPLIES + 2):
            self.assertEqual(deltas.get(parts[uid][0]), base,
                             (uid, deltas))
        self.assertNotIn(parts[NREPLIES + 2][0], deltas)
        # its message and each dependent
        self.assertEqual(refs[base], 1 + NREPLIES)
        return base, locs

    def assert_reads(self, dc, uids):
        """LMTP prepends Return-Path and Delivered-To: the rest is the
        message byte for byte."""
        bodies = fetch_all(dc)
        for uid in uids:
            got = bodies.get(uid)
            self.assertIsNotNone(got, uid)
            self.assertTrue(got.endswith(crlf(MESSAGES[uid])), uid)
            self.assertRegex(got[:-len(crlf(MESSAGES[uid]))],
                             rb"^Return-Path: .*\r\nDelivered-To: .*\r\n$")

    def test_thread_deltas(self):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            self.deliver(dc)
            self.assert_thread_deltas(dc)
            self.assert_reads(dc, MESSAGES)
            self.assertEqual(dc.casbox_audit("user1"), [])
            # the parent expunged: its blob lives on for the replies,
            # and goes with the last of them
            expunge(dc, 1)
            self.assert_reads(dc, range(2, NREPLIES + 3))
            self.assertEqual(dc.casbox_audit("user1"), [])
            for uid in range(2, NREPLIES + 2):
                expunge(dc, uid)
            res, parts, locs, deltas, refs = storage_dump(dc)
            self.assertEqual(list(parts), [NREPLIES + 2])
            self.assertEqual(len(refs), 1, refs)
            self.assertEqual(dc.casbox_audit("user1"), [])

    def test_setting_off(self):
        settings = dict(KEYS, casbox_cross_message="no")
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=settings, extra_conf=CONF) as dc:
            self.deliver(dc)
            res, parts, locs, deltas, refs = storage_dump(dc)
            self.assertEqual(deltas, {})
            self.assert_reads(dc, MESSAGES)

    def test_flipped_base_names_dependents(self):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            self.deliver(dc)
            base, locs = self.assert_thread_deltas(dc)
            pack, offset, size = locs[base]
            path = os.path.join(dc.home("user1"), "casbox", "packs",
                                "pack-%08d.cbp" % pack)
            with open(path, "r+b") as f:
                f.seek(offset + size // 2)
                b = f.read(1)
                f.seek(offset + size // 2)
                f.write(bytes([b[0] ^ 0x40]))
            dc.allow_log(r"casbox|pack-")
            dc.allow_log(r"FETCH .* failed")
            res, rows = scrub(dc)
            self.assertEqual(res.returncode, 65, res.stdout + res.stderr)
            named = sorted({int(r["uid"]) for r in rows
                            if r["mailbox"] == "INBOX"})
            # the base's message and every dependent, nothing else
            self.assertEqual(named, list(range(1, NREPLIES + 2)), rows)
            bodies = fetch_all(dc)
            for uid in range(1, NREPLIES + 2):
                self.assertIsNone(bodies[uid], uid)
            self.assertTrue(bodies[NREPLIES + 2].endswith(crlf(OTHER)))

    def test_flipped_base_repair(self):
        """scrub --repair with a damaged base: the base and every
        dependent are quarantined (each dependent's own frame is intact
        and says so) and their messages marked $CasboxDamaged; each of
        them then gets a tagged NO and the session goes on, the other
        message reads; nothing is deleted. With the base's frame
        restored (a backup of the pack), the next --repair releases the
        base and every dependent, and every message reads byte-exact."""
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            self.deliver(dc)
            base, locs = self.assert_thread_deltas(dc)
            _, parts, _, deltas, refs_before = storage_dump(dc)
            dependents = {parts[uid][0] for uid in range(2, NREPLIES + 2)}
            pack, offset, size = locs[base]
            path = os.path.join(dc.home("user1"), "casbox", "packs",
                                "pack-%08d.cbp" % pack)
            with open(path, "r+b") as f:
                f.seek(offset + size // 2)
                orig = f.read(1)
                f.seek(offset + size // 2)
                f.write(bytes([orig[0] ^ 0x40]))
            dc.allow_log(r"casbox|pack-")
            dc.allow_log(r"FETCH .* failed")
            res, rows = scrub(dc, "--repair")
            self.assertEqual(res.returncode, 65, res.stdout + res.stderr)
            repaired = [r for r in rows if r["status"] == "repaired"]
            quarantined = {r["blob"]: r["cause"] for r in repaired
                           if r["cause"].startswith("quarantined")}
            self.assertEqual(set(quarantined), dependents | {base}, rows)
            for blob in dependents:
                self.assertIn("its base %s is damaged" % base,
                              quarantined[blob])
            self.assertNotIn("its base", quarantined[base])
            marked = sorted(int(r["uid"]) for r in repaired
                            if r["cause"] == "marked $CasboxDamaged")
            self.assertEqual(marked, list(range(1, NREPLIES + 2)), rows)
            # nothing deleted: every part, chain and reference as before
            _, parts2, _, deltas2, refs2 = storage_dump(dc)
            self.assertEqual((parts2, deltas2, refs2),
                             (parts, deltas, refs_before))

            imap = dc.imap_login("user1")
            imap.select("INBOX")
            for uid in range(1, NREPLIES + 2):
                typ, data = imap.uid("FETCH", str(uid), "(BODY.PEEK[])")
                self.assertEqual(typ, "NO", (uid, data))
                self.assertIn(b"damaged", data[0])
            typ, data = imap.uid("FETCH", str(NREPLIES + 2),
                                 "(BODY.PEEK[])")
            self.assertEqual(typ, "OK")
            got = [d[1] for d in data if isinstance(d, tuple)]
            self.assertEqual(len(got), 1, data)
            self.assertTrue(got[0].endswith(crlf(OTHER)))
            imap.logout()

            # the pack's byte restored: base and dependents released
            with open(path, "r+b") as f:
                f.seek(offset + size // 2)
                f.write(orig)
            res, rows = scrub(dc, "--repair")
            released = {r["blob"] for r in rows if r["status"] == "repaired"
                        and r["cause"] == "released from quarantine: "
                        "reads intact"}
            self.assertEqual(released, dependents | {base}, res.stdout)
            res, rows = scrub(dc)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            self.assertEqual(rows, [])
            self.assert_reads(dc, MESSAGES)
            self.assertEqual(dc.casbox_audit("user1"), [])

    def test_gc_killed_moving_base(self):
        """The parent expunged, so gc moves a base only its dependents
        keep alive (and the dependents' delta frames, verbatim); gc is
        killed with SIGKILL at each step (CASBOX_TEST_GC_KILL), then run
        to the end: after every kill each reply reads byte-exact, and
        the audit is clean at the end."""
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            self.deliver(dc)
            self.assert_thread_deltas(dc)
            expunge(dc, 1)
            env = dict(os.environ)
            for step in ("copy", "copied", "switched", "unlink"):
                env["CASBOX_TEST_GC_KILL"] = step
                env["DOVECOT_PRESERVE_ENVS"] = "CASBOX_TEST_GC_KILL"
                res = subprocess.run(
                    dc.doveadm_command("casbox", "gc", "-u", "user1",
                                       "--all"),
                    env=env, capture_output=True, timeout=120)
                self.assertEqual(res.returncode, -signal.SIGKILL,
                                 (step, res.stderr))
                self.assert_reads(dc, range(2, NREPLIES + 3))
            dc.doveadm("casbox", "gc", "-u", "user1", "--all")
            self.assert_reads(dc, range(2, NREPLIES + 3))
            res, parts, locs, deltas, refs = storage_dump(dc)
            self.assertEqual(len(deltas), NREPLIES)
            base = set(deltas.values())
            self.assertEqual(len(base), 1)
            self.assertEqual(refs[base.pop()], NREPLIES)
            self.assertEqual(dc.casbox_audit("user1"), [])

    def test_rebuild_from_packs(self):
        """After the parent's expunge and a gc that dropped its recovery
        record (the only one with the base's DEK), gc's blob keys carry
        the base: the LSM rebuilt from the packs alone has every chain
        and reference."""
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            self.deliver(dc)
            self.assert_thread_deltas(dc)
            expunge(dc, 1)
            dc.doveadm("casbox", "gc", "-u", "user1", "--all")
            before = storage_dump(dc)
            shutil.rmtree(os.path.join(dc.home("user1"), "casbox", "lsm"))
            dc.doveadm("-f", "tab", "casbox", "rebuild", "--from-packs",
                       "-u", "user1")
            after = storage_dump(dc)
            # parts, deltas and refcounts as before
            self.assertEqual(after[1], before[1])
            self.assertEqual(after[3], before[3])
            self.assertEqual(after[4], before[4])
            self.assert_reads(dc, range(2, NREPLIES + 3))
            self.assertEqual(dc.casbox_audit("user1"), [])


if __name__ == "__main__":
    unittest.main()
