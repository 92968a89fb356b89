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

void fts_casidx_plugin_init(struct module *module);
void fts_casidx_plugin_deinit(void);

#endif
