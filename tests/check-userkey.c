/* cas-userkey: the password-protected key mode. Round trips; wrong
   password rejected with a clear error; every truncation and single-byte
   change of a user key file and of a sealed DEK rejected, also when the
   file checksum is recomputed (the AAD must catch it); a password change
   keeps old sealed DEKs openable; a sealed DEK of blob A does not open
   as blob B. Argon2id runs with libsodium's minimum limits here. */

#include "lib.h"
#include "buffer.h"
#include "cas-userkey.h"
#include "cas-keymode.h"
#include "cas-userkey-golden.h"

#include <sodium.h>
#include <check.h>
#include "check-run.h"
#include <stdlib.h>
#include <stdio.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fcntl.h>

#define UKEY_FILE_SIZE 212
#define UKEY_OFF_OPS 12
#define UKEY_OFF_CHECK 180

static const struct cas_userkey_limits min_limits = {
	.opslimit = crypto_pwhash_OPSLIMIT_MIN,
	.memlimit = crypto_pwhash_MEMLIMIT_MIN,
};

static char tmpdir[] = "/tmp/check-userkey.XXXXXX";

static void setup(void)
{
	strcpy(tmpdir, "/tmp/check-userkey.XXXXXX");
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

static size_t read_file(const char *path, unsigned char *buf, size_t max)
{
	FILE *f = fopen(path, "r");
	size_t n;

	ck_assert_ptr_nonnull(f);
	n = fread(buf, 1, max, f);
	ck_assert_int_eq(fclose(f), 0);
	return n;
}

static void write_file(const char *path, const void *data, size_t size)
{
	FILE *f = fopen(path, "w");

	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(data, 1, size, f), size);
	ck_assert_int_eq(fclose(f), 0);
}

/* number of directory entries besides . and .. (temporary files must
   never be left behind) */
static unsigned int dir_entries(void)
{
	DIR *dh = opendir(tmpdir);
	struct dirent *d;
	unsigned int n = 0;

	ck_assert_ptr_nonnull(dh);
	while ((d = readdir(dh)) != NULL) {
		if (strcmp(d->d_name, ".") != 0 &&
		    strcmp(d->d_name, "..") != 0)
			n++;
	}
	closedir(dh);
	return n;
}

static struct cas_userkey *create_key(const char *name, const char *pw)
{
	struct cas_userkey *key;
	const char *error;

	ck_assert_int_eq(cas_userkey_create(tmp_path(name), pw, strlen(pw),
					    &min_limits, &key, &error), 1);
	ck_assert(cas_userkey_is_unlocked(key));
	return key;
}

static void test_id(struct cas_blob_id *id, unsigned char seed)
{
	memset(id->id, seed, sizeof(id->id));
}

START_TEST(test_create_unlock)
{
	struct cas_userkey *created, *pub, *unlocked;
	unsigned char pk1[32], pk2[32], file[UKEY_FILE_SIZE + 1];
	unsigned char file2[UKEY_FILE_SIZE + 1];
	struct cas_blob_id id1, id2, id3;
	const char *path = tmp_path("u.ukey"), *error;
	struct stat st;

	ck_assert_int_eq(cas_userkey_load_public(path, &pub, &error), 0);
	ck_assert_ptr_null(pub);
	ck_assert_int_eq(cas_userkey_unlock(path, "pw", 2, &unlocked,
					    &error), 0);
	created = create_key("u.ukey", "secret pw");
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0600);
	ck_assert_int_eq(st.st_size, UKEY_FILE_SIZE);
	ck_assert_uint_eq(dir_entries(), 1);
	ck_assert_uint_eq(read_file(path, file, sizeof(file)),
			  UKEY_FILE_SIZE);
	ck_assert_mem_eq(file, "CASUKEY1", 8);

	ck_assert_int_eq(cas_userkey_load_public(path, &pub, &error), 1);
	ck_assert(!cas_userkey_is_unlocked(pub));
	ck_assert_int_eq(cas_userkey_unlock(path, "secret pw", 9, &unlocked,
					    &error), 1);
	ck_assert(cas_userkey_is_unlocked(unlocked));
	ck_assert_uint_eq(cas_userkey_key_id(pub),
			  cas_userkey_key_id(created));
	ck_assert_uint_eq(cas_userkey_key_id(unlocked),
			  cas_userkey_key_id(created));
	cas_userkey_public_key(pub, pk1);
	cas_userkey_public_key(unlocked, pk2);
	ck_assert_mem_eq(pk1, pk2, sizeof(pk1));

	/* the same blob id with or without the password */
	cas_userkey_blob_id_compute(pub, "hello", 5, &id1);
	cas_userkey_blob_id_compute(unlocked, "hello", 5, &id2);
	ck_assert_mem_eq(id1.id, id2.id, sizeof(id1.id));
	cas_userkey_blob_id_compute(pub, "hellp", 5, &id3);
	ck_assert_mem_ne(id1.id, id3.id, sizeof(id1.id));

	/* never overwrite an existing key file */
	ck_assert_int_eq(cas_userkey_create(path, "other", 5, &min_limits,
					    NULL, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, path));
	ck_assert_uint_eq(read_file(path, file2, sizeof(file2)),
			  UKEY_FILE_SIZE);
	ck_assert_mem_eq(file, file2, UKEY_FILE_SIZE);
	ck_assert_uint_eq(dir_entries(), 1);

	cas_userkey_free(&created);
	cas_userkey_free(&pub);
	cas_userkey_free(&unlocked);
	ck_assert_ptr_null(pub);
}
END_TEST

START_TEST(test_two_users_differ)
{
	struct cas_userkey *a = create_key("a", "pw");
	struct cas_userkey *b = create_key("b", "pw");
	struct cas_blob_id ida, idb;
	unsigned char pka[32], pkb[32];

	/* same password, independent keys: no cross-user dedup or linking */
	cas_userkey_public_key(a, pka);
	cas_userkey_public_key(b, pkb);
	ck_assert_mem_ne(pka, pkb, sizeof(pka));
	ck_assert_uint_ne(cas_userkey_key_id(a), cas_userkey_key_id(b));
	cas_userkey_blob_id_compute(a, "x", 1, &ida);
	cas_userkey_blob_id_compute(b, "x", 1, &idb);
	ck_assert_mem_ne(ida.id, idb.id, sizeof(ida.id));
	cas_userkey_free(&a);
	cas_userkey_free(&b);
}
END_TEST

START_TEST(test_wrong_password)
{
	static const char *const wrong[] = {
		"", "correct horse", "correct horse battery stapld",
		"correct horse battery staple ", "Correct horse battery staple",
	};
	struct cas_userkey *key =
		create_key("u", "correct horse battery staple");
	const char *path = tmp_path("u"), *error;
	unsigned int i;

	cas_userkey_free(&key);
	for (i = 0; i < N_ELEMENTS(wrong); i++) {
		error = NULL;
		ck_assert_int_eq(cas_userkey_unlock(path, wrong[i],
						    strlen(wrong[i]), &key,
						    &error), -1);
		ck_assert_ptr_null(key);
		ck_assert_ptr_nonnull(strstr(error, "wrong password"));
		ck_assert_ptr_nonnull(strstr(error, path));
		ck_assert_ptr_null(strstr(error, "damaged"));
	}
	/* embedded NUL: the length counts, not the C string */
	ck_assert_int_eq(cas_userkey_unlock(path,
		"correct horse battery staple\0", 29, &key, &error), -1);
	ck_assert_int_eq(cas_userkey_unlock(path,
		"correct horse battery staple", 28, &key, &error), 1);
	cas_userkey_free(&key);
}
END_TEST

static void assert_image_rejected(const unsigned char *data, size_t size,
				  const char *pw)
{
	struct cas_userkey *key = (void *)1;
	const char *error = NULL;

	ck_assert_int_eq(cas_userkey_parse_public(data, size, &key,
						  &error), -1);
	ck_assert_ptr_null(key);
	ck_assert_ptr_nonnull(error);
	key = (void *)1;
	ck_assert_int_eq(cas_userkey_unlock_data(data, size, pw, strlen(pw),
						 &key, &error), -1);
	ck_assert_ptr_null(key);
}

START_TEST(test_key_file_damage)
{
	unsigned char file[UKEY_FILE_SIZE + 1], bad[UKEY_FILE_SIZE + 1];
	struct cas_userkey *key;
	const char *path = tmp_path("u"), *error;
	unsigned int i, bit, rejected = 0;

	key = create_key("u", "pw");
	cas_userkey_free(&key);
	ck_assert_uint_eq(read_file(path, file, sizeof(file)),
			  UKEY_FILE_SIZE);
	ck_assert_int_eq(cas_userkey_unlock_data(file, UKEY_FILE_SIZE, "pw", 2,
						 &key, &error), 1);
	cas_userkey_free(&key);

	for (i = 0; i < UKEY_FILE_SIZE; i++) {
		assert_image_rejected(file, i, "pw");
		rejected++;
	}
	memcpy(bad, file, UKEY_FILE_SIZE);
	bad[UKEY_FILE_SIZE] = 0;
	assert_image_rejected(bad, UKEY_FILE_SIZE + 1, "pw");
	for (i = 0; i < UKEY_FILE_SIZE; i++) {
		for (bit = 0; bit < 8; bit++) {
			memcpy(bad, file, UKEY_FILE_SIZE);
			bad[i] ^= 1 << bit;
			assert_image_rejected(bad, UKEY_FILE_SIZE, "pw");
			rejected++;
		}
	}
	/* a deliberate edit that recomputes the checksum: the AAD (every
	   byte before the ciphertext) or the tag must still catch it */
	for (i = 0; i < UKEY_OFF_CHECK; i++) {
		memcpy(bad, file, UKEY_FILE_SIZE);
		bad[i] ^= 0x01;
		crypto_generichash(bad + UKEY_OFF_CHECK, 32, bad,
				   UKEY_OFF_CHECK, NULL, 0);
		key = (void *)1;
		ck_assert_int_eq(cas_userkey_unlock_data(bad, UKEY_FILE_SIZE,
							 "pw", 2, &key,
							 &error), -1);
		ck_assert_ptr_null(key);
		rejected++;
	}
	ck_assert_uint_eq(rejected, UKEY_FILE_SIZE * 9 + UKEY_OFF_CHECK);

	/* a damaged file on disk says so and names the file */
	memcpy(bad, file, UKEY_FILE_SIZE);
	bad[50] ^= 0x40;
	write_file(path, bad, UKEY_FILE_SIZE);
	ck_assert_int_eq(cas_userkey_load_public(path, &key, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "damaged"));
	ck_assert_ptr_nonnull(strstr(error, path));
	ck_assert_int_eq(cas_userkey_unlock(path, "pw", 2, &key, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "checksum"));
	ck_assert_ptr_null(strstr(error, "wrong password"));
	/* a file that grew */
	file[UKEY_FILE_SIZE] = '\n';
	write_file(path, file, UKEY_FILE_SIZE + 1);
	ck_assert_int_eq(cas_userkey_load_public(path, &key, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "size 213"));
}
END_TEST

START_TEST(test_hostile_limits)
{
	unsigned char file[UKEY_FILE_SIZE + 1];
	struct cas_userkey *key;
	struct cas_userkey_limits limits;
	const char *path = tmp_path("u"), *error;

	/* create refuses costs outside the accepted range */
	limits = min_limits;
	limits.opslimit = 0;
	ck_assert_int_eq(cas_userkey_create(path, "pw", 2, &limits, NULL,
					    &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "opslimit"));
	limits = min_limits;
	limits.memlimit = (size_t)2 << 30;
	ck_assert_int_eq(cas_userkey_create(path, "pw", 2, &limits, NULL,
					    &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "memlimit"));
	ck_assert_int_eq(cas_userkey_create(path, "", 0, &min_limits, NULL,
					    &error), -1);
	ck_assert_str_eq(error, t_strdup_printf(
		"Creating user key file %s: empty password", path));
	ck_assert_uint_eq(dir_entries(), 0);

	/* a file asking for 2^40 passes is refused before Argon2id runs,
	   even with a valid checksum */
	key = create_key("u", "pw");
	cas_userkey_free(&key);
	ck_assert_uint_eq(read_file(path, file, sizeof(file)),
			  UKEY_FILE_SIZE);
	file[UKEY_OFF_OPS + 5] = 1;
	crypto_generichash(file + UKEY_OFF_CHECK, 32, file, UKEY_OFF_CHECK,
			   NULL, 0);
	ck_assert_int_eq(cas_userkey_unlock_data(file, UKEY_FILE_SIZE, "pw", 2,
						 &key, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "opslimit"));
}
END_TEST

START_TEST(test_dek_seal_open)
{
	struct cas_userkey *key = create_key("u", "pw");
	struct cas_userkey *other = create_key("o", "pw");
	struct cas_userkey *pub;
	unsigned char dek[CAS_DEK_SIZE], out[CAS_DEK_SIZE], zero[CAS_DEK_SIZE];
	unsigned char sealed[CAS_SEALED_DEK_SIZE], sealed2[CAS_SEALED_DEK_SIZE];
	unsigned char bad[CAS_SEALED_DEK_SIZE];
	struct cas_blob_id a, b;
	const char *error;
	unsigned int i, bit, rejected = 0, unchanged = 0;
	uint32_t key_id;

	ck_assert_uint_eq(CAS_SEALED_DEK_SIZE, 133);
	ck_assert_int_eq(cas_userkey_load_public(tmp_path("u"), &pub,
						 &error), 1);
	memset(zero, 0, sizeof(zero));
	cas_dek_generate(dek);
	test_id(&a, 0xaa);
	test_id(&b, 0xbb);

	/* LMTP seals with the public key only */
	ck_assert_int_eq(cas_dek_seal_to_public(pub, &a, dek, sealed), 1);
	ck_assert_uint_eq(sealed[0], CAS_DEK_KIND_SEALED);
	key_id = cas_userkey_key_id(pub);
	ck_assert_uint_eq(sealed[1], key_id >> 24);
	ck_assert_uint_eq(sealed[4], key_id & 0xff);
	ck_assert_int_eq(cas_dek_seal_to_public(pub, &a, dek, sealed2), 1);
	ck_assert_mem_ne(sealed + 5, sealed2 + 5, sizeof(sealed) - 5);

	ck_assert_int_eq(cas_dek_open_sealed(key, &a, sealed, out, &error), 1);
	ck_assert_mem_eq(out, dek, sizeof(dek));
	ck_assert_int_eq(cas_dek_open_sealed(key, &a, sealed2, out, &error),
			 1);
	ck_assert_mem_eq(out, dek, sizeof(dek));

	/* without the password nothing opens */
	memset(out, 0x55, sizeof(out));
	ck_assert_int_eq(cas_dek_open_sealed(pub, &a, sealed, out, &error),
			 -1);
	ck_assert_ptr_nonnull(strstr(error, "locked"));
	ck_assert_mem_eq(out, zero, sizeof(out));
	/* blob A's DEK is not blob B's */
	memset(out, 0x55, sizeof(out));
	ck_assert_int_eq(cas_dek_open_sealed(key, &b, sealed, out, &error),
			 -1);
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));
	ck_assert_mem_eq(out, zero, sizeof(out));
	/* LMTP and scrub can verify without the password */
	ck_assert_int_eq(cas_dek_sealed_verify(pub, &a, sealed, &error), 1);
	ck_assert_int_eq(cas_dek_sealed_verify(pub, &b, sealed, &error), -1);
	/* another user's key pair */
	ck_assert_int_eq(cas_dek_open_sealed(other, &a, sealed, out, &error),
			 -1);
	ck_assert_ptr_nonnull(strstr(error, "another key"));
	/* ... even with the key id rewritten to theirs */
	memcpy(bad, sealed, sizeof(bad));
	key_id = cas_userkey_key_id(other);
	bad[1] = key_id >> 24; bad[2] = key_id >> 16;
	bad[3] = key_id >> 8; bad[4] = key_id;
	ck_assert_int_eq(cas_dek_open_sealed(other, &a, bad, out, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));

	/* every truncation, the rest zero-filled as a torn write leaves
	   it, and every bit flip. The sealed bytes are random: when the
	   last ones are zero already (1 run in 256 for the last byte),
	   the short copy equals the original, is no damage and opens. */
	for (i = 0; i < CAS_SEALED_DEK_SIZE; i++) {
		memset(bad, 0, sizeof(bad));
		memcpy(bad, sealed, i);
		memset(out, 0x55, sizeof(out));
		if (memcmp(bad, sealed, sizeof(bad)) == 0) {
			ck_assert_int_eq(cas_dek_open_sealed(key, &a, bad, out,
							     &error), 1);
			ck_assert_mem_eq(out, dek, sizeof(out));
			unchanged++;
			continue;
		}
		ck_assert_int_eq(cas_dek_open_sealed(key, &a, bad, out,
						     &error), -1);
		ck_assert_mem_eq(out, zero, sizeof(out));
		rejected++;
	}
	/* a zero tail that long means the sealing wrote nothing */
	ck_assert_uint_lt(unchanged, 4);
	for (i = 0; i < CAS_SEALED_DEK_SIZE; i++) {
		for (bit = 0; bit < 8; bit++) {
			memcpy(bad, sealed, sizeof(bad));
			bad[i] ^= 1 << bit;
			ck_assert_int_eq(cas_dek_open_sealed(key, &a, bad, out,
							     &error), -1);
			ck_assert_mem_eq(out, zero, sizeof(out));
			rejected++;
		}
	}
	ck_assert_uint_eq(rejected + unchanged, CAS_SEALED_DEK_SIZE * 9);
	for (i = 0; i < CAS_SEALED_DEK_SIZE; i++) {
		memcpy(bad, sealed, sizeof(bad));
		bad[i] ^= 0x10;
		ck_assert_int_eq(cas_dek_sealed_verify(pub, &a, bad, &error),
				 -1);
	}
	cas_userkey_free(&key);
	cas_userkey_free(&other);
	cas_userkey_free(&pub);
}
END_TEST

/* Someone with the public key but not the key file (a writer of the mail
   root) makes a box that would open: the MAC refuses it. */
START_TEST(test_dek_forged_with_public_key)
{
	struct cas_userkey *key = create_key("u", "pw");
	unsigned char pk[32], plain[64], forged[CAS_SEALED_DEK_SIZE];
	unsigned char out[CAS_DEK_SIZE];
	struct cas_blob_id a;
	uint32_t key_id = cas_userkey_key_id(key);
	const char *error;

	test_id(&a, 0xaa);
	cas_userkey_public_key(key, pk);
	memset(plain, 0x11, 32);
	memcpy(plain + 32, a.id, 32);
	forged[0] = CAS_DEK_KIND_SEALED;
	forged[1] = key_id >> 24; forged[2] = key_id >> 16;
	forged[3] = key_id >> 8; forged[4] = key_id;
	ck_assert_int_eq(crypto_box_seal(forged + 5, plain, sizeof(plain), pk),
			 0);
	randombytes_buf(forged + 117, 16);
	ck_assert_int_eq(cas_dek_open_sealed(key, &a, forged, out, &error),
			 -1);
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));
	ck_assert_int_eq(cas_dek_sealed_verify(key, &a, forged, &error), -1);
	cas_userkey_free(&key);
}
END_TEST

/* The documented derivations from the delivery key (file offset 76),
   recomputed here from the file bytes: blob-id key = KDF(D, 1,
   "CASUDLV1"), seal-MAC key = KDF(D, 2, "CASUDLV1"). With the MAC key a
   box for blob A can be relabelled as blob B; the blob id inside the
   box must still refuse it. */
START_TEST(test_delivery_key_derivation)
{
	struct cas_userkey *key = create_key("u", "pw");
	unsigned char file[UKEY_FILE_SIZE + 1], k_id[32], k_mac[32];
	unsigned char dek[CAS_DEK_SIZE], out[CAS_DEK_SIZE];
	unsigned char sealed[CAS_SEALED_DEK_SIZE];
	struct cas_blob_id a, b, id, expect;
	crypto_generichash_state st;
	const char *error;

	ck_assert_uint_eq(read_file(tmp_path("u"), file, sizeof(file)),
			  UKEY_FILE_SIZE);
	crypto_kdf_derive_from_key(k_id, 32, 1, "CASUDLV1", file + 76);
	crypto_kdf_derive_from_key(k_mac, 32, 2, "CASUDLV1", file + 76);
	crypto_generichash(expect.id, 32, (const void *)"hello", 5, k_id, 32);
	cas_userkey_blob_id_compute(key, "hello", 5, &id);
	ck_assert_mem_eq(id.id, expect.id, 32);

	test_id(&a, 0xaa);
	test_id(&b, 0xbb);
	cas_dek_generate(dek);
	ck_assert_int_eq(cas_dek_seal_to_public(key, &a, dek, sealed), 1);
	crypto_generichash_init(&st, k_mac, 32, 16);
	crypto_generichash_update(&st, sealed, 117);
	crypto_generichash_update(&st, b.id, 32);
	crypto_generichash_final(&st, sealed + 117, 16);
	ck_assert_int_eq(cas_dek_sealed_verify(key, &b, sealed, &error), 1);
	ck_assert_int_eq(cas_dek_open_sealed(key, &b, sealed, out, &error),
			 -1);
	ck_assert_ptr_nonnull(strstr(error, "another blob"));
	sodium_memzero(k_id, sizeof(k_id));
	sodium_memzero(k_mac, sizeof(k_mac));
	cas_userkey_free(&key);
}
END_TEST

START_TEST(test_password_change)
{
	struct cas_userkey *key = create_key("u", "old pw"), *pub, *key2;
	unsigned char deks[4][CAS_DEK_SIZE], out[CAS_DEK_SIZE];
	unsigned char sealed[4][CAS_SEALED_DEK_SIZE];
	unsigned char before[UKEY_FILE_SIZE + 1], after[UKEY_FILE_SIZE + 1];
	unsigned char shredded[UKEY_FILE_SIZE], zero[UKEY_FILE_SIZE];
	struct cas_userkey_limits limits = min_limits;
	int fd;
	struct cas_blob_id ids[4], id;
	const char *path = tmp_path("u"), *error;
	struct stat st;
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(ids); i++) {
		cas_userkey_blob_id_compute(key, &i, sizeof(i), &ids[i]);
		cas_dek_generate(deks[i]);
		ck_assert_int_eq(cas_dek_seal_to_public(key, &ids[i], deks[i],
							sealed[i]), 1);
	}
	ck_assert_int_eq(chmod(path, 0400), 0);
	ck_assert_uint_eq(read_file(path, before, sizeof(before)),
			  UKEY_FILE_SIZE);

	/* a wrong old password changes nothing */
	ck_assert_int_eq(cas_userkey_change_password(path, "old pW", 6,
		"new pw", 6, NULL, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "wrong password"));
	ck_assert_uint_eq(read_file(path, after, sizeof(after)),
			  UKEY_FILE_SIZE);
	ck_assert_mem_eq(before, after, UKEY_FILE_SIZE);
	ck_assert_int_eq(cas_userkey_change_password(path, "old pw", 6,
		"", 0, NULL, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "empty password"));
	ck_assert_uint_eq(read_file(path, after, sizeof(after)),
			  UKEY_FILE_SIZE);
	ck_assert_mem_eq(before, after, UKEY_FILE_SIZE);
	ck_assert_int_eq(cas_userkey_change_password(tmp_path("none"),
		"old pw", 6, "new pw", 6, NULL, &error), 0);

	/* the replaced file (the secret under the old password) is
	   overwritten once it has no name left */
	fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(cas_userkey_change_password(path, "old pw", 6,
		"new pw", 6, NULL, &error), 1);
	memset(zero, 0, sizeof(zero));
	ck_assert_int_eq(pread(fd, shredded, UKEY_FILE_SIZE, 0),
			 UKEY_FILE_SIZE);
	ck_assert_mem_eq(shredded, zero, UKEY_FILE_SIZE);
	ck_assert_int_eq(close(fd), 0);
	ck_assert_uint_eq(dir_entries(), 1);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0400);
	ck_assert_uint_eq(read_file(path, after, sizeof(after)),
			  UKEY_FILE_SIZE);
	/* the public part is kept, salt and wrapped secret are new */
	ck_assert_mem_eq(before + 44, after + 44, 64);
	ck_assert_mem_ne(before + 28, after + 28, 16);
	ck_assert_mem_ne(before + 108, after + 108, 72);

	ck_assert_int_eq(cas_userkey_unlock(path, "old pw", 6, &key2, &error),
			 -1);
	ck_assert_ptr_nonnull(strstr(error, "wrong password"));
	ck_assert_int_eq(cas_userkey_unlock(path, "new pw", 6, &key2, &error),
			 1);
	ck_assert_uint_eq(cas_userkey_key_id(key2), cas_userkey_key_id(key));
	for (i = 0; i < N_ELEMENTS(ids); i++) {
		cas_userkey_blob_id_compute(key2, &i, sizeof(i), &id);
		ck_assert_mem_eq(id.id, ids[i].id, sizeof(id.id));
		ck_assert_int_eq(cas_dek_open_sealed(key2, &ids[i], sealed[i],
						     out, &error), 1);
		ck_assert_mem_eq(out, deks[i], sizeof(out));
	}
	cas_userkey_free(&key2);

	/* new limits on a password change are written and used */
	limits.opslimit = 2;
	ck_assert_int_eq(cas_userkey_change_password(path, "new pw", 6,
		"third", 5, &limits, &error), 1);
	ck_assert_uint_eq(read_file(path, after, sizeof(after)),
			  UKEY_FILE_SIZE);
	ck_assert_uint_eq(after[UKEY_OFF_OPS], 2);
	ck_assert_int_eq(cas_userkey_load_public(path, &pub, &error), 1);
	ck_assert_int_eq(cas_userkey_unlock(path, "third", 5, &key2, &error),
			 1);
	ck_assert_int_eq(cas_dek_open_sealed(key2, &ids[0], sealed[0], out,
					     &error), 1);
	ck_assert_mem_eq(out, deks[0], sizeof(out));
	/* sealed after the change with the public key, opened by the
	   key unlocked before it */
	ck_assert_int_eq(cas_dek_seal_to_public(pub, &ids[1], deks[1],
						sealed[1]), 1);
	ck_assert_int_eq(cas_dek_open_sealed(key, &ids[1], sealed[1], out,
					     &error), 1);
	ck_assert_mem_eq(out, deks[1], sizeof(out));
	cas_userkey_free(&key2);
	cas_userkey_free(&pub);
	cas_userkey_free(&key);
}
END_TEST

START_TEST(test_record_seal)
{
	struct cas_userkey *key = create_key("u", "pw"), *pub, *key2;
	struct cas_userkey *other = create_key("o", "pw");
	buffer_t *sealed = buffer_create_dynamic(default_pool, 64);
	buffer_t *plain = buffer_create_dynamic(default_pool, 64);
	const char *error;
	unsigned char *p;
	unsigned int i;

	ck_assert_int_eq(cas_userkey_load_public(tmp_path("u"), &pub,
						 &error), 1);
	cas_userkey_record_seal(key, "seg:1", 5, "terms", 5, sealed);
	ck_assert_uint_eq(sealed->used, 24 + 5 + 16);
	ck_assert_int_eq(cas_userkey_record_open(key, "seg:1", 5, sealed->data,
						 sealed->used, plain,
						 &error), 1);
	ck_assert_mem_eq(plain->data, "terms", 5);
	/* the index key comes from the user secret: the same after a new
	   unlock, unusable without the password, different per user */
	ck_assert_int_eq(cas_userkey_unlock(tmp_path("u"), "pw", 2, &key2,
					    &error), 1);
	buffer_set_used_size(plain, 0);
	ck_assert_int_eq(cas_userkey_record_open(key2, "seg:1", 5,
						 sealed->data, sealed->used,
						 plain, &error), 1);
	ck_assert_int_eq(cas_userkey_record_open(pub, "seg:1", 5, sealed->data,
						 sealed->used, plain,
						 &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "locked"));
	buffer_set_used_size(plain, 0);
	ck_assert_int_eq(cas_userkey_record_open(other, "seg:1", 5,
						 sealed->data, sealed->used,
						 plain, &error), -1);
	ck_assert_int_eq(cas_userkey_record_open(key, "seg:2", 5, sealed->data,
						 sealed->used, plain,
						 &error), -1);
	ck_assert_uint_eq(plain->used, 0);
	for (i = 0; i < sealed->used; i++) {
		ck_assert_int_eq(cas_userkey_record_open(key, "seg:1", 5,
			sealed->data, i, plain, &error), -1);
		p = buffer_get_modifiable_data(sealed, NULL);
		p[i] ^= 0x20;
		ck_assert_int_eq(cas_userkey_record_open(key, "seg:1", 5,
			sealed->data, sealed->used, plain, &error), -1);
		p[i] ^= 0x20;
	}
	ck_assert_uint_eq(plain->used, 0);
	buffer_free(&sealed);
	buffer_free(&plain);
	cas_userkey_free(&key);
	cas_userkey_free(&key2);
	cas_userkey_free(&other);
	cas_userkey_free(&pub);
}
END_TEST

static bool mem_contains(const unsigned char *hay, size_t size,
			 const char *needle, size_t len)
{
	size_t i;

	for (i = 0; i + len <= size; i++) {
		if (memcmp(hay + i, needle, len) == 0)
			return TRUE;
	}
	return FALSE;
}

/* Records sealed to the public key (password-mode pack meta frames):
   LMTP seals without the password, only the unlocked key opens; every
   truncation and every bit flip of the box, another AAD, another user's
   key and a box forged with the public key alone are rejected, and
   nothing is appended to the output on failure. */
START_TEST(test_box_seal)
{
	struct cas_userkey *key = create_key("u", "pw"), *pub;
	struct cas_userkey *other = create_key("o", "pw");
	buffer_t *sealed = buffer_create_dynamic(default_pool, 128);
	buffer_t *sealed2 = buffer_create_dynamic(default_pool, 128);
	buffer_t *plain = buffer_create_dynamic(default_pool, 128);
	static const char aad[] = "CBMF\x02\x01";
	static const char msg[] = "mailbox Secret-Folder, uid 7";
	unsigned char pk[32], esk[32], shared[32], *p;
	uint32_t key_id;
	const char *error;
	unsigned int i, bit, rejected = 0;

	ck_assert_int_eq(cas_userkey_load_public(tmp_path("u"), &pub,
						 &error), 1);
	ck_assert_uint_eq(CAS_USERKEY_BOX_OVERHEAD, 68);
	ck_assert_int_eq(cas_userkey_box_seal(pub, aad, 6, msg, sizeof(msg),
					      sealed), 1);
	ck_assert_uint_eq(sealed->used, sizeof(msg) + CAS_USERKEY_BOX_OVERHEAD);
	ck_assert(!mem_contains(sealed->data, sealed->used, "Secret", 6));
	key_id = cas_userkey_key_id(pub);
	p = buffer_get_modifiable_data(sealed, NULL);
	ck_assert_uint_eq(p[0], key_id >> 24);
	ck_assert_uint_eq(p[3], key_id & 0xff);
	/* a fresh ephemeral key every time */
	ck_assert_int_eq(cas_userkey_box_seal(pub, aad, 6, msg, sizeof(msg),
					      sealed2), 1);
	ck_assert_mem_ne(sealed->data, sealed2->data, sealed->used);

	ck_assert_int_eq(cas_userkey_box_open(key, aad, 6, sealed->data,
					      sealed->used, plain, &error), 1);
	ck_assert_uint_eq(plain->used, sizeof(msg));
	ck_assert_mem_eq(plain->data, msg, sizeof(msg));
	buffer_set_used_size(plain, 0);
	ck_assert_int_eq(cas_userkey_box_open(key, aad, 6, sealed2->data,
					      sealed2->used, plain, &error), 1);
	ck_assert_mem_eq(plain->data, msg, sizeof(msg));
	buffer_set_used_size(plain, 0);
	/* an empty record */
	buffer_set_used_size(sealed2, 0);
	ck_assert_int_eq(cas_userkey_box_seal(pub, aad, 6, "", 0, sealed2), 1);
	ck_assert_int_eq(cas_userkey_box_open(key, aad, 6, sealed2->data,
					      sealed2->used, plain, &error), 1);
	ck_assert_uint_eq(plain->used, 0);

	/* verify works on the public key */
	ck_assert_int_eq(cas_userkey_box_verify(pub, aad, 6, sealed->data,
						sealed->used, &error), 1);
	/* a locked key opens nothing */
	ck_assert_int_eq(cas_userkey_box_open(pub, aad, 6, sealed->data,
					      sealed->used, plain, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "locked"));
	/* another user */
	ck_assert_int_eq(cas_userkey_box_open(other, aad, 6, sealed->data,
					      sealed->used, plain, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "another key"));
	/* ... also with the key id rewritten to theirs */
	key_id = cas_userkey_key_id(other);
	p[0] = key_id >> 24; p[1] = key_id >> 16;
	p[2] = key_id >> 8; p[3] = key_id;
	ck_assert_int_eq(cas_userkey_box_open(other, aad, 6, sealed->data,
					      sealed->used, plain, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));
	key_id = cas_userkey_key_id(key);
	p[0] = key_id >> 24; p[1] = key_id >> 16;
	p[2] = key_id >> 8; p[3] = key_id;
	/* the AAD is bound: another kind or version does not open */
	ck_assert_int_eq(cas_userkey_box_open(key, "CBMF\x02\x03", 6,
					      sealed->data, sealed->used,
					      plain, &error), -1);
	ck_assert_int_eq(cas_userkey_box_open(key, "CBMF\x01\x01", 6,
					      sealed->data, sealed->used,
					      plain, &error), -1);
	ck_assert_int_eq(cas_userkey_box_open(key, aad, 5, sealed->data,
					      sealed->used, plain, &error), -1);
	ck_assert_uint_eq(plain->used, 0);

	/* every truncation and every bit flip */
	for (i = 0; i < sealed->used; i++) {
		ck_assert_int_eq(cas_userkey_box_open(key, aad, 6,
			sealed->data, i, plain, &error), -1);
		rejected++;
		for (bit = 0; bit < 8; bit++) {
			p[i] ^= 1 << bit;
			ck_assert_int_eq(cas_userkey_box_open(key, aad, 6,
				sealed->data, sealed->used, plain, &error),
				-1);
			ck_assert_int_eq(cas_userkey_box_verify(pub, aad, 6,
				sealed->data, sealed->used, &error), -1);
			p[i] ^= 1 << bit;
			rejected++;
		}
	}
	ck_assert_uint_eq(rejected, sealed->used * 9);
	ck_assert_uint_eq(plain->used, 0);
	ck_assert_int_eq(cas_userkey_box_open(key, aad, 6, sealed->data,
					      sealed->used, plain, &error), 1);
	buffer_set_used_size(plain, 0);

	/* forged with the public key alone (the documented construction,
	   any MAC): refused by the MAC check */
	buffer_set_used_size(sealed2, 0);
	p = buffer_append_space_unsafe(sealed2, 36 + 5 + 16 + 16);
	p[0] = key_id >> 24; p[1] = key_id >> 16;
	p[2] = key_id >> 8; p[3] = key_id;
	cas_userkey_public_key(key, pk);
	crypto_box_keypair(p + 4, esk);
	ck_assert_int_eq(crypto_scalarmult(shared, esk, pk), 0);
	{
		static const unsigned char nonce[24] = { 0 };
		unsigned char k[32];
		crypto_generichash_state st;

		crypto_generichash_init(&st, shared, 32, 32);
		crypto_generichash_update(&st, (const void *)"CASUBOX1", 8);
		crypto_generichash_update(&st, p + 4, 32);
		crypto_generichash_update(&st, pk, 32);
		crypto_generichash_final(&st, k, 32);
		crypto_aead_xchacha20poly1305_ietf_encrypt(p + 36, NULL,
			(const void *)"forge", 5, (const void *)aad, 6, NULL,
			nonce, k);
	}
	randombytes_buf(p + 36 + 5 + 16, 16);
	ck_assert_int_eq(cas_userkey_box_open(key, aad, 6, sealed2->data,
					      sealed2->used, plain, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "authentication failed"));
	ck_assert_uint_eq(plain->used, 0);

	buffer_free(&sealed);
	buffer_free(&sealed2);
	buffer_free(&plain);
	cas_userkey_free(&key);
	cas_userkey_free(&other);
	cas_userkey_free(&pub);
}
END_TEST

/* Locators (the clear tag of a password-mode recovery record): keyed
   BLAKE2b-128 with KDF(D, 4, "CASUDLV1"), recomputed here from the file
   bytes; the same on the public and the unlocked key, another for
   another user or other data. The box MAC key is KDF(D, 3): a box whose
   MAC is recomputed with it verifies (the documented construction). */
START_TEST(test_locator)
{
	struct cas_userkey *key = create_key("u", "pw"), *pub;
	struct cas_userkey *other = create_key("o", "pw");
	unsigned char file[UKEY_FILE_SIZE + 1], k_loc[32], k_box[32];
	unsigned char loc[16], loc2[16], expect[16], len[8];
	buffer_t *sealed = buffer_create_dynamic(default_pool, 128);
	crypto_generichash_state st;
	unsigned char *p;
	const char *error;

	ck_assert_int_eq(cas_userkey_load_public(tmp_path("u"), &pub,
						 &error), 1);
	ck_assert_uint_eq(read_file(tmp_path("u"), file, sizeof(file)),
			  UKEY_FILE_SIZE);
	crypto_kdf_derive_from_key(k_loc, 32, 4, "CASUDLV1", file + 76);
	crypto_kdf_derive_from_key(k_box, 32, 3, "CASUDLV1", file + 76);
	crypto_generichash(expect, 16, (const void *)"mbox|7|guid", 11,
			   k_loc, 32);
	cas_userkey_locator(pub, "mbox|7|guid", 11, loc);
	ck_assert_mem_eq(loc, expect, 16);
	cas_userkey_locator(key, "mbox|7|guid", 11, loc2);
	ck_assert_mem_eq(loc2, expect, 16);
	cas_userkey_locator(key, "mbox|8|guid", 11, loc2);
	ck_assert_mem_ne(loc2, expect, 16);
	cas_userkey_locator(other, "mbox|7|guid", 11, loc2);
	ck_assert_mem_ne(loc2, expect, 16);

	/* the box MAC: BLAKE2b-128(k_box, u64 LE len(AAD) | AAD | box) */
	ck_assert_int_eq(cas_userkey_box_seal(pub, "aad", 3, "x", 1, sealed),
			 1);
	p = buffer_get_modifiable_data(sealed, NULL);
	memset(len, 0, sizeof(len));
	len[0] = 3;
	crypto_generichash_init(&st, k_box, 32, 16);
	crypto_generichash_update(&st, len, 8);
	crypto_generichash_update(&st, (const void *)"aad", 3);
	crypto_generichash_update(&st, p, sealed->used - 16);
	crypto_generichash_final(&st, expect, 16);
	ck_assert_mem_eq(p + sealed->used - 16, expect, 16);
	sodium_memzero(k_loc, sizeof(k_loc));
	sodium_memzero(k_box, sizeof(k_box));
	buffer_free(&sealed);
	cas_userkey_free(&key);
	cas_userkey_free(&other);
	cas_userkey_free(&pub);
}
END_TEST

/* Golden: the seed corpus's keyfile-fuzz-pw and sealed-dek (password
   "fuzz", Argon2id minimum limits) must keep opening. Key id, blob id of
   "hello", checksum and sealed-DEK MAC were recomputed independently with
   Python's hashlib.blake2b from the documented derivations (key id =
   BLAKE2b-128("CASUKID1" | pk)[0..3], blob-id key = KDF(D, 1,
   "CASUDLV1")). */
static const unsigned char golden_sealed[CAS_SEALED_DEK_SIZE] = {
	0x02, 0x98, 0x00, 0xfc, 0x10, 0xb3, 0x4a, 0xc4, 0x48, 0x3b, 0x83, 0x9f,
	0x7a, 0x79, 0xec, 0xa9, 0xf8, 0x65, 0x16, 0xea, 0x10, 0xa9, 0xca, 0xe5,
	0x2a, 0xc2, 0x19, 0x96, 0x38, 0x3a, 0x80, 0xe8, 0xb2, 0x03, 0x6b, 0x83,
	0x3e, 0x8d, 0x4c, 0xf7, 0xd3, 0x53, 0x8c, 0x29, 0xef, 0x8e, 0xd8, 0x63,
	0x89, 0xb9, 0x70, 0x2d, 0x9b, 0x15, 0xc0, 0x5d, 0xfd, 0x09, 0xd8, 0x4a,
	0x30, 0x91, 0x0b, 0x40, 0x48, 0xb9, 0x96, 0x8d, 0x7d, 0x3a, 0xb0, 0xd0,
	0x0b, 0xeb, 0xd9, 0xd1, 0xf5, 0x47, 0x27, 0x66, 0x85, 0xa0, 0x6f, 0x88,
	0x0a, 0xcc, 0x9d, 0x28, 0x79, 0x66, 0x27, 0xce, 0xee, 0xe4, 0xa1, 0x73,
	0x60, 0x15, 0x54, 0xe4, 0x7b, 0x29, 0xe0, 0xda, 0xa9, 0x17, 0x1d, 0xfe,
	0x1c, 0xda, 0xb1, 0x21, 0x09, 0x86, 0xb5, 0x55, 0xcc, 0x7d, 0xa4, 0x4b,
	0x2b, 0x62, 0x5a, 0x7f, 0x90, 0xa9, 0xbf, 0x25, 0x1c, 0xb4, 0xa4, 0xb5,
	0x94
};

START_TEST(test_golden)
{
	unsigned char dek[CAS_DEK_SIZE], expect[CAS_DEK_SIZE];
	struct cas_userkey *key;
	struct cas_blob_id id;
	const char *error;

	ck_assert_int_eq(cas_userkey_unlock_data(cas_userkey_golden_file,
		sizeof(cas_userkey_golden_file), "fuzz", 4, &key, &error), 1);
	ck_assert_uint_eq(cas_userkey_key_id(key), 0x9800fc10);
	cas_userkey_blob_id_compute(key, "hello", 5, &id);
	ck_assert_str_eq(cas_blob_id_to_hex(&id),
		"e9b694c2461ee731c546eef30e8a55f7"
		"5463bd64ea3128afebc7df4bf37c0e0c");
	memset(id.id, 0, sizeof(id.id));
	memset(expect, 1, sizeof(expect));
	ck_assert_int_eq(cas_dek_open_sealed(key, &id, golden_sealed, dek,
					     &error), 1);
	ck_assert_mem_eq(dek, expect, sizeof(dek));
	cas_userkey_free(&key);
}
END_TEST

START_TEST(test_unreadable)
{
	struct cas_userkey *key;
	const char *error;

	/* a directory is not a key file */
	ck_assert_int_eq(cas_userkey_load_public(tmpdir, &key, &error), -1);
	ck_assert_ptr_null(key);
	ck_assert_int_eq(cas_userkey_create(tmp_path("no/such/dir"), "pw", 2,
					    &min_limits, &key, &error), -1);
	ck_assert_ptr_null(key);
	ck_assert_uint_eq(dir_entries(), 0);
}
END_TEST

/* cas-keymode: one key ring for both modes. A password-mode ring loaded
   without the password computes the same blob ids and key id as the
   unlocked one and seals DEKs, but opens neither DEKs nor index records;
   kinds of the other mode are refused by name. */
START_TEST(test_keyring_dispatch)
{
	struct cas_userkey *created = create_key("d.ukey", "pw");
	struct cas_key_settings set;
	struct cas_keyring *pub, *unl, *server;
	unsigned char kek[CAS_KEK_SIZE], dek[CAS_DEK_SIZE], out[CAS_DEK_SIZE];
	unsigned char stored[CAS_STORED_DEK_MAX_SIZE];
	unsigned char wrapped[CAS_STORED_DEK_MAX_SIZE];
	struct cas_blob_id id1, id2, id3;
	buffer_t *sealed, *plain;
	const char *error;
	uint8_t kind, wkind;

	i_zero(&set);
	set.mode = CAS_KEY_MODE_PASSWORD;
	set.path = tmp_path("d.ukey");
	ck_assert_int_eq(cas_keyring_load_mode(&set, &pub, &error), 1);
	ck_assert(!cas_keyring_can_decrypt(pub));
	ck_assert_ptr_nonnull(cas_keyring_get_userkey(pub));
	set.password = "";
	cas_keyring_free(&pub);
	/* an empty password is no password */
	ck_assert_int_eq(cas_keyring_load_mode(&set, &pub, &error), 1);
	ck_assert(!cas_keyring_can_decrypt(pub));
	set.password = "pw";
	ck_assert_int_eq(cas_keyring_load_mode(&set, &unl, &error), 1);
	ck_assert(cas_keyring_can_decrypt(unl));
	memset(kek, 7, sizeof(kek));
	server = cas_keyring_create_from_kek(kek);
	ck_assert(cas_keyring_can_decrypt(server));
	ck_assert_ptr_null(cas_keyring_get_userkey(server));

	ck_assert_uint_eq(cas_keyring_key_id(pub),
			  cas_userkey_key_id(created));
	ck_assert_uint_eq(cas_keyring_key_id(unl), cas_keyring_key_id(pub));
	cas_blob_id_compute(pub, "hello", 5, &id1);
	cas_blob_id_compute(unl, "hello", 5, &id2);
	cas_blob_id_compute(server, "hello", 5, &id3);
	ck_assert_mem_eq(id1.id, id2.id, sizeof(id1.id));
	ck_assert_mem_ne(id1.id, id3.id, sizeof(id1.id));
	cas_userkey_blob_id_compute(created, "hello", 5, &id3);
	ck_assert_mem_eq(id1.id, id3.id, sizeof(id1.id));

	/* DEKs: sealed without the password, opened only with it */
	cas_dek_generate(dek);
	ck_assert_int_eq(cas_keyring_dek_protect(pub, &id1, dek, &kind,
						 stored, &error), 1);
	ck_assert_uint_eq(kind, CAS_DEK_KIND_SEALED);
	ck_assert_uint_eq(stored[0], CAS_DEK_KIND_SEALED);
	ck_assert_uint_eq(cas_dek_kind_size(kind), CAS_SEALED_DEK_SIZE);
	ck_assert_int_eq(cas_keyring_dek_verify(pub, &id1, kind, stored,
						&error), 1);
	ck_assert_int_eq(cas_keyring_dek_open(pub, &id1, kind, stored, out,
					      &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "locked"));
	ck_assert_int_eq(cas_keyring_dek_open(unl, &id1, kind, stored, out,
					      &error), 1);
	ck_assert_mem_eq(out, dek, sizeof(out));
	ck_assert_int_eq(cas_keyring_dek_open(unl, &id2, kind, stored, out,
					      &error), 1);
	ck_assert_int_eq(cas_keyring_dek_open(server, &id1, kind, stored,
					      out, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "password"));
	stored[CAS_SEALED_DEK_SIZE - 1] ^= 1;
	ck_assert_int_eq(cas_keyring_dek_verify(pub, &id1, kind, stored,
						&error), -1);
	ck_assert_int_eq(cas_keyring_dek_open(unl, &id1, kind, stored, out,
					      &error), -1);

	/* server kind */
	ck_assert_int_eq(cas_keyring_dek_protect(server, &id1, dek, &wkind,
						 wrapped, &error), 1);
	ck_assert_uint_eq(wkind, CAS_DEK_KIND_SERVER_WRAP);
	ck_assert_int_eq(cas_keyring_dek_verify(server, &id1, wkind, wrapped,
						&error), 0);
	ck_assert_int_eq(cas_keyring_dek_open(server, &id1, wkind, wrapped,
					      out, &error), 1);
	ck_assert_mem_eq(out, dek, sizeof(out));
	ck_assert_int_eq(cas_keyring_dek_open(unl, &id1, wkind, wrapped, out,
					      &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "server key"));
	ck_assert_int_eq(cas_keyring_dek_verify(pub, &id1, wkind, wrapped,
						&error), -1);
	ck_assert_int_eq(cas_keyring_dek_open(server, &id1, 0x33, wrapped,
					      out, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "unknown DEK kind"));
	ck_assert_uint_eq(cas_dek_kind_size(0x33), 0);

	/* index records: the index key needs the password */
	sealed = buffer_create_dynamic(default_pool, 128);
	plain = buffer_create_dynamic(default_pool, 128);
	cas_record_seal(unl, "aad", 3, "words", 5, sealed);
	ck_assert_int_eq(cas_record_open(pub, "aad", 3, sealed->data,
					 sealed->used, plain, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "locked"));
	ck_assert_int_eq(cas_record_open(server, "aad", 3, sealed->data,
					 sealed->used, plain, &error), -1);
	ck_assert_int_eq(cas_record_open(unl, "aad", 3, sealed->data,
					 sealed->used, plain, &error), 1);
	ck_assert_uint_eq(plain->used, 5);
	ck_assert_mem_eq(plain->data, "words", 5);
	buffer_free(&sealed);
	buffer_free(&plain);

	sodium_memzero(dek, sizeof(dek));
	cas_keyring_free(&pub);
	cas_keyring_free(&unl);
	cas_keyring_free(&server);
	cas_userkey_free(&created);
}
END_TEST

/* Loading by mode: a wrong password, a missing file and creating
   without a password are clear errors. */
START_TEST(test_keyring_load_mode)
{
	struct cas_userkey *created = create_key("m.ukey", "right");
	struct cas_key_settings set;
	struct cas_keyring *k;
	const char *error;

	i_zero(&set);
	set.mode = CAS_KEY_MODE_PASSWORD;
	set.path = tmp_path("m.ukey");
	set.password = "wrong";
	ck_assert_int_eq(cas_keyring_load_mode(&set, &k, &error), -1);
	ck_assert_ptr_null(k);
	ck_assert_ptr_nonnull(strstr(error, "wrong password"));
	ck_assert_ptr_nonnull(strstr(error, set.path));

	set.path = tmp_path("missing.ukey");
	ck_assert_int_eq(cas_keyring_load_mode(&set, &k, &error), 0);
	set.password = NULL;
	ck_assert_int_eq(cas_keyring_load_mode(&set, &k, &error), 0);
	ck_assert_int_eq(cas_keyring_create_mode(&set, &k, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "password"));
	ck_assert_ptr_nonnull(strstr(error, set.path));
	ck_assert_int_eq(access(set.path, F_OK), -1);

	/* a server-mode ring cannot read a user key file */
	set.mode = CAS_KEY_MODE_SERVER;
	set.path = tmp_path("m.ukey");
	ck_assert_int_eq(cas_keyring_load_mode(&set, &k, &error), -1);

	ck_assert_int_eq(cas_key_mode_parse("server", &set.mode), 0);
	ck_assert_int_eq(set.mode, CAS_KEY_MODE_SERVER);
	ck_assert_int_eq(cas_key_mode_parse("password", &set.mode), 0);
	ck_assert_int_eq(set.mode, CAS_KEY_MODE_PASSWORD);
	ck_assert_int_eq(cas_key_mode_parse("Password", &set.mode), -1);
	ck_assert_int_eq(cas_key_mode_parse("", &set.mode), -1);
	ck_assert_str_eq(cas_key_mode_name(CAS_KEY_MODE_PASSWORD),
			 "password");
	cas_userkey_free(&created);
}
END_TEST

/* A key file its group or others can access is refused, naming the
   file and the mode; the owner-only modes load. */
START_TEST(test_key_file_mode)
{
	static const unsigned int bad[] = { 0640, 0604, 0644, 0660, 0602,
					    0610, 0601 };
	struct cas_userkey *created = create_key("p.ukey", "pw"), *k;
	const char *path = tmp_path("p.ukey"), *error;
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(bad); i++) {
		ck_assert_int_eq(chmod(path, bad[i]), 0);
		ck_assert_int_eq(cas_userkey_load_public(path, &k, &error),
				 -1);
		ck_assert_ptr_null(k);
		ck_assert_ptr_nonnull(strstr(error, path));
		ck_assert_ptr_nonnull(strstr(error, t_strdup_printf(
			"mode %04o", bad[i])));
		ck_assert_int_eq(cas_userkey_unlock(path, "pw", 2, &k,
						    &error), -1);
		ck_assert_ptr_nonnull(strstr(error, "group or others"));
		ck_assert_int_eq(cas_userkey_change_password(path, "pw", 2,
			"new", 3, &min_limits, &error), -1);
	}
	ck_assert_int_eq(chmod(path, 0400), 0);
	ck_assert_int_eq(cas_userkey_load_public(path, &k, &error), 1);
	cas_userkey_free(&k);
	ck_assert_int_eq(chmod(path, 0600), 0);
	ck_assert_int_eq(cas_userkey_unlock(path, "pw", 2, &k, &error), 1);
	cas_userkey_free(&k);
	cas_userkey_free(&created);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("userkey");
	TCase *tc = tcase_create("userkey");
	int failed;

	lib_init();
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_create_unlock);
	tcase_add_test(tc, test_two_users_differ);
	tcase_add_test(tc, test_wrong_password);
	tcase_add_test(tc, test_key_file_damage);
	tcase_add_test(tc, test_hostile_limits);
	tcase_add_test(tc, test_dek_seal_open);
	tcase_add_test(tc, test_dek_forged_with_public_key);
	tcase_add_test(tc, test_delivery_key_derivation);
	tcase_add_test(tc, test_password_change);
	tcase_add_test(tc, test_record_seal);
	tcase_add_test(tc, test_box_seal);
	tcase_add_test(tc, test_locator);
	tcase_add_test(tc, test_golden);
	tcase_add_test(tc, test_unreadable);
	tcase_add_test(tc, test_keyring_dispatch);
	tcase_add_test(tc, test_keyring_load_mode);
	tcase_add_test(tc, test_key_file_mode);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
