#!/usr/bin/env python3
"""Many IMAP clients on one user: the mixed load of
tests/e2e/imap_load.py (APPEND, FETCH whole/partial/BINARY/BODYSTRUCTURE,
STORE, COPY, MOVE, EXPUNGE, SELECT, LIST, STATUS, SEARCH, with LMTP
deliveries, doveadm purge/gc/index and the indexer-worker beside them)
against casbox and sdbox, at several client counts, in the same run.
Reports commands/s, the casbox/sdbox ratio (median [min-max] over the
rounds; backends interleaved, the order reversed every other round) and
every error either backend gave (BYE, NO/BAD other than the ones for
messages expunged by another session, failed deliveries or doveadm
runs).

Part of bench/bench.py (results["concurrency"]); standalone:

    python3 bench/concurrency.py --builddir build [--clients 1,5,10,20]
                                 [--seconds 20] [--rounds 2]
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

from stats import summarize  # noqa: E402

BACKENDS = ("sdbox", "casbox")


def run_concurrency(clients, seconds, rounds, log):
    import imap_load
    import test_imap_concurrency as t
    from dovecot_harness import Dovecot

    msgs = t.sample()
    runs = []
    for r in range(rounds):
        for n in clients:
            order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]
            row = {"round": r, "clients": n}
            for name in order:
                with Dovecot(extra_conf=t.CONF, **t.BACKENDS[name]) as dc:
                    imap_load.prepare(dc, t.USER, msgs)
                    res = imap_load.run_load(dc, t.USER, msgs, n, seconds,
                                             seed=11 + r,
                                             admin_cmds=t.ADMIN[name])
                    # counted here, not raised at exit: a bench goes on
                    dc.stop()
                    log_problems = dc.log_problems()
                    dc.allow_log(".")
                row[name] = {
                    "commands_per_s": res.rate(),
                    "commands": res.total(),
                    "byes": len(res.byes),
                    "bad_replies": len(res.bad_replies),
                    "other_errors": len(res.other_errors),
                    "log_problems": len(log_problems),
                    "expunge_race_nos": sum(res.benign.values()),
                    "ms_per_op": {op: 1000 * res.op_seconds[op] /
                                  max(1, res.commands[op])
                                  for op in res.op_seconds},
                    "examples": [repr(x)[:200] for x in
                                 (res.byes + res.bad_replies +
                                  res.other_errors)[:3]] +
                                [p[:200] for p in log_problems[:3]],
                }
                log("concurrency round %d, %d clients, %s: %s"
                    % (r, n, name, res.summary().split("\n")[0]))
            runs.append(row)
    return {"clients": list(clients), "seconds": seconds, "rounds": rounds,
            "runs": runs}


def errors(b):
    return (b["byes"] + b["bad_replies"] + b["other_errors"] +
            b["log_problems"])


def markdown(conc):
    L = []
    w = L.append
    w("## Many IMAP clients on one mailbox")
    w("")
    if "error" in conc:
        w("Not measured: %s" % conc["error"])
        return L
    w("`bench/concurrency.py` (the load of tests/e2e/imap_load.py, %.0f s "
      "per backend and client count, %d rounds, backends interleaved): "
      "each client does APPEND, FETCH (whole, partial, BINARY, "
      "BODYSTRUCTURE), STORE, COPY, MOVE, EXPUNGE, SELECT, LIST, STATUS and "
      "SEARCH at random by UID on three mailboxes of one user, with one "
      "LMTP deliverer, a doveadm loop (purge, index; casbox also gc) and "
      "the indexer-worker (fts casidx, fts_autoindex) beside them. Errors "
      "= BYEs and dropped connections + tagged NO/BAD other than those "
      "for messages another session expunged + failed deliveries and "
      "doveadm runs + Error/Fatal/Panic log lines, summed over the "
      "rounds. Ratio: casbox/sdbox commands/s within a round, median "
      "[min-max]." % (conc["seconds"], conc["rounds"]))
    w("")
    w("| clients | sdbox commands/s | casbox commands/s | casbox/sdbox | "
      "sdbox errors | casbox errors |")
    w("|---|---|---|---|---|---|")
    for n in conc["clients"]:
        rows = [r for r in conc["runs"] if r["clients"] == n]
        rate = {b: summarize([r[b]["commands_per_s"] for r in rows])
                for b in BACKENDS}
        ratio = summarize([r["casbox"]["commands_per_s"] /
                           r["sdbox"]["commands_per_s"] for r in rows
                           if r["sdbox"]["commands_per_s"]])
        w("| %d | %.0f | %.0f | %.2fx [%.2fx-%.2fx] | %d | %d |"
          % (n, rate["sdbox"]["median"], rate["casbox"]["median"],
             ratio["median"], ratio["min"], ratio["max"],
             sum(errors(r["sdbox"]) for r in rows),
             sum(errors(r["casbox"]) for r in rows)))
    w("")
    return L


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--builddir", default=os.environ.get(
        "CASBOX_TOP_BUILDDIR", "build"))
    ap.add_argument("--clients", default="1,5,10,20")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    os.environ["CASBOX_TOP_BUILDDIR"] = os.path.abspath(args.builddir)
    res = run_concurrency([int(c) for c in args.clients.split(",")],
                          args.seconds, args.rounds,
                          lambda m: sys.stderr.write(m + "\n"))
    print("\n".join(markdown(res)))


if __name__ == "__main__":
    main()
