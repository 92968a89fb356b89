/* doveadm casbox: a store opened directly, without lib-storage (so unit
   tests can open one from a directory). */

#include "lib.h"
#include "array.h"
#include "str.h"
#include "byteorder.h"
#include "casbox-lsm.h"
#include "doveadm-casbox.h"

#include <dirent.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/stat.h>

int casbox_admin_open_root(const char *root_dir,
			   const struct casbox_settings *set,
			   enum fsync_mode fsync_mode,
			   enum file_lock_method lock_method,
			   struct casbox_admin **adm_r, const char **error_r)
{
	struct casbox_lsm_settings lsm_set;
	struct casbox_admin *adm;
	const char *lsm_dir, *error;
	struct stat st;

	lsm_dir = t_strconcat(root_dir, "/lsm", NULL);
	if (stat(lsm_dir, &st) < 0) {
		if (errno == ENOENT) {
			*error_r = t_strdup_printf("no casbox store at %s",
						   root_dir);
			return 0;
		}
		*error_r = t_strdup_printf("stat(%s) failed: %m", lsm_dir);
		return -1;
	}
	adm = i_new(struct casbox_admin, 1);
	adm->pool = pool_alloconly_create("doveadm casbox", 1024);
	adm->root_dir = p_strdup(adm->pool, root_dir);
	adm->set = *set;
	adm->fsync_mode = fsync_mode;
	adm->lock_method = lock_method;
	i_zero(&lsm_set);
	lsm_set.dir = lsm_dir;
	lsm_set.fsync = fsync_mode != FSYNC_MODE_NEVER;
	lsm_set.lock_method = lock_method;
	if (casbox_lsm_open(&lsm_set, &adm->lsm, &error) < 0) {
		*error_r = t_strdup_printf("LSM %s: %s", lsm_dir, error);
		pool_unref(&adm->pool);
		i_free(adm);
		return -1;
	}
	*adm_r = adm;
	return 1;
}

/* The 'K' record names the store's key id: refuse any other key. */
static int casbox_admin_check_key_id(struct casbox_admin *adm,
				     const char **error_r)
{
	uint32_t key_id = cas_keyring_key_id(adm->keyring);
	unsigned char key = CASBOX_KEY_KEYRING;
	buffer_t *value = t_buffer_create(8);
	int ret;

	ret = casbox_lsm_get(adm->lsm, &key, 1, value, error_r);
	if (ret < 0)
		return -1;
	if (ret > 0 && (value->used != 5 ||
			be32_to_cpu_unaligned(CONST_PTR_OFFSET(
				value->data, 1)) != key_id)) {
		*error_r = t_strdup_printf(
			"key file %s is not the key of store %s",
			adm->set.key_file, adm->root_dir);
		return -1;
	}
	return 0;
}

int casbox_admin_open_keys(struct casbox_admin *adm, const char **error_r)
{
	struct casbox_pack_settings pack_set;
	const char *error;
	int ret;

	if (adm->packs != NULL)
		return 1;
	if (adm->set.key_file == NULL) {
		*error_r = "casbox_key_file setting is not set";
		return -1;
	}
	if (adm->keyring == NULL) {
		ret = cas_keyring_load(adm->set.key_file, &adm->keyring,
				       &error);
		if (ret <= 0) {
			*error_r = ret < 0 ?
				t_strdup_printf("key file %s: %s",
						adm->set.key_file, error) :
				t_strdup_printf("key file %s does not exist",
						adm->set.key_file);
			return -1;
		}
		if (casbox_admin_check_key_id(adm, error_r) < 0) {
			cas_keyring_free(&adm->keyring);
			return -1;
		}
	}
	i_zero(&pack_set);
	pack_set.dir = t_strconcat(adm->root_dir, "/packs", NULL);
	pack_set.fsync = adm->fsync_mode != FSYNC_MODE_NEVER;
	pack_set.max_pack_size = adm->set.pack_size;
	pack_set.zstd_level = adm->set.zstd_level;
	if (casbox_pack_store_open(&pack_set, adm->keyring, &adm->packs,
				   &error) < 0) {
		*error_r = t_strdup_printf("packs %s: %s", pack_set.dir,
					   error);
		return -1;
	}
	return 1;
}

int casbox_admin_open_packs_keyless(struct casbox_admin *adm,
				    const char **error_r)
{
	const char *dir_path = t_strconcat(adm->root_dir, "/packs", NULL);
	struct casbox_pack_settings pack_set;
	struct dirent *d;
	const char *error;
	bool have_dicts = FALSE;
	DIR *dir;

	i_assert(adm->packs == NULL);
	dir = opendir(dir_path);
	if (dir == NULL && errno != ENOENT) {
		*error_r = t_strdup_printf("opendir(%s) failed: %m", dir_path);
		return -1;
	}
	while (dir != NULL && (d = readdir(dir)) != NULL) {
		if (str_begins(d->d_name, "dict-"))
			have_dicts = TRUE;
	}
	if (dir != NULL)
		(void)closedir(dir);
	/* the pack store opens the dictionaries, which needs the key */
	if (have_dicts)
		return 0;
	i_zero(&pack_set);
	pack_set.dir = dir_path;
	pack_set.fsync = adm->fsync_mode != FSYNC_MODE_NEVER;
	if (casbox_pack_store_open(&pack_set, NULL, &adm->packs,
				   &error) < 0) {
		*error_r = t_strdup_printf("packs %s: %s", dir_path, error);
		return -1;
	}
	return 1;
}

void casbox_admin_close(struct casbox_admin **_adm)
{
	struct casbox_admin *adm = *_adm;

	*_adm = NULL;
	if (adm->packs != NULL)
		casbox_pack_store_close(&adm->packs);
	if (adm->keyring != NULL)
		cas_keyring_free(&adm->keyring);
	casbox_lsm_close(&adm->lsm);
	pool_unref(&adm->pool);
	if (adm->set_pool != NULL)
		pool_unref(&adm->set_pool);
	i_free(adm);
}

const char *casbox_admin_pack_path(struct casbox_admin *adm,
				   uint32_t pack_id)
{
	return t_strdup_printf("%s/packs/pack-%08u.cbp", adm->root_dir,
			       pack_id);
}

static int casbox_admin_pack_cmp(const struct casbox_admin_pack *p1,
				 const struct casbox_admin_pack *p2)
{
	return p1->pack_id < p2->pack_id ? -1 :
		(p1->pack_id > p2->pack_id ? 1 : 0);
}

int casbox_admin_list_packs(struct casbox_admin *adm, pool_t pool,
			    ARRAY_TYPE(casbox_admin_pack) *packs,
			    const char **error_r)
{
	const char *dir_path = t_strconcat(adm->root_dir, "/packs", NULL);
	struct casbox_admin_pack *pack;
	struct dirent *d;
	struct stat st;
	unsigned int id;
	char end;
	DIR *dir;

	p_array_init(packs, pool, 16);
	dir = opendir(dir_path);
	if (dir == NULL) {
		if (errno == ENOENT)
			return 0;
		*error_r = t_strdup_printf("opendir(%s) failed: %m", dir_path);
		return -1;
	}
	/* same naming rule as the pack store (doc/casbox-format.md) */
	while ((d = readdir(dir)) != NULL) {
		if (sscanf(d->d_name, "pack-%08u.cb%c", &id, &end) != 2 ||
		    end != 'p' || strlen(d->d_name) != 17 || id == 0)
			continue;
		if (stat(casbox_admin_pack_path(adm, id), &st) < 0)
			continue;
		pack = array_append_space(packs);
		pack->pack_id = id;
		pack->size = st.st_size;
	}
	if (closedir(dir) < 0) {
		*error_r = t_strdup_printf("closedir(%s) failed: %m",
					   dir_path);
		return -1;
	}
	array_sort(packs, casbox_admin_pack_cmp);
	return 0;
}

uint64_t casbox_admin_dir_size(const char *dir_path)
{
	struct dirent *d;
	struct stat st;
	uint64_t size = 0;
	const char *path;
	DIR *dir;

	dir = opendir(dir_path);
	if (dir == NULL)
		return 0;
	while ((d = readdir(dir)) != NULL) {
		if (strcmp(d->d_name, ".") == 0 || strcmp(d->d_name, "..") == 0)
			continue;
		path = t_strconcat(dir_path, "/", d->d_name, NULL);
		if (lstat(path, &st) < 0)
			continue;
		if (S_ISDIR(st.st_mode))
			size += casbox_admin_dir_size(path);
		else if (S_ISREG(st.st_mode))
			size += st.st_size;
	}
	(void)closedir(dir);
	return size;
}

static bool progress_shown = FALSE;

void casbox_admin_progress(const char *what, unsigned int done,
			   unsigned int total)
{
	if (!isatty(STDERR_FILENO))
		return;
	if (done != total && (done % 256) != 0)
		return;
	fprintf(stderr, "\r%s: %u/%u", what, done, total);
	progress_shown = TRUE;
}

void casbox_admin_progress_end(void)
{
	if (progress_shown) {
		fprintf(stderr, "\n");
		progress_shown = FALSE;
	}
}
