/* Seed-corpus replay shared by every fuzz target (fuzz-replay.h). With
   libFuzzer (--with-fuzzer=clang) LLVMFuzzerTestOneInput is the entry
   point and this is unused; otherwise each target's main() calls
   fuzz_replay_main(), which replays every file under
   tests/fuzz/corpus/<name>/ (or the files and directories given as
   arguments) in make check and fails if the corpus is missing or
   empty. Plain libc: each target initializes liblib itself. */

#include "fuzz-replay.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int fuzz_replay_file(const char *path)
{
	unsigned char *buf = NULL;
	long size;
	FILE *f = fopen(path, "rb");

	if (f == NULL || fseek(f, 0, SEEK_END) != 0 ||
	    (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
	    (buf = malloc(size + 1)) == NULL ||
	    fread(buf, 1, size, f) != (size_t)size) {
		fprintf(stderr, "cannot read %s\n", path);
		free(buf);
		if (f != NULL)
			fclose(f);
		return -1;
	}
	fclose(f);
	(void)LLVMFuzzerTestOneInput(buf, size);
	free(buf);
	return 0;
}

/* Replay a file, or every file under a directory (dot files skipped). */
static int fuzz_replay_path(const char *path, unsigned int *count)
{
	struct dirent *d;
	struct stat st;
	char *sub;
	DIR *dh;
	int ret = 0;

	if (stat(path, &st) < 0) {
		fprintf(stderr, "cannot stat %s\n", path);
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		if (fuzz_replay_file(path) < 0)
			return -1;
		(*count)++;
		return 0;
	}
	dh = opendir(path);
	if (dh == NULL) {
		fprintf(stderr, "cannot open directory %s\n", path);
		return -1;
	}
	while (ret == 0 && (d = readdir(dh)) != NULL) {
		if (d->d_name[0] == '.')
			continue;
		sub = malloc(strlen(path) + strlen(d->d_name) + 2);
		if (sub == NULL) {
			ret = -1;
			break;
		}
		sprintf(sub, "%s/%s", path, d->d_name);
		ret = fuzz_replay_path(sub, count);
		free(sub);
	}
	closedir(dh);
	return ret;
}

int fuzz_replay_main(const char *name, int argc, char **argv,
		     fuzz_replay_check_t *corpus_check)
{
	const char *top = getenv("CASBOX_TOP_SRCDIR"), *error;
	char dir[4096];
	unsigned int count = 0;
	int i;

	if (argc > 1) {
		for (i = 1; i < argc; i++) {
			if (fuzz_replay_path(argv[i], &count) < 0)
				return 1;
		}
	} else {
		snprintf(dir, sizeof(dir), "%s/tests/fuzz/corpus/%s",
			 top == NULL ? CASBOX_SRCDIR : top, name);
		if (fuzz_replay_path(dir, &count) < 0) {
			fprintf(stderr, "seed corpus %s missing\n", dir);
			return 1;
		}
	}
	printf("%s: replayed %u inputs\n", name, count);
	/* an empty or missing corpus must not pass silently */
	if (count == 0) {
		fprintf(stderr, "%s: no fuzz inputs replayed\n", name);
		return 1;
	}
	if (argc <= 1 && corpus_check != NULL &&
	    (error = corpus_check()) != NULL) {
		fprintf(stderr, "%s: %s\n", name, error);
		return 1;
	}
	return 0;
}
