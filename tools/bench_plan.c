/* tools/bench_plan.c: `brigade bench plan`, the same as `brigade plan --bench`:
 * the exact partitioner on 1000 layers over 8..1000 stages (homogeneous and
 * heterogeneous devices) and the layout search on 1024 devices. */
#include "tools/cli.h"

int bg_bench_plan(int argc, char **argv);

int bg_bench_plan(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    char a0[] = "plan", a1[] = "--bench";
    char *av[] = {a0, a1, NULL};
    return bg_cmd_plan(2, av);
}
