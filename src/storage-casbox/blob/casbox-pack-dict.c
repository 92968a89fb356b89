/* Compression dictionaries: <dir>/dict-NNNNNNNN.cbd holds a zstd
   dictionary sealed with the index key (AAD "casbox-dict:<id>"), so a
   dictionary trained on mail reveals nothing on disk and cannot be
   swapped for another id. Ids grow; the highest is used for new small
   blobs. Dictionaries are never deleted: old frames name them. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "write-full.h"
#include "cas-durable.h"
#include "casbox-pack-private.h"

#include <sodium.h>
#define ZDICT_STATIC_LINKING_ONLY
#include <zdict.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

/* A dictionary takes 1/CASBOX_DICT_SAMPLE_RATIO of its samples' bytes,
   within these bounds: one trained at 64 KiB from ~200 header blocks
   cost a small store more than it saved (doc/benchmarks.md,
   "Dictionaries"). */
#define CASBOX_DICT_CAPACITY (64 * 1024)
#define CASBOX_DICT_MIN_CAPACITY (8 * 1024)
#define CASBOX_DICT_SAMPLE_RATIO 16
/* fastCover's frequency table has 2^f entries (4 bytes each, plus 2 per
   entry for each parameter set it tries). ZDICT_trainFromBuffer()'s
   f = 20 took 11.8 MB of peak RSS for 500 header blocks (2 MB), inside
   the LMTP process whose delivery trains; f = 17 takes 3.1 MB, and the
   dictionary compresses held-out header blocks 0.4 % worse (measured:
   doc/benchmarks.md, "Dictionary training memory"). d and steps are
   ZDICT_trainFromBuffer()'s. */
#define CASBOX_DICT_FASTCOVER_F 17
#define CASBOX_DICT_FASTCOVER_D 8
#define CASBOX_DICT_FASTCOVER_STEPS 4

static const char *
casbox_dict_path(struct casbox_pack_store *store, uint32_t id)
{
	return t_strdup_printf("%s/dict-%08u.cbd", store->set.dir, id);
}

static const char *casbox_dict_aad(uint32_t id)
{
	return t_strdup_printf("casbox-dict:%u", id);
}

const struct casbox_pack_dict *
casbox_pack_dict_lookup(struct casbox_pack_store *store, uint32_t dict_id)
{
	struct casbox_pack_dict *dict;

	array_foreach_elem(&store->dicts, dict) {
		if (dict->id == dict_id)
			return dict;
	}
	return NULL;
}

/* A new entry of store->dicts. Entries are allocated one by one: blob
   streams keep pointers to them while another frame's open loads a
   dictionary trained since (an array of structs would move them). */
static struct casbox_pack_dict *
casbox_pack_dict_new(struct casbox_pack_store *store, uint32_t id)
{
	struct casbox_pack_dict *dict = i_new(struct casbox_pack_dict, 1);

	dict->id = id;
	array_push_back(&store->dicts, &dict);
	return dict;
}

ZSTD_CDict *
casbox_pack_dict_get_cdict(struct casbox_pack_store *store, uint32_t dict_id)
{
	struct casbox_pack_dict *dict;

	array_foreach_elem(&store->dicts, dict) {
		if (dict->id != dict_id)
			continue;
		if (dict->error != NULL)
			return NULL;
		if (dict->cdict == NULL) {
			dict->cdict = ZSTD_createCDict(dict->content->data,
						       dict->content->used,
						       store->set.zstd_level);
		}
		return dict->cdict;
	}
	return NULL;
}

uint32_t casbox_pack_dict_current(struct casbox_pack_store *store)
{
	const char *error;

	if (!store->dicts_listed &&
	    casbox_pack_dicts_load(store, &error) < 0)
		i_error("casbox: %s", error);
	return store->cur_dict_id;
}

static void
casbox_pack_dict_add(struct casbox_pack_store *store, uint32_t id,
		     const void *data, size_t size)
{
	struct casbox_pack_dict *dict = casbox_pack_dict_new(store, id);

	dict->content = buffer_create_dynamic(default_pool, size);
	buffer_append(dict->content, data, size);
	dict->ddict = ZSTD_createDDict(data, size);
	if (dict->ddict == NULL) {
		dict->error = p_strdup_printf(store->pool,
			"dictionary %u: zstd rejected it", id);
		return;
	}
	if (id > store->cur_dict_id)
		store->cur_dict_id = id;
}

static int
casbox_pack_dict_read(struct casbox_pack_store *store, uint32_t id,
		      buffer_t *sealed, const char **error_r)
{
	const char *path = casbox_dict_path(store, id);
	int ret;

	ret = cas_durable_read_file(store->io, path, CASBOX_DICT_MAX_SIZE + 64,
				    sealed, error_r);
	if (ret == 0) {
		errno = ENOENT;
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	return ret < 0 ? -1 : 0;
}

static void casbox_pack_dict_load(struct casbox_pack_store *store,
				  uint32_t id)
{
	buffer_t *sealed, *plain;
	const char *aad = casbox_dict_aad(id), *error;
	struct casbox_pack_dict *dict;

	sealed = buffer_create_dynamic(default_pool, 1024);
	plain = buffer_create_dynamic(default_pool, 1024);
	if (!cas_keyring_can_decrypt(store->keyring)) {
		/* password mode without the password (LMTP): new blobs are
		   compressed without a dictionary, reading needs the
		   password anyway */
		dict = casbox_pack_dict_new(store, id);
		dict->error = p_strdup_printf(store->pool,
			"%s: user key is locked (casbox_key_mode=password "
			"needs the user's password)",
			casbox_dict_path(store, id));
	} else if (casbox_pack_dict_read(store, id, sealed, &error) < 0 ||
	    cas_record_open(store->keyring, aad, strlen(aad), sealed->data,
			    sealed->used, plain, &error) < 0) {
		/* frames using it fail with this reason; the rest works */
		dict = casbox_pack_dict_new(store, id);
		dict->error = p_strdup_printf(store->pool, "%s: %s",
			casbox_dict_path(store, id), error);
	} else {
		casbox_pack_dict_add(store, id, plain->data, plain->used);
	}
	buffer_free(&sealed);
	buffer_free(&plain);
}

void casbox_pack_dicts_load_listed(struct casbox_pack_store *store,
				   const ARRAY_TYPE(uint32_t) *dict_ids)
{
	const uint32_t *id;

	array_foreach(dict_ids, id) {
		if (casbox_pack_dict_lookup(store, *id) == NULL) T_BEGIN {
			casbox_pack_dict_load(store, *id);
		} T_END;
	}
	store->dicts_listed = TRUE;
}

int casbox_pack_dicts_load(struct casbox_pack_store *store,
			   const char **error_r)
{
	ARRAY_TYPE(uint32_t) dict_ids;
	int ret = 0;

	t_array_init(&dict_ids, 4);
	if (casbox_pack_list_dir(store, NULL, &dict_ids, error_r) < 0)
		ret = -1;
	else
		casbox_pack_dicts_load_listed(store, &dict_ids);
	return ret;
}

/* Key rotation --finish: one dictionary file sealed under an older key
   epoch, sealed again under the current one and written over its name
   (temporary file, fsync, rename, directory fsync). Returns 1 rewritten,
   0 already current, -1 I/O error, -2 it opens under no epoch. */
static int casbox_pack_dict_reseal(struct casbox_pack_store *store,
				   uint32_t id, const char **error_r)
{
	struct cas_durable_write_settings wset = {
		.io = store->io,
		.no_fsync = !store->set.fsync,
	};
	const char *aad = casbox_dict_aad(id), *path, *error;
	buffer_t *sealed, *resealed;
	int ret;

	path = casbox_dict_path(store, id);
	sealed = buffer_create_dynamic(default_pool, 1024);
	resealed = buffer_create_dynamic(default_pool, 1024);
	if (casbox_pack_dict_read(store, id, sealed, error_r) < 0)
		ret = -1;
	else if ((ret = cas_record_reseal(store->keyring, aad, strlen(aad),
					  sealed->data, sealed->used,
					  resealed, &error)) < 0) {
		*error_r = t_strdup_printf("%s: %s", path, error);
		ret = -2;
	} else if (ret > 0 &&
		   cas_durable_write_atomic(path, resealed->data,
					    resealed->used, &wset,
					    error_r) < 0) {
		ret = -1;
	}
	buffer_free(&sealed);
	buffer_free(&resealed);
	return ret;
}

int casbox_pack_dicts_reseal(struct casbox_pack_store *store,
			     unsigned int *resealed_r, unsigned int *failed_r,
			     const char **error_r)
{
	struct dirent *d;
	unsigned int id;
	const char *error;
	char end;
	DIR *dir;
	int ret = 0, r;

	*resealed_r = *failed_r = 0;
	dir = opendir(store->set.dir);
	if (dir == NULL) {
		*error_r = t_strdup_printf("opendir(%s) failed: %m",
					   store->set.dir);
		return -1;
	}
	while (ret == 0 && (d = readdir(dir)) != NULL) {
		if (sscanf(d->d_name, "dict-%08u.cb%c", &id, &end) != 2 ||
		    end != 'd' || strlen(d->d_name) != 17 || id == 0)
			continue;
		T_BEGIN {
			r = casbox_pack_dict_reseal(store, id, &error);
			if (r > 0)
				(*resealed_r)++;
			else if (r == -1) {
				*error_r = t_strdup(error);
				ret = -1;
			} else if (r < 0) {
				/* opens under no epoch: damaged before,
				   stays as it is */
				i_error("casbox key rotate: %s", error);
				(*failed_r)++;
			}
		} T_END_PASS_STR_IF(ret < 0, error_r);
	}
	if (closedir(dir) < 0 && ret == 0) {
		*error_r = t_strdup_printf("closedir(%s) failed: %m",
					   store->set.dir);
		ret = -1;
	}
	return ret;
}

void casbox_pack_dicts_free(struct casbox_pack_store *store)
{
	struct casbox_pack_dict *dict;

	array_foreach_elem(&store->dicts, dict) {
		ZSTD_freeCDict(dict->cdict);
		ZSTD_freeDDict(dict->ddict);
		if (dict->content != NULL) {
			/* trained on mail */
			sodium_memzero(buffer_get_modifiable_data(
					dict->content, NULL),
				       dict->content->used);
			buffer_free(&dict->content);
		}
		i_free(dict);
	}
	array_clear(&store->dicts);
	store->cur_dict_id = 0;
}

static int
casbox_pack_dict_write(struct casbox_pack_store *store, const void *dict,
		       size_t size, uint32_t *id_r, const char **error_r)
{
	struct cas_durable_write_settings wset = {
		.io = store->io,
		/* link(): the next free id even if another process trains
		   at the same time, and never half a dictionary under its
		   name */
		.no_replace = TRUE,
		/* the directory fsync makes the name durable before any
		   frame that uses it can be committed */
		.no_fsync = !store->set.fsync,
	};
	buffer_t *sealed;
	const char *path, *aad;
	uint32_t id = casbox_pack_dict_current(store);
	int ret;

	sealed = buffer_create_dynamic(default_pool, size + 64);
	do {
		id++;
		path = casbox_dict_path(store, id);
		aad = casbox_dict_aad(id);
		buffer_set_used_size(sealed, 0);
		cas_record_seal(store->keyring, aad, strlen(aad), dict, size,
				sealed);
		ret = cas_durable_write_atomic(path, sealed->data, sealed->used,
					       &wset, error_r);
	} while (ret < 0 && errno == EEXIST);
	buffer_free(&sealed);
	if (ret < 0)
		return -1;
	*id_r = id;
	return 0;
}

int casbox_pack_dict_train(struct casbox_pack_store *store,
			   const void *const *samples, const size_t *sizes,
			   unsigned int count, uint32_t *dict_id_r,
			   const char **error_r)
{
	ZDICT_fastCover_params_t params;
	buffer_t *all;
	unsigned char *dict;
	size_t dict_size, capacity;
	unsigned int i;
	int ret = -1;

	*dict_id_r = 0;
	if (!cas_keyring_can_decrypt(store->keyring)) {
		/* dictionaries are trained on user text, so password mode
		   seals them with the index key, which needs the password */
		*error_r = "user key is locked: training a dictionary in "
			"casbox_key_mode=password needs the user's password";
		return -1;
	}
	all = buffer_create_dynamic(default_pool, 64 * 1024);
	for (i = 0; i < count; i++)
		buffer_append(all, samples[i], sizes[i]);
	capacity = I_MIN(CASBOX_DICT_CAPACITY,
			 I_MAX(CASBOX_DICT_MIN_CAPACITY,
			       all->used / CASBOX_DICT_SAMPLE_RATIO));
	dict = i_malloc(capacity);
	i_zero(&params);
	params.f = CASBOX_DICT_FASTCOVER_F;
	params.d = CASBOX_DICT_FASTCOVER_D;
	params.steps = CASBOX_DICT_FASTCOVER_STEPS;
	params.zParams.compressionLevel = ZSTD_CLEVEL_DEFAULT;
	dict_size = ZDICT_optimizeTrainFromBuffer_fastCover(dict, capacity,
		all->data, sizes, count, &params);
	if (ZDICT_isError(dict_size)) {
		*error_r = t_strdup_printf("ZDICT_optimizeTrainFromBuffer_"
					   "fastCover() failed: %s",
					   ZDICT_getErrorName(dict_size));
	} else if (casbox_pack_dict_write(store, dict, dict_size, dict_id_r,
					  error_r) == 0) {
		casbox_pack_dict_add(store, *dict_id_r, dict, dict_size);
		ret = 1;
	}
	/* samples are mail: wipe what we copied */
	sodium_memzero(buffer_get_modifiable_data(all, NULL), all->used);
	buffer_free(&all);
	sodium_memzero(dict, capacity);
	i_free(dict);
	return ret;
}
