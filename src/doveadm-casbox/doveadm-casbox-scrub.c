/* doveadm casbox scrub: verify every pack frame, LSM file and reference
   of a user's store; with --repair fix refcounts, quarantine damaged
   blobs and mark the messages that use them. See doc/doveadm.md. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "ioloop.h"
#include "istream.h"
#include "mail-user.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "safe-memset.h"
#include "casbox-store-repair.h"
#include "casbox-store-gc.h"
#include "casbox-recovery.h"
#include "casbox-events.h"
#include "doveadm-casbox.h"
#include "doveadm-casbox-dovecot.h"

#include <sysexits.h>

/* the status column */
#define SCRUB_STATUS_DAMAGED "damaged"
#define SCRUB_STATUS_KNOWN "known"
#define SCRUB_STATUS_REPAIRED "repaired"

#define SCRUB_LSM_HINT "not repaired by scrub: see doveadm casbox rebuild"

struct casbox_scrub_cmd_context {
	struct doveadm_mail_cmd_context ctx;
	bool repair;
};

/* A message that uses a damaged (or quarantined) blob. */
struct casbox_scrub_msg {
	const char *mailbox;
	uint32_t uid;
	/* a part cannot be read */
	bool damaged;
};

struct casbox_scrub {
	struct casbox_admin *adm;
	/* the command's (its duration), parent of the named events */
	struct event *event;
	pool_t pool;
	struct casbox_census *census;
	ARRAY(struct casbox_scrub_msg) msgs;
	/* damage rows printed, of them already quarantined */
	unsigned int damaged, known;
	/* rows of what --repair did */
	unsigned int repaired;
	/* quarantine records of blobs no message uses any more (the
	   messages were expunged): --repair deletes them */
	unsigned int orphans;
	/* an LSM file is damaged: the records may be incomplete */
	bool lsm_damaged;
	/* blobs were decoded (we had the key) */
	bool decoded;
};

/* One output row, and its casbox_scrub_item event. */
static void casbox_scrub_print(struct casbox_scrub *scrub,
			       const char *mailbox, uint32_t uid,
			       const char *object, const char *status,
			       const char *cause)
{
	e_debug(event_create_passthrough(scrub->event)->
		set_name("casbox_scrub_item")->
		add_str("mailbox", mailbox)->add_int("uid", uid)->
		add_str("object", object)->add_str("status", status)->
		add_str("cause", cause)->event(),
		"casbox scrub: %s %s uid=%u: %s (%s)", status, mailbox, uid,
		object, cause);
	doveadm_print(mailbox);
	doveadm_print(uid == 0 ? "-" : dec2str(uid));
	doveadm_print(object);
	doveadm_print(status);
	doveadm_print(cause);
}

/* A damaged item found by the check (census callback too). */
static void casbox_scrub_row(void *context, const char *mailbox,
			     uint32_t uid, const char *object,
			     const char *cause)
{
	struct casbox_scrub *scrub = context;

	scrub->damaged++;
	casbox_scrub_print(scrub, mailbox, uid, object,
			   SCRUB_STATUS_DAMAGED, cause);
}

static void casbox_scrub_blob_row(struct casbox_scrub *scrub,
				  const char *mailbox, uint32_t uid,
				  const struct casbox_census_blob *blob,
				  const char *cause)
{
	const char *status = SCRUB_STATUS_DAMAGED;

	scrub->damaged++;
	if (blob->quarantined != NULL) {
		scrub->known++;
		status = SCRUB_STATUS_KNOWN;
	}
	casbox_scrub_print(scrub, mailbox, uid, cas_blob_id_to_hex(&blob->id),
			   status, cause);
}

static void casbox_scrub_lsm_damage(void *context, const char *file,
				    uoff_t offset, const char *reason)
{
	struct casbox_scrub *scrub = context;

	scrub->lsm_damaged = TRUE;
	casbox_scrub_row(context, "-", 0,
			 t_strdup_printf("%s@%"PRIuUOFF_T, file, offset),
			 t_strdup_printf("LSM damage: %s (%s)", reason,
					 SCRUB_LSM_HINT));
}

/* Decode the blob to its end: every chunk's CRC and AEAD tag. */
static void casbox_scrub_decode(struct casbox_scrub *scrub,
				struct casbox_census_blob *blob)
{
	casbox_census_decode_blob(scrub->adm->store, scrub->census, blob);
}

/* Password mode without the password: the frames' CRCs were checked by
   the census; what can still be checked without opening anything is
   the sealed DEK's kind, key id and MAC (a forged or moved DEK). */
static void casbox_scrub_verify_dek(struct casbox_scrub *scrub,
				    struct casbox_census_blob *blob)
{
	const char *error;

	if (cas_keyring_dek_verify(scrub->adm->keyring, &blob->id,
				   blob->rec.dek_kind, blob->rec.stored_dek,
				   &error) < 0) {
		blob->damage = p_strdup_printf(scrub->census->pool,
			"stored DEK: %s", error);
	}
}

static void casbox_scrub_blobs(struct casbox_scrub *scrub)
{
	struct casbox_census_blob *blob;
	unsigned int i = 0, count = array_count(&scrub->census->blob_list);
	uint64_t done = 0, total = 0;

	array_foreach_elem(&scrub->census->blob_list, blob) {
		if (blob->have_record && !blob->record_bad)
			total += blob->rec.frame_size;
	}
	array_foreach_elem(&scrub->census->blob_list, blob) T_BEGIN {
		i++;
		if (!blob->have_record || blob->damage != NULL)
			;
		else if (!blob->frame_seen) {
			blob->damage = p_strdup_printf(scrub->census->pool,
				"no intact frame at pack %u offset %"PRIu64,
				blob->rec.pack_id, blob->rec.offset);
		} else if (scrub->adm->keyring == NULL) {
			/* keyless scrub: CRCs only */
		} else if (cas_keyring_can_decrypt(scrub->adm->keyring)) {
			casbox_scrub_decode(scrub, blob);
		} else {
			casbox_scrub_verify_dek(scrub, blob);
		}
		if (blob->have_record && !blob->record_bad)
			done += blob->rec.frame_size;
		casbox_admin_progress_bytes(i == count, "scrub",
			t_strdup_printf("blobs decoded: %u/%u", i, count),
			done, total);
	} T_END;
	casbox_admin_progress_end();
}

static void casbox_scrub_add_msg(struct casbox_scrub *scrub,
				 const char *mailbox, uint32_t uid,
				 bool damaged)
{
	struct casbox_scrub_msg *msg;

	msg = array_append_space(&scrub->msgs);
	msg->mailbox = p_strdup(scrub->pool, mailbox);
	msg->uid = uid;
	msg->damaged = damaged;
}

/* With the key: every meta frame the scan found intact must open and
   parse (it is what rebuild --from-packs would need). Password mode
   without the password: its MAC must verify (the most that can be
   checked without opening it). */
static void casbox_scrub_metas(struct casbox_scrub *scrub)
{
	const struct casbox_census_meta *meta;
	const char *error;

	array_foreach(&scrub->census->metas, meta) T_BEGIN {
		if (casbox_census_check_meta(scrub->adm->store, meta,
					     &error) < 0) {
			casbox_scrub_row(scrub, "-", 0, t_strdup_printf(
				"%s@%"PRIu64, casbox_admin_pack_path(
					scrub->adm, meta->pack_id),
				meta->offset), t_strdup_printf(
				"meta frame: %s", error));
		}
	} T_END;
}

/* One row per message part that cannot be read. */
static void casbox_scrub_message(void *context, const guid_128_t guid,
				 uint32_t uid,
				 const struct casbox_msg_record *rec)
{
	struct casbox_scrub *scrub = context;
	const struct casbox_msg_part *part;
	struct casbox_census_blob *blob;
	const char *mailbox;
	bool damaged = FALSE, quarantined = FALSE;

	mailbox = casbox_census_mailbox_name(scrub->census, guid);
	array_foreach(&rec->parts, part) {
		blob = hash_table_lookup(scrub->census->blobs, &part->id);
		i_assert(blob != NULL);
		if (!blob->have_record) {
			casbox_scrub_blob_row(scrub, mailbox, uid, blob,
					      "blob record missing");
			damaged = TRUE;
		} else if (blob->damage != NULL) {
			casbox_scrub_blob_row(scrub, mailbox, uid, blob,
					      blob->damage);
			damaged = TRUE;
		} else if (blob->quarantined != NULL && scrub->decoded) {
			/* e.g. the pack was restored from a backup */
			casbox_scrub_blob_row(scrub, mailbox, uid, blob,
				t_strdup_printf("quarantined (%s), but reads "
						"intact now",
						blob->quarantined));
			quarantined = TRUE;
		}
	}
	if (damaged || quarantined)
		casbox_scrub_add_msg(scrub, mailbox, uid, damaged);
}

static int casbox_scrub_messages(struct casbox_scrub *scrub,
				 const char **error_r)
{
	/* the records that do not decode are reported by the census */
	return casbox_census_foreach_msg(scrub->adm->store,
					 casbox_scrub_message, scrub, error_r);
}

/* Refcounts against the references counted, and damaged blobs that no
   message names. */
static void casbox_scrub_refcounts(struct casbox_scrub *scrub)
{
	struct casbox_census_blob *blob;

	array_foreach_elem(&scrub->census->blob_list, blob) T_BEGIN {
		const char *hex = cas_blob_id_to_hex(&blob->id);

		if (!blob->have_record && blob->counted == 0 &&
		    blob->quarantined != NULL)
			scrub->orphans++;
		if (!blob->have_record || blob->record_bad)
			;
		else if (blob->refcount != blob->counted) {
			casbox_scrub_row(scrub, "-", 0, hex, t_strdup_printf(
				"refcount %u, but %u references",
				blob->refcount, blob->counted));
		} else if (blob->damage != NULL && blob->counted == 0) {
			casbox_scrub_row(scrub, "-", 0, hex, t_strdup_printf(
				"unreferenced blob: %s", blob->damage));
		}
	} T_END;
}

/* Without the key, everything but decoding still runs; the run then
   fails with the key error, so it is never mistaken for a clean one. */
static int casbox_scrub_open_packs(struct casbox_scrub *scrub,
				   const char **key_error_r,
				   const char **error_r)
{
	int ret;

	*key_error_r = NULL;
	if (casbox_admin_open_keys(scrub->adm, key_error_r) > 0)
		return 1;
	ret = casbox_admin_open_packs_keyless(scrub->adm, error_r);
	if (ret == 0) {
		*key_error_r = t_strdup_printf("%s: packs not checked "
			"(their dictionaries need the key)", *key_error_r);
	} else if (ret > 0) {
		*key_error_r = t_strdup_printf("%s: blobs not decoded, "
			"pack frames checked by CRC only", *key_error_r);
	}
	return ret;
}

static int casbox_scrub_check(struct casbox_scrub *scrub,
			      const char **error_r)
{
	struct casbox_admin *adm = scrub->adm;
	const char *key_error;
	int ret;

	if (casbox_census_verify_lsm(adm->store, casbox_scrub_lsm_damage,
				     scrub, error_r) < 0)
		return -1;
	if (casbox_census_build(adm->store, casbox_scrub_row, scrub,
				&scrub->census, error_r) < 0) {
		if (!scrub->lsm_damaged)
			return -1;
		/* already reported: the records past the damage cannot
		   be read, so nothing else can be checked */
		casbox_scrub_row(scrub, "-", 0, "lsm", t_strdup_printf(
			"records unreadable: %s", *error_r));
		return 0;
	}
	if ((ret = casbox_scrub_open_packs(scrub, &key_error, error_r)) < 0)
		return -1;
	if (ret > 0) {
		casbox_admin_census_show_progress(scrub->census, "scrub");
		ret = casbox_census_scan_packs(adm->store, scrub->census,
					       casbox_scrub_row, scrub,
					       error_r);
		casbox_admin_progress_end();
		if (ret < 0)
			return -1;
		scrub->decoded = adm->keyring != NULL;
		casbox_scrub_blobs(scrub);
		if (adm->keyring != NULL)
			casbox_scrub_metas(scrub);
	}
	if (casbox_scrub_messages(scrub, error_r) < 0)
		return -1;
	casbox_scrub_refcounts(scrub);
	if (key_error != NULL) {
		*error_r = key_error;
		return -1;
	}
	return 0;
}

static void casbox_scrub_repair_row(struct casbox_scrub *scrub,
				    const char *mailbox, uint32_t uid,
				    const struct cas_blob_id *id,
				    const char *action)
{
	scrub->repaired++;
	casbox_scrub_print(scrub, mailbox, uid, cas_blob_id_to_hex(id),
			   SCRUB_STATUS_REPAIRED, action);
}

static void
casbox_scrub_fix_refcount(struct casbox_scrub *scrub,
			  struct casbox_store_repair *repair,
			  const struct casbox_census_blob *fresh)
{
	casbox_store_repair_refcount(repair, fresh);
	casbox_scrub_repair_row(scrub, "-", 0, &fresh->id, t_strdup_printf(
		"refcount %u -> %u", fresh->refcount, fresh->counted));
}

/* Copy the damaged frame aside and record the quarantine. The blob
   record stays, so the messages still exist and can be restored. A
   delta whose base is damaged is quarantined the same way (it cannot be
   decoded without it; restoring the base's frame releases both), and
   its row says which base. */
static void
casbox_scrub_quarantine(struct casbox_scrub *scrub,
			struct casbox_store_repair *repair,
			const struct casbox_census_blob *fresh,
			const struct casbox_census_blob *checked)
{
	struct casbox_quarantine_record qrec;
	const char *path, *error, *action, *why = "";

	i_zero(&qrec);
	qrec.time = ioloop_time;
	qrec.cause = checked->damage != NULL ? checked->damage :
		"blob record missing";
	if (checked->base_damaged) {
		why = t_strdup_printf(" (its base %s is damaged)",
			cas_blob_id_to_hex(&checked->rec.base_id));
	}
	if (fresh->have_record && !fresh->record_bad) {
		qrec.pack_id = fresh->rec.pack_id;
		qrec.offset = fresh->rec.offset;
		qrec.frame_size = fresh->rec.frame_size;
		if (casbox_store_quarantine_copy(scrub->adm->store, &fresh->id,
						 &qrec, &path, &error) < 0) {
			i_error("casbox scrub: blob %s: frame not copied: %s",
				cas_blob_id_to_hex(&fresh->id), error);
			action = t_strdup_printf("quarantined%s, frame not "
						 "copied: %s", why, error);
		} else {
			action = t_strdup_printf("quarantined%s, frame copied "
						 "to %s", why, path);
		}
	} else {
		action = "quarantined (no readable blob record)";
	}
	casbox_store_repair_quarantine(repair, &fresh->id, &qrec);
	casbox_scrub_repair_row(scrub, "-", 0, &fresh->id, action);
}

static bool
casbox_scrub_same_frame(const struct casbox_census_blob *fresh,
			const struct casbox_census_blob *checked)
{
	if (fresh->have_record != checked->have_record ||
	    fresh->record_bad != checked->record_bad)
		return FALSE;
	if (!fresh->have_record || fresh->record_bad)
		return TRUE;
	return fresh->rec.pack_id == checked->rec.pack_id &&
		fresh->rec.offset == checked->rec.offset;
}

static void
casbox_scrub_repair_blob(struct casbox_scrub *scrub,
			 struct casbox_store_repair *repair,
			 const struct casbox_census_blob *fresh,
			 const struct casbox_census_blob *checked,
			 bool may_lower)
{
	if (fresh->have_record && !fresh->record_bad &&
	    fresh->refcount != fresh->counted &&
	    (may_lower || fresh->counted > fresh->refcount))
		casbox_scrub_fix_refcount(scrub, repair, fresh);
	/* only what the check found, and only if no save or gc moved
	   the blob since */
	if (checked == NULL || !casbox_scrub_same_frame(fresh, checked))
		return;
	if ((checked->damage != NULL || !checked->have_record) &&
	    fresh->counted > 0 && fresh->quarantined == NULL)
		casbox_scrub_quarantine(scrub, repair, fresh, checked);
	else if (checked->damage == NULL && checked->have_record &&
		 fresh->quarantined != NULL && scrub->decoded) {
		casbox_store_repair_release(repair, &fresh->id);
		casbox_scrub_repair_row(scrub, "-", 0, &fresh->id,
			"released from quarantine: reads intact");
	} else if (!fresh->have_record && fresh->counted == 0 &&
		   fresh->quarantined != NULL) {
		/* the frame copy stays in quarantine/ */
		casbox_store_repair_release(repair, &fresh->id);
		casbox_scrub_repair_row(scrub, "-", 0, &fresh->id,
			"released from quarantine: no message uses it");
	}
}

/* Set (or remove) the damaged keyword on the messages the check
   found, through lib-storage. */
static int casbox_scrub_mark(struct casbox_scrub *scrub, bool add,
			     const char **error_r)
{
	const struct casbox_scrub_msg *msg;
	ARRAY_TYPE(const_string) vnames;
	ARRAY(uint32_t) uids;
	unsigned int i, count;
	bool *changed;

	t_array_init(&vnames, 16);
	t_array_init(&uids, 16);
	array_foreach(&scrub->msgs, msg) {
		if (msg->damaged == add) {
			const char *vname = msg->mailbox;

			array_push_back(&vnames, &vname);
			array_push_back(&uids, &msg->uid);
		}
	}
	count = array_count(&uids);
	if (count == 0)
		return 0;
	changed = t_new(bool, count);
	if (casbox_admin_set_keyword(scrub->adm->user, CASBOX_DAMAGED_KEYWORD,
				     add, array_front(&vnames),
				     array_front(&uids), count, changed,
				     error_r) < 0)
		return -1;
	for (i = 0; i < count; i++) {
		if (!changed[i])
			continue;
		scrub->repaired++;
		casbox_scrub_print(scrub, array_idx_elem(&vnames, i),
				   *array_idx(&uids, i), "-",
				   SCRUB_STATUS_REPAIRED,
				   add ? "marked "CASBOX_DAMAGED_KEYWORD :
				   "unmarked "CASBOX_DAMAGED_KEYWORD);
	}
	return 0;
}

static void casbox_scrub_record_written(void *context,
					const guid_128_t mailbox_guid,
					uint32_t uid)
{
	struct casbox_scrub *scrub = context;

	scrub->repaired++;
	casbox_scrub_print(scrub, casbox_census_mailbox_name(scrub->census,
							     mailbox_guid),
			   uid, "-", SCRUB_STATUS_REPAIRED,
			   "recovery record written to the packs");
}

static void casbox_scrub_keys_written(void *context,
				      const struct cas_blob_id *id)
{
	casbox_scrub_repair_row(context, "-", 0, id,
				"DEK written to the packs (blob keys)");
}

/* What a rebuild from the packs needs and no intact meta frame holds
   any more (a damaged recovery record, blob keys or DEK update, or mail
   saved before recovery records): written again from the LSM, without
   rewriting a pack (gc --all would too, but rewrites them all). */
static int casbox_scrub_backfill(struct casbox_scrub *scrub,
				 const char **error_r)
{
	static const struct casbox_store_backfill_callbacks cb = {
		.recovery_written = casbox_scrub_record_written,
		.blob_keys_written = casbox_scrub_keys_written,
	};
	struct casbox_store_gc_stats stats;

	/* the check's census: the packs are not read again (the shared
	   maintenance lock held since keeps gc from changing them) */
	return casbox_store_gc_backfill(scrub->adm->store, scrub->census,
					&cb, scrub, &stats, error_r);
}

/* Recount under the write lock, so no save changes refcounts between
   counting and writing; damage found by the check is quarantined if
   the blob record still points to the same frame. */
static int casbox_scrub_repair(struct casbox_scrub *scrub,
			       const char **error_r)
{
	struct casbox_census *fresh;
	struct casbox_store_repair *repair;
	struct casbox_census_blob *blob, *checked;

	if (scrub->lsm_damaged) {
		/* references counted from a damaged LSM can be too low,
		   and "fixing" refcounts down would let gc delete blobs
		   that messages still use */
		i_warning("casbox scrub: %s: the LSM is damaged, nothing "
			  "repaired: run doveadm casbox rebuild first",
			  scrub->adm->root_dir);
		return 0;
	}
	if (casbox_store_repair_begin(scrub->adm->store, &repair,
				      error_r) < 0)
		return -1;
	if (casbox_census_build(scrub->adm->store, NULL, NULL, &fresh,
				error_r) < 0) {
		casbox_store_repair_rollback(&repair);
		return -1;
	}
	/* a record that failed to decode or authenticate (records v2)
	   may have lost the reference of a blob its message still needs:
	   refcounts are then only raised, never lowered */
	if (fresh->bad_records > 0) {
		i_warning("casbox scrub: %s: %u records are malformed or "
			  "failed authentication: refcounts are not lowered",
			  scrub->adm->root_dir, fresh->bad_records);
	}
	array_foreach_elem(&fresh->blob_list, blob) T_BEGIN {
		checked = hash_table_lookup(scrub->census->blobs, &blob->id);
		casbox_scrub_repair_blob(scrub, repair, blob, checked,
					 fresh->bad_records == 0);
	} T_END;
	casbox_census_free(&fresh);
	if (casbox_store_repair_commit(&repair, error_r) < 0 ||
	    casbox_scrub_backfill(scrub, error_r) < 0)
		return -1;
	/* after the commit: the mailbox sync takes the LSM lock itself */
	if (scrub->adm->user == NULL)
		return 0;
	if (casbox_scrub_mark(scrub, TRUE, error_r) < 0 ||
	    casbox_scrub_mark(scrub, FALSE, error_r) < 0)
		return -1;
	return 0;
}

/* A WAL or table so damaged that the LSM does not open is damage too,
   not an error to retry: the LSM names the file and the offset. */
static bool casbox_scrub_open_error_is_damage(const char *error)
{
	return strstr(error, ": Corrupted ") != NULL;
}

/* Send casbox_scrub_finished (doc/events.md) and free the event. */
static void casbox_scrub_finished(struct casbox_scrub *scrub, bool repair,
				  const char *error)
{
	struct event_passthrough *e;

	e = event_create_passthrough(scrub->event)->
		set_name("casbox_scrub_finished")->
		add_int("damaged", scrub->damaged)->
		add_int("known", scrub->known)->
		add_int("repaired", scrub->repaired)->
		add_int("orphans", scrub->orphans)->
		add_int("lsm_damaged", scrub->lsm_damaged ? 1 : 0)->
		add_int("repair", repair ? 1 : 0);
	if (error != NULL)
		e->add_str("error", error);
	e_debug(e->event(), "casbox scrub: %u damaged item(s)%s%s",
		scrub->damaged, error == NULL ? "" : ": ",
		error == NULL ? "" : error);
	event_unref(&scrub->event);
}

static int
cmd_casbox_scrub_run(struct doveadm_mail_cmd_context *_ctx,
		     struct mail_user *user)
{
	struct casbox_scrub_cmd_context *ctx =
		container_of(_ctx, struct casbox_scrub_cmd_context, ctx);
	struct casbox_scrub scrub;
	struct file_lock *lock = NULL;
	const char *error;
	int ret;

	i_zero(&scrub);
	casbox_doveadm_username_run(_ctx, user);
	scrub.event = casbox_event_create(user->event);
	ret = casbox_admin_open(user, &scrub.adm, &error);
	if (ret < 0 && casbox_scrub_open_error_is_damage(error)) {
		scrub.lsm_damaged = TRUE;
		casbox_scrub_row(&scrub, "-", 0, "lsm", t_strdup_printf(
			"LSM damage: %s (%s)", error, SCRUB_LSM_HINT));
		i_warning("casbox scrub: %s", error);
		_ctx->exit_code = EX_DATAERR;
		casbox_scrub_finished(&scrub, ctx->repair, NULL);
		return -1;
	}
	if (ret <= 0) {
		event_unref(&scrub.event);
		return casbox_admin_open_failed(_ctx, "casbox scrub", user,
						ret, error);
	}
	scrub.pool = pool_alloconly_create("casbox scrub", 1024);
	p_array_init(&scrub.msgs, scrub.pool, 16);
	/* shared: a gc waits until the scan is done, or the scan for the
	   gc, so no pack vanishes under it */
	ret = casbox_store_maintenance_lock(scrub.adm->store, FALSE,
					    CASBOX_MAINTENANCE_LOCK_SECS,
					    &lock, &error) > 0 ? 0 : -1;
	if (ret == 0)
		ret = casbox_scrub_check(&scrub, &error);
	if (ret == 0 && ctx->repair &&
	    (scrub.damaged > 0 || scrub.orphans > 0))
		ret = casbox_scrub_repair(&scrub, &error);
	if (lock != NULL)
		file_lock_free(&lock);
	if (ret < 0) {
		i_error("casbox scrub: %s", error);
		doveadm_mail_failed_error(_ctx, MAIL_ERROR_TEMP);
	} else if (scrub.damaged > 0) {
		i_warning("casbox scrub: %s: %u damaged item(s)%s%s",
			  scrub.adm->root_dir, scrub.damaged,
			  scrub.known == 0 ? "" : t_strdup_printf(
				", %u of them quarantined before",
				scrub.known),
			  scrub.repaired == 0 ? "" : t_strdup_printf(
				", %u repair(s) done", scrub.repaired));
		_ctx->exit_code = EX_DATAERR;
	}
	casbox_scrub_finished(&scrub, ctx->repair, ret < 0 ? error : NULL);
	if (scrub.census != NULL)
		casbox_census_free(&scrub.census);
	pool_unref(&scrub.pool);
	casbox_admin_close(&scrub.adm);
	return ret;
}

static void cmd_casbox_scrub_init(struct doveadm_mail_cmd_context *ctx
				  ATTR_UNUSED CASBOX_DOVEADM_INIT_PARAMS)
{
	casbox_doveadm_username_init(ctx);
	doveadm_print_header_simple("mailbox");
	doveadm_print_header("uid", "uid",
			     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	doveadm_print_header_simple("blob");
	doveadm_print_header_simple("status");
	doveadm_print_header_simple("cause");
}

static bool cmd_casbox_scrub_parse_arg(struct doveadm_mail_cmd_context *_ctx,
				       int c)
{
	struct casbox_scrub_cmd_context *ctx =
		container_of(_ctx, struct casbox_scrub_cmd_context, ctx);

	if (c != 'r')
		return FALSE;
	ctx->repair = TRUE;
	return TRUE;
}

struct doveadm_mail_cmd_context *cmd_casbox_scrub_alloc(void)
{
	struct casbox_scrub_cmd_context *ctx;

	ctx = doveadm_mail_cmd_alloc(struct casbox_scrub_cmd_context);
	casbox_doveadm_set_parse_arg(&ctx->ctx, "r", cmd_casbox_scrub_parse_arg);
	ctx->ctx.v.init = cmd_casbox_scrub_init;
	ctx->ctx.v.run = cmd_casbox_scrub_run;
	/* every row names its user, also with -u (doveadm adds the sticky
	   "username" column itself with -A, -F and wildcards) */
	CASBOX_DOVEADM_USERNAME_ALLOC(&ctx->ctx);
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return &ctx->ctx;
}
