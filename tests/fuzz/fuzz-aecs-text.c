/* Fuzz the AECS export's parsers of outside bytes: msg-id lists,
   text sanitizing, cleaning and the forai bound. Oracles: every output
   is valid UTF-8, ids have no whitespace (and an "@" where required),
   forai never passes its bound, cleaning is idempotent on its own
   output's size (it never grows the text). */

#include "lib.h"
#include "unichar.h"
#include "aecs-norm.h"
#include "aecs-text.h"
#include "fuzz-replay.h"

static void fuzz_check_utf8(const char *s, const char *what)
{
	if (!uni_utf8_str_is_valid(s))
		i_panic("%s: not valid UTF-8", what);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool initialized = FALSE;
	const char *const *ids, *text, *clean, *forai;
	unsigned int max = 1 + (size > 0 ? data[0] % 200 : 0);
	bool fallback;

	if (!initialized) {
		lib_init();
		initialized = TRUE;
	}
	T_BEGIN {
		for (ids = aecs_msgids_parse(data, size, TRUE, 50);
		     *ids != NULL; ids++) {
			if (strpbrk(*ids, " \t\r\n") != NULL ||
			    strchr(*ids, '@') == NULL)
				i_panic("bad msg-id '%s'", *ids);
		}
		ids = aecs_msgids_parse(data, size, FALSE, 1);
		if (ids[0] != NULL && ids[1] != NULL)
			i_panic("more ids than asked for");
		text = aecs_text_sanitize(data, size);
		fuzz_check_utf8(text, "sanitize");
		if (strchr(text, '\r') != NULL)
			i_panic("sanitize left a CR");
		clean = aecs_text_clean(text, &fallback);
		fuzz_check_utf8(clean, "clean");
		if (strlen(clean) > strlen(text))
			i_panic("clean grew the text");
		forai = aecs_forai("N", "a@b", NULL, text, clean, max);
		fuzz_check_utf8(forai, "forai");
		if (aecs_text_char_count(forai) > max)
			i_panic("forai over its bound");
		(void)aecs_key(text);
	} T_END;
	return 0;
}

#ifndef CASBOX_LIBFUZZER
int main(int argc, char **argv)
{
	return fuzz_replay_main("aecs-text", argc, argv, NULL);
}
#endif
