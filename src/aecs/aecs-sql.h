#ifndef AECS_SQL_H
#define AECS_SQL_H

/* The AECS schema and named queries, compiled in from sql/ (copies of
   ../shared/aecs/, the contract; see doc/aecs.md). */

struct aecs_sql_query {
	/* the "-- name:" of the block */
	const char *name;
	/* the statement, without its comment lines, ending in ";\n" */
	const char *sql;
};

/* sql/sqlite.sql, byte for byte */
extern const char aecs_sql_schema[];
/* sql/sqlite-queries.sql in file order; ends with a NULL name */
extern const struct aecs_sql_query aecs_sql_queries[];

/* The named query, or NULL. */
const struct aecs_sql_query *aecs_sql_query_find(const char *name);

#endif
