#ifndef CASBOX_STORE_QUARANTINE_H
#define CASBOX_STORE_QUARANTINE_H

/* casbox-store-quarantine: blobs `doveadm casbox scrub --repair` found
   damaged. Nothing is deleted: the blob record and the messages stay,
   the damaged frame's raw bytes are copied to <root>/quarantine/ for
   forensics, and a quarantine record

     'q' | blob id (32) -> u8 version, u64 time, u32 pack id,
                           u64 offset, u32 frame size, cause (rest)

   tells readers (FETCH fails early with a clear error instead of
   dropping the connection half-way through the literal) and later
   scrubs (the damage is reported as known). See doc/doveadm.md. */

#include "casbox-records.h"

#define CASBOX_KEY_QUARANTINE 'q'
#define CASBOX_QUARANTINE_DIR "quarantine"
/* The keyword scrub --repair sets on messages with a quarantined part. */
#define CASBOX_DAMAGED_KEYWORD "$CasboxDamaged"

struct casbox_store;

struct casbox_quarantine_record {
	time_t time;
	/* where the damaged frame was (and may still be) */
	uint32_t pack_id;
	uint64_t offset;
	uint32_t frame_size;
	const char *cause;
};

void casbox_quarantine_key(buffer_t *dest, const struct cas_blob_id *id);
void casbox_quarantine_record_export(const struct casbox_quarantine_record *rec,
				     buffer_t *dest);
/* Returns 0 ok, -1 malformed (error_r says why). */
int casbox_quarantine_record_import(const void *data, size_t size,
				    pool_t pool,
				    struct casbox_quarantine_record *rec_r,
				    const char **error_r);
/* Name of the frame copy under <root>/quarantine/. */
const char *
casbox_quarantine_copy_name(const struct cas_blob_id *id,
			    const struct casbox_quarantine_record *rec);

/* Copy the frame's bytes (as many of them as the pack still has) to
   <root>/quarantine/ (created 0700), fsynced, its name made durable
   (directory fsync). An existing copy is kept.
   Returns 0 ok (path_r set), -1 error. */
int casbox_store_quarantine_copy(struct casbox_store *store,
				 const struct cas_blob_id *id,
				 const struct casbox_quarantine_record *rec,
				 const char **path_r, const char **error_r);

/* The copy itself: size bytes at offset of pack_path (fewer if the pack
   is shorter) to path, atomically and durably (path.tmp, fsync, rename,
   directory fsync), through io (NULL = POSIX). Returns 0 ok, -1 error. */
struct cas_io;
int casbox_quarantine_copy_frame(const struct cas_io *io,
				 const char *pack_path, const char *path,
				 uint64_t offset, uint64_t size,
				 const char **error_r);

/* Is a part of rec quarantined? Returns 1 yes (blob_r and cause_r say
   which and why), 0 no, -1 error. Call after a refresh of the LSM
   (casbox_store_msg_open() does one). */
int casbox_store_msg_quarantined(struct casbox_store *store,
				 const struct casbox_msg_record *rec,
				 struct cas_blob_id *blob_r,
				 const char **cause_r, const char **error_r);

#endif
