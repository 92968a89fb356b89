#ifndef CASBOX_STORE_GC_H
#define CASBOX_STORE_GC_H

/* casbox-store-gc: rewrite the packs whose dead share passes
   casbox_gc_dead_ratio (doc/doveadm.md, "gc"; the steps and the lock
   order are at the top of casbox-store-gc.c). */

struct casbox_store;

/* What a run did: the columns of doveadm casbox gc, in its order. */
struct casbox_store_gc_stats {
	uint64_t packs_selected, packs_deleted, blobs_moved;
	uint64_t records_dropped, bytes_selected, bytes_written;
	uint64_t bytes_reclaimed, recovery_kept, recovery_dropped;
	uint64_t dek_updates, recovery_written;
	/* retained mail released past casbox_expunge_retention, its bytes,
	   dup records past casbox_duplicate_window (casbox-store-safety.h) */
	uint64_t retained_released, retained_bytes_released;
	uint64_t duplicates_expired;
	/* blob keys records written for dropped recovery records whose
	   blobs other messages (copies) still use */
	uint64_t blob_keys_written;
};

/* Open the store's keys (or fail), then census, copy, switch, unlink.
   all (gc --all): every pack, whatever its dead share, and a recovery
   record written for every live message that has none. The caller
   holds the store's exclusive maintenance lock (casbox_store_maintenance_lock()), so no
   scrub reads the packs this run deletes. stats_r tells what was done,
   also when it failed. Returns 0 ok, -1 error. */
int casbox_store_gc(struct casbox_store *store, bool all,
		    struct casbox_store_gc_stats *stats_r,
		    const char **error_r);

#endif
