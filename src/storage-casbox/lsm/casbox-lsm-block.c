/* Table blocks with restart points, and the bloom filter; see
   casbox-lsm-block.h. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "numpack.h"
#include "byteorder.h"
#include "cas-crc32c.h"
#include "casbox-lsm-block.h"

uint32_t casbox_lsm_bloom_hash(const unsigned char *key, size_t size)
{
	/* FNV-1a with a final avalanche */
	uint32_t h = 2166136261U;
	size_t i;

	for (i = 0; i < size; i++) {
		h ^= key[i];
		h *= 16777619U;
	}
	h ^= h >> 16;
	h *= 0x85ebca6bU;
	h ^= h >> 13;
	h *= 0xc2b2ae35U;
	h ^= h >> 16;
	return h;
}

void casbox_lsm_bloom_build(buffer_t *out, const uint32_t *hashes,
			    unsigned int count)
{
	unsigned int bits, k, i, j;
	unsigned char *array;
	size_t bytes;

	k = CASBOX_LSM_BLOOM_BITS_PER_KEY * 69 / 100; /* ln 2 */
	bits = count * CASBOX_LSM_BLOOM_BITS_PER_KEY;
	if (bits < 64)
		bits = 64;
	bytes = (bits + 7) / 8;
	bits = bytes * 8;
	array = buffer_append_space_unsafe(out, bytes);
	memset(array, 0, bytes);
	for (i = 0; i < count; i++) {
		uint32_t h = hashes[i];
		uint32_t delta = (h >> 17) | (h << 15);

		for (j = 0; j < k; j++) {
			uint32_t pos = h % bits;

			array[pos / 8] |= 1 << (pos % 8);
			h += delta;
		}
	}
	buffer_append_c(out, k);
}

bool casbox_lsm_bloom_may_contain(const buffer_t *bloom, const void *key,
				  size_t key_size)
{
	const unsigned char *array = bloom->data;
	uint32_t h, delta, bits, pos;
	unsigned int j, k;

#ifdef CASBOX_FUZZ_NO_CRC
	/* unchecked filter bits would make the lookup oracle fail */
	return TRUE;
#endif
	if (bloom->used < 2)
		return TRUE;
	k = array[bloom->used - 1];
	if (k == 0 || k > 30)
		return TRUE; /* unknown encoding: never a false negative */
	bits = (bloom->used - 1) * 8;
	h = casbox_lsm_bloom_hash(key, key_size);
	delta = (h >> 17) | (h << 15);
	for (j = 0; j < k; j++) {
		pos = h % bits;
		if ((array[pos / 8] & (1 << (pos % 8))) == 0)
			return FALSE;
		h += delta;
	}
	return TRUE;
}

void casbox_lsm_block_builder_init(struct casbox_lsm_block_builder *bb)
{
	bb->data = buffer_create_dynamic(default_pool,
					 CASBOX_LSM_BLOCK_SIZE * 2);
	i_array_init(&bb->restarts, 64);
	bb->last_key = buffer_create_dynamic(default_pool, 128);
}

void casbox_lsm_block_builder_deinit(struct casbox_lsm_block_builder *bb)
{
	buffer_free(&bb->data);
	array_free(&bb->restarts);
	buffer_free(&bb->last_key);
}

void casbox_lsm_block_builder_reset(struct casbox_lsm_block_builder *bb)
{
	buffer_set_used_size(bb->data, 0);
	array_clear(&bb->restarts);
	buffer_set_used_size(bb->last_key, 0);
	bb->counter = 0;
	bb->entries = 0;
}

void casbox_lsm_block_builder_add(struct casbox_lsm_block_builder *bb,
				  bool is_delete,
				  const unsigned char *key, size_t key_size,
				  const unsigned char *value,
				  size_t value_size)
{
	size_t shared = 0;
	uint32_t restart;

	if (bb->counter < CASBOX_LSM_BLOCK_RESTART_INTERVAL &&
	    bb->entries > 0) {
		const unsigned char *last = bb->last_key->data;
		size_t max = I_MIN(bb->last_key->used, key_size);

		while (shared < max && last[shared] == key[shared])
			shared++;
	} else {
		restart = bb->data->used;
		array_push_back(&bb->restarts, &restart);
		bb->counter = 0;
	}
	numpack_encode(bb->data, shared);
	numpack_encode(bb->data, key_size - shared);
	numpack_encode(bb->data, is_delete ? 0 : (uint64_t)value_size + 1);
	buffer_append(bb->data, key + shared, key_size - shared);
	if (!is_delete)
		buffer_append(bb->data, value, value_size);
	buffer_set_used_size(bb->last_key, 0);
	buffer_append(bb->last_key, key, key_size);
	bb->counter++;
	bb->entries++;
}

/* Finish the block into out: restarts, count, crc. */
void casbox_lsm_block_builder_finish(struct casbox_lsm_block_builder *bb,
				     buffer_t *out, uint32_t *size_r)
{
	const uint32_t *restart;
	unsigned char num[4];
	size_t start = out->used;
	uint32_t crc;

	buffer_append_buf(out, bb->data, 0, SIZE_MAX);
	array_foreach(&bb->restarts, restart) {
		cpu32_to_be_unaligned(*restart, num);
		buffer_append(out, num, 4);
	}
	cpu32_to_be_unaligned(array_count(&bb->restarts), num);
	buffer_append(out, num, 4);
	*size_r = out->used - start;
	crc = cas_crc32c(CONST_PTR_OFFSET(out->data, start), *size_r);
	cpu32_to_be_unaligned(cas_crc32c_mask(crc), num);
	buffer_append(out, num, 4);
}

/* Walk the whole block once: keys strictly increase and every restart
   point is the start of an entry. Seeks jump to restart points, so
   without this a bad restart could make a lookup miss a key that
   iteration finds. */
const char *casbox_lsm_block_validate(const struct casbox_lsm_block *block)
{
	struct casbox_lsm_block_iter bi;
	unsigned int restart_idx = 0;
	uint32_t restart;

	i_zero(&bi);
	bi.key = t_buffer_create(128);
	for (casbox_lsm_block_iter_init(&bi, block); bi.valid;
	     casbox_lsm_block_iter_next(&bi)) {
		if (restart_idx >= block->n_restarts)
			continue;
		restart = be32_to_cpu_unaligned(block->restarts +
						restart_idx * 4);
		if (restart < bi.pos)
			return "restart point inside an entry";
		if (restart == bi.pos)
			restart_idx++;
	}
	if (bi.error != NULL)
		return bi.error;
	if (restart_idx != block->n_restarts)
		return "restart point past the last entry";
	return NULL;
}

/* Decode the entry at bi->next_pos. Returns FALSE at the end or on
   damage (bi->error set). */
bool casbox_lsm_block_iter_decode(struct casbox_lsm_block_iter *bi)
{
	const struct casbox_lsm_block *block = bi->block;
	const unsigned char *p = block->data + bi->next_pos;
	const unsigned char *end = block->data + block->data_size;
	uint64_t shared, unshared, vlen;

	bi->valid = FALSE;
	if (bi->next_pos >= block->data_size)
		return FALSE;
	bi->pos = bi->next_pos;
	if (numpack_decode(&p, end, &shared) < 0 ||
	    numpack_decode(&p, end, &unshared) < 0 ||
	    numpack_decode(&p, end, &vlen) < 0) {
		bi->error = "truncated entry header";
		return FALSE;
	}
	if (shared > bi->key->used ||
	    unshared > (size_t)(end - p) ||
	    shared + unshared > CASBOX_LSM_MAX_KEY_SIZE) {
		bi->error = "invalid entry key length";
		return FALSE;
	}
	buffer_set_used_size(bi->key, shared);
	buffer_append(bi->key, p, unshared);
	p += unshared;
	if (vlen == 0) {
		bi->type = CASBOX_LSM_TYPE_DELETE;
		bi->value_size = 0;
	} else {
		bi->type = CASBOX_LSM_TYPE_PUT;
		bi->value_size = vlen - 1;
		if (bi->value_size > (size_t)(end - p)) {
			bi->error = "invalid entry value length";
			return FALSE;
		}
	}
	bi->value = p;
	p += bi->value_size;
	bi->next_pos = p - block->data;
	bi->valid = TRUE;
	return TRUE;
}

/* Next entry, checking that keys strictly increase. */
bool casbox_lsm_block_iter_next(struct casbox_lsm_block_iter *bi)
{
	size_t prev_size = bi->key->used;
	unsigned char prev[CASBOX_LSM_MAX_KEY_SIZE];

	memcpy(prev, bi->key->data, prev_size);
	if (!casbox_lsm_block_iter_decode(bi))
		return FALSE;
	if (casbox_lsm_key_cmp(prev, prev_size, bi->key->data,
			       bi->key->used) >= 0) {
		bi->error = "keys out of order";
		bi->valid = FALSE;
		return FALSE;
	}
	return TRUE;
}

void casbox_lsm_block_iter_init(struct casbox_lsm_block_iter *bi,
				const struct casbox_lsm_block *block)
{
	bi->block = block;
	bi->pos = bi->next_pos = 0;
	buffer_set_used_size(bi->key, 0);
	bi->error = NULL;
	(void)casbox_lsm_block_iter_decode(bi);
}

/* Position at the first key >= key within the block. */
void casbox_lsm_block_iter_seek(struct casbox_lsm_block_iter *bi,
				const struct casbox_lsm_block *block,
				const unsigned char *key, size_t key_size)
{
	unsigned int left = 0, right = block->n_restarts - 1, mid;
	int cmp;

	bi->block = block;
	bi->error = NULL;
	/* binary search for the last restart whose key < key */
	while (left < right) {
		mid = (left + right + 1) / 2;
		bi->next_pos = be32_to_cpu_unaligned(block->restarts +
						     mid * 4);
		buffer_set_used_size(bi->key, 0);
		if (!casbox_lsm_block_iter_decode(bi))
			return;
		cmp = casbox_lsm_key_cmp(bi->key->data, bi->key->used,
					 key, key_size);
		if (cmp < 0)
			left = mid;
		else
			right = mid - 1;
	}
	bi->next_pos = be32_to_cpu_unaligned(block->restarts + left * 4);
	buffer_set_used_size(bi->key, 0);
	if (!casbox_lsm_block_iter_decode(bi))
		return;
	while (casbox_lsm_key_cmp(bi->key->data, bi->key->used,
				  key, key_size) < 0) {
		if (!casbox_lsm_block_iter_next(bi))
			return;
	}
}
