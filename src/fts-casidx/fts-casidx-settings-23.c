/* fts-casidx: settings from Dovecot 2.3's plugin {} block. */

#include "lib.h"
#include "strnum.h"
#include "settings-parser.h"
#include "mail-user.h"
#include "fts-casidx-settings.h"

static const char *
casidx_getenv(struct mail_user *user, const char *name)
{
	const char *value = mail_user_plugin_getenv(user, name);

	return value == NULL || value[0] == '\0' ? NULL : value;
}

/* A positive integer setting: dest is left alone when unset.
   Returns 0 ok, -1 invalid. */
static int casidx_setting_uint(struct mail_user *user, const char *name,
			       unsigned int *dest, const char **error_r)
{
	const char *value = mail_user_plugin_getenv(user, name);
	unsigned int num;

	if (value == NULL)
		return 0;
	if (str_to_uint(value, &num) < 0 || num == 0) {
		*error_r = t_strdup_printf("Invalid %s: %s", name, value);
		return -1;
	}
	*dest = num;
	return 0;
}

int fts_casidx_settings_get(struct fts_backend *backend ATTR_UNUSED,
			    struct mail_user *user,
			    struct fts_casidx_settings *set_r,
			    const char **error_r)
{
	const char *value;
	uoff_t size;

	i_zero(set_r);
	value = mail_user_plugin_getenv(user, "fts_casidx_memory_budget");
	if (value != NULL) {
		if (settings_get_size(value, &size, error_r) < 0) {
			*error_r = t_strdup_printf(
				"Invalid fts_casidx_memory_budget: %s", value);
			return -1;
		}
		set_r->index.memory_budget = size;
	}
	if (casidx_setting_uint(user, "fts_casidx_merge_segments",
				&set_r->index.merge_threshold, error_r) < 0 ||
	    casidx_setting_uint(user, "fts_casidx_lock_timeout",
				&set_r->index.lock_timeout_secs, error_r) < 0)
		return -1;
	set_r->index.no_fsync =
		mail_user_plugin_getenv_bool(user, "fts_casidx_no_fsync");
	set_r->encrypt = mail_user_plugin_getenv(user, "fts_casidx_encrypt");
	if (set_r->encrypt == NULL)
		set_r->encrypt = "auto";
	set_r->key_file = casidx_getenv(user, "casbox_key_file");
	set_r->key_mode = casidx_getenv(user, "casbox_key_mode");
	set_r->key_password = casidx_getenv(user, "casbox_key_password");
	return 0;
}
