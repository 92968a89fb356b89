/* Fuzz the blob record decoder (LSM value -> location + wrapped DEK):
   whatever imports must export to the same bytes. */

#include "lib.h"
#include "buffer.h"
#include "casbox-pack.h"
#include "fuzz-replay.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool inited = FALSE;
	struct casbox_blob_record rec;
	const char *error;
	buffer_t *buf;

	if (!inited) {
		lib_init();
		inited = TRUE;
	}
	T_BEGIN {
		if (casbox_blob_record_import(data, size, &rec, &error) > 0) {
			buf = t_buffer_create(CASBOX_BLOB_RECORD_EXPORT_SIZE);
			casbox_blob_record_export(&rec, buf);
			if (buf->used != size ||
			    memcmp(buf->data, data, size) != 0)
				i_panic("blob record does not round-trip");
		}
	} T_END;
	return 0;
}

#ifndef CASBOX_LIBFUZZER
int main(int argc, char **argv)
{
	return fuzz_replay_main("blob-record", argc, argv, NULL);
}
#endif
