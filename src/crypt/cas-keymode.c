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

/* How each key mode's key file is loaded and created: the key ring it
   gives carries its mode's backend (cas-key.c) from then on. */
struct cas_key_mode_file {
	int (*load)(const struct cas_key_settings *set,
		    struct cas_keyring **keyring_r, const char **error_r);
	int (*create)(const struct cas_key_settings *set,
		      struct cas_keyring **keyring_r, const char **error_r);
};

static int cas_key_server_load(const struct cas_key_settings *set,
			       struct cas_keyring **keyring_r,
			       const char **error_r)
{
	return cas_keyring_load(set->path, keyring_r, error_r);
}

static int cas_key_server_create(const struct cas_key_settings *set,
				 struct cas_keyring **keyring_r,
				 const char **error_r)
{
	return cas_keyring_create(set->path, keyring_r, error_r);
}

static int cas_key_password_load(const struct cas_key_settings *set,
				 struct cas_keyring **keyring_r,
				 const char **error_r)
{
	struct cas_userkey *userkey;
	int ret;

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

static int cas_key_password_create(const struct cas_key_settings *set,
				   struct cas_keyring **keyring_r,
				   const char **error_r)
{
	struct cas_userkey *userkey;

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

static const struct cas_key_mode_file cas_key_mode_files[] = {
	[CAS_KEY_MODE_SERVER] = {
		.load = cas_key_server_load,
		.create = cas_key_server_create,
	},
	[CAS_KEY_MODE_PASSWORD] = {
		.load = cas_key_password_load,
		.create = cas_key_password_create,
	},
};

static const struct cas_key_mode_file *
cas_key_mode_file(enum cas_key_mode mode)
{
	i_assert(mode < N_ELEMENTS(cas_key_mode_files));
	return &cas_key_mode_files[mode];
}

int cas_keyring_load_mode(const struct cas_key_settings *set,
			  struct cas_keyring **keyring_r,
			  const char **error_r)
{
	*keyring_r = NULL;
	return cas_key_mode_file(set->mode)->load(set, keyring_r, error_r);
}

int cas_keyring_create_mode(const struct cas_key_settings *set,
			    struct cas_keyring **keyring_r,
			    const char **error_r)
{
	*keyring_r = NULL;
	return cas_key_mode_file(set->mode)->create(set, keyring_r, error_r);
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

