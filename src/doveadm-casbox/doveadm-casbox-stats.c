/* doveadm casbox stats: what a user's store holds and what it costs. */

#include "lib.h"
#include "array.h"
#include "str.h"
#include "mail-user.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "doveadm-casbox.h"
#include "doveadm-casbox-dovecot.h"

static const char *casbox_stats_ratio(uint64_t num, uint64_t denom)
{
	if (denom == 0)
		return "0.000";
	return t_strdup_printf("%.3f", (double)num / (double)denom);
}

struct casbox_stats_key_id {
	uint32_t key_id;
	uint64_t count;
};

static int casbox_stats_key_id_cmp(const struct casbox_stats_key_id *a,
				   const struct casbox_stats_key_id *b)
{
	return a->key_id < b->key_id ? -1 : a->key_id > b->key_id ? 1 : 0;
}

/* "keyid:count,..." over the blob records' wrapped DEKs, by key id: what
   key rotation has left to do ("" for an empty store). */
static const char *casbox_stats_wrap_key_ids(struct casbox_census *census)
{
	ARRAY(struct casbox_stats_key_id) ids;
	struct casbox_stats_key_id *kid, new_kid;
	struct casbox_census_blob *blob;
	string_t *str = t_str_new(64);
	unsigned int i;
	uint32_t key_id;

	t_array_init(&ids, 4);
	array_foreach_elem(&census->blob_list, blob) {
		if (!blob->have_record || blob->record_bad)
			continue;
		key_id = cas_stored_dek_key_id(blob->rec.dek_kind,
					       blob->rec.stored_dek);
		kid = NULL;
		for (i = 0; i < array_count(&ids) && kid == NULL; i++) {
			struct casbox_stats_key_id *e =
				array_idx_modifiable(&ids, i);

			if (e->key_id == key_id)
				kid = e;
		}
		if (kid == NULL) {
			i_zero(&new_kid);
			new_kid.key_id = key_id;
			array_push_back(&ids, &new_kid);
			kid = array_back_modifiable(&ids);
		}
		kid->count++;
	}
	array_sort(&ids, casbox_stats_key_id_cmp);
	array_foreach_modifiable(&ids, kid) {
		if (str_len(str) > 0)
			str_append_c(str, ',');
		str_printfa(str, "%08x:%"PRIu64, kid->key_id, kid->count);
	}
	return str_c(str);
}

static void casbox_stats_print(struct casbox_admin *adm,
			       struct casbox_census *census)
{
	const struct casbox_census_pack *pack;
	struct casbox_census_blob *blob;
	uint64_t pack_bytes = 0, live_bytes = 0, live_plain = 0;
	uint64_t dead_bytes = 0;
	uint64_t unique_plain = 0, blobs = 0;

	array_foreach(&census->packs, pack) {
		pack_bytes += pack->size;
		live_bytes += pack->live_bytes;
		live_plain += pack->live_plain_bytes;
		dead_bytes += pack->dead_bytes;
	}
	array_foreach_elem(&census->blob_list, blob) {
		if (!blob->have_record || blob->record_bad)
			continue;
		blobs++;
		unique_plain += blob->rec.plain_size;
	}
	doveadm_print_num(census->messages);
	doveadm_print_num(census->logical_bytes);
	doveadm_print_num(pack_bytes);
	doveadm_print_num(blobs);
	doveadm_print(casbox_stats_ratio(census->referenced_plain_bytes,
					 unique_plain));
	doveadm_print(casbox_stats_ratio(live_plain, live_bytes));
	doveadm_print_num(array_count(&census->packs));
	doveadm_print(casbox_stats_ratio(dead_bytes, pack_bytes));
	doveadm_print_num(casbox_admin_dir_size(
		t_strconcat(adm->root_dir, "/lsm", NULL)));
	doveadm_print(casbox_stats_wrap_key_ids(census));
	/* expunged mail kept for undelete: not in messages/logical_bytes
	   (nor in quota), but its blobs are in stored_bytes */
	doveadm_print_num(census->retained_messages);
	doveadm_print_num(census->retained_bytes);
}

static int
cmd_casbox_stats_run(struct doveadm_mail_cmd_context *ctx,
		     struct mail_user *user)
{
	struct casbox_census *census;
	struct casbox_admin *adm;
	const char *error;
	int ret;

	ret = casbox_admin_open(user, &adm, &error);
	if (ret <= 0)
		return casbox_admin_open_failed(ctx, "casbox stats", user,
						ret, error);
	/* stats need no key: the frame scan is keyless */
	if (casbox_admin_open_keys(adm, &error) < 0 &&
	    casbox_admin_open_packs_keyless(adm, &error) == 0) {
		error = t_strdup_printf("%s: the store has compression "
					"dictionaries, which need the key",
					error);
		ret = -1;
	}
	if (ret < 0 || adm->packs == NULL ||
	    casbox_census_build(adm->store, NULL, NULL, &census, &error) < 0) {
		i_error("casbox stats: %s", error);
		doveadm_mail_failed_error(ctx, MAIL_ERROR_TEMP);
		casbox_admin_close(&adm);
		return -1;
	}
	ret = casbox_census_scan_packs(adm->store, census, NULL, NULL,
				       &error);
	if (ret < 0) {
		i_error("casbox stats: %s", error);
		doveadm_mail_failed_error(ctx, MAIL_ERROR_TEMP);
	} else {
		casbox_stats_print(adm, census);
	}
	casbox_census_free(&census);
	casbox_admin_close(&adm);
	return ret;
}

static void cmd_casbox_stats_init(struct doveadm_mail_cmd_context *ctx
				  ATTR_UNUSED CASBOX_DOVEADM_INIT_PARAMS)
{
	static const char *const fields[] = {
		"messages", "logical_bytes", "stored_bytes", "unique_blobs",
		"dedup_ratio", "compression_ratio", "packs", "dead_ratio",
		"lsm_bytes", "wrap_key_ids", "retained_messages",
		"retained_bytes",
	};
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(fields); i++) {
		doveadm_print_header(fields[i], fields[i],
				     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	}
}

struct doveadm_mail_cmd_context *cmd_casbox_stats_alloc(void)
{
	struct doveadm_mail_cmd_context *ctx;

	ctx = doveadm_mail_cmd_alloc(struct doveadm_mail_cmd_context);
	ctx->v.init = cmd_casbox_stats_init;
	ctx->v.run = cmd_casbox_stats_run;
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return ctx;
}
