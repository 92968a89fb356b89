/* lsm-bench: casbox-lsm against LevelDB and SQLite on a mail-shaped
   workload, in one run, on the same machine and disk.

   Phases (per engine, fresh directory each):
     deliver   one batch per message: the message record (mailbox GUID +
	       UID, ~160 bytes) and 1-2 blob records (random 32-byte id,
	       ~90 bytes). Sequential UIDs, random blob ids.
     flags     one batch per flag change on a random message (16 bytes)
     scan      iterate all records of a random mailbox, in UID order
     lookup    point lookups of random existing blob ids
   "sync" runs commit durably (fdatasync per batch: casbox fsync=yes,
   LevelDB sync=true, SQLite WAL + synchronous=FULL); "nosync" runs
   measure the engines without the disk's fsync latency.
   Bytes written = wchar of /proc/self/io over the phase (all write
   syscalls of the process: WAL, tables, compaction).

   usage: lsm-bench [messages] [sync-messages] [dir] [engine]
   (with an engine name only that engine runs: for profiling) */

#include "lib.h"
#include "buffer.h"
#include "unlink-directory.h"
#include "casbox-lsm.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <leveldb/c.h>
#include <sqlite3.h>

#define MAILBOXES 20

struct engine {
	const char *name;
	void *(*open)(const char *dir, bool sync);
	void (*close)(void *db);
	void (*begin)(void *db);
	void (*put)(void *db, const void *k, size_t ks, const void *v,
		    size_t vs);
	void (*commit)(void *db);
	bool (*get)(void *db, const void *k, size_t ks);
	unsigned int (*scan)(void *db, const void *prefix, size_t size);
};

/* ---- casbox ---- */
struct cb_db {
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	buffer_t *value;
};

/* CASBOX_LSM_BENCH_SEALED=1: the store's format 2 (sealed blocks and
   WAL records, doc/casbox-lsm.md "Sealing") under a fixed bench key */
static uint32_t cb_codec_epoch(void *context ATTR_UNUSED)
{
	return 0;
}

static int cb_codec_key(void *context ATTR_UNUSED, uint32_t epoch,
			unsigned char key_r[CASBOX_LSM_KEY_SIZE],
			const char **error_r ATTR_UNUSED)
{
	memset(key_r, 0x5c ^ epoch, CASBOX_LSM_KEY_SIZE);
	return 0;
}

static const struct casbox_lsm_codec cb_codec = {
	.current_epoch = cb_codec_epoch,
	.get_key = cb_codec_key,
	.fingerprint = { 'b', 'e', 'n', 'c', 'h' },
};

static void *cb_open(const char *dir, bool sync)
{
	const char *sealed = getenv("CASBOX_LSM_BENCH_SEALED");
	struct casbox_lsm_settings set = {
		.dir = dir, .fsync = sync,
		.lock_method = FILE_LOCK_METHOD_FCNTL,
		.codec = sealed != NULL && strcmp(sealed, "1") == 0 ?
			&cb_codec : NULL,
	};
	struct cb_db *db = i_new(struct cb_db, 1);
	const char *error;

	if (casbox_lsm_open(&set, &db->lsm, &error) < 0)
		i_fatal("%s", error);
	db->value = buffer_create_dynamic(default_pool, 256);
	return db;
}

static void cb_close(void *_db)
{
	struct cb_db *db = _db;

	casbox_lsm_close(&db->lsm);
	buffer_free(&db->value);
	i_free(db);
}

static void cb_begin(void *_db)
{
	struct cb_db *db = _db;
	const char *error;

	if (casbox_lsm_batch_begin(db->lsm, &db->batch, &error) < 0)
		i_fatal("%s", error);
}

static void cb_put(void *_db, const void *k, size_t ks, const void *v,
		   size_t vs)
{
	struct cb_db *db = _db;

	casbox_lsm_batch_put(db->batch, k, ks, v, vs);
}

static void cb_commit(void *_db)
{
	struct cb_db *db = _db;
	const char *error;

	if (casbox_lsm_batch_commit(&db->batch, &error) < 0)
		i_fatal("%s", error);
}

static bool cb_get(void *_db, const void *k, size_t ks)
{
	struct cb_db *db = _db;
	const char *error;
	int ret;

	buffer_set_used_size(db->value, 0);
	ret = casbox_lsm_get(db->lsm, k, ks, db->value, &error);
	if (ret < 0)
		i_fatal("%s", error);
	return ret > 0;
}

static unsigned int cb_scan(void *_db, const void *prefix, size_t size)
{
	struct cb_db *db = _db;
	struct casbox_lsm_iter *iter;
	const unsigned char *k, *v;
	size_t ks, vs;
	unsigned int n = 0;
	const char *error;

	iter = casbox_lsm_iter_init(db->lsm, prefix, size);
	while (casbox_lsm_iter_next(iter, &k, &ks, &v, &vs))
		n++;
	if (casbox_lsm_iter_deinit(&iter, &error) < 0)
		i_fatal("%s", error);
	return n;
}

/* ---- LevelDB ---- */
struct ldb_db {
	leveldb_t *db;
	leveldb_options_t *opts;
	leveldb_filterpolicy_t *bloom;
	leveldb_writeoptions_t *wopts;
	leveldb_readoptions_t *ropts;
	leveldb_writebatch_t *batch;
};

static void *ldb_open(const char *dir, bool sync)
{
	struct ldb_db *db = i_new(struct ldb_db, 1);
	char *err = NULL;

	db->opts = leveldb_options_create();
	leveldb_options_set_create_if_missing(db->opts, 1);
	db->bloom = leveldb_filterpolicy_create_bloom(10);
	leveldb_options_set_filter_policy(db->opts, db->bloom);
	db->db = leveldb_open(db->opts, dir, &err);
	if (err != NULL)
		i_fatal("leveldb_open: %s", err);
	db->wopts = leveldb_writeoptions_create();
	leveldb_writeoptions_set_sync(db->wopts, sync ? 1 : 0);
	db->ropts = leveldb_readoptions_create();
	db->batch = leveldb_writebatch_create();
	return db;
}

static void ldb_close(void *_db)
{
	struct ldb_db *db = _db;

	leveldb_close(db->db);
	leveldb_writebatch_destroy(db->batch);
	leveldb_writeoptions_destroy(db->wopts);
	leveldb_readoptions_destroy(db->ropts);
	leveldb_options_destroy(db->opts);
	leveldb_filterpolicy_destroy(db->bloom);
	i_free(db);
}

static void ldb_begin(void *_db)
{
	leveldb_writebatch_clear(((struct ldb_db *)_db)->batch);
}

static void ldb_put(void *_db, const void *k, size_t ks, const void *v,
		    size_t vs)
{
	leveldb_writebatch_put(((struct ldb_db *)_db)->batch, k, ks, v, vs);
}

static void ldb_commit(void *_db)
{
	struct ldb_db *db = _db;
	char *err = NULL;

	leveldb_write(db->db, db->wopts, db->batch, &err);
	if (err != NULL)
		i_fatal("leveldb_write: %s", err);
}

static bool ldb_get(void *_db, const void *k, size_t ks)
{
	struct ldb_db *db = _db;
	char *err = NULL, *v;
	size_t vs;

	v = leveldb_get(db->db, db->ropts, k, ks, &vs, &err);
	if (err != NULL)
		i_fatal("leveldb_get: %s", err);
	leveldb_free(v);
	return v != NULL;
}

static unsigned int ldb_scan(void *_db, const void *prefix, size_t size)
{
	struct ldb_db *db = _db;
	leveldb_iterator_t *it = leveldb_create_iterator(db->db, db->ropts);
	unsigned int n = 0;
	const char *k;
	size_t ks, vs;

	for (leveldb_iter_seek(it, prefix, size); leveldb_iter_valid(it);
	     leveldb_iter_next(it)) {
		k = leveldb_iter_key(it, &ks);
		(void)leveldb_iter_value(it, &vs);
		if (ks < size || memcmp(k, prefix, size) != 0)
			break;
		n++;
	}
	leveldb_iter_destroy(it);
	return n;
}

/* ---- SQLite ---- */
struct sql_db {
	sqlite3 *db;
	sqlite3_stmt *put, *get, *scan, *begin, *commit;
};

static void sql_exec(sqlite3 *db, const char *sql)
{
	char *err = NULL;

	if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
		i_fatal("sqlite: %s: %s", sql, err);
}

static sqlite3_stmt *sql_prep(sqlite3 *db, const char *sql)
{
	sqlite3_stmt *stmt;

	if (sqlite3_prepare_v2(db, sql, -1, &stmt, NULL) != SQLITE_OK)
		i_fatal("sqlite prepare: %s", sqlite3_errmsg(db));
	return stmt;
}

static void *sql_open(const char *dir, bool sync)
{
	struct sql_db *db = i_new(struct sql_db, 1);

	if (sqlite3_open(t_strconcat(dir, "/db.sqlite", NULL),
			 &db->db) != SQLITE_OK)
		i_fatal("sqlite3_open failed");
	sql_exec(db->db, "PRAGMA journal_mode=WAL");
	sql_exec(db->db, sync ? "PRAGMA synchronous=FULL" :
		 "PRAGMA synchronous=OFF");
	sql_exec(db->db, "CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB) "
		 "WITHOUT ROWID");
	db->put = sql_prep(db->db, "INSERT OR REPLACE INTO kv VALUES (?, ?)");
	db->get = sql_prep(db->db, "SELECT v FROM kv WHERE k = ?");
	db->scan = sql_prep(db->db, "SELECT k, v FROM kv WHERE k >= ? "
			    "AND k < ? ORDER BY k");
	db->begin = sql_prep(db->db, "BEGIN");
	db->commit = sql_prep(db->db, "COMMIT");
	return db;
}

static void sql_close(void *_db)
{
	struct sql_db *db = _db;

	sqlite3_finalize(db->put);
	sqlite3_finalize(db->get);
	sqlite3_finalize(db->scan);
	sqlite3_finalize(db->begin);
	sqlite3_finalize(db->commit);
	sqlite3_close(db->db);
	i_free(db);
}

static void sql_step_done(sqlite3_stmt *stmt)
{
	if (sqlite3_step(stmt) != SQLITE_DONE)
		i_fatal("sqlite step failed");
	sqlite3_reset(stmt);
}

static void sql_begin(void *_db)
{
	sql_step_done(((struct sql_db *)_db)->begin);
}

static void sql_put(void *_db, const void *k, size_t ks, const void *v,
		    size_t vs)
{
	struct sql_db *db = _db;

	sqlite3_bind_blob(db->put, 1, k, ks, SQLITE_STATIC);
	sqlite3_bind_blob(db->put, 2, v, vs, SQLITE_STATIC);
	sql_step_done(db->put);
}

static void sql_commit(void *_db)
{
	sql_step_done(((struct sql_db *)_db)->commit);
}

static bool sql_get(void *_db, const void *k, size_t ks)
{
	struct sql_db *db = _db;
	bool found;

	sqlite3_bind_blob(db->get, 1, k, ks, SQLITE_STATIC);
	found = sqlite3_step(db->get) == SQLITE_ROW;
	if (found)
		(void)sqlite3_column_blob(db->get, 0);
	sqlite3_reset(db->get);
	return found;
}

static unsigned int sql_scan(void *_db, const void *prefix, size_t size)
{
	struct sql_db *db = _db;
	unsigned char end[64];
	unsigned int n = 0;

	/* prefixes here never end in 0xff */
	memcpy(end, prefix, size);
	end[size - 1]++;
	sqlite3_bind_blob(db->scan, 1, prefix, size, SQLITE_STATIC);
	sqlite3_bind_blob(db->scan, 2, end, size, SQLITE_STATIC);
	while (sqlite3_step(db->scan) == SQLITE_ROW) {
		(void)sqlite3_column_blob(db->scan, 1);
		n++;
	}
	sqlite3_reset(db->scan);
	return n;
}

static const struct engine engines[] = {
	{ "casbox-lsm", cb_open, cb_close, cb_begin, cb_put, cb_commit,
	  cb_get, cb_scan },
	{ "leveldb", ldb_open, ldb_close, ldb_begin, ldb_put, ldb_commit,
	  ldb_get, ldb_scan },
	{ "sqlite", sql_open, sql_close, sql_begin, sql_put, sql_commit,
	  sql_get, sql_scan },
};
#define N_ENGINES N_ELEMENTS(engines)

/* ---- workload ---- */

static uint32_t rnd_state;

static uint32_t rnd(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 17;
	rnd_state ^= rnd_state << 5;
	return rnd_state;
}

static void fill_random(unsigned char *p, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		p[i] = rnd();
}

static void msg_key(unsigned char key[21], unsigned int mbox, uint32_t uid)
{
	key[0] = 'M';
	memset(key + 1, 0, 16);
	key[1] = 0x10 + mbox; /* stands for the 16-byte mailbox GUID */
	key[17] = uid >> 24; key[18] = uid >> 16; key[19] = uid >> 8;
	key[20] = uid;
}

static void blob_key(unsigned char key[33], unsigned int n)
{
	uint32_t saved = rnd_state;

	/* blob ids are pseudo-random but reproducible from n */
	rnd_state = n * 2654435761U + 12345;
	key[0] = 'B';
	fill_random(key + 1, 32);
	rnd_state = saved;
}

static uint64_t wchar_now(void)
{
	char line[128];
	uint64_t value = 0;
	FILE *f = fopen("/proc/self/io", "r");

	if (f == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL) {
		if (strncmp(line, "wchar: ", 7) == 0)
			value = strtoull(line + 7, NULL, 10);
	}
	fclose(f);
	return value;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct result {
	double ops_per_sec;
	/* per second of CPU (user+sys, all threads): robust on a shared
	   machine, and counts LevelDB's background compaction thread */
	double ops_per_cpu_sec;
	double bytes_per_op;
};

static double cpu_now(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_SELF, &ru) < 0)
		i_fatal("getrusage() failed: %m");
	return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
		ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

struct phase_clock {
	double wall, cpu;
	uint64_t wchar;
};

static void phase_start(struct phase_clock *pc)
{
	pc->wall = now();
	pc->cpu = cpu_now();
	pc->wchar = wchar_now();
}

static void phase_end(const struct phase_clock *pc, unsigned int ops,
		      struct result *res)
{
	double cpu = cpu_now() - pc->cpu;

	res->ops_per_sec = ops / (now() - pc->wall);
	res->ops_per_cpu_sec = cpu > 0 ? ops / cpu : 0;
	res->bytes_per_op = (double)(wchar_now() - pc->wchar) / ops;
}

enum phase { PH_DELIVER, PH_FLAGS, PH_SCAN, PH_LOOKUP, PH_COUNT };
static const char *phase_names[PH_COUNT] = {
	"deliver", "flags", "scan", "lookup"
};

static void run_engine(const struct engine *e, const char *dir,
		       unsigned int messages, bool sync,
		       struct result res[PH_COUNT])
{
	unsigned char key[33], value[200];
	unsigned int i, n_ops, uid[MAILBOXES], blobs = 0, total = 0;
	struct phase_clock pc;
	void *db;
	const char *error;

	if (unlink_directory(dir, UNLINK_DIRECTORY_FLAG_RMDIR, &error) < 0 &&
	    errno != ENOENT)
		i_fatal("%s", error);
	if (mkdir(dir, 0700) < 0)
		i_fatal("mkdir(%s) failed: %m", dir);
	rnd_state = 42;
	memset(uid, 0, sizeof(uid));
	db = e->open(dir, sync);

	phase_start(&pc);
	for (i = 0; i < messages; i++) {
		unsigned int mbox = rnd() % MAILBOXES, parts = 1 + rnd() % 2;

		e->begin(db);
		msg_key(key, mbox, ++uid[mbox]);
		fill_random(value, 160);
		e->put(db, key, 21, value, 160);
		while (parts-- > 0) {
			blob_key(key, blobs++);
			fill_random(value, 90);
			e->put(db, key, 33, value, 90);
		}
		e->commit(db);
	}
	phase_end(&pc, messages, &res[PH_DELIVER]);

	n_ops = messages;
	phase_start(&pc);
	for (i = 0; i < n_ops; i++) {
		unsigned int mbox = rnd() % MAILBOXES;

		e->begin(db);
		msg_key(key, mbox, 1 + rnd() % (uid[mbox] + 1));
		key[0] = 'F';
		fill_random(value, 16);
		e->put(db, key, 21, value, 16);
		e->commit(db);
	}
	phase_end(&pc, n_ops, &res[PH_FLAGS]);

	n_ops = 200;
	phase_start(&pc);
	for (i = 0; i < n_ops; i++) {
		unsigned int mbox = rnd() % MAILBOXES;

		msg_key(key, mbox, 0);
		total += e->scan(db, key, 17);
	}
	/* ops = records scanned */
	phase_end(&pc, total, &res[PH_SCAN]);

	n_ops = messages;
	phase_start(&pc);
	for (i = 0; i < n_ops; i++) {
		blob_key(key, rnd() % blobs);
		if (!e->get(db, key, 33))
			i_fatal("%s: blob %u missing", e->name, i);
	}
	phase_end(&pc, n_ops, &res[PH_LOOKUP]);
	e->close(db);
}

static double ratio(double a, double b)
{
	return b == 0 ? 0 : a / b;
}

static void report(const char *title, struct result res[N_ENGINES][PH_COUNT])
{
	unsigned int p, i;

	printf("\n== %s ==\n", title);
	printf("%-8s %-11s %12s %14s %10s\n", "phase", "engine", "ops/s",
	       "ops/cpu-s", "wB/op");
	for (p = 0; p < PH_COUNT; p++) {
		for (i = 0; i < N_ENGINES; i++) {
			printf("%-8s %-11s %12.0f %14.0f %10.1f\n",
			       phase_names[p], engines[i].name,
			       res[i][p].ops_per_sec,
			       res[i][p].ops_per_cpu_sec,
			       res[i][p].bytes_per_op);
		}
		printf("%-8s %-11s %11.2fx %13.2fx %9.2fx\n", "",
		       "casbox/ldb",
		       ratio(res[0][p].ops_per_sec, res[1][p].ops_per_sec),
		       ratio(res[0][p].ops_per_cpu_sec,
			     res[1][p].ops_per_cpu_sec),
		       ratio(res[0][p].bytes_per_op,
			     res[1][p].bytes_per_op));
	}
}

int main(int argc, char **argv)
{
	unsigned int messages = argc > 1 ? atoi(argv[1]) : 100000;
	unsigned int sync_messages = argc > 2 ? atoi(argv[2]) : 1000;
	const char *base = argc > 3 ? argv[3] : "/tmp/lsm-bench";
	const char *only = argc > 4 ? argv[4] : NULL;
	struct result res[N_ENGINES][PH_COUNT];
	unsigned int i;
	const char *error;

	lib_init();
	(void)mkdir(base, 0700);
	i_zero(&res);
	for (i = 0; i < N_ENGINES; i++) T_BEGIN {
		if (only == NULL || strcmp(only, engines[i].name) == 0) {
			run_engine(&engines[i], t_strconcat(base, "/",
				   engines[i].name, NULL), messages, FALSE,
				   res[i]);
		}
	} T_END;
	report(t_strdup_printf("nosync, %u messages", messages), res);
	for (i = 0; i < N_ENGINES && sync_messages > 0; i++) T_BEGIN {
		if (only == NULL || strcmp(only, engines[i].name) == 0) {
			run_engine(&engines[i], t_strconcat(base, "/",
				   engines[i].name, NULL), sync_messages,
				   TRUE, res[i]);
		}
	} T_END;
	report(t_strdup_printf("sync (fdatasync per batch), %u messages",
			       sync_messages), res);
	if (unlink_directory(base, UNLINK_DIRECTORY_FLAG_RMDIR, &error) < 0)
		i_error("%s", error);
	lib_deinit();
	return 0;
}
