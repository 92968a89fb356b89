/* Keyless pack scanner: walks frames, checks header, table and chunk
   CRCs, and after damage searches forward for the next frame magic whose
   header CRC holds. */

#include "lib.h"
#include "array.h"
#include "cas-crc32c.h"
#include "cas-secmem.h"
#include "casbox-pack-private.h"
#include "casbox-pack-file.h"

#include <sodium.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#define CASBOX_SCAN_WINDOW (64 * 1024)

struct casbox_pack_scan {
	struct casbox_pack_store *store;
	ARRAY_TYPE(uint32_t) ids;
	unsigned int idx;

	struct casbox_pack_file *fd;
	uint32_t pack_id;
	char *path;
	uint64_t offset, size;
	unsigned char *buf;	/* CASBOX_CHUNK_MAX_STORED */
	char *damage, *error;
};

struct casbox_pack_scan *casbox_pack_scan_init(struct casbox_pack_store *store)
{
	struct casbox_pack_scan *scan;
	const char *error;

	scan = i_new(struct casbox_pack_scan, 1);
	scan->store = store;
	i_array_init(&scan->ids, 16);
	scan->buf = i_malloc(I_MAX(CASBOX_CHUNK_MAX_STORED,
				   CASBOX_SCAN_WINDOW));
	if (casbox_pack_list(store, &scan->ids, &error) < 0)
		scan->error = i_strdup(error);
	return scan;
}

static void casbox_pack_scan_set_error(struct casbox_pack_scan *scan,
				       const char *error)
{
	if (scan->error == NULL)
		scan->error = i_strdup(error);
}

static bool casbox_pack_scan_read(struct casbox_pack_scan *scan, void *buf,
				  size_t size, uint64_t offset)
{
	ssize_t ret = casbox_pack_file_pread(scan->fd, buf, size, offset);

	if (ret < 0) {
		casbox_pack_scan_set_error(scan,
			casbox_pack_file_get_error(scan->fd));
		return FALSE;
	}
	return (size_t)ret == size;
}

static bool
casbox_pack_scan_header_at(struct casbox_pack_scan *scan, uint64_t offset,
			   bool meta)
{
	unsigned char hdr[CASBOX_FRAME_HEADER_MAX_SIZE];
	struct casbox_frame_header frame;
	struct casbox_meta_header mhdr;
	const char *error;
	ssize_t ret;

	if (meta) {
		return casbox_pack_scan_read(scan, hdr,
					     CASBOX_META_HEADER_SIZE,
					     offset) &&
			casbox_meta_header_parse(hdr, CASBOX_META_HEADER_SIZE,
						 &mhdr, &error) == 0;
	}
	/* a frame of either version is longer than the larger header,
	   but a version 1 header may end the pack when its frame is torn */
	ret = casbox_pack_file_pread(scan->fd, hdr, sizeof(hdr), offset);
	return ret >= CASBOX_FRAME_HEADER_SIZE &&
		casbox_frame_header_parse(hdr, ret, &frame, &error) == 0;
}

/* Offset of the next intact-looking frame header after from, or the end
   of the pack. */
static uint64_t casbox_pack_scan_resync(struct casbox_pack_scan *scan,
					uint64_t from)
{
	uint64_t pos = from;
	ssize_t ret;
	size_t i;

	while (pos < scan->size) {
		ret = casbox_pack_file_pread(scan->fd, scan->buf,
					     CASBOX_SCAN_WINDOW, pos);
		if (ret < 0) {
			casbox_pack_scan_set_error(scan,
				casbox_pack_file_get_error(scan->fd));
		}
		if (ret < CASBOX_FRAME_MAGIC_SIZE)
			break;
		for (i = 0; i + CASBOX_FRAME_MAGIC_SIZE <= (size_t)ret; i++) {
			if (memcmp(scan->buf + i, CASBOX_FRAME_MAGIC,
				   CASBOX_FRAME_MAGIC_SIZE) == 0 &&
			    casbox_pack_scan_header_at(scan, pos + i, FALSE))
				return pos + i;
			if (memcmp(scan->buf + i, CASBOX_META_MAGIC,
				   CASBOX_FRAME_MAGIC_SIZE) == 0 &&
			    casbox_pack_scan_header_at(scan, pos + i, TRUE))
				return pos + i;
		}
		/* re-read the last bytes, a magic may straddle windows */
		pos += ret - (CASBOX_FRAME_MAGIC_SIZE - 1);
	}
	return scan->size;
}

static const char *
casbox_pack_scan_verify(struct casbox_pack_scan *scan, uint64_t offset,
			const struct casbox_frame_header *hdr)
{
	struct casbox_frame_chunk *chunks;
	size_t table_size = (size_t)hdr->chunk_count *
		CASBOX_FRAME_TABLE_ENTRY_SIZE;
	unsigned char *table;
	const char *error = NULL;
	uint32_t i;

	if (offset + hdr->frame_size > scan->size)
		return "frame truncated";
	table = i_malloc(table_size);
	chunks = i_new(struct casbox_frame_chunk, hdr->chunk_count);
	if (!casbox_pack_scan_read(scan, table, table_size,
				   offset + hdr->frame_size - table_size))
		error = "chunk table unreadable";
	else if (casbox_frame_table_parse(hdr, table, table_size, chunks,
					  &error) < 0)
		;
	else for (i = 0; i < hdr->chunk_count; i++) {
		if (!casbox_pack_scan_read(scan, scan->buf,
					   chunks[i].stored_size,
					   offset + chunks[i].offset)) {
			error = t_strdup_printf("chunk %u unreadable", i);
			break;
		}
		if (cas_crc32c_mask(cas_crc32c(scan->buf,
				chunks[i].stored_size)) != chunks[i].crc) {
			error = t_strdup_printf("chunk %u: CRC mismatch", i);
			break;
		}
	}
	i_free(table);
	i_free(chunks);
	return error;
}

/* The body CRC of a meta frame whose header holds. */
static const char *
casbox_pack_scan_verify_meta(struct casbox_pack_scan *scan, uint64_t offset,
			     const struct casbox_meta_header *hdr)
{
	size_t body_size = hdr->frame_size - CASBOX_META_HEADER_SIZE;
	unsigned char *body;
	const char *error = NULL;

	if (offset + hdr->frame_size > scan->size)
		return "meta frame truncated";
	body = i_malloc(body_size);
	if (!casbox_pack_scan_read(scan, body, body_size,
				   offset + CASBOX_META_HEADER_SIZE))
		error = "meta frame body unreadable";
	else
		(void)casbox_meta_body_check(hdr, body, body_size, &error);
	i_free(body);
	return error;
}

/* A meta frame at scan->offset. Returns FALSE if its header is not
   valid (then the caller resyncs). */
static bool
casbox_pack_scan_meta(struct casbox_pack_scan *scan,
		      const unsigned char *buf, size_t size,
		      struct casbox_pack_frame_info *info_r,
		      const char **damage_r)
{
	struct casbox_meta_header hdr;
	const char *damage;

	if (casbox_meta_header_parse(buf, size, &hdr, damage_r) < 0)
		return FALSE;
	info_r->meta_kind = hdr.kind;
	damage = casbox_pack_scan_verify_meta(scan, scan->offset, &hdr);
	if (damage != NULL && scan->offset + hdr.frame_size > scan->size) {
		*damage_r = damage;
		return FALSE;
	}
	/* the header CRC holds: trust its size */
	info_r->frame_size = hdr.frame_size;
	scan->offset += hdr.frame_size;
	if (damage != NULL)
		scan->damage = i_strdup(damage);
	info_r->damage = scan->damage;
	return TRUE;
}

static bool casbox_pack_scan_is_zero(const unsigned char *p, size_t size)
{
	size_t i;

	for (i = 0; i < size; i++) {
		if (p[i] != 0)
			return FALSE;
	}
	return TRUE;
}

static void
casbox_pack_scan_frame(struct casbox_pack_scan *scan,
		       struct casbox_pack_frame_info *info_r)
{
	unsigned char buf[CASBOX_FRAME_HEADER_MAX_SIZE];
	struct casbox_frame_header hdr;
	const char *damage;
	uint64_t next;
	ssize_t ret;

	info_r->pack_id = scan->pack_id;
	info_r->offset = scan->offset;
	ret = casbox_pack_file_pread(scan->fd, buf, sizeof(buf), scan->offset);
	if (ret < 0) {
		casbox_pack_scan_set_error(scan,
			casbox_pack_file_get_error(scan->fd));
		ret = 0;
	}
	if (ret >= CASBOX_FRAME_MAGIC_SIZE &&
	    memcmp(buf, CASBOX_META_MAGIC, CASBOX_FRAME_MAGIC_SIZE) == 0) {
		if (casbox_pack_scan_meta(scan, buf, ret, info_r, &damage))
			return;
		info_r->meta_kind = CASBOX_META_KIND_NONE;
	} else if (ret < CASBOX_FRAME_HEADER_SIZE)
		damage = "frame header truncated";
	else if (casbox_frame_header_parse(buf, ret, &hdr, &damage) == 0) {
		info_r->id = hdr.id;
		info_r->frame_version = hdr.version;
		/* version 2 does not show it: 0 */
		info_r->plain_size = hdr.plain_size;
		info_r->dict_id = hdr.dict_id;
		/* a delta frame: its depth, and the base id masked (only
		   the blob's DEK unmasks it: casbox_pack_frame_base_id()) */
		info_r->base_depth = hdr.base_depth;
		info_r->cipher = hdr.cipher;
		memcpy(info_r->nonce, hdr.nonce, sizeof(info_r->nonce));
		memcpy(info_r->base_masked, hdr.base_masked,
		       sizeof(info_r->base_masked));
		damage = casbox_pack_scan_verify(scan, scan->offset, &hdr);
		if (damage == NULL || scan->offset + hdr.frame_size <=
		    scan->size) {
			/* the header CRC holds: trust its size */
			info_r->frame_size = hdr.frame_size;
			scan->offset += hdr.frame_size;
			if (damage != NULL)
				scan->damage = i_strdup(damage);
			info_r->damage = scan->damage;
			return;
		}
	}
	/* the smaller (meta) header: a torn blob frame is zero there too */
	info_r->unfinished = ret >= CASBOX_META_HEADER_SIZE &&
		casbox_pack_scan_is_zero(buf, CASBOX_META_HEADER_SIZE);
	next = casbox_pack_scan_resync(scan, scan->offset + 1);
	info_r->frame_size = I_MIN(next - scan->offset, UINT32_MAX);
	scan->damage = i_strdup(damage);
	info_r->damage = scan->damage;
	scan->offset = next;
}

static bool casbox_pack_scan_open_next(struct casbox_pack_scan *scan,
				       struct casbox_pack_frame_info *info_r)
{
	unsigned char hdr[CASBOX_PACK_HEADER_SIZE];
	const char *error;
	uint32_t pack_id;
	int ret;

	scan->pack_id = *array_idx(&scan->ids, scan->idx);
	scan->idx++;
	ret = casbox_pack_file_open(scan->store, scan->pack_id, &scan->fd,
				    &error);
	if (ret == 0) {
		/* gc deleted it since the listing */
		return FALSE;
	}
	if (ret < 0) {
		casbox_pack_scan_set_error(scan, error);
		return FALSE;
	}
	i_free(scan->path);
	scan->path = i_strdup(casbox_pack_file_get_name(scan->fd));
	if (casbox_pack_file_get_size(scan->fd, &scan->size) < 0) {
		casbox_pack_scan_set_error(scan,
			casbox_pack_file_get_error(scan->fd));
		casbox_pack_file_close(&scan->fd);
		return FALSE;
	}
	scan->offset = CASBOX_PACK_HEADER_SIZE;
	if (!casbox_pack_scan_read(scan, hdr, sizeof(hdr), 0))
		error = "pack header truncated";
	else if (casbox_pack_header_parse(hdr, sizeof(hdr), &pack_id,
					  &error) < 0)
		;
	else if (pack_id != scan->pack_id)
		error = "pack header names another pack";
	else
		return FALSE;
	i_zero(info_r);
	info_r->pack_id = scan->pack_id;
	info_r->frame_size = I_MIN(scan->size, CASBOX_PACK_HEADER_SIZE);
	scan->damage = i_strdup(error);
	info_r->damage = scan->damage;
	return TRUE;
}

bool casbox_pack_scan_next(struct casbox_pack_scan *scan,
			   struct casbox_pack_frame_info *info_r)
{
	bool ret;

	i_zero(info_r);
	i_free(scan->damage);
	for (;;) {
		if (scan->fd == NULL) {
			if (scan->idx >= array_count(&scan->ids))
				return FALSE;
			T_BEGIN {
				ret = casbox_pack_scan_open_next(scan, info_r);
			} T_END;
			if (ret)
				return TRUE;
			continue;
		}
		if (scan->offset >= scan->size) {
			casbox_pack_file_close(&scan->fd);
			continue;
		}
		T_BEGIN {
			casbox_pack_scan_frame(scan, info_r);
		} T_END;
		return TRUE;
	}
}

int casbox_pack_scan_deinit(struct casbox_pack_scan **_scan,
			    const char **error_r)
{
	struct casbox_pack_scan *scan = *_scan;
	int ret = 0;

	*_scan = NULL;
	casbox_pack_file_close(&scan->fd);
	if (scan->error != NULL) {
		*error_r = t_strdup(scan->error);
		ret = -1;
	}
	array_free(&scan->ids);
	i_free(scan->damage);
	i_free(scan->error);
	i_free(scan->path);
	i_free(scan->buf);
	i_free(scan);
	return ret;
}

int casbox_pack_frame_base_id(struct casbox_pack_store *store,
			      const struct casbox_pack_frame_info *info,
			      uint8_t dek_kind, const unsigned char *stored_dek,
			      struct cas_blob_id *base_id_r,
			      const char **error_r)
{
	unsigned char *keys;
	int ret = 1;

	if (info->meta_kind != CASBOX_META_KIND_NONE ||
	    info->base_depth == 0) {
		*error_r = "not a delta frame";
		return -1;
	}
	keys = cas_secmem_alloc(CAS_DEK_SIZE + CAS_AEAD_SUBKEY_SIZE);
	if (cas_keyring_dek_open(store->keyring, &info->id, dek_kind,
				 stored_dek, keys, error_r) < 0)
		ret = -1;
	else {
		cas_aead_frame_subkey(info->cipher, keys, info->nonce,
				      keys + CAS_DEK_SIZE);
		casbox_frame_base_mask(keys + CAS_DEK_SIZE,
				       info->base_masked, base_id_r->id);
	}
	cas_secmem_free(keys, CAS_DEK_SIZE + CAS_AEAD_SUBKEY_SIZE);
	return ret;
}
