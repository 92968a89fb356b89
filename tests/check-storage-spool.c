/* casbox-spool: a save's message held until commit. Every byte reads
   back from any offset, across the memory/file boundary and the
   cipher's 64-byte blocks; the spool file holds no plaintext (read
   through /proc/self/fd, the way anyone with the process's rights
   could), is unlinked from the start and closed with the last reader;
   a spool that cannot make its file fails with the reason. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "str.h"
#include "unlink-directory.h"
#include "istream.h"
#include "ostream.h"
#include "casbox-spool.h"

#include <check.h>
#include "check-run.h"
#include <stdlib.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <sodium.h>

static char test_dir[] = "/tmp/check-storage-spool.XXXXXX";
static const char *prefix;

static void setup(void)
{
	ck_assert_ptr_nonnull(mkdtemp(test_dir));
	prefix = t_strconcat(test_dir, "/spool.", NULL);
}

static void teardown(void)
{
	const char *error;

	ck_assert_int_eq(unlink_directory(test_dir,
		UNLINK_DIRECTORY_FLAG_RMDIR, &error), 1);
	memcpy(test_dir + strlen(test_dir) - 6, "XXXXXX", 6);
}

/* The open files of this process under test_dir: their /proc/self/fd
   paths. Each must be deleted already: nothing is left for a crash. */
static ARRAY_TYPE(const_string) *spool_files(void)
{
	ARRAY_TYPE(const_string) *files = t_new(ARRAY_TYPE(const_string), 1);
	char target[PATH_MAX];
	struct dirent *d;
	const char *link;
	DIR *dir;
	ssize_t n;

	t_array_init(files, 4);
	dir = opendir("/proc/self/fd");
	ck_assert_ptr_nonnull(dir);
	while ((d = readdir(dir)) != NULL) {
		if (d->d_name[0] == '.')
			continue;
		link = t_strconcat("/proc/self/fd/", d->d_name, NULL);
		n = readlink(link, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = '\0';
		if (strncmp(target, test_dir, strlen(test_dir)) != 0)
			continue;
		ck_assert_msg(strstr(target, " (deleted)") != NULL,
			      "spool file not unlinked: %s", target);
		array_push_back(files, &link);
	}
	closedir(dir);
	return files;
}

static buffer_t *read_fd_path(const char *path)
{
	buffer_t *buf = t_buffer_create(1024);
	unsigned char tmp[8192];
	ssize_t n;
	int fd;

	fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	while ((n = read(fd, tmp, sizeof(tmp))) > 0)
		buffer_append(buf, tmp, n);
	ck_assert_int_eq(n, 0);
	i_close_fd(&fd);
	return buf;
}

static bool mem_has(const buffer_t *hay, const char *needle)
{
	const unsigned char *p = hay->data;
	size_t i, n = strlen(needle);

	for (i = 0; i + n <= hay->used; i++) {
		if (memcmp(p + i, needle, n) == 0)
			return TRUE;
	}
	return FALSE;
}

/* A message-like text: a marker line repeated, with a counter so that
   no two 64-byte blocks are alike. */
static buffer_t *make_text(size_t size)
{
	string_t *str = t_str_new(size + 64);
	unsigned int i = 0;

	while (str_len(str) < size)
		str_printfa(str, "line %u: Wombatquill secret marker\r\n", i++);
	str_truncate(str, size);
	return str;
}

/* Write text in odd-sized pieces (1, 63, 65, ... bytes), so writes
   start and end inside cipher blocks and across the memory limit. */
static struct istream *spool_text(const buffer_t *text, size_t mem_max)
{
	static const size_t sizes[] = { 1, 63, 65, 4097, 64, 7, 12345 };
	struct ostream *output;
	size_t pos = 0, n;
	unsigned int i = 0;

	output = casbox_spool_create(prefix, mem_max);
	while (pos < text->used) {
		n = sizes[i++ % N_ELEMENTS(sizes)];
		n = I_MIN(n, text->used - pos);
		o_stream_nsend(output, CONST_PTR_OFFSET(text->data, pos), n);
		pos += n;
	}
	ck_assert_int_gt(o_stream_finish(output), 0);
	return casbox_spool_finish(&output);
}

/* input's bytes [offset, offset + size) equal expect's */
static void assert_range(struct istream *input, const unsigned char *expect,
			 uoff_t offset, size_t size)
{
	const unsigned char *data;
	size_t got = 0, n;

	i_stream_seek(input, offset);
	while (got < size) {
		ck_assert_int_gt(i_stream_read_more(input, &data, &n), 0);
		n = I_MIN(n, size - got);
		ck_assert_msg(memcmp(data, expect + offset + got, n) == 0,
			      "bytes differ in [%"PRIuUOFF_T", +%zu)",
			      offset + got, n);
		i_stream_skip(input, n);
		got += n;
	}
}

static void assert_all(struct istream *input, const buffer_t *text)
{
	const unsigned char *data;
	uoff_t size;
	size_t n;

	ck_assert_int_eq(i_stream_get_size(input, TRUE, &size), 1);
	ck_assert_uint_eq(size, text->used);
	assert_range(input, text->data, 0, text->used);
	ck_assert_int_eq(i_stream_read_more(input, &data, &n), -1);
	ck_assert_int_eq(input->stream_errno, 0);
	ck_assert(input->eof);
}

START_TEST(test_small_stays_in_memory)
{
	buffer_t *text = make_text(3000);
	struct istream *input;

	input = spool_text(text, 4096);
	ck_assert_uint_eq(array_count(spool_files()), 0);
	assert_all(input, text);
	assert_range(input, text->data, 2999, 1);
	i_stream_unref(&input);
}
END_TEST

START_TEST(test_big_goes_encrypted_to_file)
{
	static const size_t mem_maxes[] = { 0, 1, 1000, 64 * 3 };
	buffer_t *text = make_text(300 * 1024), *file;
	const unsigned char *p = text->data;
	const char *const *paths;
	struct istream *input, *range1, *range2;
	unsigned int i, j;
	uoff_t offset;

	for (i = 0; i < N_ELEMENTS(mem_maxes); i++) {
		input = spool_text(text, mem_maxes[i]);
		ck_assert_uint_eq(array_count(spool_files()), 1);
		paths = array_front(spool_files());
		file = read_fd_path(paths[0]);
		/* the rest of the text, and none of it readable */
		ck_assert_uint_eq(file->used, text->used - mem_maxes[i]);
		ck_assert(!mem_has(file, "Wombatquill"));
		ck_assert(!mem_has(file, "secret marker"));

		assert_all(input, text);
		/* seeks: every offset around the memory limit and the
		   first blocks, then odd offsets and sizes all over */
		for (offset = 0; offset < mem_maxes[i] + 200; offset++)
			assert_range(input, p, offset, 70);
		for (j = 0; j < 200; j++) {
			offset = (j * 7919 * 13) % (text->used - 1);
			assert_range(input, p, offset,
				     I_MIN(text->used - offset, j * 37 + 1));
		}
		/* two parts read in turns, as the store reads a message */
		range1 = i_stream_create_range(input, 10, 100000);
		range2 = i_stream_create_range(input, 150000, 100000);
		for (j = 0; j < 4; j++) {
			assert_range(range1, p + 10, j * 25000, 25000);
			assert_range(range2, p + 150000, j * 25000, 25000);
		}
		i_stream_unref(&range1);
		i_stream_unref(&range2);
		i_stream_unref(&input);
		/* the last reader closed it */
		ck_assert_uint_eq(array_count(spool_files()), 0);
	}
}
END_TEST

/* A reopened spool reads the same bytes from the start, in memory and
   in the file, without the old reader's buffer; the file stays while
   any reader does. */
START_TEST(test_reopen)
{
	buffer_t *text = make_text(50000);
	struct istream *input, *old;

	input = spool_text(text, 20000);
	ck_assert_uint_eq(array_count(spool_files()), 1);
	assert_range(input, text->data, 30000, 1000);
	old = input;
	i_stream_ref(old);
	casbox_spool_reopen(&input);
	ck_assert_ptr_ne(input, old);
	ck_assert_uint_eq(input->v_offset, 0);
	ck_assert_uint_eq(i_stream_get_data_size(input), 0);
	i_stream_unref(&old);
	ck_assert_uint_eq(array_count(spool_files()), 1);
	assert_all(input, text);
	i_stream_unref(&input);
	ck_assert_uint_eq(array_count(spool_files()), 0);
}
END_TEST

START_TEST(test_same_text_other_key)
{
	buffer_t *text = make_text(10000), *a, *b;
	struct istream *in1, *in2;
	const char *const *paths;

	in1 = spool_text(text, 0);
	paths = array_front(spool_files());
	a = read_fd_path(paths[0]);
	in2 = spool_text(text, 0);
	ck_assert_uint_eq(array_count(spool_files()), 2);
	paths = array_front(spool_files());
	b = read_fd_path(paths[0]);
	if (buffer_cmp(a, b))
		b = read_fd_path(paths[1]);
	/* a fresh key per spool: equal texts never look equal on disk */
	ck_assert_uint_eq(a->used, b->used);
	ck_assert(!buffer_cmp(a, b));
	assert_all(in1, text);
	assert_all(in2, text);
	i_stream_unref(&in1);
	i_stream_unref(&in2);
}
END_TEST

START_TEST(test_unusable_temp_dir)
{
	buffer_t *text = make_text(5000);
	struct ostream *output;
	struct istream *input;

	output = casbox_spool_create(t_strconcat(test_dir, "/missing/spool.",
						 NULL), 1000);
	/* what fits in memory is taken, the rest fails with the reason */
	ck_assert_int_eq(o_stream_send(output, text->data, 1000), 1000);
	ck_assert_int_eq(o_stream_send(output, text->data, 10), -1);
	ck_assert_int_eq(output->stream_errno, ENOENT);
	ck_assert_ptr_nonnull(strstr(o_stream_get_error(output),
				     "safe_mkstemp"));
	ck_assert_ptr_nonnull(strstr(o_stream_get_error(output),
				     "/missing/spool."));
	ck_assert_int_lt(o_stream_finish(output), 0);
	input = casbox_spool_finish(&output);
	ck_assert_ptr_null(output);
	i_stream_unref(&input);
	ck_assert_uint_eq(array_count(spool_files()), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("storage-spool");
	TCase *tc = tcase_create("spool");
	int failed;

	lib_init();
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_small_stays_in_memory);
	tcase_add_test(tc, test_big_goes_encrypted_to_file);
	tcase_add_test(tc, test_same_text_other_key);
	tcase_add_test(tc, test_reopen);
	tcase_add_test(tc, test_unusable_temp_dir);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
