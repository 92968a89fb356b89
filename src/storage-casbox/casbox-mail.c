/* casbox: reading mails. Sizes, dates and the GUID come from the cache
   or the message record; the bytes are the concatenation of the
   record's blobs, each verified while read. */

#include "lib.h"
#include "casbox-storage.h"
#include "istream.h"
#include "str.h"
#include "index-mail.h"
#include "imap-bodystructure.h"
#include "casbox-plugin.h"
#include "casbox-store.h"
#include "casbox-store-quarantine.h"
#include "casbox-save.h"
#include "casbox-meta.h"
#include "casbox-mail.h"

struct casbox_mail {
	struct index_mail imail;

	/* record of rec_uid, allocated from rec_pool */
	pool_t rec_pool;
	struct casbox_msg_record rec;
	uint32_t rec_uid;
	bool have_rec;

	/* sealed metadata of rec_uid (from rec_pool), if tried */
	struct casbox_msg_meta meta;
	bool meta_tried, have_meta;

	/* casbox_mail_read_finished (doc/events.md), created when the
	   stream was opened; what the process had decoded by then */
	struct event *read_event;
	uint64_t chunks_at_open, bytes_at_open;
};

#define CASBOX_MAIL(s) \
	(container_of(INDEX_MAIL(s), struct casbox_mail, imail))

struct mail *
casbox_mail_alloc(struct mailbox_transaction_context *t,
		  enum mail_fetch_field wanted_fields,
		  struct mailbox_header_lookup_ctx *wanted_headers)
{
	struct casbox_mail *mail;
	pool_t pool;

	pool = pool_alloconly_create("mail", 2048);
	mail = p_new(pool, struct casbox_mail, 1);
	mail->rec_pool = pool_alloconly_create("casbox mail record", 512);
	index_mail_init(&mail->imail, t, wanted_fields, wanted_headers,
			pool, NULL);
	return &mail->imail.mail.mail;
}

static void casbox_mail_read_begin(struct casbox_mail *mail)
{
	mail->read_event = event_create(mail_event(&mail->imail.mail.mail));
	event_set_name(mail->read_event, "casbox_mail_read_finished");
	mail->chunks_at_open = casbox_store_get_chunks_decoded();
	mail->bytes_at_open = casbox_store_get_bytes_decoded();
}

/* How many chunks reading this mail decoded (with mail_debug: the
   evidence that partial fetches touch only the chunks they need). The
   counters are the process's: mails are read one at a time. */
static void casbox_mail_read_finish(struct casbox_mail *mail)
{
	struct mail *_mail = &mail->imail.mail.mail;
	uint64_t chunks = casbox_store_get_chunks_decoded() -
		mail->chunks_at_open;

	if (mail->have_rec && mail->rec_uid == _mail->uid)
		event_add_int(mail->read_event, "bytes",
			      mail->rec.physical_size);
	event_add_int(mail->read_event, "chunks", chunks);
	event_add_int(mail->read_event, "decoded_bytes",
		      casbox_store_get_bytes_decoded() - mail->bytes_at_open);
	e_debug(mail->read_event, CASBOX_LOG_PREFIX
		"uid=%u: decoded %"PRIu64" chunks", _mail->uid, chunks);
	event_unref(&mail->read_event);
}

static void casbox_mail_close(struct mail *_mail)
{
	struct casbox_mail *mail = CASBOX_MAIL(_mail);

	if (mail->read_event != NULL)
		casbox_mail_read_finish(mail);
	index_mail_close(_mail);
}

static void casbox_mail_free(struct mail *_mail)
{
	struct casbox_mail *mail = CASBOX_MAIL(_mail);
	pool_t rec_pool = mail->rec_pool;

	index_mail_free(_mail);
	pool_unref(&rec_pool);
}

/* A record the mail needs is not in the store. Another session that
   expunges a message commits the expunge to the index before it drops
   the message's records (casbox_sync_finish()), so a mail expunged
   meanwhile is expunged in the refreshed index: then this is the
   ordinary race sdbox also has (its file unlinked under a FETCH) and
   the mail is only marked expunged, without an error. */
static void casbox_mail_set_missing(struct mail *_mail, const char *what)
{
	mail_index_refresh(_mail->box->index);
	if (mail_index_is_expunged(_mail->transaction->view, _mail->seq)) {
		mail_set_expunged(_mail);
		return;
	}
	mail_set_critical(_mail, CASBOX_LOG_PREFIX"uid=%u: %s",
			  _mail->uid, what);
}

/* Returns 0 ok, -1 error (set on the mail). */
static int
casbox_mail_get_record(struct mail *_mail,
		       const struct casbox_msg_record **rec_r,
		       struct istream **saving_input_r)
{
	struct casbox_mail *mail = CASBOX_MAIL(_mail);
	struct casbox_mailbox *mbox = CASBOX_MAILBOX(_mail->box);
	struct casbox_store *store;
	const char *error;
	int ret;

	*saving_input_r = NULL;
	if (_mail->saving) {
		if (!casbox_save_lookup(_mail->transaction, _mail->seq,
					rec_r, saving_input_r)) {
			mail_set_critical(_mail, CASBOX_LOG_PREFIX
				"Mail being saved is not available yet");
			return -1;
		}
		return 0;
	}
	if (mail->have_rec && mail->rec_uid == _mail->uid) {
		*rec_r = &mail->rec;
		return 0;
	}
	mail->have_rec = FALSE;
	mail->meta_tried = mail->have_meta = FALSE;
	p_clear(mail->rec_pool);
	if (casbox_storage_get_store(mbox->storage, &store) < 0)
		return -1;
	ret = casbox_store_msg_lookup(store, mbox->mailbox_guid, _mail->uid,
				      mail->rec_pool, &mail->rec, &error);
	if (ret < 0) {
		mail_set_critical(_mail, CASBOX_LOG_PREFIX"uid=%u: %s",
				  _mail->uid, error);
		return -1;
	}
	if (ret == 0) {
		casbox_mail_set_missing(_mail, "Message record is missing");
		return -1;
	}
	mail->have_rec = TRUE;
	mail->rec_uid = _mail->uid;
	*rec_r = &mail->rec;
	return 0;
}

static int casbox_mail_get_physical_size(struct mail *_mail, uoff_t *size_r)
{
	struct index_mail *imail = INDEX_MAIL(_mail);
	struct index_mail_data *data = &imail->data;
	const struct casbox_msg_record *rec;
	struct istream *input;

	if (index_mail_get_physical_size(_mail, size_r) == 0)
		return 0;
	if (casbox_mail_get_record(_mail, &rec, &input) < 0)
		return -1;
	data->physical_size = rec->physical_size;
	*size_r = data->physical_size;
	return 0;
}

static int casbox_mail_get_virtual_size(struct mail *_mail, uoff_t *size_r)
{
	struct index_mail *imail = INDEX_MAIL(_mail);
	const struct casbox_msg_record *rec;
	struct istream *input;

	if (index_mail_get_cached_virtual_size(imail, size_r))
		return 0;
	if (casbox_mail_get_record(_mail, &rec, &input) < 0)
		return -1;
	imail->data.virtual_size = rec->virtual_size;
	*size_r = rec->virtual_size;
	return 0;
}

static int casbox_mail_get_received_date(struct mail *_mail, time_t *date_r)
{
	struct index_mail *imail = INDEX_MAIL(_mail);
	struct index_mail_data *data = &imail->data;
	const struct casbox_msg_record *rec;
	struct istream *input;

	if (index_mail_get_received_date(_mail, date_r) == 0)
		return 0;
	if (casbox_mail_get_record(_mail, &rec, &input) < 0)
		return -1;
	data->received_date = rec->received_date;
	*date_r = data->received_date;
	return 0;
}

static int casbox_mail_get_save_date(struct mail *_mail, time_t *date_r)
{
	struct index_mail *imail = INDEX_MAIL(_mail);
	struct index_mail_data *data = &imail->data;
	const struct casbox_msg_record *rec;
	struct istream *input;

	if (index_mail_get_save_date(_mail, date_r) > 0)
		return 1;
	if (casbox_mail_get_record(_mail, &rec, &input) < 0)
		return -1;
	data->save_date = rec->save_date;
	*date_r = data->save_date;
	return 1;
}

static int casbox_mail_get_guid(struct mail *_mail, const char **value_r)
{
	struct index_mail *imail = INDEX_MAIL(_mail);
	const struct casbox_msg_record *rec;
	struct istream *input;
	string_t *str;

	str = str_new(imail->mail.data_pool, 64);
	if (mail_cache_lookup_field(_mail->transaction->cache_view, str,
			_mail->seq,
			imail->ibox->cache_fields[MAIL_CACHE_GUID].idx) > 0) {
		*value_r = str_c(str);
		return 0;
	}
	if (casbox_mail_get_record(_mail, &rec, &input) < 0)
		return -1;
	index_mail_cache_add(imail, MAIL_CACHE_GUID, rec->guid,
			     strlen(rec->guid));
	*value_r = p_strdup(imail->mail.data_pool, rec->guid);
	return 0;
}

static int
casbox_mail_get_pop3(struct mail *_mail, enum mail_fetch_field field,
		     const char **value_r)
{
	struct index_mail *imail = INDEX_MAIL(_mail);
	const struct casbox_msg_record *rec;
	struct istream *input;

	if (casbox_mail_get_record(_mail, &rec, &input) < 0)
		return -1;
	if (field == MAIL_FETCH_UIDL_BACKEND)
		*value_r = p_strdup(imail->mail.data_pool, rec->pop3_uidl);
	else if (rec->pop3_order == 0)
		*value_r = "";
	else {
		*value_r = p_strdup_printf(imail->mail.data_pool, "%u",
					   rec->pop3_order);
	}
	return 0;
}

/* The record's sealed metadata, if it has one that opens. One that does
   not is logged and ignored: everything in it can be parsed from the
   message bytes, which are authenticated on their own. */
static const struct casbox_msg_meta *casbox_mail_get_meta(struct mail *_mail)
{
	struct casbox_mail *mail = CASBOX_MAIL(_mail);
	struct casbox_mailbox *mbox = CASBOX_MAILBOX(_mail->box);
	const struct casbox_msg_record *rec;
	struct casbox_store *store;
	struct istream *input;
	const char *error;
	int ret;

	/* a record lookup is not reading the mail: allowed whatever
	   lookup_abort says (like the sizes, which also come from it) */
	if (_mail->saving)
		return NULL;
	if (casbox_mail_get_record(_mail, &rec, &input) < 0)
		return NULL;
	if (mail->meta_tried)
		return mail->have_meta ? &mail->meta : NULL;
	mail->meta_tried = TRUE;
	if (rec->sealed_meta_size == 0)
		return NULL;
	if (casbox_storage_get_store(mbox->storage, &store) < 0)
		return NULL;
	if (casbox_store_open_keys(store, &error) < 0)
		ret = -1;
	else if (!cas_keyring_can_decrypt(
			casbox_store_get_keyring(store))) {
		/* password mode without the password: the message itself
		   cannot be read either, so no warning here */
		return NULL;
	} else {
		ret = casbox_meta_open(casbox_store_get_keyring(store), rec,
				       mail->rec_pool, &mail->meta, &error);
	}
	if (ret < 0) {
		e_warning(mail_event(_mail), CASBOX_LOG_PREFIX
			  "uid=%u: %s (parsing the message instead)",
			  _mail->uid, error);
		return NULL;
	}
	mail->have_meta = ret > 0;
	return mail->have_meta ? &mail->meta : NULL;
}

/* The MIME part tree from the sealed metadata, unless the mail has one
   already or the record has none. */
static void casbox_mail_set_meta_parts(struct mail *_mail)
{
	struct index_mail *imail = INDEX_MAIL(_mail);
	const struct casbox_msg_meta *meta;
	const char *error;

	if (imail->data.parts == NULL &&
	    (meta = casbox_mail_get_meta(_mail)) != NULL) {
		/* in the mail's data pool, like a tree index_mail parsed */
		imail->data.parts = casbox_meta_get_parts(meta,
			imail->mail.data_pool, &error);
		i_assert(imail->data.parts != NULL);
	}
}

static int casbox_mail_get_parts(struct mail *_mail,
				 struct message_part **parts_r)
{
	casbox_mail_set_meta_parts(_mail);
	return index_mail_get_parts(_mail, parts_r);
}

/* BODY of metadata version 2, which stores only BODYSTRUCTURE: derived
   the way Dovecot's index-mail derives it from a cached BODYSTRUCTURE.
   Returns FALSE (logged) if the sealed BODYSTRUCTURE does not parse. */
static bool casbox_mail_derive_body(struct mail *_mail)
{
	struct casbox_mail *mail = CASBOX_MAIL(_mail);
	string_t *str = str_new(mail->rec_pool, 256);
	const char *error;

	if (imap_body_parse_from_bodystructure(mail->meta.bodystructure,
					       str, &error) < 0) {
		e_warning(mail_event(_mail), CASBOX_LOG_PREFIX
			  "uid=%u: sealed BODYSTRUCTURE: %s "
			  "(parsing the message instead)", _mail->uid, error);
		return FALSE;
	}
	mail->meta.body = str_c(str);
	return TRUE;
}

static bool
casbox_mail_get_meta_special(struct mail *_mail, enum mail_fetch_field field,
			     const char **value_r)
{
	const struct casbox_msg_meta *meta;

	if (field != MAIL_FETCH_IMAP_BODYSTRUCTURE &&
	    field != MAIL_FETCH_IMAP_BODY &&
	    field != MAIL_FETCH_IMAP_ENVELOPE)
		return FALSE;
	if ((meta = casbox_mail_get_meta(_mail)) == NULL)
		return FALSE;
	switch (field) {
	case MAIL_FETCH_IMAP_BODY:
		if (meta->body == NULL && !casbox_mail_derive_body(_mail))
			return FALSE;
		*value_r = meta->body;
		break;
	case MAIL_FETCH_IMAP_ENVELOPE:
		*value_r = meta->envelope;
		break;
	default:
		*value_r = meta->bodystructure;
		break;
	}
	return TRUE;
}

static int
casbox_mail_get_special(struct mail *_mail, enum mail_fetch_field field,
			const char **value_r)
{
	switch (field) {
	case MAIL_FETCH_GUID:
		return casbox_mail_get_guid(_mail, value_r);
	case MAIL_FETCH_UIDL_BACKEND:
	case MAIL_FETCH_POP3_ORDER:
		/* from the record: never needs the message bytes */
		return casbox_mail_get_pop3(_mail, field, value_r);
	default:
		break;
	}
	if (casbox_mail_get_meta_special(_mail, field, value_r))
		return 0;
	return index_mail_get_special(_mail, field, value_r);
}

/* Returns 1 if a part of rec is quarantined (error set on the mail), 0
   if not, -1 error (set). */
static int
casbox_mail_check_quarantine(struct mail *_mail, struct casbox_store *store,
			     const struct casbox_msg_record *rec)
{
	struct cas_blob_id blob;
	const char *error, *cause;
	int ret;

	ret = casbox_store_msg_quarantined(store, rec, &blob, &cause, &error);
	if (ret < 0) {
		mail_set_critical(_mail, CASBOX_LOG_PREFIX"uid=%u: %s",
				  _mail->uid, error);
		return -1;
	}
	if (ret == 0)
		return 0;
	/* fail before a byte is sent: with INVALIDDATA the IMAP FETCH
	   gets a tagged NO and the session goes on, instead of a BYE in
	   the middle of the literal */
	i_info(CASBOX_LOG_PREFIX"%s uid=%u: blob %s is quarantined (%s)",
	       mailbox_get_vname(_mail->box), _mail->uid,
	       cas_blob_id_to_hex(&blob), cause);
	mail_storage_set_error(_mail->box->storage, MAIL_ERROR_INVALIDDATA,
		"Message is damaged and cannot be read "
		"(found by casbox scrub, kept for recovery)");
	return 1;
}

static int
casbox_mail_open_stream(struct mail *_mail, struct istream **input_r)
{
	struct casbox_mailbox *mbox = CASBOX_MAILBOX(_mail->box);
	const struct casbox_msg_record *rec;
	struct casbox_store *store;
	struct istream *saving_input;
	const char *error;
	int ret;

	if (casbox_mail_get_record(_mail, &rec, &saving_input) < 0)
		return -1;
	if (saving_input != NULL) {
		*input_r = i_stream_create_range(saving_input, 0,
						 rec->physical_size);
		return 0;
	}
	if (casbox_storage_get_store(mbox->storage, &store) < 0)
		return -1;
	ret = casbox_store_msg_open(store, rec, input_r, &error);
	if (ret == 0) {
		/* expunged since the record was read, unless quarantined
		   or damaged */
		if (casbox_mail_check_quarantine(_mail, store, rec) == 0)
			casbox_mail_set_missing(_mail, error);
		return -1;
	}
	if (ret < 0) {
		if (casbox_store_key_locked(store)) {
			/* password mode without a usable password: not
			   damage, so tell the client why instead of
			   "Internal error"; INVALIDDATA makes it a tagged NO
			   for this message and the session goes on (as for
			   quarantined mail) */
			e_error(mail_event(_mail), CASBOX_LOG_PREFIX
				"uid=%u: %s", _mail->uid, error);
			mail_storage_set_error(_mail->box->storage,
				MAIL_ERROR_INVALIDDATA,
				"Message content is encrypted with the user's "
				"password key, which this session cannot open "
				"(casbox user key is locked)");
			return -1;
		}
		if (casbox_store_error_is_temporary(store)) {
			/* object storage down or failing: not damage, and
			   the same FETCH works once it is back */
			e_error(mail_event(_mail), CASBOX_LOG_PREFIX
				"uid=%u: %s", _mail->uid, error);
			mail_storage_set_error(_mail->box->storage,
				MAIL_ERROR_TEMP, "Message content is in object "
				"storage, which is unavailable now (temporary "
				"failure, try again later)");
			return -1;
		}
		if (casbox_mail_check_quarantine(_mail, store, rec) == 0) {
			mail_set_critical(_mail, CASBOX_LOG_PREFIX"uid=%u: %s",
					  _mail->uid, error);
		}
		return -1;
	}
	ret = casbox_mail_check_quarantine(_mail, store, rec);
	if (ret != 0) {
		i_stream_unref(input_r);
		return -1;
	}
	i_stream_set_name(*input_r, t_strdup_printf("casbox %s uid=%u",
		mailbox_get_vname(_mail->box), _mail->uid));
	return 0;
}

static int
casbox_mail_get_stream(struct mail *_mail, bool get_body ATTR_UNUSED,
		       struct message_size *hdr_size,
		       struct message_size *body_size,
		       struct istream **stream_r)
{
	struct casbox_mail *mail = CASBOX_MAIL(_mail);
	struct index_mail *imail = INDEX_MAIL(_mail);
	struct mail_private *pmail = &imail->mail;
	struct istream *input;

	if (imail->data.stream == NULL) {
		if (!mail_stream_access_start(_mail))
			return -1;
		if (casbox_mail_open_stream(_mail, &input) < 0)
			return -1;
		if (pmail->v.istream_opened != NULL) {
			if (pmail->v.istream_opened(_mail, &input) < 0) {
				i_stream_unref(&input);
				return -1;
			}
		}
		imail->data.stream = input;
		index_mail_set_read_buffer_size(_mail, input);
		if (!_mail->saving && mail->read_event == NULL)
			casbox_mail_read_begin(mail);
	}
	/* index_mail takes header and body sizes from a known part tree;
	   without one it parses the whole message for them (BODY[TEXT]) */
	if (hdr_size != NULL || body_size != NULL)
		casbox_mail_set_meta_parts(_mail);
	return index_mail_init_stream(imail, hdr_size, body_size, stream_r);
}

struct mail_vfuncs casbox_mail_vfuncs = {
	.close = casbox_mail_close,
	.free = casbox_mail_free,
	.set_seq = index_mail_set_seq,
	.set_uid = index_mail_set_uid,
	.set_uid_cache_updates = index_mail_set_uid_cache_updates,
	.prefetch = index_mail_prefetch,
	.precache = index_mail_precache,
	.add_temp_wanted_fields = index_mail_add_temp_wanted_fields,

	.get_flags = index_mail_get_flags,
	.get_keywords = index_mail_get_keywords,
	.get_keyword_indexes = index_mail_get_keyword_indexes,
	.get_modseq = index_mail_get_modseq,
	.get_pvt_modseq = index_mail_get_pvt_modseq,
	.get_parts = casbox_mail_get_parts,
	.get_date = index_mail_get_date,
	.get_received_date = casbox_mail_get_received_date,
	.get_save_date = casbox_mail_get_save_date,
	.get_virtual_size = casbox_mail_get_virtual_size,
	.get_physical_size = casbox_mail_get_physical_size,
	.get_first_header = index_mail_get_first_header,
	.get_headers = index_mail_get_headers,
	.get_header_stream = index_mail_get_header_stream,
	.get_stream = casbox_mail_get_stream,
	.get_binary_stream = index_mail_get_binary_stream,
	.get_special = casbox_mail_get_special,
	.get_backend_mail = index_mail_get_backend_mail,
	.update_flags = index_mail_update_flags,
	.update_keywords = index_mail_update_keywords,
	.update_modseq = index_mail_update_modseq,
	.update_pvt_modseq = index_mail_update_pvt_modseq,
	.update_pop3_uidl = NULL,
	.expunge = index_mail_expunge,
	.set_cache_corrupted = index_mail_set_cache_corrupted,
	.istream_opened = index_mail_opened,
};
