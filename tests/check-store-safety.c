/* Unit tests for casbox-store-safety: the dup and retained record codecs
   (round trip, every truncation rejected) and the duplicate key (trace
   header fields left out, everything else counted, keyed). */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "cas-key.h"
#include "casbox-store-safety.h"

#include <check.h>
#include "check-run.h"
#include <stdlib.h>
#include <sodium.h>

static struct cas_keyring *test_keyring(unsigned char fill)
{
	unsigned char kek[CAS_KEK_SIZE];

	memset(kek, fill, sizeof(kek));
	return cas_keyring_create_from_kek(kek);
}

static void dup_key(struct cas_keyring *keyring, const char *msg,
		    struct casbox_dup_key *key_r)
{
	struct istream *input;
	const char *error;

	input = i_stream_create_from_data(msg, strlen(msg));
	ck_assert_int_eq(casbox_dup_key_compute(keyring, input, key_r,
						&error), 0);
	i_stream_unref(&input);
}

static bool dup_equal(struct cas_keyring *keyring, const char *m1,
		      const char *m2)
{
	struct casbox_dup_key k1, k2;

	dup_key(keyring, m1, &k1);
	dup_key(keyring, m2, &k2);
	return memcmp(k1.key, k2.key, sizeof(k1.key)) == 0;
}

#define BASE "From: a@example.com\nSubject: hi\nMessage-ID: <1@x>\n\nbody\n"

START_TEST(test_dup_key_trace_fields)
{
	struct cas_keyring *keyring = test_keyring(7);

	/* what MTAs and Dovecot's LMTP add on the way */
	ck_assert(dup_equal(keyring, BASE,
		"Return-Path: <s@example.com>\n"
		"Delivered-To: user1@example.com\n"
		"Received: from mta2 by mx; Mon, 30 Nov 2026 10:00:00 +0000\n"
		"Received: from mta1\n\tby mta2\n (folded)\n"
		"X-Original-To: u@example.com\n" BASE));
	/* names are case-insensitive, space before the colon allowed */
	ck_assert(dup_equal(keyring, BASE, "RECEIVED : x\n" BASE));
	/* trace fields after other fields are left out too */
	ck_assert(dup_equal(keyring,
		"From: a@example.com\nSubject: hi\nMessage-ID: <1@x>\n"
		"Received: late\n\nbody\n", BASE));
	/* anything else counts */
	ck_assert(!dup_equal(keyring, BASE, "Received-SPF: pass\n" BASE));
	ck_assert(!dup_equal(keyring, BASE, "X-Spam: yes\n" BASE));
	ck_assert(!dup_equal(keyring, BASE,
		"From: a@example.com\nSubject: hi\nMessage-ID: <1@x>\n\n"
		"other body\n"));
	ck_assert(!dup_equal(keyring, BASE,
		"From: a@example.com\nSubject: hi\nMessage-ID: <2@x>\n\n"
		"body\n"));
	/* a trace field name in the body is body */
	ck_assert(!dup_equal(keyring, BASE, BASE "Received: x\n"));
	/* header only, no body; and no header at all */
	ck_assert(dup_equal(keyring, "Subject: a\n", "Received: x\nSubject: a\n"));
	ck_assert(!dup_equal(keyring, "\nbody\n", "\nbody2\n"));
	/* CRLF-stored mail is its own byte string */
	ck_assert(dup_equal(keyring, "Subject: a\r\n\r\nb\r\n",
			    "Received: x\r\nSubject: a\r\n\r\nb\r\n"));
	ck_assert(!dup_equal(keyring, "Subject: a\r\n\r\nb\r\n",
			     "Subject: a\n\nb\n"));
	cas_keyring_free(&keyring);
}
END_TEST

START_TEST(test_dup_key_is_keyed)
{
	struct cas_keyring *k1 = test_keyring(1), *k2 = test_keyring(2);
	struct casbox_dup_key a, b;
	struct cas_blob_id id;

	dup_key(k1, BASE, &a);
	dup_key(k2, BASE, &b);
	ck_assert(memcmp(a.key, b.key, sizeof(a.key)) != 0);
	/* not the blob id of the same bytes either (domain prefix) */
	cas_blob_id_compute(k1, BASE, strlen(BASE), &id);
	ck_assert(memcmp(a.key, id.id, sizeof(a.key)) != 0);
	cas_keyring_free(&k1);
	cas_keyring_free(&k2);
}
END_TEST

START_TEST(test_dup_record)
{
	pool_t pool = pool_alloconly_create("test", 1024);
	struct casbox_dup_record rec, rec2;
	buffer_t *buf = buffer_create_dynamic(pool, 64);
	const char *error;
	size_t i;

	i_zero(&rec);
	rec.delivered = 1764583200;
	rec.uid = 42;
	rec.guid = "0123456789abcdef0123456789abcdef";
	casbox_dup_record_export(&rec, buf);
	ck_assert_int_eq(casbox_dup_record_import(buf->data, buf->used, pool,
						  &rec2, &error), 1);
	ck_assert_int_eq(rec2.delivered, rec.delivered);
	ck_assert_uint_eq(rec2.uid, 42);
	ck_assert_str_eq(rec2.guid, rec.guid);
	for (i = 0; i < buf->used; i++) {
		ck_assert_int_eq(casbox_dup_record_import(buf->data, i, pool,
							  &rec2, &error), -1);
	}
	buffer_append_c(buf, 0);
	ck_assert_int_eq(casbox_dup_record_import(buf->data, buf->used, pool,
						  &rec2, &error), -1);
	ck_assert_str_eq(error, "dup record: trailing bytes");
	buffer_set_used_size(buf, 0);
	rec.uid = 0;
	casbox_dup_record_export(&rec, buf);
	ck_assert_int_eq(casbox_dup_record_import(buf->data, buf->used, pool,
						  &rec2, &error), -1);
	buffer_set_used_size(buf, 0);
	rec.uid = 1;
	casbox_dup_record_export(&rec, buf);
	((unsigned char *)buffer_get_modifiable_data(buf, NULL))[0] = 2;
	ck_assert_int_eq(casbox_dup_record_import(buf->data, buf->used, pool,
						  &rec2, &error), -1);
	ck_assert_str_eq(error, "dup record: unknown version 2");
	pool_unref(&pool);
}
END_TEST

START_TEST(test_retained_record)
{
	pool_t pool = pool_alloconly_create("test", 2048);
	struct casbox_retained_record rec, rec2;
	struct casbox_msg_part *part;
	buffer_t *buf = buffer_create_dynamic(pool, 256);
	const char *error, *kw = "$Important";
	guid_128_t mguid, mguid2;
	uint32_t uid;
	size_t i;

	i_zero(&rec);
	rec.expunged = 1764583200;
	rec.mailbox_name = "Work/Sub";
	casbox_msg_record_init(pool, &rec.msg);
	rec.msg.guid = "abc";
	rec.msg.physical_size = 10;
	rec.msg.flags = 0x3;
	array_push_back(&rec.msg.keywords, &kw);
	part = array_append_space(&rec.msg.parts);
	memset(part->id.id, 0x55, sizeof(part->id.id));
	part->size = 10;
	casbox_retained_record_export(&rec, buf);
	ck_assert_int_eq(casbox_retained_record_import(buf->data, buf->used,
						       pool, &rec2, &error), 1);
	ck_assert_int_eq(rec2.expunged, rec.expunged);
	ck_assert_str_eq(rec2.mailbox_name, "Work/Sub");
	ck_assert_str_eq(rec2.msg.guid, "abc");
	ck_assert_uint_eq(rec2.msg.flags, 3);
	ck_assert_str_eq(array_idx_elem(&rec2.msg.keywords, 0), kw);
	ck_assert_uint_eq(array_count(&rec2.msg.parts), 1);
	for (i = 0; i < buf->used; i++) {
		ck_assert_int_eq(casbox_retained_record_import(buf->data, i,
				 pool, &rec2, &error), -1);
	}

	buffer_set_used_size(buf, 0);
	memset(mguid, 0xa5, sizeof(mguid));
	casbox_key_retained(buf, mguid, 77);
	ck_assert_int_eq(casbox_key_retained_parse(buf->data, buf->used,
						   mguid2, &uid), 1);
	ck_assert(guid_128_equals(mguid, mguid2));
	ck_assert_uint_eq(uid, 77);
	ck_assert_int_eq(casbox_key_retained_parse(buf->data, buf->used - 1,
						   mguid2, &uid), -1);
	pool_unref(&pool);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("storage-safety");
	TCase *tc = tcase_create("safety");
	int failed;

	lib_init();
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	tcase_add_test(tc, test_dup_key_trace_fields);
	tcase_add_test(tc, test_dup_key_is_keyed);
	tcase_add_test(tc, test_dup_record);
	tcase_add_test(tc, test_retained_record);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
