/* casbox-lsm: point operations, a model-based random test against an
   in-memory map (with flush, compaction and reopen steps), prefix and
   seek iteration, lock timeouts, corruption detection, and several
   processes writing at once. */

#include "lib.h"
#include "buffer.h"
#include "str.h"
#include "strnum.h"
#include "lib-signals.h"
#include "unlink-directory.h"
#include "cas-io.h"
#include "casbox-lsm.h"

#include <check.h>
#include "check-run.h"
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/wait.h>
#include <signal.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/file.h>

#define N_MAILBOXES 4
#define N_UIDS 300
#define N_KEYS (N_MAILBOXES * N_UIDS)

static char test_dir[256];

/* ---- sealing: a test key per epoch (the store passes the key ring's) ---- */

/* epochs 0..test_max_epoch exist; new files use test_epoch */
static uint32_t test_epoch, test_max_epoch;
/* added to every key byte: another key with the same fingerprint */
static unsigned char test_key_salt;

static uint32_t test_codec_epoch(void *context ATTR_UNUSED)
{
	return test_epoch;
}

static int test_codec_key(void *context ATTR_UNUSED, uint32_t epoch,
			  unsigned char key_r[CASBOX_LSM_KEY_SIZE],
			  const char **error_r)
{
	unsigned int i;

	if (epoch > test_max_epoch) {
		*error_r = t_strdup_printf("test key has no epoch %u", epoch);
		return -1;
	}
	for (i = 0; i < CASBOX_LSM_KEY_SIZE; i++)
		key_r[i] = 0x5a ^ (epoch * 31 + i * 7 + test_key_salt);
	return 0;
}

static struct casbox_lsm_codec test_sealed_codec = {
	.current_epoch = test_codec_epoch,
	.get_key = test_codec_key,
	.fingerprint = { 'f', 'p', '1' },
};
/* NULL: plaintext (tcase "lsm"), &test_sealed_codec (tcase "sealed") */
static const struct casbox_lsm_codec *test_codec;
/* the WAL header size of the current mode */
static unsigned int test_wal_hdr = 24;

static void test_plain_setup(void)
{
	test_codec = NULL;
	test_wal_hdr = 24;
}

static void test_sealed_setup(void)
{
	test_codec = &test_sealed_codec;
	test_wal_hdr = 32;
	test_epoch = test_max_epoch = 0;
	test_key_salt = 0;
}

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

static const char *find_file(const char *suffix);

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

static struct casbox_lsm *
test_open_method(size_t flush_bytes, enum file_lock_method method)
{
	struct casbox_lsm_settings set = {
		.codec = test_codec,
		.dir = test_dir,
		.fsync = TRUE,
		.lock_method = method,
		.lock_timeout_secs = 60,
		.wal_flush_bytes = flush_bytes,
	};
	struct casbox_lsm *lsm;
	const char *error;

	if (casbox_lsm_open(&set, &lsm, &error) < 0)
		ck_abort_msg("open: %s", error);
	return lsm;
}

static struct casbox_lsm *test_open(size_t flush_bytes)
{
	return test_open_method(flush_bytes, FILE_LOCK_METHOD_FCNTL);
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

/* Every key deleted, then compacted: the merge drops every tombstone
   and writes no table at all (an empty table has nothing for its bloom
   filter and block index), and the store reopens empty. */
START_TEST(test_compact_all_deleted)
{
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	struct casbox_lsm_iter *iter;
	string_t *value = t_str_new(64);
	const unsigned char *key, *val;
	size_t key_size, val_size;
	const char *error;
	unsigned int i;

	test_dir_setup();
	lsm = test_open(0);
	batch = begin(lsm);
	for (i = 0; i < 100; i++)
		put_str(batch, t_strdup_printf("k%03u", i), "v");
	commit(&batch);
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
	batch = begin(lsm);
	for (i = 0; i < 100; i++)
		casbox_lsm_batch_delete(batch, t_strdup_printf("k%03u", i), 4);
	commit(&batch);
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
	ck_assert_int_eq(get_str(lsm, "k000", value), 0);
	casbox_lsm_close(&lsm);

	lsm = test_open(0);
	iter = casbox_lsm_iter_init(lsm, "", 0);
	ck_assert(!casbox_lsm_iter_next(iter, &key, &key_size,
					&val, &val_size));
	ck_assert_int_eq(casbox_lsm_iter_deinit(&iter, &error), 1);
	/* and it takes new keys */
	batch = begin(lsm);
	put_str(batch, "k050", "again");
	commit(&batch);
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
	ck_assert_int_eq(get_str(lsm, "k050", value), 1);
	ck_assert_str_eq(str_c(value), "again");
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}
END_TEST

/* An iterator reads the snapshot of its init: commits, flushes and
   merges made meanwhile (by this handle) do not change what it
   returns. */
START_TEST(test_iter_snapshot)
{
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	unsigned int i, n = 0;
	const char *error;

	test_dir_setup();
	lsm = test_open(1024);
	for (i = 0; i < 100; i += 2) {
		batch = begin(lsm);
		put_str(batch, t_strdup_printf("s%03u", i), "old");
		commit(&batch);
	}
	iter = casbox_lsm_iter_init(lsm, "s", 1);
	while (casbox_lsm_iter_next(iter, &key, &key_size, &value,
				    &value_size)) {
		ck_assert_uint_eq(value_size, 3);
		ck_assert(memcmp(value, "old", 3) == 0);
		ck_assert(memcmp(key, t_strdup_printf("s%03u", n * 2),
				 4) == 0);
		n++;
		/* overwrite, insert between, delete ahead: with a 1 KiB
		   threshold these commits flush and merge under us */
		batch = begin(lsm);
		for (i = 0; i < 100; i++) {
			put_str(batch, t_strdup_printf("s%03u", i),
				"new-value-new-value");
		}
		casbox_lsm_batch_delete(batch, "s098", 4);
		commit(&batch);
	}
	ck_assert_int_eq(casbox_lsm_iter_deinit(&iter, &error), 1);
	ck_assert_uint_eq(n, 50);
	ck_assert_int_eq(casbox_lsm_get(lsm, "s098", 4, t_str_new(8),
					&error), 0);
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

/* ---- several processes ---- */

#define MP_WRITERS 3
#define MP_BATCHES 150

static void mp_get_uint(struct casbox_lsm *lsm, const char *key,
			unsigned int *value_r)
{
	string_t *value = t_str_new(32);

	*value_r = 0;
	if (get_str(lsm, key, value) > 0 &&
	    str_to_uint(str_c(value), value_r) < 0)
		i_fatal("bad counter value");
}

/* Each batch bumps the shared counter (read-modify-write under the
   batch lock) and writes its own key plus its "last" marker. */
static int mp_writer(unsigned int w, enum file_lock_method method)
{
	struct casbox_lsm *lsm = test_open_method(2048, method);
	struct casbox_lsm_batch *batch;
	unsigned int i, counter;

	for (i = 0; i < MP_BATCHES; i++) T_BEGIN {
		batch = begin(lsm);
		mp_get_uint(lsm, "counter", &counter);
		put_str(batch, "counter", dec2str(counter + 1));
		put_str(batch, t_strdup_printf("w%u-%04u", w, i),
			t_strdup_printf("%u", i));
		put_str(batch, t_strdup_printf("w%u-last", w), dec2str(i));
		commit(&batch);
	} T_END;
	casbox_lsm_close(&lsm);
	return 0;
}

/* A reader never sees a "last" marker before the keys it covers. */
static int mp_reader(enum file_lock_method method)
{
	struct casbox_lsm *lsm = test_open_method(2048, method);
	string_t *value = t_str_new(32);
	const char *error;
	unsigned int round, w, last, prev_counter = 0, counter;

	for (round = 0; round < 300; round++) T_BEGIN {
		if (casbox_lsm_refresh(lsm, &error) < 0)
			i_fatal("refresh: %s", error);
		mp_get_uint(lsm, "counter", &counter);
		if (counter < prev_counter)
			i_fatal("counter went backwards");
		prev_counter = counter;
		for (w = 0; w < MP_WRITERS; w++) {
			if (get_str(lsm, t_strdup_printf("w%u-last", w),
				    value) == 0)
				continue;
			if (str_to_uint(str_c(value), &last) < 0)
				i_fatal("bad last");
			if (get_str(lsm, t_strdup_printf("w%u-%04u", w, last),
				    value) != 1)
				i_fatal("marker %u of writer %u visible "
					"before its key", last, w);
		}
	} T_END;
	casbox_lsm_close(&lsm);
	return 0;
}

static void mp_run(enum file_lock_method method)
{
	struct casbox_lsm *lsm;
	pid_t pids[MP_WRITERS + 1];
	unsigned int i, w, counter;
	string_t *value = t_str_new(32);
	int status;

	test_dir_setup();
	/* create the store first, so the children race on data only */
	lsm = test_open_method(2048, method);
	casbox_lsm_close(&lsm);
	for (i = 0; i <= MP_WRITERS; i++) {
		pids[i] = fork();
		ck_assert(pids[i] != -1);
		if (pids[i] == 0) {
			_exit(i < MP_WRITERS ? mp_writer(i, method) :
			      mp_reader(method));
		}
	}
	for (i = 0; i <= MP_WRITERS; i++) {
		ck_assert(waitpid(pids[i], &status, 0) == pids[i]);
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
			      "child %u failed (status %d)", i, status);
	}
	lsm = test_open_method(2048, method);
	mp_get_uint(lsm, "counter", &counter);
	ck_assert_uint_eq(counter, MP_WRITERS * MP_BATCHES);
	for (w = 0; w < MP_WRITERS; w++) {
		for (i = 0; i < MP_BATCHES; i++) {
			ck_assert_int_eq(get_str(lsm, t_strdup_printf(
				"w%u-%04u", w, i), value), 1);
			ck_assert_str_eq(str_c(value), dec2str(i));
		}
	}
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}

START_TEST(test_multiprocess_fcntl)
{
	mp_run(FILE_LOCK_METHOD_FCNTL);
}
END_TEST

START_TEST(test_multiprocess_flock)
{
	mp_run(FILE_LOCK_METHOD_FLOCK);
}
END_TEST

START_TEST(test_multiprocess_dotlock)
{
	mp_run(FILE_LOCK_METHOD_DOTLOCK);
}
END_TEST

/* A second process waiting for the lock gets a clear timeout. */
START_TEST(test_lock_timeout)
{
	struct casbox_lsm_settings set = {
		.codec = test_codec,
		.dir = NULL,
		.fsync = TRUE,
		.lock_method = FILE_LOCK_METHOD_FCNTL,
		.lock_timeout_secs = 1,
	};
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	const char *error;
	int to_child[2], from_child[2], status;
	char c;
	pid_t pid;

	test_dir_setup();
	set.dir = test_dir;
	ck_assert(pipe(to_child) == 0 && pipe(from_child) == 0);
	pid = fork();
	ck_assert(pid != -1);
	if (pid == 0) {
		lsm = test_open(0);
		batch = begin(lsm);
		if (write(from_child[1], "l", 1) != 1 ||
		    read(to_child[0], &c, 1) != 1)
			_exit(1);
		casbox_lsm_batch_rollback(&batch);
		casbox_lsm_close(&lsm);
		_exit(0);
	}
	/* the child holds the lock once it wrote to the pipe */
	ck_assert(read(from_child[0], &c, 1) == 1);
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	ck_assert_int_eq(casbox_lsm_batch_begin(lsm, &batch, &error), -1);
	ck_assert_msg(strstr(error, "Timeout") != NULL &&
		      strstr(error, "LOCK") != NULL, "error: %s", error);
	ck_assert(write(to_child[1], "u", 1) == 1);
	ck_assert(waitpid(pid, &status, 0) == pid);
	ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* released: now it works */
	ck_assert_int_eq(casbox_lsm_batch_begin(lsm, &batch, &error), 1);
	casbox_lsm_batch_rollback(&batch);
	casbox_lsm_close(&lsm);
	i_close_fd(&to_child[0]); i_close_fd(&to_child[1]);
	i_close_fd(&from_child[0]); i_close_fd(&from_child[1]);
	test_dir_teardown();
}
END_TEST

/* kill -9 of a writer at a random moment (mid-commit, mid-flush or
   mid-merge): every batch it reported as committed is there after
   reopen, and the store takes writes again. */
START_TEST(test_sigkill_writer)
{
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	string_t *value = t_str_new(32);
	unsigned int round, i, acked;
	int fds[2], status;
	ssize_t ret;
	pid_t pid;

	test_dir_setup();
	for (round = 0; round < 8; round++) {
		ck_assert(pipe(fds) == 0);
		pid = fork();
		ck_assert(pid != -1);
		if (pid == 0) {
			i_close_fd(&fds[0]);
			lsm = test_open(4096);
			for (i = 0;; i++) T_BEGIN {
				batch = begin(lsm);
				put_str(batch, t_strdup_printf("r%u-%06u",
					round, i), t_strdup_printf(
					"%u-%0200u", i, i));
				put_str(batch, t_strdup_printf("r%u-last",
					round), dec2str(i));
				commit(&batch);
				if (write(fds[1], &i, sizeof(i)) != sizeof(i))
					_exit(1);
			} T_END;
		}
		i_close_fd(&fds[1]);
		/* let it run for a varying number of commits */
		acked = 0;
		for (i = 0; i < 50 + round * 97; i++) {
			ret = read(fds[0], &acked, sizeof(acked));
			ck_assert(ret == sizeof(acked));
		}
		ck_assert(kill(pid, SIGKILL) == 0);
		/* whatever it acked before dying counts too */
		while (read(fds[0], &acked, sizeof(acked)) == sizeof(acked)) ;
		ck_assert(waitpid(pid, &status, 0) == pid);
		i_close_fd(&fds[0]);

		lsm = test_open(4096);
		for (i = 0; i <= acked; i++) {
			ck_assert_msg(get_str(lsm, t_strdup_printf("r%u-%06u",
				round, i), value) == 1,
				"round %u: acked batch %u lost", round, i);
		}
		ck_assert_int_eq(get_str(lsm, t_strdup_printf("r%u-last",
						round), value), 1);
		batch = begin(lsm);
		put_str(batch, "after", "kill");
		commit(&batch);
		casbox_lsm_close(&lsm);
	}
	test_dir_teardown();
}
END_TEST

/* fcntl locks do not exclude within a process: a second handle's
   batch must fail clearly instead of interleaving WAL writes. */
START_TEST(test_two_handles_one_process)
{
	struct casbox_lsm *a, *b;
	struct casbox_lsm_batch *batch_a, *batch_b;
	string_t *value = t_str_new(32);
	const char *error;

	test_dir_setup();
	a = test_open(0);
	b = test_open(0);
	batch_a = begin(a);
	ck_assert_int_eq(casbox_lsm_batch_begin(b, &batch_b, &error), -1);
	ck_assert_msg(strstr(error, "another handle") != NULL,
		      "error: %s", error);
	put_str(batch_a, "x", "1");
	commit(&batch_a);
	batch_b = begin(b);
	ck_assert_int_eq(get_str(b, "x", value), 1);
	put_str(batch_b, "x", "2");
	commit(&batch_b);
	ck_assert_int_eq(casbox_lsm_refresh(a, &error), 1);
	ck_assert_int_eq(get_str(a, "x", value), 1);
	ck_assert_str_eq(str_c(value), "2");
	casbox_lsm_close(&a);
	casbox_lsm_close(&b);
	test_dir_teardown();
}
END_TEST

/* ---- the shared write lock (casbox-lsm-shm.c) ---- */

static const char *find_wal(void)
{
	struct dirent *d;
	const char *found = NULL;
	DIR *dir = opendir(test_dir);

	ck_assert(dir != NULL);
	while ((d = readdir(dir)) != NULL) {
		if (strstr(d->d_name, ".wal") != NULL)
			found = t_strconcat(test_dir, "/", d->d_name, NULL);
	}
	(void)closedir(dir);
	ck_assert(found != NULL);
	return found;
}

static struct casbox_lsm *test_open_timeout(unsigned int secs)
{
	struct casbox_lsm_settings set = {
		.codec = test_codec,
		.dir = test_dir,
		.fsync = TRUE,
		.lock_method = FILE_LOCK_METHOD_FCNTL,
		.lock_timeout_secs = secs,
	};
	struct casbox_lsm *lsm;
	const char *error;

	if (casbox_lsm_open(&set, &lsm, &error) < 0)
		ck_abort_msg("open: %s", error);
	return lsm;
}

/* A writer dies holding the lock after a torn append. The next locker
   gets the lock at once (robust mutex) and must not trust the state
   stamp it would otherwise match: it re-reads and cuts the tail, or
   its own record would land in front of the garbage. */
START_TEST(test_lock_holder_dies)
{
	unsigned char torn[300];
	struct casbox_lsm *lsm, *child_lsm, *reader;
	struct casbox_lsm_batch *batch;
	string_t *value = t_str_new(32);
	const char *error;
	int fd, status;
	pid_t pid;

	/* the start of a 1000-byte record: a torn append. It is longer
	   than the next record, and whatever a writer left of it after
	   its own record would be damage. */
	memset(torn, 0xab, sizeof(torn));
	torn[0] = 0; torn[1] = 0; torn[2] = 1000 >> 8; torn[3] = 1000 & 0xff;
	test_dir_setup();
	lsm = test_open_timeout(5);
	batch = begin(lsm);
	put_str(batch, "before", "1");
	commit(&batch);
	reader = test_open_timeout(5);

	pid = fork();
	ck_assert(pid != -1);
	if (pid == 0) {
		child_lsm = test_open_timeout(5);
		batch = begin(child_lsm);
		put_str(batch, "never", "1");
		fd = open(find_wal(), O_WRONLY | O_APPEND);
		if (fd == -1 || write(fd, torn, sizeof(torn)) != sizeof(torn))
			_exit(1);
		/* die with the lock held and the batch open */
		_exit(0);
	}
	ck_assert(waitpid(pid, &status, 0) == pid);
	ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);

	/* the lock is free again, and the torn tail is cut (lsm has not
	   looked at the WAL since its own commit) */
	batch = begin(lsm);
	put_str(batch, "after", "2");
	commit(&batch);
	/* a reader that last looked before the crash catches up */
	ck_assert_int_eq(casbox_lsm_refresh(reader, &error), 1);
	ck_assert_int_eq(get_str(reader, "after", value), 1);
	ck_assert_int_eq(get_str(reader, "never", value), 0);
	casbox_lsm_close(&reader);
	casbox_lsm_close(&lsm);

	lsm = test_open_timeout(5);
	ck_assert_int_eq(casbox_lsm_verify(lsm, NULL, NULL, &error), 1);
	ck_assert_int_eq(get_str(lsm, "before", value), 1);
	ck_assert_int_eq(get_str(lsm, "after", value), 1);
	ck_assert_str_eq(str_c(value), "2");
	ck_assert_int_eq(get_str(lsm, "never", value), 0);
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}
END_TEST

/* Try the write lock a build without the shared lock takes: a whole-
   file fcntl lock and an flock. Returns 0 if both were refused. */
static int old_build_lock_refused(void)
{
	struct flock fl;
	int fd = open(t_strconcat(test_dir, "/LOCK", NULL), O_RDWR);

	if (fd == -1)
		return 2;
	i_zero(&fl);
	fl.l_type = F_WRLCK;
	fl.l_whence = SEEK_SET;
	if (fcntl(fd, F_SETLK, &fl) == 0)
		return 3;
	if (flock(fd, LOCK_EX | LOCK_NB) == 0)
		return 4;
	return 0;
}

static int old_build_lock_granted(void)
{
	struct flock fl;
	int fd = open(t_strconcat(test_dir, "/LOCK", NULL), O_RDWR);

	if (fd == -1)
		return 2;
	i_zero(&fl);
	fl.l_type = F_WRLCK;
	fl.l_whence = SEEK_SET;
	if (fcntl(fd, F_SETLK, &fl) < 0)
		return 3;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0)
		return 4;
	return 0;
}

static int run_child(int (*fn)(void))
{
	int status;
	pid_t pid = fork();

	ck_assert(pid != -1);
	if (pid == 0)
		_exit(fn());
	ck_assert(waitpid(pid, &status, 0) == pid);
	ck_assert(WIFEXITED(status));
	return WEXITSTATUS(status);
}

/* While this build has the store open, a process of an older build
   (fcntl or flock write lock per batch) cannot write: its lock waits. */
START_TEST(test_lock_excludes_old_builds)
{
	struct casbox_lsm *lsm;

	test_dir_setup();
	lsm = test_open(0);
	ck_assert_int_eq(run_child(old_build_lock_refused), 0);
	casbox_lsm_close(&lsm);
	ck_assert_int_eq(run_child(old_build_lock_granted), 0);
	test_dir_teardown();
}
END_TEST

/* A lock page left behind by a reboot (here: a mutex still owned by a
   thread that is gone, which no kernel will ever hand over) is reset
   by the first process that opens the store. */
static int stale_page_save(void)
{
	struct casbox_lsm *lsm = test_open_timeout(5);
	struct casbox_lsm_batch *batch = begin(lsm);
	unsigned char page[4096];
	int fd = open(t_strconcat(test_dir, "/LOCK", NULL), O_RDONLY);
	int out = open(t_strconcat(test_dir, "/LOCK.saved", NULL),
		       O_WRONLY | O_CREAT | O_TRUNC, 0600);

	if (fd == -1 || out == -1 ||
	    pread(fd, page, sizeof(page), 0) != sizeof(page) ||
	    write(out, page, sizeof(page)) != sizeof(page))
		return 1;
	casbox_lsm_batch_rollback(&batch);
	casbox_lsm_close(&lsm);
	return 0;
}

START_TEST(test_stale_lock_page)
{
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	string_t *value = t_str_new(32);
	unsigned char page[4096];
	const char *lock_path;
	int fd;

	test_dir_setup();
	ck_assert_int_eq(run_child(stale_page_save), 0);
	fd = open(t_strconcat(test_dir, "/LOCK.saved", NULL), O_RDONLY);
	ck_assert(fd != -1 && read(fd, page, sizeof(page)) == sizeof(page));
	i_close_fd(&fd);
	lock_path = t_strconcat(test_dir, "/LOCK", NULL);
	fd = open(lock_path, O_WRONLY);
	ck_assert(fd != -1 && pwrite(fd, page, sizeof(page), 0) ==
		  sizeof(page));
	i_close_fd(&fd);
	ck_assert(unlink(t_strconcat(test_dir, "/LOCK.saved", NULL)) == 0);

	lsm = test_open_timeout(2);
	batch = begin(lsm);
	put_str(batch, "k", "v");
	commit(&batch);
	ck_assert_int_eq(get_str(lsm, "k", value), 1);
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}
END_TEST

/* The stamp of the lock page outlives the handles: the first handle to
   open the store again (alone with the page) keeps a clean stamp, so its
   first refresh costs no stat(). It must never hide a write: one by
   another process while the handle is open, one while nobody had the
   store open, and a writer that died holding the lock (a dirty stamp,
   which is not kept) all show up. */
static unsigned int test_stat_calls;

static int test_counting_fstat(int fd, struct stat *st_r)
{
	test_stat_calls++;
	return cas_io_posix.fstat(fd, st_r);
}

static int test_counting_stat(const char *path, struct stat *st_r)
{
	test_stat_calls++;
	return cas_io_posix.stat(path, st_r);
}

static struct casbox_lsm *test_open_counting(void)
{
	static struct cas_io io;
	struct casbox_lsm_settings set = {
		.codec = test_codec,
		.dir = test_dir,
		.fsync = TRUE,
		.lock_method = FILE_LOCK_METHOD_FCNTL,
		.lock_timeout_secs = 5,
		.io = &io,
	};
	struct casbox_lsm *lsm;
	const char *error;

	io = cas_io_posix;
	io.fstat = test_counting_fstat;
	io.stat = test_counting_stat;
	if (casbox_lsm_open(&set, &lsm, &error) < 0)
		ck_abort_msg("open: %s", error);
	test_stat_calls = 0;
	return lsm;
}

static const char *stamp_child_value;

static int stamp_child_put(void)
{
	struct casbox_lsm *lsm = test_open_timeout(5);
	struct casbox_lsm_batch *batch = begin(lsm);

	put_str(batch, "k", stamp_child_value);
	commit(&batch);
	casbox_lsm_close(&lsm);
	return 0;
}

static int stamp_child_dies_locked(void)
{
	struct casbox_lsm *lsm = test_open_timeout(5);
	struct casbox_lsm_batch *batch = begin(lsm);
	int fd;

	/* a record the WAL has, of a writer that never unlocked */
	put_str(batch, "k", "dead");
	fd = open(find_wal(), O_WRONLY | O_APPEND);
	if (fd == -1 || write(fd, "\0\0\0\0", 4) != 4)
		return 1;
	return 0;
}

START_TEST(test_stamp_kept_over_reopen)
{
	struct casbox_lsm *lsm;
	string_t *value = t_str_new(32);
	const char *error;

	test_dir_setup();
	stamp_child_value = "1";
	ck_assert_int_eq(run_child(stamp_child_put), 0);

	/* alone: the clean stamp kept, nothing to stat */
	lsm = test_open_counting();
	ck_assert_int_eq(casbox_lsm_refresh(lsm, &error), 1);
	ck_assert_uint_eq(test_stat_calls, 0);
	ck_assert_int_eq(get_str(lsm, "k", value), 1);
	ck_assert_str_eq(str_c(value), "1");

	/* another process writes while we have it open */
	stamp_child_value = "2";
	ck_assert_int_eq(run_child(stamp_child_put), 0);
	ck_assert_int_eq(casbox_lsm_refresh(lsm, &error), 1);
	ck_assert_uint_gt(test_stat_calls, 0);
	ck_assert_int_eq(get_str(lsm, "k", value), 1);
	ck_assert_str_eq(str_c(value), "2");
	casbox_lsm_close(&lsm);

	/* ... and while nobody has it open */
	stamp_child_value = "3";
	ck_assert_int_eq(run_child(stamp_child_put), 0);
	lsm = test_open_counting();
	ck_assert_int_eq(casbox_lsm_refresh(lsm, &error), 1);
	ck_assert_uint_eq(test_stat_calls, 0);
	ck_assert_int_eq(get_str(lsm, "k", value), 1);
	ck_assert_str_eq(str_c(value), "3");
	casbox_lsm_close(&lsm);

	/* a writer dies holding the lock: its dirty stamp is not kept */
	ck_assert_int_eq(run_child(stamp_child_dies_locked), 0);
	lsm = test_open_counting();
	ck_assert_int_eq(casbox_lsm_refresh(lsm, &error), 1);
	ck_assert_uint_gt(test_stat_calls, 0);
	ck_assert_int_eq(get_str(lsm, "k", value), 1);
	ck_assert_str_eq(str_c(value), "3");
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}
END_TEST

/* More table data than the process's block cache holds: every read
   after eviction still returns the right value. */
START_TEST(test_block_cache_eviction)
{
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	string_t *value = t_str_new(4200);
	unsigned int i, round;
	const char *prefix;
	char fill[4001];

	test_dir_setup();
	lsm = test_open(0);
	for (i = 0; i < 3000; i++) T_BEGIN {
		if (i % 100 == 0)
			batch = begin(lsm);
		memset(fill, 'a' + i % 26, sizeof(fill) - 1);
		fill[sizeof(fill) - 1] = '\0';
		put_str(batch, t_strdup_printf("big%05u", i),
			t_strdup_printf("%u:%s", i, fill));
		if (i % 100 == 99)
			commit(&batch);
	} T_END;
	/* ~12 MB in tables: more than CASBOX_LSM_CACHE_BYTES */
	for (round = 0; round < 2; round++) {
		for (i = 0; i < 3000; i += (round == 0 ? 1 : 7)) T_BEGIN {
			ck_assert_int_eq(get_str(lsm, t_strdup_printf(
				"big%05u", i), value), 1);
			prefix = t_strdup_printf("%u:", i);
			ck_assert(strncmp(str_c(value), prefix,
					  strlen(prefix)) == 0);
			ck_assert_uint_eq(str_len(value), 4000 +
					  strlen(dec2str(i)) + 1);
			ck_assert_int_eq(str_c(value)[str_len(value) - 1],
					 'a' + i % 26);
		} T_END;
	}
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}
END_TEST

/* cache_bytes bounds the process's block cache, lowered at once by the
   next open; reads past the bound stay right. */
START_TEST(test_block_cache_limit)
{
	struct casbox_lsm_settings set = {
		.codec = test_codec,
		.dir = test_dir,
		.fsync = FALSE,
		.lock_method = FILE_LOCK_METHOD_FCNTL,
	};
	struct casbox_lsm *lsm, *lsm2;
	struct casbox_lsm_batch *batch;
	string_t *value = t_str_new(1100);
	const char *error;
	char fill[1001];
	unsigned int i;

	test_dir_setup();
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	memset(fill, 'f', sizeof(fill) - 1);
	fill[sizeof(fill) - 1] = '\0';
	batch = begin(lsm);
	for (i = 0; i < 2000; i++) T_BEGIN {
		put_str(batch, t_strdup_printf("c%05u", i),
			t_strdup_printf("%u:%s", i, fill));
	} T_END;
	commit(&batch);
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
	/* ~2 MB of blocks read: the default 8 MiB keeps them all */
	for (i = 0; i < 2000; i++) T_BEGIN {
		ck_assert_int_eq(get_str(lsm, t_strdup_printf("c%05u", i),
					 value), 1);
	} T_END;
	ck_assert_uint_gt(casbox_lsm_cache_get_used(), 1024 * 1024);

	set.cache_bytes = 128 * 1024;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm2, &error), 1);
	ck_assert_uint_le(casbox_lsm_cache_get_used(), 128 * 1024);
	for (i = 0; i < 2000; i += 3) T_BEGIN {
		ck_assert_int_eq(get_str(lsm, t_strdup_printf("c%05u", i),
					 value), 1);
		ck_assert(strncmp(str_c(value), t_strdup_printf("%u:", i),
				  strlen(dec2str(i)) + 1) == 0);
		ck_assert_uint_le(casbox_lsm_cache_get_used(), 128 * 1024);
	} T_END;
	ck_assert_uint_gt(casbox_lsm_cache_get_used(), 0);
	casbox_lsm_close(&lsm2);
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}
END_TEST

/* casbox_lsm_batch_set_flush(): a small batch flushed into a table at
   once, leaving an empty WAL; without it the same batch stays in the
   WAL. */
START_TEST(test_batch_set_flush)
{
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	string_t *value = t_str_new(64);
	struct stat st;

	test_dir_setup();
	lsm = test_open(0);
	batch = begin(lsm);
	put_str(batch, "a", "1");
	commit(&batch);
	ck_assert_uint_eq(count_files(".sst"), 0);
	batch = begin(lsm);
	put_str(batch, "b", "2");
	casbox_lsm_batch_set_flush(batch);
	commit(&batch);
	ck_assert_uint_eq(count_files(".sst"), 1);
	ck_assert_uint_eq(count_files(".wal"), 1);
	ck_assert_int_eq(stat(find_file(".wal"), &st), 0);
	ck_assert_int_le(st.st_size, 64);
	casbox_lsm_close(&lsm);
	lsm = test_open(0);
	ck_assert_int_eq(get_str(lsm, "a", value), 1);
	ck_assert_str_eq(str_c(value), "1");
	ck_assert_int_eq(get_str(lsm, "b", value), 1);
	ck_assert_str_eq(str_c(value), "2");
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}
END_TEST

/* ---- corruption ---- */

struct damage {
	unsigned int count;
	char *file;
	uoff_t offset;
};

static void damage_report(void *context, const char *file, uoff_t offset,
			  const char *reason ATTR_UNUSED)
{
	struct damage *d = context;

	if (d->count++ == 0) {
		d->file = i_strdup(file);
		d->offset = offset;
	}
}

static const char *find_file(const char *suffix)
{
	struct dirent *d;
	const char *found = NULL;
	DIR *dir = opendir(test_dir);

	while ((d = readdir(dir)) != NULL) {
		if (strstr(d->d_name, suffix) != NULL)
			found = t_strconcat(test_dir, "/", d->d_name, NULL);
	}
	(void)closedir(dir);
	ck_assert(found != NULL);
	return found;
}

static void flip_byte(const char *path, off_t offset)
{
	unsigned char c;
	int fd = open(path, O_RDWR);

	ck_assert(fd != -1);
	ck_assert(pread(fd, &c, 1, offset) == 1);
	c ^= 0x10;
	ck_assert(pwrite(fd, &c, 1, offset) == 1);
	i_close_fd(&fd);
}

static void corrupt_fill(void)
{
	struct casbox_lsm *lsm = test_open(0);
	struct casbox_lsm_batch *batch = begin(lsm);
	const char *error;
	unsigned int i;

	for (i = 0; i < 2000; i++) {
		put_str(batch, t_strdup_printf("key%05u", i),
			t_strdup_printf("value-%u", i));
	}
	commit(&batch);
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
	casbox_lsm_close(&lsm);
}

/* A flipped bit in a data block: lookups there fail with the file and
   offset, verify reports it, other blocks still read fine. */
START_TEST(test_corrupt_table_block)
{
	struct casbox_lsm *lsm;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	struct damage d;
	string_t *str = t_str_new(64);
	const char *sst, *error;
	int ret;

	test_dir_setup();
	corrupt_fill();
	sst = find_file(".sst");
	flip_byte(sst, 100);
	lsm = test_open(0);
	ck_assert_int_eq(casbox_lsm_get(lsm, "key00001", 8, str, &error), -1);
	ck_assert_msg(strstr(error, sst) != NULL &&
		      strstr(error, "offset 0") != NULL, "error: %s", error);
	/* the last key lives in another block */
	ck_assert_int_eq(get_str(lsm, "key01999", str), 1);
	ck_assert_str_eq(str_c(str), "value-1999");

	iter = casbox_lsm_iter_init(lsm, "key", 3);
	while (casbox_lsm_iter_next(iter, &key, &key_size, &value,
				    &value_size)) ;
	ck_assert_int_eq(casbox_lsm_iter_deinit(&iter, &error), -1);

	i_zero(&d);
	ret = casbox_lsm_verify(lsm, damage_report, &d, &error);
	ck_assert_int_eq(ret, 0);
	ck_assert_uint_eq(d.count, 1);
	ck_assert_str_eq(d.file, sst);
	ck_assert_uint_eq(d.offset, 0);
	i_free(d.file);
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}
END_TEST

/* Every single-byte flip anywhere in a table is caught: opening fails,
   or every read either returns the right value or fails. */
START_TEST(test_corrupt_table_every_byte)
{
	struct casbox_lsm_settings set = {
		.codec = test_codec,
		.fsync = FALSE,
		.lock_method = FILE_LOCK_METHOD_FCNTL,
	};
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	string_t *str = t_str_new(64);
	const char *sst, *error;
	unsigned int i, id;
	struct stat st;
	off_t off;
	int ret;

	test_dir_setup();
	set.dir = test_dir;
	lsm = test_open(0);
	batch = begin(lsm);
	for (i = 0; i < 300; i++) {
		put_str(batch, t_strdup_printf("k%04u", i),
			t_strdup_printf("v%u", i));
	}
	commit(&batch);
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
	casbox_lsm_close(&lsm);
	sst = t_strdup(find_file(".sst"));
	ck_assert(stat(sst, &st) == 0);

	for (off = 0; off < st.st_size; off++) T_BEGIN {
		flip_byte(sst, off);
		if (casbox_lsm_open(&set, &lsm, &error) > 0) {
			for (id = 0; id < 300; id += 7) {
				str_truncate(str, 0);
				ret = casbox_lsm_get(lsm, t_strdup_printf(
					"k%04u", id), 5, str, &error);
				/* a bloom bit flip may hide a key only if
				   the filter says "absent": that would be
				   wrong data, so it must not happen */
				ck_assert_msg(ret != 0,
					      "flip at %lld lost key %u",
					      (long long)off, id);
				if (ret > 0) {
					ck_assert_str_eq(str_c(str),
						t_strdup_printf("v%u", id));
				}
			}
			casbox_lsm_close(&lsm);
		}
		flip_byte(sst, off);
	} T_END;
	test_dir_teardown();
}
END_TEST

/* A damaged WAL record followed by good ones is not a torn tail: open
   fails naming the file and offset instead of dropping data. */
START_TEST(test_corrupt_wal_middle)
{
	struct casbox_lsm_settings set = {
		.codec = test_codec,
		.fsync = TRUE,
		.lock_method = FILE_LOCK_METHOD_FCNTL,
	};
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	const char *wal, *error;
	unsigned int i;

	test_dir_setup();
	set.dir = test_dir;
	lsm = test_open(0);
	for (i = 0; i < 5; i++) {
		batch = begin(lsm);
		put_str(batch, t_strdup_printf("k%u", i), "some value");
		commit(&batch);
	}
	casbox_lsm_close(&lsm);
	wal = find_file(".wal");
	flip_byte(wal, test_wal_hdr + 12);
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), -1);
	ck_assert_msg(strstr(error, wal) != NULL &&
		      strstr(error, t_strdup_printf("offset %u",
						    test_wal_hdr)) != NULL,
		      "error: %s", error);
	test_dir_teardown();
}
END_TEST


/* ---- sealing (format 2) ---- */

static struct casbox_lsm_settings test_sealed_settings(void)
{
	struct casbox_lsm_settings set = {
		.dir = test_dir,
		.fsync = TRUE,
		.lock_method = FILE_LOCK_METHOD_FCNTL,
		.lock_timeout_secs = 60,
		.codec = &test_sealed_codec,
	};
	return set;
}

static bool buf_contains(const buffer_t *buf, const char *needle)
{
	const unsigned char *p = buf->data;
	size_t i, n = strlen(needle);

	for (i = 0; i + n <= buf->used; i++) {
		if (memcmp(p + i, needle, n) == 0)
			return TRUE;
	}
	return FALSE;
}

/* TRUE if needle occurs in any file of the store directory */
static bool test_dir_contains(const char *needle)
{
	struct dirent *d;
	DIR *dir = opendir(test_dir);
	bool found = FALSE;
	buffer_t *buf;
	int fd;
	ssize_t ret;
	char chunk[65536];

	ck_assert(dir != NULL);
	buf = buffer_create_dynamic(default_pool, 65536);
	while ((d = readdir(dir)) != NULL && !found) {
		if (d->d_name[0] == '.' || strcmp(d->d_name, "LOCK") == 0)
			continue;
		fd = open(t_strconcat(test_dir, "/", d->d_name, NULL),
			  O_RDONLY);
		ck_assert(fd != -1);
		buffer_set_used_size(buf, 0);
		while ((ret = read(fd, chunk, sizeof(chunk))) > 0)
			buffer_append(buf, chunk, ret);
		i_close_fd(&fd);
		if (buf_contains(buf, needle))
			found = TRUE;
	}
	buffer_free(&buf);
	(void)closedir(dir);
	return found;
}

static void test_fill_marked(struct casbox_lsm *lsm, unsigned int first,
			     unsigned int count)
{
	struct casbox_lsm_batch *batch = begin(lsm);
	unsigned int i;

	for (i = first; i < first + count; i++) {
		put_str(batch, t_strdup_printf("mailbox-INBOX-%05u", i),
			t_strdup_printf("$SecretKeyword GUID-%08x flags", i));
	}
	commit(&batch);
}

static void test_check_marked(struct casbox_lsm *lsm, unsigned int count)
{
	string_t *str = t_str_new(64);
	unsigned int i;

	for (i = 0; i < count; i++) {
		ck_assert_int_eq(get_str(lsm, t_strdup_printf(
			"mailbox-INBOX-%05u", i), str), 1);
		ck_assert_str_eq(str_c(str), t_strdup_printf(
			"$SecretKeyword GUID-%08x flags", i));
	}
}

/* Nothing of the keys or values is on disk: tables (data, index, bloom),
   WAL records and MANIFEST. Reopened, everything reads back. */
START_TEST(test_sealed_nothing_readable)
{
	struct casbox_lsm_settings set;
	struct casbox_lsm *lsm;
	const char *error;

	test_dir_setup();
	set = test_sealed_settings();
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	test_fill_marked(lsm, 0, 500);
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
	/* and some in the WAL only */
	test_fill_marked(lsm, 500, 20);
	casbox_lsm_close(&lsm);
	ck_assert_uint_eq(count_files(".sst"), 1);

	ck_assert(!test_dir_contains("SecretKeyword"));
	ck_assert(!test_dir_contains("INBOX"));
	ck_assert(!test_dir_contains("GUID-"));
	ck_assert(!test_dir_contains("mailbox"));

	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	ck_assert(casbox_lsm_is_sealed(lsm));
	test_check_marked(lsm, 520);
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}
END_TEST

/* Another key's fingerprint, the same fingerprint with other key bytes,
   no key at all: each refused at open with a clear error. */
START_TEST(test_sealed_wrong_key)
{
	struct casbox_lsm_codec other = test_sealed_codec;
	struct casbox_lsm_settings set;
	struct casbox_lsm *lsm;
	const char *error;

	test_dir_setup();
	set = test_sealed_settings();
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	test_fill_marked(lsm, 0, 50);
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
	casbox_lsm_close(&lsm);

	other.fingerprint[0] = 'X';
	set.codec = &other;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), -1);
	ck_assert_msg(strstr(error, "another key") != NULL &&
		      strstr(error, "fingerprint") != NULL, "error: %s", error);

	set.codec = &test_sealed_codec;
	test_key_salt = 1;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), -1);
	ck_assert_msg(strstr(error, "MANIFEST authentication failed") != NULL,
		      "error: %s", error);
	test_key_salt = 0;

	set.codec = NULL;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), -1);
	ck_assert_msg(strstr(error, "needs the store's key") != NULL,
		      "error: %s", error);

	/* the right key still opens it: nothing was changed */
	set.codec = &test_sealed_codec;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	test_check_marked(lsm, 50);
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}
END_TEST

static void copy_range(const char *from, off_t from_off, const char *to,
		       off_t to_off, size_t size)
{
	unsigned char *buf = i_malloc(size);
	int fd;

	fd = open(from, O_RDONLY);
	ck_assert(fd != -1);
	ck_assert(pread(fd, buf, size, from_off) == (ssize_t)size);
	i_close_fd(&fd);
	fd = open(to, O_RDWR);
	ck_assert(fd != -1);
	ck_assert(pwrite(fd, buf, size, to_off) == (ssize_t)size);
	i_close_fd(&fd);
	i_free(buf);
}

/* keys with distinct first bytes (no shared prefix) and incompressible
   values of one size: every data block holds 8 entries of 512 bytes,
   so blocks have the same stored size and can be swapped without the
   CRC noticing (tags 'a' and 'b' give disjoint first bytes) */
static void test_fill_uniform(struct casbox_lsm *lsm, char tag)
{
	struct casbox_lsm_batch *batch = begin(lsm);
	unsigned char key[8], value[500];
	const char *error;
	unsigned int i, j;

	for (i = 0; i < 64; i++) {
		key[0] = 'A' + i + (tag - 'a') * 64;
		memset(key + 1, tag, sizeof(key) - 1);
		for (j = 0; j < sizeof(value); j++)
			value[j] = (i * 131 + j * 17 + (j * j) % 251) ^ tag;
		casbox_lsm_batch_put(batch, key, sizeof(key), value,
				     sizeof(value));
	}
	commit(&batch);
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
}

static int test_get_uniform(struct casbox_lsm *lsm, unsigned int i,
			    char tag, const char **error_r)
{
	unsigned char key[8];
	string_t *str = t_str_new(600);

	key[0] = 'A' + i + (tag - 'a') * 64;
	memset(key + 1, tag, sizeof(key) - 1);
	return casbox_lsm_get(lsm, key, sizeof(key), str, error_r);
}

/* A data block moved to another offset of its table, or into another
   table at the same offset, with a valid CRC: authentication fails,
   never another block's data. */
START_TEST(test_sealed_block_moved)
{
	struct casbox_lsm_settings set;
	struct casbox_lsm *lsm;
	const char *sst, *sst2, *error;
	unsigned char *old_block;
	struct stat st;
	size_t block = 0;
	int ret;

	test_dir_setup();
	set = test_sealed_settings();
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	test_fill_uniform(lsm, 'a');
	casbox_lsm_close(&lsm);
	sst = t_strdup(find_file(".sst"));
	ck_assert(stat(sst, &st) == 0);
	/* stored block: nonce 16 | comp 1 | 8 * 512 + restart 4 + n 4 |
	   tag 16, then the CRC 4 */
	block = 16 + 1 + 8 * 512 + 4 + 4 + 16 + 4;
	ck_assert_uint_gt(st.st_size, 3 * block);

	/* block 1 over block 0 */
	copy_range(sst, block, sst, 0, block);
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	ret = test_get_uniform(lsm, 0, 'a', &error);
	ck_assert_int_eq(ret, -1);
	ck_assert_msg(strstr(error, "authentication failed") != NULL &&
		      strstr(error, sst) != NULL &&
		      strstr(error, "offset 0") != NULL, "error: %s", error);
	/* the block the copy came from still reads */
	ck_assert_int_eq(test_get_uniform(lsm, 8, 'a', &error), 1);
	casbox_lsm_close(&lsm);

	/* a block of an older table at the same offset of a newer one */
	test_dir_teardown();
	test_dir_setup();
	set.dir = test_dir;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	test_fill_uniform(lsm, 'a');
	casbox_lsm_close(&lsm);
	sst = t_strdup(find_file(".sst"));
	old_block = i_malloc(block);
	{
		int fd = open(sst, O_RDONLY);

		ck_assert(fd != -1);
		ck_assert(pread(fd, old_block, block, 0) == (ssize_t)block);
		i_close_fd(&fd);
	}
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	test_fill_uniform(lsm, 'b');
	casbox_lsm_close(&lsm);
	sst2 = t_strdup(find_file(".sst"));
	ck_assert(strcmp(sst, sst2) != 0);
	{
		int fd = open(sst2, O_RDWR);

		ck_assert(fd != -1);
		ck_assert(pwrite(fd, old_block, block, 0) == (ssize_t)block);
		i_close_fd(&fd);
	}
	i_free(old_block);
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	ck_assert_int_eq(test_get_uniform(lsm, 0, 'a', &error), -1);
	ck_assert_msg(strstr(error, "authentication failed") != NULL,
		      "error: %s", error);
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}
END_TEST

/* Table files renamed into each other's place: refused. */
START_TEST(test_sealed_table_swapped)
{
	struct casbox_lsm_settings set;
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	const char *error, *names[2];
	struct dirent *d;
	unsigned int n = 0;
	DIR *dir;

	test_dir_setup();
	set = test_sealed_settings();
	set.wal_flush_bytes = 1;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	/* each commit flushes: one table per batch */
	batch = begin(lsm);
	put_str(batch, "k1", "v1");
	commit(&batch);
	batch = begin(lsm);
	put_str(batch, "k2", "v2");
	commit(&batch);
	casbox_lsm_close(&lsm);
	ck_assert_uint_eq(count_files(".sst"), 2);

	dir = opendir(test_dir);
	while ((d = readdir(dir)) != NULL) {
		if (strstr(d->d_name, ".sst") != NULL)
			names[n++] = t_strconcat(test_dir, "/", d->d_name,
						 NULL);
	}
	(void)closedir(dir);
	ck_assert(rename(names[0], t_strconcat(test_dir, "/x", NULL)) == 0);
	ck_assert(rename(names[1], names[0]) == 0);
	ck_assert(rename(t_strconcat(test_dir, "/x", NULL), names[1]) == 0);
	set.wal_flush_bytes = 0;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), -1);
	ck_assert_msg(strstr(error, "authentication failed") != NULL &&
		      strstr(error, ".sst") != NULL, "error: %s", error);
	test_dir_teardown();
}
END_TEST

/* Two WAL records of the same size swapped (CRCs intact): corruption at
   the first one's offset; a torn last record: the batches before it
   survive, it is dropped. */
START_TEST(test_sealed_wal_records)
{
	struct casbox_lsm_settings set;
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	string_t *str = t_str_new(64);
	const char *wal, *error;
	struct stat st;
	size_t rec;
	unsigned int i;

	test_dir_setup();
	set = test_sealed_settings();
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	for (i = 0; i < 4; i++) {
		batch = begin(lsm);
		put_str(batch, t_strdup_printf("k%u", i), "value");
		commit(&batch);
	}
	casbox_lsm_close(&lsm);
	wal = t_strdup(find_file(".wal"));
	ck_assert(stat(wal, &st) == 0);
	ck_assert(!test_dir_contains("value"));
	rec = (st.st_size - 32) / 4;
	ck_assert_uint_eq(32 + 4 * rec, st.st_size);

	/* torn: half of the last record */
	ck_assert(truncate(wal, st.st_size - rec / 2) == 0);
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	ck_assert_int_eq(get_str(lsm, "k2", str), 1);
	ck_assert_int_eq(get_str(lsm, "k3", str), 0);
	casbox_lsm_close(&lsm);

	/* swap records 0 and 1: both CRCs fine, AAD (offset) not */
	ck_assert(truncate(wal, 32 + 3 * rec) == 0);
	copy_range(wal, 32, wal, 32 + 3 * rec, rec);
	copy_range(wal, 32 + rec, wal, 32, rec);
	copy_range(wal, 32 + 3 * rec, wal, 32 + rec, rec);
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), -1);
	ck_assert_msg(strstr(error, "Corrupted WAL") != NULL &&
		      strstr(error, "offset 32") != NULL &&
		      strstr(error, "authentication failed") != NULL,
		      "error: %s", error);
	test_dir_teardown();
}
END_TEST

/* A batch of many similar records is stored compressed (the WAL grows
   by less than its entries), reads back whole after a reopen, and a
   small batch after it (stored uncompressed) reads too. */
START_TEST(test_sealed_wal_compressed)
{
	struct casbox_lsm_settings set;
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	string_t *str = t_str_new(128);
	const char *wal, *error, *value;
	struct stat st;
	size_t raw = 0;
	unsigned int i;

	test_dir_setup();
	set = test_sealed_settings();
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	batch = begin(lsm);
	for (i = 0; i < 200; i++) {
		const char *key = t_strdup_printf("message-%05u", i);
		value = t_strdup_printf("flags=seen received=17000%05u "
					"mailbox=INBOX part=%u", i, i % 3);
		put_str(batch, key, value);
		raw += strlen(key) + strlen(value);
	}
	commit(&batch);
	batch = begin(lsm);
	put_str(batch, "small", "x");
	commit(&batch);
	casbox_lsm_close(&lsm);
	wal = t_strdup(find_file(".wal"));
	ck_assert(stat(wal, &st) == 0);
	ck_assert_msg((size_t)st.st_size < raw / 2,
		      "WAL %lld bytes for %zu bytes of entries",
		      (long long)st.st_size, raw);
	ck_assert(!test_dir_contains("received="));

	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	for (i = 0; i < 200; i++) {
		str_truncate(str, 0);
		ck_assert_int_eq(get_str(lsm, t_strdup_printf(
			"message-%05u", i), str), 1);
		ck_assert_str_eq(str_c(str), t_strdup_printf(
			"flags=seen received=17000%05u mailbox=INBOX part=%u",
			i, i % 3));
	}
	str_truncate(str, 0);
	ck_assert_int_eq(get_str(lsm, "small", str), 1);
	ck_assert_str_eq(str_c(str), "x");
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}
END_TEST

static void test_assert_epochs(struct casbox_lsm *lsm, const uint32_t *want,
			       unsigned int count)
{
	ARRAY_TYPE(uint32_t) epochs;
	const uint32_t *ep;
	unsigned int i, n;

	t_array_init(&epochs, 4);
	casbox_lsm_get_epochs(lsm, &epochs);
	ep = array_get(&epochs, &n);
	ck_assert_uint_eq(n, count);
	for (i = 0; i < n; i++)
		ck_assert_uint_eq(ep[i], want[i]);
}

/* A plaintext (format 1) store opened with a key: readable, the next
   commit moves the WAL to a sealed one, reseal rewrites the tables;
   afterwards nothing is readable on disk and a keyless open fails. */
START_TEST(test_sealed_upgrade_plaintext)
{
	static const uint32_t plain[] = { CASBOX_LSM_EPOCH_PLAINTEXT };
	static const uint32_t mixed[] = { 0, CASBOX_LSM_EPOCH_PLAINTEXT };
	static const uint32_t sealed[] = { 0 };
	struct casbox_lsm_settings set;
	struct casbox_lsm *lsm;
	const char *error;

	test_dir_setup();
	set = test_sealed_settings();
	set.codec = NULL;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	test_fill_marked(lsm, 0, 300);
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
	test_fill_marked(lsm, 300, 10);
	casbox_lsm_close(&lsm);
	ck_assert(test_dir_contains("SecretKeyword"));

	set.codec = &test_sealed_codec;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	ck_assert(!casbox_lsm_is_sealed(lsm));
	test_assert_epochs(lsm, plain, N_ELEMENTS(plain));
	test_check_marked(lsm, 310);
	test_fill_marked(lsm, 310, 10);
	/* the plaintext WAL went into a (sealed) table, the rest waits */
	test_assert_epochs(lsm, mixed, N_ELEMENTS(mixed));
	ck_assert(casbox_lsm_is_sealed(lsm));
	ck_assert_int_eq(casbox_lsm_reseal(lsm, &error), 1);
	test_assert_epochs(lsm, sealed, N_ELEMENTS(sealed));
	test_check_marked(lsm, 320);
	casbox_lsm_close(&lsm);
	ck_assert_uint_eq(count_files(".sst"), 1);
	ck_assert(!test_dir_contains("SecretKeyword"));
	ck_assert(!test_dir_contains("INBOX"));

	set.codec = NULL;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), -1);
	set.codec = &test_sealed_codec;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	test_check_marked(lsm, 320);
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}
END_TEST

/* Tables of two epochs: each opened with its epoch's key; reseal leaves
   only the current one, after which the old epoch's key is not needed. */
START_TEST(test_sealed_epochs)
{
	static const uint32_t both[] = { 0, 1 };
	static const uint32_t one[] = { 1 };
	struct casbox_lsm_settings set;
	struct casbox_lsm_info info;
	struct casbox_lsm *lsm;
	const char *error;

	test_dir_setup();
	set = test_sealed_settings();
	/* no store yet */
	ck_assert_int_eq(casbox_lsm_peek(test_dir, &info, &error), 0);
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	ck_assert_int_eq(casbox_lsm_peek(test_dir, &info, &error), 1);
	ck_assert(info.sealed);
	ck_assert_uint_eq(info.tables, 0);
	ck_assert_uint_eq(info.wal_record_bytes, 0);
	ck_assert(memcmp(info.fingerprint, test_sealed_codec.fingerprint,
			 sizeof(info.fingerprint)) == 0);
	test_fill_marked(lsm, 0, 100);
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
	casbox_lsm_close(&lsm);

	test_epoch = test_max_epoch = 1;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	test_fill_marked(lsm, 100, 100);
	casbox_lsm_close(&lsm);
	/* flush without merging: a second table, of epoch 1 */
	set.wal_flush_bytes = 1;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	test_fill_marked(lsm, 200, 1);
	test_assert_epochs(lsm, both, N_ELEMENTS(both));
	casbox_lsm_close(&lsm);
	set.wal_flush_bytes = 0;
	ck_assert_int_eq(casbox_lsm_peek(test_dir, &info, &error), 1);
	ck_assert_uint_eq(info.tables, 2);

	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
	test_check_marked(lsm, 201);
	ck_assert_int_eq(casbox_lsm_reseal(lsm, &error), 1);
	test_assert_epochs(lsm, one, N_ELEMENTS(one));
	/* nothing to do now: no write */
	ck_assert_int_eq(casbox_lsm_reseal(lsm, &error), 1);
	casbox_lsm_close(&lsm);
	ck_assert_uint_eq(count_files(".sst"), 1);

	/* epoch 0's key gone (rotation finished): still opens */
	test_epoch = test_max_epoch = 1;
	{
		struct casbox_lsm_codec no_old = test_sealed_codec;

		no_old.get_key = test_codec_key;
		set.codec = &no_old;
		ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), 1);
		test_check_marked(lsm, 201);
		casbox_lsm_close(&lsm);
	}
	/* while a key without epoch 1 cannot open it */
	test_epoch = test_max_epoch = 0;
	set.codec = &test_sealed_codec;
	ck_assert_int_eq(casbox_lsm_open(&set, &lsm, &error), -1);
	ck_assert_msg(strstr(error, "epoch 1") != NULL, "error: %s", error);
	test_dir_teardown();
}
END_TEST

/* file_wait_lock() times out with alarm(), as in Dovecot's processes,
   where SIGALRM only interrupts the wait. Check installs its own
   SIGALRM handler (which kills the test) before forking, so restore
   Dovecot's in the test process. */
static void test_signals_setup(void)
{
	lib_signals_ignore(SIGALRM, FALSE);
}

static void test_add_common(TCase *tc)
{
	tcase_add_test(tc, test_basic);
	tcase_add_test(tc, test_iter_snapshot);
	tcase_add_test(tc, test_compact_all_deleted);
	tcase_add_test(tc, test_model);
	tcase_add_test(tc, test_multiprocess_fcntl);
	tcase_add_test(tc, test_multiprocess_flock);
	tcase_add_test(tc, test_multiprocess_dotlock);
	tcase_add_test(tc, test_lock_timeout);
	tcase_add_test(tc, test_sigkill_writer);
	tcase_add_test(tc, test_two_handles_one_process);
	tcase_add_test(tc, test_lock_holder_dies);
	tcase_add_test(tc, test_lock_excludes_old_builds);
	tcase_add_test(tc, test_stale_lock_page);
	tcase_add_test(tc, test_stamp_kept_over_reopen);
	tcase_add_test(tc, test_block_cache_eviction);
	tcase_add_test(tc, test_block_cache_limit);
	tcase_add_test(tc, test_batch_set_flush);
	tcase_add_test(tc, test_corrupt_table_block);
	tcase_add_test(tc, test_corrupt_table_every_byte);
	tcase_add_test(tc, test_corrupt_wal_middle);
}

int main(void)
{
	Suite *s = suite_create("lsm");
	TCase *tc = tcase_create("lsm");
	TCase *tc_sealed = tcase_create("sealed");
	int failed;

	lib_init();
	lib_signals_init();
	tcase_add_checked_fixture(tc, test_signals_setup, NULL);
	tcase_add_checked_fixture(tc, test_plain_setup, NULL);
	tcase_set_timeout(tc, 300);
	test_add_common(tc);
	suite_add_tcase(s, tc);

	/* the same tests on sealed (format 2) stores, and the sealing ones */
	tcase_add_checked_fixture(tc_sealed, test_signals_setup, NULL);
	tcase_add_checked_fixture(tc_sealed, test_sealed_setup, NULL);
	tcase_set_timeout(tc_sealed, 300);
	test_add_common(tc_sealed);
	tcase_add_test(tc_sealed, test_sealed_nothing_readable);
	tcase_add_test(tc_sealed, test_sealed_wrong_key);
	tcase_add_test(tc_sealed, test_sealed_block_moved);
	tcase_add_test(tc_sealed, test_sealed_table_swapped);
	tcase_add_test(tc_sealed, test_sealed_wal_records);
	tcase_add_test(tc_sealed, test_sealed_wal_compressed);
	tcase_add_test(tc_sealed, test_sealed_upgrade_plaintext);
	tcase_add_test(tc_sealed, test_sealed_epochs);
	suite_add_tcase(s, tc_sealed);
	failed = check_run_suite(s);
	lib_signals_deinit();
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
