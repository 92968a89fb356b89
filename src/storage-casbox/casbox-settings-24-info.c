/* casbox: the Dovecot 2.4 settings definitions. Linked into the storage
   plugin, the FTS plugin (which reads the key settings) and
   lib20_casbox_settings.so, which Dovecot's config process loads from
   the settings module directory to learn these keys. */

#include "lib.h"
#include "settings.h"
#include "settings-parser.h"
#include "mail-user.h"
#include "casbox-storage.h"
#include "casbox-settings.h"
#include "casbox-settings-24.h"

#undef DEF
#define DEF(type, name) \
	SETTING_DEFINE_STRUCT_##type("casbox_"#name, name, \
				     struct casbox_24_settings)

static const struct setting_define casbox_setting_defines[] = {
	{ .type = SET_FILTER_NAME, .key = CASBOX_SETTINGS_FILTER },
	DEF(STR, key_file),
	DEF(BOOL, key_autocreate),
	DEF(ENUM, key_mode),
	DEF(STR, key_password),
	DEF(UINT, zstd_level),
	DEF(SIZE, part_split_size),
	DEF(SIZE, metadata_min_size),
	DEF(SIZE, pack_size),
	DEF(SIZE, lsm_wal_size),
	DEF(SIZE, lsm_cache_size),
	DEF(SIZE, base_cache_size),
	DEF(UINT, gc_dead_ratio),
	DEF(UINT, dict_autotrain),
	DEF(BOOL, cache_plaintext),
	DEF(TIME, duplicate_window),
	DEF(TIME, expunge_retention),
	DEF(BOOL, dedup),
	DEF(BOOL, decode_base64),
	DEF(BOOL, cross_message),
	DEF(ENUM, cipher),
	DEF(STR, pack_storage),
	DEF(STR, pack_cache_dir),
	DEF(SIZE, pack_cache_size),
	SETTING_DEFINE_LIST_END
};

static const struct casbox_24_settings casbox_default_settings = {
	.key_file = "",
	.key_autocreate = FALSE,
	.key_mode = "server:password",
	.key_password = "",
	.zstd_level = CASBOX_DEFAULT_ZSTD_LEVEL,
	.part_split_size = CASBOX_DEFAULT_PART_SPLIT_SIZE,
	.metadata_min_size = CASBOX_DEFAULT_METADATA_MIN_SIZE,
	.pack_size = CASBOX_DEFAULT_PACK_SIZE,
	.lsm_wal_size = CASBOX_DEFAULT_LSM_WAL_SIZE,
	.lsm_cache_size = CASBOX_DEFAULT_LSM_CACHE_SIZE,
	.base_cache_size = CASBOX_DEFAULT_BASE_CACHE_SIZE,
	.gc_dead_ratio = CASBOX_DEFAULT_GC_DEAD_RATIO,
	.dict_autotrain = CASBOX_DEFAULT_DICT_AUTOTRAIN,
	.cache_plaintext = FALSE,
	.duplicate_window = CASBOX_DEFAULT_DUPLICATE_WINDOW,
	.expunge_retention = CASBOX_DEFAULT_EXPUNGE_RETENTION,
	.dedup = TRUE,
	.decode_base64 = TRUE,
	.cross_message = TRUE,
	.cipher = "auto:aes-256-gcm:xchacha20-poly1305",
	.pack_storage = "",
	.pack_cache_dir = "",
	.pack_cache_size = 0,
};

/* What 2.3's get_list_settings() vfunc filled in: the list layout's
   directory names and the default mail_path, for mail_driver = casbox. */
static const struct setting_keyvalue casbox_default_settings_keyvalue[] = {
	{ CASBOX_SETTINGS_FILTER"/mailbox_root_directory_name",
	  CASBOX_MAILBOX_DIR_NAME },
	{ CASBOX_SETTINGS_FILTER"/mailbox_directory_name",
	  CASBOX_MAILDIR_NAME },
	{ CASBOX_SETTINGS_FILTER"/mailbox_subscriptions_filename",
	  CASBOX_SUBSCRIPTION_FILE_NAME },
	{ CASBOX_SETTINGS_FILTER"/mail_path", "%{home}/casbox" },
	{ NULL, NULL }
};

const struct setting_parser_info casbox_setting_parser_info = {
	.name = "casbox",

	.defines = casbox_setting_defines,
	.defaults = &casbox_default_settings,
	.default_settings = casbox_default_settings_keyvalue,

	.struct_size = sizeof(struct casbox_24_settings),
	.pool_offset1 = 1 + offsetof(struct casbox_24_settings, pool),
};

int casbox_24_settings_get(struct mail_user *user,
			   const struct casbox_24_settings **set_r,
			   const char **error_r)
{
	struct event *event;
	int ret;

	event = event_create(user->event);
	settings_event_add_filter_name(event, CASBOX_SETTINGS_FILTER);
	ret = settings_get(event, &casbox_setting_parser_info, 0,
			   set_r, error_r);
	event_unref(&event);
	return ret;
}
