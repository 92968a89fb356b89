"""The Debian package: build it from the source tree with
dpkg-buildpackage, check its metadata and lintian, install it with dpkg,
run IMAP APPEND/FETCH and doveadm casbox against the INSTALLED modules
in /usr/lib/dovecot/modules, then purge it and check that nothing of it
is left.

Needs root (it installs into the system; CI runs as root on a throwaway
machine). Other e2e tests may run at the same time: they stage our
plugins from their build trees and never read our module names from the
system dirs (dovecot_harness._stage_modules()); an instance that must
put its doveadm plugin into the system dir holds the harness's shared
lock, and this test holds it exclusively from install to purge.
"""

import glob
import hashlib
import imaplib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (  # noqa: E402
    skip_unless_dovecot23,
    DOVEADM_MODULEDIR, SYSTEM_MODULEDIR, TOP_BUILDDIR, TOP_SRCDIR, Dovecot,
    corpus_files, crlf, lock_system_modules, ok)

PACKAGE = "dovecot-casbox"
OUR_MODULES = [
    os.path.join(SYSTEM_MODULEDIR, "lib20_casbox_plugin.so"),
    os.path.join(SYSTEM_MODULEDIR, "lib21_fts_casidx_plugin.so"),
    os.path.join(DOVEADM_MODULEDIR, "lib10_doveadm_casbox_plugin.so"),
]
KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
# build trees and generated files that are not sources
IGNORE = shutil.ignore_patterns(".git", "build", "build-*", "_build",
                                "autom4te.cache", "*.o", "*.lo", ".libs")


def run(argv, **kw):
    res = subprocess.run(argv, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s%s" % (
            " ".join(argv), res.returncode, res.stdout[-4000:],
            res.stderr[-4000:]))
    return res.stdout


def package_version():
    """configure.ac's AC_INIT version: the oracle for the .deb name."""
    with open(os.path.join(TOP_SRCDIR, "configure.ac")) as f:
        m = re.search(r"^AC_INIT\(\[casbox\], \[([^]]+)\]", f.read(), re.M)
    return m.group(1)


def copy_sources(dest):
    """The tree dpkg-buildpackage sees: what git tracks plus untracked,
    not ignored files (a clean clone with this checkout's edits), or
    the whole source dir outside git."""
    try:
        top = subprocess.run(
            ["git", "-C", TOP_SRCDIR, "rev-parse", "--show-toplevel"],
            capture_output=True, text=True, check=True).stdout.strip()
        names = subprocess.run(
            ["git", "-C", TOP_SRCDIR, "ls-files", "-co", "--exclude-standard",
             "-z"], capture_output=True, check=True).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        top = None
    if top is None or os.path.realpath(top) != os.path.realpath(TOP_SRCDIR):
        # a tarball (make distcheck unpacks one inside the checkout)
        shutil.copytree(TOP_SRCDIR, dest, ignore=IGNORE, symlinks=True)
        for root, dirs, files in os.walk(dest):
            os.chmod(root, 0o755)      # distcheck's tree is read-only
        return
    for name in filter(None, (n.decode() for n in names)):
        src = os.path.join(TOP_SRCDIR, name)
        if not os.path.lexists(src) or name.split("/")[0].startswith("build"):
            continue
        os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
        shutil.copy2(src, os.path.join(dest, name), follow_symlinks=False)


def dpkg(*args):
    """dpkg under apt's front-end lock, taken the way apt takes it (an
    fcntl lock on /var/lib/dpkg/lock-frontend, waited for): another
    apt-get or dpkg on the machine finishes first instead of making
    this one fail."""
    import fcntl
    with open("/var/lib/dpkg/lock-frontend", "w") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        return run(["dpkg"] + list(args), stdin=subprocess.DEVNULL,
                   env=dict(os.environ, DPKG_FRONTEND_LOCKED="1"))


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def dpkg_owner(path):
    res = subprocess.run(["dpkg", "-S", path], capture_output=True,
                         text=True)
    return res.stdout.split(":")[0] if res.returncode == 0 else None


def mapped_modules(pid):
    with open("/proc/%d/maps" % pid) as f:
        return {line.split()[-1] for line in f
                if line.rstrip().endswith(".so")}


@unittest.skipUnless(os.geteuid() == 0,
                     "installs a .deb into the system: needs root")
@skip_unless_dovecot23("the .deb is built and tested for Debian 12's "
                       "Dovecot 2.3 only: it does not ship the 2.4 "
                       "settings modules yet")
class PackageTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="cbx-pkg-", dir="/tmp")
        src = os.path.join(cls.tmp, "src")
        copy_sources(src)
        env = dict(os.environ, DEB_BUILD_OPTIONS="nocheck parallel=%d"
                   % (os.cpu_count() or 1))
        # dpkg-buildpackage writes the .deb next to the source dir
        cls.build_log = run(["dpkg-buildpackage", "-us", "-uc", "-b"],
                            cwd=src, env=env, stdin=subprocess.DEVNULL)
        cls.deb = os.path.join(cls.tmp, "%s_%s_amd64.deb"
                               % (PACKAGE, package_version()))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_1_metadata(self):
        self.assertTrue(os.path.exists(self.deb),
                        "no %s among %s" % (os.path.basename(self.deb),
                                            os.listdir(self.tmp)))
        fields = run(["dpkg-deb", "-f", self.deb, "Depends", "Enhances"])
        with open("/usr/share/dovecot/dovecot-abi") as f:
            abi = f.read().strip()
        self.assertIn("dovecot-abi-%s" % abi, fields)
        self.assertRegex(fields, r"Enhances: .*dovecot-imapd")
        self.assertRegex(fields, r"Enhances: .*dovecot-lmtpd")
        files = run(["dpkg-deb", "-c", self.deb])
        for path in OUR_MODULES + [
                "/etc/dovecot/conf.d/90-casbox.conf",
                "/usr/share/man/man1/doveadm-casbox.1.gz",
                "/usr/share/man/man1/doveadm-casbox-scrub.1.gz",
                "/usr/share/doc/dovecot-casbox/doveadm.md.gz"]:
            self.assertIn("." + path + "\n", files)
        self.assertNotIn(".la\n", files)
        # the example configuration enables nothing
        with tempfile.TemporaryDirectory(dir=self.tmp) as x:
            run(["dpkg-deb", "-x", self.deb, x])
            with open(os.path.join(x, "etc/dovecot/conf.d/90-casbox.conf")) \
                    as f:
                live = [l for l in f if l.strip()
                        and not l.lstrip().startswith("#")]
        self.assertEqual(live, [])
        # and the package build did not run the test suite
        self.assertNotIn("make check", self.build_log)
        self.assertNotIn("Testsuite summary", self.build_log)

    def test_2_lintian(self):
        if shutil.which("lintian") is None:
            self.fail("lintian not installed (scripts/setup installs it)")
        res = subprocess.run(["lintian", "--fail-on", "error,warning",
                              self.deb], capture_output=True, text=True)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertNotRegex(res.stdout, r"(?m)^[EW]: ")

    def test_3_install_use_purge(self):
        lock = lock_system_modules(exclusive=True)
        aside = os.path.join(self.tmp, "aside")
        os.mkdir(aside)
        moved = []
        try:
            dpkg("--purge", PACKAGE)       # a run that was killed
            # a build tree's copy some earlier run left in the system dir
            # (harness without a mount namespace, the demo, make install):
            # put aside, and back after the purge
            for path in OUR_MODULES:
                if os.path.exists(path) and dpkg_owner(path) is None:
                    shutil.move(path, os.path.join(aside,
                                                   os.path.basename(path)))
                    moved.append(path)
            before = self.ours()
            shipped = [line.split(None, 5)[5][1:].split(" -> ")[0]
                       for line in run(["dpkg-deb", "-c", self.deb])
                       .splitlines()]
            new_paths = [p for p in shipped if not os.path.lexists(p)]
            try:
                dpkg("-i", self.deb)
                self.check_installed()
            finally:
                dpkg("--purge", PACKAGE)
            # every file and directory the package brought is gone, and
            # nothing named after us is left or changed
            for path in new_paths:
                self.assertFalse(os.path.lexists(path), path)
            self.assertEqual(self.ours(), before)
            for path in OUR_MODULES + ["/etc/dovecot/conf.d/90-casbox.conf",
                                       "/usr/share/doc/dovecot-casbox"]:
                self.assertFalse(os.path.lexists(path), path)
            self.assertEqual(glob.glob("/usr/share/man/man1/doveadm-casbox*"),
                             [])
            res = subprocess.run(["dpkg-query", "-W", PACKAGE],
                                 capture_output=True)
            self.assertNotEqual(res.returncode, 0)
        finally:
            for path in moved:
                shutil.move(os.path.join(aside, os.path.basename(path)), path)
            lock.close()

    @staticmethod
    def ours():
        """Every path named after casbox or casidx under the dirs the
        package writes to, with the content digest of each file. (Not
        the whole dirs: another engineer's apt-get may add packages
        meanwhile.)"""
        out = {}
        for d in (SYSTEM_MODULEDIR, "/etc/dovecot", "/usr/share/man/man1",
                  "/usr/share/doc"):
            for root, dirs, files in os.walk(d):
                for name in dirs + files:
                    path = os.path.join(root, name)
                    if "casbox" not in path and "casidx" not in path:
                        continue
                    out[path] = (digest(path) if os.path.isfile(path)
                                 else None)
        return out

    def check_installed(self):
        for path in OUR_MODULES:
            self.assertEqual(dpkg_owner(path), PACKAGE, path)
        # man finds the installed pages
        for page in ("doveadm-casbox", "doveadm-casbox-scrub"):
            where = run(["man", "-w", page]).strip()
            self.assertEqual(where, "/usr/share/man/man1/%s.1.gz" % page)
        text = run(["man", "-P", "cat", "doveadm-casbox-scrub"],
                   env=dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8"))
        self.assertIn("--repair", text)

        path = corpus_files("usrp-users-3000", limit=1)[0]
        with open(path, "rb") as f:
            message = crlf(f.read())
        with Dovecot(modules="system", plugin_settings=KEYS) as dc:
            imap = dc.imap_login("user1")
            ok(imap.append("INBOX", None, None, message))
            ok(imap.select("INBOX"))
            typ, data = imap.fetch("1", "(BODY.PEEK[])")
            ok((typ, data))
            self.assertEqual(data[0][1], message)
            # the imap process runs the installed plugin, not a build
            # tree's
            maps = set()
            for pid in dc.pids("imap"):
                maps |= mapped_modules(pid)
            self.assertIn(OUR_MODULES[0], maps)
            self.assertFalse([m for m in maps if TOP_BUILDDIR in m], maps)
            imap.logout()
            out = dc.doveadm("-f", "tab", "casbox", "stats",
                             "-u", "user1").stdout.split("\n")
            row = dict(zip(out[0].split("\t"), out[1].split("\t")))
            self.assertEqual(row["messages"], "1")
            version = dc.doveadm("casbox", "version").stdout
            self.assertIn(package_version(), version)


if __name__ == "__main__":
    # unittest prints a skip's reason only when verbose: say it always
    unittest.main(verbosity=2)
