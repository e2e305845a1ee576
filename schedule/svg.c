/* schedule/svg.c: SVG Gantt charts of a step: one lane per rank,
 * compute boxes coloured by kind with the microbatch number on each box,
 * chunks > 0 hatched, transfers and receive waits on a thin row under the
 * lane, idle time as the grey lane background up to the step's end, a time
 * axis with units and ticks, a legend of only the kinds drawn, and a note per
 * rank. One drawer (bg__timeline_svg) serves the simulator's picture and the
 * trace's measured step (trace_costs.c), so the two share layout and scale.
 * It only draws what it is given. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "schedule/schedule_impl.h"

enum { TL_OTHER = BG_OP_KIND_COUNT, TL_IDLE, TL_NKEYS };

static const char *tl_fill(int kind)
{
    switch (kind) {
    case BG_OP_FORWARD: return "#4e79a7";
    case BG_OP_BACKWARD: return "#e15759";
    case BG_OP_BACKWARD_INPUT: return "#f28e2b";
    case BG_OP_BACKWARD_WEIGHT: return "#59a14f";
    case BG_OP_SEND_ACT: return "#76b7b2";
    case BG_OP_SEND_GRAD: return "#ff9da7";
    case BG_OP_RECV_ACT:
    case BG_OP_RECV_GRAD: return "#bab0ac";
    case BG_OP_REDUCE_GRADS: return "#9c755f";
    case BG_OP_OPTIMIZER_STEP: return "#b07aa1";
    case TL_IDLE: return "#e4e4e4";
    default: return "#8c8c8c";
    }
}

static const char *tl_label(int kind)
{
    switch (kind) {
    case BG_OP_FORWARD: return "forward (F)";
    case BG_OP_BACKWARD: return "full backward (B)";
    case BG_OP_BACKWARD_INPUT: return "backward-input (b)";
    case BG_OP_BACKWARD_WEIGHT: return "backward-weight (W)";
    case BG_OP_SEND_ACT: return "activation send";
    case BG_OP_SEND_GRAD: return "gradient send";
    case BG_OP_RECV_ACT: return "wait in receive";
    case BG_OP_REDUCE_GRADS: return "gradient all-reduce";
    case BG_OP_OPTIMIZER_STEP: return "optimizer step (O)";
    case TL_IDLE: return "idle";
    default: return "other";
    }
}

static int tl_is_comm(int kind)
{
    return kind == BG_OP_SEND_ACT || kind == BG_OP_SEND_GRAD || kind == BG_OP_RECV_ACT || kind == BG_OP_RECV_GRAD;
}

static void bg__escape(bg__str_t *o, const char *t)
{
    for (; *t; t++) {
        switch (*t) {
        case '<': bg__str_printf(o, "&lt;"); break;
        case '>': bg__str_printf(o, "&gt;"); break;
        case '&': bg__str_printf(o, "&amp;"); break;
        case '"': bg__str_printf(o, "&quot;"); break;
        default:
            if ((unsigned char)*t >= 0x20 && (unsigned char)*t < 0x7f)
                bg__str_printf(o, "%c", *t);
        }
    }
}

/* 1, 2 or 5 times a power of ten, about range / 8 */
static double tl_tick(double range)
{
    if (!(range > 0))
        return 1;
    double raw = range / 8, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
}

/* one legend item at (*x, *y), wrapping at x_end */
static void tl_key(bg__str_t *o, double x0, double x_end, double *x, double *y, const char *swatch, const char *label)
{
    double w = 28 + 7.0 * (double)strlen(label);
    if (*x + w > x_end && *x > x0) {
        *x = x0;
        *y += 20;
    }
    bg__str_printf(o, "<g class=\"legend-item\">%s<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\">", swatch, *x + 18,
                   *y + 11);
    bg__escape(o, label);
    bg__str_printf(o, "</text></g>\n");
    *x += w;
}

#define TL_LEGEND_ROWS 2

bg_status_t bg__timeline_svg(const bg__tl_t *tl, char **svg_p)
{
    const double left = 70, right = 190, top = 44, lane = 26, comm = 8, gap = 12, plot_w = 1000;
    double x_max = tl->x_max > tl->step ? tl->x_max : tl->step;
    if (!(x_max > 0))
        x_max = 1;
    double sx = plot_w / x_max, pitch = lane + comm + gap;
    double ya = top + tl->ranks * pitch; /* axis line */
    double H = ya + 50 + TL_LEGEND_ROWS * 20 + 10, Wt = left + plot_w + right;
    int seen[TL_NKEYS] = {0}, chunks_seen[4] = {0};
    double *busy = calloc((size_t)(tl->ranks > 0 ? tl->ranks : 1), sizeof(double));
    if (!busy)
        return bg_error(BG_ERR_NOMEM, "cannot build the SVG");
    bg__str_t o = {0};
    bg__str_printf(&o,
                   "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                   "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                   "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
                   "<defs>\n"
                   "<pattern id=\"chunk1\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" "
                   "patternTransform=\"rotate(45)\"><rect width=\"2.2\" height=\"6\" fill=\"white\" "
                   "fill-opacity=\"0.7\"/></pattern>\n"
                   "<pattern id=\"chunk2\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" "
                   "patternTransform=\"rotate(-45)\"><rect width=\"2.2\" height=\"6\" fill=\"black\" "
                   "fill-opacity=\"0.45\"/></pattern>\n"
                   "<pattern id=\"chunk3\" patternUnits=\"userSpaceOnUse\" width=\"5\" height=\"5\">"
                   "<circle cx=\"2.5\" cy=\"2.5\" r=\"1.2\" fill=\"white\" fill-opacity=\"0.8\"/></pattern>\n"
                   "</defs>\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                   Wt, H, Wt, H);
    bg__str_printf(&o, "<text class=\"title\" x=\"%.0f\" y=\"24\" font-size=\"15\" font-weight=\"bold\">", left);
    bg__escape(&o, tl->title ? tl->title : "timeline");
    bg__str_printf(&o, "</text>\n");
    /* lanes: the grey background up to the step's end is the idle time */
    double tick = tl_tick(x_max);
    for (int r = 0; r < tl->ranks; r++) {
        double y = top + r * pitch;
        bg__str_printf(&o, "<text x=\"%.0f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"end\">rank %d</text>\n",
                       left - 8, y + lane * 0.65, r);
        bg__str_printf(&o, "<rect class=\"idle\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n",
                       left, y, tl->step * sx, lane, tl_fill(TL_IDLE));
        if (tl->note) {
            bg__str_printf(&o, "<text x=\"%.0f\" y=\"%.1f\" font-size=\"11\">", left + plot_w + 8, y + lane * 0.65);
            bg__escape(&o, tl->note[r]);
            bg__str_printf(&o, "</text>\n");
        }
    }
    /* grid lines under the boxes */
    for (double tt = tick; tt <= x_max * 1.0000001; tt += tick)
        bg__str_printf(&o, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d0d0d0\" "
                           "stroke-width=\"0.5\"/>\n",
                       left + tt * sx, top - 4, left + tt * sx, ya);
    for (size_t i = 0; i < tl->nbox; i++) {
        const bg__tl_box_t *e = &tl->box[i];
        if (e->rank < 0 || e->rank >= tl->ranks)
            continue;
        double y = top + e->rank * pitch;
        double x = left + e->t0 * sx, w = (e->t1 - e->t0) * sx;
        if (!(w > 0))
            continue;
        int key = e->kind >= 0 && e->kind < BG_OP_KIND_COUNT ? e->kind : TL_OTHER;
        if (key == BG_OP_RECV_GRAD)
            key = BG_OP_RECV_ACT; /* one legend entry for both waits */
        seen[key] = 1;
        char tip[160];
        snprintf(tip, sizeof tip, "%s mb %d stage %d", e->what ? e->what : "?", e->mb, e->stage);
        if (tl_is_comm(key)) {
            if (e->peer >= 0)
                snprintf(tip + strlen(tip), sizeof tip - strlen(tip), " to %d", e->peer);
            bg__str_printf(&o, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>", x,
                           y + lane + 1, w < 0.5 ? 0.5 : w, comm - 2, tl_fill(key));
            bg__escape(&o, tip);
            bg__str_printf(&o, ": %.4g..%.4g %s</title></rect>\n", e->t0, e->t1, tl->unit);
            continue;
        }
        busy[e->rank] += e->t1 - e->t0;
        int c = e->chunk > 3 ? 3 : e->chunk < 0 ? 0 : e->chunk;
        chunks_seen[c] = 1;
        bg__str_printf(&o, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" stroke=\"white\" "
                           "stroke-width=\"0.5\"><title>",
                       x, y, w < 0.5 ? 0.5 : w, lane, tl_fill(key));
        bg__escape(&o, tip);
        bg__str_printf(&o, " chunk %d: %.4g..%.4g %s</title></rect>\n", e->chunk, e->t0, e->t1, tl->unit);
        if (c > 0)
            bg__str_printf(&o, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"url(#chunk%d)\" "
                               "pointer-events=\"none\"/>\n",
                           x, y, w, lane, c);
        if (e->mb >= 0 && w >= 9) {
            double fs = w / 2.2 < 11 ? w / 2.2 : 11;
            if (fs >= 4)
                bg__str_printf(&o, "<text x=\"%.2f\" y=\"%.1f\" font-size=\"%.1f\" fill=\"white\" stroke=\"#222\" "
                                   "stroke-width=\"2\" paint-order=\"stroke\" text-anchor=\"middle\">%d</text>\n",
                               x + w / 2, y + lane / 2 + fs * 0.35, fs, e->mb);
        }
    }
    for (int r = 0; r < tl->ranks; r++)
        if (busy[r] < tl->step * 0.999)
            seen[TL_IDLE] = 1;
    free(busy);
    /* the step's end, when the axis runs past it */
    if (x_max > tl->step * 1.001)
        bg__str_printf(&o, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\" "
                           "stroke-dasharray=\"4 3\"/><text x=\"%.1f\" y=\"%.0f\" font-size=\"10\" "
                           "text-anchor=\"middle\">step end</text>\n",
                       left + tl->step * sx, top - 4, left + tl->step * sx, ya, left + tl->step * sx, top - 7);
    /* time axis: ticks, labels and the unit */
    bg__str_printf(&o, "<g class=\"axis\">\n<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                   left, ya, left + plot_w, ya);
    for (double tt = 0; tt <= x_max * 1.0000001; tt += tick)
        bg__str_printf(&o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
                           "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">%g</text>\n",
                       left + tt * sx, ya, left + tt * sx, ya + 4, left + tt * sx, ya + 15,
                       fabs(tt) < tick * 1e-9 ? 0.0 : tt);
    bg__str_printf(&o, "<text class=\"axis-label\" x=\"%.0f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">"
                       "time (",
                   left + plot_w / 2, ya + 32);
    bg__escape(&o, tl->unit ? tl->unit : "unit costs");
    bg__str_printf(&o, ")</text>\n</g>\n");
    /* legend: only what was drawn */
    double lx = left, ly = ya + 44, lend = left + plot_w + right - 10;
    bg__str_printf(&o, "<g class=\"legend\">\n");
    for (int k = 0; k < TL_NKEYS; k++) {
        if (!seen[k])
            continue;
        /* the swatch goes where the text went (tl_key may wrap to a new row) */
        double x0 = lx, y0 = ly;
        tl_key(&o, left, lend, &lx, &ly, "", tl_label(k));
        if (ly != y0)
            x0 = left;
        if (tl_is_comm(k))
            bg__str_printf(&o, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"6\" fill=\"%s\"/>\n", x0, ly + 4,
                           tl_fill(k));
        else
            bg__str_printf(&o, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"%s\"%s/>\n", x0, ly,
                           tl_fill(k), k == TL_IDLE ? " stroke=\"#bbb\"" : "");
    }
    int nchunks = chunks_seen[1] + chunks_seen[2] + chunks_seen[3];
    for (int c = 0; nchunks && c < 4; c++) {
        if (!chunks_seen[c])
            continue;
        char lbl[48];
        snprintf(lbl, sizeof lbl, c == 0 ? "chunk 0 (plain)" : c == 3 ? "chunk 3+ (dotted)" : "chunk %d (hatched)", c);
        double x0 = lx, y0 = ly;
        tl_key(&o, left, lend, &lx, &ly, "", lbl);
        if (ly != y0)
            x0 = left;
        bg__str_printf(&o, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"#777\"/>", x0, ly);
        if (c > 0)
            bg__str_printf(&o, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"url(#chunk%d)\"/>", x0,
                           ly, c);
        bg__str_printf(&o, "\n");
    }
    bg__str_printf(&o, "</g>\n</svg>\n");
    if (o.oom || !o.buf) {
        bg__str_free(&o);
        return bg_error(BG_ERR_NOMEM, "cannot build the SVG");
    }
    *svg_p = o.buf;
    return BG_OK;
}

bg_status_t bg__write_atomic(const char *path, const char *text)
{
    size_t n = strlen(path) + 8;
    char *tmp = malloc(n);
    BG_ALLOC_CHECK(tmp, n, "file name");
    snprintf(tmp, n, "%s.tmp", path);
    bg_status_t st = BG_OK;
    FILE *f = fopen(tmp, "w");
    if (!f) {
        st = bg_error(BG_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    } else {
        size_t len = strlen(text);
        int bad = fwrite(text, 1, len, f) != len;
        bad |= fclose(f) != 0;
        if (bad || rename(tmp, path) != 0) {
            st = bg_error(BG_ERR_IO, "cannot write %s: %s", path, strerror(errno));
            remove(tmp);
        }
    }
    free(tmp);
    return st;
}

bg_status_t bg_schedule_svg_string_with(const bg_schedule_t *s, const bg_sim_result_t *res,
                                        const bg_svg_params_t *params, char **svg_p)
{
    if (!s || !res || !svg_p || res->p != s->p)
        return bg_error(BG_ERR_INVALID, "bg_schedule_svg: the result does not belong to this schedule");
    bg_svg_params_t prm = BG_SVG_PARAMS_INIT;
    if (params)
        memcpy(&prm, params, params->size < sizeof prm ? params->size : sizeof prm);
    double k = prm.time_scale > 0 ? prm.time_scale : 1;
    const char *unit = prm.unit ? prm.unit : "unit costs";
    bg__tl_box_t *box = malloc((res->nevents ? res->nevents : 1) * sizeof *box);
    char(*note)[64] = malloc((size_t)s->p * sizeof *note);
    if (!box || !note) {
        free(box);
        free(note);
        return bg_error(BG_ERR_NOMEM, "cannot build the SVG");
    }
    for (size_t i = 0; i < res->nevents; i++) {
        const bg_sim_event_t *e = &res->events[i];
        box[i] = (bg__tl_box_t){e->rank, e->kind, bg_schedule_stage_chunk(s, e->stage), e->microbatch,
                                e->start * k, e->end * k, bg_sched_op_kind_name((bg_sched_op_kind_t)e->kind),
                                e->stage, e->peer_stage};
    }
    for (int r = 0; r < s->p; r++)
        snprintf(note[r], sizeof note[r], "bubble %.1f%% (span %.1f%%), stash %d", 100 * bg_sim_bubble(res, r),
                 100 * bg_sim_span_bubble(res, r), bg_sim_peak_stash(res, r));
    char title[256];
    if (prm.title)
        snprintf(title, sizeof title, "%s", prm.title);
    else
        snprintf(title, sizeof title, "%s: p=%d m=%d v=%d, step %.4g %s, bubble %.1f%% (per stage %.1f%%)", s->name,
                 s->p, s->m, s->v, res->step * k, unit, 100 * bg_sim_bubble(res, -1), 100 * bg_sim_stage_bubble(res, NULL));
    bg__tl_t tl = {title, s->p, box, res->nevents, res->step * k, prm.x_max, unit, (const char(*)[64])note};
    bg_status_t st = bg__timeline_svg(&tl, svg_p);
    free(box);
    free(note);
    return st;
}

bg_status_t bg_schedule_svg_string(const bg_schedule_t *s, const bg_sim_result_t *res, char **svg_p)
{
    return bg_schedule_svg_string_with(s, res, NULL, svg_p);
}

bg_status_t bg_schedule_svg_with(const bg_schedule_t *s, const bg_sim_result_t *res, const bg_svg_params_t *params,
                                 const char *path)
{
    char *svg;
    BG_CHECK(bg_schedule_svg_string_with(s, res, params, &svg));
    bg_status_t st = bg__write_atomic(path, svg);
    free(svg);
    return st;
}

bg_status_t bg_schedule_svg(const bg_schedule_t *s, const bg_sim_result_t *res, const char *path)
{
    return bg_schedule_svg_with(s, res, NULL, path);
}
