/* schedule/gen_dualpipe.c: DeepSeek's DualPipe order and its half,
 * DualPipeV, one rank at a time (dualpipe.py; torch's ScheduleDualPipeV).
 *
 * Owns: the orders as lists of (kind, stage, microbatch) triples.
 * Must not: time or validate them; the list scheduler (gen_list.c) runs
 * them. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "schedule/generate_impl.h"
#include "schedule/schedule_impl.h"

/* DualPipeV's W queue: the W of the next b (from *wp on) in q, if any */
static void bg__dpv_w(int *q, int *n, int *wp)
{
    while (*wp < *n && q[3 * *wp] != BG_OP_BACKWARD_INPUT)
        (*wp)++;
    if (*wp < *n) {
        bg__push(q, n, BG_OP_BACKWARD_WEIGHT, q[3 * *wp + 1], q[3 * *wp + 2]);
        (*wp)++;
    }
}

/* DeepSeek's DualPipe order (dualpipe.py; DualPipeV is its half, as
 * torch.distributed.pipelining's ScheduleDualPipeV orders it) on "half
 * rank" r of p: local chunk 0 (stage st[0], its microbatches from mb0[0]) is
 * the one whose data enters nearer, chunk 1 the other. 2(p-r-1) chunk-0
 * forwards; r+1 pairs of F0 F1; p-r-1 of b1 W F1; then m-2p+r+1 rounds of
 * the paired "F&B" (F0 with the full B of chunk 1, F1 with the full B of
 * chunk 0; run one after the other here); p-r-1 of B1 then F1&B0; r+1 of
 * B1 B0 (the second half split into b, W deferred); p-r-1 of W b0; the
 * deferred W's. m microbatches per chunk, m >= 2p. One device runs a pair
 * one op after the other, so the pair's forward starts once its own input is
 * there and only the backward waits for its gradient (torch's DualPipeV runs
 * its OVERLAP_F_B so; waiting for both before the forward cost 3 of 54 time
 * units at p 4, m 8). */
static void bg__seq_dual(int p, int m, int r, const int st[2], const int mb0[2], int *q, int *n)
{
    int f[2] = {mb0[0], mb0[1]}, b[2] = {mb0[0], mb0[1]}, zb = 0, wp = *n;
    /* the W queue is the order of the b's already in q: wp scans for the next one */
#define BG__F(c) bg__push(q, n, BG_OP_FORWARD, st[c], f[c]++)
#define BG__B(c, split) bg__push(q, n, (split) ? BG_OP_BACKWARD_INPUT : BG_OP_BACKWARD, st[c], b[c]++)
#define BG__W() bg__dpv_w(q, n, &wp)
    for (int i = 0; i < 2 * (p - r - 1); i++)
        BG__F(0);
    for (int i = 0; i < r + 1; i++)
        BG__F(0), BG__F(1);
    for (int i = 0; i < p - r - 1; i++) {
        BG__B(1, 1);
        BG__W();
        BG__F(1);
    }
    for (int i = 0; i < m - 2 * p + r + 1; i++) {
        BG__F(0);
        BG__B(1, 0);
        BG__F(1), BG__B(0, 0);
    }
    for (int i = 0; i < p - r - 1; i++) {
        BG__B(1, 0);
        BG__F(1), BG__B(0, 0);
    }
    for (int i = 0, half = (r + 1) / 2; i < r + 1; i++) {
        if (i == half && r % 2 == 1)
            zb = 1;
        BG__B(1, zb);
        if (i == half && r % 2 == 0)
            zb = 1;
        BG__B(0, zb);
    }
    for (int i = 0; i < p - r - 1; i++) {
        BG__W();
        BG__B(0, zb);
    }
    while (wp < *n) /* the W's still queued */
        BG__W();
#undef BG__F
#undef BG__B
#undef BG__W
}

/* DualPipeV on rank r of the V layout: chunk 0 is stage r, every microbatch */
void bg__seq_dualpipev(const bg_schedule_t *s, int r, int *q, int *n)
{
    int st[2] = {s->chunk_stage[r * 2], s->chunk_stage[r * 2 + 1]}, mb0[2] = {0, 0};
    bg__seq_dual(s->p, s->m, r, st, mb0, q, n);
}

/* DualPipe on rank r: DualPipe's order on half rank min(r, p-1-r) of p/2,
 * m/2 microbatches per copy; a rank of the first half takes copy 0 (data
 * entering at rank 0) as its near chunk, one of the second half copy 1 (data
 * entering at rank p-1), so the two halves run mirror images of one order */
void bg__seq_dualpipe(const bg_schedule_t *s, int r, int *q, int *n)
{
    int near = r >= s->p / 2, h = near ? s->p - 1 - r : r, half = s->m / 2;
    int st[2] = {s->chunk_stage[r * 2 + near], s->chunk_stage[r * 2 + !near]};
    int mb0[2] = {near * half, !near * half};
    bg__seq_dual(s->p / 2, half, h, st, mb0, q, n);
}
