/* Pack, frame and blob record byte layouts: see casbox-frame.h and
   doc/casbox-format.md. */

#include "lib.h"
#include "buffer.h"
#include "byteorder.h"
#include "cas-crc32c.h"
#include "casbox-frame.h"
#include "casbox-pack.h"

#include <sodium.h>

#define CASBOX_PACK_MAGIC "CASBPACK"
#define CASBOX_CHUNK_AAD_MAGIC "CBCK"

static uint32_t casbox_crc(const void *data, size_t size)
{
	return cas_crc32c_mask(cas_crc32c(data, size));
}

void casbox_pack_header_write(uint32_t pack_id,
			      unsigned char dest[CASBOX_PACK_HEADER_SIZE])
{
	memcpy(dest, CASBOX_PACK_MAGIC, 8);
	cpu32_to_le_unaligned(CASBOX_PACK_VERSION, dest + 8);
	cpu32_to_le_unaligned(pack_id, dest + 12);
	cpu32_to_le_unaligned(casbox_crc(dest, 16), dest + 16);
}

int casbox_pack_header_parse(const unsigned char *data, size_t size,
			     uint32_t *pack_id_r, const char **error_r)
{
	uint32_t version;

	if (size < CASBOX_PACK_HEADER_SIZE) {
		*error_r = "pack header truncated";
		return -1;
	}
	if (memcmp(data, CASBOX_PACK_MAGIC, 8) != 0) {
		*error_r = "pack header: bad magic";
		return -1;
	}
	if (le32_to_cpu_unaligned(data + 16) != casbox_crc(data, 16)) {
		*error_r = "pack header: CRC mismatch";
		return -1;
	}
	version = le32_to_cpu_unaligned(data + 8);
	if (version < CASBOX_PACK_VERSION_MIN ||
	    version > CASBOX_PACK_VERSION) {
		*error_r = t_strdup_printf(
			"pack header: unsupported version %u", version);
		return -1;
	}
	*pack_id_r = le32_to_cpu_unaligned(data + 12);
	return 0;
}

uint32_t casbox_frame_chunk_count(uint64_t plain_size)
{
	uint64_t count = (plain_size + CASBOX_CHUNK_SIZE - 1) /
		CASBOX_CHUNK_SIZE;

	if (count == 0)
		return 1;
	return count > UINT32_MAX ? UINT32_MAX : (uint32_t)count;
}

size_t casbox_frame_chunk_plain_size(uint64_t plain_size, uint32_t idx)
{
	uint64_t start = (uint64_t)idx * CASBOX_CHUNK_SIZE;

	i_assert(start <= plain_size);
	return I_MIN(plain_size - start, CASBOX_CHUNK_SIZE);
}

size_t casbox_frame_header_size(uint8_t version)
{
	switch (version) {
	case CASBOX_FRAME_VERSION_V1:
		return CASBOX_FRAME_HEADER_SIZE;
	case CASBOX_FRAME_VERSION_BASE:
		return CASBOX_FRAME_V3_HEADER_SIZE;
	}
	return CASBOX_FRAME_V2_HEADER_SIZE;
}

void casbox_frame_base_mask(const unsigned char subkey[CAS_AEAD_SUBKEY_SIZE],
			    const unsigned char in[CAS_BLOB_ID_SIZE],
			    unsigned char out_r[CAS_BLOB_ID_SIZE])
{
	static const char label[] = "CBBASEID";
	unsigned char pad[CAS_BLOB_ID_SIZE];
	unsigned int i;

	if (crypto_generichash(pad, sizeof(pad), (const void *)label,
			       sizeof(label) - 1, subkey,
			       CAS_AEAD_SUBKEY_SIZE) != 0)
		i_panic("crypto_generichash() failed");
	for (i = 0; i < CAS_BLOB_ID_SIZE; i++)
		out_r[i] = in[i] ^ pad[i];
	sodium_memzero(pad, sizeof(pad));
}

void casbox_frame_base_digest(const void *prefix, size_t size,
			      unsigned char digest_r[CASBOX_BASE_DIGEST_SIZE])
{
	if (crypto_generichash(digest_r, CASBOX_BASE_DIGEST_SIZE, prefix,
			       size, NULL, 0) != 0)
		i_panic("crypto_generichash() failed");
}

uint64_t casbox_padme(uint64_t size)
{
	unsigned int e, s, bits;
	uint64_t mask;

	if (size < 2)
		return size;
	e = 63 - __builtin_clzll(size);		/* floor(log2(size)) */
	s = 32 - __builtin_clz(e);		/* floor(log2(e)) + 1 */
	bits = e - s;
	mask = (1ULL << bits) - 1;
	return (size + mask) & ~mask;
}

int casbox_frame_zstd_window(const unsigned char *data, size_t size,
			     uint64_t *window_r, const char **error_r)
{
	static const unsigned char did_size[] = { 0, 1, 2, 4 };
	static const unsigned char fcs_size[] = { 1, 2, 4, 8 };
	unsigned int fhd, pos, n, i;
	uint64_t value = 0;

	if (size < 6 || le32_to_cpu_unaligned(data) != 0xFD2FB528U) {
		*error_r = "no zstd frame header";
		return -1;
	}
	fhd = data[4];
	if ((fhd & 0x20) == 0) {
		/* window descriptor: exponent 5 bits, mantissa 3 */
		value = 1ULL << (10 + (data[5] >> 3));
		*window_r = value + (value / 8) * (data[5] & 7);
		return 0;
	}
	/* single segment: the window is the content size, always there */
	pos = 5 + did_size[fhd & 3];
	n = fcs_size[fhd >> 6];
	if (pos + n > size) {
		*error_r = "zstd frame header truncated";
		return -1;
	}
	for (i = n; i > 0; i--)
		value = (value << 8) | data[pos + i - 1];
	*window_r = n == 2 ? value + 256 : value;
	return 0;
}

static void
casbox_frame_header_write_v1(const struct casbox_frame_header *hdr,
			     unsigned char dest[CASBOX_FRAME_HEADER_SIZE])
{
	memcpy(dest, CASBOX_FRAME_MAGIC, CASBOX_FRAME_MAGIC_SIZE);
	dest[4] = CASBOX_FRAME_VERSION_V1;
	dest[5] = 0;
	dest[6] = 0;
	dest[7] = 0;
	cpu32_to_le_unaligned(hdr->frame_size, dest + 8);
	cpu32_to_le_unaligned(hdr->dict_id, dest + 12);
	cpu64_to_le_unaligned(hdr->plain_size, dest + 16);
	cpu32_to_le_unaligned(hdr->chunk_count, dest + 24);
	cpu32_to_le_unaligned(hdr->table_crc, dest + 28);
	memcpy(dest + 32, hdr->id.id, CAS_BLOB_ID_SIZE);
	cpu32_to_le_unaligned(casbox_crc(dest, 64), dest + 64);
}

void casbox_frame_header_write(const struct casbox_frame_header *hdr,
			       unsigned char dest[CASBOX_FRAME_HEADER_MAX_SIZE])
{
	if (hdr->version == CASBOX_FRAME_VERSION_V1) {
		/* tests and fixtures only: writers write version 2 */
		casbox_frame_header_write_v1(hdr, dest);
		return;
	}
	i_assert(hdr->cipher != 0 && hdr->cipher <= CAS_AEAD_CIPHER_MAX);
	memcpy(dest, CASBOX_FRAME_MAGIC, CASBOX_FRAME_MAGIC_SIZE);
	dest[4] = hdr->version == CASBOX_FRAME_VERSION_BASE ?
		CASBOX_FRAME_VERSION_BASE : CASBOX_FRAME_VERSION_V2;
	dest[5] = hdr->cipher;
	dest[6] = 0;
	dest[7] = 0;
	cpu32_to_le_unaligned(hdr->frame_size, dest + 8);
	cpu32_to_le_unaligned(hdr->dict_id, dest + 12);
	cpu32_to_le_unaligned(hdr->chunk_count, dest + 16);
	cpu32_to_le_unaligned(hdr->table_crc, dest + 20);
	memcpy(dest + 24, hdr->nonce, CAS_AEAD_FRAME_NONCE_SIZE);
	memcpy(dest + 48, hdr->id.id, CAS_BLOB_ID_SIZE);
	if (dest[4] == CASBOX_FRAME_VERSION_BASE) {
		i_assert(hdr->base_depth >= 1 &&
			 hdr->base_depth <= CASBOX_BASE_MAX_DEPTH);
		i_assert(hdr->dict_id == 0);
		dest[6] = hdr->base_depth;
		memcpy(dest + 80, hdr->base_masked, CAS_BLOB_ID_SIZE);
		cpu32_to_le_unaligned(casbox_crc(dest, 112), dest + 112);
		return;
	}
	cpu32_to_le_unaligned(casbox_crc(dest, 80), dest + 80);
}

static uint32_t casbox_frame_max_stored(uint8_t version)
{
	return version == CASBOX_FRAME_VERSION_V1 ?
		CASBOX_CHUNK_V1_MAX_STORED : CASBOX_CHUNK_MAX_STORED;
}

/* frame_size against chunk_count (and, version 1, chunk_count against
   plain_size) */
static int
casbox_frame_header_check_sizes(const struct casbox_frame_header *hdr,
				const char **error_r)
{
	uint64_t min_size, max_size, hdr_size;

	if (hdr->version == CASBOX_FRAME_VERSION_V1 &&
	    hdr->chunk_count != casbox_frame_chunk_count(hdr->plain_size)) {
		*error_r = t_strdup_printf(
			"frame: chunk_count %u does not match plain_size %"
			PRIu64, hdr->chunk_count, hdr->plain_size);
		return -1;
	}
	if (hdr->chunk_count == 0) {
		*error_r = "frame: chunk_count 0";
		return -1;
	}
	hdr_size = casbox_frame_header_size(hdr->version);
	min_size = hdr_size + (uint64_t)hdr->chunk_count *
		(CASBOX_FRAME_TABLE_ENTRY_SIZE + CASBOX_CHUNK_MIN_STORED);
	max_size = hdr_size + (uint64_t)hdr->chunk_count *
		(CASBOX_FRAME_TABLE_ENTRY_SIZE +
		 casbox_frame_max_stored(hdr->version));
	if (hdr->frame_size < min_size || hdr->frame_size > max_size) {
		*error_r = t_strdup_printf(
			"frame: frame_size %u impossible for %u chunks",
			hdr->frame_size, hdr->chunk_count);
		return -1;
	}
	return 0;
}

bool casbox_frame_size_possible(uint64_t plain_size, uint64_t frame_size)
{
	uint64_t n = casbox_frame_chunk_count(plain_size);

	return frame_size >= CASBOX_FRAME_HEADER_SIZE +
		n * (CASBOX_FRAME_TABLE_ENTRY_SIZE + CASBOX_CHUNK_MIN_STORED) &&
		frame_size <= CASBOX_FRAME_HEADER_MAX_SIZE +
		n * (CASBOX_FRAME_TABLE_ENTRY_SIZE + CASBOX_CHUNK_MAX_STORED);
}

bool casbox_frame_header_matches(const struct casbox_frame_header *hdr,
				 uint32_t frame_size, uint64_t plain_size,
				 uint32_t dict_id)
{
	if (hdr->frame_size != frame_size || hdr->dict_id != dict_id)
		return FALSE;
	if (hdr->version == CASBOX_FRAME_VERSION_V1)
		return hdr->plain_size == plain_size;
	return hdr->chunk_count == casbox_frame_chunk_count(plain_size);
}

static int
casbox_frame_header_parse_v1(const unsigned char *data,
			     struct casbox_frame_header *hdr_r,
			     const char **error_r)
{
	if (le32_to_cpu_unaligned(data + 64) != casbox_crc(data, 64)) {
		*error_r = "frame: header CRC mismatch";
		return -1;
	}
	if (data[5] != 0 || data[6] != 0 || data[7] != 0) {
		*error_r = "frame: unknown flags";
		return -1;
	}
	hdr_r->version = CASBOX_FRAME_VERSION_V1;
	hdr_r->cipher = CAS_AEAD_CIPHER_XCHACHA20POLY1305;
	hdr_r->frame_size = le32_to_cpu_unaligned(data + 8);
	hdr_r->dict_id = le32_to_cpu_unaligned(data + 12);
	hdr_r->plain_size = le64_to_cpu_unaligned(data + 16);
	hdr_r->chunk_count = le32_to_cpu_unaligned(data + 24);
	hdr_r->table_crc = le32_to_cpu_unaligned(data + 28);
	memcpy(hdr_r->id.id, data + 32, CAS_BLOB_ID_SIZE);
	return 0;
}

/* versions 2 and 3 (3 = 2 with a base: depth in byte 6, the masked
   base id after the blob id, the CRC after that) */
static int
casbox_frame_header_parse_v2(const unsigned char *data, size_t size,
			     struct casbox_frame_header *hdr_r,
			     const char **error_r)
{
	bool base = data[4] == CASBOX_FRAME_VERSION_BASE;
	size_t crc_pos = base ? 112 : 80;

	if (size < crc_pos + 4) {
		*error_r = "frame: header truncated";
		return -1;
	}
	if (le32_to_cpu_unaligned(data + crc_pos) !=
	    casbox_crc(data, crc_pos)) {
		*error_r = "frame: header CRC mismatch";
		return -1;
	}
	if (data[5] == CAS_AEAD_CIPHER_AUTO || data[5] > CAS_AEAD_CIPHER_MAX) {
		*error_r = t_strdup_printf("frame: unknown cipher %u",
					   data[5]);
		return -1;
	}
	if ((!base && data[6] != 0) || data[7] != 0) {
		*error_r = "frame: reserved bytes set";
		return -1;
	}
	if (base && (data[6] == 0 || data[6] > CASBOX_BASE_MAX_DEPTH)) {
		*error_r = t_strdup_printf("frame: base depth %u out of "
			"range 1..%u", data[6], CASBOX_BASE_MAX_DEPTH);
		return -1;
	}
	if (base && le32_to_cpu_unaligned(data + 12) != 0) {
		*error_r = "frame: a delta frame with a dictionary";
		return -1;
	}
	if (base) {
		hdr_r->base_depth = data[6];
		memcpy(hdr_r->base_masked, data + 80, CAS_BLOB_ID_SIZE);
	}
	hdr_r->version = data[4];
	hdr_r->cipher = data[5];
	hdr_r->frame_size = le32_to_cpu_unaligned(data + 8);
	hdr_r->dict_id = le32_to_cpu_unaligned(data + 12);
	hdr_r->chunk_count = le32_to_cpu_unaligned(data + 16);
	hdr_r->table_crc = le32_to_cpu_unaligned(data + 20);
	memcpy(hdr_r->nonce, data + 24, CAS_AEAD_FRAME_NONCE_SIZE);
	memcpy(hdr_r->id.id, data + 48, CAS_BLOB_ID_SIZE);
	return 0;
}

int casbox_frame_header_parse(const unsigned char *data, size_t size,
			      struct casbox_frame_header *hdr_r,
			      const char **error_r)
{
	int ret;

	i_zero(hdr_r);
	if (size < CASBOX_FRAME_HEADER_SIZE) {
		*error_r = "frame: header truncated";
		return -1;
	}
	if (memcmp(data, CASBOX_FRAME_MAGIC, CASBOX_FRAME_MAGIC_SIZE) != 0) {
		*error_r = "frame: bad magic";
		return -1;
	}
	if (data[4] == CASBOX_FRAME_VERSION_V1)
		ret = casbox_frame_header_parse_v1(data, hdr_r, error_r);
	else if (data[4] == CASBOX_FRAME_VERSION_V2 ||
		 data[4] == CASBOX_FRAME_VERSION_BASE)
		ret = casbox_frame_header_parse_v2(data, size, hdr_r, error_r);
	else {
		/* the version byte is under the CRC of either version: a
		   flipped one reads as this, which is as clear */
		*error_r = t_strdup_printf("frame: unsupported version %u",
					   data[4]);
		ret = -1;
	}
	if (ret == 0)
		ret = casbox_frame_header_check_sizes(hdr_r, error_r);
	if (ret < 0)
		i_zero(hdr_r);
	return ret;
}

int casbox_frame_table_parse(const struct casbox_frame_header *hdr,
			     const unsigned char *table, size_t size,
			     struct casbox_frame_chunk *chunks_r,
			     const char **error_r)
{
	uint64_t offset = casbox_frame_header_size(hdr->version), table_size;
	uint32_t i;

	table_size = (uint64_t)hdr->chunk_count * CASBOX_FRAME_TABLE_ENTRY_SIZE;
	if (size != table_size) {
		*error_r = "frame: chunk table size mismatch";
		return -1;
	}
	if (casbox_crc(table, size) != hdr->table_crc) {
		*error_r = "frame: chunk table CRC mismatch";
		return -1;
	}
	for (i = 0; i < hdr->chunk_count; i++) {
		const unsigned char *p = table +
			(size_t)i * CASBOX_FRAME_TABLE_ENTRY_SIZE;

		chunks_r[i].stored_size = le32_to_cpu_unaligned(p);
		chunks_r[i].crc = le32_to_cpu_unaligned(p + 4);
		chunks_r[i].offset = offset;
		if (chunks_r[i].stored_size < CASBOX_CHUNK_MIN_STORED ||
		    chunks_r[i].stored_size >
		    casbox_frame_max_stored(hdr->version)) {
			*error_r = t_strdup_printf(
				"frame: chunk %u stored size %u out of range",
				i, chunks_r[i].stored_size);
			return -1;
		}
		if (hdr->version != CASBOX_FRAME_VERSION_V1 &&
		    casbox_padme(chunks_r[i].stored_size - CAS_AEAD_TAG_SIZE) !=
		    chunks_r[i].stored_size - CAS_AEAD_TAG_SIZE) {
			*error_r = t_strdup_printf(
				"frame: chunk %u stored size %u is not padded",
				i, chunks_r[i].stored_size);
			return -1;
		}
		offset += chunks_r[i].stored_size;
	}
	if (offset + table_size != hdr->frame_size) {
		*error_r = "frame: chunks do not fill the frame";
		return -1;
	}
	return 0;
}

void casbox_meta_header_write(const struct casbox_meta_header *hdr,
			      unsigned char dest[CASBOX_META_HEADER_SIZE])
{
	memcpy(dest, CASBOX_META_MAGIC, CASBOX_FRAME_MAGIC_SIZE);
	dest[4] = hdr->version != 0 ? hdr->version : CASBOX_META_VERSION;
	dest[5] = hdr->kind;
	dest[6] = 0;
	dest[7] = 0;
	cpu32_to_le_unaligned(hdr->frame_size, dest + 8);
	cpu32_to_le_unaligned(hdr->body_crc, dest + 12);
	cpu32_to_le_unaligned(casbox_crc(dest, 16), dest + 16);
}

int casbox_meta_header_parse(const unsigned char *data, size_t size,
			     struct casbox_meta_header *hdr_r,
			     const char **error_r)
{
	i_zero(hdr_r);
	if (size < CASBOX_META_HEADER_SIZE) {
		*error_r = "meta frame: header truncated";
		return -1;
	}
	if (memcmp(data, CASBOX_META_MAGIC, CASBOX_FRAME_MAGIC_SIZE) != 0) {
		*error_r = "meta frame: bad magic";
		return -1;
	}
	if (le32_to_cpu_unaligned(data + 16) != casbox_crc(data, 16)) {
		*error_r = "meta frame: header CRC mismatch";
		return -1;
	}
	if (data[4] != CASBOX_META_VERSION &&
	    data[4] != CASBOX_META_VERSION_USERKEY) {
		*error_r = t_strdup_printf(
			"meta frame: unsupported version %u", data[4]);
		return -1;
	}
	if (data[5] == 0 || data[5] > CASBOX_META_KIND_MAX) {
		*error_r = t_strdup_printf("meta frame: unknown kind %u",
					   data[5]);
		return -1;
	}
	if (data[6] != 0 || data[7] != 0) {
		*error_r = "meta frame: reserved bytes set";
		return -1;
	}
	hdr_r->version = data[4];
	hdr_r->kind = data[5];
	hdr_r->frame_size = le32_to_cpu_unaligned(data + 8);
	hdr_r->body_crc = le32_to_cpu_unaligned(data + 12);
	if (hdr_r->frame_size < CASBOX_META_HEADER_SIZE +
	    CASBOX_META_MIN_BODY ||
	    hdr_r->frame_size > CASBOX_META_HEADER_SIZE +
	    CASBOX_META_MAX_BODY) {
		*error_r = t_strdup_printf(
			"meta frame: frame_size %u out of range",
			hdr_r->frame_size);
		return -1;
	}
	return 0;
}

int casbox_meta_body_check(const struct casbox_meta_header *hdr,
			   const unsigned char *body, size_t size,
			   const char **error_r)
{
	if (size != hdr->frame_size - CASBOX_META_HEADER_SIZE) {
		*error_r = "meta frame: body size mismatch";
		return -1;
	}
	if (casbox_crc(body, size) != hdr->body_crc) {
		*error_r = "meta frame: body CRC mismatch";
		return -1;
	}
	return 0;
}

size_t casbox_meta_aad(uint8_t version, enum casbox_meta_kind kind,
		       const unsigned char *locator,
		       unsigned char aad_r[CASBOX_META_AAD_MAX_SIZE])
{
	memcpy(aad_r, CASBOX_META_MAGIC, CASBOX_FRAME_MAGIC_SIZE);
	aad_r[4] = version;
	aad_r[5] = kind;
	if (version == CASBOX_META_VERSION)
		return CASBOX_META_AAD_SIZE;
	memcpy(aad_r + CASBOX_META_AAD_SIZE, locator,
	       CASBOX_META_LOCATOR_SIZE);
	return CASBOX_META_AAD_MAX_SIZE;
}

size_t casbox_frame_chunk_aad(const struct casbox_frame_header *hdr,
			      uint32_t idx, bool last,
			      size_t chunk_plain_size,
			      unsigned char aad_r[CASBOX_CHUNK_AAD_SIZE])
{
	bool v1 = hdr->version == CASBOX_FRAME_VERSION_V1;

	memcpy(aad_r, CASBOX_CHUNK_AAD_MAGIC, 4);
	aad_r[4] = v1 ? CASBOX_FRAME_VERSION_V1 :
		hdr->version == CASBOX_FRAME_VERSION_BASE ?
		CASBOX_FRAME_VERSION_BASE : CASBOX_FRAME_VERSION_V2;
	memcpy(aad_r + 5, hdr->id.id, CAS_BLOB_ID_SIZE);
	cpu32_to_le_unaligned(hdr->dict_id, aad_r + 5 + CAS_BLOB_ID_SIZE);
	cpu32_to_le_unaligned(idx, aad_r + 9 + CAS_BLOB_ID_SIZE);
	aad_r[13 + CAS_BLOB_ID_SIZE] = last ? 1 : 0;
	if (v1)
		return CASBOX_CHUNK_AAD_V1_SIZE;
	aad_r[CASBOX_CHUNK_AAD_V1_SIZE] = hdr->cipher;
	i_assert(chunk_plain_size <= CASBOX_CHUNK_SIZE);
	cpu32_to_le_unaligned(chunk_plain_size,
			      aad_r + CASBOX_CHUNK_AAD_V1_SIZE + 1);
	if (hdr->version != CASBOX_FRAME_VERSION_BASE)
		return CASBOX_CHUNK_AAD_V2_SIZE;
	memcpy(aad_r + CASBOX_CHUNK_AAD_V2_SIZE, hdr->base_id.id,
	       CAS_BLOB_ID_SIZE);
	memcpy(aad_r + CASBOX_CHUNK_AAD_V2_SIZE + CAS_BLOB_ID_SIZE,
	       hdr->base_digest, CASBOX_BASE_DIGEST_SIZE);
	aad_r[CASBOX_CHUNK_AAD_V3_SIZE - 1] = hdr->base_depth;
	return CASBOX_CHUNK_AAD_V3_SIZE;
}

void casbox_frame_chunk_nonce(uint32_t idx,
			      unsigned char nonce_r[CAS_AEAD_NONCE_SIZE])
{
	memset(nonce_r, 0, CAS_AEAD_NONCE_SIZE);
	cpu32_to_le_unaligned(idx, nonce_r);
}

/* bytes a record's base adds: depth and base id (version 3 only) */
static size_t casbox_blob_record_base_size(const struct casbox_blob_record *rec)
{
	return rec->base_depth == 0 ? 0 : 1 + CAS_BLOB_ID_SIZE;
}

size_t casbox_blob_record_export_size(const struct casbox_blob_record *rec)
{
	size_t base = casbox_blob_record_base_size(rec);

	switch (rec->dek_kind) {
	case CAS_DEK_KIND_SERVER_WRAP:
		return CASBOX_BLOB_RECORD_FIXED_SIZE + base + 1 +
			CAS_WRAPPED_DEK_SIZE;
	case CAS_DEK_KIND_SEALED:
		/* the sealed DEK starts with its kind byte */
		return CASBOX_BLOB_RECORD_FIXED_SIZE + base +
			CAS_SEALED_DEK_SIZE;
	}
	i_panic("blob record with invalid DEK kind %u", rec->dek_kind);
}

void casbox_blob_record_export(const struct casbox_blob_record *rec,
			       buffer_t *dest)
{
	size_t size = casbox_blob_record_export_size(rec);
	unsigned char *p = buffer_append_space_unsafe(dest, size);

	i_assert(rec->base_depth <= CASBOX_BASE_MAX_DEPTH);
	/* without a base: version 2, byte for byte what it was */
	p[0] = rec->base_depth == 0 ? CASBOX_BLOB_RECORD_VERSION :
		CASBOX_BLOB_RECORD_VERSION_BASE;
	cpu32_to_le_unaligned(rec->pack_id, p + 1);
	cpu64_to_le_unaligned(rec->offset, p + 5);
	cpu32_to_le_unaligned(rec->frame_size, p + 13);
	cpu64_to_le_unaligned(rec->plain_size, p + 17);
	cpu32_to_le_unaligned(rec->dict_id, p + 25);
	p += CASBOX_BLOB_RECORD_FIXED_SIZE;
	if (rec->base_depth != 0) {
		*p++ = rec->base_depth;
		memcpy(p, rec->base_id.id, CAS_BLOB_ID_SIZE);
		p += CAS_BLOB_ID_SIZE;
	}
	if (rec->dek_kind == CAS_DEK_KIND_SERVER_WRAP) {
		*p++ = CAS_DEK_KIND_SERVER_WRAP;
		memcpy(p, rec->wrapped_dek, CAS_WRAPPED_DEK_SIZE);
	} else {
		i_assert(rec->sealed_dek[0] == CAS_DEK_KIND_SEALED);
		memcpy(p, rec->sealed_dek, CAS_SEALED_DEK_SIZE);
	}
}

static int
casbox_blob_record_import_dek(const unsigned char *p, size_t size,
			      struct casbox_blob_record *rec_r,
			      const char **error_r)
{
	if (p[0] == CASBOX_BLOB_RECORD_VERSION_V1) {
		/* before password mode: always a server-wrapped DEK */
		if (size != CASBOX_BLOB_RECORD_V1_SIZE) {
			*error_r = t_strdup_printf(
				"blob record: version 1 size %zu, "
				"expected %u", size,
				CASBOX_BLOB_RECORD_V1_SIZE);
			return -1;
		}
		rec_r->dek_kind = CAS_DEK_KIND_SERVER_WRAP;
		memcpy(rec_r->wrapped_dek, p + CASBOX_BLOB_RECORD_FIXED_SIZE,
		       CAS_WRAPPED_DEK_SIZE);
		return 0;
	}
	if (p[0] != CASBOX_BLOB_RECORD_VERSION &&
	    p[0] != CASBOX_BLOB_RECORD_VERSION_BASE) {
		*error_r = t_strdup_printf(
			"blob record: unsupported version %u", p[0]);
		return -1;
	}
	if (size <= CASBOX_BLOB_RECORD_FIXED_SIZE) {
		*error_r = t_strdup_printf("blob record: size %zu, "
					   "no DEK", size);
		return -1;
	}
	p += CASBOX_BLOB_RECORD_FIXED_SIZE;
	size -= CASBOX_BLOB_RECORD_FIXED_SIZE;
	if (p[-CASBOX_BLOB_RECORD_FIXED_SIZE] ==
	    CASBOX_BLOB_RECORD_VERSION_BASE) {
		if (size <= 1 + CAS_BLOB_ID_SIZE) {
			*error_r = t_strdup_printf("blob record: version 3 "
				"size %zu, no DEK after the base",
				size + CASBOX_BLOB_RECORD_FIXED_SIZE);
			return -1;
		}
		if (p[0] == 0 || p[0] > CASBOX_BASE_MAX_DEPTH) {
			*error_r = t_strdup_printf("blob record: base depth "
				"%u out of range 1..%u", p[0],
				CASBOX_BASE_MAX_DEPTH);
			return -1;
		}
		rec_r->base_depth = p[0];
		memcpy(rec_r->base_id.id, p + 1, CAS_BLOB_ID_SIZE);
		p += 1 + CAS_BLOB_ID_SIZE;
		size -= 1 + CAS_BLOB_ID_SIZE;
	}
	rec_r->dek_kind = p[0];
	switch (p[0]) {
	case CAS_DEK_KIND_SERVER_WRAP:
		if (size != 1 + CAS_WRAPPED_DEK_SIZE)
			break;
		memcpy(rec_r->wrapped_dek, p + 1, CAS_WRAPPED_DEK_SIZE);
		return 0;
	case CAS_DEK_KIND_SEALED:
		if (size != CAS_SEALED_DEK_SIZE)
			break;
		memcpy(rec_r->sealed_dek, p, CAS_SEALED_DEK_SIZE);
		return 0;
	default:
		*error_r = t_strdup_printf(
			"blob record: unknown DEK kind 0x%02x", p[0]);
		return -1;
	}
	*error_r = t_strdup_printf("blob record: DEK of kind %u has %zu "
				   "bytes, expected %zu", p[0],
				   size - (p[0] == CAS_DEK_KIND_SEALED ? 0 : 1),
				   cas_dek_kind_size(p[0]));
	return -1;
}

int casbox_blob_record_import(const void *data, size_t size,
			      struct casbox_blob_record *rec_r,
			      const char **error_r)
{
	const unsigned char *p = data;

	i_zero(rec_r);
	if (size < CASBOX_BLOB_RECORD_FIXED_SIZE) {
		*error_r = t_strdup_printf(
			"blob record: size %zu, expected at least %u", size,
			CASBOX_BLOB_RECORD_FIXED_SIZE);
		return -1;
	}
	if (casbox_blob_record_import_dek(p, size, rec_r, error_r) < 0) {
		i_zero(rec_r);
		return -1;
	}
	rec_r->pack_id = le32_to_cpu_unaligned(p + 1);
	rec_r->offset = le64_to_cpu_unaligned(p + 5);
	rec_r->frame_size = le32_to_cpu_unaligned(p + 13);
	rec_r->plain_size = le64_to_cpu_unaligned(p + 17);
	rec_r->dict_id = le32_to_cpu_unaligned(p + 25);

	if (rec_r->offset < CASBOX_PACK_HEADER_SIZE) {
		*error_r = "blob record: offset inside the pack header";
		return -1;
	}
	if (rec_r->base_depth != 0 && rec_r->dict_id != 0) {
		*error_r = "blob record: a blob with a base and a dictionary";
		return -1;
	}
	if (!casbox_frame_size_possible(rec_r->plain_size,
					rec_r->frame_size)) {
		*error_r = t_strdup_printf("blob record: frame_size %u "
			"impossible for %"PRIu64" bytes", rec_r->frame_size,
			rec_r->plain_size);
		return -1;
	}
	return 1;
}

void casbox_dek_update_export(const struct casbox_dek_update *upd,
			      buffer_t *dest)
{
	bool sealed = upd->dek_kind == CAS_DEK_KIND_SEALED;
	unsigned char *p = buffer_append_space_unsafe(dest, sealed ?
		CASBOX_DEK_UPDATE_SEALED_SIZE : CASBOX_DEK_UPDATE_SIZE);

	p[0] = sealed ? CASBOX_DEK_UPDATE_VERSION_SEALED :
		CASBOX_DEK_UPDATE_VERSION;
	cpu64_to_le_unaligned(upd->written_usecs, p + 1);
	memcpy(p + 9, upd->id.id, CAS_BLOB_ID_SIZE);
	if (sealed) {
		/* the sealed DEK starts with its kind */
		i_assert(upd->sealed_dek[0] == CAS_DEK_KIND_SEALED);
		memcpy(p + 9 + CAS_BLOB_ID_SIZE, upd->sealed_dek,
		       CAS_SEALED_DEK_SIZE);
		return;
	}
	p[9 + CAS_BLOB_ID_SIZE] = CASBOX_DEK_KIND_WRAPPED;
	memcpy(p + 10 + CAS_BLOB_ID_SIZE, upd->wrapped_dek,
	       CAS_WRAPPED_DEK_SIZE);
}

int casbox_dek_update_import(const void *data, size_t size,
			     struct casbox_dek_update *upd_r,
			     const char **error_r)
{
	const unsigned char *p = data;
	uint8_t kind;
	size_t expected;

	i_zero(upd_r);
	if (size < 1 + 8 + CAS_BLOB_ID_SIZE + 1) {
		*error_r = t_strdup_printf("DEK update: truncated (%zu bytes)",
					   size);
		return -1;
	}
	if (p[0] != CASBOX_DEK_UPDATE_VERSION &&
	    p[0] != CASBOX_DEK_UPDATE_VERSION_SEALED) {
		*error_r = t_strdup_printf("DEK update: unsupported version %u",
					   p[0]);
		return -1;
	}
	/* version 1: server-wrapped DEKs only; 2: sealed DEKs only */
	kind = p[9 + CAS_BLOB_ID_SIZE];
	if (kind != (p[0] == CASBOX_DEK_UPDATE_VERSION ?
		     CASBOX_DEK_KIND_WRAPPED : CAS_DEK_KIND_SEALED)) {
		*error_r = t_strdup_printf("DEK update: unknown DEK kind %u "
					   "in a version %u update", kind,
					   p[0]);
		return -1;
	}
	expected = p[0] == CASBOX_DEK_UPDATE_VERSION ?
		CASBOX_DEK_UPDATE_SIZE : CASBOX_DEK_UPDATE_SEALED_SIZE;
	if (size != expected) {
		*error_r = t_strdup_printf("DEK update: size %zu, expected %zu",
					   size, expected);
		return -1;
	}
	upd_r->written_usecs = le64_to_cpu_unaligned(p + 1);
	memcpy(upd_r->id.id, p + 9, CAS_BLOB_ID_SIZE);
	if (kind == CAS_DEK_KIND_SEALED) {
		upd_r->dek_kind = CAS_DEK_KIND_SEALED;
		memcpy(upd_r->sealed_dek, p + 9 + CAS_BLOB_ID_SIZE,
		       CAS_SEALED_DEK_SIZE);
	} else {
		upd_r->dek_kind = CAS_DEK_KIND_SERVER_WRAP;
		memcpy(upd_r->wrapped_dek, p + 10 + CAS_BLOB_ID_SIZE,
		       CAS_WRAPPED_DEK_SIZE);
	}
	return 1;
}
