/* fts-casidx: settings from Dovecot 2.4's typed settings. */

#include "lib.h"
#include "settings.h"
#include "settings-parser.h"
#include "mail-user.h"
#include "fts-api-private.h"
#include "casbox-settings-24.h"
#include "fts-casidx-settings-24.h"
#include "fts-casidx-settings.h"

static const char *casidx_str(const char *value)
{
	return value[0] == '\0' ? NULL : t_strdup(value);
}

/* casbox_key_* as the casbox storage reads them: at the user's level
   or inside casbox { }. */
static int
casidx_key_settings_get(struct mail_user *user,
			struct fts_casidx_settings *set_r,
			const char **error_r)
{
	const struct casbox_24_settings *set;

	if (casbox_24_settings_get(user, &set, error_r) < 0)
		return -1;
	set_r->key_file = casidx_str(set->key_file);
	set_r->key_mode = casidx_str(set->key_mode);
	set_r->key_password = casidx_str(set->key_password);
	settings_free(set);
	return 0;
}

int fts_casidx_settings_get(struct fts_backend *backend,
			    struct mail_user *user,
			    struct fts_casidx_settings *set_r,
			    const char **error_r)
{
	const struct fts_casidx_24_settings *set;

	i_zero(set_r);
	/* backend->event carries the "fts casidx { }" filter */
	if (settings_get(backend->event, &fts_casidx_setting_parser_info, 0,
			 &set, error_r) < 0)
		return -1;
	set_r->index.memory_budget = set->memory_budget;
	set_r->index.merge_threshold = set->merge_segments;
	set_r->index.lock_timeout_secs = set->lock_timeout;
	set_r->index.no_fsync = set->no_fsync;
	set_r->encrypt = t_strdup(set->encrypt);
	settings_free(set);
	return casidx_key_settings_get(user, set_r, error_r);
}
