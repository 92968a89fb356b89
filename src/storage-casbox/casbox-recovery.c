/* casbox: recovery record encoding (see casbox-recovery.h). */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "byteorder.h"
#include "casbox-pack.h"
#include "casbox-recovery.h"

#define RECOVERY_BLOB_SIZE (CAS_BLOB_ID_SIZE + 4 + 8 + 1 + \
			    CAS_WRAPPED_DEK_SIZE)

struct recovery_reader {
	const unsigned char *p, *end;
	const char *error;
};

static const unsigned char *
rr_take(struct recovery_reader *rd, size_t n, const char *what)
{
	const unsigned char *p = rd->p;

	if (rd->error != NULL)
		return NULL;
	if ((size_t)(rd->end - rd->p) < n) {
		rd->error = t_strdup_printf("truncated at %s", what);
		return NULL;
	}
	rd->p += n;
	return p;
}

static uint64_t rr_uint(struct recovery_reader *rd, size_t n, const char *what)
{
	const unsigned char *p = rr_take(rd, n, what);
	uint64_t v = 0;
	size_t i;

	for (i = 0; p != NULL && i < n; i++)
		v = (v << 8) | p[i];
	return v;
}

static void wr_uint(buffer_t *dest, uint64_t v, size_t n)
{
	unsigned char b[8];
	size_t i;

	for (i = 0; i < n; i++)
		b[i] = v >> (8 * (n - 1 - i));
	buffer_append(dest, b, n);
}

void casbox_recovery_record_export(const struct casbox_recovery_record *rec,
				   buffer_t *dest)
{
	const struct casbox_recovery_blob *blob;
	size_t len_pos, name_len = strlen(rec->mailbox_name);

	i_assert(name_len <= UINT16_MAX);
	i_assert(array_count(&rec->blobs) <= UINT16_MAX);
	wr_uint(dest, CASBOX_RECOVERY_VERSION, 1);
	wr_uint(dest, rec->written_usecs, 8);
	buffer_append(dest, rec->mailbox_guid, GUID_128_SIZE);
	buffer_append(dest, rec->public_guid, GUID_128_SIZE);
	wr_uint(dest, rec->uid_validity, 4);
	wr_uint(dest, rec->uid, 4);
	wr_uint(dest, rec->next_uid, 4);
	wr_uint(dest, rec->highest_modseq, 8);
	wr_uint(dest, name_len, 2);
	buffer_append(dest, rec->mailbox_name, name_len);
	len_pos = dest->used;
	wr_uint(dest, 0, 4);
	casbox_msg_record_export(&rec->msg, dest);
	cpu32_to_be_unaligned(dest->used - len_pos - 4,
			      buffer_get_space_unsafe(dest, len_pos, 4));
	wr_uint(dest, array_count(&rec->blobs), 2);
	array_foreach(&rec->blobs, blob) {
		buffer_append(dest, blob->id.id, CAS_BLOB_ID_SIZE);
		wr_uint(dest, blob->dict_id, 4);
		wr_uint(dest, blob->plain_size, 8);
		wr_uint(dest, CASBOX_DEK_KIND_WRAPPED, 1);
		buffer_append(dest, blob->wrapped_dek, CAS_WRAPPED_DEK_SIZE);
	}
}

static int
casbox_recovery_read_blobs(struct recovery_reader *rd, pool_t pool,
			   struct casbox_recovery_record *rec_r)
{
	struct casbox_recovery_blob *blob;
	const unsigned char *p;
	unsigned int i, count;

	count = rr_uint(rd, 2, "blob count");
	if (rd->error == NULL && (size_t)(rd->end - rd->p) !=
	    (size_t)count * RECOVERY_BLOB_SIZE) {
		rd->error = t_strdup_printf("%u blobs do not fill the "
					    "record", count);
	}
	if (rd->error != NULL)
		return -1;
	p_array_init(&rec_r->blobs, pool, count + 1);
	for (i = 0; i < count; i++) {
		blob = array_append_space(&rec_r->blobs);
		p = rr_take(rd, CAS_BLOB_ID_SIZE, "blob id");
		memcpy(blob->id.id, p, CAS_BLOB_ID_SIZE);
		blob->dict_id = rr_uint(rd, 4, "dict id");
		blob->plain_size = rr_uint(rd, 8, "plain size");
		if (rr_uint(rd, 1, "DEK kind") != CASBOX_DEK_KIND_WRAPPED) {
			rd->error = "unknown DEK kind";
			return -1;
		}
		p = rr_take(rd, CAS_WRAPPED_DEK_SIZE, "wrapped DEK");
		memcpy(blob->wrapped_dek, p, CAS_WRAPPED_DEK_SIZE);
	}
	return 0;
}

int casbox_recovery_record_import(const void *data, size_t size, pool_t pool,
				  struct casbox_recovery_record *rec_r,
				  const char **error_r)
{
	struct recovery_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size),
	};
	const unsigned char *p;
	const char *error;
	size_t len;

	i_zero(rec_r);
	if (rr_uint(&rd, 1, "version") != CASBOX_RECOVERY_VERSION &&
	    rd.error == NULL)
		rd.error = "unsupported version";
	rec_r->written_usecs = rr_uint(&rd, 8, "written");
	if ((p = rr_take(&rd, GUID_128_SIZE, "mailbox guid")) != NULL)
		memcpy(rec_r->mailbox_guid, p, GUID_128_SIZE);
	if ((p = rr_take(&rd, GUID_128_SIZE, "public guid")) != NULL)
		memcpy(rec_r->public_guid, p, GUID_128_SIZE);
	rec_r->uid_validity = rr_uint(&rd, 4, "uidvalidity");
	rec_r->uid = rr_uint(&rd, 4, "uid");
	rec_r->next_uid = rr_uint(&rd, 4, "next uid");
	rec_r->highest_modseq = rr_uint(&rd, 8, "highest modseq");
	len = rr_uint(&rd, 2, "mailbox name length");
	if ((p = rr_take(&rd, len, "mailbox name")) != NULL) {
		if (memchr(p, '\0', len) != NULL)
			rd.error = "NUL in mailbox name";
		else
			rec_r->mailbox_name = p_strndup(pool, p, len);
	}
	len = rr_uint(&rd, 4, "message record length");
	if ((p = rr_take(&rd, len, "message record")) != NULL &&
	    casbox_msg_record_import(p, len, pool, &rec_r->msg,
				     &error) < 0)
		rd.error = t_strconcat("message record: ", error, NULL);
	if (rd.error == NULL && (rec_r->uid == 0 ||
				 rec_r->uid_validity == 0 ||
				 guid_128_is_empty(rec_r->mailbox_guid)))
		rd.error = "zero UID, UIDVALIDITY or mailbox GUID";
	if (rd.error != NULL ||
	    casbox_recovery_read_blobs(&rd, pool, rec_r) < 0) {
		*error_r = t_strconcat("recovery record: ", rd.error, NULL);
		return -1;
	}
	return 1;
}

void casbox_recovery_mailbox_export(const struct casbox_recovery_mailbox *rec,
				    buffer_t *dest)
{
	size_t name_len = strlen(rec->name);

	i_assert(name_len <= UINT16_MAX);
	wr_uint(dest, CASBOX_RECOVERY_VERSION, 1);
	wr_uint(dest, rec->written_usecs, 8);
	buffer_append(dest, rec->mailbox_guid, GUID_128_SIZE);
	buffer_append(dest, rec->public_guid, GUID_128_SIZE);
	wr_uint(dest, rec->uid_validity, 4);
	wr_uint(dest, rec->deleted ? CASBOX_RECOVERY_MAILBOX_DELETED : 0, 1);
	wr_uint(dest, name_len, 2);
	buffer_append(dest, rec->name, name_len);
}

int casbox_recovery_mailbox_import(const void *data, size_t size, pool_t pool,
				   struct casbox_recovery_mailbox *rec_r,
				   const char **error_r)
{
	struct recovery_reader rd = {
		.p = data, .end = CONST_PTR_OFFSET(data, size),
	};
	const unsigned char *p;
	unsigned int flags;
	size_t len;

	i_zero(rec_r);
	if (rr_uint(&rd, 1, "version") != CASBOX_RECOVERY_VERSION &&
	    rd.error == NULL)
		rd.error = "unsupported version";
	rec_r->written_usecs = rr_uint(&rd, 8, "written");
	if ((p = rr_take(&rd, GUID_128_SIZE, "mailbox guid")) != NULL)
		memcpy(rec_r->mailbox_guid, p, GUID_128_SIZE);
	if ((p = rr_take(&rd, GUID_128_SIZE, "public guid")) != NULL)
		memcpy(rec_r->public_guid, p, GUID_128_SIZE);
	rec_r->uid_validity = rr_uint(&rd, 4, "uidvalidity");
	flags = rr_uint(&rd, 1, "flags");
	if (rd.error == NULL &&
	    (flags & ENUM_NEGATE(CASBOX_RECOVERY_MAILBOX_DELETED)) != 0)
		rd.error = "unknown flags";
	rec_r->deleted = (flags & CASBOX_RECOVERY_MAILBOX_DELETED) != 0;
	len = rr_uint(&rd, 2, "mailbox name length");
	if ((p = rr_take(&rd, len, "mailbox name")) != NULL) {
		if (memchr(p, '\0', len) != NULL)
			rd.error = "NUL in mailbox name";
		else
			rec_r->name = p_strndup(pool, p, len);
	}
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
