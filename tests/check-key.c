/* cas-key: key file create/load, every truncation and single-byte change
   of a key file, wrapped DEK and sealed record rejected, wrong keys
   rejected, blob ids match an independent known answer (computed with
   Python's hashlib.blake2b from the KDF definition). */

#include "lib.h"
#include "buffer.h"
#include "str.h"
#include "cas-key.h"

#include <check.h>
#include <stdlib.h>
#include <stdio.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#define KEY_FILE_SIZE 72

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

int main(void)
{
	Suite *s = suite_create("key");
	TCase *tc = tcase_create("key");
	SRunner *sr;
	int failed;

	lib_init();
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_create_load);
	tcase_add_test(tc, test_key_file_damage);
	tcase_add_test(tc, test_unreadable);
	tcase_add_test(tc, test_blob_id_known_answers);
	tcase_add_test(tc, test_blob_id_hex_rejects);
	tcase_add_test(tc, test_dek_wrap);
	tcase_add_test(tc, test_dek_rewrap);
	tcase_add_test(tc, test_record_seal);
	tcase_add_test(tc, test_raw_aead);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
