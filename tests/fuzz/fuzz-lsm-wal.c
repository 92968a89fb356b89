/* Fuzz the WAL reader: input = WAL file bytes after the header (any
   number of records). Each record is framed and CRC-checked, then its
   payload is validated completely before any entry is applied to a
   memtable. Oracle: a batch that validates applies exactly `count`
   entries (a batch is never half applied); a record parse never reads
   past the input. `fuzz-lsm-wal --make-seeds DIR` writes seeds. */

#include "lib.h"
#include "buffer.h"
#include "casbox-lsm-private.h"

#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>

#include "fuzz-replay.h"

struct fuzz_apply {
	struct casbox_lsm_memtable *mt;
	unsigned int applied;
};

static void fuzz_apply(void *context, uint64_t seq, enum casbox_lsm_type type,
		       const unsigned char *key, size_t key_size,
		       const unsigned char *value, size_t value_size)
{
	struct fuzz_apply *ctx = context;

	casbox_lsm_memtable_add(ctx->mt, seq, type, key, key_size,
				value, value_size);
	ctx->applied++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const unsigned char *payload;
	size_t pos = 0, payload_size, rec_size;
	struct fuzz_apply ctx;
	uint64_t first_seq;
	unsigned int count;
	const char *error;

	i_zero(&ctx);
	ctx.mt = casbox_lsm_memtable_create();
	T_BEGIN {
		while (casbox_lsm_wal_record_parse(data + pos, size - pos,
				&payload, &payload_size, &rec_size,
				&error) == CASBOX_LSM_WAL_OK) {
			if (rec_size > size - pos)
				i_panic("record past the input end");
			ctx.applied = 0;
			if (casbox_lsm_wal_payload_apply(payload, payload_size,
					&first_seq, &count, fuzz_apply, &ctx,
					&error) == 0) {
				if (ctx.applied != count)
					i_panic("batch half applied");
			} else if (ctx.applied != 0) {
				i_panic("invalid batch partly applied");
			}
			pos += rec_size;
		}
	} T_END;
	casbox_lsm_memtable_unref(&ctx.mt);
	return 0;
}

static void fuzz_make_seed(const char *path, unsigned int batches)
{
	buffer_t *out = buffer_create_dynamic(default_pool, 1024);
	buffer_t *entries = buffer_create_dynamic(default_pool, 256);
	unsigned int i, seq = 1;
	const char *key;
	int fd;

	for (i = 0; i < batches; i++) {
		buffer_set_used_size(entries, 0);
		key = t_strdup_printf("blob/%04u", i);
		casbox_lsm_wal_entry_encode(entries, CASBOX_LSM_TYPE_PUT,
					    key, strlen(key), "refcount=1", 10);
		casbox_lsm_wal_entry_encode(entries, CASBOX_LSM_TYPE_DELETE,
					    "old", 3, NULL, 0);
		casbox_lsm_wal_record_encode(out, seq, 2, entries);
		seq += 2;
	}
	/* a torn tail after the good records */
	if (batches > 1)
		buffer_set_used_size(out, out->used - 5);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd == -1 || write(fd, out->data, out->used) != (ssize_t)out->used)
		i_fatal("write(%s) failed: %m", path);
	i_close_fd(&fd);
	buffer_free(&out);
	buffer_free(&entries);
}

#ifndef CASBOX_LIBFUZZER
int main(int argc, char **argv)
{
	int ret;

	lib_init();
	if (argc == 3 && strcmp(argv[1], "--make-seeds") == 0) {
		fuzz_make_seed(t_strconcat(argv[2], "/one", NULL), 1);
		fuzz_make_seed(t_strconcat(argv[2], "/torn", NULL), 4);
		ret = 0;
	} else {
		ret = fuzz_replay_main("lsm-wal", argc, argv, NULL);
	}
	lib_deinit();
	return ret;
}
#endif
