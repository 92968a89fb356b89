#!/usr/bin/env python3
"""Where a casidx SEARCH spends its time: per-search wall and imap CPU,
and optionally a perf profile of the imap process.

Appends N corpus messages (bench/fts.py's casidx configuration: casidx
on casbox), runs `doveadm index`, then on one IMAP connection repeats
each search --reps times (the first run of each is dropped: it warms
the page cache and the segment cache). With -o, `perf record -g -p
<imap pid>` covers the timed runs.

  CASBOX_TOP_BUILDDIR=build python3 bench/casidx-query-profile.py \\
      -n 10000 --reps 20 -o /tmp/casidx-q.perf.data
  perf report -i /tmp/casidx-q.perf.data --no-children --sort dso,sym
"""

import argparse
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

import dovecot_harness as harness  # noqa: E402
from imapraw import RawIMAP  # noqa: E402
from stats import percentile, service_cpu_s  # noqa: E402
import bench  # noqa: E402
import fts  # noqa: E402
import storage  # noqa: E402

DEFAULT_SEARCHES = [("BODY", "firmware"), ("BODY", "the"),
                    ("BODY", "xyzzyquux"), ("BODY", "gnuradio"),
                    ("SUBJECT", "usrp"), ("FROM", "ettus"),
                    ("TEXT", "unsubscribe")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("-s", "--search", action="append", default=[],
                    help="KEY:value (e.g. BODY:firmware); default a mix")
    ap.add_argument("-o", "--output", help="perf data file")
    ap.add_argument("--call-graph", default="fp")
    ap.add_argument("--engine", default="casidx",
                    choices=sorted(fts.ENGINE_CONFIGS),
                    help="bench/fts.py's configuration (the floor: "
                    "dovecot-nofts with -s KEYWORD:none)")
    args = ap.parse_args()
    searches = ([tuple(s.split(":", 1)) for s in args.search]
                or DEFAULT_SEARCHES)

    _, paths = bench.corpus_messages(harness, args.n)
    messages = harness.load(paths)
    loc, plugins, settings, _ = fts.ENGINE_CONFIGS[args.engine]
    settings = dict(settings)
    if plugins:
        settings.update(fts_autoindex="no", fts_enforced="yes")
    with harness.Dovecot(mail_location=loc, mail_plugins=plugins,
                         plugin_settings=settings,
                         extra_conf=storage.COMMON_CONF) as dc:
        with RawIMAP(dc.imap_port) as c:
            c.login(fts.USER, harness.PASSWORD)
            for i in range(0, len(messages), 100):
                c.append("INBOX", messages[i:i + 100])
        if plugins:
            dc.doveadm("index", "-u", fts.USER, "INBOX")
        with RawIMAP(dc.imap_port) as c:
            c.login(fts.USER, harness.PASSWORD)
            c.select("INBOX")
            for key, value in searches:
                c.command(fts._search_cmd(key, value))
            pids = dc.pids("imap")
            assert len(pids) == 1, pids
            perf = None
            if args.output:
                perf = subprocess.Popen(
                    ["perf", "record", "-q", "--call-graph",
                     args.call_graph, "-p", str(pids[0]), "-o",
                     args.output], stdout=subprocess.DEVNULL)
                time.sleep(1)  # perf attaching; not a synchronisation
            print("%s, %d messages; ms per search (wall p50 / max, imap "
                  "CPU)" % (args.engine, len(messages)))
            for key, value in searches:
                lat = []
                cpu0 = service_cpu_s(dc, "imap")
                for _ in range(args.reps):
                    ms, uids = fts._timed_search(c, fts._search_cmd(key,
                                                                    value))
                    lat.append(ms)
                cpu = service_cpu_s(dc, "imap") - cpu0
                lat.sort()
                print("  %-8s %-14s %4d uids  %7.2f / %7.2f  cpu %.2f"
                      % (key, value, len(uids), percentile(lat, 50),
                         lat[-1], cpu * 1000 / args.reps))
            if perf is not None:
                perf.send_signal(signal.SIGINT)
                perf.wait(timeout=60)


if __name__ == "__main__":
    main()
