#!/usr/bin/env python3
"""CPU cost of one casbox build against another, A/B interleaved on the
e2e harness: lmtp CPU per LMTP delivery and imap CPU per APPEND.

What a change to a hot path costs (e.g. the named events, doc/events.md)
is a few percent at most, far below what the machine's load does to
wall-clock throughput on a shared box; the CPU time the serving process
itself used (utime + stime from /proc/PID/stat) is much steadier. Per
round and variant: a fresh Dovecot with Dovecot's stats service on (as
by default), N usrp-users messages delivered over one LMTP connection,
then APPENDed over one IMAP connection. A variant is a build tree,
optionally with extra configuration (e.g. the README's metric blocks:
someone listening). Speed is reported, never asserted.

  python3 bench/casbox-build-ab.py -n 400 --rounds 3 \\
      base=/tmp/base/build events=build \\
      'events+metrics=build:README'

A variant spec "sdbox" (e.g. sdbox=sdbox) runs Dovecot's sdbox instead,
with the plugins of the variant before it, as the control in the same
minutes.
"""

import argparse
import os
import smtplib
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
import dovecot_harness  # noqa: E402
from dovecot_harness import Dovecot, corpus_files  # noqa: E402
from stats import cpu_seconds  # noqa: E402

STATS_ON = "stats_writer_socket_path = stats-writer\n"


def service_cpu(dc, service, pids=None):
    """CPU seconds of the service's processes (those in pids, or all
    running now: the warm-up's process may still be there)."""
    pids = dc.pids(service) if pids is None else pids
    return pids, sum(cpu_seconds(pid) for pid in pids)


def readme_metrics():
    """The README's "Monitoring" block without its HTTP listener."""
    with open(os.path.join(HERE, "..", "README.md")) as f:
        text = f.read()
    block = text[text.index("\n## Monitoring\n"):].split("```\n", 2)[1]
    return block[:block.index("service stats {")]


def one_run(builddir, extra, msgs):
    """(ms of lmtp CPU per delivery, ms of imap CPU per APPEND);
    builddir None: sdbox."""
    kw = {}
    if builddir is None:
        kw["mail_location"] = "sdbox:~/sdbox"
    else:
        dovecot_harness.TOP_BUILDDIR = builddir
    with Dovecot(plugin_settings={"casbox_key_file": "%h/casbox.key",
                                  "casbox_key_autocreate": "yes"},
                 extra_conf="mail_fsync = optimized\n" + STATS_ON
                 + extra, **kw) as dc:
        dc.lmtp_deliver("user1", msgs[0])
        with smtplib.LMTP("127.0.0.1", dc.lmtp_port, timeout=120) as lmtp:
            lmtp.noop()
            pids, cpu0 = service_cpu(dc, "lmtp")
            for msg in msgs:
                lmtp.sendmail("s@example.com", ["user1"], msg)
            lmtp_ms = (service_cpu(dc, "lmtp", pids)[1] - cpu0) * 1000 \
                / len(msgs)
        imap = dc.imap_login("user1")
        imap.create("A")
        pids, cpu0 = service_cpu(dc, "imap")
        for msg in msgs:
            imap.append("A", None, None, msg)
        append_ms = (service_cpu(dc, "imap", pids)[1] - cpu0) * 1000 \
            / len(msgs)
        imap.logout()
    return lmtp_ms, append_ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=400, help="messages")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("variants", nargs="+",
                    help="name=builddir[:README] (README: with the "
                    "README's metric blocks)")
    args = ap.parse_args()
    variants = []
    for v in args.variants:
        name, spec = v.split("=", 1)
        builddir, _, extra = spec.partition(":")
        variants.append((name, None if builddir == "sdbox" else
                         os.path.abspath(builddir),
                         readme_metrics() if extra == "README" else ""))
    if variants[0][1] is None:
        ap.error("sdbox needs a build variant before it")
    msgs = []
    for path in corpus_files("usrp-users-3000", limit=args.n,
                             step=max(1, 3000 // args.n)):
        with open(path, "rb") as f:
            msgs.append(f.read())
    res = {name: ([], []) for name, _, _ in variants}
    for r in range(args.rounds):
        # rotate the order each round: no variant always runs first
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name, builddir, extra in order:
            lmtp_ms, append_ms = one_run(builddir, extra, msgs)
            res[name][0].append(lmtp_ms)
            res[name][1].append(append_ms)
            sys.stderr.write("round %d %s: lmtp %.2f ms, append %.2f ms\n"
                             % (r + 1, name, lmtp_ms, append_ms))
    first = variants[0][0]
    print("variant          lmtp ms/delivery  ratio   imap ms/APPEND  ratio")
    for name, _, _ in variants:
        lm = statistics.median(res[name][0])
        am = statistics.median(res[name][1])
        print("%-16s %8.2f [%.2f-%.2f] %5.3f  %8.2f [%.2f-%.2f] %5.3f"
              % (name, lm, min(res[name][0]), max(res[name][0]),
                 lm / statistics.median(res[first][0]), am,
                 min(res[name][1]), max(res[name][1]),
                 am / statistics.median(res[first][1])))


if __name__ == "__main__":
    main()
