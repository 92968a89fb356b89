#ifndef CASBOX_MAIL_H
#define CASBOX_MAIL_H

struct mail *
casbox_mail_alloc(struct mailbox_transaction_context *t,
		  enum mail_fetch_field wanted_fields,
		  struct mailbox_header_lookup_ctx *wanted_headers);

#endif
