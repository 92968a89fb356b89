"""FTS suite: casidx vs fts-xapian, fts-lucene, squat, with SQLite FTS5 as
the outside oracle.

=== FTS HOOK ===================================================================
bench.py calls run_fts(harness, messages, size, log) once per bench run,
after the storage suite, and report.py renders what it returns:
    {"status": "ok", "messages": N, "mail_bytes": B, "queries": [...],
     "engines": {name: {...} or {"error": "..."}}}
with, per engine (all optional numbers):
    "index_msgs_per_s"   messages indexed per second (doveadm index, timed)
    "index_bytes_ratio"  index bytes on disk / mail bytes
    "query_p50_ms", "query_p99_ms"  IMAP UID SEARCH BODY latency
    "peak_rss_kb"        VmHWM (ru_maxrss) of the doveadm index process
    "agreement"          share of queries whose UID set equals FTS5's
    "jaccard"            mean Jaccard similarity with FTS5's UID sets
The Dovecot engines below are generic (ENGINE_CONFIGS); the casidx
engineer only needs to keep its entry right (plugin names, settings, the
directory its index lives in) and may add casidx-only figures.
================================================================================

Semantics differ, so agreement is a sanity figure, not a correctness test:
Dovecot's SEARCH BODY is a substring match that each engine approximates
(fts-xapian matches word prefixes of >= 3 characters), FTS5 here matches
word prefixes (`"term"*`) in the decoded text parts.
"""

import email
import email.policy
import os
import sqlite3
import subprocess
import sys
import time

from imapraw import RawIMAP
from stats import percentile
import storage

USER = "ftsuser"

# Query terms: frequent, mid and rare words of this corpus, plus one that
# matches nothing. Sent as UID SEARCH BODY.
QUERIES = ["the", "error", "usrp", "firmware", "python", "linux", "money",
           "subscribe", "ettus", "gnuradio", "fpga", "unsubscribe",
           "spamassassin", "xyzzyquux"]
# More searches, as (key, value): the cases of issue 17 (markup of HTML
# parts, pieces of paths and long words, numbers, folding), and values
# generated from the sample itself (generated_queries()). Their UIDs are
# compared with Dovecot without FTS ("dovecot-nofts", the substring
# semantics of IMAP): "uids_differ" counts the searches that differ.
FIXED_SEARCHES = [("BODY", "http://"), ("BODY", "www."), ("BODY", "ab"),
                  ("BODY", "free"), ("TEXT", "unsubscribe"),
                  ("BODY", "instrumentation"), ("BODY", "memory"),
                  ("BODY", "shadow"), ("BODY", "alloc"), ("BODY", "oops"),
                  ("BODY", "0xffff"), ("BODY", "2019"),
                  ("BODY", "munoz"), ("BODY", "sample rate"),
                  ("BODY", "<div"), ("BODY", "href="), ("TEXT", "gnuradio"),
                  ("SUBJECT", "usrp"), ("FROM", "gmail"),
                  ("BODY", "café"), ("BODY", "東京")]
N_GENERATED = 60

# name: (storage mail_location, mail_plugins, plugin settings, index dir
# under the user's home that holds only FTS data)
ENGINE_CONFIGS = {
    "casidx": ("casbox:~/casbox", ["casbox", "fts", "fts_casidx"],
               {"fts": "casidx", "casbox_key_file": "%h/casbox.key",
                "casbox_key_autocreate": "yes"}, None),
    "fts-xapian": ("sdbox:~/sdbox", ["fts", "fts_xapian"],
                   {"fts": "xapian", "fts_xapian": "partial=3 full=20"},
                   "xapian-indexes"),
    "fts-lucene": ("sdbox:~/sdbox", ["fts", "fts_lucene"],
                   {"fts": "lucene"}, None),
    # the oracle: Dovecot's own search, no index
    "dovecot-nofts": ("sdbox:~/sdbox", [], {}, None),
    "squat": ("sdbox:~/sdbox", ["fts", "fts_squat"],
              {"fts": "squat"}, None),
}
ENGINES = list(ENGINE_CONFIGS) + ["sqlite-fts5"]


def _main():
    """Only the FTS suite, on a corpus sample: the numbers of
    doc/benchmarks.md's FTS comparison. Prints one JSON object."""
    import argparse
    import json
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "..", "tests", "e2e"))
    import dovecot_harness as harness
    import bench
    ap = argparse.ArgumentParser(description=_main.__doc__)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--engines", default="casidx,fts-lucene,fts-xapian")
    ap.add_argument("--timeout", type=int, default=1800)
    args = ap.parse_args()
    _, paths = bench.corpus_messages(harness, args.messages)
    msgs = []
    for path in paths:
        with open(path, "rb") as f:
            msgs.append(f.read())
    size = {"peer_timeout": args.timeout,
            "fts_engines": args.engines.split(",")}
    out = run_fts(harness, msgs, size,
                  lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(out, indent=1, default=list))
    import report
    for line in report.fts_nofts_lines(out):
        print(line, file=sys.stderr)


def _text_of(raw):
    """Decoded text of a message's text/* parts plus its Subject."""
    try:
        msg = email.message_from_bytes(raw, policy=email.policy.compat32)
    except Exception:  # noqa: BLE001 - broken messages are in the corpus
        return raw.decode("latin-1")
    out = []
    for part in msg.walk():
        if part.get_content_maintype() != "text":
            continue
        payload = part.get_payload(decode=True) or b""
        charset = part.get_content_charset() or "latin-1"
        try:
            out.append(payload.decode(charset, errors="replace"))
        except LookupError:
            out.append(payload.decode("latin-1"))
    return "\n".join(out)


def run_fts5(messages, workdir):
    path = os.path.join(workdir, "fts5.db")
    db = sqlite3.connect(path)
    db.execute("CREATE VIRTUAL TABLE m USING fts5(body)")
    t0 = time.perf_counter()
    texts = [_text_of(m) for m in messages]
    with db:
        db.executemany("INSERT INTO m(rowid, body) VALUES (?, ?)",
                       ((i + 1, t) for i, t in enumerate(texts)))
    db.execute("INSERT INTO m(m) VALUES('optimize')")
    db.commit()
    dt = time.perf_counter() - t0
    results, lat = {}, []
    for q in QUERIES:
        t1 = time.perf_counter()
        rows = db.execute("SELECT rowid FROM m WHERE m MATCH ?",
                          ('"%s"*' % q,)).fetchall()
        lat.append((time.perf_counter() - t1) * 1000)
        results[q] = {r[0] for r in rows}
    db.close()
    lat.sort()
    res = {"index_msgs_per_s": len(messages) / dt,
           "index_bytes_ratio": os.path.getsize(path)
           / sum(len(m) for m in messages),
           "query_p50_ms": percentile(lat, 50),
           "query_p99_ms": percentile(lat, 99)}
    os.unlink(path)
    return res, results


def generated_queries(messages, count=N_GENERATED, seed=7):
    """count (key, value) searches cut from the sample's decoded text
    parts, seeded: whole words, pieces of words, two words, words with
    their punctuation, and non-ASCII pieces when the sample has them."""
    import random
    import re
    rng = random.Random(seed)
    out = []
    texts = [t for t in (_text_of(m) for m in messages) if t.strip()]
    tries = 0
    while len(out) < count and texts and tries < count * 50:
        tries += 1
        text = rng.choice(texts)
        kind = len(out) % 5
        if kind == 4:
            m = re.findall(r"[^\x00-\x7f\s]{2,6}", text)
        elif kind == 3:
            m = re.findall(r"[A-Za-z]{3,} [A-Za-z]{3,}", text)
        elif kind == 2:
            m = re.findall(r"[A-Za-z0-9]+[./:_-][A-Za-z0-9]+", text)
        else:
            m = re.findall(r"[A-Za-z0-9]{3,15}", text)
        if not m:
            continue
        v = rng.choice(m)
        if kind == 1 and len(v) > 4:
            a = rng.randrange(0, len(v) - 3)
            v = v[a:a + 3 + rng.randrange(0, 2)]
        q = ("TEXT" if rng.random() < 0.2 else "BODY", v)
        if q not in out and "\ufffd" not in v:
            out.append(q)
    return out


def search_set(messages):
    return ([("BODY", q) for q in QUERIES] + FIXED_SEARCHES
            + generated_queries(messages))


def _search_cmd(key, value):
    data = value.encode("utf-8")
    return "UID SEARCH CHARSET UTF-8 %s {%d+}\r\n%s" % (key, len(data),
                                                         value)


def _timed_search(c, cmd):
    """(milliseconds, UID set) of one UID SEARCH command."""
    found = []
    t0 = time.perf_counter()
    c.command(cmd, lambda parts: found.append(parts[0]))
    ms = (time.perf_counter() - t0) * 1000
    uids = set()
    for line in found:
        if line.startswith(b"* SEARCH"):
            uids |= {int(x) for x in line.split()[2:]}
    return ms, uids


def _dir_bytes(path):
    total = 0
    for root, dirs, files in os.walk(path):
        for n in files:
            try:
                total += os.lstat(os.path.join(root, n)).st_blocks * 512
            except OSError:
                pass
    return total


# ru_maxrss survives execve on Linux, so a doveadm forked straight from
# this Python (which holds the corpus in memory) would report Python's
# peak. A fresh small interpreter runs it and reports its child's peak.
_RSS_HELPER = """
import resource, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE,
                   stderr=subprocess.STDOUT)
dt = time.perf_counter() - t0
sys.stdout.buffer.write(p.stdout[-300:])
print("\\nRSSHELPER %d %f %d" % (p.returncode, dt,
      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
"""


def _timed_doveadm(harness, dc, args):
    """Run doveadm under this instance's config; (seconds, peak RSS KiB)
    of exactly that process."""
    p = subprocess.run([sys.executable, "-c", _RSS_HELPER, harness.DOVEADM,
                        "-c", dc.conf_path] + args, capture_output=True,
                       timeout=3600)
    out = p.stdout.decode("latin-1", "replace")
    last = out.strip().splitlines()[-1].split() if out.strip() else []
    if len(last) != 4 or last[0] != "RSSHELPER":
        raise RuntimeError("doveadm %s: no result: %s %s"
                           % (" ".join(args), out[-300:], p.stderr[-300:]))
    rc, dt, rss = int(last[1]), float(last[2]), int(last[3])
    if rc != 0:
        raise RuntimeError("doveadm %s failed (%d): %s"
                           % (" ".join(args), rc, out[-300:]))
    return dt, rss


def run_engine(harness, name, messages, log, timeout, searches=None):
    loc, plugins, settings, index_dir = ENGINE_CONFIGS[name]
    settings = dict(settings)
    settings.setdefault("fts_autoindex", "no")
    settings["fts_enforced"] = "yes"  # never fall back to a scan
    kwargs = dict(mail_location=loc, mail_plugins=plugins,
                  plugin_settings=settings,
                  extra_conf=storage.COMMON_CONF)

    def body(dc):
        with RawIMAP(dc.imap_port) as c:
            c.login(USER, harness.PASSWORD)
            for i in range(0, len(messages), 100):
                c.append("INBOX", messages[i:i + 100])
        home = dc.home(USER)
        before = storage.disk_usage(home)[0]
        if plugins:
            dt, rss = _timed_doveadm(harness, dc,
                                     ["index", "-u", USER, "INBOX"])
        else:
            dt, rss = None, None
        after = storage.disk_usage(home)[0]
        if index_dir and os.path.isdir(os.path.join(home, index_dir)):
            index_bytes = _dir_bytes(os.path.join(home, index_dir))
        else:
            # Index living among the mail files: what indexing added.
            index_bytes = max(0, after - before)
        results, lat, per = {}, [], []
        with RawIMAP(dc.imap_port) as c:
            c.login(USER, harness.PASSWORD)
            c.select("INBOX")
            for q in QUERIES:
                ms, results[q] = _timed_search(c, 'UID SEARCH BODY "%s"' % q)
                lat.append(ms)
                per.append((ms, "BODY", q))
            # the wider set: each search timed, UIDs kept for the
            # comparison with dovecot-nofts
            for key, value in searches or []:
                ms, results[(key, value)] = _timed_search(
                    c, _search_cmd(key, value))
                lat.append(ms)
                per.append((ms, key, value))
        lat.sort()
        # the slowest searches, for profiling (doc/benchmarks.md)
        slowest = [[round(ms, 2), k, v] for ms, k, v in
                   sorted(per, reverse=True)[:12]]
        if dt is None:
            return ({"query_p50_ms": percentile(lat, 50),
                     "query_p90_ms": percentile(lat, 90),
                     "query_p99_ms": percentile(lat, 99),
                     "slowest": slowest}, results)
        return ({"index_msgs_per_s": len(messages) / dt,
                 "index_bytes_ratio": index_bytes
                 / sum(len(m) for m in messages),
                 "query_p50_ms": percentile(lat, 50),
                 "query_p90_ms": percentile(lat, 90),
                 "query_p99_ms": percentile(lat, 99),
                 "peak_rss_kb": rss, "slowest": slowest}, results)

    out, problems, err = storage._in_instance(harness, kwargs, timeout, body)
    if err:
        log("fts %s failed: %s" % (name, err))
        return {"error": err}, None
    res, results = out
    if problems:
        res["log_problems"] = problems[:3]
    return res, results


def run_fts(harness, messages, size, log, workdir="/tmp"):
    n = size.get("fts_messages") or len(messages)
    msgs = messages[:n]
    log("fts: %d messages, engines %s" % (len(msgs), ", ".join(ENGINES)))
    out = {"status": "ok", "messages": len(msgs),
           "mail_bytes": sum(len(m) for m in msgs), "queries": QUERIES,
           "engines": {}}
    oracle_res, oracle = run_fts5(msgs, workdir)
    searches = search_set(msgs)
    out["searches"] = searches
    out["search_kinds"] = {
        "terms": len(QUERIES), "fixed": len(FIXED_SEARCHES),
        "generated": len(searches) - len(QUERIES) - len(FIXED_SEARCHES)}
    log("fts: dovecot-nofts (the substring oracle)")
    nofts, nofts_results = run_engine(harness, "dovecot-nofts", msgs, log,
                                      size["peer_timeout"], searches)
    out["engines"]["dovecot-nofts"] = nofts
    for name in ENGINE_CONFIGS:
        if name == "dovecot-nofts" or name not in size.get(
                "fts_engines", ENGINE_CONFIGS):
            continue
        log("fts: %s" % name)
        res, results = run_engine(harness, name, msgs, log,
                                  size["peer_timeout"], searches)
        if results is not None and nofts_results is not None:
            differ = [q for q in searches
                      if results[q] != nofts_results[q]]
            res["uids_differ"] = len(differ)
            res["uids_missing"] = sum(
                1 for q in differ if nofts_results[q] - results[q])
            res["differ_examples"] = [list(q) for q in differ[:10]]
        if results is not None:
            same = [results[q] == oracle[q] for q in QUERIES]
            jac = [len(results[q] & oracle[q]) / len(results[q] | oracle[q])
                   if results[q] | oracle[q] else 1.0 for q in QUERIES]
            res["agreement"] = sum(same) / len(same)
            res["jaccard"] = sum(jac) / len(jac)
            res["hits"] = {q: len(results[q]) for q in QUERIES}
        out["engines"][name] = res
    oracle_res["agreement"] = 1.0
    oracle_res["jaccard"] = 1.0
    oracle_res["hits"] = {q: len(oracle[q]) for q in QUERIES}
    out["engines"]["sqlite-fts5"] = oracle_res
    return out


if __name__ == "__main__":
    _main()
