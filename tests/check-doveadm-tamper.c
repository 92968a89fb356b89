/* doveadm-tamper <casbox root> refcount <delta>: add delta to the
   refcount of the first blob record, so e2e tests can check that
   `doveadm casbox scrub` finds and --repair fixes refcount drift.
   doveadm-tamper <casbox root> compact: flush and merge the LSM into
   one table (so a test has a table block to damage).
   doveadm-tamper <casbox root> drop-blob <blob id hex>: delete the blob
   record (its messages then reference a missing blob).
   Run as the mail user. Exit 0 done, 1 nothing to tamper, 2 error. */

#include "lib.h"
#include "buffer.h"
#include "hex-binary.h"
#include "casbox-lsm.h"
#include "casbox-records.h"

#include <stdlib.h>

int main(int argc, char *argv[])
{
	struct casbox_lsm_settings set;
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	struct casbox_lsm_iter *iter;
	struct casbox_blob_value bval;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	unsigned char prefix = CASBOX_KEY_BLOB;
	buffer_t *tkey, *tvalue;
	const char *error;
	int delta, ret = 1;

	lib_init();
	if ((argc != 4 || (strcmp(argv[2], "refcount") != 0 &&
			   strcmp(argv[2], "drop-blob") != 0)) &&
	    (argc != 3 || strcmp(argv[2], "compact") != 0)) {
		i_fatal("usage: doveadm-tamper <casbox root> "
			"refcount <delta> | compact | drop-blob <hex>");
	}
	i_zero(&set);
	set.dir = t_strconcat(argv[1], "/lsm", NULL);
	set.lock_method = FILE_LOCK_METHOD_FCNTL;
	set.fsync = TRUE;
	if (casbox_lsm_open(&set, &lsm, &error) < 0)
		i_fatal_status(2, "open %s: %s", set.dir, error);
	if (argc == 3) {
		if (casbox_lsm_compact(lsm, &error) < 0)
			i_fatal_status(2, "compact %s: %s", set.dir, error);
		casbox_lsm_close(&lsm);
		lib_deinit();
		return 0;
	}
	if (strcmp(argv[2], "drop-blob") == 0) {
		tkey = t_buffer_create(64);
		buffer_append_c(tkey, CASBOX_KEY_BLOB);
		if (hex_to_binary(argv[3], tkey) < 0 ||
		    tkey->used != 1 + CAS_BLOB_ID_SIZE)
			i_fatal_status(2, "bad blob id %s", argv[3]);
		if (casbox_lsm_batch_begin(lsm, &batch, &error) < 0)
			i_fatal_status(2, "lock %s: %s", set.dir, error);
		casbox_lsm_batch_delete(batch, tkey->data, tkey->used);
		if (casbox_lsm_batch_commit(&batch, &error) < 0)
			i_fatal_status(2, "commit: %s", error);
		casbox_lsm_close(&lsm);
		lib_deinit();
		return 0;
	}
	delta = atoi(argv[3]);
	if (casbox_lsm_batch_begin(lsm, &batch, &error) < 0)
		i_fatal_status(2, "lock %s: %s", set.dir, error);
	tkey = t_buffer_create(64);
	tvalue = t_buffer_create(128);
	iter = casbox_lsm_iter_init(lsm, &prefix, 1);
	if (casbox_lsm_iter_next(iter, &key, &key_size, &value, &value_size)) {
		if (casbox_blob_value_import(value, value_size, &bval,
					     &error) < 0)
			i_fatal_status(2, "blob record: %s", error);
		bval.refcount += delta;
		buffer_append(tkey, key, key_size);
		casbox_blob_value_export(&bval, tvalue);
		ret = 0;
	}
	if (casbox_lsm_iter_deinit(&iter, &error) < 0)
		i_fatal_status(2, "iterate: %s", error);
	if (ret == 0) {
		casbox_lsm_batch_put(batch, tkey->data, tkey->used,
				     tvalue->data, tvalue->used);
		if (casbox_lsm_batch_commit(&batch, &error) < 0)
			i_fatal_status(2, "commit: %s", error);
	} else {
		casbox_lsm_batch_rollback(&batch);
	}
	casbox_lsm_close(&lsm);
	lib_deinit();
	return ret;
}
