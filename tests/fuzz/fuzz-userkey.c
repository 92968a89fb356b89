/* Fuzz the user key file parser (public load and unlock with a fixed
   password) and the sealed DEK decoder under a fixed unlocked key.
   The fixed key is the seed corpus's keyfile-fuzz-pw (password "fuzz",
   Argon2id minimum limits), so seeds sealed to it reach the MAC, the box
   and the blob id check. Oracle: a crash, a leak, or an accepted sealed
   DEK that does not carry the seeds' DEK (0x01 x 32). A file image only
   reaches Argon2id with a valid checksum, so mutations stay fast.
   Every input is also opened as a record sealed to the fixed key
   (cas_userkey_box_open(), password-mode meta frames) under the AAD of
   a version 2 recovery frame: only the seed sealed-box (made with
   `fuzz-userkey --make-box-seed DIR`) may open, to its known plaintext. */

#include "lib.h"
#include "buffer.h"
#include "cas-userkey.h"
#include "cas-userkey-golden.h"
#include "fuzz-replay.h"

#include <stdio.h>

#define FUZZ_PASSWORD "fuzz"
#define FUZZ_BOX_AAD "CBMF\x02\x01"
#define FUZZ_BOX_AAD_SIZE 6
#define FUZZ_BOX_PLAIN "recovery record sealed to the fuzz key"


static struct cas_userkey *fuzz_key;
static unsigned int verified_boxes;

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
	buffer_t *box;

	if (fuzz_key == NULL)
		fuzz_init();
	T_BEGIN {
		if (cas_userkey_parse_public(data, size, &parsed, &error) > 0)
			cas_userkey_free(&parsed);
		if (cas_userkey_unlock_data(data, size, FUZZ_PASSWORD,
					    strlen(FUZZ_PASSWORD), &parsed,
					    &error) > 0)
			cas_userkey_free(&parsed);
		box = t_buffer_create(size + 1);
		if (cas_userkey_box_open(fuzz_key, FUZZ_BOX_AAD,
					 FUZZ_BOX_AAD_SIZE, data, size, box,
					 &error) > 0 &&
		    (box->used != strlen(FUZZ_BOX_PLAIN) ||
		     memcmp(box->data, FUZZ_BOX_PLAIN, box->used) != 0))
			i_panic("forged sealed box accepted");
		if (cas_userkey_box_verify(fuzz_key, FUZZ_BOX_AAD,
					   FUZZ_BOX_AAD_SIZE, data, size,
					   &error) > 0) {
			buffer_set_used_size(box, 0);
			if (cas_userkey_box_open(fuzz_key, FUZZ_BOX_AAD,
						 FUZZ_BOX_AAD_SIZE, data, size,
						 box, &error) <= 0)
				i_panic("verified sealed box does not open");
			verified_boxes++;
		}
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
static void write_box_seed(const char *dir)
{
	const char *path = t_strconcat(dir, "/sealed-box", NULL);
	buffer_t *box = t_buffer_create(256);
	FILE *f;

	fuzz_init();
	if (cas_userkey_box_seal(fuzz_key, FUZZ_BOX_AAD, FUZZ_BOX_AAD_SIZE,
				 FUZZ_BOX_PLAIN, strlen(FUZZ_BOX_PLAIN),
				 box) < 0)
		i_fatal("sealing failed");
	f = fopen(path, "w");
	if (f == NULL || fwrite(box->data, 1, box->used, f) != box->used ||
	    fclose(f) != 0)
		i_fatal("writing %s failed: %m", path);
}

/* The default corpus holds the sealed-box seed: it must have opened. */
static const char *fuzz_userkey_corpus_check(void)
{
	return verified_boxes > 0 ? NULL :
		"the sealed-box seed did not verify and open";
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--make-box-seed") == 0) {
		write_box_seed(argv[2]);
		return 0;
	}
	return fuzz_replay_main("userkey", argc, argv,
				fuzz_userkey_corpus_check);
}
#endif
