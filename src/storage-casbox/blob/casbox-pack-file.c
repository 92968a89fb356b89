/* Pack read handles: local files and sealed packs in object storage
   through the block cache (casbox-pack-file.h). */

#include "lib.h"
#include "buffer.h"
#include "byteorder.h"
#include "mkdir-parents.h"
#include "read-full.h"
#include "write-full.h"
#include "cas-crc32c.h"
#include "casbox-objstore.h"
#include "casbox-pack-private.h"
#include "casbox-pack-file.h"

#include <stdio.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#define CASBOX_CACHE_BLOCK (64 * 1024)
/* one object-store request fetches at most this many missing blocks */
#define CASBOX_CACHE_MAX_RUN 128
#define CASBOX_CACHE_MAP_MAGIC "CBCACHE1"
#define CASBOX_CACHE_MAP_HDR_SIZE (8 + 8 + CASBOX_PACK_HASH_SIZE)
#define CASBOX_CACHE_ENTRY_SIZE 8
#define CASBOX_CACHE_ENTRY_PRESENT 0x43424331 /* "CBC1" */

struct casbox_pack_file {
	struct casbox_pack_store *store;
	uint32_t pack_id;
	char *name;
	char *error;
	int fd;			/* the pack, or the cache's data file */
	int map_fd;		/* remote only */
	bool remote;
	uint64_t size;
	struct casbox_pack_stub stub;
	char *object;
	/* blocks this handle has checked (or fetched) */
	uint8_t *verified;
	uint64_t block_count;
};

const char *casbox_pack_stub_path(struct casbox_pack_store *store,
				  uint32_t pack_id)
{
	return t_strdup_printf("%s/pack-%08u.cbr", store->set.dir, pack_id);
}

void casbox_pack_stub_export(const struct casbox_pack_stub *stub,
			     unsigned char buf[CASBOX_PACK_STUB_SIZE])
{
	memcpy(buf, CASBOX_PACK_STUB_MAGIC, 8);
	cpu32_to_le_unaligned(CASBOX_PACK_STUB_VERSION, buf + 8);
	cpu32_to_le_unaligned(stub->pack_id, buf + 12);
	cpu64_to_le_unaligned(stub->size, buf + 16);
	memcpy(buf + 24, stub->hash, CASBOX_PACK_HASH_SIZE);
}

int casbox_pack_stub_read(const char *path, struct casbox_pack_stub *stub_r,
			  const char **error_r)
{
	unsigned char buf[CASBOX_PACK_STUB_SIZE + 1];
	ssize_t ret;
	int fd;

	i_zero(stub_r);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd == -1) {
		if (errno == ENOENT)
			return 0;
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	ret = read(fd, buf, sizeof(buf));
	i_close_fd(&fd);
	if (ret < 0) {
		*error_r = t_strdup_printf("read(%s) failed: %m", path);
		return -1;
	}
	if (ret != CASBOX_PACK_STUB_SIZE ||
	    memcmp(buf, CASBOX_PACK_STUB_MAGIC, 8) != 0 ||
	    le32_to_cpu_unaligned(buf + 8) != CASBOX_PACK_STUB_VERSION) {
		*error_r = t_strdup_printf("%s: not a remote pack stub "
					   "(size %zd)", path, ret);
		return -1;
	}
	stub_r->pack_id = le32_to_cpu_unaligned(buf + 12);
	stub_r->size = le64_to_cpu_unaligned(buf + 16);
	memcpy(stub_r->hash, buf + 24, CASBOX_PACK_HASH_SIZE);
	return 1;
}

static int casbox_pack_fsync_dir(const char *dir, const char **error_r)
{
	int fd = open(dir, O_RDONLY | O_CLOEXEC), ret = 0;

	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", dir);
		return -1;
	}
	if (fsync(fd) < 0) {
		*error_r = t_strdup_printf("fsync(%s) failed: %m", dir);
		ret = -1;
	}
	i_close_fd(&fd);
	return ret;
}

int casbox_pack_stub_write(struct casbox_pack_store *store,
			   const struct casbox_pack_stub *stub,
			   const char **error_r)
{
	unsigned char buf[CASBOX_PACK_STUB_SIZE];
	const char *path = casbox_pack_stub_path(store, stub->pack_id);
	const char *tmp = t_strconcat(path, ".tmp", NULL);
	int fd;

	casbox_pack_stub_export(stub, buf);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", tmp);
		return -1;
	}
	if (write_full(fd, buf, sizeof(buf)) < 0 ||
	    (store->set.fsync && fsync(fd) < 0)) {
		*error_r = t_strdup_printf("write(%s) failed: %m", tmp);
		i_close_fd(&fd);
		i_unlink_if_exists(tmp);
		return -1;
	}
	i_close_fd(&fd);
	if (rename(tmp, path) < 0) {
		*error_r = t_strdup_printf("rename(%s) failed: %m", tmp);
		i_unlink_if_exists(tmp);
		return -1;
	}
	return store->set.fsync ?
		casbox_pack_fsync_dir(store->set.dir, error_r) : 0;
}

static void casbox_pack_file_set_error(struct casbox_pack_file *pf,
				       const char *error)
{
	i_free(pf->error);
	pf->error = i_strdup(error);
}

/* Open (or start) the cache files of a remote pack. A map whose header
   names another pack content is cleared. */
static int casbox_pack_cache_open(struct casbox_pack_file *pf,
				  const char **error_r)
{
	struct casbox_pack_store *store = pf->store;
	unsigned char hdr[CASBOX_CACHE_MAP_HDR_SIZE], cur[sizeof(hdr)];
	const char *base, *path;

	if (mkdir_parents(store->cache_dir, 0700) < 0 && errno != EEXIST) {
		*error_r = t_strdup_printf("mkdir(%s) failed: %m",
					   store->cache_dir);
		return -1;
	}
	base = t_strdup_printf("%s/pack-%08u", store->cache_dir, pf->pack_id);
	path = t_strconcat(base, ".map", NULL);
	pf->map_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (pf->map_fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	path = t_strconcat(base, ".data", NULL);
	pf->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (pf->fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	memcpy(hdr, CASBOX_CACHE_MAP_MAGIC, 8);
	cpu64_to_le_unaligned(pf->stub.size, hdr + 8);
	memcpy(hdr + 16, pf->stub.hash, CASBOX_PACK_HASH_SIZE);
	if (pread(pf->map_fd, cur, sizeof(cur), 0) != (ssize_t)sizeof(cur) ||
	    memcmp(cur, hdr, sizeof(hdr)) != 0) {
		if (ftruncate(pf->map_fd, 0) < 0 ||
		    pwrite_full(pf->map_fd, hdr, sizeof(hdr), 0) < 0) {
			*error_r = t_strdup_printf("write(%s.map) failed: %m",
						   base);
			return -1;
		}
	}
	/* last use, for eviction */
	(void)futimens(pf->map_fd, NULL);
	return 0;
}

static int
casbox_pack_file_open_remote(struct casbox_pack_file *pf,
			     const char **error_r)
{
	struct casbox_pack_store *store = pf->store;
	const char *path = casbox_pack_stub_path(store, pf->pack_id);
	int ret;

	ret = casbox_pack_stub_read(path, &pf->stub, error_r);
	if (ret <= 0)
		return ret;
	if (pf->stub.pack_id != pf->pack_id) {
		*error_r = t_strdup_printf("%s names pack %u", path,
					   pf->stub.pack_id);
		return -1;
	}
	if (store->remote == NULL) {
		*error_r = t_strdup_printf("pack %u is in object storage "
			"(%s), but casbox_pack_storage is not set", pf->pack_id,
			path);
		return -1;
	}
	pf->remote = TRUE;
	pf->size = pf->stub.size;
	pf->object = i_strdup(casbox_objstore_pack_name(store->remote,
							pf->pack_id));
	pf->name = i_strdup_printf("object storage %s %s",
				   store->remote->label, pf->object);
	pf->block_count = (pf->size + CASBOX_CACHE_BLOCK - 1) /
		CASBOX_CACHE_BLOCK;
	pf->verified = i_new(uint8_t, pf->block_count + 1);
	if (casbox_pack_cache_open(pf, error_r) < 0)
		return -1;
	return 1;
}

int casbox_pack_file_open(struct casbox_pack_store *store, uint32_t pack_id,
			  struct casbox_pack_file **pf_r,
			  const char **error_r)
{
	struct casbox_pack_file *pf;
	const char *path = casbox_pack_path(store, pack_id);
	int ret;

	*pf_r = NULL;
	pf = i_new(struct casbox_pack_file, 1);
	pf->store = store;
	pf->pack_id = pack_id;
	pf->map_fd = -1;
	if (store->kept_fd != -1 && store->kept_pack_id == pack_id) {
		pf->fd = store->kept_fd;
		store->kept_fd = -1;
	} else {
		pf->fd = open(path, O_RDONLY | O_CLOEXEC);
	}
	if (pf->fd != -1) {
		pf->name = i_strdup(path);
		*pf_r = pf;
		return 1;
	}
	if (errno != ENOENT) {
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		i_free(pf);
		return -1;
	}
	/* uploaded: the stub is made before the local pack is unlinked */
	ret = casbox_pack_file_open_remote(pf, error_r);
	if (ret <= 0) {
		if (ret == 0) {
			*error_r = t_strdup_printf("open(%s) failed: %s", path,
						   strerror(ENOENT));
		}
		casbox_pack_file_close(&pf);
		return ret;
	}
	*pf_r = pf;
	return 1;
}

void casbox_pack_file_close(struct casbox_pack_file **_pf)
{
	struct casbox_pack_file *pf = *_pf;

	if (pf == NULL)
		return;
	*_pf = NULL;
	if (pf->fd != -1 && !pf->remote && pf->map_fd == -1 &&
	    pf->store->keep_read_fd) {
		/* for the next open of this pack (a read fd: local packs
		   are opened O_RDONLY here; the appender has its own) */
		casbox_pack_store_release_read_fd(pf->store);
		pf->store->kept_fd = pf->fd;
		pf->store->kept_pack_id = pf->pack_id;
		pf->fd = -1;
	}
	if (pf->fd != -1)
		i_close_fd(&pf->fd);
	if (pf->map_fd != -1)
		i_close_fd(&pf->map_fd);
	i_free(pf->verified);
	i_free(pf->object);
	i_free(pf->name);
	i_free(pf->error);
	i_free(pf);
}

bool casbox_pack_file_is_remote(struct casbox_pack_file *pf)
{
	return pf->remote;
}

const char *casbox_pack_file_get_name(struct casbox_pack_file *pf)
{
	return pf->name;
}

const char *casbox_pack_file_get_error(struct casbox_pack_file *pf)
{
	return pf->error != NULL ? pf->error : "unknown error";
}

int casbox_pack_file_get_size(struct casbox_pack_file *pf, uint64_t *size_r)
{
	struct stat st;

	if (pf->remote) {
		*size_r = pf->size;
		return 0;
	}
	if (fstat(pf->fd, &st) < 0) {
		casbox_pack_file_set_error(pf, t_strdup_printf(
			"fstat(%s) failed: %m", pf->name));
		return -1;
	}
	*size_r = st.st_size;
	return 0;
}

static uint64_t casbox_cache_block_len(struct casbox_pack_file *pf,
				       uint64_t block)
{
	uint64_t start = block * CASBOX_CACHE_BLOCK;

	return I_MIN(CASBOX_CACHE_BLOCK, pf->size - start);
}

/* Is block in the cache and whole? buf: CASBOX_CACHE_BLOCK bytes. */
static bool casbox_cache_block_check(struct casbox_pack_file *pf,
				     uint64_t block, unsigned char *buf)
{
	unsigned char entry[CASBOX_CACHE_ENTRY_SIZE];
	uint64_t len = casbox_cache_block_len(pf, block);

	if (pread(pf->map_fd, entry, sizeof(entry), CASBOX_CACHE_MAP_HDR_SIZE +
		  block * CASBOX_CACHE_ENTRY_SIZE) != (ssize_t)sizeof(entry) ||
	    le32_to_cpu_unaligned(entry) != CASBOX_CACHE_ENTRY_PRESENT)
		return FALSE;
	if (pread_full(pf->fd, buf, len, block * CASBOX_CACHE_BLOCK) <= 0)
		return FALSE;
	return cas_crc32c_mask(cas_crc32c(buf, len)) ==
		le32_to_cpu_unaligned(entry + 4);
}

static void casbox_pack_file_remote_error(struct casbox_pack_file *pf,
					  const char *error)
{
	pf->store->remote_error_temp = TRUE;
	casbox_pack_file_set_error(pf, t_strdup_printf(
		"reading pack %u from object storage failed "
		"(temporary, the pack is safe there): %s", pf->pack_id, error));
	errno = EAGAIN;
}

/* Fetch blocks [first, first+count) with one request into the cache. */
static int casbox_cache_fetch(struct casbox_pack_file *pf, uint64_t first,
			      uint64_t count)
{
	uint64_t start = first * CASBOX_CACHE_BLOCK, len = 0, i;
	unsigned char entry[CASBOX_CACHE_ENTRY_SIZE];
	const char *error;
	unsigned char *buf;
	size_t got;
	int ret;

	for (i = 0; i < count; i++)
		len += casbox_cache_block_len(pf, first + i);
	buf = i_malloc(len);
	ret = casbox_objstore_get(pf->store->remote, pf->object, start, buf,
				  len, &got, &error);
	if (ret > 0 && got != len) {
		error = t_strdup_printf("object is %"PRIu64" bytes, the "
			"uploaded pack was %"PRIu64" (partially uploaded or "
			"truncated)", start + got, pf->size);
		ret = -1;
	}
	if (ret <= 0) {
		casbox_pack_file_remote_error(pf, error);
		i_free(buf);
		return -1;
	}
	if (pwrite_full(pf->fd, buf, len, start) < 0) {
		casbox_pack_file_set_error(pf, t_strdup_printf(
			"write(%s cache) failed: %m", pf->name));
		i_free(buf);
		return -1;
	}
	for (i = 0; i < count; i++) {
		uint64_t blen = casbox_cache_block_len(pf, first + i);
		const unsigned char *b = buf + i * CASBOX_CACHE_BLOCK;

		cpu32_to_le_unaligned(CASBOX_CACHE_ENTRY_PRESENT, entry);
		cpu32_to_le_unaligned(cas_crc32c_mask(cas_crc32c(b, blen)),
				      entry + 4);
		/* after the data: an entry never vouches for unwritten
		   bytes, and the CRC catches what a crash tore anyway */
		(void)pwrite_full(pf->map_fd, entry, sizeof(entry),
				  CASBOX_CACHE_MAP_HDR_SIZE +
				  (first + i) * CASBOX_CACHE_ENTRY_SIZE);
		pf->verified[first + i] = 1;
	}
	i_free(buf);
	pf->store->cache_fetched += len;
	if (pf->store->cache_fetched > pf->store->set.cache_size / 8) {
		pf->store->cache_fetched = 0;
		casbox_pack_cache_evict(pf->store);
	}
	return 0;
}

static int casbox_cache_ensure(struct casbox_pack_file *pf, uint64_t offset,
			       uint64_t size)
{
	uint64_t block, last, run;
	unsigned char *buf = NULL;
	int ret = 0;

	if (size == 0)
		return 0;
	last = (offset + size - 1) / CASBOX_CACHE_BLOCK;
	for (block = offset / CASBOX_CACHE_BLOCK; block <= last; ) {
		if (pf->verified[block] != 0) {
			block++;
			continue;
		}
		if (buf == NULL)
			buf = i_malloc(CASBOX_CACHE_BLOCK);
		if (casbox_cache_block_check(pf, block, buf)) {
			pf->verified[block] = 1;
			block++;
			continue;
		}
		/* a run of missing blocks: one request */
		for (run = 1; block + run <= last &&
		     run < CASBOX_CACHE_MAX_RUN &&
		     pf->verified[block + run] == 0; run++) ;
		if (casbox_cache_fetch(pf, block, run) < 0) {
			ret = -1;
			break;
		}
		block += run;
	}
	i_free(buf);
	return ret;
}

ssize_t casbox_pack_file_pread(struct casbox_pack_file *pf, void *buf,
			       size_t size, uint64_t offset)
{
	ssize_t ret;

	if (!pf->remote) {
		ret = pread(pf->fd, buf, size, offset);
		if (ret < 0) {
			casbox_pack_file_set_error(pf, t_strdup_printf(
				"pread(%s) failed: %m", pf->name));
		}
		return ret;
	}
	if (offset >= pf->size)
		return 0;
	size = I_MIN(size, pf->size - offset);
	if (casbox_cache_ensure(pf, offset, size) < 0)
		return -1;
	if (pread_full(pf->fd, buf, size, offset) <= 0) {
		casbox_pack_file_set_error(pf, t_strdup_printf(
			"pread(%s cache) failed: %m", pf->name));
		if (errno == 0)
			errno = EIO;
		return -1;
	}
	return size;
}

int casbox_pack_file_prefetch(struct casbox_pack_file *pf, uint64_t offset,
			      uint64_t size)
{
	if (!pf->remote || offset >= pf->size)
		return 0;
	return casbox_cache_ensure(pf, offset, I_MIN(size, pf->size - offset));
}
