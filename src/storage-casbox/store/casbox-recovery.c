/* casbox: recovery record encoding (see casbox-recovery.h). */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "byteorder.h"
#include "casbox-pack.h"
#include "casbox-recovery.h"
#include "casbox-record-io.h"
#include "safe-memset.h"

#include <zstd.h>

/* a blob entry before its DEK */
#define RECOVERY_BLOB_FIXED_SIZE (CAS_BLOB_ID_SIZE + 4 + 8)

/* Compressed bodies (copy records, recovery records version 3):
   u32 raw size | one zstd frame that declares that size. Appends them
   to dest and returns TRUE when they are smaller than the raw bytes;
   else appends nothing and returns FALSE. */
static bool
wr_zstd_body(buffer_t *dest, const void *raw, size_t raw_size, int level)
{
	size_t start = dest->used, bound, zsize;
	unsigned char *z;

	i_assert(raw_size <= UINT32_MAX);
	bound = ZSTD_compressBound(raw_size);
	z = buffer_append_space_unsafe(dest, 4 + bound);
	zsize = ZSTD_compress(z + 4, bound, raw, raw_size, level);
	if (ZSTD_isError(zsize) || zsize + 4 >= raw_size) {
		buffer_set_used_size(dest, start);
		return FALSE;
	}
	cpu32_to_be_unaligned(raw_size, z);
	buffer_set_used_size(dest, start + 4 + zsize);
	return TRUE;
}

/* Reads what wr_zstd_body() wrote, which must fill the rest of the
   record: the raw size (min_raw..max_raw, and declared by the frame
   itself before anything is allocated for it), then the frame.
   Returns the raw bytes (i_malloc(); the caller wipes and frees them)
   or NULL with rd->error set. */
static unsigned char *
rd_zstd_body(struct rec_reader *rd, size_t min_raw, size_t max_raw,
	     size_t *raw_size_r)
{
	unsigned char *raw;
	size_t raw_size, zret;

	raw_size = rd_u32(rd, "raw size");
	if (rd->error != NULL)
		return NULL;
	if (raw_size > max_raw || raw_size < min_raw) {
		rd->error = t_strdup_printf("raw size %zu out of range",
					    raw_size);
		return NULL;
	}
	if (ZSTD_getFrameContentSize(rd->p, rd->end - rd->p) != raw_size) {
		rd->error = "compressed body does not declare its size";
		return NULL;
	}
	raw = i_malloc(raw_size);
	zret = ZSTD_decompress(raw, raw_size, rd->p, rd->end - rd->p);
	if (ZSTD_isError(zret) || zret != raw_size) {
		safe_memset(raw, 0, raw_size);
		i_free(raw);
		rd->error = "decompression failed";
		return NULL;
	}
	rd->p = rd->end;
	*raw_size_r = raw_size;
	return raw;
}

/* The fields every recovery record starts with: version, write time,
   mailbox storage GUID, public GUID, UIDVALIDITY. */
static void
write_head(buffer_t *dest, uint8_t version, uint64_t written_usecs,
	   const guid_128_t mailbox_guid, const guid_128_t public_guid,
	   uint32_t uid_validity)
{
	wr_u8(dest, version);
	wr_u64(dest, written_usecs);
	buffer_append(dest, mailbox_guid, GUID_128_SIZE);
	buffer_append(dest, public_guid, GUID_128_SIZE);
	wr_u32(dest, uid_validity);
}

/* Returns the version (1..max_version; 0 with rd->error set else). */
static uint8_t
read_head(struct rec_reader *rd, uint8_t max_version,
	  uint64_t *written_usecs_r,
	  guid_128_t mailbox_guid_r, guid_128_t public_guid_r,
	  uint32_t *uid_validity_r)
{
	const unsigned char *p;
	uint8_t version;

	version = rd_u8(rd, "version");
	if ((version < CASBOX_RECOVERY_VERSION || version > max_version) &&
	    rd->error == NULL) {
		rd->error = t_strdup_printf("unsupported version %u",
					    version);
	}
	*written_usecs_r = rd_u64(rd, "written");
	if ((p = rd_take(rd, GUID_128_SIZE, "mailbox guid")) != NULL)
		memcpy(mailbox_guid_r, p, GUID_128_SIZE);
	if ((p = rd_take(rd, GUID_128_SIZE, "public guid")) != NULL)
		memcpy(public_guid_r, p, GUID_128_SIZE);
	*uid_validity_r = rd_u32(rd, "uidvalidity");
	return rd->error == NULL ? version : 0;
}

/* Version 1 unless a DEK needs version 2: server-mode records stay as
   they were. */
static uint8_t
casbox_recovery_record_version(const struct casbox_recovery_record *rec)
{
	const struct casbox_recovery_blob *blob;

	array_foreach(&rec->blobs, blob) {
		if (blob->dek_kind != CAS_DEK_KIND_SERVER_WRAP)
			return CASBOX_RECOVERY_VERSION_DEK_KIND;
	}
	return CASBOX_RECOVERY_VERSION;
}

void
casbox_recovery_record_export_plain(const struct casbox_recovery_record *rec,
				    buffer_t *dest)
{
	const struct casbox_recovery_blob *blob;
	size_t len_pos;

	i_assert(array_count(&rec->blobs) <= UINT16_MAX);
	write_head(dest, casbox_recovery_record_version(rec),
		   rec->written_usecs, rec->mailbox_guid, rec->public_guid,
		   rec->uid_validity);
	wr_u32(dest, rec->uid);
	wr_u32(dest, rec->next_uid);
	wr_u64(dest, rec->highest_modseq);
	wr_str16(dest, rec->mailbox_name);
	len_pos = dest->used;
	wr_u32(dest, 0);
	casbox_msg_record_export(&rec->msg, dest);
	cpu32_to_be_unaligned(dest->used - len_pos - 4,
			      buffer_get_space_unsafe(dest, len_pos, 4));
	wr_u16(dest, array_count(&rec->blobs));
	array_foreach(&rec->blobs, blob) {
		buffer_append(dest, blob->id.id, CAS_BLOB_ID_SIZE);
		wr_u32(dest, blob->dict_id);
		wr_u64(dest, blob->plain_size);
		if (blob->dek_kind == CAS_DEK_KIND_SERVER_WRAP) {
			wr_u8(dest, CASBOX_DEK_KIND_WRAPPED);
			buffer_append(dest, blob->wrapped_dek,
				      CAS_WRAPPED_DEK_SIZE);
		} else {
			/* the sealed DEK starts with its kind */
			i_assert(blob->dek_kind == CAS_DEK_KIND_SEALED &&
				 blob->sealed_dek[0] == CAS_DEK_KIND_SEALED);
			buffer_append(dest, blob->sealed_dek,
				      CAS_SEALED_DEK_SIZE);
		}
	}
}

static int
casbox_recovery_read_dek(struct rec_reader *rd, uint8_t version,
			 struct casbox_recovery_blob *blob)
{
	const unsigned char *p;
	uint8_t kind;

	kind = rd_u8(rd, "DEK kind");
	if (rd->error != NULL)
		return -1;
	if (kind == CASBOX_DEK_KIND_WRAPPED) {
		p = rd_take(rd, CAS_WRAPPED_DEK_SIZE, "wrapped DEK");
		if (p == NULL)
			return -1;
		blob->dek_kind = CAS_DEK_KIND_SERVER_WRAP;
		memcpy(blob->wrapped_dek, p, CAS_WRAPPED_DEK_SIZE);
		return 0;
	}
	if (kind != CAS_DEK_KIND_SEALED ||
	    version < CASBOX_RECOVERY_VERSION_DEK_KIND) {
		rd->error = t_strdup_printf("unknown DEK kind %u in a "
					    "version %u record", kind,
					    version);
		return -1;
	}
	/* the kind byte is the sealed DEK's byte 0 */
	p = rd_take(rd, CAS_SEALED_DEK_SIZE - 1, "sealed DEK");
	if (p == NULL)
		return -1;
	blob->dek_kind = CAS_DEK_KIND_SEALED;
	blob->sealed_dek[0] = kind;
	memcpy(blob->sealed_dek + 1, p, CAS_SEALED_DEK_SIZE - 1);
	return 0;
}

static int
casbox_recovery_read_blobs(struct rec_reader *rd, uint8_t version,
			   pool_t pool, struct casbox_recovery_record *rec_r)
{
	struct casbox_recovery_blob *blob;
	const unsigned char *p;
	unsigned int i, count;

	count = rd_u16(rd, "blob count");
	/* each entry has at least the fixed part, a kind byte and the
	   smallest DEK: a count the bytes cannot hold is rejected before
	   any allocation */
	if (rd->error == NULL && count > 0 &&
	    (size_t)(rd->end - rd->p) / count <
	    RECOVERY_BLOB_FIXED_SIZE + 1 + CAS_WRAPPED_DEK_SIZE) {
		rd->error = t_strdup_printf("%u blobs do not fit in the "
					    "record", count);
	}
	if (rd->error != NULL)
		return -1;
	p_array_init(&rec_r->blobs, pool, count + 1);
	for (i = 0; i < count; i++) {
		blob = array_append_space(&rec_r->blobs);
		p = rd_take(rd, CAS_BLOB_ID_SIZE, "blob id");
		if (p == NULL)
			return -1;
		memcpy(blob->id.id, p, CAS_BLOB_ID_SIZE);
		blob->dict_id = rd_u32(rd, "dict id");
		blob->plain_size = rd_u64(rd, "plain size");
		if (casbox_recovery_read_dek(rd, version, blob) < 0)
			return -1;
	}
	if (rd->p != rd->end) {
		rd->error = t_strdup_printf("%u blobs do not fill the "
					    "record", count);
		return -1;
	}
	return 0;
}

void casbox_recovery_record_export(const struct casbox_recovery_record *rec,
				   buffer_t *dest)
{
	/* not on the data stack: dest may be there */
	buffer_t *plain = buffer_create_dynamic(default_pool, 1024);
	size_t start = dest->used;

	casbox_recovery_record_export_plain(rec, plain);
	/* the random parts (blob ids, nonces and tags of wrapped DEKs, the
	   GUID) do not compress; the rest does, and each blob id is in the
	   message record and in the blob list */
	wr_u8(dest, CASBOX_RECOVERY_VERSION_ZSTD);
	if (!wr_zstd_body(dest, plain->data, plain->used,
			  CASBOX_RECOVERY_ZSTD_LEVEL)) {
		buffer_set_used_size(dest, start);
		buffer_append_buf(dest, plain, 0, SIZE_MAX);
	}
	safe_memset(buffer_get_modifiable_data(plain, NULL), 0, plain->used);
	buffer_free(&plain);
}

static int
recovery_record_import_plain(const void *data, size_t size, pool_t pool,
			     struct casbox_recovery_record *rec_r,
			     const char **error_r)
{
	struct rec_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size),
	};
	const unsigned char *p;
	const char *error;
	uint8_t version;
	size_t len;

	i_zero(rec_r);
	version = read_head(&rd, CASBOX_RECOVERY_VERSION_DEK_KIND,
			    &rec_r->written_usecs, rec_r->mailbox_guid,
			    rec_r->public_guid, &rec_r->uid_validity);
	rec_r->uid = rd_u32(&rd, "uid");
	rec_r->next_uid = rd_u32(&rd, "next uid");
	rec_r->highest_modseq = rd_u64(&rd, "highest modseq");
	rec_r->mailbox_name = rd_str16(&rd, pool, "mailbox name");
	len = rd_u32(&rd, "message record length");
	if ((p = rd_take(&rd, len, "message record")) != NULL &&
	    casbox_msg_record_import(p, len, pool, &rec_r->msg,
				     &error) < 0)
		rd.error = t_strconcat("message record: ", error, NULL);
	if (rd.error == NULL && (rec_r->uid == 0 ||
				 rec_r->uid_validity == 0 ||
				 guid_128_is_empty(rec_r->mailbox_guid)))
		rd.error = "zero UID, UIDVALIDITY or mailbox GUID";
	if (rd.error != NULL ||
	    casbox_recovery_read_blobs(&rd, version, pool, rec_r) < 0) {
		*error_r = t_strconcat("recovery record: ", rd.error, NULL);
		return -1;
	}
	return 1;
}

int casbox_recovery_record_import(const void *data, size_t size, pool_t pool,
				  struct casbox_recovery_record *rec_r,
				  const char **error_r)
{
	struct rec_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size),
	};
	unsigned char *raw;
	size_t raw_size = 0;
	int ret;

	if (size == 0 || rd.p[0] != CASBOX_RECOVERY_VERSION_ZSTD)
		return recovery_record_import_plain(data, size, pool, rec_r,
						    error_r);
	rd.p++;
	raw = rd_zstd_body(&rd, 1, CASBOX_RECOVERY_MAX_RAW, &raw_size);
	if (raw == NULL) {
		i_zero(rec_r);
		*error_r = t_strconcat("recovery record: ", rd.error, NULL);
		return -1;
	}
	/* a version 1 or 2 record: another version 3 inside is rejected
	   as an unsupported version */
	ret = recovery_record_import_plain(raw, raw_size, pool, rec_r,
					   error_r);
	safe_memset(raw, 0, raw_size);
	i_free(raw);
	return ret;
}

void casbox_recovery_locator_data(const guid_128_t mailbox_guid, uint32_t uid,
				  const char *msg_guid, buffer_t *dest)
{
	buffer_append(dest, mailbox_guid, GUID_128_SIZE);
	wr_u32(dest, uid);
	if (msg_guid != NULL)
		buffer_append(dest, msg_guid, strlen(msg_guid));
}

void casbox_recovery_mailbox_export(const struct casbox_recovery_mailbox *rec,
				    buffer_t *dest)
{
	/* mailbox records hold no DEK: version 1 in both key modes */
	write_head(dest, CASBOX_RECOVERY_VERSION, rec->written_usecs,
		   rec->mailbox_guid, rec->public_guid, rec->uid_validity);
	wr_u8(dest, rec->deleted ? CASBOX_RECOVERY_MAILBOX_DELETED : 0);
	wr_str16(dest, rec->name);
}

int casbox_recovery_mailbox_import(const void *data, size_t size, pool_t pool,
				   struct casbox_recovery_mailbox *rec_r,
				   const char **error_r)
{
	struct rec_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size),
	};
	unsigned int flags;

	i_zero(rec_r);
	(void)read_head(&rd, CASBOX_RECOVERY_VERSION, &rec_r->written_usecs,
			rec_r->mailbox_guid, rec_r->public_guid,
			&rec_r->uid_validity);
	flags = rd_u8(&rd, "flags");
	if (rd.error == NULL &&
	    (flags & ENUM_NEGATE(CASBOX_RECOVERY_MAILBOX_DELETED)) != 0)
		rd.error = "unknown flags";
	rec_r->deleted = (flags & CASBOX_RECOVERY_MAILBOX_DELETED) != 0;
	rec_r->name = rd_str16(&rd, pool, "mailbox name");
	if (rd.error == NULL && rd.p != rd.end)
		rd.error = "trailing bytes";
	if (rd.error == NULL && (guid_128_is_empty(rec_r->mailbox_guid) ||
				 (!rec_r->deleted &&
				  (rec_r->uid_validity == 0 ||
				   rec_r->name[0] == '\0'))))
		rd.error = "empty mailbox GUID, UIDVALIDITY or name";
	if (rd.error != NULL) {
		*error_r = t_strconcat("mailbox recovery record: ", rd.error,
				       NULL);
		return -1;
	}
	return 1;
}

void casbox_blob_keys_export(const struct casbox_blob_keys *rec,
			     buffer_t *dest)
{
	const struct casbox_recovery_blob *blob;

	i_assert(array_count(&rec->blobs) <= UINT16_MAX);
	wr_u8(dest, CASBOX_BLOB_KEYS_VERSION);
	wr_u64(dest, rec->written_usecs);
	wr_u16(dest, array_count(&rec->blobs));
	array_foreach(&rec->blobs, blob) {
		/* gc writes them only where it can open records: server
		   mode, whose DEKs are wrapped */
		i_assert(blob->dek_kind == CAS_DEK_KIND_SERVER_WRAP);
		buffer_append(dest, blob->id.id, CAS_BLOB_ID_SIZE);
		wr_u32(dest, blob->dict_id);
		wr_u64(dest, blob->plain_size);
		wr_u8(dest, CASBOX_DEK_KIND_WRAPPED);
		buffer_append(dest, blob->wrapped_dek, CAS_WRAPPED_DEK_SIZE);
	}
}

int casbox_blob_keys_import(const void *data, size_t size, pool_t pool,
			    struct casbox_blob_keys *rec_r,
			    const char **error_r)
{
	struct rec_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size),
	};
	struct casbox_recovery_record rrec;

	i_zero(rec_r);
	rd_version(&rd, CASBOX_BLOB_KEYS_VERSION);
	rec_r->written_usecs = rd_u64(&rd, "written");
	i_zero(&rrec);
	if (rd.error != NULL ||
	    casbox_recovery_read_blobs(&rd, CASBOX_RECOVERY_VERSION, pool,
				       &rrec) < 0) {
		*error_r = t_strconcat("blob keys record: ", rd.error, NULL);
		return -1;
	}
	if (array_count(&rrec.blobs) == 0) {
		*error_r = "blob keys record: no blob";
		return -1;
	}
	rec_r->blobs = rrec.blobs;
	return 1;
}

void casbox_copy_record_body_init(buffer_t *body)
{
	buffer_set_used_size(body, 0);
	wr_u32(body, 0);
}

void casbox_copy_record_body_add(buffer_t *body, uint32_t uid,
				 const struct casbox_msg_record *msg)
{
	unsigned char *count;
	size_t len_pos;

	i_assert(body->used >= 4);
	wr_u32(body, uid);
	len_pos = body->used;
	wr_u32(body, 0);
	casbox_msg_record_export(msg, body);
	cpu32_to_be_unaligned(body->used - len_pos - 4,
			      buffer_get_space_unsafe(body, len_pos, 4));
	count = buffer_get_space_unsafe(body, 0, 4);
	cpu32_to_be_unaligned(be32_to_cpu_unaligned(count) + 1, count);
}

unsigned int casbox_copy_record_body_count(const buffer_t *body)
{
	return body->used < 4 ? 0 : be32_to_cpu_unaligned(body->data);
}

void casbox_copy_record_export(const struct casbox_copy_record *rec,
			       const buffer_t *body, buffer_t *dest)
{
	size_t start;

	i_assert(body->used <= CASBOX_COPY_RECORD_MAX_RAW);
	write_head(dest, CASBOX_COPY_RECORD_VERSION, rec->written_usecs,
		   rec->mailbox_guid, rec->public_guid, rec->uid_validity);
	wr_u32(dest, rec->next_uid);
	wr_u64(dest, rec->highest_modseq);
	wr_str16(dest, rec->mailbox_name);
	/* many message records of one mailbox: their keys, dates, sizes
	   and field layout repeat */
	start = dest->used;
	wr_u8(dest, 1);
	if (!wr_zstd_body(dest, body->data, body->used, 3)) {
		buffer_set_used_size(dest, start);
		wr_u8(dest, 0);
		buffer_append_buf(dest, body, 0, SIZE_MAX);
	}
}

static int
casbox_copy_record_read_body(struct rec_reader *rd, pool_t pool,
			     struct casbox_copy_record *rec_r)
{
	struct casbox_copy_entry *entry;
	const unsigned char *p;
	const char *error;
	unsigned int i, count;
	size_t len;

	count = rd_u32(rd, "entry count");
	/* an entry is at least a UID and a length */
	if (rd->error == NULL && count > (size_t)(rd->end - rd->p) / 8) {
		rd->error = t_strdup_printf("%u entries do not fit in the "
					    "record", count);
	}
	if (rd->error == NULL && count == 0)
		rd->error = "no entry";
	if (rd->error != NULL)
		return -1;
	p_array_init(&rec_r->entries, pool, count);
	for (i = 0; i < count; i++) {
		entry = array_append_space(&rec_r->entries);
		entry->uid = rd_u32(rd, "uid");
		len = rd_u32(rd, "message record length");
		if ((p = rd_take(rd, len, "message record")) == NULL)
			return -1;
		if (entry->uid == 0) {
			rd->error = "zero UID";
			return -1;
		}
		if (casbox_msg_record_import(p, len, pool, &entry->msg,
					     &error) < 0) {
			rd->error = t_strdup_printf("entry %u: message "
						    "record: %s", i, error);
			return -1;
		}
	}
	if (rd->p != rd->end) {
		rd->error = "trailing bytes";
		return -1;
	}
	return 0;
}

int casbox_copy_record_import(const void *data, size_t size, pool_t pool,
			      struct casbox_copy_record *rec_r,
			      const char **error_r)
{
	struct rec_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size),
	};
	struct rec_reader body_rd;
	unsigned char *raw = NULL;
	uint8_t compression;
	size_t raw_size = 0;
	int ret = 0;

	i_zero(rec_r);
	/* the head of every recovery record (version 1 only) */
	(void)read_head(&rd, CASBOX_COPY_RECORD_VERSION,
			&rec_r->written_usecs, rec_r->mailbox_guid,
			rec_r->public_guid, &rec_r->uid_validity);
	rec_r->next_uid = rd_u32(&rd, "next uid");
	rec_r->highest_modseq = rd_u64(&rd, "highest modseq");
	rec_r->mailbox_name = rd_str16(&rd, pool, "mailbox name");
	compression = rd_u8(&rd, "compression");
	if (rd.error == NULL && (rec_r->uid_validity == 0 ||
				 guid_128_is_empty(rec_r->mailbox_guid)))
		rd.error = "zero UIDVALIDITY or mailbox GUID";
	body_rd = rd;
	if (rd.error == NULL && compression == 1) {
		raw = rd_zstd_body(&rd, 4, CASBOX_COPY_RECORD_MAX_RAW,
				   &raw_size);
		body_rd.p = raw;
		body_rd.end = raw + raw_size;
		body_rd.error = rd.error;
	} else if (rd.error == NULL && compression != 0) {
		rd.error = t_strdup_printf("unknown compression %u",
					   compression);
		body_rd.error = rd.error;
	}
	if (rd.error != NULL ||
	    casbox_copy_record_read_body(&body_rd, pool, rec_r) < 0) {
		*error_r = t_strconcat("copy record: ",
				       rd.error != NULL ? rd.error :
				       body_rd.error, NULL);
		ret = -1;
	}
	if (raw != NULL) {
		safe_memset(raw, 0, raw_size);
		i_free(raw);
	}
	return ret < 0 ? -1 : 1;
}

void casbox_copy_record_entry(const struct casbox_copy_record *rec,
			      const struct casbox_copy_entry *entry,
			      pool_t pool,
			      struct casbox_recovery_record *rrec_r)
{
	i_zero(rrec_r);
	rrec_r->written_usecs = rec->written_usecs;
	guid_128_copy(rrec_r->mailbox_guid, rec->mailbox_guid);
	guid_128_copy(rrec_r->public_guid, rec->public_guid);
	rrec_r->uid_validity = rec->uid_validity;
	rrec_r->uid = entry->uid;
	rrec_r->next_uid = I_MAX(rec->next_uid, entry->uid + 1);
	rrec_r->highest_modseq = rec->highest_modseq;
	rrec_r->mailbox_name = rec->mailbox_name;
	rrec_r->msg = entry->msg;
	p_array_init(&rrec_r->blobs, pool, 1);
}
