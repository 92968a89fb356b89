/* Sealed packs to object storage: upload, verify, stub, unlink; the
   cache bound; the object-store side of gc and rebuild --from-packs
   (doc/casbox-storage.md, "Packs in object storage").

   Per sealed pack N (every local pack but the newest, which is the one
   appends go to), under packs/upload.lock (tried, never waited for):

     1. put pack-N.cbp as object <prefix>pack-N.cbp (replacing a partial
        object an earlier crash left)
     2. verify: the object's size, then every byte read back and
        compared with the local file, hashing it (BLAKE2b-256)
     3. write pack-N.cbr (size and hash) durably
     4. unlink pack-N.cbp, fsync the directory

   Readers open pack-N.cbp first and pack-N.cbr only when it is gone, so
   a crash after any step leaves the pack readable from one side: before
   3 the local file is still the pack, after 3 both are whole. The next
   run repeats from the first step not done. A failure leaves everything
   local and sets packs/upload.retry, whose mtime is the earliest next
   automatic attempt (backoff doubling from 30 s to 1 h). */

#include "lib.h"
#include "array.h"
#include "file-lock.h"
#include "read-full.h"
#include "write-full.h"
#include "cas-durable.h"
#include "casbox-objstore.h"
#include "casbox-pack-private.h"
#include "casbox-pack-file.h"

#include <sodium.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#define CASBOX_UPLOAD_VERIFY_BUF (1024 * 1024)
#define CASBOX_UPLOAD_BACKOFF_MIN 30
#define CASBOX_UPLOAD_BACKOFF_MAX 3600
#define CASBOX_UPLOAD_LOCK_TIMEOUT_SECS 600

/* Test seam for the kill -9 matrix (tests/e2e/test_objstore_dir.py):
   CASBOX_TEST_UPLOAD_KILL=put|verify|stub kills this process with
   SIGKILL right after that step. */
static void casbox_upload_crash_point(const char *step)
{
	const char *at = getenv("CASBOX_TEST_UPLOAD_KILL");

	if (at != NULL && strcmp(at, step) == 0)
		(void)kill(getpid(), SIGKILL);
}

static int casbox_upload_fsync_dir(struct casbox_pack_store *store,
				   const char **error_r)
{
	if (!store->set.fsync)
		return 0;
	return cas_durable_fsync_dir(store->io, store->set.dir, error_r);
}

/* Step 2: the object equals the local file. Returns 0, -1. */
static int
casbox_upload_verify(struct casbox_pack_store *store, const char *object,
		     int fd, uint64_t size, unsigned char hash_r[32],
		     const char **error_r)
{
	crypto_generichash_state state;
	unsigned char *local, *remote;
	uint64_t off = 0, rsize;
	size_t n, got;
	int ret;

	ret = casbox_objstore_stat(store->remote, object, &rsize, error_r);
	if (ret <= 0) {
		if (ret == 0)
			*error_r = "verify: the object is missing after put";
		return -1;
	}
	if (rsize != size) {
		*error_r = t_strdup_printf("verify: object %s is %"PRIu64
			" bytes, the pack %"PRIu64, object, rsize, size);
		return -1;
	}
	crypto_generichash_init(&state, NULL, 0, 32);
	local = i_malloc(CASBOX_UPLOAD_VERIFY_BUF);
	remote = i_malloc(CASBOX_UPLOAD_VERIFY_BUF);
	ret = 0;
	while (ret == 0 && off < size) {
		n = I_MIN(size - off, CASBOX_UPLOAD_VERIFY_BUF);
		if (pread_full(fd, local, n, off) <= 0) {
			*error_r = t_strdup_printf("verify: read failed: %m");
			ret = -1;
		} else if (casbox_objstore_get(store->remote, object, off,
					       remote, n, &got,
					       error_r) <= 0) {
			ret = -1;
		} else if (got != n || memcmp(local, remote, n) != 0) {
			*error_r = t_strdup_printf("verify: object %s differs "
				"from the pack near offset %"PRIu64,
				object, off);
			ret = -1;
		} else {
			crypto_generichash_update(&state, local, n);
			off += n;
		}
	}
	crypto_generichash_final(&state, hash_r, 32);
	i_free(local);
	i_free(remote);
	return ret;
}

static int casbox_upload_one(struct casbox_pack_store *store,
			     uint32_t pack_id, const char **error_r)
{
	const char *path = casbox_pack_path(store, pack_id);
	const char *object = casbox_objstore_pack_name(store->remote, pack_id);
	struct casbox_pack_stub stub;
	struct stat st;
	int fd, ret;

	ret = casbox_pack_stub_read(casbox_pack_stub_path(store, pack_id),
				    &stub, error_r);
	if (ret < 0)
		return -1;
	if (ret == 0) {
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd == -1) {
			*error_r = t_strdup_printf("open(%s) failed: %m", path);
			return errno == ENOENT ? 0 : -1;
		}
		if (fstat(fd, &st) < 0) {
			*error_r = t_strdup_printf("fstat(%s) failed: %m",
						   path);
			i_close_fd(&fd);
			return -1;
		}
		i_zero(&stub);
		stub.pack_id = pack_id;
		stub.size = st.st_size;
		if (casbox_objstore_put(store->remote, object, fd, stub.size,
					error_r) < 0) {
			i_close_fd(&fd);
			return -1;
		}
		casbox_upload_crash_point("put");
		ret = casbox_upload_verify(store, object, fd, stub.size,
					   stub.hash, error_r);
		i_close_fd(&fd);
		if (ret < 0)
			return -1;
		casbox_upload_crash_point("verify");
		if (casbox_pack_stub_write(store, &stub, error_r) < 0)
			return -1;
		casbox_upload_crash_point("stub");
	}
	/* step 4: the stub (written only after a verify) is durable */
	if (unlink(path) < 0 && errno != ENOENT) {
		*error_r = t_strdup_printf("unlink(%s) failed: %m", path);
		return -1;
	}
	if (casbox_upload_fsync_dir(store, error_r) < 0)
		return -1;
	store->upload_stats.packs++;
	store->upload_stats.bytes += stub.size;
	return 1;
}

static const char *casbox_upload_retry_path(struct casbox_pack_store *store)
{
	return t_strdup_printf("%s/upload.retry", store->set.dir);
}

/* TRUE if an earlier failure asks to wait longer. */
static bool casbox_upload_backing_off(struct casbox_pack_store *store)
{
	struct stat st;

	if (stat(casbox_upload_retry_path(store), &st) < 0)
		return FALSE;
	return st.st_mtime > time(NULL);
}

static void casbox_upload_set_retry(struct casbox_pack_store *store)
{
	const char *path = casbox_upload_retry_path(store);
	struct timespec ts[2];
	struct stat st;
	time_t backoff = CASBOX_UPLOAD_BACKOFF_MIN;
	int fd;

	/* the file's size is the last backoff: double it */
	if (stat(path, &st) == 0 && st.st_size > 0)
		backoff = I_MIN(st.st_size * 2, CASBOX_UPLOAD_BACKOFF_MAX);
	fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd == -1)
		return;
	if (ftruncate(fd, backoff) < 0)
		i_error("ftruncate(%s) failed: %m", path);
	ts[0].tv_sec = ts[1].tv_sec = time(NULL) + backoff;
	ts[0].tv_nsec = ts[1].tv_nsec = 0;
	(void)futimens(fd, ts);
	i_close_fd(&fd);
}

static int
casbox_upload_sealed_ids(struct casbox_pack_store *store,
			 ARRAY_TYPE(uint32_t) *ids, const char **error_r)
{
	ARRAY_TYPE(uint32_t) all;
	const uint32_t *idp;
	uint32_t newest = 0;
	struct stat st;

	t_array_init(&all, 32);
	if (casbox_pack_list(store, &all, error_r) < 0)
		return -1;
	array_foreach(&all, idp) {
		if (stat(casbox_pack_path(store, *idp), &st) == 0)
			newest = *idp;
	}
	array_foreach(&all, idp) {
		if (*idp != newest &&
		    stat(casbox_pack_path(store, *idp), &st) == 0)
			array_push_back(ids, idp);
	}
	return 0;
}

int casbox_pack_store_upload(struct casbox_pack_store *store, bool force,
			     const char **error_r)
{
	struct file_lock_settings lock_set = {
		.lock_method = FILE_LOCK_METHOD_FCNTL,
	};
	struct file_lock *lock = NULL;
	ARRAY_TYPE(uint32_t) ids;
	const uint32_t *idp;
	const char *lock_path, *error;
	unsigned int packs_before = store->upload_stats.packs;
	uint64_t bytes_before = store->upload_stats.bytes;
	int fd, ret = 0;

	store->upload_pending = FALSE;
	if (store->remote == NULL)
		return 0;
	if (!force && casbox_upload_backing_off(store))
		return 0;
	lock_path = t_strdup_printf("%s/upload.lock", store->set.dir);
	fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", lock_path);
		return -1;
	}
	/* doveadm (force) waits for a mail process's upload to finish;
	   mail processes never wait for each other */
	ret = force ? file_wait_lock(fd, lock_path, F_WRLCK, &lock_set,
				     CASBOX_UPLOAD_LOCK_TIMEOUT_SECS, &lock,
				     &error) :
		file_try_lock(fd, lock_path, F_WRLCK, &lock_set, &lock, &error);
	if (ret == 0 && force)
		error = t_strdup_printf("%s: still locked after %u s",
					lock_path,
					CASBOX_UPLOAD_LOCK_TIMEOUT_SECS);
	if (ret <= 0 && (ret < 0 || force)) {
		i_close_fd(&fd);
		*error_r = error;
		return -1;
	}
	if (ret <= 0) {
		i_close_fd(&fd);
		if (ret < 0)
			*error_r = error;
		/* another process is uploading */
		return ret < 0 ? -1 : 0;
	}
	t_array_init(&ids, 16);
	ret = casbox_upload_sealed_ids(store, &ids, error_r);
	if (ret == 0) array_foreach(&ids, idp) {
		T_BEGIN {
			ret = casbox_upload_one(store, *idp, &error);
			if (ret < 0)
				*error_r = t_strdup(error);
		} T_END_PASS_STR_IF(ret < 0, error_r);
		if (ret < 0)
			break;
	}
	if (ret < 0)
		casbox_upload_set_retry(store);
	else
		i_unlink_if_exists(casbox_upload_retry_path(store));
	if (store->upload_stats.packs > packs_before) {
		i_info("casbox: %u sealed pack(s) of %s in object storage "
		       "%s now (%"PRIu64" bytes)",
		       store->upload_stats.packs - packs_before,
		       store->set.dir, store->remote->label,
		       store->upload_stats.bytes - bytes_before);
	}
	file_unlock(&lock);
	i_close_fd(&fd);
	return ret < 0 ? -1 : 1;
}

const struct casbox_pack_upload_stats *
casbox_pack_store_get_upload_stats(struct casbox_pack_store *store)
{
	return &store->upload_stats;
}

bool casbox_pack_store_has_remote(struct casbox_pack_store *store)
{
	return store->remote != NULL;
}

bool casbox_pack_store_error_is_temporary(struct casbox_pack_store *store)
{
	return store->remote_error_temp;
}

int casbox_pack_store_delete_pack(struct casbox_pack_store *store,
				  uint32_t pack_id, const char **error_r)
{
	const char *path = casbox_pack_path(store, pack_id);
	const char *stub = casbox_pack_stub_path(store, pack_id);
	struct stat st;

	if (unlink(path) < 0 && errno != ENOENT) {
		*error_r = t_strdup_printf("unlink(%s) failed: %m", path);
		return -1;
	}
	if (stat(stub, &st) < 0) {
		if (errno == ENOENT)
			return 0;
		*error_r = t_strdup_printf("stat(%s) failed: %m", stub);
		return -1;
	}
	if (store->remote == NULL) {
		*error_r = t_strdup_printf("pack %u is in object storage, but "
			"casbox_pack_storage is not set", pack_id);
		return -1;
	}
	/* the object first: a crash after it leaves a stub of a pack whose
	   blobs gc had all moved, which the next gc deletes again */
	if (casbox_objstore_delete(store->remote,
			casbox_objstore_pack_name(store->remote, pack_id),
			error_r) < 0)
		return -1;
	if (unlink(stub) < 0 && errno != ENOENT) {
		*error_r = t_strdup_printf("unlink(%s) failed: %m", stub);
		return -1;
	}
	return 0;
}

int casbox_pack_store_adopt_remote(struct casbox_pack_store *store,
				   unsigned int *adopted_r,
				   const char **error_r)
{
	ARRAY_TYPE(uint32_t) ids;
	struct casbox_pack_stub stub;
	const uint32_t *idp;
	const char *object;
	struct stat st;
	int ret;

	*adopted_r = 0;
	if (store->remote == NULL)
		return 0;
	t_array_init(&ids, 64);
	if (casbox_objstore_list_packs(store->remote, &ids, error_r) < 0)
		return -1;
	array_foreach(&ids, idp) {
		if (stat(casbox_pack_path(store, *idp), &st) == 0 ||
		    stat(casbox_pack_stub_path(store, *idp), &st) == 0)
			continue;
		object = casbox_objstore_pack_name(store->remote, *idp);
		i_zero(&stub);
		stub.pack_id = *idp;
		ret = casbox_objstore_stat(store->remote, object, &stub.size,
					   error_r);
		if (ret < 0)
			return -1;
		if (ret == 0)
			continue;
		/* no local copy to hash: an all-zero hash, which only keys
		   the read cache */
		if (casbox_pack_stub_write(store, &stub, error_r) < 0)
			return -1;
		*adopted_r += 1;
	}
	return 1;
}

struct casbox_cache_entry {
	char *base;
	time_t used;
	uint64_t bytes;
};
ARRAY_DEFINE_TYPE(casbox_cache_entry, struct casbox_cache_entry);

static int casbox_cache_entry_cmp(const struct casbox_cache_entry *a,
				  const struct casbox_cache_entry *b)
{
	return a->used < b->used ? -1 : (a->used > b->used ? 1 : 0);
}

void casbox_pack_cache_evict(struct casbox_pack_store *store)
{
	ARRAY(struct casbox_cache_entry) entries;
	struct casbox_cache_entry *e;
	uint64_t total = 0, target = store->set.cache_size / 4 * 3;
	struct stat st;
	struct dirent *d;
	const char *base;
	size_t len;
	DIR *dir;

	dir = opendir(store->cache_dir);
	if (dir == NULL)
		return;
	t_array_init(&entries, 16);
	while ((d = readdir(dir)) != NULL) {
		len = strlen(d->d_name);
		if (len < 5 || strcmp(d->d_name + len - 4, ".map") != 0)
			continue;
		base = t_strdup_printf("%s/%s", store->cache_dir,
				       t_strndup(d->d_name, len - 4));
		e = array_append_space(&entries);
		e->base = (char *)base;
		if (stat(t_strconcat(base, ".map", NULL), &st) == 0)
			e->used = st.st_mtime;
		if (stat(t_strconcat(base, ".data", NULL), &st) == 0)
			e->bytes = (uint64_t)st.st_blocks * 512;
		total += e->bytes;
	}
	(void)closedir(dir);
	if (total <= store->set.cache_size)
		return;
	array_sort(&entries, casbox_cache_entry_cmp);
	array_foreach_modifiable(&entries, e) {
		if (total <= target)
			break;
		i_unlink_if_exists(t_strconcat(e->base, ".map", NULL));
		i_unlink_if_exists(t_strconcat(e->base, ".data", NULL));
		total -= e->bytes;
	}
}
