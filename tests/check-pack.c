/* casbox-pack: round trips over the real corpus, seeks into large blobs,
   every truncation and single-byte change of a frame gives a clean EIO
   (never other bytes), wrong key and wrong id rejected, record
   export/import, rotation, rollback, keyless scan with resync after
   damage, dictionaries, and meta frames (recovery records, DEK updates:
   sealed, every byte change and truncation rejected, never taken for a
   blob, never appended to a version 1 pack). */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "istream-concat.h"
#include "cas-key.h"
#include "casbox-pack.h"
#include "casbox-frame.h"
#include "casbox-pack-private.h"
#include "byteorder.h"
#include "cas-crc32c.h"

#include <check.h>
#include "check-run.h"
#include <sodium.h>
#include <stdlib.h>
#include <stdio.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char tmpdir[] = "/tmp/check-pack.XXXXXX";
static struct cas_keyring *keyring;

static const char *corpus_dir(const char *sub)
{
	const char *root = getenv("CASBOX_CORPUS");

	if (root == NULL)
		root = "/work/shared/corpus";
	return t_strdup_printf("%s/%s", root, sub);
}

static struct cas_keyring *test_keyring(unsigned char seed)
{
	unsigned char kek[CAS_KEK_SIZE];

	memset(kek, seed, sizeof(kek));
	return cas_keyring_create_from_kek(kek);
}

static void setup(void)
{
	strcpy(tmpdir, "/tmp/check-pack.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
	keyring = test_keyring(1);
}

static void teardown(void)
{
	ck_assert_int_eq(system(t_strdup_printf("rm -rf '%s'", tmpdir)), 0);
	cas_keyring_free(&keyring);
}

static struct casbox_pack_store *
store_open_with(const struct cas_keyring *k, uint64_t max_pack_size)
{
	struct casbox_pack_settings set;
	struct casbox_pack_store *store;
	const char *error;

	i_zero(&set);
	set.dir = t_strdup_printf("%s/packs", tmpdir);
	set.fsync = FALSE;
	set.max_pack_size = max_pack_size;
	if (casbox_pack_store_open(&set, k, &store, &error) < 0)
		ck_abort_msg("store open: %s", error);
	return store;
}

static struct casbox_pack_store *store_open(void)
{
	return store_open_with(keyring, 0);
}

static void
add_blobs(struct casbox_pack_store *store, const buffer_t *const *blobs,
	  unsigned int count, struct cas_blob_id *ids,
	  struct casbox_blob_record *recs)
{
	struct casbox_pack_txn *txn;
	struct istream *input;
	const char *error;
	unsigned int i;

	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	for (i = 0; i < count; i++) {
		cas_blob_id_compute(keyring, blobs[i]->data, blobs[i]->used,
				    &ids[i]);
		input = i_stream_create_from_data(blobs[i]->data,
						  blobs[i]->used);
		if (casbox_pack_txn_add(txn, &ids[i], input, &recs[i],
					&error) < 0)
			ck_abort_msg("add: %s", error);
		i_stream_unref(&input);
		ck_assert_uint_eq(recs[i].plain_size, blobs[i]->used);
	}
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
	ck_assert_ptr_null(txn);
}

/* Read a blob whole. Returns 0 ok (bytes in out), -1 stream error. */
static int read_blob(struct casbox_pack_store *store,
		     const struct cas_blob_id *id,
		     const struct casbox_blob_record *rec, buffer_t *out)
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
		ck_assert_ptr_nonnull(strstr(i_stream_get_error(input),
					     cas_blob_id_to_hex(id)));
	}
	i_stream_unref(&input);
	return ret;
}

static void assert_blob(struct casbox_pack_store *store,
			const struct cas_blob_id *id,
			const struct casbox_blob_record *rec,
			const buffer_t *expected)
{
	buffer_t *out = buffer_create_dynamic(default_pool, 1024);

	ck_assert_int_eq(read_blob(store, id, rec, out), 0);
	ck_assert_uint_eq(out->used, expected->used);
	ck_assert(memcmp(out->data, expected->data, out->used) == 0);
	buffer_free(&out);
}

static buffer_t *read_path(const char *path)
{
	buffer_t *buf = buffer_create_dynamic(default_pool, 4096);
	FILE *f = fopen(path, "r");
	char tmp[8192];
	size_t n;

	ck_assert_ptr_nonnull(f);
	while ((n = fread(tmp, 1, sizeof(tmp), f)) > 0)
		buffer_append(buf, tmp, n);
	ck_assert_int_eq(fclose(f), 0);
	return buf;
}

static unsigned int
corpus_files(const char *sub, unsigned int every,
	     ARRAY_TYPE(const_string) *paths)
{
	struct dirent **names;
	const char *dir = corpus_dir(sub);
	int i, n;

	n = scandir(dir, &names, NULL, alphasort);
	ck_assert_msg(n > 2, "corpus %s missing", dir);
	for (i = 0; i < n; i++) {
		if (names[i]->d_name[0] != '.' && i % every == 0) {
			const char *p = t_strdup_printf("%s/%s", dir,
							names[i]->d_name);
			array_push_back(paths, &p);
		}
		free(names[i]);
	}
	free(names);
	return array_count(paths);
}

static buffer_t *pattern_blob(size_t size, unsigned int seed)
{
	buffer_t *buf = buffer_create_dynamic(default_pool, size + 1);
	uint32_t x = seed * 2654435761U + 1;
	size_t i;

	/* half text-like, half noise: both compressible and not */
	for (i = 0; i < size; i++) {
		x = x * 1103515245U + 12345U;
		buffer_append_c(buf, (i / 4096) % 2 == 0 ?
				(unsigned char)"abcdefgh \r\n"[(x >> 16) % 11] :
				(unsigned char)(x >> 16));
	}
	return buf;
}

/* count pattern blobs of size + i bytes and seed + i, blob i */
static void pattern_blobs(buffer_t **blobs, unsigned int count, size_t size,
			  unsigned int seed)
{
	unsigned int i;

	for (i = 0; i < count; i++)
		blobs[i] = pattern_blob(size + i, seed + i);
}

START_TEST(test_corpus_round_trip)
{
	ARRAY_TYPE(const_string) paths;
	struct casbox_pack_store *store = store_open();
	const char *const *path;
	unsigned int n = 0;

	t_array_init(&paths, 512);
	corpus_files("usrp-users-3000", 10, &paths);
	corpus_files("mime-edge", 1, &paths);
	ck_assert_uint_gt(array_count(&paths), 400);
	array_foreach(&paths, path) T_BEGIN {
		buffer_t *blob = read_path(*path);
		struct cas_blob_id id;
		struct casbox_blob_record rec;

		add_blobs(store, (const buffer_t *const *)&blob, 1, &id, &rec);
		ck_assert_uint_eq(rec.frame_size >= CASBOX_FRAME_HEADER_SIZE,
				  1);
		assert_blob(store, &id, &rec, blob);
		buffer_free(&blob);
		n++;
	} T_END;
	ck_assert_uint_eq(n, array_count(&paths));
	casbox_pack_store_close(&store);
}
END_TEST

START_TEST(test_chunk_boundaries)
{
	static const size_t sizes[] = {
		0, 1, 65535, 65536, 65537, 131072, 200000
	};
	struct casbox_pack_store *store = store_open();
	buffer_t *blobs[N_ELEMENTS(sizes)];
	struct cas_blob_id ids[N_ELEMENTS(sizes)];
	struct casbox_blob_record recs[N_ELEMENTS(sizes)];
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(sizes); i++)
		blobs[i] = pattern_blob(sizes[i], i);
	add_blobs(store, (const buffer_t *const *)blobs, N_ELEMENTS(sizes),
		  ids, recs);
	for (i = 0; i < N_ELEMENTS(sizes); i++) {
		ck_assert_uint_eq(recs[i].plain_size, sizes[i]);
		assert_blob(store, &ids[i], &recs[i], blobs[i]);
		buffer_free(&blobs[i]);
	}
	casbox_pack_store_close(&store);
}
END_TEST

START_TEST(test_seek)
{
	struct casbox_pack_store *store = store_open();
	buffer_t *blob = pattern_blob(1000 * 1000 + 17, 3);
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	struct istream *input;
	const unsigned char *data;
	size_t size;
	uoff_t off, stream_size;
	unsigned int i;

	add_blobs(store, (const buffer_t *const *)&blob, 1, &id, &rec);
	input = casbox_pack_blob_open(store, &id, &rec);
	ck_assert_int_eq(i_stream_get_size(input, TRUE, &stream_size), 1);
	ck_assert_uint_eq(stream_size, blob->used);
	/* forwards, backwards, across chunk boundaries */
	for (i = 0; i < 200; i++) {
		off = ((uint64_t)i * 7919 * 65521) % blob->used;
		if (i % 5 == 0)
			off = (off / 65536) * 65536 + 65530;
		if (off >= blob->used)
			off = blob->used - 1;
		i_stream_seek(input, off);
		ck_assert_int_eq(i_stream_read_bytes(input, &data, &size, 1),
				 1);
		size = I_MIN(size, blob->used - off);
		ck_assert(memcmp(data, CONST_PTR_OFFSET(blob->data, off),
				 size) == 0);
		/* read a stretch across the next boundary */
		if (off + 20 <= blob->used) {
			ck_assert_int_eq(i_stream_read_bytes(input, &data,
							     &size, 20), 1);
			ck_assert(memcmp(data, CONST_PTR_OFFSET(blob->data, off),
					 20) == 0);
		}
	}
	i_stream_seek(input, blob->used);
	ck_assert_int_eq(i_stream_read(input), -1);
	ck_assert_int_eq(input->stream_errno, 0);
	ck_assert(input->eof);
	i_stream_unref(&input);
	buffer_free(&blob);
	casbox_pack_store_close(&store);
}
END_TEST

static void pack_poke(const struct casbox_blob_record *rec, uint64_t off,
		      unsigned char xor_val, unsigned char *old_r)
{
	const char *path = t_strdup_printf("%s/packs/pack-%08u.cbp", tmpdir,
					   rec->pack_id);
	unsigned char c;
	int fd = open(path, O_RDWR);

	ck_assert_int_ne(fd, -1);
	ck_assert_int_eq(pread(fd, &c, 1, rec->offset + off), 1);
	*old_r = c;
	c ^= xor_val;
	ck_assert_int_eq(pwrite(fd, &c, 1, rec->offset + off), 1);
	ck_assert_int_eq(close(fd), 0);
}

static void pack_truncate(const struct casbox_blob_record *rec,
			  uint64_t frame_len)
{
	const char *path = t_strdup_printf("%s/packs/pack-%08u.cbp", tmpdir,
					   rec->pack_id);

	ck_assert_int_eq(truncate(path, rec->offset + frame_len), 0);
}

static const unsigned char damage_xors[] = { 0x01, 0x80, 0xff };

static void
damage_frame(uint64_t blob_size, unsigned int step, unsigned int n_xors)
{
	struct casbox_pack_store *store = store_open();
	buffer_t *blob = pattern_blob(blob_size, 5);
	buffer_t *out = buffer_create_dynamic(default_pool, 1024);
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	unsigned char old;
	uint64_t i;

	add_blobs(store, (const buffer_t *const *)&blob, 1, &id, &rec);
	assert_blob(store, &id, &rec, blob);
	for (i = 0; i < rec.frame_size; i += step) T_BEGIN {
		unsigned int x;

		for (x = 0; x < n_xors; x++) {
			pack_poke(&rec, i, damage_xors[x], &old);
			ck_assert_msg(read_blob(store, &id, &rec, out) < 0,
				"byte %"PRIu64" ^ %02x, still read", i,
				damage_xors[x]);
			pack_poke(&rec, i, damage_xors[x], &old);
		}
	} T_END;
	assert_blob(store, &id, &rec, blob);
	for (i = rec.frame_size; i > 0; i -= I_MIN(i, step)) T_BEGIN {
		pack_truncate(&rec, i - 1);
		ck_assert_msg(read_blob(store, &id, &rec, out) < 0,
			      "truncated to %"PRIu64", still read", i - 1);
	} T_END;
	buffer_free(&out);
	buffer_free(&blob);
	casbox_pack_store_close(&store);
}

START_TEST(test_damage_small_exhaustive)
{
	damage_frame(3000, 1, N_ELEMENTS(damage_xors));
}
END_TEST

START_TEST(test_damage_large_sampled)
{
	damage_frame(300 * 1000, 997, 1);
}
END_TEST

START_TEST(test_damage_record_fields)
{
	struct casbox_pack_store *store = store_open();
	buffer_t *blob = pattern_blob(70000, 6);
	buffer_t *out = buffer_create_dynamic(default_pool, 1024);
	struct casbox_blob_record rec, bad;
	struct cas_blob_id id, other;

	add_blobs(store, (const buffer_t *const *)&blob, 1, &id, &rec);
	bad = rec; bad.plain_size--;
	ck_assert_int_eq(read_blob(store, &id, &bad, out), -1);
	bad = rec; bad.frame_size++;
	ck_assert_int_eq(read_blob(store, &id, &bad, out), -1);
	bad = rec; bad.offset++;
	ck_assert_int_eq(read_blob(store, &id, &bad, out), -1);
	bad = rec; bad.dict_id = 1;
	ck_assert_int_eq(read_blob(store, &id, &bad, out), -1);
	bad = rec; bad.wrapped_dek[40] ^= 1;
	ck_assert_int_eq(read_blob(store, &id, &bad, out), -1);
	bad = rec; bad.pack_id = 99;
	ck_assert_int_eq(read_blob(store, &id, &bad, out), -1);
	other = id; other.id[0] ^= 1;
	ck_assert_int_eq(read_blob(store, &other, &rec, out), -1);
	buffer_free(&out);
	buffer_free(&blob);
	casbox_pack_store_close(&store);
}
END_TEST

START_TEST(test_wrong_key)
{
	struct casbox_pack_store *store = store_open();
	struct cas_keyring *k2 = test_keyring(2);
	buffer_t *blob = pattern_blob(5000, 7);
	buffer_t *out = buffer_create_dynamic(default_pool, 1024);
	struct casbox_blob_record rec;
	struct cas_blob_id id;

	add_blobs(store, (const buffer_t *const *)&blob, 1, &id, &rec);
	casbox_pack_store_close(&store);
	store = store_open_with(k2, 0);
	ck_assert_int_eq(read_blob(store, &id, &rec, out), -1);
	ck_assert_uint_eq(out->used, 0);
	casbox_pack_store_close(&store);
	cas_keyring_free(&k2);
	buffer_free(&out);
	buffer_free(&blob);
}
END_TEST

START_TEST(test_add_rejects)
{
	struct casbox_pack_store *store = store_open();
	struct casbox_pack_txn *txn;
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	struct istream *input;
	const char *error, *path;
	struct stat st;

	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	path = t_strdup_printf("%s/packs/pack-00000001.cbp", tmpdir);
	/* id not of this content */
	cas_blob_id_compute(keyring, "abc", 3, &id);
	input = i_stream_create_from_data("abd", 3);
	ck_assert_int_eq(casbox_pack_txn_add(txn, &id, input, &rec, &error),
			 -1);
	ck_assert_ptr_nonnull(strstr(error, "does not match"));
	i_stream_unref(&input);
	/* input stream error */
	input = i_stream_create_error_str(EIO, "disk on fire");
	ck_assert_int_eq(casbox_pack_txn_add(txn, &id, input, &rec, &error),
			 -1);
	ck_assert_ptr_nonnull(strstr(error, "disk on fire"));
	i_stream_unref(&input);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_eq(st.st_size, CASBOX_PACK_HEADER_SIZE);
	/* a second store on the same directory in this process cannot
	   interleave appends (fcntl locks do not exclude it) */
	{
		struct casbox_pack_store *store2 = store_open();
		struct casbox_pack_txn *txn2;

		ck_assert_int_eq(casbox_pack_txn_begin(store2, &txn2, &error),
				 -1);
		ck_assert_ptr_nonnull(strstr(error, "already appending"));
		casbox_pack_store_close(&store2);
	}
	/* rollback drops what was added */
	input = i_stream_create_from_data("abc", 3);
	ck_assert_int_eq(casbox_pack_txn_add(txn, &id, input, &rec, &error),
			 1);
	i_stream_unref(&input);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_gt(st.st_size, CASBOX_PACK_HEADER_SIZE);
	casbox_pack_txn_rollback(&txn);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_eq(st.st_size, CASBOX_PACK_HEADER_SIZE);
	/* and after the rollback it can */
	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	casbox_pack_txn_rollback(&txn);
	casbox_pack_store_close(&store);
}
END_TEST

/* Export rec into buf (left holding exactly the export): it imports
   back equal, and every truncation and one byte more are refused. */
static void record_roundtrip(const struct casbox_blob_record *rec,
			     buffer_t *buf)
{
	struct casbox_blob_record rec2;
	const char *error;
	unsigned int i;

	casbox_blob_record_export(rec, buf);
	ck_assert_int_eq(casbox_blob_record_import(buf->data, buf->used,
						   &rec2, &error), 1);
	ck_assert_mem_eq(rec, &rec2, sizeof(*rec));
	for (i = 0; i < buf->used; i++) {
		ck_assert_int_eq(casbox_blob_record_import(buf->data, i,
							   &rec2, &error), -1);
	}
	buffer_append_c(buf, 0);
	ck_assert_int_eq(casbox_blob_record_import(buf->data, buf->used,
						   &rec2, &error), -1);
	buffer_set_used_size(buf, buf->used - 1);
}

START_TEST(test_record_export_import)
{
	struct casbox_blob_record rec, rec2;
	buffer_t *buf = buffer_create_dynamic(default_pool, 128);
	const char *error;
	unsigned int i;

	i_zero(&rec);
	rec.pack_id = 7;
	rec.offset = 123456789012ULL;
	rec.plain_size = 100000;
	rec.frame_size = CASBOX_FRAME_HEADER_SIZE + 2 * (8 + 1000);
	rec.dict_id = 3;
	rec.dek_kind = CAS_DEK_KIND_SERVER_WRAP;
	for (i = 0; i < CAS_WRAPPED_DEK_SIZE; i++)
		rec.wrapped_dek[i] = i;
	record_roundtrip(&rec, buf);
	ck_assert_uint_eq(buf->used, CASBOX_BLOB_RECORD_EXPORT_SIZE);
	((unsigned char *)buffer_get_modifiable_data(buf, NULL))[0] = 3;
	ck_assert_int_eq(casbox_blob_record_import(buf->data, buf->used,
						   &rec2, &error), -1);
	/* impossible frame size for the plain size */
	buffer_set_used_size(buf, 0);
	rec.frame_size = 10;
	casbox_blob_record_export(&rec, buf);
	ck_assert_int_eq(casbox_blob_record_import(buf->data, buf->used,
						   &rec2, &error), -1);
	buffer_free(&buf);
}
END_TEST

START_TEST(test_rotation)
{
	struct casbox_pack_store *store = store_open_with(keyring, 100000);
	buffer_t *blobs[12];
	struct cas_blob_id ids[12];
	struct casbox_blob_record recs[12];
	unsigned int i;

	pattern_blobs(blobs, N_ELEMENTS(blobs), 30000, 100);
	add_blobs(store, (const buffer_t *const *)blobs, 6, ids, recs);
	add_blobs(store, (const buffer_t *const *)blobs + 6, 6, ids + 6,
		  recs + 6);
	ck_assert_uint_gt(recs[11].pack_id, 1);
	for (i = 0; i < N_ELEMENTS(blobs); i++) {
		assert_blob(store, &ids[i], &recs[i], blobs[i]);
		buffer_free(&blobs[i]);
	}
	casbox_pack_store_close(&store);
}
END_TEST

/* casbox_pack_store_keep_read_fd(): the fd of the last pack a blob
   stream closed serves the next read of the same pack (seen here by
   moving the file away: the read still works), until released (then the
   read opens the path again and fails). Without it, the move fails the
   read at once. */
START_TEST(test_kept_read_fd)
{
	struct casbox_pack_store *store = store_open();
	buffer_t *blobs[1], *out = buffer_create_dynamic(default_pool, 1024);
	struct cas_blob_id ids[1];
	struct casbox_blob_record recs[1];
	const char *path, *moved;

	pattern_blobs(blobs, 1, 20000, 7);
	add_blobs(store, (const buffer_t *const *)blobs, 1, ids, recs);
	path = t_strdup_printf("%s/packs/pack-%08u.cbp", tmpdir,
			       recs[0].pack_id);
	moved = t_strconcat(path, ".moved", NULL);
	assert_blob(store, &ids[0], &recs[0], blobs[0]);
	ck_assert_int_eq(rename(path, moved), 0);
	ck_assert_int_eq(read_blob(store, &ids[0], &recs[0], out), -1);
	ck_assert_int_eq(rename(moved, path), 0);

	casbox_pack_store_keep_read_fd(store);
	assert_blob(store, &ids[0], &recs[0], blobs[0]);
	ck_assert_int_eq(rename(path, moved), 0);
	assert_blob(store, &ids[0], &recs[0], blobs[0]);
	assert_blob(store, &ids[0], &recs[0], blobs[0]);
	casbox_pack_store_release_read_fd(store);
	ck_assert_int_eq(read_blob(store, &ids[0], &recs[0], out), -1);
	ck_assert_int_eq(rename(moved, path), 0);
	assert_blob(store, &ids[0], &recs[0], blobs[0]);
	/* the close releases the kept fd (no fd leak under valgrind's
	   --track-fds) */
	casbox_pack_store_close(&store);
	buffer_free(&blobs[0]);
	buffer_free(&out);
}
END_TEST

/* A long-lived store (an IMAP session) appends after another process
   rotated and gc deleted packs: it must append to the newest pack, not
   walk on from the one it last used. Before, with packs 1 and 2 gone
   it failed every later save (ENOENT on pack 1); with only pack 2 gone
   it appended to pack 1, an old pack a running gc may delete. */
START_TEST(test_newest_pack_after_gc)
{
	struct casbox_pack_store *session = store_open_with(keyring, 40000);
	struct casbox_pack_store *other = store_open_with(keyring, 40000);
	buffer_t *blobs[10];
	struct cas_blob_id ids[10];
	struct casbox_blob_record recs[10];
	unsigned int i;

	pattern_blobs(blobs, N_ELEMENTS(blobs), 30000, 200);
	add_blobs(session, (const buffer_t *const *)blobs, 1, ids, recs);
	ck_assert_uint_eq(recs[0].pack_id, 1);
	/* another process fills packs on to pack 3 or later */
	for (i = 1; i <= 6; i++) {
		add_blobs(other, (const buffer_t *const *)blobs + i, 1,
			  ids + i, recs + i);
	}
	ck_assert_uint_ge(recs[6].pack_id, 3);
	/* gc deletes pack 2: the session must not go back to pack 1 */
	ck_assert_int_eq(unlink(t_strdup_printf("%s/packs/pack-00000002.cbp",
						tmpdir)), 0);
	add_blobs(session, (const buffer_t *const *)blobs + 7, 1, ids + 7,
		  recs + 7);
	ck_assert_uint_eq(recs[7].pack_id, recs[6].pack_id);
	/* gc deletes pack 1 too: no ENOENT */
	ck_assert_int_eq(unlink(t_strdup_printf("%s/packs/pack-00000001.cbp",
						tmpdir)), 0);
	add_blobs(session, (const buffer_t *const *)blobs + 8, 2, ids + 8,
		  recs + 8);
	ck_assert_uint_ge(recs[8].pack_id, recs[6].pack_id);
	for (i = 7; i < N_ELEMENTS(blobs); i++)
		assert_blob(session, &ids[i], &recs[i], blobs[i]);
	for (i = 0; i < N_ELEMENTS(blobs); i++)
		buffer_free(&blobs[i]);
	casbox_pack_store_close(&session);
	casbox_pack_store_close(&other);
}
END_TEST

struct scan_result {
	/* unfinished: damaged ones a crashed append left (zero header) */
	unsigned int intact, damaged, unfinished;
	bool found[8];
};

static void
scan_all(struct casbox_pack_store *store, const struct cas_blob_id *ids,
	 unsigned int count, struct scan_result *res_r)
{
	struct casbox_pack_scan *scan = casbox_pack_scan_init(store);
	struct casbox_pack_frame_info info;
	const char *error;
	unsigned int i;

	i_zero(res_r);
	while (casbox_pack_scan_next(scan, &info)) {
		if (info.damage != NULL) {
			res_r->damaged++;
			if (info.unfinished)
				res_r->unfinished++;
			continue;
		}
		ck_assert(!info.unfinished);
		res_r->intact++;
		for (i = 0; i < count; i++) {
			if (memcmp(info.id.id, ids[i].id,
				   CAS_BLOB_ID_SIZE) == 0)
				res_r->found[i] = TRUE;
		}
	}
	ck_assert_int_eq(casbox_pack_scan_deinit(&scan, &error), 0);
}

START_TEST(test_scan_resync)
{
	struct casbox_pack_store *store = store_open();
	buffer_t *blobs[5];
	struct cas_blob_id ids[5];
	struct casbox_blob_record recs[5];
	struct scan_result res;
	unsigned char old;
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(blobs); i++)
		blobs[i] = pattern_blob(i == 2 ? 150000 : 2000 + i, 200 + i);
	add_blobs(store, (const buffer_t *const *)blobs, 5, ids, recs);

	scan_all(store, ids, 5, &res);
	ck_assert_uint_eq(res.intact, 5);
	ck_assert_uint_eq(res.damaged, 0);

	/* header of frame 1: resync finds 2, 3, 4 */
	pack_poke(&recs[1], 10, 0xff, &old);
	scan_all(store, ids, 5, &res);
	ck_assert_uint_eq(res.intact, 4);
	ck_assert_uint_eq(res.damaged, 1);
	/* a damaged header is damage, not a crashed append */
	ck_assert_uint_eq(res.unfinished, 0);
	ck_assert(res.found[0] && !res.found[1] && res.found[2] &&
		  res.found[3] && res.found[4]);
	pack_poke(&recs[1], 10, 0xff, &old);

	/* a chunk byte in the large frame 2: header intact, size trusted */
	pack_poke(&recs[2], 70000, 0x01, &old);
	scan_all(store, ids, 5, &res);
	ck_assert_uint_eq(res.intact, 4);
	ck_assert_uint_eq(res.damaged, 1);
	ck_assert(!res.found[2] && res.found[3] && res.found[4]);

	/* and the magic of frame 3 too */
	pack_poke(&recs[3], 0, 0xff, &old);
	scan_all(store, ids, 5, &res);
	ck_assert_uint_eq(res.intact, 3);
	ck_assert(res.found[0] && res.found[1] && res.found[4]);

	/* a torn tail */
	pack_truncate(&recs[4], recs[4].frame_size - 3);
	scan_all(store, ids, 5, &res);
	ck_assert_uint_eq(res.intact, 2);
	ck_assert(!res.found[4]);
	for (i = 0; i < N_ELEMENTS(blobs); i++)
		buffer_free(&blobs[i]);
	casbox_pack_store_close(&store);
}
END_TEST

/* the header block: up to the first empty line, at most 4 KiB */
static size_t header_len(const buffer_t *buf)
{
	const unsigned char *p = buf->data;
	size_t i;

	for (i = 0; i + 1 < buf->used && i < 4096; i++) {
		if (p[i] == '\n' && (p[i + 1] == '\n' ||
				     (p[i + 1] == '\r' && i + 2 < buf->used &&
				      p[i + 2] == '\n')))
			return i + 1;
	}
	return I_MIN(buf->used, 4096);
}

/* Each file of paths read whole (bufs_r), with its header block as a
   dictionary sample (samples_r, sizes_r); all from the data stack. */
static void read_samples(const ARRAY_TYPE(const_string) *paths,
			 buffer_t ***bufs_r, const void ***samples_r,
			 size_t **sizes_r)
{
	unsigned int i, count = array_count(paths);
	const char *const *path;

	*samples_r = t_new(const void *, count);
	*sizes_r = t_new(size_t, count);
	*bufs_r = t_new(buffer_t *, count);
	i = 0;
	array_foreach(paths, path) {
		(*bufs_r)[i] = read_path(*path);
		(*samples_r)[i] = (*bufs_r)[i]->data;
		(*sizes_r)[i] = header_len((*bufs_r)[i]);
		i++;
	}
}

START_TEST(test_dictionary)
{
	ARRAY_TYPE(const_string) paths;
	struct casbox_pack_store *store = store_open(), *other;
	const void **samples;
	size_t *sizes;
	buffer_t **bufs, *small, *small2, *big, *out;
	struct casbox_blob_record rec, rec2, rec3;
	struct cas_blob_id id, id2, id3;
	const char *error;
	unsigned int i, count;
	uint32_t dict_id;

	t_array_init(&paths, 512);
	count = corpus_files("usrp-users-3000", 5, &paths);
	/* open before the dictionary exists (another process's store) */
	other = store_open();
	read_samples(&paths, &bufs, &samples, &sizes);
	ck_assert_uint_eq(casbox_pack_dict_current(store), 0);
	ck_assert_int_eq(casbox_pack_dict_train(store, samples, sizes, count,
						&dict_id, &error), 1);
	ck_assert_uint_eq(dict_id, 1);
	ck_assert_uint_eq(casbox_pack_dict_current(store), 1);

	small = buffer_create_dynamic(default_pool, 4096);
	buffer_append(small, bufs[1]->data, I_MIN(bufs[1]->used, 3000));
	add_blobs(store, (const buffer_t *const *)&small, 1, &id, &rec);
	ck_assert_uint_eq(rec.dict_id, dict_id);
	assert_blob(store, &id, &rec, small);
	/* a store opened before it was written uses it from its next
	   append on (the append lists the directory), and reads it */
	small2 = buffer_create_dynamic(default_pool, 4096);
	buffer_append(small2, bufs[2]->data, I_MIN(bufs[2]->used, 2500));
	add_blobs(other, (const buffer_t *const *)&small2, 1, &id3, &rec3);
	ck_assert_uint_eq(rec3.dict_id, dict_id);
	assert_blob(other, &id3, &rec3, small2);
	assert_blob(other, &id, &rec, small);
	casbox_pack_store_close(&other);
	/* large blobs do not use it */
	big = pattern_blob(40000, 11);
	add_blobs(store, (const buffer_t *const *)&big, 1, &id2, &rec2);
	ck_assert_uint_eq(rec2.dict_id, 0);
	casbox_pack_store_close(&store);

	/* reopened: loaded from the sealed file */
	store = store_open();
	assert_blob(store, &id, &rec, small);
	assert_blob(store, &id2, &rec2, big);
	casbox_pack_store_close(&store);

	/* dictionary damaged, then gone: clean error */
	out = buffer_create_dynamic(default_pool, 1024);
	{
		const char *dpath = t_strdup_printf(
			"%s/packs/dict-00000001.cbd", tmpdir);
		int fd = open(dpath, O_RDWR);
		unsigned char c;

		ck_assert_int_ne(fd, -1);
		ck_assert_int_eq(pread(fd, &c, 1, 100), 1);
		c ^= 1;
		ck_assert_int_eq(pwrite(fd, &c, 1, 100), 1);
		store = store_open();
		ck_assert_int_eq(read_blob(store, &id, &rec, out), -1);
		/* blobs without the dictionary are unaffected */
		assert_blob(store, &id2, &rec2, big);
		casbox_pack_store_close(&store);
		c ^= 1;
		ck_assert_int_eq(pwrite(fd, &c, 1, 100), 1);
		ck_assert_int_eq(close(fd), 0);
	}
	ck_assert_int_eq(rename(t_strdup_printf("%s/packs/dict-00000001.cbd",
						tmpdir),
				t_strdup_printf("%s/d", tmpdir)), 0);
	store = store_open();
	ck_assert_int_eq(read_blob(store, &id, &rec, out), -1);
	casbox_pack_store_close(&store);
	buffer_free(&out);
	buffer_free(&small);
	buffer_free(&small2);
	buffer_free(&big);
	for (i = 0; i < count; i++)
		buffer_free(&bufs[i]);
}
END_TEST

/* A blob stream keeps its dictionary while the store loads others: a
   reader whose next frame names dictionaries trained since (by another
   process) loads them all, and a stream it opened before still decodes
   after a seek back (the dictionaries were an array of structs, which
   grew under the stream's pointer: valgrind/ASan saw the use after
   free). */
static buffer_t *read_stream_all(struct istream *input)
{
	buffer_t *out = buffer_create_dynamic(default_pool, 4096);
	const unsigned char *data;
	size_t size;

	while (i_stream_read_more(input, &data, &size) > 0) {
		buffer_append(out, data, size);
		i_stream_skip(input, size);
	}
	ck_assert_int_eq(input->stream_errno, 0);
	return out;
}

START_TEST(test_dictionary_added_while_reading)
{
	ARRAY_TYPE(const_string) paths;
	struct casbox_pack_store *reader = store_open(), *writer;
	struct casbox_blob_record rec, rec2;
	struct cas_blob_id id, id2;
	const char *error;
	const void **samples;
	size_t *sizes;
	buffer_t **bufs, *small, *small2, *out;
	struct istream *input, *input2;
	unsigned int i, count;
	uint32_t dict_id;

	t_array_init(&paths, 512);
	count = corpus_files("usrp-users-3000", 5, &paths);
	read_samples(&paths, &bufs, &samples, &sizes);
	writer = store_open();
	ck_assert_int_eq(casbox_pack_dict_train(writer, samples, sizes, count,
						&dict_id, &error), 1);
	small = buffer_create_dynamic(default_pool, 4096);
	buffer_append(small, bufs[1]->data, I_MIN(bufs[1]->used, 3000));
	add_blobs(writer, (const buffer_t *const *)&small, 1, &id, &rec);
	ck_assert_uint_eq(rec.dict_id, dict_id);
	input = casbox_pack_blob_open(reader, &id, &rec);
	out = read_stream_all(input);
	ck_assert(buffer_cmp(out, small));
	buffer_free(&out);
	/* more dictionaries than the reader's array had room for */
	for (i = 0; i < 6; i++) {
		ck_assert_int_eq(casbox_pack_dict_train(writer, samples, sizes,
							count, &dict_id,
							&error), 1);
	}
	small2 = buffer_create_dynamic(default_pool, 4096);
	buffer_append(small2, bufs[2]->data, I_MIN(bufs[2]->used, 2500));
	add_blobs(writer, (const buffer_t *const *)&small2, 1, &id2, &rec2);
	ck_assert_uint_eq(rec2.dict_id, dict_id);
	input2 = casbox_pack_blob_open(reader, &id2, &rec2);
	out = read_stream_all(input2);
	ck_assert(buffer_cmp(out, small2));
	buffer_free(&out);
	/* the first stream decodes its chunk again */
	i_stream_seek(input, 0);
	out = read_stream_all(input);
	ck_assert(buffer_cmp(out, small));
	buffer_free(&out);
	/* a store that only read made no compression dictionary; the
	   writer made one of the dictionary it compressed with */
	ck_assert_uint_eq(array_count(&reader->dicts), 7);
	for (i = 0; i < array_count(&reader->dicts); i++) {
		const struct casbox_pack_dict *d =
			array_idx_elem(&reader->dicts, i);

		ck_assert_ptr_null(d->cdict);
		ck_assert_ptr_null(d->error);
	}
	ck_assert_ptr_nonnull(((const struct casbox_pack_dict *)
			       casbox_pack_dict_lookup(writer,
						       dict_id))->cdict);
	i_stream_unref(&input);
	i_stream_unref(&input2);
	casbox_pack_store_close(&writer);
	casbox_pack_store_close(&reader);
	buffer_free(&small);
	buffer_free(&small2);
	for (i = 0; i < count; i++)
		buffer_free(&bufs[i]);
}
END_TEST

START_TEST(test_small_reads)
{
	/* an input that delivers a few bytes per read, across chunks */
	struct casbox_pack_store *store = store_open();
	buffer_t *blob = pattern_blob(150000, 9);
	const char *path = t_strdup_printf("%s/input", tmpdir), *error;
	struct casbox_pack_txn *txn;
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	struct istream *input;
	FILE *f = fopen(path, "w");

	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(blob->data, 1, blob->used, f), blob->used);
	ck_assert_int_eq(fclose(f), 0);
	cas_blob_id_compute(keyring, blob->data, blob->used, &id);
	input = i_stream_create_file(path, 7);
	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	ck_assert_int_eq(casbox_pack_txn_add(txn, &id, input, &rec, &error),
			 1);
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
	i_stream_unref(&input);
	assert_blob(store, &id, &rec, blob);
	buffer_free(&blob);
	casbox_pack_store_close(&store);
}
END_TEST

#define CONCURRENT_CHILDREN 3
#define CONCURRENT_BLOBS 15

START_TEST(test_concurrent_appends)
{
	/* several processes append to one store at once: the lock must
	   keep every frame whole */
	struct casbox_pack_store *store;
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	struct scan_result res;
	buffer_t *blob, *buf;
	const char *error;
	unsigned int c, i, n = 0;
	int fds[2], status;
	pid_t pids[CONCURRENT_CHILDREN];
	ssize_t ret;

	ck_assert_int_eq(pipe(fds), 0);
	for (c = 0; c < CONCURRENT_CHILDREN; c++) {
		pids[c] = fork();
		ck_assert_int_ne(pids[c], -1);
		if (pids[c] != 0)
			continue;
		/* child: small max pack size, so rotation races too */
		i_close_fd(&fds[0]);
		store = store_open_with(keyring, 200000);
		for (i = 0; i < CONCURRENT_BLOBS; i++) T_BEGIN {
			blob = pattern_blob(20000 + c * 1000 + i, c * 100 + i);
			add_blobs(store, (const buffer_t *const *)&blob, 1,
				  &id, &rec);
			buf = t_buffer_create(256);
			buffer_append(buf, &c, sizeof(c));
			buffer_append(buf, &i, sizeof(i));
			casbox_blob_record_export(&rec, buf);
			if (write(fds[1], buf->data, buf->used) !=
			    (ssize_t)buf->used)
				_exit(2);
			buffer_free(&blob);
		} T_END;
		casbox_pack_store_close(&store);
		_exit(0);
	}
	i_close_fd(&fds[1]);
	store = store_open();
	buf = buffer_create_dynamic(default_pool, 256);
	for (;;) {
		unsigned char rbuf[8 + CASBOX_BLOB_RECORD_EXPORT_SIZE];

		ret = read(fds[0], rbuf, sizeof(rbuf));
		if (ret == 0)
			break;
		ck_assert_int_eq(ret, sizeof(rbuf));
		memcpy(&c, rbuf, sizeof(c));
		memcpy(&i, rbuf + 4, sizeof(i));
		ck_assert_int_eq(casbox_blob_record_import(rbuf + 8,
			CASBOX_BLOB_RECORD_EXPORT_SIZE, &rec, &error), 1);
		blob = pattern_blob(20000 + c * 1000 + i, c * 100 + i);
		cas_blob_id_compute(keyring, blob->data, blob->used, &id);
		assert_blob(store, &id, &rec, blob);
		buffer_free(&blob);
		n++;
	}
	for (c = 0; c < CONCURRENT_CHILDREN; c++) {
		ck_assert_int_eq(waitpid(pids[c], &status, 0), pids[c]);
		ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	ck_assert_uint_eq(n, CONCURRENT_CHILDREN * CONCURRENT_BLOBS);
	scan_all(store, &id, 1, &res);
	ck_assert_uint_eq(res.intact, n);
	ck_assert_uint_eq(res.damaged, 0);
	i_close_fd(&fds[0]);
	buffer_free(&buf);
	casbox_pack_store_close(&store);
}
END_TEST

START_TEST(test_crash_without_commit)
{
	/* a process dies holding the lock mid-transaction: the lock goes
	   with it, committed blobs stay readable, the next writer appends */
	struct casbox_pack_store *store = store_open();
	buffer_t *blobs[2];
	struct cas_blob_id ids[2];
	struct casbox_blob_record recs[2];
	struct scan_result res;
	struct casbox_pack_txn *txn;
	struct istream *input;
	const char *error;
	int status;
	pid_t pid;

	blobs[0] = pattern_blob(5000, 1);
	blobs[1] = pattern_blob(90000, 2);
	add_blobs(store, (const buffer_t *const *)blobs, 1, ids, recs);
	pid = fork();
	ck_assert_int_ne(pid, -1);
	if (pid == 0) {
		buffer_t *b = pattern_blob(100000, 3);
		struct casbox_blob_record rec;
		struct cas_blob_id id;

		if (casbox_pack_txn_begin(store, &txn, &error) < 0)
			_exit(2);
		cas_blob_id_compute(keyring, b->data, b->used, &id);
		input = i_stream_create_from_data(b->data, b->used);
		if (casbox_pack_txn_add(txn, &id, input, &rec, &error) < 0)
			_exit(3);
		/* and a torn frame after it: chunks written, no header */
		if (pwrite(open(t_strdup_printf("%s/packs/pack-00000001.cbp",
						tmpdir), O_WRONLY),
			   "garbage", 7,
			   rec.offset + rec.frame_size + 100) != 7)
			_exit(4);
		kill(getpid(), SIGKILL);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	add_blobs(store, (const buffer_t *const *)blobs + 1, 1, ids + 1,
		  recs + 1);
	assert_blob(store, &ids[0], &recs[0], blobs[0]);
	assert_blob(store, &ids[1], &recs[1], blobs[1]);
	scan_all(store, ids, 2, &res);
	ck_assert(res.found[0] && res.found[1]);
	/* the uncommitted but complete frame is intact garbage for gc; the
	   torn bytes are reported as damage, marked as an append that was
	   never finished (its header was never written) even though a later
	   append follows it */
	ck_assert_uint_eq(res.intact, 3);
	ck_assert_uint_eq(res.damaged, 1);
	ck_assert_uint_eq(res.unfinished, 1);
	buffer_free(&blobs[0]);
	buffer_free(&blobs[1]);
	casbox_pack_store_close(&store);
}
END_TEST

/* Read input from its current offset to EOF, comparing with expected. */
static void read_rest(struct istream *input, const buffer_t *expected)
{
	const unsigned char *data;
	size_t size;

	while (i_stream_read_more(input, &data, &size) > 0) {
		ck_assert_uint_le(input->v_offset + size, expected->used);
		ck_assert(memcmp(data, CONST_PTR_OFFSET(expected->data,
					input->v_offset), size) == 0);
		i_stream_skip(input, size);
	}
	ck_assert_int_eq(input->stream_errno, 0);
	ck_assert_uint_eq(input->v_offset, expected->used);
}

START_TEST(test_scratch_reuse)
{
	/* streams hand their decode buffers back to the store at EOF and
	   take them again on a later seek: interleaved streams must never
	   see each other's chunks */
	static const size_t sizes[] = { 150000, 70000, 5 };
	struct casbox_pack_store *store = store_open();
	buffer_t *blobs[N_ELEMENTS(sizes)];
	struct cas_blob_id ids[N_ELEMENTS(sizes)];
	struct casbox_blob_record recs[N_ELEMENTS(sizes)];
	struct istream *in[N_ELEMENTS(sizes)];
	unsigned int i, round;

	for (i = 0; i < N_ELEMENTS(sizes); i++)
		blobs[i] = pattern_blob(sizes[i], 70 + i);
	add_blobs(store, (const buffer_t *const *)blobs, N_ELEMENTS(sizes),
		  ids, recs);
	for (i = 0; i < N_ELEMENTS(sizes); i++)
		in[i] = casbox_pack_blob_open(store, &ids[i], &recs[i]);
	for (round = 0; round < 3; round++) {
		/* 0 half-way (holds a scratch), then 1 and 2 to EOF, then
		   0 to EOF and everything again from chunk starts */
		i_stream_seek(in[0], round * 65536);
		ck_assert_int_ge(i_stream_read(in[0]), 1);
		for (i = 1; i < N_ELEMENTS(sizes); i++) {
			i_stream_seek(in[i], 0);
			read_rest(in[i], blobs[i]);
		}
		read_rest(in[0], blobs[0]);
		i_stream_seek(in[1], sizes[1] - 3);
		read_rest(in[1], blobs[1]);
	}
	for (i = 0; i < N_ELEMENTS(sizes); i++) {
		i_stream_unref(&in[i]);
		buffer_free(&blobs[i]);
	}
	casbox_pack_store_close(&store);
}
END_TEST

/* FETCH BODY[] reads a message to its known size and never asks for
   EOF: the stream must hand its scratch back at the last byte, or every
   blob costs a sodium_malloc()/sodium_free() pair. */
static void read_exactly(struct istream *input, const buffer_t *expected)
{
	const unsigned char *data;
	size_t size;

	while (input->v_offset < expected->used) {
		ck_assert_int_gt(i_stream_read_more(input, &data, &size), 0);
		size = I_MIN(size, expected->used - input->v_offset);
		ck_assert(memcmp(data, CONST_PTR_OFFSET(expected->data,
					input->v_offset), size) == 0);
		i_stream_skip(input, size);
	}
}

START_TEST(test_scratch_back_at_last_byte)
{
	static const size_t sizes[] = { 5000, 140000 };
	struct casbox_pack_store *store = store_open();
	buffer_t *blobs[N_ELEMENTS(sizes)];
	struct cas_blob_id ids[N_ELEMENTS(sizes)];
	struct casbox_blob_record recs[N_ELEMENTS(sizes)];
	struct istream *in[N_ELEMENTS(sizes)];
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(sizes); i++)
		blobs[i] = pattern_blob(sizes[i], 90 + i);
	add_blobs(store, (const buffer_t *const *)blobs, N_ELEMENTS(sizes),
		  ids, recs);
	casbox_blob_scratch_free_all(store);
	for (i = 0; i < N_ELEMENTS(sizes); i++) {
		in[i] = casbox_pack_blob_open(store, &ids[i], &recs[i]);
		read_exactly(in[i], blobs[i]);
		/* back in the store, and the second stream reused it */
		ck_assert_uint_eq(store->free_scratch_count, 1);
	}
	/* a seek back decodes again, and gives it back again */
	i_stream_seek(in[1], 1000);
	read_exactly(in[1], blobs[1]);
	ck_assert_uint_eq(store->free_scratch_count, 1);
	for (i = 0; i < N_ELEMENTS(sizes); i++) {
		i_stream_unref(&in[i]);
		buffer_free(&blobs[i]);
	}
	ck_assert_uint_eq(store->free_scratch_count, 1);
	casbox_pack_store_close(&store);
}
END_TEST

/* A frame small enough to be read whole at open, with several chunks:
   the first read may land in any of them. */
START_TEST(test_small_multichunk_frame)
{
	static const char line[] = "The quick brown fox jumps\r\n";
	struct casbox_pack_store *store = store_open();
	buffer_t *blob = buffer_create_dynamic(default_pool, 200100);
	struct cas_blob_id id;
	struct casbox_blob_record rec;
	struct istream *input;
	uoff_t start;

	while (blob->used < 200000)
		buffer_append(blob, line, sizeof(line) - 1);
	add_blobs(store, (const buffer_t *const *)&blob, 1, &id, &rec);
	/* four chunks, compressed far below one chunk */
	ck_assert_uint_lt(rec.frame_size, CASBOX_CHUNK_SIZE);
	for (start = 0; start < blob->used; start += 65536 + 777) {
		input = casbox_pack_blob_open(store, &id, &rec);
		i_stream_seek(input, blob->used - 5 - start);
		read_rest(input, blob);
		i_stream_seek(input, 0);
		read_rest(input, blob);
		i_stream_unref(&input);
	}
	buffer_free(&blob);
	casbox_pack_store_close(&store);
}
END_TEST

START_TEST(test_concat_of_blobs)
{
	/* the glue reassembles a message from part blobs with Dovecot's
	   concat and range streams: sizes, seeks and reads must agree */
	static const size_t sizes[] = { 700, 0, 140000, 65536, 33 };
	struct casbox_pack_store *store = store_open();
	buffer_t *blobs[N_ELEMENTS(sizes)], *whole;
	struct cas_blob_id ids[N_ELEMENTS(sizes)];
	struct casbox_blob_record recs[N_ELEMENTS(sizes)];
	struct istream *parts[N_ELEMENTS(sizes) + 1], *concat, *range;
	const unsigned char *data;
	size_t size;
	uoff_t off, total;
	unsigned int i;

	whole = buffer_create_dynamic(default_pool, 256 * 1024);
	for (i = 0; i < N_ELEMENTS(sizes); i++) {
		blobs[i] = pattern_blob(sizes[i], 40 + i);
		buffer_append_buf(whole, blobs[i], 0, SIZE_MAX);
	}
	add_blobs(store, (const buffer_t *const *)blobs, N_ELEMENTS(sizes),
		  ids, recs);
	for (i = 0; i < N_ELEMENTS(sizes); i++)
		parts[i] = casbox_pack_blob_open(store, &ids[i], &recs[i]);
	parts[i] = NULL;
	concat = i_stream_create_concat(parts);
	for (i = 0; i < N_ELEMENTS(sizes); i++)
		i_stream_unref(&parts[i]);
	ck_assert_int_eq(i_stream_get_size(concat, TRUE, &total), 1);
	ck_assert_uint_eq(total, whole->used);
	for (i = 0; i < 60; i++) {
		off = ((uint64_t)i * 104729) % whole->used;
		i_stream_seek(concat, off);
		ck_assert_int_ge(i_stream_read_more(concat, &data, &size), 1);
		size = I_MIN(size, 300);
		ck_assert(memcmp(data, CONST_PTR_OFFSET(whole->data, off),
				 size) == 0);
	}
	/* a range across two part boundaries, read to the end */
	range = i_stream_create_range(concat, 600, 70000);
	off = 600;
	while (i_stream_read_more(range, &data, &size) > 0) {
		ck_assert(memcmp(data, CONST_PTR_OFFSET(whole->data, off),
				 size) == 0);
		off += size;
		i_stream_skip(range, size);
	}
	ck_assert_int_eq(range->stream_errno, 0);
	ck_assert_uint_eq(off, 600 + 70000);
	i_stream_unref(&range);
	i_stream_unref(&concat);
	for (i = 0; i < N_ELEMENTS(sizes); i++)
		buffer_free(&blobs[i]);
	buffer_free(&whole);
	casbox_pack_store_close(&store);
}
END_TEST

/* The fuzz seeds are record | pack images written by the v1 writer with
   the fuzz key (0x42...). Decoding them pins the on-disk format: a
   change that breaks reading old packs fails here. */
static void golden_check(const char *name, const buffer_t *expected)
{
	const char *top = getenv("CASBOX_TOP_SRCDIR");
	struct cas_keyring *k = test_keyring(0x42);
	struct casbox_pack_store *store;
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	buffer_t *seed, *out;
	const char *error;
	FILE *f;

	seed = read_path(t_strdup_printf("%s/tests/fuzz/corpus/pack/%s",
					 top == NULL ? CASBOX_SRCDIR : top,
					 name));
	/* the seeds hold version 1 records (before the DEK kind byte):
	   they must still decode, as a server-wrapped DEK */
	ck_assert_uint_gt(seed->used, CASBOX_BLOB_RECORD_V1_SIZE);
	ck_assert_uint_eq(((const unsigned char *)seed->data)[0], 1);
	ck_assert_int_eq(casbox_blob_record_import(seed->data,
		CASBOX_BLOB_RECORD_V1_SIZE, &rec, &error), 1);
	ck_assert_uint_eq(rec.dek_kind, CAS_DEK_KIND_SERVER_WRAP);
	store = store_open_with(k, 0);
	f = fopen(t_strdup_printf("%s/packs/pack-%08u.cbp", tmpdir,
				  rec.pack_id), "w");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(CONST_PTR_OFFSET(seed->data,
			CASBOX_BLOB_RECORD_V1_SIZE), 1,
			seed->used - CASBOX_BLOB_RECORD_V1_SIZE, f),
		seed->used - CASBOX_BLOB_RECORD_V1_SIZE);
	ck_assert_int_eq(fclose(f), 0);
	cas_blob_id_compute(k, expected->data, expected->used, &id);
	out = buffer_create_dynamic(default_pool, 1024);
	ck_assert_int_eq(read_blob(store, &id, &rec, out), 0);
	ck_assert_uint_eq(out->used, expected->used);
	ck_assert(memcmp(out->data, expected->data, out->used) == 0);
	buffer_free(&out);
	buffer_free(&seed);
	casbox_pack_store_close(&store);
	cas_keyring_free(&k);
}

START_TEST(test_golden_v1)
{
	buffer_t *expected = buffer_create_dynamic(default_pool, 70000);
	unsigned int i;

	buffer_append(expected, "Subject: hello\r\n\r\nworld\r\n", 25);
	golden_check("small", expected);
	golden_check("three-frames", expected);
	buffer_set_used_size(expected, 0);
	golden_check("empty", expected);
	for (i = 0; i < 70000; i++)
		buffer_append_c(expected, "casbox \r\n"[(i * 7 + i / 13) % 9]);
	golden_check("two-chunks", expected);
	buffer_free(&expected);
}
END_TEST


/* One blob, then a meta frame of kind with plain; returns the meta
   frame's location from the scan. */
static void
add_blob_and_meta(struct casbox_pack_store *store, enum casbox_meta_kind kind,
		  const buffer_t *plain, struct cas_blob_id *id_r,
		  struct casbox_blob_record *rec_r,
		  struct casbox_pack_frame_info *meta_r)
{
	buffer_t *blob = pattern_blob(3000, 17);
	struct casbox_pack_txn *txn;
	struct casbox_pack_scan *scan;
	struct casbox_pack_frame_info info;
	struct istream *input;
	const char *error;
	unsigned int n = 0;

	cas_blob_id_compute(keyring, blob->data, blob->used, id_r);
	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	input = i_stream_create_from_data(blob->data, blob->used);
	ck_assert_int_eq(casbox_pack_txn_add(txn, id_r, input, rec_r,
					     &error), 1);
	i_stream_unref(&input);
	ck_assert_int_eq(casbox_pack_txn_add_meta(txn, kind, plain->data,
						  plain->used, &error), 1);
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
	buffer_free(&blob);

	scan = casbox_pack_scan_init(store);
	i_zero(meta_r);
	while (casbox_pack_scan_next(scan, &info)) {
		ck_assert_ptr_null(info.damage);
		if (n++ == 0) {
			ck_assert_int_eq(info.meta_kind,
					 CASBOX_META_KIND_NONE);
			ck_assert(memcmp(info.id.id, id_r->id,
					 CAS_BLOB_ID_SIZE) == 0);
			/* frame version 2: the size is not in the clear */
			ck_assert_uint_eq(info.frame_version,
					  CASBOX_FRAME_VERSION);
			ck_assert_uint_eq(info.plain_size, 0);
		} else {
			ck_assert_int_eq(info.meta_kind, kind);
			*meta_r = info;
		}
	}
	ck_assert_int_eq(casbox_pack_scan_deinit(&scan, &error), 0);
	ck_assert_uint_eq(n, 2);
}

/* 1 if the meta frame at meta reads and opens to plain, else 0. */
static int meta_reads(struct casbox_pack_store *store,
		      const struct casbox_pack_frame_info *meta,
		      const buffer_t *plain, const char **error_r)
{
	buffer_t *sealed = t_buffer_create(256), *out = t_buffer_create(256);
	enum casbox_meta_kind kind;

	if (casbox_pack_meta_read(store, meta->pack_id, meta->offset, &kind,
				  sealed, error_r) < 0 ||
	    casbox_pack_meta_open(store, kind, sealed->data, sealed->used,
				  out, error_r) < 0)
		return 0;
	ck_assert_int_eq(kind, meta->meta_kind);
	ck_assert(buffer_cmp(out, plain));
	return 1;
}

/* The scan of the one pack: intact and damaged frame counts. */
static void scan_counts(struct casbox_pack_store *store,
			unsigned int *intact_r, unsigned int *damaged_r)
{
	struct casbox_pack_scan *scan = casbox_pack_scan_init(store);
	struct casbox_pack_frame_info info;
	const char *error;

	*intact_r = *damaged_r = 0;
	while (casbox_pack_scan_next(scan, &info)) {
		if (info.damage != NULL)
			(*damaged_r)++;
		else
			(*intact_r)++;
	}
	ck_assert_int_eq(casbox_pack_scan_deinit(&scan, &error), 0);
}

START_TEST(test_meta_frame_damage)
{
	static const unsigned char xors[] = { 0x01, 0x80, 0xff };
	struct casbox_pack_store *store = store_open();
	struct casbox_pack_frame_info meta;
	struct casbox_blob_record rec, mrec;
	struct cas_blob_id id;
	buffer_t *plain = buffer_create_dynamic(default_pool, 64);
	unsigned int i, x, intact, damaged;
	const char *error;
	unsigned char old;

	buffer_append(plain, "mailbox INBOX uid 7: a recovery record", 38);
	add_blob_and_meta(store, CASBOX_META_KIND_RECOVERY, plain, &id, &rec,
			  &meta);
	ck_assert_uint_eq(meta.frame_size, CASBOX_META_HEADER_SIZE +
			  CAS_AEAD_NONCE_SIZE + plain->used +
			  CAS_AEAD_TAG_SIZE);
	ck_assert_int_eq(meta_reads(store, &meta, plain, &error), 1);

	/* the body is sealed: no plaintext in the pack */
	i_zero(&mrec);
	mrec.pack_id = meta.pack_id;
	mrec.offset = meta.offset;
	for (i = 0; i < meta.frame_size; i++) {
		for (x = 0; x < N_ELEMENTS(xors); x++) T_BEGIN {
			pack_poke(&mrec, i, xors[x], &old);
			ck_assert_msg(meta_reads(store, &meta, plain,
						 &error) == 0,
				      "byte %u ^ %02x still read", i, xors[x]);
			ck_assert_ptr_nonnull(error);
			scan_counts(store, &intact, &damaged);
			/* the blob before it is still found */
			ck_assert_msg(intact == 1 && damaged == 1,
				      "byte %u: %u intact %u damaged",
				      i, intact, damaged);
			pack_poke(&mrec, i, xors[x], &old);
		} T_END;
	}
	ck_assert_int_eq(meta_reads(store, &meta, plain, &error), 1);

	/* every truncation of the meta frame, longest first */
	for (i = meta.frame_size; i-- > 0; ) T_BEGIN {
		pack_truncate(&mrec, i);
		ck_assert_int_eq(meta_reads(store, &meta, plain, &error), 0);
		scan_counts(store, &intact, &damaged);
		ck_assert_uint_eq(intact, 1);
		ck_assert_uint_eq(damaged, i == 0 ? 0 : 1);
	} T_END;
	buffer_free(&plain);
	casbox_pack_store_close(&store);
}
END_TEST

START_TEST(test_meta_sealed)
{
	struct casbox_pack_store *store = store_open(), *other;
	struct cas_keyring *k2 = test_keyring(2);
	struct casbox_pack_frame_info meta;
	struct casbox_blob_record rec, mrec;
	struct cas_blob_id id;
	buffer_t *plain = buffer_create_dynamic(default_pool, 64);
	buffer_t *sealed, *out, *pack;
	struct casbox_meta_header hdr;
	enum casbox_meta_kind kind;
	const char *error, *path;
	unsigned char hdr_buf[CASBOX_META_HEADER_SIZE];
	struct istream *input;
	size_t i;
	int fd;

	buffer_append(plain, "Subject: secret words", 21);
	add_blob_and_meta(store, CASBOX_META_KIND_RECOVERY, plain, &id, &rec,
			  &meta);
	path = t_strdup_printf("%s/packs/pack-%08u.cbp", tmpdir, meta.pack_id);
	pack = read_path(path);
	for (i = 0; i + 6 <= pack->used; i++) {
		ck_assert(memcmp(CONST_PTR_OFFSET(pack->data, i), "secret",
				 6) != 0);
	}

	sealed = buffer_create_dynamic(default_pool, 128);
	out = buffer_create_dynamic(default_pool, 128);
	ck_assert_int_eq(casbox_pack_meta_read(store, meta.pack_id,
			 meta.offset, &kind, sealed, &error), 1);
	/* the kind is authenticated */
	ck_assert_int_eq(casbox_pack_meta_open(store,
			 CASBOX_META_KIND_DEK_UPDATE, sealed->data,
			 sealed->used, out, &error), -1);
	/* another key opens nothing */
	other = store_open_with(k2, 0);
	ck_assert_int_eq(casbox_pack_meta_open(other, kind, sealed->data,
			 sealed->used, out, &error), -1);
	casbox_pack_store_close(&other);

	/* a body changed with its CRC fixed up: the seal still fails */
	((unsigned char *)buffer_get_modifiable_data(sealed, NULL))[30] ^= 0x04;
	i_zero(&hdr);
	hdr.kind = kind;
	hdr.frame_size = meta.frame_size;
	hdr.body_crc = cas_crc32c_mask(cas_crc32c(sealed->data, sealed->used));
	casbox_meta_header_write(&hdr, hdr_buf);
	fd = open(path, O_RDWR);
	ck_assert_int_ne(fd, -1);
	ck_assert_int_eq(pwrite(fd, hdr_buf, sizeof(hdr_buf), meta.offset),
			 (ssize_t)sizeof(hdr_buf));
	ck_assert_int_eq(pwrite(fd, sealed->data, sealed->used,
				meta.offset + CASBOX_META_HEADER_SIZE),
			 (ssize_t)sealed->used);
	ck_assert_int_eq(close(fd), 0);
	ck_assert_int_eq(meta_reads(store, &meta, plain, &error), 0);
	ck_assert_str_eq(error, "sealed record: authentication failed");

	/* a blob record pointing at a meta frame is never read as a blob */
	i_zero(&mrec);
	mrec = rec;
	mrec.offset = meta.offset;
	input = casbox_pack_blob_open(store, &id, &mrec);
	ck_assert_int_eq(i_stream_read(input), -1);
	ck_assert_int_eq(input->stream_errno, EIO);
	i_stream_unref(&input);

	buffer_free(&sealed);
	buffer_free(&out);
	buffer_free(&pack);
	buffer_free(&plain);
	cas_keyring_free(&k2);
	casbox_pack_store_close(&store);
}
END_TEST

START_TEST(test_dek_update)
{
	struct casbox_pack_store *store = store_open();
	struct casbox_pack_frame_info meta;
	struct casbox_blob_record rec, rec2;
	struct casbox_dek_update upd, upd2;
	struct cas_blob_id id;
	struct casbox_pack_txn *txn;
	buffer_t *plain, *sealed, *out, *blob;
	struct casbox_pack_scan *scan;
	struct casbox_pack_frame_info info;
	enum casbox_meta_kind kind;
	unsigned char dek[CAS_DEK_SIZE];
	const char *error;
	unsigned char *p;
	unsigned int i;

	/* codec: round trip, every truncation, version and DEK kind */
	i_zero(&upd);
	upd.written_usecs = 1234567890123456ULL;
	memset(upd.id.id, 0x5a, sizeof(upd.id.id));
	upd.dek_kind = CAS_DEK_KIND_SERVER_WRAP;
	memset(upd.wrapped_dek, 0xc3, sizeof(upd.wrapped_dek));
	plain = buffer_create_dynamic(default_pool, 128);
	casbox_dek_update_export(&upd, plain);
	ck_assert_uint_eq(plain->used, CASBOX_DEK_UPDATE_SIZE);
	ck_assert_int_eq(casbox_dek_update_import(plain->data, plain->used,
						  &upd2, &error), 1);
	ck_assert(memcmp(&upd, &upd2, sizeof(upd)) == 0);
	for (i = 0; i < plain->used; i++) {
		ck_assert_int_eq(casbox_dek_update_import(plain->data, i,
							  &upd2, &error), -1);
	}
	buffer_append_c(plain, 0);
	ck_assert_int_eq(casbox_dek_update_import(plain->data, plain->used,
						  &upd2, &error), -1);
	buffer_set_used_size(plain, CASBOX_DEK_UPDATE_SIZE);
	p = buffer_get_modifiable_data(plain, NULL);
	p[0] = 3;
	ck_assert_int_eq(casbox_dek_update_import(plain->data, plain->used,
						  &upd2, &error), -1);
	ck_assert_str_eq(error, "DEK update: unsupported version 3");
	/* version 2 holds sealed DEKs only */
	p[0] = 2;
	ck_assert_int_eq(casbox_dek_update_import(plain->data, plain->used,
						  &upd2, &error), -1);
	ck_assert_str_eq(error, "DEK update: unknown DEK kind 1 in a "
			 "version 2 update");
	p[0] = 1;
	p = buffer_get_modifiable_data(plain, NULL);
	p[9 + CAS_BLOB_ID_SIZE] = 2;
	ck_assert_int_eq(casbox_dek_update_import(plain->data, plain->used,
						  &upd2, &error), -1);
	ck_assert_str_eq(error, "DEK update: unknown DEK kind 2 in a "
			 "version 1 update");
	p[9 + CAS_BLOB_ID_SIZE] = 1;

	/* version 2: a sealed DEK, 174 bytes */
	upd.dek_kind = CAS_DEK_KIND_SEALED;
	for (i = 0; i < CAS_SEALED_DEK_SIZE; i++)
		upd.sealed_dek[i] = i * 7;
	upd.sealed_dek[0] = CAS_DEK_KIND_SEALED;
	buffer_set_used_size(plain, 0);
	casbox_dek_update_export(&upd, plain);
	ck_assert_uint_eq(plain->used, CASBOX_DEK_UPDATE_SEALED_SIZE);
	ck_assert_uint_eq(plain->used, 174);
	ck_assert_int_eq(casbox_dek_update_import(plain->data, plain->used,
						  &upd2, &error), 1);
	ck_assert_uint_eq(upd2.dek_kind, CAS_DEK_KIND_SEALED);
	ck_assert(memcmp(upd2.sealed_dek, upd.sealed_dek,
			 CAS_SEALED_DEK_SIZE) == 0);
	ck_assert(memcmp(upd2.id.id, upd.id.id, CAS_BLOB_ID_SIZE) == 0);
	ck_assert(upd2.written_usecs == upd.written_usecs);
	for (i = 0; i < plain->used; i++) {
		ck_assert_int_eq(casbox_dek_update_import(plain->data, i,
							  &upd2, &error), -1);
	}
	buffer_append_c(plain, 0);
	ck_assert_int_eq(casbox_dek_update_import(plain->data, plain->used,
						  &upd2, &error), -1);
	/* a version 1 update of 174 bytes is refused by its size */
	p = buffer_get_modifiable_data(plain, NULL);
	buffer_set_used_size(plain, CASBOX_DEK_UPDATE_SEALED_SIZE);
	p[0] = 1;
	p[9 + CAS_BLOB_ID_SIZE] = 1;
	ck_assert_int_eq(casbox_dek_update_import(plain->data, plain->used,
						  &upd2, &error), -1);
	ck_assert_str_eq(error, "DEK update: size 174, expected 118");
	upd.dek_kind = CAS_DEK_KIND_SERVER_WRAP;
	memset(upd.wrapped_dek, 0xc3, sizeof(upd.wrapped_dek));

	/* API: a blob's DEK rewrapped, recorded in the packs, found by the
	   scan and opening the blob */
	buffer_set_used_size(plain, 0);
	buffer_append(plain, "x", 1);
	add_blob_and_meta(store, CASBOX_META_KIND_RECOVERY, plain, &id, &rec,
			  &meta);
	ck_assert_int_eq(cas_dek_unwrap(keyring, &id, rec.wrapped_dek, dek,
					&error), 1);
	rec2 = rec;
	cas_dek_wrap(keyring, &id, dek, rec2.wrapped_dek);
	sodium_memzero(dek, sizeof(dek));
	ck_assert(memcmp(rec2.wrapped_dek, rec.wrapped_dek,
			 CAS_WRAPPED_DEK_SIZE) != 0);
	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	ck_assert_int_eq(casbox_pack_txn_add_dek_update(txn, &id,
			 rec2.wrapped_dek, &error), 1);
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);

	scan = casbox_pack_scan_init(store);
	i_zero(&meta);
	while (casbox_pack_scan_next(scan, &info)) {
		if (info.meta_kind == CASBOX_META_KIND_DEK_UPDATE)
			meta = info;
	}
	ck_assert_int_eq(casbox_pack_scan_deinit(&scan, &error), 0);
	ck_assert_int_eq(meta.meta_kind, CASBOX_META_KIND_DEK_UPDATE);
	sealed = buffer_create_dynamic(default_pool, 128);
	out = buffer_create_dynamic(default_pool, 128);
	ck_assert_int_eq(casbox_pack_meta_read(store, meta.pack_id,
			 meta.offset, &kind, sealed, &error), 1);
	ck_assert_int_eq(casbox_pack_meta_open(store, kind, sealed->data,
			 sealed->used, out, &error), 1);
	ck_assert_int_eq(casbox_dek_update_import(out->data, out->used,
						  &upd2, &error), 1);
	ck_assert(memcmp(upd2.id.id, id.id, CAS_BLOB_ID_SIZE) == 0);
	ck_assert(memcmp(upd2.wrapped_dek, rec2.wrapped_dek,
			 CAS_WRAPPED_DEK_SIZE) == 0);
	memcpy(rec2.wrapped_dek, upd2.wrapped_dek, CAS_WRAPPED_DEK_SIZE);
	blob = buffer_create_dynamic(default_pool, 4096);
	ck_assert_int_eq(read_blob(store, &id, &rec2, blob), 0);
	ck_assert_uint_eq(blob->used, 3000);

	buffer_free(&blob);
	buffer_free(&sealed);
	buffer_free(&out);
	buffer_free(&plain);
	casbox_pack_store_close(&store);
}
END_TEST

/* A version 1 pack (written before meta frames) still takes blobs but
   never a meta frame: the writer starts a version 2 pack first. */
START_TEST(test_meta_not_in_v1_pack)
{
	struct casbox_pack_store *store = store_open();
	buffer_t *blobs[1], *plain;
	struct cas_blob_id ids[1];
	struct casbox_blob_record recs[1];
	struct casbox_pack_txn *txn;
	unsigned char hdr[CASBOX_PACK_HEADER_SIZE];
	const char *path1, *path2, *error;
	struct stat st1, st2;
	uint32_t pack_id;
	int fd;

	blobs[0] = pattern_blob(4000, 31);
	add_blobs(store, (const buffer_t *const *)blobs, 1, ids, recs);
	casbox_pack_store_close(&store);
	path1 = t_strdup_printf("%s/packs/pack-00000001.cbp", tmpdir);
	path2 = t_strdup_printf("%s/packs/pack-00000002.cbp", tmpdir);
	/* make it a version 1 pack, as older casbox wrote */
	memcpy(hdr, "CASBPACK", 8);
	cpu32_to_le_unaligned(1, hdr + 8);
	cpu32_to_le_unaligned(1, hdr + 12);
	cpu32_to_le_unaligned(cas_crc32c_mask(cas_crc32c(hdr, 16)), hdr + 16);
	ck_assert_int_eq(casbox_pack_header_parse(hdr, sizeof(hdr), &pack_id,
						  &error), 0);
	fd = open(path1, O_RDWR);
	ck_assert_int_eq(pwrite(fd, hdr, sizeof(hdr), 0), (ssize_t)sizeof(hdr));
	ck_assert_int_eq(close(fd), 0);
	ck_assert_int_eq(stat(path1, &st1), 0);

	store = store_open();
	plain = buffer_create_dynamic(default_pool, 16);
	buffer_append(plain, "meta", 4);
	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	ck_assert_int_eq(casbox_pack_txn_add_meta(txn,
			 CASBOX_META_KIND_RECOVERY, plain->data, plain->used,
			 &error), 1);
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
	ck_assert_int_eq(stat(path1, &st2), 0);
	ck_assert_int_eq(st1.st_size, st2.st_size);
	ck_assert_int_eq(stat(path2, &st2), 0);
	ck_assert_int_gt(st2.st_size, CASBOX_PACK_HEADER_SIZE);

	/* an unknown pack version is refused by name */
	cpu32_to_le_unaligned(3, hdr + 8);
	cpu32_to_le_unaligned(cas_crc32c_mask(cas_crc32c(hdr, 16)), hdr + 16);
	ck_assert_int_eq(casbox_pack_header_parse(hdr, sizeof(hdr), &pack_id,
						  &error), -1);
	ck_assert_str_eq(error, "pack header: unsupported version 3");
	buffer_free(&plain);
	buffer_free(&blobs[0]);
	casbox_pack_store_close(&store);
}
END_TEST

START_TEST(test_meta_header_codec)
{
	struct casbox_meta_header hdr, hdr2;
	unsigned char buf[CASBOX_META_HEADER_SIZE];
	const char *error;
	unsigned int i;

	i_zero(&hdr);
	hdr.kind = CASBOX_META_KIND_DEK_UPDATE;
	hdr.frame_size = 500;
	hdr.body_crc = 0x12345678;
	casbox_meta_header_write(&hdr, buf);
	ck_assert_int_eq(casbox_meta_header_parse(buf, sizeof(buf), &hdr2,
						  &error), 0);
	ck_assert_int_eq(hdr2.kind, hdr.kind);
	ck_assert_uint_eq(hdr2.frame_size, 500);
	ck_assert_uint_eq(hdr2.body_crc, 0x12345678);
	for (i = 0; i < sizeof(buf); i++) {
		ck_assert_int_eq(casbox_meta_header_parse(buf, i, &hdr2,
							  &error), -1);
		ck_assert_str_eq(error, "meta frame: header truncated");
	}
	/* fields that pass the CRC are still checked */
	hdr.kind = CASBOX_META_KIND_MAX + 1;
	casbox_meta_header_write(&hdr, buf);
	ck_assert_int_eq(casbox_meta_header_parse(buf, sizeof(buf), &hdr2,
						  &error), -1);
	ck_assert_str_eq(error, t_strdup_printf("meta frame: unknown kind %u",
						CASBOX_META_KIND_MAX + 1));
	hdr.kind = CASBOX_META_KIND_NONE;
	casbox_meta_header_write(&hdr, buf);
	ck_assert_int_eq(casbox_meta_header_parse(buf, sizeof(buf), &hdr2,
						  &error), -1);
	hdr.kind = CASBOX_META_KIND_RECOVERY;
	hdr.frame_size = CASBOX_META_HEADER_SIZE + CASBOX_META_MIN_BODY - 1;
	casbox_meta_header_write(&hdr, buf);
	ck_assert_int_eq(casbox_meta_header_parse(buf, sizeof(buf), &hdr2,
						  &error), -1);
	hdr.frame_size = CASBOX_META_HEADER_SIZE + CASBOX_META_MAX_BODY + 1;
	casbox_meta_header_write(&hdr, buf);
	ck_assert_int_eq(casbox_meta_header_parse(buf, sizeof(buf), &hdr2,
						  &error), -1);
	/* a blob frame header is not a meta header, and the other way */
	hdr.frame_size = 500;
	casbox_meta_header_write(&hdr, buf);
	{
		struct casbox_frame_header fh;
		unsigned char fbuf[CASBOX_FRAME_HEADER_SIZE];

		memset(fbuf, 0, sizeof(fbuf));
		memcpy(fbuf, buf, sizeof(buf));
		ck_assert_int_eq(casbox_frame_header_parse(fbuf, sizeof(fbuf),
							   &fh, &error), -1);
		ck_assert_str_eq(error, "frame: bad magic");
	}
}
END_TEST

/* Literal version 1 bytes (before the DEK kind) decode as a server
   wrap and are re-exported as version 2; a sealed DEK round-trips;
   wrong kinds and sizes are refused. */
START_TEST(test_record_versions)
{
	unsigned char v1[CASBOX_BLOB_RECORD_V1_SIZE];
	struct casbox_blob_record rec, rec2;
	buffer_t *buf = buffer_create_dynamic(default_pool, 256);
	unsigned char *p;
	const char *error;
	unsigned int i;

	ck_assert_uint_eq(CASBOX_BLOB_RECORD_V1_SIZE, 105);
	ck_assert_uint_eq(CASBOX_BLOB_RECORD_EXPORT_SIZE, 106);
	ck_assert_uint_eq(CASBOX_BLOB_RECORD_EXPORT_NOBASE_MAX_SIZE, 162);
	memset(v1, 0, sizeof(v1));
	v1[0] = 1;
	v1[1] = 5;			/* pack id 5 */
	v1[5] = 0x20;			/* offset 32 */
	v1[13] = CASBOX_FRAME_HEADER_SIZE + 8 + 17;	/* frame size */
	v1[17] = 10;			/* plain size 10 */
	v1[25] = 2;			/* dict id 2 */
	for (i = 0; i < CAS_WRAPPED_DEK_SIZE; i++)
		v1[29 + i] = 0x80 + i;
	ck_assert_int_eq(casbox_blob_record_import(v1, sizeof(v1), &rec,
						   &error), 1);
	ck_assert_uint_eq(rec.pack_id, 5);
	ck_assert_uint_eq(rec.offset, 32);
	ck_assert_uint_eq(rec.plain_size, 10);
	ck_assert_uint_eq(rec.dict_id, 2);
	ck_assert_uint_eq(rec.dek_kind, CAS_DEK_KIND_SERVER_WRAP);
	ck_assert_mem_eq(rec.wrapped_dek, v1 + 29, CAS_WRAPPED_DEK_SIZE);
	/* a version 1 record is exactly 105 bytes */
	ck_assert_int_eq(casbox_blob_record_import(v1, sizeof(v1) - 1, &rec2,
						   &error), -1);
	casbox_blob_record_export(&rec, buf);
	ck_assert_uint_eq(buf->used, CASBOX_BLOB_RECORD_EXPORT_SIZE);
	p = buffer_get_modifiable_data(buf, NULL);
	ck_assert_uint_eq(p[0], 2);
	ck_assert_mem_eq(p + 1, v1 + 1, 28);
	ck_assert_uint_eq(p[29], CAS_DEK_KIND_SERVER_WRAP);
	ck_assert_mem_eq(p + 30, v1 + 29, CAS_WRAPPED_DEK_SIZE);
	ck_assert_int_eq(casbox_blob_record_import(buf->data, buf->used,
						   &rec2, &error), 1);
	ck_assert_mem_eq(&rec, &rec2, sizeof(rec));
	/* kind byte of another kind or unknown */
	p[29] = CAS_DEK_KIND_SEALED;
	ck_assert_int_eq(casbox_blob_record_import(buf->data, buf->used,
						   &rec2, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "expected"));
	p[29] = 0;
	ck_assert_int_eq(casbox_blob_record_import(buf->data, buf->used,
						   &rec2, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "unknown DEK kind"));

	/* a sealed DEK: 162 bytes, its own byte 0 is the kind */
	rec.dek_kind = CAS_DEK_KIND_SEALED;
	for (i = 0; i < CAS_SEALED_DEK_SIZE; i++)
		rec.sealed_dek[i] = i * 7;
	rec.sealed_dek[0] = CAS_DEK_KIND_SEALED;
	buffer_set_used_size(buf, 0);
	record_roundtrip(&rec, buf);
	ck_assert_uint_eq(buf->used, CASBOX_BLOB_RECORD_EXPORT_NOBASE_MAX_SIZE);
	ck_assert_uint_eq(casbox_blob_record_export_size(&rec), buf->used);
	buffer_free(&buf);
}
END_TEST

static struct cas_keyring *
password_keyring(const char *password)
{
	static const struct cas_userkey_limits limits = { 1, 8192 };
	const char *path = t_strdup_printf("%s/user.ukey", tmpdir);
	struct cas_key_settings set;
	struct cas_keyring *k;
	const char *error;

	if (access(path, F_OK) < 0) {
		ck_assert_int_eq(cas_userkey_create(path, "pw", 2, &limits,
						    NULL, &error), 1);
	}
	i_zero(&set);
	set.mode = CAS_KEY_MODE_PASSWORD;
	set.path = path;
	set.password = password;
	ck_assert_int_eq(cas_keyring_load_mode(&set, &k, &error), 1);
	return k;
}

static void
add_blob_with(struct casbox_pack_store *store, const struct cas_keyring *k,
	      const buffer_t *blob, struct cas_blob_id *id_r,
	      struct casbox_blob_record *rec_r)
{
	struct casbox_pack_txn *txn;
	struct istream *input;
	const char *error;

	cas_blob_id_compute(k, blob->data, blob->used, id_r);
	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	input = i_stream_create_from_data(blob->data, blob->used);
	if (casbox_pack_txn_add(txn, id_r, input, rec_r, &error) < 0)
		ck_abort_msg("add: %s", error);
	i_stream_unref(&input);
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
}

/* Password mode through the pack store: a public (LMTP) ring writes
   sealed DEKs and no dictionary; only the unlocked ring reads; a server
   ring refuses sealed DEKs and vice versa, with errors that say so. */
START_TEST(test_password_mode)
{
	struct cas_keyring *pub = password_keyring(NULL);
	struct cas_keyring *unl = password_keyring("pw");
	struct casbox_pack_store *store;
	struct casbox_blob_record rec, rec_small, srec;
	struct cas_blob_id id, id_small, sid;
	buffer_t *big = pattern_blob(150000, 3), *small, *out, *exp;
	const void *samples[64];
	size_t sizes[64];
	struct istream *input;
	const char *error;
	uint32_t dict_id;
	unsigned int i;

	out = buffer_create_dynamic(default_pool, 1024);
	store = store_open_with(pub, 0);
	add_blob_with(store, pub, big, &id, &rec);
	ck_assert_uint_eq(rec.dek_kind, CAS_DEK_KIND_SEALED);
	ck_assert_uint_eq(casbox_blob_record_export_size(&rec),
			  CASBOX_BLOB_RECORD_EXPORT_NOBASE_MAX_SIZE);
	/* without the password: no read, no dictionary training */
	input = casbox_pack_blob_open(store, &id, &rec);
	ck_assert_int_eq(i_stream_read(input), -1);
	ck_assert_int_eq(input->stream_errno, EIO);
	ck_assert_ptr_nonnull(strstr(i_stream_get_error(input), "locked"));
	i_stream_unref(&input);
	for (i = 0; i < N_ELEMENTS(samples); i++) {
		samples[i] = CONST_PTR_OFFSET(big->data, i * 1000);
		sizes[i] = 1000;
	}
	ck_assert_int_eq(casbox_pack_dict_train(store, samples, sizes,
		N_ELEMENTS(samples), &dict_id, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "locked"));
	casbox_pack_store_close(&store);

	/* with the password: reads; a dictionary can be trained */
	store = store_open_with(unl, 0);
	assert_blob(store, &id, &rec, big);
	if (casbox_pack_dict_train(store, samples, sizes,
				   N_ELEMENTS(samples), &dict_id,
				   &error) < 0)
		ck_abort_msg("train: %s", error);
	casbox_pack_store_close(&store);

	/* LMTP again: the sealed dictionary is unusable, so small blobs
	   are stored without one, and still read back with the password */
	store = store_open_with(pub, 0);
	ck_assert_uint_eq(casbox_pack_dict_current(store), 0);
	small = buffer_create_dynamic(default_pool, 2000);
	buffer_append(small, big->data, 2000);
	add_blob_with(store, pub, small, &id_small, &rec_small);
	ck_assert_uint_eq(rec_small.dict_id, 0);
	casbox_pack_store_close(&store);
	store = store_open_with(unl, 0);
	ck_assert_uint_eq(casbox_pack_dict_current(store), dict_id);
	assert_blob(store, &id_small, &rec_small, small);
	/* a server-wrapped record in a password-mode store */
	casbox_pack_store_close(&store);

	store = store_open_with(keyring, 0);
	exp = pattern_blob(5000, 9);
	add_blob_with(store, keyring, exp, &sid, &srec);
	ck_assert_uint_eq(srec.dek_kind, CAS_DEK_KIND_SERVER_WRAP);
	/* the sealed one with the server ring */
	ck_assert_int_eq(read_blob(store, &id, &rec, out), -1);
	casbox_pack_store_close(&store);
	store = store_open_with(unl, 0);
	input = casbox_pack_blob_open(store, &sid, &srec);
	ck_assert_int_eq(i_stream_read(input), -1);
	ck_assert_ptr_nonnull(strstr(i_stream_get_error(input),
				     "server key"));
	i_stream_unref(&input);
	/* a sealed DEK moved to another blob's record */
	srec.dek_kind = rec.dek_kind;
	memcpy(srec.sealed_dek, rec.sealed_dek, CAS_SEALED_DEK_SIZE);
	ck_assert_int_eq(read_blob(store, &sid, &srec, out), -1);
	casbox_pack_store_close(&store);

	buffer_free(&exp);
	buffer_free(&small);
	buffer_free(&big);
	buffer_free(&out);
	cas_keyring_free(&pub);
	cas_keyring_free(&unl);
}
END_TEST

/* casbox_pack_txn_copy_frame: a frame moved to another pack without a
   key (public password-mode ring) still opens with its old DEK; a
   damaged chunk or a record of another blob is refused and the partial
   copy dropped. */
/* A server-mode meta frame appended on its own; meta_r is the last
   meta frame of the scan. */
static void
add_blob_and_meta_nocheck(struct casbox_pack_store *store,
			  const buffer_t *plain,
			  struct casbox_pack_frame_info *meta_r)
{
	struct casbox_pack_txn *txn;
	struct casbox_pack_scan *scan;
	struct casbox_pack_frame_info info;
	const char *error;

	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	ck_assert_int_eq(casbox_pack_txn_add_meta(txn,
			 CASBOX_META_KIND_MAILBOX, plain->data, plain->used,
			 &error), 1);
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
	scan = casbox_pack_scan_init(store);
	while (casbox_pack_scan_next(scan, &info)) {
		if (info.meta_kind != CASBOX_META_KIND_NONE)
			*meta_r = info;
	}
	ck_assert_int_eq(casbox_pack_scan_deinit(&scan, &error), 0);
}

/* Password mode: LMTP (public key only) writes meta frames sealed to
   the user key (header version 2); only the unlocked key opens them,
   verify works without the password, a server-mode store refuses them
   with a clear error and the other way round, and the plaintext is not
   in the pack. Server mode still writes version 1. */
START_TEST(test_meta_password_mode)
{
	struct cas_keyring *pub = password_keyring(NULL);
	struct cas_keyring *unl = password_keyring("pw");
	struct casbox_pack_store *store;
	struct casbox_pack_txn *txn;
	struct casbox_pack_scan *scan;
	struct casbox_pack_frame_info info, meta;
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	buffer_t *plain = buffer_create_dynamic(default_pool, 64);
	buffer_t *sealed = buffer_create_dynamic(default_pool, 256);
	buffer_t *out = buffer_create_dynamic(default_pool, 256);
	buffer_t *blob = pattern_blob(4000, 5), *pack;
	enum casbox_meta_kind kind;
	const char *error, *path;
	static const unsigned char zero_locator[CASBOX_META_LOCATOR_SIZE];
	unsigned char locator[CASBOX_META_LOCATOR_SIZE];
	unsigned char locator2[CASBOX_META_LOCATOR_SIZE];
	unsigned int n = 0;
	size_t i;

	buffer_append(plain, "Subject: pwmode secret", 22);
	store = store_open_with(pub, 0);
	add_blob_with(store, pub, blob, &id, &rec);
	/* the locator: keyed by the delivery key, the same with and
	   without the password, zero in server mode */
	casbox_pack_meta_locator_make(store, "mbox:7:guid", 11, locator);
	ck_assert(memcmp(locator, zero_locator, sizeof(locator)) != 0);
	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	ck_assert_int_eq(casbox_pack_txn_add_meta_locator(txn,
			 CASBOX_META_KIND_RECOVERY, locator, plain->data,
			 plain->used, &error), 1);
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
	scan = casbox_pack_scan_init(store);
	i_zero(&meta);
	while (casbox_pack_scan_next(scan, &info)) {
		ck_assert_ptr_null(info.damage);
		if (info.meta_kind != CASBOX_META_KIND_NONE) {
			meta = info;
			n++;
		}
	}
	ck_assert_int_eq(casbox_pack_scan_deinit(&scan, &error), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(meta.frame_size, CASBOX_META_HEADER_SIZE +
			  CASBOX_META_LOCATOR_SIZE + plain->used +
			  CAS_USERKEY_BOX_OVERHEAD);

	path = t_strdup_printf("%s/packs/pack-%08u.cbp", tmpdir, meta.pack_id);
	pack = read_path(path);
	ck_assert_uint_eq(((const unsigned char *)pack->data)[meta.offset + 4],
			  CASBOX_META_VERSION_USERKEY);
	for (i = 0; i + 6 <= pack->used; i++) {
		ck_assert(memcmp(CONST_PTR_OFFSET(pack->data, i), "secret",
				 6) != 0);
	}
	buffer_free(&pack);
	/* without the password: read and verify, not open */
	ck_assert_int_eq(casbox_pack_meta_read(store, meta.pack_id,
			 meta.offset, &kind, sealed, &error), 1);
	ck_assert_int_eq(kind, CASBOX_META_KIND_RECOVERY);
	ck_assert_int_eq(casbox_pack_meta_locator(store, sealed->data,
			 sealed->used, locator2), 1);
	ck_assert(memcmp(locator, locator2, sizeof(locator)) == 0);
	ck_assert_int_eq(casbox_pack_meta_verify(store, kind, sealed->data,
			 sealed->used, &error), 1);
	ck_assert_int_eq(casbox_pack_meta_verify(store,
			 CASBOX_META_KIND_MAILBOX, sealed->data,
			 sealed->used, &error), -1);
	ck_assert_int_eq(casbox_pack_meta_open(store, kind, sealed->data,
			 sealed->used, out, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "locked"));
	ck_assert_uint_eq(out->used, 0);
	casbox_pack_store_close(&store);

	/* with the password */
	store = store_open_with(unl, 0);
	casbox_pack_meta_locator_make(store, "mbox:7:guid", 11, locator2);
	ck_assert(memcmp(locator, locator2, sizeof(locator)) == 0);
	casbox_pack_meta_locator_make(store, "mbox:8:guid", 11, locator2);
	ck_assert(memcmp(locator, locator2, sizeof(locator)) != 0);
	ck_assert_int_eq(meta_reads(store, &meta, plain, &error), 1);
	/* the kind is authenticated */
	ck_assert_int_eq(casbox_pack_meta_open(store,
			 CASBOX_META_KIND_DEK_UPDATE, sealed->data,
			 sealed->used, out, &error), -1);
	/* so is every byte */
	for (i = 0; i < sealed->used; i++) {
		unsigned char *p = buffer_get_modifiable_data(sealed, NULL);

		p[i] ^= 0x01;
		ck_assert_int_eq(casbox_pack_meta_open(store, kind,
				 sealed->data, sealed->used, out, &error), -1);
		p[i] ^= 0x01;
	}
	ck_assert_uint_eq(out->used, 0);
	casbox_pack_store_close(&store);

	/* a server-mode reader names the mismatch */
	store = store_open_with(keyring, 0);
	buffer_set_used_size(sealed, 0);
	ck_assert_int_eq(casbox_pack_meta_read(store, meta.pack_id,
			 meta.offset, &kind, sealed, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "sealed to a user key"));
	ck_assert_int_eq(casbox_pack_meta_verify(store, kind, sealed->data,
			 sealed->used, &error), 0);
	ck_assert_int_eq(casbox_pack_meta_locator(store, sealed->data,
			 sealed->used, locator2), 0);
	casbox_pack_meta_locator_make(store, "mbox:7:guid", 11, locator2);
	ck_assert(memcmp(locator2, zero_locator, sizeof(locator2)) == 0);
	/* server mode still writes version 1 */
	add_blob_and_meta_nocheck(store, plain, &meta);
	pack = read_path(t_strdup_printf("%s/packs/pack-%08u.cbp", tmpdir,
					 meta.pack_id));
	ck_assert_uint_eq(((const unsigned char *)pack->data)[meta.offset + 4],
			  CASBOX_META_VERSION);
	buffer_free(&pack);
	ck_assert_uint_eq(meta.frame_size, CASBOX_META_HEADER_SIZE +
			  plain->used + CAS_AEAD_NONCE_SIZE +
			  CAS_AEAD_TAG_SIZE);
	ck_assert_int_eq(meta_reads(store, &meta, plain, &error), 1);
	casbox_pack_store_close(&store);
	/* ... which a password-mode reader refuses, naming it */
	store = store_open_with(unl, 0);
	buffer_set_used_size(sealed, 0);
	ck_assert_int_eq(casbox_pack_meta_read(store, meta.pack_id,
			 meta.offset, &kind, sealed, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "sealed with a server key"));
	casbox_pack_store_close(&store);

	buffer_free(&plain);
	buffer_free(&sealed);
	buffer_free(&out);
	buffer_free(&blob);
	cas_keyring_free(&pub);
	cas_keyring_free(&unl);
}
END_TEST

START_TEST(test_copy_frame)
{
	struct cas_keyring *pub = password_keyring(NULL);
	struct cas_keyring *unl = password_keyring("pw");
	struct casbox_pack_store *store;
	struct casbox_pack_txn *txn;
	struct casbox_blob_record rec, rec2, moved, moved2;
	struct cas_blob_id id, id2;
	buffer_t *big = pattern_blob(200000, 5), *small = pattern_blob(900, 6);
	const char *error;
	struct stat st;
	unsigned char old;
	uint32_t i;

	store = store_open_with(pub, 1);
	add_blob_with(store, pub, big, &id, &rec);
	add_blob_with(store, pub, small, &id2, &rec2);
	ck_assert_uint_ne(rec.pack_id, rec2.pack_id);

	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	if (casbox_pack_txn_copy_frame(txn, &id, &rec, &moved, &error) < 0)
		ck_abort_msg("copy: %s", error);
	ck_assert_uint_ne(moved.pack_id, rec.pack_id);
	ck_assert_uint_eq(moved.frame_size, rec.frame_size);
	ck_assert_mem_eq(moved.sealed_dek, rec.sealed_dek,
			 CAS_SEALED_DEK_SIZE);
	/* a record of another blob */
	ck_assert_int_eq(casbox_pack_txn_copy_frame(txn, &id2, &rec, &moved2,
						    &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "not the one"));
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
	ck_assert_int_eq(stat(t_strdup_printf("%s/packs/pack-%08u.cbp",
		tmpdir, moved.pack_id), &st), 0);
	ck_assert_uint_eq(st.st_size, moved.offset + moved.frame_size);
	casbox_pack_store_close(&store);

	store = store_open_with(unl, 1);
	assert_blob(store, &id, &moved, big);
	/* damage a chunk of the source: the copy is refused */
	pack_poke(&rec2, CASBOX_FRAME_HEADER_SIZE + 3, 0x40, &old);
	ck_assert_int_eq(casbox_pack_txn_begin(store, &txn, &error), 1);
	ck_assert_int_eq(casbox_pack_txn_copy_frame(txn, &id2, &rec2, &moved2,
						    &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "CRC mismatch"));
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
	/* nothing but pack headers was left of the failed copy */
	for (i = moved.pack_id + 1; i <= moved.pack_id + 3; i++) {
		if (stat(t_strdup_printf("%s/packs/pack-%08u.cbp", tmpdir, i),
			 &st) == 0)
			ck_assert_uint_eq(st.st_size, CASBOX_PACK_HEADER_SIZE);
	}
	casbox_pack_store_close(&store);

	buffer_free(&big);
	buffer_free(&small);
	cas_keyring_free(&pub);
	cas_keyring_free(&unl);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("pack");
	TCase *tc = tcase_create("pack");
	int failed;

	lib_init();
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_corpus_round_trip);
	tcase_add_test(tc, test_meta_header_codec);
	tcase_add_test(tc, test_meta_frame_damage);
	tcase_add_test(tc, test_meta_sealed);
	tcase_add_test(tc, test_dek_update);
	tcase_add_test(tc, test_meta_not_in_v1_pack);
	tcase_add_test(tc, test_chunk_boundaries);
	tcase_add_test(tc, test_seek);
	tcase_add_test(tc, test_damage_small_exhaustive);
	tcase_add_test(tc, test_damage_large_sampled);
	tcase_add_test(tc, test_damage_record_fields);
	tcase_add_test(tc, test_wrong_key);
	tcase_add_test(tc, test_add_rejects);
	tcase_add_test(tc, test_record_export_import);
	tcase_add_test(tc, test_record_versions);
	tcase_add_test(tc, test_password_mode);
	tcase_add_test(tc, test_meta_password_mode);
	tcase_add_test(tc, test_copy_frame);
	tcase_add_test(tc, test_rotation);
	tcase_add_test(tc, test_kept_read_fd);
	tcase_add_test(tc, test_newest_pack_after_gc);
	tcase_add_test(tc, test_scan_resync);
	tcase_add_test(tc, test_dictionary);
	tcase_add_test(tc, test_dictionary_added_while_reading);
	tcase_add_test(tc, test_small_reads);
	tcase_add_test(tc, test_concurrent_appends);
	tcase_add_test(tc, test_crash_without_commit);
	tcase_add_test(tc, test_golden_v1);
	tcase_add_test(tc, test_concat_of_blobs);
	tcase_add_test(tc, test_scratch_reuse);
	tcase_add_test(tc, test_scratch_back_at_last_byte);
	tcase_add_test(tc, test_small_multichunk_frame);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
