"""doveadm casbox key rotate: re-wrapping every data key under a new KEK
survives kill -9 at any batch, keeps all mail readable during and after,
wraps deliveries made during the rotation with the new key, and leaves an
old copy of the key file unable to open the rewrapped keys. After a
rotation (finished, or killed and resumed, or with gc moving every blob
in the middle) has dropped the old slot, rebuild --from-packs brings
every message back byte-identical from the packs alone.

Synchronisation is on doveadm's own per-batch progress lines (doveadm -v),
never on sleeps."""

import fcntl
import hashlib
import imaplib
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files, ok, load  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
CONF = "lmtp_add_received_header = no\n"
BATCH = 8
BATCH_RE = re.compile(r"casbox key rotate: user1: batch (\d+): (\d+) "
                      r"rewrapped, (\d+) in total")


def kdf_key_id(root):
    """crypto_kdf_derive_from_key(16, 4, "CASBOXK1", root)[:4], BE:
    computed independently of the C code (hashlib)."""
    h = hashlib.blake2b(b"", digest_size=16, key=root,
                        salt=struct.pack("<Q", 4) + b"\0" * 8,
                        person=b"CASBOXK1" + b"\0" * 8)
    return struct.unpack(">I", h.digest()[:4])[0]


def read_key_file(path):
    """(root, [slot key ids], current key id) of a CASKEY1/2 file,
    checking its checksum."""
    with open(path, "rb") as f:
        data = f.read()
    check = hashlib.blake2b(data[:-32], digest_size=32).digest()
    assert check == data[-32:], "key file checksum"
    root = data[8:40]
    if data[:8] == b"CASKEY1\x01":
        assert len(data) == 72
        kid = kdf_key_id(root)
        return root, [kid], kid
    assert data[:8] == b"CASKEY2\x02", data[:8]
    count, current = data[40], data[41]
    assert len(data) == 44 + 36 * count + 32
    ids = [struct.unpack(">I", data[44 + 36 * i:48 + 36 * i])[0]
           for i in range(count)]
    return root, ids, ids[current]


def stats(dc):
    out = dc.doveadm("-f", "tab", "casbox", "stats", "-u", "user1").stdout
    lines = out.strip().split("\n")
    return dict(zip(lines[0].split("\t"), lines[1].split("\t")))


def key_id_counts(dc):
    """{key id: blob records wrapped under it} from doveadm stats."""
    field = stats(dc)["wrap_key_ids"]
    counts = {}
    for item in field.split(","):
        if item:
            kid, n = item.split(":")
            counts[int(kid, 16)] = int(n)
    return counts


def fetch_box(imap, box):
    """{uid: BODY[]} of every message of box."""
    count = int(ok(imap.select(box, readonly=True))[0])
    if count == 0:
        return {}
    data = ok(imap.uid("FETCH", "1:*", "(BODY.PEEK[])"))
    out = {}
    for entry in data:
        if isinstance(entry, tuple):
            m = re.search(rb"UID (\d+)", entry[0])
            out[int(m.group(1))] = entry[1]
    if len(out) != count:
        raise AssertionError("%s: %d of %d messages fetched"
                             % (box, len(out), count))
    return out


def fetch_all(imap):
    return {box: fetch_box(imap, box) for box in ("INBOX", "Copies")}


def tab_row(out):
    lines = out.strip().split("\n")
    return dict(zip(lines[0].split("\t"), lines[1].split("\t")))


def lock_waiters(path):
    """How many processes wait for a POSIX lock on path ("->" lines of
    /proc/locks naming its inode)."""
    st = os.stat(path)
    dev = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev),
                            st.st_ino)
    with open("/proc/locks") as f:
        return sum(1 for line in f
                   if "->" in line and line.split()[6] == dev)


def wait_for(cond, what, proc):
    """Poll an observed condition (never a timed guess); fail if proc
    ended first."""
    deadline = time.monotonic() + 120
    while not cond():
        if proc.poll() is not None:
            raise AssertionError("%s: process ended (rc %s) first"
                                 % (what, proc.returncode))
        if time.monotonic() > deadline:
            raise AssertionError("%s: not after 120 s" % what)
        time.sleep(0.01)


class KeyRotateTest(unittest.TestCase):

    def assert_mail(self, imap, expected):
        got = fetch_all(imap)
        for box in expected:
            self.assertEqual(sorted(got[box]), sorted(expected[box]), box)
            for uid, body in expected[box].items():
                self.assertEqual(got[box][uid], body,
                                 "%s uid %d differs" % (box, uid))

    def run_until_batch(self, dc, kill_at):
        """Start a rotation and SIGKILL it right after its kill_at-th
        batch reported. Returns the total rewrapped it reported."""
        proc = subprocess.Popen(
            dc.doveadm_command("-v", "casbox", "key", "rotate", "-u",
                               "user1", "--batch", str(BATCH)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # a safety net against a hung doveadm, not a synchronisation
        watchdog = threading.Timer(300, proc.kill)
        watchdog.start()
        total = None
        seen = []
        try:
            for line in proc.stderr:
                seen.append(line)
                m = BATCH_RE.search(line)
                if m and int(m.group(1)) == kill_at:
                    total = int(m.group(3))
                    proc.send_signal(signal.SIGKILL)
                    break
            proc.wait()
        finally:
            watchdog.cancel()
            proc.stdout.close()
            proc.stderr.close()
        if total is None:
            self.fail("rotate ended before batch %d (rc %s): %s"
                      % (kill_at, proc.returncode, "".join(seen)))
        self.assertEqual(proc.returncode, -signal.SIGKILL)
        return total

    def rotate_once(self, dc, key_path, kill_at, expected, old_imap,
                    reader_imap, extra_msgs, orig_root, gc=False):
        old_root, old_slots, old_id = read_key_file(key_path)
        self.assertEqual(old_root, orig_root)
        self.assertEqual(len(old_slots), 1)
        before = key_id_counts(dc)
        self.assertEqual(list(before), [old_id])
        records = before[old_id]
        with open(key_path, "rb") as f:
            old_image = f.read()

        # 1. killed after the kill_at-th batch
        total = self.run_until_batch(dc, kill_at)
        self.assertGreaterEqual(total, kill_at * BATCH)
        root, slots, new_id = read_key_file(key_path)
        self.assertEqual(root, orig_root, "the root never rotates")
        self.assertEqual(len(slots), 2, "rotation in progress")
        self.assertIn(old_id, slots)
        self.assertNotEqual(new_id, old_id)
        mid = key_id_counts(dc)
        self.assertEqual(set(mid), {old_id, new_id})
        self.assertGreaterEqual(mid[new_id], total)
        self.assertGreater(mid[old_id], 0, "the walk was not finished")
        self.assertEqual(mid[old_id] + mid[new_id], records)

        # a session whose key ring predates the rotation (it has not
        # read since) saves new mail under the new slot
        unique = ("From: a@example.com\r\nSubject: during %08x\r\n\r\n"
                  "appended while rotating to %08x\r\n"
                  % (old_id, new_id)).encode()
        data = ok(old_imap.append("INBOX", None, None, unique))
        uid = int(re.search(rb"APPENDUID \d+ (\d+)", data[0]).group(1))
        expected["INBOX"][uid] = unique
        self.assertEqual(key_id_counts(dc)[old_id], mid[old_id],
                         "a stale session wrapped with the old key")

        # 2. mid-rotation: all mail readable, by a new session and by
        # sessions that loaded the key file before the rotation began
        # (reader_imap only ever reads)
        self.assert_mail(reader_imap, expected)
        imap = dc.imap_login("user1")
        self.assert_mail(imap, expected)
        imap.logout()
        self.assert_mail(old_imap, expected)

        # 3. new deliveries wrap with the new slot; copies and
        # duplicates (dedup hits on old-key blobs) keep their records
        dc.lmtp_deliver_many("user1", extra_msgs)
        imap = dc.imap_login("user1")
        ok(imap.select("INBOX"))
        ok(imap.uid("COPY", "1:20", "Copies"))
        expected.update(fetch_all(imap))
        imap.logout()
        after = key_id_counts(dc)
        self.assertEqual(after[old_id], mid[old_id],
                         "a delivery during rotation used the old key")
        self.assertGreaterEqual(after[new_id], mid[new_id])

        # gc rewriting every pack mid-rotation re-encodes blobs with
        # fresh DEKs, wrapped with the new slot
        if gc:
            res = dc.doveadm("-f", "tab", "casbox", "gc", "-u", "user1",
                             "--all")
            moved = int(res.stdout.strip().split("\n")[1].split("\t")[2])
            self.assertGreater(moved, 0)
            after_gc = key_id_counts(dc)
            self.assertEqual(sum(after_gc.values()), sum(after.values()))
            self.assertLess(after_gc.get(old_id, 0), after[old_id])

        # 4. resume, racing more deliveries and copies
        proc = subprocess.Popen(
            dc.doveadm_command("-f", "tab", "casbox", "key", "rotate",
                               "-u", "user1", "--batch", str(BATCH)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        dc.lmtp_deliver_many("user1", extra_msgs[:10])
        imap = dc.imap_login("user1")
        ok(imap.select("INBOX"))
        ok(imap.uid("COPY", "1:10", "Copies"))
        imap.logout()
        out, err = proc.communicate(timeout=300)
        self.assertEqual(proc.returncode, 0, err)
        lines = out.strip().split("\n")
        row = dict(zip(lines[0].split("\t"), lines[1].split("\t")))
        self.assertEqual(row["result"], "rotated")
        self.assertEqual(int(row["old_key_id"], 16), old_id)
        self.assertEqual(int(row["new_key_id"], 16), new_id)

        root, slots, cur = read_key_file(key_path)
        self.assertEqual(root, orig_root)
        self.assertEqual(slots, [new_id], "old slot dropped")
        self.assertEqual(os.stat(key_path).st_mode & 0o777, 0o600)
        done = key_id_counts(dc)
        self.assertEqual(list(done), [new_id],
                         "no blob record keeps the old key id")

        imap = dc.imap_login("user1")
        expected.update(fetch_all(imap))
        imap.logout()
        # everything byte-identical, through a fresh session and the
        # session that predates every rotation
        imap = dc.imap_login("user1")
        self.assert_mail(imap, expected)
        imap.logout()
        self.assert_mail(old_imap, expected)

        # 5. the old key file no longer opens the rewrapped keys
        saved = key_path + ".new"
        st = os.stat(key_path)
        os.link(key_path, saved)
        with open(key_path + ".tmp", "wb") as f:
            f.write(old_image)
        os.chmod(key_path + ".tmp", 0o600)
        os.chown(key_path + ".tmp", st.st_uid, st.st_gid)
        os.rename(key_path + ".tmp", key_path)
        imap = dc.imap_login("user1")
        ok(imap.select("INBOX", readonly=True))
        try:
            typ, data = imap.uid("FETCH", "1", "(BODY.PEEK[])")
            got = [e for e in data if isinstance(e, tuple)]
            self.assertTrue(typ != "OK" or not got,
                            "old key file still reads mail")
            imap.logout()
        except imaplib.IMAP4.abort:
            # Dovecot ends the session when a literal it began to send
            # cannot be read: the log below says why
            pass
        pattern = r"wrapped by another key \(key id %08x" % new_id
        self.assertIsNotNone(dc.wait_log(pattern),
                             "no clear error for the old key file")
        os.rename(saved, key_path)
        imap = dc.imap_login("user1")
        self.assert_mail(imap, expected)
        imap.logout()
        return new_id

    def test_rotate_killed_and_resumed(self):
        msgs = load(corpus_files("usrp-users-3000", limit=300, step=9))
        extra = load(corpus_files("usrp-users-3000", limit=30, step=7))
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            dc.allow_log(r"wrapped by another key")
            dc.allow_log(r"killed with signal 9")
            dc.allow_log(r"FETCH|casbox")
            key_path = os.path.join(dc.home("user1"), "casbox.key")
            dc.lmtp_deliver_many("user1", msgs)
            imap = dc.imap_login("user1")
            ok(imap.create("Copies"))
            ok(imap.select("INBOX"))
            ok(imap.uid("COPY", "1:150", "Copies"))
            expected = fetch_all(imap)
            imap.logout()
            self.assertEqual(len(expected["INBOX"]), len(msgs))
            orig_root, slots, first_id = read_key_file(key_path)
            with open(key_path, "rb") as f:
                self.assertEqual(f.read(8), b"CASKEY1\x01")
            # the v1 file's implicit slot is what the blobs name
            self.assertEqual(list(key_id_counts(dc)), [first_id])

            # a session that lives through every rotation, its key
            # ring loaded before the first
            old_imap = dc.imap_login("user1")
            self.assert_mail(old_imap, expected)
            reader_imap = dc.imap_login("user1")
            self.assert_mail(reader_imap, expected)
            ids = [first_id]
            for kill_at, gc in ((1, False), (4, True), (11, False)):
                ids.append(self.rotate_once(dc, key_path, kill_at,
                                            expected, old_imap,
                                            reader_imap, extra, orig_root,
                                            gc))
            self.assert_mail(reader_imap, expected)
            old_imap.logout()
            reader_imap.logout()
            self.assertEqual(len(set(ids)), len(ids))
            # rotate is idempotent once done? A new run starts a new
            # rotation, so check resume only through the runs above;
            # scrub agrees the store is sound
            res = dc.doveadm("casbox", "scrub", "-u", "user1", check=False)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)

    def rotate_to_end(self, dc):
        res = dc.doveadm("-f", "tab", "casbox", "key", "rotate", "-u",
                         "user1", "--batch", str(BATCH))
        row = tab_row(res.stdout)
        self.assertEqual(row["result"], "rotated")
        return int(row["old_key_id"], 16), int(row["new_key_id"], 16)

    def lose_lsm_and_rebuild(self, dc, key_path, expected, messages):
        """The old slot is gone: rm -rf the LSM, rebuild it from the
        packs, every message byte-identical over IMAP."""
        root, slots, cur = read_key_file(key_path)
        self.assertEqual(len(slots), 1, "rotation finished")
        shutil.rmtree(os.path.join(dc.home("user1"), "casbox", "lsm"))
        res = dc.doveadm("-f", "tab", "casbox", "rebuild", "--from-packs",
                         "-u", "user1")
        row = tab_row(res.stdout)
        self.assertEqual(int(row["messages"]), messages, row)
        for field in ("lost_messages", "damaged_frames",
                      "unreadable_records"):
            self.assertEqual(int(row[field]), 0, row)
        self.assertEqual(list(key_id_counts(dc)), [cur])
        imap = dc.imap_login("user1")
        self.assert_mail(imap, expected)
        imap.logout()

    def test_rebuild_from_packs_after_rotation(self):
        """Rotations that drop the old slot, then the LSM lost: a
        finished rotation; one killed mid-way and resumed; one killed,
        then gc --all (every blob moved under a fresh DEK), then
        resumed. Each time rebuild --from-packs restores all mail."""
        msgs = load(corpus_files("usrp-users-3000", limit=200, step=13))
        extra = load(corpus_files("usrp-users-3000", limit=20, step=17))
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            dc.allow_log(r"killed with signal 9")
            key_path = os.path.join(dc.home("user1"), "casbox.key")
            dc.lmtp_deliver_many("user1", msgs)
            imap = dc.imap_login("user1")
            ok(imap.create("Copies"))
            ok(imap.select("INBOX"))
            ok(imap.uid("COPY", "1:60", "Copies"))
            expected = fetch_all(imap)
            imap.logout()
            messages = len(msgs) + 60

            # 1. rotated to the end in one run
            old_id, new_id = self.rotate_to_end(dc)
            self.assertNotIn(old_id, read_key_file(key_path)[1])
            self.lose_lsm_and_rebuild(dc, key_path, expected, messages)

            # 2. killed after its third batch, mail delivered in
            # between (wrapped with the new slot), then resumed
            total = self.run_until_batch(dc, 3)
            self.assertGreaterEqual(total, 3 * BATCH)
            dc.lmtp_deliver_many("user1", extra)
            messages += len(extra)
            self.rotate_to_end(dc)
            imap = dc.imap_login("user1")
            expected = fetch_all(imap)
            imap.logout()
            self.assertEqual(len(expected["INBOX"]) +
                             len(expected["Copies"]), messages)
            self.lose_lsm_and_rebuild(dc, key_path, expected, messages)

            # 3. killed, gc --all copies every live blob under a fresh
            # DEK (wrapped with the new slot), resumed
            self.run_until_batch(dc, 2)
            res = dc.doveadm("-f", "tab", "casbox", "gc", "-u", "user1",
                             "--all")
            self.assertGreater(int(tab_row(res.stdout)["blobs_moved"]), 0)
            self.rotate_to_end(dc)
            self.lose_lsm_and_rebuild(dc, key_path, expected, messages)

    def test_gc_spans_rotation_then_rebuild(self):
        """gc loads the key ring, then a rotation begins before gc
        copies: its copies are wrapped under the old slot, and step 2
        (under the LSM lock) rewraps them under the new one and writes a
        DEK update for each. The rotation finishes, the LSM is lost, and
        rebuild --from-packs still opens every message. The test holds
        the pack append lock to order the two (observed in /proc/locks,
        not timed)."""
        msgs = load(corpus_files("usrp-users-3000", limit=120, step=19))
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            key_path = os.path.join(dc.home("user1"), "casbox.key")
            lock_path = os.path.join(dc.home("user1"), "casbox", "packs",
                                     "pack.lock")
            dc.lmtp_deliver_many("user1", msgs)
            imap = dc.imap_login("user1")
            ok(imap.create("Copies"))
            expected = fetch_all(imap)
            imap.logout()
            old_slots = read_key_file(key_path)[1]

            fd = os.open(lock_path, os.O_RDWR)
            procs = []
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
                # gc: key ring loaded, census done, waits to append
                procs.append(subprocess.Popen(
                    dc.doveadm_command("-f", "tab", "casbox", "gc", "-u",
                                       "user1", "--all"),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True))
                wait_for(lambda: lock_waiters(lock_path) == 1,
                         "gc waits for the pack lock", procs[0])
                # the rotation writes its new slot, then its first
                # batch waits for the pack lock (holding the LSM lock)
                procs.append(subprocess.Popen(
                    dc.doveadm_command("-f", "tab", "casbox", "key",
                                       "rotate", "-u", "user1", "--batch",
                                       str(BATCH)),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True))
                wait_for(lambda: lock_waiters(lock_path) == 2,
                         "rotation waits for the pack lock", procs[1])
                self.assertEqual(len(read_key_file(key_path)[1]), 2)
            finally:
                os.close(fd)
            outs = [p.communicate(timeout=300) for p in procs]
            for p, (out, err) in zip(procs, outs):
                self.assertEqual(p.returncode, 0, err)
            gc = tab_row(outs[0][0])
            moved = int(gc["blobs_moved"])
            self.assertGreater(moved, 0)
            # one update per copy, and one more per copy rewrapped
            # for the rotation
            self.assertEqual(int(gc["dek_updates"]), 2 * moved, gc)
            self.assertEqual(tab_row(outs[1][0])["result"], "rotated")
            slots = read_key_file(key_path)[1]
            self.assertEqual(len(slots), 1)
            self.assertNotIn(old_slots[0], slots)
            self.lose_lsm_and_rebuild(dc, key_path, expected, len(msgs))

    def test_concurrent_rotates(self):
        """Two runs at once: each either joins the rotation in progress
        or starts the next; both succeed and the store ends on one
        slot that every blob record uses."""
        msgs = load(corpus_files("usrp-users-3000", limit=150, step=13))
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            key_path = os.path.join(dc.home("user1"), "casbox.key")
            dc.lmtp_deliver_many("user1", msgs)
            imap = dc.imap_login("user1")
            expected = {"INBOX": fetch_box(imap, "INBOX")}
            imap.logout()
            procs = [subprocess.Popen(
                dc.doveadm_command("-f", "tab", "casbox", "key", "rotate",
                                   "-u", "user1", "--batch", "4"),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
            for proc in procs:
                out, err = proc.communicate(timeout=300)
                self.assertEqual(proc.returncode, 0, err)
                self.assertIn("rotated", out)
            root, slots, cur = read_key_file(key_path)
            self.assertEqual(slots, [cur])
            self.assertEqual(list(key_id_counts(dc)), [cur])
            imap = dc.imap_login("user1")
            self.assertEqual(fetch_box(imap, "INBOX"), expected["INBOX"])
            imap.logout()

    def test_rotate_refusals(self):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            dc.allow_log(r"casbox")
            key_path = os.path.join(dc.home("user1"), "casbox.key")
            for bad in ("0", "abc", "-3"):
                res = dc.doveadm("casbox", "key", "rotate", "-u", "user1",
                                 "--batch", bad, check=False)
                self.assertEqual(res.returncode, 64, res.stderr)
                self.assertIn("--batch wants a positive number",
                              res.stderr)
            # no store yet
            res = dc.doveadm("casbox", "key", "rotate", "-u", "user1",
                             check=False)
            self.assertEqual(res.returncode, 68, res.stderr)
            self.assertFalse(os.path.exists(key_path))

            msg = b"From: a@example.com\r\nSubject: r\r\n\r\nbody\r\n"
            dc.lmtp_deliver("user1", msg)
            with open(key_path, "rb") as f:
                image = f.read()
            # another store's key file is refused and left alone
            other = os.path.join(dc.home("user1"), "other.key")
            os.rename(key_path, other)
            with open(key_path, "wb") as f:
                f.write(b"CASKEY1\x01" + os.urandom(32))
            # key files others can read are refused before anything
            # else: owner-only, owned by the mail user like the real one
            st = os.stat(other)
            os.chmod(key_path, 0o600)
            os.chown(key_path, st.st_uid, st.st_gid)
            with open(key_path, "r+b") as f:
                data = f.read()
                f.write(hashlib.blake2b(data, digest_size=32).digest())
            res = dc.doveadm("casbox", "key", "rotate", "-u", "user1",
                             check=False)
            self.assertEqual(res.returncode, 65, res.stderr)
            self.assertIn("is not the key of store", res.stderr)
            with open(key_path, "rb") as f:
                self.assertEqual(len(f.read()), 72)
            os.rename(other, key_path)
            # a damaged key file is refused by name
            with open(key_path, "r+b") as f:
                f.seek(20)
                f.write(bytes([image[20] ^ 1]))
            res = dc.doveadm("casbox", "key", "rotate", "-u", "user1",
                             check=False)
            self.assertEqual(res.returncode, 65, res.stderr)
            self.assertIn("checksum mismatch", res.stderr)
            with open(key_path, "r+b") as f:
                f.seek(20)
                f.write(image[20:21])
            # and the real key rotates
            res = dc.doveadm("-f", "tab", "casbox", "key", "rotate",
                             "-u", "user1")
            self.assertIn("rotated", res.stdout)
            root, slots, cur = read_key_file(key_path)
            self.assertEqual(root, image[8:40])
            self.assertEqual(len(slots), 1)
            self.assertNotEqual(cur, kdf_key_id(root))
            imap = dc.imap_login("user1")
            self.assertEqual(fetch_box(imap, "INBOX")[1].split(b"\r\n\r\n",
                                                              1)[1],
                             b"body\r\n")
            imap.logout()


if __name__ == "__main__":
    unittest.main()
