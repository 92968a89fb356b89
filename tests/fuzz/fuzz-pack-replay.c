/* Seed-corpus replay for the blob/pack/key fuzz targets. With libFuzzer
   (--with-fuzzer=clang) LLVMFuzzerTestOneInput is the entry point and
   this is unused; otherwise each target's main() calls
   fuzz_replay_main(), which replays every file of
   tests/fuzz/corpus/<name>/ (or the files given as arguments) in make
   check and fails if the corpus is missing or empty. */

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int fuzz_replay_main(const char *name, int argc, char **argv);

static int fuzz_replay_file(const char *path)
{
	unsigned char *buf;
	long size;
	FILE *f = fopen(path, "rb");

	if (f == NULL || fseek(f, 0, SEEK_END) != 0 ||
	    (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
		fprintf(stderr, "cannot read %s\n", path);
		return -1;
	}
	buf = malloc(size + 1);
	if (buf == NULL || fread(buf, 1, size, f) != (size_t)size) {
		fprintf(stderr, "cannot read %s\n", path);
		return -1;
	}
	fclose(f);
	(void)LLVMFuzzerTestOneInput(buf, size);
	free(buf);
	return 0;
}

int fuzz_replay_main(const char *name, int argc, char **argv)
{
	const char *top = getenv("CASBOX_TOP_SRCDIR");
	char dir[4096], path[8192];
	struct dirent *d;
	unsigned int count = 0;
	DIR *dh;
	int i;

	if (argc > 1) {
		for (i = 1; i < argc; i++) {
			if (fuzz_replay_file(argv[i]) < 0)
				return 1;
		}
		return 0;
	}
	snprintf(dir, sizeof(dir), "%s/tests/fuzz/corpus/%s",
		 top == NULL ? CASBOX_SRCDIR : top, name);
	dh = opendir(dir);
	if (dh == NULL) {
		fprintf(stderr, "seed corpus %s missing\n", dir);
		return 1;
	}
	while ((d = readdir(dh)) != NULL) {
		if (d->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, d->d_name);
		if (fuzz_replay_file(path) < 0)
			return 1;
		count++;
	}
	closedir(dh);
	printf("%s: replayed %u inputs\n", name, count);
	return count == 0 ? 1 : 0;
}
