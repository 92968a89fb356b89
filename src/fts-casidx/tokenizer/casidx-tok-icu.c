/* ICU adapter for the casidx tokenizer: UAX #29 word boundaries (with
   ICU's dictionaries for Thai, Lao, Khmer, Burmese, Chinese, Japanese),
   NFKC_Casefold and accent folding. ICU errors on valid input are bugs
   or out of memory, so they panic or fail like Dovecot's allocators. */

#include "lib.h"
#include "buffer.h"
#include "str.h"
#include "casidx-tokenizer-private.h"

#include <unicode/ubrk.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/uscript.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>

struct casidx_tok_icu {
	UBreakIterator *bi;
	const UNormalizer2 *nfkc_cf, *nfd, *nfc;
	buffer_t *text;		/* UChar: the range being segmented */
	buffer_t *norm1, *norm2;	/* UChar scratch */
	buffer_t *utf8;		/* normalised word handed to the core */
	size_t utf8_len;
	/* adjacent words meeting with ASCII letters or digits once
	   normalised ("n" "²"), joined (casidx_tokenizer_emit_joined()) */
	string_t *join;
	unsigned int join_words;
	int32_t join_end;
};
/* Longest joined term before it is emitted and started again. */
#define CASIDX_TOK_JOIN_MAX 256

static const UChar empty_text[1] = { 0 };

enum segment_kind {
	SEGMENT_NONE,
	SEGMENT_WORD,
	SEGMENT_CJK,
};

static void icu_check(UErrorCode err, const char *func)
{
	if (U_SUCCESS(err))
		return;
	if (err == U_MEMORY_ALLOCATION_ERROR)
		i_fatal_status(FATAL_OUTOFMEM, "ICU %s: out of memory", func);
	i_panic("ICU %s failed: %s", func, u_errorName(err));
}

bool casidx_tok_icu_ascii_rules_match(void)
{
	UVersionInfo version;

	u_getUnicodeVersion(version);
	return version[0] == 15 && version[1] == 0;
}

struct casidx_tok_icu *casidx_tok_icu_create(void)
{
	struct casidx_tok_icu *icu;
	UErrorCode err = U_ZERO_ERROR;

	icu = i_new(struct casidx_tok_icu, 1);
	icu->bi = ubrk_open(UBRK_WORD, "", NULL, 0, &err);
	if (U_FAILURE(err))
		i_fatal("ICU ubrk_open(UBRK_WORD) failed: %s",
			u_errorName(err));
	icu->nfkc_cf = unorm2_getNFKCCasefoldInstance(&err);
	icu->nfd = unorm2_getNFDInstance(&err);
	icu->nfc = unorm2_getNFCInstance(&err);
	if (U_FAILURE(err))
		i_fatal("ICU unorm2_get*Instance() failed: %s",
			u_errorName(err));
	icu->text = buffer_create_dynamic(default_pool, 1024);
	icu->norm1 = buffer_create_dynamic(default_pool, 256);
	icu->norm2 = buffer_create_dynamic(default_pool, 256);
	icu->utf8 = buffer_create_dynamic(default_pool, 256);
	icu->join = str_new(default_pool, 64);
	icu->join_end = -1;
	return icu;
}

void casidx_tok_icu_destroy(struct casidx_tok_icu **_icu)
{
	struct casidx_tok_icu *icu = *_icu;

	if (icu == NULL)
		return;
	*_icu = NULL;
	ubrk_close(icu->bi);
	buffer_free(&icu->text);
	buffer_free(&icu->norm1);
	buffer_free(&icu->norm2);
	buffer_free(&icu->utf8);
	str_free(&icu->join);
	i_free(icu);
}

/* Scratch space of at least units; the used size only grows, so the
   buffer zero-fills only new space. */
static UChar *uchar_space(buffer_t *buf, int32_t units)
{
	return buffer_get_space_unsafe(buf, 0, (size_t)units * sizeof(UChar));
}

/* Normalise src into dest (UChar), growing dest as needed. */
static int32_t normalize(const UNormalizer2 *norm, const UChar *src,
			 int32_t len, buffer_t *dest)
{
	UErrorCode err = U_ZERO_ERROR;
	int32_t cap = len * 2 + 16, out;

	out = unorm2_normalize(norm, src, len, uchar_space(dest, cap), cap,
			       &err);
	if (err == U_BUFFER_OVERFLOW_ERROR) {
		err = U_ZERO_ERROR;
		cap = out;
		out = unorm2_normalize(norm, src, len,
				       uchar_space(dest, cap), cap, &err);
	}
	icu_check(err, "unorm2_normalize");
	return out;
}

/* Scripts whose nonspacing marks are accents or optional vowel points
   (Vietnamese tones, Greek tonos, Hebrew niqqud, Arabic harakat). Other
   scripts keep them: kana voicing marks and Indic or Thai vowel signs
   change the word. */
static bool script_folds_marks(UScriptCode script)
{
	switch (script) {
	case USCRIPT_COMMON:
	case USCRIPT_INHERITED:
	case USCRIPT_LATIN:
	case USCRIPT_GREEK:
	case USCRIPT_CYRILLIC:
	case USCRIPT_ARABIC:
	case USCRIPT_HEBREW:
		return TRUE;
	default:
		return FALSE;
	}
}

static bool is_apostrophe(UChar32 c)
{
	return c == 0x2019 || c == 0x2018 || c == 0x02bc || c == 0x2032;
}

/* In place: drop foldable nonspacing marks, unify apostrophes, dotless
   i as i. */
static int32_t strip_marks(UChar *s, int32_t len)
{
	UScriptCode base = USCRIPT_COMMON;
	UErrorCode err = U_ZERO_ERROR;
	int32_t i = 0, o = 0, start;
	UChar32 c;

	while (i < len) {
		start = i;
		U16_NEXT(s, i, len, c);
		if (u_charType(c) == U_NON_SPACING_MARK) {
			if (script_folds_marks(base))
				continue;
		} else if (is_apostrophe(c)) {
			s[o++] = '\'';
			continue;
		} else if (c == 0x0131) {
			/* dotless i: Dovecot's titlecase makes it "I", so
			   its own search finds "in" in "ın" */
			s[o++] = 'i';
			base = USCRIPT_LATIN;
			continue;
		} else {
			base = uscript_getScript(c, &err);
		}
		while (start < i)
			s[o++] = s[start++];
	}
	icu_check(err, "uscript_getScript");
	return o;
}

static bool needs_fold(const UChar *s, int32_t len)
{
	int32_t i;

	for (i = 0; i < len; i++) {
		if (s[i] >= 0xc0)
			return TRUE;
	}
	return FALSE;
}

static inline bool u_ascii_alnum(UChar c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
		(c >= 'A' && c <= 'Z');
}

static inline UChar u_ascii_lower(UChar c)
{
	return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
}

/* Next maximal run of ASCII letters and digits at or after *pos. */
static bool next_ascii_run(const UChar *s, int32_t len, int32_t *pos,
			   int32_t *start_r, int32_t *end_r)
{
	while (*pos < len && !u_ascii_alnum(s[*pos]))
		(*pos)++;
	if (*pos == len)
		return FALSE;
	*start_r = *pos;
	while (*pos < len && u_ascii_alnum(s[*pos]))
		(*pos)++;
	*end_r = *pos;
	return TRUE;
}

/* TRUE if a and b have the same runs of ASCII letters and digits (case
   aside): then every ASCII word found in the normalised b is in the
   text a as it is, else the word is FOLDED. */
static bool ascii_runs_equal(const UChar *a, int32_t alen,
			     const UChar *b, int32_t blen)
{
	int32_t ap = 0, bp = 0, as, ae, bs, be, i;
	bool amore, bmore;

	for (;;) {
		amore = next_ascii_run(a, alen, &ap, &as, &ae);
		bmore = next_ascii_run(b, blen, &bp, &bs, &be);
		if (!amore || !bmore)
			return amore == bmore;
		if (ae - as != be - bs)
			return FALSE;
		for (i = 0; i < ae - as; i++) {
			if (u_ascii_lower(a[as + i]) != u_ascii_lower(b[bs + i]))
				return FALSE;
		}
	}
}

static void emit_normalized_one(struct casidx_tok_icu *icu,
				struct casidx_tokenizer *tok,
				const UChar *seg, int32_t len, bool cjk)
{
	UErrorCode err = U_ZERO_ERROR;
	const UChar *word;
	int32_t wlen, cap, out;
	bool folded;

	wlen = normalize(icu->nfkc_cf, seg, len, icu->norm1);
	word = icu->norm1->data;
	if (!cjk && needs_fold(word, wlen)) {
		wlen = normalize(icu->nfd, word, wlen, icu->norm2);
		wlen = strip_marks(buffer_get_modifiable_data(icu->norm2,
							      NULL), wlen);
		wlen = normalize(icu->nfc, icu->norm2->data, wlen,
				 icu->norm1);
		word = icu->norm1->data;
	}
	folded = !cjk && !ascii_runs_equal(seg, len, word, wlen);
	cap = wlen * 3 + 1;
	u_strToUTF8(buffer_get_space_unsafe(icu->utf8, 0, cap), cap, &out,
		    word, wlen, &err);
	icu_check(err, "u_strToUTF8");
	icu->utf8_len = out;
	casidx_tokenizer_emit_word(tok, icu->utf8->data, out, cjk, folded);
}

static void join_flush(struct casidx_tok_icu *icu,
		       struct casidx_tokenizer *tok)
{
	if (icu->join_words >= 2) {
		casidx_tokenizer_emit_joined(tok, str_c(icu->join),
					     str_len(icu->join));
	}
	str_truncate(icu->join, 0);
	icu->join_words = 0;
	icu->join_end = -1;
}

/* The word just normalised (icu->utf8) at [start, end) of the text:
   joined to the previous one when they touch and meet with ASCII
   letters or digits. ICU splits "n²" into "n" and "²", which NFKC (and
   Dovecot's decomposition) make "n" "2": the text Dovecot's own search
   reads holds "N2", so the index must hold a term with "n2". */
static void join_word(struct casidx_tok_icu *icu,
		      struct casidx_tokenizer *tok, int32_t start,
		      int32_t end)
{
	const unsigned char *w = icu->utf8->data;
	size_t n = icu->utf8_len, jl = str_len(icu->join);

	if (n == 0) {
		join_flush(icu, tok);
		return;
	}
	if (icu->join_end != start || jl == 0 ||
	    !u_ascii_alnum(str_data(icu->join)[jl - 1]) ||
	    !u_ascii_alnum(w[0]) || jl + n > CASIDX_TOK_JOIN_MAX)
		join_flush(icu, tok);
	str_append_data(icu->join, w, n);
	icu->join_words++;
	icu->join_end = end;
}

/* A word longer than CASIDX_TOK_WORD_INPUT_MAX in overlapping chunks,
   as the ASCII fast path does. */
static void emit_normalized(struct casidx_tok_icu *icu,
			    struct casidx_tokenizer *tok,
			    const UChar *seg, int32_t len, bool cjk)
{
	int32_t start = 0, n;

	if (cjk || len <= CASIDX_TOK_WORD_INPUT_MAX) {
		emit_normalized_one(icu, tok, seg, len, cjk);
		return;
	}
	for (;;) {
		n = I_MIN(len - start, CASIDX_TOK_WORD_INPUT_MAX);
		if (start + n < len && U16_IS_TRAIL(seg[start + n]) &&
		    U16_IS_LEAD(seg[start + n - 1]))
			n--;
		emit_normalized_one(icu, tok, seg + start, n, FALSE);
		if (start + n >= len)
			break;
		start += CASIDX_TOK_WORD_INPUT_MAX / 2;
		if (U16_IS_TRAIL(seg[start]))
			start++;
	}
}

static bool script_is_cjk(UScriptCode script)
{
	return script == USCRIPT_HAN || script == USCRIPT_HIRAGANA ||
		script == USCRIPT_KATAKANA || script == USCRIPT_HANGUL;
}

/* A segment is a word if it has a letter, digit or emoji; it is CJK if
   its letters are all Han, kana or Hangul (Common ones like U+30FC are
   neutral). */
static enum segment_kind
classify(const UChar *text, int32_t start, int32_t end)
{
	UErrorCode err = U_ZERO_ERROR;
	bool word = FALSE, cjk = FALSE, other = FALSE;
	UScriptCode script;
	UChar32 c;

	while (start < end) {
		U16_NEXT(text, start, end, c);
		if (u_isUAlphabetic(c) ||
		    (U_GET_GC_MASK(c) & U_GC_N_MASK) != 0) {
			word = TRUE;
			script = uscript_getScript(c, &err);
			if (script_is_cjk(script))
				cjk = TRUE;
			else if (script != USCRIPT_COMMON &&
				 script != USCRIPT_INHERITED)
				other = TRUE;
		} else if (u_hasBinaryProperty(c,
					       UCHAR_EXTENDED_PICTOGRAPHIC)) {
			word = TRUE;
			other = TRUE;
		}
	}
	icu_check(err, "uscript_getScript");
	if (!word)
		return SEGMENT_NONE;
	return cjk && !other ? SEGMENT_CJK : SEGMENT_WORD;
}

void casidx_tok_icu_cjk_run(struct casidx_tok_icu *icu,
			    struct casidx_tokenizer *tok,
			    const unsigned char *data, size_t size)
{
	UErrorCode err = U_ZERO_ERROR;
	int32_t len;

	i_assert(size <= INT32_MAX);
	u_strFromUTF8(uchar_space(icu->text, (int32_t)size), (int32_t)size,
		      &len, (const char *)data, (int32_t)size, &err);
	icu_check(err, "u_strFromUTF8");
	emit_normalized(icu, tok, icu->text->data, len, TRUE);
}

void casidx_tok_icu_segment(struct casidx_tok_icu *icu,
			    struct casidx_tokenizer *tok,
			    const unsigned char *data, size_t size)
{
	UErrorCode err = U_ZERO_ERROR;
	const UChar *text;
	int32_t len, start, end, run_start = -1;
	enum segment_kind kind;
	bool ascii = TRUE;
	size_t i;

	i_assert(size <= INT32_MAX);
	for (i = 0; i < size && ascii; i++)
		ascii = data[i] < 0x80;
	/* UTF-16 never needs more units than UTF-8 has bytes */
	u_strFromUTF8(uchar_space(icu->text, (int32_t)size), (int32_t)size,
		      &len, (const char *)data, (int32_t)size, &err);
	icu_check(err, "u_strFromUTF8");
	text = icu->text->data;
	ubrk_setText(icu->bi, text, len, &err);
	icu_check(err, "ubrk_setText");

	start = ubrk_first(icu->bi);
	while ((end = ubrk_next(icu->bi)) != UBRK_DONE) {
		kind = classify(text, start, end);
		if (kind == SEGMENT_CJK) {
			if (run_start < 0)
				run_start = start;
		} else {
			if (run_start >= 0) {
				emit_normalized(icu, tok, text + run_start,
						start - run_start, TRUE);
				run_start = -1;
			}
			if (kind == SEGMENT_WORD && ascii &&
			    end - start <= CASIDX_TOK_WORD_INPUT_MAX) {
				/* ASCII: UTF-16 index = byte offset, and
				   the word is its bytes lower-cased (the
				   fast path's RAW words, where that path is
				   off: ICU 76) */
				casidx_tokenizer_set_word_raw(tok,
							      data + start);
				emit_normalized(icu, tok, text + start,
						end - start, FALSE);
				casidx_tokenizer_clear_word_raw(tok);
			} else if (kind == SEGMENT_WORD) {
				emit_normalized(icu, tok, text + start,
						end - start, FALSE);
				if (end - start <= CASIDX_TOK_WORD_INPUT_MAX)
					join_word(icu, tok, start, end);
				else
					join_flush(icu, tok);
			}
		}
		start = end;
	}
	if (run_start >= 0)
		emit_normalized(icu, tok, text + run_start, len - run_start,
				TRUE);
	join_flush(icu, tok);
	/* don't keep a pointer to our scratch text */
	ubrk_setText(icu->bi, empty_text, 0, &err);
	icu_check(err, "ubrk_setText");
}
