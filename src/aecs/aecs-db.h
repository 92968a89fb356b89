#ifndef AECS_DB_H
#define AECS_DB_H

/* The AECS database: a SQLite file (--db), or an in-memory SQLite whose
   every write is also rendered as a literal SQL statement into a file
   (--sql, for "wrangler d1 execute --file" or the sqlite3 CLI), so the
   file holds exactly the rows the database got. See doc/aecs.md. */

struct aecs_db;
struct aecs_rows;

enum aecs_value_type {
	AECS_VALUE_NULL = 0,
	AECS_VALUE_INT,
	AECS_VALUE_TEXT,
};

struct aecs_value {
	enum aecs_value_type type;
	int64_t num;
	/* UTF-8 */
	const char *str;
};

#define AECS_NULL ((struct aecs_value){ .type = AECS_VALUE_NULL })
#define AECS_INT(n) \
	((struct aecs_value){ .type = AECS_VALUE_INT, .num = (n) })
#define AECS_TEXT(s) \
	((struct aecs_value){ .type = AECS_VALUE_TEXT, .str = (s) })
/* NULL for a NULL s */
#define AECS_TEXT_OR_NULL(s) \
	((s) == NULL ? AECS_NULL : AECS_TEXT(s))

enum aecs_db_flags {
	/* leave out the optional aecs_search table (and insert_search) */
	AECS_DB_FLAG_NO_SEARCH = 0x01,
	/* open an existing file without creating or migrating anything
	   (aecs query) */
	AECS_DB_FLAG_READ_ONLY = 0x02,
};

/* Open db_path (created with the schema if needed), or with db_path
   NULL an in-memory database whose writes go to sql_path as well
   (truncated; the schema first). Returns 0 ok, -1 error. */
int aecs_db_open(const char *db_path, const char *sql_path,
		 enum aecs_db_flags flags, struct aecs_db **db_r,
		 const char **error_r);
/* Close; flushes and fsyncs the SQL file. Returns 0 ok, -1 error
   (the SQL file could not be written: it is incomplete). */
int aecs_db_close(struct aecs_db **db, const char **error_r);

bool aecs_db_has_search(struct aecs_db *db);

/* Cloudflare D1 refuses a statement longer than this many bytes. */
#define AECS_DB_D1_MAX_STATEMENT 100000
/* SQL file: how many statements were longer than that (a long body
   text: the sqlite3 CLI loads them, D1 does not). */
unsigned int aecs_db_oversize_statements(struct aecs_db *db);

int aecs_db_begin(struct aecs_db *db, const char **error_r);
int aecs_db_commit(struct aecs_db *db, const char **error_r);
/* Roll back the open transaction (nothing of it reaches the SQL file's
   database either: the file is then incomplete, and close fails). */
void aecs_db_rollback(struct aecs_db *db);

/* Run write statement sql (one statement, positional ?1..?n bound to
   values[0..n-1]); sql must be a string that lives as long as db (a
   named query's or a constant: prepared statements are cached by its
   address). Returns the number of rows it changed, -1 error. */
int aecs_db_write(struct aecs_db *db, const char *sql,
		  const struct aecs_value *values, unsigned int count,
		  const char **error_r);
/* The named query of sqlite-queries.sql (must exist). */
const char *aecs_db_named(const char *name);

/* Run read statement sql (not written to the SQL file). */
int aecs_db_read_init(struct aecs_db *db, const char *sql,
		      const struct aecs_value *values, unsigned int count,
		      struct aecs_rows **rows_r, const char **error_r);
/* Returns 1 a row, 0 no more, -1 error (then deinit says it). */
int aecs_db_read_next(struct aecs_rows *rows);
unsigned int aecs_db_read_columns(struct aecs_rows *rows);
const char *aecs_db_read_name(struct aecs_rows *rows, unsigned int col);
/* NULL for SQL NULL; valid until the next read_next() */
const char *aecs_db_read_text(struct aecs_rows *rows, unsigned int col);
int64_t aecs_db_read_int(struct aecs_rows *rows, unsigned int col);
/* Returns 0 ok, -1 the reads failed. */
int aecs_db_read_deinit(struct aecs_rows **rows, const char **error_r);

/* sql with ?N replaced by the SQL literals of values (what the SQL file
   gets; text as '...' with '' for ', integers in decimal). Data
   stack. */
const char *aecs_db_render(const char *sql, const struct aecs_value *values,
			   unsigned int count);

/* The query plan of sql ("EXPLAIN QUERY PLAN" detail lines joined by
   "\n"), parameters bound to NULL. Data stack; NULL on error. */
const char *aecs_db_query_plan(struct aecs_db *db, const char *sql,
			       const char **error_r);

#endif
