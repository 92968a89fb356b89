/* casbox: settings checks shared by the 2.3 and 2.4 readers. */

#include "lib.h"
#include "casbox-settings.h"

static int
casbox_settings_check_min(const char *name, uoff_t value, uoff_t min_value,
			  const char **error_r)
{
	if (value >= min_value)
		return 0;
	*error_r = t_strdup_printf("%s: must be at least %"PRIuUOFF_T,
				   name, min_value);
	return -1;
}

int casbox_settings_check(struct casbox_settings *set, const char **error_r)
{
	if (set->zstd_level == 0)
		set->zstd_level = CASBOX_DEFAULT_ZSTD_LEVEL;
	if (set->zstd_level < 0 || set->zstd_level > 19) {
		*error_r = t_strdup_printf("casbox_zstd_level: invalid value "
					   "'%d' (expected 0..19)",
					   set->zstd_level);
		return -1;
	}
	if (set->gc_dead_ratio > 100) {
		*error_r = t_strdup_printf("casbox_gc_dead_ratio: invalid "
					   "value '%u' (expected 0..100)",
					   set->gc_dead_ratio);
		return -1;
	}
	if (set->dict_autotrain != 0 &&
	    set->dict_autotrain < CASBOX_DICT_AUTOTRAIN_MIN) {
		*error_r = t_strdup_printf("casbox_dict_autotrain: invalid "
					   "value '%u' (expected 0 or at "
					   "least %u)", set->dict_autotrain,
					   CASBOX_DICT_AUTOTRAIN_MIN);
		return -1;
	}
	if (casbox_settings_check_min("casbox_part_split_size",
				      set->part_split_size, 1024,
				      error_r) < 0 ||
	    casbox_settings_check_min("casbox_pack_size", set->pack_size,
				      1024 * 1024, error_r) < 0 ||
	    casbox_settings_check_min("casbox_lsm_wal_size",
				      set->lsm_wal_size, 64 * 1024,
				      error_r) < 0 ||
	    casbox_settings_check_min("casbox_lsm_cache_size",
				      set->lsm_cache_size, 64 * 1024,
				      error_r) < 0 ||
	    casbox_settings_check_min("casbox_base_cache_size",
				      set->base_cache_size, 64 * 1024,
				      error_r) < 0)
		return -1;
	if (set->key_mode == CAS_KEY_MODE_PASSWORD && set->cache_plaintext) {
		/* LMTP would fill the cache with headers in plaintext,
		   readable without the password */
		*error_r = "casbox_cache_plaintext=yes cannot be combined "
			"with casbox_key_mode=password";
		return -1;
	}
	return 0;
}
