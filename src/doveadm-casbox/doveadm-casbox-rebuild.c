/* doveadm casbox rebuild: rebuild mailbox indexes from the LSM records
   (doc/casbox-storage.md, "Rebuild"), one line per mailbox. With
   --from-packs, first the LSM itself from the packs
   (doveadm-casbox-frompacks.c). */

#include "lib.h"
#include "mail-namespace.h"
#include "mail-storage.h"
#include "mail-search.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "doveadm-mailbox-list-iter.h"
#include "casbox-storage.h"
#include "doveadm-casbox.h"
#include "doveadm-casbox-dovecot.h"

#include <sysexits.h>

struct casbox_rebuild_cmd_context {
	struct doveadm_mail_cmd_context ctx;
	bool from_packs;
};

int casbox_rebuild_mailbox(struct mailbox_list *list, const char *vname,
			   const char **error_r)
{
	struct mailbox *box;
	struct mailbox_status status;
	enum mail_error error_code;
	int ret;

	box = mailbox_alloc(list, vname, MAILBOX_FLAG_IGNORE_ACLS);
	if (mailbox_open(box) < 0 ||
	    mailbox_sync(box, MAILBOX_SYNC_FLAG_FORCE_RESYNC) < 0 ||
	    mailbox_get_status(box, STATUS_MESSAGES, &status) < 0) {
		*error_r = t_strdup(mailbox_get_last_internal_error(box,
							&error_code));
		ret = -1;
	} else {
		ret = status.messages;
	}
	mailbox_free(&box);
	return ret;
}

/* Rebuild one mailbox: a forced resync, which casbox turns into an index
   rebuild under the index sync lock. Returns 0 ok, -1 failed (printed
   and set on ctx). */
static int
casbox_rebuild_box(struct doveadm_mail_cmd_context *ctx,
		   const struct mailbox_info *info)
{
	struct mailbox *box;
	struct mailbox_status status;
	enum mail_error error_code;
	const char *error;
	int ret = 0;

	box = mailbox_alloc(info->ns->list, info->vname,
			    MAILBOX_FLAG_IGNORE_ACLS);
	doveadm_print(info->vname);
	if (strcmp(box->storage->name, CASBOX_STORAGE_NAME) != 0) {
		doveadm_print("");
		doveadm_print(t_strdup_printf("skipped: not casbox (%s)",
					      box->storage->name));
	} else if (mailbox_open(box) < 0 ||
		   mailbox_sync(box, MAILBOX_SYNC_FLAG_FORCE_RESYNC) < 0 ||
		   mailbox_get_status(box, STATUS_MESSAGES, &status) < 0) {
		error = mailbox_get_last_internal_error(box, &error_code);
		i_error("casbox rebuild: %s: %s", info->vname, error);
		doveadm_mail_failed_mailbox(ctx, box);
		doveadm_print("");
		doveadm_print(t_strconcat("failed: ", error, NULL));
		ret = -1;
	} else {
		doveadm_print(dec2str(status.messages));
		doveadm_print("rebuilt");
	}
	mailbox_free(&box);
	return ret;
}

static int
cmd_casbox_rebuild_run(struct doveadm_mail_cmd_context *ctx,
		       struct mail_user *user)
{
	struct casbox_rebuild_cmd_context *rctx =
		container_of(ctx, struct casbox_rebuild_cmd_context, ctx);
	const enum mailbox_list_iter_flags iter_flags =
		MAILBOX_LIST_ITER_RAW_LIST |
		MAILBOX_LIST_ITER_NO_AUTO_BOXES |
		MAILBOX_LIST_ITER_RETURN_NO_FLAGS |
		MAILBOX_LIST_ITER_STAR_WITHIN_NS;
	struct doveadm_mailbox_list_iter *iter;
	const struct mailbox_info *info;
	int ret = 0;

	if (rctx->from_packs)
		return casbox_frompacks_run(ctx, user);
	iter = doveadm_mailbox_list_iter_init(ctx, user, ctx->search_args,
					      iter_flags);
	while ((info = doveadm_mailbox_list_iter_next(iter)) != NULL) T_BEGIN {
		if (casbox_rebuild_box(ctx, info) < 0)
			ret = -1;
	} T_END;
	if (doveadm_mailbox_list_iter_deinit(&iter) < 0)
		ret = -1;
	return ret;
}

static void
cmd_casbox_rebuild_init(struct doveadm_mail_cmd_context *ctx
			CASBOX_DOVEADM_INIT_PARAMS)
{
	struct casbox_rebuild_cmd_context *rctx =
		container_of(ctx, struct casbox_rebuild_cmd_context, ctx);
	static const char *const all[] = { "*", NULL };
	const char *const *boxes = CASBOX_DOVEADM_ARGS(ctx, "mailbox-mask");

	if (rctx->from_packs) {
		if (boxes[0] != NULL) {
			i_fatal_status(EX_USAGE, "casbox rebuild --from-packs "
				       "rebuilds every mailbox: no mailbox "
				       "names");
		}
		casbox_frompacks_init_header();
		return;
	}
	if (boxes[0] == NULL)
		boxes = all;
	ctx->search_args = doveadm_mail_mailbox_search_args_build(boxes);
	doveadm_print_header_simple("mailbox");
	doveadm_print_header_simple("messages");
	doveadm_print_header_simple("result");
}

static bool
cmd_casbox_rebuild_parse_arg(struct doveadm_mail_cmd_context *_ctx, int c)
{
	struct casbox_rebuild_cmd_context *ctx =
		container_of(_ctx, struct casbox_rebuild_cmd_context, ctx);

	if (c != 'p')
		return FALSE;
	ctx->from_packs = TRUE;
	return TRUE;
}

struct doveadm_mail_cmd_context *cmd_casbox_rebuild_alloc(void)
{
	struct casbox_rebuild_cmd_context *ctx;

	ctx = doveadm_mail_cmd_alloc(struct casbox_rebuild_cmd_context);
	casbox_doveadm_set_parse_arg(&ctx->ctx, "p", cmd_casbox_rebuild_parse_arg);
	ctx->ctx.v.init = cmd_casbox_rebuild_init;
	ctx->ctx.v.run = cmd_casbox_rebuild_run;
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return &ctx->ctx;
}
