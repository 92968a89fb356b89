#ifndef CHECK_RUN_H
#define CHECK_RUN_H

/* Every Check program's main() ends the same way: run the suite with
   its own runner and return the number of failed tests (make check
   reads the exit status). */

#include <check.h>

static inline int check_run_suite(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed;
}

#endif
