#ifndef CRASHFS_H
#define CRASHFS_H

/* crashfs: a cas_io table (src/durable/cas-io.h) over one real directory that remembers
   what a power loss would keep, and injects faults.

   It tracks every file in the directory: the content as of its last
   fsync() and the names as of the last fsync_dir(). crashfs_power_loss()
   rewrites the directory to that durable state (optionally keeping a
   random part of unsynced appends), the way a crashed kernel would.
   Faults: crash at the Nth counted operation (pwrite, fsync, rename, link,
   fsync_dir), optionally writing a random prefix first (torn write);
   after a crash every operation fails with EIO until power loss.
   ENOSPC after a byte budget. Not thread-safe; one directory at a time. */

#include "cas-io.h"

enum crashfs_fault {
	/* the Nth operation fails and nothing of it lands */
	CRASHFS_FAULT_CRASH,
	/* a pwrite lands partially, then the crash */
	CRASHFS_FAULT_TORN,
};

enum crashfs_loss {
	/* only fsynced data and fsync_dir()ed names survive */
	CRASHFS_LOSS_DROP_UNSYNCED,
	/* additionally a random prefix of unsynced appends survives */
	CRASHFS_LOSS_KEEP_SOME,
};

extern const struct cas_io crashfs_io;

/* Start tracking dir; its existing files count as durable. */
void crashfs_init(const char *dir, unsigned int seed);
void crashfs_deinit(void);

/* Crash at the nth counted operation from now (1 = the next); 0 = off. */
void crashfs_crash_at(unsigned int n, enum crashfs_fault fault);
/* pwrite fails with ENOSPC once this many more bytes were written;
   (uoff_t)-1 = off. */
void crashfs_enospc_after(uoff_t bytes);
/* Counted operations so far, and whether the crash happened. */
unsigned int crashfs_op_count(void);
bool crashfs_crashed(void);

/* Rewrite the directory to what survives a power loss now, and carry
   on from there (the crash state is cleared). */
void crashfs_power_loss(enum crashfs_loss loss);

#endif
