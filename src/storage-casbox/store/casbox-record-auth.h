#ifndef CASBOX_RECORD_AUTH_H
#define CASBOX_RECORD_AUTH_H

/* casbox-record-auth: authenticated LSM records (records v2, issue 15).

   A v2 value is an envelope around the v1 encoding of the record
   (casbox-records.h, which still starts with its own version byte 1):

     u8 2 | u32 epoch | v1 record | MAC (16)

   MAC = BLAKE2b-128 keyed with the store's record key of that epoch
   (cas_keyring_store_key(CAS_STORE_KEY_RECORD)) over

     "casbox record v2" (16) | u32 LSM key length | LSM key |
     u8 2 | u32 epoch | v1 record

   so a record cannot be edited (swapped, dropped or added parts), nor
   moved under another key (another mailbox or UID: the key is the
   record type, the mailbox GUID and the UID), without the record key.
   Message ('m'), flag ('f') and retained ('x', casbox-store-safety.h)
   records are authenticated this way, and the records version marker
   'V' itself.

   The marker 'V' says how far the store is: missing = a v1 store (its
   records are read as they are), "upgrading" = an upgrade has begun
   (v1 and v2 records are read), "done" = every record was upgraded: a
   v1 (unauthenticated) 'm' or 'f' record is then refused. A v2 record
   is never written before the marker exists. */

#include "casbox-records.h"

struct casbox_store;
struct casbox_lsm_batch;
struct casbox_msg_record;

#define CASBOX_KEY_RECORDS_VERSION 'V'
#define CASBOX_RECORD_AUTH_VERSION 2
#define CASBOX_RECORD_MAC_SIZE 16
/* u8 version | u32 epoch */
#define CASBOX_RECORD_AUTH_HEADER_SIZE 5
#define CASBOX_RECORD_AUTH_OVERHEAD \
	(CASBOX_RECORD_AUTH_HEADER_SIZE + CASBOX_RECORD_MAC_SIZE)

enum casbox_records_state {
	/* not looked at yet */
	CASBOX_RECORDS_STATE_UNKNOWN = 0,
	/* no marker: v1 store */
	CASBOX_RECORDS_STATE_V1,
	CASBOX_RECORDS_STATE_UPGRADING,
	CASBOX_RECORDS_STATE_DONE,
};

/* The current key epoch and its record key (what new records are MACed
   with; also the key of casbox-xmsg.h's keyed hashes). Wipe key_r after
   use. Returns 0 ok, -1 error (no key). */
int casbox_record_key_current(struct casbox_store *store, uint32_t *epoch_r,
			      unsigned char key_r[CAS_STORE_KEY_SIZE],
			      const char **error_r);
/* Append the v2 envelope of body (a v1-encoded record) stored under the
   LSM key to dest. Loads the keys on first need. Returns 0 ok, -1 error
   (no record key: error_r says why). */
int casbox_record_seal(struct casbox_store *store,
		       const void *key, size_t key_size,
		       const void *body, size_t body_size,
		       buffer_t *dest, const char **error_r);
/* Verify the value stored under key. A v2 value: *body_r is the v1
   record inside it (pointing into value) once its MAC verified. A v1
   value: itself, while the store is not upgraded (*authenticated_r =
   FALSE); refused once it is. Returns 1 ok, -1 refused (error_r says
   why: "authentication failed", "unauthenticated", unknown epoch, no
   key). */
int casbox_record_open(struct casbox_store *store,
		       const void *key, size_t key_size,
		       const void *value, size_t value_size,
		       const void **body_r, size_t *body_size_r,
		       bool *authenticated_r, const char **error_r);

/* The record inside a value without verifying it (v1: the value, v2:
   inside the envelope): only where a record that failed verification
   must still keep what it references alive (census). FALSE if the
   value is neither. */
bool casbox_record_body_unverified(const void *value, size_t value_size,
				   const void **body_r, size_t *body_size_r);

/* The message record under key (mailbox GUID and UID in it), verified.
   Returns 1 ok, -1 refused or malformed (error_r says which). */
int casbox_store_msg_value_import(struct casbox_store *store,
				  const void *key, size_t key_size,
				  const void *value, size_t value_size,
				  pool_t pool, struct casbox_msg_record *rec_r,
				  const char **error_r);
/* The v2 value of a message record under key. Returns 0 ok, -1 error. */
int casbox_store_msg_value_export(struct casbox_store *store,
				  const buffer_t *key,
				  const struct casbox_msg_record *rec,
				  buffer_t *dest, const char **error_r);
/* Flag record counterparts (casbox_flags_record_import/export()). */
int casbox_store_flags_value_import(struct casbox_store *store,
				    const void *key, size_t key_size,
				    const void *value, size_t value_size,
				    pool_t pool, struct casbox_msg_record *rec,
				    const char **error_r);
int casbox_store_flags_value_export(struct casbox_store *store,
				    const buffer_t *key, uint32_t flags,
				    uint64_t modseq,
				    const char *const *keywords,
				    buffer_t *dest, const char **error_r);

/* Retained record counterparts (casbox-store-safety.h). */
struct casbox_retained_record;
int casbox_store_retained_value_import(struct casbox_store *store,
				       const void *key, size_t key_size,
				       const void *value, size_t value_size,
				       pool_t pool,
				       struct casbox_retained_record *rec_r,
				       const char **error_r);
int casbox_store_retained_value_export(struct casbox_store *store,
				       const buffer_t *key,
				       const struct casbox_retained_record *rec,
				       buffer_t *dest, const char **error_r);

/* Shared sealed metadata ('s' | meta id, records v2): one record per
   distinct part list, with a refcount of the message records that name
   it (casbox_msg_record.meta_ref), so a COPY writes a record of a few
   hundred bytes instead of carrying ~1.5 kB of sealed metadata again.
   The id is a keyed BLAKE2b (record key of the current epoch) over the
   canonical part list: blob ids, sizes and transforms. Returns 0 ok,
   -1 error (no key). */
int casbox_store_meta_id(struct casbox_store *store,
			 const struct casbox_msg_record *rec,
			 unsigned char id_r[CASBOX_META_ID_SIZE],
			 const char **error_r);
/* An 's' value (written once, the sealed metadata) or an 'r' value
   (its refcount, rewritten as references come and go), verified (there
   are no v1 ones). sealed_r points into value. Returns 1 ok, -1 refused
   or malformed. */
int casbox_store_meta_value_import(struct casbox_store *store,
				   const void *key, size_t key_size,
				   const void *value, size_t value_size,
				   const unsigned char **sealed_r,
				   size_t *sealed_size_r,
				   const char **error_r);
int casbox_store_meta_value_export(struct casbox_store *store,
				   const buffer_t *key,
				   const void *sealed, size_t sealed_size,
				   buffer_t *dest, const char **error_r);
int casbox_store_meta_refs_import(struct casbox_store *store,
				  const void *key, size_t key_size,
				  const void *value, size_t value_size,
				  uint32_t *refcount_r, const char **error_r);
int casbox_store_meta_refs_export(struct casbox_store *store,
				  const buffer_t *key, uint32_t refcount,
				  buffer_t *dest, const char **error_r);
/* Fill rec's sealed metadata from its 's' record (no-op without a
   reference; a missing record leaves it without: reads then parse).
   Returns 0 ok, -1 error (a record that fails verification). */
int casbox_store_meta_resolve(struct casbox_store *store, pool_t pool,
			      struct casbox_msg_record *rec,
			      const char **error_r);

/* Before a v2 record is put into batch (whose write lock is held): make
   sure the marker exists (a v1 store gets "upgrading"). Returns 0 ok,
   -1 error. */
int casbox_records_ensure_marker(struct casbox_store *store,
				 struct casbox_lsm_batch *batch,
				 const char **error_r);
/* The marker as the LSM has it now (refreshing the cached state).
   Returns 0 ok, -1 error (a marker that does not verify is an error). */
int casbox_records_state_read(struct casbox_store *store,
			      enum casbox_records_state *state_r,
			      const char **error_r);

/* Put the marker "done" into batch (rebuild --from-packs writes a new
   LSM with v2 records only). Returns 0 ok, -1 error (no record key). */
int casbox_records_put_marker_done(struct casbox_store *store,
				   struct casbox_lsm_batch *batch,
				   const char **error_r);

/* Implemented by casbox-store.c: the store's cached marker state, and
   casbox_store_open_keys() without the upgrade on open (for a key load
   in the middle of a record read). */
enum casbox_records_state
casbox_store_get_records_state(struct casbox_store *store);
void casbox_store_set_records_state(struct casbox_store *store,
				    enum casbox_records_state state);
int casbox_store_open_keys_for_records(struct casbox_store *store,
				       const char **error_r);

/* Upgrade a store's v1 'f', 'm' and 'x' records to v2 (doveadm casbox
   upgrade, and casbox_store_open_keys() of a store not yet done): under
   the LSM write lock, in batches of at most CASBOX_RECORDS_UPGRADE_BATCH
   records, each one atomic LSM batch, then the marker "done". A crash
   at any point leaves a store that reads; the next run goes on where it
   stopped. A v1 record that does not decode is left as it is (scrub
   reports it). */
#define CASBOX_RECORDS_UPGRADE_BATCH 1000
struct casbox_records_upgrade_stats {
	/* records rewritten as v2, and those that did not decode */
	uint64_t upgraded, malformed;
	/* records already v2 */
	uint64_t already;
	unsigned int batches;
	/* the marker was missing although v2 records existed: v1 records
	   were not upgraded (they are refused from now on) */
	bool marker_was_missing;
};
typedef void casbox_records_upgrade_progress_t(void *context,
		const struct casbox_records_upgrade_stats *stats);
/* Without the write lock: does the store have records to upgrade (a
   marker other than "done" and any 'm' or 'f' record)? A store without
   any gets "done" with its first v2 record. Needs the keys when there
   is a marker (it is verified). Returns 0 ok, -1 error. */
int casbox_records_upgrade_needed(struct casbox_store *store, bool *needed_r,
				  const char **error_r);
int casbox_records_upgrade(struct casbox_store *store,
			   casbox_records_upgrade_progress_t *progress,
			   void *context,
			   struct casbox_records_upgrade_stats *stats_r,
			   const char **error_r);

#endif
