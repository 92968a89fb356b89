"""Dump everything dsync must carry for one user, as plain Python data,
so two stores can be compared field by field (doc/migration.md has the
inventory and the rule for each field).

    dump = dump_user(dc, "user1")                  # configured location
    dump = dump_user(dc, "user1", "sdbox:~/back")  # another location
    problems = compare(src_dump, dst_dump)         # [] when equal

What is read, and how:
  mailboxes    doveadm mailbox status: guid uidvalidity uidnext
               highestmodseq messages, for every mailbox
  messages     doveadm fetch: mailbox-guid mailbox uid guid flags
               date.received date.saved size.physical modseq pop3.uidl
               pop3.order
  bytes        IMAP UID FETCH BODY.PEEK[] (sha256 per message), only for
               the configured location (IMAP serves that one)
  keywords     the FLAGS answer of IMAP SELECT (names, in index order)
  subscribed   doveadm mailbox list -s
  attributes   doveadm mailbox metadata list -p / get, per mailbox and
               for the server ("" mailbox, -s)
  special-use  IMAP LIST "" * RETURN (SPECIAL-USE)

Everything goes through Dovecot's own tools, never the files, so the
same dump works for maildir, sdbox, mdbox and casbox.
"""

import hashlib
import imaplib
import re

from dovecot_harness import is_dovecot24, location_override

STATUS_FIELDS = "guid uidvalidity uidnext highestmodseq messages"
FETCH_FIELDS = ("mailbox-guid mailbox uid guid flags date.received "
                "date.saved size.physical modseq pop3.uidl pop3.order")

imaplib.Commands.setdefault("GETMETADATA", ("AUTH", "SELECTED"))


def _loc_args(location):
    return location_override(location) if location else []


def _tab(dc, args, location=None):
    """Run a doveadm command with the tab formatter; list of dicts."""
    res = dc.doveadm("-f", "tab", *(_loc_args(location) + list(args)))
    lines = res.stdout.split("\n")
    header = lines[0].split("\t")
    rows = []
    for line in lines[1:]:
        if line == "":
            continue
        values = line.split("\t")
        if len(values) != len(header):
            raise AssertionError("doveadm %s: row %r does not match "
                                 "header %r" % (args, line, header))
        rows.append(dict(zip(header, values)))
    return rows


def mailboxes(dc, user, location=None):
    rows = _tab(dc, ["mailbox", "status", "-u", user, STATUS_FIELDS, "*"],
                location)
    return {r["mailbox"]: r for r in rows}


def messages(dc, user, location=None):
    """(mailbox, uid) -> fetch row."""
    rows = _tab(dc, ["fetch", "-u", user, FETCH_FIELDS, "all"], location)
    return {(r["mailbox"], int(r["uid"])): r for r in rows}


def subscriptions(dc, user, location=None):
    res = dc.doveadm(*(_loc_args(location)
                       + ["mailbox", "list", "-s", "-u", user]))
    return sorted(line for line in res.stdout.split("\n") if line)


def attributes(dc, user, boxes, location=None):
    """{(mailbox, key): value} for every mailbox and for the server
    attributes (mailbox "")."""
    out = {}
    targets = [(b, []) for b in boxes] + [("", ["-s"])]
    for box, extra in targets:
        keys = _tab(dc, ["mailbox", "metadata", "list", "-u", user]
                    + extra + ["-p", box], location)
        for row in keys:
            key = row["key"]
            if not key.startswith("/"):
                raise AssertionError("metadata list -p gave %r" % key)
            val = _tab(dc, ["mailbox", "metadata", "get", "-u", user]
                       + extra + [box, key], location)
            out[(box, key)] = val[0]["value"] if val else None
    return out


def _ok(typ_data):
    typ, data = typ_data
    if typ != "OK":
        raise AssertionError("IMAP command failed: %r %r" % (typ, data))
    return data


def imap_view(dc, user, boxes):
    """Through IMAP (configured location only): per mailbox the keyword
    list of SELECT's FLAGS, per message the sha256 of BODY[], and the
    SPECIAL-USE attributes of LIST."""
    imap = dc.imap_login(user)
    try:
        keywords, digests = {}, {}
        for box in boxes:
            _ok(imap.select('"%s"' % box, readonly=True))
            flags = imap.response("FLAGS")[1][0]
            names = flags.decode().strip("()").split()
            keywords[box] = [n for n in names if not n.startswith("\\")]
            typ, data = imap.uid("FETCH", "1:*", "(UID BODY.PEEK[])")
            _ok((typ, data))
            for entry in data:
                if not isinstance(entry, tuple):
                    continue
                m = re.search(rb"UID (\d+)", entry[0])
                digests[(box, int(m.group(1)))] = hashlib.sha256(
                    entry[1]).hexdigest()
            imap.close()  # EXAMINEd: CLOSE expunges nothing
        typ, data = imap._simple_command("LIST", '""', "*", "RETURN",
                                         "(SPECIAL-USE)")
        _ok((typ, data))
        special = {}
        for line in imap.untagged_responses.pop("LIST", []):
            m = re.match(rb'\((.*?)\) "/" "?(.*?)"?$', line)
            uses = sorted(a for a in m.group(1).decode().split()
                          if a in ("\\All", "\\Archive", "\\Drafts",
                                   "\\Flagged", "\\Junk", "\\Sent",
                                   "\\Trash"))
            if uses:
                special[m.group(2).decode()] = uses
        return keywords, digests, special
    finally:
        imap.logout()


def dump_user(dc, user, location=None, with_imap=True):
    boxes = mailboxes(dc, user, location)
    dump = {
        "mailboxes": boxes,
        "messages": messages(dc, user, location),
        "subscriptions": subscriptions(dc, user, location),
        "attributes": attributes(dc, user, sorted(boxes), location),
    }
    if with_imap:
        if location:
            raise ValueError("IMAP serves only the configured location")
        kw, digests, special = imap_view(dc, user, sorted(boxes))
        dump["keywords"] = kw
        dump["digests"] = digests
        dump["special_use"] = special
    return dump


# Per-mailbox status fields that must be identical; highestmodseq may
# only grow (dsync asks for min_highest_modseq, and the receiving side's
# own writes can bump it).
MAILBOX_EXACT = ("guid", "uidvalidity", "uidnext", "messages")


def _dsync24_parents(src, dst):
    """Mailboxes that Dovecot 2.4's dsync creates for the parent of a
    source mailbox that has none ("Lists" for "Lists/mime"; stock sdbox
    destinations get them too): empty, only on the destination."""
    if not is_dovecot24():
        return set()
    parents = {name.rsplit("/", 1)[0] for name in src["mailboxes"]
               if "/" in name}
    return {name for name in set(dst["mailboxes"]) - set(src["mailboxes"])
            if name in parents
            and dst["mailboxes"][name].get("messages") == "0"}


def compare(src, dst, keyword_order=True):
    """Every difference between two dumps, as readable strings."""
    problems = []
    extra = _dsync24_parents(src, dst)
    if extra:
        dst = dict(dst)
        dst["mailboxes"] = {k: v for k, v in dst["mailboxes"].items()
                            if k not in extra}
        dst["attributes"] = {k: v for k, v in dst["attributes"].items()
                             if k[0] not in extra}

    def diff_keys(what, a, b):
        for k in sorted(set(a) - set(b), key=repr):
            problems.append("%s %r missing on the destination" % (what, k))
        for k in sorted(set(b) - set(a), key=repr):
            problems.append("%s %r only on the destination" % (what, k))

    diff_keys("mailbox", src["mailboxes"], dst["mailboxes"])
    for name in sorted(set(src["mailboxes"]) & set(dst["mailboxes"])):
        a, b = src["mailboxes"][name], dst["mailboxes"][name]
        for field in MAILBOX_EXACT:
            if a[field] != b[field]:
                problems.append("mailbox %s %s: %s -> %s"
                                % (name, field, a[field], b[field]))
        if "highestmodseq" not in a or "highestmodseq" not in b:
            continue  # left out on purpose (replicas)
        if int(b["highestmodseq"]) < int(a["highestmodseq"]):
            problems.append("mailbox %s highestmodseq went down: %s -> %s"
                            % (name, a["highestmodseq"],
                               b["highestmodseq"]))
    diff_keys("message", src["messages"], dst["messages"])
    for key in sorted(set(src["messages"]) & set(dst["messages"])):
        a, b = src["messages"][key], dst["messages"][key]
        for field in a:
            if a[field] != b.get(field):
                problems.append("message %s uid %d %s: %r -> %r"
                                % (key[0], key[1], field, a[field],
                                   b.get(field)))
    if src["subscriptions"] != dst["subscriptions"]:
        problems.append("subscriptions: %r -> %r"
                        % (src["subscriptions"], dst["subscriptions"]))
    diff_keys("attribute", src["attributes"], dst["attributes"])
    for key in sorted(set(src["attributes"]) & set(dst["attributes"])):
        if src["attributes"][key] != dst["attributes"][key]:
            problems.append("attribute %r: %r -> %r"
                            % (key, src["attributes"][key],
                               dst["attributes"][key]))
    if "digests" in src and "digests" in dst:
        diff_keys("message bytes", src["digests"], dst["digests"])
        for key in sorted(set(src["digests"]) & set(dst["digests"])):
            if src["digests"][key] != dst["digests"][key]:
                problems.append("message %s uid %d: bytes differ" % key)
        for box in sorted(set(src["keywords"]) & set(dst["keywords"])):
            a, b = src["keywords"][box], dst["keywords"][box]
            if not keyword_order:
                a, b = sorted(a), sorted(b)
            if a != b:
                problems.append("keywords of %s: %r -> %r" % (box, a, b))
        if src["special_use"] != dst["special_use"]:
            problems.append("special-use: %r -> %r"
                            % (src["special_use"], dst["special_use"]))
    return problems
