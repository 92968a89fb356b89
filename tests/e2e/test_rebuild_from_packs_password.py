"""doveadm casbox rebuild --from-packs for a casbox_key_mode = password
store (doc/doveadm.md "rebuild --from-packs", doc/casbox-format.md
"Meta frame sealed to the user key").

LMTP (no password) delivers corpus mail and a marker message to INBOX;
IMAP with the password APPENDs MIME edge cases with flags and keywords
to a second mailbox with a distinctive name, COPYs INBOX mail there,
changes flags and expunges one message. Every save wrote a recovery
record sealed to the user's public key (meta frame version 2). Then the
LSM is removed and the rebuild is run:

- with no password, an empty line, the wrong password or a terminal
  on stdin: a clear error, a non-zero exit (66, 66, 65, 64), and not
  one byte under the user's home changed;
- with the password: every message comes back in its mailbox with the
  same UID, GUID, flags, keywords, internal date and bytes (read over
  IMAP with the password), mailbox GUIDs, UIDVALIDITY and UIDNEXT kept.

Neither the marker's subject and body nor the mailbox name is found in
any pack, the password never appears in doveadm's output or the log,
and keyless scrub and gc keep working on the rebuilt store.
"""

import hashlib
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (Dovecot, PASSWORD, corpus_files,  # noqa: E402
                             ok, load, found_in)
from test_rebuild import parse_tab  # noqa: E402
from test_doveadm_scrub_repair import masked_crc32c  # noqa: E402

USER = "user1"
SETTINGS = {
    "casbox_key_file": "%h/casbox.ukey",
    "casbox_key_autocreate": "yes",
    "casbox_key_mode": "password",
}
PASS_PW = "override_fields = userdb_casbox_key_password=%w"
CONF = "lmtp_add_received_header = no\n"
FOLDER = "Quokka-Ledger-Archive-4417"
MARKER_SUBJECT = b"Obsidian walrus tariff 8830"
MARKER_BODY = b"pwrecover-canary-Z3RT-body-line"
MARKER_MSG = (b"From: a@example.com\r\nSubject: " + MARKER_SUBJECT +
              b"\r\nMessage-ID: <pwrecover@example.com>\r\n\r\n" +
              MARKER_BODY + b"\r\n")
# plaintext that must not be in any pack
MARKERS = [MARKER_SUBJECT, MARKER_BODY, FOLDER.encode()]
EXPUNGED_INBOX_UID = 4


def tree_digest(root):
    """path -> (mode, size, SHA-256) of every file and directory under
    root: what "nothing changed on disk" is compared with."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs:
            path = os.path.join(dirpath, name)
            out[path] = (os.lstat(path).st_mode, None, None)
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                data = f.read()
            out[path] = (os.lstat(path).st_mode, len(data),
                         hashlib.sha256(data).hexdigest())
    return out


def meta_frames(root, where=False):
    """(version, kind) of every meta frame in the packs, walking the
    frames by their clear headers; with where, (version, kind, path,
    offset, size)."""
    out = []
    for name in sorted(os.listdir(os.path.join(root, "packs"))):
        if not name.startswith("pack-"):
            continue
        with open(os.path.join(root, "packs", name), "rb") as f:
            data = f.read()
        off = 20
        while off + 12 <= len(data):
            magic = data[off:off + 4]
            assert magic in (b"CBFR", b"CBMF"), (name, off, magic)
            size = struct.unpack_from("<I", data, off + 8)[0]
            if magic == b"CBMF":
                out.append((data[off + 4], data[off + 5]) +
                           ((os.path.join(root, "packs", name), off, size)
                            if where else ()))
            off += size
    return out


def forge_record(path, off, size):
    """Change the last byte of a meta frame's body (the box's MAC) and
    recompute both CRCs: the frame is intact for the keyless scan, only
    the MAC check can tell."""
    with open(path, "r+b") as f:
        f.seek(off)
        frame = bytearray(f.read(size))
        frame[-1] ^= 0x01
        struct.pack_into("<I", frame, 12, masked_crc32c(bytes(frame[20:])))
        struct.pack_into("<I", frame, 16, masked_crc32c(bytes(frame[:16])))
        f.seek(off)
        f.write(frame)


class Snapshot:
    """What the user sees over IMAP (with the password) and doveadm
    mailbox status: per mailbox its GUID, UIDVALIDITY, UIDNEXT and
    message count; per message UID, flags, keywords, internal date,
    size, GUID and bytes."""

    def __init__(self, dc):
        imap = dc.imap_login(USER)
        try:
            typ, data = imap.list()
            assert typ == "OK", data
            self.mailboxes = sorted(line.rsplit(b" ", 1)[1].strip(b'"')
                                    for line in data)
            self.msgs = {}
            for box in (b"INBOX", FOLDER.encode()):
                ok(imap.select(box, readonly=True))
                typ, data = imap.uid(
                    "FETCH", "1:*", "(UID FLAGS INTERNALDATE RFC822.SIZE "
                    "X-GUID BODY.PEEK[])")
                assert typ == "OK", data
                msgs = {}
                for item in data:
                    if not isinstance(item, tuple):
                        continue
                    head = item[0]
                    uid = int(re.search(rb"UID (\d+)", head).group(1))
                    flags = re.search(rb"FLAGS \(([^)]*)\)", head).group(1)
                    msgs[uid] = {
                        "flags": sorted(f for f in flags.split()
                                        if f != b"\\Recent"),
                        "date": re.search(rb'INTERNALDATE "([^"]+)"',
                                          head).group(1),
                        "size": int(re.search(rb"RFC822.SIZE (\d+)",
                                              head).group(1)),
                        "guid": re.search(rb"X-GUID (\S+)", head).group(1),
                        "body": item[1],
                    }
                self.msgs[box.decode()] = msgs
        finally:
            imap.logout()
        self.status = {}
        for box in self.msgs:
            r = dc.doveadm("-f", "tab", "mailbox", "status", "-u", USER,
                           "guid uidvalidity uidnext messages", box)
            self.status[box] = parse_tab(r.stdout)[0]


class RebuildFromPacksPasswordTest(unittest.TestCase):

    maxDiff = None

    @classmethod
    def setUpClass(cls):
        cls.inbox = load(corpus_files("usrp-users-3000", limit=25,
                                      step=113)) + [MARKER_MSG]
        cls.appended = [m for m in load(corpus_files("mime-edge",
                                                     limit=14)) if m]

    def populate(self, dc):
        # the first login creates the user key file
        imap = dc.imap_login(USER)
        ok(imap.select("INBOX"))
        imap.logout()
        dc.lmtp_deliver_many(USER, self.inbox)
        imap = dc.imap_login(USER)
        try:
            ok(imap.create(FOLDER))
            for n, msg in enumerate(self.appended):
                flags = ("(\\Flagged $Label1 Project-Z)" if n % 3 == 0
                         else "(\\Seen)" if n % 3 == 1 else None)
                ok(imap.append(FOLDER, flags, '"14-Jul-2021 02:44:25 +0200"',
                               msg))
            ok(imap.select("INBOX"))
            ok(imap.uid("COPY", "1:6", FOLDER))
            ok(imap.uid("STORE", "1:5", "+FLAGS", "(\\Answered Todo)"))
            ok(imap.uid("STORE", str(EXPUNGED_INBOX_UID), "+FLAGS",
                        "(\\Deleted)"))
            ok(imap.uid("EXPUNGE", str(EXPUNGED_INBOX_UID)))
            ok(imap.select(FOLDER))
            ok(imap.uid("STORE", "2", "+FLAGS", "(Later $Junk)"))
        finally:
            imap.logout()

    def rebuild(self, dc, stdin):
        return dc.doveadm("-f", "tab", "casbox", "rebuild", "--from-packs",
                          "-u", USER, check=False, input=stdin)

    def test_password_rebuild(self):
        # a userdb that doveadm -A can list
        with Dovecot(plugin_settings=SETTINGS, extra_conf=CONF,
                     passdb_extra=PASS_PW, users=[USER, "other"]) as dc:
            root = os.path.join(dc.home(USER), "casbox")
            self.populate(dc)
            before = Snapshot(dc)
            self.assertEqual(len(before.msgs["INBOX"]), len(self.inbox) - 1)
            self.assertEqual(len(before.msgs[FOLDER]),
                             len(self.appended) + 6)
            self.assertIn(b"Project-Z", before.msgs[FOLDER][1]["flags"])
            self.assertIn(b"$Junk", before.msgs[FOLDER][2]["flags"])
            self.assertIn(b"Todo", before.msgs["INBOX"][1]["flags"])
            self.assertNotIn(EXPUNGED_INBOX_UID, before.msgs["INBOX"])

            # every save wrote a recovery record sealed to the user key
            # (meta frame version 2, kind 1), and mailbox records (kind 3)
            frames = meta_frames(root)
            saves = len(self.inbox) + len(self.appended) + 6
            self.assertEqual(sum(1 for v, k in frames if k == 1), saves)
            self.assertTrue(any(k == 3 for v, k in frames), frames)
            self.assertEqual({v for v, k in frames}, {2}, frames)
            # nothing of the marker, nor the mailbox name, in the packs
            self.assertEqual(found_in(os.path.join(root, "packs"), MARKERS), [])

            shutil.rmtree(os.path.join(root, "lsm"))
            untouched = tree_digest(dc.home(USER))

            # no password, an empty line, the wrong one: refused, and
            # not a byte changed
            for stdin, code, why in (
                    ("", 66, "no input"),
                    ("\n", 66, "is empty"),
                    ("not-the-password\n", 65, "wrong password")):
                r = self.rebuild(dc, stdin)
                self.assertEqual(r.returncode, code, (stdin, r.stderr))
                self.assertIn(why, r.stderr)
                # the header, no row
                self.assertEqual(r.stdout.count("\n"), 1, r.stdout)
                self.assertEqual(tree_digest(dc.home(USER)), untouched,
                                 stdin)
            # a terminal would echo the password: refused before a read
            master, slave = pty.openpty()
            try:
                r = subprocess.run(dc.doveadm_command(
                    "casbox", "rebuild", "--from-packs", "-u", USER),
                    stdin=slave, capture_output=True, text=True,
                    timeout=300)
            finally:
                os.close(slave)
                os.close(master)
            self.assertEqual(r.returncode, 64, r.stderr)
            self.assertIn("stdin is a terminal", r.stderr)
            self.assertEqual(tree_digest(dc.home(USER)), untouched)
            # one user's password cannot serve all users: refused
            # before stdin is read, for -A and -F alike
            users_file = os.path.join(dc.tmp, "user-list")
            with open(users_file, "w") as f:
                f.write(USER + "\n")
            for how in (["-A"], ["-F", users_file]):
                r = dc.doveadm("casbox", "rebuild", "--from-packs", *how,
                               check=False, input=PASSWORD + "\n")
                self.assertEqual(r.returncode, 64, (how, r.stderr))
                self.assertNotIn(PASSWORD, r.stdout + r.stderr)
                self.assertEqual(tree_digest(dc.home(USER)), untouched)
            # ... and the store is still without an LSM to read from
            self.assertFalse(os.path.exists(os.path.join(root, "lsm")))

            r = self.rebuild(dc, PASSWORD + "\n")
            self.assertEqual(r.returncode, 0, r.stderr)
            row = parse_tab(r.stdout)[0]
            self.assertEqual(int(row["mailboxes"]), 2, row)
            self.assertEqual(int(row["messages"]), saves, row)
            self.assertEqual(int(row["lost_messages"]), 0, row)
            self.assertEqual(int(row["damaged_frames"]), 0, row)
            self.assertEqual(int(row["unreadable_records"]), 0, row)
            # the intact index knew of the expunge
            self.assertEqual(int(row["expunged"]), 1, row)
            self.assertNotIn(PASSWORD, r.stdout + r.stderr)

            after = Snapshot(dc)
            self.assertEqual(after.mailboxes, before.mailboxes)
            self.assertEqual(after.status, before.status)
            for box in before.msgs:
                self.assertEqual(sorted(after.msgs[box]),
                                 sorted(before.msgs[box]), box)
                for uid, m in before.msgs[box].items():
                    self.assertEqual(after.msgs[box][uid], m, (box, uid))

            # the rebuilt store works on without the password: scrub is
            # clean (sealed DEK and meta frame MACs verify); gc tells
            # live records from dead ones by their locators (the
            # expunged message's is dropped, the others carried forward
            # verbatim, frames moved byte for byte need no DEK update,
            # every live message has a record); LMTP delivers, IMAP reads
            r = dc.doveadm("casbox", "scrub", "-u", USER)
            self.assertEqual(r.stdout.strip().splitlines()[1:], [],
                             r.stdout)
            r = dc.doveadm("-f", "tab", "casbox", "gc", "-u", USER, "--all")
            self.assertNotIn("keeping pack", r.stderr)
            gc = parse_tab(r.stdout)[0]
            self.assertEqual(int(gc["recovery_dropped"]), 1, gc)
            self.assertEqual(int(gc["recovery_kept"]), saves - 1, gc)
            self.assertEqual(int(gc["recovery_written"]), 0, gc)
            self.assertEqual(int(gc["dek_updates"]), 0, gc)
            self.assertGreater(int(gc["packs_deleted"]), 0, gc)
            self.assertEqual(sum(1 for v, k in meta_frames(root) if k == 1),
                             saves - 1)
            dc.lmtp_deliver(USER, b"Subject: after\r\n\r\nnew\r\n")
            imap = dc.imap_login(USER)
            self.assertEqual(ok(imap.select("INBOX"))[0],
                             b"%d" % len(self.inbox))
            data = ok(imap.fetch(b"%d" % len(self.inbox), "(BODY.PEEK[])"))
            self.assertTrue(data[0][1].endswith(b"\r\n\r\nnew\r\n"))
            imap.logout()
            # a second rebuild after gc still finds everything (and a
            # CRLF line end is a line end, as for the key commands)
            shutil.rmtree(os.path.join(root, "lsm"))
            r = self.rebuild(dc, PASSWORD + "\r\n")
            self.assertEqual(r.returncode, 0, r.stderr)
            row = parse_tab(r.stdout)[0]
            self.assertEqual(int(row["lost_messages"]), 0, row)
            self.assertEqual(int(row["unreadable_records"]), 0, row)
            # the expunged message's record is gone, "after" has one
            self.assertEqual(int(row["messages"]), saves, row)
            self.assertEqual(int(row["expunged"]), 0, row)
            again = Snapshot(dc)
            for box in before.msgs:
                for uid, m in before.msgs[box].items():
                    self.assertEqual(again.msgs[box][uid], m, (box, uid))

            # a record that fails its MAC (CRCs fixed up): scrub names it;
            # scrub --repair, as it cannot count it, writes a new record
            # for its message from the LSM (sealed to the public key
            # without the password; live records found by their
            # locators), appended without rewriting a pack; gc --all
            # then keeps the bad frame's pack and has nothing to write;
            # the rebuild skips the bad one and still finds every message
            dc.allow_log(r"keeping pack")
            _, _, path, off, size = [f for f in meta_frames(root, True)
                                     if f[1] == 1][3]
            forge_record(path, off, size)
            r = dc.doveadm("casbox", "scrub", "-u", USER, check=False)
            self.assertEqual(r.returncode, 65, r.stdout + r.stderr)
            self.assertIn("meta frame: sealed box: authentication failed",
                          r.stdout)
            r = dc.doveadm("-f", "tab", "casbox", "scrub", "-u", USER,
                           "--repair", check=False)
            self.assertEqual(r.returncode, 65, r.stdout + r.stderr)
            written = [row for row in parse_tab(r.stdout) if row["cause"]
                       == "recovery record written to the packs"]
            self.assertEqual(len(written), 1, r.stdout)
            r = dc.doveadm("-f", "tab", "casbox", "gc", "-u", USER, "--all")
            self.assertIn("keeping pack", r.stderr)
            gc = parse_tab(r.stdout)[0]
            self.assertEqual(int(gc["recovery_written"]), 0, gc)
            shutil.rmtree(os.path.join(root, "lsm"))
            r = self.rebuild(dc, PASSWORD + "\n")
            self.assertEqual(r.returncode, 0, r.stderr)
            row = parse_tab(r.stdout)[0]
            self.assertEqual(int(row["unreadable_records"]), 1, row)
            self.assertEqual(int(row["lost_messages"]), 0, row)
            self.assertEqual(int(row["messages"]), saves, row)
            again = Snapshot(dc)
            for box in before.msgs:
                for uid, m in before.msgs[box].items():
                    self.assertEqual(again.msgs[box][uid], m, (box, uid))

            self.assertEqual(found_in(os.path.join(root, "packs"), MARKERS), [])
            dc.stop()
            self.assertNotIn(PASSWORD, dc.log_text())


if __name__ == "__main__":
    unittest.main()
