#ifndef FUZZ_REPLAY_H
#define FUZZ_REPLAY_H

#include <stddef.h>
#include <stdint.h>

/* Each fuzz target's entry point: libFuzzer calls it directly, the
   replay driver (fuzz-replay.c) once per corpus file. A misbehaving
   input panics there. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Called after the default corpus was replayed: returns NULL if the run
   reached what it must, otherwise why not. */
typedef const char *fuzz_replay_check_t(void);

/* The non-libFuzzer main() of every fuzz target: replay the files and
   directories given as arguments, or by default everything under
   $CASBOX_TOP_SRCDIR/tests/fuzz/corpus/<name>/ (CASBOX_SRCDIR if unset),
   then run corpus_check (may be NULL) for the default corpus. Returns
   the exit status: non-zero if a path can't be read, nothing was
   replayed or corpus_check failed. */
int fuzz_replay_main(const char *name, int argc, char **argv,
		     fuzz_replay_check_t *corpus_check);

#endif
