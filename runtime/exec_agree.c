/* runtime/exec_agree.c: agreement at start. When an executor is created,
 * its ranks compare a digest of each thing every rank of a job must share
 * (the brigade version, the model description, the layout, the schedule
 * program, the optimizer and its hyper-parameters, the batch) in one
 * all-gather of the world group; a mismatch fails every rank alike, naming
 * the first field that differs and the ranks that differ from rank 0, instead
 * of a hang until BRIGADE_TIMEOUT or a run that trains silently wrong. Owns
 * no state after it returns; must not send anything but that all-gather. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/util.h"
#include "runtime/exec_impl.h"
#include "brigade/schedule.h"

enum { AGREE_VERSION, AGREE_MODEL, AGREE_LAYOUT, AGREE_SCHEDULE, AGREE_OPTIM, AGREE_BATCH, AGREE_N };
static const char *const agree_names[AGREE_N] = {
    [AGREE_VERSION] = "brigade version", [AGREE_MODEL] = "model description",
    [AGREE_LAYOUT] = "layout (pp, dp, tp, chunks, split, zero, ps, staleness, recompute)",
    [AGREE_SCHEDULE] = "schedule program", [AGREE_OPTIM] = "optimizer and its hyper-parameters",
    [AGREE_BATCH] = "batch and microbatches"};

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
    int lay[] = {p->pp, p->dp, p->tp, p->chunks, p->zero, p->ps, p->staleness, p->recompute};
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
