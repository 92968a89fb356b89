#ifndef CASBOX_RECOVERY_H
#define CASBOX_RECOVERY_H

/* Recovery records: what `doveadm casbox rebuild --from-packs` needs to
   rebuild the LSM from the packs alone. One is sealed into a meta frame
   (CASBOX_META_KIND_RECOVERY) in the pack transaction of every saved or
   copied message, before the pack fsync, so it is durable before the
   message is acknowledged (doc/casbox-format.md, "Recovery record").

   Plaintext (big-endian, as the LSM records it embeds):
     u8  version (1: server-wrapped DEKs only; 2: DEKs of any kind, as
         password mode writes them)
     u64 written: microseconds since the epoch (newest record wins)
     16  mailbox storage id (the key of the 'M'/'m' records)
     16  public mailbox GUID (all zero = the storage id)
     u32 UIDVALIDITY | u32 UID | u32 mailbox next_uid at the save
     u64 mailbox highest-modseq bound at the save
     u16 len | mailbox name
     u32 len | casbox_msg_record_export() (flags/keywords as saved;
               without the sealed BODYSTRUCTURE metadata, which is
               derived from the bytes)
     u16 n | n x (blob id (32) | u32 dict_id | u64 plain_size |
                  stored DEK)
   where a stored DEK is, as in the blob record: version 1: u8 kind (1)
   | wrapped DEK (76); version 2: kind 1 as in version 1, or the 133-byte
   sealed DEK (kind 2, its byte 0). A record whose DEKs are all of kind
   1 (every server-mode record) is written as version 1, byte for byte
   as before version 2 existed. Since 2026-12-06 the record is written
   as version 3 (below: the same record zstd-compressed) whenever that
   is smaller, which for a real message it always is.
   The blobs: in password mode every distinct blob of the message and
   the bases of its delta blobs, with the stored DEK the store had for
   it at the save (new or deduplicated alike), so each record opens its
   message on its own. In server key mode only the blobs the save wrote:
   the DEK of a deduplicated blob or a base is in the record of the save
   that wrote it, and gc writes it as blob keys when it drops that
   record while the blob lives on. A later DEK (gc's fresh one, key
   rotation) is in a DEK update frame. */

#include "casbox-records.h"
#include "casbox-pack.h"

#define CASBOX_RECOVERY_VERSION 1
/* DEKs of any kind (password mode's sealed DEKs); readers before it
   reject it with "unsupported version". */
#define CASBOX_RECOVERY_VERSION_DEK_KIND 2
/* Version 3 (since 2026-12-06): u8 3 | u32 raw size | one zstd frame
   that declares that size and holds a version 1 or 2 record, written
   whenever it is smaller; readers before it reject it with
   "unsupported version 3". */
#define CASBOX_RECOVERY_VERSION_ZSTD 3
#define CASBOX_RECOVERY_ZSTD_LEVEL 3
#define CASBOX_RECOVERY_MAX_RAW (16U * 1024 * 1024)

struct casbox_recovery_blob {
	struct cas_blob_id id;
	uint32_t dict_id;
	uint64_t plain_size;
	/* enum cas_dek_kind, as in struct casbox_blob_record */
	uint8_t dek_kind;
	union {
		unsigned char wrapped_dek[CAS_WRAPPED_DEK_SIZE];
		unsigned char sealed_dek[CAS_SEALED_DEK_SIZE];
		unsigned char stored_dek[CAS_STORED_DEK_MAX_SIZE];
	};
};
ARRAY_DEFINE_TYPE(casbox_recovery_blob, struct casbox_recovery_blob);

struct casbox_recovery_record {
	uint64_t written_usecs;
	guid_128_t mailbox_guid;
	guid_128_t public_guid;
	uint32_t uid_validity;
	uint32_t uid;
	uint32_t next_uid;
	uint64_t highest_modseq;
	const char *mailbox_name;
	struct casbox_msg_record msg;
	ARRAY_TYPE(casbox_recovery_blob) blobs;
};

/* Mailbox record (CASBOX_META_KIND_MAILBOX): written when a mailbox is
   created, renamed, gets another public GUID or UIDVALIDITY, or is
   deleted, so that a rebuild knows mailboxes with no message, current
   names, and which mailboxes' mail must not come back.
     u8  version (1) | u64 written (microseconds) | 16 storage id |
     16  public GUID (zero = the storage id) | u32 UIDVALIDITY |
     u8  flags (1 = deleted; others rejected) | u16 len | name */
#define CASBOX_RECOVERY_MAILBOX_DELETED 0x01
struct casbox_recovery_mailbox {
	uint64_t written_usecs;
	guid_128_t mailbox_guid;
	guid_128_t public_guid;
	uint32_t uid_validity;
	bool deleted;
	const char *name;
};

/* Blob keys (CASBOX_META_KIND_BLOB_KEYS): gc writes one for a recovery
   record it drops (its message is gone) when some of the record's
   blobs are still live, with those blobs' entries as the record had
   them, so that messages whose own record holds no DEK (copies, below)
   still find one, and the plain size of a delta's base:
     u8 version (1: server-wrapped DEKs) | u64 written |
     u16 n | n x blob entry (as in the recovery record) */
#define CASBOX_BLOB_KEYS_VERSION 1
struct casbox_blob_keys {
	uint64_t written_usecs;
	ARRAY_TYPE(casbox_recovery_blob) blobs;
};
void casbox_blob_keys_export(const struct casbox_blob_keys *rec,
			     buffer_t *dest);
int casbox_blob_keys_import(const void *data, size_t size, pool_t pool,
			    struct casbox_blob_keys *rec_r,
			    const char **error_r);

/* Copy record (CASBOX_META_KIND_COPY): the messages one COPY (or one
   of its checkpoint chunks) added to one mailbox, in server key mode.
   A copy writes no blob, so instead of a recovery record per message
   (~550 bytes: mailbox, message record and every blob's wrapped DEK)
   it writes only the message records, many to a frame, compressed;
   the DEKs are in the records of the messages that stored the blobs,
   or in blob keys gc writes when it drops those.
     u8 version (1) | u64 written | 16 mailbox storage id |
     16 public mailbox GUID (zero = the storage id) | u32 UIDVALIDITY |
     u32 mailbox next_uid | u64 highest-modseq bound | u16 len | name |
     u8 compression (0 none, 1 zstd) | [u32 raw size |] body
   body (after decompression) = u32 n | n x (u32 UID | u32 len |
     casbox_msg_record_export(), as in a recovery record)
   The raw size is at most CASBOX_COPY_RECORD_MAX_RAW. */
#define CASBOX_COPY_RECORD_VERSION 1
#define CASBOX_COPY_RECORD_MAX_RAW (64U * 1024 * 1024)
struct casbox_copy_entry {
	uint32_t uid;
	struct casbox_msg_record msg;
};
ARRAY_DEFINE_TYPE(casbox_copy_entry, struct casbox_copy_entry);
struct casbox_copy_record {
	uint64_t written_usecs;
	guid_128_t mailbox_guid;
	guid_128_t public_guid;
	uint32_t uid_validity;
	uint32_t next_uid;
	uint64_t highest_modseq;
	const char *mailbox_name;
	ARRAY_TYPE(casbox_copy_entry) entries;
};
/* entries is the already exported body (u32 n | entries), as
   casbox_copy_record_body_add() builds it; compressed here when that
   makes it smaller. */
void casbox_copy_record_export(const struct casbox_copy_record *rec,
			       const buffer_t *body, buffer_t *dest);
/* One entry onto body (body starts with u32 n = 0: _body_init()). */
void casbox_copy_record_body_init(buffer_t *body);
void casbox_copy_record_body_add(buffer_t *body, uint32_t uid,
				 const struct casbox_msg_record *msg);
unsigned int casbox_copy_record_body_count(const buffer_t *body);
/* rec->entries from pool. Returns 1 ok, -1 malformed. */
int casbox_copy_record_import(const void *data, size_t size, pool_t pool,
			      struct casbox_copy_record *rec_r,
			      const char **error_r);
/* The recovery record a copy entry stands for (no blobs: a rebuild
   takes their DEKs from any record that has them). */
void casbox_copy_record_entry(const struct casbox_copy_record *rec,
			      const struct casbox_copy_entry *entry,
			      pool_t pool,
			      struct casbox_recovery_record *rrec_r);

void casbox_recovery_mailbox_export(const struct casbox_recovery_mailbox *rec,
				    buffer_t *dest);
/* Returns 1 ok, -1 malformed. */
int casbox_recovery_mailbox_import(const void *data, size_t size, pool_t pool,
				   struct casbox_recovery_mailbox *rec_r,
				   const char **error_r);

/* Version 3 when that is smaller (always, for a real message), else
   the record _export_plain() writes. */
void casbox_recovery_record_export(const struct casbox_recovery_record *rec,
				   buffer_t *dest);
/* The uncompressed record, version 1 or 2 by its DEKs: what version 3
   compresses (and what the committed fixtures hold). */
void
casbox_recovery_record_export_plain(const struct casbox_recovery_record *rec,
				    buffer_t *dest);
/* What a recovery record's locator (password mode,
   casbox_pack_meta_locator_make()) is computed over: mailbox storage id
   (16) | UID (u32 BE) | message GUID. gc without the password computes
   it for every live message and so knows, without opening them, which
   records are live. */
void casbox_recovery_locator_data(const guid_128_t mailbox_guid, uint32_t uid,
				  const char *msg_guid, buffer_t *dest);
/* Strings and arrays from pool. Returns 1 ok, -1 malformed. */
int casbox_recovery_record_import(const void *data, size_t size, pool_t pool,
				  struct casbox_recovery_record *rec_r,
				  const char **error_r);

#endif
