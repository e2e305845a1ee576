/* runtime/ps.c: parameter servers and their workers
 * (docs/parameter_server.md); the workers' side of the protocol is in
 * runtime/ps_worker.c, the state both share in runtime/ps_impl.h.
 * Ranks 0 .. S-1 are servers, S .. N-1 workers; every tensor belongs whole
 * to one server (largest first, to the least loaded, ties to the lower
 * index: every rank computes the same map from the model). A worker is a
 * replica run by the executor: one rank, or a pipeline of pp ranks (worker
 * w: ranks S + w*pp .. S + w*pp + pp - 1, schedule/layout.h), each rank
 * holding its stages' tensors. Where data parallelism all-reduces a gradient
 * bucket, a worker rank pushes the bucket's tensors to their servers, and it
 * pulls back exactly its tensors after its step. A server expects from each
 * worker one push per tensor, from the pipeline rank holding it, and the
 * step's loss share and stop flag from every rank of the pipeline. It sums
 * the pushes of a step in worker order once all have arrived (never in
 * arrival order: the bits must not depend on timing), rescales the sum when
 * workers died, applies the model's optimizer step to its tensors and sends
 * the new version to every live worker. A worker whose rank died is dropped
 * whole; the rest of its pipeline stops (its waits watch the pipeline).
 *
 * Staleness K: a worker computes step t on parameters of a version >= t - K.
 * K = 0 receives the new parameters straight into the model at the end of
 * the step; K > 0 receives them into a second buffer, copied in at the start
 * of a step, so a step never sees a half-updated model. A server keeps K + 1
 * steps of receives posted so workers can push ahead. The ranks of a
 * pipeline each run on their own tensors' version (each within [t - K, t]);
 * with K > 0 the loss rank decides when the pipeline stops and tells the
 * others, so all run the same steps.
 *
 * Messages are matched by tag and by order (equal tags from one peer match
 * in the order sent), so they carry no step number. Tags: bits 16..29 hold
 * 0x3ffe, a stage number the executor never uses; bits 30..31 the kind
 * (push, pull, gather, control); bits 0..15 the tensor (0xffff: the step's
 * loss and stop flag; control: 0 the bye, 1 a pipeline's loss and stop).
 *
 * After a stop with K > 0 a worker may have pushed up to K + 1 steps the
 * servers will not run; it tells every server how many steps it pushed (bye)
 * and the servers receive them before leaving, so no send is left in flight
 * and no message unmatched.
 *
 * Every transfer of backend memory (pushes, pulls, the servers' receive sets
 * and sends) goes through the executor's staging layer (runtime/staging.h):
 * direct where buffers are host memory, through host blocks in chunks where
 * they are device memory (or BRIGADE_STAGING=always); the servers' sum,
 * rescaling and ties are the backend's ops on backend memory. The loss and
 * stop flags and the byes are host memory, sent directly.
 *
 * --emulate: waits sleep instead of spinning, a server's update is free (no
 * sum, no optimizer: the emulated executor's update is too); the transfers
 * are real.
 *
 * Owns: the tensor map, the servers' receive buffers, the workers' second
 * parameter buffer, the requests. Must not: run compute (the executor does),
 * touch the model's layout. */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"
#include "runtime/clip.h"
#include "runtime/emulate.h"
#include "runtime/ps_impl.h"



/* Index of the tensor named @p name, -1 if none. */
static int tensor_index(char (*names)[2 * BG_NAME_MAX], int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0)
            return i;
    return -1;
}

/* The tensors' sizes from the description, and their servers: largest
 * first, to the least loaded server (elements), equal loads to the lower
 * server; the two tensors of a tie go to one server (it adds their
 * gradients after the workers' sum, as data parallelism does). */
static bg_status_t tensor_map(const bg_model_desc_t *d, int S, int n, size_t *numel, int *owner)
{
    int *order = malloc(((size_t)n + 1) * sizeof(int));
    int *partner = malloc(((size_t)n + 1) * sizeof(int));
    size_t *load = calloc((size_t)S, sizeof(size_t));
    char(*names)[2 * BG_NAME_MAX] = calloc((size_t)n + 1, sizeof(*names));
    bg_status_t st = order && partner && load && names ? BG_OK : bg_error(BG_ERR_NOMEM, "parameter server tensor map");
    for (int i = 0; st == BG_OK && i < n; i++) {
        order[i] = i;
        partner[i] = -1;
        owner[i] = -1;
        st = bg_model_desc_tensor(d, i, names[i], sizeof names[i], &numel[i]);
    }
    for (int t = 0; st == BG_OK && t < bg_model_desc_num_ties(d); t++) {
        const char *a, *b;
        bg_model_desc_tie_names(d, t, &a, &b);
        int ia = tensor_index(names, n, a), ib = tensor_index(names, n, b);
        if (ia >= 0 && ib >= 0)
            partner[ia] = ib, partner[ib] = ia;
    }
    free(names);
    if (st != BG_OK) {
        free(order);
        free(partner);
        free(load);
        return st;
    }
    for (int i = 1; i < n; i++) { /* stable insertion sort by size, descending */
        int k = order[i], j = i;
        while (j > 0 && numel[order[j - 1]] < numel[k]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = k;
    }
    for (int a = 0; a < n; a++) {
        int i = order[a], best = 0;
        for (int s = 1; s < S; s++)
            if (load[s] < load[best])
                best = s;
        if (partner[i] >= 0 && owner[partner[i]] >= 0)
            best = owner[partner[i]];
        owner[i] = best;
        load[best] += numel[i];
    }
    free(order);
    free(partner);
    free(load);
    return BG_OK;
}

bg_status_t bg__ps_owned(const bg_model_desc_t *d, int servers, int server, unsigned char **which_p)
{
    int n = bg_model_desc_num_tensors(d);
    size_t *numel = calloc((size_t)n + 1, sizeof(size_t));
    int *owner = calloc((size_t)n + 1, sizeof(int));
    unsigned char *which = calloc((size_t)n + 1, 1);
    bg_status_t st = numel && owner && which ? tensor_map(d, servers, n, numel, owner)
                                             : bg_error(BG_ERR_NOMEM, "parameter server tensor map");
    for (int i = 0; st == BG_OK && i < n; i++)
        which[i] = owner[i] == server;
    free(numel);
    free(owner);
    if (st != BG_OK) {
        free(which);
        return st;
    }
    *which_p = which;
    return BG_OK;
}

bg_status_t bg__ps_check_params(const bg_executor_params_t *p)
{
    if (p->ps < 0)
        return bg_error(BG_ERR_INVALID, "--ps %d: the number of parameter servers must be >= 1", p->ps);
    if (p->staleness < 0)
        return bg_error(BG_ERR_INVALID, "--staleness %d: the staleness bound must be >= 0", p->staleness);
    if (p->ps == 0)
        return p->staleness > 0 ? bg_error(BG_ERR_INVALID, "--staleness %d needs --ps (parameter servers)",
                                           p->staleness)
                                : BG_OK;
    if (p->tp > 1)
        return bg_error(BG_ERR_UNSUPPORTED, "--ps with --tp %d: the servers hold whole tensors and a tensor-parallel "
                        "worker holds slices of them; pushing and pulling slices is not built (--pp is)", p->tp);
    if (p->zero)
        return bg_error(BG_ERR_INVALID, "--ps with --zero %d: the servers already shard the optimizer state (by "
                        "tensor); leave --zero out", p->zero);
    int n = bg_model_desc_num_tensors(p->model), ties = bg_model_desc_num_ties(p->model);
    if (p->ps > n - ties)
        return bg_error(BG_ERR_INVALID, "--ps %d: more servers than the model's %d tensors (a server holds whole "
                        "tensors%s)", p->ps, n - ties, ties ? "; tied tensors count once" : "");
    if (n >= PS_META)
        return bg_error(BG_ERR_UNSUPPORTED, "--ps: the model has %d tensors; the parameter server handles at most %d",
                        n, PS_META - 1);
    return BG_OK;
}

void bg__ps_set_version(bg__ps_t *ps, int64_t step)
{
    ps->version = step;
    ps->pushed_steps = step;
}

/* Receive set `set` of worker w: its requests and buffers. */
static bg__xfer_t **set_rq(bg__ps_t *ps, int set, int w)
{
    return ps->rrq + ((size_t)set * ps->W + w) * (size_t)entries(ps);
}
static float *set_buf(bg__ps_t *ps, int set, int w) { return ps->recv + ((size_t)set * ps->W + w) * ps->own_floats; }
static float *set_meta(bg__ps_t *ps, int set, int w) { return ps->recv_meta + ((size_t)set * ps->W + w) * ps->P * 2; }
static bg__xfer_t **send_rq(bg__ps_t *ps, int w) { return ps->srq + (size_t)w * (size_t)entries(ps); }

/* A server's receives of worker w's pushes for one step: its tensors into
 * the receive set (backend memory: through the staging layer), the loss and
 * stop flags into host memory. */
static bg_status_t post_set(bg__ps_t *ps, int set, int w)
{
    bg__xfer_t **rq = set_rq(ps, set, w);
    float *buf = set_buf(ps, set, w), *meta = set_meta(ps, set, w);
    for (int j = 0; j < ps->nown; j++)
        BG_CHECK(bg__xrecv(ps->stg, ps->comm, worker_rank(ps, w, entry_rank(ps, j)), ps_tag(PS_PUSH, ps->own[j]),
                           buf + ps->own_off[j], ps->numel[ps->own[j]] * sizeof(float), &rq[j]));
    for (int k = 0; k < ps->P; k++)
        BG_CHECK(host_irecv(ps, worker_rank(ps, w, k), ps_tag(PS_PUSH, PS_META), meta + 2 * k, 2 * sizeof(float),
                            &rq[ps->nown + k]));
    return BG_OK;
}

bg_status_t bg__ps_create(const bg__ps_params_t *pp, bg__ps_t **ps_p)
{
    bg__ps_t *ps = calloc(1, sizeof(*ps));
    BG_ALLOC_CHECK(ps, sizeof(*ps), "parameter server");
    bg_status_t st = BG_OK;
    const bg_model_desc_t *d = pp->desc;
    ps->comm = pp->comm;
    ps->be = pp->be;
    ps->stg = pp->stg;
    ps->emulate = pp->emulate;
    ps->models = pp->models;
    ps->nmodels = pp->nmodels;
    ps->S = pp->servers;
    ps->clip = pp->clip;
    ps->P = pp->pp > 1 ? pp->pp : 1;
    ps->W = (bg_comm_size(pp->comm) - pp->servers) / ps->P;
    ps->K = pp->staleness;
    ps->layout = pp->layout;
    ps->rank = pp->layout->rank;
    ps->server = pp->layout->me.role == BG_LAYOUT_SERVER;
    ps->wk = ps->server ? -1 : pp->layout->me.dp;
    ps->pk = ps->server ? -1 : pp->layout->me.pp;
    ps->loss_rank = pp->loss_rank;
    ps->last = -1;
    ps->m = ps->server ? pp->models[0] : NULL;
    ps->n = bg_model_desc_num_tensors(d);
    size_t nt = (size_t)ps->n + 1;
    ps->owner = calloc(nt, sizeof(int));
    ps->holder = calloc(nt, sizeof(int));
    ps->off = calloc(nt, sizeof(size_t));
    ps->numel = calloc(nt, sizeof(size_t));
    ps->chunk = calloc(nt, sizeof(int));
    ps->back_off = calloc(nt, sizeof(size_t));
    if (!ps->owner || !ps->holder || !ps->off || !ps->numel || !ps->chunk || !ps->back_off) {
        st = bg_error(BG_ERR_NOMEM, "parameter server tensor map");
        goto err;
    }
    BG_CHECK_GOTO(tensor_map(d, ps->S, ps->n, ps->numel, ps->owner), st, err);
    for (int i = 0; i < ps->n; i++) {
        ps->holder[i] = pp->holder ? pp->holder[i] : 0;
        ps->chunk[i] = -1;
    }
    /* where each tensor lives on this rank: a server's model holds its own
     * (bg_model_create_tensors), in map order; a worker's chunks its stages' */
    for (int i = 0, k = 0; i < ps->n; i++) {
        char name[2 * BG_NAME_MAX];
        size_t numel = 0;
        BG_CHECK_GOTO(bg_model_desc_tensor(d, i, name, sizeof name, &numel), st, err);
        bg_param_t *p = NULL;
        if (ps->server && ps->owner[i] == ps->rank) {
            p = k < bg_model_num_tensors(ps->m) ? bg_model_tensor(ps->m, k) : NULL;
            k++;
            if (p)
                ps->off[i] = (size_t)(p->data - bg_model_params(ps->m));
        } else if (!ps->server && ps->holder[i] == ps->pk) {
            for (int v = 0; v < ps->nmodels && !p; v++)
                if ((p = bg_model_find_tensor(ps->models[v], name)) != NULL) {
                    ps->chunk[i] = v;
                    ps->off[i] = (size_t)(p->data - bg_model_params(ps->models[v]));
                }
            ps->back_off[i] = ps->local_floats;
            ps->local_floats += numel;
        } else {
            continue;
        }
        if (!p || p->numel != ps->numel[i]) {
            st = bg_error(BG_ERR_INTERNAL, "parameter server: rank %d does not hold tensor %d (%s) as the map says",
                          ps->rank, i, name);
            goto err;
        }
    }
    if (!ps->server) {
        ps->pushed = calloc(nt, 1);
        ps->push_rq = calloc(nt, sizeof(void *));
        ps->pull_rq = calloc(nt, sizeof(void *));
        ps->meta_rq = calloc((size_t)ps->S, sizeof(void *));
        if (!ps->pushed || !ps->push_rq || !ps->pull_rq || !ps->meta_rq) {
            st = bg_error(BG_ERR_NOMEM, "parameter server worker requests");
            goto err;
        }
        if (ps->K > 0) {
            size_t np = ps->local_floats;
            ps->back = bg_backend_alloc(ps->be, (np ? np : 1) * sizeof(float), "parameters being pulled (--staleness)");
            if (!ps->back) {
                st = BG_ERR_NOMEM;
                goto err;
            }
        }
        *ps_p = ps;
        return BG_OK;
    }
    ps->own = calloc((size_t)ps->n + 1, sizeof(int));
    ps->own_off = calloc((size_t)ps->n + 1, sizeof(size_t));
    ps->live = calloc((size_t)ps->W, sizeof(int));
    if (!ps->own || !ps->own_off || !ps->live) {
        st = bg_error(BG_ERR_NOMEM, "parameter server tables");
        goto err;
    }
    for (int i = 0; i < ps->n; i++)
        if (ps->owner[i] == ps->rank) {
            ps->own_off[ps->nown] = ps->own_floats;
            ps->own[ps->nown++] = i;
            ps->own_floats += ps->numel[i];
        }
    for (int w = 0; w < ps->W; w++)
        ps->live[w] = 1;
    ps->nlive = ps->W;
    int ndties = bg_model_desc_num_ties(d);
    ps->tie_a = calloc((size_t)ndties + 1, sizeof(bg_param_t *));
    ps->tie_b = calloc((size_t)ndties + 1, sizeof(bg_param_t *));
    if (!ps->tie_a || !ps->tie_b) {
        st = bg_error(BG_ERR_NOMEM, "parameter server ties");
        goto err;
    }
    for (int t = 0; t < ndties; t++) {
        const char *a, *b;
        bg_model_desc_tie_names(d, t, &a, &b);
        bg_param_t *pa = bg_model_find_tensor(ps->m, a), *pb = bg_model_find_tensor(ps->m, b);
        if (!!pa != !!pb) {
            st = bg_error(BG_ERR_INTERNAL, "parameter server %d holds %s but not %s, tied to it", ps->rank,
                          pa ? a : b, pa ? b : a);
            goto err;
        }
        if (pa) {
            ps->tie_a[ps->nties] = pa;
            ps->tie_b[ps->nties++] = pb;
        }
    }
    ps->R = ps->K + 1;
    size_t sets = (size_t)ps->R * ps->W;
    ps->recv = bg_backend_alloc(ps->be, (sets * ps->own_floats + 1) * sizeof(float),
                                "pushed gradients (parameter server)");
    ps->recv_meta = calloc(sets * ps->P * 2, sizeof(float));
    ps->rrq = calloc(sets * (size_t)entries(ps), sizeof(void *));
    ps->srq = calloc((size_t)ps->W * (size_t)entries(ps), sizeof(void *));
    if (!ps->recv || !ps->recv_meta || !ps->rrq || !ps->srq) {
        st = bg_error(BG_ERR_NOMEM, "parameter server receive buffers (%d steps x %d workers x %zu floats)", ps->R,
                      ps->W, ps->own_floats);
        goto err;
    }
    for (int s = 0; s < ps->R; s++)
        for (int w = 0; w < ps->W; w++)
            BG_CHECK_GOTO(post_set(ps, s, w), st, err);
    *ps_p = ps;
    return BG_OK;
err:
    bg__ps_destroy(ps);
    return st;
}

void bg__ps_destroy(bg__ps_t *ps)
{
    if (!ps)
        return;
    /* pending requests are cancelled (a send already in flight keeps its
     * buffer until the comm goes: the model and these buffers are freed
     * after the comm only when the executor owns it; a send to a live peer
     * that never posted its receive is never read) */
    free_reqs(ps->push_rq, (size_t)ps->n + 1);
    free_reqs(ps->pull_rq, (size_t)ps->n + 1);
    free_reqs(ps->meta_rq, (size_t)ps->S);
    bg__xfree(ps->reply_rq);
    if (ps->rrq)
        free_reqs(ps->rrq, (size_t)ps->R * ps->W * (size_t)entries(ps));
    if (ps->srq)
        free_reqs(ps->srq, (size_t)ps->W * (size_t)entries(ps));
    bg_backend_free(ps->be, ps->back);
    bg_backend_free(ps->be, ps->recv);
    free(ps->recv_meta);
    free(ps->rrq);
    free(ps->srq);
    free(ps->pushed);
    free(ps->push_rq);
    free(ps->pull_rq);
    free(ps->meta_rq);
    free(ps->own);
    free(ps->own_off);
    free(ps->live);
    free(ps->tie_a);
    free(ps->tie_b);
    free(ps->owner);
    free(ps->holder);
    free(ps->chunk);
    free(ps->back_off);
    free(ps->off);
    free(ps->numel);
    free(ps);
}

/* ------------------------------------------------------------------ servers */

/* "worker 1 (rank 3)", or with pipelines "worker 1 (ranks 3..4)". */
static const char *worker_name(const bg__ps_t *ps, int w, char *buf, size_t cap)
{
    if (ps->P == 1)
        snprintf(buf, cap, "worker %d (rank %d)", w, worker_rank(ps, w, 0));
    else
        snprintf(buf, cap, "worker %d (ranks %d..%d)", w, worker_rank(ps, w, 0), worker_rank(ps, w, ps->P - 1));
    return buf;
}

/* The first rank of worker w's pipeline known dead, -1: none. */
int bg__ps_dead_rank(bg__ps_t *ps, int w)
{
    for (int k = 0; k < ps->P; k++)
        if (!bg_comm_peer_alive(ps->comm, worker_rank(ps, w, k)))
            return worker_rank(ps, w, k);
    return -1;
}

/* Wait for a request with a rank of worker w. A pipelined worker is watched
 * whole: once one of its ranks died, a transfer with another may never
 * complete (that rank stops, or waits for versions no server sends it any
 * more), so the wait ends with BG_ERR_PEER naming the dead rank. One rank
 * per worker: bg_wait, which fails when that rank dies. */
bg_status_t bg__ps_wait(bg__ps_t *ps, bg__xfer_t *rq, int w)
{
    if (ps->emulate) /* sleep, not spin: the ranks outnumber the cores */
        bg__emulate_idle(rq);
    if (ps->P == 1)
        return bg__xwait(rq);
    double deadline = bg_now() + bg_comm_timeout(ps->comm);
    for (;;) {
        int done = 0;
        bg_status_t st = bg__xtest(rq, &done);
        if (st != BG_OK || done)
            return st;
        int dr = bg__ps_dead_rank(ps, w);
        if (dr >= 0) {
            char name[64];
            return bg_error(BG_ERR_PEER, "rank %d of %s died", dr, worker_name(ps, w, name, sizeof name));
        }
        if (bg_now() > deadline)
            return bg_error(BG_ERR_TIMEOUT, "a transfer with a rank of worker %d did not complete within %g s "
                            "(BRIGADE_TIMEOUT)", w, bg_comm_timeout(ps->comm));
        if (ps->emulate) {
            struct timespec t = {0, 20000};
            nanosleep(&t, NULL);
        } else {
            sched_yield();
        }
    }
}

/* A failure while talking to worker w: a dead server stops the job (its
 * tensors are gone), a worker with a dead rank is dropped whole (the rest of
 * its pipeline stops on its own); anything else is an error. */
static bg_status_t worker_failed(bg__ps_t *ps, int w, int64_t step, bg_status_t st)
{
    char why[512], name[128];
    snprintf(why, sizeof why, "%s", bg_last_error());
    for (int s = 0; s < ps->S; s++)
        if (s != ps->rank && !bg_comm_peer_alive(ps->comm, s))
            return bg_error(BG_ERR_PEER, "parameter server %d (rank %d) died; its tensors are gone: stopping (%s)", s,
                            s, why);
    int dr = bg__ps_dead_rank(ps, w);
    if (st != BG_ERR_PEER || dr < 0)
        return bg_error(st, "%s: %s", worker_name(ps, w, name, sizeof name), why);
    ps->live[w] = 0;
    ps->nlive--;
    for (int s = 0; s < ps->R; s++)
        free_reqs(set_rq(ps, s, w), (size_t)entries(ps));
    free_reqs(send_rq(ps, w), (size_t)entries(ps));
    if (ps->P == 1) {
        snprintf(name, sizeof name, "worker %d (rank %d)", w, dr);
    } else { /* every rank of it gone by now (the first to die is named in the reason) */
        int at = snprintf(name, sizeof name, "worker %d (ranks %d..%d; gone:", w, worker_rank(ps, w, 0),
                          worker_rank(ps, w, ps->P - 1));
        for (int k = 0; k < ps->P && at > 0 && (size_t)at < sizeof name; k++)
            if (!bg_comm_peer_alive(ps->comm, worker_rank(ps, w, k)))
                at += snprintf(name + at, sizeof name - (size_t)at, " %d", worker_rank(ps, w, k));
        if (at > 0 && (size_t)at < sizeof name)
            snprintf(name + at, sizeof name - (size_t)at, ")");
    }
    bg_log(BG_LOG_WARN, "ps", "%s died at step %lld; %d worker%s left (%s)", name, (long long)step + 1, ps->nlive,
           ps->nlive == 1 ? "" : "s", why);
    if (ps->nlive == 0)
        return bg_error(BG_ERR_PEER, "parameter server %d: every worker died (the last: %s: %s)", ps->rank, name,
                        why);
    return BG_OK;
}

/* Wait for the sends of the last version to worker w (they read the parameters). */
static bg_status_t wait_sends(bg__ps_t *ps, int w, int64_t step)
{
    bg__xfer_t **rq = send_rq(ps, w);
    for (int j = 0; j < entries(ps) && ps->live[w]; j++) {
        if (!rq[j])
            continue;
        bg_status_t st = bg__ps_wait(ps, rq[j], w);
        bg__xfree(rq[j]);
        rq[j] = NULL;
        if (st != BG_OK)
            BG_CHECK(worker_failed(ps, w, step, st));
    }
    return BG_OK;
}

/* --clip-grad on a server: the servers' exact sums meet at server 0, which
 * sends the total back (blocking: the servers outlive the workers), so each
 * server scales its tensors by the factor of the whole model's norm; the
 * reported norm is that one. */
static bg_status_t server_clip(bg__ps_t *ps, double *limbs, bg__ps_stats_t *stats)
{
    size_t bytes = BG__CLIP_LIMBS * sizeof(double);
    if (ps->S > 1 && ps->rank == 0) {
        double other[BG__CLIP_LIMBS];
        for (int s = 1; s < ps->S; s++) {
            BG_CHECK(bg_recv(ps->comm, s, ps_tag(PS_GATHER, 2), other, bytes));
            for (int k = 0; k < BG__CLIP_LIMBS; k++)
                limbs[k] += other[k];
        }
        for (int s = 1; s < ps->S; s++)
            BG_CHECK(bg_send(ps->comm, s, ps_tag(PS_GATHER, 3), limbs, bytes));
    } else if (ps->S > 1) {
        BG_CHECK(bg_send(ps->comm, 0, ps_tag(PS_GATHER, 2), limbs, bytes));
        BG_CHECK(bg_recv(ps->comm, 0, ps_tag(PS_GATHER, 3), limbs, bytes));
    }
    stats->grad_sumsq = bg__clip_value(limbs);
    float k = bg__clip_factor(ps->clip, sqrt(stats->grad_sumsq));
    float *grads = bg_model_grads(ps->m);
    for (int j = 0; j < ps->nown && k < 1; j++)
        ps->be->ops->scale(ps->be, grads + ps->off[ps->own[j]], k, ps->numel[ps->own[j]]);
    return BG_OK;
}

bg_status_t bg__ps_server_step(bg__ps_t *ps, const bg_optim_config_t *opt, int64_t step, bg__ps_stats_t *stats)
{
    int stop_req = 0;
    bg_backend_t *be = ps->be;
    memset(stats, 0, sizeof(*stats));
    int set = ps->next_set;
    double t0 = bg_now();
    /* every live worker's pushes of this step, in worker order */
    for (int w = 0; w < ps->W; w++) {
        bg__xfer_t **rq = set_rq(ps, set, w);
        for (int j = 0; j < entries(ps) && ps->live[w]; j++) {
            bg_status_t st = bg__ps_wait(ps, rq[j], w);
            if (st != BG_OK)
                BG_CHECK(worker_failed(ps, w, step, st));
        }
    }
    double t1 = bg_now();
    for (int w = 0; w < ps->W; w++)
        BG_CHECK(wait_sends(ps, w, step));
    /* the sum in worker order, rescaled to a mean over the sequences computed */
    float *grads = bg_model_grads(ps->m);
    double loss = 0;
    int first = 1;
    for (int w = 0; w < ps->W; w++) {
        if (!ps->live[w])
            continue;
        float *buf = set_buf(ps, set, w);
        for (int j = 0; j < ps->nown && !ps->emulate; j++) {
            int i = ps->own[j];
            if (first)
                be->ops->copy(be, grads + ps->off[i], buf + ps->own_off[j], ps->numel[i]);
            else
                be->ops->residual_forward(be, grads + ps->off[i], grads + ps->off[i], buf + ps->own_off[j],
                                          ps->numel[i]);
        }
        float *meta = set_meta(ps, set, w);
        for (int k = 0; k < ps->P; k++) { /* the loss rank's share, the others' 0 */
            loss += meta[2 * k];
            stop_req |= meta[2 * k + 1] > 0;
        }
        first = 0;
        stats->bytes_recv += ps->own_floats * sizeof(float) + (size_t)ps->P * 2 * sizeof(float);
    }
    if (ps->nlive < ps->W) {
        float k = (float)ps->W / (float)ps->nlive;
        for (int j = 0; j < ps->nown && !ps->emulate; j++)
            be->ops->scale(be, grads + ps->off[ps->own[j]], k, ps->numel[ps->own[j]]);
        loss *= (double)ps->W / ps->nlive;
    }
    /* ties: both copies get a + b of the summed gradients (as the executor's sync_ties) */
    for (int t = 0; t < ps->nties && !ps->emulate; t++) {
        bg_param_t *a = ps->tie_a[t], *b = ps->tie_b[t];
        be->ops->residual_forward(be, a->grad, a->grad, b->grad, a->numel);
        be->ops->copy(be, b->grad, a->grad, a->numel);
    }
    double limbs[BG__CLIP_LIMBS] = {0}; /* clipping: the exact sum (runtime/clip.h) */
    for (int j = 0; j < ps->nown && !ps->emulate; j++) { /* a tied tensor counted once, as the model's norm does */
        float *g = grads + ps->off[ps->own[j]];
        int second = 0;
        for (int t = 0; t < ps->nties; t++)
            second |= g == ps->tie_b[t]->grad;
        double sq = second ? 0 : be->ops->sumsq(be, g, ps->numel[ps->own[j]]);
        stats->grad_sumsq += sq;
        if (ps->clip > 0 && !second)
            bg__clip_add(limbs, sq);
    }
    if (ps->clip > 0 && !ps->emulate)
        BG_CHECK(server_clip(ps, limbs, stats));
    if (!ps->emulate) /* emulated: the update is free, as the executor's (the weights stay as they are) */
        BG_CHECK(bg_model_optim_step(ps->m, opt, (int)step + 1)); /* the model holds this server's tensors */
    be->ops->synchronize(be);
    double t2 = bg_now();
    /* version step + 1 to every live worker; this step's receives posted again for step + R */
    loss = (double)(float)loss; /* the workers get it as a float: every rank reports the same value */
    ps->sreply[0] = (float)loss;
    ps->sreply[1] = stop_req ? 1.0f : 0.0f;
    float *params = bg_model_params(ps->m);
    for (int w = 0; w < ps->W; w++) {
        if (!ps->live[w])
            continue;
        bg__xfer_t **rq = send_rq(ps, w);
        bg_status_t st = BG_OK;
        for (int j = 0; j < ps->nown && st == BG_OK; j++) {
            int i = ps->own[j];
            st = bg__xsend(ps->stg, ps->comm, worker_rank(ps, w, entry_rank(ps, j)), ps_tag(PS_PULL, i),
                           params + ps->off[i], ps->numel[i] * sizeof(float), &rq[j]);
        }
        for (int k = 0; k < ps->P && st == BG_OK && ps->rank == 0; k++)
            st = host_isend(ps, worker_rank(ps, w, k), ps_tag(PS_PULL, PS_META), ps->sreply, sizeof ps->sreply,
                            &rq[ps->nown + k]);
        if (st == BG_OK) {
            free_reqs(set_rq(ps, set, w), (size_t)entries(ps));
            st = post_set(ps, set, w);
        }
        if (st != BG_OK)
            BG_CHECK(worker_failed(ps, w, step, st));
        if (ps->live[w])
            stats->bytes_sent += ps->own_floats * sizeof(float);
    }
    ps->next_set = (set + 1) % ps->R;
    ps->stopped = stop_req;
    stats->loss = loss;
    stats->stop = stop_req;
    stats->idle_ms = (t1 - t0) * 1e3;
    stats->optim_ms = (t2 - t1) * 1e3;
    stats->live = ps->nlive;
    return BG_OK;
}

/* Server, after a stop: the byes of worker w's ranks (how many steps each
 * pushed), and the pushes beyond the last step received and dropped. */
static bg_status_t drain_worker(bg__ps_t *ps, int w, int64_t steps)
{
    int64_t *pushed = calloc((size_t)ps->P, sizeof(int64_t));
    bg__xfer_t **rq = calloc((size_t)ps->P, sizeof(void *));
    bg_status_t st = pushed && rq ? BG_OK : bg_error(BG_ERR_NOMEM, "parameter server byes");
    for (int k = 0; k < ps->P && st == BG_OK; k++)
        st = host_irecv(ps, worker_rank(ps, w, k), ps_tag(PS_CTRL, PS_BYE), &pushed[k], sizeof pushed[k], &rq[k]);
    for (int k = 0; k < ps->P && st == BG_OK; k++)
        st = bg__ps_wait(ps, rq[k], w);
    free_reqs(rq, rq ? (size_t)ps->P : 0);
    free(rq);
    if (st != BG_OK && pushed) {
        free(pushed);
        return worker_failed(ps, w, steps - 1, st);
    }
    for (int j = 0; st == BG_OK && j < entries(ps) && ps->live[w]; j++)
        for (int64_t k = 0; k < pushed[entry_rank(ps, j)] - steps && k < ps->R && ps->live[w]; k++) {
            bg__xfer_t **set = set_rq(ps, (int)((ps->next_set + k) % ps->R), w);
            bg_status_t s2 = bg__ps_wait(ps, set[j], w);
            if (s2 != BG_OK)
                st = worker_failed(ps, w, steps - 1, s2);
        }
    free(pushed);
    return st;
}

bg_status_t bg__ps_settle(bg__ps_t *ps, int64_t steps)
{
    if (ps->server) {
        for (int w = 0; w < ps->W; w++) {
            BG_CHECK(wait_sends(ps, w, steps - 1));
            if (ps->stopped && ps->live[w])
                BG_CHECK(drain_worker(ps, w, steps));
        }
        return BG_OK;
    }
    return bg__ps_worker_settle(ps, steps);
}

bg_status_t bg__ps_save_checkpoint(bg__ps_t *ps, const bg_checkpoint_params_t *base)
{
    if (!ps->server)
        return BG_OK;
    bg_checkpoint_params_t p = *base;
    char token[64] = "";
    p.comm = NULL; /* the servers alone: a worker may have died */
    p.rank = ps->rank;
    p.world = ps->S;
    p.writer = 1;
    p.models = &ps->m;
    p.nmodels = 1;
    if (ps->S == 1)
        return bg_checkpoint_save(&p);
    p.token = token;
    if (ps->rank == 0) { /* server 0 names the directory, the others write, then server 0 writes and publishes */
        snprintf(token, sizeof token, "ps-%d-%lld", (int)getpid(), (long long)(bg_now() * 1e6));
        for (int s = 1; s < ps->S; s++)
            BG_CHECK(bg_send(ps->comm, s, ps_tag(PS_GATHER, 0), token, sizeof token));
        int bad = -1;
        for (int s = 1; s < ps->S; s++) {
            int32_t r = 0;
            BG_CHECK(bg_recv(ps->comm, s, ps_tag(PS_GATHER, 1), &r, sizeof r));
            if (r != BG_OK && bad < 0)
                bad = s;
        }
        if (bad >= 0)
            return bg_error(BG_ERR_IO, "checkpoint of step %lld not saved: parameter server %d could not write its "
                            "file (it says why)", (long long)p.step, bad);
        return bg_checkpoint_save(&p);
    }
    BG_CHECK(bg_recv(ps->comm, 0, ps_tag(PS_GATHER, 0), token, sizeof token));
    token[sizeof token - 1] = 0;
    bg_status_t st = bg_checkpoint_save(&p);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st != BG_OK ? bg_last_error() : "");
    int32_t r = st;
    bg_status_t s2 = bg_send(ps->comm, 0, ps_tag(PS_GATHER, 1), &r, sizeof r);
    return st != BG_OK ? bg_error(st, "%s", msg) : s2;
}
