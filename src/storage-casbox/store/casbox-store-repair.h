#ifndef CASBOX_STORE_REPAIR_H
#define CASBOX_STORE_REPAIR_H

/* casbox-store-repair: the record fixes `doveadm casbox scrub --repair`
   makes, written by the store layer. A repair holds the store's write
   lock from begin to commit or rollback (no save changes a refcount in
   between), and its fixes land in one LSM batch at commit. */

#include "casbox-store-census.h"
#include "casbox-store-quarantine.h"

struct casbox_store;
struct casbox_store_repair;

/* Returns 0 ok, -1 error (lock timeout included). */
int casbox_store_repair_begin(struct casbox_store *store,
			      struct casbox_store_repair **repair_r,
			      const char **error_r);
/* Rewrite blob's record with the refcount the census counted
   (blob->counted); its location stays. */
void casbox_store_repair_refcount(struct casbox_store_repair *repair,
				  const struct casbox_census_blob *blob);
/* Record the blob as quarantined (readers then fail early, scrubs
   report it as known damage). */
void casbox_store_repair_quarantine(struct casbox_store_repair *repair,
		const struct cas_blob_id *id,
		const struct casbox_quarantine_record *qrec);
/* Drop the blob's quarantine record. */
void casbox_store_repair_release(struct casbox_store_repair *repair,
				 const struct cas_blob_id *id);
/* Returns 0 ok (durable), -1 error (nothing written). Both end the
   repair and release the lock. */
int casbox_store_repair_commit(struct casbox_store_repair **repair,
			       const char **error_r);
void casbox_store_repair_rollback(struct casbox_store_repair **repair);

#endif
