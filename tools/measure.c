/* tools/measure.c: time every layer of a model on this machine's backend
 * (`brigade plan --measure`, `brigade profile`): forward, fused backward, the
 * split B and W, and the optimizer step over its parameters; medians of
 * rounds that each time every layer once (at least 15, more while the
 * rounds spread), each timed call starting with half the last-level cache
 * evicted unless everything the ranks touch fits in it. The layers are
 * measured the way the plan runs them: a model
 * built for tensor-parallel degree T by a group of T processes with the
 * group's real collectives (over the transport, on this machine), and with
 * copies of the measurement (whole groups) running beside it for the other
 * ranks that will run on this machine, sharing its cores when they
 * outnumber them. Every measurement runs in child processes; this one only
 * collects their figures. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/measure.h"
#include "core/util.h"

/* ---------------------------------------------------------------- measure */

/* Fill a backend buffer of n floats with small pseudo-random values. */
static void fill_random(bg_backend_t *be, float *dst, size_t n)
{
    float *h = malloc(n * sizeof(float));
    if (!h) {
        be->ops->fill(be, dst, 0.01f, n);
        return;
    }
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        h[i] = ((float)(x >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
    be->ops->from_host(be, dst, h, n * sizeof(float));
    free(h);
}

/* The last-level cache size (sysfs), or 32 MiB when it cannot be read. */
static size_t llc_bytes(void)
{
    size_t kb = 0;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f) {
        if (fscanf(f, "%zuK", &kb) != 1)
            kb = 0;
        fclose(f);
    }
    return kb ? kb * 1024 : (size_t)32 << 20;
}

/* Before each timed call, touch half the last-level cache: in a training step
 * the rest of the stage, the other microbatches and the other ranks sharing
 * that cache run in between, so a layer's weights and inputs are partly
 * evicted. (Measured on GPT and MLP plans: warm caches predict steps 10-40%
 * too fast, a fully flushed cache 25% too slow for small-batch layers; half
 * the LLC lands within 3-15%.) That was one process evicting; the
 * processes measuring at once (a tensor group, the copies beside it) share
 * the cache and evict together, so each touches its share of the half:
 * evict_share of them (set before the first call). evict_share 0: no
 * eviction, when everything the ranks touch fits in the cache (cache_warm). */
static int evict_share = 1;
static void evict_caches(void)
{
    static volatile unsigned char *buf;
    static size_t bytes;
    if (!evict_share)
        return;
    if (!buf) {
        bytes = llc_bytes() / 2 / (size_t)evict_share;
        if (!(buf = malloc(bytes)))
            return;
    }
    for (size_t i = 0; i < bytes; i += 64)
        buf[i] = (unsigned char)(buf[i] + 1);
}


static bg_group_t *measure_barrier; /* the group's members start each timed call together (NULL: one process) */
static bg_tp_group_t *measure_tp;   /* the tensor group (NULL: one process) */

/* Seconds this member has spent in the tensor group's collectives so far
 * (what a trace shows as tp_*). */
static double comm_seconds(void) { return bg_tp_group_seconds(measure_tp); }

/* Wait for the other members of the group (none: at once). */
static bg_status_t together(void) { return measure_barrier ? bg_group_barrier(measure_barrier) : BG_OK; }

/* One member's figures per layer: forward, fused backward, B, W, the
 * optimizer step over the layer's parameters (seconds) and the collectives'
 * share of the forward and the fused backward (kept last: the group takes
 * their mean, the largest of the others). */
enum { FIG_F, FIG_BW, FIG_B, FIG_W, FIG_O, FIG_CF, FIG_CB, NFIG };

/* Rounds: each round times every distinct layer once, in layer order (after
 * one warm-up round), so every layer's samples are spread over the whole
 * measurement and a burst of other work on the machine touches a few rounds
 * of every layer rather than all the samples of one. At least MIN_ROUNDS
 * (or MIN_SLOW rounds once SLOW_S seconds have passed, for big layers; never
 * fewer than MIN_SLOW); while the rounds' totals spread by more than SPREAD
 * (interquartile range over median) the measurement goes on, up to
 * MAX_ROUNDS or MAX_S seconds, and says so when it ends still spread. */
enum { MIN_ROUNDS = 15, MIN_SLOW = 7, MAX_ROUNDS = 61 };
#define SLOW_S 4.0
#define MAX_S 10.0
#define SPREAD 0.10

/* The interquartile range of v[0..n) over its median (sorts a copy). */
static double rel_spread(const double *v, int n)
{
    double s[MAX_ROUNDS];
    memcpy(s, v, (size_t)n * sizeof(double));
    double med = bg_median(s, (size_t)n); /* sorts s */
    return med > 0 ? (s[(3 * (n - 1)) / 4] - s[(n - 1) / 4]) / med : 0.0;
}

/* A distinct layer being measured: its one-layer model and stage, the input shape, its samples. */
typedef struct {
    int layer;
    bg_model_t *m;
    bg_stage_t *stg;
    bg_shape_t in;
    double smp[NFIG][MAX_ROUNDS];
} mlayer_t;

/* Return the status of a call that failed (tools/ use the public API only, not core/check.h). */
#define TRY(call)                                                                                                  \
    do {                                                                                                           \
        bg_status_t st_ = (call);                                                                                  \
        if (st_ != BG_OK)                                                                                          \
            return st_;                                                                                            \
    } while (0)

/* Time one round of layer x (sample r; r < 0: a warm-up, not kept). */
static bg_status_t time_layer(bg_backend_t *be, mlayer_t *x, int L, int tokens, const int32_t *tok, int n, int t,
                              const bg_optim_config_t *oc, int step, int r)
{
    int i = x->layer;
    bg_stage_t *stg = x->stg;
    float *inp = NULL, *out = NULL, *dout = NULL, *din = NULL;
    bg_shape_t os;
    bg_status_t st;
    TRY(bg_stage_begin(stg, 0, x->in, &inp));
    if (inp)
        fill_random(be, inp, bg_shape_numel(x->in));
    if (i == 0 || i == L - 1)
        TRY(bg_stage_set_data(stg, 0, i == 0 && tokens ? tok : NULL, i == L - 1 ? tok : NULL,
                                   1.0f / (float)(n * t)));
    /* in training the other layers of the stage and of the other
     * microbatches run in between: start each call with the caches as they
     * would find them (evict_caches) */
    evict_caches();
    TRY(together());
    double c0 = comm_seconds(), t0 = bg_now();
    st = bg_stage_forward(stg, 0, &out, &os);
    be->ops->synchronize(be);
    double t1 = bg_now(), c1 = comm_seconds();
    if (st == BG_OK && i < L - 1 && (st = bg_stage_grad_buffer(stg, 0, &dout)) == BG_OK)
        fill_random(be, dout, bg_shape_numel(os));
    evict_caches();
    if (st == BG_OK)
        st = together();
    double c2 = comm_seconds(), t2 = bg_now();
    if (st == BG_OK)
        st = bg_stage_backward(stg, 0, &din);
    be->ops->synchronize(be);
    double t3 = bg_now(), c3 = comm_seconds();
    bg_stage_end(stg, 0);
    TRY(st);
    /* the same microbatch again with the backward split into B and W */
    TRY(bg_stage_begin(stg, 0, x->in, &inp));
    if (inp)
        fill_random(be, inp, bg_shape_numel(x->in));
    if (i == 0 || i == L - 1)
        st = bg_stage_set_data(stg, 0, i == 0 && tokens ? tok : NULL, i == L - 1 ? tok : NULL, 1.0f / (float)(n * t));
    if (st == BG_OK)
        st = bg_stage_forward(stg, 0, &out, &os);
    if (st == BG_OK && i < L - 1 && (st = bg_stage_grad_buffer(stg, 0, &dout)) == BG_OK)
        fill_random(be, dout, bg_shape_numel(os));
    evict_caches();
    if (st == BG_OK)
        st = together();
    double t4 = bg_now();
    if (st == BG_OK)
        st = bg_stage_backward_input(stg, 0, &din);
    be->ops->synchronize(be);
    double t5 = bg_now();
    if (st == BG_OK)
        st = bg_stage_backward_weight(stg, 0);
    else
        bg_stage_end(stg, 0);
    be->ops->synchronize(be);
    double t6 = bg_now();
    TRY(st);
    /* the optimizer step as the executor's (runtime/executor.c optimizer_step): each gradient's sum of
     * squares (the norm), then the update of the layer's parameters */
    evict_caches();
    TRY(together());
    double t7 = bg_now();
    for (int k = 0; k < bg_model_num_tensors(x->m); k++) {
        bg_param_t *p = bg_model_tensor(x->m, k);
        if (p->numel)
            (void)be->ops->sumsq(be, p->grad, p->numel);
    }
    st = bg_model_optim_step(x->m, oc, step);
    be->ops->synchronize(be);
    double t8 = bg_now();
    TRY(st);
    if (r >= 0) {
        x->smp[FIG_F][r] = t1 - t0;
        x->smp[FIG_BW][r] = t3 - t2;
        x->smp[FIG_B][r] = t5 - t4;
        x->smp[FIG_W][r] = t6 - t5;
        x->smp[FIG_O][r] = t8 - t7;
        x->smp[FIG_CF][r] = c1 - c0;
        x->smp[FIG_CB][r] = c3 - c2;
    }
    return BG_OK;
}

/* Time every layer of desc on one microbatch of n x t (fig[i]: the medians
 * of layer i's rounds), with the optimizer `optim`. Layers with the same
 * profile (the GPT's blocks) are measured once. *spread_p: the rounds'
 * spread (rel_spread of their totals) at the end, *rounds_p their count;
 * extend: go on while they spread (not when the processes measuring share
 * cores: their rounds spread by the time slices they get). */
static int measure_layers(const char *CMD, bg_model_desc_t *desc, int n, int t, const char *backend, int threads,
                          bg_optim_kind_t optim, int extend, double (*fig)[NFIG], int *L_p, double *spread_p,
                          int *rounds_p)
{
    static bg_layer_profile_t prof[4096];
    static int same[4096]; /* the distinct layer (index into xs) that stands for layer i */
    int L = 0;
    bg_status_t st = bg_model_profile(desc, n, t, prof, 4096, &L);
    if (st != BG_OK)
        return bg_cli_status(CMD, st);
    const bg_model_desc_params_t *mp = bg_model_desc_params(desc);
    int tokens = mp->input == BG_INPUT_TOKENS;
    int classes = bg_model_desc_classes(desc), ids = tokens && mp->vocab < classes ? mp->vocab : classes;
    bg_backend_t *be = NULL;
    bg_backend_params_t bp = bg_cli_backend_params(threads);
    if ((st = bg_backend_create(backend, &bp, &be)) != BG_OK)
        return bg_cli_status(CMD, st);
    int32_t *tok = malloc((size_t)n * (size_t)t * sizeof(int32_t));
    mlayer_t *xs = calloc((size_t)L, sizeof(mlayer_t));
    double *tot = calloc(MAX_ROUNDS, sizeof(double));
    int rc = 0, nx = 0, rounds = 0;
    if (!tok || !xs || !tot) {
        rc = bg_cli_fail(CMD, "out of memory");
        goto out;
    }
    for (int i = 0; i < n * t; i++)
        tok[i] = (int32_t)((i * 7919) % ids); /* token ids and targets alike */
    for (int i = 0; i < L; i++) {
        same[i] = -1; /* an earlier inner layer with the same profile */
        for (int j = 1; j < i && i < L - 1 && same[i] < 0; j++)
            if (prof[j].params == prof[i].params && prof[j].stash_bytes == prof[i].stash_bytes &&
                prof[j].wstash_bytes == prof[i].wstash_bytes && prof[j].output_bytes == prof[i].output_bytes &&
                prof[j].fwd_flops == prof[i].fwd_flops && prof[j].bwd_flops == prof[i].bwd_flops)
                same[i] = same[j];
        if (same[i] >= 0)
            continue;
        mlayer_t *x = &xs[nx];
        x->layer = i;
        same[i] = nx++;
        if ((st = bg_model_create(desc, be, i, i, &x->m)) != BG_OK ||
            (st = bg_stage_create(x->m, 1, &x->stg)) != BG_OK)
            break;
        x->in = bg_model_input_shape(x->m, n, t);
        for (int k = 0; k < i && st == BG_OK; k++)
            st = bg_layer_out_shape(bg_model_layer(x->m, k), x->in, &x->in);
        if (st != BG_OK)
            break;
    }
    bg_optim_config_t oc = BG_OPTIM_CONFIG_INIT;
    oc.kind = optim;
    double start = bg_now(), spread = 0;
    for (int r = -1; st == BG_OK; r++) { /* r = -1: the warm-up round */
        for (int k = 0; k < nx && st == BG_OK; k++)
            st = time_layer(be, &xs[k], L, tokens, tok, n, t, &oc, r + 2, r);
        if (st != BG_OK || r < 0)
            continue;
        rounds = r + 1;
        tot[r] = 0; /* this round's step of one microbatch through every layer */
        for (int i = 0; i < L; i++)
            tot[r] += xs[same[i]].smp[FIG_F][r] + xs[same[i]].smp[FIG_BW][r] + xs[same[i]].smp[FIG_O][r];
        spread = rel_spread(tot, rounds);
        double el = bg_now() - start;
        int enough = rounds >= MIN_ROUNDS || (rounds >= MIN_SLOW && el > SLOW_S);
        int more = rounds < MIN_SLOW || (rounds < MAX_ROUNDS && el < MAX_S && (!enough || (extend && spread > SPREAD)));
        if (measure_barrier) { /* the group goes on while any member wants more */
            int all[64];
            if ((st = bg_group_allgather(measure_barrier, &more, all, 1, BG_I32)) != BG_OK)
                break;
            for (int k = 0; k < bg_group_size(measure_barrier); k++)
                more |= all[k];
        }
        if (!more)
            break;
    }
    if (st != BG_OK) {
        rc = bg_cli_status(CMD, st);
        goto out;
    }
    /* medians: what a training step sees, not the luckiest run */
    for (int i = 0; i < L; i++)
        for (int j = 0; j < NFIG; j++) {
            double v[MAX_ROUNDS];
            memcpy(v, xs[same[i]].smp[j], (size_t)rounds * sizeof(double));
            fig[i][j] = bg_median(v, (size_t)rounds);
        }
    *L_p = L;
    *spread_p = spread;
    *rounds_p = rounds;
out:
    for (int k = 0; xs && k < L; k++) {
        bg_stage_destroy(xs[k].stg);
        bg_model_destroy(xs[k].m);
    }
    free(xs);
    free(tot);
    free(tok);
    bg_backend_destroy(be);
    return rc;
}

/* ---------------------------------------------------------------- processes */


/* One process of a measurement: member `rank` of a group of tp (tp > 1: its
 * own world of tp processes on 127.0.0.1:port, the description bound to the
 * tensor group). loop: a copy running beside, measuring until it is killed;
 * else the figures go to out and the process ends. share: processes evicting
 * the cache at once (evict_caches; 0: none). Never returns. */
static void member(const char *cmd, bg_model_desc_t *desc, int n, int t, const char *backend, int threads,
                   bg_optim_kind_t optim, int extend, int share, int tp, int rank, int port, const char *token,
                   int loop, double (*out)[NFIG], int *L_out, double *spread_out, int *rounds_out)
{
    static double fig[4096][NFIG];
    bg_comm_t *comm = NULL;
    bg_status_t st = BG_OK;
    int rc = 1, L = 0;
    evict_share = share;
    if (loop) /* a copy running beside is load, killed when the measurement ends: its group's complaints are noise */
        (void)!freopen("/dev/null", "w", stderr);
    if (tp > 1) {
        bg_comm_params_t cp = BG_COMM_PARAMS_INIT;
        cp.rank = rank;
        cp.world_size = tp;
        cp.local_rank = rank;
        cp.master_addr = "127.0.0.1";
        cp.master_port = port;
        cp.token = token;
        int *all = malloc((size_t)tp * sizeof(int));
        for (int k = 0; all && k < tp; k++)
            all[k] = k;
        if (!all)
            st = bg_error(BG_ERR_NOMEM, "measurement group");
        if (st != BG_OK || (st = bg_comm_create(&cp, &comm)) != BG_OK ||
            (st = bg_tp_group_create(comm, desc, tp, 0, &measure_tp)) != BG_OK ||
            (st = bg_group_create(comm, tp, all, &measure_barrier)) != BG_OK) {
            free(all);
            bg_cli_status(cmd, st);
            goto out;
        }
        free(all);
    }
    double spread = 0;
    int rounds = 0;
    do
        rc = measure_layers(cmd, desc, n, t, backend, threads, optim, extend, fig, &L, &spread, &rounds);
    while (loop && rc == 0);
    if (rc == 0) {
        memcpy(out, fig, (size_t)L * sizeof(fig[0]));
        *spread_out = spread;
        *rounds_out = rounds;
        *L_out = L;
    }
out:
    fflush(stdout);
    fflush(stderr);
    if (measure_barrier)
        bg_group_destroy(measure_barrier);
    bg_tp_group_destroy(measure_tp, desc);
    if (comm)
        bg_comm_destroy(comm);
    _exit(rc);
}

/* Shared with the members: each one's layer count (-1 until it is done) and figures. */
typedef struct {
    int L, rounds;
    double spread;
    double fig[4096][NFIG];
} member_out_t;

int bg_cli_measure_layers(const char *cmd, bg_model_desc_t *desc, int n, int t, const char *backend, int threads,
                          int ranks, int tp, bg_optim_kind_t optim, double *fwd, double *bwd, double *bsplit,
                          double *wsplit, double *opt, double *coll, int *L_p)
{
    static bg_layer_profile_t prof[4096];
    int L = 0;
    bg_status_t st = bg_model_profile(desc, n, t, prof, 4096, &L);
    if (st != BG_OK)
        return bg_cli_status(cmd, st);
    /* the ranks of one machine compute at the same time and share its caches,
     * memory bandwidth and, when they outnumber them, its cores: measure under
     * that load, with copies of the same measurement (whole groups) running
     * beside this one, one process per rank (up to 64) */
    if (tp < 1 || tp > 64)
        return bg_cli_fail(cmd, "cannot measure a tensor group of %d processes on one machine (1..64)", tp);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int busy = ranks < 64 ? ranks : 64, groups = busy > tp ? (busy + tp - 1) / tp : 1;
    if (groups * tp > 64)
        groups = 64 / tp > 1 ? 64 / tp : 1;
    int cores = (int)(ncpu / (threads > 1 ? threads : 1)); /* ranks this machine runs on cores of their own */
    int shared = groups * tp > cores;
    int evict_procs = (int)(groups * tp < ncpu ? groups * tp : ncpu); /* evicting at the same moment */
    /* Does a layer's data stay in the last-level cache from one microbatch to
     * the next? Between two uses a rank touches its whole stage: at most the
     * model's weights and gradients and one microbatch's stash, and the other
     * ranks on this machine touch theirs in the same cache. When all of that
     * fits, the layers are timed warm (no eviction): measured on the GPT of
     * bench/tp_plan.sh (2 x 13.3 MiB in 32 MiB), half the cache evicted read
     * 4-6 % above the run and warm 0.96-1.00 of it; on an 8 x 256 GPT at
     * pp 2 (2 x 67.7 MiB), warm read 7-9 % below and half evicted 1.00-1.02. */
    double ws = 0;
    for (int i = 0; i < L; i++)
        ws += 2.0 * (double)prof[i].params * sizeof(float) + (double)prof[i].stash_bytes;
    double llc = (double)llc_bytes();
    int warm = ws * groups * tp <= llc;
    member_out_t *res = mmap(NULL, (size_t)tp * sizeof(member_out_t), PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED)
        return bg_cli_fail(cmd, "cannot map the measurement's results: %s", strerror(errno));
    if (tp > 1)
        printf("measuring %d layers on the %s backend (microbatch %d) on a tensor group of %d processes: the tp %d "
               "build's layers with their collectives\n", L, backend, n, tp, tp);
    else
        printf("measuring %d layers on the %s backend (microbatch %d)...\n", L, backend, n);
    if (groups > 1)
        printf("measuring with %d cop%s running beside (as many ranks share this machine's cores)\n", groups - 1,
               groups == 2 ? "y" : "ies");
    if (shared)
        printf("note: %d processes of %d thread%s outnumber this machine's %ld cores: the times are of them sharing "
               "the cores, as when the plan runs here (--host-ranks: how many of its ranks run on this machine)\n",
               groups * tp, threads > 1 ? threads : 1, threads > 1 ? "s" : "", ncpu);
    printf("caches: %.1f MiB per process (weights, gradients, one microbatch's stash) x %d process%s = %.1f MiB, "
           "last-level cache %.1f MiB: layers timed %s\n", ws / 1048576, groups * tp, groups * tp > 1 ? "es" : "",
           ws * groups * tp / 1048576, llc / 1048576, warm ? "warm" : "with half the cache evicted before each call");
    fflush(stdout);
    fflush(stderr);
    pid_t kids[64];
    int nk = 0, rc = 0;
    for (int g = 0; g < groups && rc == 0; g++) {
        int port = 0;
        char token[BG_CLI_TOKEN_CHARS + 1] = "";
        if (tp > 1 && (bg_cli_free_port(&port) != 0 || bg_cli_job_token(token, sizeof token) != 0)) {
            rc = bg_cli_fail(cmd, "cannot set up the measurement's tensor group (port, token): %s", strerror(errno));
            break;
        }
        for (int k = 0; k < tp; k++) {
            if (g == 0)
                res[k].L = -1;
            pid_t pid = fork();
            if (pid == 0)
                member(cmd, desc, n, t, backend, threads, optim, !shared, warm ? 0 : evict_procs, tp, k, port,
                       token, g > 0, res[k].fig, &res[k].L, &res[k].spread, &res[k].rounds);
            if (pid < 0) {
                rc = bg_cli_fail(cmd, "cannot start a measuring process: %s", strerror(errno));
                break;
            }
            kids[nk++] = pid;
        }
    }
    /* the measuring group (the first tp children): wait for all; one that fails ends the others */
    int left = rc == 0 ? tp : 0, failed = rc != 0;
    int done[64] = {0};
    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0)
            break;
        for (int k = 0; k < tp; k++)
            if (kids[k] == pid && !done[k]) {
                done[k] = 1;
                left--;
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || res[k].L != L) {
                    if (!failed)
                        fprintf(stderr, "brigade %s: measuring process %d of %d failed (%s %d)\n", cmd, k, tp,
                                WIFEXITED(status) ? "exit code" : "signal",
                                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
                    failed = 1;
                    for (int j = 0; j < tp; j++)
                        if (!done[j])
                            kill(kids[j], SIGKILL);
                }
            }
    }
    for (int k = tp; k < nk; k++) /* the copies running beside: all at once */
        kill(kids[k], SIGKILL);
    for (int k = tp; k < nk; k++)
        waitpid(kids[k], NULL, 0);
    if (failed) {
        munmap(res, (size_t)tp * sizeof(member_out_t));
        return 1;
    }
    /* the group moves at the pace of its slowest member: the largest time of
     * each kind; its collectives' share, the mean over the members */
    double f = 0, b = 0, ff = 0, fb = 0, c = 0, o = 0, spread = 0;
    int rounds = MAX_ROUNDS;
    for (int k = 0; k < tp; k++) {
        spread = fmax(spread, res[k].spread);
        rounds = res[k].rounds < rounds ? res[k].rounds : rounds;
    }
    for (int i = 0; i < L; i++) {
        double m[NFIG] = {0};
        for (int k = 0; k < tp; k++)
            for (int j = 0; j < NFIG; j++)
                m[j] = j >= FIG_CF ? m[j] + res[k].fig[i][j] / tp : fmax(m[j], res[k].fig[i][j]);
        fwd[i] = m[FIG_F];
        bwd[i] = m[FIG_BW];
        bsplit[i] = m[FIG_B];
        wsplit[i] = m[FIG_W];
        if (opt)
            opt[i] = m[FIG_O];
        if (coll)
            coll[i] = m[FIG_CF] + m[FIG_CB];
        f += fwd[i], b += bwd[i], c += m[FIG_CF] + m[FIG_CB], o += m[FIG_O];
        ff += prof[i].fwd_flops, fb += prof[i].bwd_flops;
    }
    munmap(res, (size_t)tp * sizeof(member_out_t));
    printf("measured per microbatch: forward %.3f ms, backward %.3f ms (%.2f and %.2f GFLOP/s", 1e3 * f, 1e3 * b,
           f > 0 ? ff / f / 1e9 : 0.0, b > 0 ? fb / b / 1e9 : 0.0);
    if (tp > 1)
        printf(" per member; %.3f ms of it in the group's collectives", 1e3 * c);
    printf("); optimizer step %.3f ms; %d rounds, spread %.1f %%\n\n", 1e3 * o, rounds, 100 * spread);
    if (spread > SPREAD && !shared)
        fprintf(stderr, "brigade %s: warning: the machine was busy while measuring (the rounds' times spread by "
                "%.0f %% after %d rounds, more than %.0f %%): the times may be off; measure again when it is "
                "quiet\n", cmd, 100 * spread, rounds, 100 * SPREAD);
    *L_p = L;
    return 0;
}
