#!/usr/bin/python3
"""Base plan for bench/xmsg (issue 16 step 4): every file of the given
folders in file (arrival) order, one line each: "path<TAB>base", base =
the line number (0-based) of the message it replies to (In-Reply-To, else
the last References entry) if that came earlier, else the sender's
previous message (From address), else -1. The selection of
bench/crossmsg-base.py, without compressing anything.

usage: xmsg-plan.py CORPUS-DIR FOLDER... > plan"""
import email.parser, email.policy, glob, os, re, sys


def ids(v):
    return re.findall(r"<[^>]+>", v or "")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    root = sys.argv[1]
    p = email.parser.BytesHeaderParser(policy=email.policy.compat32)
    n = 0
    for folder in sys.argv[2:]:
        files = sorted(glob.glob(os.path.join(root, folder, "**", "*"),
                                 recursive=True))
        by_id, by_from = {}, {}
        for f in (f for f in files if os.path.isfile(f)):
            data = open(f, "rb").read()
            try:
                h = p.parsebytes(data)
            except Exception:
                h = {}
            base = -1
            refs = (ids(str(h.get("In-Reply-To", "") or "")) or
                    ids(str(h.get("References", "") or ""))[-1:])
            for r in refs[::-1]:
                if r in by_id:
                    base = by_id[r]
                    break
            fm = re.search(r"[\w.+-]+@[\w.-]+",
                           str(h.get("From", "") or "").lower())
            if base < 0 and fm and fm.group(0) in by_from:
                base = by_from[fm.group(0)]
            print("%s\t%d" % (f, base))
            for r in ids(str(h.get("Message-ID", "") or ""))[:1]:
                by_id[r] = n
            if fm:
                by_from[fm.group(0)] = n
            n += 1


main()
