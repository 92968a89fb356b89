/* The POSIX I/O table; see casbox-lsm-io.h. */

#include "lib.h"
#include "casbox-lsm-io.h"

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

	fd = open(path, O_RDONLY | O_DIRECTORY);
	if (fd == -1)
		return -1;
	ret = fsync(fd);
	i_close_fd(&fd);
	return ret;
}

const struct casbox_lsm_io casbox_lsm_io_posix = {
	.open = posix_open,
	.close = close,
	.pread = pread,
	.pwrite = pwrite,
	.fsync = posix_fsync,
	.ftruncate = ftruncate,
	.fstat = fstat,
	.stat = stat,
	.rename = rename,
	.unlink = unlink,
	.mkdir = mkdir,
	.fsync_dir = posix_fsync_dir,
};
