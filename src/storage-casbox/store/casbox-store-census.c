/* casbox-store-census: one pass over a store's LSM records and pack
   frames (doveadm casbox stats, scrub, gc). */

#include "lib.h"
#include "array.h"
#include "hash.h"
#include "hex-binary.h"
#include "istream.h"
#include "safe-memset.h"
#include "byteorder.h"
#include "casbox-lsm.h"
#include "casbox-recovery.h"
#include "casbox-store.h"
#include "casbox-store-census.h"
#include "casbox-record-auth.h"
#include "casbox-store-safety.h"
#include "casbox-store-quarantine.h"
#include "casbox-pack-file.h"

#include <dirent.h>
#include <stdio.h>
#include <sys/stat.h>

static unsigned int casbox_census_blob_id_hash(const struct cas_blob_id *id)
{
	/* ids are keyed hashes: any four bytes are uniformly spread */
	return ((unsigned int)id->id[0] << 24) |
		((unsigned int)id->id[1] << 16) |
		((unsigned int)id->id[2] << 8) | id->id[3];
}

static int casbox_census_blob_id_cmp(const struct cas_blob_id *id1,
				    const struct cas_blob_id *id2)
{
	return memcmp(id1->id, id2->id, sizeof(id1->id));
}

static unsigned int casbox_census_loc_hash(const struct casbox_census_loc *loc)
{
	return loc->pack_id * 2654435761U ^ (unsigned int)loc->offset ^
		(unsigned int)(loc->offset >> 32);
}

static int casbox_census_loc_cmp(const struct casbox_census_loc *loc1,
				const struct casbox_census_loc *loc2)
{
	if (loc1->pack_id != loc2->pack_id)
		return loc1->pack_id < loc2->pack_id ? -1 : 1;
	if (loc1->offset != loc2->offset)
		return loc1->offset < loc2->offset ? -1 : 1;
	return 0;
}

static struct casbox_census_blob *
casbox_census_blob_get(struct casbox_census *census,
		       const struct cas_blob_id *id)
{
	struct casbox_census_blob *blob;

	blob = hash_table_lookup(census->blobs, id);
	if (blob == NULL) {
		blob = p_new(census->pool, struct casbox_census_blob, 1);
		blob->id = *id;
		hash_table_insert(census->blobs, &blob->id, blob);
		array_push_back(&census->blob_list, &blob);
	}
	return blob;
}

static void
casbox_census_damage(casbox_census_damage_callback_t *damage, void *context,
		     const char *mailbox, uint32_t uid, const char *object,
		     const char *cause)
{
	if (damage != NULL)
		damage(context, mailbox, uid, object, cause);
}

static struct casbox_census_meta_ref *
casbox_census_meta_get(struct casbox_census *census,
		       const unsigned char id[CASBOX_META_ID_SIZE])
{
	struct casbox_census_meta_ref *ref;
	const char *hex = binary_to_hex(id, CASBOX_META_ID_SIZE);

	ref = hash_table_lookup(census->meta_refs, hex);
	if (ref == NULL) {
		ref = p_new(census->pool, struct casbox_census_meta_ref, 1);
		hash_table_insert(census->meta_refs,
				  p_strdup(census->pool, hex), ref);
	}
	return ref;
}

/* A shared metadata record ('s') or its refcount record ('r'):
   authentic, and (checked after all records are read) referenced as
   often as its refcount says. */
static void
casbox_census_meta(struct casbox_store *store, struct casbox_census *census,
		   const unsigned char *key, size_t key_size,
		   const unsigned char *value, size_t value_size,
		   casbox_census_damage_callback_t *damage, void *context)
{
	struct casbox_census_meta_ref *ref;
	bool is_refs = key[0] == CASBOX_KEY_META_REFS;
	const unsigned char *sealed;
	const void *body;
	size_t sealed_size, body_size;
	uint32_t refcount = 0;
	const char *error;
	int ret;

	if (key_size != 1 + CASBOX_META_ID_SIZE) {
		census->bad_records++;
		casbox_census_damage(damage, context, "-", 0,
			t_strdup_printf("lsm key %s",
					binary_to_hex(key, key_size)),
			"malformed metadata key");
		return;
	}
	if (census->records_unverified) {
		if (!casbox_record_body_unverified(value, value_size,
						   &body, &body_size))
			ret = -1;
		else if (is_refs) {
			ret = casbox_meta_refs_import(body, body_size,
						      &refcount, &error);
		} else {
			ret = casbox_meta_record_import(body, body_size,
							&sealed, &sealed_size,
							&error);
		}
		if (ret < 0)
			error = "malformed metadata record";
	} else if (is_refs) {
		ret = casbox_store_meta_refs_import(store, key, key_size,
						    value, value_size,
						    &refcount, &error);
	} else {
		ret = casbox_store_meta_value_import(store, key, key_size,
						     value, value_size,
						     &sealed, &sealed_size,
						     &error);
	}
	if (ret < 0) {
		census->bad_records++;
		casbox_census_damage(damage, context, "-", 0,
			t_strdup_printf("metadata %s",
				binary_to_hex(key + 1, key_size - 1)), error);
		return;
	}
	ref = casbox_census_meta_get(census, key + 1);
	if (is_refs) {
		ref->have_refs = TRUE;
		ref->refcount = refcount;
	} else {
		ref->have_record = TRUE;
	}
}

static void
casbox_census_meta_check(struct casbox_census *census,
			 casbox_census_damage_callback_t *damage,
			 void *context)
{
	struct hash_iterate_context *iter;
	struct casbox_census_meta_ref *ref;
	const char *cause;
	char *hex;

	iter = hash_table_iterate_init(census->meta_refs);
	while (hash_table_iterate(iter, census->meta_refs, &hex, &ref)) {
		cause = NULL;
		if (!ref->have_record && ref->counted > 0) {
			/* reads parse those messages instead */
			cause = t_strdup_printf("metadata record missing, %u "
						"references", ref->counted);
		} else if (ref->refcount != ref->counted) {
			cause = t_strdup_printf("metadata refcount %u, but %u "
						"references", ref->refcount,
						ref->counted);
		} else if (ref->have_refs && !ref->have_record) {
			cause = "metadata refcount record without its "
				"metadata record";
		} else if (ref->have_record && !ref->have_refs) {
			cause = "metadata record without a refcount record";
		}
		if (cause != NULL) {
			casbox_census_damage(damage, context, "-", 0,
				t_strdup_printf("metadata %s", hex), cause);
		}
	}
	hash_table_iterate_deinit(&iter);
}

static void
casbox_census_message(struct casbox_store *store,
		      struct casbox_census *census,
		      const unsigned char *key, size_t key_size,
		      const unsigned char *value, size_t value_size,
		      casbox_census_damage_callback_t *damage, void *context)
{
	const struct casbox_msg_part *part;
	struct casbox_msg_record rec;
	struct casbox_census_blob *blob;
	guid_128_t guid;
	const char *error;
	const void *body = NULL;
	size_t body_size;
	bool authenticated;
	uint32_t uid;

	if (casbox_key_message_parse(key, key_size, guid, &uid) < 0) {
		census->bad_records++;
		casbox_census_damage(damage, context, "-", 0,
			t_strdup_printf("lsm key %s",
					binary_to_hex(key, key_size)),
			"malformed message key");
		return;
	}
	if (!casbox_record_body_unverified(value, value_size,
					   &body, &body_size) ||
	    casbox_msg_record_import(body, body_size,
				     pool_datastack_create(), &rec,
				     &error) < 0) {
		census->bad_records++;
		casbox_census_damage(damage, context,
			casbox_census_mailbox_name(census, guid), uid, "-",
			t_strdup_printf("malformed message record: %s",
				body == NULL ? "unknown version" : error));
		return;
	}
	/* a record that fails authentication below still holds its
	   reference (as its parts do) */
	if (rec.meta_ref)
		casbox_census_meta_get(census, rec.meta_id)->counted++;
	if (!census->records_unverified &&
	    casbox_record_open(store, key, key_size, value, value_size,
			       &body, &body_size, &authenticated,
			       &error) < 0) {
		/* names the mailbox GUID, the UID and what failed */
		census->bad_records++;
		casbox_census_damage(damage, context,
			casbox_census_mailbox_name(census, guid), uid, "-",
			error);
		/* its parts still count as references: a repair must not
		   release blobs because of a record it cannot trust (that
		   only keeps blobs alive) */
		array_foreach(&rec.parts, part) {
			casbox_census_blob_get(census, &part->id)->counted++;
		}
		return;
	}
	census->messages++;
	census->logical_bytes += rec.physical_size;
	array_foreach(&rec.parts, part) {
		blob = casbox_census_blob_get(census, &part->id);
		blob->counted++;
		census->referenced_plain_bytes +=
			casbox_msg_part_blob_size(part);
	}
}

/* A message (is_msg) or flag record into rec: verified, or without the
   keys (census->records_unverified) only decoded. Returns 1 ok, -1 bad
   (error_r says why). */
static int
casbox_census_decode(struct casbox_store *store, struct casbox_census *census,
		     const unsigned char *key, size_t key_size,
		     const unsigned char *value, size_t value_size,
		     bool is_msg, struct casbox_msg_record *rec,
		     const char **error_r)
{
	pool_t pool = pool_datastack_create();
	const void *body;
	size_t body_size;

	if (!census->records_unverified) {
		return is_msg ?
			casbox_store_msg_value_import(store, key, key_size,
				value, value_size, pool, rec, error_r) :
			casbox_store_flags_value_import(store, key, key_size,
				value, value_size, pool, rec, error_r);
	}
	if (!casbox_record_body_unverified(value, value_size,
					   &body, &body_size)) {
		*error_r = "unknown version";
		return -1;
	}
	return is_msg ?
		casbox_msg_record_import(body, body_size, pool, rec, error_r) :
		casbox_flags_record_import(body, body_size, pool, rec,
					   error_r);
}

/* A flag record: authentic, of a message that exists, and not older
   than the message record (a flag record replayed from before the
   message was saved again under its UID). */
static void
casbox_census_flags(struct casbox_store *store, struct casbox_census *census,
		    const unsigned char *key, size_t key_size,
		    const unsigned char *value, size_t value_size,
		    casbox_census_damage_callback_t *damage, void *context)
{
	struct casbox_msg_record frec, mrec;
	const char *error, *name;
	buffer_t *mkey, *mvalue;
	guid_128_t guid;
	uint32_t uid;
	int ret;

	if (key_size != 1 + GUID_128_SIZE + 4) {
		census->bad_records++;
		casbox_census_damage(damage, context, "-", 0,
			t_strdup_printf("lsm key %s",
					binary_to_hex(key, key_size)),
			"malformed flag key");
		return;
	}
	memcpy(guid, key + 1, GUID_128_SIZE);
	uid = be32_to_cpu_unaligned(key + 1 + GUID_128_SIZE);
	name = casbox_census_mailbox_name(census, guid);
	casbox_msg_record_init(pool_datastack_create(), &frec);
	if (casbox_census_decode(store, census, key, key_size, value,
				 value_size, FALSE, &frec, &error) < 0) {
		census->bad_records++;
		casbox_census_damage(damage, context, name, uid, "-",
			t_strdup_printf("bad flag record: %s", error));
		return;
	}
	mkey = t_buffer_create(32);
	casbox_key_message(mkey, guid, uid);
	mvalue = t_buffer_create(256);
	ret = casbox_lsm_get(casbox_store_get_lsm(store), mkey->data,
			     mkey->used, mvalue, &error);
	if (ret == 0) {
		census->bad_records++;
		casbox_census_damage(damage, context, name, uid, "-",
			"flag record without a message record "
			"(left over or replayed)");
		return;
	}
	/* an unreadable message record is reported on its own */
	if (ret < 0 ||
	    casbox_census_decode(store, census, mkey->data, mkey->used,
				 mvalue->data, mvalue->used, TRUE, &mrec,
				 &error) < 0)
		return;
	if (frec.modseq < mrec.modseq) {
		census->bad_records++;
		casbox_census_damage(damage, context, name, uid, "-",
			t_strdup_printf("flag record older than its message "
					"record (modseq %"PRIu64" < %"PRIu64
					"): replayed", frec.modseq,
					mrec.modseq));
	}
}

/* A retained message (undelete window) references its blobs as a
   message record does, but is not mail the user sees. */
static void
casbox_census_retained(struct casbox_store *store,
		       struct casbox_census *census,
		       const unsigned char *key, size_t key_size,
		       const unsigned char *value, size_t value_size,
		       casbox_census_damage_callback_t *damage, void *context)
{
	struct casbox_retained_record rec;
	const struct casbox_msg_part *part;
	guid_128_t guid;
	const char *error;
	const void *body;
	size_t body_size;
	bool authenticated;
	uint32_t uid;

	if (casbox_key_retained_parse(key, key_size, guid, &uid) < 0 ||
	    !casbox_record_body_unverified(value, value_size,
					   &body, &body_size) ||
	    casbox_retained_record_import(body, body_size,
					  pool_datastack_create(), &rec,
					  &error) < 0) {
		census->bad_records++;
		casbox_census_damage(damage, context, "-", 0,
			t_strdup_printf("lsm key %s",
					binary_to_hex(key, key_size)),
			"malformed retained record");
		return;
	}
	if (!census->records_unverified &&
	    casbox_record_open(store, key, key_size, value, value_size,
			       &body, &body_size, &authenticated,
			       &error) < 0) {
		/* reported with the mailbox it was expunged from; its
		   parts stay counted (see casbox_census_message()) */
		census->bad_records++;
		casbox_census_damage(damage, context, rec.mailbox_name, uid,
				     "-", error);
		array_foreach(&rec.msg.parts, part)
			casbox_census_blob_get(census, &part->id)->counted++;
		return;
	}
	census->retained_messages++;
	census->retained_bytes += rec.msg.physical_size;
	array_foreach(&rec.msg.parts, part) {
		casbox_census_blob_get(census, &part->id)->counted++;
		census->referenced_plain_bytes += part->size;
	}
}

static void
casbox_census_blob(struct casbox_census *census,
		   const unsigned char *key, size_t key_size,
		   const unsigned char *value, size_t value_size,
		   casbox_census_damage_callback_t *damage, void *context)
{
	struct casbox_census_blob *blob;
	struct casbox_blob_value bval;
	struct casbox_census_loc *loc;
	struct cas_blob_id id;
	const char *error;

	if (key_size != 1 + CAS_BLOB_ID_SIZE) {
		census->bad_records++;
		casbox_census_damage(damage, context, "-", 0,
			t_strdup_printf("lsm key %s",
					binary_to_hex(key, key_size)),
			"malformed blob key");
		return;
	}
	memcpy(id.id, key + 1, CAS_BLOB_ID_SIZE);
	blob = casbox_census_blob_get(census, &id);
	blob->have_record = TRUE;
	if (casbox_blob_value_import(value, value_size, &bval, &error) < 0 ||
	    casbox_blob_record_import(bval.pack_record, bval.pack_record_size,
				      &blob->rec, &error) < 0) {
		census->bad_records++;
		blob->record_bad = TRUE;
		blob->damage = p_strdup_printf(census->pool,
			"malformed blob record: %s", error);
		casbox_census_damage(damage, context, "-", 0,
				     cas_blob_id_to_hex(&id), blob->damage);
		return;
	}
	blob->refcount = bval.refcount;
	/* a delta blob's record holds a reference on its base, as a
	   message record does on its parts */
	if (blob->rec.base_depth > 0)
		casbox_census_blob_get(census, &blob->rec.base_id)->counted++;
	loc = p_new(census->pool, struct casbox_census_loc, 1);
	loc->pack_id = blob->rec.pack_id;
	loc->offset = blob->rec.offset;
	hash_table_update(census->locs, loc, blob);
}

static void
casbox_census_quarantine(struct casbox_census *census,
			 const unsigned char *key, size_t key_size,
			 const unsigned char *value, size_t value_size,
			 casbox_census_damage_callback_t *damage,
			 void *context)
{
	struct casbox_quarantine_record qrec;
	struct casbox_census_blob *blob;
	struct cas_blob_id id;
	const char *error;

	if (key_size != 1 + CAS_BLOB_ID_SIZE) {
		census->bad_records++;
		casbox_census_damage(damage, context, "-", 0,
			t_strdup_printf("lsm key %s",
					binary_to_hex(key, key_size)),
			"malformed quarantine key");
		return;
	}
	memcpy(id.id, key + 1, CAS_BLOB_ID_SIZE);
	blob = casbox_census_blob_get(census, &id);
	if (casbox_quarantine_record_import(value, value_size, census->pool,
					    &qrec, &error) < 0) {
		census->bad_records++;
		casbox_census_damage(damage, context, "-", 0,
				     cas_blob_id_to_hex(&id),
				     t_strdup_printf("malformed quarantine "
						     "record: %s", error));
		blob->quarantined = "(malformed quarantine record)";
		return;
	}
	blob->quarantined = qrec.cause;
	blob->quarantine_time = qrec.time;
}

static void
casbox_census_mailbox(struct casbox_census *census,
		      const unsigned char *key, size_t key_size,
		      const unsigned char *value, size_t value_size)
{
	struct casbox_mailbox_record rec;
	const char *error;

	if (key_size != 1 + GUID_128_SIZE ||
	    casbox_mailbox_record_import(value, value_size,
					 pool_datastack_create(), &rec,
					 &error) < 0)
		return;
	hash_table_update(census->mailbox_names,
		p_strdup(census->pool, binary_to_hex(key + 1, GUID_128_SIZE)),
		p_strdup(census->pool, rec.name));
}

int casbox_census_build(struct casbox_store *store,
			casbox_census_damage_callback_t *damage, void *context,
			struct casbox_census **census_r,
			const char **error_r)
{
	struct casbox_census *census;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	struct casbox_lsm *lsm = casbox_store_get_lsm(store);
	const char *key_error;
	unsigned char prefix;
	pool_t pool;

	if (casbox_lsm_refresh(lsm, error_r) < 0)
		return -1;
	pool = pool_alloconly_create("casbox census", 64 * 1024);
	census = p_new(pool, struct casbox_census, 1);
	census->pool = pool;
	hash_table_create(&census->blobs, pool, 0, casbox_census_blob_id_hash,
			  casbox_census_blob_id_cmp);
	hash_table_create(&census->locs, pool, 0, casbox_census_loc_hash,
			  casbox_census_loc_cmp);
	hash_table_create(&census->mailbox_names, pool, 0, str_hash, strcmp);
	hash_table_create(&census->meta_refs, pool, 0, str_hash, strcmp);
	p_array_init(&census->blob_list, pool, 256);
	p_array_init(&census->metas, pool, 64);
	p_array_init(&census->packs, pool, 4);

	/* records v2 are verified with the record key; without a key
	   (keyless scrub) they are only decoded */
	if (casbox_store_get_keyring(store) == NULL &&
	    (casbox_store_open_keys_for_records(store, &key_error) < 0 ||
	     casbox_store_get_keyring(store) == NULL))
		census->records_unverified = TRUE;

	/* mailbox names first, so message damage can name its mailbox */
	prefix = CASBOX_KEY_MAILBOX;
	iter = casbox_lsm_iter_init(lsm, &prefix, 1);
	while (casbox_lsm_iter_next(iter, &key, &key_size,
				    &value, &value_size)) T_BEGIN {
		casbox_census_mailbox(census, key, key_size,
				      value, value_size);
	} T_END;
	if (casbox_lsm_iter_deinit(&iter, error_r) < 0) {
		casbox_census_free(&census);
		return -1;
	}
	iter = casbox_lsm_iter_init(lsm, "", 0);
	while (casbox_lsm_iter_next(iter, &key, &key_size,
				    &value, &value_size)) T_BEGIN {
		if (key_size == 0)
			;
		else if (key[0] == CASBOX_KEY_MESSAGE) {
			casbox_census_message(store, census, key, key_size,
					      value, value_size, damage,
					      context);
		} else if (key[0] == CASBOX_KEY_FLAGS) {
			casbox_census_flags(store, census, key, key_size,
					    value, value_size, damage,
					    context);
		} else if (key[0] == CASBOX_KEY_BLOB) {
			casbox_census_blob(census, key, key_size, value,
					   value_size, damage, context);
		} else if (key[0] == CASBOX_KEY_RETAINED) {
			casbox_census_retained(store, census, key, key_size,
					       value,
					       value_size, damage, context);
		} else if (key[0] == CASBOX_KEY_META ||
			   key[0] == CASBOX_KEY_META_REFS) {
			casbox_census_meta(store, census, key, key_size,
					   value, value_size, damage,
					   context);
		} else if (key[0] == CASBOX_KEY_QUARANTINE) {
			casbox_census_quarantine(census, key, key_size, value,
						 value_size, damage, context);
		}
	} T_END;
	if (casbox_lsm_iter_deinit(&iter, error_r) < 0) {
		casbox_census_free(&census);
		return -1;
	}
	T_BEGIN {
		casbox_census_meta_check(census, damage, context);
	} T_END;
	*census_r = census;
	return 0;
}

bool casbox_census_blob_is_live(const struct casbox_census_blob *blob)
{
	return blob->refcount > 0 || blob->counted > 0;
}

static struct casbox_census_pack *
casbox_census_pack(struct casbox_census *census, uint32_t pack_id)
{
	struct casbox_census_pack *pack;

	array_foreach_modifiable(&census->packs, pack) {
		if (pack->pack_id == pack_id)
			return pack;
	}
	return NULL;
}

static void
casbox_census_frame(struct casbox_store *store, struct casbox_census *census,
		    const struct casbox_pack_frame_info *info,
		    casbox_census_damage_callback_t *damage, void *context)
{
	struct casbox_census_loc loc = {
		.pack_id = info->pack_id,
		.offset = info->offset,
	};
	struct casbox_census_blob *blob;
	struct casbox_census_pack *pack;

	pack = casbox_census_pack(census, info->pack_id);
	if (info->meta_kind != CASBOX_META_KIND_NONE &&
	    info->damage == NULL) {
		struct casbox_census_meta *meta;

		if (pack != NULL)
			pack->meta_bytes += info->frame_size;
		meta = array_append_space(&census->metas);
		meta->pack_id = info->pack_id;
		meta->offset = info->offset;
		meta->kind = info->meta_kind;
		return;
	}
	blob = info->meta_kind != CASBOX_META_KIND_NONE ? NULL :
		hash_table_lookup(census->locs, &loc);
	if (blob != NULL && info->damage == NULL)
		blob->frame_seen = TRUE;
	if (blob != NULL && casbox_census_blob_is_live(blob) &&
	    info->damage == NULL && pack != NULL) {
		pack->live_bytes += info->frame_size;
		pack->live_plain_bytes += blob->rec.plain_size;
	} else if (pack != NULL) {
		pack->dead_bytes += info->frame_size;
	}
	if (info->damage == NULL)
		return;
	if (blob != NULL) {
		/* the message rows name it; see scrub */
		blob->damage = p_strdup_printf(census->pool,
			"pack %u offset %"PRIu64": %s", info->pack_id,
			info->offset, info->damage);
		return;
	}
	if (pack == NULL || info->offset + info->frame_size >= pack->size ||
	    info->unfinished) {
		/* the tail of a pack that no record points to (an append in
		   progress), or an append a crashed writer never finished:
		   nothing is lost, gc reclaims it */
		return;
	}
	casbox_census_damage(damage, context, "-", 0,
		t_strdup_printf("%s@%"PRIu64,
			casbox_census_pack_path(casbox_store_get_root(store),
						info->pack_id),
			info->offset),
		t_strdup_printf("damaged frame (%u bytes) no blob record "
				"points to: %s", info->frame_size,
				info->damage));
}

int casbox_census_scan_packs(struct casbox_store *store,
			     struct casbox_census *census,
			     casbox_census_damage_callback_t *damage,
			     void *context, const char **error_r)
{
	struct casbox_pack_store *packs = casbox_store_get_packs(store);
	const struct casbox_census_pack *pack;
	struct casbox_pack_frame_info info;
	struct casbox_pack_scan *scan;
	uint64_t frames = 0, bytes_before = 0, bytes_total = 0;
	uint32_t cur_pack_id = 0;
	const char *error;

	i_assert(packs != NULL);
	if (casbox_census_list_packs(casbox_store_get_root(store),
				     census->pool, &census->packs,
				     error_r) < 0)
		return -1;
	array_foreach(&census->packs, pack)
		bytes_total += pack->size;
	scan = casbox_pack_scan_init(packs);
	while (casbox_pack_scan_next(scan, &info)) T_BEGIN {
		casbox_census_frame(store, census, &info, damage, context);
		if (census->progress != NULL) {
			/* packs are scanned in id order */
			if (info.pack_id != cur_pack_id) {
				bytes_before = 0;
				array_foreach(&census->packs, pack) {
					if (pack->pack_id < info.pack_id)
						bytes_before += pack->size;
				}
				cur_pack_id = info.pack_id;
			}
			census->progress(census->progress_context, ++frames,
					 bytes_before + info.offset +
					 info.frame_size, bytes_total);
		}
	} T_END;
	if (casbox_pack_scan_deinit(&scan, &error) < 0) {
		*error_r = t_strdup_printf("pack scan: %s", error);
		return -1;
	}
	return 0;
}

const char *casbox_census_mailbox_name(struct casbox_census *census,
				       const guid_128_t mailbox_guid)
{
	const char *hex = binary_to_hex(mailbox_guid, GUID_128_SIZE);
	const char *name;

	name = hash_table_lookup(census->mailbox_names, hex);
	return name != NULL ? name : t_strdup(hex);
}

void casbox_census_free(struct casbox_census **_census)
{
	struct casbox_census *census = *_census;

	*_census = NULL;
	hash_table_destroy(&census->blobs);
	hash_table_destroy(&census->locs);
	hash_table_destroy(&census->mailbox_names);
	hash_table_destroy(&census->meta_refs);
	pool_unref(&census->pool);
}

const char *casbox_census_pack_path(const char *root_dir, uint32_t pack_id)
{
	return t_strdup_printf("%s/packs/pack-%08u.cbp", root_dir, pack_id);
}

static int casbox_census_pack_cmp(const struct casbox_census_pack *p1,
				  const struct casbox_census_pack *p2)
{
	return p1->pack_id < p2->pack_id ? -1 :
		(p1->pack_id > p2->pack_id ? 1 : 0);
}

int casbox_census_list_packs(const char *root_dir, pool_t pool,
			     ARRAY_TYPE(casbox_census_pack) *packs,
			     const char **error_r)
{
	const char *dir_path = t_strconcat(root_dir, "/packs", NULL);
	struct casbox_census_pack *pack;
	struct casbox_pack_stub stub;
	const char *error;
	struct dirent *d;
	struct stat st;
	unsigned int id;
	char end;
	DIR *dir;

	p_array_init(packs, pool, 16);
	dir = opendir(dir_path);
	if (dir == NULL) {
		if (errno == ENOENT)
			return 0;
		*error_r = t_strdup_printf("opendir(%s) failed: %m", dir_path);
		return -1;
	}
	/* same naming rule as the pack store (doc/casbox-format.md) */
	while ((d = readdir(dir)) != NULL) {
		if (sscanf(d->d_name, "pack-%08u.cb%c", &id, &end) != 2 ||
		    (end != 'p' && end != 'r') || strlen(d->d_name) != 17 ||
		    id == 0)
			continue;
		if (end == 'r') {
			/* uploaded to object storage (blob/casbox-pack-file.h);
			   counted once, under its local name if that remains */
			if (stat(casbox_census_pack_path(root_dir, id), &st) == 0 ||
			    casbox_pack_stub_read(t_strdup_printf(
					"%s/%s", dir_path, d->d_name),
					&stub, &error) <= 0)
				continue;
			st.st_size = stub.size;
		} else if (stat(casbox_census_pack_path(root_dir, id), &st) < 0)
			continue;
		pack = array_append_space(packs);
		pack->pack_id = id;
		pack->size = st.st_size;
	}
	if (closedir(dir) < 0) {
		*error_r = t_strdup_printf("closedir(%s) failed: %m",
					   dir_path);
		return -1;
	}
	array_sort(packs, casbox_census_pack_cmp);
	return 0;
}

int casbox_census_verify_lsm(struct casbox_store *store,
			     casbox_census_lsm_damage_callback_t *report,
			     void *context, const char **error_r)
{
	return casbox_lsm_verify(casbox_store_get_lsm(store), report, context,
				 error_r);
}

/* casbox_pack_base_lookup_func_t over the census's blob records. */
static int casbox_census_base_lookup(void *context,
				     const struct cas_blob_id *base_id,
				     struct casbox_blob_record *rec_r,
				     const char **error_r)
{
	struct casbox_census *census = context;
	struct casbox_census_blob *base;

	base = hash_table_lookup(census->blobs, base_id);
	if (base == NULL || !base->have_record) {
		*error_r = "no blob record";
		return 0;
	}
	if (base->record_bad) {
		*error_r = base->damage;
		return -1;
	}
	*rec_r = base->rec;
	return 1;
}

void casbox_census_decode_blob(struct casbox_store *store,
			       struct casbox_census *census,
			       struct casbox_census_blob *blob)
{
	struct istream *input;
	const unsigned char *data;
	const char *error;
	size_t size;

	/* a delta blob with its chain: a base that is missing or damaged
	   is this blob's damage too, naming the base */
	if (casbox_pack_blob_open_chain(casbox_store_get_packs(store),
					&blob->id, &blob->rec,
					casbox_census_base_lookup, census,
					&input, &error) < 0) {
		blob->damage = p_strdup(census->pool, error);
		blob->base_damaged = TRUE;
		return;
	}
	while (i_stream_read_more(input, &data, &size) > 0)
		i_stream_skip(input, size);
	if (input->stream_errno != 0) {
		blob->damage = p_strdup(census->pool,
					i_stream_get_error(input));
	} else if (input->v_offset != blob->rec.plain_size) {
		blob->damage = p_strdup_printf(census->pool,
			"decoded %"PRIuUOFF_T" bytes, the record says %"
			PRIu64, input->v_offset, blob->rec.plain_size);
	}
	i_stream_unref(&input);
}

int casbox_census_check_meta(struct casbox_store *store,
			     const struct casbox_census_meta *meta,
			     const char **error_r)
{
	struct casbox_pack_store *packs = casbox_store_get_packs(store);
	struct casbox_recovery_record rrec;
	struct casbox_recovery_mailbox mrec;
	struct casbox_dek_update upd;
	enum casbox_meta_kind kind;
	buffer_t *sealed, *plain;
	int ret;

	sealed = t_buffer_create(512);
	plain = t_buffer_create(512);
	if (casbox_pack_meta_read(packs, meta->pack_id, meta->offset,
				  &kind, sealed, error_r) < 0)
		ret = -1;
	else if (!cas_keyring_can_decrypt(casbox_store_get_keyring(store))) {
		ret = casbox_pack_meta_verify(packs, kind, sealed->data,
					      sealed->used, error_r) < 0 ?
			-1 : 0;
	} else if (casbox_pack_meta_open(packs, kind, sealed->data,
					 sealed->used, plain, error_r) < 0)
		ret = -1;
	else if (kind == CASBOX_META_KIND_RECOVERY) {
		ret = casbox_recovery_record_import(plain->data, plain->used,
						    pool_datastack_create(),
						    &rrec, error_r);
	} else if (kind == CASBOX_META_KIND_MAILBOX) {
		ret = casbox_recovery_mailbox_import(plain->data, plain->used,
						     pool_datastack_create(),
						     &mrec, error_r);
	} else if (kind == CASBOX_META_KIND_COPY) {
		struct casbox_copy_record crec;

		ret = casbox_copy_record_import(plain->data, plain->used,
						pool_datastack_create(),
						&crec, error_r);
	} else if (kind == CASBOX_META_KIND_BLOB_KEYS) {
		struct casbox_blob_keys bkeys;

		ret = casbox_blob_keys_import(plain->data, plain->used,
					      pool_datastack_create(),
					      &bkeys, error_r);
	} else {
		ret = casbox_dek_update_import(plain->data, plain->used, &upd,
					       error_r);
	}
	if (plain->used > 0) {
		safe_memset(buffer_get_modifiable_data(plain, NULL), 0,
			    plain->used);
	}
	return ret < 0 ? -1 : 0;
}

int casbox_census_foreach_msg(struct casbox_store *store,
			      casbox_census_msg_callback_t *callback,
			      void *context, const char **error_r)
{
	unsigned char prefix = CASBOX_KEY_MESSAGE;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	struct casbox_msg_record rec;
	struct casbox_census census;
	const char *error;
	guid_128_t guid;
	uint32_t uid;

	i_zero(&census);
	census.records_unverified = casbox_store_get_keyring(store) == NULL;
	iter = casbox_lsm_iter_init(casbox_store_get_lsm(store), &prefix, 1);
	while (casbox_lsm_iter_next(iter, &key, &key_size,
				    &value, &value_size)) T_BEGIN {
		/* without the key (keyless scrub) decoded unverified, so
		   the CRC scan's damage still names its messages */
		if (casbox_key_message_parse(key, key_size, guid, &uid) >= 0 &&
		    casbox_census_decode(store, &census, key, key_size,
					 value, value_size, TRUE, &rec,
					 &error) >= 0)
			callback(context, guid, uid, &rec);
	} T_END;
	return casbox_lsm_iter_deinit(&iter, error_r);
}
