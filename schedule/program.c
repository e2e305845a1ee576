/* schedule/program.c: a user's program to run (brigade train
 * --schedule-json): read, proved correct and checked against the job's shape
 * before any rank connects. Reading is json.c's, proof validate.c's; this
 * file only ties them together and says which file a message is about. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/check.h"
#include "schedule/schedule_impl.h"

/* The largest file a program of this job's shape can be: per rank, chunk and
 * microbatch at most BG_PROGRAM_OPS_PER_MB instructions (forward, backward or
 * its two halves, two sends, two receives: 7 of them), BG_PROGRAM_OPS_PER_RANK
 * more per rank, each at most BG_PROGRAM_OP_BYTES written out (the longest
 * instruction, pretty-printed, is about 150 bytes), and the header. A larger
 * file is refused before it is read: parsing a 124 MB file took 26 s and
 * 1.6 GB on every rank before its size was found wrong. */
#define BG_PROGRAM_OPS_PER_MB 16
#define BG_PROGRAM_OPS_PER_RANK 64
#define BG_PROGRAM_OP_BYTES 512
#define BG_PROGRAM_MAX_CHUNKS 64 /* json.c's bound when the job does not say */

static bg_status_t program_size_check(const char *path, int ranks, int microbatches, int chunks)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return bg_error(BG_ERR_IO, "cannot open schedule file %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return BG_OK; /* a pipe: its size is not known before reading */
    double v = chunks > 0 ? chunks : BG_PROGRAM_MAX_CHUNKS;
    double ops = (double)ranks * (v * microbatches * BG_PROGRAM_OPS_PER_MB + BG_PROGRAM_OPS_PER_RANK);
    double limit = ops * BG_PROGRAM_OP_BYTES + 65536.0 * (1.0 + ranks * v / 64.0); /* the header and stage map */
    if ((double)sb.st_size > limit)
        return bg_error(BG_ERR_INVALID, "%s is %lld bytes, larger than any program for %d pipeline ranks x %d "
                        "microbatches x %s%d chunks can be (%.0f bytes): refused before reading it", path,
                        (long long)sb.st_size, ranks, microbatches, chunks > 0 ? "" : "up to ", (int)v, limit);
    return BG_OK;
}

bg_status_t bg_schedule_load_program(const char *path, int ranks, int microbatches, int chunks,
                                     bg_schedule_t **sched_p)
{
    if (!path || !sched_p)
        return bg_error(BG_ERR_INVALID, "bg_schedule_load_program: no file");
    bg_schedule_t *s = NULL;
    int moved = 0;
    BG_CHECK(program_size_check(path, ranks, microbatches, chunks));
    BG_CHECK(bg_schedule_from_json_file(path, &s));
    bg_status_t st = BG_OK;
    if (s->p != ranks) {
        st = bg_error(BG_ERR_INVALID, "%s is a program for p=%d pipeline ranks, but the job has %d (--pp)", path, s->p,
                      ranks);
    } else if (s->m != microbatches) {
        st = bg_error(BG_ERR_INVALID, "%s is a program for m=%d microbatches, but the job runs %d (--microbatches)",
                      path, s->m, microbatches);
    } else if (chunks > 0 && s->v != chunks) {
        st = bg_error(BG_ERR_INVALID, "%s places %d chunks per rank, but the job asks for %d (--chunks)", path, s->v,
                      chunks);
    } else if ((st = bg_schedule_order_weights(s, &moved)) != BG_OK ||
               (st = bg_schedule_validate(s)) != BG_OK) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", bg_last_error());
        bg_error(st, "%s does not validate: %s", path, msg);
    }
    if (st != BG_OK) {
        bg_schedule_free(s);
        return st;
    }
    if (moved)
        bg_log(BG_LOG_INFO, "schedule", "%s: %d weight gradients run after the one of the microbatch before "
               "them, not where the program places them (weight gradients add up in microbatch order)", path, moved);
    /* whatever name the file gives, this is no generator's program: traces and
     * checkpoints record it as custom (and never as a name to regenerate) */
    s->kind = BG_SCHED_CUSTOM;
    snprintf(s->name, sizeof s->name, "custom");
    *sched_p = s;
    return BG_OK;
}

/* ---- weight gradients in microbatch order ---- */

typedef struct oplist {
    bg_sched_op_t *op;
    size_t n, cap;
} oplist_t;

static bg_status_t push(oplist_t *l, bg_sched_op_t o)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        bg_sched_op_t *grown = realloc(l->op, cap * sizeof *grown);
        BG_ALLOC_CHECK(grown, cap * sizeof *grown, "program rewrite");
        l->op = grown, l->cap = cap;
    }
    l->op[l->n++] = o;
    return BG_OK;
}

/* Rank r's list rewritten: an out-of-order weight gradient waits in
 * pending[st*m + mb] until the one before it has run, then follows it. */
static bg_status_t order_rank(bg_schedule_t *s, int r, int *next, unsigned char *pending, int *moved)
{
    oplist_t l = {0};
    bg_status_t st = BG_OK;
    for (size_t i = 0; i < s->nops[r] && st == BG_OK; i++) {
        bg_sched_op_t o = s->ops[r][i];
        int w = o.kind == BG_OP_BACKWARD || o.kind == BG_OP_BACKWARD_WEIGHT;
        int sg = o.stage, mb = o.microbatch;
        if (!w || sg < 0 || sg >= s->nstages || mb < 0 || mb >= s->m || mb < next[sg]) {
            st = push(&l, o); /* not a weight gradient, or one the validator will judge */
            continue;
        }
        if (mb > next[sg]) { /* its turn has not come: the input half runs here, the weight half waits */
            pending[(size_t)sg * s->m + mb] = 1;
            (*moved)++;
            if (o.kind == BG_OP_BACKWARD)
                o.kind = BG_OP_BACKWARD_INPUT, st = push(&l, o);
            continue;
        }
        st = push(&l, o); /* in order: it, then every waiting one after it */
        for (next[sg]++; st == BG_OK && next[sg] < s->m && pending[(size_t)sg * s->m + next[sg]]; next[sg]++) {
            pending[(size_t)sg * s->m + next[sg]] = 0;
            st = push(&l, (bg_sched_op_t){BG_OP_BACKWARD_WEIGHT, next[sg], o.chunk, sg, -1, -1});
        }
    }
    for (int c = 0; c < s->v && st == BG_OK; c++) { /* a wait nothing ended: an earlier one is missing */
        int sg = s->chunk_stage[r * s->v + c];
        for (int mb = next[sg] + 1; mb < s->m && st == BG_OK; mb++)
            if (pending[(size_t)sg * s->m + mb])
                st = bg_error(BG_ERR_INVALID, "rank %d: the weight gradient of microbatch %d stage %d waits for "
                              "that of microbatch %d, which the program does not have (weight gradients add up "
                              "in microbatch order)", r, mb, sg, next[sg]);
    }
    if (st != BG_OK || !l.op) {
        free(l.op);
        return st;
    }
    free(s->ops[r]);
    s->ops[r] = l.op;
    s->nops[r] = l.n;
    s->cap[r] = l.cap;
    return BG_OK;
}
bg_status_t bg_schedule_order_weights(bg_schedule_t *s, int *moved_p)
{
    if (!s)
        return bg_error(BG_ERR_INVALID, "bg_schedule_order_weights: NULL schedule");
    int moved = 0;
    if (moved_p)
        *moved_p = 0;
    if (s->forward_only)
        return BG_OK;
    int *next = malloc(sizeof(int) * (size_t)s->nstages);
    unsigned char *pending = calloc((size_t)s->nstages * (size_t)s->m, 1);
    bg_status_t st = BG_OK;
    if (!next || !pending)
        st = bg_error(BG_ERR_NOMEM, "program rewrite: %d stages x %d microbatches", s->nstages, s->m);
    for (int i = 0; st == BG_OK && i < s->nstages; i++)
        next[i] = bg__mb_first(s, i);
    for (int r = 0; st == BG_OK && r < s->p; r++)
        st = order_rank(s, r, next, pending, &moved);
    free(next), free(pending);
    if (st == BG_OK && moved_p)
        *moved_p = moved;
    return st;
}
