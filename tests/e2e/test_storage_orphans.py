"""Orphan records: a save killed (kill -9) after its LSM commit and
before its index commit leaves a message record with a UID the index
never got. The next open of the mailbox releases it under the index
sync lock (its blobs' references too), the acknowledged mail stays; a
save that is merely slow inside that window (another process holds the
lock) is never mistaken for one.

The kill lands at a chosen syscall with strace's fault injection: the
second fdatasync() of a delivery is the LSM WAL's (the first is the
pack's), after which the index log is written. strace only places the
SIGKILL (or the SIGSTOP that holds a save in the window); what is
checked is the state casbox leaves."""

import imaplib
import os
import re
import shutil
import signal
import smtplib
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, ok  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
# one LMTP process, so the traced one is the one serving the session
CONF = ("lmtp_add_received_header = no\n"
        "service lmtp {\n  process_limit = 1\n}\n")
STRACE = shutil.which("strace")


def msg(n):
    return (b"From: a@example.com\r\nSubject: orphan %d\r\n"
            b"Message-ID: <%d@orphan>\r\n\r\n" % (n, n)
            + b"body line %d\r\n" % n * 2000)


def storage_dump(dc):
    exe = os.path.join(os.environ.get("CASBOX_TOP_BUILDDIR", "."),
                       "tests", "storage-dump")
    root = os.path.join(dc.home("user1"), "casbox")
    return subprocess.run([exe, root], user=dc.uid, group=dc.gid,
                          capture_output=True, text=True)


def record_uids(dump):
    return sorted(int(m.group(1)) for m in
                  re.finditer(r"^m \S+ (\d+) ", dump, re.M))


def box_record_counts(dump):
    """Message records per mailbox (storage id) in a storage-dump."""
    counts = {}
    for m in re.finditer(r"^m (\S+) \d+ ", dump, re.M):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def proc_state(pid):
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def waits_for_lock(pid, inode):
    """Whether pid is blocked waiting for a lock on the file with this
    inode: /proc/locks shows a waiter as "N: -> POSIX ADVISORY WRITE
    <pid> <maj>:<min>:<inode> ..."."""
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 5 and fields[1] == "->" and \
               int(fields[5]) == pid and \
               int(fields[6].rsplit(":", 1)[1]) == inode:
                return True
    return False


def wait_traced(pid, strace):
    """Block until strace (a Popen) traces pid: a traced process shows
    the tracer in /proc/PID/status."""
    while True:
        with open("/proc/%d/status" % pid) as f:
            tracer = re.search(r"^TracerPid:\s+(\d+)", f.read(), re.M)
        if int(tracer.group(1)) == strace.pid:
            return
        if strace.poll() is not None:
            raise AssertionError("strace failed: %s" % strace.stderr.read())


class LmtpSession:
    """An LMTP connection whose serving process runs under strace with
    one injected action on the nth fdatasync(). With trace, strace's
    output is readable from self.strace.stdout."""

    def __init__(self, dc, inject, trace=False):
        self.dc = dc
        self.lmtp = smtplib.LMTP("127.0.0.1", dc.lmtp_port, timeout=60)
        self.lmtp.ehlo()
        pids = dc.pids("lmtp")
        if len(pids) != 1:
            raise AssertionError("not one lmtp process: %r" % pids)
        self.pid = pids[0]
        # -o: strace's own output; "attached" on stderr says it is in
        self.strace = subprocess.Popen(
            [STRACE, "-qq", "-p", str(self.pid), "-e", "trace=fdatasync",
             "-e", "inject=fdatasync:%s" % inject,
             "-o", "/dev/stdout" if trace else os.devnull],
            stdout=subprocess.PIPE if trace else None,
            stderr=subprocess.PIPE)
        self.wait_attached()

    def wait_trace_line(self, text):
        """Block until strace reports text (it has seen it happen)."""
        for line in self.strace.stdout:
            if text in line:
                return
        raise AssertionError("strace ended before %r: %s"
                             % (text, self.strace.stderr.read()))

    def wait_attached(self):
        wait_traced(self.pid, self.strace)

    def close(self):
        try:
            self.lmtp.close()
        finally:
            # a surviving process stays traced until strace detaches
            if self.strace.poll() is None:
                self.strace.terminate()
            self.strace.wait(timeout=60)


@unittest.skipIf(STRACE is None, "strace not installed")
class OrphanRecordTest(unittest.TestCase):

    def test_kill9_between_lsm_and_index_commit(self):
        with Dovecot(plugin_settings=KEYS, extra_conf=CONF) as dc:
            dc.allow_log(r"killed with signal 9")
            dc.lmtp_deliver_many("user1", [msg(1), msg(2)])

            sess = LmtpSession(dc, "signal=SIGKILL:when=2")
            with self.assertRaises((smtplib.SMTPException, OSError)):
                sess.lmtp.sendmail("s@example.com", ["user1"], msg(3))
            sess.close()

            # the crash state: a record for UID 3, an index ending at 2
            res = storage_dump(dc)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            self.assertEqual(record_uids(res.stdout), [1, 2, 3])

            imap = dc.imap_login("user1")
            self.assertEqual(int(ok(imap.select("INBOX"))[0]), 2)
            res = storage_dump(dc)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            self.assertEqual(record_uids(res.stdout), [1, 2])
            released = (r"Released 1 message records at or above next "
                        r"UID 3 \(UIDs 3\.\.3\)")
            self.assertIsNotNone(dc.wait_log(released))
            self.assertEqual(len(re.findall(released, dc.log_text())), 1)

            # the UID was never shown to anyone: the next save takes it
            dc.lmtp_deliver("user1", msg(4))
            ok(imap.noop())
            data = ok(imap.uid("FETCH", "1:*", "(UID BODY.PEEK[])"))
            bodies = [x[1] for x in data if isinstance(x, tuple)]
            self.assertEqual(len(bodies), 3)
            for body, n in zip(bodies, (1, 2, 4)):
                self.assertTrue(body.endswith(msg(n)[-200:]), n)
            self.assertIn(b"UID 3 ", data[-2][0])
            imap.logout()
            res = storage_dump(dc)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            self.assertEqual(record_uids(res.stdout), [1, 2, 3])
            # the orphan's blobs were released: only the 3 messages'
            # parts are referenced
            self.assertNotIn("refcount-mismatch", res.stdout)

    def test_slow_save_in_the_window_is_not_an_orphan(self):
        with Dovecot(plugin_settings=KEYS, extra_conf=CONF,
                     mail_debug=True) as dc:
            dc.lmtp_deliver("user1", msg(1))
            imap = dc.imap_login("user1")
            imap_pids = dc.pids("imap")
            self.assertEqual(len(imap_pids), 1)
            index_log = os.stat(os.path.join(
                dc.home("user1"), "casbox", "mailboxes", "INBOX",
                "casbox-Mails", "dovecot.index.log")).st_ino
            # the delivery stops (SIGSTOP) right after its LSM commit,
            # holding the index sync lock, until the test continues it
            sess = LmtpSession(dc, "signal=SIGSTOP:when=2", trace=True)
            result = {}

            def deliver():
                try:
                    result["refused"] = sess.lmtp.sendmail(
                        "s@example.com", ["user1"], msg(2))
                except Exception as e:  # noqa: BLE001
                    result["error"] = e
                finally:
                    # a delivery that never stopped must not leave
                    # wait_trace_line() reading forever
                    sess.strace.terminate()
            t = threading.Thread(target=deliver)
            t.start()
            # the state, not a time: stopped, the record in the LSM,
            # the index without it
            sess.wait_trace_line(b"--- stopped by SIGSTOP ---")
            self.assertIn(proc_state(sess.pid), ("t", "T"))
            self.assertEqual(record_uids(storage_dump(dc).stdout), [1, 2])

            selected = {}

            def select():
                try:
                    selected["exists"] = int(ok(imap.select("INBOX"))[0])
                except Exception as e:  # noqa: BLE001
                    selected["error"] = e
            s = threading.Thread(target=select)
            s.start()
            # SELECT sees the record above next UID and waits for the
            # index lock the stopped delivery holds
            while not waits_for_lock(imap_pids[0], index_log):
                self.assertTrue(s.is_alive(), selected)
            self.assertTrue(t.is_alive(), result)
            os.kill(sess.pid, signal.SIGCONT)
            t.join()
            s.join()
            sess.close()
            self.assertEqual(result, {"refused": {}})
            # SELECT waited for the lock, so it saw the save committed
            self.assertEqual(selected, {"exists": 2})
            self.assertIsNotNone(dc.wait_log(
                r"Records at or above next UID 2: syncing under "
                r"the index lock"))
            self.assertNotIn("Released", dc.log_text())
            data = ok(imap.uid("FETCH", "2", "BODY.PEEK[]"))
            self.assertTrue(data[0][1].endswith(msg(2)[-200:]))
            imap.logout()
            res = storage_dump(dc)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            self.assertEqual(record_uids(res.stdout), [1, 2])

    def test_kill9_mid_chunked_copy(self):
        """A COPY past CASBOX_STORE_TXN_CHECKPOINT_SIZE (1 MiB of records)
        commits its records in chunks before the index gets the UIDs.
        kill -9 once the first chunk is durable: no copy is visible, the
        next open releases the chunk's records (refcounts exact after),
        and the COPY then goes through whole."""
        count = 6400
        with Dovecot(plugin_settings=KEYS) as dc:
            dc.allow_log(r"killed with signal 9")
            imap = dc.imap_login("user1")
            for n in range(50):
                ok(imap.append("INBOX", None, None,
                               b"From: a@example.com\r\nSubject: c%d\r\n"
                               b"\r\ncopy body %d\r\n" % (n, n)))
            done = 50
            ok(imap.select("INBOX"))
            while done < count:
                ok(imap.copy("1:%d" % done, "INBOX"))
                done *= 2
            ok(imap.create("Dest"))
            pids = dc.pids("imap")
            self.assertEqual(len(pids), 1)
            # the first fdatasync() of the COPY's commit is its first
            # chunk's WAL record; the kill lands on the next one
            strace = subprocess.Popen(
                [STRACE, "-qq", "-p", str(pids[0]), "-e", "trace=fdatasync",
                 "-e", "inject=fdatasync:signal=SIGKILL:when=2",
                 "-o", os.devnull], stderr=subprocess.PIPE)
            try:
                wait_traced(pids[0], strace)
                with self.assertRaises((imaplib.IMAP4.abort, OSError)):
                    imap.copy("1:*", "Dest")
            finally:
                imap.sock.close()
                strace.wait(timeout=60)
                strace.stderr.close()

            # the crash state: part of the copies' records in the LSM,
            # the index without any of them
            res = storage_dump(dc)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            boxes = box_record_counts(res.stdout)
            self.assertEqual(sorted(boxes.values())[-1], count, boxes)
            self.assertEqual(len(boxes), 2, boxes)
            self.assertGreater(min(boxes.values()), 0, boxes)
            self.assertLess(min(boxes.values()), count, boxes)

            imap = dc.imap_login("user1")
            self.assertEqual(int(ok(imap.select("Dest"))[0]), 0)
            self.assertIsNotNone(dc.wait_log(
                r"Released %d message records at or above next UID 1 "
                % min(boxes.values())))
            res = storage_dump(dc)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            self.assertEqual(list(box_record_counts(res.stdout).values()),
                             [count])
            self.assertNotIn("refcount-mismatch", res.stdout)

            ok(imap.select("INBOX"))
            ok(imap.copy("1:*", "Dest"))
            self.assertEqual(int(ok(imap.select("Dest"))[0]), count)
            data = ok(imap.uid("FETCH", "%d" % count, "BODY.PEEK[]"))
            self.assertTrue(data[0][1].endswith(b"copy body 49\r\n"))
            imap.logout()
            res = storage_dump(dc)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            self.assertEqual(sorted(box_record_counts(res.stdout).values()),
                             [count, count])
            self.assertNotIn("refcount-mismatch", res.stdout)


if __name__ == "__main__":
    unittest.main()
