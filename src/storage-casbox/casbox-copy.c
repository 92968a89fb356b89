/* casbox: COPY/MOVE inside one store shares the blobs: a new message
   record pointing at the same blob ids; refcounts are raised at commit.
   Mails from other storages (raw for LMTP, other formats for dsync) are
   saved normally. */

#include "lib.h"
#include "casbox-storage.h"
#include "array.h"
#include "ioloop.h"
#include "index-mail.h"
#include "mail-copy.h"
#include "casbox-plugin.h"
#include "casbox-store.h"
#include "casbox-save.h"
#include "casbox-copy.h"

/* The copy's keywords (those of the save data), NULL-terminated, from
   pool; NULL = none. */
static const char *const *
casbox_copy_keywords(struct mail_save_context *ctx, pool_t pool)
{
	ARRAY_TYPE(const_string) names;

	if (ctx->data.keywords == NULL || ctx->data.keywords->count == 0)
		return NULL;
	p_array_init(&names, pool, ctx->data.keywords->count + 1);
	casbox_save_keyword_names(ctx, pool, &names);
	if (array_count(&names) == 0)
		return NULL;
	array_append_zero(&names);
	return array_front(&names);
}

/* Returns 1 copied, 0 use the slow path, -1 error. */
static int casbox_copy_refs(struct mail_save_context *ctx, struct mail *mail)
{
	struct mail_save_data *mdata = &ctx->data;
	struct casbox_mailbox *src_mbox = CASBOX_MAILBOX(mail->box);
	struct casbox_store *store;
	struct casbox_msg_record src_rec;
	struct casbox_save_copy copy;
	pool_t pool = casbox_save_get_pool(ctx);
	const char *error;
	uint32_t seq, t;
	int ret;

	if (mail->saving || mail->expunged)
		return 0;
	if (casbox_storage_get_store(src_mbox->storage, &store) < 0)
		return -1;
	/* the source must have a record; the copy keeps none of it
	   (casbox_save_copy) */
	i_zero(&copy);
	T_BEGIN {
		ret = casbox_store_msg_lookup(store, src_mbox->mailbox_guid,
					      mail->uid,
					      pool_datastack_create(),
					      &src_rec, &error);
		if (ret > 0) {
			copy.received_date = src_rec.received_date;
			copy.save_date = src_rec.save_date;
			copy.physical_size = src_rec.physical_size;
		}
	} T_END_PASS_STR_IF(ret < 0, &error);
	if (ret < 0) {
		mail_set_critical(mail, CASBOX_LOG_PREFIX"uid=%u: %s",
				  mail->uid, error);
		return -1;
	}
	if (ret == 0)
		return 0;

	guid_128_copy(copy.src_mailbox_guid, src_mbox->mailbox_guid);
	copy.src_uid = mail->uid;
	if (mdata->guid != NULL)
		copy.guid = p_strdup(pool, mdata->guid);
	if (mdata->received_date != (time_t)-1)
		copy.received_date = mdata->received_date;
	/* the copy keeps the source's save date, as sdbox's copies do
	   (their cached date.save is copied): dsync renumbers messages by
	   copying them and expects the date to stay */
	if (mdata->save_date != (time_t)-1)
		copy.save_date = mdata->save_date;
	copy.flags = mdata->flags & ENUM_NEGATE(MAIL_RECENT);
	copy.modseq = mdata->min_modseq;
	if (mdata->pop3_uidl != NULL)
		copy.pop3_uidl = p_strdup(pool, mdata->pop3_uidl);
	copy.pop3_order = mdata->pop3_order;
	copy.keywords = casbox_copy_keywords(ctx, pool);

	seq = casbox_save_add_to_index(ctx);
	index_copy_cache_fields(ctx, mail, seq);
	mail_set_seq_saving(ctx->dest_mail, seq);
	t = copy.save_date;
	index_mail_cache_add(INDEX_MAIL(ctx->dest_mail), MAIL_CACHE_SAVE_DATE,
			     &t, sizeof(t));
	casbox_save_add_copy(ctx, seq, &copy);
	if (ctx->moving) {
		if (!array_is_created(&src_mbox->moved_uids))
			p_array_init(&src_mbox->moved_uids,
				     src_mbox->box.pool, 8);
		seq_range_array_add(&src_mbox->moved_uids, mail->uid);
	}
	return 1;
}

int casbox_copy(struct mail_save_context *ctx, struct mail *mail)
{
	struct mailbox_transaction_context *t = ctx->transaction;
	int ret;

	i_assert((t->flags & MAILBOX_TRANSACTION_FLAG_EXTERNAL) != 0);

	casbox_save_copy_begin(ctx);

	if (mail->box->storage == t->box->storage) {
		/* the same casbox storage (UNIQUE_ROOT): same store */
		ret = casbox_copy_refs(ctx, mail);
		if (ret != 0) {
			index_save_context_free(ctx);
			return ret > 0 ? 0 : -1;
		}
	}
	return mail_storage_copy(ctx, mail);
}
