/* Records v2 (issue 15): a writer of the mail root without the record
   key edits the LSM directly. Swapped part ids, a record moved to
   another mailbox, a dropped part, a replayed or unauthenticated record
   are each refused for that message only (the others stay readable) and
   the census (scrub) names mailbox, UID and what failed. Also the
   upgrade of v1 records, in batches, killed at batch boundaries and
   resumed, and a deleted version marker. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "str.h"
#include "unlink-directory.h"
#include "casbox-lsm.h"
#include "casbox-settings.h"
#include "casbox-store.h"
#include "casbox-store-census.h"
#include "casbox-record-auth.h"
#include "casbox-store-safety.h"
#include "test-store-lsm.h"

#include <check.h>
#include "check-run.h"
#include "test-store-fixture.h"
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sodium.h>

static char test_dir[] = "/tmp/check-store-tamper.XXXXXX";
static const char *root;
static struct casbox_settings set;
static const guid_128_t box_guid = { 1, 2, 3, 4, 5, 6, 7, 8,
				     9, 10, 11, 12, 13, 14, 15, 16 };
static const guid_128_t box2_guid = { 2, 2, 2, 2, 2, 2, 2, 2,
				      2, 2, 2, 2, 2, 2, 2, 2 };

static const char *part_a = "Subject: a\n\nheader of message one\n";
static const char *part_b = "\nattachment of message one, secret\n";
static const char *part_c = "Subject: c\n\nheader of message two\n";
static const char *part_d = "\nattachment of message two\n";

static void setup(void)
{
	test_store_fixture_setup(test_dir, &root, &set);
}

static void teardown(void)
{
	test_store_fixture_teardown(test_dir);
}

static struct casbox_store *store_open(void)
{
	return test_store_fixture_open(root, &set, TRUE);
}

/* The raw LSM beside the store, opened with its LSM key (the LSM is
   sealed as a whole, test-store-lsm.h): record edits that get past the
   LSM's own sealing, which only the record MAC can catch. */
static struct casbox_lsm *raw_open(void)
{
	struct casbox_lsm *lsm;
	const char *error = NULL;

	if (test_store_lsm_open_set(root, &set, TRUE, &lsm, &error) < 0)
		ck_abort_msg("raw LSM open: %s", error);
	return lsm;
}

static buffer_t *raw_get(const buffer_t *key)
{
	struct casbox_lsm *lsm = raw_open();
	buffer_t *value = t_buffer_create(256);
	const char *error = NULL;

	ck_assert_int_eq(casbox_lsm_get(lsm, key->data, key->used, value,
					&error), 1);
	test_store_lsm_close(&lsm);
	return value;
}

static void raw_put(const buffer_t *key, const void *value, size_t size)
{
	struct casbox_lsm *lsm = raw_open();
	struct casbox_lsm_batch *batch;
	const char *error = NULL;

	ck_assert_int_eq(casbox_lsm_batch_begin(lsm, &batch, &error), 1);
	if (value == NULL)
		casbox_lsm_batch_delete(batch, key->data, key->used);
	else
		casbox_lsm_batch_put(batch, key->data, key->used, value, size);
	ck_assert_int_eq(casbox_lsm_batch_commit(&batch, &error), 1);
	test_store_lsm_close(&lsm);
}

static buffer_t *msg_key(const guid_128_t box, uint32_t uid)
{
	buffer_t *key = t_buffer_create(32);

	casbox_key_message(key, box, uid);
	return key;
}

static buffer_t *flags_key(const guid_128_t box, uint32_t uid)
{
	buffer_t *key = t_buffer_create(32);

	casbox_key_flags(key, box, uid);
	return key;
}

/* Rewrite a v2 value's record, keeping its header and MAC: an edit by
   someone without the key. */
static buffer_t *
edit_v2(const buffer_t *value, const struct casbox_msg_record *rec)
{
	buffer_t *out = t_buffer_create(256);

	ck_assert_uint_eq(((const unsigned char *)value->data)[0],
			  CASBOX_RECORD_AUTH_VERSION);
	buffer_append(out, value->data, CASBOX_RECORD_AUTH_HEADER_SIZE);
	casbox_msg_record_export(rec, out);
	buffer_append(out, CONST_PTR_OFFSET(value->data, value->used -
					    CASBOX_RECORD_MAC_SIZE),
		      CASBOX_RECORD_MAC_SIZE);
	return out;
}

/* The record inside a v2 value, decoded without verification. */
static void
decode_v2(const buffer_t *value, struct casbox_msg_record *rec_r)
{
	const char *error = NULL;

	ck_assert_int_eq(casbox_msg_record_import(
		CONST_PTR_OFFSET(value->data, CASBOX_RECORD_AUTH_HEADER_SIZE),
		value->used - CASBOX_RECORD_AUTH_OVERHEAD,
		pool_datastack_create(), rec_r, &error), 1);
}

static void
add_msg(struct casbox_store *store, const guid_128_t box, uint32_t uid,
	const char *guid, uint64_t modseq, const char *const *parts)
{
	struct casbox_msg_record rec;
	struct casbox_msg_part *part;
	struct casbox_store_txn *txn;
	struct istream **inputs;
	unsigned int i, count = str_array_length(parts);
	const char *error = NULL;

	casbox_msg_record_init(pool_datastack_create(), &rec);
	rec.guid = guid;
	rec.modseq = modseq;
	inputs = t_new(struct istream *, count + 1);
	for (i = 0; i < count; i++) {
		part = array_append_space(&rec.parts);
		part->size = strlen(parts[i]);
		rec.physical_size += part->size;
		inputs[i] = i_stream_create_from_data(parts[i], part->size);
		ck_assert_int_eq(casbox_store_blob_id(store, inputs[i], 0,
			part->size, &part->id, &error), 0);
		i_stream_seek(inputs[i], 0);
	}
	rec.virtual_size = rec.physical_size;
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	if (casbox_store_txn_add_msg(txn, box, uid, &rec, inputs, &error) < 0)
		ck_abort_msg("add: %s", error);
	if (casbox_store_txn_commit(&txn, &error) < 0)
		ck_abort_msg("commit: %s", error);
	for (i = 0; i < count; i++)
		i_stream_unref(&inputs[i]);
}

static void
set_flags(struct casbox_store *store, uint32_t uid, uint32_t flags,
	  uint64_t modseq)
{
	struct casbox_store_txn *txn;
	const char *error = NULL;

	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	ck_assert_int_eq(casbox_store_txn_update_flags(txn, box_guid, uid,
		flags, NULL, modseq, &error), 0);
	ck_assert_int_eq(casbox_store_txn_commit(&txn, &error), 0);
}

static void expunge(struct casbox_store *store, uint32_t uid)
{
	test_store_fixture_expunge(store, box_guid, uid);
}

/* The message's bytes, or NULL with *error_r when its record is
   refused. */
static const char *
read_msg(struct casbox_store *store, const guid_128_t box, uint32_t uid,
	 const char **error_r)
{
	struct casbox_msg_record rec;
	struct istream *input;
	const unsigned char *data;
	size_t size;
	string_t *str = t_str_new(256);

	*error_r = NULL;
	if (casbox_store_msg_lookup(store, box, uid, pool_datastack_create(),
				    &rec, error_r) <= 0)
		return NULL;
	if (casbox_store_msg_open(store, &rec, &input, error_r) <= 0)
		return NULL;
	while (i_stream_read_more(input, &data, &size) > 0) {
		str_append_data(str, data, size);
		i_stream_skip(input, size);
	}
	ck_assert_int_eq(input->stream_errno, 0);
	i_stream_unref(&input);
	return str_c(str);
}

struct damage {
	const char *mailbox;
	uint32_t uid;
	const char *cause;
};

struct damage_log {
	pool_t pool;
	ARRAY(struct damage) items;
};

static void damage_cb(void *context, const char *mailbox, uint32_t uid,
		      const char *object ATTR_UNUSED, const char *cause)
{
	struct damage_log *log = context;
	struct damage *d = array_append_space(&log->items);

	d->mailbox = p_strdup(log->pool, mailbox);
	d->uid = uid;
	d->cause = p_strdup(log->pool, cause);
}

static struct damage_log *census_damage(struct casbox_store *store)
{
	struct damage_log *log;
	struct casbox_census *census;
	const char *error = NULL;
	pool_t pool = pool_alloconly_create("damage", 1024);

	log = p_new(pool, struct damage_log, 1);
	log->pool = pool;
	p_array_init(&log->items, pool, 4);
	if (casbox_census_build(store, damage_cb, log, &census, &error) < 0)
		ck_abort_msg("census: %s", error);
	casbox_census_free(&census);
	return log;
}

static void damage_log_free(struct damage_log **log)
{
	pool_t pool = (*log)->pool;

	*log = NULL;
	pool_unref(&pool);
}

/* The one damage the census found: at uid, with cause in it. */
static void
assert_one_damage(struct damage_log *log, uint32_t uid, const char *cause)
{
	const struct damage *d;

	ck_assert_uint_eq(array_count(&log->items), 1);
	d = array_idx(&log->items, 0);
	ck_assert_uint_eq(d->uid, uid);
	if (strstr(d->cause, cause) == NULL)
		ck_abort_msg("cause '%s' lacks '%s'", d->cause, cause);
}

/* A new open after the LSM was edited beside it (a running process
   sees it at its next refresh). */
static void reopen(struct casbox_store **store)
{
	casbox_store_close(store);
	*store = store_open();
}

static void build_two(struct casbox_store *store)
{
	const char *const parts1[] = { part_a, part_b, NULL };
	const char *const parts2[] = { part_c, part_d, NULL };

	add_msg(store, box_guid, 1, "guid-1", 10, parts1);
	add_msg(store, box_guid, 2, "guid-2", 11, parts2);
}

START_TEST(test_untampered)
{
	struct casbox_store *store = store_open();
	struct damage_log *log;
	const char *error;
	buffer_t *value;

	build_two(store);
	set_flags(store, 1, 1, 12);
	/* both records are v2 */
	value = raw_get(msg_key(box_guid, 1));
	ck_assert_uint_eq(((const unsigned char *)value->data)[0], 2);
	value = raw_get(flags_key(box_guid, 1));
	ck_assert_uint_eq(((const unsigned char *)value->data)[0], 2);
	ck_assert_str_eq(read_msg(store, box_guid, 1, &error),
			 t_strconcat(part_a, part_b, NULL));
	log = census_damage(store);
	ck_assert_uint_eq(array_count(&log->items), 0);
	damage_log_free(&log);
	casbox_store_close(&store);
}
END_TEST

START_TEST(test_swap_parts)
{
	struct casbox_store *store = store_open();
	struct casbox_msg_record rec1, rec2;
	struct damage_log *log;
	const char *error;
	buffer_t *v1, *v2;

	build_two(store);
	v1 = raw_get(msg_key(box_guid, 1));
	v2 = raw_get(msg_key(box_guid, 2));
	decode_v2(v1, &rec1);
	decode_v2(v2, &rec2);
	/* message 1's attachment becomes message 2's */
	array_idx_set(&rec1.parts, 1, array_idx(&rec2.parts, 1));
	rec1.physical_size = strlen(part_a) + strlen(part_d);
	rec1.virtual_size = rec1.physical_size;
	v1 = edit_v2(v1, &rec1);
	raw_put(msg_key(box_guid, 1), v1->data, v1->used);
	reopen(&store);

	ck_assert_ptr_null(read_msg(store, box_guid, 1, &error));
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));
	ck_assert_ptr_nonnull(strstr(error, "uid 1"));
	/* the other message is untouched */
	ck_assert_str_eq(read_msg(store, box_guid, 2, &error),
			 t_strconcat(part_c, part_d, NULL));
	log = census_damage(store);
	assert_one_damage(log, 1, "authentication failed");
	damage_log_free(&log);
	casbox_store_close(&store);
}
END_TEST

START_TEST(test_move_record)
{
	struct casbox_store *store = store_open();
	const struct damage *d;
	struct damage_log *log;
	const char *error;
	buffer_t *value;

	build_two(store);
	/* message 2's record copied to another mailbox, and to another
	   UID of its own */
	value = raw_get(msg_key(box_guid, 2));
	raw_put(msg_key(box2_guid, 2), value->data, value->used);
	raw_put(msg_key(box_guid, 9), value->data, value->used);
	ck_assert_ptr_null(read_msg(store, box2_guid, 2, &error));
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));
	ck_assert_ptr_nonnull(strstr(error,
				     guid_128_to_string(box2_guid)));
	ck_assert_ptr_null(read_msg(store, box_guid, 9, &error));
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));
	ck_assert_str_eq(read_msg(store, box_guid, 2, &error),
			 t_strconcat(part_c, part_d, NULL));
	ck_assert_str_eq(read_msg(store, box_guid, 1, &error),
			 t_strconcat(part_a, part_b, NULL));
	log = census_damage(store);
	ck_assert_uint_eq(array_count(&log->items), 2);
	/* in key order: this mailbox's UID 9, then the other mailbox */
	d = array_idx(&log->items, 0);
	ck_assert_uint_eq(d->uid, 9);
	d = array_idx(&log->items, 1);
	ck_assert_uint_eq(d->uid, 2);
	ck_assert_str_eq(d->mailbox, guid_128_to_string(box2_guid));
	damage_log_free(&log);
	casbox_store_close(&store);
}
END_TEST

START_TEST(test_drop_part)
{
	struct casbox_store *store = store_open();
	struct casbox_msg_record rec;
	struct damage_log *log;
	const char *error;
	buffer_t *value;

	build_two(store);
	value = raw_get(msg_key(box_guid, 1));
	decode_v2(value, &rec);
	array_delete(&rec.parts, 1, 1);
	rec.physical_size = strlen(part_a);
	rec.virtual_size = rec.physical_size;
	value = edit_v2(value, &rec);
	raw_put(msg_key(box_guid, 1), value->data, value->used);
	reopen(&store);
	ck_assert_ptr_null(read_msg(store, box_guid, 1, &error));
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));
	ck_assert_str_eq(read_msg(store, box_guid, 2, &error),
			 t_strconcat(part_c, part_d, NULL));
	log = census_damage(store);
	assert_one_damage(log, 1, "authentication failed");
	damage_log_free(&log);
	casbox_store_close(&store);
}
END_TEST

START_TEST(test_replay)
{
	const char *const parts1[] = { part_a, part_b, NULL };
	struct casbox_store *store = store_open();
	struct casbox_msg_record rec;
	struct damage_log *log;
	const char *error;
	buffer_t *old_flags, *old_v1, *value;

	build_two(store);
	/* a flag record of an earlier message under UID 1 */
	set_flags(store, 1, 1, 20);
	value = raw_get(flags_key(box_guid, 1));
	old_flags = buffer_create_dynamic(default_pool, value->used);
	buffer_append(old_flags, value->data, value->used);
	/* UID 1 saved again (the crash-leftover replacement): its flag
	   record goes, the new message record is newer */
	add_msg(store, box_guid, 1, "guid-1b", 30, parts1);
	raw_put(flags_key(box_guid, 1), old_flags->data, old_flags->used);
	log = census_damage(store);
	assert_one_damage(log, 1, "flag record older than its message "
			  "record");
	damage_log_free(&log);

	/* a flag record of an expunged message put back */
	expunge(store, 1);
	raw_put(flags_key(box_guid, 1), old_flags->data, old_flags->used);
	log = census_damage(store);
	assert_one_damage(log, 1, "flag record without a message record");
	damage_log_free(&log);
	raw_put(flags_key(box_guid, 1), NULL, 0);

	/* a v1 (unauthenticated) record in an upgraded store */
	decode_v2(raw_get(msg_key(box_guid, 2)), &rec);
	old_v1 = t_buffer_create(256);
	casbox_msg_record_export(&rec, old_v1);
	raw_put(msg_key(box_guid, 2), old_v1->data, old_v1->used);
	reopen(&store);
	ck_assert_ptr_null(read_msg(store, box_guid, 2, &error));
	ck_assert_ptr_nonnull(strstr(error, "unauthenticated"));
	log = census_damage(store);
	assert_one_damage(log, 2, "unauthenticated");
	damage_log_free(&log);
	buffer_free(&old_flags);
	casbox_store_close(&store);
}
END_TEST

static void
count_retained(void *context, const guid_128_t mailbox_guid ATTR_UNUSED,
	       uint32_t uid ATTR_UNUSED,
	       const struct casbox_retained_record *rec ATTR_UNUSED)
{
	unsigned int *count = context;

	(*count)++;
}

START_TEST(test_retained_edit)
{
	struct casbox_store *store = store_open();
	struct casbox_retained_record rrec, rrec2;
	struct casbox_store_txn *txn;
	const struct damage *d;
	struct damage_log *log;
	buffer_t *xkey, *xkey2, *value, *out;
	const char *error = NULL;
	unsigned int count = 0;

	build_two(store);
	/* both expunged into the undelete window */
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	ck_assert_int_eq(casbox_store_txn_retain(txn, box_guid, 1, "INBOX",
						 1000, &error), 0);
	ck_assert_int_eq(casbox_store_txn_retain(txn, box_guid, 2, "INBOX",
						 1000, &error), 0);
	ck_assert_int_eq(casbox_store_txn_commit(&txn, &error), 0);
	ck_assert_int_eq(casbox_store_retained_iterate(store, count_retained,
						       &count, &error), 0);
	ck_assert_uint_eq(count, 2);
	log = census_damage(store);
	ck_assert_uint_eq(array_count(&log->items), 0);
	damage_log_free(&log);

	/* undelete would restore UID 1 with message 2's attachment */
	xkey = t_buffer_create(32);
	casbox_key_retained(xkey, box_guid, 1);
	xkey2 = t_buffer_create(32);
	casbox_key_retained(xkey2, box_guid, 2);
	value = raw_get(xkey);
	ck_assert_uint_eq(((const unsigned char *)value->data)[0], 2);
	ck_assert_int_eq(casbox_retained_record_import(
		CONST_PTR_OFFSET(value->data, CASBOX_RECORD_AUTH_HEADER_SIZE),
		value->used - CASBOX_RECORD_AUTH_OVERHEAD,
		pool_datastack_create(), &rrec, &error), 1);
	out = raw_get(xkey2);
	ck_assert_int_eq(casbox_retained_record_import(
		CONST_PTR_OFFSET(out->data, CASBOX_RECORD_AUTH_HEADER_SIZE),
		out->used - CASBOX_RECORD_AUTH_OVERHEAD,
		pool_datastack_create(), &rrec2, &error), 1);
	array_idx_set(&rrec.msg.parts, 1, array_idx(&rrec2.msg.parts, 1));
	rrec.msg.physical_size = strlen(part_a) + strlen(part_d);
	rrec.msg.virtual_size = rrec.msg.physical_size;
	out = t_buffer_create(256);
	buffer_append(out, value->data, CASBOX_RECORD_AUTH_HEADER_SIZE);
	casbox_retained_record_export(&rrec, out);
	buffer_append(out, CONST_PTR_OFFSET(value->data, value->used -
					    CASBOX_RECORD_MAC_SIZE),
		      CASBOX_RECORD_MAC_SIZE);
	raw_put(xkey, out->data, out->used);
	reopen(&store);

	ck_assert_int_eq(casbox_store_retained_iterate(store, count_retained,
						       &count, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "retained record of mailbox"));
	ck_assert_ptr_nonnull(strstr(error, "uid 1: authentication failed"));
	log = census_damage(store);
	assert_one_damage(log, 1, "authentication failed");
	d = array_idx(&log->items, 0);
	ck_assert_str_eq(d->mailbox, "INBOX");
	damage_log_free(&log);
	casbox_store_close(&store);
}
END_TEST

/* The 's' records (the key of the last one in key_r) and the refcount
   of the last 'r' record, raw; the counts of both must agree. */
static unsigned int meta_records(uint32_t *refcount_r, buffer_t *key_r)
{
	static const unsigned char prefixes[] = {
		CASBOX_KEY_META_REFS, CASBOX_KEY_META
	};
	struct casbox_lsm *lsm = raw_open();
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	const unsigned char *sealed;
	size_t sealed_size;
	const char *error = NULL;
	unsigned int i, n[2] = { 0, 0 };

	*refcount_r = 0;
	for (i = 0; i < 2; i++) {
		iter = casbox_lsm_iter_init(lsm, &prefixes[i], 1);
		while (casbox_lsm_iter_next(iter, &key, &key_size,
					    &value, &value_size)) {
			const void *body = value +
				CASBOX_RECORD_AUTH_HEADER_SIZE;
			size_t size = value_size -
				CASBOX_RECORD_AUTH_OVERHEAD;

			if (i == 0) {
				ck_assert_int_eq(casbox_meta_refs_import(body,
					size, refcount_r, &error), 1);
			} else {
				ck_assert_int_eq(casbox_meta_record_import(
					body, size, &sealed, &sealed_size,
					&error), 1);
				if (key_r != NULL) {
					buffer_set_used_size(key_r, 0);
					buffer_append(key_r, key, key_size);
				}
			}
			n[i]++;
		}
		ck_assert_int_ge(casbox_lsm_iter_deinit(&iter, &error), 0);
	}
	test_store_lsm_close(&lsm);
	ck_assert_uint_eq(n[0], n[1]);
	return n[1];
}

static void
add_with_meta(struct casbox_store *store, uint32_t uid, const char *meta,
	      bool copy)
{
	const char *const parts[] = { part_a, part_b, NULL };
	struct casbox_msg_record rec;
	struct casbox_msg_part *part;
	struct casbox_store_txn *txn;
	struct istream *inputs[3] = { NULL, NULL, NULL };
	const char *error = NULL;
	unsigned int i;

	casbox_msg_record_init(pool_datastack_create(), &rec);
	rec.guid = "guid-m";
	for (i = 0; i < 2; i++) {
		part = array_append_space(&rec.parts);
		part->size = strlen(parts[i]);
		rec.physical_size += part->size;
		inputs[i] = i_stream_create_from_data(parts[i], part->size);
		ck_assert_int_eq(casbox_store_blob_id(store, inputs[i], 0,
			part->size, &part->id, &error), 0);
		i_stream_seek(inputs[i], 0);
	}
	rec.virtual_size = rec.physical_size;
	rec.sealed_meta = (const unsigned char *)meta;
	rec.sealed_meta_size = strlen(meta);
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	if (casbox_store_txn_add_msg(txn, box_guid, uid, &rec,
				     copy ? NULL : inputs, &error) < 0)
		ck_abort_msg("add: %s", error);
	ck_assert_int_eq(casbox_store_txn_commit(&txn, &error), 0);
	for (i = 0; i < 2; i++)
		i_stream_unref(&inputs[i]);
}

static const char *lookup_meta(struct casbox_store *store, uint32_t uid)
{
	struct casbox_msg_record rec;
	const char *error = NULL;

	if (casbox_store_msg_lookup(store, box_guid, uid,
				    pool_datastack_create(), &rec,
				    &error) <= 0)
		ck_abort_msg("lookup %u: %s", uid, error);
	return t_strndup(rec.sealed_meta, rec.sealed_meta_size);
}

START_TEST(test_shared_meta)
{
	static const char meta[] = "sealed BODYSTRUCTURE, opaque here";
	struct casbox_store *store = store_open();
	struct casbox_store_txn *txn;
	const struct damage *d;
	struct damage_log *log;
	struct casbox_msg_record rec;
	buffer_t *skey = t_buffer_create(40), *value;
	const char *error = NULL;
	uint32_t refcount;

	add_with_meta(store, 1, meta, FALSE);
	/* copies (and a second delivery of the same parts) share it */
	add_with_meta(store, 2, meta, TRUE);
	add_with_meta(store, 3, meta, TRUE);
	ck_assert_uint_eq(meta_records(&refcount, skey), 1);
	ck_assert_uint_eq(refcount, 3);
	ck_assert_str_eq(lookup_meta(store, 2), meta);
	ck_assert_str_eq(lookup_meta(store, 3), meta);
	/* the message record itself holds only the reference */
	value = raw_get(msg_key(box_guid, 3));
	decode_v2(value, &rec);
	ck_assert(rec.meta_ref);
	ck_assert_uint_eq(rec.sealed_meta_size, 0);
	ck_assert_uint_lt(value->used, 250);
	log = census_damage(store);
	ck_assert_uint_eq(array_count(&log->items), 0);
	damage_log_free(&log);

	/* expunge, retain (undelete keeps the blobs, not the metadata),
	   replace: each gives its reference back */
	expunge(store, 1);
	ck_assert_uint_eq(meta_records(&refcount, NULL), 1);
	ck_assert_uint_eq(refcount, 2);
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	ck_assert_int_eq(casbox_store_txn_retain(txn, box_guid, 2, "INBOX",
						 1000, &error), 0);
	ck_assert_int_eq(casbox_store_txn_commit(&txn, &error), 0);
	ck_assert_uint_eq(meta_records(&refcount, NULL), 1);
	ck_assert_uint_eq(refcount, 1);
	log = census_damage(store);
	ck_assert_uint_eq(array_count(&log->items), 0);
	damage_log_free(&log);

	/* an edited metadata record fails the lookup of its messages */
	value = raw_get(skey);
	buffer_write(value, CASBOX_RECORD_AUTH_HEADER_SIZE + 6, "X", 1);
	raw_put(skey, value->data, value->used);
	reopen(&store);
	ck_assert_int_eq(casbox_store_msg_lookup(store, box_guid, 3,
		pool_datastack_create(), &rec, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "metadata record"));
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));
	log = census_damage(store);
	ck_assert_uint_ge(array_count(&log->items), 1);
	d = array_idx(&log->items, 0);
	ck_assert_ptr_nonnull(strstr(d->cause, "authentication failed"));
	damage_log_free(&log);

	/* the message can still be expunged: the refcount is a record of
	   its own, and the last reference takes both */
	expunge(store, 3);
	ck_assert_uint_eq(meta_records(&refcount, NULL), 0);
	casbox_store_close(&store);
}
END_TEST

/* A v1 store: n message records (and a flag record for every tenth) in
   the v1 encoding, no marker. All reference part_a's blob (its refcount
   does not matter to the records' upgrade). */
static void build_v1_store(unsigned int n)
{
	const char *const parts[] = { part_a, NULL };
	struct casbox_store *store = store_open();
	struct casbox_msg_record rec;
	struct casbox_lsm_batch *batch;
	struct casbox_lsm *lsm;
	const unsigned char mkey = CASBOX_KEY_RECORDS_VERSION;
	buffer_t *key, *value;
	const char *error = NULL;
	unsigned int uid;

	add_msg(store, box_guid, 1, "guid-1", 1, parts);
	decode_v2(raw_get(msg_key(box_guid, 1)), &rec);
	casbox_store_close(&store);

	lsm = raw_open();
	ck_assert_int_eq(casbox_lsm_batch_begin(lsm, &batch, &error), 1);
	casbox_lsm_batch_delete(batch, &mkey, 1);
	key = t_buffer_create(32);
	value = t_buffer_create(256);
	for (uid = 1; uid <= n; uid++) {
		buffer_set_used_size(key, 0);
		buffer_set_used_size(value, 0);
		casbox_key_message(key, box_guid, uid);
		rec.modseq = uid;
		casbox_msg_record_export(&rec, value);
		casbox_lsm_batch_put(batch, key->data, key->used,
				     value->data, value->used);
		if (uid % 10 != 0)
			continue;
		buffer_set_used_size(key, 0);
		buffer_set_used_size(value, 0);
		casbox_key_flags(key, box_guid, uid);
		casbox_flags_record_export(1, uid + 1, NULL, value);
		casbox_lsm_batch_put(batch, key->data, key->used,
				     value->data, value->used);
	}
	ck_assert_int_eq(casbox_lsm_batch_commit(&batch, &error), 1);
	test_store_lsm_close(&lsm);
}

/* v1 and v2 records among 'm' and 'f', counted raw. */
static void count_versions(unsigned int *v1_r, unsigned int *v2_r)
{
	static const unsigned char prefixes[] = {
		CASBOX_KEY_FLAGS, CASBOX_KEY_MESSAGE
	};
	struct casbox_lsm *lsm = raw_open();
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	const char *error = NULL;
	unsigned int i;

	*v1_r = *v2_r = 0;
	for (i = 0; i < N_ELEMENTS(prefixes); i++) {
		iter = casbox_lsm_iter_init(lsm, &prefixes[i], 1);
		while (casbox_lsm_iter_next(iter, &key, &key_size,
					    &value, &value_size)) {
			if (value[0] == 1)
				(*v1_r)++;
			else if (value[0] == 2)
				(*v2_r)++;
		}
		ck_assert_int_ge(casbox_lsm_iter_deinit(&iter, &error), 0);
	}
	test_store_lsm_close(&lsm);
}

static unsigned int kill_after_batches;

static void
kill_progress(void *context ATTR_UNUSED,
	      const struct casbox_records_upgrade_stats *stats)
{
	if (stats->batches == kill_after_batches)
		(void)kill(getpid(), SIGKILL);
}

/* Run the upgrade in a child that kills itself (SIGKILL) after the
   given number of committed batches. */
static void upgrade_killed_after(unsigned int batches)
{
	struct casbox_records_upgrade_stats stats;
	struct casbox_store *store;
	const char *error = NULL;
	int status;
	pid_t pid;

	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		kill_after_batches = batches;
		if (casbox_store_open(root, &set, FSYNC_MODE_ALWAYS,
				      FILE_LOCK_METHOD_FCNTL, &store,
				      &error) < 0)
			_exit(2);
		(void)casbox_records_upgrade(store, kill_progress, NULL,
					     &stats, &error);
		_exit(3);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFSIGNALED(status));
	ck_assert_int_eq(WTERMSIG(status), SIGKILL);
}

START_TEST(test_upgrade_resumes)
{
	struct casbox_records_upgrade_stats stats;
	struct casbox_store *store;
	struct damage_log *log;
	unsigned int v1, v2, expect = 2500 + 250;
	const char *error = NULL;

	build_v1_store(2500);
	count_versions(&v1, &v2);
	ck_assert_uint_eq(v1, expect);
	ck_assert_uint_eq(v2, 0);

	/* killed after the first batch (the 250 flag records): both
	   kinds read (the marker says "upgrading") */
	upgrade_killed_after(1);
	count_versions(&v1, &v2);
	ck_assert_uint_eq(v2, 250);
	ck_assert_uint_eq(v1 + v2, expect);
	if (casbox_store_open(root, &set, FSYNC_MODE_ALWAYS,
			      FILE_LOCK_METHOD_FCNTL, &store, &error) < 0)
		ck_abort_msg("open: %s", error);
	log = census_damage(store);
	ck_assert_uint_eq(array_count(&log->items), 0);
	damage_log_free(&log);
	casbox_store_close(&store);

	/* again, two batches of message records further */
	upgrade_killed_after(2);
	count_versions(&v1, &v2);
	ck_assert_uint_eq(v2, 250 + 2 * CASBOX_RECORDS_UPGRADE_BATCH);

	/* the next run finishes */
	if (casbox_store_open(root, &set, FSYNC_MODE_ALWAYS,
			      FILE_LOCK_METHOD_FCNTL, &store, &error) < 0)
		ck_abort_msg("open: %s", error);
	ck_assert_int_eq(casbox_records_upgrade(store, NULL, NULL, &stats,
						&error), 0);
	ck_assert_uint_eq(stats.upgraded, expect - v2);
	ck_assert_uint_eq(stats.malformed, 0);
	count_versions(&v1, &v2);
	ck_assert_uint_eq(v1, 0);
	ck_assert_uint_eq(v2, expect);
	/* and again: nothing to do */
	ck_assert_int_eq(casbox_records_upgrade(store, NULL, NULL, &stats,
						&error), 0);
	ck_assert_uint_eq(stats.upgraded, 0);
	log = census_damage(store);
	ck_assert_uint_eq(array_count(&log->items), 0);
	damage_log_free(&log);
	casbox_store_close(&store);
}
END_TEST

START_TEST(test_upgrade_on_open)
{
	struct casbox_store *store;
	struct casbox_msg_record rec;
	unsigned int v1, v2;
	const char *error = NULL;

	build_v1_store(30);
	/* reading a v1 store before the upgrade works */
	if (casbox_store_open(root, &set, FSYNC_MODE_ALWAYS,
			      FILE_LOCK_METHOD_FCNTL, &store, &error) < 0)
		ck_abort_msg("open: %s", error);
	ck_assert_int_eq(casbox_store_msg_lookup(store, box_guid, 20,
		pool_datastack_create(), &rec, &error), 1);
	ck_assert_uint_eq(rec.modseq, 21);
	count_versions(&v1, &v2);
	ck_assert_uint_eq(v2, 0);
	/* loading the keys upgrades */
	ck_assert_int_eq(casbox_store_open_keys(store, &error), 0);
	count_versions(&v1, &v2);
	ck_assert_uint_eq(v1, 0);
	ck_assert_uint_eq(v2, 33);
	ck_assert_str_eq(read_msg(store, box_guid, 30, &error), part_a);
	casbox_store_close(&store);
}
END_TEST

START_TEST(test_marker_deleted)
{
	const unsigned char mkey = CASBOX_KEY_RECORDS_VERSION;
	struct casbox_records_upgrade_stats stats;
	struct casbox_store *store = store_open();
	struct casbox_msg_record rec1, rec2;
	buffer_t *key, *value;
	struct damage_log *log;
	const char *error;

	build_two(store);
	casbox_store_close(&store);
	/* marker deleted, message 1 replaced by a v1 record with message
	   2's attachment: the upgrade must not authenticate it */
	key = t_buffer_create(1);
	buffer_append_c(key, mkey);
	raw_put(key, NULL, 0);
	decode_v2(raw_get(msg_key(box_guid, 1)), &rec1);
	decode_v2(raw_get(msg_key(box_guid, 2)), &rec2);
	array_idx_set(&rec1.parts, 1, array_idx(&rec2.parts, 1));
	rec1.physical_size = strlen(part_a) + strlen(part_d);
	value = t_buffer_create(256);
	casbox_msg_record_export(&rec1, value);
	raw_put(msg_key(box_guid, 1), value->data, value->used);

	if (casbox_store_open(root, &set, FSYNC_MODE_ALWAYS,
			      FILE_LOCK_METHOD_FCNTL, &store, &error) < 0)
		ck_abort_msg("open: %s", error);
	ck_assert_int_eq(casbox_records_upgrade(store, NULL, NULL, &stats,
						&error), 0);
	ck_assert(stats.marker_was_missing);
	ck_assert_uint_eq(stats.upgraded, 0);
	ck_assert_ptr_null(read_msg(store, box_guid, 1, &error));
	ck_assert_ptr_nonnull(strstr(error, "unauthenticated"));
	ck_assert_str_eq(read_msg(store, box_guid, 2, &error),
			 t_strconcat(part_c, part_d, NULL));
	log = census_damage(store);
	assert_one_damage(log, 1, "unauthenticated");
	damage_log_free(&log);
	casbox_store_close(&store);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("store-tamper");
	TCase *tc = tcase_create("tamper");
	int failed;

	lib_init();
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_untampered);
	tcase_add_test(tc, test_swap_parts);
	tcase_add_test(tc, test_move_record);
	tcase_add_test(tc, test_drop_part);
	tcase_add_test(tc, test_replay);
	tcase_add_test(tc, test_retained_edit);
	tcase_add_test(tc, test_shared_meta);
	tcase_add_test(tc, test_upgrade_resumes);
	tcase_add_test(tc, test_upgrade_on_open);
	tcase_add_test(tc, test_marker_deleted);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
