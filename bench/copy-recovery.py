#!/usr/bin/env python3
"""What the recovery records cost: COPY and LMTP delivery timed on one
build (CASBOX_TOP_BUILDDIR). A copy writes no blob, but since recovery
records it appends a sealed record to a pack and fsyncs the pack. Run it
against two builds in alternating rounds and compare ratios:

  for i in 1 2 3; do
    for b in /tmp/base/build /work/wt-frompacks/build; do
      CASBOX_TOP_BUILDDIR=$b python3 bench/copy-recovery.py -n 200
    done
  done

Prints one line: build, LMTP msg/s, single-message UID COPY per second
(one command per message), bulk UID COPY 1:N seconds. Speed is reported,
never asserted.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

from dovecot_harness import Dovecot, corpus_files  # noqa: E402

USER = "copybench"
KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200)
    args = ap.parse_args()
    msgs = []
    for path in corpus_files("usrp-users-3000", limit=args.n):
        with open(path, "rb") as f:
            msgs.append(f.read())
    with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                 plugin_settings=KEYS,
                 extra_conf="mail_fsync = optimized\n") as dc:
        t0 = time.perf_counter()
        dc.lmtp_deliver_many(USER, msgs)
        lmtp = len(msgs) / (time.perf_counter() - t0)
        dc.doveadm("mailbox", "create", "-u", USER, "One", "Bulk")
        imap = dc.imap_login(USER)
        try:
            imap.select("INBOX")
            t0 = time.perf_counter()
            for uid in range(1, len(msgs) + 1):
                typ, resp = imap.uid("COPY", str(uid), "One")
                assert typ == "OK", resp
            single = len(msgs) / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            typ, resp = imap.uid("COPY", "1:*", "Bulk")
            assert typ == "OK", resp
            bulk = time.perf_counter() - t0
        finally:
            imap.logout()
    print("%s lmtp_msg_s=%.1f copy_single_msg_s=%.1f copy_bulk_s=%.3f"
          % (os.environ.get("CASBOX_TOP_BUILDDIR", "?"), lmtp, single,
             bulk))


if __name__ == "__main__":
    main()
