#ifndef TEST_STORE_LSM_H
#define TEST_STORE_LSM_H

/* Tests and test tools that open a casbox store's LSM directly (to read
   or bend records) open it as the store does: sealed with the store's
   key (casbox_store_lsm_settings() over a store opened without its
   LSM, which holds the key ring for as long as the LSM is open). */

#include "casbox-lsm.h"
#include "casbox-settings.h"
#include "casbox-store.h"
#include "casbox-store-rekey.h"

#include <sys/stat.h>
#include <sodium.h>

/* open LSMs and the key-holding stores behind them */
static struct {
	struct casbox_lsm *lsm;
	struct casbox_store *store;
} test_store_lsms[8];
static struct casbox_settings test_store_lsm_set;
static char *test_store_lsm_key_path;

/* The key file of root: $CASBOX_KEY_FILE, else the e2e tests' layout:
   <parent of root>/casbox.key, casbox.ukey (password mode), keys/... */
static inline const char *test_store_lsm_key_file(const char *root)
{
	static const char *const names[] = {
		"casbox.key", "casbox.ukey", "keys/casbox.key",
		"keys/casbox.ukey", "user.key",
	};
	const char *env = getenv("CASBOX_KEY_FILE"), *parent, *path, *p;
	struct stat st;
	unsigned int i;

	if (env != NULL && env[0] != '\0')
		return env;
	p = strrchr(root, '/');
	parent = p == NULL ? "." : t_strdup_until(root, p);
	for (i = 0; i < N_ELEMENTS(names); i++) {
		path = t_strconcat(parent, "/", names[i], NULL);
		if (stat(path, &st) == 0)
			return path;
	}
	return t_strconcat(parent, "/casbox.key", NULL);
}

/* Open root's LSM (root/lsm) with the key of set (which must stay
   valid until test_store_lsm_close()). Returns 1 ok, -1 error. */
static inline int
test_store_lsm_open_set(const char *root, const struct casbox_settings *set,
			bool fsync, struct casbox_lsm **lsm_r,
			const char **error_r)
{
	struct casbox_lsm_settings lsm_set;
	struct casbox_store *store;
	unsigned int i;

	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	for (i = 0; test_store_lsms[i].lsm != NULL; i++)
		i_assert(i + 1 < N_ELEMENTS(test_store_lsms));
	casbox_store_open_nolsm(root, set,
				fsync ? FSYNC_MODE_ALWAYS : FSYNC_MODE_NEVER,
				FILE_LOCK_METHOD_FCNTL, &store);
	if (casbox_store_lsm_settings(store, t_strconcat(root, "/lsm", NULL),
				      &lsm_set, error_r) < 0 ||
	    casbox_lsm_open(&lsm_set, lsm_r, error_r) < 0) {
		casbox_store_close(&store);
		return -1;
	}
	test_store_lsms[i].lsm = *lsm_r;
	test_store_lsms[i].store = store;
	return 1;
}

/* The same with key_file (NULL: found as above); the key mode is taken
   from the file name (".ukey" or $CASBOX_KEY_MODE=password: password
   mode). */
static inline int
test_store_lsm_open(const char *root, const char *key_file, bool fsync,
		    struct casbox_lsm **lsm_r, const char **error_r)
{
	const char *mode = getenv("CASBOX_KEY_MODE");
	size_t len;

	casbox_settings_defaults(&test_store_lsm_set);
	i_free(test_store_lsm_key_path);
	test_store_lsm_key_path = i_strdup(key_file != NULL ? key_file :
		test_store_lsm_key_file(root));
	test_store_lsm_set.key_file = test_store_lsm_key_path;
	len = strlen(test_store_lsm_key_path);
	if ((mode != NULL && strcmp(mode, "password") == 0) ||
	    (len > 5 && strcmp(test_store_lsm_key_path + len - 5,
			       ".ukey") == 0))
		test_store_lsm_set.key_mode = CAS_KEY_MODE_PASSWORD;
	return test_store_lsm_open_set(root, &test_store_lsm_set, fsync,
				       lsm_r, error_r);
}

static inline void test_store_lsm_close(struct casbox_lsm **lsm)
{
	unsigned int i;

	for (i = 0; test_store_lsms[i].lsm != *lsm; i++)
		i_assert(i + 1 < N_ELEMENTS(test_store_lsms));
	casbox_lsm_close(lsm);
	casbox_store_close(&test_store_lsms[i].store);
	test_store_lsms[i].lsm = NULL;
}

/* What key rotation --finish does to the LSM before it drops the old
   epoch (doveadm-casbox-key.c): every record with sealed metadata and
   every other authenticated record re-sealed, then the tables, WAL and
   MANIFEST, through a store of root opened with set's key file as it is
   now. A rotation test that drops the epoch without this loses the
   LSM, as a real --finish would. */
static inline void test_store_reseal_all(const char *root,
					 const struct casbox_settings *set)
{
	struct casbox_rekey_stats stats;
	struct casbox_store *store;
	buffer_t *pos;
	const char *error = NULL;
	int ret;

	if (casbox_store_open(root, set, FSYNC_MODE_ALWAYS,
			      FILE_LOCK_METHOD_FCNTL, &store, &error) < 0)
		i_fatal("reseal: store open: %s", error);
	i_zero(&stats);
	pos = buffer_create_dynamic(default_pool, 64);
	while ((ret = casbox_rekey_meta_step(store, 100, pos, &stats,
					     &error)) > 0) ;
	if (ret < 0)
		i_fatal("reseal: metadata: %s", error);
	buffer_set_used_size(pos, 0);
	while ((ret = casbox_rekey_records_step(store, 100, pos, &stats,
						&error)) > 0) ;
	if (ret < 0)
		i_fatal("reseal: records: %s", error);
	buffer_free(&pos);
	if (casbox_rekey_lsm(store, &error) < 0)
		i_fatal("reseal: lsm: %s", error);
	casbox_store_close(&store);
}

#endif
