/* casbox: settings from Dovecot 2.3's plugin {} block. */

#include "lib.h"
#include "strnum.h"
#include "settings-parser.h"
#include "mail-user.h"
#include "casbox-settings.h"

/* Sizes and numbers: unset or empty keeps the default; the ranges are
   checked by casbox_settings_check(). */
static int
casbox_setting_size(struct mail_user *user, const char *name,
		    uoff_t *size, const char **error_r)
{
	const char *value = mail_user_plugin_getenv(user, name);
	const char *error;

	if (value == NULL || *value == '\0')
		return 0;
	if (settings_get_size(value, size, &error) < 0) {
		*error_r = t_strdup_printf("%s: %s", name, error);
		return -1;
	}
	return 0;
}

static int
casbox_setting_uint(struct mail_user *user, const char *name,
		    unsigned int *num, const char **error_r)
{
	const char *value = mail_user_plugin_getenv(user, name);

	if (value == NULL || *value == '\0')
		return 0;
	if (str_to_uint(value, num) < 0 || *num > INT_MAX) {
		*error_r = t_strdup_printf("%s: invalid value '%s'",
					   name, value);
		return -1;
	}
	return 0;
}

/* Dovecot time units (s, min, h, d, w); a bare number is seconds. */
static int
casbox_setting_time(struct mail_user *user, const char *name,
		    unsigned int *secs, const char **error_r)
{
	const char *value = mail_user_plugin_getenv(user, name);
	const char *error;

	if (value == NULL || *value == '\0')
		return 0;
	if (settings_get_time(value, secs, &error) < 0) {
		*error_r = t_strdup_printf("%s: %s", name, error);
		return -1;
	}
	return 0;
}

int casbox_settings_read(struct mail_user *user, pool_t pool,
			 struct casbox_settings *set_r,
			 const char **error_r)
{
	const char *value;
	unsigned int level = CASBOX_DEFAULT_ZSTD_LEVEL;

	casbox_settings_defaults(set_r);
	value = mail_user_plugin_getenv(user, "casbox_key_file");
	if (value != NULL && *value != '\0') {
		set_r->key_file =
			p_strdup(pool, mail_user_home_expand(user, value));
	}
	set_r->key_autocreate =
		mail_user_plugin_getenv_bool(user, "casbox_key_autocreate");
	set_r->cache_plaintext =
		mail_user_plugin_getenv_bool(user, "casbox_cache_plaintext");
	value = mail_user_plugin_getenv(user, "casbox_key_mode");
	if (value != NULL && *value != '\0' &&
	    cas_key_mode_parse(value, &set_r->key_mode) < 0) {
		*error_r = t_strdup_printf("casbox_key_mode: invalid value "
					   "'%s' (expected server or password)",
					   value);
		return -1;
	}
	value = mail_user_plugin_getenv(user, "casbox_dedup");
	if (value != NULL && *value != '\0') {
		if (strcmp(value, "yes") != 0 && strcmp(value, "no") != 0) {
			*error_r = t_strdup_printf("casbox_dedup: invalid "
				"value '%s' (expected yes or no)", value);
			return -1;
		}
		set_r->dedup_disabled = strcmp(value, "no") == 0;
	}
	value = mail_user_plugin_getenv(user, "casbox_decode_base64");
	if (value != NULL && *value != '\0') {
		if (strcmp(value, "yes") != 0 && strcmp(value, "no") != 0) {
			*error_r = t_strdup_printf("casbox_decode_base64: "
				"invalid value '%s' (expected yes or no)",
				value);
			return -1;
		}
		set_r->decode_base64_disabled = strcmp(value, "no") == 0;
	}
	value = mail_user_plugin_getenv(user, "casbox_cross_message");
	if (value != NULL && *value != '\0') {
		if (strcmp(value, "yes") != 0 && strcmp(value, "no") != 0) {
			*error_r = t_strdup_printf("casbox_cross_message: "
				"invalid value '%s' (expected yes or no)",
				value);
			return -1;
		}
		set_r->cross_message_disabled = strcmp(value, "no") == 0;
	}
	value = mail_user_plugin_getenv(user, "casbox_cipher");
	if (value != NULL && *value != '\0' &&
	    cas_aead_cipher_parse(value, &set_r->cipher) < 0) {
		*error_r = t_strdup_printf("casbox_cipher: invalid value '%s' "
			"(expected auto, aes-256-gcm or xchacha20-poly1305)",
			value);
		return -1;
	}
	value = mail_user_plugin_getenv(user, "casbox_key_password");
	if (value != NULL && *value != '\0')
		set_r->key_password = p_strdup(pool, value);

	value = mail_user_plugin_getenv(user, "casbox_pack_storage");
	if (value != NULL && *value != '\0')
		set_r->pack_storage = p_strdup(pool, value);
	value = mail_user_plugin_getenv(user, "casbox_pack_cache_dir");
	if (value != NULL && *value != '\0') {
		set_r->pack_cache_dir =
			p_strdup(pool, mail_user_home_expand(user, value));
	}
	if (casbox_setting_size(user, "casbox_pack_cache_size",
				&set_r->pack_cache_size, error_r) < 0)
		return -1;
	if (casbox_setting_uint(user, "casbox_zstd_level", &level,
				error_r) < 0 ||
	    casbox_setting_size(user, "casbox_part_split_size",
				&set_r->part_split_size, error_r) < 0 ||
	    casbox_setting_size(user, "casbox_metadata_min_size",
				&set_r->metadata_min_size, error_r) < 0 ||
	    casbox_setting_size(user, "casbox_pack_size",
				&set_r->pack_size, error_r) < 0 ||
	    casbox_setting_size(user, "casbox_lsm_wal_size",
				&set_r->lsm_wal_size, error_r) < 0 ||
	    casbox_setting_size(user, "casbox_lsm_cache_size",
				&set_r->lsm_cache_size, error_r) < 0 ||
	    casbox_setting_size(user, "casbox_base_cache_size",
				&set_r->base_cache_size, error_r) < 0 ||
	    casbox_setting_uint(user, "casbox_gc_dead_ratio",
				&set_r->gc_dead_ratio, error_r) < 0 ||
	    casbox_setting_uint(user, "casbox_dict_autotrain",
				&set_r->dict_autotrain, error_r) < 0 ||
	    casbox_setting_time(user, "casbox_duplicate_window",
				&set_r->duplicate_window, error_r) < 0 ||
	    casbox_setting_time(user, "casbox_expunge_retention",
				&set_r->expunge_retention, error_r) < 0)
		return -1;
	set_r->zstd_level = (int)level;
	return casbox_settings_check(set_r, error_r);
}
