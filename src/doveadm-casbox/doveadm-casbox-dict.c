/* doveadm casbox dict train: train a zstd dictionary from the header
   blocks of the user's small stored blobs and measure what it saves on
   header blocks held out of the training. Only header blocks: a
   dictionary trained on bodies would carry the user's body text into
   the compression of every later small blob, including mail an
   attacker sends (doc/threat-model.md). */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "mail-user.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "casbox-lsm.h"
#include "doveadm-casbox.h"
#include "doveadm-casbox-dovecot.h"

#include <sysexits.h>
#include <sodium.h>

/* at most this many training samples, and one held-out blob for every
   DICT_HOLDOUT_EVERY eligible ones (up to DICT_MAX_HELDOUT) */
#define DICT_MAX_SAMPLES 2000
#define DICT_HOLDOUT_EVERY 5
#define DICT_MAX_HELDOUT 500

struct dict_blob {
	struct cas_blob_id id;
	struct casbox_blob_record rec;
};
ARRAY_DEFINE_TYPE(dict_blob, struct dict_blob);
ARRAY_DEFINE_TYPE(dict_buffer, buffer_t *);

struct dict_train_result {
	uint32_t dict_id;
	unsigned int samples, heldout;
	uint64_t plain_bytes, without_bytes, with_bytes;
};

/* Blob records of blobs small enough for a dictionary. */
static int
dict_collect_blobs(struct casbox_admin *adm, size_t max_size,
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

	if (casbox_lsm_refresh(adm->lsm, error_r) < 0)
		return -1;
	iter = casbox_lsm_iter_init(adm->lsm, &prefix, 1);
	while (casbox_lsm_iter_next(iter, &key, &key_size,
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
dict_read_blob(struct casbox_admin *adm, const struct dict_blob *blob,
	       buffer_t *dest, const char **error_r)
{
	struct istream *input;
	const unsigned char *data;
	size_t size;
	int ret = 0;

	input = casbox_pack_blob_open(adm->packs, &blob->id, &blob->rec);
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
	     struct dict_train_result *res, const char **error_r)
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

static int
dict_train(struct casbox_admin *adm, struct dict_train_result *res,
	   const char **error_r)
{
	ARRAY_TYPE(dict_blob) blobs;
	ARRAY_TYPE(dict_buffer) train, heldout;
	ARRAY(const void *) samples;
	ARRAY(size_t) sizes;
	const struct dict_blob *blob;
	buffer_t *buf, **bufp;
	unsigned int i = 0;
	int ret = 0;

	t_array_init(&blobs, 256);
	t_array_init(&train, 256);
	t_array_init(&heldout, 64);
	t_array_init(&samples, 256);
	t_array_init(&sizes, 256);
	if (dict_collect_blobs(adm, casbox_pack_dict_max_blob_size(adm->packs),
			       &blobs, error_r) < 0)
		return -1;
	array_foreach(&blobs, blob) {
		bool hold = ++i % DICT_HOLDOUT_EVERY == 0;

		if (hold ? array_count(&heldout) >= DICT_MAX_HELDOUT :
		    array_count(&train) >= DICT_MAX_SAMPLES)
			continue;
		buf = buffer_create_dynamic(default_pool,
					    blob->rec.plain_size);
		if (dict_read_blob(adm, blob, buf, error_r) < 0) {
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
		ret = -1;
	}
	if (ret == 0) {
		array_foreach_modifiable(&train, bufp) {
			const void *data = (*bufp)->data;

			array_push_back(&samples, &data);
			array_push_back(&sizes, &(*bufp)->used);
		}
		if (casbox_pack_dict_train(adm->packs,
					   array_front(&samples),
					   array_front(&sizes),
					   array_count(&samples),
					   &res->dict_id, error_r) < 0)
			ret = -1;
	}
	if (ret == 0)
		ret = dict_measure(adm->packs, res->dict_id, &heldout, res,
				   error_r);
	/* the samples are mail */
	array_append_array(&train, &heldout);
	array_foreach_modifiable(&train, bufp) {
		sodium_memzero(buffer_get_modifiable_data(*bufp, NULL),
			       buffer_get_size(*bufp));
		buffer_free(bufp);
	}
	return ret;
}

static int
cmd_casbox_dict_train_run(struct doveadm_mail_cmd_context *ctx,
			  struct mail_user *user)
{
	struct dict_train_result res;
	struct casbox_admin *adm;
	const char *error;
	int ret;

	ret = casbox_admin_open(user, &adm, &error);
	if (ret <= 0) {
		return casbox_admin_open_failed(ctx, "casbox dict train",
						user, ret, error);
	}
	i_zero(&res);
	T_BEGIN {
		ret = casbox_admin_open_keys(adm, &error) < 0 ? -1 :
			dict_train(adm, &res, &error);
	} T_END_PASS_STR_IF(ret < 0, &error);
	casbox_admin_close(&adm);
	if (ret < 0) {
		i_error("casbox dict train: %s", error);
		ctx->exit_code = EX_DATAERR;
		return -1;
	}
	doveadm_print_num(res.dict_id);
	doveadm_print_num(res.samples);
	doveadm_print_num(res.heldout);
	doveadm_print_num(res.plain_bytes);
	doveadm_print_num(res.without_bytes);
	doveadm_print_num(res.with_bytes);
	doveadm_print(t_strdup_printf("%.3f", res.with_bytes == 0 ? 0.0 :
		(double)res.without_bytes / (double)res.with_bytes));
	return 0;
}

static void
cmd_casbox_dict_train_init(struct doveadm_mail_cmd_context *ctx ATTR_UNUSED CASBOX_DOVEADM_INIT_PARAMS)
{
	doveadm_print_header_simple("dict_id");
	doveadm_print_header_simple("samples");
	doveadm_print_header_simple("heldout");
	doveadm_print_header_simple("heldout_bytes");
	doveadm_print_header_simple("zstd_bytes");
	doveadm_print_header_simple("dict_bytes");
	doveadm_print_header_simple("gain");
}

struct doveadm_mail_cmd_context *cmd_casbox_dict_train_alloc(void)
{
	struct doveadm_mail_cmd_context *ctx;

	ctx = doveadm_mail_cmd_alloc(struct doveadm_mail_cmd_context);
	ctx->v.init = cmd_casbox_dict_train_init;
	ctx->v.run = cmd_casbox_dict_train_run;
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return ctx;
}
