/* tests/transport/test_transport_flood.c: the rendezvous store under attack.
 * A job of 4 ranks (rank 3 joins 1.5 s late) rendezvouses twice: once alone
 * (the baseline) and once while another process holds about 1,300 hostile
 * connections to rank 0's store (idle, slowloris, garbage, 1 MiB value
 * announcements that send their data, wrong tokens), in two waves, the second
 * just before the late rank joins, re-opening what the store drops. Every rank
 * must join, no later than 1 s after its baseline time; rank 0's peak resident
 * memory must stay within 32 MiB of the baseline's (the old store buffered
 * every announced value: ~1 MiB per connection), and its log must summarise
 * the drops in a few lines, not one per connection. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <cmocka.h>

#include "brigade/core.h"
#include "brigade/transport.h"
#include "ranks.h"
#include "transport/store.h"
#include "transport/transport_impl.h"

#define WORLD 4
#define LATE_S 1.5   /* rank 3 starts this long after the others */
#define ATTACK_S 3.5 /* the attacker stops then */

enum { K_IDLE, K_SLOW, K_BIG, K_GARBAGE, K_WRONG, K_N };
static int counts[K_N] = {700, 200, 200, 100, 100}; /* scaled down if the file limit is low */

typedef struct {
    double t0;
    int attack;
    double join_s[WORLD];    /* when bg_comm_create returned, seconds after t0 */
    long rss_kb, hwm_kb;     /* rank 0: VmRSS after the attack, VmHWM (peak) */
    long rss_start_kb;       /* rank 0: VmRSS before bg_comm_create */
    uint64_t dropped;        /* rank 0's store: connections dropped or refused */
    int warn_lines;          /* rank 0: WARN lines of the store subsystem */
    int attacker_opened;     /* connections the attacker opened */
} flood_shared_t;

static flood_shared_t *sh;

static void sleep_until(double t)
{
    double left = t - bg_now();
    if (left <= 0)
        return;
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    nanosleep(&ts, NULL);
}

static long proc_status_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, field, n))
            v = atol(line + n + 1);
    if (f)
        fclose(f);
    return v;
}

/* ---- the attacker ------------------------------------------------------------- */

typedef struct {
    int fd, kind;
    size_t sent; /* bytes of the payload sent so far */
} slot_t;

static int open_nb(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

static uint8_t *big_payload;
static size_t big_len;

/* Push what this kind sends (non-blocking; errors mean the store dropped it). */
static void attack_send(slot_t *s, int slow_tick)
{
    static const char junk[] = "GET / HTTP/1.1\r\nHost: brigade\r\n\r\nthis is not the store's protocol";
    static uint8_t hello_wrong[64];
    static size_t hello_wrong_len;
    if (!hello_wrong_len) {
        size_t len;
        uint8_t *m = bg__msg_encode(BG__OP_HELLO, BG__ROLE_KV, 0, "not-the-token-0123456789abcdef", 30, NULL, 0, &len);
        memcpy(hello_wrong, m, len);
        hello_wrong_len = len;
        free(m);
    }
    const uint8_t *p = NULL;
    size_t n = 0;
    switch (s->kind) {
    case K_SLOW: /* a hello header, one byte per tick */
        p = hello_wrong;
        n = slow_tick && s->sent < hello_wrong_len - 1 ? s->sent + 1 : s->sent;
        break;
    case K_BIG: /* all but the last byte: a store that buffers it holds 1 MiB per connection */
        p = big_payload;
        n = big_len - 1;
        break;
    case K_GARBAGE:
        p = (const uint8_t *)junk;
        n = sizeof(junk);
        break;
    case K_WRONG:
        p = hello_wrong;
        n = hello_wrong_len;
        break;
    default:
        return;
    }
    while (s->sent < n) {
        ssize_t k = send(s->fd, p + s->sent, n - s->sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k <= 0)
            return;
        s->sent += (size_t)k;
    }
}

static void attacker(int port, double t0)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int total = 0;
    for (int k = 0; k < K_N; k++)
        total += counts[k];
    slot_t *slots = calloc((size_t)total, sizeof(*slots));
    /* a hello announcing a 1 MiB value, and the value */
    bg__store_hdr_t h = {.magic = BG__STORE_MAGIC, .op = BG__OP_HELLO, .key_len = 6,
                         .val_len = BG_STORE_MAX_VALUE, .arg = 0};
    big_len = sizeof(h) + 6 + BG_STORE_MAX_VALUE;
    big_payload = calloc(1, big_len);
    memcpy(big_payload, &h, sizeof(h));
    memcpy(big_payload + sizeof(h), "secret", 6);
    memset(big_payload + sizeof(h) + 6, 'x', BG_STORE_MAX_VALUE);
    for (int i = 0, k = 0, left = counts[0]; i < total; i++) {
        while (left == 0)
            left = counts[++k];
        slots[i] = (slot_t){.fd = -1, .kind = k};
        left--;
    }
    /* the store is up when a plain connection is accepted */
    while (bg_now() < t0 + ATTACK_S) {
        int fd = open_nb(port);
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int up = fd >= 0 && poll(&pf, 1, 100) == 1 && !(pf.revents & (POLLERR | POLLHUP));
        if (fd >= 0)
            close(fd);
        if (up)
            break;
        sleep_until(bg_now() + 0.01);
    }
    int opened = 0;
    double next_tick = 0, wave2 = t0 + LATE_S - 0.1, reopen_at = 0;
    int wave = 0;
    while (bg_now() < t0 + ATTACK_S) {
        double now = bg_now();
        int tick = now >= next_tick;
        if (tick)
            next_tick = now + 0.1;
        int new_wave = (wave == 0) || (wave == 1 && now >= wave2);
        if (new_wave)
            wave++;
        int reopen = now >= reopen_at;
        if (reopen)
            reopen_at = now + 0.5;
        for (int i = 0; i < total; i++) {
            slot_t *s = &slots[i];
            if (s->fd >= 0 && tick) { /* dropped by the store? */
                char b[64];
                ssize_t k = recv(s->fd, b, sizeof(b), MSG_DONTWAIT);
                if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
                    close(s->fd);
                    s->fd = -1;
                }
            }
            /* a wave opens every kind; in between, dropped idle and slow ones come back */
            if (s->fd < 0 && (new_wave || (reopen && (s->kind == K_IDLE || s->kind == K_SLOW)))) {
                s->fd = open_nb(port);
                s->sent = 0;
                opened += s->fd >= 0;
            }
            if (s->fd >= 0)
                attack_send(s, tick);
        }
        sleep_until(bg_now() + 0.01);
    }
    sh->attacker_opened = opened;
    _exit(0);
}

/* ---- the job ------------------------------------------------------------------ */

static void count_warn(bg_log_level_t level, const char *subsystem, int rank, const char *message, void *arg)
{
    (void)rank;
    (void)arg;
    if (level == BG_LOG_WARN && !strcmp(subsystem, "store")) {
        sh->warn_lines++;
        fprintf(stderr, "[rank 0 store WARN] %s\n", message);
    }
}

static int rank_flood(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    pid_t att = 0;
    if (rank == 0) {
        sh->rss_start_kb = proc_status_kb("VmRSS:");
        bg_log_set_sink(count_warn, NULL);
    }
    if (rank == 1 && sh->attack) {
        att = fork();
        if (att == 0)
            attacker(atoi(getenv("BRIGADE_MASTER_PORT")), sh->t0);
    }
    sleep_until(sh->t0 + (rank == 0 ? 0 : rank == 3 ? LATE_S : 0.3));
    bg_comm_t *c;
    RK_OK(bg_comm_create(NULL, &c));
    sh->join_s[rank] = bg_now() - sh->t0;
    sleep_until(sh->t0 + ATTACK_S + 0.3); /* the attack is over */
    RK_OK(bg_store_barrier(c));
    if (rank == 0) {
        sh->rss_kb = proc_status_kb("VmRSS:");
        sh->hwm_kb = proc_status_kb("VmHWM:");
        sh->dropped = bg__store_server_dropped(c->server);
    }
    RK_OK(bg_comm_destroy(c));
    if (att > 0) {
        kill(att, SIGKILL);
        waitpid(att, NULL, 0);
    }
    return 0;
}

static void run_job(int attack, flood_shared_t *out)
{
    memset(sh, 0, sizeof(*sh));
    sh->attack = attack;
    sh->t0 = bg_now();
    const char *env[] = {"BRIGADE_TIMEOUT=20", NULL};
    bgt_result_t r;
    int rc = bgt_run_ranks(WORLD, rank_flood, NULL, 40, env, -1, &r);
    *out = *sh;
    if (rc != 0)
        fail_msg("%s: the job failed (see the ranks' messages above)", attack ? "under attack" : "baseline");
}

static void test_flood_does_not_stop_rendezvous(void **st)
{
    (void)st;
    /* the attacker's ~1,300 descriptors and rank 0's own must fit under the limit */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < 2048 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < 1600) {
        double f = (double)(rl.rlim_cur - 300) / 1300.0;
        for (int k = 0; k < K_N; k++)
            counts[k] = (int)(counts[k] * f);
        printf("open-file limit %ld: attack scaled to %.0f%%\n", (long)rl.rlim_cur, 100 * f);
    }
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(sh != MAP_FAILED);
    flood_shared_t base, att;
    run_job(0, &base);
    run_job(1, &att);
    printf("baseline: joined at");
    for (int r = 0; r < WORLD; r++)
        printf(" %.3f", base.join_s[r]);
    printf(" s; rank 0 RSS %ld kB before, %ld kB after, peak %ld kB\n", base.rss_start_kb, base.rss_kb, base.hwm_kb);
    printf("attack (%d connections opened): joined at", att.attacker_opened);
    for (int r = 0; r < WORLD; r++)
        printf(" %.3f", att.join_s[r]);
    printf(" s; rank 0 RSS %ld kB before, %ld kB after, peak %ld kB; store dropped %llu; %d WARN lines\n",
           att.rss_start_kb, att.rss_kb, att.hwm_kb, (unsigned long long)att.dropped, att.warn_lines);
    assert_true(att.attacker_opened >= 1000);
    for (int r = 0; r < WORLD; r++)
        if (att.join_s[r] > base.join_s[r] + 1.0)
            fail_msg("rank %d joined at %.3f s under attack, %.3f s without: more than 1 s later", r,
                     att.join_s[r], base.join_s[r]);
    if (att.hwm_kb - base.hwm_kb > 32 * 1024)
        fail_msg("rank 0's peak RSS grew by %ld kB under attack (limit 32 MiB)", att.hwm_kb - base.hwm_kb);
    assert_true(att.dropped >= 900);
    /* one summary line per 5 s interval, not one per connection */
    assert_true(att.warn_lines <= 4);
    munmap(sh, sizeof(*sh));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flood_does_not_stop_rendezvous),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
