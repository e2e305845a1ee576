/* runtime/strat_ps.c: the parameter-server strategies (--ps S, --staleness
 * K; docs/parameter_server.md): one for the servers (ranks 0 .. S-1: each
 * holds whole tensors and their optimizer state, runs no program: its step
 * is the workers' pushes, the sum and the update) and one for the workers
 * (each a replica: its buckets are pushed instead of reduced, the update is
 * the servers', parameters are pulled at the step's start and end). The
 * protocol is runtime/ps.c's; this file plugs it into the executor's hooks
 * and must not touch the interpreter's slots. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/check.h"
#include "runtime/exec_impl.h"
#include "runtime/ps.h"

typedef struct ps_state {
    bg__ps_t *ps;        /* this rank's part (runtime/ps.c) */
    bg_model_t **models; /* the chunks' models, as the parameter-server part sees them */
} ps_state_t;

static int server_active(const exec_t *x) { return x->lay.me.role == BG_LAYOUT_SERVER; }
static int worker_active(const exec_t *x) { return x->lay.servers > 0 && x->lay.me.role == BG_LAYOUT_WORKER; }

/* The batch over the layout's workers (each a replica); a server holds one
 * model of its tensors, whatever the workers' chunks. */
static bg_status_t ps_setup(exec_t *x, void **self_p)
{
    int W = x->lay.dp;
    if (x->p.batch % (W * x->M) != 0)
        return bg_error(BG_ERR_INVALID, "batch %d does not split into %d workers x %d equal microbatches",
                        x->p.batch, W, x->M);
    x->mbn = x->p.batch / (W * x->M);
    if (x->lay.me.role == BG_LAYOUT_SERVER)
        x->V = 1;
    ps_state_t *P = calloc(1, sizeof(*P));
    BG_ALLOC_CHECK(P, sizeof(*P), "parameter server state");
    *self_p = P;
    return BG_OK;
}

/* A server's chunk: its tensors' parameters and optimizer state, no stage. */
static bg_status_t server_chunk_model(exec_t *x, void *self, chunk_t *ch)
{
    (void)self;
    unsigned char *which = NULL;
    BG_CHECK(bg__ps_owned(x->desc, x->lay.servers, x->lay.rank, &which));
    bg_status_t st = bg_model_create_tensors(x->desc, x->be, which, &ch->model);
    free(which);
    BG_CHECK(st);
    x->params += bg_model_param_count(ch->model);
    return bg_model_optim_init(ch->model, x->p.optim.kind);
}

/* A worker holds no optimizer state (the servers update). */
static bg_status_t worker_chunk_optim(exec_t *x, void *self, chunk_t *ch)
{
    (void)x, (void)self, (void)ch;
    return BG_OK;
}

/* --ps: this rank's part, with the pipeline rank holding each tensor (from
 * the schedule's stage placement: every rank computes the same). */
static bg_status_t ps_ready(exec_t *x, void *self)
{
    ps_state_t *P = self;
    int n = bg_model_desc_num_tensors(x->desc);
    int *holder = calloc((size_t)n + 1, sizeof(int));
    bg_model_t **models = NULL;
    BG_ALLOC_CHECK(holder, ((size_t)n + 1) * sizeof(int), "parameter server tensor placement");
    bg_status_t st = bg__exec_chunk_models(x, &models);
    for (int i = 0; st == BG_OK && i < n; i++) {
        char name[2 * BG_NAME_MAX];
        size_t numel;
        st = bg_model_desc_tensor(x->desc, i, name, sizeof name, &numel);
        int layer = st == BG_OK ? bg_model_desc_tensor_layer(x->desc, name) : 0, stage = 0;
        while (stage < x->S - 1 && x->last[stage] < layer)
            stage++;
        holder[i] = bg__layout_stage_pp(&x->lay, stage);
    }
    bg__ps_params_t pp = {.comm = x->comm, .be = x->be, .stg = &x->stg, .emulate = x->em != NULL, .desc = x->desc,
                          .models = models, .nmodels = x->V, .servers = x->lay.servers, .staleness = x->p.staleness,
                          .pp = x->lay.pp, .holder = holder, .loss_rank = bg__layout_stage_pp(&x->lay, x->S - 1),
                          .layout = &x->lay};
    if (st == BG_OK)
        st = bg__ps_create(&pp, &P->ps);
    free(holder);
    if (st != BG_OK)
        free(models);
    else
        P->models = models;
    return st;
}

/* A bucket is ready: push its tensors to their servers (a tie's a + b is the server's). */
static bg_status_t worker_reduce(exec_t *x, void *self, chunk_t *ch, int b)
{
    ps_state_t *P = self;
    return bg__ps_push_range(P->ps, (int)(ch - x->chunks), ch->buckets[b].off, ch->buckets[b].count);
}

/* The servers update (bg__ps_worker_end pushes what is left): wait for the pushes. */
static bg_status_t worker_optimizer(exec_t *x, void *self, chunk_t *ch)
{
    (void)self;
    return bg__exec_wait_buckets(x, ch);
}

/* Parameters recent enough before the step (and the last pushes gone). */
static bg_status_t worker_step_begin(exec_t *x, void *self)
{
    ps_state_t *P = self;
    double t0 = bg_now();
    bg_status_t st = bg__ps_worker_begin(P->ps, x->step);
    if (st != BG_OK)
        return bg_error(st, "worker %d (rank %d) at step %lld: %s", x->lay.me.dp, x->lay.rank,
                        (long long)x->step + 1, bg_last_error());
    if (x->trace) /* waiting for parameters recent enough (and for the last pushes to leave) */
        bg__trace_event(x->trace, "pull_wait", -1, 0, t0, bg_now(), (int)x->step + 1);
    return BG_OK;
}

/* --ps, a worker, after its program: push what is left and the loss share;
 * K = 0: receive the next version (and the step's loss) first. */
static bg_status_t worker_step_end(exec_t *x, void *self, double t0, double tokens, bg_step_result_t *result_p)
{
    ps_state_t *P = self;
    int64_t step = x->step;
    bg__ps_stats_t ps;
    double a = bg_now();
    bg_status_t st = bg__ps_worker_end(P->ps, step, x->loss, x->stop_req, &ps);
    if (x->trace) /* the last pushes and, at K = 0, the wait for the next version */
        bg__trace_event(x->trace, "push_pull", -1, 0, a, bg_now(), (int)step + 1);
    if (st != BG_OK) {
        st = bg_error(st, "worker %d (rank %d) at step %lld: %s", x->lay.me.dp, x->lay.rank, (long long)step + 1,
                      bg_last_error());
        return bg__exec_step_failed(x, st);
    }
    double dt = bg_now() - t0;
    if (x->trace)
        bg__trace_event(x->trace, "step", -1, -1, t0, t0 + dt, (int)step + 1);
    x->step = step + 1;
    bg_step_result_t r = bg__exec_step_result(x, tokens, dt);
    r.loss = ps.loss; /* K = 0: the global loss (server 0's sum); K > 0: this worker's own batch */
    r.bubble = dt > 0 ? 1.0 - x->busy / dt : 0;
    r.bytes_sent = ps.bytes_sent;
    r.stop = ps.stop;
    r.grad_norm = NAN;
    r.ps_role = 2;
    r.staleness = ps.staleness;
    r.bytes_recv = ps.bytes_recv;
    *result_p = r;
    return BG_OK;
}

/* --ps, a server: the workers' pushes of this step, the update of its tensors, the new version sent. */
static bg_status_t server_step(exec_t *x, void *self, double tokens, bg_step_result_t *result_p)
{
    ps_state_t *P = self;
    int64_t step = x->step;
    bg__ps_stats_t ps;
    double t0 = bg_now();
    bg_status_t st = bg__ps_server_step(P->ps, &x->p.optim, step, &ps);
    if (st != BG_OK) {
        st = bg_error(st, "parameter server %d (rank %d) at step %lld: %s", x->lay.rank, x->lay.rank,
                      (long long)step + 1,
                      bg_last_error());
        return bg__exec_step_failed(x, st);
    }
    double dt = bg_now() - t0;
    if (x->trace) { /* waiting for the workers' pushes, then the sum and the update */
        double w = t0 + ps.idle_ms / 1e3;
        bg__trace_event(x->trace, "push_wait", -1, -1, t0, w, (int)step + 1);
        bg__trace_event(x->trace, "update", -1, -1, w, w + ps.optim_ms / 1e3, (int)step + 1);
        bg__trace_event(x->trace, "step", -1, -1, t0, t0 + dt, (int)step + 1);
    }
    x->step = step + 1;
    bg_step_result_t r = bg__exec_step_result(x, tokens, dt);
    r.loss = ps.loss;
    r.bubble = dt > 0 ? ps.idle_ms / 1e3 / dt : 0;
    r.bytes_sent = ps.bytes_sent;
    r.stop = ps.stop;
    r.grad_norm = sqrt(ps.grad_sumsq);
    r.ps_role = 1;
    r.bytes_recv = ps.bytes_recv;
    r.optim_ms = ps.optim_ms;
    r.idle = r.bubble;
    r.live_workers = ps.live;
    *result_p = r;
    return BG_OK;
}

/* --ps: every server writes its tensors (weights and optimizer state) as a
 * rank of a job of S ranks, server 0 last: full named tensors, the files of
 * any layout. Workers hold nothing to save (worker_save_checkpoint). */
static bg_status_t server_save_checkpoint(exec_t *x, void *self, const char *root, int keep)
{
    ps_state_t *P = self;
    char extra[512];
    snprintf(extra, sizeof(extra),
             "{\"layout\":{\"pp\":%d,\"dp\":%d,\"tp\":1,\"chunks\":%d,\"schedule\":\"%s\",\"ps\":%d,"
             "\"staleness\":%d},\"optimizer\":\"%s\",\"lr\":%g,\"batch\":%d,\"microbatches\":%d}",
             x->lay.pp, x->lay.dp, bg_schedule_chunks(x->sched), bg_schedule_name(x->sched), x->lay.servers,
             x->p.staleness,
             x->p.optim.kind == BG_OPTIM_ADAMW ? "adamw" : "sgd", (double)x->p.optim.lr, x->p.batch, x->M);
    bg_checkpoint_params_t p = BG_CHECKPOINT_PARAMS_INIT;
    p.root = root;
    p.step = x->step;
    p.extra_json = extra;
    p.keep = keep;
    return bg__ps_save_checkpoint(P->ps, &p);
}

static bg_status_t worker_save_checkpoint(exec_t *x, void *self, const char *root, int keep)
{
    (void)x, (void)self, (void)root, (void)keep;
    return BG_OK;
}

/* After a resume the parameters are version step everywhere; a worker holds
 * no optimizer state (the loader allocated it). */
static void ps_state_end(exec_t *x, void *self, int loading, bg_status_t st)
{
    ps_state_t *P = self;
    if (!loading || st != BG_OK)
        return;
    for (int v = 0; x->lay.me.role == BG_LAYOUT_WORKER && v < x->V; v++)
        bg_model_optim_free(x->chunks[v].model);
    bg__ps_set_version(P->ps, x->step);
}

/* The servers write the weights: each its tensors, one file each (one server: the whole model). */
static void server_weights_path(exec_t *x, void *self, int v, const char *dir, char *path, size_t cap)
{
    (void)self, (void)v;
    if (x->lay.servers > 1)
        snprintf(path, cap, "%s/model-ps%03d.safetensors", dir, x->lay.rank);
    else
        snprintf(path, cap, "%s/model.safetensors", dir);
}

static int ps_weights_writers(exec_t *x, void *self)
{
    (void)self;
    return x->lay.servers;
}

static void worker_weights_path(exec_t *x, void *self, int v, const char *dir, char *path, size_t cap)
{
    (void)x, (void)self, (void)v, (void)dir, (void)cap;
    path[0] = 0;
}

/* The last versions are delivered; workers that died are the mode's
 * business, not an unclean end (a server's death still is). */
static void ps_finish(exec_t *x, void *self, int broken)
{
    ps_state_t *P = self;
    if (!broken && bg__ps_settle(P->ps, x->step) != BG_OK)
        bg_log(BG_LOG_WARN, "ps", "rank %d: %s", x->lay.rank, bg_last_error());
    int servers_alive = 1;
    for (int s = 0; s < x->lay.servers; s++)
        servers_alive &= s == x->lay.rank || bg_comm_peer_alive(x->comm, s);
    /* a broken worker (a rank of its pipeline died) leaves as failed, so
     * the rest of its pipeline learns it at once (a bye would not tell them) */
    if (servers_alive && !broken)
        bg_comm_acknowledge_failures(x->comm);
}

static void ps_destroy(exec_t *x, void *self)
{
    (void)x;
    ps_state_t *P = self;
    if (!P)
        return;
    bg__ps_destroy(P->ps); /* first: its requests point into the model */
    free(P->models);
    free(P);
}

const bg__strategy_ops_t bg__strategy_ps_server = {
    .name = "ps-server",
    .active = server_active,
    .setup = ps_setup,
    .chunk_model = server_chunk_model,
    .ready = ps_ready,
    .step = server_step,
    .save_checkpoint = server_save_checkpoint,
    .state_end = ps_state_end,
    .weights_path = server_weights_path,
    .weights_writers = ps_weights_writers,
    .finish = ps_finish,
    .destroy = ps_destroy,
};

const bg__strategy_ops_t bg__strategy_ps_worker = {
    .name = "ps-worker",
    .active = worker_active,
    .setup = ps_setup,
    .chunk_optim = worker_chunk_optim,
    .ready = ps_ready,
    .step_begin = worker_step_begin,
    .reduce = worker_reduce,
    .optimizer = worker_optimizer,
    .step_end = worker_step_end,
    .save_checkpoint = worker_save_checkpoint,
    .state_end = ps_state_end,
    .weights_path = worker_weights_path,
    .weights_writers = ps_weights_writers,
    .finish = ps_finish,
    .destroy = ps_destroy,
};
