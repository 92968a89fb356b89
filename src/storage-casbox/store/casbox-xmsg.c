/* casbox-xmsg: the Message-ID and sender maps of cross-message
   compression (casbox-xmsg.h). */

#include "lib.h"
#include "buffer.h"
#include "hash.h"
#include "hex-binary.h"
#include "casbox-lsm.h"
#include "casbox-store.h"
#include "casbox-record-auth.h"
#include "casbox-xmsg.h"

#include <sodium.h>

static const char casbox_xmsg_domain[] = "casbox-xmsg1";

struct casbox_xmsg_txn {
	pool_t pool;
	/* LSM key (hex) -> blob id, written by this transaction */
	HASH_TABLE(char *, struct cas_blob_id *) puts;
};

struct casbox_xmsg_txn *casbox_xmsg_txn_create(void)
{
	struct casbox_xmsg_txn *xtxn;
	pool_t pool;

	pool = pool_alloconly_create("casbox xmsg txn", 1024);
	xtxn = p_new(pool, struct casbox_xmsg_txn, 1);
	xtxn->pool = pool;
	hash_table_create(&xtxn->puts, pool, 0, str_hash, strcmp);
	return xtxn;
}

void casbox_xmsg_txn_destroy(struct casbox_xmsg_txn **_xtxn)
{
	struct casbox_xmsg_txn *xtxn = *_xtxn;

	if (xtxn == NULL)
		return;
	*_xtxn = NULL;
	hash_table_destroy(&xtxn->puts);
	pool_unref(&xtxn->pool);
}

int casbox_xmsg_key(struct casbox_store *store, enum casbox_xmsg_kind kind,
		    const char *str, buffer_t *key, const char **error_r)
{
	unsigned char rkey[CAS_STORE_KEY_SIZE];
	unsigned char hash[CASBOX_XMSG_HASH_SIZE];
	crypto_generichash_state state;
	unsigned char kind_byte = kind;
	uint32_t epoch;

	if (casbox_record_key_current(store, &epoch, rkey, error_r) < 0)
		return -1;
	crypto_generichash_init(&state, rkey, sizeof(rkey), sizeof(hash));
	/* the NUL too: the domain ends before the kind */
	crypto_generichash_update(&state, (const void *)casbox_xmsg_domain,
				  sizeof(casbox_xmsg_domain));
	crypto_generichash_update(&state, &kind_byte, 1);
	crypto_generichash_update(&state, (const void *)str, strlen(str));
	crypto_generichash_final(&state, hash, sizeof(hash));
	sodium_memzero(&state, sizeof(state));
	sodium_memzero(rkey, sizeof(rkey));
	buffer_append_c(key, CASBOX_KEY_XMSG);
	buffer_append_c(key, kind_byte);
	buffer_append(key, hash, sizeof(hash));
	return 0;
}

int casbox_xmsg_value_import(struct casbox_store *store,
			     const void *key, size_t key_size,
			     const void *value, size_t value_size,
			     struct cas_blob_id *id_r, const char **error_r)
{
	const unsigned char *body;
	const void *bodyp;
	size_t body_size;
	bool authenticated;

	if (casbox_record_open(store, key, key_size, value, value_size,
			       &bodyp, &body_size, &authenticated,
			       error_r) < 0)
		return -1;
	body = bodyp;
	if (!authenticated) {
		*error_r = "cross-message record is not authenticated";
		return -1;
	}
	if (body_size != 1 + CAS_BLOB_ID_SIZE) {
		*error_r = t_strdup_printf("cross-message record: %zu bytes, "
			"expected %u", body_size, 1 + CAS_BLOB_ID_SIZE);
		return -1;
	}
	if (body[0] != CASBOX_XMSG_RECORD_VERSION) {
		*error_r = t_strdup_printf("cross-message record: unknown "
					   "version %u", body[0]);
		return -1;
	}
	memcpy(id_r->id, body + 1, CAS_BLOB_ID_SIZE);
	return 1;
}

/* Returns 1 found, 0 not, -1 error. */
static int
casbox_xmsg_lookup(struct casbox_xmsg_txn *xtxn, struct casbox_store *store,
		   enum casbox_xmsg_kind kind, const char *str,
		   struct cas_blob_id *id_r, const char **error_r)
{
	const struct cas_blob_id *pending;
	buffer_t *key, *value;
	int ret;

	key = t_buffer_create(CASBOX_XMSG_KEY_SIZE);
	if (casbox_xmsg_key(store, kind, str, key, error_r) < 0)
		return -1;
	pending = hash_table_lookup(xtxn->puts,
				    binary_to_hex(key->data, key->used));
	if (pending != NULL) {
		*id_r = *pending;
		return 1;
	}
	value = t_buffer_create(96);
	ret = casbox_lsm_get(casbox_store_get_lsm(store), key->data,
			     key->used, value, error_r);
	if (ret <= 0)
		return ret;
	return casbox_xmsg_value_import(store, key->data, key->used,
					value->data, value->used, id_r,
					error_r);
}

int casbox_xmsg_candidates(struct casbox_xmsg_txn *xtxn,
			   struct casbox_store *store,
			   const struct casbox_xmsg_hints *hints,
			   struct cas_blob_id ids_r[2], const char **error_r)
{
	int ret, count = 0;

	if (hints->parent_id != NULL) {
		ret = casbox_xmsg_lookup(xtxn, store,
					 CASBOX_XMSG_KIND_MESSAGE_ID,
					 hints->parent_id, &ids_r[0], error_r);
		if (ret < 0)
			return -1;
		count += ret;
	}
	if (hints->sender != NULL) {
		ret = casbox_xmsg_lookup(xtxn, store, CASBOX_XMSG_KIND_SENDER,
					 hints->sender, &ids_r[count], error_r);
		if (ret < 0)
			return -1;
		if (ret > 0 && (count == 0 ||
				memcmp(ids_r[0].id, ids_r[1].id,
				       CAS_BLOB_ID_SIZE) != 0))
			count++;
	}
	return count;
}

static int
casbox_xmsg_put_one(struct casbox_xmsg_txn *xtxn, struct casbox_store *store,
		    struct casbox_lsm_batch *batch,
		    enum casbox_xmsg_kind kind, const char *str,
		    const struct cas_blob_id *lead, const char **error_r)
{
	struct cas_blob_id *id;
	buffer_t *key, *body, *value;
	char *hex;

	key = t_buffer_create(CASBOX_XMSG_KEY_SIZE);
	if (casbox_xmsg_key(store, kind, str, key, error_r) < 0)
		return -1;
	body = t_buffer_create(1 + CAS_BLOB_ID_SIZE);
	buffer_append_c(body, CASBOX_XMSG_RECORD_VERSION);
	buffer_append(body, lead->id, sizeof(lead->id));
	value = t_buffer_create(body->used + CASBOX_RECORD_AUTH_OVERHEAD);
	if (casbox_record_seal(store, key->data, key->used, body->data,
			       body->used, value, error_r) < 0)
		return -1;
	casbox_lsm_batch_put(batch, key->data, key->used,
			     value->data, value->used);
	hex = p_strdup(xtxn->pool, binary_to_hex(key->data, key->used));
	id = hash_table_lookup(xtxn->puts, hex);
	if (id == NULL) {
		id = p_new(xtxn->pool, struct cas_blob_id, 1);
		hash_table_insert(xtxn->puts, hex, id);
	}
	*id = *lead;
	return 0;
}

int casbox_xmsg_put(struct casbox_xmsg_txn *xtxn, struct casbox_store *store,
		    struct casbox_lsm_batch *batch,
		    const struct casbox_xmsg_hints *hints,
		    const struct cas_blob_id *lead, const char **error_r)
{
	if (hints->message_id != NULL &&
	    casbox_xmsg_put_one(xtxn, store, batch,
				CASBOX_XMSG_KIND_MESSAGE_ID,
				hints->message_id, lead, error_r) < 0)
		return -1;
	if (hints->sender != NULL &&
	    casbox_xmsg_put_one(xtxn, store, batch, CASBOX_XMSG_KIND_SENDER,
				hints->sender, lead, error_r) < 0)
		return -1;
	return 0;
}
