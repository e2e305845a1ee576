/* runtime/strat_copies.c: DualPipe's two copies of the model
 * (bg_schedule_copies() = 2). Each copy of a model stage is a chunk of its
 * own, built from the same layers (so initialised the same); microbatch i
 * runs through copy i / (M/2) only. Before the ties, every chunk's gradient
 * (after the data-parallel sum) becomes g0 + g1 by exchanging it with the
 * rank holding the other copy (bg__layout_twin), so the copies take the
 * same optimizer step and stay identical; the arithmetic is the one of two
 * data-parallel replicas of M/2 microbatches each. It must not touch the
 * interpreter's slots. */
#include <stdlib.h>

#include "core/check.h"
#include "runtime/exec_impl.h"

typedef struct copy_chunk {
    int partner;         /* world rank of the other copy of this chunk's model stage */
    float *buf;          /* the other copy's gradient */
    bg__xfer_t *rr, *sr;
} copy_chunk_t;

static int copies_active(const exec_t *x) { return x->copies > 1; }

static bg_status_t copies_setup(exec_t *x, void **self_p)
{
    copy_chunk_t *c = calloc((size_t)x->V, sizeof(*c));
    BG_ALLOC_CHECK(c, (size_t)x->V * sizeof(*c), "copies");
    *self_p = c;
    return BG_OK;
}

/* The partners, and the other copy's gradient: allocated with the parameters, not in the step. */
static bg_status_t copies_ready(exec_t *x, void *self)
{
    copy_chunk_t *c = self;
    for (int v = 0; v < x->V; v++) {
        chunk_t *ch = &x->chunks[v];
        c[v].partner = bg__layout_stage_rank(&x->lay, bg__layout_twin(&x->lay, ch->stage), x->lay.me.dp);
        size_t bytes = bg_model_param_count(ch->model) * sizeof(float);
        c[v].buf = bg_backend_alloc(x->be, bytes ? bytes : sizeof(float), "copy gradient");
        if (!c[v].buf)
            return bg_error(BG_ERR_NOMEM, "the other copy's gradient of stage %d (%zu bytes)", ch->stage, bytes);
    }
    return BG_OK;
}

/* Every chunk's gradient becomes g0 + g1, all exchanges posted before any
 * is waited for. Both ranks add the same two buffers (IEEE addition is
 * commutative), so both copies hold the same bits. */
static bg_status_t copies_before_optimizer(exec_t *x, void *self)
{
    copy_chunk_t *c = self;
    bg_backend_t *be = x->be;
    bg_status_t st = BG_OK;
    for (int v = 0; v < x->V && st == BG_OK; v++) {
        chunk_t *ch = &x->chunks[v];
        size_t bytes = bg_model_param_count(ch->model) * sizeof(float);
        uint32_t tag = bg__exec_tag(x, 1, BG__TAG_COPIES, bg__layout_model_stage(&x->lay, ch->stage));
        st = bg__xrecv(&x->stg, x->comm, c[v].partner, tag, c[v].buf, bytes, &c[v].rr);
        if (st == BG_OK)
            st = bg__xsend(&x->stg, x->comm, c[v].partner, tag, bg_model_grads(ch->model), bytes, &c[v].sr);
        x->bytes_sent += bytes;
    }
    for (int v = 0; v < x->V; v++) {
        bg_status_t s1 = bg__exec_wait_free(&c[v].rr), s2 = bg__exec_wait_free(&c[v].sr);
        if (st == BG_OK)
            st = s1 != BG_OK ? s1 : s2;
    }
    if (st != BG_OK)
        return st;
    for (int v = 0; v < x->V; v++) {
        chunk_t *ch = &x->chunks[v];
        float *g = bg_model_grads(ch->model);
        size_t n = bg_model_param_count(ch->model);
        be->ops->residual_forward(be, g, g, c[v].buf, n); /* g0 + g1 = g1 + g0, bit for bit */
    }
    return BG_OK;
}

/* The other copy's gradient, received before the optimizer step. */
static void copies_memory(exec_t *x, void *self, size_t *param_bytes, size_t *optim_elems, size_t *grad_bytes)
{
    (void)self, (void)param_bytes, (void)optim_elems;
    *grad_bytes += x->params * sizeof(float);
}

static void copies_cancel(exec_t *x, void *self)
{
    copy_chunk_t *c = self;
    for (int v = 0; v < x->V; v++) {
        bg__xfree(c[v].rr);
        bg__xfree(c[v].sr);
        c[v].rr = c[v].sr = NULL;
    }
}

static void copies_destroy(exec_t *x, void *self)
{
    copy_chunk_t *c = self;
    for (int v = 0; c && v < x->V; v++)
        bg_backend_free(x->be, c[v].buf);
    free(c);
}

const bg__strategy_ops_t bg__strategy_copies = {
    .name = "copies",
    .active = copies_active,
    .setup = copies_setup,
    .ready = copies_ready,
    .before_optimizer = copies_before_optimizer,
    .memory = copies_memory,
    .cancel = copies_cancel,
    .destroy = copies_destroy,
};
