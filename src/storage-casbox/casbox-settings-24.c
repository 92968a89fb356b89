/* casbox: settings from Dovecot 2.4's typed settings. */

#include "lib.h"
#include "settings.h"
#include "settings-parser.h"
#include "mail-user.h"
#include "casbox-settings.h"
#include "casbox-settings-24.h"

static void
casbox_settings_copy(const struct casbox_24_settings *src,
		     struct mail_user *user, pool_t pool,
		     struct casbox_settings *set_r)
{
	casbox_settings_defaults(set_r);
	if (src->key_file[0] != '\0') {
		set_r->key_file =
			p_strdup(pool, mail_user_home_expand(user,
							     src->key_file));
	}
	set_r->key_autocreate = src->key_autocreate;
	set_r->cache_plaintext = src->cache_plaintext;
	set_r->dedup_disabled = !src->dedup;
	set_r->decode_base64_disabled = !src->decode_base64;
	set_r->cross_message_disabled = !src->cross_message;
	if (src->key_password[0] != '\0')
		set_r->key_password = p_strdup(pool, src->key_password);
	set_r->zstd_level = src->zstd_level > INT_MAX ? -1 :
		(int)src->zstd_level;
	set_r->part_split_size = src->part_split_size;
	set_r->metadata_min_size = src->metadata_min_size;
	set_r->pack_size = src->pack_size;
	if (src->pack_storage[0] != '\0')
		set_r->pack_storage = p_strdup(pool, src->pack_storage);
	if (src->pack_cache_dir[0] != '\0') {
		set_r->pack_cache_dir = p_strdup(pool,
			mail_user_home_expand(user, src->pack_cache_dir));
	}
	set_r->pack_cache_size = src->pack_cache_size;
	set_r->lsm_wal_size = src->lsm_wal_size;
	set_r->lsm_cache_size = src->lsm_cache_size;
	set_r->base_cache_size = src->base_cache_size;
	set_r->gc_dead_ratio = src->gc_dead_ratio;
	set_r->dict_autotrain = src->dict_autotrain;
	set_r->duplicate_window = src->duplicate_window;
	set_r->expunge_retention = src->expunge_retention;
}

int casbox_settings_read(struct mail_user *user, pool_t pool,
			 struct casbox_settings *set_r,
			 const char **error_r)
{
	const struct casbox_24_settings *set;

	if (casbox_24_settings_get(user, &set, error_r) < 0)
		return -1;
	casbox_settings_copy(set, user, pool, set_r);
	/* the enum's values are exactly cas_key_mode_parse()'s */
	if (cas_key_mode_parse(set->key_mode, &set_r->key_mode) < 0)
		i_unreached();
	/* and so are the cipher's cas_aead_cipher_parse()'s */
	if (cas_aead_cipher_parse(set->cipher, &set_r->cipher) < 0)
		i_unreached();
	settings_free(set);
	return casbox_settings_check(set_r, error_r);
}
