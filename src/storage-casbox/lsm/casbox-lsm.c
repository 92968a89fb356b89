/* casbox-lsm: store handle, refresh, batches, reads, iteration.
   Flush, compaction and the manifest swap are in casbox-lsm-flush.c.
   Rules and formats: doc/casbox-lsm.md. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "mkdir-parents.h"
#include "file-dotlock.h"
#include "cas-durable.h"
#include "casbox-lsm-state.h"

#include <fcntl.h>
#include <unistd.h>

#define LSM_DEFAULT_LOCK_TIMEOUT_SECS 30
#define LSM_DEFAULT_WAL_FLUSH_BYTES (4 * 1024 * 1024)
#define LSM_LOAD_RETRIES 20

struct casbox_lsm_batch {
	struct casbox_lsm *lsm;
	buffer_t *entries;
	unsigned int count;
	bool lazy;
	bool flush;
};

struct casbox_lsm_iter {
	struct casbox_lsm *lsm;
	struct casbox_lsm_source *src;
	buffer_t *prefix;
	bool positioned, advance;
	char *error;
};

const char *casbox_lsm_path(struct casbox_lsm *lsm, uint64_t file_no,
			    const char *ext)
{
	return t_strdup_printf("%s/%06"PRIu64".%s", lsm->dir, file_no, ext);
}

const char *casbox_lsm_wal_path(struct casbox_lsm *lsm, const char *path)
{
	return path != NULL ? path : casbox_lsm_path(lsm, lsm->wal_no, "wal");
}

/* ---- locking ---- */

/* Handles of this process that hold their store's write lock. fcntl
   locks do not exclude each other within one process, so a second
   handle on the same store must be stopped here. */
static struct casbox_lsm *lsm_locked_list = NULL;

static int lsm_lock_check_process(struct casbox_lsm *lsm,
				  const char **error_r)
{
	struct casbox_lsm *other;

	for (other = lsm_locked_list; other != NULL;
	     other = other->lock_next) {
		if (other->dir_dev == lsm->dir_dev &&
		    other->dir_ino == lsm->dir_ino) {
			*error_r = t_strdup_printf(
				"%s is already locked by another handle of "
				"this process (nested batches?)", lsm->dir);
			return -1;
		}
	}
	return 0;
}

static void lsm_locked_list_remove(struct casbox_lsm *lsm)
{
	struct casbox_lsm **p;

	for (p = &lsm_locked_list; *p != NULL; p = &(*p)->lock_next) {
		if (*p == lsm) {
			*p = lsm->lock_next;
			lsm->lock_next = NULL;
			return;
		}
	}
	i_unreached();
}

static int lsm_file_lock(struct casbox_lsm *lsm, const char **error_r)
{
	struct file_lock_settings lock_set = {
		.lock_method = lsm->set.lock_method,
	};
	struct dotlock_settings dotlock_set = {
		.timeout = lsm->lock_timeout_secs,
		.stale_timeout = LSM_DOTLOCK_STALE_SECS,
	};
	struct dotlock *dotlock;
	const char *error;
	int ret;

	if (lsm->set.lock_method == FILE_LOCK_METHOD_DOTLOCK) {
		ret = file_dotlock_create(&dotlock_set, lsm->lock_path, 0,
					  &dotlock);
		if (ret > 0)
			lsm->lock = file_lock_from_dotlock(&dotlock);
		else if (ret < 0)
			error = t_strdup_printf("file_dotlock_create(%s) "
						"failed: %m", lsm->lock_path);
	} else {
		/* uncontended: one fcntl/flock instead of alarm+wait+alarm */
		ret = file_try_lock(lsm->lock_fd, lsm->lock_path, F_WRLCK,
				    &lock_set, &lsm->lock, &error);
		if (ret == 0) {
			ret = file_wait_lock(lsm->lock_fd, lsm->lock_path,
					     F_WRLCK, &lock_set,
					     lsm->lock_timeout_secs,
					     &lsm->lock, &error);
		}
	}
	if (ret == 0) {
		*error_r = t_strdup_printf(
			"Timeout (%us) while waiting for lock %s",
			lsm->lock_timeout_secs, lsm->lock_path);
		lsm->lock_timed_out = TRUE;
		return -1;
	}
	if (ret < 0) {
		*error_r = error;
		return -1;
	}
	return 0;
}

int casbox_lsm_lock(struct casbox_lsm *lsm, const char **error_r)
{
	int ret;

	i_assert(!lsm->locked);
	lsm->lock_timed_out = FALSE;
	if (lsm_lock_check_process(lsm, error_r) < 0)
		return -1;
#ifdef LSM_HAVE_SHM
	if (lsm->shm != NULL)
		ret = casbox_lsm_shm_lock(lsm, error_r);
	else
#endif
		ret = lsm_file_lock(lsm, error_r);
	if (ret < 0)
		return -1;
	lsm->locked = TRUE;
	lsm->lock_next = lsm_locked_list;
	lsm_locked_list = lsm;
	return 0;
}

bool casbox_lsm_lock_timed_out(const struct casbox_lsm *lsm)
{
	return lsm->lock_timed_out;
}

void casbox_lsm_unlock_state(struct casbox_lsm *lsm, bool current)
{
	i_assert(lsm->locked);
	lsm_locked_list_remove(lsm);
	lsm->locked = FALSE;
#ifdef LSM_HAVE_SHM
	if (lsm->shm != NULL) {
		casbox_lsm_shm_unlock(lsm, current);
		return;
	}
#endif
	(void)current;
	file_unlock(&lsm->lock);
}

void casbox_lsm_unlock(struct casbox_lsm *lsm)
{
	casbox_lsm_unlock_state(lsm, FALSE);
}

/* ---- keys ---- */

int casbox_lsm_epoch_key(struct casbox_lsm *lsm, uint32_t epoch,
			 const struct casbox_lsm_key **key_r,
			 const char **error_r)
{
	const struct casbox_lsm_codec *codec = lsm->set.codec;
	struct casbox_lsm_key *const *keyp, *key;
	const char *error;

	array_foreach(&lsm->keys, keyp) {
		if ((*keyp)->epoch == epoch) {
			*key_r = *keyp;
			return 0;
		}
	}
	if (codec == NULL) {
		*error_r = t_strdup_printf("%s is sealed (key epoch %u), but "
			"it was opened without a key", lsm->dir, epoch);
		return -1;
	}
	if (epoch == CASBOX_LSM_EPOCH_PLAINTEXT) {
		*error_r = "invalid key epoch";
		return -1;
	}
	key = casbox_lsm_key_new(epoch);
	if (codec->get_key(codec->context, epoch, key->key, &error) < 0) {
		casbox_lsm_key_free(&key);
		*error_r = t_strdup_printf("no LSM key for epoch %u: %s",
					   epoch, error);
		return -1;
	}
	array_push_back(&lsm->keys, &key);
	*key_r = key;
	return 0;
}

int casbox_lsm_write_key(struct casbox_lsm *lsm,
			 const struct casbox_lsm_key **key_r,
			 const char **error_r)
{
	const struct casbox_lsm_codec *codec = lsm->set.codec;

	if (codec == NULL) {
		*key_r = NULL;
		return 0;
	}
	return casbox_lsm_epoch_key(lsm, codec->current_epoch(codec->context),
				    key_r, error_r);
}

/* ---- loading state ---- */

static void lsm_apply_entry(void *context, uint64_t seq,
			    enum casbox_lsm_type type,
			    const unsigned char *key, size_t key_size,
			    const unsigned char *value, size_t value_size)
{
	struct casbox_lsm_memtable *mt = context;

	casbox_lsm_memtable_add(mt, seq, type, key, key_size,
				value, value_size);
}

/* Apply the WAL records of [*offset, wal size) to mt. Stops cleanly at
   a torn tail (or a batch still being written). */
static int lsm_wal_read(struct casbox_lsm *lsm, int fd, const char *path,
			const struct casbox_lsm_key *key, uint64_t wal_no,
			struct casbox_lsm_memtable *mt, uoff_t *offset,
			uint64_t *last_seq, off_t file_size,
			const char **error_r)
{
	const unsigned char *data, *payload;
	size_t size, pos = 0, payload_size, rec_size;
	enum casbox_lsm_wal_status status;
	struct stat st;
	uint64_t first_seq;
	unsigned int count;
	const char *error;
	ssize_t ret;

	if (file_size < 0) {
		if (lsm->io->fstat(fd, &st) < 0) {
			*error_r = t_strdup_printf("fstat(%s) failed: %m",
				casbox_lsm_wal_path(lsm, path));
			return -1;
		}
		file_size = st.st_size;
	}
	lsm->wal_file_size = file_size;
	if ((uoff_t)file_size <= *offset)
		return 0;
	size = file_size - *offset;
	buffer_set_used_size(lsm->read_buf, 0);
	ret = lsm->io->pread(fd, buffer_append_space_unsafe(lsm->read_buf,
							    size),
			     size, *offset);
	if (ret < 0) {
		*error_r = t_strdup_printf("pread(%s) failed: %m",
					   casbox_lsm_wal_path(lsm, path));
		return -1;
	}
	size = ret;
	data = lsm->read_buf->data;
	for (;;) {
		status = casbox_lsm_wal_record_parse(data + pos, size - pos,
						     &payload, &payload_size,
						     &rec_size, &error);
		if (status == CASBOX_LSM_WAL_END)
			break;
		if (status == CASBOX_LSM_WAL_OK &&
		    casbox_lsm_wal_payload_open(key, wal_no, *offset + pos,
						&payload, &payload_size,
						lsm->plain_buf, &error) < 0)
			status = CASBOX_LSM_WAL_CORRUPT;
		else if (status == CASBOX_LSM_WAL_OK &&
		    casbox_lsm_wal_payload_apply(payload, payload_size,
						 &first_seq, &count, NULL,
						 NULL, &error) == 0 &&
		    first_seq != *last_seq + 1) {
			status = CASBOX_LSM_WAL_CORRUPT;
			error = "batch sequence does not follow the previous";
		} else if (status == CASBOX_LSM_WAL_OK && error != NULL) {
			status = CASBOX_LSM_WAL_CORRUPT;
		}
		if (status == CASBOX_LSM_WAL_CORRUPT) {
			*error_r = t_strdup_printf(
				"Corrupted WAL %s at offset %"PRIuUOFF_T": %s",
				casbox_lsm_wal_path(lsm, path), *offset + pos,
				error);
			return -1;
		}
		(void)casbox_lsm_wal_payload_apply(payload, payload_size,
						   &first_seq, &count,
						   lsm_apply_entry, mt,
						   &error);
		*last_seq = first_seq + count - 1;
		pos += rec_size;
	}
	*offset += pos;
	return 0;
}

static int lsm_read_file(struct casbox_lsm *lsm, const char *path,
			 buffer_t *buf, struct stat *st_r,
			 const char **error_r)
{
	ssize_t ret;
	int fd;

	fd = lsm->io->open(path, O_RDONLY, 0);
	if (fd == -1) {
		if (errno == ENOENT)
			return 0;
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	if (lsm->io->fstat(fd, st_r) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", path);
		(void)lsm->io->close(fd);
		return -1;
	}
	buffer_set_used_size(buf, 0);
	ret = lsm->io->pread(fd, buffer_append_space_unsafe(buf,
							    st_r->st_size),
			     st_r->st_size, 0);
	if (ret < 0) {
		*error_r = t_strdup_printf("pread(%s) failed: %m", path);
		(void)lsm->io->close(fd);
		return -1;
	}
	buffer_set_used_size(buf, ret);
	(void)lsm->io->close(fd);
	return 1;
}

static struct casbox_lsm_table *
lsm_find_open_table(struct casbox_lsm *lsm, uint64_t file_no)
{
	struct casbox_lsm_table *const *tablep;

	array_foreach(&lsm->tables, tablep) {
		if (casbox_lsm_table_file_no(*tablep) == file_no)
			return *tablep;
	}
	return NULL;
}

struct lsm_state {
	ARRAY_TYPE(lsm_table) tables;
	struct casbox_lsm_memtable *mt;
	int wal_fd;
	uoff_t wal_offset;
	uint64_t last_seq;
	uint32_t wal_epoch;
	size_t wal_hdr_size;
	const struct casbox_lsm_key *wal_key;
};

static void lsm_state_free(struct casbox_lsm *lsm, struct lsm_state *state)
{
	struct casbox_lsm_table **tablep;

	array_foreach_modifiable(&state->tables, tablep)
		casbox_lsm_table_unref(tablep);
	array_free(&state->tables);
	if (state->mt != NULL)
		casbox_lsm_memtable_unref(&state->mt);
	if (state->wal_fd != -1)
		(void)lsm->io->close(state->wal_fd);
}

/* Open everything the manifest names. Returns 1 ok, 0 a file vanished
   (another process swapped the manifest: retry), -1 error. */
static int lsm_state_open(struct casbox_lsm *lsm,
			  const struct casbox_lsm_manifest *man,
			  struct lsm_state *state, const char **error_r)
{
	const struct casbox_lsm_manifest_table *mt;
	const struct casbox_lsm_key *key;
	struct casbox_lsm_table *table;
	unsigned char hdr[CASBOX_LSM_WAL_HEADER_MAX];
	const char *path, *error;
	uint64_t file_no;
	uint32_t epoch;
	ssize_t ret;
	int fd;

	array_foreach(&man->tables, mt) {
		table = lsm_find_open_table(lsm, mt->file_no);
		if (table != NULL) {
			casbox_lsm_table_ref(table);
			array_push_back(&state->tables, &table);
			continue;
		}
		path = casbox_lsm_path(lsm, mt->file_no, "sst");
		key = NULL;
		if (mt->epoch != CASBOX_LSM_EPOCH_PLAINTEXT &&
		    casbox_lsm_epoch_key(lsm, mt->epoch, &key, &error) < 0) {
			*error_r = t_strdup_printf("table %s: %s", path, error);
			return -1;
		}
		fd = lsm->io->open(path, O_RDONLY, 0);
		if (fd == -1 && errno == ENOENT)
			return 0;
		if (fd == -1) {
			*error_r = t_strdup_printf("open(%s) failed: %m", path);
			return -1;
		}
		if (casbox_lsm_table_open(lsm->io, fd, path, mt->file_no,
					  key, &table, error_r) < 0)
			return -1;
		array_push_back(&state->tables, &table);
	}

	path = casbox_lsm_path(lsm, man->wal_no, "wal");
	state->wal_fd = lsm->io->open(path, O_RDWR, 0);
	if (state->wal_fd == -1 && errno == ENOENT)
		return 0;
	if (state->wal_fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	ret = lsm->io->pread(state->wal_fd, hdr, sizeof(hdr), 0);
	if (ret < CASBOX_LSM_WAL_HEADER_SIZE) {
		*error_r = t_strdup_printf("Corrupted WAL %s at offset 0: "
					   "header unreadable", path);
		return -1;
	}
	if (casbox_lsm_wal_header_parse(hdr, ret, &file_no, &epoch,
					&state->wal_hdr_size, &error) < 0) {
		*error_r = t_strdup_printf("Corrupted WAL %s at offset 0: %s",
					   path, error);
		return -1;
	}
	if (file_no != man->wal_no) {
		*error_r = t_strdup_printf("Corrupted WAL %s at offset 0: "
			"WAL number does not match its name", path);
		return -1;
	}
	if (epoch != man->wal_epoch) {
		*error_r = t_strdup_printf("Corrupted WAL %s at offset 0: "
			"WAL key epoch %u, MANIFEST says %u", path, epoch,
			man->wal_epoch);
		return -1;
	}
	state->wal_epoch = epoch;
	state->wal_key = NULL;
	if (epoch != CASBOX_LSM_EPOCH_PLAINTEXT &&
	    casbox_lsm_epoch_key(lsm, epoch, &state->wal_key, &error) < 0) {
		*error_r = t_strdup_printf("WAL %s: %s", path, error);
		return -1;
	}
	state->mt = casbox_lsm_memtable_create();
	state->wal_offset = state->wal_hdr_size;
	state->last_seq = man->last_seq;
	return lsm_wal_read(lsm, state->wal_fd, path, state->wal_key,
			    man->wal_no, state->mt,
			    &state->wal_offset, &state->last_seq, -1,
			    error_r) < 0 ? -1 : 1;
}

static void lsm_state_swap(struct casbox_lsm *lsm, struct lsm_state *state,
			   const struct casbox_lsm_manifest *man)
{
	struct lsm_state old;

	old.tables = lsm->tables;
	old.mt = lsm->mt;
	old.wal_fd = lsm->wal_fd;

	lsm->tables = state->tables;
	lsm->mt = state->mt;
	lsm->wal_fd = state->wal_fd;
	lsm->wal_offset = state->wal_offset;
	lsm->last_seq = state->last_seq;
	lsm->wal_epoch = state->wal_epoch;
	lsm->wal_hdr_size = state->wal_hdr_size;
	lsm->wal_key = state->wal_key;
	lsm->sealed = man->sealed;
	lsm->mac_epoch = man->mac_epoch;
	lsm->generation = man->generation;
	lsm->wal_no = man->wal_no;
	lsm->next_file_no = man->next_file_no;
	lsm->flushed_seq = man->last_seq;

	if (array_is_created(&old.tables))
		lsm_state_free(lsm, &old);
}

/* Format 2: the fingerprint, then the MAC, before anything the MANIFEST
   names is opened. */
static int lsm_manifest_check(struct casbox_lsm *lsm,
			      const struct casbox_lsm_manifest *man,
			      const char **error_r)
{
	const struct casbox_lsm_codec *codec = lsm->set.codec;
	const struct casbox_lsm_key *key;
	const char *error;

	if (!man->sealed)
		return 0;
	if (codec == NULL) {
		*error_r = t_strdup_printf("%s is sealed (format 2): opening "
			"it needs the store's key", lsm->manifest_path);
		return -1;
	}
	if (!casbox_lsm_mac_equal(man->fingerprint, codec->fingerprint,
				  sizeof(man->fingerprint))) {
		*error_r = t_strdup_printf("%s was written with another key "
			"(key fingerprint differs)", lsm->manifest_path);
		return -1;
	}
	if (casbox_lsm_epoch_key(lsm, man->mac_epoch, &key, &error) < 0 ||
	    casbox_lsm_manifest_verify(lsm->read_buf->data,
				       lsm->read_buf->used, key,
				       &error) < 0) {
		*error_r = t_strdup_printf("%s: %s", lsm->manifest_path,
					   error);
		return -1;
	}
	return 0;
}

/* (Re)load from MANIFEST. Returns 1 ok, 0 no store exists, -1 error. */
int casbox_lsm_load(struct casbox_lsm *lsm, const char **error_r)
{
	struct casbox_lsm_manifest man;
	struct lsm_state state;
	struct stat st;
	unsigned int i;
	int ret = -1;

	casbox_lsm_manifest_init(&man);
	for (i = 0; i < LSM_LOAD_RETRIES; i++) {
		ret = lsm_read_file(lsm, lsm->manifest_path, lsm->read_buf,
				    &st, error_r);
		if (ret <= 0)
			break;
		if (casbox_lsm_manifest_decode(lsm->read_buf->data,
					       lsm->read_buf->used, &man,
					       error_r) < 0) {
			*error_r = t_strdup_printf("Corrupted %s at offset 0: "
				"%s", lsm->manifest_path, *error_r);
			ret = -1;
			break;
		}
		if (lsm_manifest_check(lsm, &man, error_r) < 0) {
			ret = -1;
			break;
		}
		lsm->manifest_st = st;
		if (man.generation == lsm->generation &&
		    lsm->wal_fd != -1) {
			ret = 1;
			break;
		}
		i_zero(&state);
		state.wal_fd = -1;
		i_array_init(&state.tables, array_count(&man.tables) + 1);
		ret = lsm_state_open(lsm, &man, &state, error_r);
		if (ret > 0) {
			lsm_state_swap(lsm, &state, &man);
			break;
		}
		lsm_state_free(lsm, &state);
		if (ret < 0)
			break;
		ret = -1;
		*error_r = t_strdup_printf("%s keeps changing under us",
					   lsm->manifest_path);
	}
	casbox_lsm_manifest_deinit(&man);
	return ret;
}

static bool lsm_manifest_changed(struct casbox_lsm *lsm,
				 const struct stat *st)
{
	return st->st_ino != lsm->manifest_st.st_ino ||
		st->st_size != lsm->manifest_st.st_size ||
		st->st_mtim.tv_sec != lsm->manifest_st.st_mtim.tv_sec ||
		st->st_mtim.tv_nsec != lsm->manifest_st.st_mtim.tv_nsec;
}

int casbox_lsm_refresh_full(struct casbox_lsm *lsm, bool check_manifest,
			    const char **error_r)
{
	struct stat st, mst;

	/* a flush replaces the WAL: an unlinked WAL means reload */
	if (lsm->io->fstat(lsm->wal_fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(WAL) failed: %m");
		return -1;
	}
	if (st.st_nlink == 0)
		return casbox_lsm_load(lsm, error_r) < 0 ? -1 : 1;
	/* only a merge changes MANIFEST but not the WAL, and a merge
	   leaves the data as it was: writers check it before flushing */
	if (check_manifest) {
		if (lsm->io->stat(lsm->manifest_path, &mst) < 0) {
			*error_r = t_strdup_printf("stat(%s) failed: %m",
						   lsm->manifest_path);
			return -1;
		}
		if (lsm_manifest_changed(lsm, &mst)) {
			if (casbox_lsm_load(lsm, error_r) < 0)
				return -1;
			st.st_size = -1;
		}
	}
	if (lsm_wal_read(lsm, lsm->wal_fd, NULL, lsm->wal_key, lsm->wal_no,
			 lsm->mt, &lsm->wal_offset,
			 &lsm->last_seq, st.st_size, error_r) < 0)
		return -1;
	return 1;
}

int casbox_lsm_refresh(struct casbox_lsm *lsm, const char **error_r)
{
#ifdef LSM_HAVE_SHM
	/* no system call when the last writer left things as we know
	   them */
	if (lsm->shm != NULL && casbox_lsm_shm_unchanged(lsm))
		return 1;
#endif
	return casbox_lsm_refresh_full(lsm, TRUE, error_r);
}

/* ---- open / close ---- */

/* The store directory itself may be new: make its entry durable. */
static int lsm_fsync_parent(struct casbox_lsm *lsm, const char **error_r)
{
	if (!lsm->set.fsync)
		return 0;
	return cas_durable_fsync_parent(lsm->io, lsm->dir, error_r);
}

static int lsm_create(struct casbox_lsm *lsm, const char **error_r)
{
	struct casbox_lsm_manifest man;
	int ret;

	if (casbox_lsm_lock(lsm, error_r) < 0)
		return -1;
	/* somebody else may have created it while we waited */
	ret = casbox_lsm_load(lsm, error_r);
	if (ret == 0) {
		casbox_lsm_manifest_init(&man);
		man.generation = 1;
		man.wal_no = 1;
		man.next_file_no = 2;
		if (casbox_lsm_wal_create(lsm, man.wal_no, &man.wal_epoch,
					  error_r) < 0 ||
		    casbox_lsm_manifest_write(lsm, &man, error_r) < 0 ||
		    lsm_fsync_parent(lsm, error_r) < 0)
			ret = -1;
		else
			ret = casbox_lsm_load(lsm, error_r);
		casbox_lsm_manifest_deinit(&man);
		if (ret == 0) {
			*error_r = "MANIFEST vanished right after creation";
			ret = -1;
		}
	}
	casbox_lsm_unlock_state(lsm, ret > 0);
	return ret < 0 ? -1 : 0;
}

static int lsm_mkdir(struct casbox_lsm *lsm, const char **error_r)
{
	if (lsm->io->mkdir(lsm->dir, 0700) == 0 || errno == EEXIST)
		return 0;
	if (errno == ENOENT && mkdir_parents(lsm->dir, 0700) == 0)
		return 0;
	if (errno == EEXIST)
		return 0;
	*error_r = t_strdup_printf("mkdir(%s) failed: %m", lsm->dir);
	return -1;
}

static int lsm_stat_dir(struct casbox_lsm *lsm, const char **error_r)
{
	struct stat st;
	int saved_errno;

	if (lsm->io->stat(lsm->dir, &st) < 0) {
		saved_errno = errno;
		*error_r = t_strdup_printf("stat(%s) failed: %m", lsm->dir);
		errno = saved_errno;
		return -1;
	}
	lsm->dir_dev = st.st_dev;
	lsm->dir_ino = st.st_ino;
	return 0;
}

int casbox_lsm_open(const struct casbox_lsm_settings *set,
		    struct casbox_lsm **lsm_r, const char **error_r)
{
	struct casbox_lsm *lsm;
	int ret;

	lsm = i_new(struct casbox_lsm, 1);
	lsm->set = *set;
	lsm->dir = i_strdup(set->dir);
	lsm->set.dir = lsm->dir;
	lsm->io = set->io != NULL ? set->io : &cas_io_posix;
	lsm->event = event_create(set->event);
	lsm->set.event = NULL;
	lsm->lock_timeout_secs = set->lock_timeout_secs != 0 ?
		set->lock_timeout_secs : LSM_DEFAULT_LOCK_TIMEOUT_SECS;
	lsm->wal_flush_bytes = set->wal_flush_bytes != 0 ?
		set->wal_flush_bytes : LSM_DEFAULT_WAL_FLUSH_BYTES;
	casbox_lsm_cache_set_limit(set->cache_bytes != 0 ?
				   set->cache_bytes : CASBOX_LSM_CACHE_BYTES);
	lsm->manifest_path = i_strconcat(set->dir, "/MANIFEST", NULL);
	lsm->lock_path = i_strconcat(set->dir, "/LOCK", NULL);
	lsm->read_buf = buffer_create_dynamic(default_pool, 4096);
	lsm->write_buf = buffer_create_dynamic(default_pool, 1024);
	lsm->batch_buf = buffer_create_dynamic(default_pool, 1024);
	lsm->plain_buf = buffer_create_dynamic(default_pool, 1024);
	i_array_init(&lsm->keys, 2);
	lsm->wal_fd = -1;
	lsm->lock_fd = -1;
	i_array_init(&lsm->tables, 8);

	/* the directory usually exists: a stat() first, not an mkdir()
	   that fails with EEXIST and then the stat() */
	if (lsm_stat_dir(lsm, error_r) < 0 &&
	    (errno != ENOENT || lsm_mkdir(lsm, error_r) < 0 ||
	     lsm_stat_dir(lsm, error_r) < 0)) {
		casbox_lsm_close(&lsm);
		return -1;
	}
	if (set->lock_method != FILE_LOCK_METHOD_DOTLOCK) {
		/* locks, and the shared lock page (casbox-lsm-shm.c) */
		lsm->lock_fd = open(lsm->lock_path,
				    O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (lsm->lock_fd == -1) {
			*error_r = t_strdup_printf("open(%s) failed: %m",
						   lsm->lock_path);
			casbox_lsm_close(&lsm);
			return -1;
		}
#ifdef LSM_HAVE_SHM
		if (casbox_lsm_shm_open(lsm, error_r) < 0) {
			casbox_lsm_close(&lsm);
			return -1;
		}
#endif
	}
	ret = casbox_lsm_load(lsm, error_r);
	if (ret == 0)
		ret = lsm_create(lsm, error_r);
	if (ret < 0) {
		casbox_lsm_close(&lsm);
		return -1;
	}
	*lsm_r = lsm;
	return 1;
}

void casbox_lsm_close(struct casbox_lsm **_lsm)
{
	struct casbox_lsm *lsm = *_lsm;
	struct lsm_state old;

	*_lsm = NULL;
	i_assert(lsm->batch == NULL);
	if (lsm->locked)
		casbox_lsm_unlock(lsm);
#ifdef LSM_HAVE_SHM
	casbox_lsm_shm_close(lsm);
#endif
	if (array_is_created(&lsm->tables)) {
		old.tables = lsm->tables;
		old.mt = lsm->mt;
		old.wal_fd = lsm->wal_fd;
		lsm_state_free(lsm, &old);
	}
	if (lsm->lock_fd != -1)
		i_close_fd(&lsm->lock_fd);
	buffer_free(&lsm->read_buf);
	buffer_free(&lsm->write_buf);
	buffer_free(&lsm->batch_buf);
	buffer_free(&lsm->plain_buf);
	if (array_is_created(&lsm->keys)) {
		struct casbox_lsm_key **keyp;

		array_foreach_modifiable(&lsm->keys, keyp)
			casbox_lsm_key_free(keyp);
		array_free(&lsm->keys);
	}
	i_free(lsm->manifest_path);
	i_free(lsm->lock_path);
	i_free(lsm->dir);
	event_unref(&lsm->event);
	i_free(lsm);
}

/* ---- reads ---- */

int casbox_lsm_get(struct casbox_lsm *lsm, const void *key, size_t key_size,
		   buffer_t *value_r, const char **error_r)
{
	struct casbox_lsm_table *const *tablep;
	enum casbox_lsm_type type;
	const unsigned char *value;
	size_t value_size;
	int ret;

	if (casbox_lsm_memtable_lookup(lsm->mt, key, key_size, (uint64_t)-1,
				       &type, &value, &value_size)) {
		if (type == CASBOX_LSM_TYPE_DELETE)
			return 0;
		buffer_append(value_r, value, value_size);
		return 1;
	}
	array_foreach(&lsm->tables, tablep) {
		ret = casbox_lsm_table_lookup(*tablep, key, key_size, &type,
					      value_r, error_r);
		if (ret != 0) {
			if (ret < 0)
				return -1;
			return type == CASBOX_LSM_TYPE_PUT ? 1 : 0;
		}
	}
	return 0;
}

/* ---- batches ---- */

int casbox_lsm_batch_begin(struct casbox_lsm *lsm,
			   struct casbox_lsm_batch **batch_r,
			   const char **error_r)
{
	struct casbox_lsm_batch *batch;

	i_assert(lsm->batch == NULL);
	if (lsm->broken) {
		*error_r = "LSM handle unusable after an earlier failed "
			"rollback; reopen it";
		return -1;
	}
	if (casbox_lsm_lock(lsm, error_r) < 0)
		return -1;
	/* With the shared lock, a stamp equal to our state means nothing
	   happened since our last look. Otherwise re-read; the manifest
	   too, so the state published at unlock is complete. */
	if ((!lsm->shm_current || lsm->wal_file_size != lsm->wal_offset) &&
	    (casbox_lsm_refresh_full(lsm, lsm->shm != NULL, error_r) < 0 ||
	     casbox_lsm_wal_cut_tail(lsm, error_r) < 0)) {
		casbox_lsm_unlock(lsm);
		return -1;
	}
	/* an upgraded store: nothing more goes into a plaintext WAL */
	if (lsm->set.codec != NULL && lsm->wal_key == NULL &&
	    casbox_lsm_flush_wal_locked(lsm, error_r) < 0) {
		casbox_lsm_unlock(lsm);
		return -1;
	}
	batch = i_new(struct casbox_lsm_batch, 1);
	batch->lsm = lsm;
	batch->entries = lsm->batch_buf;
	buffer_set_used_size(batch->entries, 0);
	lsm->batch = batch;
	*batch_r = batch;
	return 1;
}

void casbox_lsm_batch_put(struct casbox_lsm_batch *batch,
			  const void *key, size_t key_size,
			  const void *value, size_t value_size)
{
	i_assert(key_size <= CASBOX_LSM_MAX_KEY_SIZE);
	i_assert(value_size <= CASBOX_LSM_MAX_VALUE_SIZE);
	casbox_lsm_wal_entry_encode(batch->entries, CASBOX_LSM_TYPE_PUT,
				    key, key_size, value, value_size);
	batch->count++;
}

void casbox_lsm_batch_set_lazy(struct casbox_lsm_batch *batch)
{
	batch->lazy = TRUE;
}

void casbox_lsm_batch_set_flush(struct casbox_lsm_batch *batch)
{
	batch->flush = TRUE;
}

size_t casbox_lsm_batch_get_size(const struct casbox_lsm_batch *batch)
{
	return batch->entries->used;
}

void casbox_lsm_batch_delete(struct casbox_lsm_batch *batch,
			     const void *key, size_t key_size)
{
	i_assert(key_size <= CASBOX_LSM_MAX_KEY_SIZE);
	casbox_lsm_wal_entry_encode(batch->entries, CASBOX_LSM_TYPE_DELETE,
				    key, key_size, NULL, 0);
	batch->count++;
}

/* A handle lives as long as its session: a big batch (a COPY's chunk,
   up to the store's checkpoint size) must not leave its buffers that
   big until then. */
#define LSM_KEEP_BUFFER_SIZE (64 * 1024)
static void lsm_buffer_trim(buffer_t **buf)
{
	if (buffer_get_size(*buf) <= LSM_KEEP_BUFFER_SIZE)
		return;
	buffer_free(buf);
	*buf = buffer_create_dynamic(default_pool, 1024);
}

static void lsm_batch_free(struct casbox_lsm_batch **_batch)
{
	struct casbox_lsm_batch *batch = *_batch;
	struct casbox_lsm *lsm = batch->lsm;

	*_batch = NULL;
	lsm->batch = NULL;
	i_free(batch);
	lsm_buffer_trim(&lsm->batch_buf);
	lsm_buffer_trim(&lsm->write_buf);
	lsm_buffer_trim(&lsm->plain_buf);
}

void casbox_lsm_batch_rollback(struct casbox_lsm_batch **_batch)
{
	struct casbox_lsm *lsm = (*_batch)->lsm;

	lsm_batch_free(_batch);
	/* begin left our state current, and nothing was written */
	casbox_lsm_unlock_state(lsm, TRUE);
}

int casbox_lsm_batch_commit(struct casbox_lsm_batch **_batch,
			    const char **error_r)
{
	struct casbox_lsm_batch *batch = *_batch;
	struct casbox_lsm *lsm = batch->lsm;
	const char *error;
	bool current = TRUE, flush = batch->flush;
	int ret = 1;

	if (batch->count > 0 &&
	    casbox_lsm_wal_append(lsm, batch->entries, batch->count,
				  !batch->lazy, error_r) < 0)
		ret = -1;
	lsm_batch_free(_batch);
	if (ret > 0 && (lsm->wal_offset >= lsm->wal_flush_bytes || flush)) {
		/* the batch is durable already; a failed flush only means
		   the WAL stays longer, and the next commit retries */
		if (casbox_lsm_flush_locked(lsm, flush, &error) < 0) {
			i_error("casbox-lsm: flush failed: %s", error);
			current = FALSE;
		}
	}
	casbox_lsm_unlock_state(lsm, ret > 0 && current);
	return ret;
}

/* ---- iteration ---- */

struct casbox_lsm_iter *
casbox_lsm_iter_init(struct casbox_lsm *lsm, const void *prefix,
		     size_t prefix_size)
{
	struct casbox_lsm_iter *iter;
	struct casbox_lsm_table *const *tablep;
	ARRAY(struct casbox_lsm_source *) sources;
	struct casbox_lsm_source *src;

	t_array_init(&sources, array_count(&lsm->tables) + 1);
	src = casbox_lsm_memtable_source(lsm->mt, lsm->last_seq);
	array_push_back(&sources, &src);
	array_foreach(&lsm->tables, tablep) {
		src = casbox_lsm_table_source(*tablep);
		array_push_back(&sources, &src);
	}

	iter = i_new(struct casbox_lsm_iter, 1);
	iter->lsm = lsm;
	iter->src = casbox_lsm_merge_source(array_front(&sources),
					    array_count(&sources));
	iter->prefix = buffer_create_dynamic(default_pool, prefix_size + 1);
	buffer_append(iter->prefix, prefix, prefix_size);
	return iter;
}

void casbox_lsm_iter_seek(struct casbox_lsm_iter *iter,
			  const void *start, size_t start_size)
{
	if (casbox_lsm_key_cmp(start, start_size, iter->prefix->data,
			       iter->prefix->used) < 0) {
		start = iter->prefix->data;
		start_size = iter->prefix->used;
	}
	iter->src->seek(iter->src, start, start_size);
	iter->positioned = TRUE;
	iter->advance = FALSE;
}

bool casbox_lsm_iter_next(struct casbox_lsm_iter *iter,
			  const unsigned char **key_r, size_t *key_size_r,
			  const unsigned char **value_r, size_t *value_size_r)
{
	struct casbox_lsm_source *src = iter->src;

	if (!iter->positioned)
		casbox_lsm_iter_seek(iter, iter->prefix->data,
				     iter->prefix->used);
	if (iter->advance && src->valid)
		src->next(src);
	iter->advance = TRUE;
	while (src->valid && src->type == CASBOX_LSM_TYPE_DELETE)
		src->next(src);
	if (!src->valid)
		return FALSE;
	if (src->key_size < iter->prefix->used ||
	    memcmp(src->key, iter->prefix->data, iter->prefix->used) != 0)
		return FALSE;
	*key_r = src->key;
	*key_size_r = src->key_size;
	*value_r = src->value;
	*value_size_r = src->value_size;
	return TRUE;
}

int casbox_lsm_iter_deinit(struct casbox_lsm_iter **_iter,
			   const char **error_r)
{
	struct casbox_lsm_iter *iter = *_iter;
	int ret = 0;

	*_iter = NULL;
	if (iter->src->error != NULL) {
		*error_r = t_strdup(iter->src->error);
		ret = -1;
	}
	casbox_lsm_source_free(&iter->src);
	buffer_free(&iter->prefix);
	i_free(iter);
	return ret < 0 ? -1 : 1;
}

/* ---- sealing: what is in use ---- */

static void lsm_epochs_add(ARRAY_TYPE(uint32_t) *epochs, uint32_t epoch)
{
	const uint32_t *ep;
	unsigned int i, count;

	ep = array_get(epochs, &count);
	for (i = 0; i < count; i++) {
		if (ep[i] == epoch)
			return;
		if (ep[i] > epoch)
			break;
	}
	array_insert(epochs, i, &epoch, 1);
}

void casbox_lsm_get_epochs(struct casbox_lsm *lsm, ARRAY_TYPE(uint32_t) *epochs)
{
	struct casbox_lsm_table *const *tablep;

	array_clear(epochs);
	lsm_epochs_add(epochs, lsm->sealed ? lsm->mac_epoch :
		       CASBOX_LSM_EPOCH_PLAINTEXT);
	lsm_epochs_add(epochs, lsm->wal_epoch);
	array_foreach(&lsm->tables, tablep)
		lsm_epochs_add(epochs, casbox_lsm_table_epoch(*tablep));
}

bool casbox_lsm_is_sealed(struct casbox_lsm *lsm)
{
	return lsm->sealed;
}

int casbox_lsm_peek(const char *dir, struct casbox_lsm_info *info_r,
		    const char **error_r)
{
	struct casbox_lsm_manifest man;
	const char *path = t_strconcat(dir, "/MANIFEST", NULL), *error;
	buffer_t *buf;
	struct stat st;
	size_t hdr_size;
	int ret;

	i_zero(info_r);
	buf = t_buffer_create(256);
	ret = cas_durable_read_file(NULL, path, 16 * 1024 * 1024, buf, &error);
	if (ret == 0)
		return 0;
	if (ret < 0) {
		*error_r = error;
		return -1;
	}
	casbox_lsm_manifest_init(&man);
	if (casbox_lsm_manifest_decode(buf->data, buf->used, &man,
				       &error) < 0) {
		*error_r = t_strdup_printf("Corrupted %s at offset 0: %s",
					   path, error);
		casbox_lsm_manifest_deinit(&man);
		return -1;
	}
	info_r->sealed = man.sealed;
	memcpy(info_r->fingerprint, man.fingerprint,
	       sizeof(info_r->fingerprint));
	info_r->tables = array_count(&man.tables);
	hdr_size = man.wal_epoch == CASBOX_LSM_EPOCH_PLAINTEXT ?
		CASBOX_LSM_WAL_HEADER_SIZE : CASBOX_LSM_WAL_HEADER2_SIZE;
	path = t_strdup_printf("%s/%06"PRIu64".wal", dir, man.wal_no);
	casbox_lsm_manifest_deinit(&man);
	if (stat(path, &st) < 0) {
		if (errno == ENOENT) {
			/* flushed since we read the MANIFEST: it had data */
			info_r->wal_record_bytes = 1;
			return 1;
		}
		*error_r = t_strdup_printf("stat(%s) failed: %m", path);
		return -1;
	}
	if ((uoff_t)st.st_size > hdr_size)
		info_r->wal_record_bytes = st.st_size - hdr_size;
	return 1;
}
