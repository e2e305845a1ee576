/* tests/runtime/test_backend_error.c: a backend's sticky error (the op
 * table's `error` slot, bg_backend_status) reaches the step's result. A CPU
 * backend whose table is copied with an `error` slot that reports a fault
 * from a chosen moment on stands in for a CUDA device fault (nothing on this
 * machine can make a real one): the step fails with BG_ERR_DEVICE and the
 * backend's message, the executor refuses further steps, and allocation after
 * the fault names the fault instead of "out of memory". Also: a head size
 * above the backend's attention_max_head is refused at the first forward,
 * before any weight changes. White-box: reaches the executor's backend
 * through runtime/exec_impl.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "brigade/brigade.h"
#include "runtime/exec_impl.h"
#include "bg_test_model.h"

static int faulted; /* the injected fault is on */
#define PROBE_BYTES ((size_t)12345679) /* an allocation the wrapped backend refuses (an exhausted device) */
static void *(*real_alloc)(bg_backend_t *be, size_t bytes);

static void *fake_alloc(bg_backend_t *be, size_t bytes) { return bytes == PROBE_BYTES ? NULL : real_alloc(be, bytes); }

static bg_status_t fake_error(bg_backend_t *be, char *msg, size_t len)
{
    (void)be;
    if (!faulted)
        return BG_OK;
    snprintf(msg, len, "device 0: attention backward (dq) failed: an illegal memory access was encountered");
    return BG_ERR_DEVICE;
}

static bg_status_t text_batch(const bg_batch_request_t *rq, int32_t *tokens, float *features, int32_t *targets,
                              void *arg)
{
    (void)features;
    bg_batch_source_t *src = arg;
    return src->batch(rq, tokens, NULL, targets, src->arg);
}

typedef struct {
    bg_model_desc_t *d;
    bg_data_t *data;
    bg_batch_source_t src;
    bg_executor_t *x;
    bg_backend_ops_t ops; /* the executor's table with the injected slots */
} fixture_t;

static void open_fixture(fixture_t *f, int d_model, int heads, int max_head)
{
    bg_model_config_t c = bg_test_gpt_config(2, d_model, heads, 8, 256, 7);
    assert_int_equal(bg_model_build(&c, &f->d), BG_OK);
    char path[4096];
    snprintf(path, sizeof(path), "%s/data/kjv.txt", getenv("BRIGADE_SOURCE_DIR"));
    assert_int_equal(bg_data_open_text(path, c.seq_len, 1, &f->data), BG_OK);
    f->src = bg_data_source(f->data);
    bg_executor_params_t p = BG_EXECUTOR_PARAMS_INIT;
    p.model = f->d;
    p.batch = 4;
    p.microbatches = 2;
    p.threads = 1;
    p.data.batch = text_batch;
    p.data.arg = &f->src;
    assert_int_equal(bg_executor_create(&p, &f->x), BG_OK);
    exec_t *x = (exec_t *)f->x;
    f->ops = *x->be->ops;
    f->ops.error = fake_error;
    real_alloc = f->ops.alloc;
    f->ops.alloc = fake_alloc;
    f->ops.attention_max_head = max_head;
    x->be->ops = &f->ops;
}

static void close_fixture(fixture_t *f)
{
    assert_int_equal(bg_executor_destroy(f->x), BG_OK);
    bg_data_close(f->data);
    bg_model_desc_destroy(f->d);
}

static void test_fault_fails_the_step(void **s)
{
    (void)s;
    fixture_t f;
    faulted = 0;
    open_fixture(&f, 16, 2, 0);
    bg_step_result_t r;
    assert_int_equal(bg_executor_step(f.x, &r), BG_OK);
    assert_true(r.loss > 0);
    faulted = 1;
    assert_int_equal(bg_executor_step(f.x, &r), BG_ERR_DEVICE);
    assert_non_null(strstr(bg_last_error(), "cpu backend: device 0: attention backward (dq) failed"));
    assert_int_equal(bg_executor_steps_done(f.x), 1); /* the faulted step is not counted as done */
    assert_int_not_equal(bg_executor_step(f.x, &r), BG_OK); /* and the executor stays stopped */
    assert_non_null(strstr(bg_last_error(), "an earlier step failed"));
    /* an allocation the backend cannot make after a fault names the fault */
    exec_t *x = (exec_t *)f.x;
    assert_null(bg_backend_alloc(x->be, PROBE_BYTES, "a probe"));
    assert_non_null(strstr(bg_last_error(), "illegal memory access"));
    assert_non_null(strstr(bg_last_error(), "a probe"));
    assert_null(strstr(bg_last_error(), "out of memory"));
    faulted = 0;
    assert_null(bg_backend_alloc(x->be, PROBE_BYTES, "a probe"));
    assert_non_null(strstr(bg_last_error(), "out of memory")); /* without a fault: what it is */
    close_fixture(&f);
}

static void test_status_without_slot(void **s)
{
    (void)s;
    bg_backend_t *be;
    assert_int_equal(bg_backend_create("cpu", NULL, &be), BG_OK);
    assert_null(be->ops->error); /* the CPU's ops cannot fail */
    assert_int_equal(bg_backend_status(be), BG_OK);
    bg_backend_destroy(be);
}

/* Head size 8 (16 / 2) above a limit of 4: refused at the first forward naming
 * the layer and the sizes; nothing trained. */
static void test_head_size_refused(void **s)
{
    (void)s;
    fixture_t f;
    faulted = 0;
    open_fixture(&f, 16, 2, 4);
    bg_step_result_t r;
    assert_int_equal(bg_executor_step(f.x, &r), BG_ERR_UNSUPPORTED);
    const char *e = bg_last_error();
    assert_non_null(strstr(e, "F of microbatch 0: attention attn:"));
    assert_non_null(strstr(e, "head size 8 (d_model 16 / 2 heads) is above the cpu backend's largest, 4"));
    assert_int_equal(bg_executor_steps_done(f.x), 0);
    close_fixture(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fault_fails_the_step),
        cmocka_unit_test(test_status_without_slot),
        cmocka_unit_test(test_head_size_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
