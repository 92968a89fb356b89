#ifndef CASBOX_PACK_FILE_H
#define CASBOX_PACK_FILE_H

/* One pack opened for reading, wherever it is: a local file
   (pack-N.cbp), or a sealed pack in object storage (pack-N.cbr, the
   stub left when it was uploaded), read by ranges through the local
   read cache (doc/casbox-storage.md, "Packs in object storage").

   Cache: <cache dir>/pack-N.data holds the fetched 64 KiB blocks at
   their pack offsets (sparse), pack-N.map one 8-byte entry per block
   (present magic, CRC32C of the block) after a header naming the pack's
   size and hash. Blocks are written before their entries, nothing is
   fsynced, and every block is CRC-checked when first used by a handle:
   a cache that a crash or power loss tore is fetched again, never
   returned. The cache is bounded (casbox_pack_cache_size): past it, the
   packs used least recently lose their cache. */

#include "casbox-pack.h"

#define CASBOX_PACK_STUB_MAGIC "CASBREMT"
#define CASBOX_PACK_STUB_VERSION 1
#define CASBOX_PACK_HASH_SIZE 32
/* magic | u32 version | u32 pack id | u64 size | BLAKE2b-256 */
#define CASBOX_PACK_STUB_SIZE (8 + 4 + 4 + 8 + CASBOX_PACK_HASH_SIZE)

struct casbox_pack_stub {
	uint32_t pack_id;
	uint64_t size;
	unsigned char hash[CASBOX_PACK_HASH_SIZE];
};

struct casbox_pack_file;

/* Returns 1 ok, 0 the pack is neither local nor remote (gc deleted it),
   -1 error. */
int casbox_pack_file_open(struct casbox_pack_store *store, uint32_t pack_id,
			  struct casbox_pack_file **pf_r,
			  const char **error_r);
void casbox_pack_file_close(struct casbox_pack_file **pf);

/* pread() on the pack: returns the bytes read (fewer only at the end of
   the pack), -1 with errno set (EAGAIN: object storage unreachable or
   failing) and casbox_pack_file_get_error() saying why. */
ssize_t casbox_pack_file_pread(struct casbox_pack_file *pf, void *buf,
			       size_t size, uint64_t offset);
/* Fetch [offset, offset+size) into the cache now and keep it readable
   through this handle even if the cache is evicted or the object
   deleted (a pinned blob stream). Local packs: nothing to do.
   Returns 0 ok, -1 error (as pread). */
int casbox_pack_file_prefetch(struct casbox_pack_file *pf, uint64_t offset,
			      uint64_t size);
/* Returns 0 ok, -1 error. */
int casbox_pack_file_get_size(struct casbox_pack_file *pf, uint64_t *size_r);
bool casbox_pack_file_is_remote(struct casbox_pack_file *pf);
/* The local path or "object storage <label> <object>", for errors. */
const char *casbox_pack_file_get_name(struct casbox_pack_file *pf);
const char *casbox_pack_file_get_error(struct casbox_pack_file *pf);

/* pack-N.cbr */
const char *casbox_pack_stub_path(struct casbox_pack_store *store,
				  uint32_t pack_id);
void casbox_pack_stub_export(const struct casbox_pack_stub *stub,
			     unsigned char buf[CASBOX_PACK_STUB_SIZE]);
/* Returns 1 ok, 0 missing, -1 damaged or I/O error. */
int casbox_pack_stub_read(const char *path, struct casbox_pack_stub *stub_r,
			  const char **error_r);
/* Write pack-N.cbr durably (temp file, fsync, rename, fsync dir).
   Returns 0 ok, -1 error. */
int casbox_pack_stub_write(struct casbox_pack_store *store,
			   const struct casbox_pack_stub *stub,
			   const char **error_r);

/* Drop the least recently used packs' cache until it is within the
   bound. */
void casbox_pack_cache_evict(struct casbox_pack_store *store);

#endif
