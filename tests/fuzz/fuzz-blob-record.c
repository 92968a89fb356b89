/* Fuzz the blob record decoder (LSM value -> location + wrapped DEK):
   whatever imports must export to the same bytes. */

#include "lib.h"
#include "buffer.h"
#include "casbox-pack.h"
#include "casbox-frame.h"
#include "fuzz-replay.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool inited = FALSE;
	struct casbox_blob_record rec, rec2;
	const char *error;
	buffer_t *buf;

	if (!inited) {
		lib_init();
		inited = TRUE;
	}
	T_BEGIN {
		if (casbox_blob_record_import(data, size, &rec, &error) > 0) {
			buf = t_buffer_create(CASBOX_BLOB_RECORD_EXPORT_MAX_SIZE);
			casbox_blob_record_export(&rec, buf);
			/* version 1 is read but written as version 2;
			   versions 2 and 3 (with a base) round-trip */
			if ((data[0] == CASBOX_BLOB_RECORD_VERSION ||
			     data[0] == CASBOX_BLOB_RECORD_VERSION_BASE) &&
			    (buf->used != size ||
			     memcmp(buf->data, data, size) != 0))
				i_panic("blob record does not round-trip");
			if (casbox_blob_record_import(buf->data, buf->used,
						      &rec2, &error) <= 0 ||
			    memcmp(&rec, &rec2, sizeof(rec)) != 0)
				i_panic("exported blob record does not "
					"import to the same record");
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
