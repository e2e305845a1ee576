/* tools/measure.c: time every layer of a model on this machine's backend
 * (`brigade plan --measure`, `brigade profile`): forward, fused backward, and
 * the split B and W, medians of 8, each timed call starting with half the
 * last-level cache evicted, with copies of the measurement running beside it
 * for the other ranks that will share this machine's cores. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/measure.h"

/* ---------------------------------------------------------------- measure */

/* Fill a backend buffer of n floats with small pseudo-random values. */
static void fill_random(bg_backend_t *be, float *dst, size_t n)
{
    float *h = malloc(n * sizeof(float));
    if (!h) {
        be->ops->fill(be, dst, 0.01f, n);
        return;
    }
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        h[i] = ((float)(x >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
    be->ops->from_host(be, dst, h, n * sizeof(float));
    free(h);
}

/* Time each layer's forward and fused backward on one microbatch (best of
 * reps after a warm-up), on this machine's backend. Layers with the same
 * profile (the GPT's blocks) are measured once. Speed 1 = this machine. */
static int measure_quiet; /* the load copies print nothing */

/* The last-level cache size (sysfs), or 32 MiB when it cannot be read. */
static size_t llc_bytes(void)
{
    size_t kb = 0;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f) {
        if (fscanf(f, "%zuK", &kb) != 1)
            kb = 0;
        fclose(f);
    }
    return kb ? kb * 1024 : (size_t)32 << 20;
}

/* Before each timed call, touch half the last-level cache: in a training step
 * the rest of the stage, the other microbatches and the other ranks sharing
 * that cache run in between, so a layer's weights and inputs are partly
 * evicted. (Measured on GPT and MLP plans: warm caches predict steps 10-40%
 * too fast, a fully flushed cache 25% too slow for small-batch layers; half
 * the LLC lands within 3-15%.) */
static void evict_caches(void)
{
    static volatile unsigned char *buf;
    static size_t bytes;
    if (!buf) {
        bytes = llc_bytes() / 2;
        if (!(buf = malloc(bytes)))
            return;
    }
    for (size_t i = 0; i < bytes; i += 64)
        buf[i] = (unsigned char)(buf[i] + 1);
}


static int measure_layers(const char *CMD, bg_model_desc_t *desc, int n, int t, const char *backend, int threads,
                          double *fwd, double *bwd, double *bsplit, double *wsplit, int *L_p)
{
    static bg_layer_profile_t prof[4096];
    int L = 0;
    bg_status_t st = bg_model_profile(desc, n, t, prof, 4096, &L);
    if (st != BG_OK)
        return bg_cli_status(CMD, st);
    const bg_model_desc_params_t *mp = bg_model_desc_params(desc);
    int tokens = mp->input == BG_INPUT_TOKENS;
    int classes = bg_model_desc_classes(desc), ids = tokens && mp->vocab < classes ? mp->vocab : classes;
    bg_backend_t *be = NULL;
    bg_backend_params_t bp = bg_cli_backend_params(threads);
    if ((st = bg_backend_create(backend, &bp, &be)) != BG_OK)
        return bg_cli_status(CMD, st);
    int32_t *tok = malloc((size_t)n * (size_t)t * sizeof(int32_t));
    if (!tok) {
        bg_backend_destroy(be);
        return bg_cli_fail(CMD, "out of memory");
    }
    for (int i = 0; i < n * t; i++)
        tok[i] = (int32_t)((i * 7919) % ids); /* token ids and targets alike */
    int rc = 0;
    if (!measure_quiet)
        printf("measuring %d layers on the %s backend (microbatch %d)...\n", L, backend, n);
    for (int i = 0; i < L && rc == 0; i++) {
        int same = -1; /* an earlier inner layer with the same profile */
        for (int j = 1; j < i && i < L - 1; j++)
            if (prof[j].params == prof[i].params && prof[j].stash_bytes == prof[i].stash_bytes &&
                prof[j].wstash_bytes == prof[i].wstash_bytes && prof[j].output_bytes == prof[i].output_bytes &&
                prof[j].fwd_flops == prof[i].fwd_flops && prof[j].bwd_flops == prof[i].bwd_flops) {
                same = j;
                break;
            }
        if (same >= 0) {
            fwd[i] = fwd[same];
            bwd[i] = bwd[same];
            bsplit[i] = bsplit[same];
            wsplit[i] = wsplit[same];
            continue;
        }
        bg_model_t *m = NULL;
        bg_stage_t *stg = NULL;
        if ((st = bg_model_create(desc, be, i, i, &m)) != BG_OK || (st = bg_stage_create(m, 1, &stg)) != BG_OK) {
            rc = bg_cli_status(CMD, st);
            bg_model_destroy(m);
            break;
        }
        bg_shape_t in = bg_model_input_shape(m, n, t);
        for (int k = 0; k < i && st == BG_OK; k++)
            st = bg_layer_out_shape(bg_model_layer(m, k), in, &in);
        enum { REPS = 8 };
        double tf[REPS], tb[REPS], tsb[REPS], tsw[REPS];
        int nr = 0;
        for (int r = 0; r < REPS + 1 && st == BG_OK; r++) {
            float *inp = NULL, *out = NULL, *dout = NULL, *din = NULL;
            bg_shape_t os;
            if ((st = bg_stage_begin(stg, 0, in, &inp)) != BG_OK)
                break;
            if (inp)
                fill_random(be, inp, bg_shape_numel(in));
            if (i == 0 || i == L - 1)
                st = bg_stage_set_data(stg, 0, i == 0 && tokens ? tok : NULL, i == L - 1 ? tok : NULL,
                                       1.0f / (float)(n * t));
            /* in training the other layers of the stage and of the other
             * microbatches run in between: start each rep with cold caches */
            evict_caches();
            double t0 = bg_now();
            if (st == BG_OK)
                st = bg_stage_forward(stg, 0, &out, &os);
            be->ops->synchronize(be);
            double t1 = bg_now();
            if (st == BG_OK && i < L - 1 && (st = bg_stage_grad_buffer(stg, 0, &dout)) == BG_OK)
                fill_random(be, dout, bg_shape_numel(os));
            evict_caches();
            double t2 = bg_now();
            if (st == BG_OK)
                st = bg_stage_backward(stg, 0, &din);
            be->ops->synchronize(be);
            double t3 = bg_now();
            bg_stage_end(stg, 0);
            /* the same microbatch again with the backward split into B and W */
            double t4 = 0, t5 = 0, t6 = 0;
            if (st == BG_OK && (st = bg_stage_begin(stg, 0, in, &inp)) == BG_OK) {
                if (inp)
                    fill_random(be, inp, bg_shape_numel(in));
                if (i == 0 || i == L - 1)
                    st = bg_stage_set_data(stg, 0, i == 0 && tokens ? tok : NULL, i == L - 1 ? tok : NULL,
                                           1.0f / (float)(n * t));
                if (st == BG_OK)
                    st = bg_stage_forward(stg, 0, &out, &os);
                if (st == BG_OK && i < L - 1 && (st = bg_stage_grad_buffer(stg, 0, &dout)) == BG_OK)
                    fill_random(be, dout, bg_shape_numel(os));
                evict_caches();
                t4 = bg_now();
                if (st == BG_OK)
                    st = bg_stage_backward_input(stg, 0, &din);
                be->ops->synchronize(be);
                t5 = bg_now();
                if (st == BG_OK)
                    st = bg_stage_backward_weight(stg, 0);
                else
                    bg_stage_end(stg, 0);
                be->ops->synchronize(be);
                t6 = bg_now();
            }
            if (r > 0) { /* the first is a warm-up */
                tf[nr] = t1 - t0;
                tb[nr] = t3 - t2;
                tsb[nr] = t5 - t4;
                tsw[nr++] = t6 - t5;
            }
        }
        if (st != BG_OK)
            rc = bg_cli_status(CMD, st);
        /* medians: what a training step sees, not the luckiest run */
        fwd[i] = bg_median(tf, (size_t)nr);
        bwd[i] = bg_median(tb, (size_t)nr);
        bsplit[i] = bg_median(tsb, (size_t)nr);
        wsplit[i] = bg_median(tsw, (size_t)nr);
        bg_stage_destroy(stg);
        bg_model_destroy(m);
    }
    free(tok);
    bg_backend_destroy(be);
    if (rc == 0 && !measure_quiet) {
        double f = 0, b = 0, ff = 0, fb = 0;
        for (int i = 0; i < L; i++) {
            f += fwd[i], b += bwd[i];
            ff += prof[i].fwd_flops, fb += prof[i].bwd_flops;
        }
        printf("measured per microbatch: forward %.3f ms, backward %.3f ms (%.2f and %.2f GFLOP/s)\n\n", 1e3 * f,
               1e3 * b, f > 0 ? ff / f / 1e9 : 0.0, b > 0 ? fb / b / 1e9 : 0.0);
    }
    *L_p = L;
    return rc;
}

/* ---------------------------------------------------------------- bench */


int bg_cli_measure_layers(const char *cmd, bg_model_desc_t *desc, int n, int t, const char *backend, int threads,
                          int ranks, double *fwd, double *bwd, double *bsplit, double *wsplit, int *L_p)
{
    /* the ranks of one machine compute at the same time and share its caches
     * and memory bandwidth: measure under that load, with copies of the same
     * measurement running beside this one (one per other rank on the cores) */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int copies = (int)((ranks < ncpu ? ranks : ncpu) - 1);
    pid_t kids[64];
    int nk = 0;
    fflush(stdout);
    for (int k = 0; k < copies && k < 64; k++) {
        pid_t pid = fork();
        if (pid == 0) {
            static double sf[4096], sb[4096], sbs[4096], sws[4096];
            int sl;
            measure_quiet = 1;
            for (;;)
                if (measure_layers(cmd, desc, n, t, backend, threads, sf, sb, sbs, sws, &sl))
                    _exit(1);
        }
        if (pid > 0)
            kids[nk++] = pid;
    }
    if (nk)
        printf("measuring with %d cop%s running beside (as many ranks share this machine's cores)\n", nk,
               nk == 1 ? "y" : "ies");
    int rc = measure_layers(cmd, desc, n, t, backend, threads, fwd, bwd, bsplit, wsplit, L_p);
    for (int k = 0; k < nk; k++) {
        kill(kids[k], SIGKILL);
        waitpid(kids[k], NULL, 0);
    }
    return rc;
}
