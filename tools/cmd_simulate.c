/* tools/cmd_simulate.c: `brigade simulate --from-trace FILE`: feed the per-op
 * costs measured in an executor trace (brigade train --trace) to the schedule
 * simulator and compare its step time with the measured one. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/schedule.h"
#include "tools/cli.h"

typedef struct {
    double *v;
    int n, cap;
} samples_t;

static void add(samples_t *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 16;
        s->v = realloc(s->v, (size_t)s->cap * sizeof(double));
    }
    s->v[s->n++] = x;
}

static double median(samples_t *s) { return bg_median(s->v, (size_t)s->n); }

enum { K_F, K_B, K_W, K_BW, K_SA, K_SG, K_OPT, K_N };

/* The measured timeline of one step as an SVG Gantt chart (one lane per rank). */
static int write_measured_svg(const char *cmd, json_t *events, int step, const char *out)
{
    double t0 = 1e300, t1 = -1e300;
    int ranks = 0;
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e)
    {
        json_t *a = json_object_get(e, "args");
        if (!a || json_integer_value(json_object_get(a, "step")) != step)
            continue;
        double ts = json_number_value(json_object_get(e, "ts")), du = json_number_value(json_object_get(e, "dur"));
        if (ts < t0)
            t0 = ts;
        if (ts + du > t1)
            t1 = ts + du;
        int pid = (int)json_integer_value(json_object_get(e, "pid"));
        if (pid + 1 > ranks)
            ranks = pid + 1;
    }
    if (ranks == 0 || t1 <= t0)
        return bg_cli_fail(cmd, "no events of step %d to draw", step);
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", out);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return bg_cli_fail(cmd, "cannot write %s", out);
    double W = 1100, lane = 34, left = 70, scale = (W - left - 10) / (t1 - t0);
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"10\">\n<text x=\"4\" y=\"14\">measured step %d: %.2f ms</text>\n",
            W, 30 + lane * ranks + 10, step, (t1 - t0) / 1e3);
    for (int r = 0; r < ranks; r++)
        fprintf(f, "<text x=\"4\" y=\"%.0f\">rank %d</text>\n", 30 + lane * r + 20, r);
    json_array_foreach(events, i, e)
    {
        json_t *a = json_object_get(e, "args");
        if (!a || json_integer_value(json_object_get(a, "step")) != step)
            continue;
        const char *op = json_string_value(json_object_get(a, "op"));
        if (!op || !strcmp(op, "step"))
            continue;
        int pid = (int)json_integer_value(json_object_get(e, "pid"));
        int mb = (int)json_integer_value(json_object_get(a, "microbatch"));
        double x = left + (json_number_value(json_object_get(e, "ts")) - t0) * scale;
        double w = json_number_value(json_object_get(e, "dur")) * scale;
        int comm = op[0] == 's' || op[0] == 'r';
        const char *col = !strcmp(op, "F") ? "#4e79a7" : !strcmp(op, "B") ? "#f28e2b" : !strcmp(op, "W") ? "#59a14f"
                        : !strcmp(op, "BW") ? "#e15759" : comm ? "#bab0ac" : "#b07aa1";
        double y = 30 + lane * pid + (comm ? 24 : 4), h = comm ? 6 : 20;
        fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\" stroke=\"#fff\" "
                   "stroke-width=\"0.3\"><title>%s mb %d</title></rect>\n",
                x, y, w < 0.5 ? 0.5 : w, h, col, op, mb);
        if (!comm && mb >= 0 && w > 12)
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#fff\">%d</text>\n", x + 2, y + 14, mb);
    }
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0 || rename(tmp, out) != 0) {
        remove(tmp);
        return bg_cli_fail(cmd, "cannot write %s", out);
    }
    printf("wrote %s (measured step %d)\n", out, step);
    return 0;
}

int bg_cmd_simulate(int argc, char **argv)
{
    const char *cmd = "simulate", *path = NULL, *svg = NULL, *svg_measured = NULL;
    double latency = 0, bandwidth = 0;
    int compute_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: brigade simulate --from-trace FILE [--svg OUT] [--svg-measured OUT] [--link-latency S]\n"
                   "                        [--link-bw BYTES_PER_S] [--compute-only]\n"
                   "  replays the schedule of a trace written by brigade train --trace with the per-stage\n"
                   "  F, B, W (or full backward) times measured in it (medians over steps 2..; the time a\n"
                   "  stage spends issuing its sends is charged to the compute op before it), free links\n"
                   "  unless given, and prints the predicted step time next to the measured one.\n"
                   "  --compute-only: charge nothing for sends (the compute-only critical path).\n");
            return 0;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--from-trace") && v)
            path = argv[++i];
        else if (!strcmp(argv[i], "--svg") && v)
            svg = argv[++i];
        else if (!strcmp(argv[i], "--svg-measured") && v)
            svg_measured = argv[++i];
        else if (!strcmp(argv[i], "--compute-only"))
            compute_only = 1;
        else if (!strcmp(argv[i], "--link-latency")) {
            if (bg_cli_double(cmd, "--link-latency", v, 0, 10, &latency))
                return 2;
            i++;
        } else if (!strcmp(argv[i], "--link-bw")) {
            if (bg_cli_double(cmd, "--link-bw", v, 1, 1e15, &bandwidth))
                return 2;
            i++;
        } else
            return bg_cli_fail(cmd, "unknown or incomplete option \"%s\" (see brigade simulate --help)", argv[i]);
    }
    if (!path)
        return bg_cli_fail(cmd, "--from-trace FILE is required");
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root)
        return bg_cli_fail(cmd, "%s: line %d: %s", path, err.line, err.text);
    json_t *meta = json_object_get(root, "otherData"), *events = json_object_get(root, "traceEvents");
    const char *sname = json_string_value(json_object_get(meta, "schedule"));
    int P = (int)json_integer_value(json_object_get(meta, "pp"));
    int M = (int)json_integer_value(json_object_get(meta, "microbatches"));
    int V = (int)json_integer_value(json_object_get(meta, "chunks"));
    if (!sname || P < 1 || M < 1 || V < 1 || !json_is_array(events)) {
        json_decref(root);
        return bg_cli_fail(cmd, "%s: not a brigade executor trace (no otherData.schedule/pp/microbatches/chunks)", path);
    }
    bg_schedule_kind_t kind;
    bg_schedule_t *sched = NULL;
    bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
    int rc = 0;
    if (bg_schedule_kind_parse(sname, &kind) != BG_OK) {
        json_decref(root);
        return bg_cli_status(cmd, BG_ERR_INVALID);
    }
    sp.kind = kind;
    sp.stages = P;
    sp.microbatches = M;
    sp.chunks = V;
    if (bg_schedule_generate(&sp, &sched) != BG_OK) {
        json_decref(root);
        return bg_cli_status(cmd, BG_ERR_INVALID);
    }
    int S = P * V;
    samples_t *cost = calloc((size_t)S * K_N, sizeof(samples_t));
    samples_t steps = {0};
    /* measured step time: per step, the longest of the ranks' step spans */
    int maxstep = 0;
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e)
    {
        json_t *a = json_object_get(e, "args");
        int step = (int)json_integer_value(json_object_get(a, "step"));
        if (step > maxstep)
            maxstep = step;
    }
    double *span = calloc((size_t)maxstep + 1, sizeof(double));
    json_array_foreach(events, i, e)
    {
        json_t *a = json_object_get(e, "args");
        const char *op = json_string_value(json_object_get(a, "op"));
        if (!op)
            continue;
        int step = (int)json_integer_value(json_object_get(a, "step"));
        int stage = (int)json_integer_value(json_object_get(a, "stage"));
        double dur = json_number_value(json_object_get(e, "dur")) * 1e-6;
        if (!strcmp(op, "step")) {
            if (dur > span[step])
                span[step] = dur;
            continue;
        }
        if (step < 2 && maxstep >= 2)
            continue; /* warm-up */
        int k = !strcmp(op, "F") ? K_F : !strcmp(op, "B") ? K_B : !strcmp(op, "W") ? K_W : !strcmp(op, "BW") ? K_BW
              : !strcmp(op, "send_act") ? K_SA : !strcmp(op, "send_grad") ? K_SG : !strcmp(op, "optimizer") ? K_OPT : -1;
        if (k >= 0 && stage >= 0 && stage < S)
            add(&cost[stage * K_N + k], dur);
    }
    for (int s = (maxstep >= 2 ? 2 : 1); s <= maxstep; s++)
        add(&steps, span[s]);
    double *f = calloc((size_t)S, sizeof(double)), *b = calloc((size_t)S, sizeof(double)),
           *w = calloc((size_t)S, sizeof(double));
    double opt = 0;
    for (int s = 0; s < S; s++) {
        samples_t *c = &cost[s * K_N];
        double sa = compute_only ? 0 : median(&c[K_SA]), sg = compute_only ? 0 : median(&c[K_SG]);
        f[s] = median(&c[K_F]) + sa;
        if (c[K_BW].n) {
            b[s] = median(&c[K_BW]) + sg;
            w[s] = 0;
        } else {
            b[s] = median(&c[K_B]) + sg;
            w[s] = median(&c[K_W]);
        }
        double o = median(&c[K_OPT]);
        if (o > opt)
            opt = o;
    }
    bg_sim_params_t simp = BG_SIM_PARAMS_INIT;
    simp.f_costs = f;
    simp.b_costs = b;
    simp.w_costs = w;
    simp.latency = latency;
    simp.bandwidth = bandwidth;
    simp.optimizer_cost = opt;
    bg_sim_result_t *res = NULL;
    bg_status_t st = bg_schedule_simulate(sched, &simp, &res);
    if (st != BG_OK) {
        rc = bg_cli_status(cmd, st);
        goto out;
    }
    double pred = bg_sim_step_time(res), meas = median(&steps);
    printf("schedule %s, p=%d, m=%d, v=%d; per-stage medians (ms):\n  stage      F      B      W\n", sname, P, M, V);
    for (int s = 0; s < S; s++)
        printf("  %5d %6.2f %6.2f %6.2f\n", s, f[s] * 1e3, b[s] * 1e3, w[s] * 1e3);
    printf("simulated step %.2f ms (bubble %.1f%%), measured step %.2f ms (median of %d): simulated/measured = %.3f\n",
           pred * 1e3, 100 * bg_sim_bubble(res, -1), meas * 1e3, steps.n, meas > 0 ? pred / meas : 0.0);
    if (svg) {
        st = bg_schedule_svg(sched, res, svg);
        if (st != BG_OK)
            rc = bg_cli_status(cmd, st);
        else
            printf("wrote %s\n", svg);
    }
    if (svg_measured && !rc) {
        /* draw the step whose span is the median one */
        int pick = maxstep >= 2 ? 2 : 1;
        for (int k = pick; k <= maxstep; k++)
            if (fabs(span[k] - meas) < fabs(span[pick] - meas))
                pick = k;
        rc = write_measured_svg(cmd, events, pick, svg_measured);
    }
out:
    bg_sim_result_free(res);
    for (int s = 0; s < S * K_N; s++)
        free(cost[s].v);
    free(cost);
    free(steps.v);
    free(span);
    free(f);
    free(b);
    free(w);
    bg_schedule_free(sched);
    json_decref(root);
    return rc;
}
