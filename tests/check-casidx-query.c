/* casidx query evaluation: substring semantics, definite vs maybe,
   NOT against a universe that includes token-less messages, AND/OR,
   expunges and BM25 field weighting, over a real index and the real
   tokenizer. */

#include "lib.h"
#include "unlink-directory.h"
#include "casidx-tokenizer.h"
#include "casidx-dtgram.h"
#include "casidx-index.h"
#include "str.h"
#include "casidx-query.h"

#include <check.h>
#include "check-run.h"
#include "check-fixture.h"
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

static char *test_dir;
static struct casidx_index *idx;
static struct casidx_tokenizer *tok;

struct feed_ctx {
	struct casidx_index_writer *w;
	enum casidx_field field;
	struct casidx_doc_state state;
};

static void feed_cb(const struct casidx_token *token, void *context)
{
	struct feed_ctx *ctx = context;

	casidx_query_add_token(ctx->w, ctx->field, token, &ctx->state);
}

static void add_doc(struct feed_ctx *ctx, uint32_t uid)
{
	casidx_index_writer_add_doc(ctx->w, uid);
	i_zero(&ctx->state);
}

static void dtgram_cb(const unsigned char *gram, size_t gram_len,
		      uint32_t pos, void *context)
{
	struct feed_ctx *ctx = context;

	casidx_query_add_dtgram(ctx->w, ctx->field, gram, gram_len, pos,
				&ctx->state);
}

/* the field's words and, as the backend does, its dtgrams (a raw
   address value's go to the header field) */
static void add_field(struct feed_ctx *ctx, enum casidx_field field,
		      const char *text)
{
	struct casidx_dtgram *dt = casidx_dtgram_create();

	ctx->field = field;
	casidx_tokenizer_tokenize(tok, text, strlen(text), feed_cb, ctx);
	if (field == CASIDX_FIELD_BODY)
		casidx_query_dtgram_restart(&ctx->state);
	if (field >= CASIDX_FIELD_COUNT)
		ctx->field = CASIDX_FIELD_HEADER;
	casidx_dtgram_feed(dt, text, strlen(text), dtgram_cb, ctx);
	casidx_dtgram_destroy(&dt);
}

/* uid 1..6; 4 has no text at all; 6 gets expunged */
static void build_index(void)
{
	static const struct casidx_index_settings set = { .no_fsync = TRUE };
	struct feed_ctx ctx;
	const char *error;
	char tmpl[] = "/tmp/check-casidx-query-XXXXXX";

	ck_assert_ptr_ne(mkdtemp(tmpl), NULL);
	test_dir = i_strdup(tmpl);
	tok = casidx_tokenizer_create();
	idx = casidx_index_init(test_dir, &set);
	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 1);
	add_field(&ctx, CASIDX_FIELD_SUBJECT, "Hello there");
	add_field(&ctx, CASIDX_FIELD_BODY, "the world is big");
	add_field(&ctx, CASIDX_FIELD_FROM, "Alice <alice@example.com>");
	add_doc(&ctx, 2);
	add_field(&ctx, CASIDX_FIELD_BODY, "hello world, hello again");
	add_field(&ctx, CASIDX_FIELD_FROM, "Bob <bob@example.org>");
	add_doc(&ctx, 3);
	add_field(&ctx, CASIDX_FIELD_BODY, "un café crème, s'il vous plaît");
	add_doc(&ctx, 4);
	add_doc(&ctx, 5);
	add_field(&ctx, CASIDX_FIELD_BODY, "shellfish and yellow helmets");
	add_doc(&ctx, 6);
	add_field(&ctx, CASIDX_FIELD_BODY, "hello from the expunged one");
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ctx.w = casidx_index_writer_begin(idx);
	casidx_index_writer_expunge(ctx.w, 6);
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);
}

static void teardown(void)
{
	const char *error;

	casidx_index_deinit(&idx);
	casidx_tokenizer_destroy(&tok);
	(void)unlink_directory(test_dir, UNLINK_DIRECTORY_FLAG_RMDIR, &error);
	i_free_and_null(test_dir);
}

/* "1,2" style list of a bitmap */
static const char *bm_str(const roaring_bitmap_t *bm)
{
	string_t *str = t_str_new(32);
	roaring_uint32_iterator_t *it = roaring_create_iterator(bm);

	for (; it->has_value; roaring_advance_uint32_iterator(it)) {
		if (str_len(str) > 0)
			str_append_c(str, ',');
		str_printfa(str, "%u", it->current_value);
	}
	roaring_free_uint32_iterator(it);
	return str_c(str);
}

static void check_query(const struct casidx_query_leaf *leaves,
			unsigned int count, bool and_args,
			const char *definite, const char *maybe)
{
	struct casidx_query_result res;
	const char *error;

	ck_assert_int_eq(casidx_query_eval(idx, tok, leaves, count, and_args,
					   &res, &error), 0);
	ck_assert_msg(strcmp(bm_str(res.definite), definite) == 0 &&
		      strcmp(bm_str(res.maybe), maybe) == 0,
		      "\"%s\": definite %s maybe %s, expected %s / %s",
		      leaves[0].value, bm_str(res.definite),
		      bm_str(res.maybe), definite, maybe);
	casidx_query_result_free(&res);
}

static void check1(unsigned int mask, const char *value, bool not,
		   const char *definite, const char *maybe)
{
	struct casidx_query_leaf leaf = {
		.field_mask = mask, .value = value, .match_not = not,
	};

	check_query(&leaf, 1, TRUE, definite, maybe);
}

#define BODY CASIDX_FIELD_MASK(CASIDX_FIELD_BODY)
#define FROM CASIDX_FIELD_MASK(CASIDX_FIELD_FROM)
#define SUBJECT CASIDX_FIELD_MASK(CASIDX_FIELD_SUBJECT)
#define ALL CASIDX_FIELD_MASK_ALL

START_TEST(test_words_prefixes_substrings)
{
	check1(BODY, "hello", FALSE, "2", "");
	check1(BODY, "HeLLo", FALSE, "2", "");
	check1(ALL, "hello", FALSE, "1,2", "");
	check1(BODY, "hel", FALSE, "2,5", "");	/* prefix */
	check1(BODY, "ell", FALSE, "2,5", "");	/* inside words */
	check1(BODY, "elm", FALSE, "5", "");
	check1(BODY, "nothere", FALSE, "", "");
	/* expunged 6 never shows up */
	check1(BODY, "expunged", FALSE, "", "");
}
END_TEST

START_TEST(test_maybe_cases)
{
	/* two words: proven by positions where adjacent with one space
	   between them ("hello world, hello again"); where both words
	   occur, each only in words with positions, but never so, the
	   message is out */
	check1(BODY, "hello world", FALSE, "2", "");
	check1(BODY, "HELLO again", FALSE, "2", "");
	check1(BODY, "ello wor", FALSE, "2", "");
	check1(BODY, "world hello", FALSE, "", "");
	check1(BODY, "world hello again", FALSE, "", "");
	/* not a phrase of single spaces: maybe */
	check1(BODY, "hello  world", FALSE, "", "2");
	/* a middle word must be a whole word of the text; a piece of a
	   word is not excluded by it */
	check1(BODY, "hello wor again", FALSE, "", "");
	check1(BODY, "hello orl again", FALSE, "", "");
	/* "plaît" went through ICU (no positions): maybe */
	check1(BODY, "plait vous", FALSE, "", "3");
	check1(BODY, "vous plait", FALSE, "", "3");
	check1(BODY, "the world is", FALSE, "1", "");
	check1(BODY, "the worl is", FALSE, "", "");
	/* not across fields */
	check1(ALL, "there the", FALSE, "", "1");
	/* punctuation: proven only inside one term */
	check1(BODY, "world,", FALSE, "", "1,2");
	/* non-ASCII: folding may over-match */
	check1(BODY, "café", FALSE, "", "3");
	/* "café" was folded to "cafe": an ASCII match in it is not proven
	   (Dovecot's own search would not find "cafe" in "café") */
	check1(BODY, "cafe", FALSE, "", "3");
	/* inside an address compound term */
	check1(FROM, "alice@example.com", FALSE, "1", "");
	check1(FROM, "e@example.c", FALSE, "1", "");
	check1(FROM, "<alice@example.com>", FALSE, "", "1");
	check1(FROM, "example", FALSE, "1,2", "");
}
END_TEST

/* A value of many tokens: only the first CASIDX_QUERY_MAX_TOKENS
   narrow the candidates (Dovecot checks them against the mail), and
   none after the candidates ran out. Both keep the answer a superset:
   never a message lost. */
START_TEST(test_many_tokens)
{
	string_t *value = t_str_new(1024);
	unsigned int i;

	/* doc 2's words and distinct pieces of them first, then words no
	   message has: past the bound those are not looked at, so 2 stays
	   a candidate */
	static const char *const words[] = { "hello", "world", "again" };
	unsigned int w, len, start, n = 3;
	const char *piece;

	str_append(value, "hello world again");
	for (w = 0; w < N_ELEMENTS(words); w++) {
		for (len = 1; len < 5; len++) {
			for (start = 0; start + len <= 5; start++) {
				piece = t_strndup(words[w] + start, len);
				if (n >= CASIDX_QUERY_MAX_TOKENS ||
				    strstr(str_c(value), t_strconcat(
					" ", piece, " ", NULL)) != NULL)
					continue;
				str_printfa(value, " %s ", piece);
				n++;
			}
		}
	}
	ck_assert_uint_eq(n, CASIDX_QUERY_MAX_TOKENS);
	str_append(value, " zzznothere qqqmissing");
	check1(BODY, str_c(value), FALSE, "", "2");
	/* NOT of it: 2 is not certainly excluded */
	check1(BODY, str_c(value), TRUE, "1,3,4,5", "2");
	/* within the bound a missing word still excludes */
	str_truncate(value, 0);
	str_append(value, "hello world zzznothere");
	check1(BODY, str_c(value), FALSE, "", "");
	/* thousands of words that match nothing: nothing */
	str_truncate(value, 0);
	for (i = 0; i < 5000; i++)
		str_printfa(value, "w%u ", i);
	check1(BODY, str_c(value), FALSE, "", "");
	check1(BODY, str_c(value), TRUE, "1,2,3,4,5", "");
}
END_TEST

START_TEST(test_not_and_or)
{
	struct casidx_query_leaf leaves[2];

	/* NOT includes the token-less message 4, excludes expunged 6 */
	check1(BODY, "hello", TRUE, "1,3,4,5", "");
	/* NOT of a maybe stays maybe, of an excluded one is definite */
	check1(BODY, "plait vous", TRUE, "1,2,4,5", "3");
	check1(BODY, "world hello", TRUE, "1,2,3,4,5", "");
	/* NOT of a proven phrase */
	check1(BODY, "hello world", TRUE, "1,3,4,5", "");

	i_zero(&leaves);
	leaves[0].field_mask = BODY;
	leaves[0].value = "world";
	leaves[1].field_mask = BODY;
	leaves[1].value = "again";
	check_query(leaves, 2, TRUE, "2", "");
	check_query(leaves, 2, FALSE, "1,2", "");
	leaves[1].match_not = TRUE;
	check_query(leaves, 2, TRUE, "1", "");
	/* AND of definite and maybe */
	leaves[0].value = "vous";
	leaves[1].value = "plait vous";
	leaves[1].match_not = FALSE;
	check_query(leaves, 2, TRUE, "", "3");
	check_query(leaves, 2, FALSE, "3", "");
}
END_TEST

START_TEST(test_answerable)
{
	ck_assert(casidx_query_value_is_answerable(tok, "hello", BODY));
	ck_assert(!casidx_query_value_is_answerable(tok, "", BODY));
	ck_assert(!casidx_query_value_is_answerable(tok, " -- , ", ALL));
	/* no word, but dtgrams: where the fields have them */
	ck_assert(casidx_query_value_is_answerable(tok, "\xC2\xA1\xC2\xB0",
						   BODY));
	ck_assert(casidx_query_value_is_answerable(tok, "\xC2\xA1\xC2\xB0",
						   ALL));
	ck_assert(!casidx_query_value_is_answerable(tok, "\xC2\xA1\xC2\xB0",
		CASIDX_FIELD_MASK(CASIDX_FIELD_FROM)));
	/* one code point: no pair */
	ck_assert(!casidx_query_value_is_answerable(tok, "\xC2\xB0", BODY));
}
END_TEST

START_TEST(test_scores)
{
	struct casidx_query_leaf leaf = {
		.field_mask = ALL, .value = "hello",
	};
	struct casidx_query_result res;
	const char *error;

	ck_assert_int_eq(casidx_query_eval(idx, tok, &leaf, 1, TRUE, &res,
					   &error), 0);
	ck_assert(casidx_query_result_score(&res, 1) > 0);
	ck_assert(casidx_query_result_score(&res, 2) > 0);
	/* a subject hit outweighs two body hits */
	ck_assert(casidx_query_result_score(&res, 1) >
		  casidx_query_result_score(&res, 2));
	ck_assert(casidx_query_result_score(&res, 3) == 0);
	casidx_query_result_free(&res);

	/* whole word ranks above a substring hit */
	leaf.field_mask = BODY;
	leaf.value = "hel";
	ck_assert_int_eq(casidx_query_eval(idx, tok, &leaf, 1, TRUE, &res,
					   &error), 0);
	ck_assert(casidx_query_result_score(&res, 2) > 0);
	ck_assert(casidx_query_result_score(&res, 5) > 0);
	casidx_query_result_free(&res);
}
END_TEST

/* A damaged dictionary block is only read (and its CRC checked) by a
   query: the query fails and flags the index corrupted for a rebuild. */
START_TEST(test_lazy_corruption_detected)
{
	struct casidx_query_leaf leaf = {
		.field_mask = BODY, .value = "hello",
	};
	struct casidx_query_result res;
	const char *path = t_strdup_printf("%s/seg-00000001.cxs", test_dir);
	unsigned char b[8];
	uint64_t dict_off = 0;
	const char *error;
	struct stat st;
	int fd, i;

	fd = open(path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	/* footer: u64 table at size - 200, DICT offset is entry 9 */
	ck_assert_int_eq(pread(fd, b, 8, st.st_size - 200 + 9 * 8), 8);
	for (i = 7; i >= 0; i--)
		dict_off = (dict_off << 8) | b[i];
	ck_assert_int_eq(pread(fd, b, 1, dict_off + 12), 1);
	b[0] ^= 0x01;
	ck_assert_int_eq(pwrite(fd, b, 1, dict_off + 12), 1);
	i_close_fd(&fd);

	/* the open snapshot mmaps the file: the damage is visible */
	ck_assert_int_eq(casidx_query_eval(idx, tok, &leaf, 1, TRUE, &res,
					   &error), -1);
	ck_assert_ptr_ne(strstr(error, "checksum"), NULL);
	ck_assert(casidx_index_is_corrupted(idx));
}
END_TEST

/* Issue 17: nothing the text holds is lost. Encoded-looking runs mark
   the field UNINDEXED (any ASCII search may be inside: maybe), long
   words are windows (pieces found anywhere in them), folded words make
   ASCII matches maybe, a long path is words. */
START_TEST(test_exactness_markers)
{
	struct feed_ctx ctx;
	const char *error;

	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 7);
	add_field(&ctx, CASIDX_FIELD_BODY, "sig: aGVsbG8gd29ybGQgdGhpcyBpcy"
		  "BhIGxvbmcgYmFzZTY0IHJ1bg== done");
	add_doc(&ctx, 8);
	add_field(&ctx, CASIDX_FIELD_BODY, "at /llvm/lib/Transforms/"
		  "Instrumentation/MemorySanitizer.cpp:3236: oops "
		  "0005-Initialize-the-mapping-of-KASan-shadow-memory.patch");
	add_doc(&ctx, 9);
	add_field(&ctx, CASIDX_FIELD_BODY, "Sr. Muñoz and Mr. Munoz");
	add_doc(&ctx, 10);
	add_field(&ctx, CASIDX_FIELD_BODY, "Señor Muñoz");
	add_doc(&ctx, 11);
	add_field(&ctx, CASIDX_FIELD_SUBJECT, "aaaaaaaaaabbbbbbbbbbccccccccccdd"
		  "ddddddddeeeeeeeeeeffffffffffgggggggggghhhhhhhhhhiiiiiiiiii");
	/* more encoded text than a document keeps: marked */
	add_doc(&ctx, 12);
	T_BEGIN {
		string_t *big = t_str_new(CASIDX_ENCODED_BODY_BUDGET * 2);
		unsigned int i;

		for (i = 0; str_len(big) < CASIDX_ENCODED_BODY_BUDGET * 2; i++)
			str_printfa(big, "Zq%xWv9%uKp", i * 7919, i);
		add_field(&ctx, CASIDX_FIELD_BODY, str_c(big));
	} T_END;
	/* a DKIM-sized encoded run in a header is kept, more is not */
	add_field(&ctx, CASIDX_FIELD_HEADER, "b=aGVsbG8gd29ybGQgdGhpcyBpcyBhIGx"
		  "vbmcgYmFzZTY0IHJ1bg==");
	T_BEGIN {
		string_t *big = t_str_new(CASIDX_ENCODED_HEADER_BUDGET * 2);
		unsigned int i;

		str_append(big, "b=");
		for (i = 0; str_len(big) < CASIDX_ENCODED_HEADER_BUDGET * 2; i++)
			str_printfa(big, "Yq%xWv9%uKp", i * 7919, i);
		add_field(&ctx, CASIDX_FIELD_HEADER, str_c(big));
	} T_END;
	add_doc(&ctx, 13);
	add_field(&ctx, CASIDX_FIELD_BODY, "I don\xE2\x80\x99t know");
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);

	/* a kept encoded run is searchable like a word */
	check1(BODY, "d29ybGQ", FALSE, "7", "12");
	check1(BODY, "zzzz", FALSE, "", "12");
	check1(SUBJECT, "zzzz", FALSE, "", "");
	check1(BODY, "done", FALSE, "7", "12");
	/* the whole run is one term: proven there */
	check1(BODY, "aGVsbG8gd29ybGQgdGhpcyBpcyBhIGxvbmcgYmFzZTY0IHJ1bg==",
	       FALSE, "7", "12");
	/* within the header budget: found; past it: maybe, in that field
	   only */
	check1(ALL, "d29ybGQ", FALSE, "7,12", "");
	check1(CASIDX_FIELD_MASK(CASIDX_FIELD_HEADER), "d29ybGQ", FALSE, "12",
	       "");
	check1(CASIDX_FIELD_MASK(CASIDX_FIELD_HEADER), "x", FALSE, "12", "");
	check1(CASIDX_FIELD_MASK(CASIDX_FIELD_HEADER), "zzzz", FALSE, "",
	       "12");
	check1(CASIDX_FIELD_MASK(CASIDX_FIELD_SUBJECT), "zzzz", FALSE, "", "");
	/* words of a long path and a long file name */
	check1(BODY, "instrumentation", FALSE, "8", "12");
	check1(BODY, "memorysanitizer", FALSE, "8", "12");
	/* doc 12's encoded text holds "3236" within the kept part */
	check1(BODY, "3236", FALSE, "8,12", "");
	check1(BODY, "shadow", FALSE, "8", "12");
	check1(BODY, "memory", FALSE, "8", "12");
	check1(BODY, "KASan-shadow-memory.patch", FALSE, "", "8,12");
	/* folded: "munoz" is literally in 9 (proven there, beside its
	   folded "Muñoz") but only folded in 10 (and could be inside 12's
	   encoded text) */
	check1(BODY, "munoz", FALSE, "9", "10,12");
	check1(BODY, "uno", FALSE, "9", "10,12");
	check1(BODY, "senor", FALSE, "", "10,12");
	check1(BODY, "muñoz", FALSE, "", "9,10");
	/* a word whose non-ASCII character left its ASCII letters as they
	   were stays definite */
	check1(BODY, "know", FALSE, "13", "12");
	check1(BODY, "don", FALSE, "7,13", "12");
	/* a 90-byte word: any piece of it, also across windows */
	check1(SUBJECT, "hhhhhhiiii", FALSE, "11", "");
	check1(SUBJECT, "ccccccccccddddddddddeeeeeeeeeeffff", FALSE, "", "11");
	check1(SUBJECT, "cccccccccceeeeeeeeee", FALSE, "", "");
}
END_TEST

/* A CJK run is indexed as bigrams plus its trailing unigram; a
   one-character query is answered by the substring scan over the
   dictionary, so it finds the character at any place of the run. */
START_TEST(test_cjk_single_char)
{
	struct feed_ctx ctx;
	const char *error;

	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 7);
	add_field(&ctx, CASIDX_FIELD_BODY, "東京都に住んでいます。");
	add_doc(&ctx, 8);
	add_field(&ctx, CASIDX_FIELD_BODY, "京");
	add_doc(&ctx, 9);
	add_field(&ctx, CASIDX_FIELD_SUBJECT, "北京大学");
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);

	/* first, inner and last character of the run, and a lone one */
	check1(BODY, "東", FALSE, "", "7");
	check1(BODY, "京", FALSE, "", "7,8");
	check1(BODY, "住", FALSE, "", "7");
	check1(BODY, "す", FALSE, "", "7");
	check1(ALL, "京", FALSE, "", "7,8,9");
	check1(ALL, "北", FALSE, "", "9");
	check1(ALL, "学", FALSE, "", "9");
	check1(BODY, "北", FALSE, "", "");
	check1(ALL, "東京", FALSE, "", "7");
	check1(ALL, "京大", FALSE, "", "9");
	check1(ALL, "西", FALSE, "", "");
	/* NOT of a one-character query: certain only where absent */
	check1(BODY, "京", TRUE, "1,2,3,4,5,9", "7,8");
}
END_TEST

/* The dtgrams of values: the code point pairs of Dovecot's decomposed
   titlecase image that qualify (casidx-dtgram.h). */
START_TEST(test_dtgram_value)
{
	static const struct {
		const char *value;
		unsigned int image_len, grams;
	} cases[] = {
		/* A U+0301 N U+0303 */
		{ "\xC3\xA1\xC3\xB1", 4, 3 },
		{ "\xC2\xA1\xC2\xB0", 2, 1 },
		/* CJK pairs have bigram terms of their own */
		{ "\xE6\x9D\xB1\xE4\xBA\xAC", 2, 0 },
		{ "\xE6\x9D\xB1\xC2\xBB", 2, 1 },
		/* pairs with whitespace or of ASCII only never count */
		{ "a \xC3\xA9", 4, 1 },
		{ "hello", 5, 0 },
		{ "\xC2\xB0", 1, 0 },
	};
	struct casidx_dtgram_value dtv;
	unsigned int i;
	pool_t pool = pool_alloconly_create("dtgram test", 256);

	for (i = 0; i < N_ELEMENTS(cases); i++) {
		casidx_dtgram_value(cases[i].value, pool, &dtv);
		ck_assert(dtv.valid);
		ck_assert_msg(dtv.image_len == cases[i].image_len &&
			      array_count(&dtv.grams) == cases[i].grams,
			      "%s: image %u grams %u", cases[i].value,
			      dtv.image_len, array_count(&dtv.grams));
	}
	casidx_dtgram_value("\xFF\xC3", pool, &dtv);
	ck_assert(!dtv.valid);
	ck_assert_uint_eq(array_count(&dtv.grams), 0);
	pool_unref(&pool);
}
END_TEST

static void collect_cb(const unsigned char *gram, size_t gram_len,
		       uint32_t pos, void *context)
{
	string_t *out = context;

	str_append_data(out, gram, gram_len);
	str_printfa(out, "@%u|", pos);
}

/* Any split of the text into chunks gives the same dtgrams, also with
   characters and invalid bytes cut by a chunk's end. */
START_TEST(test_dtgram_chunks)
{
	static const char text[] = "S\xC3\xA9nor \xC2\xBB\xC3\xB9 \xD0\x9C"
		"\xD0\xBE\xD1\x81\xD0\xBA\xD0\xB2\xD0\xB0 \xE6\x9D\xB1\xE4"
		"\xBA\xAC\xE3\x80\x82\xF0\x9F\x98\x80x\xFF\xC3\xB1\xE2\x82"
		"y\xE2\x82\xAC\xCC\x81";
	struct casidx_dtgram *dt = casidx_dtgram_create();
	string_t *whole = t_str_new(256), *parts = t_str_new(256);
	size_t len = strlen(text), i, a, b;

	casidx_dtgram_feed(dt, text, len, collect_cb, whole);
	ck_assert(str_len(whole) > 0);
	for (a = 0; a <= len; a++) {
		for (b = a; b <= len; b++) {
			casidx_dtgram_reset(dt);
			str_truncate(parts, 0);
			casidx_dtgram_feed(dt, text, a, collect_cb, parts);
			casidx_dtgram_feed(dt, text + a, b - a, collect_cb,
					   parts);
			casidx_dtgram_feed(dt, text + b, len - b, collect_cb,
					   parts);
			ck_assert_msg(strcmp(str_c(parts), str_c(whole)) == 0,
				      "split %zu,%zu", a, b);
		}
	}
	casidx_dtgram_reset(dt);
	str_truncate(parts, 0);
	for (i = 0; i < len; i++)
		casidx_dtgram_feed(dt, text + i, 1, collect_cb, parts);
	ck_assert_str_eq(str_c(parts), str_c(whole));
	casidx_dtgram_destroy(&dt);
}
END_TEST

/* Non-ASCII values: candidates only where every dtgram is, definite
   where the image is one dtgram of the body, maybe where the index
   can't tell (DTPARTIAL). */
START_TEST(test_dtgrams)
{
	struct feed_ctx ctx;
	const char *error;

	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 7);
	add_field(&ctx, CASIDX_FIELD_BODY, "x \xC2\xBB\xC3\xB9 y");
	add_doc(&ctx, 8);
	add_field(&ctx, CASIDX_FIELD_BODY, "\xC2\xBB \xC3\xB9");
	add_doc(&ctx, 9);
	add_field(&ctx, CASIDX_FIELD_BODY, "\xC2\xA1\xC2\xB0hello\xC2\xA1"
		  "\xC2\xB1");
	add_doc(&ctx, 10);
	add_field(&ctx, CASIDX_FIELD_SUBJECT, "Se\xC3\xB1or \xC2\xA1\xC2\xB0");
	add_doc(&ctx, 12);
	add_field(&ctx, CASIDX_FIELD_BODY, "\xC2\xBBU \xC3\xB9 "
		  "\xC3\xA1\xC3\xB1");
	add_doc(&ctx, 11);
	add_field(&ctx, CASIDX_FIELD_BODY, "nothing here");
	casidx_query_add_marker(ctx.w, CASIDX_FIELD_BODY,
				CASIDX_TERM_DTPARTIAL, &ctx.state);
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);

	/* three code points (U+00BB U U+0300): both pairs, one after the
	   other, in 7; in 8 the space parts them; 12 has both pairs but
	   apart; 11 (DTPARTIAL) may hold it anywhere */
	check1(BODY, "\xC2\xBB\xC3\xB9", FALSE, "7", "11,12");
	check1(ALL, "\xC2\xBB\xC3\xB9", FALSE, "7", "11,12");
	/* A U+0301 N U+0303: a chain of three */
	check1(BODY, "\xC3\xA1\xC3\xB1", FALSE, "12", "11");
	check1(BODY, "\xC3\xB1\xC3\xA1", FALSE, "", "11");
	/* an ASCII pair inside ("cafe" + U+0301): never a whole chain */
	check1(BODY, "caf\xC3\xA9", FALSE, "", "3,11");
	/* two code points, in a body: proven; in a subject: maybe */
	check1(BODY, "\xC2\xA1\xC2\xB0", FALSE, "9", "11");
	check1(ALL, "\xC2\xA1\xC2\xB0", FALSE, "9", "10,11");
	check1(CASIDX_FIELD_MASK(CASIDX_FIELD_SUBJECT), "\xC2\xA1\xC2\xB0",
	       FALSE, "", "10");
	/* titlecase: "°h" is "°H" on both sides */
	check1(BODY, "\xC2\xB0h", FALSE, "9", "11");
	check1(BODY, "\xC2\xB0H", FALSE, "9", "11");
	check1(BODY, "\xC2\xB1\xC2\xB0", FALSE, "", "11");
	/* a folded word's candidates are cut down by its dtgrams: doc 3's
	   "café" stays, nothing else but DTPARTIAL 11 has the pair */
	check1(ALL, "caf\xC3\xA9", FALSE, "", "3,11");
	check1(ALL, "se\xC3\xB1or", FALSE, "", "10,11");
	/* "n²" is "N2" to Dovecot: the joined term has it, folded */
	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 13);
	add_field(&ctx, CASIDX_FIELD_BODY, "more than n\xC2\xB2 space");
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);
	check1(BODY, "n2", FALSE, "", "13");
	check1(BODY, "than n\xC2\xB2 ", FALSE, "", "13");
	/* dotless i is Dovecot's "I": where "is" is (folded "ıs" is
	   "is"), never proven */
	check1(BODY, "\xC4\xB1s", FALSE, "", "1,5");
	/* NOT: certain where the pair certainly isn't */
	check1(BODY, "\xC2\xA1\xC2\xB0", TRUE, "1,2,3,4,5,7,8,10,12,13",
	       "11");
}
END_TEST

#define TO CASIDX_FIELD_MASK(CASIDX_FIELD_TO)
#define CC CASIDX_FIELD_MASK(CASIDX_FIELD_CC)

/* Segment version 4: the raw values of From/To/Cc/Bcc have namespaces of
   their own. A FROM search takes what matches in the raw From values as
   maybe (comments, group names), never what only another header holds
   (issue 17: FROM gmail had 2,774 candidates from Received, Message-ID
   and DKIM headers); TEXT reads them all. */
START_TEST(test_raw_address_namespaces)
{
	struct feed_ctx ctx;
	const char *error;

	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 7);
	add_field(&ctx, CASIDX_FIELD_FROM, "one@example.com");
	add_field(&ctx, CASIDX_FIELD_RAW_FROM,
		  "Some One <one@example.com> (the first)");
	add_field(&ctx, CASIDX_FIELD_HEADER,
		  "from smtp.gmail.com by mx.example.org");
	add_field(&ctx, CASIDX_FIELD_HEADER, "<xyz@gmail.com>");
	add_doc(&ctx, 8);
	add_field(&ctx, CASIDX_FIELD_FROM, "Gmail Fan <fan@gmail.com>");
	add_field(&ctx, CASIDX_FIELD_RAW_FROM, "Gmail Fan <fan@gmail.com>");
	add_field(&ctx, CASIDX_FIELD_RAW_TO,
		  "unlisted-recipients:; (no To-header on input)");
	add_doc(&ctx, 9);
	add_field(&ctx, CASIDX_FIELD_FROM, "juergen@example.de");
	add_field(&ctx, CASIDX_FIELD_RAW_FROM,
		  "juergen@example.de (J\xC3\xBCrgen M\xC3\xBCller)");
	add_doc(&ctx, 10);
	add_field(&ctx, CASIDX_FIELD_FROM, "x@example.org");
	add_field(&ctx, CASIDX_FIELD_RAW_FROM, "x@example.org");
	add_field(&ctx, CASIDX_FIELD_HEADER, "M\xC3\xBCller AG, the first");
	add_field(&ctx, CASIDX_FIELD_RAW_CC, "y@example.org");
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);

	/* a value in the normalised From: definite; in Received or
	   Message-ID only (7): no candidate */
	check1(FROM, "gmail", FALSE, "8", "");
	/* in a raw From comment only: maybe; in another header: no */
	check1(FROM, "first", FALSE, "", "7");
	check1(FROM, "m\xC3\xBCller", FALSE, "", "9");
	check1(FROM, "j\xC3\xBCrgen", FALSE, "", "9");
	/* each header its own namespace */
	check1(TO, "unlisted", FALSE, "", "8");
	check1(FROM, "unlisted", FALSE, "", "");
	check1(CC, "first", FALSE, "", "");
	check1(CC, "example", FALSE, "", "10");
	/* TEXT reads raw values and other headers: proven in raw terms */
	check1(ALL, "first", FALSE, "7,10", "");
	check1(ALL, "unlisted", FALSE, "8", "");
	check1(ALL, "gmail", FALSE, "7,8", "");
	check1(ALL, "m\xC3\xBCller", FALSE, "", "9,10");
	/* NOT: the raw candidates stay maybe */
	check1(FROM, "first", TRUE, "1,2,3,4,5,8,9,10", "7");
}
END_TEST

/* An index written before segment version 4 (tests/fixtures/casidx-seg3:
   the raw address values in the header field) is answered the old way,
   the header field standing in for the raw namespaces, for its
   documents only; also once a merge took them into a version-4
   segment (CASIDX_TERM_RAWHDR). */
/* Open a copy of tests/fixtures/<fixture> (manifest and segment 1). */
static void open_fixture(const char *fixture)
{
	static const struct casidx_index_settings set = { .no_fsync = TRUE };
	const char *error;
	char tmpl[] = "/tmp/check-casidx-query-XXXXXX";

	ck_assert_ptr_ne(mkdtemp(tmpl), NULL);
	test_dir = i_strdup(tmpl);
	tok = casidx_tokenizer_create();
	check_fixture_copy(fixture, "manifest", test_dir);
	check_fixture_copy(fixture, "seg-00000001.cxs", test_dir);
	idx = casidx_index_init(test_dir, &set);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);
}

static void open_seg3_fixture(void)
{
	open_fixture("casidx-seg3");
}

/* the fixture's docs 1-3 (README.md there) and 4-5 of version 4 */
static void check_seg3_answers(void)
{
	/* raw From comment of 1, only in the header field */
	check1(FROM, "first", FALSE, "", "1");
	/* 2's From; 3 has it in Received and Message-ID, which the old
	   segment cannot tell from a raw From: maybe, as before; 4 in its
	   raw From comment; 5 only in another header */
	check1(FROM, "gmail", FALSE, "2", "3,4");
	/* To comment of 1, group name of 2 */
	check1(TO, "input", FALSE, "", "1");
	check1(TO, "alpha", FALSE, "2", "");
	/* a comment without a display name becomes the name: the
	   normalised Cc of 3 has it */
	check1(CC, "comment", FALSE, "3", "");
	check1(ALL, "comment", FALSE, "3", "");
	check1(ALL, "club", FALSE, "4", "");
}

START_TEST(test_seg3_raw_addresses)
{
	struct casidx_segment **segs;
	struct feed_ctx ctx;
	roaring_bitmap_t *docs;
	const char *error;

	ck_assert_uint_eq(casidx_index_get_open_segments(idx, &segs), 1);
	ck_assert(casidx_segment_has_dtgrams(segs[0]));
	ck_assert(!casidx_segment_has_raw_addresses(segs[0]));
	check1(FROM, "first", FALSE, "", "1");
	check1(FROM, "gmail", FALSE, "2", "3");
	check1(TO, "input", FALSE, "", "1");

	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 4);
	add_field(&ctx, CASIDX_FIELD_FROM, "x@example.com");
	add_field(&ctx, CASIDX_FIELD_RAW_FROM, "x@example.com (gmail club)");
	add_field(&ctx, CASIDX_FIELD_HEADER, "from smtp.gmail.com");
	add_doc(&ctx, 5);
	add_field(&ctx, CASIDX_FIELD_FROM, "y@example.com");
	add_field(&ctx, CASIDX_FIELD_RAW_FROM, "y@example.com");
	add_field(&ctx, CASIDX_FIELD_HEADER, "<abc@gmail.com> the first");
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);
	ck_assert_uint_eq(casidx_index_get_open_segments(idx, &segs), 2);
	ck_assert(casidx_segment_has_raw_addresses(segs[1]));
	check_seg3_answers();

	/* merged: one version-4 segment, the old docs marked */
	ck_assert_int_eq(casidx_index_optimize(idx, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);
	ck_assert_uint_eq(casidx_index_get_open_segments(idx, &segs), 1);
	ck_assert(casidx_segment_has_raw_addresses(segs[0]));
	docs = roaring_bitmap_create();
	casidx_index_add_docs_without_raw_addresses(idx, docs);
	ck_assert(roaring_bitmap_is_empty(docs));
	roaring_bitmap_free(docs);
	check_seg3_answers();
}
END_TEST

/* An index written before segment version 5 (tests/fixtures/casidx-seg4:
   parts without codes) is answered as it was: a phrase whose words
   occur there only as parts stays maybe, for its documents only; also
   once a merge took them into a version-5 segment (their parts'
   occurrences keep no code there). */
static void open_seg4_fixture(void)
{
	open_fixture("casidx-seg4");
}

/* the fixture's docs 1-3 (README.md there) and 4-5 of version 5 */
static void check_seg4_answers(void)
{
	/* 2 holds it; 1's "list" is only in parts, without codes; 4 has
	   1's body (parts with codes): out; 5 holds it */
	check1(BODY, "this list", FALSE, "2,5", "1");
	check1(ALL, "this list", FALSE, "2,5", "1");
	/* as before: inside a URL term of 1 (definite), outside one in 2 */
	check1(BODY, "com/blog", FALSE, "1,4", "2");
	check1(BODY, "checklist", FALSE, "3", "");
}

START_TEST(test_seg4_part_codes)
{
	struct casidx_segment **segs;
	struct feed_ctx ctx;
	const char *error;

	ck_assert_uint_eq(casidx_index_get_open_segments(idx, &segs), 1);
	ck_assert(casidx_segment_has_raw_addresses(segs[0]));
	ck_assert(!casidx_segment_has_part_codes(segs[0]));
	/* version 4's answers (test_seg4_fixture in e2e compares the same
	   with Dovecot) */
	check1(BODY, "this list", FALSE, "2", "1");
	check1(BODY, "com/blog", FALSE, "1", "2");

	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 4);
	add_field(&ctx, CASIDX_FIELD_BODY, "Please read this\n"
		  "http://lists.example.org/mailman/listinfo/dev before "
		  "posting.\nMail ann.list@example.org or see "
		  "www.example.com/blog for more.\n");
	add_doc(&ctx, 5);
	add_field(&ctx, CASIDX_FIELD_BODY, "read this list.");
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);
	ck_assert_uint_eq(casidx_index_get_open_segments(idx, &segs), 2);
	ck_assert(casidx_segment_has_part_codes(segs[1]));
	check_seg4_answers();

	/* merged: one version-5 segment holding both */
	ck_assert_int_eq(casidx_index_optimize(idx, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);
	ck_assert_uint_eq(casidx_index_get_open_segments(idx, &segs), 1);
	ck_assert(casidx_segment_has_part_codes(segs[0]));
	check_seg4_answers();
}
END_TEST

/* The phrase exclusion looks only at the terms a piece holding the
   value can have: the one ending the piece before the space ends with
   word 1, the one starting the next piece starts with the last word
   (or either is folded). A word without a code elsewhere ("checklist"
   in a piece ICU read) no longer keeps the message; one that could be
   the piece's does. */
START_TEST(test_phrase_exclusion_terms)
{
	struct feed_ctx ctx;
	const char *error;

	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 20);
	add_field(&ctx, CASIDX_FIELD_BODY, "this checklist\xE2\x82\xAC ok");
	add_doc(&ctx, 21);
	add_field(&ctx, CASIDX_FIELD_BODY, "this list\xE2\x82\xAC ok");
	add_doc(&ctx, 22);
	add_field(&ctx, CASIDX_FIELD_BODY, "this list\xC3\xA9 ok");
	add_doc(&ctx, 23);
	add_field(&ctx, CASIDX_FIELD_BODY, "\xE2\x82\xACthis list");
	add_doc(&ctx, 24);
	add_field(&ctx, CASIDX_FIELD_BODY, "this is a list\xE2\x82\xAC");
	add_doc(&ctx, 25);
	add_field(&ctx, CASIDX_FIELD_BODY, "athis\xE2\x82\xAC list");
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);

	/* 21-23 hold it (ICU words, a folded one: no codes); 24's "list"
	   and 25's "athis" could be the pieces' words (no proof they are
	   not); 20's "checklist" could not: out */
	check1(BODY, "this list", FALSE, "", "21,22,23,24,25");
	check1(BODY, "this list ok", FALSE, "", "21,22");
	check1(BODY, "is a list", FALSE, "", "24,25");
}
END_TEST

/* Segment version 5: the parts of compounds and words have codes of
   kind PART, so a phrase whose words occur only as such parts ("list"
   of "listinfo" in a URL, of "ann.list@" in an address) is excluded;
   where a whole token ends (starts) with the word it is still proven.
   Folded parts (joined words) keep no code: still maybe. */
START_TEST(test_phrase_exclusion_parts)
{
	struct feed_ctx ctx;
	const char *error;

	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 40);
	add_field(&ctx, CASIDX_FIELD_BODY, "read this\n"
		  "http://lists.example.org/mailman/listinfo/dev now");
	add_doc(&ctx, 41);
	add_field(&ctx, CASIDX_FIELD_BODY,
		  "mail ann.list@example.org about this");
	add_doc(&ctx, 42);
	add_field(&ctx, CASIDX_FIELD_BODY, "see this list.info page");
	add_doc(&ctx, 43);
	add_field(&ctx, CASIDX_FIELD_BODY, "this http://list.org/list/list");
	add_doc(&ctx, 44);
	add_field(&ctx, CASIDX_FIELD_BODY, "see http://x.org/this list");
	add_doc(&ctx, 45);
	add_field(&ctx, CASIDX_FIELD_BODY, "x.this listen");
	add_doc(&ctx, 46);
	add_field(&ctx, CASIDX_FIELD_BODY, "this ann.list@example.org");
	add_doc(&ctx, 47);
	add_field(&ctx, CASIDX_FIELD_BODY, "x\xC2\xB2 this");
	add_doc(&ctx, 48);
	add_field(&ctx, CASIDX_FIELD_BODY, "is it this\xE2\x82\xAC list");
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);

	/* 40, 41, 43, 46: "list" only in parts (46: the address starts
	   with "ann"); 42, 44, 45 hold it; 48's "this" is an ICU word */
	check1(BODY, "this list", FALSE, "42,44,45", "48");
	/* "x2" ends 47's piece only as a joined (folded) part */
	check1(BODY, "x2 this", FALSE, "", "47");
	/* 41's "about" is no part: excluded as before */
	check1(BODY, "list about", FALSE, "", "");
	/* TEXT: no other field holds the words */
	check1(ALL, "this list", FALSE, "42,44,45", "48");
}
END_TEST

/* A value of words joined by '_' lies inside one term wherever the
   text has it ('_' joins words, encoded runs, URLs, local parts), or
   where an address's domain ends or a URL's scheme begins at one of
   its '_': other candidates are out. Definite only in a plain body
   term. */
START_TEST(test_underscore_exclusion)
{
	struct feed_ctx ctx;
	const char *error;

	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 30);
	add_field(&ctx, CASIDX_FIELD_BODY, "use GNU_Radio here");
	add_doc(&ctx, 31);
	add_field(&ctx, CASIDX_FIELD_BODY, "gnu and radio, gnu-radio, gnu_ radio");
	add_doc(&ctx, 32);
	add_field(&ctx, CASIDX_FIELD_BODY, "mail x@gnu_radio.org");
	add_doc(&ctx, 33);
	add_field(&ctx, CASIDX_FIELD_BODY, "see gnu_radio://host/");
	add_doc(&ctx, 34);
	add_field(&ctx, CASIDX_FIELD_BODY, "GNU_Radio\xC3\xA9");
	add_doc(&ctx, 35);
	add_field(&ctx, CASIDX_FIELD_SUBJECT, "gnu_radio rocks");
	add_field(&ctx, CASIDX_FIELD_BODY, "gnu radio");
	add_doc(&ctx, 36);
	add_field(&ctx, CASIDX_FIELD_BODY, "a_1 a 1 b_2x");
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);

	check1(BODY, "GNU_Radio", FALSE, "30", "32,33,34");
	check1(BODY, "gnu_radio", TRUE, "1,2,3,4,5,31,35,36", "32,33,34");
	/* TEXT: definite in the body only; the subject's is maybe */
	check1(ALL, "gnu_radio", FALSE, "30", "32,33,34,35");
	/* the address and the URL could cut it: maybe; 34's folded
	   word has the folded part "gnu", which could be a character
	   ICU split off before the '_' */
	check1(BODY, "gnu__radio", FALSE, "", "32,33,34");
	/* a digit next to '_' may be a superscript Dovecot reads as one:
	   not excluded */
	check1(BODY, "a_1", FALSE, "36", "");
	check1(BODY, "b_2", FALSE, "36", "");
	check1(BODY, "x_a", FALSE, "", "");
}
END_TEST

/* The DKIM and ARC signatures of mail that passed several hops (6 kB
   of encoded runs in windows, as on 476 corpus messages) are indexed
   whole: the header field is not UNINDEXED, so an ASCII TEXT search
   of that mail is not "maybe" (2 kB of them were kept before). */
START_TEST(test_header_signatures_kept)
{
	static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
		"abcdefghijklmnopqrstuvwxyz0123456789+/";
	struct feed_ctx ctx;
	const char *error;
	uint32_t seed = 12345;
	unsigned int i, j;

	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 50);
	for (i = 0; i < 8; i++) T_BEGIN {
		string_t *sig = t_str_new(512);

		str_append(sig, "i=1; a=rsa-sha256; b=");
		for (j = 0; j < 344; j++) {
			seed = seed * 1103515245 + 12345;
			str_append_c(sig, b64[(seed >> 16) % 64]);
		}
		if (i == 7)
			str_append(sig, "Zq9Wv9Kp3x");
		add_field(&ctx, CASIDX_FIELD_HEADER, str_c(sig));
	} T_END;
	add_field(&ctx, CASIDX_FIELD_BODY, "plain text");
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);

	check1(ALL, "zzzzqqqq", FALSE, "", "");
	check1(ALL, "plain", FALSE, "50", "");
	/* the end of the last signature is a term */
	check1(CASIDX_FIELD_MASK(CASIDX_FIELD_HEADER), "zq9wv9kp3x", FALSE,
	       "50", "");
}
END_TEST

/* TEXT phrases in headers (no positions): word 1 must end a term of
   the other fields, a middle word be one, the last word start one (or
   a folded term, or a header name with a space, hold it). "band
   exchange" holds "and" and "change" but no piece "and change" can
   be there; a header name is indexed whole, spaces and all. */
START_TEST(test_phrase_exclusion_headers)
{
	struct feed_ctx ctx;
	const char *error;
	const char *name = "bad and change line";

	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 60);
	add_field(&ctx, CASIDX_FIELD_HEADER, "band exchange");
	add_field(&ctx, CASIDX_FIELD_BODY, "and then change");
	add_doc(&ctx, 61);
	add_field(&ctx, CASIDX_FIELD_HEADER, "sand changes");
	add_field(&ctx, CASIDX_FIELD_BODY, "and then change");
	add_doc(&ctx, 62);
	casidx_index_writer_add_term(ctx.w, CASIDX_FIELD_HEADER, name,
				     strlen(name));
	add_field(&ctx, CASIDX_FIELD_BODY, "and then change");
	add_doc(&ctx, 63);
	add_field(&ctx, CASIDX_FIELD_SUBJECT, "Re: it is this bond's way");
	add_field(&ctx, CASIDX_FIELD_HEADER, "b\xC3\xA4nd a b-and is "
		  "rebonded way");
	add_field(&ctx, CASIDX_FIELD_BODY, "this and that is and way");
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);

	check1(BODY, "and change", FALSE, "", "");
	check1(ALL, "and change", FALSE, "", "61,62");
	/* 63: "b-and" ends with "and" (so does the folded "band" of
	   "bänd"), "bond's" and "rebonded" start with "bond" and
	   "rebond", nothing starts with "onded" */
	check1(ALL, "and is bond", FALSE, "", "63");
	check1(ALL, "and is rebond", FALSE, "", "63");
	check1(ALL, "and is onded", FALSE, "", "");
	check1(ALL, "is this", FALSE, "", "63");
}
END_TEST

/* '.' between letters joins them into one word like '_' (UAX #29
   MidNumLet), so "www.linux" outside any term holding it is absent,
   unless a term may end or begin at the '.': an encoded run (no '.' in
   the base64 alphabet), or a folded word of a character Dovecot reads
   as ASCII letters that UAX #29 does not join ("™" is "TM"; the
   underscore rule missed "gnu_tm" in "gnu_™" before). */
START_TEST(test_joined_exclusion)
{
	struct feed_ctx ctx;
	const char *error;

	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 70);
	add_field(&ctx, CASIDX_FIELD_BODY, "see www.linux.org now");
	add_doc(&ctx, 71);
	add_field(&ctx, CASIDX_FIELD_BODY, "www and linux, www. linux");
	add_doc(&ctx, 72);
	add_field(&ctx, CASIDX_FIELD_BODY,
		  "aB3dE5fG7hJ9kL1mN2pQ4rS6tU8vW0xY2zA4bC6www.linux");
	add_doc(&ctx, 73);
	add_field(&ctx, CASIDX_FIELD_BODY, "xwww.linuxAb3De5Fg7Hj9Kl1Mn2Pq4Rs"
		  "6Tu8Vw0Xy2Za4Bc6");
	add_doc(&ctx, 74);
	add_field(&ctx, CASIDX_FIELD_BODY, "gnu_\xE2\x84\xA2 and www.\xE2\x84"
		  "\xA2 and \xE2\x84\xA2_radio");
	add_doc(&ctx, 75);
	add_field(&ctx, CASIDX_FIELD_BODY, "gnu tm www tm radio");
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);

	check1(BODY, "www.linux", FALSE, "70", "72,73");
	check1(BODY, "w.l", FALSE, "70", "72,73");
	check1(BODY, "www.tm", FALSE, "", "74");
	check1(BODY, "gnu_tm", FALSE, "", "74");
	check1(BODY, "tm_radio", FALSE, "", "74");
	check1(BODY, "m_radio", FALSE, "", "74");
	/* two dots, a digit next to one: not this rule (maybe) */
	check1(BODY, "www..linux", FALSE, "", "70,71,72,73");
	check1(BODY, "www.l1nux", FALSE, "", "");
}
END_TEST

/* Two words with punctuation between ("com/blog") are two tokens at p
   and p + 1 without a space, or one term holding the value (URL,
   encoded run): a candidate with neither (nor an occurrence without a
   code) is out. Never definite from the positions: "com-blog" is kept,
   as maybe. */
START_TEST(test_adjacent_exclusion)
{
	struct feed_ctx ctx;
	const char *error;

	ctx.w = casidx_index_writer_begin(idx);
	add_doc(&ctx, 80);
	add_field(&ctx, CASIDX_FIELD_BODY, "see lwn.com/blog here");
	add_doc(&ctx, 81);
	add_field(&ctx, CASIDX_FIELD_BODY, "com blog and blog/com");
	add_doc(&ctx, 82);
	add_field(&ctx, CASIDX_FIELD_BODY, "see http://a.com/blog");
	add_doc(&ctx, 83);
	add_field(&ctx, CASIDX_FIELD_BODY, "lwn.com-blog");
	add_doc(&ctx, 84);
	add_field(&ctx, CASIDX_FIELD_BODY, "a.com/blog\xC3\xA9");
	add_doc(&ctx, 85);
	add_field(&ctx, CASIDX_FIELD_BODY, "x@y.com/blog");
	add_doc(&ctx, 86);
	add_field(&ctx, CASIDX_FIELD_HEADER, "lwn.com blog");
	add_field(&ctx, CASIDX_FIELD_BODY, "com blog");
	add_doc(&ctx, 87);
	add_field(&ctx, CASIDX_FIELD_HEADER, "thecom/blogs");
	add_field(&ctx, CASIDX_FIELD_BODY, "com blog");
	ck_assert_int_eq(casidx_index_writer_commit(&ctx.w, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(idx, &error), 1);

	/* 80: com ends "lwn.com", blog follows; 82: in the URL; 83: the
	   same tokens with '-': maybe; 84: an ICU piece; 85: the
	   address ends with "com" */
	check1(BODY, "com/blog", FALSE, "82", "80,83,84,85");
	/* TEXT: 86's header has the words where a header value could
	   hold them (no positions there), 87's a term holding it */
	check1(ALL, "com/blog", FALSE, "82", "80,83,84,85,86,87");
	/* '.' with '/': neither rule */
	check1(BODY, "lwn.com/blog", FALSE, "", "80,83");
	/* 84: an ICU piece has it without codes */
	check1(BODY, "blog/com", FALSE, "", "81,84");
	/* 80 has "blog here": out */
	check1(BODY, "com/blog/here", FALSE, "", "");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("casidx-query");
	TCase *tc = tcase_create("query");
	int failed;

	lib_init();
	tcase_add_checked_fixture(tc, build_index, teardown);
	tcase_add_test(tc, test_words_prefixes_substrings);
	tcase_add_test(tc, test_maybe_cases);
	tcase_add_test(tc, test_many_tokens);
	tcase_add_test(tc, test_not_and_or);
	tcase_add_test(tc, test_answerable);
	tcase_add_test(tc, test_scores);
	tcase_add_test(tc, test_lazy_corruption_detected);
	tcase_add_test(tc, test_cjk_single_char);
	tcase_add_test(tc, test_exactness_markers);
	tcase_add_test(tc, test_dtgram_value);
	tcase_add_test(tc, test_dtgram_chunks);
	tcase_add_test(tc, test_dtgrams);
	tcase_add_test(tc, test_raw_address_namespaces);
	tcase_add_test(tc, test_phrase_exclusion_terms);
	tcase_add_test(tc, test_phrase_exclusion_parts);
	tcase_add_test(tc, test_underscore_exclusion);
	tcase_add_test(tc, test_header_signatures_kept);
	tcase_add_test(tc, test_phrase_exclusion_headers);
	tcase_add_test(tc, test_joined_exclusion);
	tcase_add_test(tc, test_adjacent_exclusion);
	suite_add_tcase(s, tc);
	tc = tcase_create("seg3");
	tcase_add_checked_fixture(tc, open_seg3_fixture, teardown);
	tcase_add_test(tc, test_seg3_raw_addresses);
	suite_add_tcase(s, tc);
	tc = tcase_create("seg4");
	tcase_add_checked_fixture(tc, open_seg4_fixture, teardown);
	tcase_add_test(tc, test_seg4_part_codes);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
