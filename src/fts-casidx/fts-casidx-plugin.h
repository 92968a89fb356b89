#ifndef FTS_CASIDX_PLUGIN_H
#define FTS_CASIDX_PLUGIN_H

#include "module-context.h"
#include "mail-user.h"

#define CASIDX_LOG_PREFIX "fts-casidx: "

struct fts_casidx_user {
	union mail_user_module_context module_ctx;
};

extern const char *fts_casidx_plugin_dependencies[];
extern const char *fts_casidx_plugin_version;
extern struct fts_backend fts_backend_casidx;

/* Dovecot 2.4 initialises the fts user from the backend's init (with
   its settings event), 2.3 at mail_user_created. Returns 0 ok, -1 error. */
int fts_casidx_backend_user_init(struct fts_backend *backend,
				 const char **error_r);

void fts_casidx_plugin_init(struct module *module);
void fts_casidx_plugin_deinit(void);

#endif
