/* BM25 arithmetic; formulas in casidx-bm25.h. */

#include "lib.h"
#include "casidx-bm25.h"

#include <math.h>

const struct casidx_bm25_params casidx_bm25_default_params = {
	.k1 = CASIDX_BM25_DEFAULT_K1,
	.b = CASIDX_BM25_DEFAULT_B,
};

double casidx_bm25_idf(uint64_t total_docs, uint64_t doc_freq)
{
	double n = total_docs, df = doc_freq;

	if (df > n)
		n = df; /* stale stats: never go negative */
	return log(1.0 + (n - df + 0.5) / (df + 0.5));
}

double casidx_bm25_tf_norm(const struct casidx_bm25_params *params,
			   uint32_t tf, uint32_t doc_len, double avg_len)
{
	double len_norm = 1.0;

	if (tf == 0)
		return 0;
	if (avg_len > 0)
		len_norm = 1.0 - params->b + params->b * doc_len / avg_len;
	return tf * (params->k1 + 1.0) / (tf + params->k1 * len_norm);
}

double casidx_bm25_term_score(const struct casidx_bm25_params *params,
			      double weight, uint64_t total_docs,
			      uint64_t doc_freq, uint32_t tf,
			      uint32_t doc_len, double avg_len)
{
	return weight * casidx_bm25_idf(total_docs, doc_freq) *
		casidx_bm25_tf_norm(params, tf, doc_len, avg_len);
}
