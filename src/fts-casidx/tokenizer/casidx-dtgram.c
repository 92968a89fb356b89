/* Dtgrams: code point bigrams of Dovecot's decomposed titlecase image
   (casidx-dtgram.h, doc/search-semantics.md). */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "str.h"
#include "unichar.h"
#include "casidx-dtgram.h"

/* no code point: the start of a run, or after a break */
#define DT_NONE ((unichar_t)-1)
/* uni_utf8_get_char_n() reads the old 5- and 6-byte forms too */
#define UTF8_MAX_CHAR 6

struct casidx_dtgram {
	unichar_t prev;
	/* index of the next code point of the image since the reset */
	uint32_t pos;
	/* the start of a character cut by the end of the last feed */
	unsigned char carry[UTF8_MAX_CHAR];
	unsigned int carry_len;
	buffer_t *image;	/* scratch: one character's image */
	buffer_t *gram;
};

static bool dt_cp_excluded(unichar_t c)
{
	return c <= 0x20 || c == 0x7f || c == UNICODE_REPLACEMENT_CHAR;
}

static bool dt_cp_cjk(unichar_t c)
{
	return (c >= 0x1100 && c <= 0x11ff) ||	/* Hangul jamo */
		(c >= 0x3040 && c <= 0x30ff) ||	/* kana */
		(c >= 0x3130 && c <= 0x318f) ||	/* compatibility jamo */
		(c >= 0x31f0 && c <= 0x31ff) ||	/* katakana extension */
		(c >= 0x3400 && c <= 0x4dbf) ||	/* Han extension A */
		(c >= 0x4e00 && c <= 0x9fff) ||	/* Han */
		(c >= 0xa960 && c <= 0xa97f) ||	/* jamo extended A */
		(c >= 0xac00 && c <= 0xd7ff) ||	/* Hangul, jamo ext. B */
		(c >= 0xf900 && c <= 0xfaff) ||	/* compatibility Han */
		(c >= 0x20000 && c <= 0x3ffff);	/* Han planes 2, 3 */
}

bool casidx_dtgram_pair_ok(unichar_t a, unichar_t b)
{
	if (a < 0x80 && b < 0x80)
		return FALSE;
	if (dt_cp_excluded(a) || dt_cp_excluded(b))
		return FALSE;
	return !(dt_cp_cjk(a) && dt_cp_cjk(b));
}

struct casidx_dtgram *casidx_dtgram_create(void)
{
	struct casidx_dtgram *dt = i_new(struct casidx_dtgram, 1);

	dt->prev = DT_NONE;
	dt->image = buffer_create_dynamic(default_pool, 32);
	dt->gram = buffer_create_dynamic(default_pool,
					 CASIDX_DTGRAM_MAX_BYTES);
	return dt;
}

void casidx_dtgram_destroy(struct casidx_dtgram **_dt)
{
	struct casidx_dtgram *dt = *_dt;

	if (dt == NULL)
		return;
	*_dt = NULL;
	buffer_free(&dt->image);
	buffer_free(&dt->gram);
	i_free(dt);
}

void casidx_dtgram_reset(struct casidx_dtgram *dt)
{
	dt->prev = DT_NONE;
	dt->pos = 0;
	dt->carry_len = 0;
}

static void dt_next(struct casidx_dtgram *dt, unichar_t c,
		    casidx_dtgram_callback_t *callback, void *context)
{
	if (dt->prev != DT_NONE && casidx_dtgram_pair_ok(dt->prev, c)) {
		buffer_set_used_size(dt->gram, 0);
		uni_ucs4_to_utf8_c(dt->prev, dt->gram);
		uni_ucs4_to_utf8_c(c, dt->gram);
		callback(dt->gram->data, dt->gram->used, dt->pos - 1, context);
	}
	dt->prev = c;
	if (dt->pos < (uint32_t)-1)
		dt->pos++;
}

/* One valid character of the text: its image's code points. */
static void dt_char(struct casidx_dtgram *dt, const unsigned char *p,
		    unsigned int len, casidx_dtgram_callback_t *callback,
		    void *context)
{
	const unsigned char *img;
	size_t pos, size;
	unichar_t c;
	int n;

	if (len == 1) {
		/* ASCII: titlecase only, nothing decomposes */
		dt_next(dt, uni_ucs4_to_titlecase(p[0]), callback, context);
		return;
	}
	buffer_set_used_size(dt->image, 0);
	(void)uni_utf8_to_decomposed_titlecase(p, len, dt->image);
	img = dt->image->data;
	size = dt->image->used;
	for (pos = 0; pos < size; pos += n) {
		n = uni_utf8_get_char_n(img + pos, size - pos, &c);
		i_assert(n > 0);
		dt_next(dt, c, callback, context);
	}
}

/* Process data; returns how many bytes at its end are an incomplete
   character (left for the next call). */
static size_t dt_process(struct casidx_dtgram *dt, const unsigned char *data,
			 size_t size, casidx_dtgram_callback_t *callback,
			 void *context)
{
	size_t pos = 0;
	unichar_t c;
	int n;

	while (pos < size) {
		if (data[pos] < 0x80 && dt->prev < 0x80) {
			/* ASCII after ASCII: never a dtgram */
			dt->prev = uni_ucs4_to_titlecase(data[pos++]);
			if (dt->pos < (uint32_t)-1)
				dt->pos++;
			continue;
		}
		n = uni_utf8_get_char_n(data + pos, size - pos, &c);
		/* 0 is also a NUL after a lead byte: invalid, unless the
		   data ends inside the character */
		if (n == 0 && size - pos < uni_utf8_char_bytes(data[pos]))
			return size - pos;
		if (n <= 0) {
			/* the search sees U+FFFD here: never in a dtgram */
			dt->prev = DT_NONE;
			if (dt->pos < (uint32_t)-1)
				dt->pos++;
			pos++;
			continue;
		}
		dt_char(dt, data + pos, n, callback, context);
		pos += n;
	}
	return 0;
}

/* The character cut by the end of the last feed, completed from data;
   returns the bytes of data it took (at least one if size > 0). What
   is still incomplete then stays in carry. */
static size_t dt_finish_carry(struct casidx_dtgram *dt,
			      const unsigned char *data, size_t size,
			      casidx_dtgram_callback_t *callback, void *context)
{
	unsigned char joined[UTF8_MAX_CHAR];
	unsigned int first = uni_utf8_char_bytes(dt->carry[0]);
	size_t take, left, carried = dt->carry_len;

	i_assert(carried < first && first <= UTF8_MAX_CHAR);
	take = I_MIN(size, first - carried);
	memcpy(joined, dt->carry, carried);
	memcpy(joined + carried, data, take);
	if (carried + take < first) {
		/* still incomplete */
		memcpy(dt->carry, joined, carried + take);
		dt->carry_len = carried + take;
		return take;
	}
	/* an invalid sequence is a break and its bytes are taken one by
	   one; an incomplete one at the end is carried again */
	left = dt_process(dt, joined, first, callback, context);
	i_assert(left < first);
	memcpy(dt->carry, joined + first - left, left);
	dt->carry_len = left;
	return take;
}

void casidx_dtgram_feed(struct casidx_dtgram *dt, const void *_data,
			size_t size, casidx_dtgram_callback_t *callback,
			void *context)
{
	const unsigned char *data = _data;
	size_t take, left;

	while (dt->carry_len > 0 && size > 0) {
		take = dt_finish_carry(dt, data, size, callback, context);
		data += take;
		size -= take;
	}
	if (dt->carry_len > 0)
		return;
	left = dt_process(dt, data, size, callback, context);
	i_assert(left < UTF8_MAX_CHAR);
	memcpy(dt->carry, data + size - left, left);
	dt->carry_len = left;
}

static void value_gram_cb(const unsigned char *gram, size_t gram_len,
			  uint32_t pos ATTR_UNUSED, void *context)
{
	struct casidx_dtgram_value *value = context;
	const char *const *g, *s = NULL;
	pool_t pool = array_get_pool(&value->grams);

	array_foreach(&value->grams, g) {
		if (strlen(*g) == gram_len && memcmp(*g, gram, gram_len) == 0)
			s = *g;
	}
	if (s == NULL) {
		s = p_strndup(pool, gram, gram_len);
		array_push_back(&value->grams, &s);
	}
	array_push_back(&value->seq, &s);
}

void casidx_dtgram_value(const char *value, pool_t pool,
			 struct casidx_dtgram_value *value_r)
{
	struct casidx_dtgram *dt;
	size_t len = strlen(value);

	i_zero(value_r);
	p_array_init(&value_r->grams, pool, 8);
	p_array_init(&value_r->seq, pool, 8);
	value_r->valid = uni_utf8_str_is_valid(value);
	if (!value_r->valid)
		return;
	T_BEGIN {
		buffer_t *img = t_buffer_create(len * 2 + 8);

		(void)uni_utf8_to_decomposed_titlecase(value, len, img);
		value_r->image_len = uni_utf8_strlen_n(img->data, img->used);
	} T_END;
	dt = casidx_dtgram_create();
	casidx_dtgram_feed(dt, value, len, value_gram_cb, value_r);
	casidx_dtgram_destroy(&dt);
	value_r->all_pairs = value_r->image_len >= 2 &&
		array_count(&value_r->seq) == value_r->image_len - 1;
}

bool casidx_dtgram_image_is_ascii(const char *value)
{
	size_t i, len = strlen(value);
	bool ret = FALSE;

	for (i = 0; i < len; i++) {
		if ((unsigned char)value[i] >= 0x80)
			break;
	}
	if (i == len || !uni_utf8_str_is_valid(value))
		return FALSE;
	T_BEGIN {
		buffer_t *img = t_buffer_create(len * 2 + 8);
		const unsigned char *p;

		(void)uni_utf8_to_decomposed_titlecase(value, len, img);
		p = img->data;
		for (i = 0; i < img->used; i++) {
			if (p[i] >= 0x80)
				break;
		}
		ret = i == img->used;
	} T_END;
	return ret;
}
