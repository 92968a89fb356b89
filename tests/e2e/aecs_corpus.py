"""Helpers for the AECS export tests: fill a user's casbox with corpus
folders (through a maildir and `doveadm import`, so every message keeps
its bytes and lands in a folder named after its corpus directory), and
an independent reading of what the rows must be."""

import hashlib
import os
import re
import shutil

from dovecot_harness import corpus_dir, is_dovecot24


def corpus_folders(tops):
    """{mailbox name: [paths]} for the corpus directories under each
    name of tops (the mailbox of spamassassin/easy-ham-1 is
    "spamassassin/easy-ham-1")."""
    out = {}
    for top in tops:
        base = os.path.join(corpus_dir(), top)
        for dirpath, dirs, names in os.walk(base):
            dirs.sort()
            files = sorted(n for n in names if not n.startswith("."))
            if not files:
                continue
            rel = os.path.relpath(dirpath, corpus_dir())
            out[rel.replace(os.sep, "/")] = [os.path.join(dirpath, n)
                                             for n in files]
    return out


def chown_tree(dc, root):
    os.chown(root, dc.uid, dc.gid)
    for dirpath, dirs, names in os.walk(root):
        for n in dirs + names:
            os.chown(os.path.join(dirpath, n), dc.uid, dc.gid)


def fill(dc, folders, user="user1"):
    """Import folders ({mailbox: [paths]}) into user's mail. Returns
    {mailbox: [bytes]} in UID order."""
    home = dc.home(user)
    src = os.path.join(home, "aecs-src")
    loaded = {}
    for box, paths in folders.items():
        d = os.path.join(src, "." + box.replace("/", "."))
        for sub in ("cur", "new", "tmp"):
            os.makedirs(os.path.join(d, sub))
        loaded[box] = []
        for i, path in enumerate(paths):
            # maildir names sort in UID order on import
            name = "%d.M%dP1.aecs:2," % (1700000000 + i, i)
            shutil.copyfile(path, os.path.join(d, "cur", name))
            with open(path, "rb") as f:
                loaded[box].append(f.read())
    chown_tree(dc, home)
    # 2.4 takes driver:path only (maildir++ is its maildir default)
    source = ("maildir:~/aecs-src" if is_dovecot24() else
              "maildir:~/aecs-src:LAYOUT=maildir++")
    dc.doveadm("import", "-u", user, "-s", source, "", "all")
    shutil.rmtree(src)
    return loaded


def first_header(raw, name):
    """The unfolded value of the first header called name, or None."""
    head = re.split(rb"\r?\n\r?\n", raw, maxsplit=1)[0]
    # (obsolete syntax allows blanks before the colon)
    m = re.search(rb"^" + re.escape(name) +
                  rb"[ \t]*:[ \t]*(.*(?:\r?\n[ \t].*)*)", head, re.I | re.M)
    if m is None:
        return None
    return re.sub(rb"\r?\n[ \t]+", b" ", m.group(1)).strip()


def msgids(value, require_at):
    """RFC 5322 msg-ids as the export reads them (doc/aecs.md): the text
    of each "<...>" without whitespace, empty ones (and with require_at
    those without "@") left out; no "<...>" at all: the value itself."""
    out, pos, bracketed = [], 0, False
    while True:
        lt = value.find(b"<", pos)
        gt = value.find(b">", lt + 1) if lt >= 0 else -1
        if gt < 0:
            break
        bracketed = True
        ident = re.sub(rb"[ \t\r\n\0]", b"", value[lt + 1:gt])
        if ident and (not require_at or b"@" in ident):
            out.append(ident.decode("utf-8", "replace"))
        pos = gt + 1
    if not bracketed and not require_at:
        ident = re.sub(rb"[ \t\r\n\0]", b"", value)
        if ident:
            out.append(ident.decode("utf-8", "replace"))
    return out


def message_id(raw):
    """The Message-ID as the export must have it (no angle brackets),
    or None when the message has no usable one."""
    value = first_header(raw, b"message-id")
    ids = [] if value is None else msgids(value, False)
    return ids[0] if ids else None


def linked_ids(raw, header):
    """The ids of References or In-Reply-To (with an "@")."""
    value = first_header(raw, header)
    return [] if value is None else msgids(value, True)


def stored(raw):
    """raw as Dovecot stores it (mail_save_crlf = no: LF line ends)."""
    return raw.replace(b"\r\n", b"\n")


def leaf_parts(msg):
    """The leaf MIME parts of an email.message in MIME order; an
    attached message/rfc822 is one leaf (not descended into)."""
    if msg.is_multipart() and msg.get_content_type() != "message/rfc822":
        for sub in msg.get_payload():
            yield from leaf_parts(sub)
    else:
        yield msg


def sha256_hex(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def db_dir(dc, user="user1"):
    """A directory the mail user can write the export into."""
    d = os.path.join(dc.home(user), "aecs-out")
    os.makedirs(d, exist_ok=True)
    os.chown(d, dc.uid, dc.gid)
    return d
