/* tools/cli.h: small helpers shared by the CLI's subcommands: strict number
 * parsing that names the flag, and error printing. The CLI is the only part
 * of brigade that prints to the user or chooses an exit code. */
#ifndef BG_TOOLS_CLI_H
#define BG_TOOLS_CLI_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

#include "brigade/brigade.h"

#define BG_COMMAND(name, help) int bg_cmd_##name(int argc, char **argv);
#include "tools/commands.h"
#undef BG_COMMAND

/* Print "brigade <cmd>: <message>" to stderr; returns 2 (usage) or 1. */
int bg_cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Print the library's last error for a failed status; returns 1. */
int bg_cli_status(const char *cmd, bg_status_t st);

/* The CLI is the host program, so it takes the process-wide settings the
 * library leaves alone by default: OpenBLAS single-threaded (the backend's
 * tiles carry GEMM's parallelism), glibc's malloc thresholds raised, and UCX's
 * log handler that keeps a peer's death in a shared-memory copy from aborting.
 * Every subcommand that creates a backend or a communicator starts from these. */
bg_backend_params_t bg_cli_backend_params(int num_threads);
bg_comm_params_t bg_cli_comm_params(void);

/* Misspellings. The entry of `names` (NULL-terminated) nearest to `got` by
 * edit distance (an insertion, deletion, substitution or swap of two
 * neighbours counts 1), or NULL when none is within max(2, len/3) edits. */
const char *bg_cli_nearest(const char *got, const char *const *names);
/* An argument that is not one of the command's flags `names` (each with its
 * dashes): prints `unknown option "--stpes" (did you mean --steps?)` and
 * returns 2. */
int bg_cli_unknown_option(const char *cmd, const char *arg, const char *const *names);
/* getopt_long (opterr = 0) returned '?' or ':' for argv[optind - 1]: says
 * whether the flag needs a value, is ambiguous or is unknown (with the
 * nearest of opts); returns 2. */
int bg_cli_getopt_error(const char *cmd, char **argv, int optind_now, const struct option *opts);
/* A value that must be one of `choices` (NULL-terminated): its index, or -1
 * after `--flag must be one of a, b or c, got "x" (did you mean b?)`. */
int bg_cli_choice(const char *cmd, const char *flag, const char *val, const char *const *choices);
/* The schedule names (gpipe ... zbv), NULL-terminated, for bg_cli_choice. */
const char *const *bg_cli_schedule_names(void);
/* Before the library reads a JSON file the CLI was given: 0 when it opens
 * and parses to a JSON object, else 1 after "cannot open FILE: <errno
 * text>", "FILE: line L column C: <parser's text>" or "FILE: expected a
 * JSON object, found an array". */
int bg_cli_check_json_object(const char *cmd, const char *path);

/* Parse helpers: 0 on success, else print a message naming the flag and return -1. */
int bg_cli_int(const char *cmd, const char *flag, const char *s, long long lo, long long hi, long long *out);
int bg_cli_double(const char *cmd, const char *flag, const char *s, double lo, double hi, double *out);
/* Sizes with an optional K/M/G/T suffix (powers of 1024): "24G". */
int bg_cli_bytes(const char *cmd, const char *flag, const char *s, uint64_t *out);
/* A comma-separated list of sizes (24G or 80G,80G,40G), each > 0, at most max: 0, or -1 after the message. */
int bg_cli_bytes_list(const char *cmd, const char *flag, const char *s, uint64_t *out, int max, int *n_p);
/* Comma-separated integers: "3,2,2". *n_out entries written, at most max. */
int bg_cli_int_list(const char *cmd, const char *flag, const char *s, long long *out, int max, int *n_out);

/* A getopt_long case for an integer flag in [lo, hi] stored into dst; the
 * caller declares `long long v`. A bad value prints the message and returns 2. */
#define BG_CLI_INT_CASE(cmd, code, flag, lo, hi, dst)                                                        \
    case code:                                                                                                 \
        if (bg_cli_int(cmd, flag, optarg, lo, hi, &v))                                                         \
            return 2;                                                                                          \
        dst = (int)v;                                                                                          \
        break;

/* The model flags `brigade train` and `brigade plan` share. Put
 * BG_CLI_MODEL_OPTIONS in a getopt_long table and give every code >=
 * BG_CLI_MODEL_FIRST to bg_cli_model_option(). */
enum {
    BG_CLI_MODEL_FIRST = 1000,
    BG_CLI_O_MODEL = BG_CLI_MODEL_FIRST, BG_CLI_O_LAYERS, BG_CLI_O_DMODEL, BG_CLI_O_HEADS, BG_CLI_O_SEQ,
    BG_CLI_O_VOCAB, BG_CLI_O_INF, BG_CLI_O_CLASSES, BG_CLI_O_SEED, BG_CLI_O_TIE, BG_CLI_O_PRECISION, BG_CLI_O_KV_HEADS, BG_CLI_O_FFN,
    BG_CLI_O_ROPE_THETA, BG_CLI_O_EXPERTS, BG_CLI_O_TOP_K, BG_CLI_O_MOE_EVERY, BG_CLI_O_CAPACITY, BG_CLI_O_MOE_AUX,
    BG_CLI_O_MOE_GATE, BG_CLI_O_EP, BG_CLI_MODEL_LAST
};
#define BG_CLI_MODEL_OPTIONS                                                                                   \
    {"model", required_argument, 0, BG_CLI_O_MODEL}, {"layers", required_argument, 0, BG_CLI_O_LAYERS},        \
    {"d-model", required_argument, 0, BG_CLI_O_DMODEL}, {"heads", required_argument, 0, BG_CLI_O_HEADS},       \
    {"seq", required_argument, 0, BG_CLI_O_SEQ}, {"vocab", required_argument, 0, BG_CLI_O_VOCAB},              \
    {"in-features", required_argument, 0, BG_CLI_O_INF}, {"classes", required_argument, 0, BG_CLI_O_CLASSES},  \
    {"seed", required_argument, 0, BG_CLI_O_SEED}, {"tie-embeddings", no_argument, 0, BG_CLI_O_TIE},          \
    {"precision", required_argument, 0, BG_CLI_O_PRECISION}, {"kv-heads", required_argument, 0, BG_CLI_O_KV_HEADS}, \
    {"ffn-hidden", required_argument, 0, BG_CLI_O_FFN}, {"rope-theta", required_argument, 0, BG_CLI_O_ROPE_THETA}, \
    {"experts", required_argument, 0, BG_CLI_O_EXPERTS}, {"top-k", required_argument, 0, BG_CLI_O_TOP_K},      \
    {"moe-every", required_argument, 0, BG_CLI_O_MOE_EVERY}, {"capacity-factor", required_argument, 0, BG_CLI_O_CAPACITY}, \
    {"moe-aux-coef", required_argument, 0, BG_CLI_O_MOE_AUX}, {"moe-gate", required_argument, 0, BG_CLI_O_MOE_GATE}, \
    {"ep", required_argument, 0, BG_CLI_O_EP}
/* Apply one model flag to *m: 0 on success, else the message is printed and 2 returned. */
int bg_cli_model_option(const char *cmd, int code, const char *arg, bg_model_config_t *m);
/* The model flags' help lines. */
#define BG_CLI_MODEL_HELP                                                                                      \
    "  --model gpt|llama|mlp  model family (default gpt); llama: RMSNorm, SwiGLU, rotary positions,\n"         \
    "                         grouped-query attention, no biases (docs/layers.md)\n"                           \
    "  --layers N             GPT, Llama: transformer blocks; MLP: hidden layers (default 4)\n"                \
    "  --d-model N            width (default 128)\n"                                                           \
    "  --heads N              GPT, Llama: attention heads, must divide d-model (default 4)\n"                  \
    "  --kv-heads N           Llama: key/value heads, must divide heads (default: heads)\n"                    \
    "  --ffn-hidden N         Llama: SwiGLU hidden size (default 8 d-model / 3 rounded up to 64)\n"            \
    "  --rope-theta X         Llama: rotary base (default 10000)\n"                                            \
    "  --experts E            GPT, Llama: MoE blocks of E SwiGLU experts (hidden size as --ffn-hidden; default 0:\n" \
    "                         dense; under --tp whole on every member; not with --sequence-parallel)\n"        \
    "  --top-k K              MoE: experts per token (default 2)\n"                                            \
    "  --moe-every N          MoE: every N-th block's MLP is an MoE (default 1: every block)\n"                 \
    "  --capacity-factor F    MoE: an expert takes at most F times its share of a microbatch's tokens, the\n"   \
    "                         rest dropped and counted (default 0: dropless)\n"                                \
    "  --moe-aux-coef X       MoE: coefficient of the load-balancing loss (default 0.01)\n"                    \
    "  --moe-gate softmax|sigmoid  MoE: gates (default softmax over the top k)\n"                               \
    "  --ep N                 MoE: expert-parallel degree (default 1; divides --experts, and --dp in train):\n" \
    "                         each group of N consecutive data-parallel ranks spreads every MoE layer's\n"     \
    "                         experts over its members (E/N each) and exchanges tokens all-to-all; expert\n"  \
    "                         gradients are summed (--zero 1: their optimizer state sharded) over the\n"     \
    "                         dp/N replicas holding them; under --tp a group per tensor index;\n"             \
    "                         not with --zero 2|3 or --ps\n"                                                   \
    "  --seq N                GPT, Llama: sequence length (default 64)\n"                                      \
    "  --vocab N              GPT, Llama: vocabulary (default 256: bytes)\n"                                   \
    "  --in-features N        MLP: input features (default 32)\n"                                              \
    "  --classes N            MLP: classes of the synthetic task (default 8)\n"                                \
    "  --seed N               initialisation seed (default 1337)\n"                                            \
    "  --tie-embeddings       GPT, Llama: tie the output head to the token embedding\n"                       \
    "  --precision fp32|bf16  GPT, Llama (default fp32): bf16 keeps the activations that wait for the backward and\n" \
    "                         sends them between stages in bf16, and runs GEMMs on bf16 hardware where there\n" \
    "                         is some (cuda tensor cores; CPUs with AMX or AVX-512 BF16: brigade info), fp32\n" \
    "                         accumulation; weights, gradients and optimizer state stay fp32 (docs/layers.md)\n"

/* A port that was free on 127.0.0.1 a moment ago (binding port 0 and releasing it): 0, or -1 and errno. */
int bg_cli_free_port(int *port_p);
/* A job token for the rendezvous store: BG_CLI_TOKEN_CHARS hex characters from /dev/urandom into hex
 * (cap >= BG_CLI_TOKEN_CHARS + 1): 0, or -1 and errno. */
#define BG_CLI_TOKEN_CHARS 32
int bg_cli_job_token(char *hex, size_t cap);

#endif
