/* tests/checkpoint/bench_checkpoint.c: save / latest / load throughput of a
 * checkpoint (not a test; run by hand, see docs/checkpoints.md):
 *   build/tests/checkpoint/bench_checkpoint [ROOT] [LAYERS] [D_MODEL]
 * ROOT is removed at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/brigade.h"
#include "bg_test_model.h"
#include "brigade/checkpoint.h"

int main(int argc, char **argv)
{
    const char *root = argc > 1 ? argv[1] : "bench-checkpoint";
    bg_model_config_t c = BG_MODEL_CONFIG_INIT;
    c.layers = argc > 2 ? atoi(argv[2]) : 8;
    c.d_model = argc > 3 ? atoi(argv[3]) : 512;
    c.heads = 8;
    c.seq_len = 256;
    bg_backend_t *be;
    bg_backend_params_t bp = BG_BACKEND_PARAMS_INIT;
    bp.num_threads = 1;
    bg_model_t *m;
    if (bg_backend_create("cpu", &bp, &be) != BG_OK || bg_test_model_create(&c, be, -1, -1, &m) != BG_OK ||
        bg_model_optim_init(m, BG_OPTIM_ADAMW) != BG_OK) {
        fprintf(stderr, "setup: %s\n", bg_last_error());
        return 1;
    }
    size_t n = bg_model_param_count(m);
    double mb = 3.0 * (double)n * 4 / 1e6;
    printf("GPT %d x %d: %zu parameters, %.0f MB with AdamW state\n", c.layers, c.d_model, n, mb);
    bg_checkpoint_params_t p = BG_CHECKPOINT_PARAMS_INIT;
    p.root = root;
    p.models = &m;
    p.nmodels = 1;
    p.keep = 2;
    int rc = 0;
    for (int s = 1; s <= 3 && rc == 0; s++) {
        p.step = s;
        char dir[4096];
        int64_t step;
        double t0 = bg_now();
        if (bg_checkpoint_save(&p) != BG_OK) {
            fprintf(stderr, "save: %s\n", bg_last_error());
            rc = 1;
            break;
        }
        double t1 = bg_now();
        bg_status_t st = bg_checkpoint_latest(root, dir, sizeof dir, &step);
        double t2 = bg_now();
        if (st == BG_OK)
            st = bg_checkpoint_load(dir, &m, 1, NULL);
        double t3 = bg_now();
        if (st != BG_OK) {
            fprintf(stderr, "load: %s\n", bg_last_error());
            rc = 1;
            break;
        }
        printf("save %.3f s (%.0f MB/s)   latest %.2f ms   load+verify %.3f s (%.0f MB/s)\n", t1 - t0,
               mb / (t1 - t0), (t2 - t1) * 1e3, t3 - t2, mb / (t3 - t2));
    }
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        rc = 1;
    bg_test_model_destroy(m);
    bg_backend_destroy(be);
    return rc;
}
