/* AECS normalization: keys, identifiers, threads, dates, JSON. */

#include "lib.h"
#include "str.h"
#include "hex-binary.h"
#include "sha2.h"
#include "aecs-norm.h"

#include <time.h>

const char *aecs_key(const char *id)
{
	unsigned char digest[SHA256_RESULTLEN];

	sha256_get_digest(id, strlen(id), digest);
	return binary_to_hex(digest, sizeof(digest));
}

const char *aecs_synthetic_message_id(const unsigned char *raw,
				      size_t size)
{
	unsigned char digest[SHA256_RESULTLEN];

	sha256_get_digest(raw, size, digest);
	return t_strconcat("aecs-", binary_to_hex(digest, 16),
			   AECS_SYNTHETIC_SUFFIX, NULL);
}

const char *aecs_thread_root(const char *const *references,
			     const char *in_reply_to,
			     const char *message_id)
{
	if (references != NULL && references[0] != NULL)
		return references[0];
	if (in_reply_to != NULL && *in_reply_to != '\0')
		return in_reply_to;
	return message_id;
}

int64_t aecs_ts_ms(time_t t)
{
	return (int64_t)t * 1000;
}

static const char *aecs_tm_str(const struct tm *tm)
{
	return t_strdup_printf("%04d-%02d-%02dT%02d:%02d:%02d",
			       tm->tm_year + 1900, tm->tm_mon + 1,
			       tm->tm_mday, tm->tm_hour, tm->tm_min,
			       tm->tm_sec);
}

const char *aecs_date_rfc3339(time_t t, int tz_offset_min)
{
	time_t local = t + (time_t)tz_offset_min * 60;
	int off = tz_offset_min < 0 ? -tz_offset_min : tz_offset_min;
	struct tm tm;

	if (gmtime_r(&local, &tm) == NULL)
		i_zero(&tm);
	if (tz_offset_min == 0)
		return t_strconcat(aecs_tm_str(&tm), "Z", NULL);
	return t_strdup_printf("%s%c%02d:%02d", aecs_tm_str(&tm),
			       tz_offset_min < 0 ? '-' : '+',
			       off / 60, off % 60);
}

const char *aecs_processed_at(const struct timeval *tv)
{
	struct tm tm;
	time_t t = tv->tv_sec;

	if (gmtime_r(&t, &tm) == NULL)
		i_zero(&tm);
	return t_strdup_printf("%s.%03dZ", aecs_tm_str(&tm),
			       (int)(tv->tv_usec / 1000));
}

void aecs_json_append_str(string_t *dest, const char *s)
{
	str_append_c(dest, '"');
	for (; *s != '\0'; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\') {
			str_append_c(dest, '\\');
			str_append_c(dest, c);
		} else if (c == '\n') {
			str_append(dest, "\\n");
		} else if (c == '\t') {
			str_append(dest, "\\t");
		} else if (c == '\r') {
			str_append(dest, "\\r");
		} else if (c < 0x20 || c == 0x7f) {
			str_printfa(dest, "\\u%04x", c);
		} else {
			str_append_c(dest, c);
		}
	}
	str_append_c(dest, '"');
}

const char *aecs_lower(const char *s)
{
	return t_str_lcase(s);
}
