/* Fuzz the key-file parser and the two authenticated decoders keyed by
   it (wrapped DEK, sealed record). Oracle: a forged DEK or record that
   opens under the fixed key is a crash. */

#include "lib.h"
#include "buffer.h"
#include "cas-key.h"
#include "fuzz-replay.h"

static struct cas_keyring *fuzz_keyring;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned char kek[CAS_KEK_SIZE], dek[CAS_DEK_SIZE];
	struct cas_keyring *parsed;
	struct cas_blob_id id;
	const char *error;
	buffer_t *plain;

	if (fuzz_keyring == NULL) {
		lib_init();
		memset(kek, 0x42, sizeof(kek));
		fuzz_keyring = cas_keyring_create_from_kek(kek);
	}
	T_BEGIN {
		if (cas_key_file_parse(data, size, &parsed, &error) > 0)
			cas_keyring_free(&parsed);
		memset(id.id, 0, sizeof(id.id));
		if (size >= CAS_WRAPPED_DEK_SIZE &&
		    cas_dek_unwrap(fuzz_keyring, &id, data, dek, &error) > 0)
			i_panic("forged wrapped DEK accepted");
		plain = t_buffer_create(64);
		if (cas_record_open(fuzz_keyring, "fuzz", 4, data, size,
				    plain, &error) > 0)
			i_panic("forged sealed record accepted");
	} T_END;
	return 0;
}

#ifndef CASBOX_LIBFUZZER
int main(int argc, char **argv)
{
	return fuzz_replay_main("key", argc, argv, NULL);
}
#endif
