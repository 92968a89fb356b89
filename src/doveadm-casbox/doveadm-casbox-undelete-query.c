/* doveadm casbox undelete: a doveadm search query (doveadm-search-query(7))
   evaluated on retained records. They are in no mailbox, so only the
   keys a record answers are supported: what needs the message's headers
   or body is refused up front, with the key's name. */

#include "lib.h"
#include "array.h"
#include "imap-match.h"
#include "mail-search.h"
#include "casbox-store-safety.h"
#include "doveadm-casbox-undelete.h"

static const char *casbox_undelete_unsupported(enum mail_search_arg_type type)
{
	switch (type) {
	case SEARCH_SEQSET:
		return "sequence sets (use uid)";
	case SEARCH_HEADER:
	case SEARCH_HEADER_ADDRESS:
	case SEARCH_HEADER_COMPRESS_LWSP:
		return "header searches";
	case SEARCH_BODY:
	case SEARCH_TEXT:
		return "body and text searches";
	case SEARCH_MODSEQ:
		return "modseq";
	case SEARCH_INTHREAD:
		return "inthread";
	case SEARCH_MAILBOX_GUID:
		return "mailbox-guid";
	case SEARCH_MIMEPART:
		return "mimepart";
	default:
		return "this search key";
	}
}

int casbox_undelete_query_check(const struct mail_search_arg *arg,
				const char **error_r)
{
	for (; arg != NULL; arg = arg->next) {
		switch (arg->type) {
		case SEARCH_OR:
		case SEARCH_SUB:
			if (casbox_undelete_query_check(arg->value.subargs,
							error_r) < 0)
				return -1;
			break;
		case SEARCH_BEFORE:
		case SEARCH_ON:
		case SEARCH_SINCE:
			if (arg->value.date_type ==
			    MAIL_SEARCH_DATE_TYPE_SENT) {
				*error_r = "sent dates (the Date: header) are "
					"not in the record; use received or "
					"saved dates";
				return -1;
			}
			break;
		case SEARCH_ALL:
		case SEARCH_UIDSET:
		case SEARCH_FLAGS:
		case SEARCH_KEYWORDS:
		case SEARCH_SMALLER:
		case SEARCH_LARGER:
		case SEARCH_GUID:
		case SEARCH_MAILBOX:
		case SEARCH_MAILBOX_GLOB:
		case SEARCH_SAVEDATESUPPORTED:
			break;
		default:
			*error_r = t_strdup_printf("%s cannot be evaluated on "
				"expunged mail (it is in no mailbox)",
				casbox_undelete_unsupported(arg->type));
			return -1;
		}
	}
	return 0;
}

static bool casbox_undelete_date_match(const struct mail_search_arg *arg,
				       const struct casbox_msg_record *rec)
{
	time_t t = arg->value.date_type == MAIL_SEARCH_DATE_TYPE_SAVED ?
		rec->save_date : rec->received_date;

	switch (arg->type) {
	case SEARCH_BEFORE:
		return t < arg->value.time;
	case SEARCH_SINCE:
		return t >= arg->value.time;
	case SEARCH_ON:
		return t >= arg->value.time && t < arg->value.time + 24*3600;
	default:
		i_unreached();
	}
}

static bool
casbox_undelete_keyword_match(const struct casbox_msg_record *rec,
			      const char *keyword)
{
	const char *kw;

	array_foreach_elem(&rec->keywords, kw) {
		if (strcasecmp(kw, keyword) == 0)
			return TRUE;
	}
	return FALSE;
}

static bool casbox_undelete_arg_match(const struct mail_search_arg *arg,
				      uint32_t uid,
				      const struct casbox_retained_record *r)
{
	const struct casbox_msg_record *rec = &r->msg;
	struct imap_match_glob *glob;
	bool ret;

	switch (arg->type) {
	case SEARCH_OR:
		ret = FALSE;
		for (arg = arg->value.subargs; arg != NULL && !ret;
		     arg = arg->next)
			ret = casbox_undelete_arg_match(arg, uid, r);
		return ret;
	case SEARCH_SUB:
		return casbox_undelete_query_match(arg->value.subargs, uid, r);
	case SEARCH_ALL:
	case SEARCH_SAVEDATESUPPORTED:
		return TRUE;
	case SEARCH_UIDSET:
		return seq_range_exists(&arg->value.seqset, uid);
	case SEARCH_FLAGS:
		return (rec->flags & arg->value.flags) == arg->value.flags;
	case SEARCH_KEYWORDS:
		return casbox_undelete_keyword_match(rec, arg->value.str);
	case SEARCH_BEFORE:
	case SEARCH_ON:
	case SEARCH_SINCE:
		return casbox_undelete_date_match(arg, rec);
	case SEARCH_SMALLER:
		return rec->virtual_size < arg->value.size;
	case SEARCH_LARGER:
		return rec->virtual_size > arg->value.size;
	case SEARCH_GUID:
		return strcmp(rec->guid, arg->value.str) == 0;
	case SEARCH_MAILBOX:
		return strcmp(r->mailbox_name, arg->value.str) == 0;
	case SEARCH_MAILBOX_GLOB:
		glob = imap_match_init(pool_datastack_create(),
				       arg->value.str, TRUE, '/');
		return imap_match(glob, r->mailbox_name) == IMAP_MATCH_YES;
	default:
		/* casbox_undelete_query_check() refused it */
		i_unreached();
	}
}

bool casbox_undelete_query_match(const struct mail_search_arg *args,
				 uint32_t uid,
				 const struct casbox_retained_record *rec)
{
	const struct mail_search_arg *arg;
	bool match;

	for (arg = args; arg != NULL; arg = arg->next) {
		T_BEGIN {
			match = casbox_undelete_arg_match(arg, uid, rec);
		} T_END;
		if (match == arg->match_not)
			return FALSE;
	}
	return TRUE;
}
