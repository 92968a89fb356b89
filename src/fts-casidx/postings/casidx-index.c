/* casidx index directory: manifest, writer lock, snapshot, merge.
   Layout in casidx-index.h and doc/casidx-format.md. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "str.h"
#include "file-lock.h"
#include "mkdir-parents.h"
#include "write-full.h"
#include "safe-memset.h"
#include "cas-crc32c.h"
#include "cas-durable.h"
#include "casidx-crypt.h"
#include "casidx-index.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define MANIFEST_NAME "manifest"
#define MANIFEST_MAGIC "CXMANIF1"
/* 2: the indexed text changed (issue 17: markup of HTML parts, long
   runs, per-document markers). A version-1 index is read as an old
   format: dropped and rebuilt, never used for answers.
   3: folded terms carry CASIDX_TERM_FOLDED_PREFIX instead of a
   per-field FOLDED marker; version 2 is rebuilt the same way. */
#define MANIFEST_VERSION 3
#define MANIFEST_MAX_SIZE (64 * 1024 * 1024)
/* builder memory = memory_budget / this (casidx_index_writer_doc_done()) */
#define CASIDX_BUILDER_BUDGET_SHARE 4
#define LOCK_NAME "write.lock"
#define REFRESH_RETRIES 5
/* Merges may always take this much input (see merge_max_bytes()). */
#define CASIDX_MERGE_MIN_BYTES (4 * 1024 * 1024)

struct manifest {
	uint64_t generation;
	uint32_t last_uid;
	/* the mailbox's UIDVALIDITY the UIDs belong to, 0 = unknown */
	uint32_t uid_validity;
	uint32_t next_seg_id;
	ARRAY(uint32_t) seg_ids;
	/* document count of each segment, for tiered merging */
	ARRAY(uint32_t) seg_docs;
	roaring_bitmap_t *expunged;
};

struct open_segment {
	uint32_t id;
	struct casidx_segment *seg;
};

struct casidx_index {
	char *dir;
	struct casidx_index_settings set;
	/* set: segments are sealed (casidx-crypt.h); not owned */
	const struct cas_keyring *keyring;
	char *box_guid;

	bool loaded;
	bool corrupted;
	/* the corruption is an older format version (rebuild it) */
	bool old_format;
	struct manifest manifest;
	ARRAY(struct open_segment) segments;
	/* during index_open_segments(): the decrypted bytes of one sealed
	   segment after another (casidx_crypt_open_scratch()) */
	buffer_t *open_scratch;
	/* casidx_index_get_stats(): the segments the refreshes opened */
	unsigned int stat_segments_opened;
	uint64_t stat_file_bytes, stat_image_bytes;
};

struct casidx_index_writer {
	struct casidx_index *index;
	struct casidx_builder *builder;
	roaring_bitmap_t *expunges;
	uint32_t uid_validity;
	unsigned int flushes;
	/* builder memory when the current document began */
	size_t doc_mem_start;
	bool doc_truncated;
};

static roaring_bitmap_t *bitmap_create(void)
{
	roaring_bitmap_t *bm = roaring_bitmap_create();

	if (bm == NULL)
		i_fatal_status(FATAL_OUTOFMEM,
			       "roaring_bitmap_create() failed");
	return bm;
}

static void manifest_init(struct manifest *m)
{
	i_zero(m);
	m->next_seg_id = 1;
	i_array_init(&m->seg_ids, 8);
	i_array_init(&m->seg_docs, 8);
	m->expunged = bitmap_create();
}

static void manifest_free(struct manifest *m)
{
	if (m->expunged != NULL) {
		array_free(&m->seg_ids);
		array_free(&m->seg_docs);
		roaring_bitmap_free(m->expunged);
		m->expunged = NULL;
	}
}

static void manifest_move(struct manifest *dest, struct manifest *src)
{
	manifest_free(dest);
	*dest = *src;
	i_zero(src);
}

static const char *seg_path(struct casidx_index *index, uint32_t id)
{
	return t_strdup_printf("%s/seg-%08x.cxs", index->dir, id);
}

static uint32_t get_u32(const unsigned char *p)
{
	return p[0] | (p[1] << 8) | (p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void put_u32(buffer_t *buf, uint32_t v)
{
	uint8_t b[4] = { v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff,
			 (v >> 24) & 0xff };
	buffer_append(buf, b, sizeof(b));
}

static int manifest_parse(const unsigned char *data, size_t size,
			  struct manifest *m, bool *old_format_r,
			  const char **error_r)
{
	const unsigned char *p = data, *end;
	uint32_t i, nseg, exp_len, id, docs;

	if (size < 8 + 4 + 8 + 4 * 4 + 4 + 4) {
		*error_r = "corrupted manifest: too small";
		return -1;
	}
	end = data + size - 4;
	if (cas_crc32c(data, size - 4) != get_u32(end)) {
		*error_r = "corrupted manifest: checksum mismatch";
		return -1;
	}
	if (memcmp(p, MANIFEST_MAGIC, 8) == 0 &&
	    get_u32(p + 8) < MANIFEST_VERSION) {
		*old_format_r = TRUE;
		*error_r = t_strdup_printf("old index format version %u "
					   "(now %u)", get_u32(p + 8),
					   MANIFEST_VERSION);
		return -1;
	}
	if (memcmp(p, MANIFEST_MAGIC, 8) != 0 ||
	    get_u32(p + 8) != MANIFEST_VERSION) {
		*error_r = "corrupted manifest: bad magic or version";
		return -1;
	}
	p += 12;
	m->generation = get_u32(p) | ((uint64_t)get_u32(p + 4) << 32);
	m->last_uid = get_u32(p + 8);
	m->uid_validity = get_u32(p + 12);
	m->next_seg_id = get_u32(p + 16);
	nseg = get_u32(p + 20);
	p += 24;
	if (nseg > (size_t)(end - p) / 8) {
		*error_r = "corrupted manifest: segment count";
		return -1;
	}
	for (i = 0; i < nseg; i++, p += 8) {
		id = get_u32(p);
		docs = get_u32(p + 4);
		if (id == 0 || id >= m->next_seg_id) {
			*error_r = "corrupted manifest: segment id";
			return -1;
		}
		array_push_back(&m->seg_ids, &id);
		array_push_back(&m->seg_docs, &docs);
	}
	if ((size_t)(end - p) < 4 ||
	    (exp_len = get_u32(p)) != (size_t)(end - p) - 4) {
		*error_r = "corrupted manifest: expunge bitmap size";
		return -1;
	}
	p += 4;
	roaring_bitmap_free(m->expunged);
	m->expunged = roaring_bitmap_portable_deserialize_safe(
		(const char *)p, exp_len);
	if (m->expunged == NULL ||
	    roaring_bitmap_portable_size_in_bytes(m->expunged) != exp_len) {
		if (m->expunged == NULL)
			m->expunged = bitmap_create();
		*error_r = "corrupted manifest: expunge bitmap";
		return -1;
	}
	return 0;
}

/* Returns 1 if read, 0 if there is no manifest, -1 on error. */
static int manifest_read(struct casidx_index *index, struct manifest *m,
			 const char **error_r)
{
	const char *path = t_strdup_printf("%s/"MANIFEST_NAME, index->dir);
	buffer_t *buf;
	struct stat st;
	ssize_t ret;
	int fd, result;

	manifest_init(m);
	fd = open(path, O_RDONLY);
	if (fd == -1) {
		if (errno == ENOENT)
			return 0;
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	if (fstat(fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", path);
		i_close_fd(&fd);
		return -1;
	}
	if (st.st_size > MANIFEST_MAX_SIZE) {
		*error_r = t_strdup_printf("%s: corrupted manifest: too large",
					   path);
		i_close_fd(&fd);
		return -1;
	}
	buf = t_buffer_create(st.st_size + 1);
	ret = pread(fd, buffer_append_space_unsafe(buf, st.st_size),
		    st.st_size, 0);
	i_close_fd(&fd);
	if (ret != st.st_size) {
		*error_r = ret < 0 ?
			t_strdup_printf("read(%s) failed: %m", path) :
			t_strdup_printf("read(%s): short read", path);
		return -1;
	}
	result = manifest_parse(buf->data, buf->used, m, &index->old_format,
				error_r);
	if (result < 0) {
		index->corrupted = TRUE;
		*error_r = t_strdup_printf("%s: %s", path, *error_r);
		return -1;
	}
	return 1;
}

/* segment files and the manifest: path.tmp, fdatasync, rename */
static int index_file_write(struct casidx_index *index, const char *path,
			    const void *data, size_t size, bool dir_fsync,
			    const char **error_r)
{
	const struct cas_durable_write_settings set = {
		.io = index->set.io,
		.tmp_path = t_strdup_printf("%s.tmp", path),
		.tmp_truncate = TRUE,
		.no_fsync = index->set.no_fsync,
		/* segments: the manifest's directory fsync covers them */
		.no_dir_fsync = !dir_fsync,
	};

	return cas_durable_write_atomic(path, data, size, &set, error_r);
}

static int manifest_write(struct casidx_index *index,
			  const struct manifest *m, const char **error_r)
{
	const char *path = t_strdup_printf("%s/"MANIFEST_NAME, index->dir);
	buffer_t *buf = t_buffer_create(256);
	const uint32_t *ids, *docs;
	unsigned int i, count, docs_count;
	size_t exp_len;

	buffer_append(buf, MANIFEST_MAGIC, 8);
	put_u32(buf, MANIFEST_VERSION);
	put_u32(buf, (uint32_t)m->generation);
	put_u32(buf, (uint32_t)(m->generation >> 32));
	put_u32(buf, m->last_uid);
	put_u32(buf, m->uid_validity);
	put_u32(buf, m->next_seg_id);
	/* array_get(), never array_front(): a manifest may have no
	   segment (expunges before anything was indexed, or a merge that
	   dropped every document), and array_front() panics on that */
	ids = array_get(&m->seg_ids, &count);
	docs = array_get(&m->seg_docs, &docs_count);
	i_assert(docs_count == count);
	put_u32(buf, count);
	for (i = 0; i < count; i++) {
		put_u32(buf, ids[i]);
		put_u32(buf, docs[i]);
	}
	exp_len = roaring_bitmap_portable_size_in_bytes(m->expunged);
	put_u32(buf, exp_len);
	roaring_bitmap_portable_serialize(m->expunged,
		buffer_append_space_unsafe(buf, exp_len));
	put_u32(buf, cas_crc32c(buf->data, buf->used));

	return index_file_write(index, path, buf->data, buf->used, TRUE,
				error_r);
}

struct casidx_index *
casidx_index_init(const char *dir, const struct casidx_index_settings *set)
{
	struct casidx_index *index = i_new(struct casidx_index, 1);

	index->dir = i_strdup(dir);
	index->set = *set;
	if (index->set.memory_budget == 0)
		index->set.memory_budget = 64 * 1024 * 1024;
	if (index->set.merge_threshold == 0)
		index->set.merge_threshold = 8;
	if (index->set.lock_timeout_secs == 0)
		index->set.lock_timeout_secs = 60;
	manifest_init(&index->manifest);
	i_array_init(&index->segments, 8);
	return index;
}

void casidx_index_set_crypt(struct casidx_index *index,
			    const struct cas_keyring *keyring,
			    const char *box_guid)
{
	i_assert(!index->loaded);
	index->keyring = keyring;
	i_free(index->box_guid);
	index->box_guid = i_strdup(box_guid);
}

bool casidx_index_is_encrypted(const struct casidx_index *index)
{
	return index->keyring != NULL;
}

static const char *seg_name(uint32_t id)
{
	return t_strdup_printf("seg-%08x.cxs", id);
}

/* Read a whole file into a new buffer. Returns 1, 0 if missing, -1. */
static int read_file(const char *path, buffer_t **buf_r,
		     const char **error_r)
{
	struct stat st;
	buffer_t *buf;
	ssize_t ret;
	int fd, oret;

	if ((oret = casidx_file_open(path, &fd, &st, error_r)) <= 0)
		return oret;
	buf = buffer_create_dynamic(default_pool, st.st_size + 1);
	ret = pread(fd, buffer_append_space_unsafe(buf, st.st_size),
		    st.st_size, 0);
	i_close_fd(&fd);
	if (ret != st.st_size) {
		*error_r = ret < 0 ?
			t_strdup_printf("read(%s) failed: %m", path) :
			t_strdup_printf("read(%s): short read", path);
		buffer_free(&buf);
		return -1;
	}
	*buf_r = buf;
	return 1;
}

/* Map a whole file read-only (*data_r = NULL for an empty one).
   Returns 1, 0 if missing, -1. Segment files are never changed in
   place (written to a temporary file and renamed), so the mapping
   cannot shrink under its reader. */
static int map_file(const char *path, void **data_r, size_t *size_r,
		    const char **error_r)
{
	struct stat st;
	int fd, ret;

	*data_r = NULL;
	*size_r = 0;
	if ((ret = casidx_file_open(path, &fd, &st, error_r)) <= 0)
		return ret;
	if (st.st_size > 0) {
		*data_r = mmap(NULL, st.st_size, PROT_READ,
			       MAP_PRIVATE | MAP_POPULATE, fd, 0);
		if (*data_r == MAP_FAILED) {
			*data_r = NULL;
			*error_r = t_strdup_printf("mmap(%s) failed: %m",
						   path);
			i_close_fd(&fd);
			return -1;
		}
		*size_r = st.st_size;
	}
	i_close_fd(&fd);
	return 1;
}

/* Open a sealed segment: verified, decrypted and decompressed from a
   read-only mapping of the file (a read() into the heap cost a copy
   and a page fault per 4 kB, for bytes needed only until the image is
   out). Returns as casidx_segment_open(). */
static int index_seg_open_sealed(struct casidx_index *index, uint32_t id,
				 const char *path,
				 struct casidx_segment **seg_r,
				 bool *corrupted_r, const char **error_r)
{
	buffer_t *plain;
	void *sealed;
	size_t size;
	int ret;

	if ((ret = map_file(path, &sealed, &size, error_r)) <= 0)
		return ret;
	if (index->open_scratch == NULL) {
		index->open_scratch =
			buffer_create_dynamic(default_pool, I_MAX(size, 1));
	}
	ret = casidx_crypt_open_scratch(index->keyring, index->box_guid,
					seg_name(id),
					sealed == NULL ? "" : sealed, size,
					index->open_scratch, &plain, error_r);
	if (sealed != NULL && munmap(sealed, size) < 0)
		i_panic("munmap(%s) failed: %m", path);
	if (ret > 0) {
		index->stat_file_bytes += size;
		index->stat_image_bytes += plain->used;
		ret = casidx_segment_open_owned(&plain, seg_r, error_r);
	}
	if (ret < 0) {
		*corrupted_r = TRUE;
		*error_r = t_strdup_printf("%s: %s", path, *error_r);
	}
	return ret;
}

/* Open segment id: mmapped, or read, verified and decrypted when the
   index is encrypted. Returns as casidx_segment_open(). */
static int index_seg_open(struct casidx_index *index, uint32_t id,
			  struct casidx_segment **seg_r, bool *corrupted_r,
			  const char **error_r)
{
	const char *path = seg_path(index, id);
	int ret;

	*corrupted_r = FALSE;
	if (index->keyring != NULL) {
		ret = index_seg_open_sealed(index, id, path, seg_r,
					    corrupted_r, error_r);
	} else {
		ret = casidx_segment_open(path, seg_r, corrupted_r, error_r);
		if (ret > 0) {
			index->stat_file_bytes +=
				casidx_segment_get_size(*seg_r);
			index->stat_image_bytes +=
				casidx_segment_get_size(*seg_r);
		}
	}
	if (ret > 0)
		index->stat_segments_opened++;
	return ret;
}

/* Write the segment id from builder, which is destroyed once serialized:
   sealing copies the image, and the builder's postings are no longer
   needed then (they were the largest part of the writer's peak). */
static int index_seg_write(struct casidx_index *index, uint32_t id,
			   struct casidx_builder **builder,
			   const char **error_r)
{
	buffer_t *plain, *sealed;
	int ret;

	plain = buffer_create_dynamic(default_pool, 1024*64);
	casidx_builder_serialize(*builder, plain);
	casidx_builder_destroy(builder);
	if (index->keyring == NULL) {
		ret = index_file_write(index, seg_path(index, id), plain->data,
				       plain->used, FALSE, error_r);
		buffer_free(&plain);
		return ret;
	}
	sealed = casidx_crypt_seal(index->keyring, index->box_guid,
				   seg_name(id), plain->data, plain->used);
	safe_memset(buffer_get_modifiable_data(plain, NULL), 0, plain->used);
	buffer_free(&plain);
	ret = index_file_write(index, seg_path(index, id), sealed->data,
			       sealed->used, FALSE, error_r);
	buffer_free(&sealed);
	return ret;
}

static void index_close_segments(struct casidx_index *index)
{
	struct open_segment *os;

	array_foreach_modifiable(&index->segments, os)
		casidx_segment_close(&os->seg);
	array_clear(&index->segments);
}

void casidx_index_deinit(struct casidx_index **_index)
{
	struct casidx_index *index = *_index;

	*_index = NULL;
	index_close_segments(index);
	/* a merge's segment opens leave it (wiped) */
	if (index->open_scratch != NULL)
		buffer_free(&index->open_scratch);
	array_free(&index->segments);
	manifest_free(&index->manifest);
	i_free(index->box_guid);
	i_free(index->dir);
	i_free(index);
}

const char *casidx_index_get_dir(const struct casidx_index *index)
{
	return index->dir;
}

bool casidx_index_is_corrupted(const struct casidx_index *index)
{
	return index->corrupted;
}

bool casidx_index_is_old_format(const struct casidx_index *index)
{
	return index->old_format;
}

static struct casidx_segment *
index_find_open(struct casidx_index *index, uint32_t id)
{
	struct open_segment *os;

	array_foreach_modifiable(&index->segments, os) {
		if (os->id == id)
			return os->seg;
	}
	return NULL;
}

/* Open every segment of m; 0 if one vanished (concurrent merge). */
static int index_open_segments_scratch(struct casidx_index *index,
			       const struct manifest *m,
			       struct open_segment **segs_r,
			       const char **error_r)
{
	struct open_segment *segs;
	const uint32_t *ids;
	unsigned int i, j, count;
	bool corrupted;
	int ret;

	ids = array_get(&m->seg_ids, &count);
	segs = i_new(struct open_segment, count + 1);
	for (i = 0; i < count; i++) {
		segs[i].id = ids[i];
		segs[i].seg = index_find_open(index, ids[i]);
		if (segs[i].seg != NULL)
			continue;
		ret = index_seg_open(index, ids[i], &segs[i].seg,
				     &corrupted, error_r);
		if (corrupted)
			index->corrupted = TRUE;
		if (ret <= 0 || (!roaring_bitmap_is_empty(
				casidx_segment_get_docs(segs[i].seg)) &&
			roaring_bitmap_maximum(casidx_segment_get_docs(
				segs[i].seg)) > m->last_uid)) {
			if (ret > 0) {
				*error_r = t_strdup_printf(
					"%s: corrupted segment: "
					"UID above last indexed UID",
					seg_path(index, ids[i]));
				index->corrupted = TRUE;
				casidx_segment_close(&segs[i].seg);
				ret = -1;
			}
			for (j = 0; j < i; j++) {
				if (index_find_open(index, segs[j].id) == NULL)
					casidx_segment_close(&segs[j].seg);
			}
			i_free(segs);
			return ret;
		}
	}
	*segs_r = segs;
	return 1;
}

static int index_open_segments(struct casidx_index *index,
			       const struct manifest *m,
			       struct open_segment **segs_r,
			       const char **error_r)
{
	int ret;

	ret = index_open_segments_scratch(index, m, segs_r, error_r);
	/* casidx_crypt_open_scratch() left it wiped */
	if (index->open_scratch != NULL)
		buffer_free(&index->open_scratch);
	return ret;
}

static void index_set_snapshot(struct casidx_index *index,
			       struct manifest *m,
			       struct open_segment *segs)
{
	struct open_segment *os;
	unsigned int i, count = array_count(&m->seg_ids);
	bool keep;

	/* close segments not in the new snapshot */
	array_foreach_modifiable(&index->segments, os) {
		keep = FALSE;
		for (i = 0; i < count; i++) {
			if (segs[i].id == os->id)
				keep = TRUE;
		}
		if (!keep)
			casidx_segment_close(&os->seg);
	}
	array_clear(&index->segments);
	for (i = 0; i < count; i++)
		array_push_back(&index->segments, &segs[i]);
	manifest_move(&index->manifest, m);
	index->loaded = TRUE;
}

static void index_set_empty(struct casidx_index *index)
{
	index_close_segments(index);
	manifest_free(&index->manifest);
	manifest_init(&index->manifest);
	index->loaded = FALSE;
}

int casidx_index_refresh(struct casidx_index *index, const char **error_r)
{
	struct manifest m;
	struct open_segment *segs;
	unsigned int try;
	int ret;

	index->corrupted = FALSE;
	index->old_format = FALSE;
	for (try = 0; try < REFRESH_RETRIES; try++) {
		ret = manifest_read(index, &m, error_r);
		if (ret <= 0) {
			manifest_free(&m);
			index_set_empty(index);
			return ret;
		}
		if (index->loaded &&
		    m.generation == index->manifest.generation) {
			manifest_free(&m);
			return 1;
		}
		ret = index_open_segments(index, &m, &segs, error_r);
		if (ret > 0) {
			index_set_snapshot(index, &m, segs);
			i_free(segs);
			return 1;
		}
		manifest_free(&m);
		if (ret < 0) {
			index_set_empty(index);
			return -1;
		}
	}
	*error_r = t_strdup_printf("%s: segments keep vanishing", index->dir);
	index_set_empty(index);
	return -1;
}

/* After a commit: the new manifest, but no segment opened. A writer
   (doveadm index, indexer-worker) needs only last_uid, and opening
   would decrypt the whole index into memory at every flush; the next
   casidx_index_refresh() opens the segments for a query. */
static int index_reload_manifest(struct casidx_index *index,
				 const char **error_r)
{
	struct manifest m;
	int ret;

	ret = manifest_read(index, &m, error_r);
	index_close_segments(index);
	if (ret <= 0) {
		manifest_free(&m);
		index_set_empty(index);
		return ret;
	}
	manifest_move(&index->manifest, &m);
	index->loaded = FALSE;
	return 1;
}

void casidx_index_get_stats(const struct casidx_index *index,
			    struct casidx_index_stats *stats_r)
{
	const struct open_segment *os;
	unsigned int decoded, sig;

	i_zero(stats_r);
	stats_r->segments_opened = index->stat_segments_opened;
	stats_r->file_bytes = index->stat_file_bytes;
	stats_r->image_bytes = index->stat_image_bytes;
	array_foreach(&index->segments, os) {
		casidx_segment_get_arena_stats(os->seg, &decoded, &sig);
		stats_r->terms_decoded += decoded;
		stats_r->terms_signed += sig;
		stats_r->terms_total += casidx_segment_term_count(os->seg);
	}
}

uint32_t casidx_index_get_last_uid(const struct casidx_index *index)
{
	return index->manifest.last_uid;
}

uint32_t casidx_index_get_uid_validity(const struct casidx_index *index)
{
	return index->manifest.uid_validity;
}

const roaring_bitmap_t *
casidx_index_get_expunged(const struct casidx_index *index)
{
	return index->manifest.expunged;
}

roaring_bitmap_t *casidx_index_get_universe(const struct casidx_index *index)
{
	roaring_bitmap_t *all = bitmap_create();
	const struct open_segment *os;

	array_foreach(&index->segments, os)
		roaring_bitmap_or_inplace(all,
					  casidx_segment_get_docs(os->seg));
	roaring_bitmap_andnot_inplace(all, index->manifest.expunged);
	return all;
}

void casidx_index_set_corrupted(struct casidx_index *index)
{
	index->corrupted = TRUE;
}

unsigned int casidx_index_get_open_segments(const struct casidx_index *index,
					    struct casidx_segment ***segs_r)
{
	const struct open_segment *os;
	struct casidx_segment **segs;
	unsigned int i = 0, count = array_count(&index->segments);

	segs = t_new(struct casidx_segment *, count + 1);
	array_foreach(&index->segments, os)
		segs[i++] = os->seg;
	*segs_r = segs;
	return count;
}

unsigned int casidx_index_get_segment_count(const struct casidx_index *index)
{
	/* the snapshot's, also before its segments are opened */
	return array_is_created(&index->manifest.seg_ids) ?
		array_count(&index->manifest.seg_ids) : 0;
}

double casidx_index_get_avg_len(const struct casidx_index *index,
				enum casidx_field field)
{
	const struct open_segment *os;
	uint64_t total = 0, docs = 0;

	array_foreach(&index->segments, os) {
		total += casidx_segment_field_total(os->seg, field);
		docs += roaring_bitmap_get_cardinality(
			casidx_segment_get_docs(os->seg));
	}
	return docs == 0 ? 0 : (double)total / docs;
}

uint32_t casidx_index_get_doc_len(const struct casidx_index *index,
				  uint32_t uid, enum casidx_field field)
{
	const struct open_segment *os;
	uint32_t len = 0;

	array_foreach(&index->segments, os)
		len += casidx_segment_doc_len(os->seg, uid, field);
	return len;
}

static bool mem_contains(const unsigned char *hay, size_t hay_len,
			 const char *needle, size_t needle_len)
{
	size_t i;

	if (needle_len == 0)
		return TRUE;
	for (i = 0; i + needle_len <= hay_len; i++) {
		if (hay[i] == (unsigned char)needle[0] &&
		    memcmp(hay + i, needle, needle_len) == 0)
			return TRUE;
	}
	return FALSE;
}

static bool term_matches(const struct casidx_term_entry *entry,
			 const char *token, size_t token_len,
			 enum casidx_match match)
{
	switch (match) {
	case CASIDX_MATCH_EXACT:
		return entry->key_len == token_len + 1;
	case CASIDX_MATCH_PREFIX:
		return TRUE;
	case CASIDX_MATCH_SUBSTRING:
		return mem_contains(entry->key + 1, entry->key_len - 1,
				    token, token_len);
	case CASIDX_MATCH_TYPO:
		break;
	}
	i_unreached();
}

/* TRUE if a and b differ by at most one edit: an insertion, a
   deletion, a substitution or a swap of two neighbours. */
static bool within_one_edit(const unsigned char *a, size_t alen,
			    const unsigned char *b, size_t blen)
{
	size_t i = 0;

	if (alen > blen)
		return within_one_edit(b, blen, a, alen);
	if (blen - alen > 1)
		return FALSE;
	while (i < alen && a[i] == b[i])
		i++;
	if (i == alen)
		return TRUE;
	if (alen == blen) {
		/* substitution, or a swap of i and i+1 */
		if (memcmp(a + i + 1, b + i + 1, alen - i - 1) == 0)
			return TRUE;
		return i + 1 < alen && a[i] == b[i + 1] &&
			a[i + 1] == b[i] &&
			memcmp(a + i + 2, b + i + 2, alen - i - 2) == 0;
	}
	/* b has one byte more: skip it */
	return memcmp(a + i, b + i + 1, alen - i) == 0;
}

struct typo_ctx {
	const unsigned char *token;
	size_t token_len;
};

/* A term (folded or not) that begins with a string within one edit of
   the token. */
static bool typo_filter(const unsigned char *term, size_t term_len,
			void *context)
{
	const struct typo_ctx *ctx = context;
	size_t n = ctx->token_len, len;

	if (term_len > 0 && term[0] == CASIDX_TERM_FOLDED_PREFIX) {
		term++;
		term_len--;
	}
	if (term_len + 1 < n || term_len == 0 || term[0] < 0x20)
		return FALSE;
	for (len = n - 1; len <= n + 1 && len <= term_len; len++) {
		if (within_one_edit(ctx->token, n, term, len))
			return TRUE;
	}
	return FALSE;
}

struct substring_ctx {
	casidx_index_term_callback_t *callback;
	void *context;
	ARRAY_TYPE(uint32_t) tfs;
};

static int substring_entry_cb(struct casidx_segment *seg,
			      const struct casidx_term_entry *entry,
			      void *context, const char **error_r)
{
	struct substring_ctx *ctx = context;
	roaring_bitmap_t *docs;

	if (casidx_segment_read_postings(seg, entry, &docs, &ctx->tfs,
					 error_r) < 0)
		return -1;
	ctx->callback(seg, entry->key + 1, entry->key_len - 1, docs,
		      array_front(&ctx->tfs), ctx->context);
	roaring_bitmap_free(docs);
	return 0;
}

static int
index_scan_segment(struct casidx_segment *seg, const unsigned char *prefix,
		   size_t prefix_len, const char *token, size_t token_len,
		   enum casidx_match match,
		   casidx_index_term_callback_t *callback, void *context,
		   const char **error_r)
{
	struct casidx_segment_iter *iter;
	const struct casidx_term_entry *entry;
	ARRAY_TYPE(uint32_t) tfs;
	roaring_bitmap_t *docs;
	int ret, found = 0;

	if (match == CASIDX_MATCH_SUBSTRING && token_len > 0) {
		struct substring_ctx ctx = {
			.callback = callback, .context = context,
		};

		i_array_init(&ctx.tfs, 64);
		ret = casidx_segment_find_substring(seg, prefix[0], token,
						    token_len,
						    substring_entry_cb, &ctx,
						    error_r);
		array_free(&ctx.tfs);
		return ret;
	}
	if (match == CASIDX_MATCH_TYPO) {
		struct substring_ctx ctx = {
			.callback = callback, .context = context,
		};
		struct typo_ctx tctx = {
			.token = (const unsigned char *)token,
			.token_len = token_len,
		};

		if (token_len < CASIDX_TYPO_MIN_LEN)
			return 0;
		i_array_init(&ctx.tfs, 64);
		ret = casidx_segment_find_terms(seg, prefix[0], typo_filter,
						&tctx, substring_entry_cb,
						&ctx, error_r);
		array_free(&ctx.tfs);
		return ret;
	}
	i_array_init(&tfs, 64);
	iter = casidx_segment_iter_init(seg, prefix, prefix_len);
	while ((ret = casidx_segment_iter_next(iter, &entry)) > 0) {
		if (!term_matches(entry, token, token_len, match))
			continue;
		if (casidx_segment_read_postings(seg, entry, &docs, &tfs,
						 error_r) < 0) {
			found = -1;
			break;
		}
		found = 1;
		callback(seg, entry->key + 1, entry->key_len - 1, docs,
			 array_front(&tfs), context);
		roaring_bitmap_free(docs);
	}
	if (casidx_segment_iter_deinit(&iter, error_r) < 0)
		found = -1;
	array_free(&tfs);
	return found;
}

/* index_scan_segment() over every open segment (dtgrams_only: those
   that have dtgrams). Returns 1 if any matched, 0 if none, -1 with the
   index marked corrupted. */
static int
index_scan_segments(struct casidx_index *index, const unsigned char *prefix,
		    size_t prefix_len, const char *token, size_t token_len,
		    enum casidx_match match, bool dtgrams_only,
		    casidx_index_term_callback_t *callback, void *context,
		    const char **error_r)
{
	const struct open_segment *os;
	int ret, found = 0;

	array_foreach(&index->segments, os) {
		if (dtgrams_only && !casidx_segment_has_dtgrams(os->seg))
			continue;
		ret = index_scan_segment(os->seg, prefix, prefix_len, token,
					 token_len, match, callback, context,
					 error_r);
		if (ret < 0) {
			/* segments are mmapped: every failure is bad bytes */
			index->corrupted = TRUE;
			*error_r = t_strdup_printf("%s: %s", index->dir,
						   *error_r);
			return -1;
		}
		if (ret > 0)
			found = 1;
	}
	return found;
}

int casidx_index_scan(struct casidx_index *index, enum casidx_field field,
		      const char *token, size_t token_len,
		      enum casidx_match match,
		      casidx_index_term_callback_t *callback, void *context,
		      const char **error_r)
{
	buffer_t *prefix;

	i_assert(field < CASIDX_FIELD_SPACE_COUNT);
	prefix = t_buffer_create(token_len + 1);
	buffer_append_c(prefix, CASIDX_FIELD_KEY_CHAR(field));
	if (match != CASIDX_MATCH_SUBSTRING && match != CASIDX_MATCH_TYPO)
		buffer_append(prefix, token, token_len);

	return index_scan_segments(index, prefix->data, prefix->used, token,
				   token_len, match, FALSE, callback, context,
				   error_r);
}

void casidx_index_or_docs_cb(struct casidx_segment *seg ATTR_UNUSED,
			     const unsigned char *term ATTR_UNUSED,
			     size_t term_len ATTR_UNUSED,
			     const roaring_bitmap_t *docs,
			     const uint32_t *tfs ATTR_UNUSED, void *context)
{
	roaring_bitmap_or_inplace(context, docs);
}

int casidx_index_lookup_dtgram(struct casidx_index *index,
			       enum casidx_field field,
			       const void *gram, size_t gram_len,
			       roaring_bitmap_t *docs, const char **error_r)
{
	unsigned char key[CASIDX_TERM_MAX_BYTES + 1];

	i_assert(field < CASIDX_FIELD_COUNT);
	i_assert(gram_len > 0 && gram_len <= CASIDX_TERM_MAX_BYTES);
	key[0] = CASIDX_DTGRAM_KEY_CHAR(field);
	memcpy(key + 1, gram, gram_len);
	return index_scan_segments(index, key, gram_len + 1, gram, gram_len,
				   CASIDX_MATCH_EXACT, TRUE,
				   casidx_index_or_docs_cb, docs, error_r);
}

void casidx_index_add_docs_without_dtgrams(const struct casidx_index *index,
					   roaring_bitmap_t *docs)
{
	const struct open_segment *os;

	array_foreach(&index->segments, os) {
		if (!casidx_segment_has_dtgrams(os->seg)) {
			roaring_bitmap_or_inplace(docs,
				casidx_segment_get_docs(os->seg));
		}
	}
}

void
casidx_index_add_docs_without_raw_addresses(const struct casidx_index *index,
					    roaring_bitmap_t *docs)
{
	const struct open_segment *os;

	array_foreach(&index->segments, os) {
		if (!casidx_segment_has_raw_addresses(os->seg)) {
			roaring_bitmap_or_inplace(docs,
				casidx_segment_get_docs(os->seg));
		}
	}
}

/* ---- writing ---- */

static void index_unlock(int *fd, struct file_lock **lock);

static int index_lock(struct casidx_index *index, int *fd_r,
		      struct file_lock **lock_r, const char **error_r)
{
	struct file_lock_settings lock_set = {
		.lock_method = FILE_LOCK_METHOD_FCNTL,
	};
	const char *path = t_strdup_printf("%s/"LOCK_NAME, index->dir);
	struct stat st, fst;
	unsigned int tries;
	int fd, ret;

	if (mkdir_parents(index->dir, 0700) < 0 && errno != EEXIST) {
		*error_r = t_strdup_printf("mkdir(%s) failed: %m", index->dir);
		return -1;
	}
	for (tries = 0;; tries++) {
		fd = open(path, O_RDWR | O_CREAT, 0600);
		if (fd == -1) {
			*error_r = t_strdup_printf("open(%s) failed: %m",
						   path);
			return -1;
		}
		ret = file_wait_lock(fd, path, F_WRLCK, &lock_set,
				     index->set.lock_timeout_secs, lock_r,
				     error_r);
		if (ret <= 0) {
			if (ret == 0) {
				*error_r = t_strdup_printf("%s: lock timeout",
							   path);
			}
			i_close_fd(&fd);
			return -1;
		}
		/* the lock is on the file the path names now: else the
		   file was replaced while we waited (an index deleted by
		   a build before casidx_index_delete() kept it), and a
		   process that opened the path since holds another lock
		   at the same time */
		if (fstat(fd, &fst) == 0 && stat(path, &st) == 0 &&
		    st.st_ino == fst.st_ino && st.st_dev == fst.st_dev)
			break;
		index_unlock(&fd, lock_r);
		if (tries >= 10) {
			*error_r = t_strdup_printf("%s: replaced while "
						   "locking, 10 times", path);
			return -1;
		}
	}
	*fd_r = fd;
	return 0;
}

static void index_unlock(int *fd, struct file_lock **lock)
{
	file_unlock(lock);
	i_close_fd(fd);
}

static int merge_segment(struct casidx_builder *builder,
			 struct casidx_segment *seg,
			 const roaring_bitmap_t *expunged,
			 const char **error_r)
{
	struct casidx_segment_iter *iter;
	const struct casidx_term_entry *entry;
	ARRAY_TYPE(uint32_t) tfs, pos, pos_idx;
	roaring_uint32_iterator_t *it;
	uint32_t lens[CASIDX_FIELD_COUNT], uid;
	unsigned char key[CASIDX_TERM_MARKER_LEN + 1];
	const uint32_t *codes, *idx;
	roaring_bitmap_t *docs;
	unsigned int i, f;
	int ret;

	it = roaring_create_iterator(casidx_segment_get_docs(seg));
	for (; it->has_value; roaring_advance_uint32_iterator(it)) {
		uid = it->current_value;
		if (roaring_bitmap_contains(expunged, uid))
			continue;
		for (f = 0; f < CASIDX_FIELD_COUNT; f++)
			lens[f] = casidx_segment_doc_len(seg, uid, f);
		casidx_builder_add_doc_lens(builder, uid, lens);
		if (!casidx_segment_has_raw_addresses(seg)) {
			/* its raw address values stay in the header
			   field: the merged segment says so per doc */
			key[0] = CASIDX_FIELD_KEY_CHAR(CASIDX_FIELD_HEADER);
			memcpy(key + 1, CASIDX_TERM_RAWHDR,
			       CASIDX_TERM_MARKER_LEN);
			casidx_builder_add_posting(builder, key,
				CASIDX_TERM_MARKER_LEN + 1, uid, 1);
		}
		if (casidx_segment_has_dtgrams(seg))
			continue;
		/* written before dtgrams: the merged segment says so */
		for (f = 0; f < CASIDX_FIELD_COUNT; f++) {
			key[0] = CASIDX_FIELD_KEY_CHAR(f);
			memcpy(key + 1, CASIDX_TERM_DTPARTIAL,
			       CASIDX_TERM_MARKER_LEN);
			casidx_builder_add_posting(builder, key,
				CASIDX_TERM_MARKER_LEN + 1, uid, 1);
		}
	}
	roaring_free_uint32_iterator(it);

	i_array_init(&tfs, 64);
	i_array_init(&pos, 64);
	i_array_init(&pos_idx, 64);
	iter = casidx_segment_iter_init(seg, NULL, 0);
	while ((ret = casidx_segment_iter_next(iter, &entry)) > 0) {
		if (casidx_segment_read_positions(seg, entry, &docs, &tfs,
						  &pos, &pos_idx,
						  error_r) < 0) {
			ret = -1;
			break;
		}
		codes = array_count(&pos) == 0 ? NULL : array_front(&pos);
		idx = array_front(&pos_idx);
		it = roaring_create_iterator(docs);
		for (i = 0; it->has_value;
		     roaring_advance_uint32_iterator(it), i++) {
			uid = it->current_value;
			if (roaring_bitmap_contains(expunged, uid))
				continue;
			casidx_builder_add_posting_pos(builder, entry->key,
				entry->key_len, uid, (array_front(&tfs))[i],
				codes == NULL ? NULL : codes + idx[i],
				idx[i + 1] - idx[i]);
		}
		roaring_free_uint32_iterator(it);
		roaring_bitmap_free(docs);
	}
	array_free(&tfs);
	array_free(&pos);
	array_free(&pos_idx);
	if (casidx_segment_iter_deinit(&iter, error_r) < 0 || ret < 0)
		return -1;
	return 0;
}

/* The size of segment id's image, which is what a merge holds in
   memory: the file size, or for a sealed index the image size its
   header gives (a compressed file is about half of it). 0 if unknown. */
static uint64_t seg_file_size(struct casidx_index *index, uint32_t id)
{
	unsigned char header[20];
	uint64_t image_size;
	struct stat st;
	ssize_t ret;
	int fd;

	if (index->keyring == NULL) {
		return stat(seg_path(index, id), &st) < 0 ? 0 :
			(uint64_t)st.st_size;
	}
	if ((fd = open(seg_path(index, id), O_RDONLY)) < 0)
		return 0;
	if (fstat(fd, &st) < 0 ||
	    (ret = pread(fd, header, sizeof(header), 0)) < 0 ||
	    casidx_crypt_image_size(header, ret, st.st_size,
				    &image_size) < 0)
		image_size = 0;
	i_close_fd(&fd);
	return image_size;
}

/* A merge holds the merged postings in memory (several times the input
   file size), so its input is bounded by a share of the memory budget. */
static uint64_t merge_max_bytes(const struct casidx_index *index)
{
	if (index->set.merge_max_bytes != 0)
		return index->set.merge_max_bytes;
	return I_MAX(index->set.memory_budget / 16, CASIDX_MERGE_MIN_BYTES);
}

/* Which newest segments [start, count) to merge. Tiered like a binary
   counter: the newest segments are merged while together they hold at
   least as many docs as the next older one, so sizes stay geometric,
   their number logarithmic and each doc is rewritten O(log n) times
   however small the commits (autoindex commits one message at a time).
   Over merge_threshold segments, the newest are merged regardless of
   their doc counts. Both within merge_max_bytes of input. Returns the
   segment count if nothing is to be merged. */
static unsigned int merge_plan(struct casidx_index *index,
			       const struct manifest *m)
{
	const uint32_t *docs, *ids;
	unsigned int count, docs_count, start;
	uint64_t sum, bytes, max = merge_max_bytes(index), size;
	bool over = array_count(&m->seg_ids) > index->set.merge_threshold;

	ids = array_get(&m->seg_ids, &count);
	docs = array_get(&m->seg_docs, &docs_count);
	i_assert(docs_count == count);
	if (count < 2)
		return count;
	start = count - 1;
	sum = docs[start];
	bytes = seg_file_size(index, ids[start]);
	while (start > 0 && (over || docs[start - 1] <= sum)) {
		size = seg_file_size(index, ids[start - 1]);
		if (bytes + size > max)
			break;
		start--;
		sum += docs[start];
		bytes += size;
	}
	return count - start >= 2 ? start : count;
}

/* Merge segments [start, end) of m into one new segment placed at start,
   dropping expunged docs; m is updated. */
static int index_merge_locked(struct casidx_index *index, struct manifest *m,
			      unsigned int start, unsigned int end,
			      const char **error_r)
{
	struct casidx_builder *builder;
	struct casidx_segment *seg;
	const uint32_t *ids;
	uint32_t new_id = 0, new_docs;
	unsigned int i, count;
	bool corrupted;
	int ret = 0;

	ids = array_get(&m->seg_ids, &count);
	i_assert(start < end && end <= count);
	builder = casidx_builder_create();
	for (i = start; i < end; i++) {
		if (index_seg_open(index, ids[i], &seg, &corrupted,
				   error_r) <= 0) {
			if (ret == 0)
				*error_r = t_strdup_printf(
					"%s: segment missing", index->dir);
			ret = -1;
			break;
		}
		ret = merge_segment(builder, seg, m->expunged, error_r);
		casidx_segment_close(&seg);
		if (ret < 0)
			break;
	}
	/* casidx_crypt_open_scratch() left it wiped */
	if (index->open_scratch != NULL)
		buffer_free(&index->open_scratch);
	new_docs = casidx_builder_doc_count(builder);
	if (ret == 0 && new_docs > 0) {
		new_id = m->next_seg_id++;
		ret = index_seg_write(index, new_id, &builder, error_r);
	}
	if (builder != NULL)
		casidx_builder_destroy(&builder);
	if (ret < 0)
		return -1;
	array_delete(&m->seg_ids, start, end - start);
	array_delete(&m->seg_docs, start, end - start);
	if (new_docs > 0) {
		array_insert(&m->seg_ids, start, &new_id, 1);
		array_insert(&m->seg_docs, start, &new_docs, 1);
	}
	return 0;
}

/* optimize: rewrite every segment without its expunged docs, merging
   neighbours in groups within merge_max_bytes. */
static int index_optimize_locked(struct casidx_index *index,
				 struct manifest *m, const char **error_r)
{
	const uint32_t *ids;
	unsigned int i = 0, j, count;
	uint64_t bytes, size, max = merge_max_bytes(index);
	bool expunges = !roaring_bitmap_is_empty(m->expunged);

	while (i < array_count(&m->seg_ids)) {
		ids = array_get(&m->seg_ids, &count);
		bytes = seg_file_size(index, ids[i]);
		for (j = i + 1; j < count; j++) {
			size = seg_file_size(index, ids[j]);
			if (bytes + size > max)
				break;
			bytes += size;
		}
		if (j - i >= 2 || expunges) {
			if (index_merge_locked(index, m, i, j, error_r) < 0)
				return -1;
			if (array_count(&m->seg_ids) < count - (j - i) + 1)
				continue; /* all expunged: nothing at i */
		}
		i++;
	}
	if (m->last_uid > 0) {
		/* merged docs are gone: only future UIDs stay expunged */
		roaring_bitmap_remove_range_closed(m->expunged, 0,
						   m->last_uid);
	}
	return 0;
}

static void index_unlink_unused(struct casidx_index *index,
				const struct manifest *old,
				const struct manifest *new)
{
	const uint32_t *id, *id2;
	bool used;

	array_foreach(&old->seg_ids, id) {
		used = FALSE;
		array_foreach(&new->seg_ids, id2) {
			if (*id == *id2)
				used = TRUE;
		}
		if (!used)
			i_unlink_if_exists(seg_path(index, *id));
	}
}

/* The on-disk UIDs belong to another UIDVALIDITY: forget them all (the
   segments stay in the unlink list). */
static void manifest_reset_uids(struct manifest *m)
{
	array_clear(&m->seg_ids);
	array_clear(&m->seg_docs);
	roaring_bitmap_free(m->expunged);
	m->expunged = bitmap_create();
	m->last_uid = 0;
}

/* Commit *builderp (builderp may be NULL) and expunges under the writer
   lock. *builderp may be destroyed (set to NULL) as its segment is
   written. */
static int index_commit(struct casidx_index *index,
			struct casidx_builder **builderp,
			const roaring_bitmap_t *expunges,
			uint32_t uid_validity, bool merge_all,
			const char **error_r)
{
	struct casidx_builder *builder = builderp == NULL ? NULL : *builderp;
	struct manifest m, old;
	struct file_lock *lock;
	uint32_t id, docs, max_uid;
	unsigned int start;
	int fd, ret;

	if (index_lock(index, &fd, &lock, error_r) < 0)
		return -1;
	ret = manifest_read(index, &m, error_r);
	if (ret >= 0) {
		manifest_init(&old);
		array_append_array(&old.seg_ids, &m.seg_ids);
		ret = 0;
	} else {
		manifest_free(&m);
		index_unlock(&fd, &lock);
		return -1;
	}
	if (uid_validity != 0) {
		if (m.uid_validity != 0 && m.uid_validity != uid_validity)
			manifest_reset_uids(&m);
		m.uid_validity = uid_validity;
	}
	/* Another process (indexer-worker vs. doveadm index) may have
	   indexed the same mails while we built ours: a UID is indexed
	   once, or its terms would count twice in BM25 and in merges. */
	if (builder != NULL)
		casidx_builder_drop_upto(builder, m.last_uid);
	if (builder != NULL && casidx_builder_doc_count(builder) > 0) {
		id = m.next_seg_id++;
		docs = casidx_builder_doc_count(builder);
		max_uid = casidx_builder_max_uid(builder);
		ret = index_seg_write(index, id, builderp, error_r);
		if (ret == 0) {
			array_push_back(&m.seg_ids, &id);
			array_push_back(&m.seg_docs, &docs);
			/* a merge below may replace it at once: then it
			   must be unlinked like the old ones */
			array_push_back(&old.seg_ids, &id);
			m.last_uid = I_MAX(m.last_uid, max_uid);
		}
	}
	if (ret == 0 && expunges != NULL)
		roaring_bitmap_or_inplace(m.expunged, expunges);
	if (ret == 0 && merge_all)
		ret = index_optimize_locked(index, &m, error_r);
	else if (ret == 0) {
		start = merge_plan(index, &m);
		if (start < array_count(&m.seg_ids)) {
			ret = index_merge_locked(index, &m, start,
						 array_count(&m.seg_ids),
						 error_r);
		}
	}
	if (ret == 0) {
		m.generation++;
		ret = manifest_write(index, &m, error_r);
	}
	if (ret == 0)
		index_unlink_unused(index, &old, &m);
	index_unlock(&fd, &lock);
	manifest_free(&m);
	manifest_free(&old);
	if (ret < 0)
		return -1;
	return index_reload_manifest(index, error_r) < 0 ? -1 : 0;
}

struct casidx_index_writer *
casidx_index_writer_begin(struct casidx_index *index)
{
	struct casidx_index_writer *writer;

	writer = i_new(struct casidx_index_writer, 1);
	writer->index = index;
	writer->builder = casidx_builder_create();
	writer->expunges = bitmap_create();
	return writer;
}

void casidx_index_writer_add_doc(struct casidx_index_writer *writer,
				 uint32_t uid)
{
	casidx_builder_add_doc(writer->builder, uid);
	writer->doc_mem_start = casidx_builder_memory_used(writer->builder);
	writer->doc_truncated = FALSE;
}

void casidx_index_writer_add_term(struct casidx_index_writer *writer,
				  enum casidx_field field,
				  const void *term, size_t term_len)
{
	casidx_index_writer_add_term_pos(writer, field, term, term_len,
					 CASIDX_POS_NONE);
}

void casidx_index_writer_add_term_pos(struct casidx_index_writer *writer,
				      enum casidx_field field,
				      const void *term, size_t term_len,
				      uint32_t pos_code)
{
	/* The budget is checked between documents, so one document must
	   not take more than half of it: a message of millions of distinct
	   words (22 MB of random ones took 580 MB) would otherwise run the
	   indexer-worker out of its 256 MB on every retry. */
	enum casidx_field f;

	if (writer->doc_truncated)
		return;
	if (casidx_builder_memory_used(writer->builder) -
	    writer->doc_mem_start >= casidx_index_writer_doc_limit(writer)) {
		/* what is left of the document is unindexed: searches
		   answer it "maybe" */
		writer->doc_truncated = TRUE;
		for (f = 0; f < CASIDX_FIELD_SPACE_COUNT; f++) {
			casidx_builder_add_term(writer->builder, f,
						CASIDX_TERM_UNINDEXED,
						CASIDX_TERM_MARKER_LEN);
			casidx_builder_add_term(writer->builder, f,
						CASIDX_TERM_DTPARTIAL,
						CASIDX_TERM_MARKER_LEN);
		}
		return;
	}
	casidx_builder_add_term_pos(writer->builder, field, term, term_len,
				    pos_code);
}

void casidx_index_writer_add_dtgram(struct casidx_index_writer *writer,
				    enum casidx_field field,
				    const void *gram, size_t gram_len,
				    uint32_t pos_code)
{
	unsigned char key[CASIDX_TERM_MAX_BYTES + 1];

	i_assert(field < CASIDX_FIELD_COUNT);
	i_assert(gram_len > 0 && gram_len <= CASIDX_TERM_MAX_BYTES);
	if (writer->doc_truncated)
		return;
	if (casidx_builder_memory_used(writer->builder) -
	    writer->doc_mem_start >= casidx_index_writer_doc_limit(writer)) {
		/* the next term marks the document truncated */
		casidx_index_writer_add_term(writer, field,
					     CASIDX_TERM_DTPARTIAL,
					     CASIDX_TERM_MARKER_LEN);
		return;
	}
	key[0] = CASIDX_DTGRAM_KEY_CHAR(field);
	memcpy(key + 1, gram, gram_len);
	casidx_builder_add_key(writer->builder, key, gram_len + 1, pos_code);
}

size_t casidx_index_writer_doc_limit(const struct casidx_index_writer *writer)
{
	return writer->index->set.memory_budget / 2;
}

bool casidx_index_writer_doc_truncated(const struct casidx_index_writer *writer)
{
	return writer->doc_truncated;
}

void casidx_index_writer_set_uid_validity(struct casidx_index_writer *writer,
					  uint32_t uid_validity)
{
	writer->uid_validity = uid_validity;
}

void casidx_index_writer_expunge(struct casidx_index_writer *writer,
				 uint32_t uid)
{
	roaring_bitmap_add(writer->expunges, uid);
}

static int writer_flush(struct casidx_index_writer *writer,
			const char **error_r)
{
	int ret;

	ret = index_commit(writer->index, &writer->builder,
			   writer->expunges, writer->uid_validity, FALSE,
			   error_r);
	if (writer->builder != NULL)
		casidx_builder_destroy(&writer->builder);
	writer->builder = casidx_builder_create();
	roaring_bitmap_free(writer->expunges);
	writer->expunges = bitmap_create();
	writer->flushes++;
	return ret;
}

int casidx_index_writer_doc_done(struct casidx_index_writer *writer,
				 const char **error_r)
{
	/* The builder gets a quarter of the budget: writing a segment
	   holds its image (and a sealed copy) next to the builder, and the
	   estimate leaves out malloc's and the hash table's overhead. At
	   the full budget, doveadm index of 3000 messages peaked at 86 MB
	   with the default 64 MB; at a quarter at 58 MB. */
	if (casidx_builder_memory_used(writer->builder) <
	    writer->index->set.memory_budget / CASIDX_BUILDER_BUDGET_SHARE)
		return 0;
	return writer_flush(writer, error_r);
}

bool casidx_index_writer_has_changes(const struct casidx_index_writer *writer)
{
	return casidx_builder_doc_count(writer->builder) > 0 ||
		!roaring_bitmap_is_empty(writer->expunges);
}

int casidx_index_writer_commit(struct casidx_index_writer **_writer,
			       const char **error_r)
{
	struct casidx_index_writer *writer = *_writer;
	int ret = 0;

	if (casidx_index_writer_has_changes(writer))
		ret = writer_flush(writer, error_r);
	casidx_index_writer_rollback(_writer);
	return ret;
}

void casidx_index_writer_rollback(struct casidx_index_writer **_writer)
{
	struct casidx_index_writer *writer = *_writer;

	*_writer = NULL;
	casidx_builder_destroy(&writer->builder);
	roaring_bitmap_free(writer->expunges);
	i_free(writer);
}

unsigned int
casidx_index_writer_get_flushes(const struct casidx_index_writer *writer)
{
	return writer->flushes;
}

int casidx_index_optimize(struct casidx_index *index, const char **error_r)
{
	return index_commit(index, NULL, NULL, 0, TRUE, error_r);
}

int casidx_index_reseal(struct casidx_index *index, unsigned int *resealed_r,
			const char **error_r)
{
	struct manifest m;
	struct file_lock *lock;
	const uint32_t *id;
	buffer_t *sealed, *resealed;
	const char *path;
	int fd, ret;

	*resealed_r = 0;
	if (index->keyring == NULL)
		return 0;
	/* under the write lock: no merge replaces a segment meanwhile */
	if (index_lock(index, &fd, &lock, error_r) < 0)
		return -1;
	ret = manifest_read(index, &m, error_r);
	if (ret > 0) {
		ret = 0;
		resealed = buffer_create_dynamic(default_pool, 1024);
		array_foreach(&m.seg_ids, id) {
			path = seg_path(index, *id);
			if ((ret = read_file(path, &sealed, error_r)) <= 0) {
				if (ret == 0)
					continue; /* a reader may see it too */
				break;
			}
			buffer_set_used_size(resealed, 0);
			ret = casidx_crypt_reseal(index->keyring,
						  index->box_guid,
						  seg_name(*id), sealed->data,
						  sealed->used, resealed,
						  error_r);
			buffer_free(&sealed);
			if (ret < 0) {
				*error_r = t_strdup_printf("%s: %s", path,
							   *error_r);
				break;
			}
			/* the directory fsync makes the rename durable
			   before the old epoch may be dropped */
			if (ret > 0) {
				ret = index_file_write(index, path,
					resealed->data, resealed->used,
					TRUE, error_r);
				if (ret < 0)
					break;
				(*resealed_r)++;
			}
		}
		buffer_free(&resealed);
	}
	manifest_free(&m);
	index_unlock(&fd, &lock);
	return ret < 0 ? -1 : 0;
}

/* Every file of the index directory but the lock file. */
static int index_unlink_all_but_lock(struct casidx_index *index,
				     const char **error_r)
{
	struct dirent *d;
	const char *path;
	DIR *dir;
	int ret = 0;

	dir = opendir(index->dir);
	if (dir == NULL) {
		if (errno == ENOENT)
			return 0;
		*error_r = t_strdup_printf("opendir(%s) failed: %m",
					   index->dir);
		return -1;
	}
	while ((d = readdir(dir)) != NULL) {
		if (strcmp(d->d_name, ".") == 0 ||
		    strcmp(d->d_name, "..") == 0 ||
		    strcmp(d->d_name, LOCK_NAME) == 0 ||
		    d->d_type == DT_DIR)
			continue;
		path = t_strdup_printf("%s/%s", index->dir, d->d_name);
		if (unlink(path) < 0 && errno != ENOENT && ret == 0) {
			*error_r = t_strdup_printf("unlink(%s) failed: %m",
						   path);
			ret = -1;
		}
	}
	if (closedir(dir) < 0 && ret == 0) {
		*error_r = t_strdup_printf("closedir(%s) failed: %m",
					   index->dir);
		ret = -1;
	}
	return ret;
}

int casidx_index_delete(struct casidx_index *index, const char **error_r)
{
	struct file_lock *lock;
	const char *error;
	int fd, ret = 0;

	if (index_lock(index, &fd, &lock, error_r) < 0)
		return -1;
	/* the manifest goes first, so no reader sees a partial index;
	   the lock file stays: a process waiting for the lock on it must
	   not get it while another one locks a new file of that name
	   (two writers: the second's segments unlinked by the first, the
	   soak's "segment missing") */
	i_unlink_if_exists(t_strdup_printf("%s/"MANIFEST_NAME, index->dir));
	if (index_unlink_all_but_lock(index, &error) < 0) {
		*error_r = error;
		ret = -1;
	}
	index_unlock(&fd, &lock);
	index_set_empty(index);
	return ret;
}
