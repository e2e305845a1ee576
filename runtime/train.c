/* runtime/train.c: the training job of the CLI: a host of the executor.
 * It builds the model from the builder configuration, opens the data (the
 * corpus or the synthetic task) as a batch source, creates the executor for
 * the layout (one process is pp = dp = 1), and owns the loop: steps,
 * progress, metrics (one JSON line per rank and step), checkpoints, stop
 * requests, resume, the final weights and the trace. This is the only
 * training loop. */
#include <errno.h>
#include <fcntl.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "brigade/executor.h"
#include "brigade/train.h"
#include "core/check.h"
#include "core/util.h"
#include "core/fileio.h"

void bg_train_config_init(bg_train_config_t *cfg)
{
    *cfg = (bg_train_config_t)BG_TRAIN_CONFIG_INIT;
}

/* What lengths are rounded up to a multiple of: --seq-multiple, or under
 * sequence parallelism tp (each member holds t / tp positions). */
static int seq_multiple(const bg_train_config_t *c)
{
    if (c->seq_multiple > 0)
        return c->seq_multiple;
    return c->model.tp > 1 && c->model.sequence_parallel ? c->model.tp : 1;
}

/* The job's learning-rate schedule: its peak is --lr, its decay ends at
 * --steps unless --decay-steps says otherwise. */
static bg_lr_schedule_t lr_schedule(const bg_train_config_t *c)
{
    bg_lr_schedule_t s = c->lr_schedule;
    s.size = sizeof(s);
    s.lr = c->optim.lr;
    if (s.decay_steps == 0)
        s.decay_steps = c->steps;
    return s;
}

bg_status_t bg_train_check(const bg_train_config_t *c)
{
    BG_CHECK(bg_model_config_check(&c->model));
    if (c->batch < 1)
        return bg_error(BG_ERR_INVALID, "batch must be >= 1 (got %d)", c->batch);
    if (c->microbatches < 1)
        return bg_error(BG_ERR_INVALID, "microbatches must be >= 1 (got %d)", c->microbatches);
    if (c->batch % c->microbatches != 0)
        return bg_error(BG_ERR_INVALID, "batch %d is not divisible into %d equal microbatches", c->batch,
                        c->microbatches);
    if (c->steps < 0)
        return bg_error(BG_ERR_INVALID, "steps must be >= 0 (got %d)", c->steps);
    if (c->model.kind == BG_MODEL_GPT) {
        int t = c->seq ? c->seq : c->model.seq_len;
        if (t < 1 || t > c->model.seq_len)
            return bg_error(BG_ERR_INVALID, "sequence length %d must be in [1, %d] (the model's maximum)", t,
                            c->model.seq_len);
        if (!c->data_path || !*c->data_path)
            return bg_error(BG_ERR_INVALID, "a GPT needs a text data file");
        if (c->model.vocab < 256)
            return bg_error(BG_ERR_INVALID, "vocab %d is too small: the corpus is read as bytes (0..255), so it must be "
                                            ">= 256", c->model.vocab);
    }
    if (!(c->optim.lr > 0))
        return bg_error(BG_ERR_INVALID, "learning rate must be > 0 (got %g)", (double)c->optim.lr);
    bg_lr_schedule_t ls = lr_schedule(c);
    BG_CHECK(bg_lr_check(&ls));
    if (c->zero < 0 || c->zero > 2)
        return bg_error(BG_ERR_INVALID, "--zero %d: the sharding stage must be 0, 1 or 2", c->zero);
    if (c->ps < 0 || c->staleness < 0)
        return bg_error(BG_ERR_INVALID, "--ps %d --staleness %d: both must be >= 0", c->ps, c->staleness);
    if (c->staleness > 0 && c->ps == 0)
        return bg_error(BG_ERR_INVALID, "--staleness %d needs --ps (parameter servers)", c->staleness);
    if (c->ps > 0 && c->model.tp > 1)
        return bg_error(BG_ERR_UNSUPPORTED, "--ps with --tp %d: the servers hold whole tensors and a tensor-parallel "
                        "worker holds slices of them; pushing and pulling slices is not built (--pp is)", c->model.tp);
    if (c->ps > 0 && c->zero)
        return bg_error(BG_ERR_INVALID, "--ps with --zero %d: the servers already shard the optimizer state (by "
                        "tensor); leave --zero out", c->zero);
    if (c->pp < 0 || c->dp < 0)
        return bg_error(BG_ERR_INVALID, "pp and dp must be >= 1 (got %d, %d)", c->pp, c->dp);
    int dp = c->dp ? c->dp : 1;
    if (c->batch % (dp * c->microbatches) != 0)
        return bg_error(BG_ERR_INVALID,
                        "batch %d does not split into %d replicas x %d equal microbatches", c->batch, dp,
                        c->microbatches);
    if (c->seq_min < 0)
        return bg_error(BG_ERR_INVALID, "seq_min must be >= 0 (got %d)", c->seq_min);
    int T = c->seq ? c->seq : c->model.seq_len;
    if (c->seq_multiple < 0)
        return bg_error(BG_ERR_INVALID, "seq_multiple must be >= 0 (got %d)", c->seq_multiple);
    int q = c->seq_multiple;
    if (q > 1 && T % q != 0)
        return bg_error(BG_ERR_INVALID, "--seq-multiple %d does not divide the sequence length %d", q, T);
    if (q > 0 && c->model.tp > 1 && c->model.sequence_parallel && q % c->model.tp != 0)
        return bg_error(BG_ERR_INVALID, "--seq-multiple %d with --sequence-parallel: every length must be a multiple "
                                        "of tp %d",
                        q, c->model.tp);
    if (c->checkpoint_every < 0 || c->keep < 0)
        return bg_error(BG_ERR_INVALID, "checkpoint_every and keep must be >= 0");
    if ((c->resume || c->checkpoint_every) && !c->checkpoint_dir)
        return bg_error(BG_ERR_INVALID, "--resume and --checkpoint-every need --checkpoint-dir");
    if (c->resume_strict && !c->resume && !c->resume_from)
        return bg_error(BG_ERR_INVALID, "--resume-strict goes with --resume");
    return BG_OK;
}

int bg_train_seq_len(const bg_train_config_t *c, int64_t step, int mb)
{
    if (c->model.kind != BG_MODEL_GPT)
        return 1;
    int T = c->seq ? c->seq : c->model.seq_len;
    if (c->seq_min <= 0 || c->seq_min >= T)
        return T;
    bg_rng_t r;
    bg_rng_seed(&r, c->data_seed ^ ((uint64_t)step * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)mb << 40) ^ 0x5e9ULL);
    int t = c->seq_min + (int)bg_rng_below(&r, (uint64_t)(T - c->seq_min + 1));
    int q = seq_multiple(c);
    t = (t + q - 1) / q * q;
    return t < T ? t : T;
}

/* The CLI's data: the corpus or the synthetic task, with variable lengths. */
typedef struct train_source {
    bg_batch_source_t data;
    const bg_train_config_t *c;
} train_source_t;

static bg_status_t train_batch(const bg_batch_request_t *rq, int32_t *tokens, float *features, int32_t *targets,
                               void *arg)
{
    const train_source_t *s = arg;
    return s->data.batch(rq, tokens, features, targets, s->data.arg);
}

static int train_seq_len(int64_t step, int mb, void *arg)
{
    return bg_train_seq_len(((const train_source_t *)arg)->c, step, mb);
}

/* A group of every rank of the job's communicator. */
static bg_status_t world_group(bg_comm_t *comm, bg_group_t **g_p)
{
    int world = bg_comm_size(comm);
    int *ranks = malloc((size_t)world * sizeof(int));
    BG_ALLOC_CHECK(ranks, (size_t)world * sizeof(int), "world ranks");
    for (int r = 0; r < world; r++)
        ranks[r] = r;
    bg_status_t st = bg_group_create(comm, world, ranks, g_p);
    free(ranks);
    return st;
}

/* The metrics file's first line: what ran (brigade plot titles its chart with it). */
static void metrics_header(int fd, const bg_train_config_t *c)
{
    char line[256], ps[64] = "";
    if (c->ps > 0) /* parameter servers: only then, so other headers stay as they were */
        snprintf(ps, sizeof ps, ", \"ps\": %d, \"staleness\": %d", c->ps, c->staleness);
    if (c->model.precision == BG_BF16) /* likewise */
        snprintf(ps + strlen(ps), sizeof ps - strlen(ps), ", \"precision\": \"bf16\"");
    int len = snprintf(line, sizeof line,
                       "{\"run\": {\"model\": \"%s\", \"layers\": %d, \"d_model\": %d, \"pp\": %d, \"dp\": %d, "
                       "\"schedule\": \"%s\"%s}}\n",
                       c->model.kind == BG_MODEL_MLP ? "mlp" : "gpt", c->model.layers, c->model.d_model,
                       c->pp > 0 ? c->pp : 1, c->dp > 0 ? c->dp : 1,
                       c->schedule_json ? "custom" : c->schedule ? c->schedule : "1f1b", ps);
    if (len > 0 && len < (int)sizeof line && write(fd, line, (size_t)len) != len)
        len = 0; /* a lost header only loses plot's title */
}

/* Metrics: rank 0 starts the file (unless resuming); every rank learns
 * whether it could, and none writes before it did. */
static bg_status_t metrics_open(const bg_train_config_t *c, bg_executor_t *x)
{
    bg_status_t st = BG_OK;
    bg_comm_t *comm = bg_executor_comm(x);
    if (bg_comm_rank(comm) == 0 && !c->resume) {
        int fd = open(c->metrics_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            st = bg_error(BG_ERR_IO, "cannot write metrics file %s: %s", c->metrics_path, strerror(errno));
        else
            metrics_header(fd, c), close(fd);
    }
    if (bg_comm_size(comm) == 1)
        return st;
    bg_group_t *g = NULL;
    float bad = st == BG_OK ? 0.0f : 1.0f;
    bg_status_t st2 = world_group(comm, &g);
    if (st2 == BG_OK)
        st2 = bg_group_allreduce(g, &bad, 1, BG_F32, BG_REDUCE_SUM);
    bg_group_destroy(g);
    if (st2 != BG_OK)
        return st2;
    if (bad > 0 && st == BG_OK)
        st = bg_error(BG_ERR_IO, "rank 0 cannot write metrics file %s", c->metrics_path);
    return st;
}

/* One line per rank and step, appended with one write (O_APPEND keeps lines whole). */
static bg_status_t metrics_write(const char *path, int rank, const bg_step_result_t *r, float lr)
{
    char line[768], gnorm[32] = "null", ps[256] = ""; /* JSON has no NaN or infinity */
    if (isfinite(r->grad_norm))
        snprintf(gnorm, sizeof(gnorm), "%.9g", r->grad_norm);
    if (r->ps_role == 1)
        snprintf(ps, sizeof ps, ", \"role\": \"server\", \"bytes_recv\": %llu, \"optim_ms\": %.3f, \"idle\": %.4f, "
                 "\"live_workers\": %d", (unsigned long long)r->bytes_recv, r->optim_ms, r->idle, r->live_workers);
    else if (r->ps_role == 2)
        snprintf(ps, sizeof ps, ", \"role\": \"worker\", \"staleness\": %d, \"bytes_recv\": %llu", r->staleness,
                 (unsigned long long)r->bytes_recv);
    char heap[32] = "null"; /* the C library's bytes in use: a leak's exact figure (RSS moves in pages) */
#ifdef __GLIBC__
    struct mallinfo2 mi = mallinfo2();
    snprintf(heap, sizeof heap, "%zu", mi.uordblks + mi.hblkhd);
#endif
    int len = snprintf(line, sizeof(line),
                       "{\"rank\": %d, \"step\": %lld, \"loss\": %.6f, \"tokens_per_s\": %.1f, \"step_ms\": %.3f, "
                       "\"bubble\": %.4f, \"bytes_sent\": %llu, \"peak_bytes\": %zu, \"heap_bytes\": %s, "
                       "\"grad_norm\": %s, \"lr\": %.9g%s}\n",
                       rank, (long long)r->step, r->loss, r->tokens_per_s, r->step_ms, r->bubble,
                       (unsigned long long)r->bytes_sent, r->peak_bytes, heap, gnorm, (double)lr, ps);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0 || write(fd, line, (size_t)len) != len) {
        bg_status_t st = bg_error(BG_ERR_IO, "cannot write metrics file %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return st;
    }
    close(fd);
    return BG_OK;
}

/* The executor's parameters for the CLI's job. */
static void job_params(const bg_train_config_t *c, bg_model_desc_t *desc, train_source_t *src,
                       bg_executor_params_t *p_out)
{
    bg_executor_params_t p = BG_EXECUTOR_PARAMS_INIT;
    p.model = desc;
    p.pp = c->pp > 0 ? c->pp : 1;
    p.dp = c->dp > 0 ? c->dp : 1;
    p.tp = c->model.tp > 0 ? c->model.tp : 1; /* the builder made layers of this degree */
    p.schedule = c->schedule;
    p.chunks = c->chunks;
    p.split = c->split;
    p.nsplit = c->nsplit;
    p.batch = c->batch;
    p.microbatches = c->microbatches;
    p.optim = c->optim;
    p.data.batch = train_batch;
    p.data.seq_len = train_seq_len;
    p.data.arg = src;
    p.backend = c->backend;
    p.threads = c->threads;
    p.recompute = c->recompute;
    p.recompute_stages = c->recompute_stages;
    p.nrecompute_stages = c->nrecompute_stages;
    p.trace_path = c->trace_path;
    p.process_wide = c->process_wide;
    p.schedule_json = c->schedule_json;
    p.zero = c->zero;
    p.emulate = c->emulate;
    p.emulate_scale = c->emulate_scale;
    p.ps = c->ps;
    p.staleness = c->staleness;
    p.device_mem = c->device_mem;
    p.ndevice_mem = c->ndevice_mem;
    *p_out = p;
}

/* What the executor holds and predicts, into the job's result. */
static void result_from_info(const bg_executor_info_t *info, bg_train_result_t *res)
{
    res->params = info->params;
    res->flops_per_step = info->flops_per_step;
    res->predicted_bytes = info->predicted_bytes;
    res->predicted_act_bytes = info->predicted_act_bytes;
    res->predicted_stashed = info->predicted_stashed;
    res->peak_stashed = info->peak_stashed;
    res->peak_act_bytes = info->peak_act_bytes;
}

/* Whether every rank's setup worked: BG_OK everywhere, else the lowest
 * failing rank keeps its own error (it reports it) and every other rank gets
 * BG_ERR_PEER, "rank Q stopped on an error (...)", the form of a peer's abort
 * mid-step, so a host prints the cause once. Collective. */
static bg_status_t agree(bg_executor_t *x, bg_status_t mine)
{
    bg_comm_t *comm = bg_executor_comm(x);
    int world = bg_comm_size(comm), me = bg_comm_rank(comm);
    if (world == 1)
        return mine;
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", mine != BG_OK ? bg_last_error() : "");
    int *failed = calloc((size_t)world, sizeof(int));
    BG_ALLOC_CHECK(failed, (size_t)world * sizeof(int), "setup agreement");
    int f = mine != BG_OK;
    bg_group_t *g = NULL;
    bg_status_t st = world_group(comm, &g);
    if (st == BG_OK)
        st = bg_group_allgather(g, &f, failed, 1, BG_I32);
    bg_group_destroy(g);
    int first = -1;
    for (int r = 0; st == BG_OK && r < world && first < 0; r++)
        if (failed[r])
            first = r;
    free(failed);
    if (st != BG_OK)
        return mine != BG_OK ? bg_error(mine, "%s", msg) : st;
    if (first < 0 || first == me)
        return mine != BG_OK ? bg_error(mine, "%s", msg) : BG_OK;
    return bg_error(BG_ERR_PEER, "rank %d stopped on an error (reported by that rank)%s", first,
                    mine != BG_OK ? "; this rank failed the same way or otherwise" : "");
}

/* Every rank's figures, in rank order, into res->ranks: one allgather over
 * the job (collective: every rank calls it at the same point). */
static bg_status_t gather_ranks(bg_executor_t *x, const bg_executor_info_t *info, bg_train_result_t *res, int ps)
{
    bg_train_rank_t me;
    memset(&me, 0, sizeof(me)); /* padding too: the bytes travel */
    me.rank = info->rank;
    me.pp_rank = info->pp_rank;
    me.dp_rank = info->dp_rank;
    me.params = res->params;
    me.peak_bytes = res->peak_bytes;
    me.peak_act_bytes = res->peak_act_bytes;
    me.predicted_act_bytes = res->predicted_act_bytes;
    me.peak_stashed = res->peak_stashed;
    me.predicted_stashed = res->predicted_stashed;
    me.bubble = res->bubble;
    me.numa_node = res->numa_node;
    me.predicted_bytes = res->predicted_bytes;
    int world = info->world > 1 && !ps ? info->world : 1; /* --ps: workers may have died; this rank's own */
    res->ranks = calloc((size_t)world, sizeof(bg_train_rank_t));
    BG_ALLOC_CHECK(res->ranks, (size_t)world * sizeof(bg_train_rank_t), "per-rank results");
    res->nranks = world;
    if (world == 1) {
        res->ranks[0] = me;
        return BG_OK;
    }
    bg_group_t *g = NULL;
    bg_status_t st = world_group(bg_executor_comm(x), &g);
    if (st == BG_OK)
        st = bg_group_allgather(g, &me, res->ranks, sizeof(me), BG_U8);
    bg_group_destroy(g);
    return st;
}

void bg_train_result_free(bg_train_result_t *r)
{
    if (!r)
        return;
    free(r->ranks);
    r->ranks = NULL;
    r->nranks = 0;
}

bg_status_t bg_train(const bg_train_config_t *cfg_in, bg_train_result_t *result_p)
{
    bg_train_config_t c;
    bg_train_config_init(&c);
    memcpy(&c, cfg_in, cfg_in->size < sizeof(c) ? cfg_in->size : sizeof(c));
    c.size = sizeof(c);
    BG_CHECK(bg_train_check(&c));
    bg_status_t st = BG_OK;
    bg_model_desc_t *desc = NULL;
    bg_data_t *data = NULL;
    bg_executor_t *x = NULL;
    double *times = NULL, *busy = NULL;
    bg_train_result_t res = {0};
    bg_executor_info_t info;
    res.numa_node = -1;
    int tokens_in = c.model.kind == BG_MODEL_GPT;

    BG_CHECK(bg_model_build(&c.model, &desc));
    const bg_model_desc_params_t *mp = bg_model_desc_params(desc);
    int T = tokens_in ? (c.seq ? c.seq : mp->seq_len) : 1;
    bg_executor_params_t p;
    train_source_t src = {{0}, &c}; /* the data: once the job is connected (below) */
    job_params(&c, desc, &src, &p);
    BG_CHECK_GOTO(bg_executor_create(&p, &x), st, out);
    /* the job's files, on every rank: a failure every rank finds (a bad data
     * file) is reported by the lowest rank that finds it, the others stop
     * with a peer's error naming that rank */
    bg_status_t fst;
    if (tokens_in)
        fst = bg_data_open_text(c.data_path, T, c.data_seed, &data);
    else
        fst = bg_data_synthetic(mp->features, bg_model_desc_classes(desc), c.data_seed, &data);
    if (fst == BG_OK && c.save_dir)
        fst = bg_check_replaceable_dir(c.save_dir, ".safetensors");
    BG_CHECK_GOTO(agree(x, fst), st, out);
    src.data = bg_data_source(data);
    bg_executor_info(x, &info);
    res.rank = info.rank;
    res.world = info.world;
    res.numa_node = info.numa_node;
    if (c.metrics_path)
        BG_CHECK_GOTO(metrics_open(&c, x), st, out);
    if (c.resume_from || (c.checkpoint_dir && c.resume)) {
        bg_resume_params_t rp = BG_RESUME_PARAMS_INIT;
        rp.root = c.checkpoint_dir;
        rp.path = c.resume_from;
        rp.strict = c.resume_strict;
        bg_resume_result_t *rr = malloc(sizeof(*rr));
        if (!rr) {
            st = bg_error(BG_ERR_NOMEM, "resume result");
            goto out;
        }
        st = bg_executor_resume_with(x, &rp, rr);
        /* the executor leaves "nothing to resume" to its host; --resume-strict
         * promises to fail when no checkpoint is valid, a missing or empty
         * directory included */
        if (st == BG_OK && c.resume_strict && !rr->found)
            st = bg_error(BG_ERR_NOT_FOUND, "--resume-strict: no valid checkpoint in %s (%s)", c.checkpoint_dir,
                          rr->invalid ? rr->invalid_what : "no step-N directory");
        if (st == BG_OK && c.on_resume)
            c.on_resume(rr, c.resume_from ? c.resume_from : c.checkpoint_dir, info.rank, c.on_step_arg);
        free(rr);
        if (st != BG_OK)
            goto out;
    }
    int start = (int)bg_executor_steps_done(x);
    res.start_step = start;
    res.steps_done = start;
    enum { BG_TIMED = 4096 }; /* the last BG_TIMED step times give the medians */
    times = calloc(BG_TIMED, sizeof(double));
    busy = calloc(BG_TIMED, sizeof(double));
    if (!times || !busy) {
        st = bg_error(BG_ERR_NOMEM, "step times");
        goto out;
    }
    int timed = 0;
    /* the first step of a run allocates the optimizer state and touches every buffer for the first
     * time (1.5-3x a later step's time for a small GPT): with 3 steps or more it is left out of the medians
     * (written where the second one goes; kept only if the run stops after it) */
    int skip_first = c.steps - start >= 3;
    double tokens_mid = 0;
    bg_lr_schedule_t ls = lr_schedule(&c);
    for (int step = start; step < c.steps; step++) {
        if (c.stop_flag && *c.stop_flag)
            bg_executor_request_stop(x);
        double lr = bg_lr_at(&ls, step); /* a constant rate is --lr's float, unchanged */
        bg_executor_set_lr(x, (float)lr);
        bg_step_result_t r;
        BG_CHECK_GOTO(bg_executor_step(x, &r), st, out);
        times[timed % BG_TIMED] = r.step_ms / 1e3;
        busy[timed % BG_TIMED] = (1.0 - r.bubble) * r.step_ms / 1e3;
        timed += !(skip_first && step == start);
        if (step == start + (c.steps - start) / 2 || tokens_mid == 0) /* the first until the middle (a stop) */
            tokens_mid = r.tokens;
        res.steps_done = step + 1;
        if (step == start)
            res.first_loss = r.loss;
        res.final_loss = r.loss;
        res.peak_bytes = r.peak_bytes;
        if (c.on_step) {
            bg_step_info_t si = {step + 1, c.steps, r.loss, r.step_ms, r.tokens_per_s, info.rank, r.grad_norm,
                                 (double)(float)lr};
            c.on_step(&si, c.on_step_arg);
        }
        if (c.metrics_path)
            BG_CHECK_GOTO(metrics_write(c.metrics_path, info.rank, &r, (float)lr), st, out);
        int last = step + 1 == c.steps;
        if (c.checkpoint_dir && (r.stop || last || (c.checkpoint_every && (step + 1) % c.checkpoint_every == 0)))
            BG_CHECK_GOTO(bg_executor_save_checkpoint(x, c.checkpoint_dir, c.keep), st, out);
        if (r.stop && !last) {
            res.stopped = 1;
            break;
        }
    }
    if (timed > BG_TIMED)
        timed = BG_TIMED;
    if (timed == 0 && res.steps_done > start) /* stopped after the first step: that one */
        timed = 1;
    if (timed > 0) {
        double step_s = bg_median(times, (size_t)timed);
        res.median_step_ms = step_s * 1e3;
        res.tokens_per_s = tokens_mid / step_s;
        res.bubble = 1.0 - bg_median(busy, (size_t)timed) / step_s;
    }
    bg_executor_info(x, &info);
    result_from_info(&info, &res);
    BG_CHECK_GOTO(gather_ranks(x, &info, &res, c.ps > 0), st, out);
    if (c.save_dir && !res.stopped && c.ps > 0) /* the servers write; workers may have died */
        BG_CHECK_GOTO(bg_executor_save_weights(x, c.save_dir), st, out);
    else if (c.save_dir && !res.stopped) /* a stopped run's weights are in its checkpoint, if any */
        BG_CHECK_GOTO(agree(x, bg_executor_save_weights(x, c.save_dir)), st, out); /* said once */
    if (c.trace_path)
        BG_CHECK_GOTO(bg_executor_write_trace(x), st, out);
    *result_p = res;
    res.ranks = NULL; /* the caller's now */
out:
    bg_train_result_free(&res);
    if (x) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s", bg_last_error());
        bg_status_t st2 = bg_executor_destroy(x);
        if (st == BG_OK)
            st = st2;
        else
            bg_error(st, "%s", msg); /* keep the first failure's message */
    }
    bg_model_desc_destroy(desc);
    bg_data_close(data);
    free(times);
    free(busy);
    return st;
}
