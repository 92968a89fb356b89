"""FTS suite -- HOOK, to be filled by the FTS engineer.

=== FTS HOOK ===================================================================
bench.py calls run_fts(harness, messages, size, log) once per bench run,
after the storage suite, and report.py renders whatever it returns.

Contract (what report.py expects back):
    {
      "status": "not implemented" | "ok",
      "engines": {                       # one entry per engine
        "casidx":      {...} or {"error": "..."},
        "fts-xapian":  {...},
        "fts-lucene":  {...},
        "squat":       {...},
        "sqlite-fts5": {...},            # outside oracle (python sqlite3)
      },
    }
    and each engine's dict may hold these keys (all optional, numbers):
      "index_msgs_per_s"     messages indexed per second (doveadm index)
      "index_bytes_ratio"    index bytes on disk / mail bytes
      "query_p50_ms", "query_p99_ms"  over the query set
      "peak_rss_kb"          indexer-worker / doveadm VmHWM
      "agreement"            share of queries whose UID set equals the
                             oracle's (sqlite-fts5)

How to start a peer: harness.Dovecot(mail_location="sdbox:~/sdbox",
mail_plugins=["fts", "fts_xapian"], plugin_settings={"fts": "xapian",
"fts_xapian": "partial=3 full=20", "fts_autoindex": "no"},
extra_conf=storage.COMMON_CONF), deliver `messages` with
dc.lmtp_deliver_many(), then time dc.doveadm("index", "-u", user, "INBOX")
and run IMAP SEARCH queries (bench/imapraw.py RawIMAP.command). For casidx:
mail_plugins=["casbox", "fts", "fts_casidx"], plugin fts = casidx.
================================================================================
"""

ENGINES = ["casidx", "fts-xapian", "fts-lucene", "squat", "sqlite-fts5"]


def run_fts(harness, messages, size, log):
    log("fts: suite not implemented yet (hook in bench/fts.py)")
    return {"status": "not implemented",
            "engines": {e: {"error": "not yet measured"} for e in ENGINES}}
