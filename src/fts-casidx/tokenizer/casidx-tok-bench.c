/* Tokenizer throughput on real mail:
   casidx-tok-bench [--icu-only] <file|dir>...
   Feeds every file in 4 KB blocks (as fts-build-mail does) and prints
   bytes, tokens, MB/s and tokens/s per CPU second (process CPU time,
   steadier than wall time on a shared host). Not a test. */

#include "lib.h"
#include "buffer.h"
#include "casidx-tokenizer-private.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct bench {
	struct casidx_tokenizer *tok;
	buffer_t *file;
	uint64_t bytes, tokens, files;
	double secs;
};

static void count_cb(const struct casidx_token *token ATTR_UNUSED,
		     void *context)
{
	uint64_t *count = context;

	(*count)++;
}

static double now(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) < 0)
		i_fatal("clock_gettime() failed: %m");
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void bench_file(struct bench *b, const char *path)
{
	const unsigned char *data;
	size_t pos, n;
	ssize_t ret;
	double start;
	int fd;

	fd = open(path, O_RDONLY);
	if (fd < 0)
		i_fatal("open(%s) failed: %m", path);
	buffer_set_used_size(b->file, 0);
	for (;;) {
		ret = read(fd, buffer_append_space_unsafe(b->file, 65536),
			   65536);
		if (ret < 0)
			i_fatal("read(%s) failed: %m", path);
		buffer_set_used_size(b->file, b->file->used - 65536 + ret);
		if (ret == 0)
			break;
	}
	i_close_fd(&fd);

	data = b->file->data;
	start = now();
	casidx_tokenizer_reset(b->tok);
	for (pos = 0; pos < b->file->used; pos += n) {
		n = I_MIN(4096, b->file->used - pos);
		casidx_tokenizer_feed(b->tok, data + pos, n, count_cb,
				      &b->tokens);
	}
	casidx_tokenizer_final(b->tok, count_cb, &b->tokens);
	b->secs += now() - start;
	b->bytes += b->file->used;
	b->files++;
}

static void bench_path(struct bench *b, const char *path)
{
	struct dirent *d;
	struct stat st;
	DIR *dir;

	if (stat(path, &st) < 0)
		i_fatal("stat(%s) failed: %m", path);
	if (!S_ISDIR(st.st_mode)) {
		bench_file(b, path);
		return;
	}
	dir = opendir(path);
	if (dir == NULL)
		i_fatal("opendir(%s) failed: %m", path);
	while ((d = readdir(dir)) != NULL) {
		if (d->d_name[0] == '.')
			continue;
		T_BEGIN {
			bench_path(b, t_strconcat(path, "/", d->d_name, NULL));
		} T_END;
	}
	(void)closedir(dir);
}

int main(int argc, char *argv[])
{
	struct bench b;
	int i;

	lib_init();
	i_zero(&b);
	b.tok = casidx_tokenizer_create();
	b.file = buffer_create_dynamic(default_pool, 1024 * 1024);
	for (i = 1; i < argc; i++) {
		/* --icu-only: measure what the ASCII fast path saves */
		if (strcmp(argv[i], "--icu-only") == 0)
			casidx_tokenizer_set_ascii_fast_path(b.tok, FALSE);
		else
			bench_path(&b, argv[i]);
	}
	printf("files %llu bytes %llu tokens %llu secs %.3f "
	       "MB/s %.1f Mtokens/s %.2f\n",
	       (unsigned long long)b.files, (unsigned long long)b.bytes,
	       (unsigned long long)b.tokens, b.secs,
	       b.bytes / b.secs / 1e6, b.tokens / b.secs / 1e6);
	buffer_free(&b.file);
	casidx_tokenizer_destroy(&b.tok);
	lib_deinit();
	return 0;
}
