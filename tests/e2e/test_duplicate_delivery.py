"""casbox_duplicate_window: an LMTP redelivery of a message the mailbox
already got is acknowledged (250) without a second copy; a log line says
so. IMAP APPEND and COPY are never suppressed, another recipient gets
its own copy, the same Message-ID with another body is stored, two LMTP
sessions delivering one message at once store one copy, and after the
window a redelivery is stored again (doc/casbox-storage.md, "Duplicate
deliveries")."""

import os
import smtplib
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import (Dovecot, files_under, is_dovecot24,  # noqa
                             lmtp_send, ok)
from test_storage_orphans import (STRACE, LmtpSession,  # noqa: E402
                                  msg as orphan_msg, record_uids,
                                  storage_dump)

SETTINGS = {"casbox_key_file": "%h/casbox.key",
            "casbox_key_autocreate": "yes",
            "casbox_duplicate_window": "1d"}
SUPPRESSED = r"Duplicate delivery suppressed"


def message(n, body=None, msgid=None):
    msgid = msgid or "<dup-%d@example.com>" % n
    body = body or "Body of message %d, written once.\r\n" % n
    return ("From: a@example.com\r\nTo: user1@example.com\r\n"
            "Subject: dup test %d\r\nMessage-ID: %s\r\n"
            "Date: Mon, 30 Nov 2026 10:00:00 +0000\r\n\r\n%s"
            % (n, msgid, body)).encode()


def with_received(msg, hop):
    """msg as a second MTA route hands it over: one more trace field."""
    return (b"Received: from mta%d.example.net by mx.example.com; "
            b"Mon, 30 Nov 2026 10:0%d:00 +0000\r\n" % (hop, hop)) + msg


def fetch_bodies(dc, user, mailbox="INBOX"):
    imap = dc.imap_login(user)
    ok(imap.select(mailbox))
    typ, data = imap.uid("FETCH", "1:*", "(BODY.PEEK[TEXT])")
    imap.logout()
    return [item[1] for item in data if isinstance(item, tuple)]


def deliver_lost_reply(dc, user, msg):
    """Hand msg to LMTP and hang up before reading the reply to DATA
    (the sender's timeout): the message is saved, the sender does not
    know it."""
    lmtp = smtplib.LMTP("127.0.0.1", dc.lmtp_port, timeout=60)
    lmtp.ehlo()
    lmtp.mail("sender@example.com")
    lmtp.rcpt(user)
    if is_dovecot24():
        lmtp.send(b"BDAT %d LAST\r\n" % len(msg) + msg)
    else:
        code, _ = lmtp.docmd("DATA")
        assert code == 354, code
        lmtp.send(msg + b".\r\n")
    lmtp.close()


def deliver_two(dc, users, msg):
    """One LMTP transaction for several recipients; their reply codes."""
    with smtplib.LMTP("127.0.0.1", dc.lmtp_port, timeout=60) as lmtp:
        lmtp.ehlo()
        lmtp.mail("s@example.com")
        for user in users:
            assert lmtp.rcpt(user)[0] == 250
        if is_dovecot24():
            lmtp.send(b"BDAT %d LAST\r\n" % len(msg) + msg)
        else:
            assert lmtp.docmd("DATA")[0] == 354
            lmtp.send(msg + b".\r\n")
        return [lmtp.getreply()[0] for _ in users]


class DuplicateDeliveryTest(unittest.TestCase):

    def test_redelivery_suppressed(self):
        with Dovecot(plugin_settings=SETTINGS) as dc:
            m1 = message(1)
            deliver_lost_reply(dc, "user1", m1)
            self.assertIsNotNone(dc.wait_log(r"saved mail to INBOX"))
            # the retry, through another hop of the sender's MTA
            dc.lmtp_deliver("user1", with_received(m1, 2))
            self.assertIsNotNone(dc.wait_log(SUPPRESSED))
            dc.lmtp_deliver("user1", m1)
            self.assertEqual(dc.wait_log_count(SUPPRESSED, 2), 2)
            bodies = fetch_bodies(dc, "user1")
            self.assertEqual(bodies, [m1.split(b"\r\n\r\n", 1)[1]])

            # same Message-ID, another body: not a redelivery
            m2 = message(1, body="A different body.\r\n")
            dc.lmtp_deliver("user1", m2)
            self.assertEqual(len(fetch_bodies(dc, "user1")), 2)

            # IMAP APPEND and COPY of the same bytes are stored
            imap = dc.imap_login("user1")
            ok(imap.append("INBOX", None, None, m1))
            ok(imap.select("INBOX"))
            ok(imap.uid("COPY", "1", "INBOX"))
            imap.logout()
            self.assertEqual(len(fetch_bodies(dc, "user1")), 4)
            self.assertEqual(dc.wait_log_count(SUPPRESSED, 2), 2)

            # the key is a MAC: no Message-ID under the root
            root = os.path.join(dc.home("user1"), "casbox")
            for path in files_under(root):
                with open(path, "rb") as f:
                    self.assertNotIn(b"dup-1@example.com", f.read(), path)
            self.assertEqual(dc.casbox_audit("user1"), [])

    def test_recipients_and_mailboxes(self):
        with Dovecot(plugin_settings=SETTINGS) as dc:
            m = message(3)
            # two recipients in one transaction: the second gets a copy
            # of the first saved mail (save_dest_mail in lib-lda)
            for _ in range(2):
                self.assertEqual(deliver_two(dc, ["user1", "user2"], m),
                                 [250, 250])
            self.assertEqual(len(fetch_bodies(dc, "user1")), 1)
            self.assertEqual(len(fetch_bodies(dc, "user2")), 1)
            self.assertEqual(dc.wait_log_count(SUPPRESSED, 2), 2)
            self.assertEqual(dc.casbox_audit("user1"), [])

    def test_concurrent_deliveries_store_one_copy(self):
        with Dovecot(plugin_settings=SETTINGS) as dc:
            # the user exists first: two first deliveries at once meet
            # Dovecot core's own INBOX-creation race (test_new_user_race)
            dc.lmtp_deliver("user1", message(99))
            rounds = 6
            for n in range(rounds):
                m = message(100 + n)
                barrier = threading.Barrier(2)
                errors = []

                def send(msg=m):
                    try:
                        with smtplib.LMTP("127.0.0.1", dc.lmtp_port,
                                          timeout=60) as lmtp:
                            lmtp.ehlo()
                            barrier.wait()
                            refused = lmtp_send(lmtp, "s@example.com",
                                                "user1", msg)
                            if refused:
                                errors.append(refused)
                    except Exception as e:  # noqa: BLE001
                        errors.append(e)
                threads = [threading.Thread(target=send) for _ in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                self.assertEqual(errors, [])
            bodies = fetch_bodies(dc, "user1")
            self.assertEqual(len(bodies), rounds + 1)
            self.assertEqual(len(set(bodies)), rounds + 1)
            self.assertEqual(dc.wait_log_count(SUPPRESSED, rounds), rounds)
            self.assertEqual(dc.casbox_audit("user1"), [])

    def test_window_expiry(self):
        settings = dict(SETTINGS, casbox_duplicate_window="2s")
        with Dovecot(plugin_settings=settings) as dc:
            m = message(7)
            dc.lmtp_deliver("user1", m)
            first = time.time()
            dc.lmtp_deliver("user1", m)
            self.assertIsNotNone(dc.wait_log(SUPPRESSED))
            # what is tested is the clock passing the window, not an
            # event to wait for: the next second boundary after it
            while time.time() < int(first) + 3:
                time.sleep(0.1)
            dc.lmtp_deliver("user1", m)
            self.assertEqual(len(fetch_bodies(dc, "user1")), 2)
            self.assertEqual(dc.wait_log_count(SUPPRESSED, 1), 1)

    @unittest.skipIf(STRACE is None, "strace not installed")
    def test_retry_after_crash_before_index_commit(self):
        """A delivery killed after its LSM commit (record and dup record
        written) but before its index commit was never acknowledged: the
        retry must be stored, not suppressed."""
        conf = ("lmtp_add_received_header = no\n"
                "service lmtp {\n  process_limit = 1\n}\n")
        with Dovecot(plugin_settings=SETTINGS, extra_conf=conf) as dc:
            dc.allow_log(r"killed with signal 9")
            dc.lmtp_deliver("user1", orphan_msg(1))
            sess = LmtpSession(dc, "signal=SIGKILL:when=2")
            with self.assertRaises((smtplib.SMTPException, OSError)):
                sess.lmtp.sendmail("s@example.com", ["user1"],
                                   orphan_msg(2))
            sess.close()
            self.assertEqual(record_uids(storage_dump(dc).stdout), [1, 2])
            dc.lmtp_deliver("user1", orphan_msg(2))
            bodies = fetch_bodies(dc, "user1")
            self.assertEqual(len(bodies), 2)
            self.assertTrue(bodies[1].endswith(orphan_msg(2)[-200:]))
            self.assertNotIn("Duplicate delivery", dc.log_text())
            # and that copy's record protects it from now on
            dc.lmtp_deliver("user1", orphan_msg(2))
            self.assertIsNotNone(dc.wait_log(SUPPRESSED))
            self.assertEqual(len(fetch_bodies(dc, "user1")), 2)
            self.assertEqual(dc.casbox_audit("user1"), [])

    def test_over_quota_redelivery_refused(self):
        """The known gap (doc/casbox-storage.md "Known gaps"): Dovecot's
        quota plugin refuses the redelivery in save_begin, before the
        commit where casbox finds the duplicate. Default: 552, a bounce
        for mail the user has; quota_full_tempfail = yes: 452, and the
        retry once there is room is suppressed, never a second copy."""
        settings = dict(SETTINGS, quota="count:User quota",
                        quota_vsizes="yes", quota_rule="*:messages=2")
        m1, m2 = message(11), message(12)
        for tempfail, code in ((False, 552), (True, 452)):
            conf = "quota_full_tempfail = yes\n" if tempfail else ""
            with Dovecot(plugin_settings=settings, extra_conf=conf,
                         mail_plugins=["casbox", "quota"]) as dc:
                dc.lmtp_deliver_many("user1", [m1, m2])
                with smtplib.LMTP("127.0.0.1", dc.lmtp_port,
                                  timeout=60) as lmtp:
                    lmtp.ehlo()
                    # 2.3's DATA raises, 2.4's BDAT (lmtp_send) returns
                    # the refused recipient's reply
                    try:
                        refused = lmtp_send(lmtp, "s@example.com",
                                            "user1", m2)
                    except smtplib.SMTPDataError as e:
                        refused = {"user1": (e.smtp_code, e.smtp_error)}
                self.assertIn("user1", refused)
                self.assertEqual(refused["user1"][0], code)
                self.assertIn(b"Quota exceeded", refused["user1"][1])
                self.assertNotIn(SUPPRESSED, dc.log_text())
                self.assertEqual(len(fetch_bodies(dc, "user1")), 2)
                if not tempfail:
                    continue
                # room again: the MTA's retry is a suppressed duplicate
                imap = dc.imap_login("user1")
                ok(imap.select("INBOX"))
                ok(imap.uid("STORE", "1", "+FLAGS", "(\\Deleted)"))
                ok(imap.expunge())
                imap.logout()
                dc.lmtp_deliver("user1", m2)
                self.assertIsNotNone(dc.wait_log(SUPPRESSED))
                self.assertEqual(fetch_bodies(dc, "user1"),
                                 [m2.split(b"\r\n\r\n", 1)[1]])
                self.assertEqual(dc.casbox_audit("user1"), [])

    def test_off(self):
        settings = dict(SETTINGS, casbox_duplicate_window="0")
        with Dovecot(plugin_settings=settings) as dc:
            m = message(9)
            dc.lmtp_deliver_many("user1", [m, m])
            self.assertEqual(len(fetch_bodies(dc, "user1")), 2)
            self.assertNotIn("Duplicate delivery", dc.log_text())


if __name__ == "__main__":
    unittest.main()
