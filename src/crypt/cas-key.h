#ifndef CAS_KEY_H
#define CAS_KEY_H

/* cas-key: a user's key ring and the envelope-encryption primitives
   (see doc/casbox-format.md and doc/threat-model.md).

   The key file holds the user's 32-byte root secret in a small
   versioned, checksummed format. Sub-keys are derived from it with
   BLAKE2b KDF contexts, one per purpose:
     - the blob-id key (keyed BLAKE2b-256 content addresses),
     - the index key (FTS segments, dictionaries, other small records),
     - the key id that names the store's key (the LSM 'K' record).
   The root never changes. The keys that wrap per-blob data keys (DEKs)
   live in slots, each with a public key id: a CASKEY1 file has one
   implicit slot (wrap key derived from the root, key id = the root's),
   a CASKEY2 file one or two explicit slots, one of them current (new
   wraps), the other, during a rotation, retiring (unwrap only).
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
/* Short public identifier of the root secret: names the store's key in
   the LSM 'K' record; the same before and after key rotation. For a
   never rotated key it is also the key id of its only wrap slot. */
uint32_t cas_keyring_key_id(const struct cas_keyring *keyring);

/* Key slots (rotation). */
#define CAS_KEY_FILE_MAX_SLOTS 2
/* Key id of the current slot: what cas_dek_wrap() writes. */
uint32_t cas_keyring_wrap_key_id(const struct cas_keyring *keyring);
/* Slots in the key file (1, or 2 while a rotation is in progress). */
unsigned int cas_keyring_slot_count(const struct cas_keyring *keyring);
/* The key file's non-current slot, if any. */
bool cas_keyring_retiring_key_id(const struct cas_keyring *keyring,
				 uint32_t *key_id_r);
/* Can cas_dek_unwrap() open DEKs wrapped under key_id? */
bool cas_keyring_has_key_id(const struct cas_keyring *keyring,
			    uint32_t key_id);
/* Add a new random slot and make it current (the key ring must have one
   slot). Memory only: cas_keyring_save() writes it. */
void cas_keyring_rotate_add(struct cas_keyring *keyring);
/* Forget every slot but the current one (memory only). */
void cas_keyring_rotate_finish(struct cas_keyring *keyring);
/* Write the key ring as a CASKEY2 file over path: temporary file,
   fsync, rename, directory fsync; an existing file's owner and mode are
   kept, a new file gets 0600. Returns 1 ok, -1 error (the old file is
   then still in place, unless only the directory fsync failed). */
int cas_keyring_save(struct cas_keyring *keyring, const char *path,
		     const char **error_r);
/* Reload the key ring from path if the file changed since it was loaded
   or saved (one stat() when it did not). The root must be the same
   (else -1: another store's key); the file's slots are adopted, slots
   it dropped are kept in memory for unwrapping only. The keyring
   pointer stays valid. Returns 1 ok, -1 error (missing, damaged or
   another key: the key ring is left as it was). */
int cas_keyring_refresh(struct cas_keyring *keyring, const char *path,
			bool *changed_r, const char **error_r);

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
/* The key id a wrapped DEK names (its first 4 bytes, big-endian). */
uint32_t cas_dek_wrapped_key_id(const unsigned char wrapped[CAS_WRAPPED_DEK_SIZE]);
/* Opens with the slot named by the wrapped DEK's key id. Returns 1 ok,
   -1 no such slot ("wrapped by another key"), wrong key or tampered
   (dek_r is zeroed then). */
int cas_dek_unwrap(const struct cas_keyring *keyring,
		   const struct cas_blob_id *id,
		   const unsigned char wrapped[CAS_WRAPPED_DEK_SIZE],
		   unsigned char dek_r[CAS_DEK_SIZE], const char **error_r);

/* Key rotation: unwrap with old_keyring, wrap again with new_keyring's
   current slot (both may be the same key ring: retiring slot ->
   current slot). Only the 76 bytes change; packs are never touched.
   Returns 1 ok, -1 as cas_dek_unwrap() (new_wrapped_r untouched then). */
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

/* Password key mode (cas-userkey.h; selected by casbox_key_mode, see
   cas-keymode.h): a key ring can carry a user key instead of a KEK.
   cas_keyring_key_id(), the blob-id functions and cas_record_seal()/
   open() then use the user key (server-held blob-id key; index key only
   when unlocked). cas_dek_wrap()/unwrap() stay server mode only: code
   that serves both modes uses cas_keyring_dek_protect()/open(). */
struct cas_userkey;
/* Key ring over a user key, public or unlocked; takes ownership. */
struct cas_keyring *
cas_keyring_create_from_userkey(struct cas_userkey **userkey);
/* The user key of a password-mode ring, NULL for a server-mode ring. */
const struct cas_userkey *
cas_keyring_get_userkey(const struct cas_keyring *keyring);
/* TRUE if the ring can open DEKs and seal/open index records: a
   server-mode ring always, a password-mode ring only when unlocked. */
bool cas_keyring_can_decrypt(const struct cas_keyring *keyring);

#endif
