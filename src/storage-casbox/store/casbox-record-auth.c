/* casbox: authenticated LSM records (see casbox-record-auth.h). */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "hex-binary.h"
#include "byteorder.h"
#include "casbox-lsm.h"
#include "casbox-records.h"
#include "casbox-record-io.h"
#include "casbox-record-auth.h"
#include "casbox-store.h"
#include "casbox-store-safety.h"

#include <sodium.h>

static const char casbox_record_mac_domain[16] = "casbox record v2";

static int
casbox_records_have_any(struct casbox_store *store, bool *have_r,
			const char **error_r);

#define CASBOX_RECORDS_MARKER_UPGRADING 1
#define CASBOX_RECORDS_MARKER_DONE 2

/* The one place the record key is looked up: the keys are loaded on
   first need. Returns 0 ok, -1 error. */
static struct cas_keyring *
casbox_record_keyring(struct casbox_store *store, const char **error_r)
{
	struct cas_keyring *keyring = casbox_store_get_keyring(store);
	const char *error;

	if (keyring == NULL) {
		if (casbox_store_open_keys_for_records(store, &error) < 0) {
			*error_r = t_strdup_printf(
				"record key not available: %s", error);
			return NULL;
		}
		keyring = casbox_store_get_keyring(store);
		if (keyring == NULL) {
			/* the packs were opened without the key (keyless
			   scrub): casbox_store_open_keys() loads nothing */
			*error_r = "record key not available: the store was "
				"opened without its key";
			return NULL;
		}
	}
	return keyring;
}

/* The record key of an epoch (loading the keys on first need). */
static int
casbox_record_key(struct casbox_store *store, uint32_t epoch,
		  unsigned char key_r[CAS_STORE_KEY_SIZE],
		  const char **error_r)
{
	struct cas_keyring *keyring;
	const char *error;

	if ((keyring = casbox_record_keyring(store, error_r)) == NULL)
		return -1;
	if (cas_keyring_store_key(keyring, CAS_STORE_KEY_RECORD, epoch,
				  key_r, &error) == 1)
		return 0;
	/* a record of an epoch a rotation in another process started
	   after this one loaded the key file: read the file again (one
	   stat() if it did not change) */
	if (epoch > cas_keyring_store_epoch(keyring) &&
	    casbox_store_refresh_keys(store, &error) == 0 &&
	    cas_keyring_store_key(keyring, CAS_STORE_KEY_RECORD, epoch,
				  key_r, &error) == 1)
		return 0;
	*error_r = t_strdup_printf("record key of epoch %u: %s",
				   epoch, error);
	return -1;
}

/* The current epoch and its record key: what new records are MACed
   with. */
int casbox_record_key_current(struct casbox_store *store, uint32_t *epoch_r,
			      unsigned char key_r[CAS_STORE_KEY_SIZE],
			      const char **error_r)
{
	struct cas_keyring *keyring;

	if ((keyring = casbox_record_keyring(store, error_r)) == NULL)
		return -1;
	*epoch_r = cas_keyring_store_epoch(keyring);
	return casbox_record_key(store, *epoch_r, key_r, error_r);
}

static void
casbox_record_mac(const unsigned char key[CAS_STORE_KEY_SIZE],
		  const void *lsm_key, size_t lsm_key_size,
		  const unsigned char header[CASBOX_RECORD_AUTH_HEADER_SIZE],
		  const void *body, size_t body_size,
		  unsigned char mac_r[CASBOX_RECORD_MAC_SIZE])
{
	crypto_generichash_state state;
	unsigned char len[4];

	i_assert(lsm_key_size <= UINT32_MAX);
	cpu32_to_be_unaligned(lsm_key_size, len);
	crypto_generichash_init(&state, key, CAS_STORE_KEY_SIZE,
				CASBOX_RECORD_MAC_SIZE);
	crypto_generichash_update(&state,
				  (const void *)casbox_record_mac_domain,
				  sizeof(casbox_record_mac_domain));
	crypto_generichash_update(&state, len, sizeof(len));
	crypto_generichash_update(&state, lsm_key, lsm_key_size);
	crypto_generichash_update(&state, header,
				  CASBOX_RECORD_AUTH_HEADER_SIZE);
	crypto_generichash_update(&state, body, body_size);
	crypto_generichash_final(&state, mac_r, CASBOX_RECORD_MAC_SIZE);
	sodium_memzero(&state, sizeof(state));
}

int casbox_record_seal(struct casbox_store *store,
		       const void *key, size_t key_size,
		       const void *body, size_t body_size,
		       buffer_t *dest, const char **error_r)
{
	unsigned char rkey[CAS_STORE_KEY_SIZE];
	unsigned char header[CASBOX_RECORD_AUTH_HEADER_SIZE];
	unsigned char mac[CASBOX_RECORD_MAC_SIZE];
	uint32_t epoch;

	/* new records: the current epoch */
	if (casbox_record_key_current(store, &epoch, rkey, error_r) < 0)
		return -1;
	header[0] = CASBOX_RECORD_AUTH_VERSION;
	cpu32_to_be_unaligned(epoch, header + 1);
	casbox_record_mac(rkey, key, key_size, header, body, body_size, mac);
	sodium_memzero(rkey, sizeof(rkey));
	buffer_append(dest, header, sizeof(header));
	buffer_append(dest, body, body_size);
	buffer_append(dest, mac, sizeof(mac));
	return 0;
}

/* The marker ('V') as stored: decoded without the state cache. Returns
   1 found (state_r), 0 none, -1 error. */
static int
casbox_records_marker_get(struct casbox_store *store,
			  enum casbox_records_state *state_r,
			  const char **error_r)
{
	const unsigned char mkey = CASBOX_KEY_RECORDS_VERSION;
	unsigned char rkey[CAS_STORE_KEY_SIZE];
	unsigned char mac[CASBOX_RECORD_MAC_SIZE];
	const unsigned char *v;
	buffer_t *value;
	uint32_t epoch;
	int ret;

	value = t_buffer_create(32);
	ret = casbox_lsm_get(casbox_store_get_lsm(store), &mkey, 1, value,
			     error_r);
	if (ret <= 0)
		return ret;
	v = value->data;
	/* header | u8 1 | u8 state | MAC */
	if (value->used != CASBOX_RECORD_AUTH_OVERHEAD + 2 ||
	    v[0] != CASBOX_RECORD_AUTH_VERSION) {
		*error_r = "records version marker: malformed";
		return -1;
	}
	epoch = be32_to_cpu_unaligned(v + 1);
	if (casbox_record_key(store, epoch, rkey, error_r) < 0)
		return -1;
	casbox_record_mac(rkey, &mkey, 1, v, v + CASBOX_RECORD_AUTH_HEADER_SIZE,
			  2, mac);
	sodium_memzero(rkey, sizeof(rkey));
	if (sodium_memcmp(mac, v + value->used - CASBOX_RECORD_MAC_SIZE,
			  sizeof(mac)) != 0) {
		*error_r = "records version marker: authentication failed";
		return -1;
	}
	switch (v[CASBOX_RECORD_AUTH_HEADER_SIZE + 1]) {
	case CASBOX_RECORDS_MARKER_UPGRADING:
		*state_r = CASBOX_RECORDS_STATE_UPGRADING;
		return 1;
	case CASBOX_RECORDS_MARKER_DONE:
		*state_r = CASBOX_RECORDS_STATE_DONE;
		return 1;
	}
	*error_r = t_strdup_printf("records version marker: unknown state %u",
				   v[CASBOX_RECORD_AUTH_HEADER_SIZE + 1]);
	return -1;
}

int casbox_records_state_read(struct casbox_store *store,
			      enum casbox_records_state *state_r,
			      const char **error_r)
{
	int ret;

	if (casbox_store_get_lsm(store) == NULL) {
		/* rebuild --from-packs writes a new LSM, and that one v2 */
		*state_r = CASBOX_RECORDS_STATE_DONE;
		return 0;
	}
	ret = casbox_records_marker_get(store, state_r, error_r);
	if (ret < 0)
		return -1;
	if (ret == 0)
		*state_r = CASBOX_RECORDS_STATE_V1;
	casbox_store_set_records_state(store, *state_r);
	return 0;
}

static void
casbox_records_marker_export(struct casbox_store *store, uint8_t state,
			     buffer_t *dest, const char **error_r, int *ret_r)
{
	const unsigned char mkey = CASBOX_KEY_RECORDS_VERSION;
	unsigned char body[2] = { CASBOX_RECORD_VERSION, state };

	*ret_r = casbox_record_seal(store, &mkey, 1, body, sizeof(body),
				    dest, error_r);
}

int casbox_records_put_marker_done(struct casbox_store *store,
				   struct casbox_lsm_batch *batch,
				   const char **error_r)
{
	const unsigned char mkey = CASBOX_KEY_RECORDS_VERSION;
	buffer_t *value = t_buffer_create(32);
	int ret;

	casbox_records_marker_export(store, CASBOX_RECORDS_MARKER_DONE,
				     value, error_r, &ret);
	if (ret < 0)
		return -1;
	casbox_lsm_batch_put(batch, &mkey, 1, value->data, value->used);
	return 0;
}

int casbox_records_ensure_marker(struct casbox_store *store,
				 struct casbox_lsm_batch *batch,
				 const char **error_r)
{
	const unsigned char mkey = CASBOX_KEY_RECORDS_VERSION;
	enum casbox_records_state state;
	buffer_t *value;
	bool have_any;
	int ret;

	state = casbox_store_get_records_state(store);
	if (state == CASBOX_RECORDS_STATE_UPGRADING ||
	    state == CASBOX_RECORDS_STATE_DONE)
		return 0;
	/* the write lock is held: what the LSM says now stays so */
	if (casbox_records_state_read(store, &state, error_r) < 0)
		return -1;
	if (state != CASBOX_RECORDS_STATE_V1)
		return 0;
	/* a store without message or flag records (a new one) has nothing
	   to upgrade: "done" right away */
	if (casbox_records_have_any(store, &have_any, error_r) < 0)
		return -1;
	value = t_buffer_create(32);
	casbox_records_marker_export(store, have_any ?
				     CASBOX_RECORDS_MARKER_UPGRADING :
				     CASBOX_RECORDS_MARKER_DONE,
				     value, error_r, &ret);
	if (ret < 0)
		return -1;
	casbox_lsm_batch_put(batch, &mkey, 1, value->data, value->used);
	/* a rollback of the batch leaves the cache claiming the marker:
	   the next commit with a v2 record carries it again only if the
	   cache is reset, so it is not cached here */
	return 0;
}

static const char *casbox_record_key_name(const unsigned char *key,
					  size_t key_size)
{
	guid_128_t guid;
	uint32_t uid;

	if (key_size == 1 + GUID_128_SIZE + 4) {
		memcpy(guid, key + 1, GUID_128_SIZE);
		uid = be32_to_cpu_unaligned(key + 1 + GUID_128_SIZE);
		return t_strdup_printf("%s record of mailbox %s uid %u",
			key[0] == CASBOX_KEY_MESSAGE ? "message" :
			key[0] == CASBOX_KEY_FLAGS ? "flag" :
			key[0] == CASBOX_KEY_RETAINED ? "retained" : "'?'",
			guid_128_to_string(guid), uid);
	}
	if (key_size == 1 + CASBOX_META_ID_SIZE &&
	    (key[0] == CASBOX_KEY_META || key[0] == CASBOX_KEY_META_REFS)) {
		return t_strdup_printf("metadata %srecord %s",
			key[0] == CASBOX_KEY_META_REFS ? "refcount " : "",
			binary_to_hex(key + 1, key_size - 1));
	}
	return t_strdup_printf("record %s", binary_to_hex(key, key_size));
}

int casbox_record_open(struct casbox_store *store,
		       const void *key, size_t key_size,
		       const void *value, size_t value_size,
		       const void **body_r, size_t *body_size_r,
		       bool *authenticated_r, const char **error_r)
{
	unsigned char rkey[CAS_STORE_KEY_SIZE];
	unsigned char mac[CASBOX_RECORD_MAC_SIZE];
	const unsigned char *v = value;
	enum casbox_records_state state;
	const char *error;
	uint32_t epoch;

	*authenticated_r = FALSE;
	if (value_size > 0 && v[0] == CASBOX_RECORD_VERSION) {
		/* v1: only while the store is not upgraded; the cached
		   "done" is final, anything else is read again (another
		   process may have finished an upgrade) */
		state = casbox_store_get_records_state(store);
		if (state != CASBOX_RECORDS_STATE_DONE &&
		    casbox_records_state_read(store, &state, &error) < 0) {
			*error_r = t_strdup_printf("%s: %s",
				casbox_record_key_name(key, key_size), error);
			return -1;
		}
		if (state == CASBOX_RECORDS_STATE_DONE) {
			*error_r = t_strdup_printf(
				"%s: unauthenticated (format v1) record in a "
				"store whose records were upgraded to v2: "
				"written outside casbox",
				casbox_record_key_name(key, key_size));
			return -1;
		}
		*body_r = value;
		*body_size_r = value_size;
		return 1;
	}
	if (value_size < CASBOX_RECORD_AUTH_OVERHEAD ||
	    v[0] != CASBOX_RECORD_AUTH_VERSION) {
		*error_r = t_strdup_printf("%s: %s",
			casbox_record_key_name(key, key_size),
			value_size == 0 ? "empty" : t_strdup_printf(
				"unknown version %u", v[0]));
		return -1;
	}
	epoch = be32_to_cpu_unaligned(v + 1);
	if (casbox_record_key(store, epoch, rkey, &error) < 0) {
		*error_r = t_strdup_printf("%s: %s",
			casbox_record_key_name(key, key_size), error);
		return -1;
	}
	*body_r = v + CASBOX_RECORD_AUTH_HEADER_SIZE;
	*body_size_r = value_size - CASBOX_RECORD_AUTH_OVERHEAD;
	casbox_record_mac(rkey, key, key_size, v, *body_r, *body_size_r, mac);
	sodium_memzero(rkey, sizeof(rkey));
	if (sodium_memcmp(mac, v + value_size - CASBOX_RECORD_MAC_SIZE,
			  sizeof(mac)) != 0) {
		*error_r = t_strdup_printf(
			"%s: authentication failed (the record was modified, "
			"moved from another key or written without the "
			"store's record key)",
			casbox_record_key_name(key, key_size));
		return -1;
	}
	*authenticated_r = TRUE;
	return 1;
}

bool casbox_record_body_unverified(const void *value, size_t value_size,
				   const void **body_r, size_t *body_size_r)
{
	const unsigned char *v = value;

	if (value_size > 0 && v[0] == CASBOX_RECORD_VERSION) {
		*body_r = value;
		*body_size_r = value_size;
		return TRUE;
	}
	if (value_size < CASBOX_RECORD_AUTH_OVERHEAD ||
	    v[0] != CASBOX_RECORD_AUTH_VERSION)
		return FALSE;
	*body_r = v + CASBOX_RECORD_AUTH_HEADER_SIZE;
	*body_size_r = value_size - CASBOX_RECORD_AUTH_OVERHEAD;
	return TRUE;
}

int casbox_store_msg_value_import(struct casbox_store *store,
				  const void *key, size_t key_size,
				  const void *value, size_t value_size,
				  pool_t pool, struct casbox_msg_record *rec_r,
				  const char **error_r)
{
	const void *body;
	size_t body_size;
	bool authenticated;

	if (casbox_record_open(store, key, key_size, value, value_size,
			       &body, &body_size, &authenticated,
			       error_r) < 0)
		return -1;
	return casbox_msg_record_import(body, body_size, pool, rec_r,
					error_r);
}

int casbox_store_msg_value_export(struct casbox_store *store,
				  const buffer_t *key,
				  const struct casbox_msg_record *rec,
				  buffer_t *dest, const char **error_r)
{
	buffer_t *body = t_buffer_create(256);

	casbox_msg_record_export(rec, body);
	return casbox_record_seal(store, key->data, key->used,
				  body->data, body->used, dest, error_r);
}

int casbox_store_flags_value_import(struct casbox_store *store,
				    const void *key, size_t key_size,
				    const void *value, size_t value_size,
				    pool_t pool, struct casbox_msg_record *rec,
				    const char **error_r)
{
	const void *body;
	size_t body_size;
	bool authenticated;

	if (casbox_record_open(store, key, key_size, value, value_size,
			       &body, &body_size, &authenticated,
			       error_r) < 0)
		return -1;
	return casbox_flags_record_import(body, body_size, pool, rec,
					  error_r);
}

int casbox_store_retained_value_import(struct casbox_store *store,
				       const void *key, size_t key_size,
				       const void *value, size_t value_size,
				       pool_t pool,
				       struct casbox_retained_record *rec_r,
				       const char **error_r)
{
	const void *body;
	size_t body_size;
	bool authenticated;

	if (casbox_record_open(store, key, key_size, value, value_size,
			       &body, &body_size, &authenticated,
			       error_r) < 0)
		return -1;
	return casbox_retained_record_import(body, body_size, pool, rec_r,
					     error_r);
}

int casbox_store_retained_value_export(struct casbox_store *store,
				       const buffer_t *key,
				       const struct casbox_retained_record *rec,
				       buffer_t *dest, const char **error_r)
{
	buffer_t *body = t_buffer_create(256);

	casbox_retained_record_export(rec, body);
	return casbox_record_seal(store, key->data, key->used,
				  body->data, body->used, dest, error_r);
}

int casbox_store_flags_value_export(struct casbox_store *store,
				    const buffer_t *key, uint32_t flags,
				    uint64_t modseq,
				    const char *const *keywords,
				    buffer_t *dest, const char **error_r)
{
	buffer_t *body = t_buffer_create(64);

	casbox_flags_record_export(flags, modseq, keywords, body);
	return casbox_record_seal(store, key->data, key->used,
				  body->data, body->used, dest, error_r);
}

static const char casbox_meta_id_domain[16] = "casbox meta id 1";

int casbox_store_meta_id(struct casbox_store *store,
			 const struct casbox_msg_record *rec,
			 unsigned char id_r[CASBOX_META_ID_SIZE],
			 const char **error_r)
{
	unsigned char rkey[CAS_STORE_KEY_SIZE];
	const struct casbox_msg_part *part;
	crypto_generichash_state state;
	buffer_t *enc;
	uint32_t epoch;

	if (casbox_record_key_current(store, &epoch, rkey, error_r) < 0)
		return -1;
	/* canonical: what the sealed metadata's AAD binds (every part's
	   blob id and size) and how each part is stored */
	enc = t_buffer_create(64 + array_count(&rec->parts) * 56);
	buffer_append(enc, casbox_meta_id_domain,
		      sizeof(casbox_meta_id_domain));
	wr_u32(enc, epoch);
	wr_u32(enc, array_count(&rec->parts));
	array_foreach(&rec->parts, part) {
		buffer_append(enc, part->id.id, sizeof(part->id.id));
		wr_u64(enc, part->size);
		wr_u8(enc, part->transform);
		wr_u8(enc, (part->b64.crlf ? 1 : 0) |
		      (part->b64.final_newline ? 2 : 0));
		wr_u16(enc, part->b64.line_len);
		wr_u64(enc, part->stored_size);
	}
	crypto_generichash_init(&state, rkey, sizeof(rkey),
				CASBOX_META_ID_SIZE);
	crypto_generichash_update(&state, enc->data, enc->used);
	crypto_generichash_final(&state, id_r, CASBOX_META_ID_SIZE);
	sodium_memzero(&state, sizeof(state));
	sodium_memzero(rkey, sizeof(rkey));
	return 0;
}

/* A v2-only record (no v1 of it ever existed): verified body. */
static int
casbox_record_open_v2(struct casbox_store *store,
		      const void *key, size_t key_size,
		      const void *value, size_t value_size,
		      const void **body_r, size_t *body_size_r,
		      const char **error_r)
{
	bool authenticated;

	if (casbox_record_open(store, key, key_size, value, value_size,
			       body_r, body_size_r, &authenticated,
			       error_r) < 0)
		return -1;
	if (!authenticated) {
		*error_r = t_strdup_printf("%s: not authenticated",
			casbox_record_key_name(key, key_size));
		return -1;
	}
	return 1;
}

int casbox_store_meta_refs_import(struct casbox_store *store,
				  const void *key, size_t key_size,
				  const void *value, size_t value_size,
				  uint32_t *refcount_r, const char **error_r)
{
	const void *body;
	size_t body_size;

	if (casbox_record_open_v2(store, key, key_size, value, value_size,
				  &body, &body_size, error_r) < 0)
		return -1;
	return casbox_meta_refs_import(body, body_size, refcount_r, error_r);
}

int casbox_store_meta_refs_export(struct casbox_store *store,
				  const buffer_t *key, uint32_t refcount,
				  buffer_t *dest, const char **error_r)
{
	buffer_t *body = t_buffer_create(8);

	casbox_meta_refs_export(refcount, body);
	return casbox_record_seal(store, key->data, key->used,
				  body->data, body->used, dest, error_r);
}

int casbox_store_meta_value_import(struct casbox_store *store,
				   const void *key, size_t key_size,
				   const void *value, size_t value_size,
				   const unsigned char **sealed_r,
				   size_t *sealed_size_r,
				   const char **error_r)
{
	const void *body;
	size_t body_size;

	if (casbox_record_open_v2(store, key, key_size, value, value_size,
				  &body, &body_size, error_r) < 0)
		return -1;
	return casbox_meta_record_import(body, body_size, sealed_r,
					 sealed_size_r, error_r);
}

int casbox_store_meta_value_export(struct casbox_store *store,
				   const buffer_t *key,
				   const void *sealed, size_t sealed_size,
				   buffer_t *dest, const char **error_r)
{
	buffer_t *body = t_buffer_create(sealed_size + 8);

	casbox_meta_record_export(sealed, sealed_size, body);
	return casbox_record_seal(store, key->data, key->used,
				  body->data, body->used, dest, error_r);
}

int casbox_store_meta_resolve(struct casbox_store *store, pool_t pool,
			      struct casbox_msg_record *rec,
			      const char **error_r)
{
	const unsigned char *sealed;
	buffer_t *key, *value;
	size_t sealed_size;
	int ret;

	if (!rec->meta_ref || rec->sealed_meta_size > 0)
		return 0;
	key = t_buffer_create(40);
	casbox_key_meta(key, rec->meta_id);
	value = t_buffer_create(2048);
	ret = casbox_lsm_get(casbox_store_get_lsm(store), key->data,
			     key->used, value, error_r);
	if (ret <= 0) {
		/* missing: the metadata is derived data, reads parse the
		   message (scrub reports the missing record) */
		return ret;
	}
	if (casbox_store_meta_value_import(store, key->data, key->used,
					   value->data, value->used,
					   &sealed, &sealed_size,
					   error_r) < 0)
		return -1;
	rec->sealed_meta = p_memdup(pool, sealed, sealed_size);
	rec->sealed_meta_size = sealed_size;
	return 0;
}

/* Upgrade */

struct casbox_records_upgrade_item {
	buffer_t *key, *value;
};

/* Is there any 'm' or 'f' record at all? Returns 0 ok, -1 error. */
static int
casbox_records_have_any(struct casbox_store *store, bool *have_r,
			const char **error_r)
{
	static const unsigned char prefixes[] = {
		CASBOX_KEY_FLAGS, CASBOX_KEY_MESSAGE, CASBOX_KEY_RETAINED
	};
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	unsigned int i;

	*have_r = FALSE;
	for (i = 0; i < N_ELEMENTS(prefixes) && !*have_r; i++) {
		iter = casbox_lsm_iter_init(casbox_store_get_lsm(store),
					    &prefixes[i], 1);
		if (casbox_lsm_iter_next(iter, &key, &key_size,
					 &value, &value_size))
			*have_r = TRUE;
		if (casbox_lsm_iter_deinit(&iter, error_r) < 0)
			return -1;
	}
	return 0;
}

/* Is there any v2 'm' or 'f' record? Returns 0 ok, -1 error. */
static int
casbox_records_have_v2(struct casbox_store *store, bool *have_r,
		       const char **error_r)
{
	static const unsigned char prefixes[] = {
		CASBOX_KEY_FLAGS, CASBOX_KEY_MESSAGE, CASBOX_KEY_RETAINED
	};
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	unsigned int i;

	*have_r = FALSE;
	for (i = 0; i < N_ELEMENTS(prefixes) && !*have_r; i++) {
		iter = casbox_lsm_iter_init(casbox_store_get_lsm(store),
					    &prefixes[i], 1);
		while (casbox_lsm_iter_next(iter, &key, &key_size,
					    &value, &value_size)) {
			if (value_size > 0 &&
			    value[0] == CASBOX_RECORD_AUTH_VERSION) {
				*have_r = TRUE;
				break;
			}
		}
		if (casbox_lsm_iter_deinit(&iter, error_r) < 0)
			return -1;
	}
	return 0;
}

/* Begin: the marker, under the write lock. Returns 1 upgrade the
   records, 0 nothing to do, -1 error. */
static int
casbox_records_upgrade_begin(struct casbox_store *store,
			     struct casbox_records_upgrade_stats *stats,
			     const char **error_r)
{
	struct casbox_lsm_batch *batch;
	enum casbox_records_state state;
	bool have_v2;

	if (casbox_lsm_batch_begin(casbox_store_get_lsm(store), &batch,
				   error_r) < 0)
		return -1;
	if (casbox_records_state_read(store, &state, error_r) < 0) {
		casbox_lsm_batch_rollback(&batch);
		return -1;
	}
	if (state != CASBOX_RECORDS_STATE_V1) {
		casbox_lsm_batch_rollback(&batch);
		return state == CASBOX_RECORDS_STATE_DONE ? 0 : 1;
	}
	if (casbox_records_have_v2(store, &have_v2, error_r) < 0) {
		casbox_lsm_batch_rollback(&batch);
		return -1;
	}
	if (have_v2) {
		/* v2 records are never written without the marker: it was
		   deleted. Upgrading now would authenticate whatever v1
		   records someone put in its place. */
		i_error("casbox: store %s: the records version marker is "
			"missing although authenticated (v2) records exist: "
			"someone deleted it; v1 records there are not "
			"upgraded and are refused from now on (doveadm "
			"casbox scrub names them)",
			casbox_store_get_root(store));
		stats->marker_was_missing = TRUE;
		if (casbox_records_put_marker_done(store, batch,
						   error_r) < 0) {
			casbox_lsm_batch_rollback(&batch);
			return -1;
		}
		if (casbox_lsm_batch_commit(&batch, error_r) < 0)
			return -1;
		casbox_store_set_records_state(store,
					       CASBOX_RECORDS_STATE_DONE);
		return 0;
	}
	if (casbox_records_ensure_marker(store, batch, error_r) < 0) {
		casbox_lsm_batch_rollback(&batch);
		return -1;
	}
	if (casbox_lsm_batch_commit(&batch, error_r) < 0)
		return -1;
	casbox_store_set_records_state(store, CASBOX_RECORDS_STATE_UPGRADING);
	return 1;
}

/* Does a v1 record of the kind decode? Returns 1 yes, -1 no. */
static int
casbox_records_upgrade_check(unsigned char prefix, const void *body,
			     size_t body_size, struct casbox_msg_record *rec,
			     const char **error_r)
{
	struct casbox_retained_record rrec;
	pool_t pool = pool_datastack_create();

	switch (prefix) {
	case CASBOX_KEY_MESSAGE:
		return casbox_msg_record_import(body, body_size, pool, rec,
						error_r);
	case CASBOX_KEY_FLAGS:
		casbox_msg_record_init(pool, rec);
		return casbox_flags_record_import(body, body_size, pool, rec,
						  error_r);
	case CASBOX_KEY_RETAINED:
		return casbox_retained_record_import(body, body_size, pool,
						     &rrec, error_r);
	}
	i_unreached();
}

/* One batch: up to CASBOX_RECORDS_UPGRADE_BATCH v1 records at or after
   resume (a key; updated to the last one looked at) under prefix.
   Returns 1 more may follow, 0 the prefix is done, -1 error. */
static int
casbox_records_upgrade_batch(struct casbox_store *store,
			     unsigned char prefix, buffer_t *resume,
			     struct casbox_records_upgrade_stats *stats,
			     const char **error_r)
{
	struct casbox_lsm_batch *batch;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	struct casbox_msg_record rec;
	const void *body;
	size_t body_size;
	buffer_t *sealed;
	const char *error;
	unsigned int n = 0;
	bool more = FALSE, authenticated;
	int ret = 0;

	if (casbox_lsm_batch_begin(casbox_store_get_lsm(store), &batch,
				   error_r) < 0)
		return -1;
	iter = casbox_lsm_iter_init(casbox_store_get_lsm(store), &prefix, 1);
	if (resume->used > 0)
		casbox_lsm_iter_seek(iter, resume->data, resume->used);
	while (ret == 0 && casbox_lsm_iter_next(iter, &key, &key_size,
						&value, &value_size)) {
		if (resume->used == key_size &&
		    memcmp(resume->data, key, key_size) == 0)
			continue;
		if (n == CASBOX_RECORDS_UPGRADE_BATCH) {
			more = TRUE;
			break;
		}
		buffer_set_used_size(resume, 0);
		buffer_append(resume, key, key_size);
		if (value_size > 0 && value[0] == CASBOX_RECORD_AUTH_VERSION) {
			stats->already++;
			continue;
		}
		T_BEGIN {
			/* decodes as a v1 record of its kind, or stays */
			if (casbox_record_open(store, key, key_size, value,
					       value_size, &body, &body_size,
					       &authenticated, &error) < 0 ||
			    casbox_records_upgrade_check(prefix, body,
							 body_size, &rec,
							 &error) < 0) {
				stats->malformed++;
			} else {
				sealed = t_buffer_create(body_size +
					CASBOX_RECORD_AUTH_OVERHEAD);
				if (casbox_record_seal(store, key, key_size,
						       body, body_size,
						       sealed, &error) < 0) {
					*error_r = t_strdup(error);
					ret = -1;
				} else {
					casbox_lsm_batch_put(batch, key,
						key_size, sealed->data,
						sealed->used);
					stats->upgraded++;
					n++;
				}
			}
		} T_END;
	}
	if (casbox_lsm_iter_deinit(&iter, &error) < 0 && ret == 0) {
		*error_r = error;
		ret = -1;
	}
	if (ret < 0) {
		casbox_lsm_batch_rollback(&batch);
		return -1;
	}
	if (n == 0) {
		casbox_lsm_batch_rollback(&batch);
		return more ? 1 : 0;
	}
	if (casbox_lsm_batch_commit(&batch, error_r) < 0)
		return -1;
	stats->batches++;
	return more ? 1 : 0;
}

int casbox_records_upgrade_needed(struct casbox_store *store, bool *needed_r,
				  const char **error_r)
{
	enum casbox_records_state state;
	bool have_any;

	/* the view as of the open (no refresh): a store another process
	   upgraded since looks "needed" and casbox_records_upgrade() finds
	   it done under the lock */
	*needed_r = FALSE;
	if (casbox_records_state_read(store, &state, error_r) < 0)
		return -1;
	if (state == CASBOX_RECORDS_STATE_DONE)
		return 0;
	if (state == CASBOX_RECORDS_STATE_UPGRADING) {
		*needed_r = TRUE;
		return 0;
	}
	if (casbox_records_have_any(store, &have_any, error_r) < 0)
		return -1;
	*needed_r = have_any;
	return 0;
}

int casbox_records_upgrade(struct casbox_store *store,
			   casbox_records_upgrade_progress_t *progress,
			   void *context,
			   struct casbox_records_upgrade_stats *stats_r,
			   const char **error_r)
{
	static const unsigned char prefixes[] = {
		CASBOX_KEY_FLAGS, CASBOX_KEY_MESSAGE, CASBOX_KEY_RETAINED
	};
	struct casbox_lsm_batch *batch;
	enum casbox_records_state state;
	buffer_t *resume;
	unsigned int i;
	int ret;

	i_zero(stats_r);
	/* not casbox_store_open_keys(): that would run the upgrade on
	   open before this one */
	if (casbox_store_get_keyring(store) == NULL &&
	    casbox_store_open_keys_for_records(store, error_r) < 0)
		return -1;
	ret = casbox_records_upgrade_begin(store, stats_r, error_r);
	if (ret <= 0)
		return ret;
	/* grows inside the batches' data stack frames: not a t_buffer */
	resume = buffer_create_dynamic(default_pool, 64);
	for (i = 0; i < N_ELEMENTS(prefixes); i++) {
		buffer_set_used_size(resume, 0);
		do {
			T_BEGIN {
				ret = casbox_records_upgrade_batch(store,
					prefixes[i], resume, stats_r,
					error_r);
			} T_END_PASS_STR_IF(ret < 0, error_r);
			if (ret < 0) {
				buffer_free(&resume);
				return -1;
			}
			if (progress != NULL)
				progress(context, stats_r);
		} while (ret > 0);
	}
	buffer_free(&resume);
	/* done: v1 records are refused from now on. Checked once more
	   under the lock: the marker is still ours to finish. */
	if (casbox_lsm_batch_begin(casbox_store_get_lsm(store), &batch,
				   error_r) < 0)
		return -1;
	if (casbox_records_state_read(store, &state, error_r) < 0 ||
	    (state != CASBOX_RECORDS_STATE_DONE &&
	     casbox_records_put_marker_done(store, batch, error_r) < 0)) {
		casbox_lsm_batch_rollback(&batch);
		return -1;
	}
	if (state == CASBOX_RECORDS_STATE_DONE) {
		casbox_lsm_batch_rollback(&batch);
		return 0;
	}
	if (casbox_lsm_batch_commit(&batch, error_r) < 0)
		return -1;
	casbox_store_set_records_state(store, CASBOX_RECORDS_STATE_DONE);
	return 0;
}
