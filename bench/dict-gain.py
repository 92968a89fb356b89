#!/usr/bin/env python3
"""What a trained zstd dictionary saves on mail delivered after it was
trained (issue 16: the dictionary lever), per corpus folder, in one run:

    CASBOX_TOP_BUILDDIR=build python3 bench/dict-gain.py \\
        [--train N] [--rest N] [folder ...]

For each folder (default: every folder of ../shared/corpus), two fresh
casbox users get the folder's first N messages (--train, default 300)
by LMTP. One of them then trains a dictionary (`doveadm casbox dict
train`, what casbox_dict_autotrain does by itself, which is off for
both); the other does not. Both then get the next messages (--rest, default 600). Reported:
the bytes that second delivery added to each user's casbox root (packs
and LSM: allocated blocks), per byte of mail, and their ratio: what the
dictionary saves after it exists, without the dictionary file itself
(bench/dict-autotrain.py measures whole stores, the file included).
Sizes are reported, never asserted."""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

from dovecot_harness import Dovecot, corpus_dir, load  # noqa: E402
import bench  # noqa: E402
import storage  # noqa: E402

# the "no dictionary" user must not train one by itself either
KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes",
        "casbox_dict_autotrain": "0"}


def run(msgs_train, msgs_rest, train, settings):
    conf = storage.COMMON_CONF + "lmtp_add_received_header = no\n"
    plugin = dict(KEYS)
    plugin.update(settings)
    with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                 plugin_settings=plugin, extra_conf=conf) as dc:
        dc.lmtp_deliver_many("u1", msgs_train)
        if train:
            dc.doveadm("casbox", "dict", "train", "-u", "u1")
        root = os.path.join(dc.home("u1"), "casbox")
        before = storage.disk_usage(root)[0]
        dc.lmtp_deliver_many("u1", msgs_rest)
        return storage.disk_usage(root)[0] - before


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", type=int, default=300)
    ap.add_argument("--rest", type=int, default=600)
    ap.add_argument("--set", action="append", default=[],
                    help="casbox plugin setting NAME=VALUE (both users)")
    ap.add_argument("folders", nargs="*")
    args = ap.parse_args()
    settings = dict(s.split("=", 1) for s in args.set)
    folders = args.folders or ["mime-edge", "notmuch", "spamassassin",
                               "usrp-users-3000"]
    print("| folder | messages after training | mail bytes | "
          "no dictionary | dictionary | ratio |")
    print("|---|---|---|---|---|---|")
    for folder in folders:
        msgs = load(bench.corpus_paths(os.path.join(corpus_dir(), folder)))
        n_train = min(args.train, len(msgs) // 3)
        train, rest = msgs[:n_train], msgs[n_train:n_train + args.rest]
        mail = sum(len(m) for m in rest)
        without = run(train, rest, False, settings)
        with_dict = run(train, rest, True, settings)
        print("| %s | %d | %d | %.4f | %.4f | %.3f |" % (
            folder, len(rest), mail, without / mail, with_dict / mail,
            with_dict / without))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
