/* schedule/layout.c: the rank layout (schedule/layout.h): rank <-> (pp, dp,
 * cp, tp, chunk, role) for every strategy. Pure arithmetic over the degrees and
 * the schedule's placement; it owns nothing and never communicates. */
#include "schedule/layout.h"

#include <stdio.h>

#include "core/check.h"

void bg__layout_init(bg_layout_t *l, int pp, int dp, int cp, int tp, int servers)
{
    *l = (bg_layout_t){.pp = pp, .dp = dp, .cp = cp, .tp = tp, .servers = servers};
    l->world = servers + pp * dp * cp * tp;
    l->me = (bg_layout_coord_t){0, 0, 0, 0, BG_LAYOUT_WORKER};
}

/* --ps S: the job's N ranks are S servers and N - S workers, each worker a
 * replica (dp = (N - S) / pp): one rank, or a pipeline of pp ranks. */
static bg_status_t bind_servers(bg_layout_t *l, int world)
{
    int S = l->servers, P = l->pp, W = (world - S) / P;
    if (world - S < 1)
        return bg_error(BG_ERR_INVALID, "--ps %d: %d server%s but the job has %d rank%s, so no worker is left (start "
                        "it with brigade launch -n %d or more)", S, S, S == 1 ? "" : "s", world,
                        world == 1 ? "" : "s", S + P);
    if ((world - S) % P != 0)
        return bg_error(BG_ERR_INVALID, "--ps %d with --pp %d: the job's %d ranks leave %d for the workers, not a "
                        "multiple of the %d ranks of a worker's pipeline (start %d or %d ranks)", S, P, world,
                        world - S, P, S + W * P, S + (W + 1) * P);
    if (l->dp != 1 && l->dp != W)
        return bg_error(BG_ERR_INVALID, "--ps %d with --dp %d: the %d workers of a %d-rank job are the replicas "
                        "(leave --dp out, or start %d ranks)", S, l->dp, W, world, S + l->dp * P);
    l->dp = W;
    return BG_OK;
}

bg_status_t bg__layout_bind(bg_layout_t *l, int world, int rank)
{
    if (l->servers > 0) {
        BG_CHECK(bind_servers(l, world));
    } else if (world != l->pp * l->dp * l->cp * l->tp) {
        char cp[32] = "", tp[32] = "";
        int want = l->pp * l->dp * l->cp * l->tp;
        if (l->cp > 1)
            snprintf(cp, sizeof cp, " x cp %d", l->cp);
        if (l->tp > 1)
            snprintf(tp, sizeof tp, " x tp %d", l->tp);
        return bg_error(BG_ERR_INVALID, "pp %d x dp %d%s%s = %d ranks, but the job has %d (start it with brigade "
                                        "launch -n %d)", l->pp, l->dp, cp, tp, want, world, want);
    }
    l->world = world;
    l->rank = rank;
    l->me = bg__layout_coord(l, rank);
    return BG_OK;
}

void bg__layout_set_schedule(bg_layout_t *l, const bg_schedule_t *sched) { l->sched = sched; }

int bg__layout_rank(const bg_layout_t *l, int pp, int dp, int cp, int tp)
{
    if (l->servers > 0)
        return l->servers + (dp * l->pp + pp) * l->tp + tp;
    return ((pp * l->dp + dp) * l->cp + cp) * l->tp + tp;
}

bg_layout_coord_t bg__layout_coord(const bg_layout_t *l, int rank)
{
    if (l->servers > 0) { /* tp = 1 */
        if (rank < l->servers)
            return (bg_layout_coord_t){0, -1, 0, 0, BG_LAYOUT_SERVER};
        int r = rank - l->servers;
        return (bg_layout_coord_t){r % l->pp, r / l->pp, 0, 0, BG_LAYOUT_WORKER};
    }
    int ct = l->cp * l->tp;
    return (bg_layout_coord_t){rank / (l->dp * ct), rank / ct % l->dp, rank / l->tp % l->cp, rank % l->tp,
                               BG_LAYOUT_WORKER};
}

int bg__layout_stage_pp(const bg_layout_t *l, int stage) { return bg_schedule_stage_rank(l->sched, stage); }

int bg__layout_stage_rank(const bg_layout_t *l, int stage, int dp)
{
    return bg__layout_rank(l, bg__layout_stage_pp(l, stage), dp, l->me.cp, l->me.tp);
}

int bg__layout_chunk_stage(const bg_layout_t *l, int pp, int chunk)
{
    int stage = -1;
    for (int s = 0; s < bg_schedule_stages(l->sched); s++)
        if (bg_schedule_stage_rank(l->sched, s) == pp && bg_schedule_stage_chunk(l->sched, s) == chunk)
            stage = s;
    return stage;
}

/* model stages: the schedule's stages over its copies */
static int model_stages(const bg_layout_t *l) { return bg_schedule_stages(l->sched) / bg_schedule_copies(l->sched); }
int bg__layout_model_stage(const bg_layout_t *l, int stage) { return stage % model_stages(l); }
int bg__layout_copy(const bg_layout_t *l, int stage) { return stage / model_stages(l); }
int bg__layout_twin(const bg_layout_t *l, int stage)
{
    return (stage + model_stages(l)) % bg_schedule_stages(l->sched);
}

int bg__layout_dp_ranks(const bg_layout_t *l, int *ranks)
{
    if (l->servers > 0)
        return 0;
    for (int d = 0; d < l->dp; d++)
        for (int c = 0; c < l->cp; c++)
            ranks[d * l->cp + c] = bg__layout_rank(l, l->me.pp, d, c, l->me.tp);
    return l->dp * l->cp;
}

int bg__layout_cp_ranks(const bg_layout_t *l, int *ranks)
{
    for (int c = 0; c < l->cp; c++)
        ranks[c] = bg__layout_rank(l, l->me.pp, l->me.dp, c, l->me.tp);
    return l->cp;
}

int bg__layout_lead(const bg_layout_t *l) { return l->me.dp == 0 && l->me.cp == 0; }

int bg__layout_tp_first(const bg_layout_t *l) { return bg__layout_rank(l, l->me.pp, l->me.dp, l->me.cp, 0); }
