#!/usr/bin/env python3
"""casbox bench suite: physical limits, storage peers, FTS hook.

Normally started by bench/run (which installs the tools and builds
bench/physical-aead first); see bench/README.md. Writes a JSON result file,
a Markdown report and PNG plots."""

import argparse
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP_SRCDIR = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(TOP_SRCDIR, "tests", "e2e"))

import concurrency  # noqa: E402
import fts  # noqa: E402
import lsm  # noqa: E402
import physical  # noqa: E402
import report  # noqa: E402
import storage  # noqa: E402

# Sizes: messages = how many corpus messages are delivered by LMTP and
# APPENDed one by one in the timed phases (spread evenly over the whole
# corpus, every folder in proportion; None = all of it). space_all: also
# save the whole corpus twice (untimed MULTIAPPEND) for bytes on disk.
# The full run's timed sample is 800 messages because one LMTP delivery
# costs ~20 ms on this 2-core machine: all 9568 twice, for 10 peers and 2
# rounds, would take over two hours.
SIZES = {
    "tiny": dict(messages=12, rounds=1, fetch_repeats=1, large=60,
                 large_batch=30, large_base=40, latency_repeats=3, seq_mb=8,
                 fsync_count=20, zstd_sample_mb=2, aead_seconds=0.05,
                 physical_repeats=1, peer_timeout=300, space_all=False,
                 lsm_runs=1, lsm_messages=2000, lsm_sync_messages=100,
                 concurrency_clients=[3], concurrency_seconds=3,
                 concurrency_rounds=1),
    "quick": dict(messages=300, rounds=2, fetch_repeats=2, large=5000,
                  large_batch=250, large_base=2000, latency_repeats=5, seq_mb=64,
                  fsync_count=100, zstd_sample_mb=10, aead_seconds=0.2,
                  physical_repeats=2, peer_timeout=900, space_all=False,
                  lsm_runs=3, lsm_messages=20000, lsm_sync_messages=500,
                  concurrency_clients=[1, 10], concurrency_seconds=10,
                  concurrency_rounds=1),
    "full": dict(messages=800, rounds=2, fetch_repeats=3, large=100000,
                 large_batch=500, large_base=5000, latency_repeats=7, seq_mb=512,
                 fsync_count=300, zstd_sample_mb=50, aead_seconds=0.5,
                 physical_repeats=3, peer_timeout=1800, space_all=True,
                 lsm_runs=5, lsm_messages=50000, lsm_sync_messages=1000,
                 concurrency_clients=[1, 5, 10, 20], concurrency_seconds=20,
                 concurrency_rounds=2),
}


def log(msg):
    sys.stderr.write("[bench %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def corpus_paths(root):
    """The non-empty .eml files under root, sorted by folder then name
    (IMAP cannot save an empty message; the corpus has one)."""
    paths = []
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        paths.extend(os.path.join(dirpath, f) for f in sorted(files)
                     if f.endswith(".eml")
                     and os.path.getsize(os.path.join(dirpath, f)) > 0)
    return paths


def corpus_messages(harness, count):
    """All non-empty .eml files of the shared corpus (corpus_paths()),
    or `count` of them spread evenly over that list so every folder is
    represented in proportion."""
    root = harness.corpus_dir()
    paths = corpus_paths(root)
    if count is not None and count < len(paths):
        step = len(paths) / count
        paths = [paths[int(i * step)] for i in range(count)]
    return root, paths


def machine_info():
    info = {"nproc": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["mem_gb"] = round(int(f.readline().split()[1]) / 1e6, 1)
    except OSError:
        pass
    try:
        import subprocess
        info["dovecot"] = subprocess.run(
            ["dovecot", "--version"], capture_output=True,
            text=True).stdout.strip()
    except OSError:
        pass
    try:
        import subprocess
        info["git"] = subprocess.run(
            ["git", "-C", TOP_SRCDIR, "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", TOP_SRCDIR, "status", "--porcelain", "--", "src"],
            capture_output=True, text=True).stdout.strip()
        info["src_dirty"] = bool(dirty)
    except OSError:
        pass
    return info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const",
                      const="quick", help="CI-sized run (a few minutes)")
    mode.add_argument("--tiny", dest="mode", action="store_const",
                      const="tiny", help="smoke-test size (seconds)")
    ap.set_defaults(mode="full")
    ap.add_argument("--builddir", help="build tree with our plugins "
                    "(default: $CASBOX_TOP_BUILDDIR)")
    ap.add_argument("--messages", type=int, help="override message count")
    ap.add_argument("--rounds", type=int, help="override rounds")
    ap.add_argument("--large", type=int, help="override large mailbox size")
    ap.add_argument("--peer-timeout", type=int,
                    help="seconds before a hanging peer is killed")
    ap.add_argument("--space-all", action="store_true",
                    help="also measure bytes on disk for the whole corpus")
    ap.add_argument("--peers", help="comma-separated subset of peers")
    ap.add_argument("--aead-binary", help="built physical-aead program")
    ap.add_argument("--skip-physical", action="store_true")
    ap.add_argument("--skip-fts", action="store_true")
    ap.add_argument("--skip-lsm", action="store_true",
                    help="leave out casbox-lsm vs LevelDB (bench/lsm.py)")
    ap.add_argument("--skip-concurrency", action="store_true",
                    help="leave out many clients on one mailbox "
                    "(bench/concurrency.py)")
    ap.add_argument("--json", help="where to write raw results")
    ap.add_argument("--report", help="Markdown report path "
                    "(default doc/benchmarks.md)")
    ap.add_argument("--plots-dir", help="PNG dir (default doc/bench)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--command", help="command line to print in the report")
    args = ap.parse_args(argv)

    if args.builddir:
        os.environ["CASBOX_TOP_BUILDDIR"] = os.path.abspath(args.builddir)
    import dovecot_harness as harness

    size = dict(SIZES[args.mode])
    if args.messages is not None:
        size["messages"] = args.messages
    if args.rounds is not None:
        size["rounds"] = args.rounds
    if args.large is not None:
        size["large"] = args.large
    if args.peer_timeout is not None:
        size["peer_timeout"] = args.peer_timeout
    if args.space_all:
        size["space_all"] = True
    only = set(args.peers.split(",")) if args.peers else None
    unknown = (only or set()) - set(storage.PEER_NAMES) - \
        storage.OPT_IN_PEERS - {"none"}
    if unknown:
        ap.error("unknown peers %s (known: %s; 'none' for no storage peer)"
                 % (",".join(sorted(unknown)), ",".join(storage.PEER_NAMES)))

    root, paths = corpus_messages(harness, size["messages"])
    messages = []
    for p in paths:
        with open(p, "rb") as f:
            messages.append(f.read())
    corpus_bytes = sum(len(m) for m in messages)
    log("mode %s: %d messages, %.1f MB, %d rounds, large mailbox %d"
        % (args.mode, len(messages), corpus_bytes / 1e6, size["rounds"],
           size["large"]))

    workdir = tempfile.mkdtemp(prefix="cbx-bench-", dir="/tmp")
    started = time.time()
    results = {
        "mode": args.mode, "size": size, "machine": machine_info(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                 time.gmtime(started)),
        "command": args.command or "bench/bench.py " + " ".join(
            shlex.quote(a) for a in (argv or sys.argv[1:])),
        "corpus": {"root": root, "messages": len(messages),
                   "bytes": corpus_bytes,
                   "folders": sorted({os.path.relpath(os.path.dirname(p),
                                                      root)
                                      for p in paths})},
    }
    try:
        if not args.skip_physical:
            results["physical"] = physical.run_physical(
                workdir, paths, args.aead_binary, size,
                size["physical_repeats"], log)
        space_corpus = None
        if size["space_all"]:
            _, all_paths = corpus_messages(harness, None)
            space_corpus = []
            for p in all_paths:
                with open(p, "rb") as f:
                    space_corpus.append(f.read())
            results["space_corpus"] = {
                "messages": len(space_corpus),
                "bytes": sum(len(m) for m in space_corpus)}
        runs = storage.run_storage(harness, messages, size, size["rounds"],
                                   os.path.join(workdir, "keys"), log, only,
                                   space_corpus)
        results["storage_runs"] = runs
        results["storage"] = {n: storage.summarize_peer(r, corpus_bytes)
                              for n, r in runs.items()}
        if not args.skip_fts:
            results["fts"] = fts.run_fts(harness, messages, size, log,
                                         workdir)
        if not args.skip_concurrency and (only is None or
                                          {"casbox", "sdbox"} <= only):
            results["concurrency"] = concurrency.run_concurrency(
                size["concurrency_clients"], size["concurrency_seconds"],
                size["concurrency_rounds"], log)
        if not args.skip_lsm:
            results["lsm"] = lsm.run_lsm(
                harness.TOP_BUILDDIR, size["lsm_runs"], size["lsm_messages"],
                size["lsm_sync_messages"], log)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["elapsed_s"] = time.time() - started

    json_path = args.json or os.path.join(HERE, "results",
                                          "%s.json" % args.mode)
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    report_path = args.report or os.path.join(TOP_SRCDIR, "doc",
                                              "benchmarks.md")
    plots_dir = args.plots_dir or os.path.join(TOP_SRCDIR, "doc", "bench")
    plots = [] if args.no_plots else report.plots(results, plots_dir, log)
    report.write_markdown(results, report_path, plots)
    log("wrote %s, %s (%.0f s)" % (report_path, json_path,
                                   results["elapsed_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
