/* The AECS database: SQLite file, or in-memory SQLite plus SQL file. */

#include "lib.h"
#include "str.h"
#include "hash.h"
#include "ostream.h"
#include "aecs-sql.h"
#include "aecs-db.h"

#include <ctype.h>
#include <fcntl.h>
#include <unistd.h>
#include <sqlite3.h>

/* where the optional search table begins in sqlite.sql */
#define AECS_SEARCH_DDL_START "-- Optional full-text search"

struct aecs_db {
	sqlite3 *sqlite;
	enum aecs_db_flags flags;
	/* the optional aecs_search table exists */
	bool have_search;
	HASH_TABLE(const char *, sqlite3_stmt *) stmts;

	/* --sql: the file every write goes to, else NULL */
	char *sql_path;
	struct ostream *sql_output;
	/* a transaction was rolled back: the SQL file has statements
	   the database no longer has */
	bool failed;
	unsigned int oversize_statements;
};

struct aecs_rows {
	struct aecs_db *db;
	sqlite3_stmt *stmt;
	char *error;
};

const struct aecs_sql_query *aecs_sql_query_find(const char *name)
{
	const struct aecs_sql_query *q;

	for (q = aecs_sql_queries; q->name != NULL; q++) {
		if (strcmp(q->name, name) == 0)
			return q;
	}
	return NULL;
}

const char *aecs_db_named(const char *name)
{
	const struct aecs_sql_query *q = aecs_sql_query_find(name);

	i_assert(q != NULL);
	return q->sql;
}

static const char *aecs_db_error(struct aecs_db *db, const char *what)
{
	return t_strdup_printf("%s: %s", what, sqlite3_errmsg(db->sqlite));
}

/* sqlite.sql, without the search table with AECS_DB_FLAG_NO_SEARCH */
static const char *aecs_db_schema(enum aecs_db_flags flags)
{
	const char *p;

	if ((flags & AECS_DB_FLAG_NO_SEARCH) == 0)
		return aecs_sql_schema;
	p = strstr(aecs_sql_schema, AECS_SEARCH_DDL_START);
	i_assert(p != NULL);
	return t_strdup_until(aecs_sql_schema, p);
}

static void aecs_literal_append(string_t *dest, const struct aecs_value *v)
{
	const char *p;

	switch (v->type) {
	case AECS_VALUE_NULL:
		str_append(dest, "NULL");
		return;
	case AECS_VALUE_INT:
		str_printfa(dest, "%"PRId64, v->num);
		return;
	case AECS_VALUE_TEXT:
		str_append_c(dest, '\'');
		for (p = v->str; *p != '\0'; p++) {
			if (*p == '\'')
				str_append_c(dest, '\'');
			str_append_c(dest, *p);
		}
		str_append_c(dest, '\'');
		return;
	}
	i_unreached();
}

const char *aecs_db_render(const char *sql, const struct aecs_value *values,
			   unsigned int count)
{
	string_t *out = t_str_new(strlen(sql) + 64);
	char quote = '\0';
	const char *p;

	for (p = sql; *p != '\0'; p++) {
		if (quote != '\0') {
			if (*p == quote)
				quote = '\0';
		} else if (*p == '\'' || *p == '"') {
			quote = *p;
		} else if (*p == '?' && i_isdigit(p[1])) {
			unsigned int n = 0;

			while (i_isdigit(p[1]))
				n = n * 10 + (*++p - '0');
			i_assert(n >= 1 && n <= count);
			aecs_literal_append(out, &values[n - 1]);
			continue;
		}
		str_append_c(out, *p);
	}
	/* one statement per line end: "...;\n" */
	while (str_len(out) > 0 &&
	       (str_data(out)[str_len(out) - 1] == '\n' ||
		str_data(out)[str_len(out) - 1] == ';' ||
		str_data(out)[str_len(out) - 1] == ' '))
		str_truncate(out, str_len(out) - 1);
	str_append(out, ";\n");
	return str_c(out);
}

static int aecs_db_exec(struct aecs_db *db, const char *sql,
			const char **error_r)
{
	char *msg = NULL;

	if (sqlite3_exec(db->sqlite, sql, NULL, NULL, &msg) != SQLITE_OK) {
		*error_r = t_strdup_printf("sqlite: %s",
					   msg != NULL ? msg : "failed");
		sqlite3_free(msg);
		return -1;
	}
	return 0;
}

static int aecs_db_sql_open(struct aecs_db *db, const char **error_r)
{
	int fd;

	fd = open(db->sql_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", db->sql_path);
		return -1;
	}
	db->sql_output = o_stream_create_fd_autoclose(&fd, 0);
	o_stream_cork(db->sql_output);
	o_stream_nsend_str(db->sql_output,
		"-- AECS export by doveadm casbox aecs export (casbox "
		CASBOX_VERSION ").\n"
		"-- Load: sqlite3 FILE.sqlite < this, or wrangler d1 execute "
		"DB --file this\n\n");
	return 0;
}

static bool aecs_db_find_search(struct aecs_db *db)
{
	sqlite3_stmt *stmt;
	bool found;

	if (sqlite3_prepare_v2(db->sqlite,
			       "SELECT 1 FROM sqlite_master WHERE "
			       "name = 'aecs_search'", -1, &stmt,
			       NULL) != SQLITE_OK)
		return FALSE;
	found = sqlite3_step(stmt) == SQLITE_ROW;
	sqlite3_finalize(stmt);
	return found;
}

int aecs_db_open(const char *db_path, const char *sql_path,
		 enum aecs_db_flags flags, struct aecs_db **db_r,
		 const char **error_r)
{
	struct aecs_db *db;
	int oflags = (flags & AECS_DB_FLAG_READ_ONLY) != 0 ?
		SQLITE_OPEN_READONLY :
		SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
	int ret = 0;

	i_assert((db_path == NULL) != (sql_path == NULL));
	db = i_new(struct aecs_db, 1);
	db->flags = flags;
	hash_table_create_direct(&db->stmts, default_pool, 0);
	if (sqlite3_open_v2(db_path != NULL ? db_path : ":memory:",
			    &db->sqlite, oflags, NULL) != SQLITE_OK) {
		*error_r = t_strdup_printf("sqlite3_open(%s) failed: %s",
					   db_path != NULL ? db_path : sql_path,
					   db->sqlite == NULL ?
					   "out of memory" :
					   sqlite3_errmsg(db->sqlite));
		ret = -1;
	} else if ((flags & AECS_DB_FLAG_READ_ONLY) == 0) {
		const char *schema = aecs_db_schema(flags);

		sqlite3_busy_timeout(db->sqlite, 10000);
		/* an export reads back what it wrote (threads, locations):
		   keep the pages in memory instead of re-reading them */
		ret = aecs_db_exec(db, "PRAGMA cache_size = -65536", error_r);
		if (ret == 0 && sql_path != NULL) {
			db->sql_path = i_strdup(sql_path);
			ret = aecs_db_sql_open(db, error_r);
			if (ret == 0)
				o_stream_nsend_str(db->sql_output, schema);
		}
		if (ret == 0)
			ret = aecs_db_exec(db, schema, error_r);
	}
	if (ret == 0)
		db->have_search = aecs_db_find_search(db);
	if (ret < 0) {
		const char *error;

		(void)aecs_db_close(&db, &error);
		return -1;
	}
	*db_r = db;
	return 0;
}

unsigned int aecs_db_oversize_statements(struct aecs_db *db)
{
	return db->oversize_statements;
}

bool aecs_db_has_search(struct aecs_db *db)
{
	return db->have_search;
}

int aecs_db_close(struct aecs_db **_db, const char **error_r)
{
	struct aecs_db *db = *_db;
	struct hash_iterate_context *iter;
	const char *sql;
	sqlite3_stmt *stmt;
	int ret = 0;

	*_db = NULL;
	iter = hash_table_iterate_init(db->stmts);
	while (hash_table_iterate(iter, db->stmts, &sql, &stmt))
		sqlite3_finalize(stmt);
	hash_table_iterate_deinit(&iter);
	hash_table_destroy(&db->stmts);
	if (db->sql_output != NULL) {
		if (db->failed) {
			*error_r = t_strdup_printf("%s is incomplete (a write "
						   "failed)", db->sql_path);
			ret = -1;
		}
		if (o_stream_finish(db->sql_output) < 0) {
			*error_r = t_strdup_printf("write(%s) failed: %s",
				db->sql_path,
				o_stream_get_error(db->sql_output));
			ret = -1;
		} else if (ret == 0 &&
			   fsync(o_stream_get_fd(db->sql_output)) < 0) {
			*error_r = t_strdup_printf("fsync(%s) failed: %m",
						   db->sql_path);
			ret = -1;
		}
		o_stream_destroy(&db->sql_output);
	}
	if (db->sqlite != NULL && sqlite3_close(db->sqlite) != SQLITE_OK &&
	    ret == 0) {
		*error_r = aecs_db_error(db, "sqlite3_close()");
		ret = -1;
	}
	i_free(db->sql_path);
	i_free(db);
	return ret;
}

int aecs_db_begin(struct aecs_db *db, const char **error_r)
{
	return aecs_db_exec(db, "BEGIN", error_r);
}

int aecs_db_commit(struct aecs_db *db, const char **error_r)
{
	return aecs_db_exec(db, "COMMIT", error_r);
}

void aecs_db_rollback(struct aecs_db *db)
{
	const char *error;

	if (aecs_db_exec(db, "ROLLBACK", &error) < 0)
		i_error("aecs: %s", error);
	db->failed = TRUE;
}

static int aecs_db_prepare(struct aecs_db *db, const char *sql,
			   const struct aecs_value *values,
			   unsigned int count, sqlite3_stmt **stmt_r,
			   const char **error_r)
{
	sqlite3_stmt *stmt = hash_table_lookup(db->stmts, sql);
	unsigned int i;
	int rc = SQLITE_OK;

	if (stmt == NULL) {
		if (sqlite3_prepare_v2(db->sqlite, sql, -1, &stmt,
				       NULL) != SQLITE_OK) {
			*error_r = aecs_db_error(db, t_strdup_printf(
				"prepare(%.40s...)", sql));
			return -1;
		}
		hash_table_insert(db->stmts, sql, stmt);
	}
	for (i = 0; i < count && rc == SQLITE_OK; i++) {
		switch (values[i].type) {
		case AECS_VALUE_NULL:
			rc = sqlite3_bind_null(stmt, i + 1);
			break;
		case AECS_VALUE_INT:
			rc = sqlite3_bind_int64(stmt, i + 1, values[i].num);
			break;
		case AECS_VALUE_TEXT:
			rc = sqlite3_bind_text(stmt, i + 1, values[i].str, -1,
					       SQLITE_TRANSIENT);
			break;
		}
	}
	if (rc != SQLITE_OK) {
		*error_r = aecs_db_error(db, "bind");
		sqlite3_reset(stmt);
		return -1;
	}
	*stmt_r = stmt;
	return 0;
}

int aecs_db_write(struct aecs_db *db, const char *sql,
		  const struct aecs_value *values, unsigned int count,
		  const char **error_r)
{
	sqlite3_stmt *stmt;
	int rc, changes;

	if (aecs_db_prepare(db, sql, values, count, &stmt, error_r) < 0)
		return -1;
	rc = sqlite3_step(stmt);
	changes = sqlite3_changes(db->sqlite);
	if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
		*error_r = aecs_db_error(db, t_strdup_printf(
			"step(%.40s...)", sql));
		sqlite3_reset(stmt);
		return -1;
	}
	sqlite3_reset(stmt);
	sqlite3_clear_bindings(stmt);
	if (db->sql_output != NULL) T_BEGIN {
		const char *stmt = aecs_db_render(sql, values, count);

		if (strlen(stmt) > AECS_DB_D1_MAX_STATEMENT)
			db->oversize_statements++;
		o_stream_nsend_str(db->sql_output, stmt);
	} T_END;
	return changes;
}

int aecs_db_read_init(struct aecs_db *db, const char *sql,
		      const struct aecs_value *values, unsigned int count,
		      struct aecs_rows **rows_r, const char **error_r)
{
	struct aecs_rows *rows;
	sqlite3_stmt *stmt;

	if (aecs_db_prepare(db, sql, values, count, &stmt, error_r) < 0)
		return -1;
	rows = i_new(struct aecs_rows, 1);
	rows->db = db;
	rows->stmt = stmt;
	*rows_r = rows;
	return 0;
}

int aecs_db_read_next(struct aecs_rows *rows)
{
	int rc;

	if (rows->error != NULL)
		return -1;
	rc = sqlite3_step(rows->stmt);
	if (rc == SQLITE_ROW)
		return 1;
	if (rc == SQLITE_DONE)
		return 0;
	rows->error = i_strdup(aecs_db_error(rows->db, "step"));
	return -1;
}

unsigned int aecs_db_read_columns(struct aecs_rows *rows)
{
	return sqlite3_column_count(rows->stmt);
}

const char *aecs_db_read_name(struct aecs_rows *rows, unsigned int col)
{
	return sqlite3_column_name(rows->stmt, col);
}

const char *aecs_db_read_text(struct aecs_rows *rows, unsigned int col)
{
	return (const char *)sqlite3_column_text(rows->stmt, col);
}

int64_t aecs_db_read_int(struct aecs_rows *rows, unsigned int col)
{
	return sqlite3_column_int64(rows->stmt, col);
}

int aecs_db_read_deinit(struct aecs_rows **_rows, const char **error_r)
{
	struct aecs_rows *rows = *_rows;
	int ret = 0;

	*_rows = NULL;
	sqlite3_reset(rows->stmt);
	sqlite3_clear_bindings(rows->stmt);
	if (rows->error != NULL) {
		*error_r = t_strdup(rows->error);
		ret = -1;
	}
	i_free(rows->error);
	i_free(rows);
	return ret;
}

const char *aecs_db_query_plan(struct aecs_db *db, const char *sql,
			       const char **error_r)
{
	string_t *out = t_str_new(256);
	sqlite3_stmt *stmt;
	int rc;

	if (sqlite3_prepare_v2(db->sqlite,
			       t_strconcat("EXPLAIN QUERY PLAN ", sql, NULL),
			       -1, &stmt, NULL) != SQLITE_OK) {
		*error_r = aecs_db_error(db, "prepare(EXPLAIN QUERY PLAN)");
		return NULL;
	}
	while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		if (str_len(out) > 0)
			str_append_c(out, '\n');
		str_append(out, (const char *)sqlite3_column_text(stmt, 3));
	}
	sqlite3_finalize(stmt);
	if (rc != SQLITE_DONE) {
		*error_r = aecs_db_error(db, "EXPLAIN QUERY PLAN");
		return NULL;
	}
	return str_c(out);
}
