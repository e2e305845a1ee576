/* tests/package/consumer/consumer.c: a program built out of tree against an
 * installed brigade (find_package or pkg-config). It checks that the headers
 * and the library it runs with agree on the version, then trains a tiny MLP
 * for 2 steps in one process and exits non-zero unless the loss is finite. */
#include <brigade/brigade.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    if (strcmp(bg_version(), BRIGADE_VERSION_STRING) != 0) {
        fprintf(stderr, "consumer: headers say brigade %s but the library is %s\n",
                BRIGADE_VERSION_STRING, bg_version());
        return 1;
    }
    bg_train_config_t cfg;
    bg_train_config_init(&cfg);
    cfg.model.kind = BG_MODEL_MLP;
    cfg.model.layers = 2;
    cfg.model.d_model = 16;
    cfg.model.in_features = 8;
    cfg.model.classes = 4;
    cfg.batch = 4;
    cfg.microbatches = 2;
    cfg.steps = 2;
    cfg.threads = 1;
    cfg.pp = cfg.dp = 1;
    bg_train_result_t r;
    if (bg_train(&cfg, &r) != BG_OK) {
        fprintf(stderr, "consumer: bg_train: %s\n", bg_last_error());
        return 1;
    }
    if (!isfinite(r.first_loss) || !isfinite(r.final_loss)) {
        fprintf(stderr, "consumer: expected a finite loss, got %g -> %g\n", r.first_loss, r.final_loss);
        return 1;
    }
    printf("consumer: brigade %s, mlp %zu parameters, loss %.4f -> %.4f\n", bg_version(), r.params,
           r.first_loss, r.final_loss);
    bg_train_result_free(&r);
    return 0;
}
