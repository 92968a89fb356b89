/* cas-durable and every file writer that goes through it, under the
   crash simulator (tests/crashfs.c): crash at each counted operation
   (write, fsync, rename, link, directory fsync), with and without a torn
   write, then a power loss that keeps only what was synced (or a random
   part of unsynced appends too), then the real I/O reads the result.

   After every crash a file holds its old content or its new content,
   never a mix; what the writer acknowledged is there. That for the
   generic atomic write, key files (create and replace), packs (blob
   appends and commit), the quarantine's frame copies and casidx's
   manifest and segments. ENOSPC leaves the old file intact. */

#include "lib.h"
#include "buffer.h"
#include "istream.h"
#include "unlink-directory.h"
#include "cas-durable.h"
#include "cas-key.h"
#include "cas-keyfile.h"
#include "casbox-pack.h"
#include "casbox-store-quarantine.h"
#include "casidx-index.h"
#include "crashfs.h"

#include <check.h>
#include "check-run.h"
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

/* enough for every writer's operation count; a run that ends without
   a crash ends its matrix */
#define MAX_CRASH_OPS 400

static char *test_dir;

static void setup(void)
{
	char tmpl[] = "/tmp/check-durable.XXXXXX";

	ck_assert_ptr_nonnull(mkdtemp(tmpl));
	test_dir = i_strdup(tmpl);
}

static void teardown(void)
{
	const char *error;

	(void)unlink_directory(test_dir, UNLINK_DIRECTORY_FLAG_RMDIR, &error);
	i_free_and_null(test_dir);
}

static const char *sub_dir(const char *name)
{
	const char *dir = t_strdup_printf("%s/%s", test_dir, name);
	const char *error;

	(void)unlink_directory(dir, UNLINK_DIRECTORY_FLAG_RMDIR, &error);
	ck_assert_int_eq(mkdir(dir, 0700), 0);
	return dir;
}

static void fill(buffer_t *buf, size_t size, unsigned char seed)
{
	size_t i;

	buffer_set_used_size(buf, 0);
	for (i = 0; i < size; i++)
		buffer_append_c(buf, (unsigned char)(seed + i * 7 + i / 251));
}

static void put_file(const char *path, const buffer_t *data)
{
	const struct cas_durable_write_settings set = { .no_fsync = TRUE };
	const char *error;

	if (cas_durable_write_atomic(path, data->data, data->used, &set,
				     &error) < 0)
		ck_abort_msg("%s", error);
}

/* 1 and the content in buf, 0 missing */
static int get_file(const char *path, buffer_t *buf)
{
	const char *error;
	int ret;

	buffer_set_used_size(buf, 0);
	ret = cas_durable_read_file(NULL, path, (size_t)-1, buf, &error);
	if (ret < 0)
		ck_abort_msg("%s", error);
	return ret;
}

static bool buf_eq(const buffer_t *a, const buffer_t *b)
{
	return a->used == b->used && memcmp(a->data, b->data, a->used) == 0;
}

/* Nothing but path (and what the test put there) may be left: no
   temporary file survives a power loss with a durable name. */
static void assert_no_tmp(const char *dir)
{
	const char *cmd = t_strdup_printf(
		"ls -a '%s' | grep -q '\\.tmp$'", dir);

	ck_assert_msg(system(cmd) != 0, "a .tmp file survived in %s", dir);
}

/* ---- the generic atomic write ---- */

static bool atomic_run(unsigned int n, enum crashfs_fault fault,
		       enum crashfs_loss loss, bool no_replace)
{
	const char *dir = sub_dir("atomic");
	const char *path = t_strdup_printf("%s/file", dir);
	struct cas_durable_write_settings set = {
		.io = &crashfs_io,
		.no_replace = no_replace,
	};
	buffer_t *old = t_buffer_create(64), *new = t_buffer_create(9000);
	buffer_t *got = t_buffer_create(9000);
	const char *error;
	bool acked, completed;
	int ret;

	fill(old, 100, 1);
	fill(new, 9000, 2);
	if (!no_replace)
		put_file(path, old);
	crashfs_init(dir, n);
	crashfs_crash_at(n, fault);
	acked = cas_durable_write_atomic(path, new->data, new->used, &set,
					 &error) == 0;
	completed = !crashfs_crashed();
	crashfs_power_loss(loss);
	crashfs_deinit();

	ret = get_file(path, got);
	if (acked)
		ck_assert_msg(ret == 1 && buf_eq(got, new),
			      "op %u: acknowledged write lost", n);
	else if (no_replace)
		ck_assert_msg(ret == 0 || buf_eq(got, new),
			      "op %u: a partial file under the name", n);
	else
		ck_assert_msg(ret == 1 && (buf_eq(got, old) || buf_eq(got, new)),
			      "op %u: neither old nor new content", n);
	assert_no_tmp(dir);
	ck_assert(completed == acked);
	return completed;
}

static void atomic_matrix(bool no_replace)
{
	static const enum crashfs_fault faults[] = {
		CRASHFS_FAULT_CRASH, CRASHFS_FAULT_TORN
	};
	static const enum crashfs_loss losses[] = {
		CRASHFS_LOSS_DROP_UNSYNCED, CRASHFS_LOSS_KEEP_SOME
	};
	unsigned int f, l, n;

	for (f = 0; f < N_ELEMENTS(faults); f++)
	for (l = 0; l < N_ELEMENTS(losses); l++) {
		for (n = 1; n < MAX_CRASH_OPS; n++) T_BEGIN {
			if (atomic_run(n, faults[f], losses[l], no_replace))
				n = MAX_CRASH_OPS;
		} T_END;
	}
}

START_TEST(test_atomic_replace_crash)
{
	atomic_matrix(FALSE);
}
END_TEST

START_TEST(test_atomic_create_crash)
{
	atomic_matrix(TRUE);
}
END_TEST

START_TEST(test_atomic_enospc)
{
	const char *dir = sub_dir("enospc");
	const char *path = t_strdup_printf("%s/file", dir);
	const struct cas_durable_write_settings set = { .io = &crashfs_io };
	buffer_t *old = t_buffer_create(64), *new = t_buffer_create(9000);
	buffer_t *got = t_buffer_create(9000);
	const char *error;
	uoff_t budget;

	fill(old, 100, 1);
	fill(new, 9000, 2);
	put_file(path, old);
	for (budget = 0; budget < new->used; budget += 1000) {
		crashfs_init(dir, budget);
		crashfs_enospc_after(budget);
		ck_assert_int_eq(cas_durable_write_atomic(path, new->data,
			new->used, &set, &error), -1);
		ck_assert_ptr_nonnull(strstr(error, "No space left"));
		crashfs_deinit();
		ck_assert_int_eq(get_file(path, got), 1);
		ck_assert(buf_eq(got, old));
		assert_no_tmp(dir);
	}
}
END_TEST

START_TEST(test_read_file)
{
	const char *dir = sub_dir("read");
	const char *path = t_strdup_printf("%s/file", dir);
	buffer_t *data = t_buffer_create(64), *got = t_buffer_create(64);
	const char *error;

	ck_assert_int_eq(get_file(path, got), 0);
	fill(data, 5000, 3);
	put_file(path, data);
	ck_assert_int_eq(get_file(path, got), 1);
	ck_assert(buf_eq(got, data));
	buffer_set_used_size(got, 0);
	ck_assert_int_eq(cas_durable_read_file(NULL, path, 4999, got, &error),
			 -1);
	ck_assert_ptr_nonnull(strstr(error, "is corrupt"));
	ck_assert_uint_eq(got->used, 0);
}
END_TEST

/* ---- key files ---- */

/* a real key file's bytes and its key id */
static void key_file_bytes(const char *name, buffer_t *bytes_r,
			   uint32_t *key_id_r)
{
	const char *path = t_strdup_printf("%s/%s", test_dir, name);
	struct cas_keyring *keyring;
	const char *error;

	i_unlink_if_exists(path);

	if (cas_keyring_create(path, &keyring, &error) < 0)
		ck_abort_msg("%s", error);
	*key_id_r = cas_keyring_key_id(keyring);
	cas_keyring_free(&keyring);
	ck_assert_int_eq(get_file(path, bytes_r), 1);
}

/* 0 missing, else the key id of the file that loads */
static uint32_t key_file_id(const char *path)
{
	struct cas_keyring *keyring;
	const char *error;
	uint32_t id;
	int ret;

	ret = cas_keyring_load(path, &keyring, &error);
	if (ret == 0)
		return 0;
	if (ret < 0)
		ck_abort_msg("a crash left a key file that does not load: %s",
			     error);
	id = cas_keyring_key_id(keyring);
	cas_keyring_free(&keyring);
	return id;
}

static bool keyfile_run(unsigned int n, enum crashfs_fault fault,
			bool replace)
{
	const char *dir = sub_dir("keys");
	const char *path = t_strdup_printf("%s/user.key", dir);
	buffer_t *key_a = t_buffer_create(128), *key_b = t_buffer_create(128);
	uint32_t id_a, id_b, id;
	const char *error;
	bool acked, completed;

	key_file_bytes(t_strdup_printf("a%u", n), key_a, &id_a);
	key_file_bytes(t_strdup_printf("b%u", n), key_b, &id_b);
	ck_assert_uint_ne(id_a, id_b);
	if (replace)
		put_file(path, key_a);
	crashfs_init(dir, n);
	crashfs_crash_at(n, fault);
	acked = cas_keyfile_write_atomic_io(&crashfs_io, path, key_b->data,
					    key_b->used, NULL, replace,
					    &error) == 0;
	completed = !crashfs_crashed();
	crashfs_power_loss(CRASHFS_LOSS_KEEP_SOME);
	crashfs_deinit();

	id = key_file_id(path);
	if (acked)
		ck_assert_msg(id == id_b, "op %u: acknowledged key lost", n);
	else if (replace)
		ck_assert_msg(id == id_a || id == id_b,
			      "op %u: the old key is gone, no new one", n);
	else
		ck_assert_msg(id == 0 || id == id_b, "op %u: key %u", n, id);
	assert_no_tmp(dir);
	return completed;
}

START_TEST(test_keyfile_crash)
{
	static const enum crashfs_fault faults[] = {
		CRASHFS_FAULT_CRASH, CRASHFS_FAULT_TORN
	};
	unsigned int f, n, replace;

	for (replace = 0; replace < 2; replace++)
	for (f = 0; f < N_ELEMENTS(faults); f++) {
		for (n = 1; n < MAX_CRASH_OPS; n++) T_BEGIN {
			if (keyfile_run(n, faults[f], replace != 0))
				n = MAX_CRASH_OPS;
		} T_END;
	}
}
END_TEST

/* ---- packs ---- */

#define PACK_BLOBS 3

static struct cas_keyring *test_keyring(void)
{
	unsigned char kek[CAS_KEK_SIZE];

	memset(kek, 0x5a, sizeof(kek));
	return cas_keyring_create_from_kek(kek);
}

static struct casbox_pack_store *
pack_open(const char *dir, const struct cas_io *io,
	  const struct cas_keyring *keyring)
{
	struct casbox_pack_settings set;
	struct casbox_pack_store *store;
	const char *error;

	i_zero(&set);
	set.dir = dir;
	set.fsync = TRUE;
	set.io = io;
	if (casbox_pack_store_open(&set, keyring, &store, &error) < 0)
		ck_abort_msg("pack store open: %s", error);
	return store;
}

/* 1 the exact bytes, 0 a read error (EIO), never other bytes */
static int pack_read(struct casbox_pack_store *store,
		     const struct cas_blob_id *id,
		     const struct casbox_blob_record *rec,
		     const buffer_t *want)
{
	struct istream *input = casbox_pack_blob_open(store, id, rec);
	buffer_t *got = t_buffer_create(want->used);
	const unsigned char *data;
	size_t size;
	int ret;

	while ((ret = i_stream_read_more(input, &data, &size)) > 0) {
		buffer_append(got, data, size);
		i_stream_skip(input, size);
	}
	ret = input->stream_errno == 0 ? 1 : 0;
	if (ret == 0)
		ck_assert_int_eq(input->stream_errno, EIO);
	i_stream_unref(&input);
	if (ret == 1)
		ck_assert_msg(buf_eq(got, want), "a blob read other bytes");
	return ret;
}

static bool pack_run(unsigned int n, enum crashfs_fault fault,
		     enum crashfs_loss loss)
{
	const char *dir = sub_dir("packs");
	struct cas_keyring *keyring = test_keyring();
	struct casbox_pack_store *store;
	struct casbox_pack_txn *txn;
	struct casbox_blob_record recs[PACK_BLOBS * 2];
	struct cas_blob_id ids[PACK_BLOBS * 2];
	buffer_t *blobs[PACK_BLOBS * 2];
	struct istream *input;
	unsigned int i, added = 0, acked = 0;
	const char *error;
	bool completed;

	for (i = 0; i < PACK_BLOBS * 2; i++) {
		blobs[i] = t_buffer_create(70000);
		fill(blobs[i], 1000 + i * 33000, i + 10);
		cas_blob_id_compute(keyring, blobs[i]->data, blobs[i]->used,
				    &ids[i]);
	}
	crashfs_init(dir, n);
	crashfs_crash_at(n, fault);
	store = pack_open(dir, &crashfs_io, keyring);
	/* two transactions of three blobs */
	for (i = 0; i < PACK_BLOBS * 2; i++) {
		if (i % PACK_BLOBS == 0 &&
		    casbox_pack_txn_begin(store, &txn, &error) < 0)
			break;
		input = i_stream_create_from_data(blobs[i]->data,
						  blobs[i]->used);
		if (casbox_pack_txn_add(txn, &ids[i], input, &recs[i],
					&error) < 0) {
			i_stream_unref(&input);
			casbox_pack_txn_rollback(&txn);
			break;
		}
		i_stream_unref(&input);
		added = i + 1;
		if (i % PACK_BLOBS == PACK_BLOBS - 1) {
			if (casbox_pack_txn_commit(&txn, &error) < 0)
				break;
			acked = i + 1;
		}
	}
	casbox_pack_store_close(&store);
	completed = !crashfs_crashed();
	crashfs_power_loss(loss);
	crashfs_deinit();

	store = pack_open(dir, NULL, keyring);
	for (i = 0; i < added; i++) {
		if (pack_read(store, &ids[i], &recs[i], blobs[i]) == 0)
			ck_assert_msg(i >= acked, "op %u: acknowledged blob "
				      "%u unreadable", n, i);
	}
	/* and it takes appends again */
	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	input = i_stream_create_from_data(blobs[0]->data, blobs[0]->used);
	ck_assert_int_eq(casbox_pack_txn_add(txn, &ids[0], input, &recs[0],
					     &error), 1);
	i_stream_unref(&input);
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
	ck_assert_int_eq(pack_read(store, &ids[0], &recs[0], blobs[0]), 1);
	casbox_pack_store_close(&store);
	cas_keyring_free(&keyring);
	ck_assert(!completed || acked == PACK_BLOBS * 2);
	return completed;
}

START_TEST(test_pack_crash)
{
	static const enum crashfs_fault faults[] = {
		CRASHFS_FAULT_CRASH, CRASHFS_FAULT_TORN
	};
	static const enum crashfs_loss losses[] = {
		CRASHFS_LOSS_DROP_UNSYNCED, CRASHFS_LOSS_KEEP_SOME
	};
	unsigned int f, l, n;

	for (f = 0; f < N_ELEMENTS(faults); f++)
	for (l = 0; l < N_ELEMENTS(losses); l++) {
		for (n = 1; n < MAX_CRASH_OPS; n++) T_BEGIN {
			if (pack_run(n, faults[f], losses[l]))
				n = MAX_CRASH_OPS;
		} T_END;
	}
}
END_TEST

/* ---- the quarantine's frame copies ---- */

static bool quarantine_run(unsigned int n, enum crashfs_fault fault)
{
	const char *src_dir = sub_dir("qsrc"), *dir = sub_dir("quarantine");
	const char *pack_path = t_strdup_printf("%s/pack", src_dir);
	const char *path = t_strdup_printf("%s/blob.frame", dir);
	buffer_t *pack = t_buffer_create(20000), *got = t_buffer_create(9000);
	buffer_t *want = t_buffer_create(9000);
	const char *error;
	bool acked, completed;
	int ret;

	fill(pack, 20000, 4);
	put_file(pack_path, pack);
	buffer_append(want, CONST_PTR_OFFSET(pack->data, 3000), 9000);
	crashfs_init(dir, n);
	crashfs_crash_at(n, fault);
	acked = casbox_quarantine_copy_frame(&crashfs_io, pack_path, path,
					     3000, 9000, &error) == 0;
	completed = !crashfs_crashed();
	crashfs_power_loss(CRASHFS_LOSS_KEEP_SOME);
	crashfs_deinit();

	ret = get_file(path, got);
	if (acked)
		ck_assert_msg(ret == 1 && buf_eq(got, want),
			      "op %u: acknowledged copy lost", n);
	else
		ck_assert_msg(ret == 0 || buf_eq(got, want),
			      "op %u: a partial copy under the name", n);
	assert_no_tmp(dir);
	return completed;
}

START_TEST(test_quarantine_crash)
{
	unsigned int n;

	for (n = 1; n < MAX_CRASH_OPS; n++) T_BEGIN {
		if (quarantine_run(n, CRASHFS_FAULT_TORN))
			n = MAX_CRASH_OPS;
	} T_END;
	for (n = 1; n < MAX_CRASH_OPS; n++) T_BEGIN {
		if (quarantine_run(n, CRASHFS_FAULT_CRASH))
			n = MAX_CRASH_OPS;
	} T_END;
}
END_TEST

/* ---- casidx's manifest and segments ---- */

static int casidx_commit(struct casidx_index *index, uint32_t first,
			 uint32_t last, const char **error_r)
{
	struct casidx_index_writer *w = casidx_index_writer_begin(index);
	uint32_t uid;

	for (uid = first; uid <= last; uid++) {
		casidx_index_writer_add_doc(w, uid);
		casidx_index_writer_add_term(w, CASIDX_FIELD_BODY,
					     "shared", 6);
		if (casidx_index_writer_doc_done(w, error_r) < 0) {
			casidx_index_writer_rollback(&w);
			return -1;
		}
	}
	return casidx_index_writer_commit(&w, error_r);
}

static void count_shared(struct casidx_segment *seg ATTR_UNUSED,
			 const unsigned char *term ATTR_UNUSED,
			 size_t term_len ATTR_UNUSED,
			 const roaring_bitmap_t *docs,
			 const uint32_t *tfs ATTR_UNUSED, void *context)
{
	uint64_t *count = context;

	*count += roaring_bitmap_get_cardinality(docs);
}

static bool casidx_run(unsigned int n, enum crashfs_fault fault)
{
	const char *dir = sub_dir("casidx");
	struct casidx_index_settings set = { .merge_threshold = 100 };
	struct casidx_index *index;
	const char *error;
	uint64_t count = 0;
	bool acked, completed;
	uint32_t last;

	index = casidx_index_init(dir, &set);
	ck_assert_int_eq(casidx_commit(index, 1, 10, &error), 0);
	casidx_index_deinit(&index);

	set.io = &crashfs_io;
	crashfs_init(dir, n);
	crashfs_crash_at(n, fault);
	index = casidx_index_init(dir, &set);
	acked = casidx_index_refresh(index, &error) >= 0 &&
		casidx_commit(index, 11, 20, &error) == 0;
	casidx_index_deinit(&index);
	completed = !crashfs_crashed();
	crashfs_power_loss(CRASHFS_LOSS_KEEP_SOME);
	crashfs_deinit();

	set.io = NULL;
	index = casidx_index_init(dir, &set);
	if (casidx_index_refresh(index, &error) < 0)
		ck_abort_msg("op %u: refresh after the crash: %s", n, error);
	ck_assert_msg(!casidx_index_is_corrupted(index), "op %u", n);
	last = casidx_index_get_last_uid(index);
	ck_assert_msg(last == 20 || (!acked && last == 10),
		      "op %u: last uid %u (acked %d)", n, last, acked);
	ck_assert_int_eq(casidx_index_scan(index, CASIDX_FIELD_BODY,
					   "shared", 6, CASIDX_MATCH_EXACT,
					   count_shared, &count, &error), 1);
	ck_assert_uint_eq(count, last);
	casidx_index_deinit(&index);
	return completed;
}

START_TEST(test_casidx_crash)
{
	unsigned int n;

	for (n = 1; n < MAX_CRASH_OPS; n++) T_BEGIN {
		if (casidx_run(n, CRASHFS_FAULT_TORN))
			n = MAX_CRASH_OPS;
	} T_END;
	for (n = 1; n < MAX_CRASH_OPS; n++) T_BEGIN {
		if (casidx_run(n, CRASHFS_FAULT_CRASH))
			n = MAX_CRASH_OPS;
	} T_END;
}
END_TEST

int main(void)
{
	Suite *s = suite_create("durable");
	TCase *tc_atomic = tcase_create("atomic");
	TCase *tc_users = tcase_create("users");
	int failed;

	lib_init();
	tcase_add_checked_fixture(tc_atomic, setup, teardown);
	tcase_add_test(tc_atomic, test_read_file);
	tcase_add_test(tc_atomic, test_atomic_replace_crash);
	tcase_add_test(tc_atomic, test_atomic_create_crash);
	tcase_add_test(tc_atomic, test_atomic_enospc);
	suite_add_tcase(s, tc_atomic);
	tcase_add_checked_fixture(tc_users, setup, teardown);
	tcase_add_test(tc_users, test_keyfile_crash);
	tcase_add_test(tc_users, test_pack_crash);
	tcase_add_test(tc_users, test_quarantine_crash);
	tcase_add_test(tc_users, test_casidx_crash);
	suite_add_tcase(s, tc_users);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
