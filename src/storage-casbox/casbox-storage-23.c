/* casbox: storage class parts of the Dovecot 2.3 form. */

#include "lib.h"
#include "mail-storage-private.h"
#include "mailbox-list-private.h"
#include "casbox-storage.h"
#include "casbox-dovecot.h"

/* 2.4 takes these from casbox_setting_parser_info's defaults. */
void casbox_storage_get_list_settings(const struct mail_namespace *ns ATTR_UNUSED,
				      struct mailbox_list_settings *set)
{
	if (set->layout == NULL)
		set->layout = MAILBOX_LIST_NAME_FS;
	if (set->subscription_fname == NULL)
		set->subscription_fname = CASBOX_SUBSCRIPTION_FILE_NAME;
	if (*set->maildir_name == '\0')
		set->maildir_name = CASBOX_MAILDIR_NAME;
	if (*set->mailbox_dir_name == '\0')
		set->mailbox_dir_name = CASBOX_MAILBOX_DIR_NAME;
}

