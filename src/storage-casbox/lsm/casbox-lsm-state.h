#ifndef CASBOX_LSM_STATE_H
#define CASBOX_LSM_STATE_H

/* The store handle, shared by casbox-lsm.c and casbox-lsm-flush.c. */

#include "casbox-lsm-private.h"
#include "casbox-lsm-manifest.h"

#include <sys/stat.h>

/* The shared-memory write lock (casbox-lsm-shm.c) needs OFD locks and
   robust process-shared mutexes (Linux; Makefile.am sets _GNU_SOURCE
   for F_OFD_SETLK); elsewhere fcntl/flock are used as is. */
#ifdef __linux__
#  define LSM_HAVE_SHM
#endif

/* A dotlock older than this whose owner is gone is taken over. */
#define LSM_DOTLOCK_STALE_SECS 120
/* Merge tables when there are more than this many. */
#define LSM_MAX_TABLES 6

ARRAY_DEFINE_TYPE(lsm_table, struct casbox_lsm_table *);

struct casbox_lsm {
	struct casbox_lsm_settings set;
	const struct cas_io *io;
	/* child of set.event: the parent of every named event */
	struct event *event;
	char *dir, *manifest_path, *lock_path;
	unsigned int lock_timeout_secs;
	size_t wal_flush_bytes;

	int lock_fd;
	struct file_lock *lock;
	/* the page of LOCK with the shared mutex (NULL with dotlock) */
	struct casbox_lsm_shm *shm;
	/* at lock time the stamp matched our state: no refresh needed */
	bool shm_current;
	bool locked;
	/* the last lock attempt failed because another process held the
	   lock past the timeout (not because something is broken) */
	bool lock_timed_out;
	/* identity of dir, and the next handle of this process holding
	   a write lock (see casbox_lsm_lock()) */
	dev_t dir_dev;
	ino_t dir_ino;
	struct casbox_lsm *lock_next;

	/* state as of the last load/refresh */
	struct stat manifest_st;
	uint64_t generation, wal_no, next_file_no, flushed_seq;
	ARRAY_TYPE(lsm_table) tables; /* newest first */
	struct casbox_lsm_memtable *mt;
	int wal_fd;
	/* end of the last complete record we applied */
	uoff_t wal_offset;
	/* the WAL's size at the last read (>= wal_offset) */
	uoff_t wal_file_size;
	uint64_t last_seq;

	/* sealing: the MANIFEST's format and MAC epoch, the WAL's epoch,
	   header size and key (NULL: plaintext WAL), the keys fetched
	   from the codec so far */
	bool sealed;
	uint32_t mac_epoch, wal_epoch;
	size_t wal_hdr_size;
	const struct casbox_lsm_key *wal_key;
	ARRAY(struct casbox_lsm_key *) keys;

	buffer_t *read_buf, *write_buf, *batch_buf, *plain_buf;
	struct casbox_lsm_batch *batch;
	/* a failed commit could not be undone in the WAL */
	bool broken;
};

const char *casbox_lsm_path(struct casbox_lsm *lsm, uint64_t file_no,
			    const char *ext);
/* path, or the current WAL's path if NULL (built only for errors) */
const char *casbox_lsm_wal_path(struct casbox_lsm *lsm, const char *path);
int casbox_lsm_lock(struct casbox_lsm *lsm, const char **error_r);
/* The key of epoch (cached; owned by lsm). Returns 0 ok, -1 no codec or
   the codec has no such epoch. */
int casbox_lsm_epoch_key(struct casbox_lsm *lsm, uint32_t epoch,
			 const struct casbox_lsm_key **key_r,
			 const char **error_r);
/* The key new files are sealed with: NULL without a codec. */
int casbox_lsm_write_key(struct casbox_lsm *lsm,
			 const struct casbox_lsm_key **key_r,
			 const char **error_r);
/* Release the write lock. current = our state is exactly what is on
   disk (the operation succeeded): publish it, so the next holder and
   readers can skip their refresh. */
void casbox_lsm_unlock_state(struct casbox_lsm *lsm, bool current);
/* Release without publishing (after a failure: others re-read). */
void casbox_lsm_unlock(struct casbox_lsm *lsm);

/* casbox-lsm-shm.c */
#ifdef LSM_HAVE_SHM
int casbox_lsm_shm_open(struct casbox_lsm *lsm, const char **error_r);
void casbox_lsm_shm_close(struct casbox_lsm *lsm);
int casbox_lsm_shm_lock(struct casbox_lsm *lsm, const char **error_r);
void casbox_lsm_shm_unlock(struct casbox_lsm *lsm, bool current);
/* Lock-free: TRUE if the last clean stamp equals our state, and no
   holder is changing anything right now. */
bool casbox_lsm_shm_unchanged(struct casbox_lsm *lsm);
#endif
/* Refresh; check_manifest = FALSE skips the MANIFEST stat (enough for
   appending, not for flushing). */
int casbox_lsm_refresh_full(struct casbox_lsm *lsm, bool check_manifest,
			    const char **error_r);
/* Returns 1 ok, 0 no MANIFEST, -1 error. */
int casbox_lsm_load(struct casbox_lsm *lsm, const char **error_r);

/* casbox-lsm-flush.c; all need the write lock. */
/* epoch_r: the epoch the new WAL is sealed with (or PLAINTEXT) */
int casbox_lsm_wal_create(struct casbox_lsm *lsm, uint64_t wal_no,
			  uint32_t *epoch_r, const char **error_r);
/* With a codec the manifest is written sealed (format 2) under the
   current epoch (its sealed, fingerprint, mac_epoch fields are set). */
int casbox_lsm_manifest_write(struct casbox_lsm *lsm,
			      struct casbox_lsm_manifest *man,
			      const char **error_r);
/* Cut a torn tail left by a writer that crashed. */
int casbox_lsm_wal_cut_tail(struct casbox_lsm *lsm, const char **error_r);
/* Append, sync (if sync and fsync is enabled) and apply one batch. */
int casbox_lsm_wal_append(struct casbox_lsm *lsm, const buffer_t *entries,
			  unsigned int count, bool sync,
			  const char **error_r);
/* Flush the memtable into a table if the WAL passed wal_flush_bytes
   (force: if the memtable holds anything), then compact if needed. */
int casbox_lsm_flush_locked(struct casbox_lsm *lsm, bool force,
			    const char **error_r);
/* Flush the memtable and start a new (sealed) WAL even if the memtable
   is empty: before the first append to a plaintext WAL. */
int casbox_lsm_flush_wal_locked(struct casbox_lsm *lsm, const char **error_r);

#endif
