#ifndef CASBOX_LSM_MANIFEST_H
#define CASBOX_LSM_MANIFEST_H

/* MANIFEST: which WAL and tables make up the store (doc/casbox-lsm.md).

   format 1 (plaintext):
   "CBXMAN01" | u32 1 | u32 n_tables | u64 generation | u64 wal_no
   | u64 next_file_no | u64 last_seq | n_tables * (u64 file_no |
   u64 size | u64 entries) | u32 crc32c of everything before

   format 2 (sealed):
   "CBXMAN02" | u32 2 | u32 n_tables | u64 generation | u64 wal_no
   | u64 next_file_no | u64 last_seq | u32 mac_epoch | u32 wal_epoch
   | fingerprint[32] | n_tables * (u64 file_no | u64 size |
   u64 entries | u32 epoch | u32 0) | mac[32]
   mac = BLAKE2b-256 keyed with a sub-key of mac_epoch's LSM key, over
   everything before it.

   Tables are listed newest first. Replaced only by write MANIFEST.tmp,
   fsync, rename over MANIFEST, fsync the directory. */

#include "array.h"
#include "casbox-lsm.h"

struct casbox_lsm_key;

struct casbox_lsm_manifest_table {
	uint64_t file_no, size, entries;
	/* CASBOX_LSM_EPOCH_PLAINTEXT for a format-1 table */
	uint32_t epoch;
};

struct casbox_lsm_manifest {
	uint64_t generation, wal_no, next_file_no, last_seq;
	/* format 2 */
	bool sealed;
	uint32_t mac_epoch, wal_epoch;
	unsigned char fingerprint[CASBOX_LSM_FINGERPRINT_SIZE];
	ARRAY(struct casbox_lsm_manifest_table) tables;
};

void casbox_lsm_manifest_init(struct casbox_lsm_manifest *man);
void casbox_lsm_manifest_deinit(struct casbox_lsm_manifest *man);
/* man->sealed: format 2, MAC with key (whose epoch must be
   man->mac_epoch); else format 1 (key NULL). */
void casbox_lsm_manifest_encode(const struct casbox_lsm_manifest *man,
				const struct casbox_lsm_key *key,
				buffer_t *out);
/* Parse the structure (format 1: CRC checked; format 2: MAC not yet
   checked). Returns 0 ok, -1 damaged (error_r says why). man must be
   inited. */
int casbox_lsm_manifest_decode(const unsigned char *data, size_t size,
			       struct casbox_lsm_manifest *man,
			       const char **error_r);
/* Format 2: check the MAC with mac_epoch's key. Returns 0 ok, -1 not. */
int casbox_lsm_manifest_verify(const unsigned char *data, size_t size,
			       const struct casbox_lsm_key *key,
			       const char **error_r);

#endif
