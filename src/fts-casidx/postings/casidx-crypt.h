#ifndef CASIDX_CRYPT_H
#define CASIDX_CRYPT_H

/* casidx sealed files: a whole segment file encrypted with the user's
   casbox index key (doc/casidx-format.md, "Encrypted segments"):

     "CXSEGENC" | u32 version (1) | nonce[24] | ciphertext | tag[16]

   XChaCha20-Poly1305 via cas_record_seal() (the key ring's index key,
   whose purpose includes FTS segments). The associated data binds the
   file to its place and format:

     "casidx-seg" NUL | "CXSEGENC" | u32 version | mailbox GUID hex NUL |
     file name

   so a sealed segment cannot be moved to another mailbox, renamed to
   another segment id, or downgraded. The tag is verified before a single
   plaintext byte is returned; nothing is parsed from unauthenticated
   bytes. */

#include "buffer.h"

struct cas_keyring;

#define CASIDX_CRYPT_MAGIC "CXSEGENC"
#define CASIDX_CRYPT_VERSION 1
/* magic | version | nonce | tag */
#define CASIDX_CRYPT_OVERHEAD (8 + 4 + 24 + 16)

/* Append the sealed form of plain to sealed. */
void casidx_crypt_seal(const struct cas_keyring *keyring,
		       const char *box_guid, const char *file_name,
		       const void *plain, size_t size, buffer_t *sealed);
/* Verify and decrypt a sealed file image, appending the plaintext to
   plain. Returns 1 ok, -1 not a sealed file, wrong key, moved or
   tampered (error_r says which of "not sealed", "version" or
   "authentication failed", never key bytes; plain is unchanged). */
int casidx_crypt_open(const struct cas_keyring *keyring,
		      const char *box_guid, const char *file_name,
		      const void *data, size_t size, buffer_t *plain,
		      const char **error_r);

/* Key rotation: if the sealed file opens under an older key epoch than
   the key ring's current one, append it sealed under the current one to
   resealed and return 1; 0 it is current already (or the ring has one
   index key); -1 it opens under none (error_r). */
int casidx_crypt_reseal(const struct cas_keyring *keyring,
			const char *box_guid, const char *file_name,
			const void *data, size_t size, buffer_t *resealed,
			const char **error_r);

#endif
