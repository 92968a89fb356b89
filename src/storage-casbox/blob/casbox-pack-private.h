#ifndef CASBOX_PACK_PRIVATE_H
#define CASBOX_PACK_PRIVATE_H

#include "array.h"
#include "casbox-pack.h"
#include "casbox-frame.h"
#include "casbox-base-cache.h"

#include <zstd.h>

#define CASBOX_PACK_DEFAULT_MAX_SIZE (64ULL * 1024 * 1024)
#define CASBOX_PACK_DEFAULT_CACHE_SIZE (1024ULL * 1024 * 1024)
#define CASBOX_PACK_DEFAULT_ZSTD_LEVEL 3
#define CASBOX_PACK_DEFAULT_DICT_MAX_BLOB_SIZE (16 * 1024)
#define CASBOX_PACK_LOCK_TIMEOUT_SECS 120
#define CASBOX_DICT_MAX_SIZE (1024 * 1024)

struct casbox_pack_dict {
	uint32_t id;
	/* the dictionary's bytes, from which cdict is made on the first
	   compression (casbox_pack_dict_get_cdict():
	   a process that only reads never needs it, and it took 0.5 % of
	   a first FETCH's samples) */
	buffer_t *content;
	ZSTD_CDict *cdict;
	ZSTD_DDict *ddict;
	/* NULL if usable, else why the dictionary could not be loaded */
	const char *error;
};

/* Buffers one blob istream decodes with: the DEK in sodium_malloc()ed
   memory and the stored/plain chunk buffers. A stream holds one only
   while it decodes and hands it back at EOF, so reading a message's
   blobs one after another reuses the same one. */
#define CASBOX_BLOB_SCRATCH_KEYS_SIZE (CAS_DEK_SIZE + CAS_AEAD_SUBKEY_SIZE)
struct casbox_blob_scratch {
	/* sodium_malloc(CASBOX_BLOB_SCRATCH_KEYS_SIZE): the DEK, then the
	   version 2 frame subkey */
	unsigned char *dek;
	unsigned char *stored;	/* CASBOX_CHUNK_MAX_STORED */
	unsigned char *plain;	/* CASBOX_CHUNK_SIZE */
	struct casbox_blob_scratch *next;
};

struct casbox_pack_store {
	pool_t pool;
	struct casbox_pack_settings set;
	/* set.io, or cas_io_posix */
	const struct cas_io *io;
	const struct cas_keyring *keyring;
	/* how meta records are sealed: the key mode's (casbox-pack.c) */
	const struct casbox_meta_sealer *meta;

	/* allocated one by one: streams keep pointers to them */
	ARRAY(struct casbox_pack_dict *) dicts;
	uint32_t cur_dict_id; /* 0 = none */
	/* the directory was listed for dictionaries (by
	   casbox_pack_dicts_load() or an append transaction) */
	bool dicts_listed;

	/* decoded base prefixes (delta frames) */
	struct casbox_base_cache *base_cache;

	ZSTD_CCtx *cctx;
	ZSTD_DCtx *dctx;
	/* highest pack id seen, 0 = not looked yet */
	uint32_t last_pack_id;
	struct casbox_pack_txn *txn;
	/* chunk buffers of the (single) transaction, kept between them */
	unsigned char *txn_plain, *txn_stored;
	/* the chunk compressed the other way (with or without a base),
	   allocated at the first delta frame */
	unsigned char *txn_alt;
	/* idle scratch buffers, already wiped */
	struct casbox_blob_scratch *free_scratch;
	unsigned int free_scratch_count;
	/* casbox_pack_store_get_bytes_appended() */
	uint64_t bytes_appended;

	/* sealed packs in object storage (casbox-pack-upload.c); NULL =
	   all packs local */
	struct casbox_objstore *remote;
	const char *cache_dir;
	/* bytes fetched since the cache bound was last checked */
	uint64_t cache_fetched;
	/* a sealed local pack waits for upload (checked at close) */
	bool upload_pending;
	/* the last remote read failed: temporary, not damage */
	bool remote_error_temp;
	struct casbox_pack_upload_stats upload_stats;

	/* casbox_pack_store_keep_read_fd(): the read fd of the last local
	   pack file closed, for the next open of the same pack (-1 none) */
	bool keep_read_fd;
	int kept_fd;
	uint32_t kept_pack_id;
};

const char *casbox_pack_path(struct casbox_pack_store *store,
			     uint32_t pack_id);
/* Returns the dictionary or NULL if unknown. */
const struct casbox_pack_dict *
casbox_pack_dict_lookup(struct casbox_pack_store *store, uint32_t dict_id);
/* The compression dictionary of a loaded, usable dictionary (made on
   the first call), or NULL if dict_id is none such or zstd refused it
   (compress without). */
ZSTD_CDict *
casbox_pack_dict_get_cdict(struct casbox_pack_store *store, uint32_t dict_id);
/* Sorted ids of the packs in the directory: local files (.cbp) and
   stubs of packs in object storage (.cbr), each id once. Returns 0 or
   -1. */
int casbox_pack_list(struct casbox_pack_store *store, ARRAY_TYPE(uint32_t) *ids,
		     const char **error_r);

/* Like casbox_pack_list(), and the ids of the dictionary files into
   dict_ids (unsorted) unless it is NULL. ids NULL: only the
   dictionaries (and no upload is marked pending). */
int casbox_pack_list_dir(struct casbox_pack_store *store,
			 ARRAY_TYPE(uint32_t) *ids,
			 ARRAY_TYPE(uint32_t) *dict_ids,
			 const char **error_r);
/* Load the dictionaries of dict_ids not loaded yet, from a complete
   listing of the directory (casbox_pack_list_dir()). */
void casbox_pack_dicts_load_listed(struct casbox_pack_store *store,
				   const ARRAY_TYPE(uint32_t) *dict_ids);
void casbox_pack_dicts_free(struct casbox_pack_store *store);

/* Frees the idle blob scratch buffers (at store close). */
void casbox_blob_scratch_free_all(struct casbox_pack_store *store);

/* zstd size_t result -> -1 + error string */
int casbox_zstd_check(size_t ret, const char *what, const char **error_r);

#endif
