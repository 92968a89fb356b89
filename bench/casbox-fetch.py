#!/usr/bin/env python3
"""casbox vs sdbox: the read path and LMTP delivery, A/B interleaved.

Each round starts a fresh Dovecot per peer with the e2e harness
(tests/e2e/dovecot_harness.py), LMTP-delivers the same N corpus messages
(msg/s, and the lmtp process's CPU ms per message), then on one
IMAP connection times
  - UID FETCH 1:* (UID BODY.PEEK[])                  (MB/s, --reps times,
                                                   and the imap process's
                                                   CPU ms per MB)
  - BODY.PEEK[]<off.64k> in the middle of the K largest messages
                                                   (ms per partial fetch)
  - FETCH 1:* BODYSTRUCTURE on a fresh connection  (seconds; the first
    one, before Dovecot's cache could have learned it)
and the bytes of the user's home after delivery (store_mb: index, LSM
and packs, or sdbox's files). Peer casbox-crlf is casbox with
mail_save_crlf = yes (CRLF stored, so BODY[]<o.l> skips to its offset;
sdbox stores LF whatever the setting). Peers run in alternating order
per round; medians and each peer's ratio to sdbox are printed at the
end. Speed is reported, never asserted.

  make -C /work/build-perf && \
  CASBOX_TOP_BUILDDIR=/work/build-perf python3 bench/casbox-fetch.py \
      -n 1000 --rounds 3
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

import dovecot_harness  # noqa: E402
from dovecot_harness import Dovecot, PASSWORD, corpus_files  # noqa: E402
from imapraw import RawIMAP  # noqa: E402
from stats import service_cpu_s  # noqa: E402

USER = "fetchbench"
DEFAULT_BUILDDIR = dovecot_harness.TOP_BUILDDIR
CONF = "mail_fsync = optimized\n"

CASBOX_KEYS = {"casbox_key_file": "%h/casbox.key",
               "casbox_key_autocreate": "yes"}
PEERS = {
    "sdbox": dict(mail_location="sdbox:~/sdbox", mail_plugins=[],
                  extra_conf=CONF),
    "casbox": dict(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                   extra_conf=CONF, plugin_settings=CASBOX_KEYS),
    "casbox-crlf": dict(mail_location="casbox:~/casbox",
                        mail_plugins=["casbox"],
                        extra_conf=CONF + "mail_save_crlf = yes\n",
                        plugin_settings=CASBOX_KEYS),
    # A/Bs of the read path's settings (issue 16)
    "casbox-noxmsg": dict(mail_location="casbox:~/casbox",
                          mail_plugins=["casbox"], extra_conf=CONF,
                          plugin_settings=dict(CASBOX_KEYS,
                                               casbox_cross_message="no")),
}
for _size in ("4M", "8M", "16M"):
    PEERS["casbox-bc" + _size.lower()] = dict(
        mail_location="casbox:~/casbox", mail_plugins=["casbox"],
        extra_conf=CONF, plugin_settings=dict(
            CASBOX_KEYS, casbox_base_cache_size=_size))


def tree_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


def load(folder, n):
    msgs = []
    for path in corpus_files(folder, limit=n):
        with open(path, "rb") as f:
            msgs.append(f.read().replace(b"\r\n", b"\n")
                        .replace(b"\n", b"\r\n"))
    return msgs


def one_round(name, msgs, args):
    """name: a peer, or peer@builddir for that peer with the plugins of
    another build tree (an A/B of two builds)"""
    res = {}
    peer, _, builddir = name.partition("@")
    dovecot_harness.TOP_BUILDDIR = builddir or DEFAULT_BUILDDIR
    with Dovecot(**PEERS[peer]) as dc:
        t0 = time.perf_counter()
        dc.lmtp_deliver_many(USER, msgs)
        res["lmtp_msg_s"] = len(msgs) / (time.perf_counter() - t0)
        res["lmtp_cpu_ms_msg"] = (service_cpu_s(dc, "lmtp") * 1000
                                  / len(msgs))
        res["store_mb"] = tree_bytes(dc.home(USER)) / 1e6

        with RawIMAP(dc.imap_port) as c:
            c.login(USER, PASSWORD)
            n = c.select("INBOX")
            assert n == len(msgs), (name, n)
            rates = []
            cpu0 = service_cpu_s(dc, "imap")
            fetched = 0
            for _ in range(args.reps):
                t0 = time.perf_counter()
                total = c.fetch_bodies("1:*", lambda uid, body: None)
                rates.append(total / (time.perf_counter() - t0) / 1e6)
                fetched += total
            res["fetch_mb_s"] = max(rates)
            # CPU of the imap process per MB: what the server spends,
            # unlike MB/s hardly moved by other jobs on the machine
            res["fetch_cpu_ms_mb"] = ((service_cpu_s(dc, "imap") - cpu0) * 1000
                                      / (fetched / 1e6))

            # partial fetches from the middle of the largest messages
            big = sorted(range(len(msgs)), key=lambda i: -len(msgs[i]))
            big = big[:args.large]
            t0 = time.perf_counter()
            for i in big:
                off = len(msgs[i]) // 2
                c.command("UID FETCH %d (BODY.PEEK[]<%d.65536>)"
                          % (i + 1, off))
            res["partial_ms"] = ((time.perf_counter() - t0)
                                 / len(big) * 1000)

        with RawIMAP(dc.imap_port) as c:
            c.login(USER, PASSWORD)
            c.select("INBOX")
            t0 = time.perf_counter()
            c.command("FETCH 1:* (BODYSTRUCTURE)")
            res["bodystructure_s"] = time.perf_counter() - t0
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=1000, help="messages")
    ap.add_argument("--folder", default="usrp-users-3000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3,
                    help="FETCH BODY.PEEK[] repetitions per round (best)")
    ap.add_argument("--large", type=int, default=20,
                    help="largest messages for the partial fetch")
    ap.add_argument("--peers", default="sdbox,casbox",
                    help="comma-separated: " + ", ".join(PEERS)
                    + "; peer@builddir: that build's plugins")
    args = ap.parse_args()

    msgs = load(args.folder, args.n)
    print("%d messages, %.1f MB from %s" % (
        len(msgs), sum(map(len, msgs)) / 1e6, args.folder))
    peers = args.peers.split(",")
    results = {p: [] for p in peers}
    for r in range(args.rounds):
        order = peers if r % 2 == 0 else list(reversed(peers))
        for p in order:
            res = one_round(p, msgs, args)
            results[p].append(res)
            print("round %d %-13s %s" % (r + 1, p, " ".join(
                "%s=%.2f" % kv for kv in sorted(res.items()))),
                flush=True)

    keys = ["lmtp_msg_s", "lmtp_cpu_ms_msg", "store_mb", "fetch_mb_s",
            "fetch_cpu_ms_mb", "partial_ms", "bodystructure_s"]
    med = {p: {k: statistics.median(x[k] for x in results[p])
               for k in keys} for p in peers}
    ratios = [p for p in peers if p != "sdbox"] if "sdbox" in peers else []
    print("\nmedian of %d rounds" % args.rounds)
    w = {p: max(12, len(p) + 2) for p in peers}
    rw = {p: max(18, len(p) + 8) for p in ratios}
    print("%-16s" % "" + "".join("%*s" % (w[p], p) for p in peers)
          + "".join("%*s" % (rw[p], p + "/sdbox") for p in ratios))
    for k in keys:
        line = "%-16s" % k + "".join("%*.2f" % (w[p], med[p][k])
                                     for p in peers)
        for p in ratios:
            line += ("%*.2f" % (rw[p], med[p][k] / med["sdbox"][k])
                     if med["sdbox"][k] else "%*s" % (rw[p], "-"))
        print(line)


if __name__ == "__main__":
    main()
