#!/usr/bin/env python3
"""The demo behind scripts/demo: see that script."""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "e2e"))
from dovecot_harness import Dovecot, PASSWORD, corpus_files  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=300,
                    help="messages to deliver from usrp-users-3000")
    ap.add_argument("--query", default="firmware",
                    help="word to search for in message bodies")
    args = ap.parse_args()

    with Dovecot(mail_location="casbox:~/casbox", system_doveadm_plugin=True,
                 mail_plugins=["casbox", "fts", "fts_casidx"],
                 plugin_settings={
                     "casbox_key_file": "%h/casbox.key",
                     "casbox_key_autocreate": "yes",
                     "fts": "casidx",
                     "fts_autoindex": "yes",
                 }) as dc:
        files = (corpus_files("usrp-users-3000", limit=args.messages)
                 + corpus_files("mime-edge", limit=20))
        messages = []
        for path in files:
            with open(path, "rb") as f:
                messages.append(f.read())
        print("demo: delivering %d messages to user 'demo' over LMTP..."
              % len(messages))
        dc.lmtp_deliver_many("demo", messages)

        imap = dc.imap_login("demo")
        typ, data = imap.select("INBOX")
        print("demo: INBOX has %s messages" % data[0].decode())
        typ, data = imap.uid("SEARCH", "BODY", args.query)
        uids = data[0].split()
        print("demo: UID SEARCH BODY %s -> %d matches: %s"
              % (args.query, len(uids),
                 b" ".join(uids[:20]).decode() + (" ..." if len(uids) > 20
                                                  else "")))
        if uids:
            typ, data = imap.uid("FETCH", uids[0],
                                 "(BODY.PEEK[HEADER.FIELDS (FROM SUBJECT)])")
            print("demo: first match:\n  "
                  + data[0][1].decode(errors="replace").strip()
                  .replace("\r\n", "\n  "))
        imap.logout()

        print("demo: doveadm casbox stats -u demo")
        print(dc.doveadm("casbox", "stats", "-u", "demo").stdout.rstrip())

        print()
        print("Dovecot with casbox + casidx is running:")
        print("  IMAP  127.0.0.1:%d  user demo  password %s"
              % (dc.imap_port, PASSWORD))
        print("  LMTP  127.0.0.1:%d" % dc.lmtp_port)
        print("  doveadm -c %s casbox version" % dc.conf_path)
        print("  files: %s" % dc.home("demo"))
        if sys.stdin.isatty():
            try:
                input("Press Enter to stop the demo. ")
            except (EOFError, KeyboardInterrupt):
                pass
    print("demo: stopped")


if __name__ == "__main__":
    main()
