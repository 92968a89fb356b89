#!/usr/bin/env python3
"""The first casidx search of a fresh process: `doveadm search` and a
fresh IMAP login, with exact counts next to the times.

Builds one instance with bench/fts.py's casidx configuration (casidx on
casbox, sealed segments), appends N corpus messages and runs `doveadm
index` with the plugins of the first --build. Then, --runs times, for
each --build in turn (the fts-casidx plugin's symlink in the instance's
module dir is pointed at that build; the index is the same), runs each
search:

  doveadm  a fresh `doveadm -D search -u USER mailbox INBOX KEY VALUE`:
           wall, user+sys CPU and minor page faults of the process
           (wait4() rusage; not its peak RSS, which a child forked from
           this Python process, holding the corpus, inherits: use
           /usr/bin/time -f %M on doveadm itself for that)
  imap     a fresh IMAP login, SELECT, then the timed UID SEARCH: wall
           of the SEARCH, and the imap process's minor faults and CPU
           from /proc before LOGOUT (login and SELECT included)

and prints the casidx debug line of the segment opens (`segments
opened: ...`, if the build has it) of the doveadm run.

  CASBOX_TOP_BUILDDIR=$PWD/build CASBOX_TOP_SRCDIR=$PWD \\
      CASBOX_MODULEDIR=/usr/lib/dovecot/modules \\
      python3 bench/casidx-first-search.py -n 10000 --runs 3 \\
      --build /work/base/build --build $PWD/build
"""

import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

import dovecot_harness as harness  # noqa: E402
from imapraw import RawIMAP  # noqa: E402
import bench  # noqa: E402
import fts  # noqa: E402
import storage  # noqa: E402

PLUGIN = "lib21_fts_casidx_plugin.so"
PLUGIN_REL = harness.OUR_MAIL_MODULES[PLUGIN]
DEFAULT_SEARCHES = [("BODY", "the"), ("BODY", "xyzzyquux"),
                    ("SUBJECT", "usrp")]


def use_build(dc, build):
    link = os.path.join(dc.tmp, "modules", PLUGIN)
    os.unlink(link)
    os.symlink(os.path.join(build, PLUGIN_REL, PLUGIN), link)


def proc_stat(pid):
    """(minor faults, user+sys CPU s) of a running process."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[7]), (int(fields[11]) + int(fields[12])) / tick


def doveadm_search_rusage(dc, key, value):
    """doveadm search under wait4() for its rusage."""
    argv = dc.doveadm_command("-D", "search", "-u",
                              fts.USER, "mailbox", "INBOX", key, value)
    out_path = os.path.join(dc.tmp, "first-search.out")
    err_path = os.path.join(dc.tmp, "first-search.err")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.perf_counter()
        pid = os.posix_spawnp(argv[0], argv, os.environ,
                              file_actions=[
                                  (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                                  (os.POSIX_SPAWN_DUP2, err.fileno(), 2)])
        _, status, ru = os.wait4(pid, 0)
        ms = (time.perf_counter() - t0) * 1000
    with open(out_path, "rb") as f:
        nlines = len(f.read().splitlines())
    with open(err_path, "rb") as f:
        err = f.read().decode("utf-8", "replace")
    if status != 0:
        raise RuntimeError("doveadm search failed: %s" % err[-2000:])
    return ms, nlines, ru, err


def imap_first_search(dc, key, value):
    with RawIMAP(dc.imap_port) as c:
        c.login(fts.USER, harness.PASSWORD)
        c.select("INBOX")
        pids = dc.pids("imap")
        assert len(pids) == 1, pids
        flt0, cpu0 = proc_stat(pids[0])
        ms, uids = fts._timed_search(c, fts._search_cmd(key, value))
        flt, cpu = proc_stat(pids[0])
    return ms, len(uids), flt - flt0, cpu - cpu0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--build", action="append", required=True,
                    help="top build dir whose fts-casidx plugin to use "
                    "(repeat; alternated in this order)")
    ap.add_argument("-s", "--search", action="append", default=[],
                    help="KEY:value (e.g. BODY:the); default a mix")
    ap.add_argument("--imap-first", action="store_true",
                    help="the IMAP search before the doveadm one (the "
                    "instance's very first search is then an IMAP one, "
                    "as in bench/fts.py)")
    args = ap.parse_args()
    searches = ([tuple(s.split(":", 1)) for s in args.search]
                or DEFAULT_SEARCHES)

    _, paths = bench.corpus_messages(harness, args.n)
    messages = harness.load(paths)
    loc, plugins, settings, _ = fts.ENGINE_CONFIGS["casidx"]
    settings = dict(settings)
    settings.update(fts_autoindex="no", fts_enforced="yes")
    with harness.Dovecot(mail_location=loc, mail_plugins=plugins,
                         plugin_settings=settings,
                         extra_conf=storage.COMMON_CONF) as dc:
        use_build(dc, args.build[0])
        with RawIMAP(dc.imap_port) as c:
            c.login(fts.USER, harness.PASSWORD)
            for i in range(0, len(messages), 100):
                c.append("INBOX", messages[i:i + 100])
        dc.doveadm("index", "-u", fts.USER, "INBOX")
        print("%d messages, casidx sealed; per run and build: doveadm "
              "search (wall ms, CPU ms, minflt) | fresh IMAP "
              "login (SEARCH wall ms, imap CPU ms, minflt)" % len(messages))
        for run in range(args.runs):
            for bi, build in enumerate(args.build):
                use_build(dc, build)
                for key, value in searches:
                    if args.imap_first:
                        ims, iuids, iflt, icpu = imap_first_search(
                            dc, key, value)
                    ms, n, ru, err = doveadm_search_rusage(dc, key, value)
                    if not args.imap_first:
                        ims, iuids, iflt, icpu = imap_first_search(
                            dc, key, value)
                    print("run %d build %d %-7s %-10s doveadm %4d hits "
                          "%7.1f ms cpu %6.1f ms minflt %6d "
                          "| imap %4d uids %7.1f ms cpu %6.1f ms minflt "
                          "%6d" % (run, bi, key, value, n, ms,
                                   (ru.ru_utime + ru.ru_stime) * 1000,
                                   ru.ru_minflt,
                                   iuids, ims, icpu * 1000, iflt))
                    for line in err.splitlines():
                        m = re.search(r"(segments opened: .*|"
                                      r"lookup of .*)", line)
                        if m:
                            print("    " + m.group(0))
                    sys.stdout.flush()


if __name__ == "__main__":
    main()
