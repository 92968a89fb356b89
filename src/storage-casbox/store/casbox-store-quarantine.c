/* casbox-store-quarantine: records and frame copies of blobs scrub
   found damaged (see casbox-store-quarantine.h). */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "byteorder.h"
#include "hex-binary.h"
#include "cas-durable.h"
#include "casbox-lsm.h"
#include "casbox-store.h"
#include "casbox-store-census.h"
#include "casbox-store-quarantine.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/stat.h>

#define QUARANTINE_RECORD_FIXED_SIZE (1 + 8 + 4 + 8 + 4)
/* never copy more than a frame can be (chunks of at most 64 KiB) */
#define QUARANTINE_COPY_MAX_SIZE (1024ULL * 1024 * 1024)

void casbox_quarantine_key(buffer_t *dest, const struct cas_blob_id *id)
{
	buffer_append_c(dest, CASBOX_KEY_QUARANTINE);
	buffer_append(dest, id->id, sizeof(id->id));
}

void casbox_quarantine_record_export(const struct casbox_quarantine_record *rec,
				     buffer_t *dest)
{
	unsigned char fixed[QUARANTINE_RECORD_FIXED_SIZE];

	fixed[0] = CASBOX_RECORD_VERSION;
	cpu64_to_be_unaligned((uint64_t)rec->time, fixed + 1);
	cpu32_to_be_unaligned(rec->pack_id, fixed + 9);
	cpu64_to_be_unaligned(rec->offset, fixed + 13);
	cpu32_to_be_unaligned(rec->frame_size, fixed + 21);
	buffer_append(dest, fixed, sizeof(fixed));
	buffer_append(dest, rec->cause, strlen(rec->cause));
}

int casbox_quarantine_record_import(const void *data, size_t size,
				    pool_t pool,
				    struct casbox_quarantine_record *rec_r,
				    const char **error_r)
{
	const unsigned char *p = data;

	if (size < QUARANTINE_RECORD_FIXED_SIZE) {
		*error_r = "quarantine record truncated";
		return -1;
	}
	if (p[0] != CASBOX_RECORD_VERSION) {
		*error_r = t_strdup_printf(
			"quarantine record version %u unsupported", p[0]);
		return -1;
	}
	rec_r->time = (time_t)be64_to_cpu_unaligned(p + 1);
	rec_r->pack_id = be32_to_cpu_unaligned(p + 9);
	rec_r->offset = be64_to_cpu_unaligned(p + 13);
	rec_r->frame_size = be32_to_cpu_unaligned(p + 21);
	rec_r->cause = p_strndup(pool, p + QUARANTINE_RECORD_FIXED_SIZE,
				 size - QUARANTINE_RECORD_FIXED_SIZE);
	return 0;
}

const char *
casbox_quarantine_copy_name(const struct cas_blob_id *id,
			    const struct casbox_quarantine_record *rec)
{
	return t_strdup_printf("%s-pack%u-%"PRIu64".frame",
			       binary_to_hex(id->id, sizeof(id->id)),
			       rec->pack_id, rec->offset);
}

static int
quarantine_copy_bytes(int fd_in, const char *pack_path,
		      struct cas_durable_file *out, uint64_t offset,
		      uint64_t size, const char **error_r)
{
	unsigned char buf[IO_BLOCK_SIZE];
	ssize_t ret;

	while (size > 0) {
		ret = pread(fd_in, buf, I_MIN(size, sizeof(buf)), offset);
		if (ret < 0) {
			*error_r = t_strdup_printf("pread(%s) failed: %m",
						   pack_path);
			return -1;
		}
		if (ret == 0)
			break; /* the pack is shorter: copy what there is */
		if (cas_durable_file_write(out, buf, ret, error_r) < 0)
			return -1;
		offset += ret;
		size -= ret;
	}
	return 0;
}

int casbox_quarantine_copy_frame(const struct cas_io *io,
				 const char *pack_path, const char *path,
				 uint64_t offset, uint64_t size,
				 const char **error_r)
{
	const struct cas_durable_write_settings set = {
		.io = io,
		.tmp_path = t_strconcat(path, ".tmp", NULL),
		.tmp_truncate = TRUE,
	};
	struct cas_durable_file *out;
	int fd_in, ret;

	fd_in = open(pack_path, O_RDONLY | O_CLOEXEC);
	if (fd_in < 0) {
		*error_r = t_strdup_printf("open(%s) failed: %m", pack_path);
		return -1;
	}
	if (cas_durable_file_create(path, &set, &out, error_r) < 0) {
		i_close_fd(&fd_in);
		return -1;
	}
	/* the record's size, or else what the frame header claimed */
	size = I_MIN(size, QUARANTINE_COPY_MAX_SIZE);
	ret = quarantine_copy_bytes(fd_in, pack_path, out, offset, size,
				    error_r);
	i_close_fd(&fd_in);
	if (ret < 0) {
		cas_durable_file_abort(&out);
		return -1;
	}
	/* temp, fsync, rename, and the directory fsync that makes the
	   name survive a crash */
	return cas_durable_file_commit(&out, error_r);
}

int casbox_store_quarantine_copy(struct casbox_store *store,
				 const struct cas_blob_id *id,
				 const struct casbox_quarantine_record *rec,
				 const char **path_r, const char **error_r)
{
	const char *root = casbox_store_get_root(store);
	const char *dir, *path;
	struct stat st;

	dir = t_strconcat(root, "/"CASBOX_QUARANTINE_DIR, NULL);
	path = t_strconcat(dir, "/", casbox_quarantine_copy_name(id, rec),
			   NULL);
	*path_r = path;
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		*error_r = t_strdup_printf("mkdir(%s) failed: %m", dir);
		return -1;
	}
	if (stat(path, &st) == 0)
		return 0;
	return casbox_quarantine_copy_frame(NULL,
		casbox_census_pack_path(root, rec->pack_id), path,
		rec->offset, rec->frame_size, error_r);
}

int casbox_store_msg_quarantined(struct casbox_store *store,
				 const struct casbox_msg_record *rec,
				 struct cas_blob_id *blob_r,
				 const char **cause_r, const char **error_r)
{
	struct casbox_lsm *lsm = casbox_store_get_lsm(store);
	struct casbox_quarantine_record qrec;
	const struct casbox_msg_part *part;
	buffer_t *key, *value;
	const char *error;
	int ret;

	key = t_buffer_create(1 + CAS_BLOB_ID_SIZE);
	value = t_buffer_create(128);
	array_foreach(&rec->parts, part) {
		buffer_set_used_size(key, 0);
		buffer_set_used_size(value, 0);
		casbox_quarantine_key(key, &part->id);
		ret = casbox_lsm_get(lsm, key->data, key->used, value,
				     error_r);
		if (ret < 0)
			return -1;
		if (ret == 0)
			continue;
		*blob_r = part->id;
		if (casbox_quarantine_record_import(value->data, value->used,
						    pool_datastack_create(),
						    &qrec, &error) < 0)
			*cause_r = t_strdup_printf("(%s)", error);
		else
			*cause_r = qrec.cause;
		return 1;
	}
	return 0;
}
