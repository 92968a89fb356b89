#ifndef CASIDX_INDEX_H
#define CASIDX_INDEX_H

/* casidx per-mailbox index directory (doc/casidx-format.md):

     manifest          "CXMANIF1" | u32 version | u64 generation |
                       u32 last_uid | u32 uid_validity |
                       u32 next_seg_id | u32 nseg |
                       (u32 seg_id, u32 ndocs) * nseg | u32 len |
                       expunged roaring |
                       u32 crc32c of everything before
     seg-XXXXXXXX.cxs  immutable segments (casidx-segment.h)
     write.lock        fcntl lock held by a writer while it commits

   Writers build segments in memory and commit them under write.lock:
   segment written (tmp, fsync, rename), then a new manifest (tmp, fsync,
   rename, fsync dir). Readers never lock: refresh() reads the manifest
   and opens the segments it names, keeping already open ones. A reader
   that loses a race with a merge that deleted a segment re-reads the
   manifest. */

#include "casidx-segment.h"

struct casidx_index;
struct casidx_index_writer;

/* Marker terms, added once per field of a document (tokens never hold
   control characters, and no query token is a substring of these):
   UNINDEXED  the field has text no term covers (a run skipped as encoded
              data, or terms lost to the per-document memory bound), so
              a search that finds nothing may still match there: "maybe"
   (Format 2 also had "\x01\x02" FOLDED per field; format 3 marks the
   folded terms themselves, below.) */
#define CASIDX_TERM_UNINDEXED "\x01\x01"
/* DTPARTIAL  the field's text has dtgrams (casidx-dtgram.h) that were
              not indexed (the per-document cap, the memory bound, text
              the backend could not read as Dovecot's search does), so
              a value with dtgrams may still match there: "maybe". The
              documents of a segment without dtgrams (version < 3)
              count as DTPARTIAL in every field; a merge writes the
              marker for them. */
#define CASIDX_TERM_DTPARTIAL "\x01\x03"
/* RAWHDR     (header field only) the document's raw address values are
              in the header field, not in the CASIDX_FIELD_RAW_*
              namespaces: it was written into a segment older than
              version 4, and a merge carried it into a newer one. */
#define CASIDX_TERM_RAWHDR "\x01\x04"
#define CASIDX_TERM_MARKER_LEN 2
/* First byte of a term whose word normalisation changed beyond ASCII
   case (CASIDX_TOKEN_FLAG_FOLDED: "muñoz" is stored as "\x02munoz"):
   an ASCII match found only in such terms is "maybe"; one found in a
   plain term of the document is proven. No query atom contains it, so
   substring lookups find the folded terms like any other. */
#define CASIDX_TERM_FOLDED_PREFIX '\x02'

struct cas_io;

struct casidx_index_settings {
	/* Flush a segment when the in-memory builder passes this. */
	size_t memory_budget;
	/* Merge the newest segments, regardless of tiers, when there are
	   more than this. */
	unsigned int merge_threshold;
	/* Most segment-file bytes one merge may read (a merge holds its
	   postings in memory); 0 = memory_budget / 16, at least 4 MB. */
	uint64_t merge_max_bytes;
	unsigned int lock_timeout_secs;
	bool no_fsync;
	/* the segment and manifest writes go through this table (NULL =
	   POSIX; the crash simulator in tests) */
	const struct cas_io *io;
};

enum casidx_match {
	CASIDX_MATCH_EXACT,
	CASIDX_MATCH_PREFIX,
	CASIDX_MATCH_SUBSTRING,
	/* FUZZY (casidx-query.c): terms that begin with a string within
	   one edit (insertion, deletion, substitution or swap of two
	   neighbours) of the token, folded terms included; a token of
	   fewer than CASIDX_TYPO_MIN_LEN bytes matches nothing this way */
	CASIDX_MATCH_TYPO,
};
#define CASIDX_TYPO_MIN_LEN 5

/* Called for each matching term of each segment. docs may contain
   expunged UIDs (see casidx_index_get_expunged()); tfs[i] is the term
   frequency of the i-th doc in bitmap order. term excludes the field
   char. */
typedef void casidx_index_term_callback_t(struct casidx_segment *seg,
					  const unsigned char *term,
					  size_t term_len,
					  const roaring_bitmap_t *docs,
					  const uint32_t *tfs, void *context);

/* A casidx_index_term_callback_t that ORs each matching term's docs
   into the roaring_bitmap_t *context. */
void casidx_index_or_docs_cb(struct casidx_segment *seg,
			     const unsigned char *term, size_t term_len,
			     const roaring_bitmap_t *docs,
			     const uint32_t *tfs, void *context);

struct casidx_index *
casidx_index_init(const char *dir, const struct casidx_index_settings *set);
void casidx_index_deinit(struct casidx_index **index);
/* Seal every segment written from now on, and accept only sealed
   segments when reading (casidx-crypt.h): a plaintext segment counts as
   corrupted, so an index written before encryption was enabled is
   rebuilt. keyring must outlive the index. box_guid (the mailbox GUID,
   hex) goes into each file's associated data. Call before the first
   refresh. */
struct cas_keyring;
void casidx_index_set_crypt(struct casidx_index *index,
			    const struct cas_keyring *keyring,
			    const char *box_guid);
bool casidx_index_is_encrypted(const struct casidx_index *index);
const char *casidx_index_get_dir(const struct casidx_index *index);

/* Load the newest manifest. Returns 1 if ok, 0 if no index exists yet
   (empty snapshot), -1 on error (the snapshot is left empty). */
int casidx_index_refresh(struct casidx_index *index, const char **error_r);
/* TRUE if the last refresh or scan failed because of bad content
   (checksum, format), not I/O: the caller should delete and rebuild the
   index. */
bool casidx_index_is_corrupted(const struct casidx_index *index);
/* TRUE if the corruption is an index written in an older format version
   (also is_corrupted): derived data, the caller rebuilds it. */
bool casidx_index_is_old_format(const struct casidx_index *index);
struct casidx_index_stats {
	/* segment files the refreshes opened, their bytes on disk and
	   their images (decrypted and decompressed when sealed) */
	unsigned int segments_opened;
	uint64_t file_bytes, image_bytes;
	/* dictionary terms of the snapshot's segments that lookups have
	   decoded into memory, and how many of them have trigram
	   signatures (casidx_segment_find_substring()), out of
	   terms_total */
	uint64_t terms_decoded, terms_signed, terms_total;
};
/* What the index has read so far (for debug logging and tests). */
void casidx_index_get_stats(const struct casidx_index *index,
			    struct casidx_index_stats *stats_r);
/* Highest committed UID of the current snapshot. */
uint32_t casidx_index_get_last_uid(const struct casidx_index *index);
/* UIDVALIDITY the snapshot's UIDs belong to, 0 if unknown. A caller
   whose mailbox has another UIDVALIDITY must not use the snapshot. */
uint32_t casidx_index_get_uid_validity(const struct casidx_index *index);
const roaring_bitmap_t *
casidx_index_get_expunged(const struct casidx_index *index);
/* Every indexed, not expunged UID (including docs that had no terms).
   The caller frees the returned bitmap. */
roaring_bitmap_t *casidx_index_get_universe(const struct casidx_index *index);
unsigned int casidx_index_get_segment_count(const struct casidx_index *index);
/* A reader of the segments (casidx_index_get_open_segments()) found bad
   bytes: is_corrupted() reports it, so the caller rebuilds. */
void casidx_index_set_corrupted(struct casidx_index *index);
/* The segments open in the current snapshot (after a refresh), in a
   data-stack array; valid until the next refresh. */
unsigned int casidx_index_get_open_segments(const struct casidx_index *index,
					    struct casidx_segment ***segs_r);
/* Average token count per document of field over the snapshot. */
double casidx_index_get_avg_len(const struct casidx_index *index,
				enum casidx_field field);
/* Token count of uid's field, 0 if unknown. */
uint32_t casidx_index_get_doc_len(const struct casidx_index *index,
				  uint32_t uid, enum casidx_field field);

/* Find terms of field (any < CASIDX_FIELD_SPACE_COUNT) matching token.
   Returns 1 if some term matched, 0 if none, -1 on error (corruption). */
int casidx_index_scan(struct casidx_index *index, enum casidx_field field,
		      const char *token, size_t token_len,
		      enum casidx_match match,
		      casidx_index_term_callback_t *callback, void *context,
		      const char **error_r);

/* Docs (expunged ones included) that have the dtgram gram (gram_len
   bytes, casidx-dtgram.h) in field, or'ed into docs. Returns 1 if some
   segment has it, 0 if none, -1 on error (corruption). */
int casidx_index_lookup_dtgram(struct casidx_index *index,
			       enum casidx_field field,
			       const void *gram, size_t gram_len,
			       roaring_bitmap_t *docs, const char **error_r);
/* Or the docs of every open segment that has no dtgrams
   (casidx_segment_has_dtgrams()) into docs. */
void casidx_index_add_docs_without_dtgrams(const struct casidx_index *index,
					   roaring_bitmap_t *docs);
/* Or the docs of every open segment that has no raw address namespaces
   (casidx_segment_has_raw_addresses()) into docs: their raw address
   values are in the header field. */
void
casidx_index_add_docs_without_raw_addresses(const struct casidx_index *index,
					    roaring_bitmap_t *docs);

/* Writer. Only one writer per index object at a time. */
struct casidx_index_writer *
casidx_index_writer_begin(struct casidx_index *index);
/* Start a new document; a uid already indexed may be added again. */
void casidx_index_writer_add_doc(struct casidx_index_writer *writer,
				 uint32_t uid);
/* Terms past half of the memory budget for one document are dropped
   (the rest of the document is not searchable: every field and raw
   namespace gets UNINDEXED and DTPARTIAL); see _doc_truncated(). field
   may be a raw namespace (< CASIDX_FIELD_SPACE_COUNT). */
void casidx_index_writer_add_term(struct casidx_index_writer *writer,
				  enum casidx_field field,
				  const void *term, size_t term_len);
/* The same with a position code (casidx-segment.h CASIDX_POS_*). */
void casidx_index_writer_add_term_pos(struct casidx_index_writer *writer,
				      enum casidx_field field,
				      const void *term, size_t term_len,
				      uint32_t pos_code);
/* Add an occurrence of the dtgram gram (casidx-dtgram.h) to the
   current document's field, under the same bound, with a position code
   (CASIDX_POS_NONE: none); it does not count in the field's length. */
void casidx_index_writer_add_dtgram(struct casidx_index_writer *writer,
				    enum casidx_field field,
				    const void *gram, size_t gram_len,
				    uint32_t pos_code);
/* That bound in bytes of builder memory. */
size_t casidx_index_writer_doc_limit(const struct casidx_index_writer *writer);
/* TRUE if the current document lost terms to that bound. */
bool casidx_index_writer_doc_truncated(const struct casidx_index_writer *writer);
/* The mailbox's UIDVALIDITY. At commit, an index recorded under another
   UIDVALIDITY is emptied first (its UIDs mean other messages now). */
void casidx_index_writer_set_uid_validity(struct casidx_index_writer *writer,
					  uint32_t uid_validity);
void casidx_index_writer_expunge(struct casidx_index_writer *writer,
				 uint32_t uid);
/* Call between documents: commits a segment when the memory budget is
   exceeded. Returns -1 on error. */
int casidx_index_writer_doc_done(struct casidx_index_writer *writer,
				 const char **error_r);
/* TRUE if docs or expunges are pending: the commit writes a segment. */
bool casidx_index_writer_has_changes(const struct casidx_index_writer *writer);
/* Commit pending docs and expunges. Frees the writer in all cases. */
int casidx_index_writer_commit(struct casidx_index_writer **writer,
			       const char **error_r);
void casidx_index_writer_rollback(struct casidx_index_writer **writer);
/* Number of segment commits done by this writer so far. */
unsigned int
casidx_index_writer_get_flushes(const struct casidx_index_writer *writer);

/* Merge every segment into one and drop expunged docs (under lock). */
int casidx_index_optimize(struct casidx_index *index, const char **error_r);
/* Key rotation: seal every segment that opens under an older key epoch
   again under the key ring's current one, in place (temporary file,
   fsync, rename, directory fsync), under the write lock. resealed_r
   counts them. Returns 0 ok (also for an unencrypted index), -1 error
   (a segment that opens under no epoch: the index is left as it is). */
int casidx_index_reseal(struct casidx_index *index, unsigned int *resealed_r,
			const char **error_r);
/* Remove the whole index (rescan: everything gets reindexed). */
int casidx_index_delete(struct casidx_index *index, const char **error_r);

#endif
