/*
 * replay_main.c - main() of the replay build of a C fuzz target (tools/fuzz.mk): runs the target's
 * LLVMFuzzerTestOneInput once on each file named on the command line, as libFuzzer runs one input,
 * without libFuzzer (any C compiler builds it). A finding aborts, so the exit status is non-zero;
 * otherwise prints "replayed N inputs" and exits 0. With RLX_FUZZ_VERBOSE set it names each file
 * before running it (the target may print more about each input). tests/fuzz/test_fuzz_replay.py runs it on the
 * seeds and the kept crash files.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
    int verbose = getenv("RLX_FUZZ_VERBOSE") != NULL;
    for (int i = 1; i < argc; i++) {
        if (verbose) {
            printf("== %s\n", argv[i]);
            fflush(stdout);
        }
        FILE *f = fopen(argv[i], "rb");
        if (f == NULL) {
            perror(argv[i]);
            return 2;
        }
        size_t cap = 1 << 16, n = 0;
        uint8_t *data = malloc(cap);
        for (size_t got; data != NULL && (got = fread(data + n, 1, cap - n, f)) > 0;) {
            n += got;
            if (n == cap) {
                uint8_t *grown = realloc(data, cap *= 2);
                if (grown == NULL) free(data);
                data = grown;
            }
        }
        fclose(f);
        if (data == NULL) {
            fprintf(stderr, "%s: out of memory\n", argv[i]);
            return 2;
        }
        LLVMFuzzerTestOneInput(data, n);
        free(data);
    }
    printf("replayed %d inputs\n", argc - 1);
    return 0;
}
