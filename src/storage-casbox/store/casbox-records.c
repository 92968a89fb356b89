/* casbox: LSM key/value encoding (see casbox-records.h). */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "byteorder.h"
#include "casbox-records.h"
#include "casbox-record-io.h"

void casbox_key_mailbox(buffer_t *key, const guid_128_t mailbox_guid)
{
	buffer_append_c(key, CASBOX_KEY_MAILBOX);
	buffer_append(key, mailbox_guid, GUID_128_SIZE);
}

void casbox_key_message(buffer_t *key, const guid_128_t mailbox_guid,
			uint32_t uid)
{
	buffer_append_c(key, CASBOX_KEY_MESSAGE);
	buffer_append(key, mailbox_guid, GUID_128_SIZE);
	wr_u32(key, uid);
}

void casbox_key_flags(buffer_t *key, const guid_128_t mailbox_guid,
		      uint32_t uid)
{
	buffer_append_c(key, CASBOX_KEY_FLAGS);
	buffer_append(key, mailbox_guid, GUID_128_SIZE);
	wr_u32(key, uid);
}

void casbox_key_blob(buffer_t *key, const struct cas_blob_id *id)
{
	buffer_append_c(key, CASBOX_KEY_BLOB);
	buffer_append(key, id->id, sizeof(id->id));
}

void casbox_key_meta(buffer_t *key,
		     const unsigned char meta_id[CASBOX_META_ID_SIZE])
{
	buffer_append_c(key, CASBOX_KEY_META);
	buffer_append(key, meta_id, CASBOX_META_ID_SIZE);
}

void casbox_key_meta_refs(buffer_t *key,
			  const unsigned char meta_id[CASBOX_META_ID_SIZE])
{
	buffer_append_c(key, CASBOX_KEY_META_REFS);
	buffer_append(key, meta_id, CASBOX_META_ID_SIZE);
}

void casbox_meta_refs_export(uint32_t refcount, buffer_t *dest)
{
	buffer_append_c(dest, CASBOX_RECORD_VERSION);
	wr_u32(dest, refcount);
}

int casbox_meta_refs_import(const void *data, size_t size,
			    uint32_t *refcount_r, const char **error_r)
{
	struct rec_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size)
	};

	rd_version(&rd, CASBOX_RECORD_VERSION);
	*refcount_r = rd_u32(&rd, "refcount");
	if (rd.error == NULL && *refcount_r == 0)
		rd.error = "zero refcount";
	if (rd.error != NULL) {
		*error_r = t_strconcat("metadata refcount record: ", rd.error,
				       NULL);
		return -1;
	}
	return 1;
}

void casbox_meta_record_export(const void *sealed, size_t sealed_size,
			       buffer_t *dest)
{
	buffer_append_c(dest, CASBOX_RECORD_VERSION);
	buffer_append(dest, sealed, sealed_size);
}

int casbox_meta_record_import(const void *data, size_t size,
			      const unsigned char **sealed_r,
			      size_t *sealed_size_r, const char **error_r)
{
	struct rec_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size)
	};

	rd_version(&rd, CASBOX_RECORD_VERSION);
	if (rd.error == NULL && rd.p == rd.end)
		rd.error = "no sealed metadata";
	if (rd.error != NULL) {
		*error_r = t_strconcat("metadata record: ", rd.error, NULL);
		return -1;
	}
	*sealed_r = rd.p;
	*sealed_size_r = rd.end - rd.p;
	return 1;
}

int casbox_key_message_parse(const unsigned char *key, size_t key_size,
			     guid_128_t mailbox_guid_r, uint32_t *uid_r)
{
	if (key_size != 1 + GUID_128_SIZE + 4 ||
	    key[0] != CASBOX_KEY_MESSAGE)
		return -1;
	memcpy(mailbox_guid_r, key + 1, GUID_128_SIZE);
	*uid_r = be32_to_cpu_unaligned(key + 1 + GUID_128_SIZE);
	return 1;
}

void casbox_msg_record_init(pool_t pool, struct casbox_msg_record *rec_r)
{
	i_zero(rec_r);
	rec_r->guid = "";
	rec_r->pop3_uidl = "";
	p_array_init(&rec_r->keywords, pool, 4);
	p_array_init(&rec_r->parts, pool, 4);
}

void casbox_msg_record_dup_lean(pool_t pool,
				const struct casbox_msg_record *src,
				struct casbox_msg_record *dest_r)
{
	const char *kw;

	*dest_r = *src;
	dest_r->guid = p_strdup(pool, src->guid);
	dest_r->pop3_uidl = p_strdup(pool, src->pop3_uidl);
	p_array_init(&dest_r->keywords, pool,
		     I_MAX(array_count(&src->keywords), 1));
	array_foreach_elem(&src->keywords, kw) {
		kw = p_strdup(pool, kw);
		array_push_back(&dest_r->keywords, &kw);
	}
	p_array_init(&dest_r->parts, pool,
		     I_MAX(array_count(&src->parts), 1));
	array_append_array(&dest_r->parts, &src->parts);
	dest_r->sealed_meta = NULL;
	dest_r->sealed_meta_size = 0;
	dest_r->meta_ref = FALSE;
}

static void
casbox_record_read_keywords(struct rec_reader *rd, pool_t pool,
			    ARRAY_TYPE(const_string) *keywords)
{
	unsigned int i, count;
	const char *kw;

	count = rd_u16(rd, "keyword count");
	for (i = 0; i < count && rd->error == NULL; i++) {
		kw = rd_str16(rd, pool, "keyword");
		if (kw != NULL)
			array_push_back(keywords, &kw);
	}
}

void casbox_flags_record_export(uint32_t flags, uint64_t modseq,
				const char *const *keywords, buffer_t *dest)
{
	unsigned int count = keywords == NULL ? 0 :
		str_array_length(keywords);

	buffer_append_c(dest, CASBOX_RECORD_VERSION);
	wr_u32(dest, flags);
	wr_u64(dest, modseq);
	i_assert(count <= UINT16_MAX);
	wr_u16(dest, count);
	for (; count > 0; count--, keywords++)
		wr_str16(dest, *keywords);
}

int casbox_flags_record_import(const void *data, size_t size, pool_t pool,
			       struct casbox_msg_record *rec,
			       const char **error_r)
{
	struct rec_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size)
	};
	ARRAY_TYPE(const_string) keywords;
	uint32_t flags;
	uint64_t modseq;

	rd_version(&rd, CASBOX_RECORD_VERSION);
	flags = rd_u32(&rd, "flags");
	modseq = rd_u64(&rd, "modseq");
	p_array_init(&keywords, pool, 4);
	casbox_record_read_keywords(&rd, pool, &keywords);
	/* newer minor versions may append more fields: ignore the rest */
	if (rd.error != NULL) {
		*error_r = t_strconcat("flag record: ", rd.error, NULL);
		return -1;
	}
	rec->flags = flags;
	rec->modseq = modseq;
	rec->keywords = keywords;
	return 1;
}

void casbox_msg_record_export(const struct casbox_msg_record *rec,
			      buffer_t *dest)
{
	const struct casbox_msg_part *part;
	const char *kw;
	uint32_t n, i;

	buffer_append_c(dest, CASBOX_RECORD_VERSION);
	wr_u32(dest, rec->flags);
	wr_u64(dest, (uint64_t)rec->received_date);
	wr_u64(dest, (uint64_t)rec->save_date);
	wr_u64(dest, rec->physical_size);
	wr_u64(dest, rec->virtual_size);
	wr_u64(dest, rec->modseq);
	wr_str16(dest, rec->guid);
	i_assert(array_count(&rec->keywords) <= UINT16_MAX);
	wr_u16(dest, array_count(&rec->keywords));
	array_foreach_elem(&rec->keywords, kw)
		wr_str16(dest, kw);
	wr_u32(dest, array_count(&rec->parts));
	array_foreach(&rec->parts, part) {
		buffer_append(dest, part->id.id, sizeof(part->id.id));
		wr_u64(dest, part->size);
	}
	/* optional tail, added after the first layout: POP3 fields */
	wr_str16(dest, rec->pop3_uidl);
	wr_u32(dest, rec->pop3_order);
	/* optional tail, second addition: the sealed metadata */
	i_assert(rec->sealed_meta_size <= UINT32_MAX);
	wr_u32(dest, rec->sealed_meta_size);
	buffer_append(dest, rec->sealed_meta, rec->sealed_meta_size);
	/* optional tail, third addition: part transforms, only when a part
	   has one (records without stay byte for byte as before) or a
	   fourth tail follows */
	n = 0;
	array_foreach(&rec->parts, part) {
		if (part->transform != CASBOX_PART_TRANSFORM_NONE)
			n++;
	}
	if (n == 0 && !rec->meta_ref)
		return;
	wr_u32(dest, n);
	i = 0;
	array_foreach(&rec->parts, part) {
		if (part->transform != CASBOX_PART_TRANSFORM_NONE) {
			i_assert(part->transform ==
				 CASBOX_PART_TRANSFORM_BASE64);
			wr_u32(dest, i);
			wr_u8(dest, part->transform);
			wr_u8(dest, (part->b64.crlf ? 1 : 0) |
			      (part->b64.final_newline ? 2 : 0));
			wr_u16(dest, part->b64.line_len);
			wr_u64(dest, part->stored_size);
		}
		i++;
	}
	/* optional tail, fourth addition (records v2): u8 1 | the id of
	   the shared metadata record */
	if (rec->meta_ref) {
		wr_u8(dest, 1);
		buffer_append(dest, rec->meta_id, sizeof(rec->meta_id));
	}
}

/* Part transforms: u32 count, then per part u32 part index (ascending),
   u8 kind, u8 flags (1 = CRLF, 2 = final line end), u16 line length,
   u64 decoded size. */
static void
casbox_msg_record_read_transforms(struct rec_reader *rd,
				  struct casbox_msg_record *rec)
{
	struct casbox_msg_part *parts, *part;
	unsigned int count;
	uint32_t i, n, idx, prev = 0;
	uint8_t kind, flags;

	parts = array_get_modifiable(&rec->parts, &count);
	n = rd_u32(rd, "transform count");
	if (rd->error == NULL && n > count) {
		rd->error = "more transforms than parts";
		return;
	}
	for (i = 0; i < n && rd->error == NULL; i++) {
		idx = rd_u32(rd, "transform part");
		kind = rd_u8(rd, "transform kind");
		flags = rd_u8(rd, "transform flags");
		if (rd->error != NULL)
			return;
		if (idx >= count || (i > 0 && idx <= prev)) {
			rd->error = "transform part index out of order";
			return;
		}
		prev = idx;
		if (kind != CASBOX_PART_TRANSFORM_BASE64) {
			rd->error = t_strdup_printf(
				"unknown part transform %u", kind);
			return;
		}
		if ((flags & ~3) != 0) {
			rd->error = "unknown transform flags";
			return;
		}
		part = &parts[idx];
		part->transform = kind;
		part->b64.crlf = (flags & 1) != 0;
		part->b64.final_newline = (flags & 2) != 0;
		part->b64.line_len = rd_u16(rd, "line length");
		part->stored_size = rd_u64(rd, "decoded size");
		if (rd->error != NULL)
			return;
		if (!casbox_b64_form_valid(&part->b64) ||
		    part->stored_size == 0 ||
		    part->stored_size > part->size ||
		    casbox_b64_encoded_size(&part->b64, part->stored_size) !=
		    part->size) {
			rd->error = "base64 transform does not give the "
				"part size";
			return;
		}
	}
}

static void
casbox_msg_record_read_parts(struct rec_reader *rd,
			     struct casbox_msg_record *rec)
{
	struct casbox_msg_part *part;
	uoff_t total = 0;
	uint32_t i, count;

	count = rd_u32(rd, "part count");
	/* each part needs 40 bytes: reject absurd counts before
	   allocating */
	if (rd->error == NULL && count > (size_t)(rd->end - rd->p) / 40) {
		rd->error = "part count larger than the record";
		return;
	}
	for (i = 0; i < count && rd->error == NULL; i++) {
		if (!rd_need(rd, CAS_BLOB_ID_SIZE, "part id"))
			return;
		part = array_append_space(&rec->parts);
		memcpy(part->id.id, rd->p, CAS_BLOB_ID_SIZE);
		rd->p += CAS_BLOB_ID_SIZE;
		part->size = rd_u64(rd, "part size");
		total += part->size;
	}
	if (rd->error == NULL && total != rec->physical_size)
		rd->error = "parts do not add up to the physical size";
}

static void
casbox_msg_record_read_meta(struct rec_reader *rd, pool_t pool,
			    struct casbox_msg_record *rec)
{
	uint32_t size = rd_u32(rd, "sealed meta size");

	if (size == 0 || !rd_need(rd, size, "sealed meta"))
		return;
	rec->sealed_meta = p_memdup(pool, rd->p, size);
	rec->sealed_meta_size = size;
	rd->p += size;
}

int casbox_msg_record_import(const void *data, size_t size, pool_t pool,
			     struct casbox_msg_record *rec_r,
			     const char **error_r)
{
	struct rec_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size)
	};

	casbox_msg_record_init(pool, rec_r);
	rd_version(&rd, CASBOX_RECORD_VERSION);
	rec_r->flags = rd_u32(&rd, "flags");
	rec_r->received_date = (time_t)rd_u64(&rd, "received date");
	rec_r->save_date = (time_t)rd_u64(&rd, "save date");
	rec_r->physical_size = rd_u64(&rd, "physical size");
	rec_r->virtual_size = rd_u64(&rd, "virtual size");
	rec_r->modseq = rd_u64(&rd, "modseq");
	rec_r->guid = rd_str16(&rd, pool, "guid");
	casbox_record_read_keywords(&rd, pool, &rec_r->keywords);
	casbox_msg_record_read_parts(&rd, rec_r);
	if (rd.error == NULL && rd.p < rd.end) {
		rec_r->pop3_uidl = rd_str16(&rd, pool, "pop3 uidl");
		rec_r->pop3_order = rd_u32(&rd, "pop3 order");
	}
	if (rd.error == NULL && rd.p < rd.end)
		casbox_msg_record_read_meta(&rd, pool, rec_r);
	if (rd.error == NULL && rd.p < rd.end)
		casbox_msg_record_read_transforms(&rd, rec_r);
	if (rd.error == NULL && rd.p < rd.end &&
	    rd_u8(&rd, "meta ref") == 1 &&
	    rd_need(&rd, CASBOX_META_ID_SIZE, "meta id")) {
		rec_r->meta_ref = TRUE;
		memcpy(rec_r->meta_id, rd.p, CASBOX_META_ID_SIZE);
		rd.p += CASBOX_META_ID_SIZE;
	}
	/* newer minor versions may append more fields: ignore the rest */
	if (rd.error != NULL) {
		*error_r = t_strconcat("message record: ", rd.error, NULL);
		return -1;
	}
	return 1;
}

void casbox_mailbox_record_export(const struct casbox_mailbox_record *rec,
				  buffer_t *dest)
{
	buffer_append_c(dest, CASBOX_RECORD_VERSION);
	wr_u32(dest, rec->uid_validity);
	wr_str16(dest, rec->name);
	/* optional tail */
	wr_u32(dest, rec->next_uid);
	wr_u64(dest, rec->highest_modseq);
	if (!guid_128_is_empty(rec->guid))
		buffer_append(dest, rec->guid, GUID_128_SIZE);
}

int casbox_mailbox_record_import(const void *data, size_t size,
				 pool_t pool,
				 struct casbox_mailbox_record *rec_r,
				 const char **error_r)
{
	struct rec_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size)
	};

	i_zero(rec_r);
	rd_version(&rd, CASBOX_RECORD_VERSION);
	rec_r->uid_validity = rd_u32(&rd, "uid validity");
	rec_r->name = rd_str16(&rd, pool, "name");
	if (rd.error == NULL && rd.p < rd.end)
		rec_r->next_uid = rd_u32(&rd, "next uid");
	if (rd.error == NULL && rd.p < rd.end)
		rec_r->highest_modseq = rd_u64(&rd, "highest modseq");
	if (rd.error == NULL && rd.p < rd.end &&
	    rd_need(&rd, GUID_128_SIZE, "mailbox guid")) {
		memcpy(rec_r->guid, rd.p, GUID_128_SIZE);
		rd.p += GUID_128_SIZE;
	}
	if (rd.error != NULL) {
		*error_r = t_strconcat("mailbox record: ", rd.error, NULL);
		return -1;
	}
	return 1;
}

void casbox_blob_value_export(const struct casbox_blob_value *value,
			      buffer_t *dest)
{
	buffer_append_c(dest, CASBOX_RECORD_VERSION);
	wr_u32(dest, value->refcount);
	buffer_append(dest, value->pack_record, value->pack_record_size);
}

int casbox_blob_value_import(const void *data, size_t size,
			     struct casbox_blob_value *value_r,
			     const char **error_r)
{
	struct rec_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size)
	};

	i_zero(value_r);
	rd_version(&rd, CASBOX_RECORD_VERSION);
	value_r->refcount = rd_u32(&rd, "refcount");
	if (rd.error == NULL && value_r->refcount == 0)
		rd.error = "zero refcount";
	if (rd.error != NULL) {
		*error_r = t_strconcat("blob record: ", rd.error, NULL);
		return -1;
	}
	value_r->pack_record = rd.p;
	value_r->pack_record_size = rd.end - rd.p;
	return 1;
}
