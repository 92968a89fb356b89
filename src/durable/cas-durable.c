/* cas-durable: atomic, durable file writes (see cas-durable.h). */

#include "lib.h"
#include "hex-binary.h"
#include "randgen.h"
#include "cas-durable.h"

#include <fcntl.h>
#include <unistd.h>

static const struct cas_io *io_or_posix(const struct cas_io *io)
{
	return io != NULL ? io : &cas_io_posix;
}

const char *cas_durable_dir_of(const char *path)
{
	const char *p = strrchr(path, '/');

	return p == NULL ? "." : p == path ? "/" : t_strdup_until(path, p);
}

int cas_durable_fsync_dir(const struct cas_io *io, const char *dir,
			  const char **error_r)
{
	if (io_or_posix(io)->fsync_dir(dir) < 0) {
		*error_r = t_strdup_printf("fsync(%s) failed: %m", dir);
		return -1;
	}
	return 0;
}

int cas_durable_fsync_parent(const struct cas_io *io, const char *path,
			     const char **error_r)
{
	return cas_durable_fsync_dir(io, cas_durable_dir_of(path), error_r);
}

struct cas_durable_file {
	struct cas_durable_write_settings set;
	const struct cas_io *io;
	char *path, *tmp_path;
	int fd;
	uoff_t offset;
};

int cas_durable_file_create(const char *path,
			    const struct cas_durable_write_settings *set,
			    struct cas_durable_file **file_r,
			    const char **error_r)
{
	const struct cas_io *io = io_or_posix(set->io);
	const struct stat *st = set->like;
	struct cas_durable_file *file;
	int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
	unsigned char rnd[8];
	const char *tmp;
	int fd;

	*file_r = NULL;
	if (set->tmp_path != NULL)
		tmp = set->tmp_path;
	else {
		random_fill(rnd, sizeof(rnd));
		tmp = t_strdup_printf("%s.%s.tmp", path,
				      binary_to_hex(rnd, sizeof(rnd)));
	}
	flags |= set->tmp_truncate ? O_TRUNC : O_EXCL;
	fd = io->open(tmp, flags, set->mode != 0 ? set->mode : 0600);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s%s) failed: %m", tmp,
					   set->tmp_truncate ? "" : ", O_EXCL");
		return -1;
	}
	file = i_new(struct cas_durable_file, 1);
	file->set = *set;
	file->set.tmp_path = NULL;
	file->set.like = NULL;
	file->io = io;
	file->path = i_strdup(path);
	file->tmp_path = i_strdup(tmp);
	file->fd = fd;
	if (st != NULL && (st->st_uid != geteuid() ||
			   st->st_gid != getegid()) &&
	    fchown(fd, st->st_uid, st->st_gid) < 0)
		*error_r = t_strdup_printf("fchown(%s) failed: %m", tmp);
	else if (st != NULL && fchmod(fd, st->st_mode & 07777) < 0)
		*error_r = t_strdup_printf("fchmod(%s) failed: %m", tmp);
	else {
		*file_r = file;
		return 0;
	}
	cas_durable_file_abort(&file);
	return -1;
}

int cas_durable_file_write(struct cas_durable_file *file, const void *data,
			   size_t size, const char **error_r)
{
	ssize_t ret;

	while (size > 0) {
		ret = file->io->pwrite(file->fd, data, size, file->offset);
		if (ret == 0)
			errno = ENOSPC;
		if (ret <= 0) {
			*error_r = t_strdup_printf("write(%s) failed: %m",
						   file->tmp_path);
			return -1;
		}
		data = CONST_PTR_OFFSET(data, ret);
		size -= ret;
		file->offset += ret;
	}
	return 0;
}

static void durable_file_free(struct cas_durable_file *file)
{
	i_free(file->path);
	i_free(file->tmp_path);
	i_free(file);
}

void cas_durable_file_abort(struct cas_durable_file **_file)
{
	struct cas_durable_file *file = *_file;

	if (file == NULL)
		return;
	*_file = NULL;
	if (file->fd != -1)
		(void)file->io->close(file->fd);
	if (file->io->unlink(file->tmp_path) < 0 && errno != ENOENT)
		i_error("unlink(%s) failed: %m", file->tmp_path);
	durable_file_free(file);
}

static int durable_file_finish(struct cas_durable_file *file,
			       const char **error_r)
{
	const struct cas_io *io = file->io;
	int ret = 0;

	if (!file->set.no_fsync && io->fsync(file->fd) < 0) {
		*error_r = t_strdup_printf("fsync(%s) failed: %m",
					   file->tmp_path);
		ret = -1;
	}
	if (io->close(file->fd) < 0 && ret == 0) {
		*error_r = t_strdup_printf("close(%s) failed: %m",
					   file->tmp_path);
		ret = -1;
	}
	file->fd = -1;
	if (ret < 0)
		return -1;
	if (!file->set.no_replace) {
		if (io->rename(file->tmp_path, file->path) < 0) {
			*error_r = t_strdup_printf("rename(%s, %s) failed: %m",
						   file->tmp_path, file->path);
			return -1;
		}
		return 0;
	}
	/* link() never replaces an existing file */
	if (io->link(file->tmp_path, file->path) < 0) {
		*error_r = t_strdup_printf("link(%s, %s) failed: %m",
					   file->tmp_path, file->path);
		return -1;
	}
	if (io->unlink(file->tmp_path) < 0 && errno != ENOENT) {
		*error_r = t_strdup_printf("unlink(%s) failed: %m",
					   file->tmp_path);
		return -1;
	}
	return 0;
}

int cas_durable_file_commit(struct cas_durable_file **_file,
			    const char **error_r)
{
	struct cas_durable_file *file = *_file;
	int ret;

	*_file = NULL;
	if (durable_file_finish(file, error_r) < 0) {
		int old_errno = errno;

		cas_durable_file_abort(&file);
		errno = old_errno;
		return -1;
	}
	ret = 0;
	if (!file->set.no_fsync && !file->set.no_dir_fsync &&
	    cas_durable_fsync_parent(file->io, file->path, error_r) < 0)
		ret = -1;
	durable_file_free(file);
	return ret;
}

int cas_durable_write_atomic(const char *path, const void *data,
			     size_t size,
			     const struct cas_durable_write_settings *set,
			     const char **error_r)
{
	struct cas_durable_file *file;

	if (cas_durable_file_create(path, set, &file, error_r) < 0)
		return -1;
	if (cas_durable_file_write(file, data, size, error_r) < 0) {
		cas_durable_file_abort(&file);
		return -1;
	}
	return cas_durable_file_commit(&file, error_r);
}

int cas_durable_read_file(const struct cas_io *io, const char *path,
			  size_t max_size, buffer_t *buf,
			  const char **error_r)
{
	struct stat st;
	size_t pos = 0;
	ssize_t ret;
	void *p;
	int fd;

	io = io_or_posix(io);
	fd = io->open(path, O_RDONLY | O_CLOEXEC, 0);
	if (fd == -1) {
		if (errno == ENOENT)
			return 0;
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	if (io->fstat(fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", path);
		(void)io->close(fd);
		return -1;
	}
	if (max_size != (size_t)-1 && (uoff_t)st.st_size > max_size) {
		*error_r = t_strdup_printf(
			"%s is corrupt: %"PRIuUOFF_T" bytes, at most %zu "
			"expected", path, (uoff_t)st.st_size, max_size);
		(void)io->close(fd);
		return -1;
	}
	p = buffer_append_space_unsafe(buf, st.st_size);
	while (pos < (size_t)st.st_size) {
		ret = io->pread(fd, PTR_OFFSET(p, pos), st.st_size - pos, pos);
		if (ret <= 0) {
			if (ret == 0)
				*error_r = t_strdup_printf(
					"read(%s) failed: file shrank to "
					"%zu bytes", path, pos);
			else
				*error_r = t_strdup_printf(
					"read(%s) failed: %m", path);
			buffer_set_used_size(buf, buf->used - st.st_size);
			(void)io->close(fd);
			return -1;
		}
		pos += ret;
	}
	if (io->close(fd) < 0) {
		*error_r = t_strdup_printf("close(%s) failed: %m", path);
		return -1;
	}
	return 1;
}
