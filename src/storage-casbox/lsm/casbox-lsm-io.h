#ifndef CASBOX_LSM_IO_H
#define CASBOX_LSM_IO_H

#include <sys/stat.h>

/* Every file operation of casbox-lsm goes through this table, so tests
   can crash at the Nth write or fsync, drop unsynced data, tear writes
   or fill the disk (tests/crashfs.c). All functions behave like their
   POSIX namesakes: -1 with errno set on failure. pwrite() may write
   less than asked only on error (the caller treats a short write as a
   failure). fsync() is called for data that must survive a crash;
   fsync_dir() makes creations, renames and unlinks in a directory
   durable. */
struct casbox_lsm_io {
	int (*open)(const char *path, int flags, mode_t mode);
	int (*close)(int fd);
	ssize_t (*pread)(int fd, void *buf, size_t size, off_t offset);
	ssize_t (*pwrite)(int fd, const void *buf, size_t size,
			  off_t offset);
	int (*fsync)(int fd);
	int (*ftruncate)(int fd, off_t size);
	int (*fstat)(int fd, struct stat *st_r);
	int (*stat)(const char *path, struct stat *st_r);
	int (*rename)(const char *from, const char *to);
	int (*unlink)(const char *path);
	int (*mkdir)(const char *path, mode_t mode);
	int (*fsync_dir)(const char *path);
};

/* The real thing (fdatasync for fsync, open+fsync for directories). */
extern const struct casbox_lsm_io casbox_lsm_io_posix;

#endif
