"""Foundation: our three modules load into Debian's stock Dovecot (imap,
lmtp, doveadm), and a wrong setting or a missing dependency gives a clear
error instead of a crash or silence."""

import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, TOP_SRCDIR, dovecot_version  # noqa: E402,E501
from dovecot_harness import drop_shutdown_auth_disconnect  # noqa: E402

MSG = (b"From: Alice <alice@example.com>\r\n"
       b"To: user1@example.com\r\n"
       b"Subject: foundation probe\r\n"
       b"\r\n"
       b"hello from the foundation test\r\n")


def mapped_modules(dc, service):
    """Our module file names mapped into any live process of service."""
    found = set()
    for pid in dc.pids(service):
        try:
            with open("/proc/%d/maps" % pid) as f:
                maps = f.read()
        except OSError:
            continue
        found |= set(re.findall(r"/(lib\d\d_\w+_plugin\.so)$", maps,
                                re.M))
    return found


class PluginsLoad(unittest.TestCase):
    def test_imap_lmtp_doveadm_load_all_modules(self):
        # The storage itself is exercised by the storage tests; sdbox
        # here keeps this test about loading only.
        with Dovecot(mail_location="sdbox:~/sdbox",
                     mail_plugins=["casbox", "fts", "fts_casidx"],
                     plugin_settings={"fts": "casidx"},
                     mail_debug=True) as dc:
            dc.lmtp_deliver("user1", MSG)
            imap = dc.imap_login("user1")
            typ, data = imap.select("INBOX")
            self.assertEqual(typ, "OK")
            self.assertEqual(data, [b"1"])
            typ, data = imap.search(None, "BODY", "foundation")
            self.assertEqual((typ, data), ("OK", [b"1"]))

            # Proof of loading: the modules are mapped into the live
            # imap process (still logged in) and into the lmtp process
            # that delivered (lmtp processes stay for reuse).
            ours = {"lib20_casbox_plugin.so", "lib21_fts_casidx_plugin.so"}
            self.assertLessEqual(ours, mapped_modules(dc, "imap"))
            if dovecot_version() >= (2, 4):
                # 2.4's lmtp process does not stay after the delivery:
                # its mail_debug lines name what it loaded
                for name in ours:
                    self.assertTrue(dc.wait_log(
                        r"lmtp\([^)]*\)<\d+><[^>]*>: Debug: Module loaded: "
                        r"\S+/" + re.escape(name)), name)
            else:
                self.assertLessEqual(ours, mapped_modules(dc, "lmtp"))
            imap.logout()

            out = dc.doveadm("-f", "tab", "casbox", "version").stdout
            rows = dict(line.split("\t", 1)
                        for line in out.splitlines()[1:])
            self.assertEqual(rows["casbox"], "0.1.0")
            # the ABI of the Dovecot that runs (2.3.ABIv19 on Debian 12,
            # 2.4.ABIv1 on Debian 13)
            self.assertTrue(rows["dovecot-abi"].startswith(
                "%d.%d.ABIv" % dovecot_version()))
            self.assertIn("zstd", rows)
            self.assertIn("libsodium", rows)

    def test_doveadm_version_needs_no_mail_plugin(self):
        # The doveadm plugin resolves casbox's symbols from the casbox
        # mail plugin, so doveadm loads it only when casbox is in
        # mail_plugins; without it doveadm says which setting to add.
        with Dovecot(mail_location="sdbox:~/sdbox",
                     mail_plugins=[]) as dc:
            res = dc.doveadm("-f", "tab", "casbox", "version", check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("mail_plugins", res.stderr)
        with Dovecot(mail_location="sdbox:~/sdbox",
                     mail_plugins=["casbox"]) as dc:
            out = dc.doveadm("-f", "tab", "casbox", "version").stdout
            self.assertIn("casbox\t", out)


class HarnessLogFilter(unittest.TestCase):
    LINE = ("Dec 02 16:28:43 indexer-worker(user1)<30799><>: Error: "
            "auth-master: userdb lookup(user1): Disconnected unexpectedly")

    def test_auth_disconnect_dropped_only_after_the_stop(self):
        other = ("Dec 02 16:28:43 imap(user1)<1><x>: Error: auth-master: "
                 "userdb lookup(user1): Disconnected unexpectedly")
        lines = [self.LINE, "a", self.LINE, other]
        # before the stop mark: kept; after: dropped, other process kept
        self.assertEqual(drop_shutdown_auth_disconnect(lines, 2),
                         [self.LINE, "a", other])
        # no stop yet (the instance runs): nothing is dropped
        self.assertEqual(drop_shutdown_auth_disconnect(lines, None), lines)

    def test_lookup_failed_dropped_only_after_the_stop(self):
        failed = ("Dec 05 21:12:42 indexer-worker(21598): Error: conn "
                  "unix:indexer-worker (pid=21595,uid=103): User user1 "
                  "lookup failed: Internal error occurred. Refer to server "
                  "log for more information.")
        denied = failed.replace("Internal error occurred. Refer to server "
                                "log for more information.",
                                "Permission denied")
        lines = [failed, "a", failed, denied]
        # another reason is never dropped
        self.assertEqual(drop_shutdown_auth_disconnect(lines, 2),
                         [failed, "a", denied])


class ClearErrors(unittest.TestCase):
    def test_casbox_location_without_plugin(self):
        with Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=[]) as dc:
            dc.allow_log(r"Unknown mail storage driver casbox")
            with self.assertRaises(Exception):
                dc.imap_login("user1").select("INBOX")
            # The imap process logs through Dovecot's log service,
            # which may write the line after the client saw EOF; the
            # log is complete once the master has stopped.
            dc.stop()
            self.assertTrue(any("Unknown mail storage driver casbox" in l
                                for l in dc.log_lines()),
                            dc.log_text())

    def test_fts_casidx_without_fts(self):
        with Dovecot(mail_location="sdbox:~/sdbox",
                     mail_plugins=["fts_casidx"]) as dc:
            dc.allow_log(r"Plugin fts must be loaded also")
            with self.assertRaises(Exception):
                dc.imap_login("user1").select("INBOX")
            # The imap process logs through Dovecot's log service,
            # which may write the line after the client saw EOF; the
            # log is complete once the master has stopped.
            dc.stop()
            self.assertTrue(any("Plugin fts must be loaded also" in l
                                for l in dc.log_lines()),
                            dc.log_text())


class ConfigureNamesMissingPackages(unittest.TestCase):
    """configure stops with the Debian package name. A missing library
    is simulated with autoconf's cache variables, which is exactly what
    configure consults after its probe."""

    CASES = [
        ("ac_cv_header_zstd_h=no", "libzstd-dev"),
        ("ac_cv_header_sodium_h=no", "libsodium-dev"),
        ("ac_cv_header_roaring_roaring_h=no", "libroaring-dev"),
    ]

    def test_missing_dependency_named(self):
        configure = os.path.join(TOP_SRCDIR, "configure")
        self.assertTrue(os.path.exists(configure), configure)
        for cache_var, package in self.CASES:
            with self.subTest(package=package), \
                    tempfile.TemporaryDirectory() as build:
                res = subprocess.run(
                    [configure, "--with-dovecot=/usr/lib/dovecot",
                     cache_var], cwd=build, capture_output=True, text=True)
                self.assertNotEqual(res.returncode, 0)
                self.assertIn("install the Debian package " + package,
                              res.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
