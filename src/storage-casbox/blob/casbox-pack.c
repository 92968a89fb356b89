/* Pack store and append transactions. Frames are written after the
   current end of the pack under the append lock; the header goes last,
   so a crash mid-frame leaves bytes that no reader accepts (no magic or
   a bad CRC) and the scanner skips. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "file-lock.h"
#include "mkdir-parents.h"
#include "read-full.h"
#include "write-full.h"
#include "byteorder.h"
#include "cas-crc32c.h"
#include "cas-durable.h"
#include "casbox-objstore.h"
#include "casbox-pack-private.h"
#include "casbox-pack-file.h"

#include <sodium.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/time.h>

/* fcntl locks do not exclude another fd of the same process: remember
   which lock files this process holds so that two stores on one
   directory cannot interleave appends */
#define CASBOX_PACK_MAX_LOCAL_LOCKS 16
static struct {
	dev_t dev;
	ino_t ino;
	bool used;
} casbox_pack_local_locks[CASBOX_PACK_MAX_LOCAL_LOCKS];

struct casbox_pack_txn {
	struct casbox_pack_store *store;
	int lock_fd;
	struct file_lock *lock;
	int local_lock_idx;

	int fd;
	uint32_t pack_id;
	/* of the pack header: meta frames go only into version 2+ */
	uint32_t pack_version;
	uint64_t start_offset, offset;

	/* the store's txn_plain/txn_stored; the bytes written to them
	   are wiped when the transaction ends */
	unsigned char *plain;	/* CASBOX_CHUNK_SIZE */
	unsigned char *stored;	/* CASBOX_CHUNK_MAX_STORED */
	/* the store's txn_alt (CASBOX_CHUNK_MAX_STORED), NULL until a
	   blob with a base is added */
	unsigned char *alt;
	size_t plain_used, stored_used, alt_used;
	buffer_t *table;
};

int casbox_zstd_check(size_t ret, const char *what, const char **error_r)
{
	if (!ZSTD_isError(ret))
		return 0;
	*error_r = t_strdup_printf("%s failed: %s", what,
				   ZSTD_getErrorName(ret));
	return -1;
}

const char *casbox_pack_path(struct casbox_pack_store *store,
			     uint32_t pack_id)
{
	return t_strdup_printf("%s/pack-%08u.cbp", store->set.dir, pack_id);
}

/* The pack file writes, through the store's I/O table (crashfs in the
   crash tests). */
static int pack_pwrite_full(struct casbox_pack_store *store, int fd,
			    const void *data, size_t size, uoff_t offset)
{
	ssize_t ret;

	while (size > 0) {
		ret = store->io->pwrite(fd, data, size, offset);
		if (ret < 0)
			return -1;
		if (ret == 0) {
			errno = ENOSPC;
			return -1;
		}
		data = CONST_PTR_OFFSET(data, ret);
		size -= ret;
		offset += ret;
	}
	return 0;
}

static int txn_pwrite(struct casbox_pack_txn *txn, const void *data,
		      size_t size, uoff_t offset)
{
	return pack_pwrite_full(txn->store, txn->fd, data, size, offset);
}

static void pack_close_fd(struct casbox_pack_store *store, int *fd)
{
	if (store->io->close(*fd) < 0)
		i_error("close(pack) failed: %m");
	*fd = -1;
}

struct casbox_meta_sealer;
static const struct casbox_meta_sealer *
casbox_pack_meta_sealer_for(const struct cas_keyring *keyring);

int casbox_pack_store_open(const struct casbox_pack_settings *set,
			   const struct cas_keyring *keyring,
			   struct casbox_pack_store **store_r,
			   const char **error_r)
{
	struct casbox_pack_store *store;
	struct stat st;
	pool_t pool;

	*store_r = NULL;
	/* a stat() when it exists, not mkdir_parents()'s umask() twice
	   around an mkdir() that fails with EEXIST */
	if (stat(set->dir, &st) < 0 &&
	    mkdir_parents(set->dir, 0700) < 0 && errno != EEXIST) {
		*error_r = t_strdup_printf("mkdir(%s) failed: %m", set->dir);
		return -1;
	}
	pool = pool_alloconly_create("casbox pack store", 1024);
	store = p_new(pool, struct casbox_pack_store, 1);
	store->pool = pool;
	store->set = *set;
	store->io = set->io != NULL ? set->io : &cas_io_posix;
	store->set.dir = p_strdup(pool, set->dir);
	if (store->set.max_pack_size == 0)
		store->set.max_pack_size = CASBOX_PACK_DEFAULT_MAX_SIZE;
	if (store->set.zstd_level == 0)
		store->set.zstd_level = CASBOX_PACK_DEFAULT_ZSTD_LEVEL;
	if (store->set.dict_max_blob_size == 0) {
		store->set.dict_max_blob_size =
			CASBOX_PACK_DEFAULT_DICT_MAX_BLOB_SIZE;
	}
	store->keyring = keyring;
	store->kept_fd = -1;
	store->meta = casbox_pack_meta_sealer_for(keyring);
	store->set.storage = NULL;
	store->set.cache_dir = NULL;
	store->cache_dir = p_strdup(pool, set->cache_dir != NULL ?
		set->cache_dir : t_strconcat(set->dir, "/cache", NULL));
	if (store->set.cache_size == 0)
		store->set.cache_size = CASBOX_PACK_DEFAULT_CACHE_SIZE;
	if (casbox_objstore_create(set->storage, &store->remote,
				   error_r) < 0) {
		pool_unref(&pool);
		return -1;
	}
	i_array_init(&store->dicts, 4);
	store->base_cache = casbox_base_cache_create(set->base_cache_size);
	store->cctx = ZSTD_createCCtx();
	store->dctx = ZSTD_createDCtx();
	if (store->cctx == NULL || store->dctx == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "ZSTD_create*Ctx() failed");
	/* bounds any streaming use; one-shot decoding checks it itself */
	if (ZSTD_isError(ZSTD_DCtx_setParameter(store->dctx,
			ZSTD_d_windowLogMax, CASBOX_ZSTD_WINDOW_LOG_MAX)))
		i_panic("ZSTD_d_windowLogMax %d refused",
			CASBOX_ZSTD_WINDOW_LOG_MAX);
	i_assert(casbox_padme(ZSTD_compressBound(CASBOX_CHUNK_SIZE)) ==
		 CASBOX_CHUNK_MAX_PADDED);
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	if (cas_aead_cipher_resolve(set->cipher, &store->set.cipher,
				    error_r) < 0) {
		casbox_pack_store_close(&store);
		return -1;
	}

	*store_r = store;
	return 1;
}

void casbox_pack_store_close(struct casbox_pack_store **_store)
{
	struct casbox_pack_store *store = *_store;

	if (store == NULL)
		return;
	*_store = NULL;
	i_assert(store->txn == NULL);
	if (store->upload_pending) T_BEGIN {
		const char *error;

		/* deliveries go on locally; the next close or doveadm
		   casbox upload tries again */
		if (casbox_pack_store_upload(store, FALSE, &error) < 0) {
			i_warning("casbox: uploading sealed packs of %s "
				  "failed (kept locally, retried later): %s",
				  store->set.dir, error);
		}
	} T_END;
	casbox_pack_store_release_read_fd(store);
	casbox_objstore_destroy(&store->remote);
	casbox_pack_dicts_free(store);
	casbox_blob_scratch_free_all(store);
	array_free(&store->dicts);
	ZSTD_freeCCtx(store->cctx);
	ZSTD_freeDCtx(store->dctx);
	i_free(store->txn_plain);
	i_free(store->txn_stored);
	i_free(store->txn_alt);
	casbox_base_cache_destroy(&store->base_cache);
	pool_unref(&store->pool);
}

void casbox_pack_store_keep_read_fd(struct casbox_pack_store *store)
{
	store->keep_read_fd = TRUE;
}

void casbox_pack_store_release_read_fd(struct casbox_pack_store *store)
{
	if (store->kept_fd != -1)
		i_close_fd(&store->kept_fd);
}

static int uint32_cmp(const uint32_t *a, const uint32_t *b)
{
	return *a < *b ? -1 : (*a > *b ? 1 : 0);
}

int casbox_pack_list(struct casbox_pack_store *store,
		     ARRAY_TYPE(uint32_t) *ids, const char **error_r)
{
	return casbox_pack_list_dir(store, ids, NULL, error_r);
}

int casbox_pack_list_dir(struct casbox_pack_store *store,
			 ARRAY_TYPE(uint32_t) *ids,
			 ARRAY_TYPE(uint32_t) *dict_ids,
			 const char **error_r)
{
	struct dirent *d;
	unsigned int id, count, local = 0;
	const uint32_t *ids_arr;
	char end;
	DIR *dir;

	dir = opendir(store->set.dir);
	if (dir == NULL) {
		*error_r = t_strdup_printf("opendir(%s) failed: %m",
					   store->set.dir);
		return -1;
	}
	while ((d = readdir(dir)) != NULL) {
		if (strlen(d->d_name) != 17)
			continue;
		if (sscanf(d->d_name, "pack-%08u.cb%c", &id, &end) == 2 &&
		    (end == 'p' || end == 'r') && id > 0) {
			if (ids == NULL)
				continue;
			array_push_back(ids, &id);
			if (end == 'p')
				local++;
		} else if (dict_ids != NULL &&
			   sscanf(d->d_name, "dict-%08u.cb%c", &id,
				  &end) == 2 && end == 'd' && id > 0) {
			array_push_back(dict_ids, &id);
		}
	}
	if (closedir(dir) < 0) {
		*error_r = t_strdup_printf("closedir(%s) failed: %m",
					   store->set.dir);
		return -1;
	}
	if (ids == NULL)
		return 0;
	array_sort(ids, uint32_cmp);
	/* a pack mid-upload has both names: once */
	ids_arr = array_get(ids, &count);
	for (unsigned int i = 1; i < count; ) {
		if (ids_arr[i] == ids_arr[i - 1]) {
			array_delete(ids, i, 1);
			ids_arr = array_get(ids, &count);
		} else {
			i++;
		}
	}
	if (local > 1 && store->remote != NULL)
		store->upload_pending = TRUE;
	return 0;
}

int casbox_pack_store_id_range(struct casbox_pack_store *store,
			       uint32_t *oldest_r, uint32_t *newest_r,
			       const char **error_r)
{
	ARRAY_TYPE(uint32_t) ids;
	const uint32_t *id;
	unsigned int count;
	int ret = 0;

	*oldest_r = *newest_r = 0;
	i_array_init(&ids, 16);
	if (casbox_pack_list(store, &ids, error_r) < 0)
		ret = -1;
	else {
		id = array_get(&ids, &count);
		if (count > 0) {
			*oldest_r = id[0];
			*newest_r = id[count - 1];
		}
	}
	array_free(&ids);
	return ret;
}

static int
casbox_pack_create(struct casbox_pack_txn *txn, uint32_t pack_id,
		   const char **error_r)
{
	struct casbox_pack_store *store = txn->store;
	unsigned char hdr[CASBOX_PACK_HEADER_SIZE];
	const char *path = casbox_pack_path(store, pack_id);
	int fd;

	fd = store->io->open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s, O_EXCL) failed: %m",
					   path);
		return -1;
	}
	casbox_pack_header_write(pack_id, hdr);
	if (pack_pwrite_full(store, fd, hdr, sizeof(hdr), 0) < 0) {
		*error_r = t_strdup_printf("write(%s) failed: %m", path);
		pack_close_fd(store, &fd);
		if (store->io->unlink(path) < 0)
			i_error("unlink(%s) failed: %m", path);
		return -1;
	}
	if (store->set.fsync && store->io->fsync(fd) < 0) {
		*error_r = t_strdup_printf("fsync(%s) failed: %m", path);
		pack_close_fd(store, &fd);
		return -1;
	}
	if (store->set.fsync &&
	    cas_durable_fsync_dir(store->io, store->set.dir, error_r) < 0) {
		pack_close_fd(store, &fd);
		return -1;
	}
	txn->fd = fd;
	txn->pack_id = pack_id;
	txn->pack_version = CASBOX_PACK_VERSION;
	txn->start_offset = txn->offset = CASBOX_PACK_HEADER_SIZE;
	store->last_pack_id = pack_id;
	if (store->remote != NULL && pack_id > 1)
		store->upload_pending = TRUE;
	return 0;
}

/* The pack header's version; 0 if unreadable (the scanner reports why;
   an append treats it like version 1 and starts a new pack before a
   meta frame). */
static uint32_t casbox_pack_read_version(int fd)
{
	unsigned char hdr[CASBOX_PACK_HEADER_SIZE];

	if (pread(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr) ||
	    memcmp(hdr, "CASBPACK", 8) != 0)
		return 0;
	return le32_to_cpu_unaligned(hdr + 8);
}

static int
casbox_pack_open_last(struct casbox_pack_txn *txn, const char **error_r)
{
	struct casbox_pack_store *store = txn->store;
	ARRAY_TYPE(uint32_t) ids, dict_ids;
	const char *path;
	struct stat st;
	uint32_t id;

	/* The newest pack, listed each time under the append lock. Another
	   process may have rotated since this store last appended, and
	   gc deletes old packs (never the newest: it starts a new one
	   first), so pack ids have gaps: walking on from a remembered id
	   found a deleted pack (every later save of a long IMAP session
	   failed with ENOENT) or appended to an old pack that a running gc
	   could delete after its records had moved (doc/doveadm.md, "gc
	   and concurrent saves"). One readdir per save transaction, which
	   also loads the dictionaries written since the last (the store
	   open no longer lists the directory for them). */
	t_array_init(&ids, 16);
	t_array_init(&dict_ids, 4);
	if (casbox_pack_list_dir(store, &ids, &dict_ids, error_r) < 0)
		return -1;
	if (store->keyring != NULL)
		casbox_pack_dicts_load_listed(store, &dict_ids);
	if (array_count(&ids) == 0) {
		/* never an id again that a pack had */
		return casbox_pack_create(txn, store->last_pack_id + 1,
					  error_r);
	}
	id = *array_back(&ids);
	store->last_pack_id = I_MAX(store->last_pack_id, id);

	path = casbox_pack_path(store, id);
	txn->fd = store->io->open(path, O_RDWR | O_CLOEXEC, 0);
	if (txn->fd == -1 && errno == ENOENT) {
		/* the newest pack is in object storage (a new server after
		   rebuild --from-packs): never append to a sealed pack */
		return casbox_pack_create(txn, id + 1, error_r);
	}
	if (txn->fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	if (store->io->fstat(txn->fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", path);
		return -1;
	}
	if ((uint64_t)st.st_size < CASBOX_PACK_HEADER_SIZE ||
	    (uint64_t)st.st_size >= store->set.max_pack_size) {
		/* full, or its creation never completed: start a new one */
		pack_close_fd(store, &txn->fd);
		return casbox_pack_create(txn, id + 1, error_r);
	}
	txn->pack_id = id;
	txn->pack_version = casbox_pack_read_version(txn->fd);
	txn->start_offset = txn->offset = st.st_size;
	return 0;
}

static int
casbox_pack_local_lock(struct casbox_pack_txn *txn, const char *lock_path,
		       const char **error_r)
{
	struct stat st;
	int i, free_idx = -1;

	if (fstat(txn->lock_fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", lock_path);
		return -1;
	}
	for (i = 0; i < CASBOX_PACK_MAX_LOCAL_LOCKS; i++) {
		if (!casbox_pack_local_locks[i].used) {
			if (free_idx == -1)
				free_idx = i;
		} else if (casbox_pack_local_locks[i].dev == st.st_dev &&
			   casbox_pack_local_locks[i].ino == st.st_ino) {
			*error_r = t_strdup_printf(
				"%s: this process is already appending",
				lock_path);
			return -1;
		}
	}
	if (free_idx == -1) {
		*error_r = "too many pack transactions in one process";
		return -1;
	}
	casbox_pack_local_locks[free_idx].dev = st.st_dev;
	casbox_pack_local_locks[free_idx].ino = st.st_ino;
	casbox_pack_local_locks[free_idx].used = TRUE;
	txn->local_lock_idx = free_idx;
	return 0;
}

static void casbox_pack_txn_free(struct casbox_pack_txn *txn)
{
	if (txn->local_lock_idx != -1)
		casbox_pack_local_locks[txn->local_lock_idx].used = FALSE;
	if (txn->fd != -1)
		pack_close_fd(txn->store, &txn->fd);
	if (txn->lock != NULL)
		file_unlock(&txn->lock);
	if (txn->lock_fd != -1)
		i_close_fd(&txn->lock_fd);
	sodium_memzero(txn->plain, txn->plain_used);
	sodium_memzero(txn->stored, txn->stored_used);
	if (txn->alt != NULL)
		sodium_memzero(txn->alt, txn->alt_used);
	buffer_free(&txn->table);
	txn->store->txn = NULL;
	i_free(txn);
}

int casbox_pack_txn_begin(struct casbox_pack_store *store,
			  struct casbox_pack_txn **txn_r,
			  const char **error_r)
{
	struct file_lock_settings lock_set = {
		.lock_method = FILE_LOCK_METHOD_FCNTL,
	};
	struct casbox_pack_txn *txn;
	const char *lock_path, *error;
	int ret;

	i_assert(store->txn == NULL);
	*txn_r = NULL;
	txn = i_new(struct casbox_pack_txn, 1);
	txn->store = store;
	txn->fd = -1;
	txn->local_lock_idx = -1;
	/* allocated once per store: a delivery is one transaction, and
	   zeroing 128 kB per message showed in profiles */
	if (store->txn_plain == NULL) {
		store->txn_plain = i_malloc(CASBOX_CHUNK_SIZE);
		store->txn_stored = i_malloc(CASBOX_CHUNK_MAX_STORED);
	}
	txn->plain = store->txn_plain;
	txn->stored = store->txn_stored;
	txn->table = buffer_create_dynamic(default_pool, 64);
	store->txn = txn;

	lock_path = t_strdup_printf("%s/pack.lock", store->set.dir);
	txn->lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (txn->lock_fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", lock_path);
		casbox_pack_txn_free(txn);
		return -1;
	}
	if (casbox_pack_local_lock(txn, lock_path, error_r) < 0) {
		casbox_pack_txn_free(txn);
		return -1;
	}
	ret = file_wait_lock(txn->lock_fd, lock_path, F_WRLCK, &lock_set,
			     CASBOX_PACK_LOCK_TIMEOUT_SECS, &txn->lock, &error);
	if (ret <= 0) {
		*error_r = ret < 0 ? error : t_strdup_printf(
			"Timeout waiting for lock %s", lock_path);
		casbox_pack_txn_free(txn);
		return -1;
	}
	if (casbox_pack_open_last(txn, error_r) < 0) {
		casbox_pack_txn_free(txn);
		return -1;
	}
	*txn_r = txn;
	return 1;
}

static int casbox_pack_rotate(struct casbox_pack_txn *txn,
			      const char **error_r)
{
	const char *path = casbox_pack_path(txn->store, txn->pack_id);

	if (txn->store->set.fsync && txn->store->io->fsync(txn->fd) < 0) {
		*error_r = t_strdup_printf("fdatasync(%s) failed: %m", path);
		return -1;
	}
	pack_close_fd(txn->store, &txn->fd);
	return casbox_pack_create(txn, txn->pack_id + 1, error_r);
}

/* Fill txn->plain with up to a chunk of input. Returns the size, sets
   *eof_r when the input ended, -1 on input error. */
static ssize_t
casbox_pack_read_chunk(struct casbox_pack_txn *txn, struct istream *input,
		       bool *eof_r, const char **error_r)
{
	const unsigned char *data;
	size_t size, filled = 0;
	int ret;

	*eof_r = FALSE;
	while (filled < CASBOX_CHUNK_SIZE) {
		ret = i_stream_read_more(input, &data, &size);
		if (ret <= 0)
			break;
		size = I_MIN(size, CASBOX_CHUNK_SIZE - filled);
		memcpy(txn->plain + filled, data, size);
		i_stream_skip(input, size);
		filled += size;
		txn->plain_used = I_MAX(txn->plain_used, filled);
	}
	if (filled == CASBOX_CHUNK_SIZE) {
		/* is there more? decides the last-chunk flag */
		ret = i_stream_read_more(input, &data, &size);
	}
	if (input->stream_errno != 0) {
		*error_r = t_strdup_printf("read(%s) failed: %s",
					   i_stream_get_name(input),
					   i_stream_get_error(input));
		return -1;
	}
	if (ret == 0) {
		*error_r = "input stream is not blocking";
		return -1;
	}
	*eof_r = ret < 0;
	return filled;
}

struct casbox_pack_add_ctx {
	struct casbox_pack_txn *txn;
	const struct cas_blob_id *id;
	unsigned char dek[CAS_DEK_SIZE];
	unsigned char subkey[CAS_AEAD_SUBKEY_SIZE];
	/* version, cipher, nonce, id and dict_id: what the AAD binds */
	struct casbox_frame_header hdr;
	/* the frame's dictionary (dict_id), NULL = none */
	ZSTD_CDict *cdict;
	uint32_t dict_id;
	/* a base offered (NULL = none), and whether this frame uses it
	   (decided at chunk 0: a version 3 frame); base_next offers the
	   next one when it does not pay (NULL = no more) */
	const struct casbox_pack_base *base;
	size_t base_prefix;
	bool base_used;
	casbox_pack_base_next_func_t *base_next;
	void *base_context;
	uint32_t idx;
	/* absolute pack offset of the next chunk */
	uint64_t pos;
	uint64_t plain_size;
	/* FALSE: the input is a blob stream that authenticated every chunk
	   as id's content (casbox_pack_txn_add_reencode()) */
	bool verify_id;
};

/* Offer base (NULL = none) to the frame being added: ctx->base is NULL
   after this when it gives nothing (a chain may not grow longer; an
   empty base or the blob itself). Returns 0 ok, -1 when its data is
   shorter than its prefix (the caller's bug, reported). */
static int
casbox_pack_add_set_base(struct casbox_pack_add_ctx *ctx,
			 const struct casbox_pack_base *base,
			 const char **error_r)
{
	struct casbox_pack_store *store = ctx->txn->store;

	ctx->base = NULL;
	if (base == NULL)
		return 0;
	if (base->size < I_MIN(base->plain_size, CASBOX_BASE_PREFIX_MAX)) {
		*error_r = t_strdup_printf("base %s: %zu bytes given, its "
			"prefix is %"PRIu64, cas_blob_id_to_hex(&base->id),
			base->size, I_MIN(base->plain_size,
					  (uint64_t)CASBOX_BASE_PREFIX_MAX));
		return -1;
	}
	if (base->depth >= CASBOX_BASE_MAX_DEPTH || base->plain_size == 0 ||
	    memcmp(base->id.id, ctx->id->id, CAS_BLOB_ID_SIZE) == 0)
		return 0;
	ctx->base = base;
	ctx->base_prefix = I_MIN(base->plain_size, CASBOX_BASE_PREFIX_MAX);
	if (store->txn_alt == NULL)
		store->txn_alt = i_malloc(CASBOX_CHUNK_MAX_STORED);
	ctx->txn->alt = store->txn_alt;
	return 0;
}

/* Chunk txn->plain compressed with the base prefix as zstd raw-content
   prefix, into txn->alt. Returns its size or a zstd error code. */
static size_t
casbox_pack_compress_base(struct casbox_pack_add_ctx *ctx, size_t size)
{
	struct casbox_pack_txn *txn = ctx->txn;
	ZSTD_CCtx *cctx = txn->store->cctx;
	size_t ret;

	ret = ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
	if (!ZSTD_isError(ret)) {
		ret = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel,
					     txn->store->set.zstd_level);
	}
	if (!ZSTD_isError(ret))
		ret = ZSTD_CCtx_refPrefix(cctx, ctx->base->data,
					  ctx->base_prefix);
	if (!ZSTD_isError(ret)) {
		ret = ZSTD_compress2(cctx, txn->alt, CASBOX_CHUNK_MAX_PADDED,
				     txn->plain, size);
	}
	/* what zstd may have written: wiped when the txn ends */
	txn->alt_used = I_MAX(txn->alt_used, ZSTD_isError(ret) ?
			      CASBOX_CHUNK_MAX_PADDED : ret);
	/* the prefix is for one frame only, but leave nothing behind */
	(void)ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
	return ret;
}

/* The other way of a chunk of a blob offered a base: at chunk 0, decide
   whether the frame uses the base at all (a version 3 frame, whose
   header is larger: only if the padded chunk shrinks by more than
   that); in a frame that does, keep each chunk's smaller encoding (a
   chunk compressed without the prefix decodes the same with it). *out
   and *clen are the encoding to write. */
static int
casbox_pack_chunk_vs_base(struct casbox_pack_add_ctx *ctx, size_t size,
			  unsigned char **out, size_t *clen,
			  const char **error_r)
{
	struct casbox_pack_txn *txn = ctx->txn;
	const struct casbox_pack_base *next;
	size_t blen;

	blen = casbox_pack_compress_base(ctx, size);
	if (casbox_zstd_check(blen, "ZSTD_compress2(prefix)", error_r) < 0)
		return -1;
	while (ctx->idx == 0 &&
	       casbox_padme(blen) + CASBOX_FRAME_V3_HEADER_SIZE >=
	       casbox_padme(*clen) + CASBOX_FRAME_V2_HEADER_SIZE) {
		/* this base does not pay: the next one offered, else a
		   plain version 2 frame */
		do {
			next = ctx->base_next == NULL ? NULL :
				ctx->base_next(ctx->base_context);
			if (casbox_pack_add_set_base(ctx, next, error_r) < 0)
				return -1;
		} while (next != NULL && ctx->base == NULL);
		if (ctx->base == NULL)
			return 0;
		blen = casbox_pack_compress_base(ctx, size);
		if (casbox_zstd_check(blen, "ZSTD_compress2(prefix)",
				      error_r) < 0)
			return -1;
	}
	if (ctx->idx == 0) {
		ctx->base_used = TRUE;
		ctx->cdict = NULL;
		ctx->dict_id = 0;
		ctx->hdr.dict_id = 0;
		ctx->hdr.version = CASBOX_FRAME_VERSION_BASE;
		ctx->hdr.base_depth = ctx->base->depth + 1;
		ctx->hdr.base_id = ctx->base->id;
		casbox_frame_base_digest(ctx->base->data, ctx->base_prefix,
					 ctx->hdr.base_digest);
		casbox_frame_base_mask(ctx->subkey, ctx->base->id.id,
				       ctx->hdr.base_masked);
		/* the chunks start after the larger header */
		ctx->pos += CASBOX_FRAME_V3_HEADER_SIZE -
			CASBOX_FRAME_V2_HEADER_SIZE;
	}
	if (blen < *clen) {
		*out = txn->alt;
		*clen = blen;
	}
	return 0;
}

static int
casbox_pack_add_chunk(struct casbox_pack_add_ctx *ctx, size_t size,
		      bool last, const char **error_r)
{
	struct casbox_pack_txn *txn = ctx->txn;
	struct casbox_pack_store *store = txn->store;
	unsigned char aad[CASBOX_CHUNK_AAD_SIZE], entry[8], *out;
	size_t clen, padded, stored, aad_size;
	uint32_t crc;

	if (ctx->cdict != NULL) {
		clen = ZSTD_compress_usingCDict(store->cctx, txn->stored,
			CASBOX_CHUNK_MAX_PADDED, txn->plain, size,
			ctx->cdict);
	} else {
		clen = ZSTD_compressCCtx(store->cctx, txn->stored,
			CASBOX_CHUNK_MAX_PADDED, txn->plain, size,
			store->set.zstd_level);
	}
	/* compressed plaintext until encrypted below; on error zstd may
	   have written anywhere in the buffer */
	txn->stored_used = I_MAX(txn->stored_used, ZSTD_isError(clen) ?
				 CASBOX_CHUNK_MAX_PADDED : clen);
	if (casbox_zstd_check(clen, "ZSTD_compress()", error_r) < 0)
		return -1;
	out = txn->stored;
	if (ctx->base != NULL && (ctx->idx == 0 || ctx->base_used)) {
		if (casbox_pack_chunk_vs_base(ctx, size, &out, &clen,
					      error_r) < 0)
			return -1;
	}
	/* zeros to the padme() size, inside the AEAD: the stored size
	   shows only the bucket, not the compressed size */
	padded = casbox_padme(clen);
	i_assert(padded <= CASBOX_CHUNK_MAX_PADDED);
	memset(out + clen, 0, padded - clen);
	aad_size = casbox_frame_chunk_aad(&ctx->hdr, ctx->idx, last, size,
					  aad);
	/* in place: libsodium allows ciphertext == plaintext */
	cas_aead_chunk_encrypt(ctx->hdr.cipher, ctx->subkey, ctx->idx,
			       aad, aad_size, out, padded, out);
	stored = padded + CAS_AEAD_TAG_SIZE;
	if (out == txn->stored)
		txn->stored_used = I_MAX(txn->stored_used, stored);
	else
		txn->alt_used = I_MAX(txn->alt_used, stored);
	crc = cas_crc32c_mask(cas_crc32c(out, stored));
	if (txn_pwrite(txn, out, stored, ctx->pos) < 0) {
		*error_r = t_strdup_printf("write(%s) failed: %m",
			casbox_pack_path(store, txn->pack_id));
		return -1;
	}
	cpu32_to_le_unaligned(stored, entry);
	cpu32_to_le_unaligned(crc, entry + 4);
	buffer_append(txn->table, entry, sizeof(entry));
	ctx->pos += stored;
	ctx->plain_size += size;
	ctx->idx++;
	return 0;
}

static int
casbox_pack_add_finish(struct casbox_pack_add_ctx *ctx, uint64_t frame_off,
		       struct casbox_blob_record *rec_r, const char **error_r)
{
	struct casbox_pack_txn *txn = ctx->txn;
	struct casbox_frame_header hdr;
	unsigned char hdr_buf[CASBOX_FRAME_HEADER_MAX_SIZE];
	uint64_t frame_size;

	frame_size = ctx->pos + txn->table->used - frame_off;
	if (frame_size > UINT32_MAX) {
		*error_r = "blob too large for one frame";
		return -1;
	}
	i_zero(rec_r);
	/* before the header is written: a frame whose DEK could not be
	   stored must not become valid */
	if (cas_keyring_dek_protect(txn->store->keyring, ctx->id, ctx->dek,
				    &rec_r->dek_kind, rec_r->stored_dek,
				    error_r) < 0)
		return -1;
	hdr = ctx->hdr;
	hdr.frame_size = frame_size;
	hdr.chunk_count = ctx->idx;
	hdr.table_crc = cas_crc32c_mask(cas_crc32c(txn->table->data,
						   txn->table->used));
	i_assert(hdr.dict_id == ctx->dict_id);
	i_assert(hdr.chunk_count == casbox_frame_chunk_count(ctx->plain_size));
	casbox_frame_header_write(&hdr, hdr_buf);
	if (txn_pwrite(txn, txn->table->data, txn->table->used,
			ctx->pos) < 0 ||
	    txn_pwrite(txn, hdr_buf, casbox_frame_header_size(hdr.version),
		       frame_off) < 0) {
		*error_r = t_strdup_printf("write(%s) failed: %m",
			casbox_pack_path(txn->store, txn->pack_id));
		return -1;
	}
	rec_r->pack_id = txn->pack_id;
	rec_r->offset = frame_off;
	rec_r->frame_size = frame_size;
	rec_r->plain_size = ctx->plain_size;
	rec_r->dict_id = ctx->dict_id;
	if (ctx->base_used) {
		rec_r->base_depth = hdr.base_depth;
		rec_r->base_id = hdr.base_id;
	}
	txn->offset = frame_off + frame_size;
	txn->store->bytes_appended += frame_size;
	return 0;
}

/* blob-id keys a pack append checks an id against: the current epoch's
   and, during a rotation, the retiring one's (more only in a process
   that kept epochs a reload dropped) */
#define CASBOX_PACK_MAX_ID_KEYS 4

static int
casbox_pack_add_body(struct casbox_pack_add_ctx *ctx, struct istream *input,
		     const char **error_r)
{
	struct casbox_pack_store *store = ctx->txn->store;
	/* the save computed the id before it took the write lock; a key
	   rotation may have started a new epoch since (the key ring was
	   refreshed under the lock): the id is checked under each blob-id
	   key the ring holds, the current one first */
	struct cas_blob_id_ctx id_ctx[CASBOX_PACK_MAX_ID_KEYS];
	struct cas_blob_id real_id;
	unsigned int i, n_keys;
	ssize_t size;
	bool last, match = FALSE;

	n_keys = !ctx->verify_id ? 0 :
		I_MIN(cas_blob_id_key_count(store->keyring),
		      CASBOX_PACK_MAX_ID_KEYS);
	for (i = 0; i < n_keys; i++)
		cas_blob_id_init_nth(store->keyring, i, &id_ctx[i]);
	do {
		size = casbox_pack_read_chunk(ctx->txn, input, &last, error_r);
		if (size < 0)
			break;
		if (ctx->idx == 0 && last && store->cur_dict_id != 0 &&
		    (size_t)size <= store->set.dict_max_blob_size) {
			ctx->cdict = casbox_pack_dict_get_cdict(store,
							store->cur_dict_id);
			if (ctx->cdict != NULL) {
				ctx->dict_id = store->cur_dict_id;
				ctx->hdr.dict_id = ctx->dict_id;
			}
		}
		for (i = 0; i < n_keys; i++)
			cas_blob_id_update(&id_ctx[i], ctx->txn->plain, size);
		if (casbox_pack_add_chunk(ctx, size, last, error_r) < 0) {
			size = -1;
			break;
		}
		if (ctx->pos - ctx->txn->offset > UINT32_MAX) {
			*error_r = "blob too large for one frame";
			size = -1;
			break;
		}
	} while (!last);
	for (i = 0; i < n_keys; i++) {
		cas_blob_id_final(&id_ctx[i], &real_id);
		if (sodium_memcmp(real_id.id, ctx->id->id,
				  CAS_BLOB_ID_SIZE) == 0)
			match = TRUE;
	}
	if (size < 0)
		return -1;
	if (!match && ctx->verify_id) {
		*error_r = t_strdup_printf("blob id %s does not match content",
					   cas_blob_id_to_hex(ctx->id));
		return -1;
	}
	return 0;
}

/* verify_id: compute the blob id of the content and require it to be
   id (FALSE: input is id's own authenticated blob stream, gc's copies) */
static int
casbox_pack_txn_add_full(struct casbox_pack_txn *txn,
			 const struct cas_blob_id *id, struct istream *input,
			 const struct casbox_pack_base *base,
			 casbox_pack_base_next_func_t *base_next,
			 void *base_context, bool verify_id,
			 struct casbox_blob_record *rec_r,
			 const char **error_r)
{
	struct casbox_pack_add_ctx ctx;
	uint64_t frame_off;
	int ret = -1;

	i_zero(rec_r);
	i_zero(&ctx);
	ctx.txn = txn;
	ctx.id = id;
	if (casbox_pack_add_set_base(&ctx, base, error_r) < 0)
		return -1;
	if (ctx.base != NULL) {
		ctx.base_next = base_next;
		ctx.base_context = base_context;
	}
	if (txn->offset >= txn->store->set.max_pack_size &&
	    casbox_pack_rotate(txn, error_r) < 0)
		return -1;
	ctx.verify_id = verify_id;
	frame_off = txn->offset;
	ctx.hdr.version = CASBOX_FRAME_VERSION;
	ctx.hdr.cipher = txn->store->set.cipher;
	ctx.hdr.id = *id;
	randombytes_buf(ctx.hdr.nonce, sizeof(ctx.hdr.nonce));
	ctx.pos = frame_off + casbox_frame_header_size(ctx.hdr.version);
	buffer_set_used_size(txn->table, 0);
	cas_dek_generate(ctx.dek);
	cas_aead_frame_subkey(ctx.hdr.cipher, ctx.dek, ctx.hdr.nonce,
			      ctx.subkey);

	if (casbox_pack_add_body(&ctx, input, error_r) == 0 &&
	    casbox_pack_add_finish(&ctx, frame_off, rec_r, error_r) == 0)
		ret = 1;
	sodium_memzero(ctx.dek, sizeof(ctx.dek));
	sodium_memzero(ctx.subkey, sizeof(ctx.subkey));
	if (ret < 0) {
		/* drop the partial frame; we hold the lock */
		i_zero(rec_r);
		if (txn->store->io->ftruncate(txn->fd, frame_off) < 0) {
			i_error("ftruncate(%s) failed: %m",
				casbox_pack_path(txn->store, txn->pack_id));
		}
	}
	return ret;
}

int casbox_pack_txn_add(struct casbox_pack_txn *txn,
			const struct cas_blob_id *id, struct istream *input,
			struct casbox_blob_record *rec_r,
			const char **error_r)
{
	return casbox_pack_txn_add_full(txn, id, input, NULL, NULL, NULL,
					TRUE, rec_r, error_r);
}

int casbox_pack_txn_add_base(struct casbox_pack_txn *txn,
			     const struct cas_blob_id *id,
			     struct istream *input,
			     const struct casbox_pack_base *base,
			     struct casbox_blob_record *rec_r,
			     const char **error_r)
{
	return casbox_pack_txn_add_full(txn, id, input, base, NULL, NULL,
					TRUE, rec_r, error_r);
}

int casbox_pack_txn_add_bases(struct casbox_pack_txn *txn,
			      const struct cas_blob_id *id,
			      struct istream *input,
			      const struct casbox_pack_base *base,
			      casbox_pack_base_next_func_t *next,
			      void *context,
			      struct casbox_blob_record *rec_r,
			      const char **error_r)
{
	return casbox_pack_txn_add_full(txn, id, input, base, next, context,
					TRUE, rec_r, error_r);
}

int casbox_pack_txn_add_reencode(struct casbox_pack_txn *txn,
				 const struct cas_blob_id *id,
				 struct istream *input,
				 struct casbox_blob_record *rec_r,
				 const char **error_r)
{
	return casbox_pack_txn_add_full(txn, id, input, NULL, NULL, NULL,
					FALSE, rec_r, error_r);
}

/* Meta records are sealed one way per key mode, chosen once when the
   pack store opens (casbox_pack_meta_sealer_for()): with the server
   key's record key (meta version 1), or to the user key's public key
   in password mode, where LMTP has only that (version 2: the body is a
   locator, then a box). No function below asks which mode it is in. */
struct casbox_meta_sealer {
	/* the meta frame version this mode writes and reads */
	uint8_t version;
	int (*seal)(const struct cas_keyring *keyring, const void *aad,
		    size_t aad_size, const unsigned char *locator,
		    const void *plain, size_t size, buffer_t *sealed,
		    const char **error_r);
	int (*open)(const struct cas_keyring *keyring,
		    enum casbox_meta_kind kind, const void *sealed,
		    size_t size, buffer_t *plain_r, const char **error_r);
	/* 0 = meta records of this mode carry no locator */
	int (*locator)(const void *sealed, size_t size,
		       unsigned char locator_r[CASBOX_META_LOCATOR_SIZE]);
	void (*locator_make)(const struct cas_keyring *keyring,
			     const void *data, size_t size,
			     unsigned char locator_r[CASBOX_META_LOCATOR_SIZE]);
	/* verify without the secret key (0 = nothing to verify) */
	int (*verify)(const struct cas_keyring *keyring,
		      enum casbox_meta_kind kind, const void *sealed,
		      size_t size, const char **error_r);
};

static const unsigned char casbox_meta_no_locator[CASBOX_META_LOCATOR_SIZE];

static int
meta_server_seal(const struct cas_keyring *keyring, const void *aad,
		 size_t aad_size, const unsigned char *locator ATTR_UNUSED,
		 const void *plain, size_t size, buffer_t *sealed,
		 const char **error_r ATTR_UNUSED)
{
	cas_record_seal(keyring, aad, aad_size, plain, size, sealed);
	return 1;
}

static int
meta_server_open(const struct cas_keyring *keyring,
		 enum casbox_meta_kind kind, const void *sealed, size_t size,
		 buffer_t *plain_r, const char **error_r)
{
	unsigned char aad[CASBOX_META_AAD_MAX_SIZE];
	size_t aad_size;

	aad_size = casbox_meta_aad(CASBOX_META_VERSION, kind, NULL, aad);
	return cas_record_open(keyring, aad, aad_size, sealed, size,
			       plain_r, error_r);
}

static int
meta_server_locator(const void *sealed ATTR_UNUSED, size_t size ATTR_UNUSED,
		    unsigned char locator_r[CASBOX_META_LOCATOR_SIZE]
		    ATTR_UNUSED)
{
	return 0;
}

static void
meta_server_locator_make(const struct cas_keyring *keyring ATTR_UNUSED,
			 const void *data ATTR_UNUSED, size_t size ATTR_UNUSED,
			 unsigned char locator_r[CASBOX_META_LOCATOR_SIZE])
{
	memset(locator_r, 0, CASBOX_META_LOCATOR_SIZE);
}

static int
meta_server_verify(const struct cas_keyring *keyring ATTR_UNUSED,
		   enum casbox_meta_kind kind ATTR_UNUSED,
		   const void *sealed ATTR_UNUSED, size_t size ATTR_UNUSED,
		   const char **error_r ATTR_UNUSED)
{
	return 0;
}

static const struct casbox_meta_sealer casbox_meta_sealer_server = {
	.version = CASBOX_META_VERSION,
	.seal = meta_server_seal,
	.open = meta_server_open,
	.locator = meta_server_locator,
	.locator_make = meta_server_locator_make,
	.verify = meta_server_verify,
};

static int
meta_userkey_seal(const struct cas_keyring *keyring, const void *aad,
		  size_t aad_size, const unsigned char *locator,
		  const void *plain, size_t size, buffer_t *sealed,
		  const char **error_r)
{
	size_t start = sealed->used;

	buffer_append(sealed, locator, CASBOX_META_LOCATOR_SIZE);
	if (cas_userkey_box_seal(cas_keyring_get_userkey(keyring), aad,
				 aad_size, plain, size, sealed) < 0) {
		buffer_set_used_size(sealed, start);
		*error_r = "sealing the meta record failed: "
			"the user key file's public key is unusable";
		return -1;
	}
	return 1;
}

/* A version 2 body is the locator, then the box: the box, and the AAD
   that authenticates it (kind and locator). */
static int
casbox_pack_meta_userkey_box(enum casbox_meta_kind kind,
			     const void *sealed, size_t size,
			     unsigned char aad[CASBOX_META_AAD_MAX_SIZE],
			     size_t *aad_size_r, const void **box_r,
			     size_t *box_size_r, const char **error_r)
{
	if (size < CASBOX_META_LOCATOR_SIZE) {
		*error_r = "meta record: truncated locator";
		return -1;
	}
	*box_r = CONST_PTR_OFFSET(sealed, CASBOX_META_LOCATOR_SIZE);
	*box_size_r = size - CASBOX_META_LOCATOR_SIZE;
	*aad_size_r = casbox_meta_aad(CASBOX_META_VERSION_USERKEY, kind,
				      sealed, aad);
	return 0;
}

static int
meta_userkey_open(const struct cas_keyring *keyring,
		  enum casbox_meta_kind kind, const void *sealed, size_t size,
		  buffer_t *plain_r, const char **error_r)
{
	unsigned char aad[CASBOX_META_AAD_MAX_SIZE];
	const void *box;
	size_t aad_size, box_size;

	if (casbox_pack_meta_userkey_box(kind, sealed, size, aad, &aad_size,
					 &box, &box_size, error_r) < 0)
		return -1;
	return cas_userkey_box_open(cas_keyring_get_userkey(keyring), aad,
				    aad_size, box, box_size, plain_r,
				    error_r);
}

static int
meta_userkey_locator(const void *sealed, size_t size,
		     unsigned char locator_r[CASBOX_META_LOCATOR_SIZE])
{
	if (size < CASBOX_META_LOCATOR_SIZE)
		return -1;
	memcpy(locator_r, sealed, CASBOX_META_LOCATOR_SIZE);
	return 1;
}

static void
meta_userkey_locator_make(const struct cas_keyring *keyring,
			  const void *data, size_t size,
			  unsigned char locator_r[CASBOX_META_LOCATOR_SIZE])
{
	cas_userkey_locator(cas_keyring_get_userkey(keyring), data, size,
			    locator_r);
}

static int
meta_userkey_verify(const struct cas_keyring *keyring,
		    enum casbox_meta_kind kind, const void *sealed,
		    size_t size, const char **error_r)
{
	unsigned char aad[CASBOX_META_AAD_MAX_SIZE];
	const void *box;
	size_t aad_size, box_size;

	if (casbox_pack_meta_userkey_box(kind, sealed, size, aad, &aad_size,
					 &box, &box_size, error_r) < 0)
		return -1;
	return cas_userkey_box_verify(cas_keyring_get_userkey(keyring), aad,
				      aad_size, box, box_size, error_r);
}

static const struct casbox_meta_sealer casbox_meta_sealer_userkey = {
	.version = CASBOX_META_VERSION_USERKEY,
	.seal = meta_userkey_seal,
	.open = meta_userkey_open,
	.locator = meta_userkey_locator,
	.locator_make = meta_userkey_locator_make,
	.verify = meta_userkey_verify,
};

/* The one place the key mode is looked at: a keyring with a user key
   (password mode) seals to it. A keyless store (pack scans) reads no
   meta record bodies. */
static const struct casbox_meta_sealer *
casbox_pack_meta_sealer_for(const struct cas_keyring *keyring)
{
	return keyring != NULL && cas_keyring_get_userkey(keyring) != NULL ?
		&casbox_meta_sealer_userkey : &casbox_meta_sealer_server;
}

/* The meta frame version a store writes and reads: its key mode's. */
static uint8_t casbox_pack_meta_version(struct casbox_pack_store *store)
{
	return store->meta->version;
}

int casbox_pack_meta_seal(struct casbox_pack_store *store,
			  enum casbox_meta_kind kind,
			  const unsigned char *locator,
			  const void *plain, size_t size, buffer_t *sealed,
			  const char **error_r)
{
	unsigned char aad[CASBOX_META_AAD_MAX_SIZE];
	size_t aad_size;

	if (locator == NULL)
		locator = casbox_meta_no_locator;
	aad_size = casbox_meta_aad(store->meta->version, kind, locator, aad);
	return store->meta->seal(store->keyring, aad, aad_size, locator,
				 plain, size, sealed, error_r);
}

int casbox_pack_meta_locator(struct casbox_pack_store *store,
			     const void *sealed, size_t size,
			     unsigned char locator_r[CASBOX_META_LOCATOR_SIZE])
{
	return store->meta->locator(sealed, size, locator_r);
}

void casbox_pack_meta_locator_make(struct casbox_pack_store *store,
				   const void *data, size_t size,
				   unsigned char locator_r[CASBOX_META_LOCATOR_SIZE])
{
	store->meta->locator_make(store->keyring, data, size, locator_r);
}

int casbox_pack_meta_open(struct casbox_pack_store *store,
			  enum casbox_meta_kind kind,
			  const void *sealed, size_t size,
			  buffer_t *plain_r, const char **error_r)
{
	return store->meta->open(store->keyring, kind, sealed, size, plain_r,
				 error_r);
}

int casbox_pack_meta_verify(struct casbox_pack_store *store,
			    enum casbox_meta_kind kind,
			    const void *sealed, size_t size,
			    const char **error_r)
{
	return store->meta->verify(store->keyring, kind, sealed, size,
				   error_r);
}

static int
casbox_pack_txn_add_meta_as_is(struct casbox_pack_txn *txn,
			       enum casbox_meta_kind kind,
			       const void *sealed, size_t size,
			       const char **error_r)
{
	struct casbox_meta_header hdr;
	unsigned char hdr_buf[CASBOX_META_HEADER_SIZE];
	uint64_t frame_off;

	i_assert(kind != CASBOX_META_KIND_NONE &&
		 kind <= CASBOX_META_KIND_MAX);
	if (size < CASBOX_META_MIN_BODY || size > CASBOX_META_MAX_BODY) {
		*error_r = t_strdup_printf("meta record of %zu bytes "
					   "out of range", size);
		return -1;
	}
	/* an older reader must not meet a meta frame in a pack whose
	   header promises blob frames only */
	if ((txn->offset >= txn->store->set.max_pack_size ||
	     txn->pack_version < 2) && casbox_pack_rotate(txn, error_r) < 0)
		return -1;
	i_zero(&hdr);
	hdr.version = casbox_pack_meta_version(txn->store);
	hdr.kind = kind;
	hdr.frame_size = CASBOX_META_HEADER_SIZE + size;
	hdr.body_crc = cas_crc32c_mask(cas_crc32c(sealed, size));
	casbox_meta_header_write(&hdr, hdr_buf);
	frame_off = txn->offset;
	/* body first, header last: a torn frame has no valid header */
	if (txn_pwrite(txn, sealed, size,
			frame_off + CASBOX_META_HEADER_SIZE) < 0 ||
	    txn_pwrite(txn, hdr_buf, sizeof(hdr_buf), frame_off) < 0) {
		*error_r = t_strdup_printf("write(%s) failed: %m",
			casbox_pack_path(txn->store, txn->pack_id));
		if (txn->store->io->ftruncate(txn->fd, frame_off) < 0) {
			i_error("ftruncate(%s) failed: %m",
				casbox_pack_path(txn->store, txn->pack_id));
		}
		return -1;
	}
	txn->offset = frame_off + hdr.frame_size;
	txn->store->bytes_appended += hdr.frame_size;
	return 1;
}

int casbox_pack_txn_add_meta_sealed(struct casbox_pack_txn *txn,
				    enum casbox_meta_kind kind,
				    const void *sealed, size_t size,
				    const char **error_r)
{
	unsigned char aad[CASBOX_META_AAD_MAX_SIZE];
	buffer_t *resealed;
	const char *error;
	size_t aad_size;
	int ret;

	/* a record copied as it was sealed (gc) moves to the current key
	   epoch on the way: after key rotate, gc --all is what re-seals
	   the packs' meta records, so that --finish can drop the old
	   epoch and rebuild --from-packs still opens them. One that opens
	   under no epoch is copied as it is (scrub names it). Password
	   mode seals meta records to the key pair: no epochs. */
	if (txn->store->meta != &casbox_meta_sealer_server ||
	    cas_keyring_epoch_count(txn->store->keyring) < 2) {
		return casbox_pack_txn_add_meta_as_is(txn, kind, sealed, size,
						      error_r);
	}
	aad_size = casbox_meta_aad(CASBOX_META_VERSION, kind, NULL, aad);
	resealed = buffer_create_dynamic(default_pool, size + 64);
	T_BEGIN {
		ret = cas_record_reseal(txn->store->keyring, aad, aad_size,
					sealed, size, resealed, &error);
	} T_END;
	if (ret > 0) {
		ret = casbox_pack_txn_add_meta_as_is(txn, kind,
			resealed->data, resealed->used, error_r);
	} else {
		ret = casbox_pack_txn_add_meta_as_is(txn, kind, sealed, size,
						     error_r);
	}
	buffer_free(&resealed);
	return ret;
}

int casbox_pack_txn_add_meta_locator(struct casbox_pack_txn *txn,
				     enum casbox_meta_kind kind,
				     const unsigned char *locator,
				     const void *plain, size_t size,
				     const char **error_r)
{
	buffer_t *sealed;
	int ret;

	sealed = buffer_create_dynamic(default_pool, size + 128);
	ret = casbox_pack_meta_seal(txn->store, kind, locator, plain, size,
				    sealed, error_r);
	if (ret > 0) {
		ret = casbox_pack_txn_add_meta_sealed(txn, kind, sealed->data,
						      sealed->used, error_r);
	}
	buffer_free(&sealed);
	return ret;
}

int casbox_pack_txn_add_meta(struct casbox_pack_txn *txn,
			     enum casbox_meta_kind kind,
			     const void *plain, size_t size,
			     const char **error_r)
{
	return casbox_pack_txn_add_meta_locator(txn, kind, NULL, plain, size,
						error_r);
}

uint64_t casbox_meta_now_usecs(void)
{
	struct timeval tv;

	if (gettimeofday(&tv, NULL) < 0)
		i_fatal("gettimeofday() failed: %m");
	return (uint64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

int casbox_pack_txn_add_dek_update_kind(struct casbox_pack_txn *txn,
					const struct cas_blob_id *id,
					uint8_t dek_kind,
					const unsigned char *stored_dek,
					const char **error_r)
{
	struct casbox_dek_update upd;
	buffer_t *plain;

	i_assert(cas_dek_kind_size(dek_kind) > 0);
	i_zero(&upd);
	upd.written_usecs = casbox_meta_now_usecs();
	upd.id = *id;
	upd.dek_kind = dek_kind;
	memcpy(upd.stored_dek, stored_dek, cas_dek_kind_size(dek_kind));
	plain = t_buffer_create(CASBOX_DEK_UPDATE_SEALED_SIZE);
	casbox_dek_update_export(&upd, plain);
	return casbox_pack_txn_add_meta(txn, CASBOX_META_KIND_DEK_UPDATE,
					plain->data, plain->used, error_r);
}

int casbox_pack_txn_add_dek_update(struct casbox_pack_txn *txn,
				   const struct cas_blob_id *id,
				   const unsigned char *wrapped_dek,
				   const char **error_r)
{
	return casbox_pack_txn_add_dek_update_kind(txn, id,
		CAS_DEK_KIND_SERVER_WRAP, wrapped_dek, error_r);
}

int casbox_pack_meta_read(struct casbox_pack_store *store, uint32_t pack_id,
			  uint64_t offset, enum casbox_meta_kind *kind_r,
			  buffer_t *sealed_r, const char **error_r)
{
	unsigned char hdr_buf[CASBOX_META_HEADER_SIZE];
	struct casbox_meta_header hdr;
	struct casbox_pack_file *pf;
	const char *path;
	size_t body_size;
	unsigned char *body;
	ssize_t ret;

	if (casbox_pack_file_open(store, pack_id, &pf, error_r) <= 0)
		return -1;
	path = casbox_pack_file_get_name(pf);
	ret = casbox_pack_file_pread(pf, hdr_buf, sizeof(hdr_buf), offset);
	if (ret < 0) {
		*error_r = t_strdup(casbox_pack_file_get_error(pf));
		casbox_pack_file_close(&pf);
		return -1;
	}
	if (casbox_meta_header_parse(hdr_buf, ret, &hdr, error_r) < 0) {
		casbox_pack_file_close(&pf);
		return -1;
	}
	if (hdr.version != casbox_pack_meta_version(store)) {
		/* a store is in one key mode; say which, not just that
		   the seal fails */
		*error_r = hdr.version == CASBOX_META_VERSION_USERKEY ?
			"meta frame sealed to a user key (version 2, "
			"casbox_key_mode=password), but the store uses a "
			"server key" :
			"meta frame sealed with a server key (version 1, "
			"casbox_key_mode=server), but the store uses a "
			"password-mode user key";
		casbox_pack_file_close(&pf);
		return -1;
	}
	body_size = hdr.frame_size - CASBOX_META_HEADER_SIZE;
	body = buffer_append_space_unsafe(sealed_r, body_size);
	ret = casbox_pack_file_pread(pf, body, body_size,
				     offset + CASBOX_META_HEADER_SIZE);
	if (ret < 0)
		*error_r = t_strdup(casbox_pack_file_get_error(pf));
	else if ((size_t)ret != body_size)
		*error_r = t_strdup_printf("%s: meta frame: body truncated",
					   path);
	casbox_pack_file_close(&pf);
	if (ret < 0 || (size_t)ret != body_size ||
	    casbox_meta_body_check(&hdr, body, body_size, error_r) < 0) {
		buffer_set_used_size(sealed_r, sealed_r->used - body_size);
		return -1;
	}
	*kind_r = hdr.kind;
	return 1;
}

int casbox_pack_txn_commit(struct casbox_pack_txn **_txn,
			   const char **error_r)
{
	struct casbox_pack_txn *txn = *_txn;
	int ret = 1;

	*_txn = NULL;
	if (txn->store->set.fsync && txn->store->io->fsync(txn->fd) < 0) {
		*error_r = t_strdup_printf("fdatasync(%s) failed: %m",
			casbox_pack_path(txn->store, txn->pack_id));
		ret = -1;
	}
	casbox_pack_txn_free(txn);
	return ret;
}

uint64_t casbox_pack_store_get_bytes_appended(struct casbox_pack_store *store)
{
	return store->bytes_appended;
}

void casbox_pack_txn_rollback(struct casbox_pack_txn **_txn)
{
	struct casbox_pack_txn *txn = *_txn;

	*_txn = NULL;
	/* frames already in earlier (rotated) packs stay as garbage for gc */
	if (txn->fd != -1 &&
	    txn->store->io->ftruncate(txn->fd, txn->start_offset) < 0) {
		i_error("ftruncate(%s) failed: %m",
			casbox_pack_path(txn->store, txn->pack_id));
	}
	casbox_pack_txn_free(txn);
}

/* Read exactly size bytes at offset. Returns 0 ok, -1 error or EOF. */
static int
casbox_pack_pread_exact(struct casbox_pack_file *pf, const char *path,
			void *buf, size_t size, uint64_t offset,
			const char **error_r)
{
	ssize_t ret = casbox_pack_file_pread(pf, buf, size, offset);

	if (ret < 0) {
		*error_r = t_strdup(casbox_pack_file_get_error(pf));
		return -1;
	}
	if ((size_t)ret != size) {
		*error_r = t_strdup_printf("read(%s): frame truncated at "
					   "%"PRIu64, path, offset);
		return -1;
	}
	return 0;
}

static int
casbox_pack_copy_frame_body(struct casbox_pack_txn *txn,
			    struct casbox_pack_file *src_fd,
			    const char *src_path,
			    const struct cas_blob_id *id,
			    const struct casbox_blob_record *src_rec,
			    uint64_t frame_off, const char **error_r)
{
	/* a frame of either version is longer than the larger header */
	unsigned char hdr_buf[CASBOX_FRAME_HEADER_MAX_SIZE];
	struct casbox_frame_header hdr;
	struct casbox_frame_chunk *chunks;
	unsigned char *table;
	size_t table_size;
	const char *error;
	uint32_t i;
	int ret = 0;

	/* the smallest version 2 frame (109 bytes) is shorter than the
	   version 3 header */
	size_t hdr_read = I_MIN(sizeof(hdr_buf), src_rec->frame_size);

	if (casbox_pack_pread_exact(src_fd, src_path, hdr_buf, hdr_read,
				    src_rec->offset, error_r) < 0)
		return -1;
	if (casbox_frame_header_parse(hdr_buf, hdr_read, &hdr,
				      &error) < 0) {
		*error_r = t_strdup_printf("%s offset %"PRIu64": %s",
					   src_path, src_rec->offset, error);
		return -1;
	}
	if (sodium_memcmp(hdr.id.id, id->id, CAS_BLOB_ID_SIZE) != 0 ||
	    !casbox_frame_header_matches(&hdr, src_rec->frame_size,
					 src_rec->plain_size,
					 src_rec->dict_id) ||
	    hdr.base_depth != src_rec->base_depth) {
		*error_r = t_strdup_printf("%s offset %"PRIu64": the frame "
			"is not the one the blob record describes",
			src_path, src_rec->offset);
		return -1;
	}
	table_size = (size_t)hdr.chunk_count * CASBOX_FRAME_TABLE_ENTRY_SIZE;
	table = i_malloc(table_size);
	chunks = i_new(struct casbox_frame_chunk, hdr.chunk_count);
	if (casbox_pack_pread_exact(src_fd, src_path, table, table_size,
			src_rec->offset + hdr.frame_size - table_size,
			error_r) < 0)
		ret = -1;
	else if (casbox_frame_table_parse(&hdr, table, table_size, chunks,
					  &error) < 0) {
		*error_r = t_strdup_printf("%s offset %"PRIu64": %s",
					   src_path, src_rec->offset, error);
		ret = -1;
	}
	for (i = 0; ret == 0 && i < hdr.chunk_count; i++) {
		/* ciphertext: copied, CRC-checked, never decrypted */
		txn->stored_used = I_MAX(txn->stored_used,
					 chunks[i].stored_size);
		if (casbox_pack_pread_exact(src_fd, src_path, txn->stored,
				chunks[i].stored_size,
				src_rec->offset + chunks[i].offset,
				error_r) < 0)
			ret = -1;
		else if (cas_crc32c_mask(cas_crc32c(txn->stored,
				chunks[i].stored_size)) != chunks[i].crc) {
			*error_r = t_strdup_printf("%s offset %"PRIu64
				": chunk %u: CRC mismatch", src_path,
				src_rec->offset, i);
			ret = -1;
		} else if (txn_pwrite(txn, txn->stored,
				       chunks[i].stored_size,
				       frame_off + chunks[i].offset) < 0) {
			*error_r = t_strdup_printf("write(%s) failed: %m",
				casbox_pack_path(txn->store, txn->pack_id));
			ret = -1;
		}
	}
	if (ret == 0 &&
	    (txn_pwrite(txn, table, table_size,
			 frame_off + hdr.frame_size - table_size) < 0 ||
	     txn_pwrite(txn, hdr_buf, casbox_frame_header_size(hdr.version),
			frame_off) < 0)) {
		*error_r = t_strdup_printf("write(%s) failed: %m",
			casbox_pack_path(txn->store, txn->pack_id));
		ret = -1;
	}
	i_free(table);
	i_free(chunks);
	return ret;
}

int casbox_pack_txn_copy_frame(struct casbox_pack_txn *txn,
			       const struct cas_blob_id *id,
			       const struct casbox_blob_record *src_rec,
			       struct casbox_blob_record *rec_r,
			       const char **error_r)
{
	struct casbox_pack_file *src_fd;
	const char *src_path;
	uint64_t frame_off;
	int ret;

	*rec_r = *src_rec;
	if (txn->offset >= txn->store->set.max_pack_size &&
	    casbox_pack_rotate(txn, error_r) < 0)
		return -1;
	if (casbox_pack_file_open(txn->store, src_rec->pack_id, &src_fd,
				  error_r) <= 0)
		return -1;
	src_path = t_strdup(casbox_pack_file_get_name(src_fd));
	frame_off = txn->offset;
	ret = casbox_pack_copy_frame_body(txn, src_fd, src_path, id, src_rec,
					  frame_off, error_r);
	casbox_pack_file_close(&src_fd);
	if (ret < 0) {
		/* drop the partial frame; we hold the lock */
		if (txn->store->io->ftruncate(txn->fd, frame_off) < 0) {
			i_error("ftruncate(%s) failed: %m",
				casbox_pack_path(txn->store, txn->pack_id));
		}
		return -1;
	}
	rec_r->pack_id = txn->pack_id;
	rec_r->offset = frame_off;
	txn->offset = frame_off + src_rec->frame_size;
	txn->store->bytes_appended += src_rec->frame_size;
	return 1;
}

int casbox_pack_store_pack_size(struct casbox_pack_store *store,
				uint32_t pack_id, uint64_t *size_r,
				bool *remote_r, const char **error_r)
{
	struct casbox_pack_stub stub;
	struct stat st;
	int ret;

	*remote_r = FALSE;
	if (stat(casbox_pack_path(store, pack_id), &st) == 0) {
		*size_r = st.st_size;
		return 1;
	}
	if (errno != ENOENT) {
		*error_r = t_strdup_printf("stat(%s) failed: %m",
					   casbox_pack_path(store, pack_id));
		return -1;
	}
	ret = casbox_pack_stub_read(casbox_pack_stub_path(store, pack_id),
				    &stub, error_r);
	if (ret <= 0)
		return ret;
	*size_r = stub.size;
	*remote_r = TRUE;
	return 1;
}

int casbox_pack_store_seal_current(struct casbox_pack_store *store,
				   const char **error_r)
{
	uint64_t max_size = store->set.max_pack_size;
	struct casbox_pack_txn *txn;
	int ret;

	/* a pack with any frame counts as full: begin starts the next */
	store->set.max_pack_size = CASBOX_PACK_HEADER_SIZE + 1;
	ret = casbox_pack_txn_begin(store, &txn, error_r);
	store->set.max_pack_size = max_size;
	if (ret > 0)
		ret = casbox_pack_txn_commit(&txn, error_r);
	return ret < 0 ? -1 : 0;
}
