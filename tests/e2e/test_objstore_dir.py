"""Sealed packs in object storage with the dir: backend (a directory as
the store: what an NFS mount gives, and the stand-in that lets the
object-storage cases run without Ceph, also in the Dovecot 2.4 pass).
The cases are in objstore_cases.py."""

import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from objstore_cases import ObjstoreCases, USER  # noqa: E402
from dovecot_harness import ensure_test_user  # noqa: E402


class DirObjstoreTest(ObjstoreCases, unittest.TestCase):

    def setUp(self):
        self.store = tempfile.mkdtemp(prefix="cbx-objects-")
        os.chmod(self.store, 0o755)
        # the mail processes (the casboxtest user) write there
        pw = ensure_test_user()
        os.chown(self.store, pw.pw_uid, pw.pw_gid)
        self.start()

    def tearDown(self):
        self.stop()
        shutil.rmtree(self.store, ignore_errors=True)
        shutil.rmtree(self.store + ".down", ignore_errors=True)

    # -- the backend --------------------------------------------------
    def spec(self):
        return "dir:path=%s,prefix=%%u/" % self.store

    def remote_packs(self):
        out = {}
        d = os.path.join(self.store, USER)
        for name in os.listdir(d) if os.path.isdir(d) else []:
            if name.startswith("pack-") and name.endswith(".cbp"):
                with open(os.path.join(d, name), "rb") as f:
                    out[int(name[5:13])] = f.read()
        return out

    def break_store(self):
        os.rename(self.store, self.store + ".down")

    def heal_store(self):
        os.rename(self.store + ".down", self.store)

    def truncate_object(self, pack_id, size):
        os.truncate(os.path.join(self.store, USER,
                                 "pack-%08u.cbp" % pack_id), size)

    # -- the cases ----------------------------------------------------
    def test_upload_read_gc_scrub(self):
        self.case_upload_read_gc_scrub()

    def test_store_unreachable(self):
        self.case_store_unreachable()

    def test_kill_during_upload(self):
        self.case_kill_during_upload()

    def test_partial_object(self):
        self.case_partial_object()

    def test_disaster_recovery(self):
        self.case_disaster_recovery()


if __name__ == "__main__":
    unittest.main()
