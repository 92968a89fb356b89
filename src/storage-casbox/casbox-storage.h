#ifndef CASBOX_STORAGE_H
#define CASBOX_STORAGE_H

/* casbox mail storage: lib-storage's index-storage (like sdbox) for
   UIDs, flags, keywords, modseqs and cache, with message bytes kept as
   deduplicated, compressed, encrypted blobs and per-message records in
   the user's LSM. See doc/casbox-storage.md. */

#include "index-storage.h"
#include "casbox-settings.h"

#define CASBOX_STORAGE_NAME "casbox"
/* Directory under each mailbox directory holding Dovecot's index
   files (the equivalent of sdbox's dbox-Mails). */
#define CASBOX_MAILDIR_NAME "casbox-Mails"
#define CASBOX_MAILBOX_DIR_NAME "mailboxes"
#define CASBOX_SUBSCRIPTION_FILE_NAME "subscriptions"
#define CASBOX_UIDVALIDITY_FILE_NAME "dovecot-uidvalidity"

struct casbox_store;

/* Per-mailbox header extension "casbox-hdr" in dovecot.index. */
struct casbox_index_header {
	uint32_t rebuild_count;
	/* the mailbox's storage id: the GUID in the keys of its LSM
	   records, fixed for the mailbox's life */
	guid_128_t mailbox_guid;
	uint8_t flags;
	uint8_t unused[3];
	/* the public mailbox GUID after a change (dsync's mailbox_update());
	   empty = mailbox_guid. Absent from indexes written before it. */
	guid_128_t public_guid;
};

struct casbox_storage {
	struct mail_storage storage;

	struct casbox_settings set;
	/* The casbox root (mail_location path). */
	const char *root_dir;
	/* Opened on first use: see casbox_storage_get_store(). */
	struct casbox_store *store;
	/* password mode: the user key was unlocked (or that failed) */
	bool key_unlock_tried;
};

struct casbox_mailbox {
	struct mailbox box;
	struct casbox_storage *storage;

	uint32_t hdr_ext_id;
	/* the storage id keying the LSM records (casbox_index_header) */
	guid_128_t mailbox_guid;
	/* the GUID the mailbox shows (metadata, dsync); never empty once
	   the mailbox is open */
	guid_128_t public_guid;
	/* UIDs this process moved out with MOVE (casbox-copy.c): their
	   expunges release the records instead of retaining them, since
	   the mail lives on in the destination */
	ARRAY_TYPE(seq_range) moved_uids;
};

#define CASBOX_STORAGE(s) (container_of(s, struct casbox_storage, storage))
#define CASBOX_MAILBOX(s) (container_of(s, struct casbox_mailbox, box))

extern struct mail_storage casbox_storage;
extern struct mailbox casbox_mailbox;
extern struct mail_vfuncs casbox_mail_vfuncs;

/* Open the user's store (LSM, key ring, packs) if not yet open.
   Returns 0 ok, -1 error (set as the storage's critical error). */
int casbox_storage_get_store(struct casbox_storage *storage,
			     struct casbox_store **store_r);

int casbox_read_header(struct casbox_mailbox *mbox,
		       struct casbox_index_header *hdr, bool log_error,
		       bool *need_resize_r);
/* Set mbox's storage id and public GUID from hdr. */
void casbox_mailbox_set_guids(struct casbox_mailbox *mbox,
			      const struct casbox_index_header *hdr);
/* Initialize a new index or apply update to an existing one. For a new
   index (no UIDVALIDITY) update's mailbox GUID becomes the storage id
   and public_guid (NULL = the same) the public GUID; for an existing
   one update's GUID only changes the public GUID, so that the LSM
   records stay keyed as they are. */
int casbox_mailbox_create_indexes(struct mailbox *box,
				  const struct mailbox_update *update,
				  const guid_128_t public_guid,
				  struct mail_index_transaction *trans);

#endif
