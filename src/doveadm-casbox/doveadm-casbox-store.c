/* doveadm casbox: a store opened directly through the storage layer's
   casbox-store, without lib-storage (so unit tests can open one from a
   directory). */

#include "lib.h"
#include "mkdir-parents.h"
#include "array.h"
#include "str.h"
#include "doveadm-casbox.h"

#include <dirent.h>
#include <unistd.h>
#include <sys/stat.h>

int casbox_admin_open_root(const char *root_dir,
			   const struct casbox_settings *set,
			   enum fsync_mode fsync_mode,
			   enum file_lock_method lock_method,
			   struct casbox_admin **adm_r, const char **error_r)
{
	return casbox_admin_open_root_full(root_dir, set, fsync_mode,
					   lock_method, TRUE, adm_r, error_r);
}

int casbox_admin_open_root_full(const char *root_dir,
				const struct casbox_settings *set,
				enum fsync_mode fsync_mode,
				enum file_lock_method lock_method,
				bool open_lsm, struct casbox_admin **adm_r,
				const char **error_r)
{
	struct casbox_admin *adm;
	const char *lsm_dir;
	struct stat st;

	/* an admin command must not create a store where there is none
	   (without the LSM: the packs are the store) */
	lsm_dir = t_strconcat(root_dir, open_lsm ? "/lsm" : "/packs", NULL);
	if (stat(lsm_dir, &st) < 0 && errno == ENOENT && !open_lsm &&
	    set->pack_storage != NULL && *set->pack_storage != '\0') {
		/* rebuild --from-packs on a new server: the packs are in
		   object storage (casbox_pack_store_adopt_remote()) */
		if (mkdir_parents(lsm_dir, 0700) < 0 && errno != EEXIST) {
			*error_r = t_strdup_printf("mkdir(%s) failed: %m",
						   lsm_dir);
			return -1;
		}
	}
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
	adm->event = event_create(set->event);
	adm->set.event = adm->event;
	if (!open_lsm) {
		casbox_store_open_nolsm(root_dir, &adm->set, fsync_mode,
					lock_method, &adm->store);
		*adm_r = adm;
		return 1;
	}
	if (casbox_store_open(root_dir, &adm->set, fsync_mode, lock_method,
			      &adm->store, error_r) < 0) {
		event_unref(&adm->event);
		pool_unref(&adm->pool);
		i_free(adm);
		return -1;
	}
	adm->lsm = casbox_store_get_lsm(adm->store);
	*adm_r = adm;
	return 1;
}

int casbox_admin_open_keys(struct casbox_admin *adm, const char **error_r)
{
	if (adm->lsm == NULL)
		casbox_store_set_key_password(adm->store, adm->key_password);
	if (casbox_store_open_keys(adm->store, error_r) < 0)
		return -1;
	adm->keyring = casbox_store_get_keyring(adm->store);
	adm->packs = casbox_store_get_packs(adm->store);
	return 1;
}

int casbox_admin_refresh_keys(struct casbox_admin *adm, const char **error_r)
{
	i_assert(adm->keyring != NULL);
	/* reloaded in place: adm->keyring stays valid */
	return casbox_store_refresh_keys(adm->store, error_r);
}

int casbox_admin_open_packs_keyless(struct casbox_admin *adm,
				    const char **error_r)
{
	int ret;

	i_assert(adm->packs == NULL && adm->store != NULL);
	ret = casbox_store_open_packs_keyless(adm->store, error_r);
	if (ret > 0)
		adm->packs = casbox_store_get_packs(adm->store);
	return ret;
}

void casbox_admin_close(struct casbox_admin **_adm)
{
	struct casbox_admin *adm = *_adm;

	*_adm = NULL;
	casbox_store_close(&adm->store);
	event_unref(&adm->event);
	pool_unref(&adm->pool);
	if (adm->set_pool != NULL)
		pool_unref(&adm->set_pool);
	i_free(adm);
}

const char *casbox_admin_pack_path(struct casbox_admin *adm,
				   uint32_t pack_id)
{
	return casbox_census_pack_path(adm->root_dir, pack_id);
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
