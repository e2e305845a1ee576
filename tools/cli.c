/* tools/cli.c: argument-parsing helpers for the brigade CLI. */
#include "tools/cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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
    char *end;
    errno = 0;
    if (!s) {
        bg_cli_fail(cmd, "%s needs a value", flag);
        return -1;
    }
    double v = strtod(s, &end);
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; break;
        case 'm': case 'M': mul = 1024.0 * 1024; break;
        case 'g': case 'G': mul = 1024.0 * 1024 * 1024; break;
        case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
        default: mul = -1;
        }
        end++;
        if (*end == 'i' || *end == 'B')
            end++;
        if (*end == 'B')
            end++;
    }
    if (errno || end == s || *end || mul < 0 || !(v > 0)) {
        bg_cli_fail(cmd, "%s expects a positive size like 512M or 24G, got \"%s\"", flag, s);
        return -1;
    }
    *out = (uint64_t)(v * mul);
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
        if (!strcmp(arg, "gpt"))
            m->kind = BG_MODEL_GPT;
        else if (!strcmp(arg, "mlp"))
            m->kind = BG_MODEL_MLP;
        else
            return bg_cli_fail(cmd, "--model must be gpt or mlp, got \"%s\"", arg);
        return 0;
    case BG_CLI_O_TIE:
        m->tie_embeddings = 1;
        return 0;
    case BG_CLI_O_SEED:
        if (bg_cli_int(cmd, "--seed", arg, 0, INT64_MAX, &v))
            return 2;
        m->seed = (uint64_t)v;
        return 0;
    case BG_CLI_O_LAYERS: flag = "--layers", dst = &m->layers, hi = 100000; break;
    case BG_CLI_O_DMODEL: flag = "--d-model", dst = &m->d_model; break;
    case BG_CLI_O_HEADS: flag = "--heads", dst = &m->heads, hi = 4096; break;
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
