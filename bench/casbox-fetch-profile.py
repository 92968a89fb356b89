#!/usr/bin/env python3
"""perf profile of the imap process's UID FETCH 1:* (BODY.PEEK[]).

Delivers N corpus messages to one peer of casbox-fetch.py (fresh
Dovecot, e2e harness), then on one IMAP connection runs the FETCH
once to warm the page cache (unless --cold) and, with `perf record -g -p <imap pid>`
attached, --reps more times. Also prints casbox's base-cache traffic
as counted by the same FETCHes (CPU ms per MB, as casbox-fetch.py).

  CASBOX_TOP_BUILDDIR=build python3 bench/casbox-fetch-profile.py \
      --peer casbox -n 1000 -o /tmp/casbox.perf.data
  perf report -i /tmp/casbox.perf.data --no-children --sort dso,sym
"""

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

from dovecot_harness import Dovecot, PASSWORD  # noqa: E402
from imapraw import RawIMAP  # noqa: E402

spec = importlib.util.spec_from_file_location(
    "casbox_fetch", os.path.join(HERE, "casbox-fetch.py"))
cf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cf)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--folder", default="usrp-users-3000")
    ap.add_argument("--peer", default="casbox",
                    help="one of %s; peer@builddir: that build's plugins"
                    % ", ".join(sorted(cf.PEERS)))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--cold", action="store_true",
                    help="no FETCH before perf: the first one in the "
                    "process (empty base cache), as a client's sync")
    ap.add_argument("-o", "--output", default="/tmp/casbox.perf.data")
    ap.add_argument("--call-graph", default="fp",
                    help="perf record --call-graph (fp, dwarf)")
    ap.add_argument("--freq", default="999",
                    help="perf record -F; 0: -c 1 (every event, to count"
                    " the calls of uprobes given with -e)")
    ap.add_argument("-e", "--event", action="append", default=[],
                    help="perf record -e (e.g. a uprobe)")
    ap.add_argument("--strace", action="store_true",
                    help="strace -c -f instead of perf: the system calls"
                    " of the FETCHes (written to OUTPUT)")
    args = ap.parse_args()

    peer, _, builddir = args.peer.partition("@")
    if builddir:
        cf.dovecot_harness.TOP_BUILDDIR = builddir
    msgs = cf.load(args.folder, args.n)
    with Dovecot(**cf.PEERS[peer]) as dc:
        dc.lmtp_deliver_many(cf.USER, msgs)
        with RawIMAP(dc.imap_port) as c:
            c.login(cf.USER, PASSWORD)
            c.select("INBOX")
            if not args.cold:
                c.fetch_bodies("1:*", lambda uid, body: None)
            pids = dc.pids("imap")
            assert len(pids) == 1, pids
            if args.strace:
                cmd = ["strace", "-c", "-f", "-o", args.output]
            else:
                cmd = (["perf", "record", "-q", "--call-graph",
                        args.call_graph] +
                       (["-F", args.freq] if args.freq != "0" else
                        ["-c", "1"]) +
                       sum((["-e", e] for e in args.event), []) +
                       ["-o", args.output])
            perf = subprocess.Popen(cmd + ["-p", str(pids[0])],
                                    stdout=subprocess.DEVNULL)
            time.sleep(1)
            cpu0 = cf.service_cpu_s(dc, "imap")
            t0 = time.perf_counter()
            fetched = 0
            for _ in range(args.reps):
                fetched += c.fetch_bodies("1:*", lambda uid, body: None)
            wall = time.perf_counter() - t0
            cpu = cf.service_cpu_s(dc, "imap") - cpu0
            perf.send_signal(signal.SIGINT)
            perf.wait(timeout=60)
    print("%s: %.1f MB in %.2f s, %.1f MB/s, imap %.2f CPU ms/MB" % (
        args.peer, fetched / 1e6, wall, fetched / 1e6 / wall,
        cpu * 1000 / (fetched / 1e6)))


if __name__ == "__main__":
    main()
