/* WAL codec. Layout (doc/casbox-lsm.md):

   header (24 bytes): "CBXWAL01" | u32 version | u32 crc | u64 file_no
   record: u32 payload_len | u32 masked crc32c(len bytes + payload) |
	   payload
   payload: u64 first_seq | u32 count | count * entry
   entry: u8 type | numpack key_len | key [| numpack value_len | value]

   All integers big-endian. A batch is one record, so it is applied
   whole or not at all. */

#include "lib.h"
#include "buffer.h"
#include "numpack.h"
#include "byteorder.h"
#include "safe-memset.h"
#include "cas-crc32c.h"
#include "casbox-lsm-private.h"

#define WAL_MAGIC "CBXWAL01"
#define WAL_VERSION 1
#define WAL_MAGIC2 "CBXWAL02"
#define WAL_VERSION2 2
#define WAL_PAYLOAD_MIN 12

void casbox_lsm_wal_header_write(buffer_t *buf, uint64_t file_no,
				 uint32_t epoch)
{
	unsigned char hdr[CASBOX_LSM_WAL_HEADER_MAX];
	size_t size = epoch == CASBOX_LSM_EPOCH_PLAINTEXT ?
		CASBOX_LSM_WAL_HEADER_SIZE : CASBOX_LSM_WAL_HEADER2_SIZE;

	memcpy(hdr, size == CASBOX_LSM_WAL_HEADER_SIZE ? WAL_MAGIC :
	       WAL_MAGIC2, 8);
	cpu32_to_be_unaligned(size == CASBOX_LSM_WAL_HEADER_SIZE ?
			      WAL_VERSION : WAL_VERSION2, hdr + 8);
	cpu64_to_be_unaligned(file_no, hdr + 16);
	if (size > CASBOX_LSM_WAL_HEADER_SIZE) {
		cpu32_to_be_unaligned(epoch, hdr + 24);
		cpu32_to_be_unaligned(0, hdr + 28);
	}
	cpu32_to_be_unaligned(0, hdr + 12);
	cpu32_to_be_unaligned(cas_crc32c(hdr, size), hdr + 12);
	buffer_append(buf, hdr, size);
}

int casbox_lsm_wal_header_parse(const unsigned char *data, size_t size,
				uint64_t *file_no_r, uint32_t *epoch_r,
				size_t *header_size_r, const char **error_r)
{
	unsigned char hdr[CASBOX_LSM_WAL_HEADER_MAX];
	size_t hdr_size;
	uint32_t version;

	if (size >= 8 && memcmp(data, WAL_MAGIC, 8) == 0) {
		hdr_size = CASBOX_LSM_WAL_HEADER_SIZE;
		version = WAL_VERSION;
	} else if (size >= 8 && memcmp(data, WAL_MAGIC2, 8) == 0) {
		hdr_size = CASBOX_LSM_WAL_HEADER2_SIZE;
		version = WAL_VERSION2;
	} else if (size < CASBOX_LSM_WAL_HEADER_SIZE) {
		*error_r = "WAL header truncated";
		return -1;
	} else {
		*error_r = "WAL header has bad magic";
		return -1;
	}
	if (size < hdr_size) {
		*error_r = "WAL header truncated";
		return -1;
	}
	memcpy(hdr, data, hdr_size);
	cpu32_to_be_unaligned(0, hdr + 12);
	if (cas_crc32c(hdr, hdr_size) != be32_to_cpu_unaligned(data + 12)) {
		*error_r = "WAL header checksum mismatch";
		return -1;
	}
	if (be32_to_cpu_unaligned(data + 8) != version) {
		*error_r = t_strdup_printf("WAL version %u not supported",
					   be32_to_cpu_unaligned(data + 8));
		return -1;
	}
	*file_no_r = be64_to_cpu_unaligned(data + 16);
	*epoch_r = version == WAL_VERSION ? CASBOX_LSM_EPOCH_PLAINTEXT :
		be32_to_cpu_unaligned(data + 24);
	if (version == WAL_VERSION2 &&
	    *epoch_r == CASBOX_LSM_EPOCH_PLAINTEXT) {
		*error_r = "WAL header has an invalid epoch";
		return -1;
	}
	*header_size_r = hdr_size;
	return 0;
}

void casbox_lsm_wal_entry_encode(buffer_t *entries, enum casbox_lsm_type type,
				 const void *key, size_t key_size,
				 const void *value, size_t value_size)
{
	uint8_t t = type;

	buffer_append(entries, &t, 1);
	numpack_encode(entries, key_size);
	buffer_append(entries, key, key_size);
	if (type == CASBOX_LSM_TYPE_PUT) {
		numpack_encode(entries, value_size);
		buffer_append(entries, value, value_size);
	}
}

void casbox_lsm_wal_record_encode(buffer_t *out, uint64_t first_seq,
				  unsigned int count, const buffer_t *entries)
{
	size_t start = out->used;
	unsigned char *hdr;
	uint32_t crc;

	hdr = buffer_append_space_unsafe(out, CASBOX_LSM_WAL_RECORD_HDR + 12);
	cpu32_to_be_unaligned(12 + entries->used, hdr);
	cpu64_to_be_unaligned(first_seq, hdr + 8);
	cpu32_to_be_unaligned(count, hdr + 16);
	buffer_append_buf(out, entries, 0, SIZE_MAX);

	hdr = buffer_get_modifiable_data(out, NULL);
	hdr += start;
	crc = cas_crc32c(hdr, 4);
	crc = cas_crc32c_update(crc, hdr + 8, 12 + entries->used);
	cpu32_to_be_unaligned(cas_crc32c_mask(crc), hdr + 4);
}

void casbox_lsm_wal_record_encode_sealed(buffer_t *out,
					 const struct casbox_lsm_key *key,
					 uint64_t wal_no, uoff_t offset,
					 uint64_t first_seq, unsigned int count,
					 const buffer_t *entries)
{
	size_t start = out->used;
	unsigned char *hdr, num[12];
	buffer_t *plain;
	uint32_t crc;

	/* on the heap: a long batch loop has no data stack frame per
	   commit; wiped after sealing */
	plain = buffer_create_dynamic(default_pool, 12 + entries->used);
	cpu64_to_be_unaligned(first_seq, num);
	cpu32_to_be_unaligned(count, num + 8);
	buffer_append(plain, num, sizeof(num));
	buffer_append_buf(plain, entries, 0, SIZE_MAX);

	buffer_append_zero(out, CASBOX_LSM_WAL_RECORD_HDR);
	casbox_lsm_seal(key, CASBOX_LSM_SEAL_WAL, wal_no, offset,
			plain->data, plain->used, TRUE, out);
	hdr = buffer_get_modifiable_data(out, NULL);
	hdr += start;
	cpu32_to_be_unaligned(out->used - start - CASBOX_LSM_WAL_RECORD_HDR,
			      hdr);
	crc = cas_crc32c(hdr, 4);
	crc = cas_crc32c_update(crc, hdr + CASBOX_LSM_WAL_RECORD_HDR,
				out->used - start - CASBOX_LSM_WAL_RECORD_HDR);
	cpu32_to_be_unaligned(cas_crc32c_mask(crc), hdr + 4);
	safe_memset(buffer_get_modifiable_data(plain, NULL), 0, plain->used);
	buffer_free(&plain);
}

int casbox_lsm_wal_payload_open(const struct casbox_lsm_key *key,
				uint64_t wal_no, uoff_t offset,
				const unsigned char **payload,
				size_t *payload_size, buffer_t *plain,
				const char **error_r)
{
	const char *error;

	if (key == NULL)
		return 0;
	if (casbox_lsm_unseal(key, CASBOX_LSM_SEAL_WAL, wal_no, offset,
			      *payload, *payload_size, plain, &error) < 0) {
		*error_r = t_strdup_printf("record %s", error);
		return -1;
	}
	*payload = plain->data;
	*payload_size = plain->used;
	return 0;
}

static bool all_zero(const unsigned char *data, size_t size)
{
	size_t i;

	for (i = 0; i < size; i++) {
		if (data[i] != 0)
			return FALSE;
	}
	return TRUE;
}

enum casbox_lsm_wal_status
casbox_lsm_wal_record_parse(const unsigned char *data, size_t size,
			    const unsigned char **payload_r,
			    size_t *payload_size_r, size_t *record_size_r,
			    const char **error_r)
{
	uint32_t len, crc;
	size_t end;

	*error_r = NULL;
	if (size < CASBOX_LSM_WAL_RECORD_HDR)
		return CASBOX_LSM_WAL_END;
	len = be32_to_cpu_unaligned(data);
	if (len < WAL_PAYLOAD_MIN || len > CASBOX_LSM_WAL_MAX_PAYLOAD) {
		/* a zero-filled tail is an extension that never got data */
		if (all_zero(data, size))
			return CASBOX_LSM_WAL_END;
		*error_r = t_strdup_printf("invalid record length %u", len);
		return CASBOX_LSM_WAL_CORRUPT;
	}
	end = CASBOX_LSM_WAL_RECORD_HDR + (size_t)len;
	if (end > size) {
		/* torn tail, or another process is still writing it */
		return CASBOX_LSM_WAL_END;
	}
	crc = cas_crc32c(data, 4);
	crc = cas_crc32c_update(crc, data + CASBOX_LSM_WAL_RECORD_HDR, len);
	if (CASBOX_LSM_CRC_BAD(cas_crc32c_mask(crc),
			       be32_to_cpu_unaligned(data + 4))) {
		if (end == size || all_zero(data + end, size - end))
			return CASBOX_LSM_WAL_END;
		*error_r = "record checksum mismatch";
		return CASBOX_LSM_WAL_CORRUPT;
	}
	*payload_r = data + CASBOX_LSM_WAL_RECORD_HDR;
	*payload_size_r = len;
	*record_size_r = end;
	return CASBOX_LSM_WAL_OK;
}

static int
wal_entries_walk(const unsigned char *p, const unsigned char *end,
		 uint64_t seq, unsigned int count,
		 casbox_lsm_wal_apply_t *apply, void *context,
		 const char **error_r)
{
	uint64_t key_size, value_size;
	const unsigned char *key, *value;
	unsigned int i;
	uint8_t type;

	for (i = 0; i < count; i++) {
		if (p >= end) {
			*error_r = "batch entry count past payload end";
			return -1;
		}
		type = *p++;
		if (type != CASBOX_LSM_TYPE_PUT &&
		    type != CASBOX_LSM_TYPE_DELETE) {
			*error_r = "batch entry has unknown type";
			return -1;
		}
		if (numpack_decode(&p, end, &key_size) < 0 ||
		    key_size > CASBOX_LSM_MAX_KEY_SIZE ||
		    key_size > (size_t)(end - p)) {
			*error_r = "batch entry key size invalid";
			return -1;
		}
		key = p;
		p += key_size;
		value = p;
		value_size = 0;
		if (type == CASBOX_LSM_TYPE_PUT) {
			if (numpack_decode(&p, end, &value_size) < 0 ||
			    value_size > CASBOX_LSM_MAX_VALUE_SIZE ||
			    value_size > (size_t)(end - p)) {
				*error_r = "batch entry value size invalid";
				return -1;
			}
			value = p;
			p += value_size;
		}
		if (apply != NULL) {
			apply(context, seq + i, type, key, key_size,
			      value, value_size);
		}
	}
	if (p != end) {
		*error_r = "batch has trailing bytes";
		return -1;
	}
	return 0;
}

void casbox_lsm_wal_entries_apply(const buffer_t *entries, uint64_t first_seq,
				  unsigned int count,
				  casbox_lsm_wal_apply_t *apply, void *context)
{
	const unsigned char *p = entries->data;
	const char *error;

	if (wal_entries_walk(p, p + entries->used, first_seq, count, apply,
			     context, &error) < 0)
		i_panic("casbox-lsm: own batch does not parse: %s", error);
}

int casbox_lsm_wal_payload_apply(const unsigned char *payload, size_t size,
				 uint64_t *first_seq_r, unsigned int *count_r,
				 casbox_lsm_wal_apply_t *apply, void *context,
				 const char **error_r)
{
	const unsigned char *end = payload + size;
	uint64_t seq;
	uint32_t count;

	if (size < WAL_PAYLOAD_MIN) {
		*error_r = "batch payload too short";
		return -1;
	}
	seq = be64_to_cpu_unaligned(payload);
	count = be32_to_cpu_unaligned(payload + 8);
	if (seq == 0 || count == 0 || seq + count < seq) {
		*error_r = "batch has invalid sequence or count";
		return -1;
	}
	if (wal_entries_walk(payload + 12, end, seq, count, NULL, NULL,
			     error_r) < 0)
		return -1;
	if (apply != NULL) {
		(void)wal_entries_walk(payload + 12, end, seq, count,
				       apply, context, error_r);
	}
	*first_seq_r = seq;
	*count_r = count;
	return 0;
}
