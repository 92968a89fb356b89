/* doveadm casbox aecs export: which thread a new message joins. A
   thread is what References and In-Reply-To connect: a message joins
   every stored thread that holds a message it names, that holds a
   message naming it, or that names an id it names too (a common ghost
   root); when it connects several, they become one. See doc/aecs.md,
   "thread_id". */

#include "lib.h"
#include "array.h"
#include "str.h"
#include "aecs-norm.h"
#include "aecs-db.h"
#include "doveadm-casbox-aecs.h"
#include "doveadm-casbox-aecs-sql.h"

/* ids of one message looked up at most (the first and the last half:
   the root and the parent are at the ends) */
#define AECS_THREAD_MAX_LOOKUPS 100

#define AECS_SQL_THREAD_BY_MESSAGE \
	"SELECT thread_id, thread_key FROM aecs_messages " \
	"WHERE mailbox_id = ?1 AND message_key = ?2"
/* One row is enough: every stored message that references an id is
   in one thread (each joined all the threads referencing it when it
   was stored, and threads are never split), so a popular thread root
   does not make each new reply read all its siblings. */
#define AECS_SQL_THREAD_BY_REFERENCE \
	"SELECT m.thread_id, m.thread_key FROM aecs_references AS r " \
	"JOIN aecs_messages AS m ON m.mailbox_id = r.mailbox_id " \
	"AND m.message_key = r.message_key " \
	"WHERE r.mailbox_id = ?1 AND r.ref_id = ?2 LIMIT 1"
#define AECS_SQL_THREAD_FIRST_TS \
	"SELECT first_ts FROM aecs_threads " \
	"WHERE mailbox_id = ?1 AND thread_key = ?2"
#define AECS_SQL_THREAD_MESSAGES \
	"SELECT message_key FROM aecs_messages " \
	"WHERE mailbox_id = ?1 AND thread_key = ?2"
#define AECS_SQL_THREAD_MOVE_MESSAGES \
	"UPDATE aecs_messages SET thread_key = ?3, thread_id = ?4 " \
	"WHERE mailbox_id = ?1 AND thread_key = ?2"
#define AECS_SQL_THREAD_MOVE_ADDRESSES \
	"UPDATE aecs_addresses SET thread_key = ?3 " \
	"WHERE mailbox_id = ?1 AND message_key = ?2"
#define AECS_SQL_THREAD_DELETE \
	"DELETE FROM aecs_threads WHERE mailbox_id = ?1 AND thread_key = ?2"

struct aecs_thread_candidate {
	const char *thread_id, *thread_key;
	int64_t first_ts;
};

struct aecs_thread_ctx {
	struct aecs_db *db;
	const char *mailbox_id;
	ARRAY(struct aecs_thread_candidate) candidates;
	const char *error;
};

static void aecs_thread_add(struct aecs_thread_ctx *ctx, const char *thread_id,
			    const char *thread_key)
{
	const struct aecs_thread_candidate *c;
	struct aecs_thread_candidate *new_c;

	array_foreach(&ctx->candidates, c) {
		if (strcmp(c->thread_key, thread_key) == 0)
			return;
	}
	new_c = array_append_space(&ctx->candidates);
	new_c->thread_id = t_strdup(thread_id);
	new_c->thread_key = t_strdup(thread_key);
}

/* Every (thread_id, thread_key) row of sql(mailbox_id, arg) joins. */
static int aecs_thread_collect(struct aecs_thread_ctx *ctx, const char *sql,
			       const char *arg)
{
	const struct aecs_value v[] = {
		AECS_TEXT(ctx->mailbox_id), AECS_TEXT(arg),
	};
	struct aecs_rows *rows;

	if (aecs_db_read_init(ctx->db, sql, v, 2, &rows, &ctx->error) < 0)
		return -1;
	while (aecs_db_read_next(rows) > 0) {
		aecs_thread_add(ctx, aecs_db_read_text(rows, 0),
				aecs_db_read_text(rows, 1));
	}
	return aecs_db_read_deinit(&rows, &ctx->error);
}

static int aecs_thread_lookup_id(struct aecs_thread_ctx *ctx, const char *id,
				 bool own)
{
	if (!own && aecs_thread_collect(ctx, AECS_SQL_THREAD_BY_MESSAGE,
					aecs_key(id)) < 0)
		return -1;
	return aecs_thread_collect(ctx, AECS_SQL_THREAD_BY_REFERENCE, id);
}

static int aecs_thread_lookup(struct aecs_thread_ctx *ctx,
			      const struct aecs_parsed *parsed)
{
	const char *const *refs;
	unsigned int i, count;

	refs = array_get(&parsed->references, &count);
	for (i = 0; i < count; i++) {
		if (count > AECS_THREAD_MAX_LOOKUPS &&
		    i == AECS_THREAD_MAX_LOOKUPS / 2)
			i = count - AECS_THREAD_MAX_LOOKUPS / 2;
		if (aecs_thread_lookup_id(ctx, refs[i], FALSE) < 0)
			return -1;
	}
	if (parsed->in_reply_to != NULL &&
	    aecs_thread_lookup_id(ctx, parsed->in_reply_to, FALSE) < 0)
		return -1;
	return aecs_thread_lookup_id(ctx, parsed->message_id, TRUE);
}

static int aecs_thread_first_ts(struct aecs_thread_ctx *ctx,
				struct aecs_thread_candidate *c)
{
	const struct aecs_value v[] = {
		AECS_TEXT(ctx->mailbox_id), AECS_TEXT(c->thread_key),
	};
	struct aecs_rows *rows;

	if (aecs_db_read_init(ctx->db, AECS_SQL_THREAD_FIRST_TS, v, 2, &rows,
			      &ctx->error) < 0)
		return -1;
	c->first_ts = aecs_db_read_next(rows) > 0 ?
		aecs_db_read_int(rows, 0) : INT64_MAX;
	return aecs_db_read_deinit(&rows, &ctx->error);
}

static int aecs_thread_cmp(const struct aecs_thread_candidate *a,
			   const struct aecs_thread_candidate *b)
{
	if (a->first_ts != b->first_ts)
		return a->first_ts < b->first_ts ? -1 : 1;
	return strcmp(a->thread_key, b->thread_key);
}

/* Move every message of thread from into thread to. */
static int aecs_thread_merge(struct aecs_thread_ctx *ctx,
			     const struct aecs_thread_candidate *from,
			     const struct aecs_thread_candidate *to)
{
	const struct aecs_value v[] = {
		AECS_TEXT(ctx->mailbox_id), AECS_TEXT(from->thread_key),
		AECS_TEXT(to->thread_key), AECS_TEXT(to->thread_id),
	};
	const struct aecs_value tv[] = {
		AECS_TEXT(ctx->mailbox_id), AECS_TEXT(to->thread_key),
	};
	ARRAY_TYPE(const_string) keys;
	struct aecs_rows *rows;
	const char *key;

	t_array_init(&keys, 8);
	if (aecs_db_read_init(ctx->db, AECS_SQL_THREAD_MESSAGES, v, 2, &rows,
			      &ctx->error) < 0)
		return -1;
	while (aecs_db_read_next(rows) > 0) {
		key = t_strdup(aecs_db_read_text(rows, 0));
		array_push_back(&keys, &key);
	}
	if (aecs_db_read_deinit(&rows, &ctx->error) < 0 ||
	    aecs_db_write(ctx->db, AECS_SQL_THREAD_MOVE_MESSAGES, v, 4,
			  &ctx->error) < 0)
		return -1;
	array_foreach_elem(&keys, key) {
		const struct aecs_value av[] = {
			AECS_TEXT(ctx->mailbox_id), AECS_TEXT(key),
			AECS_TEXT(to->thread_key),
		};

		if (aecs_db_write(ctx->db, AECS_SQL_THREAD_MOVE_ADDRESSES, av,
				  3, &ctx->error) < 0)
			return -1;
	}
	if (aecs_db_write(ctx->db, AECS_SQL_THREAD_DELETE, v, 2,
			  &ctx->error) < 0 ||
	    aecs_db_write(ctx->db, AECS_SQL_THREAD_RECOUNT, tv, 2,
			  &ctx->error) < 0)
		return -1;
	return 0;
}

int aecs_thread_resolve(struct aecs_db *db, const char *mailbox_id,
			const struct aecs_parsed *parsed,
			const char **thread_id_r, const char **error_r)
{
	struct aecs_thread_ctx ctx;
	struct aecs_thread_candidate *c;
	unsigned int i, count;

	i_zero(&ctx);
	ctx.db = db;
	ctx.mailbox_id = mailbox_id;
	t_array_init(&ctx.candidates, 4);
	if (aecs_thread_lookup(&ctx, parsed) < 0) {
		*error_r = ctx.error;
		return -1;
	}
	c = array_get_modifiable(&ctx.candidates, &count);
	if (count == 0) {
		*thread_id_r = aecs_thread_root(
			array_count(&parsed->references) == 0 ? NULL :
			array_front(&parsed->references),
			parsed->in_reply_to, parsed->message_id);
		return 0;
	}
	for (i = 0; i < count; i++) {
		if (aecs_thread_first_ts(&ctx, &c[i]) < 0) {
			*error_r = ctx.error;
			return -1;
		}
	}
	/* the oldest thread keeps its id */
	array_sort(&ctx.candidates, aecs_thread_cmp);
	for (i = 1; i < count; i++) {
		if (aecs_thread_merge(&ctx, &c[i], &c[0]) < 0) {
			*error_r = ctx.error;
			return -1;
		}
	}
	*thread_id_r = c[0].thread_id;
	return 0;
}
