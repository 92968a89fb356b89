/* casbox-store-frompacks: doveadm casbox rebuild --from-packs: rebuild
   a lost or damaged LSM from the packs alone (doc/doveadm.md, "rebuild --from-packs").

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
   5. (doveadm-casbox-frompacks-cmd.c) Force-resync every mailbox (INBOX
      first: it restores the mailbox directories from the M records), so
      Dovecot's index agrees. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "hash.h"
#include "hex-binary.h"
#include "istream.h"
#include "ioloop.h"
#include "safe-memset.h"
#include "cas-durable.h"
#include "casbox-lsm.h"
#include "casbox-pack.h"
#include "casbox-settings.h"
#include "casbox-store-census.h"
#include "casbox-store-progress.h"
#include "casbox-store-frompacks.h"
#include "casbox-record-auth.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/stat.h>

/* LSM puts per batch while writing the new LSM */
#define FROMPACKS_BATCH_RECORDS 1000

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

static struct casbox_frompacks_blob *
frompacks_blob_get(struct casbox_frompacks *fp, const struct cas_blob_id *id)
{
	struct casbox_frompacks_blob *blob;

	blob = hash_table_lookup(fp->blobs, id);
	if (blob != NULL)
		return blob;
	blob = p_new(fp->pool, struct casbox_frompacks_blob, 1);
	blob->id = *id;
	p_array_init(&blob->frames, fp->pool, 1);
	p_array_init(&blob->deks, fp->pool, 1);
	hash_table_insert(fp->blobs, &blob->id, blob);
	array_push_back(&fp->blob_list, &blob);
	return blob;
}

/* A meta frame that does not open or decode: warned about and counted
   (column unreadable_records). */
static void frompacks_unreadable(struct casbox_frompacks *fp,
				 const struct casbox_pack_frame_info *info,
				 const char *error)
{
	i_warning("casbox rebuild --from-packs: pack %u offset %"PRIu64": %s",
		  info->pack_id, info->offset, error);
	fp->meta_unreadable++;
}

static void frompacks_add_dek(struct casbox_frompacks *fp,
			      const struct cas_blob_id *id, uint8_t kind,
			      const unsigned char *stored)
{
	struct casbox_frompacks_blob *blob = frompacks_blob_get(fp, id);
	const struct casbox_frompacks_dek *dek;
	struct casbox_frompacks_dek *new_dek;
	size_t size = cas_dek_kind_size(kind);

	i_assert(size > 0);
	array_foreach(&blob->deks, dek) {
		if (dek->kind == kind &&
		    memcmp(dek->stored, stored, size) == 0)
			return;
	}
	new_dek = array_append_space(&blob->deks);
	new_dek->kind = kind;
	memcpy(new_dek->stored, stored, size);
}

/* The candidate DEK and plain size of every blob a recovery record or
   blob keys record lists. */
static void
frompacks_add_blob_entries(struct casbox_frompacks *fp,
			   const ARRAY_TYPE(casbox_recovery_blob) *blobs)
{
	const struct casbox_recovery_blob *rblob;

	array_foreach(blobs, rblob) {
		frompacks_add_dek(fp, &rblob->id, rblob->dek_kind,
				  rblob->stored_dek);
		frompacks_blob_get(fp, &rblob->id)->size_hint =
			rblob->plain_size;
	}
}

/* The message of mailbox and UID to fill from a record written at
   written_usecs, or NULL if a newer record already filled it. */
static struct casbox_frompacks_msg *
frompacks_msg_slot(struct casbox_frompacks *fp, const guid_128_t mailbox_guid,
		   uint32_t uid, uint64_t written_usecs)
{
	struct casbox_frompacks_msg *msg;
	const char *key;

	key = t_strdup_printf("%s:%u", binary_to_hex(mailbox_guid,
				GUID_128_SIZE), uid);
	msg = hash_table_lookup(fp->msgs, key);
	if (msg != NULL && msg->rec.written_usecs > written_usecs)
		return NULL;
	if (msg == NULL) {
		msg = p_new(fp->pool, struct casbox_frompacks_msg, 1);
		hash_table_insert(fp->msgs, p_strdup(fp->pool, key), msg);
		array_push_back(&fp->msg_list, &msg);
	}
	return msg;
}

static void frompacks_add_recovery(struct casbox_frompacks *fp,
				   const buffer_t *plain,
				   const struct casbox_pack_frame_info *info)
{
	struct casbox_recovery_record rec;
	struct casbox_frompacks_msg *msg;
	const char *error;
	pool_t pool = pool_datastack_create();

	if (casbox_recovery_record_import(plain->data, plain->used, pool,
					  &rec, &error) < 0) {
		frompacks_unreadable(fp, info, error);
		return;
	}
	/* DEKs count even if a newer record of this UID replaces it */
	frompacks_add_blob_entries(fp, &rec.blobs);

	msg = frompacks_msg_slot(fp, rec.mailbox_guid, rec.uid,
				 rec.written_usecs);
	if (msg == NULL)
		return;
	/* again, from the long-lived pool */
	if (casbox_recovery_record_import(plain->data, plain->used, fp->pool,
					  &msg->rec, &error) < 0)
		i_unreached();
	guid_128_copy(msg->mailbox_guid, msg->rec.mailbox_guid);
	msg->uid = msg->rec.uid;
	/* the new LSM has no shared metadata records (recovery records are
	   written without a reference; this keeps a stray one out) */
	msg->rec.msg.meta_ref = FALSE;
}

/* A copy record: each entry is a message like a recovery record's,
   whose blobs' DEKs come from other records (the source's recovery
   record, blob keys, DEK updates). */
static void frompacks_add_copy(struct casbox_frompacks *fp,
			       const buffer_t *plain,
			       const struct casbox_pack_frame_info *info)
{
	struct casbox_copy_record rec;
	const struct casbox_copy_entry *entry;
	struct casbox_frompacks_msg *msg;
	const char *error;

	/* the long-lived pool: the entries kept are used as they are */
	if (casbox_copy_record_import(plain->data, plain->used, fp->pool,
				      &rec, &error) < 0) {
		frompacks_unreadable(fp, info, error);
		return;
	}
	array_foreach(&rec.entries, entry) {
		msg = frompacks_msg_slot(fp, rec.mailbox_guid, entry->uid,
					 rec.written_usecs);
		if (msg == NULL)
			continue;
		casbox_copy_record_entry(&rec, entry, fp->pool, &msg->rec);
		guid_128_copy(msg->mailbox_guid, rec.mailbox_guid);
		msg->uid = entry->uid;
		msg->rec.msg.meta_ref = FALSE;
	}
}

/* Blob keys: DEKs and plain sizes of blobs whose message record gc
   dropped. */
static void frompacks_add_blob_keys(struct casbox_frompacks *fp,
				    const buffer_t *plain,
				    const struct casbox_pack_frame_info *info)
{
	struct casbox_blob_keys rec;
	const char *error;

	if (casbox_blob_keys_import(plain->data, plain->used,
				    pool_datastack_create(), &rec,
				    &error) < 0) {
		frompacks_unreadable(fp, info, error);
		return;
	}
	frompacks_add_blob_entries(fp, &rec.blobs);
}

static void frompacks_add_dek_update(struct casbox_frompacks *fp,
				     const buffer_t *plain,
				     const struct casbox_pack_frame_info *info)
{
	struct casbox_dek_update upd;
	const char *error;

	if (casbox_dek_update_import(plain->data, plain->used, &upd,
				     &error) < 0) {
		frompacks_unreadable(fp, info, error);
		return;
	}
	frompacks_add_dek(fp, &upd.id, upd.dek_kind, upd.stored_dek);
}

static void frompacks_add_mailbox(struct casbox_frompacks *fp,
				  const buffer_t *plain,
				  const struct casbox_pack_frame_info *info);

static void frompacks_meta(struct casbox_frompacks *fp,
			   const struct casbox_pack_frame_info *info)
{
	struct casbox_pack_store *packs = casbox_store_get_packs(fp->store);
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
		frompacks_unreadable(fp, info, error);
		return;
	}
	if (kind == CASBOX_META_KIND_RECOVERY)
		frompacks_add_recovery(fp, plain, info);
	else if (kind == CASBOX_META_KIND_MAILBOX)
		frompacks_add_mailbox(fp, plain, info);
	else if (kind == CASBOX_META_KIND_COPY)
		frompacks_add_copy(fp, plain, info);
	else if (kind == CASBOX_META_KIND_BLOB_KEYS)
		frompacks_add_blob_keys(fp, plain, info);
	else
		frompacks_add_dek_update(fp, plain, info);
	safe_memset(buffer_get_modifiable_data(plain, NULL), 0, plain->used);
}

static void frompacks_frame(struct casbox_frompacks *fp,
			    const struct casbox_pack_frame_info *info)
{
	struct casbox_frompacks_blob *blob;
	struct casbox_frompacks_frame *frame;

	if (info->damage != NULL && info->unfinished) {
		/* a crashed writer's append: never acknowledged */
		return;
	}
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
	frame->version = info->frame_version;
	frame->dict_id = info->dict_id;
	frame->base_depth = info->base_depth;
	if (info->base_depth > 0) {
		frame->delta = *info;
		frame->delta.damage = NULL;
	}
}

static int frompacks_scan(struct casbox_frompacks *fp, const char **error_r)
{
	ARRAY_TYPE(casbox_census_pack) packs;
	struct casbox_admin_scan_progress progress;
	struct casbox_pack_frame_info info;
	struct casbox_pack_scan *scan;
	const struct casbox_census_pack *pack_list;
	unsigned int pack_count;
	const char *error;

	if (casbox_census_list_packs(casbox_store_get_root(fp->store),
				     fp->pool, &packs,
				     error_r) < 0)
		return -1;
	pack_list = array_get(&packs, &pack_count);
	casbox_admin_scan_progress_init(&progress, "rebuild --from-packs",
					pack_list, pack_count);
	scan = casbox_pack_scan_init(casbox_store_get_packs(fp->store));
	while (casbox_pack_scan_next(scan, &info)) T_BEGIN {
		frompacks_frame(fp, &info);
		casbox_admin_scan_progress_frame(&progress, info.pack_id,
						 info.offset, info.frame_size);
	} T_END;
	casbox_admin_progress_end();
	if (casbox_pack_scan_deinit(&scan, &error) < 0) {
		*error_r = t_strdup_printf("pack scan: %s", error);
		return -1;
	}
	return 0;
}

static int frompacks_blob_resolve(struct casbox_frompacks *fp,
				  struct casbox_frompacks_blob *blob,
				  uoff_t size);

/* casbox_pack_base_lookup_func_t: a base resolved as any blob, with the
   size its recovery records list. */
static int frompacks_base_lookup(void *context,
				 const struct cas_blob_id *base_id,
				 struct casbox_blob_record *rec_r,
				 const char **error_r)
{
	struct casbox_frompacks *fp = context;
	struct casbox_frompacks_blob *base;
	int ret;

	base = hash_table_lookup(fp->blobs, base_id);
	if (base == NULL || array_count(&base->frames) == 0) {
		*error_r = "no intact frame";
		return 0;
	}
	T_BEGIN {
		ret = frompacks_blob_resolve(fp, base, base->size_hint);
	} T_END;
	if (ret < 0) {
		*error_r = "no DEK opens it";
		return -1;
	}
	*rec_r = base->rec;
	return 1;
}

/* TRUE if the blob opens with rec: the DEK unwraps (or unseals) and
   the first chunk's tag verifies (a delta blob's: with its base, which
   is resolved first). */
static bool frompacks_blob_opens(struct casbox_frompacks *fp,
				 const struct cas_blob_id *id,
				 const struct casbox_blob_record *rec)
{
	unsigned char dek[CAS_DEK_SIZE];
	struct istream *input;
	const char *error;
	bool ok;
	int ret;

	if (cas_keyring_dek_open(casbox_store_get_keyring(fp->store), id,
				 rec->dek_kind,
				 rec->stored_dek, dek, &error) < 0)
		return FALSE;
	safe_memset(dek, 0, sizeof(dek));
	if (casbox_pack_blob_open_chain(casbox_store_get_packs(fp->store),
					id, rec, frompacks_base_lookup, fp,
					&input, &error) < 0)
		return FALSE;
	ret = i_stream_read(input);
	ok = input->stream_errno == 0 && (ret > 0 || ret == -1);
	i_stream_unref(&input);
	return ok;
}

/* Newest frame first (gc copies are newer than the frames they
   replaced); each with every candidate DEK. A version 2 frame does not
   show its plaintext size: size (the message record's part size) is
   tried, and the chunk AAD, which binds it, proves it. */
static int frompacks_blob_resolve(struct casbox_frompacks *fp,
				  struct casbox_frompacks_blob *blob,
				  uoff_t size)
{
	const struct casbox_frompacks_frame *frames;
	const struct casbox_frompacks_dek *dek;
	struct casbox_blob_record rec;
	unsigned int i, count;
	const char *error;

	if (blob->resolved != 0)
		return blob->resolved;
	blob->resolved = -1;
	frames = array_get(&blob->frames, &count);
	for (i = count; i > 0 && blob->resolved < 0; i--) {
		i_zero(&rec);
		rec.pack_id = frames[i-1].pack_id;
		rec.offset = frames[i-1].offset;
		rec.frame_size = frames[i-1].frame_size;
		rec.plain_size = frames[i-1].version == 1 ?
			frames[i-1].plain_size : size;
		rec.dict_id = frames[i-1].dict_id;
		array_foreach(&blob->deks, dek) {
			rec.dek_kind = dek->kind;
			memcpy(rec.stored_dek, dek->stored,
			       cas_dek_kind_size(dek->kind));
			if (frames[i-1].base_depth > 0 &&
			    casbox_pack_frame_base_id(
				casbox_store_get_packs(fp->store),
				&frames[i-1].delta, dek->kind, dek->stored,
				&rec.base_id, &error) < 0)
				continue;
			rec.base_depth = frames[i-1].base_depth;
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
frompacks_msg_resolve(struct casbox_frompacks *fp,
		      struct casbox_frompacks_msg *msg)
{
	const struct casbox_msg_part *part;
	struct casbox_frompacks_blob *blob;
	int ret;

	array_foreach(&msg->rec.msg.parts, part) {
		blob = hash_table_lookup(fp->blobs, &part->id);
		if (blob == NULL || array_count(&blob->frames) == 0) {
			return t_strdup_printf("blob %s: no intact frame",
					       cas_blob_id_to_hex(&part->id));
		}
		T_BEGIN {
			ret = frompacks_blob_resolve(fp, blob,
					casbox_msg_part_blob_size(part));
		} T_END;
		if (ret < 0) {
			return t_strdup_printf("blob %s: no DEK opens it",
					       cas_blob_id_to_hex(&part->id));
		}
		if (blob->rec.plain_size != casbox_msg_part_blob_size(part)) {
			return t_strdup_printf("blob %s: %"PRIu64" bytes, the "
				"record says %"PRIuUOFF_T,
				cas_blob_id_to_hex(&part->id),
				blob->rec.plain_size,
				casbox_msg_part_blob_size(part));
		}
	}
	return NULL;
}

static struct casbox_frompacks_mailbox *
frompacks_mailbox_get(struct casbox_frompacks *fp, const guid_128_t guid)
{
	const char *hex = binary_to_hex(guid, GUID_128_SIZE);
	struct casbox_frompacks_mailbox *mbox;

	mbox = hash_table_lookup(fp->mailboxes, hex);
	if (mbox != NULL)
		return mbox;
	mbox = p_new(fp->pool, struct casbox_frompacks_mailbox, 1);
	guid_128_copy(mbox->guid, guid);
	hash_table_insert(fp->mailboxes, p_strdup(fp->pool, hex), mbox);
	array_push_back(&fp->mailbox_list, &mbox);
	return mbox;
}

static void frompacks_add_mailbox(struct casbox_frompacks *fp,
				  const buffer_t *plain,
				  const struct casbox_pack_frame_info *info)
{
	struct casbox_recovery_mailbox rec;
	struct casbox_frompacks_mailbox *mbox;
	const char *error;

	if (casbox_recovery_mailbox_import(plain->data, plain->used, fp->pool,
					   &rec, &error) < 0) {
		frompacks_unreadable(fp, info, error);
		return;
	}
	mbox = frompacks_mailbox_get(fp, rec.mailbox_guid);
	if (rec.deleted) {
		mbox->deleted_written = I_MAX(mbox->deleted_written,
					      rec.written_usecs);
		return;
	}
	if (rec.written_usecs >= mbox->newest_written) {
		mbox->newest_written = rec.written_usecs;
		mbox->rec.name = rec.name;
		mbox->rec.uid_validity = rec.uid_validity;
		guid_128_copy(mbox->rec.guid, rec.public_guid);
	}
}

static void frompacks_mailbox_add(struct casbox_frompacks *fp,
				  const struct casbox_frompacks_msg *msg)
{
	const struct casbox_recovery_record *rec = &msg->rec;
	struct casbox_frompacks_mailbox *mbox;

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
static void frompacks_mailbox_names(struct casbox_frompacks *fp)
{
	struct casbox_frompacks_mailbox *mbox, *other;
	unsigned int i, j, count;
	struct casbox_frompacks_mailbox *const *boxes;

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

/* A mailbox deleted after its newest record does not come back. */
static void frompacks_drop_deleted(struct casbox_frompacks *fp)
{
	struct casbox_frompacks_mailbox *const *boxes;
	unsigned int i, count;

	boxes = array_get(&fp->mailbox_list, &count);
	for (i = count; i > 0; i--) {
		if (boxes[i-1]->deleted_written == 0 ||
		    boxes[i-1]->deleted_written < boxes[i-1]->newest_written)
			continue;
		fp->deleted_mailboxes++;
		array_delete(&fp->mailbox_list, i-1, 1);
		boxes = array_get(&fp->mailbox_list, &count);
	}
}

/* A live delta blob's record holds a reference on its base: deepest
   first, so a base that only its dependents keep alive passes its own
   reference on. */
static void frompacks_base_refs(struct casbox_frompacks *fp)
{
	struct casbox_frompacks_blob *blob, *base;
	unsigned int depth;

	for (depth = CASBOX_BASE_MAX_DEPTH; depth > 0; depth--) {
		array_foreach_elem(&fp->blob_list, blob) {
			if (blob->refcount == 0 || blob->resolved <= 0 ||
			    blob->rec.base_depth != depth)
				continue;
			base = hash_table_lookup(fp->blobs,
						 &blob->rec.base_id);
			/* resolved with its base: it exists */
			i_assert(base != NULL && base->resolved > 0);
			base->refcount++;
		}
	}
}

static void frompacks_resolve(struct casbox_frompacks *fp)
{
	struct casbox_frompacks_msg *msg;
	struct casbox_frompacks_blob *blob;
	const struct casbox_msg_part *part;
	struct casbox_frompacks_mailbox *mbox;
	uint64_t now_usecs = casbox_meta_now_usecs();
	unsigned int i = 0, count = array_count(&fp->msg_list);
	const char *why;

	array_foreach_elem(&fp->msg_list, msg) T_BEGIN {
		casbox_admin_progress("rebuild --from-packs: messages opened",
				      ++i, count);
		mbox = frompacks_mailbox_get(fp, msg->mailbox_guid);
		why = msg->rec.written_usecs <= mbox->deleted_written ? NULL :
			frompacks_msg_resolve(fp, msg);
		if (msg->rec.written_usecs <= mbox->deleted_written) {
			/* its mailbox was deleted after this save */
			msg->deleted = TRUE;
			fp->deleted_messages++;
		} else if (why != NULL) {
			msg->lost = TRUE;
			fp->lost_messages++;
			casbox_admin_progress_end();
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
		if (!msg->deleted)
			frompacks_mailbox_add(fp, msg);
	} T_END;
	casbox_admin_progress_end();
	frompacks_drop_deleted(fp);
	array_foreach_elem(&fp->mailbox_list, mbox) {
		/* a mailbox only a mailbox record named: empty */
		mbox->rec.next_uid = I_MAX(mbox->rec.next_uid, 1);
		/* the mailbox's modseqs after the last save are unknown:
		   above any a client can have seen (a change is +1, the
		   clock gains a million a second) */
		mbox->rec.highest_modseq = I_MAX(mbox->rec.highest_modseq,
						 now_usecs);
	}
	frompacks_mailbox_names(fp);
	frompacks_base_refs(fp);
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

static void frompacks_write_records(struct casbox_frompacks *fp,
				    struct frompacks_writer *w)
{
	struct casbox_frompacks_mailbox *mbox;
	struct casbox_frompacks_msg *msg;
	struct casbox_frompacks_blob *blob;
	struct casbox_blob_value bval;
	buffer_t *key, *value, *prec;

	/* no 'K' record: the new LSM is sealed, its MANIFEST names the
	   key's fingerprint */
	key = t_buffer_create(64);
	value = t_buffer_create(512);
	prec = t_buffer_create(CASBOX_BLOB_RECORD_EXPORT_SIZE);
	if (frompacks_writer_next(w) < 0)
		return;
	/* every record written here is v2 */
	if (casbox_records_put_marker_done(fp->store, w->batch,
					   &w->error) < 0) {
		w->error = t_strdup(w->error);
		return;
	}

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
		if (msg->lost || msg->deleted)
			continue;
		buffer_set_used_size(key, 0);
		buffer_set_used_size(value, 0);
		casbox_key_message(key, msg->mailbox_guid, msg->uid);
		if (casbox_store_msg_value_export(fp->store, key,
						  &msg->rec.msg, value,
						  &w->error) < 0) {
			w->error = t_strdup(w->error);
			return;
		}
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

/* Write the new LSM at new_dir. Returns 0 ok, -1 error. */
static int frompacks_write_lsm(struct casbox_frompacks *fp, const char *new_dir,
			       const char **error_r)
{
	struct casbox_lsm_settings set;
	struct frompacks_writer w;
	int ret = 0;

	/* sealed with the store's key, like every LSM of the store */
	if (casbox_store_lsm_settings(fp->store, new_dir, &set, error_r) < 0)
		return -1;
	i_zero(&w);
	if (casbox_store_lsm_open(fp->store, &set, &w.lsm, error_r) < 0)
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
static int frompacks_swap(struct casbox_frompacks *fp, const char *new_dir,
			  const char *stamp, const char **error_r)
{
	const char *root = casbox_store_get_root(fp->store);
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
	if (casbox_store_get_fsync(fp->store))
		return cas_durable_fsync_dir(NULL, root, error_r);
	return 0;
}

/* Serialise with saves, gc and key rotation: if the old LSM still
   opens, its write lock, then the pack append lock (no frame can be
   added while we scan). The order is the one saves, key rotation and
   gc's switch take them in, so none of them can hold the LSM lock while
   waiting for a pack lock held here. Returns 0 ok, -1 error (the caller
   unlocks). */
static int frompacks_lock(struct casbox_frompacks *fp, const char **error_r)
{
	struct casbox_lsm_settings set;
	const char *lsm_dir = t_strconcat(casbox_store_get_root(fp->store),
					  "/lsm", NULL);
	const char *error;
	struct stat st;

	if (stat(lsm_dir, &st) == 0) {
		/* a sealed old LSM opens only with the key (and a damaged
		   or foreign one not at all: moved aside below) */
		if (casbox_store_lsm_settings(fp->store, lsm_dir, &set,
					      &error) < 0)
			set.dir = NULL;
		set.lock_timeout_secs = fp->lsm_lock_timeout_secs;
		if (set.dir != NULL &&
		    casbox_store_lsm_open(fp->store, &set, &fp->old_lsm,
					  &error) > 0 &&
		    casbox_lsm_batch_begin(fp->old_lsm, &fp->old_batch,
					   &error) < 0 &&
		    casbox_lsm_lock_timed_out(fp->old_lsm)) {
			/* busy, not damaged: moving it aside now would
			   lose what its lock holder is committing */
			*error_r = t_strdup_printf("old LSM %s is in use: "
				"%s; nothing changed, try again when the "
				"store is idle", lsm_dir, error);
			return -1;
		}
		if (fp->old_batch == NULL) {
			/* damaged: nothing can write through it either */
			i_warning("casbox rebuild --from-packs: old LSM %s: "
				  "%s (moving it aside anyway)", lsm_dir,
				  error);
			if (fp->old_lsm != NULL)
				casbox_lsm_close(&fp->old_lsm);
		}
	}
	if (casbox_pack_txn_begin(casbox_store_get_packs(fp->store),
				  &fp->pack_txn,
				  &error) < 0) {
		*error_r = t_strdup_printf("pack lock: %s", error);
		return -1;
	}
	return 0;
}

static void frompacks_unlock(struct casbox_frompacks *fp)
{
	if (fp->old_batch != NULL)
		casbox_lsm_batch_rollback(&fp->old_batch);
	if (fp->old_lsm != NULL)
		casbox_lsm_close(&fp->old_lsm);
	if (fp->pack_txn != NULL)
		casbox_pack_txn_rollback(&fp->pack_txn);
}

static int frompacks_rebuild(struct casbox_frompacks *fp, const char **error_r)
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
			"left in place",
			casbox_store_get_settings(fp->store)->key_file);
		return -1;
	}
	frompacks_resolve(fp);
	stamp = t_strdup_printf("%ld.%ld", (long)ioloop_time,
				(long)getpid());
	new_dir = t_strdup_printf("%s/lsm.rebuild-%s",
				  casbox_store_get_root(fp->store),
				  stamp);
	ret = frompacks_write_lsm(fp, new_dir, error_r);
	if (ret == 0)
		ret = frompacks_swap(fp, new_dir, stamp, error_r);
	return ret;
}


struct casbox_frompacks *casbox_frompacks_init(struct casbox_store *store)
{
	struct casbox_frompacks *fp;
	pool_t pool;

	i_assert(casbox_store_get_packs(store) != NULL &&
		 casbox_store_get_keyring(store) != NULL);
	pool = pool_alloconly_create("casbox rebuild from packs", 65536);
	fp = p_new(pool, struct casbox_frompacks, 1);
	fp->pool = pool;
	fp->store = store;
	hash_table_create(&fp->blobs, pool, 0, frompacks_blob_id_hash,
			  frompacks_blob_id_cmp);
	hash_table_create(&fp->msgs, pool, 0, str_hash, strcmp);
	hash_table_create(&fp->mailboxes, pool, 0, str_hash, strcmp);
	p_array_init(&fp->blob_list, pool, 256);
	p_array_init(&fp->msg_list, pool, 256);
	p_array_init(&fp->mailbox_list, pool, 8);
	return fp;
}

int casbox_frompacks_rebuild_lsm(struct casbox_frompacks *fp,
				 const char **error_r)
{
	int ret;

	ret = frompacks_lock(fp, error_r);
	if (ret == 0)
		ret = frompacks_rebuild(fp, error_r);
	frompacks_unlock(fp);
	return ret;
}

void casbox_frompacks_deinit(struct casbox_frompacks **_fp)
{
	struct casbox_frompacks *fp = *_fp;

	*_fp = NULL;
	hash_table_destroy(&fp->blobs);
	hash_table_destroy(&fp->msgs);
	hash_table_destroy(&fp->mailboxes);
	pool_unref(&fp->pool);
}
