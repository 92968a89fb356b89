#ifndef CASIDX_TERMSIG_H
#define CASIDX_TERMSIG_H

/* Trigram signatures over a sorted term list, so a substring lookup
   reads only the terms that can contain the needle (doc/casidx-format.md,
   "Substring lookups"). The terms are cut into blocks of
   CASIDX_TERMSIG_BLOCK_TERMS consecutive terms; every trigram (3 bytes)
   of every term sets one of CASIDX_TERMSIG_ROWS hashed bits of its
   block. The bits are stored bit-sliced (one row of nblocks bits per
   hash value), so the candidate blocks of a needle are the AND of the
   rows of its trigrams: a block holding a term that contains the needle
   has every one of those bits set, so no match is ever filtered out,
   while a block without one passes only if all its bits collide.

   Memory: CASIDX_TERMSIG_ROWS / 8 bytes per block (8 bytes a term);
   in memory only, built from the verified dictionary, wiped when
   freed. Include lib.h and array.h first. */

#define CASIDX_TERMSIG_BLOCK_TERMS 32
#define CASIDX_TERMSIG_ROWS 2048
/* shortest needle the signatures can narrow down */
#define CASIDX_TERMSIG_MIN_NEEDLE 3

struct casidx_termsig;

/* For term_count terms, added with casidx_termsig_add() in any order. */
struct casidx_termsig *casidx_termsig_create(unsigned int term_count);
/* Wipes and frees; NULL-safe. */
void casidx_termsig_free(struct casidx_termsig **sig);
/* Record the trigrams of term number term_idx (< term_count). */
void casidx_termsig_add(struct casidx_termsig *sig, unsigned int term_idx,
			const unsigned char *term, size_t term_len);

/* The blocks that may hold a term containing needle among the terms
   first..last-1, in ascending order, appended to blocks_r (block b =
   terms b * CASIDX_TERMSIG_BLOCK_TERMS .. + CASIDX_TERMSIG_BLOCK_TERMS
   - 1). Returns FALSE, appending nothing, if needle is shorter than
   CASIDX_TERMSIG_MIN_NEEDLE: then every term is a candidate. */
bool casidx_termsig_candidates(const struct casidx_termsig *sig,
			       const unsigned char *needle, size_t needle_len,
			       unsigned int first, unsigned int last,
			       ARRAY_TYPE(uint32_t) *blocks_r);

#endif
