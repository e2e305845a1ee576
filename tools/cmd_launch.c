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
 * polled together with the ranks' output pipes. */
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

extern char **environ;

#define LAUNCH_MAX_RANKS 4096
#define LAUNCH_LINE_MAX 65536      /* a longer line is forwarded in pieces */
#define LAUNCH_READ_CHUNK 65536
#define LAUNCH_LINGER_S 0.5        /* after the last rank exits, wait this long for its pipes' EOF */

typedef struct {
    int n;                  /* number of ranks */
    const char *addr;       /* BRIGADE_MASTER_ADDR */
    int port;               /* BRIGADE_MASTER_PORT; 0: pick a free one */
    bool tag;               /* --tag-output */
    bool verbose;           /* -v: one line per rank start and exit */
    double timeout_s;       /* 0: none */
    double grace_s;         /* seconds between SIGTERM and SIGKILL */
    int max_restarts;       /* restart the whole job after a rank failure, at most this many times */
    double exit_wait_s;     /* after a rank exits, the others must within this; 0: no limit */
    const char *tolerate;   /* --tolerate-ranks LIST, or NULL */
    long ps_auto;           /* > 0: tolerate was set from brigade train --ps S (S) */
    bool *tolerated;        /* per rank: its failure is reported and the others go on (from tolerate) */
    char **cmd;             /* NULL-terminated */
} launch_opts_t;

typedef struct {
    int fd;                 /* read end of the rank's pipe, -1 once closed */
    int out_fd;             /* where its lines go: 1 or 2 */
    char *buf;              /* the partial line so far */
    size_t len;
} launch_stream_t;

typedef struct {
    pid_t pid;              /* 0: never started */
    bool running;           /* started and not reaped yet */
    int status;             /* wait status once reaped */
    int stop_sig;           /* the signal that stopped it while it is stopped (WUNTRACED), else 0 */
    launch_stream_t io[2];  /* stdout, stderr (with --tag-output) */
} launch_rank_t;

typedef enum { STOP_NONE, STOP_RANK, STOP_SIGNAL, STOP_TIMEOUT, STOP_START } launch_stop_t;

typedef struct {
    launch_opts_t o;
    launch_rank_t *ranks;
    int running;            /* ranks started and not reaped */
    launch_stop_t stop;     /* why the job is being stopped */
    int exit_code;          /* the launcher's exit code */
    bool killed;            /* SIGKILL already sent */
    double kill_at;         /* when to send SIGKILL (monotonic s) */
    double linger_until;    /* 0 until every rank is reaped */
    int sfd;                /* signalfd */
    bool interrupted;       /* a terminating signal arrived: never restart */
    bool tstp_forwarded;    /* the launcher stopped the ranks itself (Ctrl-Z): not worth a line */
    double exit_deadline;   /* 0 until a rank exits; then the others must exit by this time */
    int first_exit;         /* the rank whose exit started the deadline */
    int tolerated_code;     /* exit code of the first tolerated rank that failed, 0: none */
    int tolerated_failed;   /* tolerated ranks that failed */
    char *obuf;             /* tagged output being assembled */
    size_t olen, ocap;
} launch_t;

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

/* ---------------------------------------------------------------- helpers */

static double launch_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *launch_signame(int sig)
{
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    default: return "a signal";
    }
}

static const char *launch_plural(int n)
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

static void launch_write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return; /* EPIPE and friends: drop the output, keep draining the ranks */
        }
        p += k;
        n -= (size_t)k;
    }
}

/* ---------------------------------------------------------------- options */

static void launch_usage(FILE *f)
{
    fprintf(f,
            "usage: brigade launch -n N [options] [--] CMD [ARGS...]\n"
            "\n"
            "Start N processes (ranks) of CMD on this machine, each with\n"
            "  BRIGADE_RANK (0..N-1), BRIGADE_LOCAL_RANK (= rank), BRIGADE_WORLD_SIZE (N),\n"
            "  BRIGADE_MASTER_ADDR, BRIGADE_MASTER_PORT, BRIGADE_JOB_TOKEN (random, per launch),\n"
            "  BRIGADE_RESTART_COUNT (0, then 1, 2, ... with --max-restarts)\n"
            "and the rest of the environment inherited (OMP_NUM_THREADS, when unset, becomes\n"
            "cores / N, at least 1). If a rank fails, the others are\n"
            "stopped and the launcher exits with that rank's status.\n"
            "\n"
            "options:\n"
            "  -n, --nproc N         number of ranks (1..%d), required\n"
            "  --master-addr A       address of rank 0's rendezvous store (default 127.0.0.1)\n"
            "  --master-port P       its port (default: a free port on 127.0.0.1)\n"
            "  --tag-output          prefix each line of each rank's stdout/stderr with \"[rank R] \"\n"
            "  --timeout S           stop the whole job after S seconds (exit code 124)\n"
            "  --grace S             seconds between SIGTERM and SIGKILL when stopping (default 5)\n"
            "  --exit-timeout S      once a rank has exited, kill the ranks still running S seconds\n"
            "                        later (0: never; default min(BRIGADE_TIMEOUT, 30) = 30)\n"
            "  --max-restarts K      after a rank fails, stop the job and start it again (new job\n"
            "                        token and port, BRIGADE_RESTART_COUNT=1, 2, ...), at most K\n"
            "                        times (default 0); the job resumes from its checkpoints itself\n"
            "  --tolerate-ranks L    ranks whose failure does not stop the others (A..B or A, comma-\n"
            "                        separated; default for brigade train --ps S: its workers,\n"
            "                        S..N-1); the failure is reported in one line, and the exit\n"
            "                        code is still the failed rank's\n"
            "  -v, --verbose         print a line when each rank starts and ends\n"
            "  -h, --help            this help\n"
            "\n"
            "exit code: 0 if every rank exits 0; else the first failing rank's exit code (a\n"
            "tolerated rank's when the others finish)\n"
            "(128+signal if it was killed), of the last attempt with --max-restarts; 124 on\n"
            "--timeout (which covers all attempts); 128+signal when the launcher\n"
            "is interrupted (130 for Ctrl-C, 143 for SIGTERM); 127 (126) when CMD is not\n"
            "found (not executable); 2 for bad usage. See docs/launch.md.\n",
            LAUNCH_MAX_RANKS);
}

/* CMD is `brigade train ...` (the program's name is brigade, the first argument train) */
static bool launch_is_brigade_train(char **cmd)
{
    const char *base = strrchr(cmd[0], '/');
    base = base ? base + 1 : cmd[0];
    return !strcmp(base, "brigade") && cmd[1] && !strcmp(cmd[1], "train");
}

/* S of `--ps S` (or --ps=S) in CMD; 0 when absent or not a number */
static long launch_ps_servers(char **cmd)
{
    for (int k = 2; cmd[k]; k++) {
        const char *v = !strcmp(cmd[k], "--ps") ? cmd[k + 1] : !strncmp(cmd[k], "--ps=", 5) ? cmd[k] + 5 : NULL;
        if (!v)
            continue;
        char *end;
        long s = strtol(v, &end, 10);
        return end != v && !*end ? s : 0;
    }
    return 0;
}

/* 0: run; otherwise the exit code to return (0 after --help). */
static int launch_parse(int argc, char **argv, launch_opts_t *o)
{
    const char *cmd = "launch";
    long long v;
    bool have_n = false;
    o->addr = "127.0.0.1";
    o->grace_s = 5.0;
    o->exit_wait_s = -1; /* from BRIGADE_TIMEOUT below */
    o->cmd = NULL;
    int i = 1;
    for (; i < argc; i++) {
        char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (a[0] != '-' || !a[1])
            break; /* the command starts here */
        /* --name=value, -nN, or the value in the next argument */
        char name[64];
        const char *val = NULL;
        bool inline_val = false;
        const char *eq = strchr(a, '=');
        if (a[1] == '-' && eq) {
            size_t k = (size_t)(eq - a);
            if (k >= sizeof name)
                k = sizeof name - 1;
            memcpy(name, a, k);
            name[k] = 0;
            val = eq + 1;
            inline_val = true;
        } else if (a[1] == 'n' && a[2] && a[1] != '-') {
            strcpy(name, "-n");
            val = a + 2;
            inline_val = true;
        } else {
            snprintf(name, sizeof name, "%s", a);
        }
        bool is_flag = !strcmp(name, "--tag-output") || !strcmp(name, "-v") || !strcmp(name, "--verbose") ||
                       !strcmp(name, "-h") || !strcmp(name, "--help");
        if (is_flag && inline_val)
            return bg_cli_fail(cmd, "%s takes no value", name);
        if (!is_flag && !inline_val)
            val = i + 1 < argc ? argv[++i] : NULL;

        if (!strcmp(name, "-h") || !strcmp(name, "--help")) {
            launch_usage(stdout);
            return -1;
        } else if (!strcmp(name, "--tag-output")) {
            o->tag = true;
        } else if (!strcmp(name, "-v") || !strcmp(name, "--verbose")) {
            o->verbose = true;
        } else if (!strcmp(name, "-n") || !strcmp(name, "--nproc")) {
            if (bg_cli_int(cmd, name, val, 1, LAUNCH_MAX_RANKS, &v))
                return 2;
            o->n = (int)v;
            have_n = true;
        } else if (!strcmp(name, "--master-addr")) {
            if (!val || !*val)
                return bg_cli_fail(cmd, "--master-addr needs a host name or address");
            if (strlen(val) > 255)
                return bg_cli_fail(cmd, "--master-addr is %zu characters long; a host name has at most 255",
                                   strlen(val));
            o->addr = val;
        } else if (!strcmp(name, "--master-port")) {
            if (bg_cli_int(cmd, name, val, 1, 65535, &v))
                return 2;
            o->port = (int)v;
        } else if (!strcmp(name, "--timeout")) {
            if (bg_cli_double(cmd, name, val, 0.001, 1e9, &o->timeout_s))
                return 2;
        } else if (!strcmp(name, "--max-restarts")) {
            if (bg_cli_int(cmd, name, val, 0, 1000000, &v))
                return 2;
            o->max_restarts = (int)v;
        } else if (!strcmp(name, "--exit-timeout")) {
            if (bg_cli_double(cmd, name, val, 0, 1e9, &o->exit_wait_s))
                return 2;
        } else if (!strcmp(name, "--tolerate-ranks")) {
            if (!val || !*val)
                return bg_cli_fail(cmd, "--tolerate-ranks needs a list of ranks, e.g. 2..7 or 1,3");
            o->tolerate = val;
        } else if (!strcmp(name, "--grace")) {
            if (bg_cli_double(cmd, name, val, 0, 86400, &o->grace_s))
                return 2;
        } else {
            return bg_cli_fail(cmd, "unknown option \"%s\" (see brigade launch --help)", a);
        }
    }
    if (!have_n)
        return bg_cli_fail(cmd, "missing -n N, the number of ranks to start (see brigade launch --help)");
    if (i >= argc)
        return bg_cli_fail(cmd, "no command to run: put it after --, e.g. brigade launch -n %d -- ./train", o->n);
    if (!argv[i][0])
        return bg_cli_fail(cmd, "the command to run is an empty string");
    o->cmd = argv + i;
    /* brigade train --ps S: its workers (ranks S..N-1) are tolerated unless
     * --tolerate-ranks says otherwise (the mode exists for them) */
    static char ps_tolerate[32];
    if (!o->tolerate && launch_is_brigade_train(o->cmd)) {
        long ps = launch_ps_servers(o->cmd);
        if (ps > 0 && ps < o->n) {
            snprintf(ps_tolerate, sizeof(ps_tolerate), "%ld..%d", ps, o->n - 1);
            o->tolerate = ps_tolerate;
            o->ps_auto = ps;
        }
    }
    if (o->tolerate) {
        o->tolerated = calloc((size_t)o->n, sizeof(bool));
        if (!o->tolerated)
            return bg_cli_fail(cmd, "out of memory");
        for (const char *p = o->tolerate; *p;) {
            char *end;
            long a = strtol(p, &end, 10), b = a;
            if (end == p || a < 0)
                return bg_cli_fail(cmd, "--tolerate-ranks \"%s\": expected ranks A..B or A, comma-separated",
                                   o->tolerate);
            p = end;
            if (p[0] == '.' && p[1] == '.') {
                b = strtol(p + 2, &end, 10);
                if (end == p + 2 || b < a)
                    return bg_cli_fail(cmd, "--tolerate-ranks \"%s\": expected ranks A..B with A <= B", o->tolerate);
                p = end;
            }
            if (b >= o->n)
                return bg_cli_fail(cmd, "--tolerate-ranks \"%s\": rank %ld is not one of the %d ranks (0..%d)",
                                   o->tolerate, b, o->n, o->n - 1);
            for (long r = a; r <= b; r++)
                o->tolerated[r] = true;
            if (*p == ',')
                p++;
            else if (*p)
                return bg_cli_fail(cmd, "--tolerate-ranks \"%s\": expected ranks A..B or A, comma-separated",
                                   o->tolerate);
        }
        if (o->tolerated[0])
            return bg_cli_fail(cmd, "--tolerate-ranks \"%s\": rank 0 serves the job's rendezvous store; its failure "
                               "ends the job", o->tolerate);
    }
    if (o->exit_wait_s < 0) {
        /* the ranks' teardown barriers wait min(BRIGADE_TIMEOUT, 30 s): past that, a rank
         * still running after another one exited is hung (or stopped) */
        double t = 60;
        if (bg_config_double("BRIGADE_TIMEOUT", &t) != BG_OK)
            return bg_cli_fail(cmd, "%s", bg_last_error());
        o->exit_wait_s = t > 0 && t < 30 ? t : 30;
    }
    return 0;
}

/* ---------------------------------------------------------------- output */

/* Append "[rank R] " a b "\n" to the output buffer. */
static void launch_emit(launch_t *L, int rank, const char *a, size_t na, const char *b, size_t nb)
{
    char prefix[32];
    int np = snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
    size_t need = L->olen + (size_t)np + na + nb + 1;
    if (need > L->ocap) {
        size_t cap = need > 2 * L->ocap ? need : 2 * L->ocap;
        char *p = realloc(L->obuf, cap);
        if (!p)
            return;
        L->obuf = p;
        L->ocap = cap;
    }
    char *o = L->obuf + L->olen;
    memcpy(o, prefix, (size_t)np);
    if (na)
        memcpy(o + np, a, na);
    if (nb)
        memcpy(o + np + na, b, nb);
    o[np + na + nb] = '\n';
    L->olen = need;
}

/* Write the buffered lines. The launcher is the only writer of its stdout and
 * stderr in this mode, so whole lines never mix, and one write per read of a
 * rank's pipe (rather than per line) keeps up with chatty ranks. */
static void launch_flush(launch_t *L, int fd)
{
    launch_write_all(fd, L->obuf, L->olen);
    L->olen = 0;
}

/* Forward the complete lines in data; keep the tail as the partial line. */
static void launch_lines(launch_t *L, int rank, launch_stream_t *s, const char *data, size_t n)
{
    while (n > 0) {
        const char *nl = memchr(data, '\n', n);
        size_t seg = nl ? (size_t)(nl - data) : n;
        if (nl) {
            launch_emit(L, rank, s->buf, s->len, data, seg);
            s->len = 0;
            data += seg + 1;
            n -= seg + 1;
            continue;
        }
        /* no newline: keep it, forwarding in pieces past LAUNCH_LINE_MAX */
        while (seg > 0) {
            size_t room = LAUNCH_LINE_MAX - s->len;
            size_t take = seg < room ? seg : room;
            memcpy(s->buf + s->len, data, take);
            s->len += take;
            data += take;
            seg -= take;
            n -= take;
            if (s->len == LAUNCH_LINE_MAX) {
                launch_emit(L, rank, s->buf, s->len, NULL, 0);
                s->len = 0;
            }
        }
    }
    launch_flush(L, s->out_fd);
}

static void launch_close_stream(launch_t *L, int rank, launch_stream_t *s)
{
    if (s->fd < 0)
        return;
    if (s->len > 0) { /* a last line without its newline: forward it with one */
        launch_emit(L, rank, s->buf, s->len, NULL, 0);
        launch_flush(L, s->out_fd);
    }
    s->len = 0;
    close(s->fd);
    s->fd = -1;
}

static void launch_read_stream(launch_t *L, int rank, launch_stream_t *s)
{
    char chunk[LAUNCH_READ_CHUNK];
    for (;;) {
        ssize_t k = read(s->fd, chunk, sizeof chunk);
        if (k > 0) {
            launch_lines(L, rank, s, chunk, (size_t)k);
            return; /* one read per wake-up keeps ranks fair */
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        launch_close_stream(L, rank, s); /* EOF or error */
        return;
    }
}

/* ---------------------------------------------------------------- stopping */

static void launch_kill_all(launch_t *L, int sig)
{
    for (int r = 0; r < L->o.n; r++)
        if (L->ranks[r].running)
            launch_signal_rank(&L->ranks[r], sig);
}

/* Begin an orderly stop: SIGTERM now, SIGKILL after the grace period. */
static void launch_begin_stop(launch_t *L, launch_stop_t why, int exit_code)
{
    if (L->stop != STOP_NONE)
        return;
    L->stop = why;
    L->exit_code = exit_code;
    launch_kill_all(L, SIGTERM);
    launch_kill_all(L, SIGCONT); /* a stopped rank would sit on its SIGTERM until SIGKILL */
    L->kill_at = launch_now() + L->o.grace_s;
}

static void launch_escalate(launch_t *L)
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

static void launch_reap(launch_t *L)
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
                fprintf(stderr, "brigade launch: rank %d (pid %d) %s%s; stopping the other %d rank%s\n", r, (int)pid,
                        what, note, L->running, launch_plural(L->running));
            else
                fprintf(stderr, "brigade launch: rank %d (pid %d) %s\n", r, (int)pid, what);
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
static void launch_exit_deadline(launch_t *L)
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

static void launch_on_signal(launch_t *L, int sig)
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
static void launch_reset(launch_t *L)
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

typedef struct {
    int sig;
    struct sigaction old;
    bool changed;
} launch_saved_sig_t;

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

/* Fork and exec rank r. Returns 0, or the exit code to give if it could not start. */
static int launch_spawn(launch_t *L, int r, char **envp, int devnull, const launch_saved_sig_t *saved, size_t nsaved,
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
        execvpe(L->o.cmd[0], L->o.cmd, envp);
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
        fprintf(stderr, "brigade launch: rank %d: cannot execute '%s': %s%s\n", r, L->o.cmd[0], strerror(e),
                L->running > 0 ? "; stopping the other ranks" : "");
        return e == ENOENT ? 127 : 126;
    }
    if (L->o.verbose)
        fprintf(stderr, "brigade launch: started rank %d (pid %d)\n", r, (int)pid);
    return 0;
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
    L.ranks = calloc((size_t)L.o.n, sizeof *L.ranks);
    if (!envp || !L.ranks) {
        fprintf(stderr, "brigade launch: out of memory\n");
        free(envp);
        free(L.ranks);
        return 1;
    }
    size_t ne = 0;
    for (size_t i = 0; i < nenv; i++)
        if (!launch_is_set_var(environ[i]))
            envp[ne++] = environ[i];
    for (size_t i = 0; i < LAUNCH_NVARS; i++)
        envp[ne + i] = vars[i];
    snprintf(vars[1], sizeof vars[1], "BRIGADE_WORLD_SIZE=%d", L.o.n);
    snprintf(vars[3], sizeof vars[3], "BRIGADE_MASTER_ADDR=%s", L.o.addr);
    snprintf(vars[4], sizeof vars[4], "BRIGADE_MASTER_PORT=%d", port);
    snprintf(vars[5], sizeof vars[5], "BRIGADE_JOB_TOKEN=%s", token);
    snprintf(vars[6], sizeof vars[6], "BRIGADE_RESTART_COUNT=0");

    for (int r = 0; r < L.o.n; r++)
        for (int k = 0; k < 2; k++)
            L.ranks[r].io[k].fd = -1;
    if (L.o.tag) {
        for (int r = 0; r < L.o.n; r++)
            for (int k = 0; k < 2; k++)
                if (!(L.ranks[r].io[k].buf = malloc(LAUNCH_LINE_MAX))) {
                    fprintf(stderr, "brigade launch: out of memory\n");
                    rc = 1;
                    goto out_free;
                }
        /* two pipes per rank: make room if the soft open-file limit is low */
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max &&
            rl.rlim_cur < (rlim_t)(2 * L.o.n + 64)) {
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
    struct pollfd *pfd = calloc((size_t)(2 * L.o.n + 1), sizeof *pfd);
    int *pfd_rank = calloc((size_t)(2 * L.o.n + 1), sizeof *pfd_rank);
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
        if (L.o.verbose) {
            fprintf(stderr, "brigade launch: %d rank%s of '%s', master %s:%d\n", L.o.n, launch_plural(L.o.n), L.o.cmd[0],
                    L.o.addr, port);
            if (L.o.tolerate)
                fprintf(stderr, "brigade launch: tolerating the failure of ranks %s%s\n", L.o.tolerate,
                        L.o.ps_auto ? " (the workers of --ps, by default)" : "");
        }
        for (int r = 0; r < L.o.n; r++) {
            snprintf(vars[0], sizeof vars[0], "BRIGADE_RANK=%d", r);
            snprintf(vars[2], sizeof vars[2], "BRIGADE_LOCAL_RANK=%d", r);
            int code = launch_spawn(&L, r, envp, devnull, saved, nsaved, &oldmask);
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
    for (int r = 0; r < L.o.n; r++)
        for (int k = 0; k < 2; k++)
            free(L.ranks[r].io[k].buf);
    free(L.ranks);
    free(L.o.tolerated);
    free(L.obuf);
    free(envp);
    return rc;
}
