/* fts-casidx backend vfuncs: Dovecot's FTS plugin <-> casidx index.
   One index directory per mailbox GUID under
   <namespace index root>/casidx/; query semantics in casidx-query.h and
   doc/search-semantics.md. */

#include "lib.h"
#include "safe-memset.h"
#include "time-util.h"
#include "array.h"
#include "hash.h"
#include "str.h"
#include "guid.h"
#include "seq-range-array.h"
#include "settings-parser.h"
#include "unlink-directory.h"
#include "mail-namespace.h"
#include "mail-storage.h"
#include "mail-search.h"
#include "mailbox-list.h"
#include "istream.h"
#include "message-parser.h"
#include "message-decoder.h"
#include "message-header-decode.h"
#include "message-header-parser.h"
#include "rfc822-parser.h"
#include "message-address.h"
#include "fts-api-private.h"
#include "cas-keymode.h"
#include "casidx-tokenizer.h"
#include "casidx-dtgram.h"
#include "casidx-index.h"
#include "casidx-query.h"
#include "fts-casidx-settings.h"
#include "fts-casidx-dovecot.h"
#include "fts-casidx-plugin.h"

#include <dirent.h>

#define CASIDX_DIR_NAME "casidx"

/* Named events: doc/events.md. The parent is Dovecot's "fts" category,
   declared again here (Dovecot merges identical categories by name):
   a reference to the fts plugin's event_category_fts would be resolved
   when this plugin is loaded, so loading it without fts would fail in
   dlopen() instead of with Dovecot's "Plugin fts must be loaded". */
static struct event_category event_category_casidx_fts = {
	.name = "fts",
};
static struct event_category event_category_casidx = {
	.name = "casidx",
	.parent = &event_category_casidx_fts,
};

struct casidx_fts_backend {
	struct fts_backend backend;
	struct event *event;
	char *root;
	struct casidx_index_settings set;
	struct casidx_tokenizer *tok;
	struct casidx_dtgram *dtgram;
	/* casbox key file whose index key seals the segments, NULL =
	   segments are plaintext (fts_casidx_encrypt) */
	char *key_path;
	/* casbox_key_mode and, in password mode, casbox_key_password
	   (NULL when this process has none) */
	enum cas_key_mode key_mode;
	char *key_password;
	struct cas_keyring *keyring;

	pool_t pool;
	HASH_TABLE(char *, struct casidx_index *) indexes;
};

struct casidx_fts_backend_update_context {
	struct fts_backend_update_context ctx;
	struct casidx_index *index;
	struct casidx_index_writer *writer;
	/* password mode: the box whose index opens at the first build
	   key, not at set_mailbox (see casidx_update_open()) */
	struct mailbox *pending_box;
	/* the box being indexed (casidx_update_html() reads its mails) */
	struct mailbox *box;
	uint32_t uid;
	/* the UID whose HTML parts casidx_update_html() indexed */
	uint32_t html_uid;
	/* the current document's mail, opened for the raw text the FTS
	   build does not hand over (casidx_update_mail()) */
	struct mailbox_transaction_context *raw_trans;
	struct mail *raw_mail;
	/* address headers whose raw values the document got, ":name:" */
	string_t *raw_hdrs_done;
	enum casidx_field field;
	/* the field the text fed now gives dtgrams to, if dt_on */
	enum casidx_field dt_field;
	bool dt_on;
	/* what the current document got (casidx_query_add_token()) */
	struct casidx_doc_state doc_state;
	bool doc_open;
	bool key_open;

	/* casidx_index_finished, created with the writer: what it got */
	struct event *event;
	unsigned int messages, expunges;
	uint64_t bytes;
};

static struct fts_backend *fts_backend_casidx_alloc(void)
{
	struct casidx_fts_backend *backend;

	backend = i_new(struct casidx_fts_backend, 1);
	backend->backend = fts_backend_casidx;
	return &backend->backend;
}

/* fts_casidx_encrypt = auto (default: encrypt iff casbox_key_file is
   set) | yes (casbox_key_file required) | no. */
static int
casidx_settings_check_encrypt(struct casidx_fts_backend *backend,
			      struct mail_user *user,
			      const struct fts_casidx_settings *set,
			      const char **error_r)
{
	const char *key_path = set->key_file;

	if (strcmp(set->encrypt, "auto") == 0)
		;
	else if (strcmp(set->encrypt, "no") == 0)
		key_path = NULL;
	else if (strcmp(set->encrypt, "yes") == 0) {
		if (key_path == NULL) {
			*error_r = "fts_casidx_encrypt=yes, "
				"but casbox_key_file is not set";
			return -1;
		}
	} else {
		*error_r = t_strdup_printf(
			"Invalid fts_casidx_encrypt: %s (auto, yes or no)",
			set->encrypt);
		return -1;
	}
	/* "~/" as the casbox storage reads it (casbox_settings_read()),
	   or the two plugins would look at different files */
	if (key_path != NULL)
		key_path = mail_user_home_expand(user, key_path);
	backend->key_path = i_strdup(key_path);

	if (set->key_mode != NULL &&
	    cas_key_mode_parse(set->key_mode, &backend->key_mode) < 0) {
		*error_r = t_strdup_printf("Invalid casbox_key_mode: %s "
					   "(server or password)",
					   set->key_mode);
		return -1;
	}
	if (backend->key_mode == CAS_KEY_MODE_PASSWORD && key_path == NULL) {
		/* a plaintext index would store the user's words readable
		   without the password (doc/threat-model.md) */
		*error_r = "casbox_key_mode=password needs an encrypted "
			"index: fts_casidx_encrypt=no is not allowed and "
			"casbox_key_file must be set";
		return -1;
	}
	backend->key_password = i_strdup(set->key_password);
	return 0;
}

static int
casidx_settings_read(struct casidx_fts_backend *backend,
		     struct mail_user *user, const char **error_r)
{
	struct fts_casidx_settings set;

	if (fts_casidx_settings_get(&backend->backend, user, &set,
				    error_r) < 0)
		return -1;
	if (set.index.memory_budget != 0 &&
	    set.index.memory_budget < 1024*1024) {
		*error_r = t_strdup_printf(
			"Invalid fts_casidx_memory_budget: %zu"
			" (at least 1M)", set.index.memory_budget);
		return -1;
	}
	backend->set = set.index;
	return casidx_settings_check_encrypt(backend, user, &set, error_r);
}

static int
fts_backend_casidx_init(struct fts_backend *_backend, const char **error_r)
{
	struct casidx_fts_backend *backend =
		container_of(_backend, struct casidx_fts_backend, backend);
	struct mail_namespace *ns = _backend->ns;
	const char *root;

	if (fts_casidx_backend_user_init(_backend, error_r) < 0 ||
	    casidx_settings_read(backend, ns->user, error_r) < 0) {
		*error_r = t_strconcat(CASIDX_LOG_PREFIX, *error_r, NULL);
		return -1;
	}
	root = mailbox_list_get_root_forced(ns->list,
					    MAILBOX_LIST_PATH_TYPE_INDEX);
	backend->root = i_strconcat(root, "/"CASIDX_DIR_NAME, NULL);
	backend->event = event_create(CASIDX_EVENT_PARENT(_backend));
	event_add_category(backend->event, &event_category_casidx);
	event_set_forced_debug(backend->event,
			       CASIDX_USER_MAIL_DEBUG(ns->user));
	event_set_append_log_prefix(backend->event, CASIDX_LOG_PREFIX);
	backend->tok = casidx_tokenizer_create();
	backend->dtgram = casidx_dtgram_create();
	backend->pool = pool_alloconly_create("casidx backend", 1024);
	hash_table_create(&backend->indexes, backend->pool, 0,
			  str_hash, strcmp);
	return 0;
}

static void casidx_backend_close_indexes(struct casidx_fts_backend *backend)
{
	struct hash_iterate_context *iter;
	struct casidx_index *index;
	char *key;

	iter = hash_table_iterate_init(backend->indexes);
	while (hash_table_iterate(iter, backend->indexes, &key, &index))
		casidx_index_deinit(&index);
	hash_table_iterate_deinit(&iter);
	hash_table_clear(backend->indexes, TRUE);
}

static void fts_backend_casidx_deinit(struct fts_backend *_backend)
{
	struct casidx_fts_backend *backend =
		container_of(_backend, struct casidx_fts_backend, backend);

	if (backend->pool != NULL) {
		casidx_backend_close_indexes(backend);
		hash_table_destroy(&backend->indexes);
		pool_unref(&backend->pool);
		casidx_tokenizer_destroy(&backend->tok);
		casidx_dtgram_destroy(&backend->dtgram);
		event_unref(&backend->event);
	}
	cas_keyring_free(&backend->keyring);
	if (backend->key_password != NULL) {
		safe_memset(backend->key_password, 0,
			    strlen(backend->key_password));
		i_free(backend->key_password);
	}
	i_free(backend->key_path);
	i_free(backend->root);
	i_free(backend);
}

/* Load the key ring on first use: by then the casbox storage has opened
   (and, with casbox_key_autocreate, created) the key file. This plugin
   never creates keys. */
static int casidx_backend_load_key(struct casidx_fts_backend *backend)
{
	struct cas_key_settings key_set;
	const char *error;
	int ret;

	if (backend->key_path == NULL || backend->keyring != NULL)
		return 0;
	if (backend->key_mode == CAS_KEY_MODE_PASSWORD &&
	    backend->key_password == NULL) {
		/* the index key comes from the user secret: never index
		   in plaintext instead (doc/threat-model.md, (c)) */
		e_error(backend->event, "casbox_key_mode=password: the "
			"index key needs the user's password, which this "
			"process (indexer-worker, doveadm) does not have: "
			"password-mode users have no FTS index, IMAP SEARCH "
			"reads their mail in the session instead (set "
			"fts_autoindex = no for them)");
		return -1;
	}
	i_zero(&key_set);
	key_set.mode = backend->key_mode;
	key_set.path = backend->key_path;
	key_set.password = backend->key_password;
	ret = cas_keyring_load_mode(&key_set, &backend->keyring, &error);
	if (ret == 0) {
		e_error(backend->event, "casbox_key_file %s does not exist: "
			"cannot encrypt the index (set fts_casidx_encrypt=no "
			"to index without encryption)", backend->key_path);
		return -1;
	}
	if (ret < 0) {
		e_error(backend->event, "Couldn't load casbox_key_file: %s",
			error);
		return -1;
	}
	/* tests count these: a password-mode load is one Argon2id run */
	e_debug(backend->event, "Loaded the index key from %s (%s mode)",
		backend->key_path, cas_key_mode_name(backend->key_mode));
	return 0;
}

static int
casidx_backend_get_index(struct casidx_fts_backend *backend,
			 struct mailbox *box, struct casidx_index **index_r)
{
	struct mailbox_metadata metadata;
	struct casidx_index *index;
	const char *guid, *root, *error;
	bool changed;

	/* key rotation: seal new segments under the key file's current
	   epoch (one stat() when the file did not change); epochs a
	   rewrite dropped stay in memory for opening */
	if (backend->keyring != NULL &&
	    cas_keyring_refresh(backend->keyring, backend->key_path,
				&changed, &error) < 0) {
		e_error(backend->event, "casbox_key_file: %s", error);
		return -1;
	}
	if (mailbox_get_metadata(box, MAILBOX_METADATA_GUID, &metadata) < 0) {
		e_error(backend->event, "%s: Couldn't get mailbox GUID: %s",
			mailbox_get_vname(box),
			mailbox_get_last_internal_error(box, NULL));
		return -1;
	}
	guid = guid_128_to_string(metadata.guid);
	index = hash_table_lookup(backend->indexes, guid);
	if (index == NULL) {
		if (casidx_backend_load_key(backend) < 0)
			return -1;
		/* the box's own namespace: a virtual mailbox's backend looks
		   up boxes of other namespaces */
		root = mailbox_list_get_root_forced(
			mailbox_get_namespace(box)->list,
			MAILBOX_LIST_PATH_TYPE_INDEX);
		index = casidx_index_init(
			t_strdup_printf("%s/"CASIDX_DIR_NAME"/%s", root, guid),
			&backend->set);
		if (backend->keyring != NULL)
			casidx_index_set_crypt(index, backend->keyring, guid);
		hash_table_insert(backend->indexes,
				  p_strdup(backend->pool, guid), index);
	}
	*index_r = index;
	return 0;
}

static int casidx_box_uid_validity(struct casidx_fts_backend *backend,
				   struct mailbox *box, uint32_t *uid_validity_r)
{
	struct mailbox_status status;

	if (mailbox_get_status(box, STATUS_UIDVALIDITY, &status) < 0) {
		e_error(backend->event, "%s: Couldn't get UIDVALIDITY: %s",
			mailbox_get_vname(box),
			mailbox_get_last_internal_error(box, NULL));
		return -1;
	}
	*uid_validity_r = status.uidvalidity;
	return 0;
}

/* Drop an index whose UIDs belong to an older UIDVALIDITY of the box
   (e.g. after its Dovecot index was rebuilt): they name other mails. */
static int
casidx_backend_check_uid_validity(struct casidx_fts_backend *backend,
				  struct mailbox *box,
				  struct casidx_index *index)
{
	uint32_t uid_validity = 0;
	const char *error;

	if (casidx_index_get_uid_validity(index) == 0)
		return 0;
	if (casidx_box_uid_validity(backend, box, &uid_validity) < 0)
		return -1;
	if (uid_validity == casidx_index_get_uid_validity(index))
		return 0;
	e_info(backend->event, "%s: UIDVALIDITY changed (%u -> %u), "
	       "rebuilding the index", mailbox_get_vname(box),
	       casidx_index_get_uid_validity(index), uid_validity);
	if (casidx_index_delete(index, &error) < 0 ||
	    casidx_index_refresh(index, &error) < 0) {
		e_error(backend->event, "%s", error);
		return -1;
	}
	return 0;
}

/* Get box's index with the newest committed snapshot loaded. */
static int
casidx_backend_get_fresh_index(struct casidx_fts_backend *backend,
			       struct mailbox *box,
			       struct casidx_index **index_r)
{
	const char *error;

	if (casidx_backend_get_index(backend, box, index_r) < 0)
		return -1;
	if (casidx_index_refresh(*index_r, &error) >= 0)
		return casidx_backend_check_uid_validity(backend, box,
							 *index_r);
	if (!casidx_index_is_corrupted(*index_r)) {
		e_error(backend->event, "%s", error);
		return -1;
	}
	/* derived data: drop it; get_last_uid() = 0 makes Dovecot search
	   the mailbox itself and the indexer rebuild it */
	if (casidx_index_is_old_format(*index_r)) {
		e_info(backend->event, "%s - rebuilding the index in the "
		       "current format", error);
	} else {
		e_error(backend->event, "%s - rebuilding the index", error);
	}
	if (casidx_index_delete(*index_r, &error) < 0 ||
	    casidx_index_refresh(*index_r, &error) < 0) {
		e_error(backend->event, "%s", error);
		return -1;
	}
	return 0;
}

static int
fts_backend_casidx_get_last_uid(struct fts_backend *_backend,
				struct mailbox *box, uint32_t *last_uid_r)
{
	struct casidx_fts_backend *backend =
		container_of(_backend, struct casidx_fts_backend, backend);
	struct casidx_index *index;

	if (casidx_backend_get_fresh_index(backend, box, &index) < 0)
		return -1;
	*last_uid_r = casidx_index_get_last_uid(index);
	return 0;
}

static struct fts_backend_update_context *
fts_backend_casidx_update_init(struct fts_backend *backend)
{
	struct casidx_fts_backend_update_context *ctx;

	ctx = i_new(struct casidx_fts_backend_update_context, 1);
	ctx->ctx.backend = backend;
	return &ctx->ctx;
}

/* Say so when a document was indexed only in part. */
static void casidx_update_doc_end(struct casidx_fts_backend_update_context *ctx)
{
	struct casidx_fts_backend *backend =
		container_of(ctx->ctx.backend, struct casidx_fts_backend,
			     backend);

	if (!ctx->doc_open || !casidx_index_writer_doc_truncated(ctx->writer))
		return;
	e_warning(backend->event, "%s: UID %u: too many distinct words: "
		  "only its first words are searchable (one message may take "
		  "%zu MB, half of fts_casidx_memory_budget)",
		  casidx_index_get_dir(ctx->index), ctx->uid,
		  casidx_index_writer_doc_limit(ctx->writer) / (1024 * 1024));
}

static void
casidx_update_mail_close(struct casidx_fts_backend_update_context *ctx)
{
	if (ctx->raw_mail != NULL)
		mail_free(&ctx->raw_mail);
	if (ctx->raw_trans != NULL)
		(void)mailbox_transaction_commit(&ctx->raw_trans);
}

/* The current document's mail (opened once per document), or NULL with
   error_r. */
static struct mail *
casidx_update_mail(struct casidx_fts_backend_update_context *ctx,
		   const char **error_r)
{
	if (ctx->raw_mail != NULL)
		return ctx->raw_mail;
	/* the headers of message_header_is_address(), wanted up front so
	   the header is parsed once for all of them */
	static const char *const address_headers[] = {
		"From", "Sender", "Reply-To", "To", "Cc", "Bcc",
		"Resent-From", "Resent-Sender", "Resent-To", "Resent-Cc",
		"Resent-Bcc", NULL
	};
	struct mailbox_header_lookup_ctx *headers;

	ctx->raw_trans = mailbox_transaction_begin(ctx->box, 0,
						   "casidx raw text");
	headers = mailbox_header_lookup_init(ctx->box, address_headers);
	ctx->raw_mail = mail_alloc(ctx->raw_trans, 0, headers);
	mailbox_header_lookup_unref(&headers);
	if (!mail_set_uid(ctx->raw_mail, ctx->uid)) {
		*error_r = "expunged";
		casidx_update_mail_close(ctx);
		return NULL;
	}
	return ctx->raw_mail;
}

static void casidx_update_commit(struct casidx_fts_backend_update_context *ctx)
{
	struct casidx_fts_backend *backend =
		container_of(ctx->ctx.backend, struct casidx_fts_backend,
			     backend);
	unsigned int budget_flushes, flushes;
	const char *error;

	casidx_update_mail_close(ctx);
	if (ctx->writer == NULL)
		return;
	casidx_update_doc_end(ctx);
	budget_flushes = casidx_index_writer_get_flushes(ctx->writer);
	flushes = budget_flushes +
		(casidx_index_writer_has_changes(ctx->writer) ? 1 : 0);
	if (casidx_index_writer_commit(&ctx->writer, &error) < 0) {
		e_error(backend->event, "Index commit failed: %s", error);
		ctx->ctx.failed = TRUE;
	} else if (flushes > 0) {
		/* not for the sessions that had nothing to write (a sync
		   opens one for every mailbox it touches) */
		e_debug(event_create_passthrough(ctx->event)->
			set_name("casidx_index_finished")->
			add_int("messages", ctx->messages)->
			add_int("bytes", ctx->bytes)->
			add_int("expunges", ctx->expunges)->
			add_int("segment_flushes", flushes)->
			add_int("segments",
				casidx_index_get_segment_count(ctx->index))->
			event(), "%s: committed, last_uid=%u "
			"segments=%u budget_flushes=%u",
			casidx_index_get_dir(ctx->index),
			casidx_index_get_last_uid(ctx->index),
			casidx_index_get_segment_count(ctx->index),
			budget_flushes);
	}
	event_unref(&ctx->event);
	ctx->messages = ctx->expunges = 0;
	ctx->bytes = 0;
	ctx->index = NULL;
	ctx->uid = 0;
	ctx->doc_open = FALSE;
}

static int
fts_backend_casidx_update_deinit(struct fts_backend_update_context *_ctx)
{
	struct casidx_fts_backend_update_context *ctx =
		container_of(_ctx, struct casidx_fts_backend_update_context,
			     ctx);
	int ret;

	casidx_update_commit(ctx);
	ret = _ctx->failed ? -1 : 0;
	str_free(&ctx->raw_hdrs_done);
	i_free(ctx);
	return ret;
}

static void
casidx_update_open(struct casidx_fts_backend_update_context *ctx,
		   struct mailbox *box)
{
	struct casidx_fts_backend *backend =
		container_of(ctx->ctx.backend, struct casidx_fts_backend,
			     backend);
	struct casidx_index *index;
	uint32_t uid_validity = 0;

	if (casidx_backend_get_index(backend, box, &index) < 0 ||
	    casidx_box_uid_validity(backend, box, &uid_validity) < 0) {
		ctx->ctx.failed = TRUE;
		return;
	}
	ctx->index = index;
	ctx->box = box;
	ctx->writer = casidx_index_writer_begin(index);
	ctx->event = event_create(backend->event);
	event_add_str(ctx->event, "mailbox", mailbox_get_vname(box));
	casidx_index_writer_set_uid_validity(ctx->writer, uid_validity);
}

static void
fts_backend_casidx_update_set_mailbox(struct fts_backend_update_context *_ctx,
				      struct mailbox *box)
{
	struct casidx_fts_backend_update_context *ctx =
		container_of(_ctx, struct casidx_fts_backend_update_context,
			     ctx);
	struct casidx_fts_backend *backend =
		container_of(_ctx->backend, struct casidx_fts_backend,
			     backend);

	casidx_update_commit(ctx);
	ctx->pending_box = NULL;
	if (box == NULL)
		return;
	if (backend->key_mode == CAS_KEY_MODE_PASSWORD) {
		/* Expunges come through here in every process that syncs
		   (imap, lmtp, doveadm). No password-mode index is ever
		   read (fts_backend_casidx_can_lookup()), so an expunge has
		   nothing to update, and loading the index key for it would
		   run Argon2id a second time in a session or log an error
		   in doveadm. Only indexing opens the index. */
		ctx->pending_box = box;
		return;
	}
	casidx_update_open(ctx, box);
}

static void
fts_backend_casidx_update_expunge(struct fts_backend_update_context *_ctx,
				  uint32_t uid)
{
	struct casidx_fts_backend_update_context *ctx =
		container_of(_ctx, struct casidx_fts_backend_update_context,
			     ctx);

	if (ctx->writer != NULL) {
		casidx_index_writer_expunge(ctx->writer, uid);
		ctx->expunges++;
	}
}

static enum casidx_field casidx_header_field(const char *name)
{
	if (strcasecmp(name, "From") == 0)
		return CASIDX_FIELD_FROM;
	if (strcasecmp(name, "To") == 0)
		return CASIDX_FIELD_TO;
	if (strcasecmp(name, "Cc") == 0)
		return CASIDX_FIELD_CC;
	if (strcasecmp(name, "Bcc") == 0)
		return CASIDX_FIELD_BCC;
	if (strcasecmp(name, "Subject") == 0)
		return CASIDX_FIELD_SUBJECT;
	return CASIDX_FIELD_HEADER;
}

static void casidx_update_token(const struct casidx_token *token,
				void *context)
{
	struct casidx_fts_backend_update_context *ctx = context;

	casidx_query_add_token(ctx->writer, ctx->field, token,
			       &ctx->doc_state);
}

static void casidx_update_dtgram(const unsigned char *gram, size_t gram_len,
				 uint32_t pos, void *context)
{
	struct casidx_fts_backend_update_context *ctx = context;

	casidx_query_add_dtgram(ctx->writer, ctx->dt_field, gram, gram_len,
				pos, &ctx->doc_state);
}

/* Text fed from now on is a new run of field's dtgrams, as Dovecot's
   own search reads it. */
static void casidx_update_dtgram_start(struct casidx_fts_backend_update_context
				       *ctx, enum casidx_field field)
{
	struct casidx_fts_backend *backend =
		container_of(ctx->ctx.backend, struct casidx_fts_backend,
			     backend);

	casidx_dtgram_reset(backend->dtgram);
	if (field == CASIDX_FIELD_BODY)
		casidx_query_dtgram_restart(&ctx->doc_state);
	ctx->dt_field = field;
	ctx->dt_on = TRUE;
}

static void
casidx_update_dtgram_feed(struct casidx_fts_backend_update_context *ctx,
			  const void *data, size_t size)
{
	struct casidx_fts_backend *backend =
		container_of(ctx->ctx.backend, struct casidx_fts_backend,
			     backend);

	if (ctx->dt_on) {
		casidx_dtgram_feed(backend->dtgram, data, size,
				   casidx_update_dtgram, ctx);
	}
}

/* A header line as Dovecot's search reads it is "Name: value": the
   value's first character follows the name's ':' or whitespace. The
   name and ':' are fed first (they give a dtgram only with a non-ASCII
   name, or with a value starting right after the ':', which may then
   be one Dovecot does not see: header dtgrams never prove a match). */
static void
casidx_update_dtgram_header(struct casidx_fts_backend_update_context *ctx,
			    enum casidx_field field, const char *name)
{
	casidx_update_dtgram_start(ctx, field);
	casidx_update_dtgram_feed(ctx, name, strlen(name));
	casidx_update_dtgram_feed(ctx, ":", 1);
}

static bool
casidx_update_next_doc(struct casidx_fts_backend_update_context *ctx,
		       uint32_t uid)
{
	struct casidx_fts_backend *backend =
		container_of(ctx->ctx.backend, struct casidx_fts_backend,
			     backend);
	const char *error;

	casidx_update_doc_end(ctx);
	if (ctx->doc_open &&
	    casidx_index_writer_doc_done(ctx->writer, &error) < 0) {
		e_error(backend->event, "Index flush failed: %s", error);
		ctx->ctx.failed = TRUE;
		return FALSE;
	}
	casidx_update_mail_close(ctx);
	casidx_index_writer_add_doc(ctx->writer, uid);
	ctx->uid = uid;
	i_zero(&ctx->doc_state);
	if (ctx->raw_hdrs_done == NULL)
		ctx->raw_hdrs_done = str_new(default_pool, 64);
	str_truncate(ctx->raw_hdrs_done, 0);
	ctx->doc_open = TRUE;
	ctx->messages++;
	return TRUE;
}

/* SEARCH TEXT also matches header names. They are ASCII, so lowercase
   is their normal form; they bypass the tokenizer, whose base64 filter
   would drop long hyphenated names (X-MS-Exchange-...). Indexed whole
   and split at '-'. */
static void
casidx_update_header_name(struct casidx_fts_backend_update_context *ctx,
			  const char *name)
{
	T_BEGIN {
		const char *lname = t_str_lcase(name);
		const char *const *part;

		casidx_index_writer_add_term(ctx->writer, CASIDX_FIELD_HEADER,
					     lname, strlen(lname));
		for (part = t_strsplit(lname, "-");
		     strchr(lname, '-') != NULL && *part != NULL; part++) {
			if (**part != '\0') {
				casidx_index_writer_add_term(ctx->writer,
					CASIDX_FIELD_HEADER, *part,
					strlen(*part));
			}
		}
	} T_END;
}

static bool content_type_is_html(const struct message_header_line *hdr)
{
	struct rfc822_parser_context parser;
	string_t *content_type = t_str_new(64);

	rfc822_parser_init(&parser, hdr->full_value, hdr->full_value_len,
			   NULL);
	rfc822_skip_lwsp(&parser);
	(void)rfc822_parse_content_type(&parser, content_type);
	rfc822_parser_deinit(&parser);
	return strcasecmp(str_c(content_type), "text/html") == 0;
}

static int
casidx_update_html_stream(struct casidx_fts_backend_update_context *ctx,
			  struct istream *input, const char **error_r)
{
	const struct message_parser_settings parser_set = {
		.hdr_flags = MESSAGE_HEADER_PARSER_FLAG_CLEAN_ONELINE,
	};
	struct casidx_fts_backend *backend =
		container_of(ctx->ctx.backend, struct casidx_fts_backend,
			     backend);
	struct message_parser_ctx *parser;
	struct message_decoder_context *decoder;
	struct message_block raw, block;
	struct message_part *prev_part = NULL, *parts;
	bool html = FALSE, in_body = FALSE;
	int ret;

	ctx->field = CASIDX_FIELD_BODY;
	parser = message_parser_init(pool_datastack_create(), input,
				     &parser_set);
	decoder = message_decoder_init(NULL, 0);
	while ((ret = message_parser_parse_next_block(parser, &raw)) > 0) {
		if (raw.part != prev_part) {
			if (in_body) {
				casidx_tokenizer_final(backend->tok,
					casidx_update_token, ctx);
			}
			/* a new part's headers, or the rest of a multipart
			   (never text) */
			prev_part = raw.part;
			html = in_body = FALSE;
		}
		if (raw.hdr != NULL) {
			if (strcasecmp(raw.hdr->name, "Content-Type") == 0) {
				if (raw.hdr->continues)
					raw.hdr->use_full_value = TRUE;
				else
					html = content_type_is_html(raw.hdr);
			}
		} else if (raw.size == 0) {
			if (html) {
				casidx_tokenizer_reset(backend->tok);
				casidx_query_body_restart(&ctx->doc_state);
				casidx_update_dtgram_start(ctx,
					CASIDX_FIELD_BODY);
				in_body = TRUE;
			}
		} else if (!in_body) {
			continue;
		}
		/* the decoder sees every header: it needs the charset and
		   the transfer encoding */
		if (!message_decoder_decode_next_block(decoder, &raw, &block))
			continue;
		if (in_body && block.hdr == NULL && block.size > 0) {
			casidx_tokenizer_feed(backend->tok, block.data,
					      block.size, casidx_update_token,
					      ctx);
			casidx_update_dtgram_feed(ctx, block.data,
						  block.size);
		}
	}
	if (in_body)
		casidx_tokenizer_final(backend->tok, casidx_update_token, ctx);
	message_decoder_deinit(&decoder);
	if (ret < 0 && input->stream_errno != 0) {
		*error_r = t_strdup_printf("read(%s) failed: %s",
					   i_stream_get_name(input),
					   i_stream_get_error(input));
		(void)message_parser_deinit_from_parts(&parser, &parts,
						       error_r);
		return -1;
	}
	/* broken MIME structure: Dovecot's search parses it the same way */
	(void)message_parser_deinit_from_parts(&parser, &parts, error_r);
	return 0;
}

/* Index the raw markup of every text/html part of the current message.
   Dovecot's own search (message-search.c) reads an HTML part decoded
   (transfer encoding, charset) but not converted: tags, attributes,
   URLs and entities are all searchable. The FTS build hands the
   backend html-to-text output instead, so the message is read again
   here and parsed the way message_search_msg() does. Returns 0 if done,
   -1 if the mail couldn't be read (the converted text is indexed
   instead and the body marked unindexed). */
static int casidx_update_html(struct casidx_fts_backend_update_context *ctx)
{
	struct casidx_fts_backend *backend =
		container_of(ctx->ctx.backend, struct casidx_fts_backend,
			     backend);
	struct istream *input;
	struct mail *mail;
	const char *error = NULL;
	int ret = 0;

	if ((mail = casidx_update_mail(ctx, &error)) == NULL)
		ret = -1;
	else if (mail_get_stream_because(mail, NULL, NULL,
					 "fts html indexing", &input) < 0) {
		error = mailbox_get_last_internal_error(ctx->box, NULL);
		ret = -1;
	} else T_BEGIN {
		ret = casidx_update_html_stream(ctx, input, &error);
		error = t_strdup(error);
	} T_END;
	if (ret < 0) {
		e_warning(backend->event, "%s: UID %u: couldn't read the "
			  "HTML parts (%s): indexing their text only",
			  mailbox_get_vname(ctx->box), ctx->uid, error);
	}
	return ret;
}

/* The raw values of an address header of the message (top level).
   The FTS build hands the backend Dovecot's normalised address list,
   without comments, group names' punctuation or quoting, while SEARCH
   TEXT and FROM/TO/CC/BCC read the header as it is ("To:
   unlisted-recipients:; (no To-header on input)"). From, To, Cc and Bcc
   values go to their own raw namespace (CASIDX_FIELD_RAW_*), which a
   search of that header and TEXT read; the others' (Sender, Reply-To,
   Resent-*) to the other-headers field, which only TEXT reads. The
   dtgrams of all of them are the other-headers field's. */
static void
casidx_update_raw_address(struct casidx_fts_backend_update_context *ctx,
			  const char *name)
{
	struct casidx_fts_backend *backend =
		container_of(ctx->ctx.backend, struct casidx_fts_backend,
			     backend);
	const char *const *values, *error = NULL, *key;
	enum casidx_field field = casidx_header_field(name);
	struct mail *mail;

	key = t_strdup_printf(":%s:", t_str_lcase(name));
	if (strstr(str_c(ctx->raw_hdrs_done), key) != NULL)
		return;
	str_append(ctx->raw_hdrs_done, key);
	ctx->field = field >= CASIDX_FIELD_FROM && field <= CASIDX_FIELD_BCC ?
		CASIDX_FIELD_RAW(field) : CASIDX_FIELD_HEADER;
	if ((mail = casidx_update_mail(ctx, &error)) == NULL ||
	    mail_get_headers_utf8(mail, name, &values) < 0) {
		if (error == NULL)
			error = mailbox_get_last_internal_error(ctx->box, NULL);
		e_warning(backend->event, "%s: UID %u: couldn't read the "
			  "%s header (%s): its searches are maybe",
			  mailbox_get_vname(ctx->box), ctx->uid, name, error);
		casidx_query_add_marker(ctx->writer, ctx->field,
					CASIDX_TERM_UNINDEXED,
					&ctx->doc_state);
		casidx_query_add_marker(ctx->writer, ctx->field,
					CASIDX_TERM_DTPARTIAL,
					&ctx->doc_state);
		/* where its dtgrams would have been */
		casidx_query_add_marker(ctx->writer, CASIDX_FIELD_HEADER,
					CASIDX_TERM_DTPARTIAL,
					&ctx->doc_state);
		return;
	}
	for (; *values != NULL; values++) {
		casidx_tokenizer_tokenize(backend->tok, *values,
					  strlen(*values),
					  casidx_update_token, ctx);
		casidx_update_dtgram_header(ctx, CASIDX_FIELD_HEADER, name);
		casidx_update_dtgram_feed(ctx, *values, strlen(*values));
	}
	ctx->dt_on = FALSE;
}

/* The raw values of the address header name in the header block of
   part (an attached message's From, To, Cc...), decoded as TEXT reads
   them: folding as one space, encoded words as UTF-8. Indexed in the
   other-headers field, which TEXT reads (a FROM/TO/CC/BCC search does not
   look inside attached messages). Returns 0 ok (also when done before
   for this part), -1 with error_r. */
static int
casidx_update_raw_part_address(struct casidx_fts_backend_update_context *ctx,
			       const struct message_part *part,
			       const char *name, const char **error_r)
{
	struct casidx_fts_backend *backend =
		container_of(ctx->ctx.backend, struct casidx_fts_backend,
			     backend);
	struct message_header_parser_ctx *parser;
	struct message_header_line *hdr;
	struct istream *input, *hinput;
	struct mail *mail;
	const char *key;
	string_t *value;
	int ret;

	key = t_strdup_printf(":%"PRIuUOFF_T":%s:", part->physical_pos,
			      t_str_lcase(name));
	if (strstr(str_c(ctx->raw_hdrs_done), key) != NULL)
		return 0;
	str_append(ctx->raw_hdrs_done, key);
	if ((mail = casidx_update_mail(ctx, error_r)) == NULL)
		return -1;
	if (mail_get_stream_because(mail, NULL, NULL, "fts raw header",
				    &input) < 0) {
		*error_r = mailbox_get_last_internal_error(ctx->box, NULL);
		return -1;
	}
	i_stream_seek(input, part->physical_pos);
	hinput = i_stream_create_limit(input,
				       part->header_size.physical_size);
	parser = message_parse_header_init(hinput, NULL,
		MESSAGE_HEADER_PARSER_FLAG_CLEAN_ONELINE);
	value = t_str_new(256);
	ctx->field = CASIDX_FIELD_HEADER;
	while ((ret = message_parse_header_next(parser, &hdr)) > 0) {
		if (hdr->eoh || strcasecmp(hdr->name, name) != 0)
			continue;
		if (hdr->continues) {
			hdr->use_full_value = TRUE;
			continue;
		}
		str_truncate(value, 0);
		message_header_decode_utf8(hdr->full_value,
					   hdr->full_value_len, value, NULL);
		casidx_tokenizer_tokenize(backend->tok, str_c(value),
					  str_len(value), casidx_update_token,
					  ctx);
		casidx_update_dtgram_header(ctx, CASIDX_FIELD_HEADER, name);
		casidx_update_dtgram_feed(ctx, str_data(value),
					  str_len(value));
	}
	message_parse_header_deinit(&parser);
	ctx->dt_on = FALSE;
	if (ret < 0 && hinput->stream_errno != 0) {
		*error_r = t_strdup(i_stream_get_error(hinput));
		i_stream_unref(&hinput);
		return -1;
	}
	i_stream_unref(&hinput);
	return 0;
}

static bool
fts_backend_casidx_update_set_build_key(struct fts_backend_update_context *_ctx,
					const struct fts_backend_build_key *key)
{
	struct casidx_fts_backend_update_context *ctx =
		container_of(_ctx, struct casidx_fts_backend_update_context,
			     ctx);
	struct casidx_fts_backend *backend =
		container_of(_ctx->backend, struct casidx_fts_backend,
			     backend);

	if (ctx->writer == NULL && ctx->pending_box != NULL && !_ctx->failed) {
		casidx_update_open(ctx, ctx->pending_box);
		ctx->pending_box = NULL;
	}
	if (ctx->writer == NULL || _ctx->failed)
		return FALSE;
	if (key->uid != ctx->uid && !casidx_update_next_doc(ctx, key->uid))
		return FALSE;

	ctx->dt_on = FALSE;
	switch (key->type) {
	case FTS_BACKEND_BUILD_KEY_HDR:
	case FTS_BACKEND_BUILD_KEY_MIME_HDR:
		casidx_update_header_name(ctx, key->hdr_name);
		if (key->type == FTS_BACKEND_BUILD_KEY_HDR &&
		    message_header_is_address(key->hdr_name)) T_BEGIN {
			casidx_update_raw_address(ctx, key->hdr_name);
		} T_END;
		ctx->field = key->type == FTS_BACKEND_BUILD_KEY_HDR ?
			casidx_header_field(key->hdr_name) :
			CASIDX_FIELD_HEADER;
		if (!message_header_is_address(key->hdr_name)) {
			casidx_update_dtgram_header(ctx, ctx->field,
						    key->hdr_name);
		} else if (key->type == FTS_BACKEND_BUILD_KEY_MIME_HDR) {
			/* handed over normalised (comments and quoting
			   dropped): its raw value is read from the part's
			   header, or TEXT searches of the headers are
			   maybe here */
			const char *error;
			int ret;

			T_BEGIN {
				if (key->part == NULL) {
					error = "no MIME part";
					ret = -1;
				} else {
					ret = casidx_update_raw_part_address(
						ctx, key->part, key->hdr_name,
						&error);
				}
				if (ret < 0) {
					e_warning(backend->event, "%s: UID %u: "
						  "couldn't read the %s header "
						  "of MIME part at %"PRIuUOFF_T
						  " (%s): TEXT searches are "
						  "maybe", mailbox_get_vname(
							ctx->box), ctx->uid,
						  key->hdr_name,
						  key->part == NULL ? 0 :
						  key->part->physical_pos,
						  error);
				}
			} T_END;
			if (ret < 0) {
				casidx_query_add_marker(ctx->writer,
					CASIDX_FIELD_HEADER,
					CASIDX_TERM_UNINDEXED,
					&ctx->doc_state);
				casidx_query_add_marker(ctx->writer,
					CASIDX_FIELD_HEADER,
					CASIDX_TERM_DTPARTIAL,
					&ctx->doc_state);
			}
			ctx->field = CASIDX_FIELD_HEADER;
		}
		break;
	case FTS_BACKEND_BUILD_KEY_BODY_PART:
		ctx->field = CASIDX_FIELD_BODY;
		if (strcasecmp(key->body_content_type, "text/html") != 0) {
			casidx_update_dtgram_start(ctx, CASIDX_FIELD_BODY);
			break;
		}
		/* all HTML parts of the message at the first one */
		if (ctx->html_uid == key->uid)
			return FALSE;
		if (casidx_update_html(ctx) == 0) {
			ctx->html_uid = key->uid;
			ctx->dt_on = FALSE;
			return FALSE;
		}
		/* the converted text then, without the markup; its
		   words' neighbours are not the mail's */
		ctx->field = CASIDX_FIELD_BODY;
		ctx->doc_state.no_positions = TRUE;
		ctx->dt_on = FALSE;
		casidx_query_add_marker(ctx->writer, ctx->field,
					CASIDX_TERM_UNINDEXED,
					&ctx->doc_state);
		casidx_query_add_marker(ctx->writer, ctx->field,
					CASIDX_TERM_DTPARTIAL,
					&ctx->doc_state);
		break;
	case FTS_BACKEND_BUILD_KEY_BODY_PART_BINARY:
		return FALSE;
	}
	casidx_tokenizer_reset(backend->tok);
	casidx_query_body_restart(&ctx->doc_state);
	ctx->key_open = TRUE;
	return TRUE;
}

static void
fts_backend_casidx_update_unset_build_key(struct fts_backend_update_context
					  *_ctx)
{
	struct casidx_fts_backend_update_context *ctx =
		container_of(_ctx, struct casidx_fts_backend_update_context,
			     ctx);
	struct casidx_fts_backend *backend =
		container_of(_ctx->backend, struct casidx_fts_backend,
			     backend);

	if (!ctx->key_open)
		return;
	casidx_tokenizer_final(backend->tok, casidx_update_token, ctx);
	ctx->key_open = FALSE;
}

static int
fts_backend_casidx_update_build_more(struct fts_backend_update_context *_ctx,
				     const unsigned char *data, size_t size)
{
	struct casidx_fts_backend_update_context *ctx =
		container_of(_ctx, struct casidx_fts_backend_update_context,
			     ctx);
	struct casidx_fts_backend *backend =
		container_of(_ctx->backend, struct casidx_fts_backend,
			     backend);

	if (size == 0 || !ctx->key_open)
		return _ctx->failed ? -1 : 0;
	ctx->bytes += size;
	casidx_tokenizer_feed(backend->tok, data, size,
			      casidx_update_token, ctx);
	casidx_update_dtgram_feed(ctx, data, size);
	return _ctx->failed ? -1 : 0;
}

static int fts_backend_casidx_refresh(struct fts_backend *backend ATTR_UNUSED)
{
	/* every lookup and get_last_uid reloads the manifest */
	return 0;
}

static int fts_backend_casidx_rescan(struct fts_backend *_backend)
{
	struct casidx_fts_backend *backend =
		container_of(_backend, struct casidx_fts_backend, backend);
	const char *error;

	/* Indexes are derived data: drop them all, the indexer rebuilds
	   each mailbox from get_last_uid() = 0. */
	casidx_backend_close_indexes(backend);
	if (unlink_directory(backend->root, UNLINK_DIRECTORY_FLAG_RMDIR,
			     &error) < 0 && errno != ENOENT) {
		e_error(backend->event, "%s", error);
		return -1;
	}
	return 0;
}

static int fts_backend_casidx_optimize(struct fts_backend *_backend)
{
	struct casidx_fts_backend *backend =
		container_of(_backend, struct casidx_fts_backend, backend);
	struct casidx_index *index;
	struct dirent *d;
	const char *error;
	unsigned int resealed;
	DIR *dir;
	int ret = 0;

	dir = opendir(backend->root);
	if (dir == NULL) {
		if (errno == ENOENT)
			return 0;
		e_error(backend->event, "opendir(%s) failed: %m",
			backend->root);
		return -1;
	}
	if (casidx_backend_load_key(backend) < 0) {
		(void)closedir(dir);
		return -1;
	}
	while ((d = readdir(dir)) != NULL) {
		if (d->d_name[0] == '.')
			continue;
		index = casidx_index_init(t_strdup_printf("%s/%s",
			backend->root, d->d_name), &backend->set);
		/* the directory is named after the mailbox GUID */
		if (backend->keyring != NULL)
			casidx_index_set_crypt(index, backend->keyring,
					       d->d_name);
		/* and, after key rotate, every segment moves to the
		   current key epoch (doc/threat-model.md, "Key rotation") */
		if (casidx_index_refresh(index, &error) < 0 ||
		    casidx_index_optimize(index, &error) < 0 ||
		    casidx_index_reseal(index, &resealed, &error) < 0) {
			e_error(backend->event, "optimize: %s", error);
			ret = -1;
		} else if (resealed > 0) {
			e_debug(backend->event, "optimize: %s: %u segment(s) "
				"sealed under the current key epoch",
				d->d_name, resealed);
		}
		casidx_index_deinit(&index);
	}
	if (closedir(dir) < 0) {
		e_error(backend->event, "closedir(%s) failed: %m",
			backend->root);
		ret = -1;
	}
	return ret;
}

/* The field mask casidx can answer arg with, 0 if it can't. */
static unsigned int casidx_arg_field_mask(const struct mail_search_arg *arg)
{
	enum casidx_field field;

	if (arg->no_fts)
		return 0;
	switch (arg->type) {
	case SEARCH_BODY:
		return CASIDX_FIELD_MASK(CASIDX_FIELD_BODY);
	case SEARCH_TEXT:
		return CASIDX_FIELD_MASK_ALL;
	case SEARCH_HEADER:
	case SEARCH_HEADER_COMPRESS_LWSP:
		/* raw value: addresses are indexed normalised, so only
		   Subject is comparable */
		if (strcasecmp(arg->hdr_field_name, "Subject") == 0)
			return CASIDX_FIELD_MASK(CASIDX_FIELD_SUBJECT);
		return 0;
	case SEARCH_HEADER_ADDRESS:
		field = casidx_header_field(arg->hdr_field_name);
		if (field == CASIDX_FIELD_HEADER)
			return 0;
		return CASIDX_FIELD_MASK(field);
	default:
		return 0;
	}
}

static bool
fts_backend_casidx_can_lookup(struct fts_backend *_backend,
			      const struct mail_search_arg *args)
{
	struct casidx_fts_backend *backend =
		(struct casidx_fts_backend *)_backend;

	/* Password mode: Dovecot 2.3 builds the index only in
	   indexer-worker or doveadm, which never have the password the
	   index key needs, so there is never an index to ask. Saying so
	   here makes the core search the (decrypted) mail in the session
	   instead of queueing indexer work that can only fail. */
	if (backend->key_mode == CAS_KEY_MODE_PASSWORD)
		return FALSE;
	for (; args != NULL; args = args->next) {
		if (args->type == SEARCH_OR || args->type == SEARCH_SUB) {
			if (fts_backend_casidx_can_lookup(_backend,
							  args->value.subargs))
				return TRUE;
		} else if (casidx_arg_field_mask(args) != 0 &&
			   args->value.str[0] != '\0') {
			return TRUE;
		}
	}
	return FALSE;
}

static void bitmap_to_seq_range(const roaring_bitmap_t *bm,
				ARRAY_TYPE(seq_range) *dest)
{
	roaring_uint32_iterator_t *it = roaring_create_iterator(bm);
	uint32_t start = 0, prev = 0;

	for (; it->has_value; roaring_advance_uint32_iterator(it)) {
		if (start != 0 && it->current_value == prev + 1) {
			prev = it->current_value;
			continue;
		}
		if (start != 0)
			seq_range_array_add_range(dest, start, prev);
		start = prev = it->current_value;
	}
	if (start != 0)
		seq_range_array_add_range(dest, start, prev);
	roaring_free_uint32_iterator(it);
}

static void casidx_add_scores(const struct casidx_query_result *qres,
			      struct fts_result *result)
{
	roaring_bitmap_t *all = roaring_bitmap_or(qres->definite, qres->maybe);
	roaring_uint32_iterator_t *it = roaring_create_iterator(all);
	struct fts_score_map *score;

	/* unique per UID and UID-sorted: virtual mailboxes require it */
	for (; it->has_value; roaring_advance_uint32_iterator(it)) {
		score = array_append_space(&result->scores);
		score->uid = it->current_value;
		score->score = casidx_query_result_score(qres, score->uid);
	}
	roaring_free_uint32_iterator(it);
	roaring_bitmap_free(all);
	result->scores_sorted = TRUE;
}

/* What the index has read so far in this process (cumulative): the
   cost of a session's first search is in its segment opens and
   dictionary decoding (doc/casidx-format.md, "Reading"). */
static void casidx_lookup_stats_debug(struct casidx_fts_backend *backend,
				      struct mailbox *box,
				      const struct casidx_index *index)
{
	struct casidx_index_stats st;

	casidx_index_get_stats(index, &st);
	e_debug(backend->event, "%s: segments opened: %u (%"PRIu64" file "
		"bytes, %"PRIu64" image bytes), dictionary terms decoded: "
		"%"PRIu64" of %"PRIu64", with signatures: %"PRIu64,
		mailbox_get_vname(box), st.segments_opened, st.file_bytes,
		st.image_bytes, st.terms_decoded, st.terms_total,
		st.terms_signed);
}

/* Returns 1 answered, 0 not (the index was damaged and is dropped:
   Dovecot answers the search itself), -1 error. */
static int
casidx_lookup_eval(struct casidx_fts_backend *backend, struct mailbox *box,
		   const struct casidx_query_leaf *leaves,
		   unsigned int leaf_count, enum fts_lookup_flags flags,
		   struct casidx_query_result *qres_r, const char **error_r)
{
	struct casidx_index *index;
	const char *error;

	if (casidx_backend_get_fresh_index(backend, box, &index) < 0) {
		*error_r = "index open failed";
		return -1;
	}
	if (casidx_query_eval(index, backend->tok, leaves, leaf_count,
			      (flags & FTS_LOOKUP_FLAG_AND_ARGS) != 0,
			      qres_r, error_r) == 0) {
		casidx_lookup_stats_debug(backend, box, index);
		return 1;
	}
	if (!casidx_index_is_corrupted(index)) {
		e_error(backend->event, "%s: lookup failed: %s",
			mailbox_get_vname(box), *error_r);
		return -1;
	}
	e_error(backend->event, "%s - rebuilding the index", *error_r);
	if (casidx_index_delete(index, &error) < 0)
		e_error(backend->event, "%s", error);
	return 0;
}

/* Send casidx_lookup_finished (doc/events.md); event was created when
   the lookup began. qres = NULL: it failed with error. */
static void casidx_lookup_event(struct event *event, struct mailbox *box,
				unsigned int args,
				const struct casidx_query_result *qres,
				const char *error)
{
	struct event_passthrough *e;
	struct timeval start, now;
	uint64_t definite = 0, maybe = 0;

	event_get_create_time(event, &start);
	i_gettimeofday(&now);
	e = event_create_passthrough(event)->
		set_name("casidx_lookup_finished")->
		add_str("mailbox", mailbox_get_vname(box))->
		add_int("args", args);
	if (qres != NULL) {
		definite = roaring_bitmap_get_cardinality(qres->definite);
		maybe = roaring_bitmap_get_cardinality(qres->maybe);
		e->add_int("definite", definite)->add_int("maybe", maybe);
	} else {
		e->add_str("error", error);
	}
	/* the lookup's own time, apart from Dovecot's reading of the
	   maybe candidates: what the SEARCH costs in casidx */
	e_debug(e->event(), "%s: lookup of %u args: %"PRIu64" definite, "
		"%"PRIu64" maybe in %lld us", mailbox_get_vname(box), args,
		definite, maybe, timeval_diff_usecs(&now, &start));
}

static int
fts_backend_casidx_lookup(struct fts_backend *_backend, struct mailbox *box,
			  struct mail_search_arg *args,
			  enum fts_lookup_flags flags,
			  struct fts_result *result)
{
	struct casidx_fts_backend *backend =
		container_of(_backend, struct casidx_fts_backend, backend);
	ARRAY(struct casidx_query_leaf) leaves;
	ARRAY(struct mail_search_arg *) claimed;
	struct mail_search_arg *arg, *const *argp;
	struct casidx_query_leaf *leaf;
	struct casidx_query_result qres;
	struct event *event;
	const char *error;
	unsigned int mask;
	int ret;

	result->box = box;
	t_array_init(&leaves, 8);
	t_array_init(&claimed, 8);
	for (arg = args; arg != NULL; arg = arg->next) {
		/* SUB/OR children are looked up separately by the core */
		mask = casidx_arg_field_mask(arg);
		if (mask == 0 || !casidx_query_value_is_answerable(
				backend->tok, arg->value.str, mask))
			continue;
		leaf = array_append_space(&leaves);
		leaf->field_mask = mask;
		leaf->value = arg->value.str;
		leaf->match_not = arg->match_not;
		leaf->fuzzy = arg->fuzzy;
		array_push_back(&claimed, &arg);
	}
	if (array_count(&leaves) == 0)
		return 0;

	event = event_create(backend->event);
	ret = casidx_lookup_eval(backend, box, array_front(&leaves),
				 array_count(&leaves), flags, &qres, &error);
	if (ret > 0) {
		array_foreach(&claimed, argp)
			(*argp)->match_always = TRUE;
		bitmap_to_seq_range(qres.definite, &result->definite_uids);
		bitmap_to_seq_range(qres.maybe, &result->maybe_uids);
		casidx_add_scores(&qres, result);
	}
	casidx_lookup_event(event, box, array_count(&leaves),
			    ret > 0 ? &qres : NULL, ret > 0 ? NULL : error);
	if (ret > 0)
		casidx_query_result_free(&qres);
	event_unref(&event);
	return ret < 0 ? -1 : 0;
}

struct fts_backend fts_backend_casidx = {
	.name = "casidx",
	.flags = FTS_BACKEND_FLAG_FUZZY_SEARCH,
	.v = {
		.alloc = fts_backend_casidx_alloc,
		.init = fts_backend_casidx_init,
		.deinit = fts_backend_casidx_deinit,
		.get_last_uid = fts_backend_casidx_get_last_uid,
		.update_init = fts_backend_casidx_update_init,
		.update_deinit = fts_backend_casidx_update_deinit,
		.update_set_mailbox = fts_backend_casidx_update_set_mailbox,
		.update_expunge = fts_backend_casidx_update_expunge,
		.update_set_build_key = fts_backend_casidx_update_set_build_key,
		.update_unset_build_key =
			fts_backend_casidx_update_unset_build_key,
		.update_build_more = fts_backend_casidx_update_build_more,
		.refresh = fts_backend_casidx_refresh,
		.rescan = fts_backend_casidx_rescan,
		.optimize = fts_backend_casidx_optimize,
		.can_lookup = fts_backend_casidx_can_lookup,
		.lookup = fts_backend_casidx_lookup,
	},
};
