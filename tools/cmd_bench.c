/* tools/cmd_bench.c: `brigade bench <kind> [options]` dispatches to tools/bench_<kind>.c. */
#include <string.h>

#include "tools/bench.h"
#include "tools/cli.h"

typedef struct {
    const char *name, *help;
    int (*fn)(int, char **);
} bg_bench_entry_t;

int bg_cmd_bench(int argc, char **argv)
{
    const bg_bench_entry_t table[] = {
#define BG__BENCH_ENTRY(name, help) {#name, help, bg_bench_##name},
        BG_BENCH_LIST(BG__BENCH_ENTRY)
#undef BG__BENCH_ENTRY
    };
    size_t n = sizeof(table) / sizeof(table[0]);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: brigade bench <kind> [options]   (brigade bench <kind> --help)\n\nkinds:\n");
        for (size_t i = 0; i < n; i++)
            fprintf(f, "  %-10s %s%s\n", table[i].name, table[i].help, table[i].fn ? "" : " [not built]");
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(argv[1], table[i].name) != 0)
            continue;
        if (!table[i].fn)
            return bg_cli_fail("bench", "benchmark \"%s\" is not built into this binary", argv[1]);
        return table[i].fn(argc - 1, argv + 1);
    }
    const char *names[sizeof(table) / sizeof(table[0]) + 1] = {0};
    for (size_t i = 0; i < n; i++)
        names[i] = table[i].name;
    const char *near = bg_cli_nearest(argv[1], names);
    if (near)
        return bg_cli_fail("bench", "unknown benchmark \"%s\" (did you mean %s?)", argv[1], near);
    return bg_cli_fail("bench", "unknown benchmark \"%s\" (try brigade bench --help)", argv[1]);
}
