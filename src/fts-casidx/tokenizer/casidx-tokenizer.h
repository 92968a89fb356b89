#ifndef CASIDX_TOKENIZER_H
#define CASIDX_TOKENIZER_H

/* casidx tokenizer: UTF-8 bytes -> normalised terms. The same code path
   is used at index and at query time, so both sides agree on every term.
   See doc/tokenizer.md. */

#define CASIDX_TOKEN_MAX_BYTES 64        /* hard cap on a normalised token */

enum casidx_token_flags {
	CASIDX_TOKEN_FLAG_PART = 0x01,   /* a part of a compound (address/URL split) */
	CASIDX_TOKEN_FLAG_CJK = 0x02,    /* CJK bigram or single-char unigram */
};

struct casidx_token {
	const char *term;        /* normalised UTF-8 (NFKC, case- and accent-folded), not NUL-terminated */
	size_t term_len;
	uint32_t position;       /* word position within the field (for phrases); parts share their compound's position */
	enum casidx_token_flags flags;
};

typedef void casidx_token_callback_t(const struct casidx_token *token, void *context);

struct casidx_tokenizer *casidx_tokenizer_create(void);
void casidx_tokenizer_destroy(struct casidx_tokenizer **tok);
/* Start a new field: resets position and pending state. */
void casidx_tokenizer_reset(struct casidx_tokenizer *tok);
/* Feed UTF-8 bytes of the current field; data may end in the middle of a character or word (chunk boundaries must never split or glue words). Invalid UTF-8 is treated as a separator. */
void casidx_tokenizer_feed(struct casidx_tokenizer *tok, const unsigned char *data, size_t size, casidx_token_callback_t *callback, void *context);
/* End of field: emit the pending word. */
void casidx_tokenizer_final(struct casidx_tokenizer *tok, casidx_token_callback_t *callback, void *context);
/* Normalise one query string exactly as indexing does (same tokens); convenience = reset+feed+final. */
void casidx_tokenizer_tokenize(struct casidx_tokenizer *tok, const char *str, size_t size, casidx_token_callback_t *callback, void *context);

#endif
