/* casidx postings: segment round trip, index commit/refresh, expunge,
   merge, memory-bounded flushing, snapshot isolation, and corruption
   (every byte flip and every truncation of a segment is rejected). */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "str.h"
#include "unlink-directory.h"
#include "casidx-segment.h"
#include "casidx-termsig.h"
#include "casidx-index.h"
#include "casidx-crypt.h"
#include "cas-key.h"
#include "cas-crc32c.h"
#include "byteorder.h"

#include <check.h>
#include "check-run.h"
#include "check-fixture.h"
#include <stdlib.h>
#include <stdio.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <zstd.h>

static char *test_dir;

static void add_words(struct casidx_builder *b, enum casidx_field field,
		      const char *text)
{
	const char *const *w;

	for (w = t_strsplit_spaces(text, " "); *w != NULL; w++)
		casidx_builder_add_term(b, field, *w, strlen(*w));
}

/* Body words with position codes from *pos on, each but the first
   with the space flag. */
static void add_words_pos(struct casidx_builder *b, const char *text,
			  uint32_t *pos)
{
	const char *const *w;
	bool first = TRUE;

	for (w = t_strsplit_spaces(text, " "); *w != NULL; w++) {
		casidx_builder_add_term_pos(b, CASIDX_FIELD_BODY, *w,
					    strlen(*w),
					    CASIDX_POS_CODE(*pos, first ?
						CASIDX_POS_KIND_WORD :
						CASIDX_POS_KIND_SPACE));
		(*pos)++;
		first = FALSE;
	}
}

/* body words with positions (so the damage tests cover them too) */
static void build_sample(buffer_t *out)
{
	struct casidx_builder *b = casidx_builder_create();
	uint32_t uid, pos;

	for (uid = 1; uid <= 60; uid++) {
		casidx_builder_add_doc(b, uid);
		if (uid == 7)
			continue; /* doc with no tokens */
		pos = uid % 3;
		add_words_pos(b, "hello world common", &pos);
		if (uid % 2 == 0)
			add_words_pos(b, "even even", &pos);
		if (uid % 10 == 0)
			add_words(b, CASIDX_FIELD_SUBJECT, "decade report");
		add_words(b, CASIDX_FIELD_FROM,
			  t_strdup_printf("user%u@example.com", uid));
	}
	casidx_builder_serialize(b, out);
	casidx_builder_destroy(&b);
}

/* Opens, iterates every term and reads every posting. */
static int read_all(const void *data, size_t size, unsigned int *terms_r)
{
	struct casidx_segment *seg;
	struct casidx_segment_iter *iter;
	const struct casidx_term_entry *e;
	ARRAY_TYPE(uint32_t) tfs;
	roaring_bitmap_t *docs;
	const char *error;
	int ret = 0;

	*terms_r = 0;
	if (casidx_segment_open_buf(data, size, &seg, &error) < 0)
		return -1;
	t_array_init(&tfs, 16);
	iter = casidx_segment_iter_init(seg, NULL, 0);
	while (casidx_segment_iter_next(iter, &e) > 0) {
		if (casidx_segment_read_postings(seg, e, &docs, &tfs,
						 &error) < 0) {
			ret = -1;
			break;
		}
		roaring_bitmap_free(docs);
		(*terms_r)++;
	}
	if (casidx_segment_iter_deinit(&iter, &error) < 0)
		ret = -1;
	casidx_segment_close(&seg);
	return ret;
}

START_TEST(test_segment_roundtrip)
{
	buffer_t *out = buffer_create_dynamic(default_pool, 4096);
	struct casidx_segment *seg;
	struct casidx_segment_iter *iter;
	const struct casidx_term_entry *e;
	ARRAY_TYPE(uint32_t) tfs;
	roaring_bitmap_t *docs;
	const char *error;
	unsigned int terms;

	build_sample(out);
	ck_assert_int_eq(casidx_segment_open_buf(out->data, out->used, &seg,
						 &error), 1);
	ck_assert_uint_eq(roaring_bitmap_get_cardinality(
		casidx_segment_get_docs(seg)), 60);
	ck_assert_uint_eq(casidx_segment_doc_len(seg, 2, CASIDX_FIELD_BODY),
			  5);
	ck_assert_uint_eq(casidx_segment_doc_len(seg, 3, CASIDX_FIELD_BODY),
			  3);
	ck_assert_uint_eq(casidx_segment_doc_len(seg, 7, CASIDX_FIELD_BODY),
			  0);
	ck_assert_uint_eq(casidx_segment_doc_len(seg, 99, CASIDX_FIELD_BODY),
			  0);
	/* 59 docs * 3 + 30 * 2 */
	ck_assert_uint_eq(casidx_segment_field_total(seg, CASIDX_FIELD_BODY),
			  59 * 3 + 30 * 2);
	/* 4 body terms + 2 subject + 59 from */
	ck_assert_uint_eq(casidx_segment_term_count(seg), 4 + 2 + 59);

	/* exact lookup of "0even" */
	t_array_init(&tfs, 16);
	iter = casidx_segment_iter_init(seg, (const void *)"0even", 5);
	ck_assert_int_eq(casidx_segment_iter_next(iter, &e), 1);
	ck_assert_uint_eq(e->key_len, 5);
	ck_assert_int_eq(memcmp(e->key, "0even", 5), 0);
	ck_assert_uint_eq(e->df, 30);
	ck_assert_int_eq(casidx_segment_read_postings(seg, e, &docs, &tfs,
						      &error), 1);
	ck_assert(roaring_bitmap_contains(docs, 2));
	ck_assert(!roaring_bitmap_contains(docs, 3));
	ck_assert_uint_eq(array_count(&tfs), 30);
	ck_assert_uint_eq(*array_idx(&tfs, 0), 2);
	roaring_bitmap_free(docs);
	ck_assert_int_eq(casidx_segment_iter_next(iter, &e), 0);
	ck_assert_int_eq(casidx_segment_iter_deinit(&iter, &error), 0);

	/* a prefix range: all "2user..." from terms */
	terms = 0;
	iter = casidx_segment_iter_init(seg, (const void *)"1user1", 6);
	while (casidx_segment_iter_next(iter, &e) > 0)
		terms++;
	ck_assert_int_eq(casidx_segment_iter_deinit(&iter, &error), 0);
	ck_assert_uint_eq(terms, 11); /* user1, user10..user19 */
	casidx_segment_close(&seg);

	ck_assert_int_eq(read_all(out->data, out->used, &terms), 0);
	ck_assert_uint_eq(terms, 65);
	buffer_free(&out);
}
END_TEST

START_TEST(test_segment_deterministic)
{
	buffer_t *a = buffer_create_dynamic(default_pool, 4096);
	buffer_t *b = buffer_create_dynamic(default_pool, 4096);

	build_sample(a);
	build_sample(b);
	ck_assert(buffer_cmp(a, b));
	buffer_free(&a);
	buffer_free(&b);
}
END_TEST

START_TEST(test_segment_every_byte_flip_rejected)
{
	buffer_t *out = buffer_create_dynamic(default_pool, 4096);
	unsigned char *copy;
	unsigned int terms, rejected = 0;
	size_t i;

	build_sample(out);
	copy = i_malloc(out->used);
	for (i = 0; i < out->used; i++) {
		memcpy(copy, out->data, out->used);
		copy[i] ^= 0x5a;
		if (read_all(copy, out->used, &terms) < 0)
			rejected++;
	}
	ck_assert_uint_eq(rejected, out->used);
	for (i = 0; i < out->used; i++) {
		ck_assert_int_lt(read_all(out->data, i, &terms), 0);
	}
	i_free(copy);
	buffer_free(&out);
}
END_TEST

/* The codes of term (key) for uid, as "pos:flag,..." */
static const char *seg_positions(struct casidx_segment *seg,
				 const char *key, uint32_t uid)
{
	struct casidx_segment_iter *iter;
	const struct casidx_term_entry *e;
	ARRAY_TYPE(uint32_t) tfs, pos, pos_idx;
	roaring_bitmap_t *docs;
	string_t *str = t_str_new(64);
	const char *error;
	uint32_t rank, j;

	t_array_init(&tfs, 16);
	t_array_init(&pos, 16);
	t_array_init(&pos_idx, 16);
	iter = casidx_segment_iter_init(seg, (const void *)key, strlen(key));
	ck_assert_int_eq(casidx_segment_iter_next(iter, &e), 1);
	ck_assert_uint_eq(e->key_len, strlen(key));
	ck_assert_int_eq(casidx_segment_read_positions(seg, e, &docs, &tfs,
		&pos, &pos_idx, &error), 1);
	ck_assert_uint_eq(array_count(&pos_idx), e->df + 1);
	if (roaring_bitmap_contains(docs, uid)) {
		rank = roaring_bitmap_rank(docs, uid) - 1;
		for (j = (*array_idx(&pos_idx, rank));
		     j < (*array_idx(&pos_idx, rank + 1)); j++) {
			str_printfa(str, "%s%u:%u", str_len(str) > 0 ? "," : "",
				    CASIDX_POS_OF(*array_idx(&pos, j)),
				    CASIDX_POS_KIND(*array_idx(&pos, j)));
		}
	}
	roaring_bitmap_free(docs);
	ck_assert_int_eq(casidx_segment_iter_deinit(&iter, &error), 0);
	return str_c(str);
}

/* Position codes survive serialisation; out-of-order codes and a doc
   added twice lose theirs (never keep wrong ones); drop_upto() keeps
   the others' intact. */
START_TEST(test_positions_roundtrip)
{
	struct casidx_builder *b = casidx_builder_create();
	buffer_t *out = buffer_create_dynamic(default_pool, 4096);
	struct casidx_segment *seg;
	const char *error;
	uint32_t pos;

	casidx_builder_add_doc(b, 1);
	pos = 0;
	add_words_pos(b, "a b a c", &pos);
	/* an occurrence without a code counts in tf only */
	casidx_builder_add_term(b, CASIDX_FIELD_BODY, "a", 1);
	casidx_builder_add_term(b, CASIDX_FIELD_SUBJECT, "a", 1);
	casidx_builder_add_doc(b, 2);
	pos = 1000000;
	add_words_pos(b, "c a", &pos);
	/* out of order: term "d" keeps no positions at all */
	casidx_builder_add_term_pos(b, CASIDX_FIELD_BODY, "d", 1,
				    CASIDX_POS_CODE(9, CASIDX_POS_KIND_WORD));
	casidx_builder_add_term_pos(b, CASIDX_FIELD_BODY, "d", 1,
				    CASIDX_POS_CODE(8, CASIDX_POS_KIND_WORD));
	casidx_builder_add_doc(b, 3);
	pos = 5;
	add_words_pos(b, "c d", &pos);
	/* doc 4 twice: its two numberings could mix */
	casidx_builder_add_doc(b, 4);
	pos = 0;
	add_words_pos(b, "e", &pos);
	casidx_builder_add_doc(b, 4);
	pos = 0;
	add_words_pos(b, "f", &pos);
	casidx_builder_serialize(b, out);
	casidx_builder_destroy(&b);
	ck_assert_int_eq(casidx_segment_open_buf(out->data, out->used, &seg,
						 &error), 1);
	ck_assert(casidx_segment_has_positions(seg));
	ck_assert_str_eq(seg_positions(seg, "0a", 1), "0:0,2:1");
	ck_assert_str_eq(seg_positions(seg, "0a", 2), "1000001:1");
	ck_assert_str_eq(seg_positions(seg, "0b", 1), "1:1");
	ck_assert_str_eq(seg_positions(seg, "0c", 1), "3:1");
	ck_assert_str_eq(seg_positions(seg, "0c", 2), "1000000:0");
	ck_assert_str_eq(seg_positions(seg, "5a", 1), "");
	ck_assert_str_eq(seg_positions(seg, "0d", 2), "");
	ck_assert_str_eq(seg_positions(seg, "0d", 3), "");
	ck_assert_str_eq(seg_positions(seg, "0c", 3), "5:0");
	ck_assert_str_eq(seg_positions(seg, "0e", 4), "");
	ck_assert_str_eq(seg_positions(seg, "0f", 4), "");
	casidx_segment_close(&seg);

	b = casidx_builder_create();
	buffer_set_used_size(out, 0);
	casidx_builder_add_doc(b, 5);
	pos = 0;
	add_words_pos(b, "e f", &pos);
	casidx_builder_add_doc(b, 6);
	pos = 0;
	add_words_pos(b, "g h", &pos);
	casidx_builder_drop_upto(b, 5);
	casidx_builder_add_doc(b, 7);
	pos = CASIDX_POS_MAX;
	add_words_pos(b, "h", &pos);
	casidx_builder_serialize(b, out);
	casidx_builder_destroy(&b);
	ck_assert_int_eq(casidx_segment_open_buf(out->data, out->used, &seg,
						 &error), 1);
	ck_assert_uint_eq(roaring_bitmap_get_cardinality(
		casidx_segment_get_docs(seg)), 2);
	ck_assert_str_eq(seg_positions(seg, "0g", 6), "0:0");
	ck_assert_str_eq(seg_positions(seg, "0h", 6), "1:1");
	ck_assert_str_eq(seg_positions(seg, "0h", 7),
			 t_strdup_printf("%u:0", CASIDX_POS_MAX));
	casidx_segment_close(&seg);
	buffer_free(&out);
}
END_TEST

/* Segment version 5: parts' codes (kind PART) round-trip, after the
   whole token at the same position and repeated (a compound with an
   atom twice); a whole token after a part at its position is out of
   order and drops the term's codes. */
START_TEST(test_part_codes_roundtrip)
{
	struct casidx_builder *b = casidx_builder_create();
	buffer_t *out = buffer_create_dynamic(default_pool, 4096);
	struct casidx_segment *seg;
	const char *error;

	casidx_builder_add_doc(b, 1);
	casidx_builder_add_term_pos(b, CASIDX_FIELD_BODY, "a", 1,
				    CASIDX_POS_CODE(3, CASIDX_POS_KIND_SPACE));
	casidx_builder_add_term_pos(b, CASIDX_FIELD_BODY, "a", 1,
				    CASIDX_POS_CODE(3, CASIDX_POS_KIND_PART));
	casidx_builder_add_term_pos(b, CASIDX_FIELD_BODY, "a", 1,
				    CASIDX_POS_CODE(3, CASIDX_POS_KIND_PART));
	casidx_builder_add_term_pos(b, CASIDX_FIELD_BODY, "a", 1,
				    CASIDX_POS_CODE(200, CASIDX_POS_KIND_PART));
	casidx_builder_add_term_pos(b, CASIDX_FIELD_BODY, "a", 1,
				    CASIDX_POS_CODE(201, CASIDX_POS_KIND_WORD));
	casidx_builder_add_term_pos(b, CASIDX_FIELD_BODY, "b", 1,
				    CASIDX_POS_CODE(5, CASIDX_POS_KIND_PART));
	casidx_builder_add_term_pos(b, CASIDX_FIELD_BODY, "b", 1,
				    CASIDX_POS_CODE(5, CASIDX_POS_KIND_WORD));
	casidx_builder_serialize(b, out);
	casidx_builder_destroy(&b);
	ck_assert_int_eq(casidx_segment_open_buf(out->data, out->used, &seg,
						 &error), 1);
	ck_assert(casidx_segment_has_part_codes(seg));
	ck_assert_str_eq(seg_positions(seg, "0a", 1),
			 "3:1,3:2,3:2,200:2,201:0");
	ck_assert_str_eq(seg_positions(seg, "0b", 1), "");
	casidx_segment_close(&seg);
	buffer_free(&out);
}
END_TEST

/* One term "0w" in doc 1, tf 3, codes (2, WORD) and (4, SPACE): its
   postings entry is the whole POSTINGS section (footer slots 11 and 12)
   and ends in the positions section "03 11 02 09" (length 3; the first
   code 2 << 2, << 1 | 0 (npos < tf), + 1; npos 2; the delta 2 << 2 |
   SPACE). If pos is given, those 4 bytes
   are replaced and the entry's CRC fixed, so only the position parser
   can object. Returns the offset of the 4 bytes. */
static size_t build_pos_entry(buffer_t *out, const char *pos)
{
	struct casidx_builder *b = casidx_builder_create();
	uint64_t post_off, post_len;
	unsigned char *entry;

	casidx_builder_add_doc(b, 1);
	casidx_builder_add_term_pos(b, CASIDX_FIELD_BODY, "w", 1,
				    CASIDX_POS_CODE(2, CASIDX_POS_KIND_WORD));
	casidx_builder_add_term_pos(b, CASIDX_FIELD_BODY, "w", 1,
				    CASIDX_POS_CODE(4, CASIDX_POS_KIND_SPACE));
	casidx_builder_add_term(b, CASIDX_FIELD_BODY, "w", 1);
	casidx_builder_serialize(b, out);
	casidx_builder_destroy(&b);
	post_off = le64_to_cpu_unaligned(CONST_PTR_OFFSET(out->data,
		out->used - 200 + 11 * 8));
	post_len = le64_to_cpu_unaligned(CONST_PTR_OFFSET(out->data,
		out->used - 200 + 12 * 8));
	entry = buffer_get_modifiable_data(out, NULL);
	entry += post_off;
	ck_assert_int_eq(memcmp(entry + post_len - 4, "\x03\x11\x02\x09",
				4), 0);
	if (pos != NULL) {
		memcpy(entry + post_len - 4, pos, 4);
		cpu32_to_le_unaligned(cas_crc32c(entry + 4, post_len - 4),
				      entry);
	}
	return post_off + post_len - 4;
}

/* The error reading the only term's positions, NULL if none. */
static const char *read_pos_error(const buffer_t *seg_buf)
{
	struct casidx_segment *seg;
	struct casidx_segment_iter *iter;
	const struct casidx_term_entry *e;
	ARRAY_TYPE(uint32_t) tfs, pos, pos_idx;
	roaring_bitmap_t *docs;
	const char *error = NULL;

	t_array_init(&tfs, 16);
	t_array_init(&pos, 16);
	t_array_init(&pos_idx, 16);
	if (casidx_segment_open_buf(seg_buf->data, seg_buf->used, &seg,
				    &error) < 0)
		return error;
	iter = casidx_segment_iter_init(seg, NULL, 0);
	ck_assert_int_eq(casidx_segment_iter_next(iter, &e), 1);
	if (casidx_segment_read_positions(seg, e, &docs, &tfs, &pos,
					  &pos_idx, &error) > 0) {
		roaring_bitmap_free(docs);
		error = NULL;
		ck_assert_uint_eq(array_count(&pos), 2);
	}
	error = t_strdup(error);
	(void)casidx_segment_iter_deinit(&iter, &error);
	casidx_segment_close(&seg);
	return error;
}

/* Damage inside the positions: every flipped bit fails the entry's CRC;
   with the CRC made to match, each kind of bad position data is still
   a clear error, never positions read wrong. */
START_TEST(test_positions_damage)
{
	buffer_t *out = buffer_create_dynamic(default_pool, 1024);
	buffer_t *copy = buffer_create_dynamic(default_pool, 1024);
	static const struct {
		const char *bytes, *error;
	} cases[] = {
		/* 4 positions, tf 3; tf positions must use the flag */
		{ "\x03\x11\x04\x09", "position count" },
		{ "\x03\x11\x03\x09", "position count" },
		{ "\x03\x11\x00\x09", "position count" },
		/* a zero delta (only a part may repeat a position) */
		{ "\x03\x11\x02\x01", "position delta" },
		/* kind 3, of the second and of the first code */
		{ "\x03\x11\x02\x0b", "position kind" },
		{ "\x03\x17\x02\x09", "position kind" },
		/* an unterminated varint */
		{ "\x03\x11\x02\x85", "position delta" },
		{ "\x03\x11\x82\x85", "position count" },
		/* one position, then a stray byte */
		{ "\x03\x11\x01\x09", "positions trailing bytes" },
		/* no codes, then stray bytes */
		{ "\x03\x00\x04\x05", "positions trailing bytes" },
		/* three codes (npos = tf): one missing */
		{ "\x03\x12\x09\x00", "position delta" },
		/* the section's length wrong either way */
		{ "\x04\x11\x02\x09", "positions size" },
		{ "\x02\x11\x02\x09", "positions size" },
	};
	unsigned int i, bit;
	size_t start;
	const char *error;

	start = build_pos_entry(out, NULL);
	ck_assert_ptr_eq(read_pos_error(out), NULL);
	for (i = 0; i < 4; i++) {
		for (bit = 0; bit < 8; bit++) {
			buffer_set_used_size(copy, 0);
			buffer_append_buf(copy, out, 0, SIZE_MAX);
			((unsigned char *)buffer_get_modifiable_data(copy,
				NULL))[start + i] ^= 1 << bit;
			error = read_pos_error(copy);
			ck_assert_msg(error != NULL &&
				      strstr(error, "checksum") != NULL,
				      "byte %u bit %u: %s", i, bit,
				      error == NULL ? "(none)" : error);
		}
	}
	for (i = 0; i < N_ELEMENTS(cases); i++) {
		buffer_set_used_size(out, 0);
		(void)build_pos_entry(out, cases[i].bytes);
		error = read_pos_error(out);
		ck_assert_msg(error != NULL &&
			      strstr(error, cases[i].error) != NULL,
			      "case %u: %s", i, error == NULL ? "(none)" :
			      error);
	}
	buffer_free(&copy);
	buffer_free(&out);
}
END_TEST

static const unsigned char kek_a[CAS_KEK_SIZE] = { 1, 2, 3, 4 };
static const unsigned char kek_b[CAS_KEK_SIZE] = { 1, 2, 3, 5 };
#define GUID_A "0123456789abcdef0123456789abcdef"
#define GUID_B "0123456789abcdef0123456789abcdee"

static bool mem_has(const void *hay, size_t hay_len, const char *needle)
{
	const unsigned char *p = hay;
	size_t i, n = strlen(needle);

	for (i = 0; i + n <= hay_len; i++) {
		if (memcmp(p + i, needle, n) == 0)
			return TRUE;
	}
	return FALSE;
}

static int try_open(const struct cas_keyring *kr, const char *guid,
		    const char *name, const void *data, size_t size,
		    buffer_t *plain)
{
	const char *error;
	buffer_t *image;
	int ret;

	buffer_set_used_size(plain, 0);
	ret = casidx_crypt_open(kr, guid, name, data, size, &image, &error);
	if (ret > 0) {
		buffer_append(plain, image->data, image->used);
		buffer_free(&image);
	} else {
		ck_assert_ptr_null(image);
	}
	return ret;
}

START_TEST(test_sealed_segment_roundtrip)
{
	struct cas_keyring *ka = cas_keyring_create_from_kek(kek_a);
	struct cas_keyring *kb = cas_keyring_create_from_kek(kek_b);
	buffer_t *out = buffer_create_dynamic(default_pool, 4096);
	buffer_t *sealed = buffer_create_dynamic(default_pool, 4096);
	buffer_t *sealed2 = buffer_create_dynamic(default_pool, 4096);
	buffer_t *plain = buffer_create_dynamic(default_pool, 4096);
	unsigned char *copy;
	unsigned int terms, rejected = 0;
	size_t i;

	build_sample(out);
	ck_assert(mem_has(out->data, out->used, "common"));
	buffer_free(&sealed);
	sealed = casidx_crypt_seal(ka, GUID_A, "seg-00000001.cxs", out->data,
				   out->used);
	/* version 2: a compressed image, smaller than the image */
	ck_assert_uint_eq(((const unsigned char *)sealed->data)[8],
			  CASIDX_CRYPT_VERSION);
	ck_assert_uint_lt(sealed->used, out->used);
	ck_assert(!mem_has(sealed->data, sealed->used, "common"));
	ck_assert(!mem_has(sealed->data, sealed->used, "example.com"));
	/* random nonce: sealing twice differs */
	buffer_free(&sealed2);
	sealed2 = casidx_crypt_seal(ka, GUID_A, "seg-00000001.cxs", out->data,
				    out->used);
	ck_assert(!buffer_cmp(sealed, sealed2));

	ck_assert_int_eq(try_open(ka, GUID_A, "seg-00000001.cxs",
				  sealed->data, sealed->used, plain), 1);
	ck_assert(buffer_cmp(plain, out));
	ck_assert_int_eq(read_all(plain->data, plain->used, &terms), 0);
	ck_assert_uint_eq(terms, 65);

	/* wrong key, other mailbox, other file name, plaintext input */
	ck_assert_int_eq(try_open(kb, GUID_A, "seg-00000001.cxs",
				  sealed->data, sealed->used, plain), -1);
	ck_assert_uint_eq(plain->used, 0);
	ck_assert_int_eq(try_open(ka, GUID_B, "seg-00000001.cxs",
				  sealed->data, sealed->used, plain), -1);
	ck_assert_int_eq(try_open(ka, GUID_A, "seg-00000002.cxs",
				  sealed->data, sealed->used, plain), -1);
	ck_assert_int_eq(try_open(ka, GUID_A, "seg-00000001.cxs",
				  out->data, out->used, plain), -1);

	/* every single-byte flip and every truncation */
	copy = i_malloc(sealed->used);
	for (i = 0; i < sealed->used; i++) {
		memcpy(copy, sealed->data, sealed->used);
		copy[i] ^= 0x01;
		if (try_open(ka, GUID_A, "seg-00000001.cxs", copy,
			     sealed->used, plain) < 0 && plain->used == 0)
			rejected++;
	}
	ck_assert_uint_eq(rejected, sealed->used);
	for (i = 0; i < sealed->used; i++) {
		ck_assert_int_eq(try_open(ka, GUID_A, "seg-00000001.cxs",
					  sealed->data, i, plain), -1);
	}
	i_free(copy);
	buffer_free(&plain);
	buffer_free(&sealed2);
	buffer_free(&sealed);
	buffer_free(&out);
	cas_keyring_free(&ka);
	cas_keyring_free(&kb);
}
END_TEST

/* A sealed file of any version and plaintext, written from the format
   (doc/casidx-format.md, "Encrypted segments"), not by casidx_crypt. */
static void seal_raw(const struct cas_keyring *kr, uint32_t version,
		     uint64_t image_size, const void *plain, size_t size,
		     buffer_t *sealed)
{
	buffer_t *aad = t_buffer_create(128);
	unsigned char v[12];
	unsigned int i;

	for (i = 0; i < 4; i++)
		v[i] = version >> (8 * i);
	for (i = 0; i < 8; i++)
		v[4 + i] = image_size >> (8 * i);
	buffer_set_used_size(sealed, 0);
	buffer_append(sealed, "CXSEGENC", 8);
	/* version 1 has no image size */
	buffer_append(sealed, v, version == 1 ? 4 : 12);
	buffer_append(aad, "casidx-seg", 11);
	buffer_append(aad, sealed->data, sealed->used);
	buffer_append(aad, GUID_A, strlen(GUID_A) + 1);
	buffer_append(aad, "seg-00000001.cxs", 16);
	cas_record_seal(kr, aad->data, aad->used, plain, size, sealed);
}

static int try_open_error(const struct cas_keyring *kr, const buffer_t *sealed,
			  const char **error_r)
{
	buffer_t *image;
	int ret;

	ret = casidx_crypt_open(kr, GUID_A, "seg-00000001.cxs", sealed->data,
				sealed->used, &image, error_r);
	if (image != NULL)
		buffer_free(&image);
	return ret;
}

/* Version 2's plaintext must be one zstd frame that declares its size
   (at most CASIDX_CRYPT_MAX_IMAGE) and decompresses to exactly that;
   authenticated files that break any of it are refused, naming the
   compressed image, and allocate nothing of the declared size. */
START_TEST(test_sealed_v2_hostile_frames)
{
	struct cas_keyring *ka = cas_keyring_create_from_kek(kek_a);
	buffer_t *out = buffer_create_dynamic(default_pool, 4096);
	buffer_t *sealed = buffer_create_dynamic(default_pool, 4096);
	buffer_t *z = buffer_create_dynamic(default_pool, 4096);
	unsigned char *zp, big[18];
	uint64_t image_size;
	ZSTD_CCtx *cctx;
	ZSTD_outBuffer zout;
	ZSTD_inBuffer zin;
	const char *error;
	size_t bound, n;

	build_sample(out);
	bound = ZSTD_compressBound(out->used);
	zp = buffer_append_space_unsafe(z, bound);
	n = ZSTD_compress(zp, bound, out->data, out->used, 3);
	ck_assert(!ZSTD_isError(n));
	buffer_set_used_size(z, n);

	/* the well-formed one opens; its header gives the image size */
	seal_raw(ka, 2, out->used, z->data, z->used, sealed);
	ck_assert_int_eq(try_open_error(ka, sealed, &error), 1);
	ck_assert_int_eq(casidx_crypt_image_size(sealed->data, 20,
						 sealed->used, &image_size), 0);
	ck_assert_uint_eq(image_size, out->used);
	ck_assert_int_eq(casidx_crypt_image_size(sealed->data, 11,
						 sealed->used, &image_size), -1);
	/* a header that says another size than the frame */
	seal_raw(ka, 2, out->used + 1, z->data, z->used, sealed);
	ck_assert_int_eq(try_open_error(ka, sealed, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "compressed image"));
	/* a header whose size was changed after sealing */
	seal_raw(ka, 2, out->used, z->data, z->used, sealed);
	((unsigned char *)buffer_get_modifiable_data(sealed, NULL))[12] ^= 1;
	ck_assert_int_eq(try_open_error(ka, sealed, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));
	/* the same plaintext labelled version 1 is the frame, no segment:
	   it opens as a plaintext image (the parser then refuses it) */
	seal_raw(ka, 1, 0, z->data, z->used, sealed);
	ck_assert_int_eq(try_open_error(ka, sealed, &error), 1);

	/* two frames */
	buffer_append(z, z->data, n);
	seal_raw(ka, 2, out->used, z->data, z->used, sealed);
	ck_assert_int_eq(try_open_error(ka, sealed, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "compressed image"));
	/* a cut frame */
	seal_raw(ka, 2, out->used, z->data, n - 1, sealed);
	ck_assert_int_eq(try_open_error(ka, sealed, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "compressed image"));

	/* no declared size (streaming, nothing pledged) */
	cctx = ZSTD_createCCtx();
	ck_assert_int_eq(ZSTD_CCtx_setParameter(cctx,
			 ZSTD_c_contentSizeFlag, 0), 0);
	buffer_set_used_size(z, 0);
	zp = buffer_append_space_unsafe(z, bound);
	zout.dst = zp; zout.size = bound; zout.pos = 0;
	zin.src = out->data; zin.size = out->used; zin.pos = 0;
	ck_assert_uint_eq(ZSTD_compressStream2(cctx, &zout, &zin, ZSTD_e_end),
			  0);
	ZSTD_freeCCtx(cctx);
	ck_assert_uint_eq(ZSTD_getFrameContentSize(zp, zout.pos),
			  ZSTD_CONTENTSIZE_UNKNOWN);
	seal_raw(ka, 2, out->used, zp, zout.pos, sealed);
	ck_assert_int_eq(try_open_error(ka, sealed, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "compressed image"));

	/* a frame header declaring 2 GiB: magic, single segment with an
	   8-byte content size, then one empty last raw block */
	memcpy(big, "\x28\xb5\x2f\xfd\xe0", 5);
	memcpy(big + 5, "\x00\x00\x00\x80\x00\x00\x00\x00", 8);
	memcpy(big + 13, "\x01\x00\x00", 3);
	ck_assert_uint_eq(ZSTD_getFrameContentSize(big, 16),
			  (unsigned long long)1 << 31);
	seal_raw(ka, 2, out->used, big, 16, sealed);
	ck_assert_int_eq(try_open_error(ka, sealed, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "compressed image"));
	/* ... and the header saying so: refused before any decryption */
	seal_raw(ka, 2, (uint64_t)1 << 31, big, 16, sealed);
	ck_assert_int_eq(try_open_error(ka, sealed, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "over the limit"));
	/* declaring 100 bytes, holding none */
	memcpy(big, "\x28\xb5\x2f\xfd\x20\x64\x01\x00\x00", 9);
	ck_assert_uint_eq(ZSTD_getFrameContentSize(big, 9), 100);
	seal_raw(ka, 2, 100, big, 9, sealed);
	ck_assert_int_eq(try_open_error(ka, sealed, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "compressed image"));

	/* a version neither reader knows */
	seal_raw(ka, 3, 0, out->data, out->used, sealed);
	ck_assert_int_eq(try_open_error(ka, sealed, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "version 3"));

	buffer_free(&z);
	buffer_free(&sealed);
	buffer_free(&out);
	cas_keyring_free(&ka);
}
END_TEST

/* A segment sealed by the code before version 2 (uncompressed,
   tests/fixtures/casidx-sealed-v1) still opens, its terms read, and a
   reseal keeps it version 1; relabelled version 2 it fails
   authentication (the version is in the AAD). */
START_TEST(test_sealed_v1_fixture)
{
	const char *path = check_fixture_path("casidx-sealed-v1",
					      "seg-00000001.cxs");
	struct cas_keyring *ka = cas_keyring_create_from_kek(kek_a);
	buffer_t *file = buffer_create_dynamic(default_pool, 1024);
	buffer_t *plain = buffer_create_dynamic(default_pool, 1024);
	buffer_t *resealed = buffer_create_dynamic(default_pool, 1024);
	struct casidx_segment *seg;
	struct casidx_segment_iter *iter;
	const struct casidx_term_entry *e;
	unsigned char tmp[4096], *copy;
	unsigned int terms = 0;
	uint64_t image_size;
	bool fox = FALSE;
	const char *error;
	ssize_t n;
	int fd;

	fd = open(path, O_RDONLY);
	ck_assert_msg(fd >= 0, "open(%s) failed", path);
	while ((n = read(fd, tmp, sizeof(tmp))) > 0)
		buffer_append(file, tmp, n);
	i_close_fd(&fd);
	ck_assert_uint_eq(((const unsigned char *)file->data)[8], 1);
	ck_assert_int_eq(casidx_crypt_image_size(file->data, 20, file->used,
						 &image_size), 0);
	ck_assert_uint_eq(image_size, file->used - 52);

	ck_assert_int_eq(try_open(ka, GUID_A, "seg-00000001.cxs", file->data,
				  file->used, plain), 1);
	ck_assert_int_eq(casidx_segment_open_buf(plain->data, plain->used,
						 &seg, &error), 1);
	ck_assert_uint_eq(roaring_bitmap_get_cardinality(
				casidx_segment_get_docs(seg)), 2);
	/* written before segment version 4 too */
	ck_assert(!casidx_segment_has_raw_addresses(seg));
	iter = casidx_segment_iter_init(seg, NULL, 0);
	while (casidx_segment_iter_next(iter, &e) > 0) {
		terms++;
		if (e->key_len == 4 && memcmp(e->key, "0fox", 4) == 0)
			fox = TRUE;
	}
	ck_assert_int_eq(casidx_segment_iter_deinit(&iter, &error), 0);
	ck_assert(fox);
	/* body: sealed fixture quick brown fox lazy dog sleeps;
	   subject: fixture one two */
	ck_assert_uint_eq(terms, 11);
	casidx_segment_close(&seg);

	/* one epoch: nothing to reseal; the file stays as it is */
	ck_assert_int_eq(casidx_crypt_reseal(ka, GUID_A, "seg-00000001.cxs",
					     file->data, file->used, resealed,
					     &error), 0);
	copy = i_malloc(file->used);
	memcpy(copy, file->data, file->used);
	copy[8] = 2;
	ck_assert_int_eq(try_open(ka, GUID_A, "seg-00000001.cxs", copy,
				  file->used, plain), -1);
	i_free(copy);
	buffer_free(&resealed);
	buffer_free(&plain);
	buffer_free(&file);
	cas_keyring_free(&ka);
}
END_TEST

/* deterministic xorshift: the same terms and needles in every run */
static uint32_t test_rng_state;

static uint32_t test_rng(void)
{
	test_rng_state ^= test_rng_state << 13;
	test_rng_state ^= test_rng_state >> 17;
	test_rng_state ^= test_rng_state << 5;
	return test_rng_state;
}

static bool has_substring(const unsigned char *s, size_t len,
			  const char *needle, size_t needle_len)
{
	size_t i;

	for (i = 0; i + needle_len <= len; i++) {
		if (memcmp(s + i, needle, needle_len) == 0)
			return TRUE;
	}
	return FALSE;
}

static int collect_key_cb(struct casidx_segment *seg ATTR_UNUSED,
			  const struct casidx_term_entry *entry,
			  void *context, const char **error_r ATTR_UNUSED)
{
	string_t *keys = context;

	str_append_data(keys, entry->key, entry->key_len);
	str_append_c(keys, ' ');
	return 0;
}

/* Substring lookups narrowed by the trigram signatures
   (casidx-termsig.h) find exactly the terms a plain scan finds: 6000
   random terms over a small alphabet in two fields (so blocks collide
   and needles hit many terms), 3000 needles of 1 to 8 bytes, both
   pieces of terms and random. Also checks the signatures do narrow:
   a needle of a single rare term reads few blocks. */
START_TEST(test_substring_lookup_matches_scan)
{
	struct casidx_builder *b = casidx_builder_create();
	struct casidx_segment *seg;
	ARRAY_TYPE(const_string) terms;
	buffer_t *out = buffer_create_dynamic(default_pool, 1 << 20);
	string_t *got = str_new(default_pool, 4096);
	string_t *want = str_new(default_pool, 4096);
	const char *error, *const *tp;
	const char *alphabet = "abcdefghijklmnopqrstuvwxyz0123456789.-";
	unsigned int i, j, n, field, len;
	char term[32], needle[16];

	test_rng_state = 17;
	t_array_init(&terms, 6000);
	casidx_builder_add_doc(b, 1);
	for (i = 0; i < 6000; i++) {
		len = 1 + test_rng() % 20;
		for (j = 0; j < len; j++)
			term[j] = alphabet[test_rng() % 38];
		term[len] = '\0';
		field = i % 2 == 0 ? CASIDX_FIELD_BODY : CASIDX_FIELD_HEADER;
		casidx_builder_add_term(b, field, term, len);
		if (field == CASIDX_FIELD_BODY) {
			const char *t = t_strdup(term);
			array_push_back(&terms, &t);
		}
	}
	/* one rare term */
	casidx_builder_add_term(b, CASIDX_FIELD_BODY, "xyzzyquux", 9);
	casidx_builder_serialize(b, out);
	casidx_builder_destroy(&b);
	ck_assert_int_eq(casidx_segment_open_buf(out->data, out->used, &seg,
						 &error), 1);
	for (i = 0; i < 3000; i++) {
		len = 1 + test_rng() % 8;
		if (i % 2 == 0) {
			tp = array_idx(&terms, test_rng() % array_count(&terms));
			n = strlen(*tp);
			j = test_rng() % n;
			len = I_MIN(len, n - j);
			memcpy(needle, *tp + j, len);
		} else {
			for (j = 0; j < len; j++)
				needle[j] = alphabet[test_rng() % 38];
		}
		needle[len] = '\0';
		str_truncate(got, 0);
		str_truncate(want, 0);
		ck_assert_int_ge(casidx_segment_find_substring(seg,
			CASIDX_FIELD_KEY_CHAR(CASIDX_FIELD_BODY), needle, len,
			collect_key_cb, got, &error), 0);
		/* the plain scan: every body term containing the needle,
		   each once, in key order */
		{
			struct casidx_segment_iter *it;
			const struct casidx_term_entry *e;
			unsigned char prefix = CASIDX_FIELD_KEY_CHAR(
				CASIDX_FIELD_BODY);

			it = casidx_segment_iter_init(seg, &prefix, 1);
			while (casidx_segment_iter_next(it, &e) > 0) {
				if (e->key_len > 1 &&
				    has_substring(e->key + 1, e->key_len - 1,
						  needle, len)) {
					str_append_data(want, e->key,
							e->key_len);
					str_append_c(want, ' ');
				}
			}
			ck_assert_int_eq(casidx_segment_iter_deinit(&it,
								    &error), 0);
		}
		ck_assert_msg(strcmp(str_c(got), str_c(want)) == 0,
			      "needle '%s': got %s, want %s", needle,
			      str_c(got), str_c(want));
	}
	casidx_segment_close(&seg);
	buffer_free(&out);
	str_free(&got);
	str_free(&want);
}
END_TEST

/* The dictionary is decoded one key namespace at a time
   (casidx_segment_find_substring()): terms in every namespace a
   segment has (fields, raw addresses, dtgrams), several dictionary
   blocks each, some namespaces empty. Every lookup in every namespace
   returns what a plain iteration of that namespace finds, whichever
   namespace was decoded first; a namespace's first lookup decodes its
   terms only, and the signatures are built by the first needle of 3
   bytes or more. */
static const char test_ns_chars[] = "012356789:ACDG";

static unsigned int test_ns_scan(struct casidx_segment *seg,
				 unsigned char ns, const char *needle,
				 size_t len, string_t *want)
{
	struct casidx_segment_iter *it;
	const struct casidx_term_entry *e;
	const char *error;
	unsigned int n = 0;

	it = casidx_segment_iter_init(seg, &ns, 1);
	while (casidx_segment_iter_next(it, &e) > 0) {
		n++;
		if (needle == NULL ||
		    (e->key_len > 1 && has_substring(e->key + 1,
						     e->key_len - 1,
						     needle, len))) {
			str_append_data(want, e->key, e->key_len);
			str_append_c(want, ' ');
		}
	}
	ck_assert_int_eq(casidx_segment_iter_deinit(&it, &error), 0);
	return n;
}

static bool test_select_all(const unsigned char *term ATTR_UNUSED,
			    size_t term_len ATTR_UNUSED,
			    void *context ATTR_UNUSED)
{
	return TRUE;
}

START_TEST(test_namespace_arenas)
{
	static const char *const needles[] = {
		"a", "ab", "abc", "e1", "the", "q", "zz", "4-", "xyz"
	};
	struct casidx_builder *b = casidx_builder_create();
	struct casidx_segment *seg;
	buffer_t *out = buffer_create_dynamic(default_pool, 1 << 16);
	string_t *got = str_new(default_pool, 4096);
	string_t *want = str_new(default_pool, 4096);
	unsigned int ns_terms[sizeof(test_ns_chars)];
	unsigned int i, j, k, len, decoded, sig, total_decoded;
	const char *alphabet = "abcdehqtxyz0124-";
	const char *error;
	unsigned char key[24];

	test_rng_state = 99;
	casidx_builder_add_doc(b, 1);
	for (i = 0; i < 3000; i++) {
		/* namespace 'G' (last) gets few terms: one block */
		k = i % (sizeof(test_ns_chars) - 1);
		if (test_ns_chars[k] == 'G' && i > 100)
			continue;
		key[0] = test_ns_chars[k];
		len = 1 + test_rng() % 12;
		for (j = 0; j < len; j++)
			key[1 + j] = alphabet[test_rng() % 16];
		casidx_builder_add_key(b, key, len + 1, CASIDX_POS_NONE);
	}
	casidx_builder_serialize(b, out);
	casidx_builder_destroy(&b);
	ck_assert_int_eq(casidx_segment_open_buf(out->data, out->used, &seg,
						 &error), 1);
	/* the namespace with no terms ('4', between '3' and '5') */
	ck_assert_int_eq(casidx_segment_find_substring(seg, '4', "a", 1,
		collect_key_cb, got, &error), 0);
	ck_assert_int_eq(str_len(got), 0);

	/* the last namespace first, then the others from the back */
	total_decoded = 0;
	for (k = sizeof(test_ns_chars) - 1; k-- > 0; ) {
		unsigned char ns = test_ns_chars[k];

		str_truncate(want, 0);
		ns_terms[k] = test_ns_scan(seg, ns, NULL, 0, want);
		ck_assert_uint_gt(ns_terms[k], 0);
		/* a 2-byte needle decodes the namespace, signs nothing */
		str_truncate(got, 0);
		str_truncate(want, 0);
		(void)test_ns_scan(seg, ns, "ab", 2, want);
		ck_assert_int_ge(casidx_segment_find_substring(seg, ns,
			"ab", 2, collect_key_cb, got, &error), 0);
		ck_assert_str_eq(str_c(got), str_c(want));
		casidx_segment_get_arena_stats(seg, &decoded, &sig);
		total_decoded += ns_terms[k];
		ck_assert_uint_eq(decoded, total_decoded);
		ck_assert_uint_eq(sig, total_decoded - ns_terms[k]);
		/* a 3-byte one signs it */
		str_truncate(got, 0);
		str_truncate(want, 0);
		(void)test_ns_scan(seg, ns, "abc", 3, want);
		ck_assert_int_ge(casidx_segment_find_substring(seg, ns,
			"abc", 3, collect_key_cb, got, &error), 0);
		ck_assert_str_eq(str_c(got), str_c(want));
		casidx_segment_get_arena_stats(seg, &decoded, &sig);
		ck_assert_uint_eq(decoded, total_decoded);
		ck_assert_uint_eq(sig, total_decoded);
	}
	ck_assert_uint_eq(total_decoded, casidx_segment_term_count(seg));
	/* every needle in every namespace, and find_terms() */
	for (k = 0; k + 1 < sizeof(test_ns_chars); k++) {
		unsigned char ns = test_ns_chars[k];

		for (i = 0; i < N_ELEMENTS(needles); i++) {
			str_truncate(got, 0);
			str_truncate(want, 0);
			(void)test_ns_scan(seg, ns, needles[i],
					   strlen(needles[i]), want);
			ck_assert_int_ge(casidx_segment_find_substring(seg,
				ns, needles[i], strlen(needles[i]),
				collect_key_cb, got, &error), 0);
			ck_assert_msg(strcmp(str_c(got), str_c(want)) == 0,
				      "'%c' '%s': got %s, want %s", ns,
				      needles[i], str_c(got), str_c(want));
		}
		str_truncate(got, 0);
		str_truncate(want, 0);
		(void)test_ns_scan(seg, ns, NULL, 0, want);
		ck_assert_int_eq(casidx_segment_find_terms(seg, ns,
			test_select_all, NULL, collect_key_cb, got, &error), 1);
		ck_assert_str_eq(str_c(got), str_c(want));
	}
	casidx_segment_get_arena_stats(seg, &decoded, &sig);
	ck_assert_uint_eq(decoded, casidx_segment_term_count(seg));
	casidx_segment_close(&seg);
	buffer_free(&out);
	str_free(&got);
	str_free(&want);
}
END_TEST

/* The signatures themselves: a block is a candidate whenever one of
   its terms contains the needle, and a needle none contains rules out
   most blocks (the bits of three trigrams rarely all collide). */
START_TEST(test_termsig_candidates)
{
	struct casidx_termsig *sig;
	ARRAY_TYPE(uint32_t) blocks;
	unsigned int i, nblocks = 200;
	char term[32];

	sig = casidx_termsig_create(nblocks * CASIDX_TERMSIG_BLOCK_TERMS);
	for (i = 0; i < nblocks * CASIDX_TERMSIG_BLOCK_TERMS; i++) {
		i_snprintf(term, sizeof(term), "term%uword", i * 7919);
		casidx_termsig_add(sig, i, (const unsigned char *)term,
				   strlen(term));
	}
	t_array_init(&blocks, 16);
	/* too short to narrow */
	ck_assert(!casidx_termsig_candidates(sig, (const void *)"te", 2, 0,
					     100, &blocks));
	ck_assert_uint_eq(array_count(&blocks), 0);
	/* term 1000 is in block 1000 / 32 = 31 */
	i_snprintf(term, sizeof(term), "%uwo", 1000 * 7919);
	ck_assert(casidx_termsig_candidates(sig, (const void *)term,
					    strlen(term), 0,
					    nblocks * CASIDX_TERMSIG_BLOCK_TERMS,
					    &blocks));
	for (i = 0; i < array_count(&blocks); i++) {
		if (*array_idx(&blocks, i) == 1000 /
		    CASIDX_TERMSIG_BLOCK_TERMS)
			break;
	}
	ck_assert_uint_lt(i, array_count(&blocks));
	ck_assert_uint_lt(array_count(&blocks), nblocks / 4);
	/* restricted to a term range that excludes the block: not there */
	array_clear(&blocks);
	ck_assert(casidx_termsig_candidates(sig, (const void *)term,
					    strlen(term), 0, 31 * 32,
					    &blocks));
	for (i = 0; i < array_count(&blocks); i++)
		ck_assert_uint_lt(*array_idx(&blocks, i), 31);
	array_clear(&blocks);
	ck_assert(casidx_termsig_candidates(sig, (const void *)"qqqzzz", 6,
					    0, 6400, &blocks));
	ck_assert_uint_lt(array_count(&blocks), nblocks / 10);
	casidx_termsig_free(&sig);
	ck_assert_ptr_eq(sig, NULL);
}
END_TEST

START_TEST(test_builder_long_and_nul_terms)
{
	struct casidx_builder *b = casidx_builder_create();
	buffer_t *out = buffer_create_dynamic(default_pool, 1024);
	struct casidx_segment *seg;
	struct casidx_segment_iter *iter;
	const struct casidx_term_entry *e;
	char longterm[400];
	const char *error;

	memset(longterm, 'x', sizeof(longterm));
	/* "é" straddles the cut point: must not be split */
	memcpy(longterm + CASIDX_TERM_MAX_BYTES - 1, "\xc3\xa9", 2);
	casidx_builder_add_doc(b, 5);
	casidx_builder_add_term(b, CASIDX_FIELD_BODY, longterm,
				sizeof(longterm));
	casidx_builder_add_term(b, CASIDX_FIELD_BODY, "a\0b", 3);
	casidx_builder_serialize(b, out);
	casidx_builder_destroy(&b);
	ck_assert_int_eq(casidx_segment_open_buf(out->data, out->used, &seg,
						 &error), 1);
	ck_assert_uint_eq(casidx_segment_term_count(seg), 1);
	iter = casidx_segment_iter_init(seg, NULL, 0);
	ck_assert_int_eq(casidx_segment_iter_next(iter, &e), 1);
	ck_assert_uint_eq(e->key_len, 1 + CASIDX_TERM_MAX_BYTES - 1);
	ck_assert_int_eq(casidx_segment_iter_deinit(&iter, &error), 0);
	casidx_segment_close(&seg);
	buffer_free(&out);
}
END_TEST

struct collect_ctx {
	roaring_bitmap_t *docs;
	unsigned int terms;
};

static void collect_cb(struct casidx_segment *seg ATTR_UNUSED,
		       const unsigned char *term ATTR_UNUSED,
		       size_t term_len ATTR_UNUSED,
		       const roaring_bitmap_t *docs,
		       const uint32_t *tfs ATTR_UNUSED, void *context)
{
	struct collect_ctx *ctx = context;

	roaring_bitmap_or_inplace(ctx->docs, docs);
	ctx->terms++;
}

/* Docs matching token, minus expunged; count of matched terms. */
/* A commit leaves the segments closed (a writer needs only the
   manifest): reads refresh first. */
static void refresh_ok(struct casidx_index *index)
{
	const char *error = NULL;

	ck_assert_msg(casidx_index_refresh(index, &error) >= 0, "%s", error);
}

static uint64_t scan_count(struct casidx_index *index,
			   enum casidx_field field, const char *token,
			   enum casidx_match match, unsigned int *terms_r)
{
	struct collect_ctx ctx;
	const char *error;
	uint64_t n;

	ctx.docs = roaring_bitmap_create();
	ctx.terms = 0;
	ck_assert_int_ge(casidx_index_scan(index, field, token, strlen(token),
					   match, collect_cb, &ctx, &error),
			 0);
	roaring_bitmap_andnot_inplace(ctx.docs,
				      casidx_index_get_expunged(index));
	n = roaring_bitmap_get_cardinality(ctx.docs);
	roaring_bitmap_free(ctx.docs);
	if (terms_r != NULL)
		*terms_r = ctx.terms;
	return n;
}

/* The loaded snapshot: last indexed UID, segments, live documents. */
static void assert_snapshot(struct casidx_index *index, uint32_t last_uid,
			    unsigned int segments, uint64_t docs)
{
	roaring_bitmap_t *all;

	ck_assert_uint_eq(casidx_index_get_last_uid(index), last_uid);
	ck_assert_uint_eq(casidx_index_get_segment_count(index), segments);
	refresh_ok(index);
	all = casidx_index_get_universe(index);
	ck_assert_uint_eq(roaring_bitmap_get_cardinality(all), docs);
	roaring_bitmap_free(all);
}

static void index_docs(struct casidx_index *index, uint32_t first,
		       uint32_t last)
{
	struct casidx_index_writer *w = casidx_index_writer_begin(index);
	const char *error;
	uint32_t uid;

	for (uid = first; uid <= last; uid++) {
		casidx_index_writer_add_doc(w, uid);
		if (uid % 5 != 0) {
			casidx_index_writer_add_term(w, CASIDX_FIELD_BODY,
						     "shared", 6);
			casidx_index_writer_add_term(w, CASIDX_FIELD_BODY,
				t_strdup_printf("word%u", uid),
				strlen(t_strdup_printf("word%u", uid)));
		}
		ck_assert_int_eq(casidx_index_writer_doc_done(w, &error), 0);
	}
	ck_assert_int_eq(casidx_index_writer_commit(&w, &error), 0);
}

/* seg-*.cxs files in the index directory */
static unsigned int count_seg_files(void)
{
	struct dirent *d;
	unsigned int n = 0;
	DIR *dir = opendir(test_dir);

	ck_assert_ptr_ne(dir, NULL);
	while ((d = readdir(dir)) != NULL) {
		if (strncmp(d->d_name, "seg-", 4) == 0)
			n++;
	}
	(void)closedir(dir);
	return n;
}

/* total size of the seg-*.cxs files in the index directory */
static uint64_t seg_files_size(void)
{
	struct dirent *d;
	struct stat st;
	uint64_t size = 0;
	DIR *dir = opendir(test_dir);

	ck_assert_ptr_ne(dir, NULL);
	while ((d = readdir(dir)) != NULL) {
		if (strncmp(d->d_name, "seg-", 4) != 0)
			continue;
		ck_assert_int_eq(stat(t_strdup_printf("%s/%s", test_dir,
						      d->d_name), &st), 0);
		size += st.st_size;
	}
	(void)closedir(dir);
	return size;
}

/* casidx_index_get_stats() of a reader: what it opened (the sealed
   files from their mappings) and, after lookups, what they decoded. */
static void check_open_stats(struct casidx_index *reader)
{
	struct casidx_index_stats st;
	struct casidx_segment **segs;
	unsigned int i, count, terms = 0;
	uint64_t image = 0;

	count = casidx_index_get_open_segments(reader, &segs);
	ck_assert_uint_gt(count, 1);
	for (i = 0; i < count; i++) {
		image += casidx_segment_get_size(segs[i]);
		terms += casidx_segment_term_count(segs[i]);
	}
	casidx_index_get_stats(reader, &st);
	ck_assert_uint_eq(st.segments_opened, count);
	ck_assert_uint_eq(st.file_bytes, seg_files_size());
	ck_assert_uint_eq(st.image_bytes, image);
	ck_assert_uint_eq(st.terms_total, terms);
	/* exact and prefix lookups read blocks, decode nothing */
	ck_assert_uint_eq(st.terms_decoded, 0);
	ck_assert_uint_eq(scan_count(reader, CASIDX_FIELD_BODY, "or",
				     CASIDX_MATCH_SUBSTRING, NULL), 32);
	casidx_index_get_stats(reader, &st);
	ck_assert_uint_eq(st.terms_decoded, terms);
	ck_assert_uint_eq(st.terms_signed, 0);
	ck_assert_uint_eq(scan_count(reader, CASIDX_FIELD_BODY, "ord",
				     CASIDX_MATCH_SUBSTRING, NULL), 32);
	casidx_index_get_stats(reader, &st);
	ck_assert_uint_eq(st.terms_decoded, terms);
	ck_assert_uint_eq(st.terms_signed, terms);
	/* a field with no terms decodes none */
	ck_assert_uint_eq(scan_count(reader, CASIDX_FIELD_SUBJECT, "ord",
				     CASIDX_MATCH_SUBSTRING, NULL), 0);
	casidx_index_get_stats(reader, &st);
	ck_assert_uint_eq(st.terms_decoded, terms);
	ck_assert_uint_eq(st.segments_opened, count);
}

static const struct casidx_index_settings test_set = {
	.no_fsync = TRUE,
	.merge_threshold = 100,
};

static void setup(void)
{
	char tmpl[] = "/tmp/check-casidx-XXXXXX";

	ck_assert_ptr_ne(mkdtemp(tmpl), NULL);
	test_dir = i_strdup(tmpl);
}

static void teardown(void)
{
	const char *error;

	(void)unlink_directory(test_dir, UNLINK_DIRECTORY_FLAG_RMDIR, &error);
	i_free_and_null(test_dir);
}

START_TEST(test_index_commit_refresh)
{
	struct casidx_index *w_index, *r_index;
	roaring_bitmap_t *all;
	const char *error;
	unsigned int terms;

	w_index = casidx_index_init(test_dir, &test_set);
	r_index = casidx_index_init(test_dir, &test_set);
	ck_assert_int_eq(casidx_index_refresh(r_index, &error), 0);
	ck_assert_uint_eq(casidx_index_get_last_uid(r_index), 0);

	index_docs(w_index, 1, 20);
	/* reader doesn't see it before refresh */
	ck_assert_uint_eq(casidx_index_get_last_uid(r_index), 0);
	ck_assert_int_eq(casidx_index_refresh(r_index, &error), 1);
	ck_assert_uint_eq(casidx_index_get_last_uid(r_index), 20);
	all = casidx_index_get_universe(r_index);
	/* docs without tokens (5, 10, ...) are in the universe */
	ck_assert_uint_eq(roaring_bitmap_get_cardinality(all), 20);
	ck_assert(roaring_bitmap_contains(all, 5));
	roaring_bitmap_free(all);

	ck_assert_uint_eq(scan_count(r_index, CASIDX_FIELD_BODY, "shared",
				     CASIDX_MATCH_EXACT, NULL), 16);
	ck_assert_uint_eq(scan_count(r_index, CASIDX_FIELD_BODY, "share",
				     CASIDX_MATCH_EXACT, NULL), 0);
	ck_assert_uint_eq(scan_count(r_index, CASIDX_FIELD_BODY, "word1",
				     CASIDX_MATCH_PREFIX, &terms), 9);
	/* word1, word11..word19 minus the token-less 10 and 15 */
	ck_assert_uint_eq(terms, 9);
	ck_assert_uint_eq(scan_count(r_index, CASIDX_FIELD_BODY, "ord1",
				     CASIDX_MATCH_SUBSTRING, NULL), 9);
	ck_assert_uint_eq(scan_count(r_index, CASIDX_FIELD_BODY, "hare",
				     CASIDX_MATCH_SUBSTRING, NULL), 16);
	ck_assert_uint_eq(scan_count(r_index, CASIDX_FIELD_SUBJECT, "shared",
				     CASIDX_MATCH_SUBSTRING, NULL), 0);

	index_docs(w_index, 21, 30);
	ck_assert_int_eq(casidx_index_refresh(r_index, &error), 1);
	ck_assert_uint_eq(casidx_index_get_last_uid(r_index), 30);
	ck_assert_uint_eq(casidx_index_get_segment_count(r_index), 2);
	ck_assert_uint_eq(scan_count(r_index, CASIDX_FIELD_BODY, "shared",
				     CASIDX_MATCH_EXACT, NULL), 24);
	casidx_index_deinit(&w_index);
	casidx_index_deinit(&r_index);
}
END_TEST

static void count_uid_cb(struct casidx_segment *seg ATTR_UNUSED,
			 const unsigned char *term ATTR_UNUSED,
			 size_t term_len ATTR_UNUSED,
			 const roaring_bitmap_t *docs,
			 const uint32_t *tfs, void *context)
{
	uint32_t *uid_tf = context;
	uint64_t rank;

	/* tfs[] follows the bitmap's order; rank is 1-based */
	if (roaring_bitmap_contains(docs, uid_tf[0])) {
		rank = roaring_bitmap_rank(docs, uid_tf[0]);
		uid_tf[1] += tfs[rank - 1];
	}
}

/* total tf of token for uid, summed over every segment holding it */
static uint32_t uid_tf(struct casidx_index *index, const char *token,
		       uint32_t uid)
{
	uint32_t ctx[2] = { uid, 0 };
	const char *error;

	ck_assert_int_ge(casidx_index_scan(index, CASIDX_FIELD_BODY, token,
					   strlen(token), CASIDX_MATCH_EXACT,
					   count_uid_cb, ctx, &error), 0);
	return ctx[1];
}

/* Two processes (indexer-worker and doveadm index) index the same new
   mails at once: each UID lands in the index once, whichever commits
   first, so term frequencies and lengths are not counted twice. */
START_TEST(test_index_overlapping_writers)
{
	struct casidx_index *a, *b, *r;
	struct casidx_index_writer *wa, *wb;
	const char *error;
	uint32_t uid;

	a = casidx_index_init(test_dir, &test_set);
	b = casidx_index_init(test_dir, &test_set);
	r = casidx_index_init(test_dir, &test_set);
	wa = casidx_index_writer_begin(a);
	wb = casidx_index_writer_begin(b);
	for (uid = 1; uid <= 8; uid++) {
		casidx_index_writer_add_doc(wb, uid);
		casidx_index_writer_add_term(wb, CASIDX_FIELD_BODY, "dup", 3);
		casidx_index_writer_add_term(wb, CASIDX_FIELD_BODY, "dup", 3);
		if (uid > 6)
			continue;
		casidx_index_writer_add_doc(wa, uid);
		casidx_index_writer_add_term(wa, CASIDX_FIELD_BODY, "dup", 3);
		casidx_index_writer_add_term(wa, CASIDX_FIELD_BODY, "dup", 3);
	}
	ck_assert_int_eq(casidx_index_writer_commit(&wb, &error), 0);
	ck_assert_int_eq(casidx_index_writer_commit(&wa, &error), 0);

	ck_assert_int_eq(casidx_index_refresh(r, &error), 1);
	/* the late writer had nothing new: no second segment */
	assert_snapshot(r, 8, 1, 8);
	for (uid = 1; uid <= 8; uid++)
		ck_assert_uint_eq(uid_tf(r, "dup", uid), 2);
	ck_assert(casidx_index_get_avg_len(r, CASIDX_FIELD_BODY) == 2.0);

	/* partly new: only UIDs above the committed last UID are added */
	wa = casidx_index_writer_begin(a);
	for (uid = 7; uid <= 10; uid++) {
		casidx_index_writer_add_doc(wa, uid);
		casidx_index_writer_add_term(wa, CASIDX_FIELD_BODY, "dup", 3);
		casidx_index_writer_add_term(wa, CASIDX_FIELD_BODY, "dup", 3);
	}
	ck_assert_int_eq(casidx_index_writer_commit(&wa, &error), 0);
	ck_assert_int_eq(casidx_index_optimize(a, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(r, &error), 1);
	ck_assert_uint_eq(casidx_index_get_last_uid(r), 10);
	for (uid = 1; uid <= 10; uid++)
		ck_assert_uint_eq(uid_tf(r, "dup", uid), 2);
	ck_assert_uint_eq(casidx_index_get_doc_len(r, 7, CASIDX_FIELD_BODY),
			  2);
	casidx_index_deinit(&a);
	casidx_index_deinit(&b);
	casidx_index_deinit(&r);
}
END_TEST

/* Commits that leave no segment: expunges in a mailbox nothing was
   indexed in yet (IMAP EXPUNGE before the indexer ran: it used to
   panic the imap process), optimize of an empty index, and a merge
   that drops every document. */
START_TEST(test_index_without_segments)
{
	struct casidx_index *index, *reader;
	struct casidx_index_writer *w;
	const char *error;
	uint32_t uid;

	index = casidx_index_init(test_dir, &test_set);
	w = casidx_index_writer_begin(index);
	casidx_index_writer_expunge(w, 3);
	ck_assert_int_eq(casidx_index_writer_commit(&w, &error), 0);
	ck_assert_uint_eq(casidx_index_get_segment_count(index), 0);
	ck_assert_uint_eq(casidx_index_get_last_uid(index), 0);
	ck_assert(roaring_bitmap_contains(casidx_index_get_expunged(index),
					  3));
	ck_assert_int_eq(casidx_index_optimize(index, &error), 0);
	ck_assert_uint_eq(casidx_index_get_segment_count(index), 0);

	/* everything indexed, then everything expunged and merged away */
	index_docs(index, 1, 6);
	ck_assert_uint_eq(casidx_index_get_segment_count(index), 1);
	w = casidx_index_writer_begin(index);
	for (uid = 1; uid <= 6; uid++)
		casidx_index_writer_expunge(w, uid);
	ck_assert_int_eq(casidx_index_writer_commit(&w, &error), 0);
	ck_assert_int_eq(casidx_index_optimize(index, &error), 0);
	ck_assert_uint_eq(casidx_index_get_segment_count(index), 0);
	ck_assert_uint_eq(count_seg_files(), 0);

	reader = casidx_index_init(test_dir, &test_set);
	ck_assert_int_eq(casidx_index_refresh(reader, &error), 1);
	/* no segment, and the indexed range is kept: Dovecot must not
	   index 1..6 again */
	assert_snapshot(reader, 6, 0, 0);
	ck_assert_uint_eq(scan_count(reader, CASIDX_FIELD_BODY, "shared",
				     CASIDX_MATCH_EXACT, NULL), 0);

	/* and the next mails index as usual */
	index_docs(index, 7, 8);
	ck_assert_int_eq(casidx_index_refresh(reader, &error), 1);
	ck_assert_uint_eq(casidx_index_get_last_uid(reader), 8);
	ck_assert_uint_eq(scan_count(reader, CASIDX_FIELD_BODY, "shared",
				     CASIDX_MATCH_EXACT, NULL), 2);
	casidx_index_deinit(&reader);
	casidx_index_deinit(&index);
}
END_TEST

/* One document may take half of the memory budget: its terms past
   that are dropped (and the writer says so), so a message of millions
   of distinct words cannot run the indexer out of memory; the next
   document is whole again. */
START_TEST(test_index_doc_memory_bound)
{
	struct casidx_index_settings set = test_set;
	struct casidx_index *index;
	struct casidx_index_writer *w;
	const char *error, *term;
	unsigned int i, n = 200000;

	set.memory_budget = 1024 * 1024;
	index = casidx_index_init(test_dir, &set);
	w = casidx_index_writer_begin(index);
	ck_assert_uint_eq(casidx_index_writer_doc_limit(w), 512 * 1024);
	casidx_index_writer_add_doc(w, 1);
	for (i = 0; i < n; i++) {
		term = t_strdup_printf("w%07u", i);
		casidx_index_writer_add_term(w, CASIDX_FIELD_BODY, term,
					     strlen(term));
	}
	ck_assert(casidx_index_writer_doc_truncated(w));
	ck_assert_int_eq(casidx_index_writer_doc_done(w, &error), 0);
	casidx_index_writer_add_doc(w, 2);
	ck_assert(!casidx_index_writer_doc_truncated(w));
	for (i = 0; i < 3; i++) {
		term = t_strdup_printf("w%07u", n - 1 - i);
		casidx_index_writer_add_term(w, CASIDX_FIELD_BODY, term,
					     strlen(term));
	}
	ck_assert(!casidx_index_writer_doc_truncated(w));
	ck_assert_int_eq(casidx_index_writer_commit(&w, &error), 0);

	/* the first words of doc 1 are found, its last ones only in 2 */
	refresh_ok(index);
	ck_assert_uint_eq(scan_count(index, CASIDX_FIELD_BODY, "w0000000",
				     CASIDX_MATCH_EXACT, NULL), 1);
	ck_assert_uint_eq(scan_count(index, CASIDX_FIELD_BODY, "w0000100",
				     CASIDX_MATCH_EXACT, NULL), 1);
	ck_assert_uint_eq(uid_tf(index, "w0199999", 1), 0);
	ck_assert_uint_eq(uid_tf(index, "w0199999", 2), 1);
	/* what was kept is a prefix of the document, below the bound */
	ck_assert_uint_lt(casidx_index_get_doc_len(index, 1,
						   CASIDX_FIELD_BODY), n / 2);
	ck_assert_uint_gt(casidx_index_get_doc_len(index, 1,
						   CASIDX_FIELD_BODY), 1000);
	casidx_index_deinit(&index);
}
END_TEST

START_TEST(test_index_expunge_and_optimize)
{
	struct casidx_index *index, *reader;
	struct casidx_index_writer *w;
	roaring_bitmap_t *all;
	const char *error;

	index = casidx_index_init(test_dir, &test_set);
	/* 12 then 8 docs: the tiered merge keeps them apart */
	index_docs(index, 1, 12);
	index_docs(index, 13, 20);
	w = casidx_index_writer_begin(index);
	casidx_index_writer_expunge(w, 1);
	casidx_index_writer_expunge(w, 12);
	casidx_index_writer_expunge(w, 25); /* not indexed yet */
	ck_assert_int_eq(casidx_index_writer_commit(&w, &error), 0);
	refresh_ok(index);
	all = casidx_index_get_universe(index);
	ck_assert_uint_eq(roaring_bitmap_get_cardinality(all), 18);
	ck_assert(!roaring_bitmap_contains(all, 12));
	roaring_bitmap_free(all);
	ck_assert_uint_eq(scan_count(index, CASIDX_FIELD_BODY, "word12",
				     CASIDX_MATCH_EXACT, NULL), 0);

	/* a reader on the old snapshot keeps working while optimize
	   deletes the files it has open */
	reader = casidx_index_init(test_dir, &test_set);
	ck_assert_int_eq(casidx_index_refresh(reader, &error), 1);
	ck_assert_int_eq(casidx_index_optimize(index, &error), 0);
	ck_assert_uint_eq(casidx_index_get_segment_count(index), 1);
	ck_assert_uint_eq(casidx_index_get_segment_count(reader), 2);
	ck_assert_uint_eq(scan_count(reader, CASIDX_FIELD_BODY, "shared",
				     CASIDX_MATCH_EXACT, NULL), 14);
	ck_assert_int_eq(casidx_index_refresh(reader, &error), 1);
	ck_assert_uint_eq(casidx_index_get_segment_count(reader), 1);
	ck_assert_uint_eq(scan_count(reader, CASIDX_FIELD_BODY, "shared",
				     CASIDX_MATCH_EXACT, NULL), 14);
	/* merged: 1 and 12 are physically gone, 25 stays pending */
	ck_assert(!roaring_bitmap_contains(casidx_index_get_expunged(reader),
					   12));
	ck_assert(roaring_bitmap_contains(casidx_index_get_expunged(reader),
					  25));
	all = casidx_index_get_universe(reader);
	ck_assert_uint_eq(roaring_bitmap_get_cardinality(all), 18);
	roaring_bitmap_free(all);
	ck_assert_uint_eq(casidx_index_get_doc_len(reader, 2,
						   CASIDX_FIELD_BODY), 2);
	casidx_index_deinit(&reader);
	casidx_index_deinit(&index);
}
END_TEST

START_TEST(test_index_auto_merge_and_budget)
{
	struct casidx_index_settings set = test_set;
	struct casidx_index *index;
	struct casidx_index_writer *w;
	const char *error;
	uint32_t uid;

	set.merge_threshold = 3;
	set.memory_budget = 2048;
	index = casidx_index_init(test_dir, &set);
	w = casidx_index_writer_begin(index);
	for (uid = 1; uid <= 200; uid++) {
		casidx_index_writer_add_doc(w, uid);
		casidx_index_writer_add_term(w, CASIDX_FIELD_BODY,
			t_strdup_printf("uniq%u", uid),
			strlen(t_strdup_printf("uniq%u", uid)));
		casidx_index_writer_add_term(w, CASIDX_FIELD_BODY, "all", 3);
		ck_assert_int_eq(casidx_index_writer_doc_done(w, &error), 0);
	}
	ck_assert_uint_gt(casidx_index_writer_get_flushes(w), 3);
	ck_assert_int_eq(casidx_index_writer_commit(&w, &error), 0);
	ck_assert_uint_le(casidx_index_get_segment_count(index), 3);
	/* merged-away segments, also those created by the merging commit,
	   are gone from disk */
	ck_assert_uint_eq(count_seg_files(),
			  casidx_index_get_segment_count(index));
	ck_assert_uint_eq(casidx_index_get_last_uid(index), 200);
	refresh_ok(index);
	ck_assert_uint_eq(scan_count(index, CASIDX_FIELD_BODY, "all",
				     CASIDX_MATCH_EXACT, NULL), 200);
	ck_assert_uint_eq(scan_count(index, CASIDX_FIELD_BODY, "uniq1",
				     CASIDX_MATCH_PREFIX, NULL), 111);
	casidx_index_deinit(&index);
}
END_TEST

/* One doc per commit (what autoindex does): tiered merging keeps the
   segment count logarithmic without a full rewrite per commit. */
START_TEST(test_index_tiered_merge)
{
	struct casidx_index *index;
	unsigned int max_segs = 0;
	uint32_t uid;

	index = casidx_index_init(test_dir, &test_set);
	for (uid = 1; uid <= 64; uid++) {
		index_docs(index, uid, uid);
		max_segs = I_MAX(max_segs,
				 casidx_index_get_segment_count(index));
		/* binary counter: at most one segment per bit of uid */
		ck_assert_uint_le(casidx_index_get_segment_count(index),
				  bits_required32(uid));
	}
	ck_assert_uint_ge(max_segs, 3);
	/* 64 = one full merge */
	ck_assert_uint_eq(casidx_index_get_segment_count(index), 1);
	ck_assert_uint_eq(count_seg_files(), 1);
	refresh_ok(index);
	ck_assert_uint_eq(scan_count(index, CASIDX_FIELD_BODY, "shared",
				     CASIDX_MATCH_EXACT, NULL), 64 - 12);
	casidx_index_deinit(&index);
}
END_TEST

/* Merges never read more than merge_max_bytes of segments, also under
   the segment-count cap and in optimize, so they stay memory-bounded. */
START_TEST(test_index_merge_bounded)
{
	struct casidx_index_settings set = test_set;
	struct casidx_index *index;
	const char *error;
	uint32_t uid;

	set.merge_threshold = 2;
	set.merge_max_bytes = 1500;
	index = casidx_index_init(test_dir, &set);
	for (uid = 1; uid <= 200; uid += 20)
		index_docs(index, uid, uid + 19);
	/* ~20-doc segments are ~1 KB: at most one fits a merge */
	ck_assert_uint_gt(casidx_index_get_segment_count(index), 5);
	ck_assert_int_eq(casidx_index_optimize(index, &error), 0);
	ck_assert_uint_gt(casidx_index_get_segment_count(index), 5);
	ck_assert_uint_eq(count_seg_files(),
			  casidx_index_get_segment_count(index));
	refresh_ok(index);
	ck_assert_uint_eq(scan_count(index, CASIDX_FIELD_BODY, "shared",
				     CASIDX_MATCH_EXACT, NULL), 160);
	casidx_index_deinit(&index);

	/* a large enough bound lets optimize merge them all */
	set.merge_max_bytes = 1024 * 1024;
	index = casidx_index_init(test_dir, &set);
	ck_assert_int_eq(casidx_index_refresh(index, &error), 1);
	ck_assert_int_eq(casidx_index_optimize(index, &error), 0);
	ck_assert_uint_eq(casidx_index_get_segment_count(index), 1);
	refresh_ok(index);
	ck_assert_uint_eq(scan_count(index, CASIDX_FIELD_BODY, "shared",
				     CASIDX_MATCH_EXACT, NULL), 160);
	casidx_index_deinit(&index);
}
END_TEST

static void index_docs_uv(struct casidx_index *index, uint32_t uid_validity,
			  uint32_t first, uint32_t last)
{
	struct casidx_index_writer *w = casidx_index_writer_begin(index);
	const char *error;
	uint32_t uid;

	casidx_index_writer_set_uid_validity(w, uid_validity);
	for (uid = first; uid <= last; uid++) {
		casidx_index_writer_add_doc(w, uid);
		casidx_index_writer_add_term(w, CASIDX_FIELD_BODY, "uv", 2);
	}
	ck_assert_int_eq(casidx_index_writer_commit(&w, &error), 0);
}

/* UIDs of another UIDVALIDITY name other messages: a commit under a new
   UIDVALIDITY starts the index over. */
START_TEST(test_index_uid_validity_change)
{
	struct casidx_index *index;
	roaring_bitmap_t *all;

	index = casidx_index_init(test_dir, &test_set);
	index_docs_uv(index, 100, 1, 5);
	index_docs_uv(index, 100, 6, 7);
	ck_assert_uint_eq(casidx_index_get_uid_validity(index), 100);
	ck_assert_uint_eq(casidx_index_get_last_uid(index), 7);
	index_docs_uv(index, 200, 1, 2);
	ck_assert_uint_eq(casidx_index_get_uid_validity(index), 200);
	ck_assert_uint_eq(casidx_index_get_last_uid(index), 2);
	refresh_ok(index);
	all = casidx_index_get_universe(index);
	ck_assert_uint_eq(roaring_bitmap_get_cardinality(all), 2);
	roaring_bitmap_free(all);
	ck_assert_uint_eq(count_seg_files(), 1);
	casidx_index_deinit(&index);
}
END_TEST

static void flip_file_byte(const char *path, off_t offset)
{
	unsigned char c;
	int fd = open(path, O_RDWR);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &c, 1, offset), 1);
	c ^= 0x01;
	ck_assert_int_eq(pwrite(fd, &c, 1, offset), 1);
	i_close_fd(&fd);
}

START_TEST(test_index_corruption_rejected)
{
	struct casidx_index *index;
	const char *error = NULL;

	index = casidx_index_init(test_dir, &test_set);
	index_docs(index, 1, 10);
	casidx_index_deinit(&index);

	/* a flipped bit in a segment's doc bitmap */
	flip_file_byte(t_strdup_printf("%s/seg-00000001.cxs", test_dir), 20);
	index = casidx_index_init(test_dir, &test_set);
	ck_assert_int_eq(casidx_index_refresh(index, &error), -1);
	ck_assert_ptr_ne(strstr(error, "checksum"), NULL);
	ck_assert(casidx_index_is_corrupted(index));
	ck_assert_uint_eq(casidx_index_get_segment_count(index), 0);
	flip_file_byte(t_strdup_printf("%s/seg-00000001.cxs", test_dir), 20);
	ck_assert_int_eq(casidx_index_refresh(index, &error), 1);
	ck_assert(!casidx_index_is_corrupted(index));

	/* a flipped bit in the manifest */
	flip_file_byte(t_strdup_printf("%s/manifest", test_dir), 17);
	casidx_index_deinit(&index);
	index = casidx_index_init(test_dir, &test_set);
	ck_assert_int_eq(casidx_index_refresh(index, &error), -1);
	ck_assert_ptr_ne(strstr(error, "manifest"), NULL);
	ck_assert(casidx_index_is_corrupted(index));

	/* delete = fresh start; the lock file stays (the same file: a
	   process waiting for the lock on it would otherwise get it while
	   another locks a new file of the name), nothing else does */
	{
		const char *lock_path = t_strdup_printf("%s/write.lock",
							test_dir);
		struct stat st1, st2;
		DIR *dir;
		struct dirent *d;
		unsigned int others = 0;

		ck_assert_int_eq(stat(lock_path, &st1), 0);
		ck_assert_int_eq(casidx_index_delete(index, &error), 0);
		ck_assert_int_eq(stat(lock_path, &st2), 0);
		ck_assert(st1.st_ino == st2.st_ino);
		dir = opendir(test_dir);
		ck_assert_ptr_nonnull(dir);
		while ((d = readdir(dir)) != NULL) {
			if (d->d_name[0] != '.' &&
			    strcmp(d->d_name, "write.lock") != 0)
				others++;
		}
		closedir(dir);
		ck_assert_uint_eq(others, 0);
	}
	ck_assert_int_eq(casidx_index_refresh(index, &error), 0);
	index_docs(index, 1, 3);
	ck_assert_uint_eq(casidx_index_get_last_uid(index), 3);
	casidx_index_deinit(&index);
}
END_TEST

static void copy_fixture(unsigned int version, const char *name)
{
	check_fixture_copy(t_strdup_printf("casidx-v%u", version), name,
			   test_dir);
}

/* An index written by the format-1 or format-2 code
   (tests/fixtures/casidx-v1, -v2) is an old format: never read for
   answers, reported so the backend rebuilds it with an info line, and a
   fresh index works after the delete. */
START_TEST(test_index_old_format_rebuilt)
{
	struct casidx_index *index;
	const char *error = NULL;
	unsigned int version = _i + 1;

	copy_fixture(version, "manifest");
	copy_fixture(version, "seg-00000001.cxs");
	index = casidx_index_init(test_dir, &test_set);
	ck_assert_int_eq(casidx_index_refresh(index, &error), -1);
	ck_assert_ptr_ne(strstr(error, t_strdup_printf(
		"old index format version %u (now 3)", version)), NULL);
	ck_assert(casidx_index_is_corrupted(index));
	ck_assert(casidx_index_is_old_format(index));
	ck_assert_uint_eq(casidx_index_get_last_uid(index), 0);
	ck_assert_uint_eq(casidx_index_get_segment_count(index), 0);

	ck_assert_int_eq(casidx_index_delete(index, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(index, &error), 0);
	ck_assert(!casidx_index_is_old_format(index));
	index_docs(index, 1, 2);
	ck_assert_uint_eq(casidx_index_get_last_uid(index), 2);
	casidx_index_deinit(&index);

	/* the current format is not mistaken for an old one */
	index = casidx_index_init(test_dir, &test_set);
	ck_assert_int_eq(casidx_index_refresh(index, &error), 1);
	ck_assert(!casidx_index_is_old_format(index));
	casidx_index_deinit(&index);
}
END_TEST

/* TRUE if some file of the index directory contains needle. */
static bool dir_has(const char *needle)
{
	struct dirent *d;
	bool found = FALSE;
	DIR *dir = opendir(test_dir);

	ck_assert_ptr_ne(dir, NULL);
	while (!found && (d = readdir(dir)) != NULL) {
		const char *path = t_strdup_printf("%s/%s", test_dir,
						   d->d_name);
		buffer_t *buf = t_buffer_create(4096);
		unsigned char tmp[4096];
		ssize_t n;
		int fd;

		if (d->d_name[0] == '.' || (fd = open(path, O_RDONLY)) < 0)
			continue;
		while ((n = read(fd, tmp, sizeof(tmp))) > 0)
			buffer_append(buf, tmp, n);
		i_close_fd(&fd);
		found = mem_has(buf->data, buf->used, needle);
	}
	(void)closedir(dir);
	return found;
}

static struct casidx_index *
index_init_crypt(const struct cas_keyring *kr, const char *guid)
{
	struct casidx_index *index = casidx_index_init(test_dir, &test_set);

	if (kr != NULL)
		casidx_index_set_crypt(index, kr, guid);
	return index;
}

static void fixture_scan_cb(struct casidx_segment *seg ATTR_UNUSED,
			    const unsigned char *term ATTR_UNUSED,
			    size_t term_len ATTR_UNUSED,
			    const roaring_bitmap_t *docs,
			    const uint32_t *tfs ATTR_UNUSED, void *context)
{
	roaring_bitmap_t **docs_r = context;

	*docs_r = roaring_bitmap_copy(docs);
}

/* A segment written before positions (version 1, by the format-3 code:
   tests/fixtures/casidx-v3) is read as it is, without positions; the
   next merge that takes it in rewrites it in the current version. */
START_TEST(test_segment_v1_readable)
{
	struct casidx_index *index;
	const char *error = NULL;
	struct casidx_segment **segs;
	roaring_bitmap_t *docs = NULL;

	copy_fixture(3, "manifest");
	copy_fixture(3, "seg-00000001.cxs");
	index = casidx_index_init(test_dir, &test_set);
	ck_assert_int_eq(casidx_index_refresh(index, &error), 1);
	ck_assert(!casidx_index_is_old_format(index));
	ck_assert_uint_eq(casidx_index_get_last_uid(index), 2);
	ck_assert_uint_eq(casidx_index_get_open_segments(index, &segs), 1);
	ck_assert(!casidx_segment_has_positions(segs[0]));
	/* written before dtgrams: every doc of it counts as DTPARTIAL */
	ck_assert(!casidx_segment_has_dtgrams(segs[0]));
	docs = roaring_bitmap_create();
	casidx_index_add_docs_without_dtgrams(index, docs);
	ck_assert_uint_eq(roaring_bitmap_get_cardinality(docs), 2);
	ck_assert_int_eq(casidx_index_lookup_dtgram(index, CASIDX_FIELD_BODY,
						    "\xC2\xA1\xC2\xB0", 4,
						    docs, &error), 0);
	roaring_bitmap_free(docs);
	docs = NULL;
	ck_assert_int_eq(casidx_index_scan(index, CASIDX_FIELD_BODY, "fox", 3,
					   CASIDX_MATCH_EXACT, fixture_scan_cb,
					   &docs, &error), 1);
	ck_assert_uint_eq(roaring_bitmap_get_cardinality(docs), 1);
	ck_assert(roaring_bitmap_contains(docs, 1));
	roaring_bitmap_free(docs);
	/* a new segment, then a merge of both */
	index_docs(index, 3, 4);
	ck_assert_int_eq(casidx_index_optimize(index, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(index, &error), 1);
	ck_assert_uint_eq(casidx_index_get_open_segments(index, &segs), 1);
	ck_assert(casidx_segment_has_positions(segs[0]));
	/* the merged segment has dtgrams, and says which docs lack them:
	   the old ones, in every field */
	ck_assert(casidx_segment_has_dtgrams(segs[0]));
	docs = roaring_bitmap_create();
	casidx_index_add_docs_without_dtgrams(index, docs);
	ck_assert(roaring_bitmap_is_empty(docs));
	roaring_bitmap_free(docs);
	docs = NULL;
	ck_assert_int_eq(casidx_index_scan(index, CASIDX_FIELD_HEADER,
					   CASIDX_TERM_DTPARTIAL,
					   CASIDX_TERM_MARKER_LEN,
					   CASIDX_MATCH_EXACT, fixture_scan_cb,
					   &docs, &error), 1);
	ck_assert_uint_eq(roaring_bitmap_get_cardinality(docs), 2);
	ck_assert(roaring_bitmap_contains(docs, 1));
	ck_assert(roaring_bitmap_contains(docs, 2));
	roaring_bitmap_free(docs);
	docs = NULL;
	ck_assert_int_eq(casidx_index_scan(index, CASIDX_FIELD_BODY, "dog", 3,
					   CASIDX_MATCH_EXACT, fixture_scan_cb,
					   &docs, &error), 1);
	ck_assert_uint_eq(roaring_bitmap_get_cardinality(docs), 1);
	ck_assert(roaring_bitmap_contains(docs, 2));
	roaring_bitmap_free(docs);
	casidx_index_deinit(&index);
}
END_TEST

START_TEST(test_index_encrypted)
{
	struct cas_keyring *ka = cas_keyring_create_from_kek(kek_a);
	struct cas_keyring *kb = cas_keyring_create_from_kek(kek_b);
	struct casidx_index *index, *reader;
	const char *error;

	index = index_init_crypt(ka, GUID_A);
	ck_assert(casidx_index_is_encrypted(index));
	index_docs(index, 1, 20);
	index_docs(index, 21, 30);
	ck_assert_int_eq(casidx_index_optimize(index, &error), 0);
	index_docs(index, 31, 40);
	ck_assert(!dir_has("shared"));
	ck_assert(!dir_has("word1"));

	reader = index_init_crypt(ka, GUID_A);
	ck_assert_int_eq(casidx_index_refresh(reader, &error), 1);
	ck_assert_uint_eq(casidx_index_get_last_uid(reader), 40);
	ck_assert_uint_eq(scan_count(reader, CASIDX_FIELD_BODY, "shared",
				     CASIDX_MATCH_EXACT, NULL), 32);
	ck_assert_uint_eq(scan_count(reader, CASIDX_FIELD_BODY, "word3",
				     CASIDX_MATCH_PREFIX, NULL), 9);
	check_open_stats(reader);
	casidx_index_deinit(&reader);

	/* other key, other mailbox, no key: corrupted (= rebuild) */
	reader = index_init_crypt(kb, GUID_A);
	ck_assert_int_eq(casidx_index_refresh(reader, &error), -1);
	ck_assert_ptr_ne(strstr(error, "authentication failed"), NULL);
	ck_assert(casidx_index_is_corrupted(reader));
	casidx_index_deinit(&reader);
	reader = index_init_crypt(ka, GUID_B);
	ck_assert_int_eq(casidx_index_refresh(reader, &error), -1);
	ck_assert(casidx_index_is_corrupted(reader));
	casidx_index_deinit(&reader);
	reader = index_init_crypt(NULL, NULL);
	ck_assert_int_eq(casidx_index_refresh(reader, &error), -1);
	ck_assert(casidx_index_is_corrupted(reader));
	casidx_index_deinit(&reader);
	casidx_index_deinit(&index);

	/* a plaintext index is not accepted once encryption is on */
	index = index_init_crypt(NULL, NULL);
	ck_assert_int_eq(casidx_index_delete(index, &error), 0);
	index_docs(index, 1, 5);
	ck_assert(dir_has("shared"));
	casidx_index_deinit(&index);
	reader = index_init_crypt(ka, GUID_A);
	ck_assert_int_eq(casidx_index_refresh(reader, &error), -1);
	ck_assert(casidx_index_is_corrupted(reader));
	ck_assert_int_eq(casidx_index_delete(reader, &error), 0);
	ck_assert_int_eq(casidx_index_refresh(reader, &error), 0);
	index_docs(reader, 1, 5);
	ck_assert(!dir_has("shared"));
	casidx_index_deinit(&reader);
	cas_keyring_free(&ka);
	cas_keyring_free(&kb);
}
END_TEST

/* Two processes commit at once: the lock serialises them and no commit
   is lost. Meanwhile a reader refreshes continuously and every snapshot
   it sees is complete: all UIDs 1..last_uid present, none missing. */
/* Like Dovecot's indexers: read the last indexed UID, index the next
   few mails of a mailbox of total mails, commit. Two of these race over
   the same UIDs. */
static void child_writer(uint32_t total, bool optimize)
{
	struct casidx_index_settings set = test_set;
	struct casidx_index *index;
	const char *error;
	unsigned int i = 0;
	uint32_t uid, base;

	set.merge_threshold = 4;
	index = casidx_index_init(test_dir, &set);
	for (;;) {
		struct casidx_index_writer *w;

		if (casidx_index_refresh(index, &error) < 0)
			_exit(3);
		base = casidx_index_get_last_uid(index);
		if (base >= total)
			break;
		w = casidx_index_writer_begin(index);
		for (uid = base + 1; uid <= I_MIN(base + 3, total); uid++) {
			casidx_index_writer_add_doc(w, uid);
			casidx_index_writer_add_term(w, CASIDX_FIELD_BODY,
						     "conc", 4);
		}
		if (casidx_index_writer_commit(&w, &error) < 0)
			_exit(1);
		if (optimize && i++ % 7 == 0 &&
		    casidx_index_optimize(index, &error) < 0)
			_exit(2);
	}
	casidx_index_deinit(&index);
	_exit(0);
}

START_TEST(test_index_concurrent_writers_and_reader)
{
	struct casidx_index *reader;
	roaring_bitmap_t *all;
	const char *error;
	unsigned int rounds = 60, snapshots = 0, i;
	pid_t pids[2];
	int status, alive = 2;

	for (i = 0; i < 2; i++) {
		pids[i] = fork();
		ck_assert_int_ge(pids[i], 0);
		if (pids[i] == 0)
			child_writer(2 * rounds, i == 1);
	}
	reader = casidx_index_init(test_dir, &test_set);
	while (alive > 0) {
		ck_assert_int_ge(casidx_index_refresh(reader, &error), 0);
		all = casidx_index_get_universe(reader);
		/* whoever commits, a snapshot holds exactly 1..last_uid */
		ck_assert_uint_eq(roaring_bitmap_get_cardinality(all),
				  casidx_index_get_last_uid(reader));
		ck_assert_uint_eq(roaring_bitmap_get_cardinality(all),
				  scan_count(reader, CASIDX_FIELD_BODY, "conc",
					     CASIDX_MATCH_EXACT, NULL));
		roaring_bitmap_free(all);
		snapshots++;
		for (i = 0; i < 2; i++) {
			if (pids[i] > 0 &&
			    waitpid(pids[i], &status, WNOHANG) == pids[i]) {
				ck_assert(WIFEXITED(status));
				ck_assert_int_eq(WEXITSTATUS(status), 0);
				pids[i] = 0;
				alive--;
			}
		}
	}
	ck_assert_int_eq(casidx_index_refresh(reader, &error), 1);
	all = casidx_index_get_universe(reader);
	ck_assert_uint_eq(roaring_bitmap_get_cardinality(all), 2 * rounds);
	ck_assert_uint_eq(roaring_bitmap_maximum(all), 2 * rounds);
	roaring_bitmap_free(all);
	/* no UID indexed by both writers counts twice */
	for (i = 1; i <= 2 * rounds; i++)
		ck_assert_uint_eq(uid_tf(reader, "conc", i), 1);
	ck_assert_uint_le(casidx_index_get_segment_count(reader), 5);
	ck_assert_uint_eq(count_seg_files(),
			  casidx_index_get_segment_count(reader));
	ck_assert_uint_gt(snapshots, 0);
	casidx_index_deinit(&reader);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("casidx-postings");
	TCase *tc = tcase_create("segment");
	TCase *tci = tcase_create("index");
	int failed;

	lib_init();
	tcase_add_test(tc, test_segment_roundtrip);
	tcase_add_test(tc, test_segment_deterministic);
	tcase_add_test(tc, test_positions_roundtrip);
	tcase_add_test(tc, test_part_codes_roundtrip);
	tcase_add_test(tc, test_positions_damage);
	tcase_add_test(tc, test_segment_every_byte_flip_rejected);
	tcase_add_test(tc, test_builder_long_and_nul_terms);
	tcase_add_test(tc, test_substring_lookup_matches_scan);
	tcase_add_test(tc, test_namespace_arenas);
	tcase_add_test(tc, test_termsig_candidates);
	tcase_add_test(tc, test_sealed_segment_roundtrip);
	tcase_add_test(tc, test_sealed_v2_hostile_frames);
	tcase_add_test(tc, test_sealed_v1_fixture);
	suite_add_tcase(s, tc);
	tcase_add_checked_fixture(tci, setup, teardown);
	tcase_add_test(tci, test_index_commit_refresh);
	tcase_add_test(tci, test_index_without_segments);
	tcase_add_test(tci, test_index_doc_memory_bound);
	tcase_add_test(tci, test_index_expunge_and_optimize);
	tcase_add_test(tci, test_index_auto_merge_and_budget);
	tcase_add_test(tci, test_index_tiered_merge);
	tcase_add_test(tci, test_index_uid_validity_change);
	tcase_add_test(tci, test_index_merge_bounded);
	tcase_add_test(tci, test_index_corruption_rejected);
	tcase_add_loop_test(tci, test_index_old_format_rebuilt, 0, 2);
	tcase_add_test(tci, test_segment_v1_readable);
	tcase_add_test(tci, test_index_encrypted);
	tcase_add_test(tci, test_index_concurrent_writers_and_reader);
	tcase_add_test(tci, test_index_overlapping_writers);
	suite_add_tcase(s, tci);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
