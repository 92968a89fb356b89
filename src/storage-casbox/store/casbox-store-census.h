#ifndef CASBOX_STORE_CENSUS_H
#define CASBOX_STORE_CENSUS_H

/* casbox-store-census: one pass over every LSM record and every pack
   frame of a store, for the admin commands (doveadm casbox stats, scrub,
   gc): which blobs exist, who references them, where their frames are
   and which frames are damaged. Read-only; needs no lock. */

#include "hash.h"
#include "casbox-records.h"
#include "casbox-pack.h"

struct casbox_store;

/* A blob as the LSM and the packs show it. */
struct casbox_census_blob {
	struct cas_blob_id id;
	/* refcount stored in the blob record */
	uint32_t refcount;
	/* references counted from message records */
	uint32_t counted;
	bool have_record;
	/* the blob record's value could not be parsed */
	bool record_bad;
	/* the pack scan found a frame at rec's location */
	bool frame_seen;
	struct casbox_blob_record rec;
	/* NULL = not known to be damaged, else why it is */
	const char *damage;
	/* the damage is its base's (rec.base_id: missing or damaged, its
	   own frame not decoded) */
	bool base_damaged;
	/* NULL, or the cause in its quarantine record (scrub --repair) */
	const char *quarantined;
	time_t quarantine_time;
	/* gc: copied to a new frame (under a fresh DEK) */
	bool gc_moved;
	/* gc --all: a meta record it keeps or writes holds a DEK for it */
	bool gc_dek_seen;
};

/* A shared metadata record ('s') and the message records naming it. */
struct casbox_census_meta_ref {
	/* refcount in its 'r' record (0 = none) */
	uint32_t refcount, counted;
	bool have_record, have_refs;
};

/* A frame location: (pack id, offset). */
struct casbox_census_loc {
	uint32_t pack_id;
	uint64_t offset;
};

/* An intact meta frame the pack scan found. */
struct casbox_census_meta {
	uint32_t pack_id;
	uint64_t offset;
	enum casbox_meta_kind kind;
};

struct casbox_census_pack {
	uint32_t pack_id;
	uint64_t size;
	/* frames a live blob record points to */
	uint64_t live_bytes;
	uint64_t live_plain_bytes;
	/* frames nothing live points to, damaged ones included */
	uint64_t dead_bytes;
	/* intact meta frames (recovery records, DEK updates): neither
	   live nor dead for gc's ratio; gc decides per record */
	uint64_t meta_bytes;
	/* a live blob in it could not be read */
	bool live_damaged;
};
ARRAY_DEFINE_TYPE(casbox_census_pack, struct casbox_census_pack);

/* Called after every frame of the pack scan (progress display). */
typedef void casbox_census_progress_callback_t(void *context,
					       uint64_t frames,
					       uint64_t bytes_done,
					       uint64_t bytes_total);

struct casbox_census {
	pool_t pool;
	uint64_t messages;
	/* sum of message sizes */
	uint64_t logical_bytes;
	/* sum of part sizes over all message and retained records (before
	   dedup) */
	uint64_t referenced_plain_bytes;
	/* retained (expunged, restorable) messages and their sizes; their
	   parts count as references (counted, referenced_plain_bytes) but
	   not in messages and logical_bytes */
	uint64_t retained_messages, retained_bytes;
	HASH_TABLE(struct cas_blob_id *, struct casbox_census_blob *) blobs;
	ARRAY(struct casbox_census_blob *) blob_list;
	HASH_TABLE(struct casbox_census_loc *,
		   struct casbox_census_blob *) locs;
	/* mailbox guid (hex) -> name, from the 'M' records */
	HASH_TABLE(char *, char *) mailbox_names;
	/* shared metadata records (records v2): meta id (hex) ->
	   struct casbox_census_meta_ref */
	HASH_TABLE(char *, struct casbox_census_meta_ref *) meta_refs;
	/* intact meta frames, in scan order (casbox_census_scan_packs) */
	ARRAY(struct casbox_census_meta) metas;
	/* malformed records met while iterating (and, records v2, records
	   that failed authentication) */
	unsigned int bad_records;
	/* the store's keys could not be loaded: message and flag records
	   were decoded without verifying their MACs (keyless scrub) */
	bool records_unverified;
	ARRAY_TYPE(casbox_census_pack) packs;

	/* set by the caller before casbox_census_scan_packs(), may be NULL */
	casbox_census_progress_callback_t *progress;
	void *progress_context;
};

/* Report one damaged item: mailbox name (or "-"), UID (0 = none), blob
   or file, cause. */
typedef void casbox_census_damage_callback_t(void *context,
					     const char *mailbox,
					     uint32_t uid, const char *object,
					     const char *cause);

/* Read every LSM record into a census. Malformed records are reported
   through damage (may be NULL). Returns 0 ok, -1 error. */
int casbox_census_build(struct casbox_store *store,
			casbox_census_damage_callback_t *damage,
			void *context, struct casbox_census **census_r,
			const char **error_r);
/* Scan every pack frame (CRC, no decryption) and attribute each frame
   to live or dead bytes per pack. Damaged frames are reported; a
   damaged frame that a blob record points to sets that blob's damage.
   Needs casbox_store_open_keys() or casbox_store_open_packs_keyless().
   Returns 0 ok, -1 error. */
int casbox_census_scan_packs(struct casbox_store *store,
			     struct casbox_census *census,
			     casbox_census_damage_callback_t *damage,
			     void *context, const char **error_r);
/* TRUE if something still references the blob (refcount or a message
   record). */
bool casbox_census_blob_is_live(const struct casbox_census_blob *blob);
const char *casbox_census_mailbox_name(struct casbox_census *census,
				       const guid_128_t mailbox_guid);
void casbox_census_free(struct casbox_census **census);

/* Sorted ids of the pack files under root_dir/packs and their sizes.
   Returns 0 ok, -1 error. */
int casbox_census_list_packs(const char *root_dir, pool_t pool,
			     ARRAY_TYPE(casbox_census_pack) *packs,
			     const char **error_r);
const char *casbox_census_pack_path(const char *root_dir, uint32_t pack_id);

/* The checks scrub makes on top of the census. */

/* Verify every LSM table block and the WAL (CRC, order, footer);
   report(context, file, offset, reason) for each damaged item. Returns
   1 clean, 0 damage found, -1 I/O error. */
typedef void casbox_census_lsm_damage_callback_t(void *context,
						 const char *file,
						 uoff_t offset,
						 const char *reason);
int casbox_census_verify_lsm(struct casbox_store *store,
			     casbox_census_lsm_damage_callback_t *report,
			     void *context, const char **error_r);
/* Decode blob to its end (every chunk's CRC and AEAD tag; needs the
   key). Sets blob->damage (in census->pool) when it does not read as
   its record says. */
void casbox_census_decode_blob(struct casbox_store *store,
			       struct casbox_census *census,
			       struct casbox_census_blob *blob);
/* A meta frame the scan found intact must open and parse (what rebuild
   --from-packs would need); without the password (password mode) its
   MAC must verify. Returns 0 ok, -1 bad (error_r says why). */
int casbox_census_check_meta(struct casbox_store *store,
			     const struct casbox_census_meta *meta,
			     const char **error_r);
/* Call callback for every message record that decodes (the others the
   census reports). Returns 0 ok, -1 error. */
typedef void casbox_census_msg_callback_t(void *context,
					  const guid_128_t mailbox_guid,
					  uint32_t uid,
					  const struct casbox_msg_record *rec);
int casbox_census_foreach_msg(struct casbox_store *store,
			      casbox_census_msg_callback_t *callback,
			      void *context, const char **error_r);

#endif
