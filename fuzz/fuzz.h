/* fuzz/fuzz.h: what every libFuzzer harness shares: the library's messages
 * go to a sink that drops them (a fuzzer prints nothing per input), and the
 * input as a NUL-terminated string for the parsers that take one. */
#ifndef BG_FUZZ_H
#define BG_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/core.h"

static void bg_fuzz_sink(bg_log_level_t level, const char *subsys, int rank, const char *message, void *arg)
{
    (void)level, (void)subsys, (void)rank, (void)message, (void)arg;
}

/* Once per process: silence the logger. */
static inline void bg_fuzz_init(void)
{
    static int done;
    if (!done) {
        bg_log_set_sink(bg_fuzz_sink, NULL);
        done = 1;
    }
}

/* data as a C string (malloc'ed; NULL on OOM). Bytes after an embedded NUL
 * are invisible to the parser, as they would be in a file read as text. */
static inline char *bg_fuzz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (s) {
        memcpy(s, data, size);
        s[size] = 0;
    }
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
