#!/usr/bin/env python3
"""Peak RSS of the imap process that builds the large mailbox, the phase
of bench/run's storage suite (storage.py PeerRun.large) alone, A/B of
peers and casbox build trees in one run.

Per round and variant, a fresh Dovecot (mail_fsync = never, as bench/run
builds it): MULTIAPPEND of `--base` corpus messages (the smaller half of
the 800-message sample, repeated), then COPY 1:k doubling to `--large`
messages in one imap process; VmHWM of that process after each step,
then of fresh processes that SELECT the mailbox. Variants:

  NAME=PEER[:BUILDDIR]   PEER is a storage.py peer (sdbox, casbox, ...);
                         BUILDDIR a build tree with our plugins

  python3 bench/large-rss.py --large 100000 --base 5000 --rounds 2 \\
      sdbox casbox-before=casbox:/tmp/base/build casbox=casbox:build

Memory is reported, never asserted. --stats-at N also prints
/proc/PID/smaps_rollup (Rss, Anonymous) after the step that reaches N
messages."""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
sys.path.insert(0, HERE)
import dovecot_harness  # noqa: E402
import storage  # noqa: E402
from bench import corpus_messages  # noqa: E402
from imapraw import RawIMAP  # noqa: E402
from stats import summarize  # noqa: E402


def fmt(values):
    s = summarize(values)
    return "%.3g [%.3g-%.3g]" % (s["median"], s["min"], s["max"])


def rollup(pid):
    """Rss kB of the process's mappings, summed by file (or [heap],
    [anon]), largest first."""
    out = {}
    name = None
    try:
        with open("/proc/%d/smaps" % pid) as f:
            for line in f:
                parts = line.split()
                if "-" in parts[0] and not parts[0].endswith(":"):
                    name = parts[5] if len(parts) > 5 else "[anon]"
                    if os.environ.get("LARGE_RSS_ANON") and name == "[anon]":
                        lo, hi = parts[0].split("-")
                        name = "[anon %d kB]" % ((int(hi, 16) - int(lo, 16))
                                                 // 1024)
                elif parts[0] == "Rss:":
                    out[name] = out.get(name, 0) + int(parts[1])
    except OSError:
        pass
    return sorted(((v, os.path.basename(k)) for k, v in out.items()
                   if v > 0), reverse=True)[:int(os.environ.get("LARGE_RSS_TOP", "12"))]


def imap_pids(dc):
    """imap processes of this instance, also under a --wrap program."""
    found = []
    for entry in os.listdir("/proc"):
        pid = int(entry) if entry.isdigit() else 0
        try:
            with open("/proc/%d/stat" % pid) as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.index("(") + 1:stat.rindex(")")] != "imap":
            continue
        p = pid
        while p > 1:
            try:
                with open("/proc/%d/stat" % p) as f:
                    st = f.read()
            except OSError:
                break
            p = int(st[st.rindex(")") + 2:].split()[1])
            if p == dc.master_pid:
                found.append(pid)
                break
    return found


def build(dc, pool, n, base, batch, stats_at, log):
    """Returns (VmHWM kB of the building imap process after each step as
    (messages, kB), kB of the SELECT processes, median SELECT ms on a
    fresh connection: the store's open is in it)."""
    steps = []
    c = RawIMAP(dc.imap_port)
    c.login(storage.LARGE_USER, dovecot_harness.PASSWORD)
    try:
        pids = imap_pids(dc)
        assert len(pids) == 1, pids
        pid = pids[0]
        done = 0
        while done < base:
            k = min(batch, base - done)
            c.append("INBOX", [pool[(done + j) % len(pool)]
                               for j in range(k)])
            done += k
        steps.append((done, storage.vm_hwm_kb([pid])))
        if stats_at and done >= stats_at:
            log("  smaps at %d: %s" % (done, rollup(pid)))
        c.select("INBOX")
        while done < n:
            k = min(done, n - done)
            c.command("COPY 1:%d INBOX" % k)
            done += k
            steps.append((done, storage.vm_hwm_kb([pid])))
            if stats_at and done >= stats_at and steps[-2][0] < stats_at:
                log("  smaps at %d: %s" % (done, rollup(pid)))
    finally:
        c.close()
    sel = 0
    ms = []
    for _ in range(7):
        c = RawIMAP(dc.imap_port)
        c.login(storage.LARGE_USER, dovecot_harness.PASSWORD)
        try:
            t0 = time.perf_counter()
            exists = c.select("INBOX")
            ms.append((time.perf_counter() - t0) * 1000)
            assert exists == n, (exists, n)
            # not the builder, which may still be exiting
            pids = [p for p in imap_pids(dc) if p != pid]
            sel = max(sel, storage.vm_hwm_kb(pids))
            if stats_at and pids:
                log("  smaps of SELECT: %s" % rollup(pids[0]))
        finally:
            c.close()
    return steps, sel, statistics.median(ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--large", type=int, default=100000)
    ap.add_argument("--base", type=int, default=5000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--stats-at", type=int, default=0)
    ap.add_argument("--wrap", help="run the casbox variants' imap under "
                    "this command (e.g. heaptrack -o /tmp/ht)")
    ap.add_argument("--builddir", default=os.environ.get(
        "CASBOX_TOP_BUILDDIR", os.path.join(HERE, "..", "build")),
        help="build tree for variants that name none")
    args = ap.parse_args()

    peers = dict(storage.peer_configs("/nonexistent"))
    variants = []
    for v in args.variants:
        name, _, spec = v.partition("=")
        peer, _, builddir = (spec or name).partition(":")
        if peer not in peers:
            ap.error("unknown peer %s" % peer)
        variants.append((name, peer, os.path.abspath(builddir)
                         if builddir else os.path.abspath(args.builddir)))

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    _, paths = corpus_messages(dovecot_harness, 800)
    msgs = []
    for p in paths:
        with open(p, "rb") as f:
            msgs.append(f.read())
    pool = sorted(msgs, key=len)[:len(msgs) // 2]
    res = {name: {"build": [], "select": [], "select_ms": []}
           for name, _, _ in variants}
    for rnd in range(args.rounds):
        order = variants if rnd % 2 == 0 else variants[::-1]
        for name, peer, builddir in order:
            dovecot_harness.TOP_BUILDDIR = builddir
            kw = dict(peers[peer])
            kw["extra_conf"] = storage.COMMON_CONF + \
                kw.get("extra_conf", "") + "mail_fsync = never\n"
            if args.wrap and peer.startswith("casbox"):
                kw["extra_conf"] += ("service imap {\n  executable = %s "
                                     "/usr/lib/dovecot/imap\n}\n"
                                     % args.wrap)
            t0 = time.perf_counter()
            with dovecot_harness.Dovecot(**kw) as dc:
                if args.wrap:
                    dc.allow_log("heaptrack|allocations")
                steps, sel, sel_ms = build(dc, pool, args.large,
                                           args.base, args.batch,
                                           args.stats_at, log)
            log("%s round %d: %.0f s, VmHWM kB per step %s, SELECT %d kB, "
                "%.2f ms" % (name, rnd + 1, time.perf_counter() - t0,
                             " ".join("%d:%d" % s for s in steps), sel,
                             sel_ms))
            res[name]["build"].append(steps[-1][1] / 1024.0)
            res[name]["select"].append(sel / 1024.0)
            res[name]["select_ms"].append(sel_ms)
    ref = res[variants[0][0]]["build"]
    print("| variant | imap peak RSS MB, build | ratio to %s | "
          "SELECT imap peak RSS MB | SELECT ms |" % variants[0][0])
    print("|---|---|---|---|---|")
    for name, _, _ in variants:
        r = res[name]
        ratios = [a / b for a, b in zip(r["build"], ref)]
        print("| %s | %s | %s | %s | %s |" % (
            name, fmt(r["build"]), fmt(ratios), fmt(r["select"]),
            fmt(r["select_ms"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
