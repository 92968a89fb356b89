/* casbox-store: LSM + key ring + packs of one user. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "hash.h"
#include "byteorder.h"
#include "istream.h"
#include "istream-concat.h"
#include "safe-memset.h"
#include "cas-keymode.h"
#include "cas-secmem.h"
#include "casbox-pack.h"
#include "casbox-lsm.h"
#include "casbox-settings.h"
#include "casbox-recovery.h"
#include "casbox-store.h"
#include "casbox-store-safety.h"
#include "casbox-record-auth.h"
#include "casbox-base-cache.h"
#include "casbox-xmsg.h"

#include <dirent.h>
#include <fcntl.h>
#include <sodium.h>

struct casbox_store {
	pool_t pool;
	const char *root_dir;
	const struct casbox_settings *set;
	bool fsync, fsync_always;
	enum file_lock_method lock_method;

	struct casbox_lsm *lsm;
	/* in server key mode the same ring as lsm_keyring, once loaded */
	struct cas_keyring *keyring;
	/* the key ring the LSM is sealed with: loaded before the LSM is
	   opened, without the password in password mode (the LSM key is
	   server-held in both modes); lsm_codec hands its keys to the LSM */
	struct cas_keyring *lsm_keyring;
	struct casbox_lsm_codec lsm_codec;
	/* opened with casbox_store_open_nolsm() */
	bool nolsm;
	/* why unlocking the password-mode key failed: not retried, since
	   every try costs an Argon2id run and gives the same answer */
	const char *unlock_error;
	struct casbox_pack_store *packs;
	struct casbox_store_stats stats;
	/* opened without its LSM (casbox_store_open_nolsm()): the password
	   for the key (not owned), NULL: the settings' */
	const char *nolsm_password;

	/* records v2 (casbox-record-auth.h): the marker as last read */
	enum casbox_records_state records_state;
	/* open transactions (the upgrade on open is not run inside one),
	   and a key load for a record read (nor inside that) */
	unsigned int txns_open;
	bool no_records_upgrade;
	/* casbox_store_keep_read_fd() */
	bool keep_read_fd;
	/* keep_read_fd: a read checked the key file since the last
	   casbox_store_release_read_fd() */
	bool read_keys_checked;
};

/* A blob touched by a transaction: its current refcount and location. */
struct casbox_pending_blob {
	struct cas_blob_id id;
	uint32_t refcount;
	bool in_lsm;
	/* the last reference wrote its bytes (counted as written) */
	bool last_written;
	/* refcount 0 at commit: its base's reference was dropped */
	bool base_released;
	/* this transaction appended the blob's frame; a recovery record of
	   it already carries the DEK (casbox_store_txn_recovery_blobs()) */
	bool frame_written, dek_recorded;
	buffer_t *pack_record;
};

/* A shared metadata record touched by a transaction: its refcount
   ('r'), and the sealed bytes only when this transaction creates it
   ('s' is written once). */
struct casbox_pending_meta {
	/* the meta id (CASBOX_META_ID_SIZE == CAS_BLOB_ID_SIZE) */
	struct cas_blob_id id;
	uint32_t refcount, old_refcount;
	bool in_lsm;
	/* NULL unless created here */
	buffer_t *sealed;
};

struct casbox_store_txn {
	struct casbox_store *store;
	pool_t pool;
	struct casbox_lsm_batch *batch;
	struct casbox_pack_txn *pack_txn;
	/* the blobs touched since the last commit (or checkpoint) */
	pool_t blob_pool;
	HASH_TABLE(struct cas_blob_id *, struct casbox_pending_blob *) blobs;
	ARRAY(struct casbox_pending_blob *) blob_list;
	/* the shared metadata records touched since the last commit */
	HASH_TABLE(struct cas_blob_id *, struct casbox_pending_meta *) metas;
	ARRAY(struct casbox_pending_meta *) meta_list;
	size_t meta_bytes;

	/* commit without fsync (casbox_store_txn_set_lazy()) */
	bool lazy;
	/* committed in pieces (casbox_store_txn_checkpoint()) */
	bool checkpointed;
	/* both key rings were refreshed under the current write lock hold
	   (by casbox_store_txn_begin(); a checkpoint relocks) */
	bool keys_current;
	/* the mailbox of the messages added: recovery records are written
	   only when it is known */
	bool have_recovery_mailbox;
	guid_128_t recovery_mailbox_guid, recovery_public_guid;
	struct casbox_mailbox_record recovery_mailbox;
	/* the copies added since the last pack commit, for one copy
	   record (casbox_copy_record_body_add(); NULL = none yet) */
	buffer_t *copy_body;

	/* cross-message compression (casbox-xmsg.h): the next added
	   message's hints (NULL = none) and what this txn mapped */
	const struct casbox_xmsg_hints *hints;
	struct casbox_xmsg_txn *xmsg;
};

static int casbox_store_upgrade_lsm(struct casbox_store *store,
				    const char **error_r);
static int casbox_store_check_key_id(struct casbox_store *store,
				     const char **error_r);

static int
casbox_store_lsm_get(struct casbox_store *store, const buffer_t *key,
		     buffer_t *value, bool refresh, const char **error_r)
{
	int ret;

	ret = casbox_lsm_get(store->lsm, key->data, key->used, value,
			     error_r);
	if (ret != 0 || !refresh)
		return ret;
	/* maybe another process just wrote it */
	if (casbox_lsm_refresh(store->lsm, error_r) < 0)
		return -1;
	return casbox_lsm_get(store->lsm, key->data, key->used, value,
			      error_r);
}

static struct casbox_store *
casbox_store_alloc(const char *root_dir, const struct casbox_settings *set,
		   enum fsync_mode fsync_mode,
		   enum file_lock_method lock_method)
{
	struct casbox_store *store;
	pool_t pool;

	pool = pool_alloconly_create("casbox store", 512);
	store = p_new(pool, struct casbox_store, 1);
	store->pool = pool;
	store->root_dir = p_strdup(pool, root_dir);
	store->set = set;
	store->fsync = fsync_mode != FSYNC_MODE_NEVER;
	store->fsync_always = fsync_mode == FSYNC_MODE_ALWAYS;
	store->lock_method = lock_method;
	return store;
}

void casbox_store_open_nolsm(const char *root_dir,
			     const struct casbox_settings *set,
			     enum fsync_mode fsync_mode,
			     enum file_lock_method lock_method,
			     struct casbox_store **store_r)
{
	*store_r = casbox_store_alloc(root_dir, set, fsync_mode, lock_method);
	(*store_r)->nolsm = TRUE;
}

void casbox_store_set_key_password(struct casbox_store *store,
				   const char *password)
{
	i_assert(store->nolsm);
	store->nolsm_password = password;
}

int casbox_store_open(const char *root_dir,
		      const struct casbox_settings *set,
		      enum fsync_mode fsync_mode,
		      enum file_lock_method lock_method,
		      struct casbox_store **store_r, const char **error_r)
{
	struct casbox_lsm_settings lsm_set;
	struct casbox_store *store;
	const char *error;
	int ret;

	store = casbox_store_alloc(root_dir, set, fsync_mode, lock_method);
	/* the key first: the LSM is sealed with it (a missing key is
	   created here for a store without data, as before) */
	if (casbox_store_lsm_settings(store, t_strconcat(root_dir, "/lsm",
							  NULL),
				      &lsm_set, error_r) < 0) {
		casbox_store_close(&store);
		return -1;
	}
	lsm_set.wal_flush_bytes = set->lsm_wal_size;
	ret = casbox_store_lsm_open(store, &lsm_set, &store->lsm, &error);
	if (ret < 0) {
		/* the LSM's own errors name a file of it, but scrub looks
		   for "LSM <dir>: Corrupted ..." */
		*error_r = ret == -2 ? error :
			t_strdup_printf("LSM %s: %s", lsm_set.dir, error);
		casbox_store_close(&store);
		return -1;
	}
	if (!casbox_lsm_is_sealed(store->lsm) &&
	    casbox_store_upgrade_lsm(store, error_r) < 0) {
		casbox_store_close(&store);
		return -1;
	}
	*store_r = store;
	return 0;
}

int casbox_store_maintenance_lock(struct casbox_store *store, bool exclusive,
				  unsigned int timeout_secs,
				  struct file_lock **lock_r,
				  const char **error_r)
{
	struct file_lock_settings lock_set = {
		/* a dotlock cannot be shared: fcntl then */
		.lock_method = store->lock_method == FILE_LOCK_METHOD_DOTLOCK ?
			FILE_LOCK_METHOD_FCNTL : store->lock_method,
		.close_on_free = TRUE,
	};
	const char *path, *error;
	int fd, ret;

	path = t_strconcat(store->root_dir, "/"CASBOX_STORE_MAINTENANCE_LOCK,
			   NULL);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	ret = file_wait_lock(fd, path, exclusive ? F_WRLCK : F_RDLCK,
			     &lock_set, timeout_secs, lock_r, &error);
	if (ret <= 0) {
		i_close_fd(&fd);
		*error_r = ret < 0 ? error : t_strdup_printf(
			"%s is still locked after %u s by another gc or "
			"scrub of this store", path, timeout_secs);
	}
	return ret;
}

void casbox_store_free_pools(void)
{
	casbox_base_pool_free();
	cas_secmem_pool_deinit();
}

/* The store's key ring, which in server mode is the LSM's itself
   (casbox_store_load_keyring()): then only forgotten here, freed with
   the LSM's. */
static void casbox_store_keyring_free(struct casbox_store *store)
{
	if (store->keyring == store->lsm_keyring)
		store->keyring = NULL;
	else if (store->keyring != NULL)
		cas_keyring_free(&store->keyring);
}

void casbox_store_close(struct casbox_store **_store)
{
	struct casbox_store *store = *_store;

	*_store = NULL;
	if (store->packs != NULL)
		casbox_pack_store_close(&store->packs);
	casbox_store_keyring_free(store);
	if (store->lsm != NULL)
		casbox_lsm_close(&store->lsm);
	/* after the LSM: its codec uses it */
	if (store->lsm_keyring != NULL)
		cas_keyring_free(&store->lsm_keyring);
	safe_memset(store->lsm_codec.fingerprint, 0,
		    sizeof(store->lsm_codec.fingerprint));
	pool_unref(&store->pool);
}

int casbox_store_has_data(struct casbox_store *store, bool *have_r,
			  const char **error_r)
{
	struct casbox_lsm_info info;
	const char *path, *error;
	struct dirent *d;
	DIR *dir;
	int ret;

	/* without the key: what the MANIFEST says in plaintext. A sealed
	   LSM is bound to its key (the MANIFEST names its fingerprint);
	   a format-1 one has data when it has a table or WAL records (its
	   'K' record, the first thing written, is one). */
	*have_r = FALSE;
	path = t_strconcat(store->root_dir, "/lsm", NULL);
	ret = casbox_lsm_peek(path, &info, &error);
	if (ret < 0) {
		*error_r = t_strdup_printf("LSM %s: %s", path, error);
		return -1;
	}
	if (ret > 0 && (info.sealed || info.tables > 0 ||
			info.wal_record_bytes > 0))
		*have_r = TRUE;
	path = t_strconcat(store->root_dir, "/packs", NULL);
	if (!*have_r && (dir = opendir(path)) != NULL) {
		while ((d = readdir(dir)) != NULL) {
			if (d->d_name[0] != '.') {
				*have_r = TRUE;
				break;
			}
		}
		(void)closedir(dir);
	}
	return 0;
}

static int casbox_store_load_keyring(struct casbox_store *store,
				     const char **error_r)
{
	struct cas_key_settings key_set;
	const char *path = store->set->key_file, *error, *load_error;
	bool have_data;
	int ret;

	if (path == NULL) {
		*error_r = "casbox_key_file setting is not set";
		return -1;
	}
	casbox_settings_key(store->set, &key_set);
	if (store->nolsm && key_set.mode == CAS_KEY_MODE_PASSWORD)
		key_set.password = store->nolsm_password;
	if (store->unlock_error != NULL) {
		*error_r = store->unlock_error;
		return -1;
	}
	if (key_set.mode == CAS_KEY_MODE_SERVER && store->lsm_keyring != NULL) {
		/* the file the LSM's ring was read from: that ring itself,
		   once it is current (one stat()), instead of reading and
		   checking the file again (an LMTP delivery opens the store
		   and did both), or a copy of it (locked memory, and two
		   mprotect()s and a wipe more per delivery). Both are
		   refreshed together (casbox_store_refresh_keys()), so they
		   never differed but for a moment. */
		bool changed;

		if (cas_keyring_refresh(store->lsm_keyring, path, &changed,
					&error) < 0) {
			*error_r = t_strdup_printf("key file %s: %s",
						   path, error);
			return -1;
		}
		store->keyring = store->lsm_keyring;
		return 0;
	}
	ret = cas_keyring_load_mode(&key_set, &store->keyring, &error);
	if (ret > 0)
		return 0;
	if (ret < 0) {
		/* the loaders name the file themselves */
		*error_r = strstr(error, path) != NULL ? error :
			t_strdup_printf("key file %s: %s", path, error);
		if (key_set.mode == CAS_KEY_MODE_PASSWORD &&
		    key_set.password != NULL) {
			store->unlock_error =
				p_strdup(store->pool, *error_r);
		}
		return -1;
	}
	if (store->nolsm) {
		/* without the LSM nothing tells whether the store has
		   data: never create a key then */
		*error_r = t_strdup_printf("key file %s does not exist", path);
		return -1;
	}
	if (casbox_store_has_data(store, &have_data, error_r) < 0)
		return -1;
	if (have_data) {
		*error_r = t_strdup_printf(
			"key file %s does not exist, but the store already "
			"has data encrypted with it (%s): refusing to "
			"create a new key", path, store->root_dir);
		return -1;
	}
	if (!store->set->key_autocreate) {
		*error_r = t_strdup_printf(
			"key file %s does not exist "
			"(set casbox_key_autocreate=yes to create it "
			"for a new store)", path);
		return -1;
	}
	if (cas_keyring_create_mode(&key_set, &store->keyring, &error) < 0) {
		/* another process of the new user (two first deliveries at
		   once) created it since we looked: that is the store's key.
		   The create never replaces a file, so there is one. */
		if (cas_keyring_load_mode(&key_set, &store->keyring,
					  &load_error) > 0)
			return 0;
		/* password mode without the password (LMTP): nothing is
		   stored unencrypted; the caller fails the delivery
		   temporarily and the MTA retries after the first login */
		*error_r = strstr(error, path) != NULL ? error :
			t_strdup_printf("creating key file %s: %s",
					path, error);
		return -1;
	}
	i_info("casbox: created %s key file %s for the new store %s",
	       cas_key_mode_name(key_set.mode), path, store->root_dir);
	return 0;
}

/* A format-1 LSM: the 'K' record binds the store to its key's 32-bit
   root id (which key rotation never changes): a different key file is
   refused before it can produce unreadable blobs. A sealed LSM names
   the key's 256-bit fingerprint in its MANIFEST instead, checked by
   casbox_lsm_open() before anything is decrypted. */
static int casbox_store_check_key_id(struct casbox_store *store,
				     const char **error_r)
{
	uint32_t key_id = cas_keyring_key_id(store->lsm_keyring);
	struct casbox_lsm_batch *batch;
	unsigned char kval[5];
	buffer_t *key, *value;
	int ret;

	key = t_buffer_create(1);
	buffer_append_c(key, CASBOX_KEY_KEYRING);
	value = t_buffer_create(8);
	ret = casbox_store_lsm_get(store, key, value, TRUE, error_r);
	if (ret < 0)
		return -1;
	if (ret > 0) {
		if (value->used != 5 ||
		    be32_to_cpu_unaligned(CONST_PTR_OFFSET(value->data, 1)) !=
		    key_id) {
			*error_r = t_strdup_printf(
				"key file %s is not the key of store %s "
				"(key id %08x)", store->set->key_file,
				store->root_dir, key_id);
			return -1;
		}
		return 0;
	}
	kval[0] = CASBOX_RECORD_VERSION;
	cpu32_to_be_unaligned(key_id, kval + 1);
	if (casbox_lsm_batch_begin(store->lsm, &batch, error_r) < 0)
		return -1;
	casbox_lsm_batch_put(batch, key->data, key->used, kval, sizeof(kval));
	return casbox_lsm_batch_commit(&batch, error_r) < 0 ? -1 : 0;
}

/* The one place the pack settings are filled from the store's. */
static void casbox_store_pack_settings(struct casbox_store *store,
				       struct casbox_pack_settings *set_r)
{
	i_zero(set_r);
	set_r->dir = t_strconcat(store->root_dir, "/packs", NULL);
	set_r->fsync = store->fsync;
	set_r->max_pack_size = store->set->pack_size;
	set_r->zstd_level = store->set->zstd_level;
	/* new frames (also gc's re-encoding) use the user's casbox_cipher */
	set_r->cipher = store->set->cipher;
	set_r->base_cache_size = store->set->base_cache_size;
	casbox_store_pack_set_storage(store->set, set_r);
}

int casbox_store_pack_rotate(struct casbox_store *store, const char **error_r)
{
	struct casbox_pack_settings pack_set;
	struct casbox_pack_store *packs;
	struct casbox_pack_txn *txn;
	const char *error;

	casbox_store_pack_settings(store, &pack_set);
	/* any existing pack counts as full: txn_begin creates the next */
	pack_set.max_pack_size = 1;
	if (casbox_pack_store_open(&pack_set, store->keyring, &packs,
				   &error) < 0) {
		*error_r = t_strdup_printf("starting a new pack: %s", error);
		return -1;
	}
	if (casbox_pack_txn_begin(packs, &txn, &error) < 0 ||
	    casbox_pack_txn_commit(&txn, &error) < 0) {
		*error_r = t_strdup_printf("starting a new pack: %s", error);
		casbox_pack_store_close(&packs);
		return -1;
	}
	casbox_pack_store_close(&packs);
	return 0;
}

static bool casbox_store_same_key(const struct cas_keyring *a,
				  const struct cas_keyring *b)
{
	unsigned char fa[CAS_KEY_FINGERPRINT_SIZE];
	unsigned char fb[CAS_KEY_FINGERPRINT_SIZE];
	bool same;

	cas_keyring_fingerprint(a, fa);
	cas_keyring_fingerprint(b, fb);
	same = sodium_memcmp(fa, fb, sizeof(fa)) == 0;
	safe_memset(fa, 0, sizeof(fa));
	safe_memset(fb, 0, sizeof(fb));
	return same;
}

/* ---- the LSM's key (struct casbox_lsm_codec) ---- */

static uint32_t casbox_store_lsm_epoch(void *context)
{
	struct casbox_store *store = context;

	return cas_keyring_store_epoch(store->lsm_keyring);
}

static int casbox_store_lsm_key(void *context, uint32_t epoch,
				unsigned char key_r[CASBOX_LSM_KEY_SIZE],
				const char **error_r)
{
	struct casbox_store *store = context;
	const char *error;
	bool changed;

	if (cas_keyring_store_key(store->lsm_keyring, CAS_STORE_KEY_LSM,
				  epoch, key_r, &error) == 1)
		return 0;
	/* written by a process that saw a newer key file (rotation) */
	if (cas_keyring_refresh(store->lsm_keyring, store->set->key_file,
				&changed, &error) < 0 || !changed ||
	    cas_keyring_store_key(store->lsm_keyring, CAS_STORE_KEY_LSM,
				  epoch, key_r, &error) != 1) {
		*error_r = t_strdup_printf("key file %s: %s",
					   store->set->key_file, error);
		return -1;
	}
	return 0;
}

/* The LSM's key ring: the key file loaded as is in server mode, its
   public part (which holds the server-held LSM key) in password mode.
   A missing key file is created for a store without data (the rules of
   casbox_store_load_keyring()). */
static int casbox_store_load_lsm_keyring(struct casbox_store *store,
					 const char **error_r)
{
	struct cas_key_settings key_set;
	const char *path = store->set->key_file, *error;
	int ret;

	if (store->lsm_keyring != NULL)
		return 0;
	if (path == NULL) {
		*error_r = "casbox_key_file setting is not set";
		return -1;
	}
	casbox_settings_key(store->set, &key_set);
	key_set.password = NULL;
	ret = cas_keyring_load_mode(&key_set, &store->lsm_keyring, &error);
	if (ret == 0) {
		/* creates it (or fails saying why not) */
		if (store->keyring == NULL &&
		    casbox_store_load_keyring(store, error_r) < 0)
			return -1;
		ret = cas_keyring_load_mode(&key_set, &store->lsm_keyring,
					    &error);
		if (ret == 0)
			error = "vanished right after it was created";
	}
	if (ret <= 0) {
		*error_r = strstr(error, path) != NULL ? error :
			t_strdup_printf("key file %s: %s", path, error);
		return -1;
	}
	return 0;
}

int casbox_store_lsm_settings(struct casbox_store *store, const char *dir,
			      struct casbox_lsm_settings *set_r,
			      const char **error_r)
{
	i_zero(set_r);
	set_r->dir = p_strdup(store->pool, dir);
	set_r->fsync = store->fsync;
	set_r->lock_method = store->lock_method;
	set_r->cache_bytes = store->set->lsm_cache_size;
	set_r->event = store->set->event;
	if (casbox_store_load_lsm_keyring(store, error_r) < 0)
		return -1;
	store->lsm_codec.context = store;
	store->lsm_codec.current_epoch = casbox_store_lsm_epoch;
	store->lsm_codec.get_key = casbox_store_lsm_key;
	cas_keyring_fingerprint(store->lsm_keyring,
				store->lsm_codec.fingerprint);
	set_r->codec = &store->lsm_codec;
	return 0;
}

int casbox_store_lsm_open(struct casbox_store *store,
			  const struct casbox_lsm_settings *set,
			  struct casbox_lsm **lsm_r, const char **error_r)
{
	struct casbox_lsm_info info;
	const char *error;

	if (casbox_lsm_open(set, lsm_r, error_r) > 0)
		return 1;
	/* the clear error for another store's key; only now, since a
	   MANIFEST read more (four system calls) for every open of the
	   store showed in the cost of an LMTP delivery */
	if (casbox_lsm_peek(set->dir, &info, &error) > 0 && info.sealed &&
	    sodium_memcmp(info.fingerprint, store->lsm_codec.fingerprint,
			  sizeof(info.fingerprint)) != 0) {
		*error_r = t_strdup_printf(
			"key file %s is not the key of store %s (its LSM "
			"%s was sealed with a key of another fingerprint)",
			store->set->key_file, store->root_dir, set->dir);
		return -2;
	}
	return -1;
}

/* A format-1 (plaintext) LSM: check its 'K' record against the key,
   then rewrite it sealed (crash-safe: each step is a MANIFEST swap; a
   failure leaves it readable as it was and the next open retries). */
static int casbox_store_upgrade_lsm(struct casbox_store *store,
				    const char **error_r)
{
	const char *error;

	if (casbox_store_check_key_id(store, error_r) < 0)
		return -1;
	if (casbox_lsm_reseal(store->lsm, &error) < 0) {
		i_error("casbox: sealing the plaintext LSM of %s failed "
			"(it stays readable; retried at the next open): %s",
			store->root_dir, error);
	}
	return 0;
}

/* Records v2: a store not yet upgraded is upgraded when its keys are
   first loaded (casbox-record-auth.h). Not inside a transaction or a
   record read (the write lock, an iteration), and a failure is only
   logged: v1 records stay readable and the next open goes on. */
static void casbox_store_records_upgrade_on_open(struct casbox_store *store)
{
	struct casbox_records_upgrade_stats stats;
	const char *error;
	int ret;

	if (store->lsm == NULL || store->txns_open > 0 ||
	    store->no_records_upgrade ||
	    store->records_state == CASBOX_RECORDS_STATE_DONE)
		return;
	T_BEGIN {
		bool needed;

		/* the usual case, an upgraded or a new store, without
		   taking the write lock */
		ret = casbox_records_upgrade_needed(store, &needed, &error);
		if (ret == 0 && !needed)
			i_zero(&stats);
		else if (ret == 0) {
			ret = casbox_records_upgrade(store, NULL, NULL,
						     &stats, &error);
		}
		if (ret < 0) {
			i_error("casbox: store %s: upgrading the records to "
				"v2 failed (they stay readable; the next open "
				"or doveadm casbox upgrade goes on): %s",
				store->root_dir, error);
		} else if (stats.upgraded > 0 || stats.malformed > 0) {
			i_info("casbox: store %s: upgraded %"PRIu64" records "
			       "to v2 (authenticated) in %u batches, %"PRIu64
			       " malformed ones left as they are",
			       store->root_dir, stats.upgraded,
			       stats.batches, stats.malformed);
		}
	} T_END;
}

int casbox_store_open_keys_for_records(struct casbox_store *store,
				       const char **error_r)
{
	bool old = store->no_records_upgrade;
	int ret;

	store->no_records_upgrade = TRUE;
	ret = casbox_store_open_keys(store, error_r);
	store->no_records_upgrade = old;
	if (ret < 0 && store->keyring == NULL && store->unlock_error != NULL &&
	    store->lsm != NULL) {
		/* password mode, and this process's password does not
		   unlock the key: the record key is server-held, so the
		   records still verify with the public key ring. Reading
		   the mail then fails as for a locked key ("user key is
		   locked"), per message. */
		struct cas_key_settings key_set;
		const char *error;

		casbox_settings_key(store->set, &key_set);
		key_set.password = NULL;
		if (cas_keyring_load_mode(&key_set, &store->keyring,
					  &error) <= 0) {
			store->keyring = NULL;
			return -1;
		}
		if (casbox_store_check_key_id(store, error_r) < 0) {
			casbox_store_keyring_free(store);
			return -1;
		}
		ret = 0;
	}
	return ret;
}

enum casbox_records_state
casbox_store_get_records_state(struct casbox_store *store)
{
	return store->records_state;
}

void casbox_store_set_records_state(struct casbox_store *store,
				    enum casbox_records_state state)
{
	store->records_state = state;
}

int casbox_store_open_keys(struct casbox_store *store, const char **error_r)
{
	struct casbox_pack_settings pack_set;
	const char *error;

	if (store->packs != NULL)
		return 0;
	if (store->keyring == NULL) {
		if (casbox_store_load_keyring(store, error_r) < 0)
			return -1;
		/* the LSM was opened with the key file's fingerprint (or its
		   'K' record checked); without the LSM the sealed records the
		   caller opens check the key. The file may have been replaced
		   since: the root must still be the same. */
		if (store->lsm_keyring != NULL &&
		    !casbox_store_same_key(store->keyring,
					   store->lsm_keyring)) {
			*error_r = t_strdup_printf(
				"key file %s is not the key of store %s "
				"(key fingerprint differs)",
				store->set->key_file, store->root_dir);
			casbox_store_keyring_free(store);
			return -1;
		}
	}
	casbox_store_pack_settings(store, &pack_set);
	if (casbox_pack_store_open(&pack_set, store->keyring,
				   &store->packs, &error) < 0) {
		*error_r = t_strdup_printf("packs %s: %s", pack_set.dir, error);
		return -1;
	}
	if (store->keep_read_fd)
		casbox_pack_store_keep_read_fd(store->packs);
	casbox_store_records_upgrade_on_open(store);
	return 0;
}

void casbox_store_keep_read_fd(struct casbox_store *store)
{
	store->keep_read_fd = TRUE;
	if (store->packs != NULL)
		casbox_pack_store_keep_read_fd(store->packs);
}

void casbox_store_release_read_fd(struct casbox_store *store)
{
	store->read_keys_checked = FALSE;
	if (store->packs != NULL)
		casbox_pack_store_release_read_fd(store->packs);
}

/* Pick up a key file that key rotation rewrote since it was loaded (one
   stat() when it did not change): new wraps must use its current slot,
   and reads need its slots. cas_keyring_refresh() refuses a key with
   another root. */
int casbox_store_refresh_keys(struct casbox_store *store,
			      const char **error_r)
{
	const char *error;
	struct stat st, *stp = NULL;
	bool changed;

	/* both rings are of one file: one stat() for both (server mode:
	   they are one ring, which the second refresh finds current) */
	if ((store->lsm_keyring != NULL &&
	     cas_keyring_refresh_needs_stat(store->lsm_keyring)) ||
	    (store->keyring != NULL &&
	     cas_keyring_refresh_needs_stat(store->keyring))) {
		if (stat(store->set->key_file, &st) < 0) {
			*error_r = t_strdup_printf("key file %s: stat() "
				"failed: %m", store->set->key_file);
			return -1;
		}
		stp = &st;
	}
	if (store->lsm_keyring != NULL &&
	    cas_keyring_refresh_stat(store->lsm_keyring, store->set->key_file,
				     stp, &changed, &error) < 0) {
		*error_r = t_strdup_printf("key file %s: %s",
					   store->set->key_file, error);
		return -1;
	}
	if (store->keyring == NULL)
		return 0;
	if (cas_keyring_refresh_stat(store->keyring, store->set->key_file,
				     stp, &changed, &error) < 0) {
		*error_r = t_strdup_printf("key file %s: %s",
					   store->set->key_file, error);
		return -1;
	}
	return 0;
}

bool casbox_store_key_locked(struct casbox_store *store)
{
	return store->unlock_error != NULL ||
		(store->keyring != NULL &&
		 !cas_keyring_can_decrypt(store->keyring));
}

int casbox_store_blob_id(struct casbox_store *store, struct istream *input,
			 uoff_t offset, uoff_t size,
			 struct cas_blob_id *id_r, const char **error_r)
{
	struct cas_blob_id_ctx ctx;
	struct istream *range;
	const unsigned char *data;
	size_t data_size;
	int ret;

	i_assert(store->keyring != NULL);
	range = i_stream_create_range(input, offset, size);
	cas_blob_id_init(store->keyring, &ctx);
	while ((ret = i_stream_read_more(range, &data, &data_size)) > 0) {
		cas_blob_id_update(&ctx, data, data_size);
		i_stream_skip(range, data_size);
	}
	i_assert(ret == -1);
	if (range->stream_errno != 0) {
		*error_r = t_strdup_printf("read(%s) failed: %s",
					   i_stream_get_name(input),
					   i_stream_get_error(range));
		i_stream_unref(&range);
		return -1;
	}
	if (range->v_offset != size) {
		*error_r = t_strdup_printf("read(%s): expected %"PRIuUOFF_T
					   " bytes at %"PRIuUOFF_T", got %"
					   PRIuUOFF_T, i_stream_get_name(input),
					   size, offset, range->v_offset);
		i_stream_unref(&range);
		return -1;
	}
	i_stream_unref(&range);
	cas_blob_id_final(&ctx, id_r);
	return 0;
}

int casbox_store_mailbox_put(struct casbox_store *store,
			     const guid_128_t mailbox_guid,
			     const struct casbox_mailbox_record *rec,
			     const char **error_r)
{
	struct casbox_store_txn *txn;

	if (casbox_store_txn_begin(store, &txn, error_r) < 0)
		return -1;
	casbox_store_txn_put_mailbox(txn, mailbox_guid, rec);
	return casbox_store_txn_commit(&txn, error_r);
}

int casbox_store_mailbox_delete(struct casbox_store *store,
				const guid_128_t mailbox_guid,
				const char **error_r)
{
	struct casbox_store_txn *txn;
	struct casbox_lsm_iter *iter;
	ARRAY(uint32_t) uids;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	guid_128_t guid;
	buffer_t *prefix;
	uint32_t uid;
	int ret = 0;

	if (casbox_store_txn_begin(store, &txn, error_r) < 0)
		return -1;
	prefix = t_buffer_create(32);
	buffer_append_c(prefix, CASBOX_KEY_MESSAGE);
	buffer_append(prefix, mailbox_guid, GUID_128_SIZE);
	t_array_init(&uids, 32);
	iter = casbox_lsm_iter_init(store->lsm, prefix->data, prefix->used);
	while (casbox_lsm_iter_next(iter, &key, &key_size,
				    &value, &value_size)) {
		if (casbox_key_message_parse(key, key_size, guid, &uid) > 0)
			array_push_back(&uids, &uid);
	}
	if (casbox_lsm_iter_deinit(&iter, error_r) < 0)
		ret = -1;
	/* a big mailbox: each record in its own data-stack frame, and in
	   pieces (every release is right by itself) */
	array_foreach_elem(&uids, uid) {
		if (ret < 0)
			break;
		T_BEGIN {
			if (casbox_store_txn_expunge(txn, mailbox_guid, uid,
						     error_r) < 0 ||
			    casbox_store_txn_checkpoint(txn, error_r) < 0)
				ret = -1;
		} T_END_PASS_STR_IF(ret < 0, error_r);
	}
	if (ret < 0) {
		casbox_store_txn_rollback(&txn);
		return -1;
	}
	buffer_set_used_size(prefix, 0);
	casbox_key_mailbox(prefix, mailbox_guid);
	casbox_lsm_batch_delete(txn->batch, prefix->data, prefix->used);
	return casbox_store_txn_commit(&txn, error_r);
}

int casbox_store_mailbox_recovery(struct casbox_store *store,
				  const guid_128_t mailbox_guid,
				  const guid_128_t public_guid,
				  const struct casbox_mailbox_record *rec,
				  bool deleted, const char **error_r)
{
	struct casbox_recovery_mailbox mrec;
	struct casbox_pack_txn *txn = NULL;
	const char *error;
	buffer_t *plain;

	if (casbox_store_open_keys(store, error_r) < 0)
		return -1;
	i_zero(&mrec);
	mrec.written_usecs = casbox_meta_now_usecs();
	guid_128_copy(mrec.mailbox_guid, mailbox_guid);
	if (public_guid != NULL && !guid_128_equals(public_guid,
						    mailbox_guid))
		guid_128_copy(mrec.public_guid, public_guid);
	mrec.uid_validity = rec->uid_validity;
	mrec.deleted = deleted;
	mrec.name = rec->name;
	plain = t_buffer_create(128);
	casbox_recovery_mailbox_export(&mrec, plain);
	if (casbox_pack_txn_begin(store->packs, &txn, &error) < 0 ||
	    casbox_pack_txn_add_meta(txn, CASBOX_META_KIND_MAILBOX,
				     plain->data, plain->used, &error) < 0 ||
	    casbox_pack_txn_commit(&txn, &error) < 0) {
		if (txn != NULL)
			casbox_pack_txn_rollback(&txn);
		*error_r = t_strdup_printf("pack append: %s", error);
		return -1;
	}
	return 0;
}

int casbox_store_mailbox_find(struct casbox_store *store, const char *name,
			      pool_t pool, guid_128_t mailbox_guid_r,
			      struct casbox_mailbox_record *rec_r,
			      const char **error_r)
{
	const unsigned char prefix = CASBOX_KEY_MAILBOX;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	int ret = 0;

	if (casbox_lsm_refresh(store->lsm, error_r) < 0)
		return -1;
	iter = casbox_lsm_iter_init(store->lsm, &prefix, 1);
	while (ret == 0 && casbox_lsm_iter_next(iter, &key, &key_size,
						&value, &value_size)) {
		if (key_size != 1 + GUID_128_SIZE)
			continue;
		if (casbox_mailbox_record_import(value, value_size, pool,
						 rec_r, error_r) < 0)
			ret = -1;
		else if (strcmp(rec_r->name, name) == 0) {
			memcpy(mailbox_guid_r, key + 1, GUID_128_SIZE);
			ret = 1;
		}
	}
	if (casbox_lsm_iter_deinit(&iter, error_r) < 0)
		return -1;
	return ret;
}

int casbox_store_mailbox_iterate(struct casbox_store *store,
				 casbox_store_mailbox_callback_t *callback,
				 void *context, const char **error_r)
{
	const unsigned char prefix = CASBOX_KEY_MAILBOX;
	struct casbox_lsm_iter *iter;
	struct casbox_mailbox_record rec;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	int ret = 0;

	if (casbox_lsm_refresh(store->lsm, error_r) < 0)
		return -1;
	iter = casbox_lsm_iter_init(store->lsm, &prefix, 1);
	while (ret == 0 && casbox_lsm_iter_next(iter, &key, &key_size,
						&value, &value_size)) T_BEGIN {
		if (key_size != 1 + GUID_128_SIZE)
			;
		else if (casbox_mailbox_record_import(value, value_size,
				pool_datastack_create(), &rec, error_r) < 0)
			ret = -1;
		else
			callback(context, key + 1, &rec);
	} T_END_PASS_STR_IF(ret < 0, error_r);
	if (casbox_lsm_iter_deinit(&iter, error_r) < 0)
		return -1;
	return ret;
}

static int
casbox_store_lsm_uids_from(struct casbox_lsm *lsm,
			   const guid_128_t mailbox_guid, uint32_t first_uid,
			   ARRAY_TYPE(uint32_t) *uids, const char **error_r)
{
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	buffer_t *prefix, *start;
	guid_128_t guid;
	uint32_t uid;

	prefix = t_buffer_create(32);
	buffer_append_c(prefix, CASBOX_KEY_MESSAGE);
	buffer_append(prefix, mailbox_guid, GUID_128_SIZE);
	start = t_buffer_create(32);
	casbox_key_message(start, mailbox_guid, first_uid);
	iter = casbox_lsm_iter_init(lsm, prefix->data, prefix->used);
	casbox_lsm_iter_seek(iter, start->data, start->used);
	while (casbox_lsm_iter_next(iter, &key, &key_size,
				    &value, &value_size)) {
		if (casbox_key_message_parse(key, key_size, guid, &uid) > 0 &&
		    uid >= first_uid)
			array_push_back(uids, &uid);
	}
	return casbox_lsm_iter_deinit(&iter, error_r) < 0 ? -1 : 0;
}

int casbox_store_msg_uids_from(struct casbox_store *store,
			       const guid_128_t mailbox_guid,
			       uint32_t first_uid, ARRAY_TYPE(uint32_t) *uids,
			       const char **error_r)
{
	if (casbox_lsm_refresh(store->lsm, error_r) < 0)
		return -1;
	return casbox_store_lsm_uids_from(store->lsm, mailbox_guid,
					  first_uid, uids, error_r);
}

int casbox_store_txn_msg_uids_from(struct casbox_store_txn *txn,
				   const guid_128_t mailbox_guid,
				   uint32_t first_uid,
				   ARRAY_TYPE(uint32_t) *uids,
				   const char **error_r)
{
	/* batch_begin refreshed under the write lock */
	return casbox_store_lsm_uids_from(txn->store->lsm, mailbox_guid,
					  first_uid, uids, error_r);
}

/* rec with the flags, keywords and modseq of the message's flag record,
   if it has one. Returns 0 ok, -1 error. */
static int
casbox_store_msg_overlay_flags(struct casbox_store *store,
			       const guid_128_t mailbox_guid, uint32_t uid,
			       pool_t pool, struct casbox_msg_record *rec,
			       const char **error_r)
{
	buffer_t *key, *value;
	int ret;

	key = t_buffer_create(32);
	casbox_key_flags(key, mailbox_guid, uid);
	value = t_buffer_create(64);
	ret = casbox_lsm_get(store->lsm, key->data, key->used, value,
			     error_r);
	if (ret > 0 &&
	    casbox_store_flags_value_import(store, key->data, key->used,
					    value->data, value->used, pool,
					    rec, error_r) < 0)
		ret = -1;
	if (ret < 0) {
		*error_r = t_strdup_printf("uid=%u: %s", uid, *error_r);
		return -1;
	}
	return 0;
}

int casbox_store_msg_iterate(struct casbox_store *store,
			     const guid_128_t mailbox_guid,
			     casbox_store_msg_callback_t *callback,
			     void *context, const char **error_r)
{
	struct casbox_lsm_iter *iter;
	struct casbox_msg_record rec;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	guid_128_t guid;
	buffer_t *prefix;
	uint32_t uid;
	int ret = 0;

	prefix = t_buffer_create(32);
	buffer_append_c(prefix, CASBOX_KEY_MESSAGE);
	buffer_append(prefix, mailbox_guid, GUID_128_SIZE);
	iter = casbox_lsm_iter_init(store->lsm, prefix->data, prefix->used);
	while (ret == 0 && casbox_lsm_iter_next(iter, &key, &key_size,
						&value, &value_size)) T_BEGIN {
		if (casbox_key_message_parse(key, key_size, guid, &uid) < 0)
			;
		else if (casbox_store_msg_value_import(store, key, key_size,
				value, value_size, pool_datastack_create(),
				&rec, error_r) < 0) {
			*error_r = t_strdup_printf("uid=%u: %s", uid,
						   *error_r);
			ret = -1;
		} else if (casbox_store_meta_resolve(store,
				pool_datastack_create(), &rec, error_r) < 0 ||
			   casbox_store_msg_overlay_flags(store, mailbox_guid,
				uid, pool_datastack_create(), &rec,
				error_r) < 0) {
			ret = -1;
		} else {
			callback(context, uid, &rec);
		}
	} T_END_PASS_STR_IF(ret < 0, error_r);
	if (casbox_lsm_iter_deinit(&iter, error_r) < 0)
		return -1;
	return ret;
}

static int
casbox_store_msg_lookup_value(struct casbox_store *store,
			      const guid_128_t mailbox_guid, uint32_t uid,
			      const buffer_t *key, const buffer_t *value,
			      pool_t pool, struct casbox_msg_record *rec_r,
			      const char **error_r)
{
	if (casbox_store_msg_value_import(store, key->data, key->used,
					  value->data, value->used, pool,
					  rec_r, error_r) < 0 ||
	    casbox_store_meta_resolve(store, pool, rec_r, error_r) < 0 ||
	    casbox_store_msg_overlay_flags(store, mailbox_guid, uid, pool,
					   rec_r, error_r) < 0)
		return -1;
	return 0;
}

int casbox_store_msg_lookup(struct casbox_store *store,
			    const guid_128_t mailbox_guid, uint32_t uid,
			    pool_t pool, struct casbox_msg_record *rec_r,
			    const char **error_r)
{
	buffer_t *key, *value;
	int ret;

	key = t_buffer_create(32);
	casbox_key_message(key, mailbox_guid, uid);
	value = t_buffer_create(256);
	ret = casbox_store_lsm_get(store, key, value, TRUE, error_r);
	if (ret <= 0)
		return ret;
	if (casbox_store_msg_lookup_value(store, mailbox_guid, uid, key,
					  value, pool, rec_r, error_r) == 0)
		return 1;
	/* This process's view of the LSM may be older than the key file:
	   key rotate --finish re-seals the records under the new epoch and
	   then drops the old one from the file, and a refresh of the key
	   ring (for a record of a newer epoch) can come after this view
	   was read. Its records of the dropped epoch then no longer open
	   (test_stale_view_after_finish). Read the LSM again, once: a
	   record that was modified fails the same way again. */
	buffer_set_used_size(value, 0);
	if (casbox_lsm_refresh(store->lsm, error_r) < 0 ||
	    (ret = casbox_lsm_get(store->lsm, key->data, key->used, value,
				  error_r)) < 0)
		return -1;
	if (ret == 0)
		return 0;
	if (casbox_store_msg_lookup_value(store, mailbox_guid, uid, key,
					  value, pool, rec_r, error_r) < 0)
		return -1;
	return 1;
}

/* A blob's record and reference count as the LSM has it (refresh: read
   the LSM again first). Returns 1 found, 0 not in the store (error_r
   not set), -1 error. */
static int
casbox_store_blob_record_get(struct casbox_store *store,
			     const struct cas_blob_id *id, bool refresh,
			     struct casbox_blob_record *brec_r,
			     uint32_t *refcount_r, const char **error_r)
{
	struct casbox_blob_value bval;
	buffer_t *key, *value;
	int ret;

	key = t_buffer_create(40);
	casbox_key_blob(key, id);
	value = t_buffer_create(256);
	ret = casbox_store_lsm_get(store, key, value, refresh, error_r);
	if (ret <= 0)
		return ret;
	if (casbox_blob_value_import(value->data, value->used,
				     &bval, error_r) < 0 ||
	    casbox_blob_record_import(bval.pack_record,
				      bval.pack_record_size,
				      brec_r, error_r) < 0)
		return -1;
	*refcount_r = bval.refcount;
	return 1;
}

/* The blob record of a message part as the LSM has it now. Returns 1
   found, 0 not in the store, -1 error. */
static int
casbox_store_part_record(struct casbox_store *store,
			 const struct casbox_msg_part *part,
			 struct casbox_blob_record *brec_r,
			 uint32_t *refcount_r, const char **error_r)
{
	int ret;

	ret = casbox_store_blob_record_get(store, &part->id, TRUE, brec_r,
					   refcount_r, error_r);
	if (ret == 0) {
		*error_r = t_strdup_printf("blob %s has no record",
					   cas_blob_id_to_hex(&part->id));
	}
	if (ret < 0) {
		*error_r = t_strdup_printf("blob %s: %s",
					   cas_blob_id_to_hex(&part->id),
					   *error_r);
	}
	if (ret <= 0)
		return ret;
	if (brec_r->plain_size != casbox_msg_part_blob_size(part)) {
		*error_r = t_strdup_printf("blob %s: size %"PRIu64
			" does not match the message record's %"PRIuUOFF_T,
			cas_blob_id_to_hex(&part->id), brec_r->plain_size,
			casbox_msg_part_blob_size(part));
		return -1;
	}
	return 1;
}

/* Whether the ring has the slot a server-wrapped DEK names (sealed
   DEKs of password mode name none). */
static bool
casbox_store_dek_slot_known(struct casbox_store *store,
			    const struct casbox_blob_record *brec)
{
	return brec->dek_kind != CAS_DEK_KIND_SERVER_WRAP ||
		cas_keyring_has_key_id(store->keyring,
			cas_dek_wrapped_key_id(brec->wrapped_dek));
}

/* casbox_pack_base_lookup_func_t over the LSM as this process last
   read it (context = the store). A record rewrapped by key rotation
   since the key ring was refreshed names a slot the key file already
   has (it is written first): the ring is refreshed for it, as
   casbox_store_part_open() does for the blob itself. */
static int casbox_store_base_lookup(void *context,
				    const struct cas_blob_id *base_id,
				    struct casbox_blob_record *rec_r,
				    const char **error_r)
{
	struct casbox_store *store = context;
	uint32_t refcount;
	int ret;

	ret = casbox_store_blob_record_get(store, base_id, FALSE, rec_r,
					   &refcount, error_r);
	if (ret == 0)
		*error_r = "no blob record";
	if (ret > 0 && store->keyring != NULL &&
	    !casbox_store_dek_slot_known(store, rec_r) &&
	    casbox_store_refresh_keys(store, error_r) < 0)
		return -1;
	return ret;
}

/* TRUE if new lead parts are compressed against earlier messages and
   read ones kept as bases (casbox-xmsg.h). */
static bool casbox_store_xmsg_enabled(struct casbox_store *store)
{
	return !store->set->cross_message_disabled &&
		!store->set->dedup_disabled;
}

/* casbox_pack_blob_open_pinned() for any record: a delta blob with its
   base, decoded or from the base cache. A lead part (lead) is kept as a
   base while read, so the reply read next does not decode it again.
   Returns as casbox_pack_blob_open_pinned(), 0 also when a base's pack
   is gone (the records of the chain were stale: every base is opened
   pinned too); a base that is missing or damaged is an error naming
   blob and base. */
static int
casbox_store_blob_open(struct casbox_store *store,
		       const struct cas_blob_id *id,
		       const struct casbox_blob_record *brec, bool lead,
		       struct istream **input_r, const char **error_r)
{
	struct casbox_base_plain *base = NULL;
	const char *error;
	int ret;

	*input_r = NULL;
	if (brec->base_depth > 0) {
		ret = casbox_pack_base_get(store->packs, &brec->base_id,
					   brec->base_depth - 1,
					   casbox_store_base_lookup, store,
					   &base, &error);
		if (ret <= 0) {
			*error_r = t_strdup_printf("blob %s: %s",
				cas_blob_id_to_hex(id), error);
			return ret;
		}
	}
	ret = casbox_pack_blob_open_pinned_base(store->packs, id, brec, base,
						input_r, error_r);
	if (base != NULL)
		casbox_base_plain_unref(&base);
	if (ret > 0 && lead && casbox_store_xmsg_enabled(store))
		casbox_pack_blob_cache_as_base(*input_r);
	return ret;
}

/* A blob record is read again (after refreshing the LSM) when its pack
   is gone at open or its DEK names a slot the key ring lacks: gc
   unlinks a pack only after committing its blobs' new places, and key
   rotation drops a slot only after rewrapping every record, so the
   record read again is current; twice in a row would take two gc runs
   or rotations while one message is opened. */
#define CASBOX_STORE_OPEN_RETRIES 3

int casbox_store_blob_open_record(struct casbox_store *store,
				  const struct cas_blob_id *id,
				  const struct casbox_blob_record *rec,
				  struct istream **input_r,
				  const char **error_r)
{
	struct casbox_blob_record fresh = *rec;
	uint32_t refcount;
	unsigned int try;
	int ret;

	for (try = 0;; try++) {
		ret = casbox_store_blob_open(store, id, &fresh, FALSE,
					     input_r, error_r);
		if (ret != 0)
			return ret;
		/* gc moved the blob or a base of it since rec was read */
		if (try == CASBOX_STORE_OPEN_RETRIES ||
		    casbox_lsm_refresh(store->lsm, error_r) < 0)
			return -1;
		ret = casbox_store_blob_record_get(store, id, FALSE, &fresh,
						   &refcount, error_r);
		if (ret == 0) {
			*error_r = t_strdup_printf("blob %s has no record "
				"any more", cas_blob_id_to_hex(id));
		}
		if (ret <= 0)
			return -1;
	}
}

/* Returns 1 ok, 0 blob not in the store, -1 error. */
static int
casbox_store_part_open(struct casbox_store *store,
		       const struct casbox_msg_part *part, bool lead,
		       struct istream **input_r, const char **error_r)
{
	struct casbox_blob_record brec;
	uint32_t refcount;
	unsigned int try;
	int ret;

	for (try = 0;; try++) {
		ret = casbox_store_part_record(store, part, &brec, &refcount,
					       error_r);
		if (ret <= 0)
			return ret;
		if (!casbox_store_dek_slot_known(store, &brec) &&
		    try < CASBOX_STORE_OPEN_RETRIES) {
			/* key rotation rewrapped the record and dropped its
			   old slot between our LSM and key file refreshes:
			   the ring never loaded that slot. The record has
			   a slot of the key file as it is now. */
			if (casbox_lsm_refresh(store->lsm, error_r) < 0 ||
			    casbox_store_refresh_keys(store, error_r) < 0)
				return -1;
			continue;
		}
		/* the pack is opened now, not at the first read: a gc
		   that unlinks it later cannot take it from the stream */
		/* only a lead blob with more than its message's reference
		   can be a base (or a copy's: a cheap false positive) */
		ret = casbox_store_blob_open(store, &part->id, &brec,
				lead && refcount > 1 && part->transform ==
				CASBOX_PART_TRANSFORM_NONE, input_r, error_r);
		if (ret > 0 &&
		    part->transform == CASBOX_PART_TRANSFORM_BASE64) {
			struct istream *blob = *input_r;

			*input_r = i_stream_create_casbox_b64_encoder(blob,
					&part->b64, part->stored_size);
			i_stream_unref(&blob);
		}
		if (ret != 0)
			return ret;
		if (try == CASBOX_STORE_OPEN_RETRIES ||
		    casbox_lsm_refresh(store->lsm, error_r) < 0)
			return -1;
	}
}

int casbox_store_msg_open(struct casbox_store *store,
			  const struct casbox_msg_record *rec,
			  struct istream **input_r, const char **error_r)
{
	const struct casbox_msg_part *parts;
	struct istream **inputs;
	unsigned int i, count;
	int ret = 1;

	if (casbox_store_open_keys(store, error_r) < 0)
		return -1;
	if (!cas_keyring_can_decrypt(store->keyring) &&
	    store->unlock_error != NULL) {
		/* the records verified with the public key ring
		   (casbox_store_open_keys_for_records()) */
		*error_r = t_strdup_printf("user key is locked: %s",
					   store->unlock_error);
		return -1;
	}
	if (!cas_keyring_can_decrypt(store->keyring)) {
		*error_r = t_strdup_printf(
			"user key is locked: key file %s is in "
			"casbox_key_mode=password and this process has no "
			"casbox_key_password (reading mail needs the user's "
			"password, given at IMAP/POP3 login)",
			store->set->key_file);
		return -1;
	}
	/* gc may have moved blobs to a new pack and unlinked the old one
	   since this process last looked: read current locations (cheap
	   when nothing changed) */
	if (casbox_lsm_refresh(store->lsm, error_r) < 0)
		return -1;
	/* after the LSM refresh: a record rewrapped by key rotation is
	   committed only after the key file holding its slot. With a kept
	   read fd, once between two releases (the glue's mailbox syncs:
	   one per IMAP command), not a stat() per message: within a FETCH
	   a key that a record, blob or base names and the ring lacks is
	   loaded when it is met (casbox_record_key(),
	   casbox_store_lsm_key(), casbox_store_dek_slot_known()), and an
	   epoch rotation drops is let go at the next command. */
	if (!store->read_keys_checked) {
		if (casbox_store_refresh_keys(store, error_r) < 0)
			return -1;
		store->read_keys_checked = store->keep_read_fd;
	}
	parts = array_get(&rec->parts, &count);
	if (count == 0) {
		*input_r = i_stream_create_from_data("", 0);
		return 1;
	}
	if (count == 1)
		return casbox_store_part_open(store, &parts[0], TRUE, input_r,
					      error_r);
	inputs = t_new(struct istream *, count + 1);
	for (i = 0; i < count && ret > 0; i++)
		ret = casbox_store_part_open(store, &parts[i], i == 0,
					     &inputs[i], error_r);
	if (ret > 0)
		*input_r = i_stream_create_concat(inputs);
	for (i = 0; i < count && inputs[i] != NULL; i++)
		i_stream_unref(&inputs[i]);
	return ret;
}

static unsigned int casbox_blob_id_hash(const struct cas_blob_id *id)
{
	return be32_to_cpu_unaligned(id->id);
}

static int casbox_blob_id_cmp(const struct cas_blob_id *id1,
			      const struct cas_blob_id *id2)
{
	return memcmp(id1->id, id2->id, sizeof(id1->id));
}

static void casbox_store_txn_blobs_init(struct casbox_store_txn *txn)
{
	txn->blob_pool = pool_alloconly_create("casbox store txn blobs",
					       4096);
	hash_table_create(&txn->blobs, txn->blob_pool, 0,
			  casbox_blob_id_hash, casbox_blob_id_cmp);
	p_array_init(&txn->blob_list, txn->blob_pool, 16);
	hash_table_create(&txn->metas, txn->blob_pool, 0,
			  casbox_blob_id_hash, casbox_blob_id_cmp);
	p_array_init(&txn->meta_list, txn->blob_pool, 16);
	txn->meta_bytes = 0;
}

static void casbox_store_txn_blobs_deinit(struct casbox_store_txn *txn)
{
	struct casbox_pending_meta *meta;

	array_foreach_elem(&txn->meta_list, meta) {
		if (meta->sealed != NULL)
			buffer_free(&meta->sealed);
	}
	hash_table_destroy(&txn->blobs);
	hash_table_destroy(&txn->metas);
	pool_unref(&txn->blob_pool);
}

int casbox_store_txn_begin(struct casbox_store *store,
			   struct casbox_store_txn **txn_r,
			   const char **error_r)
{
	struct casbox_store_txn *txn;
	pool_t pool;

	pool = pool_alloconly_create("casbox store txn", 1024);
	txn = p_new(pool, struct casbox_store_txn, 1);
	txn->store = store;
	txn->pool = pool;
	casbox_store_txn_blobs_init(txn);
	if (casbox_lsm_batch_begin(store->lsm, &txn->batch, error_r) < 0) {
		casbox_store_txn_blobs_deinit(txn);
		pool_unref(&pool);
		return -1;
	}
	/* Key rotation rewrites the key file under this lock (rotate adds
	   an epoch, --finish drops the old one and then shreds it): read it
	   again now, so nothing this transaction writes (record MACs, LSM
	   tables and WAL, DEK wraps) uses an epoch that is going or gone.
	   One stat() when the file did not change. */
	if (casbox_store_refresh_keys(store, error_r) < 0) {
		casbox_lsm_batch_rollback(&txn->batch);
		casbox_store_txn_blobs_deinit(txn);
		pool_unref(&pool);
		return -1;
	}
	txn->keys_current = store->keyring != NULL;
	store->txns_open++;
	*txn_r = txn;
	return 0;
}

/* The blob as this txn currently sees it (refcount 0 = not stored). */
static int
casbox_store_txn_get_blob(struct casbox_store_txn *txn,
			  const struct cas_blob_id *id,
			  struct casbox_pending_blob **blob_r,
			  const char **error_r)
{
	struct casbox_pending_blob *blob;
	struct casbox_blob_value bval;
	buffer_t *key, *value;
	int ret;

	blob = hash_table_lookup(txn->blobs, id);
	if (blob != NULL) {
		*blob_r = blob;
		return 0;
	}
	key = t_buffer_create(40);
	casbox_key_blob(key, id);
	value = t_buffer_create(128);
	/* batch_begin refreshed: no need to refresh again */
	ret = casbox_store_lsm_get(txn->store, key, value, FALSE, error_r);
	if (ret < 0)
		return -1;
	blob = p_new(txn->blob_pool, struct casbox_pending_blob, 1);
	blob->id = *id;
	blob->pack_record = buffer_create_dynamic(txn->blob_pool, 128);
	if (ret > 0) {
		if (casbox_blob_value_import(value->data, value->used,
					     &bval, error_r) < 0)
			return -1;
		blob->refcount = bval.refcount;
		blob->in_lsm = TRUE;
		buffer_append(blob->pack_record, bval.pack_record,
			      bval.pack_record_size);
	}
	hash_table_insert(txn->blobs, &blob->id, blob);
	array_push_back(&txn->blob_list, &blob);
	*blob_r = blob;
	return 0;
}

/* After a part was referenced: written or deduplicated, as the
   reference went (casbox_dedup=no writes stored blobs again). */
static void casbox_store_txn_count_part(struct casbox_store_txn *txn,
					const struct casbox_msg_part *part)
{
	struct casbox_store_stats *stats = &txn->store->stats;
	const struct casbox_pending_blob *blob;

	blob = hash_table_lookup(txn->blobs, &part->id);
	i_assert(blob != NULL);
	if (blob->last_written) {
		stats->blobs_written++;
		stats->written_bytes += part->size;
	} else {
		stats->blobs_deduplicated++;
		stats->deduplicated_bytes += part->size;
	}
}

static int casbox_store_txn_pack_begin(struct casbox_store_txn *txn,
				       const char **error_r)
{
	struct casbox_store *store = txn->store;
	const char *error;

	if (txn->pack_txn != NULL)
		return 0;
	/* under the write lock: if key rotation has begun, wrap with its
	   new slot (the rotation's last step drops the old slot under this
	   lock, after checking that no blob record uses it). Not again when
	   casbox_store_txn_begin() read both rings under this lock hold:
	   rotation cannot have changed the file since. */
	if (casbox_store_open_keys(store, error_r) < 0 ||
	    (!txn->keys_current &&
	     casbox_store_refresh_keys(store, error_r) < 0))
		return -1;
	if (casbox_pack_txn_begin(store->packs, &txn->pack_txn,
				  &error) < 0) {
		*error_r = t_strdup_printf("pack append: %s", error);
		return -1;
	}
	return 0;
}

/* Drop the reference the blob record exported in pack_record holds on
   its base, if it has one. A record that does not import holds none
   that can be known (scrub reports it). Returns 0 ok, -1 error. */
static int
casbox_store_txn_unref_base(struct casbox_store_txn *txn,
			    const buffer_t *pack_record, const char **error_r)
{
	struct casbox_pending_blob *base;
	struct casbox_blob_record brec;
	const char *error;

	if (pack_record->used == 0 ||
	    casbox_blob_record_import(pack_record->data, pack_record->used,
				      &brec, &error) < 0 ||
	    brec.base_depth == 0)
		return 0;
	if (casbox_store_txn_get_blob(txn, &brec.base_id, &base, error_r) < 0)
		return -1;
	if (base->refcount > 0)
		base->refcount--;
	return 0;
}

/* A blob's record as this txn sees it, without adding the blob to the
   txn (nothing is written for it at commit unless it is referenced
   later). Returns 1 stored, 0 not, -1 error. */
static int
casbox_store_txn_peek_blob(struct casbox_store_txn *txn,
			   const struct cas_blob_id *id,
			   struct casbox_blob_record *brec_r,
			   const char **error_r)
{
	struct casbox_pending_blob *blob;
	uint32_t refcount;
	int ret;

	blob = hash_table_lookup(txn->blobs, id);
	if (blob == NULL) {
		/* batch_begin refreshed: no need to refresh again */
		ret = casbox_store_blob_record_get(txn->store, id, FALSE,
						   brec_r, &refcount, error_r);
		return ret <= 0 ? ret : (refcount > 0 ? 1 : 0);
	}
	if (blob->refcount == 0 || blob->pack_record->used == 0)
		return 0;
	if (casbox_blob_record_import(blob->pack_record->data,
				      blob->pack_record->used, brec_r,
				      error_r) < 0)
		return -1;
	return 1;
}

/* The bases a new lead blob is offered (casbox-xmsg.h), best first, one
   at a time (casbox_pack_base_next_func_t): the first candidate that
   is stored, then, only if it does not pay, the next. The first stored
   one at the depth limit means the blob is written alone (which keeps
   chains short: doc/benchmarks.md, "Step 4, blob layer"). Prefixes
   come from the base cache or are decoded when offered. A map or base
   that cannot be read is no reason to fail a save: no base then. */
struct casbox_store_xmsg_bases {
	struct casbox_store_txn *txn;
	const struct cas_blob_id *id;
	struct cas_blob_id cands[2];
	int count, next;
	/* what was offered, referenced until the add returns */
	struct casbox_base_plain *plains[2];
	struct casbox_pack_base offered[2];
	unsigned int offered_count;
};

static void
casbox_store_xmsg_bases_init(struct casbox_store_xmsg_bases *bases,
			     struct casbox_store_txn *txn,
			     const struct casbox_xmsg_hints *hints,
			     const struct cas_blob_id *id)
{
	const char *error;

	i_zero(bases);
	bases->txn = txn;
	bases->id = id;
	bases->count = casbox_xmsg_candidates(txn->xmsg, txn->store, hints,
					      bases->cands, &error);
	if (bases->count < 0) {
		i_warning("casbox: %s: cross-message map: %s (saving without "
			  "a base)", txn->store->root_dir, error);
		bases->count = 0;
	}
}

static void
casbox_store_xmsg_bases_deinit(struct casbox_store_xmsg_bases *bases)
{
	unsigned int i;

	for (i = 0; i < bases->offered_count; i++)
		casbox_base_plain_unref(&bases->plains[i]);
}

/* The prefix of candidate cand, or NULL (not stored, not usable or not
   readable); *limit_r = TRUE if it is stored at the depth limit. */
static struct casbox_base_plain *
casbox_store_xmsg_plain(struct casbox_store_xmsg_bases *bases,
			const struct cas_blob_id *cand, bool *limit_r)
{
	struct casbox_store *store = bases->txn->store;
	struct casbox_blob_record brec;
	struct casbox_base_plain *plain;
	const char *error;
	int ret;

	*limit_r = FALSE;
	if (memcmp(cand->id, bases->id->id, sizeof(cand->id)) == 0)
		return NULL;
	ret = casbox_store_txn_peek_blob(bases->txn, cand, &brec, &error);
	if (ret < 0) {
		i_warning("casbox: %s: cross-message base %s: %s",
			  store->root_dir, cas_blob_id_to_hex(cand), error);
		return NULL;
	}
	if (ret == 0)
		return NULL;
	if (brec.base_depth >= CASBOX_BASE_MAX_DEPTH) {
		*limit_r = TRUE;
		return NULL;
	}
	if (brec.plain_size == 0)
		return NULL;
	/* a base written by this txn and evicted from the cache is not in
	   the LSM yet: missing, so none */
	if (casbox_pack_base_get(store->packs, cand, brec.base_depth,
				 casbox_store_base_lookup, store, &plain,
				 &error) <= 0)
		return NULL;
	return plain;
}

static const struct casbox_pack_base *
casbox_store_xmsg_base_next(void *context)
{
	struct casbox_store_xmsg_bases *bases = context;
	struct casbox_base_plain *plain;
	struct casbox_pack_base *pbase;
	bool limit;

	while (bases->next < bases->count) {
		plain = casbox_store_xmsg_plain(bases,
				&bases->cands[bases->next++], &limit);
		if (plain == NULL) {
			if (limit && bases->offered_count == 0)
				bases->count = 0;
			continue;
		}
		i_assert(bases->offered_count < N_ELEMENTS(bases->plains));
		bases->plains[bases->offered_count] = plain;
		pbase = &bases->offered[bases->offered_count++];
		pbase->id = plain->id;
		pbase->plain_size = plain->plain_size;
		pbase->depth = plain->depth;
		pbase->data = plain->data;
		pbase->size = plain->size;
		return pbase;
	}
	return NULL;
}

/* Keep a lead blob just written in the base cache, so a reply saved
   later (in this transaction, or by this process) finds it without a
   decode. input is the blob's bytes, read once already. */
static void
casbox_store_cache_lead(struct casbox_store *store,
			const struct cas_blob_id *id,
			const struct casbox_blob_record *brec,
			struct istream *input)
{
	struct casbox_base_plain *plain;
	const unsigned char *data;
	size_t size, filled = 0;

	if (brec->base_depth >= CASBOX_BASE_MAX_DEPTH ||
	    brec->plain_size == 0)
		return;
	plain = casbox_base_plain_new(id, brec->plain_size, brec->base_depth);
	i_stream_seek(input, 0);
	while (filled < plain->size &&
	       i_stream_read_more(input, &data, &size) > 0) {
		size = I_MIN(size, plain->size - filled);
		memcpy(plain->data + filled, data, size);
		i_stream_skip(input, size);
		filled += size;
	}
	if (filled == plain->size) {
		casbox_base_plain_seal(plain);
		casbox_base_cache_add(casbox_pack_store_get_base_cache(
						store->packs), plain);
	}
	casbox_base_plain_unref(&plain);
}

/* Append a new blob: a lead part (lead_hints: its message's hints, else
   NULL) against the first base of casbox_store_xmsg_bases that the
   encoder finds pays. */
static int
casbox_store_txn_write_blob(struct casbox_store_txn *txn,
			    const struct cas_blob_id *id,
			    const struct casbox_xmsg_hints *lead_hints,
			    struct istream *input,
			    struct casbox_blob_record *brec_r,
			    const char **error_r)
{
	struct casbox_store_xmsg_bases bases;
	const struct casbox_pack_base *base = NULL;
	struct casbox_pending_blob *bblob;
	const char *error;
	int ret;

	i_zero(&bases);
	if (lead_hints != NULL) {
		casbox_store_xmsg_bases_init(&bases, txn, lead_hints, id);
		base = casbox_store_xmsg_base_next(&bases);
	}
	if (base == NULL) {
		ret = casbox_pack_txn_add(txn->pack_txn, id, input, brec_r,
					  &error);
	} else {
		ret = casbox_pack_txn_add_bases(txn->pack_txn, id, input,
				base, casbox_store_xmsg_base_next, &bases,
				brec_r, &error);
	}
	casbox_store_xmsg_bases_deinit(&bases);
	if (ret < 0) {
		*error_r = t_strdup_printf("pack append: %s", error);
		return -1;
	}
	if (brec_r->base_depth > 0) {
		/* the dependent keeps its base alive: one reference */
		if (casbox_store_txn_get_blob(txn, &brec_r->base_id, &bblob,
					      error_r) < 0)
			return -1;
		if (bblob->refcount == UINT32_MAX) {
			*error_r = "blob refcount overflow";
			return -1;
		}
		i_assert(bblob->refcount > 0);
		bblob->refcount++;
	}
	if (lead_hints != NULL)
		casbox_store_cache_lead(txn->store, id, brec_r, input);
	return 0;
}

static int
casbox_store_txn_ref_part(struct casbox_store_txn *txn,
			  const struct casbox_msg_part *part,
			  const struct casbox_xmsg_hints *lead_hints,
			  struct istream *input, const char **error_r)
{
	struct casbox_pending_blob *blob;
	struct casbox_blob_record brec;

	if (casbox_store_txn_get_blob(txn, &part->id, &blob, error_r) < 0)
		return -1;
	if (blob->refcount > 0 && (input == NULL ||
				   !txn->store->set->dedup_disabled)) {
		/* deduplicated: no bytes written */
		if (blob->refcount == UINT32_MAX) {
			*error_r = "blob refcount overflow";
			return -1;
		}
		blob->refcount++;
		blob->last_written = FALSE;
		return 0;
	}
	if (blob->refcount == UINT32_MAX) {
		*error_r = "blob refcount overflow";
		return -1;
	}
	if (input == NULL) {
		*error_r = t_strdup_printf("blob %s is not in the store",
					   cas_blob_id_to_hex(&part->id));
		errno = ENOENT;
		return -1;
	}
	if (casbox_store_txn_pack_begin(txn, error_r) < 0 ||
	    casbox_store_txn_write_blob(txn, &part->id, lead_hints, input,
					&brec, error_r) < 0)
		return -1;
	/* the record is replaced: so is the reference it held on a base */
	if (casbox_store_txn_unref_base(txn, blob->pack_record, error_r) < 0)
		return -1;
	buffer_set_used_size(blob->pack_record, 0);
	casbox_blob_record_export(&brec, blob->pack_record);
	/* casbox_dedup=no writes a stored blob again: the record moves to
	   the new frame, the old one is gc's */
	blob->refcount++;
	blob->last_written = TRUE;
	blob->frame_written = TRUE;
	blob->dek_recorded = FALSE;
	return 0;
}

void casbox_store_txn_set_recovery_mailbox(struct casbox_store_txn *txn,
		const guid_128_t mailbox_guid, const guid_128_t public_guid,
		const struct casbox_mailbox_record *rec)
{
	txn->have_recovery_mailbox = TRUE;
	guid_128_copy(txn->recovery_mailbox_guid, mailbox_guid);
	if (public_guid != NULL && !guid_128_equals(public_guid,
						    mailbox_guid))
		guid_128_copy(txn->recovery_public_guid, public_guid);
	else
		guid_128_empty(txn->recovery_public_guid);
	txn->recovery_mailbox = *rec;
	txn->recovery_mailbox.name = p_strdup(txn->pool, rec->name);
}

/* The server key mode: gc opens recovery records and keeps the DEKs
   of a dropped one whose blobs live on (blob keys), so a DEK needs to
   be in the packs only once, in the record of the save that wrote the
   blob, and copies get a copy record instead of a recovery record each.
   In password mode gc cannot open records, so every record keeps every
   DEK its message needs, and copies a recovery record each. */
static bool casbox_store_txn_gc_keeps_deks(struct casbox_store_txn *txn)
{
	return txn->store->keyring != NULL &&
		cas_keyring_get_userkey(txn->store->keyring) == NULL;
}

/* One blob into the recovery record's list (once), and with_bases the
   bases of a delta blob after it: a message needs them to open. */
static int
casbox_store_txn_recovery_blob(struct casbox_store_txn *txn,
			       const struct cas_blob_id *id, bool with_bases,
			       ARRAY_TYPE(casbox_recovery_blob) *blobs,
			       const char **error_r)
{
	const struct casbox_recovery_blob *seen;
	struct casbox_recovery_blob *rblob;
	struct casbox_pending_blob *blob;
	struct casbox_blob_record brec;

	array_foreach(blobs, seen) {
		if (memcmp(seen->id.id, id->id, CAS_BLOB_ID_SIZE) == 0)
			return 0;
	}
	/* a part is in the txn; a base of a deduplicated delta may not */
	if (casbox_store_txn_get_blob(txn, id, &blob, error_r) < 0)
		return -1;
	if (casbox_blob_record_import(blob->pack_record->data,
				      blob->pack_record->used,
				      &brec, error_r) < 0) {
		*error_r = t_strdup_printf("blob %s: %s",
					   cas_blob_id_to_hex(id), *error_r);
		return -1;
	}
	rblob = array_append_space(blobs);
	rblob->id = *id;
	rblob->dict_id = brec.dict_id;
	rblob->plain_size = brec.plain_size;
	rblob->dek_kind = brec.dek_kind;
	memcpy(rblob->stored_dek, brec.stored_dek,
	       cas_dek_kind_size(brec.dek_kind));
	/* depth-bounded: the records' depths only go down */
	if (with_bases && brec.base_depth > 0) {
		return casbox_store_txn_recovery_blob(txn, &brec.base_id, TRUE,
						      blobs, error_r);
	}
	return 0;
}

/* The blobs whose DEKs go into rec's recovery record, each with its
   stored DEK (wrapped or sealed, by key mode) as the transaction sees
   it. Password mode: every distinct blob of rec and the bases of its
   delta blobs (just written, or deduplicated: the stored record's), so
   one record is enough to open its message. Server key mode: only the
   blobs this save wrote, once per transaction; the DEKs of blobs it
   deduplicated onto, and of bases, are in the record of the save that
   wrote them, or in blob keys once gc dropped that one
   (casbox_store_txn_gc_keeps_deks()). */
static int
casbox_store_txn_recovery_blobs(struct casbox_store_txn *txn,
				const struct casbox_msg_record *rec,
				ARRAY_TYPE(casbox_recovery_blob) *blobs,
				const char **error_r)
{
	const struct casbox_msg_part *part;
	struct casbox_pending_blob *blob;
	bool own_only = casbox_store_txn_gc_keeps_deks(txn);

	array_foreach(&rec->parts, part) {
		if (own_only) {
			if (casbox_store_txn_get_blob(txn, &part->id, &blob,
						      error_r) < 0)
				return -1;
			if (!blob->frame_written || blob->dek_recorded)
				continue;
			blob->dek_recorded = TRUE;
		}
		if (casbox_store_txn_recovery_blob(txn, &part->id, !own_only,
						   blobs, error_r) < 0)
			return -1;
	}
	return 0;
}

/* Seal the message's recovery record into the pack transaction, after
   its new blobs, so the pack commit makes them durable together. */
static int
casbox_store_txn_add_recovery(struct casbox_store_txn *txn, uint32_t uid,
			      const struct casbox_msg_record *rec,
			      const char **error_r)
{
	const struct casbox_mailbox_record *mrec = &txn->recovery_mailbox;
	struct casbox_recovery_record rrec;
	unsigned char locator[CASBOX_META_LOCATOR_SIZE];
	const char *error;
	buffer_t *plain;
	int ret;

	if (casbox_store_txn_pack_begin(txn, error_r) < 0)
		return -1;
	i_zero(&rrec);
	rrec.written_usecs = casbox_meta_now_usecs();
	guid_128_copy(rrec.mailbox_guid, txn->recovery_mailbox_guid);
	guid_128_copy(rrec.public_guid, txn->recovery_public_guid);
	rrec.uid_validity = mrec->uid_validity;
	rrec.uid = uid;
	rrec.next_uid = I_MAX(mrec->next_uid, uid + 1);
	rrec.highest_modseq = mrec->highest_modseq;
	rrec.mailbox_name = mrec->name;
	rrec.msg = *rec;
	/* derived from the bytes, and most of a record's size: a rebuilt
	   message parses its bytes instead, as one saved before it */
	rrec.msg.sealed_meta = NULL;
	rrec.msg.sealed_meta_size = 0;
	/* nor a reference to the LSM's shared metadata record, which a
	   rebuild from the packs does not have */
	rrec.msg.meta_ref = FALSE;
	t_array_init(&rrec.blobs, array_count(&rec->parts) + 1);
	if (casbox_store_txn_recovery_blobs(txn, rec, &rrec.blobs,
					    error_r) < 0)
		return -1;
	/* password mode: lets gc without the password find it live */
	plain = t_buffer_create(512);
	casbox_recovery_locator_data(rrec.mailbox_guid, uid, rec->guid, plain);
	casbox_pack_meta_locator_make(txn->store->packs, plain->data,
				      plain->used, locator);
	buffer_set_used_size(plain, 0);
	casbox_recovery_record_export(&rrec, plain);
	ret = casbox_pack_txn_add_meta_locator(txn->pack_txn,
					       CASBOX_META_KIND_RECOVERY,
					       locator, plain->data,
					       plain->used, &error);
	/* message metadata: not left in freed data stack memory */
	safe_memset(buffer_get_modifiable_data(plain, NULL), 0, plain->used);
	if (ret < 0) {
		*error_r = t_strdup_printf("pack append: %s", error);
		return -1;
	}
	return 0;
}

/* The copy record of the copies added so far into the pack
   transaction (before its commit). Returns 0 ok, -1 error. */
static int casbox_store_txn_flush_copies(struct casbox_store_txn *txn,
					 const char **error_r)
{
	const struct casbox_mailbox_record *mrec = &txn->recovery_mailbox;
	struct casbox_copy_record crec;
	const char *error;
	buffer_t *plain;
	int ret;

	if (txn->copy_body == NULL ||
	    casbox_copy_record_body_count(txn->copy_body) == 0)
		return 0;
	if (casbox_store_txn_pack_begin(txn, error_r) < 0)
		return -1;
	i_zero(&crec);
	crec.written_usecs = casbox_meta_now_usecs();
	guid_128_copy(crec.mailbox_guid, txn->recovery_mailbox_guid);
	guid_128_copy(crec.public_guid, txn->recovery_public_guid);
	crec.uid_validity = mrec->uid_validity;
	crec.next_uid = mrec->next_uid;
	crec.highest_modseq = mrec->highest_modseq;
	crec.mailbox_name = mrec->name;
	plain = buffer_create_dynamic(default_pool,
				      txn->copy_body->used / 2 + 256);
	casbox_copy_record_export(&crec, txn->copy_body, plain);
	ret = casbox_pack_txn_add_meta(txn->pack_txn, CASBOX_META_KIND_COPY,
				       plain->data, plain->used, &error);
	safe_memset(buffer_get_modifiable_data(plain, NULL), 0, plain->used);
	buffer_free(&plain);
	safe_memset(buffer_get_modifiable_data(txn->copy_body, NULL), 0,
		    txn->copy_body->used);
	casbox_copy_record_body_init(txn->copy_body);
	if (ret < 0) {
		*error_r = t_strdup_printf("pack append: %s", error);
		return -1;
	}
	return 0;
}

/* A copy's message record into the transaction's copy record (a frame
   per CASBOX_STORE_COPY_RECORD_FLUSH bytes of records). */
static int
casbox_store_txn_add_copy_recovery(struct casbox_store_txn *txn,
				   uint32_t uid,
				   const struct casbox_msg_record *rec,
				   const char **error_r)
{
	struct casbox_msg_record lean = *rec;

	/* as in a recovery record: no derived metadata, no reference to
	   the LSM's shared metadata */
	lean.sealed_meta = NULL;
	lean.sealed_meta_size = 0;
	lean.meta_ref = FALSE;
	if (txn->copy_body == NULL) {
		txn->copy_body = buffer_create_dynamic(default_pool, 4096);
		casbox_copy_record_body_init(txn->copy_body);
	}
	casbox_copy_record_body_add(txn->copy_body, uid, &lean);
	if (txn->copy_body->used < CASBOX_STORE_COPY_RECORD_FLUSH)
		return 0;
	return casbox_store_txn_flush_copies(txn, error_r);
}

/* The shared metadata record as this txn sees it (refcount 0 = none).
   Returns 0 ok, -1 error, -2 the record fails to verify or decode. */
static int
casbox_store_txn_get_meta(struct casbox_store_txn *txn,
			  const unsigned char id[CASBOX_META_ID_SIZE],
			  struct casbox_pending_meta **meta_r,
			  const char **error_r)
{
	struct casbox_pending_meta *meta;
	struct cas_blob_id lookup_id;
	buffer_t *key, *value;
	int ret;

	i_assert(CASBOX_META_ID_SIZE == CAS_BLOB_ID_SIZE);
	memcpy(lookup_id.id, id, CASBOX_META_ID_SIZE);
	meta = hash_table_lookup(txn->metas, &lookup_id);
	if (meta != NULL) {
		*meta_r = meta;
		return 0;
	}
	key = t_buffer_create(40);
	casbox_key_meta_refs(key, id);
	value = t_buffer_create(64);
	ret = casbox_store_lsm_get(txn->store, key, value, FALSE, error_r);
	if (ret < 0)
		return -1;
	meta = p_new(txn->blob_pool, struct casbox_pending_meta, 1);
	meta->id = lookup_id;
	if (ret > 0) {
		if (casbox_store_meta_refs_import(txn->store, key->data,
				key->used, value->data, value->used,
				&meta->refcount, error_r) < 0)
			return -2;
		meta->in_lsm = TRUE;
		meta->old_refcount = meta->refcount;
	}
	hash_table_insert(txn->metas, &meta->id, meta);
	array_push_back(&txn->meta_list, &meta);
	*meta_r = meta;
	return 0;
}

/* The record rec is going: release its shared metadata reference. */
static int
casbox_store_txn_unref_meta(struct casbox_store_txn *txn,
			    const struct casbox_msg_record *rec,
			    const char **error_r)
{
	struct casbox_pending_meta *meta;
	int ret;

	if (!rec->meta_ref)
		return 0;
	ret = casbox_store_txn_get_meta(txn, rec->meta_id, &meta, error_r);
	if (ret == -2) {
		/* derived data someone edited: the message goes anyway;
		   the record stays (scrub reports it) */
		i_error("casbox: store %s: %s (its reference is not "
			"released)", txn->store->root_dir, *error_r);
		return 0;
	}
	if (ret < 0)
		return -1;
	/* a missing record can't be released twice: ignore */
	if (meta->refcount > 0)
		meta->refcount--;
	return 0;
}

/* rec's sealed metadata as a reference to the shared record of its
   part list (created or referenced once more); rec_r is what the
   message record stores then. Without metadata rec_r is rec. Returns 0
   ok, -1 error. */
static int
casbox_store_txn_ref_meta(struct casbox_store_txn *txn,
			  const struct casbox_msg_record *rec,
			  struct casbox_msg_record *rec_r,
			  const char **error_r)
{
	struct casbox_pending_meta *meta;

	*rec_r = *rec;
	if (rec->sealed_meta_size == 0 && !rec->meta_ref)
		return 0;
	if (casbox_store_meta_id(txn->store, rec, rec_r->meta_id,
				 error_r) < 0 ||
	    casbox_store_txn_get_meta(txn, rec_r->meta_id, &meta,
				      error_r) < 0)
		return -1;
	if (meta->refcount == 0) {
		if (rec->sealed_meta_size == 0) {
			/* a reference to metadata that is gone: none */
			rec_r->meta_ref = FALSE;
			return 0;
		}
		if (meta->sealed == NULL) {
			meta->sealed = buffer_create_dynamic(default_pool,
						rec->sealed_meta_size);
		}
		buffer_set_used_size(meta->sealed, 0);
		buffer_append(meta->sealed, rec->sealed_meta,
			      rec->sealed_meta_size);
		txn->meta_bytes += rec->sealed_meta_size;
	} else if (meta->refcount == UINT32_MAX) {
		*error_r = "metadata record refcount overflow";
		return -1;
	}
	meta->refcount++;
	rec_r->meta_ref = TRUE;
	rec_r->sealed_meta = NULL;
	rec_r->sealed_meta_size = 0;
	return 0;
}

static int
casbox_store_txn_unref_parts(struct casbox_store_txn *txn,
			     const struct casbox_msg_record *rec,
			     const char **error_r)
{
	const struct casbox_msg_part *part;
	struct casbox_pending_blob *blob;

	array_foreach(&rec->parts, part) {
		if (casbox_store_txn_get_blob(txn, &part->id, &blob,
					      error_r) < 0)
			return -1;
		/* a missing blob can't be released twice: ignore */
		if (blob->refcount > 0)
			blob->refcount--;
	}
	return 0;
}

static int
casbox_store_txn_get_msg(struct casbox_store_txn *txn, const buffer_t *key,
			 struct casbox_msg_record *rec_r,
			 const char **error_r)
{
	buffer_t *value = t_buffer_create(256);
	int ret;

	ret = casbox_store_lsm_get(txn->store, key, value, FALSE, error_r);
	if (ret <= 0)
		return ret;
	return casbox_store_msg_value_import(txn->store, key->data, key->used,
					     value->data, value->used,
					     pool_datastack_create(), rec_r,
					     error_r);
}

/* Delete the message's flag record, if it has one (no tombstone for the
   usual message that never had a flag change). Returns 0 ok, -1 error. */
static int
casbox_store_txn_drop_flags(struct casbox_store_txn *txn,
			    const guid_128_t mailbox_guid, uint32_t uid,
			    const char **error_r)
{
	buffer_t *key = t_buffer_create(32), *value = t_buffer_create(64);
	int ret;

	casbox_key_flags(key, mailbox_guid, uid);
	ret = casbox_store_lsm_get(txn->store, key, value, FALSE, error_r);
	if (ret > 0)
		casbox_lsm_batch_delete(txn->batch, key->data, key->used);
	return ret < 0 ? -1 : 0;
}

static int
casbox_store_txn_add_msg_full(struct casbox_store_txn *txn,
			      const guid_128_t mailbox_guid, uint32_t uid,
			      const struct casbox_msg_record *rec,
			      struct istream *const *part_inputs, bool copy,
			      const char **error_r)
{
	const struct casbox_msg_part *parts;
	const struct casbox_xmsg_hints *hints;
	struct casbox_msg_record old_rec, stored;
	unsigned int i, count;
	buffer_t *key, *value;
	bool lead;
	int ret;

	key = t_buffer_create(32);
	casbox_key_message(key, mailbox_guid, uid);
	ret = casbox_store_txn_get_msg(txn, key, &old_rec, error_r);
	if (ret < 0)
		return -1;
	if (ret > 0 &&
	    (casbox_store_txn_unref_parts(txn, &old_rec, error_r) < 0 ||
	     casbox_store_txn_unref_meta(txn, &old_rec, error_r) < 0 ||
	     casbox_store_txn_drop_flags(txn, mailbox_guid, uid,
					 error_r) < 0))
		return -1;

	parts = array_get(&rec->parts, &count);
	hints = txn->hints;
	txn->hints = NULL;
	lead = hints != NULL && count > 0 &&
		parts[0].transform == CASBOX_PART_TRANSFORM_NONE;
	if (lead && txn->xmsg == NULL)
		txn->xmsg = casbox_xmsg_txn_create();
	for (i = 0; i < count; i++) {
		if (casbox_store_txn_ref_part(txn, &parts[i],
				lead && i == 0 ? hints : NULL,
				part_inputs == NULL ? NULL : part_inputs[i],
				error_r) < 0)
			return -1;
		casbox_store_txn_count_part(txn, &parts[i]);
	}
	if (lead && casbox_xmsg_put(txn->xmsg, txn->store, txn->batch, hints,
				    &parts[0].id, error_r) < 0)
		return -1;
	if (txn->have_recovery_mailbox &&
	    guid_128_equals(mailbox_guid, txn->recovery_mailbox_guid)) {
		if (copy && casbox_store_txn_gc_keeps_deks(txn) &&
		    array_count(&rec->parts) > 0)
			ret = casbox_store_txn_add_copy_recovery(txn, uid, rec,
								 error_r);
		else
			ret = casbox_store_txn_add_recovery(txn, uid, rec,
							    error_r);
		if (ret < 0)
			return -1;
	}
	value = t_buffer_create(256);
	if (casbox_records_ensure_marker(txn->store, txn->batch,
					 error_r) < 0 ||
	    casbox_store_txn_ref_meta(txn, rec, &stored, error_r) < 0 ||
	    casbox_store_msg_value_export(txn->store, key, &stored, value,
					  error_r) < 0)
		return -1;
	casbox_lsm_batch_put(txn->batch, key->data, key->used,
			     value->data, value->used);
	return 0;
}

int casbox_store_txn_add_msg(struct casbox_store_txn *txn,
			     const guid_128_t mailbox_guid, uint32_t uid,
			     const struct casbox_msg_record *rec,
			     struct istream *const *part_inputs,
			     const char **error_r)
{
	return casbox_store_txn_add_msg_full(txn, mailbox_guid, uid, rec,
					     part_inputs, FALSE, error_r);
}

int casbox_store_txn_add_copy(struct casbox_store_txn *txn,
			      const guid_128_t mailbox_guid, uint32_t uid,
			      const struct casbox_msg_record *rec,
			      const char **error_r)
{
	return casbox_store_txn_add_msg_full(txn, mailbox_guid, uid, rec,
					     NULL, TRUE, error_r);
}

void casbox_store_txn_put_mailbox(struct casbox_store_txn *txn,
				  const guid_128_t mailbox_guid,
				  const struct casbox_mailbox_record *rec)
{
	struct casbox_mailbox_record old, merged = *rec;
	buffer_t *key, *value;
	const char *error;

	key = t_buffer_create(32);
	casbox_key_mailbox(key, mailbox_guid);
	value = t_buffer_create(64);
	/* a writer with an older view must not lower what another
	   process wrote (the write lock is held) */
	if (casbox_store_lsm_get(txn->store, key, value, FALSE, &error) > 0 &&
	    casbox_mailbox_record_import(value->data, value->used,
					 pool_datastack_create(), &old,
					 &error) > 0) {
		if (old.uid_validity == rec->uid_validity) {
			merged.next_uid = I_MAX(merged.next_uid,
						old.next_uid);
			merged.highest_modseq = I_MAX(merged.highest_modseq,
						      old.highest_modseq);
		}
		/* writers that do not know the public mailbox GUID
		   (saves) keep the one stored */
		if (guid_128_is_empty(merged.guid))
			guid_128_copy(merged.guid, old.guid);
	}
	buffer_set_used_size(value, 0);
	casbox_mailbox_record_export(&merged, value);
	casbox_lsm_batch_put(txn->batch, key->data, key->used,
			     value->data, value->used);
}

int casbox_store_txn_expunge(struct casbox_store_txn *txn,
			     const guid_128_t mailbox_guid, uint32_t uid,
			     const char **error_r)
{
	struct casbox_msg_record rec;
	buffer_t *key;
	int ret;

	key = t_buffer_create(32);
	casbox_key_message(key, mailbox_guid, uid);
	ret = casbox_store_txn_get_msg(txn, key, &rec, error_r);
	if (ret <= 0)
		return ret;
	if (casbox_store_txn_unref_parts(txn, &rec, error_r) < 0 ||
	    casbox_store_txn_unref_meta(txn, &rec, error_r) < 0 ||
	    casbox_store_txn_drop_flags(txn, mailbox_guid, uid, error_r) < 0)
		return -1;
	casbox_lsm_batch_delete(txn->batch, key->data, key->used);
	return 0;
}

/* The retained record at key, if any, with its references released.
   Returns 0 ok, -1 error. */
static int
casbox_store_txn_drop_retained(struct casbox_store_txn *txn,
			       const buffer_t *key, const char **error_r)
{
	struct casbox_retained_record old;
	buffer_t *value = t_buffer_create(256);
	int ret;

	ret = casbox_store_lsm_get(txn->store, key, value, FALSE, error_r);
	if (ret <= 0)
		return ret;
	if (casbox_store_retained_value_import(txn->store, key->data,
					       key->used, value->data,
					       value->used,
					       pool_datastack_create(), &old,
					       error_r) < 0 ||
	    casbox_store_txn_unref_parts(txn, &old.msg, error_r) < 0)
		return -1;
	casbox_lsm_batch_delete(txn->batch, key->data, key->used);
	return 0;
}

int casbox_store_txn_retain(struct casbox_store_txn *txn,
			    const guid_128_t mailbox_guid, uint32_t uid,
			    const char *mailbox_name, time_t expunged,
			    const char **error_r)
{
	struct casbox_retained_record rrec;
	struct casbox_msg_record rec;
	buffer_t *key, *xkey, *value;
	int ret;

	key = t_buffer_create(32);
	casbox_key_message(key, mailbox_guid, uid);
	ret = casbox_store_txn_get_msg(txn, key, &rec, error_r);
	if (ret <= 0)
		return ret;
	if (casbox_store_msg_overlay_flags(txn->store, mailbox_guid, uid,
					   pool_datastack_create(), &rec,
					   error_r) < 0)
		return -1;
	xkey = t_buffer_create(32);
	casbox_key_retained(xkey, mailbox_guid, uid);
	/* the retained record keeps the blobs' references, not the
	   metadata's (undelete saves the message again) */
	if (casbox_store_txn_drop_retained(txn, xkey, error_r) < 0 ||
	    casbox_store_txn_unref_meta(txn, &rec, error_r) < 0 ||
	    casbox_store_txn_drop_flags(txn, mailbox_guid, uid, error_r) < 0)
		return -1;
	i_zero(&rrec);
	rrec.expunged = expunged;
	rrec.mailbox_name = mailbox_name;
	casbox_msg_record_dup_lean(pool_datastack_create(), &rec, &rrec.msg);
	value = t_buffer_create(256);
	if (casbox_records_ensure_marker(txn->store, txn->batch,
					 error_r) < 0 ||
	    casbox_store_retained_value_export(txn->store, xkey, &rrec, value,
					       error_r) < 0)
		return -1;
	casbox_lsm_batch_put(txn->batch, xkey->data, xkey->used,
			     value->data, value->used);
	casbox_lsm_batch_delete(txn->batch, key->data, key->used);
	return 0;
}

int casbox_store_txn_release_retained(struct casbox_store_txn *txn,
				      const guid_128_t mailbox_guid,
				      uint32_t uid, const char **error_r)
{
	buffer_t *key = t_buffer_create(32);

	casbox_key_retained(key, mailbox_guid, uid);
	return casbox_store_txn_drop_retained(txn, key, error_r);
}

void casbox_store_txn_set_xmsg_hints(struct casbox_store_txn *txn,
				     const struct casbox_xmsg_hints *hints)
{
	struct casbox_store *store = txn->store;

	/* password mode without the password (LMTP) cannot decode a base:
	   its deliveries are stored alone */
	if (!casbox_store_xmsg_enabled(store) ||
	    store->keyring == NULL || !cas_keyring_can_decrypt(store->keyring))
		txn->hints = NULL;
	else
		txn->hints = hints;
}

struct casbox_lsm_batch *
casbox_store_txn_get_batch(struct casbox_store_txn *txn)
{
	return txn->batch;
}

struct casbox_store *casbox_store_txn_get_store(struct casbox_store_txn *txn)
{
	return txn->store;
}

int casbox_store_txn_update_flags(struct casbox_store_txn *txn,
				  const guid_128_t mailbox_guid, uint32_t uid,
				  uint32_t flags,
				  const char *const *keywords,
				  uint64_t modseq, const char **error_r)
{
	buffer_t *key, *value;
	int ret;

	/* only for a message that is there (one expunged meanwhile gets
	   no record that nothing would delete) */
	key = t_buffer_create(32);
	casbox_key_message(key, mailbox_guid, uid);
	value = t_buffer_create(256);
	ret = casbox_store_lsm_get(txn->store, key, value, FALSE, error_r);
	if (ret <= 0)
		return ret;
	/* a small record of its own: the message record (parts, sealed
	   metadata: ~1.5-3 kB) is not written again for a flag change */
	buffer_set_used_size(key, 0);
	casbox_key_flags(key, mailbox_guid, uid);
	buffer_set_used_size(value, 0);
	if (casbox_records_ensure_marker(txn->store, txn->batch,
					 error_r) < 0 ||
	    casbox_store_flags_value_export(txn->store, key, flags, modseq,
					    keywords, value, error_r) < 0)
		return -1;
	casbox_lsm_batch_put(txn->batch, key->data, key->used,
			     value->data, value->used);
	return 0;
}

static void casbox_store_txn_free(struct casbox_store_txn **_txn)
{
	struct casbox_store_txn *txn = *_txn;

	*_txn = NULL;
	i_assert(txn->store->txns_open > 0);
	txn->store->txns_open--;
	casbox_xmsg_txn_destroy(&txn->xmsg);
	casbox_store_txn_blobs_deinit(txn);
	if (txn->copy_body != NULL) {
		safe_memset(buffer_get_modifiable_data(txn->copy_body, NULL),
			    0, txn->copy_body->used);
		buffer_free(&txn->copy_body);
	}
	pool_unref(&txn->pool);
}

/* The shared metadata records this txn changed, into its batch. */
static int casbox_store_txn_put_metas(struct casbox_store_txn *txn,
				      const char **error_r)
{
	struct casbox_pending_meta *meta;
	buffer_t *key, *value;

	key = t_buffer_create(40);
	value = t_buffer_create(64);
	array_foreach_elem(&txn->meta_list, meta) {
		bool in_lsm = meta->in_lsm && meta->sealed == NULL;

		if (meta->refcount == meta->old_refcount && in_lsm)
			continue;
		if (meta->refcount == 0) {
			if (!meta->in_lsm)
				continue;
			buffer_set_used_size(key, 0);
			casbox_key_meta_refs(key, meta->id.id);
			casbox_lsm_batch_delete(txn->batch, key->data,
						key->used);
			buffer_set_used_size(key, 0);
			casbox_key_meta(key, meta->id.id);
			casbox_lsm_batch_delete(txn->batch, key->data,
						key->used);
			continue;
		}
		if (meta->sealed != NULL) {
			/* created here: the sealed bytes, once */
			buffer_set_used_size(key, 0);
			casbox_key_meta(key, meta->id.id);
			value = t_buffer_create(meta->sealed->used + 32);
			if (casbox_store_meta_value_export(txn->store, key,
					meta->sealed->data, meta->sealed->used,
					value, error_r) < 0)
				return -1;
			casbox_lsm_batch_put(txn->batch, key->data, key->used,
					     value->data, value->used);
		}
		buffer_set_used_size(key, 0);
		casbox_key_meta_refs(key, meta->id.id);
		value = t_buffer_create(64);
		if (casbox_store_meta_refs_export(txn->store, key,
						  meta->refcount, value,
						  error_r) < 0)
			return -1;
		casbox_lsm_batch_put(txn->batch, key->data, key->used,
				     value->data, value->used);
	}
	return 0;
}

/* Every blob whose last reference went releases its base's reference.
   A base that loses its last one so releases its own in the next pass
   (it may be before its dependent in the list): at most one pass per
   chain level, and one that releases nothing. */
static int casbox_store_txn_release_bases(struct casbox_store_txn *txn,
					  const char **error_r)
{
	struct casbox_pending_blob *blob;
	unsigned int i;
	bool released;

	do {
		released = FALSE;
		/* (the list grows as bases are looked up) */
		for (i = 0; i < array_count(&txn->blob_list); i++) {
			blob = array_idx_elem(&txn->blob_list, i);
			if (blob->refcount > 0 || blob->base_released)
				continue;
			blob->base_released = TRUE;
			released = TRUE;
			if (casbox_store_txn_unref_base(txn, blob->pack_record,
							error_r) < 0)
				return -1;
		}
	} while (released);
	return 0;
}

/* Commit the packs, then the blob records and the batch. Returns 0 ok,
   -1 error (the batch is gone either way; the pack transaction too). */
static int casbox_store_txn_commit_batch(struct casbox_store_txn *txn,
					 const char **error_r)
{
	struct casbox_pending_blob *blob;
	struct casbox_blob_value bval;
	const char *error;
	buffer_t *key, *value;
	int ret;

	if (casbox_store_txn_release_bases(txn, error_r) < 0) {
		if (txn->pack_txn != NULL)
			casbox_pack_txn_rollback(&txn->pack_txn);
		casbox_lsm_batch_rollback(&txn->batch);
		return -1;
	}

	if (casbox_store_txn_flush_copies(txn, error_r) < 0) {
		if (txn->pack_txn != NULL)
			casbox_pack_txn_rollback(&txn->pack_txn);
		casbox_lsm_batch_rollback(&txn->batch);
		return -1;
	}
	/* blobs first: a record must never point to bytes that are not
	   durable */
	if (txn->pack_txn != NULL &&
	    casbox_pack_txn_commit(&txn->pack_txn, &error) < 0) {
		*error_r = t_strdup_printf("pack commit: %s", error);
		casbox_lsm_batch_rollback(&txn->batch);
		return -1;
	}
	key = t_buffer_create(40);
	value = t_buffer_create(128);
	array_foreach_elem(&txn->blob_list, blob) {
		buffer_set_used_size(key, 0);
		casbox_key_blob(key, &blob->id);
		if (blob->refcount == 0) {
			if (blob->in_lsm) {
				casbox_lsm_batch_delete(txn->batch, key->data,
							key->used);
				txn->store->stats.blob_records_written++;
			}
			continue;
		}
		txn->store->stats.blob_records_written++;
		i_zero(&bval);
		bval.refcount = blob->refcount;
		bval.pack_record = blob->pack_record->data;
		bval.pack_record_size = blob->pack_record->used;
		buffer_set_used_size(value, 0);
		casbox_blob_value_export(&bval, value);
		casbox_lsm_batch_put(txn->batch, key->data, key->used,
				     value->data, value->used);
	}
	if (casbox_store_txn_put_metas(txn, error_r) < 0) {
		casbox_lsm_batch_rollback(&txn->batch);
		return -1;
	}
	ret = casbox_lsm_batch_commit(&txn->batch, error_r);
	return ret < 0 ? -1 : 0;
}

int casbox_store_txn_commit(struct casbox_store_txn **_txn,
			    const char **error_r)
{
	int ret;

	/* a big transaction's tail would be replayed by every session
	   opening the store until the WAL fills up */
	if ((*_txn)->checkpointed)
		casbox_lsm_batch_set_flush((*_txn)->batch);
	ret = casbox_store_txn_commit_batch(*_txn, error_r);
	casbox_store_txn_free(_txn);
	return ret;
}

int casbox_store_txn_checkpoint(struct casbox_store_txn *txn,
				const char **error_r)
{
	if (casbox_lsm_batch_get_size(txn->batch) +
	    array_count(&txn->blob_list) * CASBOX_STORE_BLOB_ENTRY_SIZE +
	    txn->meta_bytes < CASBOX_STORE_TXN_CHECKPOINT_SIZE)
		return 0;
	if (casbox_store_txn_commit_batch(txn, error_r) < 0)
		return -1;
	txn->checkpointed = TRUE;
	/* the blobs' state is in the LSM now: read it from there again */
	casbox_store_txn_blobs_deinit(txn);
	casbox_store_txn_blobs_init(txn);
	txn->keys_current = FALSE;
	if (casbox_lsm_batch_begin(txn->store->lsm, &txn->batch,
				   error_r) < 0)
		return -1;
	if (txn->lazy)
		casbox_lsm_batch_set_lazy(txn->batch);
	return 1;
}

void casbox_store_txn_set_lazy(struct casbox_store_txn *txn)
{
	if (txn->store->fsync_always)
		return;
	txn->lazy = TRUE;
	casbox_lsm_batch_set_lazy(txn->batch);
}

void casbox_store_txn_rollback(struct casbox_store_txn **_txn)
{
	struct casbox_store_txn *txn = *_txn;

	if (txn->pack_txn != NULL)
		casbox_pack_txn_rollback(&txn->pack_txn);
	if (txn->batch != NULL)
		casbox_lsm_batch_rollback(&txn->batch);
	casbox_store_txn_free(_txn);
}

void casbox_store_get_stats(struct casbox_store *store,
			    struct casbox_store_stats *stats_r)
{
	*stats_r = store->stats;
}

uint64_t casbox_store_get_pack_bytes_appended(struct casbox_store *store)
{
	return store->packs == NULL ? 0 :
		casbox_pack_store_get_bytes_appended(store->packs);
}

const char *casbox_store_get_root(struct casbox_store *store)
{
	return store->root_dir;
}

struct casbox_lsm *casbox_store_get_lsm(struct casbox_store *store)
{
	return store->lsm;
}

struct casbox_pack_store *casbox_store_get_packs(struct casbox_store *store)
{
	return store->packs;
}

struct cas_keyring *casbox_store_get_keyring(struct casbox_store *store)
{
	return store->keyring;
}

int casbox_store_open_packs_keyless(struct casbox_store *store,
				    const char **error_r)
{
	const char *dir_path = t_strconcat(store->root_dir, "/packs", NULL);
	struct casbox_pack_settings pack_set;
	struct dirent *d;
	const char *error;
	bool have_dicts = FALSE;
	DIR *dir;

	if (store->packs != NULL)
		return 1;
	dir = opendir(dir_path);
	if (dir == NULL && errno != ENOENT) {
		*error_r = t_strdup_printf("opendir(%s) failed: %m", dir_path);
		return -1;
	}
	while (dir != NULL && (d = readdir(dir)) != NULL) {
		if (strncmp(d->d_name, "dict-", 5) == 0)
			have_dicts = TRUE;
	}
	if (dir != NULL)
		(void)closedir(dir);
	/* the pack store opens the dictionaries, which needs the key */
	if (have_dicts)
		return 0;
	casbox_store_pack_settings(store, &pack_set);
	if (casbox_pack_store_open(&pack_set, NULL, &store->packs,
				   &error) < 0) {
		*error_r = t_strdup_printf("packs %s: %s", dir_path, error);
		return -1;
	}
	return 1;
}

uint64_t casbox_store_get_chunks_decoded(void)
{
	return casbox_pack_get_chunks_decoded();
}

uint64_t casbox_store_get_bytes_decoded(void)
{
	return casbox_pack_get_bytes_decoded();
}

struct casbox_store_write_lock {
	struct casbox_store *store;
	struct casbox_lsm_batch *batch;
};

int casbox_store_write_lock(struct casbox_store *store,
			    struct casbox_store_write_lock **lock_r,
			    const char **error_r)
{
	struct casbox_lsm_batch *batch;

	*lock_r = NULL;
	/* a batch holds the LSM write lock from begin to its end */
	if (casbox_lsm_batch_begin(store->lsm, &batch, error_r) < 0)
		return -1;
	*lock_r = i_new(struct casbox_store_write_lock, 1);
	(*lock_r)->batch = batch;
	(*lock_r)->store = store;
	store->txns_open++;
	return 0;
}

void casbox_store_write_unlock(struct casbox_store_write_lock **_lock)
{
	struct casbox_store_write_lock *lock = *_lock;

	*_lock = NULL;
	lock->store->txns_open--;
	casbox_lsm_batch_rollback(&lock->batch);
	i_free(lock);
}

const struct casbox_settings *
casbox_store_get_settings(struct casbox_store *store)
{
	return store->set;
}

bool casbox_store_get_fsync(struct casbox_store *store)
{
	return store->fsync;
}

enum file_lock_method casbox_store_get_lock_method(struct casbox_store *store)
{
	return store->lock_method;
}

void casbox_store_pack_set_storage(const struct casbox_settings *set,
				   struct casbox_pack_settings *pack_set)
{
	pack_set->storage = set->pack_storage;
	pack_set->cache_dir = set->pack_cache_dir;
	pack_set->cache_size = set->pack_cache_size;
}

bool casbox_store_error_is_temporary(struct casbox_store *store)
{
	return store->packs != NULL &&
		casbox_pack_store_error_is_temporary(store->packs);
}
