/* Delta frames (frame version 3, doc/casbox-format.md "Frame version
   3"): blobs compressed against a base blob's plaintext round-trip
   byte-exact (empty, tiny, one chunk, many chunks, base larger and
   smaller than the blob, incompressible data, a chain of depth 2); a
   base that does not help is not used and never makes a frame bigger;
   a wrong base, a base id swapped in the header (valid CRC), a flipped
   byte in a delta chunk, a truncated frame, a missing or damaged base
   each fail with a clear error and never return wrong bytes; the
   version 3 blob record round-trips and old versions still import; the
   keyless scan reports the masked base id, which the DEK unmasks; the
   decoded base cache keeps its bound, evicts least recently used
   entries, serves sequential reads without decoding a base twice and
   wipes what it frees. */

#include "lib.h"
#include "buffer.h"
#include "istream.h"
#include "byteorder.h"
#include "cas-key.h"
#include "cas-aead.h"
#include "cas-crc32c.h"
#include "casbox-pack.h"
#include "casbox-frame.h"
#include "casbox-base-cache.h"
#include "casbox-base-arena.h"

#include <check.h>
#include "check-run.h"
#include <sodium.h>
#include <stdlib.h>
#include <stdio.h>
#include <fcntl.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/check-frame-base.XXXXXX";
static struct cas_keyring *keyring;

static void setup(void)
{
	unsigned char kek[CAS_KEK_SIZE];

	strcpy(tmpdir, "/tmp/check-frame-base.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
	memset(kek, 1, sizeof(kek));
	keyring = cas_keyring_create_from_kek(kek);
}

static void teardown(void)
{
	ck_assert_int_eq(system(t_strdup_printf("rm -rf '%s'", tmpdir)), 0);
	cas_keyring_free(&keyring);
}

static struct casbox_pack_store *store_open(void)
{
	struct casbox_pack_settings set;
	struct casbox_pack_store *store;
	const char *error;

	i_zero(&set);
	set.dir = t_strdup_printf("%s/packs", tmpdir);
	if (casbox_pack_store_open(&set, keyring, &store, &error) < 0)
		ck_abort_msg("store open: %s", error);
	return store;
}

/* Text-like bytes from a seed, or noise. */
static buffer_t *pattern(size_t size, unsigned int seed, bool noise)
{
	buffer_t *buf = buffer_create_dynamic(default_pool, size + 1);
	uint32_t x = seed * 2654435761U + 1;
	size_t i;

	for (i = 0; i < size; i++) {
		x = x * 1103515245U + 12345U;
		buffer_append_c(buf, noise ? (unsigned char)(x >> 16) :
				(unsigned char)"abcdefgh \r\n"[(x >> 16) % 11]);
	}
	return buf;
}

static void append_pattern(buffer_t *dest, size_t size, unsigned int seed,
			   bool noise)
{
	buffer_t *buf = pattern(size, seed, noise);

	buffer_append_buf(dest, buf, 0, SIZE_MAX);
	buffer_free(&buf);
}

/* A reply: some new text, then the base quoted, then a bit more. */
static buffer_t *reply_of(const buffer_t *base, size_t new_size,
			  unsigned int seed)
{
	buffer_t *buf = pattern(new_size, seed, FALSE);

	buffer_append_buf(buf, base, 0, SIZE_MAX);
	buffer_append(buf, "\r\n-- \r\nsig\r\n", 11);
	return buf;
}

struct blob {
	struct cas_blob_id id;
	struct casbox_blob_record rec;
	buffer_t *data;
};

#define MAX_BLOBS 8
static struct blob blobs[MAX_BLOBS];
static unsigned int blob_count;

static int lookup(void *context ATTR_UNUSED, const struct cas_blob_id *id,
		  struct casbox_blob_record *rec_r, const char **error_r)
{
	unsigned int i;

	for (i = 0; i < blob_count; i++) {
		if (memcmp(blobs[i].id.id, id->id, CAS_BLOB_ID_SIZE) == 0) {
			*rec_r = blobs[i].rec;
			return 1;
		}
	}
	*error_r = "not in the test's records";
	return 0;
}

/* Add data with an optional earlier blob as base; remembered for
   lookup(). */
static struct blob *
add_blob(struct casbox_pack_store *store, buffer_t *data,
	 const struct blob *base)
{
	struct casbox_pack_base pbase;
	struct casbox_pack_txn *txn;
	struct istream *input;
	struct blob *b;
	const char *error;

	ck_assert_uint_lt(blob_count, MAX_BLOBS);
	b = &blobs[blob_count++];
	b->data = data;
	cas_blob_id_compute(keyring, data->data, data->used, &b->id);
	if (base != NULL) {
		i_zero(&pbase);
		pbase.id = base->id;
		pbase.plain_size = base->data->used;
		pbase.depth = base->rec.base_depth;
		pbase.data = base->data->data;
		pbase.size = base->data->used;
	}
	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	input = i_stream_create_from_data(data->data, data->used);
	if (casbox_pack_txn_add_base(txn, &b->id, input,
				     base == NULL ? NULL : &pbase, &b->rec,
				     &error) < 0)
		ck_abort_msg("add: %s", error);
	i_stream_unref(&input);
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
	return b;
}

static void blobs_free(void)
{
	unsigned int i;

	for (i = 0; i < blob_count; i++)
		buffer_free(&blobs[i].data);
	blob_count = 0;
}

/* Read through open_chain. Returns 0 ok (bytes in out), -1 error. */
static int read_chain(struct casbox_pack_store *store, const struct blob *b,
		      buffer_t *out, const char **error_r)
{
	struct istream *input;
	const unsigned char *data;
	size_t size;
	int ret;

	buffer_set_used_size(out, 0);
	if (casbox_pack_blob_open_chain(store, &b->id, &b->rec, lookup, NULL,
					&input, error_r) < 0)
		return -1;
	while ((ret = i_stream_read_more(input, &data, &size)) > 0) {
		buffer_append(out, data, size);
		i_stream_skip(input, size);
	}
	ck_assert_int_eq(ret, -1);
	ret = input->stream_errno == 0 ? 0 : -1;
	if (ret < 0) {
		ck_assert_int_eq(input->stream_errno, EIO);
		*error_r = t_strdup(i_stream_get_error(input));
	}
	i_stream_unref(&input);
	return ret;
}

static void assert_reads(struct casbox_pack_store *store, const struct blob *b)
{
	buffer_t *out = buffer_create_dynamic(default_pool, 1024);
	const char *error;

	if (read_chain(store, b, out, &error) < 0)
		ck_abort_msg("read: %s", error);
	ck_assert(buffer_cmp(out, b->data));
	buffer_free(&out);
}

static void assert_fails(struct casbox_pack_store *store,
			 const struct blob *b, const char *expect)
{
	buffer_t *out = buffer_create_dynamic(default_pool, 1024);
	const char *error = NULL;

	if (read_chain(store, b, out, &error) == 0)
		ck_abort_msg("read of a damaged delta succeeded");
	if (strstr(error, expect) == NULL)
		ck_abort_msg("error '%s' does not say '%s'", error, expect);
	/* nothing after the damage: never bytes that differ */
	ck_assert_uint_le(out->used, b->data->used);
	ck_assert_int_eq(memcmp(out->data, b->data->data, out->used), 0);
	buffer_free(&out);
}

static const char *pack_file(uint32_t pack_id)
{
	return t_strdup_printf("%s/packs/pack-%08u.cbp", tmpdir, pack_id);
}

static void pack_pread(const struct casbox_blob_record *rec, void *buf,
		       size_t size, uint64_t frame_off)
{
	int fd = open(pack_file(rec->pack_id), O_RDONLY);

	ck_assert_int_ne(fd, -1);
	ck_assert_int_eq(pread(fd, buf, size, rec->offset + frame_off),
			 (ssize_t)size);
	i_close_fd(&fd);
}

static void pack_pwrite(const struct casbox_blob_record *rec,
			const void *buf, size_t size, uint64_t frame_off)
{
	int fd = open(pack_file(rec->pack_id), O_WRONLY);

	ck_assert_int_ne(fd, -1);
	ck_assert_int_eq(pwrite(fd, buf, size, rec->offset + frame_off),
			 (ssize_t)size);
	i_close_fd(&fd);
}

static uint8_t frame_version(const struct casbox_blob_record *rec)
{
	unsigned char hdr[5];

	pack_pread(rec, hdr, sizeof(hdr), 0);
	return hdr[4];
}

/* Every size class, with the base larger and smaller than the blob:
   byte-exact, and a delta whenever it is chosen is smaller than the
   same blob alone. */
START_TEST(test_roundtrip)
{
	static const size_t base_sizes[] = { 1, 700, 40000, 200000 };
	static const size_t new_sizes[] = { 0, 5, 3000, 70000 };
	struct casbox_pack_store *store = store_open();
	struct blob *base, *alone, *delta;
	unsigned int i, j, deltas = 0;

	for (i = 0; i < N_ELEMENTS(base_sizes); i++) {
		for (j = 0; j < N_ELEMENTS(new_sizes); j++) T_BEGIN {
			base = add_blob(store, pattern(base_sizes[i], i, FALSE),
					NULL);
			ck_assert_uint_eq(base->rec.base_depth, 0);
			alone = add_blob(store, reply_of(base->data,
				new_sizes[j], 100 + j), NULL);
			delta = add_blob(store, reply_of(base->data,
				new_sizes[j], 100 + j), base);
			assert_reads(store, base);
			assert_reads(store, delta);
			/* never bigger than without the base */
			ck_assert_uint_le(delta->rec.frame_size,
					  alone->rec.frame_size);
			if (delta->rec.base_depth != 0) {
				deltas++;
				ck_assert_uint_eq(frame_version(&delta->rec),
						  3);
				ck_assert(memcmp(delta->rec.base_id.id,
						 base->id.id,
						 CAS_BLOB_ID_SIZE) == 0);
				ck_assert_uint_lt(delta->rec.frame_size,
						  alone->rec.frame_size);
			} else {
				ck_assert_uint_eq(frame_version(&delta->rec),
						  2);
			}
			/* the choice is made at chunk 0: a quote that
			   starts after 64 KiB of new text is not used */
			ck_assert_uint_eq(delta->rec.base_depth != 0,
					  base_sizes[i] >= 700 &&
					  new_sizes[j] < CASBOX_CHUNK_SIZE);
			blobs_free();
		} T_END;
	}
	ck_assert_uint_eq(deltas, 9);
	casbox_pack_store_close(&store);
}
END_TEST

/* Incompressible blob and base: the base cannot help, no delta; an
   empty blob: no delta; a blob offered itself as base: no delta. A
   base shorter than its prefix is refused. */
START_TEST(test_no_gain)
{
	struct casbox_pack_store *store = store_open();
	struct casbox_pack_base pbase;
	struct casbox_pack_txn *txn;
	struct casbox_blob_record rec;
	struct istream *input;
	struct blob *base, *b;
	const char *error;

	base = add_blob(store, pattern(100000, 1, TRUE), NULL);
	b = add_blob(store, pattern(150000, 2, TRUE), base);
	ck_assert_uint_eq(b->rec.base_depth, 0);
	assert_reads(store, b);
	b = add_blob(store, buffer_create_dynamic(default_pool, 1), base);
	ck_assert_uint_eq(b->rec.base_depth, 0);
	assert_reads(store, b);
	/* noise, with the base's noise in its second chunk only: chunk 0
	   decides against the base */
	b = add_blob(store, pattern(70000, 3, TRUE), base);
	buffer_append_buf(b->data, base->data, 0, SIZE_MAX);
	blob_count--;
	b = add_blob(store, b->data, base);
	ck_assert_uint_eq(b->rec.base_depth, 0);
	assert_reads(store, b);

	/* data shorter than the base's prefix: an error, nothing written */
	i_zero(&pbase);
	pbase.id = base->id;
	pbase.plain_size = base->data->used;
	pbase.data = base->data->data;
	pbase.size = base->data->used - 1;
	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	input = i_stream_create_from_data("x", 1);
	ck_assert_int_eq(casbox_pack_txn_add_base(txn, &base->id, input,
						  &pbase, &rec, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "prefix"));
	i_stream_unref(&input);
	casbox_pack_txn_rollback(&txn);
	blobs_free();
	casbox_pack_store_close(&store);
}
END_TEST

/* A delta whose first chunk quotes the base and whose later chunks are
   noise: those chunks are stored without the prefix (smaller), and the
   whole reads back. A many-chunk delta against a 1 MiB+ base uses
   only its first CASBOX_BASE_PREFIX_MAX bytes. */
START_TEST(test_mixed_chunks)
{
	struct casbox_pack_store *store = store_open();
	struct blob *base, *b, *big;
	buffer_t *data;

	base = add_blob(store, pattern(30000, 4, FALSE), NULL);
	data = reply_of(base->data, 100, 5);
	append_pattern(data, 200000, 6, TRUE);
	b = add_blob(store, data, base);
	ck_assert_uint_eq(b->rec.base_depth, 1);
	assert_reads(store, b);

	big = add_blob(store, pattern(CASBOX_BASE_PREFIX_MAX + 300000, 7,
				      FALSE), NULL);
	data = buffer_create_dynamic(default_pool, 400000);
	buffer_append(data, CONST_PTR_OFFSET(big->data->data, 1000), 300000);
	b = add_blob(store, data, big);
	ck_assert_uint_eq(b->rec.base_depth, 1);
	ck_assert_uint_lt(b->rec.frame_size, 300000 / 10);
	assert_reads(store, b);
	blobs_free();
	casbox_pack_store_close(&store);
}
END_TEST

/* A chain: c against b against a; d against c is refused as too deep
   (written without a base). Reading c decodes a and b once. */
START_TEST(test_chain_depth)
{
	struct casbox_pack_store *store = store_open();
	struct casbox_base_cache *cache =
		casbox_pack_store_get_base_cache(store);
	struct blob *a, *b, *c, *d;
	unsigned int entries;
	uint64_t chunks;
	size_t bytes;

	a = add_blob(store, pattern(20000, 8, FALSE), NULL);
	b = add_blob(store, reply_of(a->data, 2000, 9), a);
	c = add_blob(store, reply_of(b->data, 2000, 10), b);
	d = add_blob(store, reply_of(c->data, 2000, 11), c);
	ck_assert_uint_eq(b->rec.base_depth, 1);
	ck_assert_uint_eq(c->rec.base_depth, 2);
	ck_assert_uint_eq(d->rec.base_depth, 0);
	chunks = casbox_pack_get_chunks_decoded();
	assert_reads(store, c);
	/* a, b (the bases) and c: one chunk each */
	ck_assert_uint_eq(casbox_pack_get_chunks_decoded() - chunks, 3);
	casbox_base_cache_get_stats(cache, &entries, &bytes);
	ck_assert_uint_eq(entries, 2);
	ck_assert_uint_eq(bytes, a->data->used + b->data->used);
	/* again: the bases come from the cache */
	chunks = casbox_pack_get_chunks_decoded();
	assert_reads(store, c);
	ck_assert_uint_eq(casbox_pack_get_chunks_decoded() - chunks, 1);
	assert_reads(store, d);
	blobs_free();
	casbox_pack_store_close(&store);
}
END_TEST

/* A record that claims another base, or a base id swapped into the
   header (valid CRC), or a base with the right id but other bytes: each
   a clear error, never wrong data. */
START_TEST(test_wrong_base)
{
	struct casbox_pack_store *store = store_open();
	struct blob *a, *a2, *b, *b2;
	struct casbox_base_plain *plain;
	struct istream *input;
	unsigned char hdr[CASBOX_FRAME_V3_HEADER_SIZE];
	unsigned char hdr2[CASBOX_FRAME_V3_HEADER_SIZE];
	struct casbox_blob_record saved;
	buffer_t *out = buffer_create_dynamic(default_pool, 1024);
	unsigned char dek[CAS_DEK_SIZE], subkey[CAS_AEAD_SUBKEY_SIZE];
	const char *error;

	a = add_blob(store, pattern(20000, 12, FALSE), NULL);
	a2 = add_blob(store, pattern(20000, 13, FALSE), NULL);
	b = add_blob(store, reply_of(a->data, 500, 14), a);
	b2 = add_blob(store, reply_of(a2->data, 500, 14), a2);
	ck_assert_uint_eq(b->rec.base_depth, 1);
	ck_assert_uint_eq(b2->rec.base_depth, 1);
	assert_reads(store, b);

	/* the record points at another existing base */
	saved = b->rec;
	b->rec.base_id = a2->id;
	assert_fails(store, b, "the frame's base is not base");
	b->rec = saved;

	/* the masked base id of b2's frame in b's header, CRC fixed */
	pack_pread(&b->rec, hdr, sizeof(hdr), 0);
	pack_pread(&b2->rec, hdr2, sizeof(hdr2), 0);
	memcpy(hdr + 80, hdr2 + 80, CAS_BLOB_ID_SIZE);
	cpu32_to_le_unaligned(cas_crc32c_mask(cas_crc32c(hdr, 112)),
			      hdr + 112);
	pack_pwrite(&b->rec, hdr, sizeof(hdr), 0);
	assert_fails(store, b, "the frame's base is not base");
	/* masked for this frame (the DEK's subkey), and the record
	   following it: the AAD binds the real base */
	ck_assert_int_eq(cas_keyring_dek_open(keyring, &b->id,
		b->rec.dek_kind, b->rec.stored_dek, dek, &error), 1);
	cas_aead_frame_subkey(hdr[5], dek, hdr + 24, subkey);
	casbox_frame_base_mask(subkey, a2->id.id, hdr + 80);
	cpu32_to_le_unaligned(cas_crc32c_mask(cas_crc32c(hdr, 112)),
			      hdr + 112);
	pack_pwrite(&b->rec, hdr, sizeof(hdr), 0);
	b->rec.base_id = a2->id;
	assert_fails(store, b, "authentication failed");
	b->rec = saved;

	/* a base buffer with the right id but other bytes */
	plain = casbox_base_plain_new_copy(&a->id, a->data->used, 0,
					   a2->data->data, a2->data->used);
	input = casbox_pack_blob_open_base(store, &b2->id, &b2->rec, plain);
	ck_assert_int_eq(i_stream_read(input), -1);
	ck_assert_int_eq(input->stream_errno, EIO);
	ck_assert_ptr_nonnull(strstr(i_stream_get_error(input),
				     "names base"));
	i_stream_unref(&input);
	casbox_base_plain_unref(&plain);
	plain = casbox_base_plain_new_copy(&a2->id, a2->data->used, 0,
					   a->data->data, a->data->used);
	input = casbox_pack_blob_open_base(store, &b2->id, &b2->rec, plain);
	ck_assert_int_eq(i_stream_read(input), -1);
	ck_assert_int_eq(input->stream_errno, EIO);
	ck_assert_ptr_nonnull(strstr(i_stream_get_error(input),
				     "authentication failed"));
	i_stream_unref(&input);
	casbox_base_plain_unref(&plain);

	/* opened without its base */
	input = casbox_pack_blob_open(store, &b2->id, &b2->rec);
	ck_assert_int_eq(i_stream_read(input), -1);
	ck_assert_ptr_nonnull(strstr(i_stream_get_error(input),
				     "not given"));
	i_stream_unref(&input);
	buffer_free(&out);
	(void)error;
	blobs_free();
	casbox_pack_store_close(&store);
}
END_TEST

/* Damage: a flipped byte in every position of a small delta frame; a
   truncated frame; a missing base; a damaged base (named). */
START_TEST(test_damage)
{
	struct casbox_pack_store *store = store_open();
	struct blob *a, *b, *c;
	struct casbox_blob_record saved;
	unsigned char byte;
	const char *error;
	buffer_t *out = buffer_create_dynamic(default_pool, 1024);
	uint32_t i;

	a = add_blob(store, pattern(5000, 15, FALSE), NULL);
	b = add_blob(store, reply_of(a->data, 300, 16), a);
	ck_assert_uint_eq(b->rec.base_depth, 1);
	for (i = 0; i < b->rec.frame_size; i++) {
		pack_pread(&b->rec, &byte, 1, i);
		byte ^= 0x04;
		pack_pwrite(&b->rec, &byte, 1, i);
		if (read_chain(store, b, out, &error) == 0) {
			ck_abort_msg("flipped byte %u of %u read fine", i,
				     b->rec.frame_size);
		}
		byte ^= 0x04;
		pack_pwrite(&b->rec, &byte, 1, i);
	}
	assert_reads(store, b);

	/* a missing base (not cached either) */
	saved = a->rec;
	casbox_base_cache_clear(casbox_pack_store_get_base_cache(store));
	a->id.id[0] ^= 1;
	assert_fails(store, b, "is missing");
	a->id.id[0] ^= 1;

	/* a damaged base: named, and its dependent fails */
	c = add_blob(store, pattern(3000, 17, FALSE), NULL);
	b = add_blob(store, reply_of(c->data, 300, 18), c);
	ck_assert_uint_eq(b->rec.base_depth, 1);
	pack_pread(&c->rec, &byte, 1, CASBOX_FRAME_V2_HEADER_SIZE + 3);
	byte ^= 0x10;
	pack_pwrite(&c->rec, &byte, 1, CASBOX_FRAME_V2_HEADER_SIZE + 3);
	if (read_chain(store, b, out, &error) == 0)
		ck_abort_msg("delta on a damaged base read fine");
	ck_assert_ptr_nonnull(strstr(error, t_strdup_printf(
		"base %s is damaged", cas_blob_id_to_hex(&c->id))));
	(void)saved;
	buffer_free(&out);
	blobs_free();
	casbox_pack_store_close(&store);
}
END_TEST

START_TEST(test_truncated)
{
	struct casbox_pack_store *store = store_open();
	struct blob *a, *b;
	buffer_t *data;
	int fd;

	a = add_blob(store, pattern(5000, 19, FALSE), NULL);
	data = reply_of(a->data, 300, 20);
	append_pattern(data, 150000, 25, FALSE);
	b = add_blob(store, data, a);
	ck_assert_uint_eq(b->rec.base_depth, 1);
	assert_reads(store, b);
	fd = open(pack_file(b->rec.pack_id), O_WRONLY);
	ck_assert_int_ne(fd, -1);
	ck_assert_int_eq(ftruncate(fd, b->rec.offset + b->rec.frame_size - 3),
			 0);
	i_close_fd(&fd);
	assert_fails(store, b, "truncated");
	blobs_free();
	casbox_pack_store_close(&store);
}
END_TEST

/* Version 3 blob records: round trip, both DEK kinds' sizes, bad depth;
   no base: still version 2, byte for byte. */
START_TEST(test_record_v3)
{
	struct casbox_blob_record rec, rec2;
	buffer_t *buf = buffer_create_dynamic(default_pool, 256);
	unsigned char *p;
	const char *error;

	i_zero(&rec);
	rec.pack_id = 3;
	rec.offset = 20;
	rec.plain_size = 1000;
	rec.frame_size = CASBOX_FRAME_V3_HEADER_SIZE + 8 + 600;
	rec.dek_kind = CAS_DEK_KIND_SERVER_WRAP;
	memset(rec.wrapped_dek, 0x55, CAS_WRAPPED_DEK_SIZE);
	casbox_blob_record_export(&rec, buf);
	ck_assert_uint_eq(buf->used, 106);
	ck_assert_uint_eq(((const unsigned char *)buf->data)[0], 2);
	rec.base_depth = 2;
	memset(rec.base_id.id, 0xab, CAS_BLOB_ID_SIZE);
	buffer_set_used_size(buf, 0);
	casbox_blob_record_export(&rec, buf);
	ck_assert_uint_eq(buf->used, 139);
	ck_assert_uint_eq(casbox_blob_record_export_size(&rec), 139);
	p = buffer_get_modifiable_data(buf, NULL);
	ck_assert_uint_eq(p[0], 3);
	ck_assert_uint_eq(p[29], 2);
	ck_assert_uint_eq(p[30], 0xab);
	ck_assert_int_eq(casbox_blob_record_import(buf->data, buf->used,
						   &rec2, &error), 1);
	ck_assert_mem_eq(&rec, &rec2, sizeof(rec));
	p[29] = 3;
	ck_assert_int_eq(casbox_blob_record_import(buf->data, buf->used,
						   &rec2, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "base depth"));
	p[29] = 0;
	ck_assert_int_eq(casbox_blob_record_import(buf->data, buf->used,
						   &rec2, &error), -1);
	p[29] = 1;
	ck_assert_int_eq(casbox_blob_record_import(buf->data, buf->used - 1,
						   &rec2, &error), -1);
	/* a sealed DEK (password mode): 195 bytes, the largest record */
	rec.base_depth = 1;
	rec.dek_kind = CAS_DEK_KIND_SEALED;
	memset(rec.sealed_dek, 0x66, CAS_SEALED_DEK_SIZE);
	rec.sealed_dek[0] = CAS_DEK_KIND_SEALED;
	buffer_set_used_size(buf, 0);
	casbox_blob_record_export(&rec, buf);
	ck_assert_uint_eq(buf->used, 195);
	ck_assert_int_eq(casbox_blob_record_import(buf->data, buf->used,
						   &rec2, &error), 1);
	ck_assert_mem_eq(&rec, &rec2, sizeof(rec));
	/* a base and a dictionary together: refused */
	p = buffer_get_modifiable_data(buf, NULL);
	p[25] = 1;
	ck_assert_int_eq(casbox_blob_record_import(buf->data, buf->used,
						   &rec2, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "dictionary"));
	ck_assert_uint_eq(CASBOX_BLOB_RECORD_EXPORT_MAX_SIZE, 195);
	buffer_free(&buf);
}
END_TEST

/* The keyless scan reports depth and the masked base id (which is not
   the base id in the clear); the DEK unmasks it. */
START_TEST(test_scan)
{
	struct casbox_pack_store *store = store_open();
	struct casbox_pack_frame_info info;
	struct casbox_pack_scan *scan;
	struct cas_blob_id base_id;
	struct blob *a, *b;
	const char *error;
	unsigned int found = 0;

	a = add_blob(store, pattern(5000, 21, FALSE), NULL);
	b = add_blob(store, reply_of(a->data, 300, 22), a);
	ck_assert_uint_eq(b->rec.base_depth, 1);
	scan = casbox_pack_scan_init(store);
	while (casbox_pack_scan_next(scan, &info)) {
		ck_assert_ptr_null(info.damage);
		if (memcmp(info.id.id, a->id.id, CAS_BLOB_ID_SIZE) == 0) {
			ck_assert_uint_eq(info.base_depth, 0);
			ck_assert_uint_eq(info.frame_version, 2);
		}
		if (memcmp(info.id.id, b->id.id, CAS_BLOB_ID_SIZE) != 0)
			continue;
		found++;
		ck_assert_uint_eq(info.frame_version, 3);
		ck_assert_uint_eq(info.base_depth, 1);
		ck_assert(memcmp(info.base_masked, a->id.id,
				 CAS_BLOB_ID_SIZE) != 0);
		ck_assert_int_eq(casbox_pack_frame_base_id(store, &info,
			b->rec.dek_kind, b->rec.stored_dek, &base_id,
			&error), 1);
		ck_assert(memcmp(base_id.id, a->id.id, CAS_BLOB_ID_SIZE) == 0);
	}
	ck_assert_int_eq(casbox_pack_scan_deinit(&scan, &error), 0);
	ck_assert_uint_eq(found, 1);
	blobs_free();
	casbox_pack_store_close(&store);
}
END_TEST

/* gc's keyless copy keeps a delta frame readable at its new place. */
START_TEST(test_copy_frame)
{
	struct casbox_pack_store *store = store_open();
	struct casbox_pack_txn *txn;
	struct casbox_blob_record rec;
	struct blob *a, *b;
	const char *error;

	a = add_blob(store, pattern(5000, 23, FALSE), NULL);
	b = add_blob(store, reply_of(a->data, 300, 24), a);
	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	if (casbox_pack_txn_copy_frame(txn, &b->id, &b->rec, &rec,
				       &error) < 0)
		ck_abort_msg("copy: %s", error);
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
	ck_assert_uint_ne(rec.offset, b->rec.offset);
	ck_assert_uint_eq(rec.base_depth, 1);
	b->rec = rec;
	assert_reads(store, b);
	/* a record that lost its base does not pass for the frame */
	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	rec.base_depth = 0;
	ck_assert_int_eq(casbox_pack_txn_copy_frame(txn, &b->id, &rec, &rec,
						    &error), -1);
	casbox_pack_txn_rollback(&txn);
	blobs_free();
	casbox_pack_store_close(&store);
}
END_TEST

static unsigned int wipes_seen, wipes_dirty;
static void wipe_hook(const unsigned char *data, size_t size)
{
	size_t i;

	wipes_seen++;
	for (i = 0; i < size; i++) {
		if (data[i] != 0) {
			wipes_dirty++;
			break;
		}
	}
}

static struct casbox_base_plain *cache_entry(unsigned int n, size_t size)
{
	struct cas_blob_id id;
	buffer_t *data = pattern(size, n, FALSE);
	struct casbox_base_plain *plain;

	memset(id.id, n, sizeof(id.id));
	plain = casbox_base_plain_new_copy(&id, size, 0, data->data,
					   data->used);
	buffer_free(&data);
	return plain;
}

/* The cache: bound kept (in memory, not data bytes), least recently used
   evicted first, entries in use survive eviction until unreferenced,
   everything wiped when freed, an entry over the bound not kept. */
START_TEST(test_cache)
{
	/* room for three 3000-byte entries (12 KiB each), not four; a
	   20000-byte one (40 KiB) fits alone */
	struct casbox_base_cache *cache = casbox_base_cache_create(45000);
	struct casbox_base_plain *p[5], *held;
	struct cas_blob_id id;
	unsigned int i, entries;
	size_t bytes;

	casbox_base_plain_wipe_hook = wipe_hook;
	wipes_seen = wipes_dirty = 0;
	ck_assert_uint_eq(casbox_base_plain_footprint(3000), 12288);
	ck_assert_uint_eq(casbox_base_plain_footprint(4096), 12288);
	ck_assert_uint_eq(casbox_base_plain_footprint(4097), 16384);
	ck_assert_uint_eq(casbox_base_plain_footprint(20000), 40960);
	for (i = 0; i < 3; i++) {
		p[i] = cache_entry(i + 1, 3000);
		casbox_base_cache_add(cache, p[i]);
	}
	casbox_base_cache_get_stats(cache, &entries, &bytes);
	ck_assert_uint_eq(entries, 3);
	ck_assert_uint_eq(bytes, 9000);
	/* touch 1: 2 is now the least recently used */
	memset(id.id, 1, sizeof(id.id));
	held = casbox_base_cache_lookup(cache, &id);
	ck_assert_ptr_eq(held, p[0]);
	casbox_base_plain_unref(&held);
	for (i = 0; i < 3; i++)
		casbox_base_plain_unref(&p[i]);
	ck_assert_uint_eq(wipes_seen, 0);
	/* 4 pushes out 2 (wiped: nobody holds it) */
	p[3] = cache_entry(4, 3000);
	casbox_base_cache_add(cache, p[3]);
	casbox_base_cache_get_stats(cache, &entries, &bytes);
	ck_assert_uint_eq(entries, 3);
	ck_assert_uint_eq(bytes, 9000);
	ck_assert_uint_eq(wipes_seen, 1);
	memset(id.id, 2, sizeof(id.id));
	ck_assert_ptr_null(casbox_base_cache_lookup(cache, &id));
	/* held entry 3 evicted by a big one: lives until unref */
	memset(id.id, 3, sizeof(id.id));
	held = casbox_base_cache_lookup(cache, &id);
	ck_assert_ptr_nonnull(held);
	p[4] = cache_entry(5, 20000);
	casbox_base_cache_add(cache, p[4]);
	casbox_base_cache_get_stats(cache, &entries, &bytes);
	ck_assert_uint_eq(entries, 1);
	ck_assert_uint_eq(bytes, 20000);
	/* 1 wiped; 4 (p[3]) and 3 (held) referenced: evicted, kept */
	ck_assert_uint_eq(wipes_seen, 2);
	ck_assert_uint_gt(held->size, 0);
	ck_assert_uint_ne(held->data[0], 0);
	casbox_base_plain_unref(&held);
	ck_assert_uint_eq(wipes_seen, 3);
	/* over the bound: not kept */
	p[0] = cache_entry(6, 40000);
	casbox_base_cache_add(cache, p[0]);
	casbox_base_cache_get_stats(cache, &entries, &bytes);
	ck_assert_uint_eq(entries, 1);
	casbox_base_plain_unref(&p[0]);
	ck_assert_uint_eq(wipes_seen, 4);
	casbox_base_plain_unref(&p[3]);
	ck_assert_uint_eq(wipes_seen, 5);
	/* 5 is still cached */
	casbox_base_plain_unref(&p[4]);
	ck_assert_uint_eq(wipes_seen, 5);
	casbox_base_cache_destroy(&cache);
	ck_assert_uint_eq(wipes_seen, 6);
	ck_assert_uint_eq(wipes_dirty, 0);
	casbox_base_plain_wipe_hook = NULL;
}
END_TEST

/* A full cache in steady state (a sequential FETCH over more bases than
   it holds: one entry added, older ones evicted, of mixed sizes) takes
   the buffers of evicted entries for new ones, instead of a
   sodium_malloc() (mmap, mprotect, mlock) and sodium_free() (munmap)
   each: those were a quarter of the imap process's CPU in a FETCH of
   1000 usrp-users messages (doc/benchmarks.md, "FETCH CPU"). */
START_TEST(test_cache_churn_reuses)
{
	static const size_t sizes[] = { 3000, 6000, 12000, 30000, 60000 };
	struct casbox_base_cache *cache = casbox_base_cache_create(512 * 1024);
	struct casbox_base_plain *plain;
	struct cas_blob_id id;
	unsigned char data[60000];
	unsigned int i, allocs = 0, rnd = 12345;

	memset(data, 'x', sizeof(data));
	memset(&id, 0, sizeof(id));
	for (i = 0; i < 1500; i++) {
		if (i == 500)
			allocs = casbox_base_sodium_allocs;
		rnd = rnd * 1103515245 + 12345;
		cpu32_to_le_unaligned(i, id.id);
		plain = casbox_base_plain_new_copy(&id, sizes[(rnd >> 16) % 5],
						   0, data, sizeof(data));
		casbox_base_cache_add(cache, plain);
		casbox_base_plain_unref(&plain);
	}
	/* 1000 entries added after the cache filled: (almost) all in
	   reused buffers */
	ck_assert_uint_le(casbox_base_sodium_allocs - allocs, 20);
	casbox_base_cache_destroy(&cache);
}
END_TEST

/* The base arena (casbox-base-arena.h): slabs made small first, then
   larger; blocks of every size class until not even the smallest is
   left fill them exactly, never overlap, and coalesce back into whole
   slabs (all freed) when released in any order. */
START_TEST(test_arena)
{
	static unsigned char *blocks[CASBOX_BASE_ARENA_BYTES /
				     CASBOX_BASE_ARENA_BLOCK_MIN];
	static size_t caps[N_ELEMENTS(blocks)];
	unsigned char *data, not_arena[16];
	unsigned int i, j, n = 0, rnd = 4711, order;
	size_t total = 0, cap;

	casbox_base_pool_free();
	/* another test's leftovers (CK_FORK=no) would leave less room */
	if (casbox_base_arena_get_slab_count() != 0)
		return;
	/* the first slab is a small one */
	data = casbox_base_arena_alloc(CASBOX_BASE_ARENA_BLOCK_MIN);
	ck_assert(data != NULL);
	ck_assert_uint_eq(casbox_base_arena_get_bytes(),
			  CASBOX_BASE_ARENA_FIRST_SLAB);
	blocks[n] = data;
	caps[n++] = CASBOX_BASE_ARENA_BLOCK_MIN;
	total += CASBOX_BASE_ARENA_BLOCK_MIN;
	memset(data, 0, CASBOX_BASE_ARENA_BLOCK_MIN);
	for (order = 8;;) {
		rnd = rnd * 1103515245 + 12345;
		cap = (size_t)CASBOX_BASE_ARENA_BLOCK_MIN <<
			((rnd >> 16) % (order + 1));
		data = casbox_base_arena_alloc(cap);
		if (data == NULL) {
			if (cap == CASBOX_BASE_ARENA_BLOCK_MIN)
				break;
			/* full for this size: smaller ones only */
			order = 0;
			while (((size_t)CASBOX_BASE_ARENA_BLOCK_MIN <<
				(order + 1)) < cap)
				order++;
			continue;
		}
		ck_assert_uint_lt(n, N_ELEMENTS(blocks));
		memset(data, n & 0xff, cap);
		blocks[n] = data;
		caps[n++] = cap;
		total += cap;
	}
	/* every byte of every slab handed out, within the bound */
	ck_assert_uint_eq(total, casbox_base_arena_get_bytes());
	ck_assert_uint_le(total, CASBOX_BASE_ARENA_BYTES);
	ck_assert_uint_gt(total, CASBOX_BASE_ARENA_BYTES -
			  CASBOX_BASE_ARENA_SLAB_SIZE);
	/* no block was written over by another */
	for (i = 0; i < n; i++) {
		for (j = 0; j < caps[i]; j += 512)
			ck_assert_uint_eq(blocks[i][j], i & 0xff);
		ck_assert_uint_eq(blocks[i][caps[i] - 1], i & 0xff);
	}
	ck_assert(!casbox_base_arena_release(not_arena, 4096));
	/* release in a shuffled order */
	for (i = n; i > 1; i--) {
		rnd = rnd * 1103515245 + 12345;
		j = (rnd >> 8) % i;
		data = blocks[i - 1];
		blocks[i - 1] = blocks[j];
		blocks[j] = data;
		cap = caps[i - 1];
		caps[i - 1] = caps[j];
		caps[j] = cap;
	}
	for (i = 0; i < n; i++)
		ck_assert(casbox_base_arena_release(blocks[i], caps[i]));
	/* coalesced into whole slabs: all of them are freed */
	casbox_base_arena_free();
	ck_assert_uint_eq(casbox_base_arena_get_slab_count(), 0);
	ck_assert_uint_eq(casbox_base_arena_get_bytes(), 0);
	/* a 1 MiB block first: a slab of its size */
	data = casbox_base_arena_alloc(CASBOX_BASE_ARENA_SLAB_SIZE);
	ck_assert(data != NULL);
	ck_assert_uint_eq(casbox_base_arena_get_bytes(),
			  CASBOX_BASE_ARENA_SLAB_SIZE);
	ck_assert(casbox_base_arena_release(data,
					    CASBOX_BASE_ARENA_SLAB_SIZE));
	casbox_base_arena_free();
}
END_TEST

/* Filling an empty cache (a process's first FETCH) takes arena blocks:
   no sodium_malloc() per entry while the arena has room. */
START_TEST(test_cache_fill_arena)
{
	static const size_t sizes[] = { 3000, 6000, 12000, 30000, 60000 };
	struct casbox_base_cache *cache =
		casbox_base_cache_create(2 * 1024 * 1024);
	struct casbox_base_plain *plain;
	struct cas_blob_id id;
	unsigned char data[60000];
	unsigned int i, allocs, rnd = 777;

	casbox_base_pool_free();
	memset(data, 'y', sizeof(data));
	memset(&id, 0, sizeof(id));
	allocs = casbox_base_sodium_allocs;
	for (i = 0; i < 300; i++) {
		rnd = rnd * 1103515245 + 12345;
		cpu32_to_le_unaligned(i, id.id);
		plain = casbox_base_plain_new_copy(&id, sizes[(rnd >> 16) % 5],
						   0, data, sizeof(data));
		ck_assert_int_eq(memcmp(plain->data, data, plain->size), 0);
		casbox_base_cache_add(cache, plain);
		casbox_base_plain_unref(&plain);
	}
	/* 2 MiB of entries (as the bound counts them) in 4 MiB of arena */
	ck_assert_uint_eq(casbox_base_sodium_allocs, allocs);
	ck_assert_uint_ge(casbox_base_arena_get_slab_count(), 1);
	casbox_base_cache_destroy(&cache);
	casbox_base_pool_free();
}
END_TEST

/* Sequential FETCH: a base read whole with casbox_pack_blob_cache_as_base()
   is in the cache, so its delta read next decodes only its own chunk;
   a stream that seeks past what it read caches nothing. */
START_TEST(test_cache_as_base)
{
	struct casbox_pack_store *store = store_open();
	struct casbox_base_cache *cache =
		casbox_pack_store_get_base_cache(store);
	struct blob *a, *b, *c;
	struct istream *input;
	const unsigned char *data;
	const char *error;
	unsigned int entries;
	size_t size, bytes;
	uint64_t chunks;

	a = add_blob(store, pattern(150000, 26, FALSE), NULL);
	b = add_blob(store, reply_of(a->data, 500, 27), a);
	ck_assert_uint_eq(b->rec.base_depth, 1);
	casbox_base_cache_clear(cache);

	/* a seek past what was read: not cached */
	input = casbox_pack_blob_open(store, &a->id, &a->rec);
	casbox_pack_blob_cache_as_base(input);
	ck_assert_int_gt(i_stream_read_more(input, &data, &size), 0);
	i_stream_seek(input, 140000);
	while (i_stream_read_more(input, &data, &size) > 0)
		i_stream_skip(input, size);
	ck_assert_int_eq(input->stream_errno, 0);
	i_stream_unref(&input);
	casbox_base_cache_get_stats(cache, &entries, &bytes);
	ck_assert_uint_eq(entries, 0);

	/* read whole: cached, and the delta needs no base decode */
	input = casbox_pack_blob_open(store, &a->id, &a->rec);
	casbox_pack_blob_cache_as_base(input);
	while (i_stream_read_more(input, &data, &size) > 0)
		i_stream_skip(input, size);
	ck_assert_int_eq(input->stream_errno, 0);
	i_stream_unref(&input);
	casbox_base_cache_get_stats(cache, &entries, &bytes);
	ck_assert_uint_eq(entries, 1);
	ck_assert_uint_eq(bytes, a->data->used);
	chunks = casbox_pack_get_chunks_decoded();
	assert_reads(store, b);
	/* b's own chunks only (a is not decoded again) */
	ck_assert_uint_eq(casbox_pack_get_chunks_decoded() - chunks,
			  casbox_frame_chunk_count(b->data->used));

	/* a blob at the maximum depth cannot be a base: not kept */
	c = add_blob(store, reply_of(b->data, 500, 28), b);
	ck_assert_uint_eq(c->rec.base_depth, 2);
	casbox_base_cache_clear(cache);
	ck_assert_int_eq(casbox_pack_blob_open_chain(store, &c->id, &c->rec,
		lookup, NULL, &input, &error), 1);
	casbox_pack_blob_cache_as_base(input);
	while (i_stream_read_more(input, &data, &size) > 0)
		i_stream_skip(input, size);
	ck_assert_int_eq(input->stream_errno, 0);
	i_stream_unref(&input);
	ck_assert(!casbox_base_cache_has(cache, &c->id));
	ck_assert(casbox_base_cache_has(cache, &b->id));
	blobs_free();
	casbox_pack_store_close(&store);
}
END_TEST

/* The committed delta fixtures (tests/fuzz/corpus/pack/v3-*, written
   by fuzz-pack --make-seeds with key 0x42...): the delta's record, its
   chain's records, the pack. They keep decoding to the bytes that
   fuzz_make_delta_seeds() wrote. */
static void golden_v3(const char *name, const buffer_t *expected,
		      unsigned int depth)
{
	const char *top = getenv("CASBOX_TOP_SRCDIR");
	unsigned char kek[CAS_KEK_SIZE];
	struct cas_keyring *saved = keyring;
	struct casbox_pack_store *store;
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	buffer_t *seed, *out;
	const unsigned char *p;
	const char *path, *error;
	char tmp[8192];
	size_t n, pos, size;
	unsigned int i;
	FILE *f;
	int fd;

	memset(kek, 0x42, sizeof(kek));
	keyring = cas_keyring_create_from_kek(kek);
	path = t_strdup_printf("%s/tests/fuzz/corpus/pack/%s",
			       top == NULL ? CASBOX_SRCDIR : top, name);
	seed = buffer_create_dynamic(default_pool, 4096);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	while ((n = fread(tmp, 1, sizeof(tmp), f)) > 0)
		buffer_append(seed, tmp, n);
	ck_assert_int_eq(fclose(f), 0);
	p = seed->data;
	ck_assert_uint_eq(p[0], CASBOX_BLOB_RECORD_VERSION_BASE);
	size = CASBOX_BLOB_RECORD_EXPORT_SIZE + CASBOX_BLOB_RECORD_BASE_SIZE;
	ck_assert_int_eq(casbox_blob_record_import(p, size, &rec, &error), 1);
	ck_assert_uint_eq(rec.base_depth, depth);
	pos = size;
	blob_count = 0;
	for (i = 0; i < depth; i++) {
		size = p[pos] == CASBOX_BLOB_RECORD_VERSION_BASE ?
			CASBOX_BLOB_RECORD_EXPORT_SIZE +
			CASBOX_BLOB_RECORD_BASE_SIZE :
			CASBOX_BLOB_RECORD_EXPORT_SIZE;
		ck_assert_int_eq(casbox_blob_record_import(p + pos, size,
			&blobs[blob_count].rec, &error), 1);
		blobs[blob_count].data = NULL;
		pos += size;
		blob_count++;
	}
	store = store_open();
	fd = open(pack_file(rec.pack_id), O_WRONLY | O_CREAT | O_TRUNC,
		  0600);
	ck_assert_int_ne(fd, -1);
	ck_assert_int_eq(write(fd, p + pos, seed->used - pos),
			 (ssize_t)(seed->used - pos));
	i_close_fd(&fd);
	/* the chain's ids are in their frames' headers */
	for (i = 0; i < blob_count; i++) {
		memcpy(blobs[i].id.id, p + pos + blobs[i].rec.offset + 48,
		       CAS_BLOB_ID_SIZE);
	}
	ck_assert_uint_eq(p[pos + rec.offset + 4], 3);
	cas_blob_id_compute(keyring, expected->data, expected->used, &id);
	blobs[blob_count].id = id;
	blobs[blob_count].rec = rec;
	blobs[blob_count].data = buffer_create_dynamic(default_pool, 1024);
	buffer_append_buf(blobs[blob_count].data, expected, 0, SIZE_MAX);
	blob_count++;
	out = buffer_create_dynamic(default_pool, 1024);
	if (read_chain(store, &blobs[blob_count - 1], out, &error) < 0)
		ck_abort_msg("%s: %s", name, error);
	ck_assert(buffer_cmp(out, expected));
	buffer_free(&out);
	for (i = 0; i < blob_count; i++) {
		if (blobs[i].data != NULL)
			buffer_free(&blobs[i].data);
	}
	blob_count = 0;
	buffer_free(&seed);
	casbox_pack_store_close(&store);
	cas_keyring_free(&keyring);
	keyring = saved;
}

START_TEST(test_golden_v3)
{
	buffer_t *msg[3];
	unsigned int i;

	/* as fuzz_make_delta_seeds() in tests/fuzz/fuzz-pack.c */
	for (i = 0; i < N_ELEMENTS(msg); i++)
		msg[i] = buffer_create_dynamic(default_pool, 1024);
	buffer_append(msg[0], "Subject: hello\r\n\r\n", 18);
	for (i = 0; i < 3000; i++)
		buffer_append_c(msg[0], "casbox delta \r\n"[(i * 7 + i / 13) % 15]);
	buffer_append(msg[1], "Subject: Re: hello\r\n\r\n> ", 24);
	buffer_append_buf(msg[1], msg[0], 0, SIZE_MAX);
	for (i = 0; i < 70000; i++)
		buffer_append_c(msg[1], "reply \r\n"[(i * 5 + i / 11) % 8]);
	buffer_append(msg[2], "Subject: Re: Re: hello\r\n\r\n> ", 27);
	buffer_append_buf(msg[2], msg[1], 0, SIZE_MAX);
	golden_v3("v3-delta-xchacha", msg[1], 1);
	golden_v3("v3-chain-xchacha", msg[2], 2);
	if (cas_aead_cipher_available(CAS_AEAD_CIPHER_AES256GCM))
		golden_v3("v3-delta-aes", msg[1], 1);
	else
		fprintf(stderr, "check-frame-base: no AES-NI, v3-delta-aes "
			"not read\n");
	for (i = 0; i < N_ELEMENTS(msg); i++)
		buffer_free(&msg[i]);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("frame-base");
	TCase *tc = tcase_create("core");
	int failed;

	lib_init();
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_roundtrip);
	tcase_add_test(tc, test_no_gain);
	tcase_add_test(tc, test_mixed_chunks);
	tcase_add_test(tc, test_chain_depth);
	tcase_add_test(tc, test_wrong_base);
	tcase_add_test(tc, test_damage);
	tcase_add_test(tc, test_truncated);
	tcase_add_test(tc, test_record_v3);
	tcase_add_test(tc, test_scan);
	tcase_add_test(tc, test_copy_frame);
	tcase_add_test(tc, test_cache);
	tcase_add_test(tc, test_cache_churn_reuses);
	tcase_add_test(tc, test_arena);
	tcase_add_test(tc, test_cache_fill_arena);
	tcase_add_test(tc, test_cache_as_base);
	tcase_add_test(tc, test_golden_v3);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
