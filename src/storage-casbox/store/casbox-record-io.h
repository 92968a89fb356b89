#ifndef CASBOX_RECORD_IO_H
#define CASBOX_RECORD_IO_H

/* Big-endian field readers and writers shared by the LSM record codecs
   (casbox-records.c) and the pack recovery records (casbox-recovery.c).
   Readers treat the bytes as untrusted: the first short read sets
   rd->error ("truncated at <what>") and every later read returns 0 or
   NULL, so a decoder checks rd->error once at the end. */

#include "buffer.h"
#include "byteorder.h"

/* Bounds-checked reader over untrusted bytes. */
struct rec_reader {
	const unsigned char *p, *end;
	const char *error;
};

static inline bool rd_need(struct rec_reader *rd, size_t n, const char *what)
{
	if (rd->error != NULL)
		return FALSE;
	if ((size_t)(rd->end - rd->p) < n) {
		rd->error = t_strdup_printf("truncated at %s", what);
		return FALSE;
	}
	return TRUE;
}

/* n bytes, or NULL (rd->error set) when fewer are left. */
static inline const unsigned char *
rd_take(struct rec_reader *rd, size_t n, const char *what)
{
	const unsigned char *p = rd->p;

	if (!rd_need(rd, n, what))
		return NULL;
	rd->p += n;
	return p;
}

static inline uint8_t rd_u8(struct rec_reader *rd, const char *what)
{
	if (!rd_need(rd, 1, what))
		return 0;
	return *rd->p++;
}

/* The leading version byte of a record: anything but want is an
   error ("unknown version N"), as every decoder here says it. */
static inline void rd_version(struct rec_reader *rd, uint8_t want)
{
	uint8_t version = rd_u8(rd, "version");

	if (rd->error == NULL && version != want)
		rd->error = t_strdup_printf("unknown version %u", version);
}

static inline uint16_t rd_u16(struct rec_reader *rd, const char *what)
{
	uint16_t v;

	if (!rd_need(rd, 2, what))
		return 0;
	v = be16_to_cpu_unaligned(rd->p);
	rd->p += 2;
	return v;
}

static inline uint32_t rd_u32(struct rec_reader *rd, const char *what)
{
	uint32_t v;

	if (!rd_need(rd, 4, what))
		return 0;
	v = be32_to_cpu_unaligned(rd->p);
	rd->p += 4;
	return v;
}

static inline uint64_t rd_u64(struct rec_reader *rd, const char *what)
{
	uint64_t v;

	if (!rd_need(rd, 8, what))
		return 0;
	v = be64_to_cpu_unaligned(rd->p);
	rd->p += 8;
	return v;
}

static inline const char *
rd_str16(struct rec_reader *rd, pool_t pool, const char *what)
{
	uint16_t len = rd_u16(rd, what);
	const char *str;

	if (!rd_need(rd, len, what))
		return NULL;
	if (memchr(rd->p, '\0', len) != NULL) {
		rd->error = t_strdup_printf("NUL in %s", what);
		return NULL;
	}
	str = p_strndup(pool, rd->p, len);
	rd->p += len;
	return str;
}

static inline void wr_u8(buffer_t *dest, uint8_t v)
{
	buffer_append(dest, &v, 1);
}

static inline void wr_u16(buffer_t *dest, uint16_t v)
{
	uint8_t b[2];

	cpu16_to_be_unaligned(v, b);
	buffer_append(dest, b, sizeof(b));
}

static inline void wr_u32(buffer_t *dest, uint32_t v)
{
	uint8_t b[4];

	cpu32_to_be_unaligned(v, b);
	buffer_append(dest, b, sizeof(b));
}

static inline void wr_u64(buffer_t *dest, uint64_t v)
{
	uint8_t b[8];

	cpu64_to_be_unaligned(v, b);
	buffer_append(dest, b, sizeof(b));
}

static inline void wr_str16(buffer_t *dest, const char *str)
{
	size_t len = strlen(str);

	/* GUIDs, keywords and mailbox names are far below 64 KiB; Dovecot
	   limits them long before this */
	i_assert(len <= UINT16_MAX);
	wr_u16(dest, len);
	buffer_append(dest, str, len);
}

#endif
