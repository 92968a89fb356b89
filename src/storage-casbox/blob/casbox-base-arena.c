/* casbox: buddy blocks of locked slabs for base prefixes
   (casbox-base-arena.h). A slab is 2^order units of 4 KiB (at most
   CASBOX_BASE_ARENA_UNITS); free_order[u] is 1 + the order of the free
   block starting at unit u, 0 where none starts. A few hundred bytes to
   scan per allocation, against the system calls it saves. */

#include "lib.h"
#include "casbox-base-arena.h"

#include <sodium.h>

#define CASBOX_BASE_ARENA_UNITS \
	(CASBOX_BASE_ARENA_SLAB_SIZE / CASBOX_BASE_ARENA_BLOCK_MIN)
/* order of the largest slab: 2^8 units */
#define CASBOX_BASE_ARENA_MAX_ORDER 8
/* at most this many slabs (the smallest ones first) */
#define CASBOX_BASE_ARENA_MAX_SLABS 8

struct casbox_base_slab {
	unsigned char *data;
	/* the slab is 2^order units */
	unsigned int order;
	uint8_t free_order[CASBOX_BASE_ARENA_UNITS];
};

static struct casbox_base_slab
	casbox_base_slabs[CASBOX_BASE_ARENA_MAX_SLABS];
static unsigned int casbox_base_slab_count = 0;
static size_t casbox_base_arena_bytes = 0;

static size_t casbox_base_slab_size(unsigned int order)
{
	return (size_t)CASBOX_BASE_ARENA_BLOCK_MIN << order;
}

static unsigned int casbox_base_arena_order(size_t capacity)
{
	unsigned int order = 0;

	i_assert(capacity >= CASBOX_BASE_ARENA_BLOCK_MIN &&
		 capacity <= CASBOX_BASE_ARENA_SLAB_SIZE &&
		 (capacity & (capacity - 1)) == 0);
	while (casbox_base_slab_size(order) < capacity)
		order++;
	return order;
}

/* The unit of the smallest free block of at least order in slab, or
   -1. Such a block starts at a multiple of 2^order units. */
static int
casbox_base_slab_find(const struct casbox_base_slab *slab, unsigned int order,
		      unsigned int *found_order_r)
{
	unsigned int u, units = 1U << slab->order, best_order = UINT_MAX;
	int best = -1;

	if (order > slab->order)
		return -1;
	for (u = 0; u < units; u += 1U << order) {
		unsigned int v = slab->free_order[u];

		if (v > order && v - 1 < best_order) {
			best_order = v - 1;
			best = (int)u;
			if (best_order == order)
				break;
		}
	}
	*found_order_r = best_order;
	return best;
}

/* A new slab for a block of order: twice the size of the last one
   made (the first is CASBOX_BASE_ARENA_FIRST_SLAB), at least the
   block, at most a CASBOX_BASE_ARENA_SLAB_SIZE, while the slabs stay
   within CASBOX_BASE_ARENA_BYTES. sodium_malloc() writes every page of
   it: a process that keeps only a few bases pays for a small slab. */
static struct casbox_base_slab *casbox_base_slab_new(unsigned int order)
{
	struct casbox_base_slab *slab;
	unsigned int slab_order;

	slab_order = casbox_base_arena_order(CASBOX_BASE_ARENA_FIRST_SLAB);
	if (casbox_base_slab_count > 0) {
		slab_order = I_MIN(casbox_base_slabs[
			casbox_base_slab_count - 1].order + 1,
			CASBOX_BASE_ARENA_MAX_ORDER);
	}
	slab_order = I_MAX(slab_order, order);
	if (casbox_base_slab_count == CASBOX_BASE_ARENA_MAX_SLABS ||
	    casbox_base_arena_bytes + casbox_base_slab_size(slab_order) >
	    CASBOX_BASE_ARENA_BYTES)
		return NULL;
	slab = &casbox_base_slabs[casbox_base_slab_count];
	slab->data = sodium_malloc(casbox_base_slab_size(slab_order));
	if (slab->data == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "sodium_malloc() failed: %m");
	slab->order = slab_order;
	memset(slab->free_order, 0, sizeof(slab->free_order));
	slab->free_order[0] = slab_order + 1;
	casbox_base_slab_count++;
	casbox_base_arena_bytes += casbox_base_slab_size(slab_order);
	return slab;
}

unsigned char *casbox_base_arena_alloc(size_t capacity)
{
	struct casbox_base_slab *slab = NULL;
	unsigned int i, order, found_order, best_order = UINT_MAX;
	int unit = -1, u;

	order = casbox_base_arena_order(capacity);
	/* best fit over the slabs: large blocks stay whole for large
	   prefixes */
	for (i = 0; i < casbox_base_slab_count; i++) {
		u = casbox_base_slab_find(&casbox_base_slabs[i], order,
					  &found_order);
		if (u >= 0 && found_order < best_order) {
			slab = &casbox_base_slabs[i];
			unit = u;
			best_order = found_order;
		}
	}
	if (slab == NULL) {
		if ((slab = casbox_base_slab_new(order)) == NULL)
			return NULL;
		unit = 0;
		best_order = slab->order;
	}
	/* split: the upper halves stay free */
	while (best_order > order) {
		best_order--;
		slab->free_order[unit + (1 << best_order)] = best_order + 1;
	}
	slab->free_order[unit] = 0;
	return slab->data + (size_t)unit * CASBOX_BASE_ARENA_BLOCK_MIN;
}

static struct casbox_base_slab *casbox_base_slab_of(const unsigned char *data)
{
	uintptr_t p = (uintptr_t)data, start;
	unsigned int i;

	for (i = 0; i < casbox_base_slab_count; i++) {
		struct casbox_base_slab *slab = &casbox_base_slabs[i];

		start = (uintptr_t)slab->data;
		if (p >= start &&
		    p - start < casbox_base_slab_size(slab->order))
			return slab;
	}
	return NULL;
}

bool casbox_base_arena_release(unsigned char *data, size_t capacity)
{
	struct casbox_base_slab *slab = casbox_base_slab_of(data);
	unsigned int order, unit, buddy;
	size_t offset;

	if (slab == NULL)
		return FALSE;
	order = casbox_base_arena_order(capacity);
	offset = data - slab->data;
	i_assert(offset % capacity == 0);
	unit = offset / CASBOX_BASE_ARENA_BLOCK_MIN;
	i_assert(slab->free_order[unit] == 0);
	i_assert(order <= slab->order);
	/* merge with free buddies of the same order */
	while (order < slab->order) {
		buddy = unit ^ (1U << order);
		if (slab->free_order[buddy] != order + 1)
			break;
		slab->free_order[buddy] = 0;
		unit &= ~(1U << order);
		order++;
	}
	slab->free_order[unit] = order + 1;
	return TRUE;
}

void casbox_base_arena_free(void)
{
	unsigned int i = 0;

	while (i < casbox_base_slab_count) {
		struct casbox_base_slab *slab = &casbox_base_slabs[i];

		if (slab->free_order[0] != slab->order + 1) {
			/* a block is still in use */
			i++;
			continue;
		}
		sodium_free(slab->data);
		casbox_base_arena_bytes -= casbox_base_slab_size(slab->order);
		casbox_base_slab_count--;
		*slab = casbox_base_slabs[casbox_base_slab_count];
	}
}

unsigned int casbox_base_arena_get_slab_count(void)
{
	return casbox_base_slab_count;
}

size_t casbox_base_arena_get_bytes(void)
{
	return casbox_base_arena_bytes;
}
