#ifndef CASBOX_STORE_SAFETY_H
#define CASBOX_STORE_SAFETY_H

/* casbox-store-safety: the records behind duplicate-delivery suppression
   and the undelete window (doc/casbox-storage.md, "Duplicate deliveries"
   and "Undelete window").

   key                                      value
   'd' | mailbox guid (16) | dup key (32)   u8 version (1) | i64 delivered |
                                            u32 uid | u16 len | GUID string
   'x' | mailbox guid (16) | uid (u32)      u8 version (1) | i64 expunged |
                                            u16 len | mailbox name |
                                            u32 len | message record ('m'
                                            value, the flag record applied,
                                            no sealed metadata)

   The dup key is a keyed BLAKE2b-256 (the blob-id key, which LMTP has in
   both key modes) of "casbox-dup1" NUL, then the message without its trace
   header fields (Return-Path, Received, Delivered-To, X-Original-To): the
   store keeps no plain hash of anything a user wrote.

   A retained ('x') record holds the references of the message record it
   replaced: blob refcounts count message and retained records alike, so
   gc keeps the blobs until the retained record is released. Stores
   without these records open as before; builds without them ignore them
   (their scrub would see retained references as refcount mismatches). */

#include "casbox-records.h"

#define CASBOX_KEY_DUPLICATE 'd'
#define CASBOX_KEY_RETAINED 'x'
#define CASBOX_DUP_KEY_SIZE 32

struct istream;
struct cas_keyring;
struct casbox_store;
struct casbox_store_txn;
struct casbox_lsm_batch;

struct casbox_dup_key {
	unsigned char key[CASBOX_DUP_KEY_SIZE];
};

struct casbox_dup_record {
	time_t delivered;
	uint32_t uid;
	const char *guid;
};

struct casbox_retained_record {
	time_t expunged;
	/* the mailbox's name when the message was expunged */
	const char *mailbox_name;
	struct casbox_msg_record msg;
};

/* The dup key of the message in input (read from offset 0 to EOF).
   Returns 0 ok, -1 read error. */
int casbox_dup_key_compute(const struct cas_keyring *keyring,
			   struct istream *input,
			   struct casbox_dup_key *key_r, const char **error_r);
/* TRUE if name (not NUL-terminated) is a trace header field name that
   the dup key leaves out (case-insensitive). */
bool casbox_dup_is_trace_field(const unsigned char *name, size_t size);

void casbox_key_duplicate(buffer_t *key, const guid_128_t mailbox_guid,
			  const struct casbox_dup_key *dup);
void casbox_key_retained(buffer_t *key, const guid_128_t mailbox_guid,
			 uint32_t uid);
int casbox_key_retained_parse(const unsigned char *key, size_t key_size,
			      guid_128_t mailbox_guid_r, uint32_t *uid_r);

void casbox_dup_record_export(const struct casbox_dup_record *rec,
			      buffer_t *dest);
int casbox_dup_record_import(const void *data, size_t size, pool_t pool,
			     struct casbox_dup_record *rec_r,
			     const char **error_r);
void casbox_retained_record_export(const struct casbox_retained_record *rec,
				   buffer_t *dest);
int casbox_retained_record_import(const void *data, size_t size,
				  pool_t pool,
				  struct casbox_retained_record *rec_r,
				  const char **error_r);

/* The dup record of a mailbox and key, as the LSM has it after a
   refresh. Returns 1 found, 0 none, -1 error. */
int casbox_store_dup_lookup(struct casbox_store *store,
			    const guid_128_t mailbox_guid,
			    const struct casbox_dup_key *dup, pool_t pool,
			    struct casbox_dup_record *rec_r,
			    const char **error_r);
/* Put a dup record in the transaction. */
void casbox_store_txn_dup_put(struct casbox_store_txn *txn,
			      const guid_128_t mailbox_guid,
			      const struct casbox_dup_key *dup,
			      const struct casbox_dup_record *rec);
/* Delete the mailbox's dup records whose UID is at least first_uid (the
   UIDs of released orphan records: their delivery was never
   acknowledged, so a retry must be stored). Returns the number deleted,
   or -1 error. */
int casbox_store_txn_dup_release_from(struct casbox_store_txn *txn,
				      const guid_128_t mailbox_guid,
				      uint32_t first_uid,
				      const char **error_r);

/* Callback for every retained record (all mailboxes, key order). */
typedef void casbox_store_retained_callback_t(void *context,
		const guid_128_t mailbox_guid, uint32_t uid,
		const struct casbox_retained_record *rec);
/* Returns 0 ok, -1 error (a record that fails to decode is an error). */
int casbox_store_retained_iterate(struct casbox_store *store,
				  casbox_store_retained_callback_t *callback,
				  void *context, const char **error_r);

/* What casbox_store_safety_expire() released. */
struct casbox_expire_result {
	unsigned int retained_released;
	uint64_t retained_bytes_released;
	unsigned int dups_released;
};
/* Release retained records expunged before now - retention (all of them
   with retention 0) and delete dup records delivered before now -
   duplicate_window, in one durable LSM transaction (in pieces for many).
   gc calls it before it looks at the packs. Returns 0 ok, -1 error. */
int casbox_store_safety_expire(struct casbox_store *store, time_t now,
			       unsigned int retention,
			       unsigned int duplicate_window,
			       struct casbox_expire_result *result_r,
			       const char **error_r);

#endif
