/* BM25 arithmetic: known values, monotonicity, saturation, field
   weights and the edge cases stale statistics produce. */

#include "lib.h"
#include "casidx-bm25.h"

#include <check.h>
#include "check-run.h"
#include <math.h>
#include <stdlib.h>

static const struct casidx_bm25_params *P = &casidx_bm25_default_params;

START_TEST(test_known_values)
{
	/* ln(1 + 9.5 / 1.5) */
	ck_assert_double_eq_tol(casidx_bm25_idf(10, 1), 1.9924301646902063,
				1e-12);
	/* ln(1 + 0.5 / 10.5) */
	ck_assert_double_eq_tol(casidx_bm25_idf(10, 10), 0.0465200156348928,
				1e-12);
	/* tf=1 at average length: (k1 + 1) / (1 + k1) = 1 */
	ck_assert_double_eq_tol(casidx_bm25_tf_norm(P, 1, 100, 100.0), 1.0,
				1e-12);
	/* tf=2: 2 * 2.2 / (2 + 1.2) */
	ck_assert_double_eq_tol(casidx_bm25_tf_norm(P, 2, 100, 100.0),
				1.375, 1e-12);
	/* doc twice the average: 2.2 / (1 + 1.2 * 1.75) */
	ck_assert_double_eq_tol(casidx_bm25_tf_norm(P, 1, 200, 100.0),
				2.2 / 3.1, 1e-12);
	ck_assert_double_eq_tol(casidx_bm25_term_score(P, 2.0, 10, 1, 1,
						       100, 100.0),
				2.0 * 1.9924301646902063, 1e-12);
}
END_TEST

START_TEST(test_monotonic)
{
	uint32_t tf;
	double prev = 0, cur;

	/* rarer terms weigh more */
	ck_assert(casidx_bm25_idf(1000, 1) > casidx_bm25_idf(1000, 10));
	ck_assert(casidx_bm25_idf(1000, 10) > casidx_bm25_idf(1000, 999));
	/* more occurrences help, but saturate below k1 + 1 */
	for (tf = 1; tf < 1000; tf++) {
		cur = casidx_bm25_tf_norm(P, tf, 50, 50.0);
		ck_assert(cur > prev);
		ck_assert(cur < P->k1 + 1.0);
		prev = cur;
	}
	/* longer documents score lower for the same tf */
	ck_assert(casidx_bm25_tf_norm(P, 3, 10, 50.0) >
		  casidx_bm25_tf_norm(P, 3, 500, 50.0));
}
END_TEST

START_TEST(test_edges)
{
	struct casidx_bm25_params no_len = { .k1 = 1.2, .b = 0 };

	ck_assert_double_eq(casidx_bm25_tf_norm(P, 0, 10, 10.0), 0.0);
	/* stale df above N still positive and finite */
	ck_assert(casidx_bm25_idf(5, 9) > 0);
	ck_assert(isfinite(casidx_bm25_idf(0, 0)));
	/* no average (empty stats): no length normalisation */
	ck_assert_double_eq_tol(casidx_bm25_tf_norm(P, 1, 10, 0.0), 1.0,
				1e-12);
	/* b = 0 ignores length */
	ck_assert_double_eq_tol(casidx_bm25_tf_norm(&no_len, 1, 1000, 10.0),
				casidx_bm25_tf_norm(&no_len, 1, 1, 10.0),
				1e-12);
	ck_assert_double_eq(casidx_bm25_term_score(P, 0.0, 10, 1, 5, 3, 3.0),
			    0.0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("casidx-bm25");
	TCase *tc = tcase_create("bm25");
	int failed;

	tcase_add_test(tc, test_known_values);
	tcase_add_test(tc, test_monotonic);
	tcase_add_test(tc, test_edges);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
