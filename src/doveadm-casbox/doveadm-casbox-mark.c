/* doveadm casbox: set a keyword on messages through lib-storage (scrub
   --repair marks damaged messages), so that the index, every IMAP client
   and the casbox LSM mirror of the flags see the same thing. */

#include "lib.h"
#include "mail-user.h"
#include "mail-namespace.h"
#include "mail-storage.h"
#include "doveadm-casbox.h"

static int
casbox_mark_box_open(struct mail_user *user, const char *vname,
		     struct mailbox **box_r, const char **error_r)
{
	struct mail_namespace *ns;
	struct mailbox *box;

	ns = mail_namespace_find(user->namespaces, vname);
	box = mailbox_alloc(ns->list, vname, MAILBOX_FLAG_IGNORE_ACLS);
	if (mailbox_open(box) < 0 || mailbox_sync(box, 0) < 0) {
		*error_r = t_strdup_printf("mailbox %s: %s", vname,
			mailbox_get_last_internal_error(box, NULL));
		mailbox_free(&box);
		return -1;
	}
	*box_r = box;
	return 0;
}

/* Mark uids[0..count) of one mailbox. Returns the number changed, or
   -1. */
static int
casbox_mark_box(struct mailbox *box, const char *keyword, bool add,
		const uint32_t *uids, unsigned int count, bool *changed_r,
		const char **error_r)
{
	const char *const names[] = { keyword, NULL };
	struct mailbox_transaction_context *t;
	struct mail_keywords *kw;
	struct mail *mail;
	unsigned int i;
	int changed = 0;
	bool has;

	/* not FLAG_EXTERNAL: that would tell the index the backend has
	   the change already, and the sync would not mirror it */
	t = mailbox_transaction_begin(box, 0, "casbox scrub");
	if (mailbox_keywords_create(box, names, &kw) < 0) {
		*error_r = t_strdup_printf("keyword %s: %s", keyword,
			mailbox_get_last_internal_error(box, NULL));
		mailbox_transaction_rollback(&t);
		return -1;
	}
	mail = mail_alloc(t, 0, NULL);
	for (i = 0; i < count; i++) {
		changed_r[i] = FALSE;
		if (!mail_set_uid(mail, uids[i]))
			continue; /* expunged meanwhile */
		has = str_array_icase_find(mail_get_keywords(mail), keyword);
		if (has == add)
			continue;
		mail_update_keywords(mail, add ? MODIFY_ADD : MODIFY_REMOVE,
				     kw);
		changed_r[i] = TRUE;
		changed++;
	}
	mail_free(&mail);
	mailbox_keywords_unref(&kw);
	if (mailbox_transaction_commit(&t) < 0) {
		*error_r = t_strdup_printf("mailbox %s: %s",
			mailbox_get_vname(box),
			mailbox_get_last_internal_error(box, NULL));
		return -1;
	}
	/* the sync mirrors the change into the LSM message records */
	if (mailbox_sync(box, 0) < 0) {
		*error_r = t_strdup_printf("mailbox %s: %s",
			mailbox_get_vname(box),
			mailbox_get_last_internal_error(box, NULL));
		return -1;
	}
	return changed;
}

int casbox_admin_set_keyword(struct mail_user *user, const char *keyword,
			     bool add, const char *const *vnames,
			     const uint32_t *uids, unsigned int count,
			     bool *changed_r, const char **error_r)
{
	struct mailbox *box;
	unsigned int i, j;
	int ret, changed = 0;

	/* the callers list the messages grouped by mailbox */
	for (i = 0; i < count; i = j) {
		for (j = i + 1; j < count; j++) {
			if (strcmp(vnames[j], vnames[i]) != 0)
				break;
		}
		if (casbox_mark_box_open(user, vnames[i], &box, error_r) < 0)
			return -1;
		ret = casbox_mark_box(box, keyword, add, uids + i, j - i,
				      changed_r + i, error_r);
		mailbox_free(&box);
		if (ret < 0)
			return -1;
		changed += ret;
	}
	return changed;
}
