/* casbox storage class and mailbox: index-storage based, sdbox-like
   layout (mailboxes/<name>/casbox-Mails/dovecot.index*), no files per
   message. */

#include "lib.h"
#include "safe-memset.h"
#include "casbox-storage.h"
#include "casbox-events.h"
#include "ioloop.h"
#include "mail-index-modseq.h"
#include "mailbox-list-private.h"
#include "mailbox-uidvalidity.h"
#include "index-pop3-uidl.h"
#include "casbox-plugin.h"
#include "casbox-store.h"
#include "casbox-save.h"
#include "casbox-copy.h"
#include "casbox-mail.h"
#include "casbox-sync.h"
#include "casbox-sync-rebuild.h"
#include "casbox-dovecot.h"

#include <sys/stat.h>

static struct event_category event_category_casbox = {
	.name = "casbox",
	.parent = &event_category_storage,
};

struct event *casbox_event_create(struct event *parent)
{
	struct event *event = event_create(parent);

	event_add_category(event, &event_category_casbox);
	return event;
}

static struct mail_storage *casbox_storage_alloc(void)
{
	struct casbox_storage *storage;
	pool_t pool;

	pool = pool_alloconly_create("casbox storage", 1024);
	storage = p_new(pool, struct casbox_storage, 1);
	storage->storage = casbox_storage;
	storage->storage.pool = pool;
	return &storage->storage;
}

static int
casbox_storage_create(struct mail_storage *_storage,
		      struct mail_namespace *ns, const char **error_r)
{
	struct casbox_storage *storage = CASBOX_STORAGE(_storage);
	const char *error;

	if (casbox_settings_read(_storage->user, _storage->pool,
				 &storage->set, &error) < 0) {
		*error_r = t_strconcat(CASBOX_LOG_PREFIX, error, NULL);
		return -1;
	}
	storage->root_dir = p_strdup(_storage->pool,
		mailbox_list_get_root_forced(ns->list,
					     MAILBOX_LIST_PATH_TYPE_DIR));
	/* one store per root: COPY shares blobs only inside it */
	_storage->unique_root_dir = p_strdup(_storage->pool,
					     CASBOX_LIST_ROOT_DIR(ns->list));
	return 0;
}

static void casbox_storage_destroy(struct mail_storage *_storage)
{
	struct casbox_storage *storage = CASBOX_STORAGE(_storage);

	if (storage->store != NULL)
		casbox_store_close(&storage->store);
	if (storage->set.key_password != NULL) {
		safe_memset((char *)storage->set.key_password, 0,
			    strlen(storage->set.key_password));
	}
	index_storage_destroy(_storage);
}

int casbox_storage_get_store(struct casbox_storage *storage,
			     struct casbox_store **store_r)
{
	struct mail_storage *_storage = &storage->storage;
	const char *error;

	if (storage->store == NULL) {
		storage->set.event = _storage->event;
		if (casbox_store_open(storage->root_dir, &storage->set,
				      _storage->set->parsed_fsync_mode,
				      _storage->set->parsed_lock_method,
				      &storage->store, &error) < 0) {
			mail_storage_set_critical(_storage,
				CASBOX_LOG_PREFIX"%s", error);
			return -1;
		}
		/* released at every mailbox sync (casbox-sync.c) */
		casbox_store_keep_read_fd(storage->store);
	}
	*store_r = storage->store;
	return 0;
}

static struct mailbox *
casbox_mailbox_alloc(struct mail_storage *storage, struct mailbox_list *list,
		     const char *vname, enum mailbox_flags flags)
{
	struct casbox_mailbox *mbox;
	struct index_mailbox_context *ibox;
	pool_t pool;

	/* the index is authoritative for UIDs and flags */
	flags &= ENUM_NEGATE(MAILBOX_FLAG_NO_INDEX_FILES);

	pool = pool_alloconly_create("casbox mailbox", 1024*3);
	mbox = p_new(pool, struct casbox_mailbox, 1);
	mbox->box = casbox_mailbox;
	mbox->box.pool = pool;
	mbox->box.storage = storage;
	mbox->box.list = list;
	mbox->box.mail_vfuncs = &casbox_mail_vfuncs;

	index_storage_mailbox_alloc(&mbox->box, vname, flags,
				    MAIL_INDEX_PREFIX);

	ibox = INDEX_STORAGE_CONTEXT(&mbox->box);
	ibox->index_flags |= MAIL_INDEX_OPEN_FLAG_KEEP_BACKUPS |
		MAIL_INDEX_OPEN_FLAG_NEVER_IN_MEMORY;

	mbox->storage = CASBOX_STORAGE(storage);
	return &mbox->box;
}

int casbox_read_header(struct casbox_mailbox *mbox,
		       struct casbox_index_header *hdr, bool log_error,
		       bool *need_resize_r)
{
	struct mail_index_view *view;
	const void *data;
	size_t data_size;
	int ret = 0;

	i_assert(mbox->box.opened);

	view = mail_index_view_open(mbox->box.index);
	mail_index_get_header_ext(view, mbox->hdr_ext_id, &data, &data_size);
	if (data_size < sizeof(*hdr) &&
	    (!mbox->box.creating || data_size != 0)) {
		if (log_error) {
			mailbox_set_critical(&mbox->box, CASBOX_LOG_PREFIX
					     "Invalid casbox header size");
		}
		ret = -1;
	} else {
		i_zero(hdr);
		memcpy(hdr, data, I_MIN(data_size, sizeof(*hdr)));
		if (guid_128_is_empty(hdr->mailbox_guid))
			ret = -1;
		else {
			/* keep it in case the index gets reset */
			mail_index_set_ext_init_data(mbox->box.index,
						     mbox->hdr_ext_id,
						     hdr, sizeof(*hdr));
		}
	}
	mail_index_view_close(&view);
	*need_resize_r = data_size < sizeof(*hdr);
	return ret;
}

void casbox_mailbox_set_guids(struct casbox_mailbox *mbox,
			      const struct casbox_index_header *hdr)
{
	guid_128_copy(mbox->mailbox_guid, hdr->mailbox_guid);
	if (guid_128_is_empty(hdr->public_guid))
		guid_128_copy(mbox->public_guid, hdr->mailbox_guid);
	else
		guid_128_copy(mbox->public_guid, hdr->public_guid);
}

static void
casbox_update_header(struct casbox_mailbox *mbox,
		     struct mail_index_transaction *trans,
		     const struct mailbox_update *update,
		     const guid_128_t public_guid)
{
	struct casbox_index_header hdr, new_hdr;
	bool need_resize, new_index;

	if (casbox_read_header(mbox, &hdr, TRUE, &need_resize) < 0) {
		i_zero(&hdr);
		need_resize = TRUE;
	}
	new_index = mail_index_get_header(mbox->box.view)->uid_validity == 0;

	new_hdr = hdr;
	if (new_index && update != NULL &&
	    !guid_128_is_empty(update->mailbox_guid)) {
		guid_128_copy(new_hdr.mailbox_guid, update->mailbox_guid);
		guid_128_empty(new_hdr.public_guid);
	} else if (guid_128_is_empty(new_hdr.mailbox_guid)) {
		guid_128_generate(new_hdr.mailbox_guid);
		guid_128_empty(new_hdr.public_guid);
	}
	if (new_index && public_guid != NULL &&
	    !guid_128_equals(public_guid, new_hdr.mailbox_guid))
		guid_128_copy(new_hdr.public_guid, public_guid);
	if (!new_index && update != NULL &&
	    !guid_128_is_empty(update->mailbox_guid)) {
		/* a GUID change: the records stay under the storage id,
		   so this one header field is the whole change */
		if (guid_128_equals(update->mailbox_guid,
				    new_hdr.mailbox_guid))
			guid_128_empty(new_hdr.public_guid);
		else {
			guid_128_copy(new_hdr.public_guid,
				      update->mailbox_guid);
		}
	}

	if (need_resize) {
		mail_index_ext_resize_hdr(trans, mbox->hdr_ext_id,
					  sizeof(new_hdr));
	}
	if (need_resize || memcmp(&hdr, &new_hdr, sizeof(hdr)) != 0) {
		mail_index_update_header_ext(trans, mbox->hdr_ext_id, 0,
					     &new_hdr, sizeof(new_hdr));
	}
	casbox_mailbox_set_guids(mbox, &new_hdr);
}

static uint32_t casbox_get_uidvalidity_next(struct mailbox_list *list)
{
	const char *path;

	path = mailbox_list_get_root_forced(list,
					    MAILBOX_LIST_PATH_TYPE_CONTROL);
	path = t_strconcat(path, "/"CASBOX_UIDVALIDITY_FILE_NAME, NULL);
	return mailbox_uidvalidity_next(list, path);
}

static void
casbox_update_header_fields(struct mailbox *box,
			    const struct mailbox_update *update,
			    struct mail_index_transaction *trans)
{
	const struct mail_index_header *hdr;
	uint32_t uid_validity, value;

	hdr = mail_index_get_header(box->view);
	if (update != NULL && update->uid_validity != 0)
		uid_validity = update->uid_validity;
	else if (hdr->uid_validity != 0)
		uid_validity = hdr->uid_validity;
	else
		uid_validity = casbox_get_uidvalidity_next(box->list);

	if (hdr->uid_validity != uid_validity) {
		mail_index_update_header(trans,
			offsetof(struct mail_index_header, uid_validity),
			&uid_validity, sizeof(uid_validity), TRUE);
	}
	if (update == NULL)
		return;
	if (hdr->next_uid < update->min_next_uid) {
		value = update->min_next_uid;
		mail_index_update_header(trans,
			offsetof(struct mail_index_header, next_uid),
			&value, sizeof(value), TRUE);
	}
	if (update->min_first_recent_uid != 0 &&
	    hdr->first_recent_uid < update->min_first_recent_uid) {
		value = update->min_first_recent_uid;
		mail_index_update_header(trans,
			offsetof(struct mail_index_header, first_recent_uid),
			&value, sizeof(value), FALSE);
	}
	if (update->min_highest_modseq != 0 &&
	    mail_index_modseq_get_highest(box->view) <
	    update->min_highest_modseq) {
		mail_index_modseq_enable(box->index);
		mail_index_update_highest_modseq(trans,
						 update->min_highest_modseq);
	}
}

int casbox_mailbox_create_indexes(struct mailbox *box,
				  const struct mailbox_update *update,
				  const guid_128_t public_guid,
				  struct mail_index_transaction *trans)
{
	struct casbox_mailbox *mbox = CASBOX_MAILBOX(box);
	struct mail_index_transaction *new_trans = NULL;

	if (trans == NULL) {
		new_trans = mail_index_transaction_begin(box->view, 0);
		trans = new_trans;
	}
	casbox_update_header_fields(box, update, trans);
	if (box->inbox_user && box->creating) {
		/* pop3-uidl header starts when the mailbox is created */
		index_pop3_uidl_set_max_uid(box, trans, 0);
	}
	casbox_update_header(mbox, trans, update, public_guid);
	if (new_trans != NULL) {
		if (mail_index_transaction_commit(&new_trans) < 0) {
			mailbox_set_index_error(box);
			return -1;
		}
	}
	return 0;
}

static int casbox_mailbox_alloc_index(struct casbox_mailbox *mbox)
{
	struct casbox_index_header hdr;

	if (index_storage_mailbox_alloc_index(&mbox->box) < 0)
		return -1;

	mbox->hdr_ext_id =
		mail_index_ext_register(mbox->box.index, "casbox-hdr",
					sizeof(struct casbox_index_header),
					0, 0);
	/* initialization data in case the mailbox is being created */
	i_zero(&hdr);
	guid_128_generate(hdr.mailbox_guid);
	mail_index_set_ext_init_data(mbox->box.index, mbox->hdr_ext_id,
				     &hdr, sizeof(hdr));
	return 0;
}

static int casbox_mailbox_check_existence(struct mailbox *box)
{
	const char *box_path = mailbox_get_path(box);
	struct stat st;

	if (stat(box_path, &st) == 0)
		return 0;
	if (errno == ENOENT || errno == ENAMETOOLONG) {
		mail_storage_set_error(box->storage, MAIL_ERROR_NOTFOUND,
			T_MAIL_ERR_MAILBOX_NOT_FOUND(box->vname));
	} else if (errno == EACCES) {
		mailbox_set_critical(box, "%s",
			mail_error_eacces_msg("stat", box_path));
	} else {
		mailbox_set_critical(box, "stat(%s) failed: %m", box_path);
	}
	return -1;
}

/* Password mode, in a session that has the password (IMAP/POP3 login):
   unlock the user key now, and create it for a new store (the only
   place a user key file can be made, doc/threat-model.md). A failure
   (e.g. wrong password) is logged here once; reading mail then fails
   per message with the same reason, while flags, expunges and LMTP-
   style saves keep working. */
static void casbox_mailbox_unlock_key(struct casbox_mailbox *mbox)
{
	struct casbox_storage *storage = mbox->storage;
	struct casbox_store *store;
	const char *error;

	if (storage->set.key_mode != CAS_KEY_MODE_PASSWORD ||
	    storage->set.key_password == NULL || storage->key_unlock_tried)
		return;
	storage->key_unlock_tried = TRUE;
	if (casbox_storage_get_store(storage, &store) < 0)
		return;
	if (casbox_store_open_keys(store, &error) < 0) {
		e_error(mbox->box.event, CASBOX_LOG_PREFIX
			"Couldn't unlock the user key: %s", error);
	}
}

/* The mailbox does not exist and is probably about to be autocreated
   (INBOX on a user's first delivery). Dovecot holds the mailbox list
   lock (mailboxes.lock) through create_box, and other processes of the
   same user then wait for it while holding the list index log; a new
   store's first open (key file, LSM, their fsyncs) inside that window
   made Dovecot's own lock-order race between the two (a panic on
   EDEADLK, sdbox has it too) several times as likely. Open the store
   here, before any Dovecot lock is taken; a failure is logged and
   create_box tries again. */
static void casbox_mailbox_open_store_before_create(struct casbox_mailbox *mbox)
{
	struct mail_storage *storage = mbox->box.storage;
	struct casbox_store *store;
	enum mail_error error;
	const char *root, *errstr;

	(void)mailbox_get_last_error(&mbox->box, &error);
	if (error != MAIL_ERROR_NOTFOUND || mbox->storage->store != NULL)
		return;
	mail_storage_last_error_push(storage);
	/* a new user's home and mail root do not exist yet: made here as
	   create_box would make them (same permissions) */
	if (mailbox_list_get_root_path(mbox->box.list,
				       MAILBOX_LIST_PATH_TYPE_DIR, &root) &&
	    mailbox_list_try_mkdir_root(mbox->box.list, root,
					MAILBOX_LIST_PATH_TYPE_DIR,
					&errstr) >= 0)
		(void)casbox_storage_get_store(mbox->storage, &store);
	mail_storage_last_error_pop(storage);
}

static int casbox_mailbox_open(struct mailbox *box)
{
	struct casbox_mailbox *mbox = CASBOX_MAILBOX(box);
	struct casbox_index_header hdr;
	bool need_resize;

	if (casbox_mailbox_check_existence(box) < 0) {
		casbox_mailbox_open_store_before_create(mbox);
		return -1;
	}
	if (casbox_mailbox_alloc_index(mbox) < 0)
		return -1;
	if (index_storage_mailbox_open(box, FALSE) < 0)
		return -1;
	/* the cache would hold headers and BODYSTRUCTUREs in plaintext;
	   sizes, dates and GUIDs then come from the message records */
	if (!mbox->storage->set.cache_plaintext)
		box->mail_cache_disabled = TRUE;
	mail_index_set_fsync_mode(box->index,
				  box->storage->set->parsed_fsync_mode,
				  MAIL_INDEX_FSYNC_MASK_APPENDS |
				  MAIL_INDEX_FSYNC_MASK_EXPUNGES);

	casbox_mailbox_unlock_key(mbox);
	if (box->creating) {
		/* mailbox creation initializes the index */
		return 0;
	}

	if (casbox_read_header(mbox, &hdr, FALSE, &need_resize) < 0) {
		/* the header may not be synced yet */
		(void)casbox_sync(mbox, CASBOX_SYNC_FLAG_FORCE);
		if (casbox_read_header(mbox, &hdr, TRUE, &need_resize) < 0)
			i_zero(&hdr);
	}
	if (guid_128_is_empty(hdr.mailbox_guid)) {
		if (casbox_mailbox_create_indexes(box, NULL, NULL,
						  NULL) < 0 ||
		    casbox_read_header(mbox, &hdr, TRUE, &need_resize) < 0)
			return -1;
	}
	casbox_mailbox_set_guids(mbox, &hdr);
	/* records of a save interrupted before its index commit: release
	   them now, not only when a later save reaches their UIDs */
	if (casbox_sync_have_orphans(mbox)) {
		e_debug(box->event, CASBOX_LOG_PREFIX"Records at or above "
			"next UID %u: syncing under the index lock",
			mail_index_get_header(box->view)->next_uid);
		(void)casbox_sync(mbox, CASBOX_SYNC_FLAG_FORCE);
	}
	return 0;
}

/* Remember the mailbox (GUID -> name, UIDVALIDITY) in the LSM so that
   a rebuild can recreate it. Failure is logged, not fatal: the index
   still has everything needed to serve the mailbox. */
/* Does the stored mailbox record already say what the index does? Then
   a write would change nothing (put never lowers next_uid and
   highest_modseq), and a mailbox that is only read (dsync's sending
   side calls mailbox_update() too) stays unwritten. */
static bool
casbox_mailbox_record_is_current(struct casbox_mailbox *mbox,
				 struct casbox_store *store)
{
	struct casbox_mailbox_record rec;
	const struct mail_index_header *hdr;
	struct mail_index_view *view;
	guid_128_t guid;
	const char *error;
	bool current;

	if (casbox_store_mailbox_find(store, mailbox_get_vname(&mbox->box),
				      pool_datastack_create(), guid, &rec,
				      &error) <= 0)
		return FALSE;
	(void)mail_index_refresh(mbox->box.index);
	view = mail_index_view_open(mbox->box.index);
	hdr = mail_index_get_header(view);
	current = guid_128_equals(guid, mbox->mailbox_guid) &&
		guid_128_equals(rec.guid, mbox->public_guid) &&
		rec.uid_validity == hdr->uid_validity &&
		rec.next_uid >= hdr->next_uid &&
		rec.highest_modseq >= mail_index_modseq_get_highest(view);
	mail_index_view_close(&view);
	return current;
}

static void casbox_mailbox_record_update(struct casbox_mailbox *mbox)
{
	struct casbox_store *store;
	struct casbox_store_txn *txn;
	const char *error;
	bool current;

	if (guid_128_is_empty(mbox->mailbox_guid))
		return;
	if (casbox_storage_get_store(mbox->storage, &store) < 0)
		return;
	T_BEGIN {
		current = casbox_mailbox_record_is_current(mbox, store);
	} T_END;
	if (current)
		return;
	/* from a fresh view: box->view still shows the index before the
	   creation committed (UIDVALIDITY 0) */
	if (casbox_store_txn_begin(store, &txn, &error) == 0) {
		casbox_sync_rebuild_mirror_mailbox(mbox, txn);
		if (casbox_store_txn_commit(&txn, &error) == 0)
			return;
	}
	mailbox_set_critical(&mbox->box, CASBOX_LOG_PREFIX"%s", error);
}

/* The mailbox's recovery record in the packs, for rebuild --from-packs.
   A failure is logged, not fatal: the mailbox works, only a rebuild from
   the packs would miss this change. */
static void casbox_mailbox_recovery(struct casbox_mailbox *mbox,
				    const guid_128_t mailbox_guid,
				    bool deleted)
{
	struct casbox_mailbox_record rec;
	struct casbox_store *store;
	struct mail_index_view *view;
	const char *error;

	if (guid_128_is_empty(mailbox_guid) ||
	    casbox_storage_get_store(mbox->storage, &store) < 0)
		return;
	i_zero(&rec);
	rec.name = mailbox_get_vname(&mbox->box);
	if (!deleted) {
		(void)mail_index_refresh(mbox->box.index);
		view = mail_index_view_open(mbox->box.index);
		rec.uid_validity = mail_index_get_header(view)->uid_validity;
		mail_index_view_close(&view);
		if (rec.uid_validity == 0)
			return;
	}
	if (casbox_store_mailbox_recovery(store, mailbox_guid,
					  mbox->public_guid, &rec, deleted,
					  &error) < 0) {
		e_error(mbox->box.event, CASBOX_LOG_PREFIX
			"Writing the mailbox recovery record failed: %s",
			error);
	}
}

struct casbox_storage_id_context {
	const unsigned char *guid;
	const char *name;
	bool taken;
};

static void
casbox_storage_id_check(void *context, const guid_128_t mailbox_guid,
			const struct casbox_mailbox_record *rec)
{
	struct casbox_storage_id_context *ctx = context;

	if (guid_128_equals(mailbox_guid, ctx->guid) &&
	    strcmp(rec->name, ctx->name) != 0)
		ctx->taken = TRUE;
}

/* Is guid the storage id of another mailbox's records? It can be: the
   storage id stays when dsync changes a mailbox's public GUID, and a
   later create may be given the old GUID. */
static bool
casbox_storage_id_is_taken(struct casbox_mailbox *mbox,
			   const guid_128_t guid)
{
	struct casbox_storage_id_context ctx = {
		.guid = guid, .name = mailbox_get_vname(&mbox->box),
	};
	struct casbox_store *store;
	const char *error;

	if (casbox_storage_get_store(mbox->storage, &store) < 0)
		return FALSE;
	if (casbox_store_mailbox_iterate(store, casbox_storage_id_check,
					 &ctx, &error) < 0) {
		e_error(mbox->box.event, CASBOX_LOG_PREFIX"%s", error);
		return FALSE;
	}
	return ctx.taken;
}

static int casbox_mailbox_create_locked(struct mailbox *box,
					const struct mailbox_update *update)
{
	struct mail_index_sync_ctx *sync_ctx;
	struct mail_index_view *view;
	struct mail_index_transaction *trans;
	struct mailbox_update rec_update;
	guid_128_t rec_public_guid;
	const unsigned char *public_guid = NULL;
	int ret;

	/* syncing works as a lock against concurrent creators */
	ret = mail_index_sync_begin(box->index, &sync_ctx, &view, &trans, 0);
	if (ret <= 0) {
		i_assert(ret != 0);
		mailbox_set_index_error(box);
		return -1;
	}
	if (mail_index_get_header(view)->uid_validity == 0) {
		/* a lost mailbox directory: keep its GUID and UIDVALIDITY,
		   the sync then rebuilds its messages */
		if (update == NULL &&
		    casbox_sync_rebuild_create_update(CASBOX_MAILBOX(box),
						      &rec_update,
						      rec_public_guid) > 0) {
			update = &rec_update;
			public_guid = rec_public_guid;
		} else if (update != NULL &&
			   !guid_128_is_empty(update->mailbox_guid) &&
			   casbox_storage_id_is_taken(CASBOX_MAILBOX(box),
						      update->mailbox_guid)) {
			/* a fresh storage id, the GUID asked for as the
			   public one */
			rec_update = *update;
			guid_128_generate(rec_update.mailbox_guid);
			guid_128_copy(rec_public_guid, update->mailbox_guid);
			update = &rec_update;
			public_guid = rec_public_guid;
		}
		if (casbox_mailbox_create_indexes(box, update, public_guid,
						  trans) < 0) {
			mail_index_sync_rollback(&sync_ctx);
			return -1;
		}
	}
	return mail_index_sync_commit(&sync_ctx);
}

static int
casbox_mailbox_create(struct mailbox *box,
		      const struct mailbox_update *update, bool directory)
{
	struct casbox_mailbox *mbox = CASBOX_MAILBOX(box);
	struct casbox_index_header hdr;
	bool need_resize;
	int ret;

	if ((ret = index_storage_mailbox_create(box, directory)) <= 0)
		return ret;
	if (mailbox_open(box) < 0)
		return -1;
	if (mail_index_get_header(box->view)->uid_validity != 0 &&
	    !box->storage->rebuilding_list_index) {
		mail_storage_set_error(box->storage, MAIL_ERROR_EXISTS,
				       "Mailbox already exists");
		return -1;
	}
	if (casbox_mailbox_create_locked(box, update) < 0)
		return -1;

	if (guid_128_is_empty(mbox->mailbox_guid)) {
		/* another process created it: read its GUID */
		if (casbox_read_header(mbox, &hdr, TRUE, &need_resize) < 0)
			return -1;
		casbox_mailbox_set_guids(mbox, &hdr);
	}
	casbox_mailbox_record_update(mbox);
	casbox_mailbox_recovery(mbox, mbox->mailbox_guid, FALSE);
	/* a lost mailbox recreated from its record: its messages back */
	if (casbox_sync_rebuild_needed(mbox) > 0)
		(void)casbox_sync(mbox, CASBOX_SYNC_FLAG_FORCE);
	return 0;
}

static int
casbox_mailbox_get_metadata(struct mailbox *box,
			    enum mailbox_metadata_items items,
			    struct mailbox_metadata *metadata_r)
{
	struct casbox_mailbox *mbox = CASBOX_MAILBOX(box);

	if (index_mailbox_get_metadata(box, items, metadata_r) < 0)
		return -1;
	if ((items & MAILBOX_METADATA_GUID) != 0) {
		memcpy(metadata_r->guid, mbox->public_guid,
		       sizeof(metadata_r->guid));
	}
	return 0;
}

static int
casbox_mailbox_update(struct mailbox *box,
		      const struct mailbox_update *update)
{
	struct casbox_mailbox *mbox = CASBOX_MAILBOX(box);

	if (!box->opened) {
		if (mailbox_open(box) < 0)
			return -1;
	}
	if (casbox_mailbox_create_indexes(box, update, NULL, NULL) < 0)
		return -1;
	if (index_storage_mailbox_update_common(box, update) < 0)
		return -1;
	casbox_mailbox_record_update(mbox);
	if (!guid_128_is_empty(update->mailbox_guid) ||
	    update->uid_validity != 0)
		casbox_mailbox_recovery(mbox, mbox->mailbox_guid, FALSE);
	return 0;
}

static int casbox_mailbox_delete(struct mailbox *box)
{
	struct casbox_mailbox *mbox = CASBOX_MAILBOX(box);
	struct casbox_store *store;
	guid_128_t guid;
	const char *error;

	/* index_storage_mailbox_delete() expunges the messages first,
	   which releases their blobs through the sync handler. */
	if (index_storage_mailbox_delete(box) < 0)
		return -1;
	memcpy(guid, mbox->mailbox_guid, sizeof(guid));
	if (guid_128_is_empty(guid))
		return 0;
	if (casbox_storage_get_store(mbox->storage, &store) < 0)
		return 0;
	if (casbox_store_mailbox_delete(store, guid, &error) < 0) {
		e_error(box->event, CASBOX_LOG_PREFIX
			"Failed to delete mailbox records: %s", error);
	} else {
		/* its messages' recovery records stay in the packs until
		   gc: this tells a rebuild not to bring them back */
		casbox_mailbox_recovery(mbox, guid, TRUE);
	}
	return 0;
}

static int casbox_mailbox_rename(struct mailbox *src, struct mailbox *dest)
{
	struct casbox_mailbox *dest_mbox = CASBOX_MAILBOX(dest);

	if (index_storage_mailbox_rename(src, dest) < 0)
		return -1;
	if (mailbox_open(dest) == 0) {
		casbox_mailbox_record_update(dest_mbox);
		casbox_mailbox_recovery(dest_mbox, dest_mbox->mailbox_guid,
					FALSE);
	}
	return 0;
}

static void casbox_notify_changes(struct mailbox *box)
{
	const char *dir, *path;

	if (box->notify_callback == NULL)
		mailbox_watch_remove_all(box);
	else {
		if (mailbox_get_path_to(box, MAILBOX_LIST_PATH_TYPE_INDEX,
					&dir) <= 0)
			return;
		path = t_strdup_printf("%s/"MAIL_INDEX_PREFIX".log", dir);
		mailbox_watch_add(box, path);
	}
}

struct mail_storage casbox_storage = {
	.name = CASBOX_STORAGE_NAME,
	.class_flags = MAIL_STORAGE_CLASS_FLAG_UNIQUE_ROOT |
		MAIL_STORAGE_CLASS_FLAG_HAVE_MAIL_GUIDS |
		MAIL_STORAGE_CLASS_FLAG_HAVE_MAIL_SAVE_GUIDS,
	.event_category = &event_category_casbox,
	CASBOX_STORAGE_CLASS_24
	.v = {
		.alloc = casbox_storage_alloc,
		.create = casbox_storage_create,
		.destroy = casbox_storage_destroy,
		CASBOX_STORAGE_VFUNCS_23
		.mailbox_alloc = casbox_mailbox_alloc,
		.list_index_rebuild = mail_storage_list_index_rebuild,
	},
};

struct mailbox casbox_mailbox = {
	.v = {
		.is_readonly = index_storage_is_readonly,
		.enable = index_storage_mailbox_enable,
		.exists = index_storage_mailbox_exists,
		.open = casbox_mailbox_open,
		.close = index_storage_mailbox_close,
		.free = index_storage_mailbox_free,
		.create_box = casbox_mailbox_create,
		.update_box = casbox_mailbox_update,
		.delete_box = casbox_mailbox_delete,
		.rename_box = casbox_mailbox_rename,
		.get_status = index_storage_get_status,
		.get_metadata = casbox_mailbox_get_metadata,
		.set_subscribed = index_storage_set_subscribed,
		.attribute_set = index_storage_attribute_set,
		.attribute_get = index_storage_attribute_get,
		.attribute_iter_init = index_storage_attribute_iter_init,
		.attribute_iter_next = index_storage_attribute_iter_next,
		.attribute_iter_deinit = index_storage_attribute_iter_deinit,
		.list_index_has_changed = index_storage_list_index_has_changed,
		.list_index_update_sync = index_storage_list_index_update_sync,
		.sync_init = casbox_storage_sync_init,
		.sync_next = index_mailbox_sync_next,
		.sync_deinit = index_mailbox_sync_deinit,
		.notify_changes = casbox_notify_changes,
		.transaction_begin = index_transaction_begin,
		.transaction_commit = index_transaction_commit,
		.transaction_rollback = index_transaction_rollback,
		.mail_alloc = casbox_mail_alloc,
		.search_init = index_storage_search_init,
		.search_deinit = index_storage_search_deinit,
		.search_next_nonblock = index_storage_search_next_nonblock,
		.search_next_update_seq = index_storage_search_next_update_seq,
		.search_next_match_mail = index_storage_search_next_match_mail,
		.save_alloc = casbox_save_alloc,
		.save_begin = casbox_save_begin,
		.save_continue = casbox_save_continue,
		.save_finish = casbox_save_finish,
		.save_cancel = casbox_save_cancel,
		.copy = casbox_copy,
		.transaction_save_commit_pre =
			casbox_transaction_save_commit_pre,
		.transaction_save_commit_post =
			casbox_transaction_save_commit_post,
		.transaction_save_rollback = casbox_transaction_save_rollback,
		.is_inconsistent = index_storage_is_inconsistent,
	},
};
