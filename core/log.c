/* core/log.c: leveled logging to stderr with rank and subsystem prefixes.
 * The only place in the library that prints. */
#include "brigade/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static int bg__log_level = -1; /* resolved from BRIGADE_LOG on first use */
static int bg__log_rank = -1;

static int bg__level(void)
{
    if (bg__log_level < 0) {
        const char *s = bg_config_str("BRIGADE_LOG");
        static const char *names[] = {"error", "warn", "info", "debug", "trace"};
        int lvl = BG_LOG_WARN;
        for (int i = 0; s && i < 5; i++)
            if (strcasecmp(s, names[i]) == 0)
                lvl = i;
        bg__log_level = lvl;
    }
    return bg__log_level;
}

int bg_log_enabled(bg_log_level_t level) { return (int)level <= bg__level(); }

void bg_log_set_rank(int rank) { bg__log_rank = rank; }

void bg_log(bg_log_level_t level, const char *subsys, const char *fmt, ...)
{
    if (!bg_log_enabled(level))
        return;
    static const char *tags[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};
    char line[2048];
    int off;
    if (bg__log_rank >= 0)
        off = snprintf(line, sizeof(line), "[brigade r%d %s %s] ", bg__log_rank,
                       tags[level], subsys);
    else
        off = snprintf(line, sizeof(line), "[brigade %s %s] ", tags[level], subsys);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + off, sizeof(line) - (size_t)off, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
