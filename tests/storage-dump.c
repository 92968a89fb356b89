/* storage-dump [-s] <casbox root>: print the store's LSM records (with each
   message's parts, "p", and each blob's frame location, "l"; a
   message's flags as its flag record has them) and check that every
   blob's refcount equals the references from message records and that
   every flag record has its message record (e2e tests run it as the
   mail user). With -s, also one line per record type: "size <type>
   count=<n> key_bytes=<k> value_bytes=<v>" (the live records as the
   iterator returns them, before table framing and compression: what
   bench/records-footprint.py breaks LSM bytes down with). Exit 0 when
   consistent, 1 on a mismatch, 2 on errors. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "hash.h"
#include "hex-binary.h"
#include "casbox-lsm.h"
#include "casbox-records.h"
#include "casbox-record-auth.h"
#include "casbox-store-safety.h"
#include "casbox-pack.h"
#include "test-store-lsm.h"

#include <stdio.h>

struct blob_refs {
	uint32_t stored, counted;
};

static HASH_TABLE(char *, struct blob_refs *) blobs;

static struct blob_refs *blob_get(const unsigned char *id)
{
	const char *hex = binary_to_hex(id, CAS_BLOB_ID_SIZE);
	struct blob_refs *refs = hash_table_lookup(blobs, hex);

	if (refs == NULL) {
		refs = i_new(struct blob_refs, 1);
		hash_table_insert(blobs, i_strdup(hex), refs);
	}
	return refs;
}

static struct casbox_lsm *lsm;
static bool orphan_flags = FALSE;

/* The message's flag record, if any, applied to rec (what the store's
   lookups return). */
static void apply_flags(const guid_128_t guid, uint32_t uid,
			struct casbox_msg_record *rec)
{
	buffer_t *key = t_buffer_create(32), *value = t_buffer_create(64);
	const char *error;
	const void *body;
	size_t body_size;
	int ret;

	casbox_key_flags(key, guid, uid);
	ret = casbox_lsm_get(lsm, key->data, key->used, value, &error);
	if (ret < 0)
		i_fatal("get: %s", error);
	/* records v2: the record inside the envelope, not verified (this
	   tool has no key; scrub verifies) */
	if (ret > 0 &&
	    (!casbox_record_body_unverified(value->data, value->used,
					    &body, &body_size) ||
	     casbox_flags_record_import(body, body_size,
					pool_datastack_create(), rec,
					&error) < 0))
		printf("bad-flags-record %s %u\n", guid_128_to_string(guid),
		       uid);
}

/* A flag record must belong to a message record. */
static void check_flags_owner(const unsigned char *key, size_t key_size)
{
	buffer_t *mkey = t_buffer_create(32), *value = t_buffer_create(256);
	const char *error;
	int ret;

	buffer_append_c(mkey, CASBOX_KEY_MESSAGE);
	buffer_append(mkey, key + 1, key_size - 1);
	ret = casbox_lsm_get(lsm, mkey->data, mkey->used, value, &error);
	if (ret < 0)
		i_fatal("get: %s", error);
	if (ret == 0) {
		printf("orphan-flags %s\n", binary_to_hex(key + 1,
							   key_size - 1));
		orphan_flags = TRUE;
	}
}

/* A retained (expunged, restorable) message: its parts are references. */
static void dump_retained(const unsigned char *key, size_t key_size,
			  const unsigned char *value, size_t value_size)
{
	struct casbox_retained_record rec;
	const struct casbox_msg_part *part;
	guid_128_t guid;
	const char *error;
	const void *body;
	size_t body_size;
	uint32_t uid;

	if (casbox_key_retained_parse(key, key_size, guid, &uid) < 0 ||
	    !casbox_record_body_unverified(value, value_size,
					   &body, &body_size) ||
	    casbox_retained_record_import(body, body_size,
					  pool_datastack_create(), &rec,
					  &error) < 0) {
		printf("bad-retained-record\n");
		return;
	}
	printf("x %s %u expunged=%lld size=%llu parts=%u guid=%s\n",
	       guid_128_to_string(guid), uid, (long long)rec.expunged,
	       (unsigned long long)rec.msg.physical_size,
	       array_count(&rec.msg.parts), rec.msg.guid);
	array_foreach(&rec.msg.parts, part)
		blob_get(part->id.id)->counted++;
}

/* The size of a shared metadata record's sealed metadata (records v2),
   0 if it is missing or malformed. */
static size_t shared_meta_size(const unsigned char *meta_id)
{
	buffer_t *key = t_buffer_create(40), *value = t_buffer_create(2048);
	const unsigned char *sealed;
	const void *body;
	size_t body_size, sealed_size;
	const char *error;
	int ret;

	casbox_key_meta(key, meta_id);
	ret = casbox_lsm_get(lsm, key->data, key->used, value, &error);
	if (ret < 0)
		i_fatal("get: %s", error);
	if (ret == 0 ||
	    !casbox_record_body_unverified(value->data, value->used,
					   &body, &body_size) ||
	    casbox_meta_record_import(body, body_size, &sealed,
				      &sealed_size, &error) < 0) {
		printf("bad-meta-record %s\n",
		       binary_to_hex(meta_id, CASBOX_META_ID_SIZE));
		return 0;
	}
	return sealed_size;
}

static void dump_message(const unsigned char *key, size_t key_size,
			 const unsigned char *value, size_t value_size)
{
	struct casbox_msg_record rec;
	const struct casbox_msg_part *part;
	guid_128_t guid;
	const char *error, *kw;
	const void *body;
	size_t body_size;
	uint32_t uid;

	if (casbox_key_message_parse(key, key_size, guid, &uid) < 0 ||
	    !casbox_record_body_unverified(value, value_size,
					   &body, &body_size) ||
	    casbox_msg_record_import(body, body_size,
				     pool_datastack_create(), &rec,
				     &error) < 0) {
		printf("bad-message-record\n");
		return;
	}
	apply_flags(guid, uid, &rec);
	if (rec.meta_ref)
		rec.sealed_meta_size = shared_meta_size(rec.meta_id);
	printf("m %s %u flags=%u modseq=%llu size=%llu parts=%u meta=%zu "
	       "keywords=", guid_128_to_string(guid), uid, rec.flags,
	       (unsigned long long)rec.modseq,
	       (unsigned long long)rec.physical_size,
	       array_count(&rec.parts), rec.sealed_meta_size);
	array_foreach_elem(&rec.keywords, kw)
		printf("%s,", kw);
	printf(" guid=%s\n", rec.guid);
	array_foreach(&rec.parts, part) {
		blob_get(part->id.id)->counted++;
		printf("p %s %u %s\n", guid_128_to_string(guid), uid,
		       binary_to_hex(part->id.id, CAS_BLOB_ID_SIZE));
	}
}

/* where the blob's frame is: tests flip bytes in exactly it */
static void dump_blob_location(const unsigned char *id,
			       const struct casbox_blob_value *bval)
{
	struct casbox_blob_record rec;
	const char *error;

	if (casbox_blob_record_import(bval->pack_record,
				      bval->pack_record_size, &rec,
				      &error) < 0) {
		printf("bad-blob-location %s\n",
		       binary_to_hex(id, CAS_BLOB_ID_SIZE));
		return;
	}
	printf("l %s pack=%u offset=%llu frame_size=%u plain_size=%llu\n",
	       binary_to_hex(id, CAS_BLOB_ID_SIZE), rec.pack_id,
	       (unsigned long long)rec.offset, rec.frame_size,
	       (unsigned long long)rec.plain_size);
	/* a delta blob's record references its base */
	if (rec.base_depth > 0) {
		printf("d %s base=%s depth=%u\n",
		       binary_to_hex(id, CAS_BLOB_ID_SIZE),
		       binary_to_hex(rec.base_id.id, CAS_BLOB_ID_SIZE),
		       rec.base_depth);
		blob_get(rec.base_id.id)->counted++;
	}
}

static void dump_mailbox(const unsigned char *key, size_t key_size,
			 const unsigned char *value, size_t value_size)
{
	struct casbox_mailbox_record rec;
	const char *error;

	if (casbox_mailbox_record_import(value, value_size,
					 pool_datastack_create(), &rec,
					 &error) < 0) {
		printf("bad-mailbox-record\n");
		return;
	}
	printf("M %s uidvalidity=%u next_uid=%u name=%s\n",
	       binary_to_hex(key + 1, key_size - 1), rec.uid_validity,
	       rec.next_uid, rec.name);
}

int main(int argc, char *argv[])
{
	struct casbox_lsm_iter *iter;
	struct casbox_blob_value bval;
	struct hash_iterate_context *hiter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	const char *error;
	char *hex;
	struct blob_refs *refs;
	int ret = 0;

	uint64_t kind_count[256] = { 0 }, kind_keys[256] = { 0 };
	uint64_t kind_values[256] = { 0 };
	bool sizes = FALSE;
	unsigned int i;

	lib_init();
	if (argc == 3 && strcmp(argv[1], "-s") == 0) {
		sizes = TRUE;
		argv++;
		argc--;
	}
	if (argc != 2)
		i_fatal("usage: storage-dump [-s] <casbox root>");
	hash_table_create(&blobs, default_pool, 0, str_hash, strcmp);
	if (test_store_lsm_open(argv[1], NULL, FALSE, &lsm, &error) < 0)
		i_fatal("open %s/lsm: %s", argv[1], error);
	iter = casbox_lsm_iter_init(lsm, "", 0);
	while (casbox_lsm_iter_next(iter, &key, &key_size,
				    &value, &value_size)) T_BEGIN {
		kind_count[key[0]]++;
		kind_keys[key[0]] += key_size;
		kind_values[key[0]] += value_size;
		if (key[0] == CASBOX_KEY_MESSAGE)
			dump_message(key, key_size, value, value_size);
		else if (key[0] == CASBOX_KEY_RETAINED)
			dump_retained(key, key_size, value, value_size);
		else if (key[0] == CASBOX_KEY_BLOB &&
			 key_size == 1 + CAS_BLOB_ID_SIZE) {
			if (casbox_blob_value_import(value, value_size,
						     &bval, &error) < 0)
				printf("bad-blob-record\n");
			else {
				blob_get(key + 1)->stored = bval.refcount;
				dump_blob_location(key + 1, &bval);
			}
		} else if (key[0] == CASBOX_KEY_FLAGS) {
			check_flags_owner(key, key_size);
		} else if (key[0] == CASBOX_KEY_MAILBOX) {
			dump_mailbox(key, key_size, value, value_size);
		}
	} T_END;
	if (casbox_lsm_iter_deinit(&iter, &error) < 0)
		i_fatal("iterate: %s", error);
	test_store_lsm_close(&lsm);
	for (i = 0; sizes && i < N_ELEMENTS(kind_count); i++) {
		if (kind_count[i] == 0)
			continue;
		printf("size %c count=%llu key_bytes=%llu value_bytes=%llu\n",
		       i >= 0x21 && i < 0x7f ? (char)i : '?',
		       (unsigned long long)kind_count[i],
		       (unsigned long long)kind_keys[i],
		       (unsigned long long)kind_values[i]);
	}

	hiter = hash_table_iterate_init(blobs);
	while (hash_table_iterate(hiter, blobs, &hex, &refs)) {
		printf("b %s refcount=%u referenced=%u\n", hex, refs->stored,
		       refs->counted);
		if (refs->stored != refs->counted) {
			printf("refcount-mismatch %s\n", hex);
			ret = 1;
		}
	}
	hash_table_iterate_deinit(&hiter);
	if (orphan_flags)
		ret = 1;
	lib_deinit();
	return ret;
}
