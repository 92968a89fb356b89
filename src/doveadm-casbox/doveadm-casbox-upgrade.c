/* doveadm casbox upgrade: the command around casbox_records_upgrade()
   (store/casbox-record-auth.c): records v1 -> v2 (authenticated), in
   batches, resumable; the output row and the casbox_upgrade_finished
   event. */

#include "lib.h"
#include "mail-user.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "casbox-record-auth.h"
#include "casbox-store-progress.h"
#include "doveadm-casbox.h"
#include "doveadm-casbox-dovecot.h"

/* The command's output columns, also the fields of its event. */
static const char *const casbox_upgrade_fields[] = {
	"records_upgraded", "records_already", "records_malformed",
	"batches", "marker_was_missing",
};
#define CASBOX_UPGRADE_FIELD_COUNT N_ELEMENTS(casbox_upgrade_fields)

static void
casbox_upgrade_progress(void *context ATTR_UNUSED,
			const struct casbox_records_upgrade_stats *stats)
{
	casbox_admin_progress_line(FALSE, "upgrade: %"PRIu64" records "
				   "upgraded, %"PRIu64" already v2, %u batches",
				   stats->upgraded, stats->already,
				   stats->batches);
}

static void
casbox_upgrade_finished(struct casbox_admin *adm,
			const struct casbox_records_upgrade_stats *stats,
			const char *error)
{
	uint64_t values[CASBOX_UPGRADE_FIELD_COUNT];
	struct event_passthrough *e;
	unsigned int i = 0;

	values[i++] = stats->upgraded;
	values[i++] = stats->already;
	values[i++] = stats->malformed;
	values[i++] = stats->batches;
	values[i++] = stats->marker_was_missing ? 1 : 0;
	i_assert(i == CASBOX_UPGRADE_FIELD_COUNT);
	e = event_create_passthrough(adm->event)->
		set_name("casbox_upgrade_finished");
	for (i = 0; i < CASBOX_UPGRADE_FIELD_COUNT; i++) {
		if (error == NULL)
			doveadm_print_num(values[i]);
		e->add_int(casbox_upgrade_fields[i], values[i]);
	}
	if (error != NULL)
		e->add_str("error", error);
	e_debug(e->event(), "casbox upgrade: %s: %s", adm->root_dir,
		error == NULL ? "finished" : error);
}

static int
cmd_casbox_upgrade_run(struct doveadm_mail_cmd_context *ctx,
		       struct mail_user *user)
{
	struct casbox_records_upgrade_stats stats;
	struct casbox_admin *adm;
	const char *error;
	int ret;

	i_zero(&stats);
	ret = casbox_admin_open(user, &adm, &error);
	if (ret <= 0)
		return casbox_admin_open_failed(ctx, "casbox upgrade", user,
						ret, error);
	ret = casbox_records_upgrade(adm->store, casbox_upgrade_progress,
				     NULL, &stats, &error);
	casbox_admin_progress_end();
	if (ret < 0) {
		i_error("casbox upgrade: %s: %s (what was upgraded stays; "
			"run it again to go on)", adm->root_dir, error);
		doveadm_mail_failed_error(ctx, MAIL_ERROR_TEMP);
	} else if (stats.marker_was_missing) {
		i_error("casbox upgrade: %s: the records version marker was "
			"missing although v2 records exist: v1 records were "
			"not upgraded (doveadm casbox scrub names them)",
			adm->root_dir);
	}
	casbox_upgrade_finished(adm, &stats, ret < 0 ? error : NULL);
	casbox_admin_close(&adm);
	return ret;
}

static void cmd_casbox_upgrade_init(struct doveadm_mail_cmd_context *ctx
				    ATTR_UNUSED CASBOX_DOVEADM_INIT_PARAMS)
{
	unsigned int i;

	for (i = 0; i < CASBOX_UPGRADE_FIELD_COUNT; i++) {
		doveadm_print_header(casbox_upgrade_fields[i],
				     casbox_upgrade_fields[i],
				     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	}
}

struct doveadm_mail_cmd_context *cmd_casbox_upgrade_alloc(void)
{
	struct doveadm_mail_cmd_context *ctx;

	ctx = doveadm_mail_cmd_alloc(struct doveadm_mail_cmd_context);
	ctx->v.init = cmd_casbox_upgrade_init;
	ctx->v.run = cmd_casbox_upgrade_run;
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return ctx;
}
