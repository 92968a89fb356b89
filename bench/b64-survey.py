#!/usr/bin/python3
"""Issue 16 step 3 groundwork: how many base64 leaf bodies of a corpus
re-encode byte for byte from their decoded bytes (so they could be
stored decoded), and what decoding would save before compression.

    python3 bench/b64-survey.py [corpus-dir ...]

A body counts as exact when: every line ends the same way (CRLF or LF),
every line but the last has one length L (a multiple of 4, the encoder's
line length), the last is 1..L characters, only the base64 alphabet and
'=' padding appear, and base64-encoding the decoded bytes and folding
them at L with that line end gives the original bytes back (this rejects
bad padding and non-zero trailing bits, which decode but re-encode
differently). A final line end may be present or not (the MIME boundary
owns the last CRLF); both are recorded. Prints one line per folder and a
total. Not a benchmark of casbox: a survey of the mail."""

import base64
import binascii
import email.parser
import email.policy
import os
import sys

ALPHABET = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
               b"0123456789+/=")


def classify(body):
    """(exact, reason) for one base64 body (bytes as stored)."""
    if not body:
        return False, "empty"
    eol = b"\r\n" if body.find(b"\r\n") != -1 else b"\n"
    final_eol = body.endswith(eol)
    text = body[:-len(eol)] if final_eol else body
    lines = text.split(eol)
    if any(b"\r" in ln or b"\n" in ln for ln in lines):
        return False, "mixed line ends"
    width = len(lines[0])
    if width == 0 or width % 4 != 0:
        return False, "line length not a multiple of 4"
    if any(len(ln) != width for ln in lines[:-1]) or \
            not 0 < len(lines[-1]) <= width:
        return False, "uneven lines"
    joined = b"".join(lines)
    if not set(joined) <= ALPHABET:
        return False, "other characters (spaces, junk)"
    try:
        data = base64.b64decode(joined, validate=True)
    except binascii.Error:
        return False, "bad padding"
    enc = base64.b64encode(data)
    again = eol.join(enc[i:i + width] for i in range(0, len(enc), width))
    if final_eol:
        again += eol
    if again != body:
        return False, "non-canonical bits or padding"
    return True, "exact"


def survey(folder):
    parser = email.parser.BytesParser(policy=email.policy.compat32)
    stats = {"messages": 0, "mail_bytes": 0, "b64_parts": 0,
             "b64_bytes": 0, "exact_parts": 0, "exact_bytes": 0,
             "decoded_bytes": 0, "reasons": {}}
    for dirpath, _, files in os.walk(folder):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                raw = f.read()
            stats["messages"] += 1
            stats["mail_bytes"] += len(raw)
            msg = parser.parsebytes(raw)
            for part in msg.walk():
                if part.is_multipart():
                    continue
                cte = str(part.get("Content-Transfer-Encoding", "")).strip()
                if cte.lower() != "base64":
                    continue
                payload = part.get_payload(decode=False)
                if not isinstance(payload, str):
                    continue
                body = payload.encode("ascii", "surrogateescape")
                stats["b64_parts"] += 1
                stats["b64_bytes"] += len(body)
                exact, reason = classify(body)
                stats["reasons"][reason] = stats["reasons"].get(reason, 0) + 1
                if exact:
                    stats["exact_parts"] += 1
                    stats["exact_bytes"] += len(body)
                    stats["decoded_bytes"] += len(base64.b64decode(
                        b"".join(body.split())))
    return stats


def main(argv):
    folders = argv or ["/work/shared/corpus/" + f for f in
                       ("usrp-users-3000", "spamassassin", "notmuch",
                        "mime-edge")]
    total = None
    for folder in folders:
        s = survey(folder)
        print("%s: %d messages, %.1f MB; base64 parts %d (%.1f MB, %.0f%% "
              "of the mail); exact %d parts, %.1f MB (%.1f%% of base64 "
              "bytes), decoded %.1f MB; rejected: %s"
              % (folder, s["messages"], s["mail_bytes"] / 1e6, s["b64_parts"],
                 s["b64_bytes"] / 1e6,
                 100.0 * s["b64_bytes"] / max(1, s["mail_bytes"]),
                 s["exact_parts"], s["exact_bytes"] / 1e6,
                 100.0 * s["exact_bytes"] / max(1, s["b64_bytes"]),
                 s["decoded_bytes"] / 1e6,
                 ", ".join("%s %d" % kv for kv in sorted(
                     s["reasons"].items()) if kv[0] != "exact") or "none"))
        if total is None:
            total = dict(s, reasons={})
        else:
            for k in s:
                if k != "reasons":
                    total[k] += s[k]
    if len(folders) > 1:
        print("total: base64 %.1f MB of %.1f MB mail; exact %.1f MB "
              "(%.1f%%), decoded %.1f MB: storing exact bodies decoded "
              "removes %.1f MB (%.1f%% of the mail) before compression"
              % (total["b64_bytes"] / 1e6, total["mail_bytes"] / 1e6,
                 total["exact_bytes"] / 1e6,
                 100.0 * total["exact_bytes"] / max(1, total["b64_bytes"]),
                 total["decoded_bytes"] / 1e6,
                 (total["exact_bytes"] - total["decoded_bytes"]) / 1e6,
                 100.0 * (total["exact_bytes"] - total["decoded_bytes"]) /
                 max(1, total["mail_bytes"])))


if __name__ == "__main__":
    main(sys.argv[1:])
