/* The progress line of long doveadm casbox runs: nothing at all when
   stderr is not a terminal (cron, scripts, the e2e tests' pipes); on a
   terminal one line rewritten in place and ended with a newline. */

#include "lib.h"
#include "casbox-store-progress.h"

#include <check.h>
#include "check-run.h"
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct casbox_census_pack packs[] = {
	{ .pack_id = 1, .size = 1000000 },
	{ .pack_id = 2, .size = 3000000 },
};

/* Every progress call a command makes, start to end. */
static void run_everything(void)
{
	struct casbox_admin_scan_progress scan;

	casbox_admin_progress_line(TRUE, "x: %u", 1);
	casbox_admin_progress_line(FALSE, "x: %u", 2);
	casbox_admin_progress("gc: copying live blobs", 3, 3);
	casbox_admin_progress_bytes(TRUE, "scrub", "blobs decoded: 6/9",
				    7800000, 15600000);
	casbox_admin_scan_progress_init(&scan, "rebuild --from-packs",
					packs, N_ELEMENTS(packs));
	casbox_admin_scan_progress_frame(&scan, 1, 0, 500000);
	casbox_admin_scan_progress_frame(&scan, 2, 0, 3000000);
	casbox_admin_census_progress((void *)"gc", 7, 10, 10);
	casbox_admin_progress_end();
	casbox_admin_progress_end();
}

/* What the other end of fd got, until nothing more comes. */
static char *drain(int fd, size_t *len_r)
{
	static char buf[8192];
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	size_t len = 0;
	ssize_t n;

	while (len < sizeof(buf) - 1 && poll(&pfd, 1, 1000) == 1 &&
	       (pfd.revents & POLLIN) != 0) {
		n = read(fd, buf + len, sizeof(buf) - 1 - len);
		if (n <= 0)
			break;
		len += n;
	}
	buf[len] = '\0';
	*len_r = len;
	return buf;
}

START_TEST(test_quiet_on_a_pipe)
{
	int fds[2];
	size_t len;
	char *out;

	ck_assert_int_eq(pipe(fds), 0);
	ck_assert_int_eq(dup2(fds[1], STDERR_FILENO), STDERR_FILENO);
	i_close_fd(&fds[1]);
	run_everything();
	fflush(stderr);
	/* the write end closed: read() ends at EOF */
	ck_assert_int_eq(close(STDERR_FILENO), 0);
	out = drain(fds[0], &len);
	ck_assert_msg(len == 0, "printed on a pipe: \"%s\"", out);
	i_close_fd(&fds[0]);
}
END_TEST

START_TEST(test_quiet_on_a_file)
{
	char path[] = "/tmp/check-doveadm-progress.XXXXXX";
	int fd = mkstemp(path);
	struct stat st;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(dup2(fd, STDERR_FILENO), STDERR_FILENO);
	run_everything();
	fflush(stderr);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(st.st_size, 0);
	i_close_fd(&fd);
}
END_TEST

START_TEST(test_lines_on_a_terminal)
{
	struct termios raw;
	int master, slave;
	size_t len;
	char *out;

	ck_assert_int_eq(openpty(&master, &slave, NULL, NULL, NULL), 0);
	/* bytes as written: no \n -> \r\n */
	ck_assert_int_eq(tcgetattr(slave, &raw), 0);
	cfmakeraw(&raw);
	ck_assert_int_eq(tcsetattr(slave, TCSANOW, &raw), 0);
	ck_assert_int_eq(dup2(slave, STDERR_FILENO), STDERR_FILENO);
	i_close_fd(&slave);
	run_everything();
	fflush(stderr);
	out = drain(master, &len);

	/* forced updates are always shown, each rewriting the line */
	ck_assert_ptr_eq(strstr(out, "\rx: 1\033[K"), out);
	ck_assert_ptr_nonnull(strstr(out, "\rgc: copying live blobs: 3/3\033[K"));
	ck_assert_ptr_nonnull(strstr(out,
		"\rscrub: blobs decoded: 6/9, 7.8 MB of 15.6 MB (50%)\033[K"));
	/* the scan's last frame ends pack 2: all 4.0 MB done */
	ck_assert_ptr_nonnull(strstr(out, "\rrebuild --from-packs: pack "
		"frames: 2, 4.0 MB of 4.0 MB (100%)\033[K"));
	ck_assert_ptr_nonnull(strstr(out,
		"\rgc: pack frames: 7, 0.0 MB of 0.0 MB (100%)\033[K"));
	/* one newline at the end, however often the end is called */
	ck_assert_int_gt(len, 0);
	ck_assert_int_eq(out[len - 1], '\n');
	ck_assert_ptr_eq(strchr(out, '\n'), out + len - 1);
	i_close_fd(&master);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("doveadm-progress");
	TCase *tc = tcase_create("progress");
	int failed;

	lib_init();
	tcase_add_test(tc, test_quiet_on_a_pipe);
	tcase_add_test(tc, test_quiet_on_a_file);
	tcase_add_test(tc, test_lines_on_a_terminal);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
