/* doveadm casbox rebuild --from-packs: the command around
   casbox_frompacks_rebuild_lsm(): afterwards every recovered mailbox's
   index is force-resynced from the new LSM, and one row of counts is
   printed. */

#include "lib.h"
#include "array.h"
#include "mail-namespace.h"
#include "mail-storage-private.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "casbox-storage.h"
#include "casbox-store.h"
#include "casbox-store-frompacks.h"
#include "casbox-store-objstore.h"
#include "doveadm-casbox.h"

#include <sysexits.h>
#include <unistd.h>

/* The user's casbox storage must open the new LSM, not a handle on the
   old one from before the swap. */
static void frompacks_reset_storage(struct mail_user *user)
{
	struct mail_namespace *ns;
	struct casbox_storage *storage;

	for (ns = user->namespaces; ns != NULL; ns = ns->next) {
		if (ns->storage == NULL ||
		    strcmp(ns->storage->name, CASBOX_STORAGE_NAME) != 0)
			continue;
		storage = CASBOX_STORAGE(ns->storage);
		if (storage->store != NULL)
			casbox_store_close(&storage->store);
	}
}

/* An intact index left out records of mail it had expunged (the
   packs keep recovery records until gc): release them, so they do not
   hold their blobs and records for ever. Returns 0 ok, -1 error. */
static int frompacks_release_expunged(struct casbox_frompacks *fp,
				      struct mailbox *box,
				      const struct casbox_frompacks_mailbox
				      *fmbox,
				      const char **error_r)
{
	struct casbox_mailbox *mbox = CASBOX_MAILBOX(box);
	const struct mail_index_header *hdr;
	struct casbox_frompacks_msg *msg;
	struct casbox_store *store;
	struct casbox_store_txn *txn;
	unsigned int count = 0;
	uint32_t seq;
	int ret = 0;

	if (!guid_128_equals(mbox->mailbox_guid, fmbox->guid))
		return 0;
	if (casbox_storage_get_store(mbox->storage, &store) < 0) {
		*error_r = mail_storage_get_last_internal_error(
			&mbox->storage->storage, NULL);
		return -1;
	}
	if (casbox_store_txn_begin(store, &txn, error_r) < 0)
		return -1;
	hdr = mail_index_get_header(box->view);
	array_foreach_elem(&fp->msg_list, msg) {
		if (msg->lost || msg->deleted || msg->uid >= hdr->next_uid ||
		    !guid_128_equals(msg->mailbox_guid, fmbox->guid) ||
		    mail_index_lookup_seq(box->view, msg->uid, &seq))
			continue;
		T_BEGIN {
			if (casbox_store_txn_expunge(txn, fmbox->guid,
						     msg->uid, error_r) < 0 ||
			    casbox_store_txn_checkpoint(txn, error_r) < 0)
				ret = -1;
		} T_END_PASS_STR_IF(ret < 0, error_r);
		if (ret < 0)
			break;
		count++;
	}
	if (ret < 0 || count == 0) {
		casbox_store_txn_rollback(&txn);
		return ret;
	}
	if (casbox_store_txn_commit(&txn, error_r) < 0)
		return -1;
	fp->expunged += count;
	return 0;
}

static int frompacks_resync_one(struct casbox_frompacks *fp,
				struct mail_user *user,
				const char *vname,
				const struct casbox_frompacks_mailbox *fmbox)
{
	struct mail_namespace *ns;
	struct mailbox *box;
	const char *error;
	int ret;

	ns = mail_namespace_find(user->namespaces, vname);
	if (ns == NULL) {
		i_error("casbox rebuild --from-packs: mailbox %s: "
			"no namespace", vname);
		return -1;
	}
	T_BEGIN {
		ret = casbox_rebuild_mailbox(ns->list, vname, &error);
		if (ret < 0) {
			i_error("casbox rebuild --from-packs: mailbox %s: "
				"index rebuild failed: %s", vname, error);
		}
	} T_END;
	if (ret < 0 || fmbox == NULL)
		return ret < 0 ? -1 : 0;

	box = mailbox_alloc(ns->list, vname, MAILBOX_FLAG_IGNORE_ACLS);
	if (mailbox_open(box) < 0 || mailbox_sync(box, 0) < 0) {
		error = mailbox_get_last_internal_error(box, NULL);
		ret = -1;
	} else {
		ret = frompacks_release_expunged(fp, box, fmbox, &error);
	}
	if (ret < 0) {
		i_error("casbox rebuild --from-packs: mailbox %s: "
			"releasing expunged records: %s", vname, error);
	}
	mailbox_free(&box);
	return ret;
}

/* Dovecot's index of every recovered mailbox from the new LSM. */
static int frompacks_resync(struct casbox_frompacks *fp, struct mail_user *user)
{
	struct casbox_frompacks_mailbox *mbox, *inbox = NULL;
	int ret = 0;

	frompacks_reset_storage(user);
	array_foreach_elem(&fp->mailbox_list, mbox) {
		if (strcmp(mbox->rec.name, "INBOX") == 0)
			inbox = mbox;
	}
	/* INBOX first: its forced resync recreates the directories of
	   the mailboxes the M records name */
	if (frompacks_resync_one(fp, user, "INBOX", inbox) < 0)
		ret = -1;
	array_foreach_elem(&fp->mailbox_list, mbox) {
		if (mbox != inbox &&
		    frompacks_resync_one(fp, user, mbox->rec.name, mbox) < 0)
			ret = -1;
	}
	return ret;
}

void casbox_frompacks_init_header(void)
{
	static const char *const fields[] = {
		"mailboxes", "messages", "blobs", "orphans",
		"damaged_frames", "lost_messages", "unreadable_records",
		"expunged", "deleted_mailboxes",
	};
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(fields); i++) {
		doveadm_print_header(fields[i], fields[i],
				     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	}
	doveadm_print_header_simple("old_lsm");
}

static void frompacks_print(struct casbox_frompacks *fp)
{
	doveadm_print_num(array_count(&fp->mailbox_list));
	doveadm_print_num(fp->messages);
	doveadm_print_num(fp->blob_count);
	doveadm_print_num(fp->orphans);
	doveadm_print_num(fp->damaged_frames);
	doveadm_print_num(fp->lost_messages);
	doveadm_print_num(fp->meta_unreadable);
	doveadm_print_num(fp->expunged);
	doveadm_print_num(fp->deleted_mailboxes);
	doveadm_print(fp->moved_to != NULL ? fp->moved_to : "-");
}

/* Password mode: the records and DEKs are sealed to the user key, so
   the rebuild needs the user's password, one line on stdin. Unlocking
   writes nothing; a wrong password fails before anything is locked or
   scanned. Returns 0 ok, -1 error (exit status set). */
static int frompacks_open_keys(struct doveadm_mail_cmd_context *ctx,
			       struct casbox_admin *adm)
{
	struct casbox_key_input *input = NULL;
	const char *error;
	int ret;

	if (adm->set.key_mode == CAS_KEY_MODE_PASSWORD &&
	    casbox_key_read_user_password(ctx, "casbox rebuild --from-packs",
					  adm->root_dir, &input,
					  &adm->key_password) < 0)
		return -1;
	ret = casbox_admin_open_keys(adm, &error);
	adm->key_password = NULL;
	casbox_key_input_free(&input);
	if (ret < 0) {
		i_error("casbox rebuild --from-packs: %s: %s",
			adm->root_dir, error);
		if (adm->set.key_mode == CAS_KEY_MODE_PASSWORD &&
		    strstr(error, "wrong password") != NULL)
			ctx->exit_code = EX_DATAERR;
		else
			doveadm_mail_failed_error(ctx, MAIL_ERROR_TEMP);
		return -1;
	}
	return 0;
}

/* A new server with only the key file and the object store: the packs
   there become stubs here, and the scan reads them through the cache. */
static int frompacks_adopt_remote(struct casbox_admin *adm,
				  const char **error_r)
{
	unsigned int adopted;

	if (casbox_store_adopt_remote(adm->store, &adopted, error_r) < 0)
		return -1;
	if (adopted > 0) {
		i_info("casbox rebuild --from-packs: %s: %u pack(s) found "
		       "only in object storage", adm->root_dir, adopted);
	}
	return 0;
}

int casbox_frompacks_run(struct doveadm_mail_cmd_context *ctx,
			 struct mail_user *user)
{
	struct casbox_frompacks *fp = NULL;
	struct casbox_admin *adm;
	const char *error;
	int ret;

	ret = casbox_admin_open_nolsm(user, &adm, &error);
	if (ret <= 0) {
		return casbox_admin_open_failed(ctx,
			"casbox rebuild --from-packs", user, ret, error);
	}
	if (frompacks_open_keys(ctx, adm) < 0) {
		casbox_admin_close(&adm);
		return -1;
	}
	if (ret > 0 && frompacks_adopt_remote(adm, &error) < 0) {
		i_error("casbox rebuild --from-packs: %s: %s",
			adm->root_dir, error);
		doveadm_mail_failed_error(ctx, MAIL_ERROR_TEMP);
		casbox_admin_close(&adm);
		return -1;
	}
	if (ret > 0) {
		fp = casbox_frompacks_init(adm->store);
		ret = casbox_frompacks_rebuild_lsm(fp, &error);
	}
	if (ret < 0) {
		i_error("casbox rebuild --from-packs: %s: %s",
			adm->root_dir, error);
		doveadm_mail_failed_error(ctx, MAIL_ERROR_TEMP);
	} else {
		if (frompacks_resync(fp, user) < 0) {
			doveadm_mail_failed_error(ctx, MAIL_ERROR_TEMP);
			ret = -1;
		}
		frompacks_print(fp);
		if (fp->lost_messages > 0 || fp->damaged_frames > 0) {
			i_warning("casbox rebuild --from-packs: %s: %u "
				  "message(s) lost, %u damaged frame(s)",
				  adm->root_dir, fp->lost_messages,
				  fp->damaged_frames);
		}
	}
	if (fp != NULL)
		casbox_frompacks_deinit(&fp);
	casbox_admin_close(&adm);
	return ret;
}
