/* cas-key: key file create/load, every truncation and single-byte change
   of a key file, wrapped DEK and sealed record rejected, wrong keys
   rejected, blob ids match an independent known answer (computed with
   Python's hashlib.blake2b from the KDF definition). */

#include "lib.h"
#include "buffer.h"
#include "str.h"
#include "cas-key.h"
#include "cas-keyfile.h"

#include <check.h>
#include "check-run.h"
#include <sodium.h>
#include <stdlib.h>
#include <stdio.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#define KEY_FILE_SIZE 72
/* CASKEY2: 44 + 36 per slot + 32 */
#define KEY_FILE_V2_SIZE(n) (44 + 36 * (n) + 32)
#define KEY_FILE_V3_SIZE(n, m) (48 + 36 * (n) + 36 * (m) + 32)
#define KEY_FILE_V3_MAX KEY_FILE_V3_SIZE(2, 2)

static char tmpdir[] = "/tmp/check-key.XXXXXX";

static void setup(void)
{
	strcpy(tmpdir, "/tmp/check-key.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown(void)
{
	const char *cmd = t_strdup_printf("rm -rf '%s'", tmpdir);

	ck_assert_int_eq(system(cmd), 0);
}

static const char *tmp_path(const char *name)
{
	return t_strdup_printf("%s/%s", tmpdir, name);
}

static void write_file(const char *path, const void *data, size_t size)
{
	FILE *f = fopen(path, "w");

	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(data, 1, size, f), size);
	ck_assert_int_eq(fclose(f), 0);
	/* key files others can read are refused (test_key_file_mode) */
	ck_assert_int_eq(chmod(path, 0600), 0);
}

static size_t read_file(const char *path, unsigned char *buf, size_t max)
{
	FILE *f = fopen(path, "r");
	size_t n;

	ck_assert_ptr_nonnull(f);
	n = fread(buf, 1, max, f);
	ck_assert_int_eq(fclose(f), 0);
	return n;
}

static struct cas_keyring *test_keyring(unsigned char seed)
{
	unsigned char kek[CAS_KEK_SIZE];
	unsigned int i;

	for (i = 0; i < sizeof(kek); i++)
		kek[i] = (unsigned char)(i + seed);
	return cas_keyring_create_from_kek(kek);
}

START_TEST(test_create_load)
{
	struct cas_keyring *k1, *k2;
	struct cas_blob_id id1, id2;
	const char *path = tmp_path("u.key"), *error;
	struct stat st;

	ck_assert_int_eq(cas_keyring_load(path, &k1, &error), 0);
	ck_assert_ptr_null(k1);
	ck_assert_int_eq(cas_keyring_create(path, &k1, &error), 1);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_eq(st.st_mode & 0777, 0600);
	ck_assert_int_eq(st.st_size, KEY_FILE_SIZE);
	/* never overwritten */
	ck_assert_int_eq(cas_keyring_create(path, &k2, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, path));
	ck_assert_int_eq(cas_keyring_load(path, &k2, &error), 1);
	ck_assert_uint_eq(cas_keyring_key_id(k1), cas_keyring_key_id(k2));
	cas_blob_id_compute(k1, "abc", 3, &id1);
	cas_blob_id_compute(k2, "abc", 3, &id2);
	ck_assert_mem_eq(id1.id, id2.id, sizeof(id1.id));
	cas_keyring_free(&k2);
	ck_assert_ptr_null(k2);

	/* a second key gives other ids */
	ck_assert_int_eq(cas_keyring_create(tmp_path("v.key"), &k2,
					    &error), 1);
	ck_assert_uint_ne(cas_keyring_key_id(k1), cas_keyring_key_id(k2));
	cas_blob_id_compute(k2, "abc", 3, &id2);
	ck_assert_mem_ne(id1.id, id2.id, sizeof(id1.id));
	cas_keyring_free(&k1);
	cas_keyring_free(&k2);

	/* a missing directory is an error, not "no key" */
	ck_assert_int_eq(cas_keyring_create(tmp_path("no/such.key"), &k1,
					    &error), -1);
}
END_TEST

START_TEST(test_key_file_damage)
{
	unsigned char file[KEY_FILE_SIZE + 8], bad[KEY_FILE_SIZE + 8];
	struct cas_keyring *k;
	const char *path = tmp_path("d.key"), *bad_path = tmp_path("bad.key");
	const char *error;
	size_t size, len, i;
	unsigned int v;

	ck_assert_int_eq(cas_keyring_create(path, &k, &error), 1);
	cas_keyring_free(&k);
	size = read_file(path, file, sizeof(file));
	ck_assert_uint_eq(size, KEY_FILE_SIZE);
	ck_assert_int_eq(cas_key_file_parse(file, size, &k, &error), 1);
	cas_keyring_free(&k);

	/* every truncation, through the file path */
	for (len = 0; len < size; len++) {
		write_file(bad_path, file, len);
		ck_assert_int_eq(cas_keyring_load(bad_path, &k, &error), -1);
		ck_assert_ptr_null(k);
		ck_assert_ptr_nonnull(strstr(error, bad_path));
	}
	/* a grown file */
	memcpy(bad, file, size);
	bad[size] = 0;
	write_file(bad_path, bad, size + 1);
	ck_assert_int_eq(cas_keyring_load(bad_path, &k, &error), -1);
	/* every single-byte change, every value */
	for (i = 0; i < size; i++) {
		for (v = 1; v < 256; v++) {
			memcpy(bad, file, size);
			bad[i] ^= v;
			ck_assert_int_eq(cas_key_file_parse(bad, size, &k,
							    &error), -1);
			ck_assert_ptr_null(k);
		}
		/* and one of them through the file */
		memcpy(bad, file, size);
		bad[i] ^= 0x20;
		write_file(bad_path, bad, size);
		ck_assert_int_eq(cas_keyring_load(bad_path, &k, &error), -1);
		ck_assert_ptr_nonnull(strstr(error, bad_path));
	}
}
END_TEST

START_TEST(test_unreadable)
{
	struct cas_keyring *k;
	const char *error;

	/* a directory where the file should be */
	ck_assert_int_eq(cas_keyring_load(tmpdir, &k, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, tmpdir));
}
END_TEST

static const struct {
	const char *data;
	size_t size;
	const char *hex;
} id_kat[] = {
	{ "", 0,
	  "24cc0bcb5845e37364f33428f8536d4c86e6f86b851847d4303864230dffc3cd" },
	{ "hello", 5,
	  "8a78504129bff9a7cd5f1204ca0ea959d62dac9debea899821ae4c0c08005900" },
};

START_TEST(test_blob_id_known_answers)
{
	struct cas_keyring *k = test_keyring(0);
	struct cas_blob_id id, id2;
	struct cas_blob_id_ctx ctx;
	unsigned char *a;
	unsigned int i;
	size_t split;

	ck_assert_uint_eq(cas_keyring_key_id(k), 0xc26b5fc7U);
	for (i = 0; i < N_ELEMENTS(id_kat); i++) {
		cas_blob_id_compute(k, id_kat[i].data, id_kat[i].size, &id);
		ck_assert_str_eq(cas_blob_id_to_hex(&id), id_kat[i].hex);
		ck_assert_int_eq(cas_blob_id_from_hex(id_kat[i].hex, &id2), 0);
		ck_assert_mem_eq(id.id, id2.id, sizeof(id.id));
	}
	a = i_malloc(1000);
	memset(a, 'a', 1000);
	cas_blob_id_compute(k, a, 1000, &id);
	ck_assert_str_eq(cas_blob_id_to_hex(&id),
		"659a39722da9e96eb7fc49217e21547a"
		"1e35fdb542f2f2bcf129fdca5aa211ed");
	for (split = 0; split <= 1000; split += 7) {
		cas_blob_id_init(k, &ctx);
		cas_blob_id_update(&ctx, a, split);
		cas_blob_id_update(&ctx, a + split, 1000 - split);
		cas_blob_id_final(&ctx, &id2);
		ck_assert_mem_eq(id.id, id2.id, sizeof(id.id));
	}
	i_free(a);
	cas_keyring_free(&k);
}
END_TEST

START_TEST(test_blob_id_hex_rejects)
{
	struct cas_blob_id id;
	const char *good = id_kat[0].hex;
	char bad[65];

	ck_assert_int_eq(cas_blob_id_from_hex("", &id), -1);
	ck_assert_int_eq(cas_blob_id_from_hex("abc", &id), -1);
	memcpy(bad, good, 65);
	bad[10] = 'A';
	ck_assert_int_eq(cas_blob_id_from_hex(bad, &id), -1);
	bad[10] = 'g';
	ck_assert_int_eq(cas_blob_id_from_hex(bad, &id), -1);
	ck_assert_int_eq(cas_blob_id_from_hex(t_strconcat(good, "0", NULL),
					      &id), -1);
}
END_TEST

START_TEST(test_dek_wrap)
{
	struct cas_keyring *k = test_keyring(0), *k2 = test_keyring(1);
	unsigned char dek[CAS_DEK_SIZE], out[CAS_DEK_SIZE];
	unsigned char wrapped[CAS_WRAPPED_DEK_SIZE], bad[CAS_WRAPPED_DEK_SIZE];
	unsigned char zero[CAS_DEK_SIZE];
	struct cas_blob_id id, id2;
	const char *error;
	unsigned int i, v;

	memset(zero, 0, sizeof(zero));
	cas_blob_id_compute(k, "x", 1, &id);
	cas_blob_id_compute(k, "y", 1, &id2);
	cas_dek_generate(dek);
	cas_dek_wrap(k, &id, dek, wrapped);
	ck_assert_int_eq(cas_dek_unwrap(k, &id, wrapped, out, &error), 1);
	ck_assert_mem_eq(dek, out, sizeof(dek));
	/* bound to the blob id */
	ck_assert_int_eq(cas_dek_unwrap(k, &id2, wrapped, out, &error), -1);
	ck_assert_mem_eq(out, zero, sizeof(out));
	/* wrong key */
	ck_assert_int_eq(cas_dek_unwrap(k2, &id, wrapped, out, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "another key"));
	/* wrong key that claims our key id */
	memcpy(bad, wrapped, sizeof(bad));
	i = cas_keyring_key_id(k2);
	bad[0] = i >> 24; bad[1] = i >> 16; bad[2] = i >> 8; bad[3] = i;
	ck_assert_int_eq(cas_dek_unwrap(k2, &id, bad, out, &error), -1);
	ck_assert_mem_eq(out, zero, sizeof(out));
	/* every single-byte change */
	for (i = 0; i < sizeof(wrapped); i++) {
		for (v = 1; v < 256; v++) {
			memcpy(bad, wrapped, sizeof(bad));
			bad[i] ^= v;
			ck_assert_int_eq(cas_dek_unwrap(k, &id, bad, out,
							&error), -1);
			ck_assert_mem_eq(out, zero, sizeof(out));
		}
	}
	/* two wraps of one DEK differ (random nonce) */
	cas_dek_wrap(k, &id, dek, bad);
	ck_assert_mem_ne(bad, wrapped, sizeof(bad));
	cas_keyring_free(&k);
	cas_keyring_free(&k2);
}
END_TEST

START_TEST(test_dek_rewrap)
{
	struct cas_keyring *k1 = test_keyring(0), *k2 = test_keyring(1);
	unsigned char dek[CAS_DEK_SIZE], out[CAS_DEK_SIZE];
	unsigned char w1[CAS_WRAPPED_DEK_SIZE], w2[CAS_WRAPPED_DEK_SIZE];
	unsigned char w3[CAS_WRAPPED_DEK_SIZE];
	struct cas_blob_id id;
	const char *error;

	cas_blob_id_compute(k1, "m", 1, &id);
	cas_dek_generate(dek);
	cas_dek_wrap(k1, &id, dek, w1);
	ck_assert_int_eq(cas_dek_rewrap(k1, k2, &id, w1, w2, &error), 1);
	ck_assert_int_eq(cas_dek_unwrap(k2, &id, w2, out, &error), 1);
	ck_assert_mem_eq(out, dek, sizeof(dek));
	ck_assert_int_eq(cas_dek_unwrap(k1, &id, w2, out, &error), -1);
	/* rewrapping something the old key cannot open fails */
	memset(w3, 0xaa, sizeof(w3));
	ck_assert_int_eq(cas_dek_rewrap(k1, k2, &id, w2, w3, &error), -1);
	ck_assert_uint_eq(w3[0], 0xaa);
	cas_keyring_free(&k1);
	cas_keyring_free(&k2);
}
END_TEST

START_TEST(test_record_seal)
{
	struct cas_keyring *k = test_keyring(0), *k2 = test_keyring(1);
	buffer_t *sealed = buffer_create_dynamic(default_pool, 64);
	buffer_t *plain = buffer_create_dynamic(default_pool, 64);
	buffer_t *bad = buffer_create_dynamic(default_pool, 64);
	const char *msg = "a small index record", *error;
	unsigned char *p;
	size_t len, i;
	unsigned int v;

	buffer_append(sealed, "keep", 4);
	cas_record_seal(k, "seg1", 4, msg, strlen(msg), sealed);
	ck_assert_uint_eq(sealed->used, 4 + 24 + strlen(msg) + 16);
	for (i = 0; i + strlen(msg) <= sealed->used; i++) {
		ck_assert(memcmp(CONST_PTR_OFFSET(sealed->data, i), msg,
				 strlen(msg)) != 0);
	}
	buffer_append(plain, "pre", 3);
	ck_assert_int_eq(cas_record_open(k, "seg1", 4,
		CONST_PTR_OFFSET(sealed->data, 4), sealed->used - 4,
		plain, &error), 1);
	ck_assert_uint_eq(plain->used, 3 + strlen(msg));
	ck_assert_mem_eq(plain->data, "pre", 3);
	ck_assert_mem_eq(CONST_PTR_OFFSET(plain->data, 3), msg, strlen(msg));
	buffer_set_used_size(plain, 0);
	buffer_delete(sealed, 0, 4);

	ck_assert_int_eq(cas_record_open(k, "seg2", 4, sealed->data,
					 sealed->used, plain, &error), -1);
	ck_assert_int_eq(cas_record_open(k2, "seg1", 4, sealed->data,
					 sealed->used, plain, &error), -1);
	ck_assert_uint_eq(plain->used, 0);
	for (len = 0; len < sealed->used; len++) {
		ck_assert_int_eq(cas_record_open(k, "seg1", 4, sealed->data,
			len, plain, &error), -1);
		ck_assert_uint_eq(plain->used, 0);
	}
	for (i = 0; i < sealed->used; i++) {
		for (v = 1; v < 256; v++) {
			buffer_set_used_size(bad, 0);
			buffer_append_buf(bad, sealed, 0, SIZE_MAX);
			p = buffer_get_modifiable_data(bad, NULL);
			p[i] ^= v;
			ck_assert_int_eq(cas_record_open(k, "seg1", 4,
				bad->data, bad->used, plain, &error), -1);
			ck_assert_uint_eq(plain->used, 0);
		}
	}
	/* empty record */
	buffer_set_used_size(sealed, 0);
	cas_record_seal(k, "", 0, "", 0, sealed);
	ck_assert_int_eq(cas_record_open(k, "", 0, sealed->data, sealed->used,
					 plain, &error), 1);
	ck_assert_uint_eq(plain->used, 0);
	buffer_free(&sealed);
	buffer_free(&plain);
	buffer_free(&bad);
	cas_keyring_free(&k);
	cas_keyring_free(&k2);
}
END_TEST

START_TEST(test_raw_aead)
{
	unsigned char key[CAS_DEK_SIZE], nonce[CAS_AEAD_NONCE_SIZE];
	unsigned char ct[5 + CAS_AEAD_TAG_SIZE], pt[5];

	memset(key, 7, sizeof(key));
	memset(nonce, 1, sizeof(nonce));
	cas_aead_encrypt(key, nonce, "ad", 2, "hello", 5, ct);
	ck_assert_int_eq(cas_aead_decrypt(key, nonce, "ad", 2, ct, sizeof(ct),
					  pt), 0);
	ck_assert_mem_eq(pt, "hello", 5);
	ck_assert_int_eq(cas_aead_decrypt(key, nonce, "ae", 2, ct, sizeof(ct),
					  pt), -1);
	ck_assert_int_eq(cas_aead_decrypt(key, nonce, "ad", 2, ct, 15, pt),
			 -1);
}
END_TEST

/* A copy of the key file at path (the test's view of the bytes). */
static size_t key_image(const char *path, unsigned char *buf, size_t max)
{
	return read_file(path, buf, max);
}

static void recheck(unsigned char *file, size_t size)
{
	crypto_generichash(file + size - 32, 32, file, size - 32, NULL, 0);
}

static uint32_t be32(const unsigned char *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) |
		((uint32_t)p[2] << 8) | p[3];
}

/* Does needle occur anywhere in the n bytes at hay? */
static bool has_bytes(const unsigned char *hay, size_t n,
		      const unsigned char *needle, size_t len)
{
	size_t i;

	for (i = 0; i + len <= n; i++) {
		if (memcmp(hay + i, needle, len) == 0)
			return TRUE;
	}
	return FALSE;
}

/* v1 file -> rotation start (v3, two slots, two epochs) -> rotation end
   (v3, one of each): the new epoch's blob ids, sealed records and store
   keys are its own; the key id and fingerprint never change; after the
   end the old root is nowhere in the file. */
START_TEST(test_v3_round_trip)
{
	struct cas_keyring *k1, *k2, *k3;
	unsigned char dek[CAS_DEK_SIZE], out[CAS_DEK_SIZE];
	unsigned char w1[CAS_WRAPPED_DEK_SIZE], w2[CAS_WRAPPED_DEK_SIZE];
	unsigned char w3[CAS_WRAPPED_DEK_SIZE], image[KEY_FILE_V3_MAX + 1];
	unsigned char v1_image[KEY_FILE_SIZE];
	unsigned char fp1[CAS_KEY_FINGERPRINT_SIZE];
	unsigned char fp[CAS_KEY_FINGERPRINT_SIZE];
	unsigned char sk0[CAS_STORE_KEY_SIZE], sk1[CAS_STORE_KEY_SIZE];
	unsigned char sk[CAS_STORE_KEY_SIZE];
	const char *path = tmp_path("r.key"), *error;
	struct cas_blob_id id1, id2, id;
	struct cas_blob_id_ctx ctx;
	buffer_t *sealed, *sealed1, *plain, *resealed;
	uint32_t old_id, new_id, retiring, epoch;
	struct stat st;
	size_t size;
	bool changed;

	ck_assert_int_eq(cas_keyring_create(path, &k1, &error), 1);
	ck_assert_uint_eq(read_file(path, v1_image, sizeof(v1_image)),
			  KEY_FILE_SIZE);
	ck_assert_uint_eq(cas_keyring_slot_count(k1), 1);
	ck_assert_uint_eq(cas_keyring_epoch_count(k1), 1);
	ck_assert_uint_eq(cas_keyring_store_epoch(k1), 0);
	ck_assert(!cas_keyring_retiring_epoch(k1, &epoch));
	old_id = cas_keyring_wrap_key_id(k1);
	/* a never rotated key: its only slot has the root's id */
	ck_assert_uint_eq(old_id, cas_keyring_key_id(k1));
	ck_assert(!cas_keyring_retiring_key_id(k1, &retiring));
	cas_keyring_fingerprint(k1, fp1);
	ck_assert_int_eq(cas_keyring_store_key(k1, CAS_STORE_KEY_RECORD, 0,
					       sk0, &error), 1);
	cas_blob_id_compute(k1, "abc", 3, &id1);
	cas_dek_generate(dek);
	cas_dek_wrap(k1, &id1, dek, w1);
	sealed = t_buffer_create(128);
	cas_record_seal(k1, "aad", 3, "index data", 10, sealed);

	/* begin a rotation on a loaded copy, as doveadm does */
	ck_assert_int_eq(cas_keyring_load(path, &k2, &error), 1);
	cas_keyring_rotate_add(k2);
	ck_assert_uint_eq(cas_keyring_slot_count(k2), 2);
	ck_assert_uint_eq(cas_keyring_epoch_count(k2), 2);
	ck_assert_uint_eq(cas_keyring_store_epoch(k2), 1);
	ck_assert(cas_keyring_retiring_epoch(k2, &epoch));
	ck_assert_uint_eq(epoch, 0);
	new_id = cas_keyring_wrap_key_id(k2);
	ck_assert_uint_ne(new_id, old_id);
	ck_assert(cas_keyring_retiring_key_id(k2, &retiring));
	ck_assert_uint_eq(retiring, old_id);
	ck_assert_int_eq(cas_keyring_save(k2, path, &error), 1);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_eq(st.st_mode & 0777, 0600);
	size = key_image(path, image, sizeof(image));
	ck_assert_uint_eq(size, KEY_FILE_V3_SIZE(2, 2));
	ck_assert_mem_eq(image, "CASKEY3\x03", 8);
	ck_assert_uint_eq(be32(image + 8), cas_keyring_key_id(k1));
	ck_assert_mem_eq(image + 12, fp1, sizeof(fp1));
	ck_assert_uint_eq(image[44], 2);
	ck_assert_uint_eq(image[46], 2);
	ck_assert_uint_eq(be32(image + 48 + 36 * image[45]), new_id);
	ck_assert_uint_eq(be32(image + 48 + 72 + 36 * image[47]), 1);
	cas_keyring_free(&k2);

	ck_assert_int_eq(cas_keyring_load(path, &k2, &error), 1);
	ck_assert_uint_eq(cas_keyring_slot_count(k2), 2);
	ck_assert_uint_eq(cas_keyring_wrap_key_id(k2), new_id);
	ck_assert_uint_eq(cas_keyring_store_epoch(k2), 1);
	/* the name of the key stays */
	ck_assert_uint_eq(cas_keyring_key_id(k2), cas_keyring_key_id(k1));
	cas_keyring_fingerprint(k2, fp);
	ck_assert_mem_eq(fp, fp1, sizeof(fp));
	/* the new epoch's blob ids differ; the old key is the second */
	cas_blob_id_compute(k2, "abc", 3, &id2);
	ck_assert_mem_ne(id1.id, id2.id, sizeof(id1.id));
	ck_assert_uint_eq(cas_blob_id_key_count(k2), 2);
	cas_blob_id_init_nth(k2, 1, &ctx);
	cas_blob_id_update(&ctx, "abc", 3);
	cas_blob_id_final(&ctx, &id);
	ck_assert_mem_eq(id.id, id1.id, sizeof(id.id));
	ck_assert_uint_eq(cas_blob_id_key_count(k1), 1);
	/* store keys: epoch 0 as before, epoch 1 its own, the old file
	   has no epoch 1 */
	ck_assert_int_eq(cas_keyring_store_key(k2, CAS_STORE_KEY_RECORD, 0,
					       sk, &error), 1);
	ck_assert_mem_eq(sk, sk0, sizeof(sk));
	ck_assert_int_eq(cas_keyring_store_key(k2, CAS_STORE_KEY_RECORD, 1,
					       sk1, &error), 1);
	ck_assert_mem_ne(sk1, sk0, sizeof(sk1));
	ck_assert_int_eq(cas_keyring_store_key(k1, CAS_STORE_KEY_RECORD, 1,
					       sk, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "epoch 1"));
	/* old sealed records open, new ones are sealed under epoch 1 and
	   the old key file does not open them */
	plain = t_buffer_create(32);
	ck_assert_int_eq(cas_record_open(k2, "aad", 3, sealed->data,
					 sealed->used, plain, &error), 1);
	ck_assert_mem_eq(plain->data, "index data", 10);
	sealed1 = t_buffer_create(128);
	cas_record_seal(k2, "aad", 3, "new data", 8, sealed1);
	buffer_set_used_size(plain, 0);
	ck_assert_int_eq(cas_record_open(k1, "aad", 3, sealed1->data,
					 sealed1->used, plain, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));
	/* re-seal: the old record moves to epoch 1, a new one stays */
	resealed = t_buffer_create(128);
	ck_assert_int_eq(cas_record_reseal(k2, "aad", 3, sealed1->data,
					   sealed1->used, resealed, &error), 0);
	ck_assert_uint_eq(resealed->used, 0);
	ck_assert_int_eq(cas_record_reseal(k2, "aad", 3, sealed->data,
					   sealed->used, resealed, &error), 1);
	ck_assert_int_eq(cas_record_reseal(k2, "aae", 3, sealed->data,
					   sealed->used, resealed, &error), -1);
	/* old wraps open through the retiring slot, new wraps use the
	   new one */
	ck_assert_int_eq(cas_dek_unwrap(k2, &id1, w1, out, &error), 1);
	ck_assert_mem_eq(out, dek, sizeof(dek));
	cas_dek_wrap(k2, &id1, dek, w2);
	ck_assert_uint_eq(cas_dek_wrapped_key_id(w2), new_id);
	/* the old key file cannot open the new wrap, and says why */
	ck_assert_int_eq(cas_dek_unwrap(k1, &id1, w2, out, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "another key"));
	ck_assert_int_eq(cas_dek_rewrap(k2, k2, &id1, w1, w3, &error), 1);
	ck_assert_uint_eq(cas_dek_wrapped_key_id(w3), new_id);

	/* another process notices the new file in place and adopts its
	   epoch; with a stat() made by the caller (one for two rings of
	   the same file) as well as by itself */
	ck_assert(cas_keyring_refresh_needs_stat(k1));
	{
		struct cas_keyring *k1b;
		struct stat st;

		ck_assert_int_eq(stat(path, &st), 0);
		k1b = cas_keyring_dup(k1);
		ck_assert_int_eq(cas_keyring_refresh_stat(k1b, path, &st,
					&changed, &error), 1);
		ck_assert(changed);
		ck_assert_uint_eq(cas_keyring_wrap_key_id(k1b), new_id);
		ck_assert_int_eq(cas_keyring_refresh_stat(k1b, path, &st,
					&changed, &error), 1);
		ck_assert(!changed);
		cas_keyring_free(&k1b);
	}
	ck_assert_int_eq(cas_keyring_refresh(k1, path, &changed, &error), 1);
	ck_assert(changed);
	ck_assert_uint_eq(cas_keyring_wrap_key_id(k1), new_id);
	ck_assert_uint_eq(cas_keyring_store_epoch(k1), 1);
	cas_blob_id_compute(k1, "abc", 3, &id);
	ck_assert_mem_eq(id.id, id2.id, sizeof(id.id));
	buffer_set_used_size(plain, 0);
	ck_assert_int_eq(cas_record_open(k1, "aad", 3, sealed1->data,
					 sealed1->used, plain, &error), 1);
	ck_assert_int_eq(cas_keyring_refresh(k1, path, &changed, &error), 1);
	ck_assert(!changed);

	/* finish: one slot and one epoch, the new ones */
	cas_keyring_rotate_finish(k2);
	ck_assert_int_eq(cas_keyring_save(k2, path, &error), 1);
	size = key_image(path, image, sizeof(image));
	ck_assert_uint_eq(size, KEY_FILE_V3_SIZE(1, 1));
	/* nothing of the old root is left in the file */
	ck_assert(!has_bytes(image, size, v1_image + 8, CAS_KEK_SIZE));
	ck_assert_int_eq(cas_keyring_load(path, &k3, &error), 1);
	ck_assert_uint_eq(cas_keyring_slot_count(k3), 1);
	ck_assert_uint_eq(cas_keyring_epoch_count(k3), 1);
	ck_assert_uint_eq(cas_keyring_store_epoch(k3), 1);
	ck_assert_uint_eq(cas_keyring_wrap_key_id(k3), new_id);
	ck_assert_uint_eq(cas_keyring_key_id(k3), cas_keyring_key_id(k1));
	cas_keyring_fingerprint(k3, fp);
	ck_assert_mem_eq(fp, fp1, sizeof(fp));
	cas_blob_id_compute(k3, "abc", 3, &id);
	ck_assert_mem_eq(id2.id, id.id, sizeof(id.id));
	ck_assert_int_eq(cas_dek_unwrap(k3, &id1, w3, out, &error), 1);
	ck_assert_mem_eq(out, dek, sizeof(dek));
	/* the old slot and epoch are gone from the file */
	ck_assert_int_eq(cas_dek_unwrap(k3, &id1, w1, out, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "another key"));
	buffer_set_used_size(plain, 0);
	ck_assert_int_eq(cas_record_open(k3, "aad", 3, sealed->data,
					 sealed->used, plain, &error), -1);
	ck_assert_int_eq(cas_record_open(k3, "aad", 3, resealed->data,
					 resealed->used, plain, &error), 1);
	ck_assert_mem_eq(plain->data, "index data", 10);
	ck_assert_int_eq(cas_keyring_store_key(k3, CAS_STORE_KEY_RECORD, 0,
					       sk, &error), -1);
	ck_assert_int_eq(cas_keyring_store_key(k3, CAS_STORE_KEY_RECORD, 1,
					       sk, &error), 1);
	ck_assert_mem_eq(sk, sk1, sizeof(sk));
	/* a running process keeps what it had for opening (streams and
	   records read before the rewrite), but writes with the new one */
	ck_assert_int_eq(cas_keyring_refresh(k1, path, &changed, &error), 1);
	ck_assert_uint_eq(cas_keyring_slot_count(k1), 1);
	ck_assert_uint_eq(cas_keyring_epoch_count(k1), 1);
	ck_assert_int_eq(cas_dek_unwrap(k1, &id1, w1, out, &error), 1);
	buffer_set_used_size(plain, 0);
	ck_assert_int_eq(cas_record_open(k1, "aad", 3, sealed->data,
					 sealed->used, plain, &error), 1);

	/* and a second rotation: epoch 2, again random */
	cas_keyring_rotate_add(k3);
	ck_assert_uint_eq(cas_keyring_store_epoch(k3), 2);
	ck_assert_uint_ne(cas_keyring_wrap_key_id(k3), new_id);
	ck_assert_uint_ne(cas_keyring_wrap_key_id(k3), old_id);
	ck_assert_int_eq(cas_keyring_save(k3, path, &error), 1);
	cas_keyring_free(&k3);
	ck_assert_int_eq(cas_keyring_load(path, &k3, &error), 1);
	ck_assert_int_eq(cas_dek_unwrap(k3, &id1, w2, out, &error), 1);
	ck_assert(cas_keyring_retiring_key_id(k3, &retiring));
	ck_assert_uint_eq(retiring, new_id);
	ck_assert(cas_keyring_retiring_epoch(k3, &epoch));
	ck_assert_uint_eq(epoch, 1);
	cas_blob_id_compute(k3, "abc", 3, &id);
	ck_assert_mem_ne(id.id, id2.id, sizeof(id.id));
	ck_assert_mem_ne(id.id, id1.id, sizeof(id.id));

	cas_keyring_free(&k1);
	cas_keyring_free(&k2);
	cas_keyring_free(&k3);
}
END_TEST

/* A new epoch owes nothing to the old root: no key a copy of the old
   file can derive (any KDF sub-key of the root under either context)
   opens what the new epoch seals, and two rotations of the same file
   give different epochs. */
START_TEST(test_epoch_independent_of_root)
{
	struct cas_keyring *k1, *k2, *k3;
	unsigned char root[CAS_KEK_SIZE], sub[CAS_KEK_SIZE];
	unsigned char file[KEY_FILE_SIZE], sk2[CAS_STORE_KEY_SIZE];
	unsigned char sk3[CAS_STORE_KEY_SIZE];
	const char *path = tmp_path("e.key"), *error;
	const char *contexts[] = { "CASBOXK1", "CASBOXS1", "CASBOXU1" };
	struct cas_blob_id id2, id3;
	buffer_t *sealed, *plain;
	unsigned int c, i;

	ck_assert_int_eq(cas_keyring_create(path, &k1, &error), 1);
	ck_assert_uint_eq(read_file(path, file, sizeof(file)), KEY_FILE_SIZE);
	memcpy(root, file + 8, sizeof(root));
	ck_assert_int_eq(cas_keyring_load(path, &k2, &error), 1);
	ck_assert_int_eq(cas_keyring_load(path, &k3, &error), 1);
	cas_keyring_rotate_add(k2);
	cas_keyring_rotate_add(k3);
	sealed = t_buffer_create(128);
	cas_record_seal(k2, "a", 1, "secret", 6, sealed);
	plain = t_buffer_create(32);
	ck_assert_int_eq(cas_record_open(k1, "a", 1, sealed->data,
					 sealed->used, plain, &error), -1);
	ck_assert_int_eq(cas_record_open_key(root, "a", 1, sealed->data,
					     sealed->used, plain, &error), -1);
	for (c = 0; c < N_ELEMENTS(contexts); c++) {
		for (i = 0; i < 16; i++) {
			crypto_kdf_derive_from_key(sub, sizeof(sub), i,
						   contexts[c], root);
			ck_assert_int_eq(cas_record_open_key(sub, "a", 1,
				sealed->data, sealed->used, plain,
				&error), -1);
		}
	}
	/* two rotations of one file: two independent epochs 1 */
	ck_assert_uint_eq(cas_keyring_store_epoch(k2), 1);
	ck_assert_uint_eq(cas_keyring_store_epoch(k3), 1);
	ck_assert_int_eq(cas_keyring_store_key(k2, CAS_STORE_KEY_LSM, 1,
					       sk2, &error), 1);
	ck_assert_int_eq(cas_keyring_store_key(k3, CAS_STORE_KEY_LSM, 1,
					       sk3, &error), 1);
	ck_assert_mem_ne(sk2, sk3, sizeof(sk2));
	cas_blob_id_compute(k2, "x", 1, &id2);
	cas_blob_id_compute(k3, "x", 1, &id3);
	ck_assert_mem_ne(id2.id, id3.id, sizeof(id2.id));
	ck_assert_int_eq(cas_record_open(k3, "a", 1, sealed->data,
					 sealed->used, plain, &error), -1);
	cas_keyring_free(&k1);
	cas_keyring_free(&k2);
	cas_keyring_free(&k3);
}
END_TEST

/* A CASKEY2 file (written by key rotate before epochs, here built by
   hand) still loads: its root is epoch 0, its slots are as written, and
   the next save writes CASKEY3 with the same key id and fingerprint. */
START_TEST(test_v2_file_loads)
{
	unsigned char file[KEY_FILE_V2_SIZE(2)], image[KEY_FILE_V3_MAX];
	unsigned char root[CAS_KEK_SIZE], wrap[2][CAS_KEK_SIZE];
	unsigned char fp1[CAS_KEY_FINGERPRINT_SIZE];
	unsigned char fp[CAS_KEY_FINGERPRINT_SIZE];
	unsigned char dek[CAS_DEK_SIZE], out[CAS_DEK_SIZE];
	unsigned char w[CAS_WRAPPED_DEK_SIZE];
	const char *path = tmp_path("v2.key"), *error;
	struct cas_keyring *k, *kv1, *k3;
	struct cas_blob_id id, idv1;
	buffer_t *sealed, *plain;
	uint32_t retiring;
	size_t size;

	ck_assert_int_ge(sodium_init(), 0);
	randombytes_buf(root, sizeof(root));
	randombytes_buf(wrap, sizeof(wrap));
	memcpy(file, "CASKEY2\x02", 8);
	memcpy(file + 8, root, 32);
	file[40] = 2;
	file[41] = 1;
	file[42] = file[43] = 0;
	memcpy(file + 44, "\x11\x22\x33\x44", 4);
	memcpy(file + 48, wrap[0], 32);
	memcpy(file + 80, "\x55\x66\x77\x88", 4);
	memcpy(file + 84, wrap[1], 32);
	recheck(file, sizeof(file));
	write_file(path, file, sizeof(file));
	ck_assert_int_eq(chmod(path, 0600), 0);
	ck_assert_int_eq(cas_keyring_load(path, &k, &error), 1);
	kv1 = cas_keyring_create_from_kek(root);
	ck_assert_uint_eq(cas_keyring_slot_count(k), 2);
	ck_assert_uint_eq(cas_keyring_epoch_count(k), 1);
	ck_assert_uint_eq(cas_keyring_store_epoch(k), 0);
	ck_assert_uint_eq(cas_keyring_wrap_key_id(k), 0x55667788);
	ck_assert(cas_keyring_retiring_key_id(k, &retiring));
	ck_assert_uint_eq(retiring, 0x11223344);
	ck_assert_uint_eq(cas_keyring_key_id(k), cas_keyring_key_id(kv1));
	cas_keyring_fingerprint(k, fp1);
	cas_keyring_fingerprint(kv1, fp);
	ck_assert_mem_eq(fp, fp1, sizeof(fp));
	cas_blob_id_compute(k, "abc", 3, &id);
	cas_blob_id_compute(kv1, "abc", 3, &idv1);
	ck_assert_mem_eq(id.id, idv1.id, sizeof(id.id));
	sealed = t_buffer_create(64);
	cas_record_seal(kv1, "b", 1, "v1", 2, sealed);
	plain = t_buffer_create(16);
	ck_assert_int_eq(cas_record_open(k, "b", 1, sealed->data,
					 sealed->used, plain, &error), 1);
	cas_dek_generate(dek);
	cas_dek_wrap(k, &id, dek, w);
	ck_assert_uint_eq(cas_dek_wrapped_key_id(w), 0x55667788);

	/* saved again: CASKEY3, one epoch, both slots, same name */
	ck_assert_int_eq(cas_keyring_save(k, path, &error), 1);
	size = read_file(path, image, sizeof(image));
	ck_assert_uint_eq(size, KEY_FILE_V3_SIZE(2, 1));
	ck_assert_mem_eq(image, "CASKEY3\x03", 8);
	ck_assert_int_eq(cas_keyring_load(path, &k3, &error), 1);
	ck_assert_uint_eq(cas_keyring_key_id(k3), cas_keyring_key_id(kv1));
	cas_keyring_fingerprint(k3, fp);
	ck_assert_mem_eq(fp, fp1, sizeof(fp));
	ck_assert_int_eq(cas_dek_unwrap(k3, &id, w, out, &error), 1);
	ck_assert_mem_eq(out, dek, sizeof(dek));
	buffer_set_used_size(plain, 0);
	ck_assert_int_eq(cas_record_open(k3, "b", 1, sealed->data,
					 sealed->used, plain, &error), 1);
	cas_keyring_free(&k);
	cas_keyring_free(&kv1);
	cas_keyring_free(&k3);
}
END_TEST

/* A file with another root is never adopted by a refresh. */
START_TEST(test_refresh_other_key)
{
	struct cas_keyring *k1, *k2;
	const char *path = tmp_path("a.key"), *error;
	unsigned char w[CAS_WRAPPED_DEK_SIZE], dek[CAS_DEK_SIZE];
	struct cas_blob_id id;
	bool changed;

	ck_assert_int_eq(cas_keyring_create(path, &k1, &error), 1);
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(cas_keyring_refresh(k1, path, &changed, &error), -1);
	ck_assert_int_eq(cas_keyring_create(path, &k2, &error), 1);
	ck_assert_int_eq(cas_keyring_refresh(k1, path, &changed, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "another key"));
	ck_assert(!changed);
	/* k1 still works as before */
	cas_blob_id_compute(k1, "x", 1, &id);
	cas_dek_generate(dek);
	cas_dek_wrap(k1, &id, dek, w);
	ck_assert_uint_eq(cas_dek_wrapped_key_id(w), cas_keyring_key_id(k1));
	cas_keyring_free(&k1);
	cas_keyring_free(&k2);
}
END_TEST

static void
assert_v2_rejected(const unsigned char *file, size_t size, const char *why)
{
	struct cas_keyring *k;
	const char *error = NULL;

	ck_assert_int_eq(cas_key_file_parse(file, size, &k, &error), -1);
	ck_assert_ptr_null(k);
	ck_assert_ptr_nonnull(error);
	if (why != NULL && strstr(error, why) == NULL)
		ck_abort_msg("expected '%s' in '%s'", why, error);
}

START_TEST(test_v3_damage)
{
	unsigned char file[KEY_FILE_V3_MAX + 8];
	unsigned char bad[KEY_FILE_V3_MAX + 8];
	struct cas_keyring *k;
	const char *path = tmp_path("d2.key"), *bad_path = tmp_path("b2.key");
	const char *error;
	size_t size, len, i;
	unsigned int v, n;

	for (n = 1; n <= 2; n++) {
		i_unlink_if_exists(path);
		ck_assert_int_eq(cas_keyring_create(path, &k, &error), 1);
		cas_keyring_rotate_add(k);
		if (n == 1)
			cas_keyring_rotate_finish(k);
		ck_assert_int_eq(cas_keyring_save(k, path, &error), 1);
		cas_keyring_free(&k);
		size = read_file(path, file, sizeof(file));
		ck_assert_uint_eq(size, KEY_FILE_V3_SIZE(n, n));
		ck_assert_int_eq(cas_key_file_parse(file, size, &k,
						    &error), 1);
		cas_keyring_free(&k);

		/* every truncation, through the file path */
		for (len = 0; len < size; len++) {
			write_file(bad_path, file, len);
			ck_assert_int_eq(cas_keyring_load(bad_path, &k,
							  &error), -1);
			ck_assert_ptr_null(k);
			ck_assert_ptr_nonnull(strstr(error, bad_path));
			ck_assert_ptr_nonnull(strstr(error, "damaged"));
		}
		/* a grown file */
		memcpy(bad, file, size);
		bad[size] = 0;
		assert_v2_rejected(bad, size + 1, "size");
		write_file(bad_path, bad, size + 1);
		ck_assert_int_eq(cas_keyring_load(bad_path, &k, &error), -1);
		/* every single-byte change, every value */
		for (i = 0; i < size; i++) {
			for (v = 1; v < 256; v++) {
				memcpy(bad, file, size);
				bad[i] ^= v;
				assert_v2_rejected(bad, size, NULL);
			}
			memcpy(bad, file, size);
			bad[i] ^= 0x20;
			write_file(bad_path, bad, size);
			ck_assert_int_eq(cas_keyring_load(bad_path, &k,
							  &error), -1);
			ck_assert_ptr_nonnull(strstr(error, bad_path));
		}
	}

	/* fields the checksum cannot vouch for (a recomputed checksum):
	   each rejected with its reason */
	size = KEY_FILE_V3_MAX;
	memcpy(bad, file, size);
	bad[45] = 2;
	recheck(bad, size);
	assert_v2_rejected(bad, size, "current slot");
	memcpy(bad, file, size);
	bad[47] = 2;
	recheck(bad, size);
	assert_v2_rejected(bad, size, "current epoch");
	memcpy(bad, file, size);
	memset(bad + 8, 0, 4);
	recheck(bad, size);
	assert_v2_rejected(bad, size, "key id 0");
	memcpy(bad, file, size);
	memset(bad + 48, 0, 4);
	recheck(bad, size);
	assert_v2_rejected(bad, size, "slot 0 has key id 0");
	memcpy(bad, file, size);
	memcpy(bad + 48 + 36, bad + 48, 4);
	recheck(bad, size);
	assert_v2_rejected(bad, size, "same key id");
	memcpy(bad, file, size);
	memcpy(bad + 48 + 72 + 36, bad + 48 + 72, 4);
	recheck(bad, size);
	assert_v2_rejected(bad, size, "same number");
	memcpy(bad, file, size);
	bad[44] = 3;
	assert_v2_rejected(bad, size, "slot count");
	bad[44] = 0;
	assert_v2_rejected(bad, size, "slot count");
	memcpy(bad, file, size);
	bad[46] = 3;
	assert_v2_rejected(bad, size, "epoch count");
	/* a one-slot count on a two-slot file */
	memcpy(bad, file, size);
	bad[44] = 1;
	recheck(bad, size);
	assert_v2_rejected(bad, size, "size");
	memcpy(bad, file, size);
	bad[7] = 4;
	assert_v2_rejected(bad, size, "unsupported version");
}
END_TEST

/* unwrap picks the slot by key id; an id the key ring does not hold is
   a clear error, one it holds with the wrong key fails the tag. */
START_TEST(test_unwrap_by_slot)
{
	struct cas_keyring *k, *other;
	unsigned char dek[CAS_DEK_SIZE], out[CAS_DEK_SIZE];
	unsigned char zero[CAS_DEK_SIZE];
	unsigned char w_old[CAS_WRAPPED_DEK_SIZE], w_new[CAS_WRAPPED_DEK_SIZE];
	unsigned char bad[CAS_WRAPPED_DEK_SIZE];
	const char *path = tmp_path("s.key"), *error;
	struct cas_blob_id id;
	uint32_t old_id, new_id;

	memset(zero, 0, sizeof(zero));
	ck_assert_int_eq(cas_keyring_create(path, &k, &error), 1);
	other = test_keyring(7);
	cas_blob_id_compute(k, "s", 1, &id);
	cas_dek_generate(dek);
	old_id = cas_keyring_wrap_key_id(k);
	cas_dek_wrap(k, &id, dek, w_old);
	cas_keyring_rotate_add(k);
	new_id = cas_keyring_wrap_key_id(k);
	cas_dek_wrap(k, &id, dek, w_new);
	ck_assert_uint_eq(cas_dek_wrapped_key_id(w_old), old_id);
	ck_assert_uint_eq(cas_dek_wrapped_key_id(w_new), new_id);
	ck_assert_int_eq(cas_dek_unwrap(k, &id, w_old, out, &error), 1);
	ck_assert_mem_eq(out, dek, sizeof(dek));
	ck_assert_int_eq(cas_dek_unwrap(k, &id, w_new, out, &error), 1);
	ck_assert_mem_eq(out, dek, sizeof(dek));
	/* swapping the key ids makes each slot try the other's wrap */
	memcpy(bad, w_old, sizeof(bad));
	memcpy(bad, w_new, 4);
	ck_assert_int_eq(cas_dek_unwrap(k, &id, bad, out, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));
	ck_assert_mem_eq(out, zero, sizeof(out));
	/* unknown key id */
	memcpy(bad, w_new, sizeof(bad));
	bad[0] ^= 0x80;
	ck_assert_int_eq(cas_dek_unwrap(k, &id, bad, out, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "another key"));
	ck_assert_ptr_nonnull(strstr(error, t_strdup_printf("%08x",
						cas_dek_wrapped_key_id(bad))));
	ck_assert_mem_eq(out, zero, sizeof(out));
	ck_assert_int_eq(cas_dek_unwrap(other, &id, w_new, out, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "another key"));
	ck_assert(cas_keyring_has_key_id(k, old_id));
	ck_assert(cas_keyring_has_key_id(k, new_id));
	ck_assert(!cas_keyring_has_key_id(other, new_id));
	cas_keyring_free(&k);
	cas_keyring_free(&other);
}
END_TEST

/* A v1 file loads exactly as before: the known answers hold for a
   CASKEY1 image built here byte by byte. */
START_TEST(test_v1_known_answer_file)
{
	unsigned char file[KEY_FILE_SIZE];
	struct cas_keyring *k, *kek;
	struct cas_blob_id id;
	const char *error;
	unsigned int i;

	memcpy(file, "CASKEY1\x01", 8);
	for (i = 0; i < CAS_KEK_SIZE; i++)
		file[8 + i] = i;
	crypto_generichash(file + 40, 32, file, 40, NULL, 0);
	ck_assert_int_eq(cas_key_file_parse(file, sizeof(file), &k,
					    &error), 1);
	ck_assert_uint_eq(cas_keyring_key_id(k), 0xc26b5fc7U);
	ck_assert_uint_eq(cas_keyring_wrap_key_id(k), 0xc26b5fc7U);
	ck_assert_uint_eq(cas_keyring_slot_count(k), 1);
	cas_blob_id_compute(k, "hello", 5, &id);
	ck_assert_str_eq(cas_blob_id_to_hex(&id), id_kat[1].hex);
	/* the same key as cas_keyring_create_from_kek() */
	kek = test_keyring(0);
	{
		unsigned char dek[CAS_DEK_SIZE], out[CAS_DEK_SIZE];
		unsigned char w[CAS_WRAPPED_DEK_SIZE];
		buffer_t *sealed = t_buffer_create(64);
		buffer_t *plain = t_buffer_create(64);

		cas_dek_generate(dek);
		cas_dek_wrap(kek, &id, dek, w);
		ck_assert_int_eq(cas_dek_unwrap(k, &id, w, out, &error), 1);
		ck_assert_mem_eq(out, dek, sizeof(dek));
		cas_record_seal(kek, "a", 1, "zz", 2, sealed);
		ck_assert_int_eq(cas_record_open(k, "a", 1, sealed->data,
						 sealed->used, plain,
						 &error), 1);
	}
	cas_keyring_free(&k);
	cas_keyring_free(&kek);
}
END_TEST

/* A key file replaced by rotation is overwritten once it has no name
   left; one a hard link keeps is left alone. Temporary files a killed
   writer left are shredded and removed, nothing else. */
START_TEST(test_keyfile_shred_and_stale_tmp)
{
	unsigned char before[KEY_FILE_V3_MAX], after[KEY_FILE_V3_MAX];
	unsigned char zero[KEY_FILE_V3_MAX];
	const char *path = tmp_path("z.key"), *link_path = tmp_path("copy");
	const char *stale = t_strconcat(path, ".0123456789abcdef.tmp", NULL);
	const char *other1 = t_strconcat(path, ".tmp", NULL);
	const char *other2 = t_strconcat(path, ".0123456789ABCDEF.tmp", NULL);
	const char *other3 = tmp_path("y.key.0123456789abcdef.tmp");
	struct cas_keyring *k;
	const char *error;
	unsigned int removed;
	size_t size;
	int fd;

	memset(zero, 0, sizeof(zero));
	ck_assert_int_eq(cas_keyring_create(path, &k, &error), 1);
	size = read_file(path, before, sizeof(before));
	fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	cas_keyring_rotate_add(k);
	ck_assert_int_eq(cas_keyring_save(k, path, &error), 1);
	ck_assert_int_eq(pread(fd, after, size, 0), (ssize_t)size);
	ck_assert_mem_eq(after, zero, size);
	ck_assert_int_eq(close(fd), 0);

	/* a hard link (an admin's copy) keeps the replaced file intact */
	size = read_file(path, before, sizeof(before));
	ck_assert_int_eq(link(path, link_path), 0);
	cas_keyring_rotate_finish(k);
	ck_assert_int_eq(cas_keyring_save(k, path, &error), 1);
	ck_assert_uint_eq(read_file(link_path, after, sizeof(after)), size);
	ck_assert_mem_eq(after, before, size);
	cas_keyring_free(&k);

	write_file(stale, "CASKEY2 secret", 14);
	write_file(other1, "x", 1);
	write_file(other2, "x", 1);
	write_file(other3, "x", 1);
	fd = open(stale, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(cas_keyfile_remove_stale_tmp(path, &removed,
						      &error), 0);
	ck_assert_uint_eq(removed, 1);
	ck_assert_int_eq(access(stale, F_OK), -1);
	ck_assert_int_eq(pread(fd, after, 14, 0), 14);
	ck_assert_mem_eq(after, zero, 14);
	ck_assert_int_eq(close(fd), 0);
	ck_assert_int_eq(access(other1, F_OK), 0);
	ck_assert_int_eq(access(other2, F_OK), 0);
	ck_assert_int_eq(access(other3, F_OK), 0);
	ck_assert_int_eq(access(path, F_OK), 0);
	ck_assert_int_eq(cas_keyfile_remove_stale_tmp(path, &removed,
						      &error), 0);
	ck_assert_uint_eq(removed, 0);
}
END_TEST

/* A server key file that group or others can access is refused, naming
   the file and its mode, before anything is parsed. */
START_TEST(test_key_file_mode)
{
	static const unsigned int bad[] = { 0640, 0604, 0644, 0660, 0602 };
	const char *path = tmp_path("mode.key"), *error;
	struct cas_keyring *k;
	unsigned int i;

	ck_assert_int_eq(cas_keyring_create(path, &k, &error), 1);
	cas_keyring_free(&k);
	for (i = 0; i < N_ELEMENTS(bad); i++) {
		ck_assert_int_eq(chmod(path, bad[i]), 0);
		ck_assert_int_eq(cas_keyring_load(path, &k, &error), -1);
		ck_assert_ptr_null(k);
		ck_assert_ptr_nonnull(strstr(error, path));
		ck_assert_ptr_nonnull(strstr(error, t_strdup_printf(
			"mode %04o", bad[i])));
	}
	ck_assert_int_eq(chmod(path, 0400), 0);
	ck_assert_int_eq(cas_keyring_load(path, &k, &error), 1);
	cas_keyring_free(&k);
}

/* A key file in a directory that group or others may write (someone
   could swap the key file) is refused, naming the directory, its mode
   and the fix; a sticky directory (like /tmp) and 0755 are fine. */
START_TEST(test_key_file_dir_mode)
{
	const char *dir = tmp_path("keydir"), *error;
	const char *path = t_strconcat(dir, "/dir.key", NULL);
	struct cas_keyring *k;

	ck_assert_int_eq(mkdir(dir, 0700), 0);
	ck_assert_int_eq(cas_keyring_create(path, &k, &error), 1);
	cas_keyring_free(&k);
	ck_assert_int_eq(chmod(dir, 0770), 0);
	ck_assert_int_eq(cas_keyring_load(path, &k, &error), -1);
	ck_assert_ptr_null(k);
	ck_assert_msg(strstr(error, dir) != NULL &&
		      strstr(error, "mode 0770") != NULL &&
		      strstr(error, "chmod go-w") != NULL, "error: %s", error);
	ck_assert_int_eq(chmod(dir, 0757), 0);
	ck_assert_int_eq(cas_keyring_load(path, &k, &error), -1);
	ck_assert_int_eq(chmod(dir, 01777), 0);
	ck_assert_int_eq(cas_keyring_load(path, &k, &error), 1);
	cas_keyring_free(&k);
	ck_assert_int_eq(chmod(dir, 0755), 0);
	ck_assert_int_eq(cas_keyring_load(path, &k, &error), 1);
	cas_keyring_free(&k);
}
END_TEST

/* Store keys: one per purpose and key, stable, epoch 0 only until a
   rotation; the fingerprint tells keys apart and gives no store key. */
START_TEST(test_store_keys_and_fingerprint)
{
	struct cas_keyring *k1 = test_keyring(1), *k1b = test_keyring(1);
	struct cas_keyring *k2 = test_keyring(2);
	unsigned char a[CAS_STORE_KEY_SIZE], b[CAS_STORE_KEY_SIZE];
	unsigned char c[CAS_STORE_KEY_SIZE], fp1[CAS_KEY_FINGERPRINT_SIZE];
	unsigned char fp1b[CAS_KEY_FINGERPRINT_SIZE];
	unsigned char fp2[CAS_KEY_FINGERPRINT_SIZE];
	const char *error;

	ck_assert_uint_eq(cas_keyring_store_epoch(k1), 0);
	ck_assert_int_eq(cas_keyring_store_key(k1, CAS_STORE_KEY_RECORD, 0,
					       a, &error), 1);
	ck_assert_int_eq(cas_keyring_store_key(k1b, CAS_STORE_KEY_RECORD, 0,
					       b, &error), 1);
	ck_assert_mem_eq(a, b, sizeof(a));
	ck_assert_int_eq(cas_keyring_store_key(k1, CAS_STORE_KEY_LSM, 0,
					       c, &error), 1);
	ck_assert_mem_ne(a, c, sizeof(a));
	ck_assert_int_eq(cas_keyring_store_key(k2, CAS_STORE_KEY_RECORD, 0,
					       b, &error), 1);
	ck_assert_mem_ne(a, b, sizeof(a));
	ck_assert_int_eq(cas_keyring_store_key(k1, CAS_STORE_KEY_RECORD, 1,
					       b, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "epoch 1"));
	memset(c, 0, sizeof(c));
	ck_assert_mem_eq(b, c, sizeof(b));

	cas_keyring_fingerprint(k1, fp1);
	cas_keyring_fingerprint(k1b, fp1b);
	cas_keyring_fingerprint(k2, fp2);
	ck_assert_mem_eq(fp1, fp1b, sizeof(fp1));
	ck_assert_mem_ne(fp1, fp2, sizeof(fp1));
	ck_assert_mem_ne(fp1, a, sizeof(a));
	cas_keyring_free(&k1);
	cas_keyring_free(&k1b);
	cas_keyring_free(&k2);
}
END_TEST
END_TEST

int main(void)
{
	Suite *s = suite_create("key");
	TCase *tc = tcase_create("key");
	int failed;

	lib_init();
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_create_load);
	tcase_add_test(tc, test_key_file_mode);
	tcase_add_test(tc, test_key_file_dir_mode);
	tcase_add_test(tc, test_key_file_damage);
	tcase_add_test(tc, test_unreadable);
	tcase_add_test(tc, test_blob_id_known_answers);
	tcase_add_test(tc, test_blob_id_hex_rejects);
	tcase_add_test(tc, test_dek_wrap);
	tcase_add_test(tc, test_dek_rewrap);
	tcase_add_test(tc, test_record_seal);
	tcase_add_test(tc, test_raw_aead);
	tcase_add_test(tc, test_v1_known_answer_file);
	tcase_add_test(tc, test_v3_round_trip);
	tcase_add_test(tc, test_epoch_independent_of_root);
	tcase_add_test(tc, test_v2_file_loads);
	tcase_add_test(tc, test_refresh_other_key);
	tcase_add_test(tc, test_v3_damage);
	tcase_add_test(tc, test_unwrap_by_slot);
	tcase_add_test(tc, test_keyfile_shred_and_stale_tmp);
	tcase_add_test(tc, test_store_keys_and_fingerprint);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
