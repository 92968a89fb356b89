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
Prints a Markdown table; sizes are reported, never asserted.

--breakdown also prints, per folder, where each peer's bytes are
(allocated bytes per directory of the home, by file-name prefix) and,
for casbox, the pack bytes per frame kind (tests/e2e/casbox_packs.py:
blob frames by version, meta frames by kind), per byte of mail."""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

import casbox_packs  # noqa: E402
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


def breakdown(home, mail):
    """Lines: allocated bytes per directory and file-name prefix (up to
    the first '-' or '.'), then casbox's pack frames by kind."""
    sizes, counts = {}, {}
    for dirpath, _, files in os.walk(home):
        rel = os.path.relpath(dirpath, home)
        for name in files:
            key = os.path.join(rel, name.split("-")[0].split(".")[0])
            st = os.lstat(os.path.join(dirpath, name))
            sizes[key] = sizes.get(key, 0) + st.st_blocks * 512
            counts[key] = counts.get(key, 0) + 1
    lines = ["  %-50s %5d files %10d bytes %.4f"
             % (key, counts[key], sizes[key], sizes[key] / mail)
             for key in sorted(sizes, key=lambda k: -sizes[k])]
    root = os.path.join(home, "casbox")
    if os.path.isdir(os.path.join(root, "packs")):
        for label, (n, size) in casbox_packs.frame_census(root).items():
            lines.append("  frames %-43s %5d      %10d bytes %.4f "
                         "(%.1f a frame)" % (label, n, size, size / mail,
                                             size / n))
    return lines


def footprint(config, msgs, mail=None):
    """Allocated bytes of the user's home after delivering msgs; with
    mail (the bytes of msgs), also the breakdown() lines."""
    kwargs = dict(config)
    kwargs["extra_conf"] = (storage.COMMON_CONF
                            + "lmtp_add_received_header = no\n"
                            + kwargs.get("extra_conf", ""))
    with Dovecot(**kwargs) as dc:
        dc.lmtp_deliver_many(USER, msgs)
        home = dc.home(USER)
        return (allocated(home),
                breakdown(home, mail) if mail is not None else [])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", default=DEFAULT_PEERS)
    ap.add_argument("--sample", type=int, action="append", default=[],
                    metavar="N",
                    help="also bench/run's LMTP sample of N messages "
                    "(every k-th of the whole corpus), as a row "
                    "sample-N; repeatable")
    ap.add_argument("--breakdown", action="store_true",
                    help="where each peer's bytes are (stderr)")
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
            size, lines = footprint(configs[peer], msgs,
                                    mail if args.breakdown else None)
            ratios[peer] = size / mail
            print("%s %s %.4f" % (folder, peer, ratios[peer]),
                  file=sys.stderr)
            for line in lines:
                print(line, file=sys.stderr)
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
