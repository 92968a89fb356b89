#ifndef CASBOX_LSM_PRIVATE_H
#define CASBOX_LSM_PRIVATE_H

/* Internals shared by the casbox-lsm files. Formats: doc/casbox-lsm.md. */

#include "casbox-lsm.h"
#include "cas-io.h"
#include "byteorder.h"

/* Fuzz builds (-DCASBOX_FUZZ_NO_CRC, never in the plugin) accept any
   checksum so the fuzzer reaches the parsers behind them. */
#ifdef CASBOX_FUZZ_NO_CRC
#  define CASBOX_LSM_CRC_BAD(computed, stored) ((void)(computed), FALSE)
#else
#  define CASBOX_LSM_CRC_BAD(computed, stored) ((computed) != (stored))
#endif

enum casbox_lsm_type {
	CASBOX_LSM_TYPE_DELETE = 0,
	CASBOX_LSM_TYPE_PUT = 1,
};

/* A sorted stream of (key, type, value) with strictly increasing keys.
   Implemented by the memtable, tables and the merge of several. When
   iteration stops on damage, valid is FALSE and error is set. */
struct casbox_lsm_source {
	void (*seek)(struct casbox_lsm_source *src,
		     const unsigned char *key, size_t key_size);
	void (*next)(struct casbox_lsm_source *src);
	void (*free)(struct casbox_lsm_source *src);

	bool valid;
	enum casbox_lsm_type type;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	/* i_malloc()ed; freed by free() */
	char *error;
};

static inline void casbox_lsm_source_free(struct casbox_lsm_source **_src)
{
	struct casbox_lsm_source *src = *_src;

	if (src == NULL)
		return;
	*_src = NULL;
	src->free(src);
}

/* memcmp() order, the shorter key first on a tie. Inline and 8 bytes
   at a time: keys of one mailbox share a 17-byte prefix, and this is
   the memtable's and the tables' innermost loop. */
static inline int casbox_lsm_key_cmp(const unsigned char *a, size_t a_size,
				     const unsigned char *b, size_t b_size)
{
	size_t i = 0, n = I_MIN(a_size, b_size);
	uint64_t x, y;

	for (; i + 8 <= n; i += 8) {
		x = be64_to_cpu_unaligned(a + i);
		y = be64_to_cpu_unaligned(b + i);
		if (x != y)
			return x < y ? -1 : 1;
	}
	for (; i < n; i++) {
		if (a[i] != b[i])
			return a[i] < b[i] ? -1 : 1;
	}
	return a_size < b_size ? -1 : (a_size > b_size ? 1 : 0);
}

/* ---- memtable (casbox-lsm-memtable.c): skiplist of versions ---- */
struct casbox_lsm_memtable;

struct casbox_lsm_memtable *casbox_lsm_memtable_create(void);
void casbox_lsm_memtable_ref(struct casbox_lsm_memtable *mt);
void casbox_lsm_memtable_unref(struct casbox_lsm_memtable **mt);
/* Copies key and value. seq must grow with every add. */
void casbox_lsm_memtable_add(struct casbox_lsm_memtable *mt, uint64_t seq,
			     enum casbox_lsm_type type,
			     const void *key, size_t key_size,
			     const void *value, size_t value_size);
/* Newest version with seq <= max_seq. Returns TRUE if the memtable has
   one (which may be a delete). value_r stays valid while mt lives. */
bool casbox_lsm_memtable_lookup(struct casbox_lsm_memtable *mt,
				const void *key, size_t key_size,
				uint64_t max_seq, enum casbox_lsm_type *type_r,
				const unsigned char **value_r,
				size_t *value_size_r);
unsigned int casbox_lsm_memtable_count(struct casbox_lsm_memtable *mt);
/* Source over the newest version <= max_seq of each key, deletes
   included. Holds a reference to mt. */
struct casbox_lsm_source *
casbox_lsm_memtable_source(struct casbox_lsm_memtable *mt, uint64_t max_seq);

/* ---- WAL (casbox-lsm-wal.c) ---- */
/* format 1 (plaintext) header; format 2 (sealed) adds u32 epoch | u32 0 */
#define CASBOX_LSM_WAL_HEADER_SIZE 24
#define CASBOX_LSM_WAL_HEADER2_SIZE 32
#define CASBOX_LSM_WAL_HEADER_MAX CASBOX_LSM_WAL_HEADER2_SIZE
#define CASBOX_LSM_WAL_RECORD_HDR 8
#define CASBOX_LSM_WAL_MAX_PAYLOAD (256U * 1024 * 1024)

struct casbox_lsm_key;

/* epoch CASBOX_LSM_EPOCH_PLAINTEXT: a format-1 header */
void casbox_lsm_wal_header_write(buffer_t *buf, uint64_t file_no,
				 uint32_t epoch);
int casbox_lsm_wal_header_parse(const unsigned char *data, size_t size,
				uint64_t *file_no_r, uint32_t *epoch_r,
				size_t *header_size_r, const char **error_r);
/* A format-2 record at offset of WAL wal_no: the payload (first_seq |
   count | entries) sealed, bound to the WAL and the offset. */
void casbox_lsm_wal_record_encode_sealed(buffer_t *out,
					 const struct casbox_lsm_key *key,
					 uint64_t wal_no, uoff_t offset,
					 uint64_t first_seq, unsigned int count,
					 const buffer_t *entries);
/* key != NULL: open the sealed payload of the record at offset into
   plain and point *payload at it. Returns 0 ok (also for key NULL:
   nothing to do), -1 authentication failed (error_r). */
int casbox_lsm_wal_payload_open(const struct casbox_lsm_key *key,
				uint64_t wal_no, uoff_t offset,
				const unsigned char **payload,
				size_t *payload_size, buffer_t *plain,
				const char **error_r);
/* Append one encoded entry to a batch's entry buffer. */
void casbox_lsm_wal_entry_encode(buffer_t *entries, enum casbox_lsm_type type,
				 const void *key, size_t key_size,
				 const void *value, size_t value_size);
/* Append a record (header + payload) for the encoded entries. */
void casbox_lsm_wal_record_encode(buffer_t *out, uint64_t first_seq,
				  unsigned int count, const buffer_t *entries);

enum casbox_lsm_wal_status {
	/* a complete record with a good CRC */
	CASBOX_LSM_WAL_OK,
	/* nothing more: clean end, torn tail or a write in progress */
	CASBOX_LSM_WAL_END,
	/* a bad record with more data after it */
	CASBOX_LSM_WAL_CORRUPT,
};
/* Look at the record at the start of data (size = bytes up to EOF). */
enum casbox_lsm_wal_status
casbox_lsm_wal_record_parse(const unsigned char *data, size_t size,
			    const unsigned char **payload_r,
			    size_t *payload_size_r, size_t *record_size_r,
			    const char **error_r);

typedef void casbox_lsm_wal_apply_t(void *context, uint64_t seq,
				    enum casbox_lsm_type type,
				    const unsigned char *key, size_t key_size,
				    const unsigned char *value,
				    size_t value_size);
/* Validate a payload completely, then (if apply != NULL) call apply for
   each entry. Returns 0 ok, -1 malformed (nothing applied). */
int casbox_lsm_wal_payload_apply(const unsigned char *payload, size_t size,
				 uint64_t *first_seq_r, unsigned int *count_r,
				 casbox_lsm_wal_apply_t *apply, void *context,
				 const char **error_r);

/* Apply a batch this process encoded itself (one pass, no separate
   validation: it cannot be malformed). */
void casbox_lsm_wal_entries_apply(const buffer_t *entries, uint64_t first_seq,
				  unsigned int count,
				  casbox_lsm_wal_apply_t *apply, void *context);

/* ---- sorted tables (casbox-lsm-table.c) ---- */
#define CASBOX_LSM_TABLE_FOOTER_SIZE 48

struct casbox_lsm_table;
struct casbox_lsm_table_builder;

/* key != NULL: a sealed (format 2) table under key's epoch, bound to
   file_no; NULL: format 1. */
struct casbox_lsm_table_builder *
casbox_lsm_table_builder_init(const struct cas_io *io, int fd,
			      const char *path, uint64_t file_no,
			      const struct casbox_lsm_key *key);
/* Keys must be added in strictly increasing order. */
int casbox_lsm_table_builder_add(struct casbox_lsm_table_builder *builder,
				 enum casbox_lsm_type type,
				 const unsigned char *key, size_t key_size,
				 const unsigned char *value, size_t value_size);
/* Writes the rest, fsyncs. Returns 0 ok (size_r = file size), -1 error.
   Frees the builder either way. */
int casbox_lsm_table_builder_finish(struct casbox_lsm_table_builder **builder,
				    bool fsync, uoff_t *size_r,
				    uint64_t *entries_r, const char **error_r);

/* Open a table (takes ownership of fd, closes it on error too). key:
   the key of the epoch the MANIFEST names for it (copied), NULL for a
   plaintext table; a table of another epoch or format fails. */
int casbox_lsm_table_open(const struct cas_io *io, int fd,
			  const char *path, uint64_t file_no,
			  const struct casbox_lsm_key *key,
			  struct casbox_lsm_table **table_r,
			  const char **error_r);
/* Open a table from a memory buffer (fuzzing). The data must stay
   valid until the table is freed. */
int casbox_lsm_table_open_mem(const void *data, size_t size,
			      struct casbox_lsm_table **table_r,
			      const char **error_r);
void casbox_lsm_table_ref(struct casbox_lsm_table *table);
void casbox_lsm_table_unref(struct casbox_lsm_table **table);
uint64_t casbox_lsm_table_file_no(struct casbox_lsm_table *table);
uoff_t casbox_lsm_table_size(struct casbox_lsm_table *table);
/* CASBOX_LSM_EPOCH_PLAINTEXT for a format-1 table */
uint32_t casbox_lsm_table_epoch(struct casbox_lsm_table *table);
/* Returns 1 found (type_r says whether put or delete; value appended
   for a put), 0 not in this table, -1 damage (error_r has file and
   offset). */
int casbox_lsm_table_lookup(struct casbox_lsm_table *table,
			    const void *key, size_t key_size,
			    enum casbox_lsm_type *type_r, buffer_t *value_r,
			    const char **error_r);
struct casbox_lsm_source *
casbox_lsm_table_source(struct casbox_lsm_table *table);
/* Check every block; report damage. Returns 1 clean, 0 damage. */
int casbox_lsm_table_verify(struct casbox_lsm_table *table,
			    casbox_lsm_damage_callback_t *report,
			    void *context);

/* ---- block cache (casbox-lsm-cache.c) ---- */
/* One LRU cache per process, like LevelDB's default 8 MiB block cache:
   a block is read, CRC-checked and walked once, not on every lookup.
   The default bound (casbox_lsm_settings.cache_bytes = 0). */
#define CASBOX_LSM_CACHE_BYTES (8 * 1024 * 1024)
#define CASBOX_LSM_CACHE_MAX_BLOCK (64 * 1024)

/* Every table registers (getting a process-unique id) and unregisters
   when freed, which drops its blocks. */
uint64_t casbox_lsm_cache_register(void);
/* The bound of the process's cache: the last store opened sets it (a
   process serves one user; tests open several stores alike). Evicts
   down to it at once. */
void casbox_lsm_cache_set_limit(size_t bytes);
void casbox_lsm_cache_unregister(uint64_t table_id);
/* The block's bytes, valid until the next casbox_lsm_cache_put() or
   unregister; NULL if not cached. */
const unsigned char *
casbox_lsm_cache_get(uint64_t table_id, uoff_t offset, size_t *size_r);
/* Store a copy of a validated block (too large ones are skipped). */
void casbox_lsm_cache_put(uint64_t table_id, uoff_t offset,
			  const void *data, size_t size);

/* ---- sealing (casbox-lsm-seal.c): format 2 ---- */
/* An epoch's LSM key, in sodium_malloc()ed memory. */
struct casbox_lsm_key {
	uint32_t epoch;
	unsigned char key[CASBOX_LSM_KEY_SIZE];
};
enum casbox_lsm_seal_kind {
	CASBOX_LSM_SEAL_DATA = 1,
	CASBOX_LSM_SEAL_INDEX = 2,
	CASBOX_LSM_SEAL_BLOOM = 3,
	CASBOX_LSM_SEAL_WAL = 4,
};
/* nonce + tag + the compression byte */
#define CASBOX_LSM_SEAL_OVERHEAD (16 + 16 + 1)
#define CASBOX_LSM_MAC_SIZE 32

struct casbox_lsm_key *casbox_lsm_key_new(uint32_t epoch);
struct casbox_lsm_key *casbox_lsm_key_dup(const struct casbox_lsm_key *key);
void casbox_lsm_key_free(struct casbox_lsm_key **key);
/* Append the sealed form of plain (zstd-compressed first if compress
   and it gets smaller) to out. */
void casbox_lsm_seal(const struct casbox_lsm_key *key,
		     enum casbox_lsm_seal_kind kind, uint64_t file_no,
		     uint64_t offset, const void *plain, size_t size,
		     bool compress, buffer_t *out);
/* Verify and open a sealed item into plain_r (replacing its content).
   Returns 0 ok, -1 authentication or format failure (error_r). */
int casbox_lsm_unseal(const struct casbox_lsm_key *key,
		      enum casbox_lsm_seal_kind kind, uint64_t file_no,
		      uint64_t offset, const void *sealed, size_t size,
		      buffer_t *plain_r, const char **error_r);
void casbox_lsm_manifest_mac(const struct casbox_lsm_key *key,
			     const void *data, size_t size,
			     unsigned char mac_r[CASBOX_LSM_MAC_SIZE]);
/* constant time */
bool casbox_lsm_mac_equal(const unsigned char *a, const unsigned char *b,
			  size_t size);

/* ---- merge (casbox-lsm-merge.c) ---- */
/* Merge sources, sources[0] newest: for equal keys the newest wins.
   Takes ownership of the sources. Deletes are passed through. */
struct casbox_lsm_source *
casbox_lsm_merge_source(struct casbox_lsm_source *const *sources,
			unsigned int count);

#endif
