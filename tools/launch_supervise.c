/* tools/launch_supervise.c: what `brigade launch`'s loop does on each
 * event: start a rank (fork + execvpe, its own process group, the signal
 * state restored), reap one (failure propagation, tolerated ranks, the exit
 * deadline), note a stopped one, act on a signal to the launcher, escalate
 * SIGTERM to SIGKILL, and forget a finished attempt.
 * Must not: parse options, forward output (launch_output.c), or run the loop
 * (cmd_launch.c polls and calls it); it never talks to the ranks' store. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/launch_impl.h"

/* ---------------------------------------------------------------- helpers */

double launch_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *launch_signame(int sig)
{
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    default: return "a signal";
    }
}

const char *launch_plural(int n)
{
    return n == 1 ? "" : "s";
}

static int launch_status_code(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return 1;
}

/* "exited with status 3" / "was killed by signal 9 (Killed)" */
static void launch_describe(int status, char *out, size_t cap)
{
    if (WIFEXITED(status))
        snprintf(out, cap, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, cap, "was killed by signal %d (%s)%s", WTERMSIG(status), strsignal(WTERMSIG(status)),
                 WCOREDUMP(status) ? ", core dumped" : "");
    else
        snprintf(out, cap, "ended with wait status 0x%x", (unsigned)status);
}

/* Signal a rank's process group; fall back to the pid if the rank left it. */
static void launch_signal_rank(const launch_rank_t *r, int sig)
{
    if (kill(-r->pid, sig) != 0 && errno == ESRCH)
        kill(r->pid, sig);
}

/* ---------------------------------------------------------------- stopping */

void launch_kill_all(launch_t *L, int sig)
{
    for (int r = 0; r < L->o.n; r++)
        if (L->ranks[r].running)
            launch_signal_rank(&L->ranks[r], sig);
}

/* Begin an orderly stop: SIGTERM now, SIGKILL after the grace period. */
void launch_begin_stop(launch_t *L, launch_stop_t why, int exit_code)
{
    if (L->stop != STOP_NONE)
        return;
    L->stop = why;
    L->exit_code = exit_code;
    launch_kill_all(L, SIGTERM);
    launch_kill_all(L, SIGCONT); /* a stopped rank would sit on its SIGTERM until SIGKILL */
    L->kill_at = launch_now() + L->o.grace_s;
}

void launch_escalate(launch_t *L)
{
    for (int r = 0; r < L->o.n; r++) {
        launch_rank_t *rk = &L->ranks[r];
        if (!rk->running)
            continue;
        fprintf(stderr, "brigade launch: rank %d (pid %d) still running %g s after SIGTERM; sending SIGKILL\n", r,
                (int)rk->pid, L->o.grace_s);
        launch_signal_rank(rk, SIGKILL);
    }
    L->killed = true;
}

/* The name of a signal that stops a process. */
static const char *launch_stopname(int sig, char *buf, size_t cap)
{
    switch (sig) {
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGTTIN: return "SIGTTIN";
    case SIGTTOU: return "SIGTTOU";
    default: snprintf(buf, cap, "signal %d", sig); return buf;
    }
}

/* " while rank 3 (pid N) is stopped (SIGSTOP)", or "" */
static void launch_stopped_note(const launch_t *L, int except, char *out, size_t cap)
{
    out[0] = 0;
    for (int r = 0; r < L->o.n; r++)
        if (r != except && L->ranks[r].running && L->ranks[r].stop_sig) {
            char b[32];
            snprintf(out, cap, " while rank %d (pid %d) is stopped (%s)", r, (int)L->ranks[r].pid,
                     launch_stopname(L->ranks[r].stop_sig, b, sizeof b));
            return;
        }
}

static void launch_note_stop(launch_t *L, int r, int st)
{
    launch_rank_t *rk = &L->ranks[r];
    char b[32];
    rk->stop_sig = WSTOPSIG(st);
    if (L->stop == STOP_NONE && !L->tstp_forwarded)
        fprintf(stderr, "brigade launch: rank %d (pid %d) was stopped by %s; the other ranks may fail "
                "waiting for it\n", r, (int)rk->pid, launch_stopname(rk->stop_sig, b, sizeof b));
}

/* Before blaming a failing rank: a stop of another rank not reaped yet (waitpid
 * may report the exit first when both are pending) is reported first. */
static void launch_poll_stops(launch_t *L, int except)
{
    for (int r = 0; r < L->o.n; r++) {
        /* WSTOPPED alone: consumes a stop report only, never an exit (the reap loop's) */
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (r != except && L->ranks[r].running && !L->ranks[r].stop_sig &&
            waitid(P_PID, (id_t)L->ranks[r].pid, &si, WSTOPPED | WNOHANG) == 0 && si.si_pid == L->ranks[r].pid)
            launch_note_stop(L, r, W_STOPCODE(si.si_status));
    }
}

/* The last tolerated rank (the last worker of a parameter-server job) has
 * ended: nothing is left for the others (the servers) to serve, so they must
 * exit within the exit deadline, as after a rank's exit 0. Without it a
 * stopped server would keep the launcher waiting forever. */
static void launch_tolerated_gone(launch_t *L, int r)
{
    if (L->exit_deadline != 0 || L->o.exit_wait_s <= 0 || L->running == 0)
        return;
    for (int i = 0; i < L->o.n; i++)
        if (L->o.tolerated[i] && L->ranks[i].running)
            return;
    L->exit_deadline = launch_now() + L->o.exit_wait_s;
    L->first_exit = r;
}

void launch_reap(launch_t *L)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG | WUNTRACED | WCONTINUED);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            return;
        int r = 0;
        while (r < L->o.n && L->ranks[r].pid != pid)
            r++;
        if (r == L->o.n || !L->ranks[r].running)
            continue;
        launch_rank_t *rk = &L->ranks[r];
        if (WIFSTOPPED(st)) {
            /* a stopped rank holds up the others (they time out waiting for it): say
             * so first, so that the first line names it rather than a survivor */
            launch_note_stop(L, r, st);
            continue;
        }
        if (WIFCONTINUED(st)) {
            rk->stop_sig = 0;
            continue;
        }
        rk->running = false;
        rk->stop_sig = 0;
        rk->status = st;
        L->running--;
        char what[128], note[160];
        bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (!ok && L->stop == STOP_NONE)
            launch_poll_stops(L, r);
        launch_describe(st, what, sizeof what);
        launch_stopped_note(L, r, note, sizeof note);
        if (ok && L->stop == STOP_NONE && L->running > 0 && L->exit_deadline == 0 && L->o.exit_wait_s > 0) {
            L->exit_deadline = launch_now() + L->o.exit_wait_s;
            L->first_exit = r;
        }
        if (!ok && L->stop == STOP_NONE && L->o.tolerated && L->o.tolerated[r] && L->running > 0) {
            /* a rank the job can lose (a parameter server's worker): the others go on */
            fprintf(stderr, "brigade launch: rank %d (pid %d) %s; tolerated (--tolerate-ranks %s%s): the other %d "
                    "rank%s go%s on\n", r, (int)pid, what, L->o.tolerate,
                    L->o.ps_auto ? ", the workers of --ps: the default" : "", L->running, launch_plural(L->running),
                    L->running == 1 ? "es" : "");
            if (L->tolerated_failed++ == 0)
                L->tolerated_code = launch_status_code(st);
            launch_tolerated_gone(L, r);
        } else if (!ok && L->stop == STOP_NONE) {
            if (L->running > 0)
                fprintf(stderr, "brigade launch: rank %d (pid %d%s) %s%s; stopping the other %d rank%s\n", r, (int)pid,
                        launch_rank_where(L, r), what, note, L->running, launch_plural(L->running));
            else
                fprintf(stderr, "brigade launch: rank %d (pid %d%s) %s\n", r, (int)pid, launch_rank_where(L, r), what);
            launch_begin_stop(L, STOP_RANK, launch_status_code(st));
        } else {
            /* during a stop on request every rank exits 128 + the signal; one that did not failed (said, as the
             * job's exit code is the stop's) */
            bool failed_in_stop = L->stop == STOP_SIGNAL && !ok && launch_status_code(st) != L->exit_code;
            if (L->o.verbose || failed_in_stop)
                fprintf(stderr, "brigade launch: rank %d (pid %d) %s%s\n", r, (int)pid, what,
                        failed_in_stop && !L->o.verbose ? " during the stop" : "");
        }
    }
}

/* The exit deadline passed: every rank still running is hung or stopped. Kill
 * them at once (a stopped one would not act on SIGTERM), naming each. */
void launch_exit_deadline(launch_t *L)
{
    for (int r = 0; r < L->o.n; r++) {
        launch_rank_t *rk = &L->ranks[r];
        if (!rk->running)
            continue;
        char how[64] = "", b[32];
        if (rk->stop_sig)
            snprintf(how, sizeof how, " (stopped by %s)", launch_stopname(rk->stop_sig, b, sizeof b));
        fprintf(stderr, "brigade launch: rank %d (pid %d)%s did not exit within %g s after rank %d ended; killed\n",
                r, (int)rk->pid, how, L->o.exit_wait_s, L->first_exit);
        launch_signal_rank(rk, SIGKILL);
    }
    L->stop = STOP_RANK; /* a failure of the job: --max-restarts may run it again */
    L->exit_code = 124;
    L->killed = true;
}

void launch_on_signal(launch_t *L, int sig)
{
    switch (sig) {
    case SIGCHLD:
        launch_reap(L);
        return;
    case SIGTSTP: /* Ctrl-Z: stop the ranks, then ourselves; SIGCONT resumes them */
        L->tstp_forwarded = true;
        launch_kill_all(L, SIGTSTP);
        kill(getpid(), SIGSTOP);
        return;
    case SIGCONT:
        launch_kill_all(L, SIGCONT);
        L->tstp_forwarded = false;
        return;
    default:
        break;
    }
    L->interrupted = true; /* Ctrl-C, kill, hang-up: the job ends, no restart */
    if (L->stop == STOP_NONE) {
        if (L->running > 0)
            fprintf(stderr, "brigade launch: received %s; stopping %d rank%s (SIGTERM, then SIGKILL after %g s)\n",
                    launch_signame(sig), L->running, launch_plural(L->running), L->o.grace_s);
        launch_begin_stop(L, STOP_SIGNAL, 128 + sig);
    } else if (!L->killed && L->running > 0) {
        fprintf(stderr, "brigade launch: received %s again; sending SIGKILL to %d rank%s\n", launch_signame(sig),
                L->running, launch_plural(L->running));
        launch_kill_all(L, SIGKILL);
        L->killed = true;
    }
}

/* Forget the ranks of a finished attempt (their pipes are closed). */
void launch_reset(launch_t *L)
{
    for (int r = 0; r < L->o.n; r++) {
        launch_rank_t *rk = &L->ranks[r];
        rk->pid = 0;
        rk->running = false;
        rk->status = 0;
        for (int k = 0; k < 2; k++) {
            rk->io[k].fd = -1;
            rk->io[k].len = 0;
        }
    }
    L->running = 0;
    L->stop = STOP_NONE;
    L->exit_code = 0;
    L->killed = false;
    L->kill_at = 0;
    L->linger_until = 0;
    L->exit_deadline = 0;
    L->tolerated_code = 0;
    L->tolerated_failed = 0;
}

/* ---------------------------------------------------------------- start */

/* Fork and exec rank r. Returns 0, or the exit code to give if it could not start. */
int launch_spawn(launch_t *L, int r, char **envp, int devnull, const launch_saved_sig_t *saved, size_t nsaved,
                        const sigset_t *oldmask)
{
    launch_rank_t *rk = &L->ranks[r];
    int errp[2], pio[2][2] = {{-1, -1}, {-1, -1}};
    if (pipe2(errp, O_CLOEXEC) != 0) {
        fprintf(stderr, "brigade launch: rank %d: cannot create a pipe: %s\n", r, strerror(errno));
        return 1;
    }
    for (int k = 0; L->o.tag && k < 2; k++) {
        if (pipe2(pio[k], O_CLOEXEC) != 0) {
            fprintf(stderr, "brigade launch: rank %d: cannot create a pipe: %s (too many ranks for the open-file "
                            "limit?)\n", r, strerror(errno));
            close(errp[0]);
            close(errp[1]);
            for (int j = 0; j < k; j++) {
                close(pio[j][0]);
                close(pio[j][1]);
            }
            return 1;
        }
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "brigade launch: rank %d: fork failed: %s\n", r, strerror(errno));
        close(errp[0]);
        close(errp[1]);
        for (int k = 0; L->o.tag && k < 2; k++) {
            close(pio[k][0]);
            close(pio[k][1]);
        }
        return 1;
    }
    if (pid == 0) {
        /* child: only async-signal-safe calls from here on */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) /* the launcher died before prctl took effect */
            _exit(1);
        dup2(devnull, 0);
        if (L->o.tag) {
            dup2(pio[0][1], 1);
            dup2(pio[1][1], 2);
        }
        for (size_t k = 0; k < nsaved; k++)
            if (saved[k].changed)
                sigaction(saved[k].sig, &saved[k].old, NULL);
        sigprocmask(SIG_SETMASK, oldmask, NULL);
        char **argv = L->exec_argv ? L->exec_argv : L->o.cmd;
        execvpe(argv[0], argv, envp);
        int e = errno;
        ssize_t w = write(errp[1], &e, sizeof e);
        (void)w;
        _exit(e == ENOENT ? 127 : 126);
    }
    setpgid(pid, pid); /* also here, so the group exists before we might signal it */
    close(errp[1]);
    for (int k = 0; L->o.tag && k < 2; k++) {
        close(pio[k][1]);
        fcntl(pio[k][0], F_SETFL, fcntl(pio[k][0], F_GETFL) | O_NONBLOCK);
        rk->io[k].fd = pio[k][0];
        rk->io[k].out_fd = k + 1;
    }
    rk->pid = pid;
    rk->running = true;
    L->running++;

    /* EOF on the close-on-exec pipe: exec succeeded; an errno: it failed */
    int e = 0;
    ssize_t k;
    do
        k = read(errp[0], &e, sizeof e);
    while (k < 0 && errno == EINTR);
    close(errp[0]);
    if (k == (ssize_t)sizeof e) {
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        rk->running = false;
        rk->status = st;
        L->running--;
        for (int j = 0; j < 2; j++)
            launch_close_stream(L, r, &rk->io[j]);
        fprintf(stderr, "brigade launch: rank %d: cannot execute '%s': %s%s\n", r,
                L->exec_argv ? L->exec_argv[0] : L->o.cmd[0], strerror(e),
                L->running > 0 ? "; stopping the other ranks" : "");
        return e == ENOENT ? 127 : 126;
    }
    if (L->o.verbose)
        fprintf(stderr, "brigade launch: started rank %d (pid %d%s)\n", r, (int)pid, launch_rank_where(L, r));
    return 0;
}
