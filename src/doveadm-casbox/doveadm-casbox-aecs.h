#ifndef DOVEADM_CASBOX_AECS_H
#define DOVEADM_CASBOX_AECS_H

/* doveadm casbox aecs export / query: a user's mail as the AECS
   database (src/aecs/, doc/aecs.md). The export reads mail through
   lib-storage, so it works on any mail format. */

#include "array.h"

struct mail;
struct message_part;
struct istream;
struct doveadm_cmd_context;
struct doveadm_mail_cmd_context;

enum aecs_role {
	AECS_ROLE_FROM = 0,
	AECS_ROLE_TO,
	AECS_ROLE_CC,
	AECS_ROLE_BCC,
};

struct aecs_address {
	enum aecs_role role;
	/* lowercased, never "" */
	const char *email;
	/* decoded UTF-8, NULL when there is none */
	const char *name;
};

struct aecs_attachment {
	const char *filename;
	const char *content_type;
	/* NULL when there is none */
	const char *cid;
	/* bytes after Content-Transfer-Encoding decoding */
	uoff_t size;
	/* where its body is in the raw message (known once the whole
	   message is parsed), and how it is encoded */
	struct message_part *part;
	uoff_t body_offset, body_size;
	const char *cte;
};

/* One message parsed into its AECS fields (all UTF-8). */
struct aecs_parsed {
	/* without angle brackets; synthetic (aecs_synthetic_message_id())
	   when missing or unparseable */
	const char *message_id;
	bool message_id_synthetic;
	const char *in_reply_to;
	ARRAY_TYPE(const_string) references;
	const char *subject;
	/* have_date FALSE: no Date: or one that does not parse */
	bool have_date;
	time_t date;
	int date_tz;
	const char *from_email, *from_name;
	ARRAY(struct aecs_address) addresses;
	/* the decoded text/plain parts, or the first HTML part as text;
	   "" when there is neither */
	const char *text;
	/* the first HTML part (text/html not an attachment), or none */
	bool have_html;
	struct aecs_attachment html;
	ARRAY(struct aecs_attachment) attachments;
	uoff_t size;
};

/* Parse mail's stream. Allocates from pool. Returns 0 ok, -1 the
   stream could not be read (error_r). Malformed MIME is not an error:
   it gives what Dovecot's parser makes of it. */
int aecs_mail_parse(struct mail *mail, pool_t pool,
		    struct aecs_parsed *parsed_r, const char **error_r);

/* Write the CTE-decoded bytes of the part at (offset, size, cte) of
   input to path (created 0600, replaced atomically); returns 0 ok,
   -1 error. With path NULL only counts: *size_r gets the byte count. */
int aecs_mail_part_save(struct istream *input,
			const struct aecs_attachment *part,
			const char *path, uoff_t *size_r,
			const char **error_r);

struct doveadm_mail_cmd_context *cmd_casbox_aecs_export_alloc(void);
void cmd_casbox_aecs_query(struct doveadm_cmd_context *cctx);

#endif

/* Writing one message's rows (doveadm-casbox-aecs-rows.c). */
struct aecs_db;
struct aecs_row_settings {
	const char *mailbox_id;
	/* --blobs DIR, or NULL */
	const char *blobs_dir;
	unsigned int forai_max_chars;
	const char *processed_at;
};

/* The thread id for parsed, a message about to be stored
   (doveadm-casbox-aecs-thread.c): the stored threads it connects to
   become one (the oldest keeps its id), or a new one named by
   aecs_thread_root(). Returns 0 ok, -1 error. */
int aecs_thread_resolve(struct aecs_db *db, const char *mailbox_id,
			const struct aecs_parsed *parsed,
			const char **thread_id_r, const char **error_r);
/* Store parsed as key through insert_message, upsert_thread,
   insert_body, insert_address, insert_reference, insert_attachment and
   insert_search; with blobs_dir, raw.eml, body.html and att/<n> too
   (read from input, the message's stream). save_date is ts when the
   message has no usable Date:. Returns 1 stored, 0 the row existed
   (nothing written), -1 error. */
int aecs_rows_write(struct aecs_db *db, const struct aecs_row_settings *set,
		    const struct aecs_parsed *parsed, const char *key,
		    time_t save_date, const char *x_fields,
		    struct istream *input, const char **error_r);
