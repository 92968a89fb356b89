/* lib21_fts_casidx_settings.so: loaded by Dovecot 2.4's config process
   from its settings module directory, so dovecot.conf may use the
   fts_casidx_* keys. */

#include "lib.h"
#include "settings-parser.h"
#include "fts-casidx-settings-24.h"

extern const char *fts_casidx_settings_version;
extern const struct setting_parser_info *fts_casidx_settings_set_infos[];

const char *fts_casidx_settings_version = DOVECOT_ABI_VERSION;
const struct setting_parser_info *fts_casidx_settings_set_infos[] = {
	&fts_casidx_setting_parser_info,
	NULL
};
