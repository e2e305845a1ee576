/* core/util.c: small pure helpers the library shares with the CLI (tools/
 * links this file again, as bg_cli_util, since libbrigade.so exports only the
 * public API): the median used for every timing figure (training steps,
 * benchmarks, the planner's measurements, the trace replay) and the parser of
 * byte sizes (BRIGADE_* values, --memory flags). Must not: log, allocate, or
 * use anything of brigade beyond core/util.h. */
#include <errno.h>
#include <stdlib.h>

#include "core/util.h"

static int bg__cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bg_median(double *v, size_t n)
{
    if (n == 0)
        return 0.0;
    qsort(v, n, sizeof(double), bg__cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int bg_parse_bytes(const char *s, uint64_t *bytes_p)
{
    if (!s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; break;
        case 'm': case 'M': mul = 1024.0 * 1024; break;
        case 'g': case 'G': mul = 1024.0 * 1024 * 1024; break;
        case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
        default: mul = -1;
        }
        end++;
        if (*end == 'i' || *end == 'B')
            end++;
        if (*end == 'B')
            end++;
    }
    if (errno || end == s || *end || mul < 0 || !(v > 0))
        return -1;
    *bytes_p = (uint64_t)(v * mul);
    return 0;
}

uint64_t bg__fnv1a_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}
