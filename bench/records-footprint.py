#!/usr/bin/env python3
"""What the LSM records cost (issue 15), on one build (CASBOX_TOP_BUILDDIR):

- COPY: N usrp-users-3000 messages delivered by LMTP to INBOX, then
  `UID COPY 1:* Copy`: growth of the casbox root (allocated bytes,
  st_blocks) in % of its size before the copy (one copy), and the
  LSM's share of it; per copied message the WAL, pack (recovery
  records) and other (Dovecot's index of the new folder) bytes.
- LSM bytes per stored message: the LSM directory (WAL and tables,
  allocated bytes, and apparent bytes) after the deliveries, divided by
  N.
- WAL bytes per flag change: `UID STORE 1:* +FLAGS.SILENT (\\Seen)` in
  INBOX (one flag change per message); the growth of the WAL files
  (apparent bytes) divided by N. casbox_lsm_wal_size is raised so the
  WAL is not flushed into a table in between.
- --wal-size 64k (the default setting) instead of the bench's 64M:
  the LSM bytes per message as a user's store has them (tables
  compressed, superseded versions merged away).
- Per record type, after the deliveries: live records and their key
  and value bytes per message (tests/storage-dump -s), so the LSM
  bytes can be told apart (m message, s shared metadata, r its
  refcount, b blob, f flags, X cross-message maps, M mailbox, ...).

  CASBOX_TOP_BUILDDIR=build python3 bench/records-footprint.py -n 800

Prints one line of key=value. Sizes are reported, never asserted.
"""

import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

from dovecot_harness import Dovecot, corpus_files, TOP_BUILDDIR  # noqa: E402

USER = "recbench"
SETTINGS = {"casbox_key_file": "%h/casbox.key",
            "casbox_key_autocreate": "yes",
            "casbox_lsm_wal_size": "64M"}


def tree_bytes(path, suffix=None):
    """(allocated, apparent) bytes of the files under path."""
    alloc = apparent = 0
    for root, _, files in os.walk(path):
        for name in files:
            if suffix is not None and not name.endswith(suffix):
                continue
            st = os.lstat(os.path.join(root, name))
            alloc += st.st_blocks * 512
            apparent += st.st_size
    return alloc, apparent


def record_sizes(dc, root):
    """{type: (count, key bytes, value bytes)} of root's live records."""
    exe = os.path.join(TOP_BUILDDIR, "tests", "storage-dump")
    out = subprocess.run([exe, "-s", root], user=dc.uid, group=dc.gid,
                         capture_output=True, text=True).stdout
    sizes = {}
    for m in re.finditer(r"^size (\S) count=(\d+) key_bytes=(\d+) "
                         r"value_bytes=(\d+)$", out, re.M):
        sizes[m.group(1)] = tuple(int(x) for x in m.group(2, 3, 4))
    return sizes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=800)
    ap.add_argument("--wal-size", default="64M",
                    help="casbox_lsm_wal_size (default 64M: nothing is "
                    "flushed, so the WAL columns are exact; the "
                    "default setting, 64k, gives the LSM as a user has "
                    "it, and then the WAL columns do not mean much)")
    args = ap.parse_args()
    settings = dict(SETTINGS, casbox_lsm_wal_size=args.wal_size)
    msgs = []
    for path in corpus_files("usrp-users-3000", limit=args.n):
        with open(path, "rb") as f:
            msgs.append(f.read())
    mail_bytes = sum(len(m) for m in msgs)
    with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                 plugin_settings=settings,
                 extra_conf="mail_fsync = optimized\n") as dc:
        root = os.path.join(dc.home(USER), "casbox")
        lsm = os.path.join(root, "lsm")
        dc.lmtp_deliver_many(USER, msgs)
        dc.doveadm("mailbox", "create", "-u", USER, "Copy")
        root1, _ = tree_bytes(root)
        packs1, _ = tree_bytes(os.path.join(root, "packs"))
        lsm1, lsm1_apparent = tree_bytes(lsm)
        wal1 = tree_bytes(lsm, ".wal")[1]
        kinds = record_sizes(dc, root)
        imap = dc.imap_login(USER)
        try:
            imap.select("INBOX")
            typ, resp = imap.uid("COPY", "1:*", "Copy")
            assert typ == "OK", resp
            root2, _ = tree_bytes(root)
            packs2, _ = tree_bytes(os.path.join(root, "packs"))
            lsm2, _ = tree_bytes(lsm)
            wal2 = tree_bytes(lsm, ".wal")[1]
            typ, resp = imap.uid("STORE", "1:*", "+FLAGS.SILENT",
                                 "(\\Seen)")
            assert typ == "OK", resp
            # the flag mirror is written at the sync after the STORE
            imap.noop()
            wal3 = tree_bytes(lsm, ".wal")[1]
        finally:
            imap.logout()
    n = len(msgs)
    print("build=%s messages=%d mail_bytes=%d root_bytes=%d "
          "copy_growth_pct=%.2f copy_lsm_share_pct=%.1f "
          "copy_wal_bytes_per_msg=%.0f copy_packs_bytes_per_msg=%.0f "
          "copy_other_bytes_per_msg=%.0f "
          "lsm_alloc_bytes_per_msg=%.0f lsm_apparent_bytes_per_msg=%.0f "
          "wal_bytes_per_flag_change=%.1f"
          % (os.environ.get("CASBOX_TOP_BUILDDIR", "?"), n, mail_bytes,
             root1, 100.0 * (root2 - root1) / root1,
             100.0 * (lsm2 - lsm1) / max(root2 - root1, 1),
             (wal2 - wal1) / n, (packs2 - packs1) / n,
             ((root2 - root1) - (lsm2 - lsm1) - (packs2 - packs1)) / n,
             lsm1 / n, lsm1_apparent / n,
             (wal3 - wal2) / n))
    print("records per message, type=count/key_bytes/value_bytes: "
          + " ".join("%s=%.2f/%.0f/%.0f" % (k, c / n, kb / n, vb / n)
                     for k, (c, kb, vb) in sorted(kinds.items())))


if __name__ == "__main__":
    main()
