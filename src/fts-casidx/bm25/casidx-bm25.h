#ifndef CASIDX_BM25_H
#define CASIDX_BM25_H

/* BM25 ranking arithmetic (Robertson/Sparck Jones, Lucene/SQLite FTS5
   variant with a non-negative idf). Pure functions, no I/O.

     idf(N, df)   = ln(1 + (N - df + 0.5) / (df + 0.5))
     tfn(tf, dl)  = tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
     score        = sum over matched (term, field) of
                    weight(field) * idf * tfn

   Field weights let a subject or sender hit outrank a body hit
   (BM25F-style weighting per field, see doc/search-semantics.md). */

#define CASIDX_BM25_DEFAULT_K1 1.2
#define CASIDX_BM25_DEFAULT_B 0.75

struct casidx_bm25_params {
	double k1, b;
};

extern const struct casidx_bm25_params casidx_bm25_default_params;

/* Inverse document frequency; total_docs >= doc_freq. Always > 0. */
double casidx_bm25_idf(uint64_t total_docs, uint64_t doc_freq);
/* Saturated, length-normalised term frequency. tf = 0 gives 0; avg_len
   <= 0 disables length normalisation. */
double casidx_bm25_tf_norm(const struct casidx_bm25_params *params,
			   uint32_t tf, uint32_t doc_len, double avg_len);
/* weight * idf * tf_norm */
double casidx_bm25_term_score(const struct casidx_bm25_params *params,
			      double weight, uint64_t total_docs,
			      uint64_t doc_freq, uint32_t tf,
			      uint32_t doc_len, double avg_len);

#endif
