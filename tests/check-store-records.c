/* casbox LSM records and the recovery records of the packs: round
   trips, key order, and every truncation or inconsistency of untrusted
   bytes is rejected with a reason. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "casbox-records.h"
#include "casbox-recovery.h"

#include <check.h>
#include "check-run.h"
#include <stdlib.h>
#include <zstd.h>

static void fill_record(pool_t pool, struct casbox_msg_record *rec)
{
	struct casbox_msg_part *part;
	const char *kw;
	unsigned int i;

	casbox_msg_record_init(pool, rec);
	rec->guid = "1700000000.M1P1.host,S=49";
	rec->received_date = 1700000000;
	rec->save_date = 1700000123;
	rec->flags = 0x0b;
	rec->modseq = 77;
	rec->virtual_size = 310;
	for (i = 0; i < 3; i++) {
		part = array_append_space(&rec->parts);
		memset(part->id.id, 'a' + i, sizeof(part->id.id));
		part->size = 100 * (i + 1);
		rec->physical_size += part->size;
	}
	kw = "$Label1";
	array_push_back(&rec->keywords, &kw);
	kw = "Junk";
	array_push_back(&rec->keywords, &kw);
	rec->pop3_uidl = "UID123-1700000000";
	rec->pop3_order = 9;
}

START_TEST(test_msg_roundtrip)
{
	pool_t pool = pool_alloconly_create("test", 1024);
	struct casbox_msg_record rec, rec2;
	const struct casbox_msg_part *p1, *p2;
	buffer_t *buf = buffer_create_dynamic(pool, 256);
	const char *error = NULL;
	unsigned int i;

	fill_record(pool, &rec);
	casbox_msg_record_export(&rec, buf);
	ck_assert_int_eq(casbox_msg_record_import(buf->data, buf->used, pool,
						  &rec2, &error), 1);
	ck_assert_str_eq(rec2.guid, rec.guid);
	ck_assert_int_eq(rec2.received_date, rec.received_date);
	ck_assert_int_eq(rec2.save_date, rec.save_date);
	ck_assert_uint_eq(rec2.flags, rec.flags);
	ck_assert_uint_eq(rec2.modseq, rec.modseq);
	ck_assert_uint_eq(rec2.physical_size, 600);
	ck_assert_uint_eq(rec2.virtual_size, 310);
	ck_assert_uint_eq(array_count(&rec2.keywords), 2);
	ck_assert_str_eq(array_idx_elem(&rec2.keywords, 1), "Junk");
	ck_assert_uint_eq(array_count(&rec2.parts), 3);
	ck_assert_str_eq(rec2.pop3_uidl, "UID123-1700000000");
	ck_assert_uint_eq(rec2.pop3_order, 9);
	for (i = 0; i < 3; i++) {
		p1 = array_idx(&rec.parts, i);
		p2 = array_idx(&rec2.parts, i);
		ck_assert(memcmp(p1->id.id, p2->id.id, CAS_BLOB_ID_SIZE) == 0);
		ck_assert_uint_eq(p1->size, p2->size);
	}
	pool_unref(&pool);
}
END_TEST

START_TEST(test_msg_truncations_fail)
{
	static const unsigned char meta[] = "sealed-bytes";
	pool_t pool = pool_alloconly_create("test", 4096);
	struct casbox_msg_record rec, rec2;
	buffer_t *buf = buffer_create_dynamic(pool, 256);
	const char *error;
	size_t len, tail, pop3_end;

	fill_record(pool, &rec);
	rec.sealed_meta = meta;
	rec.sealed_meta_size = sizeof(meta);
	casbox_msg_record_export(&rec, buf);
	ck_assert_int_eq(casbox_msg_record_import(buf->data, buf->used, pool,
						  &rec2, &error), 1);
	ck_assert_uint_eq(rec2.sealed_meta_size, sizeof(meta));
	ck_assert(memcmp(rec2.sealed_meta, meta, sizeof(meta)) == 0);

	/* a record ending before the optional POP3 tail is the first
	   layout, one ending after it the second: both valid, without
	   the fields they lack */
	pop3_end = buf->used - 4 - sizeof(meta);
	tail = pop3_end - (2 + strlen(rec.pop3_uidl) + 4);
	ck_assert_int_eq(casbox_msg_record_import(buf->data, tail, pool,
						  &rec2, &error), 1);
	ck_assert_str_eq(rec2.pop3_uidl, "");
	ck_assert_uint_eq(rec2.pop3_order, 0);
	ck_assert_uint_eq(rec2.sealed_meta_size, 0);
	ck_assert_int_eq(casbox_msg_record_import(buf->data, pop3_end, pool,
						  &rec2, &error), 1);
	ck_assert_str_eq(rec2.pop3_uidl, rec.pop3_uidl);
	ck_assert_uint_eq(rec2.sealed_meta_size, 0);
	ck_assert_ptr_null(rec2.sealed_meta);
	for (len = 0; len < buf->used; len++) {
		if (len == tail || len == pop3_end)
			continue;
		error = NULL;
		ck_assert_int_eq(casbox_msg_record_import(buf->data, len, pool,
							  &rec2, &error), -1);
		ck_assert_ptr_nonnull(error);
	}
	pool_unref(&pool);
}
END_TEST

/* The flag record replaces exactly flags, modseq and keywords, is small,
   and every truncation of it fails. */
START_TEST(test_flags_record)
{
	const char *const keywords[] = { "$Label1", "Junk", NULL };
	pool_t pool = pool_alloconly_create("test", 4096);
	struct casbox_msg_record rec, orig;
	buffer_t *buf = buffer_create_dynamic(pool, 64);
	const char *error;
	size_t len;

	fill_record(pool, &rec);
	orig = rec;
	casbox_flags_record_export(0x15, 987654321012ULL, keywords, buf);
	ck_assert_uint_le(buf->used, 1 + 4 + 8 + 2 + 2 + 7 + 2 + 4);
	ck_assert_int_eq(casbox_flags_record_import(buf->data, buf->used, pool,
						    &rec, &error), 1);
	ck_assert_uint_eq(rec.flags, 0x15);
	ck_assert_uint_eq(rec.modseq, 987654321012ULL);
	ck_assert_uint_eq(array_count(&rec.keywords), 2);
	ck_assert_str_eq(array_idx_elem(&rec.keywords, 0), "$Label1");
	ck_assert_str_eq(array_idx_elem(&rec.keywords, 1), "Junk");
	/* the rest of the message record is the saved one */
	ck_assert_str_eq(rec.guid, orig.guid);
	ck_assert_uint_eq(rec.physical_size, orig.physical_size);
	ck_assert_uint_eq(array_count(&rec.parts), array_count(&orig.parts));
	for (len = 0; len < buf->used; len++) {
		rec = orig;
		error = NULL;
		ck_assert_int_eq(casbox_flags_record_import(buf->data, len,
			pool, &rec, &error), -1);
		ck_assert_ptr_nonnull(error);
		/* a failed import changes nothing */
		ck_assert_uint_eq(rec.flags, orig.flags);
	}
	/* no keywords */
	buffer_set_used_size(buf, 0);
	casbox_flags_record_export(0, 1, NULL, buf);
	ck_assert_int_eq(casbox_flags_record_import(buf->data, buf->used, pool,
						    &rec, &error), 1);
	ck_assert_uint_eq(array_count(&rec.keywords), 0);
	pool_unref(&pool);
}
END_TEST

START_TEST(test_msg_inconsistent_fail)
{
	pool_t pool = pool_alloconly_create("test", 4096);
	struct casbox_msg_record rec, rec2;
	buffer_t *buf = buffer_create_dynamic(pool, 256);
	unsigned char *data;
	const char *error = NULL;

	fill_record(pool, &rec);
	/* parts must add up to the physical size */
	rec.physical_size++;
	casbox_msg_record_export(&rec, buf);
	ck_assert_int_eq(casbox_msg_record_import(buf->data, buf->used, pool,
						  &rec2, &error), -1);
	ck_assert(strstr(error, "physical size") != NULL);

	/* unknown version */
	rec.physical_size--;
	buffer_set_used_size(buf, 0);
	casbox_msg_record_export(&rec, buf);
	data = buffer_get_modifiable_data(buf, NULL);
	data[0] = 99;
	ck_assert_int_eq(casbox_msg_record_import(buf->data, buf->used, pool,
						  &rec2, &error), -1);
	ck_assert(strstr(error, "version") != NULL);
	pool_unref(&pool);
}
END_TEST

START_TEST(test_message_keys_sort_by_uid)
{
	buffer_t *k1 = t_buffer_create(32), *k2 = t_buffer_create(32);
	guid_128_t guid, guid2;
	uint32_t uid;

	memset(guid, 0x42, sizeof(guid));
	/* 255 < 256 numerically must also hold bytewise */
	casbox_key_message(k1, guid, 255);
	casbox_key_message(k2, guid, 256);
	ck_assert_uint_eq(k1->used, 21);
	ck_assert_int_lt(memcmp(k1->data, k2->data, k1->used), 0);
	ck_assert_int_eq(casbox_key_message_parse(k2->data, k2->used,
						  guid2, &uid), 1);
	ck_assert_uint_eq(uid, 256);
	ck_assert(memcmp(guid, guid2, sizeof(guid)) == 0);
	ck_assert_int_eq(casbox_key_message_parse(k2->data, k2->used - 1,
						  guid2, &uid), -1);
}
END_TEST

START_TEST(test_blob_and_mailbox_values)
{
	pool_t pool = pool_alloconly_create("test", 1024);
	struct casbox_blob_value val, val2;
	struct casbox_mailbox_record mrec, mrec2;
	unsigned char packrec[20];
	buffer_t *buf = buffer_create_dynamic(pool, 64);
	const char *error;

	memset(packrec, 7, sizeof(packrec));
	i_zero(&val);
	val.refcount = 3;
	val.pack_record = packrec;
	val.pack_record_size = sizeof(packrec);
	casbox_blob_value_export(&val, buf);
	ck_assert_int_eq(casbox_blob_value_import(buf->data, buf->used,
						  &val2, &error), 1);
	ck_assert_uint_eq(val2.refcount, 3);
	ck_assert_uint_eq(val2.pack_record_size, sizeof(packrec));
	ck_assert(memcmp(val2.pack_record, packrec, sizeof(packrec)) == 0);

	/* a stored zero refcount is corruption */
	val.refcount = 0;
	buffer_set_used_size(buf, 0);
	casbox_blob_value_export(&val, buf);
	ck_assert_int_eq(casbox_blob_value_import(buf->data, buf->used,
						  &val2, &error), -1);

	i_zero(&mrec);
	mrec.uid_validity = 1796083230;
	mrec.name = "Archive/2024";
	buffer_set_used_size(buf, 0);
	casbox_mailbox_record_export(&mrec, buf);
	ck_assert_int_eq(casbox_mailbox_record_import(buf->data, buf->used,
						      pool, &mrec2, &error), 1);
	ck_assert_uint_eq(mrec2.uid_validity, mrec.uid_validity);
	ck_assert_str_eq(mrec2.name, mrec.name);
	ck_assert_int_eq(casbox_mailbox_record_import(buf->data,
						      buf->used - 1, pool,
						      &mrec2, &error), -1);
	pool_unref(&pool);
}
END_TEST

START_TEST(test_mailbox_record_tail)
{
	pool_t pool = pool_alloconly_create("test", 1024);
	struct casbox_mailbox_record mrec, mrec2;
	buffer_t *buf = buffer_create_dynamic(pool, 64);
	const char *error;
	size_t base, cut;

	i_zero(&mrec);
	mrec.uid_validity = 42;
	mrec.name = "INBOX";
	mrec.next_uid = 77;
	mrec.highest_modseq = 123456789012ULL;
	guid_128_generate(mrec.guid);
	casbox_mailbox_record_export(&mrec, buf);
	ck_assert_int_eq(casbox_mailbox_record_import(buf->data, buf->used,
						      pool, &mrec2, &error), 1);
	ck_assert_uint_eq(mrec2.next_uid, 77);
	ck_assert(mrec2.highest_modseq == 123456789012ULL);
	ck_assert(guid_128_equals(mrec2.guid, mrec.guid));

	/* version, uid validity, name: what records held before the tail
	   fields existed; they still import, with the tail unknown */
	base = 1 + 4 + 2 + strlen(mrec.name);
	ck_assert_int_eq(casbox_mailbox_record_import(buf->data, base,
						      pool, &mrec2, &error), 1);
	ck_assert_uint_eq(mrec2.next_uid, 0);
	ck_assert(mrec2.highest_modseq == 0);
	ck_assert(guid_128_is_empty(mrec2.guid));
	ck_assert_int_eq(casbox_mailbox_record_import(buf->data, base + 4,
						      pool, &mrec2, &error), 1);
	ck_assert_uint_eq(mrec2.next_uid, 77);
	ck_assert(mrec2.highest_modseq == 0);

	/* a cut inside any tail field is damage, never a short value */
	for (cut = base + 1; cut < buf->used; cut++) {
		if (cut == base + 4 || cut == base + 12)
			continue;
		ck_assert_msg(casbox_mailbox_record_import(buf->data, cut,
				pool, &mrec2, &error) == -1, "cut %zu", cut);
	}

	/* the public GUID is written only when it differs from the key's */
	guid_128_empty(mrec.guid);
	buffer_set_used_size(buf, 0);
	casbox_mailbox_record_export(&mrec, buf);
	ck_assert_uint_eq(buf->used, base + 12);
	ck_assert_int_eq(casbox_mailbox_record_import(buf->data, buf->used,
						      pool, &mrec2, &error), 1);
	ck_assert(guid_128_is_empty(mrec2.guid));
	pool_unref(&pool);
}
END_TEST


static void fill_recovery(pool_t pool, struct casbox_recovery_record *rec)
{
	struct casbox_recovery_blob *blob;
	const struct casbox_msg_part *part;

	i_zero(rec);
	rec->written_usecs = 1796000000123456ULL;
	memset(rec->mailbox_guid, 0x11, GUID_128_SIZE);
	memset(rec->public_guid, 0x22, GUID_128_SIZE);
	rec->uid_validity = 1700000001;
	rec->uid = 42;
	rec->next_uid = 50;
	rec->highest_modseq = 99;
	rec->mailbox_name = "Work/Projects";
	fill_record(pool, &rec->msg);
	p_array_init(&rec->blobs, pool, 2);
	blob = array_append_space(&rec->blobs);
	part = array_idx(&rec->msg.parts, 1);
	blob->id = part->id;
	blob->dict_id = 3;
	blob->plain_size = 200;
	blob->dek_kind = CAS_DEK_KIND_SERVER_WRAP;
	memset(blob->wrapped_dek, 0x77, sizeof(blob->wrapped_dek));
}

/* Every truncation of a recovery record, and a trailing byte, are
   rejected with a reason. */
static void assert_truncations_fail(buffer_t *buf, pool_t pool)
{
	struct casbox_recovery_record rec;
	const char *error = NULL;
	size_t i;

	for (i = 0; i < buf->used; i++) {
		ck_assert_int_eq(casbox_recovery_record_import(buf->data, i,
				 pool, &rec, &error), -1);
		ck_assert_ptr_nonnull(strstr(error, "recovery record: "));
	}
	buffer_append_c(buf, 0);
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec, &error), -1);
	buffer_set_used_size(buf, buf->used - 1);
}

/* The version 1 or 2 record a version 3 (compressed) export holds,
   in buf instead of the export, to test the plain layout. */
static void export_plain(const struct casbox_recovery_record *rec,
			 buffer_t *buf)
{
	const unsigned char *p;
	unsigned char *raw;
	size_t raw_size;

	buffer_set_used_size(buf, 0);
	casbox_recovery_record_export(rec, buf);
	p = buf->data;
	ck_assert_uint_eq(p[0], CASBOX_RECOVERY_VERSION_ZSTD);
	raw_size = be32_to_cpu_unaligned(p + 1);
	raw = i_malloc(raw_size);
	ck_assert_uint_eq(ZSTD_decompress(raw, raw_size, p + 5,
					  buf->used - 5), raw_size);
	buffer_set_used_size(buf, 0);
	buffer_append(buf, raw, raw_size);
	i_free(raw);
}

START_TEST(test_recovery_record)
{
	pool_t pool = pool_alloconly_create("test", 4096);
	struct casbox_recovery_record rec, rec2;
	const struct casbox_recovery_blob *b1, *b2;
	buffer_t *buf = buffer_create_dynamic(pool, 512);
	buffer_t *msg = buffer_create_dynamic(pool, 512);
	buffer_t *msg2 = buffer_create_dynamic(pool, 512);
	const char *error = NULL;
	unsigned char *p;

	fill_recovery(pool, &rec);
	export_plain(&rec, buf);
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), 1);
	ck_assert(rec2.written_usecs == rec.written_usecs);
	ck_assert(memcmp(rec2.mailbox_guid, rec.mailbox_guid,
			 GUID_128_SIZE) == 0);
	ck_assert(memcmp(rec2.public_guid, rec.public_guid,
			 GUID_128_SIZE) == 0);
	ck_assert_uint_eq(rec2.uid_validity, rec.uid_validity);
	ck_assert_uint_eq(rec2.uid, 42);
	ck_assert_uint_eq(rec2.next_uid, 50);
	ck_assert_uint_eq(rec2.highest_modseq, 99);
	ck_assert_str_eq(rec2.mailbox_name, "Work/Projects");
	casbox_msg_record_export(&rec.msg, msg);
	casbox_msg_record_export(&rec2.msg, msg2);
	ck_assert(buffer_cmp(msg, msg2));
	ck_assert_uint_eq(array_count(&rec2.blobs), 1);
	b1 = array_front(&rec.blobs);
	b2 = array_front(&rec2.blobs);
	ck_assert(memcmp(b1, b2, sizeof(*b1)) == 0);

	/* every truncation, and a trailing byte */
	assert_truncations_fail(buf, pool);

	/* version, DEK kind, a zero UID */
	p = buffer_get_modifiable_data(buf, NULL);
	ck_assert_uint_eq(p[0], CASBOX_RECOVERY_VERSION);
	p[0] = 4;
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), -1);
	ck_assert_str_eq(error, "recovery record: unsupported version 4");
	p[0] = 0;
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), -1);
	p[0] = CASBOX_RECOVERY_VERSION;
	/* a version 1 record holds server-wrapped DEKs only */
	p[buf->used - CAS_WRAPPED_DEK_SIZE - 1] = CAS_DEK_KIND_SEALED;
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), -1);
	ck_assert_str_eq(error, "recovery record: unknown DEK kind 2 in a "
			 "version 1 record");
	p[buf->used - CAS_WRAPPED_DEK_SIZE - 1] = 9;
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), -1);
	p[buf->used - CAS_WRAPPED_DEK_SIZE - 1] = CAS_DEK_KIND_SERVER_WRAP;

	rec.uid = 0;
	export_plain(&rec, buf);
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), -1);
	ck_assert_str_eq(error, "recovery record: zero UID, UIDVALIDITY or "
			 "mailbox GUID");

	/* no new blobs (a copy) */
	rec.uid = 43;
	array_clear(&rec.blobs);
	buffer_set_used_size(buf, 0);
	casbox_recovery_record_export(&rec, buf);
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), 1);
	ck_assert_uint_eq(array_count(&rec2.blobs), 0);
	pool_unref(&pool);
}
END_TEST

/* Version 2 (password mode): sealed DEKs of 133 bytes, mixed with
   wrapped ones; a record with only wrapped DEKs is still version 1,
   byte for byte as before version 2. */
START_TEST(test_recovery_record_v2)
{
	pool_t pool = pool_alloconly_create("test", 8192);
	struct casbox_recovery_record rec, rec2;
	struct casbox_recovery_blob *blob;
	const struct casbox_recovery_blob *b1, *b2;
	buffer_t *buf = buffer_create_dynamic(pool, 512);
	buffer_t *v1 = buffer_create_dynamic(pool, 512);
	const char *error = NULL;
	unsigned char *p;
	size_t i, v1_size;
	unsigned int n;

	fill_recovery(pool, &rec);
	export_plain(&rec, v1);
	ck_assert_uint_eq(((const unsigned char *)v1->data)[0], 1);
	v1_size = v1->used;
	/* the wrapped entry at the end is the documented v1 layout */
	p = buffer_get_modifiable_data(v1, NULL);
	ck_assert_uint_eq(p[v1_size - CAS_WRAPPED_DEK_SIZE - 1],
			  CASBOX_DEK_KIND_WRAPPED);

	blob = array_append_space(&rec.blobs);
	memset(blob->id.id, 0x5a, CAS_BLOB_ID_SIZE);
	blob->dict_id = 0;
	blob->plain_size = 12345;
	blob->dek_kind = CAS_DEK_KIND_SEALED;
	for (i = 0; i < CAS_SEALED_DEK_SIZE; i++)
		blob->sealed_dek[i] = i;
	blob->sealed_dek[0] = CAS_DEK_KIND_SEALED;
	export_plain(&rec, buf);
	p = buffer_get_modifiable_data(buf, NULL);
	ck_assert_uint_eq(p[0], CASBOX_RECOVERY_VERSION_DEK_KIND);
	ck_assert_uint_eq(buf->used, v1_size + CAS_BLOB_ID_SIZE + 4 + 8 +
			  CAS_SEALED_DEK_SIZE);
	/* same bytes as the v1 record but version and count */
	ck_assert(memcmp(p + 1, CONST_PTR_OFFSET(v1->data, 1),
			 v1_size - 1 - 2 - (CAS_BLOB_ID_SIZE + 4 + 8 + 1 +
					    CAS_WRAPPED_DEK_SIZE)) == 0);
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), 1);
	ck_assert_uint_eq(array_count(&rec2.blobs), 2);
	for (n = 0; n < 2; n++) {
		b1 = array_idx(&rec.blobs, n);
		b2 = array_idx(&rec2.blobs, n);
		ck_assert(memcmp(b1->id.id, b2->id.id, CAS_BLOB_ID_SIZE) == 0);
		ck_assert_uint_eq(b1->dict_id, b2->dict_id);
		ck_assert(b1->plain_size == b2->plain_size);
		ck_assert_uint_eq(b1->dek_kind, b2->dek_kind);
		ck_assert(memcmp(b1->stored_dek, b2->stored_dek,
				 b1->dek_kind == CAS_DEK_KIND_SEALED ?
				 CAS_SEALED_DEK_SIZE :
				 CAS_WRAPPED_DEK_SIZE) == 0);
	}

	/* every truncation, a trailing byte, an unknown kind */
	for (i = 0; i < buf->used; i++) {
		ck_assert_int_eq(casbox_recovery_record_import(buf->data, i,
				 pool, &rec2, &error), -1);
	}
	buffer_append_c(buf, 0);
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), -1);
	buffer_set_used_size(buf, buf->used - 1);
	p[buf->used - CAS_SEALED_DEK_SIZE] = 3;
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), -1);
	ck_assert_str_eq(error, "recovery record: unknown DEK kind 3 in a "
			 "version 2 record");
	p[buf->used - CAS_SEALED_DEK_SIZE] = CAS_DEK_KIND_SEALED;
	/* a blob count larger than the bytes */
	p[buf->used - 2 * CAS_BLOB_ID_SIZE - 2 * 12 - CAS_SEALED_DEK_SIZE -
	  1 - CAS_WRAPPED_DEK_SIZE - 1] = 3;
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), -1);
	pool_unref(&pool);
}
END_TEST

/* Version 3: the plain record zstd-compressed. Round trip of both
   plain versions inside it, every truncation, trailing bytes, a raw
   size the frame does not declare or out of range, a damaged frame,
   a version 3 inside a version 3. (A record that would not shrink is
   written as version 1 or 2; every real one shrinks, and a test cannot
   build one that does not: its fixed fields always compress a little.) */
START_TEST(test_recovery_record_v3)
{
	pool_t pool = pool_alloconly_create("test", 8192);
	struct casbox_recovery_record rec, rec2;
	struct casbox_recovery_blob *blob;
	buffer_t *buf = buffer_create_dynamic(pool, 512);
	buffer_t *plain = buffer_create_dynamic(pool, 512);
	buffer_t *out = buffer_create_dynamic(pool, 512);
	buffer_t *z = buffer_create_dynamic(pool, 512);
	const char *error = NULL;
	unsigned char *p;
	size_t bound, zsize;

	fill_recovery(pool, &rec);
	export_plain(&rec, plain);
	casbox_recovery_record_export(&rec, buf);
	p = buffer_get_modifiable_data(buf, NULL);
	ck_assert_uint_eq(p[0], CASBOX_RECOVERY_VERSION_ZSTD);
	ck_assert_uint_eq(be32_to_cpu_unaligned(p + 1), plain->used);
	ck_assert_uint_lt(buf->used, plain->used);
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), 1);
	/* it reads as the plain record it holds */
	export_plain(&rec2, out);
	ck_assert(buffer_cmp(out, plain));
	buffer_set_used_size(out, 0);
	casbox_recovery_record_export_plain(&rec2, out);
	ck_assert(buffer_cmp(out, plain));

	assert_truncations_fail(buf, pool);
	p = buffer_get_modifiable_data(buf, NULL);
	p[4] ^= 0x01;
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), -1);
	ck_assert_str_eq(error, "recovery record: compressed body does not "
			 "declare its size");
	p[4] ^= 0x01;
	p[1] = 0x7f;
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), -1);
	ck_assert_str_eq(error, t_strdup_printf(
		"recovery record: raw size %u out of range",
		be32_to_cpu_unaligned(p + 1)));
	p[1] = 0;
	/* a damaged frame: the bytes after the frame header */
	p[buf->used - 3] ^= 0xff;
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), -1);
	p[buf->used - 3] ^= 0xff;
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), 1);

	/* version 3 holding version 3: rejected, no recursion */
	bound = ZSTD_compressBound(buf->used);
	buffer_set_used_size(z, 0);
	buffer_append_c(z, CASBOX_RECOVERY_VERSION_ZSTD);
	p = buffer_append_space_unsafe(z, 4 + bound);
	cpu32_to_be_unaligned(buf->used, p);
	zsize = ZSTD_compress(p + 4, bound, buf->data, buf->used, 3);
	ck_assert(!ZSTD_isError(zsize));
	buffer_set_used_size(z, 5 + zsize);
	ck_assert_int_eq(casbox_recovery_record_import(z->data, z->used,
			 pool, &rec2, &error), -1);
	ck_assert_str_eq(error, "recovery record: unsupported version 3");

	/* a password-mode record (a sealed DEK) compresses the same way */
	blob = array_append_space(&rec.blobs);
	memset(blob->id.id, 0x5a, CAS_BLOB_ID_SIZE);
	blob->dek_kind = CAS_DEK_KIND_SEALED;
	memset(blob->sealed_dek, 0x33, CAS_SEALED_DEK_SIZE);
	blob->sealed_dek[0] = CAS_DEK_KIND_SEALED;
	export_plain(&rec, plain);
	ck_assert_uint_eq(((const unsigned char *)plain->data)[0],
			  CASBOX_RECOVERY_VERSION_DEK_KIND);
	buffer_set_used_size(buf, 0);
	casbox_recovery_record_export(&rec, buf);
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
			 pool, &rec2, &error), 1);
	ck_assert_uint_eq(array_count(&rec2.blobs), 2);
	blob = array_idx_modifiable(&rec2.blobs, 1);
	ck_assert_uint_eq(blob->dek_kind, CAS_DEK_KIND_SEALED);

	pool_unref(&pool);
}
END_TEST

START_TEST(test_recovery_mailbox)
{
	pool_t pool = pool_alloconly_create("test", 1024);
	struct casbox_recovery_mailbox rec, rec2;
	buffer_t *buf = buffer_create_dynamic(pool, 128);
	const char *error = NULL;
	unsigned char *p;
	size_t i;

	i_zero(&rec);
	rec.written_usecs = 1796000000654321ULL;
	memset(rec.mailbox_guid, 0x31, GUID_128_SIZE);
	memset(rec.public_guid, 0x32, GUID_128_SIZE);
	rec.uid_validity = 1700000002;
	rec.name = "Archive/2026";
	casbox_recovery_mailbox_export(&rec, buf);
	ck_assert_int_eq(casbox_recovery_mailbox_import(buf->data, buf->used,
			 pool, &rec2, &error), 1);
	ck_assert(rec2.written_usecs == rec.written_usecs);
	ck_assert(memcmp(rec2.mailbox_guid, rec.mailbox_guid,
			 GUID_128_SIZE) == 0);
	ck_assert(memcmp(rec2.public_guid, rec.public_guid,
			 GUID_128_SIZE) == 0);
	ck_assert_uint_eq(rec2.uid_validity, rec.uid_validity);
	ck_assert(!rec2.deleted);
	ck_assert_str_eq(rec2.name, "Archive/2026");
	for (i = 0; i < buf->used; i++) {
		ck_assert_int_eq(casbox_recovery_mailbox_import(buf->data, i,
				 pool, &rec2, &error), -1);
	}
	buffer_append_c(buf, 'x');
	ck_assert_int_eq(casbox_recovery_mailbox_import(buf->data, buf->used,
			 pool, &rec2, &error), -1);
	ck_assert_str_eq(error, "mailbox recovery record: trailing bytes");
	buffer_set_used_size(buf, buf->used - 1);
	p = buffer_get_modifiable_data(buf, NULL);
	p[1 + 8 + 16 + 16 + 4] = 0x02;
	ck_assert_int_eq(casbox_recovery_mailbox_import(buf->data, buf->used,
			 pool, &rec2, &error), -1);
	ck_assert_str_eq(error, "mailbox recovery record: unknown flags");

	/* a deletion marker needs no UIDVALIDITY; a live record does */
	rec.deleted = TRUE;
	rec.uid_validity = 0;
	buffer_set_used_size(buf, 0);
	casbox_recovery_mailbox_export(&rec, buf);
	ck_assert_int_eq(casbox_recovery_mailbox_import(buf->data, buf->used,
			 pool, &rec2, &error), 1);
	ck_assert(rec2.deleted);
	rec.deleted = FALSE;
	buffer_set_used_size(buf, 0);
	casbox_recovery_mailbox_export(&rec, buf);
	ck_assert_int_eq(casbox_recovery_mailbox_import(buf->data, buf->used,
			 pool, &rec2, &error), -1);
	pool_unref(&pool);
}
END_TEST

/* Copy records: one entry stored as it is, many compressed; both read
   back entry for entry; every truncation, a trailing byte, another
   version or compression, a raw size the frame does not declare, zero
   entries, a zero UID are refused. */
START_TEST(test_copy_record)
{
	pool_t pool = pool_alloconly_create("test", 65536);
	struct casbox_recovery_record rec, rrec;
	struct casbox_copy_record crec, crec2;
	const struct casbox_copy_entry *entry;
	buffer_t *body = buffer_create_dynamic(pool, 4096);
	buffer_t *buf = buffer_create_dynamic(pool, 4096);
	buffer_t *m1 = buffer_create_dynamic(pool, 512);
	buffer_t *m2 = buffer_create_dynamic(pool, 512);
	const char *error = NULL;
	unsigned char *p;
	size_t i, head;
	unsigned int n;

	fill_recovery(pool, &rec);
	i_zero(&crec);
	crec.written_usecs = rec.written_usecs;
	memcpy(crec.mailbox_guid, rec.mailbox_guid, GUID_128_SIZE);
	crec.uid_validity = rec.uid_validity;
	crec.next_uid = 200;
	crec.highest_modseq = 7;
	crec.mailbox_name = "Copies";
	casbox_copy_record_body_init(body);
	ck_assert_uint_eq(casbox_copy_record_body_count(body), 0);
	casbox_copy_record_body_add(body, 101, &rec.msg);
	casbox_copy_record_export(&crec, body, buf);
	/* head: version, written, 2 GUIDs, UIDVALIDITY, next UID, modseq,
	   name; then the compression byte */
	head = 1 + 8 + 16 + 16 + 4 + 4 + 8 + 2 + strlen("Copies");
	ck_assert_int_eq(casbox_copy_record_import(buf->data, buf->used, pool,
						   &crec2, &error), 1);
	ck_assert_uint_eq(array_count(&crec2.entries), 1);
	for (i = 0; i < buf->used; i++) {
		ck_assert_int_eq(casbox_copy_record_import(buf->data, i, pool,
							   &crec2, &error), -1);
		ck_assert_ptr_nonnull(strstr(error, "copy record: "));
	}
	buffer_append_c(buf, 0);
	ck_assert_int_eq(casbox_copy_record_import(buf->data, buf->used, pool,
						   &crec2, &error), -1);

	/* 200 entries: compressed to less than a fifth */
	for (n = 102; n < 301; n++)
		casbox_copy_record_body_add(body, n, &rec.msg);
	ck_assert_uint_eq(casbox_copy_record_body_count(body), 200);
	buffer_set_used_size(buf, 0);
	casbox_copy_record_export(&crec, body, buf);
	p = buffer_get_modifiable_data(buf, NULL);
	ck_assert_uint_eq(p[head], 1);
	ck_assert_uint_lt(buf->used, body->used / 5);
	ck_assert_int_eq(casbox_copy_record_import(buf->data, buf->used, pool,
						   &crec2, &error), 1);
	ck_assert_uint_eq(array_count(&crec2.entries), 200);
	ck_assert_str_eq(crec2.mailbox_name, "Copies");
	ck_assert_uint_eq(crec2.next_uid, 200);
	casbox_msg_record_export(&rec.msg, m1);
	n = 101;
	array_foreach(&crec2.entries, entry) {
		ck_assert_uint_eq(entry->uid, n++);
		buffer_set_used_size(m2, 0);
		casbox_msg_record_export(&entry->msg, m2);
		ck_assert(buffer_cmp(m1, m2));
	}
	/* the recovery record an entry stands for: next UID above it */
	entry = array_idx(&crec2.entries, 199);
	casbox_copy_record_entry(&crec2, entry, pool, &rrec);
	ck_assert_uint_eq(rrec.uid, 300);
	ck_assert_uint_eq(rrec.next_uid, 301);
	ck_assert_uint_eq(rrec.uid_validity, rec.uid_validity);
	ck_assert_uint_eq(array_count(&rrec.blobs), 0);
	for (i = 0; i < buf->used; i++) {
		ck_assert_int_eq(casbox_copy_record_import(buf->data, i, pool,
							   &crec2, &error), -1);
	}
	/* a raw size the zstd frame does not declare */
	p[head + 4] ^= 0x01;
	ck_assert_int_eq(casbox_copy_record_import(buf->data, buf->used, pool,
						   &crec2, &error), -1);
	ck_assert_str_eq(error, "copy record: compressed body does not "
			 "declare its size");
	p[head + 4] ^= 0x01;
	p[head] = 2;
	ck_assert_int_eq(casbox_copy_record_import(buf->data, buf->used, pool,
						   &crec2, &error), -1);
	ck_assert_str_eq(error, "copy record: unknown compression 2");
	p[head] = 1;
	p[0] = 2;
	ck_assert_int_eq(casbox_copy_record_import(buf->data, buf->used, pool,
						   &crec2, &error), -1);
	ck_assert_str_eq(error, "copy record: unsupported version 2");
	p[0] = 1;

	/* no entry; a zero UID */
	casbox_copy_record_body_init(body);
	buffer_set_used_size(buf, 0);
	casbox_copy_record_export(&crec, body, buf);
	/* (4 bytes do not compress: stored as they are) */
	ck_assert_uint_eq(((const unsigned char *)buf->data)[head], 0);
	ck_assert_int_eq(casbox_copy_record_import(buf->data, buf->used, pool,
						   &crec2, &error), -1);
	ck_assert_str_eq(error, "copy record: no entry");
	casbox_copy_record_body_add(body, 0, &rec.msg);
	buffer_set_used_size(buf, 0);
	casbox_copy_record_export(&crec, body, buf);
	ck_assert_int_eq(casbox_copy_record_import(buf->data, buf->used, pool,
						   &crec2, &error), -1);
	ck_assert_str_eq(error, "copy record: zero UID");
	pool_unref(&pool);
}
END_TEST

/* Blob keys: round trip, every truncation, none at all. */
START_TEST(test_blob_keys)
{
	pool_t pool = pool_alloconly_create("test", 4096);
	struct casbox_recovery_record rec;
	struct casbox_blob_keys bkeys, bkeys2;
	buffer_t *buf = buffer_create_dynamic(pool, 512);
	const char *error = NULL;
	size_t i;

	fill_recovery(pool, &rec);
	i_zero(&bkeys);
	bkeys.written_usecs = 5;
	bkeys.blobs = rec.blobs;
	casbox_blob_keys_export(&bkeys, buf);
	ck_assert_int_eq(casbox_blob_keys_import(buf->data, buf->used, pool,
						 &bkeys2, &error), 1);
	ck_assert_uint_eq(bkeys2.written_usecs, 5);
	ck_assert_uint_eq(array_count(&bkeys2.blobs), 1);
	ck_assert(memcmp(array_front(&bkeys2.blobs), array_front(&rec.blobs),
			 sizeof(struct casbox_recovery_blob)) == 0);
	for (i = 0; i < buf->used; i++) {
		ck_assert_int_eq(casbox_blob_keys_import(buf->data, i, pool,
							 &bkeys2, &error), -1);
	}
	array_clear(&bkeys.blobs);
	buffer_set_used_size(buf, 0);
	casbox_blob_keys_export(&bkeys, buf);
	ck_assert_int_eq(casbox_blob_keys_import(buf->data, buf->used, pool,
						 &bkeys2, &error), -1);
	ck_assert_str_eq(error, "blob keys record: no blob");
	pool_unref(&pool);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("storage-records");
	TCase *tc = tcase_create("records");
	int failed;

	lib_init();
	tcase_add_test(tc, test_msg_roundtrip);
	tcase_add_test(tc, test_msg_truncations_fail);
	tcase_add_test(tc, test_msg_inconsistent_fail);
	tcase_add_test(tc, test_flags_record);
	tcase_add_test(tc, test_message_keys_sort_by_uid);
	tcase_add_test(tc, test_blob_and_mailbox_values);
	tcase_add_test(tc, test_mailbox_record_tail);
	tcase_add_test(tc, test_recovery_record);
	tcase_add_test(tc, test_recovery_record_v2);
	tcase_add_test(tc, test_recovery_mailbox);
	tcase_add_test(tc, test_recovery_record_v3);
	tcase_add_test(tc, test_copy_record);
	tcase_add_test(tc, test_blob_keys);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
