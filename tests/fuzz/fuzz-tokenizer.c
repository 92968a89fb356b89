/* Fuzz the casidx tokenizer: no crash; every term non-empty, at most
   CASIDX_TOKEN_MAX_BYTES and valid UTF-8; chunked feeding gives the
   tokens of the whole input; for ASCII input the fast path equals ICU.
   The dtgram feeder (casidx-dtgram.h) too: every gram two code points
   that qualify, positions ascending, neighbours at p and p + 1 sharing
   their middle code point, chunked feeding equal to the whole input.
   Input: byte 0 seeds the chunk sizes, the rest is the text.

   libFuzzer: clang -fsanitize=fuzzer,address -DCASIDX_LIBFUZZER ...
   Otherwise main() replays files or directories given as arguments, by
   default $CASBOX_TOP_SRCDIR/tests/fuzz/corpus/tokenizer (make check),
   with the shared driver in fuzz-replay.c. */

#include "lib.h"
#include "str.h"
#include "unichar.h"
#include "casidx-tokenizer-private.h"
#include "casidx-dtgram.h"
#include "fuzz-replay.h"

static struct casidx_tokenizer *tok;
static struct casidx_dtgram *dt;

struct dt_check {
	string_t *str;
	bool have_prev;
	uint32_t prev_pos;
	unichar_t prev_second;
};

static void dt_check_cb(const unsigned char *gram, size_t len, uint32_t pos,
			void *context)
{
	struct dt_check *ctx = context;
	unichar_t a, b;
	int n, m;

	n = uni_utf8_get_char_n(gram, len, &a);
	if (n <= 0 || (size_t)n >= len)
		i_panic("dtgram: bad first code point");
	m = uni_utf8_get_char_n(gram + n, len - n, &b);
	if (m <= 0 || (size_t)(n + m) != len)
		i_panic("dtgram: not two code points");
	if (!casidx_dtgram_pair_ok(a, b))
		i_panic("dtgram: a pair that does not qualify");
	if (ctx->have_prev) {
		if (pos <= ctx->prev_pos)
			i_panic("dtgram: positions not ascending");
		if (pos == ctx->prev_pos + 1 && a != ctx->prev_second)
			i_panic("dtgram: neighbours do not chain");
	}
	ctx->have_prev = TRUE;
	ctx->prev_pos = pos;
	ctx->prev_second = b;
	str_append_data(ctx->str, gram, len);
	str_printfa(ctx->str, "@%u ", pos);
}

static const char *dt_run(const uint8_t *text, size_t size, uint8_t seed,
			  bool chunked)
{
	struct dt_check ctx = { .str = t_str_new(256) };
	size_t pos = 0, n, round = 0;

	casidx_dtgram_reset(dt);
	while (pos < size) {
		n = chunked ? (seed * 5 + pos * 11 + round++) % 7 : size;
		n = I_MIN(n, size - pos);
		casidx_dtgram_feed(dt, text + pos, n, dt_check_cb, &ctx);
		pos += n;
	}
	return str_c(ctx.str);
}
/* compare RAW and SPACE_BEFORE too (not between the two paths) */
static bool with_raw = TRUE;

static void check_cb(const struct casidx_token *t, void *context)
{
	string_t *str = context;
	size_t i = 0;
	int n;

	if (t->term_len == 0 || t->term_len > CASIDX_TOKEN_MAX_BYTES)
		i_panic("bad term length %zu", t->term_len);
	while (i < t->term_len) {
		n = casidx_tok_utf8_seq_len((const void *)(t->term + i),
					    t->term_len - i);
		if (n <= 0)
			i_panic("term is not valid UTF-8");
		i += n;
	}
	if ((t->flags & CASIDX_TOKEN_FLAG_SPACE_BEFORE) != 0 &&
	    (t->flags & CASIDX_TOKEN_FLAG_RAW) == 0)
		i_panic("SPACE_BEFORE without RAW");
	if ((t->flags & CASIDX_TOKEN_FLAG_RAW) != 0 &&
	    (t->flags & CASIDX_TOKEN_FLAG_PART) != 0)
		i_panic("a RAW part");
	str_append_data(str, t->term, t->term_len);
	/* RAW and SPACE_BEFORE are the ASCII fast path's alone (ICU words
	   are never RAW), so the two paths are compared without them;
	   chunked and whole runs of one path with them */
	str_printfa(str, "@%u/%d ", t->position,
		    (int)(with_raw ? t->flags :
			  (t->flags & ~(CASIDX_TOKEN_FLAG_RAW |
					CASIDX_TOKEN_FLAG_SPACE_BEFORE))));
}

static const char *run(const uint8_t *text, size_t size, uint8_t seed,
		       bool chunked)
{
	string_t *str = t_str_new(256);
	size_t pos = 0, n, round = 0;

	casidx_tokenizer_reset(tok);
	while (pos < size) {
		/* sizes 0..22; an empty feed is followed by a non-empty one */
		n = chunked ? (seed * 7 + pos * 13 + round++) % 23 : size;
		n = I_MIN(n, size - pos);
		casidx_tokenizer_feed(tok, text + pos, n, check_cb, str);
		pos += n;
	}
	casidx_tokenizer_final(tok, check_cb, str);
	return str_c(str);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t i;

	if (tok == NULL) {
		lib_init();
		tok = casidx_tokenizer_create();
		dt = casidx_dtgram_create();
	}
	if (size == 0)
		return 0;
	T_BEGIN {
		const uint8_t *text = data + 1;
		size_t len = size - 1;
		const char *whole = run(text, len, data[0], FALSE);

		if (strcmp(whole, run(text, len, data[0], TRUE)) != 0)
			i_panic("chunked tokens differ from whole");
		if (strcmp(dt_run(text, len, data[0], FALSE),
			   dt_run(text, len, data[0], TRUE)) != 0)
			i_panic("chunked dtgrams differ from whole");
		for (i = 0; i < len && text[i] < 0x80; i++) ;
		if (i == len) {
			with_raw = FALSE;
			whole = run(text, len, 0, FALSE);
			casidx_tokenizer_set_ascii_fast_path(tok, FALSE);
			if (strcmp(whole, run(text, len, 0, FALSE)) != 0)
				i_panic("ASCII fast path differs from ICU");
			casidx_tokenizer_set_ascii_fast_path(tok, TRUE);
			with_raw = TRUE;
		}
	} T_END;
	return 0;
}

#ifndef CASIDX_LIBFUZZER
int main(int argc, char *argv[])
{
	return fuzz_replay_main("tokenizer", argc, argv, NULL);
}
#endif
