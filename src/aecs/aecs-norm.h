#ifndef AECS_NORM_H
#define AECS_NORM_H

/* AECS normalization: keys, identifiers, threads, dates, JSON. Pure
   (liblib only); the field mapping is in doc/aecs.md. */

#include <sys/time.h>

/* Version written to aecs_messages.spec_version. Raise it when the
   normalization changes, so stale_spec_version finds the old rows. */
#define AECS_SPEC_VERSION "casbox-aecs-1"

#define AECS_KEY_HEX_LEN 64

/* Lowercase hex SHA-256 of id (its bytes, no terminating NUL): what
   message_key and thread_key are. Allocated from the data stack. */
const char *aecs_key(const char *id);

/* The synthetic Message-ID of a message without one (or with one that
   does not parse), stable for the same bytes: "aecs-<first 32 hex
   digits of SHA-256 of the raw message>@synthetic.invalid". */
const char *aecs_synthetic_message_id(const unsigned char *raw,
				      size_t size);
#define AECS_SYNTHETIC_SUFFIX "@synthetic.invalid"

/* The msg-ids of a Message-ID, In-Reply-To or References value: the
   text of each "<...>" with whitespace (folding) removed, in order,
   empty ones left out, and with require_at those without "@" too
   (bogus "<yes>" references). At most max_ids. A Message-ID value
   without any "<...>" gives itself, whitespace removed, when that is
   not empty (and require_at is FALSE). NULL-terminated, data stack;
   not valid UTF-8 checked. */
const char *const *aecs_msgids_parse(const unsigned char *value,
				     size_t size, bool require_at,
				     unsigned int max_ids);

/* Thread id of a message from its own headers: the first (oldest)
   References id, else the first In-Reply-To id, else its own
   Message-ID. references is NULL-terminated (may be NULL), ids without
   angle brackets. */
const char *aecs_thread_root(const char *const *references,
			     const char *in_reply_to,
			     const char *message_id);

/* Milliseconds since the epoch (the unit of ts). */
int64_t aecs_ts_ms(time_t t);
/* RFC 3339 in the sender's zone, "2002-08-22T18:41:03+01:00" (tz in
   minutes east of UTC): the date column. */
const char *aecs_date_rfc3339(time_t t, int tz_offset_min);
/* RFC 3339 UTC with milliseconds, "2026-12-01T21:05:00.123Z":
   processed_at. */
const char *aecs_processed_at(const struct timeval *tv);

/* Append s as a JSON string (quotes, escapes; s is valid UTF-8). */
void aecs_json_append_str(string_t *dest, const char *s);

/* s lowercased (ASCII; e-mail addresses), data stack. */
const char *aecs_lower(const char *s);

#endif
