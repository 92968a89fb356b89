/* Object-store driver selection, spec parsing and the calls every
   driver shares (casbox-objstore.h). */

#ifndef _GNU_SOURCE
#  define _GNU_SOURCE /* dladdr() */
#endif
#include "lib.h"
#include "array.h"
#include "str.h"
#include "strnum.h"
#include "read-full.h"
#include "safe-memset.h"
#include "casbox-objstore.h"

#include <stdio.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>

#define CASBOX_OBJSTORE_DEFAULT_TIMEOUT_MSECS (10 * 1000)
#define CASBOX_OBJSTORE_SECRET_MAX 4096

/* <dir of the module this code is in>/libcasbox_objstore_<name>.so,
   loaded once and never unloaded (librados keeps threads). */
static const struct casbox_objstore_vfuncs *
casbox_objstore_load(const char *name, const char **error_r)
{
	const struct casbox_objstore_vfuncs *v;
	const char *path, *dir, *slash;
	char *real;
	Dl_info info;
	void *handle;

	if (dladdr((void *)casbox_objstore_create, &info) == 0 ||
	    info.dli_fname == NULL) {
		*error_r = "dladdr() failed";
		return NULL;
	}
	/* the test harness links the plugin into a staged module dir */
	real = realpath(info.dli_fname, NULL);
	dir = real == NULL ? info.dli_fname : real;
	slash = strrchr(dir, '/');
	path = t_strdup_printf("%s/libcasbox_objstore_%s.so",
			       slash == NULL ? "." : t_strdup_until(dir, slash),
			       name);
	free(real);
	handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (handle == NULL) {
		*error_r = t_strdup_printf("casbox_pack_storage: %s: driver "
			"module %s not loadable (%s): this build has no %s "
			"support, or it is not installed", name, path,
			dlerror(), name);
		return NULL;
	}
	v = dlsym(handle, t_strdup_printf("casbox_objstore_%s", name));
	if (v == NULL) {
		*error_r = t_strdup_printf("%s: no casbox_objstore_%s", path,
					   name);
		return NULL;
	}
	return v;
}

static const struct casbox_objstore_vfuncs *
casbox_objstore_driver(const char *name, const char **error_r)
{
	if (strcmp(name, "dir") == 0)
		return &casbox_objstore_dir;
	if (strcmp(name, "rados") == 0 || strcmp(name, "s3") == 0)
		return casbox_objstore_load(name, error_r);
	*error_r = t_strdup_printf("casbox_pack_storage: unknown driver '%s' "
				   "(expected local, dir, rados or s3)", name);
	return NULL;
}

const char *casbox_objstore_opt(const char *const *opts, const char *key)
{
	size_t len = strlen(key);

	for (; *opts != NULL; opts++) {
		if (strncmp(*opts, key, len) == 0 && (*opts)[len] == '=')
			return *opts + len + 1;
	}
	return NULL;
}

/* Options every driver takes: prefix, timeout (seconds). */
static int
casbox_objstore_common_opts(struct casbox_objstore *os,
			    const char *const *opts, const char **error_r)
{
	const char *value;
	unsigned int secs;

	value = casbox_objstore_opt(opts, "prefix");
	if (value == NULL || *value == '\0') {
		/* every user's first pack is pack-00000001.cbp: without a
		   prefix per user, users would overwrite each other */
		*error_r = "casbox_pack_storage: prefix= is required, one per "
			"user (e.g. prefix=%u/)";
		return -1;
	}
	os->prefix = p_strdup(os->pool, value);
	if (strchr(os->prefix, '\n') != NULL || strstr(os->prefix, "..")) {
		*error_r = "casbox_pack_storage: invalid prefix";
		return -1;
	}
	os->timeout_msecs = CASBOX_OBJSTORE_DEFAULT_TIMEOUT_MSECS;
	value = casbox_objstore_opt(opts, "timeout");
	if (value != NULL) {
		if (str_to_uint(value, &secs) < 0 || secs == 0 ||
		    secs > 3600) {
			*error_r = t_strdup_printf("casbox_pack_storage: "
				"invalid timeout '%s' (seconds, 1-3600)",
				value);
			return -1;
		}
		os->timeout_msecs = secs * 1000;
	}
	return 0;
}

int casbox_objstore_create(const char *spec, struct casbox_objstore **os_r,
			   const char **error_r)
{
	const struct casbox_objstore_vfuncs *v;
	struct casbox_objstore *os;
	const char *p, *const *opts;
	pool_t pool;

	*os_r = NULL;
	if (spec == NULL || *spec == '\0' || strcmp(spec, "local") == 0)
		return 0;
	p = strchr(spec, ':');
	if (p == NULL) {
		*error_r = t_strdup_printf("casbox_pack_storage: '%s': "
			"expected driver:key=value,...", spec);
		return -1;
	}
	v = casbox_objstore_driver(t_strdup_until(spec, p), error_r);
	if (v == NULL)
		return -1;
	opts = (const char *const *)t_strsplit(p + 1, ",");
	pool = pool_alloconly_create("casbox objstore", 1024);
	os = p_new(pool, struct casbox_objstore, 1);
	os->pool = pool;
	os->v = v;
	os->label = v->name;
	if (casbox_objstore_common_opts(os, opts, error_r) < 0 ||
	    v->init(os, opts, error_r) < 0) {
		pool_unref(&pool);
		return -1;
	}
	*os_r = os;
	return 1;
}

void casbox_objstore_destroy(struct casbox_objstore **_os)
{
	struct casbox_objstore *os = *_os;

	if (os == NULL)
		return;
	*_os = NULL;
	os->v->deinit(os);
	pool_unref(&os->pool);
}

const char *casbox_objstore_pack_name(struct casbox_objstore *os,
				      uint32_t pack_id)
{
	return t_strdup_printf("%spack-%08u.cbp", os->prefix, pack_id);
}

uint32_t casbox_objstore_pack_id(struct casbox_objstore *os,
				 const char *name)
{
	size_t plen = strlen(os->prefix);
	unsigned int id;
	char end;

	if (strncmp(name, os->prefix, plen) != 0)
		return 0;
	name += plen;
	if (strlen(name) != 17 ||
	    sscanf(name, "pack-%08u.cb%c", &id, &end) != 2 || end != 'p')
		return 0;
	return id;
}

static const char *
casbox_objstore_error(struct casbox_objstore *os, const char *op,
		      const char *name, const char *error)
{
	return t_strdup_printf("object storage %s: %s %s: %s", os->label, op,
			       name, error);
}

int casbox_objstore_put(struct casbox_objstore *os, const char *name, int fd,
			uint64_t size, const char **error_r)
{
	const char *error;

	if (os->v->put(os, name, fd, size, &error) < 0) {
		*error_r = casbox_objstore_error(os, "put", name, error);
		return -1;
	}
	return 1;
}

int casbox_objstore_get(struct casbox_objstore *os, const char *name,
			uint64_t offset, void *buf, size_t size,
			size_t *read_r, const char **error_r)
{
	const char *error;
	int ret;

	*read_r = 0;
	ret = os->v->get(os, name, offset, buf, size, read_r, &error);
	if (ret < 0)
		*error_r = casbox_objstore_error(os, "get", name, error);
	else if (ret == 0) {
		*error_r = casbox_objstore_error(os, "get", name,
						 "object not found");
	}
	return ret;
}

int casbox_objstore_stat(struct casbox_objstore *os, const char *name,
			 uint64_t *size_r, const char **error_r)
{
	const char *error;
	int ret;

	ret = os->v->stat(os, name, size_r, &error);
	if (ret < 0)
		*error_r = casbox_objstore_error(os, "stat", name, error);
	return ret;
}

static int uint32_cmp(const uint32_t *a, const uint32_t *b)
{
	return *a < *b ? -1 : (*a > *b ? 1 : 0);
}

int casbox_objstore_list_packs(struct casbox_objstore *os,
			       ARRAY_TYPE(uint32_t) *ids,
			       const char **error_r)
{
	ARRAY_TYPE(const_string) names;
	const char *error, *const *namep;
	uint32_t id;
	pool_t pool;

	pool = pool_alloconly_create("casbox objstore list", 4096);
	p_array_init(&names, pool, 64);
	if (os->v->list(os, os->prefix, pool, &names, &error) < 0) {
		*error_r = casbox_objstore_error(os, "list", os->prefix,
						 error);
		pool_unref(&pool);
		return -1;
	}
	array_foreach(&names, namep) {
		id = casbox_objstore_pack_id(os, *namep);
		if (id != 0)
			array_push_back(ids, &id);
	}
	pool_unref(&pool);
	array_sort(ids, uint32_cmp);
	return 0;
}

int casbox_objstore_delete(struct casbox_objstore *os, const char *name,
			   const char **error_r)
{
	const char *error;
	int ret;

	ret = os->v->delete(os, name, &error);
	if (ret < 0)
		*error_r = casbox_objstore_error(os, "delete", name, error);
	return ret;
}

int casbox_objstore_read_secret(pool_t pool, const char *path,
				const char **secret_r, const char **error_r)
{
	char buf[CASBOX_OBJSTORE_SECRET_MAX + 1];
	ssize_t ret;
	size_t len;
	int fd;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	ret = read(fd, buf, sizeof(buf));
	i_close_fd(&fd);
	if (ret < 0) {
		*error_r = t_strdup_printf("read(%s) failed: %m", path);
		return -1;
	}
	if ((size_t)ret > CASBOX_OBJSTORE_SECRET_MAX) {
		*error_r = t_strdup_printf("%s: too large for a credentials "
					   "file", path);
		return -1;
	}
	len = ret;
	while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
		len--;
	*secret_r = p_strndup(pool, buf, len);
	safe_memset(buf, 0, sizeof(buf));
	return 0;
}
