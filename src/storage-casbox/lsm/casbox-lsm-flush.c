/* Writing side: WAL appends, flush of the memtable into a table,
   compaction, the manifest swap, removal of unreferenced files, and
   verification. Everything here runs under the store's write lock.

   File removal rule: a file is unlinked as soon as the manifest that
   stops referencing it is durable. Readers never need a file by name
   after they loaded a manifest: they keep every table and their WAL
   open, and POSIX keeps unlinked open files readable. A reader that
   finds a file missing while loading re-reads the manifest. (Not safe
   on NFS, which has no such guarantee.) */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "strnum.h"
#include "cas-durable.h"
#include "casbox-lsm-state.h"

#include <fcntl.h>
#include <dirent.h>

static int lsm_write_all(struct casbox_lsm *lsm, int fd, const char *path,
			 const void *data, size_t size, uoff_t offset,
			 const char **error_r)
{
	ssize_t ret;

	ret = lsm->io->pwrite(fd, data, size, offset);
	if (ret < 0 || (size_t)ret != size) {
		if (ret >= 0)
			errno = ENOSPC;
		*error_r = t_strdup_printf("write(%s) failed: %m",
					   casbox_lsm_wal_path(lsm, path));
		return -1;
	}
	return 0;
}

static int lsm_fsync(struct casbox_lsm *lsm, int fd, const char *path,
		     const char **error_r)
{
	if (!lsm->set.fsync)
		return 0;
	if (lsm->io->fsync(fd) < 0) {
		*error_r = t_strdup_printf("fsync(%s) failed: %m",
					   casbox_lsm_wal_path(lsm, path));
		return -1;
	}
	return 0;
}

static int lsm_fsync_dir(struct casbox_lsm *lsm, const char **error_r)
{
	if (!lsm->set.fsync)
		return 0;
	return cas_durable_fsync_dir(lsm->io, lsm->dir, error_r);
}

int casbox_lsm_wal_create(struct casbox_lsm *lsm, uint64_t wal_no,
			  uint32_t *epoch_r, const char **error_r)
{
	const char *path = casbox_lsm_path(lsm, wal_no, "wal");
	buffer_t *buf = t_buffer_create(CASBOX_LSM_WAL_HEADER_MAX);
	const struct casbox_lsm_key *key;
	int fd, ret = 0;

	if (casbox_lsm_write_key(lsm, &key, error_r) < 0)
		return -1;
	*epoch_r = key == NULL ? CASBOX_LSM_EPOCH_PLAINTEXT : key->epoch;

	fd = lsm->io->open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	casbox_lsm_wal_header_write(buf, wal_no, *epoch_r);
	if (lsm_write_all(lsm, fd, path, buf->data, buf->used, 0,
			  error_r) < 0 ||
	    lsm_fsync(lsm, fd, path, error_r) < 0)
		ret = -1;
	(void)lsm->io->close(fd);
	return ret;
}

int casbox_lsm_manifest_write(struct casbox_lsm *lsm,
			      struct casbox_lsm_manifest *man,
			      const char **error_r)
{
	const struct casbox_lsm_key *key;
	const struct cas_durable_write_settings set = {
		.io = lsm->io,
		.tmp_path = t_strconcat(lsm->manifest_path, ".tmp", NULL),
		.tmp_truncate = TRUE,
		.no_fsync = !lsm->set.fsync,
	};
	buffer_t *buf = t_buffer_create(256);

	/* the new tables and WAL must be durable before anything names
	   them */
	if (lsm_fsync_dir(lsm, error_r) < 0)
		return -1;
	if (casbox_lsm_write_key(lsm, &key, error_r) < 0)
		return -1;
	man->sealed = key != NULL;
	if (key != NULL) {
		man->mac_epoch = key->epoch;
		memcpy(man->fingerprint, lsm->set.codec->fingerprint,
		       sizeof(man->fingerprint));
	}
	casbox_lsm_manifest_encode(man, key, buf);
	return cas_durable_write_atomic(lsm->manifest_path, buf->data,
					buf->used, &set, error_r);
}

int casbox_lsm_wal_cut_tail(struct casbox_lsm *lsm, const char **error_r)
{
	const char *path;

	if (lsm->wal_file_size <= lsm->wal_offset)
		return 0;
	/* we hold the lock, so nobody is writing: the bytes past the last
	   complete record are a torn batch that was never acknowledged */
	path = casbox_lsm_path(lsm, lsm->wal_no, "wal");
	if (lsm->io->ftruncate(lsm->wal_fd, lsm->wal_offset) < 0) {
		*error_r = t_strdup_printf("ftruncate(%s) failed: %m", path);
		return -1;
	}
	if (lsm_fsync(lsm, lsm->wal_fd, path, error_r) < 0)
		return -1;
	lsm->wal_file_size = lsm->wal_offset;
	return 0;
}

static void lsm_apply(void *context, uint64_t seq, enum casbox_lsm_type type,
		      const unsigned char *key, size_t key_size,
		      const unsigned char *value, size_t value_size)
{
	casbox_lsm_memtable_add(context, seq, type, key, key_size,
				value, value_size);
}

int casbox_lsm_wal_append(struct casbox_lsm *lsm, const buffer_t *entries,
			  unsigned int count, bool sync, const char **error_r)
{
	const char *path = NULL; /* the WAL's, built only for errors */
	const char *error;
	buffer_t *rec = lsm->write_buf;
	int ret;

	if (entries->used + 12 > CASBOX_LSM_WAL_MAX_PAYLOAD) {
		*error_r = "batch too large";
		return -1;
	}
	buffer_set_used_size(rec, 0);
	if (lsm->wal_key != NULL) {
		casbox_lsm_wal_record_encode_sealed(rec, lsm->wal_key,
			lsm->wal_no, lsm->wal_offset, lsm->last_seq + 1,
			count, entries);
	} else {
		casbox_lsm_wal_record_encode(rec, lsm->last_seq + 1, count,
					     entries);
	}
	ret = lsm_write_all(lsm, lsm->wal_fd, path, rec->data, rec->used,
			    lsm->wal_offset, error_r);
	if (ret == 0 && sync)
		ret = lsm_fsync(lsm, lsm->wal_fd, path, error_r);
	if (ret < 0) {
		/* not acknowledged: make sure nobody ever applies it */
		if (lsm->io->ftruncate(lsm->wal_fd, lsm->wal_offset) < 0 ||
		    lsm_fsync(lsm, lsm->wal_fd, path, &error) < 0)
			lsm->broken = TRUE;
		return -1;
	}
	casbox_lsm_wal_entries_apply(entries, lsm->last_seq + 1, count,
				     lsm_apply, lsm->mt);
	lsm->wal_offset += rec->used;
	lsm->wal_file_size = lsm->wal_offset;
	lsm->last_seq += count;
	return 0;
}

/* Write src (from its first key) into table file_no. entries_r = 0
   means everything was a dropped delete, and no file is left. */
static int lsm_write_table(struct casbox_lsm *lsm,
			   struct casbox_lsm_source *src, bool drop_deletes,
			   uint64_t file_no, uint64_t *entries_r,
			   uoff_t *size_r, uint32_t *epoch_r,
			   const char **error_r)
{
	const char *path = casbox_lsm_path(lsm, file_no, "sst");
	struct casbox_lsm_table_builder *builder;
	const struct casbox_lsm_key *key;
	int fd, ret = 0;

	if (casbox_lsm_write_key(lsm, &key, error_r) < 0)
		return -1;
	*epoch_r = key == NULL ? CASBOX_LSM_EPOCH_PLAINTEXT : key->epoch;

	fd = lsm->io->open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	builder = casbox_lsm_table_builder_init(lsm->io, fd, path, file_no,
						key);
	for (src->seek(src, (const unsigned char *)"", 0); src->valid;
	     src->next(src)) {
		if (drop_deletes && src->type == CASBOX_LSM_TYPE_DELETE)
			continue;
		if (casbox_lsm_table_builder_add(builder, src->type,
						 src->key, src->key_size,
						 src->value,
						 src->value_size) < 0)
			break;
	}
	*size_r = 0;
	if (casbox_lsm_table_builder_finish(&builder, lsm->set.fsync, size_r,
					    entries_r, error_r) < 0)
		ret = -1;
	else if (src->error != NULL) {
		*error_r = t_strdup(src->error);
		ret = -1;
	}
	(void)lsm->io->close(fd);
	if (ret < 0 || *entries_r == 0)
		(void)lsm->io->unlink(path);
	return ret;
}

static void lsm_manifest_from_state(struct casbox_lsm *lsm,
				    struct casbox_lsm_manifest *man)
{
	casbox_lsm_manifest_init(man);
	man->generation = lsm->generation + 1;
	man->wal_no = lsm->wal_no;
	man->next_file_no = lsm->next_file_no;
	man->last_seq = lsm->flushed_seq;
	man->wal_epoch = lsm->wal_epoch;
}

static void lsm_manifest_add_tables(struct casbox_lsm *lsm,
				    struct casbox_lsm_manifest *man,
				    unsigned int skip)
{
	struct casbox_lsm_table *const *tables;
	struct casbox_lsm_manifest_table *mt;
	unsigned int i, count;

	tables = array_get(&lsm->tables, &count);
	for (i = skip; i < count; i++) {
		mt = array_append_space(&man->tables);
		mt->file_no = casbox_lsm_table_file_no(tables[i]);
		mt->size = casbox_lsm_table_size(tables[i]);
		mt->epoch = casbox_lsm_table_epoch(tables[i]);
	}
}

static bool lsm_file_is_referenced(const struct casbox_lsm_manifest *man,
				   uint64_t file_no, bool wal)
{
	const struct casbox_lsm_manifest_table *mt;

	if (wal)
		return file_no == man->wal_no;
	array_foreach(&man->tables, mt) {
		if (mt->file_no == file_no)
			return TRUE;
	}
	return FALSE;
}

/* Remove every table/WAL the new manifest does not name: the ones it
   replaced and any left by a writer that crashed mid-flush. */
static void lsm_remove_unreferenced(struct casbox_lsm *lsm,
				    const struct casbox_lsm_manifest *man)
{
	struct dirent *d;
	uint64_t file_no;
	const char *ext;
	DIR *dir;

	dir = opendir(lsm->dir);
	if (dir == NULL) {
		i_error("opendir(%s) failed: %m", lsm->dir);
		return;
	}
	while ((d = readdir(dir)) != NULL) {
		if (str_parse_uint64(d->d_name, &file_no, &ext) < 0 ||
		    (strcmp(ext, ".sst") != 0 && strcmp(ext, ".wal") != 0))
			continue;
		if (lsm_file_is_referenced(man, file_no,
					   strcmp(ext, ".wal") == 0))
			continue;
		if (lsm->io->unlink(t_strconcat(lsm->dir, "/", d->d_name,
						NULL)) < 0 && errno != ENOENT)
			i_error("unlink(%s/%s) failed: %m", lsm->dir,
				d->d_name);
	}
	(void)closedir(dir);
}

/* Make man the current manifest and reload from it. */
static int lsm_install(struct casbox_lsm *lsm, struct casbox_lsm_manifest *man,
		       const char **error_r)
{
	int ret;

	if (casbox_lsm_manifest_write(lsm, man, error_r) < 0)
		return -1;
	lsm_remove_unreferenced(lsm, man);
	ret = casbox_lsm_load(lsm, error_r);
	if (ret == 0) {
		*error_r = "MANIFEST vanished";
		ret = -1;
	}
	return ret < 0 ? -1 : 0;
}

/* Send a flush's or merge's named event (doc/events.md). event was
   created when the work began: its duration. tables = 0 for a flush. */
static void lsm_event_finished(struct event *event, const char *name,
			       unsigned int tables, uoff_t input_bytes,
			       uint64_t entries, uoff_t table_bytes)
{
	event_set_name(event, name);
	if (tables > 0)
		event_add_int(event, "tables", tables);
	event_add_int(event, "input_bytes", input_bytes);
	event_add_int(event, "entries", entries);
	/* 0 when nothing was left to write: no table (a forced flush of
	   an empty memtable starts a new WAL only) */
	event_add_int(event, "tables_written", entries > 0 ? 1 : 0);
	event_add_int(event, "table_bytes", table_bytes);
	e_debug(event, "%s: %"PRIu64" entries, %"PRIuUOFF_T" bytes in, "
		"%"PRIuUOFF_T" bytes out", name, entries, input_bytes,
		table_bytes);
}

/* Merge the newest count tables into one. */
static int lsm_merge_tables(struct casbox_lsm *lsm, unsigned int count,
			    const char **error_r)
{
	struct casbox_lsm_table *const *tables;
	struct casbox_lsm_source **sources, *src;
	struct casbox_lsm_manifest man;
	struct casbox_lsm_manifest_table *mt;
	struct event *event;
	unsigned int i, total;
	uint64_t file_no, entries;
	uoff_t input_bytes = 0, size;
	uint32_t epoch;
	int ret;

	event = event_create(lsm->event);
	tables = array_get(&lsm->tables, &total);
	i_assert(count <= total);
	sources = t_new(struct casbox_lsm_source *, count);
	for (i = 0; i < count; i++) {
		sources[i] = casbox_lsm_table_source(tables[i]);
		input_bytes += casbox_lsm_table_size(tables[i]);
	}
	src = casbox_lsm_merge_source(sources, count);
	file_no = lsm->next_file_no++;
	/* deletes can go only when nothing older is left to shadow */
	ret = lsm_write_table(lsm, src, count == total, file_no, &entries,
			      &size, &epoch, error_r);
	casbox_lsm_source_free(&src);
	if (ret < 0) {
		event_unref(&event);
		return -1;
	}

	lsm_manifest_from_state(lsm, &man);
	if (entries > 0) {
		mt = array_append_space(&man.tables);
		mt->file_no = file_no;
		mt->size = size;
		mt->entries = entries;
		mt->epoch = epoch;
	}
	lsm_manifest_add_tables(lsm, &man, count);
	ret = lsm_install(lsm, &man, error_r);
	casbox_lsm_manifest_deinit(&man);
	if (ret == 0) {
		lsm_event_finished(event, "casbox_lsm_compaction_finished",
				   count, input_bytes, entries, size);
	}
	event_unref(&event);
	return ret;
}

/* Size-tiered choice: merge the newest tables while the next older
   one is no bigger than what is merged so far. */
static unsigned int lsm_pick_merge(struct casbox_lsm *lsm)
{
	struct casbox_lsm_table *const *tables;
	unsigned int n, count;
	uoff_t sum;

	tables = array_get(&lsm->tables, &count);
	if (count <= LSM_MAX_TABLES)
		return 0;
	sum = casbox_lsm_table_size(tables[0]) +
		casbox_lsm_table_size(tables[1]);
	for (n = 2; n < count; n++) {
		if (casbox_lsm_table_size(tables[n]) > sum)
			break;
		sum += casbox_lsm_table_size(tables[n]);
	}
	return n;
}

/* force: start a new WAL even when the memtable is empty (a plaintext
   WAL or one of an older epoch is replaced) */
static int lsm_flush_memtable(struct casbox_lsm *lsm, bool force,
			      const char **error_r)
{
	struct casbox_lsm_source *src;
	struct casbox_lsm_manifest man;
	struct casbox_lsm_manifest_table *mt;
	struct event *event;
	uint64_t file_no, wal_no, entries = 0;
	uoff_t wal_bytes = lsm->wal_offset, size = 0;
	uint32_t epoch = CASBOX_LSM_EPOCH_PLAINTEXT, wal_epoch;
	int ret = 0;

	if (casbox_lsm_memtable_count(lsm->mt) == 0 && !force)
		return 0;
	event = event_create(lsm->event);
	file_no = lsm->next_file_no;
	wal_no = file_no + 1;
	if (casbox_lsm_memtable_count(lsm->mt) > 0) {
		src = casbox_lsm_memtable_source(lsm->mt, lsm->last_seq);
		ret = lsm_write_table(lsm, src,
				      array_count(&lsm->tables) == 0,
				      file_no, &entries, &size, &epoch,
				      error_r);
		casbox_lsm_source_free(&src);
	}
	if (ret < 0) {
		event_unref(&event);
		return -1;
	}
	if (casbox_lsm_wal_create(lsm, wal_no, &wal_epoch, error_r) < 0) {
		(void)lsm->io->unlink(casbox_lsm_path(lsm, file_no, "sst"));
		event_unref(&event);
		return -1;
	}
	lsm->next_file_no = wal_no + 1;
	lsm_manifest_from_state(lsm, &man);
	man.wal_no = wal_no;
	man.wal_epoch = wal_epoch;
	man.last_seq = lsm->last_seq;
	if (entries > 0) {
		mt = array_append_space(&man.tables);
		mt->file_no = file_no;
		mt->size = size;
		mt->entries = entries;
		mt->epoch = epoch;
	}
	lsm_manifest_add_tables(lsm, &man, 0);
	ret = lsm_install(lsm, &man, error_r);
	casbox_lsm_manifest_deinit(&man);
	if (ret == 0) {
		lsm_event_finished(event, "casbox_lsm_flush_finished", 0,
				   wal_bytes, entries, size);
	}
	event_unref(&event);
	return ret;
}

int casbox_lsm_flush_locked(struct casbox_lsm *lsm, bool force,
			    const char **error_r)
{
	unsigned int n;

	/* batch_begin did not look at MANIFEST: a merge by another
	   process must not be undone by a manifest built from our list */
	if (casbox_lsm_refresh_full(lsm, TRUE, error_r) < 0)
		return -1;
	if (force ? casbox_lsm_memtable_count(lsm->mt) == 0 :
	    lsm->wal_offset < lsm->wal_flush_bytes)
		return 0;

	if (lsm_flush_memtable(lsm, FALSE, error_r) < 0)
		return -1;
	n = lsm_pick_merge(lsm);
	if (n > 0 && lsm_merge_tables(lsm, n, error_r) < 0)
		return -1;
	return 0;
}

int casbox_lsm_compact(struct casbox_lsm *lsm, const char **error_r)
{
	int ret = 0;

	i_assert(lsm->batch == NULL);
	if (casbox_lsm_lock(lsm, error_r) < 0)
		return -1;
	if (casbox_lsm_refresh(lsm, error_r) < 0 ||
	    casbox_lsm_wal_cut_tail(lsm, error_r) < 0 ||
	    lsm_flush_memtable(lsm, lsm->set.codec != NULL &&
			       lsm->wal_key == NULL, error_r) < 0)
		ret = -1;
	else if (array_count(&lsm->tables) > 1 &&
		 lsm_merge_tables(lsm, array_count(&lsm->tables),
				  error_r) < 0)
		ret = -1;
	casbox_lsm_unlock_state(lsm, ret == 0);
	return ret < 0 ? -1 : 1;
}

int casbox_lsm_flush_wal_locked(struct casbox_lsm *lsm, const char **error_r)
{
	if (casbox_lsm_refresh_full(lsm, TRUE, error_r) < 0)
		return -1;
	return lsm_flush_memtable(lsm, TRUE, error_r);
}

/* Is anything not sealed under the current epoch, or more than one
   table left? */
static bool lsm_reseal_needed(struct casbox_lsm *lsm, uint32_t epoch)
{
	struct casbox_lsm_table *const *tablep;

	if (!lsm->sealed || lsm->mac_epoch != epoch ||
	    lsm->wal_epoch != epoch || array_count(&lsm->tables) > 1)
		return TRUE;
	array_foreach(&lsm->tables, tablep) {
		if (casbox_lsm_table_epoch(*tablep) != epoch)
			return TRUE;
	}
	return FALSE;
}

int casbox_lsm_reseal(struct casbox_lsm *lsm, const char **error_r)
{
	const struct casbox_lsm_codec *codec = lsm->set.codec;
	uint32_t epoch;
	int ret = 0;

	i_assert(lsm->batch == NULL);
	if (codec == NULL) {
		*error_r = "casbox_lsm_reseal() needs a key (codec)";
		return -1;
	}
	if (casbox_lsm_lock(lsm, error_r) < 0)
		return -1;
	epoch = codec->current_epoch(codec->context);
	if (casbox_lsm_refresh_full(lsm, TRUE, error_r) < 0 ||
	    casbox_lsm_wal_cut_tail(lsm, error_r) < 0)
		ret = -1;
	else if (!lsm_reseal_needed(lsm, epoch))
		;
	else if (lsm_flush_memtable(lsm, TRUE, error_r) < 0)
		ret = -1;
	else if (array_count(&lsm->tables) > 0 &&
		 lsm_merge_tables(lsm, array_count(&lsm->tables),
				  error_r) < 0)
		ret = -1;
	casbox_lsm_unlock_state(lsm, ret == 0);
	return ret < 0 ? -1 : 1;
}

/* ---- verify ---- */

static int lsm_verify_wal(struct casbox_lsm *lsm,
			  casbox_lsm_damage_callback_t *report, void *context,
			  const char **error_r)
{
	const char *path = casbox_lsm_path(lsm, lsm->wal_no, "wal");
	const unsigned char *data, *payload;
	size_t size, pos, payload_size, rec_size;
	enum casbox_lsm_wal_status status;
	uint64_t first_seq, file_no;
	uint32_t epoch;
	unsigned int count;
	const char *error;
	struct stat st;
	ssize_t ret;

	if (lsm->io->fstat(lsm->wal_fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", path);
		return -1;
	}
	buffer_set_used_size(lsm->read_buf, 0);
	ret = lsm->io->pread(lsm->wal_fd,
		buffer_append_space_unsafe(lsm->read_buf, st.st_size),
		st.st_size, 0);
	if (ret < 0) {
		*error_r = t_strdup_printf("pread(%s) failed: %m", path);
		return -1;
	}
	data = lsm->read_buf->data;
	size = ret;
	if (casbox_lsm_wal_header_parse(data, size, &file_no, &epoch, &pos,
					&error) < 0) {
		report(context, path, 0, error);
		return 0;
	}
	if (epoch != lsm->wal_epoch) {
		report(context, path, 0, "WAL key epoch changed");
		return 0;
	}
	while (pos < size) {
		status = casbox_lsm_wal_record_parse(data + pos, size - pos,
						     &payload, &payload_size,
						     &rec_size, &error);
		if (status == CASBOX_LSM_WAL_END)
			break;
		if (status == CASBOX_LSM_WAL_OK &&
		    casbox_lsm_wal_payload_open(lsm->wal_key, lsm->wal_no, pos,
						&payload, &payload_size,
						lsm->plain_buf, &error) < 0)
			status = CASBOX_LSM_WAL_CORRUPT;
		else if (status == CASBOX_LSM_WAL_OK &&
		    casbox_lsm_wal_payload_apply(payload, payload_size,
						 &first_seq, &count, NULL,
						 NULL, &error) < 0)
			status = CASBOX_LSM_WAL_CORRUPT;
		if (status == CASBOX_LSM_WAL_CORRUPT) {
			report(context, path, pos, error);
			return 0;
		}
		pos += rec_size;
	}
	return 1;
}

int casbox_lsm_verify(struct casbox_lsm *lsm,
		      casbox_lsm_damage_callback_t *report, void *context,
		      const char **error_r)
{
	struct casbox_lsm_table *const *tablep;
	int ret = 1;

	array_foreach(&lsm->tables, tablep) {
		if (casbox_lsm_table_verify(*tablep, report, context) == 0)
			ret = 0;
	}
	switch (lsm_verify_wal(lsm, report, context, error_r)) {
	case -1:
		return -1;
	case 0:
		ret = 0;
		break;
	}
	return ret;
}
