/* core/check.h: status-propagation macros used inside the library.
 * BG_CHECK returns the failing status; BG_CHECK_GOTO jumps to a cleanup label.
 * Both log the failing call with file:line at debug level. */
#ifndef BG_CORE_CHECK_H
#define BG_CORE_CHECK_H

#include "brigade/status.h"
#include "core/log.h"

#define BG_CHECK(call)                                                          \
    do {                                                                        \
        bg_status_t bg__st = (call);                                            \
        if (bg__st < 0) {                                                       \
            bg_log(BG_LOG_DEBUG, "check", "%s:%d: %s -> %s", __FILE__,          \
                   __LINE__, #call, bg_status_string(bg__st));                  \
            return bg__st;                                                      \
        }                                                                       \
    } while (0)

#define BG_CHECK_GOTO(call, st, label)                                          \
    do {                                                                        \
        (st) = (call);                                                          \
        if ((st) < 0) {                                                         \
            bg_log(BG_LOG_DEBUG, "check", "%s:%d: %s -> %s", __FILE__,          \
                   __LINE__, #call, bg_status_string(st));                      \
            goto label;                                                         \
        }                                                                       \
    } while (0)

/* Allocation that records an out-of-memory error with the size and purpose. */
#define BG_ALLOC_CHECK(ptr, bytes, what)                                        \
    do {                                                                        \
        if ((ptr) == NULL)                                                      \
            return bg_error(BG_ERR_NOMEM, "cannot allocate %zu bytes for %s",   \
                            (size_t)(bytes), (what));                           \
    } while (0)

#define BG_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
