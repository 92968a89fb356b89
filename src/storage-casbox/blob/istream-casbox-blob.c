/* Seekable istream of one blob's plaintext. The frame header and chunk
   table are read and checked on the first read; each chunk is read,
   authenticated and only then decompressed, when the reader reaches
   it. One decoded chunk is cached, so seeking inside it costs nothing.
   The DEK and chunk buffers are borrowed from the pack store while
   decoding and wiped and handed back once the last byte is read (or
   at EOF), so a message's
   blobs (and the next message's) reuse them instead of allocating and
   wiping 128 kB per blob; a stream destroyed before EOF wipes and
   frees its own. */

#include "lib.h"
#include "istream-private.h"
#include "casbox-pack-private.h"
#include "casbox-pack-file.h"
#include "cas-secmem.h"

#include <sodium.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

struct casbox_blob_istream {
	struct istream_private istream;
	struct casbox_pack_store *store;
	struct cas_blob_id id;
	struct casbox_blob_record rec;
	char *path;

	struct casbox_pack_file *pf;
	bool opened, failed;
	const struct casbox_pack_dict *dict;
	/* a delta frame's base prefix (referenced), NULL = none given */
	struct casbox_base_plain *base;
	/* casbox_pack_blob_cache_as_base(): this blob's prefix, filled as
	   it is read, cached once complete */
	struct casbox_base_plain *tee;
	size_t tee_filled;
	struct casbox_frame_header hdr;
	struct casbox_frame_chunk *chunks;

	/* NULL unless decoding; dek is unwrapped while held, and the
	   version 2 subkey derived once subkey_ready */
	struct casbox_blob_scratch *scratch;
	bool subkey_ready;
	size_t stored_used, plain_used; /* bytes to wipe on release */
	uint32_t cur_chunk;	/* UINT32_MAX = none */
	size_t cur_size;
	/* scratch->stored holds the whole frame as read (small frames),
	   its chunk 0 not yet decoded */
	bool frame_in_stored;
};

#define CASBOX_BLOB_SCRATCH_MAX_FREE 2
/* Most mails are one chunk: header, chunk and table then come in with
   one pread (into the stored buffer, sized for it) instead of three,
   and without the fstat (a short read says the pack is truncated). */
#define CASBOX_BLOB_SMALL_FRAME (CASBOX_FRAME_HEADER_MAX_SIZE + \
	CASBOX_CHUNK_MAX_STORED + CASBOX_FRAME_TABLE_ENTRY_SIZE)

static uint64_t casbox_blob_chunks_decoded = 0;
static uint64_t casbox_blob_bytes_decoded = 0;

uint64_t casbox_pack_get_chunks_decoded(void)
{
	return casbox_blob_chunks_decoded;
}

uint64_t casbox_pack_get_bytes_decoded(void)
{
	return casbox_blob_bytes_decoded;
}

static struct casbox_blob_scratch *
casbox_blob_scratch_get(struct casbox_pack_store *store)
{
	struct casbox_blob_scratch *scratch = store->free_scratch;

	if (scratch != NULL) {
		store->free_scratch = scratch->next;
		store->free_scratch_count--;
		scratch->next = NULL;
		return scratch;
	}
	scratch = i_new(struct casbox_blob_scratch, 1);
	scratch->dek = cas_secmem_alloc(CASBOX_BLOB_SCRATCH_KEYS_SIZE);
	scratch->stored = i_malloc(CASBOX_BLOB_SMALL_FRAME);
	scratch->plain = i_malloc(CASBOX_CHUNK_SIZE);
	return scratch;
}

static void casbox_blob_scratch_destroy(struct casbox_blob_scratch *scratch)
{
	cas_secmem_free(scratch->dek, CASBOX_BLOB_SCRATCH_KEYS_SIZE);
	i_free(scratch->stored);
	i_free(scratch->plain);
	i_free(scratch);
}

void casbox_blob_scratch_free_all(struct casbox_pack_store *store)
{
	struct casbox_blob_scratch *scratch;

	while ((scratch = store->free_scratch) != NULL) {
		store->free_scratch = scratch->next;
		casbox_blob_scratch_destroy(scratch);
	}
	store->free_scratch_count = 0;
}

/* Wipe what this stream decoded into its scratch and hand it back to
   the store, or free it when to_store is FALSE: at destroy the store
   may already be gone (a stream can outlive its mailbox), so only a
   read, which needs the store anyway, returns the scratch. */
static void
casbox_blob_release(struct casbox_blob_istream *bstream, bool to_store)
{
	struct casbox_blob_scratch *scratch = bstream->scratch;
	struct casbox_pack_store *store = bstream->store;

	if (scratch == NULL)
		return;
	bstream->scratch = NULL;
	bstream->subkey_ready = FALSE;
	bstream->cur_chunk = UINT32_MAX;
	bstream->frame_in_stored = FALSE;
	sodium_memzero(scratch->dek, CASBOX_BLOB_SCRATCH_KEYS_SIZE);
	sodium_memzero(scratch->plain, bstream->plain_used);
	sodium_memzero(scratch->stored, bstream->stored_used);
	bstream->plain_used = bstream->stored_used = 0;
	if (!to_store ||
	    store->free_scratch_count >= CASBOX_BLOB_SCRATCH_MAX_FREE) {
		casbox_blob_scratch_destroy(scratch);
		return;
	}
	scratch->next = store->free_scratch;
	store->free_scratch = scratch;
	store->free_scratch_count++;
}

static int ATTR_FORMAT(2, 3)
casbox_blob_error(struct casbox_blob_istream *bstream, const char *fmt, ...)
{
	va_list args;

	va_start(args, fmt);
	io_stream_set_error(&bstream->istream.iostream,
		"Damaged blob %s in %s at offset %"PRIu64": %s",
		cas_blob_id_to_hex(&bstream->id), bstream->path,
		bstream->rec.offset, t_strdup_vprintf(fmt, args));
	va_end(args);
	bstream->istream.istream.stream_errno = EIO;
	bstream->failed = TRUE;
	return -1;
}

static int
casbox_blob_pread(struct casbox_blob_istream *bstream, void *buf,
		  size_t size, uint64_t frame_offset)
{
	ssize_t ret;

	ret = casbox_pack_file_pread(bstream->pf, buf, size,
				     bstream->rec.offset + frame_offset);
	if (ret < 0) {
		return casbox_blob_error(bstream, "%s",
			casbox_pack_file_get_error(bstream->pf));
	}
	if ((size_t)ret != size) {
		return casbox_blob_error(bstream,
			"pack truncated (frame offset %"PRIu64")",
			frame_offset);
	}
	return 0;
}

static int casbox_blob_check_header(struct casbox_blob_istream *bstream)
{
	const struct casbox_frame_header *hdr = &bstream->hdr;
	const struct casbox_blob_record *rec = &bstream->rec;

	if (sodium_memcmp(hdr->id.id, bstream->id.id, CAS_BLOB_ID_SIZE) != 0)
		return casbox_blob_error(bstream, "frame holds another blob");
	if (!casbox_frame_header_matches(hdr, rec->frame_size,
					 rec->plain_size, rec->dict_id) ||
	    hdr->base_depth != rec->base_depth) {
		return casbox_blob_error(bstream,
			"frame header does not match the blob record");
	}
	if (rec->base_depth != 0 && bstream->base == NULL) {
		return casbox_blob_error(bstream,
			"the blob is compressed against base %s, which was "
			"not given (casbox_pack_blob_open_chain())",
			cas_blob_id_to_hex(&rec->base_id));
	}
	if (bstream->base != NULL) {
		if (rec->base_depth == 0) {
			return casbox_blob_error(bstream,
				"a base was given, but the blob has none");
		}
		if (memcmp(bstream->base->id.id, rec->base_id.id,
			   CAS_BLOB_ID_SIZE) != 0) {
			return casbox_blob_error(bstream,
				"base %s given, the blob record names "
				"base %s",
				cas_blob_id_to_hex(&bstream->base->id),
				cas_blob_id_to_hex(&rec->base_id));
		}
		bstream->hdr.base_id = rec->base_id;
		memcpy(bstream->hdr.base_digest, bstream->base->digest,
		       CASBOX_BASE_DIGEST_SIZE);
	}
	if (!cas_aead_cipher_available(hdr->cipher)) {
		return casbox_blob_error(bstream,
			"frame uses cipher %s, which this CPU does not "
			"support (libsodium's AES-256-GCM needs AES-NI)",
			cas_aead_cipher_name(hdr->cipher));
	}
	if (hdr->dict_id == 0)
		return 0;
	bstream->dict = casbox_pack_dict_lookup(bstream->store, hdr->dict_id);
	if (bstream->dict == NULL) {
		/* trained by another process since we opened the store */
		const char *error;

		if (casbox_pack_dicts_load(bstream->store, &error) < 0)
			return casbox_blob_error(bstream, "%s", error);
		bstream->dict = casbox_pack_dict_lookup(bstream->store,
							hdr->dict_id);
	}
	if (bstream->dict == NULL) {
		return casbox_blob_error(bstream, "dictionary %u is missing",
					 hdr->dict_id);
	}
	if (bstream->dict->error != NULL)
		return casbox_blob_error(bstream, "%s", bstream->dict->error);
	return 0;
}

static int casbox_blob_acquire(struct casbox_blob_istream *bstream)
{
	const char *error;

	if (bstream->scratch != NULL)
		return 0;
	bstream->scratch = casbox_blob_scratch_get(bstream->store);
	if (cas_keyring_dek_open(bstream->store->keyring, &bstream->id,
				 bstream->rec.dek_kind,
				 bstream->rec.stored_dek,
				 bstream->scratch->dek, &error) < 0)
		return casbox_blob_error(bstream, "%s", error);
	return 0;
}

static int
casbox_blob_parse_table(struct casbox_blob_istream *bstream,
			const unsigned char *table, size_t table_size)
{
	const char *error;

	bstream->chunks = i_new(struct casbox_frame_chunk,
				bstream->hdr.chunk_count);
	if (casbox_frame_table_parse(&bstream->hdr, table, table_size,
				     bstream->chunks, &error) < 0)
		return casbox_blob_error(bstream, "%s", error);
	return 0;
}

/* The whole frame with one pread into the scratch's stored buffer. */
static int casbox_blob_open_small_frame(struct casbox_blob_istream *bstream)
{
	uint32_t frame_size = bstream->rec.frame_size;
	const unsigned char *frame;
	const char *error;
	size_t table_size;

	if (casbox_blob_acquire(bstream) < 0)
		return -1;
	frame = bstream->scratch->stored;
	bstream->stored_used = I_MAX(bstream->stored_used, frame_size);
	if (casbox_blob_pread(bstream, bstream->scratch->stored, frame_size,
			      0) < 0)
		return -1;
	if (casbox_frame_header_parse(frame, frame_size, &bstream->hdr,
				      &error) < 0)
		return casbox_blob_error(bstream, "%s", error);
	if (casbox_blob_check_header(bstream) < 0)
		return -1;
	/* the header check bounds the table by frame_size */
	table_size = (size_t)bstream->hdr.chunk_count *
		CASBOX_FRAME_TABLE_ENTRY_SIZE;
	if (casbox_blob_parse_table(bstream, frame + frame_size - table_size,
				    table_size) < 0)
		return -1;
	bstream->frame_in_stored = TRUE;
	return 0;
}

static int casbox_blob_open_frame(struct casbox_blob_istream *bstream)
{
	/* any frame is longer than the larger header */
	unsigned char hdr[CASBOX_FRAME_HEADER_MAX_SIZE], *table;
	const char *error;
	uint64_t pack_size;
	size_t table_size;
	int ret;

	bstream->opened = TRUE;
	if (bstream->pf == NULL &&
	    casbox_pack_file_open(bstream->store, bstream->rec.pack_id,
				  &bstream->pf, &error) <= 0)
		return casbox_blob_error(bstream, "%s", error);
	if (bstream->rec.frame_size <= CASBOX_BLOB_SMALL_FRAME)
		return casbox_blob_open_small_frame(bstream);
	if (casbox_pack_file_get_size(bstream->pf, &pack_size) < 0) {
		return casbox_blob_error(bstream, "%s",
			casbox_pack_file_get_error(bstream->pf));
	}
	/* before sizing anything by the frame: it must fit in the pack */
	if (pack_size < bstream->rec.offset ||
	    pack_size - bstream->rec.offset < bstream->rec.frame_size) {
		return casbox_blob_error(bstream,
			"pack truncated (size %"PRIu64", frame ends at %"PRIu64")",
			pack_size,
			bstream->rec.offset + bstream->rec.frame_size);
	}
	if (casbox_blob_pread(bstream, hdr, sizeof(hdr), 0) < 0)
		return -1;
	if (casbox_frame_header_parse(hdr, sizeof(hdr), &bstream->hdr,
				      &error) < 0)
		return casbox_blob_error(bstream, "%s", error);
	if (casbox_blob_check_header(bstream) < 0)
		return -1;

	table_size = (size_t)bstream->hdr.chunk_count *
		CASBOX_FRAME_TABLE_ENTRY_SIZE;
	table = i_malloc(table_size);
	ret = casbox_blob_pread(bstream, table, table_size,
				bstream->hdr.frame_size - table_size);
	if (ret == 0)
		ret = casbox_blob_parse_table(bstream, table, table_size);
	i_free(table);
	return ret < 0 ? -1 : 0;
}

/* A delta frame names its base masked: it must be the record's (the
   AAD binds the record's, so this only makes the error clearer). */
static int
casbox_blob_check_base_id(struct casbox_blob_istream *bstream,
			  const unsigned char *subkey)
{
	struct cas_blob_id frame_base;

	if (bstream->hdr.base_depth == 0)
		return 0;
	casbox_frame_base_mask(subkey, bstream->hdr.base_masked,
			       frame_base.id);
	if (sodium_memcmp(frame_base.id, bstream->rec.base_id.id,
			  CAS_BLOB_ID_SIZE) != 0) {
		return casbox_blob_error(bstream,
			"the frame's base is not base %s, which the blob "
			"record names", cas_blob_id_to_hex(&bstream->rec.base_id));
	}
	return 0;
}

/* Authenticate and decrypt chunk idx in place. */
static int
casbox_blob_chunk_decrypt(struct casbox_blob_istream *bstream, uint32_t idx,
			  unsigned char *stored, size_t chunk_plain_size)
{
	const struct casbox_frame_header *hdr = &bstream->hdr;
	uint32_t stored_size = bstream->chunks[idx].stored_size;
	unsigned char aad[CASBOX_CHUNK_AAD_SIZE], nonce[CAS_AEAD_NONCE_SIZE];
	unsigned char *subkey = bstream->scratch->dek + CAS_DEK_SIZE;
	bool last = idx + 1 == hdr->chunk_count;
	size_t aad_size;
	int ret;

	aad_size = casbox_frame_chunk_aad(hdr, idx, last, chunk_plain_size,
					  aad);
	if (hdr->version == CASBOX_FRAME_VERSION_V1) {
		casbox_frame_chunk_nonce(idx, nonce);
		ret = cas_aead_decrypt(bstream->scratch->dek, nonce, aad,
				       aad_size, stored, stored_size, stored);
	} else {
		if (!bstream->subkey_ready) {
			cas_aead_frame_subkey(hdr->cipher,
					      bstream->scratch->dek,
					      hdr->nonce, subkey);
			bstream->subkey_ready = TRUE;
			if (casbox_blob_check_base_id(bstream, subkey) < 0)
				return -1;
		}
		ret = cas_aead_chunk_decrypt(hdr->cipher, subkey, idx, aad,
					     aad_size, stored, stored_size,
					     stored);
	}
	if (ret < 0 && hdr->base_depth != 0) {
		return casbox_blob_error(bstream,
			"chunk %u: authentication failed (a delta frame: "
			"the chunk, or base %s given, is not what was "
			"written)", idx, cas_blob_id_to_hex(&hdr->base_id));
	}
	if (ret < 0) {
		return casbox_blob_error(bstream,
			"chunk %u: authentication failed", idx);
	}
	return 0;
}

/* Version 2: the authenticated plaintext is one zstd frame and zeros
   to the padded size. Sets *clen_r to the zstd frame's size. */
static int
casbox_blob_chunk_unpad(struct casbox_blob_istream *bstream, uint32_t idx,
			const unsigned char *data, size_t *clen_r)
{
	size_t padded = *clen_r, zlen, i;
	unsigned char acc = 0;

	zlen = ZSTD_findFrameCompressedSize(data, padded);
	if (ZSTD_isError(zlen) || zlen > padded) {
		return casbox_blob_error(bstream,
			"chunk %u: no zstd frame in the padded chunk", idx);
	}
	for (i = zlen; i < padded; i++)
		acc |= data[i];
	if (acc != 0) {
		return casbox_blob_error(bstream,
			"chunk %u: padding is not zero", idx);
	}
	*clen_r = zlen;
	return 0;
}

/* A frame asking for a larger window than any writer makes is refused
   before zstd sees it (which, one-shot, would not check). */
static int
casbox_blob_chunk_window(struct casbox_blob_istream *bstream, uint32_t idx,
			 const unsigned char *data, size_t clen)
{
	uint64_t window;
	const char *error;

	if (casbox_frame_zstd_window(data, clen, &window, &error) < 0)
		return casbox_blob_error(bstream, "chunk %u: %s", idx, error);
	if (window > (1ULL << CASBOX_ZSTD_WINDOW_LOG_MAX)) {
		return casbox_blob_error(bstream,
			"chunk %u: zstd window of %"PRIu64" bytes exceeds "
			"the limit of %u", idx, window,
			1U << CASBOX_ZSTD_WINDOW_LOG_MAX);
	}
	return 0;
}

static int
casbox_blob_decode_chunk(struct casbox_blob_istream *bstream, uint32_t idx)
{
	const struct casbox_frame_chunk *chunk = &bstream->chunks[idx];
	ZSTD_DCtx *dctx = bstream->store->dctx;
	struct casbox_blob_scratch *scratch;
	unsigned char *stored, *plain;
	size_t expected, clen, ret;
	const char *error;

	bstream->cur_chunk = UINT32_MAX;
	if (casbox_blob_acquire(bstream) < 0)
		return -1;
	scratch = bstream->scratch;
	plain = scratch->plain;
	if (bstream->frame_in_stored) {
		/* read whole at open; the table parse bounded the chunks
		   by the frame. Decrypting in place consumes it. */
		stored = scratch->stored + chunk->offset;
		bstream->frame_in_stored = FALSE;
	} else {
		stored = scratch->stored;
		bstream->stored_used = I_MAX(bstream->stored_used,
					     chunk->stored_size);
		if (casbox_blob_pread(bstream, stored, chunk->stored_size,
				      chunk->offset) < 0)
			return -1;
	}
	/* No CRC32C here: the AEAD tag authenticates the same bytes, so a
	   CRC could only tell a damaged table entry from a damaged chunk.
	   Pack scans (doveadm casbox scrub, gc) still check every CRC. */
	expected = casbox_frame_chunk_plain_size(bstream->rec.plain_size, idx);
	if (casbox_blob_chunk_decrypt(bstream, idx, stored, expected) < 0)
		return -1;
	clen = chunk->stored_size - CAS_AEAD_TAG_SIZE;
	if (bstream->hdr.version != CASBOX_FRAME_VERSION_V1 &&
	    casbox_blob_chunk_unpad(bstream, idx, stored, &clen) < 0)
		return -1;
	if (casbox_blob_chunk_window(bstream, idx, stored, clen) < 0)
		return -1;
	if (bstream->dict != NULL) {
		ret = ZSTD_decompress_usingDDict(dctx, plain,
			CASBOX_CHUNK_SIZE, stored, clen,
			bstream->dict->ddict);
	} else if (bstream->base != NULL) {
		/* for this one zstd frame; a chunk written without the
		   prefix (it was smaller) decodes the same with it */
		ret = ZSTD_DCtx_refPrefix(dctx, bstream->base->data,
					  bstream->base->size);
		if (!ZSTD_isError(ret)) {
			ret = ZSTD_decompressDCtx(dctx, plain,
				CASBOX_CHUNK_SIZE, stored, clen);
		}
		(void)ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);
	} else {
		ret = ZSTD_decompressDCtx(dctx, plain,
			CASBOX_CHUNK_SIZE, stored, clen);
	}
	/* wipe on release only what zstd can have written: the result,
	   or on error possibly the whole buffer */
	bstream->plain_used = I_MAX(bstream->plain_used,
		ZSTD_isError(ret) ? CASBOX_CHUNK_SIZE : ret);
	if (casbox_zstd_check(ret, "ZSTD_decompress()", &error) < 0)
		return casbox_blob_error(bstream, "chunk %u: %s", idx, error);
	if (ret != expected) {
		return casbox_blob_error(bstream,
			"chunk %u: %zu bytes, expected %zu", idx, ret,
			expected);
	}
	bstream->cur_chunk = idx;
	bstream->cur_size = ret;
	casbox_blob_chunks_decoded++;
	casbox_blob_bytes_decoded += ret;
	return 0;
}

/* Copy what was just returned into the tee; a jump past its end (a
   seek) gives it up, its completion caches it. */
static void
casbox_blob_tee(struct casbox_blob_istream *bstream, uint64_t offset,
		const unsigned char *data, size_t n)
{
	struct casbox_base_plain *tee = bstream->tee;
	size_t skip, copy;

	if (offset > bstream->tee_filled) {
		casbox_base_plain_unref(&bstream->tee);
		return;
	}
	skip = bstream->tee_filled - offset;
	if (skip >= n)
		return;
	copy = I_MIN(n - skip, tee->size - bstream->tee_filled);
	memcpy(tee->data + bstream->tee_filled, data + skip, copy);
	bstream->tee_filled += copy;
	if (bstream->tee_filled < tee->size)
		return;
	casbox_base_plain_seal(tee);
	casbox_base_cache_add(bstream->store->base_cache, tee);
	casbox_base_plain_unref(&bstream->tee);
}

static ssize_t i_stream_casbox_blob_read(struct istream_private *stream)
{
	struct casbox_blob_istream *bstream =
		(struct casbox_blob_istream *)stream;
	uint64_t offset;
	size_t in_chunk, avail, n;
	uint32_t idx;

	if (!bstream->opened && casbox_blob_open_frame(bstream) < 0)
		return -1;
	if (bstream->failed) {
		/* damage is permanent: never return bytes after it */
		stream->istream.stream_errno = EIO;
		return -1;
	}
	offset = stream->istream.v_offset + (stream->pos - stream->skip);
	if (offset >= bstream->rec.plain_size) {
		casbox_blob_release(bstream, TRUE);
		stream->istream.eof = TRUE;
		return -1;
	}
	idx = offset / CASBOX_CHUNK_SIZE;
	if (idx != bstream->cur_chunk &&
	    casbox_blob_decode_chunk(bstream, idx) < 0)
		return -1;
	in_chunk = offset % CASBOX_CHUNK_SIZE;
	i_assert(in_chunk < bstream->cur_size);
	if (!i_stream_try_alloc(stream, 1, &avail))
		return -2;
	n = I_MIN(avail, bstream->cur_size - in_chunk);
	memcpy(stream->w_buffer + stream->pos,
	       bstream->scratch->plain + in_chunk, n);
	stream->pos += n;
	if (bstream->tee != NULL) {
		casbox_blob_tee(bstream, offset,
				bstream->scratch->plain + in_chunk, n);
	}
	if (offset + n == bstream->rec.plain_size) {
		/* the last byte is out: hand the scratch back now. Readers
		   that know the message size (FETCH BODY[]) never read on
		   to EOF, and freeing it at destroy instead would cost a
		   sodium_malloc()/sodium_free() (mmap, mprotect, munmap)
		   and two 64 kB mallocs per blob. */
		casbox_blob_release(bstream, TRUE);
	}
	return n;
}

static void i_stream_casbox_blob_seek(struct istream_private *stream,
				      uoff_t v_offset, bool mark ATTR_UNUSED)
{
	stream->istream.v_offset = v_offset;
	stream->skip = stream->pos = 0;
}

static int i_stream_casbox_blob_stat(struct istream_private *stream,
				     bool exact ATTR_UNUSED)
{
	struct casbox_blob_istream *bstream =
		(struct casbox_blob_istream *)stream;

	stream->statbuf.st_size = bstream->rec.plain_size;
	return 0;
}

static int i_stream_casbox_blob_get_size(struct istream_private *stream,
					 bool exact ATTR_UNUSED,
					 uoff_t *size_r)
{
	struct casbox_blob_istream *bstream =
		(struct casbox_blob_istream *)stream;

	*size_r = bstream->rec.plain_size;
	return 1;
}

static void i_stream_casbox_blob_destroy(struct iostream_private *stream)
{
	struct casbox_blob_istream *bstream =
		(struct casbox_blob_istream *)stream;

	casbox_pack_file_close(&bstream->pf);
	casbox_blob_release(bstream, FALSE);
	casbox_base_plain_unref(&bstream->base);
	casbox_base_plain_unref(&bstream->tee);
	i_free(bstream->chunks);
	i_free(bstream->path);
	i_stream_free_buffer(&bstream->istream);
}

/* pf: the pack, opened already, or NULL to open it at the first read;
   base: a delta frame's base prefix (the stream takes a reference) */
static struct istream *
casbox_blob_istream_create(struct casbox_pack_store *store,
			   const struct cas_blob_id *id,
			   const struct casbox_blob_record *rec,
			   struct casbox_pack_file *pf,
			   struct casbox_base_plain *base)
{
	struct casbox_blob_istream *bstream;
	struct istream *input;

	bstream = i_new(struct casbox_blob_istream, 1);
	if (base != NULL) {
		casbox_base_plain_ref(base);
		bstream->base = base;
	}
	bstream->store = store;
	bstream->id = *id;
	bstream->rec = *rec;
	bstream->path = i_strdup(casbox_pack_path(store, rec->pack_id));
	bstream->pf = pf;
	bstream->cur_chunk = UINT32_MAX;

	bstream->istream.max_buffer_size = CASBOX_CHUNK_SIZE;
	bstream->istream.iostream.destroy = i_stream_casbox_blob_destroy;
	bstream->istream.read = i_stream_casbox_blob_read;
	bstream->istream.seek = i_stream_casbox_blob_seek;
	bstream->istream.stat = i_stream_casbox_blob_stat;
	bstream->istream.get_size = i_stream_casbox_blob_get_size;
	bstream->istream.istream.readable_fd = FALSE;
	bstream->istream.istream.blocking = TRUE;
	bstream->istream.istream.seekable = TRUE;
	bstream->istream.statbuf.st_size = rec->plain_size;

	input = i_stream_create(&bstream->istream, NULL, -1, 0);
	i_stream_set_name(input, t_strdup_printf("casbox blob %s",
						 cas_blob_id_to_hex(id)));
	return input;
}

struct istream *
casbox_pack_blob_open(struct casbox_pack_store *store,
		      const struct cas_blob_id *id,
		      const struct casbox_blob_record *rec)
{
	return casbox_blob_istream_create(store, id, rec, NULL, NULL);
}

struct istream *
casbox_pack_blob_open_base(struct casbox_pack_store *store,
			   const struct cas_blob_id *id,
			   const struct casbox_blob_record *rec,
			   struct casbox_base_plain *base)
{
	return casbox_blob_istream_create(store, id, rec, NULL, base);
}

int casbox_pack_blob_open_pinned(struct casbox_pack_store *store,
				 const struct cas_blob_id *id,
				 const struct casbox_blob_record *rec,
				 struct istream **input_r,
				 const char **error_r)
{
	return casbox_pack_blob_open_pinned_base(store, id, rec, NULL,
						 input_r, error_r);
}

int casbox_pack_blob_open_pinned_base(struct casbox_pack_store *store,
				      const struct cas_blob_id *id,
				      const struct casbox_blob_record *rec,
				      struct casbox_base_plain *base,
				      struct istream **input_r,
				      const char **error_r)
{
	struct casbox_pack_file *pf;
	const char *error;
	int ret;

	*input_r = NULL;
	store->remote_error_temp = FALSE;
	ret = casbox_pack_file_open(store, rec->pack_id, &pf, &error);
	if (ret <= 0) {
		*error_r = t_strdup_printf("blob %s: %s",
					   cas_blob_id_to_hex(id), error);
		return ret;
	}
	/* a pack in object storage: the frame into the cache now, so a
	   store that is down fails the open (a clear temporary error)
	   rather than the stream half way, and gc deleting the object
	   later cannot take the bytes from this stream */
	if (casbox_pack_file_prefetch(pf, rec->offset, rec->frame_size) < 0) {
		*error_r = t_strdup_printf("blob %s: %s",
			cas_blob_id_to_hex(id), casbox_pack_file_get_error(pf));
		casbox_pack_file_close(&pf);
		return -1;
	}
	*input_r = casbox_blob_istream_create(store, id, rec, pf, base);
	return 1;
}

void casbox_pack_blob_cache_as_base(struct istream *input)
{
	struct casbox_blob_istream *bstream =
		(struct casbox_blob_istream *)input->real_stream;

	i_assert(bstream->istream.read == i_stream_casbox_blob_read);
	i_assert(!bstream->opened && bstream->tee == NULL);
	/* only what can serve as a base (casbox_pack_txn_add_base()) */
	if (bstream->rec.plain_size == 0 ||
	    bstream->rec.base_depth >= CASBOX_BASE_MAX_DEPTH)
		return;
	if (casbox_base_cache_has(bstream->store->base_cache, &bstream->id))
		return;
	bstream->tee = casbox_base_plain_new(&bstream->id,
					     bstream->rec.plain_size,
					     bstream->rec.base_depth);
	bstream->tee_filled = 0;
}
