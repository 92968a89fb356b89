/* doveadm casbox aecs export: a user's mail into the AECS database,
   incremental by each mailbox's UIDVALIDITY + HIGHESTMODSEQ. */

#include "lib.h"
#include "array.h"
#include "str.h"
#include "hash.h"
#include "ioloop.h"
#include "mkdir-parents.h"
#include "unlink-directory.h"
#include "mail-storage.h"
#include "mail-namespace.h"
#include "mail-search-build.h"
#include "doveadm-casbox-dovecot.h"
#include "mail-user.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "doveadm-mailbox-list-iter.h"
#include "aecs-norm.h"
#include "aecs-text.h"
#include "aecs-db.h"
#include "doveadm-casbox-aecs.h"
#include "doveadm-casbox-aecs-sql.h"

/* new messages per transaction */
#define AECS_EXPORT_COMMIT_EVERY 500

struct aecs_export_cmd_context {
	struct doveadm_mail_cmd_context ctx;
	const char *db_path, *sql_path, *blobs_dir, *mailbox_id_opt;
	unsigned int forai_max_chars;
	bool no_search;
	/* the mailbox names given, or NULL: all of them */
	const char *const *mailboxes;
	struct aecs_db *db;

	/* per user */
	const char *mailbox_id;
	pool_t user_pool;
	/* message keys whose x_fields must be rebuilt */
	HASH_TABLE(char *, char *) touched;
	struct timeval now;
	unsigned int uncommitted;
};

struct aecs_box_counts {
	unsigned int exported, updated, removed;
};

struct aecs_location {
	const char *mailbox;
	uint32_t uidvalidity, uid;
	const char *guid;
	uoff_t size;
	const char *flags, *keywords;
};

static int aecs_exec(struct aecs_export_cmd_context *ectx, const char *sql,
		     const struct aecs_value *values, unsigned int count)
{
	const char *error;
	int ret;

	ret = aecs_db_write(ectx->db, sql, values, count, &error);
	if (ret < 0)
		i_error("casbox aecs export: %s", error);
	return ret;
}

/* the first text column of the first row of a read, or NULL */
static const char *
aecs_read_first(struct aecs_export_cmd_context *ectx, const char *sql,
		const struct aecs_value *values, unsigned int count,
		const char **second_r)
{
	struct aecs_rows *rows;
	const char *first = NULL, *error;

	if (aecs_db_read_init(ectx->db, sql, values, count, &rows,
			      &error) < 0) {
		i_error("casbox aecs export: %s", error);
		return NULL;
	}
	if (aecs_db_read_next(rows) > 0) {
		first = t_strdup(aecs_db_read_text(rows, 0));
		if (second_r != NULL)
			*second_r = t_strdup(aecs_db_read_text(rows, 1));
	}
	if (aecs_db_read_deinit(&rows, &error) < 0)
		i_error("casbox aecs export: %s", error);
	return first;
}

static const char *aecs_flags_json(struct mail *mail)
{
	static const struct {
		enum mail_flags flag;
		const char *name;
	} names[] = {
		{ MAIL_ANSWERED, "\\Answered" },
		{ MAIL_FLAGGED, "\\Flagged" },
		{ MAIL_DELETED, "\\Deleted" },
		{ MAIL_SEEN, "\\Seen" },
		{ MAIL_DRAFT, "\\Draft" },
	};
	enum mail_flags flags = mail_get_flags(mail);
	string_t *str = t_str_new(64);
	unsigned int i;

	str_append_c(str, '[');
	for (i = 0; i < N_ELEMENTS(names); i++) {
		if ((flags & names[i].flag) == 0)
			continue;
		if (str_len(str) > 1)
			str_append_c(str, ',');
		aecs_json_append_str(str, names[i].name);
	}
	str_append_c(str, ']');
	return str_c(str);
}

static const char *aecs_keywords_json(struct mail *mail)
{
	const char *const *kw = mail_get_keywords(mail);
	string_t *str = t_str_new(64);

	str_append_c(str, '[');
	for (; *kw != NULL; kw++) {
		if (str_len(str) > 1)
			str_append_c(str, ',');
		aecs_json_append_str(str, aecs_text_sanitize(
			(const void *)*kw, strlen(*kw)));
	}
	str_append_c(str, ']');
	return str_c(str);
}

/* x_fields of key from its locations in casbox_aecs_source */
static const char *
aecs_x_fields(struct aecs_export_cmd_context *ectx, const char *key)
{
	const struct aecs_value v[] = {
		AECS_TEXT(ectx->mailbox_id), AECS_TEXT(key),
	};
	string_t *str = t_str_new(256);
	struct aecs_rows *rows;
	const char *error;
	unsigned int n = 0;

	str_append(str, "{\"x_dovecot\":{\"locations\":[");
	if (aecs_db_read_init(ectx->db, AECS_SQL_SOURCE_OF_KEY, v, 2, &rows,
			      &error) < 0) {
		i_error("casbox aecs export: %s", error);
		return NULL;
	}
	while (aecs_db_read_next(rows) > 0) {
		if (n++ > 0)
			str_append_c(str, ',');
		str_append(str, "{\"mailbox\":");
		aecs_json_append_str(str, aecs_db_read_text(rows, 0));
		str_printfa(str, ",\"uidvalidity\":%"PRId64",\"uid\":%"PRId64
			    ",\"guid\":", aecs_db_read_int(rows, 1),
			    aecs_db_read_int(rows, 2));
		aecs_json_append_str(str, aecs_db_read_text(rows, 3));
		str_printfa(str, ",\"size\":%"PRId64",\"flags\":%s"
			    ",\"keywords\":%s}", aecs_db_read_int(rows, 4),
			    aecs_db_read_text(rows, 5),
			    aecs_db_read_text(rows, 6));
	}
	if (aecs_db_read_deinit(&rows, &error) < 0) {
		i_error("casbox aecs export: %s", error);
		return NULL;
	}
	str_append(str, "]}}");
	return str_c(str);
}

static void aecs_touch(struct aecs_export_cmd_context *ectx, const char *key)
{
	char *dup;

	if (hash_table_lookup(ectx->touched, key) != NULL)
		return;
	dup = p_strdup(ectx->user_pool, key);
	hash_table_insert(ectx->touched, dup, dup);
}

static int aecs_update_touched(struct aecs_export_cmd_context *ectx)
{
	struct hash_iterate_context *iter;
	char *key, *value;
	int ret = 0;

	iter = hash_table_iterate_init(ectx->touched);
	while (ret == 0 && hash_table_iterate(iter, ectx->touched,
					      &key, &value)) T_BEGIN {
		const char *x = aecs_x_fields(ectx, key);
		const struct aecs_value v[] = {
			AECS_TEXT(ectx->mailbox_id), AECS_TEXT(key),
			AECS_TEXT_OR_NULL(x),
		};

		if (x == NULL || aecs_exec(ectx, AECS_SQL_MESSAGE_XFIELDS,
					   v, 3) < 0)
			ret = -1;
	} T_END;
	hash_table_iterate_deinit(&iter);
	hash_table_clear(ectx->touched, TRUE);
	return ret;
}

static const char *aecs_blob_prefix(struct aecs_export_cmd_context *ectx,
				    const char *key)
{
	if (ectx->blobs_dir == NULL)
		return NULL;
	return t_strconcat(ectx->blobs_dir, "/", key, "/", NULL);
}

static int aecs_remove_message(struct aecs_export_cmd_context *ectx,
			       const char *key)
{
	static const char *const deletes[] = {
		AECS_SQL_DELETE_BODY, AECS_SQL_DELETE_ADDRESSES,
		AECS_SQL_DELETE_REFERENCES, AECS_SQL_DELETE_ATTACHMENTS,
		AECS_SQL_DELETE_MESSAGE,
	};
	const struct aecs_value v[] = {
		AECS_TEXT(ectx->mailbox_id), AECS_TEXT(key),
	};
	const char *thread_key = NULL, *error;
	unsigned int i;

	if (aecs_read_first(ectx, AECS_SQL_MESSAGE_THREAD, v, 2,
			    &thread_key) == NULL)
		return 0;
	if (aecs_db_has_search(ectx->db) &&
	    aecs_exec(ectx, AECS_SQL_DELETE_SEARCH, v, 2) < 0)
		return -1;
	for (i = 0; i < N_ELEMENTS(deletes); i++) {
		if (aecs_exec(ectx, deletes[i], v, 2) < 0)
			return -1;
	}
	const struct aecs_value tv[] = {
		AECS_TEXT(ectx->mailbox_id), AECS_TEXT(thread_key),
	};
	if (aecs_exec(ectx, AECS_SQL_THREAD_RECOUNT, tv, 2) < 0 ||
	    aecs_exec(ectx, AECS_SQL_THREAD_DROP_EMPTY, tv, 2) < 0)
		return -1;
	/* the plaintext copies go with the row */
	if (ectx->blobs_dir != NULL &&
	    unlink_directory(aecs_blob_prefix(ectx, key),
			     UNLINK_DIRECTORY_FLAG_RMDIR, &error) < 0) {
		i_error("casbox aecs export: %s", error);
		return -1;
	}
	return 0;
}

/* One location (mailbox, uid) of key is gone. */
static int aecs_remove_location(struct aecs_export_cmd_context *ectx,
				const char *mailbox, uint32_t uid,
				const char *key)
{
	const struct aecs_value v[] = {
		AECS_TEXT(ectx->mailbox_id), AECS_TEXT(mailbox), AECS_INT(uid),
	};
	const struct aecs_value kv[] = {
		AECS_TEXT(ectx->mailbox_id), AECS_TEXT(key),
	};

	if (aecs_exec(ectx, AECS_SQL_SOURCE_DELETE, v, 3) < 0)
		return -1;
	if (aecs_read_first(ectx, AECS_SQL_SOURCE_OF_KEY, kv, 2,
			    NULL) != NULL) {
		aecs_touch(ectx, key);
		return 0;
	}
	return aecs_remove_message(ectx, key);
}

static int aecs_add_location(struct aecs_export_cmd_context *ectx,
			     const struct aecs_location *loc, const char *key)
{
	const struct aecs_value v[] = {
		AECS_TEXT(ectx->mailbox_id), AECS_TEXT(loc->mailbox),
		AECS_INT(loc->uid), AECS_INT(loc->uidvalidity),
		AECS_TEXT(key), AECS_TEXT(loc->guid), AECS_INT(loc->size),
		AECS_TEXT(loc->flags), AECS_TEXT(loc->keywords),
	};

	return aecs_exec(ectx, AECS_SQL_SOURCE_ADD, v, N_ELEMENTS(v)) < 0 ?
		-1 : 0;
}
static void aecs_location_get(struct mail *mail, const char *mailbox,
			      uint32_t uidvalidity, struct aecs_location *loc_r)
{
	const char *guid;
	uoff_t size;

	i_zero(loc_r);
	loc_r->mailbox = mailbox;
	loc_r->uidvalidity = uidvalidity;
	loc_r->uid = mail->uid;
	if (mail_get_special(mail, MAIL_FETCH_GUID, &guid) < 0)
		guid = "";
	loc_r->guid = guid;
	if (mail_get_physical_size(mail, &size) < 0)
		size = 0;
	loc_r->size = size;
	loc_r->flags = aecs_flags_json(mail);
	loc_r->keywords = aecs_keywords_json(mail);
}

static time_t aecs_save_date(struct mail *mail)
{
	time_t t;

	if (mail_get_save_date(mail, &t) < 0 || t <= 0) {
		if (mail_get_received_date(mail, &t) < 0 || t < 0)
			t = ioloop_time;
	}
	return t;
}

/* A message not exported from this location before. */
static int aecs_export_new(struct aecs_export_cmd_context *ectx,
			   struct mail *mail, const char *mailbox,
			   uint32_t uidvalidity, bool *exported_r)
{
	struct aecs_row_settings set = {
		.mailbox_id = ectx->mailbox_id,
		.blobs_dir = ectx->blobs_dir,
		.forai_max_chars = ectx->forai_max_chars,
		.processed_at = aecs_processed_at(&ectx->now),
	};
	struct aecs_location loc;
	struct aecs_parsed parsed;
	struct istream *input;
	const char *key, *error;
	pool_t pool;
	int ret;

	*exported_r = FALSE;
	pool = pool_alloconly_create("aecs message", 16384);
	ret = aecs_mail_parse(mail, pool, &parsed, &error);
	if (ret == 0 && mail_get_stream(mail, NULL, NULL, &input) < 0) {
		error = mailbox_get_last_internal_error(mail->box, NULL);
		ret = -1;
	}
	if (ret < 0) {
		pool_unref(&pool);
		/* expunged meanwhile: the next run sees it gone */
		if (mail->expunged)
			return 0;
		i_error("casbox aecs export: %s UID %u: %s", mailbox,
			mail->uid, error);
		return -1;
	}
	key = aecs_key(parsed.message_id);
	aecs_location_get(mail, mailbox, uidvalidity, &loc);
	ret = aecs_add_location(ectx, &loc, key);
	if (ret >= 0) {
		ret = aecs_rows_write(ectx->db, &set, &parsed, key,
				      aecs_save_date(mail),
				      aecs_x_fields(ectx, key), input,
				      &error);
		if (ret < 0) {
			i_error("casbox aecs export: %s UID %u: %s", mailbox,
				mail->uid, error);
		} else if (ret == 0) {
			/* a copy of a stored message (or the same
			   Message-ID): one more location */
			aecs_touch(ectx, key);
		}
		*exported_r = ret > 0;
	}
	pool_unref(&pool);
	return ret < 0 ? -1 : 0;
}

static int aecs_export_flags(struct aecs_export_cmd_context *ectx,
			     struct mail *mail, const char *mailbox,
			     const char *key, const char *old_flags,
			     const char *old_keywords, bool *changed_r)
{
	const char *flags = aecs_flags_json(mail);
	const char *keywords = aecs_keywords_json(mail);
	const struct aecs_value v[] = {
		AECS_TEXT(ectx->mailbox_id), AECS_TEXT(mailbox),
		AECS_INT(mail->uid), AECS_TEXT(flags), AECS_TEXT(keywords),
	};

	*changed_r = strcmp(flags, old_flags) != 0 ||
		strcmp(keywords, old_keywords) != 0;
	if (!*changed_r)
		return 0;
	aecs_touch(ectx, key);
	return aecs_exec(ectx, AECS_SQL_SOURCE_FLAGS, v, N_ELEMENTS(v)) < 0 ?
		-1 : 0;
}

struct aecs_known {
	char *key, *flags, *keywords;
	bool seen;
};
HASH_TABLE_DEFINE_TYPE(uid_known, void *, struct aecs_known *);
HASH_TABLE_DEFINE_TYPE(vname_seen, char *, char *);

/* The locations exported from mailbox before: uid -> aecs_known. */
static int aecs_known_load(struct aecs_export_cmd_context *ectx,
			   pool_t pool, const char *mailbox,
			   HASH_TABLE_TYPE(uid_known) *known_r)
{
	const struct aecs_value v[] = {
		AECS_TEXT(ectx->mailbox_id), AECS_TEXT(mailbox),
	};
	struct aecs_rows *rows;
	const char *error;

	hash_table_create_direct(known_r, pool, 0);
	if (aecs_db_read_init(ectx->db, AECS_SQL_SOURCE_LIST, v, 2, &rows,
			      &error) < 0) {
		i_error("casbox aecs export: %s", error);
		return -1;
	}
	while (aecs_db_read_next(rows) > 0) {
		struct aecs_known *k = p_new(pool, struct aecs_known, 1);
		uint32_t uid = aecs_db_read_int(rows, 0);

		k->key = p_strdup(pool, aecs_db_read_text(rows, 1));
		k->flags = p_strdup(pool, aecs_db_read_text(rows, 2));
		k->keywords = p_strdup(pool, aecs_db_read_text(rows, 3));
		hash_table_insert(*known_r, POINTER_CAST(uid), k);
	}
	if (aecs_db_read_deinit(&rows, &error) < 0) {
		i_error("casbox aecs export: %s", error);
		return -1;
	}
	return 0;
}

static int aecs_commit_step(struct aecs_export_cmd_context *ectx,
			    bool force)
{
	const char *error;

	if (!force && ++ectx->uncommitted < AECS_EXPORT_COMMIT_EVERY)
		return 0;
	ectx->uncommitted = 0;
	if (aecs_db_commit(ectx->db, &error) < 0 ||
	    (!force && aecs_db_begin(ectx->db, &error) < 0)) {
		i_error("casbox aecs export: %s", error);
		return -1;
	}
	return 0;
}

/* Expunged: every known location that the search did not see. */
static int aecs_export_expunged(struct aecs_export_cmd_context *ectx,
				const char *mailbox,
				HASH_TABLE_TYPE(uid_known) known,
				struct aecs_box_counts *counts)
{
	struct hash_iterate_context *iter;
	struct aecs_known *k;
	void *uidp;
	int ret = 0;

	iter = hash_table_iterate_init(known);
	while (ret == 0 && hash_table_iterate(iter, known, &uidp, &k)) {
		if (k->seen)
			continue;
		T_BEGIN {
			ret = aecs_remove_location(ectx, mailbox,
				POINTER_CAST_TO(uidp, uint32_t), k->key);
		} T_END;
		counts->removed++;
	}
	hash_table_iterate_deinit(&iter);
	return ret;
}

static int aecs_export_mails(struct aecs_export_cmd_context *ectx,
			     struct mailbox *box, const char *mailbox,
			     uint32_t uidvalidity, uint64_t since_modseq,
			     HASH_TABLE_TYPE(uid_known) known,
			     struct aecs_box_counts *counts)
{
	struct mailbox_transaction_context *trans;
	struct mail_search_args *args;
	struct mail_search_context *search;
	struct mail *mail;
	int ret = 0;

	args = mail_search_build_init();
	mail_search_build_add_all(args);
	trans = mailbox_transaction_begin(box, 0, "casbox aecs export");
	search = mailbox_search_init(trans, args, NULL, MAIL_FETCH_FLAGS,
				     NULL);
	mail_search_args_unref(&args);
	while (ret == 0 && mailbox_search_next(search, &mail)) T_BEGIN {
		struct aecs_known *k = hash_table_lookup(known,
			POINTER_CAST(mail->uid));
		bool done = FALSE;

		if (k == NULL) {
			ret = aecs_export_new(ectx, mail, mailbox,
					      uidvalidity, &done);
			if (done)
				counts->exported++;
			if (ret == 0)
				ret = aecs_commit_step(ectx, FALSE);
		} else {
			k->seen = TRUE;
			if (mail_get_modseq(mail) > since_modseq)
				ret = aecs_export_flags(ectx, mail, mailbox,
					k->key, k->flags, k->keywords, &done);
			if (done)
				counts->updated++;
		}
	} T_END;
	if (mailbox_search_deinit(&search) < 0) {
		i_error("casbox aecs export: %s: search failed: %s", mailbox,
			mailbox_get_last_internal_error(box, NULL));
		ret = -1;
	}
	(void)mailbox_transaction_commit(&trans);
	return ret;
}

/* Drop every location of mailbox (a UIDVALIDITY change, or the mailbox
   is gone). */
static int aecs_forget_mailbox(struct aecs_export_cmd_context *ectx,
			       const char *mailbox,
			       struct aecs_box_counts *counts)
{
	HASH_TABLE_TYPE(uid_known) known;
	pool_t pool = pool_alloconly_create("aecs known", 4096);
	int ret;

	ret = aecs_known_load(ectx, pool, mailbox, &known);
	if (ret == 0)
		ret = aecs_export_expunged(ectx, mailbox, known, counts);
	hash_table_destroy(&known);
	pool_unref(&pool);
	return ret;
}

static int aecs_export_box_open(struct aecs_export_cmd_context *ectx,
				struct mailbox *box,
				struct mailbox_status *status_r)
{
	if (mailbox_open(box) < 0 ||
	    mailbox_enable(box, MAILBOX_FEATURE_CONDSTORE) < 0 ||
	    mailbox_sync(box, 0) < 0) {
		i_error("casbox aecs export: %s: %s", mailbox_get_vname(box),
			mailbox_get_last_internal_error(box, NULL));
		doveadm_mail_failed_mailbox(&ectx->ctx, box);
		return -1;
	}
	mailbox_get_open_status(box, STATUS_UIDVALIDITY |
				STATUS_HIGHESTMODSEQ, status_r);
	return 0;
}

static int aecs_export_box_sync(struct aecs_export_cmd_context *ectx,
				struct mailbox *box,
				const struct mailbox_status *status,
				struct aecs_box_counts *counts)
{
	const char *vname = mailbox_get_vname(box);
	const struct aecs_value cv[] = {
		AECS_TEXT(ectx->mailbox_id), AECS_TEXT(vname),
		AECS_INT(status->uidvalidity),
		AECS_INT((int64_t)status->highest_modseq),
	};
	HASH_TABLE_TYPE(uid_known) known;
	const char *uv_str, *modseq_str = NULL;
	uint64_t since = 0;
	pool_t pool;
	int ret = 0;

	uv_str = aecs_read_first(ectx, AECS_SQL_CURSOR_GET, cv, 2,
				 &modseq_str);
	if (uv_str != NULL &&
	    strcmp(uv_str, dec2str(status->uidvalidity)) == 0) {
		if (str_to_uint64(modseq_str, &since) < 0)
			since = 0;
		if (since == status->highest_modseq)
			return 0;
	} else if (uv_str != NULL) {
		/* UIDVALIDITY changed: the old UIDs mean nothing */
		ret = aecs_forget_mailbox(ectx, vname, counts);
	}
	pool = pool_alloconly_create("aecs known", 16384);
	if (ret == 0)
		ret = aecs_known_load(ectx, pool, vname, &known);
	else
		hash_table_create_direct(&known, pool, 0);
	if (ret == 0)
		ret = aecs_export_mails(ectx, box, vname, status->uidvalidity,
					since, known, counts);
	if (ret == 0)
		ret = aecs_export_expunged(ectx, vname, known, counts);
	hash_table_destroy(&known);
	pool_unref(&pool);
	if (ret == 0)
		ret = aecs_update_touched(ectx);
	if (ret == 0 && aecs_exec(ectx, AECS_SQL_CURSOR_SET, cv, 4) < 0)
		ret = -1;
	return ret;
}

static void aecs_print_counts(struct aecs_export_cmd_context *ectx,
			      const char *mailbox,
			      const struct aecs_box_counts *counts)
{
	doveadm_print(ectx->mailbox_id);
	doveadm_print(mailbox);
	doveadm_print_num(counts->exported);
	doveadm_print_num(counts->updated);
	doveadm_print_num(counts->removed);
}

static int aecs_export_box(struct aecs_export_cmd_context *ectx,
			   const struct mailbox_info *info)
{
	struct aecs_box_counts counts;
	struct mailbox_status status;
	struct mailbox *box;
	const char *error;
	int ret;

	i_zero(&counts);
	box = mailbox_alloc(info->ns->list, info->vname,
			    MAILBOX_FLAG_READONLY | MAILBOX_FLAG_IGNORE_ACLS);
	ret = aecs_export_box_open(ectx, box, &status);
	if (ret == 0 && aecs_db_begin(ectx->db, &error) < 0) {
		i_error("casbox aecs export: %s", error);
		ret = -1;
	}
	if (ret == 0) {
		ectx->uncommitted = 0;
		ret = aecs_export_box_sync(ectx, box, &status, &counts);
		if (ret < 0)
			aecs_db_rollback(ectx->db);
		else if (aecs_commit_step(ectx, TRUE) < 0)
			ret = -1;
	}
	if (ret < 0)
		doveadm_mail_failed_error(&ectx->ctx, MAIL_ERROR_TEMP);
	else
		aecs_print_counts(ectx, info->vname, &counts);
	mailbox_free(&box);
	return ret;
}

/* Mailboxes in the cursor table that no longer exist: their messages
   are gone. */
static int aecs_export_vanished(struct aecs_export_cmd_context *ectx,
				HASH_TABLE_TYPE(vname_seen) seen)
{
	const struct aecs_value v[] = { AECS_TEXT(ectx->mailbox_id) };
	ARRAY_TYPE(const_string) gone;
	struct aecs_rows *rows;
	const char *name, *error;
	int ret = 0;

	t_array_init(&gone, 4);
	if (aecs_db_read_init(ectx->db, AECS_SQL_CURSOR_LIST, v, 1, &rows,
			      &error) < 0) {
		i_error("casbox aecs export: %s", error);
		return -1;
	}
	while (aecs_db_read_next(rows) > 0) {
		name = aecs_db_read_text(rows, 0);
		if (hash_table_lookup(seen, name) == NULL) {
			name = t_strdup(name);
			array_push_back(&gone, &name);
		}
	}
	if (aecs_db_read_deinit(&rows, &error) < 0) {
		i_error("casbox aecs export: %s", error);
		return -1;
	}
	array_foreach_elem(&gone, name) {
		struct aecs_box_counts counts;
		const struct aecs_value cv[] = {
			AECS_TEXT(ectx->mailbox_id), AECS_TEXT(name),
		};

		i_zero(&counts);
		if (aecs_db_begin(ectx->db, &error) < 0) {
			i_error("casbox aecs export: %s", error);
			ret = -1;
			break;
		}
		/* each of these logs its own error */
		if (aecs_forget_mailbox(ectx, name, &counts) < 0 ||
		    aecs_update_touched(ectx) < 0 ||
		    aecs_exec(ectx, AECS_SQL_CURSOR_DELETE, cv, 2) < 0) {
			aecs_db_rollback(ectx->db);
			ret = -1;
			break;
		}
		if (aecs_db_commit(ectx->db, &error) < 0) {
			i_error("casbox aecs export: %s", error);
			ret = -1;
			break;
		}
		aecs_print_counts(ectx, name, &counts);
	}
	return ret;
}

/* Opened by the first user's run, not in init: doveadm runs a mail
   command with the mail user's privileges, and the file must be
   theirs. */
static int aecs_export_db_open(struct aecs_export_cmd_context *ectx)
{
	static const char *const ddl[] = {
		AECS_SQL_CURSOR_DDL, AECS_SQL_SOURCE_DDL,
		AECS_SQL_SOURCE_KEY_DDL,
	};
	const char *error;
	unsigned int i;

	if (ectx->db != NULL)
		return 0;
	if (ectx->blobs_dir != NULL &&
	    mkdir_parents(ectx->blobs_dir, 0700) < 0 && errno != EEXIST) {
		i_error("casbox aecs export: mkdir(%s) failed: %m",
			ectx->blobs_dir);
		return -1;
	}
	if (aecs_db_open(ectx->db_path, ectx->sql_path,
			 ectx->no_search ? AECS_DB_FLAG_NO_SEARCH : 0,
			 &ectx->db, &error) < 0) {
		i_error("casbox aecs export: %s", error);
		return -1;
	}
	for (i = 0; i < N_ELEMENTS(ddl); i++) {
		if (aecs_db_write(ectx->db, ddl[i], NULL, 0, &error) < 0) {
			i_error("casbox aecs export: %s", error);
			return -1;
		}
	}
	return 0;
}

static int cmd_casbox_aecs_export_run(struct doveadm_mail_cmd_context *ctx,
				      struct mail_user *user)
{
	struct aecs_export_cmd_context *ectx =
		container_of(ctx, struct aecs_export_cmd_context, ctx);
	const enum mailbox_list_iter_flags iter_flags =
		MAILBOX_LIST_ITER_NO_AUTO_BOXES |
		MAILBOX_LIST_ITER_STAR_WITHIN_NS;
	const enum mail_namespace_type ns_mask = MAIL_NAMESPACE_TYPE_PRIVATE;
	HASH_TABLE_TYPE(vname_seen) seen;
	struct doveadm_mailbox_list_iter *iter;
	const struct mailbox_info *info;
	int ret = 0;

	if (aecs_export_db_open(ectx) < 0) {
		doveadm_mail_failed_error(ctx, MAIL_ERROR_TEMP);
		return -1;
	}
	ectx->mailbox_id = ectx->mailbox_id_opt != NULL ?
		ectx->mailbox_id_opt : p_strdup(ctx->pool, user->username);
	ectx->user_pool = pool_alloconly_create("aecs user", 4096);
	hash_table_create(&ectx->touched, ectx->user_pool, 0, str_hash,
			  strcmp);
	hash_table_create(&seen, ectx->user_pool, 0, str_hash, strcmp);
	if (gettimeofday(&ectx->now, NULL) < 0)
		i_fatal("gettimeofday() failed: %m");

	iter = doveadm_mailbox_list_iter_init(ctx, user, ctx->search_args,
					      iter_flags);
	while ((info = doveadm_mailbox_list_iter_next(iter)) != NULL) T_BEGIN {
		if ((info->flags & (MAILBOX_NOSELECT |
				    MAILBOX_NONEXISTENT)) == 0 &&
		    (info->ns->type & ns_mask) != 0) {
			char *vname = p_strdup(ectx->user_pool, info->vname);

			hash_table_insert(seen, vname, vname);
			if (aecs_export_box(ectx, info) < 0)
				ret = -1;
		}
	} T_END;
	if (doveadm_mailbox_list_iter_deinit(&iter) < 0)
		ret = -1;
	/* with mailbox names given, the others are not looked at */
	if (ret == 0 && ectx->mailboxes == NULL)
		ret = aecs_export_vanished(ectx, seen);
	hash_table_destroy(&seen);
	hash_table_destroy(&ectx->touched);
	pool_unref(&ectx->user_pool);
	return ret;
}

static void cmd_casbox_aecs_export_init(struct doveadm_mail_cmd_context *ctx
					CASBOX_DOVEADM_INIT_PARAMS)
{
	struct aecs_export_cmd_context *ectx =
		container_of(ctx, struct aecs_export_cmd_context, ctx);
	static const char *const all[] = { "*", NULL };
	const char *const *names = CASBOX_DOVEADM_ARGS(ctx, "mailbox-mask");

	if ((ectx->db_path == NULL) == (ectx->sql_path == NULL)) {
		i_fatal_status(EX_USAGE, "casbox aecs export: give one of "
			       "--db FILE or --sql FILE");
	}
	if (ectx->mailbox_id_opt != NULL && !ctx->iterate_single_user) {
		/* every user's rows would share one mailbox_id */
		i_fatal_status(EX_USAGE, "casbox aecs export: --mailbox-id "
			       "is for one user (-u without wildcards)");
	}
	ectx->mailboxes = names[0] == NULL ? NULL : names;
	ctx->search_args = doveadm_mail_mailbox_search_args_build(
		names[0] == NULL ? all : names);
	doveadm_print_header_simple("mailbox_id");
	doveadm_print_header_simple("mailbox");
	doveadm_print_header("exported", "exported",
			     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	doveadm_print_header("updated", "updated",
			     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	doveadm_print_header("removed", "removed",
			     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
}

static void cmd_casbox_aecs_export_deinit(struct doveadm_mail_cmd_context *ctx)
{
	struct aecs_export_cmd_context *ectx =
		container_of(ctx, struct aecs_export_cmd_context, ctx);
	const char *error;

	if (ectx->db != NULL && aecs_db_oversize_statements(ectx->db) > 0) {
		i_warning("casbox aecs export: %s: %u statement(s) longer "
			  "than D1's %u bytes (long message texts): the "
			  "sqlite3 CLI loads them, wrangler d1 execute "
			  "refuses them", ectx->sql_path,
			  aecs_db_oversize_statements(ectx->db),
			  AECS_DB_D1_MAX_STATEMENT);
	}
	if (ectx->db != NULL && aecs_db_close(&ectx->db, &error) < 0) {
		i_error("casbox aecs export: %s", error);
		doveadm_mail_failed_error(ctx, MAIL_ERROR_TEMP);
	}
}

static bool
cmd_casbox_aecs_export_parse_arg(struct doveadm_mail_cmd_context *ctx, int c)
{
	struct aecs_export_cmd_context *ectx =
		container_of(ctx, struct aecs_export_cmd_context, ctx);

	switch (c) {
	case 'd':
		ectx->db_path = p_strdup(ctx->pool, optarg);
		return TRUE;
	case 's':
		ectx->sql_path = p_strdup(ctx->pool, optarg);
		return TRUE;
	case 'b':
		ectx->blobs_dir = p_strdup(ctx->pool, optarg);
		return TRUE;
	case 'i':
		if (*optarg == '\0') {
			i_fatal_status(EX_USAGE, "casbox aecs export: "
				       "--mailbox-id wants a value");
		}
		ectx->mailbox_id_opt = p_strdup(ctx->pool, optarg);
		return TRUE;
	case 'm':
		if (str_to_uint(optarg, &ectx->forai_max_chars) < 0) {
			i_fatal_status(EX_USAGE, "casbox aecs export: "
				       "--forai-max-chars wants a number, "
				       "not '%s'", optarg);
		}
		return TRUE;
	case 'n':
		ectx->no_search = TRUE;
		return TRUE;
	default:
		return FALSE;
	}
}

struct doveadm_mail_cmd_context *cmd_casbox_aecs_export_alloc(void)
{
	struct aecs_export_cmd_context *ectx;

	ectx = doveadm_mail_cmd_alloc(struct aecs_export_cmd_context);
	ectx->forai_max_chars = AECS_FORAI_DEFAULT_MAX_CHARS;
	casbox_doveadm_set_parse_arg(&ectx->ctx, "d:s:b:i:m:n",
				     cmd_casbox_aecs_export_parse_arg);
	ectx->ctx.v.init = cmd_casbox_aecs_export_init;
	ectx->ctx.v.deinit = cmd_casbox_aecs_export_deinit;
	ectx->ctx.v.run = cmd_casbox_aecs_export_run;
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return &ectx->ctx;
}
