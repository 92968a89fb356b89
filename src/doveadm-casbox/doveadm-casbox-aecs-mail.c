/* doveadm casbox aecs: one message's MIME structure into AECS fields,
   with Dovecot's lib-mail (message-parser, message-decoder,
   mail-html2text). */

#include "lib.h"
#include "array.h"
#include "str.h"
#include "buffer.h"
#include "istream.h"
#include "istream-qp.h"
#include "istream-base64.h"
#include "ostream.h"
#include "safe-mkstemp.h"
#include "sha2.h"
#include "hex-binary.h"
#include "message-parser.h"
#include "message-decoder.h"
#include "message-part-data.h"
#include "message-address.h"
#include "message-header-decode.h"
#include "message-date.h"
#include "mail-html2text.h"
#include "mail-storage.h"
#include "aecs-norm.h"
#include "aecs-text.h"
#include "doveadm-casbox-aecs.h"

#include <stdio.h>
#include <unistd.h>
#include <fcntl.h>

/* bounds on what one header may add (huge To: headers) */
#define AECS_MAX_ADDRESSES_PER_HEADER 10000
#define AECS_MAX_REFERENCES 1000

struct aecs_parse_ctx {
	pool_t pool;
	struct aecs_parsed *parsed;
	struct message_part_data_limits limits;
	/* the part whose body goes where (NULL: none) */
	struct message_part *cur_part;
	bool cur_text, cur_html;
	string_t *text;
	buffer_t *html;
	bool have_date_hdr;
};

static const char *aecs_hdr_utf8(const struct message_header_line *hdr)
{
	string_t *str = t_str_new(hdr->full_value_len + 16);

	message_header_decode_utf8(hdr->full_value, hdr->full_value_len,
				   str, NULL);
	return aecs_text_sanitize(str_data(str), str_len(str));
}

static void aecs_parse_addresses(struct aecs_parse_ctx *ctx,
				 enum aecs_role role,
				 const struct message_header_line *hdr)
{
	struct message_address *addr;
	struct aecs_address *out;

	addr = message_address_parse(pool_datastack_create(),
				     hdr->full_value, hdr->full_value_len,
				     AECS_MAX_ADDRESSES_PER_HEADER, 0);
	for (; addr != NULL; addr = addr->next) {
		const char *email;

		/* group markers and what the parser made of garbage (a
		   display name without addr-spec) have no domain */
		if (addr->mailbox == NULL || *addr->mailbox == '\0' ||
		    addr->domain == NULL || *addr->domain == '\0')
			continue;
		email = t_strconcat(addr->mailbox, "@", addr->domain, NULL);
		email = aecs_text_sanitize((const void *)email, strlen(email));
		out = array_append_space(&ctx->parsed->addresses);
		out->role = role;
		out->email = p_strdup(ctx->pool, aecs_lower(email));
		if (addr->name != NULL && *addr->name != '\0') {
			string_t *name = t_str_new(64);

			message_header_decode_utf8(
				(const void *)addr->name, strlen(addr->name),
				name, NULL);
			out->name = p_strdup(ctx->pool, aecs_text_sanitize(
				str_data(name), str_len(name)));
		}
	}
}

static const char *
aecs_first_id(pool_t pool, const struct message_header_line *hdr,
	      bool require_at)
{
	const char *const *ids = aecs_msgids_parse(hdr->full_value,
						   hdr->full_value_len,
						   require_at, 1);

	if (ids[0] == NULL)
		return NULL;
	return p_strdup(pool, aecs_text_sanitize((const void *)ids[0],
						 strlen(ids[0])));
}

static void aecs_parse_references(struct aecs_parse_ctx *ctx,
				  const struct message_header_line *hdr)
{
	const char *const *ids;
	const char *id;

	if (array_count(&ctx->parsed->references) > 0)
		return;
	ids = aecs_msgids_parse(hdr->full_value, hdr->full_value_len, TRUE,
				AECS_MAX_REFERENCES);
	for (; *ids != NULL; ids++) {
		id = p_strdup(ctx->pool, aecs_text_sanitize(
			(const void *)*ids, strlen(*ids)));
		array_push_back(&ctx->parsed->references, &id);
	}
}

/* A header line of the top-level message (the first one of each name
   counts, except for the address headers). */
static void aecs_parse_top_header(struct aecs_parse_ctx *ctx,
				  const struct message_header_line *hdr)
{
	struct aecs_parsed *p = ctx->parsed;
	const char *name = hdr->name;

	if (strcasecmp(name, "Message-ID") == 0) {
		if (p->message_id == NULL)
			p->message_id = aecs_first_id(ctx->pool, hdr, FALSE);
	} else if (strcasecmp(name, "In-Reply-To") == 0) {
		if (p->in_reply_to == NULL)
			p->in_reply_to = aecs_first_id(ctx->pool, hdr, TRUE);
	} else if (strcasecmp(name, "References") == 0) {
		aecs_parse_references(ctx, hdr);
	} else if (strcasecmp(name, "Subject") == 0) {
		if (p->subject == NULL)
			p->subject = p_strdup(ctx->pool, aecs_hdr_utf8(hdr));
	} else if (strcasecmp(name, "Date") == 0) {
		if (!ctx->have_date_hdr) {
			ctx->have_date_hdr = TRUE;
			p->have_date = message_date_parse(hdr->full_value,
				hdr->full_value_len, &p->date, &p->date_tz);
		}
	} else if (strcasecmp(name, "From") == 0) {
		aecs_parse_addresses(ctx, AECS_ROLE_FROM, hdr);
	} else if (strcasecmp(name, "To") == 0) {
		aecs_parse_addresses(ctx, AECS_ROLE_TO, hdr);
	} else if (strcasecmp(name, "Cc") == 0) {
		aecs_parse_addresses(ctx, AECS_ROLE_CC, hdr);
	} else if (strcasecmp(name, "Bcc") == 0) {
		aecs_parse_addresses(ctx, AECS_ROLE_BCC, hdr);
	}
}

static bool aecs_part_in_rfc822(const struct message_part *part)
{
	for (part = part->parent; part != NULL; part = part->parent) {
		if ((part->flags & MESSAGE_PART_FLAG_MESSAGE_RFC822) != 0)
			return TRUE;
	}
	return FALSE;
}

static const char *aecs_part_content_type(const struct message_part *part)
{
	const struct message_part_data *data = part->data;

	if (data == NULL || data->content_type == NULL)
		return "text/plain";
	return t_str_lcase(t_strconcat(data->content_type, "/",
		data->content_subtype != NULL ? data->content_subtype : "",
		NULL));
}

static const char *
aecs_param_find(const struct message_part_param *params, unsigned int count,
		const char *name)
{
	unsigned int i;

	for (i = 0; i < count; i++) {
		if (strcasecmp(params[i].name, name) == 0 &&
		    params[i].value != NULL && *params[i].value != '\0')
			return params[i].value;
	}
	return NULL;
}

/* Content-Disposition's filename (whatever the disposition), else
   Content-Type's name: what mail clients show. Dovecot's
   message_part_data_get_filename() looks only at attachments'. */
static bool aecs_part_filename(const struct message_part *part,
			       const char **filename_r)
{
	const struct message_part_data *data = part->data;

	if (data == NULL)
		return FALSE;
	*filename_r = aecs_param_find(data->content_disposition_params,
				      data->content_disposition_params_count,
				      "filename");
	if (*filename_r == NULL) {
		*filename_r = aecs_param_find(data->content_type_params,
					      data->content_type_params_count,
					      "name");
	}
	return *filename_r != NULL;
}

static void aecs_part_attachment(struct aecs_parse_ctx *ctx,
				 struct message_part *part,
				 const char *content_type,
				 struct aecs_attachment *att_r)
{
	const struct message_part_data *data = part->data;
	const char *filename;

	i_zero(att_r);
	if (aecs_part_filename(part, &filename)) {
		string_t *str = t_str_new(64);

		message_header_decode_utf8((const void *)filename,
					   strlen(filename), str, NULL);
		att_r->filename = p_strdup(ctx->pool, aecs_text_sanitize(
			str_data(str), str_len(str)));
	} else {
		att_r->filename = "";
	}
	att_r->content_type = p_strdup(ctx->pool, content_type);
	if (data != NULL && data->content_id != NULL) {
		const char *const *ids = aecs_msgids_parse(
			(const void *)data->content_id,
			strlen(data->content_id), FALSE, 1);

		if (ids[0] != NULL)
			att_r->cid = p_strdup(ctx->pool, ids[0]);
	}
	att_r->cte = p_strdup(ctx->pool, data == NULL ||
			      data->content_transfer_encoding == NULL ? "" :
			      t_str_lcase(data->content_transfer_encoding));
	att_r->part = part;
}

static void aecs_part_locate(struct aecs_attachment *att)
{
	att->body_offset = att->part->physical_pos +
		att->part->header_size.physical_size;
	att->body_size = att->part->body_size.physical_size;
}

/* The headers of part are parsed: decide where its body goes. */
static void aecs_part_classify(struct aecs_parse_ctx *ctx,
			       struct message_part *part)
{
	const struct message_part_data *data = part->data;
	const char *content_type, *filename;
	bool attachment, text;

	ctx->cur_part = part;
	ctx->cur_text = ctx->cur_html = FALSE;
	if ((part->flags & MESSAGE_PART_FLAG_MULTIPART) != 0 ||
	    aecs_part_in_rfc822(part))
		return;
	content_type = aecs_part_content_type(part);
	attachment = (data != NULL && data->content_disposition != NULL &&
		      strcasecmp(data->content_disposition,
				 "attachment") == 0) ||
		aecs_part_filename(part, &filename);
	text = !attachment && strcmp(content_type, "text/plain") == 0;
	if (text) {
		ctx->cur_text = TRUE;
		if (str_len(ctx->text) > 0)
			str_append(ctx->text, "\n\n");
		return;
	}
	if (!attachment && !ctx->parsed->have_html &&
	    mail_html2text_content_type_match(content_type)) {
		ctx->cur_html = TRUE;
		ctx->parsed->have_html = TRUE;
		aecs_part_attachment(ctx, part, content_type,
				     &ctx->parsed->html);
		return;
	}
	aecs_part_attachment(ctx, part, content_type,
			     array_append_space(&ctx->parsed->attachments));
}

static void aecs_parse_block(struct aecs_parse_ctx *ctx,
			     struct message_block *raw,
			     struct message_decoder_context *decoder)
{
	struct message_block block;

	if (raw->hdr != NULL) {
		message_part_data_parse_from_header(ctx->pool, raw->part,
						    &ctx->limits, raw->hdr);
		if (!raw->hdr->continues && raw->part->parent == NULL)
			aecs_parse_top_header(ctx, raw->hdr);
	} else if (raw->size == 0) {
		message_part_data_parse_from_header(ctx->pool, raw->part,
						    &ctx->limits, NULL);
		aecs_part_classify(ctx, raw->part);
	}
	/* the bodies of attachments are not decoded here (their sizes
	   and blobs come from aecs_mail_part_save()) */
	if (raw->hdr == NULL && raw->size > 0 &&
	    (raw->part != ctx->cur_part || (!ctx->cur_text && !ctx->cur_html)))
		return;
	if (!message_decoder_decode_next_block(decoder, raw, &block) ||
	    block.hdr != NULL || block.size == 0 ||
	    block.part != ctx->cur_part)
		return;
	if (ctx->cur_text)
		str_append_data(ctx->text, block.data, block.size);
	else if (ctx->cur_html)
		buffer_append(ctx->html, block.data, block.size);
}

static const char *aecs_html_text(const buffer_t *html)
{
	struct mail_html2text *ht = mail_html2text_init(0);
	buffer_t *out = t_buffer_create(html->used / 2 + 16);

	if (html->used == 0) {
		mail_html2text_deinit(&ht);
		return "";
	}
	mail_html2text_more(ht, html->data, html->used, out);
	mail_html2text_deinit(&ht);
	return aecs_text_sanitize(out->data, out->used);
}

static int aecs_raw_digest_id(struct istream *input, pool_t pool,
			      struct aecs_parsed *parsed,
			      const char **error_r)
{
	struct sha256_ctx sha;
	unsigned char digest[SHA256_RESULTLEN];
	const unsigned char *data;
	size_t size;

	i_stream_seek(input, 0);
	sha256_init(&sha);
	while (i_stream_read_more(input, &data, &size) > 0) {
		sha256_loop(&sha, data, size);
		i_stream_skip(input, size);
	}
	if (input->stream_errno != 0) {
		*error_r = t_strdup_printf("read(%s) failed: %s",
					   i_stream_get_name(input),
					   i_stream_get_error(input));
		return -1;
	}
	sha256_result(&sha, digest);
	/* aecs_synthetic_message_id() of the same bytes */
	parsed->message_id = p_strconcat(pool, "aecs-",
		binary_to_hex(digest, 16), AECS_SYNTHETIC_SUFFIX, NULL);
	parsed->message_id_synthetic = TRUE;
	return 0;
}

static void aecs_parse_finish(struct aecs_parse_ctx *ctx)
{
	struct aecs_parsed *p = ctx->parsed;
	const struct aecs_address *addr;
	struct aecs_attachment *att;

	array_foreach_modifiable(&p->attachments, att)
		aecs_part_locate(att);
	if (p->have_html)
		aecs_part_locate(&p->html);

	p->from_email = "";
	array_foreach(&p->addresses, addr) {
		if (addr->role == AECS_ROLE_FROM) {
			p->from_email = addr->email;
			p->from_name = addr->name;
			break;
		}
	}
	if (str_len(ctx->text) > 0 || !p->have_html) {
		p->text = p_strdup(ctx->pool, aecs_text_sanitize(
			str_data(ctx->text), str_len(ctx->text)));
	} else {
		p->text = p_strdup(ctx->pool, aecs_html_text(ctx->html));
	}
}

int aecs_mail_parse(struct mail *mail, pool_t pool,
		    struct aecs_parsed *parsed_r, const char **error_r)
{
	const struct message_parser_settings pset = {
		.hdr_flags = MESSAGE_HEADER_PARSER_FLAG_CLEAN_ONELINE,
	};
	struct aecs_parse_ctx ctx;
	struct message_parser_ctx *parser;
	struct message_decoder_context *decoder;
	struct message_block raw;
	struct message_part *parts;
	struct istream *input;
	int ret;

	i_zero(parsed_r);
	if (mail_get_stream(mail, NULL, NULL, &input) < 0) {
		*error_r = mailbox_get_last_internal_error(mail->box, NULL);
		return -1;
	}
	i_zero(&ctx);
	ctx.pool = pool;
	ctx.parsed = parsed_r;
	ctx.limits.remaining_addresses = AECS_MAX_ADDRESSES_PER_HEADER;
	ctx.limits.remaining_language_tags = 100;
	ctx.limits.remaining_mime_params = 1000;
	ctx.text = t_str_new(4096);
	ctx.html = t_buffer_create(1024);
	p_array_init(&parsed_r->references, pool, 8);
	p_array_init(&parsed_r->addresses, pool, 8);
	p_array_init(&parsed_r->attachments, pool, 4);

	parser = message_parser_init(pool, input, &pset);
	decoder = message_decoder_init(NULL,
				       MESSAGE_DECODER_FLAG_RETURN_BINARY);
	while ((ret = message_parser_parse_next_block(parser, &raw)) > 0)
		aecs_parse_block(&ctx, &raw, decoder);
	message_decoder_deinit(&decoder);
	message_parser_deinit(&parser, &parts);
	if (input->stream_errno != 0) {
		*error_r = t_strdup_printf("read(%s) failed: %s",
					   i_stream_get_name(input),
					   i_stream_get_error(input));
		return -1;
	}
	parsed_r->size = input->v_offset;
	if (parsed_r->message_id == NULL &&
	    aecs_raw_digest_id(input, pool, parsed_r, error_r) < 0)
		return -1;
	aecs_parse_finish(&ctx);
	return 0;
}

static struct istream *
aecs_part_stream(struct istream *input, const struct aecs_attachment *part)
{
	struct istream *limited, *decoded;

	limited = i_stream_create_range(input, part->body_offset,
					part->body_size);
	if (strcmp(part->cte, "base64") == 0)
		decoded = i_stream_create_base64_decoder(limited);
	else if (strcmp(part->cte, "quoted-printable") == 0)
		decoded = i_stream_create_qp_decoder(limited);
	else
		return limited;
	i_stream_unref(&limited);
	return decoded;
}

static int aecs_part_copy(struct istream *part_input, int fd,
			  uoff_t *size_r, const char **error_r)
{
	struct ostream *output = NULL;
	const unsigned char *data;
	size_t size;
	uoff_t total = 0;
	int ret = 0;

	if (fd != -1)
		output = o_stream_create_fd(fd, 0);
	while (i_stream_read_more(part_input, &data, &size) > 0) {
		if (output != NULL)
			o_stream_nsend(output, data, size);
		total += size;
		i_stream_skip(part_input, size);
	}
	if (part_input->stream_errno != 0) {
		/* broken base64 or QP: what decoded so far */
		if (total == 0 && part_input->stream_errno != EINVAL) {
			*error_r = i_stream_get_error(part_input);
			ret = -1;
		}
	}
	if (output != NULL) {
		if (o_stream_finish(output) < 0) {
			*error_r = o_stream_get_error(output);
			ret = -1;
		}
		o_stream_destroy(&output);
	}
	*size_r = total;
	return ret;
}

int aecs_mail_part_save(struct istream *input,
			const struct aecs_attachment *part,
			const char *path, uoff_t *size_r,
			const char **error_r)
{
	struct istream *part_input = aecs_part_stream(input, part);
	string_t *tmp = t_str_new(128);
	int fd = -1, ret;

	if (path != NULL) {
		str_append(tmp, path);
		str_append_c(tmp, '.');
		fd = safe_mkstemp(tmp, 0600, (uid_t)-1, (gid_t)-1);
		if (fd == -1) {
			*error_r = t_strdup_printf(
				"safe_mkstemp(%s) failed: %m", str_c(tmp));
			i_stream_unref(&part_input);
			return -1;
		}
	}
	ret = aecs_part_copy(part_input, fd, size_r, error_r);
	i_stream_unref(&part_input);
	if (fd == -1)
		return ret;
	if (ret == 0 && fsync(fd) < 0) {
		*error_r = t_strdup_printf("fsync(%s) failed: %m", str_c(tmp));
		ret = -1;
	}
	i_close_fd(&fd);
	if (ret == 0 && rename(str_c(tmp), path) < 0) {
		*error_r = t_strdup_printf("rename(%s) failed: %m", path);
		ret = -1;
	}
	if (ret < 0)
		i_unlink_if_exists(str_c(tmp));
	return ret;
}
