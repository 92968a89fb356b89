#ifndef CASBOX_SYNC_H
#define CASBOX_SYNC_H

struct casbox_mailbox;

enum casbox_sync_flags {
	CASBOX_SYNC_FLAG_FORCE		= 0x01,
	CASBOX_SYNC_FLAG_FSYNC		= 0x02,
	/* rebuild the index from the LSM first (casbox-sync-rebuild.h) */
	CASBOX_SYNC_FLAG_FORCE_REBUILD	= 0x04,
};

struct casbox_sync_context {
	struct casbox_mailbox *mbox;
	struct mail_index_sync_ctx *index_sync_ctx;
	struct mail_index_view *sync_view;
	struct mail_index_transaction *trans;
	enum casbox_sync_flags flags;
	/* expunged in this sync: their LSM records are released after
	   the index commit */
	ARRAY_TYPE(seq_range) expunged_uids;
	/* flags/keywords changed: mirrored into the LSM after commit */
	ARRAY_TYPE(seq_range) changed_uids;
};

/* Lock the mailbox index for syncing (the index sync lock also orders
   saves: UIDs are assigned under it). Returns 0 ok (*ctx_r may be NULL
   if nothing to do), -1 error. */
int casbox_sync_begin(struct casbox_mailbox *mbox,
		      enum casbox_sync_flags flags,
		      struct casbox_sync_context **ctx_r);
/* Commit (success) or roll back the sync; after a commit releases the
   LSM records of expunged messages. Returns 0 ok, -1 error. */
int casbox_sync_finish(struct casbox_sync_context **ctx, bool success);
int casbox_sync(struct casbox_mailbox *mbox, enum casbox_sync_flags flags);
/* Are there message records at or above the index's next UID (a hint,
   read without locks)? A sync with CASBOX_SYNC_FLAG_FORCE releases
   them under the index sync lock (doc/casbox-storage.md, "Orphan
   records"). */
bool casbox_sync_have_orphans(struct casbox_mailbox *mbox);

struct mailbox_sync_context *
casbox_storage_sync_init(struct mailbox *box, enum mailbox_sync_flags flags);

#endif
