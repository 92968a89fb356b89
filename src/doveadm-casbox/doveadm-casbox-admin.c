/* doveadm casbox: finding a mail user's casbox store. */

#include "lib.h"
#include "array.h"
#include "mail-user.h"
#include "mail-namespace.h"
#include "mail-storage-private.h"
#include "mailbox-list.h"
#include "doveadm-mail.h"
#include "casbox-events.h"
#include "doveadm-casbox.h"

static struct mail_namespace *casbox_admin_find_ns(struct mail_user *user)
{
	struct mail_namespace *ns;

	for (ns = user->namespaces; ns != NULL; ns = ns->next) {
		if (ns->storage != NULL &&
		    strcmp(ns->storage->name, "casbox") == 0)
			return ns;
	}
	return NULL;
}

static int
casbox_admin_open_full(struct mail_user *user, bool open_lsm,
		       struct casbox_admin **adm_r, const char **error_r);

int casbox_admin_open(struct mail_user *user, struct casbox_admin **adm_r,
		      const char **error_r)
{
	return casbox_admin_open_full(user, TRUE, adm_r, error_r);
}

int casbox_admin_open_failed(struct doveadm_mail_cmd_context *ctx,
			     const char *cmd, struct mail_user *user,
			     int ret, const char *error)
{
	if (!ctx->iterate_single_user &&
	    (ret == 0 || casbox_admin_find_ns(user) == NULL)) {
		/* visible with doveadm -D */
		i_debug("%s: %s: skipped", cmd, error);
		return 0;
	}
	i_error("%s: %s", cmd, error);
	if (ret < 0 && (strstr(error, "is not the key of store") != NULL ||
			strstr(error, "is damaged") != NULL)) {
		/* the store opens its key first (its LSM is sealed with it):
		   a wrong or damaged key file is bad data, not a retry */
		ctx->exit_code = EX_DATAERR;
		return -1;
	}
	doveadm_mail_failed_error(ctx, ret == 0 ? MAIL_ERROR_NOTFOUND :
				  MAIL_ERROR_TEMP);
	return -1;
}

int casbox_admin_open_nolsm(struct mail_user *user,
			    struct casbox_admin **adm_r,
			    const char **error_r)
{
	return casbox_admin_open_full(user, FALSE, adm_r, error_r);
}

static int
casbox_admin_open_full(struct mail_user *user, bool open_lsm,
		       struct casbox_admin **adm_r, const char **error_r)
{
	struct casbox_settings *set;
	struct mail_namespace *ns;
	const char *error;
	pool_t pool;
	int ret;

	ns = casbox_admin_find_ns(user);
	if (ns == NULL) {
		*error_r = "user has no casbox namespace";
		return -1;
	}
	pool = pool_alloconly_create("doveadm casbox settings", 512);
	set = p_new(pool, struct casbox_settings, 1);
	if (casbox_settings_read(user, pool, set, &error) < 0) {
		*error_r = t_strdup_printf("casbox settings: %s", error);
		pool_unref(&pool);
		return -1;
	}
	set->event = casbox_event_create(user->event);
	ret = casbox_admin_open_root_full(mailbox_list_get_root_forced(
					ns->list, MAILBOX_LIST_PATH_TYPE_DIR),
				     set, ns->storage->set->parsed_fsync_mode,
				     ns->storage->set->parsed_lock_method,
				     open_lsm, adm_r, error_r);
	/* the admin's event (and the store's) hold their own reference */
	event_unref(&set->event);
	if (ret <= 0) {
		pool_unref(&pool);
		return ret;
	}
	(*adm_r)->user = user;
	(*adm_r)->set_pool = pool;
	return 1;
}
