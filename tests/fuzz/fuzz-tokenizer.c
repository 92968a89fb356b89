/* Fuzz the casidx tokenizer: no crash; every term non-empty, at most
   CASIDX_TOKEN_MAX_BYTES and valid UTF-8; chunked feeding gives the
   tokens of the whole input; for ASCII input the fast path equals ICU.
   Input: byte 0 seeds the chunk sizes, the rest is the text.

   libFuzzer: clang -fsanitize=fuzzer,address -DCASIDX_LIBFUZZER ...
   Otherwise main() replays files or directories given as arguments, by
   default $CASBOX_TOP_SRCDIR/tests/fuzz/corpus/tokenizer (make check),
   with the shared driver in fuzz-replay.c. */

#include "lib.h"
#include "str.h"
#include "casidx-tokenizer-private.h"
#include "fuzz-replay.h"

static struct casidx_tokenizer *tok;

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
	str_append_data(str, t->term, t->term_len);
	str_printfa(str, "@%u/%d ", t->position, (int)t->flags);
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
	}
	if (size == 0)
		return 0;
	T_BEGIN {
		const uint8_t *text = data + 1;
		size_t len = size - 1;
		const char *whole = run(text, len, data[0], FALSE);

		if (strcmp(whole, run(text, len, data[0], TRUE)) != 0)
			i_panic("chunked tokens differ from whole");
		for (i = 0; i < len && text[i] < 0x80; i++) ;
		if (i == len) {
			casidx_tokenizer_set_ascii_fast_path(tok, FALSE);
			if (strcmp(whole, run(text, len, 0, FALSE)) != 0)
				i_panic("ASCII fast path differs from ICU");
			casidx_tokenizer_set_ascii_fast_path(tok, TRUE);
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
