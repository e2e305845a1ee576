/* partitioner/partition.c: the exact partitioner. Stage evaluation (the
 * memory model: the same buffers bg_stage_memory() reports and the executor
 * allocates, times the slot counts the schedule keeps), the pruned dynamic
 * program over (stages, layers) that minimises the slowest stage, and the
 * shortfall when nothing fits. The slot counts and the bytes of a row of them
 * come from schedule/memory.c, which the executor shares. Pure arithmetic on
 * the profile: it must never create a model or touch a backend (a 1000-layer
 * plan has to take milliseconds).
 *
 * The dynamic program: f[s][j] = smallest bottleneck placing layers 0..j-1 on
 * stages 0..s-1; f[s+1][b+1] = min over a of max(f[s][a], T(s, a, b)).
 * Exhaustive over all (a, b) it is O(S L^2). It is pruned with an upper bound
 * U on the answer: a range whose compute alone exceeds U, or whose
 * parameters alone exceed the budget, ends the extension of that start (both
 * only grow with the range), so each start looks at about U / (mean layer
 * time) ranges. U starts at the perfect-balance lower bound and doubles until
 * the restricted program finds a split within U; that split is optimal
 * because every range it skipped is slower than U. docs/partitioner.md. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/partitioner.h"
#include "core/check.h"
#include "schedule/memory.h"

static size_t al64(size_t b) { return (b + 63) & ~(size_t)63; }

typedef struct ctx {
    const bg_part_problem_t *p;
    int L, S;
    double *pt;   /* prefix of fwd + bwd time */
    double *pf;   /* prefix of fwd time */
    size_t *pp;   /* prefix of params */
    size_t *pa;   /* prefix of stash bytes */
    size_t *pw;   /* prefix of wstash bytes */
    size_t delta; /* added to every budget (shortfall search) */
    size_t *actmult; /* [S] activations every fitting variant keeps at least: a lower bound that grows with the range */
    double *comm_in, *comm_out; /* [L] a range's boundary messages: in before layer a (a > 0), out after b (< L - 1) */
} ctx_t;

static bg_status_t check_problem(const bg_part_problem_t *p)
{
    if (!p || p->size < sizeof(bg_part_problem_t))
        return bg_error(BG_ERR_INVALID, "partition problem: NULL or size %zu (expected %zu: use BG_PART_PROBLEM_INIT)",
                        p ? p->size : 0, sizeof(bg_part_problem_t));
    if (p->nlayers < 1 || !p->layers)
        return bg_error(BG_ERR_INVALID, "partition problem: %d layers (need at least 1)", p->nlayers);
    if (p->nstages < 1 || !p->stages)
        return bg_error(BG_ERR_INVALID, "partition problem: %d stages (need at least 1)", p->nstages);
    if (p->nstages > p->nlayers)
        return bg_error(BG_ERR_INVALID, "%d stages but only %d layers: every stage needs at least one layer",
                        p->nstages, p->nlayers);
    if (!(p->link_latency >= 0) || !(p->link_bandwidth >= 0) || !isfinite(p->link_latency))
        return bg_error(BG_ERR_INVALID, "link latency %g and bandwidth %g must be >= 0", p->link_latency,
                        p->link_bandwidth);
    for (int s = 0; s < p->nstages; s++) {
        const bg_part_stage_spec_t *sp = &p->stages[s];
        if (!(sp->speed > 0) || !isfinite(sp->speed))
            return bg_error(BG_ERR_INVALID, "stage %d: speed %g (must be > 0)", s, sp->speed);
        if (sp->budget_bytes == 0)
            return bg_error(BG_ERR_INVALID, "stage %d: memory budget is 0 (must be > 0)", s);
        if (sp->ncounts < 1 || !sp->counts)
            return bg_error(BG_ERR_INVALID, "stage %d: no slot counts (need at least one row)", s);
        for (int k = 0; k < sp->ncounts; k++) {
            const bg_part_counts_t *n = &sp->counts[k];
            if (n->begun < 0 || n->forwarded < 0 || n->dout < 0 || n->backward < 0 || n->recomputing < 0 ||
                n->lingering < 0 || n->fused < 0 || n->fused > n->backward || n->offloaded < 0 ||
                n->offloaded > n->forwarded)
                return bg_error(BG_ERR_INVALID, "stage %d: negative slot count in row %d (or more fused backwards "
                                "than backwards, or more offloaded stashes than forwarded slots)", s, k);
        }
    }
    for (int i = 0; i < p->nlayers; i++)
        if (!(p->layers[i].fwd_time >= 0) || !(p->layers[i].bwd_time >= 0) || !isfinite(p->layers[i].fwd_time) ||
            !isfinite(p->layers[i].bwd_time))
            return bg_error(BG_ERR_INVALID, "layer %d: times %g, %g must be finite and >= 0", i,
                            p->layers[i].fwd_time, p->layers[i].bwd_time);
    return BG_OK;
}

static void ctx_free(ctx_t *c)
{
    free(c->pt);
    free(c->pf);
    free(c->pp);
    free(c->pa);
    free(c->pw);
    free(c->actmult);
    free(c->comm_in);
}

static size_t grad_of(const bg_part_layer_t *l);
static double link_time(const bg_part_problem_t *p, size_t bytes);

static bg_status_t ctx_init(ctx_t *c, const bg_part_problem_t *p)
{
    memset(c, 0, sizeof(*c));
    c->p = p;
    c->L = p->nlayers;
    c->S = p->nstages;
    size_t n = (size_t)c->L + 1;
    c->pt = malloc(n * sizeof(double));
    c->pf = malloc(n * sizeof(double));
    c->pp = malloc(n * sizeof(size_t));
    c->pa = malloc(n * sizeof(size_t));
    c->pw = malloc(n * sizeof(size_t));
    c->actmult = malloc((size_t)c->S * sizeof(size_t));
    c->comm_in = malloc(2 * (size_t)c->L * sizeof(double));
    if (!c->pt || !c->pf || !c->pp || !c->pa || !c->pw || !c->actmult || !c->comm_in) {
        ctx_free(c);
        return bg_error(BG_ERR_NOMEM, "partitioner prefix sums for %d layers", c->L);
    }
    c->pt[0] = c->pf[0] = 0;
    c->pp[0] = c->pa[0] = c->pw[0] = 0;
    for (int i = 0; i < c->L; i++) {
        const bg_part_layer_t *l = &p->layers[i];
        c->pt[i + 1] = c->pt[i] + (l->fwd_time + l->bwd_time);
        c->pf[i + 1] = c->pf[i] + l->fwd_time;
        c->pp[i + 1] = c->pp[i] + l->params;
        c->pa[i + 1] = c->pa[i] + l->stash_bytes;
        c->pw[i + 1] = c->pw[i] + l->wstash_bytes;
    }
    c->comm_out = c->comm_in + c->L;
    for (int i = 0; i < c->L; i++) { /* each range's messages (comm_time) read, not recomputed */
        c->comm_in[i] = i > 0 ? link_time(p, p->layers[i - 1].output_bytes) : 0.0;
        c->comm_out[i] = i < c->L - 1 ? link_time(p, grad_of(&p->layers[i])) : 0.0;
    }
    for (int s = 0; s < c->S; s++) {
        size_t maxf = 0, maxr = 0;
        for (int k = 0; k < p->stages[s].ncounts; k++) {
            const bg_part_counts_t *n = &p->stages[s].counts[k]; /* the stashes on the device */
            if ((size_t)(n->forwarded - n->offloaded) > maxf)
                maxf = (size_t)(n->forwarded - n->offloaded);
            if ((size_t)p->stages[s].counts[k].recomputing > maxr)
                maxr = (size_t)p->stages[s].counts[k].recomputing;
        }
        /* the activations every variant keeps at its peak row, at least */
        c->actmult[s] = p->allow_recompute && maxr < maxf ? maxr : maxf;
    }
    return BG_OK;
}

/* Running maxima over a range, updated as it grows by one layer. */
typedef struct rmax {
    size_t scratch, out, w;
} rmax_t;

/* A layer's output gradient (fp32): its output's bytes when the outputs are kept in fp32. */
static size_t grad_of(const bg_part_layer_t *l) { return l->grad_bytes ? l->grad_bytes : l->output_bytes; }

/* A gradient buffer of the backward as a stage allocates it: aligned, with its guard bytes after it. */
static size_t grad_piece(const bg_part_problem_t *p, size_t bytes) { return al64(bytes) + p->guard_bytes; }

static void rmax_add(const bg_part_problem_t *p, rmax_t *m, const bg_part_layer_t *l)
{
    size_t o = grad_piece(p, grad_of(l));
    size_t w = l->wstash_bytes > o ? l->wstash_bytes - o : 0;
    if (l->scratch_bytes > m->scratch)
        m->scratch = l->scratch_bytes;
    if (o > m->out)
        m->out = o;
    if (w > m->w)
        m->w = w;
}

static double link_time(const bg_part_problem_t *p, size_t bytes)
{
    return p->link_latency + (p->link_bandwidth > 0 ? (double)bytes / p->link_bandwidth : 0.0);
}

/* Layers [a, b]'s compute on stage s (rc: with recomputation) and their
 * boundary messages' time: eval_core's terms, shared with dp_run's test of
 * whether a range's evaluation can matter, so that both agree to the bit. */
static double compute_time(const ctx_t *c, int s, int a, int b, int rc)
{
    return (c->pt[b + 1] - c->pt[a] + (rc ? c->pf[b + 1] - c->pf[a] : 0.0)) / c->p->stages[s].speed;
}

static double comm_time(const ctx_t *c, int a, int b)
{
    return c->comm_in[a] + c->comm_out[b];
}

/* Layers [a, b] on stage s (maxima of the range in m). */
static void eval_core(const ctx_t *c, int s, int a, int b, int rc, const rmax_t *m, bg_part_stage_t *e)
{
    const bg_part_problem_t *p = c->p;
    const bg_part_layer_t *ly = p->layers;
    const bg_part_stage_spec_t *sp = &p->stages[s];
    int L = c->L;
    int has_din = a > 0; /* the model's own input needs no gradient */
    size_t in = a > 0 ? ly[a - 1].output_bytes : p->input_bytes;
    size_t din = a > 0 ? grad_of(&ly[a - 1]) : 0; /* its gradient, sent back */
    size_t data = (a == 0 ? p->token_bytes : 0) + (b == L - 1 ? p->target_bytes : 0);
    size_t act = c->pa[b + 1] - c->pa[a];
    size_t dout = b < L - 1 ? grad_of(&ly[b]) : 0;
    size_t wsum = c->pw[b + 1] - c->pw[a], alb = grad_piece(p, grad_of(&ly[b]));
    size_t split = (wsum > alb ? wsum - alb : 0) + (has_din ? grad_piece(p, din) : 0);
    size_t maxact = m->out;
    if (has_din && grad_piece(p, din) > maxact)
        maxact = grad_piece(p, din);
    size_t fused = 2 * maxact + m->w; /* m->w: the largest wstash piece (its guard included) */
    size_t bw = sp->split_backward ? split : fused;
    /* recomputation keeps the stage's output (it is sent, or it is the loss) */
    size_t keep = rc ? ly[b].output_bytes : 0;
    /* a slot held after its gradient's send was issued: its backward buffer, which holds that gradient
     * (the executor releases the rest right after the fused backward: bg_stage_release) */
    size_t linger = has_din && p->linger_bytes && din >= p->linger_bytes ? fused : 0;
    e->input_bytes = in;
    e->data_bytes = data;
    e->layer_act_bytes = act;
    e->dout_bytes = dout;
    e->bw_bytes = bw;
    e->fused_bw_bytes = fused;
    e->keep_bytes = keep;
    e->linger_bytes = linger;
    e->recompute = rc;
    size_t peak = 0;
    for (int k = 0; k < sp->ncounts; k++) {
        size_t v = bg__row_bytes(&sp->counts[k], e);
        if (v > peak)
            peak = v;
    }
    e->first = a;
    e->last = b;
    /* --zero 2: its bucket buffers, as the executor makes them (schedule/memory.h) */
    size_t np = c->pp[b + 1] - c->pp[a], inflight = 0;
    if (p->bucket_buffers > 0) {
        size_t target = bg__zero2_bucket_floats(p->bucket_bytes / sizeof(float), np, p->bucket_dp, p->bucket_buffers);
        size_t largest;
        int nb = bg__zero2_bucket_walk(c->pp, a, b, target, &largest);
        int nbuf = bg__zero2_buffers(p->bucket_buffers, nb, largest, np, p->bucket_dp);
        /* none: the executor keeps the stage's gradients whole, beside the shard counted in bytes_per_param */
        inflight = (nbuf || !nb ? (size_t)nbuf * largest : np - np / (size_t)p->bucket_dp) * sizeof(float);
        if (p->param_buffers > 0) { /* --zero 3: the gather buffers, or the parameters whole beside their shard */
            size_t owned = np / (size_t)p->bucket_dp + (size_t)nb; /* rank 0's chunks: at most one more per bucket */
            int npar = bg__zero3_buffers(p->param_buffers, nb, owned, largest, np);
            inflight += (npar ? (size_t)npar * largest : np - np / (size_t)p->bucket_dp) * sizeof(float);
        }
    }
    e->static_bytes = np * p->bytes_per_param + inflight;
    e->scratch_bytes = m->scratch * (p->paired ? 2 : 1); /* paired instructions: a scratch per lane */
    e->act_bytes = peak;
    e->mem_bytes = e->static_bytes + e->scratch_bytes + e->act_bytes;
    e->fits = e->mem_bytes <= sp->budget_bytes + c->delta;
    e->stash_per_mb = in + data + (rc ? keep : act);
    e->compute_time = compute_time(c, s, a, b, rc);
    e->comm_time = comm_time(c, a, b);
    e->time = e->compute_time + e->comm_time;
}

/* The rule: no recomputation if it fits, else recomputation if allowed and
 * it fits. Returns 1 with *e filled when the range fits one way. */
static int eval_choose(const ctx_t *c, int s, int a, int b, const rmax_t *m, bg_part_stage_t *e)
{
    eval_core(c, s, a, b, 0, m, e);
    if (e->fits)
        return 1;
    if (!c->p->allow_recompute)
        return 0;
    eval_core(c, s, a, b, 1, m, e);
    return e->fits;
}

bg_status_t bg_part_stage_eval(const bg_part_problem_t *prob, int stage, int first, int last, int recompute,
                               bg_part_stage_t *eval_p)
{
    BG_CHECK(check_problem(prob));
    if (stage < 0 || stage >= prob->nstages || first < 0 || last < first || last >= prob->nlayers)
        return bg_error(BG_ERR_INVALID, "stage %d, layers %d..%d: out of range (%d stages, %d layers)", stage,
                        first, last, prob->nstages, prob->nlayers);
    ctx_t c;
    BG_CHECK(ctx_init(&c, prob));
    rmax_t m = {0, 0, 0};
    for (int i = first; i <= last; i++)
        rmax_add(prob, &m, &prob->layers[i]);
    bg_part_stage_t e;
    memset(&e, 0, sizeof(e));
    eval_core(&c, stage, first, last, recompute ? 1 : 0, &m, &e);
    ctx_free(&c);
    *eval_p = e;
    return BG_OK;
}

/* The restricted program with bound U (INFINITY: unrestricted). f and arg
 * are (S+1) x (L+1). Returns the bottleneck (INFINITY: nothing fits within U). */
static double dp_run(const ctx_t *c, double U, double *f, int *arg, double *next_p, long long *work_p)
{
    double next = INFINITY; /* smallest stage time left out because it exceeded U */
    long long work = 0;
    int L = c->L, S = c->S;
    const bg_part_problem_t *p = c->p;
    size_t W = (size_t)L + 1;
    for (size_t i = 0; i < (size_t)(S + 1) * W; i++)
        f[i] = INFINITY;
    f[0] = 0.0;
    bg_part_stage_t e;
    for (int s = 0; s < S; s++) {
        const double *fs = f + (size_t)s * W;
        double *fn = f + (size_t)(s + 1) * W;
        int *an = arg + (size_t)(s + 1) * W;
        const bg_part_stage_spec_t *sp = &p->stages[s];
        size_t budget = sp->budget_bytes + c->delta;
        int bmax = L - 1 - (S - 1 - s);
        for (int a = s; a <= bmax; a++) {
            if (fs[a] == INFINITY || !(fs[a] <= U))
                continue;
            rmax_t m = {0, 0, 0};
            for (int b = a; b <= bmax; b++) {
                work++;
                rmax_add(p, &m, &p->layers[b]);
                if ((c->pp[b + 1] - c->pp[a]) * p->bytes_per_param + m.scratch +
                        c->actmult[s] * (c->pa[b + 1] - c->pa[a]) >
                    budget)
                    break; /* a lower bound of the memory that only grows with b */
                double lbt = (c->pt[b + 1] - c->pt[a]) / sp->speed;
                if (lbt > U) {
                    if (lbt < next)
                        next = lbt;
                    break; /* so does the compute */
                }
                /* a range that cannot lower fn[b + 1] matters only when its time exceeds U (next);
                 * its longest time, with recomputation if allowed, within U: its evaluation would change
                 * nothing (the evaluation's own terms, so the test agrees with it exactly) */
                if (!(fs[a] < fn[b + 1]) &&
                    compute_time(c, s, a, b, p->allow_recompute) + comm_time(c, a, b) <= U)
                    continue;
                if (!eval_choose(c, s, a, b, &m, &e))
                    continue; /* boundary terms depend on b: a longer range may still fit */
                if (e.time > U) {
                    if (e.time < next)
                        next = e.time;
                    continue;
                }
                double v = fs[a] > e.time ? fs[a] : e.time;
                if (v < fn[b + 1]) {
                    fn[b + 1] = v;
                    an[b + 1] = a;
                }
            }
        }
    }
    if (next_p)
        *next_p = next;
    if (work_p)
        *work_p = work;
    return f[(size_t)S * W + (size_t)L];
}

static long long dp_overflow(const ctx_t *c, long long U, long long *g, int *arg, long long max_work);
#define OVERFLOW_ABORTED (LLONG_MIN + 1)

/* Solve with the doubling bound; fills out (if not NULL) from the arg table. */
static double solve(const ctx_t *c, double *f, int *arg, bg_part_stage_t *out)
{
    const bg_part_problem_t *p = c->p;
    int L = c->L, S = c->S;
    double sum_speed = 0, min_speed = INFINITY;
    size_t maxout = p->input_bytes;
    for (int s = 0; s < S; s++) {
        sum_speed += p->stages[s].speed;
        if (p->stages[s].speed < min_speed)
            min_speed = p->stages[s].speed;
    }
    for (int i = 0; i < L; i++)
        if (grad_of(&p->layers[i]) > maxout) /* the larger of a boundary's two messages */
            maxout = grad_of(&p->layers[i]);
    /* every stage time is at most umax; the bottleneck at least lb */
    double umax = (c->pt[L] + c->pf[L]) / min_speed + 2.0 * link_time(p, maxout);
    double lb = c->pt[L] / sum_speed;
    double U = lb > 0 ? lb * 1.25 : 0.0;
    double best = INFINITY;
    int memory_fits = 0;
    for (;;) {
        if (!(U < umax))
            U = INFINITY;
        double next;
        long long work;
        best = dp_run(c, U, f, arg, &next, &work);
        /* done when the answer is within U, or when nothing was left out for
         * time (then the restricted program is the unrestricted one) */
        if (best <= U || U == INFINITY || next == INFINITY)
            break;
        if (!memory_fits) {
            /* before raising U: does any split fit at all? A memory-only
             * pass, given a few times the work of this pass so that raising
             * U stays the cheaper road when memory is plentiful */
            long long *g = malloc((size_t)(S + 1) * ((size_t)L + 1) * sizeof(long long));
            if (g) {
                long long ov = dp_overflow(c, (long long)c->delta, g, arg, 4 * work + 4096);
                free(g);
                if (ov != OVERFLOW_ABORTED && ov > (long long)c->delta) {
                    best = INFINITY;
                    break;
                }
                if (ov != OVERFLOW_ABORTED)
                    memory_fits = 1;
            }
        }
        U = U > 0 ? U * 2.0 : (umax > 0 ? umax * 1e-6 : INFINITY);
        if (next > U)
            U = next;
    }
    if (best == INFINITY || !out)
        return best;
    size_t W = (size_t)L + 1;
    int j = L;
    for (int s = S - 1; s >= 0; s--) {
        int a = arg[(size_t)(s + 1) * W + (size_t)j];
        rmax_t m = {0, 0, 0};
        for (int i = a; i < j; i++)
            rmax_add(p, &m, &p->layers[i]);
        eval_choose(c, s, a, j - 1, &m, &out[s]);
        j = a;
    }
    return best;
}

static bg_status_t alloc_tables(const ctx_t *c, double **f_p, int **arg_p)
{
    size_t n = (size_t)(c->S + 1) * ((size_t)c->L + 1);
    double *f = malloc(n * sizeof(double));
    int *arg = malloc(n * sizeof(int));
    if (!f || !arg) {
        free(f);
        free(arg);
        return bg_error(BG_ERR_NOMEM, "partitioner tables (%d stages x %d layers)", c->S, c->L);
    }
    *f_p = f;
    *arg_p = arg;
    return BG_OK;
}

/* Smallest possible largest overflow (memory - budget) of a stage over all
 * splits, each range taking its smaller variant. Ranges whose static memory
 * alone overflows by more than U (an overflow some split achieves) are
 * skipped, as in dp_run. g is (S+1) x (L+1). Exact integers: one pass, no
 * bisection. */
static long long dp_overflow(const ctx_t *c, long long U, long long *g, int *arg, long long max_work)
{
    long long work = 0;
    int L = c->L, S = c->S;
    const bg_part_problem_t *p = c->p;
    size_t W = (size_t)L + 1;
    for (size_t i = 0; i < (size_t)(S + 1) * W; i++)
        g[i] = LLONG_MAX;
    g[0] = LLONG_MIN;
    bg_part_stage_t e;
    for (int s = 0; s < S; s++) {
        const long long *gs = g + (size_t)s * W;
        long long *gn = g + (size_t)(s + 1) * W;
        int *an = arg + (size_t)(s + 1) * W;
        long long budget = (long long)p->stages[s].budget_bytes;
        int bmax = L - 1 - (S - 1 - s);
        for (int a = s; a <= bmax; a++) {
            if (gs[a] == LLONG_MAX)
                continue;
            rmax_t m = {0, 0, 0};
            for (int b = a; b <= bmax; b++) {
                if (max_work > 0 && ++work > max_work)
                    return OVERFLOW_ABORTED;
                rmax_add(p, &m, &p->layers[b]);
                if ((long long)((c->pp[b + 1] - c->pp[a]) * p->bytes_per_param + m.scratch +
                                c->actmult[s] * (c->pa[b + 1] - c->pa[a])) -
                        budget >
                    U)
                    break;
                eval_core(c, s, a, b, 0, &m, &e);
                long long ov = (long long)e.mem_bytes - budget;
                if (p->allow_recompute) {
                    eval_core(c, s, a, b, 1, &m, &e);
                    if ((long long)e.mem_bytes - budget < ov)
                        ov = (long long)e.mem_bytes - budget;
                }
                if (ov > U)
                    continue;
                long long v = gs[a] > ov ? gs[a] : ov;
                if (v < gn[b + 1]) {
                    gn[b + 1] = v;
                    an[b + 1] = a;
                }
            }
        }
    }
    return g[(size_t)S * W + (size_t)L];
}

static bg_status_t shortfall(const ctx_t *c0, double *f, int *arg, bg_part_shortfall_t *sf)
{
    ctx_t c = *c0;
    const bg_part_problem_t *p = c.p;
    memset(sf, 0, sizeof(*sf));
    c.delta = 0;
    if (solve(&c, f, arg, NULL) < INFINITY)
        return BG_OK;
    /* an upper bound: the fastest split with unlimited memory overflows its
     * budgets by at most hi */
    long long hi = 0;
    bg_part_stage_t *st = malloc((size_t)c.S * sizeof(*st));
    long long *g = malloc((size_t)(c.S + 1) * ((size_t)c.L + 1) * sizeof(long long));
    if (!st || !g) {
        free(st);
        free(g);
        return bg_error(BG_ERR_NOMEM, "shortfall tables");
    }
    c.delta = (size_t)1 << 62;
    if (solve(&c, f, arg, st) == INFINITY) {
        free(st);
        free(g);
        return bg_error(BG_ERR_INTERNAL, "partitioner: no budget makes this problem fit");
    }
    for (int s = 0; s < c.S; s++)
        if ((long long)st[s].mem_bytes - (long long)p->stages[s].budget_bytes > hi)
            hi = (long long)st[s].mem_bytes - (long long)p->stages[s].budget_bytes;
    long long best = dp_overflow(&c, hi, g, arg, 0);
    free(g);
    if (best <= 0 || best == LLONG_MAX) {
        free(st);
        return bg_error(BG_ERR_INTERNAL, "partitioner: inconsistent shortfall %lld (bound %lld)", best, hi);
    }
    c.delta = (size_t)best;
    {
        size_t W = (size_t)c.L + 1;
        int j = c.L;
        for (int s = c.S - 1; s >= 0; s--) {
            int a = arg[(size_t)(s + 1) * W + (size_t)j];
            rmax_t m = {0, 0, 0};
            for (int i = a; i < j; i++)
                rmax_add(p, &m, &p->layers[i]);
            eval_choose(&c, s, a, j - 1, &m, &st[s]);
            j = a;
        }
    }
    size_t hi_bytes = (size_t)best;
    int worst = 0;
    long long wover = LLONG_MIN;
    for (int s = 0; s < c.S; s++) {
        long long over = (long long)st[s].mem_bytes - (long long)p->stages[s].budget_bytes;
        if (over > wover) {
            wover = over;
            worst = s;
        }
    }
    sf->extra_bytes = hi_bytes;
    sf->stage = worst;
    sf->first = st[worst].first;
    sf->last = st[worst].last;
    sf->need_bytes = st[worst].mem_bytes;
    sf->budget_bytes = p->stages[worst].budget_bytes;
    size_t big = 0;
    sf->biggest_layer = sf->first;
    for (int i = sf->first; i <= sf->last; i++) {
        size_t b = p->layers[i].params * p->bytes_per_param + p->layers[i].stash_bytes;
        if (b > big) {
            big = b;
            sf->biggest_layer = i;
        }
    }
    free(st);
    return BG_OK;
}

bg_status_t bg_part_shortfall(const bg_part_problem_t *prob, bg_part_shortfall_t *sf_p)
{
    BG_CHECK(check_problem(prob));
    ctx_t c;
    BG_CHECK(ctx_init(&c, prob));
    double *f = NULL;
    int *arg = NULL;
    bg_status_t st = alloc_tables(&c, &f, &arg);
    if (st == BG_OK) {
        bg_part_shortfall_t sf;
        st = shortfall(&c, f, arg, &sf);
        if (st == BG_OK)
            *sf_p = sf;
        free(f);
        free(arg);
    }
    ctx_free(&c);
    return st;
}

bg_status_t bg_partition(const bg_part_problem_t *prob, bg_part_stage_t *out, double *bottleneck_p)
{
    BG_CHECK(check_problem(prob));
    ctx_t c;
    BG_CHECK(ctx_init(&c, prob));
    double *f = NULL;
    int *arg = NULL;
    bg_part_stage_t *res = NULL;
    bg_status_t st;
    BG_CHECK_GOTO(alloc_tables(&c, &f, &arg), st, out);
    res = malloc((size_t)c.S * sizeof(*res));
    if (!res) {
        st = bg_error(BG_ERR_NOMEM, "partition result");
        goto out;
    }
    double best = solve(&c, f, arg, res);
    if (best == INFINITY && prob->quick_no_fit) {
        st = bg_error(BG_ERR_NO_FIT, "no split of %d layers over %d stages fits", c.L, c.S);
        goto out;
    }
    if (best == INFINITY) {
        bg_part_shortfall_t sf;
        BG_CHECK_GOTO(shortfall(&c, f, arg, &sf), st, out);
        st = bg_error(BG_ERR_NO_FIT,
                      "no split of %d layers over %d stages fits: at best stage %d (layers %d..%d) needs %zu bytes "
                      "but its budget is %zu (short by %zu; its biggest layer is %d); every budget needs %zu more "
                      "bytes",
                      c.L, c.S, sf.stage, sf.first, sf.last, sf.need_bytes, sf.budget_bytes,
                      sf.need_bytes - sf.budget_bytes, sf.biggest_layer, sf.extra_bytes);
        goto out;
    }
    memcpy(out, res, (size_t)c.S * sizeof(*res));
    if (bottleneck_p)
        *bottleneck_p = best;
    st = BG_OK;
out:
    free(res);
    free(f);
    free(arg);
    ctx_free(&c);
    return st;
}
