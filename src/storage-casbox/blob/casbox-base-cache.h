#ifndef CASBOX_BASE_CACHE_H
#define CASBOX_BASE_CACHE_H

/* Decoded base plaintext for delta frames (frame version 3,
   doc/casbox-format.md): the first min(plain_size,
   CASBOX_BASE_PREFIX_MAX) bytes of a base blob, in locked memory
   (never swapped or dumped: a block of the process's base arena,
   casbox-base-arena.h, else a sodium_malloc() of its own), wiped when
   the last reference goes (the wiped buffer is kept for the next
   entry: the arena's, and a few others per process). A cache keeps the
   most recently used ones up to a byte bound, so sequential FETCHes of
   replies to one message decode that message once, not once per
   reply. One cache per pack store
   (a process serves one user per store), not shared between users. */

#include "cas-key.h"
#include "casbox-frame.h"

struct casbox_base_cache;

struct casbox_base_plain {
	struct cas_blob_id id;
	/* the base blob's whole size and its chain depth */
	uint64_t plain_size;
	uint8_t depth;
	/* the prefix: size = min(plain_size, CASBOX_BASE_PREFIX_MAX) */
	unsigned char *data;
	size_t size;

	/* private */
	/* casbox_frame_base_digest() of data: casbox_base_plain_digest() */
	unsigned char digest[CASBOX_BASE_DIGEST_SIZE];
	size_t capacity;
	int refcount;
	bool sealed, cached, digest_set;
	struct casbox_base_plain *prev, *next;
};

/* A new, unfilled prefix of base id (refcount 1): fill data[0..size),
   then casbox_base_plain_seal(). */
struct casbox_base_plain *
casbox_base_plain_new(const struct cas_blob_id *id, uint64_t plain_size,
		      uint8_t depth);
/* The same, filled with a copy of data (at least the prefix size; more
   is ignored). */
struct casbox_base_plain *
casbox_base_plain_new_copy(const struct cas_blob_id *id, uint64_t plain_size,
			   uint8_t depth, const void *data, size_t size);
/* The data must not change after this. */
void casbox_base_plain_seal(struct casbox_base_plain *plain);
/* casbox_frame_base_digest() of a sealed plain's data, computed on the
   first call: only a delta opened against the base needs it, and most
   lead parts a FETCH keeps as bases are never used as one. */
const unsigned char *
casbox_base_plain_digest(struct casbox_base_plain *plain);
void casbox_base_plain_ref(struct casbox_base_plain *plain);
/* The last unref wipes and frees the data. */
void casbox_base_plain_unref(struct casbox_base_plain **plain);

/* What an entry of size bytes takes in memory: its buffer (a capacity
   class of at least 4 KiB) and sodium_malloc()'s canary and header
   page; a 3 kB base takes 12 KiB. The cache's bound counts this, so it
   bounds the RSS the entries add. */
size_t casbox_base_plain_footprint(size_t size);

/* max_bytes (memory, casbox_base_plain_footprint()) = 0:
   CASBOX_BASE_CACHE_DEFAULT_SIZE */
#define CASBOX_BASE_CACHE_DEFAULT_SIZE (4 * 1024 * 1024)
struct casbox_base_cache *casbox_base_cache_create(size_t max_bytes);
/* Drops the cache's references (entries still referenced elsewhere
   live on until their last unref). */
void casbox_base_cache_destroy(struct casbox_base_cache **cache);
/* A referenced entry of id (the most recently used now), or NULL. */
struct casbox_base_plain *
casbox_base_cache_lookup(struct casbox_base_cache *cache,
			 const struct cas_blob_id *id);
/* TRUE if id is cached (not counted as a use). */
bool casbox_base_cache_has(struct casbox_base_cache *cache,
			   const struct cas_blob_id *id);
/* Keep a sealed plain (the cache takes its own reference), evicting
   the least recently used entries over the bound. An entry larger than
   the bound is not kept. Adding an id already cached replaces it. */
void casbox_base_cache_add(struct casbox_base_cache *cache,
			   struct casbox_base_plain *plain);
/* Drop every entry (a base found damaged, tests). */
void casbox_base_cache_clear(struct casbox_base_cache *cache);
void casbox_base_cache_get_stats(struct casbox_base_cache *cache,
				 unsigned int *entries_r, size_t *bytes_r);

/* Tests: how many entry buffers were sodium_malloc()ed (not arena
   blocks, not reused from the process's few freed ones) so far. */
extern unsigned int casbox_base_sodium_allocs;
/* sodium_free() the pooled buffers of freed entries and the arena's
   unused slabs (plugin deinit). */
void casbox_base_pool_free(void);
/* Tests: called with the data just wiped, before it is freed. */
extern void (*casbox_base_plain_wipe_hook)(const unsigned char *data,
					   size_t size);

#endif
