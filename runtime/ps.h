/* runtime/ps.h: the parameter-server mode of the executor (--ps S
 * --staleness K); see runtime/ps.c and docs/parameter_server.md. Internal to
 * runtime/. */
#ifndef BG_RUNTIME_PS_H
#define BG_RUNTIME_PS_H

#include <stdint.h>

#include "brigade/backend.h"
#include "brigade/checkpoint.h"
#include "brigade/executor.h"
#include "brigade/model.h"
#include "brigade/transport.h"
#include "schedule/layout.h"
#include "runtime/staging.h"

typedef struct bg__ps bg__ps_t;

/* What one step did on this rank (the metrics' parameter-server fields). */
typedef struct bg__ps_stats {
    int staleness;       /* worker: step - version of the parameters it computed on */
    double loss;         /* server: the global batch's mean loss over the live workers;
                            worker (K = 0): the same, from server 0 */
    int stop;            /* a worker or this server asked to stop (as known here) */
    uint64_t bytes_sent; /* this step's point-to-point bytes: pushes / parameters sent */
    uint64_t bytes_recv; /* gradients (server) or parameters (worker) received */
    double optim_ms;     /* server: the sum over workers and the optimizer */
    double idle_ms;      /* server: waiting for the workers' pushes */
    int live;            /* workers alive (as this rank knows) */
    double grad_sumsq;   /* server: sum of squares of its tensors' summed gradients */
} bg__ps_stats_t;

/* The executor's parameters as --ps needs them (before connecting): one
 * line naming the flags. */
bg_status_t bg__ps_check_params(const bg_executor_params_t *p);

/* What bg__ps_create needs. Worker w of W is the pipeline of ranks
 * servers + w*pp .. servers + w*pp + pp - 1 (pipeline rank k: servers +
 * w*pp + k). */
typedef struct bg__ps_params {
    bg_comm_t *comm;
    bg_backend_t *be;
    bg__staging_t *stg;   /* the executor's: every transfer of backend memory goes through it */
    int emulate;          /* --emulate: waits sleep, a server's update is free */
    const bg_model_desc_t *desc;
    bg_model_t **models;  /* this rank's: a worker's chunks (its stages), a server's one model of
                             its tensors, with their optimizer state (bg__ps_owned,
                             bg_model_create_tensors) */
    int nmodels;
    int servers, staleness;
    int pp;               /* ranks per worker pipeline (1: a worker is one rank) */
    const int *holder;    /* per tensor of desc: the pipeline rank that holds it (every rank
                             computes the same from the schedule); NULL: pp = 1 */
    int loss_rank;        /* the pipeline rank holding the loss layer (the last stage) */
    const bg_layout_t *layout; /* the executor's rank layout (kept, not owned) */
    double clip;          /* bg_executor_params_t.clip_grad: the servers clip (0: no) */
} bg__ps_params_t;

/* This rank's part: ranks 0 .. servers-1 are servers, the others workers.
 * Every rank computes the same tensor map (largest first, to the least
 * loaded server). A server posts the receives of its first K + 1 steps. */
bg_status_t bg__ps_create(const bg__ps_params_t *p, bg__ps_t **ps_p);
void bg__ps_destroy(bg__ps_t *ps);
/* After a resume: the parameters are version @p step everywhere. */
void bg__ps_set_version(bg__ps_t *ps, int64_t step);

/* Server: step @p step: the pushes of every live worker (in worker order),
 * the update of this server's tensors, their new version sent to every
 * live worker. A dead worker is dropped (logged, counted). The step stops
 * the job when a live worker's push says so (every server sees the same
 * pushes, so all agree; a server's own stop request is not consulted), and
 * the workers learn it with the new version. */
bg_status_t bg__ps_server_step(bg__ps_t *ps, const bg_optim_config_t *opt, int64_t step, bg__ps_stats_t *stats);
/* Worker, before step @p step: parameters of version >= step - K in place. */
bg_status_t bg__ps_worker_begin(bg__ps_t *ps, int64_t step);
/* Worker: push the tensors within floats [off, off + count) of chunk @p
 * chunk's flat gradient buffer (models[chunk]) that are not pushed yet this
 * step. */
bg_status_t bg__ps_push_range(bg__ps_t *ps, int chunk, size_t off, size_t count);
/* Worker, after the backward of step @p step: push what is left and the
 * step's loss share and stop flag (every rank of the pipeline: the loss
 * rank's share, the others' 0); K = 0: receive version step + 1 and server
 * 0's global loss and stop decision; K > 0: the loss rank tells the other
 * ranks of its pipeline its loss and whether the pipeline stops, so they
 * all stop after the same step. stats->loss: the global batch's mean (K =
 * 0) or the worker's own sequences' mean (K > 0). */
bg_status_t bg__ps_worker_end(bg__ps_t *ps, int64_t step, double loss_share, int stop_req, bg__ps_stats_t *stats);
/* Worker: receive every version up to @p steps (the servers have sent them);
 * server: wait for its sends. Before saving, at the end. */
bg_status_t bg__ps_settle(bg__ps_t *ps, int64_t steps);
/* Servers only (collective over them; workers: nothing): every server
 * writes its tensors (weights and optimizer state) as rank `server` of a
 * job of S ranks, server 0 last, which publishes the checkpoint (full named
 * tensors, loadable under any layout). @p base: root, step, extra, keep. */
bg_status_t bg__ps_save_checkpoint(bg__ps_t *ps, const bg_checkpoint_params_t *base);
/* The tensors server @p server of @p servers holds (1 per tensor of the
 * description, malloc'ed): for bg_model_create_tensors. */
bg_status_t bg__ps_owned(const bg_model_desc_t *d, int servers, int server, unsigned char **which_p);

#endif
