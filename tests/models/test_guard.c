/* tests/models/test_guard.c: the stage's guard zones (BRIGADE_GUARD). A
 * user layer whose reported sizes are smaller than what it touches (its
 * stash, wstash, scratch, output or input gradient) must fail the call with
 * a message naming the layer and the buffer, in the split and the fused
 * backward; a correct layer must run with guards on and give bitwise the
 * results of guards off. Canaries (BRIGADE_GUARD=canary, what auto means in
 * Release builds) catch the same overruns of the kept buffers in every build.
 *
 * Under AddressSanitizer the stage poisons the zones during each call, so
 * the bad access aborts the process before the stage's check runs: there
 * each overrun runs in a child process (this program, re-executed with
 * --overrun) and the test expects ASan's use-after-poison report. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "brigade/brigade.h"
#include "bg_test_backend.h"

#if defined(__SANITIZE_ADDRESS__)
#define GUARD_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GUARD_TEST_ASAN 1
#endif
#endif

extern char **environ;

/* What the "bad" layer does wrong. */
typedef enum {
    BAD_NONE = 0,     /* a correct layer */
    BAD_STASH,        /* forward writes 4 bytes past its stash */
    BAD_WSTASH,       /* backward_input writes 4 bytes past its wstash */
    BAD_WSTASH_W,     /* backward_weight writes 4 bytes past its wstash */
    BAD_SCRATCH,      /* forward writes 4 bytes past its scratch */
    BAD_OUT,          /* forward writes 4 bytes past the output its out_shape reports */
    BAD_DIN,          /* backward_input writes 4 bytes past din */
    BAD_READ,         /* backward_input reads 4 bytes past its stash (only ASan sees reads) */
    BAD_COUNT
} bad_mode_t;

typedef struct {
    int c;
    bad_mode_t mode;
} bad_t;

/* y = x * w per channel; stash = x, wstash = dout, scratch = x * w: every
 * buffer the stage hands a layer is used, each reported as numel floats. */
static bg_status_t bad_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const bad_t *p = l->impl;
    if (in.c != p->c)
        return bg_error(BG_ERR_INVALID, "bad %s: input has %d channels, expected %d", l->name, in.c, p->c);
    *out_p = in;
    return BG_OK;
}
static size_t bad_bytes(const bg_layer_t *l, bg_shape_t in) { (void)l; return bg_shape_numel(in) * sizeof(float); }
static double bad_flops(const bg_layer_t *l, bg_shape_t in) { (void)l; return (double)bg_shape_numel(in); }

static bg_status_t bad_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const bad_t *p = l->impl;
    const float *w = l->params[0].data;
    float *stash = ctx->stash, *scratch = ctx->scratch;
    size_t n = bg_shape_numel(ctx->in);
    for (size_t i = 0; i < n; i++) {
        scratch[i] = in[i] * w[i % (size_t)p->c];
        stash[i] = in[i];
    }
    memcpy(out, scratch, n * sizeof(float));
    if (p->mode == BAD_STASH)
        stash[n] = 1.0f;
    if (p->mode == BAD_SCRATCH)
        scratch[n] = 1.0f;
    if (p->mode == BAD_OUT)
        out[n] = 1.0f;
    return BG_OK;
}

static bg_status_t bad_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                      const float *dout, float *din)
{
    (void)in; (void)out;
    const bad_t *p = l->impl;
    const float *w = l->params[0].data, *stash = ctx->stash;
    float *wstash = ctx->wstash;
    size_t n = bg_shape_numel(ctx->in);
    for (size_t i = 0; i < n; i++) {
        wstash[i] = dout[i];
        if (din)
            din[i] = dout[i] * w[i % (size_t)p->c];
    }
    if (p->mode == BAD_WSTASH)
        wstash[n] = 1.0f;
    if (p->mode == BAD_DIN && din)
        din[n] = 1.0f;
    if (p->mode == BAD_READ) {
        volatile float past = stash[n];
        (void)past;
    }
    return BG_OK;
}

static bg_status_t bad_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                       const float *dout)
{
    (void)in; (void)out; (void)dout;
    const bad_t *p = l->impl;
    const float *stash = ctx->stash;
    float *wstash = ctx->wstash;
    size_t n = bg_shape_numel(ctx->in);
    for (size_t i = 0; i < n; i++)
        l->params[0].grad[i % (size_t)p->c] += wstash[i] * stash[i];
    if (p->mode == BAD_WSTASH_W)
        wstash[n] = 1.0f;
    return BG_OK;
}

static void bad_destroy(bg_layer_t *l) { free(l->impl); }

static const bg_layer_ops_t bad_ops = {
    .type = "bad",
    .out_shape = bad_out_shape,
    .stash_bytes = bad_bytes,
    .wstash_bytes = bad_bytes,
    .scratch_bytes = bad_bytes,
    .fwd_flops = bad_flops,
    .bwd_flops = bad_flops,
    .forward = bad_forward,
    .backward_input = bad_backward_input,
    .backward_weight = bad_backward_weight,
    .destroy = bad_destroy,
};

enum { C = 16, T = 4, N = 2, M = 2, CLASSES = 5 };

static bg_status_t bad_layer(int c, bad_mode_t mode, bg_layer_t **layer_p)
{
    bad_t *p = malloc(sizeof(*p));
    if (!p)
        return BG_ERR_NOMEM;
    p->c = c;
    p->mode = mode;
    bg_param_t w = {.name = "weight", .ndim = 1, .shape = {c}, .numel = (size_t)c, .init = BG_INIT_CONST,
                    .init_value = 0.75f};
    bg_status_t st = bg_layer_create(&bad_ops, "bad", 1, &w, p, layer_p);
    if (st != BG_OK)
        free(p);
    return st;
}

/* What a run gives: the first failing status and its message, the losses of
 * every microbatch and the gradients. */
typedef struct {
    bg_status_t st;
    char msg[1024];
    float loss[M * N * T];
    float grads[4096];
    size_t nparams;
} run_t;

/* [fc (linear), bad, head] on features (N, T, C): the bad layer's input
 * gradient is the linear layer's output gradient, inside the stage. */
static void build_model(bad_mode_t mode, bg_model_desc_t **desc_p, bg_model_t **m_p)
{
    bg_model_desc_params_t mp = BG_MODEL_DESC_PARAMS_INIT;
    mp.name = "guarded";
    mp.input = BG_INPUT_FEATURES;
    mp.seq_len = T;
    mp.features = C;
    mp.seed = 5;
    bg_model_desc_t *desc;
    bg_layer_t *fc, *bad, *head;
    assert_int_equal(bg_model_desc_create(&mp, &desc), BG_OK);
    assert_int_equal(bg_layer_linear("fc", C, C, 1, 0.3f, &fc), BG_OK);
    assert_int_equal(bg_model_desc_add(desc, fc), BG_OK);
    assert_int_equal(bad_layer(C, mode, &bad), BG_OK);
    assert_int_equal(bg_model_desc_add(desc, bad), BG_OK);
    assert_int_equal(bg_layer_head("head", C, CLASSES, 1, 0.3f, &head), BG_OK);
    assert_int_equal(bg_model_desc_add(desc, head), BG_OK);
    if (getenv("BG_TEST_BF16")) /* the stage keeps fc's and bad's outputs in bf16: bad gets fp32 copies */
        assert_int_equal(bg_model_desc_set_precision(desc, BG_BF16), BG_OK);
    assert_int_equal(bg_model_desc_check(desc), BG_OK);
    assert_int_equal(bg_model_create(desc, be, -1, -1, m_p), BG_OK);
    *desc_p = desc;
}

/* Forward and backward (split or fused) of M microbatches through one stage
 * with BRIGADE_GUARD = guard. */
static void run_model(bad_mode_t mode, int split, const char *guard, run_t *r)
{
    memset(r, 0, sizeof(*r));
    assert_int_equal(setenv("BRIGADE_GUARD", guard, 1), 0); /* read when the stage is created */
    bg_model_desc_t *desc;
    bg_model_t *m;
    build_model(mode, &desc, &m);
    bg_stage_t *s;
    assert_int_equal(bg_stage_create(m, M, &s), BG_OK);

    bg_status_t st = BG_OK;
    for (int mb = 0; mb < M && st == BG_OK; mb++) {
        float *in, *out;
        bg_shape_t os;
        assert_int_equal(bg_stage_begin(s, mb, bg_model_input_shape(m, N, T), &in), BG_OK);
        int32_t tgt[N * T];
        for (int i = 0; i < N * T * C; i++)
            in[i] = (float)((i * 7 + mb * 3) % 13) / 6.0f - 1.0f;
        for (int i = 0; i < N * T; i++)
            tgt[i] = (i + mb) % CLASSES;
        assert_int_equal(bg_stage_set_data(s, mb, NULL, tgt, 1.0f / (M * N * T)), BG_OK);
        st = bg_stage_forward(s, mb, &out, &os);
        if (st == BG_OK)
            memcpy(r->loss + mb * N * T, out, N * T * sizeof(float));
    }
    for (int mb = 0; mb < M && st == BG_OK; mb++) {
        float *din;
        if (split) {
            st = bg_stage_backward_input(s, mb, &din);
            if (st == BG_OK)
                st = bg_stage_backward_weight(s, mb);
        } else {
            st = bg_stage_backward(s, mb, &din);
            bg_stage_end(s, mb);
        }
    }
    r->st = st;
    if (st != BG_OK)
        snprintf(r->msg, sizeof(r->msg), "%s", bg_last_error());
    r->nparams = bg_model_param_count(m);
    assert_true(r->nparams <= sizeof(r->grads) / sizeof(r->grads[0]));
    memcpy(r->grads, bg_model_grads(m), r->nparams * sizeof(float));
    bg_stage_destroy(s);
    bg_model_destroy(m);
    bg_model_desc_destroy(desc);
    assert_int_equal(bg_backend_memstats(be).count, 0); /* every buffer freed, also after a failure */
}

/* A correct layer: guards on give bitwise the losses and gradients of guards off. */
static void test_correct_layer_same_bits(void **state)
{
    (void)state;
    run_t *off = malloc(sizeof(*off)), *on = malloc(sizeof(*on));
    assert_non_null(off);
    assert_non_null(on);
    for (int split = 0; split < 2; split++) {
        run_model(BAD_NONE, split, "off", off);
        run_model(BAD_NONE, split, "on", on);
        assert_int_equal(off->st, BG_OK);
        assert_int_equal(on->st, BG_OK);
        assert_int_equal(off->nparams, on->nparams);
        assert_memory_equal(off->loss, on->loss, sizeof(off->loss));
        assert_memory_equal(off->grads, on->grads, off->nparams * sizeof(float));
        double ss = 0;
        for (size_t i = 0; i < on->nparams; i++)
            ss += on->grads[i] * on->grads[i];
        assert_true(ss > 0); /* gradients really flowed */
    }
    free(off);
    free(on);
}

static void test_bad_setting(void **state)
{
    (void)state;
    assert_int_equal(setenv("BRIGADE_GUARD", "sometimes", 1), 0);
    bg_model_desc_t *d;
    bg_model_t *m;
    bg_stage_t *s;
    build_model(BAD_NONE, &d, &m);
    assert_int_equal(bg_stage_create(m, 1, &s), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "BRIGADE_GUARD=\"sometimes\": expected auto, on, off or canary"));
    bg_model_destroy(m);
    bg_model_desc_destroy(d);
    assert_int_equal(unsetenv("BRIGADE_GUARD"), 0);
}

#ifdef GUARD_TEST_ASAN
/* Re-run this program on one overrun; expect ASan's report on the bad access. */
static void expect_overrun(bad_mode_t mode, int split, const char *buffer, const char *call)
{
    (void)buffer; (void)call;
    char path[] = "/tmp/bg_test_guard.XXXXXX", a1[16], a2[16];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    snprintf(a1, sizeof(a1), "%d", (int)mode);
    snprintf(a2, sizeof(a2), "%d", split);
    char *argv[] = {"test_guard", "--overrun", a1, a2, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, path, O_WRONLY | O_TRUNC, 0600);
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    char out[65536] = "";
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t got = fread(out, 1, sizeof(out) - 1, f);
    out[got] = 0;
    fclose(f);
    unlink(path);
    if (!(WIFEXITED(ws) && WEXITSTATUS(ws) != 0 && WEXITSTATUS(ws) != 2) || !strstr(out, "use-after-poison"))
        fail_msg("mode %d split %d: expected ASan's use-after-poison report, got status 0x%x:\n%s", (int)mode,
                 split, ws, out);
}

/* The child: one run with guards on; ASan ends it at the bad access. */
static int overrun_child(int mode, int split)
{
    if (setup(NULL) != 0)
        return 3;
    run_t *r = malloc(sizeof(*r));
    run_model((bad_mode_t)mode, split, "on", r);
    fprintf(stderr, "child ended without an ASan report: %s\n", r->st == BG_OK ? "ok" : r->msg);
    free(r);
    teardown(NULL);
    return 2;
}
#else
/* Run one overrun in this process; expect the stage's message. */
static void expect_overrun(bad_mode_t mode, int split, const char *buffer, const char *call)
{
    run_t *r = malloc(sizeof(*r));
    assert_non_null(r);
    run_model(mode, split, "on", r);
    char want[128];
    snprintf(want, sizeof(want), "wrote past its %s in %s", buffer, call);
    if (r->st != BG_ERR_INVALID || !strstr(r->msg, "layer bad (type bad, model layer 1)") || !strstr(r->msg, want))
        fail_msg("mode %d split %d: expected BG_ERR_INVALID with \"%s\", got %d: %s", (int)mode, split, want,
                 (int)r->st, r->msg);
    free(r);
}
#endif

static void test_overrun_stash(void **state)
{
    (void)state;
    expect_overrun(BAD_STASH, 0, "stash", "forward");
#ifndef GUARD_TEST_ASAN
    run_t *r = malloc(sizeof(*r));
    run_model(BAD_STASH, 0, "on", r);
    assert_string_equal(r->msg, "layer bad (type bad, model layer 1) wrote past its stash in forward: it reports "
                                "stash_bytes = 512 for input (n 2, t 4, c 16), but bytes after that changed "
                                "(guard at offset 512)");
    free(r);
#endif
}

static void test_overrun_wstash(void **state)
{
    (void)state;
    for (int split = 0; split < 2; split++) {
        expect_overrun(BAD_WSTASH, split, "wstash", "backward_input");
        expect_overrun(BAD_WSTASH_W, split, "wstash", "backward_weight");
    }
}

static void test_overrun_scratch(void **state)
{
    (void)state;
    expect_overrun(BAD_SCRATCH, 0, "scratch", "forward");
}

static void test_overrun_output(void **state)
{
    (void)state;
    expect_overrun(BAD_OUT, 1, "output", "forward");
}

static void test_overrun_din(void **state)
{
    (void)state;
    for (int split = 0; split < 2; split++)
        expect_overrun(BAD_DIN, split, "input gradient", "backward_input");
}

/* A read past a reported size changes no guard: only ASan's poisoning sees it. */
static void test_read_past(void **state)
{
    (void)state;
#ifdef GUARD_TEST_ASAN
    expect_overrun(BAD_READ, 1, "stash", "backward_input");
#else
    run_t *r = malloc(sizeof(*r));
    run_model(BAD_READ, 1, "on", r);
    assert_int_equal(r->st, BG_OK);
    free(r);
#endif
}

/* Guards off: the same overrun goes unseen (it lands in the stage's padding
 * or the next buffer), which is what the guards are for. */
static void test_guards_off_unseen(void **state)
{
    (void)state;
    run_t *r = malloc(sizeof(*r));
    run_model(BAD_STASH, 0, "off", r);
    assert_int_equal(r->st, BG_OK);
    free(r);
}

/* Canaries, as a Release build runs by default: a layer that under-reports
 * its output's size (its out_shape) or its stash fails the call naming the
 * layer and the buffer (it used to corrupt the next buffer silently); a
 * correct layer gives the bits of guards off. */
static void test_canary(void **state)
{
    (void)state;
    run_t *r = malloc(sizeof(*r)), *off = malloc(sizeof(*off));
    assert_non_null(r);
    assert_non_null(off);
    const struct { bad_mode_t mode; int split; const char *want; } bad[] = {
        {BAD_OUT, 1, "wrote past its output in forward: its out_shape for input (n 2, t 4, c 16) is"},
        {BAD_STASH, 0, "wrote past its stash in forward"},
        {BAD_DIN, 0, "wrote past its input gradient in backward"},
    };
#ifndef GUARD_TEST_ASAN /* under ASan the zones are poisoned: the overruns are ASan's, as expect_overrun checks */
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        run_model(bad[k].mode, bad[k].split, "canary", r);
        if (r->st != BG_ERR_INVALID || !strstr(r->msg, "layer bad (type bad, model layer 1)") ||
            !strstr(r->msg, bad[k].want))
            fail_msg("canary, mode %d: expected BG_ERR_INVALID with \"%s\", got %d: %s", (int)bad[k].mode,
                     bad[k].want, (int)r->st, r->msg);
    }
    run_model(BAD_OUT, 1, "auto", r); /* canaries or (Debug) full zones: caught either way */
    assert_int_equal(r->st, BG_ERR_INVALID);
#else
    (void)bad;
#endif
    for (int split = 0; split < 2; split++) {
        run_model(BAD_NONE, split, "off", off);
        run_model(BAD_NONE, split, "canary", r);
        assert_int_equal(r->st, BG_OK);
        assert_memory_equal(off->loss, r->loss, sizeof(off->loss));
        assert_memory_equal(off->grads, r->grads, off->nparams * sizeof(float));
    }
    free(r);
    free(off);
}

/* --precision bf16: the layer's input and output are the stage's fp32 copies in its scratch, guarded like
 * the kept buffers: a correct layer gives the same bits with guards on and off, and overruns of its output
 * and input gradient are caught (the child of the ASan variant inherits the variable) */
static void test_bf16_copies_guarded(void **state)
{
    assert_int_equal(setenv("BG_TEST_BF16", "1", 1), 0);
    test_correct_layer_same_bits(state);
    expect_overrun(BAD_OUT, 1, "output", "forward");
    expect_overrun(BAD_OUT, 0, "output", "forward");
    expect_overrun(BAD_SCRATCH, 0, "scratch", "forward");
    for (int split = 0; split < 2; split++)
        expect_overrun(BAD_DIN, split, "input gradient", "backward_input");
    assert_int_equal(unsetenv("BG_TEST_BF16"), 0);
}

int main(int argc, char **argv)
{
#ifdef GUARD_TEST_ASAN
    if (argc == 4 && strcmp(argv[1], "--overrun") == 0)
        return overrun_child(atoi(argv[2]), atoi(argv[3]));
#else
    (void)argc; (void)argv;
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_correct_layer_same_bits),
        cmocka_unit_test(test_bad_setting),
        cmocka_unit_test(test_overrun_stash),
        cmocka_unit_test(test_overrun_wstash),
        cmocka_unit_test(test_overrun_scratch),
        cmocka_unit_test(test_overrun_output),
        cmocka_unit_test(test_overrun_din),
        cmocka_unit_test(test_read_past),
        cmocka_unit_test(test_guards_off_unseen),
        cmocka_unit_test(test_canary),
        cmocka_unit_test(test_bf16_copies_guarded),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
