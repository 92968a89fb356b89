#!/usr/bin/env python3
"""First FETCH of fresh imap processes: CPU ms per MB, many samples.

casbox-fetch.py measures one first FETCH per round (a fresh Dovecot and
a delivery each), about 0.2 s of imap CPU: on the shared 2-core machine
one sample moved by 50 % (sdbox 2.03-3.05 ms/MB in three rounds). This
delivers the N messages once per peer (all peers' Dovecots up at the
same time), then --samples times, peers interleaved, logs in on a new
connection (a new imap process: service_count = 1), and takes that
process's on-CPU time (schedstat) over UID FETCH 1:* (UID BODY.PEEK[]). Prints
median and min per peer (interference only adds CPU, so min is the
steadiest) and each peer's ratio to the first.

  cd build && CASBOX_TOP_BUILDDIR=$PWD CASBOX_TOP_SRCDIR=.. \\
      python3 ../bench/casbox-fetch-fresh.py -n 1000 --samples 15 \\
      --peers casbox@/tmp/before-build,casbox
"""

import argparse
import contextlib
import importlib.util
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

from dovecot_harness import Dovecot, PASSWORD  # noqa: E402
from imapraw import RawIMAP  # noqa: E402

spec = importlib.util.spec_from_file_location(
    "casbox_fetch", os.path.join(HERE, "casbox-fetch.py"))
cf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cf)


def cpu_seconds(pid):
    """on-CPU time of a process in seconds, from /proc/PID/schedstat
    (nanoseconds; /proc/PID/stat's utime + stime count 10 ms ticks,
    5 % of one FETCH's 0.2 s)"""
    with open("/proc/%d/schedstat" % pid) as f:
        return int(f.read().split()[0]) / 1e9


def one_sample(dc):
    """imap CPU seconds and bytes of one first FETCH in a new process"""
    before = set(dc.pids("imap"))
    with RawIMAP(dc.imap_port) as c:
        c.login(cf.USER, PASSWORD)
        c.select("INBOX")
        new = [p for p in dc.pids("imap") if p not in before]
        assert len(new) == 1, new
        cpu0 = cpu_seconds(new[0])
        total = c.fetch_bodies("1:*", lambda uid, body: None)
        cpu = cpu_seconds(new[0]) - cpu0
    return cpu, total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=1000, help="messages")
    ap.add_argument("--folder", default="usrp-users-3000")
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--peers", default="sdbox,casbox",
                    help="comma-separated peers of casbox-fetch.py;"
                    " peer@builddir: that build's plugins")
    args = ap.parse_args()

    msgs = cf.load(args.folder, args.n)
    peers = args.peers.split(",")
    results = {p: [] for p in peers}
    with contextlib.ExitStack() as stack:
        dcs = {}
        for p in peers:
            peer, _, builddir = p.partition("@")
            cf.dovecot_harness.TOP_BUILDDIR = (builddir or
                                               cf.DEFAULT_BUILDDIR)
            dcs[p] = stack.enter_context(Dovecot(**cf.PEERS[peer]))
            dcs[p].lmtp_deliver_many(cf.USER, msgs)
        for s in range(args.samples):
            order = peers if s % 2 == 0 else list(reversed(peers))
            for p in order:
                cpu, total = one_sample(dcs[p])
                results[p].append(cpu * 1000 / (total / 1e6))
            print("sample %d %s" % (s + 1, " ".join(
                "%s=%.2f" % (p, results[p][-1]) for p in peers)),
                flush=True)
    print("\nimap CPU ms/MB of a first FETCH, %d samples, %d messages"
          % (args.samples, len(msgs)))
    base = peers[0]
    for p in peers:
        med, mn = statistics.median(results[p]), min(results[p])
        print("%-40s median %.2f  min %.2f  (ratio to %s: %.3f / %.3f)"
              % (p, med, mn, base, med / statistics.median(results[base]),
                 mn / min(results[base])))


if __name__ == "__main__":
    main()
