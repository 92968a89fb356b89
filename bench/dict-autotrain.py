#!/usr/bin/env python3
"""casbox_dict_autotrain on whole stores (issue 16): each set of mail is
delivered by LMTP into a fresh casbox user with the setting at N
(default 500, the default) and into one with it off; reported: the
allocated bytes of the whole casbox root per mail byte (the dictionary
file included, which bench/dict-gain.py leaves out), the dictionary's
size and the ratio. Sizes are reported, never asserted.

    CASBOX_TOP_BUILDDIR=build python3 bench/dict-autotrain.py [N]

Sets: bench/run's 300-message sample of the whole corpus, mime-edge,
notmuch, the first 1500 SpamAssassin messages."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

import dovecot_harness as harness  # noqa: E402
from dovecot_harness import Dovecot, load  # noqa: E402
import storage  # noqa: E402
import bench  # noqa: E402


def folder(name):
    return bench.corpus_paths(os.path.join(harness.corpus_dir(), name))


def store_bytes(msgs, autotrain):
    """(casbox root bytes, dictionary file bytes) after msgs."""
    settings = {"casbox_key_file": "%h/casbox.key",
                "casbox_key_autocreate": "yes",
                "casbox_dict_autotrain": autotrain}
    with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                 plugin_settings=settings,
                 extra_conf=storage.COMMON_CONF
                 + "lmtp_add_received_header = no\n") as dc:
        dc.lmtp_deliver_many("u1", msgs)
        root = os.path.join(dc.home("u1"), "casbox")
        packs = os.path.join(root, "packs")
        dicts = sum(os.path.getsize(os.path.join(packs, f))
                    for f in os.listdir(packs) if f.startswith("dict-"))
        return storage.disk_usage(root)[0], dicts


def main():
    n = sys.argv[1] if len(sys.argv) > 1 else "500"
    sets = [("sample300", bench.corpus_messages(harness, 300)[1]),
            ("mime-edge", folder("mime-edge")),
            ("notmuch", folder("notmuch")),
            ("spamassassin-1500", folder("spamassassin")[:1500])]
    print("| set | messages | autotrain %s | dictionary bytes | off | "
          "ratio |" % n)
    print("|---|---|---|---|---|---|")
    for name, paths in sets:
        msgs = load(paths)
        mail = sum(len(m) for m in msgs)
        on, dicts = store_bytes(msgs, n)
        off, _ = store_bytes(msgs, "0")
        print("| %s | %d | %.4f | %d | %.4f | %.4f |" % (
            name, len(msgs), on / mail, dicts, off / mail, on / off))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
