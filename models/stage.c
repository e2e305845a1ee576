/* models/stage.c: runs a model's layer range on microbatches. Each
 * microbatch lives in a slot from bg_stage_begin until its last backward
 * piece; every buffer is counted by the backend's allocator, so the peak
 * activation memory of a schedule is measured, not estimated.
 *
 * Slot memory:
 *   input   (n,t,c) floats, when the stage's input is an activation
 *   tokens (n*t int32), when given; targets (one int32 per loss: the last output's n*t), when given
 *   act     for each layer i: [out_i][stash_i]        (F .. end of backward)
 *   dout_in incoming output gradient                   (recv .. end of backward)
 *   bw      split backward: [dout_i, i<k-1][wstash_i][din]   (B .. W)
 *           fused backward: [ping][pong][wstash max]         (.. bg_stage_end)
 * Precision: the activations between two top-level layers (each layer's output
 * but the model's last, the losses; the input of every stage but the first) are
 * kept in the model's precision (bg_model_desc_precision): in bf16, 2 bytes an
 * element, and sent so between stages. A layer still gets fp32: its call's
 * input and output are fp32 copies at the start of the stage's scratch,
 * [input][output][the layer's scratch], widened from what is kept (the output
 * is stored rounded after the forward), so every layer reads the rounded
 * value, forward and backward, wherever the model is split. Gradients are fp32.
 * The stage's scratch buffer (temporaries of one call) is shared by all slots
 * of a lane: a slot's calls use its lane's (bg_stage_set_lane), so two calls
 * may be in progress at once (two coroutines on the rank's thread) when
 * their slots are on different lanes.
 *
 * Guard zones (BRIGADE_GUARD): every piece handed to a layer (outputs,
 * stashes, wstashes, the inner and input gradients, the scratch) is followed
 * by a zone from its reported size to GUARD_BYTES past its aligned end, filled
 * with a pattern before each layer call and compared after it; a changed byte
 * fails the call naming the layer and the buffer. Under AddressSanitizer the
 * zones (and the rest of a shared piece past the call's size) are poisoned
 * during the call, so a read past a reported size is reported too.
 *
 * Canaries (BRIGADE_GUARD=canary, the default of Release builds): the same
 * zones, but only their first CANARY_BYTES are written and compared, on host
 * backends (on a device each check would be a synchronous copy): a layer
 * that writes past a reported size fails the call naming itself in every
 * build, at the cost of a few bytes copied per buffer and call. The zones'
 * bytes are memory like any other: bg_stage_memory and bg_model_profile
 * (through bg__guard_bytes) count them, so predictions match the allocator;
 * with guards off the stage allocates exactly what the layers report. */
#include <stdlib.h>
#include <string.h>

#include "brigade/model.h"
#include "core/check.h"
#include "models/layer_impl.h"

#if defined(__SANITIZE_ADDRESS__)
#define BG__GUARD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BG__GUARD_ASAN 1
#endif
#endif
#ifdef BG__GUARD_ASAN
#include <sanitizer/asan_interface.h>
#define GUARD_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define GUARD_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define GUARD_POISON(p, n) ((void)(p), (void)(n))
#define GUARD_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define MAX_LAYERS_STAGE 4096
/* Bytes of guard after each piece's 64-byte aligned end: a zone is
 * [reported, align64(reported) + GUARD_BYTES), 64 to 127 bytes. */
#define GUARD_BYTES 64
/* Bytes of a zone a canary check writes and compares (the first of the zone). */
#define CANARY_BYTES 8

typedef enum { SLOT_FREE = 0, SLOT_BEGUN, SLOT_FORWARD, SLOT_BINPUT, SLOT_DONE } slot_state_t;

typedef struct slot {
    slot_state_t state;
    bg_shape_t *shapes; /* nlayers + 1 input shapes */
    float *input;
    int32_t *tokens, *targets;
    float loss_scale;
    char *act;          /* NULL between F and B when recomputing, or while offloaded */
    int offloaded;      /* act's bytes are in the caller's host buffer (bg_stage_stash_out) */
    float *keep_out;    /* recompute: the stage's output, kept while act is dropped */
    float **out;        /* per layer output pointer (into act) */
    char **stash;       /* per layer stash pointer (into act) */
    float *dout_in;
    char *bw;
    float *din;
    int lane;           /* whose scratch its calls use: 0 or 1 */
} slot_t;

struct bg_stage {
    bg_model_t *model;
    bg_backend_t *be;
    int first, nlayers;
    bg_layer_t **layers;
    int nslots;
    slot_t *slots;
    void *scratch[2]; /* per lane; lane 1's only once a slot used it */
    size_t scratch_bytes[2];
    bg_stage_layer_done_fn layer_done;
    void *layer_done_arg;
    bg_stage_layer_begin_fn layer_begin;
    void *layer_begin_arg;
    int recompute;      /* keep only input and output between F and B; rerun F in B */
    int forward_only;   /* bg_stage_set_forward_only: no backward follows the forwards */
    size_t gz;          /* guard bytes after each piece: GUARD_BYTES, or 0 with guards off */
    size_t check;       /* bytes of each zone written and compared: the zone (full guards), CANARY_BYTES
                           (canaries, host backends), 0 (none) */
    int poison;         /* ASan build on a host backend: poison the zones during calls */
    int emulate;        /* allocate every buffer, run no layer (bg_stage_set_emulate) */
    int tp_weight;      /* BRIGADE_TP_OVERLAP=weight: the fused backward runs bg_layer_backward */
    size_t es;          /* bytes an element of a kept activation between two layers: 4, or 2 (bf16) */
    int total;          /* layers of the whole model */
};

typedef enum { GUARD_OFF, GUARD_CANARY, GUARD_FULL } guard_mode_t;

/* How stages guard their buffers: BRIGADE_GUARD=auto|on|off|canary; auto is
 * on (full zones) in builds that define BG_GUARD_AUTO_ON (ASan or Debug, see
 * models/CMakeLists.txt), canaries otherwise. */
static bg_status_t guard_mode(guard_mode_t *mode_p)
{
    const char *v = bg_config_str("BRIGADE_GUARD");
    if (strcmp(v, "on") == 0)
        *mode_p = GUARD_FULL;
    else if (strcmp(v, "off") == 0)
        *mode_p = GUARD_OFF;
    else if (strcmp(v, "canary") == 0)
        *mode_p = GUARD_CANARY;
    else if (strcmp(v, "auto") == 0) {
#ifdef BG_GUARD_AUTO_ON
        *mode_p = GUARD_FULL;
#else
        *mode_p = GUARD_CANARY;
#endif
    } else
        return bg_error(BG_ERR_INVALID, "BRIGADE_GUARD=\"%s\": expected auto, on, off or canary", v);
    return BG_OK;
}

size_t bg__guard_bytes(void)
{
    guard_mode_t m = GUARD_OFF;
    if (guard_mode(&m) != BG_OK)
        bg_error_clear(); /* bg_stage_create reports it */
    return m == GUARD_OFF ? 0 : GUARD_BYTES;
}

void bg_stage_set_recompute(bg_stage_t *s, int on) { s->recompute = on ? 1 : 0; }
void bg_stage_set_forward_only(bg_stage_t *s, int on) { s->forward_only = on ? 1 : 0; }
int bg_stage_recompute(const bg_stage_t *s) { return s->recompute; }
void bg_stage_set_emulate(bg_stage_t *s, int on) { s->emulate = on ? 1 : 0; }

void bg_stage_set_layer_done(bg_stage_t *s, bg_stage_layer_done_fn fn, void *arg)
{
    s->layer_done = fn;
    s->layer_done_arg = arg;
}

void bg_stage_set_layer_begin(bg_stage_t *s, bg_stage_layer_begin_fn fn, void *arg)
{
    s->layer_begin = fn;
    s->layer_begin_arg = arg;
}

/* The layer-begin callback of layer i (the stage's index) before a pass's compute. */
static bg_status_t layer_begin(bg_stage_t *s, int i, int mb, bg_stage_pass_t pass)
{
    return s->layer_begin ? s->layer_begin(s->first + i, mb, pass, s->layer_begin_arg) : BG_OK;
}

bg_status_t bg_stage_create(bg_model_t *m, int max_microbatches, bg_stage_t **stage_p)
{
    if (max_microbatches < 1)
        return bg_error(BG_ERR_INVALID, "a stage needs at least one microbatch slot (got %d)", max_microbatches);
    guard_mode_t guard = GUARD_OFF;
    int fuse = 0;
    BG_CHECK(guard_mode(&guard));
    BG_CHECK(bg__layer_fuse_setting(&fuse));
    const char *ov = bg_config_str("BRIGADE_TP_OVERLAP");
    if (strcmp(ov, "weight") && strcmp(ov, "layer") && strcmp(ov, "microbatch"))
        return bg_error(BG_ERR_INVALID, "BRIGADE_TP_OVERLAP=\"%s\": expected weight, layer or microbatch", ov);
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
    s->gz = guard != GUARD_OFF ? GUARD_BYTES : 0;
    int host = strcmp(s->be->ops->name, "cpu") == 0;
    s->check = guard == GUARD_FULL ? 2 * GUARD_BYTES : guard == GUARD_CANARY && host ? CANARY_BYTES : 0;
    s->es = bg_dtype_size(bg_model_desc_precision(bg_model_desc(m)));
    s->total = bg_model_total_layers(m);
    s->tp_weight = strcmp(ov, "layer") != 0; /* microbatch: the executor pairs instructions, and weight */
#ifdef BG__GUARD_ASAN
    s->poison = guard == GUARD_FULL && host; /* shadow memory covers host memory only */
#endif
    *stage_p = s;
    return BG_OK;
}

/* Free all of a slot's memory but its backward buffer (bw: din, after a fused backward). */
static void slot_release(bg_stage_t *s, slot_t *sl)
{
    bg_backend_t *be = s->be;
    bg_backend_free(be, sl->input);
    bg_backend_free(be, sl->tokens);
    bg_backend_free(be, sl->targets);
    bg_backend_free(be, sl->act);
    bg_backend_free(be, sl->keep_out);
    bg_backend_free(be, sl->dout_in);
    sl->input = sl->keep_out = sl->dout_in = NULL;
    sl->tokens = sl->targets = NULL;
    sl->act = NULL;
    for (int i = 0; sl->out && sl->stash && i < s->nlayers; i++)
        sl->out[i] = NULL, sl->stash[i] = NULL;
}

static void slot_free(bg_stage_t *s, slot_t *sl)
{
    slot_release(s, sl);
    bg_backend_free(s->be, sl->bw);
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
    bg_backend_free(s->be, s->scratch[0]);
    bg_backend_free(s->be, s->scratch[1]);
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

static size_t scratch_need(const bg_stage_t *s, const bg_shape_t *sh, size_t gz);

/* Bytes the stage sets aside for a piece the layer reports as `bytes`: its
 * aligned size, plus its guard zone when guards are on (gz > 0). */
static size_t piece(size_t bytes, size_t gz) { return bg__align64(bytes) + gz; }

/* Bytes of an activation (or its gradient) of shape sh in fp32. */
static size_t act_size(bg_shape_t sh) { return bg_shape_numel(sh) * sizeof(float); }

/* Bytes an element of the activation entering stage layer i as the stage keeps it (i = 0: the stage's
 * input; the model's own input is fp32 features or tokens), and of layer i's output (the model's last
 * layer's, the losses, is fp32). out_es(i) = in_es(i + 1). */
static size_t in_es(const bg_stage_t *s, int i) { return bg__kept_es(s->es, s->first + i - 1, s->total); }
static size_t out_es(const bg_stage_t *s, int i) { return bg__kept_es(s->es, s->first + i, s->total); }
static bg_dtype_t es_type(size_t es) { return es == 2 ? BG_BF16 : BG_F32; }

/* bf16: the pieces of layer i's fp32 input and output copies at the start of the scratch (0: kept in fp32,
 * the layer reads and writes the kept buffer itself). */
static void temp_pieces(const bg_stage_t *s, const bg_shape_t *sh, int i, size_t gz, size_t *tin_p, size_t *tout_p)
{
    *tin_p = sh[i].c && in_es(s, i) == 2 ? piece(act_size(sh[i]), gz) : 0;
    *tout_p = out_es(s, i) == 2 ? piece(act_size(sh[i + 1]), gz) : 0;
}

/* Where layer i's own scratch starts in the stage's scratch, and the bytes its call needs in all. */
static size_t layer_scratch_at(const bg_stage_t *s, const bg_shape_t *sh, int i, size_t gz)
{
    size_t tin, tout;
    temp_pieces(s, sh, i, gz, &tin, &tout);
    return tin + tout;
}
static size_t layer_scratch_need(const bg_stage_t *s, const bg_shape_t *sh, int i, size_t gz)
{
    return bg__call_scratch(layer_scratch_at(s, sh, i, gz), bg_layer_scratch_bytes(s->layers[i], sh[i]));
}

/* A buffer of the stage (of slot sl; NULL: the stage's own): on failure, the backend's message (the buffer,
 * the bytes asked and free) prefixed with whose it is. */
static void *stage_alloc(bg_stage_t *s, const slot_t *sl, size_t bytes, const char *what)
{
    void *p = bg_backend_alloc(s->be, bytes, what);
    if (!p) {
        char mb[32] = "";
        if (sl)
            snprintf(mb, sizeof mb, ", microbatch %d", (int)(sl - s->slots));
        bg_error(BG_ERR_NOMEM, "stage of layers %d..%d (%s .. %s)%s: %s", s->first, s->first + s->nlayers - 1,
                 s->layers[0]->name, s->layers[s->nlayers - 1]->name, mb, bg_last_error());
    }
    return p;
}

/* The scratch of slot sl's lane, large enough for its shapes. */
static bg_status_t ensure_scratch(bg_stage_t *s, const slot_t *sl)
{
    size_t need = scratch_need(s, sl->shapes, s->gz);
    int k = sl->lane;
    if (need <= s->scratch_bytes[k] && (s->scratch[k] || !s->gz))
        return BG_OK;
    bg_backend_free(s->be, s->scratch[k]);
    s->scratch[k] = stage_alloc(s, NULL, s->gz ? piece(need, s->gz) : need, k ? "stage scratch (lane 1)" : "stage scratch");
    s->scratch_bytes[k] = s->scratch[k] ? need : 0;
    return s->scratch[k] ? BG_OK : BG_ERR_NOMEM;
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

/* The largest gradient the fused backward's ping-pong buffers hold (aligned). */
static size_t fused_maxact(const bg_stage_t *s, const bg_shape_t *sh)
{
    size_t maxact = 0;
    for (int i = 0; i <= s->nlayers; i++) {
        size_t b = bg__align64(act_size(sh[i]));
        if ((i > 0 || (sh[0].c && s->first > 0)) && b > maxact)
            maxact = b;
    }
    return maxact;
}

/* The largest wstash of the stage's layers (aligned). */
static size_t fused_maxw(const bg_stage_t *s, const bg_shape_t *sh)
{
    size_t maxw = 0;
    for (int i = 0; i < s->nlayers; i++) {
        size_t b = bg__align64(bg_layer_wstash_bytes(s->layers[i], sh[i]));
        if (b > maxw)
            maxw = b;
    }
    return maxw;
}

/* Bytes of the fused backward's temporary: two ping-pong gradients and one wstash. */
static size_t fused_bytes(const bg_stage_t *s, const bg_shape_t *sh, size_t gz)
{
    return 2 * (fused_maxact(s, sh) + gz) + fused_maxw(s, sh) + gz;
}

/* Bytes of the split backward's arena: [dout_i, i<k-1][wstash_i][din]. */
static size_t split_bytes(const bg_stage_t *s, const bg_shape_t *sh, size_t gz, size_t *din_off_p)
{
    size_t total = 0;
    for (int i = 0; i < s->nlayers; i++)
        total += (i < s->nlayers - 1 ? piece(act_size(sh[i + 1]), gz) : 0) +
                 piece(bg_layer_wstash_bytes(s->layers[i], sh[i]), gz);
    if (din_off_p)
        *din_off_p = total;
    if (sh[0].c != 0 && s->first > 0) /* the model's own input needs no gradient */
        total += piece(act_size(sh[0]), gz);
    return total;
}

static size_t act_bytes(const bg_stage_t *s, const bg_shape_t *sh, size_t gz)
{
    size_t total = 0;
    for (int i = 0; i < s->nlayers; i++)
        total += piece(bg_shape_numel(sh[i + 1]) * out_es(s, i), gz) + piece(bg_layer_stash_bytes(s->layers[i], sh[i]), gz);
    return total;
}

static size_t scratch_need(const bg_stage_t *s, const bg_shape_t *sh, size_t gz)
{
    size_t need = 0;
    for (int i = 0; i < s->nlayers; i++) {
        size_t b = layer_scratch_need(s, sh, i, gz);
        if (b > need)
            need = b;
    }
    return need;
}

/* What the stage allocates per microbatch for what the layers report, guard zones included. */
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
    size_t inb = in.c ? bg_shape_numel(in) * in_es(s, 0) : 0;
    m.stash = act_bytes(s, sh, s->gz) + inb;
    if (s->recompute) {
        m.recompute = act_bytes(s, sh, s->gz);
        m.stash = inb + bg_shape_numel(sh[s->nlayers]) * out_es(s, s->nlayers - 1);
    }
    size_t nt = (size_t)in.n * (size_t)in.t * sizeof(int32_t);
    size_t nl = (size_t)sh[s->nlayers].n * (size_t)sh[s->nlayers].t * sizeof(int32_t); /* targets: one per loss */
    m.data = (in.c == 0 ? nt : 0) + (is_last_stage(s) ? nl : 0);
    m.dout = is_last_stage(s) ? 0 : bg_shape_numel(sh[s->nlayers]) * sizeof(float);
    m.split_bw = split_bytes(s, sh, s->gz, NULL);
    m.fused_bw = fused_bytes(s, sh, s->gz);
    m.scratch = s->gz ? piece(scratch_need(s, sh, s->gz), s->gz) : scratch_need(s, sh, 0); /* as ensure_scratch */
    free(sh);
    *mem_p = m;
    return BG_OK;
}

/* ---- guard zones ---- */

typedef enum { G_OUT, G_STASH, G_WSTASH, G_DIN, G_SCRATCH, G_IN, G_DOUT } guard_kind_t;

/* One piece a layer call gets: `bytes` reported, `cap` bytes set aside from p
 * (a shared piece, the scratch or a fused buffer, may hold more than this
 * call's size; ASan poisons all of [bytes, cap) during the call). */
typedef struct guard_piece {
    guard_kind_t kind;
    char *p;
    size_t bytes, cap;
} guard_piece_t;

#define GUARD_MAX_PIECES 8

typedef struct guard_call {
    int n;
    guard_piece_t g[GUARD_MAX_PIECES];
} guard_call_t;

/* Add a piece (NULL pointers, and buffers the stage does not guard, are skipped). */
static void guard_add(guard_call_t *gc, guard_kind_t kind, const void *p, size_t bytes, size_t cap)
{
    if (p && gc->n < GUARD_MAX_PIECES)
        gc->g[gc->n++] = (guard_piece_t){kind, (char *)p, bytes, cap};
}

/* The pattern byte at offset k of a zone: not a value a float store makes by chance. */
static unsigned char guard_byte(size_t k) { return (unsigned char)(0xA5u ^ (unsigned)(k * 0x3Bu)); }

/* Fill every zone with the pattern, then poison [bytes, cap) (ASan, host backends). */
static void guards_arm(bg_stage_t *s, guard_call_t *gc)
{
    unsigned char pat[2 * GUARD_BYTES];
    for (size_t k = 0; k < sizeof(pat); k++)
        pat[k] = guard_byte(k);
    for (int j = 0; j < gc->n; j++) {
        guard_piece_t *g = &gc->g[j];
        size_t zone = piece(g->bytes, s->gz) - g->bytes;
        if (zone > s->check)
            zone = s->check;
        s->be->ops->from_host(s->be, g->p + g->bytes, pat, zone);
        if (s->poison)
            GUARD_POISON(g->p + g->bytes, g->cap - g->bytes);
    }
}

static const char *shape_str(char *buf, size_t n, bg_shape_t sh)
{
    snprintf(buf, n, "(n %d, t %d, c %d)", sh.n, sh.t, sh.c);
    return buf;
}

/* Unpoison, then (when the call succeeded) compare every zone with the
 * pattern; a changed byte fails the call naming the layer and the buffer. */
static bg_status_t guards_check(bg_stage_t *s, guard_call_t *gc, bg_status_t st, int i, const bg_shape_t *sh,
                                const char *call)
{
    for (int j = 0; j < gc->n; j++)
        if (s->poison)
            GUARD_UNPOISON(gc->g[j].p + gc->g[j].bytes, gc->g[j].cap - gc->g[j].bytes);
    if (st != BG_OK)
        return st; /* the layer's own error says more */
    unsigned char zone[2 * GUARD_BYTES];
    for (int j = 0; j < gc->n; j++) {
        const guard_piece_t *g = &gc->g[j];
        size_t len = piece(g->bytes, s->gz) - g->bytes, k = 0;
        if (len > s->check)
            len = s->check;
        s->be->ops->to_host(s->be, zone, g->p + g->bytes, len);
        while (k < len && zone[k] == guard_byte(k))
            k++;
        if (k == len)
            continue;
        const bg_layer_t *l = s->layers[i];
        char in[64], out[64], what[192];
        shape_str(in, sizeof(in), sh[i]);
        shape_str(out, sizeof(out), sh[i + 1]);
        static const char *const names[] = {[G_OUT] = "output",     [G_STASH] = "stash",
                                            [G_WSTASH] = "wstash",  [G_DIN] = "input gradient",
                                            [G_SCRATCH] = "scratch", [G_IN] = "input",
                                            [G_DOUT] = "output gradient"};
        switch (g->kind) {
        case G_STASH:
        case G_WSTASH:
        case G_SCRATCH:
            snprintf(what, sizeof(what), "it reports %s_bytes = %zu for input %s", names[g->kind], g->bytes, in);
            break;
        case G_OUT:
        case G_DOUT:
            snprintf(what, sizeof(what), "its out_shape for input %s is %s = %zu bytes", in, out, g->bytes);
            break;
        default: /* G_IN, G_DIN */
            snprintf(what, sizeof(what), "its input %s is %zu bytes", in, g->bytes);
            break;
        }
        return bg_error(BG_ERR_INVALID,
                        "layer %s (type %s, model layer %d) wrote past its %s in %s: %s, but bytes after that "
                        "changed (guard at offset %zu)",
                        l->name, l->ops->type ? l->ops->type : "?", s->first + i, names[g->kind], call, what,
                        g->bytes + k);
    }
    return BG_OK;
}

/* The pieces of layer i's call that every call shares: its input (the
 * previous layer's output), output, stash and the scratch. */
static void guard_common(bg_stage_t *s, const slot_t *sl, int i, const float *x, const float *out,
                         const bg_layer_ctx_t *c, guard_call_t *gc)
{
    const bg_shape_t *sh = sl->shapes;
    gc->n = 0;
    if (!s->check)
        return;
    size_t ob = act_size(sh[i + 1]), sb = bg_layer_stash_bytes(s->layers[i], sh[i]);
    size_t cb = bg_layer_scratch_bytes(s->layers[i], sh[i]);
    guard_add(gc, G_OUT, out, ob, piece(ob, s->gz));
    guard_add(gc, G_STASH, c->stash, sb, piece(sb, s->gz));
    size_t at = (size_t)((const char *)c->scratch - (const char *)s->scratch[sl->lane]); /* after the copies */
    guard_add(gc, G_SCRATCH, c->scratch, cb, piece(s->scratch_bytes[sl->lane], s->gz) - at);
    if (i > 0 || x != sl->input) /* the stage's own input buffer has no guard (its fp32 copy has) */
        guard_add(gc, G_IN, x, act_size(sh[i]), piece(act_size(sh[i]), s->gz));
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
        sl->input = stage_alloc(s, sl, bg_shape_numel(in) * in_es(s, 0), "stage input");
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

bg_dtype_t bg_stage_input_dtype(const bg_stage_t *s) { return es_type(in_es(s, 0)); }
bg_dtype_t bg_stage_output_dtype(const bg_stage_t *s) { return es_type(out_es(s, s->nlayers - 1)); }

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
    /* a target per loss: the positions of the last output (under sequence
     * parallelism the input of a later stage holds a part of them) */
    size_t nt = (size_t)sl->shapes[s->nlayers].n * (size_t)sl->shapes[s->nlayers].t;
    if (tokens) {
        if (!sl->tokens && !(sl->tokens = stage_alloc(s, sl, n * sizeof(int32_t), "tokens")))
            return BG_ERR_NOMEM;
        s->be->ops->from_host(s->be, sl->tokens, tokens, n * sizeof(int32_t));
    }
    if (targets) {
        if (!sl->targets && !(sl->targets = stage_alloc(s, sl, nt * sizeof(int32_t), "targets")))
            return BG_ERR_NOMEM;
        s->be->ops->from_host(s->be, sl->targets, targets, nt * sizeof(int32_t));
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
    c.scratch = (char *)s->scratch[sl->lane] + layer_scratch_at(s, sl->shapes, i, s->gz);
    c.tp = bg_model_desc_tp(bg_model_desc(s->model));
    c.ep = bg_model_desc_ep(bg_model_desc(s->model));
    c.cp = bg_model_desc_cp(bg_model_desc(s->model));
    return c;
}

/* Layer i's input and output in fp32 for a call: the kept buffers, or (bf16) their copies at the start of
 * the slot's lane's scratch, widened from what is kept (the output's only when @p widen_out: a forward
 * writes it). */
static void layer_io(bg_stage_t *s, slot_t *sl, int i, int widen_out, const float **x_p, float **y_p)
{
    size_t tin, tout;
    temp_pieces(s, sl->shapes, i, s->gz, &tin, &tout);
    char *scr = s->scratch[sl->lane];
    const void *x = i > 0 ? (const void *)sl->out[i - 1] : (const void *)sl->input;
    *x_p = x;
    *y_p = sl->out[i];
    if (tin) {
        s->be->ops->convert(s->be, scr, BG_F32, x, BG_BF16, bg_shape_numel(sl->shapes[i]));
        *x_p = (const float *)scr;
    }
    if (tout) {
        *y_p = (float *)(scr + tin);
        if (widen_out)
            s->be->ops->convert(s->be, *y_p, BG_F32, sl->out[i], BG_BF16, bg_shape_numel(sl->shapes[i + 1]));
    }
}

/* Aim the slot's per-layer outputs and stashes into its arena: for each layer [out_i][stash_i]. */
static void aim_act(bg_stage_t *s, slot_t *sl)
{
    char *p = sl->act;
    for (int i = 0; i < s->nlayers; i++) {
        sl->out[i] = (float *)p;
        p += piece(bg_shape_numel(sl->shapes[i + 1]) * out_es(s, i), s->gz);
        sl->stash[i] = p;
        p += piece(bg_layer_stash_bytes(s->layers[i], sl->shapes[i]), s->gz);
    }
}

/* Allocate the slot's activation arena and run the forward through it; no_backward: the layers' stashes are
 * dropped when it returns (bg_layer_ctx_t.no_backward). */
static bg_status_t run_forward(bg_stage_t *s, slot_t *sl, int mb, bg_stage_pass_t pass, int no_backward)
{
    size_t total = act_bytes(s, sl->shapes, s->gz);
    BG_CHECK(ensure_scratch(s, sl));
    sl->act = stage_alloc(s, sl, total, "activations");
    if (!sl->act)
        return BG_ERR_NOMEM;
    aim_act(s, sl);
    for (int i = 0; i < s->nlayers && !s->emulate; i++) {
        bg_layer_ctx_t c = make_ctx(s, sl, i);
        c.no_backward = no_backward;
        const float *x;
        float *y;
        layer_io(s, sl, i, 0, &x, &y);
        guard_call_t gc;
        guard_common(s, sl, i, x, y, &c, &gc);
        bg_status_t st = layer_begin(s, i, mb, pass);
        guards_arm(s, &gc);
        if (st == BG_OK)
            st = s->layers[i]->ops->forward(s->layers[i], &c, x, y);
        st = guards_check(s, &gc, st, i, sl->shapes, "forward");
        if (st != BG_OK) {
            bg_backend_free(s->be, sl->act);
            sl->act = NULL;
            return st;
        }
        if (y != sl->out[i]) /* kept in bf16, rounded: the next layer widens it */
            s->be->ops->convert(s->be, sl->out[i], BG_BF16, y, BG_F32, bg_shape_numel(sl->shapes[i + 1]));
    }
    return BG_OK;
}

bg_status_t bg_stage_forward(bg_stage_t *s, int mb, float **out_p, bg_shape_t *out_shape_p)
{
    slot_t *sl = NULL;
    BG_CHECK(get_slot(s, mb, SLOT_BEGUN, "forward", &sl));
    BG_CHECK(run_forward(s, sl, mb, BG_PASS_FORWARD, s->recompute || s->forward_only));
    float *out = sl->out[s->nlayers - 1];
    if (s->recompute) {
        /* keep the output (it is sent, or it is the loss), drop the rest: the
         * backward recomputes it from the kept input */
        size_t n = bg_shape_numel(sl->shapes[s->nlayers]), es = out_es(s, s->nlayers - 1);
        sl->keep_out = stage_alloc(s, sl, n * es, "stage output (recompute)");
        if (!sl->keep_out)
            return BG_ERR_NOMEM;
        s->be->ops->convert(s->be, sl->keep_out, es_type(es), out, es_type(es), n);
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
        sl->dout_in = stage_alloc(s, sl, bg_shape_numel(sl->shapes[s->nlayers]) * sizeof(float),
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
        p += piece(act_size(sl->shapes[j + 1]), s->gz);
    return (float *)p;
}
static char *bw_wstash(bg_stage_t *s, slot_t *sl, int i)
{
    char *p = sl->bw;
    for (int j = 0; j < s->nlayers - 1; j++)
        p += piece(act_size(sl->shapes[j + 1]), s->gz);
    for (int j = 0; j < i; j++)
        p += piece(bg_layer_wstash_bytes(s->layers[j], sl->shapes[j]), s->gz);
    return p;
}

/* The pieces of a backward call of layer i: the common ones, the wstash
 * (`wcap` bytes set aside), the output gradient dout and the input gradient
 * dx (`acap` bytes set aside for each; the incoming gradient of the stage's
 * last layer has no guard). */
static void guard_backward(bg_stage_t *s, slot_t *sl, int i, const float *x, const float *y, const bg_layer_ctx_t *c,
                           size_t wcap, const float *dout, const float *dx, size_t acap, guard_call_t *gc)
{
    const bg_shape_t *sh = sl->shapes;
    guard_common(s, sl, i, x, y, c, gc);
    if (!s->check)
        return;
    guard_add(gc, G_WSTASH, c->wstash, bg_layer_wstash_bytes(s->layers[i], sh[i]), wcap);
    guard_add(gc, G_DIN, dx, act_size(sh[i]), acap ? acap : piece(act_size(sh[i]), s->gz));
    if (dout != sl->dout_in)
        guard_add(gc, G_DOUT, dout, act_size(sh[i + 1]), acap ? acap : piece(act_size(sh[i + 1]), s->gz));
}

/* Layer i's call in the split backward (B: dx its input gradient; W: dx
 * NULL): its context, input, output and output gradient, the guards armed. */
static void split_call(bg_stage_t *s, slot_t *sl, int i, float *dx, bg_layer_ctx_t *c, const float **x_p, float **y_p,
                       float **dout_p, guard_call_t *gc)
{
    *c = make_ctx(s, sl, i);
    c->wstash = bw_wstash(s, sl, i);
    layer_io(s, sl, i, 1, x_p, y_p);
    *dout_p = bw_dout(s, sl, i);
    guard_backward(s, sl, i, *x_p, *y_p, c, piece(bg_layer_wstash_bytes(s->layers[i], sl->shapes[i]), s->gz), *dout_p,
                   dx, 0, gc);
    guards_arm(s, gc);
}

static bg_status_t check_dout(bg_stage_t *s, slot_t *sl, int mb)
{
    if (!is_last_stage(s) && !sl->dout_in)
        return bg_error(BG_ERR_INVALID, "stage (layers %d..%d): backward of microbatch %d without its output gradient",
                        s->first, s->first + s->nlayers - 1, mb);
    return BG_OK;
}

/* The slot of microbatch mb, forwarded, for a backward (what) that starts
 * from it: its output gradient there, its scratch, its activations
 * (recomputed when they were dropped). */
static bg_status_t backward_slot(bg_stage_t *s, int mb, const char *what, slot_t **sl_p)
{
    slot_t *sl = NULL;
    BG_CHECK(get_slot(s, mb, SLOT_FORWARD, what, &sl));
    BG_CHECK(check_dout(s, sl, mb));
    if (sl->offloaded)
        return bg_error(BG_ERR_INVALID, "stage (layers %d..%d): %s of microbatch %d while its stash is offloaded "
                                        "(bg_stage_stash_in first)", s->first, s->first + s->nlayers - 1, what, mb);
    BG_CHECK(ensure_scratch(s, sl));
    if (!sl->act)
        BG_CHECK(run_forward(s, sl, mb, BG_PASS_RECOMPUTE, 0)); /* recompute */
    *sl_p = sl;
    return BG_OK;
}

bg_status_t bg_stage_backward_input(bg_stage_t *s, int mb, float **din_p)
{
    slot_t *sl = NULL;
    BG_CHECK(backward_slot(s, mb, "backward_input", &sl));
    int has_din = sl->shapes[0].c != 0 && s->first > 0; /* the model's own input needs no gradient */
    size_t din_off;
    size_t total = split_bytes(s, sl->shapes, s->gz, &din_off);
    sl->bw = stage_alloc(s, sl, total, "backward (B to W)");
    if (!sl->bw)
        return BG_ERR_NOMEM;
    sl->din = has_din ? (float *)(sl->bw + din_off) : NULL;
    for (int i = s->nlayers - 1; i >= 0 && !s->emulate; i--) {
        bg_layer_ctx_t c;
        const float *x;
        float *y, *dout, *dx = i > 0 ? bw_dout(s, sl, i - 1) : sl->din;
        guard_call_t gc;
        BG_CHECK(layer_begin(s, i, mb, BG_PASS_BACKWARD_INPUT));
        split_call(s, sl, i, dx, &c, &x, &y, &dout, &gc);
        bg_status_t st = s->layers[i]->ops->backward_input(s->layers[i], &c, x, y, dout, dx);
        BG_CHECK(guards_check(s, &gc, st, i, sl->shapes, "backward_input"));
    }
    sl->state = SLOT_BINPUT;
    *din_p = sl->din;
    return BG_OK;
}

bg_status_t bg_stage_backward_weight(bg_stage_t *s, int mb)
{
    slot_t *sl = NULL;
    BG_CHECK(get_slot(s, mb, SLOT_BINPUT, "backward_weight", &sl));
    BG_CHECK(ensure_scratch(s, sl));
    for (int i = s->nlayers - 1; i >= 0; i--) {
        if (s->emulate && s->layer_done)
            BG_CHECK(s->layer_done(s->first + i, mb, s->layer_done_arg));
        if (s->emulate || !s->layers[i]->ops->backward_weight)
            continue;
        bg_layer_ctx_t c;
        const float *x;
        float *y, *dout;
        guard_call_t gc;
        BG_CHECK(layer_begin(s, i, mb, BG_PASS_BACKWARD_WEIGHT));
        split_call(s, sl, i, NULL, &c, &x, &y, &dout, &gc);
        bg_status_t st = s->layers[i]->ops->backward_weight(s->layers[i], &c, x, y, dout);
        BG_CHECK(guards_check(s, &gc, st, i, sl->shapes, "backward_weight"));
        if (s->layer_done)
            BG_CHECK(s->layer_done(s->first + i, mb, s->layer_done_arg));
    }
    slot_free(s, sl);
    return BG_OK;
}

bg_status_t bg_stage_backward(bg_stage_t *s, int mb, float **din_p)
{
    slot_t *sl = NULL;
    BG_CHECK(backward_slot(s, mb, "backward", &sl));
    size_t acap = fused_maxact(s, sl->shapes) + s->gz, wcap = fused_maxw(s, sl->shapes) + s->gz;
    sl->bw = stage_alloc(s, sl, fused_bytes(s, sl->shapes, s->gz), "backward");
    if (!sl->bw)
        return BG_ERR_NOMEM;
    float *buf[2] = {(float *)sl->bw, (float *)(sl->bw + acap)};
    char *wst = sl->bw + 2 * acap;
    const float *dout = sl->dout_in;
    int which = 0;
    for (int i = s->nlayers - 1; i >= 0; i--) {
        bg_layer_ctx_t c = make_ctx(s, sl, i);
        c.wstash = wst;
        float *dx = (i > 0 || (sl->shapes[0].c && s->first > 0)) ? buf[which] : NULL;
        if (s->emulate) {
            if (s->layer_done)
                BG_CHECK(s->layer_done(s->first + i, mb, s->layer_done_arg));
            dout = dx, which ^= 1;
            continue;
        }
        const float *x;
        float *y;
        BG_CHECK(layer_begin(s, i, mb, BG_PASS_BACKWARD));
        layer_io(s, sl, i, 1, &x, &y);
        guard_call_t gc;
        guard_backward(s, sl, i, x, y, &c, wcap, dout, dx, acap, &gc);
        guards_arm(s, &gc);
        bg_status_t st;
        if (s->tp_weight && s->layers[i]->ops->backward) { /* a composite: each child's W right after its B */
            st = bg_layer_backward(s->layers[i], &c, x, y, dout, dx);
            BG_CHECK(guards_check(s, &gc, st, i, sl->shapes, "backward"));
        } else { /* a leaf: bg_layer_backward's order, its two calls guarded apart */
            bg_tp_deferred_t d, *dp = s->tp_weight ? bg__layer_deferral(s->layers[i], &c, &d) : NULL;
            c.deferred = dp;
            st = s->layers[i]->ops->backward_input(s->layers[i], &c, x, y, dout, dx);
            c.deferred = NULL;
            if (st == BG_OK && s->layers[i]->ops->backward_weight) {
                st = guards_check(s, &gc, st, i, sl->shapes, "backward_input");
                if (st == BG_OK) {
                    guard_backward(s, sl, i, x, y, &c, wcap, dout, NULL, acap, &gc);
                    guards_arm(s, &gc);
                    st = s->layers[i]->ops->backward_weight(s->layers[i], &c, x, y, dout);
                }
                st = bg__layer_wait_deferred(&c, dp, st);
                BG_CHECK(guards_check(s, &gc, st, i, sl->shapes, "backward_weight"));
            } else {
                st = bg__layer_wait_deferred(&c, dp, st);
                BG_CHECK(guards_check(s, &gc, st, i, sl->shapes, "backward_input"));
            }
        }
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

bg_status_t bg_stage_set_lane(bg_stage_t *s, int mb, int lane)
{
    if (mb < 0 || mb >= s->nslots || s->slots[mb].state == SLOT_FREE || (lane != 0 && lane != 1))
        return bg_error(BG_ERR_INVALID, "stage (layers %d..%d): lane %d for microbatch %d (lanes are 0 and 1, of a "
                                        "slot that has begun)",
                        s->first, s->first + s->nlayers - 1, lane, mb);
    s->slots[mb].lane = lane;
    return BG_OK;
}

size_t bg_stage_stash_bytes(const bg_stage_t *s, int mb)
{
    if (mb < 0 || mb >= s->nslots || s->slots[mb].state != SLOT_FORWARD || (!s->slots[mb].act && !s->slots[mb].offloaded))
        return 0;
    return act_bytes(s, s->slots[mb].shapes, s->gz);
}

/* The forwarded slot of microbatch mb whose arena moves (op): its bytes, 0 when it holds none (recomputation). */
static bg_status_t stash_slot(bg_stage_t *s, int mb, int offloaded, const char *op, slot_t **sl_p, size_t *bytes_p)
{
    slot_t *sl = NULL;
    BG_CHECK(get_slot(s, mb, SLOT_FORWARD, op, &sl));
    if (sl->offloaded != offloaded)
        return bg_error(BG_ERR_INVALID, "stage (layers %d..%d): %s of microbatch %d, whose stash is %s", s->first,
                        s->first + s->nlayers - 1, op, mb, offloaded ? "on the device" : "already offloaded");
    *sl_p = sl;
    *bytes_p = bg_stage_stash_bytes(s, mb);
    return BG_OK;
}

bg_status_t bg_stage_stash_out(bg_stage_t *s, int mb, void *host)
{
    slot_t *sl = NULL;
    size_t bytes = 0;
    BG_CHECK(stash_slot(s, mb, 0, "stash_out", &sl, &bytes));
    if (!bytes)
        return BG_OK; /* recomputation: nothing is kept between F and B */
    s->be->ops->to_host(s->be, host, sl->act, bytes);
    bg_backend_free(s->be, sl->act);
    sl->act = NULL;
    sl->offloaded = 1;
    return BG_OK;
}

bg_status_t bg_stage_stash_in(bg_stage_t *s, int mb, const void *host)
{
    slot_t *sl = NULL;
    size_t bytes = 0;
    BG_CHECK(stash_slot(s, mb, 1, "stash_in", &sl, &bytes));
    sl->act = stage_alloc(s, sl, bytes, "activations (from the offload store)");
    if (!sl->act)
        return BG_ERR_NOMEM; /* still offloaded: the host copy is intact */
    s->be->ops->from_host(s->be, sl->act, host, bytes);
    aim_act(s, sl);
    sl->offloaded = 0;
    return BG_OK;
}

bg_status_t bg_stage_release(bg_stage_t *s, int mb)
{
    slot_t *sl = NULL;
    BG_CHECK(get_slot(s, mb, SLOT_DONE, "release", &sl));
    slot_release(s, sl); /* din is in bw (or NULL on the first stage) */
    return BG_OK;
}

void bg_stage_end(bg_stage_t *s, int mb)
{
    if (mb >= 0 && mb < s->nslots)
        slot_free(s, &s->slots[mb]);
}
