"""casbox_key_mode = password on a real Dovecot (doc/threat-model.md,
"Key mode `password`"). The passdb hands the login password to the mail
process (override_fields = userdb_casbox_key_password=%w), so only an
IMAP session has it; LMTP and doveadm do not.

- LMTP before the user key file exists: 4xx, nothing stored; the first
  IMAP login creates the key (casbox_key_autocreate), then the retried
  delivery is accepted.
- LMTP (no password) delivers corpus mail and dedups; IMAP with the
  password reads every message byte-identical.
- doveadm fetch of a body fails with "user key is locked"; doveadm
  casbox key export-public prints the key file's public key and key id
  (checked against the file and a Python BLAKE2b of it).
- No subject, body line or marker is found under the casbox root.
- IMAP on a copy of the store without the password field, or with the
  wrong password: FETCH of a body fails per message with a clear log
  line, flags and LMTP keep working, nothing crashes.
- doveadm casbox key init with the password on stdin, then key password
  (old and new password on stdin) as a passdb password-change hook runs
  it: every message reads byte-identical with the new password, the old
  one no longer unlocks, bad input and a wrong old password leave the
  file byte-identical, no password reaches the log or doveadm output.
"""

import hashlib
import os
import re
import shutil
import smtplib
import stat
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (Dovecot, PASSWORD, corpus_files, ok,  # noqa: E402
                              load, crlf, distinctive_strings,
                              files_under, found_in, HarnessError,
                              dovecot_version)

SETTINGS = {
    "casbox_key_file": "%h/casbox.ukey",
    "casbox_key_autocreate": "yes",
    "casbox_key_mode": "password",
}
PASS_PW = "override_fields = userdb_casbox_key_password=%w"
PASS_WRONG = "override_fields = userdb_casbox_key_password=not-the-password"
CONF = "lmtp_add_received_header = no\n"
MARKER_SUBJECT = b"Marmoset zeppelin ledger 5519"
MARKER_BODY = b"password-mode-canary-V7KQ-body-line"
MARKER_MSG = (b"From: a@example.com\r\nSubject: " + MARKER_SUBJECT +
              b"\r\nMessage-ID: <canary@example.com>\r\n\r\n" +
              MARKER_BODY + b"\r\n")


def delivered_tail(msg):
    """What must come back of an LMTP delivery: everything from the
    header/body separator on (LMTP only adds Return-Path and
    Delivered-To, smtplib ends the message with CRLF)."""
    tail = crlf(msg).rstrip(b"\r\n")
    return tail[tail.find(b"\r\n\r\n"):]


def needles(messages):
    return {MARKER_SUBJECT, MARKER_BODY} | distinctive_strings(messages)


def packs_size(root):
    total = 0
    for dirpath, _, files in os.walk(os.path.join(root, "packs")):
        total += sum(os.lstat(os.path.join(dirpath, n)).st_size
                     for n in files)
    return total


def lmtp_code(dc, user, message):
    """Deliver one message; return the LMTP reply code for it."""
    with smtplib.LMTP("127.0.0.1", dc.lmtp_port, timeout=120) as lmtp:
        try:
            refused = lmtp.sendmail("sender@example.com", [user], message)
        except smtplib.SMTPDataError as e:
            return e.smtp_code
        except smtplib.SMTPRecipientsRefused as e:
            return e.recipients[user][0]
    return refused[user][0] if refused else 250


def fetch_all(imap, count):
    bodies = []
    for seq in range(1, count + 1):
        data = ok(imap.fetch(str(seq), "(BODY.PEEK[])"))
        bodies.append(data[0][1])
    return bodies


def copy_home(saved, dest_dc, user):
    """A saved home (store and key file) into another instance, owned
    by the mail user, modes kept."""
    dest = dest_dc.home(user)
    shutil.copytree(os.path.join(saved, user), dest, symlinks=True)
    for dirpath, dirs, files in os.walk(dest):
        os.chown(dirpath, dest_dc.uid, dest_dc.gid)
        for name in files:
            os.chown(os.path.join(dirpath, name), dest_dc.uid, dest_dc.gid)


# distinct strings, looked for in the log and in doveadm's output
PW1 = "Kiwi-orbit-7731-first"
PW2 = "Quartz-lantern-4410-second"
PW3 = "Umber-falcon-9052-third"
PW_WRONG = "Not-the-old-one-6613"
ALL_PW = (PW1, PW2, PW3, PW_WRONG)
EX_USAGE, EX_DATAERR, EX_NOINPUT, EX_CONFIG = 64, 65, 66, 78


# the passdb accepts any password and hands it over as the key password,
# so each login says which password its session has: that is all a
# password change changes for casbox (what the passdb checks is
# Dovecot's business; passwd-file rereads its file at most once a second)
PASS_ANY = ("args = nopassword=y\n"
            "  override_fields = userdb_casbox_key_password=%w")


class KeyPasswordTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.msgs = load(corpus_files("usrp-users-3000", limit=30, step=97))
        cls.appended = [m for m in load(corpus_files("mime-edge",
                                                     limit=12)) if m]

    def test_password_mode(self):
        msgs = self.msgs
        first = msgs[0]
        with Dovecot(plugin_settings=SETTINGS, extra_conf=CONF,
                     passdb_extra=PASS_PW) as dc:
            dc.allow_log(r"lmtp\(user1\).*can only be created with the "
                         r"user's password")
            home = dc.home("user1")
            key_path = os.path.join(home, "casbox.ukey")
            root = os.path.join(home, "casbox")

            # no key yet: LMTP has no password, must not store anything
            code = lmtp_code(dc, "user1", first)
            self.assertEqual(code, 451)
            self.assertFalse(os.path.exists(key_path))

            # the first login creates it
            imap = dc.imap_login("user1")
            self.assertEqual(ok(imap.select("INBOX"))[0], b"0")
            imap.logout()
            st = os.stat(key_path)
            self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)
            with open(key_path, "rb") as f:
                keyfile = f.read()
            self.assertEqual(keyfile[:8], b"CASUKEY1")
            self.assertEqual(len(keyfile), 212)

            # the retried delivery and the rest, all without a password
            self.assertEqual(lmtp_code(dc, "user1", first), 250)
            dc.lmtp_deliver_many("user1", msgs[1:] + [MARKER_MSG])
            expected = msgs + [MARKER_MSG]
            delivered = list(expected)

            imap = dc.imap_login("user1")
            self.assertEqual(ok(imap.select("INBOX"))[0],
                             b"%d" % len(expected))
            got = fetch_all(imap, len(expected))
            for i, msg in enumerate(expected):
                self.assertTrue(got[i].rstrip(b"\r\n").endswith(
                    delivered_tail(msg)), "message %d differs" % (i + 1))
            # IMAP APPEND with the password: byte-identical
            ok(imap.create("Appended"))
            for msg in self.appended:
                ok(imap.append("Appended", None, None, msg))
            ok(imap.select("Appended"))
            self.assertEqual(fetch_all(imap, len(self.appended)),
                             [crlf(m) for m in self.appended])
            ok(imap.select("INBOX"))
            imap.logout()

            # a second identical delivery is deduplicated
            big = max(msgs, key=len)
            before = packs_size(root)
            dc.lmtp_deliver("user1", big)
            growth = packs_size(root) - before
            self.assertLess(growth, len(big) // 2,
                            "growth %d for a %d-byte message"
                            % (growth, len(big)))
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            self.assertTrue(fetch_all(imap, len(expected) + 1)[-1].rstrip(
                b"\r\n").endswith(delivered_tail(big)))
            imap.logout()

            # doveadm has no password: a body cannot be read
            dc.allow_log(r"user key is locked")
            res = dc.doveadm("fetch", "-u", "user1", "body", "mailbox",
                             "INBOX", "uid", "1", check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("user key is locked", res.stdout + res.stderr)

            # key-free work still works
            res = dc.doveadm("fetch", "-u", "user1", "uid flags",
                             "mailbox", "INBOX", "uid", "1")
            self.assertIn("uid: 1", res.stdout)

            # gc without the password moves frames as they are: expunge
            # the first half, gc, the rest still reads right
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            half = len(expected) // 2
            ok(imap.store("1:%d" % half, "+FLAGS", "\\Deleted"))
            ok(imap.expunge())
            imap.logout()
            before = packs_size(root)
            res = dc.doveadm("casbox", "gc", "-u", "user1", "--all")
            self.assertNotIn("keeping pack", res.stderr)
            self.assertLess(packs_size(root), before)
            imap = dc.imap_login("user1")
            left = expected[half:] + [big]
            self.assertEqual(ok(imap.select("INBOX"))[0], b"%d" % len(left))
            got = fetch_all(imap, len(left))
            for i, msg in enumerate(left):
                self.assertTrue(got[i].rstrip(b"\r\n").endswith(
                    delivered_tail(msg)), "after gc: message %d" % i)
            imap.logout()
            expected = left

            # the public key, checked against the file itself
            res = dc.doveadm("-f", "flow", "casbox", "key",
                             "export-public", "-u", "user1")
            fields = dict(re.findall(r"(\w+)=(\S+)", res.stdout))
            pk = keyfile[44:76]
            self.assertEqual(fields["public_key"], pk.hex())
            kid = hashlib.blake2b(b"CASUKID1" + pk, digest_size=16)
            self.assertEqual(fields["key_id"], kid.digest()[:4].hex())
            self.assertEqual(fields["key_file"], key_path)
            # stats counts the sealed DEKs under the key pair's id
            res = dc.doveadm("-f", "flow", "casbox", "stats", "-u", "user1")
            ids = dict(re.findall(r"wrap_key_ids=(\w+):(\d+)", res.stdout))
            self.assertEqual(list(ids), [fields["key_id"]])
            # key rotation is a server-mode operation: refused clearly
            res = dc.doveadm("casbox", "key", "rotate", "-u", "user1",
                             check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("casbox_key_mode is password", res.stderr)

            # nothing readable on disk
            strings = needles(delivered)
            self.assertGreater(len(strings), 20)
            self.assertEqual(found_in(root, strings), [])
            self.assertEqual(found_in(home, strings), [])

            # scrub without the password: sealed-DEK MACs verify
            res = dc.doveadm("casbox", "scrub", "-u", "user1")
            self.assertNotIn("DEK", res.stdout)

            # the log is complete once the instance has stopped
            dc.stop()
            log = dc.log_lines()
            self.assertTrue(any(
                "lmtp(user1)" in line and key_path in line and
                "can only be created with the user's password" in line
                for line in log))
            self.assertTrue(any("created password key file " + key_path
                                in line for line in log))
            self.assertFalse([line for line in log
                              if "casbox-test-pass" in line])

            saved = tempfile.mkdtemp(prefix="cbx-pw-")
            try:
                shutil.copytree(home, os.path.join(saved, "user1"),
                                symlinks=True)
            except BaseException:
                shutil.rmtree(saved)
                raise
        try:
            self.check_without_password(saved, len(expected))
            self.check_wrong_password(saved, keyfile)
        finally:
            shutil.rmtree(saved)

    def check_without_password(self, saved, count):
        """IMAP login on a copy of the store, but the passdb hands no
        password over: reading fails per message, clearly."""
        with Dovecot(plugin_settings=SETTINGS, extra_conf=CONF) as dc:
            dc.allow_log(r"imap\(user1\).*user key is locked")
            copy_home(saved, dc, "user1")
            imap = dc.imap_login("user1")
            self.assertEqual(ok(imap.select("INBOX"))[0], b"%d" % count)
            # flags and metadata work without the key
            ok(imap.store("1", "+FLAGS", "\\Flagged"))
            data = ok(imap.fetch("1:*", "(UID FLAGS RFC822.SIZE)"))
            self.assertEqual(len(data), count)
            # per message: a tagged NO each, the session goes on
            self.assert_fetch_refused(imap, "1")
            self.assert_fetch_refused(imap, "2")
            ok(imap.store("2", "+FLAGS", "\\Seen"))
            imap.logout()
            # delivery still works (sealed to the public key)
            self.assertEqual(lmtp_code(dc, "user1", MARKER_MSG), 250)
            dc.stop()
            locked = [line for line in dc.log_lines()
                      if ": Error: " in line and
                      "user key is locked" in line]
            # one line per message tried (sequences 1 and 2)
            self.assertEqual(len({re.search(r"casbox: uid=(\d+):",
                                            line)[1] for line in locked}), 2)
            self.assertTrue(all("casbox_key_password" in line
                                for line in locked))

    def assert_fetch_refused(self, imap, seq):
        """A body that needs the locked key: a tagged NO for this
        message (not a BYE, not "Internal error") naming the cause."""
        typ, data = imap.fetch(seq, "(BODY.PEEK[])")
        self.assertEqual(typ, "NO")
        self.assertIn(b"user key is locked", data[-1])

    def check_wrong_password(self, saved, keyfile):
        """The key file does not open with this login's password: one
        clear log line, then per-message failures, no crash."""
        with Dovecot(plugin_settings=SETTINGS, extra_conf=CONF,
                     passdb_extra=PASS_WRONG) as dc:
            dc.allow_log(r"imap\(user1\).*wrong password")
            copy_home(saved, dc, "user1")
            for seq in ("1", "2"):
                imap = dc.imap_login("user1")
                ok(imap.select("INBOX"))
                self.assert_fetch_refused(imap, seq)
                imap.logout()
            key_path = os.path.join(dc.home("user1"), "casbox.ukey")
            with open(key_path, "rb") as f:
                after = f.read()
            dc.stop()
            wrong = [line for line in dc.log_lines()
                     if "wrong password" in line]
            self.assertTrue(wrong)
            self.assertIn(key_path, wrong[0])
            # unlocking is tried once per session (two sessions), not
            # once per message read
            self.assertEqual(len([line for line in wrong
                                  if "Couldn't unlock" in line]), 2)
            self.assertFalse([line for line in dc.log_lines()
                              if "not-the-password" in line])
            self.assertEqual(after, keyfile)

    def test_fts_needs_password(self):
        """casidx in password mode: the index key comes from the user's
        password, and Dovecot 2.3 indexes only in indexer-worker or
        doveadm, which never have it. So indexing fails with a clear
        error and writes nothing, and IMAP SEARCH (even with
        fts_enforced) answers right by reading the mail in the session,
        without queueing indexer work."""
        words = [b"Quaggamorph", b"Zephyrbastion"]
        marker = (b"From: a@example.com\r\nSubject: " + words[0] +
                  b" report\r\n\r\nThe " + words[1] + b" stands.\r\n")
        settings = dict(SETTINGS, fts="casidx", fts_enforced="yes",
                        fts_autoindex="no", fts_casidx_no_fsync="yes")
        with Dovecot(mail_plugins=["casbox", "fts", "fts_casidx"],
                     plugin_settings=settings, extra_conf=CONF,
                     passdb_extra=PASS_PW) as dc:
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            imap.logout()
            dc.lmtp_deliver_many("user1", self.msgs[:10] + [marker])
            res = dc.doveadm("index", "-u", "user1", "INBOX", check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("index key needs the user's password",
                          res.stdout + res.stderr)
            home = dc.home("user1")

            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            typ, data = imap.uid("SEARCH", "BODY", "zephyrbastion")
            self.assertEqual((typ, data[0]), ("OK", b"11"))
            typ, data = imap.uid("SEARCH", "SUBJECT", "quaggamorph")
            self.assertEqual((typ, data[0]), ("OK", b"11"))
            typ, data = imap.uid("SEARCH", "TEXT", "zephyrbastion")
            self.assertEqual((typ, data[0]), ("OK", b"11"))
            imap.logout()
            self.assertEqual([p for p in files_under(home)
                              if p.endswith(".cxs")], [])
            needles = set(words) | {w.lower() for w in words}
            self.assertEqual(found_in(home, needles), [])
            dc.stop()
            # no indexer-worker was asked (it would have logged errors);
            # the Dovecot() exit also fails on any unexpected Error line
            self.assertFalse([line for line in dc.log_lines()
                              if "indexer" in line])

    def test_fts_expunge_needs_no_key(self):
        """Expunges reach the FTS backend in whichever process syncs
        them (imap, doveadm, lmtp). In password mode there is never an
        index to update (test_fts_needs_password), so an expunge must
        not load the index key: without the password (doveadm) that
        logged an Error on every expunge, with it (IMAP) the session
        ran Argon2id a second time just to find no index."""
        settings = dict(SETTINGS, fts="casidx", fts_autoindex="no",
                        fts_casidx_no_fsync="yes")
        with Dovecot(mail_plugins=["casbox", "fts", "fts_casidx"],
                     plugin_settings=settings, extra_conf=CONF,
                     passdb_extra=PASS_PW, mail_debug=True) as dc:
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            imap.logout()
            dc.lmtp_deliver_many("user1", self.msgs[:4])
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            ok(imap.uid("STORE", "1", "+FLAGS", "(\\Deleted)"))
            ok(imap.expunge())
            typ, data = imap.uid("SEARCH", "ALL")
            self.assertEqual((typ, data[0]), ("OK", b"2 3 4"))
            imap.logout()
            res = dc.doveadm("expunge", "-u", "user1", "mailbox", "INBOX",
                             "uid", "2")
            self.assertNotIn("casidx", res.stdout + res.stderr)
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            typ, data = imap.uid("SEARCH", "ALL")
            self.assertEqual((typ, data[0]), ("OK", b"3 4"))
            typ, data = imap.uid("FETCH", "3:4", "(BODY.PEEK[])")
            self.assertEqual(typ, "OK")
            bodies = [bytes(d[1]) for d in data if isinstance(d, tuple)]
            self.assertEqual(len(bodies), 2)
            for body, msg in zip(bodies, self.msgs[2:4]):
                self.assertTrue(body.rstrip(b"\r\n").endswith(
                    delivered_tail(msg)))
            imap.logout()
            home = dc.home("user1")
            dc.stop()
            lines = dc.log_lines()
            # the casidx plugin loaded no key at all (the line is seen
            # in test_fts_encrypt, where it does)
            self.assertEqual([line for line in lines
                              if "Loaded the index key" in line], [])
            self.assertFalse([line for line in lines
                              if "index key needs" in line])
            self.assertEqual([p for p in files_under(home)
                              if p.endswith(".cxs")], [])

    def test_doveadm_init_and_password_change(self):
        msgs = self.msgs[:12] + [MARKER_MSG]
        settings = dict(SETTINGS, casbox_key_autocreate="no")
        self.outputs = []
        with Dovecot(plugin_settings=settings, extra_conf=CONF,
                     passdb_extra=PASS_ANY) as dc:
            self.run_password_change(dc, msgs)
            dc.stop()
            log = dc.log_text()
        for pw in ALL_PW:
            self.assertNotIn(pw, log)
            for out in self.outputs:
                self.assertNotIn(pw, out)

    def keycmd(self, dc, *args, input=None):
        """doveadm casbox key ... -u user1, its output kept to be
        searched for passwords."""
        res = dc.doveadm("-f", "flow", "casbox", "key", *args,
                         input=input, check=False)
        self.outputs.append(res.stdout + res.stderr)
        return res

    def read_all(self, dc, password, msgs):
        imap = dc.imap_connect()
        imap.login("user1", password)
        self.assertEqual(ok(imap.select("INBOX"))[0], b"%d" % len(msgs))
        got = fetch_all(imap, len(msgs))
        imap.logout()
        for i, msg in enumerate(msgs):
            self.assertTrue(got[i].rstrip(b"\r\n").endswith(
                delivered_tail(msg)), "message %d differs" % (i + 1))

    def run_password_change(self, dc, msgs):
        key_path = os.path.join(dc.home("user1"), "casbox.ukey")

        # init: the password on stdin, one line
        res = self.keycmd(dc, "init", "-u", "user1", input=PW1 + "\n")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(dict(re.findall(r"(\w+)=(\S+)", res.stdout)),
                         {"key_file": key_path, "result": "created"})
        st = os.stat(key_path)
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)
        self.assertEqual((st.st_uid, st.st_gid), (dc.uid, dc.gid))
        with open(key_path, "rb") as f:
            created = f.read()
        self.assertEqual((created[:8], len(created)), (b"CASUKEY1", 212))
        # never over an existing key
        res = self.keycmd(dc, "init", "-u", "user1", input=PW2 + "\n")
        self.assertEqual(res.returncode, EX_DATAERR)
        self.assertIn("already exists", res.stderr)
        self.assert_file(key_path, created)

        # deliveries need no password; the login with it reads them
        dc.lmtp_deliver_many("user1", msgs)
        self.read_all(dc, PW1, msgs)
        res = self.keycmd(dc, "export-public", "-u", "user1")
        key_id = dict(re.findall(r"(\w+)=(\S+)", res.stdout))["key_id"]
        # the store has data now: a second key is refused
        os.rename(key_path, key_path + ".away")
        res = self.keycmd(dc, "init", "-u", "user1", input=PW2 + "\n")
        self.assertEqual(res.returncode, EX_DATAERR)
        self.assertIn("the store already has data", res.stderr)
        self.assertFalse(os.path.exists(key_path))
        os.rename(key_path + ".away", key_path)

        # bad input and a wrong old password change nothing
        dc.allow_log(r"casbox key password: .*wrong password")
        for data, code, why in (
                (PW_WRONG + "\n" + PW2 + "\n", EX_DATAERR,
                 "wrong password"),
                (PW1 + "\n", EX_USAGE, "1 line(s) of input, expected 2"),
                (PW1, EX_USAGE, "1 line(s) of input, expected 2"),
                (PW1 + "\n\n", EX_USAGE,
                 "line 2 (new password) is empty"),
                ("\n" + PW2 + "\n", EX_USAGE,
                 "line 1 (old password) is empty"),
                ("", EX_USAGE, "no input"),
                (PW1 + "\n" + PW2 + "\n" + PW3 + "\n", EX_USAGE,
                 "more than 2 line(s)")):
            res = self.keycmd(dc, "password", "-u", "user1", input=data)
            self.assertEqual(res.returncode, code, (data, res.stderr))
            self.assertIn(why, res.stderr)
            self.assertEqual(res.stdout.strip(), "")
            self.assert_file(key_path, created)
        # stdin holds one user's passwords: no -A or -F
        users = os.path.join(dc.tmp, "users")
        with open(users, "w") as f:
            f.write("user1\n")
        res = self.keycmd(dc, "password", "-F", users,
                          input=PW1 + "\n" + PW2 + "\n")
        self.assertEqual(res.returncode, EX_USAGE)
        self.assertIn("one user at a time", res.stderr)
        self.assert_file(key_path, created)

        # the hook: rewrap under the new password (the passdb then
        # takes it)
        res = self.keycmd(dc, "password", "-u", "user1",
                          input="%s\n%s\n" % (PW1, PW2))
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(dict(re.findall(r"(\w+)=(\S+)", res.stdout)),
                         {"key_file": key_path, "key_id": key_id,
                          "result": "rewrapped"})
        with open(key_path, "rb") as f:
            rewrapped = f.read()
        self.assertNotEqual(rewrapped, created)
        # same key pair: the public key and delivery key stay
        self.assertEqual(rewrapped[44:108], created[44:108])
        st = os.stat(key_path)
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)
        self.assertEqual((st.st_uid, st.st_gid), (dc.uid, dc.gid))
        self.read_all(dc, PW2, msgs)
        # delivery goes on (same public key), and reads back
        dc.lmtp_deliver("user1", msgs[0])
        msgs = msgs + [msgs[0]]
        self.read_all(dc, PW2, msgs)

        # the old password no longer unlocks: the login succeeds, each
        # body read fails, one log line names the file
        dc.allow_log(r"imap\(user1\).*wrong password")
        imap = dc.imap_connect()
        imap.login("user1", PW1)
        ok(imap.select("INBOX"))
        self.assert_fetch_refused(imap, "1")
        self.assert_fetch_refused(imap, "2")
        imap.logout()
        self.assertIsNotNone(dc.wait_log(
            r"imap\(user1\).*Couldn't unlock.*%s.*wrong password"
            % re.escape(key_path)))
        self.assert_file(key_path, rewrapped)

        # through a doveadm server (-S): stdin is forwarded with the
        # command, CRLF line ends as a Windows hook might write them
        sock = os.path.join(dc.tmp, "run", "doveadm-server")
        res = self.keycmd(dc, "password", "-S", sock, "-u", "user1",
                          input="%s\r\n%s\r\n" % (PW_WRONG, PW3))
        self.assertEqual(res.returncode, EX_DATAERR, res.stderr)
        self.assertIn("wrong password", res.stderr)
        self.assert_file(key_path, rewrapped)
        res = self.keycmd(dc, "password", "-S", sock, "-u", "user1",
                          input="%s\r\n%s\r\n" % (PW2, PW3))
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("result=rewrapped", res.stdout)
        st = os.stat(key_path)
        self.assertEqual((st.st_uid, stat.S_IMODE(st.st_mode)),
                         (dc.uid, 0o600))
        self.read_all(dc, PW3, msgs)

    def assert_file(self, path, data):
        with open(path, "rb") as f:
            self.assertEqual(f.read(), data)

    def test_doveadm_key_password_refusals(self):
        """Server mode, no key file yet, init without a password or for
        many users: refused with the documented exit codes."""
        self.outputs = []
        logs = []
        with Dovecot(plugin_settings={
                "casbox_key_file": "%h/casbox.key",
                "casbox_key_autocreate": "yes"}) as dc:
            dc.allow_log(r"casbox key password: casbox_key_mode is server")
            dc.lmtp_deliver("user1", MARKER_MSG)
            key_path = os.path.join(dc.home("user1"), "casbox.key")
            with open(key_path, "rb") as f:
                before = f.read()
            res = self.keycmd(dc, "password", "-u", "user1",
                              input="%s\n%s\n" % (PW1, PW2))
            self.assertEqual(res.returncode, EX_CONFIG)
            self.assertIn("casbox_key_mode is server", res.stderr)
            self.assert_file(key_path, before)
            # server-mode init is unchanged: it reads no stdin
            res = self.keycmd(dc, "init", "-u", "user2", input="")
            self.assertIn("created", res.stdout)
            dc.stop()
            logs.append(dc.log_text())
        # in a directory of its own, which bad input must not create
        settings = dict(SETTINGS, casbox_key_file="%h/keys/casbox.ukey")
        with Dovecot(plugin_settings=settings, extra_conf=CONF,
                     passdb_extra=PASS_PW) as dc:
            key_dir = os.path.join(dc.home("user1"), "keys")
            key_path = os.path.join(key_dir, "casbox.ukey")
            res = self.keycmd(dc, "password", "-u", "user1",
                              input="%s\n%s\n" % (PW1, PW2))
            self.assertEqual(res.returncode, EX_NOINPUT)
            self.assertIn("does not exist", res.stderr)
            for data, why in (("", "no input"),
                              ("\n", "line 1 (password) is empty"),
                              (PW1 + "\n" + PW2 + "\n",
                               "more than 1 line(s)")):
                res = self.keycmd(dc, "init", "-u", "user1", input=data)
                self.assertEqual(res.returncode, EX_USAGE)
                self.assertIn(why, res.stderr)
                self.assertFalse(os.path.exists(key_dir))
            # -F: one password cannot serve several users
            dc.allow_log(r"Trying to iterate users")
            users = os.path.join(dc.tmp, "users")
            with open(users, "w") as f:
                f.write("user1\n")
            res = self.keycmd(dc, "init", "-F", users, input=PW1 + "\n")
            self.assertEqual(res.returncode, EX_USAGE)
            self.assertIn("one user's key file", res.stderr)
            self.assertFalse(os.path.exists(key_path))
            # over a doveadm server the password would not arrive
            dc.allow_log(r"key init reads the password from stdin")
            res = self.keycmd(dc, "init", "-S",
                              os.path.join(dc.tmp, "run", "doveadm-server"),
                              "-u", "user1", input=PW1 + "\n")
            self.assertEqual(res.returncode, EX_USAGE)
            self.assertIn("does not run on a doveadm server", res.stderr)
            self.assertFalse(os.path.exists(key_path))
            # the password an init gave is the login password
            res = self.keycmd(dc, "init", "-u", "user1",
                              input=PASSWORD + "\n")
            self.assertIn("created", res.stdout)
            self.assertEqual(stat.S_IMODE(os.stat(key_dir).st_mode), 0o700)
            dc.lmtp_deliver("user1", MARKER_MSG)
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            self.assertTrue(fetch_all(imap, 1)[0].rstrip(b"\r\n").endswith(
                delivered_tail(MARKER_MSG)))
            imap.logout()
            dc.stop()
            logs.append(dc.log_text())
        for pw in ALL_PW + (PASSWORD,):
            for text in logs + self.outputs:
                self.assertNotIn(pw, text)

    def test_export_public_server_mode(self):
        with Dovecot(plugin_settings={
                "casbox_key_file": "%h/casbox.key",
                "casbox_key_autocreate": "yes"}) as dc:
            res = dc.doveadm("casbox", "key", "export-public", "-u",
                             "user1", check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("casbox_key_mode is server", res.stderr)

    def test_bad_key_mode(self):
        if dovecot_version() >= (2, 4):
            # a typed setting: 2.4 refuses the configuration itself
            with self.assertRaisesRegex(
                    HarnessError, "casbox_key_mode: Invalid value: pasword"):
                with Dovecot(plugin_settings=dict(
                        SETTINGS, casbox_key_mode="pasword")):
                    pass
            return
        with Dovecot(plugin_settings=dict(SETTINGS,
                                          casbox_key_mode="pasword")) as dc:
            dc.allow_log(r"casbox_key_mode: invalid value 'pasword'")
            res = dc.doveadm("mailbox", "list", "-u", "user1", check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("casbox_key_mode: invalid value 'pasword'",
                          res.stdout + res.stderr)

    def test_key_file_mode_refused(self):
        with Dovecot(plugin_settings=SETTINGS, extra_conf=CONF,
                     passdb_extra=PASS_PW) as dc:
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            imap.logout()
            key_path = os.path.join(dc.home("user1"), "casbox.ukey")
            os.chmod(key_path, 0o644)
            dc.allow_log(r"has mode 0644")
            self.assertEqual(lmtp_code(dc, "user1", MARKER_MSG), 451)
            os.chmod(key_path, 0o600)
            self.assertEqual(lmtp_code(dc, "user1", MARKER_MSG), 250)
            dc.stop()
            self.assertTrue(any(key_path in line and "mode 0644" in line
                                for line in dc.log_lines()))


if __name__ == "__main__":
    unittest.main()
