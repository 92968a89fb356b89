/* Sealing of LSM format 2 (doc/casbox-lsm.md, "Sealing"): table blocks,
   WAL records and the MANIFEST MAC.

   sealed = nonce[16] | XChaCha20-Poly1305(plain) | tag[16]
   plain  = u8 compression (0 none, 1 zstd) | [u32 raw size] | body
   aad    = "CBXLSM02" | u8 kind | u32 epoch | u64 file_no | u64 offset

   The stored nonce is 128 random bits, zero-extended to XChaCha20's
   192: no counter, so a WAL tail that is cut and rewritten at the same
   offset never reuses a nonce, and a collision needs about 2^64 items
   under one key. The AAD binds each sealed item to
   its kind (data, index, bloom, WAL record), its file and its offset in
   that file, so an item cannot be moved inside a file, into another
   file or be passed off as another kind. */

#include "lib.h"
#include "buffer.h"
#include "byteorder.h"
#include "safe-memset.h"
#include "cas-secmem.h"
#include "casbox-lsm-private.h"

#include <sodium.h>
#include <zstd.h>

#define SEAL_AAD_MAGIC "CBXLSM02"
#define SEAL_AAD_SIZE (8 + 1 + 4 + 8 + 8)
#define SEAL_NONCE_SIZE 16
#define SEAL_TAG_SIZE crypto_aead_xchacha20poly1305_ietf_ABYTES
#define SEAL_COMP_NONE 0
#define SEAL_COMP_ZSTD 1
#define SEAL_ZSTD_LEVEL 1
#define SEAL_MAX_PLAIN (CASBOX_LSM_WAL_MAX_PAYLOAD + 64)

static ZSTD_CCtx *seal_cctx;
static ZSTD_DCtx *seal_dctx;
/* scratch for the compressed or decrypted body: one per process, on the
   heap (merges seal and open thousands of blocks in one data stack
   frame), wiped after every use */
static buffer_t *seal_scratch;

static buffer_t *seal_scratch_get(size_t size)
{
	if (seal_scratch == NULL)
		seal_scratch = buffer_create_dynamic(default_pool, size);
	buffer_set_used_size(seal_scratch, 0);
	return seal_scratch;
}

static void seal_scratch_wipe(buffer_t *buf)
{
	safe_memset(buffer_get_modifiable_data(buf, NULL), 0, buf->used);
	buffer_set_used_size(buf, 0);
}

struct casbox_lsm_key *casbox_lsm_key_new(uint32_t epoch)
{
	struct casbox_lsm_key *key;

	key = cas_secmem_alloc(sizeof(*key));
	key->epoch = epoch;
	return key;
}

struct casbox_lsm_key *casbox_lsm_key_dup(const struct casbox_lsm_key *key)
{
	struct casbox_lsm_key *copy = casbox_lsm_key_new(key->epoch);

	memcpy(copy->key, key->key, sizeof(copy->key));
	return copy;
}

void casbox_lsm_key_free(struct casbox_lsm_key **_key)
{
	struct casbox_lsm_key *key = *_key;

	if (key == NULL)
		return;
	*_key = NULL;
	cas_secmem_free(key, sizeof(*key));
}

static void
seal_aad(unsigned char aad[SEAL_AAD_SIZE], enum casbox_lsm_seal_kind kind,
	 uint32_t epoch, uint64_t file_no, uint64_t offset)
{
	memcpy(aad, SEAL_AAD_MAGIC, 8);
	aad[8] = kind;
	cpu32_to_be_unaligned(epoch, aad + 9);
	cpu64_to_be_unaligned(file_no, aad + 13);
	cpu64_to_be_unaligned(offset, aad + 21);
}

void casbox_lsm_seal(const struct casbox_lsm_key *key,
		     enum casbox_lsm_seal_kind kind, uint64_t file_no,
		     uint64_t offset, const void *plain, size_t size,
		     bool compress, buffer_t *out)
{
	unsigned char aad[SEAL_AAD_SIZE], *nonce, *dest;
	unsigned char full_nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
	buffer_t *body;
	size_t bound, zsize;
	unsigned long long clen;

	body = seal_scratch_get(size + 8);
	if (compress && size > 64) {
		if (seal_cctx == NULL &&
		    (seal_cctx = ZSTD_createCCtx()) == NULL)
			i_fatal_status(FATAL_OUTOFMEM, "ZSTD_createCCtx() failed");
		bound = ZSTD_compressBound(size);
		dest = buffer_append_space_unsafe(body, 5 + bound);
		zsize = ZSTD_compressCCtx(seal_cctx, dest + 5, bound, plain,
					  size, SEAL_ZSTD_LEVEL);
		if (!ZSTD_isError(zsize) && zsize + 5 < size + 1) {
			dest[0] = SEAL_COMP_ZSTD;
			cpu32_to_be_unaligned(size, dest + 1);
			buffer_set_used_size(body, 5 + zsize);
		} else {
			buffer_set_used_size(body, 0);
		}
	}
	if (body->used == 0) {
		buffer_append_c(body, SEAL_COMP_NONE);
		buffer_append(body, plain, size);
	}

	seal_aad(aad, kind, key->epoch, file_no, offset);
	nonce = buffer_append_space_unsafe(out, SEAL_NONCE_SIZE);
	randombytes_buf(nonce, SEAL_NONCE_SIZE);
	dest = buffer_append_space_unsafe(out, body->used + SEAL_TAG_SIZE);
	/* out may have moved: the nonce is just before dest */
	nonce = dest - SEAL_NONCE_SIZE;
	memset(full_nonce, 0, sizeof(full_nonce));
	memcpy(full_nonce, nonce, SEAL_NONCE_SIZE);
	crypto_aead_xchacha20poly1305_ietf_encrypt(dest, &clen, body->data,
		body->used, aad, sizeof(aad), NULL, full_nonce, key->key);
	i_assert(clen == body->used + SEAL_TAG_SIZE);
	seal_scratch_wipe(body);
}

int casbox_lsm_unseal(const struct casbox_lsm_key *key,
		      enum casbox_lsm_seal_kind kind, uint64_t file_no,
		      uint64_t offset, const void *sealed, size_t size,
		      buffer_t *plain_r, const char **error_r)
{
	unsigned char aad[SEAL_AAD_SIZE];
	unsigned char full_nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
	const unsigned char *nonce = sealed, *p;
	buffer_t *scratch;
	unsigned char *body;
	unsigned long long mlen;
	int ret = 0;
	size_t body_size, raw_size, zret;

	buffer_set_used_size(plain_r, 0);
	if (size < SEAL_NONCE_SIZE + SEAL_TAG_SIZE + 1) {
		*error_r = "sealed item too short";
		return -1;
	}
	body_size = size - SEAL_NONCE_SIZE - SEAL_TAG_SIZE;
	seal_aad(aad, kind, key->epoch, file_no, offset);
	scratch = seal_scratch_get(body_size);
	body = buffer_append_space_unsafe(scratch, body_size);
	memset(full_nonce, 0, sizeof(full_nonce));
	memcpy(full_nonce, nonce, SEAL_NONCE_SIZE);
	if (crypto_aead_xchacha20poly1305_ietf_decrypt(body, &mlen, NULL,
		nonce + SEAL_NONCE_SIZE, size - SEAL_NONCE_SIZE,
		aad, sizeof(aad), full_nonce, key->key) != 0) {
		*error_r = t_strdup_printf(
			"authentication failed (damaged, moved, or not "
			"written with the key of epoch %u)", key->epoch);
		seal_scratch_wipe(scratch);
		return -1;
	}
	i_assert(mlen == body_size);
	p = body;
	switch (p[0]) {
	case SEAL_COMP_NONE:
		buffer_append(plain_r, p + 1, body_size - 1);
		break;
	case SEAL_COMP_ZSTD:
		if (body_size < 5) {
			*error_r = "compressed item too short";
			ret = -1;
			break;
		}
		raw_size = be32_to_cpu_unaligned(p + 1);
		if (raw_size > SEAL_MAX_PLAIN) {
			*error_r = "compressed item too large";
			ret = -1;
			break;
		}
		if (seal_dctx == NULL &&
		    (seal_dctx = ZSTD_createDCtx()) == NULL)
			i_fatal_status(FATAL_OUTOFMEM, "ZSTD_createDCtx() failed");
		zret = ZSTD_decompressDCtx(seal_dctx,
			buffer_append_space_unsafe(plain_r, raw_size), raw_size,
			p + 5, body_size - 5);
		if (ZSTD_isError(zret) || zret != raw_size) {
			buffer_set_used_size(plain_r, 0);
			*error_r = "decompression failed";
			ret = -1;
		}
		break;
	default:
		*error_r = "unknown compression";
		ret = -1;
		break;
	}
	seal_scratch_wipe(scratch);
	return ret;
}

void casbox_lsm_manifest_mac(const struct casbox_lsm_key *key,
			     const void *data, size_t size,
			     unsigned char mac_r[CASBOX_LSM_MAC_SIZE])
{
	static const char context[] = "casbox-lsm MANIFEST MAC v2";
	unsigned char mac_key[crypto_generichash_KEYBYTES];

	/* a sub-key, so the MAC never uses the sealing key itself */
	crypto_generichash(mac_key, sizeof(mac_key),
			   (const unsigned char *)context, sizeof(context) - 1,
			   key->key, sizeof(key->key));
	crypto_generichash(mac_r, CASBOX_LSM_MAC_SIZE, data, size,
			   mac_key, sizeof(mac_key));
	sodium_memzero(mac_key, sizeof(mac_key));
}

bool casbox_lsm_mac_equal(const unsigned char *a, const unsigned char *b,
			  size_t size)
{
	return sodium_memcmp(a, b, size) == 0;
}
