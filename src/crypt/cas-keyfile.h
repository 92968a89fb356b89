#ifndef CAS_KEYFILE_H
#define CAS_KEYFILE_H

#include <sys/stat.h>

/* cas-keyfile: how key files (CASKEY*, CASUKEY*) reach disk: the key
   file rules (mode 0600, never over an existing key at creation,
   shredding what a replacement unlinks) over cas-durable's atomic
   write. */

/* Write data as the new content of path without ever exposing half a
   file: a uniquely named temporary file next to path (O_EXCL), with
   st's mode and owner when st is not NULL (else mode 0600), written and
   fsynced, then moved into place, then the directory fsynced.
   replace=FALSE links it into place, so an existing file is never
   overwritten (creation); replace=TRUE renames it over path. The
   temporary file is removed on every path. Returns 0 ok, -1 error
   (error_r names the file; data is never part of it). If only the final
   directory fsync fails, -1 is returned with the new file in place (it
   may not survive a crash). */
int cas_keyfile_write_atomic(const char *path, const void *data,
			     size_t size, const struct stat *st,
			     bool replace, const char **error_r);
/* The same through an I/O table (NULL = POSIX), for the crash
   simulator. */
struct cas_io;
int cas_keyfile_write_atomic_io(const struct cas_io *io, const char *path,
				const void *data, size_t size,
				const struct stat *st, bool replace,
				const char **error_r);
/* fsync the directory that holds path. Returns 0 ok, -1 error. */
int cas_keyfile_fsync_dir(const char *path, const char **error_r);

/* Overwrite the file open as fd with zeros and sync it, if it has no
   name left (st_nlink 0: replaced by a rename, and no hard link keeps
   it as a copy): a replaced key file must not linger in freed blocks
   (crypto-shredding later). Best effort on storage that does not
   overwrite in place (copy-on-write, flash). Returns 1 shredded, 0 it
   still has a name (left alone), -1 error. */
int cas_keyfile_shred_unlinked(int fd, const char *path,
			       const char **error_r);
/* Shred and unlink temporary files cas_keyfile_write_atomic() left next
   to path when a process died between creating and renaming them. Call
   only while nothing else writes path (e.g. under the store's write
   lock). removed_r counts them. Returns 0 ok, -1 error. */
int cas_keyfile_remove_stale_tmp(const char *path, unsigned int *removed_r,
				 const char **error_r);

/* Refuse a key file that its group or others may read, write or
   execute (any of mode 077), as ssh does for private keys: such a file
   may already have leaked, and loading it silently would hide that.
   Refuse it too when someone else could replace it: a file not owned
   by this process's user or root, a directory that group or others may
   write (unless sticky) or that another user owns (a process running
   as root skips the owner checks). fd is the open file, path names it
   (and its directory). Returns 0 ok, -1 refused or stat failed
   (error_r names the file or directory, what is wrong and the fix). */
int cas_keyfile_check_mode(int fd, const char *path, const char **error_r);
/* The same with the open file's fstat() result (one system call less
   for a caller that has it). */
int cas_keyfile_check_mode_stat(const struct stat *st, const char *path,
				const char **error_r);

#endif
