/* casbox-store-gc: doveadm casbox gc: rewrite packs whose dead share passes
   casbox_gc_dead_ratio. See doc/doveadm.md ("gc and concurrent saves")
   for the locking rule.

   1. Without the LSM lock: census (records + keyless frame scan), pick
      the packs, copy their live blobs into the newest pack (decoded and
      encoded again under a fresh DEK), commit the pack appends (fsync).
   2. Under the LSM write lock: switch each blob record that still points
      to the frame copied, drop records nothing references, commit the
      batch (fsync). Copies wrapped before a key rotation began get the
      new wrap and a DEK update for it, committed to the packs first.
   3. Unlink the old packs that no record points into any more.

   Meta frames (doc/casbox-format.md) in a picked pack: a recovery record
   whose message record is live is copied verbatim, a dead one dropped
   (in step 2 a record whose message appeared since keeps its pack); a
   DEK update is copied while its blob is live and stays where it is; a
   mailbox record while its mailbox exists, a deletion marker always.
   Every moved blob gets a DEK update for its fresh DEK. Every recovery
   record carries the DEKs of all its message's blobs, so dropping a
   dead one loses no DEK a live message needs.

   Lock order: step 1 holds the pack append lock alone; step 2 takes the
   pack lock only inside the LSM write lock, as saves and key rotation
   do, so none of them can deadlock with another. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "hex-binary.h"
#include "istream.h"
#include "hash.h"
#include "safe-memset.h"
#include "cas-durable.h"
#include "casbox-lsm.h"
#include "casbox-pack.h"
#include "casbox-recovery.h"
#include "ioloop.h"
#include "casbox-settings.h"
#include "casbox-store.h"
#include "casbox-store-census.h"
#include "casbox-store-progress.h"
#include "casbox-store-gc.h"
#include "casbox-store-safety.h"
#include "casbox-record-auth.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

/* commit the pack appends (and so release the pack lock for saves)
   after this many bytes copied */
#define CASBOX_GC_COMMIT_BYTES (8 * 1024 * 1024)

struct casbox_gc_move {
	struct casbox_census_blob *blob;
	struct casbox_blob_record new_rec;
};

/* A recovery record gc did not copy because its message was gone.
   Password mode without the password knows only its locator (guid is
   NULL then). */
struct casbox_gc_dropped {
	guid_128_t mailbox_guid;
	uint32_t uid;
	const char *guid;
	unsigned char locator[CASBOX_META_LOCATOR_SIZE];
	struct casbox_gc_pack *cand;
};

/* locator (hex) -> "<mailbox guid hex>:<uid>" */
HASH_TABLE_DEFINE_TYPE(casbox_gc_locators, char *, char *);

struct casbox_gc_pack {
	struct casbox_census_pack *pack;
	/* a live blob in it could not be moved: keep the pack */
	bool keep;
};

struct casbox_gc {
	struct casbox_store *store;
	/* the store's parts (packs and keyring once its keys are open) */
	const struct casbox_settings *set;
	const char *root_dir;
	struct casbox_lsm *lsm;
	struct casbox_pack_store *packs;
	struct cas_keyring *keyring;
	struct casbox_census *census;
	bool all;
	ARRAY(struct casbox_gc_pack) candidates;
	ARRAY(struct casbox_gc_move) moves;
	ARRAY(struct casbox_gc_dropped) dropped;
	struct casbox_pack_txn *txn;
	uint64_t txn_bytes;

	/* --all: "<mailbox guid hex>:<uid>" of the live messages whose
	   recovery record was copied */
	HASH_TABLE(char *, char *) covered;
	/* password mode without the password: locator (hex) -> message
	   key as above, of every live message (built when first needed) */
	HASH_TABLE_TYPE(casbox_gc_locators) locators;

	uint64_t bytes_before, bytes_written;
	unsigned int records_dropped, packs_deleted;
	unsigned int recovery_kept, recovery_dropped, dek_updates;
	unsigned int recovery_written, blob_keys_written;
	/* casbox_gc_expire(): retained mail and dup records released */
	struct casbox_expire_result expired;

	/* casbox_store_gc_backfill(): what was written, for the caller's
	   rows (NULL: nothing told) */
	const struct casbox_store_backfill_callbacks *backfill_cb;
	void *backfill_context;
	/* census is the caller's (casbox_store_gc_backfill()): not freed */
	bool census_borrowed;
};

/* Test seam for the kill -9 runs (tests/e2e/test_storage_xmsg.py):
   CASBOX_TEST_GC_KILL=copy|copied|switched|unlink kills this process
   with SIGKILL after the first blob copy is appended (not committed),
   after the copies are committed, after the records are switched, or
   after the first pack is deleted. */
static void casbox_gc_crash_point(const char *step)
{
	const char *at = getenv("CASBOX_TEST_GC_KILL");

	if (at != NULL && strcmp(at, step) == 0)
		(void)kill(getpid(), SIGKILL);
}

static const char *casbox_gc_msg_key(const guid_128_t mailbox_guid,
				     uint32_t uid)
{
	return t_strdup_printf("%s:%u", binary_to_hex(mailbox_guid,
						       GUID_128_SIZE), uid);
}

static struct casbox_gc_pack *
casbox_gc_candidate(struct casbox_gc *gc, uint32_t pack_id)
{
	struct casbox_gc_pack *cand;

	array_foreach_modifiable(&gc->candidates, cand) {
		if (cand->pack->pack_id == pack_id)
			return cand;
	}
	return NULL;
}

static void casbox_gc_pick(struct casbox_gc *gc)
{
	unsigned int ratio = gc->set->gc_dead_ratio;
	struct casbox_census_pack *pack;
	struct casbox_gc_pack *cand;

	array_foreach_modifiable(&gc->census->packs, pack) {
		if (pack->dead_bytes == 0 && !gc->all)
			continue;
		if (!gc->all && pack->dead_bytes * 100 < pack->size * ratio)
			continue;
		cand = array_append_space(&gc->candidates);
		cand->pack = pack;
		gc->bytes_before += pack->size;
	}
}

/* New saves and our copies must not go into a pack we will delete:
   if the newest pack is a candidate, start a new one. */
static int casbox_gc_rotate(struct casbox_gc *gc, const char **error_r)
{
	const struct casbox_census_pack *last;

	if (array_count(&gc->census->packs) == 0)
		return 0;
	last = array_back(&gc->census->packs);
	if (casbox_gc_candidate(gc, last->pack_id) == NULL)
		return 0;
	return casbox_store_pack_rotate(gc->store, error_r);
}

static int casbox_gc_txn_commit(struct casbox_gc *gc, const char **error_r)
{
	const char *error;

	if (gc->txn == NULL)
		return 0;
	gc->txn_bytes = 0;
	if (casbox_pack_txn_commit(&gc->txn, &error) < 0) {
		*error_r = t_strdup_printf("pack commit: %s", error);
		return -1;
	}
	return 0;
}

static int casbox_gc_txn_begin(struct casbox_gc *gc, const char **error_r)
{
	const char *error;

	if (gc->txn == NULL &&
	    casbox_pack_txn_begin(gc->packs, &gc->txn, &error) < 0) {
		*error_r = t_strdup_printf("pack append: %s", error);
		return -1;
	}
	return 0;
}

/* gc --all: the packs will hold a DEK for this blob. */
static void casbox_gc_dek_seen(struct casbox_gc *gc,
			       const struct cas_blob_id *id)
{
	struct casbox_census_blob *blob;

	blob = hash_table_lookup(gc->census->blobs, id);
	if (blob != NULL)
		blob->gc_dek_seen = TRUE;
}

static void
casbox_gc_deks_seen(struct casbox_gc *gc,
		    const ARRAY_TYPE(casbox_recovery_blob) *blobs)
{
	const struct casbox_recovery_blob *rblob;

	array_foreach(blobs, rblob)
		casbox_gc_dek_seen(gc, &rblob->id);
}

static int casbox_gc_dek_update(struct casbox_gc *gc,
				const struct cas_blob_id *id,
				uint8_t dek_kind,
				const unsigned char *stored_dek,
				const char **error_r)
{
	const char *error;
	int ret;

	if (casbox_gc_txn_begin(gc, error_r) < 0)
		return -1;
	ret = casbox_pack_txn_add_dek_update_kind(gc->txn, id, dek_kind,
						  stored_dek, &error);
	if (ret < 0) {
		*error_r = t_strdup_printf("pack append: %s", error);
		return -1;
	}
	if (ret > 0)
		gc->dek_updates++;
	casbox_gc_dek_seen(gc, id);
	return 0;
}

static int casbox_gc_copy_blob(struct casbox_gc *gc,
			       struct casbox_census_blob *blob,
			       struct casbox_gc_pack *cand,
			       const char **error_r)
{
	struct casbox_gc_move move;
	struct istream *input;
	const char *error;
	bool verbatim;
	int ret;

	if (blob->damage != NULL) {
		i_warning("casbox gc: %s: keeping pack %u: blob %s: %s",
			  gc->root_dir, cand->pack->pack_id,
			  cas_blob_id_to_hex(&blob->id), blob->damage);
		cand->keep = TRUE;
		return 0;
	}
	if (casbox_gc_txn_begin(gc, error_r) < 0)
		return -1;
	i_zero(&move);
	move.blob = blob;
	/* a delta frame too: its AEAD binds its base's id and prefix,
	   not a location, and re-encoding it would need the base */
	verbatim = !cas_keyring_can_decrypt(gc->keyring) ||
		blob->rec.base_depth > 0;
	if (verbatim) {
		/* password mode without the password: move the frame as
		   it is (CRC-checked, DEK unchanged) */
		ret = casbox_pack_txn_copy_frame(gc->txn, &blob->id,
						 &blob->rec, &move.new_rec,
						 &error);
	} else {
		input = casbox_pack_blob_open(gc->packs, &blob->id,
					      &blob->rec);
		/* the blob stream authenticates every chunk as this
		   blob's: no id to compute again (its epoch's blob-id key
		   may be gone after key rotation) */
		ret = casbox_pack_txn_add_reencode(gc->txn, &blob->id, input,
						   &move.new_rec, &error);
		i_stream_unref(&input);
	}
	if (ret < 0) {
		/* damaged or unreadable: leave it where it is */
		i_warning("casbox gc: %s: keeping pack %u: blob %s: %s",
			  gc->root_dir, cand->pack->pack_id,
			  cas_blob_id_to_hex(&blob->id), error);
		cand->keep = TRUE;
		return 0;
	}
	array_push_back(&gc->moves, &move);
	blob->gc_moved = TRUE;
	casbox_gc_crash_point("copy");
	/* a re-encoded copy has a fresh DEK that no recovery record
	   carries; a verbatim copy keeps the DEK the records have. A
	   delta copied verbatim with the key loaded gets one too: its DEK
	   may be a key rotation's rewrap, whose update the DEK update
	   walk (casbox_gc_dek_frame()) drops for every moved blob. */
	if ((!verbatim || cas_keyring_can_decrypt(gc->keyring)) &&
	    casbox_gc_dek_update(gc, &blob->id, move.new_rec.dek_kind,
				 move.new_rec.stored_dek, error_r) < 0)
		return -1;
	gc->bytes_written += move.new_rec.frame_size;
	gc->txn_bytes += move.new_rec.frame_size;
	if (gc->txn_bytes >= CASBOX_GC_COMMIT_BYTES)
		return casbox_gc_txn_commit(gc, error_r);
	return 0;
}

/* 1 if the message record of rec exists with rec's GUID, 0 if not,
   -1 error. */
static int casbox_gc_msg_live(struct casbox_gc *gc,
			      const guid_128_t mailbox_guid, uint32_t uid,
			      const char *guid, const char **error_r)
{
	struct casbox_msg_record mrec;
	buffer_t *key, *value;
	int ret;

	key = t_buffer_create(32);
	casbox_key_message(key, mailbox_guid, uid);
	value = t_buffer_create(256);
	ret = casbox_lsm_get(gc->lsm, key->data, key->used, value,
			     error_r);
	if (ret <= 0)
		return ret;
	if (casbox_store_msg_value_import(gc->store, key->data, key->used,
					  value->data, value->used,
					  pool_datastack_create(), &mrec,
					  error_r) < 0)
		return -1;
	return strcmp(mrec.guid, guid) == 0 ? 1 : 0;
}

static void
casbox_gc_locator(struct casbox_gc *gc, const guid_128_t mailbox_guid,
		  uint32_t uid, const char *guid,
		  unsigned char locator_r[CASBOX_META_LOCATOR_SIZE])
{
	buffer_t *data = t_buffer_create(64);

	casbox_recovery_locator_data(mailbox_guid, uid, guid, data);
	casbox_pack_meta_locator_make(gc->packs, data->data, data->used,
				      locator_r);
}

/* Add the locator of one message record to map. Returns 0 ok (also
   for a key that is no message key), -1 the record does not parse (as
   casbox_gc_msg_live(): a message gc cannot read must not lose its
   recovery record). */
static int
casbox_gc_locator_add(struct casbox_gc *gc,
		      HASH_TABLE_TYPE(casbox_gc_locators) *map,
		      const unsigned char *key, size_t key_size,
		      const unsigned char *value, size_t value_size,
		      const char **error_r)
{
	unsigned char locator[CASBOX_META_LOCATOR_SIZE];
	struct casbox_msg_record mrec;
	guid_128_t guid;
	uint32_t uid;

	if (casbox_key_message_parse(key, key_size, guid, &uid) <= 0)
		return 0;
	if (casbox_store_msg_value_import(gc->store, key, key_size,
					  value, value_size,
					  pool_datastack_create(), &mrec,
					  error_r) < 0)
		return -1;
	casbox_gc_locator(gc, guid, uid, mrec.guid, locator);
	hash_table_update(*map,
		p_strdup(gc->census->pool,
			 binary_to_hex(locator, sizeof(locator))),
		p_strdup(gc->census->pool, casbox_gc_msg_key(guid, uid)));
	return 0;
}

/* The locator of every message record in the LSM as it is now (password
   mode: what tells gc without the password which records are live).
   Returns 0 ok, -1 error. */
static int
casbox_gc_locators_build(struct casbox_gc *gc,
			 HASH_TABLE_TYPE(casbox_gc_locators) *map,
			 const char **error_r)
{
	unsigned char prefix = CASBOX_KEY_MESSAGE;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	const char *error;
	int ret = 0;

	iter = casbox_lsm_iter_init(gc->lsm, &prefix, 1);
	while (ret == 0 && casbox_lsm_iter_next(iter, &key, &key_size,
						&value, &value_size)) T_BEGIN {
		ret = casbox_gc_locator_add(gc, map, key, key_size, value,
					    value_size, error_r);
	} T_END_PASS_STR_IF(ret < 0, error_r);
	if (casbox_lsm_iter_deinit(&iter, &error) < 0 && ret == 0) {
		*error_r = error;
		ret = -1;
	}
	return ret;
}

/* The live message (key as casbox_gc_msg_key()) whose recovery record
   has this locator, or NULL; the map of every live message's locator
   is built at the first call. Returns 0 ok, -1 error. */
static int
casbox_gc_locator_msg(struct casbox_gc *gc,
		      const unsigned char locator[CASBOX_META_LOCATOR_SIZE],
		      const char **msg_key_r, const char **error_r)
{
	if (!hash_table_is_created(gc->locators)) {
		hash_table_create(&gc->locators, gc->census->pool, 0,
				  str_hash, strcmp);
		if (casbox_gc_locators_build(gc, &gc->locators, error_r) < 0)
			return -1;
	}
	*msg_key_r = hash_table_lookup(gc->locators,
		binary_to_hex(locator, CASBOX_META_LOCATOR_SIZE));
	return 0;
}

/* A meta frame carried forward as it was sealed (re-sealed on the way
   after a key rotation, casbox_pack_txn_add_meta_sealed()). Returns 0
   ok, -1 error. */
static int casbox_gc_keep_sealed(struct casbox_gc *gc,
				 enum casbox_meta_kind kind,
				 const buffer_t *sealed, const char **error_r)
{
	const char *error;

	if (casbox_gc_txn_begin(gc, error_r) < 0)
		return -1;
	if (casbox_pack_txn_add_meta_sealed(gc->txn, kind, sealed->data,
					    sealed->used, &error) < 0) {
		*error_r = t_strdup_printf("pack append: %s", error);
		return -1;
	}
	return 0;
}

static void casbox_gc_drop_msg(struct casbox_gc *gc,
			       struct casbox_gc_pack *cand,
			       const guid_128_t mailbox_guid, uint32_t uid,
			       const char *guid)
{
	struct casbox_gc_dropped *drop;

	drop = array_append_space(&gc->dropped);
	guid_128_copy(drop->mailbox_guid, mailbox_guid);
	drop->uid = uid;
	drop->guid = p_strdup(gc->census->pool, guid);
	drop->cand = cand;
	gc->recovery_dropped++;
}

/* A dropped recovery record's blobs that are still live (other
   messages use them: copies, whose copy records carry no DEK,
   redeliveries, a shared attachment, a delta's base) keep their DEK
   and plain size in the packs as blob keys. Server key mode only: a
   password-mode copy has a recovery record of its own.
   Returns 1 ok, -1 error. */
static int
casbox_gc_blob_keys_write(struct casbox_gc *gc,
			  const ARRAY_TYPE(casbox_recovery_blob) *blobs,
			  const char **error_r)
{
	struct casbox_blob_keys bkeys;
	const struct casbox_recovery_blob *rblob;
	struct casbox_census_blob *blob;
	const char *error;
	buffer_t *plain;
	int ret;

	if (cas_keyring_get_userkey(gc->keyring) != NULL)
		return 1;
	i_zero(&bkeys);
	t_array_init(&bkeys.blobs, array_count(blobs));
	array_foreach(blobs, rblob) {
		blob = hash_table_lookup(gc->census->blobs, &rblob->id);
		if (blob != NULL && casbox_census_blob_is_live(blob) &&
		    rblob->dek_kind == CAS_DEK_KIND_SERVER_WRAP)
			array_push_back(&bkeys.blobs, rblob);
	}
	if (array_count(&bkeys.blobs) == 0)
		return 1;
	bkeys.written_usecs = casbox_meta_now_usecs();
	plain = t_buffer_create(64 + array_count(&bkeys.blobs) * 128);
	casbox_blob_keys_export(&bkeys, plain);
	if (casbox_gc_txn_begin(gc, error_r) < 0)
		return -1;
	ret = casbox_pack_txn_add_meta(gc->txn, CASBOX_META_KIND_BLOB_KEYS,
				       plain->data, plain->used, &error);
	safe_memset(buffer_get_modifiable_data(plain, NULL), 0, plain->used);
	if (ret < 0) {
		*error_r = t_strdup_printf("pack append: %s", error);
		return -1;
	}
	gc->blob_keys_written++;
	casbox_gc_deks_seen(gc, &bkeys.blobs);
	if (gc->backfill_cb != NULL) {
		array_foreach(&bkeys.blobs, rblob) {
			gc->backfill_cb->blob_keys_written(
				gc->backfill_context, &rblob->id);
		}
	}
	return 1;
}

static int casbox_gc_recovery(struct casbox_gc *gc,
			      struct casbox_gc_pack *cand,
			      const buffer_t *sealed, const buffer_t *plain,
			      const char **error_r)
{
	struct casbox_recovery_record rrec;
	int ret;

	if (casbox_recovery_record_import(plain->data, plain->used,
					  pool_datastack_create(), &rrec,
					  error_r) < 0)
		return 0;
	ret = casbox_gc_msg_live(gc, rrec.mailbox_guid, rrec.uid,
				 rrec.msg.guid, error_r);
	if (ret < 0)
		return -1;
	if (ret > 0) {
		if (casbox_gc_keep_sealed(gc, CASBOX_META_KIND_RECOVERY, sealed,
						  error_r) < 0)
			return -1;
		gc->recovery_kept++;
		casbox_gc_deks_seen(gc, &rrec.blobs);
		if (gc->all) {
			char *key = p_strdup(gc->census->pool,
				casbox_gc_msg_key(rrec.mailbox_guid,
						  rrec.uid));
			hash_table_update(gc->covered, key, key);
		}
		return 1;
	}
	casbox_gc_drop_msg(gc, cand, rrec.mailbox_guid, rrec.uid,
			   rrec.msg.guid);
	return casbox_gc_blob_keys_write(gc, &rrec.blobs, error_r);
}

/* A copy record: kept as it is while all its messages live, written
   again with the live ones when some are gone, dropped with the last.
   Returns 1 handled, 0 unreadable (keep the pack), -1 error. */
static int casbox_gc_copy_frame(struct casbox_gc *gc,
				struct casbox_gc_pack *cand,
				const buffer_t *sealed, const buffer_t *plain,
				const char **error_r)
{
	struct casbox_copy_record crec;
	const struct casbox_copy_entry *entry;
	const char *error;
	buffer_t *body, *out;
	unsigned int live = 0, count;
	int ret;

	if (casbox_copy_record_import(plain->data, plain->used,
				      pool_datastack_create(), &crec,
				      error_r) < 0)
		return 0;
	body = t_buffer_create(plain->used);
	casbox_copy_record_body_init(body);
	array_foreach(&crec.entries, entry) {
		ret = casbox_gc_msg_live(gc, crec.mailbox_guid, entry->uid,
					 entry->msg.guid, error_r);
		if (ret < 0)
			return -1;
		if (ret == 0) {
			casbox_gc_drop_msg(gc, cand, crec.mailbox_guid,
					   entry->uid, entry->msg.guid);
			continue;
		}
		live++;
		casbox_copy_record_body_add(body, entry->uid, &entry->msg);
		if (gc->all) {
			char *key = p_strdup(gc->census->pool,
				casbox_gc_msg_key(crec.mailbox_guid,
						  entry->uid));
			hash_table_update(gc->covered, key, key);
		}
	}
	count = array_count(&crec.entries);
	gc->recovery_kept += live;
	if (live == count)
		ret = casbox_gc_keep_sealed(gc, CASBOX_META_KIND_COPY, sealed,
					    error_r);
	else if (live == 0)
		ret = 0;
	else if ((ret = casbox_gc_txn_begin(gc, error_r)) == 0) {
		/* the same record with fewer entries (written time kept:
		   the newest record of a UID still wins a rebuild) */
		out = t_buffer_create(body->used / 2 + 256);
		casbox_copy_record_export(&crec, body, out);
		if (casbox_pack_txn_add_meta(gc->txn, CASBOX_META_KIND_COPY,
					     out->data, out->used,
					     &error) < 0) {
			*error_r = t_strdup_printf("pack append: %s", error);
			ret = -1;
		}
		safe_memset(buffer_get_modifiable_data(out, NULL), 0,
			    out->used);
	}
	safe_memset(buffer_get_modifiable_data(body, NULL), 0, body->used);
	return ret < 0 ? -1 : 1;
}

/* Blob keys: kept while one of their blobs is live. */
static int casbox_gc_blob_keys_frame(struct casbox_gc *gc,
				     const buffer_t *sealed,
				     const buffer_t *plain,
				     const char **error_r)
{
	struct casbox_blob_keys bkeys;
	const struct casbox_recovery_blob *rblob;
	struct casbox_census_blob *blob;
	bool live = FALSE;

	if (casbox_blob_keys_import(plain->data, plain->used,
				    pool_datastack_create(), &bkeys,
				    error_r) < 0)
		return 0;
	array_foreach(&bkeys.blobs, rblob) {
		blob = hash_table_lookup(gc->census->blobs, &rblob->id);
		live = live || (blob != NULL &&
				casbox_census_blob_is_live(blob));
	}
	if (!live)
		return 1;
	if (casbox_gc_keep_sealed(gc, CASBOX_META_KIND_BLOB_KEYS, sealed,
					  error_r) < 0)
		return -1;
	casbox_gc_deks_seen(gc, &bkeys.blobs);
	return 1;
}

static int casbox_gc_dek_frame(struct casbox_gc *gc, const buffer_t *sealed,
			       const buffer_t *plain, const char **error_r)
{
	struct casbox_dek_update upd;
	struct casbox_census_blob *blob;

	if (casbox_dek_update_import(plain->data, plain->used, &upd,
				     error_r) < 0)
		return 0;
	blob = hash_table_lookup(gc->census->blobs, &upd.id);
	/* a moved blob got a new update; a dead one needs none */
	if (blob == NULL || !casbox_census_blob_is_live(blob) ||
	    blob->gc_moved)
		return 1;
	if (casbox_gc_keep_sealed(gc, CASBOX_META_KIND_DEK_UPDATE, sealed,
					  error_r) < 0)
		return -1;
	casbox_gc_dek_seen(gc, &upd.id);
	return 1;
}

/* A mailbox record is kept while its mailbox has an 'M' record; a
   deletion marker always (it is small, and it keeps a rebuild from
   bringing back the mailbox's mail from records in other packs). */
static int casbox_gc_mailbox_frame(struct casbox_gc *gc,
				   const buffer_t *sealed,
				   const buffer_t *plain,
				   const char **error_r)
{
	struct casbox_recovery_mailbox rec;
	buffer_t *key, *value;
	int ret;

	if (casbox_recovery_mailbox_import(plain->data, plain->used,
					   pool_datastack_create(), &rec,
					   error_r) < 0)
		return 0;
	if (!rec.deleted) {
		key = t_buffer_create(32);
		casbox_key_mailbox(key, rec.mailbox_guid);
		value = t_buffer_create(128);
		ret = casbox_lsm_get(gc->lsm, key->data, key->used,
				     value, error_r);
		if (ret < 0)
			return -1;
		if (ret == 0)
			return 1;
	}
	if (casbox_gc_keep_sealed(gc, CASBOX_META_KIND_MAILBOX, sealed,
					  error_r) < 0)
		return -1;
	return 1;
}

/* Password mode without the password (what doveadm has): the records
   are sealed to the user key and cannot be opened. gc checks each one's
   MAC; a recovery record's locator (authenticated by that MAC) says
   whether its message is live (casbox_gc_locators_build()): live ones
   are carried forward verbatim, dead ones dropped. Mailbox records and
   DEK updates, which have no locator, are all carried forward. */
static bool casbox_gc_can_open_meta(struct casbox_gc *gc)
{
	return cas_keyring_can_decrypt(gc->keyring);
}

static int casbox_gc_meta_keep_sealed(struct casbox_gc *gc,
				      struct casbox_gc_pack *cand,
				      enum casbox_meta_kind kind,
				      const buffer_t *sealed,
				      const char **error_r)
{
	unsigned char locator[CASBOX_META_LOCATOR_SIZE];
	struct casbox_gc_dropped *drop;
	const char *msg_key;

	if (casbox_pack_meta_verify(gc->packs, kind, sealed->data,
				    sealed->used, error_r) < 0)
		return 0;
	if (kind == CASBOX_META_KIND_RECOVERY &&
	    casbox_pack_meta_locator(gc->packs, sealed->data,
				     sealed->used, locator) > 0) {
		/* the locator is authenticated: it is in the AAD */
		if (casbox_gc_locator_msg(gc, locator, &msg_key, error_r) < 0)
			return -1;
		if (msg_key == NULL) {
			drop = array_append_space(&gc->dropped);
			memcpy(drop->locator, locator, sizeof(locator));
			drop->cand = cand;
			gc->recovery_dropped++;
			return 1;
		}
		if (gc->all) {
			char *key = p_strdup(gc->census->pool, msg_key);
			hash_table_update(gc->covered, key, key);
		}
	}
	if (casbox_gc_keep_sealed(gc, kind, sealed, error_r) < 0)
		return -1;
	if (kind == CASBOX_META_KIND_RECOVERY)
		gc->recovery_kept++;
	return 1;
}

/* Returns 1 handled, 0 could not be read (keep the pack), -1 error. */
static int casbox_gc_meta(struct casbox_gc *gc,
			  const struct casbox_census_meta *meta,
			  struct casbox_gc_pack *cand, const char **error_r)
{
	struct casbox_pack_store *packs = gc->packs;
	enum casbox_meta_kind kind;
	buffer_t *sealed, *plain;
	const char *error;
	int ret;

	sealed = t_buffer_create(512);
	plain = t_buffer_create(512);
	if (casbox_pack_meta_read(packs, meta->pack_id, meta->offset, &kind,
				  sealed, &error) < 0)
		ret = 0;
	else if (!casbox_gc_can_open_meta(gc))
		ret = casbox_gc_meta_keep_sealed(gc, cand, kind, sealed,
						 &error);
	else if (casbox_pack_meta_open(packs, kind, sealed->data,
				       sealed->used, plain, &error) < 0)
		ret = 0;
	else if (kind == CASBOX_META_KIND_RECOVERY)
		ret = casbox_gc_recovery(gc, cand, sealed, plain, &error);
	else if (kind == CASBOX_META_KIND_MAILBOX)
		ret = casbox_gc_mailbox_frame(gc, sealed, plain, &error);
	else if (kind == CASBOX_META_KIND_COPY)
		ret = casbox_gc_copy_frame(gc, cand, sealed, plain, &error);
	else if (kind == CASBOX_META_KIND_BLOB_KEYS)
		ret = casbox_gc_blob_keys_frame(gc, sealed, plain, &error);
	else
		ret = casbox_gc_dek_frame(gc, sealed, plain, &error);
	if (plain->used > 0) {
		safe_memset(buffer_get_modifiable_data(plain, NULL), 0,
			    plain->used);
	}
	if (ret == 0) {
		i_warning("casbox gc: %s: keeping pack %u: meta frame at "
			  "offset %"PRIu64": %s", gc->root_dir,
			  meta->pack_id, meta->offset, error);
		cand->keep = TRUE;
	} else if (ret < 0)
		*error_r = error;
	return ret;
}

static int casbox_gc_copy_metas(struct casbox_gc *gc, const char **error_r)
{
	const struct casbox_census_meta *meta;
	struct casbox_gc_pack *cand;
	int ret = 0;

	array_foreach(&gc->census->metas, meta) {
		cand = casbox_gc_candidate(gc, meta->pack_id);
		if (cand == NULL)
			continue;
		T_BEGIN {
			ret = casbox_gc_meta(gc, meta, cand, error_r);
		} T_END_PASS_STR_IF(ret < 0, error_r);
		if (ret < 0)
			return -1;
	}
	return 0;
}

/* A recovery record for a live message that has none (saved before
   recovery records, or its record was damaged), from its LSM records.
   Returns 1 written, 0 not possible (a blob record is missing: scrub
   names it), -1 error. */
static int casbox_gc_backfill_msg(struct casbox_gc *gc,
				  const guid_128_t mailbox_guid, uint32_t uid,
				  const unsigned char *mkey, size_t mkey_size,
				  const unsigned char *value, size_t value_size,
				  const char **error_r)
{
	struct casbox_recovery_record rrec;
	struct casbox_mailbox_record mrec;
	struct casbox_recovery_blob *rblob;
	unsigned char locator[CASBOX_META_LOCATOR_SIZE];
	const struct casbox_msg_part *part;
	const struct casbox_recovery_blob *seen;
	struct casbox_census_blob *blob;
	buffer_t *key, *mvalue, *plain;
	const char *error;
	bool dup;
	int ret;

	i_zero(&rrec);
	if (casbox_store_msg_value_import(gc->store, mkey, mkey_size,
					  value, value_size,
					  pool_datastack_create(), &rrec.msg,
					  error_r) < 0)
		return 0;
	/* as casbox_store_txn_add_recovery(): derived data left out */
	rrec.msg.sealed_meta = NULL;
	rrec.msg.sealed_meta_size = 0;
	/* nor a reference to the LSM's shared metadata record, which a
	   rebuild from the packs does not have */
	rrec.msg.meta_ref = FALSE;
	key = t_buffer_create(32);
	casbox_key_mailbox(key, mailbox_guid);
	mvalue = t_buffer_create(128);
	ret = casbox_lsm_get(gc->lsm, key->data, key->used, mvalue,
			     error_r);
	if (ret <= 0)
		return ret;
	if (casbox_mailbox_record_import(mvalue->data, mvalue->used,
					 pool_datastack_create(), &mrec,
					 error_r) < 0)
		return 0;
	t_array_init(&rrec.blobs, array_count(&rrec.msg.parts) + 1);
	array_foreach(&rrec.msg.parts, part) {
		blob = hash_table_lookup(gc->census->blobs, &part->id);
		if (blob == NULL || !blob->have_record || blob->record_bad)
			return 0;
		dup = FALSE;
		array_foreach(&rrec.blobs, seen)
			dup = dup || memcmp(seen->id.id, part->id.id,
					    CAS_BLOB_ID_SIZE) == 0;
		if (dup)
			continue;
		rblob = array_append_space(&rrec.blobs);
		rblob->id = part->id;
		rblob->dict_id = blob->rec.dict_id;
		rblob->plain_size = blob->rec.plain_size;
		rblob->dek_kind = blob->rec.dek_kind;
		memcpy(rblob->stored_dek, blob->rec.stored_dek,
		       cas_dek_kind_size(blob->rec.dek_kind));
	}
	rrec.written_usecs = casbox_meta_now_usecs();
	guid_128_copy(rrec.mailbox_guid, mailbox_guid);
	guid_128_copy(rrec.public_guid, mrec.guid);
	rrec.uid_validity = mrec.uid_validity;
	rrec.uid = uid;
	rrec.next_uid = I_MAX(mrec.next_uid, uid + 1);
	rrec.highest_modseq = mrec.highest_modseq;
	rrec.mailbox_name = mrec.name;
	plain = t_buffer_create(512);
	casbox_recovery_record_export(&rrec, plain);
	casbox_gc_locator(gc, mailbox_guid, uid, rrec.msg.guid, locator);
	if (casbox_gc_txn_begin(gc, error_r) < 0)
		return -1;
	ret = casbox_pack_txn_add_meta_locator(gc->txn,
		CASBOX_META_KIND_RECOVERY, locator, plain->data, plain->used,
		&error);
	safe_memset(buffer_get_modifiable_data(plain, NULL), 0, plain->used);
	if (ret < 0) {
		*error_r = t_strdup_printf("pack append: %s", error);
		return -1;
	}
	gc->recovery_written++;
	casbox_gc_deks_seen(gc, &rrec.blobs);
	if (gc->backfill_cb != NULL) {
		gc->backfill_cb->recovery_written(gc->backfill_context,
						  mailbox_guid, uid);
	}
	return 1;
}

/* --all, server key mode: blob keys for every live blob that no record
   gc kept or wrote has a DEK for (its message's recovery record was
   damaged, or dropped by a build before blob keys, and copies use the
   blob), from its LSM record, so that a rebuild from the packs opens
   every live blob. Returns 0 ok, -1 error. */
static int casbox_gc_backfill_deks(struct casbox_gc *gc, const char **error_r)
{
	struct casbox_census_blob *blob;
	struct casbox_recovery_blob *rblob;
	ARRAY_TYPE(casbox_recovery_blob) blobs;
	unsigned int i, count;
	int ret = 0;

	if (cas_keyring_get_userkey(gc->keyring) != NULL)
		return 0;
	t_array_init(&blobs, 64);
	count = array_count(&gc->census->blob_list);
	for (i = 0; i <= count && ret >= 0; i++) {
		if (i < count) {
			blob = array_idx_elem(&gc->census->blob_list, i);
			if (blob->gc_dek_seen || !blob->have_record ||
			    blob->record_bad ||
			    !casbox_census_blob_is_live(blob) ||
			    blob->rec.dek_kind != CAS_DEK_KIND_SERVER_WRAP)
				continue;
			rblob = array_append_space(&blobs);
			rblob->id = blob->id;
			rblob->dict_id = blob->rec.dict_id;
			rblob->plain_size = blob->rec.plain_size;
			rblob->dek_kind = blob->rec.dek_kind;
			memcpy(rblob->wrapped_dek, blob->rec.stored_dek,
			       CAS_WRAPPED_DEK_SIZE);
			/* the census marks it live: written below */
			blob->gc_dek_seen = TRUE;
		}
		if (array_count(&blobs) == 0 ||
		    (i < count && array_count(&blobs) < 4096))
			continue;
		ret = casbox_gc_blob_keys_write(gc, &blobs, error_r);
		array_clear(&blobs);
	}
	return ret < 0 ? -1 : 0;
}

/* --all saw every recovery record: give each live message that has none
   a new one, so a rebuild from the packs finds all of them. */
static int casbox_gc_backfill(struct casbox_gc *gc, const char **error_r)
{
	unsigned char prefix = CASBOX_KEY_MESSAGE;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	const char *error;
	guid_128_t guid;
	uint32_t uid;
	int ret = 0;

	iter = casbox_lsm_iter_init(gc->lsm, &prefix, 1);
	while (ret >= 0 && casbox_lsm_iter_next(iter, &key, &key_size,
						&value, &value_size)) T_BEGIN {
		if (casbox_key_message_parse(key, key_size, guid, &uid) > 0 &&
		    hash_table_lookup(gc->covered,
				      casbox_gc_msg_key(guid, uid)) == NULL) {
			ret = casbox_gc_backfill_msg(gc, guid, uid,
						     key, key_size, value,
						     value_size, error_r);
		}
	} T_END_PASS_STR_IF(ret < 0, error_r);
	if (casbox_lsm_iter_deinit(&iter, &error) < 0 && ret >= 0) {
		*error_r = error;
		ret = -1;
	}
	return ret < 0 ? -1 : 0;
}

/* casbox_store_gc_backfill(): the packs hold the blob's current DEK
   (the one its LSM record has: an older record may hold the DEK of a
   frame gc has since re-encoded, whose DEK update could be the damaged
   frame). */
static void casbox_gc_scan_dek(struct casbox_gc *gc,
			       const struct cas_blob_id *id, uint8_t dek_kind,
			       const unsigned char *stored_dek)
{
	struct casbox_census_blob *blob;

	blob = hash_table_lookup(gc->census->blobs, id);
	if (blob != NULL && blob->have_record && !blob->record_bad &&
	    blob->rec.dek_kind == dek_kind &&
	    memcmp(blob->rec.stored_dek, stored_dek,
		   cas_dek_kind_size(dek_kind)) == 0)
		blob->gc_dek_seen = TRUE;
}

static void
casbox_gc_scan_deks(struct casbox_gc *gc,
		    const ARRAY_TYPE(casbox_recovery_blob) *blobs)
{
	const struct casbox_recovery_blob *rblob;

	array_foreach(blobs, rblob) {
		casbox_gc_scan_dek(gc, &rblob->id, rblob->dek_kind,
				   rblob->stored_dek);
	}
}

static void casbox_gc_cover(struct casbox_gc *gc,
			    const guid_128_t mailbox_guid, uint32_t uid)
{
	char *key = p_strdup(gc->census->pool,
			     casbox_gc_msg_key(mailbox_guid, uid));

	hash_table_update(gc->covered, key, key);
}

/* casbox_store_gc_backfill(), a meta frame that could be opened: mark
   the live messages it covers and the current DEKs it holds. Nothing
   is copied or dropped: a record of a message that is gone still
   counts for its DEKs (a rebuild takes DEKs from every meta record). */
static int casbox_gc_scan_plain(struct casbox_gc *gc,
				enum casbox_meta_kind kind,
				const buffer_t *plain, const char **error_r)
{
	pool_t pool = pool_datastack_create();
	struct casbox_recovery_record rrec;
	struct casbox_copy_record crec;
	const struct casbox_copy_entry *entry;
	struct casbox_blob_keys bkeys;
	struct casbox_dek_update upd;
	const char *error;
	int ret;

	switch (kind) {
	case CASBOX_META_KIND_RECOVERY:
		if (casbox_recovery_record_import(plain->data, plain->used,
						  pool, &rrec, &error) < 0)
			return 0;
		casbox_gc_scan_deks(gc, &rrec.blobs);
		ret = casbox_gc_msg_live(gc, rrec.mailbox_guid, rrec.uid,
					 rrec.msg.guid, error_r);
		if (ret > 0)
			casbox_gc_cover(gc, rrec.mailbox_guid, rrec.uid);
		return ret < 0 ? -1 : 0;
	case CASBOX_META_KIND_COPY:
		if (casbox_copy_record_import(plain->data, plain->used, pool,
					      &crec, &error) < 0)
			return 0;
		array_foreach(&crec.entries, entry) {
			ret = casbox_gc_msg_live(gc, crec.mailbox_guid,
						 entry->uid, entry->msg.guid,
						 error_r);
			if (ret < 0)
				return -1;
			if (ret > 0)
				casbox_gc_cover(gc, crec.mailbox_guid,
						entry->uid);
		}
		return 0;
	case CASBOX_META_KIND_BLOB_KEYS:
		if (casbox_blob_keys_import(plain->data, plain->used, pool,
					    &bkeys, &error) > 0)
			casbox_gc_scan_deks(gc, &bkeys.blobs);
		return 0;
	case CASBOX_META_KIND_DEK_UPDATE:
		if (casbox_dek_update_import(plain->data, plain->used, &upd,
					     &error) > 0) {
			casbox_gc_scan_dek(gc, &upd.id, upd.dek_kind,
					   upd.stored_dek);
		}
		return 0;
	default:
		return 0;
	}
}

/* casbox_store_gc_backfill(), one meta frame. Password mode without the
   password: a recovery record's authenticated locator says which live
   message it covers (its DEKs are sealed, and password mode needs no
   blob keys). A frame that does not read or open covers nothing (scrub
   reports it). Returns 0 ok, -1 error. */
static int casbox_gc_scan_meta(struct casbox_gc *gc,
			       const struct casbox_census_meta *meta,
			       const char **error_r)
{
	unsigned char locator[CASBOX_META_LOCATOR_SIZE];
	enum casbox_meta_kind kind;
	buffer_t *sealed, *plain;
	const char *error, *msg_key;
	int ret = 0;

	sealed = t_buffer_create(512);
	if (casbox_pack_meta_read(gc->packs, meta->pack_id, meta->offset,
				  &kind, sealed, &error) < 0)
		return 0;
	if (!casbox_gc_can_open_meta(gc)) {
		if (kind != CASBOX_META_KIND_RECOVERY ||
		    casbox_pack_meta_verify(gc->packs, kind, sealed->data,
					    sealed->used, &error) < 0 ||
		    casbox_pack_meta_locator(gc->packs, sealed->data,
					     sealed->used, locator) <= 0)
			return 0;
		if (casbox_gc_locator_msg(gc, locator, &msg_key, error_r) < 0)
			return -1;
		if (msg_key != NULL) {
			char *key = p_strdup(gc->census->pool, msg_key);
			hash_table_update(gc->covered, key, key);
		}
		return 0;
	}
	plain = t_buffer_create(512);
	if (casbox_pack_meta_open(gc->packs, kind, sealed->data, sealed->used,
				  plain, &error) >= 0)
		ret = casbox_gc_scan_plain(gc, kind, plain, error_r);
	if (plain->used > 0) {
		safe_memset(buffer_get_modifiable_data(plain, NULL), 0,
			    plain->used);
	}
	return ret;
}

static int casbox_gc_copy(struct casbox_gc *gc, const char **error_r)
{
	struct casbox_census_blob *blob;
	struct casbox_gc_pack *cand;
	unsigned int i = 0, count = array_count(&gc->census->blob_list);
	int ret = 0;

	array_foreach_elem(&gc->census->blob_list, blob) {
		casbox_admin_progress("gc: copying live blobs", ++i, count);
		if (!blob->have_record || blob->record_bad ||
		    !casbox_census_blob_is_live(blob))
			continue;
		cand = casbox_gc_candidate(gc, blob->rec.pack_id);
		if (cand == NULL)
			continue;
		T_BEGIN {
			ret = casbox_gc_copy_blob(gc, blob, cand, error_r);
		} T_END_PASS_STR_IF(ret < 0, error_r);
		if (ret < 0)
			break;
	}
	casbox_admin_progress_end();
	if (ret == 0)
		ret = casbox_gc_copy_metas(gc, error_r);
	if (ret == 0 && gc->all)
		ret = casbox_gc_backfill(gc, error_r);
	if (ret == 0 && gc->all)
		ret = casbox_gc_backfill_deks(gc, error_r);
	if (ret == 0)
		ret = casbox_gc_txn_commit(gc, error_r);
	if (gc->txn != NULL)
		casbox_pack_txn_rollback(&gc->txn);
	return ret;
}

static void casbox_gc_put_blob(struct casbox_lsm_batch *batch,
			       const struct cas_blob_id *id,
			       uint32_t refcount,
			       const struct casbox_blob_record *rec)
{
	struct casbox_blob_value bval;
	buffer_t *key, *value, *prec;

	key = t_buffer_create(40);
	casbox_key_blob(key, id);
	prec = t_buffer_create(CASBOX_BLOB_RECORD_EXPORT_SIZE);
	casbox_blob_record_export(rec, prec);
	i_zero(&bval);
	bval.refcount = refcount;
	bval.pack_record = prec->data;
	bval.pack_record_size = prec->used;
	value = t_buffer_create(128);
	casbox_blob_value_export(&bval, value);
	casbox_lsm_batch_put(batch, key->data, key->used,
			     value->data, value->used);
}

/* Under the write lock, password mode without the password: records
   dropped by their locator are checked against the locators of the
   messages as they are now (one pass over the message records); on an
   error every pack with a dropped record is kept. */
static void casbox_gc_switch_locators(struct casbox_gc *gc)
{
	HASH_TABLE_TYPE(casbox_gc_locators) now;
	const struct casbox_gc_dropped *drop;
	const char *error;
	bool any = FALSE, failed;

	array_foreach(&gc->dropped, drop)
		any = any || drop->guid == NULL;
	if (!any)
		return;
	hash_table_create(&now, gc->census->pool, 0, str_hash, strcmp);
	failed = casbox_gc_locators_build(gc, &now, &error) < 0;
	array_foreach(&gc->dropped, drop) {
		if (drop->guid == NULL && (failed ||
		    hash_table_lookup(now, binary_to_hex(drop->locator,
			sizeof(drop->locator))) != NULL))
			drop->cand->keep = TRUE;
	}
	hash_table_destroy(&now);
}

/* Under the write lock: fresh is the LSM as it is now. */
static void casbox_gc_switch(struct casbox_gc *gc,
			     struct casbox_lsm_batch *batch,
			     struct casbox_census *fresh)
{
	struct casbox_census_blob *blob;
	const struct casbox_gc_move *move;
	const struct casbox_gc_dropped *drop;
	struct casbox_gc_pack *cand;
	const char *error;
	buffer_t *key;

	/* a save whose LSM batch was not committed when step 1 looked:
	   its recovery record stays, with its pack */
	array_foreach(&gc->dropped, drop) T_BEGIN {
		/* (by locator: casbox_gc_switch_locators()) */
		if (drop->guid != NULL && !drop->cand->keep &&
		    casbox_gc_msg_live(gc, drop->mailbox_guid, drop->uid,
				       drop->guid, &error) != 0)
			drop->cand->keep = TRUE;
	} T_END;
	casbox_gc_switch_locators(gc);

	array_foreach(&gc->moves, move) T_BEGIN {
		blob = hash_table_lookup(fresh->blobs, &move->blob->id);
		/* only if it still points at the frame we copied */
		if (blob != NULL && blob->have_record && !blob->record_bad &&
		    casbox_census_blob_is_live(blob) &&
		    blob->rec.pack_id == move->blob->rec.pack_id &&
		    blob->rec.offset == move->blob->rec.offset) {
			casbox_gc_put_blob(batch, &blob->id, blob->refcount,
					   &move->new_rec);
			blob->rec = move->new_rec;
		}
	} T_END;
	key = t_buffer_create(40);
	array_foreach_elem(&fresh->blob_list, blob) {
		if (!blob->have_record || blob->record_bad)
			continue;
		if (!casbox_census_blob_is_live(blob)) {
			buffer_set_used_size(key, 0);
			casbox_key_blob(key, &blob->id);
			casbox_lsm_batch_delete(batch, key->data, key->used);
			gc->records_dropped++;
			continue;
		}
		/* a live record still in a candidate (e.g. saved since
		   the census): that pack stays */
		cand = casbox_gc_candidate(gc, blob->rec.pack_id);
		if (cand != NULL)
			cand->keep = TRUE;
	}
}

/* Under the write lock: the copies were wrapped with the key ring as it
   was when gc started. If key rotation began since, wrap them with its
   new slot, so its last step (which drops the old slot once no record
   uses it, under this lock) never strands them. The DEK updates step 1
   wrote carry the old wrap, so each rewrapped copy gets another one,
   committed to the packs before the LSM batch (as key rotation does):
   after the rotation drops the old slot, rebuild --from-packs still
   opens the copy. The pack lock is taken after the LSM lock here, the
   order saves and key rotation use. */
static int casbox_gc_rewrap_moves(struct casbox_gc *gc, const char **error_r)
{
	struct casbox_gc_move *move;
	unsigned char wrapped[CAS_WRAPPED_DEK_SIZE];
	uint32_t current;
	const char *error;
	int ret = 0;

	i_assert(gc->txn == NULL);
	if (casbox_store_refresh_keys(gc->store, error_r) < 0)
		return -1;
	current = cas_keyring_wrap_key_id(gc->keyring);
	array_foreach_modifiable(&gc->moves, move) {
		/* sealed DEKs (password mode) have no wrap key to follow */
		if (move->new_rec.dek_kind != CAS_DEK_KIND_SERVER_WRAP ||
		    cas_dek_wrapped_key_id(move->new_rec.wrapped_dek) ==
		    current)
			continue;
		if (cas_dek_rewrap(gc->keyring, gc->keyring,
				   &move->blob->id, move->new_rec.wrapped_dek,
				   wrapped, &error) < 0) {
			*error_r = t_strdup_printf("blob %s: %s",
				cas_blob_id_to_hex(&move->blob->id), error);
			ret = -1;
			break;
		}
		if (casbox_gc_dek_update(gc, &move->blob->id,
					 CAS_DEK_KIND_SERVER_WRAP, wrapped,
					 error_r) < 0) {
			ret = -1;
			break;
		}
		memcpy(move->new_rec.wrapped_dek, wrapped, sizeof(wrapped));
	}
	if (ret == 0)
		ret = casbox_gc_txn_commit(gc, error_r);
	if (gc->txn != NULL)
		casbox_pack_txn_rollback(&gc->txn);
	return ret;
}

static int casbox_gc_commit(struct casbox_gc *gc, const char **error_r)
{
	struct casbox_lsm_batch *batch;
	struct casbox_census *fresh;

	if (casbox_lsm_batch_begin(gc->lsm, &batch, error_r) < 0)
		return -1;
	if (casbox_gc_rewrap_moves(gc, error_r) < 0) {
		casbox_lsm_batch_rollback(&batch);
		return -1;
	}
	if (casbox_census_build(gc->store, NULL, NULL, &fresh,
				error_r) < 0) {
		casbox_lsm_batch_rollback(&batch);
		return -1;
	}
	casbox_gc_switch(gc, batch, fresh);
	casbox_census_free(&fresh);
	return casbox_lsm_batch_commit(&batch, error_r) < 0 ? -1 : 0;
}

static int casbox_gc_unlink(struct casbox_gc *gc, const char **error_r)
{
	const char *dir = t_strconcat(gc->root_dir, "/packs", NULL);
	const struct casbox_gc_pack *cand;

	array_foreach(&gc->candidates, cand) {
		if (cand->keep)
			continue;
		/* local file, or the object and stub of an uploaded pack */
		if (casbox_pack_store_delete_pack(gc->packs,
				cand->pack->pack_id, error_r) < 0)
			return -1;
		gc->packs_deleted++;
		casbox_gc_crash_point("unlink");
	}
	if (gc->packs_deleted == 0 || !casbox_store_get_fsync(gc->store))
		return 0;
	return cas_durable_fsync_dir(NULL, dir, error_r);
}

/* Release retained mail past casbox_expunge_retention and dup records
   past casbox_duplicate_window first: the blobs of the released mail
   are dead for the census that follows, so this run reclaims them. */
static int casbox_gc_expire(struct casbox_gc *gc, const char **error_r)
{
	const struct casbox_settings *set =
		casbox_store_get_settings(gc->store);

	return casbox_store_safety_expire(gc->store, ioloop_time,
					  set->expunge_retention,
					  set->duplicate_window, &gc->expired,
					  error_r);
}

static void casbox_gc_stats(struct casbox_gc *gc,
			    struct casbox_store_gc_stats *stats_r)
{
	const struct casbox_gc_pack *cand;
	uint64_t freed = 0;

	i_zero(stats_r);
	if (array_is_created(&gc->candidates)) {
		array_foreach(&gc->candidates, cand) {
			if (!cand->keep)
				freed += cand->pack->size;
		}
		stats_r->packs_selected = array_count(&gc->candidates);
	}
	stats_r->packs_deleted = gc->packs_deleted;
	if (array_is_created(&gc->moves))
		stats_r->blobs_moved = array_count(&gc->moves);
	stats_r->records_dropped = gc->records_dropped;
	stats_r->bytes_selected = gc->bytes_before;
	stats_r->bytes_written = gc->bytes_written;
	stats_r->bytes_reclaimed = freed > gc->bytes_written ?
		freed - gc->bytes_written : 0;
	stats_r->recovery_kept = gc->recovery_kept;
	stats_r->recovery_dropped = gc->recovery_dropped;
	stats_r->blob_keys_written = gc->blob_keys_written;
	stats_r->dek_updates = gc->dek_updates;
	stats_r->recovery_written = gc->recovery_written;
	stats_r->retained_released = gc->expired.retained_released;
	stats_r->retained_bytes_released =
		gc->expired.retained_bytes_released;
	stats_r->duplicates_expired = gc->expired.dups_released;
}

static void casbox_gc_init(struct casbox_gc *gc, struct casbox_store *store)
{
	i_zero(gc);
	gc->store = store;
	gc->set = casbox_store_get_settings(store);
	gc->root_dir = casbox_store_get_root(store);
	gc->lsm = casbox_store_get_lsm(store);
}

static void casbox_gc_deinit(struct casbox_gc *gc,
			     struct casbox_store_gc_stats *stats_r)
{
	casbox_gc_stats(gc, stats_r);
	if (hash_table_is_created(gc->covered))
		hash_table_destroy(&gc->covered);
	if (hash_table_is_created(gc->locators))
		hash_table_destroy(&gc->locators);
	if (gc->census != NULL && !gc->census_borrowed)
		casbox_census_free(&gc->census);
}

/* The store's parts, then the census of its records and packs (what
   names "progress" shows). Returns 0 ok, -1 error. */
static int casbox_gc_census(struct casbox_gc *gc, const char *what,
			    const char **error_r)
{
	struct casbox_store *store = gc->store;
	int ret;

	gc->packs = casbox_store_get_packs(store);
	gc->keyring = casbox_store_get_keyring(store);
	if (casbox_census_build(store, NULL, NULL, &gc->census,
				error_r) < 0)
		return -1;
	gc->census->progress = casbox_admin_census_progress;
	gc->census->progress_context = (void *)what;
	ret = casbox_census_scan_packs(store, gc->census, NULL, NULL,
				       error_r);
	casbox_admin_progress_end();
	if (ret < 0)
		return -1;
	hash_table_create(&gc->covered, gc->census->pool, 0, str_hash,
			  strcmp);
	return 0;
}

static int casbox_gc_run(struct casbox_gc *gc, const char **error_r)
{
	if (casbox_store_open_keys(gc->store, error_r) < 0 ||
	    casbox_gc_expire(gc, error_r) < 0 ||
	    casbox_gc_census(gc, "gc", error_r) < 0)
		return -1;
	p_array_init(&gc->candidates, gc->census->pool, 8);
	p_array_init(&gc->moves, gc->census->pool, 64);
	p_array_init(&gc->dropped, gc->census->pool, 64);
	casbox_gc_pick(gc);
	if (array_count(&gc->candidates) == 0)
		return 0;
	if (casbox_gc_rotate(gc, error_r) < 0 ||
	    casbox_gc_copy(gc, error_r) < 0)
		return -1;
	casbox_gc_crash_point("copied");
	if (casbox_gc_commit(gc, error_r) < 0)
		return -1;
	casbox_gc_crash_point("switched");
	/* only now that the switched records are durable */
	return casbox_gc_unlink(gc, error_r);
}

int casbox_store_gc(struct casbox_store *store, bool all,
		    struct casbox_store_gc_stats *stats_r,
		    const char **error_r)
{
	struct casbox_gc gc;
	int ret;

	casbox_gc_init(&gc, store);
	gc.all = all;
	ret = casbox_gc_run(&gc, error_r);
	casbox_gc_deinit(&gc, stats_r);
	return ret;
}

int casbox_store_gc_backfill(struct casbox_store *store,
			     struct casbox_census *census,
			     const struct casbox_store_backfill_callbacks *cb,
			     void *context,
			     struct casbox_store_gc_stats *stats_r,
			     const char **error_r)
{
	const struct casbox_census_meta *meta;
	struct casbox_gc gc;
	int ret = 0;

	casbox_gc_init(&gc, store);
	/* the backfills below are those of --all */
	gc.all = TRUE;
	gc.backfill_cb = cb;
	gc.backfill_context = context;
	if (casbox_store_open_keys(store, error_r) < 0)
		ret = -1;
	else if (census == NULL)
		ret = casbox_gc_census(&gc, "backfill", error_r);
	else {
		gc.packs = casbox_store_get_packs(store);
		gc.keyring = casbox_store_get_keyring(store);
		gc.census = census;
		gc.census_borrowed = TRUE;
		hash_table_create(&gc.covered, census->pool, 0, str_hash,
				  strcmp);
	}
	if (ret == 0) {
		array_foreach(&gc.census->metas, meta) {
			T_BEGIN {
				ret = casbox_gc_scan_meta(&gc, meta, error_r);
			} T_END_PASS_STR_IF(ret < 0, error_r);
			if (ret < 0)
				break;
		}
	}
	if (ret == 0)
		ret = casbox_gc_backfill(&gc, error_r);
	if (ret == 0)
		ret = casbox_gc_backfill_deks(&gc, error_r);
	if (ret == 0)
		ret = casbox_gc_txn_commit(&gc, error_r);
	if (gc.txn != NULL)
		casbox_pack_txn_rollback(&gc.txn);
	casbox_gc_deinit(&gc, stats_r);
	return ret < 0 ? -1 : 0;
}
