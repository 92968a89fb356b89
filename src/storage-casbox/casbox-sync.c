/* casbox: index sync. Expunges and flag changes are applied to the
   index under its sync lock like sdbox; the LSM records are updated
   after the index commit (a crash in between leaves only orphaned
   records, which a rebuild releases, never an index entry without its
   record). */

#include "lib.h"
#include "casbox-storage.h"
#include "array.h"
#include "ioloop.h"
#include "mail-index-modseq.h"
#include "mailbox-recent-flags.h"
#include "casbox-plugin.h"
#include "casbox-store.h"
#include "casbox-store-safety.h"
#include "casbox-sync.h"
#include "casbox-sync-rebuild.h"

static void casbox_sync_add(struct casbox_sync_context *ctx,
			    const struct mail_index_sync_rec *sync_rec)
{
	uint32_t seq, seq1, seq2, uid;

	switch (sync_rec->type) {
	case MAIL_INDEX_SYNC_TYPE_EXPUNGE:
		break;
	case MAIL_INDEX_SYNC_TYPE_FLAGS:
	case MAIL_INDEX_SYNC_TYPE_KEYWORD_ADD:
	case MAIL_INDEX_SYNC_TYPE_KEYWORD_REMOVE:
		seq_range_array_add_range(&ctx->changed_uids,
					  sync_rec->uid1, sync_rec->uid2);
		return;
	}

	if (!mail_index_lookup_seq_range(ctx->sync_view,
					 sync_rec->uid1, sync_rec->uid2,
					 &seq1, &seq2)) {
		/* already expunged */
		return;
	}
	for (seq = seq1; seq <= seq2; seq++) {
		mail_index_lookup_uid(ctx->sync_view, seq, &uid);
		if (!mail_index_transaction_is_expunged(ctx->trans, seq)) {
			mail_index_expunge(ctx->trans, seq);
			seq_range_array_add(&ctx->expunged_uids, uid);
		}
	}
}

struct casbox_recover_context {
	struct mailbox *box;
	struct mail_index_transaction *trans;
	unsigned int count;
	uint32_t last_uid;
};

static void
casbox_recover_msg(void *context, uint32_t uid,
		   const struct casbox_msg_record *rec)
{
	struct casbox_recover_context *ctx = context;
	struct mail_keywords *kw;
	ARRAY_TYPE(const_string) names;
	uint32_t seq;

	mail_index_append(ctx->trans, uid, &seq);
	ctx->last_uid = uid;
	mail_index_update_flags(ctx->trans, seq, MODIFY_REPLACE,
				rec->flags & MAIL_FLAGS_NONRECENT);
	if (array_count(&rec->keywords) > 0) {
		t_array_init(&names, array_count(&rec->keywords) + 1);
		array_append_array(&names, &rec->keywords);
		array_append_zero(&names);
		kw = mail_index_keywords_create(ctx->box->index,
						array_front(&names));
		mail_index_update_keywords(ctx->trans, seq, MODIFY_REPLACE, kw);
		mail_index_keywords_unref(&kw);
	}
	ctx->count++;
}

/* The index is new, but the LSM knows a mailbox of this name: its index
   files were lost. Recreate them from the records (same mailbox GUID,
   UIDVALIDITY, UIDs, flags, keywords) instead of starting empty.
   Returns 1 recovered, 0 nothing to recover, -1 error. */
static int casbox_sync_recover(struct casbox_sync_context *ctx)
{
	struct casbox_mailbox *mbox = ctx->mbox;
	struct casbox_recover_context rctx = {
		.box = &mbox->box, .trans = ctx->trans,
	};
	struct casbox_mailbox_record rec;
	struct mailbox_update update;
	struct casbox_store *store;
	const char *error;
	int ret;

	if (casbox_storage_get_store(mbox->storage, &store) < 0)
		return -1;
	i_zero(&update);
	ret = casbox_store_mailbox_find(store, mailbox_get_vname(&mbox->box),
					pool_datastack_create(),
					update.mailbox_guid, &rec, &error);
	if (ret <= 0) {
		if (ret < 0) {
			mailbox_set_critical(&mbox->box,
				CASBOX_LOG_PREFIX"%s", error);
		}
		return ret;
	}
	update.uid_validity = rec.uid_validity;
	if (casbox_mailbox_create_indexes(&mbox->box, &update,
					  guid_128_is_empty(rec.guid) ? NULL :
					  rec.guid, ctx->trans) < 0)
		return -1;
	if (casbox_store_msg_iterate(store, update.mailbox_guid,
				     casbox_recover_msg, &rctx, &error) < 0) {
		mailbox_set_critical(&mbox->box, CASBOX_LOG_PREFIX
				     "Recovering the index failed: %s", error);
		return -1;
	}
	if (rec.next_uid > rctx.last_uid + 1) {
		/* the last messages were expunged: never reuse their
		   UIDs (set after the appends, which need next_uid
		   below their UIDs) */
		mail_index_update_header(ctx->trans,
			offsetof(struct mail_index_header, next_uid),
			&rec.next_uid, sizeof(rec.next_uid), FALSE);
	}
	e_warning(mbox->box.event, CASBOX_LOG_PREFIX
		  "Index files were lost: recovered %u messages from the "
		  "LSM records", rctx.count);
	return 1;
}

static int casbox_sync_index(struct casbox_sync_context *ctx)
{
	struct mailbox *box = &ctx->mbox->box;
	const struct mail_index_header *hdr;
	struct mail_index_sync_rec sync_rec;
	uint32_t seq1, seq2;
	int ret;

	hdr = mail_index_get_header(ctx->sync_view);
	if (hdr->uid_validity == 0) {
		/* index files lost, or opened between mkdir and index
		   creation (then there is no record yet) */
		if (!box->creating &&
		    (ret = casbox_sync_recover(ctx)) != 0)
			return ret < 0 ? -1 : 0;
		return casbox_mailbox_create_indexes(box, NULL, NULL,
						     ctx->trans);
	}

	/* mark the newly seen messages as recent */
	if (mail_index_lookup_seq_range(ctx->sync_view, hdr->first_recent_uid,
					hdr->next_uid, &seq1, &seq2))
		mailbox_recent_flags_set_seqs(box, ctx->sync_view, seq1, seq2);

	while (mail_index_sync_next(ctx->index_sync_ctx, &sync_rec))
		casbox_sync_add(ctx, &sync_rec);
	return 0;
}

/* Release records; returns the number released or -1. */
static int
casbox_sync_release_uids(struct casbox_mailbox *mbox, uint32_t next_uid,
			 const char **error_r)
{
	struct casbox_store *store;
	struct casbox_store_txn *txn;
	ARRAY_TYPE(uint32_t) uids;
	const uint32_t *uidp;
	int ret = 0;

	if (casbox_storage_get_store(mbox->storage, &store) < 0) {
		*error_r = mailbox_get_last_internal_error(&mbox->box, NULL);
		return -1;
	}
	t_array_init(&uids, 8);
	/* a lockless look first: nearly always nothing to do */
	if (casbox_store_msg_uids_from(store, mbox->mailbox_guid, next_uid,
				       &uids, error_r) < 0)
		return -1;
	if (array_count(&uids) == 0)
		return 0;
	array_clear(&uids);
	if (casbox_store_txn_begin(store, &txn, error_r) < 0)
		return -1;
	if (casbox_store_txn_msg_uids_from(txn, mbox->mailbox_guid, next_uid,
					   &uids, error_r) < 0)
		ret = -1;
	array_foreach(&uids, uidp) {
		if (ret < 0)
			break;
		T_BEGIN {
			ret = casbox_store_txn_expunge(txn,
				mbox->mailbox_guid, *uidp, error_r);
			if (ret == 0 &&
			    casbox_store_txn_checkpoint(txn, error_r) < 0)
				ret = -1;
		} T_END_PASS_STR_IF(ret < 0, error_r);
	}
	/* their deliveries were never acknowledged: a retry is no
	   duplicate */
	if (ret == 0 && array_count(&uids) > 0 &&
	    casbox_store_txn_dup_release_from(txn, mbox->mailbox_guid,
					      next_uid, error_r) < 0)
		ret = -1;
	if (ret < 0 || array_count(&uids) == 0) {
		casbox_store_txn_rollback(&txn);
		return ret;
	}
	if (casbox_store_txn_commit(&txn, error_r) < 0)
		return -1;
	e_warning(mbox->box.event, CASBOX_LOG_PREFIX
		  "Released %u message records at or above next UID %u "
		  "(UIDs %u..%u): a save was interrupted between the record "
		  "and the index commit", array_count(&uids), next_uid,
		  *array_front(&uids), *array_back(&uids));
	return array_count(&uids);
}

/* Message records at or above the index's next UID were written by a
   save whose index commit never happened (a crash, or an index write
   error, between its LSM commit and its index commit): no client was
   told about them and they can never become visible. A save holds the
   index sync lock from assigning its UIDs until its index commit, and
   so does the caller: no process can be inside that window now, so
   every such record is an orphan and is released with its blobs. A
   failure is logged; the sync goes on. */
static void casbox_sync_release_orphans(struct casbox_sync_context *ctx)
{
	const struct mail_index_header *hdr;
	const char *error;

	hdr = mail_index_get_header(ctx->sync_view);
	if (hdr->uid_validity == 0 || ctx->mbox->box.creating)
		return;
	T_BEGIN {
		if (casbox_sync_release_uids(ctx->mbox, hdr->next_uid,
					     &error) < 0) {
			e_error(ctx->mbox->box.event, CASBOX_LOG_PREFIX
				"Failed to release orphan records: %s", error);
		}
	} T_END;
}

bool casbox_sync_have_orphans(struct casbox_mailbox *mbox)
{
	const struct mail_index_header *hdr;
	struct casbox_store *store;
	ARRAY_TYPE(uint32_t) uids;
	const char *error;
	bool ret;

	hdr = mail_index_get_header(mbox->box.view);
	if (hdr->uid_validity == 0 ||
	    casbox_storage_get_store(mbox->storage, &store) < 0)
		return FALSE;
	T_BEGIN {
		t_array_init(&uids, 1);
		ret = casbox_store_msg_uids_from(store, mbox->mailbox_guid,
						 hdr->next_uid, &uids,
						 &error) == 0 &&
			array_count(&uids) > 0;
	} T_END;
	return ret;
}

int casbox_sync_begin(struct casbox_mailbox *mbox,
		      enum casbox_sync_flags flags,
		      struct casbox_sync_context **ctx_r)
{
	struct casbox_sync_context *ctx;
	enum mail_index_sync_flags sync_flags;
	int ret;

	ctx = i_new(struct casbox_sync_context, 1);
	ctx->mbox = mbox;
	ctx->flags = flags;
	i_array_init(&ctx->expunged_uids, 32);
	i_array_init(&ctx->changed_uids, 32);

	sync_flags = index_storage_get_sync_flags(&mbox->box);
	if ((flags & CASBOX_SYNC_FLAG_FORCE) == 0)
		sync_flags |= MAIL_INDEX_SYNC_FLAG_REQUIRE_CHANGES;
	if ((flags & CASBOX_SYNC_FLAG_FSYNC) != 0)
		sync_flags |= MAIL_INDEX_SYNC_FLAG_FSYNC;
	/* don't write unnecessary dirty flag updates */
	sync_flags |= MAIL_INDEX_SYNC_FLAG_AVOID_FLAG_UPDATES;

	ret = index_storage_expunged_sync_begin(&mbox->box,
			&ctx->index_sync_ctx, &ctx->sync_view,
			&ctx->trans, sync_flags);
	if (ret > 0 && ((flags & CASBOX_SYNC_FLAG_FORCE_REBUILD) != 0 ||
			casbox_sync_rebuild_needed(mbox) > 0)) {
		/* rebuild under the lock, then sync the rebuilt index */
		ret = casbox_sync_index_rebuild(mbox) < 0 ? -1 : 1;
		mail_index_sync_rollback(&ctx->index_sync_ctx);
		index_storage_expunging_deinit(&mbox->box);
		if (ret > 0) {
			ret = index_storage_expunged_sync_begin(&mbox->box,
					&ctx->index_sync_ctx, &ctx->sync_view,
					&ctx->trans, sync_flags);
		}
	}
	if (ret > 0) {
		if (casbox_sync_index(ctx) < 0) {
			mail_index_sync_rollback(&ctx->index_sync_ctx);
			index_storage_expunging_deinit(&mbox->box);
			ret = -1;
		} else {
			casbox_sync_release_orphans(ctx);
		}
	}
	if (ret <= 0) {
		array_free(&ctx->expunged_uids);
		array_free(&ctx->changed_uids);
		i_free(ctx);
		*ctx_r = NULL;
		return ret;
	}
	*ctx_r = ctx;
	return 0;
}

static const char *const *
casbox_sync_keyword_names(struct mail_index_view *view, uint32_t seq)
{
	const ARRAY_TYPE(keywords) *names =
		mail_index_get_keywords(mail_index_view_get_index(view));
	ARRAY_TYPE(keyword_indexes) kw_idx;
	ARRAY_TYPE(const_string) result;
	unsigned int idx;
	const char *name;

	t_array_init(&kw_idx, 8);
	mail_index_lookup_keywords(view, seq, &kw_idx);
	t_array_init(&result, array_count(&kw_idx) + 1);
	array_foreach_elem(&kw_idx, idx) {
		if (idx < array_count(names)) {
			name = array_idx_elem(names, idx);
			array_push_back(&result, &name);
		}
	}
	array_append_zero(&result);
	return array_front(&result);
}

static int
casbox_sync_mirror_flags(struct casbox_sync_context *ctx,
			 struct casbox_store_txn *txn, const char **error_r)
{
	struct mailbox *box = &ctx->mbox->box;
	struct mail_index_view *view;
	const struct mail_index_record *rec;
	struct seq_range_iter iter;
	unsigned int n = 0;
	uint32_t uid, seq;
	int ret = 0;

	if (array_count(&ctx->changed_uids) == 0)
		return 0;
	view = mail_index_view_open(box->index);
	seq_range_array_iter_init(&iter, &ctx->changed_uids);
	while (ret == 0 && seq_range_array_iter_nth(&iter, n++, &uid)) {
		if (seq_range_exists(&ctx->expunged_uids, uid) ||
		    !mail_index_lookup_seq(view, uid, &seq))
			continue;
		rec = mail_index_lookup(view, seq);
		/* each record is read and rewritten whole: per message on
		   the data stack, and "mark all read" in a big mailbox is
		   more than one batch */
		T_BEGIN {
			ret = casbox_store_txn_update_flags(txn,
				ctx->mbox->mailbox_guid, uid, rec->flags,
				casbox_sync_keyword_names(view, seq),
				mail_index_modseq_lookup(view, seq), error_r);
			if (ret == 0 &&
			    casbox_store_txn_checkpoint(txn, error_r) < 0)
				ret = -1;
		} T_END_PASS_STR_IF(ret < 0, error_r);
	}
	mail_index_view_close(&view);
	return ret;
}

/* An expunge inside casbox_expunge_retention keeps the message as a
   retained record (undelete), unless this process moved it out. */
static int
casbox_sync_expunge_one(struct casbox_mailbox *mbox,
			struct casbox_store_txn *txn, uint32_t uid,
			const char **error_r)
{
	bool moved = array_is_created(&mbox->moved_uids) &&
		seq_range_array_remove(&mbox->moved_uids, uid);

	if (mbox->storage->set.expunge_retention == 0 || moved) {
		return casbox_store_txn_expunge(txn, mbox->mailbox_guid, uid,
						error_r);
	}
	return casbox_store_txn_retain(txn, mbox->mailbox_guid, uid,
				       mailbox_get_vname(&mbox->box),
				       ioloop_time, error_r);
}

/* After the index commit: release expunged messages' records and blobs,
   and mirror changed flags. */
static int casbox_sync_update_store(struct casbox_sync_context *ctx)
{
	struct casbox_mailbox *mbox = ctx->mbox;
	struct casbox_store *store;
	struct casbox_store_txn *txn;
	struct seq_range_iter iter;
	const char *error = NULL;
	unsigned int n = 0;
	uint32_t uid;
	int ret = 0;

	if (array_count(&ctx->expunged_uids) == 0 &&
	    array_count(&ctx->changed_uids) == 0)
		return 0;
	if (casbox_storage_get_store(mbox->storage, &store) < 0)
		return -1;
	if (casbox_store_txn_begin(store, &txn, &error) < 0) {
		mailbox_set_critical(&mbox->box, CASBOX_LOG_PREFIX"%s", error);
		return -1;
	}
	/* flag changes only: Dovecot fsyncs the index for appends and
	   expunges (MAIL_INDEX_FSYNC_MASK_*), not for flags */
	if (array_count(&ctx->expunged_uids) == 0)
		casbox_store_txn_set_lazy(txn);
	seq_range_array_iter_init(&iter, &ctx->expunged_uids);
	while (ret == 0 && seq_range_array_iter_nth(&iter, n++, &uid)) {
		T_BEGIN {
			ret = casbox_sync_expunge_one(mbox, txn, uid,
						      &error);
			if (ret == 0 &&
			    casbox_store_txn_checkpoint(txn, &error) < 0)
				ret = -1;
		} T_END_PASS_STR_IF(ret < 0, &error);
	}
	if (ret == 0)
		ret = casbox_sync_mirror_flags(ctx, txn, &error);
	if (ret == 0)
		casbox_sync_rebuild_mirror_mailbox(mbox, txn);
	if (ret < 0)
		casbox_store_txn_rollback(&txn);
	else
		ret = casbox_store_txn_commit(&txn, &error);
	if (ret < 0) {
		mailbox_set_critical(&mbox->box, CASBOX_LOG_PREFIX
				     "Failed to update records: %s", error);
	}
	return ret;
}

static void casbox_sync_notify_expunges(struct casbox_sync_context *ctx)
{
	struct mailbox *box = &ctx->mbox->box;
	struct seq_range_iter iter;
	unsigned int n = 0;
	uint32_t uid;

	if (array_count(&ctx->expunged_uids) == 0)
		return;
	box->tmp_sync_view = ctx->sync_view;
	seq_range_array_iter_init(&iter, &ctx->expunged_uids);
	while (seq_range_array_iter_nth(&iter, n++, &uid))
		mailbox_sync_notify(box, uid, MAILBOX_SYNC_TYPE_EXPUNGE);
	mailbox_sync_notify(box, 0, 0);
	box->tmp_sync_view = NULL;
}

int casbox_sync_finish(struct casbox_sync_context **_ctx, bool success)
{
	struct casbox_sync_context *ctx = *_ctx;
	struct mailbox *box = &ctx->mbox->box;
	int ret = success ? 0 : -1;

	*_ctx = NULL;
	if (success) {
		mail_index_view_ref(ctx->sync_view);
		if (mail_index_sync_commit(&ctx->index_sync_ctx) < 0) {
			mailbox_set_index_error(box);
			ret = -1;
		} else T_BEGIN {
			/* the index is unlocked now; the LSM batch
			   serialises concurrent releasers */
			if (casbox_sync_update_store(ctx) < 0)
				ret = -1;
			casbox_sync_notify_expunges(ctx);
		} T_END;
		mail_index_view_close(&ctx->sync_view);
	} else {
		mail_index_sync_rollback(&ctx->index_sync_ctx);
	}

	index_storage_expunging_deinit(box);
	array_free(&ctx->expunged_uids);
	array_free(&ctx->changed_uids);
	i_free(ctx);
	return ret;
}

int casbox_sync(struct casbox_mailbox *mbox, enum casbox_sync_flags flags)
{
	struct casbox_sync_context *sync_ctx;

	if (casbox_sync_begin(mbox, flags, &sync_ctx) < 0)
		return -1;
	if (sync_ctx == NULL)
		return 0;
	return casbox_sync_finish(&sync_ctx, TRUE);
}

struct mailbox_sync_context *
casbox_storage_sync_init(struct mailbox *box, enum mailbox_sync_flags flags)
{
	struct casbox_mailbox *mbox = CASBOX_MAILBOX(box);
	enum casbox_sync_flags sync_flags = 0;
	int ret = 0;

	/* an IMAP command ends with a sync and IDLE begins with one: the
	   pack fd kept for the next read must not keep a pack gc unlinks
	   alive while the session waits */
	if (mbox->storage->store != NULL)
		casbox_store_release_read_fd(mbox->storage->store);
	if ((flags & MAILBOX_SYNC_FLAG_FORCE_RESYNC) != 0) {
		/* doveadm force-resync: rebuild the index from the LSM */
		sync_flags |= CASBOX_SYNC_FLAG_FORCE |
			CASBOX_SYNC_FLAG_FORCE_REBUILD;
		(void)casbox_sync_rebuild_mailbox_list(mbox->storage);
	}
	if (index_mailbox_want_full_sync(&mbox->box, flags) || sync_flags != 0)
		ret = casbox_sync(mbox, sync_flags);
	return index_mailbox_sync_init(box, flags, ret < 0);
}
