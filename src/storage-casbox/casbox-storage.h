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
	guid_128_t mailbox_guid;
	uint8_t flags;
	uint8_t unused[3];
};

struct casbox_storage {
	struct mail_storage storage;

	struct casbox_settings set;
	/* The casbox root (mail_location path). */
	const char *root_dir;
	/* Opened on first use: see casbox_storage_get_store(). */
	struct casbox_store *store;
};

struct casbox_mailbox {
	struct mailbox box;
	struct casbox_storage *storage;

	uint32_t hdr_ext_id;
	guid_128_t mailbox_guid;
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
int casbox_mailbox_create_indexes(struct mailbox *box,
				  const struct mailbox_update *update,
				  struct mail_index_transaction *trans);

#endif
