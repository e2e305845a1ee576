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
#define LAUNCH_PROBE_S 10.0        /* --elastic: a host that does not run `RSH HOST true` within this is lost */

typedef struct {
    const char *name;       /* what --rsh is given (a host name, a network namespace, a label) */
    const char *addr;       /* where its store would listen: NAME=ADDR's ADDR, else the name */
    bool lost;              /* --elastic: it failed a probe; never used again */
} launch_host_t;

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
    bool addr_given;        /* --master-addr given: it stays, whichever host holds rank 0 */
    launch_host_t *hosts;   /* --hosts, in order; NULL: every rank on this machine */
    int nhosts;
    int per_host;           /* --nproc-per-host: ranks on each host (1 without --hosts) */
    char **rsh;             /* --rsh's words, NULL-terminated; NULL: run the ranks here */
    int nrsh;
    int el_min, el_max;     /* --elastic MIN:MAX (world sizes); el_max 0: not elastic */
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
    int max_n;              /* ranks allocated: the largest world of any attempt */
    int *used;              /* with --hosts: the host index of each rank's block (rank r on used[r / per_host]) */
    int nused;
    char **exec_argv;       /* with --rsh: what rank r executes (RSH HOST env VARS... CMD); NULL: o.cmd */
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

/* ---- launch_hosts.c (--hosts, --rsh, --elastic) */

/* Parse --hosts LIST into o->hosts. 0, or 2 after the message. */
int launch_parse_hosts(const char *list, launch_opts_t *o);
/* Split --rsh's words into o->rsh. 0, or 2 after the message. */
int launch_parse_rsh(const char *words, launch_opts_t *o);
/* Check --elastic against the rest of the options and the command. 0, or 2 after the message. */
int launch_check_elastic(launch_opts_t *o, bool brigade_train);
/* Before attempt `attempt`: choose the hosts (with --elastic, drop the ones a
 * probe cannot reach), set L->o.n, L->used and, unless given, the master
 * address. 0: start; else the exit code to end with (said on stderr). */
int launch_hosts_pick(launch_t *L, int attempt, int last_rc);
/* Point L->exec_argv at what rank r executes (no-op without --rsh); vars: the
 * rank's BRIGADE_* assignments, nvars of them. 0, or 1 when out of memory. */
int launch_rank_argv(launch_t *L, int r, char *const *vars, size_t nvars);
/* " on host NAME" for rank r with --hosts, else "" */
const char *launch_rank_where(const launch_t *L, int r);

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
