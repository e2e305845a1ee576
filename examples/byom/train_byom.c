/* examples/byom/train_byom.c: bring your own model. A framework-style host
 * that defines its own layers (user_layers.c: RMSNorm, SwiGLU), builds its
 * own model from them and brigade's built-in layers, feeds its own data
 * through a batch callback, and drives brigade's executor one step at a
 * time, on any pipeline x data-parallel layout:
 *
 *     brigade launch -n 2 -- ./train_byom --pp 2 --steps 30 --save out
 *     brigade launch -n 2 -- ./train_byom --tp 2 --steps 30 --save out
 *     brigade launch -n 2 -- ./train_byom --tp 2 --sequence-parallel --steps 30
 *
 * With --tp T brigade's layers are its tensor-parallel ones (vocabulary-
 * parallel embedding and head, attention heads split over T ranks) while
 * the user's own layers stay replicated on every member: same weights. With
 * --sequence-parallel too, every layer is switched by bg_layer_sequence_parallel:
 * between brigade's tensor-parallel regions each member holds its part of
 * the sequence, the user's layers run on it and their weights' gradients are
 * summed over the group by the executor (they are marked tp_partial). *
 * The model: token embedding, N x (attention block, SwiGLU block), RMSNorm,
 * and an output head whose weight is tied to the embedding. The data: a
 * synthetic language whose next token is a fixed function of the current
 * one, so the loss must fall. */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <brigade/brigade.h>

#include "user_layers.h"

typedef struct options {
    int pp, dp, tp, chunks, steps, layers, d_model, heads, seq, vocab, batch, microbatches, threads, recompute;
    float lr;
    const char *schedule, *save, *ckpt;
    int ckpt_every, resume;
    long fail_at_step;      /* the batch callback fails at this step (testing errors), -1: never */
    long bad_target_step;   /* the batch callback writes a target out of range at this step, -1: never */
    int sp;                 /* --sequence-parallel (with --tp > 1) */
} options_t;

/* Add l to d, switched to sequence parallelism when asked (tp > 1). */
static bg_status_t add_layer(const options_t *o, bg_model_desc_t *d, bg_layer_t *l)
{
    bg_status_t st = o->sp && o->tp > 1 ? bg_layer_sequence_parallel(l) : BG_OK;
    if (st != BG_OK) {
        bg_layer_destroy(l);
        return st;
    }
    return bg_model_desc_add(d, l);
}

/* The host's data: a deterministic function of the request only, as the
 * executor requires (every rank that asks for a microbatch gets the same). */
static bg_status_t make_batch(const bg_batch_request_t *rq, int32_t *tokens, float *features, int32_t *targets,
                              void *arg)
{
    (void)features;
    const options_t *o = arg;
    if (rq->step == o->fail_at_step)
        return bg_error(BG_ERR_IO, "my data loader could not read shard %d", rq->first);
    int V = o->vocab;
    for (int j = 0; j < rq->in.n; j++) {
        uint64_t h = ((uint64_t)rq->step * 1000003u + (uint64_t)(rq->first + j) * 7919u) * 0x9e3779b97f4a7c15ULL;
        int32_t tok = (int32_t)((h >> 33) % (uint64_t)V);
        for (int k = 0; k < rq->in.t; k++) {
            int32_t next = (int32_t)((tok * 5 + 3 + (k % 3)) % V);
            size_t i = (size_t)j * (size_t)rq->in.t + (size_t)k;
            if (tokens)
                tokens[i] = tok;
            if (targets)
                targets[i] = next;
            tok = next;
        }
    }
    if (targets && rq->step == o->bad_target_step)
        targets[0] = V + 7;
    return BG_OK;
}

static bg_status_t build_model(const options_t *o, bg_model_desc_t **desc_p)
{
    bg_model_desc_params_t mp = BG_MODEL_DESC_PARAMS_INIT;
    mp.name = "byom";
    mp.input = BG_INPUT_TOKENS;
    mp.vocab = o->vocab;
    mp.seq_len = o->seq;
    mp.seed = 42;
    bg_model_desc_t *d;
    bg_status_t st = bg_model_desc_create(&mp, &d);
    if (st != BG_OK)
        return st;
    bg_layer_t *l;
    char name[64];
    if (o->tp > 1)
        st = bg_layer_vocab_embedding("embed", o->vocab, o->seq, o->d_model, 0.02f, o->tp, &l);
    else
        st = bg_layer_embedding("embed", o->vocab, o->seq, o->d_model, 0.02f, &l);
    if (st == BG_OK)
        st = add_layer(o, d, l);
    for (int i = 0; i < o->layers && st == BG_OK; i++) {
        snprintf(name, sizeof(name), "attn.%d", i);
        st = bg_layer_tp_attention_block(name, o->d_model, o->heads, 0.02f, 0.01f, o->tp, &l); /* tp 1: plain */
        if (st == BG_OK)
            st = add_layer(o, d, l);
        snprintf(name, sizeof(name), "ffn.%d", i);
        if (st == BG_OK)
            st = byom_ffn_block(name, o->d_model, 2 * o->d_model, 0.02f, &l);
        if (st == BG_OK)
            st = add_layer(o, d, l);
    }
    if (st == BG_OK)
        st = byom_rmsnorm("norm_f", o->d_model, &l);
    if (st == BG_OK)
        st = add_layer(o, d, l);
    if (st == BG_OK)
        st = o->tp > 1 ? bg_layer_vocab_head("head", o->d_model, o->vocab, 0, 0.02f, o->tp, &l)
                       : bg_layer_head("head", o->d_model, o->vocab, 0, 0.02f, &l);
    if (st == BG_OK)
        st = add_layer(o, d, l);
    if (st == BG_OK)
        st = bg_model_desc_tie(d, "embed.wte", "head.weight");
    if (st == BG_OK)
        st = bg_model_desc_check(d);
    if (st != BG_OK) {
        bg_model_desc_destroy(d);
        return st;
    }
    *desc_p = d;
    return BG_OK;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: train_byom [--pp N] [--dp N] [--tp N [--sequence-parallel]] [--schedule NAME] [--chunks V] [--steps N] [--layers N]\n"
            "                  [--d-model N] [--heads N] [--seq N] [--vocab N] [--batch N] [--microbatches N]\n"
            "                  [--lr X] [--threads N] [--recompute] [--save DIR]\n"
            "                  [--checkpoint-dir DIR [--checkpoint-every N] [--resume]]\n"
            "                  [--fail-at-step K] [--bad-target-at-step K]   (error handling demos)\n");
}

int main(int argc, char **argv)
{
    options_t o = {1, 1, 1, 0, 30, 2, 32, 4, 16, 64, 8, 4, 1, 0, 3e-3f, NULL, NULL, NULL, 0, 0, -1, -1, 0};
    static const struct option opts[] = {
        {"pp", 1, 0, 'p'},          {"dp", 1, 0, 'd'},     {"schedule", 1, 0, 's'}, {"chunks", 1, 0, 'c'},
        {"steps", 1, 0, 'n'},       {"layers", 1, 0, 'l'}, {"d-model", 1, 0, 'm'},  {"heads", 1, 0, 'h'},
        {"seq", 1, 0, 't'},         {"vocab", 1, 0, 'v'},  {"batch", 1, 0, 'b'},    {"microbatches", 1, 0, 'M'},
        {"lr", 1, 0, 'r'},          {"threads", 1, 0, 'T'}, {"recompute", 0, 0, 'R'}, {"save", 1, 0, 'o'},
        {"fail-at-step", 1, 0, 'F'}, {"bad-target-at-step", 1, 0, 'G'}, {"checkpoint-dir", 1, 0, 'C'},
        {"checkpoint-every", 1, 0, 'E'}, {"resume", 0, 0, 'S'}, {"tp", 1, 0, 'P'},
        {"sequence-parallel", 0, 0, 'Q'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'p': o.pp = atoi(optarg); break;
        case 'd': o.dp = atoi(optarg); break;
        case 'P': o.tp = atoi(optarg); break;
        case 'Q': o.sp = 1; break;
        case 's': o.schedule = optarg; break;
        case 'c': o.chunks = atoi(optarg); break;
        case 'n': o.steps = atoi(optarg); break;
        case 'l': o.layers = atoi(optarg); break;
        case 'm': o.d_model = atoi(optarg); break;
        case 'h': o.heads = atoi(optarg); break;
        case 't': o.seq = atoi(optarg); break;
        case 'v': o.vocab = atoi(optarg); break;
        case 'b': o.batch = atoi(optarg); break;
        case 'M': o.microbatches = atoi(optarg); break;
        case 'r': o.lr = strtof(optarg, NULL); break;
        case 'T': o.threads = atoi(optarg); break;
        case 'R': o.recompute = 1; break;
        case 'o': o.save = optarg; break;
        case 'F': o.fail_at_step = atol(optarg) - 1; break;
        case 'G': o.bad_target_step = atol(optarg) - 1; break;
        case 'C': o.ckpt = optarg; break;
        case 'E': o.ckpt_every = atoi(optarg); break;
        case 'S': o.resume = 1; break;
        default: usage(); return 2;
        }
    }
    bg_model_desc_t *desc = NULL;
    if (build_model(&o, &desc) != BG_OK) {
        fprintf(stderr, "train_byom: %s\n", bg_last_error());
        return 1;
    }
    bg_executor_params_t p = BG_EXECUTOR_PARAMS_INIT;
    p.model = desc;
    p.pp = o.pp;
    p.dp = o.dp;
    p.tp = o.tp;
    p.schedule = o.schedule;
    p.chunks = o.chunks;
    p.batch = o.batch;
    p.microbatches = o.microbatches;
    p.optim.lr = o.lr;
    p.threads = o.threads;
    p.recompute = o.recompute;
    p.data.batch = make_batch;
    p.data.arg = &o;
    p.process_wide = 1; /* this program owns its process: NUMA, OpenBLAS threads, malloc, UCX log handler */
    bg_executor_t *x = NULL;
    if (bg_executor_create(&p, &x) != BG_OK) {
        fprintf(stderr, "train_byom: %s\n", bg_last_error());
        bg_model_desc_destroy(desc);
        return 1;
    }
    int rank = bg_executor_rank(x), rc = 0, found = 0;
    if (o.ckpt && o.resume && bg_executor_resume(x, o.ckpt, &found) != BG_OK) {
        fprintf(stderr, "train_byom: rank %d: %s\n", rank, bg_last_error());
        rc = 1;
    }
    int start = (int)bg_executor_steps_done(x); /* > 0 when resumed (under any layout) */
    if (rc == 0 && found && rank == 0)
        printf("resumed at step %d from %s\n", start, o.ckpt);
    double first = 0, last = 0;
    for (int s = start; s < o.steps && rc == 0; s++) {
        /* the host owns the schedule: linear warm-up over the first 5 steps */
        bg_executor_set_lr(x, o.lr * (s < 5 ? (float)(s + 1) / 5.0f : 1.0f));
        bg_step_result_t r;
        if (bg_executor_step(x, &r) != BG_OK) {
            fprintf(stderr, "train_byom: rank %d: %s\n", rank, bg_last_error());
            rc = 1;
            break;
        }
        if (s == start)
            first = r.loss;
        last = r.loss;
        if (o.ckpt && o.ckpt_every && (s + 1) % o.ckpt_every == 0 &&
            bg_executor_save_checkpoint(x, o.ckpt, 2) != BG_OK) {
            fprintf(stderr, "train_byom: rank %d: %s\n", rank, bg_last_error());
            rc = 1;
        }
        if (rank == 0 && (s % 10 == 0 || s + 1 == o.steps))
            printf("step %3lld  loss %.4f  %.0f tokens/s\n", (long long)r.step, r.loss, r.tokens_per_s);
    }
    if (rc == 0 && o.save && bg_executor_save_weights(x, o.save) != BG_OK) {
        fprintf(stderr, "train_byom: %s\n", bg_last_error());
        rc = 1;
    }
    if (rc == 0 && rank == 0) {
        bg_executor_info_t info;
        bg_executor_info(x, &info);
        printf("trained byom (%zu parameters on rank 0, %d ranks, schedule %s): loss %.4f -> %.4f\n", info.params,
               info.world, info.schedule, first, last);
    }
    if (bg_executor_destroy(x) != BG_OK && rc == 0) {
        fprintf(stderr, "train_byom: %s\n", bg_last_error());
        rc = 1;
    }
    bg_model_desc_destroy(desc);
    return rc;
}
