/* Named events of the lower layers (doc/events.md), caught as Dovecot's
   stats client sees them: a global debug send filter naming them, and
   an event callback at send time. The LSM's flush and compaction events
   against the table files they leave on disk. */

#include "lib.h"
#include "array.h"
#include "event-filter.h"
#include "lib-event-private.h"
#include "unlink-directory.h"
#include "casbox-lsm.h"

#include <check.h>
#include "check-run.h"
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <sys/stat.h>

#define N_BATCHES 300
#define KEYS_PER_BATCH 4

struct seen_events {
	unsigned int flushes, compactions, tables_merged, tables_written;
	unsigned int other;
	uint64_t flush_entries, created_bytes, merged_bytes, last_entries;
	/* the parent's field, as every event carried it */
	unsigned int with_user;
};

static char test_dir[256];
static struct seen_events seen;

static intmax_t field_int(struct event *event, const char *key)
{
	const struct event_field *field = event_find_field_recursive(event, key);

	ck_assert_msg(field != NULL, "field %s missing", key);
	ck_assert_int_eq(field->value_type, EVENT_FIELD_VALUE_TYPE_INTMAX);
	return field->value.intmax;
}

static bool
test_event_callback(struct event *event, enum event_callback_type type,
		    struct failure_context *ctx ATTR_UNUSED,
		    const char *fmt ATTR_UNUSED, va_list args ATTR_UNUSED)
{
	const char *name = event->sending_name, *user;

	if (type != EVENT_CALLBACK_TYPE_SEND || name == NULL)
		return TRUE;
	user = event_find_field_recursive_str(event, "user");
	if (user != NULL && strcmp(user, "events-test") == 0)
		seen.with_user++;
	if (strcmp(name, "casbox_lsm_flush_finished") == 0) {
		seen.flushes++;
		seen.tables_written += field_int(event, "tables_written");
		seen.flush_entries += field_int(event, "entries");
		seen.created_bytes += field_int(event, "table_bytes");
		ck_assert_int_gt(field_int(event, "input_bytes"), 0);
	} else if (strcmp(name, "casbox_lsm_compaction_finished") == 0) {
		seen.compactions++;
		seen.tables_written += field_int(event, "tables_written");
		seen.tables_merged += field_int(event, "tables");
		seen.merged_bytes += field_int(event, "input_bytes");
		seen.created_bytes += field_int(event, "table_bytes");
		seen.last_entries = field_int(event, "entries");
	} else {
		seen.other++;
	}
	/* not logged: the test only counts */
	return FALSE;
}

static void test_setup(void)
{
	struct event_filter *filter = event_filter_create();
	const char *tmp = getenv("TMPDIR"), *error;

	i_snprintf(test_dir, sizeof(test_dir), "%s/check-events.XXXXXX",
		   tmp != NULL ? tmp : "/tmp");
	if (mkdtemp(test_dir) == NULL)
		i_fatal("mkdtemp(%s) failed: %m", test_dir);
	i_zero(&seen);
	/* what the stats client installs for metric blocks naming them */
	if (event_filter_parse("event=casbox_lsm_flush_finished OR "
			       "event=casbox_lsm_compaction_finished",
			       filter, &error) < 0)
		i_fatal("event_filter_parse: %s", error);
	event_set_global_debug_send_filter(filter);
	event_filter_unref(&filter);
	event_register_callback(test_event_callback);
}

static void test_teardown(void)
{
	const char *error;

	event_unregister_callback(test_event_callback);
	event_unset_global_debug_send_filter();
	if (unlink_directory(test_dir, UNLINK_DIRECTORY_FLAG_RMDIR,
			     &error) < 0)
		i_error("%s", error);
}

/* Count and total size of the table files. */
static unsigned int tables_on_disk(uint64_t *bytes_r)
{
	struct dirent *d;
	struct stat st;
	unsigned int count = 0;
	DIR *dir = opendir(test_dir);

	*bytes_r = 0;
	ck_assert(dir != NULL);
	while ((d = readdir(dir)) != NULL) {
		if (strstr(d->d_name, ".sst") == NULL)
			continue;
		ck_assert(stat(t_strdup_printf("%s/%s", test_dir, d->d_name),
			       &st) == 0);
		*bytes_r += st.st_size;
		count++;
	}
	(void)closedir(dir);
	return count;
}

static void write_batches(struct casbox_lsm *lsm)
{
	struct casbox_lsm_batch *batch;
	unsigned char value[200];
	const char *error, *key;
	unsigned int i, j;

	memset(value, 'v', sizeof(value));
	for (i = 0; i < N_BATCHES; i++) {
		if (casbox_lsm_batch_begin(lsm, &batch, &error) < 0)
			ck_abort_msg("begin: %s", error);
		for (j = 0; j < KEYS_PER_BATCH; j++) T_BEGIN {
			key = t_strdup_printf("key-%05u-%u", i, j);
			casbox_lsm_batch_put(batch, key, strlen(key),
					     value, sizeof(value));
		} T_END;
		if (casbox_lsm_batch_commit(&batch, &error) < 0)
			ck_abort_msg("commit: %s", error);
	}
}

START_TEST(test_lsm_flush_compaction_events)
{
	struct event *parent = event_create(NULL);
	struct casbox_lsm_settings set = {
		.dir = test_dir,
		.fsync = FALSE,
		.lock_method = FILE_LOCK_METHOD_FCNTL,
		.wal_flush_bytes = 8192,
		.event = parent,
	};
	struct casbox_lsm *lsm;
	const char *error;
	uint64_t bytes;
	unsigned int tables;

	event_add_str(parent, "user", "events-test");
	if (casbox_lsm_open(&set, &lsm, &error) < 0)
		ck_abort_msg("open: %s", error);
	/* the LSM keeps its own reference */
	event_unref(&parent);
	write_batches(lsm);

	/* ~240 KB of WAL at 8 KiB per flush: dozens of tables, merged
	   whenever more than 6 are left */
	ck_assert_uint_gt(seen.flushes, 10);
	ck_assert_uint_gt(seen.compactions, 0);
	ck_assert_uint_eq(seen.other, 0);
	/* distinct keys: each put was flushed once; what was flushed
	   still in the memtable is the rest */
	ck_assert_uint_le(seen.flush_entries, N_BATCHES * KEYS_PER_BATCH);
	/* every table came from a flush or merge and went by a merge */
	tables = tables_on_disk(&bytes);
	ck_assert_uint_eq(tables, seen.tables_written - seen.tables_merged);
	/* distinct keys and no deletes: every flush and merge wrote one */
	ck_assert_uint_eq(seen.tables_written,
			  seen.flushes + seen.compactions);
	ck_assert_uint_eq(bytes, seen.created_bytes - seen.merged_bytes);

	/* a full compaction: one table with every key */
	if (casbox_lsm_compact(lsm, &error) < 0)
		ck_abort_msg("compact: %s", error);
	ck_assert_uint_eq(seen.flush_entries, N_BATCHES * KEYS_PER_BATCH);
	ck_assert_uint_eq(seen.last_entries, N_BATCHES * KEYS_PER_BATCH);
	ck_assert_uint_eq(tables_on_disk(&bytes), 1);
	ck_assert_uint_eq(bytes, seen.created_bytes - seen.merged_bytes);
	ck_assert_uint_eq(seen.with_user, seen.flushes + seen.compactions);
	casbox_lsm_close(&lsm);
}
END_TEST

START_TEST(test_lsm_events_unwanted)
{
	struct casbox_lsm_settings set = {
		.dir = test_dir,
		.lock_method = FILE_LOCK_METHOD_FCNTL,
		.wal_flush_bytes = 8192,
	};
	struct casbox_lsm *lsm;
	const char *error;

	/* nobody listens: flushes happen, nothing is sent */
	event_unset_global_debug_send_filter();
	if (casbox_lsm_open(&set, &lsm, &error) < 0)
		ck_abort_msg("open: %s", error);
	write_batches(lsm);
	casbox_lsm_close(&lsm);
	ck_assert_uint_eq(seen.flushes + seen.compactions + seen.other, 0);
	ck_assert_uint_gt(tables_on_disk(&(uint64_t){0}), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("events");
	TCase *tc = tcase_create("lsm");
	int failed;

	lib_init();
	tcase_add_checked_fixture(tc, test_setup, test_teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_lsm_flush_compaction_events);
	tcase_add_test(tc, test_lsm_events_unwanted);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
