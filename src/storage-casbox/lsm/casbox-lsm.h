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

#include "file-lock.h"

struct casbox_lsm;
struct casbox_lsm_batch;
struct casbox_lsm_iter;
struct cas_io;

#define CASBOX_LSM_MAX_KEY_SIZE 1024
#define CASBOX_LSM_MAX_VALUE_SIZE (16 * 1024 * 1024)

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
	/* File I/O table; NULL = the real POSIX one. Tests inject faults. */
	const struct cas_io *io;
	/* Parent of the named events (casbox_lsm_flush_finished,
	   casbox_lsm_compaction_finished; doc/events.md), which inherit
	   its categories and fields. NULL = a parentless event. */
	struct event *event;
};

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

/* Flush the memtable and merge all tables into one (doveadm, tests). */
int casbox_lsm_compact(struct casbox_lsm *lsm, const char **error_r);

/* Verify every table block and the WAL (CRC, order, footer). Calls
   report(context, file, offset, reason) for each damaged item. Returns
   1 clean, 0 damage found, -1 I/O error. */
typedef void casbox_lsm_damage_callback_t(void *context, const char *file,
					  uoff_t offset, const char *reason);
int casbox_lsm_verify(struct casbox_lsm *lsm,
		      casbox_lsm_damage_callback_t *report, void *context,
		      const char **error_r);

#endif
