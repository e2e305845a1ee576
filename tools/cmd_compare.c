/* tools/cmd_compare.c: `brigade compare DIR_A DIR_B [--rtol X]`: compare two
 * runs' saved weights tensor by tensor (any split on either side). */
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

int bg_cmd_compare(int argc, char **argv)
{
    const char *cmd = "compare";
    double rtol = 0, rel_l2 = -1;
    const char *dirs[2] = {0};
    int nd = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: brigade compare DIR_A DIR_B [--rtol X | --rel-l2 X]\n"
                   "  compares every tensor of the *.safetensors files in two directories (written by\n"
                   "  brigade train --save with any layout). Exit 0 when the same tensors exist on both\n"
                   "  sides and each is bitwise equal, or within --rtol X for every tensor\n"
                   "  (max |a-b| / max |a|), or within --rel-l2 X over all tensors (||a-b|| / ||a||).\n");
            return 0;
        }
        if (!strcmp(argv[i], "--rel-l2")) {
            if (bg_cli_double(cmd, "--rel-l2", i + 1 < argc ? argv[i + 1] : NULL, 0, 1, &rel_l2))
                return 2;
            i++;
            continue;
        }
        if (!strcmp(argv[i], "--rtol")) {
            if (bg_cli_double(cmd, "--rtol", i + 1 < argc ? argv[i + 1] : NULL, 0, 1, &rtol))
                return 2;
            i++;
            continue;
        }
        if (argv[i][0] == '-') {
            static const char *const known[] = {"--rtol", "--rel-l2", "--help", NULL};
            return bg_cli_unknown_option(cmd, argv[i], known);
        }
        if (nd == 2)
            return bg_cli_fail(cmd, "expects two directories, got a third: \"%s\"", argv[i]);
        dirs[nd++] = argv[i];
    }
    if (nd != 2)
        return bg_cli_fail(cmd, "expects two directories (see brigade compare --help)");
    bg_compare_result_t r;
    bg_status_t st = bg_safetensors_compare_dirs(dirs[0], dirs[1], &r);
    if (st != BG_OK)
        return bg_cli_status(cmd, st);
    printf("%d tensors compared: %d bitwise identical, max abs diff %.3g, max rel diff %.3g%s%s, relative L2 %.3g\n",
           r.tensors, r.identical, r.max_abs, r.max_rel, r.worst[0] ? " in " : "", r.worst, r.rel_l2);
    if (r.only_a || r.only_b || r.shape_mismatch) {
        printf("%d tensors only in %s, %d only in %s, %d with different shapes\n", r.only_a, dirs[0], r.only_b,
               dirs[1], r.shape_mismatch);
        return 1;
    }
    if (r.tensors == 0)
        return 1;
    if (r.identical == r.tensors)
        return 0;
    if (r.rel_l2 != r.rel_l2) { /* a NaN where bits differ: every comparison below would be false */
        printf("not-a-number values differ: not within any tolerance\n");
        return 1;
    }
    if (rel_l2 >= 0)
        return r.rel_l2 <= rel_l2 ? 0 : 1;
    return r.max_rel <= rtol ? 0 : 1;
}
