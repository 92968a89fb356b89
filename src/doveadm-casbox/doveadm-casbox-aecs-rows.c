/* doveadm casbox aecs export: one parsed message as AECS rows, through
   the named queries of sqlite-queries.sql, and its blobs. */

#include "lib.h"
#include "array.h"
#include "str.h"
#include "istream.h"
#include "mkdir-parents.h"
#include "aecs-norm.h"
#include "aecs-text.h"
#include "aecs-db.h"
#include "doveadm-casbox-aecs.h"
#include "doveadm-casbox-aecs-sql.h"

static const char *const aecs_role_names[] = {
	"from", "to", "cc", "bcc",
};

static bool aecs_rows_exist(struct aecs_db *db, const char *mailbox_id,
			    const char *key)
{
	const struct aecs_value v[] = {
		AECS_TEXT(mailbox_id), AECS_TEXT(key),
	};
	struct aecs_rows *rows;
	const char *error;
	bool found;

	if (aecs_db_read_init(db, AECS_SQL_MESSAGE_THREAD, v, 2, &rows,
			      &error) < 0)
		return FALSE;
	found = aecs_db_read_next(rows) > 0;
	(void)aecs_db_read_deinit(&rows, &error);
	return found;
}

struct aecs_row_ctx {
	struct aecs_db *db;
	const struct aecs_row_settings *set;
	const struct aecs_parsed *parsed;
	const char *key, *thread_id, *thread_key;
	int64_t ts;
	const char *clean;
	bool clean_fallback;
	const char *error;
};

static int aecs_row_message(struct aecs_row_ctx *r, const char *x_fields)
{
	const struct aecs_parsed *p = r->parsed;
	const char *date = !p->have_date ? NULL :
		aecs_date_rfc3339(p->date, p->date_tz);
	const char *blob_prefix = r->set->blobs_dir == NULL ? NULL :
		t_strconcat(r->set->blobs_dir, "/", r->key, "/", NULL);
	const struct aecs_value v[] = {
		AECS_TEXT(r->set->mailbox_id), AECS_TEXT(r->key),
		AECS_TEXT(p->message_id), AECS_TEXT(r->thread_key),
		AECS_TEXT(r->thread_id), AECS_INT(r->ts),
		AECS_TEXT_OR_NULL(date), AECS_TEXT(p->from_email),
		AECS_TEXT_OR_NULL(p->from_name),
		AECS_TEXT_OR_NULL(p->subject),
		AECS_TEXT_OR_NULL(p->in_reply_to),
		AECS_TEXT_OR_NULL(aecs_forai(p->from_name, p->from_email, date,
					     p->subject, r->clean,
					     r->set->forai_max_chars)),
		AECS_INT(array_count(&p->attachments)), AECS_INT(p->size),
		AECS_INT(r->clean_fallback ? 1 : 0),
		AECS_TEXT(AECS_SPEC_VERSION), AECS_TEXT(r->set->processed_at),
		AECS_TEXT_OR_NULL(blob_prefix), AECS_TEXT_OR_NULL(x_fields),
	};
	const struct aecs_value tv[] = {
		AECS_TEXT(r->set->mailbox_id), AECS_TEXT(r->thread_key),
		AECS_TEXT(r->thread_id), AECS_TEXT_OR_NULL(p->subject),
		AECS_INT(r->ts), AECS_TEXT(r->key),
	};
	int ret;

	ret = aecs_db_write(r->db, aecs_db_named("insert_message"), v,
			    N_ELEMENTS(v), &r->error);
	if (ret <= 0)
		return ret;
	/* directly after insert_message: its changes() guard */
	if (aecs_db_write(r->db, aecs_db_named("upsert_thread"), tv,
			  N_ELEMENTS(tv), &r->error) < 0)
		return -1;
	return 1;
}

static int aecs_row_details(struct aecs_row_ctx *r)
{
	const struct aecs_parsed *p = r->parsed;
	const struct aecs_address *addr;
	const char *ref;
	unsigned int i;
	const struct aecs_value bv[] = {
		AECS_TEXT(r->set->mailbox_id), AECS_TEXT(r->key),
		AECS_TEXT(p->text), AECS_TEXT(r->clean),
	};

	if (aecs_db_write(r->db, aecs_db_named("insert_body"), bv, 4,
			  &r->error) < 0)
		return -1;
	array_foreach(&p->addresses, addr) {
		const struct aecs_value v[] = {
			AECS_TEXT(r->set->mailbox_id), AECS_TEXT(r->key),
			AECS_TEXT(aecs_role_names[addr->role]),
			AECS_TEXT(addr->email), AECS_TEXT_OR_NULL(addr->name),
			AECS_INT(r->ts), AECS_TEXT(r->thread_key),
		};

		if (aecs_db_write(r->db, aecs_db_named("insert_address"), v,
				  N_ELEMENTS(v), &r->error) < 0)
			return -1;
	}
	i = 0;
	array_foreach_elem(&p->references, ref) {
		const struct aecs_value v[] = {
			AECS_TEXT(r->set->mailbox_id), AECS_TEXT(r->key),
			AECS_INT(i++), AECS_TEXT(ref),
		};

		if (aecs_db_write(r->db, aecs_db_named("insert_reference"), v,
				  N_ELEMENTS(v), &r->error) < 0)
			return -1;
	}
	return 0;
}

static int aecs_row_blob(struct aecs_row_ctx *r, struct istream *input,
			 const struct aecs_attachment *part, const char *name,
			 uoff_t *size_r)
{
	const char *path = r->set->blobs_dir == NULL ? NULL :
		t_strconcat(r->set->blobs_dir, "/", r->key, "/", name, NULL);

	return aecs_mail_part_save(input, part, path, size_r, &r->error);
}

static int aecs_row_attachments(struct aecs_row_ctx *r, struct istream *input)
{
	const struct aecs_parsed *p = r->parsed;
	const struct aecs_attachment *att;
	unsigned int idx = 0;
	uoff_t size;

	array_foreach(&p->attachments, att) {
		const char *name = t_strdup_printf("att/%u", idx);
		const char *blob_key = r->set->blobs_dir == NULL ? NULL :
			t_strconcat(r->set->blobs_dir, "/", r->key, "/", name,
				    NULL);

		if (aecs_row_blob(r, input, att, name, &size) < 0)
			return -1;
		const struct aecs_value v[] = {
			AECS_TEXT(r->set->mailbox_id), AECS_TEXT(r->key),
			AECS_INT(idx),
			AECS_TEXT(t_strdup_printf("%s:%u", p->message_id, idx)),
			AECS_TEXT(att->filename), AECS_TEXT(att->content_type),
			AECS_INT(size), AECS_TEXT_OR_NULL(att->cid),
			AECS_TEXT_OR_NULL(blob_key), AECS_NULL,
		};
		if (aecs_db_write(r->db, aecs_db_named("insert_attachment"),
				  v, N_ELEMENTS(v), &r->error) < 0)
			return -1;
		idx++;
	}
	return 0;
}

static int aecs_row_blob_dirs(struct aecs_row_ctx *r, struct istream *input)
{
	const struct aecs_attachment raw = {
		.body_offset = 0, .body_size = r->parsed->size, .cte = "",
	};
	const char *dir;
	uoff_t size;

	if (r->set->blobs_dir == NULL)
		return 0;
	dir = t_strconcat(r->set->blobs_dir, "/", r->key, "/att", NULL);
	if (mkdir_parents(dir, 0700) < 0 && errno != EEXIST) {
		r->error = t_strdup_printf("mkdir(%s) failed: %m", dir);
		return -1;
	}
	if (aecs_row_blob(r, input, &raw, "raw.eml", &size) < 0)
		return -1;
	if (r->parsed->have_html &&
	    aecs_row_blob(r, input, &r->parsed->html, "body.html", &size) < 0)
		return -1;
	return 0;
}

int aecs_rows_write(struct aecs_db *db, const struct aecs_row_settings *set,
		    const struct aecs_parsed *parsed, const char *key,
		    time_t save_date, const char *x_fields,
		    struct istream *input, const char **error_r)
{
	struct aecs_row_ctx r;
	int ret;

	i_zero(&r);
	r.db = db;
	r.set = set;
	r.parsed = parsed;
	r.key = key;
	/* a copy, or another message with the same Message-ID: the
	   first one stays */
	if (aecs_rows_exist(db, set->mailbox_id, key))
		return 0;
	if (aecs_thread_resolve(db, set->mailbox_id, parsed, &r.thread_id,
				error_r) < 0)
		return -1;
	r.thread_key = aecs_key(r.thread_id);
	r.ts = aecs_ts_ms(parsed->have_date ? parsed->date : save_date);
	r.clean = aecs_text_clean(parsed->text, &r.clean_fallback);

	ret = aecs_row_message(&r, x_fields);
	if (ret > 0 && (aecs_row_details(&r) < 0 ||
			aecs_row_blob_dirs(&r, input) < 0 ||
			aecs_row_attachments(&r, input) < 0))
		ret = -1;
	if (ret > 0 && aecs_db_has_search(db)) {
		const struct aecs_value v[] = {
			AECS_TEXT(set->mailbox_id), AECS_TEXT(key),
			AECS_TEXT(r.clean),
		};

		if (aecs_db_write(db, aecs_db_named("insert_search"), v, 3,
				  &r.error) < 0)
			ret = -1;
	}
	if (ret < 0)
		*error_r = r.error;
	return ret;
}
