/* casbox: the hints of cross-message compression from a saved header. */

#include "lib.h"
#include "str.h"
#include "istream.h"
#include "message-header-parser.h"
#include "message-address.h"
#include "message-id.h"
#include "casbox-save-xmsg.h"

/* The first id of an In-Reply-To or Message-ID value, or the last of a
   References value. */
static const char *
casbox_save_xmsg_id(const unsigned char *value, size_t size, bool last,
		    pool_t pool)
{
	const char *p = t_strndup(value, size), *id, *found = NULL;

	while ((id = message_id_get_next(&p)) != NULL) {
		found = id;
		if (!last)
			break;
	}
	return found == NULL || *found == '\0' ? NULL : p_strdup(pool, found);
}

static const char *
casbox_save_xmsg_sender(const unsigned char *value, size_t size, pool_t pool)
{
	struct message_address *addr;

	addr = message_address_parse(pool_datastack_create(), value, size, 1,
				     0);
	if (addr == NULL || addr->invalid_syntax || addr->mailbox == NULL ||
	    *addr->mailbox == '\0' || addr->domain == NULL)
		return NULL;
	return p_strdup(pool, t_str_lcase(t_strdup_printf("%s@%s",
					addr->mailbox, addr->domain)));
}

int casbox_save_xmsg_hints(struct istream *input, pool_t pool,
			   struct casbox_xmsg_hints *hints_r,
			   const char **error_r)
{
	struct message_header_parser_ctx *parser;
	struct message_header_line *hdr;
	const char *references = NULL;
	int ret;

	i_zero(hints_r);
	i_stream_seek(input, 0);
	parser = message_parse_header_init(input, NULL, 0);
	while ((ret = message_parse_header_next(parser, &hdr)) > 0) T_BEGIN {
		if (hdr->eoh)
			;
		else if (hdr->continues)
			hdr->use_full_value = TRUE;
		else if (strcasecmp(hdr->name, "Message-ID") == 0 &&
			 hints_r->message_id == NULL) {
			hints_r->message_id = casbox_save_xmsg_id(
				hdr->full_value, hdr->full_value_len, FALSE,
				pool);
		} else if (strcasecmp(hdr->name, "In-Reply-To") == 0 &&
			   hints_r->parent_id == NULL) {
			hints_r->parent_id = casbox_save_xmsg_id(
				hdr->full_value, hdr->full_value_len, FALSE,
				pool);
		} else if (strcasecmp(hdr->name, "References") == 0 &&
			   references == NULL) {
			references = casbox_save_xmsg_id(hdr->full_value,
				hdr->full_value_len, TRUE, pool);
		} else if (strcasecmp(hdr->name, "From") == 0 &&
			   hints_r->sender == NULL) {
			hints_r->sender = casbox_save_xmsg_sender(
				hdr->full_value, hdr->full_value_len, pool);
		}
	} T_END;
	message_parse_header_deinit(&parser);
	if (input->stream_errno != 0) {
		*error_r = t_strdup_printf("read(%s) failed: %s",
					   i_stream_get_name(input),
					   i_stream_get_error(input));
		return -1;
	}
	if (hints_r->parent_id == NULL)
		hints_r->parent_id = references;
	return 0;
}
