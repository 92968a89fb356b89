#ifndef CASBOX_STORE_REKEY_H
#define CASBOX_STORE_REKEY_H

/* casbox-store-rekey: the LSM walk of key rotation (doveadm casbox key
   rotate, doc/doveadm.md). Each step holds the LSM write lock, so it
   never races a save's read-modify-write of a blob record: a save that
   read a blob record before a step commits only after it (the lock is
   held from its read to its commit), and one that reads after sees the
   rewrapped record. Only the 76-byte wrapped DEK of a blob record
   changes; refcount, location and blob frames stay as they are.

   rebuild --from-packs must still open every blob once the old slot is
   dropped, so each step also appends a DEK update meta frame per
   rewrapped record to the packs and commits them (fdatasync) before
   the LSM batch: whatever wrap the LSM holds, the packs hold too. A
   crash in between leaves a DEK update under the new slot while the LSM
   keeps the old wrap; both open the same DEK, the key file still has
   both slots (the rotation did not finish), and the resumed walk
   rewraps the record and writes the update again.

   Lock order: LSM write lock, then pack append lock, as a save takes
   them (casbox_store_txn_*); gc takes the pack lock without the LSM
   lock or after it, never the other way round. */

#include "cas-key.h"

struct casbox_lsm;
struct casbox_lsm_batch;
struct casbox_pack_store;

struct casbox_rekey_stats {
	/* blob records looked at */
	uint64_t examined;
	/* rewrapped under the current slot */
	uint64_t rewrapped;
	/* named the old key id but did not unwrap (damaged record):
	   left as they are */
	uint64_t failed;
	/* blob records that could not be decoded */
	uint64_t bad_records;
};

/* Called for every rewrapped record, inside the LSM batch that rewrites
   it, after its DEK update was appended: a hook for writers that keep
   wrapped DEKs elsewhere too. */
typedef void casbox_rekey_callback_t(void *context,
				     struct casbox_lsm_batch *batch,
				     const struct cas_blob_id *id,
				     const unsigned char *old_wrapped,
				     const unsigned char *new_wrapped);

/* One step of the walk: take the write lock, continue after pos (a blob
   record key; empty = from the first one), rewrap up to max_records
   blob records whose wrapped DEK names old_key_id with keyring's
   current slot, append a DEK update per rewrapped record to packs and
   commit the pack transaction, then commit the records as one LSM batch
   (both fsynced unless the store runs with fsync off). packs must use
   keyring (its index key seals the updates); NULL only in tests of the
   LSM walk alone. pos becomes the last key examined, so the
   next call goes on from there (keys may be of any length: give a
   buffer that can grow in the caller's data stack frame or a heap
   one). callback may be NULL. Returns 1 the
   walk has more, 0 it reached the last blob record, -1 error (nothing
   of this step applied to the LSM; DEK updates already committed to the
   packs are harmless, see above). */
int casbox_rekey_step(struct casbox_lsm *lsm,
		      struct casbox_pack_store *packs,
		      const struct cas_keyring *keyring,
		      uint32_t old_key_id, unsigned int max_records,
		      buffer_t *pos, casbox_rekey_callback_t *callback,
		      void *context, struct casbox_rekey_stats *stats,
		      const char **error_r);

/* Count blob records whose wrapped DEK names key_id, and those whose
   wrapped DEK names neither it nor any slot of keyring (foreign_r).
   Call with the write lock held (an open batch) to get an answer that
   no save can invalidate before the lock goes. Returns 0 ok, -1. */
int casbox_rekey_count(struct casbox_lsm *lsm,
		       const struct cas_keyring *keyring, uint32_t key_id,
		       uint64_t *count_r, uint64_t *foreign_r,
		       const char **error_r);

/* Key rotation --finish (doc/doveadm.md): the re-seal steps after the
   DEK walk. Each is idempotent (what is under the current epoch is left
   alone), so a run killed anywhere redoes at most one step.

   One step of the sealed-metadata walk, as casbox_rekey_step() for blob
   records: under the write lock, from after pos (opaque: give an empty
   buffer to start), re-seal the sealed BODYSTRUCTURE/ENVELOPE metadata
   of message records (inline, or the shared 's' record a record names)
   that opens under an older epoch, and MAC each message record whose
   metadata changed or whose MAC is of an older epoch again under the
   current one; up to max_records rewritten records (stats->rewrapped),
   committed as one LSM batch. ->failed counts metadata that opens under
   no epoch the key ring holds (left as it is), ->bad_records records
   that fail to verify. Returns 1 more, 0 done, -1 error (nothing of
   this step applied). */
struct casbox_store;
int casbox_rekey_meta_step(struct casbox_store *store,
			   unsigned int max_records, buffer_t *pos,
			   struct casbox_rekey_stats *stats,
			   const char **error_r);
/* The same walk over every other authenticated record (the records
   marker, flag, shared-metadata, metadata refcount and retained
   records, casbox-record-auth.h): each whose MAC is of an older epoch
   is MACed again under the current one, its contents unchanged; a
   cross-message record (casbox-xmsg.h) of an older epoch is deleted
   (its key is a hash under that epoch's key). After both walks no
   record needs an older epoch's record key. */
int casbox_rekey_records_step(struct casbox_store *store,
			      unsigned int max_records, buffer_t *pos,
			      struct casbox_rekey_stats *stats,
			      const char **error_r);
/* The LSM's tables, WAL and MANIFEST sealed again under the current
   epoch's LSM key (casbox_lsm_reseal(), crash-safe; nothing to do when
   they already are). After it the old epoch's LSM key opens nothing
   the store uses. Returns 0 ok, -1 error. */
int casbox_rekey_lsm(struct casbox_store *store, const char **error_r);
/* Re-seal the compression dictionaries (packs/dict-*.cbd) under the
   current epoch, each replaced atomically. Returns 0 ok, -1 error. */
int casbox_rekey_dicts(struct casbox_pack_store *packs,
		       struct casbox_rekey_stats *stats,
		       const char **error_r);

/* The lowest and highest id of the packs in the store now (local or
   uploaded; 0, 0 = none): the packs step of --finish runs gc --all until
   no pack that existed when it began is left. Returns 0 ok, -1 error. */
int casbox_rekey_oldest_pack(struct casbox_pack_store *packs,
			     uint32_t *oldest_r, uint32_t *newest_r,
			     const char **error_r);

/* The durable progress marker of --finish, root_dir/rotate-finish:
     casbox-rotate-finish 1
     epoch <the epoch being finished into>
     done <name of the last step completed>
   written atomically (temporary file, fsync, rename, directory fsync).
   read: 1 and *step_r = the last step done, 0 none for this epoch (no
   file, or one of an earlier rotation), -1 unreadable/damaged. */
int casbox_rekey_progress_read(const char *root_dir, uint32_t epoch,
			       const char **step_r, const char **error_r);
int casbox_rekey_progress_write(const char *root_dir, uint32_t epoch,
				const char *step, bool fsync,
				const char **error_r);
int casbox_rekey_progress_remove(const char *root_dir, const char **error_r);

#endif
