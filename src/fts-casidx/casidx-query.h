#ifndef CASIDX_QUERY_H
#define CASIDX_QUERY_H

/* casidx query evaluation: IMAP SEARCH substring semantics over a
   snapshot of one mailbox's index (doc/search-semantics.md).

   A leaf is "value occurs (as a substring) in one of these fields".
   The value is tokenized like indexed text; each token matches every
   dictionary term that contains it. Results:
     definite  the leaf certainly holds (single pure-ASCII alphanumeric
               token found inside an indexed term)
     maybe     the leaf may hold; Dovecot verifies it (multi-token
               values, punctuation, non-ASCII: folding can over-match)
   A UID absent from both certainly doesn't match. match_not is applied
   against the universe (every indexed, not expunged UID, including
   messages that produced no tokens). */

/* A search value's tokens used to find its candidates (the rest are
   left to Dovecot's check of the candidates). */
#define CASIDX_QUERY_MAX_TOKENS 32

#include "casidx-index.h"

struct casidx_tokenizer;
struct casidx_token;

#define CASIDX_FIELD_MASK(field) (1U << (field))
#define CASIDX_FIELD_MASK_ALL ((1U << CASIDX_FIELD_COUNT) - 1)

struct casidx_query_leaf {
	unsigned int field_mask;
	const char *value;
	bool match_not;
	/* SEARCH FUZZY (RFC 6203), ignored under NOT: every atom may also
	   match folded ("munoz" finds "muñoz") and within one edit of a
	   term's beginning (CASIDX_MATCH_TYPO), as definite; adjacency of
	   several words is not required */
	bool fuzzy;
};

struct casidx_query_result {
	roaring_bitmap_t *definite;
	/* maybe excludes definite */
	roaring_bitmap_t *maybe;
	/* BM25 scores of definite and maybe UIDs */
	struct casidx_query_scores *scores;
};

/* Encoded-looking text kept per document and field, in bytes of
   window terms: a PGP signature, encoded tokens or the inline base64 of
   a broken MIME message (whose "attachment" Dovecot's own search reads
   as text) in a body are searchable exactly; past this the field is
   marked UNINDEXED, and every ASCII search re-reads that message. 256
   kB covers every body of the shared corpus (the largest such run is
   126 kB): 4 kB left three messages maybe for every single-word BODY
   search, most of what those searches cost. Headers keep 2 kB: enough for the DKIM and ARC
   signatures most list mail carries (about 1 kB of terms a message),
   which otherwise make every TEXT search of such mail "maybe" and so
   re-read by Dovecot. */
#define CASIDX_ENCODED_BODY_BUDGET (256 * 1024)
#define CASIDX_ENCODED_HEADER_BUDGET 2048

/* What the current document has been given: zero it at each new
   document. */
struct casidx_doc_state {
	/* UNINDEXED markers added: 1 << field */
	uint32_t markers;
	uint32_t encoded_bytes[CASIDX_FIELD_COUNT];
};

/* Index a token into the writer's current document the way lookups
   expect it: its term, and the marker term (casidx-index.h) its flags
   call for, once per field. */
void casidx_query_add_token(struct casidx_index_writer *writer,
			    enum casidx_field field,
			    const struct casidx_token *token,
			    struct casidx_doc_state *state);
/* Add marker (CASIDX_TERM_UNINDEXED) to field, once. */
void casidx_query_add_marker(struct casidx_index_writer *writer,
			     enum casidx_field field, const char *marker,
			     struct casidx_doc_state *state);

/* TRUE if value produces at least one token, i.e. the index can answer
   a leaf with it. Empty or punctuation-only values can't be answered. */
bool casidx_query_value_is_answerable(struct casidx_tokenizer *tok,
				      const char *value);

/* Evaluate leaves combined with AND (and_args) or OR. The index must be
   refreshed by the caller. Returns 0 if ok, -1 on error. */
int casidx_query_eval(struct casidx_index *index,
		      struct casidx_tokenizer *tok,
		      const struct casidx_query_leaf *leaves,
		      unsigned int count, bool and_args,
		      struct casidx_query_result *result_r,
		      const char **error_r);
void casidx_query_result_free(struct casidx_query_result *result);
/* Score of uid (0 if it got none). */
float casidx_query_result_score(const struct casidx_query_result *result,
				uint32_t uid);

#endif
