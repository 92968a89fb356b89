/* fts-casidx: plugin entry points and per-user setup, Dovecot 2.3 form. */

#include "lib.h"
#include "mail-storage-hooks.h"
#include "fts-user.h"
#include "fts-api-private.h"
#include "fts-casidx-plugin.h"
#include "cas-secmem.h"

const char *fts_casidx_plugin_version = DOVECOT_ABI_VERSION;
const char *fts_casidx_plugin_dependencies[] = { "fts", NULL };

#define FTS_CASIDX_USER_CONTEXT_REQUIRE(obj) \
	MODULE_CONTEXT_REQUIRE(obj, fts_casidx_user_module)

static MODULE_CONTEXT_DEFINE_INIT(fts_casidx_user_module,
				  &mail_user_module_register);

static void fts_casidx_mail_user_deinit(struct mail_user *user)
{
	struct fts_casidx_user *fuser = FTS_CASIDX_USER_CONTEXT_REQUIRE(user);

	fts_mail_user_deinit(user);
	fuser->module_ctx.super.deinit(user);
}

static void fts_casidx_mail_user_created(struct mail_user *user)
{
	struct mail_user_vfuncs *v = user->vlast;
	struct fts_casidx_user *fuser;
	const char *error;

	fuser = p_new(user->pool, struct fts_casidx_user, 1);
	/* casidx tokenizes by itself: lib-fts language chains are not
	   needed, so do not demand fts_languages/fts_tokenizers. */
	if (fts_mail_user_init(user, FALSE, &error) < 0) {
		i_error(CASIDX_LOG_PREFIX "%s", error);
		return;
	}
	fuser->module_ctx.super = *v;
	user->vlast = &fuser->module_ctx.super;
	v->deinit = fts_casidx_mail_user_deinit;
	MODULE_CONTEXT_SET(user, fts_casidx_user_module, fuser);
}

int fts_casidx_backend_user_init(struct fts_backend *backend ATTR_UNUSED,
				 const char **error_r ATTR_UNUSED)
{
	/* done in fts_casidx_mail_user_created() */
	return 0;
}

static struct mail_storage_hooks fts_casidx_mail_storage_hooks = {
	.mail_user_created = fts_casidx_mail_user_created,
};

void fts_casidx_plugin_init(struct module *module)
{
	fts_backend_register(&fts_backend_casidx);
	mail_storage_hooks_add(module, &fts_casidx_mail_storage_hooks);
}

void fts_casidx_plugin_deinit(void)
{
	fts_backend_unregister(fts_backend_casidx.name);
	cas_secmem_pool_deinit();
	mail_storage_hooks_remove(&fts_casidx_mail_storage_hooks);
}
