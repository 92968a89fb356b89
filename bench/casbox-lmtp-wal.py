#!/usr/bin/env python3
"""LMTP delivery cost against the LSM's WAL size (casbox_lsm_wal_size),
with sdbox as the control, A/B interleaved on the e2e harness.

Every LMTP delivery opens the user's store, and opening the LSM replays
its whole write-ahead log into a memtable, so the CPU a delivery costs
grows with the WAL until the WAL is flushed into a table. Per round and
variant: a fresh Dovecot, N usrp-users messages delivered over one LMTP
connection, and the lmtp process's CPU time (utime + stime from
/proc/PID/stat) per delivery, plus deliveries per second. Speed is
reported, never asserted.

  CASBOX_TOP_BUILDDIR=build python3 bench/casbox-lmtp-wal.py \\
      -n 1600 --rounds 2 --wal 4M,256k
"""

import argparse
import os
import smtplib
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
from dovecot_harness import Dovecot, corpus_files  # noqa: E402
from stats import cpu_seconds  # noqa: E402


def one_run(wal, msgs):
    """(ms of lmtp CPU per delivery, deliveries/s); wal None = sdbox."""
    conf = dict(extra_conf="mail_fsync = optimized\n")
    if wal is None:
        conf.update(mail_location="sdbox:~/sdbox", mail_plugins=[])
    else:
        conf.update(plugin_settings={"casbox_key_file": "%h/casbox.key",
                                     "casbox_key_autocreate": "yes",
                                     "casbox_lsm_wal_size": wal})
    with Dovecot(**conf) as dc:
        dc.lmtp_deliver("user1", msgs[0])
        with smtplib.LMTP("127.0.0.1", dc.lmtp_port, timeout=120) as lmtp:
            lmtp.noop()
            # the first delivery's process may still be there, idle:
            # the CPU of every lmtp process is counted
            pids = dc.pids("lmtp")
            cpu0, t0 = sum(map(cpu_seconds, pids)), time.monotonic()
            for msg in msgs:
                lmtp.sendmail("s@example.com", ["user1"], msg)
            cpu1, t1 = sum(map(cpu_seconds, pids)), time.monotonic()
    return (cpu1 - cpu0) * 1000 / len(msgs), len(msgs) / (t1 - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=1600, help="messages")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--wal", default="4M,256k",
                    help="casbox_lsm_wal_size values, comma-separated")
    args = ap.parse_args()
    msgs = []
    for path in corpus_files("usrp-users-3000", limit=args.n):
        with open(path, "rb") as f:
            msgs.append(f.read())
    variants = [w for w in args.wal.split(",") if w] + [None]
    results = {v: [] for v in variants}
    for rnd in range(args.rounds):
        order = variants if rnd % 2 == 0 else variants[::-1]
        for wal in order:
            results[wal].append(one_run(wal, msgs))
    print("%d deliveries, %d rounds (median [min-max])" %
          (len(msgs), args.rounds))
    sd_cpu = statistics.median(c for c, _ in results[None])
    for wal in variants:
        cpus = [c for c, _ in results[wal]]
        rates = [r for _, r in results[wal]]
        name = "sdbox" if wal is None else "casbox wal=%s" % wal
        print("%-18s %5.2f ms CPU/delivery [%.2f-%.2f] x sdbox %.2f, "
              "%4.0f deliveries/s" %
              (name, statistics.median(cpus), min(cpus), max(cpus),
               statistics.median(cpus) / sd_cpu,
               statistics.median(rates)))


if __name__ == "__main__":
    main()
