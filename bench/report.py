"""Markdown report and PNG plots from the bench results dict."""

import os

from stats import summarize
import concurrency
import lsm

BASELINE = "sdbox"
CASBOX = "casbox"
# The targets of the open issues (issue 16 codec v2, issue 15 records v2)
GOAL_DISK = 0.6   # casbox bytes on disk <= 0.6x the best peer
GOAL_DISK_ANY = 1.0  # ... and never worse than the best peer (LMTP sample)
GOAL_FETCH = 1.5  # casbox FETCH >= 1.5x the best compressed peer
GOAL_FETCH_LIMIT = 0.9  # ... and >= 90% of its stages-in-series limit
GOAL_LARGE_RSS = 1.2  # large-mailbox imap peak RSS <= 1.2x sdbox's


def fts_nofts_lines(f):
    """Markdown lines: every engine against Dovecot's own search
    (bench/fts.py, dovecot-nofts), empty if that was not run."""
    rows = [(e, r) for e, r in f.get("engines", {}).items()
            if "uids_differ" in r or e == "dovecot-nofts"]
    if len(rows) < 2:
        return []
    kinds = f.get("search_kinds", {})
    lines = ["", "Against Dovecot's own search without FTS (`dovecot-nofts`,"
             " the IMAP substring semantics), %d searches: the %d terms "
             "above, %d written for issue 17 and %d values generated from "
             "the sample (`bench/fts.py`, `search_set()`), each timed "
             "(the terms twice); a search differs when its UIDs do." % (
                 len(f.get("searches", [])), kinds.get("terms", 0),
                 kinds.get("fixed", 0), kinds.get("generated", 0)), "",
             "| engine | query p50 ms | p90 ms | p99 ms | searches whose "
             "UIDs differ | of them missing messages |",
             "|---|---|---|---|---|---|"]
    for e, r in rows:
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            e, _fmt(r.get("query_p50_ms")), _fmt(r.get("query_p90_ms")),
            _fmt(r.get("query_p99_ms")),
            r.get("uids_differ", "(oracle)"),
            r.get("uids_missing", "")))
    return lines


def _fmt(v, digits=None):
    if v is None:
        return "n/a"
    if digits is None:
        digits = 0 if abs(v) >= 100 else (1 if abs(v) >= 10 else 2)
    return "%.*f" % (digits, v)


def _ms(s, digits=None):
    """median [min-max] of a summarize() dict."""
    if not s:
        return "n/a"
    return "%s [%s-%s]" % (_fmt(s["median"], digits), _fmt(s["min"], digits),
                           _fmt(s["max"], digits))


def _med(s):
    return s["median"] if s else None


def _ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def _ok_peers(storage):
    return [(n, s) for n, s in storage.items() if "error" not in s]


def physical_summary(phys):
    """Flatten physical results to {figure: summarize()}."""
    if not phys:
        return {}
    out = {}
    disk = phys.get("disk") or []
    if disk:
        out["seq_write_mbps"] = summarize([d["seq_write_mbps"] for d in disk])
        out["seq_read_mbps"] = summarize([d["seq_read_mbps"] for d in disk])
    if phys.get("fsync"):
        out["fsync_ms"] = phys["fsync"]["fsync_ms"]
        out["fsync_p99_ms"] = phys["fsync"]["fsync_p99_ms"]
    for key in ("zstd", "zstd_chunked"):
        z = phys.get(key) or []
        if z:
            out[key + "_decompress_mbps"] = summarize(
                [x["decompress_mbps"] for x in z])
            out[key + "_compress_mbps"] = summarize(
                [x["compress_mbps"] for x in z])
            out[key + "_ratio"] = summarize([x["ratio"] for x in z])
    for src, prefix in (("aead", "aead"), ("aead_aes", "aesgcm")):
        a = phys.get(src) or []
        for size in sorted({int(k) for x in a for k in x}):
            for op in ("encrypt_mbps", "decrypt_mbps"):
                vals = [x[k][op] for x in a for k in x if int(k) == size]
                out["%s_%d_%s" % (prefix, size, op)] = summarize(vals)
    return out


def aead_decrypt_key(peer, phys):
    """The AEAD figure a peer's reads pay: AES-256-GCM for mail_crypt
    and for casbox where the CPU has AES-NI (casbox frame version 2
    picks it then), else XChaCha20-Poly1305."""
    if "aesgcm_65536_decrypt_mbps" in phys and \
            ("crypt" in peer or peer == CASBOX):
        return "aesgcm_65536_decrypt_mbps"
    return "aead_65536_decrypt_mbps"


def _space_keys(storage):
    """Bytes-on-disk figures to judge by: the whole corpus (space*) when
    every working peer has it, else the LMTP sample (disk*)."""
    ok = [s for _, s in _ok_peers(storage)]
    if ok and all("space1_ratio" in s for s in ok):
        return "space1_ratio", "space2_ratio", "whole corpus"
    return "disk1_ratio", "disk2_ratio", "LMTP sample"


def fetch_limit(peer, phys):
    """Throughput bound of a FETCH for this peer's format: stages in
    series, so 1 / sum(1 / stage MB/s)."""
    stages = [_med(phys.get("seq_read_mbps"))]
    if "zstd" in peer or peer == CASBOX:
        stages.append(_med(phys.get("zstd_chunked_decompress_mbps")))
    if "crypt" in peer or peer == CASBOX:
        stages.append(_med(phys.get(aead_decrypt_key(peer, phys))))
    if any(v is None or v <= 0 for v in stages):
        return None
    return 1.0 / sum(1.0 / v for v in stages)


def goals(results):
    storage = results.get("storage", {})
    rows = []
    cb = storage.get(CASBOX, {"error": "not run"})
    k1, k2, what = _space_keys(storage)
    peers = [(n, s) for n, s in _ok_peers(storage) if n != CASBOX]
    best1 = min(peers, key=lambda p: p[1][k1]) if peers else None
    best2 = min(peers, key=lambda p: p[1][k2]) if peers else None
    sd = storage.get(BASELINE, {})
    avail = "error" not in cb

    def verdict(ok):
        if not avail:
            return "not yet available"
        return "met" if ok else "NOT met"

    for label, best, key in (("%s, one copy" % what, best1, k1),
                             ("%s, two copies" % what, best2, k2)):
        if best is None:
            continue
        target = GOAL_DISK * best[1][key]
        got = cb.get(key) if avail else None
        rows.append(("bytes on disk per byte of mail, %s" % label,
                     "<= %.2f x best peer (%s: %.3f) = %.3f"
                     % (GOAL_DISK, best[0], best[1][key], target),
                     _fmt(got, 3) if avail else "n/a",
                     verdict(got is not None and got <= target)))
    if "disk1_ratio" in cb and k1 != "disk1_ratio":
        sample = [(n, s) for n, s in peers if "disk1_ratio" in s]
        if sample:
            best = min(sample, key=lambda p: p[1]["disk1_ratio"])
            target = GOAL_DISK_ANY * best[1]["disk1_ratio"]
            got = cb["disk1_ratio"]
            rows.append(("bytes on disk per byte of mail, LMTP sample, "
                         "one copy",
                         "<= %.1f x best peer (%s: %.3f) = %.3f"
                         % (GOAL_DISK_ANY, best[0], best[1]["disk1_ratio"],
                            target),
                         _fmt(got, 3), verdict(got <= target)))
    if "error" not in sd and sd:
        for label, key in (("LMTP deliveries/s", "lmtp_per_s"),
                           ("IMAP APPEND/s", "append_per_s")):
            target = _med(sd[key])
            got = _med(cb.get(key)) if avail else None
            rows.append((label, ">= 1.0 x sdbox (%s)" % _fmt(target),
                         _fmt(got) if avail else "n/a",
                         verdict(got is not None and got >= target)))
    compressed = [(n, s) for n, s in peers
                  if ("zstd" in n or "crypt" in n) and
                  _med(s.get("fetch_mbps"))]
    got = _med(cb.get("fetch_mbps")) if avail else None
    if compressed:
        best = max(compressed, key=lambda p: _med(p[1]["fetch_mbps"]))
        target = GOAL_FETCH * _med(best[1]["fetch_mbps"])
        rows.append(("FETCH BODY[] MB/s",
                     ">= %.1f x best compressed peer (%s: %s) = %s"
                     % (GOAL_FETCH, best[0], _fmt(_med(best[1]["fetch_mbps"])),
                        _fmt(target)),
                     _fmt(got) if avail else "n/a",
                     verdict(got is not None and got >= target)))
    lim = fetch_limit(CASBOX, physical_summary(results.get("physical")))
    if lim:
        rows.append(("FETCH BODY[] MB/s, of the series limit",
                     ">= %d%% of %s (disk + zstd + AEAD in series)"
                     % (GOAL_FETCH_LIMIT * 100, _fmt(lim)),
                     ("%s (%.0f%%)" % (_fmt(got), 100.0 * got / lim))
                     if got else "n/a",
                     verdict(got is not None and
                             got >= GOAL_FETCH_LIMIT * lim)))
    sd_rss = sd.get("imap_large_rss_kb") if "error" not in sd else None
    if sd_rss:
        target = GOAL_LARGE_RSS * sd_rss / 1024.0
        got = cb.get("imap_large_rss_kb") if avail else None
        rows.append(("imap peak RSS MB, large mailbox",
                     "<= %.1f x sdbox (%.1f) = %.1f"
                     % (GOAL_LARGE_RSS, sd_rss / 1024.0, target),
                     _fmt(got / 1024.0, 1) if got else "n/a",
                     verdict(got is not None and
                             got / 1024.0 <= target)))
    return rows


def write_markdown(results, path, plots):
    storage = results.get("storage", {})
    phys = physical_summary(results.get("physical"))
    size = results["size"]
    c = results["corpus"]
    m = results["machine"]
    L = []
    w = L.append
    w("# Benchmarks")
    w("")
    w("Generated by `bench/run` (see bench/README.md); do not edit by hand.")
    w("")
    w("- Command: `%s`" % results["command"])
    w("- Mode: **%s**, started %s, took %.0f s"
      % (results["mode"], results["started"], results.get("elapsed_s", 0)))
    w("- Machine: %s, %s cores, %s GB RAM, Linux %s, Dovecot %s"
      % (m.get("cpu", "?"), m.get("nproc"), m.get("mem_gb", "?"),
         m.get("kernel"), m.get("dovecot", "?")))
    if m.get("git"):
        w("- Source: commit %s%s" % (m["git"], " plus uncommitted changes "
                                     "under src/ (parallel work in progress)"
                                     if m.get("src_dirty") else ""))
    w("- Corpus: %d messages, %.1f MB (%s), spread evenly over the shared "
      "corpus folders %s"
      % (c["messages"], c["bytes"] / 1e6,
         "all of it" if size["messages"] is None else "a sample",
         ", ".join(c["folders"])))
    w("- Rounds: %d per peer, each a fresh Dovecot instance; peers run "
      "interleaved (order rotated, and reversed every other round). Figures "
      "are **median [min-max]** over all samples. The machine is shared "
      "(2 cores, other jobs running): read the spread before the median."
      % size["rounds"])
    w("- Every peer runs with `mail_fsync = optimized` (Dovecot's default, "
      "set explicitly): one fsync per save transaction. Homes live in /tmp "
      "on the same ext4 disk the physical figures measure.")
    w("")

    w("## Goals")
    w("")
    w("| goal | target | casbox | verdict |")
    w("|---|---|---|---|")
    for row in goals(results):
        w("| %s |" % " | ".join(row))
    if CASBOX in storage and "error" in storage[CASBOX]:
        w("")
        w("casbox: not yet available (error %s)"
          % storage[CASBOX]["error"].replace("|", "/"))
    w("")

    w("## Physical limits (same machine, same run)")
    w("")
    if phys:
        w("| figure | median [min-max] |")
        w("|---|---|")
        names = [
            ("seq_write_mbps", "sequential write MB/s (1 MiB blocks, "
             + ("O_DIRECT" if all(d.get("direct_io") for d in
                                  results["physical"]["disk"])
                else "buffered + fsync") + ")"),
            ("seq_read_mbps", "sequential read MB/s"),
            ("fsync_ms", "fsync latency ms (4 KiB append + fsync)"),
            ("zstd_decompress_mbps", "zstd -3 decode MB/s (one stream)"),
            ("zstd_chunked_decompress_mbps",
             "zstd -3 decode MB/s (independent 16 KiB chunks)"),
            ("zstd_compress_mbps", "zstd -3 encode MB/s (one stream)"),
            ("zstd_chunked_compress_mbps",
             "zstd -3 encode MB/s (16 KiB chunks)"),
            ("zstd_ratio", "zstd -3 compression ratio (one stream)"),
            ("zstd_chunked_ratio", "zstd -3 compression ratio (16 KiB)"),
        ]
        for prefix, cipher in (("aead_", "XChaCha20-Poly1305"),
                               ("aesgcm_", "AES-256-GCM")):
            for k in sorted((x for x in phys if x.startswith(prefix)),
                            key=lambda x: (int(x.split("_")[1]), x)):
                _, sz, op, _ = k.split("_")
                names.append((k, "%s %s MB/s, %s KiB buffers "
                               "(libsodium)" % (cipher, op,
                                                int(sz) // 1024)))
        for key, label in names:
            if key in phys:
                v = phys[key]
                w("| %s | %s |" % (label, _ms(v) if isinstance(v, dict)
                                  else _fmt(v)))
        if "fsync_p99_ms" in phys:
            w("| fsync latency p99 ms | %s |" % _fmt(phys["fsync_p99_ms"]))
        fs = _med(phys.get("fsync_ms"))
        if fs:
            w("")
            w("At one fsync per save, this disk allows about **%s saves/s** "
              "per writer (1000 / median fsync ms)." % _fmt(1000.0 / fs))
        for k in ("disk_error", "zstd_error", "aead_error"):
            if results["physical"].get(k):
                w("")
                w("%s: %s" % (k, results["physical"][k]))
    else:
        w("(skipped)")
    w("")

    w("## Storage: bytes on disk")
    w("")
    okp = [(n, s) for n, s in _ok_peers(storage) if n != CASBOX]
    sc = results.get("space_corpus")
    if sc and okp and all("space1_ratio" in s for _, s in okp):
        w("### Whole corpus")
        w("")
        w("All %d messages (%.1f MB) saved to INBOX, then all again to a "
          "second folder, by MULTIAPPEND (100 messages or 8 MB per "
          "command) for a user of their own. Allocated bytes (st_blocks) "
          "of that user's whole home, Dovecot indexes and SIS attachment "
          "dir included, divided by the bytes of mail; \"2 copies\" is "
          "divided by twice the mail bytes."
          % (sc["messages"], sc["bytes"] / 1e6))
        w("")
        w("| peer | 1 copy | 2 copies | index+cache share | x best peer "
          "(1 copy) | x best peer (2 copies) |")
        w("|---|---|---|---|---|---|")
        b1 = min(s["space1_ratio"] for _, s in okp)
        b2 = min(s["space2_ratio"] for _, s in okp)
        for n, s in storage.items():
            if "error" in s or "space1_ratio" not in s:
                w("| %s | %s: not yet available (error %s) | | | | |"
                  % (n, n, s.get("error", s.get("large_error", "?"))
                     .replace("|", "/")))
                continue
            w("| %s | %.3f | %.3f | %.0f%% | %s | %s |"
              % (n, s["space1_ratio"], s["space2_ratio"],
                 100.0 * s["space1_index"] / max(1, s["space1_alloc"]),
                 _fmt(_ratio(s["space1_ratio"], b1), 2),
                 _fmt(_ratio(s["space2_ratio"], b2), 2)))
        w("")
        w("### LMTP sample")
        w("")
    w("The timed sample below, delivered by LMTP (Dovecot adds "
      "Return-Path/Delivered-To/Received headers, counted as overhead). "
      "Allocated bytes (st_blocks) of the user's whole home, Dovecot "
      "indexes included, divided by the bytes of mail delivered. "
      "\"2 copies\" is after the same messages were delivered again to a "
      "second folder, divided by twice the mail bytes.")
    w("")
    w("| peer | 1 copy | 2 copies | index+cache share | x best peer (2 copies) |")
    w("|---|---|---|---|---|")
    best2 = min((s["disk2_ratio"] for _, s in okp), default=None)
    for n, s in storage.items():
        if "error" in s:
            w("| %s | %s: not yet available (error %s) | | | |"
              % (n, n, s["error"].replace("|", "/")))
            continue
        w("| %s | %.3f | %.3f | %.0f%% | %s |"
          % (n, s["disk1_ratio"], s["disk2_ratio"],
             100.0 * s["index1_bytes"] / max(1, s["disk1_bytes"]),
             _fmt(_ratio(s["disk2_ratio"], best2), 2)))
    w("")

    w("## Storage: throughput")
    w("")
    fs = _med(phys.get("fsync_ms"))
    rd = _med(phys.get("seq_read_mbps"))
    w("LMTP: one connection, messages sent back to back (both deliveries "
      "of every round are samples). APPEND: one message per command with "
      "LITERAL+, waiting for each OK. FETCH: `UID FETCH 1:* BODY.PEEK[]` "
      "of INBOX on one connection, page cache warm, client reading "
      "literals straight off the socket. xsdbox = median / sdbox median.")
    w("")
    w("| peer | LMTP deliveries/s | x sdbox | APPEND/s | x sdbox | "
      "FETCH MB/s | x sdbox | fetched back intact |")
    w("|---|---|---|---|---|---|---|---|")
    sd = storage.get(BASELINE, {})
    for n, s in storage.items():
        if "error" in s:
            w("| %s | %s: not yet available (error %s) | | | | | | |"
              % (n, n, s["error"].replace("|", "/")))
            continue
        cells = [n]
        for key in ("lmtp_per_s", "append_per_s", "fetch_mbps"):
            cells.append(_ms(s[key]))
            cells.append(_fmt(_ratio(_med(s[key]), _med(sd.get(key)))
                              if "error" not in sd else None, 2))
        cells.append("%d/%d (%d in INBOX)" % (s["intact"], s["fetched"],
                                             s["inbox_exists"]))
        w("| %s |" % " | ".join(cells))
    if fs or rd:
        w("")
        w("### How close to the physical limits")
        w("")
        w("A save needs at least one fsync (saves/s limit = 1000 / median "
          "fsync ms, %s/s here). Over 100%% means saves do not each wait "
          "for a median fsync (the fsync figure is bimodal on this VM: see "
          "its min-max). A FETCH can go no faster than the stages its "
          "format needs, run in series (1 / sum of 1 / stage MB/s): disk "
          "read (%s MB/s), plus zstd decode of "
          "16 KiB chunks (%s MB/s) when compressed, plus AEAD decrypt of "
          "64 KiB when encrypted: %s (casbox: all three; casbox and "
          "mail_crypt use AES-256-GCM where the CPU has AES-NI). FETCH "
          "reads a warm page cache, so the disk term rarely binds."
          % (_fmt(1000.0 / fs) if fs else "n/a", _fmt(rd),
             _fmt(_med(phys.get("zstd_chunked_decompress_mbps"))),
             ", ".join("%s %s MB/s" % (name, _fmt(_med(phys.get(key))))
                       for key, name in
                       (("aesgcm_65536_decrypt_mbps", "AES-256-GCM"),
                        ("aead_65536_decrypt_mbps", "XChaCha20-Poly1305"))
                       if key in phys)))
        w("")
        w("| peer | LMTP % of fsync limit | APPEND % of fsync limit | "
          "FETCH limit MB/s (stages in series) | FETCH % of limit |")
        w("|---|---|---|---|---|")
        for n, s in storage.items():
            if "error" in s:
                continue
            lim = fetch_limit(n, phys)
            cells = [n]
            for key in ("lmtp_per_s", "append_per_s"):
                cells.append(_fmt(100.0 * _med(s[key]) * fs / 1000.0, 0)
                             + "%" if fs else "n/a")
            cells.append(_fmt(lim))
            cells.append(_fmt(100.0 * _med(s["fetch_mbps"]) / lim, 0) + "%"
                         if lim else "n/a")
            w("| %s |" % " | ".join(cells))
    w("")

    w("## Storage: large mailbox and memory")
    w("")
    w("The large mailbox is built with MULTIAPPEND of %d corpus messages "
      "(the smaller half of the sample, repeated), then `COPY 1:k` "
      "doubling it to **%d messages**; latency is the "
      "round trip of one command on a fresh, logged-in connection "
      "(STATUS first, then SELECT, %d times each). It is built in a "
      "second instance of the same peer with `mail_fsync = never` (only "
      "the build: SELECT and STATUS do not write), so build s is not a "
      "durable-save figure. Peak RSS is VmHWM of the imap and lmtp "
      "processes read from /proc at the end of each phase: the max over "
      "the delivery/APPEND/FETCH phases of all rounds, and separately the "
      "imap process that built and opened the large mailbox."
      % (min(size["large"], size.get("large_base", size["large"])),
         size["large"], size["latency_repeats"]))
    w("")
    w("| peer | messages | build s | SELECT ms | STATUS ms | imap peak RSS MB "
      "| lmtp peak RSS MB | imap peak RSS MB, large mailbox |")
    w("|---|---|---|---|---|---|---|---|")
    for n, s in storage.items():
        if "error" in s:
            w("| %s | %s: not yet available (error %s) | | | | | | |"
              % (n, n, s["error"].replace("|", "/")))
            continue
        if "large_error" in s:
            large = ["large mailbox failed: %s"
                     % s["large_error"].replace("|", "/"), "", "", ""]
        else:
            large = [str(s.get("large_exists", "n/a")),
                     _fmt(s.get("large_build_s")),
                     _ms(s.get("select_ms")), _ms(s.get("status_ms"))]
        w("| %s | %s | %.1f | %.1f | %s |"
          % (n, " | ".join(large),
             s["imap_rss_kb"] / 1024.0, s["lmtp_rss_kb"] / 1024.0,
             _fmt(s["imap_large_rss_kb"] / 1024.0, 1)
             if s.get("imap_large_rss_kb") else "n/a"))
    problems = [(n, s) for n, s in storage.items()
                if s.get("log_problems") or s.get("failed_rounds")]
    if problems:
        w("")
        w("Notes from the runs:")
        for n, s in problems:
            for p in s.get("log_problems", []):
                w("- %s logged: `%s`" % (n, p[-200:].replace("`", "'")))
            for e in s.get("failed_rounds", []):
                w("- %s: a round failed: %s" % (n, e))
    w("")

    w("## FTS suite")
    w("")
    f = results.get("fts") or {}
    if f.get("status") != "ok":
        w("**Not run** (hook: `bench/fts.py`, `run_fts()`): casidx vs "
          "fts-xapian, fts-lucene, squat and SQLite FTS5.")
    else:
        w("%d messages (%.1f MB, the first of the timed sample) APPENDed to "
          "a fresh INBOX, then `doveadm index -u USER INBOX` timed "
          "(`fts_autoindex = no`, `fts_enforced = yes`), then `UID SEARCH "
          "BODY term` for %d terms (%s). SQLite FTS5 (Python's sqlite3, "
          "decoded text parts, prefix query `\"term\"*`) is the outside "
          "oracle; agreement = share of queries with the same UID set, "
          "Jaccard = mean overlap. The engines' semantics differ (BODY is "
          "a substring search that each engine approximates), so low "
          "agreement flags a difference to look at, not by itself a bug. "
          "Peak RSS is ru_maxrss of the doveadm index process."
          % (f["messages"], f["mail_bytes"] / 1e6, len(f["queries"]),
             ", ".join(f["queries"])))
        w("")
        w("| engine | msgs indexed/s | index bytes / mail byte | query p50 ms "
          "| query p99 ms | peak RSS MB | agreement with FTS5 | Jaccard |")
        w("|---|---|---|---|---|---|---|---|")
        for e, r in f["engines"].items():
            if "error" in r:
                w("| %s | %s: failed (error %s) | | | | | | |"
                  % (e, e, r["error"].replace("|", "/")))
                continue
            w("| %s | %s | %s | %s | %s | %s | %s | %s |"
              % (e, _fmt(r.get("index_msgs_per_s")),
                 _fmt(r.get("index_bytes_ratio"), 3),
                 _fmt(r.get("query_p50_ms")), _fmt(r.get("query_p99_ms")),
                 _fmt(r["peak_rss_kb"] / 1024.0) if r.get("peak_rss_kb")
                 else "n/a",
                 _fmt(r.get("agreement"), 2), _fmt(r.get("jaccard"), 2)))
        for line in fts_nofts_lines(f):
            w(line)
        hits = [(e, r["hits"]) for e, r in f["engines"].items()
                if r.get("hits")]
        if hits:
            w("")
            w("Hits per query:")
            w("")
            w("| engine | %s |" % " | ".join(f["queries"]))
            w("|---|%s" % ("---|" * len(f["queries"])))
            for e, h in hits:
                w("| %s | %s |" % (e, " | ".join(str(h[q])
                                                 for q in f["queries"])))
    w("")

    if results.get("concurrency"):
        L.extend(concurrency.markdown(results["concurrency"]))
        w("")

    if results.get("lsm"):
        L.extend(lsm.markdown(results["lsm"]))
        w("")

    if plots:
        w("## Plots")
        w("")
        rel = os.path.dirname(os.path.abspath(path))
        for p in plots:
            w("![%s](%s)" % (os.path.basename(p),
                             os.path.relpath(p, rel)))
            w("")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("\n".join(L).rstrip() + "\n")


def plots(results, outdir, log):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plots (bench/run installs "
            "python3-matplotlib)")
        return []
    os.makedirs(outdir, exist_ok=True)
    storage = results.get("storage", {})
    phys = physical_summary(results.get("physical"))
    names = list(storage)
    ok = [n for n in names if "error" not in storage[n]]
    made = []

    def save(fig, name):
        p = os.path.join(outdir, name)
        fig.tight_layout()
        fig.savefig(p, dpi=90)
        plt.close(fig)
        made.append(p)

    def annotate_missing(ax, xs):
        for i, n in enumerate(names):
            if "error" in storage[n]:
                ax.text(xs[i], 0, "not yet\navailable", ha="center",
                        va="bottom", fontsize=7, rotation=90)

    xs = list(range(len(names)))
    # Bytes on disk
    fig, ax = plt.subplots(figsize=(9, 4))
    k1, k2, what = _space_keys(storage)
    for off, key, label in ((-0.2, k1, "1 copy"),
                            (0.2, k2, "2 copies (per byte)")):
        ax.bar([x + off for x in xs],
               [storage[n].get(key, 0) if n in ok else 0 for n in names],
               width=0.4, label=label)
    okp = [n for n in ok if n != CASBOX]
    if okp:
        best = min(storage[n][k2] for n in okp)
        ax.axhline(GOAL_DISK * best, color="red", linestyle="--",
                   label="casbox goal (0.6 x best, 2 copies)")
    annotate_missing(ax, xs)
    ax.set_xticks(xs)
    ax.set_xticklabels(names, rotation=30, ha="right")
    ax.set_ylabel("bytes on disk / byte of mail")
    ax.legend(fontsize=8)
    ax.set_title("Bytes on disk per byte of mail (%s)" % what)
    save(fig, "disk.png")

    def bar_err(ax, key, label, scale=1.0):
        meds, lo, hi = [], [], []
        for n in names:
            s = storage[n].get(key) if n in ok else None
            if s:
                meds.append(s["median"] * scale)
                lo.append((s["median"] - s["min"]) * scale)
                hi.append((s["max"] - s["median"]) * scale)
            else:
                meds.append(0)
                lo.append(0)
                hi.append(0)
        ax.bar(xs, meds, yerr=[lo, hi], capsize=3, label=label)
        ax.set_xticks(xs)
        ax.set_xticklabels(names, rotation=30, ha="right")
        annotate_missing(ax, xs)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    bar_err(axes[0], "lmtp_per_s", "LMTP")
    axes[0].set_title("LMTP deliveries/s (median, min-max)")
    bar_err(axes[1], "append_per_s", "APPEND")
    axes[1].set_title("IMAP APPEND/s (median, min-max)")
    fs = _med(phys.get("fsync_ms"))
    if fs:
        for ax in axes:
            ax.axhline(1000.0 / fs, color="red", linestyle="--",
                       label="1 / fsync latency")
            ax.legend(fontsize=8)
    save(fig, "throughput.png")

    fig, ax = plt.subplots(figsize=(9, 4))
    bar_err(ax, "fetch_mbps", "FETCH")
    for key, label, color in (
            ("seq_read_mbps", "disk sequential read", "red"),
            ("zstd_chunked_decompress_mbps", "zstd decode (16 KiB chunks)",
             "green"),
            ("aead_65536_decrypt_mbps", "AEAD decrypt (64 KiB)", "purple")):
        v = _med(phys.get(key))
        if v:
            ax.axhline(v, color=color, linestyle="--", label=label)
    if _med(storage.get(BASELINE, {}).get("fetch_mbps")):
        ax.axhline(_med(storage[BASELINE]["fetch_mbps"]),
                   color="black", linestyle=":", label="sdbox")
    ax.set_yscale("log")
    ax.set_ylabel("MB/s (log)")
    ax.set_title("FETCH BODY[] MB/s against physical limits")
    ax.legend(fontsize=7)
    save(fig, "fetch.png")

    fig, ax = plt.subplots(figsize=(9, 4))
    for off, key, label in ((-0.2, "select_ms", "SELECT"),
                            (0.2, "status_ms", "STATUS")):
        ax.bar([x + off for x in xs],
               [_med(storage[n].get(key)) or 0 if n in ok else 0
                for n in names], width=0.4, label=label)
    annotate_missing(ax, xs)
    ax.set_xticks(xs)
    ax.set_xticklabels(names, rotation=30, ha="right")
    ax.set_ylabel("ms (median)")
    ax.set_title("Latency on a %d-message mailbox" % results["size"]["large"])
    ax.legend(fontsize=8)
    save(fig, "latency.png")

    f = results.get("fts") or {}
    eng = [(e, r) for e, r in (f.get("engines") or {}).items()]
    if f.get("status") == "ok" and eng:
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
        ex = list(range(len(eng)))
        for ax, key, title in (
                (axes[0], "index_msgs_per_s", "messages indexed/s"),
                (axes[1], "index_bytes_ratio", "index bytes / mail byte"),
                (axes[2], "query_p50_ms", "query p50 ms")):
            ax.bar(ex, [r.get(key) or 0 for _, r in eng])
            for i, (e, r) in enumerate(eng):
                if "error" in r:
                    ax.text(i, 0, "failed", ha="center", va="bottom",
                            fontsize=7, rotation=90)
            ax.set_xticks(ex)
            ax.set_xticklabels([e for e, _ in eng], rotation=30,
                               ha="right")
            ax.set_title(title)
        fig.suptitle("FTS, %d messages" % f["messages"])
        save(fig, "fts.png")
    return made
