"""A mixed IMAP load on one user, imaptest-style: many clients at once,
each doing APPEND, FETCH (whole, partial, BINARY, BODYSTRUCTURE),
STORE, COPY, MOVE, EXPUNGE, SELECT, LIST, STATUS and SEARCH at random,
with LMTP deliveries and doveadm maintenance running beside them.

The test tests/e2e/test_imap_concurrency.py runs it against casbox and
sdbox in one test; bench/concurrency.py runs it at several client
counts for the commands/s ratio. A client addresses messages by UID
only, so a concurrent expunge can never turn a request into a protocol
error of the client's own making; what the server answers is counted:

- a BYE or a dropped connection (the client reconnects and goes on),
- a tagged NO or BAD, by its text, except the ones IMAP prescribes for
  messages another session expunged (EXPUNGEISSUED, "no longer exist"),
- commands completed, per operation.
"""

import imaplib
import random
import re
import threading
import time
from collections import Counter

from dovecot_harness import PASSWORD

# What a server answers when a message another session expunged was
# asked for or copied: RFC 3501/9051 behaviour, not a failure.
BENIGN_NO_RE = re.compile(rb"EXPUNGEISSUED|no longer exist")
DOVEADM_EXPUNGED = "Message was expunged"
TAG_RE = re.compile(rb"X-Load: (\d+)\.\d+\r\n")
BOXES = ("INBOX", "Archive", "Work")
WORDS = ("usrp", "the", "FPGA", "error", "thanks", "driver")

# operation -> weight (FETCH heavy, like a real client mix)
OPS = {
    "fetch_all": 2, "fetch_body": 8, "fetch_partial": 3, "fetch_binary": 2,
    "fetch_struct": 4, "fetch_flags": 4, "store": 5, "append": 3,
    "copy": 3, "move": 2, "expunge": 3, "select": 2, "list": 1,
    "status": 2, "search": 2, "noop": 1,
}


_serial = iter(range(1, 1 << 62))
_serial_lock = threading.Lock()


def tagged(msgs, i, serial=None):
    """Message i of the sample as the load stores it: a first X-Load
    header makes every stored message traceable to its sample bytes,
    and unique (i.serial), so that an expunge drops the last reference
    to its blobs as in a real mailbox, instead of sharing them with the
    load's other copies of the same sample message."""
    if serial is None:
        with _serial_lock:
            serial = next(_serial)
    return b"X-Load: %d.%d\r\n" % (i, serial) + msgs[i]


class LoadResult:
    """What the clients saw. Thread-safe through one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.commands = Counter()
        self.op_seconds = Counter()  # time spent per operation
        self.byes = []          # (op, text)
        self.bad_replies = []   # (op, status, text)
        self.benign = Counter()
        self.other_errors = []  # LMTP / doveadm failures
        self.seconds = 0.0

    def total(self):
        return sum(self.commands.values())

    def rate(self):
        return self.total() / self.seconds if self.seconds else 0.0

    def op_report(self):
        """ms per operation, for comparing backends op by op."""
        return " ".join("%s=%.1f" % (op, 1000 * self.op_seconds[op] /
                                     max(1, self.commands[op]))
                        for op in sorted(self.op_seconds))

    def summary(self):
        return ("%d commands in %.1f s (%.0f/s), %d BYE, %d bad replies, "
                "%d expunge-race NOs, %d other errors%s"
                % (self.total(), self.seconds, self.rate(), len(self.byes),
                   len(self.bad_replies), sum(self.benign.values()),
                   len(self.other_errors),
                   "".join("\n  %r" % (x,) for x in
                           (self.byes + self.bad_replies +
                            self.other_errors)[:5])))


class Client:
    """One IMAP connection doing random operations until stop."""

    def __init__(self, dc, user, seed, msgs, result, stop):
        self.dc, self.user = dc, user
        self.rnd = random.Random(seed)
        self.msgs, self.result, self.stop = msgs, result, stop
        self.imap = None
        self.box = None
        self.uids = []
        names = list(OPS)
        self.ops = names
        self.weights = [OPS[n] for n in names]

    def connect(self):
        self.box = None
        imap = imaplib.IMAP4("127.0.0.1", self.dc.imap_port, timeout=120)
        try:
            imap.login(self.user, PASSWORD)
        except imaplib.IMAP4.error:
            imap.shutdown()
            raise
        self.imap = imap

    def reply(self, op, res):
        typ, data = res
        text = b" ".join(x if isinstance(x, bytes) else
                         (x[0] if isinstance(x, tuple) else b"")
                         for x in (data or []) if x is not None)
        with self.result.lock:
            if typ == "OK":
                self.result.commands[op] += 1
            elif BENIGN_NO_RE.search(text):
                self.result.commands[op] += 1
                self.result.benign[op] += 1
            else:
                self.result.bad_replies.append((op, typ, text[:200]))
        return typ == "OK"

    def select(self, box):
        self.box = None
        if self.reply("select", self.imap.select(box)):
            self.box = box
            self.refresh_uids()

    def refresh_uids(self):
        typ, data = self.imap.uid("SEARCH", "ALL")
        if self.reply("search", (typ, data)) and data and data[0]:
            self.uids = [int(u) for u in data[0].split()]
        else:
            self.uids = []

    def uid_set(self, most=20):
        if not self.uids:
            return None
        i = self.rnd.randrange(len(self.uids))
        j = min(len(self.uids), i + 1 + self.rnd.randint(0, most - 1))
        return ",".join(str(u) for u in self.uids[i:j])

    def step(self):
        rnd = self.rnd
        if self.box is None or rnd.random() < 0.05:
            op = "select"
        else:
            op = rnd.choices(self.ops, self.weights)[0]
        start = time.monotonic()
        self.do(op)
        with self.result.lock:
            self.result.op_seconds[op] += time.monotonic() - start

    def do(self, op):
        rnd = self.rnd
        im = self.imap
        other = rnd.choice([b for b in BOXES if b != self.box])
        if op == "append":
            i = rnd.randrange(len(self.msgs))
            res = im.append(rnd.choice(BOXES), None, None,
                            tagged(self.msgs, i))
            self.reply(op, res)
            return
        if op in ("select", "list", "status", "noop", "search"):
            if op == "select":
                self.select(rnd.choice(BOXES))
            elif op == "list":
                self.reply(op, im.list())
            elif op == "status":
                self.reply(op, im.status(other,
                                         "(MESSAGES UIDNEXT UNSEEN)"))
            elif op == "noop":
                self.reply(op, im.noop())
            else:
                self.reply(op, im.uid("SEARCH", "BODY",
                                      rnd.choice(WORDS)))
            return
        uids = self.uid_set()
        if uids is None:
            self.refresh_uids()
            return
        if op == "fetch_all":
            # the whole mailbox: long enough to fill the socket, so the
            # FETCH goes on between other sessions' commits
            res = im.uid("FETCH", "1:*", "(RFC822.SIZE BODY.PEEK[])")
        elif op == "fetch_body":
            res = im.uid("FETCH", uids, "(BODY.PEEK[])")
        elif op == "fetch_partial":
            res = im.uid("FETCH", uids, "(BODY.PEEK[]<%d.%d>)"
                         % (rnd.randint(0, 2000), rnd.randint(1, 4096)))
        elif op == "fetch_binary":
            res = im.uid("FETCH", uids, "(BINARY.PEEK[1] BINARY.SIZE[1])")
        elif op == "fetch_struct":
            res = im.uid("FETCH", uids,
                         "(BODYSTRUCTURE ENVELOPE RFC822.SIZE)")
        elif op == "fetch_flags":
            res = im.uid("FETCH", uids, "(FLAGS INTERNALDATE)")
        elif op == "store":
            res = im.uid("STORE", uids, rnd.choice(["+FLAGS", "-FLAGS"]),
                         rnd.choice([r"(\Seen)", r"(\Flagged $Load)"]))
        elif op == "copy":
            res = im.uid("COPY", uids, other)
        elif op == "move":
            res = im.uid("MOVE", uids, other)
        else:
            some = self.uid_set(most=5)
            self.reply("store", im.uid("STORE", some, "+FLAGS.SILENT",
                                       r"(\Deleted)"))
            res = im.uid("EXPUNGE", some)
        self.reply(op, res)
        if op in ("move", "expunge"):
            self.refresh_uids()

    def run(self):
        while time.monotonic() < self.stop:
            try:
                if self.imap is None:
                    self.connect()
                self.step()
            except (imaplib.IMAP4.abort, OSError, EOFError) as e:
                with self.result.lock:
                    self.result.byes.append((self.box, repr(e)[:300]))
                self.imap = None
            except (imaplib.IMAP4.error, ValueError) as e:
                # imaplib refusing a command in the state the server
                # left the session in (e.g. no mailbox after a failed
                # SELECT): counted, then the session starts over
                with self.result.lock:
                    self.result.bad_replies.append(("client", "error",
                                                    repr(e)[:200]))
                self.box = None
        if self.imap is not None:
            try:
                self.imap.logout()
            except (imaplib.IMAP4.abort, OSError, EOFError):
                pass


def prepare(dc, user, msgs, count=60):
    """The mailboxes of the load, each with some mail to work on."""
    dc.lmtp_deliver(user, tagged(msgs, 0))
    imap = dc.imap_login(user)
    for box in BOXES[1:]:
        imap.create(box)
    for i in range(1, count):
        imap.append(BOXES[i % len(BOXES)], None, None, tagged(msgs, i))
    imap.logout()


def run_load(dc, user, msgs, clients, seconds, seed=1, admin_cmds=()):
    """clients IMAP clients, one LMTP deliverer and one doveadm loop
    (admin_cmds: (command words, arguments) pairs, each run as
    `doveadm words -u user arguments`) for seconds.
    Returns a LoadResult."""
    result = LoadResult()
    stop = time.monotonic() + seconds

    def deliver():
        rnd = random.Random(seed * 7919)
        while time.monotonic() < stop:
            try:
                dc.lmtp_deliver(user, tagged(msgs,
                                             rnd.randrange(len(msgs))))
                with result.lock:
                    result.commands["lmtp"] += 1
            except Exception as e:  # noqa: BLE001
                with result.lock:
                    result.other_errors.append(("lmtp", repr(e)[:300]))

    def admin():
        rnd = random.Random(seed * 104729)
        while admin_cmds and time.monotonic() < stop:
            words, args = rnd.choice(admin_cmds)
            cmd = words + args
            # bytes: doveadm fetch prints message bodies in any charset
            res = dc.doveadm(*words, "-u", user, *args, check=False,
                             text=False)
            errors = [ln for ln in res.stderr.decode(errors="replace")
                      .splitlines() if ": Error: " in ln]
            with result.lock:
                if res.returncode == 0:
                    result.commands["doveadm"] += 1
                elif errors and all(DOVEADM_EXPUNGED in ln
                                    for ln in errors):
                    # doveadm fetch reports a message expunged under it
                    # as a failed field (sdbox and casbox alike)
                    result.commands["doveadm"] += 1
                    result.benign["doveadm"] += 1
                else:
                    result.other_errors.append(
                        ("doveadm", cmd, res.returncode,
                         res.stderr[-300:].decode(errors="replace")))

    def guarded(target):
        # a thread that dies of an exception must fail the run, not
        # vanish into threading's excepthook
        def run():
            try:
                target()
            except Exception as e:  # noqa: BLE001
                with result.lock:
                    result.other_errors.append(("thread", repr(e)[:300]))
        return run

    workers = [Client(dc, user, seed * 1000 + i, msgs, result, stop)
               for i in range(clients)]
    threads = [threading.Thread(target=guarded(t))
               for t in [w.run for w in workers] + [deliver, admin]]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.monotonic() - start
    return result


def verify_messages(dc, user, msgs):
    """Every message left in every load mailbox is byte-exact one of the
    sample's. Returns (messages seen, list of bad uids)."""
    imap = dc.imap_login(user)
    seen, bad = 0, []
    for box in BOXES:
        imap.select(box, readonly=True)
        typ, data = imap.uid("FETCH", "1:*", "(UID BODY.PEEK[])")
        for item in data or []:
            if not isinstance(item, tuple):
                continue
            body = bytes(item[1])
            seen += 1
            # LMTP puts its own headers (Return-Path, ...) before ours
            m = TAG_RE.search(body)
            if m is None or not body.endswith(
                    m.group(0) + msgs[int(m.group(1))]):
                bad.append((box, item[0][:40]))
    imap.logout()
    return seen, bad
