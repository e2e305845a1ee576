/* tools/launch_opts.c: `brigade launch`'s options and its usage text.
 *
 * Owns: parsing argv into launch_opts_t (values checked, the --tolerate-ranks
 * list, its default for brigade train --ps S, the exit timeout from
 * BRIGADE_TIMEOUT) and --help.
 * Must not: start, signal or wait for anything; the supervisor
 * (cmd_launch.c, launch_supervise.c) runs what it parsed. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/launch_impl.h"

/* ---------------------------------------------------------------- options */

static void launch_usage(FILE *f)
{
    fprintf(f,
            "usage: brigade launch -n N | --hosts LIST [options] [--] CMD [ARGS...]\n"
            "\n"
            "Start N processes (ranks) of CMD on this machine (or on --hosts), each with\n"
            "  BRIGADE_RANK (0..N-1), BRIGADE_LOCAL_RANK (= rank), BRIGADE_WORLD_SIZE (N),\n"
            "  BRIGADE_MASTER_ADDR, BRIGADE_MASTER_PORT, BRIGADE_JOB_TOKEN (random, per launch),\n"
            "  BRIGADE_RESTART_COUNT (0, then 1, 2, ... with --max-restarts)\n"
            "and the rest of the environment inherited (OMP_NUM_THREADS, when unset, becomes\n"
            "cores / N, at least 1). If a rank fails, the others are\n"
            "stopped and the launcher exits with that rank's status.\n"
            "\n"
            "options:\n"
            "  -n, --nproc N         number of ranks (1..%d), required without --hosts\n"
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
            "  --hosts LIST          run the ranks on these hosts (NAME or NAME=ADDR, comma-separated),\n"
            "                        --nproc-per-host each, in blocks: host 0 holds ranks 0..K-1; rank\n"
            "                        0's store listens on its host's ADDR (default: its NAME)\n"
            "  --nproc-per-host K    ranks on each host (default 1); replaces -n\n"
            "  --rsh CMD             how to run a rank on a host: CMD HOST env BRIGADE_...=... CMD ARGS\n"
            "                        (e.g. ssh, or \"ip netns exec\"); without it, here\n"
            "  --elastic MIN:MAX     with --hosts, --rsh and --max-restarts: before each start probe every\n"
            "                        host (CMD HOST true, %g s at most), drop the lost ones for good,\n"
            "                        and run on those left (MAX ranks at most; fewer than MIN: give\n"
            "                        up); brigade train needs --checkpoint-dir, --checkpoint-every,\n"
            "                        --resume and --dp auto (or --pp auto) to re-plan and resume\n"
            "  -v, --verbose         print a line when each rank starts and ends\n"
            "  -h, --help            this help\n"
            "\n"
            "exit code: 0 if every rank exits 0; else the first failing rank's exit code (a\n"
            "tolerated rank's when the others finish)\n"
            "(128+signal if it was killed), of the last attempt with --max-restarts; 124 on\n"
            "--timeout (which covers all attempts); 128+signal when the launcher\n"
            "is interrupted (130 for Ctrl-C, 143 for SIGTERM); 127 (126) when CMD is not\n"
            "found (not executable); 2 for bad usage. See docs/launch.md.\n",
            LAUNCH_MAX_RANKS, LAUNCH_PROBE_S);
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
int launch_parse(int argc, char **argv, launch_opts_t *o)
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
            o->addr_given = true;
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
        } else if (!strcmp(name, "--hosts")) {
            if (launch_parse_hosts(val, o))
                return 2;
        } else if (!strcmp(name, "--nproc-per-host")) {
            if (bg_cli_int(cmd, name, val, 1, LAUNCH_MAX_RANKS, &v))
                return 2;
            o->per_host = (int)v;
        } else if (!strcmp(name, "--rsh")) {
            if (launch_parse_rsh(val, o))
                return 2;
        } else if (!strcmp(name, "--elastic")) {
            char *end;
            long a = val ? strtol(val, &end, 10) : 0, b = a;
            if (a >= 1 && *end == ':')
                b = strtol(end + 1, &end, 10);
            if (!val || a < 1 || b < 1 || *end || a > LAUNCH_MAX_RANKS || b > LAUNCH_MAX_RANKS)
                return bg_cli_fail(cmd, "--elastic \"%s\": expected MIN:MAX, the fewest and most ranks the job runs on "
                                   "(1..%d), e.g. 2:4", val ? val : "", LAUNCH_MAX_RANKS);
            o->el_min = (int)a;
            o->el_max = (int)b;
        } else if (!strcmp(name, "--grace")) {
            if (bg_cli_double(cmd, name, val, 0, 86400, &o->grace_s))
                return 2;
        } else {
            return bg_cli_fail(cmd, "unknown option \"%s\" (see brigade launch --help)", a);
        }
    }
    if (o->per_host && !o->hosts)
        return bg_cli_fail(cmd, "--nproc-per-host needs --hosts (without it, -n ranks run on this machine)");
    if (o->rsh && !o->hosts)
        return bg_cli_fail(cmd, "--rsh needs --hosts: the hosts it runs the ranks on");
    if (o->hosts) {
        o->per_host = o->per_host ? o->per_host : 1;
        if ((long)o->nhosts * o->per_host > LAUNCH_MAX_RANKS)
            return bg_cli_fail(cmd, "--hosts: %d hosts x %d ranks is more than %d ranks", o->nhosts, o->per_host,
                               LAUNCH_MAX_RANKS);
        if (have_n && o->n != o->nhosts * o->per_host)
            return bg_cli_fail(cmd, "-n %d, but --hosts gives %d host%s x %d rank%s (--nproc-per-host): leave -n out",
                               o->n, o->nhosts, launch_plural(o->nhosts), o->per_host, launch_plural(o->per_host));
        o->n = o->nhosts * o->per_host; /* the most; --elastic may start fewer */
        have_n = true;
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
    if (launch_check_elastic(o, launch_is_brigade_train(o->cmd)))
        return 2;
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
