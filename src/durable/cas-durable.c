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

static int io_write_full(const struct cas_io *io, int fd, const void *data,
			 size_t size)
{
	off_t pos = 0;
	ssize_t ret;

	while (size > 0) {
		ret = io->pwrite(fd, data, size, pos);
		if (ret < 0)
			return -1;
		if (ret == 0) {
			errno = ENOSPC;
			return -1;
		}
		data = CONST_PTR_OFFSET(data, ret);
		size -= ret;
		pos += ret;
	}
	return 0;
}

/* The temporary file, complete and (unless no_fsync) synced. */
static int
durable_write_tmp(const char *tmp, const void *data, size_t size,
		  const struct cas_durable_write_settings *set,
		  const char **error_r)
{
	const struct cas_io *io = io_or_posix(set->io);
	const struct stat *st = set->like;
	int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
	int fd, ret = -1;

	flags |= set->tmp_truncate ? O_TRUNC : O_EXCL;
	fd = io->open(tmp, flags, set->mode != 0 ? set->mode : 0600);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s%s) failed: %m", tmp,
					   set->tmp_truncate ? "" : ", O_EXCL");
		return -1;
	}
	if (st != NULL && (st->st_uid != geteuid() ||
			   st->st_gid != getegid()) &&
	    fchown(fd, st->st_uid, st->st_gid) < 0)
		*error_r = t_strdup_printf("fchown(%s) failed: %m", tmp);
	else if (st != NULL && fchmod(fd, st->st_mode & 07777) < 0)
		*error_r = t_strdup_printf("fchmod(%s) failed: %m", tmp);
	else if (io_write_full(io, fd, data, size) < 0)
		*error_r = t_strdup_printf("write(%s) failed: %m", tmp);
	else if (!set->no_fsync && io->fsync(fd) < 0)
		*error_r = t_strdup_printf("fsync(%s) failed: %m", tmp);
	else
		ret = 0;
	if (io->close(fd) < 0 && ret == 0) {
		*error_r = t_strdup_printf("close(%s) failed: %m", tmp);
		ret = -1;
	}
	return ret;
}

int cas_durable_write_atomic(const char *path, const void *data,
			     size_t size,
			     const struct cas_durable_write_settings *set,
			     const char **error_r)
{
	const struct cas_io *io = io_or_posix(set->io);
	unsigned char rnd[8];
	const char *tmp;
	int ret = -1;

	if (set->tmp_path != NULL)
		tmp = set->tmp_path;
	else {
		random_fill(rnd, sizeof(rnd));
		tmp = t_strdup_printf("%s.%s.tmp", path,
				      binary_to_hex(rnd, sizeof(rnd)));
	}
	if (durable_write_tmp(tmp, data, size, set, error_r) < 0) {
		/* fall through to the unlink */
	} else if (!set->no_replace) {
		if (io->rename(tmp, path) < 0) {
			*error_r = t_strdup_printf(
				"rename(%s, %s) failed: %m", tmp, path);
		} else {
			ret = 0;
		}
	} else {
		/* link() never replaces an existing file */
		if (io->link(tmp, path) < 0) {
			*error_r = t_strdup_printf(
				"link(%s, %s) failed: %m", tmp, path);
		} else {
			ret = 0;
		}
	}
	if ((ret < 0 || set->no_replace) && io->unlink(tmp) < 0 &&
	    errno != ENOENT && ret == 0) {
		*error_r = t_strdup_printf("unlink(%s) failed: %m", tmp);
		ret = -1;
	}
	if (ret == 0 && !set->no_fsync &&
	    cas_durable_fsync_parent(io, path, error_r) < 0)
		ret = -1;
	return ret;
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
