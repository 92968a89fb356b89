/* Secret lines from stdin (see doveadm-casbox-stdin.h). */

#include "lib.h"
#include "doveadm-casbox-stdin.h"

#include <sodium.h>
#include <unistd.h>

/* One sodium_malloc()ed block: the pointer array, then the strings,
   each CASBOX_DOVEADM_SECRET_MAX_LEN + 1 bytes. The block size is kept
   in front of the array so free can wipe all of it. */
struct secret_block {
	size_t size;
	unsigned int count;
	const char *lines[];
};

static struct secret_block *
secret_block_from_lines(const char *const *lines)
{
	return (struct secret_block *)
		((char *)lines - offsetof(struct secret_block, lines));
}

void casbox_doveadm_secret_lines_free(const char *const **_lines)
{
	const char *const *lines = *_lines;
	struct secret_block *block;

	if (lines == NULL)
		return;
	*_lines = NULL;
	block = secret_block_from_lines(lines);
	sodium_memzero(block, block->size);
	sodium_free(block);
}

/* Read one line into buf (max + 1 bytes). Returns 1 ok, 0 end of input
   before any byte, -1 error. */
static int
secret_read_line(char *buf, size_t max, const char **error_r)
{
	size_t len = 0;
	ssize_t ret;
	char c;

	for (;;) {
		ret = read(STDIN_FILENO, &c, 1);
		if (ret < 0) {
			if (errno == EINTR)
				continue;
			*error_r = t_strdup_printf("read(stdin) failed: %m");
			return -1;
		}
		if (ret == 0) {
			if (len == 0)
				return 0;
			break;
		}
		if (c == '\n')
			break;
		if (c == '\0') {
			*error_r = "NUL byte in the line";
			return -1;
		}
		if (len == max) {
			*error_r = t_strdup_printf("line longer than %zu "
						   "bytes", max);
			return -1;
		}
		buf[len++] = c;
	}
	/* "\r\n" line ends too, as the key commands' reader
	   (doveadm-casbox-keyinput.c) takes them: the same password
	   file must give the same password */
	if (len > 0 && buf[len - 1] == '\r')
		len--;
	buf[len] = '\0';
	if (len == 0) {
		*error_r = "empty line";
		return -1;
	}
	return 1;
}

int casbox_doveadm_read_secret_lines(unsigned int count,
				     const char *const **lines_r,
				     const char **error_r)
{
	const size_t line_size = CASBOX_DOVEADM_SECRET_MAX_LEN + 1;
	struct secret_block *block;
	const char *error;
	unsigned int i;
	size_t size;
	char *str;
	int ret = 1;

	i_assert(count > 0 && count < 64);
	*lines_r = NULL;
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	size = sizeof(*block) + (count + 1) * sizeof(const char *) +
		count * line_size;
	/* sodium_malloc() puts the block against its guard page: only a
	   size that is a multiple of the alignment gives an aligned
	   struct */
	size = (size + 15) & ~(size_t)15;
	block = sodium_malloc(size);
	if (block == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "sodium_malloc() failed: %m");
	memset(block, 0, size);
	block->size = size;
	block->count = count;
	str = (char *)&block->lines[count + 1];
	for (i = 0; i < count && ret > 0; i++) {
		ret = secret_read_line(str + i * line_size,
				       CASBOX_DOVEADM_SECRET_MAX_LEN, &error);
		block->lines[i] = str + i * line_size;
	}
	if (ret <= 0) {
		*error_r = ret == 0 ?
			t_strdup_printf("no line %u on stdin (end of input)",
					i) :
			t_strdup_printf("stdin line %u: %s", i, error);
		sodium_memzero(block, size);
		sodium_free(block);
		return -1;
	}
	*lines_r = block->lines;
	return 0;
}
