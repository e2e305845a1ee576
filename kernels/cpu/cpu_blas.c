/* kernels/cpu/cpu_blas.c: the CPU's features (CPUID), the loading of
 * OpenBLAS with a kernel set ("core") fit for them, and of oneDNN's sgemm
 * when it is installed, and which of the two runs which GEMM layout
 * (include/brigade/cpu.h).
 *
 * Why brigade loads OpenBLAS itself: OpenBLAS (DYNAMIC_ARCH builds, Debian's)
 * chooses its core in its constructor, at load time, from a table of CPU
 * models; a model newer than the library gets generic SSE3 kernels
 * ("Prescott": 17-31 GFLOP/s instead of 140 on an Emerald Rapids core). The
 * only way to choose is OPENBLAS_CORETYPE, read by that constructor, so it
 * must be set before the library is loaded: libbrigade does not link
 * OpenBLAS, and loads it here with dlopen once the core is chosen from CPUID
 * features (a CPU model never seen still has the features).
 *
 * oneDNN (libdnnl.so.2, optional): its JIT sgemm dispatches on ISA features
 * and was ahead of OpenBLAS's SkylakeX kernels at the GPT's forward and
 * input-gradient shapes on Zen 5 (docs/benchmarks.md). It is used only when
 * its threading runtime is brigade's own OpenMP (libgomp) or sequential: the
 * backend runs it on one thread per GEMM tile by setting the calling OpenMP
 * task's thread count to 1, which a different OpenMP runtime would not see.
 *
 * BRIGADE_CPU_ISA (bg_cpu_isa, also here) caps the ISA of brigade's own
 * kernels and, when the libraries are loaded, OpenBLAS's core and oneDNN's
 * maximum ISA, so a wide CPU can run what a narrower one would.
 *
 * State: process-wide tables (bg__blas, bg__dnnl), each filled once under
 * pthread_once and read-only afterwards. Setting OPENBLAS_CORETYPE around the
 * dlopen is a momentary process-wide change (documented in cpu.h). Must not
 * print. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include <dlfcn.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "brigade/core.h"
#include "brigade/cpu.h"
#include "core/check.h"
#include "kernels/cpu/cpu_impl.h"

/* ------------------------------------------------------------------ CPUID */

#if defined(__x86_64__) || defined(__i386__)
static unsigned long long bg__xgetbv0(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

void bg_cpu_info(bg_cpu_info_t *info_p)
{
    bg_cpu_info_t c;
    memset(&c, 0, sizeof(c));
#if defined(__x86_64__) || defined(__i386__)
    unsigned a = 0, b = 0, cx = 0, d = 0, max = 0;
    if (!__get_cpuid(0, &max, &b, &cx, &d)) {
        *info_p = c;
        return;
    }
    memcpy(c.vendor, &b, 4), memcpy(c.vendor + 4, &d, 4), memcpy(c.vendor + 8, &cx, 4);
    __get_cpuid(1, &a, &b, &cx, &d);
    int fam = (int)((a >> 8) & 0xf), mod = (int)((a >> 4) & 0xf);
    c.family = fam == 0xf ? fam + (int)((a >> 20) & 0xff) : fam;
    c.model = (fam == 0x6 || fam == 0xf) ? mod + (int)(((a >> 16) & 0xf) << 4) : mod;
    int osxsave = (cx >> 27) & 1, avx = (cx >> 28) & 1, fma = (cx >> 12) & 1;
    unsigned long long xcr0 = osxsave ? bg__xgetbv0() : 0;
    int ymm_os = (xcr0 & 0x6) == 0x6;            /* XMM and YMM state */
    int zmm_os = ymm_os && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    int amx_os = (xcr0 & 0x60000) == 0x60000;     /* XTILECFG, XTILEDATA */
    unsigned b7 = 0, d7 = 0;
    if (max >= 7)
        __get_cpuid_count(7, 0, &a, &b7, &cx, &d7);
    c.avx = avx && ymm_os;
    c.avx2_fma = c.avx && fma && ((b7 >> 5) & 1);
    /* F (16), DQ (17), BW (30), VL (31) */
    c.avx512 = c.avx2_fma && zmm_os && (b7 & 0xc0030000u) == 0xc0030000u;
    c.amx = amx_os && ((d7 >> 24) & 1);
    c.vector_bits = c.avx512 ? 512 : c.avx2_fma ? 256 : 128;
    unsigned ext = 0;
    __get_cpuid(0x80000000, &ext, &b, &cx, &d);
    if (ext >= 0x80000004) {
        unsigned r[12];
        for (unsigned i = 0; i < 3; i++)
            __get_cpuid(0x80000002 + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
        char s[49];
        memcpy(s, r, 48);
        s[48] = 0;
        const char *p = s;
        while (*p == ' ')
            p++;
        snprintf(c.brand, sizeof(c.brand), "%s", p);
        for (size_t n = strlen(c.brand); n > 0 && c.brand[n - 1] == ' '; n--)
            c.brand[n - 1] = 0;
    }
#endif
    *info_p = c;
}

/* -------------------------------------------------------------- the ISA */

static const char *const bg__isa_names[] = {"default", "avx2", "avx512"};

const char *bg_cpu_isa_name(bg_cpu_isa_t isa)
{
    return (unsigned)isa < sizeof(bg__isa_names) / sizeof(bg__isa_names[0]) ? bg__isa_names[isa] : "?";
}

/* the widest ISA this CPU executes that the build has kernels for */
static bg_cpu_isa_t bg__isa_top(const bg_cpu_info_t *c)
{
#ifdef BG_CPU_ISA_VARIANTS
    return c->avx512 ? BG_CPU_ISA_AVX512 : c->avx2_fma ? BG_CPU_ISA_AVX2 : BG_CPU_ISA_DEFAULT;
#else
    (void)c;
    return BG_CPU_ISA_DEFAULT;
#endif
}

bg_status_t bg_cpu_isa(bg_cpu_isa_t *isa_p)
{
    bg_cpu_info_t c;
    bg_cpu_info(&c);
    bg_cpu_isa_t top = bg__isa_top(&c), want = top;
    const char *v = bg_config_str("BRIGADE_CPU_ISA");
    if (strcmp(v, "auto") != 0) {
        int found = 0;
        for (int i = 0; i < (int)(sizeof(bg__isa_names) / sizeof(bg__isa_names[0])); i++)
            if (!strcmp(v, bg__isa_names[i]))
                want = (bg_cpu_isa_t)i, found = 1;
        if (!found)
            return bg_error(BG_ERR_INVALID, "BRIGADE_CPU_ISA=\"%s\": expected auto, avx512, avx2 or default", v);
    }
    if (want > top) {
#ifdef BG_CPU_ISA_VARIANTS
        return bg_error(BG_ERR_UNSUPPORTED, "BRIGADE_CPU_ISA=%s, but this CPU (%s) executes at most %s", v,
                        c.brand[0] ? c.brand : "unknown model", bg_cpu_isa_name(top));
#else
        return bg_error(BG_ERR_UNSUPPORTED, "BRIGADE_CPU_ISA=%s, but this build has only the default kernels "
                        "(not an x86-64 GCC or clang build)", v);
#endif
    }
    *isa_p = want;
    return BG_OK;
}

/* The CPU's features with those above BRIGADE_CPU_ISA removed (the BLAS's
 * choices follow it); *capped_p = 1 when BRIGADE_CPU_ISA lowered them. An
 * invalid BRIGADE_CPU_ISA leaves the CPU as it is (the backend fails on it). */
static void bg__cpu_capped(bg_cpu_info_t *c, int *capped_p)
{
    bg_cpu_info(c);
    bg_cpu_isa_t isa;
    *capped_p = 0;
    if (bg_cpu_isa(&isa) != BG_OK || isa >= bg__isa_top(c))
        return;
    *capped_p = 1;
    c->avx512 = 0;
    if (isa < BG_CPU_ISA_AVX2)
        c->avx2_fma = c->avx = 0;
    c->vector_bits = c->avx2_fma ? 256 : 128;
}

/* ------------------------------------------------------------- the cores */

/* Vector level of an OpenBLAS x86 core: 3 AVX-512, 2 AVX2+FMA, 1 AVX, 0
 * SSE-only (Prescott, Core2, Nehalem, Atom, Barcelona, ...: the generic
 * fallbacks) or a name this table does not know. */
static int bg__core_level(const char *core)
{
    static const char *const l3[] = {"skylakex", "cooperlake", "sapphirerapids"};
    static const char *const l2[] = {"haswell", "zen", "skylake", "broadwell", "excavator", "alderlake"};
    static const char *const l1[] = {"sandybridge", "bulldozer", "piledriver", "steamroller"};
    for (size_t i = 0; i < sizeof(l3) / sizeof(l3[0]); i++)
        if (!strcasecmp(core, l3[i]))
            return 3;
    for (size_t i = 0; i < sizeof(l2) / sizeof(l2[0]); i++)
        if (!strcasecmp(core, l2[i]))
            return 2;
    for (size_t i = 0; i < sizeof(l1) / sizeof(l1[0]); i++)
        if (!strcasecmp(core, l1[i]))
            return 1;
    return 0;
}

static int bg__cpu_level(const bg_cpu_info_t *c) { return c->avx512 ? 3 : c->avx2_fma ? 2 : c->avx ? 1 : 0; }

/* The OpenBLAS core for the widest vector ISA the CPU supports (capped: by
 * BRIGADE_CPU_ISA); NULL below AVX (OpenBLAS's own detection is as good as
 * anything then) unless capped. */
static const char *bg__core_for(const bg_cpu_info_t *c, int capped)
{
    int amd = !strcmp(c->vendor, "AuthenticAMD") || !strcmp(c->vendor, "HygonGenuine");
    switch (bg__cpu_level(c)) {
    case 3: return "SkylakeX";
    case 2: return amd ? "Zen" : "Haswell";
    case 1: return "Sandybridge";
    default: return capped ? "Prescott" : NULL; /* BRIGADE_CPU_ISA=default: OpenBLAS's generic SSE3 kernels */
    }
}

/* ---------------------------------------------------------------- loading */

#ifndef BG_OPENBLAS_LIBDIR
#define BG_OPENBLAS_LIBDIR ""
#endif

static struct {
    pthread_once_t once;
    bg_status_t status;
    char error[1200];
    char path[512];
    char chosen_by[32];
    bg_blas_info_t info;
} bg__blas = {.once = PTHREAD_ONCE_INIT};

static int bg__dnnl_takes_over(void);

static void bg__blas_load_once(void)
{
    static const char soname[] = "libopenblas.so.0";
    bg_cpu_info_t cpu;
    int capped;
    bg__cpu_capped(&cpu, &capped);
    const char *chosen_by = "openblas", *core = NULL;
    /* the soname (LD_LIBRARY_PATH, the system's alternative), then the
     * library found at configure time */
    char configured[512];
    snprintf(configured, sizeof(configured), "%s%s%s", BG_OPENBLAS_LIBDIR, *BG_OPENBLAS_LIBDIR ? "/" : "", soname);
    const char *names[2] = {soname, configured};
    void *h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
    if (h) {
        chosen_by = "preloaded";
    } else {
        const char *user = getenv("OPENBLAS_CORETYPE");
        const char *mode = bg_config_str("BRIGADE_BLAS_CORE");
        if (user && *user)
            chosen_by = "OPENBLAS_CORETYPE";
        else if (mode && !strcmp(mode, "auto"))
            core = bg__core_for(&cpu, capped), chosen_by = !core ? "openblas" : capped ? "BRIGADE_CPU_ISA" : "cpuid";
        else if (mode && strcmp(mode, "openblas") != 0)
            core = mode, chosen_by = "BRIGADE_BLAS_CORE";
        if (core)
            setenv("OPENBLAS_CORETYPE", core, 1);
        for (int i = 0; i < 2 && !h; i++)
            h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (core)
            unsetenv("OPENBLAS_CORETYPE");
    }
    if (!h) {
        const char *e = dlerror();
        snprintf(bg__blas.error, sizeof(bg__blas.error), "cannot load OpenBLAS (%s, then %s): %s", soname,
                 configured, e ? e : "?");
        bg__blas.status = BG_ERR_NOT_FOUND;
        return;
    }
    bg_blas_info_t *b = &bg__blas.info;
    b->sgemm = (bg_blas_sgemm_fn)dlsym(h, "cblas_sgemm");
    *(void **)&b->set_num_threads = dlsym(h, "openblas_set_num_threads");
    *(void **)&b->get_num_threads = dlsym(h, "openblas_get_num_threads");
    char *(*corename)(void), *(*config)(void);
    *(void **)&corename = dlsym(h, "openblas_get_corename");
    *(void **)&config = dlsym(h, "openblas_get_config");
    if (!b->sgemm || !b->set_num_threads || !b->get_num_threads || !corename || !config) {
        snprintf(bg__blas.error, sizeof(bg__blas.error),
                 "%s lacks cblas_sgemm or openblas_{set,get}_num_threads/get_corename/get_config: not OpenBLAS?",
                 soname);
        bg__blas.status = BG_ERR_NOT_FOUND;
        return;
    }
    Dl_info di;
    const char *path = dladdr(*(void **)&b->sgemm, &di) && di.dli_fname ? di.dli_fname : soname;
    snprintf(bg__blas.path, sizeof(bg__blas.path), "%s", path);
    snprintf(bg__blas.chosen_by, sizeof(bg__blas.chosen_by), "%s", chosen_by);
    b->library = "OpenBLAS";
    b->path = bg__blas.path;
    b->version = config();
    b->core = corename();
    b->chosen_by = bg__blas.chosen_by;
    b->fallback = bg__core_level(b->core) < bg__cpu_level(&cpu);
    bg__blas.status = BG_OK;
    /* Kernels narrower than the CPU (a generic core, or OPENBLAS_CORETYPE=
     * Haswell on AVX-512: half the GEMM speed on Zen 5) are warned about
     * once per job: by a process that is rank 0 or has no rank; the other
     * ranks log it at INFO (brigade info says it too, with the advice). */
    const char *rank = getenv("BRIGADE_RANK");
    int first = !rank || !*rank || !strcmp(rank, "0");
    if (b->fallback && bg__dnnl_takes_over())
        bg_log(BG_LOG_INFO, "kernels",
               "OpenBLAS runs its \"%s\" kernels (chosen by: %s), narrower than this CPU's vectors; every GEMM "
               "runs on oneDNN instead (BRIGADE_GEMM)", b->core, b->chosen_by);
    else if (b->fallback)
        bg_log(first ? BG_LOG_WARN : BG_LOG_INFO, "kernels",
               "OpenBLAS runs its \"%s\" kernels (chosen by: %s), narrower than this CPU's vectors: GEMM at a "
               "fraction of the machine's speed (brigade info; docs/kernels.md)", b->core, b->chosen_by);
    else if (capped && bg__core_level(b->core) > bg__cpu_level(&cpu))
        /* BRIGADE_CPU_ISA measures a narrower CPU, but OPENBLAS_CORETYPE, BRIGADE_BLAS_CORE or a host that
         * loaded OpenBLAS first chose wider kernels: the GEMMs would be the wide CPU's. Under avx2 with oneDNN
         * usable, oneDNN (capped) runs every GEMM and OpenBLAS's core does not matter. */
        bg_log(cpu.avx2_fma && bg__dnnl_takes_over() ? BG_LOG_INFO : first ? BG_LOG_WARN : BG_LOG_INFO, "kernels",
               "BRIGADE_CPU_ISA=%s, but OpenBLAS runs its \"%s\" kernels (chosen by: %s), wider than that: its "
               "GEMMs are not those of such a CPU (unset OPENBLAS_CORETYPE and BRIGADE_BLAS_CORE to let the ISA "
               "choose the core)", cpu.avx2_fma ? "avx2" : "default", b->core, b->chosen_by);
    else
        bg_log(BG_LOG_DEBUG, "kernels", "OpenBLAS core %s (chosen by: %s), %s", b->core, b->chosen_by, b->path);
}

bg_status_t bg_blas_info(bg_blas_info_t *info_p)
{
    pthread_once(&bg__blas.once, bg__blas_load_once);
    if (bg__blas.status != BG_OK)
        return bg_error(bg__blas.status, "%s", bg__blas.error);
    *info_p = bg__blas.info;
    return BG_OK;
}

const bg_blas_info_t *bg__cpu_blas(void)
{
    pthread_once(&bg__blas.once, bg__blas_load_once);
    return bg__blas.status == BG_OK ? &bg__blas.info : NULL;
}

/* ----------------------------------------------------------------- oneDNN */

/* dnnl_version()'s result (dnnl_types.h) and its runtime values */
typedef struct {
    int major, minor, patch;
    const char *hash;
    unsigned cpu_runtime, gpu_runtime;
} bg__dnnl_version_t;
enum { BG__DNNL_RUNTIME_SEQ = 1, BG__DNNL_RUNTIME_OMP = 2 };

static struct {
    pthread_once_t once;
    int ok;
    char version[32];
    char path[512];
    char why[600];
    bg_dnnl_sgemm_fn sgemm;
} bg__dnnl = {.once = PTHREAD_ONCE_INIT};

static void bg__dnnl_load_once(void)
{
    static const char soname[] = "libdnnl.so.2";
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(bg__dnnl.why, sizeof(bg__dnnl.why), "not installed (%s; Debian package libdnnl2)", e ? e : soname);
        return;
    }
    const bg__dnnl_version_t *(*version)(void);
    *(void **)&version = dlsym(h, "dnnl_version");
    *(void **)&bg__dnnl.sgemm = dlsym(h, "dnnl_sgemm");
    if (!version || !bg__dnnl.sgemm) {
        snprintf(bg__dnnl.why, sizeof(bg__dnnl.why), "%s lacks dnnl_version or dnnl_sgemm", soname);
        bg__dnnl.sgemm = NULL;
        return; /* left loaded: unloading a C++ library is not worth the risk */
    }
    const bg__dnnl_version_t *v = version();
    void *its_omp = dlsym(h, "omp_set_num_threads");
    if (v->cpu_runtime == BG__DNNL_RUNTIME_OMP && its_omp != (void *)&omp_set_num_threads) {
        snprintf(bg__dnnl.why, sizeof(bg__dnnl.why),
                 "%s %d.%d.%d runs on another OpenMP runtime than brigade's (its threads could not be held to one "
                 "per GEMM tile)", soname, v->major, v->minor, v->patch);
        bg__dnnl.sgemm = NULL;
        return;
    }
    if (v->cpu_runtime != BG__DNNL_RUNTIME_OMP && v->cpu_runtime != BG__DNNL_RUNTIME_SEQ) {
        snprintf(bg__dnnl.why, sizeof(bg__dnnl.why),
                 "%s %d.%d.%d is built for a threading runtime other than OpenMP or sequential (%u)", soname,
                 v->major, v->minor, v->patch, v->cpu_runtime);
        bg__dnnl.sgemm = NULL;
        return;
    }
    /* BRIGADE_CPU_ISA below the CPU: oneDNN's JIT is capped the same way
     * (dnnl_set_max_cpu_isa, the API of ONEDNN_MAX_CPU_ISA: dnnl_types.h's
     * dnnl_cpu_isa_avx2 = 0x7, dnnl_cpu_isa_sse41 = 0x1, its lowest). It only
     * succeeds before oneDNN's first use in the process; when it fails,
     * oneDNN is not used rather than run wider than asked. */
    bg_cpu_info_t cpu;
    int capped;
    bg__cpu_capped(&cpu, &capped);
    if (capped) {
        int (*set_max_isa)(int);
        *(void **)&set_max_isa = dlsym(h, "dnnl_set_max_cpu_isa");
        int st = set_max_isa ? set_max_isa(cpu.avx2_fma ? 0x7 : 0x1) : -1;
        if (st != 0) {
            snprintf(bg__dnnl.why, sizeof(bg__dnnl.why),
                     "%s %d.%d.%d: cannot cap its ISA as BRIGADE_CPU_ISA asks (dnnl_set_max_cpu_isa: %d; "
                     "oneDNN used before brigade loaded it?)", soname, v->major, v->minor, v->patch, st);
            bg__dnnl.sgemm = NULL;
            return;
        }
    }
    Dl_info di;
    const char *path = dladdr(*(void **)&bg__dnnl.sgemm, &di) && di.dli_fname ? di.dli_fname : soname;
    snprintf(bg__dnnl.path, sizeof(bg__dnnl.path), "%s", path);
    snprintf(bg__dnnl.version, sizeof(bg__dnnl.version), "%d.%d.%d", v->major, v->minor, v->patch);
    bg__dnnl.ok = 1;
}

/* With BRIGADE_GEMM=auto or onednn and oneDNN usable, oneDNN runs every
 * GEMM when OpenBLAS's core is a fallback (bg_gemm_info): the fallback's
 * warning would be wrong then. */
static int bg__dnnl_takes_over(void)
{
    const char *mode = bg_config_str("BRIGADE_GEMM");
    if (!mode || (strcmp(mode, "auto") && strcmp(mode, "onednn")))
        return 0;
    pthread_once(&bg__dnnl.once, bg__dnnl_load_once);
    return bg__dnnl.ok;
}

/* oneDNN's sgemm with the calling thread's signals held (its kernels move rsp
 * into the heap: cpu_impl.h): the backend's tiles (on its own threads, one
 * each) and bg__dnnl_sgemm_1t. */
static int bg__dnnl_sgemm_held(char ta, char tb, long long m, long long n, long long k, float alpha, const float *a,
                               long long lda, const float *b, long long ldb, float beta, float *c, long long ldc)
{
    sigset_t old;
    bg__cpu_hold_signals(&old);
    int st = bg__dnnl.sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    bg__cpu_release_signals(&old);
    return st;
}

/* oneDNN's sgemm on the calling thread only: outside an active parallel
 * region it would take omp_get_max_threads() threads; this task's count is 1
 * inside the (inactive) region and ends with it. */
static int bg__dnnl_sgemm_1t(char ta, char tb, long long m, long long n, long long k, float alpha, const float *a,
                             long long lda, const float *b, long long ldb, float beta, float *c, long long ldc)
{
    int st = 0;
#pragma omp parallel num_threads(1)
    {
        omp_set_num_threads(1);
        st = bg__dnnl_sgemm_held(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    return st;
}

bg_dnnl_sgemm_fn bg__cpu_dnnl_sgemm(void)
{
    pthread_once(&bg__dnnl.once, bg__dnnl_load_once);
    return bg__dnnl.ok ? bg__dnnl_sgemm_held : NULL;
}

/* BRIGADE_GEMM_TRANSPOSE: whether A B^T ([0]), A^T B with m <= n ([1]) and
 * with m > n ([2]) copy their transposed operand (into the backend's scratch:
 * per tile, or once where tiles share it) and run A B instead: tr_min[i] 0
 * never, else from this min(m, n, k) up. auto: where it measured >= 3% faster
 * (docs/kernels.md, bench/gemm_transpose.sh, Emerald Rapids, one thread): A
 * B^T and A^T B under AVX2 with oneDNN at the d_model-256 GPT's shapes
 * (1.01-1.14, medians of 9 and 15 rounds, the class ahead in both runs), not
 * at d_model 128 (0.92-1.05); A B^T under AVX-512 with oneDNN there too (1.00-
 * 1.11, none behind; its A^T B lost, 0.92-0.94 at three of four shapes); the
 * default ISA lost everywhere (0.82-0.94). A function of the ISA, the library
 * and the product's shape only, never of the thread count or a tile. */
#define BG__GEMM_TRANSPOSE_MIN 256
static bg_status_t bg__gemm_transposes(int avx2_only, int avx512, int dnnl, int tr_min[3])
{
    const char *v = bg_config_str("BRIGADE_GEMM_TRANSPOSE");
    int on = !strcmp(v, "on"), off = !strcmp(v, "off");
    if (!on && !off && strcmp(v, "auto") != 0)
        return bg_error(BG_ERR_INVALID, "BRIGADE_GEMM_TRANSPOSE=\"%s\": expected auto, on or off", v);
    for (int i = 0; i < 3; i++)
        tr_min[i] = on;
    if (on || off)
        return BG_OK;
    for (int i = 0; i < 3; i++)
        tr_min[i] = avx2_only && dnnl ? BG__GEMM_TRANSPOSE_MIN : 0;
    if (avx512 && dnnl)
        tr_min[0] = BG__GEMM_TRANSPOSE_MIN;
    return BG_OK;
}

/* "LIB", "LIB after transpose" or "LIB after transpose where m, n, k >= 256" */
static const char *bg__gemm_name(int dnnl, int tr_min)
{
    _Static_assert(BG__GEMM_TRANSPOSE_MIN == 256, "bg__gemm_name's strings");
    if (!tr_min)
        return dnnl ? "oneDNN" : "OpenBLAS";
    if (tr_min == 1)
        return dnnl ? "oneDNN after transpose" : "OpenBLAS after transpose";
    return dnnl ? "oneDNN after transpose where m, n, k >= 256" : "OpenBLAS after transpose where m, n, k >= 256";
}

bg_status_t bg__cpu_gemm_choice(bg_gemm_info_t *info_p, int tr_min_p[4])
{
    bg_blas_info_t blas;
    BG_CHECK(bg_blas_info(&blas));
    const char *mode = bg_config_str("BRIGADE_GEMM");
    int m_auto = !strcmp(mode, "auto"), m_dnnl = !strcmp(mode, "onednn");
    if (!m_auto && !m_dnnl && strcmp(mode, "openblas") != 0)
        return bg_error(BG_ERR_INVALID, "BRIGADE_GEMM=\"%s\": expected auto, openblas or onednn", mode);
    bg_gemm_info_t g;
    memset(&g, 0, sizeof(g));
    g.mode = m_auto ? "auto" : m_dnnl ? "onednn" : "openblas";
    if (m_auto || m_dnnl) {
        pthread_once(&bg__dnnl.once, bg__dnnl_load_once);
        if (!bg__dnnl.ok && m_dnnl)
            return bg_error(BG_ERR_NOT_FOUND, "BRIGADE_GEMM=onednn, but oneDNN cannot be used: %s", bg__dnnl.why);
    } else {
        g.onednn_why = "BRIGADE_GEMM=openblas";
    }
    if (bg__dnnl.ok && (m_auto || m_dnnl)) {
        g.onednn = 1;
        g.onednn_version = bg__dnnl.version;
        g.onednn_path = bg__dnnl.path;
        g.dnnl_sgemm = bg__dnnl_sgemm_1t;
    } else if (!g.onednn_why) {
        g.onednn_why = bg__dnnl.why;
    }
    /* auto: oneDNN where it was measured ahead (docs/kernels.md): A B, A B^T
     * and A^T B with m <= n on AVX-512 (A^T B with m > n was even at 3 rows
     * per column and behind at 4, 0.86 of OpenBLAS's SkylakeX kernels); every
     * layout on AVX2 (oneDNN's AVX2 kernels 1.1-1.3x OpenBLAS's Haswell ones
     * at the GPT's shapes, the tall A^T B included); everywhere OpenBLAS runs
     * kernels narrower than the CPU. Below AVX2 (SSE: both at the vector
     * units' limit) OpenBLAS. */
    bg_cpu_info_t cpu;
    int capped;
    bg__cpu_capped(&cpu, &capped);
    int avx2_only = cpu.avx2_fma && !cpu.avx512;
    int ahead = g.onednn && (m_dnnl || cpu.avx512 || avx2_only || blas.fallback);
    int ahead_tall = g.onednn && (m_dnnl || avx2_only || blas.fallback);
    g.nn = ahead ? "oneDNN" : "OpenBLAS";
    int tr[3] = {0, 0, 0};
    BG_CHECK(bg__gemm_transposes(avx2_only, cpu.avx512, ahead, tr));
    g.nt = bg__gemm_name(ahead, tr[0]);
    g.tn = bg__gemm_name(ahead, tr[1]);
    g.tn_tall = bg__gemm_name(ahead_tall, tr[2]);
    const char *bf_impl = NULL, *bf_why = NULL;
    if (bg__cpu_bf16mm_available(&bf_impl, &bf_why))
        g.bf16 = bf_impl;
    else
        g.bf16_why = bf_why;
    *info_p = g;
    tr_min_p[0] = 0;
    memcpy(tr_min_p + 1, tr, sizeof(tr));
    return BG_OK;
}

bg_status_t bg_gemm_info(bg_gemm_info_t *info_p)
{
    int tr_min[4];
    return bg__cpu_gemm_choice(info_p, tr_min);
}
