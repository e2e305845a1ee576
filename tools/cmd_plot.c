/* tools/cmd_plot.c: `brigade plot METRICS.jsonl --out FILE.svg`: an SVG chart
 * of the loss (top panel) and tokens/s (bottom panel) against the step, from
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
    int rank;
} plot_pt_t;

static void plot_usage(FILE *f)
{
    fprintf(f, "usage: brigade plot METRICS.jsonl --out FILE.svg [--rank R] [--title TEXT]\n"
               "\n"
               "Draw the loss and the throughput (tokens/s) against the step from a metrics\n"
               "file (brigade train --metrics). Lines with a \"rank\" field: rank R's (default:\n"
               "the lowest rank present). A step that appears twice (a resumed run) is drawn\n"
               "with its last line.\n");
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

/* One panel at (x0, y0) of size w x h: y values of pts (which: 0 loss, 1 tps). */
static void panel(FILE *f, const plot_pt_t *p, size_t n, int which, double x0, double y0, double w, double h,
                  const char *label, const char *color)
{
    double xmin = (double)p[0].step, xmax = (double)p[n - 1].step, ymin = INFINITY, ymax = -INFINITY;
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        double v = which ? p[i].tps : p[i].loss;
        if (which && v < 0)
            continue;
        ymin = fmin(ymin, v);
        ymax = fmax(ymax, v);
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
    if (which && ymin < 0)
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
                   "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
                PX(x), y0, PX(x), y0 + h, PX(x), y0 + h + 15, buf);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" transform=\"rotate(-90 %.1f %.1f)\" "
               "text-anchor=\"middle\">%s</text>\n", x0 - 52, y0 + h / 2, x0 - 52, y0 + h / 2, label);
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
    for (size_t i = 0; i < n; i++) {
        double v = which ? p[i].tps : p[i].loss;
        if (which && v < 0)
            continue;
        fprintf(f, "%.1f,%.1f ", PX((double)p[i].step), PY(v));
    }
    fprintf(f, "\"/>\n");
    if (used <= 60)
        for (size_t i = 0; i < n; i++) {
            double v = which ? p[i].tps : p[i].loss;
            if (!(which && v < 0))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", PX((double)p[i].step), PY(v),
                        color);
        }
    fprintf(f, "</g>\n");
#undef PX
#undef PY
}

int bg_cmd_plot(int argc, char **argv)
{
    const char *cmd = "plot", *in = NULL, *out = NULL, *title = NULL;
    long long want_rank = -1;
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
        json_t *s = json_object_get(o, "step"), *l = json_object_get(o, "loss"), *t = json_object_get(o, "tokens_per_s"),
               *r = json_object_get(o, "rank");
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
    int have_tps = 0;
    for (size_t i = 0; i < m; i++)
        have_tps |= pts[i].tps >= 0;

    FILE *o = fopen(out, "w");
    if (!o) {
        fprintf(stderr, "brigade plot: cannot write %s: %s\n", out, strerror(errno));
        goto out;
    }
    double W = 820, ph = 240, top = 40, gap = 60;
    double H = top + ph + 40 + (have_tps ? gap + ph : 0);
    fprintf(o, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fafafa\"/>\n",
            W, H, W, H);
    fprintf(o, "<text x=\"%.0f\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">", W / 2);
    xml_text(o, title ? title : in);
    fprintf(o, " (rank %d, %zu steps)</text>\n", rank, m);
    panel(o, pts, m, 0, 80, top, W - 110, ph, "loss", "#1f77b4");
    if (have_tps) {
        panel(o, pts, m, 1, 80, top + ph + gap, W - 110, ph, "tokens/s", "#d62728");
        fprintf(o, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" text-anchor=\"middle\">step</text>\n", W / 2,
                top + 2 * ph + gap + 32);
    } else {
        fprintf(o, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" text-anchor=\"middle\">step</text>\n", W / 2,
                top + ph + 32);
    }
    fprintf(o, "</svg>\n");
    if (fclose(o) != 0) {
        fprintf(stderr, "brigade plot: writing %s: %s\n", out, strerror(errno));
        goto out;
    }
    printf("wrote %s: %zu steps of rank %d (loss %.4g -> %.4g)\n", out, m, rank, pts[0].loss, pts[m - 1].loss);
    rc = 0;
out:
    free(line);
    free(pts);
    fclose(f);
    return rc;
}
