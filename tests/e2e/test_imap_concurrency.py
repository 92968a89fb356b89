"""Many IMAP clients on one mailbox at once, as a user with a phone, a
laptop and a webmail has them, plus LMTP deliveries, doveadm purge,
casbox gc, doveadm index and the indexer-worker (fts_autoindex): the
same seeded load against casbox and against sdbox in one test.

It fails on any BYE or dropped connection, any tagged NO or BAD other
than the ones IMAP prescribes for messages another session expunged,
any failed delivery or doveadm run, and (through the harness) any
Error, Fatal or Panic line in either Dovecot's log. sdbox is the
control: it must pass the same criteria under the same load, which
shows the criteria ask nothing sdbox does not give. Afterwards every
message left is byte-exact, casbox scrub is clean and every blob's
refcount equals its references.

CASBOX_LOAD_CLIENTS (10) and CASBOX_LOAD_SECONDS (20 per backend) size
it; doc/testing.md has the longer soak (20 clients, 10 minutes)."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import Dovecot, corpus_files, crlf  # noqa: E402
import imap_load  # noqa: E402

USER = "user1"
CLIENTS = int(os.environ.get("CASBOX_LOAD_CLIENTS", "10"))
SECONDS = float(os.environ.get("CASBOX_LOAD_SECONDS", "20"))
CONF = """lmtp_add_received_header = no
protocol imap {
  mail_max_userip_connections = 100
}
"""
FTS = {"fts": "casidx", "fts_autoindex": "yes"}
BACKENDS = {
    "casbox": dict(mail_location="casbox:~/casbox",
                   mail_plugins=["casbox", "fts", "fts_casidx"],
                   plugin_settings=dict(FTS, casbox_key_file="%h/casbox.key",
                                        casbox_key_autocreate="yes",
                                        casbox_gc_dead_ratio="5")),
    "sdbox": dict(mail_location="sdbox:~/sdbox",
                  mail_plugins=["casbox", "fts", "fts_casidx"],
                  plugin_settings=dict(FTS)),
}
# (command words, arguments after -u user). doveadm fetch reads every
# message's bytes while the clients expunge. (doveadm backup is left
# out: a dsync export racing expunges fails in its sdbox destination,
# "Unexpectedly lost uid", for sdbox and casbox sources alike.)
FETCH = (["fetch"], ["guid body", "mailbox", "Work", "all"])
ADMIN = {
    "casbox": [(["purge"], []), (["casbox", "gc"], []),
               (["index"], ["INBOX"]), (["index"], ["Archive"]), FETCH],
    "sdbox": [(["purge"], []), (["index"], ["INBOX"]),
              (["index"], ["Archive"]), FETCH],
}


def sample(limit=200, max_size=256 * 1024):
    """Real list mail, small enough that the load is about commands."""
    out = []
    for path in corpus_files("usrp-users-3000", limit=limit * 2, step=3):
        if os.path.getsize(path) <= max_size:
            with open(path, "rb") as f:
                out.append(crlf(f.read()))
        if len(out) == limit:
            break
    return out


def run_backend(test, name, msgs, clients=CLIENTS, seconds=SECONDS):
    with Dovecot(extra_conf=CONF, **BACKENDS[name]) as dc:
        imap_load.prepare(dc, USER, msgs)
        res = imap_load.run_load(dc, USER, msgs, clients, seconds,
                                 seed=11, admin_cmds=ADMIN[name])
        print("\n%s: %s\n  ms/op: %s" % (name, res.summary(),
                                          res.op_report()), file=sys.stderr)
        seen, bad = imap_load.verify_messages(dc, USER, msgs)
        test.assertGreater(seen, 20)
        test.assertEqual(bad, [], "%s: messages not byte-exact" % name)
        if name == "casbox":
            test.assertEqual(dc.casbox_audit(USER), [])
    return res


class ImapConcurrencyTest(unittest.TestCase):

    def test_many_clients_casbox_and_sdbox(self):
        msgs = sample()
        results = {name: run_backend(self, name, msgs)
                   for name in ("sdbox", "casbox")}
        for name, res in results.items():
            # sdbox first: if the control fails, the load asks too much
            self.assertEqual(res.byes, [], "%s: BYE/disconnects" % name)
            self.assertEqual(res.bad_replies, [], "%s: NO/BAD" % name)
            self.assertEqual(res.other_errors, [], name)
            # the load did reach the code under test
            self.assertGreater(res.commands["fetch_body"], 50, name)
            self.assertGreater(res.commands["expunge"], 5, name)
            self.assertGreater(res.commands["lmtp"], 5, name)
        print("casbox/sdbox commands/s: %.2f"
              % (results["casbox"].rate() / results["sdbox"].rate()),
              file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
