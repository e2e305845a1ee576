/* partitioner/plan_json.c: a plan's JSON (docs/partitioner.md): written
 * (bg_plan_to_json, bg_plan_save), and read back with every field validated
 * (bg_plan_from_json, bg_plan_load): ranges, the stages against the split,
 * the ranks, the model's description. It must not search or evaluate
 * layouts, nor check a plan against a live model (plan.c does); the
 * description's own JSON is models/desc.c's. No printing. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/check.h"
#include "core/util.h"
#include "plan_impl.h"

static const char *const times_names[] = {"flops", "measured", "measured_tp", NULL};

static json_t *plan_json(const bg_plan_t *p)
{
    json_t *root = json_object(), *layers = json_array(), *stages = json_array(), *ranks = json_array(),
           *split = json_array(), *model = p->model_json ? json_loads(p->model_json, 0, NULL) : NULL;
    if (!root || !layers || !stages || !ranks || !split || !model) {
        json_decref(root), json_decref(layers), json_decref(stages), json_decref(ranks), json_decref(split);
        json_decref(model);
        return NULL;
    }
    json_object_set_new(root, "format", json_string(PLAN_FORMAT));
    json_object_set_new(root, "version", json_integer(PLAN_VERSION));
    json_object_set_new(root, "world", json_integer(p->world));
    json_object_set_new(root, "pp", json_integer(p->pp));
    json_object_set_new(root, "dp", json_integer(p->dp));
    json_object_set_new(root, "tp", json_integer(p->tp));
    if (p->cp > 1) /* absent: 1 */
        json_object_set_new(root, "cp", json_integer(p->cp));
    json_object_set_new(root, "microbatches", json_integer(p->microbatches));
    json_object_set_new(root, "microbatch_size", json_integer(p->microbatch_size));
    json_object_set_new(root, "batch", json_integer(p->batch));
    json_object_set_new(root, "seq", json_integer(p->seq));
    json_object_set_new(root, "schedule", json_string(p->schedule));
    json_object_set_new(root, "chunks", json_integer(p->chunks));
    json_object_set_new(root, "optimizer", json_string(p->optim == BG_OPTIM_SGD ? "sgd" : "adamw"));
    if (p->zero)
        json_object_set_new(root, "zero", json_integer(p->zero));
    if (p->offload || p->offact)
        json_object_set_new(root, "offload", json_string(bg_plan_offload_name(p)));
    if (p->sp)
        json_object_set_new(root, "sequence_parallel", json_true());
    if (p->precision != BG_F32)
        json_object_set_new(root, "precision", json_string(bg_dtype_name(p->precision)));
    if (p->paired)
        json_object_set_new(root, "tp_overlap", json_string("microbatch"));
    json_object_set_new(root, "recompute", json_boolean(bg_plan_recompute(p)));
    json_object_set_new(root, "predicted_step_ms", json_real(p->step_ms));
    json_object_set_new(root, "predicted_bubble", json_real(p->bubble));
    json_object_set_new(root, "predicted_tokens_per_s", json_real(p->tokens_per_s));
    if (p->offload || p->offact) /* absent: 0 */
        json_object_set_new(root, "predicted_offload_ms", json_real(p->offload_ms));
    json_object_set_new(root, "devices", json_pack("{s:f, s:f, s:f, s:f}", "flops", p->flops, "link_latency_s",
                                                   p->link_latency, "link_bandwidth", p->link_bandwidth,
                                                   "host_bandwidth", p->host_bandwidth));
    json_object_set_new(root, "layer_times", json_string(times_names[p->times]));
    json_object_set_new(root, "model", model);
    for (int i = 0; i < p->nstages; i++)
        json_array_append_new(split, json_integer(p->stages[i].last_layer - p->stages[i].first_layer + 1));
    json_object_set_new(root, "split", split);
    for (int i = 0; i < p->nlayers; i++) {
        const bg_layer_profile_t *l = &p->layers[i];
        const double *cm = &p->cost_ms[NCOST * i];
        json_array_append_new(layers, json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f}", "name",
                                                l->name, "params", (json_int_t)l->params, "stash_bytes",
                                                (json_int_t)l->stash_bytes, "wstash_bytes",
                                                (json_int_t)l->wstash_bytes, "scratch_bytes",
                                                (json_int_t)l->scratch_bytes, "output_bytes",
                                                (json_int_t)l->output_bytes, "fwd_flops", l->fwd_flops, "bwd_flops",
                                                l->bwd_flops, "fwd_ms", cm[0], "bwd_ms", cm[1], "tp_ms", cm[2],
                                                "opt_ms", cm[3]));
        if (l->grad_bytes && l->grad_bytes != l->output_bytes) /* bf16 outputs; absent: the same */
            json_object_set_new(json_array_get(layers, json_array_size(layers) - 1), "grad_bytes",
                                json_integer((json_int_t)l->grad_bytes));
    }
    json_object_set_new(root, "layers", layers);
    for (int i = 0; i < p->nstages; i++) {
        const bg_plan_stage_t *s = &p->stages[i];
        json_array_append_new(
            stages, json_pack("{s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:b, s:f}", "stage", i, "rank", s->rank,
                              "chunk", s->chunk, "first_layer", s->first_layer, "last_layer", s->last_layer,
                              "params", (json_int_t)s->params, "budget_bytes", (json_int_t)s->budget_bytes,
                              "predicted_peak_bytes", (json_int_t)s->predicted_peak_bytes, "recompute",
                              s->recompute, "predicted_ms_per_microbatch", s->predicted_ms_per_microbatch));
    }
    json_object_set_new(root, "stages", stages);
    for (int r = 0; r < p->pp; r++)
        json_array_append_new(ranks, json_pack("{s:i, s:I, s:I}", "rank", r, "budget_bytes",
                                               (json_int_t)p->rank_budget[r], "predicted_peak_bytes",
                                               (json_int_t)p->rank_peak[r]));
    json_object_set_new(root, "ranks", ranks);
    return root;
}

bg_status_t bg_plan_to_json(const bg_plan_t *p, char **json_p)
{
    json_t *root = plan_json(p);
    if (!root)
        return bg_error(BG_ERR_NOMEM, "plan JSON");
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(root);
    if (!s)
        return bg_error(BG_ERR_NOMEM, "plan JSON text");
    *json_p = s;
    return BG_OK;
}

bg_status_t bg_plan_save(const bg_plan_t *p, const char *path)
{
    char *s;
    BG_CHECK(bg_plan_to_json(p, &s));
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        free(s);
        return bg_error(BG_ERR_IO, "cannot write plan %s", tmp);
    }
    int ok = fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    free(s);
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return bg_error(BG_ERR_IO, "cannot write plan %s", path);
    }
    return BG_OK;
}

/* Field readers: BG_ERR_PARSE naming the JSON path. */
static bg_status_t get_int(json_t *o, const char *where, const char *key, long long lo, long long hi, long long *v)
{
    json_t *x = json_object_get(o, key);
    if (!x)
        return bg_error(BG_ERR_PARSE, "plan: %s.%s is missing", where, key);
    if (!json_is_integer(x))
        return bg_error(BG_ERR_PARSE, "plan: %s.%s must be an integer", where, key);
    long long y = json_integer_value(x);
    if (y < lo || y > hi)
        return bg_error(BG_ERR_PARSE, "plan: %s.%s is %lld, expected %lld..%lld", where, key, y, lo, hi);
    *v = y;
    return BG_OK;
}
static bg_status_t get_num(json_t *o, const char *where, const char *key, double *v)
{
    json_t *x = json_object_get(o, key);
    if (!x)
        return bg_error(BG_ERR_PARSE, "plan: %s.%s is missing", where, key);
    if (!json_is_number(x))
        return bg_error(BG_ERR_PARSE, "plan: %s.%s must be a number", where, key);
    *v = json_number_value(x);
    return BG_OK;
}
static bg_status_t get_str(json_t *o, const char *where, const char *key, const char **v)
{
    json_t *x = json_object_get(o, key);
    if (!x || !json_is_string(x))
        return bg_error(BG_ERR_PARSE, "plan: %s.%s must be a string", where, key);
    *v = json_string_value(x);
    return BG_OK;
}
static bg_status_t get_bool(json_t *o, const char *where, const char *key, int *v)
{
    json_t *x = json_object_get(o, key);
    if (!x || !json_is_boolean(x))
        return bg_error(BG_ERR_PARSE, "plan: %s.%s must be true or false", where, key);
    *v = json_is_true(x);
    return BG_OK;
}

/* $.model: the model's description (models/desc.c owns its format), kept as
 * text. A builder-made model is rebuilt from it, which checks it whole, into
 * *desc_p; a model of the host's own layers cannot be rebuilt from a file
 * (*desc_p = NULL): bg_plan_check_model() checks it against the host's
 * description. */
static bg_status_t parse_model(json_t *root, char **json_p, bg_model_desc_t **desc_p)
{
    json_t *jm = json_object_get(root, "model");
    if (!json_is_object(jm))
        return bg_error(BG_ERR_PARSE, "plan: $.model must be an object (the model's description)");
    char *text = json_dumps(jm, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text)
        return bg_error(BG_ERR_NOMEM, "plan model");
    bg_model_desc_t *d = NULL;
    bg_status_t st = bg_model_desc_from_json(text, &d);
    if (st != BG_OK && st != BG_ERR_UNSUPPORTED) {
        st = bg_error(BG_ERR_PARSE, "plan: $.model: %s", bg_last_error());
        free(text);
        return st;
    }
    *json_p = text;
    *desc_p = st == BG_OK ? d : NULL;
    return BG_OK;
}

#define BIG 0x7fffffffffffffffLL
/* A loaded plan's stages must be one layout: $.split (absent in hand-written
 * plans) gives the layer counts the stages hold, and no two stages sit on
 * the same (rank, chunk), and every rank holds one (a plan naming a rank
 * twice would leave another rank idle and overwrite a stage). */
static bg_status_t stages_agree(const bg_plan_t *p, json_t *split)
{
    if (split && (!json_is_array(split) || (int)json_array_size(split) != p->nstages))
        return bg_error(BG_ERR_PARSE, "plan: $.split must be an array of the %d stages' layer counts", p->nstages);
    for (int i = 0; split && i < p->nstages; i++) {
        json_t *e = json_array_get(split, (size_t)i);
        int have = p->stages[i].last_layer - p->stages[i].first_layer + 1;
        if (!json_is_integer(e) || json_integer_value(e) != have)
            return bg_error(BG_ERR_PARSE, "plan: $.split[%d] is %s%lld but $.stages[%d] holds layers %d..%d (%d layers)",
                            i, json_is_integer(e) ? "" : "not an integer: ", json_is_integer(e) ? (long long)json_integer_value(e) : 0LL,
                            i, p->stages[i].first_layer, p->stages[i].last_layer, have);
    }
    /* who[rank * chunks + chunk]: the stage there + 1 (0: none) */
    int *who = calloc((size_t)p->pp * (size_t)p->chunks, sizeof(*who));
    if (!who)
        return bg_error(BG_ERR_NOMEM, "plan: stage map of %d x %d", p->pp, p->chunks);
    bg_status_t st = BG_OK;
    for (int i = 0; i < p->nstages && st == BG_OK; i++) {
        int *w = &who[(size_t)p->stages[i].rank * (size_t)p->chunks + (size_t)p->stages[i].chunk];
        if (*w)
            st = bg_error(BG_ERR_PARSE, "plan: $.stages[%d] and $.stages[%d] are both rank %d's chunk %d", *w - 1, i,
                          p->stages[i].rank, p->stages[i].chunk);
        *w = i + 1;
    }
    for (int r = 0; r < p->pp && st == BG_OK; r++) {
        int held = 0;
        for (int c = 0; c < p->chunks && !held; c++)
            held = who[(size_t)r * (size_t)p->chunks + (size_t)c] != 0;
        if (!held)
            st = bg_error(BG_ERR_PARSE, "plan: no stage in $.stages is on rank %d of the %d pipeline ranks", r, p->pp);
    }
    free(who);
    return st;
}

/* $.layers: each layer's profile and its cost model's times into p. */
static bg_status_t parse_layers(bg_plan_t *p, json_t *jl, int L)
{
    bg_status_t st;
    long long v = 0;
    for (int i = 0; i < L; i++) {
        json_t *e = json_array_get(jl, (size_t)i);
        char where[64];
        snprintf(where, sizeof(where), "$.layers[%d]", i);
        if (!json_is_object(e)) {
            st = bg_error(BG_ERR_PARSE, "plan: %s must be an object", where);
            return st;
        }
        bg_layer_profile_t *l = &p->layers[i];
        const char *name = NULL;
        BG_CHECK(get_str(e, where, "name", &name));
        snprintf(l->name, sizeof(l->name), "%s", name);
        BG_CHECK(get_int(e, where, "params", 0, BIG, &v));
        l->params = (size_t)v;
        BG_CHECK(get_int(e, where, "stash_bytes", 0, BIG, &v));
        l->stash_bytes = (size_t)v;
        BG_CHECK(get_int(e, where, "output_bytes", 0, BIG, &v));
        l->output_bytes = (size_t)v;
        l->grad_bytes = l->output_bytes;
        if (json_object_get(e, "grad_bytes")) {
            BG_CHECK(get_int(e, where, "grad_bytes", 0, BIG, &v));
            l->grad_bytes = (size_t)v;
        }
        if (json_object_get(e, "wstash_bytes")) {
            BG_CHECK(get_int(e, where, "wstash_bytes", 0, BIG, &v));
            l->wstash_bytes = (size_t)v;
        }
        if (json_object_get(e, "scratch_bytes")) {
            BG_CHECK(get_int(e, where, "scratch_bytes", 0, BIG, &v));
            l->scratch_bytes = (size_t)v;
        }
        BG_CHECK(get_num(e, where, "fwd_flops", &l->fwd_flops));
        BG_CHECK(get_num(e, where, "bwd_flops", &l->bwd_flops));
        static const char *const cost_keys[NCOST] = {"fwd_ms", "bwd_ms", "tp_ms", "opt_ms"}; /* optional */
        for (int k = 0; k < NCOST; k++)
            if (json_object_get(e, cost_keys[k])) {
                BG_CHECK(get_num(e, where, cost_keys[k], &p->cost_ms[NCOST * i + k]));
                if (!(p->cost_ms[NCOST * i + k] >= 0)) {
                    st = bg_error(BG_ERR_PARSE, "plan: %s.%s is %g (a time must be >= 0)", where, cost_keys[k],
                                  p->cost_ms[NCOST * i + k]);
                    return st;
                }
            }
    }
    return BG_OK;
}

/* $.stages: contiguous, covering the L layers in order, on ranks of pp and
 * chunks of `chunks` (absent: stage i on rank i % pp, chunk i / pp). */
static bg_status_t parse_stages(bg_plan_t *p, json_t *js, int L, long long pp, long long chunks)
{
    bg_status_t st;
    long long v = 0;
    int next = 0;
    for (int i = 0; i < p->nstages; i++) {
        json_t *e = json_array_get(js, (size_t)i);
        char where[64];
        snprintf(where, sizeof(where), "$.stages[%d]", i);
        if (!json_is_object(e)) {
            st = bg_error(BG_ERR_PARSE, "plan: %s must be an object", where);
            return st;
        }
        bg_plan_stage_t *s = &p->stages[i];
        long long a = 0, b = 0;
        BG_CHECK(get_int(e, where, "first_layer", 0, L - 1, &a));
        BG_CHECK(get_int(e, where, "last_layer", a, L - 1, &b));
        if (a != next) {
            st = bg_error(BG_ERR_PARSE, "plan: %s.first_layer is %lld but the previous stage ended at layer %d", where,
                          a, next - 1);
            return st;
        }
        next = (int)b + 1;
        s->first_layer = (int)a;
        s->last_layer = (int)b;
        BG_CHECK(get_int(e, where, "budget_bytes", 0, BIG, &v));
        s->budget_bytes = (uint64_t)v;
        BG_CHECK(get_int(e, where, "predicted_peak_bytes", 0, BIG, &v));
        s->predicted_peak_bytes = (uint64_t)v;
        BG_CHECK(get_bool(e, where, "recompute", &s->recompute));
        BG_CHECK(get_num(e, where, "predicted_ms_per_microbatch", &s->predicted_ms_per_microbatch));
        if (json_object_get(e, "rank")) {
            BG_CHECK(get_int(e, where, "rank", 0, pp - 1, &v));
            s->rank = (int)v;
        } else {
            s->rank = i % (int)pp;
        }
        if (json_object_get(e, "chunk")) {
            BG_CHECK(get_int(e, where, "chunk", 0, chunks - 1, &v));
            s->chunk = (int)v;
        } else {
            s->chunk = i / (int)pp;
        }
        size_t np = 0;
        for (int k = s->first_layer; k <= s->last_layer; k++)
            np += p->layers[k].params;
        s->params = np;
    }
    if (next != L) {
        st = bg_error(BG_ERR_PARSE, "plan: the stages end at layer %d but the model has %d layers", next - 1, L);
        return st;
    }
    return BG_OK;
}

/* $.ranks (optional, pp entries): each pipeline rank's peak and budget. */
static bg_status_t parse_ranks(bg_plan_t *p, json_t *jr, long long pp)
{
    bg_status_t st;
    long long v = 0;
    if (json_is_array(jr)) {
        if ((long long)json_array_size(jr) != pp) {
            st = bg_error(BG_ERR_PARSE, "plan: $.ranks must have pp = %lld entries", pp);
            return st;
        }
        for (int r = 0; r < p->pp; r++) {
            json_t *e = json_array_get(jr, (size_t)r);
            char where[64];
            snprintf(where, sizeof(where), "$.ranks[%d]", r);
            if (!json_is_object(e)) {
                st = bg_error(BG_ERR_PARSE, "plan: %s must be an object", where);
                return st;
            }
            BG_CHECK(get_int(e, where, "predicted_peak_bytes", 0, BIG, &v));
            p->rank_peak[r] = (uint64_t)v;
            BG_CHECK(get_int(e, where, "budget_bytes", 0, BIG, &v));
            p->rank_budget[r] = (uint64_t)v;
        }
    }
    return BG_OK;
}

/* $.layer_times and $.devices (both optional) into p. */
static bg_status_t parse_times_devices(bg_plan_t *p, json_t *root)
{
    bg_status_t st;
    json_t *jt = json_object_get(root, "layer_times");
    if (jt) {
        int k = 0;
        while (times_names[k] && !(json_is_string(jt) && !strcmp(json_string_value(jt), times_names[k])))
            k++;
        if (!times_names[k]) {
            st = bg_error(BG_ERR_PARSE, "plan: $.layer_times must be \"flops\", \"measured\" or \"measured_tp\"");
            return st;
        }
        p->times = k;
    }
    json_t *jd = json_object_get(root, "devices");
    if (json_is_object(jd)) {
        if (json_object_get(jd, "flops"))
            BG_CHECK(get_num(jd, "$.devices", "flops", &p->flops));
        if (json_object_get(jd, "link_latency_s"))
            BG_CHECK(get_num(jd, "$.devices", "link_latency_s", &p->link_latency));
        if (json_object_get(jd, "link_bandwidth"))
            BG_CHECK(get_num(jd, "$.devices", "link_bandwidth", &p->link_bandwidth));
        if (json_object_get(jd, "host_bandwidth")) /* absent: planned before the host link was counted */
            BG_CHECK(get_num(jd, "$.devices", "host_bandwidth", &p->host_bandwidth));
    }
    if (json_object_get(root, "predicted_offload_ms"))
        BG_CHECK(get_num(root, "$", "predicted_offload_ms", &p->offload_ms));
    return BG_OK;
}

static bg_status_t parse_plan(json_t *root, bg_plan_t **plan_p)
{
    if (!json_is_object(root))
        return bg_error(BG_ERR_PARSE, "plan: the top level must be an object");
    const char *fmt = NULL;
    BG_CHECK(get_str(root, "$", "format", &fmt));
    if (strcmp(fmt, PLAN_FORMAT))
        return bg_error(BG_ERR_PARSE, "plan: $.format is \"%s\", expected \"%s\"", fmt, PLAN_FORMAT);
    long long version = 0, world = 0, pp = 0, dp = 0, tp = 0, mbs = 0, mbsize = 0, batch = 0, seq = 0, chunks = 0;
    BG_CHECK(get_int(root, "$", "version", 1, PLAN_VERSION, &version));
    if (version < PLAN_VERSION)
        return bg_error(BG_ERR_PARSE, "plan: $.version is %lld, a plan from before model descriptions (its $.model "
                                      "is a configuration); this brigade reads version %d: run brigade plan again",
                        version, PLAN_VERSION);
    BG_CHECK(get_int(root, "$", "world", 1, 1 << 20, &world));
    BG_CHECK(get_int(root, "$", "pp", 1, 1 << 20, &pp));
    BG_CHECK(get_int(root, "$", "dp", 1, 1 << 20, &dp));
    BG_CHECK(get_int(root, "$", "tp", 1, 4096, &tp));
    long long cp = 1;
    if (json_object_get(root, "cp"))
        BG_CHECK(get_int(root, "$", "cp", 1, 4096, &cp));
    if (pp * dp * cp * tp != world)
        return bg_error(BG_ERR_PARSE, "plan: pp %lld x dp %lld x cp %lld x tp %lld is not world %lld", pp, dp, cp, tp,
                        world);
    BG_CHECK(get_int(root, "$", "microbatches", 1, 1 << 20, &mbs));
    BG_CHECK(get_int(root, "$", "microbatch_size", 1, 1 << 30, &mbsize));
    BG_CHECK(get_int(root, "$", "batch", 1, 1 << 30, &batch));
    if (batch != dp * mbs * mbsize)
        return bg_error(BG_ERR_PARSE, "plan: batch %lld is not dp %lld x microbatches %lld x microbatch_size %lld",
                        batch, dp, mbs, mbsize);
    BG_CHECK(get_int(root, "$", "seq", 1, 1 << 30, &seq));
    if (cp > 1 && seq % (2 * cp))
        return bg_error(BG_ERR_PARSE, "plan: $.seq %lld is not divisible by 2 x cp = %lld", seq, 2 * cp);
    BG_CHECK(get_int(root, "$", "chunks", 1, 1 << 10, &chunks));
    const char *sched = NULL, *opt = NULL;
    BG_CHECK(get_str(root, "$", "schedule", &sched));
    bg_schedule_kind_t kind;
    if (bg_schedule_kind_parse(sched, &kind) != BG_OK || kind == BG_SCHED_CUSTOM)
        return bg_error(BG_ERR_PARSE, "plan: $.schedule \"%s\" is not a schedule the executor runs", sched);
    BG_CHECK(get_str(root, "$", "optimizer", &opt));
    if (strcmp(opt, "adamw") && strcmp(opt, "sgd"))
        return bg_error(BG_ERR_PARSE, "plan: $.optimizer \"%s\" (expected adamw or sgd)", opt);
    long long zero = 0;
    if (json_object_get(root, "zero"))
        BG_CHECK(get_int(root, "$", "zero", 0, 3, &zero));
    const char *off = NULL;
    int offload = 0, offact = 0;
    if (json_object_get(root, "offload")) {
        BG_CHECK(get_str(root, "$", "offload", &off));
        int k = 1; /* the table's entries but "" */
        while (k < 6 && strcmp(off, bg__plan_offload_names[k / 2][k % 2]))
            k++;
        if (k == 6)
            return bg_error(BG_ERR_PARSE, "plan: $.offload \"%s\" (expected optimizer, optimizer,params, "
                            "activations, optimizer,activations or optimizer,params,activations)", off);
        offload = k / 2, offact = k % 2;
    }
    json_t *jsp = json_object_get(root, "sequence_parallel");
    if (jsp && !json_is_boolean(jsp))
        return bg_error(BG_ERR_PARSE, "plan: $.sequence_parallel must be true or false");
    json_t *jpr = json_object_get(root, "precision");
    if (jpr && (!json_is_string(jpr) || (strcmp(json_string_value(jpr), "fp32") && strcmp(json_string_value(jpr), "bf16"))))
        return bg_error(BG_ERR_PARSE, "plan: $.precision must be \"fp32\" or \"bf16\" (or absent: fp32)");
    json_t *jov = json_object_get(root, "tp_overlap");
    if (jov && (!json_is_string(jov) || strcmp(json_string_value(jov), "microbatch")))
        return bg_error(BG_ERR_PARSE, "plan: $.tp_overlap must be \"microbatch\" (or absent)");
    double step_ms = 0, bubble = 0, tps = 0;
    BG_CHECK(get_num(root, "$", "predicted_step_ms", &step_ms));
    if (json_object_get(root, "predicted_bubble"))
        BG_CHECK(get_num(root, "$", "predicted_bubble", &bubble));
    if (json_object_get(root, "predicted_tokens_per_s"))
        BG_CHECK(get_num(root, "$", "predicted_tokens_per_s", &tps));

    char *model_json = NULL;
    bg_model_desc_t *md = NULL; /* NULL: a model of the host's own layers */
    BG_CHECK(parse_model(root, &model_json, &md));
    bg_plan_t *p = NULL;
    bg_status_t st = BG_OK;
    json_t *jl = json_object_get(root, "layers"), *js = json_object_get(root, "stages"),
           *jr = json_object_get(root, "ranks");
    int L = md ? bg_model_desc_num_layers(md) : json_is_array(jl) ? (int)json_array_size(jl) : 0;
    if (!json_is_array(jl) || L < 1 || (int)json_array_size(jl) != L) {
        st = md ? bg_error(BG_ERR_PARSE, "plan: $.layers must be an array of %d layers (the model's)", L)
                : bg_error(BG_ERR_PARSE, "plan: $.layers must be a non-empty array (the model's layers)");
        goto err;
    }
    /* dualpipe: its two copies hold the same model stages, listed once */
    long long nst = kind == BG_SCHED_DUALPIPE ? pp * chunks / 2 : pp * chunks;
    if (!json_is_array(js) || (long long)json_array_size(js) != nst) {
        st = kind == BG_SCHED_DUALPIPE
                 ? bg_error(BG_ERR_PARSE, "plan: $.stages must be an array of the pp x chunks / 2 copies = %lld model "
                            "stages of dualpipe", nst)
                 : bg_error(BG_ERR_PARSE, "plan: $.stages must be an array of pp x chunks = %lld stages", nst);
        goto err;
    }
    if (nst > L) {
        st = bg_error(BG_ERR_PARSE, "plan: %lld stages for %d layers", nst, L);
        goto err;
    }
    if (!(p = bg__plan_alloc(L, (int)nst, (int)pp))) {
        st = bg_error(BG_ERR_NOMEM, "plan");
        goto err;
    }
    p->model_json = model_json;
    model_json = NULL;
    p->world = (int)world, p->pp = (int)pp, p->dp = (int)dp, p->tp = (int)tp, p->cp = (int)cp;
    p->microbatches = (int)mbs, p->microbatch_size = (int)mbsize, p->batch = (int)batch, p->seq = (int)seq;
    p->chunks = (int)chunks;
    snprintf(p->schedule, sizeof(p->schedule), "%s", bg_schedule_kind_name(kind));
    p->optim = strcmp(opt, "sgd") ? BG_OPTIM_ADAMW : BG_OPTIM_SGD;
    p->zero = (int)zero;
    p->offload = offload, p->offact = offact;
    p->sp = tp > 1 && json_is_true(jsp);
    p->precision = jpr && !strcmp(json_string_value(jpr), "bf16") ? BG_BF16 : BG_F32;
    p->paired = tp > 1 && jov;
    p->step_ms = step_ms, p->bubble = bubble, p->tokens_per_s = tps;
    BG_CHECK_GOTO(parse_times_devices(p, root), st, err);
    BG_CHECK_GOTO(parse_layers(p, jl, L), st, err);
    BG_CHECK_GOTO(parse_stages(p, js, L, pp, chunks), st, err);
    BG_CHECK_GOTO(stages_agree(p, json_object_get(root, "split")), st, err);
    if (md) { /* a builder-made model: its layers must be the plan's (at the precision the plan counted) */
        char diff[256];
        if (p->precision == BG_BF16 && bg_model_desc_params(md)->input != BG_INPUT_TOKENS) {
            st = bg_error(BG_ERR_PARSE, "plan: $.precision bf16 needs a GPT (the model in $.model has no blocks)");
            goto err;
        }
        BG_CHECK_GOTO(bg_model_desc_set_precision(md, p->precision), st, err);
        BG_CHECK_GOTO(bg__plan_layers_diff(p, md, diff, sizeof(diff)), st, err);
        if (diff[0]) {
            st = bg_error(BG_ERR_PARSE, "plan: $.layers and $.seq are not those of the model in $.model: %s", diff);
            goto err;
        }
    }
    for (int r = 0; r < p->pp; r++) {
        p->rank_peak[r] = 0;
        p->rank_budget[r] = 0;
        for (int i = 0; i < p->nstages; i++)
            if (p->stages[i].rank == r) {
                p->rank_peak[r] += p->stages[i].predicted_peak_bytes;
                p->rank_budget[r] += p->stages[i].budget_bytes;
            }
    }
    if (json_is_array(jr))
        BG_CHECK_GOTO(parse_ranks(p, jr, pp), st, err);
    bg_model_desc_destroy(md);
    *plan_p = p;
    return BG_OK;
err:
    bg_plan_free(p);
    free(model_json);
    bg_model_desc_destroy(md);
    return st;
}

bg_status_t bg_plan_from_json(const char *text, bg_plan_t **plan_p)
{
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    if (!root)
        return bg_error(BG_ERR_PARSE, "plan: line %d column %d: %s", err.line, err.column, err.text);
    bg_status_t st = parse_plan(root, plan_p);
    json_decref(root);
    return st;
}

bg_status_t bg_plan_load(const char *path, bg_plan_t **plan_p)
{
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root)
        return bg_error(BG_ERR_PARSE, "plan %s: line %d column %d: %s", path, err.line, err.column, err.text);
    bg_status_t st = parse_plan(root, plan_p);
    json_decref(root);
    if (st != BG_OK)
        return bg_error(st, "%s: %s", path, bg_last_error());
    return BG_OK;
}
