/* casidx tokenizer: hand-written cases in many scripts, compounds, base64
   skip, the length cap, invalid UTF-8; properties: any chunking gives the
   tokens of the whole text, the ASCII fast path equals ICU, and a query
   made of whole pieces of a text only yields terms the text has. */

#include "lib.h"
#include "str.h"
#include "array.h"
#include "casidx-tokenizer-private.h"

#include <check.h>
#include "check-run.h"
#include <stdlib.h>

static struct casidx_tokenizer *tok;

/* xorshift32: reproducible from the seed printed by a failure */
static unsigned int rnd(unsigned int *state)
{
	unsigned int x = *state == 0 ? 0x9e3779b9U : *state;

	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	*state = x;
	return x;
}

static void setup(void)
{
	tok = casidx_tokenizer_create();
}

static void teardown(void)
{
	casidx_tokenizer_destroy(&tok);
}

/* Tokens as "term@pos", with "/p" for PART and "/c" for CJK. */
static void collect_cb(const struct casidx_token *t, void *context)
{
	string_t *str = context;

	ck_assert_uint_gt(t->term_len, 0);
	ck_assert_uint_le(t->term_len, CASIDX_TOKEN_MAX_BYTES);
	if (str_len(str) > 0)
		str_append_c(str, ' ');
	str_append_data(str, t->term, t->term_len);
	str_printfa(str, "@%u", t->position);
	if ((t->flags & CASIDX_TOKEN_FLAG_PART) != 0)
		str_append(str, "/p");
	if ((t->flags & CASIDX_TOKEN_FLAG_CJK) != 0)
		str_append(str, "/c");
	if ((t->flags & CASIDX_TOKEN_FLAG_ENCODED) != 0)
		str_append(str, "/e");
	if ((t->flags & CASIDX_TOKEN_FLAG_FOLDED) != 0)
		str_append(str, "/f");
	if ((t->flags & CASIDX_TOKEN_FLAG_WINDOW) != 0)
		str_append(str, "/w");
}

/* collect_cb plus "/r" for RAW and "/s" for SPACE_BEFORE */
static void flags_cb(const struct casidx_token *t, void *context)
{
	string_t *str = context;

	collect_cb(t, context);
	if ((t->flags & CASIDX_TOKEN_FLAG_RAW) != 0)
		str_append(str, "/r");
	if ((t->flags & CASIDX_TOKEN_FLAG_SPACE_BEFORE) != 0)
		str_append(str, "/s");
}

static const char *tokens(const char *text, size_t len)
{
	string_t *str = t_str_new(256);

	casidx_tokenizer_tokenize(tok, text, len, collect_cb, str);
	return str_c(str);
}

static const char *tokens_chunked_cb(const char *text, size_t len,
				     unsigned int seed,
				     casidx_token_callback_t *cb)
{
	string_t *str = t_str_new(256);
	size_t pos = 0, n;

	casidx_tokenizer_reset(tok);
	while (pos < len) {
		/* mostly small chunks, sometimes empty, sometimes large */
		switch (rnd(&seed) % 4) {
		case 0: n = 0; break;
		case 1: n = 1; break;
		case 2: n = rnd(&seed) % 8; break;
		default: n = rnd(&seed) % 200; break;
		}
		if (n > len - pos)
			n = len - pos;
		casidx_tokenizer_feed(tok, (const unsigned char *)text + pos,
				      n, cb, str);
		pos += n;
	}
	casidx_tokenizer_final(tok, cb, str);
	return str_c(str);
}

static const char *tokens_chunked(const char *text, size_t len,
				  unsigned int seed)
{
	return tokens_chunked_cb(text, len, seed, collect_cb);
}

struct tok_case {
	const char *input;
	const char *expect;
};

static const struct tok_case cases[] = {
	/* ASCII words, case folding, UAX #29 joins (WB6/7, WB11/12, WB13) */
	{ "Hello, World!", "hello@0 world@1" },
	{ "a.b e.g. foo_bar a:b 3.14 1,000 x-y",
	  "a.b@0 a@0/p b@0/p e.g@1 e@1/p g@1/p foo_bar@2 foo@2/p bar@2/p "
	  "a@3 b@4 3.14@5 3@5/p 14@5/p 1,000@6 1@6/p 000@6/p x@7 y@8" },
	{ "don't l'homme don\xE2\x80\x99t",
	  "don't@0 don@0/p t@0/p l'homme@1 l@1/p homme@1/p "
	  "don't@2 don@2/p t@2/p" },
	{ "  ___ ... '' ", "" },
	{ "", "" },
	/* Latin with accents: NFKC + case fold + accent fold */
	{ "Café NAÏVE Ångström façade Straße Ǆemal ﬁnd",
	  "cafe@0/f naive@1/f angstrom@2/f facade@3/f strasse@4/f dzemal@5/f "
	  "find@6/f" },
	{ "Tiếng Việt İstanbul", "tieng@0/f viet@1/f istanbul@2/f" },
	/* dotless i is "I" to Dovecot's search: "i", folded */
	{ "Işık ılık", "isik@0/f ilik@1/f" },
	/* ICU splits "n²"; Dovecot's search reads "N2": joined too */
	{ "than n\xC2\xB2 x\xC2\xB2y", "than@0 n@1 2@2/f n2@2/p/f x@3 2@4/f "
	  "y@5 x2y@5/p/f" },
	{ "cafe\xCC\x81 e\xCC\x81t\xCC\x81\xC3\xA9", "cafe@0 ete@1/f" },
	/* Greek: final sigma folds to sigma, tonos dropped */
	{ "ΟΔΥΣΣΕΥΣ Οδυσσεύς", "οδυσσευσ@0 οδυσσευσ@1" },
	{ "λόγος ΛΟΓΟΣ", "λογοσ@0 λογοσ@1" },
	/* Cyrillic */
	{ "Привет, МИР! ёлка", "привет@0 мир@1 елка@2" },
	/* Arabic (harakat dropped) and Hebrew (niqqud dropped) */
	{ "العَرَبِيَّة العربية", "العربية@0 العربية@1" },
	{ "שָׁלוֹם עולם", "שלום@0 עולם@1" },
	/* Chinese: overlapping bigrams, the last char also as unigram */
	{ "我是中国人", "我是@0/c 是中@1/c 中国@2/c 国人@3/c 人@3/p/c" },
	{ "中", "中@0/c" },
	{ "中文，日本", "中文@0/c 文@0/p/c 日本@1/c 本@1/p/c" },
	/* Japanese: kanji + kana in one run; half-width kana widened;
	   voicing marks kept */
	{ "東京タワーに行く",
	  "東京@0/c 京タ@1/c タワ@2/c ワー@3/c ーに@4/c に行@5/c 行く@6/c "
	  "く@6/p/c" },
	{ "ｶﾞｯｺｳ がっこう",
	  "ガッ@0/c ッコ@1/c コウ@2/c ウ@2/p/c "
	  "がっ@3/c っこ@4/c こう@5/c う@5/p/c" },
	/* Korean: Hangul bigrams; digits stay a separate word */
	{ "학교에서 3월", "학교@0/c 교에@1/c 에서@2/c 서@2/p/c 3@3 월@4/c" },
	/* Mixed script: Latin or digits next to CJK are separate words;
	   an ideographic variation selector stays with its character and
	   NFKC_Casefold drops it; kana punctuation separates runs */
	{ "Windows版", "windows@0 版@1/c" },
	{ "カナ_x 東京2020年",
	  "カナ@0/c ナ@0/p/c x@1 東京@2/c 京@2/p/c 2020@3 年@4/c" },
	{ "葛\xF3\xA0\x84\x80城", "葛城@0/c 城@0/p/c" },
	{ "゛か゛ ・カナ・", "か@0/c カナ@1/c ナ@1/p/c" },
	/* Thai: ICU's dictionary segmentation (UAX #29 alone would not) */
	{ "ภาษาไทยง่ายนิดเดียว",
	  "ภาษา@0 ไทย@1 ง่าย@2 นิด@3 เดียว@4" },
	/* Emoji are words; NFKC_Casefold drops the ZWJ */
	{ "party 🎉 👨‍👩‍👧 ok", "party@0 🎉@1 👨👩👧@2 ok@3" },
	/* full-width Latin and digits */
	{ "ＡＢＣ１２３", "abc123@0/f" },
	/* e-mail addresses: whole, local part, domain, atoms */
	{ "Mail John.Doe+tag@Example.COM now",
	  "mail@0 john.doe+tag@example.com@1 john.doe+tag@1/p "
	  "example.com@1/p john@1/p doe@1/p tag@1/p example@1/p com@1/p "
	  "now@2" },
	{ "<root@localhost>,", "root@localhost@0 root@0/p localhost@0/p" },
	/* '@' is ALetter in ICU 72, so a non-address keeps it (ICU 76:
	   see cases_unicode16) */
	{ "@user a@@b", "user@0 a@@b@1 a@1/p b@1/p" },
	/* URLs: whole (lower-cased), host, atoms; sentence punctuation
	   trimmed, balanced parentheses kept */
	{ "see https://Example.com/a?x=1.",
	  "see@0 https://example.com/a?x=1@1 example.com@1/p https@1/p "
	  "example@1/p com@1/p a@1/p x@1/p 1@1/p" },
	{ "(www.foo.org)", "www.foo.org@0 www@0/p foo@0/p org@0/p" },
	{ "http://x.org/wiki/A_(b)",
	  "http://x.org/wiki/a_(b)@0 x.org@0/p http@0/p x@0/p org@0/p "
	  "wiki@0/p a@0/p b@0/p" },
	/* base64 runs are one lower-cased term (/e), hex, short or plain
	   runs are words */
	{ "x aGVsbG8gd29ybGQgdGhpcyBpcyBhIGxvbmcgYmFzZTY0IHJ1bg== y",
	  "x@0 agvsbg8gd29ybgqgdghpcybpcybhigxvbmcgymfzzty0ihj1bg==@1/e y@2" },
	{ "sha d41d8cd98f00b204e9800998ecf8427e0123abcd end",
	  "sha@0 d41d8cd98f00b204e9800998ecf8427e0123abcd@1 end@2" },
	/* a path is text however long */
	{ "/llvm/lib/Transforms/Instrumentation/MemorySanitizer.cpp:3236:",
	  "llvm@0 lib@1 transforms@2 instrumentation@3 "
	  "memorysanitizer.cpp@4 memorysanitizer@4/p cpp@4/p 3236@5" },
	{ "d41d8cd98f00b204", "d41d8cd98f00b204@0" },
	{ "pneumonoultramicroscopicsilicovolcanoconiosis",
	  "pneumonoultramicroscopicsilicovolcanoconiosis@0" },
	/* hyphen/underscore-separated identifiers are text, not base64,
	   even over 40 or 60 bytes; base64url with '-'/'_' still skipped */
	{ "X-MS-Exchange-CrossTenant-originalarrivaltime",
	  "x@0 ms@1 exchange@2 crosstenant@3 originalarrivaltime@4" },
	{ "X-MS-Office365-Filtering-Correlation-Id-Prvs-Header",
	  "x@0 ms@1 office365@2 filtering@3 correlation@4 id@5 prvs@6 "
	  "header@7" },
	{ "a some_really_long_configuration_variable_name_for_testing b",
	  "a@0 some_really_long_configuration_variable_name_for_testing@1 "
	  "some@1/p really@1/p long@1/p configuration@1/p variable@1/p "
	  "name@1/p for@1/p testing@1/p b@2" },
	{ "X-Microsoft-Exchange-Diagnostics-Untrusted-Transport-HeaderName",
	  "x@0 microsoft@1 exchange@2 diagnostics@3 untrusted@4 "
	  "transport@5 headername@6" },
	{ "x aGVsbG8-d29ybGQ_dGhpcyBpcyBhIGxvbmcgYmFzZTY0IHJ1bg y",
	  "x@0 agvsbg8-d29ybgq_dghpcybpcybhigxvbmcgymfzzty0ihj1bg@1/e y@2" },
	{ "x QWxhZGRpbjpvcGVu-c2VzYW1lX2FuZF9zb21lX21vcmU_ZGF0YQ y",
	  "x@0 qwxhzgrpbjpvcgvu-c2vzyw1lx2fuzf9zb21lx21vcmu_zgf0yq@1/e y@2" },
	{ "x 3f2a9c7e-1b4d-4e8f-9a6b-2c5d7e9f1a3b4c5d6e7f8a9b y",
	  "x@0 3f2a9c7e-1b4d-4e8f-9a6b-2c5d7e9f1a3b4c5d6e7f8a9b@1/e y@2" },
	/* a word over 64 bytes: overlapping windows, every 32 bytes and
	   one at the end */
	{ "abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789",
	  "abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz01@0/w "
	  "ijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789@0/w" },
	/* invalid UTF-8 separates words */
	{ "abc\xFF" "def \xC0\xAFghi \xED\xA0\x80jkl mno\xE4\xB8",
	  "abc@0 def@1 ghi@2 jkl@3 mno@4" },
};

/* Where Unicode 16.0 (ICU 76, Debian 13) segments differently from ICU
   72: what follows from ICU 76's own word boundaries ("a@@b" is
   [a][@][@][b] there). */
static const struct tok_case cases_unicode16[] = {
	{ "@user a@@b", "user@0 a@1 b@2" },
};

static const char *tok_case_expect(const struct tok_case *c)
{
	unsigned int i;

	if (casidx_tok_icu_ascii_rules_match())
		return c->expect;
	for (i = 0; i < N_ELEMENTS(cases_unicode16); i++) {
		if (strcmp(cases_unicode16[i].input, c->input) == 0)
			return cases_unicode16[i].expect;
	}
	return c->expect;
}

START_TEST(test_cases)
{
	const struct tok_case *c = &cases[_i];
	const char *expect = tok_case_expect(c);

	T_BEGIN {
		const char *got = tokens(c->input, strlen(c->input));

		ck_assert_msg(strcmp(got, expect) == 0,
			      "input '%s'\n got '%s'\nwant '%s'",
			      c->input, got, expect);
	} T_END;
}
END_TEST

static void assert_valid_utf8(const char *s, size_t len)
{
	size_t i = 0;
	int n;

	while (i < len) {
		n = casidx_tok_utf8_seq_len((const void *)(s + i), len - i);
		ck_assert_int_gt(n, 0);
		i += n;
	}
}

static void cap_cb(const struct casidx_token *t, void *context)
{
	string_t *str = context;

	assert_valid_utf8(t->term, t->term_len);
	str_truncate(str, 0);
	str_append_data(str, t->term, t->term_len);
}

START_TEST(test_length_cap)
{
	string_t *in = t_str_new(512), *out = t_str_new(128);
	unsigned int i;

	/* Devanagari: 3-byte letters, 64 is no multiple of 3 */
	for (i = 0; i < 40; i++)
		str_append(in, "क");
	casidx_tokenizer_tokenize(tok, str_c(in), str_len(in), cap_cb, out);
	ck_assert_uint_eq(str_len(out), 63);
	/* Cyrillic upper case: the cap applies after folding */
	str_truncate(in, 0);
	for (i = 0; i < 50; i++)
		str_append(in, "Ж");
	casidx_tokenizer_tokenize(tok, str_c(in), str_len(in), cap_cb, out);
	ck_assert_uint_eq(str_len(out), 64);
	ck_assert(strncmp(str_c(out), "жжж", 6) == 0);
	/* a long URL is cut too; the query side cuts it the same way */
	str_truncate(in, 0);
	str_append(in, "https://example.com/");
	for (i = 0; i < 30; i++)
		str_append(in, "path/");
	casidx_tokenizer_tokenize(tok, str_c(in), str_len(in), cap_cb, out);
	ck_assert(strcmp(tokens(str_c(in), str_len(in)),
			 tokens(str_c(in), str_len(in))) == 0);
	ck_assert_str_eq(str_c(out), "path");	/* the last part */
	ck_assert(strncmp(tokens(str_c(in), str_len(in)), str_c(in),
			  CASIDX_TOKEN_MAX_BYTES) == 0);
	ck_assert_int_eq(tokens(str_c(in), str_len(in))
			 [CASIDX_TOKEN_MAX_BYTES], '@');
}
END_TEST

START_TEST(test_positions_reset)
{
	string_t *str = t_str_new(64);

	casidx_tokenizer_feed(tok, (const void *)"one two", 7,
			      collect_cb, str);
	casidx_tokenizer_reset(tok);
	casidx_tokenizer_feed(tok, (const void *)"three", 5,
			      collect_cb, str);
	casidx_tokenizer_final(tok, collect_cb, str);
	/* "two" was pending at reset and is dropped with the field */
	ck_assert_str_eq(str_c(str), "one@0 three@0");
}
END_TEST

START_TEST(test_final_flushes)
{
	string_t *str = t_str_new(64);

	casidx_tokenizer_reset(tok);
	casidx_tokenizer_feed(tok, (const void *)"abc de", 6,
			      collect_cb, str);
	ck_assert_str_eq(str_c(str), "abc@0");
	casidx_tokenizer_feed(tok, (const void *)"f", 1, collect_cb, str);
	ck_assert_str_eq(str_c(str), "abc@0");
	casidx_tokenizer_final(tok, collect_cb, str);
	ck_assert_str_eq(str_c(str), "abc@0 def@1");
}
END_TEST

/* Fragments for random texts: every script, compounds, joiners,
   whitespace kinds, invalid and partial UTF-8. */
static const char *const fragments[] = {
	"Hello", "WORLD", "café", "Straße", "ΟΔΥΣΣΕΥΣ", "ς", "Привет",
	"العَرَبِيَّة", "שָׁלוֹם", "我是中国人", "東京タワー", "ｶﾞｯｺｳ", "학교에서",
	"ภาษาไทย", "🎉", "👨‍👩‍👧", "john.doe@example.com", "a@b",
	"https://x.org/a_(b)?c=d", "www.foo.org", "://", "@", ".", "'",
	"’", "_", "-", ",", ";", ":", "/", "(", ")", "3.14", "1,000", "42",
	"e\xCC\x81", "\xCC\x81", "\xE2\x80\x8D", "\xEF\xB8\x8F",
	"aGVsbG8gd29ybGQgdGhpcyBpcyBhIGxvbmcgYmFzZTY0IHJ1bg==",
	"d41d8cd98f00b204e9800998ecf8427e0123abcd", " ", "  ", "\n",
	"\r\n", "\t", "\xFF", "\xE4\xB8", "\xC0\xAF", "ＡＢＣ", "ﬁ", "İ",
};

static void random_text(string_t *str, unsigned int *seed, unsigned int n)
{
	unsigned int i;

	for (i = 0; i < n; i++) {
		str_append(str, fragments[rnd(seed) %
					  N_ELEMENTS(fragments)]);
	}
}

/* RAW and SPACE_BEFORE (what positions prove phrases with) */
START_TEST(test_raw_space_flags)
{
	string_t *str = t_str_new(256);
	static const char text[] =
		"Hello  world foo-bar baz\tqux, quux x.y z "
		"caf\xC3\xA9 au lait mail john@example.com now "
		"http://x.org/a b";

	casidx_tokenizer_tokenize(tok, text, strlen(text), flags_cb, str);
	ck_assert_str_eq(str_c(str),
		"hello@0/r world@1/r foo@2/r/s bar@3/r baz@4/r/s qux@5/r "
		"quux@6/r x.y@7/r/s x@7/p y@7/p z@8/r/s cafe@9/f au@10/r "
		"lait@11/r/s mail@12/r/s john@example.com@13/r/s "
		"example.com@13/p john@13/p example@13/p com@13/p now@14/r/s "
		"http://x.org/a@15/r/s x.org@15/p http@15/p x@15/p org@15/p "
		"a@15/p b@16/r/s");
}
END_TEST

static void find_lcase(const char *hay, const char *needle, size_t len)
{
	size_t i, n = strlen(hay);

	for (i = 0; i + len <= n; i++) {
		if (strncasecmp(hay + i, needle, len) == 0)
			return;
	}
	ck_abort_msg("'%.*s' not in '%s'", (int)len, needle, hay);
}

struct space_ctx {
	const char *text;
	string_t *prev;
	bool prev_raw;
};

/* every RAW term is in the text (ASCII case aside), and every
   SPACE_BEFORE token follows its predecessor after one space */
static void space_cb(const struct casidx_token *t, void *context)
{
	struct space_ctx *ctx = context;
	string_t *pair;

	if ((t->flags & CASIDX_TOKEN_FLAG_PART) != 0)
		return;
	if ((t->flags & CASIDX_TOKEN_FLAG_RAW) != 0)
		find_lcase(ctx->text, t->term, t->term_len);
	if ((t->flags & CASIDX_TOKEN_FLAG_SPACE_BEFORE) != 0) {
		ck_assert(ctx->prev_raw);
		ck_assert((t->flags & CASIDX_TOKEN_FLAG_RAW) != 0);
		pair = t_str_new(128);
		str_append_str(pair, ctx->prev);
		str_append_c(pair, ' ');
		str_append_data(pair, t->term, t->term_len);
		find_lcase(ctx->text, str_c(pair), str_len(pair));
	}
	if ((t->flags & CASIDX_TOKEN_FLAG_WINDOW) == 0 ||
	    str_len(ctx->prev) == 0) {
		str_truncate(ctx->prev, 0);
		str_append_data(ctx->prev, t->term, t->term_len);
	}
	ctx->prev_raw = (t->flags & CASIDX_TOKEN_FLAG_RAW) != 0 &&
		(t->flags & CASIDX_TOKEN_FLAG_WINDOW) == 0;
}

/* Over random texts of every script: the flags never claim text that
   is not there, and chunking never changes them. */
START_TEST(test_raw_space_property)
{
	unsigned int seed = 777 + _i, round;

	for (round = 0; round < 40; round++) T_BEGIN {
		string_t *text = t_str_new(1024);
		string_t *whole = t_str_new(256);
		struct space_ctx ctx;
		const char *chunked;

		random_text(text, &seed, 1 + rnd(&seed) % 60);
		i_zero(&ctx);
		ctx.text = str_c(text);
		ctx.prev = t_str_new(64);
		casidx_tokenizer_tokenize(tok, str_c(text), str_len(text),
					  space_cb, &ctx);
		casidx_tokenizer_tokenize(tok, str_c(text), str_len(text),
					  flags_cb, whole);
		chunked = tokens_chunked_cb(str_c(text), str_len(text),
					    seed + round, flags_cb);
		ck_assert_msg(strcmp(str_c(whole), chunked) == 0,
			      "text '%s'\n whole '%s'\nchunked '%s'",
			      str_c(text), str_c(whole), chunked);
	} T_END;
}
END_TEST

START_TEST(test_chunking_property)
{
	unsigned int seed = 1234 + _i, round;

	for (round = 0; round < 40; round++) T_BEGIN {
		string_t *text = t_str_new(1024);
		const char *whole, *chunked;

		random_text(text, &seed, 1 + rnd(&seed) % 60);
		whole = tokens(str_c(text), str_len(text));
		chunked = tokens_chunked(str_c(text), str_len(text),
					 seed + round);
		ck_assert_msg(strcmp(whole, chunked) == 0,
			      "text '%s'\n whole '%s'\nchunked '%s'",
			      str_c(text), whole, chunked);
	} T_END;
}
END_TEST

/* Pieces longer than CASIDX_TOK_PIECE_MAX are cut where the text says,
   not where the chunks end. */
START_TEST(test_chunking_long_piece)
{
	unsigned int seed = 99, round;

	for (round = 0; round < 4; round++) T_BEGIN {
		string_t *text = t_str_new(40000);
		const char *whole, *chunked;

		while (str_len(text) < CASIDX_TOK_PIECE_MAX * 3) {
			str_append(text, fragments[rnd(&seed) % 16]);
			if (round % 2 == 0)
				str_append_c(text, ',');
		}
		whole = tokens(str_c(text), str_len(text));
		chunked = tokens_chunked(str_c(text), str_len(text), round);
		ck_assert(strcmp(whole, chunked) == 0);
		ck_assert_uint_gt(strlen(whole), 1000);
	} T_END;
}
END_TEST

START_TEST(test_ascii_fast_path_equals_icu)
{
	static const char alphabet[] = "aZq09.'_,;:@/-+=?#&() \n";
	unsigned int seed = 77, round, i, n;
	char buf[64];

	for (round = 0; round < 3000; round++) T_BEGIN {
		const char *fast, *icu;

		n = 1 + rnd(&seed) % (sizeof(buf) - 1);
		for (i = 0; i < n; i++)
			buf[i] = alphabet[rnd(&seed) % (sizeof(alphabet) - 1)];
		casidx_tokenizer_set_ascii_fast_path(tok, TRUE);
		fast = tokens(buf, n);
		casidx_tokenizer_set_ascii_fast_path(tok, FALSE);
		icu = tokens(buf, n);
		ck_assert_msg(strcmp(fast, icu) == 0,
			      "text '%.*s'\nfast '%s'\n icu '%s'",
			      (int)n, buf, fast, icu);
	} T_END;
}
END_TEST

struct term_set {
	ARRAY_TYPE(const_string) terms;
};

static void set_cb(const struct casidx_token *t, void *context)
{
	struct term_set *set = context;
	const char *term = t_strndup(t->term, t->term_len);

	array_push_back(&set->terms, &term);
}

static bool set_has(const struct term_set *set, const char *term)
{
	const char *const *t;

	array_foreach(&set->terms, t) {
		if (strcmp(*t, term) == 0)
			return TRUE;
	}
	return FALSE;
}

/* A query that is a whitespace-delimited part of an indexed text yields
   only terms that the index has: query and index tokenise alike. */
START_TEST(test_query_terms_in_index)
{
	unsigned int seed = 4242 + _i, round;

	for (round = 0; round < 40; round++) T_BEGIN {
		string_t *text = t_str_new(1024);
		struct term_set doc, query;
		const char *const *t, *p, *q;

		random_text(text, &seed, 1 + rnd(&seed) % 40);
		t_array_init(&doc.terms, 64);
		t_array_init(&query.terms, 16);
		casidx_tokenizer_tokenize(tok, str_c(text), str_len(text),
					  set_cb, &doc);
		/* the query: from one space to a later space */
		p = strchr(str_c(text) + rnd(&seed) % str_len(text), ' ');
		if (p == NULL)
			p = str_c(text);
		q = strrchr(p, ' ');
		if (q == NULL || q < p)
			q = p + strlen(p);
		casidx_tokenizer_tokenize(tok, p, q - p, set_cb, &query);
		array_foreach(&query.terms, t) {
			ck_assert_msg(set_has(&doc, *t),
				      "query term '%s' not in '%s'", *t,
				      str_c(text));
		}
	} T_END;
}
END_TEST

int main(void)
{
	Suite *s = suite_create("casidx-tok");
	TCase *tc = tcase_create("casidx-tok");
	int failed;

	lib_init();
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_loop_test(tc, test_cases, 0, N_ELEMENTS(cases));
	tcase_add_test(tc, test_length_cap);
	tcase_add_test(tc, test_positions_reset);
	tcase_add_test(tc, test_final_flushes);
	tcase_add_loop_test(tc, test_chunking_property, 0, 25);
	tcase_add_test(tc, test_raw_space_flags);
	tcase_add_loop_test(tc, test_raw_space_property, 0, 25);
	tcase_add_test(tc, test_chunking_long_piece);
	tcase_add_test(tc, test_ascii_fast_path_equals_icu);
	tcase_add_loop_test(tc, test_query_terms_in_index, 0, 10);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
