#!/usr/bin/env python3
"""System calls (strace) or a CPU profile (perf record) of the one lmtp
process that delivers N usrp-users messages over one LMTP connection,
on the e2e harness with the settings of bench/casbox-build-ab.py
(`mail_fsync = optimized`, Dovecot's stats service on). The process is
the one holding the connection's socket; the first delivery (which
creates the store) is made before tracing starts.

  python3 bench/casbox-lmtp-trace.py -n 600 --build build -o /tmp/t.txt
  python3 bench/casbox-lmtp-trace.py -n 600 --build build --sdbox \\
      -o /tmp/sdbox.txt
  python3 bench/casbox-lmtp-trace.py -n 300 --build build --perf \\
      -o /tmp/lmtp.data

strace mode prints the system calls per delivery (from the first to the
last "250 2.0.0" reply, so setup is not counted), in all and without
the socket and event loop calls, and the 25 most frequent. Tracing
slows the process down: use it for counts, not for time.
"""

import argparse
import collections
import os
import re
import signal
import smtplib
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
import dovecot_harness  # noqa: E402
from dovecot_harness import Dovecot, corpus_files  # noqa: E402

STATS_ON = "stats_writer_socket_path = stats-writer\n"
SOCKET_CALLS = ("setsockopt", "epoll_ctl", "epoll_wait", "read", "write")


def connection_pid(dc, lmtp):
    """The lmtp process at the server end of lmtp's connection."""
    cport = lmtp.sock.getsockname()[1]
    inode = None
    with open("/proc/net/tcp") as f:
        for line in f.read().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == dc.lmtp_port and \
                    int(fields[2].split(":")[1], 16) == cport:
                inode = fields[9]
    for pid in dc.pids("lmtp"):
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                if os.readlink("/proc/%d/fd/%s" % (pid, fd)) == \
                        "socket:[%s]" % inode:
                    return pid
            except OSError:
                pass
    raise RuntimeError("no lmtp process has the connection")


def wait_attached(out, perf, timeout=30):
    """Until the tracer is attached: strace says so on stderr, perf
    record has written its file header."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if perf:
            if os.path.exists(out) and os.path.getsize(out) > 0:
                return
        else:
            with open(out + ".err") as f:
                if "attached" in f.read():
                    return
        time.sleep(0.05)
    raise RuntimeError("tracer did not attach within %d s" % timeout)


def tally(path):
    """System calls per delivery of an strace -tt output file."""
    with open(path) as f:
        lines = f.read().splitlines()
    ends = [i for i, line in enumerate(lines)
            if re.search(r'write\(\d+, "250 2\.0\.0 ', line)]
    counts = collections.Counter()
    for line in lines[ends[0] + 1:ends[-1] + 1]:
        m = re.match(r"^\d+ +[\d:.]+ (\w+)\(", line)
        if m:
            counts[m.group(1)] += 1
    n = len(ends) - 1
    total = sum(counts.values())
    sock = sum(counts[c] for c in SOCKET_CALLS)
    print("%d deliveries: %.1f system calls per delivery, %.1f without "
          "%s" % (n, total / n, (total - sock) / n, "/".join(SOCKET_CALLS)))
    for name, count in counts.most_common(25):
        print("  %-14s %7.2f" % (name, count / n))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=600, help="messages")
    ap.add_argument("--build", required=True, help="build tree")
    ap.add_argument("--sdbox", action="store_true", help="sdbox instead")
    ap.add_argument("--perf", action="store_true",
                    help="perf record -g instead of strace")
    ap.add_argument("-o", dest="out", required=True, help="output file")
    args = ap.parse_args()
    dovecot_harness.TOP_BUILDDIR = os.path.abspath(args.build)
    msgs = []
    for path in corpus_files("usrp-users-3000", limit=args.n + 1,
                             step=max(1, 3000 // (args.n + 1))):
        with open(path, "rb") as f:
            msgs.append(f.read())
    kw = {"mail_location": "sdbox:~/sdbox"} if args.sdbox else {}
    with Dovecot(plugin_settings={"casbox_key_file": "%h/casbox.key",
                                  "casbox_key_autocreate": "yes"},
                 extra_conf="mail_fsync = optimized\n" + STATS_ON,
                 **kw) as dc:
        dc.lmtp_deliver("user1", msgs[0])
        with smtplib.LMTP("127.0.0.1", dc.lmtp_port, timeout=300) as lmtp:
            lmtp.noop()
            pid = str(connection_pid(dc, lmtp))
            if args.perf:
                cmd = ["perf", "record", "-g", "-F", "2999", "-p", pid,
                       "-o", args.out]
            else:
                cmd = ["strace", "-f", "-tt", "-p", pid, "-o", args.out]
            with open(args.out + ".err", "w") as err:
                tracer = subprocess.Popen(cmd, stderr=err)
                wait_attached(args.out, args.perf)
                for msg in msgs[1:]:
                    lmtp.sendmail("s@example.com", ["user1"], msg)
                tracer.send_signal(signal.SIGINT)
                tracer.wait()
    if not args.perf:
        tally(args.out)


if __name__ == "__main__":
    main()
