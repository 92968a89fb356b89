/* casbox: saving. The message is streamed once into a spool (memory
   first, then an encrypted temp file: casbox-spool.h) while Dovecot's
   cache parser runs over it; at finish it
   is split into blobs (large MIME leaf bodies alone, the rest in
   contiguous runs) and their ids computed. At commit, under the index
   sync lock, UIDs are assigned and the blobs plus records written in
   one LSM batch, before the index commit makes the mails visible. */

#include "lib.h"
#include "casbox-storage.h"
#include "array.h"
#include "ioloop.h"
#include "str.h"
#include "istream.h"
#include "istream-crlf.h"
#include "ostream.h"
#include "message-parser.h"
#include "casbox-meta.h"
#include "mail-user.h"
#include "index-mail.h"
#include "mail-index-modseq.h"
#include "casbox-plugin.h"
#include "casbox-store.h"
#include "casbox-sync.h"
#include "casbox-save.h"
#include "casbox-spool.h"
#include "casbox-store-safety.h"
#include "casbox-save-xmsg.h"
#include "casbox-dict-auto.h"
#include "mail-cache.h"

/* Saved messages are held until commit (casbox-spool.h). Up to this
   many bytes per transaction stay in memory; the rest of a big message
   or import goes to unlinked, encrypted files in mail_temp_dir. */
#define CASBOX_SAVE_MAX_MEM_SIZE (8 * 1024 * 1024)

/* A saved (not copied) message. */
struct casbox_save_msg {
	/* the saved bytes */
	struct istream *input;
	struct casbox_msg_record rec;
	/* deliveries (LMTP, LDA) with casbox_duplicate_window: the key
	   that tells a redelivery of the same message */
	bool have_dup;
	struct casbox_dup_key dup;
	/* casbox_cross_message: what the header says of the message's
	   base (casbox-xmsg.h) */
	bool have_hints;
	struct casbox_xmsg_hints hints;
};

/* A COPY may hold a whole big mailbox until commit: a copy keeps only
   what the save data sets (about 100 bytes), the commit takes the rest
   from the source record. */
struct casbox_save_mail {
	uint32_t seq;
	/* NULL for a copy */
	struct casbox_save_msg *msg;
	/* a copy's */
	struct casbox_save_copy copy;
};

struct casbox_save_context {
	struct mail_save_context ctx;

	struct casbox_mailbox *mbox;
	struct mail_index_transaction *trans;
	pool_t pool;
	struct casbox_sync_context *sync_ctx;

	/* current mail */
	struct istream *input;
	struct ostream *output;
	uint32_t seq;
	/* bytes of saved mails held in memory */
	uoff_t mem_used;

	ARRAY(struct casbox_save_mail) mails;
	/* casbox_save_lookup()'s record of a copy */
	pool_t lookup_pool;

	/* casbox_save_finished (doc/events.md), created when the commit
	   begins; the store's counters at that point */
	struct event *event;
	struct casbox_store_stats stats_before;
	uint64_t pack_bytes_before;

	bool failed:1;
	bool finished:1;
};

#define CASBOX_SAVECTX(s) \
	(container_of(s, struct casbox_save_context, ctx))

struct mail_save_context *
casbox_save_alloc(struct mailbox_transaction_context *t)
{
	struct casbox_mailbox *mbox = CASBOX_MAILBOX(t->box);
	struct casbox_save_context *ctx;
	pool_t pool;

	i_assert((t->flags & MAILBOX_TRANSACTION_FLAG_EXTERNAL) != 0);

	if (t->save_ctx != NULL) {
		ctx = CASBOX_SAVECTX(t->save_ctx);
		ctx->failed = FALSE;
		ctx->finished = FALSE;
		return &ctx->ctx;
	}
	pool = pool_alloconly_create("casbox save", 4096);
	ctx = p_new(pool, struct casbox_save_context, 1);
	ctx->pool = pool;
	ctx->ctx.transaction = t;
	ctx->trans = t->itrans;
	ctx->mbox = mbox;
	/* not from the alloconly pool: growing it there would leave every
	   smaller copy of a big COPY's array behind */
	i_array_init(&ctx->mails, 32);
	t->save_ctx = &ctx->ctx;
	return t->save_ctx;
}

pool_t casbox_save_get_pool(struct mail_save_context *_ctx)
{
	return CASBOX_SAVECTX(_ctx)->pool;
}

uint32_t casbox_save_add_to_index(struct mail_save_context *_ctx)
{
	struct casbox_save_context *ctx = CASBOX_SAVECTX(_ctx);
	struct mail_save_data *mdata = &_ctx->data;
	enum mail_flags save_flags;
	uint32_t seq;

	save_flags = mdata->flags & ENUM_NEGATE(MAIL_RECENT);
	mail_index_append(ctx->trans, mdata->uid, &seq);
	mail_index_update_flags(ctx->trans, seq, MODIFY_REPLACE, save_flags);
	if (mdata->keywords != NULL) {
		mail_index_update_keywords(ctx->trans, seq, MODIFY_REPLACE,
					   mdata->keywords);
	}
	if (mdata->min_modseq != 0)
		mail_index_update_modseq(ctx->trans, seq, mdata->min_modseq);
	return seq;
}

void casbox_save_keyword_names(struct mail_save_context *_ctx, pool_t pool,
			       ARRAY_TYPE(const_string) *names)
{
	const struct mail_keywords *kw = _ctx->data.keywords;
	const ARRAY_TYPE(keywords) *all;
	const char *name;
	unsigned int i;

	if (kw == NULL)
		return;
	all = mail_index_get_keywords(_ctx->transaction->box->index);
	for (i = 0; i < kw->count; i++) {
		if (kw->idx[i] >= array_count(all))
			continue;
		name = p_strdup(pool, array_idx_elem(all, kw->idx[i]));
		array_push_back(names, &name);
	}
}

int casbox_save_begin(struct mail_save_context *_ctx, struct istream *input)
{
	struct casbox_save_context *ctx = CASBOX_SAVECTX(_ctx);
	struct mail_user *user = _ctx->transaction->box->storage->user;
	struct istream *eol_input;
	string_t *prefix;

	ctx->seq = casbox_save_add_to_index(_ctx);
	mail_set_seq_saving(_ctx->dest_mail, ctx->seq);

	/* mail_save_crlf as maildir and mbox honour it (sdbox and mdbox
	   always store LF). A CRLF-stored mail has physical size =
	   virtual size, which lets imap-msgpart skip straight to the
	   offset of a BODY[]<o.l> instead of counting LFs from the
	   start. The record keeps each mail's sizes, so mails saved
	   under either setting can share a mailbox. */
	if (_ctx->transaction->box->storage->set->mail_save_crlf)
		eol_input = i_stream_create_crlf(input);
	else
		eol_input = i_stream_create_lf(input);
	ctx->input = index_mail_cache_parse_init(_ctx->dest_mail, eol_input);
	i_stream_unref(&eol_input);

	prefix = t_str_new(128);
	mail_user_set_get_temp_prefix(prefix, user->set);
	ctx->output = casbox_spool_create(str_c(prefix),
		ctx->mem_used >= CASBOX_SAVE_MAX_MEM_SIZE ? 0 :
		CASBOX_SAVE_MAX_MEM_SIZE - ctx->mem_used);
	_ctx->data.output = ctx->output;

	if (_ctx->data.received_date == (time_t)-1)
		_ctx->data.received_date = ioloop_time;
	return 0;
}

int casbox_save_continue(struct mail_save_context *_ctx)
{
	struct casbox_save_context *ctx = CASBOX_SAVECTX(_ctx);

	if (ctx->failed)
		return -1;
	if (index_storage_save_continue(_ctx, ctx->input,
					_ctx->dest_mail) < 0) {
		ctx->failed = TRUE;
		return -1;
	}
	return 0;
}

static void
casbox_save_add_range(struct casbox_msg_record *rec, uoff_t start,
		      uoff_t end)
{
	struct casbox_msg_part *part;

	if (end <= start)
		return;
	part = array_append_space(&rec->parts);
	/* id is computed later; the offset is implied by order */
	part->size = end - start;
}

static void
casbox_save_collect_leaves(const struct message_part *part,
			   uoff_t split_size, uoff_t *pos,
			   struct casbox_msg_record *rec)
{
	uoff_t body_start, body_size;

	for (; part != NULL; part = part->next) {
		if (part->children != NULL) {
			casbox_save_collect_leaves(part->children, split_size,
						   pos, rec);
			continue;
		}
		body_start = part->physical_pos +
			part->header_size.physical_size;
		body_size = part->body_size.physical_size;
		if (body_size < split_size || body_start < *pos)
			continue;
		casbox_save_add_range(rec, *pos, body_start);
		casbox_save_add_range(rec, body_start, body_start + body_size);
		/* a leaf body: a candidate for storing decoded, checked in
		   casbox_save_split() (reset if it does not re-encode) */
		if (body_size > 0) {
			struct casbox_msg_part *leaf =
				array_back_modifiable(&rec->parts);

			leaf->transform = CASBOX_PART_TRANSFORM_BASE64;
		}
		*pos = body_start + body_size;
	}
}

/* Whether the leaf body at offset is base64 that re-encodes exactly:
   then its blob is the decoded bytes (its id theirs, so the same
   attachment wrapped otherwise is the same blob). 1 = yes (part's
   transform, stored_size and id set), 0 = store it as is, -1 error. */
static int
casbox_save_check_b64(struct casbox_store *store, struct istream *input,
		      uoff_t offset, struct casbox_msg_part *part,
		      const char **error_r)
{
	struct istream *range, *dec;
	uoff_t dsize;
	int ret;

	range = i_stream_create_range(input, offset, part->size);
	ret = casbox_b64_check(range, part->size, &part->b64, &dsize,
			       error_r);
	if (ret > 0) {
		i_stream_seek(range, 0);
		dec = i_stream_create_casbox_b64_decoder(range);
		ret = casbox_store_blob_id(store, dec, 0, dsize, &part->id,
					   error_r) < 0 ? -1 : 1;
		i_stream_unref(&dec);
		part->stored_size = dsize;
	}
	i_stream_unref(&range);
	return ret;
}

/* The bytes of part (at offset in input) as its blob stores them. */
static struct istream *
casbox_save_part_input(struct istream *input, uoff_t offset,
		       const struct casbox_msg_part *part)
{
	struct istream *range, *dec;

	range = i_stream_create_range(input, offset, part->size);
	if (part->transform == CASBOX_PART_TRANSFORM_NONE)
		return range;
	dec = i_stream_create_casbox_b64_decoder(range);
	i_stream_unref(&range);
	return dec;
}

/* The MIME structure of the message just saved (size bytes of input):
   the one the save's own parse produced (index_mail_cache_parse_init()
   parsed the very bytes the spool got), else input parsed now into
   *pool_r (NULL: nothing to free). Returns 0 ok, -1 read error. */
static int
casbox_save_parts(struct casbox_save_context *ctx, struct istream *input,
		  uoff_t size, struct message_part **parts_r, pool_t *pool_r,
		  const char **error_r)
{
	const struct message_parser_settings parser_set = { .flags = 0 };
	struct index_mail *imail = INDEX_MAIL(ctx->ctx.dest_mail);
	struct message_part *saved = imail->data.parts;
	struct message_parser_ctx *parser;
	struct message_block block;

	*pool_r = NULL;
	if (saved != NULL && saved->physical_pos == 0 &&
	    saved->header_size.physical_size +
	    saved->body_size.physical_size == size) {
		*parts_r = saved;
		return 0;
	}
	*pool_r = pool_alloconly_create("casbox save parts", 4096);
	i_stream_seek(input, 0);
	parser = message_parser_init(*pool_r, input, &parser_set);
	while (message_parser_parse_next_block(parser, &block) > 0) ;
	message_parser_deinit(&parser, parts_r);
	if (input->stream_errno != 0) {
		*error_r = t_strdup_printf("read(%s) failed: %s",
					   i_stream_get_name(input),
					   i_stream_get_error(input));
		pool_unref(pool_r);
		return -1;
	}
	return 0;
}

/* Split input (size bytes) into parts: each MIME leaf body of at least
   split_size bytes alone, everything between in one part per run.
   keys_fresh: the caller just loaded the key ring. */
static int
casbox_save_split(struct casbox_save_context *ctx, struct casbox_store *store,
		  struct istream *input, uoff_t size, bool keys_fresh,
		  struct casbox_msg_record *rec, const char **error_r)
{
	struct message_part *parts;
	struct casbox_msg_part *part;
	uoff_t pos = 0, offset = 0;
	pool_t parser_pool;
	int ret;

	if (casbox_save_parts(ctx, input, size, &parts, &parser_pool,
			      error_r) < 0)
		return -1;
	casbox_save_collect_leaves(parts,
				   ctx->mbox->storage->set.part_split_size,
				   &pos, rec);
	casbox_save_add_range(rec, pos, size);
	pool_unref(&parser_pool);

	/* blob ids under the current key epoch: a session that loaded the
	   key file before key rotation began reloads it (one stat() when
	   nothing changed; none when the ring was loaded just now, as in
	   every LMTP delivery) */
	if (!keys_fresh && casbox_store_refresh_keys(store, error_r) < 0)
		return -1;
	array_foreach_modifiable(&rec->parts, part) {
		if (part->transform == CASBOX_PART_TRANSFORM_BASE64) {
			if (ctx->mbox->storage->set.decode_base64_disabled)
				ret = 0;
			else {
				ret = casbox_save_check_b64(store, input,
							    offset, part,
							    error_r);
			}
			if (ret < 0)
				return -1;
			if (ret > 0) {
				offset += part->size;
				continue;
			}
			part->transform = CASBOX_PART_TRANSFORM_NONE;
		}
		if (casbox_store_blob_id(store, input, offset, part->size,
					 &part->id, error_r) < 0)
			return -1;
		offset += part->size;
	}
	i_assert(offset == size);
	return 0;
}

/* LMTP and LDA deliver; IMAP APPEND, COPY, dsync and doveadm save run in
   other services and are never suppressed. */
static bool casbox_save_is_delivery(struct casbox_save_context *ctx)
{
	const char *service = ctx->mbox->box.storage->user->service;

	return ctx->mbox->storage->set.duplicate_window > 0 &&
		service != NULL &&
		(strcmp(service, "lmtp") == 0 || strcmp(service, "lda") == 0);
}

static int
casbox_save_finish_mail(struct casbox_save_context *ctx,
			struct casbox_save_msg *smail, uoff_t size)
{
	struct mail_save_context *_ctx = &ctx->ctx;
	struct mail_save_data *mdata = &_ctx->data;
	struct casbox_storage *storage = ctx->mbox->storage;
	struct index_mail *imail = INDEX_MAIL(_ctx->dest_mail);
	struct casbox_msg_record *rec = &smail->rec;
	struct casbox_store *store;
	guid_128_t guid_128;
	const char *error;
	bool keys_fresh;
	uint32_t t;

	casbox_msg_record_init(ctx->pool, rec);
	if (mdata->guid != NULL)
		rec->guid = p_strdup(ctx->pool, mdata->guid);
	else {
		guid_128_generate(guid_128);
		rec->guid = p_strdup(ctx->pool, guid_128_to_string(guid_128));
	}
	rec->received_date = mdata->received_date;
	rec->save_date = mdata->save_date != (time_t)-1 ?
		mdata->save_date : ioloop_time;
	rec->physical_size = size;
	if (mail_get_virtual_size(_ctx->dest_mail, &rec->virtual_size) < 0)
		return -1;
	rec->flags = mdata->flags & ENUM_NEGATE(MAIL_RECENT);
	rec->modseq = mdata->min_modseq;
	casbox_save_keyword_names(_ctx, ctx->pool, &rec->keywords);
	if (mdata->pop3_uidl != NULL)
		rec->pop3_uidl = p_strdup(ctx->pool, mdata->pop3_uidl);
	rec->pop3_order = mdata->pop3_order;

	t = rec->save_date;
	index_mail_cache_add(imail, MAIL_CACHE_SAVE_DATE, &t, sizeof(t));
	index_mail_cache_add(imail, MAIL_CACHE_GUID, rec->guid,
			     strlen(rec->guid));

	if (casbox_storage_get_store(storage, &store) < 0)
		return -1;
	smail->have_dup = casbox_save_is_delivery(ctx);
	smail->have_hints = !storage->set.cross_message_disabled &&
		!storage->set.dedup_disabled;
	/* no key ring yet: casbox_store_open_keys() reads it now */
	keys_fresh = casbox_store_get_keyring(store) == NULL;
	if (casbox_store_open_keys(store, &error) < 0 ||
	    (smail->have_hints &&
	     casbox_save_xmsg_hints(smail->input, ctx->pool, &smail->hints,
				    &error) < 0) ||
	    casbox_save_split(ctx, store, smail->input, rec->physical_size,
			      keys_fresh, rec, &error) < 0 ||
	    (smail->have_dup &&
	     casbox_dup_key_compute(casbox_store_get_keyring(store),
				    smail->input, &smail->dup, &error) < 0)) {
		mail_set_critical(_ctx->dest_mail, CASBOX_LOG_PREFIX"%s",
				  error);
		return -1;
	}
	return 0;
}

/* Seal what FETCH BODYSTRUCTURE, BODY, ENVELOPE and MIME part lookups
   need into the record (casbox-meta.h), from the parse the save already
   did or, failing that, from the saved bytes. Without it reads parse
   the message, so a failure here does not fail the save. */
static void
casbox_save_seal_meta(struct casbox_save_context *ctx,
		      struct casbox_save_msg *smail)
{
	struct mail *mail = ctx->ctx.dest_mail;
	struct casbox_store *store;
	struct message_part *parts;
	struct casbox_msg_meta meta;
	const char *error;

	if (smail->rec.physical_size <
	    ctx->mbox->storage->set.metadata_min_size) {
		/* small: its record costs more than parsing it on a read
		   (doc/settings.md, casbox_metadata_min_size) */
		return;
	}
	if (casbox_storage_get_store(ctx->mbox->storage, &store) < 0)
		i_unreached(); /* opened by casbox_save_finish_mail() */
	if (!cas_keyring_can_decrypt(casbox_store_get_keyring(store))) {
		/* password mode without the password (LMTP): the index
		   key is not available; reads parse the message instead */
		return;
	}
	/* seal under the current key epoch: a session that loaded the
	   key file before a key rotation began must not seal new
	   metadata under the old one (one stat() when nothing changed) */
	if (casbox_store_refresh_keys(store, &error) < 0) {
		e_debug(mail_event(mail), CASBOX_LOG_PREFIX
			"no sealed metadata: %s", error);
		return;
	}
	i_zero(&meta);
	if (mail_get_parts(mail, &parts) < 0 ||
	    mail_get_special(mail, MAIL_FETCH_IMAP_BODYSTRUCTURE,
			     &meta.bodystructure) < 0 ||
	    mail_get_special(mail, MAIL_FETCH_IMAP_ENVELOPE,
			     &meta.envelope) < 0) {
		e_debug(mail_event(mail), CASBOX_LOG_PREFIX
			"no sealed metadata: %s",
			mailbox_get_last_internal_error(mail->box, NULL));
		return;
	}
	if (casbox_meta_seal(casbox_store_get_keyring(store), &smail->rec,
			     &meta, parts, ctx->pool, &error) < 0) {
		e_debug(mail_event(mail), CASBOX_LOG_PREFIX
			"no sealed metadata: %s", error);
	}
}

static int casbox_save_finish_write(struct mail_save_context *_ctx)
{
	struct casbox_save_context *ctx = CASBOX_SAVECTX(_ctx);
	struct casbox_save_mail smail;
	struct casbox_save_msg *msg;

	ctx->finished = TRUE;
	if (ctx->output == NULL)
		return -1;

	if (!ctx->failed && o_stream_finish(ctx->output) < 0) {
		mail_set_critical(_ctx->dest_mail, "write(%s) failed: %s",
				  o_stream_get_name(ctx->output),
				  o_stream_get_error(ctx->output));
		ctx->failed = TRUE;
	}
	index_mail_cache_parse_deinit(_ctx->dest_mail,
				      _ctx->data.received_date, !ctx->failed);

	i_zero(&smail);
	smail.seq = ctx->seq;
	smail.msg = msg = p_new(ctx->pool, struct casbox_save_msg, 1);
	msg->input = casbox_spool_finish(&ctx->output);
	_ctx->data.output = NULL;
	if (!ctx->failed) T_BEGIN {
		uoff_t size;

		if (i_stream_get_size(msg->input, TRUE, &size) <= 0 ||
		    size != ctx->input->v_offset) {
			/* nothing may change the bytes on the way */
			mail_set_critical(_ctx->dest_mail, CASBOX_LOG_PREFIX
				"saved size differs from the %"PRIuUOFF_T
				" bytes read", ctx->input->v_offset);
			ctx->failed = TRUE;
		} else if (casbox_save_finish_mail(ctx, msg, size) < 0)
			ctx->failed = TRUE;
	} T_END;

	if (ctx->failed) {
		index_storage_save_abort_last(_ctx, ctx->seq);
		i_stream_unref(&msg->input);
	} else {
		ctx->mem_used += msg->rec.physical_size;
		array_push_back(&ctx->mails, &smail);
		T_BEGIN {
			casbox_save_seal_meta(ctx, msg);
		} T_END;
		/* held until commit: without the read buffer */
		casbox_spool_reopen(&msg->input);
	}
	i_stream_unref(&ctx->input);
	return ctx->failed ? -1 : 0;
}

int casbox_save_finish(struct mail_save_context *_ctx)
{
	int ret;

	ret = casbox_save_finish_write(_ctx);
	index_save_context_free(_ctx);
	return ret;
}

void casbox_save_cancel(struct mail_save_context *_ctx)
{
	struct casbox_save_context *ctx = CASBOX_SAVECTX(_ctx);

	ctx->failed = TRUE;
	(void)casbox_save_finish(_ctx);
}

void casbox_save_copy_begin(struct mail_save_context *_ctx)
{
	CASBOX_SAVECTX(_ctx)->finished = TRUE;
}

void casbox_save_add_copy(struct mail_save_context *_ctx, uint32_t seq,
			  const struct casbox_save_copy *copy)
{
	struct casbox_save_context *ctx = CASBOX_SAVECTX(_ctx);
	struct casbox_save_mail *smail;

	smail = array_append_space(&ctx->mails);
	smail->seq = seq;
	smail->copy = *copy;
}

int casbox_save_copy_record(struct casbox_store *store,
			    const struct casbox_save_copy *copy, pool_t pool,
			    struct casbox_msg_record *rec_r,
			    const char **error_r)
{
	const char *const *kw;
	int ret;

	ret = casbox_store_msg_lookup(store, copy->src_mailbox_guid,
				      copy->src_uid, pool, rec_r, error_r);
	if (ret <= 0) {
		if (ret == 0) {
			*error_r = t_strdup_printf(
				"Copy source uid=%u is gone", copy->src_uid);
			errno = ENOENT;
		}
		return -1;
	}
	/* the source's metadata as it is now, stored as the copy's own
	   (the commit makes it a reference again) */
	rec_r->meta_ref = FALSE;
	if (copy->guid != NULL)
		rec_r->guid = copy->guid;
	rec_r->received_date = copy->received_date;
	rec_r->save_date = copy->save_date;
	rec_r->flags = copy->flags;
	rec_r->modseq = copy->modseq;
	if (copy->pop3_uidl != NULL)
		rec_r->pop3_uidl = copy->pop3_uidl;
	if (copy->pop3_order != 0)
		rec_r->pop3_order = copy->pop3_order;
	p_array_init(&rec_r->keywords, pool, 4);
	for (kw = copy->keywords; kw != NULL && *kw != NULL; kw++)
		array_push_back(&rec_r->keywords, kw);
	return 0;
}

static int casbox_save_mail_cmp(const uint32_t *seq,
				const struct casbox_save_mail *smail)
{
	return *seq < smail->seq ? -1 : (*seq > smail->seq ? 1 : 0);
}

bool casbox_save_lookup(struct mailbox_transaction_context *t, uint32_t seq,
			const struct casbox_msg_record **rec_r,
			struct istream **input_r)
{
	struct casbox_save_context *ctx;
	const struct casbox_save_mail *smail;
	struct casbox_msg_record *rec;
	struct casbox_store *store;
	const char *error;
	int ret;

	if (t->save_ctx == NULL)
		return FALSE;
	ctx = CASBOX_SAVECTX(t->save_ctx);
	/* seqs are appended in ascending order */
	smail = array_bsearch(&ctx->mails, &seq, casbox_save_mail_cmp);
	if (smail == NULL)
		return FALSE;
	if (smail->msg != NULL) {
		*rec_r = &smail->msg->rec;
		*input_r = smail->msg->input;
		return TRUE;
	}
	if (casbox_storage_get_store(ctx->mbox->storage, &store) < 0)
		return FALSE;
	if (ctx->lookup_pool == NULL)
		ctx->lookup_pool = pool_alloconly_create("casbox copy", 1024);
	p_clear(ctx->lookup_pool);
	rec = p_new(ctx->lookup_pool, struct casbox_msg_record, 1);
	T_BEGIN {
		ret = casbox_save_copy_record(store, &smail->copy,
					      ctx->lookup_pool, rec, &error);
		if (ret < 0) {
			e_error(ctx->mbox->box.event, CASBOX_LOG_PREFIX
				"Copy being saved: %s", error);
		}
	} T_END;
	if (ret < 0)
		return FALSE;
	*rec_r = rec;
	*input_r = NULL;
	return TRUE;
}

static void casbox_save_free_mails(struct casbox_save_context *ctx)
{
	struct casbox_save_mail *smail;

	array_foreach_modifiable(&ctx->mails, smail) {
		if (smail->msg != NULL)
			i_stream_unref(&smail->msg->input);
	}
	array_clear(&ctx->mails);
}

static int
casbox_save_add_msg(struct casbox_store *store, struct casbox_store_txn *txn,
		    const guid_128_t mailbox_guid, uint32_t uid,
		    const struct casbox_save_mail *smail,
		    const char **error_r)
{
	const struct casbox_save_msg *msg = smail->msg;
	const struct casbox_msg_part *part;
	struct casbox_msg_record rec;
	struct istream **inputs;
	unsigned int i, count;
	uoff_t offset = 0;
	int ret;

	if (msg == NULL) {
		if (casbox_save_copy_record(store, &smail->copy,
					    pool_datastack_create(), &rec,
					    error_r) < 0)
			return -1;
		return casbox_store_txn_add_copy(txn, mailbox_guid, uid, &rec,
						 error_r);
	}
	count = array_count(&msg->rec.parts);
	inputs = t_new(struct istream *, count + 1);
	i = 0;
	array_foreach(&msg->rec.parts, part) {
		inputs[i++] = casbox_save_part_input(msg->input, offset, part);
		offset += part->size;
	}
	if (msg->have_hints)
		casbox_store_txn_set_xmsg_hints(txn, &msg->hints);
	ret = casbox_store_txn_add_msg(txn, mailbox_guid, uid, &msg->rec,
				       inputs, error_r);
	for (i = 0; i < count; i++)
		i_stream_unref(&inputs[i]);
	return ret;
}

/* Above the highest modseq the index commit of this transaction can
   reach: one log record each for appends, flags and modseqs, one per
   keyword, or a min_modseq the caller asked for (dsync). */
static uint64_t casbox_save_modseq_bound(struct casbox_save_context *ctx)
{
	const struct casbox_save_mail *smail;
	uint64_t bound;

	bound = mail_index_modseq_get_highest(ctx->sync_ctx->sync_view) + 3 +
		array_count(mail_index_get_keywords(ctx->mbox->box.index));
	array_foreach(&ctx->mails, smail) {
		bound = I_MAX(bound, smail->msg != NULL ?
			      smail->msg->rec.modseq : smail->copy.modseq);
	}
	return bound;
}

static void
casbox_save_put_dup(struct casbox_store_txn *txn, struct casbox_mailbox *mbox,
		    uint32_t uid, const struct casbox_save_msg *msg)
{
	struct casbox_dup_record drec;

	i_zero(&drec);
	drec.delivered = ioloop_time;
	drec.uid = uid;
	drec.guid = msg->rec.guid;
	casbox_store_txn_dup_put(txn, mbox->mailbox_guid, &msg->dup, &drec);
}

/* Write every saved mail's blobs and record in one durable batch. */
/* A full disk or filesystem quota is the user's "mailbox is full"
   (IMAP [OVERQUOTA], LMTP 452/552), as for sdbox; anything else is an
   internal error. Both are logged with the cause. The error is the
   errno of the failing write, unless later cleanup changed it: then
   the save is reported as an internal error, still logged. */
static void
casbox_save_set_error(struct casbox_mailbox *mbox, int failed_errno,
		      const char *error)
{
	if (!ENOSPACE(failed_errno)) {
		mailbox_set_critical(&mbox->box, CASBOX_LOG_PREFIX
				     "Saving failed: %s", error);
		return;
	}
	e_error(mbox->box.event, CASBOX_LOG_PREFIX"Saving failed: %s", error);
	mail_storage_set_error(mbox->box.storage, MAIL_ERROR_NOQUOTA,
			       MAIL_ERRSTR_NO_QUOTA);
}

static int
casbox_save_write_records(struct casbox_save_context *ctx,
			  const struct mail_index_header *hdr,
			  const ARRAY_TYPE(seq_range) *uids)
{
	struct casbox_mailbox_record mrec;
	struct casbox_mailbox *mbox = ctx->mbox;
	const struct seq_range *last;
	const struct casbox_save_mail *smail;
	struct casbox_store *store;
	struct casbox_store_txn *txn;
	struct seq_range_iter iter;
	const char *error = NULL;
	unsigned int n = 0;
	uint32_t uid;
	int ret = 0, failed_errno = 0;
	bool source_gone = FALSE;

	if (casbox_storage_get_store(mbox->storage, &store) < 0)
		return -1;
	if (casbox_store_txn_begin(store, &txn, &error) < 0) {
		mailbox_set_critical(&mbox->box, CASBOX_LOG_PREFIX"%s", error);
		return -1;
	}
	i_zero(&mrec);
	mrec.uid_validity = hdr->uid_validity;
	mrec.name = mailbox_get_vname(&mbox->box);
	/* saved_uids is sorted: its last range ends highest */
	last = array_back(uids);
	mrec.next_uid = I_MAX(hdr->next_uid, last->seq2 + 1);
	mrec.highest_modseq = casbox_save_modseq_bound(ctx);
	casbox_store_txn_set_recovery_mailbox(txn, mbox->mailbox_guid,
					      mbox->public_guid, &mrec);
	seq_range_array_iter_init(&iter, uids);
	array_foreach(&ctx->mails, smail) {
		if (!seq_range_array_iter_nth(&iter, n++, &uid))
			i_unreached();
		T_BEGIN {
			ret = casbox_save_add_msg(store, txn,
						  mbox->mailbox_guid, uid,
						  smail, &error);
			if (ret == 0 && smail->msg != NULL &&
			    smail->msg->have_dup)
				casbox_save_put_dup(txn, mbox, uid, smail->msg);
			/* its blobs are written: drop the read buffer
			   until the whole transaction is done */
			if (ret == 0 && smail->msg != NULL)
				casbox_spool_reopen(&smail->msg->input);
			source_gone = ret < 0 && smail->msg == NULL &&
				errno == ENOENT;
			/* a COPY of 100,000 mails is more than one batch;
			   a crash between two leaves records above the
			   index's next UID, which the next open releases */
			if (ret == 0 &&
			    casbox_store_txn_checkpoint(txn, &error) < 0)
				ret = -1;
			failed_errno = errno;
		} T_END_PASS_STR_IF(ret < 0, &error);
		if (ret < 0)
			break;
	}
	if (ret == 0)
		casbox_store_txn_put_mailbox(txn, mbox->mailbox_guid, &mrec);
	if (ret < 0)
		casbox_store_txn_rollback(&txn);
	else {
		ret = casbox_store_txn_commit(&txn, &error);
		failed_errno = errno;
	}
	if (ret < 0 && source_gone) {
		/* another session expunged a copy's source between the
		   COPY and this commit. sdbox copies at COPY time and finds
		   the file gone then; both answer IMAP COPY with NO
		   [EXPUNGEISSUED], which is no error of the server. */
		e_debug(mbox->box.event, CASBOX_LOG_PREFIX
			"Copy source expunged meanwhile: %s", error);
		mail_storage_set_error(mbox->box.storage, MAIL_ERROR_EXPUNGED,
				       "Message was expunged");
	} else if (ret < 0)
		casbox_save_set_error(mbox, failed_errno, error);
	return ret;
}

static void casbox_save_event_begin(struct casbox_save_context *ctx)
{
	struct casbox_store *store = ctx->mbox->storage->store;

	ctx->event = event_create(ctx->mbox->box.event);
	event_set_name(ctx->event, "casbox_save_finished");
	/* not open yet: the commit opens it, with counters at 0 */
	if (store != NULL) {
		casbox_store_get_stats(store, &ctx->stats_before);
		ctx->pack_bytes_before =
			casbox_store_get_pack_bytes_appended(store);
	}
}

/* The records are durable: what the commit wrote, from the store's
   counters (every add of this commit ran in casbox_save_write_records,
   nothing else of this process wrote meanwhile). */
static void casbox_save_event_fields(struct casbox_save_context *ctx)
{
	const struct casbox_store_stats *b = &ctx->stats_before;
	const struct casbox_save_mail *smail;
	struct casbox_store *store = ctx->mbox->storage->store;
	struct casbox_store_stats now;
	uint64_t bytes = 0;
	unsigned int copied = 0;

	i_assert(store != NULL); /* the commit used it */
	casbox_store_get_stats(store, &now);
	array_foreach(&ctx->mails, smail) {
		if (smail->msg != NULL)
			bytes += smail->msg->rec.physical_size;
		else {
			bytes += smail->copy.physical_size;
			copied++;
		}
	}
	event_add_int(ctx->event, "messages", array_count(&ctx->mails));
	event_add_int(ctx->event, "copied", copied);
	event_add_int(ctx->event, "bytes", bytes);
	event_add_int(ctx->event, "blobs_written",
		      now.blobs_written - b->blobs_written);
	event_add_int(ctx->event, "written_bytes",
		      now.written_bytes - b->written_bytes);
	event_add_int(ctx->event, "blobs_deduplicated",
		      now.blobs_deduplicated - b->blobs_deduplicated);
	event_add_int(ctx->event, "deduplicated_bytes",
		      now.deduplicated_bytes - b->deduplicated_bytes);
	event_add_int(ctx->event, "stored_bytes",
		      casbox_store_get_pack_bytes_appended(store) -
		      ctx->pack_bytes_before);
}

/* Is the delivery in ctx (one mail, as LMTP and LDA save) a redelivery
   of a message this mailbox got less than casbox_duplicate_window ago?
   Called under the index sync lock, which every save into the mailbox
   holds from its dup lookup to its LSM commit: of two deliveries of one
   message at once, the second sees the first's record. Returns 1 a
   duplicate (drec_r: the first copy), 0 not one, -1 error. */
static int
casbox_save_find_duplicate(struct casbox_save_context *ctx,
			   const struct mail_index_header *hdr,
			   struct casbox_dup_record *drec_r)
{
	struct casbox_mailbox *mbox = ctx->mbox;
	const struct casbox_save_mail *first;
	const struct casbox_save_msg *smail;
	struct casbox_msg_record rec;
	const char *error;
	int ret;

	if (array_count(&ctx->mails) != 1)
		return 0;
	first = array_front(&ctx->mails);
	smail = first->msg;
	if (smail == NULL || !smail->have_dup)
		return 0;
	ret = casbox_store_dup_lookup(mbox->storage->store, mbox->mailbox_guid,
				      &smail->dup, pool_datastack_create(),
				      drec_r, &error);
	if (ret > 0 && drec_r->uid < hdr->next_uid) {
		/* the UID is the first copy's, not one an orphan release
		   handed out again */
		ret = casbox_store_msg_lookup(mbox->storage->store,
					      mbox->mailbox_guid, drec_r->uid,
					      pool_datastack_create(), &rec,
					      &error);
		if (ret > 0 && strcmp(rec.guid, drec_r->guid) != 0)
			return 0;
		if (ret == 0)
			ret = 1; /* expunged since: still a redelivery */
	} else if (ret > 0) {
		/* never acknowledged (its orphan release is due) */
		return 0;
	}
	if (ret < 0) {
		mailbox_set_critical(&mbox->box, CASBOX_LOG_PREFIX
				     "Duplicate lookup failed: %s", error);
		return -1;
	}
	if (ret == 0 || drec_r->delivered > ioloop_time ||
	    ioloop_time - drec_r->delivered >=
	    (time_t)mbox->storage->set.duplicate_window)
		return 0;
	return 1;
}

/* Drop the (only, last) append of a duplicate delivery and report the
   first copy's UID as the saved one, so LMTP answers 250 and a caller
   that opens the saved mail (several recipients) gets the first copy. */
static void
casbox_save_suppress(struct casbox_save_context *ctx,
		     const struct mail_index_header *hdr,
		     const struct casbox_dup_record *drec)
{
	struct mailbox_transaction_context *_t = ctx->ctx.transaction;
	const struct casbox_save_mail *smail = array_front(&ctx->mails);
	uoff_t size = smail->msg != NULL ? smail->msg->rec.physical_size :
		smail->copy.physical_size;
	long age = (long)(ioloop_time - drec->delivered);
	struct event *event;

	/* the named event (doc/events.md) is the log line; the dup key
	   and the content hash stay out of it */
	event = event_create(ctx->mbox->box.event);
	event_set_name(event, "casbox_duplicate_suppressed");
	event_add_int(event, "original_uid", drec->uid);
	event_add_int(event, "size", size);
	event_add_int(event, "age", age);
	e_info(event, CASBOX_LOG_PREFIX
	       "Duplicate delivery suppressed: the same message was "
	       "delivered as UID %u %ld s ago (casbox_duplicate_window "
	       "= %u s)", drec->uid, age,
	       ctx->mbox->storage->set.duplicate_window);
	event_unref(&event);
	mail_index_expunge(ctx->trans, smail->seq);
	mail_cache_transaction_reset(_t->cache_trans);
	casbox_save_free_mails(ctx);
	seq_range_array_add(&_t->changes->saved_uids, drec->uid);
	_t->changes->uid_validity = hdr->uid_validity;
	(void)casbox_sync_finish(&ctx->sync_ctx, FALSE);
}

/* Take the sync lock, which orders UID assignment between processes,
   with the index's UIDVALIDITY committed. When the sync finds the index
   without one, another process made the mailbox directory and has not
   written its index yet (a new user's first deliveries at once): the
   sync writes UIDVALIDITY into its own transaction, which reaches the
   log only at the sync's commit, after our appends. A reader in between
   would see next_uid > 1 with uidvalidity 0, log a corrupted index
   header and fsck it. So that creation is committed first and the lock
   taken again. Returns 0 with ctx->sync_ctx set, -1 error. */
static int casbox_save_sync_lock(struct casbox_save_context *ctx)
{
	unsigned int attempt;

	for (attempt = 0;; attempt++) {
		if (casbox_sync_begin(ctx->mbox, CASBOX_SYNC_FLAG_FORCE |
				      CASBOX_SYNC_FLAG_FSYNC,
				      &ctx->sync_ctx) < 0 ||
		    ctx->sync_ctx == NULL)
			return -1;
		if (mail_index_get_header(ctx->sync_ctx->sync_view)->
		    uid_validity != 0)
			return 0;
		if (attempt > 0) {
			mailbox_set_critical(&ctx->mbox->box, CASBOX_LOG_PREFIX
				"The index has no UIDVALIDITY after it was "
				"created: not assigning UIDs");
			return -1;
		}
		if (casbox_sync_finish(&ctx->sync_ctx, TRUE) < 0)
			return -1;
	}
}

int casbox_transaction_save_commit_pre(struct mail_save_context *_ctx)
{
	struct casbox_save_context *ctx = CASBOX_SAVECTX(_ctx);
	struct mailbox_transaction_context *_t = _ctx->transaction;
	const struct mail_index_header *hdr;
	int dup;

	i_assert(ctx->finished);

	if (array_count(&ctx->mails) == 0)
		return 0;

	casbox_save_event_begin(ctx);
	if (casbox_save_sync_lock(ctx) < 0) {
		casbox_transaction_save_rollback(_ctx);
		return -1;
	}
	hdr = mail_index_get_header(ctx->sync_ctx->sync_view);
	T_BEGIN {
		struct casbox_dup_record drec;

		dup = casbox_save_find_duplicate(ctx, hdr, &drec);
		if (dup > 0)
			casbox_save_suppress(ctx, hdr, &drec);
	} T_END;
	if (dup < 0) {
		casbox_transaction_save_rollback(_ctx);
		return -1;
	}
	if (dup > 0)
		return 0;
	mail_index_append_finish_uids(ctx->trans, hdr->next_uid,
				      &_t->changes->saved_uids);
	if (casbox_save_write_records(ctx, hdr,
				      &_t->changes->saved_uids) < 0) {
		casbox_transaction_save_rollback(_ctx);
		return -1;
	}
	casbox_save_event_fields(ctx);
	_t->changes->uid_validity = hdr->uid_validity;
	return 0;
}

static void casbox_save_context_free(struct casbox_save_context *ctx)
{
	casbox_save_free_mails(ctx);
	array_free(&ctx->mails);
	event_unref(&ctx->event);
	pool_unref(&ctx->lookup_pool);
	pool_unref(&ctx->pool);
}

void casbox_transaction_save_commit_post(struct mail_save_context *_ctx,
	struct mail_index_transaction_commit_result *result)
{
	struct casbox_save_context *ctx = CASBOX_SAVECTX(_ctx);

	_ctx->transaction = NULL; /* already freed */

	if (array_count(&ctx->mails) == 0) {
		casbox_transaction_save_rollback(_ctx);
		return;
	}
	mail_index_sync_set_commit_result(ctx->sync_ctx->index_sync_ctx,
					  result);
	if (casbox_sync_finish(&ctx->sync_ctx, TRUE) < 0)
		ctx->failed = TRUE;
	else {
		e_debug(ctx->event, CASBOX_LOG_PREFIX"saved %u mails",
			array_count(&ctx->mails));
		casbox_dict_autotrain_saved(ctx->mbox->storage,
					    array_count(&ctx->mails));
	}
	casbox_save_context_free(ctx);
}

void casbox_transaction_save_rollback(struct mail_save_context *_ctx)
{
	struct casbox_save_context *ctx = CASBOX_SAVECTX(_ctx);

	ctx->failed = TRUE;
	if (!ctx->finished)
		casbox_save_cancel(_ctx);
	if (ctx->sync_ctx != NULL)
		(void)casbox_sync_finish(&ctx->sync_ctx, FALSE);
	casbox_save_context_free(ctx);
}
