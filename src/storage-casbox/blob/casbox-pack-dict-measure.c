/* casbox-pack: what a dictionary saves on given samples (doveadm casbox
   dict train), with the pack store's own compression level. */

#include "lib.h"
#include "buffer.h"
#include "casbox-pack-private.h"

#include <sodium.h>
#include <zstd.h>

size_t casbox_pack_dict_max_blob_size(struct casbox_pack_store *store)
{
	return store->set.dict_max_blob_size;
}

int casbox_pack_dict_measure(struct casbox_pack_store *store,
			     uint32_t dict_id,
			     const buffer_t *const *samples,
			     unsigned int count,
			     struct casbox_pack_dict_measure *measure_r,
			     const char **error_r)
{
	const struct casbox_pack_dict *dict;
	ZSTD_CDict *cdict;
	ZSTD_CCtx *cctx;
	buffer_t *dest;
	unsigned int i;
	size_t n;
	int ret = 0;

	i_zero(measure_r);
	dict = casbox_pack_dict_lookup(store, dict_id);
	if (dict == NULL || dict->error != NULL) {
		*error_r = dict == NULL ? "trained dictionary not loaded" :
			dict->error;
		return -1;
	}
	if ((cdict = casbox_pack_dict_get_cdict(store, dict_id)) == NULL) {
		*error_r = "zstd refused the dictionary for compression";
		return -1;
	}
	cctx = ZSTD_createCCtx();
	if (cctx == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "ZSTD_createCCtx() failed");
	dest = buffer_create_dynamic(default_pool, 64 * 1024);
	for (i = 0; i < count && ret == 0; i++) {
		const buffer_t *src = samples[i];
		size_t bound = ZSTD_compressBound(src->used);
		void *out = buffer_get_space_unsafe(dest, 0, bound);

		n = ZSTD_compressCCtx(cctx, out, bound, src->data, src->used,
				      store->set.zstd_level);
		if (ZSTD_isError(n)) {
			*error_r = ZSTD_getErrorName(n);
			ret = -1;
			break;
		}
		measure_r->without_bytes += n;
		n = ZSTD_compress_usingCDict(cctx, out, bound, src->data,
					     src->used, cdict);
		if (ZSTD_isError(n)) {
			*error_r = ZSTD_getErrorName(n);
			ret = -1;
			break;
		}
		measure_r->with_bytes += n;
		measure_r->plain_bytes += src->used;
	}
	/* the output is compressed plaintext */
	sodium_memzero(buffer_get_modifiable_data(dest, NULL),
		       buffer_get_size(dest));
	buffer_free(&dest);
	ZSTD_freeCCtx(cctx);
	return ret;
}
