/* doveadm casbox: Dovecot 2.4 glue for the commands' 2.3 shape. */

#include "lib.h"
#include "doveadm.h"
#include "doveadm-cmd-parse.h"
#include "doveadm-mail.h"
#include "doveadm-print.h"
#include "mail-user.h"
#include "doveadm-casbox-dovecot.h"

#include <unistd.h>

/* doveadm runs one mail command at a time in a process (the CLI, or a
   doveadm-server connection), so the one being set up is kept here. */
static const char *casbox_parse_opts;
static casbox_doveadm_parse_arg_t *casbox_parse_arg;

static void casbox_doveadm_preinit(struct doveadm_mail_cmd_context *ctx)
{
	const struct doveadm_cmd_context *cctx = ctx->cctx;
	int i;

	for (i = 0; i < cctx->argc; i++) {
		const struct doveadm_cmd_param *arg = &cctx->argv[i];

		if (!arg->value_set || arg->short_opt == '\0' ||
		    strchr(casbox_parse_opts, arg->short_opt) == NULL)
			continue;
		if (arg->type == CMD_PARAM_STR)
			optarg = (char *)arg->value.v_string;
		else
			optarg = NULL;
		if (!casbox_parse_arg(ctx, arg->short_opt))
			i_fatal_status(EX_USAGE, "Invalid parameter %c",
				       arg->short_opt);
	}
}

void casbox_doveadm_set_parse_arg(struct doveadm_mail_cmd_context *ctx,
				  const char *opts,
				  casbox_doveadm_parse_arg_t *parse_arg)
{
	/* a later call replaces an earlier one (key rotate's options
	   replace those of the key commands it shares alloc with) */
	i_assert(ctx->v.preinit == NULL ||
		 ctx->v.preinit == casbox_doveadm_preinit);
	casbox_parse_opts = opts;
	casbox_parse_arg = parse_arg;
	ctx->v.preinit = casbox_doveadm_preinit;
}

const char *const *
casbox_doveadm_param_array(struct doveadm_mail_cmd_context *ctx,
			   const char *name)
{
	static const char *const empty[] = { NULL };
	const char *const *args;

	if (!doveadm_cmd_param_array(ctx->cctx, name, &args))
		return empty;
	return args;
}

void casbox_doveadm_username_init(struct doveadm_mail_cmd_context *ctx)
{
	if (ctx->iterate_single_user) {
		doveadm_print_header("username", "Username",
				     DOVEADM_PRINT_HEADER_FLAG_STICKY |
				     DOVEADM_PRINT_HEADER_FLAG_HIDE_TITLE);
	}
}

void casbox_doveadm_username_run(struct doveadm_mail_cmd_context *ctx,
				 struct mail_user *user)
{
	if (ctx->iterate_single_user)
		doveadm_print_sticky("username", user->username);
}
