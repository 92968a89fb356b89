/* crashfs: see crashfs.h. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "crashfs.h"

#include <stdio.h>
#include <fcntl.h>
#include <unistd.h>
#include <dirent.h>

struct crashfs_file {
	/* current name, NULL once unlinked or renamed over */
	char *name;
	/* name as of the last fsync_dir(), NULL if none */
	char *durable_name;
	/* content as of the last fsync() */
	buffer_t *synced;
};

static struct {
	char *dir;
	ARRAY(struct crashfs_file *) files;
	ARRAY(struct crashfs_file *) fds;
	unsigned int ops, crash_at;
	enum crashfs_fault fault;
	uoff_t enospc_left;
	bool crashed;
	uint32_t rand;
} cfs;

static uint32_t cfs_rand(void)
{
	cfs.rand ^= cfs.rand << 13;
	cfs.rand ^= cfs.rand >> 17;
	cfs.rand ^= cfs.rand << 5;
	return cfs.rand;
}

static struct crashfs_file *cfs_file_by_name(const char *path)
{
	struct crashfs_file *const *filep;

	array_foreach(&cfs.files, filep) {
		if ((*filep)->name != NULL && strcmp((*filep)->name, path) == 0)
			return *filep;
	}
	return NULL;
}

static struct crashfs_file *cfs_file_add(const char *path)
{
	struct crashfs_file *file = i_new(struct crashfs_file, 1);

	file->name = i_strdup(path);
	file->synced = buffer_create_dynamic(default_pool, 256);
	array_push_back(&cfs.files, &file);
	return file;
}

static void cfs_read_all(int fd, buffer_t *buf)
{
	unsigned char data[8192];
	uoff_t offset = 0;
	ssize_t ret;

	buffer_set_used_size(buf, 0);
	while ((ret = pread(fd, data, sizeof(data), offset)) > 0) {
		buffer_append(buf, data, ret);
		offset += ret;
	}
	if (ret < 0)
		i_fatal("crashfs: pread failed: %m");
}

static void cfs_write_file(const char *path, const void *data, size_t size)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	if (fd == -1 || (size > 0 && write(fd, data, size) != (ssize_t)size))
		i_fatal("crashfs: write(%s) failed: %m", path);
	i_close_fd(&fd);
}

static void cfs_files_free(void)
{
	struct crashfs_file **filep;

	array_foreach_modifiable(&cfs.files, filep) {
		i_free((*filep)->name);
		i_free((*filep)->durable_name);
		buffer_free(&(*filep)->synced);
		i_free(*filep);
	}
	array_clear(&cfs.files);
}

static void cfs_scan(void)
{
	struct crashfs_file *file;
	struct dirent *d;
	const char *path;
	DIR *dir;
	int fd;

	dir = opendir(cfs.dir);
	if (dir == NULL)
		return;
	while ((d = readdir(dir)) != NULL) {
		if (d->d_name[0] == '.' || strcmp(d->d_name, "LOCK") == 0)
			continue;
		path = t_strconcat(cfs.dir, "/", d->d_name, NULL);
		fd = open(path, O_RDONLY);
		if (fd == -1)
			i_fatal("crashfs: open(%s) failed: %m", path);
		file = cfs_file_add(path);
		file->durable_name = i_strdup(path);
		cfs_read_all(fd, file->synced);
		i_close_fd(&fd);
	}
	(void)closedir(dir);
}

void crashfs_init(const char *dir, unsigned int seed)
{
	i_zero(&cfs);
	cfs.dir = i_strdup(dir);
	cfs.rand = seed * 2654435761U + 1;
	cfs.enospc_left = (uoff_t)-1;
	i_array_init(&cfs.files, 32);
	i_array_init(&cfs.fds, 64);
	cfs_scan();
}

void crashfs_deinit(void)
{
	cfs_files_free();
	array_free(&cfs.files);
	array_free(&cfs.fds);
	i_free(cfs.dir);
}

void crashfs_crash_at(unsigned int n, enum crashfs_fault fault)
{
	cfs.crash_at = n == 0 ? 0 : cfs.ops + n;
	cfs.fault = fault;
}

void crashfs_enospc_after(uoff_t bytes)
{
	cfs.enospc_left = bytes;
}

unsigned int crashfs_op_count(void)
{
	return cfs.ops;
}

bool crashfs_crashed(void)
{
	return cfs.crashed;
}

/* Count an operation; TRUE if it must crash now. */
static bool cfs_op_crashes(void)
{
	if (cfs.crashed)
		return TRUE;
	cfs.ops++;
	if (cfs.crash_at != 0 && cfs.ops == cfs.crash_at) {
		cfs.crashed = TRUE;
		return TRUE;
	}
	return FALSE;
}

static int cfs_fail_eio(void)
{
	errno = EIO;
	return -1;
}

static int crashfs_open(const char *path, int flags, mode_t mode)
{
	struct crashfs_file *file;
	int fd;

	if (cfs.crashed)
		return cfs_fail_eio();
	fd = open(path, flags, mode);
	if (fd == -1)
		return -1;
	file = cfs_file_by_name(path);
	if (file == NULL)
		file = cfs_file_add(path);
	array_idx_set(&cfs.fds, fd, &file);
	return fd;
}

static int crashfs_close(int fd)
{
	struct crashfs_file *null = NULL;

	array_idx_set(&cfs.fds, fd, &null);
	return close(fd);
}

static ssize_t crashfs_pread(int fd, void *buf, size_t size, off_t offset)
{
	if (cfs.crashed)
		return cfs_fail_eio();
	return pread(fd, buf, size, offset);
}

static ssize_t crashfs_pwrite(int fd, const void *buf, size_t size,
			      off_t offset)
{
	size_t part;

	if (cfs_op_crashes()) {
		if (cfs.fault == CRASHFS_FAULT_TORN && size > 1 &&
		    cfs.ops == cfs.crash_at) {
			part = cfs_rand() % size;
			if (pwrite(fd, buf, part, offset) < 0)
				i_fatal("crashfs: pwrite failed: %m");
		}
		return cfs_fail_eio();
	}
	if (cfs.enospc_left != (uoff_t)-1 && size > cfs.enospc_left) {
		part = cfs.enospc_left;
		cfs.enospc_left = 0;
		if (part == 0) {
			errno = ENOSPC;
			return -1;
		}
		return pwrite(fd, buf, part, offset);
	}
	if (cfs.enospc_left != (uoff_t)-1)
		cfs.enospc_left -= size;
	return pwrite(fd, buf, size, offset);
}

static int crashfs_fsync(int fd)
{
	struct crashfs_file *const *filep;
	int rfd;

	if (cfs_op_crashes())
		return cfs_fail_eio();
	filep = array_idx(&cfs.fds, fd);
	i_assert(*filep != NULL);
	if ((*filep)->name == NULL)
		return 0;
	/* fd may be write-only: read the content back by name */
	rfd = open((*filep)->name, O_RDONLY);
	if (rfd == -1)
		i_fatal("crashfs: open(%s) failed: %m", (*filep)->name);
	cfs_read_all(rfd, (*filep)->synced);
	i_close_fd(&rfd);
	return 0;
}

static int crashfs_ftruncate(int fd, off_t size)
{
	if (cfs.crashed)
		return cfs_fail_eio();
	return ftruncate(fd, size);
}

static int crashfs_fstat(int fd, struct stat *st_r)
{
	if (cfs.crashed)
		return cfs_fail_eio();
	return fstat(fd, st_r);
}

static int crashfs_stat(const char *path, struct stat *st_r)
{
	if (cfs.crashed)
		return cfs_fail_eio();
	return stat(path, st_r);
}

static int crashfs_rename(const char *from, const char *to)
{
	struct crashfs_file *file, *old;

	if (cfs_op_crashes())
		return cfs_fail_eio();
	if (rename(from, to) < 0)
		return -1;
	old = cfs_file_by_name(to);
	if (old != NULL)
		i_free_and_null(old->name);
	file = cfs_file_by_name(from);
	if (file != NULL) {
		i_free(file->name);
		file->name = i_strdup(to);
	}
	return 0;
}

static int crashfs_link(const char *from, const char *to)
{
	struct crashfs_file *file, *new_file;

	if (cfs_op_crashes())
		return cfs_fail_eio();
	if (link(from, to) < 0)
		return -1;
	/* a second name for the same content: tracked as its own file,
	   synced as far as the first one is */
	file = cfs_file_by_name(from);
	new_file = cfs_file_add(to);
	if (file != NULL)
		buffer_append_buf(new_file->synced, file->synced, 0,
				  SIZE_MAX);
	return 0;
}

static int crashfs_unlink(const char *path)
{
	struct crashfs_file *file;

	if (cfs.crashed)
		return cfs_fail_eio();
	if (unlink(path) < 0)
		return -1;
	file = cfs_file_by_name(path);
	if (file != NULL)
		i_free_and_null(file->name);
	return 0;
}

static int crashfs_mkdir(const char *path, mode_t mode)
{
	if (cfs.crashed)
		return cfs_fail_eio();
	return mkdir(path, mode);
}

static int crashfs_fsync_dir(const char *path ATTR_UNUSED)
{
	struct crashfs_file *const *filep;

	if (cfs_op_crashes())
		return cfs_fail_eio();
	array_foreach(&cfs.files, filep) {
		i_free((*filep)->durable_name);
		(*filep)->durable_name = i_strdup((*filep)->name);
	}
	return 0;
}

void crashfs_power_loss(enum crashfs_loss loss)
{
	struct crashfs_file *const *filep, *file;
	buffer_t *current = buffer_create_dynamic(default_pool, 1024);
	int fd;

	/* decide what survives before touching anything */
	array_foreach(&cfs.files, filep) {
		file = *filep;
		if (loss != CRASHFS_LOSS_KEEP_SOME || file->name == NULL ||
		    file->durable_name == NULL ||
		    strcmp(file->name, file->durable_name) != 0)
			continue;
		fd = open(file->name, O_RDONLY);
		if (fd == -1)
			continue;
		cfs_read_all(fd, current);
		i_close_fd(&fd);
		if (current->used > file->synced->used &&
		    memcmp(current->data, file->synced->data,
			   file->synced->used) == 0) {
			size_t extra = cfs_rand() %
				(current->used - file->synced->used + 1);
			buffer_append(file->synced,
				      CONST_PTR_OFFSET(current->data,
						       file->synced->used),
				      extra);
		}
	}
	array_foreach(&cfs.files, filep) {
		if ((*filep)->name != NULL && unlink((*filep)->name) < 0 &&
		    errno != ENOENT)
			i_fatal("crashfs: unlink(%s) failed: %m",
				(*filep)->name);
	}
	array_foreach(&cfs.files, filep) {
		file = *filep;
		if (file->durable_name != NULL) {
			cfs_write_file(file->durable_name, file->synced->data,
				       file->synced->used);
		}
	}
	buffer_free(&current);
	cfs_files_free();
	array_clear(&cfs.fds);
	cfs.crashed = FALSE;
	cfs.crash_at = 0;
	cfs.enospc_left = (uoff_t)-1;
	cfs_scan();
}

const struct cas_io crashfs_io = {
	.open = crashfs_open,
	.close = crashfs_close,
	.pread = crashfs_pread,
	.pwrite = crashfs_pwrite,
	.fsync = crashfs_fsync,
	.ftruncate = crashfs_ftruncate,
	.fstat = crashfs_fstat,
	.stat = crashfs_stat,
	.rename = crashfs_rename,
	.link = crashfs_link,
	.unlink = crashfs_unlink,
	.mkdir = crashfs_mkdir,
	.fsync_dir = crashfs_fsync_dir,
};
