#ifndef CASBOX_COPY_H
#define CASBOX_COPY_H

/* Copy within one casbox store shares the blobs (refcounts +1, no bytes
   copied); anything else goes through mail_storage_copy(). */
int casbox_copy(struct mail_save_context *ctx, struct mail *mail);

#endif
