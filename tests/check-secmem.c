/* cas-secmem: freed locked buffers are wiped and reused for the same
   size only, read-only ones come back writable, the pool is bounded,
   and a key ring loaded again (a store opened per LMTP delivery) makes
   no new sodium_malloc(). */

#include "lib.h"
#include "cas-key.h"
#include "cas-secmem.h"

#include <check.h>
#include "check-run.h"
#include <sodium.h>
#include <stdlib.h>
#include <unistd.h>

static bool all_zero(const unsigned char *p, size_t size)
{
	size_t i;

	for (i = 0; i < size; i++) {
		if (p[i] != 0)
			return FALSE;
	}
	return TRUE;
}

START_TEST(test_reuse_wiped)
{
	unsigned char *p, *q;
	unsigned int allocs = cas_secmem_sodium_allocs;

	p = cas_secmem_alloc(100);
	memset(p, 0xab, 100);
	cas_secmem_free(p, 100);
	q = cas_secmem_alloc(100);
	ck_assert_ptr_eq(q, p);
	ck_assert(all_zero(q, 100));
	ck_assert_uint_eq(cas_secmem_sodium_allocs, allocs + 1);
	/* another size never gets it */
	cas_secmem_free(q, 100);
	q = cas_secmem_alloc(101);
	ck_assert_ptr_ne(q, p);
	ck_assert_uint_eq(cas_secmem_sodium_allocs, allocs + 2);
	cas_secmem_free(q, 101);
	cas_secmem_free(NULL, 5);
	cas_secmem_pool_deinit();
}
END_TEST

START_TEST(test_readonly_comes_back_writable)
{
	unsigned char *p, *q;

	p = cas_secmem_alloc(64);
	memset(p, 0x5a, 64);
	ck_assert_int_eq(sodium_mprotect_readonly(p), 0);
	cas_secmem_free_protected(p, 64);
	q = cas_secmem_alloc(64);
	ck_assert_ptr_eq(q, p);
	ck_assert(all_zero(q, 64));
	/* a SIGSEGV here fails the test (Check forks) */
	memset(q, 0x11, 64);
	ck_assert_uint_eq(q[63], 0x11);
	cas_secmem_free(q, 64);
	cas_secmem_pool_deinit();
}
END_TEST

START_TEST(test_pool_bounded)
{
	void *p[CAS_SECMEM_POOL_MAX + 4];
	unsigned int i, allocs;

	for (i = 0; i < N_ELEMENTS(p); i++)
		p[i] = cas_secmem_alloc(32);
	for (i = 0; i < N_ELEMENTS(p); i++)
		cas_secmem_free(p[i], 32);
	allocs = cas_secmem_sodium_allocs;
	for (i = 0; i < N_ELEMENTS(p); i++)
		p[i] = cas_secmem_alloc(32);
	/* the pool kept CAS_SECMEM_POOL_MAX of them */
	ck_assert_uint_eq(cas_secmem_sodium_allocs, allocs + 4);
	for (i = 0; i < N_ELEMENTS(p); i++)
		cas_secmem_free(p[i], 32);

	/* over the size limit: never pooled */
	allocs = cas_secmem_sodium_allocs;
	p[0] = cas_secmem_alloc(CAS_SECMEM_POOL_MAX_SIZE + 1);
	cas_secmem_free(p[0], CAS_SECMEM_POOL_MAX_SIZE + 1);
	p[0] = cas_secmem_alloc(CAS_SECMEM_POOL_MAX_SIZE + 1);
	ck_assert_uint_eq(cas_secmem_sodium_allocs, allocs + 2);
	cas_secmem_free(p[0], CAS_SECMEM_POOL_MAX_SIZE + 1);
	cas_secmem_pool_deinit();
}
END_TEST

START_TEST(test_keyring_reload_no_alloc)
{
	char dir[] = "/tmp/check-secmem.XXXXXX";
	struct cas_keyring *keyring;
	const char *path, *error;
	unsigned int allocs;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	path = t_strdup_printf("%s/user.key", dir);
	ck_assert_int_eq(cas_keyring_create(path, &keyring, &error), 1);
	cas_keyring_free(&keyring);
	ck_assert_int_eq(cas_keyring_load(path, &keyring, &error), 1);
	cas_keyring_free(&keyring);
	allocs = cas_secmem_sodium_allocs;
	ck_assert_int_eq(cas_keyring_load(path, &keyring, &error), 1);
	cas_keyring_free(&keyring);
	ck_assert_int_eq(cas_keyring_load(path, &keyring, &error), 1);
	ck_assert_uint_eq(cas_secmem_sodium_allocs, allocs);
	cas_keyring_free(&keyring);
	cas_secmem_pool_deinit();
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("secmem");
	TCase *tc = tcase_create("secmem");
	int failed;

	lib_init();
	if (sodium_init() < 0)
		return EXIT_FAILURE;
	tcase_add_test(tc, test_reuse_wiped);
	tcase_add_test(tc, test_readonly_comes_back_writable);
	tcase_add_test(tc, test_pool_bounded);
	tcase_add_test(tc, test_keyring_reload_no_alloc);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
