dnl Object-store backends for sealed packs (doc/casbox-storage.md,
dnl "Packs in object storage"). Both are optional: without them the
dnl local and dir: backends remain, and the tests that need RADOS or S3
dnl say why they skip.
AC_DEFUN([CASBOX_OBJSTORE], [
	AC_ARG_WITH([rados],
		AS_HELP_STRING([--with-rados], [RADOS pack backend (librados; default: auto)]),
		[], [with_rados=auto])
	RADOS_LIBS=
	AS_IF([test "x$with_rados" != xno], [
		AC_CHECK_HEADER([rados/librados.h],
			[AC_CHECK_LIB([rados], [rados_ioctx_pool_requires_alignment2],
				[RADOS_LIBS=-lrados], [])], [])
		AS_IF([test "x$RADOS_LIBS" = x && test "x$with_rados" = xyes],
			[AC_MSG_ERROR([librados not found: install the Debian package librados-dev])])
	])
	AS_IF([test "x$RADOS_LIBS" != x], [have_rados=yes], [have_rados=no])
	AC_SUBST([RADOS_LIBS])
	AM_CONDITIONAL([HAVE_RADOS], [test "x$have_rados" = xyes])

	AC_ARG_WITH([s3],
		AS_HELP_STRING([--with-s3], [S3 pack backend (libcurl with CURLOPT_AWS_SIGV4; default: auto)]),
		[], [with_s3=auto])
	CURL_CFLAGS=
	CURL_LIBS=
	have_s3=no
	AS_IF([test "x$with_s3" != xno], [
		PKG_CHECK_MODULES([CURL], [libcurl >= 7.75], [have_s3=yes], [have_s3=no])
		AS_IF([test "x$have_s3" = xno && test "x$with_s3" = xyes],
			[AC_MSG_ERROR([libcurl 7.75+ not found: install the Debian package libcurl4-openssl-dev])])
	])
	AC_SUBST([CURL_CFLAGS])
	AC_SUBST([CURL_LIBS])
	AM_CONDITIONAL([HAVE_S3], [test "x$have_s3" = xyes])
])
