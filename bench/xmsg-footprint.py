#!/usr/bin/env python3
"""Bytes on disk of one copy of a corpus folder (or the whole corpus)
delivered by LMTP into casbox, with casbox_cross_message = no and then
yes in the same run (issue 16 step 4, cross-message compression in the
store): the footprint the deltas save on their own.

    CASBOX_TOP_BUILDDIR=build python3 bench/xmsg-footprint.py [folder|all ...]

(default usrp-users-3000; "all" = every folder of the corpus, in the
order bench/run --space-all saves them). One line per folder and
setting: pack bytes, the whole casbox root (packs, LSM, indexes) and
each per mail byte, the delta blobs (from tests/storage-dump) and the
lead parts written."""

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "e2e"))
from dovecot_harness import Dovecot, corpus_dir, corpus_files, load  # noqa

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}


def tree_size(root):
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def all_paths():
    """As bench/bench.py corpus_messages(): sorted by folder, then name,
    non-empty .eml files."""
    paths = []
    for dirpath, dirs, files in os.walk(corpus_dir()):
        dirs.sort()
        paths.extend(os.path.join(dirpath, f) for f in sorted(files)
                     if f.endswith(".eml")
                     and os.path.getsize(os.path.join(dirpath, f)) > 0)
    return paths


def deltas(dc):
    exe = os.path.join(os.environ.get("CASBOX_TOP_BUILDDIR", "."),
                       "tests", "storage-dump")
    root = os.path.join(dc.home("user1"), "casbox")
    res = subprocess.run([exe, root], user=dc.uid, group=dc.gid,
                         capture_output=True, text=True)
    lines = res.stdout.splitlines()
    return (sum(1 for ln in lines if ln.startswith("d ")),
            sum(1 for ln in lines if ln.startswith("b ")),
            res.returncode)


def main():
    folders = sys.argv[1:] or ["usrp-users-3000"]
    for folder in folders:
        paths = all_paths() if folder == "all" else corpus_files(folder)
        msgs = load(paths)
        raw = sum(len(m) for m in msgs)
        for xmsg in ("no", "yes"):
            settings = dict(KEYS, casbox_cross_message=xmsg)
            with Dovecot(mail_location="casbox:~/casbox",
                         mail_plugins=["casbox"], plugin_settings=settings,
                         extra_conf="lmtp_add_received_header = no\n") as dc:
                dc.lmtp_deliver_many("user1", msgs)
                root = os.path.join(dc.home("user1"), "casbox")
                packs = tree_size(os.path.join(root, "packs"))
                whole = tree_size(root)
                nd, nb, rc = deltas(dc)
                print("%s casbox_cross_message=%s: %d messages, %d bytes, "
                      "packs %d (%.4f), casbox root %d (%.4f), "
                      "%d delta blobs of %d blobs, audit %s"
                      % (folder, xmsg, len(msgs), raw, packs, packs / raw,
                         whole, whole / raw, nd, nb,
                         "clean" if rc == 0 else "MISMATCH"), flush=True)


if __name__ == "__main__":
    main()
