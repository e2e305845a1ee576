/* tests/transport/ranks.h: run a function as N ranks in forked processes with
 * the BRIGADE_* bootstrap variables set (fresh port and token), as
 * `brigade launch` would, with a hard timeout after which every rank is
 * killed. Children report failures on stderr and through their exit code. */
#ifndef BG_TESTS_TRANSPORT_RANKS_H
#define BG_TESTS_TRANSPORT_RANKS_H

#include <stdio.h>

typedef int (*bgt_rank_fn)(int rank, int world, void *arg);

typedef struct bgt_result {
    int status[16];  /* waitpid status of each rank (-1: killed by the timeout) */
    double elapsed;  /* seconds until the last rank exited */
    double exit_s[16]; /* seconds at which each rank exited */
    int timed_out;
} bgt_result_t;

/* Run fn as @p world ranks. @p env: extra "NAME=value" strings (NULL-terminated
 * array or NULL). @p skip_rank: a rank not started at all (-1: none). Returns 0
 * when every started rank exited with status 0 before the timeout. */
int bgt_run_ranks(int world, bgt_rank_fn fn, void *arg, double timeout_s, const char *const *env,
                  int skip_rank, bgt_result_t *res);

/* For use inside a rank: report and return 1 from the rank function. */
#define RK_CHECK(cond, ...)                                                              \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", bgt_rank, __FILE__,    \
                    __LINE__, #cond);                                                    \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, "\n");                                                       \
            return 1;                                                                    \
        }                                                                                \
    } while (0)
#define RK_OK(call)                                                                      \
    do {                                                                                 \
        bg_status_t rk__st = (call);                                                     \
        RK_CHECK(rk__st == BG_OK, "%s -> %s: %s", #call, bg_status_string(rk__st),       \
                 bg_last_error());                                                       \
    } while (0)

extern int bgt_rank;

#endif
