/* casbox: is a leaf body base64 that re-encodes exactly (casbox-b64.h)?
   The form is read off the body (first line's length and end, the last
   byte), then the decoded bytes are re-encoded in that form and
   compared with the body: nothing is trusted that was not reproduced. */

#include "lib.h"
#include "istream.h"
#include "casbox-b64.h"

static bool b64_char(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		(c >= '0' && c <= '9') || c == '+' || c == '/' || c == '=';
}

static int b64_read_error(struct istream *input, const char **error_r)
{
	*error_r = t_strdup_printf("read(%s) failed: %s",
				   i_stream_get_name(input),
				   i_stream_get_error(input));
	return -1;
}

/* The form the first line and the last byte suggest: 1, 0 none, -1 error */
static int
b64_guess_form(struct istream *input, uoff_t size,
	       struct casbox_b64_form *form_r, const char **error_r)
{
	const unsigned char *data;
	size_t n, i, want;
	int ret;

	i_zero(form_r);
	i_stream_seek(input, 0);
	want = I_MIN(size, CASBOX_B64_MAX_LINE_LEN + 2);
	ret = i_stream_read_bytes(input, &data, &n, want);
	if (ret < 0 && input->stream_errno != 0)
		return b64_read_error(input, error_r);
	if (n < want)
		return 0;
	for (i = 0; i < want && b64_char(data[i]); i++) ;
	if (i == size) {
		/* one line without a line end */
		form_r->line_len = i;
	} else if (i < want && data[i] == '\n') {
		form_r->line_len = i;
	} else if (i + 1 < want && data[i] == '\r' && data[i+1] == '\n') {
		form_r->line_len = i;
		form_r->crlf = TRUE;
	} else {
		return 0;
	}
	if (!casbox_b64_form_valid(form_r))
		return 0;
	i_stream_seek(input, size - 1);
	ret = i_stream_read_bytes(input, &data, &n, 1);
	if (ret < 0 && input->stream_errno != 0)
		return b64_read_error(input, error_r);
	if (n < 1)
		return 0;
	form_r->final_newline = data[0] == '\n';
	return 1;
}

/* The decoded size the form gives size encoded bytes, from the length
   and the padding of the last group. 0 = no such shape. */
static int
b64_decoded_size(struct istream *input, uoff_t size,
		 const struct casbox_b64_form *form, uoff_t *dsize_r,
		 const char **error_r)
{
	uoff_t eol = form->crlf ? 2 : 1, ll = form->line_len + eol;
	uoff_t total = size + (form->final_newline ? 0 : eol);
	uoff_t full = total / ll, rem = total % ll, chars, last;
	const unsigned char *data;
	size_t n;
	unsigned int pad = 0;
	int ret;

	if (rem == 0)
		chars = full * form->line_len;
	else if (rem >= eol + 4 && (rem - eol) % 4 == 0)
		chars = full * form->line_len + (rem - eol);
	else
		return 0;
	if (chars == 0)
		return 0;
	/* the last two characters before the final line end */
	last = size - (form->final_newline ? eol : 0) - 2;
	i_stream_seek(input, last);
	ret = i_stream_read_bytes(input, &data, &n, 2);
	if (ret < 0 && input->stream_errno != 0)
		return b64_read_error(input, error_r);
	if (n < 2)
		return 0;
	if (data[1] == '=')
		pad = data[0] == '=' ? 2 : 1;
	*dsize_r = chars / 4 * 3 - pad;
	return *dsize_r > 0 ? 1 : 0;
}

int casbox_b64_check(struct istream *input, uoff_t size,
		     struct casbox_b64_form *form_r, uoff_t *decoded_size_r,
		     const char **error_r)
{
	struct istream *orig, *range, *dec, *enc;
	const unsigned char *d1, *d2;
	size_t n1, n2, n;
	uoff_t dsize;
	bool same = TRUE;
	int ret;

	if (size < 4)
		return 0;
	if ((ret = b64_guess_form(input, size, form_r, error_r)) <= 0 ||
	    (ret = b64_decoded_size(input, size, form_r, &dsize,
				    error_r)) <= 0)
		return ret;
	if (casbox_b64_encoded_size(form_r, dsize) != size)
		return 0;

	/* each reader its own range of input: the base64 decoder
	   expects a parent nobody else moves */
	orig = i_stream_create_range(input, 0, size);
	range = i_stream_create_range(input, 0, size);
	dec = i_stream_create_casbox_b64_decoder(range);
	i_stream_unref(&range);
	enc = i_stream_create_casbox_b64_encoder(dec, form_r, dsize);
	while (same) {
		ret = i_stream_read_more(enc, &d2, &n2);
		if (ret <= 0)
			break;
		if (i_stream_read_bytes(orig, &d1, &n1, 1) <= 0) {
			same = FALSE;
			break;
		}
		n = I_MIN(n1, n2);
		if (memcmp(d1, d2, n) != 0)
			same = FALSE;
		i_stream_skip(enc, n);
		i_stream_skip(orig, n);
	}
	/* a decoder error (a character outside the alphabet) or a decoded
	   stream of another length is a body stored as is */
	if (same && (enc->stream_errno != 0 || enc->v_offset != size))
		same = FALSE;
	if (same) {
		/* nothing may follow the decoded bytes (the encoder read
		   them all: no seek, which could restart the decoder) */
		if (dec->v_offset != dsize ||
		    i_stream_read_more(dec, &d1, &n1) != -1 ||
		    dec->stream_errno != 0)
			same = FALSE;
	}
	i_stream_unref(&enc);
	i_stream_unref(&dec);
	i_stream_unref(&orig);
	if (input->stream_errno != 0)
		return b64_read_error(input, error_r);
	if (!same)
		return 0;
	*decoded_size_r = dsize;
	return 1;
}
