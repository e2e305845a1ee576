/* transport/comm_store.c: the bg_store_* API over the comm's request/reply
 * connection to the store (reconnecting a dropped one), the named barriers
 * comm.c joins and leaves the job with, and the check functions that end a
 * store wait once a peer failed. It calls the store client and engine.c's
 * failure status; it must not touch UCX or the liveness connection. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "transport/transport_impl.h"

bg_status_t bg__kv_check(void *arg)
{
    bg_comm_t *c = arg;
    return bg__peer_status(c, -1, "store");
}

/* A reconnect to the store gives up once rank 0 (the store) is known dead:
 * a refused connection then means it is gone, not busy. */
static bg_status_t bg__store_alive_check(void *arg)
{
    bg_comm_t *c = arg;
    return bg__peer_status(c, 0, "store");
}

/* ---- store API ----------------------------------------------------------------------- */

static bg_status_t bg__kv(bg_comm_t *c, uint8_t op, uint32_t arg, const char *key, const void *val,
                          size_t vlen, double tmo, int *st_p, uint8_t **out_p, size_t *olen_p)
{
    if (!c || !key)
        return bg_error(BG_ERR_INVALID, "store: NULL communicator or key");
    pthread_mutex_lock(&c->kv_lock);
    bg_status_t st;
    if (c->kv.fd < 0) {
        /* the stream was dropped (a timeout, or the store went away): reconnect,
         * unless rank 0 (the store) is known dead */
        st = bg__store_connect(c->addr, c->port, c->token, c->rank, BG__ROLE_KV, bg_now() + c->timeout_s,
                               bg__store_alive_check, c, &c->kv);
        c->kv.check = bg__kv_check;
        c->kv.check_arg = c;
        if (st != BG_OK) {
            pthread_mutex_unlock(&c->kv_lock);
            return st;
        }
    }
    st = bg__store_call(&c->kv, op, arg, key, val, vlen, bg_now() + tmo, st_p, out_p, olen_p);
    pthread_mutex_unlock(&c->kv_lock);
    return st;
}

bg_status_t bg_store_set(bg_comm_t *c, const char *key, const void *value, size_t bytes)
{
    int s;
    uint8_t *out = NULL;
    BG_CHECK(bg__kv(c, BG__OP_SET, 0, key, value, bytes, c->timeout_s, &s, &out, NULL));
    free(out);
    return s == BG__ST_OK ? BG_OK : bg_error(BG_ERR_TRANSPORT, "store: set \"%s\" refused", key);
}

bg_status_t bg_store_delete(bg_comm_t *c, const char *key)
{
    int s;
    uint8_t *out = NULL;
    BG_CHECK(bg__kv(c, BG__OP_DEL, 0, key, NULL, 0, c->timeout_s, &s, &out, NULL));
    free(out);
    if (s == BG__ST_NOTFOUND)
        return bg_error(BG_ERR_NOT_FOUND, "store: key \"%s\" is not set", key);
    return s == BG__ST_OK ? BG_OK : bg_error(BG_ERR_TRANSPORT, "store: delete \"%s\" refused", key);
}

static bg_status_t bg__get(bg_comm_t *c, uint8_t op, const char *key, void *value, size_t cap,
                           size_t *bytes_p)
{
    int s;
    uint8_t *out = NULL;
    size_t n = 0;
    double tmo = c->timeout_s;
    uint32_t ms = tmo * 1000 > 4e9 ? 4000000000u : (uint32_t)(tmo * 1000);
    BG_CHECK(bg__kv(c, op, ms, key, NULL, 0, tmo + 5, &s, &out, &n));
    bg_status_t st = BG_OK;
    if (s == BG__ST_OK) {
        if (value && cap)
            memcpy(value, out, n < cap ? n : cap);
        if (bytes_p)
            *bytes_p = n;
    } else if (s == BG__ST_NOTFOUND) {
        st = bg_error(BG_ERR_NOT_FOUND, "store: key \"%s\" is not set", key);
    } else if (s == BG__ST_TIMEOUT) {
        st = bg_error(BG_ERR_TIMEOUT, "store: key \"%s\" was not set within %.0f s", key, tmo);
    } else {
        st = bg_error(BG_ERR_TRANSPORT, "store: request for \"%s\" refused", key);
    }
    free(out);
    return st;
}

bg_status_t bg_store_get(bg_comm_t *c, const char *key, void *value, size_t cap, size_t *bytes_p)
{
    return bg__get(c, BG__OP_GET, key, value, cap, bytes_p);
}

bg_status_t bg_store_wait(bg_comm_t *c, const char *key, void *value, size_t cap, size_t *bytes_p)
{
    return bg__get(c, BG__OP_WAIT, key, value, cap, bytes_p);
}

bg_status_t bg_store_add(bg_comm_t *c, const char *key, int64_t delta, int64_t *value_p)
{
    int s;
    uint8_t *out = NULL;
    size_t n = 0;
    BG_CHECK(bg__kv(c, BG__OP_ADD, 0, key, &delta, 8, c->timeout_s, &s, &out, &n));
    bg_status_t st = BG_OK;
    if (s != BG__ST_OK || n != 8)
        st = bg_error(BG_ERR_TRANSPORT, "store: add on \"%s\" refused", key);
    else if (value_p)
        memcpy(value_p, out, 8);
    free(out);
    return st;
}

void bg__store_barrier_named(bg_comm_t *c, const char *name, double tmo, bg_status_t *st_p)
{
    char key[96];
    /* generation per name: every rank calls barriers in the same order */
    int64_t g = 0;
    snprintf(key, sizeof(key), "%s/gen/%d", name, c->rank);
    bg_status_t st = bg_store_add(c, key, 1, &g);
    if (st != BG_OK) {
        *st_p = st;
        return;
    }
    snprintf(key, sizeof(key), "%s/%lld", name, (long long)g);
    uint32_t ms = tmo <= 0 ? 1 : tmo * 1000 > 4e9 ? 4000000000u : (uint32_t)(tmo * 1000);
    int s;
    uint8_t *out = NULL;
    st = bg__kv(c, BG__OP_BARRIER, (uint32_t)c->size, key, &ms, 4, tmo + 5, &s, &out, NULL);
    if (st == BG_OK && s != BG__ST_OK)
        st = bg_error(s == BG__ST_TIMEOUT ? BG_ERR_TIMEOUT : BG_ERR_TRANSPORT,
                      "store barrier \"%s\" failed after %.0f s: %s", name, tmo, out ? (char *)out : "");
    free(out);
    *st_p = st;
}

bg_status_t bg_store_barrier(bg_comm_t *c)
{
    bg_status_t st;
    bg__store_barrier_named(c, "bg/user", c->timeout_s, &st);
    return st;
}
