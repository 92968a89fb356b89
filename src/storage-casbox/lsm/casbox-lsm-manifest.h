#ifndef CASBOX_LSM_MANIFEST_H
#define CASBOX_LSM_MANIFEST_H

/* MANIFEST: which WAL and tables make up the store (doc/casbox-lsm.md).

   "CBXMAN01" | u32 version | u32 n_tables | u64 generation | u64 wal_no
   | u64 next_file_no | u64 last_seq | n_tables * (u64 file_no |
   u64 size | u64 entries) | u32 crc32c of everything before

   Tables are listed newest first. Replaced only by write MANIFEST.tmp,
   fsync, rename over MANIFEST, fsync the directory. */

#include "array.h"

struct casbox_lsm_manifest_table {
	uint64_t file_no, size, entries;
};

struct casbox_lsm_manifest {
	uint64_t generation, wal_no, next_file_no, last_seq;
	ARRAY(struct casbox_lsm_manifest_table) tables;
};

void casbox_lsm_manifest_init(struct casbox_lsm_manifest *man);
void casbox_lsm_manifest_deinit(struct casbox_lsm_manifest *man);
void casbox_lsm_manifest_encode(const struct casbox_lsm_manifest *man,
				buffer_t *out);
/* Returns 0 ok, -1 damaged (error_r says why). man must be inited. */
int casbox_lsm_manifest_decode(const unsigned char *data, size_t size,
			       struct casbox_lsm_manifest *man,
			       const char **error_r);

#endif
