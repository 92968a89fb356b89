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

struct casbox_rekey_ctx {
	struct casbox_lsm_batch *batch;
	/* NULL: no packs to keep in step (unit tests of the LSM walk) */
	struct casbox_pack_store *packs;
	/* begun at the first rewrap: a step over an already rewrapped
	   range takes no pack lock and costs no fsync */
	struct casbox_pack_txn *pack_txn;
	const struct cas_keyring *keyring;
	uint32_t old_key_id;
	casbox_rekey_callback_t *callback;
	void *context;
	struct casbox_rekey_stats step;
};

/* The DEK update that lets rebuild --from-packs open the blob once the
   old slot is gone. Returns 0 ok, -1 error. */
static int
casbox_rekey_dek_update(struct casbox_rekey_ctx *ctx,
			const struct cas_blob_id *id,
			const unsigned char *new_wrapped, const char **error_r)
{
	const char *error;

	if (ctx->packs == NULL)
		return 0;
	if (ctx->pack_txn == NULL &&
	    casbox_pack_txn_begin(ctx->packs, &ctx->pack_txn, &error) < 0) {
		*error_r = t_strdup_printf("pack append: %s", error);
		return -1;
	}
	if (casbox_pack_txn_add_dek_update(ctx->pack_txn, id, new_wrapped,
					   &error) < 0) {
		*error_r = t_strdup_printf("pack append: %s", error);
		return -1;
	}
	return 0;
}

/* Rewrap one blob record if it names old_key_id. Returns 0 ok (record
   rewrapped, left or counted as bad), -1 pack error. */
static int
casbox_rekey_one(struct casbox_rekey_ctx *ctx,
		 const unsigned char *key, size_t key_size,
		 const unsigned char *value, size_t value_size,
		 const char **error_r)
{
	struct casbox_blob_value bval;
	struct casbox_blob_record brec;
	struct cas_blob_id id;
	unsigned char new_wrapped[CAS_WRAPPED_DEK_SIZE];
	const char *error;

	if (key_size != 1 + CAS_BLOB_ID_SIZE ||
	    casbox_rekey_decode(value, value_size, &bval, &brec) < 0) {
		ctx->step.bad_records++;
		return 0;
	}
	if (brec.dek_kind != CAS_DEK_KIND_SERVER_WRAP ||
	    cas_dek_wrapped_key_id(brec.wrapped_dek) != ctx->old_key_id) {
		/* already rewrapped, or written since the rotation began
		   (or sealed to a user key: nothing to rewrap) */
		return 0;
	}
	memcpy(id.id, key + 1, CAS_BLOB_ID_SIZE);
	if (cas_dek_rewrap(ctx->keyring, ctx->keyring, &id, brec.wrapped_dek,
			   new_wrapped, &error) < 0) {
		i_error("casbox key rotate: blob %s: %s (left as it is)",
			cas_blob_id_to_hex(&id), error);
		ctx->step.failed++;
		return 0;
	}
	if (casbox_rekey_dek_update(ctx, &id, new_wrapped, error_r) < 0)
		return -1;
	if (ctx->callback != NULL) {
		ctx->callback(ctx->context, ctx->batch, &id,
			      brec.wrapped_dek, new_wrapped);
	}
	memcpy(brec.wrapped_dek, new_wrapped, sizeof(new_wrapped));
	casbox_rekey_put(ctx->batch, key, key_size, bval.refcount, &brec);
	ctx->step.rewrapped++;
	return 0;
}

/* Packs first, then the LSM: whatever blob record the LSM holds, some
   DEK update or recovery record in the packs carries the same wrap.
   Returns 0 ok, -1 error (nothing of the LSM batch applied). */
static int casbox_rekey_commit(struct casbox_rekey_ctx *ctx,
			       const char **error_r)
{
	const char *error;

	if (ctx->step.rewrapped == 0) {
		i_assert(ctx->pack_txn == NULL);
		casbox_lsm_batch_rollback(&ctx->batch);
		return 0;
	}
	if (ctx->pack_txn != NULL &&
	    casbox_pack_txn_commit(&ctx->pack_txn, &error) < 0) {
		*error_r = t_strdup_printf("pack commit: %s", error);
		casbox_lsm_batch_rollback(&ctx->batch);
		return -1;
	}
	return casbox_lsm_batch_commit(&ctx->batch, error_r) < 0 ? -1 : 0;
}

static void casbox_rekey_abort(struct casbox_rekey_ctx *ctx)
{
	if (ctx->pack_txn != NULL)
		casbox_pack_txn_rollback(&ctx->pack_txn);
	casbox_lsm_batch_rollback(&ctx->batch);
}

int casbox_rekey_step(struct casbox_lsm *lsm,
		      struct casbox_pack_store *packs,
		      const struct cas_keyring *keyring,
		      uint32_t old_key_id, unsigned int max_records,
		      buffer_t *pos, casbox_rekey_callback_t *callback,
		      void *context, struct casbox_rekey_stats *stats,
		      const char **error_r)
{
	const unsigned char prefix = CASBOX_KEY_BLOB;
	struct casbox_rekey_ctx ctx;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	const char *iter_error;
	size_t key_size, value_size;
	uint64_t max_examined;
	bool more = FALSE;
	int ret = 0;

	i_assert(max_records > 0);
	i_assert(old_key_id != cas_keyring_wrap_key_id(keyring));
	max_examined = (uint64_t)max_records * CASBOX_REKEY_EXAMINE_FACTOR;
	i_zero(&ctx);
	ctx.packs = packs;
	ctx.keyring = keyring;
	ctx.old_key_id = old_key_id;
	ctx.callback = callback;
	ctx.context = context;
	/* the lock makes the records read below the latest ones, and no
	   other writer commits before this batch does. Lock order: the
	   LSM write lock, then the pack append lock (taken at the first
	   rewrap), as saves take them; gc takes the pack lock alone, or
	   after the LSM lock */
	if (casbox_lsm_batch_begin(lsm, &ctx.batch, error_r) < 0)
		return -1;
	iter = casbox_lsm_iter_init(lsm, &prefix, 1);
	if (pos->used > 0)
		casbox_lsm_iter_seek(iter, pos->data, pos->used);
	while (ret == 0 && casbox_lsm_iter_next(iter, &key, &key_size,
						&value, &value_size)) {
		if (pos->used == key_size &&
		    memcmp(pos->data, key, key_size) == 0) {
			/* examined by the previous step */
			continue;
		}
		if (ctx.step.rewrapped >= max_records ||
		    ctx.step.examined >= max_examined) {
			more = TRUE;
			break;
		}
		ctx.step.examined++;
		/* outside the data stack frame below: pos may grow */
		buffer_set_used_size(pos, 0);
		buffer_append(pos, key, key_size);
		T_BEGIN {
			ret = casbox_rekey_one(&ctx, key, key_size,
					       value, value_size, error_r);
		} T_END_PASS_STR_IF(ret < 0, error_r);
	}
	if (casbox_lsm_iter_deinit(&iter, &iter_error) < 0 && ret == 0) {
		*error_r = iter_error;
		ret = -1;
	}
	if (ret < 0) {
		casbox_rekey_abort(&ctx);
		return -1;
	}
	if (casbox_rekey_commit(&ctx, error_r) < 0)
		return -1;
	stats->examined += ctx.step.examined;
	stats->rewrapped += ctx.step.rewrapped;
	stats->failed += ctx.step.failed;
	stats->bad_records += ctx.step.bad_records;
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
		    casbox_rekey_decode(value, value_size, &bval, &brec) < 0 ||
		    brec.dek_kind != CAS_DEK_KIND_SERVER_WRAP)
			continue;
		wrapped_id = cas_dek_wrapped_key_id(brec.wrapped_dek);
		if (wrapped_id == key_id)
			(*count_r)++;
		else if (!cas_keyring_has_key_id(keyring, wrapped_id))
			(*foreign_r)++;
	}
	return casbox_lsm_iter_deinit(&iter, error_r) < 0 ? -1 : 0;
}
