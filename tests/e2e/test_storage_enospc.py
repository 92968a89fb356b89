"""A full filesystem during a real save: the casbox root is a small
tmpfs (mounted in a private mount namespace of this test process, which
Dovecot inherits). With the disk filled up, an APPEND and an LMTP
delivery of a large message fail cleanly (NO / 4xx), nothing of them is
visible (no message, no record, no blob reference), earlier mail reads
back intact, scrub is clean, and once space is freed the same saves
work."""

import base64
import ctypes
import os
import random
import re
import smtplib
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, ok  # noqa: E402
import test_storage_orphans as orphans  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
CONF = "lmtp_add_received_header = no\n"
FS_SIZE = 24 * 1024 * 1024
CLONE_NEWNS = 0x00020000
MS_REC = 16384
MS_PRIVATE = 1 << 18


def private_mount_namespace():
    """Move this process into its own mount namespace (root only), so
    the tmpfs is gone with the process whatever happens."""
    if os.geteuid() != 0:
        return "not root"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        return "unshare: %s" % os.strerror(ctypes.get_errno())
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return "mount --make-rprivate: %s" % os.strerror(ctypes.get_errno())
    return None


def msg(n, size=3000):
    rnd = random.Random(n)
    body = base64.encodebytes(bytes(rnd.getrandbits(8)
                                    for _ in range(size)))
    return (b"From: a@example.com\r\nTo: user1@example.com\r\n"
            b"Subject: enospc %d\r\nMessage-ID: <%d@enospc>\r\n\r\n"
            % (n, n) + body.replace(b"\n", b"\r\n"))


def storage_dump(dc):
    exe = os.path.join(os.environ.get("CASBOX_TOP_BUILDDIR", "."),
                       "tests", "storage-dump")
    root = os.path.join(dc.home("user1"), "casbox")
    return subprocess.run([exe, root], user=dc.uid, group=dc.gid,
                          capture_output=True, text=True)


def scrub(dc):
    res = dc.doveadm("-f", "tab", "casbox", "scrub", "-u", "user1",
                     check=False)
    return res.returncode, res.stdout.strip().split("\n")[1:], res.stderr


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill_up(path, leave):
    """A file of root's taking all but about `leave` bytes."""
    free = free_bytes(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"\0" * max(0, free - leave))


class SmallRootDovecot(Dovecot):
    """An instance whose user1 has the casbox root on a small tmpfs,
    mounted before the master starts, so that the master, its children
    and doveadm (all started in copies of this process's mount
    namespace) see it."""

    def _stage_modules(self):
        home = self.home("user1")
        self.casbox_root = os.path.join(home, "casbox")
        os.makedirs(self.casbox_root)
        os.chown(home, self.uid, self.gid)
        subprocess.run(["mount", "-t", "tmpfs", "-o",
                        "size=%d,uid=%d,gid=%d,mode=0700"
                        % (FS_SIZE, self.uid, self.gid), "casbox",
                        self.casbox_root], check=True)
        super()._stage_modules()

    def stop(self):
        super().stop()
        if getattr(self, "casbox_root", None) is not None:
            subprocess.run(["umount", "-l", self.casbox_root], check=False)
            self.casbox_root = None


class EnospcTest(unittest.TestCase):

    def setUp(self):
        why = private_mount_namespace()
        if why is not None:
            self.skipTest("no private mount namespace: %s" % why)

    def fetch_all(self, dc):
        imap = dc.imap_login("user1")
        ok(imap.select("INBOX", readonly=True))
        data = ok(imap.uid("FETCH", "1:*", "(BODY.PEEK[HEADER.FIELDS "
                                           "(Subject)] BODY.PEEK[TEXT])"))
        imap.logout()
        return [x[1] for x in data if isinstance(x, tuple)]

    def test_full_disk(self):
        with SmallRootDovecot(plugin_settings=KEYS, extra_conf=CONF) as dc:
            if dc.keep_tmp:
                print("instance: %s" % dc.tmp, file=sys.stderr)
            try:
                self.full_disk(dc, dc.casbox_root)
            finally:
                dc.stop()

    def full_disk(self, dc, root):
        early = [msg(n) for n in range(1, 6)]
        dc.lmtp_deliver_many("user1", early)
        imap = dc.imap_login("user1")
        ok(imap.select("INBOX"))
        before = self.fetch_all(dc)
        self.assertEqual(len(before), 2 * len(early))

        filler = os.path.join(root, "filler")
        fill_up(filler, 256 * 1024)
        big = msg(100, size=2 * 1024 * 1024)
        dc.allow_log(r"No space left on device|ENOSPC|Not enough disk"
                     r"|write\(.*\) failed|fsync|Quota exceeded")

        # a full disk is "mailbox full" to the client, as for sdbox
        typ, data = imap.append("INBOX", None, None, big)
        self.assertEqual(typ, "NO", data)
        self.assertIn(b"[OVERQUOTA]", data[0])
        with smtplib.LMTP("127.0.0.1", dc.lmtp_port, timeout=120) as lmtp:
            with self.assertRaises(smtplib.SMTPDataError) as cm:
                lmtp.sendmail("s@example.com", ["user1"], msg(101, 1 << 21))
            # quota_full_tempfail = no (default): 552 5.2.2
            self.assertEqual(cm.exception.smtp_code, 552, cm.exception)
        self.assertIsNotNone(dc.wait_log(r"No space left on device"))

        # nothing of the failed saves is visible, earlier mail intact
        ok(imap.noop())
        self.assertEqual(int(ok(imap.select("INBOX"))[0]), len(early))
        self.assertEqual(self.fetch_all(dc), before)
        res = storage_dump(dc)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertEqual(len(re.findall(r"^m ", res.stdout, re.M)),
                         len(early), res.stdout)

        os.unlink(filler)
        rc, rows, err = scrub(dc)
        self.assertEqual((rc, rows), (0, []), err)

        # space is back: the same saves work
        ok(imap.append("INBOX", None, None, big))
        dc.lmtp_deliver("user1", msg(101, 1 << 21))
        ok(imap.select("INBOX"))
        self.assertEqual(int(ok(imap.select("INBOX"))[0]), len(early) + 2)
        data = ok(imap.uid("FETCH", "6", "BODY.PEEK[]"))
        self.assertEqual(data[0][1], big)
        imap.logout()
        res = storage_dump(dc)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        rc, rows, err = scrub(dc)
        self.assertEqual((rc, rows), (0, []), err)


    def test_space_runs_out_at_every_step(self):
        """The free space ends at a different write each round: in the
        pack, in the LSM WAL, in the index. Every save is either
        acknowledged and intact or refused and invisible; refcounts
        stay consistent; then it works with space again."""
        with SmallRootDovecot(plugin_settings=KEYS, extra_conf=CONF) as dc:
            try:
                self.sweep(dc, dc.casbox_root)
            finally:
                dc.stop()

    def sweep(self, dc, root):
        dc.allow_log(r"No space left on device|Not enough disk space")
        imap = dc.imap_login("user1")
        ok(imap.select("INBOX"))
        filler = os.path.join(root, "filler")
        # how much one save of such a message takes (pack, WAL, index)
        acked, outcomes = [msg(199, size=64 * 1024)], []
        free0 = free_bytes(root)
        ok(imap.append("INBOX", None, None, acked[0]))
        need = free0 - free_bytes(root)
        for step in range(24):
            m = msg(200 + step, size=64 * 1024)
            fill_up(filler, need - 40 * 1024 + step * 4096)
            typ, data = imap.append("INBOX", None, None, m)
            os.unlink(filler)
            outcomes.append(typ)
            if typ == "OK":
                acked.append(m)
            else:
                self.assertIn(b"[OVERQUOTA]", data[0], (step, data))
            count = int(ok(imap.select("INBOX"))[0])
            self.assertEqual(count, len(acked), step)
        self.assertIn("OK", outcomes)
        self.assertIn("NO", outcomes)
        data = ok(imap.uid("FETCH", "1:*", "BODY.PEEK[]"))
        self.assertEqual([x[1] for x in data if isinstance(x, tuple)],
                         acked)
        res = storage_dump(dc)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        rc, rows, err = scrub(dc)
        self.assertEqual((rc, rows), (0, []), err)
        m = msg(999, size=64 * 1024)
        ok(imap.append("INBOX", None, None, m))
        imap.logout()
        print("outcomes: %s" % " ".join(outcomes), file=sys.stderr)


@unittest.skipIf(orphans.STRACE is None, "strace not installed")
class EnospcAtEachSyncTest(unittest.TestCase):
    """ENOSPC returned by each fdatasync() of a delivery in turn (with
    strace's fault injection): the pack's, the LSM WAL's, the index
    log's. The last one fails the index commit after the LSM commit:
    the record left behind is released at the next open."""

    # fdatasync number: (step, LMTP reply code)
    STEPS = {1: ("pack", 552), 2: ("LSM WAL", 552),
             3: ("index log", 451)}

    def test_each_sync(self):
        for nth, (step, code) in sorted(self.STEPS.items()):
            with self.subTest(step=step):
                self.one(nth, code)

    def one(self, nth, code):
        with Dovecot(plugin_settings=KEYS, extra_conf=orphans.CONF) as dc:
            dc.allow_log(r"No space left on device")
            dc.allow_log(r"Internal error occurred")
            dc.lmtp_deliver("user1", orphans.msg(1))
            sess = orphans.LmtpSession(dc, "error=ENOSPC:when=%d" % nth)
            with self.assertRaises(smtplib.SMTPDataError) as cm:
                sess.lmtp.sendmail("s@example.com", ["user1"],
                                   orphans.msg(2))
            sess.close()
            self.assertEqual(cm.exception.smtp_code, code, cm.exception)

            imap = dc.imap_login("user1")
            self.assertEqual(int(ok(imap.select("INBOX"))[0]), 1)
            res = storage_dump(dc)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            # the failed save left nothing once the mailbox was opened
            self.assertEqual(orphans.record_uids(res.stdout), [1])
            dc.lmtp_deliver("user1", orphans.msg(3))
            ok(imap.noop())
            data = ok(imap.uid("FETCH", "1:*", "BODY.PEEK[]"))
            bodies = [x[1] for x in data if isinstance(x, tuple)]
            self.assertEqual(len(bodies), 2)
            self.assertTrue(bodies[1].endswith(orphans.msg(3)[-200:]))
            imap.logout()
            rc, rows, err = scrub(dc)
            self.assertEqual((rc, rows), (0, []), err)


if __name__ == "__main__":
    unittest.main()
