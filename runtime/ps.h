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

/* This rank's part: ranks 0 .. servers-1 are servers, the others workers.
 * @p m is the rank's model: a worker's of every layer (it computes with it), a
 * server's of its tensors only, with their optimizer state allocated:
 * bg__ps_owned, bg_model_create_tensors). Every rank
 * computes the same tensor map (largest first, to the least loaded server).
 * A server posts the receives of its first K + 1 steps. */
bg_status_t bg__ps_create(bg_comm_t *comm, bg_backend_t *be, bg_model_t *m, int servers, int staleness,
                          bg__ps_t **ps_p);
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
/* Worker: push the tensors within floats [off, off + count) of the flat
 * gradient buffer that are not pushed yet this step. */
bg_status_t bg__ps_push_range(bg__ps_t *ps, size_t off, size_t count);
/* Worker, after the backward of step @p step: push what is left and the
 * step's loss share and stop flag; K = 0: receive version step + 1. */
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
