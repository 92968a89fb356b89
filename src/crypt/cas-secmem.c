/* Pooled locked memory for secrets (cas-secmem.h). */
#include "lib.h"
#include "cas-secmem.h"

#include <sodium.h>

static struct {
	void *ptr;
	size_t size;
} cas_secmem_pool[CAS_SECMEM_POOL_MAX];
static unsigned int cas_secmem_pool_count;
unsigned int cas_secmem_sodium_allocs = 0;

void *cas_secmem_alloc(size_t size)
{
	void *ptr;
	unsigned int i;

	/* newest first: the sizes a store opens with come back in turn */
	for (i = cas_secmem_pool_count; i > 0; i--) {
		if (cas_secmem_pool[i - 1].size != size)
			continue;
		ptr = cas_secmem_pool[i - 1].ptr;
		cas_secmem_pool_count--;
		memmove(cas_secmem_pool + i - 1, cas_secmem_pool + i,
			(cas_secmem_pool_count - (i - 1)) *
			sizeof(cas_secmem_pool[0]));
		return ptr;
	}
	/* sodium_malloc() needs sodium_init() (page size, canary) */
	if (sodium_init() < 0)
		i_fatal("casbox: sodium_init() failed");
	cas_secmem_sodium_allocs++;
	ptr = sodium_malloc(size);
	if (ptr == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "sodium_malloc() failed: %m");
	return ptr;
}

static void cas_secmem_release(void *ptr, size_t size, bool protected)
{
	if (ptr == NULL)
		return;
	if (size > CAS_SECMEM_POOL_MAX_SIZE) {
		/* sodium_free() makes it writable and wipes it */
		sodium_free(ptr);
		return;
	}
	/* read-only secrets become writable for the wipe */
	if (protected && sodium_mprotect_readwrite(ptr) < 0)
		i_fatal("casbox: sodium_mprotect_readwrite() failed: %m");
	sodium_memzero(ptr, size);
	if (cas_secmem_pool_count == CAS_SECMEM_POOL_MAX) {
		/* the oldest goes */
		sodium_free(cas_secmem_pool[0].ptr);
		cas_secmem_pool_count--;
		memmove(cas_secmem_pool, cas_secmem_pool + 1,
			cas_secmem_pool_count * sizeof(cas_secmem_pool[0]));
	}
	cas_secmem_pool[cas_secmem_pool_count].ptr = ptr;
	cas_secmem_pool[cas_secmem_pool_count].size = size;
	cas_secmem_pool_count++;
}

void cas_secmem_free(void *ptr, size_t size)
{
	cas_secmem_release(ptr, size, FALSE);
}

void cas_secmem_free_protected(void *ptr, size_t size)
{
	cas_secmem_release(ptr, size, TRUE);
}

void cas_secmem_pool_deinit(void)
{
	while (cas_secmem_pool_count > 0) {
		cas_secmem_pool_count--;
		sodium_free(cas_secmem_pool[cas_secmem_pool_count].ptr);
	}
}
