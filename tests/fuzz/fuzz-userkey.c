/* Fuzz the user key file parser (public load and unlock with a fixed
   password) and the sealed DEK decoder under a fixed unlocked key.
   The fixed key is the seed corpus's keyfile-fuzz-pw (password "fuzz",
   Argon2id minimum limits), so seeds sealed to it reach the MAC, the box
   and the blob id check. Oracle: a crash, a leak, or an accepted sealed
   DEK that does not carry the seeds' DEK (0x01 x 32). A file image only
   reaches Argon2id with a valid checksum, so mutations stay fast. */

#include "lib.h"
#include "buffer.h"
#include "cas-userkey.h"
#include "cas-userkey-golden.h"
#include "fuzz-replay.h"

#define FUZZ_PASSWORD "fuzz"


static struct cas_userkey *fuzz_key;

static void fuzz_init(void)
{
	const char *error;

	lib_init();
	if (cas_userkey_unlock_data(cas_userkey_golden_file, sizeof(cas_userkey_golden_file),
				    FUZZ_PASSWORD, strlen(FUZZ_PASSWORD),
				    &fuzz_key, &error) < 0)
		i_fatal("fuzz key: %s", error);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned char dek[CAS_DEK_SIZE], seeded[CAS_DEK_SIZE];
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
		memset(seeded, 1, sizeof(seeded));
		if (size >= CAS_SEALED_DEK_SIZE &&
		    cas_dek_open_sealed(fuzz_key, &id, data, dek, &error) > 0 &&
		    memcmp(dek, seeded, sizeof(dek)) != 0)
			i_panic("forged sealed DEK accepted");
	} T_END;
	return 0;
}

#ifndef CASBOX_LIBFUZZER
int main(int argc, char **argv)
{
	return fuzz_replay_main("userkey", argc, argv, NULL);
}
#endif
