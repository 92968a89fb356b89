/* Key file layout (doc/casbox-format.md, "Key file"):

     0   7  magic "CASKEY1"
     7   1  version (1)
     8  32  KEK
    40  32  BLAKE2b-256 of bytes 0..39
   = 72 bytes, mode 0600 */

#include "lib.h"
#include "buffer.h"
#include "hex-binary.h"
#include "write-full.h"
#include "cas-key.h"

#include <sodium.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#define CAS_KEY_FILE_MAGIC "CASKEY1"
#define CAS_KEY_FILE_MAGIC_SIZE 7
#define CAS_KEY_FILE_VERSION 1
#define CAS_KEY_FILE_CHECK_OFFSET (CAS_KEY_FILE_MAGIC_SIZE + 1 + CAS_KEK_SIZE)
#define CAS_KEY_FILE_SIZE (CAS_KEY_FILE_CHECK_OFFSET + 32)

/* crypto_kdf context (8 bytes) and sub-key ids */
#define CAS_KDF_CONTEXT "CASBOXK1"
enum cas_kdf_subkey {
	CAS_KDF_WRAP = 1,
	CAS_KDF_BLOB_ID = 2,
	CAS_KDF_INDEX = 3,
	CAS_KDF_KEY_ID = 4,
};

#define CAS_DEK_AAD_MAGIC "CASDEK1"
#define CAS_DEK_AAD_SIZE (7 + 4 + CAS_BLOB_ID_SIZE)

struct cas_keyring_secrets {
	unsigned char wrap[CAS_KEK_SIZE];
	unsigned char blob_id[CAS_KEK_SIZE];
	unsigned char index[CAS_KEK_SIZE];
};

struct cas_keyring {
	struct cas_keyring_secrets *secrets; /* sodium_malloc()ed, read-only */
	uint32_t key_id;
};

static void cas_sodium_init(void)
{
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
}

static void
cas_key_file_check(const unsigned char *file, unsigned char check_r[32])
{
	crypto_generichash(check_r, 32, file, CAS_KEY_FILE_CHECK_OFFSET,
			   NULL, 0);
}

static struct cas_keyring *cas_keyring_from_kek(const unsigned char *kek)
{
	struct cas_keyring *keyring;
	unsigned char key_id[crypto_kdf_BYTES_MIN];

	keyring = i_new(struct cas_keyring, 1);
	keyring->secrets = sodium_malloc(sizeof(*keyring->secrets));
	if (keyring->secrets == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "sodium_malloc() failed: %m");
	crypto_kdf_derive_from_key(keyring->secrets->wrap, CAS_KEK_SIZE,
				   CAS_KDF_WRAP, CAS_KDF_CONTEXT, kek);
	crypto_kdf_derive_from_key(keyring->secrets->blob_id, CAS_KEK_SIZE,
				   CAS_KDF_BLOB_ID, CAS_KDF_CONTEXT, kek);
	crypto_kdf_derive_from_key(keyring->secrets->index, CAS_KEK_SIZE,
				   CAS_KDF_INDEX, CAS_KDF_CONTEXT, kek);
	crypto_kdf_derive_from_key(key_id, sizeof(key_id),
				   CAS_KDF_KEY_ID, CAS_KDF_CONTEXT, kek);
	keyring->key_id = ((uint32_t)key_id[0] << 24) |
		((uint32_t)key_id[1] << 16) | ((uint32_t)key_id[2] << 8) |
		key_id[3];
	sodium_mprotect_readonly(keyring->secrets);
	return keyring;
}

struct cas_keyring *
cas_keyring_create_from_kek(const unsigned char kek[CAS_KEK_SIZE])
{
	cas_sodium_init();
	return cas_keyring_from_kek(kek);
}

/* Parse a key file image. Returns 1 ok, -1 with reason (no key bytes). */
int cas_key_file_parse(const void *data, size_t size,
		       struct cas_keyring **keyring_r, const char **error_r)
{
	const unsigned char *file = data;
	unsigned char check[32];

	*keyring_r = NULL;
	cas_sodium_init();
	if (size != CAS_KEY_FILE_SIZE) {
		*error_r = t_strdup_printf("size %zu, expected %u",
					   size, CAS_KEY_FILE_SIZE);
		return -1;
	}
	if (memcmp(file, CAS_KEY_FILE_MAGIC, CAS_KEY_FILE_MAGIC_SIZE) != 0) {
		*error_r = "bad magic (not a casbox key file)";
		return -1;
	}
	if (file[CAS_KEY_FILE_MAGIC_SIZE] != CAS_KEY_FILE_VERSION) {
		*error_r = t_strdup_printf("unsupported version %u",
					   file[CAS_KEY_FILE_MAGIC_SIZE]);
		return -1;
	}
	cas_key_file_check(file, check);
	if (sodium_memcmp(check, file + CAS_KEY_FILE_CHECK_OFFSET,
			  sizeof(check)) != 0) {
		*error_r = "checksum mismatch (file damaged)";
		return -1;
	}
	*keyring_r = cas_keyring_from_kek(file + CAS_KEY_FILE_MAGIC_SIZE + 1);
	return 1;
}

int cas_keyring_load(const char *path, struct cas_keyring **keyring_r,
		     const char **error_r)
{
	unsigned char *file;
	const char *error;
	struct stat st;
	ssize_t ret;
	int fd, result;

	*keyring_r = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd == -1) {
		if (errno == ENOENT)
			return 0;
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	if (fstat(fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", path);
		i_close_fd(&fd);
		return -1;
	}
	if (!S_ISREG(st.st_mode) || st.st_size != CAS_KEY_FILE_SIZE) {
		*error_r = t_strdup_printf(
			"Key file %s is damaged: size %lld, expected %u",
			path, (long long)st.st_size, CAS_KEY_FILE_SIZE);
		i_close_fd(&fd);
		return -1;
	}
	file = sodium_malloc(CAS_KEY_FILE_SIZE + 1);
	if (file == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "sodium_malloc() failed: %m");
	/* read one byte more than expected to notice a file that grew */
	ret = pread(fd, file, CAS_KEY_FILE_SIZE + 1, 0);
	if (ret < 0) {
		*error_r = t_strdup_printf("read(%s) failed: %m", path);
		result = -1;
	} else if (cas_key_file_parse(file, (size_t)ret, keyring_r,
				      &error) < 0) {
		*error_r = t_strdup_printf("Key file %s is damaged: %s",
					   path, error);
		result = -1;
	} else {
		result = 1;
	}
	sodium_free(file);
	i_close_fd(&fd);
	return result;
}

static int fsync_parent_dir(const char *path, const char **error_r)
{
	const char *p = strrchr(path, '/');
	const char *dir = p == NULL ? "." :
		p == path ? "/" : t_strdup_until(path, p);
	int fd, ret = 0;

	fd = open(dir, O_RDONLY | O_CLOEXEC);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", dir);
		return -1;
	}
	if (fsync(fd) < 0) {
		*error_r = t_strdup_printf("fsync(%s) failed: %m", dir);
		ret = -1;
	}
	i_close_fd(&fd);
	return ret;
}

int cas_keyring_create(const char *path, struct cas_keyring **keyring_r,
		       const char **error_r)
{
	unsigned char *file;
	int fd, ret = -1;

	*keyring_r = NULL;
	cas_sodium_init();
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s, O_EXCL) failed: %m",
					   path);
		return -1;
	}
	file = sodium_malloc(CAS_KEY_FILE_SIZE);
	if (file == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "sodium_malloc() failed: %m");
	memcpy(file, CAS_KEY_FILE_MAGIC, CAS_KEY_FILE_MAGIC_SIZE);
	file[CAS_KEY_FILE_MAGIC_SIZE] = CAS_KEY_FILE_VERSION;
	randombytes_buf(file + CAS_KEY_FILE_MAGIC_SIZE + 1, CAS_KEK_SIZE);
	cas_key_file_check(file, file + CAS_KEY_FILE_CHECK_OFFSET);

	if (write_full(fd, file, CAS_KEY_FILE_SIZE) < 0)
		*error_r = t_strdup_printf("write(%s) failed: %m", path);
	else if (fsync(fd) < 0)
		*error_r = t_strdup_printf("fsync(%s) failed: %m", path);
	else if (fsync_parent_dir(path, error_r) == 0)
		ret = 1;
	if (close(fd) < 0 && ret == 1) {
		*error_r = t_strdup_printf("close(%s) failed: %m", path);
		ret = -1;
	}
	if (ret < 0) {
		/* never leave a half-written key file behind */
		i_unlink_if_exists(path);
	} else {
		*keyring_r = cas_keyring_from_kek(file +
						  CAS_KEY_FILE_MAGIC_SIZE + 1);
	}
	sodium_free(file);
	return ret;
}

void cas_keyring_free(struct cas_keyring **_keyring)
{
	struct cas_keyring *keyring = *_keyring;

	if (keyring == NULL)
		return;
	*_keyring = NULL;
	/* sodium_free() wipes the memory */
	sodium_free(keyring->secrets);
	i_free(keyring);
}

uint32_t cas_keyring_key_id(const struct cas_keyring *keyring)
{
	return keyring->key_id;
}

void cas_blob_id_init(const struct cas_keyring *keyring,
		      struct cas_blob_id_ctx *ctx)
{
	i_assert(crypto_generichash_statebytes() <= sizeof(ctx->state));
	crypto_generichash_init((crypto_generichash_state *)ctx->state,
				keyring->secrets->blob_id, CAS_KEK_SIZE,
				CAS_BLOB_ID_SIZE);
}

void cas_blob_id_update(struct cas_blob_id_ctx *ctx, const void *data,
			size_t size)
{
	crypto_generichash_update((crypto_generichash_state *)ctx->state,
				  data, size);
}

void cas_blob_id_final(struct cas_blob_id_ctx *ctx, struct cas_blob_id *id_r)
{
	crypto_generichash_final((crypto_generichash_state *)ctx->state,
				 id_r->id, CAS_BLOB_ID_SIZE);
	/* the state holds the keyed chaining value */
	sodium_memzero(ctx->state, sizeof(ctx->state));
}

void cas_blob_id_compute(const struct cas_keyring *keyring, const void *data,
			 size_t size, struct cas_blob_id *id_r)
{
	struct cas_blob_id_ctx ctx;

	cas_blob_id_init(keyring, &ctx);
	cas_blob_id_update(&ctx, data, size);
	cas_blob_id_final(&ctx, id_r);
}

const char *cas_blob_id_to_hex(const struct cas_blob_id *id)
{
	return binary_to_hex(id->id, sizeof(id->id));
}

int cas_blob_id_from_hex(const char *hex, struct cas_blob_id *id_r)
{
	buffer_t buf;
	size_t i;

	if (strlen(hex) != CAS_BLOB_ID_SIZE * 2)
		return -1;
	for (i = 0; hex[i] != '\0'; i++) {
		if (!((hex[i] >= '0' && hex[i] <= '9') ||
		      (hex[i] >= 'a' && hex[i] <= 'f')))
			return -1;
	}
	buffer_create_from_data(&buf, id_r->id, sizeof(id_r->id));
	if (hex_to_binary(hex, &buf) < 0 || buf.used != sizeof(id_r->id))
		return -1;
	return 0;
}

void cas_dek_generate(unsigned char dek_r[CAS_DEK_SIZE])
{
	cas_sodium_init();
	randombytes_buf(dek_r, CAS_DEK_SIZE);
}

static void
cas_dek_aad(uint32_t key_id, const struct cas_blob_id *id,
	    unsigned char aad_r[CAS_DEK_AAD_SIZE])
{
	memcpy(aad_r, CAS_DEK_AAD_MAGIC, 7);
	aad_r[7] = key_id >> 24;
	aad_r[8] = key_id >> 16;
	aad_r[9] = key_id >> 8;
	aad_r[10] = key_id;
	memcpy(aad_r + 11, id->id, CAS_BLOB_ID_SIZE);
}

void cas_dek_wrap(const struct cas_keyring *keyring,
		  const struct cas_blob_id *id,
		  const unsigned char dek[CAS_DEK_SIZE],
		  unsigned char wrapped_r[CAS_WRAPPED_DEK_SIZE])
{
	unsigned char aad[CAS_DEK_AAD_SIZE];
	unsigned char *nonce = wrapped_r + 4;

	cas_dek_aad(keyring->key_id, id, aad);
	memcpy(wrapped_r, aad + 7, 4);
	randombytes_buf(nonce, crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
	crypto_aead_xchacha20poly1305_ietf_encrypt(
		wrapped_r + 4 + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES,
		NULL, dek, CAS_DEK_SIZE, aad, sizeof(aad), NULL, nonce,
		keyring->secrets->wrap);
}

int cas_dek_unwrap(const struct cas_keyring *keyring,
		   const struct cas_blob_id *id,
		   const unsigned char wrapped[CAS_WRAPPED_DEK_SIZE],
		   unsigned char dek_r[CAS_DEK_SIZE], const char **error_r)
{
	unsigned char aad[CAS_DEK_AAD_SIZE];
	uint32_t key_id;

	sodium_memzero(dek_r, CAS_DEK_SIZE);
	key_id = ((uint32_t)wrapped[0] << 24) | ((uint32_t)wrapped[1] << 16) |
		((uint32_t)wrapped[2] << 8) | wrapped[3];
	if (key_id != keyring->key_id) {
		*error_r = t_strdup_printf(
			"DEK wrapped by another key (key id %08x, ours %08x)",
			key_id, keyring->key_id);
		return -1;
	}
	cas_dek_aad(key_id, id, aad);
	if (crypto_aead_xchacha20poly1305_ietf_decrypt(
		dek_r, NULL, NULL,
		wrapped + 4 + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES,
		CAS_DEK_SIZE + crypto_aead_xchacha20poly1305_ietf_ABYTES,
		aad, sizeof(aad), wrapped + 4, keyring->secrets->wrap) != 0) {
		sodium_memzero(dek_r, CAS_DEK_SIZE);
		*error_r = "DEK unwrap: authentication failed";
		return -1;
	}
	return 1;
}

int cas_dek_rewrap(const struct cas_keyring *old_keyring,
		   const struct cas_keyring *new_keyring,
		   const struct cas_blob_id *id,
		   const unsigned char wrapped[CAS_WRAPPED_DEK_SIZE],
		   unsigned char new_wrapped_r[CAS_WRAPPED_DEK_SIZE],
		   const char **error_r)
{
	unsigned char dek[CAS_DEK_SIZE];

	if (cas_dek_unwrap(old_keyring, id, wrapped, dek, error_r) < 0)
		return -1;
	cas_dek_wrap(new_keyring, id, dek, new_wrapped_r);
	sodium_memzero(dek, sizeof(dek));
	return 1;
}

void cas_record_seal_key(const unsigned char key[CAS_KEK_SIZE],
			 const void *aad, size_t aad_size,
			 const void *data, size_t size, buffer_t *sealed)
{
	unsigned char *nonce, *ct;

	nonce = buffer_append_space_unsafe(sealed,
		crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
	randombytes_buf(nonce, crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
	ct = buffer_append_space_unsafe(sealed,
		size + crypto_aead_xchacha20poly1305_ietf_ABYTES);
	/* the append may have moved the buffer */
	nonce = ct - crypto_aead_xchacha20poly1305_ietf_NPUBBYTES;
	crypto_aead_xchacha20poly1305_ietf_encrypt(ct, NULL, data, size,
		aad, aad_size, NULL, nonce, key);
}

int cas_record_open_key(const unsigned char key[CAS_KEK_SIZE],
			const void *aad, size_t aad_size,
			const void *sealed, size_t sealed_size,
			buffer_t *plain, const char **error_r)
{
	const unsigned char *nonce = sealed;
	size_t overhead = crypto_aead_xchacha20poly1305_ietf_NPUBBYTES +
		crypto_aead_xchacha20poly1305_ietf_ABYTES;
	size_t old_used = plain->used;
	unsigned char *dest;

	if (sealed_size < overhead) {
		*error_r = t_strdup_printf(
			"sealed record too short (%zu bytes)",
			sealed_size);
		return -1;
	}
	dest = buffer_append_space_unsafe(plain, sealed_size - overhead);
	if (crypto_aead_xchacha20poly1305_ietf_decrypt(dest, NULL, NULL,
		nonce + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES,
		sealed_size - crypto_aead_xchacha20poly1305_ietf_NPUBBYTES,
		aad, aad_size, nonce, key) != 0) {
		sodium_memzero(dest, sealed_size - overhead);
		buffer_set_used_size(plain, old_used);
		*error_r = "sealed record: authentication failed";
		return -1;
	}
	return 1;
}

void cas_record_seal(const struct cas_keyring *keyring,
		     const void *aad, size_t aad_size,
		     const void *data, size_t size, buffer_t *sealed)
{
	cas_record_seal_key(keyring->secrets->index, aad, aad_size,
			    data, size, sealed);
}

int cas_record_open(const struct cas_keyring *keyring,
		    const void *aad, size_t aad_size,
		    const void *sealed, size_t sealed_size,
		    buffer_t *plain, const char **error_r)
{
	return cas_record_open_key(keyring->secrets->index, aad, aad_size,
				   sealed, sealed_size, plain, error_r);
}

/* Raw AEAD with a caller-held key (the blob codec's per-blob DEK). */
void cas_aead_encrypt(const unsigned char key[CAS_DEK_SIZE],
		      const unsigned char nonce[CAS_AEAD_NONCE_SIZE],
		      const void *aad, size_t aad_size,
		      const void *plain, size_t size, unsigned char *dest)
{
	crypto_aead_xchacha20poly1305_ietf_encrypt(dest, NULL, plain, size,
		aad, aad_size, NULL, nonce, key);
}

int cas_aead_decrypt(const unsigned char key[CAS_DEK_SIZE],
		     const unsigned char nonce[CAS_AEAD_NONCE_SIZE],
		     const void *aad, size_t aad_size,
		     const void *cipher, size_t cipher_size,
		     unsigned char *dest)
{
	if (cipher_size < CAS_AEAD_TAG_SIZE)
		return -1;
	if (crypto_aead_xchacha20poly1305_ietf_decrypt(dest, NULL, NULL,
		cipher, cipher_size, aad, aad_size, nonce, key) != 0) {
		sodium_memzero(dest, cipher_size - CAS_AEAD_TAG_SIZE);
		return -1;
	}
	return 0;
}
