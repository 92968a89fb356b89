"""A private Ceph cluster for the object-storage tests: one mon and N
OSDs (memstore: RAM only) on 127.0.0.1, no mgr and no systemd, under a
temporary directory, cephx on. Bring-up takes seconds; stop() kills the
OSDs (and radosgw) before the mon and removes everything.

    with CephCluster(osds=3) as ceph:
        ceph.pool("packs")                    # replicated, size 1
        ceph.ec_pool("packs-ec", k=2, m=1)    # erasure-coded
        ceph.client_key("casbox", "packs", owner="casboxtest")
        ceph.kill_osd(1)                      # SIGKILL one OSD

Nothing listens beyond 127.0.0.1. CephCluster.available() says why a
test must skip (binaries missing: the Debian 13 root of the Dovecot 2.4
pass has no Ceph)."""

import hashlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid

BINARIES = ("ceph-mon", "ceph-osd", "ceph", "monmaptool", "ceph-authtool")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CephError(Exception):
    pass


class CephCluster:
    @staticmethod
    def available():
        """None if a cluster can start here, else why not."""
        missing = [b for b in BINARIES if shutil.which(b) is None]
        if missing:
            return ("ceph not installed in this root (%s missing; "
                    "scripts/setup installs ceph-mon ceph-osd on Debian 12)"
                    % ", ".join(missing))
        if os.geteuid() != 0:
            return "the Ceph tests run as root (they start ceph-mon/osd)"
        return None

    def __init__(self, osds=1, deadline=60):
        self.osds = osds
        self.deadline = deadline
        self.dir = tempfile.mkdtemp(prefix="cbx-ceph-")
        os.chmod(self.dir, 0o755)
        self.port = _free_port()
        self.fsid = str(uuid.uuid4())
        self.conf = os.path.join(self.dir, "ceph.conf")
        self.keyring = os.path.join(self.dir, "keyring")
        self.procs = {}
        self.rgw = None

    # -- bring-up ---------------------------------------------------
    def _write_conf(self):
        d = self.dir
        with open(self.conf, "w") as f:
            f.write(f"""[global]
fsid = {self.fsid}
mon host = v1:127.0.0.1:{self.port}
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr2 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = {self.keyring}
run dir = {d}/run
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid
log file = {d}/log/$name.log
mon data = {d}/mon/$cluster-$id
osd data = {d}/osd/$cluster-$id
osd objectstore = memstore
memstore device bytes = 1073741824
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool delete = true
mon allow pool size one = true
mon warn on pool no redundancy = false
osd heartbeat interval = 1
osd heartbeat grace = 4
mon osd min down reporters = 1
osd op queue = wpq
osd max object size = 268435456
osd pool default pg num = 8
osd pool default pgp num = 8
[osd]
keyring = {d}/osd/$cluster-$id/keyring
""")
        for sub in ("run", "log", "mon", "osd"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)

    def _run(self, *args, input=None, timeout=30):
        p = subprocess.run(list(args), input=input, capture_output=True,
                           text=True, timeout=timeout)
        if p.returncode != 0:
            raise CephError("%s failed (%d): %s" % (
                " ".join(args), p.returncode, (p.stderr or p.stdout)[-2000:]))
        return p.stdout

    def ceph(self, *args, timeout=30):
        return self._run("ceph", "-c", self.conf, "--connect-timeout",
                         "15", *args, timeout=timeout)

    def _start_daemon(self, name, argv):
        # -f: in the foreground, so the Popen is the daemon (kill/wait)
        log = open(os.path.join(self.dir, "log", name + ".out"), "w")
        self.procs[name] = subprocess.Popen(
            argv + ["-f", "-c", self.conf], stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def start(self):
        self._write_conf()
        kr = self.keyring
        self._run("ceph-authtool", "--create-keyring", kr, "--gen-key",
                  "-n", "mon.", "--cap", "mon", "allow *")
        self._run("ceph-authtool", kr, "--gen-key", "-n", "client.admin",
                  "--cap", "mon", "allow *", "--cap", "osd", "allow *",
                  "--cap", "mgr", "allow *")
        monmap = os.path.join(self.dir, "monmap")
        self._run("monmaptool", "--create", "--addv", "a",
                  "[v1:127.0.0.1:%d]" % self.port, "--fsid", self.fsid,
                  monmap)
        self._run("ceph-mon", "-c", self.conf, "--mkfs", "-i", "a",
                  "--monmap", monmap, "--keyring", kr)
        self._start_daemon("mon.a", ["ceph-mon", "-i", "a"])
        self.ceph("status", timeout=60)
        for i in range(self.osds):
            self.add_osd()
        self.wait_osds_up(self.osds)
        return self

    def add_osd(self):
        osd_uuid = str(uuid.uuid4())
        osd_id = int(self.ceph("osd", "new", osd_uuid).strip())
        data = os.path.join(self.dir, "osd", "ceph-%d" % osd_id)
        os.makedirs(data, exist_ok=True)
        self._run("ceph-osd", "-c", self.conf, "-i", str(osd_id), "--mkfs",
                  "--mkkey", "--no-mon-config", "--osd-uuid", osd_uuid,
                  timeout=60)
        self.ceph("auth", "add", "osd.%d" % osd_id, "osd", "allow *",
                  "mon", "allow profile osd", "-i",
                  os.path.join(data, "keyring"))
        self._start_daemon("osd.%d" % osd_id,
                           ["ceph-osd", "-i", str(osd_id)])
        return osd_id

    def _osd_up_count(self):
        import json
        out = json.loads(self.ceph("osd", "dump", "--format", "json"))
        return sum(1 for o in out["osds"] if o["up"] == 1)

    def wait_osds_up(self, n):
        """Poll (bounded) until n OSDs are up in the osd map."""
        end = time.monotonic() + self.deadline
        while self._osd_up_count() < n:
            self._check_alive()
            if time.monotonic() > end:
                raise CephError("OSDs did not come up; logs in %s"
                                % self.dir)
            time.sleep(0.2)

    def wait_osds_down(self, n_up):
        end = time.monotonic() + self.deadline
        while self._osd_up_count() > n_up:
            if time.monotonic() > end:
                raise CephError("OSD not marked down")
            time.sleep(0.2)

    def _check_alive(self):
        for name, p in self.procs.items():
            if p.poll() is not None and not name.startswith("killed"):
                raise CephError("%s exited (%s); log %s/log/%s.log" % (
                    name, p.returncode, self.dir, name))

    # -- pools and keys ---------------------------------------------
    def pool(self, name, pgs=8):
        self.ceph("osd", "pool", "create", name, str(pgs), str(pgs),
                  "replicated")
        self.ceph("osd", "pool", "application", "enable", name, "casbox")
        self.wait_pool_active(name)

    def ec_pool(self, name, k=2, m=1, pgs=8):
        prof = "cbx-k%dm%d" % (k, m)
        self.ceph("osd", "erasure-code-profile", "set", prof, "k=%d" % k,
                  "m=%d" % m, "crush-failure-domain=osd")
        self.ceph("osd", "pool", "create", name, str(pgs), str(pgs),
                  "erasure", prof)
        # reads and writes go on with one OSD of k+m down
        self.ceph("osd", "pool", "set", name, "min_size", str(k))
        self.ceph("osd", "pool", "application", "enable", name, "casbox")
        self.wait_pool_active(name)

    def wait_pool_active(self, name):
        """A write through rados succeeds: the pool's PGs are active."""
        end = time.monotonic() + self.deadline
        probe = os.path.join(self.dir, "probe")
        with open(probe, "wb") as f:
            f.write(b"x")
        while True:
            p = subprocess.run(
                ["rados", "-c", self.conf, "-p", name, "put",
                 "cbx-probe", probe, "--rados-osd-op-timeout", "3"],
                capture_output=True, timeout=30)
            if p.returncode == 0:
                subprocess.run(["rados", "-c", self.conf, "-p", name,
                                "rm", "cbx-probe"], capture_output=True,
                               timeout=30)
                return
            if time.monotonic() > end:
                raise CephError("pool %s never became writable: %s"
                                % (name, p.stderr[-500:]))
            time.sleep(0.2)

    def client_key(self, client, pools, owner=None):
        """A cephx key for client.<client> with rw on pools, in a
        keyring file readable only by owner. Returns its path."""
        caps = ", ".join("allow rwx pool=%s" % p for p in pools)
        path = os.path.join(self.dir, "client.%s.keyring" % client)
        out = self.ceph("auth", "get-or-create", "client." + client,
                        "mon", "allow r", "osd", caps)
        with open(path, "w") as f:
            f.write(out)
        os.chmod(path, 0o600)
        if owner is not None:
            pw = pwd.getpwnam(owner)
            os.chown(path, pw.pw_uid, pw.pw_gid)
        os.chmod(self.dir, 0o755)
        os.chmod(self.conf, 0o644)
        return path

    # -- radosgw (S3) ---------------------------------------------------
    def start_rgw(self, access_key, secret_key, bucket):
        """radosgw on 127.0.0.1 (beast), an S3 user with these keys and
        one bucket. Returns the endpoint URL. Bounded poll until it
        answers (its first start creates its pools)."""
        port = _free_port()
        kr = os.path.join(self.dir, "rgw.keyring")
        with open(kr, "w") as f:
            f.write(self.ceph("auth", "get-or-create", "client.rgw.a",
                              "mon", "allow rw", "osd", "allow rwx"))
        self.rgw_argv = [
            "radosgw", "-n", "client.rgw.a", "--keyring", kr,
            "--rgw-frontends", "beast endpoint=127.0.0.1:%d" % port,
            "--rgw-dns-name", "localhost",
            "--rgw-thread-pool-size", "16"]
        self.rgw_port = port
        self._start_rgw()
        url = "http://127.0.0.1:%d" % port
        self._run("radosgw-admin", "-c", self.conf, "user", "create",
                  "--uid=casbox", "--display-name=casbox",
                  "--access-key=" + access_key, "--secret=" + secret_key,
                  timeout=60)
        self.s3_curl(url, access_key, secret_key, "PUT", "/" + bucket)
        self.rgw = url
        return url

    def _start_rgw(self):
        self._start_daemon("rgw.a", self.rgw_argv)
        end = time.monotonic() + self.deadline
        while True:
            self._check_alive()
            try:
                with socket.create_connection(("127.0.0.1", self.rgw_port),
                                              1):
                    return
            except OSError:
                if time.monotonic() > end:
                    raise CephError("radosgw did not listen")
                time.sleep(0.1)

    def kill_rgw(self):
        p = self.procs.pop("rgw.a")
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)

    def restart_rgw(self):
        self._start_rgw()

    def s3_curl(self, url, access_key, secret_key, method, path,
                data=None, check=True):
        """One signed S3 request with curl --aws-sigv4 (an independent
        client, for fixtures and for checking what the store holds)."""
        cmd = ["curl", "-sS", "-o", "-", "-w", "\n%{http_code}",
               "--aws-sigv4", "aws:amz:us-east-1:s3",
               "--user", "%s:%s" % (access_key, secret_key), "-X", method,
               "-H", "x-amz-content-sha256: " + hashlib.sha256(
                   data or b"").hexdigest()]
        if data is not None:
            cmd += ["--data-binary", "@-"]
        cmd.append(url + path)
        end = time.monotonic() + self.deadline
        while True:
            p = subprocess.run(cmd, capture_output=True, timeout=60,
                               input=data)
            body, _, code = p.stdout.rpartition(b"\n")
            if p.returncode == 0 and code.startswith(b"2"):
                return body
            # rgw answers 5xx while it still creates its pools
            if not check or (not code.startswith(b"5") and code != b"000"):
                if check:
                    raise CephError("%s %s: %s %s" % (method, path, code,
                                                       body[-300:]))
                return body
            if time.monotonic() > end:
                raise CephError("%s %s never succeeded" % (method, path))
            time.sleep(0.3)

    # -- faults -----------------------------------------------------
    def kill_osd(self, osd_id):
        p = self.procs.pop("osd.%d" % osd_id)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        self.procs["killed.osd.%d" % osd_id] = p

    def stop_mon(self):
        p = self.procs.pop("mon.a")
        p.send_signal(signal.SIGSTOP)
        self.procs["stopped.mon.a"] = p

    def cont_mon(self):
        p = self.procs.pop("stopped.mon.a")
        p.send_signal(signal.SIGCONT)
        self.procs["mon.a"] = p

    # -- teardown ---------------------------------------------------
    def stop(self):
        # OSDs and radosgw before the mon
        order = sorted(self.procs, key=lambda n: n.endswith("mon.a"))
        for name in order:
            p = self.procs[name]
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                    p.send_signal(signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=30)
        self.procs = {}
        if os.environ.get("CASBOX_KEEP_TMP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()
