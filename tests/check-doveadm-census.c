/* doveadm casbox census (what stats, scrub and gc stand on): counts and
   references from the LSM, live/dead bytes from the keyless pack scan,
   a flipped byte attributed to exactly its blob, malformed records and
   refcount drift found. Stores are built with the real store layer. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "test-common.h"
#include "str.h"
#include "unlink-directory.h"
#include "casbox-lsm.h"
#include "casbox-store.h"
#include "casbox-store-quarantine.h"
#include "doveadm-casbox.h"

#include <check.h>
#include "check-run.h"
#include "test-store-fixture.h"
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sodium.h>

static char test_dir[] = "/tmp/check-doveadm-census.XXXXXX";
static const char *root;
static struct casbox_settings set;
static const guid_128_t box_guid = { 9, 8, 7, 6, 5, 4, 3, 2,
				     1, 2, 3, 4, 5, 6, 7, 8 };

/* distinct lengths: census_blob() finds a blob by its size */
static const char *part_a = "part A shared by messages 1 and 2\r\n";
static const char *part_b = "part B only in message 1\r\n";
static const char *part_c = "part C, only in message 2\r\n";
static const char *part_d = "part D only in message 3, a bit longer\r\n";

struct damage_log {
	unsigned int count;
	char last_cause[512];
};

static void damage_cb(void *context, const char *mailbox ATTR_UNUSED,
		      uint32_t uid ATTR_UNUSED,
		      const char *object ATTR_UNUSED, const char *cause)
{
	struct damage_log *log = context;

	log->count++;
	(void)i_strocpy(log->last_cause, cause, sizeof(log->last_cause));
}

static void setup(void)
{
	test_store_fixture_setup(test_dir, &root, &set);
	set.gc_dead_ratio = 30;
}

static void teardown(void)
{
	test_store_fixture_teardown(test_dir);
}

static void add_msg(struct casbox_store *store, uint32_t uid,
		    const char *const *parts)
{
	struct casbox_store_txn *txn;
	struct casbox_msg_record rec;
	struct casbox_msg_part *part;
	struct istream **inputs;
	unsigned int i, count = str_array_length(parts);
	const char *error = NULL;
	pool_t pool = pool_alloconly_create("msg", 1024);

	casbox_msg_record_init(pool, &rec);
	rec.guid = "guid";
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
	rec.virtual_size = rec.physical_size;
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	if (casbox_store_txn_add_msg(txn, box_guid, uid, &rec, inputs,
				     &error) < 0)
		ck_abort_msg("add: %s", error);
	if (casbox_store_txn_commit(&txn, &error) < 0)
		ck_abort_msg("commit: %s", error);
	for (i = 0; i < count; i++)
		i_stream_unref(&inputs[i]);
	pool_unref(&pool);
}

/* messages 1 = A+B, 2 = A+C, 3 = D */
static void build_store(bool expunge3)
{
	const char *m1[] = { part_a, part_b, NULL };
	const char *m2[] = { part_a, part_c, NULL };
	const char *m3[] = { part_d, NULL };
	struct casbox_store *store;
	struct casbox_store_txn *txn;
	const char *error = NULL;

	if (casbox_store_open(root, &set, FSYNC_MODE_ALWAYS,
			      FILE_LOCK_METHOD_FCNTL, &store, &error) < 0 ||
	    casbox_store_open_keys(store, &error) < 0)
		ck_abort_msg("store open: %s", error);
	add_msg(store, 1, m1);
	add_msg(store, 2, m2);
	add_msg(store, 3, m3);
	if (expunge3) {
		ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error),
				 0);
		ck_assert_int_eq(casbox_store_txn_expunge(txn, box_guid, 3,
							  &error), 0);
		ck_assert_int_eq(casbox_store_txn_commit(&txn, &error), 0);
	}
	casbox_store_close(&store);
}

static struct casbox_admin *adm_open(void)
{
	struct casbox_admin *adm;
	const char *error = NULL;

	if (casbox_admin_open_root(root, &set, FSYNC_MODE_ALWAYS,
				   FILE_LOCK_METHOD_FCNTL, &adm, &error) <= 0 ||
	    casbox_admin_open_keys(adm, &error) < 0)
		ck_abort_msg("admin open: %s", error);
	return adm;
}

static struct casbox_census *
census_full(struct casbox_admin *adm, struct damage_log *log)
{
	struct casbox_census *census;
	const char *error = NULL;

	if (casbox_census_build(adm->store, damage_cb, log, &census,
				&error) < 0 ||
	    casbox_census_scan_packs(adm->store, census, damage_cb, log,
				     &error) < 0)
		ck_abort_msg("census: %s", error);
	return census;
}

/* A full census reports exactly one damaged item: a frame in the packs
   that no blob record points to. */
static void assert_one_unreferenced_frame(struct casbox_admin *adm)
{
	struct casbox_census *census;
	struct damage_log log = { 0, "" };

	census = census_full(adm, &log);
	ck_assert_uint_eq(log.count, 1);
	ck_assert_ptr_nonnull(strstr(log.last_cause,
				     "no blob record points to"));
	casbox_census_free(&census);
}

static struct casbox_census_blob *
census_blob(struct casbox_census *census, const char *data)
{
	struct casbox_census_blob *blob;

	array_foreach_elem(&census->blob_list, blob) {
		if (blob->have_record &&
		    blob->rec.plain_size == strlen(data))
			return blob;
	}
	ck_abort_msg("no blob of %u bytes", (unsigned int)strlen(data));
	return NULL;
}

static uint64_t census_dead(struct casbox_census *census)
{
	const struct casbox_census_pack *pack;
	uint64_t dead = 0;

	array_foreach(&census->packs, pack)
		dead += pack->dead_bytes;
	return dead;
}

START_TEST(test_counts_and_refs)
{
	const struct casbox_census_pack *pack;
	struct damage_log log = { 0, "" };
	struct casbox_census_blob *blob;
	struct casbox_census *census;
	struct casbox_admin *adm;

	build_store(FALSE);
	adm = adm_open();
	census = census_full(adm, &log);
	ck_assert_uint_eq(log.count, 0);
	ck_assert_uint_eq(census->messages, 3);
	ck_assert_uint_eq(census->logical_bytes,
			  2 * strlen(part_a) + strlen(part_b) +
			  strlen(part_c) + strlen(part_d));
	ck_assert_uint_eq(array_count(&census->blob_list), 4);
	array_foreach_elem(&census->blob_list, blob) {
		ck_assert(blob->have_record);
		ck_assert(blob->frame_seen);
		ck_assert_ptr_null(blob->damage);
		ck_assert_uint_eq(blob->refcount, blob->counted);
	}
	ck_assert_uint_eq(census_blob(census, part_a)->counted, 2);
	ck_assert_uint_eq(array_count(&census->packs), 1);
	pack = array_idx(&census->packs, 0);
	ck_assert_uint_gt(pack->live_bytes, 0);
	ck_assert_uint_eq(census_dead(census), 0);
	casbox_census_free(&census);
	casbox_admin_close(&adm);
}
END_TEST

START_TEST(test_dead_after_expunge)
{
	const struct casbox_census_pack *pack;
	struct damage_log log = { 0, "" };
	struct casbox_census *census;
	struct casbox_admin *adm;

	build_store(TRUE);
	adm = adm_open();
	census = census_full(adm, &log);
	ck_assert_uint_eq(log.count, 0);
	ck_assert_uint_eq(census->messages, 2);
	/* D's record went with its last reference; its frame is dead */
	ck_assert_uint_eq(array_count(&census->blob_list), 3);
	ck_assert_uint_gt(census_dead(census), strlen(part_d));
	pack = array_idx(&census->packs, 0);
	ck_assert_uint_lt(census_dead(census), pack->live_bytes);
	casbox_census_free(&census);
	casbox_admin_close(&adm);
}
END_TEST

START_TEST(test_flipped_byte_hits_one_blob)
{
	struct damage_log log = { 0, "" };
	struct casbox_census_blob *blob, *hit;
	struct casbox_census *census;
	struct casbox_admin *adm;
	unsigned char b;
	off_t pos;
	int fd;

	build_store(FALSE);
	adm = adm_open();
	census = census_full(adm, &log);
	hit = census_blob(census, part_c);
	pos = hit->rec.offset + hit->rec.frame_size / 2;
	fd = open(casbox_admin_pack_path(adm, hit->rec.pack_id), O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &b, 1, pos), 1);
	b ^= 0x04;
	ck_assert_int_eq(pwrite(fd, &b, 1, pos), 1);
	i_close_fd(&fd);
	casbox_census_free(&census);

	census = census_full(adm, &log);
	/* the damage belongs to a blob: scrub names it per message */
	ck_assert_uint_eq(log.count, 0);
	array_foreach_elem(&census->blob_list, blob) {
		if (blob->rec.plain_size == strlen(part_c))
			ck_assert_ptr_nonnull(blob->damage);
		else
			ck_assert_ptr_null(blob->damage);
	}
	casbox_census_free(&census);
	casbox_admin_close(&adm);
}
END_TEST

static void lsm_put(struct casbox_admin *adm, const buffer_t *key,
		    const void *value, size_t value_size)
{
	struct casbox_lsm_batch *batch;
	const char *error = NULL;

	ck_assert_int_eq(casbox_lsm_batch_begin(adm->lsm, &batch, &error), 1);
	casbox_lsm_batch_put(batch, key->data, key->used, value, value_size);
	ck_assert_int_eq(casbox_lsm_batch_commit(&batch, &error), 1);
}

START_TEST(test_malformed_and_drift)
{
	struct damage_log log = { 0, "" };
	struct casbox_census_blob *a;
	struct casbox_census *census;
	struct casbox_blob_value bval;
	struct casbox_admin *adm;
	buffer_t *key, *value, *prec;

	build_store(FALSE);
	adm = adm_open();
	census = census_full(adm, &log);
	a = census_blob(census, part_a);

	key = t_buffer_create(64);
	casbox_key_message(key, box_guid, 77);
	lsm_put(adm, key, "garbage", 7);

	buffer_set_used_size(key, 0);
	casbox_key_blob(key, &a->id);
	prec = t_buffer_create(CASBOX_BLOB_RECORD_EXPORT_SIZE);
	casbox_blob_record_export(&a->rec, prec);
	i_zero(&bval);
	bval.refcount = 7;
	bval.pack_record = prec->data;
	bval.pack_record_size = prec->used;
	value = t_buffer_create(128);
	casbox_blob_value_export(&bval, value);
	lsm_put(adm, key, value->data, value->used);
	casbox_census_free(&census);

	census = census_full(adm, &log);
	ck_assert_uint_eq(log.count, 1);
	ck_assert_uint_eq(census->bad_records, 1);
	ck_assert_ptr_nonnull(strstr(log.last_cause,
				     "malformed message record"));
	a = census_blob(census, part_a);
	ck_assert_uint_eq(a->refcount, 7);
	ck_assert_uint_eq(a->counted, 2);
	ck_assert_uint_eq(census->messages, 3);
	casbox_census_free(&census);
	casbox_admin_close(&adm);
}
END_TEST

static void expunge_uid(uint32_t uid)
{
	struct casbox_store *store;
	struct casbox_store_txn *txn;
	const char *error = NULL;

	ck_assert_int_eq(casbox_store_open(root, &set, FSYNC_MODE_ALWAYS,
		FILE_LOCK_METHOD_FCNTL, &store, &error), 0);
	ck_assert_int_eq(casbox_store_txn_begin(store, &txn, &error), 0);
	ck_assert_int_eq(casbox_store_txn_expunge(txn, box_guid, uid,
						  &error), 0);
	ck_assert_int_eq(casbox_store_txn_commit(&txn, &error), 0);
	casbox_store_close(&store);
}

/* A damaged frame nothing points to is reported; a torn tail (an append
   in progress) is only dead bytes. */
START_TEST(test_unreferenced_damage_and_tail)
{
	static const unsigned char junk[40] = { 0x42, 0x43 };
	struct damage_log log = { 0, "" };
	struct casbox_census *census;
	struct casbox_census_blob *b;
	struct casbox_admin *adm;
	struct casbox_blob_record brec;
	uint64_t dead;
	unsigned char c;
	off_t pos;
	int fd;

	build_store(FALSE);
	adm = adm_open();
	census = census_full(adm, &log);
	b = census_blob(census, part_b);
	brec = b->rec;
	casbox_census_free(&census);
	casbox_admin_close(&adm);
	expunge_uid(1);

	adm = adm_open();
	fd = open(casbox_admin_pack_path(adm, brec.pack_id), O_RDWR);
	ck_assert_int_ge(fd, 0);
	census = census_full(adm, &log);
	ck_assert_uint_eq(log.count, 0);
	dead = census_dead(census);
	casbox_census_free(&census);
	ck_assert_int_ge(lseek(fd, 0, SEEK_END), 0);
	ck_assert_int_eq(write(fd, junk, sizeof(junk)), sizeof(junk));
	census = census_full(adm, &log);
	ck_assert_msg(log.count == 0, "%s", log.last_cause);
	ck_assert_uint_eq(census_dead(census), dead + sizeof(junk));
	casbox_census_free(&census);

	pos = brec.offset + brec.frame_size / 2;
	ck_assert_int_eq(pread(fd, &c, 1, pos), 1);
	c ^= 0x20;
	ck_assert_int_eq(pwrite(fd, &c, 1, pos), 1);
	i_close_fd(&fd);
	assert_one_unreferenced_frame(adm);
	casbox_admin_close(&adm);
}
END_TEST

/* A writer killed between writing a frame's body and its header leaves
   a frame with an all-zero header; the next writer appends after it. The
   census counts it as dead bytes, not damage, wherever it is; the same
   bytes with a header that was written and then damaged are damage. */
START_TEST(test_unfinished_append_mid_pack)
{
	static const unsigned char body[150] = { 0x51, 0x52, 0x53 };
	const char *m4[] = { "part E, appended after the torn frame\r\n", NULL };
	struct damage_log log = { 0, "" };
	struct casbox_census *census;
	struct casbox_store *store;
	struct casbox_admin *adm;
	const char *error = NULL;
	uint64_t dead;
	off_t end;
	int fd;

	build_store(FALSE);
	adm = adm_open();
	census = census_full(adm, &log);
	dead = census_dead(census);
	casbox_census_free(&census);
	/* the torn frame: a hole where the header goes, then its body */
	fd = open(casbox_admin_pack_path(adm, 1), O_RDWR);
	ck_assert_int_ge(fd, 0);
	end = lseek(fd, 0, SEEK_END);
	ck_assert_int_gt(end, 0);
	ck_assert_int_eq(pwrite(fd, body, sizeof(body), end + 68),
			 (ssize_t)sizeof(body));
	casbox_admin_close(&adm);

	if (casbox_store_open(root, &set, FSYNC_MODE_ALWAYS,
			      FILE_LOCK_METHOD_FCNTL, &store, &error) < 0 ||
	    casbox_store_open_keys(store, &error) < 0)
		ck_abort_msg("store open: %s", error);
	add_msg(store, 4, m4);
	casbox_store_close(&store);

	adm = adm_open();
	census = census_full(adm, &log);
	ck_assert_msg(log.count == 0, "%s", log.last_cause);
	ck_assert_uint_eq(census->messages, 4);
	ck_assert_uint_eq(census_dead(census), dead + 68 + sizeof(body));
	casbox_census_free(&census);

	/* a header byte that is not zero: damage, reported */
	ck_assert_int_eq(pwrite(fd, "\x01", 1, end + 10), 1);
	i_close_fd(&fd);
	assert_one_unreferenced_frame(adm);
	casbox_admin_close(&adm);
}
END_TEST

/* A quarantine record round-trips, the census sees it on its blob, the
   store finds it for exactly the messages using that blob, the frame
   copy holds the frame's bytes, and a malformed record is refused. */
START_TEST(test_quarantine)
{
	struct casbox_quarantine_record qrec, back;
	struct casbox_census_blob *b;
	struct casbox_census *census;
	struct casbox_msg_record rec;
	struct casbox_admin *adm;
	struct damage_log log;
	struct cas_blob_id hit;
	buffer_t *key, *value, *frame;
	const char *error = NULL, *cause, *path;
	unsigned char buf[4096];
	ssize_t n;
	int fd;

	build_store(FALSE);
	adm = adm_open();
	i_zero(&log);
	census = census_full(adm, &log);
	b = census_blob(census, part_b);

	i_zero(&qrec);
	qrec.time = 1700000000;
	qrec.pack_id = b->rec.pack_id;
	qrec.offset = b->rec.offset;
	qrec.frame_size = b->rec.frame_size;
	qrec.cause = "chunk 0: CRC mismatch";
	value = t_buffer_create(64);
	casbox_quarantine_record_export(&qrec, value);
	ck_assert_int_eq(casbox_quarantine_record_import(value->data,
		value->used, pool_datastack_create(), &back, &error), 0);
	ck_assert_int_eq(back.time, qrec.time);
	ck_assert_uint_eq(back.pack_id, qrec.pack_id);
	ck_assert_uint_eq(back.offset, qrec.offset);
	ck_assert_uint_eq(back.frame_size, qrec.frame_size);
	ck_assert_str_eq(back.cause, qrec.cause);
	ck_assert_int_eq(casbox_quarantine_record_import(value->data, 10,
		pool_datastack_create(), &back, &error), -1);

	/* the frame copy is the frame */
	ck_assert_int_eq(casbox_store_quarantine_copy(adm->store, &b->id,
		&qrec, &path, &error), 0);
	frame = t_buffer_create(256);
	fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		buffer_append(frame, buf, n);
	i_close_fd(&fd);
	ck_assert_uint_eq(frame->used, b->rec.frame_size);
	fd = open(casbox_admin_pack_path(adm, b->rec.pack_id), O_RDONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, buf, frame->used, b->rec.offset),
			 (ssize_t)frame->used);
	i_close_fd(&fd);
	ck_assert(memcmp(buf, frame->data, frame->used) == 0);

	key = t_buffer_create(40);
	casbox_quarantine_key(key, &b->id);
	lsm_put(adm, key, value->data, value->used);
	casbox_census_free(&census);
	i_zero(&log);
	census = census_full(adm, &log);
	ck_assert_uint_eq(log.count, 0);
	ck_assert_str_eq(census_blob(census, part_b)->quarantined,
			 qrec.cause);
	ck_assert_ptr_null(census_blob(census, part_a)->quarantined);
	casbox_census_free(&census);

	/* message 1 (A+B) is quarantined, message 2 (A+C) is not */
	ck_assert_int_eq(casbox_store_msg_lookup(adm->store, box_guid, 1,
		pool_datastack_create(), &rec, &error), 1);
	ck_assert_int_eq(casbox_store_msg_quarantined(adm->store, &rec, &hit,
						      &cause, &error), 1);
	ck_assert(memcmp(hit.id, b->id.id, sizeof(hit.id)) == 0);
	ck_assert_str_eq(cause, qrec.cause);
	ck_assert_int_eq(casbox_store_msg_lookup(adm->store, box_guid, 2,
		pool_datastack_create(), &rec, &error), 1);
	ck_assert_int_eq(casbox_store_msg_quarantined(adm->store, &rec, &hit,
						      &cause, &error), 0);
	casbox_admin_close(&adm);
}
END_TEST

START_TEST(test_no_store)
{
	struct casbox_admin *adm;
	const char *error = NULL;

	ck_assert_int_eq(casbox_admin_open_root(root, &set,
		FSYNC_MODE_ALWAYS, FILE_LOCK_METHOD_FCNTL, &adm, &error), 0);
	ck_assert_ptr_nonnull(strstr(error, "no casbox store"));
}
END_TEST

/* key init / key password input (doveadm-casbox-keyinput.c) */
static struct casbox_key_input *key_input_pipe(const void *data, size_t size,
					       int expect_ret)
{
	struct casbox_key_input *input = NULL;
	const char *error = NULL;
	int fds[2];

	ck_assert_int_eq(pipe(fds), 0);
	ck_assert_int_eq(write(fds[1], data, size), (ssize_t)size);
	i_close_fd(&fds[1]);
	ck_assert_int_eq(casbox_key_input_read_fd(fds[0], &input, &error),
			 expect_ret);
	i_close_fd(&fds[0]);
	if (expect_ret < 0) {
		ck_assert_ptr_null(input);
		ck_assert_ptr_nonnull(strstr(error, "longer than"));
	}
	return input;
}

static const char *const key_input_names[] = { "old", "new", NULL };

static const struct {
	const char *data;
	/* NULL: error expected, which contains error */
	const char *line1, *line2, *error;
} key_input_cases[] = {
	{ "a\nb\n", "a", "b", NULL },
	{ "a\nb", "a", "b", NULL },
	{ "a\r\nb\r\n", "a", "b", NULL },
	/* one "\r" only, and only at the end */
	{ "a\r\r\nb\rc\n", "a\r", "b\rc", NULL },
	{ " a \n\tb\n", " a ", "\tb", NULL },
	{ "", NULL, NULL, "no input" },
	{ "a\n", NULL, NULL, "1 line(s) of input, expected 2 (old, new)" },
	{ "a", NULL, NULL, "1 line(s) of input, expected 2" },
	{ "a\n\n", NULL, NULL, "line 2 (new) is empty" },
	{ "a\n\r\n", NULL, NULL, "line 2 (new) is empty" },
	{ "\nb\n", NULL, NULL, "line 1 (old) is empty" },
	{ "\r\n", NULL, NULL, "line 1 (old) is empty" },
	{ "a\nb\nc", NULL, NULL, "more than 2 line(s)" },
	{ "a\nb\n\n", NULL, NULL, "more than 2 line(s)" },
};

START_TEST(test_key_input_lines)
{
	const char *data = key_input_cases[_i].data;
	struct casbox_key_input *input;
	struct casbox_key_line lines[2];
	const char *error = NULL;
	int ret;

	input = key_input_pipe(data, strlen(data), 0);
	ck_assert_uint_eq(input->size, strlen(data));
	ret = casbox_key_input_lines(input, key_input_names, lines, 2,
				     &error);
	if (key_input_cases[_i].error != NULL) {
		ck_assert_int_eq(ret, -1);
		ck_assert_msg(strstr(error, key_input_cases[_i].error) != NULL,
			      "case %d: %s", _i, error);
	} else {
		ck_assert_int_eq(ret, 0);
		ck_assert_uint_eq(lines[0].size,
				  strlen(key_input_cases[_i].line1));
		ck_assert(memcmp(lines[0].data, key_input_cases[_i].line1,
				 lines[0].size) == 0);
		ck_assert_uint_eq(lines[1].size,
				  strlen(key_input_cases[_i].line2));
		ck_assert(memcmp(lines[1].data, key_input_cases[_i].line2,
				 lines[1].size) == 0);
	}
	casbox_key_input_free(&input);
	ck_assert_ptr_null(input);
}
END_TEST

START_TEST(test_key_input_limits)
{
	static const unsigned char nul_line[] = { 'a', 0, 'b', '\n' };
	static const char *const one[] = { "password", NULL };
	unsigned char *big = i_malloc(CASBOX_KEY_INPUT_MAX + 1);
	struct casbox_key_input *input;
	struct casbox_key_line line;
	const char *error = NULL;

	memset(big, 'x', CASBOX_KEY_INPUT_MAX + 1);
	input = key_input_pipe(big, CASBOX_KEY_INPUT_MAX, 0);
	ck_assert_int_eq(casbox_key_input_lines(input, one, &line, 1,
						&error), 0);
	ck_assert_uint_eq(line.size, CASBOX_KEY_INPUT_MAX);
	casbox_key_input_free(&input);
	ck_assert_ptr_null(key_input_pipe(big, CASBOX_KEY_INPUT_MAX + 1, -1));
	i_free(big);

	/* a passdb password cannot hold a NUL byte */
	input = key_input_pipe(nul_line, sizeof(nul_line), 0);
	ck_assert_int_eq(casbox_key_input_lines(input, one, &line, 1,
						&error), -1);
	ck_assert_ptr_nonnull(strstr(error, "NUL byte"));
	casbox_key_input_free(&input);
}
END_TEST

/* A line as a C string: cut in place at its line end, also for a last
   line without one that fills the input to the limit. */
START_TEST(test_key_line_str)
{
	static const char *const two[] = { "old", "new", NULL };
	static const char *const one[] = { "password", NULL };
	unsigned char *big = i_malloc(CASBOX_KEY_INPUT_MAX);
	struct casbox_key_input *input;
	struct casbox_key_line lines[2];
	const char *error = NULL;

	input = key_input_pipe("pw one\r\npw two", 14, 0);
	ck_assert_int_eq(casbox_key_input_lines(input, two, lines, 2,
						&error), 0);
	ck_assert_str_eq(casbox_key_line_str(input, &lines[0]), "pw one");
	ck_assert_str_eq(casbox_key_line_str(input, &lines[1]), "pw two");
	casbox_key_input_free(&input);

	memset(big, 'y', CASBOX_KEY_INPUT_MAX);
	input = key_input_pipe(big, CASBOX_KEY_INPUT_MAX, 0);
	ck_assert_int_eq(casbox_key_input_lines(input, one, lines, 1,
						&error), 0);
	ck_assert_uint_eq(strlen(casbox_key_line_str(input, &lines[0])),
			  CASBOX_KEY_INPUT_MAX);
	casbox_key_input_free(&input);
	i_free(big);
}
END_TEST

START_TEST(test_key_input_stream)
{
	static const char data[] = "old-pw\r\nnew-pw\r\n";
	struct casbox_key_input *input;
	struct casbox_key_line lines[2];
	struct istream *stream;
	const char *error = NULL;

	/* one byte per read, as a forwarded (dot) stream may give them */
	stream = test_istream_create_data(data, sizeof(data) - 1);
	test_istream_set_max_buffer_size(stream, 1);
	ck_assert_int_eq(casbox_key_input_read_stream(stream, &input,
						      &error), 0);
	i_stream_unref(&stream);
	ck_assert_int_eq(casbox_key_input_lines(input, key_input_names,
						lines, 2, &error), 0);
	ck_assert(lines[0].size == 6 &&
		  memcmp(lines[0].data, "old-pw", 6) == 0);
	ck_assert(lines[1].size == 6 &&
		  memcmp(lines[1].data, "new-pw", 6) == 0);
	casbox_key_input_free(&input);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("doveadm-census");
	TCase *tc = tcase_create("census");
	int failed;

	lib_init();
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_counts_and_refs);
	tcase_add_test(tc, test_dead_after_expunge);
	tcase_add_test(tc, test_flipped_byte_hits_one_blob);
	tcase_add_test(tc, test_malformed_and_drift);
	tcase_add_test(tc, test_unreferenced_damage_and_tail);
	tcase_add_test(tc, test_unfinished_append_mid_pack);
	tcase_add_test(tc, test_quarantine);
	tcase_add_test(tc, test_no_store);
	suite_add_tcase(s, tc);
	tc = tcase_create("key input");
	tcase_add_loop_test(tc, test_key_input_lines, 0,
			    N_ELEMENTS(key_input_cases));
	tcase_add_test(tc, test_key_input_limits);
	tcase_add_test(tc, test_key_line_str);
	tcase_add_test(tc, test_key_input_stream);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
