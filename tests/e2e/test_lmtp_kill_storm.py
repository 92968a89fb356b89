"""kill -9 of the delivering LMTP process, many times in one run: every
acknowledged (250) message is stored, every stored message is byte-exact,
and the store's refcounts and scrub are clean afterwards.

Each delivery gets its own LMTP connection. Once the server has answered
LHLO, the test knows which lmtp process serves the connection (the
socket's inode in /proc/net/tcp, found among the lmtp processes' fds)
and arms a timer that kills exactly that process at a random moment
around the DATA transfer and save. Killing idle processes instead
would mostly test Dovecot's master throttling a service whose
processes die before they serve anyone.

CASBOX_KILL_COUNT (300 in CI) sets how many kills to make; several
deliveries run at once (CASBOX_KILL_SENDERS, 3). doc/testing.md has the
1,000-kill run and its numbers."""

import os
import random
import re
import signal
import smtplib
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files, crlf, load  # noqa: E402

USER = "user1"
KILLS = int(os.environ.get("CASBOX_KILL_COUNT", "300"))
SENDERS = int(os.environ.get("CASBOX_KILL_SENDERS", "3"))
# a bound on the whole run, far above what KILLS needs
DEADLINE_SECONDS = float(os.environ.get("CASBOX_KILL_SECONDS", "600"))
KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
# service_count = 1: the lmtp processes the test does not kill exit
# cleanly after their client, and a service with clean exits is not
# throttled for processes that die young (Dovecot's master otherwise
# throttles lmtp after a few kills in one second: it cannot tell a kill
# from a process that fails at startup)
CONF = """lmtp_add_received_header = no
service lmtp {
  service_count = 1
}
"""
TAG_RE = re.compile(rb"X-Kill: (\d+)\r\n")


def server_pid(dc, client_port):
    """The lmtp process holding the server end of the connection from
    client_port, or None."""
    local = "0100007F:%04X" % dc.lmtp_port
    remote = "0100007F:%04X" % client_port
    inode = None
    with open("/proc/net/tcp") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 9 and fields[1] == local and \
                    fields[2] == remote:
                inode = fields[9]
                break
    if inode is None:
        return None
    want = "socket:[%s]" % inode
    for pid in dc.pids("lmtp"):
        try:
            for fd in os.listdir("/proc/%d/fd" % pid):
                if os.readlink("/proc/%d/fd/%s" % (pid, fd)) == want:
                    return pid
        except OSError:
            continue
    return None


class Storm:
    """Deliveries with kills, shared by the sender threads."""

    def __init__(self, dc, msgs):
        self.dc, self.msgs = dc, msgs
        self.lock = threading.Lock()
        self.next = 0
        self.kills = 0
        self.acked = set()
        self.refused = []
        self.no_pid = 0
        self.connect_failures = []
        self.deadline = time.monotonic() + DEADLINE_SECONDS

    def message(self, serial):
        return (b"X-Kill: %d\r\n" % serial +
                self.msgs[serial % len(self.msgs)])

    def take(self):
        with self.lock:
            if self.kills >= KILLS or time.monotonic() > self.deadline:
                return None
            self.next += 1
            return self.next

    def kill(self, pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        with self.lock:
            self.kills += 1

    def deliver(self, serial, rnd):
        try:
            lmtp = smtplib.LMTP("127.0.0.1", self.dc.lmtp_port, timeout=60)
        except (OSError, smtplib.SMTPException) as e:
            with self.lock:
                self.connect_failures.append(repr(e)[:200])
            return
        timer = None
        try:
            lmtp.ehlo_or_helo_if_needed()
            pid = server_pid(self.dc, lmtp.sock.getsockname()[1])
            if pid is None:
                with self.lock:
                    self.no_pid += 1
            elif rnd.random() < 0.85:
                # around DATA and the save: before, during or just
                # after the reply (fault injection, not synchronisation)
                timer = threading.Timer(rnd.uniform(0, 0.03), self.kill,
                                        args=(pid,))
                timer.start()
            refused = lmtp.sendmail("s@example.com", [USER],
                                    self.message(serial))
            if refused:
                with self.lock:
                    self.refused.append((serial, refused))
            else:
                with self.lock:
                    self.acked.add(serial)
        except (OSError, smtplib.SMTPException):
            pass  # killed before the reply: not acknowledged
        finally:
            if timer is not None:
                timer.join()
            lmtp.close()

    def sender(self, seed):
        rnd = random.Random(seed)
        while True:
            serial = self.take()
            if serial is None:
                return
            self.deliver(serial, rnd)


class LmtpKillStormTest(unittest.TestCase):

    def test_kill9_storm(self):
        msgs = [crlf(m) for m in load(
            p for p in corpus_files("usrp-users-3000", limit=200, step=11)
            if os.path.getsize(p) < 512 * 1024)]
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS, extra_conf=CONF) as dc:
            dc.allow_log(r"killed with signal 9")
            dc.lmtp_deliver(USER, msgs[0])
            storm = Storm(dc, msgs)
            start = time.monotonic()
            threads = [threading.Thread(target=storm.sender, args=(s,))
                       for s in range(SENDERS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.monotonic() - start
            self.assertEqual(storm.refused, [])
            self.assertEqual(storm.connect_failures, [])
            self.assertGreaterEqual(storm.kills, KILLS)
            self.assertGreater(len(storm.acked), KILLS // 10)

            imap = dc.imap_login(USER)
            imap.select("INBOX", readonly=True)
            typ, data = imap.uid("FETCH", "1:*", "(BODY.PEEK[])")
            imap.logout()
            stored, wrong = {}, []
            for item in data:
                if not isinstance(item, tuple):
                    continue
                body = bytes(item[1])
                m = TAG_RE.search(body)
                if m is None:
                    # the first delivery, untagged (LMTP puts its
                    # Return-Path and Delivered-To before the message)
                    if not body.endswith(msgs[0]):
                        wrong.append(item[0][:40])
                    continue
                serial = int(m.group(1))
                stored[serial] = stored.get(serial, 0) + 1
                if not body.endswith(storm.message(serial)):
                    wrong.append(serial)
            lost = sorted(storm.acked - set(stored))
            twice = sorted(s for s, n in stored.items() if n > 1)
            print("\nkill -9 storm: %d kills, %d deliveries tried, "
                  "%d acknowledged, %d stored, %d lost, %d wrong, "
                  "%d doubled, %d without a found pid, %.1f s"
                  % (storm.kills, storm.next, len(storm.acked), len(stored),
                     len(lost), len(wrong), len(twice), storm.no_pid,
                     elapsed), file=sys.stderr)
            self.assertEqual(lost, [], "acknowledged messages lost")
            self.assertEqual(wrong, [], "messages with wrong bytes")
            self.assertEqual(twice, [], "one delivery stored twice")

            self.assertEqual(dc.casbox_audit(USER), [])


if __name__ == "__main__":
    unittest.main()
