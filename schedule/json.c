/* schedule/json.c: the JSON interchange format of a program set
 * (documented in docs/schedules.md), written and read with jansson. Reading
 * checks types and ranges and names the offending field by its JSON path;
 * it does not check dependencies (bg_schedule_validate does). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/check.h"
#include "schedule/schedule_impl.h"

static json_t *bg__to_json(const bg_schedule_t *s)
{
    json_t *root = json_object(), *ranks = json_array();
    if (!root || !ranks)
        goto fail;
    json_object_set_new(root, "format", json_string("brigade-schedule"));
    json_object_set_new(root, "version", json_integer(1));
    json_object_set_new(root, "schedule", json_string(s->name));
    json_object_set_new(root, "stages", json_integer(s->p));
    json_object_set_new(root, "microbatches", json_integer(s->m));
    json_object_set_new(root, "chunks", json_integer(s->v));
    if (s->copies > 1) /* absent: one copy */
        json_object_set_new(root, "copies", json_integer(s->copies));
    if (s->forward_only) /* absent: a training program */
        json_object_set_new(root, "forward_only", json_true());
    json_t *map = json_array();
    for (int st = 0; st < s->nstages; st++)
        json_array_append_new(map, json_pack("{s:i,s:i,s:i}", "stage", st, "rank", s->stage_rank[st], "chunk",
                                             s->stage_chunk[st]));
    json_object_set_new(root, "stage_map", map);
    for (int r = 0; r < s->p; r++) {
        json_t *ops = json_array();
        for (size_t i = 0; i < s->nops[r]; i++) {
            const bg_sched_op_t *op = &s->ops[r][i];
            const char *k = bg_sched_op_kind_name((bg_sched_op_kind_t)op->kind);
            json_t *o = json_pack("{s:s,s:i,s:i,s:i}", "kind", k ? k : "?", "microbatch", op->microbatch, "chunk",
                                  op->chunk, "stage", op->stage);
            if (o && op->peer_stage >= 0) {
                json_object_set_new(o, "peer_stage", json_integer(op->peer_stage));
                json_object_set_new(o, "peer_rank", json_integer(op->peer_rank));
            }
            if (!o || json_array_append_new(ops, o))
                goto fail;
        }
        json_array_append_new(ranks, json_pack("{s:i,s:o}", "rank", r, "ops", ops));
    }
    json_object_set_new(root, "ranks", ranks);
    return root;
fail:
    json_decref(root);
    json_decref(ranks);
    return NULL;
}

bg_status_t bg_schedule_to_json(const bg_schedule_t *s, char **json_p)
{
    json_t *root = bg__to_json(s);
    if (!root)
        return bg_error(BG_ERR_NOMEM, "cannot build the JSON of schedule %s", s->name);
    char *txt = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!txt)
        return bg_error(BG_ERR_NOMEM, "cannot serialise schedule %s", s->name);
    *json_p = txt;
    return BG_OK;
}

bg_status_t bg_schedule_to_json_file(const bg_schedule_t *s, const char *path)
{
    char *txt;
    BG_CHECK(bg_schedule_to_json(s, &txt));
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (!tmp) {
        free(txt);
        return bg_error(BG_ERR_NOMEM, "out of memory");
    }
    snprintf(tmp, n, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    bg_status_t st = BG_OK;
    if (!f) {
        st = bg_error(BG_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    } else {
        size_t len = strlen(txt);
        int bad = fwrite(txt, 1, len, f) != len || fputc('\n', f) == EOF;
        bad |= fclose(f) != 0;
        if (bad || rename(tmp, path) != 0) {
            st = bg_error(BG_ERR_IO, "cannot write %s: %s", path, strerror(errno));
            remove(tmp);
        }
    }
    free(tmp);
    free(txt);
    return st;
}

/* integer field; BG_ERR_PARSE naming path.key */
static bg_status_t bg__int(json_t *o, const char *key, const char *where, int required, int dflt, int lo, int hi,
                           int *out)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return bg_error(BG_ERR_PARSE, "schedule JSON: %s.%s is missing (an integer is required)", where, key);
        *out = dflt;
        return BG_OK;
    }
    if (!json_is_integer(v))
        return bg_error(BG_ERR_PARSE, "schedule JSON: %s.%s must be an integer", where, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return bg_error(BG_ERR_PARSE, "schedule JSON: %s.%s = %lld is out of range %d..%d", where, key, (long long)x,
                        lo, hi);
    *out = (int)x;
    return BG_OK;
}

static bg_status_t bg__from_root(json_t *root, bg_schedule_t **sched_p)
{
    if (!json_is_object(root))
        return bg_error(BG_ERR_PARSE, "schedule JSON: the top level must be an object");
    int p = 0, m = 0, v = 0;
    BG_CHECK(bg__int(root, "stages", "$", 1, 0, 1, 65536, &p));
    BG_CHECK(bg__int(root, "microbatches", "$", 1, 0, 1, 1 << 22, &m));
    BG_CHECK(bg__int(root, "chunks", "$", 0, 1, 1, 64, &v));
    int copies = 1;
    BG_CHECK(bg__int(root, "copies", "$", 0, 1, 1, 65536 * 64, &copies));
    if ((p * v) % copies || m % copies)
        return bg_error(BG_ERR_PARSE, "schedule JSON: $.copies = %d must divide both the %d stages x %d chunks and "
                        "the %d microbatches", copies, p, v, m);
    json_t *jfwd = json_object_get(root, "forward_only");
    if (jfwd && !json_is_boolean(jfwd))
        return bg_error(BG_ERR_PARSE, "schedule JSON: $.forward_only must be true or false");
    json_t *jname = json_object_get(root, "schedule");
    if (jname && !json_is_string(jname))
        return bg_error(BG_ERR_PARSE, "schedule JSON: $.schedule must be a string");
    const char *name = jname ? json_string_value(jname) : "custom";
    json_t *ranks = json_object_get(root, "ranks");
    if (!json_is_array(ranks))
        return bg_error(BG_ERR_PARSE, "schedule JSON: $.ranks must be an array of %d rank objects", p);
    if ((int)json_array_size(ranks) != p)
        return bg_error(BG_ERR_PARSE, "schedule JSON: $.ranks has %zu entries but stages = %d",
                        json_array_size(ranks), p);
    int S = p * v;
    if ((long long)S * m > 50000000LL)
        return bg_error(BG_ERR_PARSE, "schedule JSON: %d stages x %d chunks x %d microbatches is more than the 50M "
                        "(microbatch, stage) pairs supported", p, v, m);
    /* stage map: from the ops ((rank, chunk) -> stage); pairs never named take interleaved's */
    int *map = malloc(sizeof(int) * (size_t)S);
    BG_ALLOC_CHECK(map, sizeof(int) * (size_t)S, "stage map");
    for (int i = 0; i < S; i++)
        map[i] = -1;
    bg_status_t st = BG_OK;
    bg_schedule_t *s = NULL;
    char where[96];
    for (int pass = 0; pass < 2; pass++) {
        for (int ri = 0; ri < p; ri++) {
            json_t *jr = json_array_get(ranks, (size_t)ri);
            snprintf(where, sizeof where, "$.ranks[%d]", ri);
            if (!json_is_object(jr)) {
                st = bg_error(BG_ERR_PARSE, "schedule JSON: %s must be an object {\"rank\", \"ops\"}", where);
                goto out;
            }
            int r = -1;
            BG_CHECK_GOTO(bg__int(jr, "rank", where, 0, ri, 0, p - 1, &r), st, out);
            if (r != ri) {
                st = bg_error(BG_ERR_PARSE, "schedule JSON: %s.rank is %d; ranks must be listed in order 0..%d", where,
                              r, p - 1);
                goto out;
            }
            json_t *ops = json_object_get(jr, "ops");
            if (!json_is_array(ops)) {
                st = bg_error(BG_ERR_PARSE, "schedule JSON: %s.ops must be an array", where);
                goto out;
            }
            for (size_t i = 0; i < json_array_size(ops); i++) {
                json_t *jo = json_array_get(ops, i);
                snprintf(where, sizeof where, "$.ranks[%d].ops[%zu]", ri, i);
                if (!json_is_object(jo)) {
                    st = bg_error(BG_ERR_PARSE, "schedule JSON: %s must be an object", where);
                    goto out;
                }
                json_t *jk = json_object_get(jo, "kind");
                bg_sched_op_kind_t kind;
                if (!json_is_string(jk)) {
                    st = bg_error(BG_ERR_PARSE, "schedule JSON: %s.kind must be a string", where);
                    goto out;
                }
                if (bg_sched_op_kind_parse(json_string_value(jk), &kind) != BG_OK) {
                    st = bg_error(BG_ERR_PARSE, "schedule JSON: %s.kind: unknown kind \"%s\" (expected forward, "
                                  "backward, backward_input, backward_weight, send_act, recv_act, send_grad, "
                                  "recv_grad, reduce_grads or optimizer_step)", where, json_string_value(jk));
                    goto out;
                }
                int whole = kind == BG_OP_REDUCE_GRADS || kind == BG_OP_OPTIMIZER_STEP;
                int comm = kind >= BG_OP_SEND_ACT && kind <= BG_OP_RECV_GRAD;
                int mb = -1, c = -1, sg = -1, ps = -1, pr = -1;
                BG_CHECK_GOTO(bg__int(jo, "microbatch", where, !whole, -1, whole ? -1 : 0, whole ? -1 : m - 1, &mb),
                              st, out);
                BG_CHECK_GOTO(bg__int(jo, "chunk", where, 0, v == 1 ? 0 : -1, 0, v - 1, &c), st, out);
                BG_CHECK_GOTO(bg__int(jo, "stage", where, 0, -1, 0, S - 1, &sg), st, out);
                if (c < 0 && sg < 0) {
                    st = bg_error(BG_ERR_PARSE, "schedule JSON: %s needs \"stage\" or \"chunk\"", where);
                    goto out;
                }
                if (sg < 0) /* stage from the map (pass 1) */
                    sg = pass ? s->chunk_stage[ri * v + c] : -1;
                if (c < 0 && pass)
                    c = s->stage_chunk[sg];
                if (pass && (s->stage_rank[sg] != ri || s->stage_chunk[sg] != c)) {
                    /* an op naming only its stage, of a stage the map gave to another (rank, chunk) */
                    st = bg_error(BG_ERR_PARSE, "schedule JSON: %s: stage %d is chunk %d of rank %d, not chunk %d of "
                                  "rank %d", where, sg, s->stage_chunk[sg], s->stage_rank[sg], c, ri);
                    goto out;
                }
                if (pass == 0) {
                    if (c >= 0 && sg >= 0) {
                        int *slot = &map[ri * v + c];
                        if (*slot >= 0 && *slot != sg) {
                            st = bg_error(BG_ERR_PARSE, "schedule JSON: %s: chunk %d of rank %d is stage %d here but "
                                          "stage %d earlier", where, c, ri, sg, *slot);
                            goto out;
                        }
                        *slot = sg;
                    }
                    continue;
                }
                int dflt_peer = -1;
                if (comm)
                    dflt_peer = (kind == BG_OP_SEND_ACT || kind == BG_OP_RECV_GRAD) ? sg + 1 : sg - 1;
                BG_CHECK_GOTO(bg__int(jo, "peer_stage", where, 0, dflt_peer, -1, S, &ps), st, out);
                if (comm && (ps < 0 || ps >= S)) {
                    st = bg_error(BG_ERR_PARSE, "schedule JSON: %s: %s of stage %d has no peer stage %d (stages 0..%d)",
                                  where, bg_sched_op_kind_name(kind), sg, ps, S - 1);
                    goto out;
                }
                BG_CHECK_GOTO(bg__int(jo, "peer_rank", where, 0, comm ? s->stage_rank[ps] : -1, -1, p - 1, &pr), st,
                              out);
                bg_sched_op_t op = {kind, mb, c, sg, comm ? ps : -1, comm ? pr : -1};
                BG_CHECK_GOTO(bg_schedule_append(s, ri, &op), st, out);
            }
        }
        if (pass == 0) {
            /* fill pairs never named with interleaved's stage when free, then check it is a permutation */
            unsigned char *used = calloc((size_t)S, 1);
            if (!used) {
                st = bg_error(BG_ERR_NOMEM, "out of memory");
                goto out;
            }
            for (int i = 0; i < S; i++)
                if (map[i] >= 0) {
                    if (used[map[i]]) {
                        free(used);
                        st = bg_error(BG_ERR_PARSE, "schedule JSON: stage %d is held by two (rank, chunk) pairs",
                                      map[i]);
                        goto out;
                    }
                    used[map[i]] = 1;
                }
            for (int i = 0; i < S; i++)
                if (map[i] < 0) {
                    int r = i / v, c = i % v, want = c * p + r;
                    if (used[want]) {
                        for (want = 0; used[want]; want++)
                            ;
                    }
                    map[i] = want;
                    used[want] = 1;
                }
            free(used);
            BG_CHECK_GOTO(bg__schedule_alloc(name, BG_SCHED_CUSTOM, p, m, v, map, &s), st, out);
            s->copies = copies;
            s->forward_only = jfwd && json_is_true(jfwd);
        }
    }
    /* a known generator's name is kept as its kind */
    bg_schedule_kind_t k;
    if (bg_schedule_kind_parse(name, &k) == BG_OK)
        s->kind = k;
    bg_error_clear();
out:
    free(map);
    if (st != BG_OK) {
        bg_schedule_free(s);
        return st;
    }
    *sched_p = s;
    return BG_OK;
}

bg_status_t bg_schedule_from_json(const char *json, bg_schedule_t **sched_p)
{
    json_error_t err;
    if (!json)
        return bg_error(BG_ERR_INVALID, "bg_schedule_from_json: NULL text");
    json_t *root = json_loads(json, 0, &err);
    if (!root)
        return bg_error(BG_ERR_PARSE, "schedule JSON: malformed at line %d column %d: %s", err.line, err.column,
                        err.text);
    bg_status_t st = bg__from_root(root, sched_p);
    json_decref(root);
    return st;
}

bg_status_t bg_schedule_from_json_file(const char *path, bg_schedule_t **sched_p)
{
    json_error_t err;
    FILE *f = fopen(path, "r");
    if (!f)
        return bg_error(BG_ERR_IO, "cannot open schedule file %s: %s", path, strerror(errno));
    json_t *root = json_loadf(f, 0, &err);
    fclose(f);
    if (!root)
        return bg_error(BG_ERR_PARSE, "%s: malformed JSON at line %d column %d: %s", path, err.line, err.column,
                        err.text);
    bg_status_t st = bg__from_root(root, sched_p);
    json_decref(root);
    if (st != BG_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", bg_last_error());
        bg_error(st, "%s: %s", path, msg);
    }
    return st;
}

/* The simulator's figures as JSON (docs/schedules.md "Simulator JSON"): the
 * step, both bubble metrics (whole-step and per-stage) and per rank busy,
 * idle, span, bubbles and peak stash. */
bg_status_t bg_sim_result_to_json(const bg_sim_result_t *res, char **json_p)
{
    if (!res || !json_p)
        return bg_error(BG_ERR_INVALID, "bg_sim_result_to_json: result or output missing");
    int worst, p = res->p;
    json_t *root = json_object(), *ranks = json_array();
    if (!root || !ranks) {
        json_decref(root), json_decref(ranks);
        return bg_error(BG_ERR_NOMEM, "cannot build the simulator's JSON");
    }
    double sb = bg_sim_stage_bubble(res, &worst);
    json_object_set_new(root, "format", json_string("brigade-simulation"));
    json_object_set_new(root, "version", json_integer(1));
    json_object_set_new(root, "step", json_real(bg_sim_step_time(res)));
    json_object_set_new(root, "bubble", json_real(bg_sim_bubble(res, -1)));
    json_object_set_new(root, "stage_bubble", json_real(sb));
    json_object_set_new(root, "stage_bubble_rank", json_integer(worst));
    json_object_set_new(root, "steady_bubble", json_real(bg_sim_span_bubble(res, -1)));
    for (int k = 0; k < p; k++)
        json_array_append_new(ranks, json_pack("{s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:i,s:f}", "rank", k, "busy",
                                               bg_sim_busy(res, k), "idle", bg_sim_idle(res, k), "start",
                                               bg_sim_rank_start(res, k), "end", bg_sim_rank_end(res, k), "bubble",
                                               bg_sim_bubble(res, k), "span_bubble", bg_sim_span_bubble(res, k),
                                               "peak_stash", bg_sim_peak_stash(res, k), "peak_stash_bytes",
                                               bg_sim_peak_stash_bytes(res, k)));
    json_object_set_new(root, "ranks", ranks);
    char *txt = json_dumps(root, JSON_INDENT(1));
    json_decref(root);
    if (!txt)
        return bg_error(BG_ERR_NOMEM, "cannot serialise the simulator's figures");
    *json_p = txt;
    return BG_OK;
}

bg_status_t bg_sim_result_to_json_file(const bg_sim_result_t *res, const char *path)
{
    char *txt;
    BG_CHECK(bg_sim_result_to_json(res, &txt));
    bg_status_t st = bg__write_atomic(path, txt);
    free(txt);
    return st;
}
