#ifndef CASBOX_STORE_H
#define CASBOX_STORE_H

/* casbox-store: one user's store under the casbox root: the LSM (lsm/),
   the key ring (casbox_key_file) and the packs (packs/). The storage
   glue talks only to this layer; it knows the record layout
   (casbox-records.h) and keeps blob refcounts consistent. */

#include "fsync-mode.h"
#include "file-lock.h"
#include "seq-range-array.h"
#include "casbox-records.h"

struct istream;
struct casbox_settings;
struct casbox_store;
struct casbox_store_txn;

/* Open the LSM; keys and packs are opened on first need. Returns 0 ok,
   -1 error. */
int casbox_store_open(const char *root_dir,
		      const struct casbox_settings *set,
		      enum fsync_mode fsync_mode,
		      enum file_lock_method lock_method,
		      struct casbox_store **store_r, const char **error_r);
/* The store's maintenance lock, <root>/maintenance.lock: gc takes it
   exclusive (it deletes packs), scrub shared (it reads every pack and
   would report the frames of a pack gc deleted mid-scan as missing).
   Saves, reads and key rotation do not take it. Waits up to
   timeout_secs. Returns 1 locked (file_lock_free() releases it), 0
   timed out, -1 error; error_r is set for 0 and -1. */
#define CASBOX_STORE_MAINTENANCE_LOCK "maintenance.lock"
int casbox_store_maintenance_lock(struct casbox_store *store, bool exclusive,
				  unsigned int timeout_secs,
				  struct file_lock **lock_r,
				  const char **error_r);
void casbox_store_close(struct casbox_store **store);
/* Free what closed stores leave pooled in the process for the next
   open (wiped locked buffers: key rings, LSM keys, blob scratch keys,
   decoded bases). Plugin deinit. */
void casbox_store_free_pools(void);

/* Load (or, for an empty store with casbox_key_autocreate, create) the
   key ring and open the packs. Returns 0 ok, -1 error (a missing key
   for a store with data, or a key that is not the store's, are errors
   naming the key file). */
int casbox_store_open_keys(struct casbox_store *store, const char **error_r);
/* Start a new pack: saves and gc's copies then append there, not to a
   pack gc is about to delete. Needs casbox_store_open_keys(). Returns 0
   ok, -1 error. */
int casbox_store_pack_rotate(struct casbox_store *store, const char **error_r);
/* A store without its LSM (rebuild --from-packs, where the LSM may be
   missing or unreadable): only casbox_store_open_keys() (which then
   never creates a key and has no 'K' record to check it against: the
   sealed records the caller opens do), the get_*() functions and close. */
void casbox_store_open_nolsm(const char *root_dir,
			     const struct casbox_settings *set,
			     enum fsync_mode fsync_mode,
			     enum file_lock_method lock_method,
			     struct casbox_store **store_r);
/* Such a store's password-mode key password (not owned, never logged),
   instead of the settings' one; NULL: the public part only. Call before
   casbox_store_open_keys(). */
void casbox_store_set_key_password(struct casbox_store *store,
				   const char *password);
/* TRUE if the store is in password key mode and this process cannot
   open its DEKs: no password, or unlocking with it failed. */
bool casbox_store_key_locked(struct casbox_store *store);

/* Keep the read fd of the last pack file a blob stream closed open for
   the next read of the same pack (casbox_pack_store_keep_read_fd(): one
   open() and close() less per message a FETCH reads); the caller
   releases it whenever the process may go idle (the glue: at every
   mailbox sync), and the store's close does. Between two releases
   casbox_store_msg_open() checks the key file once, not per message
   (keys a read meets and the ring lacks are loaded when met). */
void casbox_store_keep_read_fd(struct casbox_store *store);
void casbox_store_release_read_fd(struct casbox_store *store);

/* Reload the key ring if key rotation rewrote the key file since it was
   loaded (one stat() otherwise; the key ring pointer stays valid, see
   cas_keyring_refresh()). No-op before the keys are loaded. Returns 0
   ok, -1 error (missing or damaged key file, or another store's key). */
int casbox_store_refresh_keys(struct casbox_store *store,
			      const char **error_r);

/* Keyed content address of input's bytes [offset, offset+size). Needs
   the keys. Returns 0 ok, -1 read error. */
int casbox_store_blob_id(struct casbox_store *store, struct istream *input,
			 uoff_t offset, uoff_t size,
			 struct cas_blob_id *id_r, const char **error_r);

int casbox_store_mailbox_put(struct casbox_store *store,
			     const guid_128_t mailbox_guid,
			     const struct casbox_mailbox_record *rec,
			     const char **error_r);
/* Delete the mailbox record and release any message records left. */
int casbox_store_mailbox_delete(struct casbox_store *store,
				const guid_128_t mailbox_guid,
				const char **error_r);

/* Seal a mailbox recovery record into the packs (its own pack
   transaction, fsynced) after a mailbox was created, renamed, or got
   another public GUID or UIDVALIDITY (rec = its record now), or was
   deleted (deleted = TRUE; rec's name is kept for the log). Only the
   pack append lock is taken. Returns 0 ok, -1 error. */
int casbox_store_mailbox_recovery(struct casbox_store *store,
				  const guid_128_t mailbox_guid,
				  const guid_128_t public_guid,
				  const struct casbox_mailbox_record *rec,
				  bool deleted, const char **error_r);
/* Find the mailbox record of a mailbox name (used when its index is
   gone). Returns 1 found, 0 not found, -1 error. */
int casbox_store_mailbox_find(struct casbox_store *store, const char *name,
			      pool_t pool, guid_128_t mailbox_guid_r,
			      struct casbox_mailbox_record *rec_r,
			      const char **error_r);
/* Call callback for every mailbox record (rebuild of the mailbox list).
   Returns 0 ok, -1 error (a record that fails to decode is an error). */
typedef void casbox_store_mailbox_callback_t(void *context,
		const guid_128_t mailbox_guid,
		const struct casbox_mailbox_record *rec);
int casbox_store_mailbox_iterate(struct casbox_store *store,
				 casbox_store_mailbox_callback_t *callback,
				 void *context, const char **error_r);
/* Call callback for every message record of a mailbox, in UID order,
   with the flags, keywords and modseq of its flag record where it has
   one. Returns 0 ok, -1 error (a record that fails to decode is an
   error). */
typedef void casbox_store_msg_callback_t(void *context, uint32_t uid,
					 const struct casbox_msg_record *rec);
int casbox_store_msg_iterate(struct casbox_store *store,
			     const guid_128_t mailbox_guid,
			     casbox_store_msg_callback_t *callback,
			     void *context, const char **error_r);

/* UIDs of a mailbox's message records at or above first_uid, in order,
   appended to uids. The store variant reads after a refresh, without
   the write lock (a hint: a save may be committing); the txn variant
   sees the latest state under the write lock. Returns 0 ok, -1 error. */
int casbox_store_msg_uids_from(struct casbox_store *store,
			       const guid_128_t mailbox_guid,
			       uint32_t first_uid, ARRAY_TYPE(uint32_t) *uids,
			       const char **error_r);
int casbox_store_txn_msg_uids_from(struct casbox_store_txn *txn,
				   const guid_128_t mailbox_guid,
				   uint32_t first_uid,
				   ARRAY_TYPE(uint32_t) *uids,
				   const char **error_r);

/* The message record, with the flags, keywords and modseq of its flag
   record where it has one. Returns 1 found, 0 not found (after a
   refresh), -1 error. */
int casbox_store_msg_lookup(struct casbox_store *store,
			    const guid_128_t mailbox_guid, uint32_t uid,
			    pool_t pool, struct casbox_msg_record *rec_r,
			    const char **error_r);
/* The message bytes: the concatenation of its blobs. Each blob verifies
   itself while read (errors surface as stream errors). Every pack is
   opened here, so a gc that moves the blobs afterwards does not disturb
   the stream. Returns 1 ok, 0 when a blob of rec has no record any more
   (the message was expunged after rec was read, or the store is
   damaged: error_r names the blob), -1 error (no keys, I/O). */
int casbox_store_msg_open(struct casbox_store *store,
			  const struct casbox_msg_record *rec,
			  struct istream **input_r, const char **error_r);

/* A blob's plaintext from its blob record, a delta blob with its base
   (looked up in the LSM as last read, from the base cache or decoded):
   for admin tools that walk blob records. Its pack and its bases' are
   opened now; one that gc unlinked since rec was read makes the record
   be read again from the refreshed LSM, as for a message. Needs the
   keys. Returns 1 ok, -1 error (the blob gone, a base missing or
   damaged; error_r names them). */
struct casbox_blob_record;
int casbox_store_blob_open_record(struct casbox_store *store,
				  const struct cas_blob_id *id,
				  const struct casbox_blob_record *rec,
				  struct istream **input_r,
				  const char **error_r);

/* Write transaction: holds the LSM write lock until commit/rollback. */
int casbox_store_txn_begin(struct casbox_store *store,
			   struct casbox_store_txn **txn_r,
			   const char **error_r);
/* The mailbox the following casbox_store_txn_add_msg() calls save into
   (name, UIDVALIDITY, next_uid and highest-modseq bound as the save
   knows them; public_guid may be NULL): each of those messages then
   also gets a sealed recovery record in the packs (casbox-recovery.h),
   which `doveadm casbox rebuild --from-packs` reads. Without this call
   no recovery records are written. */
void casbox_store_txn_set_recovery_mailbox(struct casbox_store_txn *txn,
		const guid_128_t mailbox_guid, const guid_128_t public_guid,
		const struct casbox_mailbox_record *rec);
/* Add a message record. part_inputs[i] gives the bytes of parts[i] for
   blobs not in the store yet; NULL part_inputs (copy) requires every
   blob to exist already. A record already under this key (left over
   from a crash before the index commit) is replaced and its blobs
   released. Returns 0 ok, -1 error; errno is ENOENT when a part without
   input is not in the store (a copy whose source was expunged, and its
   last reference dropped, before this transaction took the lock). */
int casbox_store_txn_add_msg(struct casbox_store_txn *txn,
			     const guid_128_t mailbox_guid, uint32_t uid,
			     const struct casbox_msg_record *rec,
			     struct istream *const *part_inputs,
			     const char **error_r);
/* The same for a COPY inside the store (NULL part_inputs). Its pack
   recovery is a copy record (many message records to one compressed
   meta frame, no DEKs: doc/casbox-storage.md, "Rebuild from the
   packs") in server key mode; a recovery record, as a save's, in
   password mode. */
int casbox_store_txn_add_copy(struct casbox_store_txn *txn,
			      const guid_128_t mailbox_guid, uint32_t uid,
			      const struct casbox_msg_record *rec,
			      const char **error_r);
/* A copy record is cut into a new frame when its message records reach
   this many bytes (the meta frame limit is 16 MiB; a checkpoint commits
   one sooner). */
#define CASBOX_STORE_COPY_RECORD_FLUSH (4 * 1024 * 1024)
/* Cross-message compression (casbox-xmsg.h): hints (not copied: they
   must live until then) for the next casbox_store_txn_add_msg() only.
   Its lead part, if written, is compressed against the blob the hints
   find when that pays, and recorded under its own Message-ID and
   sender. Ignored with casbox_cross_message = no or casbox_dedup = no,
   and while the key cannot decrypt (password mode without password). */
struct casbox_xmsg_hints;
void casbox_store_txn_set_xmsg_hints(struct casbox_store_txn *txn,
				     const struct casbox_xmsg_hints *hints);
/* Commit this transaction's records without fsync unless mail_fsync =
   always (casbox_lsm_batch_set_lazy()): for flag mirror updates, which
   Dovecot's index does not fsync either under mail_fsync = optimized.
   Never for a transaction that adds messages, expunges or moves blobs:
   they must be durable when acknowledged. */
void casbox_store_txn_set_lazy(struct casbox_store_txn *txn);
/* Put the mailbox record in this transaction (saves keep its next_uid
   ahead of every UID they write). The stored next_uid and highest_modseq
   never go down while the UIDVALIDITY stays: the larger of the stored
   and the new value is written. */
void casbox_store_txn_put_mailbox(struct casbox_store_txn *txn,
				  const guid_128_t mailbox_guid,
				  const struct casbox_mailbox_record *rec);
/* Remove a message record (and its flag record) and release its blobs.
   Missing is ok. */
int casbox_store_txn_expunge(struct casbox_store_txn *txn,
			     const guid_128_t mailbox_guid, uint32_t uid,
			     const char **error_r);
/* Move a message record (with its flag record applied, without its
   sealed metadata) to a retained record ('x', casbox-store-safety.h)
   expunged at the given time, keeping its blobs' references: an expunge
   inside casbox_expunge_retention. A retained record already under the
   key (a rebuild from the packs resurrected and re-expunged the UID) is
   released first. Missing is ok. */
int casbox_store_txn_retain(struct casbox_store_txn *txn,
			    const guid_128_t mailbox_guid, uint32_t uid,
			    const char *mailbox_name, time_t expunged,
			    const char **error_r);
/* Remove a retained record and release its blobs. Missing is ok. */
int casbox_store_txn_release_retained(struct casbox_store_txn *txn,
				      const guid_128_t mailbox_guid,
				      uint32_t uid, const char **error_r);
/* For the record modules beside this one (casbox-store-safety.c). */
struct casbox_lsm_batch *
casbox_store_txn_get_batch(struct casbox_store_txn *txn);
struct casbox_store *casbox_store_txn_get_store(struct casbox_store_txn *txn);
/* Mirror the index's flags/keywords/modseq of a message that has a
   record: into its flag record (a few dozen bytes), not the message
   record. A message without a record is skipped (returns 0). */
int casbox_store_txn_update_flags(struct casbox_store_txn *txn,
				  const guid_128_t mailbox_guid, uint32_t uid,
				  uint32_t flags,
				  const char *const *keywords,
				  uint64_t modseq, const char **error_r);
/* A transaction commits at most 256 MiB of LSM records at once
   (CASBOX_LSM_WAL_MAX_PAYLOAD). A copy or a flag change of some 80,000
   messages, or of a few hundred with huge headers, passes that.
   casbox_store_txn_checkpoint() commits what the transaction holds
   once it passes CASBOX_STORE_TXN_CHECKPOINT_SIZE and goes on in a new
   batch; callers call it between messages, where a crash may stop the
   work: after a save's chunk the index has not handed out its UIDs yet,
   so the next open releases its records ("Orphan records"); expunges
   and flag mirrors are right message by message. Returns 0 nothing
   done, 1 committed, -1 error (what was committed before stays; roll
   the transaction back). */
#define CASBOX_STORE_TXN_CHECKPOINT_SIZE (1024 * 1024)
/* what a blob record adds to the batch at commit, at most */
#define CASBOX_STORE_BLOB_ENTRY_SIZE 512
int casbox_store_txn_checkpoint(struct casbox_store_txn *txn,
				const char **error_r);
/* Commit the packs (fsync), then the LSM batch (fsync). Returns 0 when
   durable, -1 error (nothing applied). Frees txn either way. */
int casbox_store_txn_commit(struct casbox_store_txn **txn,
			    const char **error_r);
void casbox_store_txn_rollback(struct casbox_store_txn **txn);

/* What this process's transactions on the store did so far, counted as
   each message is added (so a rolled-back transaction counts too: take
   the difference around a successful commit). For the named events. */
struct casbox_store_stats {
	/* message parts whose blob was written: count, plaintext bytes */
	uint64_t blobs_written, written_bytes;
	/* message parts whose blob was already stored */
	uint64_t blobs_deduplicated, deduplicated_bytes;
	/* blob records ('b') put or deleted by the commits that reached
	   the LSM batch (counted there) */
	uint64_t blob_records_written;
};
void casbox_store_get_stats(struct casbox_store *store,
			    struct casbox_store_stats *stats_r);
/* Bytes appended to the packs (frames of blobs, recovery and DEK
   update records) by this process so far; 0 before the packs open. */
uint64_t casbox_store_get_pack_bytes_appended(struct casbox_store *store);

/* The parts of an open store, for admin tools (doveadm casbox) that
   walk every record and frame (casbox-store-census.h). */
struct casbox_lsm;
struct casbox_pack_store;
struct cas_keyring;
const char *casbox_store_get_root(struct casbox_store *store);
struct casbox_lsm *casbox_store_get_lsm(struct casbox_store *store);
/* Settings for opening an LSM of this store at dir (its own, or one
   rebuild --from-packs writes): fsync, lock method, event and the codec
   that seals it with the store's key (loaded here if needed; the
   settings point into store). Returns 0 ok, -1 error. */
struct casbox_lsm_settings;
int casbox_store_lsm_settings(struct casbox_store *store, const char *dir,
			      struct casbox_lsm_settings *set_r,
			      const char **error_r);
/* casbox_lsm_open() with those settings. A sealed LSM of another key is
   refused (as casbox_lsm_open() refuses it, before any MAC is checked)
   with an error naming the key file. Returns 1 ok, -1 error (as
   casbox_lsm_open() gives it: "Corrupted ..." for damage, which
   doveadm casbox scrub recognises), -2 another key's LSM. */
struct casbox_lsm;
int casbox_store_lsm_open(struct casbox_store *store,
			  const struct casbox_lsm_settings *set,
			  struct casbox_lsm **lsm_r, const char **error_r);
/* NULL until casbox_store_open_keys() or casbox_store_open_packs_keyless() */
struct casbox_pack_store *casbox_store_get_packs(struct casbox_store *store);
/* NULL until casbox_store_open_keys() */
struct cas_keyring *casbox_store_get_keyring(struct casbox_store *store);
/* Without the key: open the packs for the keyless frame scan only (no
   blob can be decoded). Returns 1 ok (or already open), 0 not possible
   (the store has dictionaries, which are sealed with the key), -1
   error. */
int casbox_store_open_packs_keyless(struct casbox_store *store,
				    const char **error_r);

/* Chunks this process has decoded (authenticated and decompressed) so
   far, over all stores, and their plaintext bytes: statistics for the
   debug log and tests of what a read touched. */
uint64_t casbox_store_get_chunks_decoded(void);
uint64_t casbox_store_get_bytes_decoded(void);

/* dict train: a zstd dictionary from up to max_samples of the store's
   small blobs (those the pack store would compress with a dictionary),
   one in holdout_every held out (up to max_heldout) and compressed
   without and with the new dictionary. Needs casbox_store_open_keys().
   The samples are wiped after use. Returns 1 trained, 0 too few small
   blobs (error_r says how many), -1 error. */
struct casbox_store_dict_train_result {
	uint32_t dict_id;
	unsigned int samples, heldout;
	/* of the held-out blobs */
	uint64_t plain_bytes, without_bytes, with_bytes;
};
int casbox_store_dict_train(struct casbox_store *store,
			    unsigned int max_samples,
			    unsigned int holdout_every,
			    unsigned int max_heldout,
			    struct casbox_store_dict_train_result *res_r,
			    const char **error_r);
/* casbox_dict_autotrain: train the store's first dictionary once it
   holds min_blobs small blobs (0 = never). Does nothing when a
   dictionary exists (one another process wrote included), when the
   process cannot decrypt (password mode without the password), or when
   fewer than min_blobs of the first 16 * min_blobs blob records are
   small. Needs casbox_store_open_keys(). Returns 1 trained (res_r
   filled), 0 nothing to do, -1 error. */
int casbox_store_dict_autotrain(struct casbox_store *store,
				unsigned int min_blobs,
				struct casbox_store_dict_train_result *res_r,
				const char **error_r);

/* The one "has data" rule: TRUE if the store holds anything a new key
   could not read: a sealed LSM (bound to its key's fingerprint), a
   plaintext (format 1) LSM with a table or WAL records, or any file in
   packs/ (a pack, or a dictionary, which is sealed with the key). Reads
   only what is plaintext on disk (casbox_lsm_peek()): works without
   the key. Before a key is created for a store (casbox_key_autocreate,
   doveadm casbox key init). Returns 0 ok, -1 error. */
int casbox_store_has_data(struct casbox_store *store, bool *have_r,
			  const char **error_r);

/* Hold the store's write lock (the LSM's, which every writer of records
   takes) without writing anything: key rotation rewrites the key file
   under it, so no writer wraps a DEK with a key slot that is going away.
   Returns 0 ok, -1 error (lock timeout included). */
struct casbox_store_write_lock;
int casbox_store_write_lock(struct casbox_store *store,
			    struct casbox_store_write_lock **lock_r,
			    const char **error_r);
void casbox_store_write_unlock(struct casbox_store_write_lock **lock);

/* How the store was opened: its settings (as given to the open), whether
   it fsyncs (mail_fsync is not "never") and its lock method. */
const struct casbox_settings *
casbox_store_get_settings(struct casbox_store *store);
bool casbox_store_get_fsync(struct casbox_store *store);
enum file_lock_method casbox_store_get_lock_method(struct casbox_store *store);
/* The object-storage settings of set into pack_set (the pack store's
   casbox_pack_storage, cache dir and size). */
struct casbox_pack_settings;
void casbox_store_pack_set_storage(const struct casbox_settings *set,
				   struct casbox_pack_settings *pack_set);
/* TRUE if the last failed message open failed because object storage
   did (temporary: try again later; nothing is damaged). */
bool casbox_store_error_is_temporary(struct casbox_store *store);

#endif
