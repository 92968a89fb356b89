#ifndef CASBOX_RECORDS_H
#define CASBOX_RECORDS_H

/* LSM key/value layout of casbox (doc/casbox-storage.md, "Records").

   key                                   value
   'K'                                   key record: u8 version, u32 key id
   'M' | mailbox guid (16)               mailbox record
   'm' | mailbox guid (16) | uid (u32)   message record
   'f' | mailbox guid (16) | uid (u32)   flag record: the message's flags,
                                         keywords and modseq since its
                                         last flag change, overriding the
                                         message record's (saved ones)
   'b' | blob id (32)                    blob record: refcount + pack export

   All integers are big-endian, so message records of one mailbox
   iterate in UID order. Decoders treat the bytes as untrusted and
   fail with a reason instead of reading out of bounds. */

#include "guid.h"
#include "cas-key.h"
#include "casbox-b64.h"

#define CASBOX_KEY_KEYRING 'K'
#define CASBOX_KEY_MAILBOX 'M'
#define CASBOX_KEY_MESSAGE 'm'
#define CASBOX_KEY_FLAGS 'f'
#define CASBOX_KEY_BLOB 'b'
/* 's' | meta id (32): shared sealed metadata, written once; 'r' | meta
   id: its refcount (casbox-record-auth.h) */
#define CASBOX_KEY_META 's'
#define CASBOX_KEY_META_REFS 'r'
#define CASBOX_META_ID_SIZE 32

#define CASBOX_RECORD_VERSION 1

struct casbox_msg_part {
	struct cas_blob_id id;
	/* the part's bytes in the message (as delivered) */
	uoff_t size;
	/* CASBOX_PART_TRANSFORM_*: NONE = the blob holds the size bytes as
	   they are; BASE64 = the blob holds stored_size decoded bytes that
	   re-encode in b64 to exactly size bytes (casbox-b64.h) */
	uint8_t transform;
	struct casbox_b64_form b64;
	uoff_t stored_size;
};
ARRAY_DEFINE_TYPE(casbox_msg_part, struct casbox_msg_part);

struct casbox_msg_record {
	/* the message GUID string exactly as saved (dsync may give
	   non-128bit GUIDs) */
	const char *guid;
	time_t received_date;
	time_t save_date;
	uoff_t physical_size;
	uoff_t virtual_size;
	/* durable mirror of the index state */
	uint32_t flags;
	uint64_t modseq;
	ARRAY_TYPE(const_string) keywords;
	/* concatenated in order, these are the exact message bytes */
	ARRAY_TYPE(casbox_msg_part) parts;
	/* POP3 UIDL ("" = none) and order (0 = none), e.g. from dsync */
	const char *pop3_uidl;
	uint32_t pop3_order;
	/* BODYSTRUCTURE, BODY and MIME part tree sealed with the index key
	   (casbox-meta.h); NULL/0 = none (records of older saves). The
	   AAD binds it to the parts, so COPY reuses it as is. */
	const unsigned char *sealed_meta;
	size_t sealed_meta_size;
	/* records v2: the sealed metadata is in the shared 's' record of
	   this id (its content: the part list), not in the record; the
	   store's lookups fill sealed_meta from it */
	bool meta_ref;
	unsigned char meta_id[CASBOX_META_ID_SIZE];
};

struct casbox_mailbox_record {
	uint32_t uid_validity;
	const char *name;
	/* at least the index's next_uid when last written (0 = unknown):
	   a rebuild must never hand out a UID again */
	uint32_t next_uid;
	/* at least the index's highest modseq after the last change
	   written (0 = unknown): a rebuild never lets modseqs go down */
	uint64_t highest_modseq;
	/* the public mailbox GUID (IMAP/dsync) when it differs from the
	   GUID in the record's key, the mailbox's fixed storage id;
	   empty = the same */
	guid_128_t guid;
};

struct casbox_blob_value {
	uint32_t refcount;
	/* casbox_blob_record_export() bytes, opaque here */
	const unsigned char *pack_record;
	size_t pack_record_size;
};

/* The size of the part's blob (its plaintext). */
static inline uoff_t
casbox_msg_part_blob_size(const struct casbox_msg_part *part)
{
	return part->transform == CASBOX_PART_TRANSFORM_NONE ?
		part->size : part->stored_size;
}

void casbox_key_mailbox(buffer_t *key, const guid_128_t mailbox_guid);
void casbox_key_message(buffer_t *key, const guid_128_t mailbox_guid,
			uint32_t uid);
void casbox_key_flags(buffer_t *key, const guid_128_t mailbox_guid,
		      uint32_t uid);
void casbox_key_blob(buffer_t *key, const struct cas_blob_id *id);
void casbox_key_meta(buffer_t *key,
		     const unsigned char meta_id[CASBOX_META_ID_SIZE]);
void casbox_key_meta_refs(buffer_t *key,
			  const unsigned char meta_id[CASBOX_META_ID_SIZE]);
/* Parse the UID out of a message key. Returns 1 ok, -1 not one. */
int casbox_key_message_parse(const unsigned char *key, size_t key_size,
			     guid_128_t mailbox_guid_r, uint32_t *uid_r);

void casbox_msg_record_init(pool_t pool, struct casbox_msg_record *rec_r);
/* A copy of src in pool, without its sealed metadata. */
void casbox_msg_record_dup_lean(pool_t pool,
				const struct casbox_msg_record *src,
				struct casbox_msg_record *dest_r);
void casbox_msg_record_export(const struct casbox_msg_record *rec,
			      buffer_t *dest);
/* Strings and arrays are allocated from pool. Returns 1 ok,
   -1 malformed (error_r says why). */
int casbox_msg_record_import(const void *data, size_t size, pool_t pool,
			     struct casbox_msg_record *rec_r,
			     const char **error_r);

/* Shared metadata record (inside the v2 envelope): u8 version, the
   sealed metadata. sealed_r points into data. */
void casbox_meta_record_export(const void *sealed, size_t sealed_size,
			       buffer_t *dest);
int casbox_meta_record_import(const void *data, size_t size,
			      const unsigned char **sealed_r,
			      size_t *sealed_size_r, const char **error_r);
/* Its refcount record: u8 version, u32 refcount (> 0). */
void casbox_meta_refs_export(uint32_t refcount, buffer_t *dest);
int casbox_meta_refs_import(const void *data, size_t size,
			    uint32_t *refcount_r, const char **error_r);

/* Flag record: u8 version, u32 flags, u64 modseq, u16 keyword count,
   then each keyword as u16 length + bytes. */
void casbox_flags_record_export(uint32_t flags, uint64_t modseq,
				const char *const *keywords, buffer_t *dest);
/* Replace rec's flags, modseq and keywords (strings from pool) with the
   flag record's. Returns 1 ok, -1 malformed (error_r says why). */
int casbox_flags_record_import(const void *data, size_t size, pool_t pool,
			       struct casbox_msg_record *rec,
			       const char **error_r);

void casbox_mailbox_record_export(const struct casbox_mailbox_record *rec,
				  buffer_t *dest);
int casbox_mailbox_record_import(const void *data, size_t size,
				 pool_t pool,
				 struct casbox_mailbox_record *rec_r,
				 const char **error_r);

void casbox_blob_value_export(const struct casbox_blob_value *value,
			      buffer_t *dest);
/* value_r->pack_record points into data. */
int casbox_blob_value_import(const void *data, size_t size,
			     struct casbox_blob_value *value_r,
			     const char **error_r);

#endif
