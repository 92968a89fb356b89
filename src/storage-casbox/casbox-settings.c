/* casbox: plugin {} settings. */

#include "lib.h"
#include "strnum.h"
#include "settings-parser.h"
#include "mail-user.h"
#include "casbox-settings.h"

static int
casbox_setting_size(struct mail_user *user, const char *name,
		    uoff_t default_value, uoff_t min_value, uoff_t *size_r,
		    const char **error_r)
{
	const char *value = mail_user_plugin_getenv(user, name);
	const char *error;

	*size_r = default_value;
	if (value == NULL || *value == '\0')
		return 0;
	if (settings_get_size(value, size_r, &error) < 0) {
		*error_r = t_strdup_printf("%s: %s", name, error);
		return -1;
	}
	if (*size_r < min_value) {
		*error_r = t_strdup_printf("%s: must be at least %"PRIuUOFF_T,
					   name, min_value);
		return -1;
	}
	return 0;
}

static int
casbox_setting_uint(struct mail_user *user, const char *name,
		    unsigned int default_value, unsigned int max_value,
		    unsigned int *num_r, const char **error_r)
{
	const char *value = mail_user_plugin_getenv(user, name);

	*num_r = default_value;
	if (value == NULL || *value == '\0')
		return 0;
	if (str_to_uint(value, num_r) < 0 || *num_r > max_value) {
		*error_r = t_strdup_printf("%s: invalid value '%s' "
					   "(expected 0..%u)",
					   name, value, max_value);
		return -1;
	}
	return 0;
}

int casbox_settings_read(struct mail_user *user, pool_t pool,
			 struct casbox_settings *set_r,
			 const char **error_r)
{
	const char *value;
	unsigned int level;

	i_zero(set_r);
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
	if (set_r->key_mode == CAS_KEY_MODE_PASSWORD &&
	    set_r->cache_plaintext) {
		/* LMTP would fill the cache with headers in plaintext,
		   readable without the password */
		*error_r = "casbox_cache_plaintext=yes cannot be combined "
			"with casbox_key_mode=password";
		return -1;
	}
	value = mail_user_plugin_getenv(user, "casbox_key_password");
	if (value != NULL && *value != '\0')
		set_r->key_password = p_strdup(pool, value);

	if (casbox_setting_uint(user, "casbox_zstd_level",
				CASBOX_DEFAULT_ZSTD_LEVEL, 19,
				&level, error_r) < 0)
		return -1;
	set_r->zstd_level = level == 0 ? CASBOX_DEFAULT_ZSTD_LEVEL :
		(int)level;
	if (casbox_setting_size(user, "casbox_part_split_size",
				CASBOX_DEFAULT_PART_SPLIT_SIZE, 1024,
				&set_r->part_split_size, error_r) < 0)
		return -1;
	if (casbox_setting_size(user, "casbox_pack_size",
				CASBOX_DEFAULT_PACK_SIZE, 1024 * 1024,
				&set_r->pack_size, error_r) < 0)
		return -1;
	if (casbox_setting_size(user, "casbox_lsm_wal_size",
				CASBOX_DEFAULT_LSM_WAL_SIZE, 64 * 1024,
				&set_r->lsm_wal_size, error_r) < 0)
		return -1;
	if (casbox_setting_uint(user, "casbox_gc_dead_ratio",
				CASBOX_DEFAULT_GC_DEAD_RATIO, 100,
				&set_r->gc_dead_ratio, error_r) < 0)
		return -1;
	return 0;
}
