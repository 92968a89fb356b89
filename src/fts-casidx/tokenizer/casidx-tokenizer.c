/* casidx tokenizer core: buffering, pieces, compounds, ASCII fast path.
   See doc/tokenizer.md for the rules; the ICU side is casidx-tok-icu.c. */

#include "lib.h"
#include "buffer.h"
#include "casidx-tokenizer-private.h"

enum casidx_compound_kind {
	CASIDX_COMPOUND_EMAIL,
	CASIDX_COMPOUND_URL,
};

struct casidx_tokenizer {
	buffer_t *pending;	/* bytes after the last processed piece */
	buffer_t *term;		/* scratch for a lower-cased ASCII word */
	buffer_t *pair;		/* scratch for a CJK bigram */
	struct casidx_tok_icu *icu;
	uint32_t position;
	bool ascii_fast_path;

	/* Raw offsets (bytes fed since the last reset) for
	   CASIDX_TOKEN_FLAG_RAW and _SPACE_BEFORE: fed = bytes fed so far,
	   pending_abs = offset of pending->data[0], data_abs = offset of the
	   buffer process_data() works on, piece = the piece being
	   processed and piece_abs its offset. */
	uint64_t fed, pending_abs, data_abs, piece_abs;
	const unsigned char *piece;
	/* the last ASCII whitespace byte between pieces: offset, and
	   whether it was ' ' */
	uint64_t last_ws_abs;
	bool last_ws_space;
	/* the previous whole token: its raw end, if it was a RAW one */
	uint64_t prev_end_abs;
	bool prev_raw;
	/* set by ascii_segment() around casidx_tokenizer_emit_word():
	   the word's raw start */
	bool word_raw;
	uint64_t word_abs;

	casidx_token_callback_t *callback;
	void *context;
};

/* Byte classes for the hot loops. */
#define CC_SPACE 0x01	/* ASCII whitespace: separates pieces */
#define CC_ALNUM 0x02	/* [0-9A-Za-z] */
#define CC_PUNCT 0x04	/* other ASCII: trims words, splits parts */
#define CC_BASE64 0x08	/* [0-9A-Za-z+/=_-] */
#define CC_TRIGGER 0x10	/* may start or mark a compound: @ : w W */
#define CC_HIGH 0x20	/* a UTF-8 lead or continuation byte */
#define CC_URL 0x40	/* may appear in a URL: printable but not <>"{}|\^` */
#define CC_LOCAL 0x80	/* e-mail local part: atext and '.' */
static const uint8_t char_class[256] = {
	/* 00 */ 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04,
	/* 08 */ 0x04, 0x05, 0x05, 0x05, 0x05, 0x05, 0x04, 0x04,
	/* 10 */ 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04,
	/* 18 */ 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04,
	/* 20 */ 0x05, 0xc4, 0x04, 0xc4, 0xc4, 0xc4, 0xc4, 0xc4,
	/* 28 */ 0x44, 0x44, 0xc4, 0xcc, 0x44, 0xcc, 0xc4, 0xcc,
	/* 30 */ 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca,
	/* 38 */ 0xca, 0xca, 0x54, 0x44, 0x04, 0xcc, 0x04, 0xc4,
	/* 40 */ 0x54, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca,
	/* 48 */ 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca,
	/* 50 */ 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xda,
	/* 58 */ 0xca, 0xca, 0xca, 0x44, 0x04, 0x44, 0x84, 0xcc,
	/* 60 */ 0x84, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca,
	/* 68 */ 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca,
	/* 70 */ 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xca, 0xda,
	/* 78 */ 0xca, 0xca, 0xca, 0x84, 0x84, 0x84, 0xc4, 0x04,
	/* 80 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* 88 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* 90 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* 98 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* a0 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* a8 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* b0 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* b8 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* c0 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* c8 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* d0 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* d8 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* e0 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* e8 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* f0 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
	/* f8 */ 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
};

static inline bool ascii_is_space(unsigned char c)
{
	return (char_class[c] & CC_SPACE) != 0;
}

static inline bool ascii_is_alnum(unsigned char c)
{
	return (char_class[c] & CC_ALNUM) != 0;
}

/* An ASCII byte that is neither a letter nor a digit: parts are split
   and whole words trimmed at these. Non-ASCII bytes never count. */
static inline bool ascii_is_punct(unsigned char c)
{
	return (char_class[c] & CC_PUNCT) != 0;
}

static inline unsigned char ascii_lower(unsigned char c)
{
	return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
}

int casidx_tok_utf8_seq_len(const unsigned char *data, size_t size)
{
	unsigned char c = data[0], lo = 0x80, hi = 0xbf;
	size_t len, i;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2;
	else if (c >= 0xe0 && c <= 0xef) {
		len = 3;
		if (c == 0xe0)
			lo = 0xa0;	/* overlong */
		else if (c == 0xed)
			hi = 0x9f;	/* surrogates */
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4;
		if (c == 0xf0)
			lo = 0x90;	/* overlong */
		else if (c == 0xf4)
			hi = 0x8f;	/* > U+10FFFF */
	} else
		return -1;
	for (i = 1; i < len; i++) {
		if (i == size)
			return 0;
		if (data[i] < lo || data[i] > hi)
			return -1;
		lo = 0x80; hi = 0xbf;
	}
	return (int)len;
}

struct casidx_tokenizer *casidx_tokenizer_create(void)
{
	struct casidx_tokenizer *tok;

	tok = i_new(struct casidx_tokenizer, 1);
	tok->pending = buffer_create_dynamic(default_pool, 1024);
	tok->term = buffer_create_dynamic(default_pool, 128);
	tok->pair = buffer_create_dynamic(default_pool, 16);
	tok->icu = casidx_tok_icu_create();
	tok->ascii_fast_path = casidx_tok_icu_ascii_rules_match();
	return tok;
}

void casidx_tokenizer_destroy(struct casidx_tokenizer **_tok)
{
	struct casidx_tokenizer *tok = *_tok;

	if (tok == NULL)
		return;
	*_tok = NULL;
	casidx_tok_icu_destroy(&tok->icu);
	buffer_free(&tok->pending);
	buffer_free(&tok->term);
	buffer_free(&tok->pair);
	i_free(tok);
}

void casidx_tokenizer_set_ascii_fast_path(struct casidx_tokenizer *tok,
					  bool enable)
{
	tok->ascii_fast_path = enable && casidx_tok_icu_ascii_rules_match();
}

void casidx_tokenizer_reset(struct casidx_tokenizer *tok)
{
	buffer_set_used_size(tok->pending, 0);
	tok->position = 0;
	tok->fed = tok->pending_abs = tok->data_abs = tok->piece_abs = 0;
	tok->piece = NULL;
	tok->last_ws_abs = (uint64_t)-1;
	tok->last_ws_space = FALSE;
	tok->prev_raw = FALSE;
	tok->word_raw = FALSE;
}

/* Length of a window of term starting at term[0]: at most
   CASIDX_TOKEN_MAX_BYTES, cut at a UTF-8 character boundary. */
static size_t term_window_len(const char *term, size_t len)
{
	if (len <= CASIDX_TOKEN_MAX_BYTES)
		return len;
	len = CASIDX_TOKEN_MAX_BYTES;
	while (len > 0 && ((unsigned char)term[len] & 0xc0) == 0x80)
		len--;
	return len;
}

static inline bool utf8_is_cont(const char *p)
{
	return ((unsigned char)*p & 0xc0) == 0x80;
}

static void emit_one(struct casidx_tokenizer *tok, const char *term,
		     size_t len, uint32_t position,
		     enum casidx_token_flags flags)
{
	struct casidx_token token;

	i_zero(&token);
	token.term = term;
	token.term_len = len;
	token.position = position;
	token.flags = flags;
	if (len > 0)
		tok->callback(&token, tok->context);
}

/* A term; a longer one than CASIDX_TOKEN_MAX_BYTES as overlapping
   windows (casidx-tokenizer.h), so no part of it is lost. */
static void emit(struct casidx_tokenizer *tok, const char *term, size_t len,
		 uint32_t position, enum casidx_token_flags flags)
{
	size_t start = 0, wlen, last;

	if (len <= CASIDX_TOKEN_MAX_BYTES) {
		emit_one(tok, term, len, position, flags);
		return;
	}
	flags |= CASIDX_TOKEN_FLAG_WINDOW;
	/* the last window ends at the end */
	last = len - CASIDX_TOKEN_MAX_BYTES;
	while (last < len && utf8_is_cont(term + last))
		last++;
	while (start < last) {
		wlen = term_window_len(term + start, len - start);
		emit_one(tok, term + start, wlen, position, flags);
		start += CASIDX_TOKEN_WINDOW_STEP;
		while (start < len && utf8_is_cont(term + start))
			start++;
	}
	emit_one(tok, term + last, len - last, position, flags);
}

/* Alphabet of base64 (with the URL-safe variant and padding) and hex. */
static inline bool is_base64_char(unsigned char c)
{
	return (char_class[c] & CC_BASE64) != 0;
}

static inline bool ascii_is_alpha(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* A word of an identifier: letters, optionally followed by digits
   ("Exchange", "Office365", "sha256"), shorter than the base64 rule. */
static bool is_ident_word(const unsigned char *data, size_t len)
{
	size_t i = 0;

	if (len == 0 || len >= CASIDX_TOK_BASE64_MIN)
		return FALSE;
	while (i < len && ascii_is_alpha(data[i]))
		i++;
	if (i == 0)
		return FALSE;
	while (i < len && data[i] >= '0' && data[i] <= '9')
		i++;
	return i == len;
}

/* Hyphen- or underscore-separated words such as header names
   ("X-MS-Exchange-CrossTenant-originalarrivaltime") or snake_case
   names: text, not base64, however long. Encoded data has digits and
   mixed case inside its '-'/'_'-separated pieces, so it rarely passes
   (a random base64url run of 40 characters does with p < 3e-4). */
static bool is_identifier_run(const unsigned char *data, size_t len)
{
	size_t i, start = 0;
	bool separated = FALSE;

	for (i = 0; i <= len; i++) {
		if (i < len && data[i] != '-' && data[i] != '_')
			continue;
		if (!is_ident_word(data + start, i - start))
			return FALSE;
		separated = separated || i < len;
		start = i + 1;
	}
	return separated;
}

static inline unsigned int char_kind(unsigned char c)
{
	if (c >= 'a' && c <= 'z')
		return 1;
	if (c >= 'A' && c <= 'Z')
		return 2;
	if (c >= '0' && c <= '9')
		return 3;
	return 0;
}

static bool is_hex_run(const unsigned char *data, size_t len)
{
	bool lower = FALSE, upper = FALSE;
	size_t i;

	for (i = 0; i < len; i++) {
		if (data[i] >= 'a' && data[i] <= 'f')
			lower = TRUE;
		else if (data[i] >= 'A' && data[i] <= 'F')
			upper = TRUE;
		else if (data[i] < '0' || data[i] > '9')
			return FALSE;
	}
	return !(lower && upper);
}

/* A run of the base64 alphabet that looks like encoded data rather than
   text (casidx-tokenizer-private.h). Only a question of precision and
   size: such a run is emitted whole (CASIDX_TOKEN_FLAG_ENCODED), and
   the index keeps a bounded amount of it, marking the rest. */
static bool is_base64_run(const unsigned char *data, size_t len)
{
	unsigned int kind, prev = 0, pairs = 0, changes = 0;
	size_t i;

	if (len < CASIDX_TOK_BASE64_MIN)
		return FALSE;
	if (is_identifier_run(data, len) || is_hex_run(data, len))
		return FALSE;
	for (i = 0; i < len; i++) {
		kind = char_kind(data[i]);
		if (kind == 0)
			continue;
		if (prev != 0) {
			pairs++;
			if (kind != prev)
				changes++;
		}
		prev = kind;
	}
	return pairs > 0 &&
		changes * 100 >= pairs * CASIDX_TOK_BASE64_CHANGES_PCT;
}

/* Flags of a whole token at raw bytes [start, end) (raw = its term is
   exactly those bytes lower-cased): RAW, and SPACE_BEFORE when the
   previous whole token was RAW and exactly one ' ' lies between them.
   Every whole token passes here (raw=FALSE for the ICU and CJK paths),
   so "previous" is always the token at position - 1. */
static enum casidx_token_flags
note_whole(struct casidx_tokenizer *tok, bool raw, uint64_t start,
	   uint64_t end)
{
	enum casidx_token_flags flags = 0;

	if (raw) {
		flags |= CASIDX_TOKEN_FLAG_RAW;
		if (tok->prev_raw && tok->prev_end_abs + 1 == start &&
		    tok->last_ws_abs == tok->prev_end_abs &&
		    tok->last_ws_space)
			flags |= CASIDX_TOKEN_FLAG_SPACE_BEFORE;
	}
	tok->prev_raw = raw;
	tok->prev_end_abs = end;
	return flags;
}

static inline uint64_t piece_offset(const struct casidx_tokenizer *tok,
				    const void *p)
{
	return tok->piece_abs +
		(uint64_t)((const unsigned char *)p - tok->piece);
}

/* Emit the alphanumeric atoms of a word or compound as parts. */
static void emit_parts(struct casidx_tokenizer *tok, const char *word,
		       size_t len, enum casidx_token_flags flags)
{
	size_t i = 0, start, count = 0;

	while (i < len && count < CASIDX_TOK_MAX_PARTS) {
		while (i < len && ascii_is_punct((unsigned char)word[i]))
			i++;
		start = i;
		while (i < len && !ascii_is_punct((unsigned char)word[i]))
			i++;
		if (i > start && !is_base64_run((const void *)(word + start),
						i - start)) {
			emit(tok, word + start, i - start, tok->position,
			     CASIDX_TOKEN_FLAG_PART | flags);
			count++;
		}
	}
}

static bool has_inner_punct(const char *word, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++) {
		if (ascii_is_punct((unsigned char)word[i]))
			return TRUE;
	}
	return FALSE;
}

/* Length of the character (code point plus following combining marks
   that NFC left uncomposed) at word[0]. */
static size_t cjk_char_len(const char *word, size_t len)
{
	const unsigned char *p = (const void *)word;
	size_t i = 1;

	while (i < len && (p[i] & 0xc0) == 0x80)
		i++;
	/* U+3099/U+309A (kana voicing marks) and U+0300..U+036F */
	for (;;) {
		if (i + 3 <= len && p[i] == 0xe3 && p[i + 1] == 0x82 &&
		    (p[i + 2] == 0x99 || p[i + 2] == 0x9a))
			i += 3;
		else if (i + 2 <= len &&
			 (p[i] == 0xcc || (p[i] == 0xcd && p[i + 1] < 0xb0)))
			i += 2;
		else
			break;
	}
	return i;
}

static void emit_cjk_run(struct casidx_tokenizer *tok, const char *run,
			 size_t len)
{
	size_t first, second;

	(void)note_whole(tok, FALSE, 0, 0);
	first = cjk_char_len(run, len);
	if (first == len) {
		emit(tok, run, len, tok->position++, CASIDX_TOKEN_FLAG_CJK);
		return;
	}
	while (first < len) {
		second = cjk_char_len(run + first, len - first);
		emit(tok, run, first + second, tok->position,
		     CASIDX_TOKEN_FLAG_CJK);
		run += first;
		len -= first;
		first = second;
		if (first < len)
			tok->position++;
	}
	/* The last character also as a unigram at the last bigram's
	   position, so a one-character query (a prefix lookup over CJK
	   terms) finds every character of a run. */
	emit(tok, run, len, tok->position++,
	     CASIDX_TOKEN_FLAG_CJK | CASIDX_TOKEN_FLAG_PART);
}

void casidx_tokenizer_set_word_raw(struct casidx_tokenizer *tok,
				   const void *start)
{
	tok->word_raw = TRUE;
	tok->word_abs = piece_offset(tok, start);
}

void casidx_tokenizer_clear_word_raw(struct casidx_tokenizer *tok)
{
	tok->word_raw = FALSE;
}

void casidx_tokenizer_emit_word(struct casidx_tokenizer *tok,
				const char *word, size_t len, bool cjk,
				bool folded)
{
	enum casidx_token_flags flags =
		folded ? CASIDX_TOKEN_FLAG_FOLDED : 0;
	uint64_t start = tok->word_abs;
	bool raw = tok->word_raw && !folded;

	if (cjk) {
		emit_cjk_run(tok, word, len);
		return;
	}
	while (len > 0 && ascii_is_punct((unsigned char)word[0])) {
		word++;
		len--;
		start++;
	}
	while (len > 0 && ascii_is_punct((unsigned char)word[len - 1]))
		len--;
	if (len == 0)
		return;
	emit(tok, word, len, tok->position,
	     flags | note_whole(tok, raw, start, start + len));
	if (has_inner_punct(word, len))
		emit_parts(tok, word, len, flags);
	tok->position++;
}

void casidx_tokenizer_emit_joined(struct casidx_tokenizer *tok,
				  const char *term, size_t len)
{
	if (len == 0)
		return;
	emit(tok, term, len, tok->position == 0 ? 0 : tok->position - 1,
	     CASIDX_TOKEN_FLAG_PART | CASIDX_TOKEN_FLAG_FOLDED);
}

/* Word_Break classes of ASCII as ICU 72 applies them (there '@' is
   ALetter and ':' is not MidLetter); tests compare with ICU. */
enum ascii_wb {
	WO,	/* Other */
	WL,	/* ALetter */
	WN,	/* Numeric */
	WQ,	/* MidNumLet or Single_Quote: . ' */
	WM,	/* MidNum: , ; */
	WE,	/* ExtendNumLet: _ */
};
static const uint8_t ascii_wb[128] = {
	/* 00 */ WO, WO, WO, WO, WO, WO, WO, WO,
	/* 08 */ WO, WO, WO, WO, WO, WO, WO, WO,
	/* 10 */ WO, WO, WO, WO, WO, WO, WO, WO,
	/* 18 */ WO, WO, WO, WO, WO, WO, WO, WO,
	/* 20 */ WO, WO, WO, WO, WO, WO, WO, WQ,
	/* 28 */ WO, WO, WO, WO, WM, WO, WQ, WO,
	/* 30 */ WN, WN, WN, WN, WN, WN, WN, WN,
	/* 38 */ WN, WN, WO, WM, WO, WO, WO, WO,
	/* 40 */ WL, WL, WL, WL, WL, WL, WL, WL,
	/* 48 */ WL, WL, WL, WL, WL, WL, WL, WL,
	/* 50 */ WL, WL, WL, WL, WL, WL, WL, WL,
	/* 58 */ WL, WL, WL, WO, WO, WO, WO, WE,
	/* 60 */ WO, WL, WL, WL, WL, WL, WL, WL,
	/* 68 */ WL, WL, WL, WL, WL, WL, WL, WL,
	/* 70 */ WL, WL, WL, WL, WL, WL, WL, WL,
	/* 78 */ WL, WL, WL, WO, WO, WO, WO, WO,
};

static inline bool ascii_wb_is_wordish(uint8_t c)
{
	return c == WL || c == WN || c == WE;
}

/* End of the UAX #29 word that starts at data[0] (rules WB5-WB13b). */
static size_t ascii_word_end(const unsigned char *data, size_t len)
{
	uint8_t prev = ascii_wb[data[0]], cur, next;
	size_t i = 1;

	while (i < len) {
		cur = ascii_wb[data[i]];
		if (ascii_wb_is_wordish(cur)) {
			prev = cur;
			i++;
			continue;
		}
		if (i + 1 >= len)
			break;
		next = ascii_wb[data[i + 1]];
		if (prev == WL && cur == WQ && next == WL) {
			/* WB6, WB7 */
		} else if (prev == WN && next == WN &&
			   (cur == WM || cur == WQ)) {
			/* WB11, WB12 */
		} else {
			break;
		}
		prev = next;
		i += 2;
	}
	return i;
}

static void ascii_segment(struct casidx_tokenizer *tok,
			  const unsigned char *data, size_t len)
{
	size_t i = 0, end, j, wlen;
	bool alnum;
	char *term;

	while (i < len) {
		if (!ascii_wb_is_wordish(ascii_wb[data[i]])) {
			i++;
			continue;
		}
		end = i + ascii_word_end(data + i, len - i);
		/* the ICU path's input cap; a longer word in overlapping
		   chunks (casidx-tokenizer-private.h) */
		for (;;) {
			wlen = I_MIN(end - i, CASIDX_TOK_WORD_INPUT_MAX);
			alnum = FALSE;
			term = buffer_get_space_unsafe(tok->term, 0, wlen);
			for (j = 0; j < wlen; j++) {
				term[j] = ascii_lower(data[i + j]);
				alnum = alnum || ascii_is_alnum(data[i + j]);
			}
			if (alnum) {
				tok->word_raw = TRUE;
				tok->word_abs = piece_offset(tok, data + i);
				casidx_tokenizer_emit_word(tok, term, wlen,
							   FALSE, FALSE);
				tok->word_raw = FALSE;
			}
			if (i + wlen >= end)
				break;
			i += CASIDX_TOK_WORD_INPUT_MAX / 2;
		}
		i = end;
	}
}

/* Han, kana and Hangul letters (and the marks and selectors that extend
   them) form CJK runs that are bigrammed. They are cut out before ICU
   sees the text: its dictionary segmentation of them would be thrown
   away and costs half the time on CJK text. U+309B/C, U+30A0 and U+30FB
   are punctuation-like and stay out. */
static bool is_cjk_char(uint32_t c)
{
	if (c < 0x1100)
		return FALSE;
	if (c < 0x3000)
		return c <= 0x11ff;
	if (c < 0x3100) {
		return (c >= 0x3005 && c <= 0x3007) ||
			(c >= 0x3041 && c <= 0x309a) || c == 0x309d ||
			c == 0x309e || (c >= 0x30a1 && c <= 0x30fa) ||
			(c >= 0x30fc && c <= 0x30ff);
	}
	return (c >= 0x3130 && c <= 0x318f) || (c >= 0x31f0 && c <= 0x31ff) ||
		(c >= 0x3400 && c <= 0x4dbf) || (c >= 0x4e00 && c <= 0x9fff) ||
		(c >= 0xa960 && c <= 0xa97f) || (c >= 0xac00 && c <= 0xd7ff) ||
		(c >= 0xf900 && c <= 0xfaff) || (c >= 0xff66 && c <= 0xff9f) ||
		(c >= 0x20000 && c <= 0x3134f);
}

/* Variation selectors: part of the preceding CJK character. */
static bool is_cjk_extend(uint32_t c)
{
	return (c >= 0xfe00 && c <= 0xfe0f) || (c >= 0xe0100 && c <= 0xe01ef);
}

/* Decode the valid UTF-8 character at data[0]. */
static uint32_t utf8_decode(const unsigned char *data, size_t *len_r)
{
	uint32_t c = data[0];

	if (c < 0x80) {
		*len_r = 1;
		return c;
	}
	if (c < 0xe0) {
		*len_r = 2;
		return ((c & 0x1f) << 6) | (data[1] & 0x3f);
	}
	if (c < 0xf0) {
		*len_r = 3;
		return ((c & 0x0f) << 12) | ((data[1] & 0x3f) << 6) |
			(data[2] & 0x3f);
	}
	*len_r = 4;
	return ((c & 0x07) << 18) | ((data[1] & 0x3f) << 12) |
		((data[2] & 0x3f) << 6) | (data[3] & 0x3f);
}

/* Non-ASCII text: CJK runs directly, the rest through ICU. */
static void segment_unicode(struct casidx_tokenizer *tok,
			    const unsigned char *data, size_t len)
{
	size_t i = 0, start = 0, run_start = 0, n;
	bool in_run = FALSE, cjk;
	uint32_t c;

	while (i < len) {
		c = utf8_decode(data + i, &n);
		cjk = is_cjk_char(c) || (in_run && is_cjk_extend(c));
		if (cjk && !in_run) {
			if (i > start) {
				casidx_tok_icu_segment(tok->icu, tok,
						       data + start,
						       i - start);
			}
			run_start = i;
		} else if (!cjk && in_run) {
			casidx_tok_icu_cjk_run(tok->icu, tok,
					       data + run_start,
					       i - run_start);
			start = i;
		}
		in_run = cjk;
		i += n;
	}
	if (in_run) {
		casidx_tok_icu_cjk_run(tok->icu, tok, data + run_start,
				       len - run_start);
	} else if (len > start) {
		casidx_tok_icu_segment(tok->icu, tok, data + start,
				       len - start);
	}
}

static void segment_range(struct casidx_tokenizer *tok,
			  const unsigned char *data, size_t len, bool ascii)
{
	size_t i;

	if (len == 0)
		return;
	for (i = 0; !ascii && i < len; i++) {
		if (data[i] >= 0x80)
			break;
	}
	if (ascii || i == len) {
		if (tok->ascii_fast_path)
			ascii_segment(tok, data, len);
		else
			casidx_tok_icu_segment(tok->icu, tok, data, len);
		return;
	}
	segment_unicode(tok, data, len);
}

/* An encoded-looking run: lower-cased, as one term (in windows). */
static void emit_encoded(struct casidx_tokenizer *tok,
			 const unsigned char *data, size_t len)
{
	char *term = buffer_get_space_unsafe(tok->term, 0, len);
	size_t i;

	for (i = 0; i < len; i++)
		term[i] = ascii_lower(data[i]);
	emit(tok, term, len, tok->position++, CASIDX_TOKEN_FLAG_ENCODED |
	     note_whole(tok, TRUE, piece_offset(tok, data),
			piece_offset(tok, data + len)));
}

/* Text between compounds: encoded runs apart, segment the rest.
   ascii=TRUE says the range has no byte >= 0x80 (FALSE: unknown). */
static void process_range(struct casidx_tokenizer *tok,
			  const unsigned char *data, size_t len, bool ascii)
{
	size_t i = 0, start = 0, run;

	while (i < len) {
		if (!is_base64_char(data[i])) {
			i++;
			continue;
		}
		run = i;
		while (i < len && is_base64_char(data[i]))
			i++;
		if (i - run >= CASIDX_TOK_BASE64_MIN &&
		    is_base64_run(data + run, i - run)) {
			segment_range(tok, data + start, run - start, ascii);
			emit_encoded(tok, data + run, i - run);
			start = i;
		}
	}
	segment_range(tok, data + start, len - start, ascii);
}

static void emit_compound(struct casidx_tokenizer *tok,
			  const unsigned char *data, size_t len,
			  size_t sub_start, size_t sub_len, bool email)
{
	char *term;
	size_t i;

	term = buffer_get_space_unsafe(tok->term, 0, len);
	for (i = 0; i < len; i++)
		term[i] = ascii_lower(data[i]);
	emit(tok, term, len, tok->position,
	     note_whole(tok, TRUE, piece_offset(tok, data),
			piece_offset(tok, data + len)));
	if (email && has_inner_punct(term, sub_start - 1)) {
		/* the local part; the domain follows */
		emit(tok, term, sub_start - 1, tok->position,
		     CASIDX_TOKEN_FLAG_PART);
	}
	if (sub_len > 0 && sub_len < len &&
	    has_inner_punct(term + sub_start, sub_len)) {
		emit(tok, term + sub_start, sub_len, tok->position,
		     CASIDX_TOKEN_FLAG_PART);
	}
	emit_parts(tok, term, len, 0);
	tok->position++;
}

static inline bool is_email_local_char(unsigned char c)
{
	return (char_class[c] & CC_LOCAL) != 0;
}

static inline bool is_host_char(unsigned char c)
{
	return ascii_is_alnum(c) || c == '.' || c == '-';
}

static inline bool is_url_char(unsigned char c)
{
	return (char_class[c] & CC_URL) != 0;
}

static bool range_has_alnum(const unsigned char *data, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++) {
		if (ascii_is_alnum(data[i]))
			return TRUE;
	}
	return FALSE;
}

/* Try an e-mail address around the '@' at data[at]; the address may
   not start before data[min]. */
static bool find_email(const unsigned char *data, size_t len, size_t min,
		       size_t at, size_t *start_r, size_t *end_r)
{
	size_t s = at, e = at + 1;

	while (s > min && is_email_local_char(data[s - 1]))
		s--;
	while (e < len && is_host_char(data[e]))
		e++;
	/* glued to non-ASCII letters: leave it to the word segmenter */
	if ((s > min && data[s - 1] >= 0x80) || (e < len && data[e] >= 0x80))
		return FALSE;
	while (s < at && !ascii_is_alnum(data[s]))
		s++;
	while (e > at + 1 && !ascii_is_alnum(data[e - 1]))
		e--;
	if (s == at || !range_has_alnum(data + at + 1, e - at - 1))
		return FALSE;
	*start_r = s;
	*end_r = e;
	return TRUE;
}

/* Trim trailing punctuation that usually closes the sentence, not the
   URL; a ')' stays if the URL opened one. */
static size_t url_trim(const unsigned char *data, size_t start, size_t end)
{
	size_t i, opens = 0;

	for (i = start; i < end; i++) {
		if (data[i] == '(')
			opens++;
	}
	while (end > start) {
		unsigned char c = data[end - 1];

		if (c == ')' && opens > 0)
			break;
		if (strchr(".,;:!?')]*", c) == NULL)
			break;
		end--;
	}
	return end;
}

/* Try a URL at the trigger data[i] (':' of "://" or 'w' of "www."); it
   may not start before data[min]. Returns 1 and the URL and host ranges,
   0 if there is none here, -1 if no URL can be found before *end_r
   either (the URL characters run into non-ASCII text), so the caller
   skips those triggers instead of rescanning the run for each. */
static int
find_url(const unsigned char *data, size_t len, size_t min, size_t i,
	 size_t *start_r, size_t *end_r, size_t *host_start_r,
	 size_t *host_len_r)
{
	size_t s = i, e, host, host_end;

	if (i + 3 < len && data[i] == ':' && data[i + 1] == '/' &&
	    data[i + 2] == '/') {
		while (s > min && (ascii_is_alnum(data[s - 1]) ||
				   data[s - 1] == '+' || data[s - 1] == '-' ||
				   data[s - 1] == '.'))
			s--;
		while (s < i && !ascii_is_alnum(data[s]))
			s++;
		if (i - s < 2 || (s > min && data[s - 1] >= 0x80))
			return 0;
		host = i + 3;
	} else if (i + 4 < len &&
		   (i == min || !is_email_local_char(data[i - 1])) &&
		   (i == 0 || data[i - 1] < 0x80) &&
		   ascii_lower(data[i]) == 'w' &&
		   ascii_lower(data[i + 1]) == 'w' &&
		   ascii_lower(data[i + 2]) == 'w' && data[i + 3] == '.' &&
		   ascii_is_alnum(data[i + 4])) {
		host = i;
	} else {
		return 0;
	}
	/* the host first: it is short, the rest of the URL may not be */
	host_end = host;
	while (host_end < len && is_host_char(data[host_end]))
		host_end++;
	if (!range_has_alnum(data + host, host_end - host))
		return 0;
	e = host_end;
	while (e < len && is_url_char(data[e]))
		e++;
	if (e < len && data[e] >= 0x80) {
		*end_r = e;
		return -1;
	}
	e = url_trim(data, s, e);
	host_end = I_MIN(host_end, e);
	if (!range_has_alnum(data + host, host_end - host))
		return 0;
	*start_r = s;
	*end_r = e;
	*host_start_r = host;
	*host_len_r = host_end - host;
	return 1;
}

/* A piece: valid UTF-8 without ASCII whitespace. Addresses and URLs in
   it are compounds; the text between them is segmented into words. */
static void process_piece(struct casidx_tokenizer *tok,
			  const unsigned char *data, size_t len, bool ascii)
{
	size_t i, done = 0, start, end, sub_start, sub_len, no_url = 0;
	bool email;
	int ret;

	for (i = 0; i < len; i++) {
		if ((char_class[data[i]] & CC_TRIGGER) == 0)
			continue;
		/* cheap rejects: "w" not followed by "ww.", ":" not by "//" */
		if (data[i] != '@' && (i + 3 >= len ||
				       (data[i + 1] != '/' &&
					data[i + 3] != '.')))
			continue;
		if (data[i] == '@') {
			if (!find_email(data, len, done, i, &start, &end))
				continue;
			email = TRUE;
			sub_start = i + 1;
			sub_len = end - sub_start;
		} else {
			if (i < no_url)
				continue;
			ret = find_url(data, len, done, i, &start, &end,
				       &sub_start, &sub_len);
			if (ret < 0)
				no_url = end;
			if (ret <= 0)
				continue;
			email = FALSE;
		}
		process_range(tok, data + done, start - done, ascii);
		emit_compound(tok, data + start, end - start,
			      sub_start - start, sub_len, email);
		done = end;
		i = end - 1;
	}
	process_range(tok, data + done, len - done, ascii);
}

/* Where to cut a piece that reached CASIDX_TOK_PIECE_MAX bytes: after the
   last ASCII punctuation in the second half, else at a character start.
   Depends only on the piece's bytes, so chunking cannot change it. */
static size_t piece_force_cut(const unsigned char *data, size_t avail)
{
	size_t i = CASIDX_TOK_PIECE_MAX;

	for (; i > CASIDX_TOK_PIECE_MAX / 2; i--) {
		if (ascii_is_punct(data[i - 1]))
			return i;
	}
	i = CASIDX_TOK_PIECE_MAX;
	while (i < avail && (data[i] & 0xc0) == 0x80)
		i--;
	return i;
}

/* Process the complete pieces in data; returns how many bytes were
   consumed. Unless final, the rest (an unfinished piece) is left. */
static size_t process_data(struct casidx_tokenizer *tok,
			   const unsigned char *data, size_t len, bool final)
{
	size_t pos = 0, end, limit;
	bool ascii;
	int n;

	while (pos < len) {
		if (data[pos] < 0x80) {
			if (ascii_is_space(data[pos])) {
				tok->last_ws_abs = tok->data_abs + pos;
				tok->last_ws_space = data[pos] == ' ';
				pos++;
				continue;
			}
		} else {
			n = casidx_tok_utf8_seq_len(data + pos, len - pos);
			if (n < 0 || (n == 0 && final)) {
				pos++;
				continue;
			}
			if (n == 0)
				break;
		}
		end = pos;
		limit = I_MIN(len, pos + CASIDX_TOK_PIECE_MAX);
		ascii = TRUE;
		n = 1;
		while (end < limit) {
			if ((char_class[data[end]] &
			     (CC_SPACE | CC_HIGH)) == 0) {
				end++;
				continue;
			}
			if (data[end] < 0x80)
				break;
			n = casidx_tok_utf8_seq_len(data + end, len - end);
			if (n <= 0)
				break;
			ascii = FALSE;
			end += n;
		}
		if (end - pos >= CASIDX_TOK_PIECE_MAX)
			end = pos + piece_force_cut(data + pos, end - pos);
		else if (!final && (end == len || n == 0))
			break;
		tok->piece = data + pos;
		tok->piece_abs = tok->data_abs + pos;
		process_piece(tok, data + pos, end - pos, ascii);
		pos = end;
	}
	return pos;
}

static void process_pending(struct casidx_tokenizer *tok, bool final)
{
	size_t consumed;

	tok->data_abs = tok->pending_abs;
	consumed = process_data(tok, tok->pending->data, tok->pending->used,
				final);
	buffer_delete(tok->pending, 0, consumed);
	tok->pending_abs += consumed;
}

void casidx_tokenizer_feed(struct casidx_tokenizer *tok,
			   const unsigned char *data, size_t size,
			   casidx_token_callback_t *callback, void *context)
{
	size_t i, consumed;

	tok->callback = callback;
	tok->context = context;
	if (tok->pending->used > 0) {
		/* complete the pending piece with data up to and including
		   the first whitespace, then work on data in place */
		for (i = 0; i < size && !ascii_is_space(data[i]); i++) ;
		if (i < size)
			i++;
		buffer_append(tok->pending, data, i);
		tok->fed += i;
		process_pending(tok, FALSE);
		data += i;
		size -= i;
		if (tok->pending->used > 0) {
			buffer_append(tok->pending, data, size);
			tok->fed += size;
			process_pending(tok, FALSE);
			return;
		}
	}
	tok->data_abs = tok->fed;
	consumed = process_data(tok, data, size, FALSE);
	tok->fed += size;
	buffer_append(tok->pending, data + consumed, size - consumed);
	tok->pending_abs = tok->data_abs + consumed;
}

void casidx_tokenizer_final(struct casidx_tokenizer *tok,
			    casidx_token_callback_t *callback, void *context)
{
	tok->callback = callback;
	tok->context = context;
	process_pending(tok, TRUE);
	i_assert(tok->pending->used == 0);
}

void casidx_tokenizer_tokenize(struct casidx_tokenizer *tok,
			       const char *str, size_t size,
			       casidx_token_callback_t *callback,
			       void *context)
{
	casidx_tokenizer_reset(tok);
	casidx_tokenizer_feed(tok, (const unsigned char *)str, size,
			      callback, context);
	casidx_tokenizer_final(tok, callback, context);
}
