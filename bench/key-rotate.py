#!/usr/bin/env python3
"""What key rotation costs: `doveadm casbox key rotate` timed on one build
(CASBOX_TOP_BUILDDIR) over N delivered messages. Since rotation writes a
DEK update per rewrapped blob, each batch also appends to a pack and
fdatasyncs it before its LSM commit. Run it against two builds in
alternating rounds and compare ratios:

  for i in 1 2 3; do
    for b in /tmp/base/build /work/wt-rekeyfix/build; do
      CASBOX_TOP_BUILDDIR=$b python3 bench/key-rotate.py -n 1000
    done
  done

Each round delivers the mail once, then runs --rotations full rotations
per batch size (each rewraps every blob record). Prints one line per
batch size: build, blob records, batch size, median [min-max] seconds of
one whole `key rotate` run (doveadm start-up included). Speed is
reported, never asserted.
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

from dovecot_harness import Dovecot, corpus_files  # noqa: E402

USER = "rotbench"
KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}


def records(dc):
    out = dc.doveadm("-f", "tab", "casbox", "stats", "-u", USER).stdout
    lines = out.strip().split("\n")
    row = dict(zip(lines[0].split("\t"), lines[1].split("\t")))
    return sum(int(item.split(":")[1])
               for item in row["wrap_key_ids"].split(",") if item)


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
        nrec = records(dc)
        for batch in args.batches.split(","):
            times = []
            for _ in range(args.rotations):
                t0 = time.perf_counter()
                dc.doveadm("casbox", "key", "rotate", "-u", USER,
                           "--batch", batch)
                times.append(time.perf_counter() - t0)
            print("%s records=%d batch=%s rotate_s=%.3f [%.3f-%.3f]"
                  % (os.environ.get("CASBOX_TOP_BUILDDIR", "?"), nrec,
                     batch, statistics.median(times), min(times),
                     max(times)))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
