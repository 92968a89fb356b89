/* casbox-store-safety: dup and retained records (casbox-store-safety.h). */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "cas-key.h"
#include "casbox-lsm.h"
#include "casbox-record-io.h"
#include "casbox-store.h"
#include "casbox-store-safety.h"
#include "casbox-record-auth.h"

#define CASBOX_SAFETY_RECORD_VERSION 1
/* A header block longer than this is hashed whole, trace fields and
   all (no real MTA writes one; it only bounds the memory used). */
#define CASBOX_DUP_MAX_HEADER_SIZE (1024 * 1024)
static const char casbox_dup_domain[] = "casbox-dup1";

ARRAY_DEFINE_TYPE(casbox_key_buf, buffer_t *);

static const char *const casbox_dup_trace_fields[] = {
	"Return-Path", "Received", "Delivered-To", "X-Original-To", NULL
};

bool casbox_dup_is_trace_field(const unsigned char *name, size_t size)
{
	unsigned int i;

	while (size > 0 && (name[size-1] == ' ' || name[size-1] == '\t'))
		size--;
	for (i = 0; casbox_dup_trace_fields[i] != NULL; i++) {
		if (strlen(casbox_dup_trace_fields[i]) == size &&
		    strncasecmp(casbox_dup_trace_fields[i],
				(const char *)name, size) == 0)
			return TRUE;
	}
	return FALSE;
}

/* Hash the header fields that are not trace fields. A line starting
   with a space or tab continues the field before it. */
static void
casbox_dup_hash_header(struct cas_blob_id_ctx *ctx,
		       const unsigned char *hdr, size_t size)
{
	const unsigned char *nl, *colon;
	size_t pos = 0, end;
	bool skip = FALSE;

	while (pos < size) {
		nl = memchr(hdr + pos, '\n', size - pos);
		end = nl == NULL ? size : (size_t)(nl - hdr) + 1;
		if (hdr[pos] != ' ' && hdr[pos] != '\t') {
			colon = memchr(hdr + pos, ':', end - pos);
			skip = colon != NULL &&
				casbox_dup_is_trace_field(hdr + pos,
							  colon - (hdr + pos));
		}
		if (!skip)
			cas_blob_id_update(ctx, hdr + pos, end - pos);
		pos = end;
	}
}

/* Offset just past the empty line ending the header in data, or 0 if
   not found yet. A message starting with an empty line has no header. */
static size_t casbox_dup_header_end(const unsigned char *data, size_t size)
{
	size_t i;

	if (size >= 1 && data[0] == '\n')
		return 1;
	if (size >= 2 && data[0] == '\r' && data[1] == '\n')
		return 2;
	for (i = 0; i + 1 < size; i++) {
		if (data[i] != '\n')
			continue;
		if (data[i+1] == '\n')
			return i + 2;
		if (i + 2 < size && data[i+1] == '\r' && data[i+2] == '\n')
			return i + 3;
	}
	return 0;
}

int casbox_dup_key_compute(const struct cas_keyring *keyring,
			   struct istream *input,
			   struct casbox_dup_key *key_r, const char **error_r)
{
	struct cas_blob_id_ctx ctx;
	struct cas_blob_id id;
	const unsigned char *data;
	size_t size, hdr_end = 0;
	buffer_t *hdr;
	int ret;

	cas_blob_id_init(keyring, &ctx);
	cas_blob_id_update(&ctx, casbox_dup_domain,
			   sizeof(casbox_dup_domain));
	hdr = t_buffer_create(4096);
	i_stream_seek(input, 0);
	while ((ret = i_stream_read_more(input, &data, &size)) > 0) {
		if (hdr == NULL) {
			cas_blob_id_update(&ctx, data, size);
		} else {
			buffer_append(hdr, data, size);
			hdr_end = casbox_dup_header_end(hdr->data, hdr->used);
			if (hdr_end > 0 ||
			    hdr->used > CASBOX_DUP_MAX_HEADER_SIZE) {
				if (hdr_end > 0) {
					casbox_dup_hash_header(&ctx, hdr->data,
							       hdr_end);
				}
				cas_blob_id_update(&ctx,
					CONST_PTR_OFFSET(hdr->data, hdr_end),
					hdr->used - hdr_end);
				hdr = NULL;
			}
		}
		i_stream_skip(input, size);
	}
	i_assert(ret == -1);
	if (input->stream_errno != 0) {
		*error_r = t_strdup_printf("read(%s) failed: %s",
					   i_stream_get_name(input),
					   i_stream_get_error(input));
		return -1;
	}
	if (hdr != NULL) {
		/* all header, no body */
		casbox_dup_hash_header(&ctx, hdr->data, hdr->used);
	}
	i_stream_seek(input, 0);
	cas_blob_id_final(&ctx, &id);
	i_assert(sizeof(id.id) == sizeof(key_r->key));
	memcpy(key_r->key, id.id, sizeof(key_r->key));
	return 0;
}

void casbox_key_duplicate(buffer_t *key, const guid_128_t mailbox_guid,
			  const struct casbox_dup_key *dup)
{
	buffer_append_c(key, CASBOX_KEY_DUPLICATE);
	buffer_append(key, mailbox_guid, GUID_128_SIZE);
	buffer_append(key, dup->key, sizeof(dup->key));
}

void casbox_key_retained(buffer_t *key, const guid_128_t mailbox_guid,
			 uint32_t uid)
{
	buffer_append_c(key, CASBOX_KEY_RETAINED);
	buffer_append(key, mailbox_guid, GUID_128_SIZE);
	wr_u32(key, uid);
}

int casbox_key_retained_parse(const unsigned char *key, size_t key_size,
			      guid_128_t mailbox_guid_r, uint32_t *uid_r)
{
	if (key_size != 1 + GUID_128_SIZE + 4 ||
	    key[0] != CASBOX_KEY_RETAINED)
		return -1;
	memcpy(mailbox_guid_r, key + 1, GUID_128_SIZE);
	*uid_r = be32_to_cpu_unaligned(key + 1 + GUID_128_SIZE);
	return 1;
}

void casbox_dup_record_export(const struct casbox_dup_record *rec,
			      buffer_t *dest)
{
	wr_u8(dest, CASBOX_SAFETY_RECORD_VERSION);
	wr_u64(dest, (uint64_t)rec->delivered);
	wr_u32(dest, rec->uid);
	wr_str16(dest, rec->guid);
}

int casbox_dup_record_import(const void *data, size_t size, pool_t pool,
			     struct casbox_dup_record *rec_r,
			     const char **error_r)
{
	struct rec_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size)
	};

	i_zero(rec_r);
	rd_version(&rd, CASBOX_SAFETY_RECORD_VERSION);
	rec_r->delivered = (time_t)rd_u64(&rd, "delivered");
	rec_r->uid = rd_u32(&rd, "uid");
	rec_r->guid = rd_str16(&rd, pool, "guid");
	if (rd.error == NULL && rd.p != rd.end)
		rd.error = "trailing bytes";
	if (rd.error == NULL && rec_r->uid == 0)
		rd.error = "uid 0";
	if (rd.error != NULL) {
		*error_r = t_strconcat("dup record: ", rd.error, NULL);
		return -1;
	}
	return 1;
}

void casbox_retained_record_export(const struct casbox_retained_record *rec,
				   buffer_t *dest)
{
	wr_u8(dest, CASBOX_SAFETY_RECORD_VERSION);
	wr_u64(dest, (uint64_t)rec->expunged);
	size_t len_pos, start;

	wr_str16(dest, rec->mailbox_name);
	/* the message record's optional tails make its end ambiguous: a
	   length lets a truncated record fail */
	len_pos = dest->used;
	wr_u32(dest, 0);
	start = dest->used;
	casbox_msg_record_export(&rec->msg, dest);
	cpu32_to_be_unaligned(dest->used - start,
			      buffer_get_space_unsafe(dest, len_pos, 4));
}

int casbox_retained_record_import(const void *data, size_t size,
				  pool_t pool,
				  struct casbox_retained_record *rec_r,
				  const char **error_r)
{
	struct rec_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size)
	};
	uint32_t len;

	i_zero(rec_r);
	rd_version(&rd, CASBOX_SAFETY_RECORD_VERSION);
	rec_r->expunged = (time_t)rd_u64(&rd, "expunged");
	rec_r->mailbox_name = rd_str16(&rd, pool, "mailbox name");
	len = rd_u32(&rd, "message record length");
	if (rd.error == NULL && (size_t)(rd.end - rd.p) != len)
		rd.error = "message record length mismatch";
	if (rd.error != NULL) {
		*error_r = t_strconcat("retained record: ", rd.error, NULL);
		return -1;
	}
	if (casbox_msg_record_import(rd.p, rd.end - rd.p, pool,
				     &rec_r->msg, error_r) < 0) {
		*error_r = t_strconcat("retained record: ", *error_r, NULL);
		return -1;
	}
	return 1;
}

int casbox_store_dup_lookup(struct casbox_store *store,
			    const guid_128_t mailbox_guid,
			    const struct casbox_dup_key *dup, pool_t pool,
			    struct casbox_dup_record *rec_r,
			    const char **error_r)
{
	struct casbox_lsm *lsm = casbox_store_get_lsm(store);
	buffer_t *key = t_buffer_create(64), *value = t_buffer_create(64);
	int ret;

	if (casbox_lsm_refresh(lsm, error_r) < 0)
		return -1;
	casbox_key_duplicate(key, mailbox_guid, dup);
	ret = casbox_lsm_get(lsm, key->data, key->used, value, error_r);
	if (ret <= 0)
		return ret;
	return casbox_dup_record_import(value->data, value->used, pool,
					rec_r, error_r);
}

void casbox_store_txn_dup_put(struct casbox_store_txn *txn,
			      const guid_128_t mailbox_guid,
			      const struct casbox_dup_key *dup,
			      const struct casbox_dup_record *rec)
{
	buffer_t *key = t_buffer_create(64), *value = t_buffer_create(64);

	casbox_key_duplicate(key, mailbox_guid, dup);
	casbox_dup_record_export(rec, value);
	casbox_lsm_batch_put(casbox_store_txn_get_batch(txn),
			     key->data, key->used, value->data, value->used);
}

/* Keys of the records under prefix that select() picks. */
typedef bool casbox_safety_select_t(const unsigned char *key,
				    size_t key_size,
				    const unsigned char *value,
				    size_t value_size, void *context);
static int
casbox_safety_collect(struct casbox_lsm *lsm, const buffer_t *prefix,
		      casbox_safety_select_t *select, void *context,
		      ARRAY_TYPE(casbox_key_buf) *keys, const char **error_r)
{
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	buffer_t *kbuf;

	iter = casbox_lsm_iter_init(lsm, prefix->data, prefix->used);
	while (casbox_lsm_iter_next(iter, &key, &key_size,
				    &value, &value_size)) {
		bool pick;

		T_BEGIN {
			pick = select(key, key_size, value, value_size,
				      context);
		} T_END;
		if (pick) {
			kbuf = t_buffer_create(key_size);
			buffer_append(kbuf, key, key_size);
			array_push_back(keys, &kbuf);
		}
	}
	return casbox_lsm_iter_deinit(&iter, error_r);
}

static bool
casbox_dup_select_from(const unsigned char *key ATTR_UNUSED,
		       size_t key_size ATTR_UNUSED,
		       const unsigned char *value, size_t value_size,
		       void *context)
{
	const uint32_t *first_uid = context;
	struct casbox_dup_record rec;
	const char *error;

	/* a malformed one is released too: it protects nothing */
	return casbox_dup_record_import(value, value_size,
					pool_datastack_create(), &rec,
					&error) < 0 ||
		rec.uid >= *first_uid;
}

int casbox_store_txn_dup_release_from(struct casbox_store_txn *txn,
				      const guid_128_t mailbox_guid,
				      uint32_t first_uid,
				      const char **error_r)
{
	struct casbox_store *store = casbox_store_txn_get_store(txn);
	struct casbox_lsm_batch *batch = casbox_store_txn_get_batch(txn);
	ARRAY_TYPE(casbox_key_buf) keys;
	buffer_t *prefix, *key;

	prefix = t_buffer_create(32);
	buffer_append_c(prefix, CASBOX_KEY_DUPLICATE);
	buffer_append(prefix, mailbox_guid, GUID_128_SIZE);
	t_array_init(&keys, 4);
	if (casbox_safety_collect(casbox_store_get_lsm(store), prefix,
				  casbox_dup_select_from, &first_uid,
				  &keys, error_r) < 0)
		return -1;
	array_foreach_elem(&keys, key)
		casbox_lsm_batch_delete(batch, key->data, key->used);
	return array_count(&keys);
}

int casbox_store_retained_iterate(struct casbox_store *store,
				  casbox_store_retained_callback_t *callback,
				  void *context, const char **error_r)
{
	struct casbox_lsm *lsm = casbox_store_get_lsm(store);
	struct casbox_lsm_iter *iter;
	struct casbox_retained_record rec;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	unsigned char prefix = CASBOX_KEY_RETAINED;
	guid_128_t guid;
	uint32_t uid;
	int ret = 0;

	if (casbox_lsm_refresh(lsm, error_r) < 0)
		return -1;
	iter = casbox_lsm_iter_init(lsm, &prefix, 1);
	while (ret == 0 && casbox_lsm_iter_next(iter, &key, &key_size,
						&value, &value_size)) T_BEGIN {
		if (casbox_key_retained_parse(key, key_size, guid, &uid) < 0)
			;
		else if (casbox_store_retained_value_import(store, key,
				key_size, value, value_size,
				pool_datastack_create(), &rec, error_r) < 0) {
			*error_r = t_strdup_printf("%s uid=%u: %s",
				guid_128_to_string(guid), uid, *error_r);
			ret = -1;
		} else {
			callback(context, guid, uid, &rec);
		}
	} T_END_PASS_STR_IF(ret < 0, error_r);
	if (casbox_lsm_iter_deinit(&iter, error_r) < 0)
		return -1;
	return ret;
}

struct casbox_expire_ctx {
	struct casbox_store *store;
	time_t retained_before, dup_before;
	uint64_t bytes;
};

static bool
casbox_retained_select_expired(const unsigned char *key, size_t key_size,
			       const unsigned char *value, size_t value_size,
			       void *context)
{
	struct casbox_expire_ctx *ctx = context;
	struct casbox_retained_record rec;
	const char *error;

	if (casbox_store_retained_value_import(ctx->store, key, key_size,
					       value, value_size,
					       pool_datastack_create(), &rec,
					       &error) < 0) {
		/* its references are unknown: keep it (scrub reports the
		   refcounts it explains) */
		return FALSE;
	}
	if (rec.expunged >= ctx->retained_before)
		return FALSE;
	ctx->bytes += rec.msg.physical_size;
	return TRUE;
}

static bool
casbox_dup_select_expired(const unsigned char *key ATTR_UNUSED,
			  size_t key_size ATTR_UNUSED,
			  const unsigned char *value, size_t value_size,
			  void *context)
{
	struct casbox_expire_ctx *ctx = context;
	struct casbox_dup_record rec;
	const char *error;

	return casbox_dup_record_import(value, value_size,
					pool_datastack_create(), &rec,
					&error) < 0 ||
		rec.delivered < ctx->dup_before;
}

static int
casbox_store_safety_release(struct casbox_store_txn *txn,
			    const ARRAY_TYPE(casbox_key_buf) *retained,
			    const ARRAY_TYPE(casbox_key_buf) *dups,
			    const char **error_r)
{
	struct casbox_lsm_batch *batch;
	buffer_t *key;
	guid_128_t guid;
	uint32_t uid;
	int ret = 0;

	array_foreach_elem(retained, key) {
		if (casbox_key_retained_parse(key->data, key->used,
					      guid, &uid) < 0)
			i_unreached();
		T_BEGIN {
			if (casbox_store_txn_release_retained(txn, guid, uid,
							      error_r) < 0 ||
			    casbox_store_txn_checkpoint(txn, error_r) < 0)
				ret = -1;
		} T_END_PASS_STR_IF(ret < 0, error_r);
		if (ret < 0)
			return -1;
	}
	/* the checkpoint may have begun a new batch */
	batch = casbox_store_txn_get_batch(txn);
	array_foreach_elem(dups, key)
		casbox_lsm_batch_delete(batch, key->data, key->used);
	return 0;
}

int casbox_store_safety_expire(struct casbox_store *store, time_t now,
			       unsigned int retention,
			       unsigned int duplicate_window,
			       struct casbox_expire_result *result_r,
			       const char **error_r)
{
	struct casbox_expire_ctx ctx;
	struct casbox_store_txn *txn;
	ARRAY_TYPE(casbox_key_buf) retained, dups;
	buffer_t *prefix;
	struct casbox_lsm *lsm = casbox_store_get_lsm(store);

	i_zero(result_r);
	i_zero(&ctx);
	ctx.store = store;
	ctx.retained_before = now - (time_t)retention;
	ctx.dup_before = now - (time_t)duplicate_window;
	if (casbox_store_txn_begin(store, &txn, error_r) < 0)
		return -1;
	t_array_init(&retained, 16);
	t_array_init(&dups, 16);
	prefix = t_buffer_create(1);
	buffer_append_c(prefix, CASBOX_KEY_RETAINED);
	if (casbox_safety_collect(lsm, prefix, casbox_retained_select_expired,
				  &ctx, &retained, error_r) < 0)
		goto failed;
	buffer_set_used_size(prefix, 0);
	buffer_append_c(prefix, CASBOX_KEY_DUPLICATE);
	if (casbox_safety_collect(lsm, prefix, casbox_dup_select_expired,
				  &ctx, &dups, error_r) < 0)
		goto failed;
	if (array_count(&retained) == 0 && array_count(&dups) == 0) {
		casbox_store_txn_rollback(&txn);
		return 0;
	}
	if (casbox_store_safety_release(txn, &retained, &dups, error_r) < 0)
		goto failed;
	if (casbox_store_txn_commit(&txn, error_r) < 0)
		return -1;
	result_r->retained_released = array_count(&retained);
	result_r->retained_bytes_released = ctx.bytes;
	result_r->dups_released = array_count(&dups);
	return 0;
failed:
	casbox_store_txn_rollback(&txn);
	return -1;
}
