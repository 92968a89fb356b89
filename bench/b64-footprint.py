#!/usr/bin/env python3
"""Pack bytes of one corpus folder delivered by LMTP into casbox, with
casbox_decode_base64 = no and then yes (issue 16 step 3, base64 leaves
stored decoded): the footprint the transform saves on its own.

    CASBOX_TOP_BUILDDIR=build python3 bench/b64-footprint.py [folder]

(default folder usrp-users-3000; prints one line per setting)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "e2e"))
from dovecot_harness import Dovecot, corpus_files, load  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}


def tree_size(root):
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "usrp-users-3000"
    msgs = load(corpus_files(folder))
    raw = sum(len(m) for m in msgs)
    for decode in ("no", "yes"):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=dict(KEYS,
                                          casbox_decode_base64=decode),
                     extra_conf="lmtp_add_received_header = no\n") as dc:
            dc.lmtp_deliver_many("user1", msgs)
            packs = tree_size(os.path.join(dc.home("user1"), "casbox",
                                           "packs"))
            print("%s casbox_decode_base64=%s: %d messages, %d bytes, "
                  "packs %d (%.3f)" % (folder, decode, len(msgs), raw,
                                       packs, packs / raw), flush=True)


if __name__ == "__main__":
    main()
