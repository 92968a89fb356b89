"""Sealed packs in object storage (doc/casbox-storage.md "Packs in object
storage"): the cases every backend must pass, run by test_objstore_dir.py
(a directory standing in for the store: runs everywhere, also in the
Dovecot 2.4 pass), test_objstore_rados.py (a real Ceph cluster) and
test_objstore_s3.py (radosgw).

A backend class provides:
    spec()                 the casbox_pack_storage value
    remote_packs()         {pack id: bytes} of the objects of USER
    break_store()          make the store fail (unreachable)
    heal_store()           undo break_store()
    truncate_object(id, n) cut an object to n bytes (partial upload)

The oracle is the bytes we APPEND (crlf()): every FETCH must return
exactly them, from local packs, from the object store through a cold
cache and through a warm one."""

import base64
import glob
import imaplib
import os
import random
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (Dovecot, crlf, corpus_files,  # noqa: E402
                             ensure_test_user)
from test_rebuild import parse_tab, strip_recent  # noqa: E402

USER = "user1"
KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
UPLOAD_WARNING = r"uploading sealed packs of .* failed"
UPLOADED = r"casbox: \d+ sealed pack\(s\) of .* in object storage"
TEMP_ERROR = (r"reading pack \d+ from object storage failed \(temporary")


def make_messages(seed, count, big=400 * 1024):
    """count messages: every third a ~big random (incompressible) one, so
    1 MiB packs rotate, the others small corpus or generated text."""
    rnd = random.Random(seed)
    corpus = [p for p in corpus_files("usrp-users-3000", limit=40, step=7)]
    out = []
    for i in range(count):
        if i % 3 == 0:
            raw = rnd.getrandbits(big * 6).to_bytes(big * 6 // 8, "little")
            b64 = base64.b64encode(raw).decode()
            body = "\n".join(b64[j:j + 76] for j in range(0, len(b64), 76))
            msg = ("From: a@example.com\nTo: b@example.com\n"
                   "Subject: big %d\nMessage-ID: <big%d.%d@x>\n\n%s\n"
                   % (i, seed, i, body)).encode()
        elif corpus and i % 3 == 1:
            with open(corpus[i % len(corpus)], "rb") as f:
                msg = f.read()
        else:
            msg = ("Subject: small %d\nMessage-ID: <s%d.%d@x>\n\nhello %d "
                   "%s\n" % (i, seed, i, i, "w" * rnd.randint(1, 3000))
                   ).encode()
        out.append(crlf(msg))
    return out


class ObjstoreCases:
    """Mixin for unittest.TestCase."""

    maxDiff = None

    def start(self, **extra):
        settings = dict(KEYS)
        settings.update({
            "casbox_pack_size": "1M",
            "casbox_pack_storage": self.spec(),
            "casbox_pack_cache_size": "64M",
        })
        settings.update(extra)
        self.dc = Dovecot(mail_location="casbox:~/casbox",
                          mail_plugins=["casbox"], plugin_settings=settings,
                          extra_conf=getattr(self, "dovecot_conf", ""))
        self.dc.__enter__()
        self.root = os.path.join(self.dc.home(USER), "casbox")
        self.packs_dir = os.path.join(self.root, "packs")

    def stop(self):
        if getattr(self, "dc", None) is not None:
            self.dc.__exit__(None, None, None)
            self.dc = None

    # -- helpers ----------------------------------------------------------
    def append(self, msgs, box="INBOX", upload=False):
        """APPEND msgs; upload: they fill more than a pack, so the IMAP
        process uploads the sealed ones when it closes the store, after
        its LOGOUT reply: wait for its log line."""
        before = self.uploads_logged()
        imap = self.dc.imap_login(USER)
        try:
            if box != "INBOX":
                imap.create(box)
            for i, m in enumerate(msgs):
                flags = "(\\Flagged)" if i % 5 == 0 else None
                typ, resp = imap.append(box, flags, None, m)
                self.assertEqual(typ, "OK", resp)
        finally:
            imap.logout()
        if upload:
            self.assertGreater(self.dc.wait_log_count(UPLOADED, before + 1),
                               before)

    def uploads_logged(self):
        return sum(1 for line in self.dc.log_lines()
                   if re.search(UPLOADED, line))

    def fetch(self, box="INBOX", expect_ok=True):
        """{uid: BODY[]} (expect_ok) or the tagged response text."""
        imap = self.dc.imap_login(USER)
        try:
            imap.select(box, readonly=True)
            typ, data = imap.uid("FETCH", "1:*", "(BODY.PEEK[])")
        except Exception as e:  # imaplib raises on NO
            return str(e)
        finally:
            try:
                imap.logout()
            except Exception:
                pass
        if typ != "OK":
            return " ".join(str(d) for d in data)
        out = {}
        for item in data:
            if isinstance(item, tuple):
                uid = int(re.search(rb"UID (\d+)", item[0]).group(1))
                out[uid] = item[1]
        return out

    def fetch_one(self, uid, section="BODY.PEEK[]"):
        """(typ, data); a failure that Dovecot 2.3 answers with BYE
        (any mail error but expunged/invalid data) is ("BYE", text)."""
        imap = self.dc.imap_login(USER)
        try:
            imap.select("INBOX", readonly=True)
            typ, data = imap.uid("FETCH", str(uid), "(%s)" % section)
        except imaplib.IMAP4.abort as e:
            return "BYE", str(e)
        try:
            imap.logout()
        except imaplib.IMAP4.abort:
            pass
        return typ, data

    def assert_bytes(self, msgs, got):
        self.assertIsInstance(got, dict, got)
        self.assertEqual(sorted(got), list(range(1, len(msgs) + 1)))
        for uid, m in enumerate(msgs, 1):
            self.assertEqual(got[uid], m, uid)

    def local(self, ext):
        return sorted(int(os.path.basename(p)[5:13]) for p in
                      glob.glob(os.path.join(self.packs_dir, "pack-*." + ext)))

    def drop_cache(self):
        shutil.rmtree(os.path.join(self.packs_dir, "cache"),
                      ignore_errors=True)

    def doveadm_upload(self, *args, env=None, check=True, opts=()):
        cmd = self.dc.doveadm_command(*opts, "-f", "tab", "casbox",
                                      "upload", "-u", USER, *args)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, **(env or {})))
        if check:
            self.assertEqual(r.returncode, 0, r.stderr)
            return parse_tab(r.stdout)[0]
        return r

    def assert_sealed_uploaded(self):
        """Every sealed pack is a stub here and an object there, only the
        newest pack is a local file, and the object is the pack's bytes
        (checked by size here; bytes through FETCH)."""
        cbp, cbr, remote = self.local("cbp"), self.local("cbr"), \
            self.remote_packs()
        self.assertEqual(len(cbp), 1, (cbp, cbr))
        self.assertGreaterEqual(len(cbr), 1, cbr)
        self.assertLess(max(cbr), cbp[0])
        self.assertEqual(sorted(remote), cbr)
        for pid in cbr:
            with open(os.path.join(self.packs_dir,
                                   "pack-%08u.cbr" % pid), "rb") as f:
                stub = f.read()
            self.assertEqual(stub[:8], b"CASBREMT")
            self.assertEqual(int.from_bytes(stub[16:24], "little"),
                             len(remote[pid]), pid)
            # sealed packs are encrypted frames: no plaintext leaves
            self.assertEqual(remote[pid][:8], b"CASBPACK")

    # -- the cases --------------------------------------------------------
    def case_upload_read_gc_scrub(self):
        msgs = make_messages(1, 24)
        self.append(msgs, upload=True)
        self.assert_sealed_uploaded()
        for v in self.remote_packs().values():
            self.assertNotIn(b"Subject: big", v)
        # cold cache, then warm
        self.drop_cache()
        self.assert_bytes(msgs, self.fetch())
        self.assert_bytes(msgs, self.fetch())
        # a ranged read: one small message from a cold cache fetches
        # blocks, not its whole pack
        self.drop_cache()
        typ, data = self.fetch_one(2)
        self.assertEqual(typ, "OK")
        self.assertEqual(data[0][1], msgs[1])
        cached = sum(os.stat(p).st_blocks * 512 for p in glob.glob(
            os.path.join(self.packs_dir, "cache", "*.data")))
        self.assertGreater(cached, 0)
        self.assertLess(cached, 1024 * 1024)
        # scrub reads every remote frame (keyless) and finds nothing
        r = self.dc.doveadm("casbox", "scrub", "-u", USER)
        self.assertNotIn("damaged", r.stdout + r.stderr)
        stats = parse_tab(self.dc.doveadm("-f", "tab", "casbox", "stats",
                                          "-u", USER).stdout)[0]
        self.assertEqual(int(stats["messages"]), len(msgs))
        self.assertGreaterEqual(int(stats["packs"]), 3)
        # gc: expunge most big messages, then gc --all rewrites the
        # remote packs' live blobs locally and deletes their objects
        before = set(self.remote_packs())
        gone = [u for u in range(1, len(msgs) + 1) if u % 3 == 1]
        self.dc.doveadm("expunge", "-u", USER, "mailbox", "INBOX", "uid",
                        ",".join(map(str, gone)))
        gc = parse_tab(self.dc.doveadm("-f", "tab", "casbox", "gc", "-u",
                                       USER, "--all").stdout)[0]
        self.assertGreater(int(gc["packs_deleted"]), 0, gc)
        self.doveadm_upload()
        after = set(self.remote_packs())
        self.assertTrue(before - after, (before, after))
        self.assertEqual(sorted(after), self.local("cbr"))
        self.drop_cache()
        got = self.fetch()
        self.assertEqual(sorted(got), [u for u in range(1, len(msgs) + 1)
                                       if u not in gone])
        for uid, body in got.items():
            self.assertEqual(body, msgs[uid - 1], uid)
        self.dc.doveadm("casbox", "scrub", "-u", USER)
        # key rotation: --finish rewrites every pack (gc --all) under
        # fresh DEKs and the new key epoch, remote ones included: their
        # objects are gone, the mail reads as before
        self.doveadm_upload("-s")
        before_objects = self.remote_packs()
        self.assertTrue(before_objects)
        self.dc.doveadm("casbox", "key", "rotate", "-u", USER)
        rot = parse_tab(self.dc.doveadm("-f", "tab", "casbox", "key",
                                        "rotate", "--finish", "-u",
                                        USER).stdout)[0]
        self.assertEqual(rot["result"], "rotated", rot)
        self.assertFalse(set(self.remote_packs()) & set(before_objects))
        self.doveadm_upload()
        self.drop_cache()
        got = self.fetch()
        self.assertEqual(sorted(got), [u for u in range(1, len(msgs) + 1)
                                       if u not in gone])
        for uid, body in got.items():
            self.assertEqual(body, msgs[uid - 1], uid)
        self.dc.doveadm("casbox", "scrub", "-u", USER)

    def case_store_unreachable(self):
        msgs = make_messages(2, 15)
        self.append(msgs, upload=True)
        self.assert_sealed_uploaded()
        self.break_store()
        self.dc.allow_log(TEMP_ERROR)
        self.drop_cache()
        # cold read: a clear temporary NO, never wrong bytes
        typ, data = self.fetch_one(1)
        self.assertNotEqual(typ, "OK", data)
        self.assertIn("object storage, which is unavailable now "
                      "(temporary failure", str(data))
        # deliveries keep working locally while it is down
        more = make_messages(3, 9)
        for m in more:
            self.dc.lmtp_deliver(USER, m)
        self.assertGreaterEqual(len(self.local("cbp")), 2)
        self.assertTrue(os.path.exists(os.path.join(self.packs_dir,
                                                    "upload.retry")))
        self.assertRegex(self.dc.log_text(), UPLOAD_WARNING)
        r = self.doveadm_upload(check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("the packs stay local", r.stderr)
        # back: reads recover, the backlog uploads
        self.heal_store()
        typ, data = self.fetch_one(1)
        self.assertEqual(typ, "OK")
        self.assertEqual(data[0][1], msgs[0])
        row = self.doveadm_upload()
        self.assertGreaterEqual(int(row["uploaded_packs"]), 1, row)
        self.assertEqual(int(row["local_packs"]), 1, row)
        self.drop_cache()
        got = self.fetch()
        self.assertEqual(len(got), len(msgs) + len(more))
        for uid, m in enumerate(msgs, 1):
            self.assertEqual(got[uid], m, uid)
        for i, m in enumerate(more):
            self.assertTrue(got[len(msgs) + 1 + i].endswith(m))

    def case_kill_during_upload(self):
        """kill -9 right after put, verify and stub: the pack stays
        readable (from one side) and the next run finishes the job."""
        msgs = make_messages(4, 6)
        # uploads only when asked: the backoff file of a failure
        # suppresses automatic attempts, so create one
        # the store and its key come with a first message; then an
        # upload.retry far in the future keeps the mail processes from
        # uploading on their own (only doveadm upload, which ignores it)
        self.append(make_messages(40, 1), box="First")
        retry = os.path.join(self.packs_dir, "upload.retry")
        for step in ("put", "verify", "stub"):
            with open(retry, "w") as f:
                f.write("x" * 30)
            os.utime(retry, (2 ** 31 - 10, 2 ** 31 - 10))
            self.append(msgs, box="Box-" + step)
            # -s seals the pack this round wrote to: the lowest local
            # pack is the first one uploaded
            pid = self.local("cbp")[0]
            # doveadm keeps only the environment DOVECOT_PRESERVE_ENVS
            # names
            r = self.doveadm_upload("-s", check=False, env={
                "CASBOX_TEST_UPLOAD_KILL": step,
                "DOVECOT_PRESERVE_ENVS": "CASBOX_TEST_UPLOAD_KILL"})
            self.assertEqual(r.returncode, -9, (step, r.stderr))
            has_cbp = os.path.exists(os.path.join(
                self.packs_dir, "pack-%08u.cbp" % pid))
            has_cbr = os.path.exists(os.path.join(
                self.packs_dir, "pack-%08u.cbr" % pid))
            self.assertTrue(has_cbp, step)       # unlinked only at step 4
            self.assertEqual(has_cbr, step == "stub", step)
            self.assertIn(pid, self.remote_packs())
            self.drop_cache()
            got = self.fetch("Box-" + step)
            self.assert_bytes(msgs, got)
            row = self.doveadm_upload()
            self.assertEqual(int(row["local_packs"]), 1, (step, row))
            self.drop_cache()
            self.assert_bytes(msgs, self.fetch("Box-" + step))
        self.dc.doveadm("casbox", "scrub", "-u", USER)

    def case_partial_object(self):
        """An object cut short (a partial upload, or damage there): the
        upload of a pack replaces it, and a read of a cut object fails
        clearly, never with wrong bytes."""
        msgs = make_messages(5, 15)
        self.append(msgs, upload=True)
        self.assert_sealed_uploaded()
        pid = self.local("cbr")[0]
        self.truncate_object(pid, 4096)
        self.dc.allow_log(r"object is \d+ bytes, the uploaded pack was")
        self.drop_cache()
        failed = 0
        for uid in range(1, len(msgs) + 1):
            typ, data = self.fetch_one(uid)
            if typ == "OK":
                self.assertEqual(data[0][1], msgs[uid - 1], uid)
            else:
                failed += 1
        # the messages of the cut pack fail, the others read; none
        # returns different bytes
        self.assertGreater(failed, 0)
        self.assertLess(failed, len(msgs))
        self.assertRegex(self.dc.log_text(),
                         r"object is \d+ bytes, the uploaded pack was")

    def case_disaster_recovery(self):
        """The whole local casbox root is lost: a new server with only
        the key file and the object store brings every message back."""
        msgs = make_messages(6, 21)
        self.append(msgs, upload=True)
        self.append(msgs[:6], box="Work")
        imap = self.dc.imap_login(USER)
        imap.select("INBOX")
        imap.uid("STORE", "2:4", "+FLAGS", "(\\Seen)")
        imap.logout()
        self.dc.lmtp_deliver(USER, msgs[1])
        # a rotated key: the recovery needs the DEK updates, which are
        # in the packs too
        self.dc.doveadm("casbox", "key", "rotate", "-u", USER)
        rot = parse_tab(self.dc.doveadm("-f", "tab", "casbox", "key",
                                        "rotate", "--finish", "-u",
                                        USER).stdout)[0]
        self.assertEqual(rot["result"], "rotated", rot)
        row = self.doveadm_upload("-s")
        self.assertEqual(int(row["local_packs"]), 1, row)
        before = {}
        for box in ("INBOX", "Work"):
            out = self.dc.doveadm(
                "-f", "tab", "fetch", "-u", USER,
                "uid guid date.received date.saved size.physical flags",
                "mailbox", box, "all").stdout
            before[box] = {int(m["uid"]): m for m in parse_tab(out)}
        bodies = {box: self.fetch(box) for box in ("INBOX", "Work")}
        self.assertEqual(len(bodies["INBOX"]), len(msgs) + 1)
        key = os.path.join(self.dc.home(USER), "casbox.key")
        with open(key, "rb") as f:
            key_bytes = f.read()
        st = os.stat(key)
        self.stop()
        # a brand-new server (a fresh instance, its own empty home) with
        # only the key file and the object store
        self.start()
        home = self.dc.home(USER)
        os.makedirs(home, exist_ok=True)
        os.chown(home, st.st_uid, st.st_gid)
        key = os.path.join(home, "casbox.key")
        with open(key, "wb") as f:
            f.write(key_bytes)
        os.chown(key, st.st_uid, st.st_gid)
        os.chmod(key, 0o600)
        self.assertEqual(os.listdir(home), ["casbox.key"])
        r = self.dc.doveadm("-f", "tab", "casbox", "rebuild",
                            "--from-packs", "-u", USER)
        self.assertIn("found only in object storage", r.stderr)
        row = parse_tab(r.stdout)[0]
        self.assertEqual(int(row["lost_messages"]), 0, row)
        self.assertEqual(int(row["damaged_frames"]), 0, row)
        for box in ("INBOX", "Work"):
            self.assertEqual(self.fetch(box), bodies[box], box)
            out = self.dc.doveadm(
                "-f", "tab", "fetch", "-u", USER,
                "uid guid date.received date.saved size.physical flags",
                "mailbox", box, "all").stdout
            after = {int(m["uid"]): m for m in parse_tab(out)}
            self.assertEqual(sorted(after), sorted(before[box]))
            for uid, m in before[box].items():
                a = dict(after[uid])
                b = dict(m)
                # flags come back as saved (APPEND), later STOREs not
                # (doc/casbox-storage.md, "Rebuild from the packs")
                a["flags"] = strip_recent(a["flags"]).replace("\\Seen", "")
                b["flags"] = strip_recent(b["flags"]).replace("\\Seen", "")
                self.assertEqual(a, b, (box, uid))
        # the recovered store goes on: new mail lands in a new pack,
        # never in (or over) one that is in the object store
        self.dc.lmtp_deliver(USER, msgs[2])
        self.assertGreater(self.local("cbp")[-1], max(self.local("cbr")))
        self.dc.doveadm("casbox", "scrub", "-u", USER)
