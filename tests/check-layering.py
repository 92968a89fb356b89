#!/usr/bin/env python3
"""The layering rules of doc/architecture.md, checked on every make check.

1. A file includes only headers of its own directory or of a lower layer
   (never a higher layer, never a sibling of its own layer).
2. A *-private.h header is included only from its own directory.
3. The Dovecot glue (storage, fts, doveadm) includes no lsm/ or blob/
   header: it goes through the store layer's public header.
4. The doveadm and fts module .so files reference no symbol defined by
   the lsm or blob libraries (nm -D --undefined-only).

Known violations, still to be refactored away, are listed in
tests/layering-allow.txt; the check fails on any violation not listed
there, and on a listed one that no longer exists (so the list only
shrinks). Run by hand: tests/check-layering.py [--list] (srcdir and
builddir from CASBOX_TOP_SRCDIR / CASBOX_TOP_BUILDDIR, or the checkout
and ./build).
"""

import os
import re
import subprocess
import sys

# directory (relative to src/) -> layer; lower numbers are lower layers.
LAYERS = {
    "durable": 0,
    "crypt": 1,
    "aecs": 1,
    "storage-casbox/blob": 2,
    "storage-casbox/lsm": 2,
    "fts-casidx/tokenizer": 2,
    "fts-casidx/postings": 2,
    "fts-casidx/bm25": 2,
    "storage-casbox/store": 3,
    "storage-casbox": 4,
    "fts-casidx": 4,
    "doveadm-casbox": 5,
}
GLUE = {"storage-casbox", "fts-casidx", "doveadm-casbox"}
FORMAT_LIBS = {"storage-casbox/blob", "storage-casbox/lsm"}
MODULES = [
    ("src/doveadm-casbox/.libs/lib10_doveadm_casbox_plugin.so", "doveadm"),
    ("src/fts-casidx/.libs/lib21_fts_casidx_plugin.so", "fts"),
]
FORMAT_OBJDIRS = ["src/storage-casbox/blob/.libs",
                  "src/storage-casbox/lsm/.libs"]

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def tree_dirs():
    src = os.path.join(os.path.abspath(os.path.dirname(__file__)), "..")
    return (os.environ.get("CASBOX_TOP_SRCDIR", os.path.normpath(src)),
            os.environ.get("CASBOX_TOP_BUILDDIR",
                           os.path.join(os.path.normpath(src), "build")))


def source_files(srcdir):
    out = []
    for root, _dirs, files in os.walk(os.path.join(srcdir, "src")):
        for f in files:
            if f.endswith((".c", ".h")):
                out.append(os.path.join(root, f))
    return sorted(out)


def layer_dir(srcdir, path):
    rel = os.path.relpath(os.path.dirname(path), os.path.join(srcdir, "src"))
    return rel if rel in LAYERS else None


def include_violations(srcdir):
    files = source_files(srcdir)
    headers = {}
    for f in files:
        if f.endswith(".h"):
            headers.setdefault(os.path.basename(f), []).append(f)
    found = []
    for f in files:
        own = layer_dir(srcdir, f)
        if own is None:
            continue
        with open(f, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        rel = os.path.relpath(f, srcdir)
        for inc in INCLUDE_RE.findall(text):
            name = os.path.basename(inc)
            # a .c included from the tree resolves like a header
            for target in headers.get(name, []):
                tdir = layer_dir(srcdir, target)
                if tdir is None or tdir == own:
                    continue
                trel = os.path.relpath(target, srcdir)
                if LAYERS[tdir] > LAYERS[own]:
                    found.append(f"{rel}: higher layer {trel}")
                elif LAYERS[tdir] == LAYERS[own]:
                    found.append(f"{rel}: sibling {trel}")
                elif name.endswith("-private.h"):
                    found.append(f"{rel}: private {trel}")
                elif own in GLUE and tdir in FORMAT_LIBS:
                    found.append(f"{rel}: format library {trel}")
    return found


def defined_symbols(builddir):
    objs = []
    for d in FORMAT_OBJDIRS:
        d = os.path.join(builddir, d)
        objs += [os.path.join(d, o) for o in sorted(os.listdir(d))
                 if o.endswith(".o")]
    out = subprocess.run(["nm", "-g", "--defined-only"] + objs,
                         check=True, capture_output=True, text=True).stdout
    syms = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBR":
            syms.add(parts[2])
    return syms


def symbol_violations(builddir):
    lib_syms = defined_symbols(builddir)
    found = []
    for so, name in MODULES:
        path = os.path.join(builddir, so)
        out = subprocess.run(["nm", "-D", "--undefined-only", path],
                             check=True, capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            sym = line.split()[-1]
            if sym in lib_syms:
                found.append(f"{name} module: undefined {sym}")
    return found


PLUGIN = "src/storage-casbox/.libs/lib20_casbox_plugin.so"
DOVEADM = MODULES[0][0]
# what casbox-plugin.map exports for the driver modules
DRIVER_API = {"casbox_objstore_opt", "casbox_objstore_read_secret"}
DRIVER_MODULES = ["src/storage-casbox/.libs/libcasbox_objstore_rados.so",
                  "src/storage-casbox/.libs/libcasbox_objstore_s3.so"]


def dyn_symbols(path, which):
    out = subprocess.run(["nm", "-D", which, path], check=True,
                         capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def export_errors(builddir):
    """The doveadm plugin resolves its casbox symbols from
    lib20_casbox_plugin.so (loaded first, RTLD_GLOBAL): each must be
    exported there (casbox-plugin.map), or doveadm fails to load it."""
    exported = dyn_symbols(os.path.join(builddir, PLUGIN), "--defined-only")
    needed = {sym for sym in dyn_symbols(os.path.join(builddir, DOVEADM),
                                         "--undefined-only")
              if sym.startswith(("cas_", "casbox_"))}
    print(f"layering: lib20_casbox_plugin.so exports {len(exported)} "
          f"symbols; the doveadm plugin needs {len(needed)} of them")
    # the object-storage driver modules (built when librados/libcurl
    # are there), dlopen()ed by lib20 and resolving from it likewise
    drivers_built = 0
    for so in DRIVER_MODULES:
        path = os.path.join(builddir, so)
        if not os.path.exists(path):
            continue
        drivers_built += 1
        drv = {sym for sym in dyn_symbols(path, "--undefined-only")
               if sym.startswith(("cas_", "casbox_"))}
        print(f"layering: {os.path.basename(so)} needs {len(drv)}")
        needed |= drv
    entry = {"casbox_plugin_init", "casbox_plugin_deinit",
             "casbox_plugin_version", "casbox_storage"}
    if drivers_built == 0:
        # a build without librados and libcurl (the Dovecot 2.4 root)
        # has no driver module to need the helpers exported for them
        entry |= DRIVER_API
    extra = {sym for sym in exported - needed - entry
             if sym.startswith(("cas_", "casbox_"))}
    return ([f"FAIL doveadm or a driver module needs {sym}, not exported by "
             f"lib20_casbox_plugin.so (casbox-plugin.map)"
             for sym in sorted(needed - exported)] +
            [f"FAIL {sym} is exported by lib20_casbox_plugin.so but "
             f"nothing needs it: remove it from casbox-plugin.map"
             for sym in sorted(extra)])


def read_allow(srcdir):
    path = os.path.join(srcdir, "tests", "layering-allow.txt")
    allow = set()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line and not line.startswith("#"):
                allow.add(line)
    return allow


def self_test():
    """The include rules find each kind of violation in a made-up tree."""
    import tempfile
    files = {
        "src/crypt/a.h": '#include "g.h"\n',
        "src/storage-casbox/g.h": '#include "lsm.h"\n#include "p-private.h"\n',
        "src/storage-casbox/lsm/lsm.h": '#include "b.h"\n',
        "src/storage-casbox/lsm/p-private.h": "",
        "src/storage-casbox/blob/b.h": "",
    }
    want = {
        "src/crypt/a.h: higher layer src/storage-casbox/g.h",
        "src/storage-casbox/g.h: format library src/storage-casbox/lsm/lsm.h",
        "src/storage-casbox/g.h: private src/storage-casbox/lsm/p-private.h",
        "src/storage-casbox/lsm/lsm.h: sibling src/storage-casbox/blob/b.h",
    }
    with tempfile.TemporaryDirectory() as top:
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(top, rel)),
                        exist_ok=True)
            with open(os.path.join(top, rel), "w") as fh:
                fh.write(text)
        got = set(include_violations(top))
    if got != want:
        print(f"FAIL self-test: found {sorted(got)}, want {sorted(want)}")
        return False
    return True


def main():
    srcdir, builddir = tree_dirs()
    if not self_test():
        return 1
    found = sorted(set(include_violations(srcdir) +
                       symbol_violations(builddir)))
    if "--list" in sys.argv:
        print("\n".join(found))
        return 0
    allow = read_allow(srcdir)
    new = [v for v in found if v not in allow]
    gone = sorted(allow - set(found))
    print(f"layering: {len(found)} known violations "
          f"({sum(1 for v in found if ' module: ' in v)} symbol), "
          f"{len(new)} new, {len(gone)} fixed but still listed")
    for v in new:
        print(f"FAIL new violation: {v}")
    for v in gone:
        print(f"FAIL no longer a violation, remove from "
              f"tests/layering-allow.txt: {v}")
    errors = export_errors(builddir)
    for e in errors:
        print(e)
    return 1 if new or gone or errors else 0


if __name__ == "__main__":
    sys.exit(main())
