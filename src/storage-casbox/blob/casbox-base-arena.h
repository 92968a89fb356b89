#ifndef CASBOX_BASE_ARENA_H
#define CASBOX_BASE_ARENA_H

/* Locked memory for base prefixes (casbox-base-cache.h) without a
   system call per entry: blocks of 4 KiB to 1 MiB (powers of two, a
   buddy allocator) carved from slabs, each one sodium_malloc() (locked,
   never swapped or dumped) made when the slabs made so far have no
   free block for a request: 128 KiB first, then twice the last one up
   to 1 MiB, together at most CASBOX_BASE_ARENA_BYTES. A process keeps
   its slabs until casbox_base_arena_free(): filling an empty base
   cache (a process's first FETCH) was a sodium_malloc() per entry, i.e.
   an mmap, three mprotects, an mlock and every page written, and an
   evicted entry's sodium_free() a munmap. sodium_malloc() writes every
   page of a slab, hence the small first ones: a session that keeps a
   few bases pays for 128 KiB, not for the whole arena.

   Unlike a sodium_malloc() of its own, a block has no guard page: the
   prefixes are filled by the blob layer only, each within its size
   (the decoded chunks they come from are in ordinary heap anyway).
   The caller wipes what it wrote before it releases a block, so all
   free arena memory is wiped or was never written. */

#define CASBOX_BASE_ARENA_BLOCK_MIN 4096
#define CASBOX_BASE_ARENA_FIRST_SLAB (128 * 1024)
#define CASBOX_BASE_ARENA_SLAB_SIZE (1024 * 1024)
/* as much as the default base cache holds */
#define CASBOX_BASE_ARENA_BYTES (4 * 1024 * 1024)

/* A block of capacity bytes (a power of two from
   CASBOX_BASE_ARENA_BLOCK_MIN to CASBOX_BASE_ARENA_SLAB_SIZE), or NULL
   if no slab has one free and no more slabs may be made. */
unsigned char *casbox_base_arena_alloc(size_t capacity);
/* Give back a block of casbox_base_arena_alloc(capacity) (wiped by the
   caller) and return TRUE; FALSE if data is not in the arena. */
bool casbox_base_arena_release(unsigned char *data, size_t capacity);
/* sodium_free() the slabs with no block in use (plugin deinit). */
void casbox_base_arena_free(void);
/* Tests: slabs made and not freed, and their bytes. */
unsigned int casbox_base_arena_get_slab_count(void);
size_t casbox_base_arena_get_bytes(void);

#endif
