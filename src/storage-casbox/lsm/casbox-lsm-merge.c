/* Merge of sorted sources, newest first. The number of sources is
   small (memtable + a handful of tables), so a linear scan for the
   smallest key beats a heap. */

#include "lib.h"
#include "casbox-lsm-private.h"

struct merge_source {
	struct casbox_lsm_source src;
	struct casbox_lsm_source **children;
	unsigned int count;
	/* child that provides the current entry */
	unsigned int current;
};

static bool merge_check_error(struct merge_source *ms)
{
	unsigned int i;

	for (i = 0; i < ms->count; i++) {
		if (ms->children[i]->error != NULL) {
			if (ms->src.error == NULL) {
				ms->src.error =
					i_strdup(ms->children[i]->error);
			}
			ms->src.valid = FALSE;
			return TRUE;
		}
	}
	return FALSE;
}

static void merge_pick(struct merge_source *ms)
{
	struct casbox_lsm_source *child, *best = NULL;
	unsigned int i;

	ms->src.valid = FALSE;
	if (merge_check_error(ms))
		return;
	for (i = 0; i < ms->count; i++) {
		child = ms->children[i];
		/* strictly smaller: on a tie the newer (lower i) wins */
		if (child->valid &&
		    (best == NULL ||
		     casbox_lsm_key_cmp(child->key, child->key_size,
					best->key, best->key_size) < 0)) {
			best = child;
			ms->current = i;
		}
	}
	if (best == NULL)
		return;
	ms->src.valid = TRUE;
	ms->src.type = best->type;
	ms->src.key = best->key;
	ms->src.key_size = best->key_size;
	ms->src.value = best->value;
	ms->src.value_size = best->value_size;
}

static void merge_seek(struct casbox_lsm_source *src,
		       const unsigned char *key, size_t key_size)
{
	struct merge_source *ms = (struct merge_source *)src;
	unsigned int i;

	for (i = 0; i < ms->count; i++)
		ms->children[i]->seek(ms->children[i], key, key_size);
	merge_pick(ms);
}

static void merge_next(struct casbox_lsm_source *src)
{
	struct merge_source *ms = (struct merge_source *)src;
	struct casbox_lsm_source *cur = ms->children[ms->current], *child;
	unsigned int i;

	i_assert(src->valid);
	/* advance every child positioned at the current key; the current
	   child last, since the key pointer belongs to it */
	for (i = 0; i < ms->count; i++) {
		child = ms->children[i];
		if (child != cur && child->valid &&
		    casbox_lsm_key_cmp(child->key, child->key_size,
				       cur->key, cur->key_size) == 0)
			child->next(child);
	}
	cur->next(cur);
	merge_pick(ms);
}

static void merge_free(struct casbox_lsm_source *src)
{
	struct merge_source *ms = (struct merge_source *)src;
	unsigned int i;

	for (i = 0; i < ms->count; i++)
		casbox_lsm_source_free(&ms->children[i]);
	i_free(ms->children);
	i_free(ms->src.error);
	i_free(ms);
}

struct casbox_lsm_source *
casbox_lsm_merge_source(struct casbox_lsm_source *const *sources,
			unsigned int count)
{
	struct merge_source *ms;

	ms = i_new(struct merge_source, 1);
	ms->src.seek = merge_seek;
	ms->src.next = merge_next;
	ms->src.free = merge_free;
	ms->children = i_new(struct casbox_lsm_source *, count);
	memcpy(ms->children, sources, sizeof(*sources) * count);
	ms->count = count;
	return &ms->src;
}
