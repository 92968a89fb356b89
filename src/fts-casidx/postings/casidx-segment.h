#ifndef CASIDX_SEGMENT_H
#define CASIDX_SEGMENT_H

/* casidx immutable segment: one file holding the postings of a batch of
   messages (doc id = IMAP UID) of one mailbox. Layout (doc/casidx-format.md):

     header   "CXSEG001" | u32 version | u32 field count
     DOCS     roaring portable bitmap of every UID in the segment
     DOCLEN   u32 LE per doc (bitmap order) per field: token counts
     DICT     front-coded term blocks, each "u32 crc | u32 len | body"
     POSTINGS per term "u32 crc | varint len | roaring | varint n | tf*n"
     SPARSE   first key and offset of every DICT block
     footer   u64 table (offsets, lengths, CRCs, counts) | u32 crc |
              u32 0 | "CXSEGEND"

   Every byte is covered by a CRC32C that is verified before anything is
   parsed from it; roaring bitmaps are only deserialized from verified
   bytes with roaring_bitmap_portable_deserialize_safe(). Terms are keys
   "<field char><normalised term>", so each field is a contiguous range
   of the sorted dictionary. */

#include "array.h"
#include <roaring/roaring.h>

enum casidx_field {
	CASIDX_FIELD_BODY = 0,
	CASIDX_FIELD_FROM,
	CASIDX_FIELD_TO,
	CASIDX_FIELD_CC,
	CASIDX_FIELD_BCC,
	CASIDX_FIELD_SUBJECT,
	CASIDX_FIELD_HEADER,	/* every other header */

	CASIDX_FIELD_COUNT,

	/* Key namespaces without a DOCLEN column (segment version 4): the
	   raw values of the top-level From, To, Cc and Bcc headers, as
	   the message has them (comments, group names), which Dovecot's
	   own search sees and the normalised address fields above lack.
	   Keys '7', '8', '9', ':'; no dtgrams of their own (the values'
	   dtgrams are the header field's). */
	CASIDX_FIELD_RAW_FROM = CASIDX_FIELD_COUNT,
	CASIDX_FIELD_RAW_TO,
	CASIDX_FIELD_RAW_CC,
	CASIDX_FIELD_RAW_BCC,

	CASIDX_FIELD_SPACE_COUNT
};
/* The raw namespace of an address field (FROM..BCC). */
#define CASIDX_FIELD_RAW(field) \
	((enum casidx_field)(CASIDX_FIELD_RAW_FROM + \
			     ((field) - CASIDX_FIELD_FROM)))
/* First byte of a dictionary key, for every field < CASIDX_FIELD_SPACE_COUNT
   ('0'..':'). */
#define CASIDX_FIELD_KEY_CHAR(field) ((char)('0' + (field)))
/* First byte of a dtgram key (casidx-dtgram.h): "<dtgram char><gram>",
   a namespace of its own per field ('A'..'G'), so no term lookup of the
   field ('0'..'6') ever sees one. Only segment version 3 has them for
   all its documents. */
#define CASIDX_DTGRAM_KEY_CHAR(field) ((char)('A' + (field)))
/* Longest term accepted by the builder (longer terms are cut). */
#define CASIDX_TERM_MAX_BYTES 255

struct casidx_builder;
struct casidx_segment;
struct casidx_segment_iter;

struct casidx_term_entry {
	/* The full key (field char + term); valid until the next
	   iter_next() call. */
	const unsigned char *key;
	size_t key_len;
	uint32_t df;
	uint64_t post_offset, post_size;
};

/* Positions (segment version 2, doc/casidx-format.md): a term's
   occurrence in a doc may carry a code, CASIDX_POS_CODE(position, kind),
   where position is the word position within the doc's field. Codes of
   a (term, doc) are strictly ascending, except that a part may repeat
   its code (a compound with the same atom twice). An occurrence without
   a code may be anything (npos <= tf). */
enum casidx_pos_kind {
	/* a whole token (CASIDX_TOKEN_FLAG_RAW) */
	CASIDX_POS_KIND_WORD = 0,
	/* a whole token whose previous one (position - 1) ends exactly
	   one space before it (CASIDX_TOKEN_FLAG_SPACE_BEFORE) */
	CASIDX_POS_KIND_SPACE = 1,
	/* segment version 5: a part (CASIDX_TOKEN_FLAG_PART, not folded,
	   not CJK) at its compound's or word's position; it is never the
	   whole token of its text, so a phrase proof skips it */
	CASIDX_POS_KIND_PART = 2,
};
#define CASIDX_POS_CODE(pos, kind) (((uint32_t)(pos) << 2) | (uint32_t)(kind))
#define CASIDX_POS_OF(code) ((code) >> 2)
#define CASIDX_POS_KIND(code) ((enum casidx_pos_kind)((code) & 3))
/* no code (kind 3 is no kind) */
#define CASIDX_POS_NONE ((uint32_t)-1)
#define CASIDX_POS_MAX ((1U << 30) - 1)

/* Builder: collects postings in memory. */
struct casidx_builder *casidx_builder_create(void);
void casidx_builder_destroy(struct casidx_builder **builder);
/* Register a document. It becomes part of the segment's doc set even if
   it never gets any terms. Terms of a document must be added while it is
   the most recently added document. */
void casidx_builder_add_doc(struct casidx_builder *builder, uint32_t uid);
/* Add one occurrence of term to the current document's field (any
   field < CASIDX_FIELD_SPACE_COUNT; only those < CASIDX_FIELD_COUNT count
   in the document's lengths). Terms with NUL bytes are ignored,
   over-long terms are cut at a UTF-8 boundary. */
void casidx_builder_add_term(struct casidx_builder *builder,
			     enum casidx_field field,
			     const void *term, size_t term_len);
/* The same with a position code (CASIDX_POS_NONE: none). Codes of one
   (term, doc) out of order, or a doc added twice or out of UID order,
   drop the positions concerned (never wrong ones). */
void casidx_builder_add_term_pos(struct casidx_builder *builder,
				 enum casidx_field field,
				 const void *term, size_t term_len,
				 uint32_t pos_code);
/* Add one occurrence of a whole key (field char + term, at most
   CASIDX_TERM_MAX_BYTES + 1 bytes, no NUL) to the current document,
   without counting it in the document's field lengths (dtgram keys),
   with a position code (CASIDX_POS_NONE: none). */
void casidx_builder_add_key(struct casidx_builder *builder,
			    const unsigned char *key, size_t key_len,
			    uint32_t pos_code);
/* Merge support: add a whole posting (key = field char + term) and a
   document with known field lengths. */
void casidx_builder_add_posting(struct casidx_builder *builder,
				const unsigned char *key, size_t key_len,
				uint32_t uid, uint32_t tf);
void casidx_builder_add_posting_pos(struct casidx_builder *builder,
				    const unsigned char *key, size_t key_len,
				    uint32_t uid, uint32_t tf,
				    const uint32_t *pos, unsigned int npos);
void casidx_builder_add_doc_lens(struct casidx_builder *builder, uint32_t uid,
				 const uint32_t lens[CASIDX_FIELD_COUNT]);
/* Approximate bytes of memory used by collected postings. */
size_t casidx_builder_memory_used(const struct casidx_builder *builder);
unsigned int casidx_builder_doc_count(const struct casidx_builder *builder);
/* Highest UID added, 0 if none. */
uint32_t casidx_builder_max_uid(const struct casidx_builder *builder);
/* Forget every document with UID <= uid and its postings (a concurrent
   writer indexed them first). */
void casidx_builder_drop_upto(struct casidx_builder *builder, uint32_t uid);
/* Serialize the segment into output. Each term's postings are freed
   once written (they are most of the builder's memory, and the image
   grows meanwhile): afterwards only _doc_count(), _max_uid() and
   _destroy() may be called. */
void casidx_builder_serialize(struct casidx_builder *builder,
			      buffer_t *output);
/* Serialize (as above: the postings are freed) and write to path via a
   temp file + fsync + rename.
   The caller fsyncs the directory. */
int casidx_builder_write(struct casidx_builder *builder, const char *path,
			 bool fsync_file, const char **error_r);

/* Write data to path via path.tmp (+ fdatasync if fsync_file) and rename.
   The caller fsyncs the directory. */
int casidx_file_write(const char *path, const void *data, size_t size,
		      bool fsync_file, const char **error_r);

struct stat;
/* open() a file read-only and fstat() it. Returns 1 (*fd_r open), 0 it
   does not exist, -1 error (naming the call and path). */
int casidx_file_open(const char *path, int *fd_r, struct stat *st_r,
		     const char **error_r);
/* Open a segment file (mmap) or a memory buffer (must stay valid while
   the segment is open). Header, footer, DOCS, DOCLEN and SPARSE are
   verified here; DICT blocks and postings are verified when read.
   Returns 0 if the file doesn't exist, 1 if ok, -1 on error, with
   corrupted_r telling whether the content was bad (as opposed to an
   I/O error). */
int casidx_segment_open(const char *path, struct casidx_segment **seg_r,
			bool *corrupted_r, const char **error_r);
int casidx_segment_open_buf(const void *data, size_t size,
			    struct casidx_segment **seg_r,
			    const char **error_r);
/* Open a decrypted segment image; the segment takes ownership of *buf
   (also on failure) and wipes it when closed. */
int casidx_segment_open_owned(buffer_t **buf, struct casidx_segment **seg_r,
			      const char **error_r);
void casidx_segment_close(struct casidx_segment **seg);

const roaring_bitmap_t *
casidx_segment_get_docs(const struct casidx_segment *seg);
/* Token count of the document's field, 0 if the doc isn't here. */
uint32_t casidx_segment_doc_len(const struct casidx_segment *seg,
				uint32_t uid, enum casidx_field field);
uint64_t casidx_segment_field_total(const struct casidx_segment *seg,
				    enum casidx_field field);
unsigned int casidx_segment_term_count(const struct casidx_segment *seg);
/* Size of the segment image in bytes. */
size_t casidx_segment_get_size(const struct casidx_segment *seg);

/* Iterate terms whose key starts with prefix, in key order. */
struct casidx_segment_iter *
casidx_segment_iter_init(struct casidx_segment *seg,
			 const unsigned char *prefix, size_t prefix_len);
/* Returns 1 with an entry, 0 at end, -1 on corruption. */
int casidx_segment_iter_next(struct casidx_segment_iter *iter,
			     const struct casidx_term_entry **entry_r);
/* Returns -1 (with error_r) if the iteration hit corruption. */
int casidx_segment_iter_deinit(struct casidx_segment_iter **iter,
			       const char **error_r);

/* Called for each matching term; returns 0, or -1 (with error_r) to
   stop with an error. */
typedef int casidx_segment_entry_callback_t(struct casidx_segment *seg,
					    const struct casidx_term_entry *entry,
					    void *context,
					    const char **error_r);
/* Every term of the field whose term (the key after the field char)
   contains token, in key order. The first call for a field_char decodes
   and verifies that namespace's dictionary blocks into memory (about
   their size plus 24 bytes a term, kept until the segment is closed,
   wiped then; other namespaces are left alone), so the lookups of a
   session are one memmem() over the field's terms instead of a decode
   of every block. The first needle of CASIDX_TERMSIG_MIN_NEEDLE bytes
   or more builds the namespace's trigram signatures. Returns 1 if any
   matched, 0 if none, -1 on error (corruption or the callback's). */
int casidx_segment_find_substring(struct casidx_segment *seg,
				  unsigned char field_char,
				  const void *token, size_t token_len,
				  casidx_segment_entry_callback_t *callback,
				  void *context, const char **error_r);
/* Called for each term of a field (term = the key after the field char);
   TRUE selects it. */
typedef bool casidx_segment_term_filter_t(const unsigned char *term,
					  size_t term_len, void *context);
/* Every term of the field that filter selects, in key order, from the
   dictionary decoded as for casidx_segment_find_substring() (one pass
   over the field's terms in memory). Returns 1 if any was selected, 0
   if none, -1 on error. */
int casidx_segment_find_terms(struct casidx_segment *seg,
			      unsigned char field_char,
			      casidx_segment_term_filter_t *filter,
			      void *filter_context,
			      casidx_segment_entry_callback_t *callback,
			      void *context, const char **error_r);
/* How many dictionary terms the find functions have decoded into
   memory so far, and how many of them have trigram signatures (for
   statistics). */
void casidx_segment_get_arena_stats(const struct casidx_segment *seg,
				    unsigned int *terms_decoded_r,
				    unsigned int *terms_signed_r);
/* Read a term's postings: docs_r (caller frees with roaring_bitmap_free)
   and tfs_r with one term frequency per doc in bitmap order. */
int casidx_segment_read_postings(struct casidx_segment *seg,
				 const struct casidx_term_entry *entry,
				 roaring_bitmap_t **docs_r,
				 ARRAY_TYPE(uint32_t) *tfs_r,
				 const char **error_r);
/* The same plus positions: pos_idx_r gets df + 1 indexes into pos_r,
   the codes of the i-th doc being pos_r[pos_idx[i] .. pos_idx[i+1]).
   A version-1 segment, or a term without positions, gives none. Every
   count, delta and trailing byte is checked. */
int casidx_segment_read_positions(struct casidx_segment *seg,
				  const struct casidx_term_entry *entry,
				  roaring_bitmap_t **docs_r,
				  ARRAY_TYPE(uint32_t) *tfs_r,
				  ARRAY_TYPE(uint32_t) *pos_r,
				  ARRAY_TYPE(uint32_t) *pos_idx_r,
				  const char **error_r);
/* FALSE for a version-1 segment (written before positions). */
bool casidx_segment_has_positions(const struct casidx_segment *seg);
/* FALSE for a segment of version 1 or 2 (written before dtgrams): none
   of its documents has dtgram keys. */
bool casidx_segment_has_dtgrams(const struct casidx_segment *seg);
/* FALSE for a segment of version 1 to 4 (written before part codes):
   the parts of its documents have no codes. A version-5 segment may
   still hold documents without them (merged from an older segment):
   the codes are per occurrence, and one without a code is unknown. */
bool casidx_segment_has_part_codes(const struct casidx_segment *seg);
/* FALSE for a segment of version 1 to 3 (written before the raw address
   namespaces): the raw values of its documents' address headers, if
   any, are in the header field. In a version-4 segment a document
   whose values are there (merged from an older segment) carries the
   CASIDX_TERM_RAWHDR marker (casidx-index.h). */
bool casidx_segment_has_raw_addresses(const struct casidx_segment *seg);

#endif
