/* casidx segment builder and reader; layout in casidx-segment.h and
   doc/casidx-format.md. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "hash.h"
#include "str.h"
#include "sort.h"
#include "write-full.h"
#include "safe-memset.h"
#include "cas-crc32c.h"
#include "cas-durable.h"
#include "casidx-segment.h"
#include "casidx-termsig.h"

#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define SEG_MAGIC "CXSEG001"
#define SEG_END_MAGIC "CXSEGEND"
/* 2: postings entries carry positions (doc/casidx-format.md); 1 is
   still read (no positions).
   3: the same layout, and every document of the segment has its
   dtgram keys (casidx_segment_has_dtgrams()); 2 and 1 are still read
   (their documents count as without dtgrams).
   4: the same layout, and the raw values of the top-level From/To/Cc/
   Bcc headers are in their own key namespaces (CASIDX_FIELD_RAW_*),
   except for the documents marked CASIDX_TERM_RAWHDR; 3..1 are still
   read (the values are in the header field).
   5: position codes have a kind (casidx-segment.h CASIDX_POS_KIND_*),
   and the parts of body tokens have codes of kind PART; 4..2 are still
   read (their codes are of the kinds WORD and SPACE). */
#define SEG_VERSION 5
#define SEG_VERSION_PART_CODES 5
#define SEG_VERSION_RAW_ADDRESSES 4
#define SEG_VERSION_DTGRAMS 3
#define SEG_VERSION_POSITIONS 2
#define SEG_VERSION_NO_POSITIONS 1
#define SEG_HEADER_SIZE 16
#define SEG_BLOCK_TERMS 16
/* initial arena text size per byte of the namespace's dictionary blocks
   (front-coded keys and postings ranges) */
#define ARENA_TEXT_PER_DICT_BYTE 2

/* Fuzzing builds may skip checksum verification to reach the parsers
   behind it; production builds never do. */
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#  define CRC_MISMATCH(computed, stored) ((void)(computed), FALSE)
#else
#  define CRC_MISMATCH(computed, stored) ((computed) != (stored))
#endif

enum seg_footer_idx {
	F_DOCS_OFF, F_DOCS_LEN, F_DOCS_CRC,
	F_DOCLEN_OFF, F_DOCLEN_LEN, F_DOCLEN_CRC,
	F_SPARSE_OFF, F_SPARSE_LEN, F_SPARSE_CRC,
	F_DICT_OFF, F_DICT_LEN,
	F_POST_OFF, F_POST_LEN,
	F_NDOCS, F_NTERMS, F_NBLOCKS,
	F_FIELD_TOTAL,
	F_COUNT = F_FIELD_TOTAL + CASIDX_FIELD_COUNT
};
#define SEG_FOOTER_SIZE (F_COUNT * 8 + 4 + 4 + 8)

/* pairs: PAIR_STRIDE uint32s per doc: uid, tf, number of positions */
#define PAIR_STRIDE 3
struct builder_term {
	char *key;
	uint32_t *pairs;
	unsigned int count, alloc;
	/* position codes (casidx_builder_add_term_pos()), the docs' in
	   pair order */
	uint32_t *pos;
	unsigned int pos_count, pos_alloc;
	bool unsorted;
	/* positions out of order or a doc added twice: none written */
	bool no_pos;
};

struct builder_doc {
	uint32_t uid;
	uint32_t lens[CASIDX_FIELD_COUNT];
};

struct casidx_builder {
	pool_t pool;
	HASH_TABLE(char *, struct builder_term *) terms;
	ARRAY(struct builder_doc) docs;
	/* docs added more than once: their positions could mix two
	   numberings, so none are written for them */
	roaring_bitmap_t *no_pos_docs;
	size_t memory_used;
	uint32_t max_uid;
	bool docs_unsorted;
};

struct sparse_entry {
	const unsigned char *key;
	size_t key_len;
	uint64_t offset, size;
};

struct arena_term {
	uint32_t key_off, key_len, df, post_size;
	uint64_t post_off;
};

/* One key namespace (field char) of the dictionary, decoded for
   casidx_segment_find_substring(): every key NUL-terminated in text,
   entries in key order. */
struct seg_arena {
	unsigned char field_char;
	buffer_t *text;
	ARRAY(struct arena_term) terms;
	/* trigram signatures of the terms (casidx-termsig.h), built by the
	   first lookup of a needle they can narrow down */
	struct casidx_termsig *termsig;
};

struct casidx_segment {
	int fd;
	void *mmap_base;
	size_t mmap_size;
	/* decrypted image of a sealed segment, owned */
	buffer_t *owned;
	const unsigned char *data;
	size_t size;

	uint32_t version;
	uint64_t footer[F_COUNT];
	roaring_bitmap_t *docs;
	const unsigned char *doclens;
	ARRAY(struct sparse_entry) sparse;
	/* the namespaces decoded so far, each by its first lookup: a
	   session's searches read only their fields' terms */
	ARRAY(struct seg_arena *) arenas;
	unsigned int arena_terms_decoded, arena_terms_signed;
};

struct casidx_segment_iter {
	struct casidx_segment *seg;
	const unsigned char *prefix;
	size_t prefix_len;
	unsigned int block_idx;
	const unsigned char *p, *end;
	unsigned int block_terms_left;
	buffer_t *key, *prev_key;
	const struct sparse_entry *block;
	struct casidx_term_entry entry;
	const char *error;
	bool started, finished;
};

/* ---- little helpers ---- */

static void put_u32(buffer_t *buf, uint32_t v)
{
	uint8_t b[4] = { v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff,
			 (v >> 24) & 0xff };
	buffer_append(buf, b, sizeof(b));
}

static void put_u64(buffer_t *buf, uint64_t v)
{
	put_u32(buf, (uint32_t)v);
	put_u32(buf, (uint32_t)(v >> 32));
}

static void put_varint(buffer_t *buf, uint64_t v)
{
	uint8_t b[10];
	unsigned int n = 0;

	while (v >= 0x80) {
		b[n++] = (v & 0x7f) | 0x80;
		v >>= 7;
	}
	b[n++] = v;
	buffer_append(buf, b, n);
}

static uint32_t get_u32(const unsigned char *p)
{
	return p[0] | (p[1] << 8) | (p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t get_u64(const unsigned char *p)
{
	return get_u32(p) | ((uint64_t)get_u32(p + 4) << 32);
}

/* Returns FALSE if the varint is truncated or too long. */
static bool get_varint(const unsigned char **p, const unsigned char *end,
		       uint64_t *value_r)
{
	uint64_t v = 0;
	unsigned int shift = 0;

	while (*p < end && shift < 64) {
		unsigned char c = *(*p)++;

		v |= (uint64_t)(c & 0x7f) << shift;
		if ((c & 0x80) == 0) {
			*value_r = v;
			return TRUE;
		}
		shift += 7;
	}
	return FALSE;
}

/* ---- builder ---- */

struct casidx_builder *casidx_builder_create(void)
{
	struct casidx_builder *builder;
	pool_t pool;

	pool = pool_alloconly_create("casidx builder", 1024*64);
	builder = p_new(pool, struct casidx_builder, 1);
	builder->pool = pool;
	hash_table_create(&builder->terms, pool, 0, str_hash, strcmp);
	i_array_init(&builder->docs, 128);
	builder->no_pos_docs = roaring_bitmap_create();
	if (builder->no_pos_docs == NULL)
		i_fatal_status(FATAL_OUTOFMEM,
			       "roaring_bitmap_create() failed");
	return builder;
}

void casidx_builder_destroy(struct casidx_builder **_builder)
{
	struct casidx_builder *builder = *_builder;
	struct hash_iterate_context *iter;
	char *key;
	struct builder_term *term;

	*_builder = NULL;
	iter = hash_table_iterate_init(builder->terms);
	while (hash_table_iterate(iter, builder->terms, &key, &term)) {
		i_free(term->pairs);
		i_free(term->pos);
	}
	hash_table_iterate_deinit(&iter);
	hash_table_destroy(&builder->terms);
	array_free(&builder->docs);
	roaring_bitmap_free(builder->no_pos_docs);
	pool_unref(&builder->pool);
}

/* A doc starts (add_doc, add_doc_lens): if it is the last one again,
   or comes out of order (it may be there already), its positions are
   not trusted. */
static struct builder_doc *builder_doc_get(struct casidx_builder *builder,
					   uint32_t uid)
{
	struct builder_doc *doc;

	if (array_count(&builder->docs) > 0) {
		doc = array_back_modifiable(&builder->docs);
		if (doc->uid == uid) {
			roaring_bitmap_add(builder->no_pos_docs, uid);
			return doc;
		}
		if (doc->uid > uid) {
			builder->docs_unsorted = TRUE;
			roaring_bitmap_add(builder->no_pos_docs, uid);
		}
	}
	doc = array_append_space(&builder->docs);
	doc->uid = uid;
	builder->memory_used += sizeof(*doc);
	if (uid > builder->max_uid)
		builder->max_uid = uid;
	return doc;
}

void casidx_builder_add_doc(struct casidx_builder *builder, uint32_t uid)
{
	(void)builder_doc_get(builder, uid);
}

void casidx_builder_add_doc_lens(struct casidx_builder *builder, uint32_t uid,
				 const uint32_t lens[CASIDX_FIELD_COUNT])
{
	struct builder_doc *doc = builder_doc_get(builder, uid);
	unsigned int i;

	for (i = 0; i < CASIDX_FIELD_COUNT; i++)
		doc->lens[i] += lens[i];
}

static struct builder_term *
builder_term_get(struct casidx_builder *builder,
		 const unsigned char *key, size_t key_len)
{
	struct builder_term *term;
	const char *lookup_key = t_strndup(key, key_len);

	term = hash_table_lookup(builder->terms, lookup_key);
	if (term == NULL) {
		term = p_new(builder->pool, struct builder_term, 1);
		term->key = p_strndup(builder->pool, key, key_len);
		hash_table_insert(builder->terms, term->key, term);
		builder->memory_used += key_len + 1 + sizeof(*term) + 32;
	}
	return term;
}

/* May code follow prev in the codes of one (term, doc)? A later
   position, or a part at the same one (after the whole token, or
   another part: "a.a@b" has the part "a" twice). */
static bool pos_code_follows(uint32_t prev, uint32_t code)
{
	return CASIDX_POS_OF(code) > CASIDX_POS_OF(prev) ||
		(CASIDX_POS_OF(code) == CASIDX_POS_OF(prev) &&
		 CASIDX_POS_KIND(code) == CASIDX_POS_KIND_PART);
}

static void builder_term_add_pos(struct casidx_builder *builder,
				 struct builder_term *term,
				 const uint32_t *pos, unsigned int npos)
{
	uint32_t *pairs = term->pairs + (term->count - 1) * PAIR_STRIDE;
	unsigned int i;

	if (term->no_pos || npos == 0)
		return;
	/* ascending within the doc, strictly but for repeated parts */
	for (i = 0; i < npos; i++) {
		i_assert(CASIDX_POS_KIND(pos[i]) <= CASIDX_POS_KIND_PART);
		if ((pairs[2] > 0 || i > 0) &&
		    !pos_code_follows(term->pos[term->pos_count - 1],
				      pos[i])) {
			term->no_pos = TRUE;
			return;
		}
		if (term->pos_count == term->pos_alloc) {
			unsigned int new_alloc = term->pos_alloc == 0 ? 4 :
				term->pos_alloc * 2;

			term->pos = i_realloc_type(term->pos, uint32_t,
						   term->pos_alloc, new_alloc);
			builder->memory_used +=
				(new_alloc - term->pos_alloc) * 4;
			term->pos_alloc = new_alloc;
		}
		term->pos[term->pos_count++] = pos[i];
		pairs[2]++;
	}
}

static void builder_term_add(struct casidx_builder *builder,
			     struct builder_term *term,
			     uint32_t uid, uint32_t tf,
			     const uint32_t *pos, unsigned int npos)
{
	uint32_t *pairs;

	if (term->count > 0) {
		uint32_t last = term->pairs[(term->count - 1) * PAIR_STRIDE];

		if (last == uid) {
			term->pairs[(term->count - 1) * PAIR_STRIDE + 1] += tf;
			builder_term_add_pos(builder, term, pos, npos);
			return;
		}
		if (last > uid)
			term->unsorted = TRUE;
	}
	if (term->count == term->alloc) {
		unsigned int new_alloc = term->alloc == 0 ? 2 : term->alloc * 2;

		term->pairs = i_realloc_type(term->pairs, uint32_t,
					     term->alloc * PAIR_STRIDE,
					     new_alloc * PAIR_STRIDE);
		builder->memory_used += (new_alloc - term->alloc) *
			PAIR_STRIDE * 4;
		term->alloc = new_alloc;
	}
	pairs = term->pairs + term->count * PAIR_STRIDE;
	pairs[0] = uid;
	pairs[1] = tf;
	pairs[2] = 0;
	term->count++;
	/* sorting would have to carry the positions along: drop them */
	if (term->unsorted)
		term->no_pos = TRUE;
	builder_term_add_pos(builder, term, pos, npos);
}

void casidx_builder_add_posting(struct casidx_builder *builder,
				const unsigned char *key, size_t key_len,
				uint32_t uid, uint32_t tf)
{
	casidx_builder_add_posting_pos(builder, key, key_len, uid, tf,
				       NULL, 0);
}

void casidx_builder_add_posting_pos(struct casidx_builder *builder,
				    const unsigned char *key, size_t key_len,
				    uint32_t uid, uint32_t tf,
				    const uint32_t *pos, unsigned int npos)
{
	T_BEGIN {
		builder_term_add(builder,
				 builder_term_get(builder, key, key_len),
				 uid, tf, pos, npos);
	} T_END;
}

static size_t utf8_cut_len(const unsigned char *s, size_t len, size_t max)
{
	if (len <= max)
		return len;
	len = max;
	/* don't end in the middle of a UTF-8 sequence */
	while (len > 0 && (s[len] & 0xc0) == 0x80)
		len--;
	return len;
}

void casidx_builder_add_term(struct casidx_builder *builder,
			     enum casidx_field field,
			     const void *term, size_t term_len)
{
	casidx_builder_add_term_pos(builder, field, term, term_len,
				    CASIDX_POS_NONE);
}

void casidx_builder_add_term_pos(struct casidx_builder *builder,
				 enum casidx_field field,
				 const void *term, size_t term_len,
				 uint32_t pos_code)
{
	struct builder_doc *doc;
	unsigned char key[CASIDX_TERM_MAX_BYTES + 1];

	i_assert(field < CASIDX_FIELD_SPACE_COUNT);
	i_assert(array_count(&builder->docs) > 0);

	if (term_len == 0 || memchr(term, '\0', term_len) != NULL)
		return;
	term_len = utf8_cut_len(term, term_len, CASIDX_TERM_MAX_BYTES);
	if (term_len == 0)
		return;
	doc = array_back_modifiable(&builder->docs);
	if (field < CASIDX_FIELD_COUNT)
		doc->lens[field]++;
	key[0] = CASIDX_FIELD_KEY_CHAR(field);
	memcpy(key + 1, term, term_len);
	casidx_builder_add_posting_pos(builder, key, term_len + 1, doc->uid, 1,
				       &pos_code,
				       pos_code == CASIDX_POS_NONE ? 0 : 1);
}

void casidx_builder_add_key(struct casidx_builder *builder,
			    const unsigned char *key, size_t key_len,
			    uint32_t pos_code)
{
	const struct builder_doc *doc;

	i_assert(array_count(&builder->docs) > 0);
	i_assert(key_len > 1 && key_len <= CASIDX_TERM_MAX_BYTES + 1);

	doc = array_back(&builder->docs);
	casidx_builder_add_posting_pos(builder, key, key_len, doc->uid, 1,
				       &pos_code,
				       pos_code == CASIDX_POS_NONE ? 0 : 1);
}

size_t casidx_builder_memory_used(const struct casidx_builder *builder)
{
	return builder->memory_used;
}

unsigned int casidx_builder_doc_count(const struct casidx_builder *builder)
{
	return array_count(&builder->docs);
}

uint32_t casidx_builder_max_uid(const struct casidx_builder *builder)
{
	return builder->max_uid;
}

void casidx_builder_drop_upto(struct casidx_builder *builder, uint32_t uid)
{
	struct hash_iterate_context *iter;
	struct builder_term *term;
	struct builder_doc *docs;
	unsigned int i, n, count;
	char *key;

	docs = array_get_modifiable(&builder->docs, &count);
	for (i = n = 0; i < count; i++) {
		if (docs[i].uid > uid)
			docs[n++] = docs[i];
	}
	if (n == count)
		return;
	array_delete(&builder->docs, n, count - n);
	builder->max_uid = 0;
	for (i = 0; i < n; i++)
		builder->max_uid = I_MAX(builder->max_uid, docs[i].uid);

	/* emptied terms stay in the table (their key lives in the pool);
	   the dictionary writer skips them */
	iter = hash_table_iterate_init(builder->terms);
	while (hash_table_iterate(iter, builder->terms, &key, &term)) {
		unsigned int p = 0, np = 0, j;
		uint32_t *pair;

		for (i = n = 0; i < term->count; i++) {
			pair = term->pairs + i * PAIR_STRIDE;
			if (pair[0] <= uid) {
				p += pair[2];
				continue;
			}
			for (j = 0; j < pair[2]; j++)
				term->pos[np++] = term->pos[p++];
			memmove(term->pairs + n * PAIR_STRIDE, pair,
				PAIR_STRIDE * 4);
			n++;
		}
		term->count = n;
		term->pos_count = np;
	}
	hash_table_iterate_deinit(&iter);
}

static int pair_cmp(const uint32_t *a, const uint32_t *b)
{
	return a[0] < b[0] ? -1 : (a[0] > b[0] ? 1 : 0);
}

static int builder_doc_cmp(const struct builder_doc *a,
			   const struct builder_doc *b)
{
	return a->uid < b->uid ? -1 : (a->uid > b->uid ? 1 : 0);
}

static int term_ptr_cmp(struct builder_term *const *a,
			struct builder_term *const *b)
{
	return strcmp((*a)->key, (*b)->key);
}

/* Sort a term's pairs by uid and merge duplicates. */
static void builder_term_normalize(struct builder_term *term)
{
	unsigned int i, n = 0;

	if (!term->unsorted)
		return;
	/* positions were dropped when the order broke (no_pos) */
	i_assert(term->no_pos);
	qsort(term->pairs, term->count, PAIR_STRIDE * 4,
	      (int (*)(const void *, const void *))pair_cmp);
	for (i = 0; i < term->count; i++) {
		uint32_t *pair = term->pairs + i * PAIR_STRIDE;

		if (n > 0 && term->pairs[(n - 1) * PAIR_STRIDE] == pair[0]) {
			term->pairs[(n - 1) * PAIR_STRIDE + 1] += pair[1];
			continue;
		}
		memmove(term->pairs + n * PAIR_STRIDE, pair, PAIR_STRIDE * 4);
		n++;
	}
	term->count = n;
	term->unsorted = FALSE;
}

static void builder_docs_normalize(struct casidx_builder *builder)
{
	struct builder_doc *docs;
	unsigned int i, j, n = 0, count;

	if (!builder->docs_unsorted)
		return;
	array_sort(&builder->docs, builder_doc_cmp);
	docs = array_get_modifiable(&builder->docs, &count);
	for (i = 0; i < count; i++) {
		if (n > 0 && docs[n - 1].uid == docs[i].uid) {
			for (j = 0; j < CASIDX_FIELD_COUNT; j++)
				docs[n - 1].lens[j] += docs[i].lens[j];
			continue;
		}
		docs[n++] = docs[i];
	}
	array_delete(&builder->docs, n, count - n);
	builder->docs_unsorted = FALSE;
}

static void append_bitmap(buffer_t *output, const roaring_bitmap_t *bm)
{
	size_t size = roaring_bitmap_portable_size_in_bytes(bm);
	void *dest = buffer_append_space_unsafe(output, size);

	if (roaring_bitmap_portable_serialize(bm, dest) != size)
		i_panic("casidx: roaring serialize size mismatch");
}

/* The positions section of a postings entry: per doc (bitmap order)
   varint x: 0 = no codes; else x - 1 = first code << 1 | (npos == tf),
   then, if npos < tf, varint npos; then npos - 1 varints, each
   ((position - previous) << 2 | kind). A code is position << 2 | kind
   (version 5; up to 4 position << 1 | space flag). Empty when no doc
   has any. Most docs have a code for every occurrence, so they pay no
   count. */
static void write_positions(buffer_t *body, struct builder_term *term,
			    const roaring_bitmap_t *no_pos_docs)
{
	buffer_t *pos = t_buffer_create(16 + term->pos_count * 2);
	const uint32_t *pair, *code = term->pos;
	uint32_t prev;
	unsigned int i, j, written = 0;
	bool skip;

	for (i = 0; i < term->count && !term->no_pos; i++) {
		pair = term->pairs + i * PAIR_STRIDE;
		skip = pair[2] == 0 ||
			roaring_bitmap_contains(no_pos_docs, pair[0]);
		if (skip)
			put_varint(pos, 0);
		for (j = 0, prev = 0; j < pair[2]; j++, code++) {
			if (skip)
				continue;
			if (j == 0) {
				put_varint(pos, (((uint64_t)*code << 1) |
						 (pair[2] == pair[1] ? 1 : 0)) + 1);
				if (pair[2] != pair[1])
					put_varint(pos, pair[2]);
			} else {
				put_varint(pos, ((CASIDX_POS_OF(*code) - prev) << 2) |
					   CASIDX_POS_KIND(*code));
			}
			prev = CASIDX_POS_OF(*code);
			written++;
		}
	}
	if (written == 0)
		put_varint(body, 0);
	else {
		put_varint(body, pos->used);
		buffer_append_buf(body, pos, 0, SIZE_MAX);
	}
}

static void write_postings(buffer_t *output, struct builder_term *term,
			   const roaring_bitmap_t *no_pos_docs)
{
	roaring_bitmap_t *bm = roaring_bitmap_create_with_capacity(term->count);
	buffer_t *body = t_buffer_create(64 + term->count * 2);
	size_t bm_size;
	unsigned int i;

	if (bm == NULL)
		i_fatal_status(FATAL_OUTOFMEM,
			       "roaring_bitmap_create() failed");
	for (i = 0; i < term->count; i++)
		roaring_bitmap_add(bm, term->pairs[i * PAIR_STRIDE]);
	(void)roaring_bitmap_run_optimize(bm);
	bm_size = roaring_bitmap_portable_size_in_bytes(bm);
	put_varint(body, bm_size);
	append_bitmap(body, bm);
	roaring_bitmap_free(bm);
	put_varint(body, term->count);
	for (i = 0; i < term->count; i++)
		put_varint(body, term->pairs[i * PAIR_STRIDE + 1]);
	write_positions(body, term, no_pos_docs);
	put_u32(output, cas_crc32c(body->data, body->used));
	buffer_append_buf(output, body, 0, SIZE_MAX);
}

struct dict_writer {
	const roaring_bitmap_t *no_pos_docs;
	/* posts is the segment image itself, postings from posts_start */
	buffer_t *dict, *posts, *sparse, *block;
	size_t posts_start;
	const char *prev_key;
	unsigned int block_terms, nblocks;
	size_t block_first_off;
	const char *block_first_key;
};

static void dict_flush_block(struct dict_writer *w)
{
	buffer_t *framed;

	if (w->block_terms == 0)
		return;
	framed = t_buffer_create(w->block->used + 16);
	put_varint(framed, w->block_terms);
	buffer_append_buf(framed, w->block, 0, SIZE_MAX);
	w->block_first_off = w->dict->used;
	put_u32(w->dict, cas_crc32c(framed->data, framed->used));
	put_u32(w->dict, framed->used);
	buffer_append_buf(w->dict, framed, 0, SIZE_MAX);

	put_varint(w->sparse, strlen(w->block_first_key));
	buffer_append(w->sparse, w->block_first_key,
		      strlen(w->block_first_key));
	put_varint(w->sparse, w->block_first_off);
	put_varint(w->sparse, w->dict->used - w->block_first_off);
	w->nblocks++;
	w->block_terms = 0;
	buffer_set_used_size(w->block, 0);
	w->prev_key = NULL;
}

static void dict_add_term(struct dict_writer *w, struct builder_term *term)
{
	size_t key_len = strlen(term->key), shared = 0;
	size_t post_off = w->posts->used - w->posts_start;

	if (w->prev_key == NULL)
		w->block_first_key = term->key;
	else {
		while (w->prev_key[shared] != '\0' &&
		       w->prev_key[shared] == term->key[shared])
			shared++;
	}
	write_postings(w->posts, term, w->no_pos_docs);
	put_varint(w->block, shared);
	put_varint(w->block, key_len - shared);
	buffer_append(w->block, term->key + shared, key_len - shared);
	put_varint(w->block, term->count);
	put_varint(w->block, post_off);
	put_varint(w->block, w->posts->used - w->posts_start - post_off);
	w->prev_key = term->key;
	/* written: its memory can go to the growing segment image */
	i_free(term->pairs);
	i_free(term->pos);
	term->count = term->alloc = 0;
	term->pos_count = term->pos_alloc = 0;
	if (++w->block_terms == SEG_BLOCK_TERMS)
		dict_flush_block(w);
}

static void
builder_serialize_docs(struct casidx_builder *builder, buffer_t *output,
		       uint64_t footer[F_COUNT])
{
	const struct builder_doc *doc;
	roaring_bitmap_t *bm = roaring_bitmap_create();
	size_t start;
	unsigned int i;

	if (bm == NULL)
		i_fatal_status(FATAL_OUTOFMEM,
			       "roaring_bitmap_create() failed");
	array_foreach(&builder->docs, doc)
		roaring_bitmap_add(bm, doc->uid);
	(void)roaring_bitmap_run_optimize(bm);
	start = output->used;
	append_bitmap(output, bm);
	roaring_bitmap_free(bm);
	footer[F_DOCS_OFF] = start;
	footer[F_DOCS_LEN] = output->used - start;
	footer[F_DOCS_CRC] = cas_crc32c(CONST_PTR_OFFSET(output->data, start),
					output->used - start);

	start = output->used;
	array_foreach(&builder->docs, doc) {
		for (i = 0; i < CASIDX_FIELD_COUNT; i++) {
			put_u32(output, doc->lens[i]);
			footer[F_FIELD_TOTAL + i] += doc->lens[i];
		}
	}
	footer[F_DOCLEN_OFF] = start;
	footer[F_DOCLEN_LEN] = output->used - start;
	footer[F_DOCLEN_CRC] =
		cas_crc32c(CONST_PTR_OFFSET(output->data, start),
			   output->used - start);
	footer[F_NDOCS] = array_count(&builder->docs);
}

static void
builder_serialize_dict(struct casidx_builder *builder, buffer_t *output,
		       uint64_t footer[F_COUNT])
{
	ARRAY(struct builder_term *) sorted;
	struct hash_iterate_context *iter;
	struct builder_term *term, *const *termp;
	struct dict_writer w;
	char *key;

	i_zero(&w);
	w.no_pos_docs = builder->no_pos_docs;
	w.dict = buffer_create_dynamic(default_pool, 4096);
	/* the postings go straight into output and the (smaller)
	   dictionary is inserted before them: a separate postings buffer
	   copied into output was the serializer's largest extra copy */
	w.posts = output;
	w.posts_start = output->used;
	w.sparse = buffer_create_dynamic(default_pool, 1024);
	w.block = buffer_create_dynamic(default_pool, 1024);

	i_array_init(&sorted, hash_table_count(builder->terms) + 1);
	iter = hash_table_iterate_init(builder->terms);
	while (hash_table_iterate(iter, builder->terms, &key, &term)) {
		builder_term_normalize(term);
		if (term->count > 0)
			array_push_back(&sorted, &term);
	}
	hash_table_iterate_deinit(&iter);
	array_sort(&sorted, term_ptr_cmp);
	array_foreach(&sorted, termp) T_BEGIN {
		dict_add_term(&w, *termp);
	} T_END;
	T_BEGIN {
		dict_flush_block(&w);
	} T_END;

	footer[F_POST_LEN] = output->used - w.posts_start;
	footer[F_DICT_OFF] = w.posts_start;
	footer[F_DICT_LEN] = w.dict->used;
	buffer_insert(output, w.posts_start, w.dict->data, w.dict->used);
	footer[F_POST_OFF] = w.posts_start + w.dict->used;
	buffer_free(&w.dict);
	footer[F_SPARSE_OFF] = output->used;
	footer[F_SPARSE_LEN] = w.sparse->used;
	footer[F_SPARSE_CRC] = cas_crc32c(w.sparse->data, w.sparse->used);
	buffer_append_buf(output, w.sparse, 0, SIZE_MAX);
	footer[F_NTERMS] = array_count(&sorted);
	footer[F_NBLOCKS] = w.nblocks;

	array_free(&sorted);
	buffer_free(&w.sparse);
	buffer_free(&w.block);
}

void casidx_builder_serialize(struct casidx_builder *builder,
			      buffer_t *output)
{
	uint64_t footer[F_COUNT];
	size_t footer_start;
	unsigned int i;

	i_zero(&footer);
	builder_docs_normalize(builder);
	buffer_append(output, SEG_MAGIC, 8);
	put_u32(output, SEG_VERSION);
	put_u32(output, CASIDX_FIELD_COUNT);
	builder_serialize_docs(builder, output, footer);
	builder_serialize_dict(builder, output, footer);

	footer_start = output->used;
	for (i = 0; i < F_COUNT; i++)
		put_u64(output, footer[i]);
	put_u32(output, cas_crc32c(CONST_PTR_OFFSET(output->data,
						    footer_start),
				   output->used - footer_start));
	put_u32(output, 0);
	buffer_append(output, SEG_END_MAGIC, 8);
}

int casidx_file_write(const char *path, const void *data, size_t size,
		      bool fsync_file, const char **error_r)
{
	const struct cas_durable_write_settings set = {
		.tmp_path = t_strdup_printf("%s.tmp", path),
		.tmp_truncate = TRUE,
		.no_fsync = !fsync_file,
		.no_dir_fsync = TRUE,
	};

	return cas_durable_write_atomic(path, data, size, &set, error_r);
}

int casidx_builder_write(struct casidx_builder *builder, const char *path,
			 bool fsync_file, const char **error_r)
{
	buffer_t *output;
	int ret;

	output = buffer_create_dynamic(default_pool, 1024*64);
	casidx_builder_serialize(builder, output);
	ret = casidx_file_write(path, output->data, output->used,
				fsync_file, error_r);
	buffer_free(&output);
	return ret;
}

/* ---- reader ---- */

static int seg_corrupt(const char **error_r, const char *reason)
{
	*error_r = t_strdup_printf("corrupted segment: %s", reason);
	return -1;
}

static bool seg_range_ok(const struct casidx_segment *seg,
			 uint64_t off, uint64_t len)
{
	uint64_t limit = seg->size - SEG_FOOTER_SIZE;

	return off >= SEG_HEADER_SIZE && off <= limit && len <= limit - off;
}

static int seg_parse_sparse(struct casidx_segment *seg, const char **error_r)
{
	const unsigned char *p = seg->data + seg->footer[F_SPARSE_OFF];
	const unsigned char *end = p + seg->footer[F_SPARSE_LEN];
	struct sparse_entry e, prev;
	uint64_t n, key_len, prev_end = 0;
	size_t min_len;
	int cmp;

	i_zero(&prev);
	for (n = 0; n < seg->footer[F_NBLOCKS]; n++) {
		i_zero(&e);
		if (!get_varint(&p, end, &key_len) ||
		    key_len > (size_t)(end - p) || key_len == 0)
			return seg_corrupt(error_r, "sparse index key");
		e.key = p;
		e.key_len = key_len;
		p += key_len;
		if (!get_varint(&p, end, &e.offset) ||
		    !get_varint(&p, end, &e.size))
			return seg_corrupt(error_r, "sparse index offset");
		if (e.offset != prev_end || e.size < 8 ||
		    e.size > seg->footer[F_DICT_LEN] - e.offset)
			return seg_corrupt(error_r, "sparse block range");
		prev_end = e.offset + e.size;
		if (n > 0) {
			min_len = I_MIN(prev.key_len, e.key_len);
			cmp = memcmp(prev.key, e.key, min_len);
			if (cmp > 0 || (cmp == 0 && prev.key_len >= e.key_len))
				return seg_corrupt(error_r,
						   "sparse keys not sorted");
		}
		/* copy: appending may move the array */
		array_push_back(&seg->sparse, &e);
		prev = e;
	}
	if (p != end || prev_end != seg->footer[F_DICT_LEN])
		return seg_corrupt(error_r, "sparse index size");
	return 0;
}

static int seg_parse(struct casidx_segment *seg, const char **error_r)
{
	const unsigned char *f;
	unsigned int i;
	size_t doc_bm_size;

	if (seg->size < SEG_HEADER_SIZE + SEG_FOOTER_SIZE)
		return seg_corrupt(error_r, "file too small");
	if (memcmp(seg->data, SEG_MAGIC, 8) != 0)
		return seg_corrupt(error_r, "bad magic");
	seg->version = get_u32(seg->data + 8);
	if (seg->version < SEG_VERSION_NO_POSITIONS ||
	    seg->version > SEG_VERSION ||
	    get_u32(seg->data + 12) != CASIDX_FIELD_COUNT)
		return seg_corrupt(error_r, "unsupported version");
	f = seg->data + seg->size - SEG_FOOTER_SIZE;
	if (memcmp(f + SEG_FOOTER_SIZE - 8, SEG_END_MAGIC, 8) != 0)
		return seg_corrupt(error_r, "bad end magic");
	if (CRC_MISMATCH(cas_crc32c(f, F_COUNT * 8), get_u32(f + F_COUNT * 8)))
		return seg_corrupt(error_r, "footer checksum mismatch");
	if (get_u32(f + F_COUNT * 8 + 4) != 0)
		return seg_corrupt(error_r, "footer padding");
	for (i = 0; i < F_COUNT; i++)
		seg->footer[i] = get_u64(f + i * 8);

	if (!seg_range_ok(seg, seg->footer[F_DOCS_OFF],
			  seg->footer[F_DOCS_LEN]) ||
	    !seg_range_ok(seg, seg->footer[F_DOCLEN_OFF],
			  seg->footer[F_DOCLEN_LEN]) ||
	    !seg_range_ok(seg, seg->footer[F_SPARSE_OFF],
			  seg->footer[F_SPARSE_LEN]) ||
	    !seg_range_ok(seg, seg->footer[F_DICT_OFF],
			  seg->footer[F_DICT_LEN]) ||
	    !seg_range_ok(seg, seg->footer[F_POST_OFF],
			  seg->footer[F_POST_LEN]))
		return seg_corrupt(error_r, "section out of bounds");
	if (seg->footer[F_NDOCS] > (uint32_t)-1 ||
	    seg->footer[F_DOCLEN_LEN] !=
	    seg->footer[F_NDOCS] * 4 * CASIDX_FIELD_COUNT)
		return seg_corrupt(error_r, "doc length table size");
	if (seg->footer[F_NBLOCKS] > seg->footer[F_DICT_LEN] / 8 ||
	    seg->footer[F_NTERMS] > seg->footer[F_NBLOCKS] * SEG_BLOCK_TERMS)
		return seg_corrupt(error_r, "block count");
	if (CRC_MISMATCH(cas_crc32c(seg->data + seg->footer[F_DOCS_OFF],
				    seg->footer[F_DOCS_LEN]),
			 seg->footer[F_DOCS_CRC]) ||
	    CRC_MISMATCH(cas_crc32c(seg->data + seg->footer[F_DOCLEN_OFF],
				    seg->footer[F_DOCLEN_LEN]),
			 seg->footer[F_DOCLEN_CRC]) ||
	    CRC_MISMATCH(cas_crc32c(seg->data + seg->footer[F_SPARSE_OFF],
				    seg->footer[F_SPARSE_LEN]),
			 seg->footer[F_SPARSE_CRC]))
		return seg_corrupt(error_r, "section checksum mismatch");

	/* only CRC-verified bytes reach the roaring decoder */
	seg->docs = roaring_bitmap_portable_deserialize_safe(
		(const char *)seg->data + seg->footer[F_DOCS_OFF],
		seg->footer[F_DOCS_LEN]);
	if (seg->docs == NULL)
		return seg_corrupt(error_r, "doc bitmap");
	doc_bm_size = roaring_bitmap_portable_size_in_bytes(seg->docs);
	if (doc_bm_size != seg->footer[F_DOCS_LEN] ||
	    roaring_bitmap_get_cardinality(seg->docs) != seg->footer[F_NDOCS])
		return seg_corrupt(error_r, "doc bitmap size");
	seg->doclens = seg->data + seg->footer[F_DOCLEN_OFF];
	return seg_parse_sparse(seg, error_r);
}

static struct casidx_segment *seg_alloc(void)
{
	struct casidx_segment *seg = i_new(struct casidx_segment, 1);

	seg->fd = -1;
	i_array_init(&seg->sparse, 16);
	return seg;
}

int casidx_segment_open_buf(const void *data, size_t size,
			    struct casidx_segment **seg_r,
			    const char **error_r)
{
	struct casidx_segment *seg = seg_alloc();

	seg->data = data;
	seg->size = size;
	if (seg_parse(seg, error_r) < 0) {
		casidx_segment_close(&seg);
		return -1;
	}
	*seg_r = seg;
	return 1;
}

int casidx_segment_open_owned(buffer_t **_buf, struct casidx_segment **seg_r,
			      const char **error_r)
{
	struct casidx_segment *seg = seg_alloc();

	seg->owned = *_buf;
	*_buf = NULL;
	seg->data = seg->owned->data;
	seg->size = seg->owned->used;
	if (seg_parse(seg, error_r) < 0) {
		casidx_segment_close(&seg);
		return -1;
	}
	*seg_r = seg;
	return 1;
}

int casidx_file_open(const char *path, int *fd_r, struct stat *st_r,
		     const char **error_r)
{
	int fd;

	fd = open(path, O_RDONLY);
	if (fd == -1) {
		if (errno == ENOENT)
			return 0;
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	if (fstat(fd, st_r) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", path);
		i_close_fd(&fd);
		return -1;
	}
	*fd_r = fd;
	return 1;
}

int casidx_segment_open(const char *path, struct casidx_segment **seg_r,
			bool *corrupted_r, const char **error_r)
{
	struct casidx_segment *seg;
	struct stat st;
	int fd, ret;

	*corrupted_r = FALSE;
	if ((ret = casidx_file_open(path, &fd, &st, error_r)) <= 0)
		return ret;
	seg = seg_alloc();
	seg->fd = fd;
	if (st.st_size > 0) {
		seg->mmap_size = st.st_size;
		seg->mmap_base = mmap(NULL, seg->mmap_size, PROT_READ,
				      MAP_SHARED, fd, 0);
		if (seg->mmap_base == MAP_FAILED) {
			seg->mmap_base = NULL;
			*error_r = t_strdup_printf("mmap(%s) failed: %m",
						   path);
			casidx_segment_close(&seg);
			return -1;
		}
		seg->data = seg->mmap_base;
		seg->size = seg->mmap_size;
	}
	if (seg_parse(seg, error_r) < 0) {
		*corrupted_r = TRUE;
		*error_r = t_strdup_printf("%s: %s", path, *error_r);
		casidx_segment_close(&seg);
		return -1;
	}
	*seg_r = seg;
	return 1;
}

static void seg_arena_free(struct seg_arena **_arena)
{
	struct seg_arena *arena = *_arena;

	*_arena = NULL;
	/* decrypted terms: do not leave them in freed memory */
	safe_memset(buffer_get_modifiable_data(arena->text, NULL), 0,
		    arena->text->used);
	buffer_free(&arena->text);
	array_free(&arena->terms);
	casidx_termsig_free(&arena->termsig);
	i_free(arena);
}

void casidx_segment_close(struct casidx_segment **_seg)
{
	struct casidx_segment *seg = *_seg;

	if (seg == NULL)
		return;
	*_seg = NULL;
	if (seg->docs != NULL)
		roaring_bitmap_free(seg->docs);
	if (seg->mmap_base != NULL)
		(void)munmap(seg->mmap_base, seg->mmap_size);
	if (seg->owned != NULL) {
		/* decrypted terms: do not leave them in freed memory */
		safe_memset(buffer_get_modifiable_data(seg->owned, NULL), 0,
			    seg->owned->used);
		buffer_free(&seg->owned);
	}
	if (array_is_created(&seg->arenas)) {
		struct seg_arena **arena;

		array_foreach_modifiable(&seg->arenas, arena)
			seg_arena_free(arena);
		array_free(&seg->arenas);
	}
	i_close_fd(&seg->fd);
	array_free(&seg->sparse);
	i_free(seg);
}

const roaring_bitmap_t *
casidx_segment_get_docs(const struct casidx_segment *seg)
{
	return seg->docs;
}

uint32_t casidx_segment_doc_len(const struct casidx_segment *seg,
				uint32_t uid, enum casidx_field field)
{
	uint64_t rank;

	i_assert(field < CASIDX_FIELD_COUNT);
	if (!roaring_bitmap_contains(seg->docs, uid))
		return 0;
	rank = roaring_bitmap_rank(seg->docs, uid) - 1;
	return get_u32(seg->doclens + (rank * CASIDX_FIELD_COUNT + field) * 4);
}

uint64_t casidx_segment_field_total(const struct casidx_segment *seg,
				    enum casidx_field field)
{
	i_assert(field < CASIDX_FIELD_COUNT);
	return seg->footer[F_FIELD_TOTAL + field];
}

size_t casidx_segment_get_size(const struct casidx_segment *seg)
{
	return seg->size;
}

unsigned int casidx_segment_term_count(const struct casidx_segment *seg)
{
	return seg->footer[F_NTERMS];
}

static int key_cmp(const unsigned char *a, size_t a_len,
		   const unsigned char *b, size_t b_len)
{
	int cmp = memcmp(a, b, I_MIN(a_len, b_len));

	if (cmp != 0)
		return cmp;
	return a_len < b_len ? -1 : (a_len > b_len ? 1 : 0);
}

struct casidx_segment_iter *
casidx_segment_iter_init(struct casidx_segment *seg,
			 const unsigned char *prefix, size_t prefix_len)
{
	struct casidx_segment_iter *iter;
	const struct sparse_entry *blocks;
	unsigned int count, lo = 0, hi;

	if (prefix == NULL) {
		i_assert(prefix_len == 0);
		prefix = (const unsigned char *)"";
	}
	iter = i_new(struct casidx_segment_iter, 1);
	iter->seg = seg;
	iter->prefix = prefix;
	iter->prefix_len = prefix_len;
	iter->key = buffer_create_dynamic(default_pool, 128);
	iter->prev_key = buffer_create_dynamic(default_pool, 128);
	/* last block whose first key is <= prefix */
	blocks = array_get(&seg->sparse, &count);
	hi = count;
	while (lo < hi) {
		unsigned int mid = (lo + hi) / 2;

		if (key_cmp(blocks[mid].key, blocks[mid].key_len,
			    prefix, prefix_len) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	iter->block_idx = lo == 0 ? 0 : lo - 1;
	return iter;
}

static int iter_fail(struct casidx_segment_iter *iter, const char *reason)
{
	iter->error = reason;
	iter->finished = TRUE;
	return -1;
}

static int iter_open_block(struct casidx_segment_iter *iter)
{
	struct casidx_segment *seg = iter->seg;
	const struct sparse_entry *e;
	const unsigned char *p;
	uint64_t nterms;

	if (iter->block_idx >= array_count(&seg->sparse))
		return 0;
	e = array_idx(&seg->sparse, iter->block_idx++);
	p = seg->data + seg->footer[F_DICT_OFF] + e->offset;
	if (get_u32(p + 4) != e->size - 8)
		return iter_fail(iter, "block length");
	if (CRC_MISMATCH(cas_crc32c(p + 8, e->size - 8), get_u32(p)))
		return iter_fail(iter, "dictionary block checksum mismatch");
	iter->p = p + 8;
	iter->end = p + e->size;
	if (!get_varint(&iter->p, iter->end, &nterms) ||
	    nterms == 0 || nterms > SEG_BLOCK_TERMS)
		return iter_fail(iter, "block term count");
	iter->block_terms_left = nterms;
	iter->block = e;
	return 1;
}

static int iter_read_term(struct casidx_segment_iter *iter)
{
	struct casidx_term_entry *e = &iter->entry;
	uint64_t shared, suffix, df, off, size;

	if (!get_varint(&iter->p, iter->end, &shared) ||
	    !get_varint(&iter->p, iter->end, &suffix) ||
	    shared > iter->key->used || suffix > (size_t)(iter->end - iter->p))
		return iter_fail(iter, "term key");
	buffer_set_used_size(iter->prev_key, 0);
	buffer_append_buf(iter->prev_key, iter->key, 0, SIZE_MAX);
	if (iter->block != NULL) {
		/* first term of a block: must be the sparse index key */
		if (shared != 0 || suffix != iter->block->key_len ||
		    memcmp(iter->p, iter->block->key, suffix) != 0)
			return iter_fail(iter, "block key mismatch");
		iter->block = NULL;
	}
	buffer_set_used_size(iter->key, shared);
	buffer_append(iter->key, iter->p, suffix);
	iter->p += suffix;
	/* readers binary-search and stop early: order must hold */
	if (iter->prev_key->used > 0 &&
	    key_cmp(iter->prev_key->data, iter->prev_key->used,
		    iter->key->data, iter->key->used) >= 0)
		return iter_fail(iter, "term keys not ascending");
	if (!get_varint(&iter->p, iter->end, &df) ||
	    !get_varint(&iter->p, iter->end, &off) ||
	    !get_varint(&iter->p, iter->end, &size))
		return iter_fail(iter, "term entry");
	if (iter->key->used == 0 || df == 0 || df > iter->seg->footer[F_NDOCS])
		return iter_fail(iter, "term document frequency");
	if (off > iter->seg->footer[F_POST_LEN] ||
	    size > iter->seg->footer[F_POST_LEN] - off || size < 5)
		return iter_fail(iter, "postings range");
	if (--iter->block_terms_left == 0 && iter->p != iter->end)
		return iter_fail(iter, "block trailing bytes");
	e->key = iter->key->data;
	e->key_len = iter->key->used;
	e->df = df;
	e->post_offset = off;
	e->post_size = size;
	return 1;
}

int casidx_segment_iter_next(struct casidx_segment_iter *iter,
			     const struct casidx_term_entry **entry_r)
{
	int ret, cmp;

	while (!iter->finished) {
		if (iter->block_terms_left == 0) {
			if ((ret = iter_open_block(iter)) <= 0) {
				iter->finished = TRUE;
				return ret;
			}
		}
		if (iter_read_term(iter) < 0)
			return -1;
		if (iter->entry.key_len >= iter->prefix_len &&
		    memcmp(iter->entry.key, iter->prefix,
			   iter->prefix_len) == 0) {
			*entry_r = &iter->entry;
			return 1;
		}
		cmp = key_cmp(iter->entry.key, iter->entry.key_len,
			      iter->prefix, iter->prefix_len);
		if (cmp > 0) {
			iter->finished = TRUE;
			return 0;
		}
	}
	return 0;
}

int casidx_segment_iter_deinit(struct casidx_segment_iter **_iter,
			       const char **error_r)
{
	struct casidx_segment_iter *iter = *_iter;
	int ret = 0;

	*_iter = NULL;
	if (iter->error != NULL) {
		*error_r = t_strdup_printf("corrupted segment: %s",
					   iter->error);
		ret = -1;
	}
	buffer_free(&iter->key);
	buffer_free(&iter->prev_key);
	i_free(iter);
	return ret;
}

/* One code of the positions section after the first: v is the varint
   read, *pos the previous position, *code the previous code. Version 5
   (kinds): (delta << 2 | kind), the delta 0 only for a part
   (pos_code_follows()); before it, (delta << 1 | space flag), the
   delta at least 1. */
static int seg_parse_next_code(uint64_t v, bool kinds, uint64_t *pos,
			       uint32_t *code, const char **error_r)
{
	unsigned int kind = kinds ? (v & 3) : (v & 1);
	uint64_t delta = kinds ? v >> 2 : v >> 1;

	if (kind > CASIDX_POS_KIND_PART)
		return seg_corrupt(error_r, "position kind");
	*pos += delta;
	if (*pos > CASIDX_POS_MAX)
		return seg_corrupt(error_r, "position range");
	if (!pos_code_follows(*code, CASIDX_POS_CODE(*pos, kind)))
		return seg_corrupt(error_r, "position delta");
	*code = CASIDX_POS_CODE(*pos, kind);
	return 0;
}

/* The first code of a doc (x - 1 >> 1 of write_positions()). */
static int seg_parse_first_code(uint64_t v, bool kinds, uint64_t *pos,
				uint32_t *code, const char **error_r)
{
	unsigned int kind = kinds ? (v & 3) : (v & 1);

	*pos = kinds ? v >> 2 : v >> 1;
	if (kind > CASIDX_POS_KIND_PART)
		return seg_corrupt(error_r, "position kind");
	if (*pos > CASIDX_POS_MAX)
		return seg_corrupt(error_r, "position range");
	*code = CASIDX_POS_CODE(*pos, kind);
	return 0;
}

/* The positions section (write_positions()) of n docs with term
   frequencies tfs into pos_r/pos_idx_r (absolute codes); kinds: the
   codes have kinds (version 5). */
static int seg_parse_positions(const unsigned char *p, const unsigned char *end,
			       bool kinds, const uint32_t *tfs, unsigned int n,
			       ARRAY_TYPE(uint32_t) *pos_r,
			       ARRAY_TYPE(uint32_t) *pos_idx_r,
			       const char **error_r)
{
	uint64_t npos = 0, v, pos;
	uint32_t idx = 0, code;
	unsigned int i, j;
	/* an empty section: no doc has positions */
	bool empty = p == end;

	array_clear(pos_r);
	array_clear(pos_idx_r);
	array_push_back(pos_idx_r, &idx);
	for (i = 0; i < n; i++) {
		uint64_t first = 0;

		npos = 0;
		if (!empty) {
			if (!get_varint(&p, end, &first))
				return seg_corrupt(error_r, "position count");
		}
		if (first > 0) {
			first--;
			if ((first & 1) != 0)
				npos = tfs[i];
			else if (!get_varint(&p, end, &npos) || npos == 0 ||
				 npos >= tfs[i])
				return seg_corrupt(error_r, "position count");
			first >>= 1;
		}
		for (j = 0, pos = 0; j < npos; j++) {
			if (j == 0) {
				if (seg_parse_first_code(first, kinds, &pos,
							 &code, error_r) < 0)
					return -1;
			} else if (!get_varint(&p, end, &v)) {
				return seg_corrupt(error_r, "position delta");
			} else if (seg_parse_next_code(v, kinds, &pos, &code,
						       error_r) < 0) {
				return -1;
			}
			array_push_back(pos_r, &code);
		}
		idx += npos;
		array_push_back(pos_idx_r, &idx);
	}
	if (p != end)
		return seg_corrupt(error_r, "positions trailing bytes");
	return 0;
}

int casidx_segment_read_postings(struct casidx_segment *seg,
				 const struct casidx_term_entry *entry,
				 roaring_bitmap_t **docs_r,
				 ARRAY_TYPE(uint32_t) *tfs_r,
				 const char **error_r)
{
	return casidx_segment_read_positions(seg, entry, docs_r, tfs_r,
					     NULL, NULL, error_r);
}

bool casidx_segment_has_positions(const struct casidx_segment *seg)
{
	return seg->version >= SEG_VERSION_POSITIONS;
}

bool casidx_segment_has_dtgrams(const struct casidx_segment *seg)
{
	return seg->version >= SEG_VERSION_DTGRAMS;
}

bool casidx_segment_has_raw_addresses(const struct casidx_segment *seg)
{
	return seg->version >= SEG_VERSION_RAW_ADDRESSES;
}

bool casidx_segment_has_part_codes(const struct casidx_segment *seg)
{
	return seg->version >= SEG_VERSION_PART_CODES;
}

int casidx_segment_read_positions(struct casidx_segment *seg,
				  const struct casidx_term_entry *entry,
				  roaring_bitmap_t **docs_r,
				  ARRAY_TYPE(uint32_t) *tfs_r,
				  ARRAY_TYPE(uint32_t) *pos_r,
				  ARRAY_TYPE(uint32_t) *pos_idx_r,
				  const char **error_r)
{
	const unsigned char *start, *p, *end;
	roaring_bitmap_t *bm;
	uint64_t bm_size, n, tf, pos_len = 0;
	uint32_t tf32;

	start = seg->data + seg->footer[F_POST_OFF] + entry->post_offset;
	end = start + entry->post_size;
	if (CRC_MISMATCH(cas_crc32c(start + 4, entry->post_size - 4),
			 get_u32(start)))
		return seg_corrupt(error_r, "postings checksum mismatch");
	p = start + 4;
	if (!get_varint(&p, end, &bm_size) || bm_size > (size_t)(end - p))
		return seg_corrupt(error_r, "postings bitmap size");
	bm = roaring_bitmap_portable_deserialize_safe((const char *)p,
						      bm_size);
	if (bm == NULL)
		return seg_corrupt(error_r, "postings bitmap");
	p += bm_size;
	if (roaring_bitmap_portable_size_in_bytes(bm) != bm_size ||
	    roaring_bitmap_get_cardinality(bm) != entry->df ||
	    !get_varint(&p, end, &n) || n != entry->df) {
		roaring_bitmap_free(bm);
		return seg_corrupt(error_r, "postings count");
	}
	/* every doc of a term must be a doc of the segment */
	if (!roaring_bitmap_is_subset(bm, seg->docs)) {
		roaring_bitmap_free(bm);
		return seg_corrupt(error_r, "postings outside segment docs");
	}
	array_clear(tfs_r);
	for (; n > 0; n--) {
		if (!get_varint(&p, end, &tf) || tf == 0 || tf > (uint32_t)-1) {
			roaring_bitmap_free(bm);
			return seg_corrupt(error_r, "term frequency");
		}
		tf32 = tf;
		array_push_back(tfs_r, &tf32);
	}
	if (seg->version >= SEG_VERSION_POSITIONS &&
	    (!get_varint(&p, end, &pos_len) || pos_len != (size_t)(end - p))) {
		roaring_bitmap_free(bm);
		return seg_corrupt(error_r, "positions size");
	}
	if (pos_r != NULL) {
		i_assert(pos_idx_r != NULL);
		if (seg_parse_positions(p, p + pos_len,
					seg->version >= SEG_VERSION_PART_CODES,
					array_front(tfs_r),
					entry->df, pos_r, pos_idx_r,
					error_r) < 0) {
			roaring_bitmap_free(bm);
			return -1;
		}
	}
	p += pos_len;
	if (p != end) {
		roaring_bitmap_free(bm);
		return seg_corrupt(error_r, "postings trailing bytes");
	}
	*docs_r = bm;
	return 1;
}

static const struct casidx_termsig *
seg_arena_get_termsig(struct casidx_segment *seg, struct seg_arena *arena)
{
	const struct arena_term *terms;
	const unsigned char *text = arena->text->data;
	unsigned int i, count;

	if (arena->termsig != NULL)
		return arena->termsig;
	terms = array_get(&arena->terms, &count);
	arena->termsig = casidx_termsig_create(count);
	for (i = 0; i < count; i++) {
		/* the term after its field char */
		casidx_termsig_add(arena->termsig, i,
				   text + terms[i].key_off + 1,
				   terms[i].key_len - 1);
	}
	seg->arena_terms_signed += count;
	return arena->termsig;
}

/* The dictionary blocks that can hold keys of namespace field_char:
   [*first_r, *last_r), from the sparse index (a block's first key and
   the next block's). */
static void seg_field_blocks(const struct casidx_segment *seg,
			     unsigned char field_char, unsigned int *first_r,
			     unsigned int *last_r)
{
	const struct sparse_entry *blocks;
	unsigned int count, lo = 0, hi, mid;

	blocks = array_get(&seg->sparse, &count);
	/* first block whose first key's char is >= field_char */
	hi = count;
	while (lo < hi) {
		mid = (lo + hi) / 2;
		if (blocks[mid].key[0] < field_char)
			lo = mid + 1;
		else
			hi = mid;
	}
	*first_r = lo == 0 ? 0 : lo - 1;
	/* first block whose first key's char is > field_char */
	hi = count;
	while (lo < hi) {
		mid = (lo + hi) / 2;
		if (blocks[mid].key[0] <= field_char)
			lo = mid + 1;
		else
			hi = mid;
	}
	*last_r = lo;
}

/* Decode and verify the dictionary blocks of namespace field_char into
   a new arena. */
static int seg_arena_build(struct casidx_segment *seg,
			   unsigned char field_char,
			   struct seg_arena **arena_r, const char **error_r)
{
	struct casidx_segment_iter *iter;
	const struct casidx_term_entry *e;
	const struct sparse_entry *blocks;
	struct seg_arena *arena;
	struct arena_term *t;
	unsigned int first, last, i;
	uint64_t dict_bytes = 0;
	int ret;

	/* sized from the blocks, so the arena is not grown (a grown
	   buffer is zero-filled to twice the size it needs) */
	seg_field_blocks(seg, field_char, &first, &last);
	blocks = array_front(&seg->sparse);
	for (i = first; i < last; i++)
		dict_bytes += blocks[i].size;
	arena = i_new(struct seg_arena, 1);
	arena->field_char = field_char;
	arena->text = buffer_create_dynamic(default_pool,
		I_MAX(dict_bytes * ARENA_TEXT_PER_DICT_BYTE, 64));
	i_array_init(&arena->terms, I_MAX((last - first) * SEG_BLOCK_TERMS, 1));
	iter = casidx_segment_iter_init(seg, &field_char, 1);
	while ((ret = casidx_segment_iter_next(iter, &e)) > 0) {
		t = array_append_space(&arena->terms);
		t->key_off = arena->text->used;
		t->key_len = e->key_len;
		t->df = e->df;
		t->post_off = e->post_offset;
		t->post_size = e->post_size;
		buffer_append(arena->text, e->key, e->key_len);
		buffer_append_c(arena->text, '\0');
	}
	if (casidx_segment_iter_deinit(&iter, error_r) < 0 || ret < 0) {
		seg_arena_free(&arena);
		return -1;
	}
	seg->arena_terms_decoded += array_count(&arena->terms);
	*arena_r = arena;
	return 0;
}

/* The decoded namespace field_char (decoded now if it was not). */
static int seg_arena_get(struct casidx_segment *seg, unsigned char field_char,
			 struct seg_arena **arena_r, const char **error_r)
{
	struct seg_arena *const *arenap;

	if (!array_is_created(&seg->arenas))
		i_array_init(&seg->arenas, 4);
	array_foreach(&seg->arenas, arenap) {
		if ((*arenap)->field_char == field_char) {
			*arena_r = *arenap;
			return 0;
		}
	}
	if (seg_arena_build(seg, field_char, arena_r, error_r) < 0)
		return -1;
	array_push_back(&seg->arenas, arena_r);
	return 0;
}

void casidx_segment_get_arena_stats(const struct casidx_segment *seg,
				    unsigned int *terms_decoded_r,
				    unsigned int *terms_signed_r)
{
	*terms_decoded_r = seg->arena_terms_decoded;
	*terms_signed_r = seg->arena_terms_signed;
}

/* The memmem() scan of find_substring() over the terms first..last-1
   of a namespace's arena. */
static int seg_arena_scan(struct casidx_segment *seg,
			  const struct seg_arena *arena, unsigned int first,
			  unsigned int last, const void *token,
			  size_t token_len,
			  casidx_segment_entry_callback_t *callback,
			  void *context, const char **error_r)
{
	const struct arena_term *terms = array_front(&arena->terms), *t;
	const unsigned char *text = arena->text->data;
	const unsigned char *p, *end, *hit;
	struct casidx_term_entry entry;
	unsigned int lo, hi, mid;
	int found = 0;

	p = text + terms[first].key_off;
	end = text + terms[last - 1].key_off + terms[last - 1].key_len;
	lo = first;
	while (p < end &&
	       (hit = memmem(p, end - p, token, token_len)) != NULL) {
		/* the term the hit is in: the last one starting at or
		   before it (hits never span a NUL: tokens have none) */
		hi = last;
		while (lo + 1 < hi) {
			mid = (lo + hi) / 2;
			if (text + terms[mid].key_off <= hit)
				lo = mid;
			else
				hi = mid;
		}
		t = &terms[lo];
		if (hit == text + t->key_off) {
			/* started at the field char: not in the term */
			p = hit + 1;
			continue;
		}
		entry.key = text + t->key_off;
		entry.key_len = t->key_len;
		entry.df = t->df;
		entry.post_offset = t->post_off;
		entry.post_size = t->post_size;
		if (callback(seg, &entry, context, error_r) < 0)
			return -1;
		found = 1;
		p = text + t->key_off + t->key_len + 1;
		lo++;
		if (lo >= last)
			break;
	}
	return found;
}

int casidx_segment_find_substring(struct casidx_segment *seg,
				  unsigned char field_char,
				  const void *token, size_t token_len,
				  casidx_segment_entry_callback_t *callback,
				  void *context, const char **error_r)
{
	ARRAY_TYPE(uint32_t) blocks;
	struct seg_arena *arena;
	const uint32_t *blk;
	unsigned int count, b_first, b_last;
	int ret, found = 0;

	i_assert(token_len > 0);
	if (seg_arena_get(seg, field_char, &arena, error_r) < 0)
		return -1;
	count = array_count(&arena->terms);
	if (count == 0)
		return 0;
	if (token_len < CASIDX_TERMSIG_MIN_NEEDLE) {
		return seg_arena_scan(seg, arena, 0, count, token, token_len,
				      callback, context, error_r);
	}
	/* heap, not the data stack: callers' error strings must outlive
	   this call */
	i_array_init(&blocks, 64);
	if (!casidx_termsig_candidates(seg_arena_get_termsig(seg, arena),
				       token, token_len, 0, count, &blocks))
		i_unreached();
	array_foreach(&blocks, blk) {
		b_first = *blk * CASIDX_TERMSIG_BLOCK_TERMS;
		b_last = I_MIN(count, b_first + CASIDX_TERMSIG_BLOCK_TERMS);
		ret = seg_arena_scan(seg, arena, b_first, b_last, token,
				     token_len, callback, context, error_r);
		if (ret < 0) {
			found = -1;
			break;
		}
		found |= ret;
	}
	array_free(&blocks);
	return found;
}

int casidx_segment_find_terms(struct casidx_segment *seg,
			      unsigned char field_char,
			      casidx_segment_term_filter_t *filter,
			      void *filter_context,
			      casidx_segment_entry_callback_t *callback,
			      void *context, const char **error_r)
{
	const struct arena_term *t;
	const unsigned char *text;
	struct casidx_term_entry entry;
	struct seg_arena *arena;
	int found = 0;

	if (seg_arena_get(seg, field_char, &arena, error_r) < 0)
		return -1;
	text = arena->text->data;
	array_foreach(&arena->terms, t) {
		if (!filter(text + t->key_off + 1, t->key_len - 1,
			    filter_context))
			continue;
		entry.key = text + t->key_off;
		entry.key_len = t->key_len;
		entry.df = t->df;
		entry.post_offset = t->post_off;
		entry.post_size = t->post_size;
		if (callback(seg, &entry, context, error_r) < 0)
			return -1;
		found = 1;
	}
	return found;
}
