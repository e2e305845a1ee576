/* tools/launch_impl.h: what the files of `brigade launch` share
 * (cmd_launch.c, launch_opts.c, launch_output.c, launch_supervise.c): the
 * options, the state of a launch and its ranks, and the functions the loop
 * calls. Private to tools/. */
#ifndef BG_TOOLS_LAUNCH_IMPL_H
#define BG_TOOLS_LAUNCH_IMPL_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

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

typedef struct {
    int sig;
    struct sigaction old;
    bool changed;
} launch_saved_sig_t;

/* ---- launch_opts.c */

/* 0: run; otherwise the exit code to return (-1: --help, exit 0). */
int launch_parse(int argc, char **argv, launch_opts_t *o);

/* ---- launch_output.c (--tag-output) */

/* Read what a rank's pipe has and forward its complete lines; at EOF, close. */
void launch_read_stream(launch_t *L, int rank, launch_stream_t *s);
/* Forward a last partial line and close the pipe (no-op when closed). */
void launch_close_stream(launch_t *L, int rank, launch_stream_t *s);

/* ---- launch_supervise.c */

double launch_now(void); /* monotonic seconds */
const char *launch_signame(int sig);
const char *launch_plural(int n);
void launch_kill_all(launch_t *L, int sig);
/* Begin an orderly stop: SIGTERM now, SIGKILL after the grace period. */
void launch_begin_stop(launch_t *L, launch_stop_t why, int exit_code);
/* The grace period is over: SIGKILL to every rank still running. */
void launch_escalate(launch_t *L);
/* Reap (and report) every rank that has exited, stopped or continued. */
void launch_reap(launch_t *L);
/* The exit deadline passed: kill every rank still running, naming each. */
void launch_exit_deadline(launch_t *L);
void launch_on_signal(launch_t *L, int sig);
/* Forget the ranks of a finished attempt (their pipes are closed). */
void launch_reset(launch_t *L);
/* Fork and exec rank r. Returns 0, or the exit code to give if it could not start. */
int launch_spawn(launch_t *L, int r, char **envp, int devnull, const launch_saved_sig_t *saved, size_t nsaved,
                 const sigset_t *oldmask);

#endif
