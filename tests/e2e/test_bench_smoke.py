"""Smoke test of the bench harness (bench/): runs the whole suite in its
tiny mode against a dozen corpus messages and checks the report has a row
for every storage peer and facts that cannot be wrong in a working run
(bytes on disk > 0, every delivered message fetched back intact, the
large mailbox has the asked-for size, peak RSS was read). No timing is
asserted: this machine is shared and noisy."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dovecot_harness import TOP_SRCDIR, skip_unless_dovecot23  # noqa: E402

BENCH = os.path.join(TOP_SRCDIR, "bench")
sys.path.insert(0, BENCH)
import fts  # noqa: E402
import storage  # noqa: E402

TINY_MESSAGES = 12
TINY_LARGE = 60


@skip_unless_dovecot23("bench/ measures against the peers of Debian 12's 2.3 "
                       "(zlib, fts-lucene, fts-xapian 1.5 settings)")
class BenchSmoke(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="cbx-bench-smoke-")
        aead = os.path.join(cls.tmp, "physical-aead")
        subprocess.run(["cc", "-O2", "-o", aead,
                        os.path.join(BENCH, "physical-aead.c"), "-lsodium"],
                       check=True)
        cls.report = os.path.join(cls.tmp, "benchmarks.md")
        cls.json_path = os.path.join(cls.tmp, "results.json")
        cmd = [sys.executable, "-B", os.path.join(BENCH, "bench.py"),
               "--tiny", "--messages", str(TINY_MESSAGES),
               "--large", str(TINY_LARGE), "--aead-binary", aead,
               "--json", cls.json_path, "--report", cls.report,
               "--no-plots"]
        cls.proc = subprocess.run(cmd, capture_output=True, text=True,
                                  timeout=1500)
        sys.stderr.write(cls.proc.stderr[-4000:])
        with open(cls.json_path) as f:
            cls.res = json.load(f)
        with open(cls.report) as f:
            cls.md = f.read()

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_exit_status(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr[-2000:])

    def test_every_peer_has_a_row(self):
        self.assertEqual(set(self.res["storage"]), set(storage.PEER_NAMES))
        for peer in storage.PEER_NAMES:
            self.assertIn("| %s |" % peer, self.md, peer)

    def test_peers_measured_sanely(self):
        for peer, s in self.res["storage"].items():
            if peer == "casbox" and "error" in s:
                continue  # checked in test_casbox_row
            with self.subTest(peer=peer):
                self.assertNotIn("error", s)
                self.assertGreater(s["disk1_bytes"], 0)
                # The second copy never frees space.
                self.assertGreaterEqual(s["disk2_bytes"], s["disk1_bytes"])
                self.assertEqual(s["inbox_exists"], TINY_MESSAGES)
                self.assertEqual(s["fetched"], TINY_MESSAGES)
                self.assertEqual(s["intact"], TINY_MESSAGES)
                self.assertEqual(s["large_exists"], TINY_LARGE)
                self.assertGreater(s["imap_rss_kb"], 0)
                self.assertGreater(s["lmtp_rss_kb"], 0)
                for key in ("lmtp_per_s", "append_per_s", "fetch_mbps",
                            "select_ms", "status_ms"):
                    self.assertGreater(s[key]["median"], 0, key)

    def test_compression_saves_space(self):
        # A fact about the corpus, not about timing: zstd-compressed
        # sdbox stores fewer bytes than plain sdbox.
        st = self.res["storage"]
        self.assertLess(st["sdbox+zstd"]["disk1_bytes"],
                        st["sdbox"]["disk1_bytes"])

    def test_casbox_row(self):
        s = self.res["storage"]["casbox"]
        if "error" in s:
            self.assertIn("casbox: not yet available (error", self.md)
        else:
            self.assertEqual(s["fetched"], TINY_MESSAGES)
            self.assertEqual(s["intact"], TINY_MESSAGES)

    def test_physical_limits_measured(self):
        p = self.res["physical"]
        self.assertGreater(p["disk"][0]["seq_write_mbps"], 0)
        self.assertGreater(p["disk"][0]["seq_read_mbps"], 0)
        self.assertGreater(p["fsync"]["fsync_ms"]["median"], 0)
        self.assertGreater(p["zstd"][0]["ratio"], 1.0)
        self.assertGreater(p["zstd"][0]["decompress_mbps"], 0)
        self.assertTrue(p["aead"], "AEAD benchmark produced no figures")
        for figures in p["aead"][0].values():
            self.assertGreater(figures["decrypt_mbps"], 0)

    def test_fts_rows(self):
        f = self.res["fts"]
        self.assertEqual(f["status"], "ok")
        self.assertEqual(set(f["engines"]), set(fts.ENGINES))
        for e in fts.ENGINES:
            self.assertIn("| %s |" % e, self.md, e)
        # The oracle and a stock Debian engine must work; every engine
        # that works finds nothing for a word absent from the corpus and
        # something for the commonest one.
        for e in ("sqlite-fts5", "fts-xapian"):
            self.assertNotIn("error", f["engines"][e], e)
        for e, r in f["engines"].items():
            if "hits" in r:
                with self.subTest(engine=e):
                    self.assertEqual(r["hits"]["xyzzyquux"], 0)
                    self.assertGreater(r["hits"]["the"], 0)
                    self.assertGreater(r["index_bytes_ratio"], 0)

    def test_report_sections(self):
        for heading in ("## Goals", "## Physical limits",
                        "## Storage: bytes on disk", "## Storage: throughput",
                        "## Storage: large mailbox and memory",
                        "## FTS suite"):
            self.assertIn(heading, self.md)
        self.assertIn("mail_fsync = optimized", self.md)


if __name__ == "__main__":
    unittest.main()
