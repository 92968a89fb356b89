#ifndef CAS_KEY_H
#define CAS_KEY_H

#include <sys/stat.h>

/* cas-key: a user's key ring and the envelope-encryption primitives
   (see doc/casbox-format.md and doc/threat-model.md).

   The key file holds the user's secrets in a small versioned,
   checksummed format. A key epoch is a 32-byte secret; sub-keys are
   derived from it with BLAKE2b KDF contexts, one per purpose:
     - the blob-id key (keyed BLAKE2b-256 content addresses),
     - the index key (FTS segments, dictionaries, sealed metadata and
       other small records),
     - the store keys (cas_keyring_store_key()).
   A CASKEY1/2 file holds one root: it is epoch 0's secret and also
   gives the key id that names the store's key (the LSM 'K' record) and
   the fingerprint; a CASKEY3 file stores those two and one or two
   epochs, one of them current (new writes), the other, during a
   rotation, retiring (opening only). Key rotation adds a random epoch,
   --finish drops the old one. The keys that wrap per-blob data keys
   (DEKs) live in slots, each with a public key id: a CASKEY1 file has
   one implicit slot (wrap key derived from the root, key id = the
   root's), a CASKEY2/3 file one or two explicit slots, one of them
   current (new wraps), the other, during a rotation, retiring (unwrap
   only). Slots and epochs are added and dropped together.
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
/* A copy of a server-mode key ring (its secrets in new locked memory,
   the file's stat for cas_keyring_refresh()), or NULL for a
   password-mode one: what cas_keyring_load() of the same file would
   give, without reading and checking it again. */
struct cas_keyring *cas_keyring_dup(const struct cas_keyring *keyring);
/* Key ring from raw KEK bytes (tests, benchmarks, fuzzers). */
struct cas_keyring *
cas_keyring_create_from_kek(const unsigned char kek[CAS_KEK_SIZE]);
/* Parse an in-memory key file image (what cas_keyring_load() reads).
   Returns 1 ok, -1 damaged (error_r says why, without key bytes). */
int cas_key_file_parse(const void *data, size_t size,
		       struct cas_keyring **keyring_r, const char **error_r);
/* Short public identifier of the key: names the store's key in the LSM
   'K' record; the same before and after key rotation (derived from the
   first root, stored in a CASKEY3 file). For a never rotated key it is
   also the key id of its only wrap slot. */
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
/* Key epochs (rotation): how many the key file holds (1, or 2 while a
   rotation is in progress; always 1 in password mode). */
#define CAS_KEY_FILE_MAX_EPOCHS 2
unsigned int cas_keyring_epoch_count(const struct cas_keyring *keyring);
/* The key file's non-current epoch, if any. */
bool cas_keyring_retiring_epoch(const struct cas_keyring *keyring,
				uint32_t *epoch_r);
/* Add a new random slot and a new random epoch (secret from
   randombytes, nothing derived from the old one) and make both current
   (the key ring must have one of each). Memory only: cas_keyring_save()
   writes them. */
void cas_keyring_rotate_add(struct cas_keyring *keyring);
/* Forget every slot and epoch but the current ones, also those only
   held in memory (memory only). */
void cas_keyring_rotate_finish(struct cas_keyring *keyring);
/* Write the key ring as a CASKEY3 file over path: temporary file,
   fsync, rename, directory fsync; an existing file's owner and mode are
   kept, a new file gets 0600. Returns 1 ok, -1 error (the old file is
   then still in place, unless only the directory fsync failed). */
int cas_keyring_save(struct cas_keyring *keyring, const char *path,
		     const char **error_r);
/* Reload the key ring from path if the file changed since it was loaded
   or saved (one stat() when it did not). The root must be the same
   (else -1: another store's key); the file's slots are adopted, slots
   it dropped are kept in memory for unwrapping only, epochs it dropped
   for opening only. The keyring
   pointer stays valid. Returns 1 ok, -1 error (missing, damaged or
   another key: the key ring is left as it was). */
int cas_keyring_refresh(struct cas_keyring *keyring, const char *path,
			bool *changed_r, const char **error_r);
/* The same with the file's stat() already made by the caller (st; for
   two key rings of one file, one stat() instead of two). A password-
   mode ring ignores it, as it ignores the file. */
int cas_keyring_refresh_stat(struct cas_keyring *keyring, const char *path,
			     const struct stat *st, bool *changed_r,
			     const char **error_r);
/* TRUE if cas_keyring_refresh() of this ring looks at the file (a
   server-mode ring). */
bool cas_keyring_refresh_needs_stat(const struct cas_keyring *keyring);

/* Keyed content address: BLAKE2b-256 keyed with the current epoch's
   blob-id key. */
void cas_blob_id_init(const struct cas_keyring *keyring,
		      struct cas_blob_id_ctx *ctx);
void cas_blob_id_update(struct cas_blob_id_ctx *ctx, const void *data,
			size_t size);
void cas_blob_id_final(struct cas_blob_id_ctx *ctx, struct cas_blob_id *id_r);
void cas_blob_id_compute(const struct cas_keyring *keyring, const void *data,
			 size_t size, struct cas_blob_id *id_r);
/* Blob-id keys the ring holds: 1 + the epochs other than the current
   one. cas_blob_id_init_nth(n) starts a hash under the n-th (0 = the
   current: as cas_blob_id_init()); a writer that checks a blob id a
   save computed before the ring was refreshed tries each. */
unsigned int cas_blob_id_key_count(const struct cas_keyring *keyring);
void cas_blob_id_init_nth(const struct cas_keyring *keyring, unsigned int n,
			  struct cas_blob_id_ctx *ctx);
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
   name). sealed = nonce | ciphertext | tag. Sealing uses the current
   epoch; opening tries the current epoch, then every other one the ring
   holds. Returns 1 ok, -1 failure. */
void cas_record_seal(const struct cas_keyring *keyring,
		     const void *aad, size_t aad_size,
		     const void *data, size_t size, buffer_t *sealed);
int cas_record_open(const struct cas_keyring *keyring,
		    const void *aad, size_t aad_size,
		    const void *sealed, size_t sealed_size,
		    buffer_t *plain, const char **error_r);
/* Key rotation --finish: if the record opens under the current epoch,
   return 0 (resealed untouched); if it opens under another epoch the
   ring holds, append it sealed under the current epoch to resealed and
   return 1; -1 it opens under none (error_r). Password mode has one
   index key: 0 or -1. */
int cas_record_reseal(const struct cas_keyring *keyring,
		      const void *aad, size_t aad_size,
		      const void *sealed, size_t sealed_size,
		      buffer_t *resealed, const char **error_r);
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

/* Store keys (records v2, issue 15): sub-keys for the store's own
   records, held by the server in both key modes (LMTP writes records
   without the password): the per-record MAC key and the LSM table/WAL
   encryption key. Server mode derives them from the epoch's secret,
   password mode from the server-held delivery key. Each belongs to a key
   epoch: epoch 0 is what every key file has; key rotation (rotate, then
   --finish) starts the next one and later drops the old one. */
enum cas_store_key_purpose {
	CAS_STORE_KEY_RECORD = 1,
	CAS_STORE_KEY_LSM = 2,
};
#define CAS_STORE_KEY_SIZE 32
/* The epoch new records are written under. */
uint32_t cas_keyring_store_epoch(const struct cas_keyring *keyring);
/* The purpose's key of an epoch (for reading what that epoch wrote).
   Returns 1 ok, -1 the key ring does not hold that epoch (error_r says
   so, naming the epoch; key_r zeroed). Wipe key_r after use. */
int cas_keyring_store_key(const struct cas_keyring *keyring,
			  enum cas_store_key_purpose purpose, uint32_t epoch,
			  unsigned char key_r[CAS_STORE_KEY_SIZE],
			  const char **error_r);
/* 256-bit public fingerprint of the key (both modes): what a store
   records to tell its own key from another (a 32-bit key id can be
   ground). Stays the same across rotation. */
#define CAS_KEY_FINGERPRINT_SIZE 32
void cas_keyring_fingerprint(const struct cas_keyring *keyring,
			     unsigned char fp_r[CAS_KEY_FINGERPRINT_SIZE]);

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
