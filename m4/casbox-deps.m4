dnl casbox-deps.m4: dependency checks for casbox/casidx.
dnl Each failure names the Debian package that provides the missing piece.

AC_DEFUN([CASBOX_DOVECOT_HEADERS], [
	old_CPPFLAGS="$CPPFLAGS"
	CPPFLAGS="$CPPFLAGS -DHAVE_CONFIG_H $LIBDOVECOT_INCLUDE"
	AC_CHECK_HEADERS([mail-storage-private.h fts-api-private.h doveadm-mail.h],
		[], [AC_MSG_ERROR([Dovecot development headers not found: install the Debian package dovecot-dev])],
		[#include "lib.h"])
	AC_MSG_CHECKING([Dovecot version])
	DOVECOT_VERSION_STR=`sed -n 's/^#define DOVECOT_VERSION "\(.*\)"/\1/p' "$dovecot_pkgincludedir/config.h"`
	AC_MSG_RESULT([$DOVECOT_VERSION_STR])
	dnl The Dovecot glue has a 2.3 and a 2.4 form (*-23.c / *-24.c);
	dnl everything below it is the same for both.
	AS_CASE([$DOVECOT_VERSION_STR],
		[2.3.*], [CASBOX_DOVECOT_API=23],
		[2.4.*], [CASBOX_DOVECOT_API=24],
		[AC_MSG_ERROR([casbox needs Dovecot 2.3 or 2.4 (found "$DOVECOT_VERSION_STR")])])
	AC_SUBST([DOVECOT_VERSION_STR])
	AC_SUBST([CASBOX_DOVECOT_API])
	AM_CONDITIONAL([DOVECOT_24], [test "$CASBOX_DOVECOT_API" = 24])
	CPPFLAGS="$old_CPPFLAGS"
])

AC_DEFUN([CASBOX_REQUIRE_LIB], [
	dnl $1 = variable prefix, $2 = header, $3 = library, $4 = function,
	dnl $5 = Debian package
	AC_CHECK_HEADER([$2], [],
		[AC_MSG_ERROR([$2 not found: install the Debian package $5])])
	old_LIBS="$LIBS"
	AC_CHECK_LIB([$3], [$4], [$1_LIBS="-l$3"],
		[AC_MSG_ERROR([lib$3 lacks $4: install the Debian package $5])])
	LIBS="$old_LIBS"
	AC_SUBST([$1_LIBS])
])

AC_DEFUN([CASBOX_REQUIRE_DEPS], [
	PKG_PROG_PKG_CONFIG
	CASBOX_REQUIRE_LIB([ZSTD], [zstd.h], [zstd], [ZDICT_trainFromBuffer], [libzstd-dev])
	CASBOX_REQUIRE_LIB([SODIUM], [sodium.h], [sodium], [crypto_aead_xchacha20poly1305_ietf_encrypt], [libsodium-dev])
	dnl Debian's libroaring-dev ships no pkg-config file.
	CASBOX_REQUIRE_LIB([ROARING], [roaring/roaring.h], [roaring], [roaring_bitmap_portable_deserialize_safe], [libroaring-dev])
	dnl ICU: UAX #29 word breaks and normalisation for the casidx
	dnl tokenizer (Debian's dovecot-core already depends on libicu72).
	PKG_CHECK_MODULES([ICU], [icu-uc], [],
		[AC_MSG_ERROR([ICU not found: install the Debian package libicu-dev])])
	PKG_CHECK_MODULES([CHECK], [check >= 0.11], [],
		[AC_MSG_ERROR([Check unit test framework not found: install the Debian package check])])
])

dnl Peers for bench/ only: optional, the build does not need them.
AC_DEFUN([CASBOX_BENCH_PEERS], [
	AC_CHECK_LIB([leveldb], [leveldb_open], [LEVELDB_LIBS=-lleveldb],
		[LEVELDB_LIBS=])
	AC_CHECK_LIB([sqlite3], [sqlite3_open_v2], [SQLITE_LIBS=-lsqlite3],
		[SQLITE_LIBS=])
	AC_SUBST([LEVELDB_LIBS])
	AC_SUBST([SQLITE_LIBS])
])

AC_DEFUN([CASBOX_WERROR], [
	AC_ARG_ENABLE([werror],
		AS_HELP_STRING([--enable-werror], [Treat warnings as errors (CI does)]),
		[], [enable_werror=no])
	AS_IF([test "x$enable_werror" = xyes], [CFLAGS="$CFLAGS -Werror"])
])

AC_DEFUN([CASBOX_SANITIZERS], [
	AC_ARG_ENABLE([sanitizers],
		AS_HELP_STRING([--enable-sanitizers], [Build with ASan and UBSan (unit tests only; never load into a running Dovecot)]),
		[], [enable_sanitizers=no])
	AS_IF([test "x$enable_sanitizers" = xyes],
		[CFLAGS="$CFLAGS -fsanitize=address,undefined -fno-omit-frame-pointer"
		 LDFLAGS="$LDFLAGS -fsanitize=address,undefined"])
])


dnl AECS export (doveadm casbox aecs): SQLite 3.24+ for upserts, FTS5.
AC_DEFUN([CASBOX_REQUIRE_SQLITE], [
	PKG_CHECK_MODULES([SQLITE3], [sqlite3 >= 3.24], [],
		[AC_MSG_ERROR([SQLite 3.24+ not found: install the Debian package libsqlite3-dev])])
])
