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
	/* 0 = no base; else the blob's frame is a delta frame (version 3)
	   against base_id's plaintext prefix, and this is its chain depth
	   (1 .. CASBOX_BASE_MAX_DEPTH: base_id's own depth + 1). The store
	   keeps base_id alive while this blob exists. */
	uint8_t base_depth;
	struct cas_blob_id base_id;
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
	/* bound of the decoded base cache in memory (casbox-base-cache.h;
	   0 = CASBOX_BASE_CACHE_DEFAULT_SIZE, 4 MiB) */
	size_t base_cache_size;
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

/* Returns 1 ok, -1 error. The dictionaries (sealed with the keyring's
   index key) are loaded when first needed (casbox_pack_dicts_load()). */
int casbox_pack_store_open(const struct casbox_pack_settings *set,
			   const struct cas_keyring *keyring,
			   struct casbox_pack_store **store_r,
			   const char **error_r);
void casbox_pack_store_close(struct casbox_pack_store **store);
/* Keep the read fd of the last local pack file closed open, for the
   next open of the same pack: a FETCH of many messages reads one pack
   after the other, and each blob stream opened and closed it (two
   system calls per blob). The kept fd may belong to a pack gc has
   unlinked since (it reads the same bytes; no pack id is ever reused),
   so whoever enables this must release it when the process goes idle:
   casbox_pack_store_release_read_fd() (the glue: at every mailbox sync,
   which an IMAP command ends with and IDLE begins with), and at close. */
void casbox_pack_store_keep_read_fd(struct casbox_pack_store *store);
void casbox_pack_store_release_read_fd(struct casbox_pack_store *store);

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
/* A base a new blob may be compressed against (frame version 3,
   doc/casbox-format.md "Frame version 3"): an earlier blob of the same
   store, given as its decoded plaintext. */
struct casbox_pack_base {
	struct cas_blob_id id;
	/* the base's own blob record: its size and base_depth */
	uint64_t plain_size;
	uint8_t depth;
	/* its plaintext: at least the first min(plain_size,
	   CASBOX_BASE_PREFIX_MAX) bytes (more are ignored) */
	const void *data;
	size_t size;
};
/* casbox_pack_txn_add() against an optional base (NULL = none). The
   encoder compresses the first chunk with and without the base and
   writes a delta frame only if that is smaller by more than the larger
   header, and then every later chunk the smaller way, so a base never
   makes a frame bigger. rec_r->base_depth says which it chose (0 = no
   base: a version 2 frame as casbox_pack_txn_add() writes); the store
   must then keep base->id alive while this blob exists. A base at the
   maximum depth (CASBOX_BASE_MAX_DEPTH) or whose data is shorter than
   its prefix is not used / is an error respectively. */
int casbox_pack_txn_add_base(struct casbox_pack_txn *txn,
			     const struct cas_blob_id *id,
			     struct istream *input,
			     const struct casbox_pack_base *base,
			     struct casbox_blob_record *rec_r,
			     const char **error_r);
/* The next base for casbox_pack_txn_add_bases() to try, or NULL when
   none is left. What it returns must stay valid until the add
   returns. */
typedef const struct casbox_pack_base *
casbox_pack_base_next_func_t(void *context);
/* casbox_pack_txn_add_base() with more bases offered one at a time:
   when base (or the last one next gave) does not pay at chunk 0, next
   is called for another, and the first that pays is used (a base next
   gives that cannot be used, as above, is skipped). next is not called
   when base pays or cannot be used itself. Each base tried costs one
   compression of chunk 0. */
int casbox_pack_txn_add_bases(struct casbox_pack_txn *txn,
			      const struct cas_blob_id *id,
			      struct istream *input,
			      const struct casbox_pack_base *base,
			      casbox_pack_base_next_func_t *next,
			      void *context,
			      struct casbox_blob_record *rec_r,
			      const char **error_r);
/* casbox_pack_txn_add() for input that is a blob stream of id itself
   (casbox_pack_blob_open(): every chunk authenticated under the blob's
   DEK with id in the AAD), e.g. gc's copies: the id is not computed
   again. It could not be once key rotation --finish has dropped the
   epoch whose blob-id key named the blob. */
int casbox_pack_txn_add_reencode(struct casbox_pack_txn *txn,
				 const struct cas_blob_id *id,
				 struct istream *input,
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

/* The lowest and highest id of the store's packs now, local or uploaded
   (0, 0: none). Returns 0 ok, -1 error. */
int casbox_pack_store_id_range(struct casbox_pack_store *store,
			       uint32_t *oldest_r, uint32_t *newest_r,
			       const char **error_r);
/* Key rotation --finish: every dictionary file that opens under an older
   key epoch is sealed again under the current one and replaced
   atomically (resealed_r counts them; failed_r those that open under no
   epoch the key ring holds: left as they are, logged). Returns 0 ok, -1
   I/O error. */
int casbox_pack_dicts_reseal(struct casbox_pack_store *store,
			     unsigned int *resealed_r, unsigned int *failed_r,
			     const char **error_r);
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
   decides when to train one). The first call lists the dictionaries
   if no transaction did yet (an error reading the directory is logged
   and counts as none). */
uint32_t casbox_pack_dict_current(struct casbox_pack_store *store);
/* Load the dictionaries not loaded yet: for a frame that names one the
   store does not know, and for those other processes wrote since
   (casbox_pack_dict_current() then names the newest). Opening the
   store loads none: each append transaction loads those its listing
   of the directory finds, under the append lock. Returns 0 ok, -1
   error (the directory could not be read). */
int casbox_pack_dicts_load(struct casbox_pack_store *store,
			   const char **error_r);

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
/* Reading a blob with a base (rec->base_depth > 0; casbox_pack_blob_open()
   fails such a stream with an error that says so). */
struct casbox_base_plain;
/* The blob record of a base blob, from the LSM: returns 1 found, 0 no
   such blob, -1 error (error_r set for 0 and -1). */
typedef int casbox_pack_base_lookup_func_t(void *context,
					   const struct cas_blob_id *base_id,
					   struct casbox_blob_record *rec_r,
					   const char **error_r);
/* The decoded prefix of base_id, from the store's base cache or decoded
   now (its own base first, through lookup; at most
   CASBOX_BASE_MAX_DEPTH deep) and cached. depth is the depth the
   dependent's record expects the base to have (dependent's depth - 1).
   Each base's pack is opened before it is read, as
   casbox_pack_blob_open_pinned() does. Returns 1 ok (*plain_r
   referenced), 0 when the pack of a base in the chain does not exist
   (gc moved it since lookup's view of the LSM: refresh it and call
   again), -1 error naming the base: missing, of the wrong depth, or
   damaged; error_r is set for 0 and -1. */
int casbox_pack_base_get(struct casbox_pack_store *store,
			 const struct cas_blob_id *base_id, uint8_t depth,
			 casbox_pack_base_lookup_func_t *lookup,
			 void *context, struct casbox_base_plain **plain_r,
			 const char **error_r);
/* Tests: called between a base's record lookup and the open of its
   pack (gc moving the base there). */
extern void (*casbox_pack_base_open_hook)(const struct cas_blob_id *base_id);
/* A blob istream decoding with base (which must be rec->base_id's
   prefix: any other fails authentication, never wrong data); the stream
   holds its own reference. */
struct istream *
casbox_pack_blob_open_base(struct casbox_pack_store *store,
			   const struct cas_blob_id *id,
			   const struct casbox_blob_record *rec,
			   struct casbox_base_plain *base);
/* casbox_pack_blob_open() for any record: with its base from
   casbox_pack_base_get() when it has one. Returns 1 ok, -1 error (the
   base missing, damaged or its pack gone; error_r names blob and
   base). */
int casbox_pack_blob_open_chain(struct casbox_pack_store *store,
				const struct cas_blob_id *id,
				const struct casbox_blob_record *rec,
				casbox_pack_base_lookup_func_t *lookup,
				void *context, struct istream **input_r,
				const char **error_r);
/* Keep this blob stream's prefix in the store's base cache once it
   has been read from the start (sequential reads; a seek past what was
   read gives up), so a delta against this blob read next does not
   decode it again: sequential FETCH of a message and then its reply.
   Costs a copy of the prefix (at most CASBOX_BASE_PREFIX_MAX bytes) into
   locked memory; nothing for a blob that cannot be a base (at the
   maximum depth) or is cached already. Call before the first read. */
void casbox_pack_blob_cache_as_base(struct istream *input);
/* The store's base cache (tests, statistics). */
struct casbox_base_cache *
casbox_pack_store_get_base_cache(struct casbox_pack_store *store);

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
/* The same for a blob with a base: base as for
   casbox_pack_blob_open_base() (NULL for a record without one). */
int casbox_pack_blob_open_pinned_base(struct casbox_pack_store *store,
				      const struct cas_blob_id *id,
				      const struct casbox_blob_record *rec,
				      struct casbox_base_plain *base,
				      struct istream **input_r,
				      const char **error_r);

/* Serialisation of a blob record for the LSM (doc/casbox-format.md,
   "Blob record"): version 2 = the fixed fields, the DEK kind and the
   DEK of that kind (106 bytes server-wrapped, 162 sealed); version 3
   (a blob with a base: 139 / 195 bytes) = the same with base depth and
   base id after the fixed fields. Records of blobs without a base are
   written as version 2. Version 1 (105 bytes, always a server-wrapped
   DEK without kind byte) is still read. */
#define CASBOX_BLOB_RECORD_FIXED_SIZE (1 + 4 + 8 + 4 + 8 + 4)
#define CASBOX_BLOB_RECORD_V1_SIZE (CASBOX_BLOB_RECORD_FIXED_SIZE + \
				    CAS_WRAPPED_DEK_SIZE)
/* version 3 (a blob with a base): depth (1) and base id (32) between
   the fixed fields and the DEK */
#define CASBOX_BLOB_RECORD_BASE_SIZE (1 + CAS_BLOB_ID_SIZE)
/* the largest export of a record without a base (a sealed DEK; its
   kind byte is its byte 0) */
#define CASBOX_BLOB_RECORD_EXPORT_NOBASE_MAX_SIZE \
	(CASBOX_BLOB_RECORD_FIXED_SIZE + CAS_STORED_DEK_MAX_SIZE)
/* the largest export of any record */
#define CASBOX_BLOB_RECORD_EXPORT_MAX_SIZE \
	(CASBOX_BLOB_RECORD_EXPORT_NOBASE_MAX_SIZE + \
	 CASBOX_BLOB_RECORD_BASE_SIZE)
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
	/* frame version 3 (a delta frame): the chain depth (0 otherwise),
	   and what casbox_pack_frame_base_id() needs to unmask the base
	   id: cipher, frame nonce, masked base id */
	uint8_t base_depth;
	uint8_t cipher;
	unsigned char nonce[CAS_AEAD_FRAME_NONCE_SIZE];
	unsigned char base_masked[CAS_BLOB_ID_SIZE];
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
/* The base id of a delta frame the scan reported (info->base_depth >
   0), unmasked with the blob's DEK (dek_kind/stored_dek as in a blob
   record, e.g. from the recovery record: rebuild --from-packs). Not
   authenticated by itself: reading the blob with that base proves it
   (the chunk AAD binds it). Returns 1 ok, -1 error (no delta frame, the
   DEK does not open). */
int casbox_pack_frame_base_id(struct casbox_pack_store *store,
			      const struct casbox_pack_frame_info *info,
			      uint8_t dek_kind, const unsigned char *stored_dek,
			      struct cas_blob_id *base_id_r,
			      const char **error_r);

#endif
