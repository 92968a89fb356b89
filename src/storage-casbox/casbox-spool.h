#ifndef CASBOX_SPOOL_H
#define CASBOX_SPOOL_H

/* casbox-spool: where a save holds a message from save_begin until its
   transaction commits (the content addresses, and so the blobs, are
   known only once the whole message is in).

   The first mem_max bytes stay in memory. The rest goes to a temporary
   file (temp_prefix as for safe_mkstemp_hostpid(), i.e. Dovecot's
   mail_temp_dir), unlinked at once and XChaCha20-encrypted under a
   random key that lives only in this process, in locked memory wiped on
   free: no plaintext of a message reaches the disk, and a big message
   does not stay in memory whole. The cipher is a plain stream cipher,
   not an AEAD: the file lives only as long as the stream, unlinked and
   owned by the mail user, so the key only has to keep its bytes
   unreadable; the blobs made from it get their own AEAD. */

struct ostream;
struct istream;

/* A write-only spool. Write with o_stream_*; a failing write (e.g.
   ENOSPC in mail_temp_dir) sets the stream error as usual. */
struct ostream *casbox_spool_create(const char *temp_prefix, size_t mem_max);

/* Finish writing and return a blocking, seekable istream of all the bytes
   written (unrefs *output). Several readers may share it; the key and
   the file go when the last reference does. */
struct istream *casbox_spool_finish(struct ostream **output);

/* Replace *input (a casbox_spool_finish() stream) with a new reader of
   the same bytes at offset 0 and unref the old one, whose read buffer
   (up to IO_BLOCK_SIZE) goes with its last reference. A save holds a
   stream per message until commit: a MULTIAPPEND of hundreds of
   messages would otherwise keep a buffer for each. */
void casbox_spool_reopen(struct istream **input);

/* For tests: the file descriptor of the spool file, -1 while everything
   is in memory. */
int casbox_spool_get_fd(struct istream *input);

#endif
