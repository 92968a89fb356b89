/* casbox: mail storage plugin entry points. */

#include "lib.h"
#include "module-dir.h"
#include "mail-storage-private.h"
#include "casbox-storage.h"
#include "casbox-dict-auto.h"
#include "casbox-plugin.h"
#include "casbox-store.h"

#include <sodium.h>

const char *casbox_plugin_version = DOVECOT_ABI_VERSION;

static unsigned int casbox_plugin_refcount = 0;

void casbox_plugin_init(struct module *module ATTR_UNUSED)
{
	if (casbox_plugin_refcount++ > 0)
		return;
	/* libsodium must be initialised before any key is loaded
	   (sodium_malloc aborts otherwise); it is idempotent */
	if (sodium_init() < 0)
		i_fatal(CASBOX_LOG_PREFIX"sodium_init() failed");
	mail_storage_class_register(&casbox_storage);
}

void casbox_plugin_deinit(void)
{
	i_assert(casbox_plugin_refcount > 0);
	if (--casbox_plugin_refcount > 0)
		return;
	mail_storage_class_unregister(&casbox_storage);
	casbox_dict_autotrain_deinit();
	casbox_store_free_pools();
}
