#ifndef CASBOX_SAVE_H
#define CASBOX_SAVE_H

#include "casbox-records.h"

struct casbox_save_context;

struct mail_save_context *
casbox_save_alloc(struct mailbox_transaction_context *t);
int casbox_save_begin(struct mail_save_context *ctx, struct istream *input);
int casbox_save_continue(struct mail_save_context *ctx);
int casbox_save_finish(struct mail_save_context *ctx);
void casbox_save_cancel(struct mail_save_context *ctx);

int casbox_transaction_save_commit_pre(struct mail_save_context *ctx);
void casbox_transaction_save_commit_post(struct mail_save_context *ctx,
	struct mail_index_transaction_commit_result *result);
void casbox_transaction_save_rollback(struct mail_save_context *ctx);

/* Add the current mail to the index (UID requested by the save data,
   flags, keywords, modseq) and return its sequence. */
uint32_t casbox_save_add_to_index(struct mail_save_context *ctx);
/* Names of the save data's keywords, allocated from pool. */
void casbox_save_keyword_names(struct mail_save_context *ctx, pool_t pool,
			       ARRAY_TYPE(const_string) *names);
/* mailbox_copy() started: there is no save_begin/finish pair. */
void casbox_save_copy_begin(struct mail_save_context *ctx);
/* Queue a copied message: rec's blobs already exist in the store. rec
   has no sealed metadata (it may be big, and a COPY may hold a whole
   mailbox until commit); the commit takes it from the source message's
   record, src_mailbox_guid/src_uid, if that still has the same parts. */
void casbox_save_add_copy(struct mail_save_context *ctx, uint32_t seq,
			  const struct casbox_msg_record *rec,
			  const guid_128_t src_mailbox_guid, uint32_t src_uid);
pool_t casbox_save_get_pool(struct mail_save_context *ctx);

/* For a mail being saved in transaction t: its record and (for saved,
   not copied, mails) its bytes. Returns TRUE if found. */
bool casbox_save_lookup(struct mailbox_transaction_context *t, uint32_t seq,
			const struct casbox_msg_record **rec_r,
			struct istream **input_r);

#endif
