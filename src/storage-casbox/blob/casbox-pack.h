#ifndef CASBOX_PACK_H
#define CASBOX_PACK_H

/* casbox-pack: the blob store. Blobs are compressed (zstd, optionally
   with a trained dictionary), encrypted (XChaCha20-Poly1305 under a
   per-blob DEK, in 64 KiB chunks) and appended as self-describing,
   CRC32C-framed records to append-only pack files under
   <root>/packs/. See doc/casbox-format.md for the byte layout.

   Which blobs exist, their refcounts and their locations live in the
   LSM, not here: this layer only writes and reads bytes, and can scan
   packs without any key (scrub, rebuild --from-packs). */

#include "cas-keymode.h"
#include "casbox-frame.h"

struct istream;
struct casbox_pack_store;
struct casbox_pack_txn;
struct casbox_pack_scan;

/* Where a blob is and how to open it. Stored in the LSM blob record
   (casbox_blob_record_export/import), so the format is fixed and
   versioned. Key rotation rewrites only the DEK. */
struct casbox_blob_record {
	uint32_t pack_id;
	uint64_t offset;	/* of the frame in the pack */
	uint32_t frame_size;	/* whole frame, header included */
	uint64_t plain_size;	/* bytes of plaintext */
	uint32_t dict_id;	/* 0 = no dictionary */
	/* enum cas_dek_kind: which member of the union holds the DEK
	   (server mode: wrapped_dek, password mode: sealed_dek, whose
	   byte 0 is the kind again). Open it with cas_keyring_dek_open(
	   keyring, id, dek_kind, stored_dek, ...). */
	uint8_t dek_kind;
	union {
		unsigned char wrapped_dek[CAS_WRAPPED_DEK_SIZE];
		unsigned char sealed_dek[CAS_SEALED_DEK_SIZE];
		unsigned char stored_dek[CAS_STORED_DEK_MAX_SIZE];
	};
};

struct cas_io;

struct casbox_pack_settings {
	const char *dir;	/* <root>/packs, created if missing */
	bool fsync;		/* FALSE only for mail_fsync=never */
	/* the pack and dictionary file writes go through this table
	   (NULL = cas_io_posix; the crash simulator in tests) */
	const struct cas_io *io;
	/* rotate to a new pack past this (0 = 64 MiB) */
	uint64_t max_pack_size;
	int zstd_level;		/* 0 = default (3) */
	/* Blobs up to this size use the current dictionary, if any
	   (0 = 16 KiB). */
	size_t dict_max_blob_size;
	/* the chunk cipher of new frames; AUTO (0) = AES-256-GCM where
	   the CPU has AES-NI, else XChaCha20-Poly1305. Opening the store
	   fails if the cipher asked for is not available. Frames of
	   every cipher are read whatever this says. */
	enum cas_aead_cipher cipher;
	/* casbox_pack_storage: where sealed packs go (casbox-objstore.h);
	   NULL, "" or "local" = they stay in dir */
	const char *storage;
	/* local read cache of packs in object storage: directory
	   (NULL = <dir>/cache) and bound (0 = 1 GiB) */
	const char *cache_dir;
	uint64_t cache_size;
};

/* What uploads of this store did (casbox-pack-upload.c). */
struct casbox_pack_upload_stats {
	unsigned int packs;
	uint64_t bytes;
};

/* Upload every sealed local pack to object storage (verify, stub,
   unlink local; doc/casbox-storage.md "Packs in object storage").
   Without force, skips while an earlier failure's backoff lasts; skips
   when another process is uploading. Closing a store with a pending
   sealed pack calls this (failures become a warning). Returns 1 done,
   0 nothing to do or skipped, -1 error (everything stays local). */
int casbox_pack_store_upload(struct casbox_pack_store *store, bool force,
			     const char **error_r);
/* Start a new pack if the one appends go to holds any frame, so that
   every pack written so far is sealed (doveadm casbox upload -s).
   Returns 0 ok, -1 error. */
int casbox_pack_store_seal_current(struct casbox_pack_store *store,
				   const char **error_r);
const struct casbox_pack_upload_stats *
casbox_pack_store_get_upload_stats(struct casbox_pack_store *store);
bool casbox_pack_store_has_remote(struct casbox_pack_store *store);
/* TRUE when the last failed read was object storage failing
   (temporary: nothing is damaged). */
bool casbox_pack_store_error_is_temporary(struct casbox_pack_store *store);
/* Delete pack pack_id wherever it is (gc, after its blobs moved).
   Returns 0 ok (also when already gone), -1 error. */
int casbox_pack_store_delete_pack(struct casbox_pack_store *store,
				  uint32_t pack_id, const char **error_r);
/* Make a stub for every pack in object storage that this directory
   does not know (rebuild --from-packs on a new server). Returns 1 ok,
   0 no object storage, -1 error. */
int casbox_pack_store_adopt_remote(struct casbox_pack_store *store,
				   unsigned int *adopted_r,
				   const char **error_r);
/* Size of pack pack_id, local or remote. Returns 1 ok, 0 no such
   pack, -1 error. */
int casbox_pack_store_pack_size(struct casbox_pack_store *store,
				uint32_t pack_id, uint64_t *size_r,
				bool *remote_r, const char **error_r);

/* Returns 1 ok, -1 error. Loads the dictionaries (sealed with the
   keyring's index key). */
int casbox_pack_store_open(const struct casbox_pack_settings *set,
			   const struct cas_keyring *keyring,
			   struct casbox_pack_store **store_r,
			   const char **error_r);
void casbox_pack_store_close(struct casbox_pack_store **store);

/* Append blobs. begin takes the pack append lock (so several processes
   can append to one store). Blobs added are durable only after commit
   returns 1 (pack fdatasync()ed). A rolled back or crashed txn leaves
   unreferenced frames that gc reclaims; never a torn frame that a
   reader accepts. */
int casbox_pack_txn_begin(struct casbox_pack_store *store,
			  struct casbox_pack_txn **txn_r,
			  const char **error_r);
/* Read input to EOF, encode and append it as blob id. The input may be
   of any size; memory use is bounded by the chunk size. Returns 1 ok,
   -1 error (input stream errors included). */
int casbox_pack_txn_add(struct casbox_pack_txn *txn,
			const struct cas_blob_id *id, struct istream *input,
			struct casbox_blob_record *rec_r,
			const char **error_r);
/* Append a meta frame (casbox-frame.h): plain is sealed with
   casbox_pack_meta_seal() and written after the blobs added so far, so
   the same commit makes both durable. Returns 1 ok, -1 error. */
int casbox_pack_txn_add_meta(struct casbox_pack_txn *txn,
			     enum casbox_meta_kind kind,
			     const void *plain, size_t size,
			     const char **error_r);
/* The same with a locator (password mode; ignored in server mode): see
   casbox_pack_meta_seal(). */
int casbox_pack_txn_add_meta_locator(struct casbox_pack_txn *txn,
				     enum casbox_meta_kind kind,
				     const unsigned char *locator,
				     const void *plain, size_t size,
				     const char **error_r);
/* Append an already sealed meta frame body verbatim (gc carrying a
   record forward: no key needed to move it). Returns 1 ok, -1 error. */
int casbox_pack_txn_add_meta_sealed(struct casbox_pack_txn *txn,
				    enum casbox_meta_kind kind,
				    const void *sealed, size_t size,
				    const char **error_r);
/* The one place meta records are sealed and opened, by the key mode of
   the store's key ring: server mode with the index key (frame version
   1, AAD = "CBMF" | 1 | kind), password mode to the user's public key
   (version 2: the locator in the clear, then cas_userkey_box_seal()
   with AAD = "CBMF" | 2 | kind | locator), which LMTP can do without
   the password; opening that needs the unlocked user key. The locator
   (CASBOX_META_LOCATOR_SIZE bytes, NULL = all zero) lets gc without the
   password tell which message a recovery record is about
   (casbox_pack_meta_locator_make()). The AAD binds no location, so gc
   can move a sealed record without opening it. seal returns 1 ok, -1
   error (an unusable public key); open returns 1 ok, -1 failure
   (plain_r is not filled then). */
int casbox_pack_meta_seal(struct casbox_pack_store *store,
			  enum casbox_meta_kind kind,
			  const unsigned char *locator,
			  const void *plain, size_t size, buffer_t *sealed,
			  const char **error_r);
/* The locator of a sealed body (not authenticated until it opens or
   verifies). Returns 1 ok, 0 server mode (none), -1 truncated. */
int casbox_pack_meta_locator(struct casbox_pack_store *store,
			     const void *sealed, size_t size,
			     unsigned char locator_r[CASBOX_META_LOCATOR_SIZE]);
/* The locator of data (cas_userkey_locator(); all zero in server
   mode). Works without the password. */
void casbox_pack_meta_locator_make(struct casbox_pack_store *store,
				   const void *data, size_t size,
				   unsigned char locator_r[CASBOX_META_LOCATOR_SIZE]);
int casbox_pack_meta_open(struct casbox_pack_store *store,
			  enum casbox_meta_kind kind,
			  const void *sealed, size_t size,
			  buffer_t *plain_r, const char **error_r);
/* Check a sealed meta record without opening it, where the mode allows
   (password mode, with or without the password: key id and MAC).
   Returns 1 verified, 0 cannot be checked without opening (server
   mode), -1 bad. */
int casbox_pack_meta_verify(struct casbox_pack_store *store,
			    enum casbox_meta_kind kind,
			    const void *sealed, size_t size,
			    const char **error_r);
/* Read the meta frame at (pack_id, offset): header and body CRC
   checked, the sealed body appended to sealed_r (not opened). A frame
   of the other key mode's version is an error that says so. Returns 1
   ok, -1 damaged or I/O error. */
int casbox_pack_meta_read(struct casbox_pack_store *store, uint32_t pack_id,
			  uint64_t offset, enum casbox_meta_kind *kind_r,
			  buffer_t *sealed_r, const char **error_r);
/* Append the frame of blob id that src_rec describes (in another pack)
   unchanged: header and chunk table are parsed and checked against
   src_rec, every chunk's CRC is verified, nothing is decrypted, so no
   key is needed (gc without the password in casbox_key_mode=password).
   The frame's AEAD binds no location, so its DEK stays valid: rec_r is
   src_rec with the new pack id and offset. Returns 1 ok, -1 error
   (damage, I/O; the partial copy is dropped). */
int casbox_pack_txn_copy_frame(struct casbox_pack_txn *txn,
			       const struct cas_blob_id *id,
			       const struct casbox_blob_record *src_rec,
			       struct casbox_blob_record *rec_r,
			       const char **error_r);
int casbox_pack_txn_commit(struct casbox_pack_txn **txn,
			   const char **error_r);
void casbox_pack_txn_rollback(struct casbox_pack_txn **txn);

/* Train a zstd dictionary from samples (e.g. message headers), store it
   sealed with the index key as the next dictionary id and make it the
   current one: small blobs added after this use it. Dictionaries are
   never deleted. Returns 1 ok, -1 error (e.g. too few samples). */
int casbox_pack_dict_train(struct casbox_pack_store *store,
			   const void *const *samples, const size_t *sizes,
			   unsigned int count, uint32_t *dict_id_r,
			   const char **error_r);

/* Blobs up to this size use the current dictionary. */
size_t casbox_pack_dict_max_blob_size(struct casbox_pack_store *store);
/* What dictionary dict_id saves on samples: their compressed sizes
   without and with it, at the store's level (doveadm casbox dict
   train). Returns 0 ok, -1 error (dictionary not loaded, zstd). */
struct casbox_pack_dict_measure {
	uint64_t plain_bytes, without_bytes, with_bytes;
};
int casbox_pack_dict_measure(struct casbox_pack_store *store,
			     uint32_t dict_id,
			     const buffer_t *const *samples,
			     unsigned int count,
			     struct casbox_pack_dict_measure *measure_r,
			     const char **error_r);

/* Id of the dictionary new small blobs use, 0 = none yet (the caller
   decides when to train one). */
uint32_t casbox_pack_dict_current(struct casbox_pack_store *store);

/* Chunks this process has decoded (authenticated and decompressed) so
   far: a statistic for debug logs and tests of what a read touched. */
uint64_t casbox_pack_get_chunks_decoded(void);
/* Plaintext bytes of those chunks. */
uint64_t casbox_pack_get_bytes_decoded(void);
/* Bytes of the frames this store's pack transactions appended so far
   (also those of transactions rolled back later). */
uint64_t casbox_pack_store_get_bytes_appended(struct casbox_pack_store *store);

/* Open a blob for reading: a seekable istream of the plaintext, with
   size known. Seeking decodes only the chunks needed. Every chunk is
   CRC- and AEAD-verified before a byte of it is returned; damage or a
   wrong key fails the stream (stream_errno = EIO, i_stream_get_error()
   names pack, offset, blob id and cause). The store must outlive the
   stream. */
struct istream *
casbox_pack_blob_open(struct casbox_pack_store *store,
		      const struct cas_blob_id *id,
		      const struct casbox_blob_record *rec);
/* casbox_pack_blob_open() with the pack file opened now instead of at
   the first read: the stream then reads the frame even after gc has
   moved the blob and unlinked the pack. Returns 1 ok, 0 when the pack
   file does not exist (gc moved the blob since rec was read: read the
   record again), -1 error; error_r is set for 0 and -1. */
int casbox_pack_blob_open_pinned(struct casbox_pack_store *store,
				 const struct cas_blob_id *id,
				 const struct casbox_blob_record *rec,
				 struct istream **input_r,
				 const char **error_r);

/* Serialisation of a blob record for the LSM (doc/casbox-format.md,
   "Blob record"): version 2 = the fixed fields, the DEK kind and the
   DEK of that kind (106 bytes server-wrapped, 162 sealed). Version 1
   (105 bytes, always a server-wrapped DEK without kind byte) is still
   read. */
#define CASBOX_BLOB_RECORD_FIXED_SIZE (1 + 4 + 8 + 4 + 8 + 4)
#define CASBOX_BLOB_RECORD_V1_SIZE (CASBOX_BLOB_RECORD_FIXED_SIZE + \
				    CAS_WRAPPED_DEK_SIZE)
/* the largest export (a sealed DEK; its kind byte is its byte 0) */
#define CASBOX_BLOB_RECORD_EXPORT_MAX_SIZE \
	(CASBOX_BLOB_RECORD_FIXED_SIZE + CAS_STORED_DEK_MAX_SIZE)
/* the export of a server-mode record */
#define CASBOX_BLOB_RECORD_EXPORT_SIZE \
	(CASBOX_BLOB_RECORD_FIXED_SIZE + 1 + CAS_WRAPPED_DEK_SIZE)
void casbox_blob_record_export(const struct casbox_blob_record *rec,
			       buffer_t *dest);
/* Size of casbox_blob_record_export()'s output for rec. */
size_t casbox_blob_record_export_size(const struct casbox_blob_record *rec);
/* Returns 1 ok, -1 malformed. */
int casbox_blob_record_import(const void *data, size_t size,
			      struct casbox_blob_record *rec_r,
			      const char **error_r);

/* DEK update meta record (kind CASBOX_META_KIND_DEK_UPDATE): a newer
   DEK for a blob id, for rebuild --from-packs after gc (fresh DEKs) or
   key rotation (rewrapped DEKs). Plaintext (before sealing):
   version 1: u8 version (1) | u64 written (microseconds, LE) | blob id
   (32) | u8 DEK kind (1 = server wrapped DEK) | wrapped DEK (76);
   version 2 (password mode): u8 version (2) | u64 written | blob id |
   sealed DEK (133, its byte 0 is the kind, 2). */
#define CASBOX_DEK_UPDATE_VERSION 1
#define CASBOX_DEK_UPDATE_VERSION_SEALED 2
#define CASBOX_DEK_KIND_WRAPPED 1
#define CASBOX_DEK_UPDATE_SIZE (1 + 8 + CAS_BLOB_ID_SIZE + 1 + \
				CAS_WRAPPED_DEK_SIZE)
#define CASBOX_DEK_UPDATE_SEALED_SIZE (1 + 8 + CAS_BLOB_ID_SIZE + \
				       CAS_SEALED_DEK_SIZE)
struct casbox_dek_update {
	uint64_t written_usecs;
	struct cas_blob_id id;
	/* enum cas_dek_kind; export writes version 2 for
	   CAS_DEK_KIND_SEALED, else version 1 with wrapped_dek */
	uint8_t dek_kind;
	union {
		unsigned char wrapped_dek[CAS_WRAPPED_DEK_SIZE];
		unsigned char sealed_dek[CAS_SEALED_DEK_SIZE];
		unsigned char stored_dek[CAS_STORED_DEK_MAX_SIZE];
	};
};
void casbox_dek_update_export(const struct casbox_dek_update *upd,
			      buffer_t *dest);
/* Returns 1 ok, -1 malformed. */
int casbox_dek_update_import(const void *data, size_t size,
			     struct casbox_dek_update *upd_r,
			     const char **error_r);
/* Seal and append a DEK update (written = now) of a server-wrapped DEK.
   Key rotation calls this in the pack transaction of its LSM batch.
   Returns 1 ok, -1 error. */
int casbox_pack_txn_add_dek_update(struct casbox_pack_txn *txn,
				   const struct cas_blob_id *id,
				   const unsigned char *wrapped_dek,
				   const char **error_r);
/* The same for a stored DEK of any kind (gc's fresh DEK in either key
   mode). */
int casbox_pack_txn_add_dek_update_kind(struct casbox_pack_txn *txn,
					const struct cas_blob_id *id,
					uint8_t dek_kind,
					const unsigned char *stored_dek,
					const char **error_r);
/* Microseconds since the epoch (the "written" stamp of meta records). */
uint64_t casbox_meta_now_usecs(void);

/* Walk every frame of every pack without keys, verifying CRCs and
   resynchronising after damage (scrub, rebuild --from-packs). */
struct casbox_pack_frame_info {
	uint32_t pack_id;
	uint64_t offset;
	uint32_t frame_size;
	/* 0 = a blob frame (id is its blob id), else the kind of the
	   meta frame (id is zero) */
	enum casbox_meta_kind meta_kind;
	struct cas_blob_id id;
	/* of a blob frame whose header is intact. plain_size only for
	   frame version 1 (version 2 keeps it inside the AEAD: 0 here;
	   the recovery record has it) */
	uint8_t frame_version;
	uint64_t plain_size;
	uint32_t dict_id;
	/* NULL if the frame is intact, else why not */
	const char *damage;
	/* damaged because it was never finished: its header is all zero,
	   and writers write every header last, so this is what a writer
	   killed during an append leaves (never acknowledged data). Later
	   appends go after it, so it need not be a pack's tail. */
	bool unfinished;
};
struct casbox_pack_scan *casbox_pack_scan_init(struct casbox_pack_store *store);
bool casbox_pack_scan_next(struct casbox_pack_scan *scan,
			   struct casbox_pack_frame_info *info_r);
int casbox_pack_scan_deinit(struct casbox_pack_scan **scan,
			    const char **error_r);

#endif
