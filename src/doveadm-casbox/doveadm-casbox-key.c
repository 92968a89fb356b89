/* doveadm casbox key init|destroy|rotate|export-public: the user's key
   file (key password and password-mode init: doveadm-casbox-keypw.c). */

#include "lib.h"
#include "mkdir-parents.h"
#include "write-full.h"
#include "hex-binary.h"
#include "mail-user.h"
#include "doveadm-print.h"
#include "doveadm-mail.h"
#include "strnum.h"
#include "cas-keyfile.h"
#include "casbox-store-rekey.h"
#include "casbox-store-gc.h"
#include "doveadm-casbox.h"
#include "doveadm-casbox-dovecot.h"
#include "cas-userkey.h"

#include <fcntl.h>
#include <sysexits.h>
#include <unistd.h>
#include <sys/stat.h>

/* records rewrapped per LSM batch unless --batch says otherwise */
#define CASBOX_ROTATE_DEFAULT_BATCH 1000
/* full walks before giving up on records that keep the old key id */
#define CASBOX_ROTATE_MAX_WALKS 3
/* gc --all runs of --finish's packs step before it gives up */
#define CASBOX_ROTATE_MAX_GC_RUNS 5

/* doveadm -v: exported by the doveadm binary but not declared in the
   installed headers. Weak, so the module still loads where it is
   missing (tests dlopen the module on its own). */
extern bool doveadm_verbose __attribute__((weak));

static bool casbox_rotate_verbose(void)
{
	return &doveadm_verbose != NULL && doveadm_verbose;
}

struct casbox_key_cmd_context {
	struct doveadm_mail_cmd_context ctx;
	bool yes_destroy;
	bool finish;
	unsigned int batch;
};

struct casbox_rotate {
	struct casbox_admin *adm;
	const char *user;
	unsigned int batch;
	uint32_t old_key_id, new_key_id;
	uint32_t old_epoch, new_epoch;
	unsigned int steps;
	/* the DEK walk's, then each re-seal step's */
	struct casbox_rekey_stats stats, reseal;
	/* records still under the old key id when the run ended */
	uint64_t left;
	/* this run added the new slot (else it resumed a rotation) */
	bool slot_added;
	bool finished;
	/* --finish found no rotation in progress */
	bool idle;
};

static int casbox_key_mkdir_parent(const char *path, const char **error_r)
{
	const char *p = strrchr(path, '/'), *dir;

	if (p == NULL || p == path)
		return 0;
	dir = t_strdup_until(path, p);
	if (mkdir_parents(dir, 0700) < 0 && errno != EEXIST) {
		*error_r = t_strdup_printf("mkdir(%s) failed: %m", dir);
		return -1;
	}
	return 0;
}

/* Password mode: the user key file, made with the password that only
   stdin can give (read before anything is created). */
static int casbox_key_init_userkey(struct doveadm_mail_cmd_context *ctx,
				   const char *path, int *exit_code_r,
				   const char **error_r)
{
	struct casbox_key_input *input;
	struct casbox_key_line line;
	int ret;

	if (casbox_key_init_read_password(ctx, &input, &line, error_r) < 0) {
		*exit_code_r = EX_USAGE;
		return -1;
	}
	ret = casbox_key_mkdir_parent(path, error_r);
	if (ret == 0 && cas_userkey_create(path, line.data, line.size, NULL,
					   NULL, error_r) < 0)
		ret = -1;
	casbox_key_input_free(&input);
	return ret;
}

/* Returns 0 ok, -1 error (*exit_code_r set). */
static int casbox_key_init(struct doveadm_mail_cmd_context *ctx,
			   struct mail_user *user, const char **path_r,
			   int *exit_code_r, const char **error_r)
{
	struct casbox_settings set;
	struct cas_key_settings key_set;
	struct cas_keyring *keyring;
	struct casbox_admin *adm;
	const char *error;
	bool have_data = FALSE;
	struct stat st;
	int ret;

	*exit_code_r = EX_DATAERR;
	ret = casbox_admin_open(user, &adm, &error);
	if (ret < 0) {
		*error_r = error;
		return -1;
	}
	if (ret > 0) {
		set = adm->set;
		/* the settings' strings go with adm */
		set.key_file = t_strdup(set.key_file);
		ret = casbox_store_has_data(adm->store, &have_data, error_r);
		casbox_admin_close(&adm);
		if (ret < 0)
			return -1;
	} else if (casbox_settings_read(user, pool_datastack_create(), &set,
					&error) < 0) {
		*error_r = error;
		return -1;
	}
	if (set.key_file == NULL) {
		*error_r = "casbox_key_file setting is not set";
		return -1;
	}
	*path_r = set.key_file;
	if (stat(set.key_file, &st) == 0) {
		*error_r = t_strdup_printf("key file %s already exists",
					   set.key_file);
		return -1;
	}
	if (have_data) {
		*error_r = "the store already has data: refusing to create "
			"a key that cannot read it";
		return -1;
	}
	if (set.key_mode == CAS_KEY_MODE_PASSWORD)
		return casbox_key_init_userkey(ctx, set.key_file, exit_code_r,
					       error_r);
	if (casbox_key_mkdir_parent(set.key_file, error_r) < 0)
		return -1;
	casbox_settings_key(&set, &key_set);
	if (cas_keyring_create_mode(&key_set, &keyring, &error) < 0) {
		*error_r = t_strdup_printf("key file %s: %s", set.key_file,
					   error);
		return -1;
	}
	cas_keyring_free(&keyring);
	return 0;
}

static int
cmd_casbox_key_init_run(struct doveadm_mail_cmd_context *ctx,
			struct mail_user *user)
{
	const char *path = "", *error;
	int exit_code;

	if (casbox_key_init(ctx, user, &path, &exit_code, &error) < 0) {
		i_error("casbox key init: %s", error);
		ctx->exit_code = exit_code;
		return -1;
	}
	doveadm_print(path);
	doveadm_print("created");
	return 0;
}

/* Overwrite, sync and unlink the key file: every blob of the store is
   then unreadable (crypto-shredding). */
static int casbox_key_destroy(struct mail_user *user, const char **path_r,
			      const char **error_r)
{
	static const unsigned char zeros[512];
	struct casbox_settings set;
	const char *path, *error;
	unsigned int stale;
	struct stat st;
	off_t pos;
	int fd;

	if (casbox_settings_read(user, pool_datastack_create(), &set,
				 &error) < 0) {
		*error_r = error;
		return -1;
	}
	if (set.key_file == NULL) {
		*error_r = "casbox_key_file setting is not set";
		return -1;
	}
	*path_r = path = set.key_file;
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd == -1) {
		*error_r = t_strdup_printf("open(%s) failed: %m", path);
		return -1;
	}
	if (fstat(fd, &st) < 0) {
		*error_r = t_strdup_printf("fstat(%s) failed: %m", path);
		i_close_fd(&fd);
		return -1;
	}
	for (pos = 0; pos < st.st_size; pos += sizeof(zeros)) {
		if (pwrite_full(fd, zeros, I_MIN(sizeof(zeros),
				(size_t)(st.st_size - pos)), pos) < 0) {
			*error_r = t_strdup_printf("write(%s) failed: %m",
						   path);
			i_close_fd(&fd);
			return -1;
		}
	}
	if (fsync(fd) < 0) {
		*error_r = t_strdup_printf("fsync(%s) failed: %m", path);
		i_close_fd(&fd);
		return -1;
	}
	i_close_fd(&fd);
	if (unlink(path) < 0) {
		*error_r = t_strdup_printf("unlink(%s) failed: %m", path);
		return -1;
	}
	/* and any copy an interrupted key rotate left */
	return cas_keyfile_remove_stale_tmp(path, &stale, error_r) < 0 ? -1 : 0;
}

static int
cmd_casbox_key_destroy_run(struct doveadm_mail_cmd_context *_ctx,
			   struct mail_user *user)
{
	struct casbox_key_cmd_context *ctx =
		container_of(_ctx, struct casbox_key_cmd_context, ctx);
	const char *path = "", *error;

	if (!ctx->yes_destroy) {
		i_error("casbox key destroy makes all of the user's mail "
			"unreadable: add --yes-destroy-all-mail");
		_ctx->exit_code = EX_USAGE;
		return -1;
	}
	if (casbox_key_destroy(user, &path, &error) < 0) {
		i_error("casbox key destroy: %s", error);
		doveadm_mail_failed_error(_ctx, MAIL_ERROR_TEMP);
		return -1;
	}
	doveadm_print(path);
	doveadm_print("destroyed");
	return 0;
}

/* The rotation in progress: its slots' key ids and epochs. A key file
   with two slots but one epoch is a rotation begun before key epochs
   (CASKEY2): --finish completes it (the DEK walk; nothing else was
   rotated). Returns 0 ok, -1 no rotation in progress. */
static int casbox_rotate_get_ids(struct casbox_rotate *rot,
				 const char **error_r)
{
	struct cas_keyring *keyring = rot->adm->keyring;

	rot->new_key_id = cas_keyring_wrap_key_id(keyring);
	rot->new_epoch = cas_keyring_store_epoch(keyring);
	if (!cas_keyring_retiring_key_id(keyring, &rot->old_key_id)) {
		*error_r = "no key rotation in progress";
		return -1;
	}
	if (!cas_keyring_retiring_epoch(keyring, &rot->old_epoch))
		rot->old_epoch = rot->new_epoch;
	return 0;
}

/* key rotate (without --finish), under the LSM write lock (so two
   rotations never both add a slot): unless a rotation is in progress
   already, write the key file with a new random current slot and a new
   random current epoch beside the old ones. From then on every writer
   that refreshes its key ring (each save does, under the write lock)
   writes under the new epoch. */
static int casbox_rotate_begin(struct casbox_rotate *rot,
			       const char **error_r)
{
	struct casbox_admin *adm = rot->adm;
	struct casbox_store_write_lock *lock;
	const char *error;
	unsigned int stale;
	int ret = 0;


	if (casbox_store_write_lock(adm->store, &lock, error_r) < 0)
		return -1;
	/* a run killed while writing the key file leaves its temporary
	   file (key material) behind: only rotation writes this file, and
	   the lock keeps other rotations out */
	if (cas_keyfile_remove_stale_tmp(adm->set.key_file, &stale,
					 error_r) < 0 ||
	    casbox_admin_refresh_keys(adm, error_r) < 0)
		ret = -1;
	else if (stale > 0) {
		i_info("casbox key rotate: %s: removed %u temporary key "
		       "file(s) left by an interrupted run", rot->user, stale);
	}
	if (ret == 0 && cas_keyring_slot_count(adm->keyring) == 1 &&
	    cas_keyring_epoch_count(adm->keyring) == 1) {
		rot->slot_added = TRUE;
		cas_keyring_rotate_add(adm->keyring);
		if (cas_keyring_save(adm->keyring, adm->set.key_file,
				     &error) < 0) {
			*error_r = t_strdup_printf("writing key file %s: %s",
						   adm->set.key_file, error);
			ret = -1;
		}
	}
	casbox_store_write_unlock(&lock);
	if (ret < 0)
		return -1;
	return casbox_rotate_get_ids(rot, error_r);
}

/* Step 2: rewrap every blob record still under the old key id, one LSM
   batch of at most rot->batch records at a time. */
static int casbox_rotate_walk(struct casbox_rotate *rot,
			      const char **error_r)
{
	buffer_t *pos = t_buffer_create(64);
	struct casbox_rekey_stats before;
	struct event *event;
	uint64_t examined;
	int ret;

	do {
		before = rot->stats;
		event = event_create(rot->adm->event);
		ret = casbox_rekey_step(rot->adm->lsm, rot->adm->packs,
					rot->adm->keyring,
					rot->old_key_id, rot->batch, pos,
					NULL, NULL, &rot->stats, error_r);
		if (ret < 0) {
			event_unref(&event);
			return -1;
		}
		rot->steps++;
		examined = rot->stats.examined - before.examined;
		e_debug(event_create_passthrough(event)->
			set_name("casbox_key_rotate_batch_finished")->
			add_int("batch", rot->steps)->
			add_int("examined", examined)->
			add_int("rewrapped",
				rot->stats.rewrapped - before.rewrapped)->
			add_int("failed", rot->stats.failed - before.failed)->
			event(), "casbox key rotate: batch %u: %"PRIu64
			" examined", rot->steps, examined);
		event_unref(&event);
		casbox_admin_progress_line(ret == 0,
			"key rotate: %"PRIu64" blob keys rewrapped, batch %u",
			rot->stats.rewrapped, rot->steps);
		if (casbox_rotate_verbose()) {
			casbox_admin_progress_end();
			/* tests synchronise on these lines */
			i_info("casbox key rotate: %s: batch %u: "
			       "%"PRIu64" rewrapped, %"PRIu64" in total",
			       rot->user, rot->steps,
			       rot->stats.rewrapped - before.rewrapped,
			       rot->stats.rewrapped);
		}
	} while (ret > 0);
	casbox_admin_progress_end();
	return 0;
}

/* Step 3, under the LSM write lock: if no blob record names the old key
   id any more, write the key file without the old slot. Every writer
   that wraps a new DEK reloads the key file under this lock first, so
   none can add an old-key record after the count. Returns 1 done, 0
   records left (rot->left), -1 error. */
static int casbox_rotate_finish(struct casbox_rotate *rot,
				const char **error_r)
{
	struct casbox_admin *adm = rot->adm;
	struct casbox_store_write_lock *lock;
	uint64_t foreign;
	uint32_t old_key_id;
	const char *error;
	int ret = 1;

	if (casbox_store_write_lock(adm->store, &lock, error_r) < 0)
		return -1;
	if (casbox_admin_refresh_keys(adm, error_r) < 0)
		ret = -1;
	else if (cas_keyring_slot_count(adm->keyring) == 1 &&
		 cas_keyring_epoch_count(adm->keyring) == 1 &&
		 cas_keyring_wrap_key_id(adm->keyring) == rot->new_key_id) {
		/* a concurrent run of key rotate finished this rotation */
		rot->finished = TRUE;
	} else if (!cas_keyring_retiring_key_id(adm->keyring, &old_key_id) ||
		   old_key_id != rot->old_key_id ||
		   cas_keyring_wrap_key_id(adm->keyring) != rot->new_key_id) {
		*error_r = "the key file changed during the rotation "
			"(another key rotate?)";
		ret = -1;
	} else if (casbox_rekey_count(adm->lsm, adm->keyring, old_key_id,
				      &rot->left, &foreign, error_r) < 0) {
		ret = -1;
	} else if (rot->left > 0) {
		ret = 0;
	} else {
		if (foreign > 0) {
			i_warning("casbox key rotate: %s: %"PRIu64" blob "
				  "record(s) wrapped by neither key slot "
				  "(unreadable before and after; see "
				  "doveadm casbox scrub)", rot->user, foreign);
		}
		/* the old slot and epoch go; cas_keyring_save() shreds the
		   replaced file */
		cas_keyring_rotate_finish(adm->keyring);
		if (cas_keyring_save(adm->keyring, adm->set.key_file,
				     &error) < 0) {
			*error_r = t_strdup_printf("writing key file %s: %s",
						   adm->set.key_file, error);
			ret = -1;
		} else {
			rot->finished = TRUE;
		}
	}
	casbox_store_write_unlock(&lock);
	return ret;
}

/* --finish step "deks": rewrap every blob record's DEK under the new
   slot (the walk above; the last step checks again under the lock). */
static int casbox_finish_deks(struct casbox_rotate *rot,
			      const char **error_r)
{
	return casbox_rotate_walk(rot, error_r);
}

/* --finish step "metadata": the sealed BODYSTRUCTURE/ENVELOPE of every
   message record (inline or the shared 's' record it names) and the
   message records' MACs, in LSM batches of rot->batch. */
static int casbox_finish_meta(struct casbox_rotate *rot,
			      const char **error_r)
{
	buffer_t *pos = t_buffer_create(64);
	unsigned int batches = 0;
	int ret;

	do {
		ret = casbox_rekey_meta_step(rot->adm->store, rot->batch, pos,
					     &rot->reseal, error_r);
		if (ret < 0)
			return -1;
		batches++;
		casbox_admin_progress_line(ret == 0,
			"key rotate: %"PRIu64" records with sealed metadata "
			"re-sealed, batch %u", rot->reseal.rewrapped, batches);
	} while (ret > 0);
	casbox_admin_progress_end();
	return 0;
}

/* --finish step "record-macs": every other authenticated LSM record
   (flags, retained, shared metadata and its refcount, the records
   marker) MACed under the new epoch's record key. */
static int casbox_finish_macs(struct casbox_rotate *rot,
			      const char **error_r)
{
	buffer_t *pos = t_buffer_create(64);
	unsigned int batches = 0;
	int ret;

	do {
		ret = casbox_rekey_records_step(rot->adm->store, rot->batch,
						pos, &rot->reseal, error_r);
		if (ret < 0)
			return -1;
		batches++;
		casbox_admin_progress_line(ret == 0,
			"key rotate: %"PRIu64" records re-sealed, batch %u",
			rot->reseal.rewrapped, batches);
	} while (ret > 0);
	casbox_admin_progress_end();
	return 0;
}

/* --finish step "lsm-tables": the LSM's tables, WAL and MANIFEST sealed
   under the new epoch's LSM key. Last of the re-seal steps: the steps
   before it write records, which land in the WAL and get flushed into
   tables sealed under the new epoch anyway, but a table merged before
   them may still be of the old one. */
static int casbox_finish_lsm(struct casbox_rotate *rot,
			     const char **error_r)
{
	return casbox_rekey_lsm(rot->adm->store, error_r);
}

/* --finish step "dictionaries": packs/dict-*.cbd. */
static int casbox_finish_dicts(struct casbox_rotate *rot,
			       const char **error_r)
{
	return casbox_rekey_dicts(rot->adm->packs, &rot->reseal, error_r);
}

/* --finish step "packs": what gc --all does: every live blob copied
   under a fresh DEK (new slot), every meta record it keeps (recovery
   records, DEK updates, mailbox records) re-sealed under the new epoch
   on the way (casbox_pack_txn_add_meta_sealed()), the old packs
   unlinked. rebuild --from-packs then needs the new epoch only. gc
   keeps a pack that a save appended to or deduplicated onto while it
   copied, so it runs again (up to CASBOX_ROTATE_MAX_GC_RUNS times)
   until no pack that existed when the step began is left: packs
   created since hold only what was written under the new epoch. */
static int casbox_finish_packs(struct casbox_rotate *rot,
			       const char **error_r)
{
	struct casbox_store_gc_stats stats;
	struct file_lock *lock = NULL;
	uint32_t oldest, newest, last_before;
	unsigned int runs;
	int ret;

	if (casbox_rekey_oldest_pack(rot->adm->packs, &oldest, &last_before,
				     error_r) < 0)
		return -1;
	if (last_before == 0)
		return 0;
	ret = casbox_store_maintenance_lock(rot->adm->store, TRUE,
					    CASBOX_MAINTENANCE_LOCK_SECS,
					    &lock, error_r);
	if (ret == 0)
		*error_r = "another gc or scrub holds the maintenance lock";
	if (ret <= 0)
		return -1;
	for (runs = 0; runs < CASBOX_ROTATE_MAX_GC_RUNS; ) {
		i_zero(&stats);
		if (casbox_store_gc(rot->adm->store, TRUE, &stats,
				    error_r) < 0) {
			ret = -1;
			break;
		}
		runs++;
		if (casbox_rekey_oldest_pack(rot->adm->packs, &oldest,
					     &newest, error_r) < 0) {
			ret = -1;
			break;
		}
		if (casbox_rotate_verbose()) {
			i_info("casbox key rotate: %s: packs: %"PRIu64" blobs "
			       "moved, %"PRIu64" of %"PRIu64" packs "
			       "rewritten", rot->user, stats.blobs_moved,
			       stats.packs_deleted, stats.packs_selected);
		}
		if (oldest == 0 || oldest > last_before)
			break;
	}
	if (ret > 0 && runs == CASBOX_ROTATE_MAX_GC_RUNS &&
	    oldest != 0 && oldest <= last_before) {
		*error_r = t_strdup_printf("gc kept pack %u, which holds "
			"records of the old key epoch, in %u runs (saves "
			"deduplicated onto it, or damaged blobs: see the "
			"warnings above); the old epoch stays, nothing is "
			"lost: run key rotate --finish again", oldest, runs);
		ret = -1;
	}
	file_lock_free(&lock);
	return ret < 0 ? -1 : 0;
}

/* The steps of key rotate --finish, in order. Each re-seals one kind of
   thing the old epoch protects and is idempotent (what is under the new
   epoch is left alone), so a run killed anywhere redoes at most the step
   it was in: the durable progress marker (casbox_rekey_progress_write())
   names the last step done. A step whose run is NULL holds the place of
   one still to come; the run goes past it. After the last one, the old
   slot and epoch are dropped from the key file (casbox_rotate_finish()),
   and the marker is removed. */
struct casbox_finish_step {
	const char *name;
	int (*run)(struct casbox_rotate *rot, const char **error_r);
};
static const struct casbox_finish_step casbox_finish_steps[] = {
	{ "deks", casbox_finish_deks },
	{ "metadata", casbox_finish_meta },
	{ "record-macs", casbox_finish_macs },
	{ "dictionaries", casbox_finish_dicts },
	{ "packs", casbox_finish_packs },
	/* "fts": the casidx segments sealed under the old epoch. The admin
	   runs doveadm fts optimize between key rotate and --finish
	   (casidx_index_reseal(); doc/doveadm.md): this plugin does not
	   link casidx, so the step only holds the place. An index not
	   re-sealed is rebuilt after the drop (one error line per index). */
	{ "fts", NULL },
	{ "lsm-tables", casbox_finish_lsm },
};

/* Index of the first step after the one named done (0: from the
   start). */
static unsigned int casbox_finish_first_step(const char *done)
{
	unsigned int i;

	if (done == NULL)
		return 0;
	for (i = 0; i < N_ELEMENTS(casbox_finish_steps); i++) {
		if (strcmp(casbox_finish_steps[i].name, done) == 0)
			return i + 1;
	}
	/* a step this build does not know: start over (idempotent) */
	return 0;
}

/* key rotate --finish. Returns 0 ok, -1 error with *data_error_r
   telling a damaged store (records that do not rewrap) from a failure
   worth retrying. */
static int casbox_rotate_run(struct casbox_rotate *rot, bool *data_error_r,
			     const char **error_r)
{
	const struct casbox_finish_step *step;
	const char *done, *error;
	unsigned int walks, i;
	bool fsync = rot->adm->fsync_mode != FSYNC_MODE_NEVER;
	int ret;

	*data_error_r = FALSE;
	if (casbox_admin_open_keys(rot->adm, error_r) < 0) {
		*data_error_r = TRUE;
		return -1;
	}
	if (casbox_admin_refresh_keys(rot->adm, error_r) < 0)
		return -1;
	if (cas_keyring_slot_count(rot->adm->keyring) == 1 &&
	    cas_keyring_epoch_count(rot->adm->keyring) == 1) {
		/* nothing in progress (or a concurrent run finished it) */
		rot->idle = TRUE;
		rot->new_key_id = rot->old_key_id =
			cas_keyring_wrap_key_id(rot->adm->keyring);
		rot->new_epoch = rot->old_epoch =
			cas_keyring_store_epoch(rot->adm->keyring);
		rot->finished = TRUE;
		return casbox_rekey_progress_remove(rot->adm->root_dir,
						    error_r);
	}
	if (casbox_rotate_get_ids(rot, error_r) < 0)
		return -1;
	ret = casbox_rekey_progress_read(rot->adm->root_dir, rot->new_epoch,
					 &done, error_r);
	if (ret < 0) {
		*data_error_r = TRUE;
		return -1;
	}
	for (i = casbox_finish_first_step(done);
	     i < N_ELEMENTS(casbox_finish_steps); i++) {
		step = &casbox_finish_steps[i];
		if (step->run != NULL && step->run(rot, &error) < 0) {
			*error_r = t_strdup_printf("step %s: %s",
						   step->name, error);
			return -1;
		}
		if (casbox_rekey_progress_write(rot->adm->root_dir,
						rot->new_epoch, step->name,
						fsync, error_r) < 0)
			return -1;
		if (casbox_rotate_verbose()) {
			/* tests synchronise on these lines */
			i_info("casbox key rotate: %s: step %s done",
			       rot->user, step->name);
		}
	}
	for (walks = 0; walks < CASBOX_ROTATE_MAX_WALKS; walks++) {
		if ((ret = casbox_rotate_finish(rot, error_r)) != 0) {
			if (ret < 0)
				return -1;
			return casbox_rekey_progress_remove(
				rot->adm->root_dir, error_r);
		}
		/* records that did not rewrap stay: walking again would
		   not change that */
		if (rot->stats.failed > 0)
			break;
		/* blob records a save wrapped before it saw the new slot */
		if (casbox_rotate_walk(rot, error_r) < 0)
			return -1;
	}
	*data_error_r = TRUE;
	*error_r = t_strdup_printf("%"PRIu64" blob record(s) still use the "
		"old key id %08x (%"PRIu64" did not unwrap: damaged); the "
		"key file keeps both slots and epochs, nothing is lost",
		rot->left, rot->old_key_id, rot->stats.failed);
	return -1;
}

/* key rotate without --finish: start a new epoch. Returns 0 ok, -1. */
static int casbox_rotate_start(struct casbox_rotate *rot, bool *data_error_r,
			       const char **error_r)
{
	*data_error_r = FALSE;
	if (casbox_admin_open_keys(rot->adm, error_r) < 0) {
		*data_error_r = TRUE;
		return -1;
	}
	return casbox_rotate_begin(rot, error_r);
}

/* Send casbox_key_rotate_finished (doc/events.md). */
static void casbox_rotate_event(struct casbox_rotate *rot, const char *error)
{
	struct event_passthrough *e;

	e = event_create_passthrough(rot->adm->event)->
		set_name("casbox_key_rotate_finished")->
		add_str("old_key_id", t_strdup_printf("%08x", rot->old_key_id))->
		add_str("new_key_id", t_strdup_printf("%08x", rot->new_key_id))->
		add_int("old_epoch", rot->old_epoch)->
		add_int("new_epoch", rot->new_epoch)->
		add_int("slot_added", rot->slot_added ? 1 : 0)->
		add_int("batches", rot->steps)->
		add_int("examined", rot->stats.examined)->
		add_int("rewrapped", rot->stats.rewrapped)->
		add_int("failed", rot->stats.failed)->
		add_int("left", rot->left);
	if (error != NULL)
		e->add_str("error", error);
	e_debug(e->event(), "casbox key rotate: %s: %s", rot->user,
		error == NULL ? "rotated" : error);
}

static int
cmd_casbox_key_rotate_run(struct doveadm_mail_cmd_context *_ctx,
			  struct mail_user *user)
{
	struct casbox_key_cmd_context *ctx =
		container_of(_ctx, struct casbox_key_cmd_context, ctx);
	struct casbox_rotate rot;
	const char *error;
	bool data_error;
	int ret;

	i_zero(&rot);
	rot.user = user->username;
	rot.batch = ctx->batch != 0 ? ctx->batch : CASBOX_ROTATE_DEFAULT_BATCH;
	ret = casbox_admin_open(user, &rot.adm, &error);
	if (ret <= 0) {
		return casbox_admin_open_failed(_ctx, "casbox key rotate",
						user, ret, error);
	}
	if (rot.adm->set.key_mode == CAS_KEY_MODE_PASSWORD) {
		/* DEKs are sealed to the user's key pair, and replacing the
		   pair needs the password */
		i_error("casbox key rotate: casbox_key_mode is password: "
			"rotation of a user key pair is not implemented "
			"yet (doc/threat-model.md)");
		_ctx->exit_code = EX_CONFIG;
		casbox_admin_close(&rot.adm);
		return -1;
	}
	if (ctx->finish)
		ret = casbox_rotate_run(&rot, &data_error, &error);
	else
		ret = casbox_rotate_start(&rot, &data_error, &error);
	/* one event per rotation, when --finish ends it (or fails) */
	if (ctx->finish || ret < 0)
		casbox_rotate_event(&rot, ret < 0 ? error : NULL);
	if (ret < 0) {
		i_error("casbox key rotate: %s: %s", rot.adm->root_dir, error);
		if (data_error)
			_ctx->exit_code = EX_DATAERR;
		else
			doveadm_mail_failed_error(_ctx, MAIL_ERROR_TEMP);
	} else {
		doveadm_print(rot.adm->set.key_file);
		doveadm_print(t_strdup_printf("%08x", rot.old_key_id));
		doveadm_print(t_strdup_printf("%08x", rot.new_key_id));
		doveadm_print_num(rot.old_epoch);
		doveadm_print_num(rot.new_epoch);
		doveadm_print_num(rot.stats.rewrapped);
		doveadm_print_num(rot.reseal.rewrapped);
		doveadm_print_num(rot.steps);
		doveadm_print(!ctx->finish ?
			      (rot.slot_added ? "started" : "in progress") :
			      (rot.idle ? "nothing to finish" : "rotated"));
	}
	casbox_admin_close(&rot.adm);
	return ret;
}

static void cmd_casbox_key_init(struct doveadm_mail_cmd_context *ctx
				ATTR_UNUSED CASBOX_DOVEADM_INIT_PARAMS)
{
	doveadm_print_header_simple("key_file");
	doveadm_print_header_simple("result");
}

static bool cmd_casbox_key_parse_arg(struct doveadm_mail_cmd_context *_ctx,
				     int c)
{
	struct casbox_key_cmd_context *ctx =
		container_of(_ctx, struct casbox_key_cmd_context, ctx);

	switch (c) {
	case 'y':
		ctx->yes_destroy = TRUE;
		return TRUE;
	case 'e':
		/* --finish ('F' is doveadm's --user-file) */
		ctx->finish = TRUE;
		return TRUE;
	case 'b':
		if (str_to_uint(optarg, &ctx->batch) < 0 || ctx->batch == 0) {
			/* before any store is opened; doveadm would only
			   warn about a rejected parameter and go on */
			i_fatal_status(EX_USAGE, "casbox key rotate: --batch "
				       "wants a positive number, not '%s'",
				       optarg);
		}
		return TRUE;
	default:
		return FALSE;
	}
}

static struct doveadm_mail_cmd_context *
cmd_casbox_key_alloc(int (*run)(struct doveadm_mail_cmd_context *,
				struct mail_user *))
{
	struct casbox_key_cmd_context *ctx;

	ctx = doveadm_mail_cmd_alloc(struct casbox_key_cmd_context);
	casbox_doveadm_set_parse_arg(&ctx->ctx, "y", cmd_casbox_key_parse_arg);
	ctx->ctx.v.init = cmd_casbox_key_init;
	ctx->ctx.v.run = run;
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return &ctx->ctx;
}

struct doveadm_mail_cmd_context *cmd_casbox_key_init_alloc(void)
{
	return cmd_casbox_key_alloc(cmd_casbox_key_init_run);
}

struct doveadm_mail_cmd_context *cmd_casbox_key_destroy_alloc(void)
{
	return cmd_casbox_key_alloc(cmd_casbox_key_destroy_run);
}

static void cmd_casbox_key_rotate_init(struct doveadm_mail_cmd_context *ctx
				       ATTR_UNUSED CASBOX_DOVEADM_INIT_PARAMS)
{
	doveadm_print_header_simple("key_file");
	doveadm_print_header_simple("old_key_id");
	doveadm_print_header_simple("new_key_id");
	doveadm_print_header("old_epoch", "old_epoch",
			     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	doveadm_print_header("new_epoch", "new_epoch",
			     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	doveadm_print_header("rewrapped", "rewrapped",
			     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	doveadm_print_header("resealed", "resealed",
			     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	doveadm_print_header("batches", "batches",
			     DOVEADM_PRINT_HEADER_FLAG_RIGHT_JUSTIFY);
	doveadm_print_header_simple("result");
}

struct doveadm_mail_cmd_context *cmd_casbox_key_rotate_alloc(void)
{
	struct doveadm_mail_cmd_context *ctx;

	ctx = cmd_casbox_key_alloc(cmd_casbox_key_rotate_run);
	casbox_doveadm_set_parse_arg(ctx, "b:e", cmd_casbox_key_parse_arg);
	ctx->v.init = cmd_casbox_key_rotate_init;
	return ctx;
}

/* doveadm casbox key export-public: the password-mode user key's
   public half (what LMTP seals DEKs to), e.g. to check which key pair a
   key file holds without the password. Server mode has no public key. */
static int
cmd_casbox_key_export_public_run(struct doveadm_mail_cmd_context *ctx,
				 struct mail_user *user)
{
	unsigned char pk[CAS_USERKEY_PUBLIC_KEY_SIZE];
	struct casbox_settings set;
	struct cas_userkey *key;
	const char *error;
	int ret;

	if (casbox_settings_read(user, pool_datastack_create(), &set,
				 &error) < 0) {
		i_error("casbox key export-public: %s", error);
		ctx->exit_code = EX_CONFIG;
		return -1;
	}
	if (set.key_mode != CAS_KEY_MODE_PASSWORD) {
		i_error("casbox key export-public: casbox_key_mode is %s: "
			"only a password-mode user key has a public key",
			cas_key_mode_name(set.key_mode));
		ctx->exit_code = EX_CONFIG;
		return -1;
	}
	if (set.key_file == NULL) {
		i_error("casbox key export-public: "
			"casbox_key_file setting is not set");
		ctx->exit_code = EX_CONFIG;
		return -1;
	}
	ret = cas_userkey_load_public(set.key_file, &key, &error);
	if (ret <= 0) {
		i_error("casbox key export-public: %s", ret < 0 ? error :
			t_strdup_printf("key file %s does not exist (key "
					"init, or the user's first login, "
					"creates it)", set.key_file));
		ctx->exit_code = ret < 0 ? EX_DATAERR : EX_NOINPUT;
		return -1;
	}
	cas_userkey_public_key(key, pk);
	doveadm_print(set.key_file);
	doveadm_print(t_strdup_printf("%08x", cas_userkey_key_id(key)));
	doveadm_print(binary_to_hex(pk, sizeof(pk)));
	cas_userkey_free(&key);
	return 0;
}

static void
cmd_casbox_key_export_public_init(struct doveadm_mail_cmd_context *ctx
				  ATTR_UNUSED CASBOX_DOVEADM_INIT_PARAMS)
{
	doveadm_print_header_simple("key_file");
	doveadm_print_header_simple("key_id");
	doveadm_print_header_simple("public_key");
}

struct doveadm_mail_cmd_context *cmd_casbox_key_export_public_alloc(void)
{
	struct doveadm_mail_cmd_context *ctx;

	ctx = doveadm_mail_cmd_alloc(struct doveadm_mail_cmd_context);
	ctx->v.init = cmd_casbox_key_export_public_init;
	ctx->v.run = cmd_casbox_key_export_public_run;
	doveadm_print_init(DOVEADM_PRINT_TYPE_TABLE);
	return ctx;
}
