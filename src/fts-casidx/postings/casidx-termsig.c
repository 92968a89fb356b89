/* Trigram signatures over term blocks; see casidx-termsig.h. */

#include "lib.h"
#include "array.h"
#include "safe-memset.h"
#include "casidx-termsig.h"

#define ROW_BITS 11	/* log2(CASIDX_TERMSIG_ROWS) */
/* distinct trigrams of a needle that take part: more only narrow the
   candidates further, which the memmem() of each block does anyway */
#define NEEDLE_MAX_TRIGRAMS 16

struct casidx_termsig {
	unsigned int nblocks, nwords;
	/* CASIDX_TERMSIG_ROWS rows of nwords 64-bit words */
	uint64_t *rows;
};

static inline unsigned int trigram_row(const unsigned char *p)
{
	uint32_t v = p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16);

	/* multiplicative hashing: the top bits mix all three bytes */
	return (v * 0x9E3779B1U) >> (32 - ROW_BITS);
}

struct casidx_termsig *casidx_termsig_create(unsigned int term_count)
{
	struct casidx_termsig *sig = i_new(struct casidx_termsig, 1);

	sig->nblocks = (term_count + CASIDX_TERMSIG_BLOCK_TERMS - 1) /
		CASIDX_TERMSIG_BLOCK_TERMS;
	sig->nwords = I_MAX((sig->nblocks + 63) / 64, 1);
	/* @UNSAFE: ROWS * nwords words */
	sig->rows = i_new(uint64_t, (size_t)CASIDX_TERMSIG_ROWS * sig->nwords);
	return sig;
}

void casidx_termsig_free(struct casidx_termsig **_sig)
{
	struct casidx_termsig *sig = *_sig;

	if (sig == NULL)
		return;
	*_sig = NULL;
	safe_memset(sig->rows, 0,
		    sizeof(uint64_t) * CASIDX_TERMSIG_ROWS * sig->nwords);
	i_free(sig->rows);
	i_free(sig);
}

void casidx_termsig_add(struct casidx_termsig *sig, unsigned int term_idx,
			const unsigned char *term, size_t term_len)
{
	unsigned int block = term_idx / CASIDX_TERMSIG_BLOCK_TERMS;
	uint64_t bit = 1ULL << (block % 64);
	size_t i;

	i_assert(block < sig->nblocks);
	for (i = 0; i + 3 <= term_len; i++)
		sig->rows[(size_t)trigram_row(term + i) * sig->nwords +
			  block / 64] |= bit;
}

bool casidx_termsig_candidates(const struct casidx_termsig *sig,
			       const unsigned char *needle, size_t needle_len,
			       unsigned int first, unsigned int last,
			       ARRAY_TYPE(uint32_t) *blocks_r)
{
	unsigned int rows[NEEDLE_MAX_TRIGRAMS], nrows = 0, r, j;
	unsigned int first_blk, last_blk, w;
	uint64_t acc;
	uint32_t blk;
	size_t i;

	if (needle_len < CASIDX_TERMSIG_MIN_NEEDLE)
		return FALSE;
	if (first >= last)
		return TRUE;
	for (i = 0; i + 3 <= needle_len && nrows < N_ELEMENTS(rows); i++) {
		r = trigram_row(needle + i);
		for (j = 0; j < nrows && rows[j] != r; j++) ;
		if (j == nrows)
			rows[nrows++] = r;
	}
	first_blk = first / CASIDX_TERMSIG_BLOCK_TERMS;
	last_blk = (last - 1) / CASIDX_TERMSIG_BLOCK_TERMS;
	i_assert(last_blk < sig->nblocks);
	for (w = first_blk / 64; w <= last_blk / 64; w++) {
		acc = sig->rows[(size_t)rows[0] * sig->nwords + w];
		for (j = 1; j < nrows && acc != 0; j++)
			acc &= sig->rows[(size_t)rows[j] * sig->nwords + w];
		while (acc != 0) {
			blk = w * 64 + __builtin_ctzll(acc);
			acc &= acc - 1;
			if (blk >= first_blk && blk <= last_blk)
				array_push_back(blocks_r, &blk);
		}
	}
	return TRUE;
}
