/* tests/transport/ranks.c: the forked multi-rank driver (see ranks.h). */
#include "ranks.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <execinfo.h>

#include "brigade/core.h"

int bgt_rank = -1;

/* A crashing rank prints its stack (addr2line-able) and dies of the signal. */
static void bgt_crash(int sig)
{
    void *f[64];
    int n = backtrace(f, 64);
    char msg[64];
    int len = snprintf(msg, sizeof(msg), "rank %d: signal %d, stack:\n", bgt_rank, sig);
    ssize_t w = write(2, msg, (size_t)len);
    (void)w;
    backtrace_symbols_fd(f, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* A port outside the kernel's ephemeral range (so no outgoing connection can
 * take it between this check and rank 0's bind), free right now. */
static int bgt_free_port(void)
{
    static unsigned calls;
    for (unsigned attempt = 0; attempt < 200; attempt++) {
        int port = 20000 + (int)(((unsigned)getpid() * 131u + (calls++) * 977u + attempt * 7919u) % 12000u);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        if (fd >= 0)
            close(fd);
        if (ok)
            return port;
    }
    return 29000 + (int)(getpid() % 1000);
}

int bgt_run_ranks(int world, bgt_rank_fn fn, void *arg, double timeout_s, const char *const *env,
                  int skip_rank, bgt_result_t *res)
{
    memset(res, 0, sizeof(*res));
    pid_t pids[16] = {0};
    if (world > 16)
        return -1;
    char port[16], token[32], ws[16];
    snprintf(port, sizeof(port), "%d", bgt_free_port());
    snprintf(token, sizeof(token), "tok%08x", (unsigned)(getpid() * 2654435761u) ^ (unsigned)time(NULL));
    snprintf(ws, sizeof(ws), "%d", world);
    fflush(stdout);
    fflush(stderr);
    double t0 = bg_now();
    for (int r = 0; r < world; r++) {
        if (r == skip_rank)
            continue;
        pid_t p = fork();
        if (p == 0) {
            /* cmocka's handlers would longjmp a crashing child back into the test runner */
            const int sigs[] = {SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE};
            for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
                signal(sigs[i], bgt_crash);
            char rs[16];
            snprintf(rs, sizeof(rs), "%d", r);
            setenv("BRIGADE_RANK", rs, 1);
            setenv("BRIGADE_LOCAL_RANK", rs, 1);
            setenv("BRIGADE_WORLD_SIZE", ws, 1);
            setenv("BRIGADE_MASTER_ADDR", "127.0.0.1", 1);
            setenv("BRIGADE_MASTER_PORT", port, 1);
            setenv("BRIGADE_JOB_TOKEN", token, 1);
            for (int i = 0; env && env[i]; i++)
                putenv((char *)env[i]);
            bgt_rank = r;
            int rc = fn(r, world, arg);
            fflush(stdout);
            fflush(stderr);
            _exit(rc);
        }
        pids[r] = p;
    }
    int left = 0;
    for (int r = 0; r < world; r++)
        left += pids[r] > 0;
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < world; r++)
                if (pids[r] == p) {
                    res->status[r] = st;
                    res->exit_s[r] = bg_now() - t0;
                    pids[r] = 0;
                    left--;
                }
            continue;
        }
        if (bg_now() - t0 > timeout_s) {
            res->timed_out = 1;
            for (int r = 0; r < world; r++)
                if (pids[r] > 0) {
                    fprintf(stderr, "ranks: rank %d still running after %.0f s: killed\n", r, timeout_s);
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                    res->status[r] = -1;
                    pids[r] = 0;
                }
            break;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    res->elapsed = bg_now() - t0;
    int bad = res->timed_out;
    for (int r = 0; r < world; r++) {
        if (r == skip_rank)
            continue;
        if (res->status[r] != 0) {
            bad = 1;
            if (res->status[r] > 0 && WIFSIGNALED(res->status[r]))
                fprintf(stderr, "ranks: rank %d killed by signal %d\n", r, WTERMSIG(res->status[r]));
            else if (res->status[r] > 0)
                fprintf(stderr, "ranks: rank %d exited with %d\n", r, WEXITSTATUS(res->status[r]));
        }
    }
    return bad ? 1 : 0;
}
