#ifndef DOVEADM_CASBOX_UNDELETE_H
#define DOVEADM_CASBOX_UNDELETE_H

/* The search query of doveadm casbox undelete, on retained records
   (doveadm-casbox-undelete-query.c). */

struct mail_search_arg;
struct casbox_retained_record;

/* Returns 0 if every key of the query can be answered from a retained
   record (flags, keywords, received/saved dates, sizes, UID, GUID,
   mailbox name, and AND/OR/NOT of them), -1 otherwise (error_r names
   the key). */
int casbox_undelete_query_check(const struct mail_search_arg *args,
				const char **error_r);
/* TRUE if the retained message (its UID in the mailbox it was expunged
   from) matches every arg of the list. The args passed the check. */
bool casbox_undelete_query_match(const struct mail_search_arg *args,
				 uint32_t uid,
				 const struct casbox_retained_record *rec);

#endif
