/* Cross-message compression in the store (store/casbox-xmsg.c and the
   save, read and release paths of casbox-store.c): a reply's lead part
   becomes a delta against its parent's (or the sender's previous), the
   base is kept alive by its dependent's reference and released with it,
   reads are byte-exact and decode a base once when read in order, the
   chain depth stays bounded, and the settings turn it off. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "str.h"
#include "hex-binary.h"
#include "unlink-directory.h"
#include "casbox-lsm.h"
#include "casbox-settings.h"
#include "casbox-store.h"
#include "casbox-records.h"
#include "casbox-pack.h"
#include "casbox-base-cache.h"
#include "casbox-xmsg.h"
#include "casbox-store-rekey.h"
#include "casbox-store-gc.h"
#include "file-lock.h"
#include "cas-key.h"
#include "test-store-lsm.h"

#include <check.h>
#include "check-run.h"
#include "test-store-fixture.h"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char test_dir[] = "/tmp/check-store-xmsg.XXXXXX";
static const char *root, *key_path;
static struct casbox_settings set;
static const guid_128_t box_guid = { 1, 2, 3, 4, 5, 6, 7, 8,
				     9, 10, 11, 12, 13, 14, 15, 16 };

static void setup(void)
{
	test_store_fixture_setup(test_dir, &root, &set);
	key_path = set.key_file;
	set.part_split_size = 1024 * 1024;
	set.pack_size = 4 * 1024 * 1024;
}

static void teardown(void)
{
	test_store_fixture_teardown(test_dir);
}

static struct casbox_store *store_open(void)
{
	return test_store_fixture_open(root, &set, TRUE);
}

/* The blob record of id as stored: returns its refcount (0 = no
   record), *rec_r its pack record. */
static uint32_t blob_get(const struct cas_blob_id *id,
			 struct casbox_blob_record *rec_r)
{
	struct casbox_blob_value val;
	const char *error = NULL;
	uint32_t refcount = test_store_fixture_blob(root, &set, id, &val);

	i_zero(rec_r);
	if (refcount > 0) {
		ck_assert_int_eq(casbox_blob_record_import(val.pack_record,
			val.pack_record_size, rec_r, &error), 1);
	}
	return refcount;
}

static uint32_t blob_refcount(const struct cas_blob_id *id)
{
	struct casbox_blob_record rec;

	return blob_get(id, &rec);
}

/* base depth of id's record, checking its base is want (NULL: none) */
static unsigned int blob_depth(const struct cas_blob_id *id,
			       const struct cas_blob_id *want)
{
	struct casbox_blob_record rec;

	ck_assert_uint_gt(blob_get(id, &rec), 0);
	if (want == NULL)
		ck_assert_uint_eq(rec.base_depth, 0);
	else if (rec.base_depth > 0)
		ck_assert_mem_eq(rec.base_id.id, want->id, CAS_BLOB_ID_SIZE);
	return rec.base_depth;
}

struct test_msg {
	const char *text;
	struct casbox_xmsg_hints hints;
	struct casbox_msg_record rec;
};

/* A message of one part (the lead) with text, and its hints. */
static void
msg_init(struct casbox_store *store, pool_t pool, struct test_msg *msg,
	 const char *text, const char *msgid, const char *parent,
	 const char *sender)
{
	struct casbox_msg_part *part;
	struct istream *input;
	const char *error;

	i_zero(msg);
	msg->text = p_strdup(pool, text);
	msg->hints.message_id = msgid;
	msg->hints.parent_id = parent;
	msg->hints.sender = sender;
	casbox_msg_record_init(pool, &msg->rec);
	msg->rec.guid = "guid";
	part = array_append_space(&msg->rec.parts);
	part->size = strlen(text);
	msg->rec.physical_size = msg->rec.virtual_size = part->size;
	input = i_stream_create_from_data(msg->text, part->size);
	ck_assert_int_eq(casbox_store_blob_id(store, input, 0, part->size,
					      &part->id, &error), 0);
	i_stream_unref(&input);
}

static const struct cas_blob_id *lead_id(const struct test_msg *msg)
{
	const struct casbox_msg_part *part = array_idx(&msg->rec.parts, 0);

	return &part->id;
}

static void txn_add(struct casbox_store_txn *txn, uint32_t uid,
		    struct test_msg *msg)
{
	struct istream *inputs[2];
	const char *error = NULL;

	inputs[0] = i_stream_create_from_data(msg->text, strlen(msg->text));
	inputs[1] = NULL;
	casbox_store_txn_set_xmsg_hints(txn, &msg->hints);
	if (casbox_store_txn_add_msg(txn, box_guid, uid, &msg->rec, inputs,
				     &error) < 0)
		ck_abort_msg("add: %s", error);
	i_stream_unref(&inputs[0]);
}

static void save(struct casbox_store *store, uint32_t uid,
		 struct test_msg *msg)
{
	struct casbox_store_txn *txn;
	const char *error = NULL;

	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	txn_add(txn, uid, msg);
	if (casbox_store_txn_commit(&txn, &error) < 0)
		ck_abort_msg("commit: %s", error);
}

static void expunge(struct casbox_store *store, uint32_t uid)
{
	test_store_fixture_expunge(store, box_guid, uid);
}

static const char *read_msg(struct casbox_store *store, uint32_t uid)
{
	return test_store_fixture_read(store, box_guid, uid);
}

static void cache_clear(struct casbox_store *store)
{
	casbox_base_cache_clear(casbox_pack_store_get_base_cache(
					casbox_store_get_packs(store)));
}

/* ~6 kB that shares nothing with body_text() */
static const char *noise_text(unsigned int seed)
{
	unsigned char buf[3000];
	unsigned int i, x = seed;

	for (i = 0; i < sizeof(buf); i++) {
		x = x * 1103515245U + 12345U;
		buf[i] = x >> 16;
	}
	return binary_to_hex(buf, sizeof(buf));
}

/* 400 capitals G-Z: shares no string with body_text() (and is short:
   zstd picks its parameters by the size of input and prefix, so a
   longer prefix of any content can shrink a chunk of body_text()) */
static const char *letters_text(unsigned int seed)
{
	string_t *str = t_str_new(512);
	unsigned int i, x = seed;

	for (i = 0; i < 400; i++) {
		x = x * 1103515245U + 12345U;
		str_append_c(str, 'G' + (x >> 16) % 20);
	}
	return str_c(str);
}

/* ~6 kB of text that compresses against itself only a little */
static const char *body_text(unsigned int seed)
{
	string_t *str = t_str_new(8192);
	unsigned int i, x = seed * 2654435761U + 1;

	for (i = 0; i < 400; i++) {
		x = x * 1103515245U + 12345U;
		str_printfa(str, "line %u of the thread: %08x %u\n", i, x,
			    x % 977);
	}
	return str_c(str);
}

static const char *parent_text(void)
{
	return t_strconcat("From: a@example.org\nMessage-ID: <p1@x>\n"
			   "Subject: thread\n\n", body_text(1), NULL);
}

static const char *reply_text(const char *quoted, unsigned int n)
{
	return t_strdup_printf("From: b@example.org\nMessage-ID: <r%u@x>\n"
			       "In-Reply-To: <p1@x>\nSubject: Re: thread\n\n"
			       "reply %u on top\n%s", n, n, quoted);
}

/* A reply becomes a delta of its parent; the parent lives on through
   it after its own expunge, and both go with the reply. */
START_TEST(test_xmsg_reply)
{
	struct casbox_store *store = store_open();
	pool_t pool = pool_alloconly_create("test", 16384);
	struct test_msg parent, reply;
	uint64_t appended, parent_frame;
	struct casbox_blob_record rec;
	uint64_t chunks;

	msg_init(store, pool, &parent, parent_text(), "p1@x", NULL,
		 "a@example.org");
	msg_init(store, pool, &reply, reply_text(parent.text, 1), "r1@x",
		 "p1@x", "b@example.org");
	save(store, 1, &parent);
	appended = casbox_store_get_pack_bytes_appended(store);
	ck_assert_uint_eq(blob_get(lead_id(&parent), &rec), 1);
	parent_frame = rec.frame_size;
	save(store, 2, &reply);
	/* the reply is its parent plus a line: far smaller than it */
	ck_assert_uint_lt(casbox_store_get_pack_bytes_appended(store) -
			  appended, parent_frame / 4);
	ck_assert_uint_eq(blob_depth(lead_id(&reply), lead_id(&parent)), 1);
	ck_assert_uint_eq(blob_refcount(lead_id(&parent)), 2);
	ck_assert_uint_eq(blob_refcount(lead_id(&reply)), 1);

	/* in order, from a cold cache: the parent is decoded once */
	cache_clear(store);
	chunks = casbox_store_get_chunks_decoded();
	ck_assert_str_eq(read_msg(store, 1), parent.text);
	ck_assert_str_eq(read_msg(store, 2), reply.text);
	ck_assert_uint_eq(casbox_store_get_chunks_decoded() - chunks, 2);
	/* the reply alone from a cold cache decodes its base first */
	cache_clear(store);
	chunks = casbox_store_get_chunks_decoded();
	ck_assert_str_eq(read_msg(store, 2), reply.text);
	ck_assert_uint_eq(casbox_store_get_chunks_decoded() - chunks, 2);

	expunge(store, 1);
	ck_assert_ptr_null(read_msg(store, 1));
	ck_assert_uint_eq(blob_refcount(lead_id(&parent)), 1);
	cache_clear(store);
	ck_assert_str_eq(read_msg(store, 2), reply.text);
	/* the last dependent goes: so does its base */
	expunge(store, 2);
	ck_assert_uint_eq(blob_refcount(lead_id(&reply)), 0);
	ck_assert_uint_eq(blob_refcount(lead_id(&parent)), 0);

	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* A thread saved in one transaction (a COPY or import): the bases are
   in this transaction, found through its map and the base cache. */
START_TEST(test_xmsg_one_txn)
{
	struct casbox_store *store = store_open();
	pool_t pool = pool_alloconly_create("test", 16384);
	struct casbox_store_txn *txn;
	struct test_msg parent, reply;
	const char *error = NULL;

	msg_init(store, pool, &parent, parent_text(), "p1@x", NULL,
		 "a@example.org");
	msg_init(store, pool, &reply, reply_text(parent.text, 1), "r1@x",
		 "p1@x", "b@example.org");
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	txn_add(txn, 1, &parent);
	txn_add(txn, 2, &reply);
	ck_assert_int_eq(casbox_store_txn_commit(&txn, &error), 0);
	ck_assert_uint_eq(blob_depth(lead_id(&reply), lead_id(&parent)), 1);
	ck_assert_uint_eq(blob_refcount(lead_id(&parent)), 2);
	cache_clear(store);
	ck_assert_str_eq(read_msg(store, 2), reply.text);
	ck_assert_str_eq(read_msg(store, 1), parent.text);

	/* both expunged in one transaction: every reference released */
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	ck_assert_int_eq(casbox_store_txn_expunge(txn, box_guid, 2,
						  &error), 0);
	ck_assert_int_eq(casbox_store_txn_expunge(txn, box_guid, 1,
						  &error), 0);
	ck_assert_int_eq(casbox_store_txn_commit(&txn, &error), 0);
	ck_assert_uint_eq(blob_refcount(lead_id(&parent)), 0);
	ck_assert_uint_eq(blob_refcount(lead_id(&reply)), 0);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* Without a parent, the sender's previous message; a chain restarts at
   the depth limit (depth 1, 2, then alone). */
START_TEST(test_xmsg_sender_depth)
{
	struct casbox_store *store = store_open();
	pool_t pool = pool_alloconly_create("test", 65536);
	struct test_msg msgs[5];
	const char *text;
	unsigned int i;
	static const unsigned int depths[] = { 0, 1, 2, 0, 1 };

	text = body_text(7);
	for (i = 0; i < N_ELEMENTS(msgs); i++) {
		text = t_strdup_printf("From: Same Sender <S@Example.org>\n"
				       "Subject: report %u\n\nnew line %u\n%s",
				       i, i, text);
		msg_init(store, pool, &msgs[i], text,
			 t_strdup_printf("m%u@x", i), NULL, "s@example.org");
		save(store, i + 1, &msgs[i]);
		ck_assert_uint_eq(blob_depth(lead_id(&msgs[i]), i == 0 ? NULL :
					     lead_id(&msgs[i-1])), depths[i]);
	}
	/* msgs[1] is the base of msgs[2]: two references */
	ck_assert_uint_eq(blob_refcount(lead_id(&msgs[1])), 2);
	ck_assert_uint_eq(blob_refcount(lead_id(&msgs[2])), 1);
	cache_clear(store);
	for (i = N_ELEMENTS(msgs); i > 0; i--)
		ck_assert_str_eq(read_msg(store, i), msgs[i-1].text);
	/* the middle of a chain expunged first: its dependents read */
	expunge(store, 2);
	expunge(store, 1);
	cache_clear(store);
	ck_assert_str_eq(read_msg(store, 3), msgs[2].text);
	ck_assert_uint_eq(blob_refcount(lead_id(&msgs[0])), 1);
	expunge(store, 3);
	ck_assert_uint_eq(blob_refcount(lead_id(&msgs[0])), 0);
	ck_assert_uint_eq(blob_refcount(lead_id(&msgs[1])), 0);
	ck_assert_uint_eq(blob_refcount(lead_id(&msgs[2])), 0);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* A whole chain (depth 0, 1, 2) released in one transaction, the base
   first in the transaction's list: every reference goes. */
START_TEST(test_xmsg_chain_one_txn)
{
	struct casbox_store *store = store_open();
	pool_t pool = pool_alloconly_create("test", 65536);
	struct casbox_store_txn *txn;
	struct test_msg msgs[3];
	const char *text, *error = NULL;
	unsigned int i, order;

	for (order = 0; order < 2; order++) {
		text = body_text(8 + order);
		for (i = 0; i < N_ELEMENTS(msgs); i++) {
			text = t_strdup_printf("From: c@x\n\nline %u\n%s",
					       i, text);
			msg_init(store, pool, &msgs[i], text,
				 t_strdup_printf("c%u.%u@x", order, i), NULL,
				 "c@example.org");
			save(store, 10 * order + i + 1, &msgs[i]);
			ck_assert_uint_eq(blob_depth(lead_id(&msgs[i]), i == 0 ?
				NULL : lead_id(&msgs[i-1])), i);
		}
		ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error),
				 0);
		for (i = 0; i < N_ELEMENTS(msgs); i++) {
			/* base first, then dependent first */
			unsigned int uid = order == 0 ? i + 1 : 3 - i;

			ck_assert_int_eq(casbox_store_txn_expunge(txn,
				box_guid, 10 * order + uid, &error), 0);
		}
		ck_assert_int_eq(casbox_store_txn_commit(&txn, &error), 0);
		for (i = 0; i < N_ELEMENTS(msgs); i++)
			ck_assert_uint_eq(blob_refcount(lead_id(&msgs[i])), 0);
	}
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* Records whose LSM key starts with prefix. */
static unsigned int count_records(unsigned char prefix)
{
	struct casbox_lsm *lsm;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	const char *error = NULL;
	unsigned int count = 0;

	if (test_store_lsm_open_set(root, &set, FALSE, &lsm, &error) < 0)
		ck_abort_msg("lsm open: %s", error);
	iter = casbox_lsm_iter_init(lsm, &prefix, 1);
	while (casbox_lsm_iter_next(iter, &key, &key_size, &value,
				    &value_size))
		count++;
	ck_assert_int_ge(casbox_lsm_iter_deinit(&iter, &error), 0);
	test_store_lsm_close(&lsm);
	return count;
}

/* Key rotation --finish's record step deletes the maps of the old epoch
   (their keys are hashes under its record key): a reply saved after it
   finds no parent; the new epoch maps again. */
START_TEST(test_xmsg_rekey)
{
	struct casbox_store *store = store_open();
	pool_t pool = pool_alloconly_create("test", 16384);
	struct test_msg parent, reply, next;
	struct casbox_rekey_stats stats;
	struct cas_keyring *kr;
	const char *error = NULL;
	buffer_t *pos;
	int ret;

	msg_init(store, pool, &parent, parent_text(), "p1@x", NULL,
		 "a@example.org");
	save(store, 1, &parent);
	casbox_store_close(&store);
	/* Message-ID and sender */
	ck_assert_uint_eq(count_records(CASBOX_KEY_XMSG), 2);

	ck_assert_int_eq(cas_keyring_load(key_path, &kr, &error), 1);
	cas_keyring_rotate_add(kr);
	ck_assert_int_eq(cas_keyring_save(kr, key_path, &error), 1);
	cas_keyring_free(&kr);
	store = store_open();
	i_zero(&stats);
	pos = buffer_create_dynamic(default_pool, 64);
	while ((ret = casbox_rekey_records_step(store, 100, pos, &stats,
						&error)) > 0) ;
	ck_assert_int_eq(ret, 0);
	buffer_free(&pos);
	ck_assert_uint_eq(stats.failed, 0);
	ck_assert_uint_eq(stats.bad_records, 0);
	ck_assert_uint_eq(count_records(CASBOX_KEY_XMSG), 0);

	msg_init(store, pool, &reply, reply_text(parent.text, 1), "r1@x",
		 "p1@x", "b@example.org");
	save(store, 2, &reply);
	ck_assert_uint_eq(blob_depth(lead_id(&reply), NULL), 0);
	msg_init(store, pool, &next, reply_text(reply.text, 2), "r2@x",
		 "r1@x", "c@example.org");
	save(store, 3, &next);
	ck_assert_uint_eq(blob_depth(lead_id(&next), lead_id(&reply)), 1);
	ck_assert_str_eq(read_msg(store, 3), next.text);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* casbox_cross_message = no, and casbox_dedup = no: no deltas. */
START_TEST(test_xmsg_off)
{
	pool_t pool = pool_alloconly_create("test", 16384);
	struct casbox_store *store;
	struct test_msg parent, reply;
	unsigned int i;

	for (i = 0; i < 2; i++) {
		set.cross_message_disabled = i == 0;
		set.dedup_disabled = i == 1;
		store = store_open();
		msg_init(store, pool, &parent, parent_text(), "p1@x", NULL,
			 "a@example.org");
		msg_init(store, pool, &reply, reply_text(parent.text, i),
			 "r1@x", "p1@x", "b@example.org");
		save(store, 10 * i + 1, &parent);
		save(store, 10 * i + 2, &reply);
		ck_assert_uint_eq(blob_depth(lead_id(&reply), NULL), 0);
		ck_assert_str_eq(read_msg(store, 10 * i + 2), reply.text);
		casbox_store_close(&store);
	}
	/* turned on again: nothing was mapped while it was off (no
	   parent, no sender's previous), then the sender's previous */
	set.cross_message_disabled = FALSE;
	set.dedup_disabled = FALSE;
	store = store_open();
	msg_init(store, pool, &parent, reply_text(parent.text, 9), "r9@x",
		 "p1@x", "b@example.org");
	save(store, 30, &parent);
	ck_assert_uint_eq(blob_depth(lead_id(&parent), NULL), 0);
	msg_init(store, pool, &reply, reply_text(parent.text, 10), "r10@x",
		 "p1@x", "b@example.org");
	save(store, 31, &reply);
	ck_assert_uint_eq(blob_depth(lead_id(&reply), lead_id(&parent)), 1);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* Unrelated text gains nothing from a base: written alone. A missing
   parent falls back to the sender. */
START_TEST(test_xmsg_pays)
{
	struct casbox_store *store = store_open();
	pool_t pool = pool_alloconly_create("test", 16384);
	struct test_msg first, other, third;

	msg_init(store, pool, &first, parent_text(), "p1@x", NULL,
		 "a@example.org");
	msg_init(store, pool, &other, t_strconcat("From: a@example.org\n\n",
		 noise_text(99), NULL), "o@x", "p1@x", "a@example.org");
	save(store, 1, &first);
	save(store, 2, &other);
	ck_assert_uint_eq(blob_depth(lead_id(&other), NULL), 0);
	ck_assert_uint_eq(blob_refcount(lead_id(&first)), 1);
	/* parent unknown: the sender's previous (other) */
	msg_init(store, pool, &third, t_strconcat("X: 1\n", other.text, NULL),
		 "t@x", "nowhere@x", "a@example.org");
	save(store, 3, &third);
	ck_assert_uint_eq(blob_depth(lead_id(&third), lead_id(&other)), 1);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST


static uint64_t blob_records_written(struct casbox_store *store)
{
	struct casbox_store_stats stats;

	casbox_store_get_stats(store, &stats);
	return stats.blob_records_written;
}

/* The parent does not pay (unrelated text): the sender's previous
   message, which does, is tried next and becomes the base. A candidate
   looked at but not used keeps its record as it is: no blob record is
   written for it. */
START_TEST(test_xmsg_second_candidate)
{
	struct casbox_store *store = store_open();
	pool_t pool = pool_alloconly_create("test", 65536);
	struct test_msg prev, parent, reply, alone;
	struct casbox_blob_record before, after;
	uint64_t written;

	/* the sender's previous message, and an unrelated parent */
	msg_init(store, pool, &prev, t_strconcat("From: s@example.org\n"
		 "Subject: weekly\n\n", body_text(21), NULL), "w1@x", NULL,
		 "s@example.org");
	msg_init(store, pool, &parent, t_strconcat("X-O: ", letters_text(5),
		 NULL), "n1@x", NULL, "o@other.org");
	save(store, 1, &prev);
	save(store, 2, &parent);
	ck_assert_uint_gt(blob_get(lead_id(&parent), &before), 0);
	msg_init(store, pool, &reply, t_strconcat("From: s@example.org\n"
		 "In-Reply-To: <n1@x>\nSubject: weekly\n\nnew\n",
		 body_text(21), NULL), "w2@x", "n1@x", "s@example.org");
	written = blob_records_written(store);
	save(store, 3, &reply);
	ck_assert_uint_eq(blob_depth(lead_id(&reply), lead_id(&prev)), 1);
	ck_assert_uint_eq(blob_refcount(lead_id(&prev)), 2);
	/* the reply's record and its base's reference, not the parent's */
	ck_assert_uint_eq(blob_records_written(store) - written, 2);
	ck_assert_uint_eq(blob_get(lead_id(&parent), &after), 1);
	ck_assert_mem_eq(&after, &before, sizeof(before));
	cache_clear(store);
	ck_assert_str_eq(read_msg(store, 3), reply.text);

	/* neither pays: written alone, only its own record */
	msg_init(store, pool, &alone, t_strconcat("X-A: ", letters_text(6),
		 NULL), "w3@x",
		 "n1@x", "s@example.org");
	written = blob_records_written(store);
	save(store, 4, &alone);
	ck_assert_uint_eq(blob_depth(lead_id(&alone), NULL), 0);
	ck_assert_uint_eq(blob_records_written(store) - written, 1);
	ck_assert_uint_eq(blob_refcount(lead_id(&parent)), 1);
	ck_assert_uint_eq(blob_refcount(lead_id(&reply)), 1);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* A parent at the depth limit restarts the chain even when the
   sender's previous message would pay. */
START_TEST(test_xmsg_depth_limit_first)
{
	struct casbox_store *store = store_open();
	pool_t pool = pool_alloconly_create("test", 65536);
	struct test_msg msgs[3], prev, reply;
	const char *text;
	unsigned int i;

	msg_init(store, pool, &prev, t_strconcat("From: q@example.org\n\n",
		 body_text(31), NULL), "q1@x", NULL, "q@example.org");
	save(store, 1, &prev);
	text = body_text(32);
	for (i = 0; i < N_ELEMENTS(msgs); i++) {
		text = t_strdup_printf("From: d@x\n\nline %u\n%s", i, text);
		msg_init(store, pool, &msgs[i], text,
			 t_strdup_printf("d%u@x", i), NULL, "d@example.org");
		save(store, 10 + i, &msgs[i]);
	}
	ck_assert_uint_eq(blob_depth(lead_id(&msgs[2]), lead_id(&msgs[1])),
			  2);
	msg_init(store, pool, &reply, t_strconcat("From: q@example.org\n"
		 "In-Reply-To: <d2@x>\n\n", msgs[2].text, body_text(31),
		 NULL), "q2@x", "d2@x", "q@example.org");
	save(store, 20, &reply);
	ck_assert_uint_eq(blob_depth(lead_id(&reply), NULL), 0);
	ck_assert_uint_eq(blob_refcount(lead_id(&prev)), 1);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* gc --all in another process: every blob moved to a new pack and the
   old packs unlinked. */
static void gc_all_child(void)
{
	struct casbox_store *store;
	struct casbox_store_gc_stats stats;
	struct file_lock *lock = NULL;
	const char *error = NULL;
	int status;
	pid_t pid;

	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		casbox_pack_base_open_hook = NULL;
		store = store_open();
		i_zero(&stats);
		if (casbox_store_maintenance_lock(store, TRUE, 10, &lock,
						  &error) != 1 ||
		    casbox_store_gc(store, TRUE, &stats, &error) < 0) {
			fprintf(stderr, "gc: %s\n", error);
			_exit(1);
		}
		_exit(stats.packs_deleted > 0 &&
		      stats.packs_deleted == stats.packs_selected ? 0 : 2);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFEXITED(status));
	ck_assert_int_eq(WEXITSTATUS(status), 0);
}

static const char *pack_path(uint32_t pack_id)
{
	return t_strdup_printf("%s/packs/pack-%08u.cbp", root, pack_id);
}

/* The plaintext of blob id from rec (casbox_store_blob_open_record()) */
static const char *
read_blob(struct casbox_store *store, const struct cas_blob_id *id,
	  const struct casbox_blob_record *rec)
{
	struct istream *input;
	const char *error = NULL;

	if (casbox_store_blob_open_record(store, id, rec, &input,
					  &error) <= 0)
		ck_abort_msg("open: %s", error);
	return test_store_fixture_drain(&input);
}

/* casbox_pack_base_open_hook: gc at the gc_at'th base open */
static unsigned int base_opens, gc_at;
static struct cas_blob_id gc_base;

static void gc_at_base_open(const struct cas_blob_id *base_id)
{
	if (++base_opens == gc_at) {
		gc_base = *base_id;
		gc_all_child();
	}
}

/* gc moves a base and unlinks its pack between the read of the base's
   record and the open of its pack: the read looks the chain up again
   and returns the exact bytes. Every base of a depth-2 chain in turn
   (the first base opened is the deepest). */
START_TEST(test_xmsg_read_gc_race)
{
	struct casbox_store *store = store_open();
	pool_t pool = pool_alloconly_create("test", 65536);
	struct casbox_blob_record before, after;
	struct test_msg msgs[3];
	const char *text;
	unsigned int i;

	text = body_text(11);
	for (i = 0; i < N_ELEMENTS(msgs); i++) {
		text = t_strdup_printf("From: g@x\n\nline %u\n%s", i, text);
		msg_init(store, pool, &msgs[i], text,
			 t_strdup_printf("g%u@x", i), NULL, "g@example.org");
		save(store, i + 1, &msgs[i]);
		ck_assert_uint_eq(blob_depth(lead_id(&msgs[i]), i == 0 ?
			NULL : lead_id(&msgs[i-1])), i);
	}
	for (gc_at = 1; gc_at <= 2; gc_at++) {
		/* the base the gc_at'th open is for, where it is now */
		ck_assert_uint_gt(blob_get(lead_id(&msgs[gc_at - 1]),
					   &before), 0);
		cache_clear(store);
		base_opens = 0;
		casbox_pack_base_open_hook = gc_at_base_open;
		ck_assert_str_eq(read_msg(store, 3), msgs[2].text);
		casbox_pack_base_open_hook = NULL;
		/* gc did run where it was meant to: that base moved, its
		   old pack is gone, and the read opened a base again */
		ck_assert_mem_eq(gc_base.id, lead_id(&msgs[gc_at - 1])->id,
				 CAS_BLOB_ID_SIZE);
		ck_assert_uint_gt(blob_get(&gc_base, &after), 0);
		ck_assert_uint_ne(after.pack_id, before.pack_id);
		ck_assert_int_eq(access(pack_path(before.pack_id), F_OK), -1);
		ck_assert_uint_gt(base_opens, gc_at);
	}
	/* the middle message (depth 1) the same way, its base in the
	   cache from before the gc: the same bytes, the id is the
	   content */
	gc_at = 1;
	base_opens = 0;
	casbox_pack_base_open_hook = gc_at_base_open;
	ck_assert_str_eq(read_msg(store, 2), msgs[1].text);
	ck_assert_str_eq(read_msg(store, 1), msgs[0].text);
	casbox_pack_base_open_hook = NULL;

	/* an admin tool's blob record read before a gc (dict training):
	   opened from the record read again */
	ck_assert_uint_gt(blob_get(lead_id(&msgs[2]), &before), 0);
	gc_all_child();
	cache_clear(store);
	ck_assert_str_eq(read_blob(store, lead_id(&msgs[2]), &before),
			 msgs[2].text);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

/* uid's stream read to its end: returns the bytes, *error_r the stream
   error (NULL if none). */
static const char *
read_msg_error(struct casbox_store *store, uint32_t uid,
	       const char **error_r)
{
	struct casbox_msg_record rec;
	struct istream *input;
	const unsigned char *data;
	size_t size;
	string_t *str = t_str_new(1024);
	const char *error = NULL;

	*error_r = NULL;
	ck_assert_int_eq(casbox_store_msg_lookup(store, box_guid, uid,
		pool_datastack_create(), &rec, &error), 1);
	if (casbox_store_msg_open(store, &rec, &input, &error) <= 0) {
		*error_r = error;
		return "";
	}
	while (i_stream_read_more(input, &data, &size) > 0) {
		str_append_data(str, data, size);
		i_stream_skip(input, size);
	}
	if (input->stream_errno != 0)
		*error_r = t_strdup(i_stream_get_error(input));
	i_stream_unref(&input);
	return str_c(str);
}

/* The base cache is keyed by blob id (the content, under the keyed
   hash): gc moving the base and key rotation rewrapping it leave the
   entry right. An entry with other bytes under the base's id (a bug,
   memory damage) fails the delta's authentication, whose AAD binds a
   digest of the base: an error, never other bytes. */
START_TEST(test_xmsg_base_cache_mismatch)
{
	struct casbox_store *store = store_open();
	pool_t pool = pool_alloconly_create("test", 16384);
	struct casbox_base_cache *cache;
	struct casbox_base_plain *forged;
	struct casbox_blob_record rec;
	struct test_msg parent, reply;
	const char *text, *error;
	unsigned int i;

	msg_init(store, pool, &parent, parent_text(), "p1@x", NULL,
		 "a@example.org");
	msg_init(store, pool, &reply, reply_text(parent.text, 1), "r1@x",
		 "p1@x", "b@example.org");
	save(store, 1, &parent);
	save(store, 2, &reply);
	ck_assert_uint_eq(blob_depth(lead_id(&reply), lead_id(&parent)), 1);
	ck_assert_uint_gt(blob_get(lead_id(&parent), &rec), 0);

	/* the cache holds the parent (its save put it there); gc moves
	   both: the cached entry still decodes the reply */
	gc_all_child();
	ck_assert_str_eq(read_msg_error(store, 2, &error), reply.text);
	ck_assert_ptr_null(error);

	cache = casbox_pack_store_get_base_cache(
			casbox_store_get_packs(store));
	for (i = 0; i < 2; i++) {
		/* the same size and depth, one byte different (i = 0) or
		   every byte (i = 1) */
		forged = casbox_base_plain_new(lead_id(&parent),
					       rec.plain_size, 0);
		memcpy(forged->data, parent.text, forged->size);
		if (i == 0)
			forged->data[forged->size / 2] ^= 0x01;
		else
			memset(forged->data, 'x', forged->size);
		casbox_base_plain_seal(forged);
		casbox_base_cache_clear(cache);
		casbox_base_cache_add(cache, forged);
		casbox_base_plain_unref(&forged);
		text = read_msg_error(store, 2, &error);
		ck_assert_ptr_nonnull(error);
		ck_assert_msg(strstr(error, "authentication failed") != NULL,
			      "%s", error);
		/* no byte of it was returned */
		ck_assert_str_eq(text, "");
	}
	cache_clear(store);
	ck_assert_str_eq(read_msg_error(store, 2, &error), reply.text);
	ck_assert_ptr_null(error);
	casbox_store_close(&store);
	pool_unref(&pool);
}
END_TEST

int main(void)
{
	Suite *s;
	TCase *tc;
	int failed;

	lib_init();
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	s = suite_create("store-xmsg");
	tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_xmsg_reply);
	tcase_add_test(tc, test_xmsg_one_txn);
	tcase_add_test(tc, test_xmsg_sender_depth);
	tcase_add_test(tc, test_xmsg_chain_one_txn);
	tcase_add_test(tc, test_xmsg_off);
	tcase_add_test(tc, test_xmsg_pays);
	tcase_add_test(tc, test_xmsg_rekey);
	tcase_add_test(tc, test_xmsg_second_candidate);
	tcase_add_test(tc, test_xmsg_depth_limit_first);
	tcase_add_test(tc, test_xmsg_read_gc_race);
	tcase_add_test(tc, test_xmsg_base_cache_mismatch);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
