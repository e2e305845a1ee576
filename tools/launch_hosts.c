/* tools/launch_hosts.c: `brigade launch --hosts`, `--rsh` and `--elastic`.
 *
 * Owns: the host list (NAME or NAME=ADDR), the command prefix that runs a
 * rank on a host (RSH HOST env BRIGADE_...=... CMD ARGS), the checks of
 * --elastic MIN:MAX against the other options and a `brigade train` command,
 * and, before every attempt, which hosts the job runs on: with --elastic each
 * host not yet lost is probed (`RSH HOST true`, bounded by LAUNCH_PROBE_S),
 * a host that fails is lost for good, and the world is per_host ranks on each
 * of the first hosts that remain, as many as MAX allows (the rest are spares).
 * Must not: supervise ranks or know anything of checkpoints beyond the flags
 * it checks on a `brigade train` command; the job resumes itself. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/cli.h"
#include "tools/launch_impl.h"

/* ---------------------------------------------------------------- options */

int launch_parse_hosts(const char *list, launch_opts_t *o)
{
    if (!list || !*list)
        return bg_cli_fail("launch", "--hosts needs a comma-separated list of hosts, e.g. node1,node2");
    char *copy = strdup(list);
    int n = 1;
    for (const char *p = list; *p; p++)
        n += *p == ',';
    o->hosts = calloc((size_t)n, sizeof *o->hosts);
    if (!copy || !o->hosts) {
        free(copy);
        return bg_cli_fail("launch", "out of memory");
    }
    o->nhosts = 0;
    char *save = NULL;
    for (char *h = strtok_r(copy, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(h, '=');
        if (eq)
            *eq = 0;
        if (!*h || (eq && !eq[1]) || strlen(eq ? eq + 1 : h) > 255)
            return bg_cli_fail("launch", "--hosts \"%s\": expected NAME or NAME=ADDR (an address of at most 255 "
                               "characters), comma-separated", list);
        for (int k = 0; k < o->nhosts; k++)
            if (!strcmp(o->hosts[k].name, h))
                return bg_cli_fail("launch", "--hosts \"%s\": host %s is listed twice", list, h);
        o->hosts[o->nhosts++] = (launch_host_t){.name = h, .addr = eq ? eq + 1 : h};
    }
    if (o->nhosts == 0 || o->nhosts != n)
        return bg_cli_fail("launch", "--hosts \"%s\": an empty host name", list);
    return 0; /* copy stays: the names point into it for the launcher's life */
}

int launch_parse_rsh(const char *words, launch_opts_t *o)
{
    char *copy = words ? strdup(words) : NULL;
    size_t n = words ? strlen(words) / 2 + 2 : 0;
    o->rsh = copy ? calloc(n, sizeof *o->rsh) : NULL;
    if (!o->rsh) {
        free(copy);
        return bg_cli_fail("launch", words ? "out of memory" : "--rsh needs a command, e.g. ssh or \"ip netns exec\"");
    }
    o->nrsh = 0;
    char *save = NULL;
    for (char *w = strtok_r(copy, " \t", &save); w; w = strtok_r(NULL, " \t", &save))
        o->rsh[o->nrsh++] = w;
    if (o->nrsh == 0)
        return bg_cli_fail("launch", "--rsh needs a command, e.g. ssh or \"ip netns exec\"");
    return 0;
}

/* Whether `brigade train` ARGS has the flag (--flag or --flag=...); *val_p: its value */
static bool launch_train_flag(char **cmd, const char *flag, const char **val_p)
{
    size_t k = strlen(flag);
    for (int i = 2; cmd[i]; i++) {
        if (!strcmp(cmd[i], "--"))
            break;
        if (!strncmp(cmd[i], flag, k) && (cmd[i][k] == 0 || cmd[i][k] == '=')) {
            if (val_p)
                *val_p = cmd[i][k] == '=' ? cmd[i] + k + 1 : cmd[i + 1] ? cmd[i + 1] : "";
            return true;
        }
    }
    return false;
}

int launch_check_elastic(launch_opts_t *o, bool brigade_train)
{
    const char *cmd = "launch";
    if (!o->el_max)
        return 0;
    int most = o->nhosts * o->per_host;
    if (!o->hosts)
        return bg_cli_fail(cmd, "--elastic needs --hosts: the hosts the ranks run on (a lost one is dropped)");
    if (!o->rsh)
        return bg_cli_fail(cmd, "--elastic needs --rsh: the command that runs a rank on a host, and probes it");
    if (o->el_min > o->el_max)
        return bg_cli_fail(cmd, "--elastic %d:%d: MIN is more than MAX", o->el_min, o->el_max);
    if (o->el_min > most)
        return bg_cli_fail(cmd, "--elastic %d:%d: MIN is more than the %d rank%s of --hosts (%d host%s x %d)", o->el_min,
                           o->el_max, most, launch_plural(most), o->nhosts, launch_plural(o->nhosts), o->per_host);
    if (o->el_max < o->per_host)
        return bg_cli_fail(cmd, "--elastic %d:%d: MAX is less than one host's %d ranks (--nproc-per-host)", o->el_min,
                           o->el_max, o->per_host);
    if (o->max_restarts < 1)
        return bg_cli_fail(cmd, "--elastic restarts the job on the hosts that remain: give --max-restarts N (N >= 1)");
    if (o->tolerate)
        return bg_cli_fail(cmd, "--elastic with %s: a job that goes on without some ranks is not restarted on fewer; "
                           "use one or the other", o->ps_auto ? "brigade train --ps" : "--tolerate-ranks");
    if (!brigade_train)
        return 0; /* another program: resuming and re-planning are its business (docs/launch.md) */
    const char *pp = NULL, *dp = NULL;
    if (!launch_train_flag(o->cmd, "--checkpoint-dir", NULL) || !launch_train_flag(o->cmd, "--checkpoint-every", NULL) ||
        !launch_train_flag(o->cmd, "--resume", NULL))
        return bg_cli_fail(cmd, "--elastic: brigade train must write checkpoints and resume from them after a restart: "
                           "give it --checkpoint-dir DIR --checkpoint-every N --resume");
    launch_train_flag(o->cmd, "--pp", &pp);
    launch_train_flag(o->cmd, "--dp", &dp);
    if (!(pp && !strcmp(pp, "auto")) && !(dp && !strcmp(dp, "auto")))
        return bg_cli_fail(cmd, "--elastic: brigade train's layout must follow the number of ranks: give it --dp auto "
                           "(or --pp auto)");
    return 0;
}

/* ---------------------------------------------------------------- probes */

/* Run `RSH HOST true` on every host not lost, at once, for at most
 * LAUNCH_PROBE_S; a host whose probe fails or times out is lost. Returns how
 * many were lost now. */
static int launch_probe(launch_t *L)
{
    launch_opts_t *o = &L->o;
    pid_t *pid = calloc((size_t)o->nhosts, sizeof *pid);
    int *st = calloc((size_t)o->nhosts, sizeof *st);
    char **argv = calloc((size_t)o->nrsh + 3, sizeof *argv);
    int lost = 0;
    if (!pid || !st || !argv) {
        free(pid);
        free(st);
        free(argv);
        return 0; /* no memory to probe: every host is kept, the attempt says the rest */
    }
    memcpy(argv, o->rsh, (size_t)o->nrsh * sizeof *argv);
    argv[o->nrsh + 1] = "true";
    for (int h = 0; h < o->nhosts; h++) {
        if (o->hosts[h].lost)
            continue;
        argv[o->nrsh] = (char *)o->hosts[h].name;
        pid[h] = fork();
        if (pid[h] == 0) {
            sigset_t none;
            sigemptyset(&none);
            sigprocmask(SIG_SETMASK, &none, NULL);
            int nul = open("/dev/null", O_RDWR);
            dup2(nul, 0);
            dup2(nul, 1);
            dup2(nul, 2);
            setpgid(0, 0);
            execvp(argv[0], argv);
            _exit(127);
        }
    }
    double until = launch_now() + LAUNCH_PROBE_S;
    for (int left = 1; left;) {
        left = 0;
        for (int h = 0; h < o->nhosts; h++) {
            if (pid[h] <= 0)
                continue;
            pid_t w = waitpid(pid[h], &st[h], WNOHANG);
            if (w == pid[h] || (w < 0 && errno != EINTR))
                pid[h] = -pid[h]; /* done: negated, so that it is neither waited for nor killed again */
            else
                left++;
        }
        if (left && launch_now() >= until) {
            for (int h = 0; h < o->nhosts; h++)
                if (pid[h] > 0) {
                    kill(-pid[h], SIGKILL);
                    kill(pid[h], SIGKILL);
                    while (waitpid(pid[h], NULL, 0) < 0 && errno == EINTR)
                        ;
                    st[h] = -1;
                    pid[h] = -pid[h];
                }
            break;
        }
        if (left)
            nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
    }
    for (int h = 0; h < o->nhosts; h++) {
        if (o->hosts[h].lost || pid[h] == 0)
            continue;
        if (st[h] == -1 || !WIFEXITED(st[h]) || WEXITSTATUS(st[h]) != 0) {
            char why[64];
            if (st[h] == -1)
                snprintf(why, sizeof why, "no answer within %g s", LAUNCH_PROBE_S);
            else if (WIFEXITED(st[h]))
                snprintf(why, sizeof why, "exit status %d", WEXITSTATUS(st[h]));
            else
                snprintf(why, sizeof why, "killed by signal %d", WTERMSIG(st[h]));
            char rsh[512];
            size_t at = 0;
            rsh[0] = 0;
            for (int k = 0; k < o->nrsh && at < sizeof rsh; k++)
                at += (size_t)snprintf(rsh + at, sizeof rsh - at, "%s ", o->rsh[k]);
            fprintf(stderr, "brigade launch: elastic: host %s is lost (`%s%s true`: %s); it is not used again\n",
                    o->hosts[h].name, rsh, o->hosts[h].name, why);
            o->hosts[h].lost = true;
            lost++;
        }
    }
    free(pid);
    free(st);
    free(argv);
    return lost;
}

/* ---------------------------------------------------------------- attempts */

int launch_hosts_pick(launch_t *L, int attempt, int last_rc)
{
    launch_opts_t *o = &L->o;
    if (!o->hosts)
        return 0;
    int old_world = o->n;
    if (o->el_max && o->rsh)
        launch_probe(L);
    int fit = o->el_max ? o->el_max / o->per_host : o->nhosts;
    L->nused = 0;
    for (int h = 0; h < o->nhosts && L->nused < fit; h++)
        if (!o->hosts[h].lost)
            L->used[L->nused++] = h;
    int world = L->nused * o->per_host, alive = 0;
    for (int h = 0; h < o->nhosts; h++)
        alive += !o->hosts[h].lost;
    if (o->el_max && world < o->el_min) {
        int rc = attempt > 0 && last_rc ? last_rc : 1;
        fprintf(stderr, "brigade launch: elastic: %d of %d host%s left, %d rank%s: fewer than --elastic %d:%d allows; "
                "giving up (exit code %d)\n", alive, o->nhosts, launch_plural(o->nhosts), world, launch_plural(world),
                o->el_min, o->el_max, rc);
        return rc;
    }
    o->n = world;
    if (!o->addr_given)
        o->addr = o->hosts[L->used[0]].addr;
    if (o->el_max && (attempt == 0 || world != old_world)) {
        char list[1024];
        size_t at = 0;
        list[0] = 0;
        for (int k = 0; k < L->nused && at < sizeof list; k++)
            at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", k ? "," : "", o->hosts[L->used[k]].name);
        if (attempt == 0)
            fprintf(stderr, "brigade launch: elastic: %d rank%s on %d host%s (%s)\n", world, launch_plural(world),
                    L->nused, launch_plural(L->nused), list);
        else
            fprintf(stderr, "brigade launch: elastic: world %d -> %d: %d rank%s on %d host%s (%s), master %s\n",
                    old_world, world, world, launch_plural(world), L->nused, launch_plural(L->nused), list, o->addr);
    }
    return 0;
}

int launch_rank_argv(launch_t *L, int r, char *const *vars, size_t nvars)
{
    const launch_opts_t *o = &L->o;
    if (!o->rsh)
        return 0;
    if (!L->exec_argv) {
        int ncmd = 0;
        while (o->cmd[ncmd])
            ncmd++;
        L->exec_argv = calloc((size_t)o->nrsh + 2 + nvars + (size_t)ncmd + 1, sizeof *L->exec_argv);
        if (!L->exec_argv) {
            fprintf(stderr, "brigade launch: out of memory\n");
            return 1;
        }
        memcpy(L->exec_argv, o->rsh, (size_t)o->nrsh * sizeof *L->exec_argv);
        L->exec_argv[o->nrsh + 1] = "env"; /* a remote shell does not carry our environment: name the variables */
        memcpy(L->exec_argv + o->nrsh + 2 + nvars, o->cmd, (size_t)ncmd * sizeof *L->exec_argv);
    }
    L->exec_argv[o->nrsh] = (char *)o->hosts[L->used[r / o->per_host]].name;
    memcpy(L->exec_argv + o->nrsh + 2, vars, nvars * sizeof *vars);
    return 0;
}

const char *launch_rank_where(const launch_t *L, int r)
{
    static char buf[300];
    if (!L->o.hosts || r < 0 || r >= L->o.n)
        return "";
    snprintf(buf, sizeof buf, " on host %s", L->o.hosts[L->used[r / L->o.per_host]].name);
    return buf;
}
