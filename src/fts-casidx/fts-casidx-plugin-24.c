/* fts-casidx: plugin entry points, Dovecot 2.4 form. 2.4's fts plugin
   keeps the per-user state itself; the backend only asks for it. */

#include "lib.h"
#include "mail-namespace.h"
#include "fts-user.h"
#include "fts-api-private.h"
#include "fts-casidx-plugin.h"
#include "cas-secmem.h"

const char *fts_casidx_plugin_version = DOVECOT_ABI_VERSION;
const char *fts_casidx_plugin_dependencies[] = { "fts", NULL };

int fts_casidx_backend_user_init(struct fts_backend *backend,
				 const char **error_r)
{
	/* casidx tokenizes by itself: lib-language chains are not needed */
	return fts_mail_user_init(backend->ns->user, backend->event, FALSE,
				  error_r);
}

void fts_casidx_plugin_init(struct module *module ATTR_UNUSED)
{
	fts_backend_register(&fts_backend_casidx);
}

void fts_casidx_plugin_deinit(void)
{
	fts_backend_unregister(fts_backend_casidx.name);
	cas_secmem_pool_deinit();
}
