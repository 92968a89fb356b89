"""A private, unmodified Dovecot for end-to-end tests and benchmarks.

Each Dovecot() starts Debian's stock dovecot binary with its own
base_dir, state_dir and log under a fresh temporary directory, IMAP and
LMTP on 127.0.0.1 high ports, a static passdb/userdb and our plugins
loaded from the build tree. It is stopped by pid when the `with` block
ends, and the test fails if Dovecot logged an Error, Fatal or Panic line
that the test did not declare with allow_log().

    with Dovecot(mail_location="casbox:~/casbox",
                 mail_plugins=["casbox"]) as dc:
        dc.lmtp_deliver("user1", b"Subject: hi\\r\\n\\r\\nbody\\r\\n")
        imap = dc.imap_login("user1")
        dc.doveadm("mailbox", "status", "-u", "user1", "messages", "INBOX")

Environment:
    CASBOX_TOP_BUILDDIR  build tree with the freshly built plugins
                         (make check sets it)
    CASBOX_CORPUS        corpus directory (default ../shared/corpus next
                         to the source tree)
    CASBOX_KEEP_TMP=1    keep the temporary directory for inspection
    CASBOX_MAIL_DEBUG=1  mail_debug = yes
"""

import errno
import glob
import imaplib
import os
import pwd
import re
import select
import shutil
import signal
import smtplib
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP_SRCDIR = os.environ.get("CASBOX_TOP_SRCDIR",
                            os.path.dirname(os.path.dirname(HERE)))
TOP_BUILDDIR = os.environ.get("CASBOX_TOP_BUILDDIR", TOP_SRCDIR)
SYSTEM_MODULEDIR = "/usr/lib/dovecot/modules"
DOVEADM_MODULEDIR = SYSTEM_MODULEDIR + "/doveadm"
DOVECOT = "/usr/sbin/dovecot"
DOVEADM = "/usr/bin/doveadm"
TEST_USER = "casboxtest"
PASSWORD = "casbox-test-pass"

# Our modules, as built by libtool, and where Dovecot looks for them.
OUR_MAIL_MODULES = {
    "lib20_casbox_plugin.so": "src/storage-casbox/.libs",
    "lib21_fts_casidx_plugin.so": "src/fts-casidx/.libs",
}
OUR_DOVEADM_MODULE = ("lib10_doveadm_casbox_plugin.so",
                      "src/doveadm-casbox/.libs")
# Dovecot 2.4's config process learns plugin settings from modules in
# its compiled-in settings dir (bind-mounted like the doveadm one).
SETTINGS_MODULEDIR = SYSTEM_MODULEDIR + "/settings"
OUR_SETTINGS_MODULES = {
    "lib20_casbox_settings.so": "src/storage-casbox/.libs",
    "lib21_fts_casidx_settings.so": "src/fts-casidx/.libs",
}

LOG_PROBLEM_RE = re.compile(r": (Error|Fatal|Panic): ")
# what a failed test prints from the whole log, not only from its tail
LOG_NOTABLE_RE = re.compile(r": (Error|Fatal|Panic|Warning): ")


def drop_core_indexer_deinit_panic(lines):
    """Drop Dovecot core's indexer panic at shutdown, and only that.

    src/indexer/indexer-queue.c (2.3.19.1 and 2.4.1 alike): when a
    request that was being worked on is queued again (another client
    asked for the same mailbox meanwhile), indexer_queue_request_finish()
    deletes the finished contexts but leaves working_context_idx as it
    was. If Dovecot stops before a worker takes the request again,
    indexer_queue_cancel_all() walks the stale index and array_idx()
    panics. The indexer process loads no plugin, so no casbox or casidx
    code is involved; it happens with sdbox as well (test_imap_concurrency,
    2.4.1 CI run of 2026-12-02). The panic is dropped only when its
    backtrace goes through indexer_queue_cancel_all, together with the
    master's "killed with signal 6" line for that indexer child."""
    drop = set()
    for i, line in enumerate(lines):
        if ("indexer: Panic: " in line and "array_idx" in line
                and i + 1 < len(lines)
                and "Raw backtrace" in lines[i + 1]
                and "indexer_queue_cancel_all" in lines[i + 1]):
            drop.update((i, i + 1))
            for j in range(i + 2, min(i + 6, len(lines))):
                if re.search(r"service\(indexer\): child \d+ killed "
                             r"with signal 6", lines[j]):
                    drop.add(j)
                    break
    return [line for i, line in enumerate(lines) if i not in drop]


SHUTDOWN_AUTH_DISCONNECT_RE = re.compile(
    r"indexer-worker\([^)]*\)(<\d+><[^>]*>)?: Error: (auth-master: "
    r"userdb lookup\([^)]*\): Disconnected unexpectedly|"
    r"conn unix:indexer-worker \(pid=\d+,uid=\d+\): User \S+ lookup "
    r"failed: Internal error occurred\. Refer to server log for more "
    r"information\.)$")


def drop_shutdown_auth_disconnect(lines, stop_mark):
    """Drop an indexer-worker's userdb lookup cut off by the stop itself.

    Background indexing (an IMAP session or a delivery queued the
    mailbox) can still be starting its indexer-worker when the harness
    sends SIGTERM; the master stops auth first, and the worker's userdb
    lookup logs "Disconnected unexpectedly" (seen in the 2.4.1 CI pass of
    2026-12-02, test_fts_search), and the worker's connection then "User
    ... lookup failed: Internal error occurred" (the 2.3 pass of
    2026-12-05, the same test). Nothing is lost: the index request is
    abandoned and the next search indexes the mailbox. Only lines that
    reached the log after the harness began stopping Dovecot (stop_mark
    is the line count then) are dropped, and only these exact lines: the
    same errors while the instance runs still fail the test."""
    if stop_mark is None:
        return lines
    return [line for i, line in enumerate(lines)
            if i < stop_mark or not SHUTDOWN_AUTH_DISCONNECT_RE.search(line)]


# Deliveries without LMTP's Received header: it carries a per-instance
# session id, which an FTS instance and its oracle would not share.
NO_LMTP_RECEIVED = "lmtp_add_received_header = no\n"


def sdbox_oracle(**kw):
    """Dovecot's own search, the oracle of the casidx tests: sdbox, no
    mail plugins, no Received header (extra_conf replaces that)."""
    kw.setdefault("extra_conf", NO_LMTP_RECEIVED)
    return Dovecot(mail_location="sdbox:~/sdbox", mail_plugins=[], **kw)


def sdbox_casidx(no_fsync=True, plugin_settings=None, **kw):
    """casidx as an admin enables it on sdbox (fts_enforced, so every
    search goes through the backend), the oracle's mail layout. no_fsync
    skips the index's fsyncs where a test does not measure durability."""
    settings = {"fts": "casidx", "fts_enforced": "yes"}
    if no_fsync:
        settings["fts_casidx_no_fsync"] = "yes"
    settings.update(plugin_settings or {})
    kw.setdefault("extra_conf", NO_LMTP_RECEIVED)
    return Dovecot(mail_location="sdbox:~/sdbox",
                   mail_plugins=["fts", "fts_casidx"],
                   plugin_settings=settings, **kw)

# Held shared while an instance has put our doveadm plugin into the
# system module dir (no private mount namespace, or the demo), and
# exclusively by tests/e2e/test_package.py while the .deb is installed:
# the installed package and a build tree's copy never overwrite each
# other. Instances in a private mount namespace do not need it: they
# never read our module names from the system dirs.
SYSTEM_MODULES_LOCK = "/run/lock/casbox-system-modules.lock"


def lock_system_modules(exclusive):
    """An open file holding the lock (close it to release)."""
    import fcntl
    f = open(SYSTEM_MODULES_LOCK, "a")
    fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    return f


class HarnessError(Exception):
    pass


_VERSION = None


def dovecot_version():
    """(major, minor) of the Dovecot that DOVECOT runs: (2, 3) on Debian
    12, (2, 4) in the Debian 13 root (scripts/trixie-root)."""
    global _VERSION
    if _VERSION is None:
        out = subprocess.run([DOVECOT, "--version"], capture_output=True,
                             text=True, check=True).stdout
        m = re.match(r"(\d+)\.(\d+)", out)
        if m is None:
            raise HarnessError("cannot parse dovecot --version: %r" % out)
        _VERSION = (int(m.group(1)), int(m.group(2)))
    return _VERSION


def is_dovecot24():
    return dovecot_version() >= (2, 4)


def skip_unless_dovecot23(reason):
    """unittest decorator: the test needs a Dovecot 2.3-only feature
    (reason says which); on 2.4 it is skipped, the reason printed."""
    import unittest
    if is_dovecot24():
        sys.stderr.write("skipped: Dovecot 2.4: %s\n" % reason)
    return unittest.skipIf(is_dovecot24(), "Dovecot 2.4: " + reason)


def corpus_dir():
    """The shared corpus: CASBOX_CORPUS or ../shared/corpus beside the
    source tree (that is where CI puts it)."""
    path = os.environ.get("CASBOX_CORPUS")
    if path is None:
        # realpath: an out-of-tree build gives TOP_SRCDIR as build/..
        path = os.path.join(os.path.dirname(os.path.realpath(TOP_SRCDIR)),
                            "shared", "corpus")
    if not os.path.isdir(path):
        raise HarnessError("corpus not found at %s (set CASBOX_CORPUS)"
                           % path)
    return path


def corpus_files(folder, limit=None, step=1):
    """Sorted paths of the .eml files of one corpus folder; every
    step-th file, at most limit of them."""
    root = os.path.join(corpus_dir(), folder)
    names = sorted(n for n in os.listdir(root)
                   if os.path.isfile(os.path.join(root, n))
                   and not n.startswith("."))
    paths = [os.path.join(root, n) for n in names][::step]
    return paths if limit is None else paths[:limit]


def ok(typ_data):
    """The data of an imaplib reply, failing the test unless it is OK."""
    typ, data = typ_data
    if typ != "OK":
        raise AssertionError("IMAP command failed: %r %r" % (typ, data))
    return data


def crlf(data):
    """What IMAP gives back for saved bytes: every line ends in CRLF."""
    return re.sub(rb"\r?\n", b"\r\n", data)


def load(paths):
    """The bytes of each file in paths (corpus messages), in order."""
    out = []
    for path in paths:
        with open(path, "rb") as f:
            out.append(f.read())
    return out


def files_under(root):
    """Every regular file below root."""
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path):
                yield path


def found_in(root, strings):
    """(path, string) for every byte string of strings that a file below
    root contains: the plaintext-on-disk check."""
    hits = []
    for path in files_under(root):
        with open(path, "rb") as f:
            data = f.read()
        hits.extend((path, s) for s in strings if s in data)
    return hits


def distinctive_strings(messages):
    """Byte strings that mark each message's plaintext: its Subject (16
    chars or more) and its longest line of plain words."""
    out = set()
    for msg in messages:
        m = re.search(rb"^Subject: (.{16,})$", msg, re.M | re.I)
        if m:
            out.add(m.group(1).strip()[:40])
        lines = [ln.strip() for ln in msg.split(b"\n")
                 if re.fullmatch(rb"[A-Za-z ,.']{30,}", ln.strip())]
        if lines:
            out.add(max(lines, key=len)[:60])
    return out


def _only_log_child(pid):
    """The pid of the log process when it is pid's only child (zombies
    count as children until reaped), else None."""
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            children = f.read().split()
        if len(children) != 1:
            return None
        with open("/proc/%s/comm" % children[0]) as f:
            comm = f.read().strip()
    except OSError:  # gone meanwhile
        return None
    return int(children[0]) if comm == "log" else None


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def free_port():
    return free_ports(1)[0]


def free_ports(count):
    """count distinct free ports of 127.0.0.1: all sockets stay bound
    until each has its port, so two calls in a row cannot hand out the
    same one (which made doveconf fail with "duplicate listener")."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ensure_test_user():
    """As root, mail runs as a dedicated unprivileged user (Dovecot
    refuses uid 0 for mail). Created on first use."""
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        pass
    if os.geteuid() != 0:
        raise HarnessError("user %s missing and we are not root"
                           % TEST_USER)
    subprocess.run(["useradd", "--system", "--no-create-home",
                    "--shell", "/usr/sbin/nologin", TEST_USER],
                   check=True)
    return pwd.getpwnam(TEST_USER)


_NAMESPACE_OK = None


def private_mounts_available():
    """True when we may give Dovecot a private mount namespace (root and
    unshare(CLONE_NEWNS) allowed). Then each instance sees its own build's
    doveadm plugin bind-mounted over the compiled-in doveadm module dir,
    so several build trees can run e2e tests at once."""
    global _NAMESPACE_OK
    if _NAMESPACE_OK is None:
        _NAMESPACE_OK = False
        if os.geteuid() == 0 and shutil.which("unshare"):
            res = subprocess.run(
                ["unshare", "-m", "--", "mount", "--bind", "/",
                 "/"], capture_output=True)
            _NAMESPACE_OK = res.returncode == 0
    return _NAMESPACE_OK


def _atomic_copy(src, dest):
    tmp = "%s.tmp.%d" % (dest, os.getpid())
    shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o644)
    os.rename(tmp, dest)


def location_override(location):
    """doveadm -o arguments that point a command at another mail
    location ("driver:path"): mail_location on 2.3, mail_driver and
    mail_path on 2.4."""
    if not is_dovecot24():
        return ["-o", "mail_location=" + location]
    driver, _, path = location.partition(":")
    return ["-o", "mail_driver=" + driver, "-o", "mail_path=" + path]


def lmtp_send(lmtp, sender, user, message):
    """One delivery on an open smtplib.LMTP connection, as sendmail()
    but with BDAT on 2.4 (see _lmtp_bdat()). Returns the refused
    recipients ({} when delivered); raises smtplib's exceptions."""
    if is_dovecot24():
        return _lmtp_bdat(lmtp, sender, user, message)
    return lmtp.sendmail(sender, [user], message)


def _lmtp_bdat(lmtp, sender, user, message):
    """One delivery with BDAT (RFC 3030) instead of DATA: Dovecot 2.4.1's
    LMTP server sometimes keeps the stuffing dot of a line that starts
    with "." (seen with stock sdbox on a corpus message, depending on
    where the line falls in its input), so DATA does not deliver the
    bytes sent. BDAT has no dot-stuffing. As smtplib's DATA does, a
    message not ending in CRLF gets one. Returns {user: reply} when the
    recipient or the data was refused, else {}."""
    lmtp.ehlo_or_helo_if_needed()
    if not lmtp.has_extn("chunking"):
        raise HarnessError("LMTP server does not offer CHUNKING")
    if not message.endswith(b"\r\n"):
        message += b"\r\n"
    code, resp = lmtp.mail(sender)
    if code != 250:
        raise HarnessError("LMTP MAIL FROM: %d %r" % (code, resp))
    code, resp = lmtp.rcpt(user)
    if code not in (250, 251):
        lmtp.rset()
        return {user: (code, resp)}
    lmtp.send(b"BDAT %d LAST\r\n" % len(message) + message)
    code, resp = lmtp.getreply()
    if code != 250:
        return {user: (code, resp)}
    return {}


class Dovecot:
    """One private Dovecot instance. Use as a context manager."""

    def __init__(self, mail_location="casbox:~/casbox", mail_plugins=None,
                 plugin_settings=None, extra_conf="", protocols="imap lmtp",
                 users_prefix="", keep_tmp=None, mail_debug=None,
                 system_doveadm_plugin=False, passdb_extra="",
                 users=None, modules="build"):
        self.mail_location = mail_location
        self.mail_plugins = list(mail_plugins if mail_plugins is not None
                                 else ["casbox"])
        self.plugin_settings = dict(plugin_settings or {})
        if "casbox" in self.mail_plugins and modules == "build":
            # Duplicate-delivery suppression is on by default (1d); most
            # tests deliver the same corpus message more than once on
            # purpose (dedup, crash and rebuild tests) and count copies.
            # Tests of the suppression set it themselves.
            self.plugin_settings.setdefault("casbox_duplicate_window", "0")
        self.extra_conf = extra_conf
        # lines inside passdb {}, e.g. override_fields to hand the login
        # password to the mail process (casbox_key_mode = password)
        self.passdb_extra = passdb_extra
        self.protocols = protocols
        # None: any user name exists (static userdb); a list of names:
        # exactly these users, in a passwd-file userdb that doveadm -A
        # can iterate
        self.users = list(users) if users is not None else None
        self.keep_tmp = (os.environ.get("CASBOX_KEEP_TMP") == "1"
                         if keep_tmp is None else keep_tmp)
        self.mail_debug = (os.environ.get("CASBOX_MAIL_DEBUG") == "1"
                           if mail_debug is None else mail_debug)
        self.allowed_log = []
        # install our doveadm plugin into the system dir even when a
        # private mount namespace is possible (the demo, whose user runs
        # doveadm by hand)
        self.system_doveadm_plugin = system_doveadm_plugin
        # "build": our plugins from the build tree (staged, see
        # _stage_modules()); "system": Dovecot's own module dirs as they
        # are, i.e. what a package installed (tests/e2e/test_package.py)
        if modules not in ("build", "system"):
            raise ValueError("modules must be 'build' or 'system'")
        self.modules = modules
        self.modules_lock = None
        self.tmp = None
        self.master_pid = None
        self.imap_port = None
        self.lmtp_port = None

    # -- lifecycle -------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        problems = None
        try:
            self.stop()
            problems = self.log_problems()
            if exc_type is not None:
                # the test failed: its log is all CI keeps of Dovecot.
                # Every problem line (allowed ones too) and the tail: the
                # cause of a race is seldom in the last lines.
                all_lines = self.log_lines()
                tail = all_lines[-40:]
                head = [ln for ln in all_lines[:-40]
                        if LOG_NOTABLE_RE.search(ln)][-60:]
                if head:
                    sys.stderr.write("---- Dovecot log, problem lines "
                                     "before the tail ----\n")
                    sys.stderr.write("".join("  %s\n" % ln.rstrip("\n")
                                             for ln in head))
                sys.stderr.write("---- Dovecot log (last %d lines) ----\n"
                                 % len(tail))
                sys.stderr.write("".join("  %s\n" % line.rstrip("\n")
                                         for line in tail))
        finally:
            if not self.keep_tmp and self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
        if exc_type is None and problems:
            raise AssertionError("Dovecot logged problems:\n"
                                 + "\n".join(problems))
        return False

    def start(self):
        self.root = os.geteuid() == 0
        if self.root:
            pw = ensure_test_user()
            self.uid, self.gid = pw.pw_uid, pw.pw_gid
            self.internal_user = "dovecot"
            self.login_user = "dovenull"
        else:
            self.uid, self.gid = os.getuid(), os.getgid()
            me = pwd.getpwuid(self.uid).pw_name
            self.internal_user = self.login_user = me
        self.tmp = tempfile.mkdtemp(prefix="cbx-", dir="/tmp")
        os.chmod(self.tmp, 0o755)
        for sub in ("run", "state", "modules"):
            os.mkdir(os.path.join(self.tmp, sub))
        self.home_root = os.path.join(self.tmp, "home")
        os.mkdir(self.home_root, 0o755)
        os.chown(self.home_root, self.uid, self.gid)
        self.log_path = os.path.join(self.tmp, "dovecot.log")
        self.stop_mark = None
        self.conf_path = os.path.join(self.tmp, "dovecot.conf")
        self._stage_modules()
        self.imap_port, self.lmtp_port = free_ports(2)
        if self.users is not None:
            with open(os.path.join(self.tmp, "users"), "w") as f:
                for user in self.users:
                    f.write("%s::%d:%d::%s::\n" % (
                        user, self.uid, self.gid,
                        os.path.join(self.home_root, user)))
        with open(self.conf_path, "w") as f:
            f.write(self.config_text())
        # Not a pipe: the daemonized master inherits stdout/stderr and
        # would hold a pipe open forever.
        out_path = os.path.join(self.tmp, "start.out")
        with open(out_path, "w+") as out:
            res = subprocess.run(self.command(DOVECOT, "-c", self.conf_path),
                                 stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
            out.seek(0)
            start_output = out.read()
        if res.returncode != 0:
            raise HarnessError("dovecot failed to start (%d): %s\n%s"
                               % (res.returncode, start_output,
                                  self.log_text()))
        # The master binds every listener before it daemonizes (a busy
        # port fails the start command), so the ports accept connections
        # once the command has returned. The daemon was forked before
        # the command exited, but may not have written master.pid yet:
        # find it by its command line.
        self.master_pid = self._find_master()

    def _find_master(self):
        want = ("%s\0-c\0%s\0" % (DOVECOT, self.conf_path)).encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    if f.read() != want:
                        continue
                with open("/proc/%s/stat" % entry) as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                return int(entry)
        raise HarnessError("dovecot master process not found after start")

    def stop(self):
        """Stop the instance and wait until the master has exited, so
        the log is complete. Safe to call inside the `with` block; the
        exit then only checks the log."""
        if self.master_pid is None:
            self._unlock_modules()
            return
        pid, self.master_pid = self.master_pid, None
        try:
            self._stop_master(pid)
        finally:
            self._unlock_modules()

    def _unlock_modules(self):
        if self.modules_lock is not None:
            self.modules_lock.close()
            self.modules_lock = None

    def _stop_master(self, pid):
        try:
            self.stop_mark = len(self.log_lines())
        except OSError:
            self.stop_mark = 0
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        # The master is not our child; a pidfd becomes readable when it
        # exits, so this waits for the event, not for a guessed time.
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            ready = self._wait_master_exit(pid, fd)
        finally:
            os.close(fd)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            raise HarnessError("dovecot master %d did not stop in 60s"
                               % pid)

    def _wait_master_exit(self, pid, fd):
        """Wait (up to 60 s) for the master to exit after SIGTERM.

        Once the master has reaped every child but the log process, it
        has logged each child's end, and Dovecot (2.3 and 2.4,
        services_monitor_wait_and_kill()) then only SIGQUITs the log
        process and sleeps a fixed second before closing the log pipes:
        a second per instance, most of the e2e suite's idle time. Kill
        the master at that point instead; the log process drains its
        pipes, sees them close and exits, and its exit is what makes
        the log complete. True when both are gone."""
        deadline = time.monotonic() + 60
        while True:
            ready, _, _ = select.select([fd], [], [], 0.01)
            if ready:
                return True
            if time.monotonic() > deadline:
                return False
            log_pid = _only_log_child(pid)
            if log_pid is None:
                continue
            try:
                log_fd = os.pidfd_open(log_pid)
            except ProcessLookupError:
                continue
            try:
                # the master may have exited meanwhile
                if not select.select([fd], [], [], 0)[0]:
                    os.kill(pid, signal.SIGKILL)
                left = max(deadline - time.monotonic(), 1)
                if not (select.select([fd], [], [], left)[0] and
                        select.select([log_fd], [], [], left)[0]):
                    return False
            finally:
                os.close(log_fd)
            # what the master removes on a clean exit: a restart on the
            # same base_dir would take its pid (maybe not yet reaped)
            # for a running master
            try:
                os.unlink(os.path.join(self.tmp, "run", "master.pid"))
            except FileNotFoundError:
                pass
            return True

    # -- configuration ---------------------------------------------------

    def _stage_modules(self):
        """mail_plugin_dir replaces Dovecot's module dir, so it gets every
        stock module plus ours from the build tree. doveadm plugins are
        only looked up in the compiled-in directory: a private copy of
        that directory with ours is bind-mounted over it in a mount
        namespace of this instance (self.command()), or, where that is
        not allowed, ours is installed there (root only)."""
        self.doveadm_moddir = None
        if self.modules == "system":
            return
        moddir = os.path.join(self.tmp, "modules")
        for path in glob.glob(os.path.join(SYSTEM_MODULEDIR, "*.so")):
            name = os.path.basename(path)
            if name not in OUR_MAIL_MODULES:
                os.symlink(path, os.path.join(moddir, name))
        for name, rel in OUR_MAIL_MODULES.items():
            src = os.path.join(TOP_BUILDDIR, rel, name)
            if not os.path.exists(src):
                raise HarnessError("%s not built (looked at %s)"
                                   % (name, src))
            os.symlink(src, os.path.join(moddir, name))
        name, rel = OUR_DOVEADM_MODULE
        src = os.path.join(TOP_BUILDDIR, rel, name)
        dest = os.path.join(DOVEADM_MODULEDIR, name)
        if not os.path.exists(src):
            raise HarnessError("%s not built (looked at %s)" % (name, src))
        if (self.root and not self.system_doveadm_plugin
                and private_mounts_available()):
            self.doveadm_moddir = self._stage_dir(
                "doveadm-modules", DOVEADM_MODULEDIR, {name: rel})
        elif self.root:
            self.modules_lock = lock_system_modules(exclusive=False)
            _atomic_copy(src, dest)
        elif not os.path.exists(dest):
            raise HarnessError("doveadm loads plugins only from %s: run as "
                               "root or `make install` first"
                               % DOVEADM_MODULEDIR)
        self.settings_moddir = None
        if is_dovecot24():
            # the config process's settings modules (2.4), in the same
            # mount namespace
            if self.doveadm_moddir is None:
                raise HarnessError("Dovecot 2.4 tests need root and a "
                                   "private mount namespace")
            os.makedirs(SETTINGS_MODULEDIR, exist_ok=True)
            self.settings_moddir = self._stage_dir(
                "settings-modules", SETTINGS_MODULEDIR, OUR_SETTINGS_MODULES)

    def _stage_dir(self, sub, system_dir, ours):
        """A private copy of system_dir's modules with ours ({file name:
        build dir}) from the build tree instead, for self.command() to
        bind-mount over system_dir."""
        staged = os.path.join(self.tmp, sub)
        os.mkdir(staged)
        for path in glob.glob(os.path.join(system_dir, "*.so")):
            if os.path.basename(path) not in ours:
                shutil.copyfile(path, os.path.join(
                    staged, os.path.basename(path)))
        for name, rel in ours.items():
            src = os.path.join(TOP_BUILDDIR, rel, name)
            if not os.path.exists(src):
                raise HarnessError("%s not built (looked at %s)"
                                   % (name, src))
            shutil.copyfile(src, os.path.join(staged, name))
        return staged

    def mail_plugin_dir(self):
        if self.modules == "system":
            return SYSTEM_MODULEDIR
        return os.path.join(self.tmp, "modules")

    def userdb_text(self):
        if self.users is not None:
            return ("userdb {\n  driver = passwd-file\n"
                    "  args = %s/users\n}" % self.tmp)
        return ("userdb {\n  driver = static\n"
                "  args = uid=%d gid=%d home=%s/%%u allow_all_users=yes\n}"
                % (self.uid, self.gid, self.home_root))

    def config_text(self):
        if is_dovecot24():
            import dovecot_conf24
            return dovecot_conf24.config_text(self)
        t = self.tmp
        plugins = " ".join(self.mail_plugins)
        settings = "".join("  %s = %s\n" % kv
                           for kv in sorted(self.plugin_settings.items()))
        return f"""# generated by tests/e2e/dovecot_harness.py
base_dir = {t}/run
state_dir = {t}/state
instance_name = casbox-test-{os.path.basename(t)}
log_path = {self.log_path}
listen = 127.0.0.1
protocols = {self.protocols}
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain
default_internal_user = {self.internal_user}
default_login_user = {self.login_user}
first_valid_uid = 1
mail_debug = {"yes" if self.mail_debug else "no"}
# No event stats: on a loaded CI box a process's handshake with the
# stats service can time out, an Error line that has nothing to do
# with what a test checks.
stats_writer_socket_path =
mail_plugin_dir = {self.mail_plugin_dir()}
mail_plugins = $mail_plugins {plugins}
mail_location = {self.mail_location}
passdb {{
  driver = static
  args = password={PASSWORD}
  {self.passdb_extra}
}}
{self.userdb_text()}
namespace inbox {{
  inbox = yes
  separator = /
  prefix =
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {self.imap_port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service lmtp {{
  inet_listener lmtp {{
    address = 127.0.0.1
    port = {self.lmtp_port}
  }}
}}
service anvil {{
  chroot =
}}
service imap-login {{
  chroot =
}}
{self.config_listener_text()}plugin {{
{settings}}}
{self.extra_conf}
"""

    # -- clients ---------------------------------------------------------

    def home(self, user):
        return os.path.join(self.home_root, user)

    def lmtp_deliver(self, user, message, sender="sender@example.com"):
        """Deliver one message (bytes) to user over LMTP; raises unless
        the server answered 250 for the recipient."""
        self.lmtp_deliver_many(user, [message], sender)

    def lmtp_deliver_many(self, user, messages, sender="sender@example.com"):
        """Deliver many messages over one LMTP connection."""
        with smtplib.LMTP("127.0.0.1", self.lmtp_port, timeout=120) as lmtp:
            for message in messages:
                refused = lmtp_send(lmtp, sender, user, message)
                if refused:
                    raise HarnessError("LMTP refused %s: %r"
                                       % (user, refused))

    def imap_connect(self):
        return imaplib.IMAP4("127.0.0.1", self.imap_port, timeout=120)

    def imap_login(self, user):
        imap = self.imap_connect()
        imap.login(user, PASSWORD)
        return imap

    def command(self, *argv):
        """argv wrapped so that it runs with this instance's view of the
        doveadm module dir (see private_mounts_available()). Use it for
        every Dovecot binary a test starts itself (e.g. with Popen)."""
        if getattr(self, "doveadm_moddir", None) is None:
            return list(argv)
        if getattr(self, "settings_moddir", None) is None:
            return ["unshare", "-m", "--", "sh", "-c",
                    'mount --bind "$0" "$1" && shift && exec "$@"',
                    self.doveadm_moddir, DOVEADM_MODULEDIR] + list(argv)
        return ["unshare", "-m", "--", "sh", "-c",
                'mount --bind "$0" "$1" && mount --bind "$2" "$3" && '
                'shift 3 && exec "$@"',
                self.doveadm_moddir, DOVEADM_MODULEDIR,
                self.settings_moddir, SETTINGS_MODULEDIR] + list(argv)

    def config_socket(self):
        """The config process's socket while this instance runs (as root:
        see config_listener_text()), else None."""
        if not getattr(self, "root", False) or self.tmp is None:
            return None
        path = os.path.join(self.tmp, "run", "config")
        if (self.master_pid is None or not _pid_alive(self.master_pid)
                or not os.path.exists(path)):
            return None
        return path

    def config_listener_text(self):
        """The config socket owned by the mail user (mode 0600 still), so
        a doveadm that dropped to it (doveadm import, -u commands that
        re-read settings) can read the settings again from the socket it
        was started with (see doveadm_command())."""
        if not self.root:
            return ""
        name = pwd.getpwuid(self.uid).pw_name
        return ("service config {\n  unix_listener config {\n"
                "    user = %s\n    mode = 0600\n  }\n}\n" % name)

    def doveadm_command(self, *args):
        """argv of a doveadm run against this instance (for Popen).

        While the instance runs, doveadm reads its settings from the
        config process's socket instead of parsing the file, which
        execs doveconf on every call: 43 -> 28 ms a call on 2.3, 108 ->
        58 ms on 2.4, over the thousands of doveadm calls of the e2e
        suite (doc/testing.md, "How long the suite takes"). The file
        while it is stopped or its master is gone (a test killed it)."""
        conf = self.config_socket() or self.conf_path
        return self.command(DOVEADM, "-c", conf, *args)

    def doveadm(self, *args, check=True, input=None, text=True):
        """Run doveadm against this instance's config."""
        res = subprocess.run(self.doveadm_command(*args),
                             capture_output=True, text=text, input=input,
                             timeout=600)
        if check and res.returncode != 0:
            raise HarnessError("doveadm %s failed (%d):\n%s%s"
                               % (" ".join(args), res.returncode,
                                  res.stdout, res.stderr))
        return res

    def casbox_audit(self, user):
        """What is wrong with user's casbox store, as a list (empty when
        clean): `doveadm casbox scrub` findings (exit status not 0), and
        tests/storage-dump's refcount and flag-record mismatches."""
        problems = []
        res = self.doveadm("-f", "tab", "casbox", "scrub", "-u", user,
                           check=False)
        if res.returncode != 0:
            problems.append("scrub exit %d: %s%s" % (
                res.returncode, res.stdout[-1500:], res.stderr[-500:]))
        exe = os.path.join(TOP_BUILDDIR, "tests", "storage-dump")
        dump = subprocess.run([exe, os.path.join(self.home(user), "casbox")],
                              user=self.uid, group=self.gid,
                              capture_output=True, text=True)
        if dump.returncode != 0:
            problems.append("storage-dump exit %d: %s" % (
                dump.returncode,
                [ln for ln in dump.stdout.splitlines()
                 if "mismatch" in ln or "orphan" in ln or "bad-" in ln][:10]
                or dump.stderr[-500:]))
        return problems

    # -- processes -------------------------------------------------------

    def pids(self, service):
        """Pids of this instance's running processes of one service
        (children of our master whose executable name is service)."""
        found = []
        if self.master_pid is None:
            return found
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % entry) as f:
                    stat = f.read()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid == self.master_pid and comm == service:
                found.append(int(entry))
        return found

    # -- log -------------------------------------------------------------

    def allow_log(self, regex):
        """Declare an Error/Fatal/Panic log line pattern as expected."""
        self.allowed_log.append(re.compile(regex))

    def log_text(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError as e:
            if e.errno == errno.ENOENT:
                return ""
            raise

    def log_lines(self):
        return self.log_text().splitlines()

    def wait_log(self, regex, timeout=60):
        """The first match of regex in the log, waiting for it: mail
        processes hand their lines to Dovecot's log process, which
        writes them a moment after the IMAP reply the test has already
        read. Returns None if the line never comes within timeout."""
        pattern = re.compile(regex)
        deadline = time.monotonic() + timeout
        while True:
            m = pattern.search(self.log_text())
            if m is not None or time.monotonic() > deadline:
                return m
            time.sleep(0.02)

    def wait_log_count(self, regex, count, timeout=60):
        """Wait until regex matches at least count log lines; returns
        how many match (fewer only when timeout passed)."""
        pattern = re.compile(regex)
        deadline = time.monotonic() + timeout
        while True:
            n = sum(1 for line in self.log_lines() if pattern.search(line))
            if n >= count or time.monotonic() > deadline:
                return n
            time.sleep(0.02)

    def log_problems(self):
        lines = drop_core_indexer_deinit_panic(self.log_lines())
        lines = drop_shutdown_auth_disconnect(
            lines, getattr(self, "stop_mark", None))
        return [line for line in lines
                if LOG_PROBLEM_RE.search(line)
                and not any(r.search(line) for r in self.allowed_log)]
