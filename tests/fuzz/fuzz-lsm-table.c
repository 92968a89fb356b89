/* Fuzz the sorted-table reader: input = a whole table file. Oracle:
   iteration yields strictly increasing keys, and every key iterated
   is found by a point lookup with the same type and value (the bloom
   filter and index never hide a key the blocks hold). Damage must come
   back as an error, never as a crash or a different answer.
   `fuzz-lsm-table --make-seeds DIR` writes seeds with the real builder. */

#include "lib.h"
#include "buffer.h"
#include "casbox-lsm-private.h"

#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>

#include "fuzz-replay.h"

static void fuzz_check_lookup(struct casbox_lsm_table *table,
			      const struct casbox_lsm_source *src)
{
	enum casbox_lsm_type type;
	buffer_t *value = t_buffer_create(64);
	const char *error;
	int ret;

	ret = casbox_lsm_table_lookup(table, src->key, src->key_size, &type,
				      value, &error);
	if (ret < 0)
		return; /* another block of the same table may be damaged */
	if (ret == 0 || type != src->type ||
	    (type == CASBOX_LSM_TYPE_PUT &&
	     (value->used != src->value_size ||
	      memcmp(value->data, src->value, value->used) != 0)))
		i_panic("lookup disagrees with iteration");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct casbox_lsm_table *table;
	struct casbox_lsm_source *src;
	const char *error;
	unsigned int n = 0;

	T_BEGIN {
		if (casbox_lsm_table_open_mem(data, size, &table,
					      &error) == 0) {
			src = casbox_lsm_table_source(table);
			for (src->seek(src, (const unsigned char *)"", 0);
			     src->valid && n < 10000; src->next(src), n++)
				fuzz_check_lookup(table, src);
			if (size > 8)
				src->seek(src, data + size / 2, 8);
			casbox_lsm_source_free(&src);
			casbox_lsm_table_unref(&table);
		}
	} T_END;
	return 0;
}

static void fuzz_make_seed(const char *path, unsigned int count,
			   unsigned int value_size)
{
	struct casbox_lsm_table_builder *builder;
	unsigned char value[5000];
	const char *key, *error;
	uint64_t entries;
	uoff_t size;
	unsigned int i;
	int fd;

	memset(value, 'v', sizeof(value));
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd == -1)
		i_fatal("open(%s) failed: %m", path);
	builder = casbox_lsm_table_builder_init(&cas_io_posix, fd,
						path, 0, NULL);
	for (i = 0; i < count; i++) {
		key = t_strdup_printf("mbox/uid%06u", i);
		if (casbox_lsm_table_builder_add(builder,
				i % 5 == 4 ? CASBOX_LSM_TYPE_DELETE :
				CASBOX_LSM_TYPE_PUT,
				(const unsigned char *)key, strlen(key),
				value, value_size) < 0)
			break;
	}
	if (casbox_lsm_table_builder_finish(&builder, FALSE, &size, &entries,
					    &error) < 0)
		i_fatal("%s", error);
	i_close_fd(&fd);
}

#ifndef CASBOX_LIBFUZZER
int main(int argc, char **argv)
{
	int ret;

	lib_init();
	if (argc == 3 && strcmp(argv[1], "--make-seeds") == 0) {
		fuzz_make_seed(t_strconcat(argv[2], "/one", NULL), 1, 3);
		fuzz_make_seed(t_strconcat(argv[2], "/small", NULL), 20, 10);
		fuzz_make_seed(t_strconcat(argv[2], "/blocks", NULL), 150, 60);
		ret = 0;
	} else {
		ret = fuzz_replay_main("lsm-table", argc, argv, NULL);
	}
	lib_deinit();
	return ret;
}
#endif
