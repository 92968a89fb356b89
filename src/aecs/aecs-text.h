#ifndef AECS_TEXT_H
#define AECS_TEXT_H

/* AECS body text: sanitizing, cleaning (quotes, attribution lines,
   signatures, list footers) and the bounded forai rendering. Pure
   (liblib only); the rules are in doc/aecs.md, "clean". */

/* forai's bound when --forai-max-chars is not given (characters, i.e.
   Unicode code points). */
#define AECS_FORAI_DEFAULT_MAX_CHARS 4000

/* data as valid UTF-8 text: invalid sequences become U+FFFD, NUL bytes
   are dropped, CRLF and lone CR become LF. Data stack. */
const char *aecs_text_sanitize(const unsigned char *data, size_t size);

/* text (sanitized) without quoted lines ("> ..."), the attribution line
   that introduces them ("On ... wrote:"), everything from an
   "-----Original Message-----" or Outlook "From:/Sent:" block, from a
   signature separator ("-- ") and from a mailing-list footer on;
   whitespace-only runs collapsed, trimmed. When that leaves nothing but
   text has something, returns text trimmed and sets *fallback_r; else
   *fallback_r = FALSE. Data stack. */
const char *aecs_text_clean(const char *text, bool *fallback_r);

/* "From: name <email> | Date: date | Subject: subject" (parts that are
   NULL or "" left out) then a blank line then clean, at most max_chars
   code points: a longer one is cut at a code point and ends in "…"
   (counted). max_chars 0: NULL. Data stack. */
const char *aecs_forai(const char *from_name, const char *from_email,
		       const char *date, const char *subject,
		       const char *clean, unsigned int max_chars);

/* Number of code points in UTF-8 s. */
unsigned int aecs_text_char_count(const char *s);

#endif
