/* casbox-lsm crash matrix: crash at every counted I/O operation of a
   workload with flushes and merges (plain and torn writes; dropping all
   or part of the unsynced data), then check that after recovery every
   acknowledged batch is there and the one batch in flight is either
   wholly there or wholly absent. Plus ENOSPC at every byte budget: a
   failed commit must not be visible, and the store stays usable. */

#include "lib.h"
#include "buffer.h"
#include "unlink-directory.h"
#include "casbox-lsm.h"
#include "crashfs.h"

#include <check.h>
#include "check-run.h"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N_KEYS 64
#define N_BATCHES 60

static char test_dir[256];

/* the "sealed" tcase runs the matrix on format-2 (sealed) stores */
static uint32_t test_codec_epoch(void *context ATTR_UNUSED)
{
	return 0;
}

static int test_codec_key(void *context ATTR_UNUSED, uint32_t epoch,
			  unsigned char key_r[CASBOX_LSM_KEY_SIZE],
			  const char **error_r)
{
	if (epoch != 0) {
		*error_r = "no such epoch";
		return -1;
	}
	memset(key_r, 0x42, CASBOX_LSM_KEY_SIZE);
	return 0;
}

static const struct casbox_lsm_codec test_sealed_codec = {
	.current_epoch = test_codec_epoch,
	.get_key = test_codec_key,
	.fingerprint = { 'c', 'r', 'a', 's', 'h' },
};
static const struct casbox_lsm_codec *test_codec;

static void test_plain_setup(void)
{
	test_codec = NULL;
}

static void test_sealed_setup(void)
{
	test_codec = &test_sealed_codec;
}

struct model {
	char values[N_KEYS][32];
	bool present[N_KEYS];
};

static void test_dir_setup(void)
{
	const char *tmp = getenv("TMPDIR");

	i_snprintf(test_dir, sizeof(test_dir), "%s/check-lsm-crash.XXXXXX",
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

static int lsm_open_io(const struct cas_io *io,
		       struct casbox_lsm **lsm_r, const char **error_r)
{
	struct casbox_lsm_settings set = {
		.dir = test_dir,
		.fsync = TRUE,
		.lock_method = FILE_LOCK_METHOD_FCNTL,
		.lock_timeout_secs = 10,
		/* a flush every few batches, merges soon after */
		.wal_flush_bytes = 400,
		.io = io,
		.codec = test_codec,
	};

	return casbox_lsm_open(&set, lsm_r, error_r);
}

static void key_make(unsigned int id, char key[8])
{
	i_snprintf(key, 8, "k%03u", id);
}

/* Batch i: two puts and a delete; apply it to m. */
static void batch_fill(struct casbox_lsm_batch *batch, unsigned int i,
		       struct model *m)
{
	unsigned int put1 = (i * 7) % N_KEYS, put2 = (i * 13 + 1) % N_KEYS;
	unsigned int del = (i * 29 + 3) % N_KEYS;
	char key[8];

	key_make(put1, key);
	i_snprintf(m->values[put1], sizeof(m->values[put1]), "a%u", i);
	m->present[put1] = TRUE;
	casbox_lsm_batch_put(batch, key, 4, m->values[put1],
			     strlen(m->values[put1]));
	key_make(put2, key);
	i_snprintf(m->values[put2], sizeof(m->values[put2]),
		   "b%u-%040u", i, i);
	m->present[put2] = TRUE;
	casbox_lsm_batch_put(batch, key, 4, m->values[put2],
			     strlen(m->values[put2]));
	if (del != put1 && del != put2) {
		key_make(del, key);
		m->present[del] = FALSE;
		casbox_lsm_batch_delete(batch, key, 4);
	}
}

static bool store_equals(struct casbox_lsm *lsm, const struct model *m)
{
	buffer_t *value = t_buffer_create(64);
	const char *error;
	char key[8];
	unsigned int id;
	int ret;

	for (id = 0; id < N_KEYS; id++) {
		key_make(id, key);
		buffer_set_used_size(value, 0);
		ret = casbox_lsm_get(lsm, key, 4, value, &error);
		ck_assert_msg(ret >= 0, "get: %s", error);
		if (ret != (m->present[id] ? 1 : 0))
			return FALSE;
		if (ret == 1 &&
		    (value->used != strlen(m->values[id]) ||
		     memcmp(value->data, m->values[id], value->used) != 0))
			return FALSE;
	}
	return TRUE;
}

static void store_check_iter(struct casbox_lsm *lsm, const struct model *m)
{
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	unsigned int count = 0, id, expect = 0;
	const char *error;

	for (id = 0; id < N_KEYS; id++)
		expect += m->present[id] ? 1 : 0;
	iter = casbox_lsm_iter_init(lsm, "k", 1);
	while (casbox_lsm_iter_next(iter, &key, &key_size, &value,
				    &value_size))
		count++;
	ck_assert_msg(casbox_lsm_iter_deinit(&iter, &error) == 1,
		      "iter: %s", error);
	ck_assert_uint_eq(count, expect);
}

/* Run the workload until it ends or crashes: models[i] is the state
   after i batches, models[acked + 1] the batch in flight if one failed.
   With lazy, two of every three batches commit without fsync
   (casbox_lsm_batch_set_lazy()). Returns the number of acknowledged
   batches; *synced_r is how many of them a synced commit covers. */
static unsigned int workload(struct casbox_lsm *lsm, struct model *models,
			     bool lazy, unsigned int *synced_r,
			     bool *failed_r)
{
	struct casbox_lsm_batch *batch;
	const char *error;
	unsigned int i;

	*failed_r = FALSE;
	*synced_r = 0;
	for (i = 0; i < N_BATCHES; i++) {
		if (casbox_lsm_batch_begin(lsm, &batch, &error) < 0)
			return i;
		if (lazy && i % 3 != 2)
			casbox_lsm_batch_set_lazy(batch);
		models[i + 1] = models[i];
		batch_fill(batch, i, &models[i + 1]);
		if (casbox_lsm_batch_commit(&batch, &error) < 0) {
			*failed_r = TRUE;
			return i;
		}
		if (!lazy || i % 3 == 2)
			*synced_r = i + 1;
	}
	return i;
}

/* After a power loss the store holds the state after k batches, for
   some k from the last synced one up to the last committed (plus the
   one in flight): the lazy ones after a sync may go, but only as a
   suffix, and no batch is ever torn. */
static void crash_run(unsigned int n, enum crashfs_fault fault,
		      enum crashfs_loss loss, bool lazy, bool *completed_r)
{
	struct casbox_lsm *lsm;
	struct model *models = t_new(struct model, N_BATCHES + 2);
	const char *error;
	unsigned int acked = 0, synced = 0, lo, k;
	bool failed = FALSE;

	test_dir_setup();
	crashfs_init(test_dir, n);
	crashfs_crash_at(n, fault);
	if (lsm_open_io(&crashfs_io, &lsm, &error) > 0) {
		acked = workload(lsm, models, lazy, &synced, &failed);
		casbox_lsm_close(&lsm);
	}
	*completed_r = !crashfs_crashed();
	crashfs_power_loss(loss);
	crashfs_deinit();

	/* recover with the real I/O */
	if (lsm_open_io(NULL, &lsm, &error) < 0)
		ck_abort_msg("crash at op %u: reopen failed: %s", n, error);
	lo = lazy ? synced : acked;
	for (k = acked + (failed ? 1 : 0); k > lo; k--) {
		if (store_equals(lsm, &models[k]))
			break;
	}
	ck_assert_msg(store_equals(lsm, &models[k]),
		      "crash at op %u (fault %d, loss %d, lazy %d): store "
		      "matches no state from %u to %u%s batches", n, fault,
		      loss, lazy, lo, acked, failed ? " (+1 in flight)" : "");
	store_check_iter(lsm, &models[k]);
	/* and it takes writes again */
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
	ck_assert_int_eq(casbox_lsm_verify(lsm, NULL, NULL, &error), 1);
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}

static void crash_matrix(enum crashfs_fault fault, enum crashfs_loss loss,
			 bool lazy)
{
	unsigned int n;
	bool completed = FALSE;

	for (n = 1; !completed; n++) T_BEGIN {
		crash_run(n, fault, loss, lazy, &completed);
		i_assert(n < 100000);
	} T_END;
	/* the matrix must have covered flushes and merges */
	ck_assert_uint_gt(n, lazy ? 120 : 200);
	i_info("crash matrix (fault %d, loss %d, lazy %d): %u crash points",
	       fault, loss, lazy, n - 1);
}

START_TEST(test_crash_drop)
{
	crash_matrix(CRASHFS_FAULT_CRASH, CRASHFS_LOSS_DROP_UNSYNCED, FALSE);
}
END_TEST

START_TEST(test_crash_torn_keep_some)
{
	crash_matrix(CRASHFS_FAULT_TORN, CRASHFS_LOSS_KEEP_SOME, FALSE);
}
END_TEST

START_TEST(test_crash_torn_drop)
{
	crash_matrix(CRASHFS_FAULT_TORN, CRASHFS_LOSS_DROP_UNSYNCED, FALSE);
}
END_TEST

/* Lazy batches: a power loss takes a suffix of them at most. */
START_TEST(test_crash_lazy_drop)
{
	crash_matrix(CRASHFS_FAULT_CRASH, CRASHFS_LOSS_DROP_UNSYNCED, TRUE);
}
END_TEST

START_TEST(test_crash_lazy_torn_keep_some)
{
	crash_matrix(CRASHFS_FAULT_TORN, CRASHFS_LOSS_KEEP_SOME, TRUE);
}
END_TEST

/* ENOSPC at a byte budget: the failing commit is never visible, all
   acknowledged ones are, and writes work again once space is back. */
static void enospc_run(uoff_t budget, bool *completed_r)
{
	struct casbox_lsm *lsm;
	struct model *models = t_new(struct model, N_BATCHES + 2);
	const struct model *acked = &models[0];
	const char *error;
	unsigned int synced;
	bool failed;

	test_dir_setup();
	crashfs_init(test_dir, budget);
	crashfs_enospc_after(budget);
	*completed_r = FALSE;
	if (lsm_open_io(&crashfs_io, &lsm, &error) > 0) {
		acked = &models[workload(lsm, models, FALSE, &synced,
					 &failed)];
		*completed_r = !failed;
		ck_assert_msg(store_equals(lsm, acked),
			      "budget %"PRIuUOFF_T": failed commit visible "
			      "in the same handle", budget);
		crashfs_enospc_after((uoff_t)-1);
		casbox_lsm_close(&lsm);
	}
	crashfs_deinit();
	ck_assert_int_gt(lsm_open_io(NULL, &lsm, &error), 0);
	ck_assert_msg(store_equals(lsm, acked),
		      "budget %"PRIuUOFF_T": reopened store differs",
		      budget);
	ck_assert_int_eq(casbox_lsm_compact(lsm, &error), 1);
	casbox_lsm_close(&lsm);
	test_dir_teardown();
}

START_TEST(test_enospc)
{
	uoff_t budget;
	bool completed = FALSE;

	for (budget = 0; !completed; budget += 37) T_BEGIN {
		enospc_run(budget, &completed);
	} T_END;
	i_info("ENOSPC sweep: %"PRIuUOFF_T" budgets", budget / 37);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("lsm-crash");
	TCase *tcs[2];
	int failed;
	unsigned int i;

	lib_init();
	tcs[0] = tcase_create("lsm-crash");
	tcase_add_checked_fixture(tcs[0], test_plain_setup, NULL);
	tcs[1] = tcase_create("sealed");
	tcase_add_checked_fixture(tcs[1], test_sealed_setup, NULL);
	for (i = 0; i < N_ELEMENTS(tcs); i++) {
		TCase *tc = tcs[i];

		tcase_set_timeout(tc, 600);
		tcase_add_test(tc, test_crash_drop);
		tcase_add_test(tc, test_crash_torn_keep_some);
		tcase_add_test(tc, test_crash_torn_drop);
		tcase_add_test(tc, test_crash_lazy_drop);
		tcase_add_test(tc, test_crash_lazy_torn_keep_some);
		tcase_add_test(tc, test_enospc);
		suite_add_tcase(s, tc);
	}
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
