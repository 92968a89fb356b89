"""Migration parity: maildir, sdbox and mdbox users filled from the real
corpus (flags, keywords, folders, subscriptions, attributes, expunged
UID gaps) are copied into a destination with `doveadm backup -R`, and
every Copy field of doc/migration.md and every message byte must match;
then the destination is copied back out into sdbox and compared again.
The source must come out of it unchanged, file for file.

Each side is its own Dovecot instance (own home root), and dsync runs
over doveadm's TCP protocol, the way two servers talk: the receiving
instance runs `doveadm backup -R -u U tcp:127.0.0.1:<source port>`.
Why not the single-server form (`-o mail_location=... backup -R ...`)
for the parity check: both locations of one user share the home and
thus `mail_attribute_dict`, so attributes would compare equal without
dsync carrying them, and the destination would write into the tree we
checksum. The single-server command of doc/migration.md is tested on
its own below (test_single_server_*).

The checks are first proven with sdbox as destination (that is stock
Dovecot and must pass), then run with casbox.
"""

import hashlib
import os
import random
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (Dovecot, corpus_files, ok, load,  # noqa: E402
                             location_override)
import mailbox_dump  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
USER = "migr1"
DSYNC_PW = "dsync-test-secret"
FORMATS = {
    "maildir": "maildir:~/Maildir",
    "sdbox": "sdbox:~/sdbox",
    "mdbox": "mdbox:~/mdbox",
    "casbox": "casbox:~/casbox",
}
# Everything below the source root, plus the attribute dict
SOURCE_FILES = {
    "maildir": ["Maildir"],
    "sdbox": ["sdbox"],
    "mdbox": ["mdbox"],
    "casbox": ["casbox", "casbox.key"],
}


def conf(doveadm_port):
    return f"""lmtp_add_received_header = no
mail_attribute_dict = file:%h/dovecot-attributes
protocol imap {{
  imap_metadata = yes
}}
doveadm_password = {DSYNC_PW}
service doveadm {{
  inet_listener {{
    address = 127.0.0.1
    port = {doveadm_port}
  }}
}}
namespace inbox {{
  mailbox Archive {{
    special_use = \\Archive
  }}
  mailbox Sent {{
    special_use = \\Sent
  }}
}}
"""


def quiet_port():
    """A free TCP port below the kernel's ephemeral range. The harness
    picks its IMAP/LMTP ports with bind(0) from the ephemeral range when
    an instance starts; a port we pick earlier the same way but bind
    only later (the doveadm listener, a peer's port) could be handed out
    again in between ("duplicate listener")."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    rng = random.Random()
    while True:
        port = rng.randint(10000, low - 1)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


class Instance(Dovecot):
    """A harness Dovecot that also serves dsync on a doveadm TCP port."""

    def __init__(self, location, **kw):
        self.doveadm_port = quiet_port()
        super().__init__(mail_location=location, mail_plugins=["casbox"],
                         plugin_settings=KEYS,
                         extra_conf=conf(self.doveadm_port), **kw)

    def dsync_url(self):
        return "tcp:127.0.0.1:%d" % self.doveadm_port


def fill(dc, user=USER):
    """A mailbox with the things migrations lose: keywords, \\Deleted
    kept, expunged UIDs (gaps), nested folders, an empty folder, a
    subscription to a mailbox that does not exist, attributes on
    mailboxes and on the server, APPENDed INTERNALDATEs."""
    inbox = load(corpus_files("notmuch", limit=30, step=9))
    dc.lmtp_deliver_many(user, inbox)
    imap = dc.imap_login(user)
    try:
        for box in ("Work", "Work/Projects", "Lists/mime", "Archive",
                    "Sent", "Empty", "Ghost"):
            ok(imap.create(box))
        for box in ("Work", "Work/Projects", "Archive", "Ghost"):
            ok(imap.subscribe(box))
        ok(imap.delete("Ghost"))  # the subscription may outlive it
        for i, msg in enumerate(load(corpus_files("mime-edge", limit=25,
                                                  step=7))):
            flags = [r"(\Seen)", r"(\Seen \Answered $Forwarded)",
                     r"(\Flagged project-x)", "()", r"(\Draft)"][i % 5]
            date = '"%02d-Mar-2021 10:%02d:07 +0200"' % (1 + i, i)
            ok(imap.append("Lists/mime", flags, date, msg))
        ok(imap.select("INBOX"))
        ok(imap.uid("STORE", "1:10", "+FLAGS", r"(\Seen)"))
        ok(imap.uid("STORE", "3,5,7", "+FLAGS", r"($Label1 Later)"))
        ok(imap.uid("STORE", "4", "+FLAGS", r"(\Deleted)"))
        ok(imap.uid("STORE", "12", "+FLAGS", r"(\Answered $MDNSent)"))
        ok(imap.uid("COPY", "1:6", "Work"))
        ok(imap.uid("COPY", "2,4,6", "Archive"))
        ok(imap.uid("MOVE", "20:24", "Work/Projects"))
        # expunged gaps: UIDs 8 and 15 disappear; 4 stays \Deleted
        ok(imap.uid("STORE", "8,15", "+FLAGS", r"(\Deleted)"))
        ok(imap.uid("EXPUNGE", "8,15"))
        ok(imap.select("Work"))
        ok(imap.uid("STORE", "2", "+FLAGS", r"(\Deleted)"))
        ok(imap.uid("EXPUNGE", "2"))
        ok(imap.uid("STORE", "5", "-FLAGS", r"(\Seen)"))
        ok(imap.select("Lists/mime"))
        ok(imap.uid("STORE", "1", "+FLAGS", r"(\Deleted)"))
        ok(imap.uid("EXPUNGE", "1"))
    finally:
        imap.logout()
    for box, key, value in (
            ("INBOX", "/private/comment", "private inbox note"),
            ("Work", "/shared/comment", "shared work note"),
            ("Work/Projects", "/private/vendor/vendor.example/colour",
             "green"),
            ("Lists/mime", "/shared/vendor/vendor.example/list-id",
             "<mime.example.com>")):
        dc.doveadm("mailbox", "metadata", "set", "-u", user, box, key,
                   value)
    dc.doveadm("mailbox", "metadata", "set", "-u", user, "-s", "",
               "/private/vendor/vendor.example/server-note", "hello")


def tree_digest(dc, roots, user=USER):
    """sha256 of every file under the given names in the user's home:
    {relative path: digest}."""
    home = dc.home(user)
    out = {}
    for root in roots:
        top = os.path.join(home, root)
        if os.path.isfile(top):
            with open(top, "rb") as f:
                out[root] = hashlib.sha256(f.read()).hexdigest()
            continue
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, home)] = hashlib.sha256(
                        f.read()).hexdigest()
    return out


# Dovecot writes its own index files when dsync opens and syncs a
# mailbox, even only to read it (measured on 2.3.19: after a backup from
# maildir every dovecot.index.log and dovecot.list.index.log of the
# source had grown; from sdbox and mdbox also dovecot.index.cache, since
# dsync fetches fields the cache then decides to keep). Those are
# Dovecot's bookkeeping, not mail; every other file (message files,
# dovecot-uidlist, dovecot-keywords, dbox files, storage/m.* and the map
# index, casbox packs and LSM, the attribute dict) must be byte-identical.
INDEX_LOGS = ("dovecot.index.log", "dovecot.index.log.2",
              "dovecot.list.index.log", "dovecot.list.index.log.2",
              "dovecot.index.cache", "dovecot.index")


def tree_changes(before, after):
    return sorted(p for p in set(before) | set(after)
                  if before.get(p) != after.get(p)
                  and os.path.basename(p) not in INDEX_LOGS)


class MigrationCase:
    """Mixin: SRC and DST are keys of FORMATS. setUpClass runs the whole
    migration once (fill SRC, backup into DST, backup DST out into a
    fresh sdbox) and keeps the dumps; each test checks one claim."""
    SRC = None
    DST = None

    @classmethod
    def setUpClass(cls):
        roots = SOURCE_FILES[cls.SRC] + ["dovecot-attributes"]
        dst_roots = SOURCE_FILES[cls.DST] + ["dovecot-attributes"]
        with Instance(FORMATS[cls.SRC]) as src, \
                Instance(FORMATS[cls.DST]) as dst, \
                Instance(FORMATS["sdbox"]) as back:
            fill(src)
            next_second()
            # reading syncs maildir's new/ into cur/ once; after that
            # the tree must stay put
            cls.before = mailbox_dump.dump_user(src, USER)
            cls.src_sums = tree_digest(src, roots)
            dst.doveadm("backup", "-R", "-u", USER, src.dsync_url())
            cls.there = mailbox_dump.dump_user(dst, USER)
            cls.dst_sums = tree_digest(dst, dst_roots)
            back.doveadm("backup", "-R", "-u", USER, dst.dsync_url())
            cls.again = mailbox_dump.dump_user(back, USER)
            cls.src_after = mailbox_dump.dump_user(src, USER)
            cls.src_sums_after = tree_digest(src, roots)
            cls.dst_sums_after = tree_digest(dst, dst_roots)

    def test_source_is_realistic(self):
        self.assertGreater(len(self.before["messages"]), 50)
        self.assertEqual(len(self.before["digests"]),
                         len(self.before["messages"]))
        uids = sorted(u for (b, u) in self.before["messages"]
                      if b == "INBOX")
        self.assertNotEqual(uids, list(range(1, len(uids) + 1)),
                            "expected expunged gaps in INBOX UIDs")
        self.assertEqual(len(self.before["attributes"]) >= 5, True)
        self.assertIn("Ghost", self.before["subscriptions"])

    def test_into_destination(self):
        self.assertEqual(mailbox_dump.compare(self.before, self.there),
                         [], "%s -> %s" % (self.SRC, self.DST))

    def test_back_out_into_sdbox(self):
        self.assertEqual(mailbox_dump.compare(self.before, self.again),
                         [], "%s -> %s -> sdbox" % (self.SRC, self.DST))

    def test_source_unchanged(self):
        self.assertEqual(mailbox_dump.compare(self.before,
                                              self.src_after), [])
        self.assertEqual(tree_changes(self.src_sums,
                                      self.src_sums_after), [])

    def test_destination_unchanged_as_source(self):
        """The second leg reads DST: it too must only be read."""
        self.assertEqual(tree_changes(self.dst_sums,
                                      self.dst_sums_after), [])


class CompareCatchesDifferences(unittest.TestCase):
    """The comparison itself: every kind of damage is reported."""

    def test_each_field(self):
        base = {
            "mailboxes": {"INBOX": {"guid": "g1", "uidvalidity": "7",
                                    "uidnext": "4", "messages": "2",
                                    "highestmodseq": "9"}},
            "messages": {("INBOX", 1): {"guid": "a", "flags": "\\Seen",
                                        "date.saved": "x", "modseq": "3"},
                         ("INBOX", 3): {"guid": "b", "flags": "",
                                        "date.saved": "y", "modseq": "9"}},
            "subscriptions": ["INBOX"],
            "attributes": {("INBOX", "/private/comment"): "hi"},
            "keywords": {"INBOX": ["$a", "$b"]},
            "digests": {("INBOX", 1): "d1", ("INBOX", 3): "d3"},
            "special_use": {},
        }
        self.assertEqual(mailbox_dump.compare(base, base), [])
        damages = [
            lambda d: d["mailboxes"]["INBOX"].update(uidvalidity="8"),
            lambda d: d["mailboxes"]["INBOX"].update(highestmodseq="8"),
            lambda d: d["messages"][("INBOX", 1)].update(flags=""),
            lambda d: d["messages"][("INBOX", 3)].update(modseq="10"),
            lambda d: d["messages"].pop(("INBOX", 3)),
            lambda d: d["subscriptions"].append("Ghost"),
            lambda d: d["attributes"].update({("INBOX",
                                               "/private/comment"): "ho"}),
            lambda d: d["keywords"].update(INBOX=["$b", "$a"]),
            lambda d: d["digests"].update({("INBOX", 1): "dx"}),
            lambda d: d["special_use"].update(Sent=["\\Sent"]),
        ]
        import copy
        for damage in damages:
            other = copy.deepcopy(base)
            damage(other)
            self.assertNotEqual(mailbox_dump.compare(base, other), [],
                                other)
        # highestmodseq may grow
        other = copy.deepcopy(base)
        other["mailboxes"]["INBOX"]["highestmodseq"] = "10"
        self.assertEqual(mailbox_dump.compare(base, other), [])


# Stock Dovecot on both ends: proves the checks themselves.
class FromMaildirToSdbox(MigrationCase, unittest.TestCase):
    SRC, DST = "maildir", "sdbox"


class FromSdboxToSdbox(MigrationCase, unittest.TestCase):
    SRC, DST = "sdbox", "sdbox"


class FromMdboxToSdbox(MigrationCase, unittest.TestCase):
    SRC, DST = "mdbox", "sdbox"


# Into casbox and back out.
class CasboxDestination(MigrationCase):
    DST = "casbox"

    def test_destination_unchanged_as_source(self):
        super().test_destination_unchanged_as_source()


class FromMaildirToCasbox(CasboxDestination, unittest.TestCase):
    SRC = "maildir"


class FromSdboxToCasbox(CasboxDestination, unittest.TestCase):
    SRC = "sdbox"


class FromMdboxToCasbox(CasboxDestination, unittest.TestCase):
    SRC = "mdbox"


def next_second():
    """Wait for the wall clock to pass into the next second, so that a
    save date set by the destination at migration time cannot equal the
    source's save dates by coincidence (dates have 1 s resolution)."""
    start = int(time.time())
    while int(time.time()) == start:
        time.sleep(0.05)


def without_save_date(dump):
    out = dict(dump)
    out["messages"] = {k: {f: v for f, v in row.items()
                           if f != "date.saved"}
                       for k, row in dump["messages"].items()}
    return out


def craft_maildir_with_pop3(dc, user):
    """A maildir as an old POP3 server left it, written by hand: files
    with their own names (the GUIDs), mtimes (received dates), and a
    dovecot-uidlist whose records carry POP3 UIDLs (P) and POP3 order
    (O) that differ from anything Dovecot would generate. UIDs 2, 5, 7:
    gaps. Returns {uid: (uidl, order)}."""
    home = dc.home(user)
    md = os.path.join(home, "Maildir")
    for d in (home, md, md + "/cur", md + "/new", md + "/tmp"):
        os.mkdir(d)
        os.chown(d, dc.uid, dc.gid)
    want = {2: ("UIDL-b", 3), 5: ("old.format.0002", 1), 7: ("X9", 2)}
    lines = ["3 V1700000000 N8 G0123456789abcdef0123456789abcdef"]
    for uid, (uidl, order) in sorted(want.items()):
        # LF line ends, as in any maildir Dovecot or an MTA wrote
        body = b"Subject: pop %d\n\npop body %d\n" % (uid, uid)
        base = "17000000%02d.M%dP1.oldhost,S=%d" % (uid, uid, len(body))
        path = os.path.join(md, "cur", base + ":2,S")
        with open(path, "wb") as f:
            f.write(body)
        os.chown(path, dc.uid, dc.gid)
        os.utime(path, (1600000000 + uid, 1600000000 + uid))
        lines.append("%d P%s O%d :%s" % (uid, uidl, order, base))
    path = os.path.join(md, "dovecot-uidlist")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chown(path, dc.uid, dc.gid)
    return want


class Pop3Fields(unittest.TestCase):
    """POP3 UIDLs and POP3 order of an old maildir survive migration
    into DST and back out into sdbox (the harness has no pop3 binary, so
    the maildir is written by hand as a POP3 server would leave it)."""

    def check(self, dst_fmt):
        with Instance(FORMATS["maildir"]) as src, \
                Instance(FORMATS[dst_fmt]) as dst, \
                Instance(FORMATS["sdbox"]) as back:
            want = craft_maildir_with_pop3(src, USER)
            before = mailbox_dump.dump_user(src, USER)
            got = {u: (r["pop3.uidl"], int(r["pop3.order"]))
                   for (b, u), r in before["messages"].items()}
            self.assertEqual(got, want, "the source as crafted")
            next_second()
            dst.doveadm("backup", "-R", "-u", USER, src.dsync_url())
            there = mailbox_dump.dump_user(dst, USER)
            self.assertEqual(mailbox_dump.compare(before, there), [])
            back.doveadm("backup", "-R", "-u", USER, dst.dsync_url())
            self.assertEqual(mailbox_dump.compare(
                before, mailbox_dump.dump_user(back, USER)), [])

    def test_into_sdbox(self):
        self.check("sdbox")

    def test_into_casbox(self):
        self.check("casbox")


class SingleServer(unittest.TestCase):
    """The commands of doc/migration.md as an admin runs them on one
    server: the configured mail_location is the old format and casbox is
    given with -o, one `-u user` run per user. (-A needs a userdb that
    can iterate users, which the harness's static userdb cannot; and
    sync/backup have no -F user-file option: for dsync -F means "only
    mails with this flag", and without -u it then iterates all users.)"""
    USERS = ["migr1", "migr2"]

    def fill_users(self, dc):
        for user in self.USERS:
            fill(dc, user)
        before = {u: mailbox_dump.dump_user(dc, u, with_imap=False)
                  for u in self.USERS}
        next_second()
        return before

    def test_backup_R_over_doveadm_tcp(self):
        """Recommended: this server's own doveadm-server reads the old
        location (its configured mail_location), a doveadm process with
        -o mail_location=casbox writes casbox. Every field is kept."""
        with Instance(FORMATS["maildir"]) as dc:
            before = self.fill_users(dc)
            for user in self.USERS:
                dc.doveadm(*location_override(FORMATS["casbox"]),
                           "backup", "-R", "-u", user, dc.dsync_url())
            for user in self.USERS:
                after = mailbox_dump.dump_user(dc, user, FORMATS["casbox"],
                                               with_imap=False)
                self.assertEqual(mailbox_dump.compare(before[user], after),
                                 [], user)
            # an incremental run after new mail brings only the new mail
            dc.lmtp_deliver("migr1",
                            b"Subject: late\r\n\r\nlate mail\r\n")
            dc.doveadm(*location_override(FORMATS["casbox"]),
                       "backup", "-R", "-u", "migr1", dc.dsync_url())
            src = mailbox_dump.dump_user(dc, "migr1", with_imap=False)
            dst = mailbox_dump.dump_user(dc, "migr1", FORMATS["casbox"],
                                         with_imap=False)
            self.assertEqual(len(src["messages"]),
                             len(before["migr1"]["messages"]) + 1)
            self.assertEqual(mailbox_dump.compare(src, dst), [])

    def test_backup_R_local_location(self):
        """`doveadm -o mail_location=casbox:~/casbox backup -R -u U
        maildir:~/Maildir`, both locations in one process. Measured on
        Dovecot 2.3.19 with stock sdbox as destination too: every field
        is kept except date.saved, which most messages get as the time
        of the migration (see doc/migration.md). Everything else must
        match."""
        with Instance(FORMATS["maildir"]) as dc:
            before = self.fill_users(dc)
            for user in self.USERS:
                dc.doveadm(*location_override(FORMATS["casbox"]),
                           "backup", "-R", "-u", user, FORMATS["maildir"])
            for user in self.USERS:
                after = mailbox_dump.dump_user(dc, user, FORMATS["casbox"],
                                               with_imap=False)
                self.assertEqual(mailbox_dump.compare(
                    without_save_date(before[user]),
                    without_save_date(after)), [], user)


if __name__ == "__main__":
    unittest.main(verbosity=2)
