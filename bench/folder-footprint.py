#!/usr/bin/env python3
"""Bytes on disk of one copy of each corpus folder, per peer, in one
run (issue 16: "never worse than the best peer on any folder of the
corpus"):

    CASBOX_TOP_BUILDDIR=build python3 bench/folder-footprint.py \\
        [--peers mdbox+zstd,mdbox+zstd+SIS,sdbox+zstd,casbox] \\
        [--sample N ...] [folder ...]

Each folder (default: every folder of ../shared/corpus; --sample N adds
bench/run's LMTP sample of N messages) is delivered by LMTP (one
connection, lmtp_add_received_header = no) into a fresh user
of a fresh instance of each peer (the configurations of
bench/storage.py, mail_fsync = optimized). Reported: allocated bytes
(st_blocks) of the user's whole home, Dovecot's indexes included, per
byte of mail delivered, and casbox's ratio to the best other peer.
Prints a Markdown table; sizes are reported, never asserted."""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

import dovecot_harness  # noqa: E402
from dovecot_harness import Dovecot, corpus_dir, load  # noqa: E402
import bench  # noqa: E402
import storage  # noqa: E402

USER = "footprint1"
DEFAULT_PEERS = "mdbox+zstd,mdbox+zstd+SIS,sdbox+zstd,casbox"


def allocated(root):
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def folder_paths(folder):
    return bench.corpus_paths(os.path.join(corpus_dir(), folder))


def footprint(config, msgs):
    kwargs = dict(config)
    kwargs["extra_conf"] = (storage.COMMON_CONF
                            + "lmtp_add_received_header = no\n"
                            + kwargs.get("extra_conf", ""))
    with Dovecot(**kwargs) as dc:
        dc.lmtp_deliver_many(USER, msgs)
        return allocated(dc.home(USER))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", default=DEFAULT_PEERS)
    ap.add_argument("--sample", type=int, action="append", default=[],
                    metavar="N",
                    help="also bench/run's LMTP sample of N messages "
                    "(every k-th of the whole corpus), as a row "
                    "sample-N; repeatable")
    ap.add_argument("folders", nargs="*")
    args = ap.parse_args()
    configs = dict(storage.peer_configs("/nonexistent"))
    peers = args.peers.split(",")
    folders = args.folders or sorted(
        d for d in os.listdir(corpus_dir())
        if os.path.isdir(os.path.join(corpus_dir(), d)))
    rows = []
    sets = [(folder, folder_paths(folder)) for folder in folders]
    for n in args.sample:
        sets.append(("sample-%d" % n,
                     bench.corpus_messages(dovecot_harness, n)[1]))
    for folder, paths in sets:
        msgs = load(paths)
        mail = sum(len(m) for m in msgs)
        ratios = {}
        for peer in peers:
            ratios[peer] = footprint(configs[peer], msgs) / mail
            print("%s %s %.4f" % (folder, peer, ratios[peer]),
                  file=sys.stderr)
        rows.append((folder, len(msgs), mail, ratios))
    print("| folder | messages | MB | "
          + " | ".join(peers) + " | casbox x best other |")
    print("|---|---|---|" + "---|" * len(peers) + "---|")
    for folder, n, mail, ratios in rows:
        # casbox's A/B variants are not peers it is compared with
        others = [v for p, v in ratios.items() if p != "casbox"
                  and p not in storage.OPT_IN_PEERS]
        best = min(others) if others else None
        cells = " | ".join("%.3f" % ratios[p] for p in peers)
        vs = ("%.2f" % (ratios["casbox"] / best)
              if "casbox" in ratios and best else "-")
        print("| %s | %d | %.1f | %s | %s |"
              % (folder, n, mail / 1e6, cells, vs))


if __name__ == "__main__":
    main()
