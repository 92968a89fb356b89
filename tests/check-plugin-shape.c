/* Plugin shape: every module resolves all of its symbols against the
   libraries the host Dovecot process has loaded, and exports the
   version/init/deinit symbols module-dir.c looks up. Catches a missing
   library or a typo'd symbol at build time instead of at login. */

#include "lib.h"

#include <check.h>
#include "check-run.h"
#include <dlfcn.h>
#include <stdlib.h>

#define DOVECOT_LIBDIR "/usr/lib/dovecot"

static const char *build_path(const char *rel)
{
	const char *top = getenv("CASBOX_TOP_BUILDDIR");

	if (top == NULL)
		top = CASBOX_BUILD_TOP;
	return t_strconcat(top, "/", rel, NULL);
}

static void *preload(const char *path, int mode)
{
	void *h = dlopen(path, mode | RTLD_GLOBAL);

	ck_assert_msg(h != NULL, "dlopen(%s): %s", path, dlerror());
	return h;
}

static void check_module(void *h, const char *name)
{
	const char *const *version;

	version = dlsym(h, t_strconcat(name, "_version", NULL));
	ck_assert_msg(version != NULL, "%s_version missing", name);
	ck_assert_str_eq(*version, DOVECOT_ABI_VERSION);
	ck_assert_msg(dlsym(h, t_strconcat(name, "_init", NULL)) != NULL,
		      "%s_init missing", name);
	ck_assert_msg(dlsym(h, t_strconcat(name, "_deinit", NULL)) != NULL,
		      "%s_deinit missing", name);
}

START_TEST(test_casbox_plugin_resolves)
{
	void *h;

	preload(DOVECOT_LIBDIR "/libdovecot-storage.so.0", RTLD_NOW);
	h = dlopen(build_path("src/storage-casbox/.libs/"
			      "lib20_casbox_plugin.so"), RTLD_NOW);
	ck_assert_msg(h != NULL, "dlopen: %s", dlerror());
	check_module(h, "casbox_plugin");
	ck_assert_msg(dlsym(h, "casbox_storage") != NULL,
		      "casbox_storage class not exported");
}
END_TEST

START_TEST(test_fts_casidx_plugin_resolves)
{
	const char *const *deps;
	void *h;

	preload(DOVECOT_LIBDIR "/libdovecot-storage.so.0", RTLD_NOW);
	preload(DOVECOT_LIBDIR "/modules/lib20_fts_plugin.so", RTLD_NOW);
	h = dlopen(build_path("src/fts-casidx/.libs/"
			      "lib21_fts_casidx_plugin.so"), RTLD_NOW);
	ck_assert_msg(h != NULL, "dlopen: %s", dlerror());
	check_module(h, "fts_casidx_plugin");
	deps = dlsym(h, "fts_casidx_plugin_dependencies");
	ck_assert_msg(deps != NULL, "dependencies missing");
	ck_assert_str_eq(deps[0], "fts");
	ck_assert_ptr_null(deps[1]);
}
END_TEST

START_TEST(test_doveadm_plugin_exports)
{
	void *h;

	/* doveadm's own symbols live in the doveadm binary, so only the
	   lazy binding can be checked here; e2e proves the real load. */
	h = dlopen(build_path("src/doveadm-casbox/.libs/"
			      "lib10_doveadm_casbox_plugin.so"), RTLD_LAZY);
	ck_assert_msg(h != NULL, "dlopen: %s", dlerror());
	check_module(h, "doveadm_casbox_plugin");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("plugin-shape");
	TCase *tc = tcase_create("dlopen");
	int failed;

	lib_init();
	tcase_add_test(tc, test_casbox_plugin_resolves);
	tcase_add_test(tc, test_fts_casidx_plugin_resolves);
	tcase_add_test(tc, test_doveadm_plugin_exports);
	suite_add_tcase(s, tc);
	failed = check_run_suite(s);
	lib_deinit();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
