/* tools/cmd_plot.c: `brigade plot METRICS.jsonl --out FILE.svg`: an SVG chart
 * of the loss and the held-out loss of evaluations, when there are any (top
 * panel), and tokens/s (bottom panel) against the step, from
 * the metrics file `brigade train --metrics` writes (one JSON object a line:
 * step, loss, tokens_per_s, step_ms, maybe rank). Hand-written SVG, no
 * dependencies beyond jansson for the lines. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

typedef struct {
    long long step;
    double loss, tps; /* tps < 0: absent */
    double ms;        /* step_ms, < 0: absent */
    double val;       /* val_loss (an evaluation after this step), NaN: absent */
    int rank;
} plot_pt_t;

static void plot_usage(FILE *f)
{
    fprintf(f, "usage: brigade plot METRICS.jsonl --out FILE.svg [--rank R] [--title TEXT] [--smooth N]\n"
               "                   [--x step|time]\n"
               "\n"
               "Draw the loss and the throughput (tokens/s) against the step from a metrics\n"
               "file (brigade train --metrics). Lines with a \"rank\" field: rank R's (default:\n"
               "the lowest rank present). A step that appears twice (a resumed run) is drawn\n"
               "with its last line. Steps that evaluated (--eval-every: \"val_loss\") add the\n"
               "validation loss to the loss panel, as points joined by a second line. The title\n"
               "names the run (model, layout, schedule) from the file's header line (brigade\n"
               "train writes it), unless --title is given.\n"
               "  --smooth N    also draw the loss averaged over the last N steps (raw loss faint)\n"
               "  --x time      the x-axis is the training time (the sum of step_ms, in s); with\n"
               "                --x step (the default) that time is a second axis over the loss\n");
}

static int cmp_pt(const void *a, const void *b)
{
    const plot_pt_t *x = a, *y = b;
    return (x->step > y->step) - (x->step < y->step);
}

/* A "nice" tick spacing for a range: 1, 2 or 5 times a power of ten. */
static double nice_step(double range, int ticks)
{
    if (!(range > 0))
        return 1;
    double raw = range / ticks, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
}

static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\t')
                fputc(*s, f);
        }
    }
}

static void fmt_num(char *buf, size_t cap, double v)
{
    double a = fabs(v);
    if (a >= 1e6 || (a > 0 && a < 1e-3))
        snprintf(buf, cap, "%.3g", v);
    else if (a >= 100)
        snprintf(buf, cap, "%.0f", v);
    else
        snprintf(buf, cap, "%.4g", v);
}

/* One panel at (x0, y0) of size w x h: points (xv[i], yv[i]) (NaN y: absent),
 * a smoothed line sv (or NULL) over a faint raw one, and a second series
 * (xv[i], y2[i]) (or NULL; NaN: absent) in orange, its points always marked. */
static void panel(FILE *f, const double *xv, const double *yv, const double *sv, const double *y2, size_t n,
                  double x0, double y0, double w, double h, const char *label, const char *color, int ymin0)
{
    double xmin = xv[0], xmax = xv[n - 1], ymin = INFINITY, ymax = -INFINITY;
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        if (y2 && !isnan(y2[i]))
            ymin = fmin(ymin, y2[i]), ymax = fmax(ymax, y2[i]);
        if (isnan(yv[i]))
            continue;
        ymin = fmin(ymin, yv[i]);
        ymax = fmax(ymax, yv[i]);
        used++;
    }
    if (xmax == xmin)
        xmax = xmin + 1;
    if (ymax == ymin) {
        ymax += fabs(ymax) * 0.05 + 0.5;
        ymin -= fabs(ymin) * 0.05 + 0.5;
    }
    double ys = nice_step(ymax - ymin, 5), xs = nice_step(xmax - xmin, 8);
    ymin = floor(ymin / ys) * ys;
    ymax = ceil(ymax / ys) * ys;
    if (ymin0 && ymin < 0)
        ymin = 0;
#define PX(x) (x0 + ((x) - xmin) / (xmax - xmin) * w)
#define PY(y) (y0 + h - ((y) - ymin) / (ymax - ymin) * h)
    fprintf(f, "<g class=\"panel\">\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"white\" "
               "stroke=\"#999\"/>\n", x0, y0, w, h);
    char buf[64];
    for (double y = ymin; y <= ymax + ys * 1e-6; y += ys) {
        fmt_num(buf, sizeof buf, fabs(y) < ys * 1e-9 ? 0 : y);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n",
                x0, PY(y), x0 + w, PY(y), x0 - 6, PY(y) + 4, buf);
    }
    for (double x = ceil(xmin / xs) * xs; x <= xmax + xs * 1e-6; x += xs) {
        fmt_num(buf, sizeof buf, x);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                   "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
                PX(x), y0, PX(x), y0 + h, PX(x), y0 + h + 15, buf);
    }
    fprintf(f, "<text class=\"axis-label\" x=\"%.1f\" y=\"%.1f\" font-size=\"13\" transform=\"rotate(-90 %.1f %.1f)\" "
               "text-anchor=\"middle\">%s</text>\n", x0 - 52, y0 + h / 2, x0 - 52, y0 + h / 2, label);
    for (int pass = sv ? 0 : 1; pass < 2; pass++) {
        const double *v = pass ? (sv ? sv : yv) : yv;
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s points=\"", color,
                pass ? "1.6" : "1", pass || !sv ? "" : " stroke-opacity=\"0.3\"");
        for (size_t i = 0; i < n; i++)
            if (!isnan(v[i]))
                fprintf(f, "%.1f,%.1f ", PX(xv[i]), PY(v[i]));
        fprintf(f, "\"/>\n");
    }
    if (used <= 60 && !sv)
        for (size_t i = 0; i < n; i++)
            if (!isnan(yv[i]))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", PX(xv[i]), PY(yv[i]), color);
    if (y2) {
        fprintf(f, "<g class=\"val-loss\"><polyline fill=\"none\" stroke=\"#ff7f0e\" stroke-width=\"1.6\" points=\"");
        for (size_t i = 0; i < n; i++)
            if (!isnan(y2[i]))
                fprintf(f, "%.1f,%.1f ", PX(xv[i]), PY(y2[i]));
        fprintf(f, "\"/>\n");
        for (size_t i = 0; i < n; i++)
            if (!isnan(y2[i]))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#ff7f0e\"/>\n", PX(xv[i]), PY(y2[i]));
        fprintf(f, "</g>\n");
    }
    fprintf(f, "</g>\n");
#undef PX
#undef PY
}

/* A second x-axis over a panel: tick labels of tv (increasing with xv) placed by
 * linear interpolation between the points. */
static void top_axis(FILE *f, const double *xv, const double *tv, size_t n, double x0, double y0, double w,
                     const char *label)
{
    double xmin = xv[0], xmax = xv[n - 1] > xv[0] ? xv[n - 1] : xv[0] + 1, ts = nice_step(tv[n - 1] - tv[0], 6);
    char buf[64];
    size_t j = 0;
    double last = -1e9;
    for (double t = ceil(tv[0] / ts) * ts; t <= tv[n - 1] + ts * 1e-6; t += ts) {
        while (j + 1 < n && tv[j + 1] < t)
            j++;
        double x = j + 1 < n && tv[j + 1] > tv[j] ? xv[j] + (t - tv[j]) / (tv[j + 1] - tv[j]) * (xv[j + 1] - xv[j])
                                                  : xv[j];
        double px = x0 + (x - xmin) / (xmax - xmin) * w;
        if (px < last + 34) /* time is not linear in steps: skip a label that would overlap */
            continue;
        last = px;
        fmt_num(buf, sizeof buf, t);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#555\"/>"
                   "<text class=\"tick2\" x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#555\" "
                   "text-anchor=\"middle\">%s</text>\n",
                px, y0, px, y0 - 4, px, y0 - 7, buf);
    }
    fprintf(f, "<text class=\"axis-label\" x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#555\" "
               "text-anchor=\"end\">%s</text>\n", x0 + w, y0 - 20, label);
}

int bg_cmd_plot(int argc, char **argv)
{
    const char *cmd = "plot", *in = NULL, *out = NULL, *title = NULL;
    long long want_rank = -1, smooth = 0;
    int x_time = 0;
    char run[200] = ""; /* from the header line */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            plot_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--out") || !strcmp(a, "-o")) {
            if (!v)
                return bg_cli_fail(cmd, "%s needs a file name", a);
            out = v;
            i++;
        } else if (!strcmp(a, "--title")) {
            if (!v)
                return bg_cli_fail(cmd, "--title needs a text");
            title = v;
            i++;
        } else if (!strcmp(a, "--smooth")) {
            if (bg_cli_int(cmd, a, v, 1, 1 << 20, &smooth))
                return 2;
            i++;
        } else if (!strcmp(a, "--x")) {
            if (!v || (strcmp(v, "step") && strcmp(v, "time")))
                return bg_cli_fail(cmd, "--x expects step or time, got \"%s\"", v ? v : "");
            x_time = !strcmp(v, "time");
            i++;
        } else if (!strcmp(a, "--rank")) {
            if (bg_cli_int(cmd, a, v, 0, 1 << 30, &want_rank))
                return 2;
            i++;
        } else if (a[0] == '-' && a[1]) {
            return bg_cli_fail(cmd, "unknown option \"%s\" (see brigade plot --help)", a);
        } else if (in) {
            return bg_cli_fail(cmd, "expects one metrics file, got a second: \"%s\"", a);
        } else {
            in = a;
        }
    }
    if (!in)
        return bg_cli_fail(cmd, "missing the metrics file (see brigade plot --help)");
    if (!out)
        return bg_cli_fail(cmd, "missing --out FILE.svg");

    FILE *f = fopen(in, "r");
    if (!f) {
        fprintf(stderr, "brigade plot: cannot open %s: %s\n", in, strerror(errno));
        return 1;
    }
    plot_pt_t *pts = NULL;
    size_t n = 0, cap = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    long lineno = 0;
    int rc = 1, min_rank = -1;
    while ((len = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
            line[--len] = 0;
        if (len == 0)
            continue;
        json_error_t err;
        json_t *o = json_loads(line, 0, &err);
        if (!json_is_object(o)) {
            fprintf(stderr, "brigade plot: %s:%ld: not a JSON object (%s)\n", in, lineno,
                    o ? "another JSON value" : err.text);
            json_decref(o);
            goto out;
        }
        json_t *hdr = json_object_get(o, "run");
        if (json_is_object(hdr) && !json_object_get(o, "step")) { /* the header: what ran */
            const char *model = json_string_value(json_object_get(hdr, "model")),
                       *sched = json_string_value(json_object_get(hdr, "schedule"));
            json_t *L = json_object_get(hdr, "layers"), *D = json_object_get(hdr, "d_model"),
                   *pp = json_object_get(hdr, "pp"), *dp = json_object_get(hdr, "dp");
            snprintf(run, sizeof run, "%.20s %lld x %lld, pp %lld x dp %lld, %.20s", model ? model : "model",
                     (long long)json_integer_value(L), (long long)json_integer_value(D),
                     (long long)json_integer_value(pp), (long long)json_integer_value(dp), sched ? sched : "?");
            json_decref(o);
            continue;
        }
        json_t *s = json_object_get(o, "step"), *l = json_object_get(o, "loss"), *t = json_object_get(o, "tokens_per_s"),
               *r = json_object_get(o, "rank"), *ms = json_object_get(o, "step_ms"), *vl = json_object_get(o, "val_loss");
        const char *bad = !json_is_integer(s) ? "\"step\" (an integer)"
                          : !json_is_number(l) ? "\"loss\" (a number)"
                          : t && !json_is_number(t) ? "\"tokens_per_s\" as a number"
                          : r && !json_is_integer(r) ? "\"rank\" as an integer" : NULL;
        if (bad || !isfinite(json_number_value(l))) {
            fprintf(stderr, "brigade plot: %s:%ld: expected %s\n", in, lineno, bad ? bad : "a finite \"loss\"");
            json_decref(o);
            goto out;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            plot_pt_t *q = realloc(pts, cap * sizeof(*q));
            if (!q) {
                fprintf(stderr, "brigade plot: out of memory\n");
                json_decref(o);
                goto out;
            }
            pts = q;
        }
        pts[n].step = json_integer_value(s);
        pts[n].loss = json_number_value(l);
        pts[n].tps = t ? json_number_value(t) : -1;
        pts[n].rank = r ? (int)json_integer_value(r) : 0;
        pts[n].ms = json_is_number(ms) && json_number_value(ms) >= 0 ? json_number_value(ms) : -1;
        pts[n].val = json_is_number(vl) && isfinite(json_number_value(vl)) ? json_number_value(vl) : NAN;
        if (min_rank < 0 || pts[n].rank < min_rank)
            min_rank = pts[n].rank;
        n++;
        json_decref(o);
    }
    if (n == 0) {
        fprintf(stderr, "brigade plot: %s has no metrics lines\n", in);
        goto out;
    }
    int rank = want_rank >= 0 ? (int)want_rank : min_rank;
    /* keep the chosen rank's lines; the last line of a step wins (stable order) */
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (pts[i].rank == rank)
            pts[k++] = pts[i];
    if (k == 0) {
        fprintf(stderr, "brigade plot: %s has no lines of rank %d\n", in, rank);
        goto out;
    }
    for (size_t i = 0; i < k; i++)
        pts[i].rank = (int)i; /* original order, for "last wins" after sorting */
    qsort(pts, k, sizeof(*pts), cmp_pt);
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {
        if (m > 0 && pts[m - 1].step == pts[i].step) {
            if (pts[i].rank > pts[m - 1].rank)
                pts[m - 1] = pts[i];
            continue;
        }
        pts[m++] = pts[i];
    }
    int have_tps = 0, have_ms = 1;
    size_t nval = 0; /* steps that evaluated */
    for (size_t i = 0; i < m; i++) {
        nval += !isnan(pts[i].val);
        have_tps |= pts[i].tps >= 0;
        have_ms &= pts[i].ms >= 0;
    }
    if (x_time && !have_ms) {
        fprintf(stderr, "brigade plot: --x time needs \"step_ms\" on every line of %s\n", in);
        goto out;
    }
    /* x values, the training time (s), the loss (and its moving average), tokens/s */
    double *xs = malloc(6 * m * sizeof(double));
    if (!xs) {
        fprintf(stderr, "brigade plot: out of memory\n");
        goto out;
    }
    double *tv = xs + m, *lv = tv + m, *sv = lv + m, *pv = sv + m, *vv = pv + m, acc = 0, t = 0;
    for (size_t i = 0; i < m; i++) {
        t += have_ms ? pts[i].ms / 1e3 : 0;
        tv[i] = t;
        lv[i] = pts[i].loss;
        pv[i] = pts[i].tps >= 0 ? pts[i].tps : NAN;
        vv[i] = pts[i].val;
        acc += lv[i];
        if (smooth > 0 && i >= (size_t)smooth)
            acc -= lv[i - (size_t)smooth];
        sv[i] = acc / (double)(smooth > 0 && i + 1 > (size_t)smooth ? (size_t)smooth : i + 1);
        xs[i] = x_time ? t : (double)pts[i].step;
    }

    FILE *o = fopen(out, "w");
    if (!o) {
        fprintf(stderr, "brigade plot: cannot write %s: %s\n", out, strerror(errno));
        free(xs);
        goto out;
    }
    double W = 820, ph = 240, top = have_ms && !x_time ? 80 : 50, gap = 60;
    double H = top + ph + 40 + (have_tps ? gap + ph : 0);
    fprintf(o, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fafafa\"/>\n",
            W, H, W, H);
    fprintf(o, "<text class=\"title\" x=\"%.0f\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">", W / 2);
    xml_text(o, title ? title : run[0] ? run : in);
    fprintf(o, " (rank %d, %zu steps)</text>\n", rank, m);
    if (smooth > 0) {
        char lg[96];
        snprintf(lg, sizeof lg, "loss, mean of the last %lld steps (raw: faint)", smooth);
        fprintf(o, "<g class=\"legend-item\"><line x1=\"%.0f\" y1=\"40\" x2=\"%.0f\" y2=\"40\" stroke=\"#1f77b4\" "
                   "stroke-width=\"2\"/><text x=\"%.0f\" y=\"44\" font-size=\"11\">%s</text></g>\n",
                W - 330, W - 310, W - 305, lg);
    }
    if (nval)
        fprintf(o, "<g class=\"legend-item\"><circle cx=\"%.0f\" cy=\"40\" r=\"3\" fill=\"#ff7f0e\"/><text x=\"%.0f\" "
                   "y=\"44\" font-size=\"11\">validation loss (%zu evaluations)</text></g>\n", W - 500, W - 492, nval);
    panel(o, xs, lv, smooth > 0 ? sv : NULL, nval ? vv : NULL, m, 80, top, W - 110, ph, "loss", "#1f77b4", 0);
    if (have_ms && !x_time)
        top_axis(o, xs, tv, m, 80, top, W - 110, "training time (s)");
    const char *xl = x_time ? "training time (s)" : "step";
    if (have_tps)
        panel(o, xs, pv, NULL, NULL, m, 80, top + ph + gap, W - 110, ph, "tokens/s", "#d62728", 1);
    fprintf(o, "<text class=\"axis-label\" x=\"%.0f\" y=\"%.0f\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n",
            W / 2, top + (have_tps ? 2 * ph + gap : ph) + 32, xl);
    free(xs);
    fprintf(o, "</svg>\n");
    if (fclose(o) != 0) {
        fprintf(stderr, "brigade plot: writing %s: %s\n", out, strerror(errno));
        goto out;
    }
    printf("wrote %s: %zu steps of rank %d (loss %.4g -> %.4g", out, m, rank, pts[0].loss, pts[m - 1].loss);
    for (size_t i = 0, first = 1; i < m; i++) /* the first and last evaluations */
        if (!isnan(pts[i].val) && first)
            printf("; validation loss %.4g", pts[i].val), first = 0;
    for (size_t i = m; nval > 1 && i-- > 0;)
        if (!isnan(pts[i].val)) {
            printf(" -> %.4g", pts[i].val);
            break;
        }
    printf(")\n");
    rc = 0;
out:
    free(line);
    free(pts);
    fclose(f);
    return rc;
}
