/* Fuzz the casidx segment decoder (doc/casidx-format.md): any input is
   either rejected with an error or fully readable, and a readable one
   keeps the invariants readers rely on: keys strictly ascending, every
   posting a subset of the segment's docs with one tf per doc, at most
   tf positions per doc, strictly ascending.
   libFuzzer: clang -fsanitize=fuzzer,address -DCASIDX_LIBFUZZER ...
   Otherwise main() replays files or directories given as arguments, by
   default $CASBOX_TOP_SRCDIR/tests/fuzz/corpus/segment (make check,
   shared driver in fuzz-replay.c);
   `fuzz-segment --make-corpus DIR` writes the seed segments.
   Every input is also opened as a sealed file (casidx-crypt.h) with a
   fixed fuzzing key: only an authentic one (the "sealed" seed) may
   decrypt, and its plaintext goes through the segment decoder too. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "str.h"
#include "cas-key.h"
#include "casidx-crypt.h"
#include "casidx-segment.h"
#include "fuzz-replay.h"

#define FUZZ_GUID "00000000000000000000000000000001"
#define FUZZ_SEG_NAME "seg-00000001.cxs"
static const unsigned char fuzz_kek[CAS_KEK_SIZE] = { 0xf7 };
static struct cas_keyring *fuzz_keyring;
static unsigned int sealed_opened;

static void check_segment(struct casidx_segment *seg)
{
	struct casidx_segment_iter *iter;
	const struct casidx_term_entry *e;
	ARRAY_TYPE(uint32_t) tfs, pos, pos_idx;
	roaring_bitmap_t *docs;
	buffer_t *prev = t_buffer_create(64);
	const char *error;
	const uint32_t *idx, *codes;
	unsigned int f, i, j, n;
	int cmp;

	for (f = 0; f < CASIDX_FIELD_COUNT; f++) {
		(void)casidx_segment_field_total(seg, f);
		(void)casidx_segment_doc_len(seg, 1, f);
	}
	t_array_init(&tfs, 16);
	t_array_init(&pos, 16);
	t_array_init(&pos_idx, 16);
	iter = casidx_segment_iter_init(seg, NULL, 0);
	while (casidx_segment_iter_next(iter, &e) > 0) {
		if (prev->used > 0) {
			cmp = memcmp(prev->data, e->key,
				     I_MIN(prev->used, e->key_len));
			if (cmp > 0 || (cmp == 0 && prev->used >= e->key_len))
				i_panic("keys not ascending");
		}
		buffer_set_used_size(prev, 0);
		buffer_append(prev, e->key, e->key_len);
		if (casidx_segment_read_positions(seg, e, &docs, &tfs, &pos,
						  &pos_idx, &error) < 0)
			continue;
		if (!roaring_bitmap_is_subset(docs,
					      casidx_segment_get_docs(seg)) ||
		    roaring_bitmap_get_cardinality(docs) != array_count(&tfs))
			i_panic("posting invariants broken");
		n = array_count(&tfs);
		if (array_count(&pos_idx) != n + 1)
			i_panic("position index size");
		idx = array_front(&pos_idx);
		codes = array_count(&pos) == 0 ? NULL : array_front(&pos);
		for (i = 0; i < n; i++) {
			if (idx[i + 1] < idx[i] ||
			    idx[i + 1] - idx[i] > (*array_idx(&tfs, i)))
				i_panic("position count invariant broken");
			for (j = idx[i] + 1; j < idx[i + 1]; j++) {
				if (CASIDX_POS_OF(codes[j]) <
				    CASIDX_POS_OF(codes[j - 1]) ||
				    (codes[j] <= codes[j - 1] &&
				     CASIDX_POS_KIND(codes[j]) !=
				     CASIDX_POS_KIND_PART))
					i_panic("positions not ascending");
			}
		}
		if (idx[n] != array_count(&pos))
			i_panic("position index end");
		roaring_bitmap_free(docs);
	}
	(void)casidx_segment_iter_deinit(&iter, &error);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct casidx_segment *seg;
	const char *error;

	if (!lib_is_initialized())
		lib_init();
	if (fuzz_keyring == NULL)
		fuzz_keyring = cas_keyring_create_from_kek(fuzz_kek);
	T_BEGIN {
		buffer_t *plain = NULL;

		if (casidx_segment_open_buf(data, size, &seg, &error) > 0) {
			check_segment(seg);
			casidx_segment_close(&seg);
		}
		if (casidx_crypt_open(fuzz_keyring, FUZZ_GUID, FUZZ_SEG_NAME,
				      data, size, &plain, &error) > 0) {
			sealed_opened++;
			if (casidx_segment_open_owned(&plain, &seg,
						      &error) > 0) {
				check_segment(seg);
				casidx_segment_close(&seg);
			}
		} else if (plain != NULL) {
			i_panic("failed open left plaintext behind");
		}
		if (plain != NULL)
			buffer_free(&plain);
	} T_END;
	return 0;
}

#ifndef CASIDX_LIBFUZZER
/* the "sealed" seed reaches the decoder through decryption */
static const char *fuzz_segment_corpus_check(void)
{
	return sealed_opened == 0 ? "no sealed input decrypted" : NULL;
}

/* positions: body words get position codes (every third one without
   the space flag) */
static void write_seed(const char *dir, const char *name,
		       unsigned int ndocs, unsigned int nwords, bool positions)
{
	struct casidx_builder *b = casidx_builder_create();
	const char *error, *word;
	unsigned int uid, i;

	for (uid = 1; uid <= ndocs; uid++) {
		casidx_builder_add_doc(b, uid * 3);
		for (i = 0; i < nwords; i++) {
			word = t_strdup_printf("w%u", (uid * 7 + i) % 37);
			casidx_builder_add_term_pos(b,
				positions ? CASIDX_FIELD_BODY :
				i % CASIDX_FIELD_COUNT, word, strlen(word),
				positions ? CASIDX_POS_CODE(i, i % 4 == 3 ?
					CASIDX_POS_KIND_PART : i % 3 != 0) :
				CASIDX_POS_NONE);
		}
	}
	if (casidx_builder_write(b, t_strconcat(dir, "/", name, NULL),
				 FALSE, &error) < 0)
		i_fatal("%s", error);
	casidx_builder_destroy(&b);
}

/* A segment sealed with the fuzzing key: the one input that decrypts. */
static void write_sealed_seed(const char *dir, const char *name)
{
	struct casidx_builder *b = casidx_builder_create();
	buffer_t *plain = buffer_create_dynamic(default_pool, 1024);
	buffer_t *sealed;
	struct cas_keyring *keyring = cas_keyring_create_from_kek(fuzz_kek);
	const char *error;

	casidx_builder_add_doc(b, 5);
	casidx_builder_add_term(b, CASIDX_FIELD_BODY, "sealed", 6);
	casidx_builder_add_term(b, CASIDX_FIELD_SUBJECT, "seed", 4);
	casidx_builder_serialize(b, plain);
	sealed = casidx_crypt_seal(keyring, FUZZ_GUID, FUZZ_SEG_NAME,
				   plain->data, plain->used);
	if (casidx_file_write(t_strconcat(dir, "/", name, NULL), sealed->data,
			      sealed->used, FALSE, &error) < 0)
		i_fatal("%s", error);
	cas_keyring_free(&keyring);
	buffer_free(&sealed);
	buffer_free(&plain);
	casidx_builder_destroy(&b);
}

int main(int argc, char *argv[])
{
	if (argc == 3 && strcmp(argv[1], "--make-corpus") == 0) {
		lib_init();
		write_seed(argv[2], "empty", 0, 0, FALSE);
		write_seed(argv[2], "no-terms", 3, 0, FALSE);
		write_seed(argv[2], "small", 4, 5, FALSE);
		write_seed(argv[2], "blocks", 40, 20, FALSE);
		write_seed(argv[2], "positions", 12, 60, TRUE);
		write_sealed_seed(argv[2], "sealed");
		lib_deinit();
		return 0;
	}
	return fuzz_replay_main("segment", argc, argv,
				fuzz_segment_corpus_check);
}
#endif
