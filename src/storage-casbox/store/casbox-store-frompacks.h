#ifndef CASBOX_STORE_FROMPACKS_H
#define CASBOX_STORE_FROMPACKS_H

/* rebuild --from-packs: the LSM rebuilt from the packs' recovery
   records (casbox-store-frompacks.c); the doveadm command around it
   (index resync, output) is doveadm-casbox-frompacks-cmd.c. */

#include "hash.h"
#include "casbox-recovery.h"
#include "casbox-store.h"

struct casbox_frompacks_frame {
	uint32_t pack_id;
	uint64_t offset;
	uint32_t frame_size;
	/* frame version 1 only (version 2 keeps it inside the AEAD) */
	uint64_t plain_size;
	uint32_t dict_id;
	uint8_t version;
	/* a delta frame (version 3): the scan's report, which unmasks its
	   base id with a DEK (casbox_pack_frame_base_id()) */
	uint8_t base_depth;
	struct casbox_pack_frame_info delta;
};

/* A candidate DEK of a blob: wrapped (server mode) or sealed (password
   mode), as recovery records and DEK updates carry it. */
struct casbox_frompacks_dek {
	uint8_t kind;
	unsigned char stored[CAS_STORED_DEK_MAX_SIZE];
};

struct casbox_frompacks_blob {
	struct cas_blob_id id;
	ARRAY(struct casbox_frompacks_frame) frames;
	ARRAY(struct casbox_frompacks_dek) deks;
	/* references from the recovered message records, and from the
	   blob records of the delta blobs based on it */
	uint32_t refcount;
	/* its plaintext size as a recovery record lists it (0 = none did):
	   how a base that is no message's part is opened */
	uint64_t size_hint;
	/* 0 = not tried, 1 = rec is good, -1 = no frame opens */
	int resolved;
	struct casbox_blob_record rec;
};

struct casbox_frompacks_msg {
	guid_128_t mailbox_guid;
	uint32_t uid;
	struct casbox_recovery_record rec;
	/* its blobs cannot be opened */
	bool lost;
	/* saved before its mailbox was deleted: not recovered */
	bool deleted;
};

struct casbox_frompacks_mailbox {
	guid_128_t guid;
	/* of the newest recovery or mailbox record: name, UIDVALIDITY and
	   public GUID are taken from it */
	uint64_t newest_written;
	/* of the newest deletion record (0 = none) */
	uint64_t deleted_written;
	struct casbox_mailbox_record rec;
	unsigned int messages;
};

/* What the scan found and the rebuild wrote. */
struct casbox_frompacks {
	struct casbox_store *store;
	pool_t pool;
	HASH_TABLE(struct cas_blob_id *, struct casbox_frompacks_blob *) blobs;
	ARRAY(struct casbox_frompacks_blob *) blob_list;
	/* "<mailbox guid hex>:<uid>" -> newest recovery record */
	HASH_TABLE(char *, struct casbox_frompacks_msg *) msgs;
	ARRAY(struct casbox_frompacks_msg *) msg_list;
	HASH_TABLE(char *, struct casbox_frompacks_mailbox *) mailboxes;
	ARRAY(struct casbox_frompacks_mailbox *) mailbox_list;

	/* waiting for the old LSM's write lock (0 = the LSM default) */
	unsigned int lsm_lock_timeout_secs;
	struct casbox_lsm *old_lsm;
	struct casbox_lsm_batch *old_batch;
	struct casbox_pack_txn *pack_txn;

	unsigned int meta_frames, meta_unreadable, damaged_frames;
	/* mailboxes and messages left out because the mailbox was deleted */
	unsigned int deleted_mailboxes, deleted_messages;
	unsigned int messages, lost_messages, blob_count, orphans;
	/* records the intact index had expunged, released again */
	unsigned int expunged;
	const char *moved_to;
};


/* store must have the keys open (casbox_store_open_keys(); in password
   mode unlocked); its LSM is not used (it may be opened without one,
   casbox_store_open_nolsm()). */
struct casbox_frompacks *casbox_frompacks_init(struct casbox_store *store);
/* Lock, scan, resolve, write the new LSM and move the old one aside.
   Returns 0 ok, -1 error (then nothing was moved), also when another
   process holds the old LSM's write lock past the timeout: a busy LSM
   is not a damaged one. */
int casbox_frompacks_rebuild_lsm(struct casbox_frompacks *fp,
				 const char **error_r);
void casbox_frompacks_deinit(struct casbox_frompacks **fp);

#endif
