#!/usr/bin/env python3
"""casbox_key_mode = server vs password: LMTP delivery and the first read
of a session, A/B interleaved on the e2e harness.

Each round starts a fresh Dovecot per mode (the passdb hands the login
password over with override_fields = userdb_casbox_key_password=%w, as
doc/settings.md says), creates the key with one IMAP login, LMTP-delivers
the same N corpus messages (seconds), then times --logins fresh IMAP
sessions that LOGIN, SELECT and FETCH one body (median seconds). In
password mode each such session unlocks the user key: one Argon2id run
(libsodium INTERACTIVE, 64 MiB) plus an X25519 box open per blob read.
Speed is reported, never asserted.

  CASBOX_TOP_BUILDDIR=build CASBOX_CORPUS=../shared/corpus \\
      python3 bench/casbox-keymode.py -n 300 --rounds 3
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
from dovecot_harness import Dovecot, corpus_files  # noqa: E402

PASSDB = "override_fields = userdb_casbox_key_password=%w"
MODES = {
    "server": {"casbox_key_file": "%h/casbox.key",
               "casbox_key_autocreate": "yes"},
    "password": {"casbox_key_file": "%h/casbox.ukey",
                 "casbox_key_autocreate": "yes",
                 "casbox_key_mode": "password"},
}


def one_round(mode, msgs, logins):
    with Dovecot(plugin_settings=MODES[mode], passdb_extra=PASSDB) as dc:
        imap = dc.imap_login("user1")
        imap.select("INBOX")
        imap.logout()
        start = time.monotonic()
        dc.lmtp_deliver_many("user1", msgs)
        deliver = time.monotonic() - start
        times = []
        for _ in range(logins):
            start = time.monotonic()
            imap = dc.imap_login("user1")
            imap.select("INBOX")
            typ, _ = imap.fetch("1", "(BODY.PEEK[])")
            if typ != "OK":
                raise RuntimeError("FETCH failed in %s mode" % mode)
            imap.logout()
            times.append(time.monotonic() - start)
        return deliver, statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=300, help="messages")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--logins", type=int, default=5)
    args = ap.parse_args()
    paths = corpus_files("usrp-users-3000", limit=args.n,
                         step=max(1, 3000 // args.n))
    msgs = []
    for path in paths:
        with open(path, "rb") as f:
            msgs.append(f.read())
    res = {m: [] for m in MODES}
    for rnd in range(args.rounds):
        order = list(MODES) if rnd % 2 == 0 else list(reversed(MODES))
        for mode in order:
            deliver, login = one_round(mode, msgs, args.logins)
            res[mode].append((deliver, login))
            print("round %d %-8s deliver %d msgs %.2f s, "
                  "login+select+fetch %.3f s" %
                  (rnd + 1, mode, len(msgs), deliver, login), flush=True)
    med = {m: (statistics.median(d for d, _ in r),
               statistics.median(x for _, x in r)) for m, r in res.items()}
    print("median: deliver password/server %.2f; login+select+fetch "
          "server %.3f s, password %.3f s (+%.3f s)" %
          (med["password"][0] / med["server"][0], med["server"][1],
           med["password"][1], med["password"][1] - med["server"][1]))


if __name__ == "__main__":
    main()
