/* AECS export, the pure part (src/aecs): keys and ids against known
   SHA-256 answers, dates, JSON, text sanitizing and cleaning, the forai
   bound, SQL literal rendering, the SQL file loading into the same rows
   as the database, and the query plan of every named read query. */

#include "lib.h"
#include "str.h"
#include "aecs-norm.h"
#include "aecs-text.h"
#include "aecs-db.h"
#include "aecs-sql.h"

#include <check.h>
#include "check-run.h"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sqlite3.h>

static char tmpdir[] = "/tmp/check-aecs.XXXXXX";

START_TEST(test_keys)
{
	ck_assert_str_eq(aecs_key(""), "e3b0c44298fc1c149afbf4c8996fb924"
			 "27ae41e4649b934ca495991b7852b855");
	ck_assert_str_eq(aecs_key("abc"), "ba7816bf8f01cfea414140de5dae2223"
			 "b00361a396177a9cb410ff61f20015ad");
	ck_assert_uint_eq(strlen(aecs_key("x@y")), AECS_KEY_HEX_LEN);
	ck_assert_str_eq(aecs_synthetic_message_id((const void *)"abc", 3),
			 "aecs-ba7816bf8f01cfea414140de5dae2223"
			 "@synthetic.invalid");
}
END_TEST

static const char *ids_str(const char *value, bool require_at,
			   unsigned int max)
{
	const char *const *ids = aecs_msgids_parse((const void *)value,
						   strlen(value), require_at,
						   max);

	return t_strarray_join(ids, "|");
}

START_TEST(test_msgids)
{
	ck_assert_str_eq(ids_str("<a@b>", FALSE, 10), "a@b");
	ck_assert_str_eq(ids_str(" <a@b> (comment) <c@d>", FALSE, 1), "a@b");
	ck_assert_str_eq(ids_str("<a@b>\r\n <c\r\n @d> <yes> <> <e@f",
				 TRUE, 10), "a@b|c@d");
	ck_assert_str_eq(ids_str("<yes>", FALSE, 10), "yes");
	ck_assert_str_eq(ids_str("<11107978796724623>", FALSE, 1),
			 "11107978796724623");
	/* no brackets: the value itself, only for a Message-ID */
	ck_assert_str_eq(ids_str("  12345@host ", FALSE, 1), "12345@host");
	ck_assert_str_eq(ids_str("12345@host", TRUE, 1), "");
	ck_assert_str_eq(ids_str("", FALSE, 1), "");
	ck_assert_str_eq(ids_str("<> <>", FALSE, 1), "");
	ck_assert_str_eq(ids_str("<a@b><c@d><e@f>", TRUE, 2), "a@b|c@d");
}
END_TEST

START_TEST(test_thread_root)
{
	const char *refs[] = { "root@x", "mid@x", NULL };
	const char *none[] = { NULL };

	ck_assert_str_eq(aecs_thread_root(refs, "mid@x", "me@x"), "root@x");
	ck_assert_str_eq(aecs_thread_root(none, "parent@x", "me@x"),
			 "parent@x");
	ck_assert_str_eq(aecs_thread_root(NULL, NULL, "me@x"), "me@x");
	ck_assert_str_eq(aecs_thread_root(NULL, "", "me@x"), "me@x");
}
END_TEST

START_TEST(test_dates)
{
	struct timeval tv = { .tv_sec = 1030034463, .tv_usec = 45678 };

	ck_assert_str_eq(aecs_date_rfc3339(0, 0), "1970-01-01T00:00:00Z");
	ck_assert_str_eq(aecs_date_rfc3339(1030034463, 60),
			 "2002-08-22T17:41:03+01:00");
	ck_assert_str_eq(aecs_date_rfc3339(1030034463, -330),
			 "2002-08-22T11:11:03-05:30");
	ck_assert_str_eq(aecs_processed_at(&tv), "2002-08-22T16:41:03.045Z");
	ck_assert(aecs_ts_ms(1030034463) == 1030034463000LL);
}
END_TEST

START_TEST(test_json)
{
	string_t *str = t_str_new(64);

	aecs_json_append_str(str, "a\"b\\c\nd\te\x01" "\xc3\xa9");
	ck_assert_str_eq(str_c(str),
			 "\"a\\\"b\\\\c\\nd\\te\\u0001\xc3\xa9\"");
}
END_TEST

START_TEST(test_sanitize)
{
	static const unsigned char in[] = "a\r\nb\rc\0d\xff" "e";

	ck_assert_str_eq(aecs_text_sanitize(in, sizeof(in) - 1),
			 "a\nb\ncd\xef\xbf\xbd" "e");
	ck_assert_str_eq(aecs_text_sanitize((const void *)"", 0), "");
}
END_TEST

static const struct {
	const char *text, *clean;
	bool fallback;
} clean_cases[] = {
	{ "Hello\n\nOn Mon, 1 Jan 2001, Ann <a@b> wrote:\n> old\n> more\n"
	  "\nThanks\n", "Hello\n\nThanks", FALSE },
	{ "Top reply\nOn Tue, 2 Jan 2001 10:00, Bob Smith\n<b@c> wrote:\n"
	  ">quoted\n", "Top reply", FALSE },
	{ "Body line\n-- \nMy Signature\nPhone\n", "Body line", FALSE },
	{ "Text\n_______________________________________________\n"
	  "USRP-users mailing list\nUSRP-users@lists.ettus.com\n",
	  "Text", FALSE },
	{ "Sure.\n\n-----Original Message-----\nFrom: x\nSent: y\nold\n",
	  "Sure.", FALSE },
	{ "Sure.\n\nFrom: Ann\nSent: Monday\nSubject: x\n\nold\n", "Sure.",
	  FALSE },
	{ "> only quoted\n> text\n", "> only quoted\n> text", TRUE },
	{ "", "", FALSE },
	/* indentation stays, trailing blanks and blank runs go */
	{ "  a  \n\n\n\n  b\n", "  a\n\n  b", FALSE },
	/* "--" without its space counts only near the end */
	{ "x\n--\ny\n", "x", FALSE },
	/* an attribution-like line that introduces no quote stays */
	{ "He wrote:\nnothing quoted\n", "He wrote:\nnothing quoted", FALSE },
};

START_TEST(test_clean)
{
	unsigned int i;
	bool fallback;

	for (i = 0; i < N_ELEMENTS(clean_cases); i++) {
		const char *clean = aecs_text_clean(clean_cases[i].text,
						    &fallback);

		ck_assert_msg(strcmp(clean, clean_cases[i].clean) == 0,
			      "case %u: '%s'", i, clean);
		ck_assert_msg(fallback == clean_cases[i].fallback,
			      "case %u: fallback", i);
	}
}
END_TEST

START_TEST(test_forai)
{
	const char *f;
	string_t *long_text = t_str_new(4096);
	unsigned int i;

	f = aecs_forai("Ann", "a@b", "2002-08-22T17:41:03+01:00", "Hi",
		       "Body", 100);
	ck_assert_str_eq(f, "From: Ann <a@b> | Date: 2002-08-22T17:41:03+01:00"
			 " | Subject: Hi\n\nBody");
	ck_assert_str_eq(aecs_forai(NULL, "a@b", NULL, NULL, "Body", 100),
			 "From: a@b\n\nBody");
	ck_assert_str_eq(aecs_forai(NULL, "", NULL, NULL, "", 100), "");
	ck_assert(aecs_forai("Ann", "a@b", NULL, "Hi", "Body", 0) == NULL);
	for (i = 0; i < 1000; i++)
		str_append(long_text, "\xc3\xa9t\xc3\xa9 ");
	for (i = 1; i < 50; i++) {
		f = aecs_forai("Ann", "a@b", NULL, "Hi", str_c(long_text), i);
		ck_assert_uint_eq(aecs_text_char_count(f), i);
		ck_assert(strcmp(f + strlen(f) - 3, "…") == 0);
	}
	f = aecs_forai("Ann", "a@b", NULL, "Hi", str_c(long_text),
		       AECS_FORAI_DEFAULT_MAX_CHARS);
	ck_assert_uint_eq(aecs_text_char_count(f),
			  AECS_FORAI_DEFAULT_MAX_CHARS);
}
END_TEST

START_TEST(test_render)
{
	const struct aecs_value v[] = {
		AECS_TEXT("it's"), AECS_INT(-42), AECS_NULL, AECS_TEXT("?1"),
	};

	ck_assert_str_eq(aecs_db_render("SELECT ?1, ?2, ?3, '?1', ?4;\n",
					v, 4),
			 "SELECT 'it''s', -42, NULL, '?1', '?1';\n");
	ck_assert_str_eq(aecs_db_render("SELECT 1", v, 0), "SELECT 1;\n");
}
END_TEST

START_TEST(test_named_queries)
{
	static const char *const names[] = {
		"insert_message", "insert_body", "insert_address",
		"insert_reference", "insert_attachment", "insert_search",
		"upsert_thread", "thread_context", "inbox_first_page",
		"inbox_next_page", "threads_recent",
		"messages_with_participant", "message_by_id", "replies_to",
		"search", "stale_spec_version",
	};
	const struct aecs_sql_query *q;
	unsigned int i, n = 0;
	FILE *f;
	char buf[16384];
	size_t len;

	for (q = aecs_sql_queries; q->name != NULL; q++)
		n++;
	ck_assert_uint_eq(n, N_ELEMENTS(names));
	for (i = 0; i < N_ELEMENTS(names); i++)
		ck_assert(aecs_sql_query_find(names[i]) != NULL);
	ck_assert(aecs_sql_query_find("nope") == NULL);
	ck_assert(strstr(aecs_db_named("upsert_thread"),
			 "WHERE changes() = 1") != NULL);
	/* the compiled-in schema is the file, byte for byte */
	f = fopen(AECS_SQL_DIR "/sqlite.sql", "r");
	ck_assert(f != NULL);
	len = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[len] = '\0';
	ck_assert_str_eq(aecs_sql_schema, buf);
}
END_TEST

static const char *msg_values_key(unsigned int i)
{
	return aecs_key(t_strdup_printf("m%u@x", i));
}

/* insert_message + upsert_thread of message i of a thread */
static void store_message(struct aecs_db *db, unsigned int i, int64_t ts,
			  int expect_changes)
{
	const char *error, *key = msg_values_key(i);
	const char *tkey = aecs_key("m0@x");
	const struct aecs_value v[] = {
		AECS_TEXT("box"), AECS_TEXT(key),
		AECS_TEXT(t_strdup_printf("m%u@x", i)), AECS_TEXT(tkey),
		AECS_TEXT("m0@x"), AECS_INT(ts), AECS_NULL, AECS_TEXT("a@b"),
		AECS_TEXT("O'Neil"), AECS_TEXT(t_strdup_printf("s%u", i)),
		AECS_NULL, AECS_TEXT("forai"), AECS_INT(0), AECS_INT(10),
		AECS_INT(0), AECS_TEXT(AECS_SPEC_VERSION),
		AECS_TEXT("2026-01-01T00:00:00.000Z"), AECS_NULL, AECS_NULL,
	};
	const struct aecs_value tv[] = {
		AECS_TEXT("box"), AECS_TEXT(tkey), AECS_TEXT("m0@x"),
		AECS_TEXT(t_strdup_printf("s%u", i)), AECS_INT(ts),
		AECS_TEXT(key),
	};
	const struct aecs_value sv[] = {
		AECS_TEXT("box"), AECS_TEXT(key), AECS_TEXT("hello world"),
	};

	ck_assert_int_eq(aecs_db_write(db, aecs_db_named("insert_message"),
				       v, N_ELEMENTS(v), &error),
			 expect_changes);
	ck_assert_int_ge(aecs_db_write(db, aecs_db_named("upsert_thread"),
				       tv, N_ELEMENTS(tv), &error), 0);
	ck_assert_int_ge(aecs_db_write(db, aecs_db_named("insert_search"),
				       sv, N_ELEMENTS(sv), &error), 0);
}

static const char *thread_row(struct aecs_db *db)
{
	struct aecs_rows *rows;
	const char *error, *row = NULL;

	ck_assert_int_eq(aecs_db_read_init(db, "SELECT message_count || ',' "
		"|| first_ts || ',' || last_ts || ',' || subject "
		"FROM aecs_threads", NULL, 0, &rows, &error), 0);
	if (aecs_db_read_next(rows) > 0)
		row = t_strdup(aecs_db_read_text(rows, 0));
	ck_assert_int_eq(aecs_db_read_deinit(&rows, &error), 0);
	return row;
}

START_TEST(test_db_and_sql_file)
{
	const char *sql_path = t_strconcat(tmpdir, "/out.sql", NULL);
	const char *db_path = t_strconcat(tmpdir, "/loaded.sqlite", NULL);
	struct aecs_db *db;
	const char *error;
	sqlite3 *raw;
	char *script, *msg = NULL;
	FILE *f;
	long len;

	ck_assert_int_eq(aecs_db_open(NULL, sql_path, 0, &db, &error), 0);
	ck_assert(aecs_db_has_search(db));
	store_message(db, 1, 2000, 1);
	store_message(db, 0, 1000, 1);
	/* again: a no-op that does not count twice */
	store_message(db, 1, 2000, 0);
	ck_assert_str_eq(thread_row(db), "2,1000,2000,s0");
	ck_assert_uint_eq(aecs_db_oversize_statements(db), 0);
	ck_assert_int_eq(aecs_db_close(&db, &error), 0);

	/* the file gives the same rows (loaded by SQLite itself) */
	f = fopen(sql_path, "r");
	ck_assert(f != NULL);
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	script = i_malloc(len + 1);
	ck_assert_int_eq(fread(script, 1, len, f), len);
	fclose(f);
	ck_assert_int_eq(sqlite3_open(db_path, &raw), SQLITE_OK);
	ck_assert_msg(sqlite3_exec(raw, script, NULL, NULL, &msg) == SQLITE_OK,
		      "%s", msg);
	sqlite3_close(raw);
	i_free(script);
	ck_assert_int_eq(aecs_db_open(db_path, NULL, AECS_DB_FLAG_READ_ONLY,
				      &db, &error), 0);
	ck_assert_str_eq(thread_row(db), "2,1000,2000,s0");
	ck_assert_int_eq(aecs_db_close(&db, &error), 0);
}
END_TEST

/* D1 refuses statements over 100 KB: the SQL file counts them */
START_TEST(test_oversize_statement)
{
	string_t *big = t_str_new(AECS_DB_D1_MAX_STATEMENT + 16);
	struct aecs_db *db;
	const char *error;

	while (str_len(big) <= AECS_DB_D1_MAX_STATEMENT)
		str_append(big, "0123456789");
	const struct aecs_value v[] = {
		AECS_TEXT("box"), AECS_TEXT("k"), AECS_TEXT(str_c(big)),
		AECS_TEXT(""),
	};
	ck_assert_int_eq(aecs_db_open(NULL, t_strconcat(tmpdir, "/big.sql",
				      NULL), 0, &db, &error), 0);
	ck_assert_int_eq(aecs_db_write(db, aecs_db_named("insert_body"), v,
				       N_ELEMENTS(v), &error), 1);
	ck_assert_uint_eq(aecs_db_oversize_statements(db), 1);
	ck_assert_int_eq(aecs_db_close(&db, &error), 0);
}
END_TEST

START_TEST(test_no_search)
{
	struct aecs_db *db;
	const char *error;

	ck_assert_int_eq(aecs_db_open(t_strconcat(tmpdir, "/ns.sqlite", NULL),
				      NULL, AECS_DB_FLAG_NO_SEARCH, &db,
				      &error), 0);
	ck_assert(!aecs_db_has_search(db));
	ck_assert_int_eq(aecs_db_close(&db, &error), 0);
	ck_assert_int_eq(aecs_db_open("/nonexistent/dir/x.sqlite", NULL, 0,
				      &db, &error), -1);
	ck_assert(strstr(error, "/nonexistent/dir/x.sqlite") != NULL);
}
END_TEST

/* "Every read uses an index; none scans aecs_messages": a SCAN is only
   allowed over a subquery (co-routine) or the FTS5 table. */
START_TEST(test_query_plans)
{
	const struct aecs_sql_query *q;
	struct aecs_db *db;
	const char *error, *plan, *const *lines;
	unsigned int n = 0;

	ck_assert_int_eq(aecs_db_open(NULL, t_strconcat(tmpdir, "/p.sql",
				      NULL), 0, &db, &error), 0);
	for (q = aecs_sql_queries; q->name != NULL; q++) {
		if (strncmp(q->sql, "SELECT", 6) != 0)
			continue;
		n++;
		plan = aecs_db_query_plan(db, q->sql, &error);
		ck_assert_msg(plan != NULL, "%s: %s", q->name, error);
		ck_assert_msg(strstr(plan, "SEARCH") != NULL, "%s", q->name);
		for (lines = t_strsplit(plan, "\n"); *lines != NULL; lines++) {
			if (strncmp(*lines, "SCAN ", 5) != 0)
				continue;
			ck_assert_msg(strcmp(*lines, "SCAN m") == 0 ||
				      strstr(*lines, "VIRTUAL TABLE") != NULL,
				      "%s: %s", q->name, *lines);
		}
	}
	ck_assert_uint_eq(n, 9);
	ck_assert_int_eq(aecs_db_close(&db, &error), 0);
}
END_TEST

static void setup(void)
{
	ck_assert(mkdtemp(tmpdir) != NULL);
}

static void teardown(void)
{
	const char *const names[] = {
		"out.sql", "loaded.sqlite", "ns.sqlite", "p.sql", "big.sql",
	};
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(names); i++)
		(void)unlink(t_strconcat(tmpdir, "/", names[i], NULL));
	(void)rmdir(tmpdir);
	memcpy(tmpdir + strlen(tmpdir) - 6, "XXXXXX", 6);
}

int main(void)
{
	Suite *s = suite_create("aecs");
	TCase *tc = tcase_create("aecs");
	int failed;

	lib_init();
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_keys);
	tcase_add_test(tc, test_msgids);
	tcase_add_test(tc, test_thread_root);
	tcase_add_test(tc, test_dates);
	tcase_add_test(tc, test_json);
	tcase_add_test(tc, test_sanitize);
	tcase_add_test(tc, test_clean);
	tcase_add_test(tc, test_forai);
	tcase_add_test(tc, test_render);
	tcase_add_test(tc, test_named_queries);
	tcase_add_test(tc, test_db_and_sql_file);
	tcase_add_test(tc, test_oversize_statement);
	tcase_add_test(tc, test_no_search);
	tcase_add_test(tc, test_query_plans);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
