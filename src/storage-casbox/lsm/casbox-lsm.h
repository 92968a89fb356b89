#ifndef CASBOX_LSM_H
#define CASBOX_LSM_H

/* casbox-lsm: a crash-safe, multi-process ordered key-value store, one
   per user store (see doc/casbox-lsm.md).

   Keys and values are byte strings (keys at most 1 KiB, values at most
   16 MiB). Keys sort by memcmp() with the shorter key first on a tie,
   so big-endian integers in keys iterate in numeric order.

   Concurrency: any number of processes may open the same directory.
   Writers serialise on the store's write lock (Dovecot lock_method:
   fcntl or flock = a robust mutex shared through <dir>/LOCK, or
   dotlock). Readers never block writers; a reader sees
   the state as of its last casbox_lsm_refresh() (or open), plus its
   own committed batches.

   Durability: casbox_lsm_batch_commit() returns 1 only after the batch
   is in the WAL and (unless fsync is disabled) fdatasync()ed. A crash
   at any point leaves every acknowledged batch visible after reopen and
   never exposes part of a batch. */

#include "array.h"
#include "file-lock.h"

struct casbox_lsm;
struct casbox_lsm_batch;
struct casbox_lsm_iter;
struct cas_io;

#define CASBOX_LSM_MAX_KEY_SIZE 1024
#define CASBOX_LSM_MAX_VALUE_SIZE (16 * 1024 * 1024)

/* Sealing (format 2, doc/casbox-lsm.md "Sealing"). With a codec every
   table block (data, index, bloom) is zstd-compressed and encrypted
   (XChaCha20-Poly1305, AAD = kind, epoch, file number, offset), every
   WAL record encrypted, and the MANIFEST carries the key's fingerprint
   and a MAC, so no record is readable on disk and tables cannot be
   swapped in or out without the key. Each table and WAL records the
   epoch of the key it was sealed with; reading an older epoch's table
   asks get_key() for that epoch. Without a codec the store writes the
   plaintext format 1 (library tests only) and refuses a sealed one.
   A codec store still reads format-1 tables and WAL (an upgrade):
   new writes are sealed, a plaintext WAL is flushed away before the
   first append, merges rewrite plaintext tables sealed, and
   casbox_lsm_reseal() rewrites everything. */
#define CASBOX_LSM_KEY_SIZE 32
#define CASBOX_LSM_FINGERPRINT_SIZE 32
/* The "epoch" of a format-1 (plaintext) table, WAL or MANIFEST. */
#define CASBOX_LSM_EPOCH_PLAINTEXT 0xffffffffU

struct casbox_lsm_codec {
	void *context;
	/* The epoch new tables, WAL files and manifests are sealed under. */
	uint32_t (*current_epoch)(void *context);
	/* The 32-byte LSM key of epoch. Returns 0 ok, -1 this key does not
	   hold that epoch (error_r says so). */
	int (*get_key)(void *context, uint32_t epoch,
		       unsigned char key_r[CASBOX_LSM_KEY_SIZE],
		       const char **error_r);
	/* The key's public fingerprint: written into the MANIFEST and
	   compared (constant time) before anything is decrypted, so
	   another store's key fails with "fingerprint" in the error. */
	unsigned char fingerprint[CASBOX_LSM_FINGERPRINT_SIZE];
};

struct casbox_lsm_settings {
	/* Directory of the store; created (mode 0700) if missing. */
	const char *dir;
	/* FALSE only for mail_fsync=never: commits are then not synced. */
	bool fsync;
	enum file_lock_method lock_method;
	/* How long to wait for the write lock before failing (0 = 30s). */
	unsigned int lock_timeout_secs;
	/* Flush the memtable to a table when the WAL passes this size
	   (0 = default 4 MiB). */
	size_t wal_flush_bytes;
	/* Bound of the process's block cache of table blocks, shared by
	   every store the process has open (the last opened sets it;
	   0 = 8 MiB, LevelDB's default). */
	size_t cache_bytes;
	/* File I/O table; NULL = the real POSIX one. Tests inject faults. */
	const struct cas_io *io;
	/* Parent of the named events (casbox_lsm_flush_finished,
	   casbox_lsm_compaction_finished; doc/events.md), which inherit
	   its categories and fields. NULL = a parentless event. */
	struct event *event;
	/* NULL = plaintext format 1 (tests); see struct casbox_lsm_codec.
	   Must stay valid while the store is open. */
	const struct casbox_lsm_codec *codec;
};

/* What a disk reader sees without the key (MANIFEST header and file
   sizes): whether a store exists and may hold data. */
struct casbox_lsm_info {
	/* format 2: the MANIFEST names the key's fingerprint */
	bool sealed;
	unsigned char fingerprint[CASBOX_LSM_FINGERPRINT_SIZE];
	unsigned int tables;
	/* bytes past the WAL's header (records, maybe a torn tail) */
	uoff_t wal_record_bytes;
};
/* Read dir's MANIFEST (unauthenticated: for deciding, e.g., whether a
   missing key may be created, never for trusting content). Returns 1
   ok, 0 no store at dir, -1 error (damaged MANIFEST, I/O). */
int casbox_lsm_peek(const char *dir, struct casbox_lsm_info *info_r,
		    const char **error_r);

/* Open (creating if missing) the store. Replays the WAL; a torn tail
   is cut off cleanly. Returns 1 ok, -1 error (error_r says why, with
   file and offset for corruption). */
int casbox_lsm_open(const struct casbox_lsm_settings *set,
		    struct casbox_lsm **lsm_r, const char **error_r);
void casbox_lsm_close(struct casbox_lsm **lsm);

/* See what other processes committed since the last open/refresh.
   No system call when nothing changed since (the last writer's state
   stamp in the lock page equals ours); else a stat and a read of the
   WAL tail.
   Returns 1 ok, -1 error. */
int casbox_lsm_refresh(struct casbox_lsm *lsm, const char **error_r);

/* Point lookup. Returns 1 found (value appended to value_r), 0 not
   found, -1 error. */
int casbox_lsm_get(struct casbox_lsm *lsm, const void *key, size_t key_size,
		   buffer_t *value_r, const char **error_r);

/* Write batch. begin takes the write lock and refreshes, so reads done
   with casbox_lsm_get() while the batch is open see the latest state
   and no other process commits in between (read-modify-write of
   refcounts is safe). Puts and deletes are buffered; reads do not see
   them until commit. Returns 1 ok, -1 error (lock timeout etc.). */
int casbox_lsm_batch_begin(struct casbox_lsm *lsm,
			   struct casbox_lsm_batch **batch_r,
			   const char **error_r);
/* After a failed batch_begin(): TRUE if it failed only because another
   process held the write lock past lock_timeout_secs, i.e. the store is
   busy, not damaged. */
bool casbox_lsm_lock_timed_out(const struct casbox_lsm *lsm);
void casbox_lsm_batch_put(struct casbox_lsm_batch *batch,
			  const void *key, size_t key_size,
			  const void *value, size_t value_size);
void casbox_lsm_batch_delete(struct casbox_lsm_batch *batch,
			     const void *key, size_t key_size);
/* Commit this batch without fdatasync(): at commit it is visible to
   every process and survives a crash of this one, but a power loss may
   take it, with the batches after it, until a later synced commit or a
   flush makes the WAL durable (fdatasync covers the earlier bytes of
   the file too). Replay then ends at the first incomplete record, as
   for a torn write. For writes whose loss is harmless: what Dovecot
   itself does not fsync under mail_fsync = optimized. */
void casbox_lsm_batch_set_lazy(struct casbox_lsm_batch *batch);
/* After the commit, flush the WAL into a table even below
   wal_flush_bytes: for the last batch of a transaction that committed
   in pieces, so the sessions that open the store next do not replay
   its tail. */
void casbox_lsm_batch_set_flush(struct casbox_lsm_batch *batch);
/* Bytes the batch's entries take in the WAL so far. One commit takes at
   most CASBOX_LSM_WAL_MAX_PAYLOAD (256 MiB, "batch too large"). */
size_t casbox_lsm_batch_get_size(const struct casbox_lsm_batch *batch);
/* Append, sync, apply, unlock; may flush/compact inline afterwards.
   Returns 1 when durable, -1 on error (nothing applied). Frees batch
   either way. */
int casbox_lsm_batch_commit(struct casbox_lsm_batch **batch,
			    const char **error_r);
void casbox_lsm_batch_rollback(struct casbox_lsm_batch **batch);

/* Iterate keys starting with prefix, in key order, over a consistent
   snapshot. key/value pointers stay valid until the next _next(). */
struct casbox_lsm_iter *
casbox_lsm_iter_init(struct casbox_lsm *lsm, const void *prefix,
		     size_t prefix_size);
/* Start at the first key >= start (still limited to the prefix). */
void casbox_lsm_iter_seek(struct casbox_lsm_iter *iter,
			  const void *start, size_t start_size);
bool casbox_lsm_iter_next(struct casbox_lsm_iter *iter,
			  const unsigned char **key_r, size_t *key_size_r,
			  const unsigned char **value_r, size_t *value_size_r);
/* Returns 1 ok, -1 if iteration stopped on an error. */
int casbox_lsm_iter_deinit(struct casbox_lsm_iter **iter,
			   const char **error_r);

/* Bytes of table blocks the process's block cache holds now (at most
   the last opened store's cache_bytes). */
size_t casbox_lsm_cache_get_used(void);

/* Flush the memtable and merge all tables into one (doveadm, tests). */
int casbox_lsm_compact(struct casbox_lsm *lsm, const char **error_r);

/* Key rotation (doveadm casbox key rotate --finish) and upgrades:
   make everything the store uses sealed under the codec's current
   epoch. Under the write lock: the memtable is flushed into a new
   table, a new WAL is started and all tables are merged into one, each
   step installed by an atomic MANIFEST swap (crash-safe: a crash leaves
   the old or the new state; rerun to finish). Does nothing (no write)
   when casbox_lsm_get_epochs() already returns only the current epoch
   and there is at most one table. Needs a codec. Returns 1 ok, -1
   error. */
int casbox_lsm_reseal(struct casbox_lsm *lsm, const char **error_r);
/* The epochs the store's MANIFEST, WAL and tables are sealed under as
   of the last open/refresh, sorted, each once; CASBOX_LSM_EPOCH_PLAINTEXT
   (the largest value) for format-1 parts. After a successful
   casbox_lsm_reseal() (and until the current epoch changes) it is just
   the current epoch: key rotation may then forget older LSM keys. */
void casbox_lsm_get_epochs(struct casbox_lsm *lsm, ARRAY_TYPE(uint32_t) *epochs);
/* TRUE if the MANIFEST is format 2 (fingerprint checked at load). */
bool casbox_lsm_is_sealed(struct casbox_lsm *lsm);

/* Verify every table block and the WAL (CRC, order, footer). Calls
   report(context, file, offset, reason) for each damaged item. Returns
   1 clean, 0 damage found, -1 I/O error. */
typedef void casbox_lsm_damage_callback_t(void *context, const char *file,
					  uoff_t offset, const char *reason);
int casbox_lsm_verify(struct casbox_lsm *lsm,
		      casbox_lsm_damage_callback_t *report, void *context,
		      const char **error_r);

#endif
