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

#include "brigade/checkpoint.h"
#include "brigade/executor.h"
#include "brigade/train.h"
#include "core/check.h"
#include "core/util.h"
#include "core/fileio.h"

void bg_train_config_init(bg_train_config_t *cfg)
{
    *cfg = (bg_train_config_t)BG_TRAIN_CONFIG_INIT;
}

/* The context-parallel degree of the job (0 or a config older than the field: 1). */
static int cp_degree(const bg_train_config_t *c)
{
    return c->size >= offsetof(bg_train_config_t, cp) + sizeof(int) && c->cp > 1 ? c->cp : 1;
}

/* What lengths are rounded up to a multiple of: --seq-multiple, or under
 * sequence parallelism tp (each member holds t / tp positions), times 2 cp
 * under context parallelism (each member holds two of 2 cp chunks). */
static int seq_multiple(const bg_train_config_t *c)
{
    if (c->seq_multiple > 0)
        return c->seq_multiple;
    return (c->model.tp > 1 && c->model.sequence_parallel ? c->model.tp : 1) * (cp_degree(c) > 1 ? 2 * cp_degree(c) : 1);
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

/* How the job reads data_path: "text" or a token format (train.h: data_format). */
/* The format asked for: data_format, or "auto" when none. */
static const char *requested_format(const bg_train_config_t *c)
{
    return c->data_format && *c->data_format ? c->data_format : "auto";
}

static const char *data_format(const bg_train_config_t *c)
{
    const char *f = requested_format(c);
    if (strcmp(f, "auto") != 0 || !c->data_path)
        return f;
    const char *p = c->data_path;
    if (strpbrk(p, ",*?["))
        return "auto"; /* shards: each llmc by its magic, else raw16 */
    if (bg_data_file_is_llmc(p))
        return "llmc";
    size_t n = strlen(p);
    return n >= 4 && strcmp(p + n - 4, ".bin") == 0 ? "raw16" : "text";
}

/* Whether the job reads token files (a position of its own in checkpoints). */
static int token_files(const bg_train_config_t *c)
{
    return c->model.kind != BG_MODEL_MLP && strcmp(data_format(c), "text") != 0;
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
    if (c->model.kind != BG_MODEL_MLP) { /* a token model: GPT or Llama */
        int t = c->seq ? c->seq : c->model.seq_len;
        if (t < 1 || t > c->model.seq_len)
            return bg_error(BG_ERR_INVALID, "sequence length %d must be in [1, %d] (the model's maximum)", t,
                            c->model.seq_len);
        if (!c->data_path || !*c->data_path)
            return bg_error(BG_ERR_INVALID, "a %s needs a text data file",
                            c->model.kind == BG_MODEL_LLAMA ? "Llama" : "GPT");
        const char *f = data_format(c);
        if (strcmp(f, "text") && strcmp(f, "auto") && strcmp(f, "llmc") && strcmp(f, "raw16") && strcmp(f, "raw32"))
            return bg_error(BG_ERR_INVALID, "--data-format %s: expected text, raw16, raw32, llmc or auto", f);
        if (strcmp(f, "text") == 0 && c->model.vocab < 256)
            return bg_error(BG_ERR_INVALID, "vocab %d is too small: the corpus is read as bytes (0..255), so it must be "
                                            ">= 256", c->model.vocab);
    }
    if (!(c->optim.lr > 0))
        return bg_error(BG_ERR_INVALID, "learning rate must be > 0 (got %g)", (double)c->optim.lr);
    bg_lr_schedule_t ls = lr_schedule(c);
    BG_CHECK(bg_lr_check(&ls));
    if (!(c->clip_grad >= 0))
        return bg_error(BG_ERR_INVALID, "--clip-grad must be >= 0 (got %g; 0: no clipping)", c->clip_grad);
    if (c->zero < 0 || c->zero > 3)
        return bg_error(BG_ERR_INVALID, "--zero %d: the sharding stage must be 0, 1, 2 or 3", c->zero);
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
    if (c->eval_every < 0 || c->eval_batches < 0)
        return bg_error(BG_ERR_INVALID, "--eval-every %d --eval-batches %d: both must be >= 0", c->eval_every,
                        c->eval_batches);
    if (!(c->val_fraction >= 0 && c->val_fraction < 1))
        return bg_error(BG_ERR_INVALID, "--val-fraction %g must be in (0, 1)", c->val_fraction);
    if ((c->eval_batches || c->val_fraction > 0 || c->val_path) && !c->eval_every)
        return bg_error(BG_ERR_INVALID, "--eval-batches, --val-fraction and --val-data go with --eval-every N");
    if (c->val_path && c->val_fraction > 0)
        return bg_error(BG_ERR_INVALID, "--val-data and --val-fraction both say where the held-out data is: "
                        "give one");
    if (c->val_path && c->model.kind == BG_MODEL_MLP)
        return bg_error(BG_ERR_INVALID, "--val-data is a file of text or tokens for a GPT or Llama; the MLP's "
                        "held-out samples are drawn from its task (--val-fraction)");
    if (c->eval_every && (c->ps > 0 || c->emulate))
        return bg_error(BG_ERR_UNSUPPORTED, "--eval-every with %s is not built", c->ps > 0 ? "--ps" : "--emulate");
    return BG_OK;
}

int bg_train_seq_len(const bg_train_config_t *c, int64_t step, int mb)
{
    if (c->model.kind == BG_MODEL_MLP)
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

/* The held-out data (eval_every): --val-data, or the last val_fraction of
 * the training data, which keeps the rest. NULL without evaluation. */
static bg_status_t open_held_out(const bg_train_config_t *c, bg_data_t *data, int T, bg_data_t **val_p)
{
    *val_p = NULL;
    if (!c->eval_every)
        return BG_OK;
    if (c->val_path && token_files(c)) /* the training data's format; "auto" looks at the file itself */
        return bg_data_open_tokens(c->val_path, requested_format(c), T, c->batch, c->model.vocab, c->data_seed,
                                   val_p);
    if (c->val_path)
        return bg_data_open_text(c->val_path, T, c->data_seed, val_p);
    return bg_data_hold_out(data, c->val_fraction > 0 ? c->val_fraction : 0.1, val_p);
}

/* The held-out loss: the mean over the positions of the held-out set's
 * batches 0 .. eval_batches-1 (the same at every evaluation, full length),
 * each evaluated with the forward-only program (bg_executor_eval); *ms_p:
 * this rank's wall time for all of them. */
static bg_status_t evaluate(bg_executor_t *x, const bg_train_config_t *c, bg_data_t *val, int T, double *loss_p,
                           double *ms_p)
{
    bg_batch_source_t s = bg_data_source(val);
    s.seq = T;
    double sum = 0, tokens = 0, ms = 0;
    for (int k = 0; k < (c->eval_batches ? c->eval_batches : 4); k++) {
        bg_eval_result_t r;
        BG_CHECK(bg_executor_eval(x, &s, k, &r));
        sum += r.loss * r.tokens;
        tokens += r.tokens;
        ms += r.eval_ms;
    }
    *loss_p = sum / tokens;
    *ms_p = ms;
    return BG_OK;
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

/* The metrics file's first line: what ran (brigade plot titles its chart with
 * it) and, when the host gave them, the run's settings ("config"). */
static void metrics_header(int fd, const bg_train_config_t *c)
{
    char line[256], ps[64] = "";
    if (c->ps > 0) /* parameter servers: only then, so other headers stay as they were */
        snprintf(ps, sizeof ps, ", \"ps\": %d, \"staleness\": %d", c->ps, c->staleness);
    if (c->model.precision == BG_BF16) /* likewise */
        snprintf(ps + strlen(ps), sizeof ps - strlen(ps), ", \"precision\": \"bf16\"");
    int len = snprintf(line, sizeof line,
                       "{\"run\": {\"model\": \"%s\", \"layers\": %d, \"d_model\": %d, \"pp\": %d, \"dp\": %d, "
                       "\"schedule\": \"%s\"%s}",
                       c->model.kind == BG_MODEL_MLP ? "mlp" : c->model.kind == BG_MODEL_LLAMA ? "llama" : "gpt",
                       c->model.layers, c->model.d_model,
                       c->pp > 0 ? c->pp : 1, c->dp > 0 ? c->dp : 1,
                       c->schedule_json ? "custom" : c->schedule ? c->schedule : "1f1b", ps);
    if (len <= 0 || len >= (int)sizeof line)
        return; /* a lost header only loses plot's title */
    bg_status_t st = bg__fileio_write_all(fd, line, (size_t)len, "metrics");
    if (st == BG_OK && c->run_config_json) {
        st = bg__fileio_write_all(fd, ", \"config\": ", 12, "metrics");
        if (st == BG_OK)
            st = bg__fileio_write_all(fd, c->run_config_json, strlen(c->run_config_json), "metrics");
    }
    if (st == BG_OK)
        st = bg__fileio_write_all(fd, "}\n", 2, "metrics");
    if (st != BG_OK)
        bg_error_clear();
}

/* Rank 0: the run's settings as CHECKPOINT_DIR/config.json, replaced whole
 * (written aside, then renamed), so the checkpoints' run can be repeated. */
static bg_status_t write_run_config(const bg_train_config_t *c)
{
    char path[4096], tmp[4200];
    BG_CHECK(bg__fileio_mkdir_p(c->checkpoint_dir));
    snprintf(path, sizeof path, "%s/config.json", c->checkpoint_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return bg_error(BG_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    bg_status_t st = bg__fileio_write_all(fd, c->run_config_json, strlen(c->run_config_json), tmp);
    if (st == BG_OK)
        st = bg__fileio_write_all(fd, "\n", 1, tmp);
    close(fd);
    if (st == BG_OK && rename(tmp, path) != 0)
        st = bg_error(BG_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st != BG_OK)
        unlink(tmp);
    return st;
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

/* One line per rank and step, appended with one write (O_APPEND keeps lines whole). A step that
 * evaluated (val_loss not NaN) adds val_loss (%.9g: the float's bits), val_ppl = exp(val_loss) and
 * val_ms (this rank's time for the evaluation, not in step_ms). The layout (world, pp, dp) is in
 * every line, so a file a job appended to across restarts on other worlds (brigade launch --elastic)
 * shows where it changed. */
static bg_status_t metrics_write(const char *path, int rank, const int layout[3], const bg_step_result_t *r,
                                 size_t predicted, float lr, double val_loss, double val_ms)
{
    char line[1000], gnorm[32] = "null", ps[256] = "", val[128] = "", moe[96] = ""; /* JSON has no NaN or inf */
    if (!isnan(r->moe_aux)) /* a rank with MoE layers: their load-balancing loss and dropped choices */
        snprintf(moe, sizeof moe, ", \"moe_aux\": %.9g, \"moe_dropped\": %lld", r->moe_aux, (long long)r->moe_dropped);
    if (!isnan(val_loss))
        snprintf(val, sizeof val, ", \"val_loss\": %.9g, \"val_ppl\": %.9g, \"val_ms\": %.3f", val_loss,
                 exp(val_loss), val_ms);
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
                       "\"bubble\": %.4f, \"bytes_sent\": %llu, \"peak_bytes\": %zu, \"predicted_bytes\": %zu, "
                       "\"heap_bytes\": %s, \"grad_norm\": %s, \"lr\": %.9g, \"world\": %d, \"pp\": %d, \"dp\": %d%s%s%s}\n",
                       rank, (long long)r->step, r->loss, r->tokens_per_s, r->step_ms, r->bubble,
                       (unsigned long long)r->bytes_sent, r->peak_bytes, predicted, heap, gnorm, (double)lr, layout[0],
                       layout[1], layout[2], ps, moe, val);
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

/* After step `step` (1-based, run at rate lr): the evaluation when one is due (every eval_every steps,
 * the last, a stop: the same steps on every rank, since r->stop agrees), then on_step and the metrics
 * line. */
static bg_status_t report_step(bg_executor_t *x, const bg_train_config_t *c, bg_data_t *val, int T, int rank,
                               int step, float lr, const bg_step_result_t *r, bg_train_result_t *res)
{
    double vl = NAN, vms = 0;
    if (val && (step % c->eval_every == 0 || step == c->steps || r->stop))
        BG_CHECK(evaluate(x, c, val, T, &vl, &vms));
    if (!isnan(vl))
        res->val_loss = vl;
    if (c->on_step) {
        bg_step_info_t si = {step, c->steps, r->loss, r->step_ms, r->tokens_per_s, rank, r->grad_norm, (double)lr, vl};
        c->on_step(&si, c->on_step_arg);
    }
    if (c->metrics_path) {
        int layout[3] = {bg_comm_size(bg_executor_comm(x)), c->pp > 0 ? c->pp : 1, c->dp > 0 ? c->dp : 1};
        bg_executor_info_t info;
        bg_executor_info(x, &info);
        BG_CHECK(metrics_write(c->metrics_path, rank, layout, r, info.predicted_bytes, lr, vl, vms));
    }
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
    p.ep = c->model.ep > 0 ? c->model.ep : 1; /* and MoE layers of this one */
    p.cp = cp_degree(c);
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
    p.clip_grad = c->clip_grad;
    p.data_seed = c->data_seed;
    p.offload = c->offload;
    p.offload_dir = c->offload_dir;
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

/* --resume / --resume-from: the newest valid checkpoint (or the one named),
 * said through on_resume; token files continue at its data position. */
static bg_status_t resume_job(const bg_train_config_t *c, bg_executor_t *x, bg_data_t *data, int rank)
{
    bg_resume_params_t rp = BG_RESUME_PARAMS_INIT;
    rp.root = c->checkpoint_dir;
    rp.path = c->resume_from;
    rp.strict = c->resume_strict;
    bg_resume_result_t *rr = malloc(sizeof(*rr));
    BG_ALLOC_CHECK(rr, sizeof(*rr), "resume result");
    bg_status_t st = bg_executor_resume_with(x, &rp, rr);
    /* the executor leaves "nothing to resume" to its host; --resume-strict
     * promises to fail when no checkpoint is valid, a missing or empty
     * directory included */
    if (st == BG_OK && c->resume_strict && !rr->found)
        st = bg_error(BG_ERR_NOT_FOUND, "--resume-strict: no valid checkpoint in %s (%s)", c->checkpoint_dir,
                      rr->invalid ? rr->invalid_what : "no step-N directory");
    if (st == BG_OK && rr->found && token_files(c)) {
        bg_checkpoint_info_t ci; /* token files: where its data continues (sequences) */
        st = bg_checkpoint_read_info(rr->path, &ci);
        if (st == BG_OK)
            bg_data_set_position(data, ci.step, (uint64_t)ci.data_position);
        bg_checkpoint_info_clear(&ci);
    }
    if (st == BG_OK && c->on_resume)
        c->on_resume(rr, c->resume_from ? c->resume_from : c->checkpoint_dir, rank, c->on_step_arg);
    free(rr);
    return st;
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
    bg_data_t *data = NULL, *val = NULL;
    bg_executor_t *x = NULL;
    double *times = NULL, *busy = NULL;
    bg_train_result_t res = {0};
    bg_executor_info_t info;
    res.numa_node = -1;
    res.val_loss = NAN;
    int tokens_in = c.model.kind != BG_MODEL_MLP;

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
    if (token_files(&c))
        fst = bg_data_open_tokens(c.data_path, data_format(&c), T, c.batch, c.model.vocab, c.data_seed, &data);
    else if (tokens_in)
        fst = bg_data_open_text(c.data_path, T, c.data_seed, &data);
    else
        fst = bg_data_synthetic(mp->features, bg_model_desc_classes(desc), c.data_seed, &data);
    if (fst == BG_OK)
        fst = open_held_out(&c, data, T, &val);
    if (fst == BG_OK && c.save_dir)
        fst = bg_check_replaceable_dir(c.save_dir, ".safetensors");
    if (fst == BG_OK && c.checkpoint_dir && c.run_config_json && bg_executor_rank(x) == 0)
        fst = write_run_config(&c);
    BG_CHECK_GOTO(agree(x, fst), st, out);
    src.data = bg_data_source(data);
    bg_executor_info(x, &info);
    res.rank = info.rank;
    res.world = info.world;
    res.numa_node = info.numa_node;
    if (c.metrics_path)
        BG_CHECK_GOTO(metrics_open(&c, x), st, out);
    if (c.resume_from || (c.checkpoint_dir && c.resume))
        BG_CHECK_GOTO(resume_job(&c, x, data, info.rank), st, out);
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
        int last = step + 1 == c.steps;
        BG_CHECK_GOTO(report_step(x, &c, val, T, info.rank, step + 1, (float)lr, &r, &res), st, out);
        if (c.checkpoint_dir && (r.stop || last || (c.checkpoint_every && (step + 1) % c.checkpoint_every == 0))) {
            if (token_files(&c)) /* the sequences taken */
                bg_executor_set_data_position(x, (int64_t)bg_data_position(data, step + 1));
            BG_CHECK_GOTO(bg_executor_save_checkpoint(x, c.checkpoint_dir, c.keep), st, out);
        }
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
    if (info.predicted_bytes && res.peak_bytes > info.predicted_bytes) /* the memory model missed a buffer */
        bg_log(BG_LOG_WARN, "train", "rank %d: the allocator's peak, %zu bytes, is above the predicted %zu (by %zu)",
               info.rank, res.peak_bytes, info.predicted_bytes, res.peak_bytes - info.predicted_bytes);
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
    bg_data_close(val);
    free(times);
    free(busy);
    return st;
}
