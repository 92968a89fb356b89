/* Process-wide LRU cache of table data blocks that passed their CRC and
   the structure walk, bounded in bytes (casbox_lsm_cache_set_limit()).

   Tables are immutable, so a cached block never goes stale; entries are
   keyed by a table id that is never reused within the process, and a
   table drops its entries when it is freed. One cache for all handles
   of the process bounds the memory whatever the number of stores. The
   cache itself goes away when the last table does. */

#include "lib.h"
#include "hash.h"
#include "casbox-lsm-private.h"

struct lsm_cache_key {
	uint64_t table_id;
	uoff_t offset;
};

struct lsm_cache_entry {
	struct lsm_cache_entry *prev, *next; /* LRU: head = newest */
	struct lsm_cache_key key;
	size_t size;
	unsigned char data[];
};

HASH_TABLE_DEFINE_TYPE(lsm_cache, struct lsm_cache_key *,
		       struct lsm_cache_entry *);

static HASH_TABLE_TYPE(lsm_cache) cache_hash;
static struct lsm_cache_entry *cache_head, *cache_tail;
static size_t cache_bytes, cache_limit = CASBOX_LSM_CACHE_BYTES;
static unsigned int cache_users;
static uint64_t cache_last_id;

static unsigned int lsm_cache_key_hash(const struct lsm_cache_key *key)
{
	uint64_t h = key->table_id * 0x9e3779b97f4a7c15ULL ^ key->offset;

	return (unsigned int)(h ^ (h >> 29));
}

static int lsm_cache_key_cmp(const struct lsm_cache_key *a,
			     const struct lsm_cache_key *b)
{
	return a->table_id == b->table_id && a->offset == b->offset ? 0 : 1;
}

uint64_t casbox_lsm_cache_register(void)
{
	if (cache_users++ == 0) {
		hash_table_create(&cache_hash, default_pool, 256,
				  lsm_cache_key_hash, lsm_cache_key_cmp);
	}
	return ++cache_last_id;
}

static void lsm_cache_unlink(struct lsm_cache_entry *entry)
{
	if (entry->prev != NULL)
		entry->prev->next = entry->next;
	else
		cache_head = entry->next;
	if (entry->next != NULL)
		entry->next->prev = entry->prev;
	else
		cache_tail = entry->prev;
	entry->prev = entry->next = NULL;
}

static void lsm_cache_push_front(struct lsm_cache_entry *entry)
{
	entry->prev = NULL;
	entry->next = cache_head;
	if (cache_head != NULL)
		cache_head->prev = entry;
	cache_head = entry;
	if (cache_tail == NULL)
		cache_tail = entry;
}

static void lsm_cache_remove(struct lsm_cache_entry *entry)
{
	hash_table_remove(cache_hash, &entry->key);
	lsm_cache_unlink(entry);
	cache_bytes -= entry->size;
	i_free(entry);
}

void casbox_lsm_cache_unregister(uint64_t table_id)
{
	struct lsm_cache_entry *entry, *next;

	i_assert(cache_users > 0);
	for (entry = cache_head; entry != NULL; entry = next) {
		next = entry->next;
		if (entry->key.table_id == table_id)
			lsm_cache_remove(entry);
	}
	if (--cache_users == 0) {
		i_assert(cache_head == NULL && cache_bytes == 0);
		hash_table_destroy(&cache_hash);
	}
}

size_t casbox_lsm_cache_get_used(void)
{
	return cache_bytes;
}

void casbox_lsm_cache_set_limit(size_t bytes)
{
	cache_limit = bytes;
	while (cache_tail != NULL && cache_bytes > cache_limit)
		lsm_cache_remove(cache_tail);
}

const unsigned char *
casbox_lsm_cache_get(uint64_t table_id, uoff_t offset, size_t *size_r)
{
	struct lsm_cache_key key = { .table_id = table_id, .offset = offset };
	struct lsm_cache_entry *entry;

	entry = hash_table_lookup(cache_hash, &key);
	if (entry == NULL)
		return NULL;
	if (entry != cache_head) {
		lsm_cache_unlink(entry);
		lsm_cache_push_front(entry);
	}
	*size_r = entry->size;
	return entry->data;
}

void casbox_lsm_cache_put(uint64_t table_id, uoff_t offset,
			  const void *data, size_t size)
{
	struct lsm_cache_key key = { .table_id = table_id, .offset = offset };
	struct lsm_cache_entry *entry;

	if (size > CASBOX_LSM_CACHE_MAX_BLOCK || size > cache_limit ||
	    hash_table_lookup(cache_hash, &key) != NULL)
		return;
	while (cache_tail != NULL && cache_bytes + size > cache_limit)
		lsm_cache_remove(cache_tail);
	entry = i_malloc(sizeof(*entry) + size);
	entry->key = key;
	entry->size = size;
	memcpy(entry->data, data, size);
	hash_table_insert(cache_hash, &entry->key, entry);
	lsm_cache_push_front(entry);
	cache_bytes += size;
}
