/* MANIFEST codec; layout in casbox-lsm-manifest.h. */

#include "lib.h"
#include "buffer.h"
#include "byteorder.h"
#include "cas-crc32c.h"
#include "casbox-lsm-private.h"
#include "casbox-lsm-manifest.h"

#define MANIFEST_MAGIC "CBXMAN01"
#define MANIFEST_MAGIC2 "CBXMAN02"
#define MANIFEST_VERSION 1
#define MANIFEST_VERSION2 2
#define MANIFEST_HDR_SIZE 48
#define MANIFEST_HDR2_SIZE (MANIFEST_HDR_SIZE + 8 + \
			    CASBOX_LSM_FINGERPRINT_SIZE)
#define MANIFEST_TABLE_SIZE 24
#define MANIFEST_TABLE2_SIZE 32
#define MANIFEST_MAX_TABLES 100000

void casbox_lsm_manifest_init(struct casbox_lsm_manifest *man)
{
	i_zero(man);
	man->wal_epoch = CASBOX_LSM_EPOCH_PLAINTEXT;
	man->mac_epoch = CASBOX_LSM_EPOCH_PLAINTEXT;
	i_array_init(&man->tables, 16);
}

void casbox_lsm_manifest_deinit(struct casbox_lsm_manifest *man)
{
	array_free(&man->tables);
}

void casbox_lsm_manifest_encode(const struct casbox_lsm_manifest *man,
				const struct casbox_lsm_key *key,
				buffer_t *out)
{
	const struct casbox_lsm_manifest_table *t;
	unsigned char num[MANIFEST_HDR_SIZE], mac[CASBOX_LSM_MAC_SIZE];
	size_t start = out->used;

	i_assert(man->sealed == (key != NULL));
	i_assert(key == NULL || key->epoch == man->mac_epoch);
	memcpy(num, man->sealed ? MANIFEST_MAGIC2 : MANIFEST_MAGIC, 8);
	cpu32_to_be_unaligned(man->sealed ? MANIFEST_VERSION2 :
			      MANIFEST_VERSION, num + 8);
	cpu32_to_be_unaligned(array_count(&man->tables), num + 12);
	cpu64_to_be_unaligned(man->generation, num + 16);
	cpu64_to_be_unaligned(man->wal_no, num + 24);
	cpu64_to_be_unaligned(man->next_file_no, num + 32);
	cpu64_to_be_unaligned(man->last_seq, num + 40);
	buffer_append(out, num, MANIFEST_HDR_SIZE);
	if (man->sealed) {
		cpu32_to_be_unaligned(man->mac_epoch, num);
		cpu32_to_be_unaligned(man->wal_epoch, num + 4);
		buffer_append(out, num, 8);
		buffer_append(out, man->fingerprint,
			      sizeof(man->fingerprint));
	}
	array_foreach(&man->tables, t) {
		cpu64_to_be_unaligned(t->file_no, num);
		cpu64_to_be_unaligned(t->size, num + 8);
		cpu64_to_be_unaligned(t->entries, num + 16);
		if (!man->sealed) {
			i_assert(t->epoch == CASBOX_LSM_EPOCH_PLAINTEXT);
			buffer_append(out, num, MANIFEST_TABLE_SIZE);
			continue;
		}
		cpu32_to_be_unaligned(t->epoch, num + 24);
		cpu32_to_be_unaligned(0, num + 28);
		buffer_append(out, num, MANIFEST_TABLE2_SIZE);
	}
	if (man->sealed) {
		casbox_lsm_manifest_mac(key, CONST_PTR_OFFSET(out->data, start),
					out->used - start, mac);
		buffer_append(out, mac, sizeof(mac));
		return;
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
	size_t hdr_size, table_size, trailer;
	uint32_t n, i;

	if (size < MANIFEST_HDR_SIZE + 4) {
		*error_r = "MANIFEST truncated";
		return -1;
	}
	if (memcmp(data, MANIFEST_MAGIC, 8) == 0) {
		man->sealed = FALSE;
		if (cas_crc32c(data, size - 4) !=
		    be32_to_cpu_unaligned(data + size - 4)) {
			*error_r = "MANIFEST checksum mismatch";
			return -1;
		}
		if (be32_to_cpu_unaligned(data + 8) != MANIFEST_VERSION) {
			*error_r = "MANIFEST version not supported";
			return -1;
		}
		hdr_size = MANIFEST_HDR_SIZE;
		table_size = MANIFEST_TABLE_SIZE;
		trailer = 4;
		man->mac_epoch = man->wal_epoch = CASBOX_LSM_EPOCH_PLAINTEXT;
	} else if (memcmp(data, MANIFEST_MAGIC2, 8) == 0) {
		man->sealed = TRUE;
		if (be32_to_cpu_unaligned(data + 8) != MANIFEST_VERSION2) {
			*error_r = "MANIFEST version not supported";
			return -1;
		}
		hdr_size = MANIFEST_HDR2_SIZE;
		table_size = MANIFEST_TABLE2_SIZE;
		trailer = CASBOX_LSM_MAC_SIZE;
		if (size < hdr_size + trailer) {
			*error_r = "MANIFEST truncated";
			return -1;
		}
		man->mac_epoch = be32_to_cpu_unaligned(data + 48);
		man->wal_epoch = be32_to_cpu_unaligned(data + 52);
		memcpy(man->fingerprint, data + 56,
		       sizeof(man->fingerprint));
	} else {
		*error_r = "MANIFEST has bad magic";
		return -1;
	}
	n = be32_to_cpu_unaligned(data + 12);
	if (n > MANIFEST_MAX_TABLES ||
	    size != hdr_size + trailer + (size_t)n * table_size) {
		*error_r = "MANIFEST table count does not match its size";
		return -1;
	}
	man->generation = be64_to_cpu_unaligned(data + 16);
	man->wal_no = be64_to_cpu_unaligned(data + 24);
	man->next_file_no = be64_to_cpu_unaligned(data + 32);
	man->last_seq = be64_to_cpu_unaligned(data + 40);
	array_clear(&man->tables);
	for (i = 0; i < n; i++) {
		const unsigned char *p = data + hdr_size + i * table_size;

		t = array_append_space(&man->tables);
		t->file_no = be64_to_cpu_unaligned(p);
		t->size = be64_to_cpu_unaligned(p + 8);
		t->entries = be64_to_cpu_unaligned(p + 16);
		t->epoch = man->sealed ? be32_to_cpu_unaligned(p + 24) :
			CASBOX_LSM_EPOCH_PLAINTEXT;
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

int casbox_lsm_manifest_verify(const unsigned char *data, size_t size,
			       const struct casbox_lsm_key *key,
			       const char **error_r)
{
	unsigned char mac[CASBOX_LSM_MAC_SIZE];

	i_assert(size >= CASBOX_LSM_MAC_SIZE);
	casbox_lsm_manifest_mac(key, data, size - CASBOX_LSM_MAC_SIZE, mac);
	if (!casbox_lsm_mac_equal(mac, data + size - CASBOX_LSM_MAC_SIZE,
				  sizeof(mac))) {
		*error_r = t_strdup_printf("MANIFEST authentication failed "
			"(damaged, or not written with this key's epoch %u)",
			key->epoch);
		return -1;
	}
	return 0;
}
