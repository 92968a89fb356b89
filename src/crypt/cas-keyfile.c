/* cas-keyfile: crash-safe key file writes (see cas-keyfile.h). */

#include "lib.h"
#include "hex-binary.h"
#include "write-full.h"
#include "cas-durable.h"
#include "cas-keyfile.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

static const char *cas_keyfile_dir_of(const char *path)
{
	return cas_durable_dir_of(path);
}

int cas_keyfile_fsync_dir(const char *path, const char **error_r)
{
	return cas_durable_fsync_parent(NULL, path, error_r);
}

int cas_keyfile_write_atomic_io(const struct cas_io *io, const char *path,
				const void *data, size_t size,
				const struct stat *st, bool replace,
				const char **error_r)
{
	/* "<path>.<16 hex>.tmp": cas_keyfile_remove_stale_tmp() finds
	   what a killed process left */
	const struct cas_durable_write_settings set = {
		.io = io,
		.mode = 0600,
		.like = st,
		.no_replace = !replace,
	};

	return cas_durable_write_atomic(path, data, size, &set, error_r);
}

int cas_keyfile_write_atomic(const char *path, const void *data,
			     size_t size, const struct stat *st,
			     bool replace, const char **error_r)
{
	return cas_keyfile_write_atomic_io(NULL, path, data, size, st,
					   replace, error_r);
}

static int cas_keyfile_zero_fd(int fd, off_t size, const char *path,
			       const char **error_r)
{
	static const unsigned char zeros[256];
	off_t pos;

	for (pos = 0; pos < size; pos += sizeof(zeros)) {
		if (pwrite_full(fd, zeros, I_MIN(sizeof(zeros),
				(size_t)(size - pos)), pos) < 0) {
			*error_r = t_strdup_printf("write(%s) failed: %m",
						   path);
			return -1;
		}
	}
	if (fsync(fd) < 0) {
		*error_r = t_strdup_printf("fsync(%s) failed: %m", path);
		return -1;
	}
	return 0;
}

int cas_keyfile_shred_unlinked(int fd, const char *path,
			       const char **error_r)
{
	struct stat st;

	if (fstat(fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", path);
		return -1;
	}
	if (st.st_nlink != 0)
		return 0;
	return cas_keyfile_zero_fd(fd, st.st_size, path, error_r) < 0 ? -1 : 1;
}

/* name is "<base>.<16 hex>.tmp"? */
static bool cas_keyfile_is_tmp_of(const char *name, const char *base)
{
	size_t len = strlen(base);
	unsigned int i;

	if (strncmp(name, base, len) != 0 || name[len] != '.')
		return FALSE;
	name += len + 1;
	for (i = 0; i < 16; i++) {
		if (!((name[i] >= '0' && name[i] <= '9') ||
		      (name[i] >= 'a' && name[i] <= 'f')))
			return FALSE;
	}
	return strcmp(name + 16, ".tmp") == 0;
}

int cas_keyfile_remove_stale_tmp(const char *path, unsigned int *removed_r,
				 const char **error_r)
{
	const char *dir = cas_keyfile_dir_of(path), *base, *tmp, *p;
	struct dirent *d;
	struct stat st;
	DIR *dirp;
	int fd, ret = 0;

	*removed_r = 0;
	p = strrchr(path, '/');
	base = p == NULL ? path : p + 1;
	dirp = opendir(dir);
	if (dirp == NULL) {
		*error_r = t_strdup_printf("opendir(%s) failed: %m", dir);
		return -1;
	}
	while (ret == 0 && (d = readdir(dirp)) != NULL) {
		if (!cas_keyfile_is_tmp_of(d->d_name, base))
			continue;
		tmp = t_strdup_printf("%s/%s", dir, d->d_name);
		fd = open(tmp, O_WRONLY | O_NOFOLLOW | O_NONBLOCK |
			  O_CLOEXEC);
		if (fd == -1) {
			if (errno == ENOENT)
				continue;
			*error_r = t_strdup_printf("open(%s) failed: %m", tmp);
			ret = -1;
		} else {
			if (fstat(fd, &st) < 0) {
				*error_r = t_strdup_printf(
					"fstat(%s) failed: %m", tmp);
				ret = -1;
			} else if (!S_ISREG(st.st_mode)) {
				*error_r = t_strdup_printf(
					"%s is not a regular file", tmp);
				ret = -1;
			} else {
				ret = cas_keyfile_zero_fd(fd, st.st_size,
							  tmp, error_r);
			}
			i_close_fd(&fd);
			if (ret == 0 && unlink(tmp) < 0 && errno != ENOENT) {
				*error_r = t_strdup_printf(
					"unlink(%s) failed: %m", tmp);
				ret = -1;
			} else if (ret == 0) {
				(*removed_r)++;
			}
		}
	}
	if (closedir(dirp) < 0 && ret == 0) {
		*error_r = t_strdup_printf("closedir(%s) failed: %m", dir);
		ret = -1;
	}
	if (ret == 0 && *removed_r > 0)
		ret = cas_keyfile_fsync_dir(path, error_r);
	return ret;
}

int cas_keyfile_check_mode(int fd, const char *path, const char **error_r)
{
	struct stat st;

	if (fstat(fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", path);
		return -1;
	}
	return cas_keyfile_check_mode_stat(&st, path, error_r);
}

int cas_keyfile_check_mode_stat(const struct stat *stp, const char *path,
				const char **error_r)
{
	const struct stat st = *stp;
	struct stat dst;
	const char *dir;
	uid_t euid;

	if ((st.st_mode & 0077) != 0) {
		*error_r = t_strdup_printf(
			"Key file %s has mode %04o: it must not be "
			"accessible by group or others (the key may have "
			"leaked; check, then chmod 0600 %s)",
			path, (unsigned int)(st.st_mode & 07777), path);
		return -1;
	}
	/* whoever owns the file or may write its directory can replace
	   the key with one of their own (and read what is sealed to it) */
	euid = geteuid();
	if (euid != 0 && st.st_uid != euid && st.st_uid != 0) {
		*error_r = t_strdup_printf(
			"Key file %s is owned by uid %u, not by the mail user "
			"(uid %u) or root: that user could replace the key "
			"(check, then chown it to the mail user)", path,
			(unsigned int)st.st_uid, (unsigned int)euid);
		return -1;
	}
	dir = cas_durable_dir_of(path);
	if (stat(dir, &dst) < 0) {
		*error_r = t_strdup_printf("stat(%s) failed: %m", dir);
		return -1;
	}
	if ((dst.st_mode & 0022) != 0 && (dst.st_mode & S_ISVTX) == 0) {
		*error_r = t_strdup_printf(
			"Key file directory %s has mode %04o: group or others "
			"may write it and replace the key file %s (check, "
			"then chmod go-w %s)", dir,
			(unsigned int)(dst.st_mode & 07777), path, dir);
		return -1;
	}
	if (euid != 0 && dst.st_uid != euid && dst.st_uid != 0) {
		*error_r = t_strdup_printf(
			"Key file directory %s is owned by uid %u, not by the "
			"mail user (uid %u) or root: that user could replace "
			"the key file %s (check, then chown the directory)",
			dir, (unsigned int)dst.st_uid, (unsigned int)euid,
			path);
		return -1;
	}
	return 0;
}
