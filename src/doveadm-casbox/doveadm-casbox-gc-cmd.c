/* doveadm casbox gc: the command around casbox_store_gc()
   (store/casbox-store-gc.c): the store's maintenance lock, the output
   row and the casbox_gc_finished event. */

#include "lib.h"
#include "mail-user.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "casbox-store-gc.h"
#include "doveadm-casbox.h"
#include "doveadm-casbox-dovecot.h"

struct casbox_gc_cmd_context {
	struct doveadm_mail_cmd_context ctx;
	bool all;
};

/* The command's output columns, also the fields of its event. */
static const char *const casbox_gc_fields[] = {
	"packs_selected", "packs_deleted", "blobs_moved",
	"records_dropped", "bytes_selected", "bytes_written",
	"bytes_reclaimed", "recovery_kept", "recovery_dropped",
	"dek_updates", "recovery_written", "retained_released",
	"retained_bytes_released", "duplicates_expired",
	"blob_keys_written",
};
#define CASBOX_GC_FIELD_COUNT N_ELEMENTS(casbox_gc_fields)

static void casbox_gc_values(const struct casbox_store_gc_stats *stats,
			     uint64_t values_r[CASBOX_GC_FIELD_COUNT])
{
	unsigned int i = 0;

	values_r[i++] = stats->packs_selected;
	values_r[i++] = stats->packs_deleted;
	values_r[i++] = stats->blobs_moved;
	values_r[i++] = stats->records_dropped;
	values_r[i++] = stats->bytes_selected;
	values_r[i++] = stats->bytes_written;
	values_r[i++] = stats->bytes_reclaimed;
	values_r[i++] = stats->recovery_kept;
	values_r[i++] = stats->recovery_dropped;
	values_r[i++] = stats->dek_updates;
	values_r[i++] = stats->recovery_written;
	values_r[i++] = stats->retained_released;
	values_r[i++] = stats->retained_bytes_released;
	values_r[i++] = stats->duplicates_expired;
	values_r[i++] = stats->blob_keys_written;
	i_assert(i == CASBOX_GC_FIELD_COUNT);
}

/* Print the row (when it succeeded) and send casbox_gc_finished. */
static void casbox_gc_finished(struct casbox_admin *adm,
			       const struct casbox_store_gc_stats *stats,
			       const char *error)
{
	uint64_t values[CASBOX_GC_FIELD_COUNT];
	struct event_passthrough *e;
	unsigned int i;

	casbox_gc_values(stats, values);
	e = event_create_passthrough(adm->event)->
		set_name("casbox_gc_finished");
	for (i = 0; i < CASBOX_GC_FIELD_COUNT; i++) {
		if (error == NULL)
			doveadm_print_num(values[i]);
		e->add_int(casbox_gc_fields[i], values[i]);
	}
	if (error != NULL)
		e->add_str("error", error);
	e_debug(e->event(), "casbox gc: %s: %s", adm->root_dir,
		error == NULL ? "finished" : error);
}

static int
cmd_casbox_gc_run(struct doveadm_mail_cmd_context *_ctx,
		  struct mail_user *user)
{
	struct casbox_gc_cmd_context *ctx =
		container_of(_ctx, struct casbox_gc_cmd_context, ctx);
	struct casbox_store_gc_stats stats;
	struct casbox_admin *adm;
	struct file_lock *lock = NULL;
	const char *error;
	int ret;

	i_zero(&stats);
	ret = casbox_admin_open(user, &adm, &error);
	if (ret <= 0)
		return casbox_admin_open_failed(_ctx, "casbox gc", user,
						ret, error);
	/* exclusive: no scrub reads the packs this run deletes */
	ret = casbox_store_maintenance_lock(adm->store, TRUE,
					    CASBOX_MAINTENANCE_LOCK_SECS,
					    &lock, &error);
	if (ret > 0)
		ret = casbox_store_gc(adm->store, ctx->all, &stats, &error);
	else
		ret = -1;
	if (lock != NULL)
		file_lock_free(&lock);
	if (ret < 0) {
		i_error("casbox gc: %s: %s", adm->root_dir, error);
		doveadm_mail_failed_error(_ctx, MAIL_ERROR_TEMP);
	}
	casbox_gc_finished(adm, &stats, ret < 0 ? error : NULL);
	casbox_admin_close(&adm);
	return ret;
}

static void cmd_casbox_gc_init(struct doveadm_mail_cmd_context *ctx
			       ATTR_UNUSED CASBOX_DOVEADM_INIT_PARAMS)
{
	unsigned int i;

	for (i = 0; i < CASBOX_GC_FIELD_COUNT; i++) {
		doveadm_print_header(casbox_gc_fields[i], casbox_gc_fields[i],
				     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	}
}

static bool cmd_casbox_gc_parse_arg(struct doveadm_mail_cmd_context *_ctx,
				    int c)
{
	struct casbox_gc_cmd_context *ctx =
		container_of(_ctx, struct casbox_gc_cmd_context, ctx);

	if (c != 'a')
		return FALSE;
	ctx->all = TRUE;
	return TRUE;
}

struct doveadm_mail_cmd_context *cmd_casbox_gc_alloc(void)
{
	struct casbox_gc_cmd_context *ctx;

	ctx = doveadm_mail_cmd_alloc(struct casbox_gc_cmd_context);
	casbox_doveadm_set_parse_arg(&ctx->ctx, "a", cmd_casbox_gc_parse_arg);
	ctx->ctx.v.init = cmd_casbox_gc_init;
	ctx->ctx.v.run = cmd_casbox_gc_run;
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return &ctx->ctx;
}
