#!/usr/bin/env python3
"""casbox-lsm vs LevelDB vs SQLite: runs bench/lsm-bench (bench/lsm-bench.c)
several times and summarises the casbox/LevelDB ratios measured in the same
run (median [min-max] over the runs; the machine is shared and noisy).

Part of bench/bench.py (results["lsm"], the "casbox-lsm" section of
doc/benchmarks.md); standalone:

    python3 bench/lsm.py --builddir build [--runs 5] [--messages 50000]
                         [--sync-messages 1000]

prints that section. Build the program first: make -C <builddir>/bench
lsm-bench (needs libleveldb-dev and libsqlite3-dev)."""

import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from stats import summarize  # noqa: E402

ENGINES = ("casbox-lsm", "leveldb", "sqlite")
PHASES = ("deliver", "flags", "scan", "lookup")
MODES = ("nosync", "sync")
ROW = re.compile(r"^(\w+)?\s+(casbox-lsm|leveldb|sqlite)\s+([\d.]+)\s+"
                 r"([\d.]+)\s+([\d.]+)\s*$")


def parse(output):
    """{mode: {phase: {engine: (ops/s, ops/cpu-s, wB/op)}}}"""
    res = {}
    mode = phase = None
    for line in output.splitlines():
        if line.startswith("== nosync"):
            mode = "nosync"
        elif line.startswith("== sync"):
            mode = "sync"
        m = ROW.match(line)
        if m and mode:
            phase = m.group(1) or phase
            res.setdefault(mode, {}).setdefault(phase, {})[m.group(2)] = \
                tuple(float(x) for x in m.group(3, 4, 5))
    return res


def binary_path(builddir):
    return os.path.join(builddir, "bench", "lsm-bench")


def run_lsm(builddir, runs, messages, sync_messages, log):
    binary = binary_path(builddir)
    if not os.access(binary, os.X_OK):
        return {"error": "%s not built (make -C %s/bench lsm-bench)"
                % (binary, builddir)}
    out = []
    for i in range(runs):
        log("lsm-bench run %d/%d" % (i + 1, runs))
        with tempfile.TemporaryDirectory(prefix="cbx-lsm-",
                                         dir="/tmp") as tmp:
            p = subprocess.run([binary, str(messages), str(sync_messages),
                                os.path.join(tmp, "db")],
                               capture_output=True, text=True, check=True)
        out.append(parse(p.stdout))
    return {"command": "bench/lsm-bench %d %d" % (messages, sync_messages),
            "runs": out, "messages": messages,
            "sync_messages": sync_messages}


def _ratio(a, b):
    return a / b if b else None


def summary(lsm):
    """{(mode, phase): {"abs": {engine: summary of ops/cpu-s},
    "wall"/"cpu"/"bytes": summary of the casbox/LevelDB ratio}}"""
    out = {}
    for mode in MODES:
        for phase in PHASES:
            rows = [r[mode][phase] for r in lsm["runs"]
                    if phase in r.get(mode, {})]
            if not rows:
                continue
            s = {"abs": {e: summarize([r[e][1] for r in rows if e in r])
                         for e in ENGINES}}
            for i, k in enumerate(("wall", "cpu", "bytes")):
                s[k] = summarize([_ratio(r["casbox-lsm"][i],
                                         r["leveldb"][i]) for r in rows])
            out[(mode, phase)] = s
    return out


def _fmt(s, digits=2, suffix="x"):
    if s is None:
        return "n/a"
    f = "%%.%df%s" % (digits, suffix)
    return "%s [%s-%s]" % (f % s["median"], f % s["min"], f % s["max"])


def markdown(lsm):
    L = []
    w = L.append
    w("## casbox-lsm vs LevelDB and SQLite")
    w("")
    if "error" in lsm:
        w("Not measured: %s" % lsm["error"])
        return L
    w("`%s` (bench/lsm-bench.c), run %d times; each run measures all "
      "three engines one after the other on the same disk. Workload: per "
      "message one batch with the message record (160 B) and 1-2 blob "
      "records (90 B); single-put flag updates; scans of one mailbox's "
      "records; random blob-id lookups. nosync: %d messages, no engine "
      "syncs (casbox fsync=no, LevelDB sync=false, SQLite "
      "synchronous=OFF). sync: %d messages, every engine fdatasyncs each "
      "batch (casbox fsync=yes, LevelDB sync=true, SQLite WAL + "
      "synchronous=FULL). casbox runs with its multi-process write lock; "
      "LevelDB is single-process (its LOCK excludes other processes). "
      "Ratios are casbox/LevelDB within one run, **median [min-max]** over "
      "the runs; ops/cpu-s counts all threads (LevelDB compacts in a "
      "background thread)."
      % (lsm["command"], len(lsm["runs"]), lsm["messages"],
         lsm["sync_messages"]))
    w("")
    w("| mode | phase | casbox ops/cpu-s | LevelDB ops/cpu-s | "
      "SQLite ops/cpu-s | casbox/LevelDB ops/s | casbox/LevelDB "
      "ops/cpu-s | casbox/LevelDB bytes/op |")
    w("|---|---|---|---|---|---|---|---|")
    for (mode, phase), s in summary(lsm).items():
        a = s["abs"]
        w("| %s | %s | %s | %s | %s | %s | %s | %s |"
          % (mode, phase,
             *("%.0f" % a[e]["median"] if a[e] else "n/a" for e in ENGINES),
             _fmt(s["wall"]), _fmt(s["cpu"]),
             _fmt(s["bytes"]) if phase in ("deliver", "flags") else "-"))
    w("")
    w("bytes/op = bytes passed to write() per operation (WAL, tables, "
      "compaction); scans and lookups write nothing in casbox.")
    return L


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--builddir", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--messages", type=int, default=50000)
    ap.add_argument("--sync-messages", type=int, default=1000)
    args = ap.parse_args()
    lsm = run_lsm(os.path.abspath(args.builddir), args.runs, args.messages,
                  args.sync_messages,
                  lambda m: sys.stderr.write("[lsm] %s\n" % m))
    print("\n".join(markdown(lsm)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
