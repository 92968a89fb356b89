#ifndef TEST_STORE_FIXTURE_H
#define TEST_STORE_FIXTURE_H

/* The store tests' common fixture: a fresh directory holding a casbox
   root ("<dir>/casbox") and the key file beside it ("<dir>/user.key"),
   the settings the tests start from, the store opened as the glue
   opens it, and a blob record read straight from the LSM. Include
   check.h first. *root_r and the key file path are data-stack strings,
   so call setup outside any T_BEGIN. */

#include "istream.h"
#include "str.h"
#include "unlink-directory.h"
#include "casbox-records.h"
#include "test-store-lsm.h"

/* mkdtemp(tmpl) (a "...XXXXXX" template, restored by teardown) with
   the casbox root made in it; set gets the test defaults (autocreated
   key, zstd 3, parts split at 1 kB, 1 MB packs). */
static inline void
test_store_fixture_setup(char *tmpl, const char **root_r,
			 struct casbox_settings *set)
{
	ck_assert_ptr_nonnull(mkdtemp(tmpl));
	*root_r = t_strconcat(tmpl, "/casbox", NULL);
	ck_assert_int_eq(mkdir(*root_r, 0700), 0);
	i_zero(set);
	set->key_file = t_strconcat(tmpl, "/user.key", NULL);
	set->key_autocreate = TRUE;
	set->zstd_level = 3;
	set->part_split_size = 1024;
	set->pack_size = 1024 * 1024;
}

static inline void test_store_fixture_teardown(char *tmpl)
{
	const char *error;

	ck_assert_int_eq(unlink_directory(tmpl,
		UNLINK_DIRECTORY_FLAG_RMDIR, &error), 1);
	memcpy(tmpl + strlen(tmpl) - 6, "XXXXXX", 6);
}

/* casbox_store_open() with fsync, then (keys) casbox_store_open_keys();
   any failure aborts the test with its error. */
static inline struct casbox_store *
test_store_fixture_open(const char *root, const struct casbox_settings *set,
			bool keys)
{
	struct casbox_store *store;
	const char *error = NULL;

	if (casbox_store_open(root, set, FSYNC_MODE_ALWAYS,
			      FILE_LOCK_METHOD_FCNTL, &store, &error) < 0 ||
	    (keys && casbox_store_open_keys(store, &error) < 0))
		ck_abort_msg("store open: %s", error);
	return store;
}

/* The blob record of id as the LSM holds it: returns its refcount (0 =
   no record; val_r is then zeroed). val_r's pack record points into a
   data-stack buffer. */
static inline uint32_t
test_store_fixture_blob(const char *root, const struct casbox_settings *set,
			const struct cas_blob_id *id,
			struct casbox_blob_value *val_r)
{
	struct casbox_lsm *lsm;
	buffer_t *key = t_buffer_create(40), *value = t_buffer_create(256);
	const char *error = NULL;
	int ret;

	i_zero(val_r);
	if (test_store_lsm_open_set(root, set, FALSE, &lsm, &error) < 0)
		ck_abort_msg("lsm open: %s", error);
	casbox_key_blob(key, id);
	ret = casbox_lsm_get(lsm, key->data, key->used, value, &error);
	ck_assert_int_ge(ret, 0);
	if (ret > 0) {
		ck_assert_int_eq(casbox_blob_value_import(value->data,
			value->used, val_r, &error), 1);
	}
	test_store_lsm_close(&lsm);
	return ret > 0 ? val_r->refcount : 0;
}

/* Expunge (box, uid) in a transaction of its own; aborts on failure. */
static inline void
test_store_fixture_expunge(struct casbox_store *store,
			   const guid_128_t box, uint32_t uid)
{
	struct casbox_store_txn *txn;
	const char *error = NULL;

	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	ck_assert_int_eq(casbox_store_txn_expunge(txn, box, uid, &error), 0);
	ck_assert_int_eq(casbox_store_txn_commit(&txn, &error), 0);
}

/* All of input as a data-stack string, input unreferenced; a read
   error aborts the test. */
static inline const char *test_store_fixture_drain(struct istream **input)
{
	const unsigned char *data;
	size_t size;
	string_t *str = t_str_new(1024);

	while (i_stream_read_more(*input, &data, &size) > 0) {
		str_append_data(str, data, size);
		i_stream_skip(*input, size);
	}
	if ((*input)->stream_errno != 0)
		ck_abort_msg("read: %s", i_stream_get_error(*input));
	i_stream_unref(input);
	return str_c(str);
}

/* The bytes of message (box, uid) through casbox_store_msg_open() as a
   data-stack string, NULL if it has no record; a failed open or read
   aborts the test. */
static inline const char *
test_store_fixture_read(struct casbox_store *store, const guid_128_t box,
			uint32_t uid)
{
	struct casbox_msg_record rec;
	struct istream *input;
	const char *error = NULL;

	if (casbox_store_msg_lookup(store, box, uid, pool_datastack_create(),
				    &rec, &error) <= 0)
		return NULL;
	if (casbox_store_msg_open(store, &rec, &input, &error) <= 0)
		ck_abort_msg("open: %s", error);
	return test_store_fixture_drain(&input);
}

#endif
