#ifndef CHECK_FIXTURE_H
#define CHECK_FIXTURE_H

/* Committed fixtures (tests/fixtures/) for Check programs: the source
   tree is CASBOX_TOP_SRCDIR when set (make check exports it), else the
   program's compiled-in CASBOX_SRCDIR. Include lib.h and check.h first. */

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

/* tests/fixtures/<dir>/<name> of the source tree */
static inline const char *check_fixture_path(const char *dir, const char *name)
{
	const char *top = getenv("CASBOX_TOP_SRCDIR");

	return t_strdup_printf("%s/tests/fixtures/%s/%s",
			       top == NULL ? CASBOX_SRCDIR : top, dir, name);
}

/* Copy tests/fixtures/<dir>/<name> to <dest_dir>/<name> (mode 0600). */
static inline void check_fixture_copy(const char *dir, const char *name,
				      const char *dest_dir)
{
	const char *src = check_fixture_path(dir, name);
	unsigned char tmp[4096];
	ssize_t n;
	int in, out;

	in = open(src, O_RDONLY);
	ck_assert_msg(in >= 0, "open(%s) failed", src);
	out = open(t_strdup_printf("%s/%s", dest_dir, name),
		   O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(out, 0);
	while ((n = read(in, tmp, sizeof(tmp))) > 0)
		ck_assert_int_eq(write(out, tmp, n), n);
	ck_assert_int_eq(n, 0);
	i_close_fd(&in);
	i_close_fd(&out);
}

#endif
