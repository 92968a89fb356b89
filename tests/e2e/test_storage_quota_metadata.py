"""Dovecot's quota plugin and IMAP METADATA on casbox mailboxes.

Quota: GETQUOTAROOT after APPEND, COPY, EXPUNGE, LMTP and an over-quota
APPEND must give the numbers that the messages' own sizes say
(RFC822.SIZE for virtual sizes, sdbox's answers for physical ones: both
store LF bytes), with the `count` backend (quota_vsizes = yes) and the
`dict` backend (physical sizes, file dict). An APPEND over the limit is
refused with [OVERQUOTA] and leaves nothing behind: no message, no
record, no blob reference (storage-dump).

METADATA: SETMETADATA/GETMETADATA of private and shared mailbox
attributes (mail_attribute_dict) answer like sdbox, also after RENAME
(attributes follow the mailbox GUID) and for a deleted and recreated
name (they do not come back)."""

import os
import re
import imaplib
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files, ok  # noqa: E402

KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes"}
META_CONF = ("imap_metadata = yes\n"
             "mail_attribute_dict = file:%h/dovecot-attributes\n")
CONF = ("lmtp_add_received_header = no\n"
        "protocol imap {\n  mail_plugins = $mail_plugins imap_quota\n}\n"
        + META_CONF)
LIMIT_KB = 600


def quota_settings(backend):
    s = {"quota_rule": "*:storage=%dk" % LIMIT_KB}
    if backend == "count":
        s.update({"quota": "count:User quota", "quota_vsizes": "yes"})
    else:
        s.update({"quota": "dict:User quota::file:%h/dovecot-quota"})
    return s


def storage_dump(dc, user):
    exe = os.path.join(os.environ.get("CASBOX_TOP_BUILDDIR", "."),
                       "tests", "storage-dump")
    root = os.path.join(dc.home(user), "casbox")
    return subprocess.run([exe, root], user=dc.uid, group=dc.gid,
                          capture_output=True, text=True)


def messages():
    msgs = []
    for path in corpus_files("usrp-users-3000", limit=400, step=7):
        with open(path, "rb") as f:
            data = f.read()
        if 2000 < len(data) < 60000:
            msgs.append(data)
        if len(msgs) == 12:
            break
    return msgs


def quota(imap, box="INBOX"):
    """(storage used KB, limit KB) of the root of box."""
    data = ok(imap.getquotaroot(box))
    text = b" ".join(x if isinstance(x, bytes) else b"" for x in
                     data[1]).decode()
    m = re.search(r"STORAGE (\d+) (\d+)", text)
    if m is None:
        raise AssertionError("no STORAGE in %r" % (data,))
    return int(m.group(1)), int(m.group(2))


def sizes(imap, box, item):
    """Sum of item (RFC822.SIZE) over box."""
    count = int(ok(imap.select(box, readonly=True))[0])
    if count == 0:
        return 0
    data = ok(imap.fetch("1:*", "(%s)" % item))
    return sum(int(re.search(rb"%s (\d+)" % item.encode(), x).group(1))
               for x in data if isinstance(x, bytes))


def run_steps(dc, vsizes):
    """The same steps on any instance; returns what the client saw."""
    msgs = messages()
    seen = []
    imap = dc.imap_login("user1")
    ok(imap.create("Other"))

    def record(step):
        used, limit = quota(imap)
        total = sum(sizes(imap, b, "RFC822.SIZE")
                    for b in ("INBOX", "Other"))
        seen.append((step, used, limit, total))
        if vsizes:
            # count backend: the sum of virtual sizes, in KiB rounded up
            assert used == (total + 1023) // 1024, seen[-1]
        assert limit == LIMIT_KB, seen[-1]

    record("empty")
    for msg in msgs[:6]:
        ok(imap.append("INBOX", None, None, msg))
    record("append")
    dc.lmtp_deliver_many("user1", msgs[6:9])
    record("lmtp")
    ok(imap.select("INBOX"))
    ok(imap.copy("1:4", "Other"))
    record("copy")
    ok(imap.store("2:3", "+FLAGS", r"\Deleted"))
    ok(imap.expunge())
    ok(imap.select("Other"))
    ok(imap.store("1", "+FLAGS", r"\Deleted"))
    ok(imap.expunge())
    record("expunge")

    # over the limit: refused, nothing changes
    big = (b"Subject: too big\r\n\r\n"
           + b"x" * 76 + b"\r\n") * ((LIMIT_KB * 1024) // 78)
    typ, data = imap.append("INBOX", None, None, big)
    assert typ == "NO" and b"OVERQUOTA" in data[0], (typ, data)
    seen.append(("over", typ, b"OVERQUOTA" in data[0]))
    record("after refused append")
    ok(imap.append("INBOX", None, None, msgs[9]))
    record("append again")
    imap.logout()
    return seen


METADATA_STEPS = [
    ("SETMETADATA", 'INBOX (/private/comment "inbox note")'),
    ("SETMETADATA", 'Work (/shared/comment "work note" '
                    '/private/vendor/vendor.test/x "42")'),
    ("GETMETADATA", "INBOX (/private/comment /shared/comment)"),
    ("GETMETADATA", "Work (/shared/comment /private/vendor/vendor.test/x)"),
    ("RENAME", "Work Projects"),
    ("GETMETADATA", "Projects (/shared/comment "
                    "/private/vendor/vendor.test/x)"),
    ("GETMETADATA", "Work (/shared/comment)"),
    ("SETMETADATA", "Projects (/shared/comment NIL)"),
    ("GETMETADATA", "Projects (/shared/comment "
                    "/private/vendor/vendor.test/x)"),
    ("DELETE", "Projects"),
    ("CREATE", "Projects"),
    ("GETMETADATA", "Projects (/private/vendor/vendor.test/x)"),
    ("GETMETADATA", "(DEPTH infinity) INBOX /private"),
]


# imaplib does not know the METADATA commands (RFC 5464)
for _cmd in ("SETMETADATA", "GETMETADATA"):
    imaplib.Commands.setdefault(_cmd, ("AUTH", "SELECTED"))


def run_metadata(dc):
    imap = dc.imap_login("user2")
    ok(imap.create("Work"))
    imap.select("INBOX")
    out = []
    for cmd, args in METADATA_STEPS:
        typ, data = imap._simple_command(cmd, args)
        meta = imap.untagged_responses.pop("METADATA", [])
        out.append((cmd, args, typ, meta))
    imap.logout()
    return out


class QuotaMetadataTest(unittest.TestCase):

    def quota_both(self, backend):
        conf = quota_settings(backend)
        plugins = ["quota"]
        with Dovecot(mail_location="sdbox:~/sdbox", mail_plugins=plugins,
                     plugin_settings=conf, extra_conf=CONF) as sd:
            want = run_steps(sd, backend == "count")
        with Dovecot(mail_plugins=["casbox"] + plugins,
                     plugin_settings=dict(KEYS, **conf),
                     extra_conf=CONF) as dc:
            got = run_steps(dc, backend == "count")
            res = storage_dump(dc, "user1")
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertEqual(got, want)
        # the numbers moved at every step that changed mail
        used = [s[1] for s in got if s[0] != "over"]
        self.assertEqual(used[0], 0)
        self.assertGreater(used[1], 0)
        self.assertTrue(all(a != b for a, b in zip(used[0:4], used[1:5])),
                        used)

    def test_quota_count_vsizes(self):
        self.quota_both("count")

    def test_quota_dict_physical(self):
        self.quota_both("dict")

    def test_metadata(self):
        with Dovecot(mail_location="sdbox:~/sdbox", mail_plugins=[],
                     extra_conf=META_CONF) as sd:
            want = run_metadata(sd)
        with Dovecot(plugin_settings=KEYS, extra_conf=META_CONF) as dc:
            got = run_metadata(dc)
        self.assertEqual(got, want)
        flat = [b"".join(x if isinstance(x, bytes) else b"".join(x)
                         for x in m) for c, a, t, m in got]
        # renamed: the attributes moved with the mailbox GUID
        self.assertIn(b"{2}42", flat[5])
        self.assertIn(b"{9}work note", flat[5])
        # deleted and recreated: they did not come back
        self.assertIn(b"/private/vendor/vendor.test/x NIL", flat[11])
        self.assertEqual([t for c, a, t, m in got],
                         ["OK"] * 6 + ["NO"] + ["OK"] * 6)


if __name__ == "__main__":
    unittest.main()
