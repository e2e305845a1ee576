/* runtime/exec_agree.c: agreement at start. When an executor is created,
 * its ranks compare a digest of each thing every rank of a job must share
 * (the brigade version, the model description, the layout, the schedule
 * program, the optimizer and its hyper-parameters, the batch) in one
 * all-gather of the world group; a mismatch fails every rank alike, naming
 * the first field that differs and the ranks that differ from rank 0, instead
 * of a hang until BRIGADE_TIMEOUT or a run that trains silently wrong. And
 * agreement at every step: the host's per-step values (bg_executor_set_lr)
 * ride on the step-end allreduce (bg__exec_step_agree_*), a mismatch fails
 * every rank naming the values and the ranks. Owns no state; must not send
 * anything but that all-gather (and, once a mismatch is found, one more). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/util.h"
#include "runtime/exec_impl.h"
#include "brigade/schedule.h"

enum { AGREE_VERSION, AGREE_MODEL, AGREE_LAYOUT, AGREE_SCHEDULE, AGREE_OPTIM, AGREE_BATCH, AGREE_SEED, AGREE_N };
static const char *const agree_names[AGREE_N] = {
    [AGREE_VERSION] = "brigade version", [AGREE_MODEL] = "model description",
    [AGREE_LAYOUT] = "layout (pp, dp, cp, tp, ep, chunks, split, zero, ps, staleness, recompute)",
    [AGREE_SCHEDULE] = "schedule program", [AGREE_OPTIM] = "optimizer and its hyper-parameters",
    [AGREE_BATCH] = "batch and microbatches", [AGREE_SEED] = "data seed"};

static uint64_t fnv_str(const char *s) { return bg__fnv1a_bytes(BG_FNV1A_INIT, s, strlen(s)); }

/* n ints continuing h, preceded by their count (so that [1,2],[3] and [1],[2,3] differ) */
static uint64_t fnv_ints(uint64_t h, const int *v, int n)
{
    h = bg__fnv1a_bytes(h, &n, sizeof n);
    return v ? bg__fnv1a_bytes(h, v, (size_t)n * sizeof *v) : h;
}

/* This rank's digests, field by field: values or padding-free arrays, never
 * structs with padding (their bytes would differ between ranks). */
static bg_status_t digests(exec_t *x, uint64_t d[AGREE_N])
{
    const bg_executor_params_t *p = &x->p;
    char buf[512];
    d[AGREE_VERSION] = fnv_str(BRIGADE_VERSION_STRING);
    char *json = NULL;
    BG_CHECK(bg_model_desc_to_json(x->desc, &json));
    d[AGREE_MODEL] = fnv_str(json);
    free(json);
    int lay[] = {p->pp, p->dp, p->cp, p->tp, p->ep, p->chunks, p->zero, p->ps, p->staleness, p->recompute};
    uint64_t h = fnv_ints(BG_FNV1A_INIT, lay, (int)(sizeof lay / sizeof lay[0]));
    h = fnv_ints(h, p->split, p->split ? p->nsplit : 0);
    d[AGREE_LAYOUT] = fnv_ints(h, p->recompute_stages, p->recompute_stages ? p->nrecompute_stages : 0);
    /* the program itself, rank by rank (bg_sched_op_t is six int32s: no padding), not its JSON text:
     * a large program's text would cost seconds and its size in memory at every create */
    h = BG_FNV1A_INIT;
    for (int r = 0; r < bg_schedule_ranks(x->sched); r++) {
        size_t n = 0;
        const bg_sched_op_t *ops = bg_schedule_rank_ops(x->sched, r, &n);
        h = bg__fnv1a_bytes(bg__fnv1a_bytes(h, &n, sizeof n), ops, n * sizeof *ops);
    }
    d[AGREE_SCHEDULE] = h;
    const bg_optim_config_t *o = &p->optim;
    snprintf(buf, sizeof buf, "%d %a %a %a %a %a %a %a", (int)o->kind, (double)o->lr, (double)o->beta1,
             (double)o->beta2, (double)o->eps, (double)o->momentum, (double)o->weight_decay, p->clip_grad);
    d[AGREE_OPTIM] = fnv_str(buf);
    int batch[] = {p->batch, p->microbatches};
    d[AGREE_BATCH] = fnv_ints(BG_FNV1A_INIT, batch, 2);
    d[AGREE_SEED] = p->size >= offsetof(bg_executor_params_t, data_seed) + sizeof p->data_seed ? p->data_seed : 0;
    return BG_OK;
}

/* The first field on which some rank differs from rank 0, and those ranks. */
static bg_status_t compare(const uint64_t *all, int world)
{
    for (int f = 0; f < AGREE_N; f++) {
        char ranks[256] = "";
        int n = 0;
        size_t len = 0;
        for (int r = 1; r < world; r++)
            if (all[(size_t)r * AGREE_N + f] != all[f] && n++ < 8 && len < sizeof ranks - 16)
                len += (size_t)snprintf(ranks + len, sizeof ranks - len, "%s%d", n > 1 ? ", " : "", r);
        if (n)
            return bg_error(BG_ERR_MISMATCH, "the ranks of this job disagree on the %s: rank%s %s%s differ%s from "
                            "rank 0 (every rank must be started with the same program and settings)",
                            agree_names[f], n > 1 ? "s" : "", ranks, n > 8 ? ", ..." : "", n > 1 ? "" : "s");
    }
    return BG_OK;
}

bg_status_t bg__exec_agree(exec_t *x)
{
    if (x->lay.world <= 1)
        return BG_OK;
    uint64_t mine[AGREE_N];
    BG_CHECK(digests(x, mine));
    uint64_t *all = malloc((size_t)x->lay.world * sizeof mine);
    BG_ALLOC_CHECK(all, (size_t)x->lay.world * sizeof mine, "start-up agreement");
    bg_status_t st = bg_group_allgather(x->world_group, mine, all, sizeof mine, BG_U8);
    if (st == BG_OK)
        st = compare(all, x->lay.world);
    free(all);
    return st;
}

/* ---- per step ----
 * Each per-step value travels as the two 16-bit halves of its bits and
 * their squares: integers below 2^32 whose sums over the job are exact in
 * fp64 in any order (up to 2^21 ranks), so after the SUM allreduce every
 * rank can tell exactly whether all ranks sent the same value: n sum(x^2)
 * = (sum x)^2 only when every x is equal (Cauchy-Schwarz). */

enum { STEP_LR, STEP_N };
static const char *const step_names[STEP_N] = {[STEP_LR] = "learning rate (bg_executor_set_lr)"};

static void step_values(const exec_t *x, float v[STEP_N]) { v[STEP_LR] = x->p.optim.lr; }

void bg__exec_step_agree_pack(const exec_t *x, double out[BG__STEP_AGREE_DOUBLES])
{
    float v[STEP_N];
    step_values(x, v);
    for (int i = 0; i < STEP_N; i++) {
        uint32_t b;
        memcpy(&b, &v[i], sizeof b);
        double h[2] = {(double)(b >> 16), (double)(b & 0xffffu)};
        for (int k = 0; k < 2; k++) {
            out[4 * i + 2 * k] = h[k];
            out[4 * i + 2 * k + 1] = h[k] * h[k];
        }
    }
}

/* A mismatch found: every rank's values (one more all-gather, on every rank
 * alike: all saw the same sums), named. */
static bg_status_t step_disagree(exec_t *x, int what)
{
    int world = x->lay.world;
    float mine[STEP_N], *all = malloc((size_t)world * sizeof mine);
    BG_ALLOC_CHECK(all, (size_t)world * sizeof mine, "per-step agreement");
    step_values(x, mine);
    bg_status_t st = bg_group_allgather(x->world_group, mine, all, sizeof mine, BG_U8);
    if (st != BG_OK) {
        free(all);
        return st;
    }
    char ranks[512] = "";
    size_t len = 0;
    int n = 0;
    float v0 = all[what];
    for (int r = 1; r < world; r++) {
        float v = all[(size_t)r * STEP_N + what];
        if (memcmp(&v, &v0, sizeof v) != 0 && n++ < 8 && len < sizeof ranks - 64)
            len += (size_t)snprintf(ranks + len, sizeof ranks - len, "%srank %d has %.9g", n > 1 ? ", " : "", r,
                                    (double)v);
    }
    free(all);
    return bg_error(BG_ERR_MISMATCH, "the ranks of this job disagree on the %s at step %lld: rank 0 has %.9g, %s%s "
                    "(every rank must set the same)", step_names[what], (long long)x->step + 1, (double)v0,
                    ranks, n > 8 ? ", ..." : "");
}

bg_status_t bg__exec_step_agree_check(exec_t *x, const double sums[BG__STEP_AGREE_DOUBLES])
{
    uint64_t n = (uint64_t)x->lay.world;
    for (int i = 0; i < STEP_N; i++)
        for (int k = 0; k < 2; k++) {
            uint64_t s = (uint64_t)sums[4 * i + 2 * k], sq = (uint64_t)sums[4 * i + 2 * k + 1];
            if ((unsigned __int128)n * sq != (unsigned __int128)s * s)
                return step_disagree(x, i);
        }
    return BG_OK;
}
