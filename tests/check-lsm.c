/* casbox-lsm: point operations, a model-based random test against an
   in-memory map (with flush, compaction and reopen steps), prefix and
   seek iteration, lock timeouts, corruption detection, and several
   processes writing at once. */

#include "lib.h"
#include "buffer.h"
#include "str.h"
#include "unlink-directory.h"
#include "casbox-lsm.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/wait.h>
#include <dirent.h>

#define N_MAILBOXES 4
#define N_UIDS 300
#define N_KEYS (N_MAILBOXES * N_UIDS)

static char test_dir[256];

static void test_dir_setup(void)
{
	const char *tmp = getenv("TMPDIR");

	i_snprintf(test_dir, sizeof(test_dir), "%s/check-lsm.XXXXXX",
		   tmp != NULL ? tmp : "/tmp");
	if (mkdtemp(test_dir) == NULL)
		i_fatal("mkdtemp(%s) failed: %m", test_dir);
}

static void test_dir_teardown(void)
{
	const char *error;

	if (unlink_directory(test_dir, UNLINK_DIRECTORY_FLAG_RMDIR,
			     &error) < 0)
		i_error("%s", error);
}

static unsigned int count_files(const char *suffix)
{
	struct dirent *d;
	unsigned int count = 0;
	DIR *dir = opendir(test_dir);

	ck_assert(dir != NULL);
	while ((d = readdir(dir)) != NULL) {
		if (strstr(d->d_name, suffix) != NULL)
			count++;
	}
	(void)closedir(dir);
	return count;
}

static struct casbox_lsm *test_open(size_t flush_bytes)
{
	struct casbox_lsm_settings set = {
		.dir = test_dir,
		.fsync = TRUE,
		.lock_method = FILE_LOCK_METHOD_FCNTL,
		.lock_timeout_secs = 10,
		.wal_flush_bytes = flush_bytes,
	};
	struct casbox_lsm *lsm;
	const char *error;

	if (casbox_lsm_open(&set, &lsm, &error) < 0)
		ck_abort_msg("open: %s", error);
	return lsm;
}

/* key id -> "m<mb>" + u32 BE uid; ids sort like their keys */
static void key_make(unsigned int id, unsigned char key[6])
{
	unsigned int uid = id % N_UIDS;

	key[0] = 'm';
	key[1] = '0' + id / N_UIDS;
	key[2] = uid >> 24; key[3] = uid >> 16; key[4] = uid >> 8;
	key[5] = uid;
}

static void put_str(struct casbox_lsm_batch *batch, const char *key,
		    const char *value)
{
	casbox_lsm_batch_put(batch, key, strlen(key), value, strlen(value));
}

static int get_str(struct casbox_lsm *lsm, const char *key, string_t *value)
{
	const char *error;
	int ret;

	str_truncate(value, 0);
	ret = casbox_lsm_get(lsm, key, strlen(key), value, &error);
	if (ret < 0)
		ck_abort_msg("get: %s", error);
	return ret;
}

static void commit(struct casbox_lsm_batch **batch)
{
	const char *error;

	if (casbox_lsm_batch_commit(batch, &error) < 0)
		ck_abort_msg("commit: %s", error);
}

static struct casbox_lsm_batch *begin(struct casbox_lsm *lsm)
{
	struct casbox_lsm_batch *batch;
	const char *error;

	if (casbox_lsm_batch_begin(lsm, &batch, &error) < 0)
		ck_abort_msg("begin: %s", error);
	return batch;
}

START_TEST(test_basic)
{
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	string_t *value = t_str_new(64);
	const char *error;

	test_dir_setup();
	lsm = test_open(0);
	ck_assert_int_eq(get_str(lsm, "a", value), 0);
	batch = begin(lsm);
	put_str(batch, "a", "1");
	put_str(batch, "b", "2");
	put_str(batch, "a", "3");
	/* not visible before commit */
	ck_assert_int_eq(get_str(lsm, "a", value), 0);
	commit(&batch);
	ck_assert_int_eq(get_str(lsm, "a", value), 1);
	ck_assert_str_eq(str_c(value), "3");

	batch = begin(lsm);
	casbox_lsm_batch_delete(batch, "b", 1);
	put_str(batch, "c", "");
	casbox_lsm_batch_rollback(&batch);
	ck_assert_int_eq(get_str(lsm, "b", value), 1);
	ck_assert_int_eq(get_str(lsm, "c", value), 0);

	batch = begin(lsm);
	casbox_lsm_batch_delete(batch, "b", 1);
	put_str(batch, "c", "");
	commit(&batch);
	casbox_lsm_close(&lsm);

	lsm = test_open(0);
	ck_assert_int_eq(get_str(lsm, "a", value), 1);
	ck_assert_str_eq(str_c(value), "3");
	ck_assert_int_eq(get_str(lsm, "b", value), 0);
	ck_assert_int_eq(get_str(lsm, "c", value), 1);
	ck_assert_str_eq(str_c(value), "");
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
	ck_assert_int_eq(get_str(lsm, "a", value), 1);
	ck_assert_str_eq(str_c(value), "3");
	ck_assert_int_eq(get_str(lsm, "b", value), 0);
	casbox_lsm_close(&lsm);
	lsm = test_open(0);
	ck_assert_int_eq(get_str(lsm, "c", value), 1);
	ck_assert_int_eq(get_str(lsm, "b", value), 0);
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}
END_TEST

/* ---- model test ---- */

struct model {
	char *values[N_KEYS];
};

static void model_free(struct model *m)
{
	unsigned int i;

	for (i = 0; i < N_KEYS; i++)
		i_free(m->values[i]);
}

static void check_get(struct casbox_lsm *lsm, struct model *m,
		      unsigned int id)
{
	unsigned char key[6];
	buffer_t *value = t_buffer_create(64);
	const char *error;
	int ret;

	key_make(id, key);
	ret = casbox_lsm_get(lsm, key, sizeof(key), value, &error);
	ck_assert_msg(ret >= 0, "get: %s", error);
	if (m->values[id] == NULL) {
		ck_assert_msg(ret == 0, "key %u should be absent", id);
	} else {
		ck_assert_msg(ret == 1, "key %u should be present", id);
		ck_assert_uint_eq(value->used, strlen(m->values[id]));
		ck_assert(memcmp(value->data, m->values[id],
				 value->used) == 0);
	}
}

/* Iterate mailbox mb from uid start and compare with the model. */
static void check_iter(struct casbox_lsm *lsm, struct model *m,
		       unsigned int mb, unsigned int start_uid)
{
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	unsigned char prefix[2] = { 'm', '0' + mb }, start[6];
	size_t key_size, value_size;
	unsigned int id = mb * N_UIDS + start_uid, end = (mb + 1) * N_UIDS;
	const char *error;

	iter = casbox_lsm_iter_init(lsm, prefix, sizeof(prefix));
	if (start_uid > 0) {
		key_make(id, start);
		casbox_lsm_iter_seek(iter, start, sizeof(start));
	}
	while (casbox_lsm_iter_next(iter, &key, &key_size, &value,
				    &value_size)) {
		unsigned char expect[6];

		while (id < end && m->values[id] == NULL)
			id++;
		ck_assert_msg(id < end, "iteration returned an extra key");
		key_make(id, expect);
		ck_assert_uint_eq(key_size, 6);
		ck_assert_msg(memcmp(key, expect, 6) == 0,
			      "iteration key mismatch at id %u", id);
		ck_assert_uint_eq(value_size, strlen(m->values[id]));
		ck_assert(memcmp(value, m->values[id], value_size) == 0);
		id++;
	}
	while (id < end && m->values[id] == NULL)
		id++;
	ck_assert_msg(id == end, "iteration missed key %u", id);
	ck_assert_int_eq(casbox_lsm_iter_deinit(&iter, &error), 1);
}

static void random_batch(struct casbox_lsm *lsm, struct model *m)
{
	struct casbox_lsm_batch *batch = begin(lsm);
	unsigned int i, n = 1 + i_rand_limit(20), id;
	unsigned char key[6];
	const char *value;
	static char big[3001];

	if (big[0] == '\0')
		memset(big, 'x', sizeof(big) - 1);
	for (i = 0; i < n; i++) {
		id = i_rand_limit(N_KEYS);
		key_make(id, key);
		i_free(m->values[id]);
		if (i_rand_limit(4) == 0) {
			casbox_lsm_batch_delete(batch, key, sizeof(key));
			continue;
		}
		value = t_strdup_printf("v%u-%u-%s", id, i_rand(),
			i_rand_limit(3) == 0 ?
			t_strndup(big, i_rand_limit(3000)) : "");
		m->values[id] = i_strdup(value);
		casbox_lsm_batch_put(batch, key, sizeof(key), value,
				     strlen(value));
	}
	commit(&batch);
}

START_TEST(test_model)
{
	struct casbox_lsm *lsm;
	struct model m;
	const char *error;
	unsigned int step, op, i;

	i_zero(&m);
	test_dir_setup();
	/* small flush threshold: many flushes and tiered merges */
	lsm = test_open(16 * 1024);
	for (step = 0; step < 3000; step++) T_BEGIN {
		op = i_rand_limit(100);
		if (op < 60)
			random_batch(lsm, &m);
		else if (op < 80)
			check_get(lsm, &m, i_rand_limit(N_KEYS));
		else if (op < 95)
			check_iter(lsm, &m, i_rand_limit(N_MAILBOXES),
				   i_rand_limit(3) == 0 ?
				   i_rand_limit(N_UIDS) : 0);
		else if (op < 98) {
			casbox_lsm_close(&lsm);
			lsm = test_open(16 * 1024);
		} else {
			ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
		}
	} T_END;
	for (i = 0; i < N_KEYS; i++)
		check_get(lsm, &m, i);
	/* the run must have gone through flushes: tables exist, and the
	   tiered merge keeps their number bounded */
	ck_assert_uint_ge(count_files(".sst"), 1);
	ck_assert_uint_le(count_files(".sst"), 7);
	ck_assert_uint_eq(count_files(".wal"), 1);
	casbox_lsm_close(&lsm);
	lsm = test_open(0);
	for (i = 0; i < N_MAILBOXES; i++)
		check_iter(lsm, &m, i, 0);
	ck_assert_int_eq(casbox_lsm_verify(lsm, NULL, NULL, &error), 1);
	casbox_lsm_close(&lsm);
	model_free(&m);
	test_dir_teardown();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("lsm");
	TCase *tc = tcase_create("lsm");
	SRunner *sr;
	int failed;

	lib_init();
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_basic);
	tcase_add_test(tc, test_model);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
