"""doveadm casbox rebuild --from-packs: the LSM rebuilt from the packs'
recovery records (doc/doveadm.md, doc/casbox-storage.md "Rebuild from
the packs").

Corpus mail delivered over LMTP to INBOX, appended to Work with flags,
copied from INBOX to Work, flags changed, a few expunged; `doveadm fetch`
of every field and IMAP BODY[] recorded. Then the LSM is removed (or
corrupted, or removed together with the index files) and
`rebuild --from-packs` must bring every message back in its mailbox with
the same UID, GUID, dates, sizes and bytes. What cannot come back is
asserted too: flag changes after the save (when the index files are lost
as well) and expunges not yet collected by gc (the mail comes back)."""

import glob
import os
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files  # noqa: E402
from casbox_packs import frame_bytes, pack_frames  # noqa: E402
import test_rebuild  # noqa: E402
from test_rebuild import (KEYS, USER, Snapshot, index_files,  # noqa: E402
                          parse_tab, strip_recent)

EXPUNGED_INBOX = [3, 17, 40]
EXPUNGED_WORK = [2]
NEXPUNGED = len(EXPUNGED_INBOX) + len(EXPUNGED_WORK)


def populate(dc):
    """INBOX: 40 usrp-users messages by LMTP. Work: 20 mime-edge
    messages APPENDed with flags, then INBOX 1:8 COPYed in. Flags
    changed after the saves; a few messages expunged."""
    inbox = []
    for path in corpus_files("usrp-users-3000", limit=40, step=11):
        with open(path, "rb") as f:
            inbox.append(f.read())
    dc.lmtp_deliver_many(USER, inbox)
    dc.doveadm("mailbox", "create", "-u", USER, "Work")
    imap = dc.imap_login(USER)
    try:
        n = 0
        for path in corpus_files("mime-edge", limit=25):
            with open(path, "rb") as f:
                data = f.read()
            if not data.strip() or n == 20:
                continue
            flags = "(\\Flagged $Label1)" if n % 4 == 0 else None
            typ, resp = imap.append("Work", flags,
                                    '"14-Jul-2021 02:44:25 +0200"', data)
            assert typ == "OK", resp
            n += 1
        imap.select("INBOX")
        typ, resp = imap.uid("COPY", "1:8", "Work")
        assert typ == "OK", resp
        for cmd in ((b"1:10", "+FLAGS", r"(\Seen Todo)"),
                    (b"20:25", "+FLAGS", r"(\Deleted)")):
            typ, resp = imap.uid("STORE", *cmd)
            assert typ == "OK", resp
    finally:
        imap.logout()
    dc.doveadm("expunge", "-u", USER, "mailbox", "INBOX", "uid",
               ",".join(str(u) for u in EXPUNGED_INBOX))
    dc.doveadm("expunge", "-u", USER, "mailbox", "Work", "uid",
               ",".join(str(u) for u in EXPUNGED_WORK))


def bodystructures(dc, uids):
    """(mailbox, uid) -> BODYSTRUCTURE response of each (mailbox, uid),
    without the sequence number (literals flattened in)."""
    imap = dc.imap_login(USER)
    out = {}
    try:
        for box in ("INBOX", "Work"):
            typ, _ = imap.select(box, readonly=True)
            assert typ == "OK", box
            for uid in uids[box]:
                typ, data = imap.uid("FETCH", str(uid), "(BODYSTRUCTURE)")
                assert typ == "OK", data
                raw = b"".join(b"".join(x) if isinstance(x, tuple) else x
                               for x in data)
                out[(box, uid)] = raw[raw.index(b"BODYSTRUCTURE"):]
    finally:
        imap.logout()
    return out


def from_packs(dc, check=True):
    r = dc.doveadm("-f", "tab", "casbox", "rebuild", "--from-packs", "-u",
                   USER, check=check)
    rows = parse_tab(r.stdout) if r.stdout else []
    return r, (rows[0] if rows else None)


def meta_frames(root, want):
    """Meta frames of one kind (the kind byte is at offset 5 of the
    frame header, in the clear): 1 a saved message's recovery record,
    3 a mailbox record, 4 blob keys, 5 a COPY's copy record."""
    return [(path, off, magic, size)
            for path, off, magic, size, head in frame_bytes(root, 6)
            if magic == b"CBMF" and head[5] == want]


def recovery_records(root):
    """The recovery records of saved messages, in pack order."""
    return meta_frames(root, 1)


def unchanged_fields(m):
    """What the message record holds from the save: not flags, not
    modseq."""
    return {k: v for k, v in m.items() if k not in ("flags", "modseq")}


class RebuildFromPacksTest(unittest.TestCase):

    maxDiff = None

    def setUp(self):
        self.dc = Dovecot(mail_location="casbox:~/casbox",
                          mail_plugins=["casbox"], plugin_settings=KEYS)
        self.dc.__enter__()
        self.root = os.path.join(self.dc.home(USER), "casbox")
        populate(self.dc)
        self.before = Snapshot(self.dc)
        self.assert_sane(self.before)

    def tearDown(self):
        self.dc.__exit__(None, None, None)

    def assert_sane(self, snap):
        inbox, work = snap.msgs["INBOX"], snap.msgs["Work"]
        self.assertEqual(len(inbox), 40 - len(EXPUNGED_INBOX))
        self.assertEqual(len(work), 20 + 8 - len(EXPUNGED_WORK))
        # the copies (of INBOX 1:8, 3 expunged since) keep the GUID
        copies = {m["guid"] for uid, m in work.items() if uid > 20}
        self.assertEqual(len(copies & {m["guid"] for m in inbox.values()}),
                         7)
        self.assertIn("Todo", inbox[1]["flags"])
        self.assertIn("$Label1", work[1]["flags"])

    def lose_lsm_and_index(self):
        """Remove the LSM and the index files, then rebuild from the
        packs: (process result, its row)."""
        shutil.rmtree(os.path.join(self.root, "lsm"))
        for path in index_files(self.root):
            os.unlink(path)
        return from_packs(self.dc)

    def assert_copies_back(self):
        """LSM and index lost, rebuilt from the packs: nothing lost, the
        copies Work 21 and 22 (of INBOX 1 and 2) back byte for byte.
        Returns the snapshot after."""
        r, row = self.lose_lsm_and_index()
        self.assertEqual(int(row["lost_messages"]), 0, row)
        after = Snapshot(self.dc)
        for uid in (21, 22):
            self.assertEqual(unchanged_fields(after.msgs["Work"][uid]),
                             unchanged_fields(self.before.msgs["Work"][uid]),
                             uid)
            self.assertEqual(after.bodies[("Work", uid)],
                             self.before.bodies[("Work", uid)], uid)
        return after

    def assert_counts(self, row, messages, expunged=0):
        self.assertEqual(int(row["mailboxes"]), 2, row)
        self.assertEqual(int(row["messages"]), messages, row)
        self.assertEqual(int(row["lost_messages"]), 0, row)
        self.assertEqual(int(row["damaged_frames"]), 0, row)
        self.assertEqual(int(row["unreadable_records"]), 0, row)
        self.assertEqual(int(row["expunged"]), expunged, row)
        self.assertGreater(int(row["blobs"]), 40, row)

    def test_lsm_removed(self):
        """Index files intact: everything comes back, flags included
        (the index keeps them), expunged mail stays expunged."""
        shutil.rmtree(os.path.join(self.root, "lsm"))
        r, row = from_packs(self.dc)
        # every message ever saved has a record; the intact index
        # knows which were expunged: their records are released again
        self.assert_counts(row, 40 + 20 + 8, expunged=NEXPUNGED)
        self.assertEqual(row["old_lsm"], "-")
        after = Snapshot(self.dc)
        test_rebuild.RebuildTest.assert_recovered(self, self.before, after)
        # the store works on: a scrub is clean (refcounts exact), gc
        # drops the expunged mail's recovery records, a delivery lands
        self.dc.doveadm("casbox", "scrub", "-u", USER)
        gc = parse_tab(self.dc.doveadm("-f", "tab", "casbox", "gc", "-u",
                                       USER, "--all").stdout)[0]
        self.assertEqual(int(gc["recovery_dropped"]), NEXPUNGED, gc)
        self.assertEqual(int(gc["recovery_kept"]), 68 - NEXPUNGED, gc)
        self.dc.lmtp_deliver(USER, b"Subject: after\n\nnew\n")
        st = parse_tab(self.dc.doveadm("-f", "tab", "mailbox", "status",
                                       "-u", USER, "messages uidnext",
                                       "INBOX").stdout)[0]
        self.assertEqual(int(st["messages"]), 38)
        self.assertEqual(int(st["uidnext"]), 42)

    def test_lsm_corrupted(self):
        """Every LSM file overwritten with garbage: moved aside (kept,
        never deleted) and rebuilt."""
        lsm = os.path.join(self.root, "lsm")
        damaged = {}
        for path in sorted(glob.glob(os.path.join(lsm, "*"))):
            if os.path.isfile(path) and os.path.getsize(path) > 0:
                with open(path, "r+b") as f:
                    f.write(b"\xa5" * min(64, os.path.getsize(path)))
                with open(path, "rb") as f:
                    damaged[os.path.basename(path)] = f.read()
        self.assertTrue(damaged)
        r, row = from_packs(self.dc)
        self.assert_counts(row, 40 + 20 + 8, expunged=NEXPUNGED)
        self.assertRegex(row["old_lsm"], r"/lsm\.broken-\d+")
        for name, data in damaged.items():
            if name == "LOCK":
                # not data: its shared lock page is reset by the first
                # process that opens the store alone (the rebuild did)
                continue
            with open(os.path.join(row["old_lsm"], name), "rb") as f:
                self.assertEqual(f.read(), data, name)
        test_rebuild.RebuildTest.assert_recovered(self, self.before,
                                                  Snapshot(self.dc))

    def test_lsm_and_index_lost(self):
        """LSM and index files lost: UIDs, GUIDs, dates, sizes and bytes
        come back; flags as they were saved; mail expunged since its
        save comes back until gc has dropped its recovery record."""
        uids = {box: sorted(self.before.msgs[box]) for box in
                ("INBOX", "Work")}
        structures = bodystructures(self.dc, uids)
        r, row = self.lose_lsm_and_index()
        self.assert_counts(row, 40 + 20 + 8)
        after = Snapshot(self.dc)
        # recovery records leave out the sealed BODYSTRUCTURE metadata:
        # the rebuilt messages parse their bytes and answer the same
        got = bodystructures(self.dc, uids)
        for key, bs in structures.items():
            self.assertEqual(got[key], bs, key)
        self.assertEqual(after.mailboxes, self.before.mailboxes)
        resurrected = {"INBOX": EXPUNGED_INBOX, "Work": EXPUNGED_WORK}
        for box in ("INBOX", "Work"):
            for key in ("guid", "uidvalidity", "uidnext"):
                self.assertEqual(after.status[box][key],
                                 self.before.status[box][key], (box, key))
            self.assertGreaterEqual(
                int(after.status[box]["highestmodseq"]),
                int(self.before.status[box]["highestmodseq"]))
            self.assertEqual(sorted(after.msgs[box]),
                             sorted(list(self.before.msgs[box]) +
                                    resurrected[box]), box)
            for uid, m in self.before.msgs[box].items():
                self.assertEqual(unchanged_fields(after.msgs[box][uid]),
                                 unchanged_fields(m), (box, uid))
        for key, body in self.before.bodies.items():
            self.assertEqual(after.bodies[key], body, key)
        # flags given at the save come back (APPEND), later changes not
        work = after.msgs["Work"]
        self.assertEqual(strip_recent(work[1]["flags"]), "$Label1 \\Flagged")
        self.assertEqual(strip_recent(work[3]["flags"]), "")
        self.assertNotIn("Todo", after.msgs["INBOX"][1]["flags"])
        self.assertIn("Todo", self.before.msgs["INBOX"][1]["flags"])

        # expunge them again and let gc drop their recovery records:
        # then a second loss brings back exactly the live mail
        for box, uids in resurrected.items():
            self.dc.doveadm("expunge", "-u", USER, "mailbox", box, "uid",
                            ",".join(str(u) for u in uids))
        gc = parse_tab(self.dc.doveadm("-f", "tab", "casbox", "gc", "-u",
                                       USER, "--all").stdout)[0]
        self.assertEqual(int(gc["recovery_dropped"]), NEXPUNGED, gc)
        self.assertEqual(int(gc["recovery_kept"]), 68 - NEXPUNGED, gc)
        # INBOX 3 has a copy (Work 23): its blobs' DEKs stay as blob keys
        self.assertGreaterEqual(int(gc["blob_keys_written"]), 1, gc)
        r, row = self.lose_lsm_and_index()
        self.assert_counts(row, 68 - NEXPUNGED)
        again = Snapshot(self.dc)
        for box in ("INBOX", "Work"):
            self.assertEqual(sorted(again.msgs[box]),
                             sorted(self.before.msgs[box]), box)
            for uid, m in self.before.msgs[box].items():
                self.assertEqual(unchanged_fields(again.msgs[box][uid]),
                                 unchanged_fields(m), (box, uid))
        self.assertEqual(again.bodies, self.before.bodies)

    def test_damaged_frame(self):
        """A flipped byte in one blob frame loses only the messages that
        use that blob; every other message comes back unchanged."""
        frames = [f for f in pack_frames(self.root) if f[2] == b"CBFR"]
        # a recovery record per saved message; the one COPY of 8
        # messages wrote one copy record, no blob keys yet
        self.assertEqual(len(recovery_records(self.root)), 40 + 20)
        self.assertEqual(len(meta_frames(self.root, 5)), 1)
        self.assertEqual(meta_frames(self.root, 4), [])
        path, off, _, size = frames[len(frames) // 2]
        with open(path, "r+b") as f:
            # into chunk 0: past the header of frame version 1 or 2
            f.seek(off + 4)
            pos = off + {1: 68, 2: 84}[f.read(1)[0]] + 5
            f.seek(pos)
            b = f.read(1)
            f.seek(pos)
            f.write(bytes([b[0] ^ 0x40]))
        shutil.rmtree(os.path.join(self.root, "lsm"))
        r, row = from_packs(self.dc)
        self.assertEqual(int(row["damaged_frames"]), 1, row)
        lost = int(row["lost_messages"])
        self.assertGreaterEqual(lost, 1, row)
        self.assertEqual(int(row["messages"]) + lost, 40 + 20 + 8, row)
        self.assertIn("lost: blob", r.stderr)
        after = Snapshot(self.dc)
        missing = 0
        for box in ("INBOX", "Work"):
            for uid, m in self.before.msgs[box].items():
                if uid not in after.msgs[box]:
                    missing += 1
                    continue
                self.assertEqual(after.durable(box)[uid],
                                 self.before.durable(box)[uid], (box, uid))
                self.assertEqual(after.bodies[(box, uid)],
                                 self.before.bodies[(box, uid)])
        self.assertGreaterEqual(missing, 1)
        self.assertLessEqual(missing, lost)

    def blob_users(self):
        """{(mailbox name, UID): blob ids of its parts and of their
        bases, transitively}, from tests/storage-dump."""
        dump = subprocess.run(
            [os.path.join(os.environ.get("CASBOX_TOP_BUILDDIR", "."),
                          "tests", "storage-dump"), self.root],
            user=self.dc.uid, group=self.dc.gid, capture_output=True,
            text=True, check=True).stdout
        names = dict(re.findall(r"^M (\S+) .*name=(.*)$", dump, re.M))
        bases = dict(re.findall(r"^d (\S+) base=(\S+)", dump, re.M))
        users = {}
        for guid, uid, blob in re.findall(r"^p (\S+) (\d+) (\S+)$", dump,
                                          re.M):
            ids = users.setdefault((names[guid], int(uid)), set())
            while blob is not None and blob not in ids:
                ids.add(blob)
                blob = bases.get(blob)
        return users

    def test_damaged_recovery_record(self):
        """A damaged recovery record of a message nothing copied: scrub
        names it; the rebuild loses that message and the messages whose
        blobs' DEKs only its record held (it wrote those blobs; they
        deduplicated onto them or were compressed against them), and
        nothing else. (`gc --all` after scrub writes those DEKs again
        from the LSM: test_gc_all_writes_missing_records. A copy's DEKs
        are in its source's record: test_copy_of_expunged_source.)"""
        users = self.blob_users()
        # INBOX UID 10 (the records are in save order)
        mine = users[("INBOX", 10)]
        sharing = {m for m, ids in users.items() if ids & mine}
        path, off, _, size = recovery_records(self.root)[9]
        with open(path, "r+b") as f:
            f.seek(off + 40)
            b = f.read(1)
            f.seek(off + 40)
            f.write(bytes([b[0] ^ 0x01]))
        r = self.dc.doveadm("-f", "tab", "casbox", "scrub", "-u", USER,
                            check=False)
        self.assertEqual(r.returncode, 65, r)
        rows = parse_tab(r.stdout)
        self.assertEqual([row["blob"] for row in rows],
                         ["%s@%d" % (path, off)], rows)
        shutil.rmtree(os.path.join(self.root, "lsm"))
        r, row = from_packs(self.dc)
        lost = {(box, int(uid)) for box, uid in re.findall(
            r"mailbox (\S+) uid (\d+) \(GUID [^)]*\) lost: ", r.stderr)}
        self.assertEqual(int(row["damaged_frames"]), 1, row)
        self.assertEqual(int(row["lost_messages"]), len(lost), row)
        self.assertEqual(int(row["messages"]), 68 - 1 - len(lost), row)
        self.assertLessEqual(lost, sharing - {("INBOX", 10)})
        after = Snapshot(self.dc)
        self.assertNotIn(10, after.msgs["INBOX"])
        for box in ("INBOX", "Work"):
            for uid, m in self.before.msgs[box].items():
                if (box, uid) == ("INBOX", 10) or (box, uid) in lost:
                    self.assertNotIn(uid, after.msgs[box])
                    continue
                self.assertEqual(after.durable(box)[uid],
                                 self.before.durable(box)[uid], (box, uid))
                self.assertEqual(after.bodies[(box, uid)],
                                 self.before.bodies[(box, uid)])

    def test_copy_of_expunged_source(self):
        """A copy's record in the packs holds no DEKs: they are in the
        source's recovery record. When the source is expunged, gc keeps
        them as blob keys; when the source's record is damaged as well,
        `gc --all` writes blob keys from the LSM. Either way the copy
        comes back from the packs, byte for byte."""
        # INBOX 1 and 2 were copied to Work 21 and 22
        self.dc.doveadm("expunge", "-u", USER, "mailbox", "INBOX", "uid",
                        "1,2")
        path, off, _, size = recovery_records(self.root)[1]
        with open(path, "r+b") as f:
            f.seek(off + 40)
            b = f.read(1)
            f.seek(off + 40)
            f.write(bytes([b[0] ^ 0x01]))
        gc = parse_tab(self.dc.doveadm("-f", "tab", "casbox", "gc", "-u",
                                       USER, "--all").stdout)[0]
        # INBOX 1's record dropped, its blobs kept for Work 21; INBOX 2's
        # unreadable (its pack stays), Work 22's blobs get keys from the
        # LSM
        self.assertGreaterEqual(int(gc["blob_keys_written"]), 2, gc)
        self.assertEqual(int(gc["recovery_written"]), 0, gc)
        after = self.assert_copies_back()
        self.assertNotIn(1, after.msgs["INBOX"])

    def test_copy_record_partly_expunged(self):
        """gc rewrites a copy record without the copies expunged since
        (its other messages stay recoverable), drops it with the last."""
        # Work 21..28 are the copies of INBOX 1..8, one copy record
        self.dc.doveadm("expunge", "-u", USER, "mailbox", "Work", "uid",
                        "22,25")
        gc = parse_tab(self.dc.doveadm("-f", "tab", "casbox", "gc", "-u",
                                       USER, "--all").stdout)[0]
        self.assertEqual(int(gc["recovery_dropped"]), NEXPUNGED + 2, gc)
        self.assertEqual(int(gc["recovery_kept"]), 68 - NEXPUNGED - 2, gc)
        copies = meta_frames(self.root, 5)
        self.assertEqual(len(copies), 1)
        r, row = self.lose_lsm_and_index()
        self.assert_counts(row, 68 - NEXPUNGED - 2)
        after = Snapshot(self.dc)
        self.assertEqual(sorted(after.msgs["Work"]),
                         sorted(set(self.before.msgs["Work"]) - {22, 25}))
        for uid in (21, 23, 24, 26, 27, 28):
            self.assertEqual(after.bodies[("Work", uid)],
                             self.before.bodies[("Work", uid)], uid)

        # all of them gone: no copy record left
        self.dc.doveadm("expunge", "-u", USER, "mailbox", "Work", "uid",
                        "21:28")
        gc = parse_tab(self.dc.doveadm("-f", "tab", "casbox", "gc", "-u",
                                       USER, "--all").stdout)[0]
        self.assertEqual(meta_frames(self.root, 5), [])

    def test_gc_all_writes_missing_records(self):
        """Live messages without an intact recovery record (damaged here;
        or saved before recovery records existed) get a new one from
        `gc --all`, so a later rebuild from the packs finds every one."""
        records = recovery_records(self.root)
        # INBOX UIDs 1, 2 and 6: live (3, 17 and 40 were expunged)
        for path, off, _, size in (records[0], records[1], records[5]):
            with open(path, "r+b") as f:
                f.seek(off + 30)
                b = f.read(1)
                f.seek(off + 30)
                f.write(bytes([b[0] ^ 0x02]))
        gc = parse_tab(self.dc.doveadm("-f", "tab", "casbox", "gc", "-u",
                                       USER, "--all").stdout)[0]
        self.assertEqual(int(gc["recovery_written"]), 3, gc)
        self.assertEqual(int(gc["recovery_dropped"]), NEXPUNGED, gc)
        self.assertEqual(int(gc["recovery_kept"]), 68 - NEXPUNGED - 3, gc)
        # a second gc --all finds every live message covered
        gc = parse_tab(self.dc.doveadm("-f", "tab", "casbox", "gc", "-u",
                                       USER, "--all").stdout)[0]
        self.assertEqual(int(gc["recovery_written"]), 0, gc)
        self.assertEqual(int(gc["recovery_kept"]), 68 - NEXPUNGED, gc)

        r, row = self.lose_lsm_and_index()
        self.assert_counts(row, 68 - NEXPUNGED)
        self.assertEqual(int(row["orphans"]), 0, row)
        after = Snapshot(self.dc)
        for box in ("INBOX", "Work"):
            self.assertEqual(sorted(after.msgs[box]),
                             sorted(self.before.msgs[box]), box)
            for uid, m in self.before.msgs[box].items():
                self.assertEqual(unchanged_fields(after.msgs[box][uid]),
                                 unchanged_fields(m), (box, uid))
        self.assertEqual(after.bodies, self.before.bodies)

    def flip(self, record, at=40):
        path, off, _, size = record
        with open(path, "r+b") as f:
            f.seek(off + at)
            b = f.read(1)
            f.seek(off + at)
            f.write(bytes([b[0] ^ 0x01]))
        return "%s@%d" % (path, off)

    def scrub_repair(self):
        r = self.dc.doveadm("-f", "tab", "casbox", "scrub", "-u", USER,
                            "--repair", check=False)
        self.assertEqual(r.returncode, 65, r)
        return parse_tab(r.stdout)

    def test_scrub_repair_writes_missing_record(self):
        """`scrub --repair` writes a damaged recovery record again from
        the LSM, appending to the packs instead of rewriting them as
        `gc --all` does: a rebuild from the packs then loses nothing
        (without it, test_damaged_recovery_record loses INBOX 10)."""
        packs = {p: os.path.getsize(p) for p in
                 glob.glob(os.path.join(self.root, "packs", "*.cbp"))}
        frame = self.flip(recovery_records(self.root)[9])
        rows = self.scrub_repair()
        self.assertEqual([(r["blob"], r["status"]) for r in rows
                          if r["status"] == "damaged"],
                         [(frame, "damaged")], rows)
        written = [(r["mailbox"], r["uid"]) for r in rows
                   if r["cause"] == "recovery record written to the packs"]
        self.assertEqual(written, [("INBOX", "10")], rows)
        # its new record holds the DEKs of every part: no blob keys
        self.assertEqual([r for r in rows if "blob keys" in r["cause"]],
                         [], rows)
        # appended, nothing rewritten: every pack is still there, with
        # its bytes up to the old size (the damaged frame included)
        for path, size in packs.items():
            self.assertGreaterEqual(os.path.getsize(path), size, path)
        # a second repair finds every live message covered
        rows = self.scrub_repair()
        self.assertEqual([r for r in rows if r["status"] == "repaired"],
                         [], rows)

        r, row = self.lose_lsm_and_index()
        self.assertEqual(int(row["damaged_frames"]), 1, row)
        self.assertEqual(int(row["lost_messages"]), 0, row)
        self.assertEqual(int(row["messages"]), 68, row)
        after = Snapshot(self.dc)
        self.assertEqual(unchanged_fields(after.msgs["INBOX"][10]),
                         unchanged_fields(self.before.msgs["INBOX"][10]))
        for key, body in self.before.bodies.items():
            self.assertEqual(after.bodies[key], body, key)

    def test_scrub_repair_writes_blob_keys(self):
        """A copy's blobs whose DEKs only its expunged source's (damaged)
        record held: `scrub --repair` writes them as blob keys and the
        copy comes back from the packs (as with gc --all in
        test_copy_of_expunged_source, without rewriting a pack)."""
        # INBOX 1 and 2 were copied to Work 21 and 22
        self.dc.doveadm("expunge", "-u", USER, "mailbox", "INBOX", "uid",
                        "1,2")
        frame = self.flip(recovery_records(self.root)[1])
        rows = self.scrub_repair()
        self.assertIn((frame, "damaged"),
                      [(r["blob"], r["status"]) for r in rows], rows)
        keys = [r["blob"] for r in rows
                if r["cause"] == "DEK written to the packs (blob keys)"]
        self.assertGreaterEqual(len(keys), 1, rows)
        self.assertEqual(len(keys), len(set(keys)), rows)
        # INBOX 2 is gone and Work 22 is in the copy record: no record
        self.assertEqual([r for r in rows if "recovery record" in
                          r["cause"]], [], rows)
        self.assertEqual(len(meta_frames(self.root, 4)), 1)
        self.assert_copies_back()

    def fetch(self, box):
        out = self.dc.doveadm("-f", "tab", "fetch", "-u", USER,
                              test_rebuild.FETCH, "mailbox", box,
                              "all").stdout
        return {int(m["uid"]): unchanged_fields(m) for m in parse_tab(out)}

    def status(self, box):
        return parse_tab(self.dc.doveadm(
            "-f", "tab", "mailbox", "status", "-u", USER,
            "guid uidvalidity messages", box).stdout)[0]

    def test_mailbox_changes(self):
        """Mailbox records: an empty mailbox comes back, a renamed one
        under its new name, a deleted one's mail does not."""
        dc = self.dc
        dc.doveadm("mailbox", "create", "-u", USER, "Empty", "Gone")
        imap = dc.imap_login(USER)
        try:
            for i in range(2):
                typ, resp = imap.append("Gone", None, None,
                                        b"Subject: gone %d\r\n\r\nx\r\n" % i)
                assert typ == "OK", resp
        finally:
            imap.logout()
        dc.doveadm("mailbox", "delete", "-u", USER, "Gone")
        dc.doveadm("mailbox", "rename", "-u", USER, "Work", "Done")
        before = {box: (self.status(box), self.fetch(box))
                  for box in ("INBOX", "Done", "Empty")}
        self.assertEqual(before["Done"][1].keys(),
                         self.before.msgs["Work"].keys())

        shutil.rmtree(os.path.join(self.root, "lsm"))
        for path in index_files(self.root):
            os.unlink(path)
        r, row = from_packs(dc)
        self.assertEqual(int(row["mailboxes"]), 3, row)
        self.assertEqual(int(row["deleted_mailboxes"]), 1, row)
        self.assertEqual(int(row["messages"]), 68, row)
        self.assertEqual(
            sorted(dc.doveadm("mailbox", "list", "-u", USER).stdout.split()),
            ["Done", "Empty", "INBOX"])
        for box, (status, msgs) in before.items():
            after = self.status(box)
            for key in ("guid", "uidvalidity"):
                self.assertEqual(after[key], status[key], (box, key))
            got = self.fetch(box)
            for uid, m in msgs.items():
                self.assertEqual(got[uid], m, (box, uid))
        self.assertEqual(self.status("Empty")["messages"], "0")

    def test_wrong_key_changes_nothing(self):
        """With another key no record opens: refused, LSM untouched."""
        key = os.path.join(self.dc.home(USER), "casbox.key")
        os.rename(key, key + ".real")
        with open(key + ".real", "rb") as f:
            real = f.read()
        lsm = os.path.join(self.root, "lsm")
        files = sorted(os.listdir(lsm))
        try:
            # a valid key file of another store
            with open(key, "wb") as f:
                f.write(other_key_file(real))
            # owner-only like the real one (others' access is refused)
            st = os.stat(key + ".real")
            os.chmod(key, 0o600)
            os.chown(key, st.st_uid, st.st_gid)
            r, row = from_packs(self.dc, check=False)
        finally:
            os.rename(key + ".real", key)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no recovery record opens", r.stderr)
        self.assertEqual(sorted(os.listdir(lsm)), files)
        self.assertEqual(glob.glob(os.path.join(self.root, "lsm.*")), [])


def other_key_file(real):
    """A well-formed key file (doc/casbox-format.md) with another KEK."""
    import hashlib
    body = real[:8] + bytes(range(32))
    return body + hashlib.blake2b(body, digest_size=32).digest()


if __name__ == "__main__":
    unittest.main()
