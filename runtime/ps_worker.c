/* runtime/ps_worker.c: the parameter-server mode's worker side (see
 * runtime/ps.c for the protocol): a worker pulls versions of the
 * parameters it holds (K = 0: the next one before its step; K > 0: in the
 * background, at most K behind), pushes each bucket's tensors to their
 * servers as the backward finishes them, and at the step's end pushes what
 * is left with its loss share and stop flag; a pipelined worker's ranks
 * agree on the loss and the stop. Must not: run compute, touch the servers'
 * state. */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/ps_impl.h"

static bg_status_t server_error(bg__ps_t *ps, int s, bg_status_t st, const char *what)
{
    return bg_error(st, "%s parameter server %d (rank %d)%s: %s", what, s, s,
                    bg_comm_peer_alive(ps->comm, s) ? "" : " (it died; its tensors are gone)", bg_last_error());
}

/* Tensor i held here: its parameters and gradient. */
static float *local_param(bg__ps_t *ps, int i) { return bg_model_params(ps->models[ps->chunk[i]]) + ps->off[i]; }
static float *local_grad(bg__ps_t *ps, int i) { return bg_model_grads(ps->models[ps->chunk[i]]) + ps->off[i]; }

/* Start receiving version ps->version + 1 of the tensors held here (K = 0:
 * into the model) and server 0's loss and stop. */
static bg_status_t post_pull(bg__ps_t *ps)
{
    ps->pulling = ps->version + 1;
    for (int i = 0; i < ps->n; i++) {
        if (ps->chunk[i] < 0)
            continue;
        float *dst = ps->back ? ps->back + ps->back_off[i] : local_param(ps, i);
        bg_status_t st = bg__xrecv(ps->stg, ps->comm, ps->owner[i], ps_tag(PS_PULL, i), dst,
                                   ps->numel[i] * sizeof(float), &ps->pull_rq[i]);
        if (st != BG_OK)
            return server_error(ps, ps->owner[i], st, "pulling from");
    }
    bg_status_t st = host_irecv(ps, 0, ps_tag(PS_PULL, PS_META), ps->reply, sizeof ps->reply, &ps->reply_rq);
    return st == BG_OK ? BG_OK : server_error(ps, 0, st, "pulling from");
}

/* The pull in flight: *done_p = 1 once every tensor has arrived (wait: block). */
static bg_status_t pull_done(bg__ps_t *ps, int wait, int *done_p)
{
    *done_p = 0;
    for (int i = 0; i <= ps->n; i++) {
        bg__xfer_t **rq = i < ps->n ? &ps->pull_rq[i] : &ps->reply_rq;
        if (!*rq)
            continue;
        int done = 1;
        bg_status_t st = wait ? bg__ps_wait(ps, *rq, ps->wk) : bg__xtest(*rq, &done);
        if (st != BG_OK)
            return server_error(ps, i < ps->n ? ps->owner[i] : 0, st, "pulling from");
        if (!done)
            return BG_OK;
        bg__xfree(*rq);
        *rq = NULL;
    }
    /* every piece is in: the new version */
    for (int i = 0; ps->back && i < ps->n; i++)
        if (ps->chunk[i] >= 0)
            ps->be->ops->copy(ps->be, local_param(ps, i), ps->back + ps->back_off[i], ps->numel[i]);
    ps->version = ps->pulling;
    ps->pulling = 0;
    if (ps->reply[1] > 0) /* the servers stop after this version */
        ps->last = ps->version;
    ps->bytes_recv += ps->local_floats * sizeof(float);
    *done_p = 1;
    return BG_OK;
}

static bg_status_t wait_pushes(bg__ps_t *ps)
{
    for (int i = 0; i < ps->n; i++)
        if (ps->push_rq[i]) {
            bg_status_t st = bg__ps_wait(ps, ps->push_rq[i], ps->wk);
            bg__xfree(ps->push_rq[i]);
            ps->push_rq[i] = NULL;
            if (st != BG_OK)
                return server_error(ps, ps->owner[i], st, "pushing to");
        }
    for (int s = 0; s < ps->S; s++)
        if (ps->meta_rq[s]) {
            bg_status_t st = bg__ps_wait(ps, ps->meta_rq[s], ps->wk);
            bg__xfree(ps->meta_rq[s]);
            ps->meta_rq[s] = NULL;
            if (st != BG_OK)
                return server_error(ps, s, st, "pushing to");
        }
    return BG_OK;
}

/* *done_p = 1 once the last step's pushes are sent (failures name the server). */
static bg_status_t test_pushes(bg__ps_t *ps, int *done_p)
{
    *done_p = 1;
    for (int i = 0; i < ps->n + ps->S; i++) {
        bg__xfer_t **rq = i < ps->n ? &ps->push_rq[i] : &ps->meta_rq[i - ps->n];
        if (!*rq)
            continue;
        int done = 0;
        bg_status_t st = bg__xtest(*rq, &done);
        if (st != BG_OK)
            return server_error(ps, i < ps->n ? ps->owner[i] : i - ps->n, st, "pushing to");
        if (!done) {
            *done_p = 0;
            continue;
        }
        bg__xfree(*rq);
        *rq = NULL;
    }
    return BG_OK;
}

bg_status_t bg__ps_worker_begin(bg__ps_t *ps, int64_t step)
{
    /* The last step's pushes must be sent (they read the gradients, which
     * this step zeroes) and the parameters be recent enough. Pulls that have
     * arrived are taken meanwhile: once one says the servers stopped, no
     * newer version comes, and the pushes of this worker still have
     * receives posted (a worker runs at most K steps past the servers' last
     * version, they keep K + 1 steps posted), so they are waited for. */
    double deadline = bg_now() + bg_comm_timeout(ps->comm);
    for (;;) {
        int done = 0, pushed = 0;
        if (!ps->pulling && ps->version < step && ps->last < 0)
            BG_CHECK(post_pull(ps));
        if (ps->pulling) {
            BG_CHECK(pull_done(ps, 0, &done));
            if (done)
                continue;
        }
        if (ps->last >= 0) {
            BG_CHECK(wait_pushes(ps));
            break;
        }
        BG_CHECK(test_pushes(ps, &pushed));
        if (pushed && ps->version >= step - ps->K)
            break;
        if (pushed) { /* too stale: wait for the version in flight */
            BG_CHECK(pull_done(ps, 1, &done));
            continue;
        }
        int dr = ps->P > 1 ? bg__ps_dead_rank(ps, ps->wk) : -1;
        if (dr >= 0)
            return bg_error(BG_ERR_PEER, "rank %d of this worker's pipeline died", dr);
        if (bg_now() > deadline)
            return bg_error(BG_ERR_TIMEOUT, "worker (rank %d): the pushes of step %lld were not received within %g s "
                            "(BRIGADE_TIMEOUT)", ps->rank, (long long)step, bg_comm_timeout(ps->comm));
        if (ps->emulate) { /* sleep, not spin: the ranks outnumber the cores */
            struct timespec t = {0, 20000};
            nanosleep(&t, NULL);
        } else {
            sched_yield();
        }
    }
    memset(ps->pushed, 0, (size_t)ps->n);
    return BG_OK;
}

bg_status_t bg__ps_push_range(bg__ps_t *ps, int chunk, size_t off, size_t count)
{
    for (int i = 0; i < ps->n; i++) {
        if (ps->pushed[i] || ps->chunk[i] != chunk || ps->off[i] < off || ps->off[i] + ps->numel[i] > off + count)
            continue;
        ps->pushed[i] = 1;
        bg_status_t st = bg__xsend(ps->stg, ps->comm, ps->owner[i], ps_tag(PS_PUSH, i), local_grad(ps, i),
                                   ps->numel[i] * sizeof(float), &ps->push_rq[i]);
        if (st != BG_OK)
            return server_error(ps, ps->owner[i], st, "pushing to");
    }
    return BG_OK;
}

/* K > 0, a pipelined worker: the loss rank tells the others its loss share
 * and whether the pipeline stops after this step (it saw the servers' last
 * version), so every rank of the pipeline runs the same steps. */
/* A blocking send (send = 1) or receive of host memory with another rank of
 * this worker's pipeline, waited for as every wait of the mode (watching the
 * pipeline; sleeping when emulated). */
static bg_status_t pipe_xfer(bg__ps_t *ps, int send, int peer, uint32_t tag, void *buf, size_t bytes)
{
    bg__xfer_t *x = NULL;
    BG_CHECK(send ? host_isend(ps, peer, tag, buf, bytes, &x) : host_irecv(ps, peer, tag, buf, bytes, &x));
    bg_status_t st = bg__ps_wait(ps, x, ps->wk);
    bg__xfree(x);
    return st;
}

static bg_status_t pipe_agree(bg__ps_t *ps, double *loss_p, int *stop_p)
{
    uint32_t tag = ps_tag(PS_CTRL, PS_PIPE);
    int lr = worker_rank(ps, ps->wk, ps->loss_rank);
    if (ps->pk == ps->loss_rank) {
        ps->pipe[0] = *loss_p;
        ps->pipe[1] = *stop_p;
        for (int k = 0; k < ps->P; k++) {
            bg_status_t st = k == ps->pk ? BG_OK : pipe_xfer(ps, 1, worker_rank(ps, ps->wk, k), tag, ps->pipe,
                                                             sizeof ps->pipe);
            if (st != BG_OK)
                return bg_error(st, "telling rank %d of this worker's pipeline the step's loss: %s",
                                worker_rank(ps, ps->wk, k), bg_last_error());
        }
    } else {
        bg_status_t st = pipe_xfer(ps, 0, lr, tag, ps->pipe, sizeof ps->pipe);
        if (st != BG_OK)
            return bg_error(st, "the step's loss from rank %d (this worker's last stage): %s", lr, bg_last_error());
        *loss_p = ps->pipe[0];
        *stop_p = ps->pipe[1] > 0;
    }
    ps->pipe_stop = *stop_p;
    return BG_OK;
}

bg_status_t bg__ps_worker_end(bg__ps_t *ps, int64_t step, double loss_share, int stop_req, bg__ps_stats_t *stats)
{
    memset(stats, 0, sizeof(*stats));
    stats->staleness = (int)(step - ps->version);
    ps->be->ops->synchronize(ps->be);
    for (int v = 0; v < ps->nmodels; v++)
        BG_CHECK(bg__ps_push_range(ps, v, 0, bg_model_param_count(ps->models[v])));
    ps->meta[0] = (float)loss_share; /* 0 but on the loss rank */
    ps->meta[1] = stop_req ? 1.0f : 0.0f;
    for (int s = 0; s < ps->S; s++) {
        bg_status_t st = host_isend(ps, s, ps_tag(PS_PUSH, PS_META), ps->meta, sizeof ps->meta, &ps->meta_rq[s]);
        if (st != BG_OK)
            return server_error(ps, s, st, "pushing to");
    }
    stats->bytes_sent = ps->local_floats * sizeof(float);
    ps->pushed_steps = step + 1;
    if (ps->K == 0) { /* synchronous: version step + 1 before the next step (and its loss) */
        int done = 0;
        BG_CHECK(post_pull(ps));
        BG_CHECK(pull_done(ps, 1, &done));
        stats->loss = ps->reply[0];
        stats->stop = ps->reply[1] > 0;
    } else {
        if (!ps->pulling && ps->last < 0)
            BG_CHECK(post_pull(ps));
        int stop = ps->last >= 0;
        if (ps->P > 1)
            BG_CHECK(pipe_agree(ps, &loss_share, &stop));
        stats->loss = loss_share * ps->W; /* this worker's own sequences */
        stats->stop = stop;
    }
    stats->bytes_recv = ps->bytes_recv; /* since the last step's end */
    ps->bytes_recv = 0;
    return BG_OK;
}

/* After the last step: a stopped worker tells the servers what to drain
 * and waits for its pushes; otherwise it receives every version up to
 * @p steps. */
bg_status_t bg__ps_worker_settle(bg__ps_t *ps, int64_t steps)
{
    /* K > 0: the loss rank saw the servers' last version first; it comes here too */
    while (ps->pipe_stop && ps->last < 0) {
        int done = 0;
        if (!ps->pulling)
            BG_CHECK(post_pull(ps));
        BG_CHECK(pull_done(ps, 1, &done));
    }
    if (ps->last >= 0) { /* stopped: tell the servers what to drain, then the pushes complete */
        ps->bye = ps->pushed_steps;
        bg__xfer_t **rq = calloc((size_t)ps->S, sizeof(void *));
        BG_ALLOC_CHECK(rq, (size_t)ps->S * sizeof(void *), "parameter server bye");
        bg_status_t st = BG_OK;
        for (int s = 0; s < ps->S && st == BG_OK; s++)
            if ((st = host_isend(ps, s, ps_tag(PS_CTRL, PS_BYE), &ps->bye, sizeof ps->bye, &rq[s])) != BG_OK)
                st = server_error(ps, s, st, "leaving");
        if (st == BG_OK)
            st = wait_pushes(ps);
        for (int s = 0; s < ps->S; s++) {
            bg_status_t s2 = rq[s] ? bg__ps_wait(ps, rq[s], ps->wk) : BG_OK;
            if (st == BG_OK && s2 != BG_OK)
                st = server_error(ps, s, s2, "leaving");
        }
        free_reqs(rq, (size_t)ps->S);
        free(rq);
        return st;
    }
    BG_CHECK(wait_pushes(ps));
    while (ps->version < steps) {
        int done = 0;
        if (!ps->pulling)
            BG_CHECK(post_pull(ps));
        BG_CHECK(pull_done(ps, 1, &done));
    }
    return BG_OK;
}
