"""Storage suite: every peer is a real Dovecot configuration started by the
e2e harness (tests/e2e/dovecot_harness.py) on loopback, measured in the
same run, in interleaved order.

Per peer and round (a fresh Dovecot instance each time):
  1. LMTP-deliver the message set to INBOX (timed: deliveries/s), then
     bytes on disk of the user's home;
  2. LMTP-deliver it again to a second folder (user+Second, timed) and
     measure again (what a second copy costs: dedup/SIS show here);
  3. IMAP APPEND the set one message per command (LITERAL+, timed);
  4. UID FETCH BODY.PEEK[] of INBOX (timed, MB/s) and check every
     delivered message came back with its bytes;
  5. round 1 only: build a large mailbox with MULTIAPPEND and time SELECT
     and STATUS on fresh connections.
VmHWM (peak RSS) of the imap and lmtp processes is read from /proc at the
end of each phase. mail_fsync = optimized (Dovecot's default) is set
explicitly for every peer."""

import os
import signal
import subprocess
import sys
import threading
import time
import traceback

from imapraw import RawIMAP
from stats import summarize

COMMON_CONF = """mail_fsync = optimized
recipient_delimiter = +
lmtp_save_to_detail_mailbox = yes
lda_mailbox_autocreate = yes
"""

USER = "bench1"
LARGE_USER = "benchlarge"
SPACE_USER = "benchspace"


def peer_configs(keydir):
    """(name, harness kwargs). casbox last so a failure there never hides
    a peer row."""
    crypt = {
        "mail_crypt_global_private_key": "<%s/ecprivkey.pem" % keydir,
        "mail_crypt_global_public_key": "<%s/ecpubkey.pem" % keydir,
        "mail_crypt_save_version": "2",
    }
    zstd = {"zlib_save": "zstd"}
    peers = []
    for fmt, loc in (("maildir", "maildir:~/Maildir"),
                     ("sdbox", "sdbox:~/sdbox"),
                     ("mdbox", "mdbox:~/mdbox")):
        peers.append((fmt, dict(mail_location=loc, mail_plugins=[])))
        peers.append((fmt + "+zstd", dict(mail_location=loc,
                                          mail_plugins=["zlib"],
                                          plugin_settings=zstd)))
    peers.append(("mdbox+SIS", dict(
        mail_location="mdbox:~/mdbox", mail_plugins=[],
        extra_conf="mail_attachment_dir = %h/attachments\n")))
    # what an admin would pick: compressed, attachments single-instance
    peers.append(("mdbox+zstd+SIS", dict(
        mail_location="mdbox:~/mdbox", mail_plugins=["zlib"],
        plugin_settings=zstd,
        extra_conf="mail_attachment_dir = %h/attachments\n")))
    peers.append(("sdbox+mail_crypt", dict(
        mail_location="sdbox:~/sdbox", mail_plugins=["mail_crypt"],
        plugin_settings=crypt)))
    peers.append(("casbox", dict(
        mail_location="casbox:~/casbox", mail_plugins=["casbox"],
        plugin_settings={"casbox_key_file": "%h/casbox.key",
                         "casbox_key_autocreate": "yes"})))
    # casbox without cross-message compression: an A/B of the setting
    # in one run, only when named (--peers casbox,casbox-noxmsg); it is
    # not a peer casbox is compared with
    peers.append(("casbox-noxmsg", dict(
        mail_location="casbox:~/casbox", mail_plugins=["casbox"],
        plugin_settings={"casbox_key_file": "%h/casbox.key",
                         "casbox_key_autocreate": "yes",
                         "casbox_cross_message": "no"})))
    # casbox at zstd level 6 (the default is 3, as the zlib plugin's):
    # an A/B of casbox_zstd_level, opt-in as above
    peers.append(("casbox-zstd6", dict(
        mail_location="casbox:~/casbox", mail_plugins=["casbox"],
        plugin_settings={"casbox_key_file": "%h/casbox.key",
                         "casbox_key_autocreate": "yes",
                         "casbox_zstd_level": "6"})))
    # casbox with the defaults before 2026-12-05 (casbox_lsm_wal_size
    # 256k, now 64k; no casbox_dict_autotrain, now 200): an A/B of
    # both, opt-in as above
    peers.append(("casbox-1204", dict(
        mail_location="casbox:~/casbox", mail_plugins=["casbox"],
        plugin_settings={"casbox_key_file": "%h/casbox.key",
                         "casbox_key_autocreate": "yes",
                         "casbox_lsm_wal_size": "256k",
                         "casbox_dict_autotrain": "0"})))
    return peers


# run only when --peers names them
OPT_IN_PEERS = {"casbox-noxmsg", "casbox-zstd6", "casbox-1204"}


# the peers a run measures unless --peers names others
PEER_NAMES = [n for n, _ in peer_configs("/nonexistent")
              if n not in OPT_IN_PEERS]


def make_crypt_keys(keydir):
    """EC key pair for mail_crypt's global-key mode, made with openssl."""
    os.makedirs(keydir, exist_ok=True)
    priv = os.path.join(keydir, "ecprivkey.pem")
    pub = os.path.join(keydir, "ecpubkey.pem")
    # Dovecot's dcrypt wants PKCS#8 ("BEGIN PRIVATE KEY"), not the SEC1
    # form ecparam writes, hence the pkey conversion (as its docs do).
    sec1 = subprocess.run(["openssl", "ecparam", "-name", "prime256v1",
                           "-genkey", "-noout"], check=True,
                          capture_output=True).stdout
    subprocess.run(["openssl", "pkey", "-out", priv], input=sec1,
                   check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", priv, "-pubout", "-out", pub],
                   check=True, capture_output=True)
    os.chmod(priv, 0o644)


def disk_usage(path):
    """(allocated bytes, apparent bytes, allocated bytes of Dovecot's own
    index/cache/list files) under path."""
    alloc = apparent = index = 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            alloc += st.st_blocks * 512
            if name in files:
                apparent += st.st_size
                if name.startswith("dovecot.") or name.startswith(
                        "dovecot-"):
                    index += st.st_blocks * 512
    return alloc, apparent, index


def vm_hwm_kb(pids):
    best = 0
    for pid in pids:
        try:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        best = max(best, int(line.split()[1]))
        except OSError:
            pass
    return best


def _norm(b):
    return b.replace(b"\r\n", b"\n").rstrip(b"\n")


class PeerRun:
    """One peer in one round, inside one Dovecot instance."""

    def __init__(self, dc, messages, size, log, password):
        self.dc = dc
        self.messages = messages
        self.size = size
        self.log = log
        self.password = password
        self.rss = {"imap_kb": 0, "lmtp_kb": 0}
        self.res = {}

    def sample_rss(self):
        self.rss["imap_kb"] = max(self.rss["imap_kb"],
                                  vm_hwm_kb(self.dc.pids("imap")))
        self.rss["lmtp_kb"] = max(self.rss["lmtp_kb"],
                                  vm_hwm_kb(self.dc.pids("lmtp")))

    def imap(self, user=USER):
        c = RawIMAP(self.dc.imap_port)
        c.login(user, self.password)
        return c

    def deliver(self, rcpt):
        t0 = time.perf_counter()
        self.dc.lmtp_deliver_many(rcpt, self.messages)
        dt = time.perf_counter() - t0
        self.sample_rss()
        return len(self.messages) / dt

    def run(self, first_round):
        dc, res = self.dc, self.res
        home = dc.home(USER)
        res["lmtp_per_s"] = [self.deliver(USER)]
        res["disk1"] = disk_usage(home)
        res["lmtp_per_s"].append(self.deliver(USER + "+Second"))
        res["disk2"] = disk_usage(home)

        with self.imap() as c:
            c.create("Appended")
            t0 = time.perf_counter()
            for msg in self.messages:
                c.append("Appended", msg)
            res["append_per_s"] = len(self.messages) / (
                time.perf_counter() - t0)
            self.sample_rss()

        res["fetch_mbps"] = []
        with self.imap() as c:
            n = c.select("INBOX")
            res["inbox_exists"] = n
            for rep in range(self.size["fetch_repeats"]):
                got = {}
                t0 = time.perf_counter()
                total = c.fetch_bodies("1:*", got.__setitem__)
                dt = time.perf_counter() - t0
                res["fetch_mbps"].append(total / dt / 1e6)
                if rep == 0:
                    res["fetched"] = len(got)
                    res["intact"] = sum(
                        1 for i, m in enumerate(self.messages)
                        if (i + 1) in got
                        and _norm(got[i + 1]).endswith(_norm(m)))
            self.sample_rss()
        res["rss"] = dict(self.rss)
        return res

    def space(self, corpus):
        """Bytes on disk for a whole corpus saved twice (INBOX, then a
        second folder) by MULTIAPPEND, for a user of its own. Untimed."""
        res = self.res
        home = self.dc.home(SPACE_USER)
        with self.imap(SPACE_USER) as c:
            c.create("Second")
            for box, key in (("INBOX", "space1"), ("Second", "space2")):
                batch, nbytes = [], 0
                for msg in corpus:
                    batch.append(msg)
                    nbytes += len(msg)
                    if len(batch) >= 100 or nbytes >= 8000000:
                        c.append(box, batch)
                        batch, nbytes = [], 0
                if batch:
                    c.append(box, batch)
                res[key] = disk_usage(home)
            res["space_exists"] = c.status("INBOX").decode(
                "latin-1").strip()
        res["space_messages"] = len(corpus)
        res["space_bytes"] = sum(len(m) for m in corpus)

    def large(self):
        """Large mailbox for SELECT/STATUS latency: large_base corpus
        messages (the smaller half of the sample, repeated) saved by
        MULTIAPPEND, then COPY 1:k doubling the mailbox until it holds
        `large` messages. COPY keeps the build within minutes even where a
        save is expensive (mail_crypt makes a key per message); the index
        and cache records are the same either way."""
        res, n = self.res, self.size["large"]
        pool = sorted(self.messages, key=len)[:max(1, len(self.messages)
                                                   // 2)]
        batch = self.size["large_batch"]
        base = min(n, self.size.get("large_base", n))
        t0 = time.perf_counter()
        with self.imap(LARGE_USER) as c:
            done = 0
            while done < base:
                k = min(batch, base - done)
                c.append("INBOX", [pool[(done + j) % len(pool)]
                                   for j in range(k)])
                done += k
            if done < n:
                c.select("INBOX")
                while done < n:
                    k = min(done, n - done)
                    c.command("COPY 1:%d INBOX" % k)
                    done += k
            self.sample_rss()
        res["large_build_s"] = time.perf_counter() - t0
        sel, st = [], []
        for _ in range(self.size["latency_repeats"]):
            with self.imap(LARGE_USER) as c:
                t0 = time.perf_counter()
                status = c.status("INBOX")
                st.append((time.perf_counter() - t0) * 1000)
            with self.imap(LARGE_USER) as c:
                t0 = time.perf_counter()
                exists = c.select("INBOX")
                sel.append((time.perf_counter() - t0) * 1000)
                self.sample_rss()
        res["large_exists"] = exists
        res["large_status"] = status.decode("latin-1").strip()
        res["select_ms"] = sel
        res["status_ms"] = st


def _instance_pids(dc):
    """Pids of the Dovecot processes of this one instance: every process
    whose command line names its private config or temp dir, and the
    children of its master."""
    tmp = dc.tmp
    if not tmp:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if tmp.encode() in cmd or (os.path.basename(tmp).encode() in cmd
                                   and b"dovecot" in cmd):
            found.append(int(entry))
    if dc.master_pid:
        found.extend(p for p in dc.pids("imap") + dc.pids("lmtp"))
        found.append(dc.master_pid)
    return sorted(set(found))


def _kill_instance(dc, fired):
    fired.append(True)
    for pid in _instance_pids(dc):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _describe_failure(e, dc, fired, timeout):
    msg = "%s: %s" % (type(e).__name__, str(e).strip())
    first = msg.splitlines()[0] if msg else type(e).__name__
    try:
        logged = dc.log_problems()
    except Exception:  # noqa: BLE001 - the log is only a hint
        logged = []
    if logged:
        first += " / log: " + logged[0].split(": ", 1)[-1][-200:]
    if fired:
        first = "timed out after %d s (%s)" % (timeout, first)
    return first[:400]


def _in_instance(harness, kwargs, timeout, body):
    """_in_instance_once, tried a second time when Dovecot never came up
    (seen once on the loaded machine: master.pid missing after the start
    command returned); a failure after start is never retried."""
    out = _in_instance_once(harness, kwargs, timeout, body)
    if out[2] is not None and out[2].startswith("start: "):
        out = _in_instance_once(harness, kwargs, timeout, body)
    if out[2] is not None and out[2].startswith("start: "):
        out = (None, None, out[2][len("start: "):])
    return out


def _in_instance_once(harness, kwargs, timeout, body):
    """Start one Dovecot with kwargs, run body(dc), stop it. Returns
    (result, log problems, None) or (None, None, error text). A peer that
    hangs (casbox under construction) must not stall the whole run: after
    `timeout` seconds its Dovecot processes are killed, which makes the
    blocked client call fail and the peer an error row."""
    dc = harness.Dovecot(**kwargs)
    fired = []
    watchdog = threading.Timer(timeout, _kill_instance, (dc, fired))
    watchdog.daemon = True
    watchdog.start()
    try:
        try:
            dc.start()
        except Exception as e:  # noqa: BLE001 - reported, maybe retried
            err = _describe_failure(e, dc, fired, timeout)
            _kill_instance(dc, [])  # a master may be up without its pid
            dc.__exit__(type(e), e, None)
            return None, None, "start: " + err
        try:
            out = body(dc)
            problems = dc.log_problems()
        except Exception as e:  # noqa: BLE001 - any failure becomes a row
            if os.environ.get("CASBOX_BENCH_DEBUG"):
                traceback.print_exc(file=sys.stderr)
            err = _describe_failure(e, dc, fired, timeout)
            dc.__exit__(type(e), e, None)
            return None, None, err
        # Log problems go into the report instead of failing the bench.
        dc.allow_log(".")
        dc.__exit__(None, None, None)
        return out, problems, None
    finally:
        watchdog.cancel()


def run_peer(harness, name, kwargs, messages, size, log, first_round,
             space_corpus=None):
    """Returns the result dict, or {"error": "..."} when the peer fails
    (casbox may not work yet: the run goes on and the report says so)."""
    kwargs = dict(kwargs)
    kwargs["extra_conf"] = COMMON_CONF + kwargs.get("extra_conf", "")
    t0 = time.perf_counter()
    res, problems, err = _in_instance(
        harness, kwargs, size["peer_timeout"],
        lambda dc: PeerRun(dc, messages, size, log,
                           harness.PASSWORD).run(first_round))
    if err:
        log("%s failed: %s" % (name, err))
        return {"error": err}
    if first_round and (size["large"] or space_corpus):
        # The large mailbox is only there to be SELECTed and STATUSed: it
        # is built in a second instance with mail_fsync = never, so that
        # 100k messages in the one-file-per-message formats take minutes,
        # not an hour. SELECT and STATUS only read.
        kw2 = dict(kwargs)
        kw2["extra_conf"] = kwargs["extra_conf"] + "mail_fsync = never\n"

        def large(dc):
            pr = PeerRun(dc, messages, size, log, harness.PASSWORD)
            if space_corpus:
                pr.space(space_corpus)
            pr.large()
            pr.res["rss_large"] = dict(pr.rss)
            return pr.res
        lres, lprob, lerr = _in_instance(harness, kw2, size["peer_timeout"],
                                         large)
        if lerr:
            log("%s large mailbox failed: %s" % (name, lerr))
            res["large_error"] = lerr
        else:
            res.update(lres)
            problems += lprob
    res["log_problems"] = problems[:5]
    res["wall_s"] = time.perf_counter() - t0
    return res


def run_storage(harness, messages, size, rounds, keydir, log,
                only=None, space_corpus=None):
    make_crypt_keys(keydir)
    peers = [(n, kw) for n, kw in peer_configs(keydir)
             if (only is None and n not in OPT_IN_PEERS) or
             (only is not None and n in only)]
    out = {n: [] for n, _ in peers}
    for r in range(rounds):
        # Interleave: rotate (and reverse every other round) so no peer
        # always runs first or right after the same neighbour.
        k = r % max(1, len(peers))
        order = peers[k:] + peers[:k]
        if r % 2:
            order.reverse()
        for name, kw in order:
            log("storage round %d/%d: %s" % (r + 1, rounds, name))
            out[name].append(run_peer(harness, name, kw, messages, size,
                                      log, first_round=(r == 0),
                                      space_corpus=space_corpus))
    return out


def summarize_peer(runs, corpus_bytes):
    """Fold the rounds of one peer into medians with spread."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[0]["error"] if runs else "not run"}
    first = ok[0]
    s = {
        "rounds": len(ok),
        "disk1_ratio": first["disk1"][0] / corpus_bytes,
        "disk2_ratio": first["disk2"][0] / (2 * corpus_bytes),
        "disk1_bytes": first["disk1"][0],
        "disk2_bytes": first["disk2"][0],
        "index1_bytes": first["disk1"][2],
        "lmtp_per_s": summarize([v for r in ok for v in r["lmtp_per_s"]]),
        "append_per_s": summarize([r["append_per_s"] for r in ok]),
        "fetch_mbps": summarize([v for r in ok for v in r["fetch_mbps"]]),
        "fetched": first["fetched"],
        "intact": first["intact"],
        "inbox_exists": first["inbox_exists"],
        "imap_rss_kb": max(r["rss"]["imap_kb"] for r in ok),
        "lmtp_rss_kb": max(r["rss"]["lmtp_kb"] for r in ok),
        "log_problems": first.get("log_problems", []),
    }
    if "select_ms" in first:
        s["select_ms"] = summarize(first["select_ms"])
        s["status_ms"] = summarize(first["status_ms"])
        s["large_exists"] = first["large_exists"]
        s["large_build_s"] = first["large_build_s"]
        s["imap_large_rss_kb"] = first["rss_large"]["imap_kb"]
    if "space1" in first:
        s["space_messages"] = first["space_messages"]
        s["space_bytes"] = first["space_bytes"]
        s["space1_ratio"] = first["space1"][0] / first["space_bytes"]
        s["space2_ratio"] = first["space2"][0] / (2 * first["space_bytes"])
        s["space1_alloc"] = first["space1"][0]
        s["space2_alloc"] = first["space2"][0]
        s["space1_index"] = first["space1"][2]
    if "large_error" in first:
        s["large_error"] = first["large_error"]
    errs = [r["error"] for r in runs if "error" in r]
    if errs:
        s["failed_rounds"] = errs
    return s
