#ifndef FTS_CASIDX_SETTINGS_24_H
#define FTS_CASIDX_SETTINGS_24_H

/* Dovecot 2.4 typed settings of the casidx backend; set inside
   "fts casidx { }" (or fts_casidx { }, or at any level). */
struct fts_casidx_24_settings {
	pool_t pool;
	uoff_t memory_budget;
	unsigned int merge_segments;
	unsigned int lock_timeout;
	bool no_fsync;
	const char *encrypt;
};

#define FTS_CASIDX_SETTINGS_FILTER "fts_casidx"

extern const struct setting_parser_info fts_casidx_setting_parser_info;

#endif
