#!/usr/bin/env python3
"""What duplicate suppression and the undelete window cost, A/B
interleaved (doc/casbox-storage.md, "Duplicate deliveries" and "Undelete
window").

Peers: "off" (casbox_duplicate_window = 0, casbox_expunge_retention = 0:
the behaviour before both) and "on" (1d and 7d). Each round starts a
fresh Dovecot per peer with the e2e harness (mail_fsync = optimized) and
  - LMTP-delivers N corpus messages over one connection: msg/s and the
    lmtp processes' CPU ms per message (the dup key hashes every
    message once more, and the save writes one more record);
  - to a second user, delivers the N twice; the second pass is timed:
    "on" suppresses all of them (redeliver_msg_s), "off" stores them
    again (dedup: only the header blobs with LMTP's Received are new);
  - expunges the first N through IMAP (ms for the EXPUNGE),
    then reads doveadm casbox stats (lsm_bytes, stored_bytes,
    retained_bytes);
  - "on" only: doveadm casbox undelete of all N (ms per message).
Peers alternate order per round; medians and on/off ratios are printed.
Speed is reported, never asserted.

  CASBOX_TOP_BUILDDIR=build python3 bench/mail-safety.py -n 300 --rounds 3
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

from dovecot_harness import Dovecot, PASSWORD, corpus_files  # noqa: E402
from imapraw import RawIMAP  # noqa: E402
from stats import service_cpu_s  # noqa: E402

USER = "safetybench"
USER2 = "safetybench2"
CONF = "mail_fsync = optimized\n"
KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
PEERS = {
    "off": dict(KEYS, casbox_duplicate_window="0",
                casbox_expunge_retention="0"),
    "on": dict(KEYS, casbox_duplicate_window="1d",
               casbox_expunge_retention="7d"),
}


def stats(dc):
    res = dc.doveadm("-f", "tab", "casbox", "stats", "-u", USER)
    head, row = res.stdout.strip().split("\n")[:2]
    return dict(zip(head.split("\t"), row.split("\t")))


def one_round(name, msgs):
    res = {}
    with Dovecot(plugin_settings=PEERS[name], extra_conf=CONF) as dc:
        t0 = time.perf_counter()
        dc.lmtp_deliver_many(USER, msgs)
        res["lmtp_msg_s"] = len(msgs) / (time.perf_counter() - t0)
        res["lmtp_cpu_ms_msg"] = (service_cpu_s(dc, "lmtp") * 1000
                                  / len(msgs))
        s = stats(dc)
        res["lsm_kb_delivered"] = int(s["lsm_bytes"]) / 1e3
        dc.lmtp_deliver_many(USER2, msgs)
        t0 = time.perf_counter()
        dc.lmtp_deliver_many(USER2, msgs)
        res["redeliver_msg_s"] = len(msgs) / (time.perf_counter() - t0)
        with RawIMAP(dc.imap_port) as c:
            c.login(USER, PASSWORD)
            c.select("INBOX")
            c.command("UID STORE 1:%d +FLAGS.SILENT (\\Deleted)"
                      % len(msgs))
            t0 = time.perf_counter()
            c.command("EXPUNGE")
            res["expunge_ms"] = (time.perf_counter() - t0) * 1000
        s = stats(dc)
        res["lsm_kb_expunged"] = int(s["lsm_bytes"]) / 1e3
        res["stored_mb"] = int(s["stored_bytes"]) / 1e6
        res["retained_mb"] = int(s["retained_bytes"]) / 1e6
        if name == "on":
            t0 = time.perf_counter()
            dc.doveadm("casbox", "undelete", "-u", USER)
            res["undelete_ms_msg"] = ((time.perf_counter() - t0) * 1000
                                      / len(msgs))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    msgs = []
    for path in corpus_files("usrp-users-3000", limit=args.n):
        with open(path, "rb") as f:
            msgs.append(f.read().replace(b"\r\n", b"\n")
                        .replace(b"\n", b"\r\n"))
    results = {p: [] for p in PEERS}
    for r in range(args.rounds):
        order = list(PEERS) if r % 2 == 0 else list(reversed(PEERS))
        for name in order:
            results[name].append(one_round(name, msgs))
            print(name, results[name][-1], file=sys.stderr)
    keys = ["lmtp_msg_s", "lmtp_cpu_ms_msg", "lsm_kb_delivered",
            "redeliver_msg_s", "expunge_ms", "lsm_kb_expunged", "stored_mb",
            "retained_mb", "undelete_ms_msg"]
    print("%-18s %10s %10s %8s" % ("median", "off", "on", "on/off"))
    for k in keys:
        off = [r[k] for r in results["off"] if k in r]
        on = [r[k] for r in results["on"] if k in r]
        mo = statistics.median(off) if off else None
        mn = statistics.median(on) if on else None
        ratio = ("%.2f" % (mn / mo)) if mo and mn else "-"
        print("%-18s %10s %10s %8s" % (
            k, "-" if mo is None else "%.2f" % mo,
            "-" if mn is None else "%.2f" % mn, ratio))


if __name__ == "__main__":
    main()
