"""./configure finds Dovecot's dovecot-config by itself (the build that
runs this test was configured without --with-dovecot), names the
Debian package when there is none, and --with-dovecot still overrides.

"None installed" is made real, not simulated: configure runs in a
private mount namespace with an empty tmpfs over /usr/lib/dovecot
(root and unshare needed; skipped with the reason otherwise). The tree
is configured in a temporary build dir, never the test's own."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (  # noqa: E402
    TOP_BUILDDIR, TOP_SRCDIR, private_mounts_available)

CONFIGURE = os.path.join(TOP_SRCDIR, "configure")
DEBIAN_DIR = "/usr/lib/dovecot"


def configure(builddir, *args, hide=None):
    """Run configure in builddir; with hide, in a private mount
    namespace with an empty tmpfs over that directory."""
    argv = [CONFIGURE] + list(args)
    if hide:
        argv = ["unshare", "-m", "--", "sh", "-c",
                'mount -t tmpfs casbox-test "$0" && exec "$@"',
                hide] + argv
    return subprocess.run(argv, cwd=builddir, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=600)


@unittest.skipUnless(os.geteuid() == 0 and private_mounts_available(),
                     "hides /usr/lib/dovecot in a private mount "
                     "namespace: needs root and unshare -m")
class ConfigureTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="cbx-configure-", dir="/tmp")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_this_build_found_it_alone(self):
        with open(os.path.join(TOP_BUILDDIR, "config.log")) as f:
            log = f.read()
        # config.log's head has the command line configure ran with
        self.assertRegex(log, r"(?m)^  \$ .*/configure")
        self.assertNotRegex(log, r"(?m)^  \$ .*--with-dovecot")
        self.assertRegex(log, r"(?m)^configure:\d+: checking where "
                         r"dovecot-config is\nconfigure:\d+: result: %s$"
                         % DEBIAN_DIR)

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
        # only the copy is visible: configure found nothing else
        alt = os.path.join(self.tmp, "alt")
        os.mkdir(alt)
        shutil.copy(os.path.join(DEBIAN_DIR, "dovecot-config"), alt)
        build = os.path.join(self.tmp, "build")
        os.mkdir(build)
        res = configure(build, "--with-dovecot=" + alt, hide=DEBIAN_DIR)
        self.assertEqual(res.returncode, 0, res.stdout[-3000:] + res.stderr)
        self.assertIn('checking for "%s/dovecot-config"... %s/dovecot-config'
                      % (alt, alt), res.stdout)
        self.assertNotIn("where dovecot-config is", res.stdout)


if __name__ == "__main__":
    # unittest prints a skip's reason only when verbose: say it always
    unittest.main(verbosity=2)
