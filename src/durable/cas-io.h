#ifndef CAS_IO_H
#define CAS_IO_H

#include <sys/stat.h>

/* Every durable file operation (the LSM, packs, dictionaries, key files,
   the quarantine, casidx's manifest and segments) goes through this
   table, so tests
   can crash at the Nth write or fsync, drop unsynced data, tear writes
   or fill the disk (tests/crashfs.c). All functions behave like their
   POSIX namesakes: -1 with errno set on failure. pwrite() may write
   less than asked only on error (the caller treats a short write as a
   failure). fsync() is called for data that must survive a crash;
   fsync_dir() makes creations, renames and unlinks in a directory
   durable. */
struct cas_io {
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
	/* link(2): creates to, never replacing an existing file */
	int (*link)(const char *from, const char *to);
	int (*unlink)(const char *path);
	int (*mkdir)(const char *path, mode_t mode);
	int (*fsync_dir)(const char *path);
};

/* The real thing (fdatasync for fsync, open+fsync for directories). A
   NULL table anywhere a struct cas_io is taken means this one. */
extern const struct cas_io cas_io_posix;

#endif
