/* Sealed packs in object storage, the blob layer alone (casbox-objstore,
   casbox-pack-file, casbox-pack-upload) with the dir: driver: upload
   leaves stubs and byte-identical objects, every blob reads back through
   the cache; a flipped cache byte or a cleared map is refetched, never
   returned; a cut object and a missing store fail reads with a
   temporary error and uploads without touching the local packs; stubs
   of the wrong size or magic are refused; the cache stays near its
   bound; a spec without prefix= is refused. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "cas-key.h"
#include "casbox-pack.h"
#include "casbox-pack-file.h"
#include "casbox-objstore.h"

#include <check.h>
#include "check-run.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#define BLOBS 24
#define BLOB_SIZE (30 * 1024)

static char tmpdir[] = "/tmp/check-objstore.XXXXXX";
static struct cas_keyring *keyring;
static buffer_t *blobs[BLOBS];
static struct cas_blob_id ids[BLOBS];
static struct casbox_blob_record recs[BLOBS];

static void setup(void)
{
	unsigned char kek[CAS_KEK_SIZE];
	unsigned int i, j;

	strcpy(tmpdir, "/tmp/check-objstore.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
	ck_assert_int_eq(mkdir(t_strdup_printf("%s/objects", tmpdir), 0700),
			 0);
	memset(kek, 7, sizeof(kek));
	keyring = cas_keyring_create_from_kek(kek);
	/* incompressible: packs of 64 KiB rotate every two blobs */
	srandom(22);
	for (i = 0; i < BLOBS; i++) {
		blobs[i] = buffer_create_dynamic(default_pool, BLOB_SIZE);
		for (j = 0; j < BLOB_SIZE; j++)
			buffer_append_c(blobs[i], (unsigned char)random());
	}
}

static void teardown(void)
{
	unsigned int i;

	for (i = 0; i < BLOBS; i++)
		buffer_free(&blobs[i]);
	cas_keyring_free(&keyring);
	ck_assert_int_eq(system(t_strdup_printf("rm -rf '%s'", tmpdir)), 0);
}

static struct casbox_pack_store *store_open_size(uint64_t cache_size)
{
	struct casbox_pack_settings set;
	struct casbox_pack_store *store;
	const char *error;

	i_zero(&set);
	set.dir = t_strdup_printf("%s/packs", tmpdir);
	set.max_pack_size = 64 * 1024;
	set.storage = t_strdup_printf("dir:path=%s/objects,prefix=u1/",
				      tmpdir);
	set.cache_size = cache_size;
	if (casbox_pack_store_open(&set, keyring, &store, &error) < 0)
		ck_abort_msg("store open: %s", error);
	return store;
}

static struct casbox_pack_store *store_open(void)
{
	return store_open_size(0);
}

static void add_all(struct casbox_pack_store *store)
{
	struct casbox_pack_txn *txn;
	struct istream *input;
	const char *error;
	unsigned int i;

	for (i = 0; i < BLOBS; i++) {
		ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
		cas_blob_id_compute(keyring, blobs[i]->data, blobs[i]->used,
				    &ids[i]);
		input = i_stream_create_from_data(blobs[i]->data,
						  blobs[i]->used);
		ck_assert_int_eq(casbox_pack_txn_add(txn, &ids[i], input,
						     &recs[i], &error), 1);
		i_stream_unref(&input);
		ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
	}
}

/* 1 = the blob's bytes, 0 = a clean failure (never other bytes). */
static int read_blob(struct casbox_pack_store *store, unsigned int i)
{
	struct istream *input;
	const unsigned char *data;
	const char *error;
	buffer_t *out;
	size_t size;
	int ret;

	ret = casbox_pack_blob_open_pinned(store, &ids[i], &recs[i], &input,
					   &error);
	if (ret <= 0)
		return 0;
	out = t_buffer_create(BLOB_SIZE);
	while (i_stream_read_more(input, &data, &size) > 0) {
		buffer_append(out, data, size);
		i_stream_skip(input, size);
	}
	ret = input->stream_errno == 0 ? 1 : 0;
	i_stream_unref(&input);
	if (ret == 1) {
		ck_assert_uint_eq(out->used, blobs[i]->used);
		ck_assert(memcmp(out->data, blobs[i]->data, out->used) == 0);
	}
	return ret;
}

static unsigned int count_files(const char *dir, const char *suffix)
{
	unsigned int n = 0;
	struct dirent *d;
	DIR *dp = opendir(dir);

	if (dp == NULL)
		return 0;
	while ((d = readdir(dp)) != NULL) {
		size_t len = strlen(d->d_name);

		if (len > strlen(suffix) &&
		    strcmp(d->d_name + len - strlen(suffix), suffix) == 0)
			n++;
	}
	(void)closedir(dp);
	return n;
}

static const char *packs_dir(void)
{
	return t_strdup_printf("%s/packs", tmpdir);
}

static const char *objects_dir(void)
{
	return t_strdup_printf("%s/objects/u1", tmpdir);
}

static void drop_cache(void)
{
	ck_assert_int_eq(system(t_strdup_printf("rm -rf '%s/cache'",
						packs_dir())), 0);
}

static unsigned int upload_all(struct casbox_pack_store *store)
{
	const char *error;

	if (casbox_pack_store_upload(store, TRUE, &error) < 0)
		ck_abort_msg("upload: %s", error);
	return casbox_pack_store_get_upload_stats(store)->packs;
}

START_TEST(test_upload_read)
{
	struct casbox_pack_store *store = store_open();
	unsigned int i, uploaded, cbp;
	uint64_t size;
	bool remote;
	const char *error;

	add_all(store);
	cbp = count_files(packs_dir(), ".cbp");
	ck_assert_uint_ge(cbp, 6);
	uploaded = upload_all(store);
	ck_assert_uint_eq(uploaded, cbp - 1);
	ck_assert_uint_eq(count_files(packs_dir(), ".cbp"), 1);
	ck_assert_uint_eq(count_files(packs_dir(), ".cbr"), uploaded);
	ck_assert_uint_eq(count_files(objects_dir(), ".cbp"), uploaded);
	ck_assert_int_eq(casbox_pack_store_pack_size(store, recs[0].pack_id,
						     &size, &remote, &error), 1);
	ck_assert(remote);
	for (i = 0; i < BLOBS; i++)
		ck_assert_int_eq(read_blob(store, i), 1);
	/* again, from the warm cache */
	for (i = 0; i < BLOBS; i++)
		ck_assert_int_eq(read_blob(store, i), 1);
	/* a second run has nothing left to do */
	ck_assert_uint_eq(upload_all(store), uploaded);
	casbox_pack_store_close(&store);
}
END_TEST

static const char *cache_path(uint32_t pack_id, const char *ext)
{
	return t_strdup_printf("%s/cache/pack-%08u.%s", packs_dir(), pack_id,
			       ext);
}

static void poke(const char *path, off_t off, unsigned char xor)
{
	unsigned char c;
	int fd = open(path, O_RDWR);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &c, 1, off), 1);
	c ^= xor;
	ck_assert_int_eq(pwrite(fd, &c, 1, off), 1);
	i_close_fd(&fd);
}

START_TEST(test_cache_tamper)
{
	struct casbox_pack_store *store = store_open();

	add_all(store);
	upload_all(store);
	ck_assert_int_eq(read_blob(store, 0), 1);
	casbox_pack_store_close(&store);
	/* a byte of the cached frame, then the map's header */
	poke(cache_path(recs[0].pack_id, "data"), recs[0].offset + 100, 0x5a);
	store = store_open();
	ck_assert_int_eq(read_blob(store, 0), 1);
	casbox_pack_store_close(&store);
	poke(cache_path(recs[0].pack_id, "map"), 3, 0x01);
	poke(cache_path(recs[0].pack_id, "data"), recs[0].offset + 200, 0xff);
	store = store_open();
	ck_assert_int_eq(read_blob(store, 0), 1);
	casbox_pack_store_close(&store);
}
END_TEST

START_TEST(test_object_cut)
{
	struct casbox_pack_store *store = store_open();
	const char *obj;

	add_all(store);
	upload_all(store);
	obj = t_strdup_printf("%s/pack-%08u.cbp", objects_dir(),
			      recs[0].pack_id);
	ck_assert_int_eq(truncate(obj, 100), 0);
	drop_cache();
	ck_assert_int_eq(read_blob(store, 0), 0);
	ck_assert(casbox_pack_store_error_is_temporary(store));
	/* blobs of other packs still read */
	ck_assert_int_eq(read_blob(store, BLOBS - 1), 1);
	casbox_pack_store_close(&store);
}
END_TEST

START_TEST(test_store_missing)
{
	struct casbox_pack_store *store = store_open();
	const char *objects = t_strdup_printf("%s/objects", tmpdir);
	const char *down = t_strdup_printf("%s/objects.down", tmpdir);
	const char *error;
	unsigned int i, cbp;

	add_all(store);
	ck_assert_int_eq(rename(objects, down), 0);
	cbp = count_files(packs_dir(), ".cbp");
	ck_assert_int_eq(casbox_pack_store_upload(store, TRUE, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "objects"));
	ck_assert_uint_eq(count_files(packs_dir(), ".cbp"), cbp);
	ck_assert_uint_eq(count_files(packs_dir(), ".cbr"), 0);
	/* local packs read as before; the backoff holds automatic runs */
	for (i = 0; i < BLOBS; i++)
		ck_assert_int_eq(read_blob(store, i), 1);
	ck_assert_int_eq(casbox_pack_store_upload(store, FALSE, &error), 0);
	ck_assert_int_eq(rename(down, objects), 0);
	upload_all(store);
	ck_assert_int_eq(rename(objects, down), 0);
	drop_cache();
	ck_assert_int_eq(read_blob(store, 0), 0);
	ck_assert(casbox_pack_store_error_is_temporary(store));
	ck_assert_int_eq(rename(down, objects), 0);
	ck_assert_int_eq(read_blob(store, 0), 1);
	casbox_pack_store_close(&store);
}
END_TEST

START_TEST(test_stub_refused)
{
	struct casbox_pack_stub stub, got;
	unsigned char buf[CASBOX_PACK_STUB_SIZE];
	const char *path = t_strdup_printf("%s/stub", tmpdir);
	const char *error;
	unsigned int len, i;
	int fd;

	i_zero(&stub);
	stub.pack_id = 7;
	stub.size = 123456;
	memset(stub.hash, 0xab, sizeof(stub.hash));
	casbox_pack_stub_export(&stub, buf);
	for (len = 0; len <= sizeof(buf); len++) {
		fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		ck_assert_int_eq(write(fd, buf, len), (ssize_t)len);
		i_close_fd(&fd);
		ck_assert_int_eq(casbox_pack_stub_read(path, &got, &error),
				 len == sizeof(buf) ? 1 : -1);
	}
	ck_assert_uint_eq(got.pack_id, 7);
	ck_assert_uint_eq(got.size, 123456);
	ck_assert(memcmp(got.hash, stub.hash, sizeof(got.hash)) == 0);
	/* magic and version */
	for (i = 0; i < 12; i++) {
		buf[i] ^= 0x20;
		fd = open(path, O_WRONLY | O_TRUNC);
		ck_assert_int_eq(write(fd, buf, sizeof(buf)),
				 (ssize_t)sizeof(buf));
		i_close_fd(&fd);
		ck_assert_int_eq(casbox_pack_stub_read(path, &got, &error),
				 -1);
		buf[i] ^= 0x20;
	}
	ck_assert_int_eq(casbox_pack_stub_read(t_strconcat(path, ".none",
							   NULL),
					       &got, &error), 0);
}
END_TEST

static uint64_t cache_bytes(void)
{
	const char *dir = t_strdup_printf("%s/cache", packs_dir());
	uint64_t total = 0;
	struct dirent *d;
	struct stat st;
	DIR *dp = opendir(dir);

	ck_assert_ptr_nonnull(dp);
	while ((d = readdir(dp)) != NULL) {
		if (strstr(d->d_name, ".data") != NULL &&
		    stat(t_strdup_printf("%s/%s", dir, d->d_name), &st) == 0)
			total += (uint64_t)st.st_blocks * 512;
	}
	(void)closedir(dp);
	return total;
}

START_TEST(test_cache_bound)
{
	struct casbox_pack_store *store = store_open_size(200 * 1024);
	unsigned int i;

	add_all(store);
	upload_all(store);
	drop_cache();
	for (i = 0; i < BLOBS; i++) {
		ck_assert_int_eq(read_blob(store, i), 1);
		/* checked every bound/8 fetched: one pack over at most */
		ck_assert_uint_le(cache_bytes(), 200 * 1024 + 128 * 1024);
	}
	casbox_pack_store_close(&store);
}
END_TEST

START_TEST(test_spec_refused)
{
	static const char *const bad[] = {
		"dir:path=/x", "dir:path=/x,prefix=", "dir:prefix=u/",
		"nosuch:prefix=u/", "dir", "dir:path=/x,prefix=../u/",
		"dir:path=/x,prefix=u/,timeout=0",
	};
	struct casbox_objstore *os;
	const char *error;
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(bad); i++) {
		ck_assert_int_eq(casbox_objstore_create(bad[i], &os, &error),
				 -1);
		ck_assert_ptr_null(os);
	}
	ck_assert_int_eq(casbox_objstore_create("local", &os, &error), 0);
	ck_assert_int_eq(casbox_objstore_create("", &os, &error), 0);
	ck_assert_int_eq(casbox_objstore_create("dir:path=/x,prefix=u/",
						&os, &error), 1);
	ck_assert_str_eq(casbox_objstore_pack_name(os, 12),
			 "u/pack-00000012.cbp");
	ck_assert_uint_eq(casbox_objstore_pack_id(os, "u/pack-00000012.cbp"),
			  12);
	ck_assert_uint_eq(casbox_objstore_pack_id(os, "v/pack-00000012.cbp"),
			  0);
	ck_assert_uint_eq(casbox_objstore_pack_id(os, "u/pack-00000012.cbpx"),
			  0);
	casbox_objstore_destroy(&os);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("objstore");
	TCase *tc = tcase_create("objstore");
	int failed;

	lib_init();
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_upload_read);
	tcase_add_test(tc, test_cache_tamper);
	tcase_add_test(tc, test_object_cut);
	tcase_add_test(tc, test_store_missing);
	tcase_add_test(tc, test_stub_refused);
	tcase_add_test(tc, test_cache_bound);
	tcase_add_test(tc, test_spec_refused);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
