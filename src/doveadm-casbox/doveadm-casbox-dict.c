/* doveadm casbox dict train: train a zstd dictionary from the header
   blocks of the user's small stored blobs and measure what it saves on
   header blocks held out of the training. Only header blocks: a
   dictionary trained on bodies would carry the user's body text into
   the compression of every later small blob, including mail an
   attacker sends (doc/threat-model.md). */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "istream.h"
#include "mail-user.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "doveadm-casbox.h"
#include "doveadm-casbox-dovecot.h"

#include <sysexits.h>

/* at most this many training samples, and one held-out blob for every
   DICT_HOLDOUT_EVERY eligible ones (up to DICT_MAX_HELDOUT) */
#define DICT_MAX_SAMPLES 2000
#define DICT_HOLDOUT_EVERY 5
#define DICT_MAX_HELDOUT 500

static int
cmd_casbox_dict_train_run(struct doveadm_mail_cmd_context *ctx,
			  struct mail_user *user)
{
	struct casbox_store_dict_train_result res;
	struct casbox_admin *adm;
	const char *error;
	int ret;

	ret = casbox_admin_open(user, &adm, &error);
	if (ret <= 0) {
		return casbox_admin_open_failed(ctx, "casbox dict train",
						user, ret, error);
	}
	i_zero(&res);
	T_BEGIN {
		ret = casbox_admin_open_keys(adm, &error) < 0 ? -1 :
			casbox_store_dict_train(adm->store, DICT_MAX_SAMPLES,
						DICT_HOLDOUT_EVERY,
						DICT_MAX_HELDOUT, &res, &error);
	} T_END_PASS_STR_IF(ret <= 0, &error);
	casbox_admin_close(&adm);
	if (ret <= 0) {
		i_error("casbox dict train: %s", error);
		ctx->exit_code = EX_DATAERR;
		return -1;
	}
	doveadm_print_num(res.dict_id);
	doveadm_print_num(res.samples);
	doveadm_print_num(res.heldout);
	doveadm_print_num(res.plain_bytes);
	doveadm_print_num(res.without_bytes);
	doveadm_print_num(res.with_bytes);
	doveadm_print(t_strdup_printf("%.3f", res.with_bytes == 0 ? 0.0 :
		(double)res.without_bytes / (double)res.with_bytes));
	return 0;
}

static void
cmd_casbox_dict_train_init(struct doveadm_mail_cmd_context *ctx ATTR_UNUSED CASBOX_DOVEADM_INIT_PARAMS)
{
	doveadm_print_header_simple("dict_id");
	doveadm_print_header_simple("samples");
	doveadm_print_header_simple("heldout");
	doveadm_print_header_simple("heldout_bytes");
	doveadm_print_header_simple("zstd_bytes");
	doveadm_print_header_simple("dict_bytes");
	doveadm_print_header_simple("gain");
}

struct doveadm_mail_cmd_context *cmd_casbox_dict_train_alloc(void)
{
	struct doveadm_mail_cmd_context *ctx;

	ctx = doveadm_mail_cmd_alloc(struct doveadm_mail_cmd_context);
	ctx->v.init = cmd_casbox_dict_train_init;
	ctx->v.run = cmd_casbox_dict_train_run;
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return ctx;
}
