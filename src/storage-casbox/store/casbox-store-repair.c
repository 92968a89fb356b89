/* casbox-store-repair: scrub --repair's record fixes (see
   casbox-store-repair.h). */

#include "lib.h"
#include "buffer.h"
#include "casbox-lsm.h"
#include "casbox-store.h"
#include "casbox-store-repair.h"

struct casbox_store_repair {
	struct casbox_lsm_batch *batch;
};

int casbox_store_repair_begin(struct casbox_store *store,
			      struct casbox_store_repair **repair_r,
			      const char **error_r)
{
	struct casbox_lsm_batch *batch;

	*repair_r = NULL;
	if (casbox_lsm_batch_begin(casbox_store_get_lsm(store), &batch,
				   error_r) < 0)
		return -1;
	*repair_r = i_new(struct casbox_store_repair, 1);
	(*repair_r)->batch = batch;
	return 0;
}

void casbox_store_repair_refcount(struct casbox_store_repair *repair,
				  const struct casbox_census_blob *blob)
{
	struct casbox_blob_value bval;
	buffer_t *key, *value, *rec;

	key = t_buffer_create(40);
	casbox_key_blob(key, &blob->id);
	rec = t_buffer_create(CASBOX_BLOB_RECORD_EXPORT_SIZE);
	casbox_blob_record_export(&blob->rec, rec);
	i_zero(&bval);
	bval.refcount = blob->counted;
	bval.pack_record = rec->data;
	bval.pack_record_size = rec->used;
	value = t_buffer_create(128);
	casbox_blob_value_export(&bval, value);
	casbox_lsm_batch_put(repair->batch, key->data, key->used,
			     value->data, value->used);
}

void casbox_store_repair_quarantine(struct casbox_store_repair *repair,
				    const struct cas_blob_id *id,
				    const struct casbox_quarantine_record *qrec)
{
	buffer_t *key, *value;

	key = t_buffer_create(40);
	casbox_quarantine_key(key, id);
	value = t_buffer_create(128);
	casbox_quarantine_record_export(qrec, value);
	casbox_lsm_batch_put(repair->batch, key->data, key->used,
			     value->data, value->used);
}

void casbox_store_repair_release(struct casbox_store_repair *repair,
				 const struct cas_blob_id *id)
{
	buffer_t *key;

	key = t_buffer_create(40);
	casbox_quarantine_key(key, id);
	casbox_lsm_batch_delete(repair->batch, key->data, key->used);
}

int casbox_store_repair_commit(struct casbox_store_repair **_repair,
			       const char **error_r)
{
	struct casbox_store_repair *repair = *_repair;
	int ret;

	*_repair = NULL;
	ret = casbox_lsm_batch_commit(&repair->batch, error_r);
	i_free(repair);
	return ret < 0 ? -1 : 0;
}

void casbox_store_repair_rollback(struct casbox_store_repair **_repair)
{
	struct casbox_store_repair *repair = *_repair;

	*_repair = NULL;
	casbox_lsm_batch_rollback(&repair->batch);
	i_free(repair);
}
