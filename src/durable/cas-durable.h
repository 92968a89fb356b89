#ifndef CAS_DURABLE_H
#define CAS_DURABLE_H

#include "buffer.h"
#include "cas-io.h"

/* cas-durable: the one way casbox and casidx put a file on disk so that
   a crash leaves either the old or the new content, never half of it,
   and an acknowledged write survives a power loss. Every operation goes
   through a struct cas_io table (NULL = cas_io_posix), so the crash
   simulator (tests/crashfs.c) can crash at any write or sync, drop what
   was not synced, tear a write or fill the disk. Error strings name the
   failing syscall and path ("fsync(%s) failed: %m"), never the data. */

struct cas_durable_write_settings {
	/* NULL: cas_io_posix */
	const struct cas_io *io;
	/* mode of the new file (0 = 0600) */
	mode_t mode;
	/* copy mode and owner from this file's stat (NULL: mode above) */
	const struct stat *like;
	/* link() the file into place: an existing path is never replaced
	   (EEXIST); default rename() over it */
	bool no_replace;
	/* skip the file and directory fsyncs (mail_fsync=never, casidx's
	   no_fsync): still atomic, no longer durable */
	bool no_fsync;
	/* fsync the file but not the directory: the caller fsyncs it
	   later, before anything names the file (casidx segments before
	   the manifest that lists them) */
	bool no_dir_fsync;
	/* the temporary name: "<path>.<16 hex>.tmp" by default, this
	   exact name if set (then created with O_EXCL, or O_TRUNC when
	   tmp_truncate is TRUE) */
	const char *tmp_path;
	bool tmp_truncate;
};

/* Write data as the new content of path: a temporary file next to it,
   written and fsynced, renamed (or linked) into place, then the
   directory fsynced. The temporary file is removed on every path.
   Returns 0 ok, -1 error. If only the final directory fsync fails, -1
   is returned with the new file in place (it may not survive a crash). */
int cas_durable_write_atomic(const char *path, const void *data,
			     size_t size,
			     const struct cas_durable_write_settings *set,
			     const char **error_r);

/* The same, streamed: create opens the temporary file, write appends to
   it, commit syncs and moves it into place (as above) and frees it,
   abort removes it. Both end the file (NULL afterwards). Returns 0 ok,
   -1 error; a failed commit removed the temporary file, and leaves
   errno as the failed call set it (EEXIST: no_replace and path exists). */
struct cas_durable_file;
int cas_durable_file_create(const char *path,
			    const struct cas_durable_write_settings *set,
			    struct cas_durable_file **file_r,
			    const char **error_r);
int cas_durable_file_write(struct cas_durable_file *file, const void *data,
			   size_t size, const char **error_r);
int cas_durable_file_commit(struct cas_durable_file **file,
			    const char **error_r);
void cas_durable_file_abort(struct cas_durable_file **file);

/* fsync the directory dir, making the creations, renames and unlinks in
   it durable. Returns 0 ok, -1 error. */
int cas_durable_fsync_dir(const struct cas_io *io, const char *dir,
			  const char **error_r);
/* fsync the directory that holds path. */
int cas_durable_fsync_parent(const struct cas_io *io, const char *path,
			     const char **error_r);
/* The directory part of path ("." when it has none). */
const char *cas_durable_dir_of(const char *path);

/* Append the whole content of path to buf. A file larger than max_size
   is refused as corrupt ((size_t)-1: no limit). Returns 1 read, 0 the
   file does not exist, -1 error. */
int cas_durable_read_file(const struct cas_io *io, const char *path,
			  size_t max_size, buffer_t *buf,
			  const char **error_r);

#endif
