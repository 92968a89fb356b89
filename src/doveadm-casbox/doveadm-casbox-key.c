/* doveadm casbox key init|destroy: the user's key file. */

#include "lib.h"
#include "mkdir-parents.h"
#include "write-full.h"
#include "mail-user.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "casbox-lsm.h"
#include "doveadm-casbox.h"

#include <fcntl.h>
#include <sysexits.h>
#include <unistd.h>
#include <sys/stat.h>

struct casbox_key_cmd_context {
	struct doveadm_mail_cmd_context ctx;
	bool yes_destroy;
};

/* Does the store hold anything a new key could not read? */
static int casbox_key_store_has_data(struct casbox_admin *adm, bool *have_r,
				     const char **error_r)
{
	static const unsigned char prefixes[] = {
		CASBOX_KEY_KEYRING, CASBOX_KEY_BLOB, CASBOX_KEY_MESSAGE
	};
	ARRAY_TYPE(casbox_census_pack) packs;
	struct casbox_lsm_iter *iter;
	const unsigned char *key, *value;
	size_t key_size, value_size;
	unsigned int i;

	*have_r = FALSE;
	if (casbox_lsm_refresh(adm->lsm, error_r) < 0)
		return -1;
	for (i = 0; i < N_ELEMENTS(prefixes) && !*have_r; i++) {
		iter = casbox_lsm_iter_init(adm->lsm, &prefixes[i], 1);
		if (casbox_lsm_iter_next(iter, &key, &key_size,
					 &value, &value_size))
			*have_r = TRUE;
		if (casbox_lsm_iter_deinit(&iter, error_r) < 0)
			return -1;
	}
	if (casbox_census_list_packs(adm->root_dir, pool_datastack_create(),
				     &packs, error_r) < 0)
		return -1;
	if (array_count(&packs) > 0)
		*have_r = TRUE;
	return 0;
}

static int casbox_key_init(struct mail_user *user, const char **path_r,
			   const char **error_r)
{
	struct casbox_settings set;
	struct cas_keyring *keyring;
	struct casbox_admin *adm;
	const char *dir, *p, *error;
	bool have_data = FALSE;
	struct stat st;
	int ret;

	ret = casbox_admin_open(user, &adm, &error);
	if (ret < 0) {
		*error_r = error;
		return -1;
	}
	if (ret > 0) {
		set = adm->set;
		/* the settings' strings go with adm */
		set.key_file = t_strdup(set.key_file);
		ret = casbox_key_store_has_data(adm, &have_data, error_r);
		casbox_admin_close(&adm);
		if (ret < 0)
			return -1;
	} else if (casbox_settings_read(user, pool_datastack_create(), &set,
					&error) < 0) {
		*error_r = error;
		return -1;
	}
	if (set.key_file == NULL) {
		*error_r = "casbox_key_file setting is not set";
		return -1;
	}
	*path_r = set.key_file;
	if (stat(set.key_file, &st) == 0) {
		*error_r = t_strdup_printf("key file %s already exists",
					   set.key_file);
		return -1;
	}
	if (have_data) {
		*error_r = "the store already has data: refusing to create "
			"a key that cannot read it";
		return -1;
	}
	p = strrchr(set.key_file, '/');
	if (p != NULL && p != set.key_file) {
		dir = t_strdup_until(set.key_file, p);
		if (mkdir_parents(dir, 0700) < 0 && errno != EEXIST) {
			*error_r = t_strdup_printf("mkdir(%s) failed: %m",
						   dir);
			return -1;
		}
	}
	if (cas_keyring_create(set.key_file, &keyring, &error) < 0) {
		*error_r = t_strdup_printf("key file %s: %s", set.key_file,
					   error);
		return -1;
	}
	cas_keyring_free(&keyring);
	return 0;
}

static int
cmd_casbox_key_init_run(struct doveadm_mail_cmd_context *ctx,
			struct mail_user *user)
{
	const char *path = "", *error;

	if (casbox_key_init(user, &path, &error) < 0) {
		i_error("casbox key init: %s", error);
		ctx->exit_code = EX_DATAERR;
		return -1;
	}
	doveadm_print(path);
	doveadm_print("created");
	return 0;
}

/* Overwrite, sync and unlink the key file: every blob of the store is
   then unreadable (crypto-shredding). */
static int casbox_key_destroy(struct mail_user *user, const char **path_r,
			      const char **error_r)
{
	static const unsigned char zeros[512];
	struct casbox_settings set;
	const char *path, *error;
	struct stat st;
	off_t pos;
	int fd;

	if (casbox_settings_read(user, pool_datastack_create(), &set,
				 &error) < 0) {
		*error_r = error;
		return -1;
	}
	if (set.key_file == NULL) {
		*error_r = "casbox_key_file setting is not set";
		return -1;
	}
	*path_r = path = set.key_file;
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	if (fstat(fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", path);
		i_close_fd(&fd);
		return -1;
	}
	for (pos = 0; pos < st.st_size; pos += sizeof(zeros)) {
		if (pwrite_full(fd, zeros, I_MIN(sizeof(zeros),
				(size_t)(st.st_size - pos)), pos) < 0) {
			*error_r = t_strdup_printf("write(%s) failed: %m",
						   path);
			i_close_fd(&fd);
			return -1;
		}
	}
	if (fsync(fd) < 0) {
		*error_r = t_strdup_printf("fsync(%s) failed: %m", path);
		i_close_fd(&fd);
		return -1;
	}
	i_close_fd(&fd);
	if (unlink(path) < 0) {
		*error_r = t_strdup_printf("unlink(%s) failed: %m", path);
		return -1;
	}
	return 0;
}

static int
cmd_casbox_key_destroy_run(struct doveadm_mail_cmd_context *_ctx,
			   struct mail_user *user)
{
	struct casbox_key_cmd_context *ctx =
		container_of(_ctx, struct casbox_key_cmd_context, ctx);
	const char *path = "", *error;

	if (!ctx->yes_destroy) {
		i_error("casbox key destroy makes all of the user's mail "
			"unreadable: add --yes-destroy-all-mail");
		_ctx->exit_code = EX_USAGE;
		return -1;
	}
	if (casbox_key_destroy(user, &path, &error) < 0) {
		i_error("casbox key destroy: %s", error);
		doveadm_mail_failed_error(_ctx, MAIL_ERROR_TEMP);
		return -1;
	}
	doveadm_print(path);
	doveadm_print("destroyed");
	return 0;
}

static void cmd_casbox_key_init(struct doveadm_mail_cmd_context *ctx
				ATTR_UNUSED,
				const char *const args[] ATTR_UNUSED)
{
	doveadm_print_header_simple("key_file");
	doveadm_print_header_simple("result");
}

static bool cmd_casbox_key_parse_arg(struct doveadm_mail_cmd_context *_ctx,
				     int c)
{
	struct casbox_key_cmd_context *ctx =
		container_of(_ctx, struct casbox_key_cmd_context, ctx);

	if (c != 'y')
		return FALSE;
	ctx->yes_destroy = TRUE;
	return TRUE;
}

static struct doveadm_mail_cmd_context *
cmd_casbox_key_alloc(int (*run)(struct doveadm_mail_cmd_context *,
				struct mail_user *))
{
	struct casbox_key_cmd_context *ctx;

	ctx = doveadm_mail_cmd_alloc(struct casbox_key_cmd_context);
	ctx->ctx.getopt_args = "y";
	ctx->ctx.v.parse_arg = cmd_casbox_key_parse_arg;
	ctx->ctx.v.init = cmd_casbox_key_init;
	ctx->ctx.v.run = run;
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return &ctx->ctx;
}

struct doveadm_mail_cmd_context *cmd_casbox_key_init_alloc(void)
{
	return cmd_casbox_key_alloc(cmd_casbox_key_init_run);
}

struct doveadm_mail_cmd_context *cmd_casbox_key_destroy_alloc(void)
{
	return cmd_casbox_key_alloc(cmd_casbox_key_destroy_run);
}
