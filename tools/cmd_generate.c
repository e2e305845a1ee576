/* tools/cmd_generate.c: `brigade generate --checkpoint DIR --prompt TEXT ...`:
 * load a GPT or Llama from a checkpoint (the newest complete one under DIR, a
 * checkpoint directory itself, or a `train --save` directory) into a whole
 * model built from the stored configuration, and print the prompt and its
 * sampled continuation (bytes are tokens). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "brigade/checkpoint.h"
#include "tools/cli.h"

static void generate_usage(FILE *f)
{
    fprintf(f, "usage: brigade generate --checkpoint DIR --prompt TEXT [options]\n"
               "\n"
               "Sample a continuation of TEXT from a GPT or Llama trained by brigade. DIR is a checkpoint\n"
               "root (the newest complete checkpoint under it is used), one checkpoint directory\n"
               "(step-00000050), or a `brigade train --save` directory.\n"
               "\n"
               "options:\n"
               "  --tokens N         tokens to generate (default 200)\n"
               "  --temperature T    0 = greedy; higher = more random (default 0.8)\n"
               "  --top-k K          sample among the K most likely tokens, 0 = all (default 40)\n"
               "  --seed S           random seed (default 1): same seed, same text\n"
               "  --no-kv-cache      recompute the context for every token (default: a Llama keeps its keys\n"
               "                     and values and runs each new token alone while the context fits --seq)\n"
               "  --backend NAME     kernel backend (default cpu; brigade info lists them)\n");
}

int bg_cmd_generate(int argc, char **argv)
{
    const char *cmd = "generate", *dir = NULL, *prompt = NULL, *backend = "cpu";
    long long ntok = 200, top_k = 40, seed = 1;
    int kv_cache = 1;
    double temp = 0.8;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            generate_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--checkpoint")) {
            if (!v)
                return bg_cli_fail(cmd, "--checkpoint needs a directory");
            dir = v;
        } else if (!strcmp(a, "--prompt")) {
            if (!v)
                return bg_cli_fail(cmd, "--prompt needs a text");
            prompt = v;
        } else if (!strcmp(a, "--backend")) {
            if (!v)
                return bg_cli_fail(cmd, "--backend needs a name");
            backend = v;
        } else if (!strcmp(a, "--no-kv-cache")) {
            kv_cache = 0;
            continue; /* takes no value */
        } else if (!strcmp(a, "--tokens")) {
            if (bg_cli_int(cmd, a, v, 0, 1000000, &ntok))
                return 2;
        } else if (!strcmp(a, "--top-k")) {
            if (bg_cli_int(cmd, a, v, 0, 1 << 30, &top_k))
                return 2;
        } else if (!strcmp(a, "--seed")) {
            if (bg_cli_int(cmd, a, v, 0, (long long)(~0ULL >> 1), &seed))
                return 2;
        } else if (!strcmp(a, "--temperature")) {
            if (bg_cli_double(cmd, a, v, 0, 1000, &temp))
                return 2;
        } else {
            static const char *const known[] = {"--checkpoint", "--prompt", "--backend", "--tokens", "--top-k",
                                                "--seed", "--temperature", "--no-kv-cache", "--help", NULL};
            return bg_cli_unknown_option(cmd, a, known);
        }
        i++;
    }
    if (!dir)
        return bg_cli_fail(cmd, "missing --checkpoint DIR (see brigade generate --help)");
    if (!prompt || !*prompt)
        return bg_cli_fail(cmd, "missing --prompt TEXT (at least one character)");

    /* which kind of directory */
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return bg_cli_fail(cmd, "--checkpoint %s is not a directory", dir);
    char path[4096], mpath[4200];
    int64_t step = -1;
    int is_ckpt = 0;
    char *json = NULL;
    bg_status_t st;
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    if (stat(mpath, &sb) == 0) {
        snprintf(path, sizeof path, "%s", dir);
        is_ckpt = 1;
    } else if ((st = bg_checkpoint_latest(dir, path, sizeof path, &step)) == BG_OK) {
        is_ckpt = 1;
    } else if (st != BG_ERR_NOT_FOUND) {
        return bg_cli_status(cmd, st);
    } else {
        snprintf(path, sizeof path, "%s", dir);
    }
    if (is_ckpt) {
        bg_checkpoint_info_t info;
        if ((st = bg_checkpoint_read_info(path, &info)) != BG_OK)
            return bg_cli_status(cmd, st);
        json = info.model_json;
        info.model_json = NULL;
        step = info.step;
        bg_checkpoint_info_clear(&info);
    } else if ((st = bg_safetensors_model_json(path, &json)) != BG_OK) {
        fprintf(stderr, "brigade generate: %s has no complete checkpoint and no model description: %s\n", dir,
                bg_last_error());
        return 1;
    }

    bg_backend_t *be = NULL;
    bg_model_desc_t *desc = NULL;
    bg_model_t *m = NULL;
    int32_t *tokens = NULL, *out = NULL;
    int rc = 1;
    bg_backend_params_t bp = bg_cli_backend_params(0);
    st = bg_model_desc_from_json(json, &desc);
    free(json);
    if (st != BG_OK) {
        rc = bg_cli_status(cmd, st);
        goto out;
    }
    if (bg_model_desc_params(desc)->input != BG_INPUT_TOKENS || bg_model_desc_params(desc)->vocab < 256) {
        rc = bg_cli_fail(cmd, "%s holds a %s model of %s; generate needs a byte-token model (vocab >= 256)", path,
                         bg_model_desc_params(desc)->name,
                         bg_model_desc_params(desc)->input == BG_INPUT_TOKENS ? "tokens" : "features");
        goto out;
    }
    if ((st = bg_backend_create(backend, &bp, &be)) != BG_OK ||
        (st = bg_model_create(desc, be, -1, -1, &m)) != BG_OK) {
        rc = bg_cli_status(cmd, st);
        goto out;
    }
    st = is_ckpt ? bg_checkpoint_load(path, &m, 1, NULL) : bg_safetensors_load_dir(path, &m, 1);
    if (st != BG_OK) {
        rc = bg_cli_status(cmd, st);
        goto out;
    }
    size_t n = strlen(prompt);
    tokens = malloc(n * sizeof(int32_t));
    out = malloc((size_t)(ntok ? ntok : 1) * sizeof(int32_t));
    if (!tokens || !out) {
        fprintf(stderr, "brigade generate: out of memory\n");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        tokens[i] = (uint8_t)prompt[i];
    bg_generate_params_t gp = BG_GENERATE_PARAMS_INIT;
    gp.temperature = (float)temp;
    gp.top_k = (int)top_k;
    gp.seed = (uint64_t)seed;
    gp.kv_cache = kv_cache;
    if ((st = bg_generate_with(m, tokens, (int)n, (int)ntok, &gp, out)) != BG_OK) {
        rc = bg_cli_status(cmd, st);
        goto out;
    }
    if (step >= 0)
        fprintf(stderr, "brigade generate: %s (step %lld), %d layers, %zu parameters\n", path, (long long)step,
                bg_model_desc_num_layers(desc), bg_model_desc_param_count(desc));
    fwrite(prompt, 1, n, stdout);
    for (long long i = 0; i < ntok; i++)
        putchar(out[i] < 256 ? (int)out[i] : '?');
    putchar('\n');
    rc = 0;
out:
    free(tokens);
    free(out);
    bg_model_destroy(m);
    bg_model_desc_destroy(desc);
    bg_backend_destroy(be);
    return rc;
}
