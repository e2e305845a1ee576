/* schedule/gen_orders.c: the fixed compute orders of Megatron's interleaved
 * 1F1B and of the zero-bubble family (ZB-H1, ZB-V, interleaved zero bubble),
 * one rank at a time, as the published schedules order them.
 *
 * Owns: each order as a list of (kind, stage, microbatch) triples.
 * Must not: time or validate them; the list scheduler (gen_list.c) runs them
 * and drops an order that cannot run for p, m. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "schedule/generate_impl.h"
#include "schedule/schedule_impl.h"

/* push only microbatches < m (orders whose counters run past m) */
static void bg__push_lt(int *q, int *n, int m, int kind, int stage, int mb)
{
    if (mb < m)
        bg__push(q, n, kind, stage, mb);
}

/* Megatron's interleaved order on rank r: microbatches in groups of p (the
 * last group may be smaller), each group run through chunk 0, 1, ..; the
 * backward mirrors it with the chunks reversed; warm-up 2(p-r-1) + (v-1)p. */
static void bg__interleaved_mb(int k, int p, int v, int m, int backward, int *mb, int *c)
{
    int full = m / p, grp = k / (p * v);
    if (grp < full) {
        int w = k % (p * v);
        *c = w / p, *mb = grp * p + w % p;
    } else {
        int q = m - full * p, w = k - full * p * v;
        *c = w / q, *mb = full * p + w % q;
    }
    if (backward)
        *c = v - 1 - *c;
}

/* Megatron's chunk order on rank r after `warm` forwards: F and backward in
 * turn; zb: the backward split, each b followed by the W of the backward r
 * steps earlier (the last r W's close the step) */
static void bg__seq_megatron(const bg_schedule_t *s, int r, int warm, int zb, int *q, int *n)
{
    int p = s->p, v = s->v, m = s->m, total = v * m, mb, c, nw = 0;
    warm = bg__imin(warm, total);
    for (int k = 0; k < warm; k++) {
        bg__interleaved_mb(k, p, v, m, 0, &mb, &c);
        bg__push(q, n, BG_OP_FORWARD, s->chunk_stage[r * v + c], mb);
    }
    for (int k = 0; k < total; k++) {
        if (k + warm < total) {
            bg__interleaved_mb(k + warm, p, v, m, 0, &mb, &c);
            bg__push(q, n, BG_OP_FORWARD, s->chunk_stage[r * v + c], mb);
        }
        bg__interleaved_mb(k, p, v, m, 1, &mb, &c);
        bg__push(q, n, zb ? BG_OP_BACKWARD_INPUT : BG_OP_BACKWARD, s->chunk_stage[r * v + c], mb);
        if (zb && k >= r) {
            bg__interleaved_mb(nw++, p, v, m, 1, &mb, &c);
            bg__push(q, n, BG_OP_BACKWARD_WEIGHT, s->chunk_stage[r * v + c], mb);
        }
    }
    while (zb && nw < total) {
        bg__interleaved_mb(nw++, p, v, m, 1, &mb, &c);
        bg__push(q, n, BG_OP_BACKWARD_WEIGHT, s->chunk_stage[r * v + c], mb);
    }
}

void bg__seq_interleaved(const bg_schedule_t *s, int r, int *q, int *n)
{
    bg__seq_megatron(s, r, (s->p - r - 1) * 2 + (s->v - 1) * s->p, 0, q, n);
}

/* ZB-H1 on rank r: 1F1B's warm-up and F/B rhythm, with each W(i) issued
 * after B(i + r): the later the rank, the more W's it postpones, which fills
 * the cool-down bubble while keeping at most p microbatches stashed. */
void bg__seq_zbh1(const bg_schedule_t *s, int r, int *q, int *n)
{
    int p = s->p, m = s->m, st = s->chunk_stage[r];
    int warm = bg__imin(p - r - 1, m);
    for (int i = 0; i < warm; i++)
        bg__push(q, n, BG_OP_FORWARD, st, i);
    for (int i = 0; i < m; i++) {
        if (i + warm < m)
            bg__push(q, n, BG_OP_FORWARD, st, i + warm);
        bg__push(q, n, BG_OP_BACKWARD_INPUT, st, i);
        if (i - r >= 0)
            bg__push(q, n, BG_OP_BACKWARD_WEIGHT, st, i - r);
    }
    for (int i = m - r > 0 ? m - r : 0; i < m; i++)
        bg__push(q, n, BG_OP_BACKWARD_WEIGHT, st, i);
}

/* torch.distributed.pipelining's ZB-V order on rank r (ScheduleZBVZeroBubble,
 * after the Zero Bubble paper's V schedule): 2(p-r)-1 chunk-0 forwards,
 * r pairs of chunk-1/chunk-0 forwards, p-r chunk-1 F b W, then F b W of
 * chunk 0 and chunk 1 alternating, and a cool-down that defers W's. Counters
 * run past m (as in torch, which pads to 2p-1) and ops beyond m are dropped. */
void bg__seq_zbv(const bg_schedule_t *s, int r, int *q, int *n)
{
    int p = s->p, m = s->m, nm = m > 2 * p - 1 ? m : 2 * p - 1;
    int s0 = s->chunk_stage[r * 2], s1 = s->chunk_stage[r * 2 + 1];
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    for (int i = 0; i < 2 * (p - r) - 1; i++)
        bg__push_lt(q, n, m, BG_OP_FORWARD, s0, f0++);
    for (int i = 0; i < r; i++) {
        bg__push_lt(q, n, m, BG_OP_FORWARD, s1, f1++);
        bg__push_lt(q, n, m, BG_OP_FORWARD, s0, f0++);
    }
    for (int i = 0; i < p - r; i++) {
        bg__push_lt(q, n, m, BG_OP_FORWARD, s1, f1++);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_INPUT, s1, b1);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_WEIGHT, s1, b1++);
    }
    while (f1 < f0 || f0 < nm) {
        if (f0 < nm)
            bg__push_lt(q, n, m, BG_OP_FORWARD, s0, f0++);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_INPUT, s0, b0);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_WEIGHT, s0, b0++);
        bg__push_lt(q, n, m, BG_OP_FORWARD, s1, f1++);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_INPUT, s1, b1);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_WEIGHT, s1, b1++);
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < r; i++) {
        bg__push_lt(q, n, m, BG_OP_BACKWARD_INPUT, s0, b0++);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_INPUT, s1, b1++);
    }
    for (int i = 0; i < p - r; i++) {
        bg__push_lt(q, n, m, BG_OP_BACKWARD_INPUT, s0, b0++);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_WEIGHT, s0, w0++);
    }
    while (w1 < b1)
        bg__push_lt(q, n, m, BG_OP_BACKWARD_WEIGHT, s1, w1++);
    while (w0 < b0)
        bg__push_lt(q, n, m, BG_OP_BACKWARD_WEIGHT, s0, w0++);
}

/* The interleaved zero-bubble order (torch's ScheduleInterleavedZeroBubble,
 * "ZB1P") on rank r: Megatron's chunk order with a warm-up of (v-1)g + p-1-r
 * forwards (g: the first microbatch group, min(p, m)), then F and b in turn,
 * each b followed by the W of the backward r steps earlier; the last r W's
 * close the step. */
void bg__seq_zbi(const bg_schedule_t *s, int r, int *q, int *n)
{
    int g = s->m < s->p ? s->m : s->p;
    bg__seq_megatron(s, r, (s->v - 1) * g + s->p - 1 - r, 1, q, n);
}
