#!/usr/bin/env python3
"""What key rotation costs: `doveadm casbox key rotate` (a new key epoch)
and `key rotate --finish` (re-seal, then drop the old epoch) timed on one
build (CASBOX_TOP_BUILDDIR) over N delivered messages. --finish rewraps
every DEK (a DEK update per blob appended to the packs, fdatasynced
before each LSM batch), re-seals every message record's metadata and
every dictionary, and rewrites every pack (gc --all). Run it against two
builds in alternating rounds and compare ratios:

  for i in 1 2 3; do
    for b in /tmp/base/build /work/wt-epochs/build; do
      CASBOX_TOP_BUILDDIR=$b python3 bench/key-rotate.py -n 1000
    done
  done

Each round delivers the mail once, then runs --rotations rotations per
batch size. Prints one line per batch size: build, blob records, batch
size, median [min-max] seconds of `key rotate` and of `key rotate
--finish` (doveadm start-up included), the median seconds of each
--finish step (from its `-v` lines), and the packs' bytes before and
after. Speed is reported, never asserted.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

from dovecot_harness import Dovecot, corpus_files  # noqa: E402

USER = "rotbench"
KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
STEP_RE = re.compile(r"casbox key rotate: \S+: step (\S+) done")


def records(dc):
    out = dc.doveadm("-f", "tab", "casbox", "stats", "-u", USER).stdout
    lines = out.strip().split("\n")
    row = dict(zip(lines[0].split("\t"), lines[1].split("\t")))
    return sum(int(item.split(":")[1])
               for item in row["wrap_key_ids"].split(",") if item)


def du(path):
    return sum(os.path.getsize(os.path.join(d, f))
               for d, _, files in os.walk(path) for f in files)


def finish(dc, batch, steps):
    """One timed --finish; step durations appended to steps."""
    proc = subprocess.Popen(
        dc.doveadm_command("-v", "casbox", "key", "rotate", "-u", USER,
                           "--finish", "--batch", batch),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    last = time.perf_counter()
    for line in proc.stderr:
        m = STEP_RE.search(line)
        if m:
            now = time.perf_counter()
            steps.setdefault(m.group(1), []).append(now - last)
            last = now
    if proc.wait() != 0:
        raise RuntimeError("key rotate --finish failed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--batches", default="1000,100")
    ap.add_argument("--rotations", type=int, default=3)
    args = ap.parse_args()
    msgs = []
    for path in corpus_files("usrp-users-3000", limit=args.n):
        with open(path, "rb") as f:
            msgs.append(f.read())
    with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                 plugin_settings=KEYS,
                 extra_conf="mail_fsync = optimized\n") as dc:
        dc.lmtp_deliver_many(USER, msgs)
        packs = os.path.join(dc.home(USER), "casbox", "packs")
        nrec = records(dc)
        for batch in args.batches.split(","):
            starts, finishes, steps = [], [], {}
            before = du(packs)
            for _ in range(args.rotations):
                t0 = time.perf_counter()
                dc.doveadm("casbox", "key", "rotate", "-u", USER)
                t1 = time.perf_counter()
                finish(dc, batch, steps)
                t2 = time.perf_counter()
                starts.append(t1 - t0)
                finishes.append(t2 - t1)
            print("%s records=%d batch=%s rotate_s=%.3f [%.3f-%.3f] "
                  "finish_s=%.3f [%.3f-%.3f] steps: %s packs_bytes=%d->%d"
                  % (os.environ.get("CASBOX_TOP_BUILDDIR", "?"), nrec,
                     batch, statistics.median(starts), min(starts),
                     max(starts), statistics.median(finishes),
                     min(finishes), max(finishes),
                     " ".join("%s=%.3f" % (k, statistics.median(v))
                              for k, v in steps.items()),
                     before, du(packs)))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
