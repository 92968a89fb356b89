#!/usr/bin/env python3
"""Sealed packs in object storage against local packs (issue 22): LMTP
deliveries/s, IMAP FETCH MB/s with a cold and a warm pack cache, and
bytes in the object store per mail byte, for casbox_pack_storage =
local, rados (an erasure-coded k=2 m=1 pool over 3 memstore OSDs) and s3
(radosgw on the same private cluster), all on 127.0.0.1:

  CASBOX_TOP_BUILDDIR=$PWD/build python3 bench/objstore.py -n 600

Each backend gets a fresh Dovecot and the same messages (corpus mail,
every tenth a 300 kB attachment so that 4 MiB packs rotate and upload
while the deliveries run). Then `doveadm casbox upload -s` moves every
pack out; "cold" FETCHes every message with the cache dropped (each
message's blocks come from the store), "warm" does it again. Ratios are
against local packs in the same run; speed is reported, never asserted.
Needs root and Ceph (the tests' fixture, tests/e2e/ceph_cluster.py)."""

import argparse
import base64
import glob
import json
import os
import random
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

from ceph_cluster import CephCluster  # noqa: E402
from dovecot_harness import (Dovecot, corpus_files, crlf,  # noqa: E402
                             ensure_test_user)

USER = "objbench"
KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
ACCESS, SECRET = "CASBOXBENCHACCESS001", "casbox-bench-secret-0123456789"


def messages(n):
    rnd = random.Random(22)
    paths = corpus_files("usrp-users-3000", limit=n)
    out = []
    for i, p in enumerate(paths):
        with open(p, "rb") as f:
            m = f.read()
        if i % 10 == 0:
            att = base64.encodebytes(rnd.randbytes(225 * 1024))
            m = (b"MIME-Version: 1.0\nContent-Type: multipart/mixed; "
                 b"boundary=XX\nSubject: att %d\n\n--XX\nContent-Type: "
                 b"text/plain\n\n" % i + m[-2000:] + b"\n--XX\n"
                 b"Content-Type: application/octet-stream\n"
                 b"Content-Transfer-Encoding: base64\n\n" + att +
                 b"--XX--\n")
        out.append(crlf(m))
    return out


def fetch_all(dc):
    imap = dc.imap_login(USER)
    imap.select("INBOX", readonly=True)
    t = time.monotonic()
    typ, data = imap.uid("FETCH", "1:*", "(BODY.PEEK[])")
    dt = time.monotonic() - t
    assert typ == "OK", data
    got = sum(len(x[1]) for x in data if isinstance(x, tuple))
    imap.logout()
    return got, dt


def stored_bytes(packs):
    """Bytes of the packs: local files, and for uploaded ones the size
    in their stub (the object's size, checked at upload)."""
    total = sum(os.path.getsize(p) for p in
                glob.glob(os.path.join(packs, "pack-*.cbp")))
    for p in glob.glob(os.path.join(packs, "pack-*.cbr")):
        with open(p, "rb") as f:
            total += int.from_bytes(f.read()[16:24], "little")
    return total


def run_backend(name, spec, msgs, conf=""):
    settings = dict(KEYS, casbox_pack_size="4M",
                    casbox_pack_storage=spec, casbox_pack_cache_size="2G")
    with Dovecot(mail_plugins=["casbox"], plugin_settings=settings,
                 extra_conf=conf) as dc:
        t = time.monotonic()
        dc.lmtp_deliver_many(USER, msgs)
        deliver = time.monotonic() - t
        if spec != "local":
            dc.doveadm("casbox", "upload", "-s", "-u", USER)
        cache = os.path.join(dc.home(USER), "casbox", "packs", "cache")
        shutil.rmtree(cache, ignore_errors=True)
        cold_bytes, cold = fetch_all(dc)
        warm_bytes, warm = fetch_all(dc)
        assert cold_bytes == warm_bytes
        stored = stored_bytes(os.path.join(dc.home(USER), "casbox",
                                           "packs"))
    return {
        "backend": name,
        "deliveries_per_s": len(msgs) / deliver,
        "fetch_cold_MBps": cold_bytes / cold / 1e6,
        "fetch_warm_MBps": warm_bytes / warm / 1e6,
        "stored_bytes": stored,
        "fetched_bytes": cold_bytes,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=600)
    ap.add_argument("--json")
    args = ap.parse_args()
    why = CephCluster.available()
    if why:
        sys.exit("objstore bench: " + why)
    pw = ensure_test_user()
    msgs = messages(args.n)
    mail_bytes = sum(len(m) for m in msgs)
    rows = []
    with CephCluster(osds=3) as ceph:
        ceph.ec_pool("bench-packs", k=2, m=1)
        keyring = ceph.client_key("casbox", ["bench-packs"],
                                  owner=pw.pw_name)
        url = ceph.start_rgw(ACCESS, SECRET, "bench")
        creds = os.path.join(ceph.dir, "s3.creds")
        with open(creds, "w") as f:
            f.write("%s\n%s\n" % (ACCESS, SECRET))
        os.chmod(creds, 0o600)
        os.chown(creds, pw.pw_uid, pw.pw_gid)

        rows.append(run_backend("local", "local", msgs))
        rows.append(run_backend(
            "rados EC 2+1", "rados:pool=bench-packs,mon_host=v1:127.0.0.1:"
            "%d,id=casbox,keyring=%s,prefix=%%u/" % (ceph.port, keyring),
            msgs, conf="default_vsz_limit = 1G\n"))
        rows.append(run_backend(
            "s3 (radosgw)", "s3:url=%s/bench,credentials=%s,prefix=%%u/"
            % (url, creds), msgs))
    base = rows[0]
    print("%d messages, %.1f MB of mail" % (len(msgs), mail_bytes / 1e6))
    print("%-14s %10s %8s %10s %8s %10s %8s %12s" % (
        "backend", "deliv/s", "ratio", "cold MB/s", "ratio", "warm MB/s",
        "ratio", "stored/mail"))
    for r in rows:
        print("%-14s %10.1f %8.2f %10.1f %8.2f %10.1f %8.2f %12.3f" % (
            r["backend"], r["deliveries_per_s"],
            r["deliveries_per_s"] / base["deliveries_per_s"],
            r["fetch_cold_MBps"],
            r["fetch_cold_MBps"] / base["fetch_cold_MBps"],
            r["fetch_warm_MBps"],
            r["fetch_warm_MBps"] / base["fetch_warm_MBps"],
            r["stored_bytes"] / mail_bytes))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"messages": len(msgs), "mail_bytes": mail_bytes,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
