/* runtime/train.c: single-process training: data -> microbatches -> stage
 * F and fused backward in microbatch order -> optimizer step, with metrics
 * and the final weights as safetensors. The pipeline executor reproduces
 * exactly this arithmetic across processes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "brigade/train.h"
#include "core/check.h"

void bg_train_config_init(bg_train_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->size = sizeof(*cfg);
    cfg->model = (bg_model_config_t)BG_MODEL_CONFIG_INIT;
    cfg->optim = (bg_optim_config_t)BG_OPTIM_CONFIG_INIT;
    cfg->batch = 8;
    cfg->microbatches = 4;
    cfg->steps = 20;
    cfg->data_seed = 1;
    cfg->backend = "cpu";
}

/* mkdir -p: create missing parents too. */
static int mkdir_p(const char *dir)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s", dir) >= (int)sizeof(tmp)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755);
}

bg_status_t bg_check_writable_dir(const char *dir)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT)
            return bg_error(BG_ERR_IO, "cannot use directory %s: %s", dir, strerror(errno));
        /* several ranks may create it at once: EEXIST is fine if it is a directory */
        if (mkdir_p(dir) != 0 && !(errno == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)))
            return bg_error(BG_ERR_IO, "cannot create directory %s: %s", dir, strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
        return bg_error(BG_ERR_IO, "%s exists and is not a directory", dir);
    }
    char probe[4096];
    snprintf(probe, sizeof(probe), "%s/.brigade-write-probe.%d", dir, (int)getpid());
    FILE *f = fopen(probe, "wb");
    if (!f)
        return bg_error(BG_ERR_IO, "directory %s is not writable: %s", dir, strerror(errno));
    fclose(f);
    unlink(probe);
    return BG_OK;
}

bg_status_t bg_train_check(const bg_train_config_t *c)
{
    BG_CHECK(bg_model_config_check(&c->model));
    if (c->batch < 1)
        return bg_error(BG_ERR_INVALID, "batch must be >= 1 (got %d)", c->batch);
    if (c->microbatches < 1)
        return bg_error(BG_ERR_INVALID, "microbatches must be >= 1 (got %d)", c->microbatches);
    if (c->batch % c->microbatches != 0)
        return bg_error(BG_ERR_INVALID, "batch %d is not divisible into %d equal microbatches", c->batch,
                        c->microbatches);
    if (c->steps < 0)
        return bg_error(BG_ERR_INVALID, "steps must be >= 0 (got %d)", c->steps);
    if (c->model.kind == BG_MODEL_GPT) {
        int t = c->seq ? c->seq : c->model.seq_len;
        if (t < 1 || t > c->model.seq_len)
            return bg_error(BG_ERR_INVALID, "sequence length %d must be in [1, %d] (the model's maximum)", t,
                            c->model.seq_len);
        if (!c->data_path || !*c->data_path)
            return bg_error(BG_ERR_INVALID, "a GPT needs a text data file");
        if (c->model.vocab < 256)
            return bg_error(BG_ERR_INVALID, "vocab %d is too small: the corpus is read as bytes (0..255), so it must be "
                                            ">= 256", c->model.vocab);
    }
    if (!(c->optim.lr > 0))
        return bg_error(BG_ERR_INVALID, "learning rate must be > 0 (got %g)", (double)c->optim.lr);
    if (c->pp < 0 || c->dp < 0)
        return bg_error(BG_ERR_INVALID, "pp and dp must be >= 1 (got %d, %d)", c->pp, c->dp);
    int dp = c->dp ? c->dp : 1;
    if (c->batch % (dp * c->microbatches) != 0)
        return bg_error(BG_ERR_INVALID,
                        "batch %d does not split into %d replicas x %d equal microbatches", c->batch, dp,
                        c->microbatches);
    if (c->seq_min < 0)
        return bg_error(BG_ERR_INVALID, "seq_min must be >= 0 (got %d)", c->seq_min);
    if (c->checkpoint_every < 0 || c->keep < 0)
        return bg_error(BG_ERR_INVALID, "checkpoint_every and keep must be >= 0");
    if ((c->resume || c->checkpoint_every) && !c->checkpoint_dir)
        return bg_error(BG_ERR_INVALID, "--resume and --checkpoint-every need --checkpoint-dir");
    return BG_OK;
}

int bg_train_seq_len(const bg_train_config_t *c, int64_t step, int mb)
{
    if (c->model.kind != BG_MODEL_GPT)
        return 1;
    int T = c->seq ? c->seq : c->model.seq_len;
    if (c->seq_min <= 0 || c->seq_min >= T)
        return T;
    bg_rng_t r;
    bg_rng_seed(&r, c->data_seed ^ ((uint64_t)step * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)mb << 40) ^ 0x5e9ULL);
    return c->seq_min + (int)bg_rng_below(&r, (uint64_t)(T - c->seq_min + 1));
}

/* Tokens in one step's global batch (the loss is their mean). */
double bg__train_step_tokens(const bg_train_config_t *c, int64_t step)
{
    double tokens = 0;
    for (int mb = 0; mb < c->microbatches; mb++)
        tokens += (double)(c->batch / c->microbatches) * bg_train_seq_len(c, step, mb);
    return tokens;
}

/* Model configuration as JSON text (safetensors metadata, checkpoints). */
void bg__train_config_json(const bg_model_config_t *m, char *buf, size_t n)
{
    snprintf(buf, n,
             "{\"model\":\"%s\",\"layers\":%d,\"d_model\":%d,\"heads\":%d,\"seq_len\":%d,\"vocab\":%d,"
             "\"in_features\":%d,\"classes\":%d,\"seed\":%llu,\"tie_embeddings\":%d}",
             m->kind == BG_MODEL_GPT ? "gpt" : "mlp", m->layers, m->d_model, m->heads, m->seq_len, m->vocab,
             m->in_features, m->classes, (unsigned long long)m->seed, m->tie_embeddings);
}

bg_status_t bg_train(const bg_train_config_t *cfg_in, bg_train_result_t *result_p)
{
    bg_train_config_t c;
    bg_train_config_init(&c);
    memcpy(&c, cfg_in, cfg_in->size < sizeof(c) ? cfg_in->size : sizeof(c));
    c.size = sizeof(c);
    BG_CHECK(bg_train_check(&c));

    bg_status_t st = BG_OK;
    bg_backend_t *be = NULL;
    bg_model_t *model = NULL;
    bg_stage_t *stage = NULL;
    bg_data_t *data = NULL;
    FILE *metrics = NULL;
    int32_t *tokens = NULL, *targets = NULL;
    float *inputs = NULL;
    double *times = NULL;
    bg_train_result_t res = {0};

    int gpt = c.model.kind == BG_MODEL_GPT;
    if (c.pp > 1 || c.dp > 1 || c.checkpoint_dir)
        return bg_train_parallel(&c, result_p);
    int T = gpt ? (c.seq ? c.seq : c.model.seq_len) : 1;
    int mbn = c.batch / c.microbatches; /* sequences per microbatch */

    if (gpt)
        BG_CHECK_GOTO(bg_data_open_text(c.data_path, T, c.data_seed, &data), st, out);
    else
        BG_CHECK_GOTO(bg_data_synthetic(c.model.in_features, c.model.classes, c.data_seed, &data), st, out);
    if (c.save_dir)
        BG_CHECK_GOTO(bg_check_writable_dir(c.save_dir), st, out);
    if (c.metrics_path && !(metrics = fopen(c.metrics_path, "w"))) {
        st = bg_error(BG_ERR_IO, "cannot write metrics file %s: %s", c.metrics_path, strerror(errno));
        goto out;
    }

    bg_backend_params_t bp = BG_BACKEND_PARAMS_INIT;
    bp.num_threads = c.threads;
    BG_CHECK_GOTO(bg_backend_create(c.backend, &bp, &be), st, out);
    BG_CHECK_GOTO(bg_model_create(&c.model, be, -1, -1, &model), st, out);
    BG_CHECK_GOTO(bg_stage_create(model, c.microbatches, &stage), st, out);
    BG_CHECK_GOTO(bg_model_optim_init(model, c.optim.kind), st, out); /* up front: the peak is the same every step */
    if (c.recompute || (c.recompute_stages && c.nrecompute_stages > 0 && c.recompute_stages[0]))
        bg_stage_set_recompute(stage, 1);

    size_t per = (size_t)mbn * (size_t)T; /* the largest microbatch */
    tokens = malloc(per * sizeof(int32_t));
    targets = malloc(per * sizeof(int32_t));
    inputs = gpt ? NULL : malloc((size_t)mbn * (size_t)c.model.in_features * sizeof(float));
    enum { BG_TIMED = 4096 }; /* the last BG_TIMED step times give the median */
    times = calloc(BG_TIMED, sizeof(double));
    if (!tokens || !targets || (!gpt && !inputs) || !times) {
        st = bg_error(BG_ERR_NOMEM, "training buffers");
        goto out;
    }

    /* FLOPs and the memory prediction from what the layers report */
    bg_shape_t in_shape = bg_model_input_shape(model, mbn, T);
    {
        int L = bg_model_total_layers(model);
        bg_layer_profile_t *prof = calloc((size_t)L, sizeof(*prof));
        int cnt;
        if (!prof) {
            st = BG_ERR_NOMEM;
            goto out;
        }
        st = bg_model_profile(&c.model, mbn, T, prof, L, &cnt);
        if (st != BG_OK) {
            free(prof);
            goto out;
        }
        double fl = 0;
        for (int i = 0; i < cnt; i++)
            fl += prof[i].fwd_flops + prof[i].bwd_flops;
        free(prof);
        res.flops_per_step = fl * c.microbatches;
        bg_stage_mem_t mem;
        BG_CHECK_GOTO(bg_stage_memory(stage, in_shape, &mem), st, out);
        res.params = bg_model_param_count(model);
        size_t p4 = res.params * sizeof(float);
        /* params + grads + optimizer + one microbatch's activations (the
         * fused backward runs right after each forward) + the scratch */
        res.predicted_bytes = 2 * p4 + res.params * bg_optim_state_bytes(c.optim.kind) + mem.stash + mem.data +
                              mem.dout + mem.fused_bw + mem.scratch + mem.recompute;
    }

    for (int step = 0; step < c.steps; step++) {
        double t0 = bg_now();
        double loss = 0, step_tokens = bg__train_step_tokens(&c, step);
        float loss_scale = (float)(1.0 / step_tokens);
        bg_model_zero_grads(model);
        for (int mb = 0; mb < c.microbatches; mb++) {
            int Tm = bg_train_seq_len(&c, step, mb);
            size_t ntok = (size_t)mbn * (size_t)Tm;
            BG_CHECK_GOTO(bg_data_batch(data, step, mb * mbn, mbn, Tm, tokens, inputs, targets), st, out);
            float *in, *out, *din;
            bg_shape_t out_shape;
            BG_CHECK_GOTO(bg_stage_begin(stage, mb, bg_model_input_shape(model, mbn, Tm), &in), st, out);
            if (!gpt)
                be->ops->from_host(be, in, inputs, (size_t)mbn * (size_t)c.model.in_features * sizeof(float));
            BG_CHECK_GOTO(bg_stage_set_data(stage, mb, gpt ? tokens : NULL, targets, loss_scale), st, out);
            BG_CHECK_GOTO(bg_stage_forward(stage, mb, &out, &out_shape), st, out);
            loss += be->ops->sum(be, out, ntok) * (double)loss_scale;
            BG_CHECK_GOTO(bg_stage_backward(stage, mb, &din), st, out);
            bg_stage_end(stage, mb);
        }
        bg_model_tie_grads_local(model);
        BG_CHECK_GOTO(bg_model_optim_step(model, &c.optim, step + 1), st, out);
        be->ops->synchronize(be);
        double dt = bg_now() - t0;
        times[step % BG_TIMED] = dt;
        if (step == 0)
            res.first_loss = loss;
        res.final_loss = loss;
        bg_step_info_t info = {step + 1, c.steps, loss, dt * 1e3, step_tokens / dt, 0};
        if (metrics) {
            fprintf(metrics, "{\"step\": %d, \"loss\": %.6f, \"tokens_per_s\": %.1f, \"step_ms\": %.3f}\n", step + 1,
                    loss, info.tokens_per_s, info.step_ms);
            fflush(metrics);
        }
        if (c.on_step)
            c.on_step(&info, c.on_step_arg);
    }
    if (c.steps > 0) {
        int n = c.steps < BG_TIMED ? c.steps : BG_TIMED;
        double med = bg_median(times, (size_t)n);
        res.median_step_ms = med * 1e3;
        res.tokens_per_s = bg__train_step_tokens(&c, c.steps / 2) / med;
    }
    res.peak_bytes = bg_backend_memstats(be).peak;
    if (c.save_dir) {
        char path[4096], meta[1024];
        snprintf(path, sizeof(path), "%s/model.safetensors", c.save_dir);
        bg__train_config_json(&c.model, meta, sizeof(meta));
        BG_CHECK_GOTO(bg_model_save_safetensors(model, path, meta), st, out);
    }
    *result_p = res;
out:
    if (metrics && fclose(metrics) != 0 && st == BG_OK)
        st = bg_error(BG_ERR_IO, "closing metrics file %s: %s", c.metrics_path, strerror(errno));
    free(tokens);
    free(targets);
    free(inputs);
    free(times);
    bg_stage_destroy(stage);
    bg_model_destroy(model);
    bg_backend_destroy(be);
    bg_data_close(data);
    return st;
}
