/* casbox-meta: sealed BODYSTRUCTURE, BODY and MIME part tree of a
   message record. The plaintext never reaches the disk: it is sealed
   with the index key before it goes into the record. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "message-part.h"
#include "message-part-serialize.h"
#include "casbox-meta.h"

#include <sodium.h>

#define CASBOX_META_VERSION 1
#define CASBOX_META_AAD_PREFIX "casbox-msg-meta"

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

bool casbox_meta_seal(const struct cas_keyring *keyring,
		      struct casbox_msg_record *rec,
		      const struct casbox_msg_meta *meta,
		      struct message_part *parts, pool_t pool)
{
	size_t bs_len = strlen(meta->bodystructure);
	size_t body_len = strlen(meta->body);
	size_t env_len = strlen(meta->envelope);
	buffer_t *tree, *plain, *aad, *sealed;

	tree = t_buffer_create(256);
	message_part_serialize(parts, tree);
	if (1 + 16 + bs_len + body_len + env_len + tree->used >
	    CASBOX_META_MAX_PLAIN_SIZE)
		return FALSE;
	/* sized up front: no reallocation leaves copies behind */
	plain = t_buffer_create(1 + 16 + bs_len + body_len + env_len +
				tree->used);
	buffer_append_c(plain, CASBOX_META_VERSION);
	casbox_meta_wr_data(plain, meta->bodystructure, bs_len);
	casbox_meta_wr_data(plain, meta->body, body_len);
	casbox_meta_wr_data(plain, meta->envelope, env_len);
	casbox_meta_wr_data(plain, tree->data, tree->used);

	aad = t_buffer_create(256);
	casbox_meta_aad(rec, aad);
	sealed = buffer_create_dynamic(pool, plain->used + 64);
	cas_record_seal(keyring, aad->data, aad->used,
			plain->data, plain->used, sealed);
	sodium_memzero(buffer_get_modifiable_data(plain, NULL), plain->used);
	rec->sealed_meta = sealed->data;
	rec->sealed_meta_size = sealed->used;
	return TRUE;
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

static int
casbox_meta_parse(const unsigned char *p, const unsigned char *end,
		  pool_t pool, struct casbox_msg_meta *meta_r,
		  const char **error_r)
{
	const unsigned char *bs, *body, *env, *tree;
	size_t bs_size, body_size, env_size, tree_size;
	const char *error = NULL;

	if (p == end || *p != CASBOX_META_VERSION) {
		*error_r = "unknown version";
		return -1;
	}
	p++;
	bs = casbox_meta_rd_data(&p, end, &bs_size);
	body = bs == NULL ? NULL : casbox_meta_rd_data(&p, end, &body_size);
	env = body == NULL ? NULL : casbox_meta_rd_data(&p, end, &env_size);
	tree = env == NULL ? NULL : casbox_meta_rd_data(&p, end, &tree_size);
	if (tree == NULL) {
		*error_r = "truncated";
		return -1;
	}
	meta_r->bodystructure = p_strndup(pool, bs, bs_size);
	meta_r->body = p_strndup(pool, body, body_size);
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
