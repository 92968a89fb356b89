/* doveadm casbox key password, and key init in password mode: the
   user key file with passwords from stdin (doc/doveadm.md). */

#include "lib.h"
#include "istream.h"
#include "mail-user.h"
#include "doveadm.h"
#include "doveadm-cmd.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "cas-userkey.h"
#include "doveadm-casbox.h"
#include "doveadm-casbox-dovecot.h"

#include <sysexits.h>
#include <unistd.h>

#define CASBOX_KEYPW_WRONG_PASSWORD ": wrong password"

struct casbox_keypw_cmd_context {
	struct doveadm_mail_cmd_context ctx;
	struct casbox_key_input *input;
	/* old and new password, pointing into input */
	struct casbox_key_line lines[2];
	/* set when the input was unusable on a doveadm server */
	const char *input_error;
};

static const char *const casbox_keypw_names[] = {
	"old password", "new password", NULL
};
static const char *const casbox_keyinit_names[] = { "password", NULL };

static bool casbox_keypw_wrong_password(const char *error)
{
	size_t len = strlen(error);
	size_t suffix = strlen(CASBOX_KEYPW_WRONG_PASSWORD);

	return len >= suffix &&
		strcmp(error + len - suffix, CASBOX_KEYPW_WRONG_PASSWORD) == 0;
}

static bool casbox_keypw_cli(struct doveadm_mail_cmd_context *ctx)
{
	return ctx->cctx->conn_type == DOVEADM_CONNECTION_TYPE_CLI;
}

/* stdin of a local doveadm. Not from a terminal: it would echo the
   password, and hook scripts have none. */
static int casbox_keypw_read_stdin(struct casbox_key_input **input_r,
				   const char **error_r)
{
	*input_r = NULL;
	if (isatty(STDIN_FILENO) == 1) {
		*error_r = "stdin is a terminal, which would echo the "
			"password: pipe it in (see doc/doveadm.md)";
		return -1;
	}
	return casbox_key_input_read_fd(STDIN_FILENO, input_r, error_r);
}

/* The command's input: stdin for a local doveadm, whose bytes also
   become ctx->cmd_input (a view of the same wiped memory), which
   doveadm forwards when the command runs on a doveadm server (-S); on
   that server, the forwarded input. */
static int casbox_keypw_read_input(struct casbox_keypw_cmd_context *ctx,
				   const char **error_r)
{
	struct doveadm_mail_cmd_context *_ctx = &ctx->ctx;

	if (!casbox_keypw_cli(_ctx)) {
		doveadm_mail_get_input(_ctx);
		if (casbox_key_input_read_stream(_ctx->cmd_input, &ctx->input,
						 error_r) < 0)
			return -1;
	} else {
		if (casbox_keypw_read_stdin(&ctx->input, error_r) < 0)
			return -1;
		i_assert(_ctx->cmd_input == NULL);
		_ctx->cmd_input = i_stream_create_from_data(ctx->input->data,
							    ctx->input->size);
	}
	return casbox_key_input_lines(ctx->input, casbox_keypw_names,
				      ctx->lines, N_ELEMENTS(ctx->lines),
				      error_r);
}

static void
cmd_casbox_key_password_init(struct doveadm_mail_cmd_context *_ctx CASBOX_DOVEADM_INIT_PARAMS)
{
	struct casbox_keypw_cmd_context *ctx =
		container_of(_ctx, struct casbox_keypw_cmd_context, ctx);
	const char *error;

	doveadm_print_header_simple("key_file");
	doveadm_print_header_simple("key_id");
	doveadm_print_header_simple("result");
	if (!_ctx->iterate_single_user) {
		/* stdin holds one user's passwords */
		i_fatal_status(EX_USAGE, "casbox key password: one user at "
			       "a time (-u user, no wildcard, no -A or -F): "
			       "stdin holds that user's old and new password");
	}
	if (casbox_keypw_read_input(ctx, &error) == 0)
		return;
	/* the stream may be a view of input's memory: first */
	i_stream_unref(&_ctx->cmd_input);
	casbox_key_input_free(&ctx->input);
	if (casbox_keypw_cli(_ctx)) {
		/* before any user is looked up; nothing to forward */
		i_fatal_status(EX_USAGE, "casbox key password: %s", error);
	}
	ctx->input_error = p_strdup(_ctx->pool, error);
}

static void cmd_casbox_key_password_deinit(struct doveadm_mail_cmd_context
					   *_ctx)
{
	struct casbox_keypw_cmd_context *ctx =
		container_of(_ctx, struct casbox_keypw_cmd_context, ctx);

	/* cmd_input may be a view of input's memory */
	i_stream_unref(&_ctx->cmd_input);
	casbox_key_input_free(&ctx->input);
}

/* The user's password-mode key file. Returns 0 ok, -1 error. */
static int casbox_keypw_key_file(struct mail_user *user, const char **path_r,
				 int *exit_code_r, const char **error_r)
{
	struct casbox_settings set;
	const char *error;

	*exit_code_r = EX_CONFIG;
	if (casbox_settings_read(user, pool_datastack_create(), &set,
				 &error) < 0) {
		*error_r = error;
		return -1;
	}
	if (set.key_mode != CAS_KEY_MODE_PASSWORD) {
		*error_r = t_strdup_printf("casbox_key_mode is %s: only a "
			"password-mode user key has a password",
			cas_key_mode_name(set.key_mode));
		return -1;
	}
	if (set.key_file == NULL) {
		*error_r = "casbox_key_file setting is not set";
		return -1;
	}
	*path_r = set.key_file;
	return 0;
}

static int casbox_keypw_change(struct casbox_keypw_cmd_context *ctx,
			       struct mail_user *user, const char **path_r,
			       uint32_t *key_id_r, int *exit_code_r,
			       const char **error_r)
{
	struct cas_userkey *key;
	const char *path, *error;
	int ret;

	if (casbox_keypw_key_file(user, &path, exit_code_r, error_r) < 0)
		return -1;
	*path_r = path;
	/* tells a missing or damaged file apart from a wrong password,
	   and gives the key id (the rewrap keeps the key pair) */
	ret = cas_userkey_load_public(path, &key, &error);
	if (ret <= 0) {
		*exit_code_r = ret < 0 ? EX_DATAERR : EX_NOINPUT;
		*error_r = ret < 0 ? error : t_strdup_printf(
			"key file %s does not exist (key init, or the user's "
			"first login, creates it)", path);
		return -1;
	}
	*key_id_r = cas_userkey_key_id(key);
	cas_userkey_free(&key);

	ret = cas_userkey_change_password(path,
		ctx->lines[0].data, ctx->lines[0].size,
		ctx->lines[1].data, ctx->lines[1].size, NULL, &error);
	if (ret > 0)
		return 0;
	if (ret == 0) {
		*exit_code_r = EX_NOINPUT;
		*error_r = t_strdup_printf("key file %s disappeared", path);
	} else {
		/* the file parsed above, so what is left is the password
		   or I/O (the library's errors name the file first) */
		*exit_code_r = casbox_keypw_wrong_password(error) ?
			EX_DATAERR : EX_TEMPFAIL;
		*error_r = error;
	}
	return -1;
}

static int
cmd_casbox_key_password_run(struct doveadm_mail_cmd_context *_ctx,
			    struct mail_user *user)
{
	struct casbox_keypw_cmd_context *ctx =
		container_of(_ctx, struct casbox_keypw_cmd_context, ctx);
	const char *path, *error;
	uint32_t key_id;
	int exit_code;

	if (ctx->input == NULL) {
		i_error("casbox key password: %s", ctx->input_error);
		_ctx->exit_code = EX_USAGE;
		return -1;
	}
	if (casbox_keypw_change(ctx, user, &path, &key_id, &exit_code,
				&error) < 0) {
		i_error("casbox key password: %s", error);
		_ctx->exit_code = exit_code;
		return -1;
	}
	doveadm_print(path);
	doveadm_print(t_strdup_printf("%08x", key_id));
	doveadm_print("rewrapped");
	return 0;
}

struct doveadm_mail_cmd_context *cmd_casbox_key_password_alloc(void)
{
	struct casbox_keypw_cmd_context *ctx;

	ctx = doveadm_mail_cmd_alloc(struct casbox_keypw_cmd_context);
	ctx->ctx.v.init = cmd_casbox_key_password_init;
	ctx->ctx.v.run = cmd_casbox_key_password_run;
	ctx->ctx.v.deinit = cmd_casbox_key_password_deinit;
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return &ctx->ctx;
}

int casbox_key_init_read_password(struct doveadm_mail_cmd_context *ctx,
				  struct casbox_key_input **input_r,
				  struct casbox_key_line *line_r,
				  const char **error_r)
{
	*input_r = NULL;
	if (!ctx->iterate_single_user) {
		*error_r = "casbox_key_mode is password: key init creates "
			"one user's key file (-u user, no wildcard, no -A or "
			"-F) with that user's password on stdin";
		return -1;
	}
	if (!casbox_keypw_cli(ctx)) {
		/* the mode is known only here, after the client sent the
		   command without its stdin */
		*error_r = "casbox_key_mode is password: key init reads "
			"the password from stdin, so it does not run on a "
			"doveadm server (-S)";
		return -1;
	}
	if (casbox_keypw_read_stdin(input_r, error_r) < 0)
		return -1;
	if (casbox_key_input_lines(*input_r, casbox_keyinit_names, line_r, 1,
				   error_r) < 0) {
		casbox_key_input_free(input_r);
		return -1;
	}
	return 0;
}

int casbox_key_read_user_password(struct doveadm_mail_cmd_context *ctx,
				  const char *cmd, const char *root_dir,
				  struct casbox_key_input **input_r,
				  const char **password_r)
{
	static const char *const names[] = { "password", NULL };
	struct casbox_key_line line;
	const char *error;

	*input_r = NULL;
	/* one password, one user, from a local doveadm's stdin (a doveadm
	   server has no stdin; a terminal echoes) */
	error = !ctx->iterate_single_user ?
		"one user only (-u user, no wildcard, no -A or -F)" :
		!casbox_keypw_cli(ctx) ?
		"stdin is not forwarded to a doveadm server (-S)" :
		isatty(STDIN_FILENO) == 1 ?
		"stdin is a terminal, which would echo the password: "
		"pipe it in" : NULL;
	if (error != NULL) {
		i_error("%s: %s: casbox_key_mode=password reads the user's "
			"password from stdin: %s", cmd, root_dir, error);
		ctx->exit_code = EX_USAGE;
		return -1;
	}
	if (casbox_key_input_read_fd(STDIN_FILENO, input_r, &error) < 0 ||
	    casbox_key_input_lines(*input_r, names, &line, 1, &error) < 0) {
		casbox_key_input_free(input_r);
		i_error("%s: %s: casbox_key_mode=password needs the user's "
			"password on stdin (one line): %s", cmd, root_dir,
			error);
		ctx->exit_code = EX_NOINPUT;
		return -1;
	}
	*password_r = casbox_key_line_str(*input_r, &line);
	return 0;
}
