#!/usr/bin/env python3
"""What the AECS export costs: `doveadm casbox aecs export` timed on one
build (CASBOX_TOP_BUILDDIR) over the shared corpus imported into casbox
(every folder, or --messages N spread over them).

  CASBOX_TOP_BUILDDIR=build python3 bench/aecs-export.py --rounds 3

Per round, into a fresh file: a full --db export (messages exported per
second, doveadm start-up included), the same with --no-search, a rerun
with nothing changed (seconds), and a --sql export. Prints median
[min-max] per figure, plus database bytes per byte of mail (the stored
message sizes) with and without the aecs_search table. Speed is
reported, never asserted.
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

from dovecot_harness import Dovecot  # noqa: E402
import aecs_corpus  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
TOPS = ["spamassassin", "usrp-users-3000", "notmuch", "mime-edge"]


def spread(folders, n):
    """n messages taken evenly from every folder (all when n is None)."""
    if n is None:
        return folders
    total = sum(len(v) for v in folders.values())
    return {k: v[::max(1, total // n)] for k, v in folders.items()}


def timed(dc, *args):
    t = time.monotonic()
    dc.doveadm("casbox", "aecs", "export", "-u", "user1", *args)
    return time.monotonic() - t


def fmt(xs, digits=1):
    return "%.*f [%.*f-%.*f]" % (digits, statistics.median(xs), digits,
                                 min(xs), digits, max(xs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    folders = spread(aecs_corpus.corpus_folders(TOPS), args.messages)
    with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                 plugin_settings=KEYS) as dc:
        loaded = aecs_corpus.fill(dc, folders)
        n = sum(len(v) for v in loaded.values())
        mail_bytes = sum(len(m.replace(b"\r\n", b"\n"))
                         for v in loaded.values() for m in v)
        out = aecs_corpus.db_dir(dc)
        full, nosearch, rerun, sql = [], [], [], []
        for r in range(args.rounds):
            db = os.path.join(out, "r%d.sqlite" % r)
            dbn = os.path.join(out, "r%d-nosearch.sqlite" % r)
            full.append(n / timed(dc, "--db", db))
            rerun.append(timed(dc, "--db", db))
            nosearch.append(n / timed(dc, "--db", dbn, "--no-search"))
            sql.append(n / timed(dc, "--sql", db + ".sql"))
            size, size_n = os.path.getsize(db), os.path.getsize(dbn)
            for path in (db, dbn, db + ".sql"):
                os.unlink(path)
        print("messages: %d, %.1f MB stored" % (n, mail_bytes / 1e6))
        print("export --db, messages/s: %s" % fmt(full))
        print("export --db --no-search, messages/s: %s" % fmt(nosearch))
        print("export --sql, messages/s: %s" % fmt(sql))
        print("rerun with no change, s: %s" % fmt(rerun, 2))
        print("db bytes per mail byte: %.3f (search), %.3f (--no-search)"
              % (size / mail_bytes, size_n / mail_bytes))


if __name__ == "__main__":
    main()
