#ifndef DOVEADM_CASBOX_DOVECOT_H
#define DOVEADM_CASBOX_DOVECOT_H

/* The doveadm mail command API differences between Dovecot 2.3 and 2.4
   (CASBOX_DOVECOT_API from configure). The commands keep 2.3's shape:
   a parse_arg() per short option and init() with the positional
   arguments; on 2.4 doveadm-casbox-24.c feeds them from the command
   context. */

#include "doveadm-mail.h"

typedef bool casbox_doveadm_parse_arg_t(struct doveadm_mail_cmd_context *ctx,
					int c);

#if CASBOX_DOVECOT_API >= 24
/* 2.4: init() has no args; positional ones come from the cctx. */
#  define CASBOX_DOVEADM_INIT_PARAMS
#  define CASBOX_DOVEADM_ARGS(ctx, name) \
	casbox_doveadm_param_array(ctx, name)
/* 2.4 has no add_username_header: its username column appears with -A,
   -F and wildcards only. */
#  define CASBOX_DOVEADM_ADD_USERNAME_HEADER(ctx)
/* Call parse_arg(ctx, c) for each option of opts given (optarg set),
   from the command's preinit(), as 2.3's doveadm did before init(). */
void casbox_doveadm_set_parse_arg(struct doveadm_mail_cmd_context *ctx,
				  const char *opts,
				  casbox_doveadm_parse_arg_t *parse_arg);
/* The named positional array parameter, an empty array when unset. */
const char *const *
casbox_doveadm_param_array(struct doveadm_mail_cmd_context *ctx,
			   const char *name);
#else
#  define CASBOX_DOVEADM_INIT_PARAMS , const char *const args[] ATTR_UNUSED
#  define CASBOX_DOVEADM_ARGS(ctx, name) (args)
#  define CASBOX_DOVEADM_ADD_USERNAME_HEADER(ctx) \
	(ctx)->add_username_header = TRUE
#  define casbox_doveadm_set_parse_arg(ctx, opts, fn) \
	STMT_START { \
		(ctx)->getopt_args = (opts); \
		(ctx)->v.parse_arg = (fn); \
	} STMT_END
#endif

#endif
