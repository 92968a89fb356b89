/* Passwords on a command's input (key init and key password in password
   mode): read into sodium_malloc()ed memory, split into lines there. */

#include "lib.h"
#include "istream.h"
#include "doveadm-casbox.h"

#include <sodium.h>
#include <unistd.h>

static struct casbox_key_input *casbox_key_input_alloc(void)
{
	struct casbox_key_input *input;

	/* sodium_malloc() needs it (page size, canary) */
	if (sodium_init() < 0)
		i_fatal("sodium_init() failed");
	input = i_new(struct casbox_key_input, 1);
	/* one byte more than allowed, to notice longer input */
	input->data = sodium_malloc(CASBOX_KEY_INPUT_MAX + 1);
	if (input->data == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "sodium_malloc() failed: %m");
	return input;
}

static int casbox_key_input_check_size(struct casbox_key_input **input,
				       const char **error_r)
{
	if ((*input)->size <= CASBOX_KEY_INPUT_MAX)
		return 0;
	*error_r = t_strdup_printf("input is longer than %u bytes",
				   CASBOX_KEY_INPUT_MAX);
	casbox_key_input_free(input);
	return -1;
}

int casbox_key_input_read_fd(int fd, struct casbox_key_input **input_r,
			     const char **error_r)
{
	struct casbox_key_input *input = casbox_key_input_alloc();
	ssize_t ret;

	*input_r = NULL;
	while (input->size <= CASBOX_KEY_INPUT_MAX) {
		ret = read(fd, input->data + input->size,
			   CASBOX_KEY_INPUT_MAX + 1 - input->size);
		if (ret == 0)
			break;
		if (ret < 0) {
			if (errno == EINTR)
				continue;
			*error_r = t_strdup_printf("read(stdin) failed: %m");
			casbox_key_input_free(&input);
			return -1;
		}
		input->size += ret;
	}
	if (casbox_key_input_check_size(&input, error_r) < 0)
		return -1;
	*input_r = input;
	return 0;
}

int casbox_key_input_read_stream(struct istream *stream,
				 struct casbox_key_input **input_r,
				 const char **error_r)
{
	struct casbox_key_input *input = casbox_key_input_alloc();
	const unsigned char *data;
	size_t size, n;

	*input_r = NULL;
	while (input->size <= CASBOX_KEY_INPUT_MAX &&
	       i_stream_read_more(stream, &data, &size) > 0) {
		n = I_MIN(size, CASBOX_KEY_INPUT_MAX + 1 - input->size);
		memcpy(input->data + input->size, data, n);
		input->size += n;
		i_stream_skip(stream, n);
	}
	if (stream->stream_errno != 0) {
		*error_r = t_strdup_printf("read(%s) failed: %s",
					   i_stream_get_name(stream),
					   i_stream_get_error(stream));
		casbox_key_input_free(&input);
		return -1;
	}
	if (casbox_key_input_check_size(&input, error_r) < 0)
		return -1;
	*input_r = input;
	return 0;
}

void casbox_key_input_free(struct casbox_key_input **_input)
{
	struct casbox_key_input *input = *_input;

	if (input == NULL)
		return;
	*_input = NULL;
	sodium_memzero(input->data, CASBOX_KEY_INPUT_MAX + 1);
	sodium_free(input->data);
	i_free(input);
}

int casbox_key_input_lines(const struct casbox_key_input *input,
			   const char *const *names,
			   struct casbox_key_line *lines_r,
			   unsigned int count, const char **error_r)
{
	const unsigned char *p = input->data, *end = p + input->size, *nl;
	unsigned int i;

	memset(lines_r, 0, sizeof(*lines_r) * count);
	if (input->size == 0) {
		*error_r = "no input: expected the password on stdin";
		return -1;
	}
	for (i = 0; i < count; i++) {
		if (p == end) {
			*error_r = t_strdup_printf(
				"%u line(s) of input, expected %u (%s)",
				i, count, t_strarray_join(names, ", "));
			return -1;
		}
		nl = memchr(p, '\n', end - p);
		lines_r[i].data = p;
		lines_r[i].size = (nl != NULL ? nl : end) - p;
		if (lines_r[i].size > 0 && p[lines_r[i].size - 1] == '\r')
			lines_r[i].size--;
		p = nl != NULL ? nl + 1 : end;
		if (lines_r[i].size == 0) {
			*error_r = t_strdup_printf("line %u (%s) is empty",
						   i + 1, names[i]);
			return -1;
		}
		if (memchr(lines_r[i].data, '\0', lines_r[i].size) != NULL) {
			/* a passdb password is a C string: such a password
			   could never be given at login */
			*error_r = t_strdup_printf(
				"line %u (%s) contains a NUL byte",
				i + 1, names[i]);
			return -1;
		}
	}
	if (p != end) {
		*error_r = t_strdup_printf(
			"more than %u line(s) of input, expected %u (%s)",
			count, count, t_strarray_join(names, ", "));
		return -1;
	}
	return 0;
}

const char *casbox_key_line_str(struct casbox_key_input *input,
				const struct casbox_key_line *line)
{
	size_t end = line->data + line->size - input->data;

	/* the line's "\r", "\n" or, for a last line without one, the
	   spare byte after the input (data has CASBOX_KEY_INPUT_MAX + 1) */
	i_assert(line->data >= input->data && end <= input->size &&
		 end <= CASBOX_KEY_INPUT_MAX);
	input->data[end] = '\0';
	return (const char *)line->data;
}
