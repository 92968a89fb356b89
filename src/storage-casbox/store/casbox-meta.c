/* casbox-meta: sealed BODYSTRUCTURE, ENVELOPE and MIME part tree of a
   message record (and BODY in version 1). The plaintext never reaches the disk: it is sealed
   with the index key before it goes into the record. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "message-part.h"
#include "message-part-serialize.h"
#include "casbox-meta.h"

#include <sodium.h>
#include <zstd.h>

/* version 1: the four fields as they are (still read) */
#define CASBOX_META_VERSION_PLAIN 1
/* version 2: u32 raw size | zstd frame of BODYSTRUCTURE, ENVELOPE and
   tree, compressed against casbox_meta_dict; BODY is derived from
   BODYSTRUCTURE by the reader, as Dovecot's own cache does */
#define CASBOX_META_VERSION_ZSTD 2
#define CASBOX_META_ZSTD_LEVEL 9
#define CASBOX_META_AAD_PREFIX "casbox-msg-meta"

/* The zstd raw-content dictionary of version 2: generic IMAP
   BODYSTRUCTURE and ENVELOPE syntax, written by hand from RFC 3501's
   grammar and common MIME values, nothing taken from anyone's mail. It
   is part of the format: changing one byte needs a new version. Being
   fixed, it lets a record's compressed size depend on that record's
   own metadata only, never on the user's other mail. */
static const char casbox_meta_dict[] =
	"((\"text\" \"plain\" (\"charset\" \"us-ascii\") NIL NIL \"7bit\" 0 0 "
	"NIL NIL NIL NIL)(\"text\" \"plain\" (\"charset\" \"utf-8\" \"format\" "
	"\"flowed\" \"delsp\" \"yes\") NIL NIL \"quoted-printable\" (\"text\" "
	"\"html\" (\"charset\" \"UTF-8\") NIL NIL \"base64\" (\"text\" \"plain\" "
	"(\"charset\" \"iso-8859-1\") NIL NIL \"8bit\" (\"text\" \"html\" "
	"(\"charset\" \"windows-1252\") NIL NIL \"quoted-printable\" "
	"\"alternative\" (\"boundary\" \"----=_Part_\") NIL NIL NIL)"
	"(\"application\" \"octet-stream\" (\"name\" \"\") NIL NIL \"base64\" "
	"(\"attachment\" (\"filename\" \"\")) NIL NIL)(\"application\" \"pdf\" "
	"(\"name\" \".pdf\") NIL NIL \"base64\" (\"inline\" (\"filename\" "
	"\".png\")) \"mixed\" (\"boundary\" \"related\" (\"boundary\" \"type\" "
	"\"text/html\") \"signed\" (\"protocol\" \"application/pgp-signature\" "
	"\"micalg\" \"pgp-sha256\") (\"application\" \"pgp-signature\" (\"name\" "
	"\"signature.asc\") NIL \"OpenPGP digital signature\" \"7bit\" "
	"(\"image\" \"png\" (\"name\" \"image001.png\") \"<image001.png@01D\" "
	"(\"image\" \"jpeg\" (\"message\" \"rfc822\" \"message\" "
	"\"delivery-status\" \"report\" (\"report-type\" \"delivery-status\" "
	"\"en-US\" \"en\" NIL NIL NIL)\n"
	"\"Mon, \" \"Tue, \" \"Wed, \" \"Thu, \" \"Fri, \" \"Sat, \" \"Sun, \" "
	"\" Jan 2025 \" \" Feb 2024 \" \" Mar 2023 \" \" Apr 2022 \" "
	"\" May 2021 \" \" Jun 2020 \" \" Jul 2019 \" \" Aug 2018 \" "
	"\" Sep 2017 \" \" Oct 2016 \" \" Nov 2015 \" \" Dec 2014 \" "
	"\":00 +0000\" \":00 -0700\" \":00 +0100\" \":00 +0200\" "
	"\":00 -0500\" \":00 -0400\" \":00 +0800\" \" (UTC)\" \" (GMT)\" "
	"\"Re: \" \"RE: \" \"Fwd: \" \"Fw: \" \"AW: \" \"[PATCH] \" "
	"\"=?utf-8?Q?\" \"=?UTF-8?B?\" \"?=\" ((\"\" NIL \"info\" "
	"\"example.com\")) ((NIL NIL \"noreply\" \"gmail.com\")) ((NIL NIL "
	"\"\" \"googlemail.com\")) ((NIL NIL \"\" \"outlook.com\")) ((NIL "
	"NIL \"\" \"hotmail.com\")) ((NIL NIL \"\" \"yahoo.com\")) NIL NIL "
	"\"<CA\" \"@mail.gmail.com>\" \"<20\" \"@localhost>\" \"@\" "
	"\".com>\" \".org>\" \".net>\" \".de>\"\n";

static void
casbox_meta_aad(const struct casbox_msg_record *rec, buffer_t *aad)
{
	const struct casbox_msg_part *part;
	unsigned char size_be[8];

	buffer_append(aad, CASBOX_META_AAD_PREFIX,
		      strlen(CASBOX_META_AAD_PREFIX));
	array_foreach(&rec->parts, part) {
		buffer_append(aad, part->id.id, sizeof(part->id.id));
		cpu64_to_be_unaligned(part->size, size_be);
		buffer_append(aad, size_be, sizeof(size_be));
	}
}

static void casbox_meta_wr_data(buffer_t *dest, const void *data, size_t size)
{
	unsigned char len_be[4];

	i_assert(size <= UINT32_MAX);
	cpu32_to_be_unaligned(size, len_be);
	buffer_append(dest, len_be, sizeof(len_be));
	buffer_append(dest, data, size);
}

/* raw = the fields of version 2, sized up front so that no
   reallocation leaves plaintext copies behind */
static buffer_t *
casbox_meta_raw(const struct casbox_msg_meta *meta, const buffer_t *tree)
{
	size_t bs_len = strlen(meta->bodystructure);
	size_t env_len = strlen(meta->envelope);
	buffer_t *raw = t_buffer_create(12 + bs_len + env_len + tree->used);

	casbox_meta_wr_data(raw, meta->bodystructure, bs_len);
	casbox_meta_wr_data(raw, meta->envelope, env_len);
	casbox_meta_wr_data(raw, tree->data, tree->used);
	return raw;
}

/* plain = version 2 | u32 raw size | zstd frame of raw. Returns -1 with
   error_r set if zstd fails (only when out of memory). */
static int casbox_meta_compress(const buffer_t *raw, buffer_t *plain,
				const char **error_r)
{
	size_t bound = ZSTD_compressBound(raw->used), ret;
	unsigned char size_be[4];
	ZSTD_CCtx *cctx;
	void *dest;

	buffer_append_c(plain, CASBOX_META_VERSION_ZSTD);
	cpu32_to_be_unaligned(raw->used, size_be);
	buffer_append(plain, size_be, sizeof(size_be));
	if ((cctx = ZSTD_createCCtx()) == NULL) {
		*error_r = "ZSTD_createCCtx() failed";
		return -1;
	}
	dest = buffer_append_space_unsafe(plain, bound);
	ret = ZSTD_compress_usingDict(cctx, dest, bound, raw->data, raw->used,
				      casbox_meta_dict,
				      sizeof(casbox_meta_dict) - 1,
				      CASBOX_META_ZSTD_LEVEL);
	ZSTD_freeCCtx(cctx);
	if (ZSTD_isError(ret)) {
		*error_r = t_strdup_printf("ZSTD_compress_usingDict() failed: "
					   "%s", ZSTD_getErrorName(ret));
		return -1;
	}
	buffer_set_used_size(plain, 5 + ret);
	return 0;
}

int casbox_meta_seal(const struct cas_keyring *keyring,
		     struct casbox_msg_record *rec,
		     const struct casbox_msg_meta *meta,
		     struct message_part *parts, pool_t pool,
		     const char **error_r)
{
	buffer_t *tree, *raw, *plain, *aad, *sealed;
	int ret;

	tree = t_buffer_create(256);
	message_part_serialize(parts, tree);
	raw = casbox_meta_raw(meta, tree);
	if (raw->used > CASBOX_META_MAX_PLAIN_SIZE) {
		*error_r = t_strdup_printf("%zu bytes, over the limit of %u",
					   raw->used,
					   CASBOX_META_MAX_PLAIN_SIZE);
		sodium_memzero(buffer_get_modifiable_data(raw, NULL), raw->used);
		return -1;
	}
	plain = t_buffer_create(5 + ZSTD_compressBound(raw->used));
	ret = casbox_meta_compress(raw, plain, error_r);
	sodium_memzero(buffer_get_modifiable_data(raw, NULL), raw->used);
	if (ret == 0) {
		aad = t_buffer_create(256);
		casbox_meta_aad(rec, aad);
		sealed = buffer_create_dynamic(pool, plain->used + 64);
		cas_record_seal(keyring, aad->data, aad->used,
				plain->data, plain->used, sealed);
		rec->sealed_meta = sealed->data;
		rec->sealed_meta_size = sealed->used;
	}
	sodium_memzero(buffer_get_modifiable_data(plain, NULL),
		       buffer_get_size(plain));
	return ret;
}

/* Returns the next length-prefixed field, or NULL if it does not fit. */
static const unsigned char *
casbox_meta_rd_data(const unsigned char **p, const unsigned char *end,
		    size_t *size_r)
{
	const unsigned char *data;
	uint32_t size;

	if (end - *p < 4)
		return NULL;
	size = be32_to_cpu_unaligned(*p);
	*p += 4;
	if ((size_t)(end - *p) < size)
		return NULL;
	data = *p;
	*p += size;
	*size_r = size;
	return data;
}

/* The length-prefixed fields of version 1 (with BODY) or 2 (without)
   into meta_r, the tree checked by decoding it once. */
static int
casbox_meta_parse_fields(const unsigned char *p, const unsigned char *end,
			 bool with_body, pool_t pool,
			 struct casbox_msg_meta *meta_r, const char **error_r)
{
	const unsigned char *bs, *body = NULL, *env, *tree;
	size_t bs_size, body_size = 0, env_size, tree_size;
	const char *error = NULL;

	bs = casbox_meta_rd_data(&p, end, &bs_size);
	if (with_body && bs != NULL)
		body = casbox_meta_rd_data(&p, end, &body_size);
	env = bs == NULL || (with_body && body == NULL) ? NULL :
		casbox_meta_rd_data(&p, end, &env_size);
	tree = env == NULL ? NULL : casbox_meta_rd_data(&p, end, &tree_size);
	if (tree == NULL) {
		*error_r = "truncated";
		return -1;
	}
	if (!with_body && p != end) {
		/* version 2 is all ours; version 1 ignored what followed */
		*error_r = "trailing bytes";
		return -1;
	}
	meta_r->bodystructure = p_strndup(pool, bs, bs_size);
	meta_r->body = body == NULL ? NULL : p_strndup(pool, body, body_size);
	meta_r->envelope = p_strndup(pool, env, env_size);
	meta_r->tree = p_memdup(pool, tree, tree_size);
	meta_r->tree_size = tree_size;
	/* decode once here, so a bad tree is found before it is used */
	T_BEGIN {
		pool_t tmp = pool_alloconly_create("casbox meta check", 1024);

		if (message_part_deserialize(tmp, tree, tree_size,
					     &error) == NULL) {
			*error_r = t_strdup_printf("MIME part tree: %s",
						   error);
			meta_r->tree = NULL;
		}
		pool_unref(&tmp);
	} T_END_PASS_STR_IF(meta_r->tree == NULL, error_r);
	return meta_r->tree == NULL ? -1 : 0;
}

/* Version 2 after its version byte: decompress (the raw size must be
   what the frame says, at most CASBOX_META_MAX_PLAIN_SIZE, and the
   frame must end the plaintext), then parse. */
static int
casbox_meta_parse_zstd(const unsigned char *p, const unsigned char *end,
		       pool_t pool, struct casbox_msg_meta *meta_r,
		       const char **error_r)
{
	unsigned long long frame_size;
	size_t raw_size, ret;
	ZSTD_DCtx *dctx;
	buffer_t *raw;
	int result;

	if (end - p < 4) {
		*error_r = "truncated";
		return -1;
	}
	raw_size = be32_to_cpu_unaligned(p);
	p += 4;
	frame_size = ZSTD_getFrameContentSize(p, end - p);
	if (raw_size > CASBOX_META_MAX_PLAIN_SIZE || frame_size != raw_size) {
		*error_r = "bad compressed size";
		return -1;
	}
	if (ZSTD_findFrameCompressedSize(p, end - p) != (size_t)(end - p)) {
		*error_r = "bytes after the compressed frame";
		return -1;
	}
	if ((dctx = ZSTD_createDCtx()) == NULL)
		i_fatal_status(FATAL_OUTOFMEM, "ZSTD_createDCtx() failed");
	raw = t_buffer_create(raw_size + 1);
	ret = ZSTD_decompress_usingDict(dctx,
		buffer_append_space_unsafe(raw, raw_size), raw_size,
		p, end - p, casbox_meta_dict, sizeof(casbox_meta_dict) - 1);
	ZSTD_freeDCtx(dctx);
	if (ZSTD_isError(ret) || ret != raw_size) {
		*error_r = ZSTD_isError(ret) ?
			t_strdup_printf("zstd: %s", ZSTD_getErrorName(ret)) :
			"short compressed frame";
		result = -1;
	} else {
		result = casbox_meta_parse_fields(raw->data,
			CONST_PTR_OFFSET(raw->data, raw_size), FALSE, pool,
			meta_r, error_r);
	}
	sodium_memzero(buffer_get_modifiable_data(raw, NULL), raw_size);
	return result;
}

static int
casbox_meta_parse(const unsigned char *p, const unsigned char *end,
		  pool_t pool, struct casbox_msg_meta *meta_r,
		  const char **error_r)
{
	if (p == end) {
		*error_r = "empty";
		return -1;
	}
	switch (*p) {
	case CASBOX_META_VERSION_PLAIN:
		return casbox_meta_parse_fields(p + 1, end, TRUE, pool,
						meta_r, error_r);
	case CASBOX_META_VERSION_ZSTD:
		return casbox_meta_parse_zstd(p + 1, end, pool, meta_r,
					      error_r);
	default:
		*error_r = "unknown version";
		return -1;
	}
}

struct message_part *
casbox_meta_get_parts(const struct casbox_msg_meta *meta, pool_t pool,
		      const char **error_r)
{
	return message_part_deserialize(pool, meta->tree, meta->tree_size,
					error_r);
}

int casbox_meta_open(const struct cas_keyring *keyring,
		     const struct casbox_msg_record *rec, pool_t pool,
		     struct casbox_msg_meta *meta_r, const char **error_r)
{
	buffer_t *aad, *plain;
	const char *error;
	int ret;

	i_zero(meta_r);
	if (rec->sealed_meta_size == 0)
		return 0;
	aad = t_buffer_create(256);
	casbox_meta_aad(rec, aad);
	plain = t_buffer_create(rec->sealed_meta_size);
	if (cas_record_open(keyring, aad->data, aad->used, rec->sealed_meta,
			    rec->sealed_meta_size, plain, &error) < 0) {
		*error_r = t_strdup_printf("sealed metadata: %s", error);
		ret = -1;
	} else if (casbox_meta_parse(plain->data,
				     CONST_PTR_OFFSET(plain->data, plain->used),
				     pool, meta_r, &error) < 0) {
		*error_r = t_strdup_printf("sealed metadata: %s", error);
		ret = -1;
	} else {
		ret = 1;
	}
	sodium_memzero(buffer_get_modifiable_data(plain, NULL), plain->used);
	return ret;
}

int casbox_meta_reseal(const struct cas_keyring *keyring,
		       struct casbox_msg_record *rec, pool_t pool,
		       const char **error_r)
{
	buffer_t *aad, *resealed;
	int ret;

	if (rec->sealed_meta_size == 0)
		return 0;
	aad = t_buffer_create(256);
	casbox_meta_aad(rec, aad);
	resealed = buffer_create_dynamic(pool, rec->sealed_meta_size);
	ret = cas_record_reseal(keyring, aad->data, aad->used,
				rec->sealed_meta, rec->sealed_meta_size,
				resealed, error_r);
	if (ret > 0) {
		rec->sealed_meta = resealed->data;
		rec->sealed_meta_size = resealed->used;
	}
	return ret;
}
