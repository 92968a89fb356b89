/* AECS normalization: keys, identifiers, threads, dates, JSON. */

#include "lib.h"
#include "array.h"
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

static const char *aecs_msgid_clean(const unsigned char *p, size_t len)
{
	string_t *str = t_str_new(len + 1);
	size_t i;

	for (i = 0; i < len; i++) {
		if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r' &&
		    p[i] != '\n' && p[i] != '\0')
			str_append_c(str, p[i]);
	}
	return str_c(str);
}

const char *const *aecs_msgids_parse(const unsigned char *value,
				     size_t size, bool require_at,
				     unsigned int max_ids)
{
	ARRAY_TYPE(const_string) ids;
	const unsigned char *p = value, *end = value + size, *lt, *gt;
	const char *id;
	bool bracketed = FALSE;

	t_array_init(&ids, 4);
	while (array_count(&ids) < max_ids &&
	       (lt = memchr(p, '<', end - p)) != NULL) {
		gt = memchr(lt + 1, '>', end - (lt + 1));
		if (gt == NULL)
			break;
		bracketed = TRUE;
		id = aecs_msgid_clean(lt + 1, gt - (lt + 1));
		if (*id != '\0' && (!require_at || strchr(id, '@') != NULL))
			array_push_back(&ids, &id);
		p = gt + 1;
	}
	if (!bracketed && !require_at && max_ids > 0) {
		id = aecs_msgid_clean(value, size);
		if (*id != '\0')
			array_push_back(&ids, &id);
	}
	array_append_zero(&ids);
	return array_front(&ids);
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
