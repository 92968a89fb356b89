/* doveadm casbox aecs query: one named read query of
   sqlite-queries.sql against an export, through doveadm's formatters. */

#include "lib.h"
#include "array.h"
#include "str.h"
#include "doveadm.h"
#include "doveadm-cmd.h"
#include "doveadm-print.h"
#include "aecs-norm.h"
#include "aecs-db.h"
#include "aecs-sql.h"
#include "doveadm-casbox-aecs.h"

#include <ctype.h>
#include <sysexits.h>

/* the read queries, and which parameter (1-based, 0: none) is a key
   that may be given as the id it hashes */
static const struct {
	const char *name;
	unsigned int key_param;
	unsigned int email_param;
} aecs_read_queries[] = {
	{ "thread_context", 2, 0 },
	{ "inbox_first_page", 0, 0 },
	{ "inbox_next_page", 0, 0 },
	{ "threads_recent", 0, 0 },
	{ "messages_with_participant", 0, 2 },
	{ "message_by_id", 2, 0 },
	{ "replies_to", 0, 0 },
	{ "search", 0, 0 },
	{ "stale_spec_version", 0, 0 },
};

static bool aecs_is_key(const char *s)
{
	return strlen(s) == AECS_KEY_HEX_LEN &&
		strspn(s, "0123456789abcdef") == AECS_KEY_HEX_LEN;
}

static bool aecs_is_number(const char *s)
{
	const char *p = *s == '-' ? s + 1 : s;

	return *p != '\0' && strspn(p, "0123456789") == strlen(p);
}

/* The single mailbox_id of the export, or NULL (none or several). */
static const char *aecs_query_default_id(struct aecs_db *db)
{
	struct aecs_rows *rows;
	const char *id = NULL, *error;
	int n = 0;

	if (aecs_db_read_init(db, "SELECT DISTINCT mailbox_id FROM "
			      "casbox_aecs_cursor LIMIT 2", NULL, 0, &rows,
			      &error) < 0)
		return NULL;
	while (aecs_db_read_next(rows) > 0) {
		if (n++ == 0)
			id = t_strdup(aecs_db_read_text(rows, 0));
	}
	(void)aecs_db_read_deinit(&rows, &error);
	return n == 1 ? id : NULL;
}

static int aecs_query_print(struct aecs_db *db, const char *sql,
			    const struct aecs_value *values,
			    unsigned int count, const char **error_r)
{
	struct aecs_rows *rows;
	unsigned int i, cols;
	int ret;

	if (aecs_db_read_init(db, sql, values, count, &rows, error_r) < 0)
		return -1;
	cols = aecs_db_read_columns(rows);
	for (i = 0; i < cols; i++)
		doveadm_print_header_simple(aecs_db_read_name(rows, i));
	while ((ret = aecs_db_read_next(rows)) > 0) {
		for (i = 0; i < cols; i++) {
			const char *text = aecs_db_read_text(rows, i);

			doveadm_print(text == NULL ? "" : text);
		}
	}
	return aecs_db_read_deinit(&rows, error_r);
}

/* the highest ?N of sql */
static unsigned int aecs_query_params(const char *sql)
{
	unsigned int max = 0, n;
	const char *p;

	for (p = sql; *p != '\0'; p++) {
		if (*p != '?')
			continue;
		for (n = 0; i_isdigit(p[1]); p++)
			n = n * 10 + (p[1] - '0');
		if (n > max)
			max = n;
	}
	return max;
}

/* Errors end the command with their exit status (doveadm_exit_code
   is a variable of the doveadm binary, which a lazily bound plugin
   cannot reference: tests/check-plugin-shape.c). */
static void ATTR_NORETURN aecs_query_usage(const char *error)
{
	i_fatal_status(EX_USAGE, "casbox aecs query: %s", error);
}

void cmd_casbox_aecs_query(struct doveadm_cmd_context *cctx)
{
	const char *db_path, *mailbox_id = NULL, *error, *sql;
	const char *const *args;
	ARRAY(struct aecs_value) values;
	struct aecs_db *db;
	unsigned int i, q, nparams;

	if (!doveadm_cmd_param_str(cctx, "db", &db_path) ||
	    !doveadm_cmd_param_array(cctx, "query", &args) || args[0] == NULL) {
		aecs_query_usage("usage: casbox aecs query --db FILE "
				 "[--mailbox-id ID] NAME [args]");
	}
	for (q = 0; q < N_ELEMENTS(aecs_read_queries); q++) {
		if (strcmp(aecs_read_queries[q].name, args[0]) == 0)
			break;
	}
	if (q == N_ELEMENTS(aecs_read_queries)) {
		aecs_query_usage(t_strdup_printf("unknown query '%s'",
						 args[0]));
	}
	sql = aecs_db_named(args[0]);
	if (aecs_db_open(db_path, NULL, AECS_DB_FLAG_READ_ONLY, &db,
			 &error) < 0)
		i_fatal_status(EX_NOINPUT, "casbox aecs query: %s", error);
	(void)doveadm_cmd_param_str(cctx, "mailbox-id", &mailbox_id);
	if (mailbox_id == NULL)
		mailbox_id = aecs_query_default_id(db);
	nparams = aecs_query_params(sql);
	if (mailbox_id == NULL) {
		aecs_query_usage("the export holds several (or no) "
				 "mailbox ids: give --mailbox-id");
	} else if (str_array_length(args) != nparams) {
		aecs_query_usage(t_strdup_printf("%s takes %u argument(s) "
			"after the mailbox id", args[0], nparams - 1));
	} else {
		t_array_init(&values, nparams);
		array_push_back(&values, &AECS_TEXT(mailbox_id));
		for (i = 1; i < nparams; i++) {
			const char *arg = args[i];

			if (i + 1 == aecs_read_queries[q].key_param &&
			    !aecs_is_key(arg))
				arg = aecs_key(arg);
			if (i + 1 == aecs_read_queries[q].email_param)
				arg = aecs_lower(arg);
			array_push_back(&values, aecs_is_number(arg) ?
					&AECS_INT(strtoll(arg, NULL, 10)) :
					&AECS_TEXT(arg));
		}
		doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
		if (aecs_query_print(db, sql, array_front(&values), nparams,
				     &error) < 0) {
			i_fatal_status(EX_TEMPFAIL, "casbox aecs query: %s",
				       error);
		}
	}
	if (aecs_db_close(&db, &error) < 0)
		i_error("casbox aecs query: %s", error);
}
