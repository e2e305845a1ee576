/* runtime/strat_ties.c: tied tensors (a model's declared ties, e.g. the
 * input embedding and the output head): before the first optimizer step of
 * a step on a rank, every tie's two gradients become a + b (after the
 * data-parallel sum), by a device add when this rank holds both tensors,
 * else by exchanging them with the rank that holds the other (same
 * replica), all exchanges posted before any is waited for. The second
 * tensor of each tie is left out of the gradient norm. With parameter
 * servers the sum is the servers' (not active). It must not touch the
 * interpreter's slots. */
#include <stdlib.h>

#include "core/check.h"
#include "runtime/exec_impl.h"

/* A declared tie as this rank sees it. */
typedef struct tie {
    bg_param_t *a, *b;      /* the local tensors (NULL: held by another rank) */
    int partner;            /* rank holding the other tensor when only one is here, else -1 */
    float *buf;             /* the partner's gradient */
    bg__xfer_t *rr, *sr;
} tie_t;

typedef struct ties_state {
    tie_t *ties;
    int n;
} ties_state_t;

static int ties_active(const exec_t *x) { return bg_model_desc_num_ties(x->desc) > 0 && x->lay.servers == 0; }

static bg_status_t ties_setup(exec_t *x, void **self_p)
{
    int n = bg_model_desc_num_ties(x->desc);
    if (n > 0xffff)
        return bg_error(BG_ERR_UNSUPPORTED, "%d ties: at most 65535", n);
    ties_state_t *T = calloc(1, sizeof(*T));
    BG_ALLOC_CHECK(T, sizeof(*T), "ties");
    T->ties = calloc((size_t)n, sizeof(*T->ties));
    if (!T->ties) {
        free(T);
        return bg_error(BG_ERR_NOMEM, "ties (%d)", n);
    }
    T->n = n;
    *self_p = T;
    return BG_OK;
}

/* Where each tie's tensors live: here, or on which rank of this replica. */
static bg_status_t ties_ready(exec_t *x, void *self)
{
    ties_state_t *T = self;
    for (int t = 0; t < T->n; t++) {
        tie_t *ti = &T->ties[t];
        const char *na, *nb;
        bg_model_desc_tie_names(x->desc, t, &na, &nb);
        for (int v = 0; v < x->V; v++) {
            if (!ti->a)
                ti->a = bg_model_find_tensor(x->chunks[v].model, na);
            if (!ti->b)
                ti->b = bg_model_find_tensor(x->chunks[v].model, nb);
        }
        ti->partner = -1;
        if (x->copies > 1 && !!ti->a != !!ti->b) /* the copies' partner ranks are not worked out */
            return bg_error(BG_ERR_UNSUPPORTED, "dualpipe: tie %s = %s has one tensor on pipeline rank %d and the "
                            "other elsewhere; only ties whose tensors share a rank (as the input embedding and "
                            "output head do: ranks 0 and p-1 hold the first and last stage) are summed", na, nb,
                            x->lay.me.pp);
        if (!!ti->a != !!ti->b) {
            int layer = bg_model_desc_tensor_layer(x->desc, ti->a ? nb : na), stage = 0;
            while (stage < x->S - 1 && x->last[stage] < layer)
                stage++;
            ti->partner = bg__layout_stage_rank(&x->lay, stage, x->lay.me.dp);
            /* the partner's gradient: held from the start, counted in the predicted peak (ties_memory) */
            bg_param_t *mine = ti->a ? ti->a : ti->b;
            if (!(ti->buf = bg_backend_alloc(x->be, mine->numel * sizeof(float), "tied gradient")))
                return BG_ERR_NOMEM;
        }
    }
    return BG_OK;
}

/* Every tie's gradients a + b on both tensors (every reduction is finished). */
static bg_status_t ties_before_optimizer(exec_t *x, void *self)
{
    ties_state_t *T = self;
    bg_backend_t *be = x->be;
    bg_status_t st = BG_OK;
    for (int t = 0; t < T->n && st == BG_OK; t++) {
        tie_t *ti = &T->ties[t];
        if (ti->partner < 0)
            continue;
        bg_param_t *mine = ti->a ? ti->a : ti->b;
        size_t bytes = mine->numel * sizeof(float);
        uint32_t tag = bg__exec_tag(x, 1, BG__TAG_TIES, t);
        st = bg__xrecv(&x->stg, x->comm, ti->partner, tag, ti->buf, bytes, &ti->rr);
        if (st == BG_OK)
            st = bg__xsend(&x->stg, x->comm, ti->partner, tag, mine->grad, bytes, &ti->sr);
        x->bytes_sent += bytes;
    }
    for (int t = 0; t < T->n; t++) {
        bg_status_t s1 = bg__exec_wait_free(&T->ties[t].rr), s2 = bg__exec_wait_free(&T->ties[t].sr);
        if (st == BG_OK)
            st = s1 != BG_OK ? s1 : s2;
    }
    if (st != BG_OK)
        return st;
    for (int t = 0; t < T->n; t++) {
        tie_t *ti = &T->ties[t];
        if (ti->a && ti->b) {
            be->ops->residual_forward(be, ti->a->grad, ti->a->grad, ti->b->grad, ti->a->numel); /* a + b */
            be->ops->copy(be, ti->b->grad, ti->a->grad, ti->a->numel);
        } else if (ti->a) {
            be->ops->residual_forward(be, ti->a->grad, ti->a->grad, ti->buf, ti->a->numel);
        } else if (ti->b) {
            be->ops->residual_forward(be, ti->b->grad, ti->buf, ti->b->grad, ti->b->numel);
        }
    }
    return BG_OK;
}

/* Both tensors hold a + b; the model's norm counts a tied tensor once. */
static int ties_in_norm(exec_t *x, void *self, const bg_param_t *p)
{
    (void)x;
    ties_state_t *T = self;
    for (int t = 0; t < T->n; t++)
        if (T->ties[t].b == p)
            return 0;
    return 1;
}

/* The partners' gradients this rank receives (ties_ready). */
static void ties_memory(exec_t *x, void *self, size_t *param_bytes, size_t *optim_elems, size_t *grad_bytes)
{
    (void)x, (void)param_bytes, (void)optim_elems;
    ties_state_t *T = self;
    for (int t = 0; t < T->n; t++)
        if (T->ties[t].partner >= 0)
            *grad_bytes += (T->ties[t].a ? T->ties[t].a : T->ties[t].b)->numel * sizeof(float);
}

static void ties_cancel(exec_t *x, void *self)
{
    (void)x;
    ties_state_t *T = self;
    for (int t = 0; t < T->n; t++) {
        bg__xfree(T->ties[t].rr);
        bg__xfree(T->ties[t].sr);
        T->ties[t].rr = T->ties[t].sr = NULL;
    }
}

static void ties_destroy(exec_t *x, void *self)
{
    ties_state_t *T = self;
    if (!T)
        return;
    for (int t = 0; t < T->n; t++)
        bg_backend_free(x->be, T->ties[t].buf);
    free(T->ties);
    free(T);
}

const bg__strategy_ops_t bg__strategy_ties = {
    .name = "ties",
    .active = ties_active,
    .setup = ties_setup,
    .ready = ties_ready,
    .before_optimizer = ties_before_optimizer,
    .in_norm = ties_in_norm,
    .memory = ties_memory,
    .cancel = ties_cancel,
    .destroy = ties_destroy,
};
