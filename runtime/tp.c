/* runtime/tp.c: tensor parallelism's runtime side: the tensor-parallel
 * group of a rank (tp consecutive world ranks: tp varies fastest in the
 * layout) as the bg_tp_comm_t its model's layers call. Its sums and gathers
 * are the transport's group collectives, whose results are bitwise equal on
 * every member (docs/transport.md), so replicated tensors stay replicated.
 * The layers themselves live in models/tp_layers.c. The collectives go
 * through runtime/devcoll.h on the buffers of the executor's backend (bound
 * by bg__tp_bind; host buffers until then), device memory included.
 *
 * The group exists twice over the same ranks, one per lane of the
 * executor's coroutine pair (core/fiber.h; BRIGADE_TP_OVERLAP=microbatch):
 * each lane's collectives match in order on every member, whichever order
 * the lanes interleave in. Inside a pair every wait, and every blocking
 * collective, hands the thread to the other lane while its request is not
 * complete: so one microbatch computes while the other's sum is in flight,
 * and no member can block in one lane on a collective its peer will start
 * only in the other. The blocking collectives are the non-blocking ones of
 * the same messages, waited for: a call takes the same path on every member
 * whether or not its lane's partner is still running. */
#include <stdlib.h>


#include "core/check.h"
#include "core/fiber.h"
#include "brigade/executor.h"
#include "runtime/devcoll.h"
#include "runtime/tp.h"

struct bg_tp_group {
    bg_tp_comm_t c;
    bg_group_t *g[2]; /* lane 0 (and outside a pair), lane 1 */
    bg__dcoll_t *dc[2]; /* their collectives on backend buffers */
    bg_trace_t *trace;   /* NULL: no trace events */
    const int64_t *step; /* steps done (the events' step is the next) */
    double spent;        /* seconds in the blocking collectives and the waits (bg_tp_group_seconds) */
};

/* Time one collective: into spent, and into the trace as "tp_allreduce" /
 * "tp_allgather" / "tp_red_scatter" (sequence parallelism; trace names fit
 * 15 characters). */
static void account(bg__tp_t *t, const char *what, double t0)
{
    double t1 = bg_now();
    t->spent += t1 - t0;
    if (t->trace)
        bg__trace_event(t->trace, what, -1, -1, t0, t1, (int)*t->step + 1);
}

static bg__dcoll_t *lane_coll(bg__tp_t *t) { return t->dc[bg__pair_lane()]; }

bg_status_t bg__tp_pair_wait(bg__xfer_t *req)
{
    bg_status_t st = BG_OK;
    for (int done = 0, idle = 0;;) {
        if ((st = bg__xtest(req, &done)) != BG_OK || done)
            break;
        if (!bg__pair_wait_turn(&idle)) {
            st = bg__xwait(req);
            break;
        }
    }
    bg__xfree(req);
    return st;
}

/* The blocking collectives: the non-blocking one of the same messages,
 * waited for in the pair, timed as what in the trace. */
typedef enum { TP_ALLREDUCE, TP_ALLGATHER, TP_REDUCE_SCATTER } tp_coll_t;

static bg_status_t tp_blocking(bg__tp_t *t, tp_coll_t kind, const float *send, float *recv, size_t count,
                               const char *what)
{
    double t0 = bg_now();
    bg__xfer_t *r;
    static const bg__coll_kind_t ck[] = {[TP_ALLREDUCE] = BG__COLL_ALLREDUCE, [TP_ALLGATHER] = BG__COLL_ALLGATHER,
                                         [TP_REDUCE_SCATTER] = BG__COLL_REDUCE_SCATTER};
    bg_status_t st = bg__dcoll_start(lane_coll(t), ck[kind], send, recv, count, BG_REDUCE_SUM, &r);
    if (st == BG_OK)
        st = bg__tp_pair_wait(r);
    account(t, what, t0);
    return st;
}

static bg_status_t tp_allreduce(void *arg, float *buf, size_t count)
{
    return tp_blocking(arg, TP_ALLREDUCE, NULL, buf, count, "tp_allreduce");
}

static bg_status_t tp_allgather(void *arg, const float *send, float *recv, size_t count)
{
    return tp_blocking(arg, TP_ALLGATHER, send, recv, count, "tp_allgather");
}

static bg_status_t tp_reduce_scatter(void *arg, const float *send, float *recv, size_t count)
{
    return tp_blocking(arg, TP_REDUCE_SCATTER, send, recv, count, "tp_red_scatter");
}

static bg_status_t tp_ireduce_scatter(void *arg, float *buf, size_t count, void **req_p)
{
    bg__tp_t *t = arg;
    bg__xfer_t *r;
    /* count divides into size equal chunks: member i's is [i count, (i+1) count) (bg_group_chunk) */
    BG_CHECK(bg__dcoll_start(lane_coll(t), BG__COLL_REDUCE_SCATTER_INPLACE, NULL, buf, count * (size_t)t->c.size,
                             BG_REDUCE_SUM, &r));
    *req_p = r;
    return BG_OK;
}

static bg_status_t tp_iallgather(void *arg, float *buf, size_t count, void **req_p)
{
    bg__tp_t *t = arg;
    bg__xfer_t *r;
    BG_CHECK(bg__dcoll_start(lane_coll(t), BG__COLL_ALLGATHER_CHUNKS, NULL, buf, count * (size_t)t->c.size,
                             BG_REDUCE_SUM, &r));
    *req_p = r;
    return BG_OK;
}

static bg_status_t tp_iallreduce(void *arg, float *buf, size_t count, void **req_p)
{
    bg__tp_t *t = arg;
    bg__xfer_t *r;
    BG_CHECK(bg__dcoll_start(lane_coll(t), BG__COLL_ALLREDUCE, NULL, buf, count, BG_REDUCE_SUM, &r));
    *req_p = r;
    return BG_OK;
}

/* The exposed part of a non-blocking sum: "tp_wait" in the trace. */
static bg_status_t tp_wait(void *arg, void *req)
{
    bg__tp_t *t = arg;
    double t0 = bg_now();
    bg_status_t st = bg__tp_pair_wait(req);
    account(t, "tp_wait", t0);
    return st;
}

bg_status_t bg__tp_bind(bg__tp_t *t, bg__staging_t *sg, int log_rank)
{
    if (!t)
        return BG_OK;
    for (int l = 0; l < 2; l++) {
        bg__dcoll_t *dc;
        BG_CHECK(bg__dcoll_create(sg, t->g[l], l ? "tensor-parallel (second lane)" : "tensor-parallel", log_rank,
                                  &dc));
        bg__dcoll_destroy(t->dc[l]);
        t->dc[l] = dc;
    }
    return BG_OK;
}

void bg__tp_set_trace(bg__tp_t *t, bg_trace_t *trace, const int64_t *step)
{
    if (t) {
        t->trace = trace;
        t->step = step;
    }
}


bg_status_t bg__tp_check_params(const bg_model_desc_t *desc, int tp)
{
    if (tp < 1)
        return bg_error(BG_ERR_INVALID, "tp must be >= 1 (got %d)", tp);
    int deg = bg_model_desc_tp_degree(desc);
    if (deg < 0)
        return bg_error(BG_ERR_INVALID, "model %s: its tensor-parallel layers are split over different degrees",
                        bg_model_desc_params(desc)->name);
    if (deg != tp)
        return bg_error(BG_ERR_INVALID, "tp = %d but model %s has %s (build it for tp = %d: bg_model_config_t.tp, or "
                                        "tensor-parallel layers of that degree; docs/layers.md)",
                        tp, bg_model_desc_params(desc)->name,
                        deg == 1 ? "no tensor-parallel layers" : "tensor-parallel layers of another degree", tp);
    return BG_OK;
}

bg_status_t bg__tp_create(bg_comm_t *comm, bg_model_desc_t *desc, int tp, int first, bg__tp_t **tp_p)
{
    *tp_p = NULL;
    if (tp == 1)
        return bg_model_desc_set_tp(desc, NULL);
    bg__tp_t *t = calloc(1, sizeof(*t));
    int *ranks = malloc((size_t)tp * sizeof(int));
    if (!t || !ranks) {
        free(t);
        free(ranks);
        return bg_error(BG_ERR_NOMEM, "tensor-parallel group");
    }
    for (int i = 0; i < tp; i++)
        ranks[i] = first + i;
    bg_status_t st = bg_group_create(comm, tp, ranks, &t->g[0]);
    if (st == BG_OK)
        st = bg_group_create(comm, tp, ranks, &t->g[1]);
    free(ranks);
    if (st == BG_OK)
        st = bg__tp_bind(t, NULL, -1); /* host buffers until the executor's backend binds them */
    if (st == BG_OK) {
        t->c = (bg_tp_comm_t){.size = tp, .rank = bg_group_rank(t->g[0]), .allreduce = tp_allreduce,
                              .allgather = tp_allgather, .arg = t, .iallreduce = tp_iallreduce, .wait = tp_wait,
                              .reduce_scatter = tp_reduce_scatter, .ireduce_scatter = tp_ireduce_scatter,
                              .iallgather = tp_iallgather};
        st = bg_model_desc_set_tp(desc, &t->c);
    }
    if (st != BG_OK) {
        bg__dcoll_destroy(t->dc[0]);
        bg__dcoll_destroy(t->dc[1]);
        bg_group_destroy(t->g[0]);
        bg_group_destroy(t->g[1]);
        free(t);
        return st;
    }
    *tp_p = t;
    return BG_OK;
}

void bg__tp_destroy(bg__tp_t *t, bg_model_desc_t *desc)
{
    if (!t)
        return;
    if (bg_model_desc_tp(desc) == &t->c)
        bg_model_desc_set_tp(desc, NULL);
    bg__dcoll_destroy(t->dc[0]);
    bg__dcoll_destroy(t->dc[1]);
    bg_group_destroy(t->g[0]);
    bg_group_destroy(t->g[1]);
    free(t);
}

bg_status_t bg_tp_group_create(bg_comm_t *comm, bg_model_desc_t *desc, int tp, int first, bg_tp_group_t **group_p)
{
    BG_CHECK(bg__tp_check_params(desc, tp));
    bg__tp_t *t;
    BG_CHECK(bg__tp_create(comm, desc, tp, first, &t));
    *group_p = t;
    return BG_OK;
}

void bg_tp_group_destroy(bg_tp_group_t *group, bg_model_desc_t *desc) { bg__tp_destroy(group, desc); }

double bg_tp_group_seconds(const bg_tp_group_t *group) { return group ? group->spent : 0.0; }
