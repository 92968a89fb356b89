"""Long doveadm casbox runs (scrub, gc --all, key rotate, rebuild
--from-packs) show a progress line when stderr is a terminal, and print
nothing of it otherwise (cron, scripts): the same commands against the
same store, once with stderr a pipe, once a pseudo-terminal."""

import os
import pty
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
# what each command's progress line starts with (doc/doveadm.md)
COMMANDS = [
    (("casbox", "scrub"), ["scrub: pack frames: ", "scrub: blobs decoded: "]),
    (("casbox", "gc", "--all"), ["gc: pack frames: ",
                                  "gc: copying live blobs: "]),
    # each run below is one rotation: started, then finished
    (("casbox", "key", "rotate", "--finish"), ["key rotate: "]),
    (("casbox", "rebuild", "--from-packs"),
     ["rebuild --from-packs: pack frames: ",
      "rebuild --from-packs: messages opened: "]),
]
PROGRESS_MARKS = ("\r", "\033[K")


def run_on_pty(argv):
    """(exit status, what went to stderr) with stderr a terminal."""
    master, slave = pty.openpty()
    chunks = []

    def reader():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:          # EIO: the last writer closed
                return
            if not data:
                return
            chunks.append(data)

    t = threading.Thread(target=reader)
    t.start()
    try:
        res = subprocess.run(argv, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=slave,
                             timeout=600)
    finally:
        os.close(slave)
        t.join(60)
        os.close(master)
    return res.returncode, b"".join(chunks).decode("utf-8", "replace")


class DoveadmProgressTest(unittest.TestCase):

    def test_progress_only_on_a_terminal(self):
        msgs = []
        for path in corpus_files("usrp-users-3000", limit=30, step=50):
            with open(path, "rb") as f:
                msgs.append(f.read())
        with Dovecot(plugin_settings=KEYS) as dc:
            dc.lmtp_deliver_many("user1", msgs)
            for args, lines in COMMANDS:
                if args[-1] == "--finish":
                    dc.doveadm(*args[:-1], "-u", "user1")
                # not a terminal: no progress at all
                res = dc.doveadm(*args, "-u", "user1")
                for mark in PROGRESS_MARKS:
                    self.assertNotIn(mark, res.stderr, args)
                for line in lines:
                    self.assertNotIn(line, res.stderr, args)
                if args[-1] == "--finish":
                    dc.doveadm(*args[:-1], "-u", "user1")
                # a terminal: the line, rewritten in place, then ended
                rc, err = run_on_pty(dc.doveadm_command(*args, "-u",
                                                        "user1"))
                self.assertEqual(rc, 0, err)
                for line in lines:
                    self.assertIn("\r" + line, err, args)
                self.assertIn("\033[K", err, args)
                self.assertTrue(err.endswith("\n"), repr(err[-80:]))
            # and the store is whole after all of it
            out = dc.doveadm("-f", "tab", "casbox", "stats",
                             "-u", "user1").stdout.split("\n")
            row = dict(zip(out[0].split("\t"), out[1].split("\t")))
            self.assertEqual(int(row["messages"]), len(msgs))
            res = dc.doveadm("casbox", "scrub", "-u", "user1")
            self.assertEqual(res.stdout.strip().count("\n"), 0, res.stdout)


if __name__ == "__main__":
    unittest.main()
