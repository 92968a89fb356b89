/* Fuzz the user key file parser (public load and unlock with a fixed
   password) and the sealed DEK decoder under a fixed unlocked key.
   Oracle: a crash, a leak, or a mutated sealed DEK that opens. A file
   image only reaches Argon2id with a valid checksum, so mutations stay
   fast; the seeds use libsodium's minimum Argon2id limits. */

#include "lib.h"
#include "buffer.h"
#include "cas-userkey.h"
#include <unistd.h>
/* fuzz-pack-replay.c */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int fuzz_replay_main(const char *name, int argc, char **argv);

#define FUZZ_PASSWORD "fuzz"

static struct cas_userkey *fuzz_key;

static void fuzz_init(void)
{
	struct cas_userkey_limits limits = {
		.opslimit = 1, .memlimit = 8192,
	};
	char dir[] = "/tmp/fuzz-userkey.XXXXXX";
	const char *path, *error;

	lib_init();
	if (mkdtemp(dir) == NULL)
		i_fatal("mkdtemp() failed: %m");
	path = t_strdup_printf("%s/k", dir);
	if (cas_userkey_create(path, FUZZ_PASSWORD, strlen(FUZZ_PASSWORD),
			       &limits, &fuzz_key, &error) < 0)
		i_fatal("%s", error);
	i_unlink(path);
	if (rmdir(dir) < 0)
		i_fatal("rmdir(%s) failed: %m", dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned char dek[CAS_DEK_SIZE];
	struct cas_userkey *parsed;
	struct cas_blob_id id;
	const char *error;

	if (fuzz_key == NULL)
		fuzz_init();
	T_BEGIN {
		if (cas_userkey_parse_public(data, size, &parsed, &error) > 0)
			cas_userkey_free(&parsed);
		if (cas_userkey_unlock_data(data, size, FUZZ_PASSWORD,
					    strlen(FUZZ_PASSWORD), &parsed,
					    &error) > 0)
			cas_userkey_free(&parsed);
		memset(id.id, 0, sizeof(id.id));
		if (size >= CAS_SEALED_DEK_SIZE &&
		    cas_dek_open_sealed(fuzz_key, &id, data, dek, &error) > 0)
			i_panic("forged sealed DEK accepted");
	} T_END;
	return 0;
}

#ifndef CASBOX_LIBFUZZER
int main(int argc, char **argv)
{
	return fuzz_replay_main("userkey", argc, argv);
}
#endif
