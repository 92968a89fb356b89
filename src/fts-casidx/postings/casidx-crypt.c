/* casidx sealed files; layout in casidx-crypt.h and
   doc/casidx-format.md. */

#include "lib.h"
#include "buffer.h"
#include "safe-memset.h"
#include "cas-key.h"
#include "casidx-crypt.h"

#include <stdlib.h>
#include <zstd.h>

#define CRYPT_AAD_DOMAIN "casidx-seg"

static void put_u32(buffer_t *buf, uint32_t v)
{
	unsigned char b[4] = { v & 0xff, (v >> 8) & 0xff,
			       (v >> 16) & 0xff, (v >> 24) & 0xff };
	buffer_append(buf, b, sizeof(b));
}

static void put_u64(buffer_t *buf, uint64_t v)
{
	put_u32(buf, (uint32_t)v);
	put_u32(buf, (uint32_t)(v >> 32));
}

static uint32_t get_u32(const unsigned char *p)
{
	return p[0] | (p[1] << 8) | (p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t get_u64(const unsigned char *p)
{
	return get_u32(p) | ((uint64_t)get_u32(p + 4) << 32);
}

/* The header's size for a version (0 for an unknown one). */
static size_t crypt_header_size(uint32_t version)
{
	switch (version) {
	case CASIDX_CRYPT_VERSION_PLAIN:
		return 12;
	case CASIDX_CRYPT_VERSION:
		return 20;
	}
	return 0;
}

/* The AAD: the file's place and its whole header (magic, version and,
   version 2, the image size). */
static buffer_t *crypt_aad(const char *box_guid, const char *file_name,
			   const unsigned char *header, size_t header_size)
{
	buffer_t *aad = t_buffer_create(64);

	buffer_append(aad, CRYPT_AAD_DOMAIN, sizeof(CRYPT_AAD_DOMAIN));
	buffer_append(aad, header, header_size);
	buffer_append(aad, box_guid, strlen(box_guid) + 1);
	buffer_append(aad, file_name, strlen(file_name));
	return aad;
}

/* The version and header size of a sealed file of file_size bytes
   whose first size bytes are p (at least its header), 0 if it is not
   one of a known version (error_r says which). */
static size_t crypt_header(const unsigned char *p, size_t size,
			   uint64_t file_size, uint32_t *version_r,
			   const char **error_r)
{
	size_t header_size;

	if (size < 12 || memcmp(p, CASIDX_CRYPT_MAGIC, 8) != 0) {
		*error_r = "not a sealed casidx file";
		return 0;
	}
	*version_r = get_u32(p + 8);
	header_size = crypt_header_size(*version_r);
	if (header_size == 0) {
		*error_r = t_strdup_printf(
			"unsupported sealed file version %u", *version_r);
		return 0;
	}
	if (size < header_size ||
	    file_size < header_size + CASIDX_CRYPT_SEAL_OVERHEAD) {
		*error_r = "not a sealed casidx file (truncated)";
		return 0;
	}
	return header_size;
}

buffer_t *casidx_crypt_seal(const struct cas_keyring *keyring,
			    const char *box_guid, const char *file_name,
			    const void *plain, size_t size)
{
	buffer_t *sealed;

	T_BEGIN {
		size_t bound = ZSTD_compressBound(size), zsize;
		unsigned char *z;
		buffer_t *aad;

		i_assert(size <= CASIDX_CRYPT_MAX_IMAGE);
		/* not i_malloc(): zeroing the bound (about the image's
		   size) would make all of it resident, where zstd writes
		   about half; doveadm index's peak is a segment write */
		z = malloc(bound);
		if (z == NULL)
			i_fatal_status(FATAL_OUTOFMEM, "malloc(%zu) failed: %m",
				       bound);
		zsize = ZSTD_compress(z, bound, plain, size,
				      CASIDX_CRYPT_ZSTD_LEVEL);
		if (ZSTD_isError(zsize)) {
			i_panic("casidx: ZSTD_compress() failed: %s",
				ZSTD_getErrorName(zsize));
		}
		sealed = buffer_create_dynamic(default_pool,
					       zsize + CASIDX_CRYPT_OVERHEAD);
		buffer_append(sealed, CASIDX_CRYPT_MAGIC, 8);
		put_u32(sealed, CASIDX_CRYPT_VERSION);
		put_u64(sealed, size);
		aad = crypt_aad(box_guid, file_name, sealed->data,
				sealed->used);
		cas_record_seal(keyring, aad->data, aad->used, z, zsize,
				sealed);
		safe_memset(z, 0, zsize);
		free(z);
	} T_END;
	return sealed;
}

/* The image of an authenticated version-2 plaintext: exactly one zstd
   frame that declares the header's image size (at most
   CASIDX_CRYPT_MAX_IMAGE) and decompresses to exactly that, into a
   buffer of that size (a growing buffer would round a 40 MB image up to
   64 MB and zero-fill it, and a reader keeps it while the segment is
   open). */
static int crypt_decompress(const unsigned char *z, size_t zsize,
			    uint64_t image_size, buffer_t **image_r,
			    const char **error_r)
{
	unsigned long long n = ZSTD_getFrameContentSize(z, zsize);
	buffer_t *image;
	void *dest;
	size_t ret;

	if (n == ZSTD_CONTENTSIZE_UNKNOWN || n == ZSTD_CONTENTSIZE_ERROR ||
	    n != image_size || n > CASIDX_CRYPT_MAX_IMAGE ||
	    ZSTD_findFrameCompressedSize(z, zsize) != zsize) {
		*error_r = "sealed file: compressed image: not one zstd frame "
			"of the header's size within the limit";
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

int casidx_crypt_open_scratch(const struct cas_keyring *keyring,
			      const char *box_guid, const char *file_name,
			      const void *data, size_t size, buffer_t *z,
			      buffer_t **plain_r, const char **error_r)
{
	const unsigned char *p = data;
	size_t header_size;
	buffer_t *aad;
	const char *error;
	uint32_t version;
	int ret;

	*plain_r = NULL;
	if ((header_size = crypt_header(p, size, size, &version,
					 error_r)) == 0)
		return -1;
	if (version == CASIDX_CRYPT_VERSION &&
	    get_u64(p + 12) > CASIDX_CRYPT_MAX_IMAGE) {
		*error_r = "sealed file: image size over the limit";
		return -1;
	}
	aad = crypt_aad(box_guid, file_name, p, header_size);
	buffer_set_used_size(z, 0);
	ret = cas_record_open(keyring, aad->data, aad->used,
			      p + header_size, size - header_size, z, &error);
	if (ret < 0) {
		*error_r = "sealed file: authentication failed "
			"(wrong key, moved or tampered)";
	} else if (version == CASIDX_CRYPT_VERSION_PLAIN) {
		/* the image itself: a copy of exactly its size */
		*plain_r = buffer_create_dynamic(default_pool,
						 I_MAX(z->used, 1));
		buffer_append_buf(*plain_r, z, 0, SIZE_MAX);
	} else {
		ret = crypt_decompress(z->data, z->used, get_u64(p + 12),
				       plain_r, error_r);
	}
	safe_memset(buffer_get_modifiable_data(z, NULL), 0, z->used);
	buffer_set_used_size(z, 0);
	return ret < 0 ? -1 : 1;
}

int casidx_crypt_open(const struct cas_keyring *keyring,
		      const char *box_guid, const char *file_name,
		      const void *data, size_t size, buffer_t **plain_r,
		      const char **error_r)
{
	buffer_t *z;
	int ret;

	/* the file's size: more than the plaintext of either version */
	z = buffer_create_dynamic(default_pool, I_MAX(size, 1));
	ret = casidx_crypt_open_scratch(keyring, box_guid, file_name, data,
					size, z, plain_r, error_r);
	buffer_free(&z);
	return ret;
}

int casidx_crypt_image_size(const void *header, size_t size,
			    uint64_t file_size, uint64_t *image_size_r)
{
	const unsigned char *p = header;
	const char *error;
	size_t header_size;
	uint32_t version;

	header_size = crypt_header(p, size, file_size, &version, &error);
	if (header_size == 0)
		return -1;
	*image_size_r = version == CASIDX_CRYPT_VERSION ? get_u64(p + 12) :
		file_size - header_size - CASIDX_CRYPT_SEAL_OVERHEAD;
	return 0;
}

int casidx_crypt_reseal(const struct cas_keyring *keyring,
			const char *box_guid, const char *file_name,
			const void *data, size_t size, buffer_t *resealed,
			const char **error_r)
{
	const unsigned char *p = data;
	size_t header_size;
	buffer_t *aad;
	const char *error;
	uint32_t version;
	int ret;

	if ((header_size = crypt_header(p, size, size, &version,
					 error_r)) == 0)
		return -1;
	/* the file keeps its version and header: the AAD binds them */
	aad = crypt_aad(box_guid, file_name, p, header_size);
	buffer_append(resealed, p, header_size);
	ret = cas_record_reseal(keyring, aad->data, aad->used,
				p + header_size, size - header_size, resealed,
				&error);
	if (ret <= 0)
		buffer_set_used_size(resealed, 0);
	if (ret < 0) {
		*error_r = "sealed file: authentication failed "
			"(wrong key, moved or tampered)";
	}
	return ret;
}
