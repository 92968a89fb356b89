/* Chunk ciphers of frame version 2: see cas-aead.h. */

#include "lib.h"
#include "byteorder.h"
#include "cas-aead.h"

#include <sodium.h>

#define CAS_AEAD_SUBKEY_CONTEXT "CBFRKEY2"

static bool cas_aead_aes_available(void)
{
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	return crypto_aead_aes256gcm_is_available() != 0;
}

bool cas_aead_cipher_available(enum cas_aead_cipher cipher)
{
	switch (cipher) {
	case CAS_AEAD_CIPHER_XCHACHA20POLY1305:
		return TRUE;
	case CAS_AEAD_CIPHER_AES256GCM:
		return cas_aead_aes_available();
	case CAS_AEAD_CIPHER_AUTO:
		break;
	}
	return FALSE;
}

enum cas_aead_cipher cas_aead_cipher_preferred(void)
{
	return cas_aead_aes_available() ? CAS_AEAD_CIPHER_AES256GCM :
		CAS_AEAD_CIPHER_XCHACHA20POLY1305;
}

int cas_aead_cipher_resolve(enum cas_aead_cipher cipher,
			    enum cas_aead_cipher *cipher_r,
			    const char **error_r)
{
	if (cipher == CAS_AEAD_CIPHER_AUTO)
		cipher = cas_aead_cipher_preferred();
	if (!cas_aead_cipher_available(cipher)) {
		*error_r = t_strdup_printf(
			"cipher %s is not available on this CPU%s",
			cas_aead_cipher_name(cipher),
			cipher == CAS_AEAD_CIPHER_AES256GCM ?
			" (libsodium's AES-256-GCM needs AES-NI and "
			"PCLMULQDQ)" : "");
		return -1;
	}
	*cipher_r = cipher;
	return 0;
}

const char *cas_aead_cipher_name(enum cas_aead_cipher cipher)
{
	switch (cipher) {
	case CAS_AEAD_CIPHER_AUTO:
		return "auto";
	case CAS_AEAD_CIPHER_XCHACHA20POLY1305:
		return "xchacha20-poly1305";
	case CAS_AEAD_CIPHER_AES256GCM:
		return "aes-256-gcm";
	}
	return "unknown";
}

int cas_aead_cipher_parse(const char *name, enum cas_aead_cipher *cipher_r)
{
	enum cas_aead_cipher c;

	for (c = CAS_AEAD_CIPHER_AUTO; c <= CAS_AEAD_CIPHER_MAX; c++) {
		if (strcmp(name, cas_aead_cipher_name(c)) == 0) {
			*cipher_r = c;
			return 0;
		}
	}
	return -1;
}

void cas_aead_frame_subkey(enum cas_aead_cipher cipher,
			   const unsigned char dek[CAS_DEK_SIZE],
			   const unsigned char nonce[CAS_AEAD_FRAME_NONCE_SIZE],
			   unsigned char subkey_r[CAS_AEAD_SUBKEY_SIZE])
{
	crypto_generichash_state state;
	unsigned char c = cipher;

	crypto_generichash_init(&state, dek, CAS_DEK_SIZE,
				CAS_AEAD_SUBKEY_SIZE);
	crypto_generichash_update(&state,
		(const unsigned char *)CAS_AEAD_SUBKEY_CONTEXT,
		strlen(CAS_AEAD_SUBKEY_CONTEXT));
	crypto_generichash_update(&state, &c, 1);
	crypto_generichash_update(&state, nonce, CAS_AEAD_FRAME_NONCE_SIZE);
	crypto_generichash_final(&state, subkey_r, CAS_AEAD_SUBKEY_SIZE);
	sodium_memzero(&state, sizeof(state));
}

/* The chunk index, little-endian, then zeros: unique per subkey. */
static void cas_aead_chunk_nonce(uint32_t idx,
				 unsigned char nonce_r[CAS_AEAD_NONCE_SIZE])
{
	memset(nonce_r, 0, CAS_AEAD_NONCE_SIZE);
	cpu32_to_le_unaligned(idx, nonce_r);
}

void cas_aead_chunk_encrypt(enum cas_aead_cipher cipher,
			    const unsigned char subkey[CAS_AEAD_SUBKEY_SIZE],
			    uint32_t idx, const void *aad, size_t aad_size,
			    const void *plain, size_t size,
			    unsigned char *dest)
{
	unsigned char nonce[CAS_AEAD_NONCE_SIZE];

	cas_aead_chunk_nonce(idx, nonce);
	switch (cipher) {
	case CAS_AEAD_CIPHER_XCHACHA20POLY1305:
		crypto_aead_xchacha20poly1305_ietf_encrypt(dest, NULL, plain,
			size, aad, aad_size, NULL, nonce, subkey);
		return;
	case CAS_AEAD_CIPHER_AES256GCM:
		i_assert(cas_aead_aes_available());
		crypto_aead_aes256gcm_encrypt(dest, NULL, plain, size,
			aad, aad_size, NULL, nonce, subkey);
		return;
	case CAS_AEAD_CIPHER_AUTO:
		break;
	}
	i_panic("cas_aead_chunk_encrypt(): cipher %u", cipher);
}

int cas_aead_chunk_decrypt(enum cas_aead_cipher cipher,
			   const unsigned char subkey[CAS_AEAD_SUBKEY_SIZE],
			   uint32_t idx, const void *aad, size_t aad_size,
			   const void *cipher_text, size_t cipher_size,
			   unsigned char *dest)
{
	unsigned char nonce[CAS_AEAD_NONCE_SIZE];
	int ret = -1;

	if (cipher_size < CAS_AEAD_TAG_SIZE)
		return -1;
	cas_aead_chunk_nonce(idx, nonce);
	if (cipher == CAS_AEAD_CIPHER_XCHACHA20POLY1305) {
		ret = crypto_aead_xchacha20poly1305_ietf_decrypt(dest, NULL,
			NULL, cipher_text, cipher_size, aad, aad_size, nonce,
			subkey);
	} else if (cipher == CAS_AEAD_CIPHER_AES256GCM &&
		   cas_aead_aes_available()) {
		ret = crypto_aead_aes256gcm_decrypt(dest, NULL, NULL,
			cipher_text, cipher_size, aad, aad_size, nonce,
			subkey);
	}
	if (ret != 0) {
		sodium_memzero(dest, cipher_size - CAS_AEAD_TAG_SIZE);
		return -1;
	}
	return 0;
}
