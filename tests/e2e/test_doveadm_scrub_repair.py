"""doveadm casbox scrub over 200 corpus messages: bytes flipped in pack
frames (a frame header, a chunk, an AEAD tag with its CRCs made to
match), in an LSM table block and in the WAL. Scrub names exactly the
messages that use a damaged blob (the set is computed here from the
store's records and where the bytes were flipped), every other message
still FETCHes byte-identical, and --repair quarantines the frames
(copies of the damaged bytes), marks the damaged messages with
$CasboxDamaged over IMAP, fixes a tampered refcount and deletes
nothing; a FETCH of a damaged message then gets a tagged NO and the
session goes on."""

import json
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files  # noqa: E402

# Without cross-message compression: the damage here is counted per blob
# and its messages; a damaged base also fails its dependents (scrub names
# them: tests/e2e/test_storage_xmsg.py), which --repair's quarantine of a
# base does not handle yet.
KEYS = {"casbox_key_file": "%h/casbox.key", "casbox_key_autocreate": "yes",
        "casbox_cross_message": "no"}
CONF = "lmtp_add_received_header = no\n"
KEYWORD = "$CasboxDamaged"
# frame version 1 / 2 / 3 (doc/casbox-format.md): header size, where the
# table CRC, the blob id and the header CRC are
FRAME_LAYOUT = {1: {"header": 68, "table_crc": 28, "id": 32, "crc": 64},
                2: {"header": 84, "table_crc": 20, "id": 48, "crc": 80},
                3: {"header": 116, "table_crc": 20, "id": 48, "crc": 112}}


def frame_layout(root, loc):
    with open(pack_path(root, loc["pack"]), "rb") as f:
        f.seek(loc["offset"] + 4)
        return FRAME_LAYOUT[f.read(1)[0]]
CHUNK = 65536


# -- CRC32C as the frames use it (doc/casbox-format.md) ------------------

def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc_table()


def masked_crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# -- helpers --------------------------------------------------------------

def tool(name):
    return os.path.join(os.environ.get("CASBOX_TOP_BUILDDIR", "."),
                        "tests", name)


def run_as_user(dc, *argv, check=True):
    return subprocess.run(list(argv), user=dc.uid, group=dc.gid,
                          capture_output=True, text=True, check=check)


def dump(dc, root):
    """storage-dump: mailboxes, message parts, blob locations."""
    res = run_as_user(dc, tool("storage-dump"), root, check=False)
    self_check = res.returncode
    names, parts, locs, keywords = {}, {}, {}, {}
    for line in res.stdout.splitlines():
        f = line.split(" ")
        if f[0] == "M":
            names[f[1]] = line.split(" name=", 1)[1]
        elif f[0] == "p":
            parts.setdefault((f[1], int(f[2])), []).append(f[3])
        elif f[0] == "m":
            kw = line.split(" keywords=", 1)[1].split(" ")[0]
            keywords[(f[1], int(f[2]))] = [k for k in kw.split(",") if k]
        elif f[0] == "l":
            v = dict(x.split("=") for x in f[2:])
            locs[f[1]] = {k: int(v[k]) for k in v}
    msgs = {(names[g], uid): blobs for (g, uid), blobs in parts.items()}
    kws = {(names[g], uid): k for (g, uid), k in keywords.items()}
    return self_check, msgs, locs, kws, res.stdout


def scrub(dc, *extra, fmt="tab"):
    res = dc.doveadm("-f", fmt, "casbox", "scrub", "-u", "user1", *extra,
                     check=False)
    if fmt == "json":
        return res, json.loads(res.stdout)
    lines = res.stdout.strip("\n").split("\n")
    # doveadm's own sticky username column (titled, or not)
    header = ["username" if h in ("", "Username") else h
              for h in lines[0].split("\t")]
    rows = [dict(zip(header, ln.split("\t"))) for ln in lines[1:] if ln]
    return res, rows


def scrub_on_tty(dc):
    """Scrub with stderr on a pseudo-terminal: what it shows there."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(dc.doveadm_command("casbox", "scrub", "-u",
                                               "user1"),
                            stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the other side is closed
            break
        if not data:
            break
        out += data
    os.close(master)
    proc.stdout.read()
    proc.stdout.close()
    return proc.wait(), out.decode(errors="replace")


def flip(path, pos, mask=0x01):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ mask]))


def pack_path(root, pack_id):
    return os.path.join(root, "packs", "pack-%08u.cbp" % pack_id)


def flip_tag(root, loc):
    """Flip the last AEAD tag byte of chunk 0 and make the chunk CRC, the
    table CRC and the header CRC match again: only decryption finds it."""
    path = pack_path(root, loc["pack"])
    lay = frame_layout(root, loc)
    hdr = lay["header"]
    with open(path, "rb") as f:
        f.seek(loc["offset"])
        frame = bytearray(f.read(loc["frame_size"]))
    n = max(1, -(-loc["plain_size"] // CHUNK))
    table = len(frame) - 8 * n
    size0 = struct.unpack_from("<I", frame, table)[0]
    frame[hdr + size0 - 1] ^= 0x01
    chunk0 = bytes(frame[hdr:hdr + size0])
    struct.pack_into("<I", frame, table + 4, masked_crc32c(chunk0))
    struct.pack_into("<I", frame, lay["table_crc"],
                     masked_crc32c(bytes(frame[table:])))
    struct.pack_into("<I", frame, lay["crc"],
                     masked_crc32c(bytes(frame[:lay["crc"]])))
    with open(path, "r+b") as f:
        f.seek(loc["offset"])
        f.write(frame)


def imap_uid_fetch(imap, uids, items):
    typ, data = imap.uid("FETCH", uids, items)
    if typ != "OK":
        raise AssertionError("FETCH %s: %r %r" % (uids, typ, data))
    return data


def bodies_of(imap, uids):
    """{uid: BODY[]} for a UID set."""
    out = {}
    for item in imap_uid_fetch(imap, uids, "(UID BODY.PEEK[])"):
        if isinstance(item, tuple):
            uid = int(re.search(rb"UID (\d+)", item[0]).group(1))
            out[uid] = item[1]
    return out


def uid_set(uids):
    return ",".join(str(u) for u in sorted(uids))


def corpus():
    msgs = []
    for path in (corpus_files("usrp-users-3000", limit=150) +
                 corpus_files("mime-edge", limit=50)):
        with open(path, "rb") as f:
            msgs.append(f.read())
    return msgs


class DoveadmScrubRepairTest(unittest.TestCase):

    def start(self):
        dc = Dovecot(mail_location="casbox:~/casbox",
                     mail_plugins=["casbox"], plugin_settings=KEYS,
                     extra_conf=CONF)
        return dc

    def test_pack_damage_repair(self):
        with self.start() as dc:
            root = os.path.join(dc.home("user1"), "casbox")
            msgs = corpus()
            dc.lmtp_deliver_many("user1", msgs)
            imap = dc.imap_login("user1")
            self.assertEqual(imap.select("INBOX")[1][0], b"%d" % len(msgs))
            before = bodies_of(imap, "1:*")
            imap.logout()
            self.assertEqual(len(before), len(msgs))

            res, rows = scrub(dc)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            self.assertEqual(rows, [])
            # progress only on a terminal: one line, rewritten (\r)
            self.assertEqual(res.stderr, "")
            code, tty = scrub_on_tty(dc)
            self.assertEqual(code, 0, tty)
            self.assertRegex(tty, r"\rscrub: pack frames: \d+, [\d.]+ MB "
                             r"of [\d.]+ MB \(100%\)")
            self.assertRegex(tty, r"\rscrub: blobs decoded: (\d+)/\1, "
                             r"[\d.]+ MB of [\d.]+ MB \(100%\)")

            ok, msg_blobs, locs, _, _ = dump(dc, root)
            self.assertEqual(ok, 0)
            # three blobs spread over the packs: header, chunk, tag
            order = sorted(locs, key=lambda b: (locs[b]["pack"],
                                                locs[b]["offset"]))
            hit = {"header": order[len(order) // 10],
                   "chunk": order[len(order) // 2],
                   "tag": order[len(order) * 9 // 10]}
            self.assertEqual(len(set(hit.values())), 3)
            loc = locs[hit["header"]]
            # in the blob id the header CRC covers
            flip(pack_path(root, loc["pack"]),
                 loc["offset"] + frame_layout(root, loc)["id"] + 8)
            loc = locs[hit["chunk"]]
            flip(pack_path(root, loc["pack"]), loc["offset"] +
                 frame_layout(root, loc)["header"] + 5, 0x80)
            flip_tag(root, locs[hit["tag"]])

            # (d) a blob record deleted: its messages reference nothing
            dropped = order[len(order) * 3 // 10]
            self.assertNotIn(dropped, hit.values())
            run_as_user(dc, tool("doveadm-tamper"), root, "drop-blob",
                        dropped)
            damaged_blobs = set(hit.values()) | {dropped}
            expected = {m for m, blobs in msg_blobs.items()
                        if damaged_blobs & set(blobs)}
            self.assertGreaterEqual(len(expected), 4)
            # damage the refcount of a blob too (the first blob record)
            run_as_user(dc, tool("doveadm-tamper"), root, "refcount", "3")

            dc.allow_log(r"casbox")
            dc.allow_log(r"FETCH .* failed|read\(.*\) failed")
            res, rows = scrub(dc)
            self.assertEqual(res.returncode, 65, res.stdout + res.stderr)
            damage = [r for r in rows if r["mailbox"] != "-"]
            self.assertEqual({(r["mailbox"], int(r["uid"]))
                              for r in damage}, expected, rows)
            self.assertEqual({r["blob"] for r in damage}, damaged_blobs)
            self.assertTrue(all(r["status"] == "damaged" for r in rows))
            self.assertTrue(all(r["username"] == "user1" for r in rows))
            causes = {r["blob"]: r["cause"] for r in damage}
            # the tag flip passes every CRC: only the AEAD finds it
            self.assertIn("authentication failed", causes[hit["tag"]])
            self.assertIn("CRC", causes[hit["chunk"]])
            self.assertEqual(causes[dropped], "blob record missing")
            refcount_rows = [r for r in rows if r["mailbox"] == "-"
                             and r["cause"].startswith("refcount ")]
            self.assertEqual(len(refcount_rows), 1, rows)
            self.assertRegex(refcount_rows[0]["cause"],
                             r"^refcount (\d+), but (\d+) references$")

            # the same through the JSON formatter
            res, jrows = scrub(dc, fmt="json")
            self.assertEqual(res.returncode, 65)
            self.assertEqual(
                sorted((r["mailbox"], r["uid"], r["blob"], r["cause"])
                       for r in jrows),
                sorted((r["mailbox"], r["uid"], r["blob"], r["cause"])
                       for r in rows))

            # every other message is intact, byte for byte
            intact = {uid for (_, uid) in msg_blobs} - \
                {uid for (_, uid) in expected}
            imap = dc.imap_login("user1")
            imap.select("INBOX")
            got = bodies_of(imap, uid_set(intact))
            imap.logout()
            self.assertEqual(got, {u: before[u] for u in intact})

            frames = {}
            for b in hit.values():
                with open(pack_path(root, locs[b]["pack"]), "rb") as f:
                    f.seek(locs[b]["offset"])
                    frames[b] = f.read(locs[b]["frame_size"])

            res, rows = scrub(dc, "--repair")
            self.assertEqual(res.returncode, 65, res.stdout + res.stderr)
            repaired = [r for r in rows if r["status"] == "repaired"]
            quarantined = {r["blob"] for r in repaired
                           if r["cause"].startswith("quarantined")}
            self.assertEqual(quarantined, damaged_blobs, rows)
            marked = {(r["mailbox"], int(r["uid"])) for r in repaired
                      if r["cause"] == "marked " + KEYWORD}
            self.assertEqual(marked, expected)
            self.assertEqual(len([r for r in repaired if r["cause"]
                                  .startswith("refcount ")]), 1, rows)

            # the frame bytes are kept, exactly as they were found
            qdir = os.path.join(root, "quarantine")
            self.assertEqual(len(os.listdir(qdir)), len(hit))
            for b in hit.values():
                name = "%s-pack%d-%d.frame" % (b, locs[b]["pack"],
                                               locs[b]["offset"])
                with open(os.path.join(qdir, name), "rb") as f:
                    self.assertEqual(f.read(), frames[b])

            # nothing deleted, refcounts consistent (but for the blob
            # that has no record), keyword mirrored
            ok, msg_blobs2, _, kws, out = dump(dc, root)
            self.assertEqual(re.findall(r"refcount-mismatch (\S+)", out),
                             [dropped], out)
            self.assertEqual(msg_blobs2, msg_blobs)
            for m in msg_blobs:
                self.assertEqual(KEYWORD in kws[m], m in expected, m)

            imap = dc.imap_login("user1")
            self.assertEqual(imap.select("INBOX")[1][0], b"%d" % len(msgs))
            flags = {}
            for item in imap_uid_fetch(imap, "1:*", "(UID FLAGS)"):
                m = re.search(rb"UID (\d+) FLAGS \(([^)]*)\)", item)
                flags[int(m.group(1))] = m.group(2).decode().split()
            for (_, uid) in msg_blobs:
                self.assertEqual(KEYWORD in flags[uid],
                                 ("INBOX", uid) in expected, uid)
            # a damaged message: a tagged NO, and the session goes on
            for (_, uid) in sorted(expected):
                typ, data = imap.uid("FETCH", str(uid), "(BODY.PEEK[])")
                self.assertEqual(typ, "NO", data)
                self.assertIn(b"damaged", data[0])
            self.assertEqual(bodies_of(imap, uid_set(intact)),
                             {u: before[u] for u in intact})
            imap.logout()

            # a second run knows the damage: still exit 65, nothing new
            res, rows = scrub(dc)
            self.assertEqual(res.returncode, 65, res.stdout + res.stderr)
            self.assertEqual({(r["mailbox"], int(r["uid"])) for r in rows
                              if r["mailbox"] != "-"}, expected)
            self.assertEqual({r["status"] for r in rows}, {"known"}, rows)
            self.assertIn("quarantined before", res.stderr)
            res, rows = scrub(dc, "--repair")
            self.assertEqual([r for r in rows if r["status"] ==
                              "repaired"], [], rows)

            # the user expunges a damaged message: the quarantine record
            # of its blob goes with the next --repair, the copy stays
            only = sorted(b for b in hit.values()
                          if sum(b in bl for bl in msg_blobs.values()) == 1)
            self.assertTrue(only)
            gone = next(m for m, bl in msg_blobs.items() if only[0] in bl)
            imap = dc.imap_login("user1")
            imap.select("INBOX")
            imap.uid("STORE", str(gone[1]), "+FLAGS", r"(\Deleted)")
            imap.expunge()
            imap.logout()
            res, rows = scrub(dc, "--repair")
            self.assertEqual(res.returncode, 65)
            self.assertEqual({(r["mailbox"], int(r["uid"])) for r in rows
                              if r["mailbox"] != "-"}, expected - {gone})
            self.assertEqual([(r["blob"], r["cause"]) for r in rows
                              if r["status"] == "repaired"],
                             [(only[0], "released from quarantine: "
                               "no message uses it")], rows)
            self.assertEqual(len(os.listdir(qdir)), len(hit))

    def test_lsm_damage(self):
        with self.start() as dc:
            root = os.path.join(dc.home("user1"), "casbox")
            msgs = corpus()
            dc.lmtp_deliver_many("user1", msgs[:150])
            # all records into one table; the next 50 go to the WAL
            run_as_user(dc, tool("doveadm-tamper"), root, "compact")
            dc.lmtp_deliver_many("user1", msgs[150:])
            lsm = os.path.join(root, "lsm")
            tables = sorted(n for n in os.listdir(lsm)
                            if n.endswith(".sst"))
            wals = sorted(n for n in os.listdir(lsm) if n.endswith(".wal"))
            self.assertEqual(len(tables), 1, os.listdir(lsm))
            self.assertEqual(len(wals), 1, os.listdir(lsm))
            res, rows = scrub(dc)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            backup = os.path.join(dc.tmp, "lsm.backup")
            shutil.copytree(lsm, backup)
            _, _, _, _, dump_before = dump(dc, root)
            dc.allow_log(r"casbox|Corrupted")

            # (b) a table block: the file and the block's offset
            table = os.path.join(lsm, tables[0])
            flip(table, 100)
            res, rows = scrub(dc)
            self.assertEqual(res.returncode, 65, res.stdout + res.stderr)
            self.assertTrue(any(r["blob"] == "%s@0" % table and
                                r["cause"].startswith("LSM damage")
                                for r in rows), rows)
            self.assertTrue(all(r["status"] == "damaged" for r in rows))
            # --repair changes nothing in a damaged LSM
            res, rows = scrub(dc, "--repair")
            self.assertEqual(res.returncode, 65)
            self.assertIn("rebuild", res.stderr)
            self.assertEqual([r for r in rows if r["status"] ==
                              "repaired"], [])
            shutil.rmtree(lsm)
            shutil.copytree(backup, lsm)
            os.chown(lsm, dc.uid, dc.gid)
            for n in os.listdir(lsm):
                os.chown(os.path.join(lsm, n), dc.uid, dc.gid)
            _, _, _, _, dump_after = dump(dc, root)
            self.assertEqual(sorted(dump_after.splitlines()),
                             sorted(dump_before.splitlines()))

            # (c) the WAL, in its first record (not the tail, which a
            # crash may leave torn); the sealed WAL's header is 32 bytes
            wal = os.path.join(lsm, wals[0])
            flip(wal, 32 + 8 + 3)
            res, rows = scrub(dc)
            self.assertEqual(res.returncode, 65, res.stdout + res.stderr)
            self.assertEqual(len(rows), 1, rows)
            self.assertRegex(rows[0]["cause"],
                             r"Corrupted WAL %s at offset 32" %
                             re.escape(wal))
            self.assertIn("rebuild", rows[0]["cause"])


if __name__ == "__main__":
    unittest.main()
