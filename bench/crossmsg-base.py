#!/usr/bin/python3
"""Which earlier message is the best zstd prefix for a new one?
Per folder of the corpus, in file (arrival) order: bytes/mail byte for
each message alone, with its parent (In-Reply-To / last References), with
the sender's previous message, with the previous N, and per message the
best of parent/sender (what a selector trying both would get)."""
import email.parser, email.policy, glob, os, re, sys, zstandard

LEVEL = 3
def msgid(v):
    m = re.findall(r"<[^>]+>", v or "")
    return m
def main():
    if len(sys.argv) < 3:
        sys.exit("usage: crossmsg-base.py CORPUS-DIR FOLDER...")
    root = sys.argv[1]
    folders = sys.argv[2:]
    p = email.parser.BytesHeaderParser(policy=email.policy.compat32)
    plain = zstandard.ZstdCompressor(level=LEVEL)
    for folder in folders:
        files = sorted(glob.glob(os.path.join(root, folder, "**", "*"), recursive=True))
        files = [f for f in files if os.path.isfile(f)]
        by_id, by_from, prev = {}, {}, []
        tot = {"mail": 0, "alone": 0, "parent": 0, "sender": 0, "best": 0, "prev8": 0, "both": 0, "kf": 0}
        hits = {"parent": 0, "sender": 0}
        for f in files:
            data = open(f, "rb").read()
            try:
                h = p.parsebytes(data)
            except Exception:
                h = {}
            tot["mail"] += len(data)
            alone = len(plain.compress(data))
            tot["alone"] += alone
            def with_prefix(base):
                if base is None:
                    return alone
                d = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
                c = zstandard.ZstdCompressor(level=LEVEL, dict_data=d)
                return min(alone, len(c.compress(data)))
            parent = None
            refs = msgid(str(h.get("In-Reply-To", "") or "")) or msgid(str(h.get("References", "") or ""))[-1:]
            for r in refs[::-1]:
                if r in by_id:
                    parent = by_id[r]; break
            frm = str(h.get("From", "") or "").lower()
            fm = re.search(r"[\w.+-]+@[\w.-]+", frm)
            sender = by_from.get(fm.group(0)) if fm else None
            a = with_prefix(parent); b = with_prefix(sender)
            if parent is not None: hits["parent"] += 1
            if sender is not None: hits["sender"] += 1
            tot["parent"] += a; tot["sender"] += b; tot["best"] += min(a, b)
            tot["prev8"] += with_prefix(b"".join(prev[-8:]) if prev else None)
            both = b"".join(x for x in (sender, parent) if x is not None and x is not (parent if x is sender and sender is parent else None))
            tot["both"] += with_prefix(both or None)
            kf = [prev[i] for i in range(0, len(prev), 8)][-4:]
            tot["kf"] += with_prefix(b"".join(kf) if kf else None)
            for r in msgid(str(h.get("Message-ID", "") or ""))[:1]:
                by_id[r] = data
            if fm: by_from[fm.group(0)] = data
            prev.append(data)
        m = tot["mail"]
        print("%-16s %5d msgs %7.1f MB  alone %.3f  parent %.3f (%d)  sender %.3f (%d)  best-of-2 %.3f  prev8 %.3f  parent+sender %.3f  4 keyframes %.3f" % (
            folder, len(files), m / 1e6, tot["alone"] / m, tot["parent"] / m, hits["parent"],
            tot["sender"] / m, hits["sender"], tot["best"] / m, tot["prev8"] / m, tot["both"] / m, tot["kf"] / m))
main()
