/* The POSIX I/O table; see cas-io.h. */

#include "lib.h"
#include "cas-io.h"

#include <fcntl.h>
#include <unistd.h>
#include <stdio.h>

static int posix_open(const char *path, int flags, mode_t mode)
{
	return open(path, flags, mode);
}

static int posix_fsync(int fd)
{
	return fdatasync(fd);
}

static int posix_fsync_dir(const char *path)
{
	int fd, ret;

	fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd == -1)
		return -1;
	ret = fsync(fd);
	i_close_fd(&fd);
	return ret;
}

const struct cas_io cas_io_posix = {
	.open = posix_open,
	.close = close,
	.pread = pread,
	.pwrite = pwrite,
	.fsync = posix_fsync,
	.ftruncate = ftruncate,
	.fstat = fstat,
	.stat = stat,
	.rename = rename,
	.link = link,
	.unlink = unlink,
	.mkdir = mkdir,
	.fsync_dir = posix_fsync_dir,
};
