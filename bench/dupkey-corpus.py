#!/usr/bin/env python3
"""Which duplicate-delivery key has false positives on a corpus?

For every message file under the given directories, computes candidate
keys and counts, per key, the groups of messages that share the key but
differ in their bytes (after LF normalisation, as casbox stores them).
Such a group would make casbox_duplicate_window suppress a message that
is not a redelivery of another: a false positive, or, for messages that
differ only where the key ignores them, a copy of the same message.

Keys (doc/casbox-storage.md, "Duplicate deliveries"):
  full      all bytes
  trace     all bytes without the trace header fields (Return-Path,
            Received, Delivered-To, X-Original-To): what casbox uses
  msgid     the Message-ID header alone (Cyrus' duplicatesuppression)
  msgid+body  Message-ID and the body after the header
Usage: bench/dupkey-corpus.py DIR...
"""
import hashlib, os, re, sys
from collections import defaultdict

TRACE = {b"return-path", b"received", b"delivered-to", b"x-original-to"}


def split(data):
    i = data.find(b"\n\n")
    return (data, b"") if i < 0 else (data[:i + 1], data[i + 1:])


def fields(header):
    cur = []
    for line in header.splitlines(keepends=True):
        if line[:1] in (b" ", b"\t") and cur:
            cur.append(line)
            continue
        if cur:
            yield b"".join(cur)
        cur = [line]
    if cur:
        yield b"".join(cur)


def name(field):
    return field.split(b":", 1)[0].strip().lower()


def keys(data):
    header, body = split(data)
    kept = b"".join(f for f in fields(header) if name(f) not in TRACE)
    msgid = b""
    for f in fields(header):
        if name(f) == b"message-id":
            msgid = f.split(b":", 1)[1].strip()
            break
    return {"full": data, "trace": kept + body,
            "msgid": msgid or None,
            "msgid+body": (msgid + b"\0" + body) if msgid else None}


def main(dirs):
    groups = {k: defaultdict(set) for k in ("full", "trace", "msgid",
                                            "msgid+body")}
    n = nomsgid = 0
    for d in dirs:
        for root, _, files in os.walk(d):
            for fn in files:
                if fn.endswith(".md"):
                    continue
                with open(os.path.join(root, fn), "rb") as f:
                    data = f.read().replace(b"\r\n", b"\n")
                n += 1
                full = hashlib.sha256(data).digest()
                ks = keys(data)
                nomsgid += ks["msgid"] is None
                for k, v in ks.items():
                    if v is not None:
                        groups[k][hashlib.sha256(v).digest()].add(full)
    print(f"messages: {n}")
    print(f"without Message-ID (no msgid key): {nomsgid}")
    print("key          messages-sharing-a-key-with-other-bytes  groups")
    for k, g in groups.items():
        shared = [s for s in g.values() if len(s) > 1]
        print(f"{k:12} {sum(len(s) for s in shared):39}  {len(shared):6}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["/work/shared/corpus"])
