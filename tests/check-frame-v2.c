/* Blob frame version 2 (doc/casbox-format.md, "Frame version 2"): both
   ciphers round-trip byte-exact at chunk boundaries; every byte change of
   a small frame fails cleanly under either cipher; the cipher byte and
   the frame nonce are bound (changed with a valid header CRC: the tag
   fails); stored chunk sizes are padme() buckets, so blobs of nearby
   sizes give frames of one size; non-zero padding inside a valid AEAD
   is refused; every frame draws a fresh nonce; subkey and AES-GCM
   chunk nonce match independently computed values; the committed version 2
   fixtures (tests/fuzz/corpus/pack/v2-*) keep decoding. */

#include "lib.h"
#include "buffer.h"
#include "istream.h"
#include "byteorder.h"
#include "hex-binary.h"
#include "cas-key.h"
#include "cas-aead.h"
#include "cas-crc32c.h"
#include "casbox-pack.h"
#include "casbox-frame.h"

#include <zstd.h>
#include <check.h>
#include "check-run.h"
#include <sodium.h>
#include <stdlib.h>
#include <stdio.h>
#include <fcntl.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/check-frame-v2.XXXXXX";
static struct cas_keyring *keyring;

static const enum cas_aead_cipher all_ciphers[] = {
	CAS_AEAD_CIPHER_XCHACHA20POLY1305,
	CAS_AEAD_CIPHER_AES256GCM,
};

static struct cas_keyring *test_keyring(unsigned char seed)
{
	unsigned char kek[CAS_KEK_SIZE];

	memset(kek, seed, sizeof(kek));
	return cas_keyring_create_from_kek(kek);
}

static void setup(void)
{
	strcpy(tmpdir, "/tmp/check-frame-v2.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
	keyring = test_keyring(1);
}

static void teardown(void)
{
	ck_assert_int_eq(system(t_strdup_printf("rm -rf '%s'", tmpdir)), 0);
	cas_keyring_free(&keyring);
}

static struct casbox_pack_store *
store_open_cipher(const struct cas_keyring *k, enum cas_aead_cipher cipher)
{
	struct casbox_pack_settings set;
	struct casbox_pack_store *store;
	const char *error;

	i_zero(&set);
	set.dir = t_strdup_printf("%s/packs", tmpdir);
	set.cipher = cipher;
	if (casbox_pack_store_open(&set, k, &store, &error) < 0)
		ck_abort_msg("store open: %s", error);
	return store;
}

static bool cipher_skip(enum cas_aead_cipher cipher)
{
	if (cas_aead_cipher_available(cipher))
		return FALSE;
	/* libsodium has no software AES: not a failure of ours, and the
	   frames of the other cipher are tested */
	fprintf(stderr, "check-frame-v2: %s not available on this CPU, "
		"its cases skipped\n", cas_aead_cipher_name(cipher));
	return TRUE;
}

static void add_blob(struct casbox_pack_store *store, const buffer_t *blob,
		     struct cas_blob_id *id_r, struct casbox_blob_record *rec_r)
{
	struct casbox_pack_txn *txn;
	struct istream *input;
	const char *error;

	cas_blob_id_compute(keyring, blob->data, blob->used, id_r);
	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	input = i_stream_create_from_data(blob->data, blob->used);
	if (casbox_pack_txn_add(txn, id_r, input, rec_r, &error) < 0)
		ck_abort_msg("add: %s", error);
	i_stream_unref(&input);
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
}

/* Read a blob whole. Returns 0 ok (bytes in out), -1 EIO. */
static int read_blob(struct casbox_pack_store *store,
		     const struct cas_blob_id *id,
		     const struct casbox_blob_record *rec, buffer_t *out,
		     const char **error_r)
{
	struct istream *input = casbox_pack_blob_open(store, id, rec);
	const unsigned char *data;
	size_t size;
	int ret;

	buffer_set_used_size(out, 0);
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

static void read_header(const struct casbox_blob_record *rec,
			struct casbox_frame_header *hdr_r,
			unsigned char raw_r[CASBOX_FRAME_V2_HEADER_SIZE])
{
	const char *error;

	pack_pread(rec, raw_r, CASBOX_FRAME_V2_HEADER_SIZE, 0);
	if (casbox_frame_header_parse(raw_r, CASBOX_FRAME_V2_HEADER_SIZE,
				      hdr_r, &error) < 0)
		ck_abort_msg("header: %s", error);
}

/* Values computed independently (Python, the paper's definition:
   E = floor(log2 L), S = floor(log2 E) + 1, clear the low E - S bits
   rounding up), plus the properties the format relies on. */
START_TEST(test_padme)
{
	static const uint64_t cases[][2] = {
		{ 0, 0 }, { 1, 1 }, { 2, 2 }, { 3, 3 }, { 7, 7 }, { 8, 8 },
		{ 9, 10 }, { 100, 104 }, { 255, 256 }, { 256, 256 },
		{ 257, 272 }, { 1000, 1024 }, { 4096, 4096 },
		{ 4097, 4352 }, { 10000, 10240 }, { 48000, 49152 },
		{ 65536, 65536 }, { 65824, 67584 }, { 1000000, 1015808 },
	};
	uint64_t x, p, prev = 0;
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(cases); i++)
		ck_assert_uint_eq(casbox_padme(cases[i][0]), cases[i][1]);
	for (x = 0; x <= CASBOX_CHUNK_MAX_PADDED; x++) {
		p = casbox_padme(x);
		ck_assert_uint_ge(p, x);
		ck_assert_uint_ge(p, prev);
		ck_assert_uint_eq(casbox_padme(p), p);
		/* at most 12 % (the paper's bound), and only for small x */
		ck_assert_uint_le(p - x, x / 8 + 1);
		prev = p;
	}
	ck_assert_uint_eq(casbox_padme(ZSTD_compressBound(CASBOX_CHUNK_SIZE)),
			  CASBOX_CHUNK_MAX_PADDED);
}
END_TEST

/* The subkey derivation and the AES-256-GCM chunk nonce, against
   values computed independently (Python: hashlib.blake2b(b"CBFRKEY2" +
   bytes([cipher]) + nonce, key=dek, digest_size=32); cryptography's
   AESGCM(subkey).encrypt((7).to_bytes(4, "little") + bytes(8),
   b"hello", b"ad")), DEK = 00..1f, frame nonce = 40..57. */
START_TEST(test_known_answer)
{
	static const char *subkey_hex[] = {
		"b705eace69f2f2662b7c8e768e50fd0fe222a50798be334aa03c0e158b18800a",
		"94631bccad485580baccffc8bbef1d742fbb66cb440946134912c66501002d0c",
	};
	unsigned char dek[CAS_DEK_SIZE], nonce[CAS_AEAD_FRAME_NONCE_SIZE];
	unsigned char subkey[CAS_AEAD_SUBKEY_SIZE], ct[5 + CAS_AEAD_TAG_SIZE];
	unsigned char pt[5];
	unsigned int i;

	for (i = 0; i < sizeof(dek); i++)
		dek[i] = i;
	for (i = 0; i < sizeof(nonce); i++)
		nonce[i] = 0x40 + i;
	for (i = 0; i < 2; i++) {
		cas_aead_frame_subkey(i + 1, dek, nonce, subkey);
		ck_assert_str_eq(binary_to_hex(subkey, sizeof(subkey)),
				 subkey_hex[i]);
	}
	if (cipher_skip(CAS_AEAD_CIPHER_AES256GCM))
		return;
	cas_aead_chunk_encrypt(CAS_AEAD_CIPHER_AES256GCM, subkey, 7, "ad", 2,
			       "hello", 5, ct);
	ck_assert_str_eq(binary_to_hex(ct, sizeof(ct)),
			 "34b3a3e5cb9c86134d2cfd094327b8281ac2724345");
	ck_assert_int_eq(cas_aead_chunk_decrypt(CAS_AEAD_CIPHER_AES256GCM,
		subkey, 7, "ad", 2, ct, sizeof(ct), pt), 0);
	ck_assert(memcmp(pt, "hello", 5) == 0);
	/* another chunk index is another nonce */
	ck_assert_int_eq(cas_aead_chunk_decrypt(CAS_AEAD_CIPHER_AES256GCM,
		subkey, 8, "ad", 2, ct, sizeof(ct), pt), -1);
	sodium_memzero(subkey, sizeof(subkey));
}
END_TEST

static void roundtrip_cipher(enum cas_aead_cipher cipher)
{
	static const size_t sizes[] = {
		0, 1, 25, 4096, CASBOX_CHUNK_SIZE - 1, CASBOX_CHUNK_SIZE,
		CASBOX_CHUNK_SIZE + 1, 3 * CASBOX_CHUNK_SIZE + 77,
	};
	struct casbox_pack_store *store = store_open_cipher(keyring, cipher);
	unsigned char raw[CASBOX_FRAME_V2_HEADER_SIZE];
	struct casbox_frame_header hdr;
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	buffer_t *blob, *out = buffer_create_dynamic(default_pool, 1024);
	const char *error;
	unsigned int i, noise;

	for (i = 0; i < N_ELEMENTS(sizes); i++)
	for (noise = 0; noise < 2; noise++) {
		blob = pattern(sizes[i], i, noise == 1);
		add_blob(store, blob, &id, &rec);
		read_header(&rec, &hdr, raw);
		ck_assert_uint_eq(raw[4], 2);
		ck_assert_uint_eq(raw[5], cipher);
		ck_assert_uint_eq(hdr.chunk_count,
				  casbox_frame_chunk_count(sizes[i]));
		if (read_blob(store, &id, &rec, out, &error) < 0)
			ck_abort_msg("read: %s", error);
		ck_assert_uint_eq(out->used, blob->used);
		ck_assert(memcmp(out->data, blob->data, out->used) == 0);
		buffer_free(&blob);
	}
	buffer_free(&out);
	casbox_pack_store_close(&store);
}

START_TEST(test_ciphers_roundtrip)
{
	enum cas_aead_cipher cipher = all_ciphers[_i];

	if (!cipher_skip(cipher))
		roundtrip_cipher(cipher);
}
END_TEST

/* Every single-byte change of a one-chunk frame: EIO, never bytes. */
START_TEST(test_damage_every_byte)
{
	enum cas_aead_cipher cipher = all_ciphers[_i];
	struct casbox_pack_store *store;
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	buffer_t *blob, *out;
	unsigned char b, flipped;
	const char *error;
	uint32_t off;

	if (cipher_skip(cipher))
		return;
	store = store_open_cipher(keyring, cipher);
	blob = pattern(300, 7, FALSE);
	out = buffer_create_dynamic(default_pool, 1024);
	add_blob(store, blob, &id, &rec);
	for (off = 0; off < rec.frame_size; off++) {
		pack_pread(&rec, &b, 1, off);
		flipped = b ^ 0x01;
		pack_pwrite(&rec, &flipped, 1, off);
		ck_assert_int_eq(read_blob(store, &id, &rec, out, &error), -1);
		ck_assert_ptr_nonnull(strstr(error, cas_blob_id_to_hex(&id)));
		pack_pwrite(&rec, &b, 1, off);
	}
	ck_assert_int_eq(read_blob(store, &id, &rec, out, &error), 0);
	ck_assert(buffer_cmp(out, blob));
	buffer_free(&blob);
	buffer_free(&out);
	casbox_pack_store_close(&store);
}
END_TEST

static void rewrite_header(const struct casbox_blob_record *rec,
			   unsigned char raw[CASBOX_FRAME_V2_HEADER_SIZE])
{
	cpu32_to_le_unaligned(cas_crc32c_mask(cas_crc32c(raw, 80)), raw + 80);
	pack_pwrite(rec, raw, CASBOX_FRAME_V2_HEADER_SIZE, 0);
}

/* A header edit that keeps its CRC valid (someone who can write the
   disk): the cipher and the nonce are bound by the key derivation and
   the AAD, so the tag fails; an unknown cipher is refused by name. */
START_TEST(test_header_edits_authenticated)
{
	struct casbox_pack_store *store;
	unsigned char raw[CASBOX_FRAME_V2_HEADER_SIZE];
	unsigned char orig[CASBOX_FRAME_V2_HEADER_SIZE];
	struct casbox_frame_header hdr;
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	buffer_t *blob, *out;
	const char *error;

	if (cipher_skip(CAS_AEAD_CIPHER_AES256GCM))
		return;
	store = store_open_cipher(keyring, CAS_AEAD_CIPHER_AES256GCM);
	blob = pattern(5000, 3, FALSE);
	out = buffer_create_dynamic(default_pool, 1024);
	add_blob(store, blob, &id, &rec);
	read_header(&rec, &hdr, orig);

	memcpy(raw, orig, sizeof(raw));
	raw[5] = CAS_AEAD_CIPHER_XCHACHA20POLY1305;
	rewrite_header(&rec, raw);
	ck_assert_int_eq(read_blob(store, &id, &rec, out, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));

	memcpy(raw, orig, sizeof(raw));
	raw[24 + 5] ^= 0x80;			/* the frame nonce */
	rewrite_header(&rec, raw);
	ck_assert_int_eq(read_blob(store, &id, &rec, out, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));

	memcpy(raw, orig, sizeof(raw));
	raw[5] = CAS_AEAD_CIPHER_MAX + 1;
	rewrite_header(&rec, raw);
	ck_assert_int_eq(read_blob(store, &id, &rec, out, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, t_strdup_printf(
		"frame: unknown cipher %u", CAS_AEAD_CIPHER_MAX + 1)));

	/* the record's size is bound too: one byte more or less */
	pack_pwrite(&rec, orig, sizeof(orig), 0);
	rec.plain_size++;
	ck_assert_int_eq(read_blob(store, &id, &rec, out, &error), -1);
	rec.plain_size -= 2;
	ck_assert_int_eq(read_blob(store, &id, &rec, out, &error), -1);
	rec.plain_size++;
	ck_assert_int_eq(read_blob(store, &id, &rec, out, &error), 0);
	ck_assert(buffer_cmp(out, blob));
	buffer_free(&blob);
	buffer_free(&out);
	casbox_pack_store_close(&store);
}
END_TEST

/* Incompressible blobs whose sizes differ by less than a padme() step
   give frames of exactly one size; every stored chunk size is a
   padme() value plus the tag. */
START_TEST(test_padding_hides_size)
{
	struct casbox_pack_store *store = store_open_cipher(keyring, 0);
	struct casbox_frame_chunk chunks[2];
	unsigned char raw[CASBOX_FRAME_V2_HEADER_SIZE];
	unsigned char table[2 * CASBOX_FRAME_TABLE_ENTRY_SIZE];
	struct casbox_frame_header hdr;
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	uint32_t first_size = 0;
	buffer_t *blob;
	const char *error;
	unsigned int i;

	for (i = 0; i < 8; i++) {
		/* 40 000 + 0..140: one 2 KiB padme() bucket of zstd's
		   output for noise (raw blocks: input + a few bytes) */
		blob = pattern(40000 + i * 20, 100 + i, TRUE);
		add_blob(store, blob, &id, &rec);
		if (i == 0)
			first_size = rec.frame_size;
		ck_assert_uint_eq(rec.frame_size, first_size);
		buffer_free(&blob);
	}
	blob = pattern(CASBOX_CHUNK_SIZE + 3000, 9, FALSE);
	add_blob(store, blob, &id, &rec);
	read_header(&rec, &hdr, raw);
	ck_assert_uint_eq(hdr.chunk_count, 2);
	pack_pread(&rec, table, sizeof(table), rec.frame_size - sizeof(table));
	ck_assert_int_eq(casbox_frame_table_parse(&hdr, table, sizeof(table),
						  chunks, &error), 0);
	for (i = 0; i < 2; i++) {
		uint32_t padded = chunks[i].stored_size - CAS_AEAD_TAG_SIZE;

		ck_assert_uint_eq(casbox_padme(padded), padded);
	}
	buffer_free(&blob);
	casbox_pack_store_close(&store);
}
END_TEST

/* A chunk whose AEAD is valid but whose padding is not zero (only a
   writer with the key can make one): refused, not decoded. Made here
   by re-encrypting a real chunk with its own DEK. */
START_TEST(test_nonzero_padding)
{
	struct casbox_pack_store *store =
		store_open_cipher(keyring, CAS_AEAD_CIPHER_XCHACHA20POLY1305);
	unsigned char raw[CASBOX_FRAME_V2_HEADER_SIZE], table[8];
	unsigned char dek[CAS_DEK_SIZE], subkey[CAS_AEAD_SUBKEY_SIZE];
	unsigned char aad[CASBOX_CHUNK_AAD_SIZE], *chunk;
	struct casbox_frame_header hdr;
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	buffer_t *blob, *out;
	uint32_t stored, crc;
	size_t aad_size, padded, zlen;
	const char *error;

	/* a size whose zstd output is not a padme() size: padding > 0 */
	blob = pattern(1234, 5, TRUE);
	out = buffer_create_dynamic(default_pool, 2048);
	add_blob(store, blob, &id, &rec);
	read_header(&rec, &hdr, raw);
	pack_pread(&rec, table, sizeof(table), rec.frame_size - 8);
	stored = le32_to_cpu_unaligned(table);
	padded = stored - CAS_AEAD_TAG_SIZE;
	chunk = i_malloc(stored);
	pack_pread(&rec, chunk, stored, CASBOX_FRAME_V2_HEADER_SIZE);
	ck_assert_int_eq(cas_keyring_dek_open(keyring, &id, rec.dek_kind,
					      rec.stored_dek, dek, &error), 1);
	cas_aead_frame_subkey(hdr.cipher, dek, hdr.nonce, subkey);
	aad_size = casbox_frame_chunk_aad(&hdr, 0, TRUE, blob->used, aad);
	ck_assert_int_eq(cas_aead_chunk_decrypt(hdr.cipher, subkey, 0, aad,
						aad_size, chunk, stored,
						chunk), 0);
	zlen = ZSTD_findFrameCompressedSize(chunk, padded);
	ck_assert(!ZSTD_isError(zlen));
	ck_assert_uint_lt(zlen, padded);
	chunk[padded - 1] = 0x01;
	cas_aead_chunk_encrypt(hdr.cipher, subkey, 0, aad, aad_size, chunk,
			       padded, chunk);
	pack_pwrite(&rec, chunk, stored, CASBOX_FRAME_V2_HEADER_SIZE);
	/* the chunk and table CRCs match again: only the AEAD'd
	   content is wrong */
	crc = cas_crc32c_mask(cas_crc32c(chunk, stored));
	cpu32_to_le_unaligned(crc, table + 4);
	pack_pwrite(&rec, table, sizeof(table), rec.frame_size - 8);
	cpu32_to_le_unaligned(cas_crc32c_mask(cas_crc32c(table, 8)), raw + 20);
	rewrite_header(&rec, raw);
	ck_assert_int_eq(read_blob(store, &id, &rec, out, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "padding is not zero"));
	sodium_memzero(dek, sizeof(dek));
	sodium_memzero(subkey, sizeof(subkey));
	i_free(chunk);
	buffer_free(&blob);
	buffer_free(&out);
	casbox_pack_store_close(&store);
}
END_TEST

/* Chunk 0 of rec (a one-chunk blob of plain_size bytes) replaced by
   zframe (zlen bytes, padded as writers pad), sealed as a writer would:
   only the zstd frame differs from what the writer wrote. */
static void reseal_chunk(const struct casbox_blob_record *rec,
			 const struct cas_blob_id *id, size_t plain_size,
			 const unsigned char *zframe, size_t zlen)
{
	unsigned char raw[CASBOX_FRAME_V2_HEADER_SIZE], table[8];
	unsigned char dek[CAS_DEK_SIZE], subkey[CAS_AEAD_SUBKEY_SIZE];
	unsigned char aad[CASBOX_CHUNK_AAD_SIZE], *chunk;
	struct casbox_frame_header hdr;
	size_t aad_size, padded, stored;
	const char *error;

	read_header(rec, &hdr, raw);
	pack_pread(rec, table, sizeof(table), rec->frame_size - 8);
	stored = le32_to_cpu_unaligned(table);
	padded = stored - CAS_AEAD_TAG_SIZE;
	/* the same bucket, so frame and table sizes stay right */
	ck_assert_uint_eq(casbox_padme(zlen), padded);
	chunk = i_malloc(stored);
	memcpy(chunk, zframe, zlen);
	memset(chunk + zlen, 0, padded - zlen);
	ck_assert_int_eq(cas_keyring_dek_open(keyring, id, rec->dek_kind,
					      rec->stored_dek, dek, &error), 1);
	cas_aead_frame_subkey(hdr.cipher, dek, hdr.nonce, subkey);
	aad_size = casbox_frame_chunk_aad(&hdr, 0, TRUE, plain_size, aad);
	cas_aead_chunk_encrypt(hdr.cipher, subkey, 0, aad, aad_size, chunk,
			       padded, chunk);
	pack_pwrite(rec, chunk, stored, CASBOX_FRAME_V2_HEADER_SIZE);
	cpu32_to_le_unaligned(cas_crc32c_mask(cas_crc32c(chunk, stored)),
			      table + 4);
	pack_pwrite(rec, table, sizeof(table), rec->frame_size - 8);
	cpu32_to_le_unaligned(cas_crc32c_mask(cas_crc32c(table, 8)), raw + 20);
	rewrite_header(rec, raw);
	sodium_memzero(dek, sizeof(dek));
	sodium_memzero(subkey, sizeof(subkey));
	i_free(chunk);
}

/* The blob as a zstd frame without content size (so with a window
   descriptor), its window set to 2^window_log. Returns its size. */
static size_t zstd_frame_window(const buffer_t *blob, unsigned int window_log,
				unsigned char *out, size_t out_size)
{
	ZSTD_CCtx *cctx = ZSTD_createCCtx();
	size_t zlen;

	ck_assert_ptr_nonnull(cctx);
	ck_assert(!ZSTD_isError(ZSTD_CCtx_setParameter(cctx,
		ZSTD_c_contentSizeFlag, 0)));
	zlen = ZSTD_compress2(cctx, out, out_size, blob->data, blob->used);
	ck_assert(!ZSTD_isError(zlen));
	ZSTD_freeCCtx(cctx);
	/* magic, frame header descriptor 0 (no single segment, no
	   checksum, no dictionary id), window descriptor */
	ck_assert_uint_eq(out[4], 0);
	out[5] = (unsigned char)((window_log - 10) << 3);
	return zlen;
}

/* A frame's window is bounded: at the limit it decodes (zstd needs no
   more memory one-shot), above it the chunk is refused by name, though
   its AEAD tag is good and zstd alone would decode it. */
START_TEST(test_window_too_large)
{
	struct casbox_pack_store *store =
		store_open_cipher(keyring, CAS_AEAD_CIPHER_XCHACHA20POLY1305);
	static const unsigned int logs[] = {
		CASBOX_ZSTD_WINDOW_LOG_MAX, CASBOX_ZSTD_WINDOW_LOG_MAX + 1, 31,
	};
	unsigned char zframe[4096], plain[4096];
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	buffer_t *blob, *out;
	const char *error;
	uint64_t window;
	unsigned int i;
	size_t zlen;

	blob = pattern(3000, 11, FALSE);
	out = buffer_create_dynamic(default_pool, 4096);
	for (i = 0; i < N_ELEMENTS(logs); i++) {
		add_blob(store, blob, &id, &rec);
		zlen = zstd_frame_window(blob, logs[i], zframe,
					 sizeof(zframe));
		ck_assert_int_eq(casbox_frame_zstd_window(zframe, zlen,
							  &window, &error), 0);
		ck_assert_uint_eq(window, 1ULL << logs[i]);
		/* zstd itself takes the frame, whatever the window */
		ck_assert_uint_eq(ZSTD_decompress(plain, sizeof(plain),
						  zframe, zlen), blob->used);
		reseal_chunk(&rec, &id, blob->used, zframe, zlen);
		if (logs[i] <= CASBOX_ZSTD_WINDOW_LOG_MAX) {
			ck_assert_int_eq(read_blob(store, &id, &rec, out,
						   &error), 0);
			ck_assert(buffer_cmp(out, blob));
			continue;
		}
		ck_assert_int_eq(read_blob(store, &id, &rec, out, &error), -1);
		ck_assert_msg(strstr(error, t_strdup_printf(
			"chunk 0: zstd window of %llu bytes exceeds the limit "
			"of %u", 1ULL << logs[i],
			1U << CASBOX_ZSTD_WINDOW_LOG_MAX)) != NULL,
			"error: %s", error);
	}
	buffer_free(&blob);
	buffer_free(&out);
	casbox_pack_store_close(&store);
}
END_TEST

/* The window of a single-segment frame is its content size, in each
   of the four field sizes; bytes that are no frame header are refused. */
START_TEST(test_zstd_window_parse)
{
	static const size_t sizes[] = { 1, 200, 255, 256, 300, 65535, 65536,
					65792, 70000 };
	unsigned char *src, *z, junk[8] = { 0x28, 0xb5, 0x2f, 0xfd, 0xe0 };
	const char *error;
	uint64_t window;
	unsigned int i;
	size_t zlen, cap = ZSTD_compressBound(70000);

	src = i_malloc(70000);
	memset(src, 'a', 70000);
	z = i_malloc(cap);
	for (i = 0; i < N_ELEMENTS(sizes); i++) {
		zlen = ZSTD_compress(z, cap, src, sizes[i], 3);
		ck_assert(!ZSTD_isError(zlen));
		ck_assert_int_eq(casbox_frame_zstd_window(z, zlen, &window,
							  &error), 0);
		ck_assert_uint_eq(window, sizes[i]);
	}
	ck_assert_int_eq(casbox_frame_zstd_window(z, 5, &window, &error), -1);
	ck_assert_str_eq(error, "no zstd frame header");
	z[0] ^= 1;
	ck_assert_int_eq(casbox_frame_zstd_window(z, zlen, &window, &error),
			 -1);
	/* single segment, 8-byte content size, 6 bytes given */
	ck_assert_int_eq(casbox_frame_zstd_window(junk, 6, &window, &error),
			 -1);
	ck_assert_str_eq(error, "zstd frame header truncated");
	i_free(src);
	i_free(z);
}
END_TEST

/* The same blob twice: fresh DEK and frame nonce, other ciphertext. */
START_TEST(test_fresh_nonce)
{
	struct casbox_pack_store *store = store_open_cipher(keyring, 0);
	unsigned char raw1[CASBOX_FRAME_V2_HEADER_SIZE];
	unsigned char raw2[CASBOX_FRAME_V2_HEADER_SIZE];
	unsigned char c1[32], c2[32];
	struct casbox_frame_header h1, h2;
	struct casbox_blob_record r1, r2;
	struct cas_blob_id id;
	buffer_t *blob = pattern(3000, 1, FALSE);

	add_blob(store, blob, &id, &r1);
	add_blob(store, blob, &id, &r2);
	read_header(&r1, &h1, raw1);
	read_header(&r2, &h2, raw2);
	ck_assert(memcmp(h1.nonce, h2.nonce, sizeof(h1.nonce)) != 0);
	pack_pread(&r1, c1, sizeof(c1), CASBOX_FRAME_V2_HEADER_SIZE);
	pack_pread(&r2, c2, sizeof(c2), CASBOX_FRAME_V2_HEADER_SIZE);
	ck_assert(memcmp(c1, c2, sizeof(c1)) != 0);
	ck_assert(memcmp(r1.stored_dek, r2.stored_dek,
			 CAS_WRAPPED_DEK_SIZE) != 0);
	buffer_free(&blob);
	casbox_pack_store_close(&store);
}
END_TEST

/* One committed fixture: a version 2 blob record, then the pack. */
static void golden_v2(const char *name, const buffer_t *expected)
{
	const char *top = getenv("CASBOX_TOP_SRCDIR");
	struct cas_keyring *k = test_keyring(0x42);
	struct casbox_pack_store *store;
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	buffer_t *seed, *out;
	const char *path, *error;
	char tmp[8192];
	size_t n;
	FILE *f;

	path = t_strdup_printf("%s/tests/fuzz/corpus/pack/%s",
			       top == NULL ? CASBOX_SRCDIR : top, name);
	seed = buffer_create_dynamic(default_pool, 4096);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	while ((n = fread(tmp, 1, sizeof(tmp), f)) > 0)
		buffer_append(seed, tmp, n);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_uint_gt(seed->used, CASBOX_BLOB_RECORD_EXPORT_SIZE);
	ck_assert_int_eq(casbox_blob_record_import(seed->data,
		CASBOX_BLOB_RECORD_EXPORT_SIZE, &rec, &error), 1);
	store = store_open_cipher(k, 0);
	f = fopen(pack_file(rec.pack_id), "w");
	ck_assert_ptr_nonnull(f);
	n = seed->used - CASBOX_BLOB_RECORD_EXPORT_SIZE;
	ck_assert_uint_eq(fwrite(CONST_PTR_OFFSET(seed->data,
			CASBOX_BLOB_RECORD_EXPORT_SIZE), 1, n, f), n);
	ck_assert_int_eq(fclose(f), 0);
	/* version 2, and the plaintext size is not in the frame */
	ck_assert_uint_eq(((const unsigned char *)seed->data)
			  [CASBOX_BLOB_RECORD_EXPORT_SIZE + rec.offset + 4], 2);
	cas_blob_id_compute(k, expected->data, expected->used, &id);
	out = buffer_create_dynamic(default_pool, 1024);
	if (read_blob(store, &id, &rec, out, &error) < 0)
		ck_abort_msg("%s: %s", name, error);
	ck_assert(buffer_cmp(out, expected));
	buffer_free(&out);
	buffer_free(&seed);
	casbox_pack_store_close(&store);
	cas_keyring_free(&k);
}

START_TEST(test_golden_v2)
{
	buffer_t *expected = buffer_create_dynamic(default_pool, 70000);
	unsigned int i;

	buffer_append(expected, "Subject: hello\r\n\r\nworld\r\n", 25);
	golden_v2("v2-small-xchacha", expected);
	if (!cipher_skip(CAS_AEAD_CIPHER_AES256GCM))
		golden_v2("v2-small-aes", expected);
	buffer_set_used_size(expected, 0);
	for (i = 0; i < 70000; i++)
		buffer_append_c(expected, "casbox \r\n"[(i * 7 + i / 13) % 9]);
	golden_v2("v2-three-frames-xchacha", expected);
	golden_v2("v2-meta-frames-xchacha", expected);
	if (!cipher_skip(CAS_AEAD_CIPHER_AES256GCM)) {
		golden_v2("v2-two-chunks-aes", expected);
		buffer_set_used_size(expected, 0);
		golden_v2("v2-empty-aes", expected);
	}
	buffer_free(&expected);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("frame-v2");
	TCase *tc = tcase_create("core");
	int failed;

	lib_init();
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_padme);
	tcase_add_test(tc, test_known_answer);
	tcase_add_loop_test(tc, test_ciphers_roundtrip, 0,
			    N_ELEMENTS(all_ciphers));
	tcase_add_loop_test(tc, test_damage_every_byte, 0,
			    N_ELEMENTS(all_ciphers));
	tcase_add_test(tc, test_header_edits_authenticated);
	tcase_add_test(tc, test_padding_hides_size);
	tcase_add_test(tc, test_nonzero_padding);
	tcase_add_test(tc, test_fresh_nonce);
	tcase_add_test(tc, test_window_too_large);
	tcase_add_test(tc, test_zstd_window_parse);
	tcase_add_test(tc, test_golden_v2);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
