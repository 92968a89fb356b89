/* cas-keyfile: crash-safe key file writes (see cas-keyfile.h). */

#include "lib.h"
#include "hex-binary.h"
#include "write-full.h"
#include "cas-keyfile.h"

#include <sodium.h>
#include <fcntl.h>
#include <unistd.h>

static const char *cas_keyfile_dir_of(const char *path)
{
	const char *p = strrchr(path, '/');

	return p == NULL ? "." : p == path ? "/" : t_strdup_until(path, p);
}

int cas_keyfile_fsync_dir(const char *path, const char **error_r)
{
	const char *dir = cas_keyfile_dir_of(path);
	int fd, ret = 0;

	fd = open(dir, O_RDONLY | O_CLOEXEC);
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

/* The temporary file, complete and fsynced. */
static int
cas_keyfile_write_tmp(const char *tmp, const void *data, size_t size,
		      const struct stat *st, const char **error_r)
{
	int fd, ret = -1;

	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s, O_EXCL) failed: %m",
					   tmp);
		return -1;
	}
	if (st != NULL && (st->st_uid != geteuid() ||
			   st->st_gid != getegid()) &&
	    fchown(fd, st->st_uid, st->st_gid) < 0)
		*error_r = t_strdup_printf("fchown(%s) failed: %m", tmp);
	else if (st != NULL && fchmod(fd, st->st_mode & 07777) < 0)
		*error_r = t_strdup_printf("fchmod(%s) failed: %m", tmp);
	else if (write_full(fd, data, size) < 0)
		*error_r = t_strdup_printf("write(%s) failed: %m", tmp);
	else if (fsync(fd) < 0)
		*error_r = t_strdup_printf("fsync(%s) failed: %m", tmp);
	else
		ret = 0;
	if (close(fd) < 0 && ret == 0) {
		*error_r = t_strdup_printf("close(%s) failed: %m", tmp);
		ret = -1;
	}
	return ret;
}

int cas_keyfile_write_atomic(const char *path, const void *data,
			     size_t size, const struct stat *st,
			     bool replace, const char **error_r)
{
	unsigned char rnd[8];
	const char *tmp;
	int ret = -1;

	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	randombytes_buf(rnd, sizeof(rnd));
	tmp = t_strdup_printf("%s.%s.tmp", path,
			      binary_to_hex(rnd, sizeof(rnd)));
	if (cas_keyfile_write_tmp(tmp, data, size, st, error_r) < 0) {
		/* fall through to the unlink */
	} else if (replace) {
		if (rename(tmp, path) < 0) {
			*error_r = t_strdup_printf(
				"rename(%s, %s) failed: %m", tmp, path);
		} else {
			ret = 0;
		}
	} else {
		/* link() never replaces an existing key file */
		if (link(tmp, path) < 0) {
			*error_r = t_strdup_printf(
				"link(%s, %s) failed: %m", tmp, path);
		} else {
			ret = 0;
		}
	}
	i_unlink_if_exists(tmp);
	if (ret == 0 && cas_keyfile_fsync_dir(path, error_r) < 0)
		ret = -1;
	return ret;
}
