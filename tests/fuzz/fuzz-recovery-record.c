/* Fuzz the pack meta record decoders that rebuild --from-packs, gc and
   scrub run on opened meta frames (src/storage-casbox/casbox-recovery.c,
   casbox_dek_update_import()): recovery record versions 1 (server-
   wrapped DEKs), 2 (DEKs of any kind: password mode's 133-byte
   sealed DEKs) and 3 (either, zstd-compressed), message records with
   part transforms (base64 leaves stored decoded), mailbox records, DEK updates versions 1 and 2, copy
   records (stored as they are and zstd-compressed) and blob keys. Oracle:
   a crash or a leak, or a decoded record whose export does not decode
   to the same export again; a recovery record exports with the version
   its DEK kinds need. `fuzz-recovery-record --make-corpus DIR` writes
   the seeds. */

#include "lib.h"
#include "array.h"
#include "buffer.h"
#include "casbox-recovery.h"
#include "fuzz-replay.h"

#include <stdio.h>

static void fuzz_recovery(const uint8_t *data, size_t size)
{
	struct casbox_recovery_record rec, rec2;
	const struct casbox_recovery_blob *blob;
	buffer_t *out, *out2;
	const char *error;
	uint8_t version = CASBOX_RECOVERY_VERSION;
	pool_t pool = pool_datastack_create();

	if (casbox_recovery_record_import(data, size, pool, &rec,
					  &error) <= 0)
		return;
	array_foreach(&rec.blobs, blob) {
		if (blob->dek_kind != CAS_DEK_KIND_SERVER_WRAP)
			version = CASBOX_RECOVERY_VERSION_DEK_KIND;
	}
	/* (a version 3 record holds a version 1 or 2 one, which the same
	   decoder checks) */
	if (version == CASBOX_RECOVERY_VERSION_DEK_KIND &&
	    data[0] != CASBOX_RECOVERY_VERSION_DEK_KIND &&
	    data[0] != CASBOX_RECOVERY_VERSION_ZSTD)
		i_panic("sealed DEK accepted in a version %u record", data[0]);
	out = t_buffer_create(size + 64);
	casbox_recovery_record_export_plain(&rec, out);
	if (((const unsigned char *)out->data)[0] != version)
		i_panic("recovery record exported as the wrong version");
	buffer_set_used_size(out, 0);
	casbox_recovery_record_export(&rec, out);
	if (((const unsigned char *)out->data)[0] != version &&
	    ((const unsigned char *)out->data)[0] !=
	    CASBOX_RECOVERY_VERSION_ZSTD)
		i_panic("recovery record exported as the wrong version");
	if (casbox_recovery_record_import(out->data, out->used, pool, &rec2,
					  &error) <= 0)
		i_panic("exported recovery record does not import: %s", error);
	out2 = t_buffer_create(out->used);
	casbox_recovery_record_export(&rec2, out2);
	if (!buffer_cmp(out, out2))
		i_panic("recovery record does not round-trip");
}

static void fuzz_mailbox(const uint8_t *data, size_t size)
{
	struct casbox_recovery_mailbox rec;
	buffer_t *out;
	const char *error;

	if (casbox_recovery_mailbox_import(data, size,
					   pool_datastack_create(), &rec,
					   &error) <= 0)
		return;
	out = t_buffer_create(size);
	casbox_recovery_mailbox_export(&rec, out);
	if (out->used != size || memcmp(out->data, data, size) != 0)
		i_panic("mailbox record does not round-trip");
}

static void fuzz_dek_update(const uint8_t *data, size_t size)
{
	struct casbox_dek_update upd;
	buffer_t *out;
	const char *error;

	if (casbox_dek_update_import(data, size, &upd, &error) <= 0)
		return;
	out = t_buffer_create(size);
	casbox_dek_update_export(&upd, out);
	if (out->used != size || memcmp(out->data, data, size) != 0)
		i_panic("DEK update does not round-trip");
}

static void fuzz_copy(const uint8_t *data, size_t size)
{
	struct casbox_copy_record rec, rec2;
	const struct casbox_copy_entry *entry;
	buffer_t *body, *out, *out2;
	const char *error;
	pool_t pool = pool_datastack_create();

	if (casbox_copy_record_import(data, size, pool, &rec, &error) <= 0)
		return;
	body = t_buffer_create(size * 2);
	casbox_copy_record_body_init(body);
	array_foreach(&rec.entries, entry)
		casbox_copy_record_body_add(body, entry->uid, &entry->msg);
	if (casbox_copy_record_body_count(body) != array_count(&rec.entries))
		i_panic("copy record body count");
	out = t_buffer_create(size + 64);
	casbox_copy_record_export(&rec, body, out);
	if (casbox_copy_record_import(out->data, out->used, pool, &rec2,
				      &error) <= 0)
		i_panic("exported copy record does not import: %s", error);
	if (array_count(&rec2.entries) != array_count(&rec.entries))
		i_panic("copy record entries lost");
	body = t_buffer_create(size * 2);
	casbox_copy_record_body_init(body);
	array_foreach(&rec2.entries, entry)
		casbox_copy_record_body_add(body, entry->uid, &entry->msg);
	out2 = t_buffer_create(out->used);
	casbox_copy_record_export(&rec2, body, out2);
	if (!buffer_cmp(out, out2))
		i_panic("copy record does not round-trip");
}

static void fuzz_blob_keys(const uint8_t *data, size_t size)
{
	struct casbox_blob_keys rec;
	buffer_t *out;
	const char *error;

	if (casbox_blob_keys_import(data, size, pool_datastack_create(), &rec,
				    &error) <= 0)
		return;
	out = t_buffer_create(size);
	casbox_blob_keys_export(&rec, out);
	if (out->used != size || memcmp(out->data, data, size) != 0)
		i_panic("blob keys record does not round-trip");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool inited = FALSE;

	if (!inited) {
		lib_init();
		inited = TRUE;
	}
	T_BEGIN {
		fuzz_recovery(data, size);
		fuzz_mailbox(data, size);
		fuzz_dek_update(data, size);
		fuzz_copy(data, size);
		fuzz_blob_keys(data, size);
	} T_END;
	return 0;
}

#ifndef CASBOX_LIBFUZZER
static void write_seed(const char *dir, const char *name,
		       const buffer_t *buf)
{
	const char *path = t_strconcat(dir, "/", name, NULL);
	FILE *f = fopen(path, "w");

	if (f == NULL || fwrite(buf->data, 1, buf->used, f) != buf->used ||
	    fclose(f) != 0)
		i_fatal("writing %s failed: %m", path);
}

static void make_recovery(struct casbox_recovery_record *rec, pool_t pool,
			  bool sealed)
{
	struct casbox_recovery_blob *blob;
	struct casbox_msg_part *part;
	const char *kw = "$Label1";
	unsigned int i;

	i_zero(rec);
	rec->written_usecs = 1796000000123456ULL;
	memset(rec->mailbox_guid, 0x11, GUID_128_SIZE);
	rec->uid_validity = 1700000001;
	rec->uid = 7;
	rec->next_uid = 8;
	rec->highest_modseq = 42;
	rec->mailbox_name = "Work/Projects";
	casbox_msg_record_init(pool, &rec->msg);
	rec->msg.guid = "0123456789abcdef0123456789abcdef";
	rec->msg.received_date = 1700000000;
	rec->msg.save_date = 1700000100;
	rec->msg.flags = 3;
	array_push_back(&rec->msg.keywords, &kw);
	p_array_init(&rec->blobs, pool, 2);
	for (i = 0; i < 2; i++) {
		part = array_append_space(&rec->msg.parts);
		memset(part->id.id, 0x40 + i, CAS_BLOB_ID_SIZE);
		part->size = 100 + i;
		rec->msg.physical_size += part->size;
		blob = array_append_space(&rec->blobs);
		blob->id = part->id;
		blob->plain_size = part->size;
		if (sealed && i == 1) {
			blob->dek_kind = CAS_DEK_KIND_SEALED;
			memset(blob->sealed_dek, 0x5c, CAS_SEALED_DEK_SIZE);
			blob->sealed_dek[0] = CAS_DEK_KIND_SEALED;
		} else {
			blob->dek_kind = CAS_DEK_KIND_SERVER_WRAP;
			memset(blob->wrapped_dek, 0x77, CAS_WRAPPED_DEK_SIZE);
		}
	}
	rec->msg.virtual_size = rec->msg.physical_size + 2;
}

static void make_corpus(const char *dir)
{
	struct casbox_recovery_record rec;
	struct casbox_recovery_mailbox mrec;
	struct casbox_dek_update upd;
	pool_t pool = pool_alloconly_create("seeds", 4096);
	buffer_t *buf = buffer_create_dynamic(pool, 1024);

	make_recovery(&rec, pool, FALSE);
	casbox_recovery_record_export_plain(&rec, buf);
	write_seed(dir, "recovery-v1", buf);
	buffer_set_used_size(buf, 0);
	casbox_recovery_record_export(&rec, buf);
	write_seed(dir, "recovery-v3", buf);
	buffer_set_used_size(buf, 0);
	make_recovery(&rec, pool, TRUE);
	casbox_recovery_record_export_plain(&rec, buf);
	write_seed(dir, "recovery-v2-sealed", buf);
	/* a part stored decoded: the message record's transform tail */
	make_recovery(&rec, pool, FALSE);
	{
		struct casbox_msg_part *part =
			array_idx_modifiable(&rec.msg.parts, 1);
		struct casbox_recovery_blob *blob =
			array_idx_modifiable(&rec.blobs, 1);

		rec.msg.physical_size -= part->size;
		part->transform = CASBOX_PART_TRANSFORM_BASE64;
		part->b64.line_len = 76;
		part->b64.final_newline = TRUE;
		part->stored_size = blob->plain_size = 300;
		part->size = casbox_b64_encoded_size(&part->b64, 300);
		rec.msg.physical_size += part->size;
		rec.msg.virtual_size = rec.msg.physical_size + 8;
	}
	buffer_set_used_size(buf, 0);
	casbox_recovery_record_export_plain(&rec, buf);
	write_seed(dir, "recovery-v1-b64", buf);

	i_zero(&mrec);
	mrec.written_usecs = 1796000000654321ULL;
	memset(mrec.mailbox_guid, 0x31, GUID_128_SIZE);
	mrec.uid_validity = 1700000002;
	mrec.name = "Archive/2026";
	buffer_set_used_size(buf, 0);
	casbox_recovery_mailbox_export(&mrec, buf);
	write_seed(dir, "mailbox", buf);
	mrec.deleted = TRUE;
	buffer_set_used_size(buf, 0);
	casbox_recovery_mailbox_export(&mrec, buf);
	write_seed(dir, "mailbox-deleted", buf);

	i_zero(&upd);
	upd.written_usecs = 1234567890123456ULL;
	memset(upd.id.id, 0x5a, CAS_BLOB_ID_SIZE);
	upd.dek_kind = CAS_DEK_KIND_SERVER_WRAP;
	memset(upd.wrapped_dek, 0xc3, CAS_WRAPPED_DEK_SIZE);
	buffer_set_used_size(buf, 0);
	casbox_dek_update_export(&upd, buf);
	write_seed(dir, "dek-update-v1", buf);
	upd.dek_kind = CAS_DEK_KIND_SEALED;
	memset(upd.sealed_dek, 0xd4, CAS_SEALED_DEK_SIZE);
	upd.sealed_dek[0] = CAS_DEK_KIND_SEALED;
	buffer_set_used_size(buf, 0);
	casbox_dek_update_export(&upd, buf);
	write_seed(dir, "dek-update-v2-sealed", buf);

	/* a copy record of one entry (stored as it is) and of three
	   (compressed) */
	{
		struct casbox_copy_record crec;
		struct casbox_blob_keys bkeys;
		buffer_t *body = buffer_create_dynamic(pool, 1024);
		unsigned int i;

		make_recovery(&rec, pool, FALSE);
		i_zero(&crec);
		crec.written_usecs = rec.written_usecs;
		memcpy(crec.mailbox_guid, rec.mailbox_guid, GUID_128_SIZE);
		crec.uid_validity = rec.uid_validity;
		crec.next_uid = 30;
		crec.highest_modseq = 77;
		crec.mailbox_name = "Copies";
		casbox_copy_record_body_init(body);
		casbox_copy_record_body_add(body, 21, &rec.msg);
		buffer_set_used_size(buf, 0);
		casbox_copy_record_export(&crec, body, buf);
		write_seed(dir, "copy-one", buf);
		for (i = 22; i < 25; i++)
			casbox_copy_record_body_add(body, i, &rec.msg);
		buffer_set_used_size(buf, 0);
		casbox_copy_record_export(&crec, body, buf);
		write_seed(dir, "copy-compressed", buf);

		i_zero(&bkeys);
		bkeys.written_usecs = rec.written_usecs;
		bkeys.blobs = rec.blobs;
		buffer_set_used_size(buf, 0);
		casbox_blob_keys_export(&bkeys, buf);
		write_seed(dir, "blob-keys", buf);
	}
	pool_unref(&pool);
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--make-corpus") == 0) {
		lib_init();
		make_corpus(argv[2]);
		lib_deinit();
		return 0;
	}
	return fuzz_replay_main("recovery-record", argc, argv, NULL);
}
#endif
