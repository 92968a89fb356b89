/* rebuild --from-packs, the LSM part: a store built with the real store
   layer (recovery records written as saves and copies write them) loses
   its LSM; the rebuilt one holds the same message and blob records,
   byte for byte, and mailbox records that hand out no UID again. DEK
   choice: a blob re-encoded under a fresh DEK (as gc does) opens through
   its DEK update; a DEK update wrapped by another key is ignored;
   without an opening DEK the message is reported lost. Key rotation: a
   crash between a step's pack commit and its LSM commit leaves DEK
   updates under the new slot for records the LSM keeps under the old
   one; the resumed rotation and rebuilds before and after it all open
   every message. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "str.h"
#include "hex-binary.h"
#include "unlink-directory.h"
#include "casbox-lsm.h"
#include "casbox-store.h"
#include "casbox-store-rekey.h"
#include "casbox-store-gc.h"
#include "casbox-store-frompacks.h"
#include "doveadm-casbox.h"
#include "test-store-lsm.h"

#include <check.h>
#include "check-run.h"
#include "test-store-fixture.h"
#include <dirent.h>
#include <signal.h>
#include <string.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sodium.h>

static char test_dir[] = "/tmp/check-doveadm-frompacks.XXXXXX";
static const char *root;
static struct casbox_settings set;
static const guid_128_t inbox_guid = { 1, 1, 1, 1, 1, 1, 1, 1,
				       1, 1, 1, 1, 1, 1, 1, 1 };
static const guid_128_t work_guid = { 2, 2, 2, 2, 2, 2, 2, 2,
				      2, 2, 2, 2, 2, 2, 2, 2 };

static const char *part_a = "part A shared by messages 1 and 2\r\n";
static const char *part_b = "part B only in message 1\r\n";
static const char *part_c = "part C, only in message 2\r\n";
static const char *part_d = "part D only in message 3, a bit longer\r\n";

static void setup(void)
{
	test_store_fixture_setup(test_dir, &root, &set);
	set.gc_dead_ratio = 30;
}

static void teardown(void)
{
	test_store_fixture_teardown(test_dir);
}

static struct casbox_store *store_open(void)
{
	return test_store_fixture_open(root, &set, TRUE);
}

/* Save (parts given) or copy (copy = TRUE: the blobs must exist; a
   copy record in the packs, not a recovery record) one message the way
   casbox-save.c does: recovery mailbox, message, then the mailbox
   record. */
static void add_msg(struct casbox_store *store, const guid_128_t box,
		    const char *name, uint32_t uid, const char *guid,
		    const char *const *parts, bool copy)
{
	struct casbox_mailbox_record mrec;
	struct casbox_store_txn *txn;
	struct casbox_msg_record rec;
	struct casbox_msg_part *part;
	struct istream **inputs;
	unsigned int i, count = str_array_length(parts);
	const char *error = NULL, *kw = "$Label1";
	pool_t pool = pool_alloconly_create("msg", 1024);

	casbox_msg_record_init(pool, &rec);
	rec.guid = guid;
	rec.received_date = 1700000000 + uid;
	rec.save_date = 1700000100 + uid;
	rec.flags = uid;
	array_push_back(&rec.keywords, &kw);
	inputs = p_new(pool, struct istream *, count + 1);
	for (i = 0; i < count; i++) {
		part = array_append_space(&rec.parts);
		part->size = strlen(parts[i]);
		rec.physical_size += part->size;
		inputs[i] = i_stream_create_from_data(parts[i], part->size);
		ck_assert_int_eq(casbox_store_blob_id(store, inputs[i], 0,
			part->size, &part->id, &error), 0);
		i_stream_seek(inputs[i], 0);
	}
	rec.virtual_size = rec.physical_size + 3;
	i_zero(&mrec);
	mrec.uid_validity = 1700000000;
	mrec.name = name;
	mrec.next_uid = uid + 1;
	mrec.highest_modseq = 10 + uid;
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	casbox_store_txn_set_recovery_mailbox(txn, box, NULL, &mrec);
	if ((copy ? casbox_store_txn_add_copy(txn, box, uid, &rec, &error) :
	     casbox_store_txn_add_msg(txn, box, uid, &rec, inputs,
				      &error)) < 0)
		ck_abort_msg("add: %s", error);
	casbox_store_txn_put_mailbox(txn, box, &mrec);
	if (casbox_store_txn_commit(&txn, &error) < 0)
		ck_abort_msg("commit: %s", error);
	for (i = 0; i < count; i++)
		i_stream_unref(&inputs[i]);
	pool_unref(&pool);
}

/* Every LSM record as "hex(key)=hex(value)" lines, sorted by key. */
static const char *lsm_dump(char prefix)
{
	struct casbox_lsm *lsm;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	const char *error;
	string_t *str = t_str_new(1024);

	if (test_store_lsm_open_set(root, &set, FALSE, &lsm, &error) < 0)
		ck_abort_msg("lsm open: %s", error);
	iter = casbox_lsm_iter_init(lsm, &prefix, 1);
	while (casbox_lsm_iter_next(iter, &key, &key_size, &value,
				    &value_size)) {
		str_printfa(str, "%s=", binary_to_hex(key, key_size));
		str_append(str, binary_to_hex(value, value_size));
		str_append_c(str, '\n');
	}
	ck_assert_int_eq(casbox_lsm_iter_deinit(&iter, &error), 1);
	test_store_lsm_close(&lsm);
	return str_c(str);
}

/* The LSM's message, blob and key records, as lsm_dump() prints them. */
struct lsm_snapshot {
	const char *msgs, *blobs, *key;
};

static void lsm_snapshot_take(struct lsm_snapshot *snap_r)
{
	snap_r->msgs = lsm_dump(CASBOX_KEY_MESSAGE);
	snap_r->blobs = lsm_dump(CASBOX_KEY_BLOB);
	snap_r->key = lsm_dump(CASBOX_KEY_KEYRING);
}

/* The records are byte for byte those of the snapshot. */
static void assert_lsm_is(const struct lsm_snapshot *snap)
{
	ck_assert_str_eq(lsm_dump(CASBOX_KEY_MESSAGE), snap->msgs);
	ck_assert_str_eq(lsm_dump(CASBOX_KEY_BLOB), snap->blobs);
	ck_assert_str_eq(lsm_dump(CASBOX_KEY_KEYRING), snap->key);
}

static void lsm_lose(void)
{
	const char *error;

	ck_assert_int_eq(unlink_directory(t_strconcat(root, "/lsm", NULL),
		UNLINK_DIRECTORY_FLAG_RMDIR, &error), 1);
}

/* the store opened as doveadm opens it, ready to rebuild */
static struct casbox_frompacks *frompacks_open(struct casbox_admin **adm_r)
{
	const char *error = NULL;

	if (casbox_admin_open_root_full(root, &set, FSYNC_MODE_ALWAYS,
					FILE_LOCK_METHOD_FCNTL, FALSE,
					adm_r, &error) <= 0 ||
	    casbox_admin_open_keys(*adm_r, &error) < 0)
		ck_abort_msg("admin open: %s", error);
	return casbox_frompacks_init((*adm_r)->store);
}

static struct casbox_frompacks *rebuild(struct casbox_admin **adm_r)
{
	struct casbox_frompacks *fp = frompacks_open(adm_r);
	const char *error = NULL;

	if (casbox_frompacks_rebuild_lsm(fp, &error) < 0)
		ck_abort_msg("rebuild: %s", error);
	return fp;
}

static const struct casbox_mailbox_record *
rebuilt_mailbox(struct casbox_frompacks *fp, const guid_128_t guid)
{
	struct casbox_frompacks_mailbox *mbox;

	array_foreach_elem(&fp->mailbox_list, mbox) {
		if (guid_128_equals(mbox->guid, guid))
			return &mbox->rec;
	}
	ck_abort_msg("mailbox not rebuilt");
	return NULL;
}

START_TEST(test_records_come_back)
{
	const char *m1[] = { part_a, part_b, NULL };
	const char *m2[] = { part_a, part_c, NULL };
	const char *m3[] = { part_d, NULL };
	struct casbox_store *store = store_open();
	const struct casbox_mailbox_record *mrec;
	struct casbox_frompacks *fp;
	struct casbox_admin *adm;
	struct lsm_snapshot before;
	struct stat st;

	add_msg(store, inbox_guid, "INBOX", 1, "guid-1", m1, FALSE);
	add_msg(store, inbox_guid, "INBOX", 2, "guid-2", m2, FALSE);
	add_msg(store, inbox_guid, "INBOX", 3, "guid-3", m3, FALSE);
	add_msg(store, work_guid, "Work", 7, "guid-1", m1, TRUE);
	casbox_store_close(&store);
	lsm_snapshot_take(&before);

	lsm_lose();
	fp = rebuild(&adm);
	ck_assert_uint_eq(array_count(&fp->mailbox_list), 2);
	ck_assert_uint_eq(fp->messages, 4);
	ck_assert_uint_eq(fp->blob_count, 4);
	ck_assert_uint_eq(fp->orphans, 0);
	ck_assert_uint_eq(fp->damaged_frames, 0);
	ck_assert_uint_eq(fp->lost_messages, 0);
	ck_assert_ptr_null(fp->moved_to);
	mrec = rebuilt_mailbox(fp, work_guid);
	ck_assert_str_eq(mrec->name, "Work");
	ck_assert_uint_eq(mrec->uid_validity, 1700000000);
	ck_assert_uint_eq(mrec->next_uid, 8);
	/* modseqs after the last save are unknown: raised to the clock */
	ck_assert(mrec->highest_modseq > 1700000000ULL * 1000000);
	mrec = rebuilt_mailbox(fp, inbox_guid);
	ck_assert_str_eq(mrec->name, "INBOX");
	ck_assert_uint_eq(mrec->next_uid, 4);
	casbox_frompacks_deinit(&fp);
	casbox_admin_close(&adm);

	/* message records byte for byte; blob records too: refcounts
	   counted, location and wrapped DEK as the store had them */
	assert_lsm_is(&before);

	/* a second run moves the (good) LSM aside, never deletes it */
	fp = rebuild(&adm);
	ck_assert_ptr_nonnull(fp->moved_to);
	ck_assert_int_eq(stat(t_strconcat(fp->moved_to, "/MANIFEST", NULL),
			      &st), 0);
	casbox_frompacks_deinit(&fp);
	casbox_admin_close(&adm);
	ck_assert_str_eq(lsm_dump(CASBOX_KEY_MESSAGE), before.msgs);

	/* and the store opens and reads its mail */
	store = store_open();
	{
		struct casbox_msg_record rec;
		struct istream *input;
		const unsigned char *data;
		size_t size;
		const char *error;
		string_t *body = t_str_new(128);

		ck_assert_int_eq(casbox_store_msg_lookup(store, work_guid, 7,
			pool_datastack_create(), &rec, &error), 1);
		ck_assert_int_eq(casbox_store_msg_open(store, &rec, &input,
						       &error), 1);
		while (i_stream_read_more(input, &data, &size) > 0) {
			str_append_data(body, data, size);
			i_stream_skip(input, size);
		}
		ck_assert_int_eq(input->stream_errno, 0);
		i_stream_unref(&input);
		ck_assert_str_eq(str_c(body),
				 t_strconcat(part_a, part_b, NULL));
	}
	casbox_store_close(&store);
}
END_TEST

/* A pack transaction on the store's packs holding blob A in a new
   frame under a fresh DEK (what gc does); the caller commits. */
static struct casbox_pack_txn *
pack_add_part_a(struct cas_keyring *keyring,
		struct casbox_pack_store **packs_r, struct cas_blob_id *id_r,
		struct casbox_blob_record *rec_r)
{
	struct casbox_pack_settings pack_set;
	struct casbox_pack_txn *txn;
	struct istream *input;
	const char *error;

	i_zero(&pack_set);
	pack_set.dir = t_strconcat(root, "/packs", NULL);
	ck_assert_int_eq(casbox_pack_store_open(&pack_set, keyring, packs_r,
						&error), 1);
	cas_blob_id_compute(keyring, part_a, strlen(part_a), id_r);
	ck_assert_int_eq(casbox_pack_txn_begin(*packs_r, &txn, &error), 1);
	input = i_stream_create_from_data(part_a, strlen(part_a));
	ck_assert_int_eq(casbox_pack_txn_add(txn, id_r, input, rec_r,
					     &error), 1);
	i_stream_unref(&input);
	return txn;
}

/* Blob A of message 1 encoded again in a new frame under a fresh DEK
   (what gc does), with a DEK update for it if with_update; a DEK
   update wrapped by another key; the old frame damaged. */
static void reencode_blob_a(bool with_update)
{
	struct casbox_pack_store *packs;
	struct casbox_pack_txn *txn;
	struct casbox_blob_record rec;
	struct cas_keyring *keyring, *other;
	struct cas_blob_id id;
	unsigned char dek[CAS_DEK_SIZE], kek[CAS_KEK_SIZE];
	unsigned char foreign[CAS_WRAPPED_DEK_SIZE];
	const char *error;

	ck_assert_int_eq(cas_keyring_load(set.key_file, &keyring, &error), 1);
	txn = pack_add_part_a(keyring, &packs, &id, &rec);
	if (with_update) {
		ck_assert_int_eq(casbox_pack_txn_add_dek_update(txn, &id,
				 rec.wrapped_dek, &error), 1);
	}
	/* a DEK the current key cannot unwrap: never chosen */
	memset(kek, 0x5e, sizeof(kek));
	other = cas_keyring_create_from_kek(kek);
	memset(dek, 0x33, sizeof(dek));
	cas_dek_wrap(other, &id, dek, foreign);
	sodium_memzero(dek, sizeof(dek));
	ck_assert_int_eq(casbox_pack_txn_add_dek_update(txn, &id, foreign,
							&error), 1);
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
	casbox_pack_store_close(&packs);
	cas_keyring_free(&other);
	cas_keyring_free(&keyring);
}

/* Flip a byte in the first chunk of the first frame (blob A's). */
static void damage_first_frame(void)
{
	const char *path = t_strconcat(root, "/packs/pack-00000001.cbp",
				       NULL);
	unsigned char c;
	int fd = open(path, O_RDWR);

	ck_assert_int_ne(fd, -1);
	ck_assert_int_eq(pread(fd, &c, 1, 20 + 68 + 3), 1);
	c ^= 0x10;
	ck_assert_int_eq(pwrite(fd, &c, 1, 20 + 68 + 3), 1);
	ck_assert_int_eq(close(fd), 0);
}

/* lsm.broken-* directories in the store root */
static unsigned int broken_lsm_count(void)
{
	struct dirent *d;
	unsigned int n = 0;
	DIR *dir = opendir(root);

	ck_assert_ptr_nonnull(dir);
	while ((d = readdir(dir)) != NULL) {
		if (strncmp(d->d_name, "lsm.broken", 10) == 0)
			n++;
	}
	(void)closedir(dir);
	return n;
}

/* Another process holds the old LSM's write lock (a save in progress):
   the rebuild gives up and leaves everything in place instead of moving
   the LSM aside under the writer's feet. */
START_TEST(test_busy_lsm_is_left_alone)
{
	const char *m1[] = { part_a, NULL };
	struct casbox_store *store = store_open();
	struct casbox_lsm_batch *batch;
	struct casbox_frompacks *fp;
	struct casbox_admin *adm;
	struct casbox_lsm *lsm;
	const char *error, *msgs;
	int fds[2], status;
	char c;
	pid_t pid;

	add_msg(store, inbox_guid, "INBOX", 1, "guid-1", m1, FALSE);
	casbox_store_close(&store);
	msgs = lsm_dump(CASBOX_KEY_MESSAGE);

	ck_assert_int_eq(pipe(fds), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (test_store_lsm_open_set(root, &set, FALSE, &lsm,
					    &error) < 0 ||
		    casbox_lsm_batch_begin(lsm, &batch, &error) < 0)
			_exit(1);
		/* locked: tell the parent, then hold it until killed */
		if (write(fds[1], "L", 1) != 1)
			_exit(2);
		for (;;)
			pause();
	}
	ck_assert_int_eq(read(fds[0], &c, 1), 1);

	fp = frompacks_open(&adm);
	fp->lsm_lock_timeout_secs = 1;
	ck_assert_int_eq(casbox_frompacks_rebuild_lsm(fp, &error), -1);
	ck_assert_msg(strstr(error, "is in use") != NULL, "%s", error);
	ck_assert_ptr_null(fp->moved_to);
	casbox_frompacks_deinit(&fp);
	casbox_admin_close(&adm);

	ck_assert_int_eq(kill(pid, SIGKILL), 0);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	i_close_fd(&fds[0]);
	i_close_fd(&fds[1]);
	/* the LSM is where it was, with everything in it */
	ck_assert_str_eq(lsm_dump(CASBOX_KEY_MESSAGE), msgs);
	ck_assert_uint_eq(broken_lsm_count(), 0);
}
END_TEST

START_TEST(test_dek_update_opens_new_frame)
{
	const char *m1[] = { part_a, NULL };
	struct casbox_store *store = store_open();
	struct casbox_frompacks *fp;
	struct casbox_frompacks_blob *blob;
	struct casbox_admin *adm;

	add_msg(store, inbox_guid, "INBOX", 1, "guid-1", m1, FALSE);
	casbox_store_close(&store);
	reencode_blob_a(TRUE);
	damage_first_frame();
	lsm_lose();
	fp = rebuild(&adm);
	ck_assert_uint_eq(fp->damaged_frames, 1);
	ck_assert_uint_eq(fp->messages, 1);
	ck_assert_uint_eq(fp->lost_messages, 0);
	ck_assert_uint_eq(array_count(&fp->blob_list), 1);
	blob = array_idx_elem(&fp->blob_list, 0);
	/* the new frame (after the damaged one and the recovery record) */
	ck_assert_uint_eq(blob->rec.pack_id, 1);
	ck_assert_uint_gt(blob->rec.offset, 20 + 68);
	ck_assert_uint_eq(array_count(&blob->deks), 3);
	casbox_frompacks_deinit(&fp);
	casbox_admin_close(&adm);

	store = store_open();
	{
		struct casbox_msg_record rec;
		struct istream *input;
		const unsigned char *data;
		size_t size;
		const char *error;

		ck_assert_int_eq(casbox_store_msg_lookup(store, inbox_guid, 1,
			pool_datastack_create(), &rec, &error), 1);
		ck_assert_int_eq(casbox_store_msg_open(store, &rec, &input,
						       &error), 1);
		ck_assert_int_gt(i_stream_read_more(input, &data, &size), 0);
		ck_assert_uint_eq(size, strlen(part_a));
		ck_assert(memcmp(data, part_a, size) == 0);
		i_stream_unref(&input);
	}
	casbox_store_close(&store);
}
END_TEST

START_TEST(test_no_opening_dek_is_lost)
{
	const char *m1[] = { part_a, NULL };
	const char *m3[] = { part_d, NULL };
	struct casbox_store *store = store_open();
	struct casbox_frompacks *fp;
	struct casbox_admin *adm;

	add_msg(store, inbox_guid, "INBOX", 1, "guid-1", m1, FALSE);
	add_msg(store, inbox_guid, "INBOX", 2, "guid-3", m3, FALSE);
	casbox_store_close(&store);
	/* the new frame's DEK is nowhere in the packs */
	reencode_blob_a(FALSE);
	damage_first_frame();
	lsm_lose();
	fp = rebuild(&adm);
	ck_assert_uint_eq(fp->damaged_frames, 1);
	ck_assert_uint_eq(fp->lost_messages, 1);
	ck_assert_uint_eq(fp->messages, 1);
	ck_assert_uint_eq(fp->blob_count, 1);
	/* the frame nothing can open is an orphan for gc */
	ck_assert_uint_eq(fp->orphans, 1);
	/* the mailbox still comes back, its UIDs reserved */
	ck_assert_uint_eq(rebuilt_mailbox(fp, inbox_guid)->next_uid, 3);
	casbox_frompacks_deinit(&fp);
	casbox_admin_close(&adm);
	ck_assert_ptr_nonnull(strstr(lsm_dump(CASBOX_KEY_MESSAGE),
				     "00000002="));
	ck_assert_ptr_null(strstr(lsm_dump(CASBOX_KEY_MESSAGE),
				  "00000001="));
}
END_TEST

START_TEST(test_refused_without_records)
{
	const char *m1[] = { part_a, NULL };
	struct casbox_store *store = store_open();
	struct casbox_store_txn *txn;
	struct casbox_msg_record rec;
	struct casbox_msg_part *part;
	struct casbox_frompacks *fp;
	struct casbox_admin *adm;
	struct istream *inputs[2] = { NULL, NULL };
	const char *error = NULL, *before;

	/* a save without recovery records (as before they existed) */
	casbox_msg_record_init(pool_datastack_create(), &rec);
	rec.guid = "old";
	part = array_append_space(&rec.parts);
	part->size = strlen(m1[0]);
	rec.physical_size = rec.virtual_size = part->size;
	inputs[0] = i_stream_create_from_data(m1[0], part->size);
	ck_assert_int_eq(casbox_store_blob_id(store, inputs[0], 0, part->size,
					      &part->id, &error), 0);
	i_stream_seek(inputs[0], 0);
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	ck_assert_int_eq(casbox_store_txn_add_msg(txn, inbox_guid, 1, &rec,
						  inputs, &error), 0);
	ck_assert_int_eq(casbox_store_txn_commit(&txn, &error), 0);
	i_stream_unref(&inputs[0]);
	casbox_store_close(&store);
	before = lsm_dump(CASBOX_KEY_MESSAGE);

	fp = frompacks_open(&adm);
	ck_assert_int_eq(casbox_frompacks_rebuild_lsm(fp, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "no recovery records"));
	ck_assert_ptr_null(fp->moved_to);
	casbox_frompacks_deinit(&fp);
	casbox_admin_close(&adm);
	ck_assert_str_eq(lsm_dump(CASBOX_KEY_MESSAGE), before);
}
END_TEST

/* The message's bytes, read through a store that loads the key file as
   it is now. */
static const char *read_msg(const guid_128_t box, uint32_t uid)
{
	struct casbox_store *store = store_open();
	const char *text = test_store_fixture_read(store, box, uid);

	ck_assert_ptr_nonnull(text);
	casbox_store_close(&store);
	return text;
}

/* Password mode: LMTP-like saves with the public key only write
   recovery records sealed to the user key (with 133-byte sealed DEKs).
   Without the password or with a wrong one the rebuild changes nothing;
   with it the records come back byte for byte, and a blob re-encoded
   under a fresh sealed DEK opens through its version 2 DEK update. */
static int frompacks_try(const char *password, const char **error_r)
{
	struct casbox_frompacks *fp;
	struct casbox_admin *adm;
	int ret;

	if (casbox_admin_open_root_full(root, &set, FSYNC_MODE_ALWAYS,
					FILE_LOCK_METHOD_FCNTL, FALSE,
					&adm, error_r) <= 0)
		ck_abort_msg("admin open: %s", *error_r);
	adm->key_password = password;
	ret = casbox_admin_open_keys(adm, error_r);
	adm->key_password = NULL;
	if (ret > 0) {
		fp = casbox_frompacks_init(adm->store);
		ret = casbox_frompacks_rebuild_lsm(fp, error_r);
		if (ret == 0)
			ck_assert_uint_eq(fp->lost_messages, 0);
		casbox_frompacks_deinit(&fp);
	}
	casbox_admin_close(&adm);
	return ret < 0 ? -1 : 0;
}

START_TEST(test_password_mode)
{
	static const struct cas_userkey_limits limits = {
		.opslimit = crypto_pwhash_OPSLIMIT_MIN,
		.memlimit = crypto_pwhash_MEMLIMIT_MIN,
	};
	const char *m1[] = { part_a, part_b, NULL };
	const char *m2[] = { part_a, part_c, NULL };
	struct casbox_pack_store *packs;
	struct casbox_pack_txn *txn;
	struct casbox_blob_record rec;
	struct cas_key_settings key_set;
	struct cas_keyring *kr;
	struct cas_blob_id id;
	struct casbox_store *store;
	struct lsm_snapshot before;
	const char *error = NULL;
	struct stat st;

	set.key_file = t_strconcat(test_dir, "/user.ukey", NULL);
	set.key_mode = CAS_KEY_MODE_PASSWORD;
	ck_assert_int_eq(cas_userkey_create(set.key_file, "pw", 2, &limits,
					    NULL, &error), 1);
	/* LMTP: no password */
	set.key_password = NULL;
	store = store_open();
	add_msg(store, inbox_guid, "INBOX", 1, "guid-1", m1, FALSE);
	add_msg(store, inbox_guid, "INBOX", 2, "guid-2", m2, FALSE);
	add_msg(store, work_guid, "Work", 7, "guid-1", m1, TRUE);
	casbox_store_close(&store);
	lsm_snapshot_take(&before);

	lsm_lose();
	/* no password: nothing opens, nothing is written */
	ck_assert_int_eq(frompacks_try(NULL, &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "no recovery record opens"));
	ck_assert_int_eq(stat(t_strconcat(root, "/lsm", NULL), &st), -1);
	ck_assert_int_eq(errno, ENOENT);
	ck_assert_int_eq(frompacks_try("wrong", &error), -1);
	ck_assert_ptr_nonnull(strstr(error, "wrong password"));
	ck_assert_int_eq(stat(t_strconcat(root, "/lsm", NULL), &st), -1);

	ck_assert_int_eq(frompacks_try("pw", &error), 0);
	assert_lsm_is(&before);
	set.key_password = "pw";
	ck_assert_str_eq(read_msg(work_guid, 7),
			 t_strconcat(part_a, part_b, NULL));

	/* blob A again under a fresh sealed DEK (gc with the password),
	   its DEK update the only place that DEK is; the old frame
	   damaged */
	casbox_settings_key(&set, &key_set);
	ck_assert_int_eq(cas_keyring_load_mode(&key_set, &kr, &error), 1);
	txn = pack_add_part_a(kr, &packs, &id, &rec);
	ck_assert_uint_eq(rec.dek_kind, CAS_DEK_KIND_SEALED);
	ck_assert_int_eq(casbox_pack_txn_add_dek_update_kind(txn, &id,
			 rec.dek_kind, rec.stored_dek, &error), 1);
	ck_assert_int_eq(casbox_pack_txn_commit(&txn, &error), 1);
	casbox_pack_store_close(&packs);
	cas_keyring_free(&kr);
	damage_first_frame();
	lsm_lose();
	ck_assert_int_eq(frompacks_try("pw", &error), 0);
	ck_assert_str_eq(read_msg(inbox_guid, 1),
			 t_strconcat(part_a, part_b, NULL));
	ck_assert_str_eq(read_msg(inbox_guid, 2),
			 t_strconcat(part_a, part_c, NULL));
	set.key_password = NULL;
	set.key_mode = CAS_KEY_MODE_SERVER;
}
END_TEST

static void rot_populate(void)
{
	const char *m1[] = { part_a, part_b, NULL };
	const char *m2[] = { part_a, part_c, NULL };
	const char *m3[] = { part_d, NULL };
	struct casbox_store *store = store_open();

	add_msg(store, inbox_guid, "INBOX", 1, "guid-1", m1, FALSE);
	add_msg(store, inbox_guid, "INBOX", 2, "guid-2", m2, FALSE);
	add_msg(store, work_guid, "Work", 1, "guid-3", m3, FALSE);
	casbox_store_close(&store);
}

static void rot_check_msgs(void)
{
	ck_assert_str_eq(read_msg(inbox_guid, 1),
			 t_strconcat(part_a, part_b, NULL));
	ck_assert_str_eq(read_msg(inbox_guid, 2),
			 t_strconcat(part_a, part_c, NULL));
	ck_assert_str_eq(read_msg(work_guid, 1), part_d);
}

/* What doveadm casbox key rotate does first: a new current slot. */
static struct cas_keyring *rot_begin(uint32_t *old_id_r)
{
	struct cas_keyring *kr;
	const char *error = NULL;

	ck_assert_int_eq(cas_keyring_load(set.key_file, &kr, &error), 1);
	*old_id_r = cas_keyring_wrap_key_id(kr);
	cas_keyring_rotate_add(kr);
	ck_assert_int_eq(cas_keyring_save(kr, set.key_file, &error), 1);
	return kr;
}

/* The walk to its end, with the store's packs. Returns records
   rewrapped. */
static uint64_t rot_walk(struct cas_keyring *kr, uint32_t old_id)
{
	struct casbox_pack_settings pack_set;
	struct casbox_lsm *lsm;
	struct casbox_pack_store *packs;
	struct casbox_rekey_stats stats;
	buffer_t *pos = t_buffer_create(64);
	const char *error = NULL;
	int ret;

	if (test_store_lsm_open_set(root, &set, TRUE, &lsm, &error) < 0)
		ck_abort_msg("lsm open: %s", error);
	i_zero(&pack_set);
	pack_set.dir = t_strconcat(root, "/packs", NULL);
	pack_set.fsync = TRUE;
	ck_assert_int_eq(casbox_pack_store_open(&pack_set, kr, &packs,
						&error), 1);
	i_zero(&stats);
	do {
		ret = casbox_rekey_step(lsm, packs, kr, old_id, 2, pos, NULL,
					NULL, &stats, &error);
		if (ret < 0)
			ck_abort_msg("rekey step: %s", error);
	} while (ret > 0);
	ck_assert_uint_eq(stats.failed, 0);
	casbox_pack_store_close(&packs);
	test_store_lsm_close(&lsm);
	return stats.rewrapped;
}

/* key rotate --finish's "packs" step: gc --all copies every blob and
   re-seals every meta record it keeps under the new key epoch, so the
   packs open without the old one. */
static void rot_packs(void)
{
	struct casbox_store *store = store_open();
	struct casbox_store_gc_stats stats;
	struct file_lock *lock = NULL;
	const char *error = NULL;

	ck_assert_int_eq(casbox_store_maintenance_lock(store, TRUE, 10, &lock,
						       &error), 1);
	i_zero(&stats);
	if (casbox_store_gc(store, TRUE, &stats, &error) < 0)
		ck_abort_msg("gc: %s", error);
	ck_assert_uint_eq(stats.packs_deleted, stats.packs_selected);
	file_lock_free(&lock);
	casbox_store_close(&store);
}

/* The last step of a rotation: the packs re-sealed, no record left
   under the old slot, so the key file loses the old slot and epoch. */
static void rot_finish(struct cas_keyring *kr, uint32_t old_id)
{
	struct casbox_lsm *lsm;
	uint64_t left, foreign;
	const char *error = NULL;

	if (test_store_lsm_open_set(root, &set, FALSE, &lsm, &error) < 0)
		ck_abort_msg("lsm open: %s", error);
	ck_assert_int_eq(casbox_rekey_count(lsm, kr, old_id, &left,
					    &foreign, &error), 0);
	ck_assert_uint_eq(left, 0);
	ck_assert_uint_eq(foreign, 0);
	test_store_lsm_close(&lsm);
	rot_packs();
	test_store_reseal_all(root, &set);
	cas_keyring_rotate_finish(kr);
	ck_assert_int_eq(cas_keyring_save(kr, set.key_file, &error), 1);
	ck_assert(!cas_keyring_has_key_id(kr, old_id));
}

/* A crash after the packs committed a whole walk's DEK updates but
   before its LSM batches did: the walk runs for real, then the LSM
   directory is put back as it was before it. */
static void rot_crash_before_lsm_commit(struct cas_keyring *kr,
					uint32_t old_id)
{
	const char *lsm = t_strconcat(root, "/lsm", NULL);

	ck_assert_int_eq(system(t_strdup_printf("cp -a '%s' '%s.saved'",
						lsm, lsm)), 0);
	ck_assert_uint_eq(rot_walk(kr, old_id), 4);
	ck_assert_int_eq(system(t_strdup_printf(
		"rm -rf '%s' && mv '%s.saved' '%s'", lsm, lsm, lsm)), 0);
}

static void rot_rebuild(void)
{
	struct casbox_frompacks *fp;
	struct casbox_admin *adm;

	lsm_lose();
	fp = rebuild(&adm);
	ck_assert_uint_eq(fp->messages, 3);
	ck_assert_uint_eq(fp->lost_messages, 0);
	ck_assert_uint_eq(fp->meta_unreadable, 0);
	ck_assert_uint_eq(fp->damaged_frames, 0);
	ck_assert_uint_eq(fp->orphans, 0);
	ck_assert_uint_eq(array_count(&fp->blob_list), 4);
	casbox_frompacks_deinit(&fp);
	casbox_admin_close(&adm);
}

/* Crash state, then the rotation resumes on the LSM it left: every
   record is rewrapped again (a second DEK update each), the old slot
   goes, and a rebuild from the packs opens every message. */
START_TEST(test_rotation_crash_then_resume)
{
	struct cas_keyring *kr;
	uint32_t old_id;

	rot_populate();
	kr = rot_begin(&old_id);
	rot_crash_before_lsm_commit(kr, old_id);
	/* the LSM still says old slot, the packs new: both read */
	rot_check_msgs();
	ck_assert_uint_eq(rot_walk(kr, old_id), 4);
	rot_finish(kr, old_id);
	rot_check_msgs();
	rot_rebuild();
	rot_check_msgs();
	cas_keyring_free(&kr);
}
END_TEST

/* Crash state, then the LSM is lost before the rotation resumes: the
   rebuild (key file with both slots) opens every message, the resumed
   rotation finishes on the rebuilt LSM, and a second rebuild after the
   old slot is gone still opens every message. */
START_TEST(test_rotation_crash_then_rebuild)
{
	struct cas_keyring *kr;
	uint32_t old_id;

	rot_populate();
	kr = rot_begin(&old_id);
	rot_crash_before_lsm_commit(kr, old_id);
	rot_rebuild();
	rot_check_msgs();
	(void)rot_walk(kr, old_id);
	rot_finish(kr, old_id);
	rot_check_msgs();
	rot_rebuild();
	rot_check_msgs();
	cas_keyring_free(&kr);
}
END_TEST

/* Without a crash: a finished rotation, then the LSM lost. The packs
   alone (recovery records under the old slot, DEK updates under the
   new) open every message with the key file that has only the new
   slot. */
START_TEST(test_rotation_finished_then_rebuild)
{
	struct cas_keyring *kr;
	uint32_t old_id;

	rot_populate();
	kr = rot_begin(&old_id);
	ck_assert_uint_eq(rot_walk(kr, old_id), 4);
	rot_finish(kr, old_id);
	rot_rebuild();
	rot_check_msgs();
	cas_keyring_free(&kr);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("doveadm-frompacks");
	TCase *tc = tcase_create("frompacks");
	int failed;

	lib_init();
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_records_come_back);
	tcase_add_test(tc, test_busy_lsm_is_left_alone);
	tcase_add_test(tc, test_dek_update_opens_new_frame);
	tcase_add_test(tc, test_no_opening_dek_is_lost);
	tcase_add_test(tc, test_refused_without_records);
	tcase_add_test(tc, test_password_mode);
	tcase_add_test(tc, test_rotation_crash_then_resume);
	tcase_add_test(tc, test_rotation_crash_then_rebuild);
	tcase_add_test(tc, test_rotation_finished_then_rebuild);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
