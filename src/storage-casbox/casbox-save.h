#ifndef CASBOX_SAVE_H
#define CASBOX_SAVE_H

#include "casbox-records.h"

struct casbox_save_context;
struct casbox_store;

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
/* A copied message as a COPY queues it: what the copy's record takes
   from the save data. A COPY may hold a whole big mailbox until
   commit, so the rest (GUID, parts, sizes, sealed metadata) is not
   kept: the commit reads it from the source record, under the store's
   write lock, where the blobs' refcounts are raised. */
struct casbox_save_copy {
	guid_128_t src_mailbox_guid;
	uint32_t src_uid;
	uint32_t flags;
	uint64_t modseq;
	time_t received_date, save_date;
	/* NULL = the source's */
	const char *guid, *pop3_uidl;
	/* 0 = the source's */
	uint32_t pop3_order;
	/* NULL-terminated; NULL = none */
	const char *const *keywords;
	/* the source's, for the casbox_save_finished event */
	uoff_t physical_size;
};
/* Queue a copy (strings and keywords allocated from the save pool). */
void casbox_save_add_copy(struct mail_save_context *ctx, uint32_t seq,
			  const struct casbox_save_copy *copy);
/* The record a copy gets: the source record as it is now, with copy's
   fields. Returns 0 ok, -1 error (errno = ENOENT: the source is gone). */
int casbox_save_copy_record(struct casbox_store *store,
			    const struct casbox_save_copy *copy, pool_t pool,
			    struct casbox_msg_record *rec_r,
			    const char **error_r);
pool_t casbox_save_get_pool(struct mail_save_context *ctx);

/* For a mail being saved in transaction t: its record and (for saved,
   not copied, mails) its bytes. A copy's record is read from its
   source each time and stays valid until the next call. Returns TRUE
   if found (FALSE also when a copy's source can't be read: logged). */
bool casbox_save_lookup(struct mailbox_transaction_context *t, uint32_t seq,
			const struct casbox_msg_record **rec_r,
			struct istream **input_r);

#endif
