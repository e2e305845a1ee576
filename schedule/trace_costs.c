/* schedule/trace_costs.c: the reader of executor traces (the Chrome
 * trace-event files of brigade train --trace): the schedule a run used, the
 * per-stage F, B, W, send and optimizer times it measured (medians), the
 * measured step time, and an SVG of one measured step. The file comes from
 * outside: every field that is used is checked (type and range) and every
 * error names the event (traceEvents[i]) and the field. Memory is a fixed
 * multiple of the number of events, whatever the numbers in them.
 * Must not: run or simulate a schedule (the caller does, with the costs). */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/schedule.h"
#include "core/check.h"
#include "core/fileio.h"
#include "schedule/schedule_impl.h"
#include "core/util.h"

/* K_B: backward-input ("b"), K_BW: full backward ("B"). Traces before the
 * executor used the IR's names called these "B" and "BW": read_trace tells
 * the two apart (an old split trace has "W" but no "b"). */
enum { K_F, K_B, K_W, K_BW, K_SA, K_SG, K_OPT, K_N, K_STEP = K_N };

/* Largest pp, microbatches, chunks and ranks a trace may declare: far above
 * any real run, low enough that per-stage arrays stay small. */
#define TRACE_MAX_DIM 65536

typedef struct tev {
    char op[16];   /* the name, truncated (for the SVG) */
    int32_t kind;  /* K_*, K_STEP, or -1 */
    int32_t step, pid, mb, stage;
    double ts, dur; /* microseconds */
} tev_t;

typedef struct sample {
    int bucket; /* stage * K_N + kind */
    double v;   /* seconds */
} sample_t;

typedef struct span {
    int32_t step;
    double dur; /* seconds: the longest rank's step */
} span_t;

struct bg_trace_costs {
    bg_schedule_kind_t kind;
    int pp, microbatches, chunks, stages;
    double *f, *b, *w;    /* (stages) with the sends charged */
    double *fc, *bc;      /* (stages) compute only */
    double optimizer;     /* the largest stage's median */
    double step_time;     /* median measured step, seconds */
    int steps;            /* steps it is the median of */
    int pick;             /* the step nearest the median (-1: none) */
    tev_t *ev;            /* events with an op, for the SVG */
    size_t nev;
};

static int cmp_sample(const void *a, const void *b)
{
    const sample_t *x = a, *y = b;
    if (x->bucket != y->bucket)
        return x->bucket < y->bucket ? -1 : 1;
    return x->v < y->v ? -1 : x->v > y->v;
}

static int cmp_span(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return x->dur < y->dur ? -1 : x->dur > y->dur;
}

void bg_trace_costs_free(bg_trace_costs_t *c)
{
    if (!c)
        return;
    free(c->f);
    free(c->b);
    free(c->w);
    free(c->fc);
    free(c->bc);
    free(c->ev);
    free(c);
}

/* An integer field of o in [lo, hi], or dflt when absent and optional. */
static bg_status_t int_field(json_t *o, const char *key, long long lo, long long hi, int required, long long dflt,
                             const char *where, const char *obj, long long *v)
{
    json_t *x = json_object_get(o, key);
    if (!x && !required) {
        *v = dflt;
        return BG_OK;
    }
    if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi) {
        char got[64];
        if (json_is_integer(x))
            snprintf(got, sizeof got, "%" JSON_INTEGER_FORMAT, json_integer_value(x));
        else
            snprintf(got, sizeof got, "%s", x ? "not an integer" : "missing");
        return bg_error(BG_ERR_PARSE, "%s: %s.%s is %s: expected an integer in [%lld, %lld]", where, obj, key, got,
                        lo, hi);
    }
    *v = json_integer_value(x);
    return BG_OK;
}

static bg_status_t num_field(json_t *o, const char *key, double lo, const char *where, const char *obj, double *v)
{
    json_t *x = json_object_get(o, key);
    if (!json_is_number(x) || !(json_number_value(x) >= lo) || !isfinite(json_number_value(x)))
        return bg_error(BG_ERR_PARSE, "%s: %s.%s is %s: expected a number >= %g", where, obj, key,
                        x ? "out of range or not a number" : "missing", lo);
    *v = json_number_value(x);
    return BG_OK;
}

static int op_kind(const char *op)
{
    static const struct {
        const char *name;
        int kind;
    } names[] = {{"F", K_F},         {"b", K_B},           {"W", K_W},         {"B", K_BW},
                 {"BW", K_BW},       {"send_act", K_SA},   {"send_grad", K_SG}, {"optimizer_step", K_OPT},
                 {"optimizer", K_OPT}};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (!strcmp(op, names[k].name))
            return names[k].kind;
    return -1;
}

static bg_status_t read_meta(json_t *root, const char *where, bg_trace_costs_t *c, long long *world_p)
{
    json_t *meta = json_object_get(root, "otherData");
    const char *sname = json_string_value(json_object_get(meta, "schedule"));
    if (!json_is_object(meta) || !sname || !json_is_array(json_object_get(root, "traceEvents")))
        return bg_error(BG_ERR_PARSE,
                        "%s: not a brigade executor trace (no otherData.schedule/pp/microbatches/chunks or traceEvents)",
                        where);
    long long pp, m, v, dp, tp;
    BG_CHECK(int_field(meta, "pp", 1, TRACE_MAX_DIM, 1, 0, where, "otherData", &pp));
    BG_CHECK(int_field(meta, "microbatches", 1, TRACE_MAX_DIM, 1, 0, where, "otherData", &m));
    BG_CHECK(int_field(meta, "chunks", 1, TRACE_MAX_DIM, 1, 0, where, "otherData", &v));
    BG_CHECK(int_field(meta, "dp", 1, TRACE_MAX_DIM, 0, 1, where, "otherData", &dp));
    BG_CHECK(int_field(meta, "tp", 1, TRACE_MAX_DIM, 0, 1, where, "otherData", &tp)); /* members run alike */
    if (bg_schedule_kind_parse(sname, &c->kind) != BG_OK)
        return bg_error(BG_ERR_PARSE, "%s: otherData.schedule \"%.64s\" is not a schedule this library knows", where,
                        sname);
    dp *= tp; /* a tensor group's members run their replica's program: ranks like replicas */
    if (pp * v > TRACE_MAX_DIM || pp * dp > TRACE_MAX_DIM)
        return bg_error(BG_ERR_PARSE, "%s: otherData: pp %lld x chunks %lld x dp %lld is more than %d", where, pp, v,
                        dp, TRACE_MAX_DIM);
    c->pp = (int)pp;
    c->microbatches = (int)m;
    c->chunks = (int)v;
    c->stages = (int)(pp * v);
    *world_p = pp * dp;
    return BG_OK;
}

/* One event: *e filled when it carries args.op; *is_op 0 for events without
 * one (metadata: process names), which are skipped. */
static bg_status_t read_event(json_t *x, size_t i, const char *where, long long world, int stages, tev_t *e,
                              int *is_op)
{
    char obj[64];
    *is_op = 0;
    snprintf(obj, sizeof obj, "traceEvents[%zu]", i);
    if (!json_is_object(x))
        return bg_error(BG_ERR_PARSE, "%s: %s is not an object", where, obj);
    json_t *a = json_object_get(x, "args");
    const char *op = json_string_value(json_object_get(a, "op"));
    if (!op)
        return BG_OK;
    long long step, pid, mb, stage;
    double ts = 0, dur = 0;
    char aobj[80];
    snprintf(aobj, sizeof aobj, "%s.args", obj);
    BG_CHECK(int_field(a, "step", 0, INT32_MAX, 1, 0, where, aobj, &step));
    BG_CHECK(int_field(a, "microbatch", -1, INT32_MAX, 0, -1, where, aobj, &mb));
    BG_CHECK(int_field(a, "stage", -1, INT32_MAX, 0, -1, where, aobj, &stage));
    BG_CHECK(int_field(x, "pid", 0, world - 1, 1, 0, where, obj, &pid));
    BG_CHECK(num_field(x, "ts", -1e300, where, obj, &ts));
    BG_CHECK(num_field(x, "dur", 0, where, obj, &dur));
    int k = op_kind(op);
    if (k >= 0 && (stage < 0 || stage >= stages))
        return bg_error(BG_ERR_PARSE, "%s: %s.stage is %lld: the trace's schedule has stages 0..%d", where, aobj, stage,
                        stages - 1);
    snprintf(e->op, sizeof e->op, "%s", op);
    e->step = (int32_t)step;
    e->pid = (int32_t)pid;
    e->mb = (int32_t)mb;
    e->kind = k >= 0 ? k : !strcmp(op, "step") ? K_STEP : -1;
    e->stage = (int32_t)stage;
    e->ts = ts;
    e->dur = dur;
    *is_op = 1;
    return BG_OK;
}

/* Medians per (stage, kind) from the samples (sorted here). */
static void stage_costs(bg_trace_costs_t *c, sample_t *s, size_t ns)
{
    qsort(s, ns, sizeof *s, cmp_sample);
    double med[K_N];
    for (int st = 0; st < c->stages; st++) {
        for (int k = 0; k < K_N; k++)
            med[k] = 0;
        int has_bw = 0;
        /* the samples of this stage form one run, in kind order */
        size_t lo = 0, hi = ns;
        while (lo < hi) { /* first sample with bucket >= st * K_N */
            size_t mid = lo + (hi - lo) / 2;
            if (s[mid].bucket < st * K_N)
                lo = mid + 1;
            else
                hi = mid;
        }
        for (size_t j = lo; j < ns && s[j].bucket < (st + 1) * K_N;) {
            size_t r = j;
            while (r < ns && s[r].bucket == s[j].bucket)
                r++;
            size_t n = r - j; /* s[j..r) is sorted by value */
            double m = n % 2 ? s[j + n / 2].v : 0.5 * (s[j + n / 2 - 1].v + s[j + n / 2].v);
            int k = s[j].bucket - st * K_N;
            med[k] = m;
            if (k == K_BW)
                has_bw = 1;
            j = r;
        }
        c->fc[st] = med[K_F];
        c->f[st] = med[K_F] + med[K_SA];
        if (has_bw) {
            c->bc[st] = med[K_BW];
            c->w[st] = 0;
        } else {
            c->bc[st] = med[K_B];
            c->w[st] = med[K_W];
        }
        c->b[st] = c->bc[st] + med[K_SG];
        if (med[K_OPT] > c->optimizer)
            c->optimizer = med[K_OPT];
    }
}

/* Per step the longest rank's span; the median over the measured steps and
 * the step nearest it. */
static bg_status_t step_spans(bg_trace_costs_t *c, int32_t first)
{
    size_t n = 0;
    for (size_t i = 0; i < c->nev; i++)
        n += c->ev[i].kind == K_STEP;
    span_t *sp = malloc((n ? n : 1) * sizeof *sp);
    BG_ALLOC_CHECK(sp, (n ? n : 1) * sizeof *sp, "trace step spans");
    size_t k = 0;
    for (size_t i = 0; i < c->nev; i++)
        if (c->ev[i].kind == K_STEP)
            sp[k++] = (span_t){c->ev[i].step, c->ev[i].dur * 1e-6};
    qsort(sp, n, sizeof *sp, cmp_span);
    /* keep one per step (the longest: the last of its run), from step `first` on */
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (sp[i].step >= first && (i + 1 == n || sp[i + 1].step != sp[i].step))
            sp[u++] = sp[i];
    double *d = malloc((u ? u : 1) * sizeof *d);
    if (!d) {
        free(sp);
        return bg_error(BG_ERR_NOMEM, "trace step spans");
    }
    for (size_t i = 0; i < u; i++)
        d[i] = sp[i].dur;
    c->step_time = bg_median(d, u);
    c->steps = (int)u;
    c->pick = -1;
    double best = 0;
    for (size_t i = 0; i < u; i++)
        if (c->pick < 0 || fabs(sp[i].dur - c->step_time) < best) {
            best = fabs(sp[i].dur - c->step_time);
            c->pick = sp[i].step;
        }
    free(d);
    free(sp);
    return BG_OK;
}

static bg_status_t read_trace(json_t *root, const char *where, bg_trace_costs_t *c)
{
    long long world = 1;
    BG_CHECK(read_meta(root, where, c, &world));
    json_t *events = json_object_get(root, "traceEvents");
    size_t nall = json_array_size(events);
    size_t cap = nall ? nall : 1;
    size_t S = (size_t)c->stages;
    c->ev = malloc(cap * sizeof *c->ev);
    c->f = calloc(S, sizeof(double));
    c->b = calloc(S, sizeof(double));
    c->w = calloc(S, sizeof(double));
    c->fc = calloc(S, sizeof(double));
    c->bc = calloc(S, sizeof(double));
    if (!c->ev || !c->f || !c->b || !c->w || !c->fc || !c->bc)
        return bg_error(BG_ERR_NOMEM, "%s: %zu trace events", where, nall);
    int32_t maxstep = 0;
    size_t i;
    json_t *x;
    json_array_foreach(events, i, x)
    {
        int is_op;
        BG_CHECK(read_event(x, i, where, world, c->stages, &c->ev[c->nev], &is_op));
        if (is_op && c->ev[c->nev].step > maxstep)
            maxstep = c->ev[c->nev].step;
        c->nev += (size_t)is_op;
    }
    /* an old trace's "B" is the backward-input: it has "W" and no "b" */
    int has_w = 0, has_b = 0;
    for (size_t j = 0; j < c->nev; j++) {
        has_w |= c->ev[j].kind == K_W;
        has_b |= !strcmp(c->ev[j].op, "b");
    }
    if (has_w && !has_b)
        for (size_t j = 0; j < c->nev; j++)
            if (!strcmp(c->ev[j].op, "B"))
                c->ev[j].kind = K_B;
    /* costs: medians over steps 2.. (step 1 is warm-up) unless there are fewer */
    int32_t first = maxstep >= 2 ? 2 : 1;
    sample_t *s = malloc(cap * sizeof *s);
    BG_ALLOC_CHECK(s, cap * sizeof *s, "trace samples");
    size_t ns = 0;
    for (size_t j = 0; j < c->nev; j++) {
        const tev_t *e = &c->ev[j];
        if (e->kind < 0 || e->kind >= K_N || e->step < first)
            continue;
        s[ns++] = (sample_t){e->stage * K_N + e->kind, e->dur * 1e-6};
    }
    stage_costs(c, s, ns);
    free(s);
    return step_spans(c, first);
}

bg_status_t bg_trace_costs_parse(const char *text, size_t len, const char *where, bg_trace_costs_t **costs_p)
{
    if (!where)
        where = "trace";
    json_error_t err;
    json_t *root = json_loadb(text ? text : "", text ? len : 0, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return bg_error(BG_ERR_PARSE, "%s: line %d: %s", where, err.line, err.text);
    bg_trace_costs_t *c = calloc(1, sizeof *c);
    if (!c) {
        json_decref(root);
        return bg_error(BG_ERR_NOMEM, "%s: trace costs", where);
    }
    bg_status_t st = read_trace(root, where, c);
    json_decref(root);
    if (st != BG_OK) {
        bg_trace_costs_free(c);
        return st;
    }
    *costs_p = c;
    return BG_OK;
}

bg_status_t bg_trace_costs_load(const char *path, bg_trace_costs_t **costs_p)
{
    char *text;
    size_t n;
    BG_CHECK(bg__fileio_read(path, &text, &n));
    bg_status_t st = bg_trace_costs_parse(text, n, path, costs_p);
    free(text);
    return st;
}

void bg_trace_costs_schedule(const bg_trace_costs_t *c, bg_schedule_params_t *sp)
{
    sp->kind = c->kind;
    sp->stages = c->pp;
    sp->microbatches = c->microbatches;
    sp->chunks = c->chunks;
}

void bg_trace_costs_sim(const bg_trace_costs_t *c, int compute_only, bg_sim_params_t *sp)
{
    sp->f_costs = compute_only ? c->fc : c->f;
    sp->b_costs = compute_only ? c->bc : c->b;
    sp->w_costs = c->w;
    sp->optimizer_cost = c->optimizer;
}

double bg_trace_costs_step_time(const bg_trace_costs_t *c, int *steps_p)
{
    if (steps_p)
        *steps_p = c->steps;
    return c->step_time;
}

/* The IR's kind of a trace event (-1: another op) */
static int ir_kind(const tev_t *e)
{
    static const int map[K_N] = {BG_OP_FORWARD,  BG_OP_BACKWARD_INPUT, BG_OP_BACKWARD_WEIGHT, BG_OP_BACKWARD,
                                 BG_OP_SEND_ACT, BG_OP_SEND_GRAD,      BG_OP_OPTIMIZER_STEP};
    if (e->kind >= 0 && e->kind < K_N)
        return map[e->kind];
    if (!strcmp(e->op, "recv_act"))
        return BG_OP_RECV_ACT;
    if (!strcmp(e->op, "recv_grad"))
        return BG_OP_RECV_GRAD;
    if (!strcmp(e->op, "reduce_grads") || !strcmp(e->op, "reduce") || !strcmp(e->op, "ar_wait"))
        return BG_OP_REDUCE_GRADS;
    return -1;
}

/* The drawn step's window: its first and last event over all ranks (us), the
 * ranks, and the number of its events. */
static size_t pick_window(const bg_trace_costs_t *c, double *t0_p, double *t1_p, int *ranks_p)
{
    double t0 = 1e300, t1 = -1e300;
    int ranks = 0;
    size_t n = 0;
    for (size_t i = 0; i < c->nev; i++) {
        const tev_t *e = &c->ev[i];
        if (e->step != c->pick)
            continue;
        n++;
        if (e->ts < t0)
            t0 = e->ts;
        if (e->ts + e->dur > t1)
            t1 = e->ts + e->dur;
        if (e->pid + 1 > ranks)
            ranks = e->pid + 1;
    }
    *t0_p = t0;
    *t1_p = t1;
    *ranks_p = ranks;
    return n;
}

double bg_trace_costs_drawn_span(const bg_trace_costs_t *c)
{
    double t0, t1;
    int ranks;
    pick_window(c, &t0, &t1, &ranks);
    return c->pick >= 0 && ranks > 0 && t1 > t0 ? (t1 - t0) * 1e-6 : 0.0;
}

bg_status_t bg_trace_costs_svg_with(const bg_trace_costs_t *c, const bg_svg_params_t *params, const char *path,
                                    int *step_p)
{
    bg_svg_params_t prm = BG_SVG_PARAMS_INIT;
    if (params)
        memcpy(&prm, params, params->size < sizeof prm ? params->size : sizeof prm);
    int step = c->pick, ranks;
    double t0, t1;
    size_t nbox = pick_window(c, &t0, &t1, &ranks);
    if (step < 0 || ranks == 0 || !(t1 > t0))
        return bg_error(BG_ERR_INVALID, "the trace has no events of a measured step to draw");
    bg__tl_box_t *box = malloc(nbox * sizeof *box);
    char(*name)[sizeof c->ev[0].op] = malloc(nbox * sizeof *name);
    char(*note)[64] = calloc((size_t)ranks, sizeof *note);
    double *busy = calloc((size_t)ranks, sizeof *busy);
    if (!box || !name || !note || !busy) {
        free(box);
        free(name);
        free(note);
        free(busy);
        return bg_error(BG_ERR_NOMEM, "cannot build the SVG");
    }
    size_t n = 0;
    for (size_t i = 0; i < c->nev; i++) {
        const tev_t *e = &c->ev[i];
        if (e->step != step || e->kind == K_STEP)
            continue;
        /* op names come from the file: only [A-Za-z0-9_] reach the SVG */
        size_t m = 0;
        for (const char *p = e->op; *p && m + 1 < sizeof name[n]; p++)
            if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_')
                name[n][m++] = *p;
        name[n][m] = 0;
        int k = ir_kind(e);
        box[n] = (bg__tl_box_t){e->pid, k, e->stage >= 0 ? e->stage / c->pp : 0, e->mb, (e->ts - t0) / 1e3,
                                (e->ts + e->dur - t0) / 1e3, name[n], e->stage, -1};
        if (k >= 0 && k != BG_OP_SEND_ACT && k != BG_OP_SEND_GRAD && k != BG_OP_RECV_ACT && k != BG_OP_RECV_GRAD)
            busy[e->pid] += e->dur / 1e3;
        n++;
    }
    double span = (t1 - t0) / 1e3;
    for (int r = 0; r < ranks; r++)
        snprintf(note[r], sizeof note[r], "idle %.1f%%", span > 0 ? 100 * (1 - busy[r] / span) : 0.0);
    char title[256];
    if (prm.title)
        snprintf(title, sizeof title, "%s", prm.title);
    else
        snprintf(title, sizeof title, "measured %s: p=%d m=%d v=%d, step %d: %.4g ms", bg_schedule_kind_name(c->kind),
                 c->pp, c->microbatches, c->chunks, step, span);
    bg__tl_t tl = {title, ranks, box, n, span, prm.x_max, "ms", (const char(*)[64])note};
    char *svg = NULL;
    bg_status_t st = bg__timeline_svg(&tl, &svg);
    if (st == BG_OK)
        st = bg__write_atomic(path, svg);
    free(svg);
    free(box);
    free(name);
    free(note);
    free(busy);
    if (st == BG_OK && step_p)
        *step_p = step;
    return st;
}

bg_status_t bg_trace_costs_svg(const bg_trace_costs_t *c, const char *path, int *step_p)
{
    return bg_trace_costs_svg_with(c, NULL, path, step_p);
}
