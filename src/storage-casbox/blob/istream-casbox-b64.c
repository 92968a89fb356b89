/* casbox: base64 re-encoding of a leaf body stored decoded
   (casbox-b64.h). Positions map arithmetically: encoded offset e is in
   line e / (line_len + eol), whose bytes start at decoded offset
   line * line_len / 4 * 3, so seeks (partial FETCH) cost no decoding
   of what lies before. */

#include "lib.h"
#include "istream-private.h"
#include "byteorder.h"
#include "casbox-b64.h"

#include <sodium.h>

static const char b64_alphabet[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Two output characters per 12 input bits: half the lookups of one
   per 6 bits (the bulk of a FETCH of attachments stored decoded). An
   entry's two bytes in memory are the two characters. */
static uint16_t b64_pairs[4096];
static bool b64_pairs_ready = FALSE;

static void b64_pairs_init(void)
{
	unsigned int i;
	char pair[2];

	for (i = 0; i < N_ELEMENTS(b64_pairs); i++) {
		pair[0] = b64_alphabet[i >> 6];
		pair[1] = b64_alphabet[i & 63];
		memcpy(&b64_pairs[i], pair, 2);
	}
	b64_pairs_ready = TRUE;
}

/* 3 bytes to 4 characters (b64_pairs_init() done) */
static inline void b64_encode3(const unsigned char *in, unsigned char *out)
{
	uint32_t v = (uint32_t)in[0] << 16 | (uint32_t)in[1] << 8 | in[2];

	memcpy(out, &b64_pairs[v >> 12], 2);
	memcpy(out + 2, &b64_pairs[v & 0xfff], 2);
}

/* The 48 bits of in[0..5] to 8 characters with one 8-byte store; in
   has 8 readable bytes (one load). */
static inline void b64_encode6(const unsigned char *in, unsigned char *out)
{
	uint64_t v = be64_to_cpu_unaligned(in) >> 16;
	uint64_t p0 = b64_pairs[v >> 36], p1 = b64_pairs[(v >> 24) & 0xfff];
	uint64_t p2 = b64_pairs[(v >> 12) & 0xfff], p3 = b64_pairs[v & 0xfff];
	uint64_t o;

#ifdef WORDS_BIGENDIAN
	o = p0 << 48 | p1 << 32 | p2 << 16 | p3;
#else
	o = p0 | p1 << 16 | p2 << 32 | p3 << 48;
#endif
	memcpy(out, &o, 8);
}

/* One line of per_line bytes (a multiple of 3) from in, which has
   `readable` bytes, to out. Returns the end of the output. */
static inline unsigned char *
b64_encode_line(const unsigned char *in, size_t per_line, size_t readable,
		unsigned char *out)
{
	size_t n6 = per_line / 6, done;

	/* 8-byte loads only while they stay inside what is readable */
	if (readable < n6 * 6 + 2)
		n6 = readable < 8 ? 0 : (readable - 2) / 6;
	for (done = 0; done < n6; done++) {
		b64_encode6(in, out);
		in += 6;
		out += 8;
	}
	for (done = n6 * 6; done < per_line; done += 3) {
		b64_encode3(in, out);
		in += 3;
		out += 4;
	}
	return out;
}

struct casbox_b64_istream {
	struct istream_private istream;
	struct casbox_b64_form form;
	uoff_t decoded_size, encoded_size;
};

static void b64_group(const unsigned char *in, size_t n, unsigned char out[4])
{
	uint32_t v = (uint32_t)in[0] << 16;

	if (n > 1)
		v |= (uint32_t)in[1] << 8;
	if (n > 2)
		v |= in[2];
	out[0] = b64_alphabet[(v >> 18) & 63];
	out[1] = b64_alphabet[(v >> 12) & 63];
	out[2] = n > 1 ? b64_alphabet[(v >> 6) & 63] : '=';
	out[3] = n > 2 ? b64_alphabet[v & 63] : '=';
}

/* Whole lines from the start of line `line`, as many as the parent has
   buffered and room holds (the bulk of a sequential read: one parent
   read per buffer instead of one per line). Returns bytes produced, 0
   if not even one whole line is buffered or fits (the caller then goes
   group by group). */
static size_t
b64_produce_lines(struct casbox_b64_istream *bstream, uoff_t line,
		  unsigned char *dest, size_t room)
{
	struct istream *parent = bstream->istream.parent;
	const struct casbox_b64_form *form = &bstream->form;
	size_t eol_len = form->crlf ? 2 : 1, ll = form->line_len + eol_len;
	size_t per_line = form->line_len / 4 * 3, size, lines, i;
	uoff_t dstart = line * per_line;
	const unsigned char *data, *in;
	unsigned char *out = dest;

	i_assert(per_line % 3 == 0);
	if (room < ll || bstream->decoded_size - dstart < per_line)
		return 0;
	if (parent->v_offset != dstart)
		i_stream_seek(parent, dstart);
	data = i_stream_get_data(parent, &size);
	if (size < per_line &&
	    i_stream_read_bytes(parent, &data, &size, per_line) <= 0) {
		/* an error or a short body: the group path reports it */
		return 0;
	}
	/* only full lines: the last, shorter one goes the other way */
	size = I_MIN(size, bstream->decoded_size - dstart);
	lines = I_MIN(size / per_line, room / ll);
	for (i = 0; i < lines; i++) {
		in = data + i * per_line;
		out = b64_encode_line(in, per_line, size - i * per_line, out);
		if (form->crlf)
			*out++ = '\r';
		*out++ = '\n';
	}
	i_stream_skip(parent, lines * per_line);
	bstream->istream.parent_expected_offset = parent->v_offset;
	return out - dest;
}

/* Produce bytes at encoded offset e into dest (room bytes, > 0).
   Returns bytes produced (> 0), or -1 with the stream error set. */
static ssize_t
b64_produce(struct casbox_b64_istream *bstream, uoff_t e,
	    unsigned char *dest, size_t room)
{
	struct istream_private *stream = &bstream->istream;
	struct istream *parent = stream->parent;
	const struct casbox_b64_form *form = &bstream->form;
	const char *eol = form->crlf ? "\r\n" : "\n";
	uoff_t eol_len = form->crlf ? 2 : 1, ll = form->line_len + eol_len;
	uoff_t per_line = form->line_len / 4 * 3;
	uoff_t line = e / ll, col = e % ll, dstart, dlen, doff, dend;
	unsigned char group[4];
	const unsigned char *data;
	size_t size, need, n, g, skip, done = 0;
	uoff_t line_chars;
	int ret;

	if (col == 0 && (done = b64_produce_lines(bstream, line, dest,
						   room)) > 0)
		return done;
	dstart = line * per_line;
	dlen = I_MIN(per_line, bstream->decoded_size - dstart);
	line_chars = (dlen + 2) / 3 * 4;
	if (col >= line_chars) {
		/* in the line end */
		n = I_MIN(room, eol_len - (col - line_chars));
		memcpy(dest, eol + (col - line_chars), n);
		return n;
	}
	dend = dstart + dlen;
	doff = dstart + col / 4 * 3;
	skip = col % 4;
	/* sequential reads need no seek (a seek of a decoder stream
	   parent may restart it) */
	if (parent->v_offset != doff)
		i_stream_seek(parent, doff);
	need = I_MIN(3, dend - doff);
	ret = i_stream_read_bytes(parent, &data, &size, need);
	if (ret <= 0) {
		i_assert(ret == -1);
		if (parent->stream_errno != 0) {
			stream->istream.stream_errno = parent->stream_errno;
			io_stream_set_error(&stream->iostream, "%s",
					    i_stream_get_error(parent));
		} else {
			stream->istream.stream_errno = EPIPE;
			io_stream_set_error(&stream->iostream,
				"decoded body ends at %"PRIuUOFF_T", the "
				"record says %"PRIuUOFF_T" bytes",
				parent->v_offset + size,
				bstream->decoded_size);
		}
		return -1;
	}
	size = I_MIN(size, dend - doff);
	if (skip > 0 || room < 4 || size < 3) {
		/* one group, maybe partly */
		n = I_MIN(size, 3);
		b64_group(data, n, group);
		n = I_MIN(room, 4 - skip);
		memcpy(dest, group + skip, n);
		if (skip + n == 4)
			i_stream_skip(parent, I_MIN(size, 3));
		stream->parent_expected_offset = parent->v_offset;
		return n;
	}
	/* whole groups */
	g = I_MIN(size / 3, room / 4);
	for (n = 0; n < g; n++) {
		b64_encode3(data + n * 3, dest + done);
		done += 4;
	}
	i_stream_skip(parent, g * 3);
	stream->parent_expected_offset = parent->v_offset;
	return done;
}

static ssize_t i_stream_casbox_b64_read(struct istream_private *stream)
{
	struct casbox_b64_istream *bstream =
		container_of(stream, struct casbox_b64_istream, istream);
	uoff_t e;
	size_t avail, total = 0;
	ssize_t ret;

	e = stream->istream.v_offset + (stream->pos - stream->skip);
	if (e >= bstream->encoded_size) {
		stream->istream.eof = TRUE;
		return -1;
	}
	if (!i_stream_try_alloc(stream, 4, &avail))
		return -2;
	while (avail > 0 && e < bstream->encoded_size) {
		ret = b64_produce(bstream, e,
				  stream->w_buffer + stream->pos,
				  I_MIN(avail, bstream->encoded_size - e));
		if (ret < 0) {
			if (total > 0)
				break;
			return -1;
		}
		stream->pos += ret;
		avail -= ret;
		total += ret;
		e += ret;
	}
	return total;
}

static void i_stream_casbox_b64_seek(struct istream_private *stream,
				     uoff_t v_offset, bool mark ATTR_UNUSED)
{
	stream->istream.v_offset = v_offset;
	stream->skip = stream->pos = 0;
}

static int i_stream_casbox_b64_stat(struct istream_private *stream,
				    bool exact ATTR_UNUSED)
{
	struct casbox_b64_istream *bstream =
		container_of(stream, struct casbox_b64_istream, istream);
	const struct stat *st;

	if (i_stream_stat(stream->parent, exact, &st) < 0) {
		stream->istream.stream_errno = stream->parent->stream_errno;
		return -1;
	}
	stream->statbuf = *st;
	stream->statbuf.st_size = bstream->encoded_size;
	return 0;
}

static int i_stream_casbox_b64_get_size(struct istream_private *stream,
					bool exact ATTR_UNUSED,
					uoff_t *size_r)
{
	struct casbox_b64_istream *bstream =
		container_of(stream, struct casbox_b64_istream, istream);

	*size_r = bstream->encoded_size;
	return 1;
}

static void i_stream_casbox_b64_destroy(struct iostream_private *stream)
{
	struct casbox_b64_istream *bstream =
		container_of(stream, struct casbox_b64_istream,
			     istream.iostream);

	/* the buffer held message text */
	if (bstream->istream.w_buffer != NULL) {
		sodium_memzero(bstream->istream.w_buffer,
			       bstream->istream.buffer_size);
	}
	i_stream_free_buffer(&bstream->istream);
	i_stream_unref(&bstream->istream.parent);
}

struct istream *
i_stream_create_casbox_b64_encoder(struct istream *input,
				   const struct casbox_b64_form *form,
				   uoff_t decoded_size)
{
	struct casbox_b64_istream *bstream;

	i_assert(casbox_b64_form_valid(form));
	if (!b64_pairs_ready)
		b64_pairs_init();
	bstream = i_new(struct casbox_b64_istream, 1);
	bstream->form = *form;
	bstream->decoded_size = decoded_size;
	bstream->encoded_size = casbox_b64_encoded_size(form, decoded_size);
	bstream->istream.max_buffer_size = i_stream_get_max_buffer_size(input);
	bstream->istream.iostream.destroy = i_stream_casbox_b64_destroy;
	bstream->istream.read = i_stream_casbox_b64_read;
	bstream->istream.seek = i_stream_casbox_b64_seek;
	bstream->istream.stat = i_stream_casbox_b64_stat;
	bstream->istream.get_size = i_stream_casbox_b64_get_size;
	bstream->istream.istream.readable_fd = FALSE;
	bstream->istream.istream.blocking = input->blocking;
	bstream->istream.istream.seekable = input->seekable;
	return i_stream_create(&bstream->istream, input, -1, 0);
}

/* ---- decoder ---- */

/* 0..63 the value of an alphabet character, B64_SKIP a line end
   character, B64_PAD '=', B64_BAD anything else */
#define B64_SKIP 64
#define B64_PAD 65
#define B64_BAD 66

struct casbox_b64_decoder_istream {
	struct istream_private istream;
	/* the characters of the group being read (nchars of them) */
	uint32_t acc;
	unsigned int nchars;
	/* '=' characters still expected (1 after "xx="), and whether the
	   padded last group was read (only line ends may follow) */
	unsigned int pad_left;
	bool ended;
};

static unsigned char b64_values[256];

static void b64_values_init(void)
{
	unsigned int i;

	if (b64_values['='] == B64_PAD)
		return;
	memset(b64_values, B64_BAD, sizeof(b64_values));
	for (i = 0; i < 64; i++)
		b64_values[(unsigned char)b64_alphabet[i]] = i;
	b64_values['\r'] = B64_SKIP;
	b64_values['\n'] = B64_SKIP;
	b64_values['='] = B64_PAD;
}

static void
b64_decoder_fail(struct casbox_b64_decoder_istream *dstream, uoff_t offset,
		 const char *why)
{
	dstream->istream.istream.stream_errno = EINVAL;
	io_stream_set_error(&dstream->istream.iostream,
			    "Invalid base64 at input offset %"PRIuUOFF_T": %s",
			    offset, why);
}

/* Decode what the parent has buffered into dest (room for all of it).
   Returns bytes produced, -1 on invalid input (stream error set). *used_r
   = input bytes consumed. */
static ssize_t
b64_decode_block(struct casbox_b64_decoder_istream *dstream,
		 const unsigned char *data, size_t size, unsigned char *dest,
		 size_t *used_r)
{
	unsigned char *out = dest;
	uint32_t acc = dstream->acc;
	unsigned int n = dstream->nchars;
	unsigned char v;
	size_t i;

	for (i = 0; i < size; i++) {
		v = b64_values[data[i]];
		if (v < 64 && !dstream->ended && dstream->pad_left == 0) {
			acc = acc << 6 | v;
			if (++n == 4) {
				out[0] = acc >> 16;
				out[1] = acc >> 8;
				out[2] = acc;
				out += 3;
				n = 0;
				acc = 0;
			}
		} else if (v == B64_SKIP) {
			continue;
		} else if (v == B64_PAD && !dstream->ended &&
			   (dstream->pad_left == 1 || n == 2 || n == 3)) {
			if (dstream->pad_left == 1) {
				dstream->pad_left = 0;
				dstream->ended = TRUE;
			} else if (n == 3) {
				/* xxx= */
				out[0] = acc >> 10;
				out[1] = acc >> 2;
				out += 2;
				dstream->ended = TRUE;
			} else {
				/* xx== */
				out[0] = acc >> 4;
				out += 1;
				dstream->pad_left = 1;
			}
			n = 0;
			acc = 0;
		} else {
			dstream->acc = acc;
			dstream->nchars = n;
			*used_r = i;
			b64_decoder_fail(dstream,
				dstream->istream.parent->v_offset + i,
				dstream->ended || dstream->pad_left > 0 ?
				"data after the padding" :
				"not a base64 character");
			return -1;
		}
	}
	dstream->acc = acc;
	dstream->nchars = n;
	*used_r = size;
	return out - dest;
}

static ssize_t i_stream_casbox_b64_decoder_read(struct istream_private *stream)
{
	struct casbox_b64_decoder_istream *dstream =
		container_of(stream, struct casbox_b64_decoder_istream,
			     istream);
	const unsigned char *data;
	size_t size, avail, used;
	ssize_t ret, produced;

	for (;;) {
		data = i_stream_get_data(stream->parent, &size);
		if (size == 0) {
			ret = i_stream_read_memarea(stream->parent);
			if (ret == 0)
				return 0;
			if (ret == -1) {
				if (stream->parent->stream_errno != 0) {
					stream->istream.stream_errno =
						stream->parent->stream_errno;
					io_stream_set_error(&stream->iostream,
						"%s", i_stream_get_error(
							stream->parent));
					return -1;
				}
				if (dstream->nchars != 0 ||
				    dstream->pad_left != 0) {
					b64_decoder_fail(dstream,
						stream->parent->v_offset,
						"the last group is cut short");
					return -1;
				}
				stream->istream.eof = TRUE;
				return -1;
			}
			continue;
		}
		/* 4 characters give at most 3 bytes */
		if (!i_stream_try_alloc(stream, size / 4 * 3 + 3, &avail))
			return -2;
		if (avail < size / 4 * 3 + 3) {
			/* decode only what surely fits */
			size = avail < 3 ? 0 : (avail - 3) / 3 * 4;
			if (size == 0)
				return -2;
		}
		produced = b64_decode_block(dstream, data, size,
					    stream->w_buffer + stream->pos,
					    &used);
		i_stream_skip(stream->parent, used);
		if (produced < 0)
			return -1;
		stream->pos += produced;
		if (produced > 0)
			return produced;
		/* only line ends or padding: read on */
	}
}

static void
i_stream_casbox_b64_decoder_seek(struct istream_private *stream,
				 uoff_t v_offset, bool mark)
{
	struct casbox_b64_decoder_istream *dstream =
		container_of(stream, struct casbox_b64_decoder_istream,
			     istream);

	if (v_offset < stream->istream.v_offset) {
		/* back: decode again from the start */
		stream->parent_expected_offset = stream->parent_start_offset;
		stream->skip = stream->pos = 0;
		stream->istream.v_offset = 0;
		i_stream_seek(stream->parent, 0);
		dstream->acc = 0;
		dstream->nchars = 0;
		dstream->pad_left = 0;
		dstream->ended = FALSE;
	}
	i_stream_default_seek_nonseekable(stream, v_offset, mark);
}

static void i_stream_casbox_b64_decoder_destroy(struct iostream_private *stream)
{
	struct casbox_b64_decoder_istream *dstream =
		container_of(stream, struct casbox_b64_decoder_istream,
			     istream.iostream);

	/* the buffer held message text */
	if (dstream->istream.w_buffer != NULL) {
		sodium_memzero(dstream->istream.w_buffer,
			       dstream->istream.buffer_size);
	}
	i_stream_free_buffer(&dstream->istream);
	i_stream_unref(&dstream->istream.parent);
}

struct istream *i_stream_create_casbox_b64_decoder(struct istream *input)
{
	struct casbox_b64_decoder_istream *dstream;

	b64_values_init();
	dstream = i_new(struct casbox_b64_decoder_istream, 1);
	dstream->istream.max_buffer_size = i_stream_get_max_buffer_size(input);
	dstream->istream.iostream.destroy = i_stream_casbox_b64_decoder_destroy;
	dstream->istream.read = i_stream_casbox_b64_decoder_read;
	dstream->istream.seek = i_stream_casbox_b64_decoder_seek;
	dstream->istream.istream.readable_fd = FALSE;
	dstream->istream.istream.blocking = input->blocking;
	dstream->istream.istream.seekable = input->seekable;
	return i_stream_create(&dstream->istream, input,
			       i_stream_get_fd(input), 0);
}
