#ifndef CASIDX_DTGRAM_H
#define CASIDX_DTGRAM_H

/* Character bigrams of text in Dovecot's own search form ("dtgrams",
   doc/casidx-format.md "Segment version 3", doc/search-semantics.md).

   Dovecot without FTS matches a value against the text after both went
   through uni_utf8_to_decomposed_titlecase(), which maps every code
   point on its own (titlecase, then decomposition) and every invalid
   byte to U+FFFD. So if the value's image occurs in the text's image,
   every pair of neighbouring code points of the value's image occurs,
   as neighbours, in the text's image. A dtgram is such a pair, kept
   only when it qualifies (casidx_dtgram_pair_ok()):
     - at least one of the two is not ASCII (pure ASCII text is left to
       the word index),
     - neither is ASCII whitespace or control (0x00-0x20, 0x7f) nor
       U+FFFD: the FTS build hands header values over with NULs as
       spaces and folding whitespace of its own, so only pairs that do
       not touch whitespace are the same on both sides,
     - not both CJK letters (Han, kana, Hangul jamo): CJK runs already
       have bigram terms of their own; a value of only CJK keeps that
       path.
   Both index and query apply the same rule, so a value's qualifying
   dtgrams are all indexed wherever the value occurs. Include lib.h
   first. */

#include "unichar.h"

/* Longest dtgram: two code points of 4 UTF-8 bytes. */
#define CASIDX_DTGRAM_MAX_BYTES 8

struct casidx_dtgram;

/* gram is the UTF-8 of the two code points, not NUL-terminated, valid
   only during the call; pos is the index of its first code point in
   the run's image (counted since the reset; an invalid byte counts as
   one), so the pairs of one stretch of the image chain up: the pair
   at pos + 1 starts with the second code point of this one. */
typedef void casidx_dtgram_callback_t(const unsigned char *gram,
				      size_t gram_len, uint32_t pos,
				      void *context);

struct casidx_dtgram *casidx_dtgram_create(void);
void casidx_dtgram_destroy(struct casidx_dtgram **dt);
/* Start a new run of text: no dtgram spans a reset. */
void casidx_dtgram_reset(struct casidx_dtgram *dt);
/* Feed UTF-8 bytes of the current run; data may end inside a
   character (kept for the next call). An invalid byte breaks the run
   like U+FFFD. Every qualifying dtgram is emitted, once per
   occurrence. */
void casidx_dtgram_feed(struct casidx_dtgram *dt, const void *data,
			size_t size, casidx_dtgram_callback_t *callback,
			void *context);

/* TRUE if the neighbours a, b (code points of the decomposed titlecase
   image) make a dtgram that is indexed (rules above). */
bool casidx_dtgram_pair_ok(unichar_t a, unichar_t b);

struct casidx_dtgram_value {
	/* distinct qualifying dtgrams of the value (pool strings,
	   NUL-terminated) */
	ARRAY_TYPE(const_string) grams;
	/* every qualifying pair in order, repeats included: seq[i] starts
	   at code point i if all_pairs */
	ARRAY_TYPE(const_string) seq;
	/* code points of the value's image */
	unsigned int image_len;
	/* every pair of neighbours of the image qualifies */
	bool all_pairs;
	/* the value is valid UTF-8 */
	bool valid;
};

/* The dtgrams of a search value, in pool. A value that is not valid
   UTF-8 gets valid = FALSE and no grams. */
void casidx_dtgram_value(const char *value, pool_t pool,
			 struct casidx_dtgram_value *value_r);

/* TRUE for a valid UTF-8 value with non-ASCII characters whose image
   is all ASCII ("ı" -> "I", "n²" -> "N2", "ﬁ" -> "fi"): it has no
   dtgrams, and it may match ASCII text anywhere, also inside encoded
   runs the index did not keep. */
bool casidx_dtgram_image_is_ascii(const char *value);

#endif
