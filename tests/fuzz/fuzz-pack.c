/* Fuzz the pack reader: input = exported blob record (105 bytes) | pack
   file bytes. The pack is scanned without keys, then the record's blob
   is opened and read with the fixed test key. Oracle: a read that
   succeeds must return plain_size bytes whose keyed id is the frame's
   blob id (AEAD authenticates every chunk), anything else is a crash.
   Meta frames the scan finds intact are read and opened too (a DEK
   update that opens is decoded). `fuzz-pack --make-seeds DIR` writes
   the frame version 2 seeds ("v2-*", one per cipher) with the real
   writer; the other seeds predate frame version 2 and are kept as they
   are (check-pack and check-frame-v2 read both kinds as golden files;
   "meta-frames" is a version 2 pack of version 1 frames).
   Delta frames (frame version 3): the input starts with the delta's
   version 3 record, then one record per chain link (its base, and the
   base's base: base_depth records, each version 2 or 3), then the
   pack; the blob is read through casbox_pack_blob_open_chain() with
   those records as the lookup ("v3-*" seeds). */

#include "lib.h"
#include "buffer.h"
#include "istream.h"
#include "cas-key.h"
#include "casbox-pack.h"
#include "casbox-frame.h"
#include "casbox-base-cache.h"

#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>

#include "fuzz-replay.h"

static struct cas_keyring *fuzz_keyring;
static struct casbox_pack_store *fuzz_store;
static char fuzz_dir[] = "/tmp/fuzz-pack.XXXXXX";

static void fuzz_pack_deinit(void)
{
	casbox_pack_store_close(&fuzz_store);
	cas_keyring_free(&fuzz_keyring);
	(void)unlink(t_strdup_printf("%s/packs/pack-00000001.cbp", fuzz_dir));
	(void)unlink(t_strdup_printf("%s/packs/pack.lock", fuzz_dir));
	(void)rmdir(t_strdup_printf("%s/packs", fuzz_dir));
	(void)rmdir(fuzz_dir);
	lib_deinit();
}

static struct casbox_pack_store *
fuzz_store_open(const char *dir, enum cas_aead_cipher cipher)
{
	struct casbox_pack_settings set;
	struct casbox_pack_store *store;
	const char *error;

	i_zero(&set);
	set.dir = t_strdup_printf("%s/packs", dir);
	set.cipher = cipher;
	if (casbox_pack_store_open(&set, fuzz_keyring, &store, &error) < 0)
		i_fatal("%s", error);
	return store;
}

static void fuzz_pack_init(void)
{
	unsigned char kek[CAS_KEK_SIZE];

	if (fuzz_keyring != NULL)
		return;
	lib_init();
	memset(kek, 0x42, sizeof(kek));
	fuzz_keyring = cas_keyring_create_from_kek(kek);
	if (mkdtemp(fuzz_dir) == NULL)
		i_fatal("mkdtemp() failed: %m");
	fuzz_store = fuzz_store_open(fuzz_dir, CAS_AEAD_CIPHER_AUTO);
	atexit(fuzz_pack_deinit);
}

static void fuzz_write_pack(const uint8_t *data, size_t size)
{
	const char *path = t_strdup_printf("%s/packs/pack-00000001.cbp",
					   fuzz_dir);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	if (fd == -1 || (size > 0 && write(fd, data, size) != (ssize_t)size))
		i_fatal("write(%s) failed: %m", path);
	i_close_fd(&fd);
}

static void fuzz_meta(const struct casbox_pack_frame_info *info)
{
	buffer_t *sealed = t_buffer_create(256), *plain = t_buffer_create(256);
	struct casbox_dek_update upd;
	enum casbox_meta_kind kind;
	const char *error;

	if (casbox_pack_meta_read(fuzz_store, info->pack_id, info->offset,
				  &kind, sealed, &error) < 0) {
		/* the scan verified header and body CRCs */
		i_panic("intact meta frame does not read: %s", error);
	}
	if (kind != info->meta_kind)
		i_panic("meta frame kind changed between scan and read");
	if (casbox_pack_meta_open(fuzz_store, kind, sealed->data,
				  sealed->used, plain, &error) < 0)
		return;
	if (kind == CASBOX_META_KIND_DEK_UPDATE)
		(void)casbox_dek_update_import(plain->data, plain->used,
					       &upd, &error);
}

static void fuzz_scan(void)
{
	struct casbox_pack_scan *scan = casbox_pack_scan_init(fuzz_store);
	struct casbox_pack_frame_info info;
	uint64_t last = 0;
	const char *error;

	while (casbox_pack_scan_next(scan, &info)) {
		/* always moves forward; only a damaged pack header (at 0,
		   e.g. an empty file) may cover no bytes */
		if (info.offset < last ||
		    (info.frame_size == 0 && info.offset != 0))
			i_panic("scan went backwards or stalled");
		last = info.offset + info.frame_size;
		if (info.meta_kind != CASBOX_META_KIND_NONE &&
		    info.damage == NULL) T_BEGIN {
			fuzz_meta(&info);
		} T_END;
	}
	(void)casbox_pack_scan_deinit(&scan, &error);
}

#define FUZZ_MAX_BASES CASBOX_BASE_MAX_DEPTH
static struct casbox_blob_record fuzz_bases[FUZZ_MAX_BASES];
static struct cas_blob_id fuzz_base_ids[FUZZ_MAX_BASES];
static unsigned int fuzz_base_count;

static int fuzz_lookup(void *context ATTR_UNUSED,
		       const struct cas_blob_id *id,
		       struct casbox_blob_record *rec_r, const char **error_r)
{
	unsigned int i;

	for (i = 0; i < fuzz_base_count; i++) {
		if (memcmp(fuzz_base_ids[i].id, id->id, sizeof(id->id)) == 0) {
			*rec_r = fuzz_bases[i];
			return 1;
		}
	}
	*error_r = "no such record in the input";
	return 0;
}

/* Size of the record starting at data (by its version byte). */
static size_t fuzz_record_size(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	switch (data[0]) {
	case CASBOX_BLOB_RECORD_VERSION_V1:
		return CASBOX_BLOB_RECORD_V1_SIZE;
	case CASBOX_BLOB_RECORD_VERSION_BASE:
		return CASBOX_BLOB_RECORD_EXPORT_SIZE +
			CASBOX_BLOB_RECORD_BASE_SIZE;
	}
	return CASBOX_BLOB_RECORD_EXPORT_SIZE;
}

/* The blob id in the frame at rec's offset, if the pack has it. */
static bool fuzz_frame_id(const uint8_t *pack, size_t size,
			  const struct casbox_blob_record *rec,
			  struct cas_blob_id *id_r)
{
	size_t id_off;

	if (rec->offset + CASBOX_FRAME_HEADER_MAX_SIZE > size)
		return FALSE;
	/* the blob id's place in either frame version */
	id_off = pack[rec->offset + 4] == CASBOX_FRAME_VERSION_V1 ? 32 : 48;
	memcpy(id_r->id, pack + rec->offset + id_off, sizeof(id_r->id));
	return TRUE;
}

static void fuzz_read_blob(const struct cas_blob_id *id,
			   const struct casbox_blob_record *rec)
{
	struct istream *input;
	struct cas_blob_id_ctx ctx;
	struct cas_blob_id real;
	const unsigned char *data;
	size_t size;
	uint64_t total = 0;
	const char *error;

	if (casbox_pack_blob_open_chain(fuzz_store, id, rec, fuzz_lookup,
					NULL, &input, &error) < 0)
		return;
	cas_blob_id_init(fuzz_keyring, &ctx);
	while (i_stream_read_more(input, &data, &size) > 0) {
		cas_blob_id_update(&ctx, data, size);
		total += size;
		i_stream_skip(input, size);
	}
	cas_blob_id_final(&ctx, &real);
	if (input->stream_errno == 0) {
		if (total != rec->plain_size ||
		    memcmp(real.id, id->id, sizeof(real.id)) != 0)
			i_panic("blob read succeeded with wrong bytes");
		/* a seek into the middle must agree too */
		i_stream_seek(input, rec->plain_size / 2);
		(void)i_stream_read_more(input, &data, &size);
	}
	i_stream_unref(&input);
	/* decoded bases of this input must not serve the next */
	casbox_base_cache_clear(casbox_pack_store_get_base_cache(fuzz_store));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct casbox_blob_record rec;
	struct cas_blob_id id;
	const char *error;
	size_t rec_size;
	bool have_rec;
	unsigned int i;

	fuzz_pack_init();
	T_BEGIN {
		/* a version 1 record (the seeds), a server-mode version 2
		   record, or a version 3 record and its chain's records,
		   then the pack image */
		rec_size = fuzz_record_size(data, size);
		have_rec = size >= rec_size &&
			casbox_blob_record_import(data, rec_size,
						  &rec, &error) > 0;
		if (size >= rec_size) {
			data += rec_size;
			size -= rec_size;
		}
		fuzz_base_count = 0;
		for (i = 0; have_rec && i < rec.base_depth; i++) {
			rec_size = fuzz_record_size(data, size);
			if (size < rec_size ||
			    casbox_blob_record_import(data, rec_size,
					&fuzz_bases[fuzz_base_count],
					&error) <= 0)
				break;
			fuzz_bases[fuzz_base_count++].pack_id = 1;
			data += rec_size;
			size -= rec_size;
		}
		fuzz_write_pack(data, size);
		fuzz_scan();
		for (i = 0; i < fuzz_base_count; i++) {
			if (!fuzz_frame_id(data, size, &fuzz_bases[i],
					   &fuzz_base_ids[i]))
				i_zero(&fuzz_base_ids[i]);
		}
		if (have_rec && fuzz_frame_id(data, size, &rec, &id)) {
			rec.pack_id = 1;
			fuzz_read_blob(&id, &rec);
		}
	} T_END;
	return 0;
}

#ifndef CASBOX_LIBFUZZER
/* bases: NULL, or for each blob the index of the earlier blob it is
   offered as base (-1 = none); the picked blob's chain records follow
   its own in the seed */
static void
fuzz_make_seed_base(const char *dir, const char *name,
		    const buffer_t *const *blobs, unsigned int count,
		    unsigned int pick, bool with_meta,
		    enum cas_aead_cipher cipher, const int *bases)
{
	struct casbox_blob_record recs[8];
	struct casbox_pack_base base;
	const char *tmp = t_strdup_printf("%s/tmp-%s", dir, name);
	struct casbox_pack_store *store = fuzz_store_open(tmp, cipher);
	struct casbox_blob_record rec, picked;
	struct casbox_pack_txn *txn;
	struct istream *input;
	struct cas_blob_id id;
	buffer_t *seed = buffer_create_dynamic(default_pool, 4096);
	const char *error, *pack = t_strdup_printf("%s/packs/pack-00000001.cbp",
						   tmp);
	unsigned char buf[4096];
	unsigned int i;
	ssize_t n;
	int fd;

	if (casbox_pack_txn_begin(store, &txn, &error) < 0)
		i_fatal("%s", error);
	for (i = 0; i < count; i++) {
		cas_blob_id_compute(fuzz_keyring, blobs[i]->data,
				    blobs[i]->used, &id);
		input = i_stream_create_from_data(blobs[i]->data,
						  blobs[i]->used);
		i_assert(i < N_ELEMENTS(recs));
		if (bases != NULL && bases[i] >= 0) {
			i_zero(&base);
			cas_blob_id_compute(fuzz_keyring,
					    blobs[bases[i]]->data,
					    blobs[bases[i]]->used, &base.id);
			base.plain_size = blobs[bases[i]]->used;
			base.depth = recs[bases[i]].base_depth;
			base.data = blobs[bases[i]]->data;
			base.size = blobs[bases[i]]->used;
		}
		if (casbox_pack_txn_add_base(txn, &id, input,
				bases != NULL && bases[i] >= 0 ? &base : NULL,
				&rec, &error) < 0)
			i_fatal("%s", error);
		if (bases != NULL && bases[i] >= 0 && rec.base_depth == 0)
			i_fatal("seed %s: blob %u is no delta", name, i);
		recs[i] = rec;
		i_stream_unref(&input);
		if (i == pick)
			picked = rec;
		if (with_meta && casbox_pack_txn_add_meta(txn,
				CASBOX_META_KIND_RECOVERY, blobs[i]->data,
				I_MIN(blobs[i]->used, 64), &error) < 0)
			i_fatal("%s", error);
		if (with_meta && casbox_pack_txn_add_dek_update(txn, &id,
				rec.wrapped_dek, &error) < 0)
			i_fatal("%s", error);
	}
	if (casbox_pack_txn_commit(&txn, &error) < 0)
		i_fatal("%s", error);
	casbox_pack_store_close(&store);
	casbox_blob_record_export(&picked, seed);
	/* the chain: base, base's base */
	for (i = pick; bases != NULL && bases[i] >= 0; i = bases[i])
		casbox_blob_record_export(&recs[bases[i]], seed);
	fd = open(pack, O_RDONLY);
	while (fd != -1 && (n = read(fd, buf, sizeof(buf))) > 0)
		buffer_append(seed, buf, n);
	if (fd == -1)
		i_fatal("open(%s) failed: %m", pack);
	i_close_fd(&fd);
	fd = open(t_strdup_printf("%s/%s", dir, name),
		  O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd == -1 ||
	    write(fd, seed->data, seed->used) != (ssize_t)seed->used)
		i_fatal("write seed %s failed: %m", name);
	i_close_fd(&fd);
	buffer_free(&seed);
	(void)unlink(pack);
	(void)unlink(t_strdup_printf("%s/packs/pack.lock", tmp));
	(void)rmdir(t_strdup_printf("%s/packs", tmp));
	(void)rmdir(tmp);
}

static void
fuzz_make_seed(const char *dir, const char *name, const buffer_t *const *blobs,
	       unsigned int count, unsigned int pick, bool with_meta,
	       enum cas_aead_cipher cipher)
{
	fuzz_make_seed_base(dir, name, blobs, count, pick, with_meta, cipher,
			    NULL);
}

/* Delta seeds: a message, a reply quoting it, a reply to the reply
   (depth 2), the last two chunks long. */
static void fuzz_make_delta_seeds(const char *dir)
{
	static const int bases[] = { -1, 0, 1 };
	buffer_t *blobs[3];
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(blobs); i++)
		blobs[i] = buffer_create_dynamic(default_pool, 1024);
	buffer_append(blobs[0], "Subject: hello\r\n\r\n", 18);
	for (i = 0; i < 3000; i++)
		buffer_append_c(blobs[0], "casbox delta \r\n"[(i * 7 + i / 13) % 15]);
	buffer_append(blobs[1], "Subject: Re: hello\r\n\r\n> ", 24);
	buffer_append_buf(blobs[1], blobs[0], 0, SIZE_MAX);
	for (i = 0; i < 70000; i++)
		buffer_append_c(blobs[1], "reply \r\n"[(i * 5 + i / 11) % 8]);
	buffer_append(blobs[2], "Subject: Re: Re: hello\r\n\r\n> ", 27);
	buffer_append_buf(blobs[2], blobs[1], 0, SIZE_MAX);
	fuzz_make_seed_base(dir, "v3-delta-xchacha",
			    (const buffer_t *const *)blobs, 2, 1, FALSE,
			    CAS_AEAD_CIPHER_XCHACHA20POLY1305, bases);
	fuzz_make_seed_base(dir, "v3-chain-xchacha",
			    (const buffer_t *const *)blobs, 3, 2, TRUE,
			    CAS_AEAD_CIPHER_XCHACHA20POLY1305, bases);
	if (cas_aead_cipher_available(CAS_AEAD_CIPHER_AES256GCM)) {
		fuzz_make_seed_base(dir, "v3-delta-aes",
				    (const buffer_t *const *)blobs, 2, 1,
				    FALSE, CAS_AEAD_CIPHER_AES256GCM, bases);
	}
	for (i = 0; i < N_ELEMENTS(blobs); i++)
		buffer_free(&blobs[i]);
}

static void fuzz_make_seeds(const char *dir)
{
	buffer_t *blobs[3];
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(blobs); i++)
		blobs[i] = buffer_create_dynamic(default_pool, 1024);
	buffer_append(blobs[1], "Subject: hello\r\n\r\nworld\r\n", 25);
	for (i = 0; i < 70000; i++)
		buffer_append_c(blobs[2], "casbox \r\n"[(i * 7 + i / 13) % 9]);
	/* version 1 seeds (empty, small, two-chunks, three-frames,
	   meta-frames) came from the same calls before frame version 2 */
	fuzz_make_seed(dir, "v2-small-xchacha",
		       (const buffer_t *const *)blobs + 1, 1, 0, FALSE,
		       CAS_AEAD_CIPHER_XCHACHA20POLY1305);
	fuzz_make_seed(dir, "v2-three-frames-xchacha",
		       (const buffer_t *const *)blobs, 3, 2, FALSE,
		       CAS_AEAD_CIPHER_XCHACHA20POLY1305);
	fuzz_make_seed(dir, "v2-meta-frames-xchacha",
		       (const buffer_t *const *)blobs + 1, 2, 1, TRUE,
		       CAS_AEAD_CIPHER_XCHACHA20POLY1305);
	if (cas_aead_cipher_available(CAS_AEAD_CIPHER_AES256GCM)) {
		fuzz_make_seed(dir, "v2-small-aes",
			       (const buffer_t *const *)blobs + 1, 1, 0,
			       FALSE, CAS_AEAD_CIPHER_AES256GCM);
		fuzz_make_seed(dir, "v2-two-chunks-aes",
			       (const buffer_t *const *)blobs + 2, 1, 0,
			       FALSE, CAS_AEAD_CIPHER_AES256GCM);
		fuzz_make_seed(dir, "v2-empty-aes",
			       (const buffer_t *const *)blobs, 1, 0, FALSE,
			       CAS_AEAD_CIPHER_AES256GCM);
	}
	for (i = 0; i < N_ELEMENTS(blobs); i++)
		buffer_free(&blobs[i]);
	fuzz_make_delta_seeds(dir);
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--make-seeds") == 0) {
		fuzz_pack_init();
		T_BEGIN {
			fuzz_make_seeds(argv[2]);
		} T_END;
		return 0;
	}
	return fuzz_replay_main("pack", argc, argv, NULL);
}
#endif
