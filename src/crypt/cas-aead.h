#ifndef CAS_AEAD_H
#define CAS_AEAD_H

/* The chunk ciphers of blob frames version 2 (doc/casbox-format.md,
   "Frame version 2"). Both are libsodium's: AES-256-GCM where the CPU
   has AES-NI and PCLMULQDQ (libsodium has no software AES), else
   XChaCha20-Poly1305. The cipher id is written in the frame.

   Nonces stay misuse-safe although AES-GCM has only 96 bits of nonce:
   no chunk is encrypted under the DEK itself. Every frame draws a
   random 192-bit frame nonce and encrypts under the subkey
   BLAKE2b-256(key = DEK, "CBFRKEY2" | cipher | frame nonce); the chunk
   nonce is the chunk index. Two frames under one DEK (which the writer
   never does: DEKs are fresh per frame) still get independent
   subkeys, so a (key, nonce) pair is never used twice. */

#include "cas-key.h"

enum cas_aead_cipher {
	/* in settings: the preferred cipher of this CPU */
	CAS_AEAD_CIPHER_AUTO = 0,
	CAS_AEAD_CIPHER_XCHACHA20POLY1305 = 1,
	CAS_AEAD_CIPHER_AES256GCM = 2,
};
#define CAS_AEAD_CIPHER_MAX CAS_AEAD_CIPHER_AES256GCM
#define CAS_AEAD_FRAME_NONCE_SIZE 24
#define CAS_AEAD_SUBKEY_SIZE 32

/* TRUE if this process can encrypt and decrypt with cipher (AES-256-GCM
   needs AES-NI; an unknown id is never available). */
bool cas_aead_cipher_available(enum cas_aead_cipher cipher);
/* AES-256-GCM if available, else XChaCha20-Poly1305. */
enum cas_aead_cipher cas_aead_cipher_preferred(void);
/* auto resolved to the preferred cipher. Returns 0 ok, -1 when the
   cipher is not available here (error_r says why). */
int cas_aead_cipher_resolve(enum cas_aead_cipher cipher,
			    enum cas_aead_cipher *cipher_r,
			    const char **error_r);
/* "aes-256-gcm", "xchacha20-poly1305", "auto"; "unknown" otherwise. */
const char *cas_aead_cipher_name(enum cas_aead_cipher cipher);
/* Parse a setting value (the names above). Returns 0 ok, -1 unknown. */
int cas_aead_cipher_parse(const char *name, enum cas_aead_cipher *cipher_r);

/* The frame subkey (see above). subkey_r should be locked memory
   (sodium_malloc); the caller wipes it. */
void cas_aead_frame_subkey(enum cas_aead_cipher cipher,
			   const unsigned char dek[CAS_DEK_SIZE],
			   const unsigned char nonce[CAS_AEAD_FRAME_NONCE_SIZE],
			   unsigned char subkey_r[CAS_AEAD_SUBKEY_SIZE]);
/* Encrypt chunk idx in place or to dest (size + CAS_AEAD_TAG_SIZE
   bytes: ciphertext | tag). cipher must be available. */
void cas_aead_chunk_encrypt(enum cas_aead_cipher cipher,
			    const unsigned char subkey[CAS_AEAD_SUBKEY_SIZE],
			    uint32_t idx, const void *aad, size_t aad_size,
			    const void *plain, size_t size,
			    unsigned char *dest);
/* Verify the tag, then decrypt cipher_size - CAS_AEAD_TAG_SIZE bytes
   to dest (may equal cipher). Returns 0 ok, -1 authentication failed
   (dest zeroed) or cipher not available. */
int cas_aead_chunk_decrypt(enum cas_aead_cipher cipher,
			   const unsigned char subkey[CAS_AEAD_SUBKEY_SIZE],
			   uint32_t idx, const void *aad, size_t aad_size,
			   const void *cipher_text, size_t cipher_size,
			   unsigned char *dest);

#endif
