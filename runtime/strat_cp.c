/* runtime/strat_cp.c: context parallelism under --emulate (params.cp > 1,
 * docs/executor.md "Context parallelism"). The ring itself is runtime/cp.c,
 * called by the attention layers; an emulated stage runs no layer, so this
 * module runs each bound attention layer's ring steps itself before an
 * emulated forward or backward: as many steps of as many bytes as the
 * layer's cost model counts (bg_layer_tp_cost's cp_* fields, the sends of
 * models/cp_attention.c), through the same ring, so the step's bytes_sent
 * and times count them. The blocks sent are zeros. It must not touch the
 * interpreter's slots. */
#include <stdlib.h>

#include "core/check.h"
#include "runtime/exec_impl.h"

typedef struct {
    float *buf; /* a step's send and receive blocks (zeros), n floats each */
    size_t n;
    const bg_cp_comm_t *cp; /* the description's context group (bound by the executor after setup) */
} cpe_t;

static int cpe_active(const exec_t *x) { return x->p.cp > 1 && x->em; }

static bg_status_t cpe_setup(exec_t *x, void **self_p)
{
    (void)x;
    *self_p = calloc(1, sizeof(cpe_t));
    BG_ALLOC_CHECK(*self_p, sizeof(cpe_t), "emulated context ring");
    return BG_OK;
}

static void cpe_destroy(exec_t *x, void *self)
{
    (void)x;
    cpe_t *e = self;
    if (e)
        free(e->buf);
    free(e);
}

/* n ring steps of `bytes` in all, each a send to the next member and a receive from the previous. */
static bg_status_t ring_steps(cpe_t *e, double msgs, double bytes)
{
    const bg_cp_comm_t *cp = e->cp;
    int n = (int)(msgs + 0.5);
    if (n < 1)
        return BG_OK;
    size_t each = (size_t)(bytes / n / sizeof(float) + 0.5);
    if (each > e->n) {
        float *b = calloc(2 * each, sizeof(float));
        if (!b)
            return bg_error(BG_ERR_NOMEM, "emulated context ring step of %zu floats", each);
        free(e->buf);
        e->buf = b, e->n = each;
    }
    for (int i = 0; i < n; i++) {
        void *req = NULL;
        BG_CHECK(cp->ring_start(cp->arg, 0, e->buf, e->buf + e->n, each, &req));
        BG_CHECK(cp->wait(cp->arg, req));
    }
    return BG_OK;
}

/* One layer's ring steps before an emulated compute of kind (bg__exec_layer_costs). */
static bg_status_t emulate_layer(void *self, bg_sched_op_kind_t kind, const bg_tp_cost_t *cost)
{
    cpe_t *e = self;
    return kind == BG_OP_FORWARD ? ring_steps(e, cost->cp_fwd_msgs, cost->cp_fwd_bytes)
                                 : ring_steps(e, cost->cp_bwd_msgs, cost->cp_bwd_bytes);
}

/* Before an emulated F, B or b: the chunk's attention layers' ring steps in layer order. */
static bg_status_t cpe_before_compute(exec_t *x, void *self, chunk_t *ch, int mb, bg_sched_op_kind_t kind)
{
    cpe_t *e = self;
    e->cp = bg_model_desc_cp(x->desc);
    if (kind == BG_OP_BACKWARD_WEIGHT || !e->cp)
        return BG_OK;
    return bg__exec_layer_costs(x, ch, mb, kind, emulate_layer, e);
}

const bg__strategy_ops_t bg__strategy_cp_emulate = {
    .name = "cp_emulate",
    .active = cpe_active,
    .setup = cpe_setup,
    .before_compute = cpe_before_compute,
    .destroy = cpe_destroy,
};
