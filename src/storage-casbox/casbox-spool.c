/* casbox-spool: a save's message, held until commit (casbox-spool.h).
   Bytes [0, mem->used) are in memory, bytes [mem->used, size) in the
   unlinked file at file offset (v_offset - mem->used), XORed with the
   XChaCha20 keystream at that file offset. The keystream is addressed
   in 64-byte blocks (crypto_stream_xchacha20_xor_ic()), so a reader can
   decrypt from any offset: the store reads each MIME part as a range. */

#include "lib.h"
#include "buffer.h"
#include "str.h"
#include "safe-mkstemp.h"
#include "write-full.h"
#include "istream-private.h"
#include "ostream-private.h"
#include "casbox-spool.h"

#include <sodium.h>
#include <unistd.h>

#define SPOOL_BLOCK 64
/* encrypt this much at a time on its way to the file */
#define SPOOL_WRITE_CHUNK (64 * 1024)

struct casbox_spool {
	int refcount;
	char *temp_prefix;
	/* the file's name when it was made, for errors: it is unlinked */
	char *path;
	buffer_t *mem;
	size_t mem_max;
	int fd;
	uoff_t size;
	/* sodium_malloc()ed (locked, wiped on free) with the file */
	unsigned char *key;
	unsigned char nonce[crypto_stream_xchacha20_NONCEBYTES];
};

struct casbox_spool_ostream {
	struct ostream_private ostream;
	struct casbox_spool *spool;
};

struct casbox_spool_istream {
	struct istream_private istream;
	struct casbox_spool *spool;
};

static void spool_unref(struct casbox_spool **_spool)
{
	struct casbox_spool *spool = *_spool;

	*_spool = NULL;
	i_assert(spool->refcount > 0);
	if (--spool->refcount > 0)
		return;
	i_close_fd(&spool->fd);
	if (spool->key != NULL)
		sodium_free(spool->key);
	/* what stayed in memory is the message's plaintext */
	sodium_memzero(buffer_get_modifiable_data(spool->mem, NULL),
		       spool->mem->used);
	buffer_free(&spool->mem);
	i_free(spool->temp_prefix);
	i_free(spool->path);
	i_free(spool);
}

/* XOR size bytes with the keystream from file offset pos on (the same
   call encrypts and decrypts; in and out may be the same). */
static void spool_xor(const struct casbox_spool *spool, uoff_t pos,
		      const unsigned char *in, unsigned char *out, size_t size)
{
	unsigned char block[SPOOL_BLOCK];
	size_t skip, n;

	while (size > 0) {
		skip = pos % SPOOL_BLOCK;
		if (skip != 0 || size < SPOOL_BLOCK) {
			/* part of one block: its keystream from the start */
			n = I_MIN(SPOOL_BLOCK - skip, size);
			memset(block, 0, sizeof(block));
			memcpy(block + skip, in, n);
			crypto_stream_xchacha20_xor_ic(block, block,
				sizeof(block), spool->nonce, pos / SPOOL_BLOCK,
				spool->key);
			memcpy(out, block + skip, n);
		} else {
			n = size - size % SPOOL_BLOCK;
			crypto_stream_xchacha20_xor_ic(out, in, n,
				spool->nonce, pos / SPOOL_BLOCK, spool->key);
		}
		pos += n;
		in += n;
		out += n;
		size -= n;
	}
	sodium_memzero(block, sizeof(block));
}

static int spool_open_file(struct casbox_spool *spool, const char **error_r)
{
	string_t *path = t_str_new(128);

	str_append(path, spool->temp_prefix);
	spool->fd = safe_mkstemp_hostpid(path, 0600, (uid_t)-1, (gid_t)-1);
	if (spool->fd == -1) {
		int saved_errno = errno;

		*error_r = t_strdup_printf("safe_mkstemp(%s) failed: %m",
					   str_c(path));
		errno = saved_errno;
		return -1;
	}
	/* nobody else needs its name, and a crash must not leave it */
	i_unlink(str_c(path));
	spool->path = i_strdup(str_c(path));
	/* made only now: sodium_malloc() costs an mmap, mprotects and an
	   mlock, and most messages never leave memory */
	spool->key = sodium_malloc(crypto_stream_xchacha20_KEYBYTES);
	if (spool->key == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "sodium_malloc() failed: %m");
	crypto_stream_xchacha20_keygen(spool->key);
	randombytes_buf(spool->nonce, sizeof(spool->nonce));
	return 0;
}

static int spool_write_file(struct casbox_spool *spool,
			    const unsigned char *data, size_t size,
			    const char **error_r)
{
	unsigned char *chunk;
	uoff_t pos = spool->size - spool->mem->used;
	size_t n;
	int ret = 0, saved_errno;

	chunk = i_malloc(I_MIN(size, SPOOL_WRITE_CHUNK));
	while (size > 0) {
		n = I_MIN(size, SPOOL_WRITE_CHUNK);
		spool_xor(spool, pos, data, chunk, n);
		if (pwrite_full(spool->fd, chunk, n, pos) < 0) {
			*error_r = t_strdup_printf("write(%s) failed: %m",
						   spool->path);
			ret = -1;
			break;
		}
		pos += n;
		data += n;
		size -= n;
		spool->size += n;
	}
	/* the caller reports errno (ENOSPC: mailbox full) */
	saved_errno = errno;
	i_free(chunk);
	errno = saved_errno;
	return ret;
}

static ssize_t
o_stream_spool_sendv(struct ostream_private *stream,
		     const struct const_iovec *iov, unsigned int iov_count)
{
	struct casbox_spool_ostream *sstream =
		container_of(stream, struct casbox_spool_ostream, ostream);
	struct casbox_spool *spool = sstream->spool;
	const unsigned char *data;
	const char *error;
	size_t size, n, total = 0;
	unsigned int i;

	for (i = 0; i < iov_count; i++) {
		data = iov[i].iov_base;
		size = iov[i].iov_len;
		if (spool->fd == -1) {
			n = I_MIN(size, spool->mem_max - spool->mem->used);
			buffer_append(spool->mem, data, n);
			spool->size += n;
			data += n;
			size -= n;
			total += n;
			if (size == 0)
				continue;
			if (spool_open_file(spool, &error) < 0) {
				io_stream_set_error(&stream->iostream, "%s",
						    error);
				stream->ostream.stream_errno = errno;
				return -1;
			}
		}
		if (spool_write_file(spool, data, size, &error) < 0) {
			io_stream_set_error(&stream->iostream, "%s", error);
			stream->ostream.stream_errno = errno;
			return -1;
		}
		total += size;
	}
	stream->ostream.offset += total;
	return total;
}

static void o_stream_spool_destroy(struct iostream_private *stream)
{
	struct casbox_spool_ostream *sstream =
		container_of(stream, struct casbox_spool_ostream,
			     ostream.iostream);

	if (sstream->spool != NULL)
		spool_unref(&sstream->spool);
}

struct ostream *casbox_spool_create(const char *temp_prefix, size_t mem_max)
{
	struct casbox_spool_ostream *sstream;
	struct casbox_spool *spool;
	struct ostream *output;

	spool = i_new(struct casbox_spool, 1);
	spool->refcount = 1;
	spool->temp_prefix = i_strdup(temp_prefix);
	spool->mem_max = mem_max;
	spool->mem = buffer_create_dynamic(default_pool,
					   I_MIN(mem_max, 8192) + 1);
	spool->fd = -1;

	sstream = i_new(struct casbox_spool_ostream, 1);
	sstream->spool = spool;
	sstream->ostream.sendv = o_stream_spool_sendv;
	/* every write is taken whole or fails */
	sstream->ostream.ostream.blocking = TRUE;
	sstream->ostream.iostream.destroy = o_stream_spool_destroy;
	output = o_stream_create(&sstream->ostream, NULL, -1);
	o_stream_set_name(output, t_strdup_printf("(casbox spool %s*)",
						  temp_prefix));
	return output;
}

static ssize_t i_stream_spool_read(struct istream_private *stream)
{
	struct casbox_spool_istream *sstream =
		container_of(stream, struct casbox_spool_istream, istream);
	struct casbox_spool *spool = sstream->spool;
	uoff_t offset, file_off;
	size_t avail, n;
	ssize_t ret;

	offset = stream->istream.v_offset + (stream->pos - stream->skip);
	if (offset >= spool->size) {
		stream->istream.eof = TRUE;
		return -1;
	}
	if (!i_stream_try_alloc(stream, 1, &avail))
		return -2;
	if (offset < spool->mem->used) {
		n = I_MIN(avail, spool->mem->used - offset);
		memcpy(stream->w_buffer + stream->pos,
		       CONST_PTR_OFFSET(spool->mem->data, offset), n);
		stream->pos += n;
		return n;
	}
	file_off = offset - spool->mem->used;
	n = I_MIN(avail, spool->size - offset);
	ret = pread(spool->fd, stream->w_buffer + stream->pos, n, file_off);
	if (ret <= 0) {
		if (ret == 0)
			errno = EIO;
		io_stream_set_error(&stream->iostream,
			"pread(%s, %"PRIuUOFF_T") failed: %s", spool->path,
			file_off, ret == 0 ? "unexpected EOF" :
			strerror(errno));
		stream->istream.stream_errno = errno;
		return -1;
	}
	spool_xor(spool, file_off, stream->w_buffer + stream->pos,
		  stream->w_buffer + stream->pos, ret);
	stream->pos += ret;
	return ret;
}

static void i_stream_spool_seek(struct istream_private *stream,
				uoff_t v_offset, bool mark ATTR_UNUSED)
{
	stream->istream.v_offset = v_offset;
	stream->skip = stream->pos = 0;
}

static int i_stream_spool_stat(struct istream_private *stream,
			       bool exact ATTR_UNUSED)
{
	struct casbox_spool_istream *sstream =
		container_of(stream, struct casbox_spool_istream, istream);

	stream->statbuf.st_size = sstream->spool->size;
	return 0;
}

static int i_stream_spool_get_size(struct istream_private *stream,
				   bool exact ATTR_UNUSED, uoff_t *size_r)
{
	struct casbox_spool_istream *sstream =
		container_of(stream, struct casbox_spool_istream, istream);

	*size_r = sstream->spool->size;
	return 1;
}

static void i_stream_spool_destroy(struct iostream_private *stream)
{
	struct casbox_spool_istream *sstream =
		container_of(stream, struct casbox_spool_istream,
			     istream.iostream);

	/* the read buffer held plaintext too */
	if (sstream->istream.w_buffer != NULL) {
		sodium_memzero(sstream->istream.w_buffer,
			       sstream->istream.buffer_size);
	}
	i_stream_free_buffer(&sstream->istream);
	spool_unref(&sstream->spool);
}

static struct istream *spool_istream_create(struct casbox_spool *spool)
{
	struct casbox_spool_istream *sstream;
	struct istream *input;

	sstream = i_new(struct casbox_spool_istream, 1);
	sstream->spool = spool;
	spool->refcount++;

	sstream->istream.max_buffer_size = IO_BLOCK_SIZE;
	sstream->istream.iostream.destroy = i_stream_spool_destroy;
	sstream->istream.read = i_stream_spool_read;
	sstream->istream.seek = i_stream_spool_seek;
	sstream->istream.stat = i_stream_spool_stat;
	sstream->istream.get_size = i_stream_spool_get_size;
	sstream->istream.istream.readable_fd = FALSE;
	sstream->istream.istream.blocking = TRUE;
	sstream->istream.istream.seekable = TRUE;
	input = i_stream_create(&sstream->istream, NULL, -1, 0);
	i_stream_set_name(input, t_strdup_printf("(casbox spool %s*)",
						 spool->temp_prefix));
	return input;
}

struct istream *casbox_spool_finish(struct ostream **output)
{
	struct casbox_spool_ostream *ostream =
		container_of((*output)->real_stream,
			     struct casbox_spool_ostream, ostream);
	struct istream *input;

	input = spool_istream_create(ostream->spool);
	o_stream_destroy(output);
	return input;
}

void casbox_spool_reopen(struct istream **input)
{
	struct casbox_spool_istream *sstream =
		container_of((*input)->real_stream,
			     struct casbox_spool_istream, istream);
	struct istream *new_input;

	new_input = spool_istream_create(sstream->spool);
	i_stream_unref(input);
	*input = new_input;
}
