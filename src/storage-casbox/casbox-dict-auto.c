/* casbox_dict_autotrain: after saves, now and then, let the store train
   its first compression dictionary (casbox_store_dict_autotrain()).
   Checking costs an LSM scan of up to 16 x casbox_dict_autotrain blob
   records while there is no dictionary, so a process checks a store
   only every casbox_dict_autotrain / 8 saves (at most 32) of it, and
   twice as seldom after each check that trained nothing (a store of
   mostly large blobs may never have enough small ones) or failed, up
   to every DICT_AUTO_MAX_INTERVAL saves. LMTP gives every delivery a
   new mail user and storage, so the counts are the process's, per
   casbox root, for the last few roots it saved to. */

#include "lib.h"
#include "mail-storage-private.h"
#include "casbox-store.h"
#include "casbox-storage.h"
#include "casbox-plugin.h"
#include "casbox-dict-auto.h"

#define DICT_AUTO_ROOTS 16
#define DICT_AUTO_MAX_CHECK_EVERY 32
#define DICT_AUTO_MAX_INTERVAL 4096

struct dict_auto_root {
	char *root_dir;
	/* saves since the last check, and how many until the next */
	unsigned int saves, interval;
};

static struct dict_auto_root dict_auto_roots[DICT_AUTO_ROOTS];

/* The root's entry: found, or the one with the fewest saves reused. */
static struct dict_auto_root *dict_auto_root_get(const char *root_dir)
{
	struct dict_auto_root *root, *least = &dict_auto_roots[0];
	unsigned int i;

	for (i = 0; i < DICT_AUTO_ROOTS; i++) {
		root = &dict_auto_roots[i];
		if (root->root_dir != NULL &&
		    strcmp(root->root_dir, root_dir) == 0)
			return root;
		if (root->root_dir == NULL ||
		    (least->root_dir != NULL && root->saves < least->saves))
			least = root;
	}
	i_free(least->root_dir);
	least->root_dir = i_strdup(root_dir);
	least->saves = 0;
	least->interval = 0;
	return least;
}

static void
casbox_dict_autotrain_log(struct casbox_storage *storage,
			  const struct casbox_store_dict_train_result *res)
{
	struct event *event;

	event = event_create(storage->storage.event);
	event_set_name(event, "casbox_dict_trained");
	event_add_int(event, "dict_id", res->dict_id);
	event_add_int(event, "samples", res->samples);
	event_add_int(event, "heldout", res->heldout);
	event_add_int(event, "heldout_bytes", res->plain_bytes);
	event_add_int(event, "zstd_bytes", res->without_bytes);
	event_add_int(event, "dict_bytes", res->with_bytes);
	e_info(event, CASBOX_LOG_PREFIX"Trained compression dictionary %u "
	       "from the header blocks of %u small messages and parts "
	       "(casbox_dict_autotrain = %u): %u held-out header blocks "
	       "compress to %"PRIu64" bytes with it, %"PRIu64" without",
	       res->dict_id, res->samples, storage->set.dict_autotrain,
	       res->heldout, res->with_bytes, res->without_bytes);
	event_unref(&event);
}

void casbox_dict_autotrain_saved(struct casbox_storage *storage,
				 unsigned int count)
{
	struct casbox_store_dict_train_result res;
	struct dict_auto_root *root;
	unsigned int min_blobs = storage->set.dict_autotrain;
	unsigned int check_every;
	const char *error;
	int ret;

	if (min_blobs == 0 || storage->store == NULL || count == 0)
		return;
	check_every = I_MAX(1, I_MIN(min_blobs / 8,
				     DICT_AUTO_MAX_CHECK_EVERY));
	root = dict_auto_root_get(storage->root_dir);
	if (root->interval == 0)
		root->interval = check_every;
	root->saves += count;
	if (root->saves < root->interval)
		return;
	root->saves = 0;

	T_BEGIN {
		ret = casbox_store_dict_autotrain(storage->store, min_blobs,
						  &res, &error);
		if (ret > 0) {
			casbox_dict_autotrain_log(storage, &res);
		} else {
			/* nothing to do (a store with a dictionary costs
			   nothing to check, one without enough small blobs
			   does) or failed (the save is done; a damaged
			   sample would fail every check): later */
			root->interval = I_MIN(root->interval * 2,
					       DICT_AUTO_MAX_INTERVAL);
		}
		if (ret < 0) {
			e_warning(storage->storage.event, CASBOX_LOG_PREFIX
				  "Training a compression dictionary "
				  "(casbox_dict_autotrain) failed: %s; next "
				  "try in %u saves", error, root->interval);
		} else if (ret == 0) {
			e_debug(storage->storage.event, CASBOX_LOG_PREFIX
				"Dictionary check: nothing to train "
				"(casbox_dict_autotrain = %u); next check "
				"in %u saves", min_blobs, root->interval);
		}
	} T_END;
}

void casbox_dict_autotrain_deinit(void)
{
	unsigned int i;

	for (i = 0; i < DICT_AUTO_ROOTS; i++)
		i_free(dict_auto_roots[i].root_dir);
}
