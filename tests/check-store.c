/* casbox-store: blob refcounts across save, copy, replace and expunge
   (checked in the LSM itself), byte-exact reassembly, rollback, and
   the key-file rules (missing key over data, wrong key). */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "str.h"
#include "unlink-directory.h"
#include "mail-types.h"
#include "casbox-lsm.h"
#include "casbox-settings.h"
#include "casbox-store.h"
#include "casbox-meta.h"
#include "casbox-records.h"
#include "message-part.h"
#include "message-part-serialize.h"
#include "casbox-store-rekey.h"
#include "casbox-pack.h"
#include "test-store-lsm.h"
#include "cas-durable.h"

#include <check.h>
#include "check-run.h"
#include "test-store-fixture.h"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>
#include <dirent.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <sodium.h>

static char test_dir[] = "/tmp/check-storage-store.XXXXXX";
static const char *root, *key_path;
static struct casbox_settings set;
static const guid_128_t box_guid = { 1, 2, 3, 4, 5, 6, 7, 8,
				     9, 10, 11, 12, 13, 14, 15, 16 };

static void setup(void)
{
	test_store_fixture_setup(test_dir, &root, &set);
	key_path = set.key_file;
}

static void teardown(void)
{
	test_store_fixture_teardown(test_dir);
}

/* casbox_store_open() must fail (the key is loaded before the LSM) */
static const char *store_open_error(void)
{
	struct casbox_store *store;
	const char *error = NULL;

	ck_assert_int_eq(casbox_store_open(root, &set, FSYNC_MODE_ALWAYS,
					   FILE_LOCK_METHOD_FCNTL, &store,
					   &error), -1);
	return error;
}

static struct casbox_store *store_open(void)
{
	return test_store_fixture_open(root, &set, FALSE);
}

/* Refcount of blob id as stored (0 = no record). */
static uint32_t blob_refcount(const struct cas_blob_id *id)
{
	struct casbox_blob_value val;

	return test_store_fixture_blob(root, &set, id, &val);
}

/* A record whose parts are the given strings. */
static void
make_record(struct casbox_store *store, pool_t pool, const char *const *parts,
	    struct casbox_msg_record *rec, struct istream ***inputs_r)
{
	struct casbox_msg_part *part;
	struct istream *input;
	unsigned int i, count = str_array_length(parts);
	const char *error;

	casbox_msg_record_init(pool, rec);
	rec->guid = "guid-1";
	*inputs_r = p_new(pool, struct istream *, count + 1);
	for (i = 0; i < count; i++) {
		part = array_append_space(&rec->parts);
		part->size = strlen(parts[i]);
		rec->physical_size += part->size;
		input = i_stream_create_from_data(parts[i], part->size);
		ck_assert_int_eq(casbox_store_blob_id(store, input, 0,
			part->size, &part->id, &error), 0);
		i_stream_seek(input, 0);
		(*inputs_r)[i] = input;
	}
	rec->virtual_size = rec->physical_size;
}

static void free_inputs(struct istream **inputs)
{
	for (; *inputs != NULL; inputs++)
		i_stream_unref(inputs);
}

static void
add_msg(struct casbox_store *store, uint32_t uid,
	const struct casbox_msg_record *rec, struct istream *const *inputs)
{
	struct casbox_store_txn *txn;
	const char *error = NULL;

	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	if (casbox_store_txn_add_msg(txn, box_guid, uid, rec, inputs,
				     &error) < 0)
		ck_abort_msg("add: %s", error);
	if (casbox_store_txn_commit(&txn, &error) < 0)
		ck_abort_msg("commit: %s", error);
}

static void expunge(struct casbox_store *store, uint32_t uid)
{
	test_store_fixture_expunge(store, box_guid, uid);
}

static const char *read_msg(struct casbox_store *store, uint32_t uid)
{
	return test_store_fixture_read(store, box_guid, uid);
}

static const char *part_a = "Subject: a\n\nshared attachment bytes, long";
static const char *part_b = "\nunique tail of message one\n";
static const char *part_c = "\nunique tail of message two\n";

START_TEST(test_refcounts)
{
	const char *const parts1[] = { part_a, part_b, NULL };
	const char *const parts2[] = { part_a, part_c, NULL };
	struct casbox_msg_record rec1, rec2;
	struct istream **in1, **in2;
	struct casbox_store *store = store_open();
	pool_t pool = pool_alloconly_create("test", 4096);
	const char *error = NULL;

	ck_assert_int_eq(casbox_store_open_keys(store, &error), 0);
	make_record(store, pool, parts1, &rec1, &in1);
	make_record(store, pool, parts2, &rec2, &in2);
	const struct casbox_msg_part *a = array_idx(&rec1.parts, 0);
	const struct casbox_msg_part *b = array_idx(&rec1.parts, 1);
	const struct casbox_msg_part *c = array_idx(&rec2.parts, 1);

	add_msg(store, 1, &rec1, in1);
	ck_assert_uint_eq(blob_refcount(&a->id), 1);
	ck_assert_uint_eq(blob_refcount(&b->id), 1);
	add_msg(store, 2, &rec2, in2);
	ck_assert_uint_eq(blob_refcount(&a->id), 2);
	ck_assert_uint_eq(blob_refcount(&c->id), 1);
	/* a copy needs no bytes */
	add_msg(store, 3, &rec1, NULL);
	ck_assert_uint_eq(blob_refcount(&a->id), 3);
	ck_assert_uint_eq(blob_refcount(&b->id), 2);
	ck_assert_str_eq(read_msg(store, 3), t_strconcat(part_a, part_b,
							  NULL));
	ck_assert_str_eq(read_msg(store, 2), t_strconcat(part_a, part_c,
							  NULL));
	/* replacing uid 3 (crash leftover) releases its old blobs */
	add_msg(store, 3, &rec2, NULL);
	ck_assert_uint_eq(blob_refcount(&b->id), 1);
	ck_assert_uint_eq(blob_refcount(&c->id), 2);

	expunge(store, 1);
	ck_assert_ptr_null(read_msg(store, 1));
	ck_assert_uint_eq(blob_refcount(&a->id), 2);
	ck_assert_uint_eq(blob_refcount(&b->id), 0);
	expunge(store, 1); /* again: no effect */
	ck_assert_uint_eq(blob_refcount(&a->id), 2);
	ck_assert_int_eq(casbox_store_mailbox_delete(store, box_guid,
						     &error), 0);
	ck_assert_uint_eq(blob_refcount(&a->id), 0);
	ck_assert_uint_eq(blob_refcount(&c->id), 0);
	ck_assert_ptr_null(read_msg(store, 2));

	free_inputs(in1);
	free_inputs(in2);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* What casbox_save_finished reports: per part written or deduplicated
   (within one message too), and the pack bytes appended. */
START_TEST(test_save_stats)
{
	static const char *part_d = "\nthe same part twice in one message\n";
	const char *const parts1[] = { part_a, part_b, NULL };
	const char *const parts2[] = { part_a, part_c, NULL };
	const char *const parts3[] = { part_d, part_d, NULL };
	struct casbox_msg_record rec1, rec2, rec3;
	struct istream **in1, **in2, **in3;
	struct casbox_store *store = store_open();
	struct casbox_store_stats st;
	pool_t pool = pool_alloconly_create("test", 4096);
	const char *error = NULL;
	uint64_t appended;

	ck_assert_int_eq(casbox_store_open_keys(store, &error), 0);
	make_record(store, pool, parts1, &rec1, &in1);
	make_record(store, pool, parts2, &rec2, &in2);
	make_record(store, pool, parts3, &rec3, &in3);
	ck_assert_uint_eq(casbox_store_get_pack_bytes_appended(store), 0);

	add_msg(store, 1, &rec1, in1);
	casbox_store_get_stats(store, &st);
	ck_assert_uint_eq(st.blobs_written, 2);
	ck_assert_uint_eq(st.written_bytes, strlen(part_a) + strlen(part_b));
	ck_assert_uint_eq(st.blobs_deduplicated, 0);
	/* two frames, each bigger than its (tiny) plaintext */
	appended = casbox_store_get_pack_bytes_appended(store);
	ck_assert_uint_gt(appended, st.written_bytes);

	add_msg(store, 2, &rec2, in2);
	casbox_store_get_stats(store, &st);
	ck_assert_uint_eq(st.blobs_written, 3);
	ck_assert_uint_eq(st.blobs_deduplicated, 1);
	ck_assert_uint_eq(st.deduplicated_bytes, strlen(part_a));

	/* a copy writes nothing (no recovery mailbox: no meta frame) */
	appended = casbox_store_get_pack_bytes_appended(store);
	add_msg(store, 3, &rec1, NULL);
	casbox_store_get_stats(store, &st);
	ck_assert_uint_eq(st.blobs_written, 3);
	ck_assert_uint_eq(st.blobs_deduplicated, 3);
	ck_assert_uint_eq(st.deduplicated_bytes,
			  2 * strlen(part_a) + strlen(part_b));
	ck_assert_uint_eq(casbox_store_get_pack_bytes_appended(store),
			  appended);

	/* the second copy of a part in the same message is a reference */
	add_msg(store, 4, &rec3, in3);
	casbox_store_get_stats(store, &st);
	ck_assert_uint_eq(st.blobs_written, 4);
	ck_assert_uint_eq(st.blobs_deduplicated, 4);
	ck_assert_uint_eq(st.written_bytes, strlen(part_a) + strlen(part_b) +
			  strlen(part_c) + strlen(part_d));
	ck_assert_uint_gt(casbox_store_get_pack_bytes_appended(store),
			  appended);

	free_inputs(in1);
	free_inputs(in2);
	free_inputs(in3);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

START_TEST(test_rollback_and_missing_blob)
{
	const char *const parts1[] = { part_a, part_b, NULL };
	struct casbox_msg_record rec1;
	struct casbox_store_txn *txn;
	struct istream **in1;
	struct casbox_store *store = store_open();
	pool_t pool = pool_alloconly_create("test", 4096);
	const char *error = NULL;

	ck_assert_int_eq(casbox_store_open_keys(store, &error), 0);
	make_record(store, pool, parts1, &rec1, &in1);
	/* a copy of bytes that are not stored fails */
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	ck_assert_int_eq(casbox_store_txn_add_msg(txn, box_guid, 1, &rec1,
						  NULL, &error), -1);
	ck_assert(strstr(error, "not in the store") != NULL);
	casbox_store_txn_rollback(&txn);
	/* rolled back: nothing visible */
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	ck_assert_int_eq(casbox_store_txn_add_msg(txn, box_guid, 1, &rec1,
						  in1, &error), 0);
	casbox_store_txn_rollback(&txn);
	ck_assert_ptr_null(read_msg(store, 1));
	const struct casbox_msg_part *a = array_idx(&rec1.parts, 0);
	ck_assert_uint_eq(blob_refcount(&a->id), 0);
	free_inputs(in1);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* Bytes in the LSM's WAL files now. */
static uoff_t wal_bytes(void)
{
	const char *dir = t_strconcat(root, "/lsm", NULL);
	struct dirent *d;
	struct stat st;
	uoff_t total = 0;
	DIR *dirp = opendir(dir);

	ck_assert_ptr_nonnull(dirp);
	while ((d = readdir(dirp)) != NULL) {
		size_t len = strlen(d->d_name);

		if (len < 4 || strcmp(d->d_name + len - 4, ".wal") != 0)
			continue;
		ck_assert_int_eq(stat(t_strconcat(dir, "/", d->d_name, NULL),
				      &st), 0);
		total += st.st_size;
	}
	ck_assert_int_eq(closedir(dirp), 0);
	return total;
}

START_TEST(test_flags_mirror)
{
	uoff_t wal;
	const char *const parts1[] = { part_a, NULL };
	const char *const keywords[] = { "$Label1", "Junk", NULL };
	struct casbox_msg_record rec1, rec;
	struct casbox_store_txn *txn;
	struct istream **in1;
	struct casbox_store *store = store_open();
	pool_t pool = pool_alloconly_create("test", 4096);
	const char *error = NULL;

	ck_assert_int_eq(casbox_store_open_keys(store, &error), 0);
	make_record(store, pool, parts1, &rec1, &in1);
	add_msg(store, 7, &rec1, in1);
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	ck_assert_int_eq(casbox_store_txn_update_flags(txn, box_guid, 7,
		MAIL_SEEN | MAIL_FLAGGED, keywords, 42, &error), 0);
	/* a missing record is not an error (expunged meanwhile) */
	ck_assert_int_eq(casbox_store_txn_update_flags(txn, box_guid, 8,
		MAIL_SEEN, NULL, 43, &error), 0);
	ck_assert_int_eq(casbox_store_txn_commit(&txn, &error), 0);

	ck_assert_int_eq(casbox_store_msg_lookup(store, box_guid, 7, pool,
						 &rec, &error), 1);
	ck_assert_uint_eq(rec.flags, MAIL_SEEN | MAIL_FLAGGED);
	ck_assert_uint_eq(rec.modseq, 42);
	ck_assert_uint_eq(array_count(&rec.keywords), 2);
	ck_assert_str_eq(array_idx_elem(&rec.keywords, 1), "Junk");
	/* the bytes are untouched */
	ck_assert_str_eq(read_msg(store, 7), part_a);
	ck_assert_int_eq(casbox_store_msg_lookup(store, box_guid, 8, pool,
						 &rec, &error), 0);

	/* a flag change writes a few dozen bytes, not the message record */
	wal = wal_bytes();
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	ck_assert_int_eq(casbox_store_txn_update_flags(txn, box_guid, 7,
		MAIL_SEEN, keywords, 44, &error), 0);
	ck_assert_int_eq(casbox_store_txn_commit(&txn, &error), 0);
	ck_assert_uint_gt(wal_bytes(), wal);
	/* issue 15's target; the sealed WAL record adds 33 bytes (nonce,
	   tag, compression byte) */
	ck_assert_uint_le(wal_bytes() - wal, 128);
	/* the expunge takes the flag record too: a message saved again
	   under that UID (a save interrupted before the index commit)
	   has its own flags */
	expunge(store, 7);
	free_inputs(in1);
	make_record(store, pool, parts1, &rec1, &in1);
	rec1.flags = MAIL_DRAFT;
	add_msg(store, 7, &rec1, in1);
	ck_assert_int_eq(casbox_store_msg_lookup(store, box_guid, 7, pool,
						 &rec, &error), 1);
	ck_assert_uint_eq(rec.flags, MAIL_DRAFT);
	ck_assert_uint_eq(array_count(&rec.keywords), 0);
	free_inputs(in1);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* A format-1 (plaintext) LSM, as stores from before sealing have it:
   its 'K' record (32-bit key id) is checked before anything else, a
   mismatch refused naming the key file; with the right id the store
   opens and is resealed in place, the records intact. */
static void v1_lsm_write_key_id(uint32_t key_id)
{
	struct casbox_lsm_settings lsm_set;
	struct casbox_lsm_batch *batch;
	struct casbox_lsm *lsm;
	unsigned char kval[5], kkey = CASBOX_KEY_KEYRING;
	const char *error;

	i_zero(&lsm_set);
	lsm_set.dir = t_strconcat(root, "/lsm", NULL);
	lsm_set.lock_method = FILE_LOCK_METHOD_FCNTL;
	ck_assert_int_eq(casbox_lsm_open(&lsm_set, &lsm, &error), 1);
	ck_assert(!casbox_lsm_is_sealed(lsm));
	kval[0] = CASBOX_RECORD_VERSION;
	kval[1] = key_id >> 24; kval[2] = key_id >> 16;
	kval[3] = key_id >> 8; kval[4] = key_id;
	ck_assert_int_eq(casbox_lsm_batch_begin(lsm, &batch, &error), 1);
	casbox_lsm_batch_put(batch, &kkey, 1, kval, sizeof(kval));
	casbox_lsm_batch_put(batch, "x-plain", 7, "INBOX-plaintext", 15);
	ck_assert_int_eq(casbox_lsm_batch_commit(&batch, &error), 1);
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
	casbox_lsm_close(&lsm);
}

START_TEST(test_v1_key_record)
{
	struct casbox_lsm_info info;
	struct casbox_store *store;
	struct cas_keyring *kr;
	struct casbox_lsm *lsm;
	buffer_t *value = t_buffer_create(32);
	const char *error;
	uint32_t key_id;

	ck_assert_int_eq(cas_keyring_create(key_path, &kr, &error), 1);
	key_id = cas_keyring_key_id(kr);
	cas_keyring_free(&kr);

	v1_lsm_write_key_id(key_id ^ 1);
	error = store_open_error();
	ck_assert_msg(strstr(error, "is not the key of store") != NULL &&
		      strstr(error, key_path) != NULL, "error: %s", error);
	/* refused before anything was rewritten */
	ck_assert_int_eq(casbox_lsm_peek(t_strconcat(root, "/lsm", NULL),
					 &info, &error), 1);
	ck_assert(!info.sealed);

	v1_lsm_write_key_id(key_id);
	store = store_open();
	casbox_store_close(&store);
	ck_assert_int_eq(casbox_lsm_peek(t_strconcat(root, "/lsm", NULL),
					 &info, &error), 1);
	ck_assert(info.sealed);
	ck_assert_uint_eq(info.tables, 1);
	ck_assert_uint_eq(info.wal_record_bytes, 0);
	if (test_store_lsm_open_set(root, &set, FALSE, &lsm, &error) < 0)
		ck_abort_msg("lsm open: %s", error);
	ck_assert_int_eq(casbox_lsm_get(lsm, "x-plain", 7, value, &error), 1);
	ck_assert_int_eq(value->used, 15);
	ck_assert(memcmp(value->data, "INBOX-plaintext", 15) == 0);
	test_store_lsm_close(&lsm);
}
END_TEST

START_TEST(test_key_rules)
{
	const char *const parts1[] = { part_a, NULL };
	struct casbox_msg_record rec1;
	struct istream **in1;
	struct casbox_store *store;
	pool_t pool = pool_alloconly_create("test", 4096);
	const char *moved = t_strconcat(key_path, ".moved", NULL);
	const char *error = NULL;
	bool have_data;

	/* no key and an empty store without autocreate: refused when the
	   store is opened (its LSM is sealed with the key) */
	set.key_autocreate = FALSE;
	error = store_open_error();
	ck_assert(strstr(error, key_path) != NULL);
	ck_assert_int_eq(access(t_strconcat(root, "/lsm", NULL), F_OK), -1);
	set.key_autocreate = TRUE;
	store = store_open();
	ck_assert_int_eq(casbox_store_open_keys(store, &error), 0);
	make_record(store, pool, parts1, &rec1, &in1);
	add_msg(store, 1, &rec1, in1);
	casbox_store_close(&store);

	/* key gone, store has data: refused, nothing created; the "has
	   data" rule works without the key */
	ck_assert_int_eq(rename(key_path, moved), 0);
	casbox_store_open_nolsm(root, &set, FSYNC_MODE_ALWAYS,
				FILE_LOCK_METHOD_FCNTL, &store);
	ck_assert_int_eq(casbox_store_has_data(store, &have_data, &error), 0);
	ck_assert(have_data);
	casbox_store_close(&store);
	error = store_open_error();
	ck_assert(strstr(error, key_path) != NULL);
	ck_assert(strstr(error, "refusing") != NULL);
	ck_assert_int_eq(access(key_path, F_OK), -1);

	/* another key: refused by the fingerprint in the LSM's MANIFEST */
	set.key_autocreate = TRUE;
	{
		struct cas_keyring *other;
		ck_assert_int_eq(cas_keyring_create(key_path, &other,
						    &error), 1);
		cas_keyring_free(&other);
	}
	error = store_open_error();
	ck_assert_msg(strstr(error, "is not the key of store") != NULL &&
		      strstr(error, key_path) != NULL &&
		      strstr(error, "fingerprint") != NULL, "error: %s", error);
	ck_assert_int_eq(unlink(key_path), 0);

	/* the right key again: readable */
	ck_assert_int_eq(rename(moved, key_path), 0);
	store = store_open();
	ck_assert_str_eq(read_msg(store, 1), part_a);
	free_inputs(in1);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* Sealed metadata opens only with the same key and the same parts; a
   flipped byte anywhere fails it, never yields other metadata. */
START_TEST(test_meta_seal)
{
	static const unsigned char kek[CAS_KEK_SIZE] = { 1, 2, 3 };
	static const unsigned char kek2[CAS_KEK_SIZE] = { 4, 5, 6 };
	struct cas_keyring *keyring = cas_keyring_create_from_kek(kek);
	struct cas_keyring *other = cas_keyring_create_from_kek(kek2);
	pool_t pool = pool_alloconly_create("test", 4096);
	struct casbox_msg_record rec, rec2;
	struct casbox_msg_part *part;
	struct casbox_msg_meta meta;
	struct message_part root, *parts;
	unsigned char *copy;
	const char *error;
	char *big;
	size_t i;

	casbox_msg_record_init(pool, &rec);
	part = array_append_space(&rec.parts);
	memset(part->id.id, 7, sizeof(part->id.id));
	part->size = 10;
	i_zero(&root);
	root.header_size.physical_size = 4;
	root.header_size.virtual_size = 5;
	root.body_size.physical_size = 6;
	root.body_size.virtual_size = 7;
	root.body_size.lines = 1;
	ck_assert_int_eq(casbox_meta_open(keyring, &rec, pool, &meta,
					  &error), 0);
	i_zero(&meta);
	meta.bodystructure = "(\"text\" \"plain\")";
	meta.body = "(BODY)";
	meta.envelope = "(ENV)";
	ck_assert_int_eq(casbox_meta_seal(keyring, &rec, &meta, &root, pool,
					 &error), 0);
	ck_assert_uint_gt(rec.sealed_meta_size, 0);
	ck_assert_int_eq(casbox_meta_open(keyring, &rec, pool, &meta,
					  &error), 1);
	ck_assert_str_eq(meta.bodystructure, "(\"text\" \"plain\")");
	/* version 2 keeps no BODY: the glue derives it */
	ck_assert_ptr_null(meta.body);
	ck_assert_str_eq(meta.envelope, "(ENV)");
	parts = casbox_meta_get_parts(&meta, pool, &error);
	ck_assert_ptr_nonnull(parts);
	ck_assert_uint_eq(parts->body_size.virtual_size, 7);
	ck_assert_uint_eq(parts->header_size.physical_size, 4);

	ck_assert_int_eq(casbox_meta_open(other, &rec, pool, &meta,
					  &error), -1);
	rec2 = rec;
	p_array_init(&rec2.parts, pool, 1);
	part = array_append_space(&rec2.parts);
	memset(part->id.id, 8, sizeof(part->id.id));
	part->size = 10;
	ck_assert_int_eq(casbox_meta_open(keyring, &rec2, pool, &meta,
					  &error), -1);
	rec2 = rec;
	copy = p_memdup(pool, rec.sealed_meta, rec.sealed_meta_size);
	rec2.sealed_meta = copy;
	for (i = 0; i < rec.sealed_meta_size; i++) {
		copy[i] ^= 0x01;
		ck_assert_int_eq(casbox_meta_open(keyring, &rec2, pool,
						  &meta, &error), -1);
		copy[i] ^= 0x01;
	}
	/* nothing readable in the sealed bytes */
	for (i = 0; i + 5 <= rec.sealed_meta_size; i++)
		ck_assert(memcmp(rec.sealed_meta + i, "plain", 5) != 0);

	/* metadata over the bound (before compression) is not sealed and
	   the record keeps what it had (a huge header parameter) */
	big = i_malloc(CASBOX_META_MAX_PLAIN_SIZE + 1);
	memset(big, 'x', CASBOX_META_MAX_PLAIN_SIZE);
	i_zero(&meta);
	meta.bodystructure = big;
	meta.envelope = "(ENV)";
	rec2 = rec;
	ck_assert_int_eq(casbox_meta_seal(keyring, &rec2, &meta, &root, pool,
					 &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "over the limit"));
	ck_assert_ptr_eq(rec2.sealed_meta, rec.sealed_meta);
	ck_assert_uint_eq(rec2.sealed_meta_size, rec.sealed_meta_size);
	i_free(big);
	pool_unref(&pool);
	cas_keyring_free(&keyring);
	cas_keyring_free(&other);
}
END_TEST

/* The AAD casbox-meta.c binds sealed metadata to: "casbox-msg-meta" |
   each part's blob id | u64 size (doc/casbox-storage.md). */
static void meta_aad(const struct casbox_msg_record *rec, buffer_t *aad)
{
	const struct casbox_msg_part *part;
	unsigned char size_be[8];

	buffer_append(aad, "casbox-msg-meta", 15);
	array_foreach(&rec->parts, part) {
		buffer_append(aad, part->id.id, sizeof(part->id.id));
		cpu64_to_be_unaligned(part->size, size_be);
		buffer_append(aad, size_be, sizeof(size_be));
	}
}

static void meta_wr(buffer_t *dest, const void *data, size_t size)
{
	unsigned char be[4];

	cpu32_to_be_unaligned(size, be);
	buffer_append(dest, be, sizeof(be));
	buffer_append(dest, data, size);
}

/* Seal plaintext as casbox-meta.c would, for rec. */
static void meta_seal_plain(const struct cas_keyring *keyring,
			    struct casbox_msg_record *rec, pool_t pool,
			    const buffer_t *plain)
{
	buffer_t *aad = t_buffer_create(64);
	buffer_t *sealed = buffer_create_dynamic(pool, plain->used + 64);

	meta_aad(rec, aad);
	cas_record_seal(keyring, aad->data, aad->used, plain->data,
			plain->used, sealed);
	rec->sealed_meta = sealed->data;
	rec->sealed_meta_size = sealed->used;
}

/* Records sealed by a build before metadata version 2 (plain fields,
   BODY included) still open, BODY and all. */
START_TEST(test_meta_v1_readable)
{
	static const unsigned char kek[CAS_KEK_SIZE] = { 9, 8, 7 };
	struct cas_keyring *keyring = cas_keyring_create_from_kek(kek);
	pool_t pool = pool_alloconly_create("test", 4096);
	struct casbox_msg_record rec;
	struct casbox_msg_part *part;
	struct casbox_msg_meta meta;
	struct message_part root;
	buffer_t *plain = t_buffer_create(256), *tree = t_buffer_create(64);
	const char *error;

	casbox_msg_record_init(pool, &rec);
	part = array_append_space(&rec.parts);
	memset(part->id.id, 3, sizeof(part->id.id));
	part->size = 99;
	i_zero(&root);
	root.body_size.virtual_size = 42;
	message_part_serialize(&root, tree);
	buffer_append_c(plain, 1);
	meta_wr(plain, "(\"text\" \"plain\" NIL)", 21);
	meta_wr(plain, "(\"text\")", 8);
	meta_wr(plain, "(\"env\")", 7);
	meta_wr(plain, tree->data, tree->used);
	meta_seal_plain(keyring, &rec, pool, plain);
	ck_assert_int_eq(casbox_meta_open(keyring, &rec, pool, &meta,
					  &error), 1);
	ck_assert_str_eq(meta.bodystructure, "(\"text\" \"plain\" NIL)");
	ck_assert_str_eq(meta.body, "(\"text\")");
	ck_assert_str_eq(meta.envelope, "(\"env\")");
	ck_assert_uint_eq(casbox_meta_get_parts(&meta, pool, &error)->
			  body_size.virtual_size, 42);
	pool_unref(&pool);
	cas_keyring_free(&keyring);
}
END_TEST

/* Version 2 plaintexts that authenticate but lie (a key holder's bug or
   a hostile writer with the key): each is refused with a reason, none
   is read past its end or half used. */
START_TEST(test_meta_v2_hostile)
{
	static const unsigned char kek[CAS_KEK_SIZE] = { 5, 5, 5 };
	struct cas_keyring *keyring = cas_keyring_create_from_kek(kek);
	pool_t pool = pool_alloconly_create("test", 8192);
	struct casbox_msg_record rec, good;
	struct casbox_msg_part *part;
	struct casbox_msg_meta meta;
	struct message_part root;
	buffer_t *aad = t_buffer_create(64), *plain = t_buffer_create(512);
	buffer_t *bad;
	const char *error;
	unsigned char *p;
	unsigned int i;

	casbox_msg_record_init(pool, &rec);
	part = array_append_space(&rec.parts);
	memset(part->id.id, 4, sizeof(part->id.id));
	part->size = 7;
	i_zero(&root);
	i_zero(&meta);
	meta.bodystructure = "(\"text\" \"plain\" (\"charset\" \"us-ascii\") "
		"NIL NIL \"7bit\" 7 1 NIL NIL NIL NIL)";
	meta.envelope = "(\"Mon, 1 Jan 2024 00:00:00 +0000\" \"hi\" NIL NIL "
		"NIL NIL NIL NIL NIL \"<a@b>\")";
	ck_assert_int_eq(casbox_meta_seal(keyring, &rec, &meta, &root, pool,
					 &error), 0);
	good = rec;
	meta_aad(&rec, aad);
	ck_assert_int_eq(cas_record_open(keyring, aad->data, aad->used,
		rec.sealed_meta, rec.sealed_meta_size, plain, &error), 1);
	ck_assert_uint_eq(((const unsigned char *)plain->data)[0], 2);

	for (i = 0; i < 7; i++) {
		bad = t_buffer_create(plain->used + 16);
		buffer_append_buf(bad, plain, 0, SIZE_MAX);
		p = buffer_get_modifiable_data(bad, NULL);
		switch (i) {
		case 0: /* raw size one more than the frame holds */
			cpu32_to_be_unaligned(be32_to_cpu_unaligned(p + 1) + 1,
					      p + 1);
			break;
		case 1: /* raw size over the bound */
			cpu32_to_be_unaligned(CASBOX_META_MAX_PLAIN_SIZE + 1,
					      p + 1);
			break;
		case 2: /* a byte after the frame */
			buffer_append_c(bad, 0);
			break;
		case 3: /* frame cut short */
			buffer_set_used_size(bad, bad->used - 3);
			break;
		case 4: /* only the version and half a size */
			buffer_set_used_size(bad, 3);
			break;
		case 5: /* the frame's compressed bytes garbled */
			memset(p + 5 + 6, 0xff, bad->used - 5 - 6);
			break;
		case 6: /* unknown version */
			p[0] = 3;
			break;
		}
		rec = good;
		meta_seal_plain(keyring, &rec, pool, bad);
		error = NULL;
		ck_assert_msg(casbox_meta_open(keyring, &rec, pool, &meta,
					       &error) == -1, "case %u", i);
		ck_assert_ptr_nonnull(error);
	}
	pool_unref(&pool);
	cas_keyring_free(&keyring);
}
END_TEST

static struct casbox_lsm *lsm_open(void)
{
	struct casbox_lsm *lsm;
	const char *error = NULL;

	if (test_store_lsm_open_set(root, &set, TRUE, &lsm, &error) < 0)
		ck_abort_msg("lsm open: %s", error);
	return lsm;
}

/* The blob record of id as stored. */
static void blob_record(struct casbox_lsm *lsm, const struct cas_blob_id *id,
			struct casbox_blob_value *val_r,
			struct casbox_blob_record *rec_r)
{
	buffer_t *key = t_buffer_create(40), *value = t_buffer_create(128);
	const char *error = NULL;

	ck_assert_int_eq(casbox_lsm_refresh(lsm, &error), 1);
	casbox_key_blob(key, id);
	ck_assert_int_eq(casbox_lsm_get(lsm, key->data, key->used, value,
					&error), 1);
	ck_assert_int_eq(casbox_blob_value_import(value->data, value->used,
						  val_r, &error), 1);
	ck_assert_int_eq(casbox_blob_record_import(val_r->pack_record,
		val_r->pack_record_size, rec_r, &error), 1);
	/* the caller may keep rec_r only: pack_record points into value */
	val_r->pack_record = NULL;
}

static uint32_t blob_key_id(struct casbox_lsm *lsm,
			    const struct cas_blob_id *id)
{
	struct casbox_blob_value val;
	struct casbox_blob_record rec;

	blob_record(lsm, id, &val, &rec);
	return cas_dek_wrapped_key_id(rec.wrapped_dek);
}

static struct casbox_pack_store *packs_open(struct cas_keyring *kr)
{
	struct casbox_pack_settings pack_set;
	struct casbox_pack_store *packs;
	const char *error = NULL;

	i_zero(&pack_set);
	pack_set.dir = t_strconcat(root, "/packs", NULL);
	pack_set.fsync = TRUE;
	ck_assert_int_eq(casbox_pack_store_open(&pack_set, kr, &packs,
						&error), 1);
	return packs;
}

/* Every DEK update in the packs that names new_id must carry exactly the
   wrap the LSM blob record holds now, and unwrap with kr. Returns how
   many there are. */
static unsigned int dek_updates_check(struct cas_keyring *kr,
				      struct casbox_lsm *lsm, uint32_t new_id)
{
	struct casbox_pack_store *packs = packs_open(kr);
	struct casbox_pack_scan *scan;
	struct casbox_pack_frame_info info;
	struct casbox_dek_update upd;
	struct casbox_blob_value val;
	struct casbox_blob_record rec;
	enum casbox_meta_kind kind;
	unsigned char dek[CAS_DEK_SIZE];
	buffer_t *sealed = t_buffer_create(256), *plain = t_buffer_create(256);
	const char *error = NULL;
	unsigned int count = 0;

	scan = casbox_pack_scan_init(packs);
	while (casbox_pack_scan_next(scan, &info)) {
		ck_assert_ptr_null(info.damage);
		if (info.meta_kind != CASBOX_META_KIND_DEK_UPDATE)
			continue;
		buffer_set_used_size(sealed, 0);
		buffer_set_used_size(plain, 0);
		ck_assert_int_eq(casbox_pack_meta_read(packs, info.pack_id,
			info.offset, &kind, sealed, &error), 1);
		ck_assert_int_eq(casbox_pack_meta_open(packs, kind,
			sealed->data, sealed->used, plain, &error), 1);
		ck_assert_int_eq(casbox_dek_update_import(plain->data,
			plain->used, &upd, &error), 1);
		if (cas_dek_wrapped_key_id(upd.wrapped_dek) != new_id)
			continue;
		blob_record(lsm, &upd.id, &val, &rec);
		ck_assert_mem_eq(upd.wrapped_dek, rec.wrapped_dek,
				 CAS_WRAPPED_DEK_SIZE);
		ck_assert_int_eq(cas_dek_unwrap(kr, &upd.id, upd.wrapped_dek,
						dek, &error), 1);
		sodium_memzero(dek, sizeof(dek));
		count++;
	}
	ck_assert_int_eq(casbox_pack_scan_deinit(&scan, &error), 0);
	casbox_pack_store_close(&packs);
	return count;
}

struct rekey_seen {
	struct casbox_lsm *lsm;
	uint32_t old_id, new_id;
	unsigned int calls;
};

static void rekey_callback(void *context, struct casbox_lsm_batch *batch,
			   const struct cas_blob_id *id ATTR_UNUSED,
			   const unsigned char *old_wrapped,
			   const unsigned char *new_wrapped)
{
	struct rekey_seen *seen = context;

	ck_assert_ptr_nonnull(batch);
	ck_assert_uint_eq(cas_dek_wrapped_key_id(old_wrapped), seen->old_id);
	ck_assert_uint_eq(cas_dek_wrapped_key_id(new_wrapped), seen->new_id);
	seen->calls++;
}

/* Key rotation's walk: a writer whose key ring predates the rotation
   wraps new blobs with the new slot, steps rewrap at most max records
   each and resume from their position, a damaged record is left and
   counted, refcounts and bytes do not change. */
START_TEST(test_rekey_walk)
{
	static const char *const bodies[] = {
		"\none\n", "\ntwo\n", "\nthree\n", "\nfour\n", "\nfive\n",
		"\nsix\n", "\nseven\n",
	};
	struct casbox_store *store = store_open(), *store2;
	struct casbox_msg_record recs[N_ELEMENTS(bodies) + 1];
	struct istream **inputs;
	struct cas_keyring *kr;
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	struct casbox_blob_value val;
	struct casbox_blob_record brec;
	struct casbox_rekey_stats stats;
	struct casbox_pack_store *packs;
	struct rekey_seen seen;
	const struct casbox_msg_part *part;
	pool_t pool = pool_alloconly_create("test", 8192);
	buffer_t *pos, *key, *value, *prec;
	const char *error = NULL;
	uint32_t old_id, new_id;
	uint64_t left, foreign;
	unsigned int i, steps;
	int ret;

	ck_assert_int_eq(casbox_store_open_keys(store, &error), 0);
	for (i = 0; i < N_ELEMENTS(bodies); i++) {
		const char *parts[] = { part_a, bodies[i], NULL };

		make_record(store, pool, parts, &recs[i], &inputs);
		add_msg(store, i + 1, &recs[i], inputs);
		free_inputs(inputs);
	}
	/* 8 blobs: part_a (refcount 7) and one per body */
	lsm = lsm_open();
	part = array_idx(&recs[0].parts, 0);
	ck_assert_uint_eq(blob_refcount(&part->id), 7);

	/* what doveadm does first: a new current slot, saved */
	ck_assert_int_eq(cas_keyring_load(key_path, &kr, &error), 1);
	old_id = cas_keyring_wrap_key_id(kr);
	cas_keyring_rotate_add(kr);
	new_id = cas_keyring_wrap_key_id(kr);
	ck_assert_int_eq(cas_keyring_save(kr, key_path, &error), 1);
	packs = packs_open(kr);

	/* store's key ring was loaded before: its next new blob must still
	   be wrapped with the new slot */
	{
		const char *parts[] = { part_a, "\nsaved mid-rotation\n",
					NULL };

		make_record(store, pool, parts, &recs[7], &inputs);
		add_msg(store, 8, &recs[7], inputs);
		free_inputs(inputs);
	}
	part = array_idx(&recs[7].parts, 1);
	ck_assert_uint_eq(blob_key_id(lsm, &part->id), new_id);
	part = array_idx(&recs[7].parts, 0);
	ck_assert_uint_eq(blob_key_id(lsm, &part->id), old_id);
	ck_assert_uint_eq(blob_refcount(&part->id), 8);

	/* damage one record's wrapped DEK (its tag) */
	part = array_idx(&recs[6].parts, 1);
	blob_record(lsm, &part->id, &val, &brec);
	brec.wrapped_dek[CAS_WRAPPED_DEK_SIZE - 1] ^= 0x01;
	prec = t_buffer_create(128);
	casbox_blob_record_export(&brec, prec);
	val.pack_record = prec->data;
	val.pack_record_size = prec->used;
	key = t_buffer_create(40);
	value = t_buffer_create(128);
	casbox_key_blob(key, &part->id);
	casbox_blob_value_export(&val, value);
	ck_assert_int_eq(casbox_lsm_batch_begin(lsm, &batch, &error), 1);
	casbox_lsm_batch_put(batch, key->data, key->used, value->data,
			     value->used);
	/* and a malformed 'b' record with a long key: skipped, counted */
	buffer_set_used_size(key, 0);
	buffer_append_c(key, CASBOX_KEY_BLOB);
	for (i = 0; i < 200; i++)
		buffer_append_c(key, 0xff);
	casbox_lsm_batch_put(batch, key->data, key->used, "junk", 4);
	ck_assert_int_eq(casbox_lsm_batch_commit(&batch, &error), 1);

	ck_assert_int_eq(casbox_rekey_count(lsm, kr, old_id, &left, &foreign,
					    &error), 0);
	ck_assert_uint_eq(left, 8);
	ck_assert_uint_eq(foreign, 0);

	/* walk two records per step; the first step twice from the same
	   position changes nothing the second time */
	i_zero(&stats);
	i_zero(&seen);
	seen.old_id = old_id;
	seen.new_id = new_id;
	pos = t_buffer_create(40);
	steps = 0;
	do {
		uint64_t before = stats.rewrapped;

		ret = casbox_rekey_step(lsm, packs, kr, old_id, 2, pos,
					rekey_callback, &seen, &stats,
					&error);
		ck_assert_int_ge(ret, 0);
		ck_assert_uint_le(stats.rewrapped - before, 2);
		steps++;
	} while (ret > 0);
	ck_assert_uint_eq(stats.rewrapped, 7);
	ck_assert_uint_eq(stats.failed, 1);
	ck_assert_uint_eq(stats.bad_records, 1);
	ck_assert_uint_eq(stats.examined, 10);
	ck_assert_uint_eq(seen.calls, 7);
	ck_assert_uint_ge(steps, 4);
	/* a second walk finds only the damaged record */
	buffer_set_used_size(pos, 0);
	i_zero(&stats);
	ck_assert_int_eq(casbox_rekey_step(lsm, packs, kr, old_id, 100, pos,
					   NULL, NULL, &stats, &error), 0);
	ck_assert_uint_eq(stats.rewrapped, 0);
	ck_assert_uint_eq(stats.failed, 1);
	ck_assert_int_eq(casbox_rekey_count(lsm, kr, old_id, &left, &foreign,
					    &error), 0);
	ck_assert_uint_eq(left, 1);
	/* the packs carry each new wrap (rebuild --from-packs once the old
	   slot is gone): one DEK update per rewrapped record, none for the
	   damaged one, none from the step that had nothing to do */
	ck_assert_uint_eq(dek_updates_check(kr, lsm, new_id), 7);
	casbox_pack_store_close(&packs);

	/* refcounts kept; every undamaged message reads back through a
	   store that only knows the new slot */
	part = array_idx(&recs[0].parts, 0);
	ck_assert_uint_eq(blob_refcount(&part->id), 8);
	ck_assert_uint_eq(blob_key_id(lsm, &part->id), new_id);
	test_store_reseal_all(root, &set);
	cas_keyring_rotate_finish(kr);
	ck_assert_int_eq(cas_keyring_save(kr, key_path, &error), 1);
	store2 = store_open();
	for (i = 0; i < 6; i++) {
		ck_assert_str_eq(read_msg(store2, i + 1),
				 t_strconcat(part_a, bodies[i], NULL));
	}
	ck_assert_str_eq(read_msg(store2, 8),
			 t_strconcat(part_a, "\nsaved mid-rotation\n", NULL));
	/* the old store still reads too (it keeps the slot it had) */
	ck_assert_str_eq(read_msg(store, 1),
			 t_strconcat(part_a, bodies[0], NULL));

	test_store_lsm_close(&lsm);
	cas_keyring_free(&kr);
	casbox_store_close(&store2);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* Is pid waiting for a POSIX lock (a "->" line of /proc/locks)? */
static bool pid_waits_for_lock(pid_t pid)
{
	char line[256], *p;
	bool found = FALSE;
	FILE *f = fopen("/proc/locks", "r");

	ck_assert_ptr_nonnull(f);
	while (!found && fgets(line, sizeof(line), f) != NULL) {
		if (strstr(line, "->") == NULL)
			continue;
		/* "N: -> POSIX ADVISORY WRITE <pid> ..." */
		p = strstr(line, "WRITE ");
		if (p == NULL)
			p = strstr(line, "READ ");
		if (p != NULL && atoi(strchr(p, ' ') + 1) == pid)
			found = TRUE;
	}
	(void)fclose(f);
	return found;
}

/* Or does pid sleep in futex() on the LSM's shared lock page (the
   write lock is a robust mutex mapped from <lsm>/LOCK, see
   casbox-lsm-shm.c)? /proc/pid/syscall names the call a blocked
   process is in and its first argument, the futex address. */
static bool pid_waits_for_shared_lock(pid_t pid)
{
	char path[64], line[512];
	unsigned long nr, addr, start, end;
	bool found = FALSE;
	FILE *f;

	i_snprintf(path, sizeof(path), "/proc/%d/syscall", pid);
	f = fopen(path, "r");
	if (f == NULL)
		return FALSE;
	if (fgets(line, sizeof(line), f) == NULL ||
	    sscanf(line, "%lu %lx", &nr, &addr) != 2 || nr != SYS_futex) {
		(void)fclose(f);
		return FALSE;
	}
	(void)fclose(f);
	i_snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	while (!found && fgets(line, sizeof(line), f) != NULL) {
		if (strstr(line, "/LOCK") != NULL &&
		    sscanf(line, "%lx-%lx", &start, &end) == 2 &&
		    addr >= start && addr < end)
			found = TRUE;
	}
	(void)fclose(f);
	return found;
}

static void wait_child_ok(pid_t pid)
{
	int status;

	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFEXITED(status));
	ck_assert_int_eq(WEXITSTATUS(status), 0);
}

/* The race the lock settles: a save reads a blob record (old wrapped
   DEK) and commits later; a rotation step wants to rewrap that record
   meanwhile. The step waits for the save's lock, so the save's
   refcount change survives and the step then rewraps what the save
   wrote. Processes, not threads: the LSM lock is per process. */
START_TEST(test_rekey_waits_for_save)
{
	const char *const parts[] = { part_a, "\nraced\n", NULL };
	struct casbox_store *store = store_open();
	struct casbox_msg_record rec;
	struct istream **inputs;
	struct cas_keyring *kr;
	struct casbox_lsm *lsm;
	const struct casbox_msg_part *a;
	pool_t pool = pool_alloconly_create("test", 4096);
	int ready[2], go[2];
	const char *error = NULL;
	uint32_t old_id, new_id;
	pid_t saver, rotator;
	char c;

	ck_assert_int_eq(casbox_store_open_keys(store, &error), 0);
	make_record(store, pool, parts, &rec, &inputs);
	add_msg(store, 1, &rec, inputs);
	free_inputs(inputs);
	casbox_store_close(&store);
	a = array_idx(&rec.parts, 0);
	ck_assert_uint_eq(blob_refcount(&a->id), 1);

	ck_assert_int_eq(cas_keyring_load(key_path, &kr, &error), 1);
	old_id = cas_keyring_wrap_key_id(kr);
	cas_keyring_rotate_add(kr);
	new_id = cas_keyring_wrap_key_id(kr);
	ck_assert_int_eq(cas_keyring_save(kr, key_path, &error), 1);

	ck_assert_int_eq(pipe(ready), 0);
	ck_assert_int_eq(pipe(go), 0);
	saver = fork();
	ck_assert_int_ge(saver, 0);
	if (saver == 0) {
		/* a copy of message 1: reads both blob records under the
		   lock, holds it until told to commit */
		struct casbox_store_txn *txn;
		int ok;

		store = store_open();
		ok = casbox_store_txn_begin(store, &txn, &error) == 0 &&
			casbox_store_txn_add_msg(txn, box_guid, 2, &rec, NULL,
						 &error) == 0 &&
			write(ready[1], "r", 1) == 1 &&
			read(go[0], &c, 1) == 1 &&
			casbox_store_txn_commit(&txn, &error) == 0;
		_exit(ok ? 0 : 1);
	}
	ck_assert_int_eq(read(ready[0], &c, 1), 1);
	rotator = fork();
	ck_assert_int_ge(rotator, 0);
	if (rotator == 0) {
		struct casbox_rekey_stats stats;
		struct casbox_pack_store *packs;
		buffer_t *pos = t_buffer_create(64);
		int ret;

		/* the pack lock after the LSM lock, as the saver holds
		   them: no deadlock */
		lsm = lsm_open();
		packs = packs_open(kr);
		i_zero(&stats);
		do {
			ret = casbox_rekey_step(lsm, packs, kr, old_id, 1,
						pos, NULL, NULL, &stats,
						&error);
		} while (ret > 0);
		_exit(ret == 0 && stats.rewrapped == 2 ? 0 : 1);
	}
	/* let the save commit only once the rotation step waits for the
	   lock (observed, not timed) */
	while (!pid_waits_for_lock(rotator) &&
	       !pid_waits_for_shared_lock(rotator))
		usleep(1000);
	ck_assert_int_eq(write(go[1], "g", 1), 1);
	wait_child_ok(saver);
	wait_child_ok(rotator);

	lsm = lsm_open();
	ck_assert_uint_eq(blob_refcount(&a->id), 2);
	ck_assert_uint_eq(blob_key_id(lsm, &a->id), new_id);
	/* one DEK update per rewrapped record, matching the LSM */
	ck_assert_uint_eq(dek_updates_check(kr, lsm, new_id), 2);
	test_store_lsm_close(&lsm);
	test_store_reseal_all(root, &set);
	cas_keyring_rotate_finish(kr);
	ck_assert_int_eq(cas_keyring_save(kr, key_path, &error), 1);
	store = store_open();
	ck_assert_str_eq(read_msg(store, 2), t_strconcat(part_a, "\nraced\n",
							  NULL));
	casbox_store_close(&store);
	cas_keyring_free(&kr);
	pool_unref(&pool);
	i_close_fd(&ready[0]);
	i_close_fd(&ready[1]);
	i_close_fd(&go[0]);
	i_close_fd(&go[1]);
}
END_TEST

/* casbox_key_mode = password at the store: a process without the
   password cannot create the key; the first one with it does; without
   it messages are saved (sealed DEKs) and deduplicated but not read;
   with it they are read; a wrong password is an error that sticks
   (no Argon2id per message). */
START_TEST(test_password_mode)
{
	const char *const parts1[] = { part_a, part_b, NULL };
	struct casbox_msg_record rec1, rec;
	struct istream **in1, *input;
	struct casbox_store *store;
	pool_t pool = pool_alloconly_create("test", 4096);
	const char *error = NULL, *error2 = NULL;
	const struct casbox_msg_part *parts;
	unsigned int count;
	struct stat st;

	set.key_mode = CAS_KEY_MODE_PASSWORD;
	set.key_password = NULL;
	error = store_open_error();
	ck_assert(strstr(error, key_path) != NULL);
	ck_assert(strstr(error, "only be created with the user's password")
		  != NULL);
	ck_assert_int_eq(access(key_path, F_OK), -1);

	set.key_password = "pw";
	store = store_open();
	ck_assert_int_eq(casbox_store_open_keys(store, &error), 0);
	ck_assert(!casbox_store_key_locked(store));
	ck_assert_int_eq(stat(key_path, &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0600);
	casbox_store_close(&store);

	/* LMTP: saves and dedups, cannot read */
	set.key_password = NULL;
	store = store_open();
	ck_assert_int_eq(casbox_store_open_keys(store, &error), 0);
	ck_assert(casbox_store_key_locked(store));
	make_record(store, pool, parts1, &rec1, &in1);
	add_msg(store, 1, &rec1, in1);
	free_inputs(in1);
	make_record(store, pool, parts1, &rec1, &in1);
	add_msg(store, 2, &rec1, in1);
	/* the second save wrote no blob: both parts are shared */
	parts = array_get(&rec1.parts, &count);
	ck_assert_uint_eq(count, 2);
	ck_assert_uint_eq(blob_refcount(&parts[0].id), 2);
	ck_assert_uint_eq(blob_refcount(&parts[1].id), 2);
	ck_assert_int_eq(casbox_store_msg_lookup(store, box_guid, 1,
		pool_datastack_create(), &rec, &error), 1);
	ck_assert_int_eq(casbox_store_msg_open(store, &rec, &input, &error),
			 -1);
	ck_assert(strstr(error, "user key is locked") != NULL);
	ck_assert(strstr(error, key_path) != NULL);
	casbox_store_close(&store);

	/* IMAP with the password reads both */
	set.key_password = "pw";
	store = store_open();
	ck_assert_str_eq(read_msg(store, 1),
			 t_strconcat(part_a, part_b, NULL));
	ck_assert_str_eq(read_msg(store, 2),
			 t_strconcat(part_a, part_b, NULL));
	casbox_store_close(&store);

	/* a wrong password: the same clear error every time */
	set.key_password = "wrong";
	store = store_open();
	ck_assert_int_eq(casbox_store_open_keys(store, &error), -1);
	ck_assert(strstr(error, "wrong password") != NULL);
	ck_assert(casbox_store_key_locked(store));
	ck_assert_int_eq(casbox_store_open_keys(store, &error2), -1);
	ck_assert_str_eq(error, error2);
	casbox_store_close(&store);

	/* the same file in server mode is not a key of that mode */
	set.key_mode = CAS_KEY_MODE_SERVER;
	set.key_password = NULL;
	error = store_open_error();
	ck_assert(strstr(error, key_path) != NULL);
	free_inputs(in1);
	pool_unref(&pool);
}
END_TEST

/* A transaction past CASBOX_STORE_TXN_CHECKPOINT_SIZE commits in pieces:
   blob refcounts carry on across checkpoints (the blob state is read
   back from the LSM), a new blob written before a checkpoint is
   durable with it, and a rollback after a checkpoint keeps what was
   committed. */
#define META_SIZE (CASBOX_STORE_TXN_CHECKPOINT_SIZE / 8)
START_TEST(test_txn_checkpoint)
{
	const char *const parts[] = { part_a, part_b, NULL };
	struct casbox_msg_record rec, big;
	struct istream **in;
	struct casbox_store *store = store_open();
	struct casbox_store_txn *txn;
	pool_t pool = pool_alloconly_create("test", 4096);
	unsigned char *meta;
	const char *error = NULL;
	unsigned int uid, checkpoints = 0, before_last = 0;
	int ret;

	ck_assert_int_eq(casbox_store_open_keys(store, &error), 0);
	make_record(store, pool, parts, &rec, &in);
	const struct casbox_msg_part *a = array_idx(&rec.parts, 0);
	/* records of an eighth of the checkpoint size each: the sealed
	   metadata is opaque here */
	big = rec;
	meta = p_malloc(pool, META_SIZE);
	memset(meta, 'm', META_SIZE);
	big.sealed_meta = meta;
	big.sealed_meta_size = META_SIZE;

	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	for (uid = 1; uid <= 20; uid++) {
		/* the first message brings the blobs' bytes; the others
		   have a part of their own, so each has its own big
		   metadata record (records v2 share it per part list) */
		if (uid == 1) {
			ck_assert_int_eq(casbox_store_txn_add_msg(txn,
				box_guid, uid, &big, in, &error), 0);
		} else T_BEGIN {
			const char *const uparts[] = {
				part_a, t_strdup_printf("\nown tail %u\n", uid),
				NULL
			};
			struct casbox_msg_record urec;
			struct istream **uin;

			make_record(store, pool_datastack_create(), uparts,
				    &urec, &uin);
			urec.sealed_meta = meta;
			urec.sealed_meta_size = META_SIZE;
			ck_assert_int_eq(casbox_store_txn_add_msg(txn,
				box_guid, uid, &urec, uin, &error), 0);
			free_inputs(uin);
		} T_END;
		ret = casbox_store_txn_checkpoint(txn, &error);
		ck_assert_int_ge(ret, 0);
		if (ret > 0) {
			checkpoints++;
			before_last = uid;
			/* durable now, blob bytes included */
			ck_assert_uint_eq(blob_refcount(&a->id), uid);
			ck_assert_str_eq(read_msg(store, uid),
				t_strdup_printf("%s\nown tail %u\n", part_a,
						uid));
		}
	}
	/* 20 such records: 8 per batch */
	ck_assert_uint_eq(checkpoints, 2);
	ck_assert_uint_eq(before_last, 16);
	ck_assert_ptr_null(read_msg(store, 17));
	casbox_store_txn_rollback(&txn);
	ck_assert_uint_eq(blob_refcount(&a->id), 16);
	ck_assert_ptr_nonnull(read_msg(store, 16));
	ck_assert_ptr_null(read_msg(store, 17));

	/* and a whole transaction of them commits (copies of UID 1: one
	   shared metadata record, referenced 25 times) */
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	for (uid = 17; uid <= 40; uid++) {
		ck_assert_int_eq(casbox_store_txn_add_msg(txn, box_guid, uid,
			&big, NULL, &error), 0);
		ck_assert_int_ge(casbox_store_txn_checkpoint(txn, &error), 0);
	}
	ck_assert_int_eq(casbox_store_txn_commit(&txn, &error), 0);
	ck_assert_uint_eq(blob_refcount(&a->id), 40);
	for (uid = 1; uid <= 40; uid++)
		ck_assert_ptr_nonnull(read_msg(store, uid));

	free_inputs(in);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* Reads racing other processes' writes: a record read before another
   process expunged the message, and a pack unlinked (by gc) after the
   message was opened. */
START_TEST(test_read_races)
{
	const char *parts1[] = { part_a, part_b, NULL };
	const char *parts2[] = { part_c, NULL };
	struct casbox_store *reader, *writer;
	struct casbox_msg_record rec, stale;
	struct casbox_store_txn *txn;
	struct casbox_blob_value val;
	struct casbox_blob_record brec;
	struct casbox_lsm *lsm;
	struct istream **inputs, *input, *again;
	const struct casbox_msg_part *part;
	const unsigned char *data;
	size_t size;
	string_t *str = t_str_new(256);
	const char *error = NULL, *pack;
	pool_t pool = pool_alloconly_create("test", 4096);

	writer = store_open();
	ck_assert_int_eq(casbox_store_open_keys(writer, &error), 0);
	make_record(writer, pool, parts1, &rec, &inputs);
	add_msg(writer, 1, &rec, inputs);
	free_inputs(inputs);
	make_record(writer, pool, parts2, &rec, &inputs);
	add_msg(writer, 2, &rec, inputs);
	free_inputs(inputs);

	/* the reader has uid 1's record; then another process expunges it
	   and its last references go */
	reader = store_open();
	ck_assert_int_eq(casbox_store_msg_lookup(reader, box_guid, 1, pool,
						 &stale, &error), 1);
	expunge(writer, 1);
	ck_assert_int_eq(casbox_store_msg_open(reader, &stale, &input,
					       &error), 0);
	ck_assert(strstr(error, "has no record") != NULL);
	/* a copy of it committed now finds its blobs gone: ENOENT says
	   so (the save then reports the source expunged) */
	ck_assert_int_eq(casbox_store_txn_begin(reader, &txn, &error), 0);
	errno = 0;
	ck_assert_int_eq(casbox_store_txn_add_msg(txn, box_guid, 3, &stale,
						  NULL, &error), -1);
	ck_assert_int_eq(errno, ENOENT);
	casbox_store_txn_rollback(&txn);

	/* uid 2 opened, then its pack unlinked: the stream still reads
	   every byte, since the open took the pack */
	ck_assert_int_eq(casbox_store_msg_lookup(reader, box_guid, 2, pool,
						 &rec, &error), 1);
	ck_assert_int_eq(casbox_store_msg_open(reader, &rec, &input,
					       &error), 1);
	part = array_idx(&rec.parts, 0);
	lsm = lsm_open();
	blob_record(lsm, &part->id, &val, &brec);
	test_store_lsm_close(&lsm);
	pack = t_strdup_printf("%s/packs/pack-%08u.cbp", root, brec.pack_id);
	ck_assert_int_eq(unlink(pack), 0);
	while (i_stream_read_more(input, &data, &size) > 0) {
		str_append_data(str, data, size);
		i_stream_skip(input, size);
	}
	ck_assert_int_eq(input->stream_errno, 0);
	ck_assert_str_eq(str_c(str), part_c);
	i_stream_unref(&input);
	/* a pack that is gone at open is "0, look again", not damage */
	ck_assert_int_eq(casbox_pack_blob_open_pinned(
		casbox_store_get_packs(reader), &part->id, &brec, &again,
		&error), 0);
	ck_assert_ptr_null(again);
	ck_assert(strstr(error, pack) != NULL);

	casbox_store_close(&reader);
	casbox_store_close(&writer);
	pool_unref(&pool);
}
END_TEST

/* One whole key rotation by another store handle: a new epoch, every
   record re-sealed under it, the old epoch dropped from the key file. */
static void rotate_and_finish(void)
{
	struct casbox_store *other = store_open();
	struct casbox_rekey_stats stats;
	struct cas_keyring *kr;
	const char *error = NULL;
	buffer_t *pos;
	int ret;

	ck_assert_int_eq(cas_keyring_load(key_path, &kr, &error), 1);
	cas_keyring_rotate_add(kr);
	ck_assert_int_eq(cas_keyring_save(kr, key_path, &error), 1);
	casbox_store_close(&other);
	other = store_open();
	pos = buffer_create_dynamic(default_pool, 64);
	i_zero(&stats);
	while ((ret = casbox_rekey_meta_step(other, 100, pos, &stats,
					     &error)) > 0) ;
	ck_assert_msg(ret == 0, "meta step: %s", error);
	buffer_set_used_size(pos, 0);
	while ((ret = casbox_rekey_records_step(other, 100, pos, &stats,
						&error)) > 0) ;
	ck_assert_msg(ret == 0, "records step: %s", error);
	buffer_free(&pos);
	ck_assert_int_eq(casbox_rekey_lsm(other, &error), 0);
	casbox_store_close(&other);
	cas_keyring_rotate_finish(kr);
	ck_assert_int_eq(cas_keyring_save(kr, key_path, &error), 1);
	cas_keyring_free(&kr);
}

/* Messages part_a + bodies[i] saved as UIDs 1..count. */
static void add_bodies(struct casbox_store *store, pool_t pool,
		       const char *const *bodies, unsigned int count)
{
	struct casbox_msg_record rec;
	struct istream **inputs;
	unsigned int i;

	for (i = 0; i < count; i++) {
		const char *parts[] = { part_a, bodies[i], NULL };

		make_record(store, pool, parts, &rec, &inputs);
		add_msg(store, i + 1, &rec, inputs);
		free_inputs(inputs);
	}
}

/* A reader whose LSM view holds records of an epoch that a later
   rotation's --finish dropped, and whose key ring was refreshed after
   that (the soak's SEARCH "record key of epoch 6: The key file does not
   hold key epoch 6"): its lookup reads the LSM again and opens the
   re-sealed record. */
START_TEST(test_stale_view_after_finish)
{
	static const char *const bodies[] = { "\none\n", "\ntwo\n" };
	struct casbox_store *reader = store_open();
	struct casbox_msg_record rec;
	pool_t pool = pool_alloconly_create("test", 16384);
	const char *error = NULL;
	unsigned int i;

	ck_assert_int_eq(casbox_store_open_keys(reader, &error), 0);
	add_bodies(reader, pool, bodies, N_ELEMENTS(bodies));
	/* epoch 0 -> 1; the reader's view then takes in the epoch-1
	   records (a lookup that misses reads the LSM again), its key
	   ring stays at epoch 0 */
	rotate_and_finish();
	ck_assert_int_eq(casbox_store_msg_lookup(reader, box_guid, 99, pool,
						 &rec, &error), 0);
	/* epoch 1 -> 2, dropping 1: the view still has epoch-1 records;
	   opening one refreshes the key ring, which has no epoch 1 */
	rotate_and_finish();
	for (i = 0; i < N_ELEMENTS(bodies); i++) {
		if (casbox_store_msg_lookup(reader, box_guid, i + 1, pool,
					    &rec, &error) != 1)
			ck_abort_msg("uid %u: %s", i + 1, error);
		ck_assert_uint_eq(array_count(&rec.parts), 2);
		ck_assert_str_eq(read_msg(reader, i + 1),
				 t_strconcat(part_a, bodies[i], NULL));
	}
	casbox_store_close(&reader);
	pool_unref(&pool);
}
END_TEST

/* A reader with a kept read fd (an IMAP session) checks the key file
   once between two releases, not per message: rotations by another
   handle in the middle of its "command" (new epochs, every record and
   DEK re-sealed, the old epochs dropped) still leave every message
   readable, the keys being loaded as the records name them. */
START_TEST(test_kept_fd_rotation_mid_command)
{
	static const char *const bodies[] = { "\none\n", "\ntwo\n" };
	struct casbox_store *reader = store_open();
	pool_t pool = pool_alloconly_create("test", 16384);
	const char *error = NULL;
	unsigned int i, round;

	casbox_store_keep_read_fd(reader);
	ck_assert_int_eq(casbox_store_open_keys(reader, &error), 0);
	add_bodies(reader, pool, bodies, N_ELEMENTS(bodies));
	casbox_store_release_read_fd(reader);
	for (round = 0; round < 3; round++) {
		/* the first read of the command checks the key file */
		ck_assert_str_eq(read_msg(reader, 1),
				 t_strconcat(part_a, bodies[0], NULL));
		rotate_and_finish();
		for (i = 0; i < N_ELEMENTS(bodies); i++) {
			ck_assert_str_eq(read_msg(reader, i + 1),
				t_strconcat(part_a, bodies[i], NULL));
		}
		if (round == 1)
			casbox_store_release_read_fd(reader);
	}
	casbox_store_close(&reader);
	pool_unref(&pool);
}
END_TEST

/* The message record of uid as stored. */
/* key rotate --finish's re-seal steps: the sealed metadata of every
   message record and the dictionaries move to the new epoch, once (a
   rerun changes nothing); afterwards a copy of the key file taken
   before the rotation opens none of them, the finished key file all. */
START_TEST(test_rekey_reseal_steps)
{
	static const char *const bodies[] = {
		"\none\n", "\ntwo\n", "\nthree\n",
	};
	struct casbox_store *store = store_open(), *store2;
	struct casbox_msg_record recs[N_ELEMENTS(bodies)], rec;
	struct istream **inputs;
	struct cas_keyring *kr, *leaked;
	struct casbox_pack_store *packs;
	struct casbox_rekey_stats stats;
	struct casbox_msg_meta meta;
	struct message_part root_part;
	pool_t pool = pool_alloconly_create("test", 16384);
	const void *samples[200];
	size_t sizes[200];
	const char *dict_path, *error = NULL;
	buffer_t *pos, *dict_before, *dict_after, *plain;
	unsigned int i;
	uint32_t dict_id;
	int ret;

	ck_assert_int_eq(casbox_store_open_keys(store, &error), 0);
	i_zero(&root_part);
	for (i = 0; i < N_ELEMENTS(bodies); i++) {
		const char *parts[] = { part_a, bodies[i], NULL };

		make_record(store, pool, parts, &recs[i], &inputs);
		i_zero(&meta);
		meta.bodystructure = "(\"text\" \"plain\")";
		meta.body = "(BODY)";
		meta.envelope = p_strdup_printf(pool, "(ENV %u)", i);
		ck_assert_int_eq(casbox_meta_seal(
			casbox_store_get_keyring(store), &recs[i], &meta,
			&root_part, pool, &error), 0);
		add_msg(store, i + 1, &recs[i], inputs);
		free_inputs(inputs);
	}
	/* the leak: a copy of the key file as it is before the rotation */
	ck_assert_int_eq(cas_keyring_load(key_path, &leaked, &error), 1);
	packs = packs_open(leaked);
	for (i = 0; i < N_ELEMENTS(samples); i++) {
		samples[i] = p_strdup_printf(pool,
			"Received: from host%u.example.com by mx.example.com; "
			"Subject: sample %u of a header-like text\r\n", i, i);
		sizes[i] = strlen(samples[i]);
	}
	if (casbox_pack_dict_train(packs, samples, sizes, N_ELEMENTS(samples),
				   &dict_id, &error) < 0)
		ck_abort_msg("train: %s", error);
	casbox_pack_store_close(&packs);
	dict_path = t_strdup_printf("%s/packs/dict-%08u.cbd", root, dict_id);
	dict_before = t_buffer_create(4096);
	ck_assert_int_eq(cas_durable_read_file(NULL, dict_path, SIZE_MAX,
					       dict_before, &error), 1);

	/* rotate: a new epoch */
	ck_assert_int_eq(cas_keyring_load(key_path, &kr, &error), 1);
	cas_keyring_rotate_add(kr);
	ck_assert_int_eq(cas_keyring_save(kr, key_path, &error), 1);
	packs = packs_open(kr);
	/* a store that sees the new epoch (records v2: the metadata is in
	   one shared 's' record per part list) */
	store2 = store_open();

	/* metadata, two records a batch: every message's shared metadata
	   re-sealed and its record MACed under the new epoch (2 each) */
	i_zero(&stats);
	pos = buffer_create_dynamic(default_pool, 64);
	while ((ret = casbox_rekey_meta_step(store2, 2, pos, &stats,
					     &error)) > 0) ;
	ck_assert_int_eq(ret, 0);
	ck_assert_uint_eq(stats.rewrapped, 2 * N_ELEMENTS(bodies));
	ck_assert_uint_eq(stats.failed, 0);
	ck_assert_uint_eq(stats.bad_records, 0);
	/* a rerun (a killed --finish resumed) re-seals nothing */
	buffer_set_used_size(pos, 0);
	i_zero(&stats);
	while ((ret = casbox_rekey_meta_step(store2, 2, pos, &stats,
					     &error)) > 0) ;
	ck_assert_int_eq(ret, 0);
	ck_assert_uint_eq(stats.rewrapped, 0);
	ck_assert_uint_eq(stats.examined, N_ELEMENTS(bodies));
	/* the other records (flags marker, 's', 'r', ...): MACs only */
	buffer_set_used_size(pos, 0);
	i_zero(&stats);
	while ((ret = casbox_rekey_records_step(store2, 2, pos, &stats,
						&error)) > 0) ;
	ck_assert_int_eq(ret, 0);
	ck_assert_uint_gt(stats.rewrapped, 0);
	ck_assert_uint_eq(stats.bad_records, 0);
	buffer_set_used_size(pos, 0);
	i_zero(&stats);
	while ((ret = casbox_rekey_records_step(store2, 2, pos, &stats,
						&error)) > 0) ;
	ck_assert_int_eq(ret, 0);
	ck_assert_uint_eq(stats.rewrapped, 0);
	buffer_free(&pos);
	ck_assert_int_eq(casbox_rekey_lsm(store2, &error), 0);
	casbox_store_close(&store2);

	/* the dictionary: replaced once */
	i_zero(&stats);
	ck_assert_int_eq(casbox_rekey_dicts(packs, &stats, &error), 0);
	ck_assert_uint_eq(stats.rewrapped, 1);
	ck_assert_int_eq(casbox_rekey_dicts(packs, &stats, &error), 0);
	ck_assert_uint_eq(stats.rewrapped, 1);
	casbox_pack_store_close(&packs);

	/* --finish drops the old epoch */
	cas_keyring_rotate_finish(kr);
	ck_assert_int_eq(cas_keyring_save(kr, key_path, &error), 1);
	cas_keyring_free(&kr);
	ck_assert_int_eq(cas_keyring_load(key_path, &kr, &error), 1);

	store2 = store_open();
	for (i = 0; i < N_ELEMENTS(bodies); i++) {
		ck_assert_int_eq(casbox_store_msg_lookup(store2, box_guid,
			i + 1, pool, &rec, &error), 1);
		ck_assert_uint_gt(rec.sealed_meta_size, 0);
		ck_assert_int_eq(casbox_meta_open(kr, &rec, pool, &meta,
						  &error), 1);
		ck_assert_str_eq(meta.envelope,
				 t_strdup_printf("(ENV %u)", i));
		ck_assert_int_eq(casbox_meta_open(leaked, &rec, pool, &meta,
						  &error), -1);
		ck_assert_ptr_nonnull(strstr(error, "authentication failed"));
	}
	dict_after = t_buffer_create(4096);
	ck_assert_int_eq(cas_durable_read_file(NULL, dict_path, SIZE_MAX,
					       dict_after, &error), 1);
	ck_assert(!buffer_cmp(dict_before, dict_after));
	plain = t_buffer_create(4096);
	ck_assert_int_eq(cas_record_open(kr, t_strdup_printf(
		"casbox-dict:%u", dict_id), strlen(t_strdup_printf(
		"casbox-dict:%u", dict_id)), dict_after->data,
		dict_after->used, plain, &error), 1);
	ck_assert_int_eq(cas_record_open(leaked, t_strdup_printf(
		"casbox-dict:%u", dict_id), strlen(t_strdup_printf(
		"casbox-dict:%u", dict_id)), dict_after->data,
		dict_after->used, plain, &error), -1);
	/* a pack store loads it with the new key file only */
	packs = packs_open(kr);
	ck_assert_uint_eq(casbox_pack_dict_current(packs), dict_id);
	casbox_pack_store_close(&packs);
	packs = packs_open(leaked);
	ck_assert_uint_eq(casbox_pack_dict_current(packs), 0);
	casbox_pack_store_close(&packs);

	casbox_store_close(&store2);
	cas_keyring_free(&kr);
	cas_keyring_free(&leaked);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* The progress marker of --finish: per epoch, durable, damage is an
   error that says what to do. */
START_TEST(test_rekey_progress_marker)
{
	const char *step, *error = NULL;
	const char *path = t_strconcat(root, "/rotate-finish", NULL);
	FILE *f;

	ck_assert_int_eq(mkdir(root, 0700) == 0 || errno == EEXIST, 1);
	ck_assert_int_eq(casbox_rekey_progress_read(root, 1, &step, &error),
			 0);
	ck_assert_int_eq(casbox_rekey_progress_write(root, 1, "metadata",
						     TRUE, &error), 0);
	ck_assert_int_eq(casbox_rekey_progress_read(root, 1, &step, &error),
			 1);
	ck_assert_str_eq(step, "metadata");
	/* another rotation's marker says nothing about this one */
	ck_assert_int_eq(casbox_rekey_progress_read(root, 2, &step, &error),
			 0);
	ck_assert_int_eq(casbox_rekey_progress_write(root, 1, "packs", TRUE,
						     &error), 0);
	ck_assert_int_eq(casbox_rekey_progress_read(root, 1, &step, &error),
			 1);
	ck_assert_str_eq(step, "packs");
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs("casbox-rotate-finish 1\ngarbage\n", f);
	fclose(f);
	ck_assert_int_eq(casbox_rekey_progress_read(root, 1, &step, &error),
			 -1);
	ck_assert_ptr_nonnull(strstr(error, "damaged"));
	ck_assert_int_eq(casbox_rekey_progress_remove(root, &error), 0);
	ck_assert_int_eq(access(path, F_OK), -1);
	ck_assert_int_eq(casbox_rekey_progress_remove(root, &error), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("storage-store");
	TCase *tc = tcase_create("store");
	int failed;

	lib_init();
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_refcounts);
	tcase_add_test(tc, test_save_stats);
	tcase_add_test(tc, test_rollback_and_missing_blob);
	tcase_add_test(tc, test_flags_mirror);
	tcase_add_test(tc, test_key_rules);
	tcase_add_test(tc, test_v1_key_record);
	tcase_add_test(tc, test_meta_seal);
	tcase_add_test(tc, test_meta_v1_readable);
	tcase_add_test(tc, test_meta_v2_hostile);
	tcase_add_test(tc, test_rekey_walk);
	tcase_add_test(tc, test_rekey_reseal_steps);
	tcase_add_test(tc, test_stale_view_after_finish);
	tcase_add_test(tc, test_kept_fd_rotation_mid_command);
	tcase_add_test(tc, test_rekey_progress_marker);
	tcase_add_test(tc, test_rekey_waits_for_save);
	tcase_add_test(tc, test_password_mode);
	tcase_add_test(tc, test_txn_checkpoint);
	tcase_add_test(tc, test_read_races);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
