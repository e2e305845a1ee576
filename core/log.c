/* core/log.c: leveled logging with rank and subsystem, to stderr or to the
 * host's sink (bg_log_set_sink). The only place in the library that prints,
 * and it prints nothing while a sink is set.
 *
 * Process-wide state (docs/architecture.md, "Process-wide state"): the level
 * (resolved once from BRIGADE_LOG), the rank shown in each line, and the sink.
 * The level and rank are atomics; the sink and its argument are read and
 * called under one mutex, so calls to a sink never overlap and
 * bg_log_set_sink returns only once no call to the previous sink is running. */
#include "brigade/core.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static atomic_int bg__log_level = -1; /* resolved from BRIGADE_LOG on first use */
static atomic_int bg__log_rank = -1;

static pthread_mutex_t bg__sink_lock = PTHREAD_MUTEX_INITIALIZER;
static bg_log_fn bg__sink;     /* NULL: the stderr writer; guarded by bg__sink_lock */
static void *bg__sink_arg;     /* guarded by bg__sink_lock */

static int bg__level(void)
{
    int lvl = atomic_load_explicit(&bg__log_level, memory_order_relaxed);
    if (lvl < 0) {
        /* two threads may both resolve it; they store the same value */
        static const char *const names[] = {"error", "warn", "info", "debug", "trace"};
        const char *s = bg_config_str("BRIGADE_LOG");
        lvl = BG_LOG_WARN;
        for (int i = 0; s && i < 5; i++)
            if (strcasecmp(s, names[i]) == 0)
                lvl = i;
        atomic_store_explicit(&bg__log_level, lvl, memory_order_relaxed);
    }
    return lvl;
}

int bg_log_enabled(bg_log_level_t level) { return (int)level <= bg__level(); }

void bg_log_set_rank(int rank) { atomic_store_explicit(&bg__log_rank, rank, memory_order_relaxed); }

void bg_log_set_sink(bg_log_fn fn, void *arg)
{
    pthread_mutex_lock(&bg__sink_lock);
    bg__sink = fn;
    bg__sink_arg = arg;
    pthread_mutex_unlock(&bg__sink_lock);
}

void bg_log(bg_log_level_t level, const char *subsys, const char *fmt, ...)
{
    if (!bg_log_enabled(level))
        return;
    static const char *const tags[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};
    int rank = atomic_load_explicit(&bg__log_rank, memory_order_relaxed);
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&bg__sink_lock);
    if (bg__sink) {
        bg__sink(level, subsys, rank, msg, bg__sink_arg);
    } else if (rank >= 0) {
        fprintf(stderr, "[brigade r%d %s %s] %s\n", rank, tags[level], subsys, msg);
    } else {
        fprintf(stderr, "[brigade %s %s] %s\n", tags[level], subsys, msg);
    }
    pthread_mutex_unlock(&bg__sink_lock);
}
