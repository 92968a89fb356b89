"""Sealed packs in Ceph RADOS (librados): the object-storage cases of
objstore_cases.py against a real cluster this test starts (one mon, three
memstore OSDs on 127.0.0.1, an erasure-coded k=2 m=1 pool for the packs),
plus what only a cluster can do: an OSD killed during reads and writes,
the whole cluster frozen (unreachable and slow), wrong credentials, a
missing pool. Skips with the reason where Ceph is not installed (the
Debian 13 root of the Dovecot 2.4 pass)."""

import os
import subprocess
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ceph_cluster import CephCluster  # noqa: E402
from dovecot_harness import ensure_test_user, TOP_BUILDDIR  # noqa: E402
from objstore_cases import ObjstoreCases, USER, make_messages  # noqa: E402

POOL = "casbox-packs"


def skip_reason():
    why = CephCluster.available()
    if why is None and not os.path.exists(os.path.join(
            TOP_BUILDDIR, "src/storage-casbox/.libs",
            "libcasbox_objstore_rados.so")):
        why = "built without librados (configure found no librados-dev)"
    return why


SKIP_REASON = skip_reason()
if SKIP_REASON is not None:
    # in the test's log whatever the runner's verbosity (scripts/test-all
    # lists these lines)
    sys.stderr.write("skipped: RadosObjstoreTest: %s\n" % SKIP_REASON)


@unittest.skipIf(SKIP_REASON is not None, SKIP_REASON)
class RadosObjstoreTest(ObjstoreCases, unittest.TestCase):

    ceph = None
    # librados reserves virtual memory for its threads: imap's and
    # lmtp's 256 MB default vsz_limit makes pthread_create() fail
    # (doc/settings.md, casbox_pack_storage)
    dovecot_conf = "default_vsz_limit = 1G\n"

    @classmethod
    def setUpClass(cls):
        pw = ensure_test_user()
        cls.ceph = CephCluster(osds=3)
        cls.ceph.__enter__()
        cls.ceph.ec_pool(POOL, k=2, m=1)
        cls.keyring = cls.ceph.client_key("casbox", [POOL],
                                          owner=pw.pw_name)
        cls.case_no = 0

    @classmethod
    def tearDownClass(cls):
        if cls.ceph is not None:
            cls.ceph.__exit__(None, None, None)

    def setUp(self):
        # one prefix per case: the cases share the pool
        RadosObjstoreTest.case_no += 1
        self.prefix = "t%d/" % self.case_no
        self.pool = POOL
        self.start()

    def tearDown(self):
        self.stop()

    # -- the backend --------------------------------------------------
    def spec(self, keyring=None, pool=None):
        return ("rados:pool=%s,mon_host=v1:127.0.0.1:%d,id=casbox,"
                "keyring=%s,timeout=%d,prefix=%s%%u/" % (
                    pool or self.pool, self.ceph.port,
                    keyring or self.keyring, getattr(self, "timeout", 4),
                    self.prefix))

    def rados(self, *args, **kw):
        return subprocess.run(["rados", "-c", self.ceph.conf, "-p",
                               self.pool] + list(args), capture_output=True,
                              check=True, timeout=60, **kw).stdout

    def remote_packs(self):
        out = {}
        want = self.prefix + USER + "/pack-"
        for name in self.rados("ls").decode().split():
            if name.startswith(want) and name.endswith(".cbp"):
                out[int(name[len(want):len(want) + 8])] = \
                    self.rados("get", name, "-")
        return out

    def break_store(self):
        # frozen, not gone: connections hang until the spec's timeout
        for name, p in self.ceph.procs.items():
            p.send_signal(19)  # SIGSTOP

    def heal_store(self):
        for name, p in self.ceph.procs.items():
            p.send_signal(18)  # SIGCONT
        self.ceph.wait_pool_active(self.pool)

    def truncate_object(self, pack_id, size):
        name = "%s%s/pack-%08u.cbp" % (self.prefix, USER, pack_id)
        data = self.rados("get", name, "-")
        with tempfile.NamedTemporaryFile() as f:
            f.write(data[:size])
            f.flush()
            self.rados("put", name, f.name)

    # -- the cases ----------------------------------------------------
    def test_1_upload_read_gc_scrub(self):
        self.case_upload_read_gc_scrub()

    def test_2_store_unreachable(self):
        self.case_store_unreachable()

    def test_3_kill_during_upload(self):
        self.case_kill_during_upload()

    def test_4_partial_object(self):
        self.case_partial_object()

    def test_5_disaster_recovery(self):
        self.case_disaster_recovery()

    def test_6_wrong_credentials_and_missing_pool(self):
        """Both fail the upload with a clear error naming the cause;
        the packs stay local and readable."""
        msgs = make_messages(7, 15)
        retry = os.path.join(self.packs_dir, "upload.retry")
        self.append(msgs[:1])
        with open(retry, "w") as f:
            f.write("x" * 30)
        os.utime(retry, (2 ** 31 - 10, 2 ** 31 - 10))
        self.append(msgs[1:])
        local = self.local("cbp")
        self.assertGreater(len(local), 1)
        bad = os.path.join(self.ceph.dir, "bad.keyring")
        with open(bad, "w") as f:
            f.write("[client.casbox]\n\tkey = "
                    "AQBy0mJmAAAAABAA0000000000000000000000000A==\n")
        os.chmod(bad, 0o644)
        for spec, why in ((self.spec(keyring=bad), "rados_connect()"),
                          (self.spec(pool="no-such-pool"), "no such pool")):
            r = self.doveadm_upload(check=False, opts=(
                "-o", "plugin/casbox_pack_storage=" + spec))
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(why, r.stderr)
            self.assertIn("the packs stay local", r.stderr)
            self.assertNotIn("AQBy0mJm", r.stderr)
            self.assertEqual(self.local("cbp"), local)
        self.assert_bytes(msgs, self.fetch())

    def test_7_osd_killed_during_reads_and_writes(self):
        """EC 2+1: an OSD killed while a cold FETCH of uploaded packs
        runs; the FETCH completes byte-exact (its ops to the dead OSD
        wait until the map marks it down, then go to the other shards,
        within the spec's timeout), and new uploads go on."""
        self.stop()
        self.timeout = 30
        self.start()
        msgs = make_messages(8, 30)
        self.append(msgs, upload=True)
        self.assert_sealed_uploaded()
        self.drop_cache()
        result = {}
        reader = threading.Thread(
            target=lambda: result.setdefault("got", self.fetch()))
        reader.start()
        self.ceph.kill_osd(2)
        reader.join(timeout=120)
        self.assertFalse(reader.is_alive())
        self.assert_bytes(msgs, result["got"])
        self.ceph.wait_osds_down(2)
        more = make_messages(9, 12)
        self.append(more, box="More", upload=True)
        self.drop_cache()
        self.assert_bytes(msgs, self.fetch())
        self.assert_bytes(more, self.fetch("More"))
        self.dc.doveadm("casbox", "scrub", "-u", USER)

if __name__ == "__main__":
    unittest.main()
