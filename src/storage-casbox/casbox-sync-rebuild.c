/* casbox: index rebuild from the LSM. Unlike sdbox, which can only list
   its u.<uid> files, the records hold everything the index did except
   \Recent, private flags and the cache: flags, keywords and modseqs are
   mirrored there after every sync, UIDVALIDITY, name and next UID are in
   the mailbox record. */

#include "lib.h"
#include "casbox-storage.h"
#include "array.h"
#include "mail-index-modseq.h"
#include "mailbox-uidvalidity.h"
#include "mail-namespace.h"
#include "index-rebuild.h"
#include "casbox-plugin.h"
#include "casbox-store.h"
#include "casbox-sync-rebuild.h"

#include <sys/stat.h>

struct casbox_rebuild_context {
	struct casbox_mailbox *mbox;
	struct index_rebuild_context *ictx;

	/* header of the index before the reset (zeroed if it had none) */
	struct mail_index_header old_hdr;
	guid_128_t mailbox_guid;
	/* the public GUID (empty = mailbox_guid) */
	guid_128_t public_guid;
	uint32_t old_rebuild_count;
	/* the mailbox record (uid_validity 0 = none found) */
	struct casbox_mailbox_record mrec;

	uint32_t last_uid;
	/* every message taken from the mirror gets at least this modseq:
	   the highest modseq the mailbox ever had, as far as known */
	uint64_t base_modseq;
	uint64_t max_modseq;
	unsigned int added, from_index, skipped;
	/* records of expunges whose release did not finish: released with
	   the mailbox record once the rebuilt index is committed */
	ARRAY_TYPE(uint32_t) unreleased;
};

static bool
casbox_rebuild_in_old_index(struct casbox_rebuild_context *ctx, uint32_t uid)
{
	uint32_t seq;

	if (mail_index_lookup_seq(ctx->ictx->view, uid, &seq))
		return TRUE;
	return ctx->ictx->backup_view != NULL &&
		mail_index_lookup_seq(ctx->ictx->backup_view, uid, &seq);
}

static void
casbox_rebuild_set_mirror(struct casbox_rebuild_context *ctx, uint32_t seq,
			  const struct casbox_msg_record *rec)
{
	struct mail_index_transaction *trans = ctx->ictx->trans;
	ARRAY_TYPE(const_string) names;
	struct mail_keywords *kw;

	mail_index_update_flags(trans, seq, MODIFY_REPLACE,
				rec->flags & MAIL_FLAGS_NONRECENT);
	if (array_count(&rec->keywords) == 0)
		return;
	t_array_init(&names, array_count(&rec->keywords) + 1);
	array_append_array(&names, &rec->keywords);
	array_append_zero(&names);
	kw = mail_index_keywords_create(ctx->mbox->box.index,
					array_front(&names));
	mail_index_update_keywords(trans, seq, MODIFY_REPLACE, kw);
	mail_index_keywords_unref(&kw);
}

static void
casbox_rebuild_add_msg(void *context, uint32_t uid,
		       const struct casbox_msg_record *rec)
{
	struct casbox_rebuild_context *ctx = context;
	uint32_t seq;

	if (uid == 0) {
		ctx->skipped++;
		return;
	}
	if (casbox_rebuild_in_old_index(ctx, uid)) {
		mail_index_append(ctx->ictx->trans, uid, &seq);
		/* the index is ahead of the mirror until the next sync */
		index_rebuild_index_metadata(ctx->ictx, seq, uid);
		ctx->from_index++;
	} else if (ctx->old_hdr.uid_validity != 0 &&
		   uid < ctx->old_hdr.next_uid) {
		/* expunged from the intact index, release unfinished */
		array_push_back(&ctx->unreleased, &uid);
		ctx->skipped++;
		return;
	} else {
		mail_index_append(ctx->ictx->trans, uid, &seq);
		casbox_rebuild_set_mirror(ctx, seq, rec);
	}
	/* the mirror may lag (a message never changed since its save
	   mirrors 0; enabling modseqs raises them all): only the
	   mailbox's highest modseq is safe */
	mail_index_update_modseq(ctx->ictx->trans, seq,
				 I_MAX(rec->modseq, ctx->base_modseq));
	ctx->max_modseq = I_MAX(ctx->max_modseq, rec->modseq);
	ctx->last_uid = uid;
	ctx->added++;
}

/* Which mailbox GUID and mailbox record the rebuild uses. Returns 0 ok,
   -1 error. */
static int
casbox_rebuild_find_mailbox(struct casbox_rebuild_context *ctx,
			    struct casbox_store *store)
{
	struct casbox_mailbox *mbox = ctx->mbox;
	struct casbox_index_header hdr;
	guid_128_t rec_guid;
	const char *error;
	bool need_resize;
	int ret;

	/* a new index (no UIDVALIDITY) carries only the random GUID of
	   the extension's init data: not the mailbox's */
	if (ctx->old_hdr.uid_validity != 0 &&
	    casbox_read_header(mbox, &hdr, FALSE, &need_resize) == 0) {
		guid_128_copy(ctx->mailbox_guid, hdr.mailbox_guid);
		guid_128_copy(ctx->public_guid, hdr.public_guid);
		ctx->old_rebuild_count = hdr.rebuild_count;
	}
	ret = casbox_store_mailbox_find(store, mailbox_get_vname(&mbox->box),
					pool_datastack_create(), rec_guid,
					&ctx->mrec, &error);
	if (ret < 0) {
		mailbox_set_critical(&mbox->box, CASBOX_LOG_PREFIX"%s", error);
		return -1;
	}
	if (ret == 0)
		i_zero(&ctx->mrec);
	else if (guid_128_is_empty(ctx->mailbox_guid)) {
		guid_128_copy(ctx->mailbox_guid, rec_guid);
		guid_128_copy(ctx->public_guid, ctx->mrec.guid);
	} else if (!guid_128_equals(ctx->mailbox_guid, rec_guid)) {
		/* the index knows better; the record is someone else's */
		e_warning(mbox->box.event, CASBOX_LOG_PREFIX
			  "Rebuild: mailbox record with this name has GUID %s, "
			  "the index %s: using the index's",
			  guid_128_to_string(rec_guid),
			  guid_128_to_string(ctx->mailbox_guid));
		i_zero(&ctx->mrec);
	}
	if (guid_128_is_empty(ctx->mailbox_guid))
		guid_128_generate(ctx->mailbox_guid);
	return 0;
}

static uint32_t casbox_rebuild_uidvalidity_next(struct mailbox_list *list)
{
	const char *path;

	path = mailbox_list_get_root_forced(list,
					    MAILBOX_LIST_PATH_TYPE_CONTROL);
	path = t_strconcat(path, "/"CASBOX_UIDVALIDITY_FILE_NAME, NULL);
	return mailbox_uidvalidity_next(list, path);
}

static void
casbox_rebuild_update_uint32(struct mail_index_transaction *trans,
			     size_t offset, uint32_t value, bool prepend)
{
	mail_index_update_header(trans, offset, &value, sizeof(value),
				 prepend);
}

/* After index_index_rebuild_deinit(), which took UIDVALIDITY, next UID
   and highest modseq from the old index or its backup: add what the
   store knows. Later header updates in a transaction win. */
static void casbox_rebuild_header(struct casbox_rebuild_context *ctx,
				  struct mail_index_transaction *trans,
				  const struct mail_index_header *backup_hdr)
{
	struct casbox_mailbox *mbox = ctx->mbox;
	struct casbox_index_header hdr;
	uint32_t next_uid;

	if (ctx->old_hdr.uid_validity == 0 &&
	    (backup_hdr == NULL || backup_hdr->uid_validity == 0) &&
	    ctx->mrec.uid_validity != 0) {
		casbox_rebuild_update_uint32(trans,
			offsetof(struct mail_index_header, uid_validity),
			ctx->mrec.uid_validity, TRUE);
	}
	next_uid = I_MAX(ctx->old_hdr.next_uid, ctx->mrec.next_uid);
	if (backup_hdr != NULL)
		next_uid = I_MAX(next_uid, backup_hdr->next_uid);
	next_uid = I_MAX(next_uid, ctx->last_uid + 1);
	casbox_rebuild_update_uint32(trans,
		offsetof(struct mail_index_header, next_uid), next_uid, FALSE);
	mail_index_update_highest_modseq(trans,
		I_MAX(ctx->max_modseq, ctx->base_modseq));

	/* the reset drops the extension: it comes back from its init data,
	   as sdbox does with its dbox-hdr */
	i_zero(&hdr);
	guid_128_copy(hdr.mailbox_guid, ctx->mailbox_guid);
	if (!guid_128_equals(ctx->public_guid, ctx->mailbox_guid))
		guid_128_copy(hdr.public_guid, ctx->public_guid);
	hdr.rebuild_count = ctx->old_rebuild_count + 1;
	if (hdr.rebuild_count == 0)
		hdr.rebuild_count = 1;
	mail_index_set_ext_init_data(mbox->box.index, mbox->hdr_ext_id,
				     &hdr, sizeof(hdr));
	casbox_mailbox_set_guids(mbox, &hdr);
}

void casbox_sync_rebuild_mirror_mailbox(struct casbox_mailbox *mbox,
					struct casbox_store_txn *txn)
{
	struct casbox_mailbox_record rec;
	const struct mail_index_header *hdr;
	struct mail_index_view *view;

	(void)mail_index_refresh(mbox->box.index);
	view = mail_index_view_open(mbox->box.index);
	hdr = mail_index_get_header(view);
	i_zero(&rec);
	rec.uid_validity = hdr->uid_validity;
	rec.name = mailbox_get_vname(&mbox->box);
	rec.next_uid = hdr->next_uid;
	rec.highest_modseq = mail_index_modseq_get_highest(view);
	guid_128_copy(rec.guid, mbox->public_guid);
	mail_index_view_close(&view);
	if (rec.uid_validity == 0 || guid_128_is_empty(mbox->mailbox_guid))
		return;
	/* never lowers what another process with a newer view wrote */
	casbox_store_txn_put_mailbox(txn, mbox->mailbox_guid, &rec);
}

/* Rewrite the mailbox record so that it matches the rebuilt index (it
   may be missing for a mailbox created before records existed), and
   finish the releases of expunged messages that a crash interrupted.
   The index said they were expunged; an expunge still finishing in
   another process finds the record gone, which it takes as done. */
static void casbox_rebuild_put_mailbox(struct casbox_rebuild_context *ctx,
				       struct casbox_store *store)
{
	struct casbox_mailbox *mbox = ctx->mbox;
	struct casbox_store_txn *txn;
	const uint32_t *uidp;
	const char *error;
	int ret = 0;

	if (casbox_store_txn_begin(store, &txn, &error) < 0)
		ret = -1;
	else {
		array_foreach(&ctx->unreleased, uidp) {
			if (ret < 0)
				break;
			T_BEGIN {
				ret = casbox_store_txn_expunge(txn,
					ctx->mailbox_guid, *uidp, &error);
				if (ret == 0 && casbox_store_txn_checkpoint(
						txn, &error) < 0)
					ret = -1;
			} T_END_PASS_STR_IF(ret < 0, &error);
		}
		if (ret < 0)
			casbox_store_txn_rollback(&txn);
		else {
			casbox_sync_rebuild_mirror_mailbox(mbox, txn);
			ret = casbox_store_txn_commit(&txn, &error);
		}
	}
	if (ret < 0) {
		mailbox_set_critical(&mbox->box, CASBOX_LOG_PREFIX
				     "Rebuild: %s", error);
	}
}

static int
casbox_rebuild_run(struct casbox_rebuild_context *ctx,
		   struct casbox_store *store,
		   struct mail_index_view *view,
		   struct mail_index_transaction *trans)
{
	struct mailbox *box = &ctx->mbox->box;
	struct mail_index_header backup_hdr;
	bool have_backup;
	const char *error;
	int ret = 0;

	ctx->old_hdr = *mail_index_get_header(view);
	if (casbox_rebuild_find_mailbox(ctx, store) < 0)
		return -1;

	ctx->base_modseq = I_MAX(ctx->mrec.highest_modseq,
				 mail_index_modseq_get_highest(view));
	ctx->ictx = index_index_rebuild_init(box, view, trans);
	have_backup = ctx->ictx->backup_view != NULL;
	if (have_backup) {
		backup_hdr = *mail_index_get_header(ctx->ictx->backup_view);
		ctx->base_modseq = I_MAX(ctx->base_modseq,
			mail_index_modseq_get_highest(ctx->ictx->backup_view));
	}
	if (casbox_store_msg_iterate(store, ctx->mailbox_guid,
				     casbox_rebuild_add_msg, ctx,
				     &error) < 0) {
		mailbox_set_critical(box, CASBOX_LOG_PREFIX
				     "Rebuild: reading records failed: %s",
				     error);
		ret = -1;
	}
	index_index_rebuild_deinit(&ctx->ictx,
				   casbox_rebuild_uidvalidity_next);
	if (ret == 0) {
		casbox_rebuild_header(ctx, trans,
				      have_backup ? &backup_hdr : NULL);
	}
	return ret;
}

int casbox_sync_index_rebuild(struct casbox_mailbox *mbox)
{
	struct casbox_rebuild_context ctx;
	struct mail_index_view *view;
	struct mail_index_transaction *trans;
	struct casbox_store *store;
	int ret;

	if (casbox_storage_get_store(mbox->storage, &store) < 0)
		return -1;
	i_zero(&ctx);
	ctx.mbox = mbox;
	i_array_init(&ctx.unreleased, 8);

	view = mail_index_view_open(mbox->box.index);
	trans = mail_index_transaction_begin(view,
			MAIL_INDEX_TRANSACTION_FLAG_EXTERNAL);
	ret = casbox_rebuild_run(&ctx, store, view, trans);
	if (ret < 0)
		mail_index_transaction_rollback(&trans);
	else {
		mail_index_unset_fscked(trans);
		if ((ret = mail_index_transaction_commit(&trans)) < 0)
			mailbox_set_index_error(&mbox->box);
	}
	mail_index_view_close(&view);
	if (ret < 0) {
		array_free(&ctx.unreleased);
		return -1;
	}

	casbox_rebuild_put_mailbox(&ctx, store);
	array_free(&ctx.unreleased);
	if (ctx.old_hdr.uid_validity == 0) {
		e_warning(mbox->box.event, CASBOX_LOG_PREFIX
			  "Index files were lost: recovered %u messages "
			  "from the LSM records (mailbox GUID %s)",
			  ctx.added, guid_128_to_string(ctx.mailbox_guid));
	} else {
		e_warning(mbox->box.event, CASBOX_LOG_PREFIX
			  "Rebuilt index from the LSM records: %u messages "
			  "(%u with flags from the old index), %u expunged "
			  "records left out and released", ctx.added,
			  ctx.from_index, ctx.skipped);
	}
	return 0;
}

int casbox_sync_rebuild_needed(struct casbox_mailbox *mbox)
{
	struct mail_index_header hdr;
	struct mail_index_view *view;
	struct casbox_mailbox_record rec;
	struct casbox_store *store;
	guid_128_t guid;
	const char *error;
	int ret;

	/* box->view may predate a commit this process just did */
	view = mail_index_view_open(mbox->box.index);
	hdr = *mail_index_get_header(view);
	mail_index_view_close(&view);
	if ((hdr.flags & MAIL_INDEX_HDR_FLAG_FSCKD) != 0) {
		/* lib-index fixed a broken index and may have dropped
		   records on the way */
		return 1;
	}
	if (hdr.uid_validity == 0 ? mbox->box.creating :
	    (hdr.messages_count != 0 || hdr.next_uid != 1))
		return 0;
	if (casbox_storage_get_store(mbox->storage, &store) < 0)
		return -1;
	ret = casbox_store_mailbox_find(store, mailbox_get_vname(&mbox->box),
					pool_datastack_create(), guid, &rec,
					&error);
	if (ret < 0) {
		mailbox_set_critical(&mbox->box, CASBOX_LOG_PREFIX"%s", error);
		return -1;
	}
	if (ret == 0 || hdr.uid_validity == 0)
		return ret;
	/* an empty index: only a rebuild if it is the record's mailbox
	   and that one had messages */
	return guid_128_equals(guid, mbox->mailbox_guid) &&
		rec.next_uid > 1 ? 1 : 0;
}

int casbox_sync_rebuild_create_update(struct casbox_mailbox *mbox,
				      struct mailbox_update *update_r,
				      guid_128_t public_guid_r)
{
	struct casbox_mailbox_record rec;
	struct casbox_store *store;
	const char *error;
	int ret;

	i_zero(update_r);
	if (casbox_storage_get_store(mbox->storage, &store) < 0)
		return -1;
	ret = casbox_store_mailbox_find(store, mailbox_get_vname(&mbox->box),
					pool_datastack_create(),
					update_r->mailbox_guid, &rec, &error);
	if (ret < 0) {
		e_error(mbox->box.event, CASBOX_LOG_PREFIX"%s", error);
		return -1;
	}
	if (ret == 0)
		return 0;
	update_r->uid_validity = rec.uid_validity;
	if (guid_128_is_empty(rec.guid))
		guid_128_copy(public_guid_r, update_r->mailbox_guid);
	else
		guid_128_copy(public_guid_r, rec.guid);
	e_warning(mbox->box.event, CASBOX_LOG_PREFIX
		  "Mailbox directory was lost: recreating it with mailbox "
		  "GUID %s and UIDVALIDITY %u from its record",
		  guid_128_to_string(update_r->mailbox_guid),
		  rec.uid_validity);
	/* INBOX is recreated on first access: when its directory went,
	   the others' probably did too */
	(void)casbox_sync_rebuild_mailbox_list(mbox->storage);
	return 1;
}

struct casbox_rebuild_list_context {
	struct casbox_storage *storage;
	unsigned int restored;
	int ret;
};

static void
casbox_rebuild_list_mailbox(void *context,
			    const guid_128_t mailbox_guid ATTR_UNUSED,
			    const struct casbox_mailbox_record *rec)
{
	struct casbox_rebuild_list_context *ctx = context;
	struct mail_storage *storage = &ctx->storage->storage;
	struct mail_namespace *ns;
	struct mailbox *box;
	const char *path;
	struct stat st;

	ns = mail_namespace_find(storage->user->namespaces, rec->name);
	if (ns == NULL || ns->storage != storage)
		return;
	box = mailbox_alloc(ns->list, rec->name, MAILBOX_FLAG_IGNORE_ACLS);
	if (mailbox_get_path_to(box, MAILBOX_LIST_PATH_TYPE_MAILBOX,
				&path) <= 0)
		;
	else if (stat(path, &st) == 0)
		;
	else if (errno != ENOENT) {
		mail_storage_set_critical(storage, "stat(%s) failed: %m", path);
		ctx->ret = -1;
	} else if (mailbox_mkdir(box, path,
				 MAILBOX_LIST_PATH_TYPE_MAILBOX) < 0) {
		mail_storage_copy_error(storage, box->storage);
		ctx->ret = -1;
	} else {
		e_warning(box->event, CASBOX_LOG_PREFIX
			  "Mailbox directory was lost: restored it from the "
			  "mailbox record");
		ctx->restored++;
	}
	mailbox_free(&box);
}

int casbox_sync_rebuild_mailbox_list(struct casbox_storage *storage)
{
	struct casbox_rebuild_list_context ctx;
	struct casbox_store *store;
	const char *error;

	i_zero(&ctx);
	ctx.storage = storage;
	if (casbox_storage_get_store(storage, &store) < 0)
		return -1;
	if (casbox_store_mailbox_iterate(store, casbox_rebuild_list_mailbox,
					 &ctx, &error) < 0) {
		mail_storage_set_critical(&storage->storage,
					  CASBOX_LOG_PREFIX"%s", error);
		return -1;
	}
	return ctx.ret < 0 ? -1 : (int)ctx.restored;
}
