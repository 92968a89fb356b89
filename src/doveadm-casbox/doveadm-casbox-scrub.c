/* doveadm casbox scrub: verify every pack frame, LSM file and reference
   of a user's store; with --repair fix refcounts and mark damaged
   blobs. See doc/doveadm.md. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "mail-user.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "casbox-lsm.h"
#include "doveadm-casbox.h"

#include <sysexits.h>

struct casbox_scrub_cmd_context {
	struct doveadm_mail_cmd_context ctx;
	bool repair;
};

struct casbox_scrub {
	struct casbox_admin *adm;
	struct casbox_census *census;
	/* damage rows printed */
	unsigned int damaged;
	/* of those, fixed by --repair */
	unsigned int repaired;
};

static void casbox_scrub_row(void *context, const char *mailbox,
			     uint32_t uid, const char *object,
			     const char *cause)
{
	struct casbox_scrub *scrub = context;

	scrub->damaged++;
	doveadm_print(mailbox);
	doveadm_print(uid == 0 ? "-" : dec2str(uid));
	doveadm_print(object);
	doveadm_print(cause);
}

static void casbox_scrub_lsm_damage(void *context, const char *file,
				    uoff_t offset, const char *reason)
{
	casbox_scrub_row(context, "-", 0,
			 t_strdup_printf("%s@%"PRIuUOFF_T, file, offset),
			 t_strdup_printf("LSM damage: %s", reason));
}

/* Decode the blob to its end: every chunk's CRC and AEAD tag. */
static void casbox_scrub_decode(struct casbox_scrub *scrub,
				struct casbox_admin_blob *blob)
{
	struct istream *input;
	const unsigned char *data;
	size_t size;

	input = casbox_pack_blob_open(scrub->adm->packs, &blob->id,
				      &blob->rec);
	while (i_stream_read_more(input, &data, &size) > 0)
		i_stream_skip(input, size);
	if (input->stream_errno != 0) {
		blob->damage = p_strdup(scrub->census->pool,
					i_stream_get_error(input));
	} else if (input->v_offset != blob->rec.plain_size) {
		blob->damage = p_strdup_printf(scrub->census->pool,
			"decoded %"PRIuUOFF_T" bytes, the record says %"
			PRIu64, input->v_offset, blob->rec.plain_size);
	}
	i_stream_unref(&input);
}

static void casbox_scrub_blobs(struct casbox_scrub *scrub)
{
	struct casbox_admin_blob *blob;
	unsigned int i = 0, count = array_count(&scrub->census->blob_list);

	array_foreach_elem(&scrub->census->blob_list, blob) T_BEGIN {
		casbox_admin_progress("scrub: decoding blobs", ++i, count);
		if (!blob->have_record || blob->damage != NULL)
			;
		else if (!blob->frame_seen) {
			blob->damage = p_strdup_printf(scrub->census->pool,
				"no intact frame at pack %u offset %"PRIu64,
				blob->rec.pack_id, blob->rec.offset);
		} else if (scrub->adm->keyring != NULL) {
			casbox_scrub_decode(scrub, blob);
		}
	} T_END;
	casbox_admin_progress_end();
}

/* One row per message part that cannot be read. */
static void casbox_scrub_message(struct casbox_scrub *scrub,
				 const unsigned char *key, size_t key_size,
				 const unsigned char *value,
				 size_t value_size)
{
	const struct casbox_msg_part *part;
	struct casbox_admin_blob *blob;
	struct casbox_msg_record rec;
	const char *error, *mailbox;
	guid_128_t guid;
	uint32_t uid;

	if (casbox_key_message_parse(key, key_size, guid, &uid) < 0 ||
	    casbox_msg_record_import(value, value_size,
				     pool_datastack_create(), &rec,
				     &error) < 0)
		return; /* reported by the census */
	mailbox = casbox_census_mailbox_name(scrub->census, guid);
	array_foreach(&rec.parts, part) {
		blob = hash_table_lookup(scrub->census->blobs, &part->id);
		i_assert(blob != NULL);
		if (!blob->have_record) {
			casbox_scrub_row(scrub, mailbox, uid,
					 cas_blob_id_to_hex(&part->id),
					 "blob record missing");
		} else if (blob->damage != NULL) {
			casbox_scrub_row(scrub, mailbox, uid,
					 cas_blob_id_to_hex(&part->id),
					 blob->damage);
		}
	}
}

static int casbox_scrub_messages(struct casbox_scrub *scrub,
				 const char **error_r)
{
	unsigned char prefix = CASBOX_KEY_MESSAGE;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;

	iter = casbox_lsm_iter_init(scrub->adm->lsm, &prefix, 1);
	while (casbox_lsm_iter_next(iter, &key, &key_size,
				    &value, &value_size)) T_BEGIN {
		casbox_scrub_message(scrub, key, key_size, value, value_size);
	} T_END;
	return casbox_lsm_iter_deinit(&iter, error_r);
}

/* Refcounts against the references counted, and damaged blobs that no
   message names. */
static void casbox_scrub_refcounts(struct casbox_scrub *scrub)
{
	struct casbox_admin_blob *blob;

	array_foreach_elem(&scrub->census->blob_list, blob) T_BEGIN {
		const char *hex = cas_blob_id_to_hex(&blob->id);

		if (!blob->have_record || blob->record_bad)
			;
		else if (blob->refcount != blob->counted) {
			casbox_scrub_row(scrub, "-", 0, hex, t_strdup_printf(
				"refcount %u, but %u references",
				blob->refcount, blob->counted));
		} else if (blob->damage != NULL && blob->counted == 0) {
			casbox_scrub_row(scrub, "-", 0, hex, t_strdup_printf(
				"unreferenced blob: %s", blob->damage));
		}
	} T_END;
}

/* Without the key, everything but decoding still runs; the run then
   fails with the key error, so it is never mistaken for a clean one. */
static int casbox_scrub_open_packs(struct casbox_scrub *scrub,
				   const char **key_error_r,
				   const char **error_r)
{
	int ret;

	*key_error_r = NULL;
	if (casbox_admin_open_keys(scrub->adm, key_error_r) > 0)
		return 1;
	ret = casbox_admin_open_packs_keyless(scrub->adm, error_r);
	if (ret == 0) {
		*key_error_r = t_strdup_printf("%s: packs not checked "
			"(their dictionaries need the key)", *key_error_r);
	} else if (ret > 0) {
		*key_error_r = t_strdup_printf("%s: blobs not decoded, "
			"pack frames checked by CRC only", *key_error_r);
	}
	return ret;
}

static int casbox_scrub_check(struct casbox_scrub *scrub,
			      const char **error_r)
{
	struct casbox_admin *adm = scrub->adm;
	const char *key_error;
	int ret;

	if (casbox_lsm_verify(adm->lsm, casbox_scrub_lsm_damage, scrub,
			      error_r) < 0)
		return -1;
	if (casbox_census_build(adm, casbox_scrub_row, scrub,
				&scrub->census, error_r) < 0)
		return -1;
	if ((ret = casbox_scrub_open_packs(scrub, &key_error, error_r)) < 0)
		return -1;
	if (ret > 0 && casbox_census_scan_packs(adm, scrub->census,
						casbox_scrub_row, scrub,
						error_r) < 0)
		return -1;
	if (ret > 0)
		casbox_scrub_blobs(scrub);
	if (casbox_scrub_messages(scrub, error_r) < 0)
		return -1;
	casbox_scrub_refcounts(scrub);
	if (key_error != NULL) {
		*error_r = key_error;
		return -1;
	}
	return 0;
}

static void casbox_scrub_repair_row(struct casbox_scrub *scrub,
				    const struct cas_blob_id *id,
				    const char *action)
{
	scrub->repaired++;
	doveadm_print("-");
	doveadm_print("-");
	doveadm_print(cas_blob_id_to_hex(id));
	doveadm_print(action);
}

static void
casbox_scrub_repair_blob(struct casbox_scrub *scrub,
			 struct casbox_lsm_batch *batch,
			 const struct casbox_admin_blob *fresh,
			 const struct casbox_admin_blob *checked)
{
	struct casbox_blob_value bval;
	buffer_t *key, *value, *rec;

	key = t_buffer_create(40);
	casbox_key_blob(key, &fresh->id);
	if (fresh->refcount != fresh->counted) {
		rec = t_buffer_create(CASBOX_BLOB_RECORD_EXPORT_SIZE);
		casbox_blob_record_export(&fresh->rec, rec);
		i_zero(&bval);
		bval.refcount = fresh->counted;
		bval.pack_record = rec->data;
		bval.pack_record_size = rec->used;
		value = t_buffer_create(128);
		casbox_blob_value_export(&bval, value);
		casbox_lsm_batch_put(batch, key->data, key->used,
				     value->data, value->used);
		casbox_scrub_repair_row(scrub, &fresh->id, t_strdup_printf(
			"repaired: refcount %u -> %u", fresh->refcount,
			fresh->counted));
	}
	if (checked != NULL && checked->damage != NULL &&
	    checked->have_record && !checked->record_bad &&
	    checked->rec.pack_id == fresh->rec.pack_id &&
	    checked->rec.offset == fresh->rec.offset) {
		buffer_set_used_size(key, 0);
		buffer_append_c(key, CASBOX_ADMIN_KEY_DAMAGED);
		buffer_append(key, fresh->id.id, sizeof(fresh->id.id));
		casbox_lsm_batch_put(batch, key->data, key->used,
				     checked->damage, strlen(checked->damage));
		casbox_scrub_repair_row(scrub, &fresh->id,
					"marked damaged (not deleted)");
	}
}

/* Recount under the write lock, so no save changes refcounts between
   counting and writing; damage found by the check is marked if the
   blob record still points to the same frame. */
static int casbox_scrub_repair(struct casbox_scrub *scrub,
			       const char **error_r)
{
	struct casbox_census *fresh;
	struct casbox_lsm_batch *batch;
	struct casbox_admin_blob *blob, *checked;

	if (casbox_lsm_batch_begin(scrub->adm->lsm, &batch, error_r) < 0)
		return -1;
	if (casbox_census_build(scrub->adm, NULL, NULL, &fresh,
				error_r) < 0) {
		casbox_lsm_batch_rollback(&batch);
		return -1;
	}
	array_foreach_elem(&fresh->blob_list, blob) T_BEGIN {
		checked = hash_table_lookup(scrub->census->blobs, &blob->id);
		if (blob->have_record && !blob->record_bad)
			casbox_scrub_repair_blob(scrub, batch, blob, checked);
	} T_END;
	casbox_census_free(&fresh);
	return casbox_lsm_batch_commit(&batch, error_r) < 0 ? -1 : 0;
}

static int
cmd_casbox_scrub_run(struct doveadm_mail_cmd_context *_ctx,
		     struct mail_user *user)
{
	struct casbox_scrub_cmd_context *ctx =
		container_of(_ctx, struct casbox_scrub_cmd_context, ctx);
	struct casbox_scrub scrub;
	const char *error;
	int ret;

	i_zero(&scrub);
	ret = casbox_admin_open(user, &scrub.adm, &error);
	if (ret <= 0) {
		i_error("casbox scrub: %s", error);
		doveadm_mail_failed_error(_ctx, ret == 0 ?
			MAIL_ERROR_NOTFOUND : MAIL_ERROR_TEMP);
		return -1;
	}
	ret = casbox_scrub_check(&scrub, &error);
	if (ret == 0 && ctx->repair && scrub.damaged > 0)
		ret = casbox_scrub_repair(&scrub, &error);
	if (ret < 0) {
		i_error("casbox scrub: %s", error);
		doveadm_mail_failed_error(_ctx, MAIL_ERROR_TEMP);
	} else if (scrub.damaged > 0) {
		i_warning("casbox scrub: %s: %u damaged item(s)%s",
			  scrub.adm->root_dir, scrub.damaged,
			  ctx->repair ? ", see the repaired rows" : "");
		_ctx->exit_code = EX_DATAERR;
	}
	if (scrub.census != NULL)
		casbox_census_free(&scrub.census);
	casbox_admin_close(&scrub.adm);
	return ret;
}

static void cmd_casbox_scrub_init(struct doveadm_mail_cmd_context *ctx
				  ATTR_UNUSED,
				  const char *const args[] ATTR_UNUSED)
{
	doveadm_print_header_simple("mailbox");
	doveadm_print_header("uid", "uid",
			     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	doveadm_print_header_simple("blob");
	doveadm_print_header_simple("cause");
}

static bool cmd_casbox_scrub_parse_arg(struct doveadm_mail_cmd_context *_ctx,
				       int c)
{
	struct casbox_scrub_cmd_context *ctx =
		container_of(_ctx, struct casbox_scrub_cmd_context, ctx);

	if (c != 'r')
		return FALSE;
	ctx->repair = TRUE;
	return TRUE;
}

struct doveadm_mail_cmd_context *cmd_casbox_scrub_alloc(void)
{
	struct casbox_scrub_cmd_context *ctx;

	ctx = doveadm_mail_cmd_alloc(struct casbox_scrub_cmd_context);
	ctx->ctx.getopt_args = "r";
	ctx->ctx.v.parse_arg = cmd_casbox_scrub_parse_arg;
	ctx->ctx.v.init = cmd_casbox_scrub_init;
	ctx->ctx.v.run = cmd_casbox_scrub_run;
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return &ctx->ctx;
}
