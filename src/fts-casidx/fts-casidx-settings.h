#ifndef FTS_CASIDX_SETTINGS_H
#define FTS_CASIDX_SETTINGS_H

#include "casidx-index.h"

struct fts_backend;
struct mail_user;

/* The fts_casidx_* settings and the casbox_key_* ones the backend reads
   to seal its segments, as Dovecot gives them: 2.3's plugin {} block
   (fts-casidx-settings-23.c) or 2.4's typed settings inside
   "fts casidx { }" (fts-casidx-settings-24.c). Same names and defaults
   in both; fts-backend-casidx.c checks them. */
struct fts_casidx_settings {
	/* 0 fields: the index's own defaults */
	struct casidx_index_settings index;
	/* fts_casidx_encrypt: "auto" (default), "yes" or "no" */
	const char *encrypt;
	/* casbox_key_file, casbox_key_mode, casbox_key_password:
	   NULL when unset; key_file not yet ~/-expanded */
	const char *key_file;
	const char *key_mode;
	const char *key_password;
};

/* Fill set_r (strings on the data stack). Returns 0 ok, -1 a value did
   not parse (error_r names it). */
int fts_casidx_settings_get(struct fts_backend *backend,
			    struct mail_user *user,
			    struct fts_casidx_settings *set_r,
			    const char **error_r);

#endif
