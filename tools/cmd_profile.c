/* tools/cmd_profile.c: `brigade profile`: each layer's profile (parameters,
 * bytes kept per microbatch, output bytes, FLOPs) as the partitioner reads
 * it, and its measured forward / backward / B / W times on this machine. */
#include <getopt.h>
#include <jansson.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/measure.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: brigade profile [model flags] [--microbatch-size N] [--ranks R] [--backend NAME] [--threads N]\n"
               "                       [--json FILE]\n\n"
               "Prints every layer's profile (parameters, stash and output bytes per microbatch, forward and\n"
               "backward FLOPs) and its forward, backward, B and W times measured on this machine (medians,\n"
               "cold caches, with R-1 copies running beside it for the other ranks on this machine).\n\n"
               "model:\n" BG_CLI_MODEL_HELP
               "  --microbatch-size N    sequences (rows) per microbatch (default 1)\n"
               "  --ranks R              ranks that will share this machine (default 1)\n"
               "  --backend NAME         kernel backend (default cpu; brigade info lists them)\n"
               "  --threads N            compute threads (default: all)\n"
               "  --json FILE            also write the table as JSON\n");
}

int bg_cmd_profile(int argc, char **argv)
{
    const char *cmd = "profile", *backend = "cpu", *json_path = NULL;
    bg_model_config_t m = BG_MODEL_CONFIG_INIT;
    long long v;
    int n = 1, ranks = 1, threads = 0;
    enum { O_MBS = 256, O_RANKS, O_BACKEND, O_THREADS, O_JSON, O_HELP };
    static const struct option opts[] = {BG_CLI_MODEL_OPTIONS,
                                         {"microbatch-size", required_argument, 0, O_MBS},
                                         {"ranks", required_argument, 0, O_RANKS},
                                         {"backend", required_argument, 0, O_BACKEND},
                                         {"threads", required_argument, 0, O_THREADS},
                                         {"json", required_argument, 0, O_JSON},
                                         {"help", no_argument, 0, O_HELP},
                                         {0, 0, 0, 0}};
    int o;
    optind = 1;
    opterr = 0;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case O_MBS:
            if (bg_cli_int(cmd, "--microbatch-size", optarg, 1, 1 << 20, &v))
                return 2;
            n = (int)v;
            break;
        case O_RANKS:
            if (bg_cli_int(cmd, "--ranks", optarg, 1, 4096, &v))
                return 2;
            ranks = (int)v;
            break;
        case O_THREADS:
            if (bg_cli_int(cmd, "--threads", optarg, 0, 4096, &v))
                return 2;
            threads = (int)v;
            break;
        case O_BACKEND: backend = optarg; break;
        case O_JSON: json_path = optarg; break;
        case 'h':
        case O_HELP: usage(stdout); return 0;
        default:
            if (o >= BG_CLI_MODEL_FIRST && o < BG_CLI_MODEL_LAST) {
                if (bg_cli_model_option(cmd, o, optarg, &m))
                    return 2;
                break;
            }
            return bg_cli_getopt_error(cmd, argv, optind, opts);
        }
    }
    if (optind < argc)
        return bg_cli_fail(cmd, "unexpected argument \"%s\"", argv[optind]);
    bg_model_desc_t *desc = NULL;
    if (bg_model_build(&m, &desc) != BG_OK)
        return bg_cli_fail(cmd, "%s", bg_last_error());
    static bg_layer_profile_t prof[4096];
    static double f[4096], bw[4096], b[4096], w[4096];
    int L = 0, t = bg_model_desc_params(desc)->seq_len;
    bg_status_t st = bg_model_profile(desc, n, t, prof, 4096, &L);
    if (st != BG_OK) {
        bg_model_desc_destroy(desc);
        return bg_cli_status(cmd, st);
    }
    int measured = bg_cli_measure_layers(cmd, desc, n, t, backend, threads, ranks, 1, BG_OPTIM_ADAMW, f, bw, b, w, NULL,
                                         NULL, &L);
    bg_model_desc_destroy(desc);
    if (measured)
        return 1;
    printf("%-12s %12s %10s %10s %9s %9s %8s %8s %8s %8s %8s\n", "layer", "params", "stash MiB", "out MiB",
           "fwd GFLOP", "bwd GFLOP", "F ms", "BW ms", "B ms", "W ms", "GFLOP/s");
    json_t *rows = json_array();
    double tf = 0, tb = 0;
    for (int i = 0; i < L; i++) {
        double gf = prof[i].fwd_flops + prof[i].bwd_flops, tt = f[i] + bw[i];
        tf += f[i];
        tb += bw[i];
        printf("%-12s %12zu %10.3f %10.3f %9.3f %9.3f %8.3f %8.3f %8.3f %8.3f %8.1f\n", prof[i].name, prof[i].params,
               prof[i].stash_bytes / 1048576.0, prof[i].output_bytes / 1048576.0, prof[i].fwd_flops / 1e9,
               prof[i].bwd_flops / 1e9, f[i] * 1e3, bw[i] * 1e3, b[i] * 1e3, w[i] * 1e3, tt > 0 ? gf / tt / 1e9 : 0.0);
        json_array_append_new(rows, json_pack("{s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f}", "name",
                                              prof[i].name, "params", (json_int_t)prof[i].params, "stash_bytes",
                                              (json_int_t)prof[i].stash_bytes, "output_bytes",
                                              (json_int_t)prof[i].output_bytes, "fwd_flops", prof[i].fwd_flops,
                                              "bwd_flops", prof[i].bwd_flops, "fwd_s", f[i], "bwd_s", bw[i],
                                              "bwd_input_s", b[i], "bwd_weight_s", w[i]));
    }
    printf("total: forward %.3f ms, backward %.3f ms per microbatch of %d\n", tf * 1e3, tb * 1e3, n);
    int rc = 0;
    if (json_path) {
        json_t *root = json_pack("{s:s, s:i, s:i, s:o}", "backend", backend, "microbatch_size", n, "seq", t, "layers",
                                 rows);
        if (json_dump_file(root, json_path, JSON_INDENT(2)) != 0)
            rc = bg_cli_fail(cmd, "cannot write %s", json_path);
        json_decref(root);
    } else {
        json_decref(rows);
    }
    return rc;
}
