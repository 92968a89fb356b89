"""Replication between two servers: two Dovecot instances on loopback,
each with its own home root and a doveadm TCP listener, converge with
two-way `doveadm sync -u U tcp:127.0.0.1:<other's doveadm port>`.

That is exactly the dsync run Dovecot's replicator service starts for a
user (doveadm-server on the peer, dsync over the doveadm protocol); the
replicator only decides when. Driving `doveadm sync` by hand makes every
convergence point explicit, with no waiting on the replicator's queue.
(The alternative, `doveadm sync -u U <local location>`, runs both sides
in one process and one home, so it would not exercise two servers and
loses save dates on 2.3.19; see test_migration.SingleServer.)

Scenario, on each side in turn: mail delivered to both sides, flags and
keywords changed, messages moved and expunged, folders created; then one
side is stopped while the other keeps changing, a sync to the stopped
side fails, and after restart they converge with nothing lost and
nothing duplicated. Proven with sdbox on both sides first, then casbox.
"""

import os
import pwd
import re
import subprocess
import sys
import time
import unittest
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (DOVECOT, Dovecot, corpus_files,  # noqa: E402
                             ensure_test_user, ok)
import mailbox_dump  # noqa: E402
from test_migration import (DSYNC_PW, FORMATS, KEYS,  # noqa: E402
                            Instance, next_second, quiet_port,
                            without_save_date)

USER = "repl1"


class Server(Instance):
    """An Instance that can be stopped and started again on the same
    home, config and ports (a server going down and coming back)."""

    def restart(self):
        if self.master_pid is not None:
            raise AssertionError("still running")
        # a file, not a pipe: the daemonized master would hold a pipe
        # open forever (as in Dovecot.start)
        out_path = os.path.join(self.tmp, "restart.out")
        with open(out_path, "w+") as out:
            res = subprocess.run(self.command(DOVECOT, "-c",
                                              self.conf_path),
                                 stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, timeout=120)
            out.seek(0)
            text = out.read()
        if res.returncode != 0:
            raise AssertionError("restart failed: %s" % text)
        self.master_pid = self._find_master()


_corpus = None


def message(tag):
    """A distinct corpus message: a header naming it is prepended, so
    every delivery has its own bytes and can be counted by tag."""
    global _corpus
    if _corpus is None:
        _corpus = []
        for path in corpus_files("notmuch", limit=40, step=7):
            with open(path, "rb") as f:
                _corpus.append(f.read())
    body = _corpus[sum(map(ord, tag)) % len(_corpus)]
    return b"X-Repl-Tag: " + tag.encode() + b"\r\n" + body


def tags_by_mailbox(dc, user=USER):
    """{mailbox: Counter(tag)} from the X-Repl-Tag header, via IMAP."""
    imap = dc.imap_login(user)
    try:
        out = {}
        typ, data = imap.list('""', "*")
        ok((typ, data))
        for line in data:
            m = re.match(rb'\((.*?)\) "/" "?(.*?)"?$', line)
            if b"\\Noselect" in m.group(1):
                continue
            box = m.group(2).decode()
            ok(imap.select('"%s"' % box, readonly=True))
            typ, data = imap.uid("FETCH", "1:*",
                                 "(BODY.PEEK[HEADER.FIELDS (X-Repl-Tag)])")
            ok((typ, data))
            tags = Counter()
            for entry in data:
                if isinstance(entry, tuple):
                    m2 = re.search(rb"X-Repl-Tag: (\S+)", entry[1])
                    tags[m2.group(1).decode()] += 1
            out[box] = tags
            imap.close()
        return out
    finally:
        imap.logout()


def flags_by_tag(dc, box, user=USER):
    imap = dc.imap_login(user)
    try:
        ok(imap.select('"%s"' % box, readonly=True))
        typ, data = imap.uid("FETCH", "1:*",
                             "(FLAGS BODY.PEEK[HEADER.FIELDS (X-Repl-Tag)])")
        ok((typ, data))
        out = {}
        for entry in data:
            if isinstance(entry, tuple):
                tag = re.search(rb"X-Repl-Tag: (\S+)",
                                entry[1]).group(1).decode()
                flags = re.search(rb"FLAGS \((.*?)\)",
                                  entry[0]).group(1).decode().split()
                out[tag] = sorted(f for f in flags if f != "\\Recent")
        return out
    finally:
        imap.logout()


def replica_view(dump):
    """What two replicas must agree on: every Copy field except the
    per-server modseq counters (each server numbers its own changes;
    dsync only keeps them from going backwards)."""
    out = dict(dump)
    out["mailboxes"] = {b: {f: v for f, v in row.items()
                            if f != "highestmodseq"}
                        for b, row in dump["mailboxes"].items()}
    out["messages"] = {k: {f: v for f, v in row.items() if f != "modseq"}
                       for k, row in dump["messages"].items()}
    return out


class ReplicationCase:
    FMT = None

    def sync(self, a, b):
        """Two-way sync started on a, with a's saved state, as a's
        replicator would. Without a state dsync does a full sync, which
        cannot tell "expunged on one side" from "new on the other" and
        brings expunged mail back (seen with stock sdbox)."""
        states = self.__dict__.setdefault("states", {})
        # a save date the receiving side made up at sync time must not
        # equal the original one by coincidence
        next_second()
        res = a.doveadm("sync", "-s", states.get(a.tmp, ""), "-u", USER,
                        b.dsync_url())
        state = res.stdout.strip()
        self.assertRegex(state, r"^\S+$", "no dsync state printed")
        states[a.tmp] = state

    def assert_converged(self, a, b, expected):
        """Both replicas hold exactly `expected` ({mailbox: Counter}),
        and agree on every Copy field and byte."""
        for side in (a, b):
            got = {box: tags for box, tags in tags_by_mailbox(side).items()
                   if tags or box in expected}
            want = {box: tags for box, tags in expected.items()}
            self.assertEqual(got, want, "content of %s" % side.home(USER))
        da = replica_view(mailbox_dump.dump_user(a, USER))
        db = replica_view(mailbox_dump.dump_user(b, USER))
        self.assertEqual(mailbox_dump.compare(da, db), [])
        self.assertEqual(mailbox_dump.compare(db, da), [])

    def test_converge_both_ways_and_after_outage(self):
        with Server(FORMATS[self.FMT]) as a, Server(FORMATS[self.FMT]) as b:
            # 1. B is a new replica: seeded from A before it takes any
            # mail (as when replication is switched on), then new mail
            # and folders on both sides
            a.lmtp_deliver_many(USER, [message("a%d" % i)
                                       for i in range(8)])
            ia = a.imap_login(USER)
            ok(ia.create("Work"))
            ok(ia.subscribe("Work"))
            ia.logout()
            self.sync(a, b)
            b.lmtp_deliver_many(USER, [message("b%d" % i)
                                       for i in range(6)])
            ib = b.imap_login(USER)
            ok(ib.create("Lists/dev"))
            ib.logout()
            self.sync(a, b)
            self.sync(b, a)  # so B has a state of its own
            inbox = Counter(["a%d" % i for i in range(8)]
                            + ["b%d" % i for i in range(6)])
            self.assert_converged(a, b, {"INBOX": inbox,
                                         "Work": Counter(),
                                         "Lists/dev": Counter()})

            # 2. changes on both sides: flags on A, keywords on B, a
            # move on A and another on B, expunges on both
            ia = a.imap_login(USER)
            ok(ia.select("INBOX"))
            uid_of = {tag: uid for uid, tag in
                      self._uids_by_tag(ia).items()}
            ok(ia.uid("STORE", "%d,%d" % (uid_of["a1"], uid_of["b1"]),
                      "+FLAGS", r"(\Flagged \Seen)"))
            ok(ia.uid("MOVE", str(uid_of["a2"]), "Work"))
            ok(ia.uid("STORE", str(uid_of["b2"]), "+FLAGS", r"(\Deleted)"))
            ok(ia.uid("EXPUNGE", str(uid_of["b2"])))
            ia.logout()
            ib = b.imap_login(USER)
            ok(ib.select("INBOX"))
            uid_of = {tag: uid for uid, tag in
                      self._uids_by_tag(ib).items()}
            ok(ib.uid("STORE", str(uid_of["a3"]), "+FLAGS",
                      r"($Important project-x)"))
            ok(ib.uid("MOVE", str(uid_of["b3"]), "Lists/dev"))
            ok(ib.uid("STORE", str(uid_of["a4"]), "+FLAGS", r"(\Deleted)"))
            ok(ib.uid("EXPUNGE", str(uid_of["a4"])))
            ib.logout()
            self.sync(b, a)  # this time B starts the sync
            inbox -= Counter(["a2", "b2", "b3", "a4"])
            expected = {"INBOX": inbox, "Work": Counter(["a2"]),
                        "Lists/dev": Counter(["b3"])}
            self.assert_converged(a, b, expected)
            for side in (a, b):
                fl = flags_by_tag(side, "INBOX")
                self.assertEqual(fl["a1"], ["\\Flagged", "\\Seen"])
                self.assertEqual(fl["b1"], ["\\Flagged", "\\Seen"])
                self.assertEqual(fl["a3"], ["$Important", "project-x"])

            # 3. B goes down; A keeps taking mail and changes
            b.stop()
            a.lmtp_deliver_many(USER, [message("c%d" % i)
                                       for i in range(5)])
            ia = a.imap_login(USER)
            ok(ia.select("INBOX"))
            uid_of = {tag: uid for uid, tag in
                      self._uids_by_tag(ia).items()}
            ok(ia.uid("STORE", str(uid_of["c0"]), "+FLAGS", r"(\Answered)"))
            ok(ia.uid("MOVE", str(uid_of["c1"]), "Work"))
            ok(ia.uid("STORE", str(uid_of["a5"]), "+FLAGS", r"(\Deleted)"))
            ok(ia.uid("EXPUNGE", str(uid_of["a5"])))
            ok(ia.create("Archive"))
            ok(ia.uid("COPY", str(uid_of["a6"]), "Archive"))
            ia.logout()
            res = a.doveadm("sync", "-u", USER, b.dsync_url(), check=False)
            self.assertNotEqual(res.returncode, 0,
                                "sync to a stopped server succeeded")
            a.allow_log(r"doveadm.*(Connection refused|connect)")

            # 4. B comes back, with its own changes made before the sync
            # (no new mail in INBOX: see test_uid_conflict for that)
            b.restart()
            ib = b.imap_login(USER)
            ok(ib.select("INBOX"))
            uid_of = {tag: uid for uid, tag in
                      self._uids_by_tag(ib).items()}
            ok(ib.uid("STORE", str(uid_of["a6"]), "+FLAGS", r"(\Seen)"))
            ib.logout()
            ib = b.imap_login(USER)
            ok(ib.append("Lists/dev", r"(\Seen)", None, message("d0")))
            ib.logout()
            self.sync(a, b)
            inbox += Counter(["c0", "c2", "c3", "c4"])
            inbox -= Counter(["a5"])
            expected = {"INBOX": inbox, "Work": Counter(["a2", "c1"]),
                        "Lists/dev": Counter(["b3", "d0"]),
                        "Archive": Counter(["a6"])}
            self.assert_converged(a, b, expected)
            for side in (a, b):
                fl = flags_by_tag(side, "INBOX")
                self.assertEqual(fl["c0"], ["\\Answered"])
                self.assertEqual(fl["a6"], ["\\Seen"])
            # a second sync with nothing new changes nothing
            before = replica_view(mailbox_dump.dump_user(a, USER))
            self.sync(b, a)
            self.assertEqual(mailbox_dump.compare(
                before, replica_view(mailbox_dump.dump_user(a, USER))), [])

    def test_uid_conflict(self):
        """Both replicas take new mail between two syncs, so the same
        new UIDs name different messages on each side. dsync gives the
        conflicting messages new UIDs on both sides. Everything must
        converge except date.saved of the re-saved messages: dsync 2.3
        re-saves them without their save date (measured with stock sdbox
        on both sides: the renumbered messages get the sync time)."""
        with Server(FORMATS[self.FMT]) as a, Server(FORMATS[self.FMT]) as b:
            a.lmtp_deliver_many(USER, [message("a%d" % i) for i in range(3)])
            self.sync(a, b)
            self.sync(b, a)
            a.lmtp_deliver_many(USER, [message("n%d" % i) for i in range(3)])
            b.lmtp_deliver_many(USER, [message("m%d" % i) for i in range(2)])
            self.sync(b, a)
            expected = {"INBOX": Counter(["a0", "a1", "a2", "n0", "n1",
                                          "n2", "m0", "m1"])}
            for side in (a, b):
                self.assertEqual(tags_by_mailbox(side), expected)
            da = replica_view(mailbox_dump.dump_user(a, USER))
            db = replica_view(mailbox_dump.dump_user(b, USER))
            problems = mailbox_dump.compare(da, db)
            self.assertTrue(all("date.saved" in p for p in problems),
                            problems)
            self.assertEqual(mailbox_dump.compare(
                without_save_date(da), without_save_date(db)), [])
            # the messages that kept their UIDs kept their save dates
            for uid in (1, 2, 3):
                self.assertEqual(da["messages"][("INBOX", uid)],
                                 db["messages"][("INBOX", uid)])

    def test_independent_inboxes_merge(self):
        """Both servers took mail before they ever synced, so each has
        its own INBOX (own mailbox GUID): dsync tells one side to take
        the other's GUID (mailbox_update with mailbox_guid), then merges
        the messages."""
        with Server(FORMATS[self.FMT]) as a, Server(FORMATS[self.FMT]) as b:
            a.lmtp_deliver_many(USER, [message("a%d" % i) for i in range(3)])
            b.lmtp_deliver_many(USER, [message("b%d" % i) for i in range(2)])
            self.sync(a, b)
            self.sync(b, a)
            self.assert_converged(a, b, {"INBOX": Counter(
                ["a0", "a1", "a2", "b0", "b1"])})

    @staticmethod
    def _uids_by_tag(imap):
        typ, data = imap.uid("FETCH", "1:*",
                             "(UID BODY.PEEK[HEADER.FIELDS (X-Repl-Tag)])")
        ok((typ, data))
        out = {}
        for entry in data:
            if isinstance(entry, tuple):
                uid = int(re.search(rb"UID (\d+)", entry[0]).group(1))
                out[uid] = re.search(rb"X-Repl-Tag: (\S+)",
                                     entry[1]).group(1).decode()
        return out


def replicator_conf(my_port, peer_port, mail_user):
    """doc/scaling.md's replication settings for one side of a pair."""
    return f"""lmtp_add_received_header = no
mail_attribute_dict = file:%h/dovecot-attributes
doveadm_password = {DSYNC_PW}
doveadm_port = {peer_port}
service doveadm {{
  inet_listener {{
    address = 127.0.0.1
    port = {my_port}
  }}
}}
service replicator {{
  process_min_avail = 1
  unix_listener replicator-doveadm {{
    mode = 0600
    user = {mail_user}
  }}
}}
service aggregator {{
  fifo_listener replication-notify-fifo {{
    user = {mail_user}
  }}
  unix_listener replication-notify {{
    user = {mail_user}
  }}
}}
replication_dsync_parameters = -d -N -l 30 -U
"""


def wait_for(what, cond, timeout=60):
    """Poll cond() until true: replication is asynchronous, and the
    only way to know it happened is to look. Fails after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.1)


class ReplicatorCase:
    """Dovecot's own replicator (notify + replication plugins,
    mail_replica) between two instances, as doc/scaling.md configures
    it: changes made through IMAP/LMTP on either side reach the other
    without anyone running doveadm sync."""
    FMT = None

    def pair(self):
        pa, pb = quiet_port(), quiet_port()
        while pb == pa:
            pb = quiet_port()
        user = ensure_test_user().pw_name if os.geteuid() == 0 \
            else pwd.getpwuid(os.getuid()).pw_name
        sides = []
        for me, peer in ((pa, pb), (pb, pa)):
            settings = dict(KEYS, mail_replica="tcp:127.0.0.1:%d" % peer)
            dc = Dovecot(mail_location=FORMATS[self.FMT],
                         mail_plugins=["casbox", "notify", "replication"],
                         plugin_settings=settings,
                         extra_conf=replicator_conf(me, peer, user))
            # the replicator lists all users at start; the harness's
            # static userdb cannot
            dc.allow_log("iterate users|userdb list|listing users failed")
            sides.append(dc)
        return sides

    def count(self, dc, flag=None):
        query = ["mailbox", "INBOX"] + (["flagged"] if flag else [])
        res = dc.doveadm("-f", "tab", "search", "-u", USER, *query)
        return len([l for l in res.stdout.splitlines()[1:] if l])

    def test_changes_replicate_both_ways(self):
        a, b = self.pair()
        with a, b:
            a.lmtp_deliver(USER, message("r0"))
            # B's INBOX must come from A (see test_independent_inboxes_
            # merge): look at A's replicator, not at B, until it synced
            wait_for("first replication", lambda: any(
                line.split()[-2] != "-" for line in a.doveadm(
                    "replicator", "status", USER).stdout.splitlines()[1:]))
            wait_for("r0 on B", lambda: self.count(b) == 1)
            b.lmtp_deliver(USER, message("r1"))
            wait_for("r1 on A", lambda: self.count(a) == 2)
            ib = b.imap_login(USER)
            ok(ib.select("INBOX"))
            ok(ib.uid("STORE", "1", "+FLAGS", r"(\Flagged)"))
            ib.logout()
            wait_for("flag on A", lambda: self.count(a, "flagged") == 1)
            ia = a.imap_login(USER)
            ok(ia.select("INBOX"))
            ok(ia.uid("STORE", "2", "+FLAGS", r"(\Deleted)"))
            ok(ia.uid("EXPUNGE", "2"))
            ia.logout()
            wait_for("expunge on B", lambda: self.count(b) == 1)
            self.assertEqual(tags_by_mailbox(a), {"INBOX": Counter(["r0"])})
            self.assertEqual(tags_by_mailbox(b), {"INBOX": Counter(["r0"])})


class SdboxReplicator(ReplicatorCase, unittest.TestCase):
    FMT = "sdbox"


class CasboxReplicator(ReplicatorCase, unittest.TestCase):
    FMT = "casbox"


class SdboxReplication(ReplicationCase, unittest.TestCase):
    FMT = "sdbox"


class CasboxReplication(ReplicationCase, unittest.TestCase):
    FMT = "casbox"

    def test_independent_inboxes_merge(self):
        super().test_independent_inboxes_merge()


if __name__ == "__main__":
    unittest.main(verbosity=2)
