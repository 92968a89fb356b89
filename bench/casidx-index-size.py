#!/usr/bin/env python3
"""casidx index size and `doveadm index` cost on the shared corpus.

Every message of ../shared/corpus (or --folders) is delivered by LMTP to
one user's casbox INBOX with casidx (sealed segments: the default with a
casbox key), then `doveadm index -u user1 INBOX` runs under
`/usr/bin/time -f '%M %e'`. Prints the index bytes (st_blocks * 512 of
every file under the casidx directories) per mail byte, the doveadm
process's peak RSS and its wall time. One build per run (choose it with
CASBOX_TOP_BUILDDIR); run the builds to compare in the same minutes.
Sizes are what the format gives; the time is reported, never asserted.

  CASBOX_TOP_BUILDDIR=build CASBOX_TOP_SRCDIR=$PWD \\
      python3 bench/casidx-index-size.py
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
from dovecot_harness import Dovecot, DOVEADM, corpus_dir  # noqa: E402

FOLDERS = ("usrp-users-3000", "spamassassin", "notmuch", "mime-edge")


def corpus_messages(folders):
    """Bytes of every message file of the folders (recursively), in
    sorted path order; README files are not mail."""
    msgs = []
    for folder in folders:
        for root, dirs, files in sorted(os.walk(os.path.join(corpus_dir(),
                                                             folder))):
            dirs.sort()
            for name in sorted(files):
                if name.startswith(".") or name.lower().endswith(".md"):
                    continue
                with open(os.path.join(root, name), "rb") as f:
                    msgs.append(f.read())
    return msgs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--folders", default=",".join(FOLDERS),
                    help="corpus folders, comma-separated")
    ap.add_argument("--plain", action="store_true",
                    help="fts_casidx_encrypt = no (unsealed segments)")
    args = ap.parse_args()
    msgs = corpus_messages(args.folders.split(","))
    settings = {"casbox_key_file": "%h/casbox.key",
                "casbox_key_autocreate": "yes", "fts": "casidx"}
    if args.plain:
        settings["fts_casidx_encrypt"] = "no"
    with Dovecot(mail_plugins=["casbox", "fts", "fts_casidx"],
                 plugin_settings=settings,
                 extra_conf="mail_fsync = never\n") as dc:
        for i in range(0, len(msgs), 500):
            dc.lmtp_deliver_many("user1", msgs[i:i + 500])
        res = subprocess.run(dc.command("/usr/bin/time", "-f", "%M %e",
                                        DOVEADM, "-c", dc.conf_path, "index",
                                        "-u", "user1", "INBOX"),
                             capture_output=True, text=True, check=True)
        rss_kb, wall = res.stderr.strip().splitlines()[-1].split()
        index = 0
        for root, dirs, files in os.walk(dc.home("user1")):
            if "casidx" not in root:
                continue
            for name in files:
                index += os.stat(os.path.join(root, name)).st_blocks * 512
    mail = sum(map(len, msgs))
    print("messages %d, mail bytes %d" % (len(msgs), mail))
    print("index bytes %d = %.4f per mail byte" % (index, index / mail))
    print("doveadm index: peak RSS %.1f MB, %s s"
          % (int(rss_kb) / 1024, wall))


if __name__ == "__main__":
    main()
