"""./configure finds Dovecot's dovecot-config by itself, names the
Debian package when there is none, and --with-dovecot still overrides.

"None installed" is made real, not simulated: configure runs in a
private mount namespace with an empty tmpfs over /usr/lib/dovecot
(root and unshare needed; skipped with the reason otherwise). The tree
is configured in a temporary build dir, never the test's own."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (  # noqa: E402
    TOP_SRCDIR, private_mounts_available)

CONFIGURE = os.path.join(TOP_SRCDIR, "configure")
DEBIAN_DIR = "/usr/lib/dovecot"


def configure_argv(args, hide):
    argv = [CONFIGURE] + list(args)
    if hide:
        argv = ["unshare", "-m", "--", "sh", "-c",
                'mount -t tmpfs casbox-test "$0" && exec "$@"',
                hide] + argv
    return argv


def configure(builddir, *args, hide=None):
    """Run configure in builddir to its end; with hide, in a private
    mount namespace with an empty tmpfs over that directory."""
    return subprocess.run(configure_argv(args, hide), cwd=builddir,
                          capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=600)


def configure_until(builddir, want, *args, hide=None):
    """Run configure until it prints the line want, then stop it (the
    rest of a configure run is not what these tests check). Returns
    (True, output so far) if it printed it, (False, all output) if it
    ended without."""
    proc = subprocess.Popen(configure_argv(args, hide), cwd=builddir,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL,
                            start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.rstrip("\n") == want:
                return True, "".join(lines)
        proc.wait(timeout=600)
        return False, "".join(lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=600)
        proc.stdout.close()


@unittest.skipUnless(os.geteuid() == 0 and private_mounts_available(),
                     "hides /usr/lib/dovecot in a private mount "
                     "namespace: needs root and unshare -m")
class ConfigureTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="cbx-configure-", dir="/tmp")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_no_options_finds_debians(self):
        found, out = configure_until(
            self.tmp, 'checking for "%s/dovecot-config"... '
            '%s/dovecot-config' % (DEBIAN_DIR, DEBIAN_DIR))
        self.assertTrue(found, out[-3000:])
        self.assertIn("checking where dovecot-config is... %s\n"
                      % DEBIAN_DIR, out)

    def test_none_installed_names_the_package(self):
        res = configure(self.tmp, hide=DEBIAN_DIR)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("dovecot-config not found", res.stderr)
        self.assertIn("install the Debian package dovecot-dev", res.stderr)
        self.assertIn("--with-dovecot=DIR", res.stderr)

    def test_a_wrong_directory_is_named(self):
        res = configure(self.tmp, "--with-dovecot=%s/none" % self.tmp)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("--with-dovecot=%s/none: no dovecot-config there"
                      % self.tmp, res.stderr)

    def test_with_dovecot_overrides(self):
        # only the copy is visible: configure can have found no other
        alt = os.path.join(self.tmp, "alt")
        os.mkdir(alt)
        shutil.copy(os.path.join(DEBIAN_DIR, "dovecot-config"), alt)
        build = os.path.join(self.tmp, "build")
        os.mkdir(build)
        found, out = configure_until(
            build, 'checking for "%s/dovecot-config"... %s/dovecot-config'
            % (alt, alt), "--with-dovecot=" + alt, hide=DEBIAN_DIR)
        self.assertTrue(found, out[-3000:])
        self.assertNotIn("where dovecot-config is", out)


if __name__ == "__main__":
    # unittest prints a skip's reason only when verbose: say it always
    unittest.main(verbosity=2)
