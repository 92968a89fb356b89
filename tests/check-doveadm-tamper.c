/* doveadm-tamper <casbox root> refcount <delta>: add delta to the
   refcount of the first blob record, so e2e tests can check that
   `doveadm casbox scrub` finds and --repair fixes refcount drift.
   doveadm-tamper <casbox root> compact: flush and merge the LSM into
   one table (so a test has a table block to damage).
   doveadm-tamper <casbox root> drop-blob <blob id hex>: delete the blob
   record (its messages then reference a missing blob).
   doveadm-tamper <casbox root> swap-parts: give the first message
   record the second one's last part, keeping its header and MAC
   (records v2: an edit without the record key, which reads must refuse).
   Run as the mail user. Exit 0 done, 1 nothing to tamper, 2 error. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "hex-binary.h"
#include "casbox-lsm.h"
#include "casbox-records.h"
#include "test-store-lsm.h"
#include "casbox-record-auth.h"

#include <stdlib.h>

/* The record inside a v2 value (not verified). */
static void
v2_decode(const unsigned char *value, size_t value_size, pool_t pool,
	  struct casbox_msg_record *rec_r)
{
	const char *error;

	if (value_size < CASBOX_RECORD_AUTH_OVERHEAD ||
	    value[0] != CASBOX_RECORD_AUTH_VERSION)
		i_fatal_status(2, "not a v2 message record");
	if (casbox_msg_record_import(value + CASBOX_RECORD_AUTH_HEADER_SIZE,
				     value_size - CASBOX_RECORD_AUTH_OVERHEAD,
				     pool, rec_r, &error) < 0)
		i_fatal_status(2, "message record: %s", error);
}

static int swap_parts(struct casbox_lsm *lsm)
{
	unsigned char prefix = CASBOX_KEY_MESSAGE;
	struct casbox_msg_record rec[2];
	struct casbox_msg_part *p0;
	const struct casbox_msg_part *p1;
	struct casbox_lsm_batch *batch;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	buffer_t *key0, *value0, *out;
	const char *error;
	unsigned int n = 0;

	key0 = t_buffer_create(32);
	value0 = t_buffer_create(512);
	iter = casbox_lsm_iter_init(lsm, &prefix, 1);
	while (n < 2 && casbox_lsm_iter_next(iter, &key, &key_size,
					     &value, &value_size)) {
		v2_decode(value, value_size, pool_datastack_create(), &rec[n]);
		if (n == 0) {
			buffer_append(key0, key, key_size);
			buffer_append(value0, value, value_size);
		}
		n++;
	}
	if (casbox_lsm_iter_deinit(&iter, &error) < 0)
		i_fatal_status(2, "iterate: %s", error);
	if (n < 2)
		return 1;
	p0 = array_idx_modifiable(&rec[0].parts,
				  array_count(&rec[0].parts) - 1);
	p1 = array_idx(&rec[1].parts, array_count(&rec[1].parts) - 1);
	rec[0].physical_size += p1->size - p0->size;
	rec[0].virtual_size = rec[0].physical_size;
	*p0 = *p1;
	out = t_buffer_create(512);
	buffer_append(out, value0->data, CASBOX_RECORD_AUTH_HEADER_SIZE);
	casbox_msg_record_export(&rec[0], out);
	buffer_append(out, CONST_PTR_OFFSET(value0->data, value0->used -
					    CASBOX_RECORD_MAC_SIZE),
		      CASBOX_RECORD_MAC_SIZE);
	if (casbox_lsm_batch_begin(lsm, &batch, &error) < 0)
		i_fatal_status(2, "lock: %s", error);
	casbox_lsm_batch_put(batch, key0->data, key0->used,
			     out->data, out->used);
	if (casbox_lsm_batch_commit(&batch, &error) < 0)
		i_fatal_status(2, "commit: %s", error);
	return 0;
}

int main(int argc, char *argv[])
{
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
	    (argc != 3 || (strcmp(argv[2], "compact") != 0 &&
			   strcmp(argv[2], "swap-parts") != 0))) {
		i_fatal("usage: doveadm-tamper <casbox root> "
			"refcount <delta> | compact | drop-blob <hex> | "
			"swap-parts");
	}
	if (test_store_lsm_open(argv[1], NULL, TRUE, &lsm, &error) < 0)
		i_fatal_status(2, "open %s/lsm: %s", argv[1], error);
	if (argc == 3 && strcmp(argv[2], "swap-parts") == 0) {
		ret = swap_parts(lsm);
		test_store_lsm_close(&lsm);
		lib_deinit();
		return ret;
	}
	if (argc == 3) {
		if (casbox_lsm_compact(lsm, &error) < 0)
			i_fatal_status(2, "compact %s/lsm: %s", argv[1], error);
		test_store_lsm_close(&lsm);
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
			i_fatal_status(2, "lock %s/lsm: %s", argv[1], error);
		casbox_lsm_batch_delete(batch, tkey->data, tkey->used);
		if (casbox_lsm_batch_commit(&batch, &error) < 0)
			i_fatal_status(2, "commit: %s", error);
		test_store_lsm_close(&lsm);
		lib_deinit();
		return 0;
	}
	delta = atoi(argv[3]);
	if (casbox_lsm_batch_begin(lsm, &batch, &error) < 0)
		i_fatal_status(2, "lock %s/lsm: %s", argv[1], error);
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
	test_store_lsm_close(&lsm);
	lib_deinit();
	return ret;
}
