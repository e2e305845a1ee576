/* kernels/cpu/cpu_bf16mm.c: the CPU backend's GEMM tile under --precision bf16
 * (bg_backend_params_t.precision): the tile's rows of op(A) and columns of
 * op(B) rounded to bf16 (kernels/bf16.h, the rounding of every backend), one
 * oneDNN matmul of them into an fp32 temporary (bf16 products, fp32
 * accumulation: AMX tiles or AVX-512 BF16 where the CPU has them), then
 * C = alpha * tmp + beta * C. The semantics of the CUDA backend's bf16 GEMMs.
 *
 * oneDNN is loaded at run time (cpu_blas.c opens libdnnl.so.2; its types come
 * from dnnl.h, Debian's libdnnl-dev, at build time: without the header the
 * path is compiled out and bf16 runs fp32 GEMMs). A matmul primitive is made
 * once per tile shape and kept (process-wide, under a lock); each call makes
 * its memory objects and runs on the calling thread with a stream of its own
 * thread. The path is used only when oneDNN's implementation for bf16 is a
 * real one (its name has "amx" or "bf16": not the reference loops), checked
 * once by making a 64 x 64 x 64 primitive. Deterministic for a given tile
 * shape, as the fp32 tiles are. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/core.h"
#include "kernels/bf16.h"
#include "kernels/cpu/cpu_impl.h"

#ifdef BG_HAVE_DNNL_H
#include <dnnl.h>

static struct {
    pthread_once_t once;
    int ok;
    char why[160], impl[96];
    dnnl_engine_t eng;
    pthread_mutex_t lock;
#define BF_CACHE 128
    struct bf_entry {
        int m, n, k, ta, tb;
        dnnl_primitive_t p;
        size_t scratch; /* bytes of its scratchpad, the caller's (so that threads run it at once) */
    } cache[BF_CACHE];
    int ncache;
    dnnl_status_t (*engine_create)(dnnl_engine_t *, dnnl_engine_kind_t, size_t);
    dnnl_status_t (*stream_create)(dnnl_stream_t *, dnnl_engine_t, unsigned);
    dnnl_status_t (*md_init)(dnnl_memory_desc_t *, int, const dnnl_dims_t, dnnl_data_type_t, const dnnl_dims_t);
    dnnl_status_t (*matmul_init)(dnnl_matmul_desc_t *, const dnnl_memory_desc_t *, const dnnl_memory_desc_t *,
                                 const dnnl_memory_desc_t *, const dnnl_memory_desc_t *);
    dnnl_status_t (*pd_create)(dnnl_primitive_desc_t *, const_dnnl_op_desc_t, const_dnnl_primitive_attr_t,
                               dnnl_engine_t, const_dnnl_primitive_desc_t);
    dnnl_status_t (*pd_query)(const_dnnl_primitive_desc_t, dnnl_query_t, int, void *);
    dnnl_status_t (*pd_destroy)(dnnl_primitive_desc_t);
    dnnl_status_t (*prim_create)(dnnl_primitive_t *, const_dnnl_primitive_desc_t);
    dnnl_status_t (*prim_destroy)(dnnl_primitive_t);
    dnnl_status_t (*mem_create)(dnnl_memory_t *, const dnnl_memory_desc_t *, dnnl_engine_t, void *);
    dnnl_status_t (*mem_destroy)(dnnl_memory_t);
    dnnl_status_t (*execute)(const_dnnl_primitive_t, dnnl_stream_t, int, const dnnl_exec_arg_t *);
    dnnl_status_t (*stream_wait)(dnnl_stream_t);
    dnnl_status_t (*attr_create)(dnnl_primitive_attr_t *);
    dnnl_status_t (*attr_scratchpad)(dnnl_primitive_attr_t, dnnl_scratchpad_mode_t);
    dnnl_status_t (*attr_destroy)(dnnl_primitive_attr_t);
    const dnnl_memory_desc_t *(*query_md)(const_dnnl_primitive_desc_t, dnnl_query_t, int);
    size_t (*md_size)(const dnnl_memory_desc_t *);
} bf = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

/* The memory descriptors of op(A) (m,k) and op(B) (k,n) in bf16, each stored densely as the caller stores it
 * (ta: A is (k,m) row-major, so op(A) is its column-major view), and of the fp32 (m,n) result. */
static int bf_mds(int m, int n, int k, int ta, int tb, dnnl_memory_desc_t *a, dnnl_memory_desc_t *b,
                  dnnl_memory_desc_t *c)
{
    dnnl_dims_t da = {m, k}, sa = {ta ? 1 : k, ta ? m : 1}, db = {k, n}, sb = {tb ? 1 : n, tb ? k : 1};
    dnnl_dims_t dc = {m, n}, sc = {n, 1};
    return bf.md_init(a, 2, da, dnnl_bf16, sa) || bf.md_init(b, 2, db, dnnl_bf16, sb) ||
           bf.md_init(c, 2, dc, dnnl_f32, sc);
}

/* A primitive for bf16 op(A) (m,k) x op(B) (k,n) -> fp32 (m,n), its scratchpad the caller's (*scratch_p
 * bytes: oneDNN's own would be shared by threads running the primitive at once); NULL on failure. impl:
 * its name. */
static dnnl_primitive_t bf_make(int m, int n, int k, int ta, int tb, size_t *scratch_p, char *impl, size_t cap)
{
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_attr_t attr;
    dnnl_primitive_t p = NULL;
    if (bf.attr_create(&attr))
        return NULL;
    int bad = bf.attr_scratchpad(attr, dnnl_scratchpad_mode_user) || bf_mds(m, n, k, ta, tb, &a, &b, &c) ||
              bf.matmul_init(&md, &a, &b, NULL, &c) || bf.pd_create(&pd, &md, attr, bf.eng, NULL);
    bf.attr_destroy(attr);
    if (bad)
        return NULL;
    const dnnl_memory_desc_t *smd = bf.query_md(pd, dnnl_query_scratchpad_md, 0);
    *scratch_p = smd ? bf.md_size(smd) : 0;
    const char *name = NULL;
    if (impl && bf.pd_query(pd, dnnl_query_impl_info_str, 0, &name) == dnnl_success && name)
        snprintf(impl, cap, "%s", name);
    if (bf.prim_create(&p, pd))
        p = NULL;
    bf.pd_destroy(pd);
    return p;
}

static void bf_load(void)
{
    void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(bf.why, sizeof bf.why, "oneDNN (libdnnl.so.2) is not installed");
        return;
    }
#define SYM(f, name) (*(void **)&bf.f = dlsym(h, name))
    if (!SYM(engine_create, "dnnl_engine_create") || !SYM(stream_create, "dnnl_stream_create") ||
        !SYM(md_init, "dnnl_memory_desc_init_by_strides") || !SYM(matmul_init, "dnnl_matmul_desc_init") ||
        !SYM(pd_create, "dnnl_primitive_desc_create") || !SYM(pd_query, "dnnl_primitive_desc_query") ||
        !SYM(pd_destroy, "dnnl_primitive_desc_destroy") || !SYM(prim_create, "dnnl_primitive_create") ||
        !SYM(prim_destroy, "dnnl_primitive_destroy") ||
        !SYM(mem_create, "dnnl_memory_create") || !SYM(mem_destroy, "dnnl_memory_destroy") ||
        !SYM(execute, "dnnl_primitive_execute") || !SYM(stream_wait, "dnnl_stream_wait") ||
        !SYM(attr_create, "dnnl_primitive_attr_create") ||
        !SYM(attr_scratchpad, "dnnl_primitive_attr_set_scratchpad_mode") ||
        !SYM(attr_destroy, "dnnl_primitive_attr_destroy") || !SYM(query_md, "dnnl_primitive_desc_query_md") ||
        !SYM(md_size, "dnnl_memory_desc_get_size")) {
        snprintf(bf.why, sizeof bf.why, "libdnnl.so.2 lacks the matmul C API of oneDNN 2.x");
        return;
    }
#undef SYM
    if (bf.engine_create(&bf.eng, dnnl_cpu, 0)) {
        snprintf(bf.why, sizeof bf.why, "oneDNN made no CPU engine");
        return;
    }
    size_t scratch = 0;
    dnnl_primitive_t p = bf_make(64, 64, 64, 0, 0, &scratch, bf.impl, sizeof bf.impl);
    if (!p) {
        snprintf(bf.why, sizeof bf.why, "oneDNN has no bf16 matmul here");
        return;
    }
    bf.cache[bf.ncache++] = (struct bf_entry){64, 64, 64, 0, 0, p, scratch};
    if (!strstr(bf.impl, "amx") && !strstr(bf.impl, "bf16")) {
        snprintf(bf.why, sizeof bf.why, "oneDNN's bf16 matmul here is %s, no bf16 hardware path", bf.impl);
        return;
    }
    bf.ok = 1;
}

int bg__cpu_bf16mm_available(const char **impl_p, const char **why_p)
{
    pthread_once(&bf.once, bf_load);
    if (impl_p)
        *impl_p = bf.impl;
    if (why_p)
        *why_p = bf.why;
    return bf.ok;
}

/* The cached primitive of a shape and layout; *owned_p = 1: a full cache made one for this call only (the
 * caller destroys it), so every shape still runs in bf16, whatever came first. */
static dnnl_primitive_t bf_get(int m, int n, int k, int ta, int tb, size_t *scratch_p, int *owned_p)
{
    *owned_p = 0;
    pthread_mutex_lock(&bf.lock);
    dnnl_primitive_t p = NULL;
    for (int i = 0; i < bf.ncache && !p; i++)
        if (bf.cache[i].m == m && bf.cache[i].n == n && bf.cache[i].k == k && bf.cache[i].ta == ta &&
            bf.cache[i].tb == tb)
            p = bf.cache[i].p, *scratch_p = bf.cache[i].scratch;
    if (!p && (p = bf_make(m, n, k, ta, tb, scratch_p, NULL, 0))) {
        if (bf.ncache < BF_CACHE)
            bf.cache[bf.ncache++] = (struct bf_entry){m, n, k, ta, tb, p, *scratch_p};
        else
            *owned_p = 1;
    }
    pthread_mutex_unlock(&bf.lock);
    return p;
}

/* n floats rounded to bf16 (one row of a stored matrix) */
static void bf_row(uint16_t *d, const float *src, size_t n)
{
    const uint32_t *u = (const uint32_t *)src;
    for (size_t i = 0; i < n; i++)
        d[i] = bg__bf16_from_bits(u[i]);
}

int bg__cpu_bf16mm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                   int ldb, float beta, float *c, int ldc)
{
    static __thread dnnl_stream_t stream;
    if (!bf.ok || (!stream && bf.stream_create(&stream, bf.eng, dnnl_stream_default_flags)))
        return -1;
    size_t scratch = 0;
    int owned;
    dnnl_primitive_t p = bf_get(m, n, k, ta, tb, &scratch, &owned);
    if (!p)
        return -1;
    size_t na = (size_t)m * k, nb = (size_t)k * n;
    char *buf = malloc(2 * (na + nb) + 4 * (size_t)m * n + scratch + 128);
    if (!buf) {
        if (owned)
            bf.prim_destroy(p);
        return -1;
    }
    uint16_t *a16 = (uint16_t *)buf, *b16 = a16 + na;
    float *t = (float *)(((uintptr_t)(b16 + nb) + 63) & ~(uintptr_t)63);
    void *sp = (void *)(((uintptr_t)(t + (size_t)m * n) + 63) & ~(uintptr_t)63);
    /* each operand densely, in the layout it is stored in: rows of A (m of k, or k of m when transposed) */
    for (int r = 0, rows = ta ? k : m, len = ta ? m : k; r < rows; r++)
        bf_row(a16 + (size_t)r * len, a + (size_t)r * lda, (size_t)len);
    for (int r = 0, rows = tb ? n : k, len = tb ? k : n; r < rows; r++)
        bf_row(b16 + (size_t)r * len, b + (size_t)r * ldb, (size_t)len);
    dnnl_memory_desc_t da, db, dc;
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL, ms = NULL;
    int rc = bf_mds(m, n, k, ta, tb, &da, &db, &dc) || bf.mem_create(&ma, &da, bf.eng, a16) ||
             bf.mem_create(&mb, &db, bf.eng, b16) || bf.mem_create(&mc, &dc, bf.eng, t);
    if (!rc && scratch) {
        dnnl_memory_desc_t ds;
        dnnl_dims_t es = {(dnnl_dim_t)scratch}, ss = {1};
        rc = bf.md_init(&ds, 1, es, dnnl_u8, ss) || bf.mem_create(&ms, &ds, bf.eng, sp);
    }
    if (!rc) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc},
                                   {DNNL_ARG_SCRATCHPAD, ms}};
        sigset_t old;
        bg__cpu_hold_signals(&old); /* oneDNN's kernels may move rsp into the heap (cpu_impl.h) */
        rc = bf.execute(p, stream, ms ? 4 : 3, args) || bf.stream_wait(stream);
        bg__cpu_release_signals(&old);
    }
    if (ms)
        bf.mem_destroy(ms);
    if (ma)
        bf.mem_destroy(ma);
    if (mb)
        bf.mem_destroy(mb);
    if (mc)
        bf.mem_destroy(mc);
    if (owned)
        bf.prim_destroy(p);
    for (int i = 0; !rc && i < m; i++) { /* C = alpha tmp + beta C (beta 0: C is not read) */
        float *ci = c + (size_t)i * ldc;
        const float *ti = t + (size_t)i * n;
        if (beta == 0.0f) {
            for (int j = 0; j < n; j++)
                ci[j] = alpha * ti[j];
        } else {
            for (int j = 0; j < n; j++)
                ci[j] = alpha * ti[j] + beta * ci[j];
        }
    }
    free(buf);
    return rc ? -1 : 0;
}

#else /* no dnnl.h at build time */

int bg__cpu_bf16mm_available(const char **impl_p, const char **why_p)
{
    if (impl_p)
        *impl_p = "";
    if (why_p)
        *why_p = "built without oneDNN's header (Debian libdnnl-dev)";
    return 0;
}

int bg__cpu_bf16mm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                   int ldb, float beta, float *c, int ldc)
{
    (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb, (void)beta,
        (void)c, (void)ldc;
    return -1;
}
#endif
