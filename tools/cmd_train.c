/* tools/cmd_train.c: `brigade train`: parse flags into a bg_train_config_t,
 * print progress, and print the summary. */
#include <ctype.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "brigade/partitioner.h"
#include "brigade/transport.h"
#include "brigade/train.h"
#include "tools/cli.h"
#include "tools/train_config.h"

#ifndef BG_DEFAULT_DATA
#define BG_DEFAULT_DATA "data/kjv.txt"
#endif

static void usage(FILE *f)
{
    fprintf(f,
            "usage: brigade train [--config run.json] [options]\n"
            "\n"
            "  --config FILE          a JSON object of flags: keys are the long flag names without dashes,\n"
            "                         values strings, numbers, true/false (flags without value) or arrays\n"
            "                         (--split); flags on the command line override it. The run's effective\n"
            "                         flags go to the metrics header (\"config\") and CHECKPOINT_DIR/config.json,\n"
            "                         which --config takes back to repeat the run (docs/training.md)\n"
            "\n"
            "model:\n" BG_CLI_MODEL_HELP
            "training:\n"
            "  --batch N              global batch in sequences per step (default 8)\n"
            "  --microbatches N       microbatches per step, divides batch (default 4)\n"
            "  --steps N              optimizer steps (default 20)\n"
            "  --lr X                 peak learning rate (default 1e-3)\n"
            "  --lr-schedule KIND     constant|cosine|linear|wsd (default constant): the rate after the warm-up;\n"
            "                         cosine and linear fall from --lr to --min-lr at --decay-steps, wsd holds\n"
            "                         --lr then falls linearly over the last --wsd-decay of the steps\n"
            "                         (docs/training.md gives the closed forms)\n"
            "  --warmup N             steps of linear warm-up from lr/N to --lr (default 0)\n"
            "  --min-lr X             final rate of the decay (default 0)\n"
            "  --decay-steps N        step where the decay reaches --min-lr (default --steps)\n"
            "  --wsd-decay F          wsd: fraction of the steps after the warm-up spent decaying (default 0.2)\n"
            "  --clip-grad X          clip by global norm: scale every gradient by min(1, X / (norm + 1e-6))\n"
            "                         before the update, norm over the whole model (every layout and --ps;\n"
            "                         grad_norm/gnorm stay the norm before clipping; default 0: none)\n"
            "  --optimizer adamw|sgd  (default adamw; sgd uses momentum 0.9)\n"
            "  --weight-decay X       on weight matrices and embeddings (default 0)\n"
            "  --data FILE            GPT data: a text corpus (bytes are tokens; default %s) or token\n"
            "                         files: one, a comma list or a glob pattern of shards (quote it)\n"
            "  --data-format F        text|llmc|raw16|raw32|auto (default auto: llmc by its magic, raw16 for\n"
            "                         *.bin or several shards, else text); llmc is llm.c's 1 KiB header +\n"
            "                         uint16 tokens, raw16/raw32 headerless arrays (nanoGPT's train.bin);\n"
            "                         every token is checked < --vocab (docs/training.md)\n"
            "  --data-seed N          order of the data (default 1)\n"
            "  --threads N            compute threads (default: BRIGADE_NUM_THREADS or all cores)\n"
            "  --recompute            keep only each stage's input and output per microbatch; recompute\n"
            "                         the rest in the backward (less memory, one more forward)\n"
            "  --backend NAME         kernel backend (default cpu; brigade info lists them)\n"
            "evaluation (a forward-only pipeline program: no backward, weights untouched):\n"
            "  --eval-every N         held-out loss and perplexity after every N steps and after the last\n"
            "                         (progress line, --metrics val_loss and val_ppl, brigade plot)\n"
            "  --eval-batches M       global batches per evaluation, the same ones each time (default 4)\n"
            "  --val-fraction F       hold out the last F of the corpus (default 0.1; training reads the\n"
            "                         rest; MLP: other samples of its task); nothing is held out without\n"
            "                         --eval-every\n"
            "  --val-data FILE        GPT, Llama: a held-out file in the training data's format instead (the\n"
            "                         data are all training data); token files must have one\n"
            "parallel (run under brigade launch -n PP*DP*CP*TP, mpirun or srun):\n"
            "  --pp N                 pipeline stages (default 1); auto: the ranks over dp x cp x tp\n"
            "  --dp N                 data-parallel replicas (default 1); auto: the ranks over pp x cp x tp (a job\n"
            "                         that brigade launch --elastic restarts on fewer ranks re-plans with it)\n"
            "  --tp N                 tensor-parallel degree (default 1): every layer's weights split over N\n"
            "                         ranks (Megatron-style: heads, MLP hidden, vocabulary); ranks are\n"
            "                         laid out tp fastest, then dp, then pp\n"
            "  --cp N                 context-parallel degree (default 1): every sequence split over N ranks\n"
            "                         (2N chunks, rank i holding i and 2N-1-i; --seq divisible by 2N);\n"
            "                         attention as a ring passing key/value blocks; GPT and Llama (not\n"
            "                         MoE), with --pp, --dp, --tp and --zero;\n"
            "                         ranks are laid out tp fastest, then cp, dp, pp\n"
            "  --sequence-parallel    GPT with --tp > 1: split the layernorms, residuals and activations\n"
            "                         between blocks along the sequence (--seq divisible by --tp): less\n"
            "                         activation memory, a gather and a reduce-scatter per block half\n"
            "                         instead of one sum (docs/layers.md)\n"
            "  --schedule NAME        gpipe|1f1b|interleaved|zb-h1|zb-h2|zbv|zb-interleaved|dualpipev|dualpipe\n"
            "                         (default 1f1b)\n"
            "  --chunks V             model chunks per pipeline rank (interleaved, zb-interleaved;\n"
            "                         default: the schedule's)\n"
            "  --schedule-json FILE   run this program instead of a generated schedule: any program the\n"
            "                         validator accepts, in the JSON of brigade schedule --json, for --pp\n"
            "                         ranks and --microbatches (docs/schedules.md)\n"
            "  --zero 0|1|2|3         shard across the dp replicas of a stage: 1 the optimizer state, 2 also the\n"
            "                         gradients, 3 also the parameters (each layer's gathered before it computes,\n"
            "                         BRIGADE_ZERO_PREFETCH buckets ahead, default 1; docs/data_parallel.md;\n"
            "                         default 0: none)\n"
            "  --ps S                 parameter servers: ranks 0..S-1 hold the parameters and optimizer state\n"
            "                         (whole tensors each), the other ranks are workers, each a replica: one\n"
            "                         rank, or with --pp P a pipeline of P consecutive ranks (N-S a multiple\n"
            "                         of P; not dualpipe, not --tp); brigade launch goes on when a worker\n"
            "                         dies (it tolerates ranks S..N-1; docs/parameter_server.md)\n"
            "  --staleness K          with --ps: a worker may compute step t on parameters of step t-K\n"
            "                         (default 0: synchronous, the weights of --dp (N-S)/P)\n"
            "  --device-mem SIZE[,SIZE...]  cap on each rank's backend memory (24G, or one per rank for\n"
            "                         heterogeneous devices), enforced by its allocator on every backend, the\n"
            "                         CPU's included: an allocation past it fails naming the stage, buffer and\n"
            "                         bytes; the summary prints each rank's peak beside the prediction\n"
            "  --offload WHAT[,WHAT]  keep outside the backend's memory (not counted against --device-mem):\n"
            "                         optimizer: the optimizer state (with --zero 1|2 each replica's shard) in\n"
            "                         host memory, or in files under --offload-dir; the same weights bit for\n"
            "                         bit (docs/offload.md). params (with --zero 3, dp >= 2): each replica's\n"
            "                         parameter shard there; its gathers read from it. On a device backend\n"
            "                         (cuda) the optimizer's step runs on the host: gradients and parameters\n"
            "                         copied to pinned memory, the CPU's AdamW, parameters copied back on the\n"
            "                         copy stream; with optimizer,params the shard stays on the host (pinned),\n"
            "                         stepped in place, each gather uploading it on the copy stream (params\n"
            "                         there needs optimizer). activations: each microbatch's stashed\n"
            "                         activations in host memory (or --offload-dir) while it waits for its\n"
            "                         backward (not on the last stage; BRIGADE_OFFLOAD_ACT_AHEAD; the\n"
            "                         prediction counts them off the device: it is the measured peak)\n"
            "  --offload-dir DIR      with --offload: memory-mapped files there (created if missing; a full disk\n"
            "                         fails at start naming the file and bytes; removed at once, nothing left)\n"
            "  --split A,B,...        layers per (virtual) stage, in model order; the embedding, each block,\n"
            "                         ln_f and the head count as one layer each (a GPT of N blocks has N+3).\n"
            "                         Default: as even as possible in layers, which is uneven in FLOPs;\n"
            "                         brigade plan finds a balanced split\n"
            "  --seq-min N            GPT: vary each microbatch's length in [N, --seq]\n"
            "  --seq-multiple Q       with --seq-min: round each length up to a multiple of Q (Q divides --seq;\n"
            "                         default 1, or tp under --sequence-parallel)\n"
            "  --trace FILE           Chrome/Perfetto trace of every op on every rank\n"
            "  --plan FILE            run a plan from brigade plan --json: its model, layout (sequence\n"
            "                         parallelism included), schedule, batch, microbatches and split\n"
            "                         (other flags: data, steps, output)\n"
            "  --emulate PROFILE      emulated scale: each compute instruction sleeps its stages' time in\n"
            "                         PROFILE (brigade profile --json, the same model) instead of running;\n"
            "                         real executor, transport and message sizes; the weights do not change\n"
            "                         (with --ps the servers' update is free too; the pushes and pulls are real)\n"
            "  --emulate-scale X      multiply the profiled times by X (default 1)\n"
            "checkpoints:\n"
            "  --checkpoint-dir DIR   write checkpoints (weights, optimizer state, manifest) under DIR\n"
            "  --checkpoint-every N   every N steps (and always after the last step)\n"
            "  --keep K               keep the newest K complete checkpoints (default: all)\n"
            "  --resume               continue from the newest valid checkpoint in DIR (any layout); an\n"
            "                         invalid newer one (corrupt, partial) is reported and skipped; none:\n"
            "                         start at step 0 (said on stderr)\n"
            "  --resume-strict        with --resume: fail if the newest checkpoint is invalid, or none is valid\n"
            "  --resume-from PATH     continue from this checkpoint directory (DIR/step-N); it must be valid\n"
            "  SIGTERM or Ctrl-C stops at the next step boundary: with --checkpoint-dir it writes a\n"
            "  checkpoint first; the exit status is 143 or 130 (0 only for a finished run); --save is\n"
            "  written only by a finished run. A second Ctrl-C stops at once.\n"
            "output:\n"
            "  --metrics FILE         one JSON object per step: step, loss, tokens_per_s, step_ms,\n"
            "                         bubble, bytes_sent, peak_bytes (the allocator's high-water mark),\n"
            "                         predicted_bytes (the rank's predicted peak), heap_bytes, grad_norm,\n"
            "                         lr, world, pp, dp\n"
            "                         (and val_loss, val_ppl, val_ms after an evaluation)\n"
            "  --save DIR             final weights: DIR/model.safetensors from one process; with --pp > 1\n"
            "                         one file per stage, DIR/model-stageNNN.safetensors (brigade compare\n"
            "                         and generate read either form); replaced as a whole when every\n"
            "                         rank has written (a failed save leaves the previous one), so DIR\n"
            "                         must hold nothing but weights\n"
            "  --log-every N          progress line every N steps when stderr is not a terminal\n"
            "                         (default: about 50 lines per run); a terminal gets one updating line\n"
            "  --quiet                print only the summary\n",
            BG_DEFAULT_DATA);
}

typedef struct {
    int quiet, tty, log_every;
    double t_start;     /* bg_now() when the job started (setup included) */
    double t_first;     /* start of the first step this run took, 0 before it */
    int first_step;     /* number of that step */
    const char *warning; /* printed by rank 0 with its first step (one line per job, not per rank) */
    char val[64];        /* "  val L  ppl P" of the last evaluation, "" before one */
    int pp, dp;         /* this run's layout, compared with a resumed checkpoint's */
} progress_t;

/* h:mm:ss, or m:ss under an hour */
static const char *hms(char *buf, size_t n, double s)
{
    long t = s > 0 && s < 1e9 ? (long)(s + 0.5) : 0;
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
    return buf;
}

/* SIGTERM (preemption) and SIGINT: stop at the next step boundary (after a
 * checkpoint when there is a checkpoint directory) and exit 128 + the
 * signal; a second signal ends the process at once, as it would have. */
static volatile int bg__stop;
static volatile sig_atomic_t bg__stop_sig;
static void on_stop_signal(int sig)
{
    if (bg__stop) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    bg__stop_sig = sig;
    bg__stop = 1;
}

/* What --resume did, said once (rank 0) before the first step. */
static void on_resume(const bg_resume_result_t *r, const char *where, int rank, void *arg)
{
    const progress_t *p = arg;
    if (rank != 0)
        return;
    if (r->invalid && r->found)
        fprintf(stderr, "brigade train: skipped %d invalid checkpoint%s newer than %s; the newest: %s\n", r->invalid,
                r->invalid == 1 ? "" : "s", r->path, r->invalid_what);
    if (r->found && r->pp > 0 && (r->pp != p->pp || (r->dp ? r->dp : 1) != p->dp))
        /* another layout (brigade launch --elastic after a lost host, or by hand): say what changed */
        fprintf(stderr, "resuming from %s (written by pp=%d dp=%d) at step %lld: layout pp=%d dp=%d -> pp=%d dp=%d\n",
                r->path, r->pp, r->dp ? r->dp : 1, (long long)r->step, r->pp, r->dp ? r->dp : 1, p->pp, p->dp);
    else if (r->found && r->pp > 0)
        fprintf(stderr, "resuming from %s (written by pp=%d dp=%d) at step %lld\n", r->path, r->pp, r->dp ? r->dp : 1,
                (long long)r->step);
    else if (r->found)
        fprintf(stderr, "resuming from %s (written by %d rank%s)\n", r->path, r->world, r->world == 1 ? "" : "s");
    else if (r->invalid)
        fprintf(stderr, "brigade train: warning: no valid checkpoint in %s (%d invalid; the newest: %s): starting at "
                "step 0 (--resume-strict refuses instead)\n", where, r->invalid, r->invalid_what);
    else
        fprintf(stderr, "no checkpoint in %s: starting at step 0\n", where);
}

/* --pp auto / --dp auto: that degree is the number of ranks the job was
 * started with (from the environment, as the transport reads it) over the
 * product of the other degrees, so that a job restarted on fewer ranks
 * (brigade launch --elastic) re-plans its layout; --resume reshards the
 * checkpoint onto it. 0, or 2 after the message. */
static int auto_layout(const char *cmd, int pp_auto, int has_plan, bg_train_config_t *c)
{
    const char *flag = pp_auto ? "--pp auto" : "--dp auto";
    if (has_plan)
        return bg_cli_fail(cmd, "%s: a --plan fixes the layout; leave one of them out", flag);
    if (c->ps)
        return bg_cli_fail(cmd, "%s: --ps sets the workers from the number of ranks itself; give --pp and --dp as "
                           "numbers", flag);
    int world = 1;
    if (bg_comm_env_world(&world) != BG_OK)
        return bg_cli_fail(cmd, "%s", bg_last_error());
    int cp = c->cp > 0 ? c->cp : 1, tp = c->model.tp > 0 ? c->model.tp : 1; /* a stage replica's ranks: cp x tp */
    int other = (pp_auto ? (c->dp > 0 ? c->dp : 1) : (c->pp > 0 ? c->pp : 1)) * cp * tp;
    char cps[24] = "";
    if (cp > 1)
        snprintf(cps, sizeof cps, " x cp %d", cp);
    if (world % other)
        return bg_cli_fail(cmd, "%s: the job has %d rank%s, not a multiple of %s %d%s x tp %d", flag, world,
                           world == 1 ? "" : "s", pp_auto ? "dp" : "pp", other / (cp * tp), cps, tp);
    *(pp_auto ? &c->pp : &c->dp) = world / other;
    return 0;
}

/* Whether an error is a peer's abort ("rank Q stopped on an error", the
 * executor's and bg_train's form): *peer_p = Q. A peer that died (no message
 * of its own) is not one: its survivors report it. */
static int peer_failed(const char *msg, int *peer_p)
{
    const char *p = strstr(msg, " stopped on an error");
    if (!p)
        return 0;
    const char *q = p;
    while (q > msg && isdigit((unsigned char)q[-1]))
        q--;
    if (q == p || q - msg < 5 || strncmp(q - 5, "rank ", 5) != 0)
        return 0;
    *peer_p = atoi(q);
    return 1;
}

/* The ranks' figures of a parallel run as one table, in rank order (stderr, like the progress):
 * activation memory and stashed microbatches measured, and as predicted ("sim": the activation bytes as
 * brigade plan predicts them, the stashed microbatches as the simulator counts them). */
static void print_ranks(const bg_train_result_t *r)
{
    fprintf(stderr, "rank  pp  dp      params  peak MiB   act MiB  act sim  stashed  stash sim  bubble  mem sim\n");
    for (int i = 0; i < r->nranks; i++) {
        const bg_train_rank_t *k = &r->ranks[i];
        fprintf(stderr, "%4d %3d %3d %11zu %9.2f %9.3f %8.3f %8d %10d %6.1f%% %8.2f\n", k->rank, k->pp_rank,
                k->dp_rank, k->params, k->peak_bytes / 1048576.0, k->peak_act_bytes / 1048576.0,
                k->predicted_act_bytes / 1048576.0, k->peak_stashed, k->predicted_stashed, 100 * k->bubble,
                k->predicted_bytes / 1048576.0);
    }
}

static void on_step(const bg_step_info_t *i, void *arg)
{
    progress_t *p = arg;
    if (i->rank != 0)
        return;
    double now = bg_now();
    if (!p->t_first) {
        p->t_first = now - i->step_ms / 1e3;
        p->first_step = i->step;
        if (p->warning)
            fprintf(stderr, "%s\n", p->warning);
    }
    if (p->quiet)
        return;
    /* ETA from the mean step time of this run so far (a single step's time jitters) */
    double mean_s = (now - p->t_first) / (i->step - p->first_step + 1);
    char el[32], eta[32];
    hms(el, sizeof el, now - p->t_start);
    hms(eta, sizeof eta, (i->steps - i->step) * mean_s);
    /* an evaluation's figures stay on the line until the next one (terminal), or get a line (log) */
    int evaluated = !isnan(i->val_loss);
    if (evaluated)
        snprintf(p->val, sizeof p->val, p->tty ? "  val %.4f  ppl %.2f" : " val %.4f ppl %.2f", i->val_loss,
                 exp(i->val_loss));
    if (p->tty) {
        fprintf(stderr, "\rstep %d/%d  loss %.4f  gnorm %.3g  lr %.2e%s  %.0f tok/s  %.1f ms/step  elapsed %s  ETA %s   ",
                i->step, i->steps, i->loss, i->grad_norm, i->lr, p->val, i->tokens_per_s, i->step_ms, el, eta);
        if (i->step == i->steps)
            fputc('\n', stderr);
    } else {
        int every = p->log_every ? p->log_every : i->steps > 50 ? i->steps / 50 : 1;
        if (i->step % every == 0 || i->step == i->steps || i->step == p->first_step || evaluated)
            fprintf(stderr, "step %d/%d loss %.4f gnorm %.3g lr %.2e%s tokens/s %.0f step_ms %.1f elapsed %s eta %s\n",
                    i->step, i->steps, i->loss, i->grad_norm, i->lr, evaluated ? p->val : "", i->tokens_per_s,
                    i->step_ms, el, eta);
    }
}

/* The split against the model's layers. A --split that does not fit the
 * model is a usage error (2, message printed; the executor would say the
 * same, once per rank). A split far from balanced in FLOPs (the layers' own
 * counts; a GPT's ln_f and head are much lighter than a block) makes the
 * other stages wait for the heaviest: a warning line in buf when the
 * heaviest virtual stage does more than 1.5x the mean, else buf[0] = 0.
 * Silent on other invalid configurations: bg_train reports those. */
static int split_check(const char *cmd, const bg_train_config_t *c, char *buf, size_t n)
{
    buf[0] = 0;
    int pp = c->pp > 0 ? c->pp : 1, chunks = 1, copies = 1, rc = 0;
    if (pp == 1)
        return 0;
    bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
    bg_schedule_t *sched = NULL;
    if (c->schedule_json) { /* checked by the caller; chunks came from the file */
        chunks = c->chunks;
        if (bg_schedule_from_json_file(c->schedule_json, &sched) == BG_OK) /* and its model copies */
            copies = bg_schedule_copies(sched);
    } else if (bg_schedule_kind_parse(c->schedule ? c->schedule : "1f1b", &gp.kind) == BG_OK) {
        gp.stages = pp, gp.microbatches = c->microbatches, gp.chunks = c->chunks;
        if (bg_schedule_generate(&gp, &sched) == BG_OK)
            chunks = bg_schedule_chunks(sched), copies = bg_schedule_copies(sched);
    }
    if (!sched && !c->schedule_json) { /* the schedule's own error comes from bg_train */
        bg_error_clear();
        return 0;
    }
    bg_schedule_free(sched);
    bg_model_desc_t *d = NULL;
    bg_layer_profile_t *prof = NULL;
    int L = 0, S = pp * chunks / copies; /* stages of the model (dualpipe: each held by two ranks) */
    if (bg_model_build(&c->model, &d) != BG_OK)
        goto out;
    L = bg_model_desc_num_layers(d);
    if (c->nsplit && c->nsplit != S) {
        if (copies > 1)
            rc = bg_cli_fail(cmd, "--split has %d entries but there are %d model stages (pp %d x %d chunks hold %d "
                                  "copies of each)", c->nsplit, S, pp, chunks, copies);
        else
            rc = bg_cli_fail(cmd, "--split has %d entries but there are %d pipeline stages (pp %d x %d chunks)",
                             c->nsplit, S, pp, chunks);
        goto out;
    }
    long long sum = 0;
    for (int k = 0; k < c->nsplit; k++) {
        if (c->split[k] < 1) {
            rc = bg_cli_fail(cmd, "--split entry %d is %d; every stage needs at least one layer", k, c->split[k]);
            goto out;
        }
        sum += c->split[k];
    }
    if (c->nsplit && sum != L) {
        rc = bg_cli_fail(cmd, "--split sums to %lld layers but the model has %d (brigade profile lists them)", sum, L);
        goto out;
    }
    if (S > L) {
        if (c->schedule_json)
            rc = bg_cli_fail(cmd, "%s is a program for %d pipeline stages (p %d x %d chunks) but the model has only %d "
                                  "layers", c->schedule_json, S, pp, chunks, L);
        else
            rc = bg_cli_fail(cmd, "%d pipeline stages but the model has only %d layers", S, L);
        goto out;
    }
    prof = calloc((size_t)L, sizeof(*prof));
    if (!prof || bg_model_profile(d, 1, c->seq > 0 ? c->seq : c->model.seq_len, prof, L, &L) != BG_OK)
        goto out;
    double total = 0, max = 0, fl[4096];
    int split[4096], at = 0, heavy = 0;
    if (S > 4096)
        goto out;
    for (int k = 0; k < S; k++) {
        split[k] = c->nsplit ? c->split[k] : L / S + (k < L % S);
        fl[k] = 0;
        for (int l = at; l < at + split[k] && l < L; l++)
            fl[k] += prof[l].fwd_flops + prof[l].bwd_flops;
        at += split[k];
        total += fl[k];
        if (fl[k] > max)
            max = fl[k], heavy = k;
    }
    if (!(max > 1.5 * total / S))
        goto out;
    int w = snprintf(buf, n,
                     "brigade train: warning: the %s ", c->nsplit ? "--split" : "default split (even in layers)");
    for (int k = 0; k < S && w > 0 && (size_t)w < n; k++)
        w += snprintf(buf + w, n - (size_t)w, "%s%d", k ? "," : "", split[k]);
    if (w > 0 && (size_t)w < n)
        snprintf(buf + w, n - (size_t)w,
                 " is unbalanced in FLOPs: stage %d does %.1fx the mean of the %d stages and the others wait for "
                 "it. Embedding, blocks, ln_f and head are one layer each; brigade plan --devices %d --mem SIZE "
                 "--pp %d (with the same model flags) prints a balanced --split.",
                 heavy, max / (total / S), S, pp * (c->dp > 0 ? c->dp : 1), pp);
out:
    free(prof);
    bg_model_desc_destroy(d);
    bg_error_clear();
    return rc;
}

/* The model to train with a plan: the flags' model when model flags were
 * given and it is the plan's (bg_plan_check_model names the difference),
 * else the model the plan was made for, rebuilt from its description (only
 * a built-in builder's model can be: brigade train runs no other). 0, or a
 * message was printed. */
static int plan_model(const char *cmd, const char *plan_path, const bg_plan_t *plan, int model_flags,
                      bg_model_config_t *model)
{
    bg_model_desc_t *d = NULL;
    bg_status_t st = model_flags ? bg_model_build(model, &d) : bg_model_desc_from_json(bg_plan_model(plan), &d);
    if (st == BG_OK && model_flags && bg_plan_check_model(plan, d) != BG_OK) {
        fprintf(stderr, "brigade train: %s was made for another model than the flags describe: %s\n", plan_path,
                bg_last_error());
        bg_model_desc_destroy(d);
        return 2;
    }
    if (st == BG_OK && !model_flags)
        st = bg_model_desc_builder(d, model);
    bg_model_desc_destroy(d);
    if (st != BG_OK)
        return bg_cli_fail(cmd, "%s: %s", plan_path, bg_last_error());
    return 0;
}

/* --offload optimizer|activations|params[,...] into BG_OFFLOAD_* bits (the library says what is not built). */
static int offload_flag(const char *cmd, const char *arg, int *bits_p)
{
    static const char *const words[] = {"optimizer", "activations", "params", NULL};
    char buf[256];
    if (snprintf(buf, sizeof buf, "%s", arg) >= (int)sizeof buf)
        return bg_cli_fail(cmd, "--offload %s: too long", arg);
    int bits = 0;
    for (char *save = NULL, *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        int k = bg_cli_choice(cmd, "--offload", w, words);
        if (k < 0)
            return 2;
        bits |= k == 0 ? BG_OFFLOAD_OPTIMIZER : k == 1 ? BG_OFFLOAD_ACTIVATIONS : BG_OFFLOAD_PARAMS;
    }
    if (!bits)
        return bg_cli_fail(cmd, "--offload needs optimizer, activations or params");
    *bits_p = bits;
    return 0;
}

int bg_cmd_train(int argc, char **argv)
{
    const char *cmd = "train";
    bg_train_config_t c;
    static int split[4096];
    static uint64_t devmem64[4096];
    static size_t devmem[4096];
    const char *plan_path = NULL;
    bg_plan_t *plan = NULL;
    int model_flags = 0; /* a model flag was given (checked against a plan's model) */
    bg_train_config_init(&c);
    c.data_path = BG_DEFAULT_DATA;
    progress_t prog = {.tty = isatty(2), .t_start = bg_now()};
    char warning[1024];
    int zero_flag = 0; /* --zero given (checked against a plan's) */
    int sequence_parallel = 0; /* --sequence-parallel (also kept under --plan) */
    int precision_flag = 0;    /* --precision given (checked against a plan's) */
    int auto_axis = 0;         /* O_PP or O_DP: that degree is the world size over the others' product */
    enum { O_BATCH = 256, O_MB, O_STEPS,
           O_LR, O_OPT, O_WD, O_DATA, O_DSEED, O_THREADS, O_BACKEND, O_METRICS, O_SAVE, O_QUIET, O_HELP, O_PP, O_DP, O_SCHED, O_CHUNKS, O_SPLIT, O_SEQMIN, O_TRACE, O_CKDIR, O_CKEVERY, O_KEEP, O_RESUME, O_PLAN, O_RECOMP, O_LOGEVERY, O_RESUME_STRICT, O_RESUME_FROM, O_SCHED_JSON, O_ZERO, O_TP, O_CP, O_EMULATE, O_EMULATE_SCALE, O_SP, O_PS, O_STALENESS, O_SEQMULT, O_DEVMEM,
           O_LRSCHED, O_WARMUP, O_MINLR, O_DECAY, O_WSD, O_DFORMAT, O_CLIP,
           O_EVAL_EVERY, O_EVAL_BATCHES, O_VAL_FRACTION, O_VAL_DATA, O_OFFLOAD, O_OFFLOAD_DIR };
    static const struct option opts[] = {
        BG_CLI_MODEL_OPTIONS,
        {"batch", required_argument, 0, O_BATCH},     {"microbatches", required_argument, 0, O_MB},
        {"steps", required_argument, 0, O_STEPS},     {"lr", required_argument, 0, O_LR},
        {"optimizer", required_argument, 0, O_OPT},   {"weight-decay", required_argument, 0, O_WD},
        {"data", required_argument, 0, O_DATA},       {"data-seed", required_argument, 0, O_DSEED},
        {"threads", required_argument, 0, O_THREADS}, {"backend", required_argument, 0, O_BACKEND},
        {"metrics", required_argument, 0, O_METRICS}, {"save", required_argument, 0, O_SAVE},
        {"quiet", no_argument, 0, O_QUIET},           {"help", no_argument, 0, O_HELP},
        {"pp", required_argument, 0, O_PP},           {"dp", required_argument, 0, O_DP},
        {"tp", required_argument, 0, O_TP},           {"cp", required_argument, 0, O_CP},
        {"sequence-parallel", no_argument, 0, O_SP},
        {"schedule", required_argument, 0, O_SCHED},  {"chunks", required_argument, 0, O_CHUNKS},
        {"schedule-json", required_argument, 0, O_SCHED_JSON},
        {"emulate", required_argument, 0, O_EMULATE}, {"emulate-scale", required_argument, 0, O_EMULATE_SCALE},
        {"split", required_argument, 0, O_SPLIT},     {"seq-min", required_argument, 0, O_SEQMIN},
        {"seq-multiple", required_argument, 0, O_SEQMULT},
        {"trace", required_argument, 0, O_TRACE},
        {"checkpoint-dir", required_argument, 0, O_CKDIR}, {"checkpoint-every", required_argument, 0, O_CKEVERY},
        {"keep", required_argument, 0, O_KEEP},       {"resume", no_argument, 0, O_RESUME},
        {"plan", required_argument, 0, O_PLAN},       {"recompute", no_argument, 0, O_RECOMP},
        {"log-every", required_argument, 0, O_LOGEVERY},
        {"resume-strict", no_argument, 0, O_RESUME_STRICT}, {"resume-from", required_argument, 0, O_RESUME_FROM},
        {"zero", required_argument, 0, O_ZERO},
        {"ps", required_argument, 0, O_PS},           {"staleness", required_argument, 0, O_STALENESS},
        {"device-mem", required_argument, 0, O_DEVMEM},
        {"offload", required_argument, 0, O_OFFLOAD}, {"offload-dir", required_argument, 0, O_OFFLOAD_DIR},
        {"lr-schedule", required_argument, 0, O_LRSCHED}, {"warmup", required_argument, 0, O_WARMUP},
        {"min-lr", required_argument, 0, O_MINLR},    {"decay-steps", required_argument, 0, O_DECAY},
        {"wsd-decay", required_argument, 0, O_WSD},   {"data-format", required_argument, 0, O_DFORMAT},
        {"clip-grad", required_argument, 0, O_CLIP},
        {"eval-every", required_argument, 0, O_EVAL_EVERY}, {"eval-batches", required_argument, 0, O_EVAL_BATCHES},
        {"val-fraction", required_argument, 0, O_VAL_FRACTION}, {"val-data", required_argument, 0, O_VAL_DATA},
        {0, 0, 0, 0}};
    long long v;
    double d;
    int o, li;
    /* the config file's flags go first, so the command line's override them; static: getopt's optarg and
     * the recorded flags point into it until the command ends */
    static bg_cli_config_t run_config;
    int crc = bg_cli_config_args(cmd, opts, argc, argv, &run_config);
    if (crc)
        return crc;
    argc = run_config.argc;
    argv = run_config.argv;
    optind = 1;
    opterr = 0;
    while ((li = -1, o = getopt_long(argc, argv, "h", opts, &li)) != -1) {
        if (li >= 0 && o != O_HELP) /* the effective flags, as parsed (a later one replaces an earlier) */
            bg_cli_config_record(&run_config, opts[li].name, opts[li].has_arg == no_argument ? NULL : optarg);
        switch (o) {

#define INT_FLAG(code, flag, lo, hi, dst) BG_CLI_INT_CASE(cmd, code, flag, lo, hi, dst)
            INT_FLAG(O_BATCH, "--batch", 1, 1 << 24, c.batch)
            INT_FLAG(O_MB, "--microbatches", 1, 1 << 20, c.microbatches)
            INT_FLAG(O_STEPS, "--steps", 0, 1 << 30, c.steps)
            INT_FLAG(O_THREADS, "--threads", 0, 4096, c.threads)
            INT_FLAG(O_TP, "--tp", 1, 4096, c.model.tp)
            INT_FLAG(O_CP, "--cp", 1, 4096, c.cp)
            INT_FLAG(O_CHUNKS, "--chunks", 1, 64, c.chunks)
            INT_FLAG(O_SEQMIN, "--seq-min", 1, 1 << 20, c.seq_min)
            INT_FLAG(O_SEQMULT, "--seq-multiple", 1, 1 << 20, c.seq_multiple)
            INT_FLAG(O_CKEVERY, "--checkpoint-every", 1, 1 << 30, c.checkpoint_every)
            INT_FLAG(O_KEEP, "--keep", 1, 1 << 20, c.keep)
            INT_FLAG(O_LOGEVERY, "--log-every", 1, 1 << 30, prog.log_every)
            INT_FLAG(O_PS, "--ps", 1, 4095, c.ps)
            INT_FLAG(O_STALENESS, "--staleness", 0, 1 << 20, c.staleness)
            INT_FLAG(O_EVAL_EVERY, "--eval-every", 1, 1 << 30, c.eval_every)
            INT_FLAG(O_EVAL_BATCHES, "--eval-batches", 1, 1 << 20, c.eval_batches)
            INT_FLAG(O_WARMUP, "--warmup", 0, 1 << 30, c.lr_schedule.warmup)
            INT_FLAG(O_DECAY, "--decay-steps", 0, 1 << 30, c.lr_schedule.decay_steps)
#undef INT_FLAG

        case O_PP:
        case O_DP:
            if (optarg && !strcmp(optarg, "auto")) {
                if (auto_axis && auto_axis != o)
                    return bg_cli_fail(cmd, "--pp auto and --dp auto: only one can follow the number of ranks");
                auto_axis = o;
                break;
            }
            if (bg_cli_int(cmd, o == O_PP ? "--pp" : "--dp", optarg, 1, o == O_PP ? 4096 : 1 << 20, &v))
                return 2;
            *(o == O_PP ? &c.pp : &c.dp) = (int)v;
            break;
        case O_ZERO:
            if (bg_cli_int(cmd, "--zero", optarg, 0, 3, &v))
                return 2;
            c.zero = (int)v;
            zero_flag = 1;
            break;
        case O_DSEED:
            if (bg_cli_int(cmd, "--data-seed", optarg, 0, INT64_MAX, &v))
                return 2;
            c.data_seed = (uint64_t)v;
            break;
        case O_LRSCHED:
            if (bg_lr_kind_parse(optarg, &c.lr_schedule.kind) != BG_OK)
                return bg_cli_fail(cmd, "%s", bg_last_error());
            break;
#define DOUBLE_FLAG(code, flag, lo, hi, dst)                                                                    \
    case code:                                                                                                 \
        if (bg_cli_double(cmd, flag, optarg, lo, hi, &d))                                                      \
            return 2;                                                                                          \
        dst = d;                                                                                               \
        break;
            DOUBLE_FLAG(O_MINLR, "--min-lr", 0, 100, c.lr_schedule.min_lr)
            DOUBLE_FLAG(O_CLIP, "--clip-grad", 0, 1e30, c.clip_grad)
            DOUBLE_FLAG(O_WSD, "--wsd-decay", 1e-9, 1, c.lr_schedule.wsd_decay)
            DOUBLE_FLAG(O_LR, "--lr", 1e-12, 100, c.optim.lr)
            DOUBLE_FLAG(O_WD, "--weight-decay", 0, 10, c.optim.weight_decay)
#undef DOUBLE_FLAG
        case O_OPT: {
            static const char *const optims[] = {"adamw", "sgd", NULL};
            int k = bg_cli_choice(cmd, "--optimizer", optarg, optims);
            if (k < 0)
                return 2;
            c.optim.kind = k == 0 ? BG_OPTIM_ADAMW : BG_OPTIM_SGD;
            break;
        }
        case O_SP: sequence_parallel = 1; break;
        case O_DEVMEM:
            if (bg_cli_bytes_list(cmd, "--device-mem", optarg, devmem64, 4096, &c.ndevice_mem))
                return 2;
            for (int k = 0; k < c.ndevice_mem; k++)
                devmem[k] = (size_t)devmem64[k];
            c.device_mem = devmem;
            break;
        case O_OFFLOAD:
            if (offload_flag(cmd, optarg, &c.offload))
                return 2;
            break;
        case O_OFFLOAD_DIR: c.offload_dir = optarg; break;
        case O_DATA: c.data_path = optarg; break;
        case O_DFORMAT: {
            static const char *const formats[] = {"text", "llmc", "raw16", "raw32", "auto", NULL};
            if (bg_cli_choice(cmd, "--data-format", optarg, formats) < 0)
                return 2;
            c.data_format = optarg;
            break;
        }
        case O_VAL_DATA: c.val_path = optarg; break;
        case O_VAL_FRACTION:
            if (bg_cli_double(cmd, "--val-fraction", optarg, -INFINITY, INFINITY, &d))
                return 2;
            if (!(d > 0 && d < 1))
                return bg_cli_fail(cmd, "--val-fraction must be in (0, 1), got %g", d);
            c.val_fraction = d;
            break;
        case O_SCHED:
            if (bg_cli_choice(cmd, "--schedule", optarg, bg_cli_schedule_names()) < 0)
                return 2;
            c.schedule = optarg;
            break;
        case O_SCHED_JSON: c.schedule_json = optarg; break;
        case O_EMULATE:
            if (bg_cli_check_json_object(cmd, optarg))
                return 2;
            c.emulate = optarg;
            break;
        case O_EMULATE_SCALE:
            if (bg_cli_double(cmd, "--emulate-scale", optarg, 1e-9, 1e9, &d))
                return 2;
            c.emulate_scale = d;
            break;
        case O_TRACE: c.trace_path = optarg; break;
        case O_SPLIT: {
            long long tmp[4096];
            int n;
            if (bg_cli_int_list(cmd, "--split", optarg, tmp, 4096, &n))
                return 2;
            for (int k = 0; k < n; k++)
                split[k] = (int)tmp[k];
            c.split = split;
            c.nsplit = n;
            break;
        }
        case O_BACKEND: c.backend = optarg; break;
        case O_METRICS: c.metrics_path = optarg; break;
        case O_SAVE: c.save_dir = optarg; break;
        case O_QUIET: prog.quiet = 1; break;
        case O_CKDIR: c.checkpoint_dir = optarg; break;
        case O_RESUME: c.resume = 1; break;
        case O_RESUME_STRICT: c.resume_strict = 1; break;
        case O_RESUME_FROM: c.resume_from = optarg; break;
        case O_PLAN: plan_path = optarg; break;
        case O_RECOMP: c.recompute = 1; break;
        case 'h':
        case O_HELP: usage(stdout); return 0;
        default:
            if (o >= BG_CLI_MODEL_FIRST && o < BG_CLI_MODEL_LAST) {
                if (bg_cli_model_option(cmd, o, optarg, &c.model))
                    return 2;
                if (o == BG_CLI_O_PRECISION) /* storage, not the model's identity: a plan's is checked apart */
                    precision_flag = 1;
                else
                    model_flags = 1;
                break;
            }
            return bg_cli_getopt_error(cmd, argv, optind, opts);
        }
    }
    if (optind < argc)
        return bg_cli_fail(cmd, "unexpected argument \"%s\" (see brigade train --help)", argv[optind]);
    c.model.sequence_parallel = sequence_parallel;
    if (plan_path) {
        if (bg_cli_check_json_object(cmd, plan_path))
            return 1;
        bg_status_t pst = bg_plan_load(plan_path, &plan);
        if (pst != BG_OK)
            return bg_cli_status(cmd, pst);
        if (c.cp > 1 && c.cp != bg_plan_cp(plan)) {
            int pc = bg_plan_cp(plan);
            bg_plan_free(plan);
            return bg_cli_fail(cmd, "--cp %d, but %s is a plan for cp %d: leave --cp out, or plan again with brigade "
                               "plan --cp %d", c.cp, plan_path, pc, c.cp);
        }
        if (sequence_parallel && !bg_plan_sequence_parallel(plan)) {
            bg_plan_free(plan);
            return bg_cli_fail(cmd, "%s counted the memory without sequence parallelism: plan with brigade plan "
                               "--sequence-parallel, or run it without --sequence-parallel", plan_path);
        }
        if (bg_plan_paired_for(bg_plan_tp(plan), bg_plan_zero(plan), bg_plan_dp(plan)) && !bg_plan_paired(plan)) {
            bg_plan_free(plan);
            return bg_cli_fail(cmd, "%s counted the memory without BRIGADE_TP_OVERLAP=microbatch's paired instructions "
                               "(both instructions' buffers at once, a second scratch per stage): plan with it set, or run without it", plan_path);
        }
        if (precision_flag && c.model.precision != bg_plan_precision(plan)) {
            bg_dtype_t planned = bg_plan_precision(plan);
            bg_plan_free(plan);
            return bg_cli_fail(cmd, "%s counted the activations in %s, not --precision %s: plan with brigade plan "
                               "--precision %s, or run it without --precision", plan_path,
                               bg_dtype_name(planned), bg_dtype_name(c.model.precision),
                               bg_dtype_name(c.model.precision));
        }
        c.model.sequence_parallel = bg_plan_sequence_parallel(plan); /* the flags' model is checked as planned */
        c.model.precision = bg_plan_precision(plan);
        if (plan_model(cmd, plan_path, plan, model_flags, &c.model)) {
            bg_plan_free(plan);
            return 2;
        }
        c.model.precision = bg_plan_precision(plan);
        c.model.tp = bg_plan_tp(plan);
        c.cp = bg_plan_cp(plan);
        c.model.sequence_parallel = bg_plan_sequence_parallel(plan);
        c.pp = bg_plan_pp(plan);
        c.dp = bg_plan_dp(plan);
        c.microbatches = bg_plan_microbatches(plan);
        if (bg_plan_batch(plan) > 0)
            c.batch = bg_plan_batch(plan);
        if (bg_plan_seq(plan) > 0)
            c.seq = bg_plan_seq(plan);
        static char plan_schedule[32]; /* the plan is freed before the summary prints the name */
        snprintf(plan_schedule, sizeof plan_schedule, "%s", bg_plan_schedule(plan));
        c.schedule = plan_schedule;
        c.optim.kind = bg_plan_optimizer(plan); /* the plan's memory assumed its optimizer's state */
        if (zero_flag && c.zero != bg_plan_zero(plan)) {
            int pz = bg_plan_zero(plan);
            bg_plan_free(plan);
            return bg_cli_fail(cmd, "--zero %d, but %s counted the memory of --zero %d: leave --zero out, or plan again "
                                    "with brigade plan --zero %d", c.zero, plan_path, pz, c.zero);
        }
        c.zero = bg_plan_zero(plan); /* and its sharding */
        if (bg_plan_offload(plan)) /* its budgets left the optimizer state out (2: and the parameter shard) */
            c.offload |= BG_OFFLOAD_OPTIMIZER | (bg_plan_offload(plan) >= 2 ? BG_OFFLOAD_PARAMS : 0);
        if (bg_plan_offload_activations(plan)) /* its peaks counted the stashes off the devices */
            c.offload |= BG_OFFLOAD_ACTIVATIONS;
        c.chunks = bg_plan_chunks(plan);
        c.nsplit = bg_plan_split(plan, split, 4096);
        c.split = split;
        static int recompute[4096];
        for (int k = 0; k < bg_plan_num_stages(plan) && k < 4096; k++)
            recompute[k] = bg_plan_stage(plan, k)->recompute;
        c.recompute_stages = recompute;
        c.nrecompute_stages = bg_plan_num_stages(plan);
    }
    if (c.schedule_json) {
        if (c.schedule || plan_path || c.chunks)
            return bg_cli_fail(cmd, "--schedule-json takes the schedule and its chunks from %s: drop %s", c.schedule_json,
                               c.schedule ? "--schedule" : plan_path ? "--plan" : "--chunks");
        if (bg_cli_check_json_object(cmd, c.schedule_json))
            return 1;
        bg_schedule_t *js = NULL; /* proved and checked here, before this rank connects to any other */
        bg_status_t jst = bg_schedule_load_program(c.schedule_json, c.pp > 0 ? c.pp : 1, c.microbatches, 0, &js);
        if (jst != BG_OK)
            return bg_cli_status(cmd, jst);
        c.chunks = bg_schedule_chunks(js);
        bg_schedule_free(js);
    }
    if (auto_axis && auto_layout(cmd, auto_axis == O_PP, plan_path != NULL, &c))
        return 2;
    prog.pp = c.pp > 0 ? c.pp : 1;
    prog.dp = c.dp > 0 ? c.dp : 1;
    static char *run_config_json; /* reachable until the command ends */
    run_config_json = bg_cli_config_json(&run_config);
    c.run_config_json = run_config_json;
    c.process_wide = 1; /* the CLI owns its process */
    c.on_step = on_step;
    c.on_step_arg = &prog;
    c.on_resume = on_resume;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    c.stop_flag = &bg__stop;
    bg_status_t st = bg_train_check(&c);
    if (st != BG_OK)
        return bg_cli_fail(cmd, "%s", bg_last_error());
    if (!plan) {
        if (split_check(cmd, &c, warning, sizeof warning))
            return 2;
        prog.warning = warning[0] ? warning : NULL;
    }
    if (c.zero && (c.dp > 0 ? c.dp : 1) == 1) { /* said once, by rank 0, with the first step */
        size_t at = prog.warning ? strlen(warning) : 0;
        snprintf(warning + at, sizeof warning - at, "%snote: --zero %d with dp = 1 changes nothing (one replica "
                 "holds everything)", at ? "\n" : "", c.zero);
        prog.warning = warning;
    }
    bg_train_result_t r;
    st = bg_train(&c, &r);
    int tp = c.model.tp > 0 ? c.model.tp : 1;
    int ranks = (c.pp > 0 ? c.pp : 1) * (c.dp > 0 ? c.dp : 1) * tp;
    char tp_text[32] = "";
    if (tp > 1)
        snprintf(tp_text, sizeof tp_text, " x tp %d", tp);
    if (st == BG_ERR_INVALID && ranks > 1 && strstr(bg_last_error(), "but the job has 1 ")) {
        /* a parallel layout started as one process: say how to start its ranks */
        bg_plan_free(plan);
        return bg_cli_fail(cmd,
                           "pp %d x dp %d%s = %d ranks, but this is a single process; start one process per "
                           "rank with a launcher:\n"
                           "  brigade launch -n %d -- brigade train ...\n"
                           "  torchrun --nproc-per-node %d --no-python brigade train ...\n"
                           "  mpirun -n %d brigade train ...",
                           c.pp > 0 ? c.pp : 1, c.dp > 0 ? c.dp : 1, tp_text, ranks, ranks, ranks, ranks);
    }
    int peer;
    if (st == BG_ERR_PEER && peer_failed(bg_last_error(), &peer)) {
        /* a peer stopped on its own error and prints it: one line here, not its message again */
        fprintf(stderr, "brigade train: stopped because rank %d failed\n", peer);
        bg_plan_free(plan);
        return 1;
    }
    if (st != BG_OK) {
        if (plan)
            fprintf(stderr, "brigade train: (running %s: pp %d x dp %d = %d ranks, schedule %s)\n", plan_path,
                    bg_plan_pp(plan), bg_plan_dp(plan), bg_plan_world(plan), bg_plan_schedule(plan));
        bg_plan_free(plan);
        return bg_cli_status(cmd, st);
    }
    if (plan && (r.world <= 1 || r.rank == 0))
        printf("plan %s: predicted step %.2f ms, measured %.2f ms (ratio %.2f); rank 0 peak %.2f MiB, predicted %.2f MiB\n",
               plan_path, bg_plan_step_ms(plan), r.median_step_ms,
               bg_plan_step_ms(plan) > 0 ? r.median_step_ms / bg_plan_step_ms(plan) : 0.0, r.peak_bytes / 1048576.0,
               bg_plan_rank_peak_bytes(plan, 0) / 1048576.0);
    bg_plan_free(plan);
    int lead = r.world <= 1 || r.rank == 0;
    int ran = r.steps_done - r.start_step; /* steps this run did */
    /* 128 + the signal when stopped (the shell's convention for a signal); 0 only for a finished run */
    int rc = r.stopped ? 128 + (bg__stop_sig ? (int)bg__stop_sig : SIGTERM) : 0;
    if (r.stopped && lead) {
        if (c.checkpoint_dir)
            fprintf(stderr, "stopped after step %d on request; checkpoint written to %s\n", r.steps_done,
                    c.checkpoint_dir);
        else
            fprintf(stderr, "interrupted at step %d, nothing saved\n", r.steps_done);
    }
    const char *mname = c.model.kind == BG_MODEL_MLP     ? "mlp"
                        : c.model.kind == BG_MODEL_LLAMA   ? (c.model.precision == BG_BF16 ? "llama (bf16 activations)" : "llama")
                        : c.model.precision == BG_BF16 ? "gpt (bf16 activations)"
                                                       : "gpt";
    /* what the run did: steps run, and where they started and ended when that is not 0 -> --steps */
    char did[160];
    if (ran == 0)
        snprintf(did, sizeof did, "no steps run (at step %d of %d)", r.steps_done, c.steps);
    else if (r.start_step > 0 || r.stopped)
        snprintf(did, sizeof did, "%d step%s (steps %d -> %d of %d%s)", ran, ran == 1 ? "" : "s", r.start_step,
                 r.steps_done, c.steps, r.stopped ? ", stopped" : "");
    else
        snprintf(did, sizeof did, "%d step%s", ran, ran == 1 ? "" : "s");
    if (r.world > 1) {
        /* every rank's pipeline figures, gathered by bg_train: one table, in rank order, from rank 0 */
        if (r.rank == 0)
            print_ranks(&r);
        int rank = r.rank;
        bg_train_result_free(&r);
        if (rank != 0)
            return rc;
        if (ran > 0 && c.ps > 0) {
            int pp = c.pp > 0 ? c.pp : 1;
            char stages[48] = ""; /* pipelined workers: how many ranks each */
            if (pp > 1)
                snprintf(stages, sizeof stages, " of pp %d (%s)",
                         pp, c.schedule_json ? c.schedule_json : c.schedule ? c.schedule : "1f1b");
            printf("trained %s on %d ranks (%d parameter server%s + %d workers%s, staleness %d): %s, loss %.4f -> "
                   "%.4f\n", mname, r.world, c.ps, c.ps == 1 ? "" : "s",
                   (r.world - c.ps) / pp, stages, c.staleness, did, r.first_loss, r.final_loss);
        } else if (ran > 0) {
            char ep[32] = ""; /* expert parallelism: groups inside dp */
            if (c.model.ep > 1)
                snprintf(ep, sizeof ep, ", ep %d", c.model.ep);
            char cps[24] = "";
            if (c.cp > 1)
                snprintf(cps, sizeof cps, " x cp %d", c.cp);
            printf("trained %s on %d ranks (pp %d x dp %d%s x tp %d%s, %s): %s, loss %.4f -> %.4f\n",
                   mname, r.world, c.pp ? c.pp : 1, c.dp ? c.dp : 1, cps, tp, ep,
                   c.schedule_json ? c.schedule_json : c.schedule ? c.schedule : "1f1b", did, r.first_loss, r.final_loss);
        } else {
            printf("%s on %d ranks: %s\n", mname, r.world, did);
        }
        if (ran > 0)
            printf("median step %.1f ms, %.0f tokens/s\n", r.median_step_ms, r.tokens_per_s);
        if (!isnan(r.val_loss))
            printf("validation loss %.4f, perplexity %.2f\n", r.val_loss, exp(r.val_loss));
        if (c.save_dir && !r.stopped)
            printf(c.ps > 0 ? "saved %s/model.safetensors\n" : "saved %s/model-stage*.safetensors\n", c.save_dir);
        return rc;
    }
    if (ran > 0) {
        printf("trained %s: %zu parameters, %s, loss %.4f -> %.4f\n", mname,
               r.params, did, r.first_loss, r.final_loss);
        printf("median step %.1f ms, %.0f tokens/s, %.2f GFLOP/s (model FLOPs)\n", r.median_step_ms, r.tokens_per_s,
               r.median_step_ms > 0 ? r.flops_per_step / (r.median_step_ms * 1e6) : 0.0);
    } else {
        printf("%s: %zu parameters, %s\n", mname, r.params, did);
    }
    if (!isnan(r.val_loss))
        printf("validation loss %.4f, perplexity %.2f\n", r.val_loss, exp(r.val_loss));
    if (ran == 0)
        printf("predicted memory %.2f MiB from the layers' reports\n", r.predicted_bytes / 1048576.0);
    else if (r.predicted_bytes)
        printf("peak memory %.2f MiB (predicted %.2f MiB from the layers' reports)\n", r.peak_bytes / 1048576.0,
               r.predicted_bytes / 1048576.0);
    else
        printf("peak memory %.2f MiB\n", r.peak_bytes / 1048576.0);
    if (c.save_dir && !r.stopped)
        printf("saved %s/model.safetensors\n", c.save_dir);
    bg_train_result_free(&r);
    return rc;
}
