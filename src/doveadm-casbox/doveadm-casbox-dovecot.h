#ifndef DOVEADM_CASBOX_DOVECOT_H
#define DOVEADM_CASBOX_DOVECOT_H

/* The doveadm mail command API differences between Dovecot 2.3 and 2.4
   (CASBOX_DOVECOT_API from configure). The commands keep 2.3's shape:
   a parse_arg() per short option and init() with the positional
   arguments; on 2.4 doveadm-casbox-24.c feeds them from the command
   context. */

#include "doveadm-mail.h"

struct mail_user;

typedef bool casbox_doveadm_parse_arg_t(struct doveadm_mail_cmd_context *ctx,
					int c);

#if CASBOX_DOVECOT_API >= 24
/* 2.4: init() has no args; positional ones come from the cctx. */
#  define CASBOX_DOVEADM_INIT_PARAMS
#  define CASBOX_DOVEADM_ARGS(ctx, name) \
	casbox_doveadm_param_array(ctx, name)
/* A "username" column also for a single user (-u user), as 2.3's
   add_username_header gives: 2.4 adds doveadm's own only with -A, -F
   and wildcards. Call _init() first in init(), _run() first in run(). */
#  define CASBOX_DOVEADM_USERNAME_ALLOC(ctx)
void casbox_doveadm_username_init(struct doveadm_mail_cmd_context *ctx);
void casbox_doveadm_username_run(struct doveadm_mail_cmd_context *ctx,
				 struct mail_user *user);
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
#  define CASBOX_DOVEADM_USERNAME_ALLOC(ctx) \
	(ctx)->add_username_header = TRUE
#  define casbox_doveadm_username_init(ctx)
#  define casbox_doveadm_username_run(ctx, user)
#  define casbox_doveadm_set_parse_arg(ctx, opts, fn) \
	STMT_START { \
		(ctx)->getopt_args = (opts); \
		(ctx)->v.parse_arg = (fn); \
	} STMT_END
#endif

#endif
