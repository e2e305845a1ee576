/* runtime/cp.c: context parallelism's runtime side: the ring of a rank's
 * context group (the cp ranks of its pipeline rank, replica and tensor
 * member, schedule/layout.h) as the bg_cp_comm_t its model's attention
 * calls. A ring step is one send to the next member and one receive from
 * the previous, point to point on the job's communicator, with a tag of its
 * own per lane (BG__TAG_CP): every member runs the same program, so its
 * steps start in the same order everywhere and match in order. */
#include <stdlib.h>

#include "core/check.h"
#include "runtime/cp.h"
#include "runtime/exec_impl.h"

struct bg__cp {
    bg_cp_comm_t c;
    bg_comm_t *comm;
    int next, prev;  /* world ranks */
    uint64_t *bytes; /* the executor's counter of bytes sent */
};

typedef struct {
    bg_request_t *send, *recv;
} step_t;

static bg_status_t cp_ring_start(void *arg, int lane, const float *send, float *recv, size_t count, void **req_p)
{
    bg__cp_t *g = arg;
    uint32_t tag = ((uint32_t)BG__TAG_CP << 16) | (uint32_t)lane;
    step_t *s = calloc(1, sizeof(*s));
    BG_ALLOC_CHECK(s, sizeof(*s), "cp ring step");
    size_t bytes = count * sizeof(float);
    bg_status_t st = bg_irecv(g->comm, g->prev, tag, recv, bytes, &s->recv);
    if (st == BG_OK)
        st = bg_isend(g->comm, g->next, tag, send, bytes, &s->send);
    if (st != BG_OK) {
        if (s->recv) {
            bg_cancel(s->recv);
            bg_wait(s->recv);
            bg_request_free(s->recv);
        }
        free(s);
        return st;
    }
    *g->bytes += bytes;
    *req_p = s;
    return BG_OK;
}

static bg_status_t cp_wait(void *arg, void *req)
{
    (void)arg;
    step_t *s = req;
    bg_status_t st = bg_wait(s->send), st2 = bg_wait(s->recv);
    bg_request_free(s->send);
    bg_request_free(s->recv);
    free(s);
    return st != BG_OK ? st : st2;
}

bg_status_t bg__cp_create(bg_comm_t *comm, bg_model_desc_t *desc, int cp, const int *ranks, int me,
                          uint64_t *bytes_sent, bg__cp_t **cp_p)
{
    *cp_p = NULL;
    if (cp == 1)
        return bg_model_desc_set_cp(desc, NULL);
    int overlap; /* the attention backward reads it per call: a bad value fails here, before the first step */
    BG_CHECK(bg_config_on("BRIGADE_CP_OVERLAP", &overlap));
    bg__cp_t *g = calloc(1, sizeof(*g));
    BG_ALLOC_CHECK(g, sizeof(*g), "context-parallel group");
    g->comm = comm;
    g->bytes = bytes_sent;
    g->next = ranks[(me + 1) % cp];
    g->prev = ranks[(me + cp - 1) % cp];
    g->c = (bg_cp_comm_t){.size = cp, .rank = me, .ring_start = cp_ring_start, .wait = cp_wait, .arg = g};
    bg_status_t st = bg_model_desc_set_cp(desc, &g->c);
    if (st != BG_OK) {
        free(g);
        return st;
    }
    *cp_p = g;
    return BG_OK;
}

void bg__cp_destroy(bg__cp_t *cp, bg_model_desc_t *desc)
{
    if (!cp)
        return;
    if (bg_model_desc_cp(desc) == &cp->c)
        bg_model_desc_set_cp(desc, NULL);
    free(cp);
}
