/* Base64 leaf bodies stored decoded (src/storage-casbox/blob/casbox-b64.h,
   doc/casbox-storage.md "Part transforms"): every canonical form (line
   lengths 4..996, CRLF or LF, with or without the last line end, last
   line short or full, every padding) is recognised with the right form
   and decoded size, and the encoder gives back exactly the original
   bytes, from the start and after a seek to every offset; every odd form
   is refused (stored as is); the record tail carrying the transform
   round-trips and malformed tails are refused with a reason; the
   committed recovery-record fixtures (tests/fuzz/corpus/recovery-record)
   read, recovery-v1-b64 with its transform. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "base64.h"
#include "istream.h"
#include "casbox-b64.h"
#include "casbox-records.h"
#include "casbox-recovery.h"

#include <check.h>
#include "check-run.h"
#include <stdlib.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/mman.h>

static buffer_t *wrap(const unsigned char *data, size_t size,
		      unsigned int cols, bool crlf, bool final)
{
	buffer_t *enc = t_buffer_create(size * 2 + 16);
	buffer_t *out = t_buffer_create(size * 2 + 16);
	size_t i;

	base64_encode(data, size, enc);
	for (i = 0; i < enc->used; i += cols) {
		if (i > 0)
			buffer_append(out, crlf ? "\r\n" : "\n", crlf ? 2 : 1);
		buffer_append(out, CONST_PTR_OFFSET(enc->data, i),
			      I_MIN(cols, enc->used - i));
	}
	if (final)
		buffer_append(out, crlf ? "\r\n" : "\n", crlf ? 2 : 1);
	return out;
}

static int check(const buffer_t *body, struct casbox_b64_form *form_r,
		 uoff_t *dsize_r)
{
	struct istream *input;
	const char *error;
	int ret;

	input = i_stream_create_from_data(body->data, body->used);
	ret = casbox_b64_check(input, body->used, form_r, dsize_r, &error);
	ck_assert_int_ge(ret, 0);
	i_stream_unref(&input);
	return ret;
}

static buffer_t *read_all(struct istream *input, uoff_t from)
{
	buffer_t *out = t_buffer_create(1024);
	const unsigned char *data;
	size_t size;

	i_stream_seek(input, from);
	while (i_stream_read_more(input, &data, &size) > 0) {
		buffer_append(out, data, size);
		i_stream_skip(input, size);
	}
	ck_assert_int_eq(input->stream_errno, 0);
	return out;
}

/* A fixed-seed xorshift32 (Dovecot deprecates rand()): the same bytes
   every run. */
static uint32_t test_rand_state = 16;
static uint32_t test_rand(void)
{
	uint32_t x = test_rand_state;

	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	test_rand_state = x;
	return x;
}

START_TEST(test_canonical_forms)
{
	static const unsigned int cols[] = { 4, 8, 64, 72, 76, 996 };
	static const size_t sizes[] = { 1, 2, 3, 4, 5, 56, 57, 58, 114, 300,
					747, 20000 };
	unsigned char data[20000];
	struct casbox_b64_form form;
	struct istream *dec, *enc;
	buffer_t *body, *out;
	unsigned int c, s, f;
	uoff_t dsize, off, step;

	for (s = 0; s < sizeof(data); s++)
		data[s] = (unsigned char)(test_rand() & 0xff);
	for (c = 0; c < N_ELEMENTS(cols); c++)
	for (s = 0; s < N_ELEMENTS(sizes); s++)
	for (f = 0; f < 4; f++) T_BEGIN {
		body = wrap(data, sizes[s], cols[c], (f & 1) != 0,
			    (f & 2) != 0);
		ck_assert_msg(check(body, &form, &dsize) == 1,
			      "cols %u size %zu flags %u not recognised",
			      cols[c], sizes[s], f);
		ck_assert_uint_eq(dsize, sizes[s]);
		/* one line without a line end cannot tell its length from
		   a longer one: any length >= it gives the same bytes */
		if (body->used > cols[c] + 2)
			ck_assert_uint_eq(form.line_len, cols[c]);
		if (body->used > cols[c] + 2 || (f & 2) != 0)
			ck_assert_int_eq(form.crlf, (f & 1) != 0);
		ck_assert_int_eq(form.final_newline, (f & 2) != 0);
		ck_assert_uint_eq(casbox_b64_encoded_size(&form, dsize),
				  body->used);
		dec = i_stream_create_from_data(data, sizes[s]);
		enc = i_stream_create_casbox_b64_encoder(dec, &form, dsize);
		step = body->used > 2000 ? 997 : 1;
		for (off = 0; off < body->used; off += step) {
			out = read_all(enc, off);
			ck_assert_uint_eq(out->used, body->used - off);
			ck_assert_msg(memcmp(out->data,
					     CONST_PTR_OFFSET(body->data, off),
					     out->used) == 0,
				      "cols %u size %zu flags %u: differs "
				      "from offset %"PRIuUOFF_T, cols[c],
				      sizes[s], f, off);
		}
		i_stream_unref(&enc);
		i_stream_unref(&dec);
	} T_END;
}
END_TEST

/* The encoder over a parent that hands out a few bytes at a time (a
   file stream with a small buffer: fewer than a line, or a few lines),
   read through small and large buffers of its own: the whole-line path
   and the group path take turns and give the same bytes. */
START_TEST(test_chunked_parent)
{
	static const unsigned int cols[] = { 4, 76, 996 };
	static const size_t parent_bufs[] = { 5, 61, 4096 };
	static const size_t enc_bufs[] = { 4, 80, 10000 };
	char path[] = "/tmp/check-b64.XXXXXX";
	unsigned char data[30001];
	struct casbox_b64_form form;
	struct istream *dec, *enc;
	buffer_t *body, *out;
	unsigned int c, p, b, f;
	uoff_t dsize;
	int fd;

	for (b = 0; b < sizeof(data); b++)
		data[b] = (unsigned char)(test_rand() & 0xff);
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, data, sizeof(data)), sizeof(data));
	i_close_fd(&fd);
	for (c = 0; c < N_ELEMENTS(cols); c++)
	for (f = 0; f < 2; f++)
	for (p = 0; p < N_ELEMENTS(parent_bufs); p++)
	for (b = 0; b < N_ELEMENTS(enc_bufs); b++) T_BEGIN {
		body = wrap(data, sizeof(data), cols[c], f != 0, TRUE);
		ck_assert_int_eq(check(body, &form, &dsize), 1);
		dec = i_stream_create_file(path, parent_bufs[p]);
		enc = i_stream_create_casbox_b64_encoder(dec, &form, dsize);
		i_stream_set_max_buffer_size(enc, enc_bufs[b]);
		out = read_all(enc, 0);
		ck_assert_msg(out->used == body->used &&
			      memcmp(out->data, body->data, out->used) == 0,
			      "cols %u crlf %u parent buffer %zu own %zu",
			      cols[c], f, parent_bufs[p], enc_bufs[b]);
		out = read_all(enc, body->used / 3);
		ck_assert_uint_eq(out->used, body->used - body->used / 3);
		ck_assert(memcmp(out->data, CONST_PTR_OFFSET(body->data,
			body->used / 3), out->used) == 0);
		i_stream_unref(&enc);
		i_stream_unref(&dec);
	} T_END;
	i_unlink(path);
}
END_TEST

/* The encoder loads 8 bytes for 6 where they are readable: with the
   decoded bytes at the very end of a page followed by an inaccessible
   one, no size, line length or start offset reads past them (a fault
   would end the test), and the bytes are those of Dovecot's encoder. */
START_TEST(test_no_overread)
{
	static const unsigned int cols[] = { 4, 8, 12, 76, 996 };
	size_t page = sysconf(_SC_PAGESIZE), size;
	unsigned char *map, *data;
	struct casbox_b64_form form;
	struct istream *dec, *enc;
	buffer_t *body, *out;
	unsigned int c, f;
	uoff_t dsize, off;

	map = mmap(NULL, page * 2, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert(map != MAP_FAILED);
	ck_assert_int_eq(mprotect(map + page, page, PROT_NONE), 0);
	for (size = 1; size <= 300; size++)
	for (c = 0; c < N_ELEMENTS(cols); c++)
	for (f = 0; f < 2; f++) T_BEGIN {
		data = map + page - size;
		for (off = 0; off < size; off++)
			data[off] = (unsigned char)(test_rand() & 0xff);
		body = wrap(data, size, cols[c], f != 0, TRUE);
		ck_assert_int_eq(check(body, &form, &dsize), 1);
		dec = i_stream_create_from_data(data, size);
		enc = i_stream_create_casbox_b64_encoder(dec, &form, dsize);
		for (off = 0; off < body->used; off++) {
			out = read_all(enc, off);
			ck_assert_msg(out->used == body->used - off &&
				      memcmp(out->data, CONST_PTR_OFFSET(
					body->data, off), out->used) == 0,
				      "size %zu cols %u crlf %u offset %"
				      PRIuUOFF_T, size, cols[c], f, off);
		}
		i_stream_unref(&enc);
		i_stream_unref(&dec);
	} T_END;
	ck_assert_int_eq(munmap(map, page * 2), 0);
}
END_TEST

/* The decoder: random bytes of every length 0..200 (every padding),
   wrapped at 4/76 columns, LF/CRLF, read through parents of 1..4096
   bytes a read and small own buffers, give the bytes back, also after a
   seek back; invalid input fails the stream with EINVAL naming the
   offset: a character outside the alphabet, data after the padding, a
   group cut short, padding where it cannot be. */
static buffer_t *decode(const buffer_t *body, size_t parent_buf,
			size_t own_buf, int *errno_r, const char **error_r)
{
	struct istream *input, *chunked, *dec;
	buffer_t *out = t_buffer_create(body->used + 8);
	const unsigned char *data;
	size_t size;

	input = i_stream_create_from_data(body->data, body->used);
	/* a parent that gives parent_buf bytes at a time */
	chunked = i_stream_create_limit(input, (uoff_t)-1);
	i_stream_set_max_buffer_size(chunked, parent_buf);
	dec = i_stream_create_casbox_b64_decoder(chunked);
	i_stream_set_max_buffer_size(dec, own_buf);
	while (i_stream_read_more(dec, &data, &size) > 0) {
		buffer_append(out, data, size);
		i_stream_skip(dec, size);
	}
	*errno_r = dec->stream_errno;
	*error_r = t_strdup(i_stream_get_error(dec));
	if (dec->stream_errno == 0 && out->used > 3) {
		/* back to the middle: decoded again from the start */
		buffer_t *tail = t_buffer_create(out->used);

		i_stream_seek(dec, out->used / 2);
		while (i_stream_read_more(dec, &data, &size) > 0) {
			buffer_append(tail, data, size);
			i_stream_skip(dec, size);
		}
		ck_assert_int_eq(dec->stream_errno, 0);
		ck_assert_uint_eq(tail->used, out->used - out->used / 2);
		ck_assert(memcmp(tail->data, CONST_PTR_OFFSET(out->data,
			out->used / 2), tail->used) == 0);
	}
	i_stream_unref(&dec);
	i_stream_unref(&chunked);
	i_stream_unref(&input);
	return out;
}

START_TEST(test_decoder)
{
	static const size_t parent_bufs[] = { 1, 3, 7, 4096 };
	static const size_t own_bufs[] = { 8, 100, 65536 };
	static const struct {
		const char *body, *why;
	} bad[] = {
		{ "QUJD\ERFRg==", "not a base64 character" },
		{ "QUJD RERFRg==", "not a base64 character" },
		{ "QUJDREVGRw==QQ==", "data after the padding" },
		{ "QUI=QUI=", "data after the padding" },
		{ "QUJDRA", "the last group is cut short" },
		{ "QUJDR", "the last group is cut short" },
		{ "QUJD=", "not a base64 character" },
		{ "QUJDR===", "not a base64 character" },
		{ "QU=J", "data after the padding" },
	};
	unsigned char data[200];
	buffer_t *body, *out;
	const char *error;
	unsigned int len, p, o, i;
	int err;

	for (i = 0; i < sizeof(data); i++)
		data[i] = (unsigned char)(test_rand() & 0xff);
	for (len = 0; len <= sizeof(data); len++)
	for (p = 0; p < N_ELEMENTS(parent_bufs); p++)
	for (o = 0; o < N_ELEMENTS(own_bufs); o++) T_BEGIN {
		body = wrap(data, len, len % 2 == 0 ? 76 : 4, len % 3 == 0,
			    len % 5 != 0);
		out = decode(body, parent_bufs[p], own_bufs[o], &err, &error);
		ck_assert_msg(err == 0, "len %u: %s", len, error);
		ck_assert_msg(out->used == len &&
			      memcmp(out->data, data, len) == 0,
			      "len %u parent %zu own %zu: %zu bytes", len,
			      parent_bufs[p], own_bufs[o], out->used);
	} T_END;
	for (i = 0; i < N_ELEMENTS(bad); i++) T_BEGIN {
		body = t_buffer_create(32);
		buffer_append(body, bad[i].body, strlen(bad[i].body));
		(void)decode(body, 4096, 65536, &err, &error);
		ck_assert_msg(err == EINVAL, "%s: errno %d", bad[i].body, err);
		ck_assert_msg(strstr(error, bad[i].why) != NULL &&
			      strstr(error, "Invalid base64 at input offset")
			      != NULL, "%s: %s", bad[i].body, error);
	} T_END;
}
END_TEST

static void assert_refused(const char *what, const buffer_t *body)
{
	struct casbox_b64_form form;
	uoff_t dsize;

	ck_assert_msg(check(body, &form, &dsize) == 0, "%s accepted", what);
}

static void edit(buffer_t *body, size_t pos, const char *with, size_t del)
{
	buffer_t *tmp = t_buffer_create(body->used + 8);

	buffer_append(tmp, body->data, pos);
	buffer_append(tmp, with, strlen(with));
	buffer_append(tmp, CONST_PTR_OFFSET(body->data, pos + del),
		      body->used - pos - del);
	buffer_set_used_size(body, 0);
	buffer_append_buf(body, tmp, 0, SIZE_MAX);
}

START_TEST(test_odd_forms)
{
	unsigned char data[1000];
	buffer_t *body;
	unsigned int i;
	char *p;

	for (i = 0; i < sizeof(data); i++)
		data[i] = (unsigned char)(i * 7 + 3);
	/* 1000 bytes: 13 full 76-column lines, a short last one, "==" */
#define FRESH() body = wrap(data, sizeof(data), 76, TRUE, TRUE)
	FRESH();
	ck_assert_int_eq(((const char *)body->data)[body->used - 3], '=');
	FRESH(); edit(body, 76, " ", 0);
	assert_refused("trailing space", body);
	FRESH(); edit(body, 78 * 13 - 2, "", 1);
	assert_refused("CRLF/LF mix", body);
	FRESH(); edit(body, body->used - 3, "", 1);
	assert_refused("one '=' short", body);
	FRESH(); edit(body, body->used - 4, "", 2);
	assert_refused("no padding", body);
	FRESH();
	p = buffer_get_modifiable_data(body, NULL);
	/* the character before "==" has 4 unused low bits */
	p[body->used - 5] = p[body->used - 5] == 'A' ? 'B' :
		p[body->used - 5] == 'w' ? 'x' : p[body->used - 5] + 1;
	assert_refused("non-canonical trailing bits", body);
	FRESH(); p = buffer_get_modifiable_data(body, NULL); p[200] = '*';
	assert_refused("non-base64 character", body);
	FRESH(); edit(body, 78 * 3 + 72, "\r\n", 0);
	assert_refused("lines of unequal length", body);
	FRESH(); buffer_append(body, "\r\n", 2);
	assert_refused("blank last line", body);
	FRESH(); edit(body, 78 * 2 + 72, "QQ==", 4);
	assert_refused("padding inside", body);
	FRESH(); edit(body, 0, "\r\n", 0);
	assert_refused("leading line end", body);
	FRESH(); edit(body, 78 * 5, " ", 0);
	assert_refused("leading space", body);
	FRESH(); edit(body, 78 * 13 + 20, "\r\n", 0);
	assert_refused("last line split", body);
	body = wrap(data, sizeof(data), 1000, TRUE, TRUE);
	assert_refused("line longer than 996", body);
	body = wrap(data, sizeof(data), 6, TRUE, TRUE);
	assert_refused("line length not a multiple of 4", body);
	body = t_buffer_create(8);
	buffer_append(body, "====\r\n", 6);
	assert_refused("only padding", body);
}
END_TEST

START_TEST(test_record_tail)
{
	struct casbox_msg_record rec, rec2;
	struct casbox_msg_part *part;
	const struct casbox_msg_part *p2;
	buffer_t *out, *bad;
	const char *error;
	pool_t pool = pool_datastack_create();

	casbox_msg_record_init(pool, &rec);
	rec.guid = "g";
	part = array_append_space(&rec.parts);
	part->size = 100;
	part = array_append_space(&rec.parts);
	part->transform = CASBOX_PART_TRANSFORM_BASE64;
	part->b64.line_len = 76;
	part->b64.crlf = TRUE;
	part->b64.final_newline = FALSE;
	part->stored_size = 1000;
	part->size = casbox_b64_encoded_size(&part->b64, 1000);
	rec.physical_size = 100 + part->size;
	out = t_buffer_create(256);
	casbox_msg_record_export(&rec, out);
	ck_assert_int_eq(casbox_msg_record_import(out->data, out->used, pool,
						  &rec2, &error), 1);
	p2 = array_idx(&rec2.parts, 0);
	ck_assert_int_eq(p2->transform, CASBOX_PART_TRANSFORM_NONE);
	ck_assert_uint_eq(casbox_msg_part_blob_size(p2), 100);
	p2 = array_idx(&rec2.parts, 1);
	ck_assert_int_eq(p2->transform, CASBOX_PART_TRANSFORM_BASE64);
	ck_assert_uint_eq(p2->b64.line_len, 76);
	ck_assert(p2->b64.crlf && !p2->b64.final_newline);
	ck_assert_uint_eq(casbox_msg_part_blob_size(p2), 1000);

	/* the tail (20 bytes): u32 1, u32 index 1, u8 kind, u8 flags,
	   u16 line length, u64 decoded size */
	bad = t_buffer_create(out->used);
#define TAIL(off) (bad->used - 20 + (off))
#define MUTATE(off, val, reason) \
	buffer_set_used_size(bad, 0); buffer_append_buf(bad, out, 0, SIZE_MAX); \
	((unsigned char *)buffer_get_modifiable_data(bad, NULL))[TAIL(off)] = \
		(val); \
	ck_assert_int_eq(casbox_msg_record_import(bad->data, bad->used, \
						  pool, &rec2, &error), -1); \
	ck_assert_msg(strstr(error, reason) != NULL, "%s", error)
	MUTATE(7, 5, "out of order");
	MUTATE(8, 9, "unknown part transform");
	MUTATE(9, 0x81, "unknown transform flags");
	MUTATE(9, 3, "does not give the part size");
	MUTATE(11, 75, "does not give the part size");
	MUTATE(18, 0x02, "does not give the part size");
	MUTATE(3, 9, "more transforms than parts");
	/* truncated */
	buffer_set_used_size(bad, 0);
	buffer_append_buf(bad, out, 0, out->used - 3);
	ck_assert_int_eq(casbox_msg_record_import(bad->data, bad->used, pool,
						  &rec2, &error), -1);
	/* a record without transforms is byte for byte the old layout */
	part->transform = CASBOX_PART_TRANSFORM_NONE;
	part->size = 1000;
	rec.physical_size = 1100;
	buffer_set_used_size(bad, 0);
	casbox_msg_record_export(&rec, bad);
	ck_assert_uint_eq(bad->used, out->used - 20);
}
END_TEST

static buffer_t *read_fixture(const char *name)
{
	const char *path = t_strconcat(CASBOX_SRCDIR,
		"/tests/fuzz/corpus/recovery-record/", name, NULL);
	buffer_t *buf = t_buffer_create(1024);
	unsigned char tmp[4096];
	FILE *f = fopen(path, "rb");
	size_t n;

	ck_assert_msg(f != NULL, "%s", path);
	while ((n = fread(tmp, 1, sizeof(tmp), f)) > 0)
		buffer_append(buf, tmp, n);
	fclose(f);
	return buf;
}

/* committed recovery records (the fuzz seeds): the one from before
   transforms reads with none, the one with a decoded part reads it,
   the compressed one (version 3) holds the first */
START_TEST(test_fixtures)
{
	struct casbox_recovery_record rec;
	const struct casbox_msg_part *part;
	const struct casbox_recovery_blob *blob;
	const char *error;
	buffer_t *buf;
	pool_t pool = pool_datastack_create();

	buf = read_fixture("recovery-v1");
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
						       pool, &rec, &error), 1);
	array_foreach(&rec.msg.parts, part)
		ck_assert_int_eq(part->transform, CASBOX_PART_TRANSFORM_NONE);
	buf = read_fixture("recovery-v1-b64");
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
						       pool, &rec, &error), 1);
	ck_assert_uint_eq(array_count(&rec.msg.parts), 2);
	part = array_idx(&rec.msg.parts, 0);
	ck_assert_int_eq(part->transform, CASBOX_PART_TRANSFORM_NONE);
	part = array_idx(&rec.msg.parts, 1);
	ck_assert_int_eq(part->transform, CASBOX_PART_TRANSFORM_BASE64);
	ck_assert_uint_eq(part->b64.line_len, 76);
	ck_assert(!part->b64.crlf && part->b64.final_newline);
	ck_assert_uint_eq(part->stored_size, 300);
	ck_assert_uint_eq(part->size, 406);
	blob = array_idx(&rec.blobs, 1);
	ck_assert_uint_eq(blob->plain_size, 300);

	/* version 3 (compressed) holds the record of recovery-v1 */
	buf = read_fixture("recovery-v3");
	ck_assert_uint_eq(((const unsigned char *)buf->data)[0],
			  CASBOX_RECOVERY_VERSION_ZSTD);
	ck_assert_int_eq(casbox_recovery_record_import(buf->data, buf->used,
						       pool, &rec, &error), 1);
	buf = t_buffer_create(512);
	casbox_recovery_record_export_plain(&rec, buf);
	ck_assert(buffer_cmp(buf, read_fixture("recovery-v1")));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("b64");
	TCase *tc = tcase_create("core");
	int failed;

	lib_init();
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_canonical_forms);
	tcase_add_test(tc, test_chunked_parent);
	tcase_add_test(tc, test_no_overread);
	tcase_add_test(tc, test_decoder);
	tcase_add_test(tc, test_odd_forms);
	tcase_add_test(tc, test_record_tail);
	tcase_add_test(tc, test_fixtures);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
