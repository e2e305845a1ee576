/**
 * @file status.h
 * @brief One status enum for the whole library, and the per-thread error message.
 *
 * Every public function returns a bg_status_t: 0 is success, negative values
 * are errors. The message that says what went wrong and where (rank, stage,
 * layer, sizes) is kept per thread and read with bg_last_error().
 *
 * Ownership and threads: bg_last_error() returns the calling thread's own
 * buffer (valid until that thread's next failing call; never free it);
 * bg_status_string() returns a static string. Both may be called from any
 * thread at any time.
 */
#ifndef BRIGADE_STATUS_H
#define BRIGADE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/** X(name, value, description): the enum and the strings come from this list. */
#define BG_STATUS_MAP(X)                                                        \
    X(OK,              0,  "ok")                                                \
    X(ERR_INVALID,    -1,  "invalid argument")                                  \
    X(ERR_NOMEM,      -2,  "out of memory")                                     \
    X(ERR_IO,         -3,  "I/O error")                                         \
    X(ERR_PARSE,      -4,  "malformed input")                                   \
    X(ERR_UNSUPPORTED,-5,  "not supported")                                     \
    X(ERR_NOT_FOUND,  -6,  "not found")                                         \
    X(ERR_TIMEOUT,    -7,  "timed out")                                         \
    X(ERR_PEER,       -8,  "peer failed")                                       \
    X(ERR_TRANSPORT,  -9,  "transport error")                                   \
    X(ERR_CANCELED,   -10, "canceled")                                          \
    X(ERR_NO_FIT,     -11, "does not fit in memory")                            \
    X(ERR_DEADLOCK,   -12, "schedule would deadlock")                           \
    X(ERR_MISMATCH,   -13, "mismatch")                                          \
    X(ERR_DEVICE,     -14, "device error")                                      \
    X(ERR_INTERNAL,   -15, "internal error")                                    \
    X(IN_PROGRESS,     1,  "in progress")

/** The status every call returns: BG_OK (0), an error (< 0), or BG_IN_PROGRESS (1). */
typedef enum bg_status {
#define BG__STATUS_ENUM(name, value, desc) BG_##name = (value),
    BG_STATUS_MAP(BG__STATUS_ENUM)
#undef BG__STATUS_ENUM
} bg_status_t;

/** Short constant description of a status ("invalid argument"). Never NULL. */
const char *bg_status_string(bg_status_t st);

/** The message of the last error set on this thread ("" when none). */
const char *bg_last_error(void);

/**
 * Record an error message for this thread and return @p st, so that code can
 * write `return bg_error(BG_ERR_INVALID, "heads (%d) must divide d_model (%d)", h, c);`.
 * User-written layers and backends use it too.
 */
bg_status_t bg_error(bg_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/** Clear this thread's error message. */
void bg_error_clear(void);

#ifdef __cplusplus
}
#endif
#endif /* BRIGADE_STATUS_H */
