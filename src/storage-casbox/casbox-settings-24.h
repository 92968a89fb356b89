#ifndef CASBOX_SETTINGS_24_H
#define CASBOX_SETTINGS_24_H

/* Dovecot 2.4 typed settings: the same names and defaults as 2.3's
   plugin {} keys (doc/settings.md). Set at the top level, in a
   protocol/userdb/namespace scope, or inside "casbox { }" (the storage
   driver's named filter). casbox_settings_read() turns them into
   struct casbox_settings. */

struct casbox_24_settings {
	pool_t pool;
	const char *key_file;
	bool key_autocreate;
	const char *key_mode;
	const char *key_password;
	unsigned int zstd_level;
	uoff_t part_split_size;
	uoff_t metadata_min_size;
	uoff_t pack_size;
	const char *pack_storage;
	const char *pack_cache_dir;
	uoff_t pack_cache_size;
	uoff_t lsm_wal_size;
	uoff_t lsm_cache_size;
	uoff_t base_cache_size;
	unsigned int gc_dead_ratio;
	unsigned int dict_autotrain;
	bool cache_plaintext;
	unsigned int duplicate_window;
	unsigned int expunge_retention;
	bool dedup;
	bool decode_base64;
	bool cross_message;
	const char *cipher;
};

#define CASBOX_SETTINGS_FILTER "casbox"

extern const struct setting_parser_info casbox_setting_parser_info;

struct mail_user;

/* The user's casbox settings (top level and casbox { }), for the storage
   and for the FTS backend, which reads the key settings too. Free with
   settings_free(). Returns 0 ok, -1 error. */
int casbox_24_settings_get(struct mail_user *user,
			   const struct casbox_24_settings **set_r,
			   const char **error_r);

#endif
