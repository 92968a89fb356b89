"""Named events (doc/events.md) reach Dovecot's stats service: metric
blocks for every casbox and casidx event, the server exercised over
LMTP, IMAP (APPEND, COPY, FETCH, STORE, SEARCH with fts casidx) and
doveadm (index, casbox gc, scrub, key rotate), then the counts read
with `doveadm stats dump` and from the OpenMetrics endpoint.

Expected values come from what the test did, from the corpus bytes
(message sizes), from stock Dovecot's own mail_delivery_finished event
(the size of each delivered mail), from the files on disk (LSM tables)
and from the commands' own result rows; never from our events."""

import os
import secrets
import re
import subprocess
import sys
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dovecot_harness import Dovecot, corpus_files, free_port, ok  # noqa: E402
from test_doveadm_scrub import first_frame_middle, pack_sizes  # noqa: E402

USER = "user1"
WORD = "zyxwvutsqrevents"
# metric name -> (event, fields): what the README's block must define
FIELDS = {
    "casbox_save": ("casbox_save_finished",
                    "messages copied bytes blobs_written written_bytes "
                    "blobs_deduplicated deduplicated_bytes stored_bytes"),
    "casbox_duplicate": ("casbox_duplicate_suppressed",
                         "original_uid size age"),
    "casbox_dict_trained": ("casbox_dict_trained",
                            "dict_id samples heldout heldout_bytes "
                            "zstd_bytes dict_bytes"),
    "casbox_mail_read": ("casbox_mail_read_finished",
                         "bytes chunks decoded_bytes"),
    "casbox_lsm_flush": ("casbox_lsm_flush_finished",
                         "input_bytes entries tables_written table_bytes"),
    "casbox_lsm_compaction": ("casbox_lsm_compaction_finished",
                              "tables input_bytes entries tables_written "
                              "table_bytes"),
    "casbox_gc": ("casbox_gc_finished",
                  "packs_selected packs_deleted blobs_moved records_dropped "
                  "bytes_written bytes_reclaimed"),
    "casbox_scrub": ("casbox_scrub_finished", "damaged repaired"),
    "casbox_scrub_item": ("casbox_scrub_item", "uid"),
    "casbox_key_rotate_batch": ("casbox_key_rotate_batch_finished",
                                "examined rewrapped failed"),
    "casbox_key_rotate": ("casbox_key_rotate_finished",
                          "batches examined rewrapped failed left"),
    "casidx_index": ("casidx_index_finished",
                     "messages bytes expunges segment_flushes"),
    "casidx_lookup": ("casidx_lookup_finished", "args definite maybe"),
}
# 2.3's OpenMetrics export has counts and durations, not field sums:
# the sizes of the APPENDed mails as a histogram instead
HIST_MIN, HIST_MAX = 10, 20


def src_file(*path):
    top = os.environ.get("CASBOX_TOP_SRCDIR",
                         os.path.dirname(os.path.dirname(HERE)))
    with open(os.path.join(top, *path)) as f:
        return f.read()


def readme_block():
    """The configuration block of the README's "Monitoring" section."""
    text = src_file("README.md")
    section = text[text.index("\n## Monitoring\n"):]
    return section.split("```\n", 2)[1]


def metric_blocks(http_port):
    """The README's block with the HTTP listener on http_port, plus a
    histogram of the APPENDed sizes only."""
    block = readme_block()
    assert "port = 9900" in block
    block = block.replace("port = 9900", "port = %d" % http_port)
    # the stats process up before the first client: no handshake wait
    block = block.replace("service stats {\n",
                          "service stats {\n  process_min_avail = 1\n")
    return block + ("metric casbox_append_size {\n"
                    "  filter = event=casbox_save_finished AND "
                    "mailbox=Appended\n"
                    "  group_by = bytes:exponential:%d:%d:2\n}\n"
                    % (HIST_MIN, HIST_MAX)) + (
        # every event has its category, under Dovecot's
        # the event carries the mailbox (from its parent)
        "metric casbox_duplicate_inbox {\n"
        "  filter = event=casbox_duplicate_suppressed AND mailbox=INBOX\n"
        "}\n"
        "metric casbox_in_storage {\n"
        "  filter = category=storage AND category=casbox AND "
        "event=casbox_*\n}\n"
        "metric casidx_in_fts {\n"
        "  filter = category=fts AND category=casidx AND event=casidx_*\n}\n")


def stored_size(msg):
    """What casbox stores of an IMAP APPEND of msg: imaplib sends every
    line end as CRLF, the storage keeps LF (as sdbox and mdbox)."""
    return len(re.sub(rb"\r\n|\r|\n", b"\n", msg))


def doveadm(dc, *args, exit_code=0):
    """doveadm against dc, run in its base_dir. The harness points
    doveadm at a private config with -c, so doveadm reads it through
    doveconf, which exports every setting to the environment; the
    setting stats_writer_socket_path becomes STATS_WRITER_SOCKET_PATH,
    the variable Dovecot's master uses to hand its services the
    socket's full path, and doveadm then connects to "stats-writer"
    relative to its working directory (with the system config read
    from the config socket it uses base_dir as it should)."""
    res = subprocess.run(dc.doveadm_command(*args), capture_output=True,
                         text=True, timeout=600,
                         cwd=os.path.join(dc.tmp, "run"))
    if res.returncode != exit_code:
        raise AssertionError("doveadm %s failed (%d):\n%s%s"
                             % (" ".join(args), res.returncode, res.stdout,
                                res.stderr))
    # every event of this run went to the stats service
    if "stats-writer" in res.stderr:
        raise AssertionError("doveadm %s: %s" % (" ".join(args),
                                                  res.stderr))
    return res


def table(dc, *args, exit_code=0):
    res = doveadm(dc, "-f", "tab", *args, exit_code=exit_code)
    lines = res.stdout.strip("\n").split("\n")
    if not lines or not lines[0]:
        return []
    head = lines[0].split("\t")
    return [dict(zip(head, ln.split("\t"))) for ln in lines[1:]]


class EventsTest(unittest.TestCase):

    def test_readme_metrics(self):
        """The README's block has one metric per event that doc/events.md
        documents, with the fields this test checks (FIELDS)."""
        got = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
            r"metric (\w+) \{\n  filter = event=(\w+)\n"
            r"  fields = ([^\n]+)\n\}", readme_block())}
        self.assertEqual(got, FIELDS)
        documented = set(re.findall(r"^### `(\w+)`$",
                                    src_file("doc", "events.md"), re.M))
        self.assertEqual(documented, {e for e, _ in FIELDS.values()})

    def stats(self):
        """metric -> field -> (count, sum) from doveadm stats dump."""
        out = {}
        for row in table(self.dc, "stats", "dump"):
            out.setdefault(row["metric_name"], {})[row["field"]] = (
                int(row["count"] or 0), int(row["sum"] or 0))
        return out

    def wait_count(self, metric, count):
        """The dump once metric has count events: a process's events
        reach the stats service through its own connection, a moment
        after the reply the test read (bounded wait for that)."""
        deadline = time.monotonic() + 30
        while True:
            st = self.stats()
            got = st.get(metric, {}).get("duration", (0, 0))[0]
            if got >= count or time.monotonic() > deadline:
                self.assertEqual(got, count, metric)
                return st
            time.sleep(0.05)

    def delta(self, before, after, metric, field):
        b = before.get(metric, {}).get(field, (0, 0))
        a = after[metric][field]
        return a[0] - b[0], a[1] - b[1]

    def test_events(self):
        http_port = free_port()
        conf = ("lmtp_add_received_header = no\n"
                # the harness turns event stats off: this test needs them
                "stats_writer_socket_path = stats-writer\n"
                # deliveries stored with CRLF: their size is then the
                # virtual size Dovecot's own delivery event reports
                "protocol lmtp {\n  mail_save_crlf = yes\n}\n"
                "metric lmtp_delivery {\n"
                "  filter = event=mail_delivery_finished\n"
                "  fields = message_vsize\n}\n"
                + metric_blocks(http_port))
        with Dovecot(mail_plugins=["casbox", "fts", "fts_casidx"],
                     plugin_settings={"casbox_key_file": "%h/casbox.key",
                                      "casbox_key_autocreate": "yes",
                                      "casbox_lsm_wal_size": "64k",
                                      "casbox_duplicate_window": "1d",
                                      # trained by the APPENDs at the
                                      # latest (28 small messages)
                                      "casbox_dict_autotrain": "20",
                                      "fts": "casidx"},
                     extra_conf=conf) as dc:
            self.dc = dc
            self.run_server(dc, http_port)

    def run_server(self, dc, http_port):
        lmtp_msgs = []
        for path in corpus_files("usrp-users-3000", limit=16, step=150):
            with open(path, "rb") as f:
                lmtp_msgs.append(f.read())
        planted = [b"From: a@example.com\r\nSubject: planted %d\r\n\r\n"
                   b"the word %s is here\r\n" % (i, WORD.encode())
                   for i in range(2)]
        appended = []
        for path in corpus_files("spamassassin/easy-ham-1", limit=10, step=40):
            with open(path, "rb") as f:
                appended.append(f.read())
        sizes = [stored_size(m) for m in appended]

        # LMTP: one save per delivery, of the size stock Dovecot's
        # mail_delivery_finished gives the mail it delivered
        dc.lmtp_deliver_many(USER, lmtp_msgs + planted)
        n = len(lmtp_msgs) + len(planted)
        self.wait_count("lmtp_delivery", n)
        st = self.wait_count("casbox_save", n)
        save = st["casbox_save"]
        self.assertEqual(save["messages"], (n, n))
        self.assertEqual(save["bytes"][1],
                         st["lmtp_delivery"]["message_vsize"][1])
        self.assertEqual(save["copied"][1], 0)
        # every part is either written or found stored
        self.assertEqual(save["written_bytes"][1]
                         + save["deduplicated_bytes"][1], save["bytes"][1])
        self.assertGreater(save["blobs_written"][1], 0)
        self.assertGreater(save["stored_bytes"][1], 0)

        # a redelivery of the third mail: suppressed, one event naming
        # its first copy (UID 3) and the size stock Dovecot's delivery
        # event gives it; no save event, no second copy
        dc.lmtp_deliver(USER, lmtp_msgs[2])
        st1 = self.wait_count("lmtp_delivery", n + 1)
        st1 = self.wait_count("casbox_duplicate", 1)
        dup = st1["casbox_duplicate"]
        self.assertEqual(dup["original_uid"], (1, 3))
        self.assertEqual(dup["size"][1],
                         self.delta(st, st1, "lmtp_delivery",
                                    "message_vsize")[1])
        self.assertGreater(dup["size"][1], len(lmtp_msgs[2]))
        self.assertLess(dup["age"][1], 600)
        self.assertEqual(st1["casbox_duplicate_inbox"]["duration"][0], 1)
        self.assertEqual(st1["casbox_save"]["duration"][0], n)
        imap = dc.imap_login(USER)
        self.assertEqual(int(ok(imap.select("INBOX"))[0]), n)
        imap.logout()
        # the event is the log line
        self.assertIsNotNone(dc.wait_log(
            r"Duplicate delivery suppressed: the same message was "
            r"delivered as UID 3 \d+ s ago"))

        # APPEND: the stored sizes are the corpus bytes
        imap = dc.imap_login(USER)
        ok(imap.create("Appended"))
        for m in appended:
            ok(imap.append("Appended", None, None, m))
        st2 = self.wait_count("casbox_save", n + len(appended))
        self.assertEqual(self.delta(st, st2, "casbox_save", "bytes"),
                         (len(appended), sum(sizes)))
        # past 20 small blobs the store trained its dictionary, once
        st2 = self.wait_count("casbox_dict_trained", 1)
        trained = st2["casbox_dict_trained"]
        self.assertEqual(trained["dict_id"], (1, 1))
        self.assertGreaterEqual(trained["samples"][1], 10)
        self.assertGreaterEqual(trained["heldout"][1], 1)
        self.assertGreater(trained["heldout_bytes"][1],
                           trained["zstd_bytes"][1])
        self.assertLess(trained["dict_bytes"][1], trained["zstd_bytes"][1])
        self.assertIsNotNone(dc.wait_log(
            r"casbox: Trained compression dictionary 1 from the header "
            r"blocks of \d+ small messages and parts"))
        # the same mail again: nothing written, all of it deduplicated
        ok(imap.create("Dup"))
        ok(imap.append("Dup", None, None, appended[0]))
        st3 = self.wait_count("casbox_save", n + len(appended) + 1)
        for field, want in (("bytes", sizes[0]), ("written_bytes", 0),
                            ("blobs_written", 0),
                            ("deduplicated_bytes", sizes[0])):
            self.assertEqual(self.delta(st2, st3, "casbox_save", field)[1],
                             want, field)
        # COPY: one save of 3 copies, every byte deduplicated (the packs
        # get only their recovery records)
        ok(imap.select("Appended"))
        ok(imap.uid("COPY", "1:3", "Dup"))
        st4 = self.wait_count("casbox_save", n + len(appended) + 2)
        for field, want in (("messages", 3), ("copied", 3),
                            ("bytes", sum(sizes[:3])), ("written_bytes", 0),
                            ("deduplicated_bytes", sum(sizes[:3])),
                            ("blobs_written", 0)):
            self.assertEqual(self.delta(st3, st4, "casbox_save", field)[1],
                             want, field)

        # FETCH: one read per mail, its bytes, each chunk decoded once
        reads0 = st4.get("casbox_mail_read", {}).get("duration", (0, 0))[0]
        data = ok(imap.uid("FETCH", "1:*", "(BODY.PEEK[])"))
        self.assertEqual(len([x for x in data if isinstance(x, tuple)]),
                         len(appended))
        imap.close()
        ok(imap.select("INBOX"))  # closes the last mail of Appended
        st5 = self.wait_count("casbox_mail_read", reads0 + len(appended))
        self.assertEqual(self.delta(st4, st5, "casbox_mail_read", "bytes"),
                         (len(appended), sum(sizes)))
        self.assertEqual(
            self.delta(st4, st5, "casbox_mail_read", "decoded_bytes")[1],
            sum(sizes))
        # every one is smaller than a chunk (64 KiB)
        self.assertLess(max(sizes), 64 * 1024)
        self.assertEqual(
            self.delta(st4, st5, "casbox_mail_read", "chunks")[1],
            len(appended))

        # casidx: doveadm index, then SEARCH answered from the index
        doveadm(dc, "index", "-u", USER, "INBOX")
        st6 = self.wait_count("casidx_index", 1)
        self.assertEqual(st6["casidx_index"]["messages"][1], n)
        self.assertGreater(st6["casidx_index"]["bytes"][1], 0)
        self.assertGreaterEqual(st6["casidx_index"]["segment_flushes"][1], 1)
        uids = ok(imap.uid("SEARCH", "BODY", WORD))[0].split()
        self.assertEqual(uids, [str(n - 1).encode(), str(n).encode()])
        st7 = self.wait_count("casidx_lookup", 1)
        self.assertEqual(st7["casidx_lookup"]["definite"][1], 2)
        self.assertEqual(st7["casidx_lookup"]["maybe"][1], 0)

        # LSM: keyword changes (the LSM mirrors them, names included)
        # until the WAL has flushed into enough tables for a compaction;
        # 30 random keywords of 48 letters are some 1.5 kB per mail and
        # change. One STORE per message: WAL records are compressed, and
        # one STORE 1:* of the same names would compress to little.
        keywords = [["k%s" % secrets.token_hex(24)[:47] for i in range(30)]
                    for j in range(2)]
        uids = ok(imap.uid("SEARCH", "ALL"))[0].split()
        for i in range(60):
            for uid in uids:
                ok(imap.uid("STORE", uid, "FLAGS",
                            "(%s)" % " ".join(keywords[i % 2])))
            comp = self.stats().get("casbox_lsm_compaction", {})
            if comp.get("duration", (0, 0))[0] >= 1:
                break
        imap.logout()

        # gc after expunges: the event says what the command printed
        imap = dc.imap_login(USER)
        ok(imap.select("Appended"))
        ok(imap.uid("STORE", "1:*", "+FLAGS", "(\\Deleted)"))
        ok(imap.expunge())
        imap.logout()
        ok_row = table(dc, "casbox", "gc", "-u", USER, "--all")[0]
        st8 = self.wait_count("casbox_gc", 1)
        for field in FIELDS["casbox_gc"][1].split():
            self.assertEqual(st8["casbox_gc"][field][1], int(ok_row[field]),
                             field)

        # scrub of an intact store: no damage, no item rows
        self.assertEqual(table(dc, "casbox", "scrub", "-u", USER), [])
        st9 = self.wait_count("casbox_scrub", 1)
        self.assertEqual(st9["casbox_scrub"]["damaged"][1], 0)
        self.assertEqual(st9["casbox_scrub_item"]["duration"][0], 0)

        # key rotation: one event per batch, the totals the command
        # printed, every blob record of the store rewrapped
        blobs = int(table(dc, "casbox", "stats", "-u", USER)[0]
                    ["unique_blobs"])
        self.assertEqual(table(dc, "casbox", "key", "rotate", "-u",
                               USER)[0]["result"], "started")
        rot = table(dc, "casbox", "key", "rotate", "-u", USER,
                    "--finish", "--batch", "7")[0]
        st10 = self.wait_count("casbox_key_rotate", 1)
        self.assertEqual(int(rot["rewrapped"]), blobs)
        self.assertEqual(st10["casbox_key_rotate"]["rewrapped"][1], blobs)
        self.assertEqual(st10["casbox_key_rotate"]["batches"][1],
                         int(rot["batches"]))
        batch = st10["casbox_key_rotate_batch"]
        self.assertEqual(batch["duration"][0], int(rot["batches"]))
        self.assertEqual(batch["rewrapped"][1], blobs)
        self.assertGreaterEqual(int(rot["batches"]), (blobs + 6) // 7)

        # the LSM: every flush that wrote one made a table (key
        # rotation's reseal also flushes an empty memtable: a new WAL,
        # no table), every merge of k tables replaced them by one;
        # what is left is on disk
        st = self.stats()
        flushes = st["casbox_lsm_flush"]
        comp = st["casbox_lsm_compaction"]
        self.assertGreaterEqual(comp["duration"][0], 1)
        lsm_dir = os.path.join(dc.home(USER), "casbox", "lsm")
        tables = [f for f in os.listdir(lsm_dir) if f.endswith(".sst")]
        self.assertEqual(len(tables),
                         flushes["tables_written"][1] - comp["tables"][1]
                         + comp["tables_written"][1])
        self.assertEqual(sum(os.path.getsize(os.path.join(lsm_dir, f))
                             for f in tables) > 0, True)

        # a flipped byte in the blob of a new delivery: scrub's rows
        # and its events agree
        root = os.path.join(dc.home(USER), "casbox")
        before = pack_sizes(root)
        dc.lmtp_deliver(USER, planted[0].replace(b"planted", b"damaged"))
        self.wait_count("casbox_save", n + len(appended) + 3)
        after = pack_sizes(root)
        path = [p for p in after if after[p] != before.get(p, 0)][0]
        mid = first_frame_middle(path, before.get(path, 0))
        with open(path, "r+b") as f:
            f.seek(mid)
            b = f.read(1)
            f.seek(mid)
            f.write(bytes([b[0] ^ 0x40]))
        rows = table(dc, "casbox", "scrub", "-u", USER, exit_code=65)
        self.assertEqual([r["status"] for r in rows], ["damaged"], rows)
        st = self.wait_count("casbox_scrub", 2)
        self.assertEqual(st["casbox_scrub"]["damaged"][1], 1)
        self.assertEqual(st["casbox_scrub_item"]["duration"][0], 1)
        self.assertEqual(st["casbox_scrub_item"]["uid"][1], int(rows[0]["uid"]))

        for prefix, metric in (("casbox_", "casbox_in_storage"),
                               ("casidx_", "casidx_in_fts")):
            self.assertEqual(st[metric]["duration"][0],
                             sum(st[m]["duration"][0] for m in FIELDS
                                 if m.startswith(prefix)), metric)

        print("\nevents: %s" % ", ".join(
            "%s=%d" % (m, st[m]["duration"][0]) for m in sorted(FIELDS)))

        # OpenMetrics: the same counts, and the APPEND sizes histogram
        body = urllib.request.urlopen(
            "http://127.0.0.1:%d/metrics" % http_port,
            timeout=30).read().decode()
        values = {}
        for line in body.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                values[key] = float(value)
        for metric in FIELDS:
            count = st[metric]["duration"][0]
            self.assertEqual(values.get("dovecot_%s_total" % metric), count,
                             metric)
            if count > 0:
                self.assertGreater(values["dovecot_%s_duration_seconds_total"
                                          % metric], 0, metric)
        cumulative = 0
        for k in range(HIST_MIN, HIST_MAX + 1):
            cumulative = sum(1 for s in sizes if s <= 2 ** k)
            self.assertEqual(
                values['dovecot_casbox_append_size_bucket{le="%d"}' % 2 ** k],
                cumulative, k)
        self.assertEqual(
            values['dovecot_casbox_append_size_bucket{le="+Inf"}'],
            len(appended))
        # the README's histogram has every save
        self.assertEqual(values['dovecot_casbox_save_size_bucket{le="+Inf"}'],
                         st["casbox_save"]["duration"][0])


if __name__ == "__main__":
    unittest.main()
