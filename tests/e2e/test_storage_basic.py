"""casbox in a stock Dovecot: mailbox list operations, an empty SELECT/
STATUS, APPEND and LMTP saves read back byte-exact, flags, copy, move,
expunge, and the key-file rules."""

import base64
import imaplib
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, ok, crlf  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}


def storage_dump(dc):
    """Records of user1's store and the refcount audit (tests/storage-dump
    run as the mail user, so nothing in the store becomes root's)."""
    exe = os.path.join(os.environ.get("CASBOX_TOP_BUILDDIR", "."),
                       "tests", "storage-dump")
    root = os.path.join(dc.home("user1"), "casbox")
    return subprocess.run([exe, root], user=dc.uid, group=dc.gid,
                          capture_output=True, text=True)


def mailbox_names(imap):
    names = set()
    for line in ok(imap.list()):
        m = re.match(rb'\(.*?\) "/" "?(.*?)"?$', line)
        names.add(m.group(1).decode())
    return names


def fetch_one(imap, uid, item):
    data = ok(imap.uid("FETCH", str(uid), "(%s)" % item))
    for entry in data:
        if isinstance(entry, tuple):
            return entry[0], entry[1]
    return data[0], None


MSG1 = (b"From: alice@example.com\r\nTo: bob@example.com\r\n"
        b"Subject: casbox basic one\r\nMessage-ID: <one@example.com>\r\n"
        b"\r\nHello casbox.\r\nSecond line.\r\n")
MSG2 = (b"From: carol@example.com\nSubject: lf only\n\nbody with LF only\n"
        b"and more\n")


class StorageBasicTest(unittest.TestCase):

    def test_mailbox_operations(self):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            imap = dc.imap_login("user1")
            data = ok(imap.select("INBOX"))
            self.assertEqual(data, [b"0"])
            uidv = imap.response("UIDVALIDITY")[1][0]
            self.assertTrue(int(uidv) > 0)
            ok(imap.create("Work"))
            ok(imap.create("Work/Sub"))
            self.assertEqual(mailbox_names(imap),
                             {"INBOX", "Work", "Work/Sub"})
            st = ok(imap.status("Work", "(MESSAGES UIDNEXT UIDVALIDITY)"))
            self.assertIn(b"MESSAGES 0", st[0])
            self.assertIn(b"UIDNEXT 1", st[0])
            ok(imap.rename("Work/Sub", "Other"))
            self.assertEqual(mailbox_names(imap), {"INBOX", "Work", "Other"})
            ok(imap.delete("Other"))
            self.assertEqual(mailbox_names(imap), {"INBOX", "Work"})
            imap.logout()
            r = dc.doveadm("mailbox", "status", "-u", "user1", "guid",
                           "INBOX")
            self.assertRegex(r.stdout, r"guid=[0-9a-f]{32}")
            # sdbox-like layout, no message files
            root = os.path.join(dc.home("user1"), "casbox")
            self.assertTrue(os.path.exists(os.path.join(
                root, "mailboxes", "INBOX", "casbox-Mails",
                "dovecot.index.log")))

    def test_save_fetch_flags_copy_expunge(self):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            dc.lmtp_deliver("user1", MSG1)
            imap = dc.imap_login("user1")
            ok(imap.append("INBOX", r"(\Flagged $Label1)",
                           '"14-Nov-2023 22:13:20 +0000"', MSG2))
            ok(imap.select("INBOX"))
            _, lmtp_body = fetch_one(imap, 1, "BODY.PEEK[]")
            # LMTP prepends Return-Path and Delivered-To
            self.assertTrue(lmtp_body.startswith(b"Return-Path: "))
            self.assertTrue(lmtp_body.endswith(crlf(MSG1)))
            _, body = fetch_one(imap, 2, "BODY.PEEK[]")
            self.assertEqual(body, crlf(MSG2))
            meta, _ = fetch_one(imap, 2, "RFC822.SIZE INTERNALDATE FLAGS")
            self.assertIn(b"RFC822.SIZE %d" % len(crlf(MSG2)), meta)
            self.assertIn(b'"14-Nov-2023 22:13:20 +0000"', meta)
            self.assertIn(b"\\Flagged", meta)
            self.assertIn(b"$Label1", meta)
            _, part = fetch_one(imap, 1, "BODY.PEEK[TEXT]<6.6>")
            self.assertEqual(part, b"casbox")

            ok(imap.create("Archive"))
            ok(imap.uid("COPY", "1:2", "Archive"))
            ok(imap.uid("MOVE", "1", "Archive"))
            ok(imap.uid("STORE", "2", "+FLAGS", r"(\Deleted)"))
            ok(imap.expunge())
            self.assertEqual(ok(imap.select("INBOX")), [b"0"])
            self.assertEqual(ok(imap.select("Archive")), [b"3"])
            uids = ok(imap.uid("SEARCH", "ALL"))[0].split()
            bodies = [fetch_one(imap, int(u), "BODY.PEEK[]")[1]
                      for u in uids]
            self.assertEqual(sorted(bodies),
                             sorted([lmtp_body, lmtp_body, crlf(MSG2)]))
            imap.logout()

            # GUIDs survive copy, dsync sees them
            r = dc.doveadm("fetch", "-u", "user1", "guid", "mailbox",
                           "Archive", "all")
            guids = re.findall(r"guid: (\S+)", r.stdout)
            self.assertEqual(len(guids), 3)
            self.assertEqual(len(set(guids)), 2)

            # flag changes reach the records' durable mirror
            imap = dc.imap_login("user1")
            ok(imap.select("Archive"))
            ok(imap.uid("STORE", "1:*", "FLAGS", r"(\Answered Custom1)"))
            ok(imap.noop())
            imap.logout()
            d = storage_dump(dc)
            self.assertEqual(d.returncode, 0, d.stdout + d.stderr)
            recs = [ln for ln in d.stdout.splitlines()
                    if ln.startswith("m ")]
            self.assertEqual(len(recs), 3)
            for ln in recs:
                self.assertIn("flags=1 ", ln)   # MAIL_ANSWERED
                self.assertIn("keywords=Custom1,", ln)

            # deleting a mailbox with messages releases its records
            imap = dc.imap_login("user1")
            ok(imap.create("Temp"))
            ok(imap.select("Archive"))
            ok(imap.uid("COPY", "1:*", "Temp"))
            ok(imap.close())
            ok(imap.delete("Temp"))
            imap.logout()
            d = storage_dump(dc)
            self.assertEqual(d.returncode, 0, d.stdout + d.stderr)
            self.assertEqual(len([ln for ln in d.stdout.splitlines()
                                  if ln.startswith("m ")]), 3)

            # expunging everything releases every record and blob
            r = dc.doveadm("expunge", "-u", "user1", "mailbox", "Archive",
                           "all")
            r = dc.doveadm("mailbox", "status", "-u", "user1", "messages",
                           "Archive")
            self.assertIn("messages=0", r.stdout)
            d = storage_dump(dc)
            self.assertEqual(d.returncode, 0, d.stdout + d.stderr)
            self.assertNotIn("\nm ", "\n" + d.stdout)
            self.assertNotIn("\nb ", "\n" + d.stdout)
            # the mailbox record keeps UIDs from ever being reused
            self.assertRegex(d.stdout, r"(?m)^M [0-9a-f]{32} uidvalidity=\d+ "
                             r"next_uid=4 name=Archive$")

    def test_missing_key_with_data_is_refused(self):
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            dc.lmtp_deliver("user1", MSG1)
            key = os.path.join(dc.home("user1"), "casbox.key")
            self.assertTrue(os.path.exists(key))
            os.rename(key, key + ".moved")
            dc.allow_log(r"casbox: .*key file .* does not exist, but the store")
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            # Dovecot answers an internal FETCH error with BYE
            with self.assertRaises((imaplib.IMAP4.abort,
                                    imaplib.IMAP4.error)):
                typ, data = imap.uid("FETCH", "1", "(BODY.PEEK[])")
                if typ != "OK":
                    raise imaplib.IMAP4.error(data)
            self.assertFalse(os.path.exists(key))
            os.rename(key + ".moved", key)
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            _, body = fetch_one(imap, 1, "BODY.PEEK[]")
            self.assertTrue(body.endswith(crlf(MSG1)))
            imap.logout()

    def test_lsm_wal_size(self):
        """casbox_lsm_wal_size bounds the WAL every new session replays:
        past it the WAL becomes a table, and every message stays."""
        limit = 64 * 1024
        settings = dict(KEYS, casbox_lsm_wal_size="64k")
        msgs = [MSG1.replace(b"casbox basic one", b"wal %d" % i) +
                b"x" * 2000 + b"\r\n" for i in range(150)]
        with Dovecot(plugin_settings=settings) as dc:
            lsm = os.path.join(dc.home("user1"), "casbox", "lsm")
            biggest = 0
            for i in range(0, len(msgs), 10):
                dc.lmtp_deliver_many("user1", msgs[i:i + 10])
                wal = sum(os.path.getsize(os.path.join(lsm, n))
                          for n in os.listdir(lsm) if n.endswith(".wal"))
                biggest = max(biggest, wal)
            tables = [n for n in os.listdir(lsm) if n.endswith(".sst")]
            self.assertTrue(tables, os.listdir(lsm))
            # one delivery's batch may pass the limit before the flush
            self.assertLess(biggest, limit + 16 * 1024)
            imap = dc.imap_login("user1")
            self.assertEqual(int(ok(imap.select("INBOX"))[0]), len(msgs))
            for uid in (1, 75, 150):
                _, body = fetch_one(imap, uid, "BODY.PEEK[]")
                # LMTP adds Return-Path and Delivered-To on top
                self.assertTrue(body.endswith(crlf(msgs[uid - 1])), uid)
            imap.logout()

        with Dovecot(plugin_settings=dict(KEYS,
                                          casbox_lsm_wal_size="8k")) as dc:
            dc.allow_log(r"casbox_lsm_wal_size")
            res = dc.doveadm("mailbox", "list", "-u", "user1", check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("casbox_lsm_wal_size", res.stdout + res.stderr)


    def test_cache_size_settings(self):
        """casbox_lsm_cache_size and casbox_base_cache_size bound per-process
        caches: mail works at their minimum, and a value below it is a
        clear error naming the setting."""
        settings = dict(KEYS, casbox_lsm_cache_size="64k",
                        casbox_base_cache_size="64k")
        msgs = [MSG1.replace(b"casbox basic one", b"cache %d" % i)
                for i in range(2)]
        with Dovecot(plugin_settings=settings) as dc:
            dc.lmtp_deliver_many("user1", msgs)
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            ok(imap.uid("COPY", "1:2", "INBOX"))
            for uid, msg in zip((1, 2, 3, 4), msgs + msgs):
                _, body = fetch_one(imap, uid, "BODY.PEEK[]")
                self.assertTrue(body.endswith(crlf(msg)), uid)
            imap.logout()
        for name in ("casbox_lsm_cache_size", "casbox_base_cache_size"):
            with Dovecot(plugin_settings=dict(KEYS, **{name: "32k"})) as dc:
                dc.allow_log(name)
                res = dc.doveadm("mailbox", "list", "-u", "user1",
                                 check=False)
                self.assertNotEqual(res.returncode, 0)
                self.assertIn(name + ": must be at least",
                              res.stdout + res.stderr)

    def test_huge_header_parameter(self):
        """A 9 MB Content-Type parameter appears in both BODYSTRUCTURE and
        BODY: their sealed copy would pass the LSM's 16 MiB value limit,
        which aborted the LMTP process (and every retry of the
        delivery). Such a message is saved without sealed metadata and
        reads parse it, like any other message without one."""
        name = b"n" * (9 * 1024 * 1024)
        msg = (b"From: alice@example.com\r\nSubject: big parameter\r\n"
               b"Content-Type: text/plain; name=\"" + name + b"\"\r\n"
               b"\r\nsmall body\r\n")
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            dc.lmtp_deliver("user1", msg)
            imap = dc.imap_login("user1")
            ok(imap.select("INBOX"))
            _, body = fetch_one(imap, 1, "BODY.PEEK[]")
            self.assertTrue(body.endswith(msg))
            # BODYSTRUCTURE is one line of over 9 MB: more than imaplib
            # reads by default
            maxline = imaplib._MAXLINE
            imaplib._MAXLINE = 64 * 1024 * 1024
            try:
                data = ok(imap.uid("FETCH", "1", "(BODYSTRUCTURE)"))
            finally:
                imaplib._MAXLINE = maxline
            answer = b"".join(b"".join(x) if isinstance(x, tuple) else x
                              for x in data)
            self.assertIn(b'"name" "' + name + b'"', answer)
            # the record is rewritten by a flag change and a copy
            ok(imap.uid("STORE", "1", "+FLAGS", r"(\Seen)"))
            ok(imap.uid("COPY", "1", "INBOX"))
            _, body = fetch_one(imap, 2, "BODY.PEEK[]")
            self.assertTrue(body.endswith(msg))
            imap.logout()

    def test_transactions_past_one_lsm_batch(self):
        """One LSM commit holds at most 256 MiB. When every message
        record carried its own sealed BODYSTRUCTURE, BODY and ENVELOPE,
        "mark all read" or a COPY of some 80,000 mails failed with "batch
        too large"; such transactions now commit in pieces, and the
        metadata is shared by copies and compressed. 300 mails with a
        470 kB header parameter each (random base64, so it does not
        compress: ~350 kB of sealed metadata per message) are flagged
        and copied: everything is copied and flagged, durably (the
        records say so) and with right refcounts (storage-dump audits
        them)."""
        count = 300
        with Dovecot(mail_location="casbox:~/casbox", mail_plugins=["casbox"],
                     plugin_settings=KEYS) as dc:
            msgs = []
            for i in range(count):
                name = b"%05d" % i + base64.b64encode(
                    os.urandom(360 * 1024))[:470 * 1024]
                msgs.append(b"From: alice@example.com\r\nSubject: m%d\r\n"
                            b"Content-Type: text/plain; name=\"%s\"\r\n"
                            b"\r\nbody %d\r\n" % (i, name, i))
            dc.lmtp_deliver_many("user1", msgs)
            imap = dc.imap_login("user1")
            ok(imap.create("Copy"))
            ok(imap.select("INBOX"))
            ok(imap.uid("STORE", "1:*", "+FLAGS.SILENT", r"(\Seen)"))
            ok(imap.uid("COPY", "1:*", "Copy"))
            ok(imap.select("Copy"))
            typ, data = imap.uid("SEARCH", "SEEN")
            self.assertEqual(len(data[0].split()), count)
            for uid in (1, count // 2, count):
                _, body = fetch_one(imap, uid, "BODY.PEEK[]")
                self.assertTrue(body.endswith(msgs[uid - 1]), uid)
            imap.logout()
            d = storage_dump(dc)
            self.assertEqual(d.returncode, 0, d.stdout + d.stderr)
            recs = [ln for ln in d.stdout.splitlines()
                    if ln.startswith("m ")]
            self.assertEqual(len(recs), 2 * count)
            for ln in recs:
                self.assertIn("flags=8 ", ln)   # MAIL_SEEN
                # the copies got the sealed metadata too (~350 kB each)
                meta = int(re.search(r" meta=(\d+) ", ln).group(1))
                self.assertGreater(meta, 300 * 1024, ln)
            # deleting the copy expunges 300 MB of records
            imap = dc.imap_login("user1")
            ok(imap.delete("Copy"))
            imap.logout()
            d = storage_dump(dc)
            self.assertEqual(d.returncode, 0, d.stdout + d.stderr)
            self.assertEqual(len([ln for ln in d.stdout.splitlines()
                                  if ln.startswith("m ")]), count)


if __name__ == "__main__":
    unittest.main()
