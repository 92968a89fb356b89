#ifndef CASIDX_TOKENIZER_PRIVATE_H
#define CASIDX_TOKENIZER_PRIVATE_H

#include "casidx-tokenizer.h"

/* Internals shared by casidx-tokenizer.c and the ICU adapter
   casidx-tok-icu.c. Only tests include this besides the library. */

/* A piece is a run of valid UTF-8 without ASCII whitespace. Longer runs
   are cut, deterministically from the text, near this many bytes. */
#define CASIDX_TOK_PIECE_MAX 8192
/* Words are normalised from at most this many UTF-16 units; a longer
   ASCII word is emitted in overlapping chunks of this size, each
   starting half a chunk after the previous one. */
#define CASIDX_TOK_WORD_INPUT_MAX 256
/* Runs of base64 alphabet at least this long may be skipped as encoded
   data: when their character class (lower, upper, digit) changes at
   least CASIDX_TOK_BASE64_CHANGES_PCT per cent of adjacent letter or
   digit pairs. Random base64 does at ~64 %, hex at ~47 % (hex is kept:
   all [0-9a-f] or all [0-9A-F]), words, paths, CamelCase and cipher
   names at < 30 %. */
#define CASIDX_TOK_BASE64_MIN CASIDX_TOKEN_ENCODED_MIN
#define CASIDX_TOK_BASE64_CHANGES_PCT 40
/* Compounds emit at most this many atom parts. */
#define CASIDX_TOK_MAX_PARTS 32

struct casidx_tok_icu;

/* Called by the ICU adapter for each normalised word (cjk=FALSE) or for
   each normalised run of CJK characters (cjk=TRUE). folded: the input
   had non-ASCII characters (CASIDX_TOKEN_FLAG_FOLDED). */
void casidx_tokenizer_emit_word(struct casidx_tokenizer *tok,
				const char *word, size_t len, bool cjk,
				bool folded);

/* Called by the ICU adapter for the concatenation of adjacent words
   whose normalised forms meet with ASCII letters or digits ("n" "²" ->
   "n2"): emitted as a folded part at the last word's position, so an
   ASCII value finds the text Dovecot's own search reads as "N2". */
void casidx_tokenizer_emit_joined(struct casidx_tokenizer *tok,
				  const char *term, size_t len);
struct casidx_tok_icu *casidx_tok_icu_create(void);
void casidx_tok_icu_destroy(struct casidx_tok_icu **icu);
/* Segment valid UTF-8 (UAX #29 with ICU's dictionaries for Thai and
   CJK), normalise each word and pass it to casidx_tokenizer_emit_word(). */
void casidx_tok_icu_segment(struct casidx_tok_icu *icu,
			    struct casidx_tokenizer *tok,
			    const unsigned char *data, size_t size);

/* Normalise a run of CJK characters (UTF-8) and pass it on as one. */
void casidx_tok_icu_cjk_run(struct casidx_tok_icu *icu,
			    struct casidx_tokenizer *tok,
			    const unsigned char *data, size_t size);

/* TRUE when ICU's word-break rules for ASCII are the ones the ASCII fast
   path reproduces (Unicode 15.0, ICU 72 on Debian 12). Unicode 16.0
   (ICU 76 on Debian 13) no longer joins "9@" or "a@@q" into one word, so
   there the fast path is off and all text goes through ICU. */
bool casidx_tok_icu_ascii_rules_match(void);

/* Test hook: when FALSE, pure-ASCII text also goes through ICU (the
   fast path must give identical tokens). Default TRUE; TRUE has no
   effect unless casidx_tok_icu_ascii_rules_match(). */
void casidx_tokenizer_set_ascii_fast_path(struct casidx_tokenizer *tok,
					  bool enable);

/* For the ICU path on pure-ASCII text (where ICU's word is the input's
   bytes lower-cased, as on the fast path): the next
   casidx_tokenizer_emit_word() is of the raw bytes starting at start
   (CASIDX_TOKEN_FLAG_RAW, _SPACE_BEFORE), until
   casidx_tokenizer_clear_word_raw(). */
void casidx_tokenizer_set_word_raw(struct casidx_tokenizer *tok,
				   const void *start);
void casidx_tokenizer_clear_word_raw(struct casidx_tokenizer *tok);

/* Returns the length of the valid UTF-8 sequence at data, 0 if data is a
   valid but incomplete prefix, -1 if invalid. size must be > 0. */
int casidx_tok_utf8_seq_len(const unsigned char *data, size_t size);

#endif
