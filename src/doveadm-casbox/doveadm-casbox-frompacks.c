/* doveadm casbox rebuild --from-packs: rebuild a lost or damaged LSM
   from the packs alone (doc/doveadm.md, "rebuild --from-packs").

   1. Take the pack append lock (no save can add frames) and, if the old
      LSM still opens, its write lock.
   2. Keyless scan of every pack: blob frames by blob id, meta frames
      opened with the key (recovery records: the newest per mailbox and
      UID wins; DEK updates and recovery records: candidate DEKs per
      blob).
   3. Per message, every part's blob must resolve to an intact frame and
      a wrapped DEK that unwraps with the key and opens the frame's
      first chunk (newest frame first). Else the message is lost and
      named on stderr.
   4. Write a new LSM beside the old one (K, M, m and b records,
      refcount = references counted), rename the old one to
      lsm.broken-<time> (never deleted) and the new one to lsm.
   5. Force-resync every mailbox (INBOX first: it restores the mailbox
      directories from the M records), so Dovecot's index agrees. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "hash.h"
#include "hex-binary.h"
#include "istream.h"
#include "ioloop.h"
#include "safe-memset.h"
#include "mail-namespace.h"
#include "mail-storage-private.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "casbox-lsm.h"
#include "casbox-recovery.h"
#include "casbox-storage.h"
#include "casbox-store.h"
#include "doveadm-casbox.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/stat.h>

/* LSM puts per batch while writing the new LSM */
#define FROMPACKS_BATCH_RECORDS 1000

struct frompacks_frame {
	uint32_t pack_id;
	uint64_t offset;
	uint32_t frame_size;
	uint64_t plain_size;
	uint32_t dict_id;
};

struct frompacks_dek {
	unsigned char wrapped[CAS_WRAPPED_DEK_SIZE];
};

struct frompacks_blob {
	struct cas_blob_id id;
	ARRAY(struct frompacks_frame) frames;
	ARRAY(struct frompacks_dek) deks;
	/* references from the recovered message records */
	uint32_t refcount;
	/* 0 = not tried, 1 = rec is good, -1 = no frame opens */
	int resolved;
	struct casbox_blob_record rec;
};

struct frompacks_msg {
	guid_128_t mailbox_guid;
	uint32_t uid;
	struct casbox_recovery_record rec;
	bool lost;
};

struct frompacks_mailbox {
	guid_128_t guid;
	uint64_t newest_written;
	struct casbox_mailbox_record rec;
	unsigned int messages;
};

struct frompacks {
	struct casbox_admin *adm;
	pool_t pool;
	HASH_TABLE(struct cas_blob_id *, struct frompacks_blob *) blobs;
	ARRAY(struct frompacks_blob *) blob_list;
	/* "<mailbox guid hex>:<uid>" -> newest recovery record */
	HASH_TABLE(char *, struct frompacks_msg *) msgs;
	ARRAY(struct frompacks_msg *) msg_list;
	HASH_TABLE(char *, struct frompacks_mailbox *) mailboxes;
	ARRAY(struct frompacks_mailbox *) mailbox_list;

	struct casbox_lsm *old_lsm;
	struct casbox_lsm_batch *old_batch;
	struct casbox_pack_txn *pack_txn;

	unsigned int meta_frames, meta_unreadable, damaged_frames;
	unsigned int messages, lost_messages, blob_count, orphans;
	/* records the intact index had expunged, released again */
	unsigned int expunged;
	const char *moved_to;
};

static unsigned int frompacks_blob_id_hash(const struct cas_blob_id *id)
{
	return id->id[0] | (id->id[1] << 8) | (id->id[2] << 16) |
		((unsigned int)id->id[3] << 24);
}

static int frompacks_blob_id_cmp(const struct cas_blob_id *id1,
				 const struct cas_blob_id *id2)
{
	return memcmp(id1->id, id2->id, sizeof(id1->id));
}

static struct frompacks_blob *
frompacks_blob_get(struct frompacks *fp, const struct cas_blob_id *id)
{
	struct frompacks_blob *blob;

	blob = hash_table_lookup(fp->blobs, id);
	if (blob != NULL)
		return blob;
	blob = p_new(fp->pool, struct frompacks_blob, 1);
	blob->id = *id;
	p_array_init(&blob->frames, fp->pool, 1);
	p_array_init(&blob->deks, fp->pool, 1);
	hash_table_insert(fp->blobs, &blob->id, blob);
	array_push_back(&fp->blob_list, &blob);
	return blob;
}

static void frompacks_add_dek(struct frompacks *fp,
			      const struct cas_blob_id *id,
			      const unsigned char *wrapped)
{
	struct frompacks_blob *blob = frompacks_blob_get(fp, id);
	const struct frompacks_dek *dek;
	struct frompacks_dek *new_dek;

	array_foreach(&blob->deks, dek) {
		if (memcmp(dek->wrapped, wrapped, CAS_WRAPPED_DEK_SIZE) == 0)
			return;
	}
	new_dek = array_append_space(&blob->deks);
	memcpy(new_dek->wrapped, wrapped, CAS_WRAPPED_DEK_SIZE);
}

static void frompacks_add_recovery(struct frompacks *fp,
				   const buffer_t *plain,
				   const struct casbox_pack_frame_info *info)
{
	struct casbox_recovery_record rec;
	const struct casbox_recovery_blob *rblob;
	struct frompacks_msg *msg;
	const char *key, *error;
	pool_t pool = pool_datastack_create();

	if (casbox_recovery_record_import(plain->data, plain->used, pool,
					  &rec, &error) < 0) {
		i_warning("casbox rebuild --from-packs: pack %u offset %"
			  PRIu64": %s", info->pack_id, info->offset, error);
		fp->meta_unreadable++;
		return;
	}
	/* DEKs count even if a newer record of this UID replaces it */
	array_foreach(&rec.blobs, rblob)
		frompacks_add_dek(fp, &rblob->id, rblob->wrapped_dek);

	key = t_strdup_printf("%s:%u", binary_to_hex(rec.mailbox_guid,
				GUID_128_SIZE), rec.uid);
	msg = hash_table_lookup(fp->msgs, key);
	if (msg != NULL && msg->rec.written_usecs > rec.written_usecs)
		return;
	if (msg == NULL) {
		msg = p_new(fp->pool, struct frompacks_msg, 1);
		hash_table_insert(fp->msgs, p_strdup(fp->pool, key), msg);
		array_push_back(&fp->msg_list, &msg);
	}
	/* again, from the long-lived pool */
	if (casbox_recovery_record_import(plain->data, plain->used, fp->pool,
					  &msg->rec, &error) < 0)
		i_unreached();
	guid_128_copy(msg->mailbox_guid, msg->rec.mailbox_guid);
	msg->uid = msg->rec.uid;
}

static void frompacks_add_dek_update(struct frompacks *fp,
				     const buffer_t *plain,
				     const struct casbox_pack_frame_info *info)
{
	struct casbox_dek_update upd;
	const char *error;

	if (casbox_dek_update_import(plain->data, plain->used, &upd,
				     &error) < 0) {
		i_warning("casbox rebuild --from-packs: pack %u offset %"
			  PRIu64": %s", info->pack_id, info->offset, error);
		fp->meta_unreadable++;
		return;
	}
	frompacks_add_dek(fp, &upd.id, upd.wrapped_dek);
}

static void frompacks_meta(struct frompacks *fp,
			   const struct casbox_pack_frame_info *info)
{
	struct casbox_pack_store *packs = fp->adm->packs;
	enum casbox_meta_kind kind;
	buffer_t *sealed, *plain;
	const char *error;

	fp->meta_frames++;
	sealed = t_buffer_create(512);
	plain = t_buffer_create(512);
	if (casbox_pack_meta_read(packs, info->pack_id, info->offset, &kind,
				  sealed, &error) < 0 ||
	    casbox_pack_meta_open(packs, kind, sealed->data, sealed->used,
				  plain, &error) < 0) {
		i_warning("casbox rebuild --from-packs: pack %u offset %"
			  PRIu64": %s", info->pack_id, info->offset, error);
		fp->meta_unreadable++;
		return;
	}
	if (kind == CASBOX_META_KIND_RECOVERY)
		frompacks_add_recovery(fp, plain, info);
	else
		frompacks_add_dek_update(fp, plain, info);
	safe_memset(buffer_get_modifiable_data(plain, NULL), 0, plain->used);
}

static void frompacks_frame(struct frompacks *fp,
			    const struct casbox_pack_frame_info *info)
{
	struct frompacks_blob *blob;
	struct frompacks_frame *frame;

	if (info->damage != NULL) {
		i_warning("casbox rebuild --from-packs: pack %u offset %"
			  PRIu64": damaged frame (%u bytes): %s",
			  info->pack_id, info->offset, info->frame_size,
			  info->damage);
		fp->damaged_frames++;
		return;
	}
	if (info->meta_kind != CASBOX_META_KIND_NONE) {
		frompacks_meta(fp, info);
		return;
	}
	blob = frompacks_blob_get(fp, &info->id);
	frame = array_append_space(&blob->frames);
	frame->pack_id = info->pack_id;
	frame->offset = info->offset;
	frame->frame_size = info->frame_size;
	frame->plain_size = info->plain_size;
	frame->dict_id = info->dict_id;
}

static int frompacks_scan(struct frompacks *fp, const char **error_r)
{
	struct casbox_pack_frame_info info;
	struct casbox_pack_scan *scan;
	const char *error;

	scan = casbox_pack_scan_init(fp->adm->packs);
	while (casbox_pack_scan_next(scan, &info)) T_BEGIN {
		frompacks_frame(fp, &info);
	} T_END;
	if (casbox_pack_scan_deinit(&scan, &error) < 0) {
		*error_r = t_strdup_printf("pack scan: %s", error);
		return -1;
	}
	return 0;
}

/* TRUE if the blob opens with rec: the DEK unwraps and the first
   chunk's tag verifies. */
static bool frompacks_blob_opens(struct frompacks *fp,
				 const struct cas_blob_id *id,
				 const struct casbox_blob_record *rec)
{
	unsigned char dek[CAS_DEK_SIZE];
	struct istream *input;
	const char *error;
	bool ok;
	int ret;

	if (cas_dek_unwrap(fp->adm->keyring, id, rec->wrapped_dek, dek,
			   &error) < 0)
		return FALSE;
	safe_memset(dek, 0, sizeof(dek));
	input = casbox_pack_blob_open(fp->adm->packs, id, rec);
	ret = i_stream_read(input);
	ok = input->stream_errno == 0 && (ret > 0 || ret == -1);
	i_stream_unref(&input);
	return ok;
}

/* Newest frame first (gc copies are newer than the frames they
   replaced); each with every candidate DEK. */
static int frompacks_blob_resolve(struct frompacks *fp,
				  struct frompacks_blob *blob)
{
	const struct frompacks_frame *frames;
	const struct frompacks_dek *dek;
	struct casbox_blob_record rec;
	unsigned int i, count;

	if (blob->resolved != 0)
		return blob->resolved;
	blob->resolved = -1;
	frames = array_get(&blob->frames, &count);
	for (i = count; i > 0 && blob->resolved < 0; i--) {
		i_zero(&rec);
		rec.pack_id = frames[i-1].pack_id;
		rec.offset = frames[i-1].offset;
		rec.frame_size = frames[i-1].frame_size;
		rec.plain_size = frames[i-1].plain_size;
		rec.dict_id = frames[i-1].dict_id;
		array_foreach(&blob->deks, dek) {
			memcpy(rec.wrapped_dek, dek->wrapped,
			       CAS_WRAPPED_DEK_SIZE);
			if (frompacks_blob_opens(fp, &blob->id, &rec)) {
				blob->rec = rec;
				blob->resolved = 1;
				break;
			}
		}
	}
	return blob->resolved;
}

/* Returns NULL if every part resolves, else why not. */
static const char *
frompacks_msg_resolve(struct frompacks *fp, struct frompacks_msg *msg)
{
	const struct casbox_msg_part *part;
	struct frompacks_blob *blob;
	int ret;

	array_foreach(&msg->rec.msg.parts, part) {
		blob = hash_table_lookup(fp->blobs, &part->id);
		if (blob == NULL || array_count(&blob->frames) == 0) {
			return t_strdup_printf("blob %s: no intact frame",
					       cas_blob_id_to_hex(&part->id));
		}
		T_BEGIN {
			ret = frompacks_blob_resolve(fp, blob);
		} T_END;
		if (ret < 0) {
			return t_strdup_printf("blob %s: no DEK opens it",
					       cas_blob_id_to_hex(&part->id));
		}
		if (blob->rec.plain_size != part->size) {
			return t_strdup_printf("blob %s: %"PRIu64" bytes, the "
				"record says %"PRIuUOFF_T,
				cas_blob_id_to_hex(&part->id),
				blob->rec.plain_size, part->size);
		}
	}
	return NULL;
}

static struct frompacks_mailbox *
frompacks_mailbox_get(struct frompacks *fp, const guid_128_t guid)
{
	const char *hex = binary_to_hex(guid, GUID_128_SIZE);
	struct frompacks_mailbox *mbox;

	mbox = hash_table_lookup(fp->mailboxes, hex);
	if (mbox != NULL)
		return mbox;
	mbox = p_new(fp->pool, struct frompacks_mailbox, 1);
	guid_128_copy(mbox->guid, guid);
	hash_table_insert(fp->mailboxes, p_strdup(fp->pool, hex), mbox);
	array_push_back(&fp->mailbox_list, &mbox);
	return mbox;
}

static void frompacks_mailbox_add(struct frompacks *fp,
				  const struct frompacks_msg *msg)
{
	const struct casbox_recovery_record *rec = &msg->rec;
	struct frompacks_mailbox *mbox;

	mbox = frompacks_mailbox_get(fp, rec->mailbox_guid);
	if (!msg->lost)
		mbox->messages++;
	if (rec->written_usecs >= mbox->newest_written) {
		/* name, UIDVALIDITY and public GUID as last saved */
		mbox->newest_written = rec->written_usecs;
		mbox->rec.name = rec->mailbox_name;
		mbox->rec.uid_validity = rec->uid_validity;
		guid_128_copy(mbox->rec.guid, rec->public_guid);
	}
	mbox->rec.next_uid = I_MAX(mbox->rec.next_uid,
				   I_MAX(rec->next_uid, rec->uid + 1));
	mbox->rec.highest_modseq = I_MAX(mbox->rec.highest_modseq,
		I_MAX(rec->highest_modseq, rec->msg.modseq));
}

/* Two storage ids under one name (a mailbox deleted and created again,
   its old records not yet dropped by gc): the newest keeps the name,
   the others come back under "<name> (recovered <guid>)" rather than
   being merged into it or left out. */
static void frompacks_mailbox_names(struct frompacks *fp)
{
	struct frompacks_mailbox *mbox, *other;
	unsigned int i, j, count;
	struct frompacks_mailbox *const *boxes;

	boxes = array_get(&fp->mailbox_list, &count);
	for (i = 0; i < count; i++) {
		mbox = boxes[i];
		for (j = 0; j < count; j++) {
			other = boxes[j];
			if (i == j || strcmp(mbox->rec.name,
					     other->rec.name) != 0 ||
			    other->newest_written < mbox->newest_written ||
			    (other->newest_written == mbox->newest_written &&
			     j > i))
				continue;
			mbox->rec.name = p_strdup_printf(fp->pool,
				"%s (recovered %s)", mbox->rec.name,
				t_strndup(guid_128_to_string(mbox->guid), 8));
			break;
		}
	}
}

static void frompacks_resolve(struct frompacks *fp)
{
	struct frompacks_msg *msg;
	struct frompacks_blob *blob;
	const struct casbox_msg_part *part;
	struct frompacks_mailbox *mbox;
	uint64_t now_usecs = casbox_meta_now_usecs();
	const char *why;

	array_foreach_elem(&fp->msg_list, msg) T_BEGIN {
		why = frompacks_msg_resolve(fp, msg);
		if (why != NULL) {
			msg->lost = TRUE;
			fp->lost_messages++;
			i_warning("casbox rebuild --from-packs: mailbox %s "
				  "uid %u (GUID %s) lost: %s",
				  msg->rec.mailbox_name, msg->uid,
				  msg->rec.msg.guid, why);
		} else {
			fp->messages++;
			array_foreach(&msg->rec.msg.parts, part) {
				blob = hash_table_lookup(fp->blobs, &part->id);
				blob->refcount++;
			}
		}
		/* a mailbox whose messages are all lost still comes
		   back, empty, with its UIDs reserved */
		frompacks_mailbox_add(fp, msg);
	} T_END;
	array_foreach_elem(&fp->mailbox_list, mbox) {
		/* the mailbox's modseqs after the last save are unknown:
		   above any a client can have seen (a change is +1, the
		   clock gains a million a second) */
		mbox->rec.highest_modseq = I_MAX(mbox->rec.highest_modseq,
						 now_usecs);
	}
	frompacks_mailbox_names(fp);
	array_foreach_elem(&fp->blob_list, blob) {
		if (blob->refcount > 0)
			fp->blob_count++;
		else if (array_count(&blob->frames) > 0)
			fp->orphans++;
	}
}

static void frompacks_put(struct casbox_lsm_batch *batch, const buffer_t *key,
			  const buffer_t *value)
{
	casbox_lsm_batch_put(batch, key->data, key->used,
			     value->data, value->used);
}

struct frompacks_writer {
	struct casbox_lsm *lsm;
	struct casbox_lsm_batch *batch;
	unsigned int count;
	const char *error;
};

static int frompacks_writer_next(struct frompacks_writer *w)
{
	if (w->error != NULL)
		return -1;
	if (w->batch != NULL && ++w->count < FROMPACKS_BATCH_RECORDS)
		return 0;
	if (w->batch != NULL &&
	    casbox_lsm_batch_commit(&w->batch, &w->error) < 0) {
		w->error = t_strdup(w->error);
		return -1;
	}
	w->count = 0;
	if (casbox_lsm_batch_begin(w->lsm, &w->batch, &w->error) < 0) {
		w->error = t_strdup(w->error);
		return -1;
	}
	return 0;
}

static void frompacks_write_records(struct frompacks *fp,
				    struct frompacks_writer *w)
{
	struct frompacks_mailbox *mbox;
	struct frompacks_msg *msg;
	struct frompacks_blob *blob;
	struct casbox_blob_value bval;
	buffer_t *key, *value, *prec;

	key = t_buffer_create(64);
	value = t_buffer_create(512);
	prec = t_buffer_create(CASBOX_BLOB_RECORD_EXPORT_SIZE);
	buffer_append_c(key, CASBOX_KEY_KEYRING);
	buffer_append_c(value, CASBOX_RECORD_VERSION);
	buffer_append_c(value, cas_keyring_key_id(fp->adm->keyring) >> 24);
	buffer_append_c(value, cas_keyring_key_id(fp->adm->keyring) >> 16);
	buffer_append_c(value, cas_keyring_key_id(fp->adm->keyring) >> 8);
	buffer_append_c(value, cas_keyring_key_id(fp->adm->keyring));
	if (frompacks_writer_next(w) < 0)
		return;
	frompacks_put(w->batch, key, value);

	array_foreach_elem(&fp->mailbox_list, mbox) {
		buffer_set_used_size(key, 0);
		buffer_set_used_size(value, 0);
		casbox_key_mailbox(key, mbox->guid);
		casbox_mailbox_record_export(&mbox->rec, value);
		if (frompacks_writer_next(w) < 0)
			return;
		frompacks_put(w->batch, key, value);
	}
	array_foreach_elem(&fp->msg_list, msg) {
		if (msg->lost)
			continue;
		buffer_set_used_size(key, 0);
		buffer_set_used_size(value, 0);
		casbox_key_message(key, msg->mailbox_guid, msg->uid);
		casbox_msg_record_export(&msg->rec.msg, value);
		if (frompacks_writer_next(w) < 0)
			return;
		frompacks_put(w->batch, key, value);
	}
	array_foreach_elem(&fp->blob_list, blob) {
		if (blob->refcount == 0)
			continue;
		buffer_set_used_size(key, 0);
		buffer_set_used_size(value, 0);
		buffer_set_used_size(prec, 0);
		casbox_key_blob(key, &blob->id);
		casbox_blob_record_export(&blob->rec, prec);
		i_zero(&bval);
		bval.refcount = blob->refcount;
		bval.pack_record = prec->data;
		bval.pack_record_size = prec->used;
		casbox_blob_value_export(&bval, value);
		if (frompacks_writer_next(w) < 0)
			return;
		frompacks_put(w->batch, key, value);
	}
}

static int fsync_path(const char *path, const char **error_r)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd == -1 || fsync(fd) < 0) {
		*error_r = t_strdup_printf("fsync(%s) failed: %m", path);
		if (fd != -1)
			i_close_fd(&fd);
		return -1;
	}
	i_close_fd(&fd);
	return 0;
}

/* Write the new LSM at new_dir. Returns 0 ok, -1 error. */
static int frompacks_write_lsm(struct frompacks *fp, const char *new_dir,
			       const char **error_r)
{
	struct casbox_lsm_settings set;
	struct frompacks_writer w;
	int ret = 0;

	i_zero(&set);
	set.dir = new_dir;
	set.fsync = fp->adm->fsync_mode != FSYNC_MODE_NEVER;
	set.lock_method = fp->adm->lock_method;
	i_zero(&w);
	if (casbox_lsm_open(&set, &w.lsm, error_r) < 0)
		return -1;
	frompacks_write_records(fp, &w);
	if (w.error == NULL && w.batch != NULL &&
	    casbox_lsm_batch_commit(&w.batch, &w.error) < 0)
		w.error = t_strdup(w.error);
	if (w.batch != NULL)
		casbox_lsm_batch_rollback(&w.batch);
	if (w.error == NULL && casbox_lsm_compact(w.lsm, &w.error) < 0)
		w.error = t_strdup(w.error);
	casbox_lsm_close(&w.lsm);
	if (w.error != NULL) {
		*error_r = t_strdup_printf("writing %s: %s", new_dir,
					   w.error);
		ret = -1;
	}
	return ret;
}

/* Old LSM aside (renamed, never deleted), new one in its place. */
static int frompacks_swap(struct frompacks *fp, const char *new_dir,
			  const char *stamp, const char **error_r)
{
	const char *root = fp->adm->root_dir;
	const char *lsm_dir = t_strconcat(root, "/lsm", NULL);
	const char *broken = t_strdup_printf("%s/lsm.broken-%s", root, stamp);
	struct stat st;

	if (lstat(lsm_dir, &st) == 0) {
		if (rename(lsm_dir, broken) < 0) {
			*error_r = t_strdup_printf("rename(%s, %s) failed: %m",
						   lsm_dir, broken);
			return -1;
		}
		fp->moved_to = p_strdup(fp->pool, broken);
	} else if (errno != ENOENT) {
		*error_r = t_strdup_printf("lstat(%s) failed: %m", lsm_dir);
		return -1;
	}
	if (rename(new_dir, lsm_dir) < 0) {
		*error_r = t_strdup_printf("rename(%s, %s) failed: %m",
					   new_dir, lsm_dir);
		return -1;
	}
	if (fp->adm->fsync_mode != FSYNC_MODE_NEVER)
		return fsync_path(root, error_r);
	return 0;
}

/* Serialise with saves and gc: the pack append lock (no frame can be
   added while we scan) and, if the old LSM still opens, its write
   lock. Returns 0 ok, -1 error. */
static int frompacks_lock(struct frompacks *fp, const char **error_r)
{
	struct casbox_lsm_settings set;
	const char *lsm_dir = t_strconcat(fp->adm->root_dir, "/lsm", NULL);
	const char *error;
	struct stat st;

	if (casbox_pack_txn_begin(fp->adm->packs, &fp->pack_txn,
				  &error) < 0) {
		*error_r = t_strdup_printf("pack lock: %s", error);
		return -1;
	}
	if (stat(lsm_dir, &st) < 0)
		return 0;
	i_zero(&set);
	set.dir = lsm_dir;
	set.fsync = fp->adm->fsync_mode != FSYNC_MODE_NEVER;
	set.lock_method = fp->adm->lock_method;
	if (casbox_lsm_open(&set, &fp->old_lsm, &error) < 0 ||
	    casbox_lsm_batch_begin(fp->old_lsm, &fp->old_batch,
				   &error) < 0) {
		/* damaged: nothing can write through it either */
		i_warning("casbox rebuild --from-packs: old LSM %s: %s "
			  "(moving it aside anyway)", lsm_dir, error);
		if (fp->old_lsm != NULL)
			casbox_lsm_close(&fp->old_lsm);
	}
	return 0;
}

static void frompacks_unlock(struct frompacks *fp)
{
	if (fp->old_batch != NULL)
		casbox_lsm_batch_rollback(&fp->old_batch);
	if (fp->old_lsm != NULL)
		casbox_lsm_close(&fp->old_lsm);
	if (fp->pack_txn != NULL)
		casbox_pack_txn_rollback(&fp->pack_txn);
}

static int frompacks_rebuild_lsm(struct frompacks *fp, const char **error_r)
{
	const char *stamp, *new_dir;
	int ret;

	if (frompacks_scan(fp, error_r) < 0)
		return -1;
	if (fp->meta_frames == 0) {
		*error_r = "the packs hold no recovery records (packs written "
			"before pack format version 2): nothing to rebuild "
			"the LSM from; the old LSM is left in place";
		return -1;
	}
	if (array_count(&fp->msg_list) == 0 &&
	    fp->meta_unreadable == fp->meta_frames) {
		*error_r = t_strdup_printf("no recovery record opens with "
			"key file %s: not this store's key? The old LSM is "
			"left in place", fp->adm->set.key_file);
		return -1;
	}
	frompacks_resolve(fp);
	stamp = t_strdup_printf("%ld.%ld", (long)ioloop_time,
				(long)getpid());
	new_dir = t_strdup_printf("%s/lsm.rebuild-%s", fp->adm->root_dir,
				  stamp);
	ret = frompacks_write_lsm(fp, new_dir, error_r);
	if (ret == 0)
		ret = frompacks_swap(fp, new_dir, stamp, error_r);
	return ret;
}

/* The user's casbox storage must open the new LSM, not a handle on the
   old one from before the swap. */
static void frompacks_reset_storage(struct mail_user *user)
{
	struct mail_namespace *ns;
	struct casbox_storage *storage;

	for (ns = user->namespaces; ns != NULL; ns = ns->next) {
		if (ns->storage == NULL ||
		    strcmp(ns->storage->name, CASBOX_STORAGE_NAME) != 0)
			continue;
		storage = CASBOX_STORAGE(ns->storage);
		if (storage->store != NULL)
			casbox_store_close(&storage->store);
	}
}

/* An intact index left out records of mail it had expunged (the
   packs keep recovery records until gc): release them, so they do not
   hold their blobs and records for ever. Returns 0 ok, -1 error. */
static int frompacks_release_expunged(struct frompacks *fp,
				      struct mailbox *box,
				      const struct frompacks_mailbox *fmbox,
				      const char **error_r)
{
	struct casbox_mailbox *mbox = CASBOX_MAILBOX(box);
	const struct mail_index_header *hdr;
	struct frompacks_msg *msg;
	struct casbox_store *store;
	struct casbox_store_txn *txn;
	unsigned int count = 0;
	uint32_t seq;
	int ret = 0;

	if (!guid_128_equals(mbox->mailbox_guid, fmbox->guid))
		return 0;
	if (casbox_storage_get_store(mbox->storage, &store) < 0) {
		*error_r = mail_storage_get_last_internal_error(
			&mbox->storage->storage, NULL);
		return -1;
	}
	if (casbox_store_txn_begin(store, &txn, error_r) < 0)
		return -1;
	hdr = mail_index_get_header(box->view);
	array_foreach_elem(&fp->msg_list, msg) {
		if (msg->lost || msg->uid >= hdr->next_uid ||
		    !guid_128_equals(msg->mailbox_guid, fmbox->guid) ||
		    mail_index_lookup_seq(box->view, msg->uid, &seq))
			continue;
		if (casbox_store_txn_expunge(txn, fmbox->guid, msg->uid,
					     error_r) < 0) {
			ret = -1;
			break;
		}
		count++;
	}
	if (ret < 0 || count == 0) {
		casbox_store_txn_rollback(&txn);
		return ret;
	}
	if (casbox_store_txn_commit(&txn, error_r) < 0)
		return -1;
	fp->expunged += count;
	return 0;
}

static int frompacks_resync_one(struct frompacks *fp, struct mail_user *user,
				const char *vname,
				const struct frompacks_mailbox *fmbox)
{
	struct mail_namespace *ns;
	struct mailbox *box;
	const char *error;
	int ret;

	ns = mail_namespace_find(user->namespaces, vname);
	if (ns == NULL) {
		i_error("casbox rebuild --from-packs: mailbox %s: "
			"no namespace", vname);
		return -1;
	}
	T_BEGIN {
		ret = casbox_rebuild_mailbox(ns->list, vname, &error);
		if (ret < 0) {
			i_error("casbox rebuild --from-packs: mailbox %s: "
				"index rebuild failed: %s", vname, error);
		}
	} T_END;
	if (ret < 0 || fmbox == NULL)
		return ret < 0 ? -1 : 0;

	box = mailbox_alloc(ns->list, vname, MAILBOX_FLAG_IGNORE_ACLS);
	if (mailbox_open(box) < 0 || mailbox_sync(box, 0) < 0) {
		error = mailbox_get_last_internal_error(box, NULL);
		ret = -1;
	} else {
		ret = frompacks_release_expunged(fp, box, fmbox, &error);
	}
	if (ret < 0) {
		i_error("casbox rebuild --from-packs: mailbox %s: "
			"releasing expunged records: %s", vname, error);
	}
	mailbox_free(&box);
	return ret;
}

/* Dovecot's index of every recovered mailbox from the new LSM. */
static int frompacks_resync(struct frompacks *fp, struct mail_user *user)
{
	struct frompacks_mailbox *mbox, *inbox = NULL;
	int ret = 0;

	frompacks_reset_storage(user);
	array_foreach_elem(&fp->mailbox_list, mbox) {
		if (strcmp(mbox->rec.name, "INBOX") == 0)
			inbox = mbox;
	}
	/* INBOX first: its forced resync recreates the directories of
	   the mailboxes the M records name */
	if (frompacks_resync_one(fp, user, "INBOX", inbox) < 0)
		ret = -1;
	array_foreach_elem(&fp->mailbox_list, mbox) {
		if (mbox != inbox &&
		    frompacks_resync_one(fp, user, mbox->rec.name, mbox) < 0)
			ret = -1;
	}
	return ret;
}

void casbox_frompacks_init_header(void)
{
	static const char *const fields[] = {
		"mailboxes", "messages", "blobs", "orphans",
		"damaged_frames", "lost_messages", "unreadable_records",
		"expunged",
	};
	unsigned int i;

	for (i = 0; i < N_ELEMENTS(fields); i++) {
		doveadm_print_header(fields[i], fields[i],
				     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	}
	doveadm_print_header_simple("old_lsm");
}

static void frompacks_print(struct frompacks *fp)
{
	doveadm_print_num(array_count(&fp->mailbox_list));
	doveadm_print_num(fp->messages);
	doveadm_print_num(fp->blob_count);
	doveadm_print_num(fp->orphans);
	doveadm_print_num(fp->damaged_frames);
	doveadm_print_num(fp->lost_messages);
	doveadm_print_num(fp->meta_unreadable);
	doveadm_print_num(fp->expunged);
	doveadm_print(fp->moved_to != NULL ? fp->moved_to : "-");
}

static void frompacks_free(struct frompacks *fp)
{
	hash_table_destroy(&fp->blobs);
	hash_table_destroy(&fp->msgs);
	hash_table_destroy(&fp->mailboxes);
	pool_unref(&fp->pool);
}

int casbox_frompacks_run(struct doveadm_mail_cmd_context *ctx,
			 struct mail_user *user)
{
	struct frompacks fp;
	const char *error;
	int ret;

	i_zero(&fp);
	ret = casbox_admin_open_nolsm(user, &fp.adm, &error);
	if (ret <= 0) {
		i_error("casbox rebuild --from-packs: %s", error);
		doveadm_mail_failed_error(ctx, ret == 0 ?
			MAIL_ERROR_NOTFOUND : MAIL_ERROR_TEMP);
		return -1;
	}
	fp.pool = pool_alloconly_create("casbox rebuild from packs", 65536);
	hash_table_create(&fp.blobs, fp.pool, 0, frompacks_blob_id_hash,
			  frompacks_blob_id_cmp);
	hash_table_create(&fp.msgs, fp.pool, 0, str_hash, strcmp);
	hash_table_create(&fp.mailboxes, fp.pool, 0, str_hash, strcmp);
	p_array_init(&fp.blob_list, fp.pool, 256);
	p_array_init(&fp.msg_list, fp.pool, 256);
	p_array_init(&fp.mailbox_list, fp.pool, 8);

	ret = casbox_admin_open_keys(fp.adm, &error) < 0 ? -1 : 0;
	if (ret == 0)
		ret = frompacks_lock(&fp, &error);
	if (ret == 0)
		ret = frompacks_rebuild_lsm(&fp, &error);
	frompacks_unlock(&fp);
	if (ret < 0) {
		i_error("casbox rebuild --from-packs: %s: %s",
			fp.adm->root_dir, error);
		doveadm_mail_failed_error(ctx, MAIL_ERROR_TEMP);
	} else {
		if (frompacks_resync(&fp, user) < 0) {
			doveadm_mail_failed_error(ctx, MAIL_ERROR_TEMP);
			ret = -1;
		}
		frompacks_print(&fp);
		if (fp.lost_messages > 0 || fp.damaged_frames > 0) {
			i_warning("casbox rebuild --from-packs: %s: %u "
				  "message(s) lost, %u damaged frame(s)",
				  fp.adm->root_dir, fp.lost_messages,
				  fp.damaged_frames);
		}
	}
	frompacks_free(&fp);
	casbox_admin_close(&fp.adm);
	return ret;
}
