#ifndef CASBOX_LSM_BLOCK_H
#define CASBOX_LSM_BLOCK_H

/* Table blocks and the bloom filter (layout: casbox-lsm-table.c and
   doc/casbox-lsm.md). Pure functions over memory; no I/O.

   block: entry* | u32 restart[n] | u32 n   (the CRC trailer is the
	  table's business)
   entry: numpack shared | numpack unshared | numpack value_len+1
	  (0 = delete) | key suffix | value */

#include "array.h"
#include "casbox-lsm-private.h"

#define CASBOX_LSM_BLOCK_SIZE 4096
#define CASBOX_LSM_BLOCK_RESTART_INTERVAL 16
#define CASBOX_LSM_BLOOM_BITS_PER_KEY 10

struct casbox_lsm_block_builder {
	buffer_t *data;
	ARRAY(uint32_t) restarts;
	buffer_t *last_key;
	unsigned int counter, entries;
};

/* A parsed, CRC-checked block. */
struct casbox_lsm_block {
	buffer_t *buf;
	const unsigned char *data;
	size_t data_size; /* entries only, without the restart array */
	unsigned int n_restarts;
	const unsigned char *restarts;
	uoff_t file_offset;
};

struct casbox_lsm_block_iter {
	const struct casbox_lsm_block *block;
	size_t pos, next_pos;
	buffer_t *key;
	enum casbox_lsm_type type;
	const unsigned char *value;
	size_t value_size;
	bool valid;
	const char *error;
};

uint32_t casbox_lsm_bloom_hash(const unsigned char *key, size_t size);
/* Append the filter for hashes (bits, then u8 k) to out. */
void casbox_lsm_bloom_build(buffer_t *out, const uint32_t *hashes,
			    unsigned int count);
/* FALSE only if key is certainly absent. */
bool casbox_lsm_bloom_may_contain(const buffer_t *bloom, const void *key,
				  size_t key_size);

void casbox_lsm_block_builder_init(struct casbox_lsm_block_builder *bb);
void casbox_lsm_block_builder_deinit(struct casbox_lsm_block_builder *bb);
void casbox_lsm_block_builder_reset(struct casbox_lsm_block_builder *bb);
/* Keys must strictly increase. */
void casbox_lsm_block_builder_add(struct casbox_lsm_block_builder *bb,
				  bool is_delete,
				  const unsigned char *key, size_t key_size,
				  const unsigned char *value,
				  size_t value_size);
/* Append the block (entries, restarts, count) and its masked CRC32C to
   out; size_r = block size without the CRC. */
void casbox_lsm_block_builder_finish(struct casbox_lsm_block_builder *bb,
				     buffer_t *out, uint32_t *size_r);

/* Check key order, lengths and that every restart point starts an
   entry. Returns NULL if fine, else a static reason. */
const char *
casbox_lsm_block_validate(const struct casbox_lsm_block *block);

/* Iteration. bi->key must be a buffer owned by the caller. On damage
   valid is FALSE and error a static reason. */
void casbox_lsm_block_iter_init(struct casbox_lsm_block_iter *bi,
				const struct casbox_lsm_block *block);
bool casbox_lsm_block_iter_decode(struct casbox_lsm_block_iter *bi);
bool casbox_lsm_block_iter_next(struct casbox_lsm_block_iter *bi);
/* Position at the first key >= key. */
void casbox_lsm_block_iter_seek(struct casbox_lsm_block_iter *bi,
				const struct casbox_lsm_block *block,
				const unsigned char *key, size_t key_size);

#endif
