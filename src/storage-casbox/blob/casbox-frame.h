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
   Frame version 2 (written since codec v2; version 1 is still read):
     0  4  magic "CBFR"
     4  1  version (2)
     5  1  cipher (enum cas_aead_cipher: 1 XChaCha20-Poly1305,
           2 AES-256-GCM)
     6  2  reserved (0)
     8  4  frame_size (whole frame)
    12  4  dict_id (0 = none)
    16  4  chunk_count (>= 1; the plaintext size is not in the clear)
    20  4  masked CRC32C of the chunk table
    24 24  frame nonce (random): subkey = BLAKE2b(DEK, nonce), cas-aead.h
    48 32  blob id
    80  4  masked CRC32C of header bytes 0..79
    84     chunk*: AEAD(subkey, zstd(64 KiB) | zero padding to the padme()
           size) | tag(16)
           chunk table as in version 1
   Frame version 3 (a delta frame: compressed against a base blob's
   plaintext, doc/casbox-format.md "Frame version 3"): version 2 with
     4  1  version (3)
     6  1  base depth (1 .. CASBOX_BASE_MAX_DEPTH)
     7  1  reserved (0)
    12  4  dict_id (0: a delta frame uses no dictionary)
    80 32  masked base id = base id XOR BLAKE2b-256(key = subkey,
           "CBBASEID")
   112  4  masked CRC32C of header bytes 0..111
   116     chunks, each zstd-compressed with the base prefix (the
           base's first min(base plain_size, CASBOX_BASE_PREFIX_MAX)
           bytes) as raw-content prefix, or without it where that is
           smaller; chunk table as in version 1
*/

#include "cas-aead.h"

#define CASBOX_PACK_HEADER_SIZE 20
/* version 2 packs may hold meta frames; version 1 packs (blob frames
   only) are still read. Writers never add a meta frame to a version 1
   pack: they start a new pack first. */
#define CASBOX_PACK_VERSION 2
#define CASBOX_PACK_VERSION_MIN 1
/* version 1 header; casbox_frame_header_size() gives a version's */
#define CASBOX_FRAME_HEADER_SIZE 68
#define CASBOX_FRAME_V2_HEADER_SIZE 84
#define CASBOX_FRAME_V3_HEADER_SIZE 116
#define CASBOX_FRAME_HEADER_MAX_SIZE CASBOX_FRAME_V3_HEADER_SIZE
#define CASBOX_FRAME_VERSION_V1 1
#define CASBOX_FRAME_VERSION_V2 2
/* a delta frame (written only for a blob given a base that helps) */
#define CASBOX_FRAME_VERSION_BASE 3
/* A delta frame's base is the first min(plain_size, this) bytes of the
   base blob: a format constant (a frame does not record it; changing
   it needs a new frame version). */
#define CASBOX_BASE_PREFIX_MAX (1024 * 1024)
/* A base may itself have a base, to this chain length: a blob of
   depth d needs d bases decoded (each only its prefix) before it. */
#define CASBOX_BASE_MAX_DEPTH 2
/* BLAKE2b-256 of the base prefix, bound in every chunk's AAD */
#define CASBOX_BASE_DIGEST_SIZE 32
/* what writers write (CASBOX_FRAME_VERSION_BASE for a delta) */
#define CASBOX_FRAME_VERSION 2
#define CASBOX_FRAME_MAGIC "CBFR"
#define CASBOX_FRAME_MAGIC_SIZE 4
#define CASBOX_FRAME_TABLE_ENTRY_SIZE 8
#define CASBOX_CHUNK_SIZE 65536
/* ZSTD_COMPRESSBOUND(CASBOX_CHUNK_SIZE) plus the AEAD tag */
#define CASBOX_CHUNK_V1_MAX_STORED (CASBOX_CHUNK_SIZE + \
	(CASBOX_CHUNK_SIZE >> 8) + 64 + CAS_AEAD_TAG_SIZE)
/* version 2: that zstd bound (65 824) rounded up by padme() (to a
   multiple of 2 048) plus the tag; the largest chunk of either version */
#define CASBOX_CHUNK_MAX_PADDED 67584
#define CASBOX_CHUNK_MAX_STORED (CASBOX_CHUNK_MAX_PADDED + CAS_AEAD_TAG_SIZE)
/* a zstd frame is at least a few bytes, the tag 16 */
#define CASBOX_CHUNK_MIN_STORED (CAS_AEAD_TAG_SIZE + 1)
#define CASBOX_CHUNK_AAD_V1_SIZE (4 + 1 + CAS_BLOB_ID_SIZE + 4 + 4 + 1)
/* version 2 adds the cipher and the chunk's plaintext size */
#define CASBOX_CHUNK_AAD_V2_SIZE (CASBOX_CHUNK_AAD_V1_SIZE + 1 + 4)
/* version 3 adds base id, base prefix digest and base depth */
#define CASBOX_CHUNK_AAD_V3_SIZE (CASBOX_CHUNK_AAD_V2_SIZE + \
	CAS_BLOB_ID_SIZE + CASBOX_BASE_DIGEST_SIZE + 1)
#define CASBOX_CHUNK_AAD_SIZE CASBOX_CHUNK_AAD_V3_SIZE
/* 2 added the DEK kind (password mode); 1 is still read. 3 = a record
   of a blob with a base (base depth and id before the DEK); records of
   blobs without a base are still written as version 2. */
#define CASBOX_BLOB_RECORD_VERSION 2
#define CASBOX_BLOB_RECORD_VERSION_V1 1
#define CASBOX_BLOB_RECORD_VERSION_BASE 3

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
	/* blob ids -> DEK and plain size, without a message: what gc keeps
	   of a dropped recovery record whose blobs other messages use */
	CASBOX_META_KIND_BLOB_KEYS = 4,
	/* the message records of a COPY's messages into one mailbox,
	   without DEKs (server key mode) */
	CASBOX_META_KIND_COPY = 5,
};
#define CASBOX_META_KIND_MAX CASBOX_META_KIND_COPY

struct casbox_meta_header {
	/* CASBOX_META_VERSION or _USERKEY; 0 writes CASBOX_META_VERSION */
	uint8_t version;
	enum casbox_meta_kind kind;
	uint32_t frame_size;
	uint32_t body_crc;
};

struct casbox_frame_header {
	/* CASBOX_FRAME_VERSION_V1 or 2; 0 writes CASBOX_FRAME_VERSION */
	uint8_t version;
	/* version 2: enum cas_aead_cipher (version 1: XChaCha20-Poly1305
	   under the DEK itself) */
	uint8_t cipher;
	uint32_t frame_size;
	uint32_t dict_id;
	/* version 1 only: version 2 keeps it inside the AEAD (the AAD of
	   every chunk binds its plaintext size) and the reader takes it
	   from the blob record */
	uint64_t plain_size;
	/* version 2 only */
	unsigned char nonce[CAS_AEAD_FRAME_NONCE_SIZE];
	uint32_t chunk_count;
	uint32_t table_crc;
	struct cas_blob_id id;
	/* version 3 only: the chain depth (1..CASBOX_BASE_MAX_DEPTH; 0 in
	   versions 1 and 2) and the base id as stored, masked
	   (casbox_frame_base_mask()) */
	uint8_t base_depth;
	unsigned char base_masked[CAS_BLOB_ID_SIZE];
	/* version 3, not parsed from the header but filled in by writer
	   and reader before casbox_frame_chunk_aad(): the base id
	   (unmasked) and the digest of the base prefix */
	struct cas_blob_id base_id;
	unsigned char base_digest[CASBOX_BASE_DIGEST_SIZE];
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
/* Header size of a frame version (0 = CASBOX_FRAME_VERSION). */
size_t casbox_frame_header_size(uint8_t version);
/* Writes casbox_frame_header_size(hdr->version) bytes. */
void casbox_frame_header_write(const struct casbox_frame_header *hdr,
			       unsigned char dest[CASBOX_FRAME_HEADER_MAX_SIZE]);
/* Parse and check a frame header of either version: magic, version,
   CRC, cipher, and that the sizes are consistent with each other (size
   may exceed the header). Returns 0 ok, -1 damaged. */
int casbox_frame_header_parse(const unsigned char *data, size_t size,
			      struct casbox_frame_header *hdr_r,
			      const char **error_r);
/* TRUE if a parsed header agrees with a blob record's frame_size,
   dict_id and plain_size (version 1: equal; version 2, which does not
   store it: the chunk count it implies). The blob id is the caller's
   to compare. */
bool casbox_frame_header_matches(const struct casbox_frame_header *hdr,
				 uint32_t frame_size, uint64_t plain_size,
				 uint32_t dict_id);
/* Mask (or unmask: the same XOR) a base id with the frame's subkey:
   out = in XOR BLAKE2b-256(key = subkey, "CBBASEID"). The subkey is
   unique per frame, so the pad is used once; a disk reader without the
   DEK cannot tell which blob a delta frame depends on. */
void casbox_frame_base_mask(const unsigned char subkey[CAS_AEAD_SUBKEY_SIZE],
			    const unsigned char in[CAS_BLOB_ID_SIZE],
			    unsigned char out_r[CAS_BLOB_ID_SIZE]);
/* The base prefix digest bound in the AAD: BLAKE2b-256 (unkeyed) of
   the prefix bytes. */
void casbox_frame_base_digest(const void *prefix, size_t size,
			      unsigned char digest_r[CASBOX_BASE_DIGEST_SIZE]);
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
/* TRUE if frame_size is possible for a blob of plain_size bytes in a
   frame of either version (the blob record does not say which). */
bool casbox_frame_size_possible(uint64_t plain_size, uint64_t frame_size);

/* Padmé (Nikitin et al., "Reducing Metadata Leakage from Encrypted
   Files and Communication with PURBs", 2019): size rounded up so that
   only O(log log size) bits of it remain, at most +12 % (+6.25 %
   from 1 KiB to 64 KiB). Version 2 chunks pad their zstd output to this. */
uint64_t casbox_padme(uint64_t size);

/* The largest window a chunk's zstd frame may ask for, as a log2: the
   reader refuses more (RFC 8878 3.1.1.1.2). Writers make single-segment
   frames (window = content size <= CASBOX_CHUNK_SIZE); the bound leaves
   room for a chunk plus a whole base prefix. zstd's one-shot decoder
   ignores ZSTD_d_windowLogMax, hence the explicit check. */
#define CASBOX_ZSTD_WINDOW_LOG_MAX 21

/* The window the zstd frame at data (size bytes, authenticated) asks
   for: its window descriptor, or the content size of a single-segment
   frame. Returns 0 and sets *window_r, or -1 with *error_r if the
   bytes do not start with a zstd frame header. */
int casbox_frame_zstd_window(const unsigned char *data, size_t size,
			     uint64_t *window_r, const char **error_r);

/* The AEAD inputs of chunk idx: the AAD binds magic, frame version,
   blob id, dictionary id, chunk index and the last-chunk flag (so chunks
   cannot be reordered, moved to another blob or the blob truncated),
   and in version 2 also the cipher and the chunk's plaintext size
   (chunk_plain_size; ignored for version 1), and in version 3 the
   base id, the base prefix digest and the base depth (hdr->base_id,
   base_digest, base_depth). Returns the AAD's size.
   The version 1 nonce is the chunk index (the DEK is fresh for every
   frame); version 2: cas_aead_chunk_*(). */
size_t casbox_frame_chunk_aad(const struct casbox_frame_header *hdr,
			      uint32_t idx, bool last,
			      size_t chunk_plain_size,
			      unsigned char aad_r[CASBOX_CHUNK_AAD_SIZE]);
void casbox_frame_chunk_nonce(uint32_t idx,
			      unsigned char nonce_r[CAS_AEAD_NONCE_SIZE]);

#endif
