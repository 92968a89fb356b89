#ifndef CASBOX_SYNC_REBUILD_H
#define CASBOX_SYNC_REBUILD_H

/* casbox: rebuild a mailbox's Dovecot index from the LSM records
   (doc/casbox-storage.md, "Rebuild"), the casbox counterpart of
   sdbox-sync-rebuild.c. */

struct casbox_mailbox;
struct casbox_storage;
struct mailbox_update;
struct casbox_store_txn;

/* Reset the mailbox index and recreate it from the store: one index
   record per message record of the mailbox GUID, in UID order.

   - flags and keywords come from the old index (or its .backup) for UIDs
     it still has, otherwise from the record's durable mirror; each
     message's modseq is raised to at least the mirrored one, the highest
     modseq to at least the highest of them;
   - UIDVALIDITY and the mailbox GUID come from the old index if it has
     them, else from the mailbox record with the mailbox's name; the next
     UID is above every UID the old index, the mailbox record or a
     message record ever had;
   - records the intact old index no longer has below its next UID were
     expunged (their release did not finish) and are left out.

   The caller holds the index sync lock (casbox_sync_begin()) and must
   restart its index sync afterwards: the rebuild is committed as its own
   transaction. Returns 0 ok, -1 error (set on the mailbox). */
int casbox_sync_index_rebuild(struct casbox_mailbox *mbox);

/* Put the mailbox record as the index has it now (UIDVALIDITY, name,
   next UID, highest modseq) into txn, never lowering the next UID or
   highest modseq another process wrote. Called after every index change
   the LSM mirrors, so that a rebuild knows a modseq at least as high as
   any the mailbox handed out. */
void casbox_sync_rebuild_mirror_mailbox(struct casbox_mailbox *mbox,
					struct casbox_store_txn *txn);

/* Recreate the directory of every mailbox that has a mailbox record but
   no directory (the mailbox list is the directory tree), so that it is
   listed again; opening it then rebuilds its index. Returns the number
   of mailboxes restored, -1 error (set on the storage). */
int casbox_sync_rebuild_mailbox_list(struct casbox_storage *storage);

/* For a mailbox being created with no explicit update: if a mailbox
   record has its name, fill update_r with its GUID (the storage id)
   and UIDVALIDITY and public_guid_r with its public GUID, so that the
   lost mailbox comes back under them. Returns 1 filled, 0 no record,
   -1 error (logged; create as new). */
int casbox_sync_rebuild_create_update(struct casbox_mailbox *mbox,
				      struct mailbox_update *update_r,
				      guid_128_t public_guid_r);

/* Does the mailbox need a rebuild without being asked: its index is new
   (no UIDVALIDITY) while the store has a mailbox record with its name
   (the index files were lost), its index is empty and has never handed
   out a UID while its mailbox record says it did (the directory was
   lost and the mailbox recreated), or lib-index had to fsck it.
   Returns 1 yes, 0 no, -1 error (set on the mailbox). */
int casbox_sync_rebuild_needed(struct casbox_mailbox *mbox);

#endif
