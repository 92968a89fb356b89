"""doveadm casbox aecs export of the whole shared corpus (every folder)
from casbox: row counts against the messages, fields against Python's
own reading of the corpus bytes, threads against the References graph
and against Dovecot's THREAD REFS, every named query (plan and answer),
the FTS5 search, and the --sql file loaded by the sqlite3 CLI equal to
the --db file row for row."""

import email
import hashlib
import email.policy
import email.utils
import json
import os
import re
import sqlite3
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, ok, TOP_SRCDIR  # noqa: E402
import aecs_corpus  # noqa: E402
from aecs_corpus import message_id, sha256_hex, linked_ids  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
TOPS = ["spamassassin", "usrp-users-3000", "notmuch", "mime-edge"]
QUERIES = os.path.join(TOP_SRCDIR, "src", "aecs", "sql",
                       "sqlite-queries.sql")
SYNTHETIC_RE = re.compile(r"^aecs-[0-9a-f]{32}@synthetic\.invalid$")


def named_queries():
    """{name: sql} of sqlite-queries.sql, comment lines left out."""
    with open(QUERIES) as f:
        text = f.read()
    parts = re.split(r"^-- name: (\S+)\n", text, flags=re.M)[1:]
    return {name: "\n".join(ln for ln in body.splitlines()
                            if not ln.startswith("--")).strip()
            for name, body in zip(parts[::2], parts[1::2])}


def rows(db, sql, args=()):
    return db.execute(sql, args).fetchall()


def components(links):
    """Connected components of {node: [nodes]} (union-find)."""
    parent = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for a, bs in links.items():
        for b in bs:
            parent[find(a)] = find(b)
        find(a)
    return find


class AecsExportCorpusTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dc = Dovecot(mail_location="casbox:~/casbox",
                         mail_plugins=["casbox"], plugin_settings=KEYS)
        cls.dc.start()
        try:
            cls.loaded = aecs_corpus.fill(
                cls.dc, aecs_corpus.corpus_folders(TOPS))
            out = aecs_corpus.db_dir(cls.dc)
            cls.db_path = os.path.join(out, "export.sqlite")
            cls.sql_path = os.path.join(out, "export.sql")
            cls.export_out = cls.dc.doveadm(
                "-f", "tab", "casbox", "aecs", "export", "-u", "user1",
                "--db", cls.db_path).stdout
            cls.dc.doveadm("casbox", "aecs", "export", "-u", "user1",
                           "--sql", cls.sql_path)
            cls.db = sqlite3.connect(cls.db_path)
        except BaseException:
            cls.dc.__exit__(*sys.exc_info())
            raise

    @classmethod
    def tearDownClass(cls):
        cls.db.close()
        cls.dc.__exit__(None, None, None)

    def all_messages(self):
        for box, msgs in self.loaded.items():
            for uid, raw in enumerate(msgs, 1):
                yield box, uid, raw

    def key_of(self, box, uid):
        return rows(self.db, "SELECT message_key FROM casbox_aecs_source "
                    "WHERE mailbox_id = 'user1' AND mailbox = ? "
                    "AND uid = ?", (box, uid))[0][0]

    def test_row_counts(self):
        total = sum(len(m) for m in self.loaded.values())
        self.assertGreater(total, 9000)
        with_id, without_id = set(), set()
        for _, _, raw in self.all_messages():
            mid = message_id(raw)
            (with_id.add(mid) if mid is not None else without_id.add(raw))
        count = rows(self.db, "SELECT COUNT(*) FROM aecs_messages")[0][0]
        # one row per Message-ID; a message without one is its bytes
        self.assertEqual(count, len(with_id) + len(without_id))
        for table in ("aecs_bodies", "aecs_search"):
            self.assertEqual(rows(self.db, "SELECT COUNT(*) FROM " + table)
                             [0][0], count, table)
        # every message of every folder is a location of one row
        self.assertEqual(rows(self.db, "SELECT COUNT(*) FROM "
                              "casbox_aecs_source")[0][0], total)
        for box, msgs in self.loaded.items():
            self.assertEqual(rows(self.db, "SELECT COUNT(*) FROM "
                                  "casbox_aecs_source WHERE mailbox = ?",
                                  (box,))[0][0], len(msgs), box)
        # the printed counters add up
        exported = sum(int(ln.split("\t")[2])
                       for ln in self.export_out.strip().split("\n")[1:])
        self.assertEqual(exported, count)
        # threads count their messages
        self.assertEqual(rows(self.db, "SELECT SUM(message_count) FROM "
                              "aecs_threads")[0][0], count)
        bad = rows(self.db, """
            SELECT t.thread_key FROM aecs_threads t
            WHERE message_count != (SELECT COUNT(*) FROM aecs_messages m
                                    WHERE m.mailbox_id = t.mailbox_id
                                    AND m.thread_key = t.thread_key)
               OR first_ts != (SELECT MIN(ts) FROM aecs_messages m
                               WHERE m.mailbox_id = t.mailbox_id
                                    AND m.thread_key = t.thread_key)
               OR last_ts != (SELECT MAX(ts) FROM aecs_messages m
                              WHERE m.mailbox_id = t.mailbox_id
                                    AND m.thread_key = t.thread_key)""")
        self.assertEqual(bad, [])
        self.assertEqual(rows(self.db, """
            SELECT COUNT(*) FROM aecs_messages m WHERE attachment_count !=
            (SELECT COUNT(*) FROM aecs_attachments a
             WHERE a.mailbox_id = m.mailbox_id
               AND a.message_key = m.message_key)""")[0][0], 0)
        # addresses carry their message's ts and thread
        self.assertEqual(rows(self.db, """
            SELECT COUNT(*) FROM aecs_addresses a JOIN aecs_messages m
            USING (mailbox_id, message_key)
            WHERE a.ts != m.ts OR a.thread_key != m.thread_key""")[0][0], 0)

    def test_keys_and_ids(self):
        want, synthetic = set(), 0
        for _, _, raw in self.all_messages():
            mid = message_id(raw)
            if mid is not None:
                want.add(mid)
        got = rows(self.db, "SELECT message_key, message_id, thread_key, "
                   "thread_id, spec_version, processed_at FROM "
                   "aecs_messages")
        for key, mid, tkey, tid, spec, processed in got:
            self.assertEqual(key, sha256_hex(mid))
            self.assertEqual(tkey, sha256_hex(tid))
            self.assertEqual(spec, "casbox-aecs-1")
            self.assertRegex(processed,
                             r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
            if SYNTHETIC_RE.match(mid):
                synthetic += 1
        self.assertEqual(set(m for _, m, *_ in got
                             if not SYNTHETIC_RE.match(m)), want)
        self.assertEqual(synthetic, len(got) - len(want))
        self.assertGreater(synthetic, 30)

    def test_synthetic_id_is_the_bytes(self):
        """A message without Message-ID: the id is the SHA-256 of its
        bytes as stored (the corpus file with LF line ends)."""
        n = 0
        for box, uid, raw in self.all_messages():
            if message_id(raw) is not None:
                continue
            want = "aecs-%s@synthetic.invalid" % \
                hashlib.sha256(aecs_corpus.stored(raw)).hexdigest()[:32]
            got = rows(self.db, "SELECT message_id FROM casbox_aecs_source "
                       "JOIN aecs_messages USING (mailbox_id, message_key) "
                       "WHERE mailbox_id = 'user1' AND mailbox = ? "
                    "AND uid = ?", (box, uid))
            self.assertEqual(got, [(want,)], (box, uid))
            n += 1
        self.assertGreater(n, 30)

    def test_fields_of_list_mail(self):
        """usrp-users: well-formed list mail, read with Python's email."""
        checked = 0
        for uid, raw in enumerate(self.loaded["usrp-users-3000"], 1):
            msg = email.message_from_bytes(raw, policy=email.policy.compat32)
            key = self.key_of("usrp-users-3000", uid)
            (mid, from_email, from_name, ts, date, in_reply_to,
             size) = rows(self.db, "SELECT message_id, from_email, "
                          "from_name, ts, date, in_reply_to, size_bytes "
                          "FROM aecs_messages WHERE mailbox_id = 'user1' AND "
                          "message_key = ?",
                          (key,))[0]
            if mid != message_id(raw):
                continue        # a duplicate Message-ID: first one won
            checked += 1
            name, addr = email.utils.parseaddr(msg["From"])
            self.assertEqual(from_email, addr.lower(), uid)
            dt = email.utils.parsedate_to_datetime(msg["Date"])
            self.assertEqual(ts, int(dt.timestamp()) * 1000, uid)
            self.assertEqual(date[:19], dt.strftime("%Y-%m-%dT%H:%M:%S"))
            refs = [r for (r,) in rows(self.db, "SELECT ref_id FROM "
                                       "aecs_references WHERE "
                                       "mailbox_id = 'user1' AND "
                                       "message_key = ? ORDER BY position",
                                       (key,))]
            self.assertEqual(refs, linked_ids(raw, b"references"), uid)
            irt = linked_ids(raw, b"in-reply-to")
            self.assertEqual(in_reply_to, irt[0] if irt else None, uid)
            for role in ("to", "cc"):
                want = set(a.lower() for _, a in email.utils.getaddresses(
                    msg.get_all(role, [])) if "@" in a)
                got = set(e for (e,) in rows(self.db, "SELECT email FROM "
                                             "aecs_addresses WHERE "
                                             "mailbox_id = 'user1' AND "
                                             "message_key = ? AND role = ?",
                                             (key, role)))
                self.assertEqual(got, want, (uid, role))
            self.assertGreaterEqual(size, len(raw) - raw.count(b"\n"))
        self.assertGreater(checked, 2900)

    def test_attachments_of_list_mail(self):
        """Attachments in MIME order, with the decoded sizes Python's
        email gives for base64 parts."""
        seen = 0
        for uid, raw in enumerate(self.loaded["usrp-users-3000"], 1):
            msg = email.message_from_bytes(raw, policy=email.policy.compat32)
            key = self.key_of("usrp-users-3000", uid)
            if rows(self.db, "SELECT message_id FROM aecs_messages WHERE "
                    "mailbox_id = 'user1' AND "
                    "message_key = ?", (key,))[0][0] != message_id(raw):
                continue
            want = [p for p in aecs_corpus.leaf_parts(msg)
                    if p.get_filename() is not None]
            got = rows(self.db, "SELECT idx, attachment_id, filename, "
                       "content_type, size FROM aecs_attachments WHERE "
                       "mailbox_id = 'user1' AND "
                       "message_key = ? AND filename != '' ORDER BY idx",
                       (key,))
            self.assertEqual(len(got), len(want), uid)
            for part, (idx, att_id, filename, ctype, size) in zip(want, got):
                seen += 1
                self.assertEqual(att_id, "%s:%d" % (message_id(raw), idx))
                self.assertEqual(ctype, part.get_content_type())
                if part.get("Content-Transfer-Encoding", "").lower() == \
                        "base64":
                    self.assertEqual(size, len(part.get_payload(
                        decode=True)), (uid, filename))
        self.assertGreater(seen, 200)

    def test_text_of_plain_mail(self):
        """A single-part text/plain message: text is its decoded body."""
        checked = 0
        for uid, raw in enumerate(self.loaded["usrp-users-3000"], 1):
            msg = email.message_from_bytes(raw, policy=email.policy.compat32)
            if msg.is_multipart() or msg.get_content_type() != "text/plain":
                continue
            key = self.key_of("usrp-users-3000", uid)
            if rows(self.db, "SELECT message_id FROM aecs_messages WHERE "
                    "mailbox_id = 'user1' AND "
                    "message_key = ?", (key,))[0][0] != message_id(raw):
                continue
            charset = msg.get_content_charset() or "us-ascii"
            try:
                want = msg.get_payload(decode=True).decode(charset)
            except (LookupError, UnicodeDecodeError):
                continue
            want = want.replace("\r\n", "\n").replace("\r", "\n")
            text, clean = rows(self.db, "SELECT text, clean FROM "
                               "aecs_bodies WHERE mailbox_id = 'user1' AND "
                               "message_key = ?",
                               (key,))[0]
            self.assertEqual(text.rstrip("\n"), want.rstrip("\n"), uid)
            # clean leaves out the quoted lines and keeps the rest
            for line in clean.split("\n"):
                self.assertFalse(line.lstrip().startswith(">"), uid)
            checked += 1
        self.assertGreater(checked, 100)

    def test_x_fields(self):
        for box, uid, raw in list(self.all_messages())[::500]:
            key = self.key_of(box, uid)
            x = json.loads(rows(self.db, "SELECT x_fields FROM "
                                "aecs_messages WHERE mailbox_id = 'user1' AND "
                                "message_key = ?",
                                (key,))[0][0])
            locs = x["x_dovecot"]["locations"]
            self.assertIn((box, uid),
                          [(loc["mailbox"], loc["uid"]) for loc in locs])
            for loc in locs:
                self.assertGreater(loc["uidvalidity"], 0)
                self.assertEqual(loc["flags"], [])
                self.assertTrue(loc["guid"])

    def test_query_plans(self):
        """Every read uses an index; none scans aecs_messages (a SCAN
        only over a subquery or the FTS5 table)."""
        n = 0
        for name, sql in named_queries().items():
            if not sql.upper().startswith("SELECT"):
                continue
            n += 1
            plan = subprocess.run(
                ["sqlite3", self.db_path, "EXPLAIN QUERY PLAN " +
                 re.sub(r"\?\d+", "NULL", sql)],
                capture_output=True, text=True, check=True).stdout
            self.assertIn("SEARCH", plan, name)
            for line in plan.splitlines():
                m = re.search(r"SCAN (.*)", line)
                if m:
                    self.assertTrue(m.group(1) == "m" or
                                    "VIRTUAL TABLE" in m.group(1),
                                    (name, line))
        self.assertEqual(n, 9)

    def query(self, *args):
        """doveadm casbox aecs query ... as a list of dicts (json)."""
        out = self.dc.doveadm("-f", "json", "casbox", "aecs", "query",
                              "--db", self.db_path, *args).stdout
        return json.loads(out)

    def same_as_sqlite(self, name, args, got):
        sql = named_queries()[name]
        cur = self.db.execute(sql, ("user1",) + tuple(args))
        cols = [d[0] for d in cur.description]
        want = [{c: "" if v is None else str(v) for c, v in zip(cols, r)}
                for r in cur.fetchall()]
        self.assertEqual(got, want, name)
        return want

    def test_named_queries(self):
        newest = rows(self.db, "SELECT ts, message_key FROM aecs_messages "
                      "ORDER BY ts DESC, message_key DESC LIMIT 20")
        page1 = self.query("inbox_first_page", "10")
        self.same_as_sqlite("inbox_first_page", (10,), page1)
        self.assertEqual([p["message_key"] for p in page1],
                         [k for _, k in newest[:10]])
        last = page1[-1]
        page2 = self.query("inbox_next_page", last["ts"],
                           last["message_key"], "10")
        self.assertEqual([p["message_key"] for p in page2],
                         [k for _, k in newest[10:20]])

        (tkey, count), = rows(self.db, "SELECT thread_key, message_count "
                              "FROM aecs_threads ORDER BY message_count "
                              "DESC, thread_key LIMIT 1")
        self.assertGreater(count, 10)
        ctx = self.query("thread_context", tkey, "5")
        self.same_as_sqlite("thread_context", (tkey, 5), ctx)
        self.assertEqual([int(c["position"]) for c in ctx],
                         list(range(count - 5, count)))
        self.assertEqual([int(c["ts"]) for c in ctx],
                         sorted(int(c["ts"]) for c in ctx))

        recent = self.query("threads_recent", "5")
        self.same_as_sqlite("threads_recent", (5,), recent)

        email_, n = rows(self.db, "SELECT email, COUNT(*) FROM "
                         "aecs_addresses GROUP BY email ORDER BY 2 DESC "
                         "LIMIT 1")[0]
        part = self.query("messages_with_participant", email_.upper(),
                          "100000")
        self.assertEqual(len(part), n)

        mid, key = rows(self.db, "SELECT message_id, message_key FROM "
                        "aecs_messages ORDER BY ts LIMIT 1")[0]
        by_id = self.query("message_by_id", mid)
        self.assertEqual([r["message_key"] for r in by_id], [key])
        self.assertEqual(self.query("message_by_id", key), by_id)

        ref, n = rows(self.db, "SELECT ref_id, COUNT(DISTINCT message_key) "
                      "FROM aecs_references GROUP BY ref_id ORDER BY 2 "
                      "DESC LIMIT 1")[0]
        self.assertEqual(len(self.query("replies_to", ref)), n)

        self.assertEqual(len(self.query("stale_spec_version",
                                        "casbox-aecs-0", "7")), 7)
        self.assertEqual(self.query("stale_spec_version", "casbox-aecs-1",
                                    "7"), [])

    def test_search(self):
        """FTS5: the messages whose subject or clean text has the word."""
        for word in ("theseus", "gnuradio", "oscilloscope"):
            got = set(r["message_id"] for r in self.query(
                "search", word, "100000"))
            # unicode61: tokens are runs of letters and digits
            want = set(m for m, s, c in rows(
                self.db, "SELECT m.message_id, m.subject, b.clean FROM "
                "aecs_messages m JOIN aecs_bodies b USING (mailbox_id, "
                "message_key)")
                if word in re.split(r"[\W_]+", ((s or "") + "\n" +
                                                 (c or "")).lower()))
            self.assertTrue(want, word)
            self.assertEqual(got, want, word)

    def test_sql_file_equals_db(self):
        loaded = os.path.join(os.path.dirname(self.db_path), "loaded.sqlite")
        # one transaction (the file has none: D1 refuses them)
        with open(self.sql_path, "rb") as f:
            script = b"BEGIN;\n" + f.read() + b"COMMIT;\n"
        subprocess.run(["sqlite3", "-bail", loaded], input=script,
                       check=True, capture_output=True)
        other = sqlite3.connect(loaded)
        try:
            tables = [t for (t,) in rows(self.db, "SELECT name FROM "
                                         "sqlite_master WHERE type = "
                                         "'table' AND (name LIKE 'aecs_%' "
                                         "OR name LIKE 'casbox_%') AND "
                                         "name NOT LIKE 'aecs_search_%'")]
            self.assertEqual(len(tables), 9)
            for table in tables:
                cols = [c[1] for c in rows(self.db, "PRAGMA table_info(%s)"
                                           % table)
                        if c[1] != "processed_at"]
                if table == "aecs_search":
                    cols = ["mailbox_id", "message_key", "subject", "body"]
                sql = "SELECT rowid, %s FROM %s ORDER BY rowid" % (
                    ", ".join(cols), table)
                a, b = rows(self.db, sql), rows(other, sql)
                self.assertGreater(len(a), 0, table)
                self.assertEqual(a, b, table)
            self.assertEqual(rows(other, "SELECT sql FROM sqlite_master "
                                  "ORDER BY name"),
                             rows(self.db, "SELECT sql FROM sqlite_master "
                                  "ORDER BY name"))
        finally:
            other.close()

    def test_threads_notmuch(self):
        """Threads are the components of the References/In-Reply-To
        graph (ids as Dovecot takes them: with an @), read from the
        corpus bytes; and every thread of Dovecot's THREAD REFS lies in
        one of them."""
        box = "notmuch"
        links = {}
        for uid, raw in enumerate(self.loaded[box], 1):
            mid = message_id(raw) or ("uid:%d" % uid)
            links[("m", uid)] = [("id", mid)] + [
                ("id", r) for r in linked_ids(raw, b"references") +
                linked_ids(raw, b"in-reply-to")]
        find = components(links)
        want = {}
        for uid in range(1, len(self.loaded[box]) + 1):
            want.setdefault(find(("m", uid)), set()).add(uid)
        got = {}
        for uid, tkey in rows(self.db, "SELECT s.uid, m.thread_key FROM "
                              "casbox_aecs_source s JOIN aecs_messages m "
                              "USING (mailbox_id, message_key) WHERE "
                              "s.mailbox = ?", (box,)):
            got.setdefault(tkey, set()).add(uid)
        self.assertEqual(sorted(map(sorted, got.values())),
                         sorted(map(sorted, want.values())))

        imap = self.dc.imap_login("user1")
        ok(imap.select(box, readonly=True))
        data = ok(imap.uid("THREAD", "REFS", "UTF-8", "ALL"))
        imap.logout()
        depth, cur, dovecot = 0, [], []
        for tok in re.findall(r"\(|\)|\d+", b"".join(
                d for d in data if d).decode()):
            if tok == "(":
                depth += 1
            elif tok == ")":
                depth -= 1
                if depth == 0:
                    dovecot.append(set(cur))
                    cur = []
            else:
                cur.append(int(tok))
        self.assertGreater(len(dovecot), 50)
        for thread in dovecot:
            self.assertTrue(any(thread <= g for g in got.values()), thread)
        # the threading corpus: notmuch's ghost-root and parent-priority
        names = sorted(os.listdir(os.path.join(
            aecs_corpus.corpus_dir(), box)))
        for prefix, size in (("threading_ghost-root_1", 3),
                             ("threading_ghost-root_", 9),
                             ("threading_parent-priority", 3)):
            uids = set(i for i, n in enumerate(names, 1)
                       if n.startswith(prefix))
            self.assertEqual(len(uids), size)
            if prefix == "threading_ghost-root_":
                uids -= set(i for i, n in enumerate(names, 1)
                            if n.startswith("threading_ghost-root_1"))
            self.assertTrue(any(uids <= g for g in got.values()), prefix)


if __name__ == "__main__":
    unittest.main()
