"""Sealed packs in S3 (libcurl, SigV4): the object-storage cases of
objstore_cases.py against radosgw on a private Ceph cluster this test
starts (one mon, one memstore OSD, radosgw on 127.0.0.1, path-style
URLs over HTTP), plus wrong credentials and a missing bucket. The store
"unreachable" is radosgw killed (connections refused) and restarted.
Skips with the reason where Ceph is not installed (the Debian 13 root
of the Dovecot 2.4 pass)."""

import os
import re
import shutil
import sys
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ceph_cluster import CephCluster  # noqa: E402
from dovecot_harness import ensure_test_user, TOP_BUILDDIR  # noqa: E402
from objstore_cases import ObjstoreCases, USER, make_messages  # noqa: E402

BUCKET = "casbox-packs"
ACCESS = "CASBOXTESTACCESS0001"
SECRET = "casbox-test-secret-0123456789abcdefghij"


def skip_reason():
    why = CephCluster.available()
    if why is None and shutil.which("radosgw") is None:
        why = "radosgw not installed in this root"
    if why is None and not os.path.exists(os.path.join(
            TOP_BUILDDIR, "src/storage-casbox/.libs",
            "libcasbox_objstore_s3.so")):
        why = "built without libcurl (configure found no libcurl4-openssl-dev)"
    return why


SKIP_REASON = skip_reason()
if SKIP_REASON is not None:
    # in the test's log whatever the runner's verbosity (scripts/test-all
    # lists these lines)
    sys.stderr.write("skipped: S3ObjstoreTest: %s\n" % SKIP_REASON)


@unittest.skipIf(SKIP_REASON is not None, SKIP_REASON)
class S3ObjstoreTest(ObjstoreCases, unittest.TestCase):

    ceph = None

    @classmethod
    def setUpClass(cls):
        pw = ensure_test_user()
        cls.ceph = CephCluster(osds=1)
        cls.ceph.__enter__()
        cls.url = cls.ceph.start_rgw(ACCESS, SECRET, BUCKET)
        cls.creds = os.path.join(cls.ceph.dir, "s3.credentials")
        cls.write_creds(cls.creds, ACCESS, SECRET, pw)
        cls.case_no = 0

    @staticmethod
    def write_creds(path, access, secret, pw):
        with open(path, "w") as f:
            f.write("%s\n%s\n" % (access, secret))
        os.chmod(path, 0o600)
        os.chown(path, pw.pw_uid, pw.pw_gid)

    @classmethod
    def tearDownClass(cls):
        if cls.ceph is not None:
            cls.ceph.__exit__(None, None, None)

    def setUp(self):
        S3ObjstoreTest.case_no += 1
        self.prefix = "t%d/" % self.case_no
        self.start()

    def tearDown(self):
        self.stop()

    # -- the backend --------------------------------------------------
    def spec(self, creds=None, bucket=BUCKET):
        if getattr(self, "spec_override", None):
            return self.spec_override
        return ("s3:url=%s/%s,credentials=%s,region=us-east-1,timeout=4,"
                "style=path,prefix=%s%%u/" % (self.url, bucket,
                                              creds or self.creds,
                                              self.prefix))

    def s3(self, method, path, data=None):
        return self.ceph.s3_curl(self.url, ACCESS, SECRET, method,
                                 "/" + BUCKET + path, data=data)

    def remote_packs(self):
        want = self.prefix + USER + "/pack-"
        xml = self.s3("GET", "?list-type=2&prefix=" +
                      urllib.parse.quote(want, safe="")).decode()
        out = {}
        for key in re.findall(r"<Key>([^<]+)</Key>", xml):
            if key.endswith(".cbp"):
                out[int(key[len(want):len(want) + 8])] = \
                    self.s3("GET", "/" + key)
        return out

    def break_store(self):
        self.ceph.kill_rgw()

    def heal_store(self):
        self.ceph.restart_rgw()

    def truncate_object(self, pack_id, size):
        key = "/%s%s/pack-%08u.cbp" % (self.prefix, USER, pack_id)
        data = self.s3("GET", key)
        self.s3("PUT", key, data=data[:size])

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

    def test_6_wrong_credentials_and_missing_bucket(self):
        msgs = make_messages(7, 15)
        retry = os.path.join(self.packs_dir, "upload.retry")
        self.append(msgs[:1])
        with open(retry, "w") as f:
            f.write("x" * 30)
        os.utime(retry, (2 ** 31 - 10, 2 ** 31 - 10))
        self.append(msgs[1:])
        local = self.local("cbp")
        self.assertGreater(len(local), 1)
        bad = os.path.join(self.ceph.dir, "bad.credentials")
        self.write_creds(bad, ACCESS, "wrong-secret-0000000000",
                         ensure_test_user())
        for spec, why in ((self.spec(creds=bad), "SignatureDoesNotMatch"),
                          (self.spec(bucket="no-such-bucket"),
                           "NoSuchBucket")):
            r = self.doveadm_upload(check=False, opts=(
                "-o", "plugin/casbox_pack_storage=" + spec))
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(why, r.stderr)
            self.assertIn("the packs stay local", r.stderr)
            self.assertNotIn("wrong-secret", r.stderr)
            self.assertNotIn(SECRET, r.stderr)
            self.assertEqual(self.local("cbp"), local)
        self.assert_bytes(msgs, self.fetch())

    def test_7_virtual_host_style(self):
        """https://bucket.host/key URLs (curl resolves *.localhost to
        the loopback; radosgw runs with rgw_dns_name = localhost)."""
        self.stop()
        self.spec_override = self.spec().replace(
            "url=http://127.0.0.1", "url=http://localhost").replace(
            "style=path", "style=virtual")
        self.start()
        msgs = make_messages(10, 15)
        self.append(msgs, upload=True)
        self.assert_sealed_uploaded()
        self.drop_cache()
        self.assert_bytes(msgs, self.fetch())


if __name__ == "__main__":
    unittest.main()
