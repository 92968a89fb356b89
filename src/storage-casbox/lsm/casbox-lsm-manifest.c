/* MANIFEST codec; layout in casbox-lsm-manifest.h. */

#include "lib.h"
#include "buffer.h"
#include "byteorder.h"
#include "cas-crc32c.h"
#include "casbox-lsm-manifest.h"

#define MANIFEST_MAGIC "CBXMAN01"
#define MANIFEST_VERSION 1
#define MANIFEST_HDR_SIZE 48
#define MANIFEST_TABLE_SIZE 24
#define MANIFEST_MAX_TABLES 100000

void casbox_lsm_manifest_init(struct casbox_lsm_manifest *man)
{
	i_zero(man);
	i_array_init(&man->tables, 16);
}

void casbox_lsm_manifest_deinit(struct casbox_lsm_manifest *man)
{
	array_free(&man->tables);
}

void casbox_lsm_manifest_encode(const struct casbox_lsm_manifest *man,
				buffer_t *out)
{
	const struct casbox_lsm_manifest_table *t;
	unsigned char num[MANIFEST_HDR_SIZE];
	size_t start = out->used;

	memcpy(num, MANIFEST_MAGIC, 8);
	cpu32_to_be_unaligned(MANIFEST_VERSION, num + 8);
	cpu32_to_be_unaligned(array_count(&man->tables), num + 12);
	cpu64_to_be_unaligned(man->generation, num + 16);
	cpu64_to_be_unaligned(man->wal_no, num + 24);
	cpu64_to_be_unaligned(man->next_file_no, num + 32);
	cpu64_to_be_unaligned(man->last_seq, num + 40);
	buffer_append(out, num, MANIFEST_HDR_SIZE);
	array_foreach(&man->tables, t) {
		cpu64_to_be_unaligned(t->file_no, num);
		cpu64_to_be_unaligned(t->size, num + 8);
		cpu64_to_be_unaligned(t->entries, num + 16);
		buffer_append(out, num, MANIFEST_TABLE_SIZE);
	}
	cpu32_to_be_unaligned(cas_crc32c(CONST_PTR_OFFSET(out->data, start),
					 out->used - start), num);
	buffer_append(out, num, 4);
}

int casbox_lsm_manifest_decode(const unsigned char *data, size_t size,
			       struct casbox_lsm_manifest *man,
			       const char **error_r)
{
	struct casbox_lsm_manifest_table *t;
	uint32_t n, i;

	if (size < MANIFEST_HDR_SIZE + 4) {
		*error_r = "MANIFEST truncated";
		return -1;
	}
	if (memcmp(data, MANIFEST_MAGIC, 8) != 0) {
		*error_r = "MANIFEST has bad magic";
		return -1;
	}
	if (cas_crc32c(data, size - 4) !=
	    be32_to_cpu_unaligned(data + size - 4)) {
		*error_r = "MANIFEST checksum mismatch";
		return -1;
	}
	if (be32_to_cpu_unaligned(data + 8) != MANIFEST_VERSION) {
		*error_r = "MANIFEST version not supported";
		return -1;
	}
	n = be32_to_cpu_unaligned(data + 12);
	if (n > MANIFEST_MAX_TABLES ||
	    size != MANIFEST_HDR_SIZE + 4 + (size_t)n * MANIFEST_TABLE_SIZE) {
		*error_r = "MANIFEST table count does not match its size";
		return -1;
	}
	man->generation = be64_to_cpu_unaligned(data + 16);
	man->wal_no = be64_to_cpu_unaligned(data + 24);
	man->next_file_no = be64_to_cpu_unaligned(data + 32);
	man->last_seq = be64_to_cpu_unaligned(data + 40);
	array_clear(&man->tables);
	for (i = 0; i < n; i++) {
		const unsigned char *p = data + MANIFEST_HDR_SIZE +
			i * MANIFEST_TABLE_SIZE;

		t = array_append_space(&man->tables);
		t->file_no = be64_to_cpu_unaligned(p);
		t->size = be64_to_cpu_unaligned(p + 8);
		t->entries = be64_to_cpu_unaligned(p + 16);
		if (t->file_no >= man->next_file_no) {
			*error_r = "MANIFEST lists a file above next_file_no";
			return -1;
		}
	}
	if (man->wal_no >= man->next_file_no || man->wal_no == 0) {
		*error_r = "MANIFEST has an invalid WAL number";
		return -1;
	}
	return 0;
}
