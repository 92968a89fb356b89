/* CRC32C: known answers (RFC 3720 B.4, LevelDB crc32c_test), hardware
   and software paths agree on every length and alignment, and running
   updates equal one-shot computation. */

#include "lib.h"
#include "cas-crc32c.h"

#include <check.h>
#include "check-run.h"
#include <stdlib.h>

START_TEST(test_known_answers)
{
	unsigned char buf[32];
	unsigned int i;

	memset(buf, 0, sizeof(buf));
	ck_assert_uint_eq(cas_crc32c(buf, sizeof(buf)), 0x8a9136aaU);
	memset(buf, 0xff, sizeof(buf));
	ck_assert_uint_eq(cas_crc32c(buf, sizeof(buf)), 0x62a8ab43U);
	for (i = 0; i < 32; i++)
		buf[i] = i;
	ck_assert_uint_eq(cas_crc32c(buf, sizeof(buf)), 0x46dd794eU);
	for (i = 0; i < 32; i++)
		buf[i] = 31 - i;
	ck_assert_uint_eq(cas_crc32c(buf, sizeof(buf)), 0x113fdb5cU);
	ck_assert_uint_eq(cas_crc32c("123456789", 9), 0xe3069283U);
	ck_assert_uint_eq(cas_crc32c("", 0), 0);
}
END_TEST

START_TEST(test_hw_equals_sw)
{
	unsigned char buf[1100];
	unsigned int i, off, len;

	for (i = 0; i < sizeof(buf); i++)
		buf[i] = (unsigned char)(i * 131 + 7);
	for (off = 0; off < 9; off++) {
		for (len = 0; len + off <= sizeof(buf); len += 37) {
			ck_assert_uint_eq(cas_crc32c(buf + off, len),
				cas_crc32c_update_sw(0, buf + off, len));
		}
	}
}
END_TEST

START_TEST(test_running_update)
{
	const char *s = "hello crc32c world, split anywhere";
	size_t n = strlen(s), split;
	uint32_t whole = cas_crc32c(s, n), crc;

	for (split = 0; split <= n; split++) {
		crc = cas_crc32c_update(0, s, split);
		crc = cas_crc32c_update(crc, s + split, n - split);
		ck_assert_uint_eq(crc, whole);
	}
}
END_TEST

START_TEST(test_mask_roundtrip)
{
	uint32_t crc = cas_crc32c("foo", 3);

	ck_assert_uint_ne(cas_crc32c_mask(crc), crc);
	ck_assert_uint_eq(cas_crc32c_unmask(cas_crc32c_mask(crc)), crc);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("crc32c");
	TCase *tc = tcase_create("crc32c");
	int failed;

	tcase_add_test(tc, test_known_answers);
	tcase_add_test(tc, test_hw_equals_sw);
	tcase_add_test(tc, test_running_update);
	tcase_add_test(tc, test_mask_roundtrip);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
