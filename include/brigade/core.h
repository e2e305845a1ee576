/**
 * @file core.h
 * @brief Logging, the BRIGADE_* configuration table, and the version.
 *
 * Configuration: every environment variable brigade reads is declared once in
 * a table {name, default, help} (core/config.c) and read through
 * bg_config_str()/bg_config_int()/bg_config_double(); `brigade info` prints it.
 *
 * Logging: BRIGADE_LOG=error|warn|info|debug|trace picks the level; each line
 * is prefixed with the rank set by bg_log_set_rank() and the subsystem. A host
 * program can take the messages instead (bg_log_set_sink); brigade then writes
 * nothing to stderr or stdout.
 *
 * A guest in a host program: brigade changes no process-wide setting unless a
 * params field asks for it (bg_backend_params_t.set_blas_threads and
 * .tune_malloc, bg_comm_params_t.ucx_log_handler). docs/architecture.md,
 * "Process-wide state", lists the state the library itself keeps.
 *
 * Ownership and threads: every function here may be called from any thread
 * concurrently; the log level, rank and sink are process-wide (the sink is
 * called by one thread at a time, see bg_log_set_sink). Strings returned
 * (bg_version, bg_config_str, the config table) are static or the
 * environment's: never free them. A bg_rng_t is a value the caller owns; one
 * generator must not be used by two threads at once. bg_config_str reads the
 * environment: no thread may setenv meanwhile.
 */
#ifndef BRIGADE_CORE_H
#define BRIGADE_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "brigade/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The version: the one place it is written. CMakeLists.txt reads these three
 * lines for project(VERSION), the shared library's SONAME (libbrigade.so.MAJOR)
 * and the installed package's version files. */
#define BRIGADE_VERSION_MAJOR 0
#define BRIGADE_VERSION_MINOR 1
#define BRIGADE_VERSION_PATCH 0

#define BG__VERSION_STR_(x) #x
#define BG__VERSION_STR(x) BG__VERSION_STR_(x)
/** "MAJOR.MINOR.PATCH" of the headers, a string literal. */
#define BRIGADE_VERSION_STRING                                                 \
    BG__VERSION_STR(BRIGADE_VERSION_MAJOR) "." BG__VERSION_STR(BRIGADE_VERSION_MINOR) "." \
    BG__VERSION_STR(BRIGADE_VERSION_PATCH)
/** MAJOR * 10000 + MINOR * 100 + PATCH of the headers, for #if. */
#define BRIGADE_VERSION                                                        \
    (BRIGADE_VERSION_MAJOR * 10000 + BRIGADE_VERSION_MINOR * 100 + BRIGADE_VERSION_PATCH)

/** Version of the library actually linked ("MAJOR.MINOR.PATCH"); compare with
 *  BRIGADE_VERSION_STRING to catch headers and a shared library that differ. */
const char *bg_version(void);

/** Element types: of stored tensors (bg_layer_set_precision, where arithmetic
 *  is fp32 and bf16 is a storage format: 1 sign, 8 exponent, 7 mantissa bits,
 *  the top half of an fp32) and of the transport's collectives (every type;
 *  BG_U8 only where nothing is reduced: all-gather, broadcast). */
typedef enum bg_dtype {
    BG_F32 = 0,  /**< IEEE binary32 */
    BG_BF16 = 1, /**< bfloat16 */
    BG_F64 = 2,  /**< IEEE binary64 */
    BG_I32 = 3,  /**< int32_t */
    BG_I64 = 4,  /**< int64_t */
    BG_U8 = 5,   /**< uint8_t: raw bytes (all-gather and broadcast of structs) */
} bg_dtype_t;
/** Bytes of one element of @p t (0 for a value outside the enum). */
static inline size_t bg_dtype_size(bg_dtype_t t)
{
    return t == BG_F32 || t == BG_I32 ? 4 : t == BG_F64 || t == BG_I64 ? 8 : t == BG_BF16 ? 2 : t == BG_U8 ? 1 : 0;
}
/** "fp32", "bf16" (the spellings of --precision), "fp64", "int32", "int64", "uint8"; "?" otherwise. */
static inline const char *bg_dtype_name(bg_dtype_t t)
{
    return t == BG_F32 ? "fp32" : t == BG_BF16 ? "bf16" : t == BG_F64 ? "fp64" : t == BG_I32 ? "int32"
         : t == BG_I64 ? "int64" : t == BG_U8 ? "uint8" : "?";
}

/** Log levels, from the most to the least severe (BRIGADE_LOG picks one). */
typedef enum bg_log_level {
    BG_LOG_ERROR = 0,
    BG_LOG_WARN = 1,
    BG_LOG_INFO = 2,
    BG_LOG_DEBUG = 3,
    BG_LOG_TRACE = 4,
} bg_log_level_t;

/** Log a line at @p level for @p subsys ("kernels", "ucx", ...): to the sink
 *  when one is set, else to stderr. */
void bg_log(bg_log_level_t level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/** True when a message at @p level would be logged (BRIGADE_LOG). */
int bg_log_enabled(bg_log_level_t level);
/** Rank shown in every log line and passed to the sink (-1: none). Process-wide;
 *  bg_comm_create sets it to the communicator's rank. */
void bg_log_set_rank(int rank);

/**
 * A log sink: receives each message that passes the level (BRIGADE_LOG).
 * @p subsystem is "kernels", "transport", "ucx", ...; @p rank is the one set by
 * bg_log_set_rank (-1: none); @p message is the formatted text without prefix
 * or newline. Both strings are valid only during the call.
 *
 * Contract: the sink may be called from any thread that calls brigade and from
 * brigade's own threads (a communicator's progress thread), but never by two
 * threads at once (calls are serialised). It must not call back into brigade
 * (any bg_* function, bg_log_set_sink included: that deadlocks) and should
 * return quickly, since the calling thread, possibly the progress thread,
 * waits for it.
 */
typedef void (*bg_log_fn)(bg_log_level_t level, const char *subsystem, int rank, const char *message,
                          void *arg);
/** Send log messages to @p fn with @p arg; NULL restores the default stderr
 *  writer. While a sink is set brigade writes nothing to stderr or stdout.
 *  Process-wide. When this returns no call to the previous sink is running,
 *  so the previous @p arg may be freed. */
void bg_log_set_sink(bg_log_fn fn, void *arg);

/** One entry of the configuration table. */
typedef struct bg_config_var {
    const char *name;  /**< environment variable, always BRIGADE_... */
    const char *dflt;  /**< default value as text ("" = unset) */
    const char *help;  /**< one line */
} bg_config_var_t;

/** The table: *count_p entries. */
const bg_config_var_t *bg_config_table(size_t *count_p);
/** Value of a declared variable: the environment's, else the default.
 *  Reading an undeclared name is a programming error and returns NULL. */
const char *bg_config_str(const char *name);
/** Integer value; a malformed value is an error naming the variable. */
bg_status_t bg_config_int(const char *name, long long *value_p);
/** Floating-point value; a malformed value is an error naming the variable. */
bg_status_t bg_config_double(const char *name, double *value_p);
/** A switch: *on_p = 1 for "on", 0 for "off"; anything else is an error naming
 *  the variable and its value ("expected on or off"), *on_p left as it was. */
bg_status_t bg_config_on(const char *name, int *on_p);

/** Deterministic random numbers (xoshiro256**), a small value type. */
typedef struct bg_rng {
    uint64_t s[4];
} bg_rng_t;

/** Seed a generator; the same seed gives the same stream on every machine. */
void bg_rng_seed(bg_rng_t *rng, uint64_t seed);
/** Next 64 random bits. */
uint64_t bg_rng_u64(bg_rng_t *rng);
/** Uniform in [0, 1). */
double bg_rng_uniform(bg_rng_t *rng);
/** Standard normal (Box-Muller, no cached second value, so streams stay simple). */
double bg_rng_normal(bg_rng_t *rng);
/** Uniform integer in [0, n). n > 0. */
uint64_t bg_rng_below(bg_rng_t *rng, uint64_t n);

/** Monotonic wall clock in seconds. */
double bg_now(void);

#ifdef __cplusplus
}
#endif
#endif /* BRIGADE_CORE_H */
