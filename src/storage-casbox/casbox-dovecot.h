#ifndef CASBOX_DOVECOT_H
#define CASBOX_DOVECOT_H

/* The few lib-storage differences between Dovecot 2.3 and 2.4 that the
   storage glue meets inline. CASBOX_DOVECOT_API comes from configure
   (the Dovecot found through dovecot-config); whole functions that
   differ live in *-23.c / *-24.c files instead. */

#if CASBOX_DOVECOT_API >= 24
/* 2.4: the list's root comes from the mail_path setting, and the list
   layout's defaults from casbox_setting_parser_info. */
#  define CASBOX_LIST_ROOT_DIR(list) ((list)->mail_set->mail_path)
#  define CASBOX_STORAGE_VFUNCS_23
#  define CASBOX_STORAGE_CLASS_24 \
	.set_info = &casbox_setting_parser_info,
#  include "casbox-settings-24.h"
#else
#  define CASBOX_LIST_ROOT_DIR(list) ((list)->set.root_dir)
#  define CASBOX_STORAGE_VFUNCS_23 \
	.get_list_settings = casbox_storage_get_list_settings,
#  define CASBOX_STORAGE_CLASS_24
struct mail_namespace;
struct mailbox_list_settings;
/* casbox-storage-23.c */
void casbox_storage_get_list_settings(const struct mail_namespace *ns,
				      struct mailbox_list_settings *set);
#endif

#endif
