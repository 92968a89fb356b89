#ifndef CAS_SECMEM_H
#define CAS_SECMEM_H

/* Locked memory for secrets: sodium_malloc() buffers (guard pages,
   mlock, canary) with a small per-process pool of freed ones.

   sodium_malloc() is an mmap, three mprotects and an mlock, and
   sodium_free() an mprotect and a munmap, whose TLB shootdown reaches
   every core the process ran on. A store opened per LMTP delivery made
   about 7 of each (key file buffer and key ring secrets twice, the LSM
   key, blob scratch keys): a quarter of the lmtp process's CPU samples
   were TLB flushes (doc/benchmarks.md, "LMTP CPU: locked memory").

   A freed buffer is wiped (cas_secmem_free_protected() makes a
   read-only one writable first) and kept for the next allocation of
   exactly its size; it stays locked and between its guard pages. The pool is bounded
   (CAS_SECMEM_POOL_MAX buffers of at most CAS_SECMEM_POOL_MAX_SIZE
   bytes each); anything else is sodium_free()d as before. */

#include <stddef.h>

#define CAS_SECMEM_POOL_MAX 16
#define CAS_SECMEM_POOL_MAX_SIZE (16 * 1024)

/* size bytes of locked, writable memory (contents unspecified). Aborts
   when out of memory, as sodium_malloc() callers here always did. */
void *cas_secmem_alloc(size_t size);
/* Wipe and release ptr (NULL is ignored), which cas_secmem_alloc(size)
   returned and which is writable. */
void cas_secmem_free(void *ptr, size_t size);
/* The same for a buffer that may have been made read-only
   (sodium_mprotect_readonly()): one mprotect() more. */
void cas_secmem_free_protected(void *ptr, size_t size);
/* sodium_free() every pooled buffer (plugin deinit, tests). */
void cas_secmem_pool_deinit(void);

/* sodium_malloc() calls made by cas_secmem_alloc() so far (tests). */
extern unsigned int cas_secmem_sodium_allocs;

#endif
