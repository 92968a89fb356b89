#ifndef CASBOX_B64_H
#define CASBOX_B64_H

/* Base64 leaf bodies stored decoded (doc/casbox-storage.md, "Part
   transforms"). A body is stored decoded only when re-encoding the
   decoded bytes in its form reproduces it byte for byte: every line
   line_len characters (a multiple of 4) except a shorter last one, the
   same line end throughout, canonical padding only at the end, nothing
   else (no trailing spaces, no other characters). Reads re-encode with
   i_stream_create_casbox_b64_encoder(). */

struct istream;

/* part transform kinds in a message record (0 = stored as is) */
#define CASBOX_PART_TRANSFORM_NONE 0
#define CASBOX_PART_TRANSFORM_BASE64 1

/* longest line a form may have (RFC 5322's 998 rounded down to 4) */
#define CASBOX_B64_MAX_LINE_LEN 996

struct casbox_b64_form {
	/* characters per line before the line end, a multiple of 4 */
	uint32_t line_len;
	/* lines end in CRLF, else LF */
	bool crlf;
	/* the last line ends with the line end too */
	bool final_newline;
};

/* The encoded size of decoded_size bytes in form. */
static inline uint64_t
casbox_b64_encoded_size(const struct casbox_b64_form *form,
			uint64_t decoded_size)
{
	uint64_t per_line = form->line_len / 4 * 3;
	uint64_t eol = form->crlf ? 2 : 1, full, rem, size;

	if (decoded_size == 0)
		return 0;
	full = decoded_size / per_line;
	rem = decoded_size % per_line;
	size = full * (form->line_len + eol);
	if (rem > 0)
		size += (rem + 2) / 3 * 4 + eol;
	if (!form->final_newline)
		size -= eol;
	return size;
}

/* Whether form is one a record may carry. */
static inline bool casbox_b64_form_valid(const struct casbox_b64_form *form)
{
	return form->line_len >= 4 && form->line_len % 4 == 0 &&
		form->line_len <= CASBOX_B64_MAX_LINE_LEN;
}

/* Whether the size bytes of input (seekable, read from its current
   offset... from offset 0) are base64 in a form that re-encodes them
   exactly: 1 yes (form_r, decoded_size_r set), 0 no (store as is),
   -1 read error (error_r). Reads the body twice (decode + re-encode +
   compare); the bytes to store are then i_stream_create_casbox_b64_decoder()
   of the same input. */
int casbox_b64_check(struct istream *input, uoff_t size,
		     struct casbox_b64_form *form_r, uoff_t *decoded_size_r,
		     const char **error_r);

/* Decode base64 (RFC 4648 alphabet, '=' padding only in the last group,
   CR and LF anywhere and ignored; anything else fails the stream with
   EINVAL). A table per byte, where Dovecot's decoder appends byte by
   byte: the save decodes a body three times (check, blob id, blob).
   Lenient about line structure on purpose: casbox_b64_check() accepts a
   body only if re-encoding what this decoded reproduces it exactly, and
   base64 encoding is injective, so any decoder that passes the check
   decoded it right; the save decodes with this one throughout. A
   backwards seek decodes again from the start. */
struct istream *i_stream_create_casbox_b64_decoder(struct istream *input);

/* Encode the decoded_size bytes of input (seekable) in form: a seekable
   stream of exactly casbox_b64_encoded_size() bytes. A shorter input
   fails the stream with EPIPE. */
struct istream *
i_stream_create_casbox_b64_encoder(struct istream *input,
				   const struct casbox_b64_form *form,
				   uoff_t decoded_size);

#endif
