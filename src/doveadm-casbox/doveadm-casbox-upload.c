/* doveadm casbox upload: move the user's sealed packs to object storage
   now (casbox_pack_storage), ignoring the backoff of earlier failures,
   and say where the packs are. */

#include "lib.h"
#include "array.h"
#include "mail-user.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "casbox-store-objstore.h"
#include "doveadm-casbox.h"
#include "doveadm-casbox-dovecot.h"

struct casbox_upload_cmd_context {
	struct doveadm_mail_cmd_context ctx;
	/* -s: seal the pack appends go to first, so that everything
	   acknowledged is in object storage (before a disaster) */
	bool seal;
};

static void casbox_upload_print(struct casbox_admin *adm)
{
	struct casbox_store_upload_summary sum;

	casbox_store_upload_summary(adm->store, adm->root_dir, &sum);
	doveadm_print_num(sum.uploaded_packs);
	doveadm_print_num(sum.uploaded_bytes);
	doveadm_print_num(sum.local_packs);
	doveadm_print_num(sum.remote_packs);
}

static int
cmd_casbox_upload_run(struct doveadm_mail_cmd_context *ctx,
		      struct mail_user *user)
{
	struct casbox_upload_cmd_context *cctx =
		container_of(ctx, struct casbox_upload_cmd_context, ctx);
	struct casbox_admin *adm;
	const char *error;
	int ret;

	ret = casbox_admin_open(user, &adm, &error);
	if (ret <= 0)
		return casbox_admin_open_failed(ctx, "casbox upload", user,
						ret, error);
	/* packs are uploaded as they are: no key needed */
	if (casbox_admin_open_keys(adm, &error) < 0 &&
	    casbox_admin_open_packs_keyless(adm, &error) <= 0) {
		i_error("casbox upload: %s: %s", adm->root_dir, error);
		doveadm_mail_failed_error(ctx, MAIL_ERROR_TEMP);
		casbox_admin_close(&adm);
		return -1;
	}
	if (!casbox_store_has_remote(adm->store)) {
		i_error("casbox upload: %s: casbox_pack_storage is not set "
			"(packs stay local)", adm->root_dir);
		doveadm_mail_failed_error(ctx, MAIL_ERROR_PARAMS);
		casbox_admin_close(&adm);
		return -1;
	}
	T_BEGIN {
		ret = casbox_store_upload(adm->store, cctx->seal, &error);
		if (ret < 0) {
			i_error("casbox upload: %s: %s (the packs stay local; "
				"retried later)", adm->root_dir, error);
			doveadm_mail_failed_error(ctx, MAIL_ERROR_TEMP);
		}
		casbox_upload_print(adm);
	} T_END;
	casbox_admin_close(&adm);
	return ret < 0 ? -1 : 0;
}

static void cmd_casbox_upload_init(struct doveadm_mail_cmd_context *ctx
				   ATTR_UNUSED CASBOX_DOVEADM_INIT_PARAMS)
{
	static const char *const fields[] = {
		"uploaded_packs", "uploaded_bytes", "local_packs",
		"remote_packs",
	};
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(fields); i++) {
		doveadm_print_header(fields[i], fields[i],
				     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	}
}

static bool
cmd_casbox_upload_parse_arg(struct doveadm_mail_cmd_context *_ctx, int c)
{
	struct casbox_upload_cmd_context *ctx =
		container_of(_ctx, struct casbox_upload_cmd_context, ctx);

	if (c != 's')
		return FALSE;
	ctx->seal = TRUE;
	return TRUE;
}

struct doveadm_mail_cmd_context *cmd_casbox_upload_alloc(void)
{
	struct casbox_upload_cmd_context *ctx;

	ctx = doveadm_mail_cmd_alloc(struct casbox_upload_cmd_context);
	casbox_doveadm_set_parse_arg(&ctx->ctx, "s",
				     cmd_casbox_upload_parse_arg);
	ctx->ctx.v.init = cmd_casbox_upload_init;
	ctx->ctx.v.run = cmd_casbox_upload_run;
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return &ctx->ctx;
}
