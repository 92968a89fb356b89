"""casbox_expunge_retention and doveadm casbox undelete: expunged mail
stays restorable for the window; undelete restores it byte-exact with
its flags (but \\Deleted), keywords, dates and GUID under new UIDs, into
its mailbox (recreated after a DELETE) or --to another; gc during the
window keeps it, after the window releases and reclaims it; MOVE leaves
nothing retained; stats shows retained bytes apart from the user's; a
kill -9 in the middle of an undelete loses and duplicates nothing; with
Dovecot's lazy_expunge both nets hold the mail (doc/casbox-storage.md,
"Undelete window")."""

import os
import pty
import shutil
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (Dovecot, PASSWORD, corpus_files,  # noqa
                             ok)

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
RETAIN = dict(KEYS, casbox_expunge_retention="1d")
# casbox_key_mode = password: IMAP logins hand the password to the mail
# process; doveadm has none and reads it from stdin
PW_RETAIN = {"casbox_key_file": "%h/casbox.ukey",
             "casbox_key_autocreate": "yes", "casbox_key_mode": "password",
             "casbox_expunge_retention": "1d"}
PASS_PW = "override_fields = userdb_casbox_key_password=%w"


def table(dc, *args):
    res = dc.doveadm("-f", "tab", "casbox", *args)
    lines = res.stdout.rstrip("\n").split("\n")
    if lines == [""]:
        return []
    return [dict(zip(lines[0].split("\t"), ln.split("\t")))
            for ln in lines[1:]]


def corpus(n, step=37):
    msgs = []
    for path in corpus_files("usrp-users-3000", limit=n, step=step):
        with open(path, "rb") as f:
            msgs.append(f.read())
    return msgs


def fetch(dc, user, mailbox="INBOX"):
    """{uid: (guid, flags, internaldate, BODY[])} of a mailbox."""
    imap = dc.imap_login(user)
    ok(imap.select(mailbox))
    data = ok(imap.uid("FETCH", "1:*", "(UID FLAGS INTERNALDATE "
                       "BODY.PEEK[])"))
    imap.logout()
    res = dc.doveadm("-f", "tab", "fetch", "-u", user, "uid guid",
                     "mailbox", mailbox)
    guids = {}
    for ln in res.stdout.strip().split("\n")[1:]:
        if ln:
            uid, guid = ln.split("\t")
            guids[int(uid)] = guid
    out = {}
    for item in data:
        if not isinstance(item, tuple):
            continue
        head = item[0].decode()
        uid = int(head.split("UID ")[1].split()[0])
        flags = head.split("FLAGS (")[1].split(")")[0].split()
        date = head.split('INTERNALDATE "')[1].split('"')[0]
        out[uid] = (guids.get(uid), sorted(f for f in flags
                                           if f != "\\Recent"),
                    date, item[1])
    return out


def lf_size(body):
    """The physical size casbox stores (LF line ends, as sdbox)."""
    return len(body.replace(b"\r\n", b"\n"))


def expunge(dc, user, uids, mailbox="INBOX"):
    imap = dc.imap_login(user)
    ok(imap.select(mailbox))
    ok(imap.uid("STORE", ",".join(map(str, uids)), "+FLAGS",
                "(\\Deleted)"))
    ok(imap.expunge())
    imap.logout()


def stats(dc, user):
    return table(dc, "stats", "-u", user)[0]


class UndeleteTest(unittest.TestCase):

    def test_expunge_then_undelete(self):
        msgs = corpus(6)
        with Dovecot(plugin_settings=RETAIN) as dc:
            dc.lmtp_deliver_many("user1", msgs)
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            ok(imap.uid("STORE", "2", "+FLAGS", "(\\Seen \\Flagged)"))
            ok(imap.uid("STORE", "3", "+FLAGS", "($Important)"))
            imap.logout()
            before = fetch(dc, "user1")
            expunge(dc, "user1", [2, 3, 5])
            self.assertEqual(sorted(fetch(dc, "user1")), [1, 4, 6])

            listed = table(dc, "undelete", "-u", "user1", "--list")
            self.assertEqual(sorted(int(r["uid"]) for r in listed),
                             [2, 3, 5])
            self.assertEqual({r["mailbox"] for r in listed}, {"INBOX"})
            self.assertEqual({r["guid"] for r in listed},
                             {before[u][0] for u in (2, 3, 5)})
            s = stats(dc, "user1")
            self.assertEqual(s["messages"], "3")
            self.assertEqual(s["retained_messages"], "3")
            self.assertEqual(int(s["retained_bytes"]),
                             sum(lf_size(before[u][3]) for u in (2, 3, 5)))

            # gc inside the window keeps them
            gc = table(dc, "gc", "-u", "user1")[0]
            self.assertEqual(gc["retained_released"], "0")
            self.assertEqual(dc.casbox_audit("user1"), [])

            done = table(dc, "undelete", "-u", "user1")
            self.assertEqual(sorted(int(r["uid"]) for r in done),
                             [2, 3, 5])
            self.assertEqual({r["result"] for r in done}, {"restored"})
            after = fetch(dc, "user1")
            self.assertEqual(len(after), 6)
            new = {after[u][0]: after[u] for u in after
                   if u not in (1, 4, 6)}
            self.assertTrue(all(u > 6 for u in after
                                if u not in (1, 4, 6)))
            for u in (2, 3, 5):
                guid, flags, date, body = before[u]
                self.assertIn(guid, new)
                self.assertEqual(new[guid][3], body)
                self.assertEqual(new[guid][2], date)
                self.assertEqual(new[guid][1],
                                 [f for f in flags if f != "\\Deleted"])
            self.assertEqual(table(dc, "undelete", "-u", "user1",
                                   "--list"), [])
            self.assertEqual(stats(dc, "user1")["retained_messages"], "0")
            self.assertEqual(dc.casbox_audit("user1"), [])

    def test_window_passes_gc_reclaims(self):
        msgs = corpus(8)
        with Dovecot(plugin_settings=dict(
                KEYS, casbox_expunge_retention="2s")) as dc:
            dc.lmtp_deliver_many("user1", msgs)
            size = sum(lf_size(v[3]) for v in fetch(dc, "user1").values())
            expunge(dc, "user1", list(range(1, 9)))
            start = time.time()
            self.assertEqual(len(table(dc, "undelete", "-u", "user1",
                                       "--list")), 8)
            # the clock passing the window is what is tested
            while time.time() < int(start) + 3:
                time.sleep(0.1)
            gc = table(dc, "gc", "-u", "user1")[0]
            self.assertEqual(gc["retained_released"], "8")
            self.assertEqual(int(gc["retained_bytes_released"]), size)
            self.assertGreater(int(gc["bytes_reclaimed"]), 0)
            s = stats(dc, "user1")
            self.assertEqual(s["retained_messages"], "0")
            self.assertEqual(s["unique_blobs"], "0")
            self.assertEqual(table(dc, "undelete", "-u", "user1",
                                   "--list"), [])
            self.assertEqual(dc.casbox_audit("user1"), [])

    def test_off_move_and_filters(self):
        msgs = corpus(4)
        with Dovecot(plugin_settings=KEYS) as dc:
            # casbox_expunge_retention = 0 (default): as before
            dc.lmtp_deliver_many("user1", msgs[:1])
            expunge(dc, "user1", [1])
            self.assertEqual(table(dc, "undelete", "-u", "user1",
                                   "--list"), [])
        with Dovecot(plugin_settings=RETAIN) as dc:
            dc.lmtp_deliver_many("user1", msgs)
            imap = dc.imap_login("user1")
            ok(imap.create("Work"))
            ok(imap.select("INBOX"))
            ok(imap.uid("MOVE", "1", "Work"))
            imap.logout()
            self.assertEqual(table(dc, "undelete", "-u", "user1",
                                   "--list"), [])
            before = fetch(dc, "user1")
            expunge(dc, "user1", [2, 3])
            for opt in (["--before", "2000-01-01"], ["--since", "1d"],
                        ["--mailbox", "Work"],
                        ["--since", str(int(time.time()) + 3600)]):
                n = len(table(dc, "undelete", "-u", "user1", "--list",
                              *opt))
                self.assertEqual(n, 2 if opt[1] == "1d" else 0, opt)
            # search queries on what the record holds
            for query, want in ((["guid", before[2][0]], 1),
                                (["guid", before[2][0], "OR", "guid",
                                  before[3][0]], 2),
                                (["NOT", "guid", before[2][0]], 1),
                                (["uid", "3"], 1),
                                (["mailbox", "INBOX", "deleted"], 2),
                                (["seen"], 0),
                                (["larger", "1"], 2),
                                (["savedsince", "1h"], 2),
                                (["savedbefore", "1h"], 0)):
                n = len(table(dc, "undelete", "-u", "user1", "--list",
                              *query))
                self.assertEqual(n, want, query)
            res = dc.doveadm("casbox", "undelete", "-u", "user1", "--list",
                             "subject", "x", check=False)
            self.assertEqual(res.returncode, 64, res.stderr)
            self.assertIn("header searches", res.stderr)
            # one by GUID, into another mailbox
            done = table(dc, "undelete", "-u", "user1", "--to",
                         "Restored", "guid", before[3][0])
            self.assertEqual([r["restored_to"] for r in done],
                             ["Restored"])
            got = fetch(dc, "user1", "Restored")
            self.assertEqual([v[3] for v in got.values()], [before[3][3]])
            self.assertEqual(len(table(dc, "undelete", "-u", "user1",
                                       "--list")), 1)
            self.assertEqual(dc.casbox_audit("user1"), [])

    def test_deleted_mailbox(self):
        msgs = corpus(3)
        with Dovecot(plugin_settings=RETAIN) as dc:
            imap = dc.imap_login("user1")
            ok(imap.create("Work"))
            for m in msgs:
                ok(imap.append("Work", "(\\Seen)", None, m))
            imap.logout()
            before = fetch(dc, "user1", "Work")
            imap = dc.imap_login("user1")
            ok(imap.delete("Work"))
            imap.logout()
            listed = table(dc, "undelete", "-u", "user1", "--list")
            self.assertEqual([r["mailbox"] for r in listed], ["Work"] * 3)
            table(dc, "undelete", "-u", "user1", "--mailbox", "Work")
            after = fetch(dc, "user1", "Work")
            self.assertEqual(sorted(v[3] for v in after.values()),
                             sorted(v[3] for v in before.values()))
            self.assertEqual({tuple(v[1]) for v in after.values()},
                             {("\\Seen",)})
            self.assertEqual(dc.casbox_audit("user1"), [])

    def test_kill9_during_undelete(self):
        msgs = corpus(60, step=11)
        with Dovecot(plugin_settings=RETAIN) as dc:
            dc.lmtp_deliver_many("user1", msgs)
            before = fetch(dc, "user1")
            expunge(dc, "user1", sorted(before))
            proc = subprocess.Popen(dc.doveadm_command(
                "casbox", "undelete", "-u", "user1"),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
            # kill once the first restored message is visible
            restored = 0
            while proc.poll() is None and restored == 0:
                restored = len(fetch(dc, "user1"))
            killed = proc.poll() is None
            if killed:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            table(dc, "undelete", "-u", "user1")
            after = fetch(dc, "user1")
            self.assertEqual(sorted(v[0] for v in after.values()),
                             sorted(v[0] for v in before.values()))
            self.assertEqual(sorted(v[3] for v in after.values()),
                             sorted(v[3] for v in before.values()))
            self.assertEqual(table(dc, "undelete", "-u", "user1",
                                   "--list"), [])
            self.assertEqual(dc.casbox_audit("user1"), [])
            print("killed mid-run: %s" % killed, file=sys.stderr)

    def test_quota_counts_what_users_see(self):
        """quota count (vsizes) with the window equals sdbox's without it
        (the oracle) after the expunge, and its pre-expunge value after
        the undelete."""
        msgs = corpus(4)
        conf = {"quota": "count:User quota", "quota_vsizes": "yes",
                "quota_rule": "*:storage=100M"}
        # no Received line: its length could differ between instances
        extra = ("lmtp_add_received_header = no\n"
                 "protocol imap {\n  mail_plugins = $mail_plugins "
                 "imap_quota\n}\n")

        def usage(dc):
            imap = dc.imap_login("user1")
            data = ok(imap.getquotaroot("INBOX"))
            imap.logout()
            text = b" ".join(x if isinstance(x, bytes) else b""
                             for x in data[1]).decode()
            return int(text.split("STORAGE ")[1].split()[0])

        with Dovecot(mail_location="sdbox:~/sdbox", mail_plugins=["quota"],
                     plugin_settings=conf, extra_conf=extra) as sd:
            sd.lmtp_deliver_many("user1", msgs)
            want_full = usage(sd)
            expunge(sd, "user1", [1, 2])
            want_after = usage(sd)
        with Dovecot(mail_plugins=["casbox", "quota"],
                     plugin_settings=dict(RETAIN, **conf),
                     extra_conf=extra) as dc:
            dc.lmtp_deliver_many("user1", msgs)
            self.assertEqual(usage(dc), want_full)
            expunge(dc, "user1", [1, 2])
            self.assertEqual(usage(dc), want_after)
            self.assertLess(want_after, want_full)
            table(dc, "undelete", "-u", "user1")
            self.assertEqual(usage(dc), want_full)

    def test_old_store(self):
        """A store written before the safety records opens and gets
        them from now on (tests/fixtures/casbox-v1/README.md)."""
        import dovecot_harness
        fixture = os.path.join(dovecot_harness.TOP_SRCDIR, "tests",
                               "fixtures", "casbox-v1")
        # sent: what was delivered; served: what that build's IMAP
        # answered for it (with LMTP's Return-Path and Delivered-To)
        def read(name):
            with open(os.path.join(fixture, name), "rb") as f:
                return f.read()
        mail = {n: read("msg%d.eml" % n) for n in (1, 3, 4)}
        served = {n: read("served%d.eml" % n) for n in (1, 3, 4)}
        settings = dict(RETAIN, casbox_duplicate_window="1d")
        with Dovecot(plugin_settings=settings,
                     extra_conf="lmtp_add_received_header = no\n") as dc:
            home = dc.home("user1")
            shutil.rmtree(home, ignore_errors=True)
            shutil.copytree(os.path.join(fixture, "home"), home)
            for root, dirs, files in os.walk(home):
                for name in dirs + files:
                    os.chown(os.path.join(root, name), dc.uid, dc.gid)
            os.chown(home, dc.uid, dc.gid)
            os.chmod(os.path.join(home, "casbox.key"), 0o600)
            inbox = fetch(dc, "user1")
            self.assertEqual(sorted(inbox), [1, 3])
            self.assertEqual(inbox[1][3], served[1])
            self.assertEqual(inbox[3][3], served[3])
            self.assertTrue(served[3].endswith(mail[3]))
            self.assertEqual(inbox[3][1], ["\\Flagged"])
            work = fetch(dc, "user1", "Work")
            self.assertEqual([v[3] for v in work.values()], [served[4]])
            self.assertEqual(list(work.values())[0][1],
                             ["$Fixture", "\\Seen"])
            self.assertEqual(table(dc, "undelete", "-u", "user1",
                                   "--list"), [])
            self.assertEqual(dc.casbox_audit("user1"), [])
            # no dup record came with msg1: stored, then suppressed
            dc.lmtp_deliver("user1", mail[1])
            dc.lmtp_deliver("user1", mail[1])
            self.assertIsNotNone(dc.wait_log("Duplicate delivery "
                                             "suppressed"))
            self.assertEqual(len(fetch(dc, "user1")), 3)
            expunge(dc, "user1", [3])
            table(dc, "undelete", "-u", "user1")
            after = fetch(dc, "user1")
            self.assertEqual([v[3] for v in after.values()
                              if v[3] == served[3]], [served[3]])
            self.assertEqual(dc.casbox_audit("user1"), [])

    def test_with_lazy_expunge(self):
        msgs = corpus(3)
        settings = dict(RETAIN, lazy_expunge=".EXPUNGED")
        with Dovecot(plugin_settings=settings,
                     mail_plugins=["casbox", "lazy_expunge"]) as dc:
            dc.lmtp_deliver_many("user1", msgs)
            before = fetch(dc, "user1")
            expunge(dc, "user1", [1, 2])
            lazy = fetch(dc, "user1", ".EXPUNGED")
            self.assertEqual(sorted(v[3] for v in lazy.values()),
                             sorted(before[u][3] for u in (1, 2)))
            # lazy_expunge moves the mail there: nothing to retain
            self.assertEqual(table(dc, "undelete", "-u", "user1",
                                   "--list"), [])
            # what is expunged from its mailbox is retained: a second
            # net behind lazy_expunge's
            expunge(dc, "user1", sorted(lazy), ".EXPUNGED")
            self.assertEqual(fetch(dc, "user1", ".EXPUNGED"), {})
            listed = table(dc, "undelete", "-u", "user1", "--list")
            self.assertEqual([r["mailbox"] for r in listed],
                             [".EXPUNGED"] * 2)
            table(dc, "undelete", "-u", "user1", "--to", "INBOX")
            self.assertEqual(sorted(v[3] for v in fetch(
                dc, "user1").values()), sorted(v[3] for v in
                                               before.values()))
            self.assertEqual(dc.casbox_audit("user1"), [])


class UndeletePasswordTest(unittest.TestCase):
    """casbox_key_mode = password: --list needs no password; a restore
    reads it from stdin as rebuild --from-packs does (doc/doveadm.md):
    refused without it, with a wrong one or from a terminal, and then
    nothing is restored; with it the mail comes back byte-exact."""

    def test_password_restore(self):
        msgs = corpus(4)
        with Dovecot(plugin_settings=PW_RETAIN, passdb_extra=PASS_PW,
                     users=["user1", "other"]) as dc:
            # the first login creates the user key file
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            imap.logout()
            dc.lmtp_deliver_many("user1", msgs)
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            ok(imap.uid("STORE", "2", "+FLAGS", "(\\Seen $Work)"))
            imap.logout()
            before = fetch(dc, "user1")
            expunge(dc, "user1", [2, 3])

            def retained():
                return sorted(int(r["uid"]) for r in table(
                    dc, "undelete", "-u", "user1", "--list"))

            self.assertEqual(retained(), [2, 3])

            def undelete(stdin, *args):
                return dc.doveadm("-f", "tab", "casbox", "undelete",
                                  "-u", "user1", *args, check=False,
                                  input=stdin)

            for stdin, code, why in (
                    ("", 66, "no input"),
                    ("\n", 66, "is empty"),
                    ("one\ntwo\n", 66, "more than 1 line"),
                    ("not-the-password\n", 65, "wrong password")):
                r = undelete(stdin)
                self.assertEqual(r.returncode, code, (stdin, r.stderr))
                self.assertIn("casbox undelete: ", r.stderr)
                self.assertIn(why, r.stderr)
                self.assertEqual(r.stdout.count("\n"), 1, r.stdout)
                self.assertEqual(sorted(fetch(dc, "user1")), [1, 4])
                self.assertEqual(retained(), [2, 3])
            # a terminal would echo the password: refused before a read
            master, slave = pty.openpty()
            try:
                r = subprocess.run(dc.doveadm_command(
                    "casbox", "undelete", "-u", "user1"),
                    stdin=slave, capture_output=True, text=True,
                    timeout=300)
            finally:
                os.close(slave)
                os.close(master)
            self.assertEqual(r.returncode, 64, r.stderr)
            self.assertIn("stdin is a terminal", r.stderr)
            # one user's password cannot serve all users
            r = dc.doveadm("casbox", "undelete", "-A", check=False,
                           input=PASSWORD + "\n")
            self.assertEqual(r.returncode, 64, r.stderr)
            self.assertIn("one user only", r.stderr)
            self.assertEqual(retained(), [2, 3])

            r = undelete(PASSWORD + "\r\n")
            self.assertEqual(r.returncode, 0, r.stderr)
            rows = [dict(zip(r.stdout.split("\n")[0].split("\t"),
                             ln.split("\t")))
                    for ln in r.stdout.strip().split("\n")[1:]]
            self.assertEqual(sorted(int(x["uid"]) for x in rows), [2, 3])
            self.assertEqual({x["result"] for x in rows}, {"restored"})
            self.assertNotIn(PASSWORD, r.stdout + r.stderr)
            self.assertEqual(retained(), [])
            after = fetch(dc, "user1")
            self.assertEqual(len(after), 4)
            new = {v[0]: v for u, v in after.items() if u > 4}
            for u in (2, 3):
                guid, flags, date, body = before[u]
                self.assertEqual(new[guid][3], body)
                self.assertEqual(new[guid][2], date)
                self.assertEqual(new[guid][1],
                                 [f for f in flags if f != "\\Deleted"])
            self.assertIn("$Work", new[before[2][0]][1])
            self.assertEqual(dc.casbox_audit("user1"), [])
            dc.stop()
            self.assertNotIn(PASSWORD, dc.log_text())


if __name__ == "__main__":
    unittest.main()
