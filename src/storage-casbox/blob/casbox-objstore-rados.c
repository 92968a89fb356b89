/* rados: driver (librados). A sealed pack is one object, written with
   write_full and then aligned appends (erasure-coded pools without
   allow_ec_overwrites accept only appends at multiples of the pool's
   alignment); nothing uses omap or xattrs, so an EC pool alone serves.
   The cluster connection is made at the first call, not at open (an
   LMTP delivery that never reads or uploads a sealed pack never
   connects), with librados' mount, monitor and OSD timeouts set to the
   spec's timeout. librados runs its own threads in the process; no
   casbox code runs in them. */

#include "lib.h"
#include "array.h"
#include "read-full.h"
#include "casbox-objstore.h"

#include <rados/librados.h>
#include <unistd.h>

#define CASBOX_RADOS_SEGMENT (8 * 1024 * 1024)

struct casbox_objstore_rados {
	const char *pool, *conf, *id, *keyring, *mon_host;
	rados_t cluster;
	rados_ioctx_t io;
	bool connected;
	uint64_t alignment;	/* 0 = none required */
};

static int
casbox_objstore_rados_init(struct casbox_objstore *os,
			   const char *const *opts, const char **error_r)
{
	struct casbox_objstore_rados *r;

	r = p_new(os->pool, struct casbox_objstore_rados, 1);
	r->pool = p_strdup(os->pool, casbox_objstore_opt(opts, "pool"));
	r->conf = p_strdup(os->pool, casbox_objstore_opt(opts, "conf"));
	r->id = p_strdup(os->pool, casbox_objstore_opt(opts, "id"));
	r->keyring = p_strdup(os->pool, casbox_objstore_opt(opts, "keyring"));
	r->mon_host = p_strdup(os->pool,
			       casbox_objstore_opt(opts, "mon_host"));
	if (r->pool == NULL) {
		*error_r = "casbox_pack_storage: rados: pool= missing";
		return -1;
	}
	if (r->conf == NULL && r->mon_host == NULL) {
		*error_r = "casbox_pack_storage: rados: conf= or mon_host= "
			"missing";
		return -1;
	}
	os->context = r;
	os->label = p_strdup_printf(os->pool, "rados:%s", r->pool);
	return 0;
}

static void casbox_objstore_rados_disconnect(struct casbox_objstore_rados *r)
{
	if (r->io != NULL)
		rados_ioctx_destroy(r->io);
	r->io = NULL;
	if (r->cluster != NULL)
		rados_shutdown(r->cluster);
	r->cluster = NULL;
	r->connected = FALSE;
}

static void casbox_objstore_rados_deinit(struct casbox_objstore *os)
{
	casbox_objstore_rados_disconnect(os->context);
}

static const char *casbox_rados_strerror(const char *call, int ret)
{
	return t_strdup_printf("%s failed: %s", call, strerror(-ret));
}

static int
casbox_objstore_rados_set(struct casbox_objstore_rados *r, const char *key,
			  const char *value, const char **error_r)
{
	int ret;

	if (value == NULL)
		return 0;
	ret = rados_conf_set(r->cluster, key, value);
	if (ret < 0) {
		*error_r = t_strdup_printf("rados_conf_set(%s) failed: %s",
					   key, strerror(-ret));
		return -1;
	}
	return 0;
}

static int
casbox_objstore_rados_connect(struct casbox_objstore *os,
			      const char **error_r)
{
	struct casbox_objstore_rados *r = os->context;
	const char *secs = dec2str((os->timeout_msecs + 999) / 1000);
	int ret, req = 0;

	if (r->connected)
		return 0;
	ret = rados_create(&r->cluster, r->id);
	if (ret < 0) {
		r->cluster = NULL;
		*error_r = casbox_rados_strerror("rados_create()", ret);
		return -1;
	}
	if (r->conf != NULL &&
	    (ret = rados_conf_read_file(r->cluster, r->conf)) < 0) {
		*error_r = t_strdup_printf("rados_conf_read_file(%s) "
					   "failed: %s", r->conf,
					   strerror(-ret));
		casbox_objstore_rados_disconnect(r);
		return -1;
	}
	if (casbox_objstore_rados_set(r, "keyring", r->keyring, error_r) < 0 ||
	    casbox_objstore_rados_set(r, "mon_host", r->mon_host,
				      error_r) < 0 ||
	    casbox_objstore_rados_set(r, "client_mount_timeout", secs,
				      error_r) < 0 ||
	    casbox_objstore_rados_set(r, "rados_mon_op_timeout", secs,
				      error_r) < 0 ||
	    casbox_objstore_rados_set(r, "rados_osd_op_timeout", secs,
				      error_r) < 0 ||
	    casbox_objstore_rados_set(r, "log_to_stderr", "false",
				      error_r) < 0 ||
	    /* a mail process has no business in /var/log/ceph or
	       /var/run/ceph */
	    casbox_objstore_rados_set(r, "log_file", "", error_r) < 0 ||
	    casbox_objstore_rados_set(r, "admin_socket", "", error_r) < 0 ||
	    casbox_objstore_rados_set(r, "err_to_stderr", "false",
				      error_r) < 0) {
		casbox_objstore_rados_disconnect(r);
		return -1;
	}
	ret = rados_connect(r->cluster);
	if (ret < 0) {
		*error_r = casbox_rados_strerror("rados_connect()", ret);
		casbox_objstore_rados_disconnect(r);
		return -1;
	}
	ret = rados_ioctx_create(r->cluster, r->pool, &r->io);
	if (ret < 0) {
		r->io = NULL;
		*error_r = t_strdup_printf("pool %s: %s", r->pool,
			ret == -ENOENT ? "no such pool" :
			casbox_rados_strerror("rados_ioctx_create()", ret));
		casbox_objstore_rados_disconnect(r);
		return -1;
	}
	ret = rados_ioctx_pool_requires_alignment2(r->io, &req);
	if (ret == 0 && req != 0)
		ret = rados_ioctx_pool_required_alignment2(r->io,
							   &r->alignment);
	if (ret < 0) {
		*error_r = casbox_rados_strerror("pool alignment", ret);
		casbox_objstore_rados_disconnect(r);
		return -1;
	}
	r->connected = TRUE;
	return 0;
}

/* A timeout or a lost connection: connect again at the next call. */
static void casbox_objstore_rados_failed(struct casbox_objstore_rados *r,
					 int ret)
{
	if (ret == -ETIMEDOUT || ret == -ENOTCONN || ret == -ESHUTDOWN)
		casbox_objstore_rados_disconnect(r);
}

static size_t casbox_rados_segment(struct casbox_objstore_rados *r)
{
	size_t seg = CASBOX_RADOS_SEGMENT;

	if (r->alignment > 1 && r->alignment <= CASBOX_RADOS_SEGMENT)
		seg -= seg % r->alignment;
	else if (r->alignment > CASBOX_RADOS_SEGMENT)
		seg = r->alignment;
	return seg;
}

static int
casbox_objstore_rados_put(struct casbox_objstore *os, const char *name,
			  int fd, uint64_t size, const char **error_r)
{
	struct casbox_objstore_rados *r = os->context;
	uint64_t off = 0;
	size_t seg, n;
	char *buf;
	int ret = 0;

	if (casbox_objstore_rados_connect(os, error_r) < 0)
		return -1;
	seg = casbox_rados_segment(r);
	buf = i_malloc(seg);
	do {
		n = I_MIN(size - off, seg);
		if (n > 0 && pread_full(fd, buf, n, off) <= 0) {
			*error_r = t_strdup_printf("read of the pack failed: %m");
			ret = -1;
			break;
		}
		/* the first write replaces an object a crashed upload left */
		ret = off == 0 ? rados_write_full(r->io, name, buf, n) :
			rados_append(r->io, name, buf, n);
		if (ret < 0) {
			*error_r = casbox_rados_strerror(off == 0 ?
				"rados_write_full()" : "rados_append()", ret);
			casbox_objstore_rados_failed(r, ret);
			ret = -1;
			break;
		}
		off += n;
	} while (off < size);
	i_free(buf);
	return ret < 0 ? -1 : 1;
}

static int
casbox_objstore_rados_get(struct casbox_objstore *os, const char *name,
			  uint64_t offset, void *buf, size_t size,
			  size_t *read_r, const char **error_r)
{
	struct casbox_objstore_rados *r = os->context;
	size_t done = 0;
	int ret;

	if (casbox_objstore_rados_connect(os, error_r) < 0)
		return -1;
	while (done < size) {
		size_t n = I_MIN(size - done, CASBOX_RADOS_SEGMENT);

		ret = rados_read(r->io, name, PTR_OFFSET(buf, done), n,
				 offset + done);
		if (ret == -ENOENT)
			return 0;
		if (ret < 0) {
			*error_r = casbox_rados_strerror("rados_read()", ret);
			casbox_objstore_rados_failed(r, ret);
			return -1;
		}
		done += ret;
		if ((size_t)ret < n)
			break;
	}
	*read_r = done;
	return 1;
}

static int
casbox_objstore_rados_stat(struct casbox_objstore *os, const char *name,
			   uint64_t *size_r, const char **error_r)
{
	struct casbox_objstore_rados *r = os->context;
	time_t mtime;
	int ret;

	if (casbox_objstore_rados_connect(os, error_r) < 0)
		return -1;
	ret = rados_stat(r->io, name, size_r, &mtime);
	if (ret == -ENOENT)
		return 0;
	if (ret < 0) {
		*error_r = casbox_rados_strerror("rados_stat()", ret);
		casbox_objstore_rados_failed(r, ret);
		return -1;
	}
	return 1;
}

static int
casbox_objstore_rados_list(struct casbox_objstore *os, const char *prefix,
			   pool_t pool, ARRAY_TYPE(const_string) *names,
			   const char **error_r)
{
	struct casbox_objstore_rados *r = os->context;
	rados_list_ctx_t ctx;
	const char *entry, *key, *nspace, *name;
	int ret;

	if (casbox_objstore_rados_connect(os, error_r) < 0)
		return -1;
	ret = rados_nobjects_list_open(r->io, &ctx);
	if (ret < 0) {
		*error_r = casbox_rados_strerror("rados_nobjects_list_open()",
						 ret);
		return -1;
	}
	while ((ret = rados_nobjects_list_next(ctx, &entry, &key,
					       &nspace)) == 0) {
		if (strncmp(entry, prefix, strlen(prefix)) != 0)
			continue;
		name = p_strdup(pool, entry);
		array_push_back(names, &name);
	}
	rados_nobjects_list_close(ctx);
	if (ret != -ENOENT) {
		*error_r = casbox_rados_strerror("rados_nobjects_list_next()",
						 ret);
		casbox_objstore_rados_failed(r, ret);
		return -1;
	}
	return 0;
}

static int
casbox_objstore_rados_delete(struct casbox_objstore *os, const char *name,
			     const char **error_r)
{
	struct casbox_objstore_rados *r = os->context;
	int ret;

	if (casbox_objstore_rados_connect(os, error_r) < 0)
		return -1;
	ret = rados_remove(r->io, name);
	if (ret == -ENOENT)
		return 0;
	if (ret < 0) {
		*error_r = casbox_rados_strerror("rados_remove()", ret);
		casbox_objstore_rados_failed(r, ret);
		return -1;
	}
	return 1;
}

const struct casbox_objstore_vfuncs casbox_objstore_rados = {
	.name = "rados",
	.init = casbox_objstore_rados_init,
	.deinit = casbox_objstore_rados_deinit,
	.put = casbox_objstore_rados_put,
	.get = casbox_objstore_rados_get,
	.stat = casbox_objstore_rados_stat,
	.list = casbox_objstore_rados_list,
	.delete = casbox_objstore_rados_delete,
};
