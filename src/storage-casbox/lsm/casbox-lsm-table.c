/* Immutable sorted tables. Layout (doc/casbox-lsm.md):

   data block* | index block | bloom block | footer (48 bytes)
   block: entry* | u32 restart[n] | u32 n, then u32 masked crc32c
   entry: numpack shared | numpack unshared | numpack value_len+1 (0 =
	  delete) | key suffix | value
   index entry: key = last key of the block, value = u64 off | u32 size
   bloom: bits | u8 k
   footer: u64 index_off | u32 index_size | u64 bloom_off |
	   u32 bloom_size | u64 entries | u32 version | u32 crc |
	   "CBXSST01"

   Block sizes exclude their 4-byte CRC trailer. Every block is checked
   against its CRC before any byte of it is parsed.

   Format 2 (sealed): every block (data, index, bloom) is stored as
   casbox_lsm_seal() of the format-1 block (casbox-lsm-seal.c), still
   followed by the masked CRC32C of the stored bytes; block handles give
   the stored size. The footer grows to 56 bytes:
	   u64 index_off | u32 index_size | u64 bloom_off |
	   u32 bloom_size | u64 entries | u32 epoch | u32 0 | u32 version |
	   u32 crc | "CBXSST02" */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "numpack.h"
#include "byteorder.h"
#include "safe-memset.h"
#include "cas-crc32c.h"
#include "casbox-lsm-block.h"

#define TABLE_MAGIC "CBXSST01"
#define TABLE_VERSION 1
#define TABLE_MAGIC2 "CBXSST02"
#define TABLE_VERSION2 2
#define TABLE_FOOTER2_SIZE 56
#define TABLE_MAX_BLOCK_SIZE (CASBOX_LSM_MAX_VALUE_SIZE + 64 * 1024)
/* Opening a table reads its end in one pread() of up to this much: the
   index and the bloom filter are just before the footer, and a table
   of a delivery-sized WAL has both in a few hundred bytes (doc/
   benchmarks.md, "LMTP CPU: system calls per delivery, second pass").
   Each store open, i.e. each LMTP delivery,
   opens every table. */
#define TABLE_TAIL_READ_SIZE (16 * 1024)

struct casbox_lsm_table_builder {
	const struct cas_io *io;
	int fd;
	char *path;
	uoff_t offset;
	uint64_t entries;
	struct casbox_lsm_block_builder block, index;
	buffer_t *out;
	ARRAY(uint32_t) key_hashes;
	char *error;
	/* format 2: the key (not owned) and a block being sealed */
	const struct casbox_lsm_key *key;
	uint64_t file_no;
	buffer_t *plain;
};

struct table_index_entry {
	const unsigned char *last_key;
	size_t last_key_size, key_off;
	uoff_t offset;
	uint32_t size;
};

struct casbox_lsm_table {
	int refcount;
	const struct cas_io *io;
	int fd;
	char *path;
	uint64_t file_no;
	uoff_t size;
	/* fuzzing: the whole file in memory */
	const unsigned char *mem;
	/* while opening: the file's last tail_size bytes (NULL after) */
	unsigned char *tail;
	size_t tail_size;

	buffer_t *index_block, *bloom;
	ARRAY(struct table_index_entry) index;
	uint64_t entries;

	/* point lookups reuse these instead of allocating a source */
	struct casbox_lsm_block lookup_block;
	struct casbox_lsm_block_iter lookup_iter;

	/* key of this table's blocks in the process's block cache */
	uint64_t cache_id;
	/* format 2: the epoch's key (owned), stored bytes of a block */
	struct casbox_lsm_key *key;
	buffer_t *sealed_buf;
	uint32_t epoch;
};

enum table_read_mode {
	/* from disk, not via the cache (verify, index) */
	TABLE_READ_DISK,
	/* a cached block is copied into the caller's buffer */
	TABLE_READ_CACHED,
	/* the block may point into the cache: only until the next cache
	   insert (point lookups, which finish before that) */
	TABLE_READ_BORROW,
};

struct table_source {
	struct casbox_lsm_source src;
	struct casbox_lsm_table *table;
	unsigned int block_idx;
	struct casbox_lsm_block block;
	struct casbox_lsm_block_iter bi;
	/* where iteration stopped on damage (verify reports it) */
	uoff_t error_offset;
	char *error_reason;
	/* verify: read every block from disk, not from the cache */
	bool verify;
};

struct casbox_lsm_table_builder *
casbox_lsm_table_builder_init(const struct cas_io *io, int fd,
			      const char *path, uint64_t file_no,
			      const struct casbox_lsm_key *key)
{
	struct casbox_lsm_table_builder *builder;

	builder = i_new(struct casbox_lsm_table_builder, 1);
	builder->io = io;
	builder->fd = fd;
	builder->path = i_strdup(path);
	casbox_lsm_block_builder_init(&builder->block);
	casbox_lsm_block_builder_init(&builder->index);
	builder->out = buffer_create_dynamic(default_pool,
					     CASBOX_LSM_BLOCK_SIZE * 4);
	i_array_init(&builder->key_hashes, 1024);
	builder->key = key;
	builder->file_no = file_no;
	if (key != NULL) {
		builder->plain = buffer_create_dynamic(default_pool,
						CASBOX_LSM_BLOCK_SIZE + 64);
	}
	return builder;
}

static int builder_write_out(struct casbox_lsm_table_builder *builder)
{
	ssize_t ret;

	if (builder->out->used == 0)
		return 0;
	ret = builder->io->pwrite(builder->fd, builder->out->data,
				  builder->out->used, builder->offset);
	if (ret < 0 || (size_t)ret != builder->out->used) {
		if (ret >= 0)
			errno = ENOSPC;
		builder->error = i_strdup_printf("write(%s) failed: %m",
						 builder->path);
		return -1;
	}
	builder->offset += builder->out->used;
	buffer_set_used_size(builder->out, 0);
	return 0;
}

/* Append a finished format-1 block (in plain, with its CRC) to out,
   sealed if the table is: size_r = stored size without the CRC. */
static void builder_emit(struct casbox_lsm_table_builder *builder,
			 enum casbox_lsm_seal_kind kind, uint32_t *size_r)
{
	uoff_t offset = builder->offset + builder->out->used;
	size_t start = builder->out->used;
	unsigned char num[4];
	uint32_t crc;

	/* plain holds the block and its CRC trailer */
	casbox_lsm_seal(builder->key, kind, builder->file_no, offset,
			builder->plain->data, builder->plain->used - 4, TRUE,
			builder->out);
	*size_r = builder->out->used - start;
	crc = cas_crc32c(CONST_PTR_OFFSET(builder->out->data, start),
			 *size_r);
	cpu32_to_be_unaligned(cas_crc32c_mask(crc), num);
	buffer_append(builder->out, num, 4);
	buffer_set_used_size(builder->plain, 0);
}

static int builder_flush_block(struct casbox_lsm_table_builder *builder)
{
	struct casbox_lsm_block_builder *bb = &builder->block;
	unsigned char handle[12];
	uint32_t size;
	uoff_t offset;

	if (bb->entries == 0)
		return 0;
	offset = builder->offset + builder->out->used;
	if (builder->key == NULL)
		casbox_lsm_block_builder_finish(bb, builder->out, &size);
	else {
		casbox_lsm_block_builder_finish(bb, builder->plain, &size);
		builder_emit(builder, CASBOX_LSM_SEAL_DATA, &size);
	}
	cpu64_to_be_unaligned(offset, handle);
	cpu32_to_be_unaligned(size, handle + 8);
	casbox_lsm_block_builder_add(&builder->index, FALSE, bb->last_key->data,
			  bb->last_key->used, handle, sizeof(handle));
	casbox_lsm_block_builder_reset(bb);
	if (builder->out->used >= CASBOX_LSM_BLOCK_SIZE * 4)
		return builder_write_out(builder);
	return 0;
}

int casbox_lsm_table_builder_add(struct casbox_lsm_table_builder *builder,
				 enum casbox_lsm_type type,
				 const unsigned char *key, size_t key_size,
				 const unsigned char *value, size_t value_size)
{
	uint32_t hash = casbox_lsm_bloom_hash(key, key_size);

	if (builder->error != NULL)
		return -1;
	i_assert(builder->block.entries == 0 ||
		 casbox_lsm_key_cmp(builder->block.last_key->data,
				    builder->block.last_key->used,
				    key, key_size) < 0);
	array_push_back(&builder->key_hashes, &hash);
	casbox_lsm_block_builder_add(&builder->block,
				     type == CASBOX_LSM_TYPE_DELETE,
			  key, key_size, value, value_size);
	builder->entries++;
	if (builder->block.data->used >= CASBOX_LSM_BLOCK_SIZE)
		return builder_flush_block(builder);
	return 0;
}

static void builder_free(struct casbox_lsm_table_builder *builder)
{
	casbox_lsm_block_builder_deinit(&builder->block);
	casbox_lsm_block_builder_deinit(&builder->index);
	buffer_free(&builder->out);
	array_free(&builder->key_hashes);
	i_free(builder->error);
	i_free(builder->path);
	if (builder->plain != NULL) {
		safe_memset(buffer_get_modifiable_data(builder->plain, NULL),
			    0, builder->plain->used);
		buffer_free(&builder->plain);
	}
	i_free(builder);
}

static void builder_write_tail(struct casbox_lsm_table_builder *builder)
{
	unsigned char footer[TABLE_FOOTER2_SIZE];
	const uint32_t *hashes;
	unsigned int hash_count;
	uoff_t index_off, bloom_off;
	uint32_t index_size, bloom_size, crc;
	buffer_t *bloom;
	size_t start;

	index_off = builder->offset + builder->out->used;
	if (builder->key == NULL) {
		casbox_lsm_block_builder_finish(&builder->index, builder->out,
						&index_size);
	} else {
		casbox_lsm_block_builder_finish(&builder->index,
						builder->plain, &index_size);
		builder_emit(builder, CASBOX_LSM_SEAL_INDEX, &index_size);
	}

	bloom_off = builder->offset + builder->out->used;
	bloom = buffer_create_dynamic(default_pool, 1024);
	/* array_get(), not array_front(): a merge that dropped every
	   tombstone builds a table without keys (deleted unwritten) */
	hashes = array_get(&builder->key_hashes, &hash_count);
	casbox_lsm_bloom_build(bloom, hashes, hash_count);
	bloom_size = bloom->used;
	if (builder->key != NULL) {
		buffer_append_buf(builder->plain, bloom, 0, SIZE_MAX);
		buffer_append_zero(builder->plain, 4);
		builder_emit(builder, CASBOX_LSM_SEAL_BLOOM, &bloom_size);
	} else {
		start = builder->out->used;
		buffer_append_buf(builder->out, bloom, 0, SIZE_MAX);
		crc = cas_crc32c(CONST_PTR_OFFSET(builder->out->data, start),
				 bloom_size);
		cpu32_to_be_unaligned(cas_crc32c_mask(crc), footer);
		buffer_append(builder->out, footer, 4);
	}
	buffer_free(&bloom);

	cpu64_to_be_unaligned(index_off, footer);
	cpu32_to_be_unaligned(index_size, footer + 8);
	cpu64_to_be_unaligned(bloom_off, footer + 12);
	cpu32_to_be_unaligned(bloom_size, footer + 20);
	cpu64_to_be_unaligned(builder->entries, footer + 24);
	if (builder->key != NULL) {
		cpu32_to_be_unaligned(builder->key->epoch, footer + 32);
		cpu32_to_be_unaligned(0, footer + 36);
		cpu32_to_be_unaligned(TABLE_VERSION2, footer + 40);
		cpu32_to_be_unaligned(cas_crc32c(footer, 44), footer + 44);
		memcpy(footer + 48, TABLE_MAGIC2, 8);
		buffer_append(builder->out, footer, TABLE_FOOTER2_SIZE);
		return;
	}
	cpu32_to_be_unaligned(TABLE_VERSION, footer + 32);
	cpu32_to_be_unaligned(cas_crc32c(footer, 36), footer + 36);
	memcpy(footer + 40, TABLE_MAGIC, 8);
	buffer_append(builder->out, footer, CASBOX_LSM_TABLE_FOOTER_SIZE);
}

int casbox_lsm_table_builder_finish(struct casbox_lsm_table_builder **_builder,
				    bool fsync, uoff_t *size_r,
				    uint64_t *entries_r, const char **error_r)
{
	struct casbox_lsm_table_builder *builder = *_builder;
	int ret = 0;

	*_builder = NULL;
	if (builder->error == NULL &&
	    builder_flush_block(builder) == 0) {
		builder_write_tail(builder);
		if (builder_write_out(builder) == 0 && fsync &&
		    builder->io->fsync(builder->fd) < 0) {
			builder->error = i_strdup_printf(
				"fsync(%s) failed: %m", builder->path);
		}
	}
	if (builder->error != NULL) {
		*error_r = t_strdup(builder->error);
		ret = -1;
	}
	*size_r = builder->offset;
	*entries_r = builder->entries;
	builder_free(builder);
	return ret;
}

/* ---- reading ---- */

static const char *
table_error(struct casbox_lsm_table *table, uoff_t offset, const char *reason)
{
	return t_strdup_printf("Corrupted table %s at offset %"PRIuUOFF_T
			       ": %s", table->path, offset, reason);
}

static int table_pread(struct casbox_lsm_table *table, void *buf,
		       size_t size, uoff_t offset, const char **error_r)
{
	ssize_t ret;

	if (offset > table->size || size > table->size - offset) {
		*error_r = table_error(table, offset,
				       "block points past end of file");
		return -1;
	}
	if (table->mem != NULL) {
		memcpy(buf, table->mem + offset, size);
		return 0;
	}
	if (table->tail != NULL &&
	    offset >= table->size - table->tail_size) {
		memcpy(buf, table->tail + (offset -
					   (table->size - table->tail_size)),
		       size);
		return 0;
	}
	ret = table->io->pread(table->fd, buf, size, offset);
	if (ret < 0) {
		*error_r = t_strdup_printf("pread(%s) failed: %m",
					   table->path);
		return -1;
	}
	if ((size_t)ret != size) {
		*error_r = table_error(table, offset, "file shrank");
		return -1;
	}
	return 0;
}

/* Read a block (size bytes + CRC) into buf and check the CRC; open it
   if the table is sealed. */
static int table_read_raw(struct casbox_lsm_table *table,
			  enum casbox_lsm_seal_kind kind, uoff_t offset,
			  uint32_t size, buffer_t *buf, const char **error_r)
{
	buffer_t *raw = table->key == NULL ? buf : table->sealed_buf;
	const char *error;
	unsigned char *data;
	uint32_t crc;

	if (size > TABLE_MAX_BLOCK_SIZE) {
		*error_r = table_error(table, offset, "block size too large");
		return -1;
	}
	buffer_set_used_size(raw, 0);
	data = buffer_append_space_unsafe(raw, size + 4);
	if (table_pread(table, data, size + 4, offset, error_r) < 0)
		return -1;
	crc = cas_crc32c(data, size);
	if (CASBOX_LSM_CRC_BAD(cas_crc32c_mask(crc),
			       be32_to_cpu_unaligned(data + size))) {
		*error_r = table_error(table, offset,
				       "block checksum mismatch");
		return -1;
	}
	buffer_set_used_size(raw, size);
	if (table->key == NULL)
		return 0;
	if (casbox_lsm_unseal(table->key, kind, table->file_no, offset,
			      raw->data, raw->used, buf, &error) < 0) {
		*error_r = table_error(table, offset,
			t_strdup_printf("block %s", error));
		return -1;
	}
	return 0;
}

static int block_parse(struct casbox_lsm_table *table,
		       struct casbox_lsm_block *block, uoff_t offset,
		       const unsigned char *data, size_t size,
		       const char **error_r)
{
	uint32_t n, i, restart, prev = 0;

	block->file_offset = offset;
	if (size < 4) {
		*error_r = table_error(table, offset, "block too short");
		return -1;
	}
	n = be32_to_cpu_unaligned(data + size - 4);
	if (n == 0 || n > (size - 4) / 4) {
		*error_r = table_error(table, offset,
				       "invalid restart count");
		return -1;
	}
	block->data = data;
	block->data_size = size - 4 - (size_t)n * 4;
	block->restarts = data + block->data_size;
	block->n_restarts = n;
	for (i = 0; i < n; i++) {
		restart = be32_to_cpu_unaligned(block->restarts + i * 4);
		if (restart >= block->data_size ||
		    (i == 0 && restart != 0) || (i > 0 && restart <= prev)) {
			*error_r = table_error(table, offset,
					       "invalid restart point");
			return -1;
		}
		prev = restart;
	}
	return 0;
}

static int table_read_block(struct casbox_lsm_table *table,
			    enum casbox_lsm_seal_kind kind, uoff_t offset,
			    uint32_t size, enum table_read_mode mode,
			    struct casbox_lsm_block *block,
			    const char **error_r)
{
	const unsigned char *data;
	const char *reason;
	size_t cached_size;

	if (mode != TABLE_READ_DISK) {
		data = casbox_lsm_cache_get(table->cache_id, offset,
					    &cached_size);
		/* a sealed block's cached size is its plaintext size */
		if (data != NULL &&
		    (cached_size == size || table->key != NULL)) {
			if (mode == TABLE_READ_CACHED) {
				buffer_set_used_size(block->buf, 0);
				buffer_append(block->buf, data, cached_size);
				data = block->buf->data;
			}
			/* cached blocks were validated when read */
			return block_parse(table, block, offset, data,
					   cached_size, error_r);
		}
	}
	if (table_read_raw(table, kind, offset, size, block->buf,
			   error_r) < 0 ||
	    block_parse(table, block, offset, block->buf->data,
			block->buf->used, error_r) < 0)
		return -1;
	T_BEGIN {
		/* reasons are static strings */
		reason = casbox_lsm_block_validate(block);
	} T_END;
	if (reason != NULL) {
		*error_r = table_error(table, offset, reason);
		return -1;
	}
	if (mode != TABLE_READ_DISK) {
		casbox_lsm_cache_put(table->cache_id, offset,
				     block->buf->data, block->buf->used);
	}
	return 0;
}

static int table_load_index(struct casbox_lsm_table *table,
			    uoff_t offset, uint32_t size,
			    const char **error_r)
{
	struct casbox_lsm_block block;
	struct casbox_lsm_block_iter bi;
	struct table_index_entry *entry;
	buffer_t *keys;
	uoff_t prev_end = 0;

	i_zero(&block);
	i_zero(&bi);
	block.buf = table->index_block;
	if (table_read_block(table, CASBOX_LSM_SEAL_INDEX, offset, size,
			     TABLE_READ_DISK, &block, error_r) < 0)
		return -1;
	/* decoded keys go into keys; entries hold offsets until the end */
	keys = buffer_create_dynamic(default_pool, block.data_size + 64);
	bi.key = buffer_create_dynamic(default_pool, 128);
	for (casbox_lsm_block_iter_init(&bi, &block); bi.valid;
	     casbox_lsm_block_iter_next(&bi)) {
		if (bi.value_size != 12) {
			bi.error = "invalid block handle";
			break;
		}
		entry = array_append_space(&table->index);
		entry->offset = be64_to_cpu_unaligned(bi.value);
		entry->size = be32_to_cpu_unaligned(bi.value + 8);
		entry->last_key_size = bi.key->used;
		entry->key_off = keys->used;
		buffer_append_buf(keys, bi.key, 0, SIZE_MAX);
		if (entry->offset < prev_end ||
		    entry->offset + entry->size + 4 > offset) {
			bi.error = "block handle out of range";
			break;
		}
		prev_end = entry->offset + entry->size + 4;
	}
	buffer_free(&bi.key);
	if (bi.error != NULL) {
		buffer_free(&keys);
		*error_r = table_error(table, offset, bi.error);
		return -1;
	}
	/* keys is never modified again, so pointers into it stay valid */
	buffer_free(&table->index_block);
	table->index_block = keys;
	array_foreach_modifiable(&table->index, entry) {
		entry->last_key = CONST_PTR_OFFSET(keys->data,
						   entry->key_off);
	}
	return 0;
}

static int table_load(struct casbox_lsm_table *table,
		      const struct casbox_lsm_key *key, const char **error_r)
{
	unsigned char footer[TABLE_FOOTER2_SIZE], magic[8];
	uoff_t index_off, bloom_off, footer_off;
	uint32_t index_size, bloom_size, version, epoch;
	size_t footer_size;

	if (table->size < CASBOX_LSM_TABLE_FOOTER_SIZE) {
		*error_r = table_error(table, 0, "file too short for footer");
		return -1;
	}
	if (table_pread(table, magic, sizeof(magic), table->size - 8,
			error_r) < 0)
		return -1;
	if (memcmp(magic, TABLE_MAGIC, 8) == 0) {
		footer_size = CASBOX_LSM_TABLE_FOOTER_SIZE;
		version = TABLE_VERSION;
	} else if (memcmp(magic, TABLE_MAGIC2, 8) == 0 &&
		   table->size >= TABLE_FOOTER2_SIZE) {
		footer_size = TABLE_FOOTER2_SIZE;
		version = TABLE_VERSION2;
	} else {
		*error_r = table_error(table, table->size - 8, "bad magic");
		return -1;
	}
	footer_off = table->size - footer_size;
	if (table_pread(table, footer, footer_size, footer_off,
			error_r) < 0)
		return -1;
	if (CASBOX_LSM_CRC_BAD(cas_crc32c(footer, footer_size - 12),
			       be32_to_cpu_unaligned(footer +
						     footer_size - 12))) {
		*error_r = table_error(table, footer_off,
				       "footer checksum mismatch");
		return -1;
	}
	if (be32_to_cpu_unaligned(footer + footer_size - 16) != version) {
		*error_r = table_error(table, footer_off,
				       "unsupported version");
		return -1;
	}
	epoch = version == TABLE_VERSION ? CASBOX_LSM_EPOCH_PLAINTEXT :
		be32_to_cpu_unaligned(footer + 32);
	table->epoch = epoch;
	if (epoch != CASBOX_LSM_EPOCH_PLAINTEXT) {
		if (key == NULL) {
			*error_r = table_error(table, footer_off,
				"table is sealed but no key was given");
			return -1;
		}
		if (key->epoch != epoch) {
			*error_r = table_error(table, footer_off,
				t_strdup_printf("table sealed with epoch %u, "
						"MANIFEST says %u", epoch,
						key->epoch));
			return -1;
		}
		table->key = casbox_lsm_key_dup(key);
		table->sealed_buf = buffer_create_dynamic(default_pool,
						CASBOX_LSM_BLOCK_SIZE + 128);
	} else if (key != NULL) {
		*error_r = table_error(table, footer_off,
			"table is plaintext, MANIFEST says sealed");
		return -1;
	}
	index_off = be64_to_cpu_unaligned(footer);
	index_size = be32_to_cpu_unaligned(footer + 8);
	bloom_off = be64_to_cpu_unaligned(footer + 12);
	bloom_size = be32_to_cpu_unaligned(footer + 20);
	table->entries = be64_to_cpu_unaligned(footer + 24);
	if (index_off > footer_off || bloom_off > footer_off ||
	    index_size + (uoff_t)4 > bloom_off - index_off ||
	    bloom_size + (uoff_t)4 != footer_off - bloom_off) {
		*error_r = table_error(table, footer_off,
				       "footer block handles out of range");
		return -1;
	}
	if (table_read_raw(table, CASBOX_LSM_SEAL_BLOOM, bloom_off, bloom_size,
			   table->bloom, error_r) < 0)
		return -1;
	return table_load_index(table, index_off, index_size, error_r);
}

static int table_read_tail(struct casbox_lsm_table *table,
			   const char **error_r)
{
	size_t size = I_MIN(table->size, TABLE_TAIL_READ_SIZE);
	unsigned char *tail;

	tail = i_malloc(size);
	if (table_pread(table, tail, size, table->size - size,
			error_r) < 0) {
		i_free(tail);
		return -1;
	}
	table->tail = tail;
	table->tail_size = size;
	return 0;
}

static struct casbox_lsm_table *table_alloc(const char *path)
{
	struct casbox_lsm_table *table;

	table = i_new(struct casbox_lsm_table, 1);
	table->refcount = 1;
	table->fd = -1;
	table->path = i_strdup(path);
	table->index_block = buffer_create_dynamic(default_pool, 1024);
	table->bloom = buffer_create_dynamic(default_pool, 1024);
	i_array_init(&table->index, 64);
	table->lookup_block.buf = buffer_create_dynamic(default_pool,
						CASBOX_LSM_BLOCK_SIZE + 64);
	table->lookup_iter.key = buffer_create_dynamic(default_pool, 128);
	table->cache_id = casbox_lsm_cache_register();
	table->epoch = CASBOX_LSM_EPOCH_PLAINTEXT;
	return table;
}

int casbox_lsm_table_open(const struct cas_io *io, int fd,
			  const char *path, uint64_t file_no,
			  const struct casbox_lsm_key *key,
			  struct casbox_lsm_table **table_r,
			  const char **error_r)
{
	struct casbox_lsm_table *table;
	struct stat st;

	table = table_alloc(path);
	table->io = io;
	table->fd = fd;
	table->file_no = file_no;
	if (io->fstat(fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", path);
		casbox_lsm_table_unref(&table);
		return -1;
	}
	table->size = st.st_size;
	if (table_read_tail(table, error_r) < 0 ||
	    table_load(table, key, error_r) < 0) {
		i_free(table->tail);
		casbox_lsm_table_unref(&table);
		return -1;
	}
	/* the blocks it held were checked and decoded into their own
	   buffers; data blocks are read on demand */
	i_free(table->tail);
	*table_r = table;
	return 0;
}

int casbox_lsm_table_open_mem(const void *data, size_t size,
			      struct casbox_lsm_table **table_r,
			      const char **error_r)
{
	struct casbox_lsm_table *table;

	table = table_alloc("(memory)");
	table->mem = data;
	table->size = size;
	if (table_load(table, NULL, error_r) < 0) {
		casbox_lsm_table_unref(&table);
		return -1;
	}
	*table_r = table;
	return 0;
}

void casbox_lsm_table_ref(struct casbox_lsm_table *table)
{
	i_assert(table->refcount > 0);
	table->refcount++;
}

void casbox_lsm_table_unref(struct casbox_lsm_table **_table)
{
	struct casbox_lsm_table *table = *_table;

	*_table = NULL;
	i_assert(table->refcount > 0);
	if (--table->refcount > 0)
		return;
	if (table->fd != -1 && table->io->close(table->fd) < 0)
		i_error("close(%s) failed: %m", table->path);
	casbox_lsm_cache_unregister(table->cache_id);
	buffer_free(&table->lookup_block.buf);
	buffer_free(&table->lookup_iter.key);
	buffer_free(&table->index_block);
	buffer_free(&table->bloom);
	array_free(&table->index);
	casbox_lsm_key_free(&table->key);
	if (table->sealed_buf != NULL)
		buffer_free(&table->sealed_buf);
	i_free(table->path);
	i_free(table);
}

uint32_t casbox_lsm_table_epoch(struct casbox_lsm_table *table)
{
	return table->epoch;
}

uint64_t casbox_lsm_table_file_no(struct casbox_lsm_table *table)
{
	return table->file_no;
}

uoff_t casbox_lsm_table_size(struct casbox_lsm_table *table)
{
	return table->size;
}

/* Index of the first block whose last key >= key (count if none). */
static unsigned int
table_find_block(struct casbox_lsm_table *table, const unsigned char *key,
		 size_t key_size)
{
	const struct table_index_entry *entries;
	unsigned int count, left = 0, right, mid;

	entries = array_get(&table->index, &count);
	right = count;
	while (left < right) {
		mid = (left + right) / 2;
		if (casbox_lsm_key_cmp(entries[mid].last_key,
				       entries[mid].last_key_size,
				       key, key_size) < 0)
			left = mid + 1;
		else
			right = mid;
	}
	return left;
}

/* ---- table source ---- */

static void table_source_set(struct table_source *ts)
{
	struct casbox_lsm_block_iter *bi = &ts->bi;

	ts->src.valid = bi->valid;
	if (!bi->valid)
		return;
	ts->src.type = bi->type;
	ts->src.key = bi->key->data;
	ts->src.key_size = bi->key->used;
	ts->src.value = bi->value;
	ts->src.value_size = bi->value_size;
}

static void table_source_fail(struct table_source *ts, uoff_t offset,
			      const char *reason)
{
	ts->src.valid = FALSE;
	if (ts->src.error != NULL)
		return;
	ts->error_offset = offset;
	ts->error_reason = i_strdup(reason);
	ts->src.error = i_strdup(table_error(ts->table, offset, reason));
}

/* Load block idx and position at its first entry (or key). */
static bool table_source_load(struct table_source *ts, unsigned int idx,
			      const unsigned char *key, size_t key_size)
{
	const struct table_index_entry *entry;
	const char *error;

	ts->block_idx = idx;
	ts->src.valid = FALSE;
	if (idx >= array_count(&ts->table->index))
		return FALSE;
	entry = array_idx(&ts->table->index, idx);
	if (table_read_block(ts->table, CASBOX_LSM_SEAL_DATA, entry->offset,
			     entry->size,
			     ts->verify ? TABLE_READ_DISK : TABLE_READ_CACHED,
			     &ts->block, &error) < 0) {
		ts->src.valid = FALSE;
		if (ts->src.error == NULL) {
			ts->error_offset = entry->offset;
			ts->error_reason = i_strdup(error);
			ts->src.error = i_strdup(error);
		}
		return FALSE;
	}
	if (key != NULL)
		casbox_lsm_block_iter_seek(&ts->bi, &ts->block, key, key_size);
	else
		casbox_lsm_block_iter_init(&ts->bi, &ts->block);
	if (ts->bi.error != NULL) {
		table_source_fail(ts, entry->offset, ts->bi.error);
		return FALSE;
	}
	if (ts->bi.valid &&
	    casbox_lsm_key_cmp(ts->bi.key->data, ts->bi.key->used,
			       entry->last_key, entry->last_key_size) > 0) {
		table_source_fail(ts, entry->offset,
				  "block key above its index key");
		return FALSE;
	}
	if (ts->bi.valid && idx > 0 &&
	    casbox_lsm_key_cmp(ts->bi.key->data, ts->bi.key->used,
			       entry[-1].last_key,
			       entry[-1].last_key_size) <= 0) {
		table_source_fail(ts, entry->offset,
				  "block overlaps the previous block");
		return FALSE;
	}
	table_source_set(ts);
	return ts->bi.valid;
}

static void table_source_seek(struct casbox_lsm_source *src,
			      const unsigned char *key, size_t key_size)
{
	struct table_source *ts = (struct table_source *)src;
	unsigned int idx;

	if (src->error != NULL)
		return;
	idx = table_find_block(ts->table, key, key_size);
	if (!table_source_load(ts, idx, key, key_size) &&
	    src->error == NULL && idx < array_count(&ts->table->index)) {
		/* index said the key is <= this block's last key */
		table_source_fail(ts, ts->block.file_offset,
				  "block shorter than index");
	}
}

static void table_source_next(struct casbox_lsm_source *src)
{
	struct table_source *ts = (struct table_source *)src;
	const struct table_index_entry *entry;

	i_assert(src->valid);
	entry = array_idx(&ts->table->index, ts->block_idx);
	if (casbox_lsm_block_iter_next(&ts->bi)) {
		if (casbox_lsm_key_cmp(ts->bi.key->data, ts->bi.key->used,
				       entry->last_key,
				       entry->last_key_size) > 0) {
			table_source_fail(ts, entry->offset,
					  "block key above index key");
			return;
		}
		table_source_set(ts);
		return;
	}
	if (ts->bi.error != NULL) {
		table_source_fail(ts, entry->offset, ts->bi.error);
		return;
	}
	if (casbox_lsm_key_cmp(ts->bi.key->data, ts->bi.key->used,
			       entry->last_key, entry->last_key_size) != 0) {
		table_source_fail(ts, entry->offset,
				  "block does not end at its index key");
		return;
	}
	(void)table_source_load(ts, ts->block_idx + 1, NULL, 0);
}

static void table_source_free(struct casbox_lsm_source *src)
{
	struct table_source *ts = (struct table_source *)src;

	buffer_free(&ts->block.buf);
	buffer_free(&ts->bi.key);
	casbox_lsm_table_unref(&ts->table);
	i_free(ts->error_reason);
	i_free(ts->src.error);
	i_free(ts);
}

struct casbox_lsm_source *
casbox_lsm_table_source(struct casbox_lsm_table *table)
{
	struct table_source *ts;

	ts = i_new(struct table_source, 1);
	ts->src.seek = table_source_seek;
	ts->src.next = table_source_next;
	ts->src.free = table_source_free;
	ts->table = table;
	casbox_lsm_table_ref(table);
	ts->block.buf = buffer_create_dynamic(default_pool,
					      CASBOX_LSM_BLOCK_SIZE + 64);
	ts->bi.key = buffer_create_dynamic(default_pool, 128);
	return &ts->src;
}

int casbox_lsm_table_lookup(struct casbox_lsm_table *table,
			    const void *key, size_t key_size,
			    enum casbox_lsm_type *type_r, buffer_t *value_r,
			    const char **error_r)
{
	const struct table_index_entry *entry;
	struct casbox_lsm_block_iter *bi = &table->lookup_iter;
	unsigned int idx;

	if (!casbox_lsm_bloom_may_contain(table->bloom, key, key_size))
		return 0;
	idx = table_find_block(table, key, key_size);
	if (idx >= array_count(&table->index))
		return 0;
	entry = array_idx(&table->index, idx);
	/* the same checks a table source does, without allocating one */
	if (table_read_block(table, CASBOX_LSM_SEAL_DATA, entry->offset,
			     entry->size, TABLE_READ_BORROW, &table->lookup_block,
			     error_r) < 0)
		return -1;
	casbox_lsm_block_iter_seek(bi, &table->lookup_block, key, key_size);
	if (bi->error != NULL) {
		*error_r = table_error(table, entry->offset, bi->error);
		return -1;
	}
	if (!bi->valid) {
		*error_r = table_error(table, entry->offset,
				       "block shorter than index");
		return -1;
	}
	if (casbox_lsm_key_cmp(bi->key->data, bi->key->used,
			       entry->last_key, entry->last_key_size) > 0) {
		*error_r = table_error(table, entry->offset,
				       "block key above its index key");
		return -1;
	}
	if (casbox_lsm_key_cmp(bi->key->data, bi->key->used,
			       key, key_size) != 0)
		return 0;
	*type_r = bi->type;
	if (bi->type == CASBOX_LSM_TYPE_PUT)
		buffer_append(value_r, bi->value, bi->value_size);
	return 1;
}

int casbox_lsm_table_verify(struct casbox_lsm_table *table,
			    casbox_lsm_damage_callback_t *report,
			    void *context)
{
	struct casbox_lsm_source *src;
	uint64_t count = 0;
	int ret = 1;

	src = casbox_lsm_table_source(table);
	((struct table_source *)src)->verify = TRUE;
	for (src->seek(src, (const unsigned char *)"", 0); src->valid;
	     src->next(src))
		count++;
	if (src->error != NULL) {
		struct table_source *ts = (struct table_source *)src;

		report(context, table->path, ts->error_offset,
		       ts->error_reason);
		ret = 0;
	} else if (count != table->entries) {
		report(context, table->path, table->size -
		       (table->key != NULL ? TABLE_FOOTER2_SIZE :
			CASBOX_LSM_TABLE_FOOTER_SIZE),
		       "entry count differs from footer");
		ret = 0;
	}
	casbox_lsm_source_free(&src);
	return ret;
}
