#ifndef CAS_KEYMODE_H
#define CAS_KEYMODE_H

#include "cas-userkey.h"

/* cas-keymode: one key ring for both key modes (casbox_key_mode; see
   doc/threat-model.md). Storage, doveadm and FTS load keys with
   cas_keyring_load_mode() and protect blob DEKs with
   cas_keyring_dek_protect()/open(), so the same code paths serve the
   server mode (a KEK wraps DEKs) and the password mode (DEKs are sealed
   to the user's public key; opening them needs the login password). */

enum cas_key_mode {
	CAS_KEY_MODE_SERVER = 0,
	CAS_KEY_MODE_PASSWORD,
};

struct cas_key_settings {
	enum cas_key_mode mode;
	/* the key file: CASKEY1 (server) or CASUKEY1 (password) */
	const char *path;
	/* password mode: the login password, NULL or "" when this process
	   has none (LMTP, indexer, doveadm). Never logged. */
	const char *password;
};

/* Largest stored DEK of any kind (the sealed one). */
#define CAS_STORED_DEK_MAX_SIZE CAS_SEALED_DEK_SIZE

/* Returns 0 ok, -1 not "server" or "password". */
int cas_key_mode_parse(const char *str, enum cas_key_mode *mode_r);
const char *cas_key_mode_name(enum cas_key_mode mode);

/* Load the key ring of the configured mode. Password mode with a
   password unlocks (one Argon2id run; a wrong password is an error),
   without one loads only the public part (blob ids, sealing DEKs).
   Returns 1 ok, 0 the file does not exist, -1 error (error_r names the
   file, never key or password bytes). */
int cas_keyring_load_mode(const struct cas_key_settings *set,
			  struct cas_keyring **keyring_r,
			  const char **error_r);
/* Create a new key file of the configured mode (never replaces one).
   Password mode needs the password. Returns 1 ok, -1 error. */
int cas_keyring_create_mode(const struct cas_key_settings *set,
			    struct cas_keyring **keyring_r,
			    const char **error_r);

/* Bytes a stored DEK of this kind takes, 0 for an unknown kind. */
size_t cas_dek_kind_size(uint8_t kind);
/* Protect a blob's DEK for storage with the ring's mode: server mode
   wraps it (CAS_DEK_KIND_SERVER_WRAP, CAS_WRAPPED_DEK_SIZE bytes),
   password mode seals it to the public key (CAS_DEK_KIND_SEALED,
   CAS_SEALED_DEK_SIZE bytes; works without the password). Returns 1
   ok, -1 error (unusable public key). */
int cas_keyring_dek_protect(const struct cas_keyring *keyring,
			    const struct cas_blob_id *id,
			    const unsigned char dek[CAS_DEK_SIZE],
			    uint8_t *kind_r,
			    unsigned char stored_r[CAS_STORED_DEK_MAX_SIZE],
			    const char **error_r);
/* Open a stored DEK of the given kind. Returns 1 ok, -1 error (kind of
   the other mode, locked user key, wrong key, tampered; dek_r zeroed). */
int cas_keyring_dek_open(const struct cas_keyring *keyring,
			 const struct cas_blob_id *id, uint8_t kind,
			 const unsigned char *stored,
			 unsigned char dek_r[CAS_DEK_SIZE],
			 const char **error_r);
/* The key id a stored DEK names: the wrap key's (server kind) or the
   user key pair's (sealed kind); 0 for an unknown kind. Public. */
uint32_t cas_stored_dek_key_id(uint8_t kind, const unsigned char *stored);
/* Check a stored DEK without opening it, where the mode allows it
   (password mode: kind, key id and MAC of a sealed DEK, with or without
   the password). Returns 1 verified, 0 cannot be checked without
   opening (server mode), -1 bad. */
int cas_keyring_dek_verify(const struct cas_keyring *keyring,
			   const struct cas_blob_id *id, uint8_t kind,
			   const unsigned char *stored, const char **error_r);

#endif
