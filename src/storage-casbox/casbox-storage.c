/* casbox storage class. Foundation stage: the class registers itself so
   that mail_location = casbox:... resolves, and refuses to create a
   storage with a clear error until the storage layer lands. */

#include "lib.h"
#include "mail-storage-private.h"
#include "mailbox-list-private.h"
#include "casbox-plugin.h"
#include "casbox-storage.h"

static struct mail_storage *casbox_storage_alloc(void)
{
	struct casbox_storage *storage;
	pool_t pool;

	pool = pool_alloconly_create("casbox storage", 512);
	storage = p_new(pool, struct casbox_storage, 1);
	storage->storage = casbox_storage;
	storage->storage.pool = pool;
	return &storage->storage;
}

static int
casbox_storage_create(struct mail_storage *storage ATTR_UNUSED,
		      struct mail_namespace *ns ATTR_UNUSED,
		      const char **error_r)
{
	*error_r = CASBOX_LOG_PREFIX "storage is not implemented yet";
	return -1;
}

static void
casbox_storage_get_list_settings(const struct mail_namespace *ns ATTR_UNUSED,
				 struct mailbox_list_settings *set)
{
	if (set->layout == NULL)
		set->layout = MAILBOX_LIST_NAME_FS;
	if (set->subscription_fname == NULL)
		set->subscription_fname = "subscriptions";
}

struct mail_storage casbox_storage = {
	.name = CASBOX_STORAGE_NAME,
	.class_flags = MAIL_STORAGE_CLASS_FLAG_UNIQUE_ROOT |
		MAIL_STORAGE_CLASS_FLAG_HAVE_MAIL_GUIDS |
		MAIL_STORAGE_CLASS_FLAG_HAVE_MAIL_SAVE_GUIDS |
		MAIL_STORAGE_CLASS_FLAG_BINARY_DATA,
	.v = {
		.alloc = casbox_storage_alloc,
		.create = casbox_storage_create,
		.destroy = index_storage_destroy,
		.get_list_settings = casbox_storage_get_list_settings,
	},
};
