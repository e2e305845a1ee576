/* core/stats.c: the median used for every timing figure (training steps,
 * benchmarks, the planner's measurements, the trace replay). */
#include <stdlib.h>

#include "brigade/core.h"

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
