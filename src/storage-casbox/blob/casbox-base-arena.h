#ifndef CASBOX_BASE_ARENA_H
#define CASBOX_BASE_ARENA_H

/* Locked memory for base prefixes (casbox-base-cache.h) without a
   system call per entry: blocks of 4 KiB to 1 MiB (powers of two, a
   buddy allocator) carved from at most CASBOX_BASE_ARENA_SLABS slabs
   of 1 MiB, each one sodium_malloc() (locked, never swapped or dumped)
   made when the slabs made so far have no free block for a request.
   A process keeps its slabs until casbox_base_arena_free(): filling an
   empty base cache (a process's first FETCH) was a sodium_malloc()
   per entry, i.e. an mmap, three mprotects, an mlock and the pages
   touched once more, and an evicted entry's sodium_free() a munmap.

   Unlike a sodium_malloc() of its own, a block has no guard page: the
   prefixes are filled by the blob layer only, each within its size
   (the decoded chunks they come from are in ordinary heap anyway).
   The caller wipes what it wrote before it releases a block, so all
   free arena memory is wiped or was never written. */

#define CASBOX_BASE_ARENA_BLOCK_MIN 4096
#define CASBOX_BASE_ARENA_SLAB_SIZE (1024 * 1024)
/* as much as the default base cache holds */
#define CASBOX_BASE_ARENA_SLABS 4

/* A block of capacity bytes (a power of two from
   CASBOX_BASE_ARENA_BLOCK_MIN to CASBOX_BASE_ARENA_SLAB_SIZE), or NULL
   if no slab has one free and no more slabs may be made. */
unsigned char *casbox_base_arena_alloc(size_t capacity);
/* Give back a block of casbox_base_arena_alloc(capacity) (wiped by the
   caller) and return TRUE; FALSE if data is not in the arena. */
bool casbox_base_arena_release(unsigned char *data, size_t capacity);
/* sodium_free() the slabs with no block in use (plugin deinit). */
void casbox_base_arena_free(void);
/* Tests: slabs made and not freed. */
unsigned int casbox_base_arena_get_slab_count(void);

#endif
