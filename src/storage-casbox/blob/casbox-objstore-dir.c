/* dir: driver: objects are files under a directory (a shared file
   system, or the tests' stand-in for an object store). A put writes a
   temporary file, fsyncs it and renames it into place, so an object is
   whole or absent. A missing base directory is an error (the store is
   unreachable), not an empty store. */

#include "lib.h"
#include "array.h"
#include "mkdir-parents.h"
#include "read-full.h"
#include "write-full.h"
#include "casbox-objstore.h"

#include <dirent.h>
#include <stdio.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#define CASBOX_OBJSTORE_DIR_COPY_BUF (1024 * 1024)

struct casbox_objstore_dir {
	const char *path;
};

static int
casbox_objstore_dir_init(struct casbox_objstore *os, const char *const *opts,
			 const char **error_r)
{
	struct casbox_objstore_dir *dir;
	const char *path = casbox_objstore_opt(opts, "path");

	if (path == NULL || path[0] != '/') {
		*error_r = "casbox_pack_storage: dir: path=/absolute/dir "
			"missing";
		return -1;
	}
	dir = p_new(os->pool, struct casbox_objstore_dir, 1);
	dir->path = p_strdup(os->pool, path);
	os->context = dir;
	os->label = p_strdup_printf(os->pool, "dir:%s", path);
	return 0;
}

static void casbox_objstore_dir_deinit(struct casbox_objstore *os ATTR_UNUSED)
{
}

static const char *
casbox_objstore_dir_path(struct casbox_objstore *os, const char *name)
{
	struct casbox_objstore_dir *dir = os->context;

	return t_strdup_printf("%s/%s", dir->path, name);
}

/* errno of a failed open is ENOENT: is it the object or the store? */
static int casbox_objstore_dir_enoent(struct casbox_objstore *os,
				      const char **error_r)
{
	struct casbox_objstore_dir *dir = os->context;
	struct stat st;

	if (stat(dir->path, &st) < 0) {
		*error_r = t_strdup_printf("stat(%s) failed: %m", dir->path);
		return -1;
	}
	return 0;
}

static int
casbox_objstore_dir_copy(int in_fd, int out_fd, uint64_t size,
			 const char *path, const char **error_r)
{
	unsigned char *buf = i_malloc(CASBOX_OBJSTORE_DIR_COPY_BUF);
	uint64_t off = 0;
	int ret = 0;

	while (off < size) {
		size_t n = I_MIN(size - off, CASBOX_OBJSTORE_DIR_COPY_BUF);

		ret = pread_full(in_fd, buf, n, off);
		if (ret <= 0) {
			*error_r = ret < 0 ?
				t_strdup_printf("read failed: %m") :
				"source shorter than its size";
			ret = -1;
			break;
		}
		if (write_full(out_fd, buf, n) < 0) {
			*error_r = t_strdup_printf("write(%s) failed: %m",
						   path);
			ret = -1;
			break;
		}
		off += n;
		ret = 0;
	}
	i_free(buf);
	return ret;
}

static int
casbox_objstore_dir_put(struct casbox_objstore *os, const char *name, int fd,
			uint64_t size, const char **error_r)
{
	const char *path = casbox_objstore_dir_path(os, name);
	const char *tmp = t_strconcat(path, ".tmp", NULL);
	const char *slash = strrchr(path, '/');
	int out_fd;

	if (casbox_objstore_dir_enoent(os, error_r) < 0)
		return -1;
	if (mkdir_parents(t_strdup_until(path, slash), 0700) < 0 &&
	    errno != EEXIST) {
		*error_r = t_strdup_printf("mkdir(%s) failed: %m",
					   t_strdup_until(path, slash));
		return -1;
	}
	out_fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (out_fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", tmp);
		return -1;
	}
	if (casbox_objstore_dir_copy(fd, out_fd, size, tmp, error_r) < 0) {
		i_close_fd(&out_fd);
		i_unlink_if_exists(tmp);
		return -1;
	}
	if (fsync(out_fd) < 0 || rename(tmp, path) < 0) {
		*error_r = t_strdup_printf("fsync/rename(%s) failed: %m", tmp);
		i_close_fd(&out_fd);
		i_unlink_if_exists(tmp);
		return -1;
	}
	i_close_fd(&out_fd);
	return 1;
}

static int
casbox_objstore_dir_get(struct casbox_objstore *os, const char *name,
			uint64_t offset, void *buf, size_t size,
			size_t *read_r, const char **error_r)
{
	const char *path = casbox_objstore_dir_path(os, name);
	ssize_t ret;
	size_t done = 0;
	int fd;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd == -1) {
		if (errno == ENOENT)
			return casbox_objstore_dir_enoent(os, error_r);
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	while (done < size) {
		ret = pread(fd, PTR_OFFSET(buf, done), size - done,
			    offset + done);
		if (ret < 0) {
			*error_r = t_strdup_printf("pread(%s) failed: %m",
						   path);
			i_close_fd(&fd);
			return -1;
		}
		if (ret == 0)
			break;
		done += ret;
	}
	i_close_fd(&fd);
	*read_r = done;
	return 1;
}

static int
casbox_objstore_dir_stat(struct casbox_objstore *os, const char *name,
			 uint64_t *size_r, const char **error_r)
{
	const char *path = casbox_objstore_dir_path(os, name);
	struct stat st;

	if (stat(path, &st) < 0) {
		if (errno == ENOENT)
			return casbox_objstore_dir_enoent(os, error_r);
		*error_r = t_strdup_printf("stat(%s) failed: %m", path);
		return -1;
	}
	*size_r = st.st_size;
	return 1;
}

static int
casbox_objstore_dir_list(struct casbox_objstore *os, const char *prefix,
			 pool_t pool, ARRAY_TYPE(const_string) *names,
			 const char **error_r)
{
	const char *full = casbox_objstore_dir_path(os, prefix);
	const char *slash = strrchr(full, '/');
	const char *dir_path = t_strdup_until(full, slash);
	const char *name_prefix = slash + 1;
	const char *obj_prefix = t_strdup_until(prefix,
		prefix + strlen(prefix) - strlen(name_prefix));
	struct dirent *d;
	const char *name;
	DIR *dir;

	if (casbox_objstore_dir_enoent(os, error_r) < 0)
		return -1;
	dir = opendir(dir_path);
	if (dir == NULL) {
		if (errno == ENOENT)
			return 0;
		*error_r = t_strdup_printf("opendir(%s) failed: %m", dir_path);
		return -1;
	}
	while ((d = readdir(dir)) != NULL) {
		if (strncmp(d->d_name, name_prefix, strlen(name_prefix)) != 0)
			continue;
		name = p_strconcat(pool, obj_prefix, d->d_name, NULL);
		array_push_back(names, &name);
	}
	(void)closedir(dir);
	return 0;
}

static int
casbox_objstore_dir_delete(struct casbox_objstore *os, const char *name,
			   const char **error_r)
{
	const char *path = casbox_objstore_dir_path(os, name);

	if (unlink(path) < 0) {
		if (errno == ENOENT)
			return casbox_objstore_dir_enoent(os, error_r);
		*error_r = t_strdup_printf("unlink(%s) failed: %m", path);
		return -1;
	}
	return 1;
}

const struct casbox_objstore_vfuncs casbox_objstore_dir = {
	.name = "dir",
	.init = casbox_objstore_dir_init,
	.deinit = casbox_objstore_dir_deinit,
	.put = casbox_objstore_dir_put,
	.get = casbox_objstore_dir_get,
	.stat = casbox_objstore_dir_stat,
	.list = casbox_objstore_dir_list,
	.delete = casbox_objstore_dir_delete,
};
