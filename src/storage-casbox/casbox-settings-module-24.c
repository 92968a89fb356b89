/* lib20_casbox_settings.so: loaded by Dovecot 2.4's config process from
   its settings module directory, so dovecot.conf may use casbox_* keys. */

#include "lib.h"
#include "settings-parser.h"
#include "casbox-settings-24.h"

extern const char *casbox_settings_version;
extern const struct setting_parser_info *casbox_settings_set_infos[];

const char *casbox_settings_version = DOVECOT_ABI_VERSION;
const struct setting_parser_info *casbox_settings_set_infos[] = {
	&casbox_setting_parser_info,
	NULL
};
