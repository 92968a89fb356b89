dnl casbox-find-dovecot.m4: where dovecot-config is, when --with-dovecot
dnl is not given.
dnl
dnl Dovecot's own DC_DOVECOT looks only in $prefix/lib/dovecot, which is
dnl /usr/local/lib/dovecot for a plain ./configure, while Debian's
dnl dovecot-dev installs /usr/lib/dovecot/dovecot-config (bookworm's 2.3
dnl and trixie's 2.4 alike). Expand this before DC_DOVECOT: when the
dnl user gave no --with-dovecot, it sets with_dovecot to the first
dnl directory holding a dovecot-config, and DC_DOVECOT then takes it as
dnl if given. --with-dovecot=DIR still wins; when nothing is found the
dnl error names the package.

AC_DEFUN([CASBOX_FIND_DOVECOT], [
	AS_IF([test "x${with_dovecot+set}" != xset], [
		casbox_dc_prefix=$prefix
		test "x$casbox_dc_prefix" = xNONE && casbox_dc_prefix=$ac_default_prefix
		casbox_dc_dirs="$casbox_dc_prefix/lib/dovecot"
		for casbox_dc_dir in /usr/lib/dovecot /usr/local/lib/dovecot; do
			AS_CASE([" $casbox_dc_dirs "], [*" $casbox_dc_dir "*], [],
				[casbox_dc_dirs="$casbox_dc_dirs $casbox_dc_dir"])
		done
		AC_MSG_CHECKING([where dovecot-config is])
		casbox_dc_found=
		for casbox_dc_dir in $casbox_dc_dirs; do
			AS_IF([test -f "$casbox_dc_dir/dovecot-config"], [
				casbox_dc_found=$casbox_dc_dir
				break
			])
		done
		AS_IF([test -n "$casbox_dc_found"], [
			AC_MSG_RESULT([$casbox_dc_found])
			with_dovecot=$casbox_dc_found
		], [
			AC_MSG_RESULT([not found])
			AC_MSG_ERROR([dovecot-config not found in $casbox_dc_dirs: install the Debian package dovecot-dev, or give --with-dovecot=DIR (the directory holding dovecot-config)])
		])
	], [test "x$with_dovecot" = xno || test "x$with_dovecot" = xyes], [
		AC_MSG_ERROR([--with-dovecot needs a directory: --with-dovecot=DIR, where DIR holds dovecot-config])
	], [test ! -f "$with_dovecot/dovecot-config"], [
		AC_MSG_ERROR([--with-dovecot=$with_dovecot: no dovecot-config there (Debian's dovecot-dev installs /usr/lib/dovecot/dovecot-config)])
	])
])

dnl Expand right after DC_DOVECOT. --without-dovecot-install-dirs (what
dnl make distcheck configures with, so that it installs under its own
dnl prefix) makes DC_DOVECOT point every dovecot_* directory into our
dnl prefix, also the two we only read from: Dovecot's headers (config.h,
dnl for its version) and its libraries (the unit tests' rpath to
dnl libdovecot). Those two are taken from dovecot-config again. And
dnl its dovecot_moduledir='$(moduledir)' would loop with
dnl DC_DOVECOT_MODULEDIR's default moduledir=$(dovecot_moduledir): the
dnl modules go to $(libdir)/dovecot/modules under the prefix instead.
AC_DEFUN([CASBOX_DOVECOT_READ_DIRS], [
	AS_IF([test "x$use_install_dirs" = xno], [
		eval `grep '^dovecot_pkgincludedir=' "$dovecotdir/dovecot-config"`
		eval `grep '^dovecot_pkglibdir=' "$dovecotdir/dovecot-config"`
		dovecot_moduledir='$(libdir)/dovecot/modules'
	])
])
