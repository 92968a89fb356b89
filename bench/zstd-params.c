/* zstd parameters for casbox's plain chunks (issue 16): every message of
   a list cut into 64 KiB chunks, each compressed alone as the pack
   writer does, at level 3 and with parameter overrides; prints padded
   (padme) bytes per mail byte and CPU seconds. Not built by make:

     cc -O2 -o /tmp/zstd-params bench/zstd-params.c -lzstd
     find /work/shared/corpus/usrp-users-3000 -name '*.eml' | sort \
	> /tmp/usrp.lst
     /tmp/zstd-params /tmp/usrp.lst [min_size [max_size]]

   The overrides go through ZSTD_compress_advanced(), which uses them
   as given (ZSTD_compress2() would cap hashLog/chainLog to the input
   size first), so this is the most the parameters could give. */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK 65536

struct variant {
	const char *name;
	int level;	/* > 0: plain ZSTD_compressCCtx() at this level */
	unsigned int wl, cl, hl, sl, mm, strategy;	/* 0 = level 3's */
};

static const struct variant variants[] = {
	{ "level 3 (today)", 3, 0, 0, 0, 0, 0, 0 },
	{ "wl17 cl16 hl17", 0, 17, 16, 17, 0, 0, 0 },
	{ "wl17 cl17 hl18", 0, 17, 17, 18, 0, 0, 0 },
	{ "hl17", 0, 0, 0, 17, 0, 0, 0 },
	{ "cl16", 0, 0, 16, 0, 0, 0, 0 },
	{ "sl3", 0, 0, 0, 0, 3, 0, 0 },
	{ "minMatch 4", 0, 0, 0, 0, 0, 4, 0 },
	{ "minMatch 6", 0, 0, 0, 0, 0, 6, 0 },
	{ "wl17 cl16 hl17 mm4", 0, 17, 16, 17, 0, 4, 0 },
	{ "greedy", 0, 0, 0, 0, 0, 0, ZSTD_greedy },
	{ "level 4", 4, 0, 0, 0, 0, 0, 0 },
	{ "level 5", 5, 0, 0, 0, 0, 0, 0 },
};

static uint64_t padme(uint64_t size)
{
	unsigned int e, s;
	uint64_t mask;

	if (size < 2)
		return size;
	e = 63 - __builtin_clzll(size);
	s = 32 - __builtin_clz(e);
	mask = (1ULL << (e - s)) - 1;
	return (size + mask) & ~mask;
}

static double cpu_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static size_t compress_chunk(ZSTD_CCtx *cctx, const struct variant *v,
			     void *out, size_t cap, const void *src,
			     size_t size)
{
	ZSTD_parameters p;

	if (v->level > 0)
		return ZSTD_compressCCtx(cctx, out, cap, src, size, v->level);
	p = ZSTD_getParams(3, size, 0);
	if (v->wl != 0) p.cParams.windowLog = v->wl;
	if (v->cl != 0) p.cParams.chainLog = v->cl;
	if (v->hl != 0) p.cParams.hashLog = v->hl;
	if (v->sl != 0) p.cParams.searchLog = v->sl;
	if (v->mm != 0) p.cParams.minMatch = v->mm;
	if (v->strategy != 0) p.cParams.strategy = v->strategy;
	return ZSTD_compress_advanced(cctx, out, cap, src, size, NULL, 0, p);
}

int main(int argc, char **argv)
{
	size_t min_size = argc > 2 ? strtoul(argv[2], NULL, 10) : 0;
	size_t max_size = argc > 3 ? strtoul(argv[3], NULL, 10) : SIZE_MAX;
	size_t cap = ZSTD_compressBound(CHUNK), n = 0, plain = 0, i, off;
	unsigned char **data = NULL, *out = malloc(cap);
	size_t *sizes = NULL;
	ZSTD_CCtx *cctx = ZSTD_createCCtx();
	char path[4096];
	unsigned int v;
	FILE *list;

	if (argc < 2 || (list = fopen(argv[1], "r")) == NULL) {
		fprintf(stderr, "usage: %s list [min_size [max_size]]\n",
			argv[0]);
		return 2;
	}
	while (fgets(path, sizeof(path), list) != NULL) {
		FILE *f;
		long size;

		path[strcspn(path, "\n")] = '\0';
		if ((f = fopen(path, "rb")) == NULL)
			continue;
		fseek(f, 0, SEEK_END);
		size = ftell(f);
		rewind(f);
		if ((size_t)size >= min_size && (size_t)size <= max_size) {
			data = realloc(data, (n + 1) * sizeof(*data));
			sizes = realloc(sizes, (n + 1) * sizeof(*sizes));
			data[n] = malloc(size);
			sizes[n] = fread(data[n], 1, size, f);
			plain += sizes[n++];
		}
		fclose(f);
	}
	fclose(list);
	printf("%zu messages, %zu bytes\n", n, plain);
	for (v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
		uint64_t raw = 0, padded = 0;
		double t0 = cpu_now();

		for (i = 0; i < n; i++) {
			for (off = 0; off < sizes[i]; off += CHUNK) {
				size_t len = sizes[i] - off < CHUNK ?
					sizes[i] - off : CHUNK;
				size_t r = compress_chunk(cctx, &variants[v],
					out, cap, data[i] + off, len);

				if (ZSTD_isError(r)) {
					fprintf(stderr, "%s\n",
						ZSTD_getErrorName(r));
					return 1;
				}
				raw += r;
				padded += padme(r);
			}
		}
		printf("%-20s raw %.4f padded %.4f cpu %.3f s\n",
		       variants[v].name, (double)raw / plain,
		       (double)padded / plain, cpu_now() - t0);
	}
	return 0;
}
