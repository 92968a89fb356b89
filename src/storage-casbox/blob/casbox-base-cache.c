/* Cache of decoded base prefixes (casbox-base-cache.h): a doubly linked
   LRU list, most recent first, and a hash of the blob ids (4 MiB of
   mail-sized bases is hundreds of entries: walking the list on every
   lookup showed in sequential reads). */

#include "lib.h"
#include "hash.h"
#include "casbox-base-cache.h"
#include "casbox-base-arena.h"

#include <sodium.h>

struct casbox_base_cache {
	/* the bound and what the entries take in memory
	   (casbox_base_plain_footprint()); bytes = their data */
	size_t max_bytes, memory, bytes;
	unsigned int count;
	struct casbox_base_plain *head, *tail;
	/* &plain->id -> plain */
	HASH_TABLE(struct cas_blob_id *, struct casbox_base_plain *) ids;
};

static unsigned int casbox_base_id_hash(const struct cas_blob_id *id)
{
	/* keyed BLAKE2b output: any 4 bytes are uniform */
	return (unsigned int)id->id[0] | ((unsigned int)id->id[1] << 8) |
		((unsigned int)id->id[2] << 16) |
		((unsigned int)id->id[3] << 24);
}

static int casbox_base_id_cmp(const struct cas_blob_id *a,
			      const struct cas_blob_id *b)
{
	return memcmp(a->id, b->id, CAS_BLOB_ID_SIZE);
}

void (*casbox_base_plain_wipe_hook)(const unsigned char *data,
				    size_t size) = NULL;

/* Locked buffers of freed entries that were not arena blocks
   (casbox-base-arena.h: the arena was full), wiped, for the next
   entries: sodium_malloc() and sodium_free() are an mmap, mprotects, mlock and
   munmap each, which for mail-sized bases cost more than decoding
   them (measured: 2.8x slower sequential reads of the spamassassin
   corpus without this). Per process, a few buffers of at most the
   largest prefix, kept when no cache is left (an LMTP process opens
   and closes a store per delivery) until casbox_base_pool_free() at
   plugin deinit (not at exit: lib_atexit() would call into a plugin
   Dovecot has unloaded by then). */
#define CASBOX_BASE_POOL_MAX 32
/* ... and at most this much memory (half the default cache). Eight
   buffers and 256 KiB (two 128 KiB-class ones) matched too few of a
   full cache's new entries: a FETCH of 1000 usrp-users messages did
   280 sodium_malloc()s with them and 138 with these, most of them
   filling the cache (doc/benchmarks.md, "FETCH CPU"). */
#define CASBOX_BASE_POOL_BYTES (1024 * 1024)
static struct {
	unsigned char *data;
	size_t capacity;
} casbox_base_pool[CASBOX_BASE_POOL_MAX];
static unsigned int casbox_base_pool_count;
static size_t casbox_base_pool_bytes;
unsigned int casbox_base_sodium_allocs = 0;

void casbox_base_pool_free(void)
{
	while (casbox_base_pool_count > 0) {
		casbox_base_pool_count--;
		sodium_free(casbox_base_pool[casbox_base_pool_count].data);
	}
	casbox_base_pool_bytes = 0;
	casbox_base_arena_free();
}

/* Capacity classes: 4 KiB, then powers of two, so a buffer is reused
   by any entry of its class. */
static size_t casbox_base_capacity(size_t size)
{
	size_t cap = 4096;

	while (cap < size)
		cap <<= 1;
	return cap;
}

size_t casbox_base_plain_footprint(size_t size)
{
	size_t page = 4096, cap = casbox_base_capacity(size);

	/* sodium_malloc(): the buffer and its 16-byte canary rounded up
	   to pages, and the page before them that holds the size (the
	   guard pages around them are never touched) */
	return (cap + 16 + page - 1) / page * page + page;
}

static unsigned char *casbox_base_alloc(size_t size, size_t *capacity_r)
{
	size_t cap = casbox_base_capacity(size);
	unsigned char *data;
	unsigned int i;

	/* the arena first: no system call (casbox-base-arena.h); then
	   the pool, or a sodium_malloc() of its own when both are full */
	if ((data = casbox_base_arena_alloc(cap)) != NULL) {
		*capacity_r = cap;
		return data;
	}
	/* newest first; the rest keep their order (oldest first) */
	for (i = casbox_base_pool_count; i > 0; i--) {
		if (casbox_base_pool[i - 1].capacity == cap) {
			data = casbox_base_pool[i - 1].data;
			casbox_base_pool_count--;
			memmove(casbox_base_pool + i - 1, casbox_base_pool + i,
				(casbox_base_pool_count - (i - 1)) *
				sizeof(casbox_base_pool[0]));
			casbox_base_pool_bytes -=
				casbox_base_plain_footprint(cap);
			*capacity_r = cap;
			return data;
		}
	}
	casbox_base_sodium_allocs++;
	data = sodium_malloc(cap);
	if (data == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "sodium_malloc() failed: %m");
	*capacity_r = cap;
	return data;
}

static void casbox_base_pool_drop_oldest(void)
{
	i_assert(casbox_base_pool_count > 0);
	casbox_base_pool_bytes -=
		casbox_base_plain_footprint(casbox_base_pool[0].capacity);
	sodium_free(casbox_base_pool[0].data);
	casbox_base_pool_count--;
	memmove(casbox_base_pool, casbox_base_pool + 1,
		casbox_base_pool_count * sizeof(casbox_base_pool[0]));
}

/* data is wiped (all of it that was ever written). A full pool gives
   up its oldest buffers for this one, so it holds the capacity classes
   freed last: those a cache in steady state (entries evicted for each
   one added) allocates next. */
static void casbox_base_release(unsigned char *data, size_t capacity)
{
	size_t footprint = casbox_base_plain_footprint(capacity);

	if (casbox_base_arena_release(data, capacity))
		return;
	if (footprint > CASBOX_BASE_POOL_BYTES) {
		sodium_free(data);
		return;
	}
	while (casbox_base_pool_count == CASBOX_BASE_POOL_MAX ||
	       casbox_base_pool_bytes + footprint > CASBOX_BASE_POOL_BYTES)
		casbox_base_pool_drop_oldest();
	casbox_base_pool_bytes += footprint;
	casbox_base_pool[casbox_base_pool_count].data = data;
	casbox_base_pool[casbox_base_pool_count].capacity = capacity;
	casbox_base_pool_count++;
}

struct casbox_base_plain *
casbox_base_plain_new(const struct cas_blob_id *id, uint64_t plain_size,
		      uint8_t depth)
{
	struct casbox_base_plain *plain;

	plain = i_new(struct casbox_base_plain, 1);
	plain->id = *id;
	plain->plain_size = plain_size;
	plain->depth = depth;
	plain->size = I_MIN(plain_size, CASBOX_BASE_PREFIX_MAX);
	plain->data = casbox_base_alloc(plain->size, &plain->capacity);
	plain->refcount = 1;
	return plain;
}

struct casbox_base_plain *
casbox_base_plain_new_copy(const struct cas_blob_id *id, uint64_t plain_size,
			   uint8_t depth, const void *data, size_t size)
{
	struct casbox_base_plain *plain =
		casbox_base_plain_new(id, plain_size, depth);

	i_assert(size >= plain->size);
	if (plain->size > 0)
		memcpy(plain->data, data, plain->size);
	casbox_base_plain_seal(plain);
	return plain;
}

void casbox_base_plain_seal(struct casbox_base_plain *plain)
{
	plain->sealed = TRUE;
}

const unsigned char *
casbox_base_plain_digest(struct casbox_base_plain *plain)
{
	i_assert(plain->sealed);
	if (!plain->digest_set) {
		casbox_frame_base_digest(plain->data, plain->size,
					 plain->digest);
		plain->digest_set = TRUE;
	}
	return plain->digest;
}

void casbox_base_plain_ref(struct casbox_base_plain *plain)
{
	i_assert(plain->refcount > 0);
	plain->refcount++;
}

void casbox_base_plain_unref(struct casbox_base_plain **_plain)
{
	struct casbox_base_plain *plain = *_plain;

	if (plain == NULL)
		return;
	*_plain = NULL;
	i_assert(plain->refcount > 0);
	if (--plain->refcount > 0)
		return;
	i_assert(!plain->cached);
	/* only data[0..size) was written: the rest of a reused buffer was
	   wiped when its earlier entry went */
	sodium_memzero(plain->data, plain->size);
	if (casbox_base_plain_wipe_hook != NULL)
		casbox_base_plain_wipe_hook(plain->data, plain->size);
	casbox_base_release(plain->data, plain->capacity);
	sodium_memzero(plain->digest, sizeof(plain->digest));
	i_free(plain);
}

struct casbox_base_cache *casbox_base_cache_create(size_t max_bytes)
{
	struct casbox_base_cache *cache = i_new(struct casbox_base_cache, 1);

	cache->max_bytes = max_bytes != 0 ? max_bytes :
		CASBOX_BASE_CACHE_DEFAULT_SIZE;
	hash_table_create(&cache->ids, default_pool, 0, casbox_base_id_hash,
			  casbox_base_id_cmp);
	return cache;
}

static void casbox_base_cache_unlink(struct casbox_base_cache *cache,
				     struct casbox_base_plain *plain)
{
	if (plain->prev != NULL)
		plain->prev->next = plain->next;
	else
		cache->head = plain->next;
	if (plain->next != NULL)
		plain->next->prev = plain->prev;
	else
		cache->tail = plain->prev;
	plain->prev = plain->next = NULL;
}

static void casbox_base_cache_push_front(struct casbox_base_cache *cache,
					 struct casbox_base_plain *plain)
{
	plain->prev = NULL;
	plain->next = cache->head;
	if (cache->head != NULL)
		cache->head->prev = plain;
	cache->head = plain;
	if (cache->tail == NULL)
		cache->tail = plain;
}

static void casbox_base_cache_drop(struct casbox_base_cache *cache,
				   struct casbox_base_plain *plain)
{
	casbox_base_cache_unlink(cache, plain);
	hash_table_remove(cache->ids, &plain->id);
	cache->bytes -= plain->size;
	cache->memory -= casbox_base_plain_footprint(plain->size);
	cache->count--;
	plain->cached = FALSE;
	casbox_base_plain_unref(&plain);
}

void casbox_base_cache_clear(struct casbox_base_cache *cache)
{
	while (cache->head != NULL)
		casbox_base_cache_drop(cache, cache->head);
}

void casbox_base_cache_destroy(struct casbox_base_cache **_cache)
{
	struct casbox_base_cache *cache = *_cache;

	if (cache == NULL)
		return;
	*_cache = NULL;
	casbox_base_cache_clear(cache);
	hash_table_destroy(&cache->ids);
	i_free(cache);
}

static struct casbox_base_plain *
casbox_base_cache_find(struct casbox_base_cache *cache,
		       const struct cas_blob_id *id)
{
	return hash_table_lookup(cache->ids, id);
}

bool casbox_base_cache_has(struct casbox_base_cache *cache,
			   const struct cas_blob_id *id)
{
	return casbox_base_cache_find(cache, id) != NULL;
}

struct casbox_base_plain *
casbox_base_cache_lookup(struct casbox_base_cache *cache,
			 const struct cas_blob_id *id)
{
	struct casbox_base_plain *plain = casbox_base_cache_find(cache, id);

	if (plain == NULL)
		return NULL;
	casbox_base_cache_unlink(cache, plain);
	casbox_base_cache_push_front(cache, plain);
	casbox_base_plain_ref(plain);
	return plain;
}

void casbox_base_cache_add(struct casbox_base_cache *cache,
			   struct casbox_base_plain *plain)
{
	struct casbox_base_plain *old;
	size_t memory;

	i_assert(plain->sealed && !plain->cached);
	old = casbox_base_cache_find(cache, &plain->id);
	if (old != NULL)
		casbox_base_cache_drop(cache, old);
	memory = casbox_base_plain_footprint(plain->size);
	if (memory > cache->max_bytes)
		return;
	while (cache->tail != NULL &&
	       cache->memory + memory > cache->max_bytes)
		casbox_base_cache_drop(cache, cache->tail);
	casbox_base_plain_ref(plain);
	plain->cached = TRUE;
	casbox_base_cache_push_front(cache, plain);
	hash_table_insert(cache->ids, &plain->id, plain);
	cache->bytes += plain->size;
	cache->memory += memory;
	cache->count++;
}

void casbox_base_cache_get_stats(struct casbox_base_cache *cache,
				 unsigned int *entries_r, size_t *bytes_r)
{
	*entries_r = cache->count;
	*bytes_r = cache->bytes;
}
