/* casidx sealed files; layout in casidx-crypt.h and
   doc/casidx-format.md. */

#include "lib.h"
#include "buffer.h"
#include "safe-memset.h"
#include "cas-key.h"
#include "casidx-crypt.h"

#include <zstd.h>

#define CRYPT_HEADER_SIZE 12
#define CRYPT_AAD_DOMAIN "casidx-seg"

static void put_u32(buffer_t *buf, uint32_t v)
{
	unsigned char b[4] = { v & 0xff, (v >> 8) & 0xff,
			       (v >> 16) & 0xff, (v >> 24) & 0xff };
	buffer_append(buf, b, sizeof(b));
}

static uint32_t get_u32(const unsigned char *p)
{
	return p[0] | (p[1] << 8) | (p[2] << 16) | ((uint32_t)p[3] << 24);
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
		size_t bound = ZSTD_compressBound(size), zsize;
		unsigned char *z;

		i_assert(size <= CASIDX_CRYPT_MAX_IMAGE);
		z = i_malloc(bound);
		zsize = ZSTD_compress(z, bound, plain, size,
				      CASIDX_CRYPT_ZSTD_LEVEL);
		if (ZSTD_isError(zsize)) {
			i_panic("casidx: ZSTD_compress() failed: %s",
				ZSTD_getErrorName(zsize));
		}
		buffer_append(sealed, CASIDX_CRYPT_MAGIC, 8);
		put_u32(sealed, CASIDX_CRYPT_VERSION);
		cas_record_seal(keyring, aad->data, aad->used, z, zsize,
				sealed);
		safe_memset(z, 0, zsize);
		i_free(z);
	} T_END;
}

/* The image of an authenticated version-2 plaintext: exactly one zstd
   frame that declares its size, at most CASIDX_CRYPT_MAX_IMAGE, and
   decompresses to exactly that. *image_r is allocated to that size (a
   growing buffer would round it up to a power of two, and a reader
   keeps the image for as long as the segment is open). */
static int crypt_decompress(const unsigned char *z, size_t zsize,
			    buffer_t **image_r, const char **error_r)
{
	unsigned long long n = ZSTD_getFrameContentSize(z, zsize);
	buffer_t *image;
	void *dest;
	size_t ret;

	if (n == ZSTD_CONTENTSIZE_UNKNOWN || n == ZSTD_CONTENTSIZE_ERROR ||
	    n > CASIDX_CRYPT_MAX_IMAGE ||
	    ZSTD_findFrameCompressedSize(z, zsize) != zsize) {
		*error_r = "sealed file: compressed image: not one zstd frame "
			"of a declared size within the limit";
		return -1;
	}
	image = buffer_create_dynamic(default_pool, I_MAX(n, 1));
	dest = buffer_append_space_unsafe(image, n);
	ret = ZSTD_decompress(dest, n, z, zsize);
	if (ZSTD_isError(ret) || ret != n) {
		safe_memset(dest, 0, n);
		buffer_free(&image);
		*error_r = t_strdup_printf(
			"sealed file: compressed image: %s",
			ZSTD_isError(ret) ? ZSTD_getErrorName(ret) :
			"shorter than declared");
		return -1;
	}
	*image_r = image;
	return 0;
}

int casidx_crypt_open(const struct cas_keyring *keyring,
		      const char *box_guid, const char *file_name,
		      const void *data, size_t size, buffer_t **plain_r,
		      const char **error_r)
{
	const unsigned char *p = data;
	buffer_t *aad, *z;
	const char *error;
	uint32_t version;
	int ret;

	*plain_r = NULL;
	if (size < CASIDX_CRYPT_OVERHEAD ||
	    memcmp(p, CASIDX_CRYPT_MAGIC, 8) != 0) {
		*error_r = "not a sealed casidx file";
		return -1;
	}
	version = get_u32(p + 8);
	if (version != CASIDX_CRYPT_VERSION &&
	    version != CASIDX_CRYPT_VERSION_PLAIN) {
		*error_r = t_strdup_printf(
			"unsupported sealed file version %u", version);
		return -1;
	}
	aad = crypt_aad(box_guid, file_name, version);
	z = buffer_create_dynamic(default_pool,
				  size - CASIDX_CRYPT_OVERHEAD + 1);
	ret = cas_record_open(keyring, aad->data, aad->used,
			      p + CRYPT_HEADER_SIZE, size - CRYPT_HEADER_SIZE,
			      z, &error);
	if (ret < 0) {
		*error_r = "sealed file: authentication failed "
			"(wrong key, moved or tampered)";
	} else if (version == CASIDX_CRYPT_VERSION_PLAIN) {
		*plain_r = z;
		return 1;
	} else {
		ret = crypt_decompress(z->data, z->used, plain_r, error_r);
	}
	safe_memset(buffer_get_modifiable_data(z, NULL), 0, z->used);
	buffer_free(&z);
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
	uint32_t version;
	int ret;

	if (size < CASIDX_CRYPT_OVERHEAD ||
	    memcmp(p, CASIDX_CRYPT_MAGIC, 8) != 0 ||
	    ((version = get_u32(p + 8)) != CASIDX_CRYPT_VERSION &&
	     version != CASIDX_CRYPT_VERSION_PLAIN)) {
		*error_r = "not a sealed casidx file of a known version";
		return -1;
	}
	/* the file keeps its version: the AAD binds it */
	aad = crypt_aad(box_guid, file_name, version);
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
