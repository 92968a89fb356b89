/* casidx sealed files; layout in casidx-crypt.h and
   doc/casidx-format.md. */

#include "lib.h"
#include "buffer.h"
#include "cas-key.h"
#include "casidx-crypt.h"

#define CRYPT_HEADER_SIZE 12
#define CRYPT_AAD_DOMAIN "casidx-seg"

static void put_u32(buffer_t *buf, uint32_t v)
{
	unsigned char b[4] = { v & 0xff, (v >> 8) & 0xff,
			       (v >> 16) & 0xff, (v >> 24) & 0xff };
	buffer_append(buf, b, sizeof(b));
}

static buffer_t *crypt_aad(const char *box_guid, const char *file_name,
			   uint32_t version)
{
	buffer_t *aad = t_buffer_create(64);

	buffer_append(aad, CRYPT_AAD_DOMAIN, sizeof(CRYPT_AAD_DOMAIN));
	buffer_append(aad, CASIDX_CRYPT_MAGIC, 8);
	put_u32(aad, version);
	buffer_append(aad, box_guid, strlen(box_guid) + 1);
	buffer_append(aad, file_name, strlen(file_name));
	return aad;
}

void casidx_crypt_seal(const struct cas_keyring *keyring,
		       const char *box_guid, const char *file_name,
		       const void *plain, size_t size, buffer_t *sealed)
{
	T_BEGIN {
		buffer_t *aad = crypt_aad(box_guid, file_name,
					  CASIDX_CRYPT_VERSION);

		buffer_append(sealed, CASIDX_CRYPT_MAGIC, 8);
		put_u32(sealed, CASIDX_CRYPT_VERSION);
		cas_record_seal(keyring, aad->data, aad->used, plain, size,
				sealed);
	} T_END;
}

int casidx_crypt_open(const struct cas_keyring *keyring,
		      const char *box_guid, const char *file_name,
		      const void *data, size_t size, buffer_t *plain,
		      const char **error_r)
{
	const unsigned char *p = data;
	buffer_t *aad;
	const char *error;
	uint32_t version;
	int ret;

	if (size < CASIDX_CRYPT_OVERHEAD ||
	    memcmp(p, CASIDX_CRYPT_MAGIC, 8) != 0) {
		*error_r = "not a sealed casidx file";
		return -1;
	}
	version = p[8] | (p[9] << 8) | (p[10] << 16) |
		((uint32_t)p[11] << 24);
	if (version != CASIDX_CRYPT_VERSION) {
		*error_r = t_strdup_printf(
			"unsupported sealed file version %u", version);
		return -1;
	}
	aad = crypt_aad(box_guid, file_name, version);
	ret = cas_record_open(keyring, aad->data, aad->used,
			      p + CRYPT_HEADER_SIZE, size - CRYPT_HEADER_SIZE,
			      plain, &error);
	if (ret < 0)
		*error_r = "sealed file: authentication failed "
			"(wrong key, moved or tampered)";
	return ret < 0 ? -1 : 1;
}

int casidx_crypt_reseal(const struct cas_keyring *keyring,
			const char *box_guid, const char *file_name,
			const void *data, size_t size, buffer_t *resealed,
			const char **error_r)
{
	const unsigned char *p = data;
	buffer_t *aad;
	const char *error;
	int ret;

	if (size < CASIDX_CRYPT_OVERHEAD ||
	    memcmp(p, CASIDX_CRYPT_MAGIC, 8) != 0 ||
	    (p[8] | (p[9] << 8) | (p[10] << 16) |
	     ((uint32_t)p[11] << 24)) != CASIDX_CRYPT_VERSION) {
		*error_r = "not a sealed casidx file of this version";
		return -1;
	}
	aad = crypt_aad(box_guid, file_name, CASIDX_CRYPT_VERSION);
	buffer_append(resealed, p, CRYPT_HEADER_SIZE);
	ret = cas_record_reseal(keyring, aad->data, aad->used,
				p + CRYPT_HEADER_SIZE,
				size - CRYPT_HEADER_SIZE, resealed, &error);
	if (ret <= 0)
		buffer_set_used_size(resealed, 0);
	if (ret < 0) {
		*error_r = "sealed file: authentication failed "
			"(wrong key, moved or tampered)";
	}
	return ret;
}
