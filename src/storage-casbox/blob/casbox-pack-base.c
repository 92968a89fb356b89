/* Bases of delta frames (frame version 3): their decoded prefixes,
   through the store's cache (casbox-base-cache.h), decoded on a miss
   through the caller's record lookup, the base's own base first. */

#include "lib.h"
#include "istream.h"
#include "casbox-pack-private.h"

struct casbox_base_cache *
casbox_pack_store_get_base_cache(struct casbox_pack_store *store)
{
	return store->base_cache;
}

/* Read the first plain->size bytes of the blob into plain->data. */
static int
casbox_pack_base_read(struct istream *input, struct casbox_base_plain *plain,
		      const char **error_r)
{
	const unsigned char *data;
	size_t size, filled = 0;
	int ret;

	while (filled < plain->size &&
	       (ret = i_stream_read_more(input, &data, &size)) > 0) {
		size = I_MIN(size, plain->size - filled);
		memcpy(plain->data + filled, data, size);
		i_stream_skip(input, size);
		filled += size;
	}
	if (input->stream_errno != 0) {
		*error_r = t_strdup(i_stream_get_error(input));
		return -1;
	}
	if (filled != plain->size) {
		*error_r = t_strdup_printf("ended after %zu of %zu bytes",
					   filled, plain->size);
		return -1;
	}
	return 0;
}

void (*casbox_pack_base_open_hook)(const struct cas_blob_id *base_id) = NULL;

/* The base blob of rec, its pack opened now (with its own base first):
   returns as casbox_pack_blob_open_pinned(). */
static int
casbox_pack_base_open(struct casbox_pack_store *store,
		      const struct cas_blob_id *base_id,
		      const struct casbox_blob_record *rec,
		      casbox_pack_base_lookup_func_t *lookup, void *context,
		      struct istream **input_r, const char **error_r)
{
	struct casbox_base_plain *bbase = NULL;
	int ret;

	if (rec->base_depth > 0) {
		ret = casbox_pack_base_get(store, &rec->base_id,
					   rec->base_depth - 1, lookup,
					   context, &bbase, error_r);
		if (ret <= 0)
			return ret;
	}
	if (casbox_pack_base_open_hook != NULL)
		casbox_pack_base_open_hook(base_id);
	ret = casbox_pack_blob_open_pinned_base(store, base_id, rec, bbase,
						input_r, error_r);
	if (bbase != NULL)
		casbox_base_plain_unref(&bbase);
	return ret;
}

static int
casbox_pack_base_decode(struct casbox_pack_store *store,
			const struct cas_blob_id *base_id, uint8_t depth,
			casbox_pack_base_lookup_func_t *lookup, void *context,
			struct casbox_base_plain **plain_r,
			const char **error_r)
{
	struct casbox_blob_record rec;
	struct casbox_base_plain *plain;
	struct istream *input;
	const char *error;
	int ret;

	ret = lookup(context, base_id, &rec, &error);
	if (ret == 0) {
		*error_r = t_strdup_printf("base %s is missing: %s",
					   cas_blob_id_to_hex(base_id), error);
		return -1;
	}
	if (ret < 0) {
		*error_r = t_strdup_printf("base %s: %s",
					   cas_blob_id_to_hex(base_id), error);
		return -1;
	}
	if (rec.base_depth != depth) {
		/* also what ends a (forged) cycle: depths only go down */
		*error_r = t_strdup_printf("base %s has chain depth %u, its "
			"dependent expects %u", cas_blob_id_to_hex(base_id),
			rec.base_depth, depth);
		return -1;
	}
	if (rec.plain_size == 0) {
		*error_r = t_strdup_printf("base %s is empty",
					   cas_blob_id_to_hex(base_id));
		return -1;
	}
	/* pinned: gc may move the base and unlink its pack after the
	   lookup; a pack missing here means the record was stale (0) */
	ret = casbox_pack_base_open(store, base_id, &rec, lookup, context,
				    &input, &error);
	if (ret <= 0) {
		*error_r = t_strdup_printf("base %s: %s",
					   cas_blob_id_to_hex(base_id), error);
		return ret;
	}
	plain = casbox_base_plain_new(base_id, rec.plain_size, depth);
	ret = casbox_pack_base_read(input, plain, &error);
	i_stream_unref(&input);
	if (ret < 0) {
		*error_r = t_strdup_printf("base %s is damaged: %s",
					   cas_blob_id_to_hex(base_id), error);
		casbox_base_plain_unref(&plain);
		return -1;
	}
	casbox_base_plain_seal(plain);
	casbox_base_cache_add(store->base_cache, plain);
	*plain_r = plain;
	return 1;
}

int casbox_pack_base_get(struct casbox_pack_store *store,
			 const struct cas_blob_id *base_id, uint8_t depth,
			 casbox_pack_base_lookup_func_t *lookup,
			 void *context, struct casbox_base_plain **plain_r,
			 const char **error_r)
{
	struct casbox_base_plain *plain;

	*plain_r = NULL;
	if (depth >= CASBOX_BASE_MAX_DEPTH) {
		*error_r = t_strdup_printf("base %s: chain depth %u is over "
			"the limit %u", cas_blob_id_to_hex(base_id), depth + 1,
			CASBOX_BASE_MAX_DEPTH);
		return -1;
	}
	plain = casbox_base_cache_lookup(store->base_cache, base_id);
	if (plain != NULL) {
		if (plain->depth == depth) {
			*plain_r = plain;
			return 1;
		}
		casbox_base_plain_unref(&plain);
	}
	return casbox_pack_base_decode(store, base_id, depth, lookup, context,
				       plain_r, error_r);
}

int casbox_pack_blob_open_chain(struct casbox_pack_store *store,
				const struct cas_blob_id *id,
				const struct casbox_blob_record *rec,
				casbox_pack_base_lookup_func_t *lookup,
				void *context, struct istream **input_r,
				const char **error_r)
{
	struct casbox_base_plain *base;
	const char *error;

	*input_r = NULL;
	if (rec->base_depth == 0) {
		*input_r = casbox_pack_blob_open(store, id, rec);
		return 1;
	}
	/* a base's pack gone at open (0) is an error here: the blob's
	   own pack is opened only at the first read, so these callers
	   (scrub and rebuild under the maintenance lock, which gc takes
	   too; dictionary training) have no fresher record to retry */
	if (casbox_pack_base_get(store, &rec->base_id, rec->base_depth - 1,
				 lookup, context, &base, &error) <= 0) {
		*error_r = t_strdup_printf("blob %s: %s",
					   cas_blob_id_to_hex(id), error);
		return -1;
	}
	*input_r = casbox_pack_blob_open_base(store, id, rec, base);
	casbox_base_plain_unref(&base);
	return 1;
}
