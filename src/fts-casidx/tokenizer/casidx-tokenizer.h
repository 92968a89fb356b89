#ifndef CASIDX_TOKENIZER_H
#define CASIDX_TOKENIZER_H

/* casidx tokenizer: UTF-8 bytes -> normalised terms. The same code path
   is used at index and at query time, so both sides agree on every term.
   The rules (UAX #29 words, NFKC + case + accent folding, CJK bigrams,
   address/URL compounds, base64 skip, length cap) are in doc/tokenizer.md.
   Include lib.h first. */

/* Hard cap on a normalised token. A longer term is emitted as
   overlapping windows of at most this many bytes, starting every
   CASIDX_TOKEN_WINDOW_STEP bytes (at UTF-8 character boundaries) plus
   one ending at its end, so every substring of it of at most
   CASIDX_TOKEN_WINDOW_SAFE bytes lies inside one window. Nothing of a
   long word, path or URL is dropped. */
#define CASIDX_TOKEN_MAX_BYTES 64
#define CASIDX_TOKEN_WINDOW_STEP 32
#define CASIDX_TOKEN_WINDOW_SAFE 24
/* An encoded-looking run (CASIDX_TOKEN_FLAG_ENCODED) is at least this
   long: a term that short or longer may end or begin where the run of
   the base64 alphabet did, at any other character. */
#define CASIDX_TOKEN_ENCODED_MIN 40

enum casidx_token_flags {
	/* a part of a compound (address/URL split) or of a word with inner
	   punctuation ("e.g" -> "e", "g"); shares the compound's position */
	CASIDX_TOKEN_FLAG_PART = 0x01,
	/* CJK bigram or single-char unigram */
	CASIDX_TOKEN_FLAG_CJK = 0x02,
	/* (a window of) a run of the base64 alphabet that looks like
	   encoded data (doc/tokenizer.md), lower-cased, not segmented into
	   words: the index keeps a bounded amount of it per document and
	   marks the field UNINDEXED beyond that */
	CASIDX_TOKEN_FLAG_ENCODED = 0x04,
	/* Normalisation (NFKC, case and accent folding) changed more than
	   the ASCII case of the word: it may have made ASCII of non-ASCII
	   characters ("muñoz" -> "munoz") or dropped marks between ASCII
	   letters, so an ASCII query found in it is not proven to be in the
	   text. */
	CASIDX_TOKEN_FLAG_FOLDED = 0x08,
	/* one of the overlapping windows of a term longer than
	   CASIDX_TOKEN_MAX_BYTES */
	CASIDX_TOKEN_FLAG_WINDOW = 0x10,
	/* a whole token (never a part) whose term is exactly the bytes of
	   the text it came from, ASCII lower-cased (the ASCII word,
	   compound and encoded-run paths; not ICU-normalised words, not
	   CJK) */
	CASIDX_TOKEN_FLAG_RAW = 0x20,
	/* RAW, and the previous whole token of the field (position - 1)
	   is RAW too and ends exactly one ' ' (0x20) before this one
	   starts: the text holds "<previous> <this>" literally. Positions
	   prove multi-word values with it (doc/search-semantics.md). */
	CASIDX_TOKEN_FLAG_SPACE_BEFORE = 0x40,
};

struct casidx_token {
	/* normalised UTF-8 (NFKC, case- and accent-folded), not
	   NUL-terminated; 1..CASIDX_TOKEN_MAX_BYTES bytes. Points into the
	   tokenizer's buffers: valid only during the callback. */
	const char *term;
	size_t term_len;
	/* word position within the field (for phrases); parts share their
	   compound's position */
	uint32_t position;
	enum casidx_token_flags flags;
};

typedef void casidx_token_callback_t(const struct casidx_token *token,
				     void *context);

/* Never fails (out of memory or missing ICU data is fatal). */
struct casidx_tokenizer *casidx_tokenizer_create(void);
void casidx_tokenizer_destroy(struct casidx_tokenizer **tok);
/* Start a new field: resets position and pending state. */
void casidx_tokenizer_reset(struct casidx_tokenizer *tok);
/* Feed UTF-8 bytes of the current field; data may end in the middle of a
   character or word (chunk boundaries must never split or glue words).
   Invalid UTF-8 is treated as a separator. Tokens of complete words are
   emitted now; data itself is not referenced after the call. */
void casidx_tokenizer_feed(struct casidx_tokenizer *tok,
			   const unsigned char *data, size_t size,
			   casidx_token_callback_t *callback, void *context);
/* End of field: emit the pending word. */
void casidx_tokenizer_final(struct casidx_tokenizer *tok,
			    casidx_token_callback_t *callback, void *context);
/* Normalise one query string exactly as indexing does (same tokens);
   convenience = reset+feed+final. */
void casidx_tokenizer_tokenize(struct casidx_tokenizer *tok,
			       const char *str, size_t size,
			       casidx_token_callback_t *callback,
			       void *context);

#endif
