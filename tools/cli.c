/* tools/cli.c: argument-parsing helpers for the brigade CLI. */
#include "tools/cli.h"

#include <ctype.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "brigade/schedule.h"
#include "core/util.h"

int bg_cli_fail(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "brigade %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 2;
}

int bg_cli_status(const char *cmd, bg_status_t st)
{
    const char *msg = bg_last_error();
    fprintf(stderr, "brigade %s: %s%s%s\n", cmd, bg_status_string(st), *msg ? ": " : "", msg);
    return 1;
}

/* Optimal string alignment distance, case-insensitive; stops early past max. */
static int edit_distance(const char *a, const char *b, int max)
{
    size_t n = strlen(a), m = strlen(b);
    if (n > 64 || m > 64)
        return max + 1;
    int d[65][65];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            int best = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) && tolower((unsigned char)a[i - 2]) == cb &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

const char *bg_cli_nearest(const char *got, const char *const *names)
{
    size_t len = strlen(got);
    int max = len / 3 > 2 ? (int)(len / 3) : 2, best = max + 1;
    const char *hit = NULL;
    for (; *names; names++) {
        int e = edit_distance(got, *names, max);
        if (e < best)
            best = e, hit = *names;
    }
    return hit;
}

int bg_cli_unknown_option(const char *cmd, const char *arg, const char *const *names)
{
    char key[128];
    snprintf(key, sizeof key, "%.*s", (int)strcspn(arg, "="), arg); /* --stpes=3 -> --stpes */
    const char *near = bg_cli_nearest(key, names);
    if (near)
        return bg_cli_fail(cmd, "unknown option \"%s\" (did you mean %s?)", key, near);
    return bg_cli_fail(cmd, "unknown option \"%s\" (see brigade %s --help)", key, cmd);
}

int bg_cli_getopt_error(const char *cmd, char **argv, int optind_now, const struct option *opts)
{
    const char *arg = optind_now >= 1 ? argv[optind_now - 1] : "";
    size_t nopts = 0;
    for (const struct option *o = opts; o->name; o++)
        nopts++;
    if (arg[0] == '-' && arg[1] == '-') {
        const char *name = arg + 2;
        size_t len = strcspn(name, "=");
        const struct option *hit = NULL;
        int nhit = 0;
        char amb[512] = "";
        for (const struct option *o = opts; o->name; o++) {
            if (strncmp(o->name, name, len))
                continue;
            if (strlen(o->name) == len) { /* exact: a value problem */
                hit = o, nhit = 1;
                break;
            }
            hit = o, nhit++;
            size_t used = strlen(amb);
            snprintf(amb + used, sizeof amb - used, "%s--%s", used ? ", " : "", o->name);
        }
        if (nhit == 1 && hit->has_arg == required_argument && !name[len])
            return bg_cli_fail(cmd, "--%s needs a value", hit->name);
        if (nhit == 1 && hit->has_arg == no_argument && name[len] == '=')
            return bg_cli_fail(cmd, "--%s takes no value", hit->name);
        if (nhit > 1)
            return bg_cli_fail(cmd, "option \"%.*s\" is ambiguous: %s", (int)(len + 2), arg, amb);
    }
    const char **names = calloc(nopts + 1, sizeof(*names));
    char *buf = malloc(nopts * 64 + 1);
    if (!names || !buf) {
        free(names), free(buf);
        return bg_cli_fail(cmd, "unknown option \"%s\"", arg);
    }
    for (size_t i = 0; i < nopts; i++) {
        snprintf(buf + i * 64, 64, "--%s", opts[i].name);
        names[i] = buf + i * 64;
    }
    int rc = bg_cli_unknown_option(cmd, arg, names);
    free(names);
    free(buf);
    return rc;
}

int bg_cli_choice(const char *cmd, const char *flag, const char *val, const char *const *choices)
{
    char list[512] = "";
    int n = 0;
    for (; choices[n]; n++)
        if (val && !strcmp(val, choices[n]))
            return n;
    for (int i = 0; i < n; i++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", choices[i]);
    }
    const char *near = val ? bg_cli_nearest(val, choices) : NULL;
    if (near)
        bg_cli_fail(cmd, "%s must be %s%s, got \"%s\" (did you mean %s?)", flag, n > 2 ? "one of " : "", list, val,
                    near);
    else
        bg_cli_fail(cmd, "%s must be %s%s, got \"%s\"", flag, n > 2 ? "one of " : "", list, val ? val : "");
    return -1;
}

const char *const *bg_cli_schedule_names(void)
{
    static const char *names[BG_SCHED_CUSTOM + 1];
    for (int k = 0; k < BG_SCHED_CUSTOM; k++)
        names[k] = bg_schedule_kind_name((bg_schedule_kind_t)k);
    return names;
}

int bg_cli_check_json_object(const char *cmd, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "brigade %s: cannot open %s: %s\n", cmd, path, strerror(errno));
        return 1;
    }
    json_error_t err;
    json_t *root = json_loadf(f, 0, &err);
    fclose(f);
    if (!root) {
        fprintf(stderr, "brigade %s: %s: line %d column %d: %s\n", cmd, path, err.line, err.column, err.text);
        return 1;
    }
    int ok = json_is_object(root);
    const char *found = json_is_array(root) ? "an array" : json_is_string(root) ? "a string" : "a number or literal";
    json_decref(root);
    if (!ok) {
        fprintf(stderr, "brigade %s: %s: expected a JSON object, found %s\n", cmd, path, found);
        return 1;
    }
    return 0;
}

bg_backend_params_t bg_cli_backend_params(int num_threads)
{
    bg_backend_params_t p = BG_BACKEND_PARAMS_INIT;
    p.num_threads = num_threads;
    p.set_blas_threads = 1;
    p.tune_malloc = 1;
    return p;
}

bg_comm_params_t bg_cli_comm_params(void)
{
    bg_comm_params_t p = BG_COMM_PARAMS_INIT;
    p.ucx_log_handler = 1;
    return p;
}

int bg_cli_int(const char *cmd, const char *flag, const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    if (!s) {
        bg_cli_fail(cmd, "%s needs a value", flag);
        return -1;
    }
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) {
        bg_cli_fail(cmd, "%s expects an integer, got \"%s\"", flag, s);
        return -1;
    }
    if (v < lo || v > hi) {
        bg_cli_fail(cmd, "%s must be in [%lld, %lld], got %lld", flag, lo, hi, v);
        return -1;
    }
    *out = v;
    return 0;
}

int bg_cli_double(const char *cmd, const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    if (!s) {
        bg_cli_fail(cmd, "%s needs a value", flag);
        return -1;
    }
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        bg_cli_fail(cmd, "%s expects a number, got \"%s\"", flag, s);
        return -1;
    }
    if (v < lo || v > hi) {
        bg_cli_fail(cmd, "%s must be in [%g, %g], got %g", flag, lo, hi, v);
        return -1;
    }
    *out = v;
    return 0;
}

int bg_cli_bytes(const char *cmd, const char *flag, const char *s, uint64_t *out)
{
    if (!s) {
        bg_cli_fail(cmd, "%s needs a value", flag);
        return -1;
    }
    if (bg_parse_bytes(s, out) != 0) {
        bg_cli_fail(cmd, "%s expects a positive size like 512M or 24G, got \"%s\"", flag, s);
        return -1;
    }
    return 0;
}

int bg_cli_bytes_list(const char *cmd, const char *flag, const char *s, uint64_t *out, int max, int *n_p)
{
    char buf[8192];
    if (!s || !*s)
        return bg_cli_fail(cmd, "%s needs a value like 24G or 80G,40G", flag), -1;
    if (strlen(s) >= sizeof(buf))
        return bg_cli_fail(cmd, "%s list too long", flag), -1;
    snprintf(buf, sizeof(buf), "%s", s);
    int n = 0;
    char *p = buf;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = 0;
        if (!*p)
            return bg_cli_fail(cmd, "%s: empty entry %d in \"%s\"", flag, n, s), -1;
        if (n >= max)
            return bg_cli_fail(cmd, "%s: more than %d entries", flag, max), -1;
        char *num_end;
        double num = strtod(p, &num_end);
        if (*p == '-' || (num_end != p && num <= 0))
            return bg_cli_fail(cmd, "%s entry %d is \"%s\": a size must be > 0", flag, n, p), -1;
        if (bg_cli_bytes(cmd, flag, p, &out[n]))
            return -1;
        if (out[n] == 0)
            return bg_cli_fail(cmd, "%s entry %d is \"%s\": a size must be > 0", flag, n, p), -1;
        n++;
        if (!comma)
            break;
        p = comma + 1;
    }
    *n_p = n;
    return 0;
}

int bg_cli_int_list(const char *cmd, const char *flag, const char *s, long long *out, int max, int *n_out)
{
    int n = 0;
    const char *p = s;
    if (!s || !*s) {
        bg_cli_fail(cmd, "%s needs a comma-separated list", flag);
        return -1;
    }
    while (*p) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p || (*end && *end != ',')) {
            bg_cli_fail(cmd, "%s: \"%s\" is not a comma-separated list of integers", flag, s);
            return -1;
        }
        if (n == max) {
            bg_cli_fail(cmd, "%s: more than %d entries", flag, max);
            return -1;
        }
        out[n++] = v;
        p = *end ? end + 1 : end;
        if (*end && !*p) {
            bg_cli_fail(cmd, "%s: \"%s\" ends with a comma", flag, s);
            return -1;
        }
    }
    *n_out = n;
    return 0;
}

int bg_cli_model_option(const char *cmd, int code, const char *arg, bg_model_config_t *m)
{
    long long v;
    const char *flag = NULL;
    int *dst = NULL;
    long long lo = 1, hi = 1 << 20;
    switch (code) {
    case BG_CLI_O_MODEL:
    {
        static const char *const kinds[] = {"gpt", "mlp", "llama", NULL};
        int k = bg_cli_choice(cmd, "--model", arg, kinds);
        if (k < 0)
            return 2;
        m->kind = k == 0 ? BG_MODEL_GPT : k == 1 ? BG_MODEL_MLP : BG_MODEL_LLAMA;
        return 0;
    }
    case BG_CLI_O_ROPE_THETA:
    {
        double x;
        if (bg_cli_double(cmd, "--rope-theta", arg, 1.0001, 1e12, &x))
            return 2;
        m->rope_theta = (float)x;
        return 0;
    }
    case BG_CLI_O_TIE:
        m->tie_embeddings = 1;
        return 0;
    case BG_CLI_O_CAPACITY:
    case BG_CLI_O_MOE_AUX:
    {
        double x;
        const char *f = code == BG_CLI_O_CAPACITY ? "--capacity-factor" : "--moe-aux-coef";
        if (bg_cli_double(cmd, f, arg, 0.0, 1e6, &x))
            return 2;
        *(code == BG_CLI_O_CAPACITY ? &m->capacity_factor : &m->moe_aux_coef) = (float)x;
        return 0;
    }
    case BG_CLI_O_MOE_GATE:
    {
        static const char *const kinds[] = {"softmax", "sigmoid", NULL};
        int k = bg_cli_choice(cmd, "--moe-gate", arg, kinds);
        if (k < 0)
            return 2;
        m->moe_gate = k == 0 ? BG_MOE_SOFTMAX : BG_MOE_SIGMOID;
        return 0;
    }
    case BG_CLI_O_PRECISION:
    {
        static const char *const kinds[] = {"fp32", "bf16", NULL};
        int k = bg_cli_choice(cmd, "--precision", arg, kinds);
        if (k < 0)
            return 2;
        m->precision = k == 0 ? BG_F32 : BG_BF16;
        return 0;
    }
    case BG_CLI_O_SEED:
        if (bg_cli_int(cmd, "--seed", arg, 0, INT64_MAX, &v))
            return 2;
        m->seed = (uint64_t)v;
        return 0;
    case BG_CLI_O_LAYERS: flag = "--layers", dst = &m->layers, hi = 100000; break;
    case BG_CLI_O_DMODEL: flag = "--d-model", dst = &m->d_model; break;
    case BG_CLI_O_HEADS: flag = "--heads", dst = &m->heads, hi = 4096; break;
    case BG_CLI_O_KV_HEADS: flag = "--kv-heads", dst = &m->kv_heads, hi = 4096; break;
    case BG_CLI_O_FFN: flag = "--ffn-hidden", dst = &m->ffn_hidden; break;
    case BG_CLI_O_EXPERTS: flag = "--experts", dst = &m->experts, lo = 0; break;
    case BG_CLI_O_TOP_K: flag = "--top-k", dst = &m->top_k, hi = 64; break;
    case BG_CLI_O_MOE_EVERY: flag = "--moe-every", dst = &m->moe_every; break;
    case BG_CLI_O_EP: flag = "--ep", dst = &m->ep, hi = 4096; break;
    case BG_CLI_O_SEQ: flag = "--seq", dst = &m->seq_len; break;
    case BG_CLI_O_VOCAB: flag = "--vocab", dst = &m->vocab, lo = 2; break;
    case BG_CLI_O_INF: flag = "--in-features", dst = &m->in_features, hi = 4096; break;
    case BG_CLI_O_CLASSES: flag = "--classes", dst = &m->classes, lo = 2; break;
    default: return bg_cli_fail(cmd, "internal: option code %d is not a model option", code);
    }
    if (bg_cli_int(cmd, flag, arg, lo, hi, &v))
        return 2;
    *dst = (int)v;
    return 0;
}

/* A port that was free on 127.0.0.1 a moment ago (binding port 0 and releasing it). */
int bg_cli_free_port(int *port_p)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(s, (struct sockaddr *)&a, &len) != 0) {
        int e = errno;
        close(s);
        errno = e;
        return -1;
    }
    close(s);
    *port_p = ntohs(a.sin_port);
    return 0;
}

int bg_cli_job_token(char *hex, size_t cap)
{
    unsigned char raw[BG_CLI_TOKEN_CHARS / 2];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t k = read(fd, raw + got, sizeof raw - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            int e = k < 0 ? errno : EIO;
            close(fd);
            errno = e;
            return -1;
        }
        got += (size_t)k;
    }
    close(fd);
    if (cap < 2 * sizeof raw + 1)
        return -1;
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    return 0;
}
