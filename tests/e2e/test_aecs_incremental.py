"""doveadm casbox aecs export, incremental and on bad input: a rerun
with no change writes nothing; new mail, flag and keyword changes,
copies, expunges (rows gone from every table, thread counts right), a
UIDVALIDITY change and a deleted mailbox; --blobs byte-exact; messages
without Message-ID or Date, duplicate Message-IDs, HTML-only, quoted-only,
empty, 8-bit headers, huge headers, broken MIME, S/MIME."""

import base64
import email
import email.policy
import hashlib
import json
import os
import re
import sqlite3
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, ok, corpus_files, load  # noqa: E402
import aecs_corpus  # noqa: E402
from aecs_corpus import message_id, sha256_hex  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
CONF = "lmtp_add_received_header = no\n"
DATE = '"14-Nov-2023 22:13:20 +0100"'
TABLES = ["aecs_messages", "aecs_bodies", "aecs_addresses",
          "aecs_references", "aecs_threads", "aecs_attachments",
          "casbox_aecs_source", "casbox_aecs_cursor"]


def export(dc, db, *extra):
    """Run the export; {mailbox: (exported, updated, removed)}."""
    out = dc.doveadm("-f", "tab", "casbox", "aecs", "export", "-u",
                     "user1", "--db", db, *extra).stdout
    res = {}
    for line in out.strip().split("\n")[1:]:
        f = line.split("\t")
        res[f[1]] = tuple(int(x) for x in f[2:5])
    return res


def snapshot(db_path):
    """Every row of every table (processed_at left out)."""
    db = sqlite3.connect(db_path)
    try:
        out = {}
        for t in TABLES:
            cols = [c[1] for c in db.execute("PRAGMA table_info(%s)" % t)
                    if c[1] != "processed_at"]
            out[t] = sorted(db.execute("SELECT %s FROM %s" % (
                ", ".join(cols), t)).fetchall(), key=repr)
        out["aecs_search"] = sorted(db.execute(
            "SELECT message_key, subject, body FROM aecs_search"))
        return out
    finally:
        db.close()


def q(db_path, sql, args=()):
    db = sqlite3.connect(db_path)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def consistent(test, db_path):
    """Thread rows agree with the messages; no orphans."""
    test.assertEqual(q(db_path, """
        SELECT COUNT(*) FROM aecs_threads t WHERE message_count !=
        (SELECT COUNT(*) FROM aecs_messages m
         WHERE m.thread_key = t.thread_key) OR message_count = 0""")[0][0],
        0)
    for t in ("aecs_bodies", "aecs_addresses", "aecs_references",
              "aecs_attachments", "casbox_aecs_source"):
        test.assertEqual(q(db_path, "SELECT COUNT(*) FROM %s x WHERE NOT "
                           "EXISTS (SELECT 1 FROM aecs_messages m WHERE "
                           "m.message_key = x.message_key)" % t)[0][0],
                         0, t)
    test.assertEqual(q(db_path, "SELECT COUNT(*) FROM aecs_search WHERE "
                       "rowid NOT IN (SELECT rowid FROM aecs_messages)")
                     [0][0], 0)


def locations(db_path, key):
    x = q(db_path, "SELECT x_fields FROM aecs_messages WHERE "
          "message_key = ?", (key,))[0][0]
    return json.loads(x)["x_dovecot"]["locations"]


def with_attachment(paths):
    for path in paths:
        with open(path, "rb") as f:
            raw = f.read()
        msg = email.message_from_bytes(raw, policy=email.policy.compat32)
        parts = [p for p in msg.walk() if not p.is_multipart() and
                 p.get_filename() and p.get("Content-Transfer-Encoding",
                                            "").lower() == "base64"]
        if parts:
            return path
    raise AssertionError("no attachment in the corpus sample")


class AecsIncrementalTest(unittest.TestCase):

    def test_incremental(self):
        usrp = corpus_files("usrp-users-3000", limit=40)
        att_path = with_attachment(corpus_files("usrp-users-3000")[40:400])
        threads = [p for p in corpus_files("notmuch")
                   if "threading_" in p]
        with Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=["casbox"], plugin_settings=KEYS,
                     extra_conf=CONF) as dc:
            aecs_corpus.fill(dc, {"list": usrp + [att_path],
                                  "threads": threads})
            out = aecs_corpus.db_dir(dc)
            db = os.path.join(out, "x.sqlite")
            blobs = os.path.join(out, "blobs")
            res = export(dc, db, "--blobs", blobs)
            n = q(db, "SELECT COUNT(*) FROM aecs_messages")[0][0]
            self.assertEqual(sum(r[0] for r in res.values()), n)
            consistent(self, db)

            # twice with no change: nothing written, not even a byte
            before, snap = sha(db), snapshot(db)
            res = export(dc, db, "--blobs", blobs)
            self.assertEqual(set(res.values()), {(0, 0, 0)})
            self.assertEqual(sha(db), before)

            # --blobs: raw.eml is the message's bytes (as delivered),
            # attachments are the decoded part bytes
            imap = dc.imap_login("user1")
            ok(imap.select("list"))
            body = load([att_path])[0]
            key = sha256_hex(message_id(body))
            prefix = q(db, "SELECT blob_prefix FROM aecs_messages WHERE "
                       "message_key = ?", (key,))[0][0]
            self.assertEqual(prefix, "%s/%s/" % (blobs, key))
            with open(prefix + "raw.eml", "rb") as f:
                self.assertEqual(f.read(), body)
            msg = email.message_from_bytes(body,
                                           policy=email.policy.compat32)
            parts = [p for p in aecs_corpus.leaf_parts(msg)
                     if p.get_filename()]
            atts = q(db, "SELECT idx, filename, blob_key, size FROM "
                     "aecs_attachments WHERE message_key = ? AND "
                     "filename != '' ORDER BY idx", (key,))
            self.assertEqual(len(atts), len(parts))
            for part, (idx, filename, blob_key, size) in zip(parts, atts):
                self.assertEqual(blob_key, "%satt/%d" % (prefix, idx))
                with open(blob_key, "rb") as f:
                    data = f.read()
                self.assertEqual(len(data), size)
                if part.get("Content-Transfer-Encoding", "").lower() == \
                        "base64":
                    self.assertEqual(data, part.get_payload(decode=True))
            self.assertEqual(os.stat(prefix + "raw.eml").st_mode & 0o077, 0)

            # a new message, a reply to a list message: joins its thread
            parent_id = message_id(load(usrp[:1])[0])
            parent_thread = q(db, "SELECT thread_key FROM aecs_messages "
                              "WHERE message_id = ?", (parent_id,))[0][0]
            count = q(db, "SELECT message_count FROM aecs_threads WHERE "
                      "thread_key = ?", (parent_thread,))[0][0]
            reply = ("From: Replier <R@Example.COM>\r\nTo: x@example.com\r\n"
                     "Subject: Re: it\r\nMessage-ID: <new1@test>\r\n"
                     "In-Reply-To: <%s>\r\nDate: Tue, 1 Dec 2026 10:00:00 "
                     "+0000\r\n\r\nI agree.\r\n\r\n> quoted\r\n"
                     % parent_id).encode()
            dc.lmtp_deliver("user1", reply)
            res = export(dc, db, "--blobs", blobs)
            self.assertEqual(res["INBOX"], (1, 0, 0))
            self.assertEqual(res["list"], (0, 0, 0))
            row = q(db, "SELECT thread_key, from_email, in_reply_to FROM "
                    "aecs_messages WHERE message_id = 'new1@test'")[0]
            self.assertEqual(row, (parent_thread, "r@example.com",
                                   parent_id))
            self.assertEqual(q(db, "SELECT message_count FROM aecs_threads "
                               "WHERE thread_key = ?", (parent_thread,))
                             [0][0], count + 1)
            self.assertEqual(q(db, "SELECT clean FROM aecs_bodies b JOIN "
                               "aecs_messages m USING (message_key) WHERE "
                               "m.message_id = 'new1@test'")[0][0],
                             "I agree.")

            # flags and keywords: only x_fields changes
            snap = snapshot(db)
            ok(imap.uid("STORE", "1", "+FLAGS", r"(\Flagged $Work)"))
            res = export(dc, db, "--blobs", blobs)
            self.assertEqual(res["list"], (0, 1, 0))
            k1 = sha256_hex(parent_id)
            loc = locations(db, k1)
            self.assertEqual(len(loc), 1)
            self.assertEqual(loc[0]["flags"], ["\\Flagged"])
            self.assertEqual(loc[0]["keywords"], ["$Work"])
            self.assertEqual((loc[0]["mailbox"], loc[0]["uid"]), ("list", 1))
            snap2 = snapshot(db)
            for t in TABLES + ["aecs_search"]:
                if t not in ("aecs_messages", "casbox_aecs_source",
                             "casbox_aecs_cursor"):
                    self.assertEqual(snap2[t], snap[t], t)
            self.assertEqual(len(snap2["aecs_messages"]),
                             len(snap["aecs_messages"]))

            # a copy: the same row, two locations
            ok(imap.create("copyto"))
            ok(imap.uid("COPY", "2", "copyto"))
            k2 = sha256_hex(message_id(load(usrp[1:2])[0]))
            n = q(db, "SELECT COUNT(*) FROM aecs_messages")[0][0]
            res = export(dc, db, "--blobs", blobs)
            self.assertEqual(res["copyto"], (0, 0, 0))
            self.assertEqual(q(db, "SELECT COUNT(*) FROM aecs_messages")
                             [0][0], n)
            self.assertEqual(sorted(loc["mailbox"] for loc in
                                    locations(db, k2)), ["copyto", "list"])

            # expunge one location: the row stays; the other: gone
            ok(imap.uid("STORE", "2", "+FLAGS", r"(\Deleted)"))
            ok(imap.expunge())
            res = export(dc, db, "--blobs", blobs)
            self.assertEqual(res["list"], (0, 0, 1))
            self.assertEqual([loc["mailbox"] for loc in locations(db, k2)],
                             ["copyto"])
            t2 = q(db, "SELECT thread_key FROM aecs_messages WHERE "
                   "message_key = ?", (k2,))[0][0]
            tcount = q(db, "SELECT message_count FROM aecs_threads WHERE "
                       "thread_key = ?", (t2,))[0][0]
            ok(imap.select("copyto"))
            ok(imap.uid("STORE", "1", "+FLAGS", r"(\Deleted)"))
            ok(imap.expunge())
            res = export(dc, db, "--blobs", blobs)
            self.assertEqual(res["copyto"], (0, 0, 1))
            for t in ("aecs_messages", "aecs_bodies", "aecs_addresses",
                      "aecs_references", "aecs_attachments",
                      "casbox_aecs_source"):
                self.assertEqual(q(db, "SELECT COUNT(*) FROM %s WHERE "
                                   "message_key = ?" % t, (k2,))[0][0], 0, t)
            left = q(db, "SELECT message_count FROM aecs_threads WHERE "
                     "thread_key = ?", (t2,))
            self.assertEqual(left, [(tcount - 1,)] if tcount > 1 else [])
            self.assertFalse(os.path.exists(os.path.join(blobs, k2)))
            consistent(self, db)

            # UIDVALIDITY change: the mailbox is exported again from
            # scratch and gives the same rows
            snap = snapshot(db)
            imap.logout()
            dc.doveadm("mailbox", "update", "-u", "user1", "--uid-validity",
                       "12345", "threads")
            res = export(dc, db, "--blobs", blobs)
            self.assertEqual(res["threads"], (len(threads), 0,
                                              len(threads)))
            snap2 = snapshot(db)
            for t in ("aecs_bodies", "aecs_addresses", "aecs_references",
                      "aecs_threads", "aecs_attachments"):
                self.assertEqual(snap2[t], snap[t], t)
            self.assertEqual(set(r[0] for r in q(db, "SELECT uidvalidity "
                                                 "FROM casbox_aecs_source "
                                                 "WHERE mailbox = "
                                                 "'threads'")), {12345})
            consistent(self, db)

            # a deleted mailbox: its messages go, its cursor too
            dc.doveadm("mailbox", "delete", "-u", "user1", "copyto")
            res = export(dc, db, "--blobs", blobs)
            self.assertEqual(res["copyto"], (0, 0, 0))
            self.assertEqual(q(db, "SELECT COUNT(*) FROM casbox_aecs_cursor "
                               "WHERE mailbox = 'copyto'")[0][0], 0)
            self.assertEqual(set(export(dc, db, "--blobs", blobs).values()),
                             {(0, 0, 0)})

    def test_bad_input(self):
        huge = [p for p in corpus_files("mime-edge")
                if len(aecs_corpus.first_header(load([p])[0], b"to")
                       or b"") > 100000]
        html = ("From: h@example.com\r\nSubject: html\r\nMessage-ID: "
                "<html@test>\r\nContent-Type: text/html; charset=utf-8\r\n"
                "\r\n<html><body><p>Hello <b>world</b> &amp; "
                "caf\xc3\xa9</p></body></html>\r\n")
        edge = [
            b"From: a@example.com\r\nSubject: no id no date\r\n\r\nBody\r\n",
            b"From: a@example.com\r\nSubject: bad date\r\nDate: not a "
            b"date\r\nMessage-ID: <baddate@test>\r\n\r\nBody\r\n",
            b"From: a@example.com\r\nSubject: first\r\nMessage-ID: "
            b"<dup@test>\r\n\r\nFirst body\r\n",
            b"From: b@example.com\r\nSubject: second\r\nMessage-ID: "
            b"<dup@test>\r\n\r\nSecond, longer body\r\n",
            html.encode("latin-1"),
            b"From: q@example.com\r\nSubject: quoted\r\nMessage-ID: "
            b"<quoted@test>\r\n\r\n> all\r\n> quoted\r\n",
            b"From: e@example.com\r\nSubject: empty\r\nMessage-ID: "
            b"<empty@test>\r\n\r\n",
            b"From: =?utf-8?q?J=C3=BCrgen?= <j@example.com>\r\nSubject: "
            b"caf\xe9 8bit\r\nMessage-ID: <8bit@test>\r\n\r\nBody\r\n",
            b"From: m@example.com\r\nSubject: broken mime\r\nMessage-ID: "
            b"<mime@test>\r\nMIME-Version: 1.0\r\nContent-Type: "
            b"multipart/mixed; boundary=\"zz\"\r\n\r\n--zz\r\nContent-Type: "
            b"text/plain\r\n\r\nvisible text\r\n--zz\r\nContent-Type: "
            b"application/octet-stream\r\nContent-Transfer-Encoding: "
            b"base64\r\n\r\n!!!not base64\r\n",
            b"From: s@example.com\r\nSubject: smime\r\nMessage-ID: "
            b"<smime@test>\r\nMIME-Version: 1.0\r\nContent-Type: "
            b"application/pkcs7-mime; smime-type=enveloped-data; "
            b"name=smime.p7m\r\nContent-Transfer-Encoding: base64\r\n"
            b"Content-Disposition: attachment; filename=smime.p7m\r\n\r\n"
            + base64.encodebytes(bytes(range(256))).replace(b"\n", b"\r\n"),
        ]
        self.assertEqual(len(huge), 1)
        with Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=["casbox"], plugin_settings=KEYS,
                     extra_conf=CONF) as dc:
            imap = dc.imap_login("user1")
            ok(imap.create("edge"))
            t0 = int(time.time()) * 1000
            for msg in edge + load(huge):
                ok(imap.append("edge", None, None, msg))
            t1 = (int(time.time()) + 1) * 1000
            imap.logout()
            db = os.path.join(aecs_corpus.db_dir(dc), "edge.sqlite")
            res = export(dc, db)
            # one row less than messages: the duplicate Message-ID
            self.assertEqual(res["edge"], (len(edge), 0, 0))

            def row(mid, cols):
                r = q(db, "SELECT %s FROM aecs_messages m JOIN aecs_bodies "
                      "b USING (mailbox_id, message_key) WHERE "
                      "m.message_id = ?" % cols, (mid,))
                self.assertEqual(len(r), 1, mid)
                return r[0]

            # no Message-ID, no Date: synthetic id, ts = save date
            (mid, date, ts), = q(db, "SELECT message_id, date, ts FROM "
                                 "aecs_messages WHERE subject = "
                                 "'no id no date'")
            # of the bytes as stored: mail_save_crlf = no saves LF
            self.assertEqual(mid, "aecs-%s@synthetic.invalid" %
                             hashlib.sha256(aecs_corpus.stored(edge[0]))
                             .hexdigest()[:32])
            self.assertIsNone(date)
            self.assertTrue(t0 <= ts <= t1, (t0, ts, t1))
            self.assertIsNone(row("baddate@test", "date")[0])
            # duplicate Message-ID: the first one stays, both are
            # locations (with their sizes)
            self.assertEqual(row("dup@test", "subject, text"),
                             ("first", "First body\n"))
            locs = locations(db, sha256_hex("dup@test"))
            self.assertEqual([loc["size"] for loc in locs],
                             [len(aecs_corpus.stored(m)) for m in edge[2:4]])
            # HTML only: the text is the HTML's text (HTML whitespace
            # is not significant)
            text, = row("html@test", "text")
            self.assertEqual(" ".join(text.split()), "Hello world & café")
            self.assertNotIn("<", text)
            self.assertEqual(row("quoted@test", "clean, clean_fallback"),
                             ("> all\n> quoted", 1))
            self.assertEqual(row("empty@test", "text, clean, "
                                 "clean_fallback, forai"),
                             ("", "", 0, "From: e@example.com | "
                              "Subject: empty"))
            subject, name = row("8bit@test", "subject, from_name")
            self.assertEqual(subject, "caf\ufffd 8bit")
            self.assertEqual(name, "Jürgen")
            self.assertEqual(row("mime@test", "text")[0], "visible text")
            self.assertEqual(q(db, "SELECT content_type, filename FROM "
                               "aecs_attachments a JOIN aecs_messages m "
                               "USING (message_key) WHERE m.message_id = "
                               "'mime@test'"),
                             [("application/octet-stream", "")])
            self.assertEqual(q(db, "SELECT content_type, filename, size "
                               "FROM aecs_attachments a JOIN aecs_messages "
                               "m USING (message_key) WHERE m.message_id = "
                               "'smime@test'"),
                             [("application/pkcs7-mime", "smime.p7m", 256)])
            self.assertEqual(row("smime@test", "text")[0], "")
            # the huge (133 KB) To: header: its one address; the rest
            # is a display name of encoded-words without an addr-spec
            raw = load(huge)[0]
            header = aecs_corpus.first_header(raw, b"to")
            want = set(a.decode().lower() for a in re.findall(
                rb"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+", header))
            self.assertEqual(want, {"test@test.com"})
            got = set(e for (e,) in q(db, "SELECT email FROM aecs_addresses "
                                      "a JOIN aecs_messages m USING "
                                      "(message_key) WHERE m.message_id = ? "
                                      "AND role = 'to'", (message_id(raw),)))
            self.assertEqual(got, want)
            # every row is valid (the forai bound holds, text is UTF-8)
            for (forai,) in q(db, "SELECT forai FROM aecs_messages"):
                self.assertLessEqual(len(forai), 4000)
            consistent(self, db)

    def test_usage_errors(self):
        with Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=["casbox"], plugin_settings=KEYS) as dc:
            r = dc.doveadm("casbox", "aecs", "export", "-u", "user1",
                           check=False)
            self.assertEqual(r.returncode, 64)
            self.assertIn("--db", r.stderr)
            r = dc.doveadm("casbox", "aecs", "export", "-A", "--db",
                           "/tmp/never.sqlite", "--mailbox-id", "x",
                           check=False)
            self.assertEqual(r.returncode, 64)
            self.assertIn("--mailbox-id is for one user", r.stderr)
            self.assertFalse(os.path.exists("/tmp/never.sqlite"))
            r = dc.doveadm("casbox", "aecs", "query", "--db",
                           "/nonexistent.sqlite", "search", "x", "1",
                           check=False)
            self.assertNotEqual(r.returncode, 0)
            db = os.path.join(aecs_corpus.db_dir(dc), "u.sqlite")
            export(dc, db)
            r = dc.doveadm("casbox", "aecs", "query", "--db", db, "nope",
                           check=False)
            self.assertEqual(r.returncode, 64)
            self.assertIn("unknown query", r.stderr)
            r = dc.doveadm("casbox", "aecs", "query", "--db", db,
                           "--mailbox-id", "user1", "search", "x",
                           check=False)
            self.assertEqual(r.returncode, 64)
            self.assertIn("takes 2 argument", r.stderr)


if __name__ == "__main__":
    unittest.main()
