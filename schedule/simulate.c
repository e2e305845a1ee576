/* schedule/simulate.c: discrete-event simulation of a program set.
 * Each rank walks its list in order, exactly as the executor will: compute
 * ops take their stage's cost, sends are issued without blocking and arrive
 * after latency + bytes / bandwidth (messages on one directed link between
 * two ranks are serialised), a receive waits until its message has arrived.
 * It records the timeline, busy/idle time, and the stash (microbatches held
 * from a forward to their last backward piece; in a forward-only program, for
 * the forward alone) per rank. It never changes the programs and does not
 * decide any order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "schedule/schedule_impl.h"
#include "schedule/simulate.h"

typedef struct {
    int peer;
    double free_at;
} bg__link_t;

static double bg__pick(const double *arr, double dflt, int st) { return arr ? arr[st] : dflt; }

static bg_status_t bg__check_params(const bg_schedule_t *s, const bg_sim_params_t *P)
{
    if (!P || P->size < offsetof(bg_sim_params_t, stash_bytes_per_stage))
        return bg_error(BG_ERR_INVALID, "bg_schedule_simulate: params missing or not initialised with BG_SIM_PARAMS_INIT");
    const double sc[] = {P->f_cost, P->b_cost, P->w_cost, P->latency, P->bandwidth, P->act_bytes,
                         P->grad_bytes, P->stash_bytes, P->reduce_cost, P->optimizer_cost};
    const char *nm[] = {"forward cost", "backward-input cost", "backward-weight cost", "latency", "bandwidth",
                        "activation bytes", "gradient bytes", "stash bytes", "reduce cost", "optimizer cost"};
    for (size_t i = 0; i < BG_ARRAY_LEN(sc); i++)
        if (!isfinite(sc[i]) || sc[i] < 0)
            return bg_error(BG_ERR_INVALID, "simulator: %s must be a finite number >= 0, got %g", nm[i], sc[i]);
    const double *arrs[] = {P->f_costs, P->b_costs, P->w_costs, P->stash_bytes_per_stage};
    for (size_t a = 0; a < BG_ARRAY_LEN(arrs); a++)
        if (arrs[a])
            for (int st = 0; st < s->nstages; st++)
                if (!isfinite(arrs[a][st]) || arrs[a][st] < 0)
                    return bg_error(BG_ERR_INVALID, "simulator: per-stage %s of stage %d must be >= 0, got %g",
                                    a == 3 ? "stash bytes" : a == 0 ? "forward cost" : a == 1 ? "backward cost"
                                                                                            : "weight cost",
                                    st, arrs[a][st]);
    return BG_OK;
}

void bg_sim_result_free(bg_sim_result_t *res)
{
    if (!res)
        return;
    free(res->busy), free(res->start), free(res->end), free(res->peak_bytes), free(res->peak_stash);
    free(res->events);
    free(res);
}

/* The simulation; with_events 0 keeps no timeline (the result has no
 * events; every other figure is the same) and trusts the program (a
 * generator's: not validated; one that deadlocks ends in an error). */
static bg_status_t bg__simulate(const bg_schedule_t *s, const bg_sim_params_t *P, int with_events,
                                bg_sim_result_t **result_p)
{
    if (!s || !result_p)
        return bg_error(BG_ERR_INVALID, "bg_schedule_simulate: NULL argument");
    BG_CHECK(bg__check_params(s, P));
    if (with_events)
        BG_CHECK(bg_schedule_validate(s));
    int p = s->p, S = s->nstages, M = s->m, v = s->v;
    size_t nmsg = (size_t)2 * S * M, total = 0;
    for (int r = 0; r < p; r++)
        total += s->nops[r];
    bg_status_t st = BG_OK;
    bg_sim_result_t *res = calloc(1, sizeof(*res));
    double *arrive = malloc(sizeof(double) * nmsg), *t = calloc((size_t)p, sizeof(double));
    int *waiter = malloc(sizeof(int) * nmsg), *stack = malloc(sizeof(int) * (size_t)p);
    int *stash = calloc((size_t)p, sizeof(int));
    double *stash_b = calloc((size_t)p, sizeof(double));
    /* a caller built against the smaller struct has no wstash field */
    const double *wst = P->size >= offsetof(bg_sim_params_t, wstash_bytes_per_stage) + sizeof(const double *)
                            ? P->wstash_bytes_per_stage
                            : NULL;
    size_t *ptr = calloc((size_t)p, sizeof(size_t)), *nev = calloc((size_t)p, sizeof(size_t));
    size_t *evoff = calloc((size_t)p + 1, sizeof(size_t));
    int nl = 2 * v + 2;
    bg__link_t *links = malloc(sizeof(bg__link_t) * (size_t)p * (size_t)nl);
    bg_sim_event_t *ev = malloc(sizeof(bg_sim_event_t) * (total && with_events ? total : 1));
    if (res) {
        res->p = p;
        res->busy = calloc((size_t)p, sizeof(double));
        res->start = malloc(sizeof(double) * (size_t)p);
        res->end = calloc((size_t)p, sizeof(double));
        res->peak_bytes = calloc((size_t)p, sizeof(double));
        res->peak_stash = calloc((size_t)p, sizeof(int));
    }
    if (!res || !arrive || !t || !waiter || !stack || !stash || !stash_b || !ptr || !nev || !evoff || !links || !ev ||
        !res->busy || !res->start || !res->end || !res->peak_bytes || !res->peak_stash) {
        st = bg_error(BG_ERR_NOMEM, "cannot allocate the simulator's state (%zu instructions)", total);
        goto out;
    }
    for (size_t i = 0; i < nmsg; i++)
        arrive[i] = -1, waiter[i] = -1;
    for (int r = 0; r < p; r++) {
        evoff[r + 1] = evoff[r] + s->nops[r];
        res->start[r] = -1;
        for (int k = 0; k < nl; k++)
            links[r * nl + k] = (bg__link_t){-1, 0};
    }
    int top = bg__push_ranks(stack, p);
    while (top > 0) {
        int r = stack[--top];
        while (ptr[r] < s->nops[r]) {
            const bg_sched_op_t *op = &s->ops[r][ptr[r]];
            int sg = op->stage;
            bg_sim_event_t e = {r, op->kind, op->microbatch, sg, op->peer_stage, t[r], t[r]};
            double cost = 0;
            int record = 1;
            switch (op->kind) {
            case BG_OP_FORWARD:
                cost = bg__pick(P->f_costs, P->f_cost, sg);
                stash[r]++;
                stash_b[r] += bg__pick(P->stash_bytes_per_stage, P->stash_bytes, sg);
                if (stash[r] > res->peak_stash[r])
                    res->peak_stash[r] = stash[r];
                if (stash_b[r] > res->peak_bytes[r])
                    res->peak_bytes[r] = stash_b[r];
                break;
            case BG_OP_BACKWARD:
                cost = bg__pick(P->b_costs, P->b_cost, sg) + bg__pick(P->w_costs, P->w_cost, sg);
                break;
            case BG_OP_BACKWARD_INPUT:
                if (wst) { /* what W needs, held from B to W */
                    stash_b[r] += wst[sg];
                    if (stash_b[r] > res->peak_bytes[r])
                        res->peak_bytes[r] = stash_b[r];
                }
                cost = bg__pick(P->b_costs, P->b_cost, sg);
                break;
            case BG_OP_BACKWARD_WEIGHT:
                cost = bg__pick(P->w_costs, P->w_cost, sg);
                break;
            case BG_OP_REDUCE_GRADS:
                cost = P->reduce_cost;
                break;
            case BG_OP_OPTIMIZER_STEP:
                cost = P->optimizer_cost;
                break;
            case BG_OP_SEND_ACT:
            case BG_OP_SEND_GRAD: {
                int grad = op->kind == BG_OP_SEND_GRAD;
                size_t id = ((size_t)grad * S + sg) * M + op->microbatch;
                int q = s->stage_rank[op->peer_stage];
                bg__link_t *L = NULL;
                for (int k = 0; k < nl; k++) {
                    bg__link_t *c = &links[r * nl + k];
                    if (c->peer == q || c->peer < 0) {
                        c->peer = q;
                        L = c;
                        break;
                    }
                }
                double bytes = grad ? P->grad_bytes : P->act_bytes;
                double xfer = P->bandwidth > 0 ? bytes / P->bandwidth : 0;
                double begin = t[r];
                if (L && L->free_at > begin)
                    begin = L->free_at;
                if (L)
                    L->free_at = begin + xfer;
                arrive[id] = begin + xfer + P->latency;
                e.end = arrive[id];
                if (waiter[id] >= 0) {
                    stack[top++] = waiter[id];
                    waiter[id] = -1;
                }
                break;
            }
            case BG_OP_RECV_ACT:
            case BG_OP_RECV_GRAD: {
                size_t id = ((size_t)(op->kind == BG_OP_RECV_GRAD) * S + op->peer_stage) * M + op->microbatch;
                if (arrive[id] < 0) {
                    waiter[id] = r;
                    goto blocked;
                }
                if (arrive[id] > t[r])
                    t[r] = arrive[id];
                e.end = t[r];
                record = e.end > e.start;
                break;
            }
            }
            if (cost > 0 || op->kind <= BG_OP_BACKWARD_WEIGHT) {
                if (op->kind <= BG_OP_BACKWARD_WEIGHT && res->start[r] < 0)
                    res->start[r] = t[r];
                t[r] += cost;
                e.end = t[r];
                res->busy[r] += cost;
            }
            /* a forward-only program keeps no stash: the forward's is freed when it ends */
            if (op->kind == BG_OP_BACKWARD || op->kind == BG_OP_BACKWARD_WEIGHT ||
                (op->kind == BG_OP_FORWARD && s->forward_only)) {
                stash[r]--;
                stash_b[r] -= bg__pick(P->stash_bytes_per_stage, P->stash_bytes, sg);
                if (op->kind == BG_OP_BACKWARD_WEIGHT && wst)
                    stash_b[r] -= wst[sg];
            }
            if (record && with_events)
                ev[evoff[r] + nev[r]++] = e;
            ptr[r]++;
        }
    blocked:;
    }
    for (int r = 0; r < p; r++)
        if (ptr[r] < s->nops[r]) { /* cannot happen after validation (nor for a generator's program) */
            st = bg_error(BG_ERR_INTERNAL, "simulator: rank %d stuck at op %zu after validation", r, ptr[r]);
            goto out;
        }
    /* compact the events (per rank, in time order) */
    size_t n = 0;
    for (int r = 0; r < p; r++) {
        memmove(&ev[n], &ev[evoff[r]], sizeof(*ev) * nev[r]);
        n += nev[r];
        res->end[r] = t[r];
        if (res->start[r] < 0)
            res->start[r] = 0;
        if (t[r] > res->step)
            res->step = t[r];
    }
    res->events = ev;
    res->nevents = n;
    ev = NULL;
out:
    free(arrive), free(t), free(waiter), free(stack), free(stash), free(stash_b), free(ptr), free(nev), free(evoff);
    free(links), free(ev);
    if (st != BG_OK) {
        bg_sim_result_free(res);
        return st;
    }
    *result_p = res;
    return BG_OK;
}

bg_status_t bg_schedule_simulate(const bg_schedule_t *s, const bg_sim_params_t *P, bg_sim_result_t **result_p)
{
    return bg__simulate(s, P, 1, result_p);
}

bg_status_t bg__schedule_simulate_figures(const bg_schedule_t *s, const bg_sim_params_t *P,
                                          bg_sim_result_t **result_p)
{
    return bg__simulate(s, P, 0, result_p);
}

static int bg__rank_ok(const bg_sim_result_t *r, int rank) { return r && rank >= 0 && rank < r->p; }

double bg_sim_step_time(const bg_sim_result_t *r) { return r ? r->step : 0; }
double bg_sim_busy(const bg_sim_result_t *r, int rank) { return bg__rank_ok(r, rank) ? r->busy[rank] : 0; }
double bg_sim_idle(const bg_sim_result_t *r, int rank) { return bg__rank_ok(r, rank) ? r->step - r->busy[rank] : 0; }
double bg_sim_rank_start(const bg_sim_result_t *r, int rank) { return bg__rank_ok(r, rank) ? r->start[rank] : 0; }
double bg_sim_rank_end(const bg_sim_result_t *r, int rank) { return bg__rank_ok(r, rank) ? r->end[rank] : 0; }
int bg_sim_peak_stash(const bg_sim_result_t *r, int rank) { return bg__rank_ok(r, rank) ? r->peak_stash[rank] : 0; }
double bg_sim_peak_stash_bytes(const bg_sim_result_t *r, int rank)
{
    return bg__rank_ok(r, rank) ? r->peak_bytes[rank] : 0;
}

double bg_sim_bubble(const bg_sim_result_t *r, int rank)
{
    if (!r || r->step <= 0)
        return 0;
    if (rank >= 0)
        return bg__rank_ok(r, rank) ? (r->step - r->busy[rank]) / r->step : 0;
    double idle = 0;
    for (int k = 0; k < r->p; k++)
        idle += r->step - r->busy[k];
    return idle / (r->p * r->step);
}

double bg_sim_span_bubble(const bg_sim_result_t *r, int rank)
{
    if (!r)
        return 0;
    double idle = 0, span = 0;
    for (int k = 0; k < r->p; k++) {
        if (rank >= 0 && k != rank)
            continue;
        double sp = r->end[k] - r->start[k];
        span += sp;
        idle += sp - r->busy[k];
    }
    return span > 0 ? idle / span : 0;
}

double bg_sim_stage_bubble(const bg_sim_result_t *r, int *rank_p)
{
    double worst = 0;
    int at = 0;
    for (int k = 0; r && k < r->p; k++) {
        double b = bg_sim_span_bubble(r, k);
        if (b > worst)
            worst = b, at = k;
    }
    if (rank_p)
        *rank_p = at;
    return worst;
}

const bg_sim_event_t *bg_sim_events(const bg_sim_result_t *r, size_t *count_p)
{
    *count_p = r ? r->nevents : 0;
    return r ? r->events : NULL;
}
