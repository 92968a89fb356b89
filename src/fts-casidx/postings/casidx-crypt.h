#ifndef CASIDX_CRYPT_H
#define CASIDX_CRYPT_H

/* casidx sealed files: a whole segment file encrypted with the user's
   casbox index key (doc/casidx-format.md, "Encrypted segments"):

     version 2: "CXSEGENC" | u32 version (2) | u64 image size |
                nonce[24] | ciphertext | tag[16]
     version 1: "CXSEGENC" | u32 version (1) | nonce[24] | ciphertext |
                tag[16]

   (little-endian). Version 2 (written since 2026-12-06): the plaintext
   is one zstd frame (level 3) of the segment image, whose size is in
   the header (what merges plan with) and in the frame; it about halves
   a segment (varints, front-coded keys and roaring containers, never
   compressed before). Version 1's plaintext is the image itself; it is
   still read, and resealed as it is.

   XChaCha20-Poly1305 via cas_record_seal() (the key ring's index key,
   whose purpose includes FTS segments). The associated data binds the
   file to its place and format:

     "casidx-seg" NUL | the header (magic, version, v2: image size) |
     mailbox GUID hex NUL | file name

   so a sealed segment cannot be moved to another mailbox, renamed to
   another segment id, relabelled to another version or image size. The
   tag is verified before a single plaintext byte is returned; nothing
   is parsed from unauthenticated bytes but the header's fields, which
   the tag then covers. */

#include "buffer.h"

struct cas_keyring;

#define CASIDX_CRYPT_MAGIC "CXSEGENC"
#define CASIDX_CRYPT_VERSION 2
#define CASIDX_CRYPT_VERSION_PLAIN 1
/* Largest segment image a version-2 file may declare: an authenticated
   file that decompresses to more is refused, not allocated. */
#define CASIDX_CRYPT_MAX_IMAGE (1024U * 1024 * 1024)
/* zstd level of version 2 */
#define CASIDX_CRYPT_ZSTD_LEVEL 3
/* nonce | tag */
#define CASIDX_CRYPT_SEAL_OVERHEAD (24 + 16)
/* a version-2 file: header | nonce | tag */
#define CASIDX_CRYPT_OVERHEAD (8 + 4 + 8 + CASIDX_CRYPT_SEAL_OVERHEAD)

/* The sealed form of plain (a segment image, at most
   CASIDX_CRYPT_MAX_IMAGE bytes), compressed (version 2), in a new
   buffer (default_pool) of exactly its size. */
buffer_t *casidx_crypt_seal(const struct cas_keyring *keyring,
			    const char *box_guid, const char *file_name,
			    const void *plain, size_t size);
/* Verify and decrypt a sealed file image into *plain_r, a new buffer
   (default_pool) holding the segment image. Returns 1 ok, -1 not a sealed file, wrong key, moved or
   tampered, or (version 2) its frame is not one zstd frame of at most
   CASIDX_CRYPT_MAX_IMAGE bytes declared and produced (error_r says
   which of "not sealed", "version", "authentication failed" or
   "compressed image", never key bytes; *plain_r is NULL then). */
int casidx_crypt_open(const struct cas_keyring *keyring,
		      const char *box_guid, const char *file_name,
		      const void *data, size_t size, buffer_t **plain_r,
		      const char **error_r);
/* casidx_crypt_open() with the decrypted (still compressed) bytes of a
   version-2 file in scratch instead of a buffer of its own: a caller
   opening several files reuses the same memory (page faults once; a
   version-1 file's image is copied out of it). scratch is emptied and
   wiped before this returns. */
int casidx_crypt_open_scratch(const struct cas_keyring *keyring,
			      const char *box_guid, const char *file_name,
			      const void *data, size_t size, buffer_t *scratch,
			      buffer_t **plain_r, const char **error_r);

/* The image size of a sealed file from its first bytes (header, size
   bytes of them; 20 are enough) and its file size, without the key: the
   header's (version 2) or the file size less the overhead (version 1).
   Returns 0 ok, -1 not a sealed file of a known version. The value is
   only authenticated when the file is opened. */
int casidx_crypt_image_size(const void *header, size_t size,
			    uint64_t file_size, uint64_t *image_size_r);

/* Key rotation: if the sealed file opens under an older key epoch than
   the key ring's current one, append it sealed under the current one to
   resealed and return 1; 0 it is current already (or the ring has one
   index key); -1 it opens under none (error_r). The file keeps its
   version (compressed or not). */
int casidx_crypt_reseal(const struct cas_keyring *keyring,
			const char *box_guid, const char *file_name,
			const void *data, size_t size, buffer_t *resealed,
			const char **error_r);

#endif
