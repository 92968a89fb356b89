/* AECS body text: sanitizing, cleaning, forai. */

#include "lib.h"
#include "array.h"
#include "str.h"
#include "strfuncs.h"
#include "unichar.h"
#include "aecs-text.h"

/* Dovecot 2.3's str_begins() is 2.4's str_begins_with(): one spelling */
static inline bool aecs_begins(const char *str, const char *prefix)
{
	return strncmp(str, prefix, strlen(prefix)) == 0;
}

/* a signature separator "--" (without its space) counts only this
   close to the end */
#define AECS_SIG_BARE_MAX_LINES 15
/* how far below an underscore rule a list footer names itself */
#define AECS_FOOTER_LOOKAHEAD 3

const char *aecs_text_sanitize(const unsigned char *data, size_t size)
{
	buffer_t *valid = t_buffer_create(16);
	string_t *out;
	const unsigned char *p;
	size_t i, len;

	/* TRUE: data is valid as it is, and valid stays empty */
	if (uni_utf8_get_valid_data(data, size, valid)) {
		p = data;
		len = size;
	} else {
		p = valid->data;
		len = valid->used;
	}
	out = t_str_new(len + 1);
	for (i = 0; i < len; i++) {
		if (p[i] == '\0')
			continue;
		if (p[i] == '\r') {
			str_append_c(out, '\n');
			if (i + 1 < len && p[i + 1] == '\n')
				i++;
			continue;
		}
		str_append_c(out, p[i]);
	}
	return str_c(out);
}

static const char *aecs_rtrim(const char *line)
{
	size_t len = strlen(line);

	while (len > 0 && (line[len - 1] == ' ' || line[len - 1] == '\t'))
		len--;
	return t_strndup(line, len);
}

static bool aecs_line_blank(const char *line)
{
	return line[strspn(line, " \t")] == '\0';
}

static bool aecs_line_quoted(const char *line)
{
	return line[strspn(line, " \t")] == '>';
}

static bool aecs_ends_with(const char *s, const char *suffix)
{
	size_t len = strlen(s), slen = strlen(suffix);

	return len >= slen && strcmp(s + len - slen, suffix) == 0;
}

static bool aecs_line_attribution(const char *line)
{
	static const char *const ends[] = {
		"wrote:", "writes:", "schrieb:", "a écrit :", "a écrit:",
		"escribió:", "scrisse:", NULL,
	};
	unsigned int i;

	for (i = 0; ends[i] != NULL; i++) {
		if (aecs_ends_with(line, ends[i]))
			return TRUE;
	}
	return FALSE;
}

static bool aecs_line_original_message(const char *const *lines,
				       unsigned int i, unsigned int count)
{
	const char *line = lines[i] + strspn(lines[i], " \t-_");

	if (strncasecmp(line, "Original Message", 16) == 0)
		return TRUE;
	/* Outlook's reply header: "From: ..." directly followed by
	   "Sent: ..." */
	return aecs_begins(lines[i], "From: ") && i + 1 < count &&
		(aecs_begins(lines[i + 1], "Sent: ") ||
		 aecs_begins(lines[i + 1], "Date: "));
}

static bool aecs_line_footer(const char *const *lines, unsigned int i,
			     unsigned int count)
{
	size_t rule = strspn(lines[i], "_");
	unsigned int j;

	if (rule < 10 || lines[i][rule] != '\0')
		return FALSE;
	for (j = i + 1; j < count && j <= i + AECS_FOOTER_LOOKAHEAD; j++) {
		const char *lower = t_str_lcase(lines[j]);

		if (strstr(lower, "mailing list") != NULL ||
		    strstr(lower, "mailman/listinfo") != NULL)
			return TRUE;
	}
	return FALSE;
}

/* Index of the first line of the tail that is cut (signature, footer,
   an original message below a top-posted reply), or count. */
static unsigned int aecs_clean_tail(const char *const *lines,
				    unsigned int count)
{
	unsigned int i;

	for (i = 0; i < count; i++) {
		if (strcmp(lines[i], "-- ") == 0 ||
		    (strcmp(lines[i], "--") == 0 &&
		     count - i <= AECS_SIG_BARE_MAX_LINES))
			return i;
		if (aecs_line_footer(lines, i, count) ||
		    aecs_line_original_message(lines, i, count))
			return i;
	}
	return count;
}

/* The next non-blank line after i is quoted. */
static bool aecs_quote_follows(const char *const *lines, unsigned int i,
			       unsigned int count)
{
	for (i++; i < count; i++) {
		if (!aecs_line_blank(lines[i]))
			return aecs_line_quoted(lines[i]);
	}
	return FALSE;
}

static void aecs_clean_append(string_t *out, const char *line,
			      bool *blank_pending)
{
	if (aecs_line_blank(line)) {
		*blank_pending = str_len(out) > 0;
		return;
	}
	if (*blank_pending)
		str_append(out, "\n\n");
	else if (str_len(out) > 0)
		str_append_c(out, '\n');
	*blank_pending = FALSE;
	str_append(out, aecs_rtrim(line));
}

static const char *aecs_trim(const char *text)
{
	const char *start = text + strspn(text, " \t\n");
	size_t len = strlen(start);

	while (len > 0 && (start[len - 1] == ' ' || start[len - 1] == '\t' ||
			   start[len - 1] == '\n'))
		len--;
	return t_strndup(start, len);
}

const char *aecs_text_clean(const char *text, bool *fallback_r)
{
	const char *const *lines = t_strsplit(text, "\n");
	unsigned int i, count = str_array_length(lines);
	string_t *out = t_str_new(strlen(text) + 1);
	bool blank_pending = FALSE;

	*fallback_r = FALSE;
	count = aecs_clean_tail(lines, count);
	for (i = 0; i < count; i++) {
		const char *line = aecs_rtrim(lines[i]);

		if (aecs_line_quoted(line))
			continue;
		if (aecs_line_attribution(line) &&
		    aecs_quote_follows(lines, i, count))
			continue;
		/* "On Mon, 1 Jan 2001, Someone <a@b>\n wrote:" */
		if (aecs_begins(line, "On ") && i + 1 < count &&
		    aecs_line_attribution(aecs_rtrim(lines[i + 1])) &&
		    aecs_quote_follows(lines, i + 1, count)) {
			i++;
			continue;
		}
		aecs_clean_append(out, line, &blank_pending);
	}
	if (str_len(out) == 0) {
		const char *trimmed = aecs_trim(text);

		*fallback_r = *trimmed != '\0';
		return trimmed;
	}
	return str_c(out);
}

unsigned int aecs_text_char_count(const char *s)
{
	unsigned int n = 0;

	for (; *s != '\0'; s++) {
		if (((unsigned char)*s & 0xc0) != 0x80)
			n++;
	}
	return n;
}

static void aecs_forai_part(string_t *dest, const char *label,
			    const char *value)
{
	if (value == NULL || *value == '\0')
		return;
	if (str_len(dest) > 0)
		str_append(dest, " | ");
	str_append(dest, label);
	str_append(dest, value);
}

const char *aecs_forai(const char *from_name, const char *from_email,
		       const char *date, const char *subject,
		       const char *clean, unsigned int max_chars)
{
	string_t *str = t_str_new(256);
	const char *from = NULL, *p;
	unsigned int n = 0;

	if (max_chars == 0)
		return NULL;
	if (from_name != NULL && *from_name != '\0')
		from = t_strdup_printf("%s <%s>", from_name, from_email);
	else if (*from_email != '\0')
		from = from_email;
	aecs_forai_part(str, "From: ", from);
	aecs_forai_part(str, "Date: ", date);
	aecs_forai_part(str, "Subject: ", subject);
	if (*clean != '\0') {
		if (str_len(str) > 0)
			str_append(str, "\n\n");
		str_append(str, clean);
	}
	if (aecs_text_char_count(str_c(str)) <= max_chars)
		return str_c(str);
	/* keep max_chars - 1 code points, then the ellipsis */
	for (p = str_c(str); *p != '\0'; p++) {
		if (((unsigned char)*p & 0xc0) != 0x80 && ++n == max_chars)
			break;
	}
	str_truncate(str, p - str_c(str));
	str_append(str, "…");
	return str_c(str);
}
