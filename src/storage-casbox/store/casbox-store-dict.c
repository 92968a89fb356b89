/* casbox-store-dict: train a zstd dictionary from the header blocks of
   the store's small blobs and measure it on header blocks held out of
   the training (see casbox_store_dict_train() in casbox-store.h). Only
   header blocks: a dictionary trained on bodies would carry the user's
   body text into the compression of every later small blob, including
   mail an attacker sends (doc/threat-model.md). */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "cas-key.h"
#include "casbox-lsm.h"
#include "casbox-pack.h"
#include "casbox-records.h"
#include "casbox-store.h"

#include <sodium.h>

struct dict_blob {
	struct cas_blob_id id;
	struct casbox_blob_record rec;
};
ARRAY_DEFINE_TYPE(dict_blob, struct dict_blob);
ARRAY_DEFINE_TYPE(dict_buffer, buffer_t *);

/* Blob records of blobs small enough for a dictionary: up to
   max_count of them among the first max_scan blob records. */
static int
dict_collect_blobs(struct casbox_store *store, size_t max_size,
		   unsigned int max_count, unsigned int max_scan,
		   ARRAY_TYPE(dict_blob) *blobs, const char **error_r)
{
	const unsigned char prefix = CASBOX_KEY_BLOB;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	struct casbox_blob_value bvalue;
	struct dict_blob *blob;
	struct casbox_blob_record rec;
	const char *error;

	struct casbox_lsm *lsm = casbox_store_get_lsm(store);

	if (casbox_lsm_refresh(lsm, error_r) < 0)
		return -1;
	iter = casbox_lsm_iter_init(lsm, &prefix, 1);
	while (array_count(blobs) < max_count && max_scan-- > 0 &&
	       casbox_lsm_iter_next(iter, &key, &key_size,
				    &value, &value_size)) {
		if (key_size != 1 + CAS_BLOB_ID_SIZE ||
		    casbox_blob_value_import(value, value_size, &bvalue,
					     &error) < 0 ||
		    casbox_blob_record_import(bvalue.pack_record,
					      bvalue.pack_record_size, &rec,
					      &error) < 0)
			continue; /* scrub reports these */
		if (rec.plain_size == 0 || rec.plain_size > max_size)
			continue;
		blob = array_append_space(blobs);
		memcpy(blob->id.id, key + 1, CAS_BLOB_ID_SIZE);
		blob->rec = rec;
	}
	return casbox_lsm_iter_deinit(&iter, error_r) < 0 ? -1 : 0;
}

/* Samples shorter than this (a blob that starts with a blank line, e.g.
   the tail of a multipart after a large leaf) are not used */
#define DICT_MIN_HEADER_SIZE 32

/* Cut buf to its header block: up to and including the first empty
   line (CRLF or LF). A blob without one is all header (at most
   dict_max_blob_size). */
static void dict_cut_to_header(buffer_t *buf)
{
	const unsigned char *p = buf->data;
	size_t i;

	for (i = 0; i + 1 < buf->used; i++) {
		if (p[i] != '\n')
			continue;
		if (p[i + 1] == '\n') {
			buffer_set_used_size(buf, i + 2);
			return;
		}
		if (i + 2 < buf->used && p[i + 1] == '\r' &&
		    p[i + 2] == '\n') {
			buffer_set_used_size(buf, i + 3);
			return;
		}
	}
}

static int
dict_read_blob(struct casbox_store *store, const struct dict_blob *blob,
	       buffer_t *dest, const char **error_r)
{
	struct istream *input;
	const unsigned char *data;
	size_t size;
	int ret = 0;

	/* a delta blob (a lead part: its header) with its base */
	if (casbox_store_blob_open_record(store, &blob->id, &blob->rec,
					  &input, error_r) < 0)
		return -1;
	while (i_stream_read_more(input, &data, &size) > 0) {
		buffer_append(dest, data, size);
		i_stream_skip(input, size);
	}
	if (input->stream_errno != 0) {
		*error_r = t_strdup_printf("blob %s: %s",
					   cas_blob_id_to_hex(&blob->id),
					   i_stream_get_error(input));
		ret = -1;
	}
	i_stream_unref(&input);
	return ret;
}

/* Compressed sizes of the held-out blobs without and with dictionary
   dict_id, at the pack store's level. */
static int
dict_measure(struct casbox_pack_store *packs, uint32_t dict_id,
	     const ARRAY_TYPE(dict_buffer) *heldout,
	     struct casbox_store_dict_train_result *res, const char **error_r)
{
	struct casbox_pack_dict_measure measure;
	buffer_t *const *bufs;
	unsigned int count;

	bufs = array_get(heldout, &count);
	if (casbox_pack_dict_measure(packs, dict_id,
				     (const buffer_t *const *)bufs, count,
				     &measure, error_r) < 0)
		return -1;
	res->plain_bytes += measure.plain_bytes;
	res->without_bytes += measure.without_bytes;
	res->with_bytes += measure.with_bytes;
	return 0;
}

int casbox_store_dict_train(struct casbox_store *store,
			    unsigned int max_samples,
			    unsigned int holdout_every,
			    unsigned int max_heldout,
			    struct casbox_store_dict_train_result *res,
			    const char **error_r)
{
	struct casbox_pack_store *packs = casbox_store_get_packs(store);
	ARRAY_TYPE(dict_blob) blobs;
	ARRAY_TYPE(dict_buffer) train, heldout;
	ARRAY(const void *) samples;
	ARRAY(size_t) sizes;
	const struct dict_blob *blob;
	buffer_t *buf, **bufp;
	unsigned int i = 0;
	bool too_few = FALSE;
	int ret = 0;

	t_array_init(&blobs, 256);
	t_array_init(&train, 256);
	t_array_init(&heldout, 64);
	t_array_init(&samples, 256);
	t_array_init(&sizes, 256);
	i_zero(res);
	i_assert(packs != NULL);
	/* the loop below takes at most max_samples + max_heldout of them,
	   from the front (twice that: short header blocks are skipped) */
	if (dict_collect_blobs(store, casbox_pack_dict_max_blob_size(packs),
			       2 * (max_samples + max_heldout), UINT_MAX,
			       &blobs, error_r) < 0)
		return -1;
	array_foreach(&blobs, blob) {
		bool hold = ++i % holdout_every == 0;

		if (hold ? array_count(&heldout) >= max_heldout :
		    array_count(&train) >= max_samples)
			continue;
		buf = buffer_create_dynamic(default_pool,
					    blob->rec.plain_size);
		if (dict_read_blob(store, blob, buf, error_r) < 0) {
			sodium_memzero(buffer_get_modifiable_data(buf, NULL),
				       buffer_get_size(buf));
			buffer_free(&buf);
			ret = -1;
			break;
		}
		/* wiped: the cut-off body bytes stay in the buffer */
		dict_cut_to_header(buf);
		if (buf->used < DICT_MIN_HEADER_SIZE) {
			sodium_memzero(buffer_get_modifiable_data(buf, NULL),
				       buffer_get_size(buf));
			buffer_free(&buf);
			continue;
		}
		array_push_back(hold ? &heldout : &train, &buf);
	}
	res->samples = array_count(&train);
	res->heldout = array_count(&heldout);
	if (ret == 0 && (res->samples < 10 || res->heldout == 0)) {
		*error_r = t_strdup_printf("too few small blobs to train on "
					   "(%u, need at least 13)",
					   array_count(&blobs));
		too_few = TRUE;
		ret = -1;
	}
	if (ret == 0) {
		array_foreach_modifiable(&train, bufp) {
			const void *data = (*bufp)->data;

			array_push_back(&samples, &data);
			array_push_back(&sizes, &(*bufp)->used);
		}
		if (casbox_pack_dict_train(packs,
					   array_front(&samples),
					   array_front(&sizes),
					   array_count(&samples),
					   &res->dict_id, error_r) < 0)
			ret = -1;
	}
	if (ret == 0)
		ret = dict_measure(packs, res->dict_id, &heldout, res,
				   error_r);
	/* the samples are mail */
	array_append_array(&train, &heldout);
	array_foreach_modifiable(&train, bufp) {
		sodium_memzero(buffer_get_modifiable_data(*bufp, NULL),
			       buffer_get_size(*bufp));
		buffer_free(bufp);
	}
	return too_few ? 0 : (ret < 0 ? -1 : 1);
}

/* what casbox_dict_autotrain trains on: fewer samples than doveadm's
   dict train (it runs inside a delivery) */
#define DICT_AUTO_MAX_SAMPLES 500
#define DICT_AUTO_HOLDOUT_EVERY 5
#define DICT_AUTO_MAX_HELDOUT 100
/* a check reads at most this many blob records per small one needed */
#define DICT_AUTO_SCAN_FACTOR 16

int casbox_store_dict_autotrain(struct casbox_store *store,
				unsigned int min_blobs,
				struct casbox_store_dict_train_result *res_r,
				const char **error_r)
{
	struct casbox_pack_store *packs = casbox_store_get_packs(store);
	struct cas_keyring *keyring = casbox_store_get_keyring(store);
	ARRAY_TYPE(dict_blob) blobs;
	unsigned int max_scan;

	i_zero(res_r);
	if (min_blobs == 0 || packs == NULL || keyring == NULL ||
	    !cas_keyring_can_decrypt(keyring))
		return 0;
	/* another process may have trained one since we opened */
	if (casbox_pack_dict_current(packs) == 0 &&
	    casbox_pack_dicts_load(packs, error_r) < 0)
		return -1;
	if (casbox_pack_dict_current(packs) != 0)
		return 0;
	max_scan = min_blobs > UINT_MAX / DICT_AUTO_SCAN_FACTOR ? UINT_MAX :
		min_blobs * DICT_AUTO_SCAN_FACTOR;
	t_array_init(&blobs, I_MIN(min_blobs, 1024));
	if (dict_collect_blobs(store, casbox_pack_dict_max_blob_size(packs),
			       min_blobs, max_scan, &blobs, error_r) < 0)
		return -1;
	if (array_count(&blobs) < min_blobs)
		return 0;
	/* too few header blocks (0) is no error: maybe next time */
	return casbox_store_dict_train(store, DICT_AUTO_MAX_SAMPLES,
				       DICT_AUTO_HOLDOUT_EVERY,
				       DICT_AUTO_MAX_HELDOUT, res_r, error_r);
}
