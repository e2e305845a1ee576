/* tools/cmd_launch.c: `brigade launch -n N [options] -- CMD ARGS...` starts N
 * ranks of a job on this machine and supervises them.
 *
 * Owns: option parsing, the per-rank environment (BRIGADE_RANK, _WORLD_SIZE,
 * _LOCAL_RANK, _MASTER_ADDR, _MASTER_PORT, _JOB_TOKEN, _RESTART_COUNT), fork +
 * execvpe, the supervision loop (reaping, failure propagation, signal
 * forwarding, grace period, job timeout), --tag-output line forwarding, and
 * --max-restarts (after a rank failure, stop everything and start the whole
 * job again with a new token and port; a signal to the launcher never restarts),
 * and the exit deadline: once any rank has exited, the others must exit within
 * --exit-timeout (from BRIGADE_TIMEOUT) or are killed, so a rank that hangs or
 * was stopped (SIGSTOP, reported through WUNTRACED) never makes the launcher
 * wait forever.
 * Must not: talk to the ranks' rendezvous store or know anything of the
 * transport; it only sets variables the transport reads.
 *
 * Process groups: every rank is made the leader of its own process group, and
 * the launcher signals whole groups (kill(-pgid)). A terminal's Ctrl-C thus
 * reaches only the launcher (the foreground group), which turns it into one
 * orderly stop: SIGTERM to every rank's group, SIGKILL after the grace
 * period. That gives the same semantics for Ctrl-C, `kill`, and a CI timeout,
 * and it reaches whatever a rank started itself (shell wrappers, data-loader
 * workers). Ranks get /dev/null as stdin, so being in a background group
 * never stops them on a terminal read. PR_SET_PDEATHSIG(SIGKILL) in every
 * rank covers a launcher that dies without a chance to clean up.
 *
 * The loop is single-threaded: signals are blocked and read from a signalfd,
 * polled together with the ranks' output pipes.
 *
 * This file is the entry point and the loop: the ranks' environment, the
 * signal set-up, the attempts and their poll loop. The options are parsed in
 * launch_opts.c, the ranks' output forwarded by launch_output.c, and the
 * events the loop sees (a rank's start, exit or stop, a signal, a deadline)
 * handled in launch_supervise.c; which hosts an attempt runs on and how a
 * rank is started there (--hosts, --rsh, --elastic) in launch_hosts.c;
 * launch_impl.h holds what they share. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/cli.h"
#include "tools/launch_impl.h"

extern char **environ;

/* ---------------------------------------------------------------- nohup */

/* Whether SIGHUP was ignored when the program started (nohup). Libraries
 * libbrigade links install handlers in their constructors (libucs catches
 * SIGHUP for UCX_DEBUG_SIGNO), so by main() the inherited disposition is gone.
 * A .preinit_array entry of the executable runs before any shared library's
 * constructor, and records it. -1: not recorded (assume not ignored). */
static int launch_hup_ignored = -1;

static void launch_preinit(int argc, char **argv, char **envp)
{
    (void)argc;
    (void)argv;
    (void)envp;
    struct sigaction old;
    if (sigaction(SIGHUP, NULL, &old) == 0)
        launch_hup_ignored = old.sa_handler == SIG_IGN;
}

__attribute__((section(".preinit_array"), used)) static void (*const launch_preinit_p)(int, char **, char **) =
    launch_preinit;

/* ---------------------------------------------------------------- the ranks' environment */

static const char *const launch_set_vars[] = {"BRIGADE_RANK", "BRIGADE_WORLD_SIZE", "BRIGADE_LOCAL_RANK",
                                              "BRIGADE_MASTER_ADDR", "BRIGADE_MASTER_PORT", "BRIGADE_JOB_TOKEN",
                                              "BRIGADE_RESTART_COUNT"};
#define LAUNCH_NVARS (sizeof launch_set_vars / sizeof launch_set_vars[0])

static bool launch_is_set_var(const char *kv)
{
    for (size_t i = 0; i < LAUNCH_NVARS; i++) {
        size_t k = strlen(launch_set_vars[i]);
        if (!strncmp(kv, launch_set_vars[i], k) && kv[k] == '=')
            return true;
    }
    return false;
}

/* ---------------------------------------------------------------- main */

int bg_cmd_launch(int argc, char **argv)
{
    launch_t L;
    memset(&L, 0, sizeof L);
    L.sfd = -1;
    int rc = launch_parse(argc, argv, &L.o);
    if (rc != 0) {
        free(L.o.tolerated);
        return rc < 0 ? 0 : rc;
    }

    /* a closed stdin/stdout/stderr would be reused by our pipes: fill it */
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && open("/dev/null", O_RDWR) != fd) {
            fprintf(stderr, "brigade launch: cannot open /dev/null: %s\n", strerror(errno));
            return 1;
        }

    int port = L.o.port;
    if (!port && bg_cli_free_port(&port) != 0) {
        fprintf(stderr, "brigade launch: cannot find a free port on 127.0.0.1: %s (give one with --master-port)\n",
                strerror(errno));
        return 1;
    }
    char token[BG_CLI_TOKEN_CHARS + 1];
    if (bg_cli_job_token(token, sizeof token) != 0) {
        fprintf(stderr, "brigade launch: cannot read a job token from /dev/urandom: %s\n", strerror(errno));
        return 1;
    }

    /* N ranks share this machine's cores: unless the user chose, each rank's
     * OpenMP gets its share (torchrun does the same), so compute threads of
     * different ranks do not oversubscribe the cores and spin against each other. */
    if (!getenv("OMP_NUM_THREADS")) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        char nt[32];
        snprintf(nt, sizeof nt, "%ld", ncpu > L.o.n ? ncpu / L.o.n : 1);
        setenv("OMP_NUM_THREADS", nt, 1);
    }

    /* the ranks' environment: ours minus the launcher's variables, then those */
    size_t nenv = 0;
    while (environ[nenv])
        nenv++;
    char **envp = calloc(nenv + LAUNCH_NVARS + 1, sizeof *envp);
    char vars[LAUNCH_NVARS][512];
    L.max_n = L.o.n; /* with --hosts, every host's ranks: an attempt starts these or fewer */
    L.ranks = calloc((size_t)L.max_n, sizeof *L.ranks);
    L.used = calloc((size_t)L.o.nhosts + 1, sizeof *L.used);
    if (!envp || !L.ranks || !L.used) {
        fprintf(stderr, "brigade launch: out of memory\n");
        free(envp);
        free(L.ranks);
        free(L.used);
        return 1;
    }
    size_t ne = 0;
    for (size_t i = 0; i < nenv; i++)
        if (!launch_is_set_var(environ[i]))
            envp[ne++] = environ[i];
    for (size_t i = 0; i < LAUNCH_NVARS; i++)
        envp[ne + i] = vars[i];
    snprintf(vars[4], sizeof vars[4], "BRIGADE_MASTER_PORT=%d", port);
    snprintf(vars[5], sizeof vars[5], "BRIGADE_JOB_TOKEN=%s", token);
    snprintf(vars[6], sizeof vars[6], "BRIGADE_RESTART_COUNT=0");

    for (int r = 0; r < L.max_n; r++)
        for (int k = 0; k < 2; k++)
            L.ranks[r].io[k].fd = -1;
    if (L.o.tag) {
        for (int r = 0; r < L.max_n; r++)
            for (int k = 0; k < 2; k++)
                if (!(L.ranks[r].io[k].buf = malloc(LAUNCH_LINE_MAX))) {
                    fprintf(stderr, "brigade launch: out of memory\n");
                    rc = 1;
                    goto out_free;
                }
        /* two pipes per rank: make room if the soft open-file limit is low */
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max &&
            rl.rlim_cur < (rlim_t)(2 * L.max_n + 64)) {
            rl.rlim_cur = rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
    }

    /* signals: block and read them from a signalfd; the ranks get the old state back */
    launch_saved_sig_t saved[] = {{.sig = SIGINT},  {.sig = SIGTERM}, {.sig = SIGQUIT}, {.sig = SIGHUP},
                                  {.sig = SIGCHLD}, {.sig = SIGPIPE}, {.sig = SIGTSTP}};
    size_t nsaved = sizeof saved / sizeof saved[0];
    sigset_t mask, oldmask;
    sigemptyset(&mask);
    for (size_t k = 0; k < nsaved; k++) {
        int sig = saved[k].sig;
        sigaction(sig, NULL, &saved[k].old);
        bool ignored = saved[k].old.sa_handler == SIG_IGN;
        if (sig == SIGHUP && launch_hup_ignored == 1 && !ignored) {
            /* nohup'ed, then a library took SIGHUP over: ignore it again, here and in the ranks */
            saved[k].old.sa_handler = SIG_IGN;
            saved[k].old.sa_flags = 0;
            sigaction(sig, &saved[k].old, NULL);
            ignored = true;
        }
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sigemptyset(&sa.sa_mask);
        if (sig == SIGPIPE) {
            sa.sa_handler = SIG_IGN; /* a closed stdout must not kill the launcher */
        } else if (sig == SIGHUP && ignored) {
            continue; /* under nohup: keep ignoring hang-ups */
        } else {
            /* a background job of a script starts with SIGINT ignored, yet
             * `kill -INT` must stop the job. Linux queues a blocked signal even
             * when it is ignored, but POSIX leaves that open: reset it. */
            sa.sa_handler = SIG_DFL;
            sigaddset(&mask, sig);
        }
        sigaction(sig, &sa, NULL);
        saved[k].changed = true;
    }
    sigaddset(&mask, SIGCONT);
    sigprocmask(SIG_BLOCK, &mask, &oldmask);
    L.sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (L.sfd < 0 || devnull < 0) {
        fprintf(stderr, "brigade launch: cannot set up: %s\n", strerror(errno));
        rc = 1;
        goto out_signals;
    }

    /* supervise */
    struct pollfd *pfd = calloc((size_t)(2 * L.max_n + 1), sizeof *pfd);
    int *pfd_rank = calloc((size_t)(2 * L.max_n + 1), sizeof *pfd_rank);
    if (!pfd || !pfd_rank) {
        fprintf(stderr, "brigade launch: out of memory\n");
        rc = 1;
        free(pfd);
        free(pfd_rank);
        goto out_signals;
    }
    double t0 = launch_now(); /* --timeout covers every attempt */
    for (int attempt = 0;; attempt++) {
        if (attempt > 0) {
            /* a fresh job: new rendezvous port and token, the restart count */
            if (!L.o.port && bg_cli_free_port(&port) != 0) {
                fprintf(stderr, "brigade launch: cannot find a free port on 127.0.0.1: %s\n", strerror(errno));
                rc = 1;
                break;
            }
            if (bg_cli_job_token(token, sizeof token) != 0) {
                fprintf(stderr, "brigade launch: cannot read a job token from /dev/urandom: %s\n", strerror(errno));
                rc = 1;
                break;
            }
            snprintf(vars[4], sizeof vars[4], "BRIGADE_MASTER_PORT=%d", port);
            snprintf(vars[5], sizeof vars[5], "BRIGADE_JOB_TOKEN=%s", token);
            snprintf(vars[6], sizeof vars[6], "BRIGADE_RESTART_COUNT=%d", attempt);
            launch_reset(&L);
        }
        /* --hosts: which hosts this attempt runs on (--elastic: the ones a probe still reaches) */
        int pick = launch_hosts_pick(&L, attempt, rc);
        if (pick) {
            rc = pick;
            break;
        }
        snprintf(vars[1], sizeof vars[1], "BRIGADE_WORLD_SIZE=%d", L.o.n);
        snprintf(vars[3], sizeof vars[3], "BRIGADE_MASTER_ADDR=%s", L.o.addr);
        if (L.o.verbose) {
            fprintf(stderr, "brigade launch: %d rank%s of '%s', master %s:%d\n", L.o.n, launch_plural(L.o.n), L.o.cmd[0],
                    L.o.addr, port);
            if (L.o.tolerate)
                fprintf(stderr, "brigade launch: tolerating the failure of ranks %s%s\n", L.o.tolerate,
                        L.o.ps_auto ? " (the workers of --ps, by default)" : "");
        }
        for (int r = 0; r < L.o.n; r++) {
            snprintf(vars[0], sizeof vars[0], "BRIGADE_RANK=%d", r);
            snprintf(vars[2], sizeof vars[2], "BRIGADE_LOCAL_RANK=%d", L.o.hosts ? r % L.o.per_host : r);
            int code = launch_rank_argv(&L, r, envp + ne, LAUNCH_NVARS) ? 1
                       : launch_spawn(&L, r, envp, devnull, saved, nsaved, &oldmask);
            if (code) {
                launch_begin_stop(&L, STOP_START, code);
                break;
            }
        }

        for (;;) {
            double now = launch_now();
            if (L.running == 0 && L.linger_until == 0)
                L.linger_until = now + LAUNCH_LINGER_S;
            int nfd = 0;
            pfd[nfd++] = (struct pollfd){.fd = L.sfd, .events = POLLIN};
            for (int r = 0; r < L.o.n; r++)
                for (int k = 0; k < 2; k++)
                    if (L.ranks[r].io[k].fd >= 0) {
                        pfd_rank[nfd] = 2 * r + k;
                        pfd[nfd++] = (struct pollfd){.fd = L.ranks[r].io[k].fd, .events = POLLIN};
                    }
            if (L.running == 0 && (nfd == 1 || now >= L.linger_until))
                break;

            /* the nearest deadline */
            double until = -1;
            if (L.o.timeout_s > 0 && L.stop == STOP_NONE)
                until = t0 + L.o.timeout_s;
            if (L.stop != STOP_NONE && !L.killed && L.running > 0 && (until < 0 || L.kill_at < until))
                until = L.kill_at;
            if (L.running == 0 && (until < 0 || L.linger_until < until))
                until = L.linger_until;
            if (L.stop == STOP_NONE && L.exit_deadline > 0 && L.running > 0 && (until < 0 || L.exit_deadline < until))
                until = L.exit_deadline;
            int ms = -1;
            if (until >= 0) {
                double d = (until - now) * 1000.0;
                ms = d <= 0 ? 0 : d > 1e9 ? 1000000000 : (int)d + 1;
            }
            int np = poll(pfd, (nfds_t)nfd, ms);
            if (np < 0 && errno != EINTR) {
                /* cannot supervise any more: kill everything, reap, give up */
                fprintf(stderr, "brigade launch: poll failed: %s; killing the job\n", strerror(errno));
                launch_kill_all(&L, SIGKILL);
                while (L.running > 0) {
                    pid_t pid = waitpid(-1, NULL, 0);
                    if (pid < 0 && errno != EINTR)
                        break;
                    for (int r = 0; pid > 0 && r < L.o.n; r++)
                        if (L.ranks[r].pid == pid && L.ranks[r].running) {
                            L.ranks[r].running = false;
                            L.running--;
                        }
                }
                L.stop = STOP_SIGNAL;
                L.exit_code = 1;
                break;
            }
            if (np > 0) {
                if (pfd[0].revents & POLLIN) {
                    struct signalfd_siginfo si;
                    while (read(L.sfd, &si, sizeof si) == (ssize_t)sizeof si)
                        launch_on_signal(&L, (int)si.ssi_signo);
                }
                for (int i = 1; i < nfd; i++)
                    if (pfd[i].revents) {
                        launch_rank_t *rk = &L.ranks[pfd_rank[i] / 2];
                        launch_read_stream(&L, pfd_rank[i] / 2, &rk->io[pfd_rank[i] % 2]);
                    }
            }
            launch_reap(&L); /* SIGCHLD coalesces; reaping here too costs nothing */
            now = launch_now();
            if (L.stop == STOP_NONE && L.o.timeout_s > 0 && now >= t0 + L.o.timeout_s && L.running > 0) {
                fprintf(stderr, "brigade launch: timeout: the job is still running after %g s (--timeout); stopping %d "
                                "rank%s\n", L.o.timeout_s, L.running, launch_plural(L.running));
                launch_begin_stop(&L, STOP_TIMEOUT, 124);
            }
            if (L.stop == STOP_NONE && L.exit_deadline > 0 && L.running > 0 && now >= L.exit_deadline)
                launch_exit_deadline(&L);
            if (L.stop != STOP_NONE && !L.killed && L.running > 0 && now >= L.kill_at)
                launch_escalate(&L);
        }
        /* pipes still open after the linger: something the rank started holds them */
        for (int r = 0; r < L.o.n; r++)
            for (int k = 0; k < 2; k++)
                launch_close_stream(&L, r, &L.ranks[r].io[k]);
        rc = L.stop == STOP_NONE ? L.tolerated_code : L.exit_code;
        if (L.stop == STOP_NONE && L.tolerated_failed)
            fprintf(stderr, "brigade launch: the job finished without %d tolerated rank%s; exit code %d\n",
                    L.tolerated_failed, launch_plural(L.tolerated_failed), rc);
        if (L.o.verbose)
            fprintf(stderr, "brigade launch: done in %.3f s, exit code %d\n", launch_now() - t0, rc);
        if (L.stop != STOP_RANK || L.interrupted || attempt >= L.o.max_restarts) {
            if (L.stop == STOP_RANK && !L.interrupted && L.o.max_restarts > 0)
                fprintf(stderr, "brigade launch: the job failed after %d restart%s (--max-restarts %d); exit code %d\n",
                        attempt, launch_plural(attempt), L.o.max_restarts, rc);
            break;
        }
        /* a signal that arrived while the failed attempt was being stopped ends the job */
        struct signalfd_siginfo si;
        int sig = 0;
        while (read(L.sfd, &si, sizeof si) == (ssize_t)sizeof si) {
            launch_on_signal(&L, (int)si.ssi_signo);
            if (L.interrupted && !sig)
                sig = (int)si.ssi_signo;
        }
        if (L.interrupted) {
            fprintf(stderr, "brigade launch: received %s; not restarting\n", launch_signame(sig));
            rc = 128 + sig;
            break;
        }
        if (L.o.el_max)
            fprintf(stderr, "brigade launch: restart %d of %d: the job failed (exit code %d); probing the hosts, then "
                            "starting the job again with BRIGADE_RESTART_COUNT=%d\n",
                    attempt + 1, L.o.max_restarts, rc, attempt + 1);
        else
            fprintf(stderr, "brigade launch: restart %d of %d: the job failed (exit code %d); starting %d rank%s again "
                            "with BRIGADE_RESTART_COUNT=%d\n",
                    attempt + 1, L.o.max_restarts, rc, L.o.n, launch_plural(L.o.n), attempt + 1);
    }
    free(pfd);
    free(pfd_rank);

out_signals:
    if (devnull >= 0)
        close(devnull);
    if (L.sfd >= 0)
        close(L.sfd);
    sigprocmask(SIG_SETMASK, &oldmask, NULL);
    for (size_t k = 0; k < nsaved; k++)
        if (saved[k].changed)
            sigaction(saved[k].sig, &saved[k].old, NULL);
out_free:
    for (int r = 0; r < L.max_n; r++)
        for (int k = 0; k < 2; k++)
            free(L.ranks[r].io[k].buf);
    free(L.ranks);
    free(L.used);
    free(L.exec_argv);
    free(L.o.tolerated);
    free(L.obuf);
    free(envp);
    return rc;
}
