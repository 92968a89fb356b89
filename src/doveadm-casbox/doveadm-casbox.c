/* doveadm casbox: command registration. */

#include "lib.h"
#include "module-dir.h"
#include "doveadm.h"
#include "doveadm-cmd.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "doveadm-casbox.h"
#include "doveadm-casbox-aecs.h"

#include <zstd.h>
#include <sodium.h>

const char *doveadm_casbox_plugin_version = DOVECOT_ABI_VERSION;

void doveadm_casbox_plugin_init(struct module *module);
void doveadm_casbox_plugin_deinit(void);

static void cmd_casbox_version(struct doveadm_cmd_context *cctx ATTR_UNUSED)
{
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	doveadm_print_header_simple("component");
	doveadm_print_header_simple("version");

	doveadm_print("casbox");
	doveadm_print(CASBOX_VERSION);
	doveadm_print("dovecot-abi");
	doveadm_print(DOVECOT_ABI_VERSION);
	doveadm_print("zstd");
	doveadm_print(ZSTD_versionString());
	doveadm_print("libsodium");
	doveadm_print(sodium_version_string());
}

static struct doveadm_cmd_ver2 casbox_commands[] = {
	{
		.name = "casbox version",
		.cmd = cmd_casbox_version,
		.usage = "",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox scrub",
		.mail_cmd = cmd_casbox_scrub_alloc,
		.usage = "[-u <user>|-A] [-S <socket_path>] [--repair]",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_MAIL_COMMON
		DOVEADM_CMD_PARAM('r', "repair", CMD_PARAM_BOOL, 0)
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox gc",
		.mail_cmd = cmd_casbox_gc_alloc,
		.usage = "[-u <user>|-A] [-S <socket_path>] [--all]",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_MAIL_COMMON
		DOVEADM_CMD_PARAM('a', "all", CMD_PARAM_BOOL, 0)
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox upgrade",
		.mail_cmd = cmd_casbox_upgrade_alloc,
		.usage = "[-u <user>|-A] [-S <socket_path>]",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_MAIL_COMMON
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox undelete",
		.mail_cmd = cmd_casbox_undelete_alloc,
		.usage = "[-u <user>|-A] [-S <socket_path>] [--list] "
			"[--mailbox <name>] [--since <time>] "
			"[--before <time>] [--to <name>] [<search query>]",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_MAIL_COMMON
		DOVEADM_CMD_PARAM('l', "list", CMD_PARAM_BOOL, 0)
		DOVEADM_CMD_PARAM('m', "mailbox", CMD_PARAM_STR, 0)
		DOVEADM_CMD_PARAM('s', "since", CMD_PARAM_STR, 0)
		DOVEADM_CMD_PARAM('b', "before", CMD_PARAM_STR, 0)
		DOVEADM_CMD_PARAM('t', "to", CMD_PARAM_STR, 0)
		DOVEADM_CMD_PARAM('\0', "query", CMD_PARAM_ARRAY,
				  CMD_PARAM_FLAG_POSITIONAL)
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox key init",
		.mail_cmd = cmd_casbox_key_init_alloc,
		.usage = "[-u <user>|-A] [-S <socket_path>]",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_MAIL_COMMON
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox key destroy",
		.mail_cmd = cmd_casbox_key_destroy_alloc,
		.usage = "[-u <user>] [-S <socket_path>] "
			"--yes-destroy-all-mail",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_MAIL_COMMON
		DOVEADM_CMD_PARAM('y', "yes-destroy-all-mail",
				  CMD_PARAM_BOOL, 0)
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox key rotate",
		.mail_cmd = cmd_casbox_key_rotate_alloc,
		.usage = "[-u <user>|-A] [-S <socket_path>] [--finish] "
			"[--batch <n>]",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_MAIL_COMMON
		DOVEADM_CMD_PARAM('e', "finish", CMD_PARAM_BOOL, 0)
		DOVEADM_CMD_PARAM('b', "batch", CMD_PARAM_STR, 0)
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox key password",
		.mail_cmd = cmd_casbox_key_password_alloc,
		.usage = "[-u <user>] [-S <socket_path>]",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_MAIL_COMMON
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox key export-public",
		.mail_cmd = cmd_casbox_key_export_public_alloc,
		.usage = "[-u <user>|-A] [-S <socket_path>]",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_MAIL_COMMON
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox rebuild",
		.mail_cmd = cmd_casbox_rebuild_alloc,
		.usage = "[-u <user>|-A] [-S <socket_path>] "
			"[--from-packs | <mailbox> ...]",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_MAIL_COMMON
		DOVEADM_CMD_PARAM('p', "from-packs", CMD_PARAM_BOOL, 0)
		DOVEADM_CMD_PARAM('\0', "mailbox-mask", CMD_PARAM_ARRAY,
				  CMD_PARAM_FLAG_POSITIONAL)
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox dict train",
		.mail_cmd = cmd_casbox_dict_train_alloc,
		.usage = "[-u <user>|-A] [-S <socket_path>]",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_MAIL_COMMON
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox aecs export",
		.mail_cmd = cmd_casbox_aecs_export_alloc,
		.usage = "[-u <user>|-A] [-S <socket_path>] "
			"(--db <file> | --sql <file>) [--blobs <dir>] "
			"[--mailbox-id <id>] [--forai-max-chars <n>] "
			"[--no-search] [<mailbox> ...]",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_MAIL_COMMON
		DOVEADM_CMD_PARAM('d', "db", CMD_PARAM_STR, 0)
		DOVEADM_CMD_PARAM('s', "sql", CMD_PARAM_STR, 0)
		DOVEADM_CMD_PARAM('b', "blobs", CMD_PARAM_STR, 0)
		DOVEADM_CMD_PARAM('i', "mailbox-id", CMD_PARAM_STR, 0)
		DOVEADM_CMD_PARAM('m', "forai-max-chars", CMD_PARAM_STR, 0)
		DOVEADM_CMD_PARAM('n', "no-search", CMD_PARAM_BOOL, 0)
		DOVEADM_CMD_PARAM('\0', "mailbox-mask", CMD_PARAM_ARRAY,
				  CMD_PARAM_FLAG_POSITIONAL)
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox aecs query",
		.cmd = cmd_casbox_aecs_query,
		.usage = "--db <file> [--mailbox-id <id>] <name> [<arg> ...]",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_PARAM('d', "db", CMD_PARAM_STR, 0)
		DOVEADM_CMD_PARAM('i', "mailbox-id", CMD_PARAM_STR, 0)
		DOVEADM_CMD_PARAM('\0', "query", CMD_PARAM_ARRAY,
				  CMD_PARAM_FLAG_POSITIONAL)
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox upload",
		.mail_cmd = cmd_casbox_upload_alloc,
		.usage = "[-u <user>|-A] [-S <socket_path>] [-s]",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_MAIL_COMMON
		DOVEADM_CMD_PARAM('s', "seal", CMD_PARAM_BOOL, 0)
		DOVEADM_CMD_PARAMS_END
	},
	{
		.name = "casbox stats",
		.mail_cmd = cmd_casbox_stats_alloc,
		.usage = "[-u <user>|-A] [-S <socket_path>]",
		DOVEADM_CMD_PARAMS_START
		DOVEADM_CMD_MAIL_COMMON
		DOVEADM_CMD_PARAMS_END
	},
};

void doveadm_casbox_plugin_init(struct module *module ATTR_UNUSED)
{
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(casbox_commands); i++)
		doveadm_cmd_register_ver2(&casbox_commands[i]);
}

void doveadm_casbox_plugin_deinit(void)
{
}
