/* schedule/torch_csv.c: torch.distributed.pipelining's CSV schedule format
 * ("compute_only": PipelineScheduleMulti._dump_csv / _load_csv), read and
 * written, so that a schedule can be taken from PyTorch and back.
 *
 * The format: one row per pipeline rank (row i is rank i), each cell an
 * action "<stage><type><microbatch>" with type F (forward), I (backward-
 * input), W (backward-weight) or B (full backward), the stage a global
 * (virtual) stage index; an empty cell is an idle step. Reading also skips
 * torch's communication and FSDP actions (SEND_F, RECV_F, SEND_B, RECV_B,
 * UNSHARD, RESHARD): brigade places its own transfers.
 *
 * Owns: the text both ways, the stage map read from which row holds a stage
 * (a rank's chunks in increasing stage order), and turning a compute order
 * into a program (the list scheduler in gen_list.c inserts the transfers).
 * Must not: change an order it reads, but for the weight gradients, which
 * bg_schedule_order_weights puts in microbatch order (a full backward out of
 * that order splits into its input half, where it was, and its weight half);
 * one that brigade cannot run (a stage's forwards out of microbatch order, a
 * missing or repeated action, or a deadlock) is refused with the reason. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "schedule/generate_impl.h"
#include "schedule/schedule_impl.h"

#define BG__TCSV_MAX_RANKS 4096
#define BG__TCSV_MAX_STAGES 65536

bg_status_t bg_schedule_to_torch_csv(const bg_schedule_t *s, char **csv_p)
{
    if (!s || !csv_p)
        return bg_error(BG_ERR_INVALID, "bg_schedule_to_torch_csv: schedule or output missing");
    if (s->copies > 1)
        return bg_error(BG_ERR_INVALID, "%s runs %d model copies; torch's CSV format has one copy of each stage",
                        s->name, s->copies);
    bg__str_t t = {0};
    for (int r = 0; r < s->p; r++) {
        int first = 1;
        for (size_t i = 0; i < s->nops[r]; i++) {
            const bg_sched_op_t *o = &s->ops[r][i];
            char k = o->kind == BG_OP_FORWARD           ? 'F'
                     : o->kind == BG_OP_BACKWARD        ? 'B'
                     : o->kind == BG_OP_BACKWARD_INPUT  ? 'I'
                     : o->kind == BG_OP_BACKWARD_WEIGHT ? 'W'
                                                        : 0;
            if (!k)
                continue;
            bg__str_printf(&t, "%s%d%c%d", first ? "" : ",", o->stage, k, o->microbatch);
            first = 0;
        }
        bg__str_printf(&t, "\r\n"); /* Python's csv.writer ends rows so */
    }
    if (!t.buf || t.oom) {
        bg__str_free(&t);
        return bg_error(BG_ERR_NOMEM, "cannot write the torch CSV of %s", s->name);
    }
    *csv_p = t.buf;
    return BG_OK;
}

bg_status_t bg_schedule_to_torch_csv_file(const bg_schedule_t *s, const char *path)
{
    char *txt;
    bg_status_t st = bg_schedule_to_torch_csv(s, &txt);
    return st != BG_OK ? st : bg__write_free(path, txt);
}

typedef struct {
    int rank, stage, kind, mb;
} bg__tact_t;

/* one cell: 0 and *a filled for a compute action, 1 for one to skip (empty,
 * communication, FSDP), -1 for text that is no action */
static int bg__tcsv_cell(const char *c, size_t n, bg__tact_t *a)
{
    while (n && (isspace((unsigned char)*c) || *c == '"'))
        c++, n--;
    while (n && (isspace((unsigned char)c[n - 1]) || c[n - 1] == '"'))
        n--;
    if (!n)
        return 1;
    size_t i = 0;
    long st = 0, mb = 0;
    while (i < n && isdigit((unsigned char)c[i]) && st <= BG__TCSV_MAX_STAGES)
        st = st * 10 + (c[i++] - '0');
    if (i == 0 || i == n || st > BG__TCSV_MAX_STAGES)
        return -1;
    static const char *const skip[] = {"UNSHARD", "RESHARD", "SEND_F", "RECV_F", "SEND_B", "RECV_B"};
    for (size_t k = 0; k < sizeof skip / sizeof *skip; k++)
        if (n - i >= strlen(skip[k]) && !strncmp(c + i, skip[k], strlen(skip[k])))
            return 1;
    char t = c[i++];
    a->kind = t == 'F' ? BG_OP_FORWARD : t == 'B' ? BG_OP_BACKWARD : t == 'I' ? BG_OP_BACKWARD_INPUT
              : t == 'W' ? BG_OP_BACKWARD_WEIGHT : -1;
    if (a->kind < 0 || i == n)
        return -1;
    size_t d = i;
    while (i < n && isdigit((unsigned char)c[i]) && mb <= 1 << 22)
        mb = mb * 10 + (c[i++] - '0');
    if (i != n || i == d || mb > 1 << 22)
        return -1;
    a->stage = (int)st, a->mb = (int)mb;
    return 0;
}

/* the actions of the text, rank by rank in order; *np, *pp: count, ranks */
static bg_status_t bg__tcsv_parse(const char *text, bg__tact_t **acts_p, size_t *n_p, int *p_p)
{
    size_t cap = 256, n = 0;
    bg__tact_t *a = malloc(cap * sizeof *a);
    BG_ALLOC_CHECK(a, cap * sizeof *a, "torch CSV actions");
    int rank = 0;
    const char *line = text;
    while (*line) {
        const char *end = line + strcspn(line, "\n");
        size_t len = (size_t)(end - line);
        if (len && line[len - 1] == '\r')
            len--;
        if (rank >= BG__TCSV_MAX_RANKS) {
            free(a);
            return bg_error(BG_ERR_PARSE, "torch CSV: more than %d rows (one row per pipeline rank)",
                            BG__TCSV_MAX_RANKS);
        }
        for (size_t i = 0, col = 0; i <= len; col++) {
            size_t j = i;
            while (j < len && line[j] != ',')
                j++;
            bg__tact_t x = {rank, 0, 0, 0};
            int rc = bg__tcsv_cell(line + i, j - i, &x);
            if (rc < 0) {
                free(a);
                return bg_error(BG_ERR_PARSE, "torch CSV: row %d (rank %d), cell %zu \"%.*s\" is not an action "
                                "[stage][F|I|B|W][microbatch] such as 2F0", rank + 1, rank, col + 1,
                                (int)(j - i > 40 ? 40 : j - i), line + i);
            }
            if (rc == 0) {
                if (n == cap) {
                    bg__tact_t *b = realloc(a, 2 * cap * sizeof *a);
                    if (!b) {
                        free(a);
                        return bg_error(BG_ERR_NOMEM, "torch CSV: out of memory at %zu actions", n);
                    }
                    a = b, cap *= 2;
                }
                a[n++] = x;
            }
            i = j + 1;
        }
        rank++;
        line = *end ? end + 1 : end;
    }
    while (rank > 0 && (n == 0 || a[n - 1].rank < rank - 1)) /* trailing empty rows: no rank */
        rank--;
    *acts_p = a, *n_p = n, *p_p = rank;
    return BG_OK;
}

/* the layout of the actions: p ranks, v stages each (in increasing order, the
 * chunks), m microbatches; map[r * v + c] the stage of chunk c of rank r */
static bg_status_t bg__tcsv_layout(const bg__tact_t *a, size_t n, int p, int *v_p, int *m_p, int **map_p)
{
    int S = 0, m = 0;
    for (size_t i = 0; i < n; i++)
        S = a[i].stage + 1 > S ? a[i].stage + 1 : S, m = a[i].mb + 1 > m ? a[i].mb + 1 : m;
    if (p < 1 || S < 1)
        return bg_error(BG_ERR_PARSE, "torch CSV: no compute action (F, I, B or W) in any row");
    int *owner = malloc(sizeof(int) * (size_t)S), *cnt = calloc((size_t)p, sizeof(int));
    if (!owner || !cnt) {
        free(owner), free(cnt);
        return bg_error(BG_ERR_NOMEM, "torch CSV: %d stages", S);
    }
    for (int i = 0; i < S; i++)
        owner[i] = -1;
    bg_status_t st = BG_OK;
    for (size_t i = 0; i < n && st == BG_OK; i++) {
        if (owner[a[i].stage] >= 0 && owner[a[i].stage] != a[i].rank)
            st = bg_error(BG_ERR_INVALID, "torch CSV: stage %d is on rank %d and on rank %d; a stage has one rank",
                          a[i].stage, owner[a[i].stage], a[i].rank);
        else if (owner[a[i].stage] < 0)
            owner[a[i].stage] = a[i].rank, cnt[a[i].rank]++;
    }
    int v = S / p;
    for (int i = 0; i < S && st == BG_OK; i++)
        if (owner[i] < 0)
            st = bg_error(BG_ERR_INVALID, "torch CSV: stage %d has no action (stages 0..%d)", i, S - 1);
    for (int r = 0; r < p && st == BG_OK; r++)
        if (cnt[r] != v || S % p)
            st = bg_error(BG_ERR_INVALID, "torch CSV: rank %d holds %d stages but there are %d stages on %d ranks "
                          "(brigade places the same number on every rank)", r, cnt[r], S, p);
    int *map = st == BG_OK ? malloc(sizeof(int) * (size_t)S) : NULL;
    if (st == BG_OK && !map)
        st = bg_error(BG_ERR_NOMEM, "torch CSV: stage map");
    if (st == BG_OK) {
        memset(cnt, 0, sizeof(int) * (size_t)p);
        for (int i = 0; i < S; i++) /* increasing stage order: chunk 0, 1, .. */
            map[owner[i] * v + cnt[owner[i]]++] = i;
        *v_p = v, *m_p = m, *map_p = map;
    }
    free(owner), free(cnt);
    return st;
}

/* every stage: forwards in microbatch order, each microbatch's forward,
 * backward (full or input) and weight gradient once (backwards in any order:
 * bg_schedule_order_weights then puts the weight gradients in order) */
static bg_status_t bg__tcsv_orders(const bg__tact_t *a, size_t n, int S, int m)
{
    int *cnt = calloc((size_t)S * 3, sizeof(int));
    unsigned char *seen = calloc((size_t)S * (size_t)m * 3, 1);
    if (!cnt || !seen) {
        free(cnt), free(seen);
        return bg_error(BG_ERR_NOMEM, "torch CSV check: %d stages x %d microbatches", S, m);
    }
    static const char *const what[3] = {"forward", "backward", "weight gradient"};
    bg_status_t st = BG_OK;
    for (size_t i = 0; i < n && st == BG_OK; i++) {
        int k = a[i].kind == BG_OP_FORWARD ? 0 : a[i].kind == BG_OP_BACKWARD_WEIGHT ? 2 : 1;
        for (int j = k; j <= (a[i].kind == BG_OP_BACKWARD ? 2 : k) && st == BG_OK; j++) { /* B: its W too */
            unsigned char *once = &seen[((size_t)a[i].stage * m + a[i].mb) * 3 + j];
            if (j == 0 && a[i].mb != cnt[a[i].stage * 3])
                st = bg_error(BG_ERR_INVALID, "torch CSV: rank %d runs the forward of stage %d for microbatch %d "
                              "where microbatch %d is next; brigade runs each stage's forwards in microbatch order",
                              a[i].rank, a[i].stage, a[i].mb, cnt[a[i].stage * 3]);
            else if (*once)
                st = bg_error(BG_ERR_INVALID, "torch CSV: rank %d runs the %s of stage %d for microbatch %d twice",
                              a[i].rank, what[j], a[i].stage, a[i].mb);
            *once = 1;
            cnt[a[i].stage * 3 + j]++;
        }
    }
    for (int i = 0; i < S && st == BG_OK; i++)
        for (int k = 0; k < 3 && st == BG_OK; k++)
            if (cnt[i * 3 + k] != m)
                st = bg_error(BG_ERR_INVALID, "torch CSV: stage %d has %d %ss for %d microbatches", i, cnt[i * 3 + k],
                              what[k], m);
    free(cnt), free(seen);
    return st;
}

/* every stage's backwards (full or input) and weight gradients in microbatch order */
static int bg__tcsv_backwards_in_order(const bg_schedule_t *from)
{
    int *next = malloc(sizeof(int) * (size_t)from->nstages * 2), in_order = next != NULL;
    for (int i = 0; in_order && i < from->nstages; i++)
        next[2 * i] = next[2 * i + 1] = bg__mb_first(from, i);
    for (int r = 0; in_order && r < from->p; r++)
        for (size_t i = 0; in_order && i < from->nops[r]; i++) {
            const bg_sched_op_t *o = &from->ops[r][i];
            if (o->kind == BG_OP_BACKWARD || o->kind == BG_OP_BACKWARD_INPUT || o->kind == BG_OP_BACKWARD_WEIGHT)
                in_order = o->microbatch == next[2 * o->stage + (o->kind == BG_OP_BACKWARD_WEIGHT)]++;
            if (o->kind == BG_OP_BACKWARD)
                next[2 * o->stage + 1]++;
        }
    free(next);
    return in_order;
}

bg_status_t bg_schedule_from_torch_csv(const char *text, bg_schedule_t **sched_p)
{
    if (!text || !sched_p)
        return bg_error(BG_ERR_INVALID, "bg_schedule_from_torch_csv: text or output missing");
    bg__tact_t *a = NULL;
    size_t n = 0;
    int p = 0, v = 0, m = 0, *map = NULL;
    bg_schedule_t *from = NULL, *s = NULL;
    bg__costs_t unit = {0};
    bg__policy_t pol = {0};
    bg_status_t st = bg__tcsv_parse(text, &a, &n, &p);
    if (st == BG_OK)
        st = bg__tcsv_layout(a, n, p, &v, &m, &map);
    if (st == BG_OK)
        st = bg__tcsv_orders(a, n, p * v, m);
    if (st == BG_OK)
        st = bg__schedule_alloc("custom", BG_SCHED_CUSTOM, p, m, v, map, &from);
    for (size_t i = 0; i < n && st == BG_OK; i++) {
        bg_sched_op_t o = {a[i].kind, a[i].mb, from->stage_chunk[a[i].stage], a[i].stage, -1, -1};
        st = bg_schedule_append(from, a[i].rank, &o);
    }
    int moved = 0;
    if (st == BG_OK)
        st = bg_schedule_order_weights(from, &moved);
    if (st == BG_OK && moved)
        bg_log(BG_LOG_INFO, "schedule", "torch CSV: %d weight gradients run after the one of the microbatch before "
               "them (weight gradients add up in microbatch order)", moved);
    if (st == BG_OK)
        st = bg__schedule_alloc("custom", BG_SCHED_CUSTOM, p, m, v, map, &s);
    if (st == BG_OK)
        st = bg__costs_init(&unit, NULL, p * v);
    if (st == BG_OK) {
        pol.window = malloc(sizeof(int) * (size_t)p), pol.cap = malloc(sizeof(int) * (size_t)p);
        pol.peak = malloc(sizeof(int) * (size_t)p);
        if (!pol.window || !pol.cap || !pol.peak)
            st = bg_error(BG_ERR_NOMEM, "torch CSV: %d ranks", p);
    }
    if (st == BG_OK && bg__tcsv_backwards_in_order(from)) { /* the order as given, its transfers placed around it */
        st = bg__run_seq(s, &pol, NULL, from, &unit);
        if (st == BG_ERR_DEADLOCK)
            st = bg_error(BG_ERR_DEADLOCK, "torch CSV: the order cannot run: every rank waits for an action "
                          "another rank lists later (p=%d, m=%d, %d stages per rank)", p, m, v);
    } else if (st == BG_OK) { /* the list scheduler follows backwards in order only: each transfer at its op */
        st = bg__run_as_listed(s, from);
        if (st == BG_OK && (st = bg_schedule_validate(s)) != BG_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", bg_last_error());
            st = bg_error(st, "torch CSV: the order cannot run: %s", msg);
        }
    }
    free(a), free(map), free(unit.f);
    free(pol.window), free(pol.cap), free(pol.peak);
    bg_schedule_free(from);
    if (st != BG_OK) {
        bg_schedule_free(s);
        return st;
    }
    *sched_p = s;
    return BG_OK;
}

bg_status_t bg_schedule_from_torch_csv_file(const char *path, bg_schedule_t **sched_p)
{
    if (!path || !sched_p)
        return bg_error(BG_ERR_INVALID, "bg_schedule_from_torch_csv_file: no file");
    FILE *f = fopen(path, "rb");
    if (!f)
        return bg_error(BG_ERR_IO, "cannot open torch CSV %s: %s", path, strerror(errno));
    bg__str_t t = {0};
    char buf[65536];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0 && t.len < (size_t)1 << 30)
        bg__str_printf(&t, "%.*s", (int)k, buf);
    int bad = ferror(f);
    fclose(f);
    if (bad || t.oom) {
        bg__str_free(&t);
        return bg_error(bad ? BG_ERR_IO : BG_ERR_NOMEM, "cannot read torch CSV %s: %s", path,
                        bad ? "read error" : "out of memory");
    }
    bg_status_t st = bg_schedule_from_torch_csv(t.buf ? t.buf : "", sched_p);
    if (st != BG_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", bg_last_error());
        bg_error(st, "%s: %s", path, msg);
    }
    bg__str_free(&t);
    return st;
}
