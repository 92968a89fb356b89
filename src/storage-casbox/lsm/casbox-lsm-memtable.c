/* Memtable: a skiplist of (key, seq) versions, newest version of a key
   first, in one alloconly pool. Versions are kept (not overwritten) so
   an iterator over a snapshot seq stays consistent while the owning
   process commits more batches. The whole table is dropped at flush. */

#include "lib.h"
#include "casbox-lsm-private.h"

#define MT_MAX_HEIGHT 12

struct mt_node {
	const unsigned char *key, *value;
	size_t key_size, value_size;
	uint64_t seq;
	enum casbox_lsm_type type;
	unsigned int height;
	struct mt_node *next[];
};

struct casbox_lsm_memtable {
	int refcount;
	pool_t pool;
	struct mt_node *head;
	unsigned int height, count;
	uint32_t rand_state;
};

struct mt_source {
	struct casbox_lsm_source src;
	struct casbox_lsm_memtable *mt;
	struct mt_node *node;
	uint64_t max_seq;
};

/* key ascending, then seq descending */
static int mt_node_cmp(const struct mt_node *node, const unsigned char *key,
		       size_t key_size, uint64_t seq)
{
	int ret = casbox_lsm_key_cmp(node->key, node->key_size, key, key_size);

	if (ret != 0)
		return ret;
	return node->seq > seq ? -1 : (node->seq < seq ? 1 : 0);
}

struct casbox_lsm_memtable *casbox_lsm_memtable_create(void)
{
	struct casbox_lsm_memtable *mt;

	mt = i_new(struct casbox_lsm_memtable, 1);
	mt->refcount = 1;
	mt->pool = pool_alloconly_create("casbox lsm memtable", 64 * 1024);
	mt->head = p_malloc(mt->pool, sizeof(*mt->head) +
			    MT_MAX_HEIGHT * sizeof(mt->head->next[0]));
	mt->head->height = MT_MAX_HEIGHT;
	mt->height = 1;
	mt->rand_state = 0x9e3779b9U;
	return mt;
}

void casbox_lsm_memtable_ref(struct casbox_lsm_memtable *mt)
{
	i_assert(mt->refcount > 0);
	mt->refcount++;
}

void casbox_lsm_memtable_unref(struct casbox_lsm_memtable **_mt)
{
	struct casbox_lsm_memtable *mt = *_mt;

	*_mt = NULL;
	i_assert(mt->refcount > 0);
	if (--mt->refcount > 0)
		return;
	pool_unref(&mt->pool);
	i_free(mt);
}

static unsigned int mt_random_height(struct casbox_lsm_memtable *mt)
{
	unsigned int height = 1;

	/* xorshift: deterministic, no global RNG state touched */
	while (height < MT_MAX_HEIGHT) {
		mt->rand_state ^= mt->rand_state << 13;
		mt->rand_state ^= mt->rand_state >> 17;
		mt->rand_state ^= mt->rand_state << 5;
		if ((mt->rand_state & 3) != 0)
			break;
		height++;
	}
	return height;
}

/* Fill prev[] with the last node < (key, seq) on each level; return the
   first node >= (key, seq). */
static struct mt_node *
mt_find_ge(struct casbox_lsm_memtable *mt, const unsigned char *key,
	   size_t key_size, uint64_t seq, struct mt_node **prev)
{
	struct mt_node *node = mt->head, *next = NULL, *bigger = NULL;
	unsigned int level = mt->height;

	while (level-- > 0) {
		next = node->next[level];
		/* a node already found >= key on the level above needs no
		   second comparison */
		while (next != NULL && next != bigger &&
		       mt_node_cmp(next, key, key_size, seq) < 0) {
			node = next;
			next = node->next[level];
		}
		bigger = next;
		if (prev != NULL)
			prev[level] = node;
	}
	return next;
}

void casbox_lsm_memtable_add(struct casbox_lsm_memtable *mt, uint64_t seq,
			     enum casbox_lsm_type type,
			     const void *key, size_t key_size,
			     const void *value, size_t value_size)
{
	struct mt_node *prev[MT_MAX_HEIGHT], *node;
	unsigned int i, height = mt_random_height(mt);
	unsigned char *data;

	(void)mt_find_ge(mt, key, key_size, seq, prev);
	for (i = mt->height; i < height; i++)
		prev[i] = mt->head;
	if (height > mt->height)
		mt->height = height;

	/* key and value right after the node: a search touches one cache
	   line per node instead of two */
	node = p_malloc(mt->pool, sizeof(*node) +
			height * sizeof(node->next[0]) +
			key_size + value_size + 1);
	data = (unsigned char *)&node->next[height];
	memcpy(data, key, key_size);
	if (value_size > 0)
		memcpy(data + key_size, value, value_size);
	node->key = data;
	node->key_size = key_size;
	node->value = data + key_size;
	node->value_size = type == CASBOX_LSM_TYPE_PUT ? value_size : 0;
	node->seq = seq;
	node->type = type;
	node->height = height;
	for (i = 0; i < height; i++) {
		node->next[i] = prev[i]->next[i];
		prev[i]->next[i] = node;
	}
	mt->count++;
}

bool casbox_lsm_memtable_lookup(struct casbox_lsm_memtable *mt,
				const void *key, size_t key_size,
				uint64_t max_seq, enum casbox_lsm_type *type_r,
				const unsigned char **value_r,
				size_t *value_size_r)
{
	struct mt_node *node;

	node = mt_find_ge(mt, key, key_size, max_seq, NULL);
	if (node == NULL ||
	    casbox_lsm_key_cmp(node->key, node->key_size, key, key_size) != 0)
		return FALSE;
	*type_r = node->type;
	*value_r = node->value;
	*value_size_r = node->value_size;
	return TRUE;
}

unsigned int casbox_lsm_memtable_count(struct casbox_lsm_memtable *mt)
{
	return mt->count;
}

/* Move to the first visible version at or after node. */
static void mt_source_settle(struct mt_source *ms, struct mt_node *node)
{
	while (node != NULL && node->seq > ms->max_seq)
		node = node->next[0];
	ms->node = node;
	ms->src.valid = node != NULL;
	if (node == NULL)
		return;
	ms->src.type = node->type;
	ms->src.key = node->key;
	ms->src.key_size = node->key_size;
	ms->src.value = node->value;
	ms->src.value_size = node->value_size;
}

static void mt_source_seek(struct casbox_lsm_source *src,
			   const unsigned char *key, size_t key_size)
{
	struct mt_source *ms = (struct mt_source *)src;

	mt_source_settle(ms, mt_find_ge(ms->mt, key, key_size, ms->max_seq,
					NULL));
}

static void mt_source_next(struct casbox_lsm_source *src)
{
	struct mt_source *ms = (struct mt_source *)src;
	struct mt_node *node = ms->node;

	i_assert(node != NULL);
	/* skip the older versions of this key */
	node = node->next[0];
	while (node != NULL &&
	       casbox_lsm_key_cmp(node->key, node->key_size,
				  ms->node->key, ms->node->key_size) == 0)
		node = node->next[0];
	mt_source_settle(ms, node);
}

static void mt_source_free(struct casbox_lsm_source *src)
{
	struct mt_source *ms = (struct mt_source *)src;

	casbox_lsm_memtable_unref(&ms->mt);
	i_free(ms->src.error);
	i_free(ms);
}

struct casbox_lsm_source *
casbox_lsm_memtable_source(struct casbox_lsm_memtable *mt, uint64_t max_seq)
{
	struct mt_source *ms;

	ms = i_new(struct mt_source, 1);
	ms->src.seek = mt_source_seek;
	ms->src.next = mt_source_next;
	ms->src.free = mt_source_free;
	ms->mt = mt;
	ms->max_seq = max_seq;
	casbox_lsm_memtable_ref(mt);
	return &ms->src;
}
