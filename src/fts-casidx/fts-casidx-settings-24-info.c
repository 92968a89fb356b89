/* fts-casidx: the Dovecot 2.4 settings definitions, linked into the
   plugin and into lib21_fts_casidx_settings.so for the config process. */

#include "lib.h"
#include "settings-parser.h"
#include "fts-casidx-settings-24.h"

#undef DEF
#define DEF(type, name) \
	SETTING_DEFINE_STRUCT_##type("fts_casidx_"#name, name, \
				     struct fts_casidx_24_settings)

static const struct setting_define fts_casidx_setting_defines[] = {
	{ .type = SET_FILTER_NAME, .key = FTS_CASIDX_SETTINGS_FILTER },
	DEF(SIZE, memory_budget),
	DEF(UINT, merge_segments),
	DEF(UINT, lock_timeout),
	DEF(BOOL, no_fsync),
	DEF(ENUM, encrypt),
	SETTING_DEFINE_LIST_END
};

/* 0 = the index's own defaults, as when 2.3's plugin {} lacks the key */
static const struct fts_casidx_24_settings fts_casidx_default_settings = {
	.memory_budget = 0,
	.merge_segments = 0,
	.lock_timeout = 0,
	.no_fsync = FALSE,
	.encrypt = "auto:yes:no",
};

const struct setting_parser_info fts_casidx_setting_parser_info = {
	.name = "fts_casidx",

	.defines = fts_casidx_setting_defines,
	.defaults = &fts_casidx_default_settings,

	.struct_size = sizeof(struct fts_casidx_24_settings),
	.pool_offset1 = 1 + offsetof(struct fts_casidx_24_settings, pool),
};
