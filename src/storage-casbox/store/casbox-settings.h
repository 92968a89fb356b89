#ifndef CASBOX_SETTINGS_H
#define CASBOX_SETTINGS_H

/* casbox plugin {} settings; see doc/settings.md. */

#include "cas-keymode.h"
#include "cas-aead.h"

struct mail_user;

#define CASBOX_DEFAULT_PART_SPLIT_SIZE (64 * 1024)
#define CASBOX_DEFAULT_METADATA_MIN_SIZE (32 * 1024)
#define CASBOX_DEFAULT_PACK_SIZE (64 * 1024 * 1024)
#define CASBOX_DEFAULT_ZSTD_LEVEL 3
#define CASBOX_DEFAULT_GC_DEAD_RATIO 30
/* A store trains its first compression dictionary (header blocks only)
   once it holds this many small blobs: the dictionary file itself
   (1/16 of its samples, 8-64 KiB) costs a store of a few hundred small
   messages more than it saves (doc/benchmarks.md, "Dictionaries"). */
#define CASBOX_DEFAULT_DICT_AUTOTRAIN 500
/* fewer small blobs are too few to train on (10 samples, 3 held out) */
#define CASBOX_DICT_AUTOTRAIN_MIN 20
/* Every LMTP delivery opens the store and replays the whole WAL, so the
   WAL flushes into a table much sooner than the LSM's own default (4 MiB,
   LevelDB's write buffer), which suits one long-lived handle. */
#define CASBOX_DEFAULT_LSM_WAL_SIZE (64 * 1024)
/* Per process, as Dovecot's own index caches are: a server runs an imap
   process per session, so a quarter of the LSM library's 8 MiB (the
   lookups of a big COPY or FETCH miss it either way). */
#define CASBOX_DEFAULT_LSM_CACHE_SIZE (2 * 1024 * 1024)
/* Decoded bases of cross-message deltas, in locked memory per process
   (blob/casbox-base-cache.h). */
#define CASBOX_DEFAULT_BASE_CACHE_SIZE (2 * 1024 * 1024)
/* LMTP/LDA deliveries of a message already delivered to the same
   mailbox this recently are acknowledged without a second copy
   (doc/casbox-storage.md, "Duplicate deliveries"): one day covers an
   MTA's retries after a lost reply. */
#define CASBOX_DEFAULT_DUPLICATE_WINDOW (24 * 60 * 60)
/* Expunged mail stays restorable this long (0 = released at once, as
   before): off by default, since it keeps deleted mail on disk. */
#define CASBOX_DEFAULT_EXPUNGE_RETENTION 0

struct casbox_settings {
	/* Path of the user's key file (%-variables already expanded by
	   Dovecot, ~/ expanded here). NULL when unset. */
	const char *key_file;
	/* Create the key file if it is missing and the store is empty. */
	bool key_autocreate;
	/* casbox_key_mode: server (default) or password */
	enum cas_key_mode key_mode;
	/* casbox_key_password (password mode; userdb field set from %w at
	   login). NULL when this process has none. Never logged. */
	const char *key_password;
	int zstd_level;
	/* MIME leaf bodies at least this large become their own blob. */
	uoff_t part_split_size;
	/* Messages smaller than this get no sealed BODYSTRUCTURE/ENVELOPE
	   metadata (reads parse their bytes); 0 = every message. */
	uoff_t metadata_min_size;
	/* Packs rotate past this size. */
	uoff_t pack_size;
	/* casbox_pack_storage: where sealed packs go (dir:/rados:/s3:...,
	   blob/casbox-objstore.h); NULL = they stay local. */
	const char *pack_storage;
	/* Read cache of packs in object storage: directory (NULL =
	   <root>/packs/cache) and bound (0 = 1 GiB). */
	const char *pack_cache_dir;
	uoff_t pack_cache_size;
	/* gc rewrites a pack when this percentage of it is dead. */
	unsigned int gc_dead_ratio;
	/* Train the first compression dictionary once the store holds
	   this many small blobs (0 = only doveadm casbox dict train). */
	unsigned int dict_autotrain;
	/* The LSM's WAL is flushed to a sorted table past this size
	   (0 = the LSM library's default). */
	uoff_t lsm_wal_size;
	/* Bounds of the process's LSM block cache and decoded base
	   cache (memory, bytes). */
	uoff_t lsm_cache_size;
	uoff_t base_cache_size;
	/* Let Dovecot's dovecot.index.cache keep headers, envelopes and
	   BODYSTRUCTUREs. They are plaintext, so the default is no: those
	   are then parsed from the (encrypted) blobs when asked for. */
	bool cache_plaintext;
	/* casbox_duplicate_window, seconds (0 = no duplicate suppression) */
	unsigned int duplicate_window;
	/* casbox_expunge_retention, seconds (0 = expunges release at once) */
	unsigned int expunge_retention;
	/* casbox_dedup = no (default yes): every saved part is written
	   again even when the user already has its bytes, so someone who
	   can send mail and watch the disk cannot tell (doc/threat-model.md;
	   COPY still shares blobs). Negated so that a zeroed struct (tools,
	   tests) keeps the default. */
	bool dedup_disabled;
	/* casbox_decode_base64 = no (default yes): base64 leaf bodies are
	   stored as they are, never decoded (casbox-b64.h). Negated like
	   dedup_disabled. */
	bool decode_base64_disabled;
	/* casbox_cross_message = no (default yes): a message's lead part
	   is never compressed against an earlier message of the user
	   (casbox-xmsg.h). Also off with dedup_disabled. Negated like
	   dedup_disabled. */
	bool cross_message_disabled;
	/* casbox_cipher: the chunk cipher of new frames (auto =
	   AES-256-GCM with AES-NI, else XChaCha20-Poly1305) */
	enum cas_aead_cipher cipher;
	/* Not a setting: the event the store's named events (LSM flush
	   and compaction, doc/events.md) are children of, set by whoever
	   opens the store (the storage's event, doveadm's command event).
	   NULL = none. */
	struct event *event;
};

/* Fill set_r from the user's settings (defaults for missing ones):
   Dovecot 2.3's plugin {} block (casbox-settings-23.c) or 2.4's typed
   settings (casbox-settings-24.c), same names and defaults in both.
   Returns 0 ok, -1 invalid value (error_r names the setting). */
int casbox_settings_read(struct mail_user *user, pool_t pool,
			 struct casbox_settings *set_r,
			 const char **error_r);
/* Check the ranges and combinations of set (for both readers); a
   zstd_level of 0 becomes the default. Returns 0 ok, -1 invalid. */
int casbox_settings_check(struct casbox_settings *set, const char **error_r);

static inline void casbox_settings_defaults(struct casbox_settings *set_r)
{
	i_zero(set_r);
	set_r->key_mode = CAS_KEY_MODE_SERVER;
	set_r->zstd_level = CASBOX_DEFAULT_ZSTD_LEVEL;
	set_r->part_split_size = CASBOX_DEFAULT_PART_SPLIT_SIZE;
	set_r->metadata_min_size = CASBOX_DEFAULT_METADATA_MIN_SIZE;
	set_r->pack_size = CASBOX_DEFAULT_PACK_SIZE;
	set_r->lsm_wal_size = CASBOX_DEFAULT_LSM_WAL_SIZE;
	set_r->lsm_cache_size = CASBOX_DEFAULT_LSM_CACHE_SIZE;
	set_r->base_cache_size = CASBOX_DEFAULT_BASE_CACHE_SIZE;
	set_r->gc_dead_ratio = CASBOX_DEFAULT_GC_DEAD_RATIO;
	set_r->dict_autotrain = CASBOX_DEFAULT_DICT_AUTOTRAIN;
	set_r->duplicate_window = CASBOX_DEFAULT_DUPLICATE_WINDOW;
	set_r->expunge_retention = CASBOX_DEFAULT_EXPUNGE_RETENTION;
	set_r->cipher = CAS_AEAD_CIPHER_AUTO;
}
/* The key settings as cas-keymode.h takes them (inline: the store
   code uses it without linking lib-storage). */
static inline void
casbox_settings_key(const struct casbox_settings *set,
		    struct cas_key_settings *key_set_r)
{
	i_zero(key_set_r);
	key_set_r->mode = set->key_mode;
	key_set_r->path = set->key_file;
	key_set_r->password = set->key_password;
}

#endif
