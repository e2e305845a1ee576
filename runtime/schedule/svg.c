/* runtime/schedule/svg.c: an SVG Gantt chart of a simulated schedule: one
 * lane per rank, compute boxes coloured by kind (forward, full backward,
 * backward-input, backward-weight) with the microbatch number on each box,
 * transfers drawn as thin bars under the lane, a time axis, a legend and per
 * rank bubble and peak stash. It only draws what the simulator computed. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "runtime/schedule/schedule_impl.h"

static const char *bg__fill(int kind)
{
    switch (kind) {
    case BG_OP_FORWARD: return "#4e79a7";
    case BG_OP_BACKWARD: return "#e15759";
    case BG_OP_BACKWARD_INPUT: return "#f28e2b";
    case BG_OP_BACKWARD_WEIGHT: return "#59a14f";
    case BG_OP_REDUCE_GRADS: return "#9c755f";
    case BG_OP_OPTIMIZER_STEP: return "#b07aa1";
    default: return "#8c8c8c";
    }
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

bg_status_t bg_schedule_svg_string(const bg_schedule_t *s, const bg_sim_result_t *res, char **svg_p)
{
    if (!s || !res || !svg_p || res->p != s->p)
        return bg_error(BG_ERR_INVALID, "bg_schedule_svg: the result does not belong to this schedule");
    const double left = 70, right = 170, top = 50, lane = 26, comm = 6, gap = 10;
    double plot_w = 1100;
    double step = res->step > 0 ? res->step : 1;
    double sx = plot_w / step;
    double H = top + s->p * (lane + comm + gap) + 70;
    double Wt = left + plot_w + right;
    bg__str_t o = {0};
    bg__str_printf(&o, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                       "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                       "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n",
                   Wt, H, Wt, H);
    bg__str_printf(&o, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" y=\"22\" "
                       "font-size=\"15\" font-weight=\"bold\">",
                   left);
    bg__escape(&o, s->name);
    bg__str_printf(&o, ": p=%d m=%d v=%d, step %.4g, bubble %.1f%%</text>\n", s->p, s->m, s->v, res->step,
                   100 * bg_sim_bubble(res, -1));
    /* lanes */
    for (int r = 0; r < s->p; r++) {
        double y = top + r * (lane + comm + gap);
        bg__str_printf(&o, "<text x=\"%.0f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"end\">rank %d</text>\n",
                       left - 8, y + lane * 0.65, r);
        bg__str_printf(&o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f4f4f4\"/>\n", left, y,
                       plot_w, lane);
        bg__str_printf(&o, "<text x=\"%.0f\" y=\"%.1f\" font-size=\"11\">bubble %.1f%%, stash %d</text>\n",
                       left + plot_w + 8, y + lane * 0.65, 100 * bg_sim_bubble(res, r), bg_sim_peak_stash(res, r));
    }
    for (size_t i = 0; i < res->nevents; i++) {
        const bg_sim_event_t *e = &res->events[i];
        double y = top + e->rank * (lane + comm + gap);
        double x = left + e->start * sx, w = (e->end - e->start) * sx;
        if (w <= 0)
            continue;
        if (e->kind == BG_OP_SEND_ACT || e->kind == BG_OP_SEND_GRAD) {
            bg__str_printf(&o, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" "
                               "opacity=\"0.8\"><title>%s mb %d stage %d to %d: %.4g..%.4g</title></rect>\n",
                           x, y + lane + 1, w, comm - 2, e->kind == BG_OP_SEND_ACT ? "#76b7b2" : "#ff9da7",
                           bg_sched_op_kind_name((bg_sched_op_kind_t)e->kind), e->microbatch, e->stage,
                           e->peer_stage, e->start, e->end);
            continue;
        }
        if (e->kind == BG_OP_RECV_ACT || e->kind == BG_OP_RECV_GRAD)
            continue; /* a wait: the lane's background shows it */
        int c = bg_schedule_stage_chunk(s, e->stage);
        bg__str_printf(&o, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" stroke=\"white\" "
                           "stroke-width=\"0.5\"%s><title>%s mb %d stage %d: %.4g..%.4g</title></rect>\n",
                       x, y, w, lane, bg__fill(e->kind), c > 0 ? " fill-opacity=\"0.6\"" : "",
                       bg_sched_op_kind_name((bg_sched_op_kind_t)e->kind), e->microbatch, e->stage, e->start, e->end);
        if (e->microbatch >= 0 && w >= 9) {
            double fs = w / 2.2 < 11 ? w / 2.2 : 11;
            if (fs >= 4)
                bg__str_printf(&o, "<text x=\"%.2f\" y=\"%.1f\" font-size=\"%.1f\" fill=\"white\" "
                                   "text-anchor=\"middle\">%d</text>\n",
                               x + w / 2, y + lane / 2 + fs * 0.35, fs, e->microbatch);
        }
    }
    /* time axis */
    double ya = top + s->p * (lane + comm + gap);
    bg__str_printf(&o, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", left, ya,
                   left + plot_w, ya);
    double tick = pow(10, floor(log10(step / 5)));
    if (step / tick > 20)
        tick *= 5;
    else if (step / tick > 10)
        tick *= 2;
    for (double tt = 0; tt <= step * 1.0000001; tt += tick)
        bg__str_printf(&o, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">%g</text>\n",
                       left + tt * sx, ya + 13, tt);
    /* legend */
    const int kinds[] = {BG_OP_FORWARD, BG_OP_BACKWARD, BG_OP_BACKWARD_INPUT, BG_OP_BACKWARD_WEIGHT};
    const char *lbl[] = {"forward (F)", "full backward (B)", "backward-input (b)", "backward-weight (W)"};
    double lx = left, ly = ya + 30;
    for (int k = 0; k < 4; k++, lx += 170)
        bg__str_printf(&o, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"%s\"/><text x=\"%.0f\" "
                           "y=\"%.0f\" font-size=\"12\">%s</text>\n",
                       lx, ly, bg__fill(kinds[k]), lx + 18, ly + 11, lbl[k]);
    bg__str_printf(&o, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"6\" fill=\"#76b7b2\"/><rect x=\"%.0f\" "
                       "y=\"%.0f\" width=\"14\" height=\"6\" fill=\"#ff9da7\"/><text x=\"%.0f\" y=\"%.0f\" "
                       "font-size=\"12\">activation / gradient transfer</text>\n",
                   lx, ly, lx, ly + 8, lx + 18, ly + 11);
    if (s->v > 1)
        bg__str_printf(&o, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\">lighter boxes: chunks &gt; 0</text>\n",
                       left, ly + 30);
    bg__str_printf(&o, "</svg>\n");
    if (o.oom || !o.buf) {
        bg__str_free(&o);
        return bg_error(BG_ERR_NOMEM, "cannot build the SVG");
    }
    *svg_p = o.buf;
    return BG_OK;
}

bg_status_t bg_schedule_svg(const bg_schedule_t *s, const bg_sim_result_t *res, const char *path)
{
    char *svg;
    BG_CHECK(bg_schedule_svg_string(s, res, &svg));
    size_t n = strlen(path) + 8;
    char *tmp = malloc(n);
    if (!tmp) {
        free(svg);
        return bg_error(BG_ERR_NOMEM, "out of memory");
    }
    snprintf(tmp, n, "%s.tmp", path);
    bg_status_t st = BG_OK;
    FILE *f = fopen(tmp, "w");
    if (!f) {
        st = bg_error(BG_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    } else {
        size_t len = strlen(svg);
        int bad = fwrite(svg, 1, len, f) != len;
        bad |= fclose(f) != 0;
        if (bad || rename(tmp, path) != 0) {
            st = bg_error(BG_ERR_IO, "cannot write %s: %s", path, strerror(errno));
            remove(tmp);
        }
    }
    free(tmp);
    free(svg);
    return st;
}
