/* runtime/ps_impl.h: the parameter-server mode's private body, shared by
 * its server side (runtime/ps.c: the tensor map, creation, the servers'
 * step, the stop, checkpoints) and its worker side (runtime/ps_worker.c:
 * pulls, pushes, the pipeline's agreement on the loss and the stop). The
 * message tags and the protocol are described in runtime/ps.c. Nothing
 * outside those two files includes it. */
#ifndef BG_RUNTIME_PS_IMPL_H
#define BG_RUNTIME_PS_IMPL_H

#include "core/check.h"
#include "runtime/ps.h"

enum { PS_PUSH = 0, PS_PULL = 1, PS_GATHER = 2, PS_CTRL = 3 };
enum { PS_BYE = 0, PS_PIPE = 1 }; /* PS_CTRL messages */
#define PS_META 0xffff

static inline uint32_t ps_tag(int kind, int idx)
{
    return ((uint32_t)kind << 30) | (0x3ffeu << 16) | ((uint32_t)idx & 0xffffu);
}

struct bg__ps {
    bg_comm_t *comm;
    bg_backend_t *be;
    bg__staging_t *stg;     /* every transfer goes through it (staged where buffers are device memory) */
    int emulate;            /* --emulate: waits sleep; a server's update is free (no sum, no optimizer) */
    bg_model_t **models;    /* worker: its chunks; server: models[0], its tensors */
    int nmodels;
    int S, W, K, P;         /* servers, workers (at the start), staleness bound, ranks per worker */
    double clip;            /* --clip-grad: the servers clip by the whole model's norm (0: no) */
    const bg_layout_t *layout; /* the executor's: every world rank comes from it */
    int rank, server;       /* this rank; 1: a server */
    int wk, pk;             /* worker: its index and its rank in the pipeline */
    int loss_rank;          /* the pipeline rank holding the loss */
    int n;                  /* tensors */
    int *owner;             /* per tensor: its server */
    int *holder;            /* per tensor: the pipeline rank holding it */
    size_t *off, *numel;    /* per tensor: floats into the flat buffers (worker: of its chunk), size */
    int64_t version;        /* worker: version of the parameters in the model */
    /* ---- worker */
    int *chunk;             /* per tensor: the chunk holding it here, -1: another rank's */
    size_t *back_off;       /* per tensor held here: floats into back */
    size_t local_floats;    /* the tensors held here */
    unsigned char *pushed;  /* per tensor, this step */
    bg__xfer_t **push_rq;   /* per tensor */
    bg__xfer_t **meta_rq;   /* per server: the step's loss share and stop flag */
    float meta[2];
    float *back;            /* K > 0: the version being received */
    bg__xfer_t **pull_rq;   /* per tensor */
    bg__xfer_t *reply_rq;   /* server 0's loss and stop */
    float reply[2];
    double pipe[2];         /* K > 0: the loss rank's loss and stop, for the pipeline */
    int64_t pulling;        /* version being received, 0: none */
    int64_t last;           /* the servers' last version (they stopped after it), -1: not known */
    int pipe_stop;          /* K > 0: the loss rank said the pipeline stops */
    int64_t pushed_steps;   /* steps whose gradients were pushed */
    int64_t bye;            /* after a stop: pushed_steps, told every server */
    uint64_t bytes_recv;
    /* ---- server */
    bg_model_t *m;          /* its tensors */
    int nown;               /* tensors it holds */
    int *own;               /* their indices */
    size_t *own_off;        /* floats into one worker's receive buffer */
    size_t own_floats;
    int R;                  /* receive sets: K + 1 */
    int next_set;           /* the set of the next step */
    float *recv;            /* R x W x own_floats */
    float *recv_meta;       /* R x W x P x 2 */
    bg__xfer_t **rrq;       /* R x W x (nown + P): its tensors, then each pipeline rank's loss and stop */
    bg__xfer_t **srq;       /* W x (nown + P): the version sent, and server 0's reply to each pipeline rank */
    float sreply[2];
    int *live;              /* per worker */
    int nlive;
    int stopped;            /* the last step stopped the job */
    bg_param_t **tie_a, **tie_b; /* each tie this server holds (both tensors) */
    int nties;
};

/* World rank of pipeline rank k of worker w. */
static inline int worker_rank(const bg__ps_t *ps, int w, int k) { return bg__layout_rank(ps->layout, k, w, 0, 0); }
/* A server's requests per worker and step: its tensors, then each pipeline rank's loss and stop. */
static inline int entries(const bg__ps_t *ps) { return ps->nown + ps->P; }
/* The pipeline rank that sends entry j of a worker's requests. */
static inline int entry_rank(const bg__ps_t *ps, int j) { return j < ps->nown ? ps->holder[ps->own[j]] : j - ps->nown; }

/* Transfers of host memory (the loss and stop flags, the byes): the
 * transport's request, wrapped so that every wait below takes one kind. */
static inline bg_status_t host_isend(bg__ps_t *ps, int peer, uint32_t tag, const void *buf, size_t bytes, bg__xfer_t **x_p)
{
    bg_request_t *rq = NULL;
    BG_CHECK(bg_isend(ps->comm, peer, tag, buf, bytes, &rq));
    return bg__xwrap(ps->stg, rq, x_p);
}
static inline bg_status_t host_irecv(bg__ps_t *ps, int peer, uint32_t tag, void *buf, size_t bytes, bg__xfer_t **x_p)
{
    bg_request_t *rq = NULL;
    BG_CHECK(bg_irecv(ps->comm, peer, tag, buf, bytes, &rq));
    return bg__xwrap(ps->stg, rq, x_p);
}


static inline void free_reqs(bg__xfer_t **rq, size_t n)
{
    for (size_t i = 0; rq && i < n; i++) {
        bg__xfree(rq[i]);
        rq[i] = NULL;
    }
}

/* Wait for a request with a rank of worker w (runtime/ps.c): fails naming
 * the dead rank, or on BRIGADE_TIMEOUT. */
bg_status_t bg__ps_wait(bg__ps_t *ps, bg__xfer_t *rq, int w);
/* The first rank of worker w's pipeline known dead, -1: none. */
int bg__ps_dead_rank(bg__ps_t *ps, int w);
/* The worker's part of bg__ps_settle (runtime/ps_worker.c). */
bg_status_t bg__ps_worker_settle(bg__ps_t *ps, int64_t steps);

#endif
