#ifndef CASBOX_FRAME_H
#define CASBOX_FRAME_H

/* Pack file and frame byte layouts (doc/casbox-format.md). All integers
   little-endian. These are pure functions over bytes: every field read
   from disk is bounds-checked here, so they are what the fuzzers test.

   Pack file:
     pack header (20): magic "CASBPACK" | version u32 | pack_id u32 |
                       masked CRC32C of bytes 0..15
     frame*
   Frame:
     0  4  magic "CBFR"
     4  1  version (1)
     5  1  flags (0)
     6  2  reserved (0)
     8  4  frame_size (whole frame)
    12  4  dict_id (0 = none)
    16  8  plain_size
    24  4  chunk_count = max(1, ceil(plain_size / 64 KiB))
    28  4  masked CRC32C of the chunk table
    32 32  blob id
    64  4  masked CRC32C of header bytes 0..63
    68     chunk*: XChaCha20-Poly1305(zstd(64 KiB of plaintext)) | tag(16)
           chunk table: chunk_count x (stored_size u32 | masked CRC32C)
*/

#include "cas-key.h"

#define CASBOX_PACK_HEADER_SIZE 20
/* version 2 packs may hold meta frames; version 1 packs (blob frames
   only) are still read. Writers never add a meta frame to a version 1
   pack: they start a new pack first. */
#define CASBOX_PACK_VERSION 2
#define CASBOX_PACK_VERSION_MIN 1
#define CASBOX_FRAME_HEADER_SIZE 68
#define CASBOX_FRAME_VERSION 1
#define CASBOX_FRAME_MAGIC "CBFR"
#define CASBOX_FRAME_MAGIC_SIZE 4
#define CASBOX_FRAME_TABLE_ENTRY_SIZE 8
#define CASBOX_CHUNK_SIZE 65536
/* ZSTD_COMPRESSBOUND(CASBOX_CHUNK_SIZE) plus the AEAD tag */
#define CASBOX_CHUNK_MAX_STORED (CASBOX_CHUNK_SIZE + \
	(CASBOX_CHUNK_SIZE >> 8) + 64 + CAS_AEAD_TAG_SIZE)
/* a zstd frame is at least a few bytes, the tag 16 */
#define CASBOX_CHUNK_MIN_STORED (CAS_AEAD_TAG_SIZE + 1)
#define CASBOX_CHUNK_AAD_SIZE (4 + 1 + CAS_BLOB_ID_SIZE + 4 + 4 + 1)
/* 2 added the DEK kind (password mode); 1 is still read */
#define CASBOX_BLOB_RECORD_VERSION 2
#define CASBOX_BLOB_RECORD_VERSION_V1 1

/* Meta frame: a sealed record that is not a blob (recovery record, DEK
   update; doc/casbox-format.md "Meta frames"). Its own magic, so no
   blob reader can take it for a blob and the keyless scanner can tell
   the kinds apart.
     0  4  magic "CBMF"
     4  1  version: how the body is sealed (1 = index key, server key
           mode; 2 = to the user's public key, password key mode)
     5  1  kind (enum casbox_meta_kind)
     6  2  reserved (0)
     8  4  frame_size (whole frame)
    12  4  masked CRC32C of the body (bytes 20..frame_size)
    16  4  masked CRC32C of header bytes 0..15
    20     body: version 1: sealed record (nonce | ciphertext | tag);
           version 2: locator (16, in the clear; all zero but for
           recovery records) | cas_userkey_box_seal() (key id |
           ephemeral public key | ciphertext | tag | MAC) */
#define CASBOX_META_MAGIC "CBMF"
#define CASBOX_META_HEADER_SIZE 20
#define CASBOX_META_VERSION 1
/* sealed to the user's public key (casbox_key_mode=password): LMTP
   writes these without the password. Readers before it reject the
   frame ("unsupported version 2"). */
#define CASBOX_META_VERSION_USERKEY 2
/* a sealed record of at least one byte */
#define CASBOX_META_MIN_BODY (CAS_AEAD_NONCE_SIZE + 1 + CAS_AEAD_TAG_SIZE)
#define CASBOX_META_MAX_BODY (16 * 1024 * 1024)
/* AAD of the seal: "CBMF" | version | kind, and in version 2 the
   locator */
#define CASBOX_META_AAD_SIZE 6
#define CASBOX_META_LOCATOR_SIZE 16
#define CASBOX_META_AAD_MAX_SIZE \
	(CASBOX_META_AAD_SIZE + CASBOX_META_LOCATOR_SIZE)

enum casbox_meta_kind {
	/* not a meta frame: a blob frame */
	CASBOX_META_KIND_NONE = 0,
	/* message + mailbox + new blobs' DEKs of one save or copy */
	CASBOX_META_KIND_RECOVERY = 1,
	/* blob id -> a newer wrapped DEK (gc, key rotation) */
	CASBOX_META_KIND_DEK_UPDATE = 2,
	/* a mailbox created, renamed, its GUID changed, or deleted */
	CASBOX_META_KIND_MAILBOX = 3,
};
#define CASBOX_META_KIND_MAX CASBOX_META_KIND_MAILBOX

struct casbox_meta_header {
	/* CASBOX_META_VERSION or _USERKEY; 0 writes CASBOX_META_VERSION */
	uint8_t version;
	enum casbox_meta_kind kind;
	uint32_t frame_size;
	uint32_t body_crc;
};

struct casbox_frame_header {
	uint32_t frame_size;
	uint32_t dict_id;
	uint64_t plain_size;
	uint32_t chunk_count;
	uint32_t table_crc;
	struct cas_blob_id id;
};

struct casbox_frame_chunk {
	uint32_t stored_size;
	uint32_t crc;		/* masked CRC32C of the stored bytes */
	uint64_t offset;	/* from the frame start */
};

void casbox_pack_header_write(uint32_t pack_id,
			      unsigned char dest[CASBOX_PACK_HEADER_SIZE]);
/* Returns 0 ok, -1 damaged (error_r says why). */
int casbox_pack_header_parse(const unsigned char *data, size_t size,
			     uint32_t *pack_id_r, const char **error_r);

uint32_t casbox_frame_chunk_count(uint64_t plain_size);
void casbox_frame_header_write(const struct casbox_frame_header *hdr,
			       unsigned char dest[CASBOX_FRAME_HEADER_SIZE]);
/* Parse and check a frame header: magic, version, CRC, and that the
   sizes are consistent with each other. Returns 0 ok, -1 damaged. */
int casbox_frame_header_parse(const unsigned char *data, size_t size,
			      struct casbox_frame_header *hdr_r,
			      const char **error_r);
/* Parse the chunk table (chunk_count entries, CRC checked against the
   header) into chunks_r[chunk_count], checking that the chunks exactly
   fill the frame. Returns 0 ok, -1 damaged. */
int casbox_frame_table_parse(const struct casbox_frame_header *hdr,
			     const unsigned char *table, size_t size,
			     struct casbox_frame_chunk *chunks_r,
			     const char **error_r);
void casbox_meta_header_write(const struct casbox_meta_header *hdr,
			      unsigned char dest[CASBOX_META_HEADER_SIZE]);
/* Parse and check a meta frame header: magic, CRC, version, kind,
   reserved bytes and size bounds. Returns 0 ok, -1 damaged. */
int casbox_meta_header_parse(const unsigned char *data, size_t size,
			     struct casbox_meta_header *hdr_r,
			     const char **error_r);
/* Check the body (frame_size - CASBOX_META_HEADER_SIZE bytes) against
   the header's CRC. Returns 0 ok, -1 damaged. */
int casbox_meta_body_check(const struct casbox_meta_header *hdr,
			   const unsigned char *body, size_t size,
			   const char **error_r);
/* Returns the AAD's size. locator: version 2 only. */
size_t casbox_meta_aad(uint8_t version, enum casbox_meta_kind kind,
		       const unsigned char *locator,
		       unsigned char aad_r[CASBOX_META_AAD_MAX_SIZE]);

/* Plaintext size of chunk idx of a blob of plain_size bytes. */
size_t casbox_frame_chunk_plain_size(uint64_t plain_size, uint32_t idx);

/* The AEAD inputs of chunk idx: the AAD binds magic, frame version,
   blob id, dictionary id, chunk index and the last-chunk flag (so chunks
   cannot be reordered, moved to another blob or the blob truncated); the
   nonce is the chunk index (the DEK is fresh for every frame). */
void casbox_frame_chunk_aad(const struct cas_blob_id *id, uint32_t dict_id,
			    uint32_t idx, bool last,
			    unsigned char aad_r[CASBOX_CHUNK_AAD_SIZE]);
void casbox_frame_chunk_nonce(uint32_t idx,
			      unsigned char nonce_r[CAS_AEAD_NONCE_SIZE]);

#endif
