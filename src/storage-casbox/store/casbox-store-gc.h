#ifndef CASBOX_STORE_GC_H
#define CASBOX_STORE_GC_H

/* casbox-store-gc: rewrite the packs whose dead share passes
   casbox_gc_dead_ratio (doc/doveadm.md, "gc"; the steps and the lock
   order are at the top of casbox-store-gc.c). */

#include "guid.h"

struct casbox_store;
struct casbox_census;
struct cas_blob_id;

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

/* What casbox_store_gc_backfill() wrote, one call per item. */
struct casbox_store_backfill_callbacks {
	/* a new recovery record for this live message */
	void (*recovery_written)(void *context, const guid_128_t mailbox_guid,
				 uint32_t uid);
	/* this live blob's DEK (and plain size) in a blob keys record */
	void (*blob_keys_written)(void *context, const struct cas_blob_id *id);
};

/* The repair half of gc --all without rewriting a pack (doveadm casbox
   scrub --repair): read every meta frame in place, then append a
   recovery record for each live message no intact record covers and,
   in server key mode, blob keys for each live blob whose current DEK no
   intact record holds. Appends only, so the caller may hold the
   maintenance lock shared; saves go on (a message saved after the scan
   may get a second record, which stays until the message is expunged
   and gc drops both). census: one the caller built and scanned
   (casbox_census_scan_packs()) while holding the maintenance lock it
   still holds, used instead of reading the packs again (its gc_dek_seen
   flags are set and its pool grows; blobs saved since are not in it and
   need nothing), or NULL to build one. stats_r: the recovery_written and
   blob_keys_written counts. cb may be NULL. Returns 0 ok, -1 error. */
int casbox_store_gc_backfill(struct casbox_store *store,
			     struct casbox_census *census,
			     const struct casbox_store_backfill_callbacks *cb,
			     void *context,
			     struct casbox_store_gc_stats *stats_r,
			     const char **error_r);

#endif
