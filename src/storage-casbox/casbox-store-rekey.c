/* casbox-store-rekey: rewrap blob records' DEKs under the current key
   slot, in LSM batches under the write lock. */

#include "lib.h"
#include "buffer.h"
#include "casbox-lsm.h"
#include "casbox-pack.h"
#include "casbox-records.h"
#include "casbox-store-rekey.h"

/* A step looks at no more than this many records per record it may
   rewrite, so a step over an already rewrapped range still lets
   deliveries in between. */
#define CASBOX_REKEY_EXAMINE_FACTOR 64

/* Decode a blob record value. Returns 1 ok, -1 malformed. */
static int
casbox_rekey_decode(const unsigned char *value, size_t value_size,
		    struct casbox_blob_value *bval_r,
		    struct casbox_blob_record *brec_r)
{
	const char *error;

	if (casbox_blob_value_import(value, value_size, bval_r, &error) < 0 ||
	    casbox_blob_record_import(bval_r->pack_record,
				      bval_r->pack_record_size,
				      brec_r, &error) < 0)
		return -1;
	return 1;
}

static void
casbox_rekey_put(struct casbox_lsm_batch *batch, const unsigned char *key,
		 size_t key_size, uint32_t refcount,
		 const struct casbox_blob_record *brec)
{
	struct casbox_blob_value bval;
	buffer_t *prec, *value;

	prec = t_buffer_create(CASBOX_BLOB_RECORD_EXPORT_SIZE);
	casbox_blob_record_export(brec, prec);
	i_zero(&bval);
	bval.refcount = refcount;
	bval.pack_record = prec->data;
	bval.pack_record_size = prec->used;
	value = t_buffer_create(CASBOX_BLOB_RECORD_EXPORT_SIZE + 16);
	casbox_blob_value_export(&bval, value);
	casbox_lsm_batch_put(batch, key, key_size, value->data, value->used);
}

/* Rewrap one blob record if it names old_key_id. */
static void
casbox_rekey_one(struct casbox_lsm_batch *batch,
		 const struct cas_keyring *keyring, uint32_t old_key_id,
		 const unsigned char *key, size_t key_size,
		 const unsigned char *value, size_t value_size,
		 casbox_rekey_callback_t *callback, void *context,
		 struct casbox_rekey_stats *step)
{
	struct casbox_blob_value bval;
	struct casbox_blob_record brec;
	struct cas_blob_id id;
	unsigned char new_wrapped[CAS_WRAPPED_DEK_SIZE];
	const char *error;

	if (key_size != 1 + CAS_BLOB_ID_SIZE ||
	    casbox_rekey_decode(value, value_size, &bval, &brec) < 0) {
		step->bad_records++;
		return;
	}
	if (cas_dek_wrapped_key_id(brec.wrapped_dek) != old_key_id) {
		/* already rewrapped, or written since the rotation began */
		return;
	}
	memcpy(id.id, key + 1, CAS_BLOB_ID_SIZE);
	if (cas_dek_rewrap(keyring, keyring, &id, brec.wrapped_dek,
			   new_wrapped, &error) < 0) {
		i_error("casbox key rotate: blob %s: %s (left as it is)",
			cas_blob_id_to_hex(&id), error);
		step->failed++;
		return;
	}
	if (callback != NULL)
		callback(context, batch, &id, brec.wrapped_dek, new_wrapped);
	memcpy(brec.wrapped_dek, new_wrapped, sizeof(new_wrapped));
	casbox_rekey_put(batch, key, key_size, bval.refcount, &brec);
	step->rewrapped++;
}

int casbox_rekey_step(struct casbox_lsm *lsm,
		      const struct cas_keyring *keyring,
		      uint32_t old_key_id, unsigned int max_records,
		      buffer_t *pos, casbox_rekey_callback_t *callback,
		      void *context, struct casbox_rekey_stats *stats,
		      const char **error_r)
{
	const unsigned char prefix = CASBOX_KEY_BLOB;
	struct casbox_lsm_batch *batch;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	struct casbox_rekey_stats step;
	uint64_t max_examined;
	bool more = FALSE;

	i_assert(max_records > 0);
	i_assert(old_key_id != cas_keyring_wrap_key_id(keyring));
	max_examined = (uint64_t)max_records * CASBOX_REKEY_EXAMINE_FACTOR;
	i_zero(&step);
	/* the lock makes the records read below the latest ones, and no
	   other writer commits before this batch does */
	if (casbox_lsm_batch_begin(lsm, &batch, error_r) < 0)
		return -1;
	iter = casbox_lsm_iter_init(lsm, &prefix, 1);
	if (pos->used > 0)
		casbox_lsm_iter_seek(iter, pos->data, pos->used);
	while (casbox_lsm_iter_next(iter, &key, &key_size,
				    &value, &value_size)) {
		if (pos->used == key_size &&
		    memcmp(pos->data, key, key_size) == 0) {
			/* examined by the previous step */
			continue;
		}
		if (step.rewrapped >= max_records ||
		    step.examined >= max_examined) {
			more = TRUE;
			break;
		}
		step.examined++;
		/* outside the data stack frame below: pos may grow */
		buffer_set_used_size(pos, 0);
		buffer_append(pos, key, key_size);
		T_BEGIN {
			casbox_rekey_one(batch, keyring, old_key_id,
					 key, key_size, value, value_size,
					 callback, context, &step);
		} T_END;
	}
	if (casbox_lsm_iter_deinit(&iter, error_r) < 0) {
		casbox_lsm_batch_rollback(&batch);
		return -1;
	}
	if (step.rewrapped == 0)
		casbox_lsm_batch_rollback(&batch);
	else if (casbox_lsm_batch_commit(&batch, error_r) < 0)
		return -1;
	stats->examined += step.examined;
	stats->rewrapped += step.rewrapped;
	stats->failed += step.failed;
	stats->bad_records += step.bad_records;
	return more ? 1 : 0;
}

int casbox_rekey_count(struct casbox_lsm *lsm,
		       const struct cas_keyring *keyring, uint32_t key_id,
		       uint64_t *count_r, uint64_t *foreign_r,
		       const char **error_r)
{
	const unsigned char prefix = CASBOX_KEY_BLOB;
	struct casbox_lsm_iter *iter;
	struct casbox_blob_value bval;
	struct casbox_blob_record brec;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	uint32_t wrapped_id;

	*count_r = *foreign_r = 0;
	iter = casbox_lsm_iter_init(lsm, &prefix, 1);
	while (casbox_lsm_iter_next(iter, &key, &key_size,
				    &value, &value_size)) {
		if (key_size != 1 + CAS_BLOB_ID_SIZE ||
		    casbox_rekey_decode(value, value_size, &bval, &brec) < 0)
			continue;
		wrapped_id = cas_dek_wrapped_key_id(brec.wrapped_dek);
		if (wrapped_id == key_id)
			(*count_r)++;
		else if (!cas_keyring_has_key_id(keyring, wrapped_id))
			(*foreign_r)++;
	}
	return casbox_lsm_iter_deinit(&iter, error_r) < 0 ? -1 : 0;
}
