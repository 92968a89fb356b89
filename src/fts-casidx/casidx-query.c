/* casidx query evaluation; semantics in casidx-query.h and
   doc/search-semantics.md. */

#include "lib.h"
#include "array.h"
#include "hash.h"
#include "casidx-tokenizer.h"
#include "casidx-dtgram.h"
#include "casidx-bm25.h"
#include "casidx-query.h"

#include <ctype.h>

/* Relative weight of a hit per field (BM25F-style). The raw address
   namespaces have no lengths and are not scored: the address fields'
   normalised terms score the same words. */
static const double field_weights[CASIDX_FIELD_COUNT] = {
	[CASIDX_FIELD_BODY] = 1.0,
	[CASIDX_FIELD_FROM] = 2.0,
	[CASIDX_FIELD_TO] = 1.5,
	[CASIDX_FIELD_CC] = 1.2,
	[CASIDX_FIELD_BCC] = 1.2,
	[CASIDX_FIELD_SUBJECT] = 3.0,
	[CASIDX_FIELD_HEADER] = 0.5,
};
/* A whole-term hit ranks above a prefix hit above a substring hit. */
#define MATCH_FACTOR_EXACT 1.0
#define MATCH_FACTOR_PREFIX 0.6
#define MATCH_FACTOR_SUBSTRING 0.3
/* FUZZY: a term within one edit of the token */
#define MATCH_FACTOR_TYPO 0.2

struct casidx_query_scores {
	pool_t pool;
	HASH_TABLE(void *, double *) map;
};

/* A piece of the search value looked up as a substring of terms. */
struct query_token {
	const char *term;
	size_t len;
	/* pure ASCII: it may lie inside a run that was not indexed */
	bool ascii;
};

struct tokens_ctx {
	pool_t pool;
	ARRAY(struct query_token) tokens;
	/* the value came out as a single token (value_is_definite()) */
	unsigned int token_count;
};

/* A posting seen during a scan, scored once the scan has seen every
   segment: a term's document frequency is the sum over all segments,
   so it is only known at the end. At most SCAN_HITS_MAX are kept: a
   one-letter value matches most postings of the index (tens of millions
   on 10,000 messages, which ran imap out of memory), so past that the
   hits are scored with the frequencies seen so far and dropped. */
#define SCAN_HITS_MAX (256 * 1024)
struct scan_hit {
	uint32_t uid, tf, doc_len;
	unsigned int term_idx;
	double factor;
};

struct scan_ctx {
	roaring_bitmap_t *docs;
	/* docs found in terms without CASIDX_TERM_FOLDED_PREFIX */
	roaring_bitmap_t *plain;
	const roaring_bitmap_t *universe;
	/* if not NULL: only docs in it matter (the caller ANDs the result
	   with a subset of it); terms without any are passed over */
	const roaring_bitmap_t *restrict_to;
	struct casidx_query_scores *scores; /* NULL = don't score */
	const struct query_token *token;
	enum casidx_match match;
	uint64_t total_docs;
	double avg_len, weight;
	enum casidx_field field;

	/* scoring state of the current field's scan */
	pool_t pool;
	HASH_TABLE(const char *, void *) term_idx; /* term -> index + 1 */
	ARRAY(uint64_t) term_df;
	ARRAY(struct scan_hit) hits;
};

static roaring_bitmap_t *bitmap_create(void)
{
	roaring_bitmap_t *bm = roaring_bitmap_create();

	if (bm == NULL)
		i_fatal_status(FATAL_OUTOFMEM,
			       "roaring_bitmap_create() failed");
	return bm;
}

static void add_lookup(struct tokens_ctx *ctx, const char *term, size_t len,
		       bool from_non_ascii)
{
	struct query_token *qt;
	size_t i;

	/* only the first CASIDX_QUERY_MAX_TOKENS are looked up */
	if (len == 0 || array_count(&ctx->tokens) >= CASIDX_QUERY_MAX_TOKENS)
		return;
	array_foreach_modifiable(&ctx->tokens, qt) {
		if (qt->len == len && memcmp(qt->term, term, len) == 0)
			return;
	}
	qt = array_append_space(&ctx->tokens);
	qt->term = p_strndup(ctx->pool, term, len);
	qt->len = len;
	qt->ascii = !from_non_ascii;
	for (i = 0; i < len && qt->ascii; i++) {
		if ((unsigned char)term[i] >= 0x80)
			qt->ascii = FALSE;
	}
}

/* An atom longer than CASIDX_TOKEN_WINDOW_SAFE may cross the windows
   the index cut a long term into: look up pieces that each lie inside
   one window, from its start, every CASIDX_TOKEN_WINDOW_SAFE bytes, and
   its end. */
static void add_atom(struct tokens_ctx *ctx, const char *atom, size_t len,
		     bool from_non_ascii)
{
	size_t start = 0, n;

	if (len <= CASIDX_TOKEN_WINDOW_SAFE) {
		add_lookup(ctx, atom, len, from_non_ascii);
		return;
	}
	while (start + CASIDX_TOKEN_WINDOW_SAFE < len) {
		n = CASIDX_TOKEN_WINDOW_SAFE;
		while (n > 1 && ((unsigned char)atom[start + n] & 0xc0) == 0x80)
			n--;
		add_lookup(ctx, atom + start, n, from_non_ascii);
		start += n;
	}
	start = len - CASIDX_TOKEN_WINDOW_SAFE;
	while (start < len && ((unsigned char)atom[start] & 0xc0) == 0x80)
		start++;
	add_lookup(ctx, atom + start, len - start, from_non_ascii);
}

static inline bool is_ascii_punct(unsigned char c)
{
	return c < 0x80 && !i_isalnum(c);
}

/* A token's atoms: its runs between ASCII punctuation. Each atom of a
   value that occurs in the text lies inside an atom of the text, and
   every atom of indexed text is inside some term (doc/search-semantics.md),
   so the lookups never miss a message that contains the value. */
static void token_cb(const struct casidx_token *token, void *context)
{
	struct tokens_ctx *ctx = context;
	size_t i = 0, start;
	bool from_non_ascii;

	if ((token->flags & CASIDX_TOKEN_FLAG_PART) == 0)
		ctx->token_count++;
	/* a word with non-ASCII characters and no ASCII punctuation (one
	   atom) is no piece of a run of the base64 alphabet, even if it
	   was folded to ASCII */
	from_non_ascii = (token->flags & CASIDX_TOKEN_FLAG_FOLDED) != 0;
	for (i = 0; i < token->term_len && from_non_ascii; i++) {
		if (is_ascii_punct((unsigned char)token->term[i]))
			from_non_ascii = FALSE;
	}
	i = 0;
	while (i < token->term_len) {
		while (i < token->term_len &&
		       is_ascii_punct((unsigned char)token->term[i]))
			i++;
		start = i;
		while (i < token->term_len &&
		       !is_ascii_punct((unsigned char)token->term[i]))
			i++;
		add_atom(ctx, token->term + start, i - start, from_non_ascii);
	}
}

static void query_tokenize(struct casidx_tokenizer *tok, const char *value,
			   pool_t pool, struct tokens_ctx *ctx_r)
{
	i_zero(ctx_r);
	ctx_r->pool = pool;
	p_array_init(&ctx_r->tokens, pool, 4);
	casidx_tokenizer_tokenize(tok, value, strlen(value), token_cb, ctx_r);
}

void casidx_query_add_marker(struct casidx_index_writer *writer,
			     enum casidx_field field, const char *marker,
			     struct casidx_doc_state *state)
{
	uint32_t mask = 1U << field, *markers;

	if (strcmp(marker, CASIDX_TERM_UNINDEXED) == 0)
		markers = &state->markers;
	else {
		i_assert(strcmp(marker, CASIDX_TERM_DTPARTIAL) == 0);
		markers = &state->dt_markers;
	}
	if ((*markers & mask) != 0)
		return;
	*markers |= mask;
	casidx_index_writer_add_term(writer, field, marker,
				     CASIDX_TERM_MARKER_LEN);
}

void casidx_query_dtgram_restart(struct casidx_doc_state *state)
{
	if (state->dt_pos_end < CASIDX_POS_MAX - 1)
		state->dt_pos_base = state->dt_pos_end + 2;
	else
		state->dt_no_positions = TRUE;
}

void casidx_query_add_dtgram(struct casidx_index_writer *writer,
			     enum casidx_field field,
			     const unsigned char *gram, size_t gram_len,
			     uint32_t pos, struct casidx_doc_state *state)
{
	uint32_t code = CASIDX_POS_NONE;
	uint64_t abs;

	if (state->dtgrams[field] >= CASIDX_DTGRAM_DOC_MAX) {
		casidx_query_add_marker(writer, field, CASIDX_TERM_DTPARTIAL,
					state);
		return;
	}
	state->dtgrams[field]++;
	if (field == CASIDX_FIELD_BODY && !state->dt_no_positions) {
		abs = (uint64_t)state->dt_pos_base + pos;
		if (abs + 2 > CASIDX_POS_MAX)
			state->dt_no_positions = TRUE;
		else {
			code = CASIDX_POS_CODE(abs,
					       CASIDX_POS_KIND_WORD);
			if (abs + 2 > state->dt_pos_end)
				state->dt_pos_end = abs + 2;
		}
	}
	casidx_index_writer_add_dtgram(writer, field, gram, gram_len, code);
}

void casidx_query_body_restart(struct casidx_doc_state *state)
{
	if (state->pos_end < CASIDX_POS_MAX)
		state->pos_base = state->pos_end + 1;
	else
		state->no_positions = TRUE;
}

/* The code kind of a body token (casidx-segment.h), FALSE for none.
   Whole RAW tokens that are their own term (not a window of a longer
   one) are what query_phrase_docs() proves with. Parts get the kind
   PART: a part is never the whole token of a piece's end or start, so
   the phrase exclusion (query_phrase_prove()) may pass over it, where
   an occurrence without a code could be an ICU word. Folded parts
   (joined words: "x2y" of "x²y" ends a piece its whole tokens do not)
   and CJK unigrams get none, nor do encoded runs (base64-looking):
   phrases with them are rare, their codes many. */
static bool token_pos_kind(const struct casidx_token *token,
			   enum casidx_pos_kind *kind_r)
{
	if ((token->flags & (CASIDX_TOKEN_FLAG_FOLDED |
			     CASIDX_TOKEN_FLAG_CJK |
			     CASIDX_TOKEN_FLAG_ENCODED)) != 0)
		return FALSE;
	if ((token->flags & CASIDX_TOKEN_FLAG_PART) != 0) {
		*kind_r = CASIDX_POS_KIND_PART;
		return TRUE;
	}
	if ((token->flags & CASIDX_TOKEN_FLAG_RAW) == 0 ||
	    (token->flags & CASIDX_TOKEN_FLAG_WINDOW) != 0)
		return FALSE;
	*kind_r = (token->flags & CASIDX_TOKEN_FLAG_SPACE_BEFORE) != 0 ?
		CASIDX_POS_KIND_SPACE : CASIDX_POS_KIND_WORD;
	return TRUE;
}

/* Position code of a body token (casidx-segment.h), CASIDX_POS_NONE
   for none (token_pos_kind()). */
static uint32_t token_pos_code(enum casidx_field field,
			       const struct casidx_token *token,
			       struct casidx_doc_state *state)
{
	enum casidx_pos_kind kind;
	uint64_t pos;

	if (field != CASIDX_FIELD_BODY || state->no_positions ||
	    !token_pos_kind(token, &kind))
		return CASIDX_POS_NONE;
	pos = (uint64_t)state->pos_base + token->position;
	if (pos > CASIDX_POS_MAX) {
		state->no_positions = TRUE;
		return CASIDX_POS_NONE;
	}
	if (pos + 1 > state->pos_end)
		state->pos_end = pos + 1;
	return CASIDX_POS_CODE(pos, kind);
}

void casidx_query_add_token(struct casidx_index_writer *writer,
			    enum casidx_field field,
			    const struct casidx_token *token,
			    struct casidx_doc_state *state)
{
	size_t budget = field == CASIDX_FIELD_BODY ?
		CASIDX_ENCODED_BODY_BUDGET : CASIDX_ENCODED_HEADER_BUDGET;
	uint32_t pos_code;

	if ((token->flags & CASIDX_TOKEN_FLAG_ENCODED) != 0) {
		if (state->encoded_bytes[field] + token->term_len > budget) {
			state->encoded_bytes[field] = budget;
			casidx_query_add_marker(writer, field,
						CASIDX_TERM_UNINDEXED, state);
			return;
		}
		state->encoded_bytes[field] += token->term_len;
	}
	if ((token->flags & CASIDX_TOKEN_FLAG_FOLDED) == 0) {
		pos_code = token_pos_code(field, token, state);
		casidx_index_writer_add_term_pos(writer, field, token->term,
						 token->term_len, pos_code);
		return;
	}
	T_BEGIN {
		char *term = t_malloc_no0(token->term_len + 1);

		term[0] = CASIDX_TERM_FOLDED_PREFIX;
		memcpy(term + 1, token->term, token->term_len);
		casidx_index_writer_add_term(writer, field, term,
					     token->term_len + 1);
	} T_END;
}

#define ADDRESS_FIELDS_MASK \
	(CASIDX_FIELD_MASK(CASIDX_FIELD_FROM) | \
	 CASIDX_FIELD_MASK(CASIDX_FIELD_TO) | \
	 CASIDX_FIELD_MASK(CASIDX_FIELD_CC) | \
	 CASIDX_FIELD_MASK(CASIDX_FIELD_BCC))
#define RAW_FIELDS_MASK \
	(CASIDX_FIELD_MASK(CASIDX_FIELD_RAW_FROM) | \
	 CASIDX_FIELD_MASK(CASIDX_FIELD_RAW_TO) | \
	 CASIDX_FIELD_MASK(CASIDX_FIELD_RAW_CC) | \
	 CASIDX_FIELD_MASK(CASIDX_FIELD_RAW_BCC))
#define DTGRAM_FIELDS_MASK \
	(CASIDX_FIELD_MASK(CASIDX_FIELD_BODY) | \
	 CASIDX_FIELD_MASK(CASIDX_FIELD_SUBJECT) | \
	 CASIDX_FIELD_MASK(CASIDX_FIELD_HEADER))

/* The fields whose dtgrams answer a leaf of field_mask: body, subject
   and other headers. The raw address values' dtgrams are the header
   field's (with every other header's: a superset). None for
   FROM/TO/CC/BCC alone: Dovecot compares their normalised addresses,
   whose dtgrams are not indexed. */
static unsigned int dtgram_field_mask(unsigned int field_mask)
{
	if ((field_mask & ADDRESS_FIELDS_MASK) != 0 &&
	    (field_mask & CASIDX_FIELD_MASK(CASIDX_FIELD_HEADER)) == 0)
		return 0;
	if ((field_mask & RAW_FIELDS_MASK) != 0)
		field_mask |= CASIDX_FIELD_MASK(CASIDX_FIELD_HEADER);
	return field_mask & DTGRAM_FIELDS_MASK;
}

bool casidx_query_value_is_answerable(struct casidx_tokenizer *tok,
				      const char *value,
				      unsigned int field_mask)
{
	struct casidx_dtgram_value dtv;
	struct tokens_ctx ctx;
	pool_t pool;
	bool ret;

	pool = pool_alloconly_create("casidx query tokens", 256);
	query_tokenize(tok, value, pool, &ctx);
	ret = array_count(&ctx.tokens) > 0;
	if (!ret && dtgram_field_mask(field_mask) != 0) {
		casidx_dtgram_value(value, pool, &dtv);
		ret = array_count(&dtv.grams) > 0;
	}
	pool_unref(&pool);
	return ret;
}

/* The index can prove a substring match only when the value is one
   ASCII word whose normalised form is the value lowercased: then the
   value occurs in the original text exactly where the token occurs in
   the term (see doc/search-semantics.md for the remaining edges). */
static bool value_is_definite(const char *value,
			      const struct tokens_ctx *tctx)
{
	const struct query_token *tokens;
	unsigned int count;
	size_t i;

	tokens = array_get(&tctx->tokens, &count);
	if (count != 1 || tctx->token_count != 1 ||
	    tokens[0].len != strlen(value))
		return FALSE;
	for (i = 0; value[i] != '\0'; i++) {
		if (!i_isalnum(value[i]) || (unsigned char)value[i] >= 0x80)
			return FALSE;
		if (i_tolower(value[i]) != tokens[0].term[i])
			return FALSE;
	}
	return TRUE;
}

static void scores_add(struct casidx_query_scores *scores, uint32_t uid,
		       double score)
{
	double *value;

	value = hash_table_lookup(scores->map, POINTER_CAST(uid));
	if (value == NULL) {
		value = p_new(scores->pool, double, 1);
		hash_table_insert(scores->map, POINTER_CAST(uid), value);
	}
	*value += score;
}

static bool term_contains(const unsigned char *term, size_t term_len,
			  const struct query_token *token)
{
	size_t i;

	for (i = 0; i + token->len <= term_len; i++) {
		if (memcmp(term + i, token->term, token->len) == 0)
			return TRUE;
	}
	return FALSE;
}

static unsigned int scan_term_idx(struct scan_ctx *ctx,
				  const unsigned char *term, size_t term_len)
{
	const char *key = t_strndup(term, term_len);
	void *value;
	uint64_t zero = 0;

	value = hash_table_lookup(ctx->term_idx, key);
	if (value != NULL)
		return POINTER_CAST_TO(value, unsigned int) - 1;
	array_push_back(&ctx->term_df, &zero);
	key = p_strdup(ctx->pool, key);
	hash_table_insert(ctx->term_idx, key,
			  POINTER_CAST(array_count(&ctx->term_df)));
	return array_count(&ctx->term_df) - 1;
}

static void scan_score_hits(struct scan_ctx *ctx);

static void scan_cb(struct casidx_segment *seg, const unsigned char *term,
		    size_t term_len, const roaring_bitmap_t *docs,
		    const uint32_t *tfs, void *context)
{
	struct scan_ctx *ctx = context;
	roaring_uint32_iterator_t *it;
	struct scan_hit *hit;
	uint64_t *df;
	double factor;
	unsigned int i, term_idx;

	if (ctx->restrict_to != NULL &&
	    !roaring_bitmap_intersect(docs, ctx->restrict_to))
		return;
	roaring_bitmap_or_inplace(ctx->docs, docs);
	if (term_len > 0 && term[0] == CASIDX_TERM_FOLDED_PREFIX) {
		term++;
		term_len--;
	} else if (ctx->plain != NULL) {
		roaring_bitmap_or_inplace(ctx->plain, docs);
	}
	if (ctx->scores == NULL)
		return;

	if (ctx->match == CASIDX_MATCH_TYPO) {
		/* a term containing the token was scored by its
		   substring scan */
		if (term_contains(term, term_len, ctx->token))
			return;
		factor = MATCH_FACTOR_TYPO;
	} else if (term_len == ctx->token->len)
		factor = MATCH_FACTOR_EXACT;
	else if (memcmp(term, ctx->token->term, ctx->token->len) == 0)
		factor = MATCH_FACTOR_PREFIX;
	else
		factor = MATCH_FACTOR_SUBSTRING;
	T_BEGIN {
		term_idx = scan_term_idx(ctx, term, term_len);
	} T_END;
	df = array_idx_modifiable(&ctx->term_df, term_idx);
	*df += roaring_bitmap_get_cardinality(docs);
	it = roaring_create_iterator(docs);
	for (i = 0; it->has_value; roaring_advance_uint32_iterator(it), i++) {
		if (!roaring_bitmap_contains(ctx->restrict_to != NULL ?
					     ctx->restrict_to : ctx->universe,
					     it->current_value))
			continue;
		hit = array_append_space(&ctx->hits);
		hit->uid = it->current_value;
		hit->tf = tfs[i];
		hit->doc_len = casidx_segment_doc_len(seg, hit->uid,
						      ctx->field);
		hit->term_idx = term_idx;
		hit->factor = factor;
		if (array_count(&ctx->hits) >= SCAN_HITS_MAX) {
			scan_score_hits(ctx);
			array_clear(&ctx->hits);
		}
	}
	roaring_free_uint32_iterator(it);
}

/* Score the hits of one field's scan with index-wide frequencies. */
static void scan_score_hits(struct scan_ctx *ctx)
{
	const struct scan_hit *hit;
	const uint64_t *df;

	if (array_count(&ctx->hits) == 0)
		return;
	df = array_front(&ctx->term_df);
	array_foreach(&ctx->hits, hit) {
		scores_add(ctx->scores, hit->uid, casidx_bm25_term_score(
			&casidx_bm25_default_params,
			ctx->weight * hit->factor, ctx->total_docs,
			df[hit->term_idx], hit->tf, hit->doc_len,
			ctx->avg_len));
	}
}

/* Docs having a term containing token in any field of mask; plain_r
   (if not NULL) gets those having such a term that was not folded. */
static int query_token_docs_in(struct casidx_index *index,
			       const struct query_token *token,
			       enum casidx_match match,
			       unsigned int field_mask,
			       const roaring_bitmap_t *universe,
			       const roaring_bitmap_t *restrict_to,
			       struct casidx_query_scores *scores,
			       roaring_bitmap_t **docs_r,
			       roaring_bitmap_t **plain_r, const char **error_r)
{
	struct scan_ctx ctx;
	enum casidx_field field;

	i_zero(&ctx);
	ctx.restrict_to = restrict_to;
	ctx.docs = bitmap_create();
	/* collected only when asked for: a second union per term */
	ctx.plain = plain_r == NULL ? NULL : bitmap_create();
	ctx.universe = universe;
	ctx.scores = scores;
	ctx.token = token;
	ctx.match = match;
	ctx.total_docs = roaring_bitmap_get_cardinality(universe);
	ctx.pool = pool_alloconly_create("casidx scan", 1024);
	for (field = 0; field < CASIDX_FIELD_SPACE_COUNT; field++) {
		if ((field_mask & CASIDX_FIELD_MASK(field)) == 0)
			continue;
		ctx.field = field;
		if (field < CASIDX_FIELD_COUNT) {
			ctx.scores = scores;
			ctx.weight = field_weights[field];
			ctx.avg_len = casidx_index_get_avg_len(index, field);
		} else {
			ctx.scores = NULL;
		}
		p_clear(ctx.pool);
		hash_table_create(&ctx.term_idx, ctx.pool, 0, str_hash,
				  strcmp);
		p_array_init(&ctx.term_df, ctx.pool, 8);
		p_array_init(&ctx.hits, ctx.pool, 64);
		if (casidx_index_scan(index, field, token->term, token->len,
				      match, scan_cb, &ctx, error_r) < 0) {
			hash_table_destroy(&ctx.term_idx);
			pool_unref(&ctx.pool);
			roaring_bitmap_free(ctx.docs);
			if (ctx.plain != NULL)
				roaring_bitmap_free(ctx.plain);
			return -1;
		}
		if (ctx.scores != NULL)
			scan_score_hits(&ctx);
		hash_table_destroy(&ctx.term_idx);
	}
	pool_unref(&ctx.pool);
	*docs_r = ctx.docs;
	if (plain_r != NULL)
		*plain_r = ctx.plain;
	return 0;
}

static int query_token_docs(struct casidx_index *index,
			    const struct query_token *token,
			    enum casidx_match match, unsigned int field_mask,
			    const roaring_bitmap_t *universe,
			    struct casidx_query_scores *scores,
			    roaring_bitmap_t **docs_r,
			    roaring_bitmap_t **plain_r, const char **error_r)
{
	return query_token_docs_in(index, token, match, field_mask, universe,
				   NULL, scores, docs_r, plain_r, error_r);
}

/* Docs of the fields of mask that carry a marker term. */
static int query_marker_docs(struct casidx_index *index, const char *marker,
			     unsigned int field_mask,
			     const roaring_bitmap_t *universe,
			     roaring_bitmap_t **docs_r, const char **error_r)
{
	struct query_token token = {
		.term = marker, .len = CASIDX_TERM_MARKER_LEN,
	};

	return query_token_docs(index, &token, CASIDX_MATCH_EXACT, field_mask,
				universe, NULL, docs_r, NULL, error_r);
}

/* ---- proofs beyond one word (doc/search-semantics.md) ---- */

/* Most words of a value a phrase proof looks at. */
#define PHRASE_MAX_WORDS 16

/* A value of 2..PHRASE_MAX_WORDS words of printable ASCII separated by
   single spaces: its words, lower-cased, into words (count returned),
   else 0. A word may hold punctuation ("1,000 dollars"): it is matched
   against the bytes of RAW terms, which are the text's. */
static unsigned int phrase_words(const char *value, pool_t pool,
				 char **words)
{
	unsigned int n = 0;
	size_t i, start;

	for (i = 0;;) {
		start = i;
		while ((unsigned char)value[i] > 0x20 &&
		       (unsigned char)value[i] < 0x7f)
			i++;
		if (i == start || n == PHRASE_MAX_WORDS)
			return 0;
		words[n] = p_strndup(pool, value + start, i - start);
		str_lcase(words[n++]);
		if (value[i] == '\0')
			break;
		if (value[i] != ' ')
			return 0;
		i++;
	}
	return n < 2 ? 0 : n;
}

/* A value of printable ASCII without whitespace that has punctuation
   (a single word is value_is_definite()'s): lower-cased, else NULL. */
static const char *punct_value(const char *value)
{
	bool punct = FALSE;
	size_t i;

	for (i = 0; value[i] != '\0'; i++) {
		if ((unsigned char)value[i] <= 0x20 ||
		    (unsigned char)value[i] >= 0x7f)
			return NULL;
		if (!i_isalnum(value[i]))
			punct = TRUE;
	}
	return punct && i > 0 ? t_str_lcase(value) : NULL;
}

HASH_TABLE_DEFINE_TYPE(uid_starts, void *, roaring_bitmap_t *);

struct phrase_word_ctx {
	const char *word;
	size_t len;
	/* 0 = first (a suffix of the term), last (a prefix), else the
	   whole term */
	unsigned int idx, count;
	/* the words follow each other with punctuation between, not one
	   space (query_phrase_prove() with adjacent_value) */
	bool adjacent;
	/* uid -> roaring bitmap of start positions; prev = the previous
	   word's (NULL for the first) */
	HASH_TABLE_TYPE(uid_starts) starts;
	HASH_TABLE_TYPE(uid_starts) prev;
	const roaring_bitmap_t *candidates;
	/* if not NULL: candidates with an occurrence of the word (in any
	   term) that has no code */
	roaring_bitmap_t *unsure;
	ARRAY_TYPE(uint32_t) tfs, pos, pos_idx;
};

static bool phrase_term_ok(const struct phrase_word_ctx *ctx,
			   const unsigned char *term, size_t len)
{
	if (len < ctx->len || term[0] < 0x20)
		return FALSE;
	if (ctx->idx == 0)
		return memcmp(term + len - ctx->len, ctx->word, ctx->len) == 0;
	if (ctx->idx + 1 == ctx->count)
		return memcmp(term, ctx->word, ctx->len) == 0;
	return len == ctx->len && memcmp(term, ctx->word, len) == 0;
}

/* Some byte of data is below c. */
static bool memchr_lt(const unsigned char *data, size_t len, unsigned char c)
{
	size_t i;

	for (i = 0; i < len; i++) {
		if (data[i] < c)
			return TRUE;
	}
	return FALSE;
}

static int phrase_entry_cb(struct casidx_segment *seg,
			   const struct casidx_term_entry *entry,
			   void *context, const char **error_r)
{
	struct phrase_word_ctx *ctx = context;
	roaring_uint32_iterator_t *it;
	roaring_bitmap_t *docs, *bm, *prev;
	const uint32_t *codes, *idx;
	uint32_t uid, code, pos;
	unsigned int i, j;

	bool term_ok = phrase_term_ok(ctx, entry->key + 1,
				      entry->key_len - 1);
	const uint32_t *tfs;
	bool folded = entry->key_len > 1 &&
		entry->key[1] == CASIDX_TERM_FOLDED_PREFIX;

	/* only the terms a piece holding the word can start (prefix,
	   first word: suffix, others: whole) or folded ones matter for
	   the exclusion (query_phrase_prove()) */
	if (!term_ok && (ctx->unsure == NULL || !folded))
		return 0;
	if (casidx_segment_read_positions(seg, entry, &docs, &ctx->tfs,
					  &ctx->pos, &ctx->pos_idx,
					  error_r) < 0)
		return -1;
	idx = array_front(&ctx->pos_idx);
	tfs = array_front(&ctx->tfs);
	if (ctx->unsure != NULL) {
		it = roaring_create_iterator(docs);
		for (i = 0; it->has_value;
		     roaring_advance_uint32_iterator(it), i++) {
			if (idx[i + 1] - idx[i] < tfs[i] &&
			    roaring_bitmap_contains(ctx->candidates,
						    it->current_value)) {
				roaring_bitmap_add(ctx->unsure,
						   it->current_value);
			}
		}
		roaring_free_uint32_iterator(it);
	}
	if (!term_ok || array_count(&ctx->pos) == 0) {
		roaring_bitmap_free(docs);
		return 0;
	}
	codes = array_front(&ctx->pos);
	it = roaring_create_iterator(docs);
	for (i = 0; it->has_value; roaring_advance_uint32_iterator(it), i++) {
		uid = it->current_value;
		if (idx[i] == idx[i + 1] ||
		    !roaring_bitmap_contains(ctx->candidates, uid))
			continue;
		prev = NULL;
		if (ctx->idx > 0) {
			prev = hash_table_lookup(ctx->prev, POINTER_CAST(uid));
			if (prev == NULL)
				continue;
		}
		bm = hash_table_lookup(ctx->starts, POINTER_CAST(uid));
		for (j = idx[i]; j < idx[i + 1]; j++) {
			code = codes[j];
			pos = CASIDX_POS_OF(code);
			/* whole tokens only; after the first word: one space
			   before it (adjacent: no space) */
			if (CASIDX_POS_KIND(code) == CASIDX_POS_KIND_PART)
				continue;
			if (ctx->idx > 0 &&
			    (CASIDX_POS_KIND(code) != (ctx->adjacent ?
						       CASIDX_POS_KIND_WORD :
						       CASIDX_POS_KIND_SPACE) ||
			     pos < ctx->idx))
				continue;
			pos -= ctx->idx;
			if (prev != NULL && !roaring_bitmap_contains(prev, pos))
				continue;
			if (bm == NULL) {
				bm = bitmap_create();
				hash_table_insert(ctx->starts,
						  POINTER_CAST(uid), bm);
			}
			roaring_bitmap_add(bm, pos);
		}
	}
	roaring_free_uint32_iterator(it);
	roaring_bitmap_free(docs);
	return 0;
}

static void phrase_starts_free(HASH_TABLE_TYPE(uid_starts) *map)
{
	struct hash_iterate_context *iter;
	roaring_bitmap_t *bm;
	void *key;

	if (!hash_table_is_created(*map))
		return;
	iter = hash_table_iterate_init(*map);
	while (hash_table_iterate(iter, *map, &key, &bm))
		roaring_bitmap_free(bm);
	hash_table_iterate_deinit(&iter);
	hash_table_destroy(map);
}

/* The candidates whose body holds the words literally, one space
   apart: word 1 at the end of a RAW term at position p, each next word
   i a whole RAW term at p + i with SPACE_BEFORE, the last one at the
   start of its term. Terms are the text's bytes lower-cased (RAW), so
   this is the value occurring in the text, as Dovecot's search sees
   it. Only segments with positions take part; others prove nothing. */
static int query_phrase_docs(struct casidx_index *index,
			     char *const *words, unsigned int count,
			     bool adjacent,
			     const roaring_bitmap_t *candidates,
			     roaring_bitmap_t *proven, roaring_bitmap_t *unsure,
			     const char **error_r)
{
	struct casidx_segment **segs;
	struct phrase_word_ctx ctx;
	struct hash_iterate_context *iter;
	roaring_bitmap_t *bm;
	unsigned int s, nsegs, i;
	void *key;
	int ret = 0;

	i_zero(&ctx);
	ctx.candidates = candidates;
	ctx.unsure = unsure;
	ctx.count = count;
	ctx.adjacent = adjacent;
	i_array_init(&ctx.tfs, 64);
	i_array_init(&ctx.pos, 64);
	i_array_init(&ctx.pos_idx, 64);
	nsegs = casidx_index_get_open_segments(index, &segs);
	for (s = 0; s < nsegs && ret == 0; s++) {
		if (!casidx_segment_has_positions(segs[s])) {
			/* nothing proven, nothing excluded there */
			if (unsure != NULL) {
				roaring_bitmap_t *docs = roaring_bitmap_and(
					casidx_segment_get_docs(segs[s]),
					candidates);

				roaring_bitmap_or_inplace(unsure, docs);
				roaring_bitmap_free(docs);
			}
			continue;
		}
		for (i = 0; i < count; i++) {
			ctx.word = words[i];
			ctx.len = strlen(words[i]);
			ctx.idx = i;
			phrase_starts_free(&ctx.prev);
			ctx.prev = ctx.starts;
			hash_table_create_direct(&ctx.starts, default_pool, 0);
			if (casidx_segment_find_substring(segs[s],
				CASIDX_FIELD_KEY_CHAR(CASIDX_FIELD_BODY),
				ctx.word, ctx.len, phrase_entry_cb, &ctx,
				error_r) < 0) {
				ret = -1;
				break;
			}
			/* the exclusion needs every word's occurrences */
			if (hash_table_count(ctx.starts) == 0 &&
			    unsure == NULL)
				break;
		}
		if (ret == 0 && i == count) {
			iter = hash_table_iterate_init(ctx.starts);
			while (hash_table_iterate(iter, ctx.starts, &key, &bm)) {
				roaring_bitmap_add(proven,
					POINTER_CAST_TO(key, uint32_t));
			}
			hash_table_iterate_deinit(&iter);
		}
		phrase_starts_free(&ctx.prev);
		phrase_starts_free(&ctx.starts);
	}
	array_free(&ctx.tfs);
	array_free(&ctx.pos);
	array_free(&ctx.pos_idx);
	if (ret < 0)
		casidx_index_set_corrupted(index);
	return ret;
}

/* Words that can be excluded by their positions: ASCII alphanumeric
   (each a whole piece between the single spaces is one word of the
   tokenizer) and at most CASIDX_TOKEN_WINDOW_SAFE bytes (inside a
   longer word one window term holds it, so it is seen without a code). */
static bool phrase_words_excludable(char *const *words, unsigned int count)
{
	unsigned int i;
	size_t j;

	for (i = 0; i < count; i++) {
		for (j = 0; words[i][j] != '\0'; j++) {
			if (!i_isalnum(words[i][j]))
				return FALSE;
		}
		if (j > CASIDX_TOKEN_WINDOW_SAFE)
			return FALSE;
	}
	return TRUE;
}

/* casidx_index_scan() of token in every field of mask (key
   namespaces < CASIDX_FIELD_SPACE_COUNT), in field order. */
static int scan_fields(struct casidx_index *index, unsigned int mask,
		       const char *token, size_t token_len,
		       enum casidx_match match,
		       casidx_index_term_callback_t *callback, void *context,
		       const char **error_r)
{
	enum casidx_field field;

	for (field = 0; field < CASIDX_FIELD_SPACE_COUNT; field++) {
		if ((mask & CASIDX_FIELD_MASK(field)) != 0 &&
		    casidx_index_scan(index, field, token, token_len, match,
				      callback, context, error_r) < 0)
			return -1;
	}
	return 0;
}

struct phrase_other_ctx {
	struct phrase_word_ctx word;
	roaring_bitmap_t *docs;
};

static void phrase_other_cb(struct casidx_segment *seg ATTR_UNUSED,
			    const unsigned char *term, size_t term_len,
			    const roaring_bitmap_t *docs,
			    const uint32_t *tfs ATTR_UNUSED, void *context)
{
	struct phrase_other_ctx *ctx = context;

	/* the scan found term containing the word; a folded term, or a
	   header name with whitespace or control characters (no token
	   has them), counts as it is */
	if ((term_len > 0 && term[0] == CASIDX_TERM_FOLDED_PREFIX) ||
	    memchr_lt(term, term_len, 0x21) ||
	    phrase_term_ok(&ctx->word, term, term_len))
		roaring_bitmap_or_inplace(ctx->docs, docs);
}

/* The docs whose fields of mask (no positions: headers) can hold word
   idx of a phrase of count words: as in the body (query_phrase_prove()),
   word 1 ends a whitespace-delimited piece, the last one starts one and
   the others are whole pieces, so one of these fields has a term ending
   with word 1 (equal to a middle word, starting with the last one), a
   folded term containing it, or a header name holding it (names are
   indexed whole, spaces and all, and split at '-'; a name is followed
   by its colon, so only a name with whitespace can hold a phrase's
   word next to a space). */
static int phrase_other_docs(struct casidx_index *index, const char *word,
			     unsigned int idx, unsigned int count,
			     unsigned int mask, roaring_bitmap_t **docs_r,
			     const char **error_r)
{
	struct phrase_other_ctx ctx;

	i_zero(&ctx);
	ctx.word.word = word;
	ctx.word.len = strlen(word);
	ctx.word.idx = idx;
	ctx.word.count = count;
	ctx.docs = bitmap_create();
	if (scan_fields(index, mask, word, ctx.word.len,
			CASIDX_MATCH_SUBSTRING, phrase_other_cb, &ctx,
			error_r) < 0) {
		roaring_bitmap_free(ctx.docs);
		return -1;
	}
	*docs_r = ctx.docs;
	return 0;
}

/* Phrase proof, and where it can be shown the value is absent, the
   candidates it drops from set. A body holding the value literally has
   word 1 at the end of a whitespace-delimited piece, the middle words
   as whole pieces and the last word at the start of one; the whole
   token there is a term that ends with word 1 (is a middle word,
   starts with the last one), or a folded term containing it. If every
   occurrence in the doc of those terms has a code (all whole RAW
   tokens), the proof finds it; so a candidate the proof did not find
   is dropped unless some such occurrence has no code (ICU words,
   parts, windows, encoded runs, folded terms, segments without
   positions), its body is UNINDEXED, or (TEXT) all the words are in
   its other fields too. */
static int query_phrase_prove(struct casidx_index *index,
			      char *const *words, unsigned int count,
			      const char *adjacent_value, unsigned int mask,
			      const roaring_bitmap_t *universe,
			      roaring_bitmap_t *set, roaring_bitmap_t *proven,
			      const char **error_r)
{
	unsigned int other = mask & ~CASIDX_FIELD_MASK(CASIDX_FIELD_BODY);
	roaring_bitmap_t *keep, *docs, *hdr = NULL, *hdr_unindexed;
	roaring_bitmap_t *chains;
	struct query_token token;
	unsigned int i;
	int ret;

	if (!phrase_words_excludable(words, count)) {
		if (adjacent_value != NULL)
			return 0;
		return query_phrase_docs(index, words, count, FALSE, set,
					 proven, NULL, error_r);
	}
	keep = bitmap_create();
	if (adjacent_value == NULL) {
		ret = query_phrase_docs(index, words, count, FALSE, set,
					proven, keep, error_r);
	} else {
		/* adjacent tokens do not prove the punctuation between
		   them: kept, not definite; nor does a term holding the
		   value prove it outside the body */
		chains = bitmap_create();
		i_zero(&token);
		token.term = adjacent_value;
		token.len = strlen(adjacent_value);
		token.ascii = TRUE;
		ret = query_phrase_docs(index, words, count, TRUE, set,
					chains, keep, error_r);
		roaring_bitmap_or_inplace(keep, chains);
		roaring_bitmap_free(chains);
		if (ret == 0 &&
		    (ret = query_token_docs(index, &token,
					    CASIDX_MATCH_SUBSTRING, mask,
					    universe, NULL, &docs, NULL,
					    error_r)) == 0) {
			roaring_bitmap_or_inplace(keep, docs);
			roaring_bitmap_free(docs);
		}
	}
	if (ret < 0 ||
	    query_marker_docs(index, CASIDX_TERM_UNINDEXED,
			      CASIDX_FIELD_MASK(CASIDX_FIELD_BODY), universe,
			      &docs, error_r) < 0) {
		roaring_bitmap_free(keep);
		return -1;
	}
	roaring_bitmap_or_inplace(keep, docs);
	roaring_bitmap_free(docs);
	roaring_bitmap_or_inplace(keep, proven);
	if (other != 0) {
		/* a match in another field needs every word there, each in
		   a term that can be its piece's (phrase_other_docs()) */
		for (i = 0; i < count; i++) {
			if (phrase_other_docs(index, words[i], i, count, other,
					      &docs, error_r) < 0) {
				if (hdr != NULL)
					roaring_bitmap_free(hdr);
				roaring_bitmap_free(keep);
				return -1;
			}
			if (hdr == NULL)
				hdr = docs;
			else {
				roaring_bitmap_and_inplace(hdr, docs);
				roaring_bitmap_free(docs);
			}
		}
		if (query_marker_docs(index, CASIDX_TERM_UNINDEXED, other,
				      universe, &hdr_unindexed, error_r) < 0) {
			roaring_bitmap_free(hdr);
			roaring_bitmap_free(keep);
			return -1;
		}
		roaring_bitmap_or_inplace(keep, hdr);
		roaring_bitmap_or_inplace(keep, hdr_unindexed);
		roaring_bitmap_free(hdr);
		roaring_bitmap_free(hdr_unindexed);
	}
	roaring_bitmap_and_inplace(set, keep);
	roaring_bitmap_free(keep);
	return 0;
}

/* A value of ASCII letters and digits joined by runs of '_', or by
   single '.', not both, with a letter on both sides of each joiner, of
   at most CASIDX_TOKEN_WINDOW_SAFE bytes (lower-cased, from
   punct_value()): its joiner, else '\0'. Both join letters into one
   word wherever they occur (UAX #29: '_' is ExtendNumLet, '.' MidNumLet
   between letters, in the ASCII and the ICU path alike), so an
   occurrence of the value lies inside one term (a window, if longer),
   except where the word is cut at a joiner: punct_edge_docs() and
   punct_folded_docs(). '_' is in the base64 alphabet of encoded runs
   and in URLs and e-mail local parts, '.' in URLs, addresses and
   their parts. The letters: a character next to '_' whose image is an
   ASCII digit may be no word character (superscript two), which ICU
   splits off; '.' joins letters only. */
static char joined_value(const char *value)
{
	size_t i, len = strlen(value);
	char joiner = '\0';

	if (len > CASIDX_TOKEN_WINDOW_SAFE || !i_isalnum(value[0]) ||
	    !i_isalnum(value[len - 1]))
		return '\0';
	for (i = 0; i < len; i++) {
		if (value[i] == '_' || value[i] == '.') {
			if (joiner != '\0' && joiner != value[i])
				return '\0';
			joiner = value[i];
			if (value[i + 1] == '_' && value[i] == '_')
				continue;
			if (!i_isalpha(value[i + 1]))
				return '\0';
			if (value[i] == '.' && !i_isalpha(value[i - 1]))
				return '\0';
		} else if (!i_isalnum(value[i])) {
			return '\0';
		} else if (value[i + 1] == '_' && !i_isalpha(value[i])) {
			return '\0';
		}
	}
	return joiner;
}

struct punct_edge_ctx {
	const char *atom;
	size_t len;
	/* the first atom: a term ending with it; else starting with it */
	bool first;
	/* '.': the end of an encoded run may be there */
	bool encoded_edge;
	roaring_bitmap_t *docs;
	ARRAY_TYPE(uint32_t) tfs;
};

static bool punct_edge_term(const struct punct_edge_ctx *ctx,
			    const unsigned char *term, size_t term_len)
{
	bool compound = FALSE;
	size_t i;

	if (term_len > 0 && term[0] == CASIDX_TERM_FOLDED_PREFIX) {
		/* a word ICU cut at a joiner next to a character whose
		   image is ASCII but which is no letter to UAX #29 ("tm"
		   of "gnu_™") */
		compound = TRUE;
		term++;
		term_len--;
	}
	if (term_len < ctx->len)
		return FALSE;
	if (ctx->first) {
		if (memcmp(term + term_len - ctx->len, ctx->atom,
			   ctx->len) != 0)
			return FALSE;
	} else if (memcmp(term, ctx->atom, ctx->len) != 0) {
		return FALSE;
	}
	if (compound || term_len >= CASIDX_TOKEN_MAX_BYTES ||
	    (ctx->encoded_edge && term_len >= CASIDX_TOKEN_ENCODED_MIN))
		return TRUE;
	if (ctx->first)
		return memchr(term, '@', term_len) != NULL;
	for (i = 0; i + 3 <= term_len; i++) {
		if (memcmp(term + i, "://", 3) == 0)
			return TRUE;
	}
	return FALSE;
}

/* The term is checked before its postings are read: a short atom is in
   most terms of the dictionary. */
static int punct_edge_entry_cb(struct casidx_segment *seg,
			       const struct casidx_term_entry *entry,
			       void *context, const char **error_r)
{
	struct punct_edge_ctx *ctx = context;
	roaring_bitmap_t *docs;

	if (!punct_edge_term(ctx, entry->key + 1, entry->key_len - 1))
		return 0;
	if (casidx_segment_read_postings(seg, entry, &docs, &ctx->tfs,
					 error_r) < 0)
		return -1;
	roaring_bitmap_or_inplace(ctx->docs, docs);
	roaring_bitmap_free(docs);
	return 0;
}

/* Docs where a term may end inside a joined_value() at its first
   joiner or begin at its last one: an e-mail address whose domain
   ends there ("x@gnu_radio": the term ends with the first atom), a URL
   whose scheme begins there ("gnu_radio://": the term starts with the
   last atom), a long term's windows, for '.' (not in the base64
   alphabet) an encoded run, and a folded word ending (starting) with
   the atom. */
static int punct_edge_docs(struct casidx_index *index, const char *value,
			   char joiner, unsigned int mask,
			   roaring_bitmap_t *docs, const char **error_r)
{
	struct punct_edge_ctx ctx;
	struct casidx_segment **segs;
	const char *last = strrchr(value, joiner) + 1;
	enum casidx_field field;
	unsigned int i, s, nsegs;
	int ret = 0;

	i_zero(&ctx);
	ctx.encoded_edge = joiner == '.';
	ctx.docs = docs;
	i_array_init(&ctx.tfs, 64);
	nsegs = casidx_index_get_open_segments(index, &segs);
	for (i = 0; i < 2 && ret == 0; i++) {
		ctx.first = i == 0;
		ctx.atom = ctx.first ? value : last;
		ctx.len = ctx.first ? (size_t)(strchr(value, joiner) - value) :
			strlen(last);
		for (field = 0; field < CASIDX_FIELD_SPACE_COUNT && ret == 0;
		     field++) {
			if ((mask & CASIDX_FIELD_MASK(field)) == 0)
				continue;
			for (s = 0; s < nsegs && ret == 0; s++) {
				if (casidx_segment_find_substring(segs[s],
					CASIDX_FIELD_KEY_CHAR(field),
					ctx.atom, ctx.len,
					punct_edge_entry_cb, &ctx,
					error_r) < 0)
					ret = -1;
			}
		}
	}
	array_free(&ctx.tfs);
	if (ret < 0)
		casidx_index_set_corrupted(index);
	return ret;
}

/* Docs where ICU may have cut a joined_value() at an inner joiner: the
   character next to it is non-ASCII and no letter to UAX #29 ("™"),
   yet Dovecot reads it as the value's letters ("TM"). Such a character
   is a word of its own, folded, whose term is its image: a non-empty
   suffix of the atom before the joiner, or prefix of the atom after it
   (one that reaches past the value's ends is punct_edge_docs()'s). */
static int punct_folded_docs(struct casidx_index *index, const char *value,
			     unsigned int mask, roaring_bitmap_t *docs,
			     const char **error_r)
{
	size_t len = strlen(value), i, a, b, k;
	char term[CASIDX_TOKEN_WINDOW_SAFE + 2];

	term[0] = CASIDX_TERM_FOLDED_PREFIX;
	for (i = 0; i < len; i++) {
		if (i_isalnum(value[i]) || (i > 0 && !i_isalnum(value[i - 1])))
			continue;
		/* the joiner (run) [i, b); its atoms [a, i) and [b, k) */
		a = i;
		while (a > 0 && i_isalnum(value[a - 1]))
			a--;
		b = i;
		while (b < len && !i_isalnum(value[b]))
			b++;
		k = b;
		while (k < len && i_isalnum(value[k]))
			k++;
		for (; a < i; a++) {
			memcpy(term + 1, value + a, i - a);
			if (scan_fields(index, mask, term, i - a + 1,
					CASIDX_MATCH_EXACT,
					casidx_index_or_docs_cb, docs,
					error_r) < 0)
				return -1;
		}
		for (; k > b; k--) {
			memcpy(term + 1, value + b, k - b);
			if (scan_fields(index, mask, term, k - b + 1,
					CASIDX_MATCH_EXACT,
					casidx_index_or_docs_cb, docs,
					error_r) < 0)
				return -1;
		}
	}
	return 0;
}

/* Exclusion for a joined_value(): the candidates that have no term
   containing it (in the arg's fields, folded or not), no term that may
   be cut at one of its joiners and no UNINDEXED field are dropped. */
static int punct_exclude(struct casidx_index *index, const char *value,
			 char joiner, unsigned int mask,
			 const roaring_bitmap_t *universe,
			 roaring_bitmap_t *set, const roaring_bitmap_t *proven,
			 const char **error_r)
{
	struct query_token token;
	roaring_bitmap_t *keep, *docs;

	i_zero(&token);
	token.term = value;
	token.len = strlen(value);
	token.ascii = TRUE;
	if (query_token_docs(index, &token, CASIDX_MATCH_SUBSTRING, mask,
			     universe, NULL, &keep, NULL, error_r) < 0)
		return -1;
	if (punct_edge_docs(index, value, joiner, mask, keep, error_r) < 0 ||
	    punct_folded_docs(index, value, mask, keep, error_r) < 0 ||
	    query_marker_docs(index, CASIDX_TERM_UNINDEXED, mask, universe,
			      &docs, error_r) < 0) {
		roaring_bitmap_free(keep);
		return -1;
	}
	roaring_bitmap_or_inplace(keep, docs);
	roaring_bitmap_free(docs);
	roaring_bitmap_or_inplace(keep, proven);
	roaring_bitmap_and_inplace(set, keep);
	roaring_bitmap_free(keep);
	return 0;
}

/* Punctuation that separates words wherever it occurs: no UAX #29
   joiner ('.', ',', ';', ':', '\'', '_' are), no compound trigger ('@',
   ':'), no whitespace. '/', '-', '+' and '=' are in the base64 alphabet
   and '/' in URLs: there a term holds the whole value. */
#define ADJACENT_SEPARATORS "/-+=<>()[]{}|\\!?#$%&*~^\""

/* A value of 2..PHRASE_MAX_WORDS ASCII letter-and-digit words with one
   to three ADJACENT_SEPARATORS between each two and none at its ends
   ("com/blog", "x-y", "a->b"; lower-cased, from punct_value()): its
   words into words (count returned), else 0. */
static unsigned int adjacent_words(const char *value, pool_t pool,
				   char **words)
{
	unsigned int n = 0;
	size_t i = 0, start, sep;

	for (;;) {
		start = i;
		while (i_isalnum(value[i]))
			i++;
		if (i == start || n == PHRASE_MAX_WORDS)
			return 0;
		words[n++] = p_strndup(pool, value + start, i - start);
		if (value[i] == '\0')
			break;
		sep = i;
		while (value[i] != '\0' && !i_isalnum(value[i])) {
			if (strchr(ADJACENT_SEPARATORS, value[i]) == NULL)
				return 0;
			i++;
		}
		if (i - sep > 3 || value[i] == '\0')
			return 0;
	}
	return n < 2 ? 0 : n;
}

/* With other fields (TEXT), a first or last word of one or two letters
   ends (starts) a header term of nearly every message, which keeps it,
   while finding its body positions reads those of most of the
   dictionary (TEXT e-mail: 0.8 s for 1,000 of 9,300 candidates): not
   tried there. */
static bool adjacent_worth_it(char *const *words, unsigned int count,
			      unsigned int mask)
{
	if ((mask & ~CASIDX_FIELD_MASK(CASIDX_FIELD_BODY)) == 0)
		return TRUE;
	return strlen(words[0]) >= 3 && strlen(words[count - 1]) >= 3;
}

/* Definite answers beyond a single word, added to def (and set): a
   multi-word value proven by positions in the body, a value with
   punctuation found inside one plain term (a term is its text's bytes
   lower-cased unless folded, doc/search-semantics.md). TEXT takes such
   terms from the body only: the address fields hold Dovecot's
   normalised lists, which TEXT does not read. */
static int query_leaf_prove(struct casidx_index *index,
			    const struct casidx_query_leaf *leaf,
			    bool definite, const roaring_bitmap_t *universe,
			    roaring_bitmap_t *set, roaring_bitmap_t *def,
			    const char **error_r)
{
	char *words[PHRASE_MAX_WORDS];
	struct query_token token;
	roaring_bitmap_t *proven, *docs, *plain;
	unsigned int count, mask = leaf->field_mask;
	const char *value;
	char joiner;
	pool_t pool;
	int ret = 0;

	if (definite || roaring_bitmap_is_empty(set))
		return 0;
	pool = pool_alloconly_create("casidx proof", 256);
	proven = bitmap_create();
	count = phrase_words(leaf->value, pool, words);
	if (count > 0) {
		if ((mask & CASIDX_FIELD_MASK(CASIDX_FIELD_BODY)) != 0) {
			ret = query_phrase_prove(index, words, count, NULL,
						 mask, universe, set, proven,
						 error_r);
		}
	} else if ((value = punct_value(leaf->value)) != NULL) {
		if ((mask & CASIDX_FIELD_MASK(CASIDX_FIELD_BODY)) != 0)
			mask = CASIDX_FIELD_MASK(CASIDX_FIELD_BODY);
		else if ((mask & (mask - 1)) != 0)
			mask = 0;
		i_zero(&token);
		token.term = value;
		token.len = strlen(value);
		token.ascii = TRUE;
		if (mask != 0 &&
		    (ret = query_token_docs(index, &token,
					    CASIDX_MATCH_SUBSTRING, mask,
					    universe, NULL, &docs, &plain,
					    error_r)) == 0) {
			roaring_bitmap_or_inplace(proven, plain);
			roaring_bitmap_free(docs);
			roaring_bitmap_free(plain);
		}
		if (ret == 0 && (joiner = joined_value(value)) != '\0') {
			ret = punct_exclude(index, value, joiner,
					    leaf->field_mask, universe, set,
					    proven, error_r);
		} else if (ret == 0 &&
			   (leaf->field_mask &
			    CASIDX_FIELD_MASK(CASIDX_FIELD_BODY)) != 0 &&
			   (count = adjacent_words(value, pool, words)) > 0 &&
			   adjacent_worth_it(words, count, leaf->field_mask)) {
			ret = query_phrase_prove(index, words, count, value,
						 leaf->field_mask, universe,
						 set, proven, error_r);
		}
	}
	if (ret == 0) {
		roaring_bitmap_and_inplace(proven, universe);
		roaring_bitmap_or_inplace(set, proven);
		roaring_bitmap_or_inplace(def, proven);
	}
	roaring_bitmap_free(proven);
	pool_unref(&pool);
	return ret;
}

/* ---- dtgrams (casidx-dtgram.h, doc/search-semantics.md) ---- */

/* Docs having gram in a field of mask, or'ed into docs. */
static int dtgram_docs(struct casidx_index *index, const char *gram,
		       unsigned int mask, roaring_bitmap_t *docs,
		       const char **error_r)
{
	enum casidx_field field;

	for (field = 0; field < CASIDX_FIELD_COUNT; field++) {
		if ((mask & CASIDX_FIELD_MASK(field)) != 0 &&
		    casidx_index_lookup_dtgram(index, field, gram,
					       strlen(gram), docs,
					       error_r) < 0)
			return -1;
	}
	return 0;
}

/* Docs whose dtgrams of the fields of mask may be incomplete. */
static int dtgram_partial_docs(struct casidx_index *index, unsigned int mask,
			       const roaring_bitmap_t *universe,
			       roaring_bitmap_t **docs_r, const char **error_r)
{
	if (query_marker_docs(index, CASIDX_TERM_DTPARTIAL, mask, universe,
			      docs_r, error_r) < 0)
		return -1;
	casidx_index_add_docs_without_dtgrams(index, *docs_r);
	return 0;
}

static void query_dtgrams_free(roaring_bitmap_t **cand, roaring_bitmap_t **def)
{
	if (*cand != NULL)
		roaring_bitmap_free(*cand);
	if (*def != NULL)
		roaring_bitmap_free(*def);
	*cand = *def = NULL;
}

/* The body dtgram key's entry in seg: 1 found (positions read into
   docs_r and the arrays), 0 not there, -1 corrupted. */
static int dtgram_seg_positions(struct casidx_segment *seg, const char *gram,
				roaring_bitmap_t **docs_r,
				ARRAY_TYPE(uint32_t) *tfs,
				ARRAY_TYPE(uint32_t) *pos,
				ARRAY_TYPE(uint32_t) *pos_idx,
				const char **error_r)
{
	unsigned char key[CASIDX_DTGRAM_MAX_BYTES + 1];
	const struct casidx_term_entry *entry;
	struct casidx_segment_iter *iter;
	size_t len = strlen(gram);
	int ret, found = 0;

	i_assert(len <= CASIDX_DTGRAM_MAX_BYTES);
	key[0] = CASIDX_DTGRAM_KEY_CHAR(CASIDX_FIELD_BODY);
	memcpy(key + 1, gram, len);
	iter = casidx_segment_iter_init(seg, key, len + 1);
	ret = casidx_segment_iter_next(iter, &entry);
	if (ret > 0 && entry->key_len == len + 1) {
		found = casidx_segment_read_positions(seg, entry, docs_r, tfs,
						      pos, pos_idx, error_r);
	}
	if (casidx_segment_iter_deinit(&iter, error_r) < 0 || ret < 0)
		found = -1;
	return found;
}

/* Chain step i: the starts p (uid -> bitmap) where seq[i] is at p + i,
   and for i > 0 p is one of prev's. */
static void dtgram_chain_step(unsigned int i, const roaring_bitmap_t *docs,
			      const ARRAY_TYPE(uint32_t) *pos,
			      const ARRAY_TYPE(uint32_t) *pos_idx,
			      const roaring_bitmap_t *candidates,
			      HASH_TABLE_TYPE(uid_starts) prev,
			      HASH_TABLE_TYPE(uid_starts) cur)
{
	const uint32_t *codes, *idx = array_front(pos_idx);
	roaring_uint32_iterator_t *it;
	roaring_bitmap_t *bm, *pbm = NULL;
	unsigned int d, j;
	uint32_t uid, p;

	if (array_count(pos) == 0)
		return;
	codes = array_front(pos);
	it = roaring_create_iterator(docs);
	for (d = 0; it->has_value; roaring_advance_uint32_iterator(it), d++) {
		uid = it->current_value;
		if (!roaring_bitmap_contains(candidates, uid))
			continue;
		if (i > 0 && (pbm = hash_table_lookup(prev,
					POINTER_CAST(uid))) == NULL)
			continue;
		bm = NULL;
		for (j = idx[d]; j < idx[d + 1]; j++) {
			if (CASIDX_POS_OF(codes[j]) < i)
				continue;
			p = CASIDX_POS_OF(codes[j]) - i;
			if (i > 0 && !roaring_bitmap_contains(pbm, p))
				continue;
			if (bm == NULL) {
				bm = bitmap_create();
				hash_table_insert(cur, POINTER_CAST(uid), bm);
			}
			roaring_bitmap_add(bm, p);
		}
	}
	roaring_free_uint32_iterator(it);
}

/* The candidates whose body holds the value's whole image: every pair
   of it is a dtgram (all_pairs), and seq[0], seq[1], ... sit at
   positions p, p + 1, ... of the body's dtgram codes, which count the
   code points of one run of the text as Dovecot's search reads it
   (casidx_query_add_dtgram()). */
static int dtgram_chain_docs(struct casidx_index *index,
			     const struct casidx_dtgram_value *dtv,
			     const roaring_bitmap_t *candidates,
			     roaring_bitmap_t *proven, const char **error_r)
{
	HASH_TABLE_TYPE(uid_starts) prev, cur;
	ARRAY_TYPE(uint32_t) tfs, pos, pos_idx;
	struct hash_iterate_context *iter;
	struct casidx_segment **segs;
	const char *const *seq;
	roaring_bitmap_t *docs, *bm;
	unsigned int s, nsegs, i, n;
	void *key;
	int ret = 0;

	seq = array_get(&dtv->seq, &n);
	i_array_init(&tfs, 16);
	i_array_init(&pos, 64);
	i_array_init(&pos_idx, 16);
	nsegs = casidx_index_get_open_segments(index, &segs);
	for (s = 0; s < nsegs && ret == 0; s++) {
		if (!casidx_segment_has_dtgrams(segs[s]))
			continue;
		i_zero(&prev);
		hash_table_create_direct(&cur, default_pool, 0);
		for (i = 0; i < n; i++) {
			ret = dtgram_seg_positions(segs[s], seq[i], &docs,
						   &tfs, &pos, &pos_idx,
						   error_r);
			if (ret <= 0)
				break;
			phrase_starts_free(&prev);
			prev = cur;
			hash_table_create_direct(&cur, default_pool, 0);
			dtgram_chain_step(i, docs, &pos, &pos_idx, candidates,
					  prev, cur);
			roaring_bitmap_free(docs);
			if (hash_table_count(cur) == 0)
				break;
		}
		if (ret > 0 && i == n) {
			iter = hash_table_iterate_init(cur);
			while (hash_table_iterate(iter, cur, &key, &bm)) {
				roaring_bitmap_add(proven,
					POINTER_CAST_TO(key, uint32_t));
			}
			hash_table_iterate_deinit(&iter);
		}
		if (ret > 0)
			ret = 0;
		phrase_starts_free(&prev);
		phrase_starts_free(&cur);
	}
	array_free(&tfs);
	array_free(&pos);
	array_free(&pos_idx);
	if (ret < 0)
		casidx_index_set_corrupted(index);
	return ret;
}

/* A value with dtgrams: its candidates are the docs with every one of
   them in a field of the leaf (or with DTPARTIAL there), in cand_r; in
   def_r the docs where the index proves it: a value whose image is
   exactly two code points, found as a dtgram in the body, or whose
   pairs all are dtgrams that follow each other in the body (BODY,
   TEXT).
   Both NULL when the value has no dtgrams or the leaf's fields have
   none. */
static int query_leaf_dtgrams(struct casidx_index *index,
			      const struct casidx_query_leaf *leaf,
			      const roaring_bitmap_t *universe,
			      roaring_bitmap_t **cand_r,
			      roaring_bitmap_t **def_r, const char **error_r)
{
	unsigned int i, count, mask = dtgram_field_mask(leaf->field_mask);
	struct casidx_dtgram_value dtv;
	roaring_bitmap_t *cand = NULL, *docs, *partial;
	const char *const *grams;
	pool_t pool;
	int ret = 0;

	*cand_r = *def_r = NULL;
	if (mask == 0)
		return 0;
	pool = pool_alloconly_create("casidx dtgrams", 256);
	casidx_dtgram_value(leaf->value, pool, &dtv);
	grams = array_get(&dtv.grams, &count);
	if (count == 0) {
		pool_unref(&pool);
		return 0;
	}
	for (i = 0; i < count && i < CASIDX_QUERY_MAX_TOKENS; i++) {
		if (cand != NULL && roaring_bitmap_is_empty(cand))
			break;
		docs = bitmap_create();
		if (dtgram_docs(index, grams[i], mask, docs, error_r) < 0) {
			roaring_bitmap_free(docs);
			ret = -1;
			break;
		}
		if (cand == NULL)
			cand = docs;
		else {
			roaring_bitmap_and_inplace(cand, docs);
			roaring_bitmap_free(docs);
		}
	}
	if (ret == 0 && dtv.image_len == 2 && count == 1 &&
	    (mask & CASIDX_FIELD_MASK(CASIDX_FIELD_BODY)) != 0) {
		*def_r = bitmap_create();
		ret = dtgram_docs(index, grams[0],
				  CASIDX_FIELD_MASK(CASIDX_FIELD_BODY),
				  *def_r, error_r);
	} else if (ret == 0 && dtv.all_pairs &&
		   !roaring_bitmap_is_empty(cand) &&
		   (mask & CASIDX_FIELD_MASK(CASIDX_FIELD_BODY)) != 0) {
		*def_r = bitmap_create();
		ret = dtgram_chain_docs(index, &dtv, cand, *def_r, error_r);
	}
	if (ret == 0 &&
	    (ret = dtgram_partial_docs(index, mask, universe, &partial,
				       error_r)) == 0) {
		roaring_bitmap_or_inplace(cand, partial);
		roaring_bitmap_free(partial);
	}
	pool_unref(&pool);
	if (ret < 0) {
		if (cand != NULL)
			roaring_bitmap_free(cand);
		if (*def_r != NULL)
			roaring_bitmap_free(*def_r);
		*def_r = NULL;
		return -1;
	}
	roaring_bitmap_and_inplace(cand, universe);
	if (*def_r != NULL)
		roaring_bitmap_and_inplace(*def_r, cand);
	*cand_r = cand;
	return 0;
}

static int query_leaf(struct casidx_index *index,
		      struct casidx_tokenizer *tok,
		      const struct casidx_query_leaf *leaf,
		      const roaring_bitmap_t *universe,
		      struct casidx_query_scores *scores,
		      roaring_bitmap_t **definite_r, roaring_bitmap_t **maybe_r,
		      const char **error_r);

/* The leaf evaluated over raw (a copy of it with another field mask,
   no NOT, no FUZZY) within universe: its candidates or'ed into maybe. */
static int address_raw_add(struct casidx_index *index,
			   struct casidx_tokenizer *tok,
			   const struct casidx_query_leaf *raw,
			   const roaring_bitmap_t *universe,
			   roaring_bitmap_t *maybe, const char **error_r)
{
	roaring_bitmap_t *def, *may;

	if (query_leaf(index, tok, raw, universe, NULL, &def, &may,
		       error_r) < 0)
		return -1;
	roaring_bitmap_or_inplace(maybe, may);
	roaring_bitmap_free(def);
	roaring_bitmap_free(may);
	return 0;
}

/* FROM/TO/CC/BCC fields hold Dovecot's normalised address lists, which
   drop group names and comments that Dovecot's own search sees (e.g.
   "undisclosed-recipients:;"). The raw values of the top-level headers
   are indexed too: what matches there is added to maybe, so Dovecot
   checks it (found on the whole corpus: TO "t" missed 8 messages).
   Since segment version 4 each of the four headers has a namespace of
   its own (CASIDX_FIELD_RAW_*); a document written before (an older
   segment's, or one a merge carried over: RAWHDR) has them in the
   header field with every other header, which is looked up for those
   documents only. */
static int address_leaf_add_raw(struct casidx_index *index,
				struct casidx_tokenizer *tok,
				const struct casidx_query_leaf *leaf,
				const roaring_bitmap_t *universe,
				roaring_bitmap_t *maybe, const char **error_r)
{
	struct casidx_query_leaf raw = *leaf;
	roaring_bitmap_t *old;
	enum casidx_field field;
	int ret = 0;

	raw.match_not = FALSE;
	raw.fuzzy = FALSE;
	raw.field_mask = 0;
	for (field = CASIDX_FIELD_FROM; field <= CASIDX_FIELD_BCC; field++) {
		if ((leaf->field_mask & CASIDX_FIELD_MASK(field)) != 0) {
			raw.field_mask |=
				CASIDX_FIELD_MASK(CASIDX_FIELD_RAW(field));
		}
	}
	if (address_raw_add(index, tok, &raw, universe, maybe, error_r) < 0 ||
	    query_marker_docs(index, CASIDX_TERM_RAWHDR,
			      CASIDX_FIELD_MASK(CASIDX_FIELD_HEADER), universe,
			      &old, error_r) < 0)
		return -1;
	casidx_index_add_docs_without_raw_addresses(index, old);
	roaring_bitmap_and_inplace(old, universe);
	if (!roaring_bitmap_is_empty(old)) {
		raw.field_mask = CASIDX_FIELD_MASK(CASIDX_FIELD_HEADER);
		ret = address_raw_add(index, tok, &raw, old, maybe, error_r);
	}
	roaring_bitmap_free(old);
	return ret;
}

/* Evaluate one leaf into definite/maybe (maybe includes definite),
   with match_not applied. Each lookup token's candidates are the docs
   with a term containing it, plus, for an ASCII token (it could lie in
   a run of encoded data the index skipped), the docs marked UNINDEXED
   in the leaf's fields. Definite only for a single ASCII word
   (value_is_definite()), found in a term that was not folded
   (CASIDX_TERM_FOLDED_PREFIX). */
static int query_leaf(struct casidx_index *index,
		      struct casidx_tokenizer *tok,
		      const struct casidx_query_leaf *leaf,
		      const roaring_bitmap_t *universe,
		      struct casidx_query_scores *scores,
		      roaring_bitmap_t **definite_r, roaring_bitmap_t **maybe_r,
		      const char **error_r)
{
	struct tokens_ctx tctx;
	const struct query_token *tokens;
	roaring_bitmap_t *set = NULL, *docs, *def = NULL, *inv;
	roaring_bitmap_t *unindexed = NULL, *plain, *typo, *fuzzy = NULL;
	roaring_bitmap_t *dt_cand, *dt_def, *partial = NULL;
	struct query_token *qt;
	unsigned int i, j, oi, count, *order;
	bool definite;
	pool_t pool;
	int ret = 0;

	if (query_leaf_dtgrams(index, leaf, universe, &dt_cand, &dt_def,
			       error_r) < 0)
		return -1;
	pool = pool_alloconly_create("casidx query leaf", 512);
	query_tokenize(tok, leaf->value, pool, &tctx);
	if (casidx_dtgram_image_is_ascii(leaf->value)) {
		/* "ı" is "I" to Dovecot: it may match in encoded runs */
		array_foreach_modifiable(&tctx.tokens, qt)
			qt->ascii = TRUE;
	}
	tokens = array_get(&tctx.tokens, &count);
	i_assert(count > 0 || dt_cand != NULL);
	definite = value_is_definite(leaf->value, &tctx);
	if (query_marker_docs(index, CASIDX_TERM_UNINDEXED, leaf->field_mask,
			      universe, &unindexed, error_r) < 0) {
		pool_unref(&pool);
		query_dtgrams_free(&dt_cand, &dt_def);
		return -1;
	}
	/* text the index did not get as Dovecot reads it (DTPARTIAL
	   marker: an attached message's address header, a truncated
	   document) may hold any word, not only encoded ASCII runs */
	for (i = 0; i < count; i++) {
		if (!tokens[i].ascii)
			break;
	}
	if (i < count &&
	    query_marker_docs(index, CASIDX_TERM_DTPARTIAL, leaf->field_mask,
			      universe, &partial, error_r) < 0) {
		roaring_bitmap_free(unindexed);
		pool_unref(&pool);
		query_dtgrams_free(&dt_cand, &dt_def);
		return -1;
	}
	/* Each token is a scan of the term dictionary, and a value of
	   several tokens is only ever "maybe": Dovecot checks the
	   candidates against the mail. So the first
	   CASIDX_QUERY_MAX_TOKENS narrow it down well enough, and a search
	   of thousands of words (64 kB of them took 4.5 s) costs no more
	   than that; none is needed once no candidate is left. */
	/* The candidates are the intersection, so each scan needs only
	   the docs still in it: the dtgrams' candidates first, then the
	   longest (most selective) tokens, so that a short one ("com" of
	   "com/blog", the "u" of "ù") passes over the terms of documents
	   already out instead of scoring all their postings. FUZZY keeps
	   every token's folded matches. */
	if (dt_cand != NULL && !leaf->fuzzy)
		set = roaring_bitmap_copy(dt_cand);
	order = p_new(pool, unsigned int, count + 1);
	for (i = 0; i < count; i++) {
		for (j = i; j > 0 && tokens[order[j - 1]].len < tokens[i].len;
		     j--)
			order[j] = order[j - 1];
		order[j] = i;
	}
	for (oi = 0; oi < count && oi < CASIDX_QUERY_MAX_TOKENS; oi++) {
		i = order[oi];
		if (set != NULL && roaring_bitmap_is_empty(set) &&
		    (fuzzy == NULL || roaring_bitmap_is_empty(fuzzy)))
			break;
		if (query_token_docs_in(index, &tokens[i],
					CASIDX_MATCH_SUBSTRING,
					leaf->field_mask, universe,
					leaf->fuzzy ? NULL : set,
					leaf->match_not ? NULL : scores,
					&docs, definite ? &plain : NULL,
					error_r) < 0) {
			ret = -1;
			break;
		}
		if (definite)
			def = plain;
		if (leaf->fuzzy && !leaf->match_not) {
			if (query_token_docs(index, &tokens[i],
					     CASIDX_MATCH_TYPO,
					     leaf->field_mask, universe,
					     scores, &typo, NULL,
					     error_r) < 0) {
				roaring_bitmap_free(docs);
				ret = -1;
				break;
			}
			/* folded and typo matches count under FUZZY */
			roaring_bitmap_or_inplace(typo, docs);
			if (fuzzy == NULL)
				fuzzy = typo;
			else {
				roaring_bitmap_and_inplace(fuzzy, typo);
				roaring_bitmap_free(typo);
			}
		}
		if (tokens[i].ascii)
			roaring_bitmap_or_inplace(docs, unindexed);
		else if (partial != NULL)
			roaring_bitmap_or_inplace(docs, partial);
		if (set == NULL)
			set = docs;
		else {
			roaring_bitmap_and_inplace(set, docs);
			roaring_bitmap_free(docs);
		}
	}
	roaring_bitmap_free(unindexed);
	if (partial != NULL)
		roaring_bitmap_free(partial);
	pool_unref(&pool);
	if (ret < 0) {
		if (set != NULL)
			roaring_bitmap_free(set);
		if (def != NULL)
			roaring_bitmap_free(def);
		if (fuzzy != NULL)
			roaring_bitmap_free(fuzzy);
		query_dtgrams_free(&dt_cand, &dt_def);
		return -1;
	}
	if (dt_cand != NULL) {
		/* both are supersets of the matches (FUZZY: the tokens'
		   folded matches are wanted) */
		if (set == NULL)
			set = roaring_bitmap_copy(dt_cand);
		else if (!leaf->fuzzy)
			roaring_bitmap_and_inplace(set, dt_cand);
	}
	roaring_bitmap_and_inplace(set, universe);
	if (def == NULL)
		def = bitmap_create();
	roaring_bitmap_and_inplace(def, set);
	if (dt_def != NULL) {
		roaring_bitmap_or_inplace(def, dt_def);
		roaring_bitmap_or_inplace(set, dt_def);
	}
	query_dtgrams_free(&dt_cand, &dt_def);
	if (!leaf->fuzzy && query_leaf_prove(index, leaf, definite, universe,
					     set, def, error_r) < 0) {
		roaring_bitmap_free(set);
		roaring_bitmap_free(def);
		if (fuzzy != NULL)
			roaring_bitmap_free(fuzzy);
		return -1;
	}
	if ((leaf->field_mask & ADDRESS_FIELDS_MASK) != 0 &&
	    (leaf->field_mask & CASIDX_FIELD_MASK(CASIDX_FIELD_HEADER)) == 0 &&
	    address_leaf_add_raw(index, tok, leaf, universe, set,
				 error_r) < 0) {
		roaring_bitmap_free(set);
		roaring_bitmap_free(def);
		return -1;
	}
	if (fuzzy != NULL) {
		/* FUZZY (RFC 6203): what the index matched loosely is the
		   answer, definite; the exact candidates stay maybe */
		roaring_bitmap_and_inplace(fuzzy, universe);
		roaring_bitmap_or_inplace(def, fuzzy);
		roaring_bitmap_or_inplace(set, fuzzy);
		roaring_bitmap_free(fuzzy);
	}

	if (!leaf->match_not) {
		*definite_r = def;
		*maybe_r = set;
		return 0;
	}
	/* NOT: certainly true where the positive certainly fails */
	inv = roaring_bitmap_andnot(universe, set);
	*maybe_r = roaring_bitmap_andnot(universe, def);
	*definite_r = inv;
	roaring_bitmap_free(set);
	roaring_bitmap_free(def);
	return 0;
}

int casidx_query_eval(struct casidx_index *index,
		      struct casidx_tokenizer *tok,
		      const struct casidx_query_leaf *leaves,
		      unsigned int count, bool and_args,
		      struct casidx_query_result *result_r,
		      const char **error_r)
{
	roaring_bitmap_t *universe, *def, *maybe;
	struct casidx_query_scores *scores;
	pool_t pool;
	unsigned int i;

	i_zero(result_r);
	pool = pool_alloconly_create("casidx query scores", 4096);
	scores = p_new(pool, struct casidx_query_scores, 1);
	scores->pool = pool;
	hash_table_create_direct(&scores->map, pool, 0);
	result_r->scores = scores;

	universe = casidx_index_get_universe(index);
	if (and_args) {
		result_r->definite = roaring_bitmap_copy(universe);
		result_r->maybe = roaring_bitmap_copy(universe);
	} else {
		result_r->definite = bitmap_create();
		result_r->maybe = bitmap_create();
	}
	for (i = 0; i < count; i++) {
		if (query_leaf(index, tok, &leaves[i], universe, scores,
			       &def, &maybe, error_r) < 0) {
			roaring_bitmap_free(universe);
			casidx_query_result_free(result_r);
			return -1;
		}
		if (and_args) {
			roaring_bitmap_and_inplace(result_r->definite, def);
			roaring_bitmap_and_inplace(result_r->maybe, maybe);
		} else {
			roaring_bitmap_or_inplace(result_r->definite, def);
			roaring_bitmap_or_inplace(result_r->maybe, maybe);
		}
		roaring_bitmap_free(def);
		roaring_bitmap_free(maybe);
	}
	roaring_bitmap_andnot_inplace(result_r->maybe, result_r->definite);
	roaring_bitmap_free(universe);
	return 0;
}

void casidx_query_result_free(struct casidx_query_result *result)
{
	if (result->definite != NULL)
		roaring_bitmap_free(result->definite);
	if (result->maybe != NULL)
		roaring_bitmap_free(result->maybe);
	if (result->scores != NULL) {
		hash_table_destroy(&result->scores->map);
		pool_unref(&result->scores->pool);
	}
	i_zero(result);
}

float casidx_query_result_score(const struct casidx_query_result *result,
				uint32_t uid)
{
	const double *value;

	value = hash_table_lookup(result->scores->map, POINTER_CAST(uid));
	return value == NULL ? 0 : (float)*value;
}
