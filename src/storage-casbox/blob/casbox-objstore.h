#ifndef CASBOX_OBJSTORE_H
#define CASBOX_OBJSTORE_H

/* casbox-objstore: where sealed packs go (doc/casbox-storage.md, "Packs
   in object storage"). One vtable, one driver per store:

     dir:path=/srv/casbox-objects,prefix=%u/     a directory (NFS, tests)
     rados:pool=casbox,conf=/etc/ceph/ceph.conf,id=casbox,keyring=FILE,
           prefix=%u/                           Ceph RADOS (librados)
     s3:url=https://host/bucket,region=us-east-1,credentials=FILE,
        prefix=%u/,style=path|virtual           S3 (libcurl SigV4)

   Objects are whole sealed packs, named <prefix>pack-%08u.cbp (prefix=
   is required and must differ per user), written
   once and never changed. Every call is synchronous and bounded by the
   driver's timeouts; errors are strings for the log, and every error is
   temporary from the caller's view (the store comes back, or an admin
   fixes the setting): nothing local is removed on an error. Secrets are
   read from the files named in the spec, never from the spec itself, and
   never appear in an error string. */

#include "array.h"

struct casbox_objstore;

struct casbox_objstore_vfuncs {
	const char *name;
	/* Parse the driver's options (already split) and set up; no
	   network yet. Returns 0 ok, -1 bad spec. */
	int (*init)(struct casbox_objstore *os, const char *const *opts,
		    const char **error_r);
	void (*deinit)(struct casbox_objstore *os);
	/* Store size bytes of fd (from offset 0) as object name,
	   replacing what was there. Returns 1 ok, -1 error. */
	int (*put)(struct casbox_objstore *os, const char *name, int fd,
		   uint64_t size, const char **error_r);
	/* Read up to size bytes at offset into buf. Returns 1 ok with
	   *read_r bytes (short only at the end of the object), 0 object
	   not found, -1 error. */
	int (*get)(struct casbox_objstore *os, const char *name,
		   uint64_t offset, void *buf, size_t size, size_t *read_r,
		   const char **error_r);
	/* Returns 1 with the size, 0 not found, -1 error. */
	int (*stat)(struct casbox_objstore *os, const char *name,
		    uint64_t *size_r, const char **error_r);
	/* Names of the objects beginning with prefix (the prefix kept).
	   Returns 0 ok, -1 error. */
	int (*list)(struct casbox_objstore *os, const char *prefix,
		    pool_t pool, ARRAY_TYPE(const_string) *names,
		    const char **error_r);
	/* Returns 1 deleted, 0 not found, -1 error. */
	int (*delete)(struct casbox_objstore *os, const char *name,
		      const char **error_r);
};

struct casbox_objstore {
	pool_t pool;
	const struct casbox_objstore_vfuncs *v;
	/* the spec without secrets, for logs: "rados:pool=casbox" */
	const char *label;
	/* of object names, one per user (required) */
	const char *prefix;
	/* per request, milliseconds */
	unsigned int timeout_msecs;
	void *context;	/* the driver's */
};

/* Parse spec (driver:key=value,...) and set up the driver. Returns 1 ok,
   0 spec is "" or "local" (no object store), -1 error (unknown driver,
   bad option, a driver that this build lacks: the error says which
   package to build with). */
int casbox_objstore_create(const char *spec, struct casbox_objstore **os_r,
			   const char **error_r);
void casbox_objstore_destroy(struct casbox_objstore **os);

/* "<prefix>pack-%08u.cbp" */
const char *casbox_objstore_pack_name(struct casbox_objstore *os,
				      uint32_t pack_id);
/* The pack id of a name that casbox_objstore_pack_name() made, 0 if
   it is not one. */
uint32_t casbox_objstore_pack_id(struct casbox_objstore *os,
				 const char *name);

int casbox_objstore_put(struct casbox_objstore *os, const char *name, int fd,
			uint64_t size, const char **error_r);
int casbox_objstore_get(struct casbox_objstore *os, const char *name,
			uint64_t offset, void *buf, size_t size,
			size_t *read_r, const char **error_r);
int casbox_objstore_stat(struct casbox_objstore *os, const char *name,
			 uint64_t *size_r, const char **error_r);
/* Sorted ids of the packs in the store under the prefix. */
int casbox_objstore_list_packs(struct casbox_objstore *os,
			       ARRAY_TYPE(uint32_t) *ids,
			       const char **error_r);
int casbox_objstore_delete(struct casbox_objstore *os, const char *name,
			   const char **error_r);

/* The value of key in a driver's options, NULL if absent. */
const char *casbox_objstore_opt(const char *const *opts, const char *key);
/* Read a whole small secret file (credentials) into pool, trailing
   newlines cut. Returns 0 ok, -1 error (names the file, not its
   contents). */
int casbox_objstore_read_secret(pool_t pool, const char *path,
				const char **secret_r, const char **error_r);

extern const struct casbox_objstore_vfuncs casbox_objstore_dir;
extern const struct casbox_objstore_vfuncs casbox_objstore_rados;
extern const struct casbox_objstore_vfuncs casbox_objstore_s3;

#endif
