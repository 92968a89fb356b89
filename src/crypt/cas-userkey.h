#ifndef CAS_USERKEY_H
#define CAS_USERKEY_H

#include "cas-key.h"

/* cas-userkey: the password-protected key mode (casbox_key_mode =
   password; see doc/threat-model.md and doc/casbox-format.md, "User key
   file").

   Each user has a random 32-byte user secret U, stored wrapped under a
   key derived from the user's password with Argon2id. U yields the
   user's X25519 key pair and the index key. The public key and a
   server-held delivery key (which yields the blob-id key and the key
   that authenticates sealed DEKs) are stored in the clear, so a process
   without the password (LMTP) can compute content addresses and seal
   per-blob DEKs to the user; only a process that has the password (an
   IMAP session) can open them.

   A struct cas_userkey is either public (loaded without a password:
   seal and blob ids only) or unlocked (also opens sealed DEKs and index
   records). Secrets live in sodium_malloc()ed memory, wiped on free.
   Error strings never contain key or password bytes. */

#define CAS_USERKEY_PUBLIC_KEY_SIZE 32
/* kind (1) | key id (4) | crypto_box_seal(DEK | blob id) (48 + 64) |
   MAC (16) */
#define CAS_SEALED_DEK_SIZE \
	(1 + 4 + 48 + CAS_DEK_SIZE + CAS_BLOB_ID_SIZE + 16)

/* The first byte of a sealed DEK. The server-mode wrapped DEK
   (cas_dek_wrap(), 76 bytes) has no kind byte of its own; a record that
   can hold either stores one of these in front (doc/casbox-format.md,
   "Telling wrapped DEK kinds apart"). */
enum cas_dek_kind {
	CAS_DEK_KIND_SERVER_WRAP = 0x01,
	CAS_DEK_KIND_SEALED = 0x02,
};

struct cas_userkey;

/* Argon2id cost of the password-derived wrapping key. */
struct cas_userkey_limits {
	unsigned long long opslimit;
	size_t memlimit;
};
/* Production default: libsodium's INTERACTIVE (2 passes, 64 MiB), since
   every IMAP login unlocks the key (doc/threat-model.md says why). */
extern const struct cas_userkey_limits cas_userkey_limits_default;

/* Create a new user key file at path (mode 0600, written to a temporary
   file, fsynced, linked into place so an existing file is never
   overwritten and a crash never leaves half a file, directory fsynced).
   limits NULL means the default. key_r (may be NULL) receives the
   unlocked key. Returns 1 ok, -1 error (the file exists, I/O, empty
   password, limits out of range). If only the final directory fsync
   fails, -1 is returned with the file in place (it may not survive a
   crash). */
int cas_userkey_create(const char *path, const void *password,
		       size_t password_len,
		       const struct cas_userkey_limits *limits,
		       struct cas_userkey **key_r, const char **error_r);
/* Load only the public part (no password, no Argon2id): what LMTP needs
   to seal DEKs and compute blob ids. Returns 1 ok, 0 the file does not
   exist, -1 error (error_r names the file). */
int cas_userkey_load_public(const char *path, struct cas_userkey **key_r,
			    const char **error_r);
/* Load and unlock with the password. Returns 1 ok, 0 the file does not
   exist, -1 error: damaged file, or "wrong password" (told apart by the
   checksum, which is verified before Argon2id runs). A wrong password
   costs exactly one Argon2id run plus one constant-time AEAD check. */
int cas_userkey_unlock(const char *path, const void *password,
		       size_t password_len, struct cas_userkey **key_r,
		       const char **error_r);
/* Rewrap the user secret under new_password (fresh salt; limits NULL
   keeps the file's). Public key, blob-id key and therefore every sealed
   DEK and blob id stay valid: no blob is touched. Atomic: temporary
   file, fsync, rename, directory fsync; mode and owner kept. Returns 1
   ok, 0 the file does not exist, -1 error (wrong old password, empty
   new password: the file is left unchanged). */
int cas_userkey_change_password(const char *path,
				const void *old_password, size_t old_len,
				const void *new_password, size_t new_len,
				const struct cas_userkey_limits *limits,
				const char **error_r);
void cas_userkey_free(struct cas_userkey **key);

/* In-memory variants of the loaders (tests, fuzzers). */
int cas_userkey_parse_public(const void *data, size_t size,
			     struct cas_userkey **key_r, const char **error_r);
int cas_userkey_unlock_data(const void *data, size_t size,
			    const void *password, size_t password_len,
			    struct cas_userkey **key_r, const char **error_r);

bool cas_userkey_is_unlocked(const struct cas_userkey *key);
/* First 4 bytes (big-endian) of BLAKE2b-128("CASUKID1" | public key):
   names the key pair in sealed DEKs. */
uint32_t cas_userkey_key_id(const struct cas_userkey *key);
void cas_userkey_public_key(const struct cas_userkey *key,
			    unsigned char pk_r[CAS_USERKEY_PUBLIC_KEY_SIZE]);

/* Keyed content address with the server-held blob-id key (works on a
   public key). Continue with cas_blob_id_update()/_final(). */
void cas_userkey_blob_id_init(const struct cas_userkey *key,
			      struct cas_blob_id_ctx *ctx);
void cas_userkey_blob_id_compute(const struct cas_userkey *key,
				 const void *data, size_t size,
				 struct cas_blob_id *id_r);

/* Seal DEK | blob id to the user's public key and MAC the result with
   the seal-MAC key (works on a public key). Returns 1 ok, -1 the public
   key is unusable (low order point). */
int cas_dek_seal_to_public(const struct cas_userkey *key,
			   const struct cas_blob_id *id,
			   const unsigned char dek[CAS_DEK_SIZE],
			   unsigned char sealed_r[CAS_SEALED_DEK_SIZE]);
/* Check kind, key id and MAC of a sealed DEK for blob id without
   opening it (works on a public key: scrub, LMTP dedup hits). Returns 1
   ok, -1 another kind, another key pair, forged, tampered, or made for
   another blob. */
int cas_dek_sealed_verify(const struct cas_userkey *key,
			  const struct cas_blob_id *id,
			  const unsigned char sealed[CAS_SEALED_DEK_SIZE],
			  const char **error_r);
/* Verify as above (MAC first, constant time), then open. Returns 1 ok,
   -1 key locked or cas_dek_sealed_verify() failed or the box does not
   open or holds another blob id (dek_r zeroed then). */
int cas_dek_open_sealed(const struct cas_userkey *key,
			const struct cas_blob_id *id,
			const unsigned char sealed[CAS_SEALED_DEK_SIZE],
			unsigned char dek_r[CAS_DEK_SIZE],
			const char **error_r);

/* Seal/open small records (FTS segments, dictionaries) with the index
   key, which is derived from the user secret: unlocked keys only.
   Same layout as cas_record_seal(). seal asserts the key is unlocked;
   open returns -1 for a locked key. */
void cas_userkey_record_seal(const struct cas_userkey *key,
			     const void *aad, size_t aad_size,
			     const void *data, size_t size, buffer_t *sealed);
int cas_userkey_record_open(const struct cas_userkey *key,
			    const void *aad, size_t aad_size,
			    const void *sealed, size_t sealed_size,
			    buffer_t *plain, const char **error_r);

/* Seal small records to the user's public key (password mode's pack
   meta frames, which LMTP writes without the password): an X25519 box
   with an ephemeral key, XChaCha20-Poly1305 under AAD, and a MAC with
   the server-held box-MAC key over AAD and box, so only holders of the
   key file can make one (doc/casbox-format.md, "Meta frame sealed to
   the user key"). seal works on a public key and returns 1 ok, -1 the
   public key is unusable (low order point; nothing appended). verify
   checks size, key id and MAC without opening (works on a public key).
   open needs an unlocked key, verifies first (constant time), and
   appends the plaintext. Both return 1 ok, -1 error. */
#define CAS_USERKEY_BOX_OVERHEAD (4 + 32 + 16 + 16)
int cas_userkey_box_seal(const struct cas_userkey *key,
			 const void *aad, size_t aad_size,
			 const void *data, size_t size, buffer_t *sealed);
int cas_userkey_box_verify(const struct cas_userkey *key,
			   const void *aad, size_t aad_size,
			   const void *sealed, size_t sealed_size,
			   const char **error_r);
int cas_userkey_box_open(const struct cas_userkey *key,
			 const void *aad, size_t aad_size,
			 const void *sealed, size_t sealed_size,
			 buffer_t *plain, const char **error_r);

/* Keyed BLAKE2b-128 of data with the locator key (from the server-held
   delivery key; works on a public key): a tag stored in the clear next
   to a record sealed to the user key, so a process without the password
   can tell which message a record is about by computing the tag of each
   candidate (gc without the password), while the tag tells nothing to
   someone without the key file. */
#define CAS_USERKEY_LOCATOR_SIZE 16
/* The store key of a purpose (cas_keyring_store_key(), epoch 0), from
   the server-held delivery key (works on a public key). */
void cas_userkey_store_key(const struct cas_userkey *key,
			   enum cas_store_key_purpose purpose,
			   unsigned char key_r[CAS_STORE_KEY_SIZE]);
/* cas_keyring_fingerprint() of a user key: BLAKE2b-256 over the public
   key and a delivery-key-derived value (works on a public key). */
void cas_userkey_fingerprint(const struct cas_userkey *key,
			     unsigned char fp_r[CAS_KEY_FINGERPRINT_SIZE]);
void cas_userkey_locator(const struct cas_userkey *key,
			 const void *data, size_t size,
			 unsigned char locator_r[CAS_USERKEY_LOCATOR_SIZE]);

#endif
