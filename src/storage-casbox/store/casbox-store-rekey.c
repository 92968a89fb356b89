/* casbox-store-rekey: rewrap blob records' DEKs under the current key
   slot, in LSM batches under the write lock. */

#include "lib.h"
#include "buffer.h"
#include "str.h"
#include "strnum.h"
#include "cas-durable.h"
#include "casbox-lsm.h"
#include "casbox-pack.h"
#include "casbox-records.h"
#include "casbox-meta.h"
#include "casbox-store-rekey.h"
#include "casbox-xmsg.h"
#include "casbox-store.h"
#include "casbox-record-auth.h"
#include "casbox-store-safety.h"
#include "hex-binary.h"

#include <unistd.h>

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

/* ---- key rotation --finish: sealed message metadata ---- */

/* TRUE if value is a v2 record (casbox-record-auth.h) MACed under an
   epoch other than the current one. A v1 record of a store not upgraded
   yet carries no MAC: FALSE. */
static bool
casbox_rekey_mac_is_old(const struct cas_keyring *keyring,
			const unsigned char *value, size_t value_size)
{
	return value_size >= CASBOX_RECORD_AUTH_HEADER_SIZE &&
		value[0] == CASBOX_RECORD_AUTH_VERSION &&
		be32_to_cpu_unaligned(value + 1) !=
		cas_keyring_store_epoch(keyring);
}

/* The sealed metadata of one message record ('m', records v2): inline,
   or the shared 's' record it names (re-sealed with this message's part
   list, which its AAD binds, and put back under the same meta id), then
   the record itself MACed again under the current epoch when its
   metadata changed or its MAC is of an older epoch. step->rewrapped
   counts records rewritten, ->failed metadata that opens under no epoch
   the key ring holds (left as it is: FETCH parses the message instead,
   scrub names it), ->bad_records records that fail to verify. */
static void
casbox_rekey_meta_one(struct casbox_store *store,
		      struct casbox_lsm_batch *batch,
		      const unsigned char *key, size_t key_size,
		      const unsigned char *value, size_t value_size,
		      struct casbox_rekey_stats *step)
{
	const struct cas_keyring *keyring = casbox_store_get_keyring(store);
	struct casbox_lsm *lsm = casbox_store_get_lsm(store);
	struct casbox_msg_record rec, meta_rec;
	const unsigned char *sealed;
	size_t sealed_size;
	guid_128_t box_guid;
	buffer_t *out, *mkey, *mvalue, *keybuf;
	const char *error;
	uint32_t uid;
	bool rewrite;
	int ret;

	if (casbox_key_message_parse(key, key_size, box_guid, &uid) < 0 ||
	    casbox_store_msg_value_import(store, key, key_size, value,
					  value_size, pool_datastack_create(),
					  &rec, &error) < 0) {
		step->bad_records++;
		return;
	}
	rewrite = casbox_rekey_mac_is_old(keyring, value, value_size);
	if (rec.sealed_meta != NULL) {
		ret = casbox_meta_reseal(keyring, &rec,
					 pool_datastack_create(), &error);
		if (ret < 0) {
			i_error("casbox key rotate: message %s UID %u: sealed "
				"metadata: %s (left as it is)",
				guid_128_to_string(box_guid), uid, error);
			step->failed++;
		} else if (ret > 0) {
			rewrite = TRUE;
		}
	} else if (rec.meta_ref) {
		mkey = t_buffer_create(1 + CASBOX_META_ID_SIZE);
		casbox_key_meta(mkey, rec.meta_id);
		mvalue = t_buffer_create(2048);
		ret = casbox_lsm_get(lsm, mkey->data, mkey->used, mvalue,
				     &error);
		if (ret > 0 &&
		    casbox_store_meta_value_import(store, mkey->data,
			mkey->used, mvalue->data, mvalue->used, &sealed,
			&sealed_size, &error) < 0)
			ret = -1;
		if (ret > 0) {
			meta_rec = rec;
			meta_rec.sealed_meta = sealed;
			meta_rec.sealed_meta_size = sealed_size;
			ret = casbox_meta_reseal(keyring, &meta_rec,
						 pool_datastack_create(),
						 &error);
		}
		if (ret > 0) {
			out = t_buffer_create(meta_rec.sealed_meta_size + 64);
			if (casbox_store_meta_value_export(store, mkey,
					meta_rec.sealed_meta,
					meta_rec.sealed_meta_size, out,
					&error) < 0)
				ret = -1;
			else {
				casbox_lsm_batch_put(batch, mkey->data,
						     mkey->used, out->data,
						     out->used);
				step->rewrapped++;
			}
		}
		if (ret < 0) {
			i_error("casbox key rotate: message %s UID %u: shared "
				"sealed metadata %s: %s (left as it is)",
				guid_128_to_string(box_guid), uid,
				binary_to_hex(rec.meta_id,
					      CASBOX_META_ID_SIZE), error);
			step->failed++;
		}
	}
	if (!rewrite)
		return;
	keybuf = t_buffer_create(key_size);
	buffer_append(keybuf, key, key_size);
	out = t_buffer_create(value_size + 64);
	if (casbox_store_msg_value_export(store, keybuf, &rec, out,
					  &error) < 0) {
		i_error("casbox key rotate: message %s UID %u: %s",
			guid_128_to_string(box_guid), uid, error);
		step->failed++;
		return;
	}
	casbox_lsm_batch_put(batch, key, key_size, out->data, out->used);
	step->rewrapped++;
}

/* Any other authenticated record (V, f, r, s, x): MACed again under the
   current epoch if it is of an older one; its body stays as it is. A
   cross-message record ('X') of an older epoch is deleted instead. */
static void
casbox_rekey_mac_one(struct casbox_store *store,
		     struct casbox_lsm_batch *batch,
		     const unsigned char *key, size_t key_size,
		     const unsigned char *value, size_t value_size,
		     struct casbox_rekey_stats *step)
{
	const struct cas_keyring *keyring = casbox_store_get_keyring(store);
	const void *body;
	size_t body_size;
	bool authenticated;
	buffer_t *out;
	const char *error;

	if (!casbox_rekey_mac_is_old(keyring, value, value_size))
		return;
	if (key_size > 0 && key[0] == CASBOX_KEY_XMSG) {
		/* keyed by a hash under that epoch's record key, which is
		   going: no save can look it up again (casbox-xmsg.h) */
		casbox_lsm_batch_delete(batch, key, key_size);
		step->rewrapped++;
		return;
	}
	if (casbox_record_open(store, key, key_size, value, value_size,
			       &body, &body_size, &authenticated,
			       &error) < 0) {
		/* scrub names it; left as it is */
		step->bad_records++;
		return;
	}
	out = t_buffer_create(value_size + 16);
	if (casbox_record_seal(store, key, key_size, body, body_size, out,
			       &error) < 0) {
		step->failed++;
		return;
	}
	casbox_lsm_batch_put(batch, key, key_size, out->data, out->used);
	step->rewrapped++;
}

typedef void casbox_rekey_one_t(struct casbox_store *store,
				struct casbox_lsm_batch *batch,
				const unsigned char *key, size_t key_size,
				const unsigned char *value, size_t value_size,
				struct casbox_rekey_stats *step);

/* One batch of a walk over the records whose key starts with one of
   prefixes, from after pos (pos: the prefix index byte, then the last
   key examined). */
static int
casbox_rekey_records_walk(struct casbox_store *store, const char *prefixes,
			  casbox_rekey_one_t *one, unsigned int max_records,
			  buffer_t *pos, struct casbox_rekey_stats *stats,
			  const char **error_r)
{
	struct casbox_lsm *lsm = casbox_store_get_lsm(store);
	struct casbox_rekey_stats step;
	struct casbox_lsm_batch *batch;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	const char *iter_error;
	size_t key_size, value_size, idx;
	uint64_t max_examined;
	unsigned char prefix;
	bool more = FALSE;

	i_assert(max_records > 0);
	if (casbox_store_open_keys(store, error_r) < 0)
		return -1;
	max_examined = (uint64_t)max_records * CASBOX_REKEY_EXAMINE_FACTOR;
	i_zero(&step);
	idx = pos->used == 0 ? 0 : ((const unsigned char *)pos->data)[0];
	/* under the write lock: a flag change's read-modify-write of the
	   same record commits before this batch reads it or after it */
	if (casbox_lsm_batch_begin(lsm, &batch, error_r) < 0)
		return -1;
	for (; idx < strlen(prefixes) && !more; idx++) {
		prefix = prefixes[idx];
		iter = casbox_lsm_iter_init(lsm, &prefix, 1);
		if (pos->used > 1 && ((const unsigned char *)pos->data)[0] ==
		    idx) {
			casbox_lsm_iter_seek(iter,
				CONST_PTR_OFFSET(pos->data, 1),
				pos->used - 1);
		}
		while (casbox_lsm_iter_next(iter, &key, &key_size,
					    &value, &value_size)) {
			if (pos->used == key_size + 1 &&
			    ((const unsigned char *)pos->data)[0] == idx &&
			    memcmp(CONST_PTR_OFFSET(pos->data, 1), key,
				   key_size) == 0)
				continue;
			if (step.rewrapped >= max_records ||
			    step.examined >= max_examined) {
				more = TRUE;
				break;
			}
			step.examined++;
			buffer_set_used_size(pos, 0);
			buffer_append_c(pos, idx);
			buffer_append(pos, key, key_size);
			T_BEGIN {
				one(store, batch, key, key_size, value,
				    value_size, &step);
			} T_END;
		}
		if (casbox_lsm_iter_deinit(&iter, &iter_error) < 0) {
			*error_r = t_strdup(iter_error);
			casbox_lsm_batch_rollback(&batch);
			return -1;
		}
		if (!more) {
			/* the next prefix from its start */
			buffer_set_used_size(pos, 0);
			buffer_append_c(pos, idx + 1);
		}
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

int casbox_rekey_meta_step(struct casbox_store *store,
			   unsigned int max_records, buffer_t *pos,
			   struct casbox_rekey_stats *stats,
			   const char **error_r)
{
	const char prefixes[] = { CASBOX_KEY_MESSAGE, '\0' };

	return casbox_rekey_records_walk(store, prefixes,
					 casbox_rekey_meta_one, max_records,
					 pos, stats, error_r);
}

int casbox_rekey_records_step(struct casbox_store *store,
			      unsigned int max_records, buffer_t *pos,
			      struct casbox_rekey_stats *stats,
			      const char **error_r)
{
	/* every record type casbox-record-auth.h authenticates but 'm',
	   which the metadata step rewrote */
	const char prefixes[] = {
		CASBOX_KEY_RECORDS_VERSION, CASBOX_KEY_FLAGS,
		CASBOX_KEY_META_REFS, CASBOX_KEY_META, CASBOX_KEY_RETAINED,
		CASBOX_KEY_XMSG, '\0'
	};

	return casbox_rekey_records_walk(store, prefixes,
					 casbox_rekey_mac_one, max_records,
					 pos, stats, error_r);
}

int casbox_rekey_lsm(struct casbox_store *store, const char **error_r)
{
	/* the codec's current epoch is the key file's as of now */
	if (casbox_store_refresh_keys(store, error_r) < 0)
		return -1;
	return casbox_lsm_reseal(casbox_store_get_lsm(store), error_r) < 0 ?
		-1 : 0;
}

int casbox_rekey_dicts(struct casbox_pack_store *packs,
		       struct casbox_rekey_stats *stats,
		       const char **error_r)
{
	unsigned int resealed, failed;

	if (casbox_pack_dicts_reseal(packs, &resealed, &failed,
				     error_r) < 0)
		return -1;
	stats->rewrapped += resealed;
	stats->failed += failed;
	return 0;
}

int casbox_rekey_oldest_pack(struct casbox_pack_store *packs,
			     uint32_t *oldest_r, uint32_t *newest_r,
			     const char **error_r)
{
	return casbox_pack_store_id_range(packs, oldest_r, newest_r,
					  error_r);
}

/* ---- key rotation --finish: the durable progress marker ---- */

#define CASBOX_REKEY_PROGRESS_NAME "rotate-finish"
#define CASBOX_REKEY_PROGRESS_MAGIC "casbox-rotate-finish 1"

static const char *casbox_rekey_progress_path(const char *root_dir)
{
	return t_strdup_printf("%s/"CASBOX_REKEY_PROGRESS_NAME, root_dir);
}

int casbox_rekey_progress_read(const char *root_dir, uint32_t epoch,
			       const char **step_r, const char **error_r)
{
	const char *path = casbox_rekey_progress_path(root_dir);
	const char *const *lines;
	buffer_t *buf;
	uint32_t file_epoch;
	int ret;

	*step_r = NULL;
	buf = t_buffer_create(128);
	ret = cas_durable_read_file(NULL, path, 1024, buf, error_r);
	if (ret <= 0)
		return ret;
	lines = t_strsplit(t_strndup(buf->data, buf->used), "\n");
	if (str_array_length(lines) < 3 ||
	    strcmp(lines[0], CASBOX_REKEY_PROGRESS_MAGIC) != 0 ||
	    strncmp(lines[1], "epoch ", 6) != 0 ||
	    str_to_uint32(lines[1] + 6, &file_epoch) < 0 ||
	    strncmp(lines[2], "done ", 5) != 0) {
		*error_r = t_strdup_printf("%s is damaged (remove it: "
					   "--finish then starts over, "
					   "which is safe)", path);
		return -1;
	}
	/* a marker of an earlier rotation says nothing about this one */
	if (file_epoch != epoch)
		return 0;
	*step_r = t_strdup(lines[2] + 5);
	return 1;
}

int casbox_rekey_progress_write(const char *root_dir, uint32_t epoch,
				const char *step, bool fsync,
				const char **error_r)
{
	struct cas_durable_write_settings wset = {
		.no_fsync = !fsync,
	};
	string_t *str = t_str_new(128);

	str_printfa(str, CASBOX_REKEY_PROGRESS_MAGIC"\nepoch %u\ndone %s\n",
		    epoch, step);
	return cas_durable_write_atomic(casbox_rekey_progress_path(root_dir),
					str_data(str), str_len(str), &wset,
					error_r) < 0 ? -1 : 0;
}

int casbox_rekey_progress_remove(const char *root_dir, const char **error_r)
{
	const char *path = casbox_rekey_progress_path(root_dir);

	if (unlink(path) < 0 && errno != ENOENT) {
		*error_r = t_strdup_printf("unlink(%s) failed: %m", path);
		return -1;
	}
	return 0;
}
