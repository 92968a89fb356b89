#ifndef CASIDX_QUERY_H
#define CASIDX_QUERY_H

/* casidx query evaluation: IMAP SEARCH substring semantics over a
   snapshot of one mailbox's index (doc/search-semantics.md).

   A leaf is "value occurs (as a substring) in one of these fields".
   The value is tokenized like indexed text; each token matches every
   dictionary term that contains it. A value with non-ASCII characters
   also has dtgrams (casidx-dtgram.h): the qualifying code point pairs
   of its image in Dovecot's decomposed titlecase form, the form
   Dovecot's own search compares. Its candidates are then also limited
   to the docs that have every one of its dtgrams in a field of the
   leaf (body, subject, other headers; FROM/TO/CC/BCC alone have none),
   plus the docs whose dtgrams there may be incomplete (DTPARTIAL,
   segments older than version 3). A FROM/TO/CC/BCC leaf also takes as
   maybe what its value matches in the raw values of the same headers
   (CASIDX_FIELD_RAW_*, or the header field for documents written
   before segment version 4). Results:
     definite  the leaf certainly holds: a single pure-ASCII
               alphanumeric token found inside an indexed term; or the
               proofs of doc/search-semantics.md (punctuation in one
               term, ASCII phrases by positions, and, for BODY and
               TEXT, a value whose image is one dtgram found in the
               body or a chain of dtgrams found one after the other
               in the body's dtgram positions)
     maybe     the leaf may hold; Dovecot verifies it (multi-token
               values, punctuation, non-ASCII: folding can over-match;
               a non-ASCII value with an ASCII pair inside, or whose
               dtgrams are not found in a row)
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
/* TEXT: every field and the raw address namespaces */
#define CASIDX_FIELD_MASK_ALL ((1U << CASIDX_FIELD_SPACE_COUNT) - 1)

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
   search, most of what those searches cost. Headers keep 16 kB: the
   DKIM and ARC signatures of list mail (about 1 kB of terms a message,
   up to 7 kB after several ARC hops), which otherwise make every TEXT
   search of such mail "maybe" and so re-read by Dovecot; 2 kB left 476
   of the shared corpus's 9,567 messages maybe for every ASCII TEXT
   search (about 300 ms each), 16 kB none, for 0.9 % more index. */
#define CASIDX_ENCODED_BODY_BUDGET (256 * 1024)
#define CASIDX_ENCODED_HEADER_BUDGET (16 * 1024)

/* Dtgram occurrences kept per document and field: past this the field
   gets DTPARTIAL (every value with dtgrams is "maybe" there). 64 k
   covers every message of the shared corpus but a few large non-Latin
   ones. */
#define CASIDX_DTGRAM_DOC_MAX (64 * 1024)

/* What the current document has been given: zero it at each new
   document. */
struct casidx_doc_state {
	/* UNINDEXED markers added: 1 << field */
	uint32_t markers;
	/* DTPARTIAL markers added: 1 << field */
	uint32_t dt_markers;
	uint32_t dtgrams[CASIDX_FIELD_COUNT];
	/* body dtgram positions: the run's code point index plus
	   dt_pos_base, which casidx_query_dtgram_restart() moves past
	   everything so far */
	uint32_t dt_pos_base, dt_pos_end;
	bool dt_no_positions;
	uint32_t encoded_bytes[CASIDX_FIELD_SPACE_COUNT];
	/* body positions: the tokenizer counts from 0 at each reset (each
	   MIME part), the index from pos_base, which
	   casidx_query_body_restart() moves past everything so far */
	uint32_t pos_base, pos_end;
	/* the body got text Dovecot's own search does not read as such
	   (HTML converted to text): no positions for the rest of it */
	bool no_positions;
};

/* Index a token into the writer's current document the way lookups
   expect it: its term, and the marker term (casidx-index.h) its flags
   call for, once per field. field may be a raw address namespace
   (CASIDX_FIELD_RAW_*). */
void casidx_query_add_token(struct casidx_index_writer *writer,
			    enum casidx_field field,
			    const struct casidx_token *token,
			    struct casidx_doc_state *state);
/* The tokenizer was reset for a new body part: its positions continue
   after a gap, so words of two parts are never adjacent. */
void casidx_query_body_restart(struct casidx_doc_state *state);
/* Add marker (CASIDX_TERM_UNINDEXED or _DTPARTIAL) to field, once. */
void casidx_query_add_marker(struct casidx_index_writer *writer,
			     enum casidx_field field, const char *marker,
			     struct casidx_doc_state *state);
/* Index a dtgram of the current document's field (up to
   CASIDX_DTGRAM_DOC_MAX, then DTPARTIAL); pos as casidx-dtgram.h gives
   it. Body dtgrams get position codes of position pos + dt_pos_base
   (kind WORD), so a
   value whose image is a chain of dtgrams is proven where they follow
   each other. */
void casidx_query_add_dtgram(struct casidx_index_writer *writer,
			     enum casidx_field field,
			     const unsigned char *gram, size_t gram_len,
			     uint32_t pos, struct casidx_doc_state *state);
/* The dtgram feeder was reset for a new run of the body: its positions
   continue after a gap, so no chain spans two runs. */
void casidx_query_dtgram_restart(struct casidx_doc_state *state);

/* TRUE if the index can answer a leaf of field_mask with value: it
   produces at least one token, or it has dtgrams and field_mask fields
   that hold them. Empty values, and punctuation-only ASCII values,
   can't be answered. */
bool casidx_query_value_is_answerable(struct casidx_tokenizer *tok,
				      const char *value,
				      unsigned int field_mask);

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
