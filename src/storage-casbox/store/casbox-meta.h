#ifndef CASBOX_META_H
#define CASBOX_META_H

/* casbox-meta: what FETCH BODYSTRUCTURE, BODY, ENVELOPE and MIME part
   lookups need, kept sealed in the message record so that they decode no
   blob (doc/casbox-storage.md, "LSM records").

   plaintext v2 = u8 2 | u32 raw size | zstd frame of raw, compressed
                  against the fixed dictionary in casbox-meta.c
       raw      = u32 len | BODYSTRUCTURE | u32 len | ENVELOPE
                | u32 len | message_part_serialize() tree
   plaintext v1 = u8 1 | u32 len | BODYSTRUCTURE | u32 len | BODY
                       | u32 len | ENVELOPE | u32 len | tree   (read only)
   sealed       = cas_record_seal(index key,
                    AAD = "casbox-msg-meta" | parts (blob id | u64 size))

   Version 2 leaves BODY out: it is BODYSTRUCTURE without the extension
   data, and the glue derives it with imap_body_parse_from_bodystructure()
   as Dovecot's index-mail does when its cache holds only BODYSTRUCTURE.
   The AAD binds the metadata to the bytes it describes, so COPY and
   MOVE reuse it unchanged and it cannot be moved to a record with
   other content. Decoders treat the plaintext as untrusted too. */

#include "casbox-records.h"

struct message_part;

struct casbox_msg_meta {
	const char *bodystructure;
	/* NULL when read from version 2 (derive it from bodystructure);
	   ignored by casbox_meta_seal() */
	const char *body;
	const char *envelope;
	/* message_part_serialize() of the tree, positions relative to the
	   stored (LF) bytes: give each mail its own copy with
	   casbox_meta_get_parts() */
	const unsigned char *tree;
	size_t tree_size;
};

/* Returns the MIME part tree allocated from pool, or NULL with error_r
   set if the stored tree does not decode. */
struct message_part *
casbox_meta_get_parts(const struct casbox_msg_meta *meta, pool_t pool,
		      const char **error_r);

/* Metadata larger than this (before compression) is not sealed:
   BODYSTRUCTURE carries every header parameter, so one message can make
   it many MB, and the record has to fit in one LSM value (16 MiB).
   Reads of such a message parse it, as for one without metadata. */
#define CASBOX_META_MAX_PLAIN_SIZE (1024 * 1024)

/* Seal meta's BODYSTRUCTURE, ENVELOPE and parts (meta->body and
   meta->tree are ignored) as version 2 for rec, whose part ids are
   final, into pool and set rec->sealed_meta. Returns 0, or -1 with
   error_r saying why and rec unchanged if the metadata is over
   CASBOX_META_MAX_PLAIN_SIZE or zstd fails (for want of memory). */
int casbox_meta_seal(const struct cas_keyring *keyring,
		     struct casbox_msg_record *rec,
		     const struct casbox_msg_meta *meta,
		     struct message_part *parts, pool_t pool,
		     const char **error_r);

/* Returns 1 ok (meta_r allocated from pool), 0 if the record has none,
   -1 if it fails to authenticate or decode (error_r says why). */
int casbox_meta_open(const struct cas_keyring *keyring,
		     const struct casbox_msg_record *rec, pool_t pool,
		     struct casbox_msg_meta *meta_r, const char **error_r);

/* Key rotation --finish: if rec's sealed metadata opens under an older
   key epoch, seal it again under the current one (rec->sealed_meta then
   points into pool). Returns 1 re-sealed, 0 none or already current, -1
   it opens under no epoch the key ring holds (error_r). */
int casbox_meta_reseal(const struct cas_keyring *keyring,
		       struct casbox_msg_record *rec, pool_t pool,
		       const char **error_r);

#endif
