#ifndef CAS_KEY_H
#define CAS_KEY_H

/* cas-key: a user's key ring and the envelope-encryption primitives
   (see doc/casbox-format.md and doc/threat-model.md).

   The key file holds the user's 32-byte key-encryption key (KEK) in a
   small versioned, checksummed format. Sub-keys are derived from it
   with BLAKE2b KDF contexts, one per purpose, so one file yields:
     - the KEK that wraps per-blob data keys (DEKs),
     - the blob-id key (keyed BLAKE2b-256 content addresses),
     - the index key (FTS segments, dictionaries, other small records).
   Every secret lives in sodium_malloc()ed memory and is wiped on free.
   Nothing here logs key bytes. */

#define CAS_BLOB_ID_SIZE 32
#define CAS_KEK_SIZE 32
#define CAS_AEAD_NONCE_SIZE 24
#define CAS_AEAD_TAG_SIZE 16
#define CAS_DEK_SIZE 32
/* key id (4) | nonce (24) | wrapped DEK (32) | tag (16) */
#define CAS_WRAPPED_DEK_SIZE (4 + 24 + CAS_DEK_SIZE + 16)

struct cas_keyring;

struct cas_blob_id {
	unsigned char id[CAS_BLOB_ID_SIZE];
};

struct cas_blob_id_ctx {
	/* crypto_generichash_state, kept opaque and aligned */
	unsigned char state[384] __attribute__((aligned(64)));
};

/* Load the key ring from path. Returns 1 ok, 0 the file does not exist,
   -1 error (unreadable, damaged, wrong format; error_r names the file
   and never contains key bytes). */
int cas_keyring_load(const char *path, struct cas_keyring **keyring_r,
		     const char **error_r);
/* Create a new random key file (O_EXCL, mode 0600, fsynced). Fails if
   the file exists. Returns 1 ok, -1 error. */
int cas_keyring_create(const char *path, struct cas_keyring **keyring_r,
		       const char **error_r);
void cas_keyring_free(struct cas_keyring **keyring);
/* Key ring from raw KEK bytes (tests, benchmarks, fuzzers). */
struct cas_keyring *
cas_keyring_create_from_kek(const unsigned char kek[CAS_KEK_SIZE]);
/* Parse an in-memory key file image (what cas_keyring_load() reads).
   Returns 1 ok, -1 damaged (error_r says why, without key bytes). */
int cas_key_file_parse(const void *data, size_t size,
		       struct cas_keyring **keyring_r, const char **error_r);
/* Short public identifier of the KEK (e.g. stored next to wrapped DEKs
   so rotation can tell old from new). */
uint32_t cas_keyring_key_id(const struct cas_keyring *keyring);

/* Keyed content address: BLAKE2b-256 keyed with the blob-id key. */
void cas_blob_id_init(const struct cas_keyring *keyring,
		      struct cas_blob_id_ctx *ctx);
void cas_blob_id_update(struct cas_blob_id_ctx *ctx, const void *data,
			size_t size);
void cas_blob_id_final(struct cas_blob_id_ctx *ctx, struct cas_blob_id *id_r);
void cas_blob_id_compute(const struct cas_keyring *keyring, const void *data,
			 size_t size, struct cas_blob_id *id_r);
/* Lowercase hex, 64 chars, for logs and doveadm output. */
const char *cas_blob_id_to_hex(const struct cas_blob_id *id);
/* Returns 0 ok, -1 not 64 lowercase hex digits. */
int cas_blob_id_from_hex(const char *hex, struct cas_blob_id *id_r);

/* Envelope: a fresh random DEK per blob, wrapped by the KEK with the
   blob id as associated data (a wrapped DEK cannot be moved to another
   blob). */
void cas_dek_generate(unsigned char dek_r[CAS_DEK_SIZE]);
void cas_dek_wrap(const struct cas_keyring *keyring,
		  const struct cas_blob_id *id,
		  const unsigned char dek[CAS_DEK_SIZE],
		  unsigned char wrapped_r[CAS_WRAPPED_DEK_SIZE]);
/* Returns 1 ok, -1 wrong key or tampered (dek_r is zeroed then). */
int cas_dek_unwrap(const struct cas_keyring *keyring,
		   const struct cas_blob_id *id,
		   const unsigned char wrapped[CAS_WRAPPED_DEK_SIZE],
		   unsigned char dek_r[CAS_DEK_SIZE], const char **error_r);

/* Key rotation: unwrap with old_keyring, wrap again with new_keyring.
   Only the 76 bytes change; packs are never touched. Returns 1 ok, -1
   as cas_dek_unwrap() (new_wrapped_r untouched then). */
int cas_dek_rewrap(const struct cas_keyring *old_keyring,
		   const struct cas_keyring *new_keyring,
		   const struct cas_blob_id *id,
		   const unsigned char wrapped[CAS_WRAPPED_DEK_SIZE],
		   unsigned char new_wrapped_r[CAS_WRAPPED_DEK_SIZE],
		   const char **error_r);

/* Seal/open small records with the index key (FTS segments, compression
   dictionaries, ...). aad binds the record to its place (e.g. a file
   name). sealed = nonce | ciphertext | tag. Returns 1 ok, -1 failure. */
void cas_record_seal(const struct cas_keyring *keyring,
		     const void *aad, size_t aad_size,
		     const void *data, size_t size, buffer_t *sealed);
int cas_record_open(const struct cas_keyring *keyring,
		    const void *aad, size_t aad_size,
		    const void *sealed, size_t sealed_size,
		    buffer_t *plain, const char **error_r);
/* The same with a caller-held 32-byte key (password mode's index key,
   cas-userkey.c): one implementation of the record format. */
void cas_record_seal_key(const unsigned char key[CAS_KEK_SIZE],
			 const void *aad, size_t aad_size,
			 const void *data, size_t size, buffer_t *sealed);
int cas_record_open_key(const unsigned char key[CAS_KEK_SIZE],
			const void *aad, size_t aad_size,
			const void *sealed, size_t sealed_size,
			buffer_t *plain, const char **error_r);

/* XChaCha20-Poly1305 with a caller-held key (the per-blob DEK).
   dest has size + CAS_AEAD_TAG_SIZE bytes (ciphertext | tag). decrypt
   writes cipher_size - CAS_AEAD_TAG_SIZE bytes, verifying the tag
   first; returns 0 ok, -1 authentication failed (dest zeroed). */
void cas_aead_encrypt(const unsigned char key[CAS_DEK_SIZE],
		      const unsigned char nonce[CAS_AEAD_NONCE_SIZE],
		      const void *aad, size_t aad_size,
		      const void *plain, size_t size, unsigned char *dest);
int cas_aead_decrypt(const unsigned char key[CAS_DEK_SIZE],
		     const unsigned char nonce[CAS_AEAD_NONCE_SIZE],
		     const void *aad, size_t aad_size,
		     const void *cipher, size_t cipher_size,
		     unsigned char *dest);

#endif
