/* One key ring for both key modes: loading by mode and DEK protection
   by kind (doc/casbox-format.md, "Telling wrapped DEK kinds apart"). */

#include "lib.h"
#include "cas-keymode.h"

#include <sodium.h>

int cas_key_mode_parse(const char *str, enum cas_key_mode *mode_r)
{
	if (strcmp(str, "server") == 0)
		*mode_r = CAS_KEY_MODE_SERVER;
	else if (strcmp(str, "password") == 0)
		*mode_r = CAS_KEY_MODE_PASSWORD;
	else
		return -1;
	return 0;
}

const char *cas_key_mode_name(enum cas_key_mode mode)
{
	switch (mode) {
	case CAS_KEY_MODE_SERVER:
		return "server";
	case CAS_KEY_MODE_PASSWORD:
		return "password";
	}
	i_unreached();
}

static bool cas_key_settings_have_password(const struct cas_key_settings *set)
{
	return set->password != NULL && set->password[0] != '\0';
}

int cas_keyring_load_mode(const struct cas_key_settings *set,
			  struct cas_keyring **keyring_r,
			  const char **error_r)
{
	struct cas_userkey *userkey;
	int ret;

	*keyring_r = NULL;
	if (set->mode == CAS_KEY_MODE_SERVER)
		return cas_keyring_load(set->path, keyring_r, error_r);
	if (cas_key_settings_have_password(set)) {
		ret = cas_userkey_unlock(set->path, set->password,
					 strlen(set->password), &userkey,
					 error_r);
	} else {
		ret = cas_userkey_load_public(set->path, &userkey, error_r);
	}
	if (ret > 0)
		*keyring_r = cas_keyring_create_from_userkey(&userkey);
	return ret;
}

int cas_keyring_create_mode(const struct cas_key_settings *set,
			    struct cas_keyring **keyring_r,
			    const char **error_r)
{
	struct cas_userkey *userkey;

	*keyring_r = NULL;
	if (set->mode == CAS_KEY_MODE_SERVER)
		return cas_keyring_create(set->path, keyring_r, error_r);
	if (!cas_key_settings_have_password(set)) {
		*error_r = t_strdup_printf(
			"user key file %s can only be created with the "
			"user's password (casbox_key_mode=password): it is "
			"created at the user's first IMAP/POP3 login, and "
			"this process has no casbox_key_password", set->path);
		return -1;
	}
	if (cas_userkey_create(set->path, set->password,
			       strlen(set->password), NULL, &userkey,
			       error_r) < 0)
		return -1;
	*keyring_r = cas_keyring_create_from_userkey(&userkey);
	return 1;
}

size_t cas_dek_kind_size(uint8_t kind)
{
	switch (kind) {
	case CAS_DEK_KIND_SERVER_WRAP:
		return CAS_WRAPPED_DEK_SIZE;
	case CAS_DEK_KIND_SEALED:
		return CAS_SEALED_DEK_SIZE;
	}
	return 0;
}

uint32_t cas_stored_dek_key_id(uint8_t kind, const unsigned char *stored)
{
	switch (kind) {
	case CAS_DEK_KIND_SERVER_WRAP:
		return cas_dek_wrapped_key_id(stored);
	case CAS_DEK_KIND_SEALED:
		/* kind (1) | key id (4, big-endian) | ... */
		return ((uint32_t)stored[1] << 24) |
			((uint32_t)stored[2] << 16) |
			((uint32_t)stored[3] << 8) | stored[4];
	}
	return 0;
}

int cas_keyring_dek_protect(const struct cas_keyring *keyring,
			    const struct cas_blob_id *id,
			    const unsigned char dek[CAS_DEK_SIZE],
			    uint8_t *kind_r,
			    unsigned char stored_r[CAS_STORED_DEK_MAX_SIZE],
			    const char **error_r)
{
	const struct cas_userkey *userkey = cas_keyring_get_userkey(keyring);

	if (userkey == NULL) {
		*kind_r = CAS_DEK_KIND_SERVER_WRAP;
		cas_dek_wrap(keyring, id, dek, stored_r);
		return 1;
	}
	*kind_r = CAS_DEK_KIND_SEALED;
	if (cas_dek_seal_to_public(userkey, id, dek, stored_r) < 0) {
		*error_r = "sealing the DEK failed: "
			"the user key file's public key is unusable";
		return -1;
	}
	return 1;
}

int cas_keyring_dek_open(const struct cas_keyring *keyring,
			 const struct cas_blob_id *id, uint8_t kind,
			 const unsigned char *stored,
			 unsigned char dek_r[CAS_DEK_SIZE],
			 const char **error_r)
{
	const struct cas_userkey *userkey = cas_keyring_get_userkey(keyring);

	sodium_memzero(dek_r, CAS_DEK_SIZE);
	switch (kind) {
	case CAS_DEK_KIND_SERVER_WRAP:
		if (userkey != NULL) {
			*error_r = "DEK is wrapped by a server key "
				"(casbox_key_mode=server), but the store "
				"uses a password-mode user key";
			return -1;
		}
		return cas_dek_unwrap(keyring, id, stored, dek_r, error_r);
	case CAS_DEK_KIND_SEALED:
		if (userkey == NULL) {
			*error_r = "DEK is sealed to a user key "
				"(casbox_key_mode=password), but the store "
				"uses a server key";
			return -1;
		}
		if (!cas_userkey_is_unlocked(userkey)) {
			*error_r = "user key is locked: casbox_key_mode="
				"password needs the user's password "
				"(casbox_key_password, set from %w at "
				"IMAP/POP3 login) to read mail";
			return -1;
		}
		return cas_dek_open_sealed(userkey, id, stored, dek_r,
					   error_r);
	}
	*error_r = t_strdup_printf("unknown DEK kind 0x%02x", kind);
	return -1;
}

int cas_keyring_dek_verify(const struct cas_keyring *keyring,
			   const struct cas_blob_id *id, uint8_t kind,
			   const unsigned char *stored, const char **error_r)
{
	const struct cas_userkey *userkey = cas_keyring_get_userkey(keyring);

	if (userkey == NULL)
		return 0;
	if (kind != CAS_DEK_KIND_SEALED) {
		*error_r = t_strdup_printf("DEK of kind 0x%02x, but the "
					   "store uses a password-mode user "
					   "key", kind);
		return -1;
	}
	return cas_dek_sealed_verify(userkey, id, stored, error_r);
}
