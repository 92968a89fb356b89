#ifndef DOVEADM_CASBOX_H
#define DOVEADM_CASBOX_H

/* doveadm casbox: what the commands share. The commands open a user's
   casbox store directly (their own LSM handle, key ring and pack store)
   instead of going through lib-storage, so they can see every record and
   every pack frame. See doc/doveadm.md. */

#include "fsync-mode.h"
#include "file-lock.h"
#include "casbox-settings.h"
#include "casbox-records.h"
struct casbox_pack_store;
#include "casbox-store.h"
#include "casbox-store-census.h"
#include "casbox-store-progress.h"

struct mail_user;
struct mailbox_list;
struct casbox_lsm;
struct istream;
struct doveadm_mail_cmd_context;

/* How long gc and scrub wait for the store's maintenance lock (held by
   another gc or scrub of the same store) before they give up (exit 75). */
#define CASBOX_MAINTENANCE_LOCK_SECS 3600

struct casbox_admin {
	pool_t pool;
	/* NULL when opened with casbox_admin_open_root() */
	struct mail_user *user;
	pool_t set_pool;
	/* the casbox root of the user's casbox namespace */
	const char *root_dir;
	struct casbox_settings set;
	enum fsync_mode fsync_mode;
	enum file_lock_method lock_method;

	/* the storage layer's handle; the fields below are its parts */
	struct casbox_store *store;
	struct casbox_lsm *lsm;
	/* password mode: the user's password, set before
	   casbox_admin_open_keys() of an admin opened without its LSM
	   (rebuild --from-packs), which then unlocks the user key. Not
	   owned (the caller wipes it); never logged. NULL: the public part
	   only. */
	const char *key_password;
	/* NULL until casbox_admin_open_keys() */
	struct cas_keyring *keyring;
	struct casbox_pack_store *packs;
	/* created at open (the duration of the command's named events,
	   doc/events.md); a child of the user's event with the casbox
	   category, or parentless for casbox_admin_open_root() */
	struct event *event;
};

/* Open the store of user's casbox namespace. Returns 1 ok, 0 the user
   has no store yet (error_r says so), -1 error (e.g. no casbox
   namespace). */
int casbox_admin_open(struct mail_user *user, struct casbox_admin **adm_r,
		      const char **error_r);
struct doveadm_mail_cmd_context;
/* A command's casbox_admin_open() returned ret <= 0 with error. For one
   user (-u) that fails the command: EX_NOUSER for "no store", else
   EX_TEMPFAIL. Over all users (-A, -F) a user without a store or
   without a casbox namespace is skipped (a new user has no store yet,
   a mixed site has users on other formats): returns 0 then, -1 when
   the command failed. */
int casbox_admin_open_failed(struct doveadm_mail_cmd_context *ctx,
			     const char *cmd, struct mail_user *user,
			     int ret, const char *error);
/* Open the store at root_dir (what casbox_admin_open() does once it has
   found the root and the settings; set is copied, its strings must
   outlive the handle). Same returns. */
int casbox_admin_open_root(const char *root_dir,
			   const struct casbox_settings *set,
			   enum fsync_mode fsync_mode,
			   enum file_lock_method lock_method,
			   struct casbox_admin **adm_r, const char **error_r);
/* As casbox_admin_open*() but without opening the LSM (adm->lsm stays
   NULL; the store needs its packs/ directory): for rebuild
   --from-packs, where the LSM may be missing or unreadable. */
int casbox_admin_open_nolsm(struct mail_user *user,
			    struct casbox_admin **adm_r,
			    const char **error_r);
int casbox_admin_open_root_full(const char *root_dir,
				const struct casbox_settings *set,
				enum fsync_mode fsync_mode,
				enum file_lock_method lock_method,
				bool open_lsm, struct casbox_admin **adm_r,
				const char **error_r);
/* Load the key ring of the configured key mode (it must be the store's
   key; see key_password above) and open the packs. Returns 1 ok, -1
   error (a wrong password says "wrong password"). */
int casbox_admin_open_keys(struct casbox_admin *adm, const char **error_r);
/* Reload the key ring if key rotation rewrote the key file (the same
   root only). Needs casbox_admin_open_keys(). Returns 0 ok, -1 error. */
int casbox_admin_refresh_keys(struct casbox_admin *adm, const char **error_r);
/* Without the key: open the packs for the keyless frame scan only
   (casbox_census_scan_packs(); no blob can be decoded). Returns 1 ok,
   0 not possible (the store has dictionaries, which are sealed with the
   key), -1 error. */
int casbox_admin_open_packs_keyless(struct casbox_admin *adm,
				    const char **error_r);
void casbox_admin_close(struct casbox_admin **adm);

const char *casbox_admin_pack_path(struct casbox_admin *adm,
				   uint32_t pack_id);
/* Bytes of all files under dir (recursively). */
uint64_t casbox_admin_dir_size(const char *dir);

/* Add (or with add=FALSE remove) keyword on the messages (vname, uid)
   through lib-storage, so the index, IMAP clients and the LSM mirror
   all get it. uids[i] belongs to mailbox vnames[i], grouped by mailbox;
   a message that is gone is skipped. changed_r[i] says whether message
   i changed. Returns the number changed, -1 error. */
int casbox_admin_set_keyword(struct mail_user *user, const char *keyword,
			     bool add, const char *const *vnames,
			     const uint32_t *uids, unsigned int count,
			     bool *changed_r, const char **error_r);

/* Command allocators (one file each). */
struct doveadm_mail_cmd_context *cmd_casbox_stats_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_upload_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_scrub_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_gc_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_upgrade_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_undelete_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_key_init_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_key_destroy_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_key_rotate_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_key_export_public_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_key_password_alloc(void);
struct doveadm_mail_cmd_context *cmd_casbox_rebuild_alloc(void);

/* rebuild --from-packs (doveadm-casbox-frompacks.c). */
int casbox_frompacks_run(struct doveadm_mail_cmd_context *ctx,
			 struct mail_user *user);
void casbox_frompacks_init_header(void);
/* Force-resync one mailbox (doveadm-casbox-rebuild.c). Returns the
   message count, -1 failed (error_r set). */
int casbox_rebuild_mailbox(struct mailbox_list *list, const char *vname,
			   const char **error_r);
struct doveadm_mail_cmd_context *cmd_casbox_dict_train_alloc(void);

/* Passwords on a command's input (doveadm-casbox-keyinput.c): the
   bytes live in sodium_malloc()ed memory, wiped when freed, and are
   never logged; error strings never quote them. */
#define CASBOX_KEY_INPUT_MAX 4096
struct casbox_key_input {
	unsigned char *data;
	size_t size;
};
/* One line of input, pointing into the input's data: without its
   "\n" or "\r\n", not NUL-terminated. */
struct casbox_key_line {
	const unsigned char *data;
	size_t size;
};
/* Read fd (or stream) to EOF, at most CASBOX_KEY_INPUT_MAX bytes.
   Returns 0 ok, -1 error (I/O, too long). */
int casbox_key_input_read_fd(int fd, struct casbox_key_input **input_r,
			     const char **error_r);
int casbox_key_input_read_stream(struct istream *stream,
				 struct casbox_key_input **input_r,
				 const char **error_r);
void casbox_key_input_free(struct casbox_key_input **input);
/* Split the input into exactly count lines (names[i] says what line i
   is, for errors; NULL-terminated). Each line ends at "\n" (the last
   one also at the end of input) and loses one trailing "\r". Returns 0
   ok, -1 no input, fewer or more lines, an empty line or one with a
   NUL byte. */
int casbox_key_input_lines(const struct casbox_key_input *input,
			   const char *const *names,
			   struct casbox_key_line *lines_r,
			   unsigned int count, const char **error_r);
/* line (from casbox_key_input_lines() on input) as a C string, in place:
   its line end becomes the terminating NUL. Valid until the input is
   freed, and wiped with it. */
const char *casbox_key_line_str(struct casbox_key_input *input,
				const struct casbox_key_line *line);

/* key init in password mode (doveadm-casbox-keypw.c): read the initial
   password (one line) from stdin; line_r points into *input_r, which
   the caller frees. Only a local command for one user: with -A, -F, a
   wildcard or over a doveadm server it fails. Returns 0 ok, -1 error
   (a usage error: nothing was read or nothing usable). */
int casbox_key_init_read_password(struct doveadm_mail_cmd_context *ctx,
				  struct casbox_key_input **input_r,
				  struct casbox_key_line *line_r,
				  const char **error_r);
/* Password mode (rebuild --from-packs, undelete): read the user's
   password, one line, from a local doveadm's stdin. Refused (EX_USAGE)
   for several users, over a doveadm server (-S) and from a terminal;
   unusable input is EX_NOINPUT. On failure logs "cmd: root_dir: ..."
   (never the input) and sets ctx->exit_code. Returns 0 ok (password_r
   points into *input_r, which the caller frees, wiping it), -1 error. */
int casbox_key_read_user_password(struct doveadm_mail_cmd_context *ctx,
				  const char *cmd, const char *root_dir,
				  struct casbox_key_input **input_r,
				  const char **password_r);

#endif
