/**
 * @file cpu.h
 * @brief The machine's CPU (CPUID features) and the CPU backend's BLAS.
 *
 * The CPU backend loads OpenBLAS itself (dlopen) the first time a "cpu"
 * backend is created or bg_blas_info() is called, after choosing OpenBLAS's
 * kernel set ("core") from the CPU's features: OpenBLAS picks its core in its
 * constructor at load time, by CPU model, and falls back to generic SSE3
 * kernels on models it does not know (a third of the speed on a recent
 * Xeon). How the core is chosen, first match wins:
 *   1. OpenBLAS is already loaded in the process (the host linked or loaded
 *      it first): it is used as it is; bg_blas_info_t.fallback says whether
 *      its core is below the CPU (then set OPENBLAS_CORETYPE before the
 *      process starts, or create the backend before loading OpenBLAS).
 *   2. OPENBLAS_CORETYPE is set: OpenBLAS obeys it.
 *   3. BRIGADE_BLAS_CORE=openblas: OpenBLAS's own detection.
 *   4. BRIGADE_BLAS_CORE=NAME: that core; "auto" (the default): the core
 *      for the widest vector ISA the CPU and the OS support (AVX-512:
 *      SkylakeX; AVX2+FMA: Haswell, Zen on AMD; AVX: Sandybridge), capped
 *      by BRIGADE_CPU_ISA (bg_cpu_isa; default: Prescott, generic SSE3).
 * For 4, OPENBLAS_CORETYPE is set in the environment for the duration of the
 * dlopen only (setenv, then unsetenv): a process-wide change for a moment,
 * so no other thread should read or write the environment meanwhile.
 *
 * The backend may also run GEMMs through oneDNN's sgemm (libdnnl.so.2,
 * Debian's libdnnl2, loaded with dlopen when present: optional), chosen per
 * operand layout by BRIGADE_GEMM; bg_gemm_info() says which library runs
 * which layout, and why oneDNN is not used when it is not.
 *
 * Ownership and threads: the info structs are values the caller owns; their
 * strings are static. The functions may be called from any thread; the first
 * one to load OpenBLAS does so once (see above for the environment).
 *
 * Example:
 * @code
 *   bg_blas_info_t b;
 *   if (bg_blas_info(&b) == BG_OK)
 *       printf("%s, core %s%s\n", b.version, b.core, b.fallback ? " (below this CPU)" : "");
 * @endcode
 */
#ifndef BRIGADE_CPU_H
#define BRIGADE_CPU_H

#include "brigade/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** What CPUID (and XGETBV: the OS saves the registers) says about this CPU.
 *  All zero on a non-x86 machine. */
typedef struct bg_cpu_info {
    char vendor[16]; /**< "GenuineIntel", "AuthenticAMD", ... */
    char brand[64];  /**< the brand string, trimmed */
    int family;      /**< display family (base + extended) */
    int model;       /**< display model (base + extended) */
    int avx;         /**< AVX usable */
    int avx2_fma;    /**< AVX2 and FMA3 usable */
    int avx512;      /**< AVX-512 F, BW, DQ and VL usable */
    int amx;         /**< AMX tiles usable (bf16/int8 only; brigade's fp32 does not use them) */
    int vector_bits; /**< widest usable fp32 FMA vector: 512, 256, 128 (no FMA: SSE), 0 unknown */
} bg_cpu_info_t;

/** Fill @p info_p from CPUID. Never fails; cheap (a few CPUID instructions). */
void bg_cpu_info(bg_cpu_info_t *info_p);

/** The vector ISA of brigade's own CPU kernels: each kernel is compiled once
 *  per ISA and a "cpu" backend runs one set, chosen when it is created. */
typedef enum bg_cpu_isa {
    BG_CPU_ISA_DEFAULT = 0, /**< plain x86-64 (SSE2), or the only build on other machines */
    BG_CPU_ISA_AVX2 = 1,    /**< AVX2 + FMA (x86-64-v3: Haswell, Zen 1 and later) */
    BG_CPU_ISA_AVX512 = 2,  /**< AVX-512 F, BW, DQ, VL (x86-64-v4) */
} bg_cpu_isa_t;

/** The ISA a "cpu" backend created now runs: the widest this CPU (and the
 *  build) supports, capped by BRIGADE_CPU_ISA (auto|avx512|avx2|default, read
 *  at each call). The same cap chooses the BLAS's kernels when the BLAS is
 *  loaded (once per process: OpenBLAS's core, e.g. Haswell for avx2, and
 *  oneDNN's maximum ISA), so that an AVX-512 machine can measure what an
 *  AVX2-only one runs. Fails with BG_ERR_INVALID for an unknown value and
 *  BG_ERR_UNSUPPORTED, naming the CPU, for an ISA it cannot execute. */
bg_status_t bg_cpu_isa(bg_cpu_isa_t *isa_p);

/** "avx512", "avx2" or "default" (the names BRIGADE_CPU_ISA takes). */
const char *bg_cpu_isa_name(bg_cpu_isa_t isa);

/** The CBLAS constants bg_blas_sgemm_fn takes (the values of every cblas.h). */
enum { BG_CBLAS_ROW_MAJOR = 101, BG_CBLAS_COL_MAJOR = 102, BG_CBLAS_NO_TRANS = 111, BG_CBLAS_TRANS = 112 };

/** CBLAS sgemm: order, transposes as above. */
typedef void (*bg_blas_sgemm_fn)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);

/** The BLAS the CPU backend uses, once loaded. Strings live as long as the process. */
typedef struct bg_blas_info {
    const char *library;  /**< "OpenBLAS" */
    const char *path;     /**< the file loaded (dlopen's name for it) */
    const char *version;  /**< the library's own build string (openblas_get_config) */
    const char *core;     /**< kernel set in use (openblas_get_corename) */
    const char *chosen_by; /**< "preloaded", "OPENBLAS_CORETYPE", "openblas" (its own detection),
                                "BRIGADE_BLAS_CORE", "cpuid" (brigade, from the CPU's features)
                                or "BRIGADE_CPU_ISA" (from the features that variable leaves) */
    int fallback;         /**< 1: the core uses a narrower vector ISA than the CPU supports */
    bg_blas_sgemm_fn sgemm;           /**< cblas_sgemm of that library */
    void (*set_num_threads)(int n);   /**< openblas_set_num_threads (process-wide) */
    int (*get_num_threads)(void);     /**< openblas_get_num_threads */
} bg_blas_info_t;

/** Load the BLAS if not yet loaded (once per process, thread-safe) and
 *  describe it. Fails with BG_ERR_NOT_FOUND naming the library when it
 *  cannot be loaded. */
bg_status_t bg_blas_info(bg_blas_info_t *info_p);

/** oneDNN's dnnl_sgemm: row-major, transposes 'N' or 'T', 64-bit sizes;
 *  returns 0 (dnnl_success) or a oneDNN error status. */
typedef int (*bg_dnnl_sgemm_fn)(char transa, char transb, long long m, long long n, long long k, float alpha,
                                const float *a, long long lda, const float *b, long long ldb, float beta, float *c,
                                long long ldc);

/** Which library runs the CPU backend's GEMMs, per operand layout, under the
 *  current BRIGADE_GEMM and BRIGADE_GEMM_TRANSPOSE (read at each call; a backend reads it when
 *  created). Strings live as long as the process. */
typedef struct bg_gemm_info {
    const char *mode;           /**< BRIGADE_GEMM: "auto", "openblas" or "onednn" */
    int onednn;                 /**< 1: oneDNN is loaded and usable */
    const char *onednn_version; /**< "2.6.3" when onednn, else NULL */
    const char *onednn_path;    /**< the file loaded when onednn, else NULL */
    const char *onednn_why;     /**< when not onednn: why (not installed, its threading runtime, ...) */
    const char *nn;             /**< C = A B: "oneDNN" or "OpenBLAS" */
    const char *nt;             /**< C = A B^T (forward of a linear layer); this and the next two may read
                                     "oneDNN after transpose" (or "... after transpose where m, n, k >= 256":
                                     only such products; BRIGADE_GEMM_TRANSPOSE): the transposed operand is
                                     copied and the library runs A B */
    const char *tn;             /**< C = A^T B and A^T B^T (weight gradients), m <= n */
    const char *tn_tall;        /**< the same with m > n (more rows than columns) */
    bg_dnnl_sgemm_fn dnnl_sgemm; /**< when onednn: oneDNN's sgemm on the calling thread only, its
                                      asynchronous signals held meanwhile (the backend's own calls skip
                                      this wrapper and hold them too); else NULL */
    const char *bf16;            /**< GEMMs of a backend made with precision bf16: oneDNN's bf16 matmul
                                      implementation ("brg:avx512_core_amx_bf16": inputs rounded to bf16, fp32
                                      accumulation), or NULL: they stay fp32 (see bf16_why) */
    const char *bf16_why;        /**< when bf16 is NULL: why */
} bg_gemm_info_t;

/** Load OpenBLAS and (when present) oneDNN, once per process, and say which
 *  runs which GEMM layout. Fails with BG_ERR_INVALID for an unknown
 *  BRIGADE_GEMM, and BG_ERR_NOT_FOUND when BRIGADE_GEMM=onednn and oneDNN
 *  cannot be used (or OpenBLAS cannot be loaded). */
bg_status_t bg_gemm_info(bg_gemm_info_t *info_p);

#ifdef __cplusplus
}
#endif
#endif /* BRIGADE_CPU_H */
