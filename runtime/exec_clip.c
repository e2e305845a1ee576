/* runtime/exec_clip.c: clipping by global norm (bg_executor_params_t.clip_grad).
 * With it, the optimizer instructions only finish the reductions and sum
 * the squares (exec_grads.c, the strategies' optimizer hooks); after the
 * program every rank adds its counted tensors' squares exactly
 * (runtime/clip.h) into one fp64 allreduce over the job, so every rank gets
 * the same norm, with the same bits in every layout whose gradients are the
 * same; then each chunk's gradients are scaled and updated (the ONE hook
 * update, default bg__exec_update). Its own hook for a rank that clips
 * elsewhere (a parameter server's worker: the servers clip). This file must
 * not branch on which strategies are active. */
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "runtime/clip.h"
#include "runtime/exec_impl.h"

/* Scale the chunk's gradients by k (k < 1: clipped) and update it bucket by bucket. */
bg_status_t bg__exec_update(exec_t *x, chunk_t *ch, float k)
{
    if (x->em) /* emulated stages update nothing */
        return BG_OK;
    float *g = bg_model_grads(ch->model);
    int t = (int)x->step + 1;
    for (int b = 0; b < ch->nbuckets; b++) {
        bg__bucket_t *bk = &ch->buckets[b];
        if (k < 1)
            x->be->ops->scale(x->be, g + bk->off, k, bk->count);
        BG_CHECK(bg_model_optim_step_range(ch->model, &x->p.optim, t, bk->off, bk->count));
    }
    return BG_OK;
}

bg_status_t bg__exec_clip(exec_t *x)
{
    bg__strategy_t *own = BG__ONE(x, clip);
    if (own)
        return own->ops->clip(x, own->self);
    double limbs[BG__CLIP_LIMBS];
    memset(limbs, 0, sizeof limbs);
    for (int v = 0; v < x->V; v++) {
        chunk_t *ch = &x->chunks[v];
        for (int i = 0; ch->norm_counted && i < bg_model_num_tensors(ch->model); i++)
            if (bg__exec_in_norm(x, ch, i))
                bg__clip_add(limbs, ch->tsq[i]);
    }
    if (x->lay.world > 1)
        BG_CHECK(bg_group_allreduce(x->world_group, limbs, BG__CLIP_LIMBS, BG_F64, BG_REDUCE_SUM));
    x->clip_norm = sqrt(bg__clip_value(limbs));
    float k = bg__clip_factor(x->p.clip_grad, x->clip_norm);
    bg__strategy_t *u = BG__ONE(x, update);
    for (int v = 0; v < x->V; v++)
        BG_CHECK(u ? u->ops->update(x, u->self, &x->chunks[v], k) : bg__exec_update(x, &x->chunks[v], k));
    return BG_OK;
}
