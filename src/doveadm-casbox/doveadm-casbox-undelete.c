/* doveadm casbox undelete: list or restore messages expunged inside
   casbox_expunge_retention (retained records, casbox-store-safety.h).
   A restore saves the message through lib-storage into its mailbox (or
   --to NAME) with a new UID, its flags but \Deleted, keywords, dates and
   GUID, deduplicated against the retained blobs (no new pack bytes but
   the recovery record), then releases the retained record. A crash in
   between leaves both; the next run finds the GUID in the mailbox and
   only releases the record, so nothing is restored twice. */

#include "lib.h"
#include "array.h"
#include "hash.h"
#include "ioloop.h"
#include "istream.h"
#include "strnum.h"
#include "str.h"
#include "time-util.h"
#include "mail-namespace.h"
#include "mail-search-build.h"
#include "mail-storage-private.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "casbox-storage.h"
#include "casbox-store.h"
#include "casbox-store-safety.h"
#include "doveadm-casbox.h"
#include "doveadm-casbox-dovecot.h"
#include "doveadm-casbox-undelete.h"

#include <sysexits.h>
#include <stdio.h>
#include <time.h>

struct casbox_undelete_cmd_context {
	struct doveadm_mail_cmd_context ctx;
	bool list;
	const char *mailbox, *to;
	time_t since, before;
	/* NULL = all */
	struct mail_search_args *query;
};

/* One retained message chosen for listing or restoring. */
struct casbox_undelete_item {
	guid_128_t mailbox_guid;
	uint32_t uid;
	struct casbox_retained_record rec;
};

struct casbox_undelete_collect {
	struct casbox_undelete_cmd_context *ctx;
	pool_t pool;
	ARRAY(struct casbox_undelete_item) items;
};

static bool
casbox_undelete_wanted(const struct casbox_undelete_cmd_context *ctx,
		       uint32_t uid, const struct casbox_retained_record *rec)
{
	if (ctx->mailbox != NULL && strcmp(ctx->mailbox,
					   rec->mailbox_name) != 0)
		return FALSE;
	if (ctx->since != 0 && rec->expunged < ctx->since)
		return FALSE;
	if (ctx->before != 0 && rec->expunged >= ctx->before)
		return FALSE;
	return ctx->query == NULL ||
		casbox_undelete_query_match(ctx->query->args, uid, rec);
}

static void
casbox_undelete_collect_cb(void *context, const guid_128_t mailbox_guid,
			   uint32_t uid,
			   const struct casbox_retained_record *rec)
{
	struct casbox_undelete_collect *coll = context;
	struct casbox_undelete_item *item;
	if (!casbox_undelete_wanted(coll->ctx, uid, rec))
		return;
	item = array_append_space(&coll->items);
	guid_128_copy(item->mailbox_guid, mailbox_guid);
	item->uid = uid;
	item->rec.expunged = rec->expunged;
	item->rec.mailbox_name = p_strdup(coll->pool, rec->mailbox_name);
	casbox_msg_record_dup_lean(coll->pool, &rec->msg, &item->rec.msg);
}

static struct casbox_storage *casbox_undelete_storage(struct mail_user *user)
{
	struct mail_namespace *ns;

	for (ns = user->namespaces; ns != NULL; ns = ns->next) {
		if (ns->storage != NULL &&
		    strcmp(ns->storage->name, CASBOX_STORAGE_NAME) == 0)
			return CASBOX_STORAGE(ns->storage);
	}
	return NULL;
}

static const char *casbox_undelete_time(time_t t)
{
	return t_strflocaltime("%Y-%m-%d %H:%M:%S", t);
}

static void
casbox_undelete_print_item(const struct casbox_undelete_item *item,
			   unsigned int retention)
{
	doveadm_print(item->rec.mailbox_name);
	doveadm_print_num(item->uid);
	doveadm_print(item->rec.msg.guid);
	doveadm_print(casbox_undelete_time(item->rec.expunged));
	doveadm_print(retention == 0 ? "-" :
		      casbox_undelete_time(item->rec.expunged + retention));
	doveadm_print_num(item->rec.msg.physical_size);
}

/* Is a message with guid in box already? (a restore interrupted after
   its save) Returns 1 yes, 0 no, -1 error. */
static int casbox_undelete_present(struct mailbox *box, const char *guid)
{
	struct mailbox_transaction_context *t;
	struct mail_search_args *args;
	struct mail_search_context *sctx;
	struct mail *mail;
	int ret = 0;

	args = mail_search_build_init();
	mail_search_build_add_all(args);
	t = mailbox_transaction_begin(box, 0, __func__);
	sctx = mailbox_search_init(t, args, NULL, MAIL_FETCH_GUID, NULL);
	mail_search_args_unref(&args);
	while (ret == 0 && mailbox_search_next(sctx, &mail)) {
		const char *mguid;

		if (mail_get_special(mail, MAIL_FETCH_GUID, &mguid) < 0)
			ret = -1;
		else if (strcmp(mguid, guid) == 0)
			ret = 1;
	}
	if (mailbox_search_deinit(&sctx) < 0)
		ret = -1;
	(void)mailbox_transaction_commit(&t);
	return ret;
}

static int
casbox_undelete_open_box(struct mail_user *user, const char *vname,
			 struct mailbox **box_r, const char **error_r)
{
	struct mail_namespace *ns;
	struct mailbox *box;
	enum mail_error err;

	ns = mail_namespace_find(user->namespaces, vname);
	box = mailbox_alloc(ns->list, vname, MAILBOX_FLAG_IGNORE_ACLS);
	if (mailbox_open(box) < 0) {
		(void)mailbox_get_last_error(box, &err);
		/* a deleted mailbox comes back under its name */
		if (err != MAIL_ERROR_NOTFOUND ||
		    mailbox_create(box, NULL, FALSE) < 0 ||
		    mailbox_open(box) < 0) {
			*error_r = mailbox_get_last_internal_error(box, NULL);
			mailbox_free(&box);
			return -1;
		}
	}
	if (mailbox_sync(box, 0) < 0) {
		*error_r = mailbox_get_last_internal_error(box, NULL);
		mailbox_free(&box);
		return -1;
	}
	*box_r = box;
	return 0;
}

/* Save the retained message into box. Returns 0 ok (new UID in
   uid_r), -1 error. */
static int
casbox_undelete_save(struct casbox_store *store, struct mailbox *box,
		     const struct casbox_msg_record *rec, uint32_t *uid_r,
		     const char **error_r)
{
	struct mailbox_transaction_context *t;
	struct mail_transaction_commit_changes changes;
	struct mail_save_context *save_ctx;
	struct mail_keywords *kw = NULL;
	struct istream *input;
	const struct seq_range *range;
	int ret;

	ret = casbox_store_msg_open(store, rec, &input, error_r);
	if (ret <= 0) {
		if (ret == 0)
			*error_r = t_strdup_printf("blob lost: %s", *error_r);
		return -1;
	}
	t = mailbox_transaction_begin(box, MAILBOX_TRANSACTION_FLAG_EXTERNAL |
				      MAILBOX_TRANSACTION_FLAG_ASSIGN_UIDS,
				      __func__);
	if (array_count(&rec->keywords) > 0) {
		ARRAY_TYPE(const_string) names;

		t_array_init(&names, array_count(&rec->keywords) + 1);
		array_append_array(&names, &rec->keywords);
		array_append_zero(&names);
		kw = mailbox_keywords_create_valid(box, array_front(&names));
	}
	save_ctx = mailbox_save_alloc(t);
	/* \Deleted is how it was expunged */
	mailbox_save_set_flags(save_ctx, rec->flags &
			       ENUM_NEGATE(MAIL_DELETED | MAIL_RECENT), kw);
	mailbox_save_set_received_date(save_ctx, rec->received_date, 0);
	mailbox_save_set_save_date(save_ctx, rec->save_date);
	mailbox_save_set_guid(save_ctx, rec->guid);
	if (rec->pop3_uidl[0] != '\0')
		mailbox_save_set_pop3_uidl(save_ctx, rec->pop3_uidl);
	if (rec->pop3_order != 0)
		mailbox_save_set_pop3_order(save_ctx, rec->pop3_order);
	ret = mailbox_save_begin(&save_ctx, input);
	while (ret == 0 && i_stream_read(input) != -1) {
		if (mailbox_save_continue(save_ctx) < 0)
			ret = -1;
	}
	if (ret == 0 && input->stream_errno != 0) {
		*error_r = t_strdup_printf("read: %s",
					   i_stream_get_error(input));
		mailbox_save_cancel(&save_ctx);
		ret = -2;
	} else if (ret == 0) {
		ret = mailbox_save_finish(&save_ctx);
	} else if (save_ctx != NULL) {
		mailbox_save_cancel(&save_ctx);
	}
	i_stream_unref(&input);
	if (kw != NULL)
		mailbox_keywords_unref(&kw);
	if (ret < 0) {
		if (ret == -1)
			*error_r = mailbox_get_last_internal_error(box, NULL);
		mailbox_transaction_rollback(&t);
		return -1;
	}
	if (mailbox_transaction_commit_get_changes(&t, &changes) < 0) {
		*error_r = mailbox_get_last_internal_error(box, NULL);
		return -1;
	}
	range = array_front(&changes.saved_uids);
	*uid_r = range->seq1;
	pool_unref(&changes.pool);
	return 0;
}

static int
casbox_undelete_release(struct casbox_store *store,
			const struct casbox_undelete_item *item,
			const char **error_r)
{
	struct casbox_store_txn *txn;

	if (casbox_store_txn_begin(store, &txn, error_r) < 0)
		return -1;
	if (casbox_store_txn_release_retained(txn, item->mailbox_guid,
					      item->uid, error_r) < 0) {
		casbox_store_txn_rollback(&txn);
		return -1;
	}
	return casbox_store_txn_commit(&txn, error_r);
}

/* Restore one item. Returns 0 ok, -1 error (logged). */
static int
casbox_undelete_restore(struct casbox_undelete_cmd_context *ctx,
			struct mail_user *user, struct casbox_store *store,
			const struct casbox_undelete_item *item)
{
	const char *dest = ctx->to != NULL ? ctx->to :
		item->rec.mailbox_name;
	struct mailbox *box;
	const char *error, *result = "restored";
	uint32_t new_uid = 0;
	int ret;

	if (casbox_undelete_open_box(user, dest, &box, &error) < 0) {
		i_error("casbox undelete: mailbox %s: %s", dest, error);
		return -1;
	}
	ret = casbox_undelete_present(box, item->rec.msg.guid);
	if (ret > 0)
		result = "already present";
	else if (ret == 0)
		ret = casbox_undelete_save(store, box, &item->rec.msg,
					   &new_uid, &error);
	else
		error = mailbox_get_last_internal_error(box, NULL);
	mailbox_free(&box);
	if (ret >= 0 && casbox_undelete_release(store, item, &error) < 0)
		ret = -1;
	if (ret < 0) {
		i_error("casbox undelete: %s uid=%u guid=%s: %s",
			item->rec.mailbox_name, item->uid,
			item->rec.msg.guid, error);
		return -1;
	}
	doveadm_print(item->rec.mailbox_name);
	doveadm_print_num(item->uid);
	doveadm_print(item->rec.msg.guid);
	doveadm_print(dest);
	if (new_uid == 0)
		doveadm_print("-");
	else
		doveadm_print_num(new_uid);
	doveadm_print(result);
	return 0;
}

/* Password mode: a restore reads the messages, which needs the user
   key unlocked; this process has no casbox_key_password (a login gives
   it), so it reads the user's password from stdin as rebuild
   --from-packs does, and unlocks the store's key ring with it before
   anything is restored. --list reads only records and needs none.
   Returns 0 ok, -1 error (logged, exit status set). */
static int
casbox_undelete_unlock(struct doveadm_mail_cmd_context *_ctx,
		       struct casbox_storage *storage)
{
	struct casbox_key_input *input = NULL;
	struct casbox_store *store;
	const char *error;
	int ret;

	if (storage->set.key_mode != CAS_KEY_MODE_PASSWORD ||
	    storage->set.key_password != NULL)
		return 0;
	/* the usage checks first: opening the store needs the key file,
	   which may not exist yet for a user who never logged in */
	if (casbox_key_read_user_password(_ctx, "casbox undelete",
					  storage->root_dir, &input,
					  &storage->set.key_password) < 0)
		return -1;
	if (casbox_storage_get_store(storage, &store) < 0) {
		storage->set.key_password = NULL;
		casbox_key_input_free(&input);
		return 0;
	}
	/* the store's settings are storage->set: the key ring keeps the
	   unlocked key, not the password, which is wiped right after */
	ret = casbox_store_open_keys(store, &error);
	storage->set.key_password = NULL;
	casbox_key_input_free(&input);
	if (ret == 0 && casbox_store_key_locked(store)) {
		/* loaded without the password before (not expected) */
		error = "user key is locked";
		ret = -1;
	}
	if (ret < 0) {
		i_error("casbox undelete: %s: %s", storage->root_dir, error);
		if (strstr(error, "wrong password") != NULL)
			_ctx->exit_code = EX_DATAERR;
		else
			doveadm_mail_failed_error(_ctx, MAIL_ERROR_TEMP);
		return -1;
	}
	return 0;
}

static int
cmd_casbox_undelete_run(struct doveadm_mail_cmd_context *_ctx,
			struct mail_user *user)
{
	struct casbox_undelete_cmd_context *ctx =
		container_of(_ctx, struct casbox_undelete_cmd_context, ctx);
	struct casbox_storage *storage;
	struct casbox_store *store;
	struct casbox_undelete_collect coll;
	const struct casbox_undelete_item *item;
	const char *error;
	int ret = 0;

	casbox_doveadm_username_run(_ctx, user);
	storage = casbox_undelete_storage(user);
	if (storage == NULL)
		return casbox_admin_open_failed(_ctx, "casbox undelete", user,
						-1, "user has no casbox "
						"namespace");
	if (!ctx->list && casbox_undelete_unlock(_ctx, storage) < 0)
		return -1;
	if (casbox_storage_get_store(storage, &store) < 0) {
		i_error("casbox undelete: %s", mail_storage_get_last_internal_error(
			&storage->storage, NULL));
		doveadm_mail_failed_error(_ctx, MAIL_ERROR_TEMP);
		return -1;
	}
	i_zero(&coll);
	coll.ctx = ctx;
	coll.pool = pool_alloconly_create("casbox undelete", 4096);
	p_array_init(&coll.items, coll.pool, 16);
	if (casbox_store_retained_iterate(store, casbox_undelete_collect_cb,
					  &coll, &error) < 0) {
		i_error("casbox undelete: %s", error);
		doveadm_mail_failed_error(_ctx, MAIL_ERROR_TEMP);
		pool_unref(&coll.pool);
		return -1;
	}
	array_foreach(&coll.items, item) T_BEGIN {
		if (ctx->list) {
			casbox_undelete_print_item(item,
				storage->set.expunge_retention);
		} else if (casbox_undelete_restore(ctx, user, store,
						   item) < 0) {
			doveadm_mail_failed_error(_ctx, MAIL_ERROR_TEMP);
			ret = -1;
		}
	} T_END;
	pool_unref(&coll.pool);
	return ret;
}

static void
cmd_casbox_undelete_init(struct doveadm_mail_cmd_context *_ctx
			 CASBOX_DOVEADM_INIT_PARAMS)
{
	struct casbox_undelete_cmd_context *ctx =
		container_of(_ctx, struct casbox_undelete_cmd_context, ctx);
	static const char *const list_fields[] = {
		"mailbox", "uid", "guid", "expunged", "expires", "size", NULL
	};
	static const char *const restore_fields[] = {
		"mailbox", "uid", "guid", "restored_to", "new_uid", "result",
		NULL
	};
	const char *const *fields = ctx->list ? list_fields : restore_fields;
	const char *const *query = CASBOX_DOVEADM_ARGS(_ctx, "query");
	const char *error;

	casbox_doveadm_username_init(_ctx);
	if (query[0] != NULL) {
		ctx->query = doveadm_mail_build_search_args(query);
		if (casbox_undelete_query_check(ctx->query->args,
						&error) < 0) {
			i_fatal_status(EX_USAGE, "casbox undelete: search "
				       "query: %s", error);
		}
	}
	for (; *fields != NULL; fields++) {
		if (strcmp(*fields, "uid") == 0 ||
		    strcmp(*fields, "size") == 0 ||
		    strcmp(*fields, "new_uid") == 0) {
			doveadm_print_header(*fields, *fields,
				DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
		} else {
			doveadm_print_header_simple(*fields);
		}
	}
}

/* An interval in Dovecot's time units (2.3's settings_get_time() and
   2.4's str_parse_get_interval() differ in name only). Returns 0 ok,
   -1 not one. */
static int casbox_undelete_parse_interval(const char *value,
					  unsigned int *secs_r)
{
	static const struct {
		const char *unit;
		unsigned int secs;
	} units[] = {
		{ "s", 1 }, { "sec", 1 }, { "secs", 1 }, { "min", 60 },
		{ "mins", 60 }, { "h", 3600 }, { "hour", 3600 },
		{ "hours", 3600 }, { "d", 86400 }, { "day", 86400 },
		{ "days", 86400 }, { "w", 604800 }, { "week", 604800 },
		{ "weeks", 604800 },
	};
	const char *end;
	uintmax_t num;
	unsigned int i;

	if (str_parse_uintmax(value, &num, &end) < 0)
		return -1;
	while (*end == ' ')
		end++;
	for (i = 0; i < N_ELEMENTS(units); i++) {
		if (strcmp(end, units[i].unit) == 0 &&
		    num <= UINT_MAX / units[i].secs) {
			*secs_r = num * units[i].secs;
			return 0;
		}
	}
	return -1;
}

/* A Unix time, a date (YYYY-MM-DD, local time) or an interval back from
   now in Dovecot's units (2h, 7d). */
static time_t casbox_undelete_parse_time(const char *opt, const char *value)
{
	unsigned int secs;
	struct tm tm;
	time_t t;
	int n = 0;

	if (str_to_time(value, &t) == 0)
		return t;
	i_zero(&tm);
	if (sscanf(value, "%4d-%2d-%2d%n", &tm.tm_year, &tm.tm_mon,
		   &tm.tm_mday, &n) == 3 && value[n] == '\0') {
		tm.tm_year -= 1900;
		tm.tm_mon--;
		tm.tm_isdst = -1;
		return mktime(&tm);
	}
	if (casbox_undelete_parse_interval(value, &secs) == 0)
		return ioloop_time - (time_t)secs;
	i_fatal_status(EX_USAGE, "casbox undelete: --%s: not a Unix time, "
		       "YYYY-MM-DD or interval (2h, 7d): '%s'", opt, value);
}

static bool
cmd_casbox_undelete_parse_arg(struct doveadm_mail_cmd_context *_ctx, int c)
{
	struct casbox_undelete_cmd_context *ctx =
		container_of(_ctx, struct casbox_undelete_cmd_context, ctx);

	switch (c) {
	case 'l':
		ctx->list = TRUE;
		return TRUE;
	case 'm':
		ctx->mailbox = p_strdup(_ctx->pool, optarg);
		return TRUE;
	case 't':
		ctx->to = p_strdup(_ctx->pool, optarg);
		return TRUE;
	case 's':
		ctx->since = casbox_undelete_parse_time("since", optarg);
		return TRUE;
	case 'b':
		ctx->before = casbox_undelete_parse_time("before", optarg);
		return TRUE;
	default:
		return FALSE;
	}
}

static void cmd_casbox_undelete_deinit(struct doveadm_mail_cmd_context *_ctx)
{
	struct casbox_undelete_cmd_context *ctx =
		container_of(_ctx, struct casbox_undelete_cmd_context, ctx);

	if (ctx->query != NULL)
		mail_search_args_unref(&ctx->query);
}

struct doveadm_mail_cmd_context *cmd_casbox_undelete_alloc(void)
{
	struct casbox_undelete_cmd_context *ctx;

	ctx = doveadm_mail_cmd_alloc(struct casbox_undelete_cmd_context);
	CASBOX_DOVEADM_USERNAME_ALLOC(&ctx->ctx);
	casbox_doveadm_set_parse_arg(&ctx->ctx, "lm:t:s:b:",
				     cmd_casbox_undelete_parse_arg);
	ctx->ctx.v.init = cmd_casbox_undelete_init;
	ctx->ctx.v.run = cmd_casbox_undelete_run;
	ctx->ctx.v.deinit = cmd_casbox_undelete_deinit;
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return &ctx->ctx;
}
