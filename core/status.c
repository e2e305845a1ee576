/* core/status.c: status strings and the per-thread last-error message. */
#include "brigade/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char bg__last_error[2048]; /* room for a peer's forwarded message and its prefixes */

const char *bg_status_string(bg_status_t st)
{
    switch (st) {
#define BG__STATUS_CASE(name, value, desc) case BG_##name: return desc;
        BG_STATUS_MAP(BG__STATUS_CASE)
#undef BG__STATUS_CASE
    }
    return "unknown status";
}

const char *bg_last_error(void) { return bg__last_error; }

void bg_error_clear(void) { bg__last_error[0] = '\0'; }

bg_status_t bg_error(bg_status_t st, const char *fmt, ...)
{
    /* format into a copy first: callers pass bg_last_error() as an argument
     * ("%s: %s", where, bg_last_error()), which is this very buffer */
    char msg[sizeof(bg__last_error)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    memcpy(bg__last_error, msg, sizeof(msg));
    return st;
}
