#ifndef DOVEADM_CASBOX_H
#define DOVEADM_CASBOX_H

/* doveadm casbox: what the commands share. The commands open a user's
   casbox store directly (their own LSM handle, key ring and pack store)
   instead of going through lib-storage, so they can see every record and
   every pack frame. See doc/doveadm.md. */

#include "fsync-mode.h"
#include "file-lock.h"
#include "hash.h"
#include "casbox-settings.h"
#include "casbox-records.h"
#include "casbox-pack.h"

struct mail_user;
struct casbox_lsm;

/* 'D' | blob id -> cause: a blob scrub --repair found damaged. Nothing
   deletes the blob or its references; the mark tells later runs and
   admins what was found. (Could move into casbox-records.h.) */
#define CASBOX_ADMIN_KEY_DAMAGED 'D'

struct casbox_admin {
	pool_t pool;
	/* NULL when opened with casbox_admin_open_root() */
	struct mail_user *user;
	pool_t set_pool;
	/* the casbox root of the user's casbox namespace */
	const char *root_dir;
	struct casbox_settings set;
	enum fsync_mode fsync_mode;
	enum file_lock_method lock_method;

	struct casbox_lsm *lsm;
	/* NULL until casbox_admin_open_keys() */
	struct cas_keyring *keyring;
	struct casbox_pack_store *packs;
};

/* A blob as the LSM and the packs show it. */
struct casbox_admin_blob {
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
};

/* A frame location: (pack id, offset). */
struct casbox_admin_loc {
	uint32_t pack_id;
	uint64_t offset;
};

struct casbox_admin_pack {
	uint32_t pack_id;
	uint64_t size;
	/* frames a live blob record points to */
	uint64_t live_bytes;
	uint64_t live_plain_bytes;
	/* frames nothing live points to, damaged ones included */
	uint64_t dead_bytes;
	/* a live blob in it could not be read */
	bool live_damaged;
};
ARRAY_DEFINE_TYPE(casbox_admin_pack, struct casbox_admin_pack);

struct casbox_census {
	pool_t pool;
	uint64_t messages;
	/* sum of message sizes */
	uint64_t logical_bytes;
	/* sum of part sizes over all message records (before dedup) */
	uint64_t referenced_plain_bytes;
	HASH_TABLE(struct cas_blob_id *, struct casbox_admin_blob *) blobs;
	ARRAY(struct casbox_admin_blob *) blob_list;
	HASH_TABLE(struct casbox_admin_loc *, struct casbox_admin_blob *) locs;
	/* mailbox guid (hex) -> name, from the 'M' records */
	HASH_TABLE(char *, char *) mailbox_names;
	/* malformed records met while iterating */
	unsigned int bad_records;
	ARRAY_TYPE(casbox_admin_pack) packs;
};

/* Report one damaged item: mailbox name (or "-"), UID (0 = none), blob
   or file, cause. */
typedef void casbox_admin_damage_callback_t(void *context,
					    const char *mailbox,
					    uint32_t uid, const char *object,
					    const char *cause);

/* Open the store of user's casbox namespace. Returns 1 ok, 0 the user
   has no store yet (error_r says so), -1 error (e.g. no casbox
   namespace). */
int casbox_admin_open(struct mail_user *user, struct casbox_admin **adm_r,
		      const char **error_r);
/* Open the store at root_dir (what casbox_admin_open() does once it has
   found the root and the settings; set is copied, its strings must
   outlive the handle). Same returns. */
int casbox_admin_open_root(const char *root_dir,
			   const struct casbox_settings *set,
			   enum fsync_mode fsync_mode,
			   enum file_lock_method lock_method,
			   struct casbox_admin **adm_r, const char **error_r);
/* Load the key ring (it must be the store's key) and open the packs.
   Returns 1 ok, -1 error. */
int casbox_admin_open_keys(struct casbox_admin *adm, const char **error_r);
/* Without the key: open the packs for the keyless frame scan only
   (casbox_census_scan_packs(); no blob can be decoded). Returns 1 ok,
   0 not possible (the store has dictionaries, which are sealed with the
   key), -1 error. */
int casbox_admin_open_packs_keyless(struct casbox_admin *adm,
				    const char **error_r);
void casbox_admin_close(struct casbox_admin **adm);

/* Sorted ids of the pack files and their sizes. Returns 0 ok, -1. */
int casbox_admin_list_packs(struct casbox_admin *adm, pool_t pool,
			    ARRAY_TYPE(casbox_admin_pack) *packs,
			    const char **error_r);
const char *casbox_admin_pack_path(struct casbox_admin *adm,
				   uint32_t pack_id);
/* Bytes of all files under dir (recursively). */
uint64_t casbox_admin_dir_size(const char *dir);

/* Read every LSM record into a census. Malformed records are reported
   through damage (may be NULL). Returns 0 ok, -1 error. */
int casbox_census_build(struct casbox_admin *adm,
			casbox_admin_damage_callback_t *damage, void *context,
			struct casbox_census **census_r,
			const char **error_r);
/* Scan every pack frame (CRC, no decryption) and attribute each frame
   to live or dead bytes per pack. Damaged frames are reported; a
   damaged frame that a blob record points to sets that blob's damage.
   Needs casbox_admin_open_keys() or casbox_admin_open_packs_keyless().
   Returns 0 ok, -1 error. */
int casbox_census_scan_packs(struct casbox_admin *adm,
			     struct casbox_census *census,
			     casbox_admin_damage_callback_t *damage,
			     void *context, const char **error_r);
/* TRUE if something still references the blob (refcount or a message
   record). */
bool casbox_census_blob_is_live(const struct casbox_admin_blob *blob);
const char *casbox_census_mailbox_name(struct casbox_census *census,
				       const guid_128_t mailbox_guid);
void casbox_census_free(struct casbox_census **census);

/* Progress on stderr, only when it is a terminal. */
void casbox_admin_progress(const char *what, unsigned int done,
			   unsigned int total);
void casbox_admin_progress_end(void);

/* Command allocators (one file each). */
struct doveadm_mail_cmd_context *cmd_casbox_stats_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_scrub_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_gc_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_key_init_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_key_destroy_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_rebuild_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_dict_train_alloc(void);

#endif
