#ifndef CASBOX_DICT_AUTO_H
#define CASBOX_DICT_AUTO_H

struct casbox_storage;

/* count mails were saved (committed) into storage's store: now and then
   this trains the store's first compression dictionary
   (casbox_dict_autotrain). Failures are logged as warnings; the save
   is never affected. */
void casbox_dict_autotrain_saved(struct casbox_storage *storage,
				 unsigned int count);
/* Forget the per-root save counts (plugin deinit). */
void casbox_dict_autotrain_deinit(void);

#endif
