/* models/stage.c: runs a model's layer range on microbatches. Each
 * microbatch lives in a slot from bg_stage_begin until its last backward
 * piece; every buffer is counted by the backend's allocator, so the peak
 * activation memory of a schedule is measured, not estimated.
 *
 * Slot memory:
 *   input   (n,t,c) floats, when the stage's input is an activation
 *   tokens, targets (n*t int32 each) when given
 *   act     for each layer i: [out_i][stash_i]        (F .. end of backward)
 *   dout_in incoming output gradient                   (recv .. end of backward)
 *   bw      split backward: [dout_i, i<k-1][wstash_i][din]   (B .. W)
 *           fused backward: [ping][pong][wstash max]         (.. bg_stage_end)
 * The stage's scratch buffer (temporaries of one call) is shared by all slots. */
#include <stdlib.h>
#include <string.h>

#include "brigade/model.h"
#include "core/check.h"
#include "models/layer_impl.h"

#define MAX_LAYERS_STAGE 4096

typedef enum { SLOT_FREE = 0, SLOT_BEGUN, SLOT_FORWARD, SLOT_BINPUT, SLOT_DONE } slot_state_t;

typedef struct slot {
    slot_state_t state;
    bg_shape_t *shapes; /* nlayers + 1 input shapes */
    float *input;
    int32_t *tokens, *targets;
    float loss_scale;
    char *act;          /* NULL between F and B when recomputing */
    float *keep_out;    /* recompute: the stage's output, kept while act is dropped */
    float **out;        /* per layer output pointer (into act) */
    char **stash;       /* per layer stash pointer (into act) */
    float *dout_in;
    char *bw;
    float *din;
} slot_t;

struct bg_stage {
    bg_model_t *model;
    bg_backend_t *be;
    int first, nlayers;
    bg_layer_t **layers;
    int nslots;
    slot_t *slots;
    void *scratch;
    size_t scratch_bytes;
    bg_stage_layer_done_fn layer_done;
    void *layer_done_arg;
    int recompute;      /* keep only input and output between F and B; rerun F in B */
};

void bg_stage_set_recompute(bg_stage_t *s, int on) { s->recompute = on ? 1 : 0; }
int bg_stage_recompute(const bg_stage_t *s) { return s->recompute; }

void bg_stage_set_layer_done(bg_stage_t *s, bg_stage_layer_done_fn fn, void *arg)
{
    s->layer_done = fn;
    s->layer_done_arg = arg;
}

bg_status_t bg_stage_create(bg_model_t *m, int max_microbatches, bg_stage_t **stage_p)
{
    if (max_microbatches < 1)
        return bg_error(BG_ERR_INVALID, "a stage needs at least one microbatch slot (got %d)", max_microbatches);
    bg_stage_t *s = calloc(1, sizeof(*s));
    BG_ALLOC_CHECK(s, sizeof(*s), "stage");
    s->model = m;
    s->be = bg_model_backend(m);
    s->first = bg_model_first_layer(m);
    s->nlayers = bg_model_last_layer(m) - s->first + 1;
    s->layers = calloc((size_t)s->nlayers, sizeof(*s->layers));
    s->nslots = max_microbatches;
    s->slots = calloc((size_t)max_microbatches, sizeof(*s->slots));
    if (!s->layers || !s->slots) {
        free(s->layers);
        free(s->slots);
        free(s);
        return bg_error(BG_ERR_NOMEM, "stage slots");
    }
    for (int i = 0; i < s->nlayers; i++)
        s->layers[i] = bg_model_layer(m, s->first + i);
    *stage_p = s;
    return BG_OK;
}

static void slot_free(bg_stage_t *s, slot_t *sl)
{
    bg_backend_t *be = s->be;
    bg_backend_free(be, sl->input);
    bg_backend_free(be, sl->tokens);
    bg_backend_free(be, sl->targets);
    bg_backend_free(be, sl->act);
    bg_backend_free(be, sl->keep_out);
    bg_backend_free(be, sl->dout_in);
    bg_backend_free(be, sl->bw);
    free(sl->shapes);
    free(sl->out);
    free(sl->stash);
    memset(sl, 0, sizeof(*sl));
}

void bg_stage_destroy(bg_stage_t *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->nslots; i++)
        slot_free(s, &s->slots[i]);
    bg_backend_free(s->be, s->scratch);
    free(s->slots);
    free(s->layers);
    free(s);
}

static bg_status_t get_slot(bg_stage_t *s, int mb, slot_state_t want, const char *op, slot_t **sl_p)
{
    static const char *names[] = {"free", "begun", "forwarded", "backward-input done", "done"};
    if (mb < 0 || mb >= s->nslots)
        return bg_error(BG_ERR_INVALID, "stage (layers %d..%d): microbatch %d out of range [0, %d) in %s", s->first,
                        s->first + s->nlayers - 1, mb, s->nslots, op);
    slot_t *sl = &s->slots[mb];
    if (sl->state != want)
        return bg_error(BG_ERR_INVALID, "stage (layers %d..%d): %s of microbatch %d, but it is %s (needs %s)",
                        s->first, s->first + s->nlayers - 1, op, mb, names[sl->state], names[want]);
    *sl_p = sl;
    return BG_OK;
}

static size_t scratch_need(const bg_stage_t *s, const bg_shape_t *sh);

static bg_status_t ensure_scratch(bg_stage_t *s, const bg_shape_t *shapes)
{
    size_t need = scratch_need(s, shapes);
    if (need <= s->scratch_bytes)
        return BG_OK;
    bg_backend_free(s->be, s->scratch);
    s->scratch = bg_backend_alloc(s->be, need, "stage scratch");
    s->scratch_bytes = s->scratch ? need : 0;
    return s->scratch ? BG_OK : BG_ERR_NOMEM;
}

static bg_status_t compute_shapes(bg_stage_t *s, bg_shape_t in, bg_shape_t *shapes)
{
    shapes[0] = in;
    for (int i = 0; i < s->nlayers; i++)
        BG_CHECK(bg_layer_out_shape(s->layers[i], shapes[i], &shapes[i + 1]));
    return BG_OK;
}

static int is_last_stage(const bg_stage_t *s)
{
    return bg_model_last_layer(s->model) == bg_model_total_layers(s->model) - 1;
}

/* Bytes of the fused backward's temporary: two ping-pong gradients and one wstash. */
static size_t fused_bytes(const bg_stage_t *s, const bg_shape_t *sh)
{
    size_t maxact = 0, maxw = 0;
    for (int i = 0; i <= s->nlayers; i++) {
        size_t b = bg_align64(bg_shape_numel(sh[i]) * sizeof(float));
        if ((i > 0 || (sh[0].c && s->first > 0)) && b > maxact)
            maxact = b;
    }
    for (int i = 0; i < s->nlayers; i++) {
        size_t b = bg_align64(bg_layer_wstash_bytes(s->layers[i], sh[i]));
        if (b > maxw)
            maxw = b;
    }
    return 2 * maxact + maxw;
}

/* Bytes of the split backward's arena: [dout_i, i<k-1][wstash_i][din]. */
static size_t split_bytes(const bg_stage_t *s, const bg_shape_t *sh, size_t *din_off_p)
{
    size_t total = 0;
    for (int i = 0; i < s->nlayers; i++)
        total += (i < s->nlayers - 1 ? bg_align64(bg_shape_numel(sh[i + 1]) * sizeof(float)) : 0) +
                 bg_align64(bg_layer_wstash_bytes(s->layers[i], sh[i]));
    if (din_off_p)
        *din_off_p = total;
    if (sh[0].c != 0 && s->first > 0) /* the model's own input needs no gradient */
        total += bg_align64(bg_shape_numel(sh[0]) * sizeof(float));
    return total;
}

static size_t act_bytes(const bg_stage_t *s, const bg_shape_t *sh)
{
    size_t total = 0;
    for (int i = 0; i < s->nlayers; i++)
        total += bg_align64(bg_shape_numel(sh[i + 1]) * sizeof(float)) +
                 bg_align64(bg_layer_stash_bytes(s->layers[i], sh[i]));
    return total;
}

static size_t scratch_need(const bg_stage_t *s, const bg_shape_t *sh)
{
    size_t need = 0;
    for (int i = 0; i < s->nlayers; i++) {
        size_t b = bg_layer_scratch_bytes(s->layers[i], sh[i]);
        if (b > need)
            need = b;
    }
    return need;
}

bg_status_t bg_stage_memory(bg_stage_t *s, bg_shape_t in, bg_stage_mem_t *mem_p)
{
    bg_shape_t *sh = malloc((size_t)(s->nlayers + 1) * sizeof(*sh));
    BG_ALLOC_CHECK(sh, (size_t)(s->nlayers + 1) * sizeof(*sh), "shapes");
    bg_status_t st = compute_shapes(s, in, sh);
    if (st != BG_OK) {
        free(sh);
        return st;
    }
    bg_stage_mem_t m = {0};
    m.stash = act_bytes(s, sh) + (in.c ? bg_shape_numel(in) * sizeof(float) : 0);
    if (s->recompute) {
        m.recompute = act_bytes(s, sh);
        m.stash = (in.c ? bg_shape_numel(in) * sizeof(float) : 0) + bg_shape_numel(sh[s->nlayers]) * sizeof(float);
    }
    size_t nt = (size_t)in.n * (size_t)in.t * sizeof(int32_t);
    m.data = (in.c == 0 ? nt : 0) + (is_last_stage(s) ? nt : 0);
    m.dout = is_last_stage(s) ? 0 : bg_shape_numel(sh[s->nlayers]) * sizeof(float);
    m.split_bw = split_bytes(s, sh, NULL);
    m.fused_bw = fused_bytes(s, sh);
    m.scratch = scratch_need(s, sh);
    free(sh);
    *mem_p = m;
    return BG_OK;
}

bg_status_t bg_stage_begin(bg_stage_t *s, int mb, bg_shape_t in, float **input_p)
{
    slot_t *sl = NULL;
    BG_CHECK(get_slot(s, mb, SLOT_FREE, "begin", &sl));
    bg_status_t st;
    sl->shapes = malloc((size_t)(s->nlayers + 1) * sizeof(*sl->shapes));
    sl->out = calloc((size_t)s->nlayers, sizeof(*sl->out));
    sl->stash = calloc((size_t)s->nlayers, sizeof(*sl->stash));
    if (!sl->shapes || !sl->out || !sl->stash) {
        st = bg_error(BG_ERR_NOMEM, "slot bookkeeping");
        goto err;
    }
    BG_CHECK_GOTO(compute_shapes(s, in, sl->shapes), st, err);
    if (in.c) {
        sl->input = bg_backend_alloc(s->be, bg_shape_numel(in) * sizeof(float), "stage input");
        if (!sl->input) {
            st = BG_ERR_NOMEM;
            goto err;
        }
    }
    sl->state = SLOT_BEGUN;
    *input_p = sl->input;
    return BG_OK;
err:
    slot_free(s, sl);
    return st;
}

bg_status_t bg_stage_slot_shapes(const bg_stage_t *s, int mb, bg_shape_t *in_p, bg_shape_t *out_p)
{
    if (mb < 0 || mb >= s->nslots || s->slots[mb].state == SLOT_FREE)
        return bg_error(BG_ERR_INVALID, "stage (layers %d..%d): shapes of microbatch %d, which has not begun",
                        s->first, s->first + s->nlayers - 1, mb);
    *in_p = s->slots[mb].shapes[0];
    *out_p = s->slots[mb].shapes[s->nlayers];
    return BG_OK;
}

bg_status_t bg_stage_set_data(bg_stage_t *s, int mb, const int32_t *tokens, const int32_t *targets, float loss_scale)
{
    slot_t *sl = NULL;
    BG_CHECK(get_slot(s, mb, SLOT_BEGUN, "set_data", &sl));
    size_t n = (size_t)sl->shapes[0].n * (size_t)sl->shapes[0].t;
    if (tokens) {
        if (!sl->tokens && !(sl->tokens = bg_backend_alloc(s->be, n * sizeof(int32_t), "tokens")))
            return BG_ERR_NOMEM;
        s->be->ops->from_host(s->be, sl->tokens, tokens, n * sizeof(int32_t));
    }
    if (targets) {
        if (!sl->targets && !(sl->targets = bg_backend_alloc(s->be, n * sizeof(int32_t), "targets")))
            return BG_ERR_NOMEM;
        s->be->ops->from_host(s->be, sl->targets, targets, n * sizeof(int32_t));
    }
    sl->loss_scale = loss_scale;
    return BG_OK;
}

static bg_layer_ctx_t make_ctx(bg_stage_t *s, slot_t *sl, int i)
{
    bg_layer_ctx_t c = {0};
    c.be = s->be;
    c.in = sl->shapes[i];
    c.tokens = sl->tokens;
    c.targets = sl->targets;
    c.loss_scale = sl->loss_scale;
    c.stash = sl->stash[i];
    c.scratch = s->scratch;
    return c;
}

/* Allocate the slot's activation arena and run the forward through it. */
static bg_status_t run_forward(bg_stage_t *s, slot_t *sl)
{
    size_t total = act_bytes(s, sl->shapes);
    BG_CHECK(ensure_scratch(s, sl->shapes));
    sl->act = bg_backend_alloc(s->be, total, "activations");
    if (!sl->act)
        return BG_ERR_NOMEM;
    char *p = sl->act;
    for (int i = 0; i < s->nlayers; i++) {
        sl->out[i] = (float *)p;
        p += bg_align64(bg_shape_numel(sl->shapes[i + 1]) * sizeof(float));
        sl->stash[i] = p;
        p += bg_align64(bg_layer_stash_bytes(s->layers[i], sl->shapes[i]));
    }
    const float *x = sl->input;
    for (int i = 0; i < s->nlayers; i++) {
        bg_layer_ctx_t c = make_ctx(s, sl, i);
        bg_status_t st = s->layers[i]->ops->forward(s->layers[i], &c, x, sl->out[i]);
        if (st != BG_OK) {
            bg_backend_free(s->be, sl->act);
            sl->act = NULL;
            return st;
        }
        x = sl->out[i];
    }
    return BG_OK;
}

bg_status_t bg_stage_forward(bg_stage_t *s, int mb, float **out_p, bg_shape_t *out_shape_p)
{
    slot_t *sl = NULL;
    BG_CHECK(get_slot(s, mb, SLOT_BEGUN, "forward", &sl));
    BG_CHECK(run_forward(s, sl));
    float *out = sl->out[s->nlayers - 1];
    if (s->recompute) {
        /* keep the output (it is sent, or it is the loss), drop the rest: the
         * backward recomputes it from the kept input */
        size_t n = bg_shape_numel(sl->shapes[s->nlayers]);
        sl->keep_out = bg_backend_alloc(s->be, n * sizeof(float), "stage output (recompute)");
        if (!sl->keep_out)
            return BG_ERR_NOMEM;
        s->be->ops->copy(s->be, sl->keep_out, out, n);
        bg_backend_free(s->be, sl->act);
        sl->act = NULL;
        out = sl->keep_out;
    }
    sl->state = SLOT_FORWARD;
    *out_p = out;
    *out_shape_p = sl->shapes[s->nlayers];
    return BG_OK;
}

bg_status_t bg_stage_grad_buffer(bg_stage_t *s, int mb, float **dout_p)
{
    if (mb < 0 || mb >= s->nslots || s->slots[mb].state == SLOT_FREE)
        return bg_error(BG_ERR_INVALID, "stage (layers %d..%d): gradient buffer of microbatch %d before it began",
                        s->first, s->first + s->nlayers - 1, mb);
    slot_t *sl = &s->slots[mb];
    if (!sl->dout_in) {
        sl->dout_in = bg_backend_alloc(s->be, bg_shape_numel(sl->shapes[s->nlayers]) * sizeof(float),
                                       "incoming gradient");
        if (!sl->dout_in)
            return BG_ERR_NOMEM;
    }
    *dout_p = sl->dout_in;
    return BG_OK;
}

/* Split backward: arena [dout_i, i<k-1][wstash_i][din]. */
static float *bw_dout(bg_stage_t *s, slot_t *sl, int i)
{
    if (i == s->nlayers - 1)
        return sl->dout_in; /* NULL on the last stage: the loss layer needs none */
    char *p = sl->bw;
    for (int j = 0; j < i; j++)
        p += bg_align64(bg_shape_numel(sl->shapes[j + 1]) * sizeof(float));
    return (float *)p;
}
static char *bw_wstash(bg_stage_t *s, slot_t *sl, int i)
{
    char *p = sl->bw;
    for (int j = 0; j < s->nlayers - 1; j++)
        p += bg_align64(bg_shape_numel(sl->shapes[j + 1]) * sizeof(float));
    for (int j = 0; j < i; j++)
        p += bg_align64(bg_layer_wstash_bytes(s->layers[j], sl->shapes[j]));
    return p;
}

static bg_status_t check_dout(bg_stage_t *s, slot_t *sl, int mb)
{
    if (!is_last_stage(s) && !sl->dout_in)
        return bg_error(BG_ERR_INVALID, "stage (layers %d..%d): backward of microbatch %d without its output gradient",
                        s->first, s->first + s->nlayers - 1, mb);
    return BG_OK;
}

bg_status_t bg_stage_backward_input(bg_stage_t *s, int mb, float **din_p)
{
    slot_t *sl = NULL;
    BG_CHECK(get_slot(s, mb, SLOT_FORWARD, "backward_input", &sl));
    BG_CHECK(check_dout(s, sl, mb));
    if (!sl->act)
        BG_CHECK(run_forward(s, sl)); /* recompute */
    int has_din = sl->shapes[0].c != 0 && s->first > 0; /* the model's own input needs no gradient */
    size_t din_off;
    size_t total = split_bytes(s, sl->shapes, &din_off);
    sl->bw = bg_backend_alloc(s->be, total, "backward (B to W)");
    if (!sl->bw)
        return BG_ERR_NOMEM;
    sl->din = has_din ? (float *)(sl->bw + din_off) : NULL;
    for (int i = s->nlayers - 1; i >= 0; i--) {
        bg_layer_ctx_t c = make_ctx(s, sl, i);
        c.wstash = bw_wstash(s, sl, i);
        const float *x = i > 0 ? sl->out[i - 1] : sl->input;
        float *dx = i > 0 ? bw_dout(s, sl, i - 1) : sl->din;
        BG_CHECK(s->layers[i]->ops->backward_input(s->layers[i], &c, x, sl->out[i], bw_dout(s, sl, i), dx));
    }
    sl->state = SLOT_BINPUT;
    *din_p = sl->din;
    return BG_OK;
}

bg_status_t bg_stage_backward_weight(bg_stage_t *s, int mb)
{
    slot_t *sl = NULL;
    BG_CHECK(get_slot(s, mb, SLOT_BINPUT, "backward_weight", &sl));
    for (int i = s->nlayers - 1; i >= 0; i--) {
        if (!s->layers[i]->ops->backward_weight)
            continue;
        bg_layer_ctx_t c = make_ctx(s, sl, i);
        c.wstash = bw_wstash(s, sl, i);
        const float *x = i > 0 ? sl->out[i - 1] : sl->input;
        BG_CHECK(s->layers[i]->ops->backward_weight(s->layers[i], &c, x, sl->out[i], bw_dout(s, sl, i)));
        if (s->layer_done)
            BG_CHECK(s->layer_done(s->first + i, mb, s->layer_done_arg));
    }
    slot_free(s, sl);
    return BG_OK;
}

bg_status_t bg_stage_backward(bg_stage_t *s, int mb, float **din_p)
{
    slot_t *sl = NULL;
    BG_CHECK(get_slot(s, mb, SLOT_FORWARD, "backward", &sl));
    BG_CHECK(check_dout(s, sl, mb));
    if (!sl->act)
        BG_CHECK(run_forward(s, sl)); /* recompute */
    size_t maxact = 0;
    for (int i = 0; i <= s->nlayers; i++) {
        size_t b = bg_align64(bg_shape_numel(sl->shapes[i]) * sizeof(float));
        if ((i > 0 || (sl->shapes[0].c && s->first > 0)) && b > maxact)
            maxact = b;
    }
    sl->bw = bg_backend_alloc(s->be, fused_bytes(s, sl->shapes), "backward");
    if (!sl->bw)
        return BG_ERR_NOMEM;
    float *buf[2] = {(float *)sl->bw, (float *)(sl->bw + maxact)};
    char *wst = sl->bw + 2 * maxact;
    const float *dout = sl->dout_in;
    int which = 0;
    for (int i = s->nlayers - 1; i >= 0; i--) {
        bg_layer_ctx_t c = make_ctx(s, sl, i);
        c.wstash = wst;
        const float *x = i > 0 ? sl->out[i - 1] : sl->input;
        float *dx = (i > 0 || (sl->shapes[0].c && s->first > 0)) ? buf[which] : NULL;
        BG_CHECK(s->layers[i]->ops->backward_input(s->layers[i], &c, x, sl->out[i], dout, dx));
        if (s->layers[i]->ops->backward_weight)
            BG_CHECK(s->layers[i]->ops->backward_weight(s->layers[i], &c, x, sl->out[i], dout));
        if (s->layer_done)
            BG_CHECK(s->layer_done(s->first + i, mb, s->layer_done_arg));
        dout = dx;
        which ^= 1;
    }
    sl->din = (float *)dout;
    sl->state = SLOT_DONE;
    *din_p = sl->din;
    return BG_OK;
}

void bg_stage_end(bg_stage_t *s, int mb)
{
    if (mb >= 0 && mb < s->nslots)
        slot_free(s, &s->slots[mb]);
}
