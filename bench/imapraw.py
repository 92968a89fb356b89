"""A minimal IMAP client for measuring, not for correctness testing.

imaplib waits for a continuation on every literal (one extra round trip
per APPEND) and cannot MULTIAPPEND; real clients use LITERAL+ when the
server offers it, and Dovecot does. This client speaks just what the
bench needs: LOGIN, SELECT, STATUS, APPEND/MULTIAPPEND with LITERAL+ and
UID FETCH BODY.PEEK[] with literals read straight off a buffered socket,
so the client is not the bottleneck of a FETCH MB/s figure."""

import re
import socket

_LITERAL_RE = re.compile(rb"\{(\d+)\}\r\n$")
_UID_RE = re.compile(rb"UID (\d+)")


class IMAPError(Exception):
    pass


def _quote(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


class RawIMAP:
    def __init__(self, port, host="127.0.0.1", timeout=300):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rf = self.sock.makefile("rb", buffering=1 << 20)
        self.tagnum = 0
        greeting = self.rf.readline()
        if not greeting.startswith(b"* OK"):
            raise IMAPError("bad greeting: %r" % greeting)

    def close(self):
        try:
            self.command("LOGOUT")
        except (OSError, IMAPError):
            pass
        self.rf.close()
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()
        return False

    def _tag(self):
        self.tagnum += 1
        return b"B%d" % self.tagnum

    def read_response(self, tag, on_untagged=None):
        """Read until the tagged reply; untagged lines (with their
        literals, as a list of parts) go to on_untagged."""
        while True:
            line = self.rf.readline()
            if not line:
                raise IMAPError("connection closed")
            parts = [line]
            while True:
                m = _LITERAL_RE.search(parts[-1])
                if not m:
                    break
                parts.append(self.rf.read(int(m.group(1))))
                parts.append(self.rf.readline())
            if line.startswith(tag + b" "):
                if not line[len(tag) + 1:].startswith(b"OK"):
                    raise IMAPError(line.decode("latin-1").strip())
                return line
            if on_untagged is not None:
                on_untagged(parts)

    def command(self, cmd, on_untagged=None):
        tag = self._tag()
        self.sock.sendall(tag + b" " + cmd.encode() + b"\r\n")
        return self.read_response(tag, on_untagged)

    def login(self, user, password):
        self.command("LOGIN %s %s" % (_quote(user), _quote(password)))

    def select(self, mailbox):
        exists = []

        def untagged(parts):
            m = re.match(rb"\* (\d+) EXISTS", parts[0])
            if m:
                exists.append(int(m.group(1)))
        self.command("SELECT %s" % _quote(mailbox), untagged)
        return exists[-1] if exists else 0

    def status(self, mailbox, items="MESSAGES UIDNEXT UNSEEN"):
        out = []
        self.command("STATUS %s (%s)" % (_quote(mailbox), items),
                     lambda parts: out.append(parts[0]))
        return b"".join(out)

    def create(self, mailbox):
        self.command("CREATE %s" % _quote(mailbox))

    def append(self, mailbox, messages):
        """APPEND one message, or MULTIAPPEND several in one command,
        with non-synchronizing literals."""
        if isinstance(messages, (bytes, bytearray)):
            messages = [messages]
        tag = self._tag()
        chunks = [tag, b" APPEND ", _quote(mailbox).encode()]
        for msg in messages:
            chunks.append(b" {%d+}\r\n" % len(msg))
            chunks.append(msg)
        chunks.append(b"\r\n")
        self.sock.sendall(b"".join(chunks))
        return self.read_response(tag)

    def fetch_bodies(self, uid_range, sink):
        """UID FETCH uid_range BODY.PEEK[]; sink(uid, body_bytes) for each
        message. Returns the number of body bytes read."""
        total = [0]

        def untagged(parts):
            if len(parts) >= 3 and b"FETCH" in parts[0]:
                m = _UID_RE.search(parts[0]) or _UID_RE.search(parts[2])
                uid = int(m.group(1)) if m else None
                total[0] += len(parts[1])
                sink(uid, parts[1])
        self.command("UID FETCH %s (UID BODY.PEEK[])" % uid_range, untagged)
        return total[0]
