#ifndef CASBOX_XMSG_H
#define CASBOX_XMSG_H

/* casbox-xmsg: which earlier blob a saved message's lead part (part 0:
   its header and the text up to the first part stored alone) is
   compressed against (issue 16 step 4; doc/casbox-storage.md,
   "Cross-message compression"; measured in doc/benchmarks.md, "Step 4
   groundwork"): the lead part of the message it replies to, else the
   sender's previous message's.

   key                                       value (records v2 envelope)
   'X' | 'i' | H(Message-ID) (32)            u8 version (1) | blob id (32)
   'X' | 'a' | H(From address) (32)          u8 version (1) | blob id (32)

   H = keyed BLAKE2b-256 (the record key of the current epoch, which
   LMTP holds in both key modes) of "casbox-xmsg1" NUL | kind | the
   normalised string: the store keeps no plain hash of a Message-ID or
   an address. The records are hints, not references: the blob they
   name may be gone (then no base is used). Key rotation --finish
   deletes those of older epochs (their keys cannot be computed any
   more). */

#include "casbox-records.h"

struct casbox_store;
struct casbox_lsm_batch;

#define CASBOX_KEY_XMSG 'X'
#define CASBOX_XMSG_HASH_SIZE 32
#define CASBOX_XMSG_KEY_SIZE (2 + CASBOX_XMSG_HASH_SIZE)
#define CASBOX_XMSG_RECORD_VERSION 1

enum casbox_xmsg_kind {
	CASBOX_XMSG_KIND_MESSAGE_ID = 'i',
	CASBOX_XMSG_KIND_SENDER = 'a',
};

/* What a save knows about a message for choosing its base: its own
   Message-ID, the one it replies to (In-Reply-To, else the last
   References entry) and its sender's address, each normalised (the
   id without <>, the address lowercased) or NULL. */
struct casbox_xmsg_hints {
	const char *message_id;
	const char *parent_id;
	const char *sender;
};

/* One transaction's map: the records it wrote, which the LSM shows only
   after the commit (a thread saved in one transaction). */
struct casbox_xmsg_txn;

struct casbox_xmsg_txn *casbox_xmsg_txn_create(void);
void casbox_xmsg_txn_destroy(struct casbox_xmsg_txn **xtxn);

/* The LSM key of kind/str into key. Returns 0 ok, -1 error (no key). */
int casbox_xmsg_key(struct casbox_store *store, enum casbox_xmsg_kind kind,
		    const char *str, buffer_t *key, const char **error_r);

/* Up to two candidate bases of a message, best first: the parent's lead
   blob, then the sender's previous one (different ids). Returns the
   number found (0..2), -1 error. A record that fails to verify is an
   error. */
int casbox_xmsg_candidates(struct casbox_xmsg_txn *xtxn,
			   struct casbox_store *store,
			   const struct casbox_xmsg_hints *hints,
			   struct cas_blob_id ids_r[2], const char **error_r);

/* Record lead as the blob of hints' Message-ID and as its sender's
   latest, in batch and in xtxn. Returns 0 ok, -1 error. */
int casbox_xmsg_put(struct casbox_xmsg_txn *xtxn, struct casbox_store *store,
		    struct casbox_lsm_batch *batch,
		    const struct casbox_xmsg_hints *hints,
		    const struct cas_blob_id *lead, const char **error_r);

/* An 'X' value's blob id, verified. Returns 1 ok, -1 refused or
   malformed. */
int casbox_xmsg_value_import(struct casbox_store *store,
			     const void *key, size_t key_size,
			     const void *value, size_t value_size,
			     struct cas_blob_id *id_r, const char **error_r);

#endif
