/* casidx query evaluation; semantics in casidx-query.h and
   doc/search-semantics.md. */

#include "lib.h"
#include "array.h"
#include "hash.h"
#include "casidx-tokenizer.h"
#include "casidx-bm25.h"
#include "casidx-query.h"

#include <ctype.h>

/* Relative weight of a hit per field (BM25F-style). */
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
	uint32_t mask = 1U << field;

	i_assert(strcmp(marker, CASIDX_TERM_UNINDEXED) == 0);

	if ((state->markers & mask) != 0)
		return;
	state->markers |= mask;
	casidx_index_writer_add_term(writer, field, marker,
				     CASIDX_TERM_MARKER_LEN);
}

void casidx_query_add_token(struct casidx_index_writer *writer,
			    enum casidx_field field,
			    const struct casidx_token *token,
			    struct casidx_doc_state *state)
{
	size_t budget = field == CASIDX_FIELD_BODY ?
		CASIDX_ENCODED_BODY_BUDGET : CASIDX_ENCODED_HEADER_BUDGET;

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
		casidx_index_writer_add_term(writer, field, token->term,
					     token->term_len);
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

bool casidx_query_value_is_answerable(struct casidx_tokenizer *tok,
				      const char *value)
{
	struct tokens_ctx ctx;
	pool_t pool;
	bool ret;

	pool = pool_alloconly_create("casidx query tokens", 256);
	query_tokenize(tok, value, pool, &ctx);
	ret = array_count(&ctx.tokens) > 0;
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
		if (!roaring_bitmap_contains(ctx->universe, it->current_value))
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
static int query_token_docs(struct casidx_index *index,
			    const struct query_token *token,
			    enum casidx_match match, unsigned int field_mask,
			    const roaring_bitmap_t *universe,
			    struct casidx_query_scores *scores,
			    roaring_bitmap_t **docs_r,
			    roaring_bitmap_t **plain_r, const char **error_r)
{
	struct scan_ctx ctx;
	enum casidx_field field;

	i_zero(&ctx);
	ctx.docs = bitmap_create();
	/* collected only when asked for: a second union per term */
	ctx.plain = plain_r == NULL ? NULL : bitmap_create();
	ctx.universe = universe;
	ctx.scores = scores;
	ctx.token = token;
	ctx.match = match;
	ctx.total_docs = roaring_bitmap_get_cardinality(universe);
	ctx.pool = pool_alloconly_create("casidx scan", 1024);
	for (field = 0; field < CASIDX_FIELD_COUNT; field++) {
		if ((field_mask & CASIDX_FIELD_MASK(field)) == 0)
			continue;
		ctx.field = field;
		ctx.weight = field_weights[field];
		ctx.avg_len = casidx_index_get_avg_len(index, field);
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

#define ADDRESS_FIELDS_MASK \
	(CASIDX_FIELD_MASK(CASIDX_FIELD_FROM) | \
	 CASIDX_FIELD_MASK(CASIDX_FIELD_TO) | \
	 CASIDX_FIELD_MASK(CASIDX_FIELD_CC) | \
	 CASIDX_FIELD_MASK(CASIDX_FIELD_BCC))

static int query_leaf(struct casidx_index *index,
		      struct casidx_tokenizer *tok,
		      const struct casidx_query_leaf *leaf,
		      const roaring_bitmap_t *universe,
		      struct casidx_query_scores *scores,
		      roaring_bitmap_t **definite_r, roaring_bitmap_t **maybe_r,
		      const char **error_r);

/* FROM/TO/CC/BCC fields hold Dovecot's normalised address lists, which
   drop group names and comments that Dovecot's own search sees (e.g.
   "undisclosed-recipients:;"). The raw values of the top-level address
   headers are in the other-headers field: what matches there is added
   to maybe, so Dovecot checks it (found on the whole corpus: TO "t"
   missed 8 messages). */
static int address_leaf_add_raw(struct casidx_index *index,
				struct casidx_tokenizer *tok,
				const struct casidx_query_leaf *leaf,
				const roaring_bitmap_t *universe,
				roaring_bitmap_t *maybe, const char **error_r)
{
	struct casidx_query_leaf raw = *leaf;
	roaring_bitmap_t *def, *may;

	raw.field_mask = CASIDX_FIELD_MASK(CASIDX_FIELD_HEADER);
	raw.match_not = FALSE;
	raw.fuzzy = FALSE;
	if (query_leaf(index, tok, &raw, universe, NULL, &def, &may,
		       error_r) < 0)
		return -1;
	roaring_bitmap_or_inplace(maybe, may);
	roaring_bitmap_free(def);
	roaring_bitmap_free(may);
	return 0;
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
	unsigned int i, count;
	bool definite;
	pool_t pool;
	int ret = 0;

	pool = pool_alloconly_create("casidx query leaf", 512);
	query_tokenize(tok, leaf->value, pool, &tctx);
	tokens = array_get(&tctx.tokens, &count);
	i_assert(count > 0);
	definite = value_is_definite(leaf->value, &tctx);
	if (query_marker_docs(index, CASIDX_TERM_UNINDEXED, leaf->field_mask,
			      universe, &unindexed, error_r) < 0) {
		pool_unref(&pool);
		return -1;
	}
	/* Each token is a scan of the term dictionary, and a value of
	   several tokens is only ever "maybe": Dovecot checks the
	   candidates against the mail. So the first
	   CASIDX_QUERY_MAX_TOKENS narrow it down well enough, and a search
	   of thousands of words (64 kB of them took 4.5 s) costs no more
	   than that; none is needed once no candidate is left. */
	for (i = 0; i < count && i < CASIDX_QUERY_MAX_TOKENS; i++) {
		if (set != NULL && roaring_bitmap_is_empty(set) &&
		    (fuzzy == NULL || roaring_bitmap_is_empty(fuzzy)))
			break;
		if (query_token_docs(index, &tokens[i], CASIDX_MATCH_SUBSTRING,
				     leaf->field_mask, universe,
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
		if (set == NULL)
			set = docs;
		else {
			roaring_bitmap_and_inplace(set, docs);
			roaring_bitmap_free(docs);
		}
	}
	roaring_bitmap_free(unindexed);
	pool_unref(&pool);
	if (ret < 0) {
		if (set != NULL)
			roaring_bitmap_free(set);
		if (def != NULL)
			roaring_bitmap_free(def);
		if (fuzzy != NULL)
			roaring_bitmap_free(fuzzy);
		return -1;
	}
	roaring_bitmap_and_inplace(set, universe);
	if (def == NULL)
		def = bitmap_create();
	roaring_bitmap_and_inplace(def, set);
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
