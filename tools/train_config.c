/* tools/train_config.c: the run config file of `brigade train` (see
 * tools/train_config.h). Values are checked by the flags' own parsers, so a
 * bad value in the file reads like the same flag on the command line. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/train_config.h"

static const struct option *find_opt(const struct option *opts, const char *name)
{
    for (const struct option *o = opts; o->name; o++)
        if (strcmp(o->name, name) == 0)
            return o;
    return NULL;
}

/* One value as a flag's argument text (owned), or NULL with *why set. */
static char *value_text(json_t *v, const char **why)
{
    char buf[64];
    if (json_is_string(v))
        return strdup(json_string_value(v));
    if (json_is_integer(v)) {
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        return strdup(buf);
    }
    if (json_is_real(v)) { /* the shortest text that reads back as the same double */
        double x = json_real_value(v);
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, x);
            if (strtod(buf, NULL) == x)
                break;
        }
        return strdup(buf);
    }
    if (json_is_array(v)) { /* --split [1, 2, 3] -> "1,2,3" */
        size_t cap = 1, i;
        json_t *e;
        char **parts = calloc(json_array_size(v) + 1, sizeof(char *));
        json_array_foreach(v, i, e)
        {
            if (json_is_array(e) || !(parts[i] = value_text(e, why))) {
                *why = "an array of strings or numbers";
                for (size_t k = 0; k < i; k++)
                    free(parts[k]);
                free(parts);
                return NULL;
            }
            cap += strlen(parts[i]) + 1;
        }
        char *s = calloc(1, cap);
        for (size_t k = 0; k < json_array_size(v); k++) {
            if (k)
                strcat(s, ",");
            strcat(s, parts[k]);
            free(parts[k]);
        }
        free(parts);
        return s;
    }
    *why = "a string, a number, true/false or an array";
    return NULL;
}

static char *dashed(const char *key)
{
    size_t len = strlen(key) + 3;
    char *s = malloc(len);
    if (s)
        snprintf(s, len, "--%s", key);
    return s;
}

/* The config file's flags appended to args; 0, or a message was printed. */
static int load_file(const char *cmd, const char *path, const struct option *opts, char **args, int *n)
{
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root && err.line < 0) /* not opened: jansson's text says why */
        fprintf(stderr, "brigade %s: --config: %s\n", cmd, err.text);
    else if (!root)
        fprintf(stderr, "brigade %s: --config %s: line %d column %d: %s\n", cmd, path, err.line, err.column, err.text);
    if (!root)
        return 1;
    if (!json_is_object(root)) {
        fprintf(stderr, "brigade %s: --config %s must hold a JSON object of flags ({\"steps\": 100, ...})\n", cmd, path);
        json_decref(root);
        return 1;
    }
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v)
    {
        const struct option *o = find_opt(opts, key);
        const char *why = NULL;
        if (!o || strcmp(key, "config") == 0 || strcmp(key, "help") == 0) {
            fprintf(stderr, "brigade %s: --config %s: \"%s\" is not a flag of brigade %s (keys are long flag names "
                    "without the dashes)\n", cmd, path, key, cmd);
            rc = 2;
            break;
        }
        if (o->has_arg == no_argument) {
            if (!json_is_boolean(v)) {
                fprintf(stderr, "brigade %s: --config %s: \"%s\" takes true or false\n", cmd, path, key);
                rc = 2;
                break;
            }
            if (json_is_true(v))
                args[(*n)++] = dashed(key);
            continue;
        }
        char *text = value_text(v, &why);
        if (!text) {
            fprintf(stderr, "brigade %s: --config %s: \"%s\" must be %s\n", cmd, path, key,
                    why ? why : "a value");
            rc = 2;
            break;
        }
        args[(*n)++] = dashed(key);
        args[(*n)++] = text;
    }
    json_decref(root);
    return rc;
}

int bg_cli_config_args(const char *cmd, const struct option *opts, int argc, char **argv, bg_cli_config_t *c)
{
    memset(c, 0, sizeof *c);
    c->effective = json_object();
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            break;
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "brigade %s: --config needs a file\n", cmd);
                return 2;
            }
            path = argv[i + 1];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            path = argv[i] + 9;
        }
    }
    size_t cap = (size_t)argc + 1;
    json_t *root = path ? json_load_file(path, 0, NULL) : NULL;
    if (root && json_is_object(root))
        cap += 2 * json_object_size(root);
    json_decref(root);
    char **cfg = calloc(cap, sizeof(char *));
    c->argv = calloc(cap + 1, sizeof(char *));
    int n = 0, rc = 0;
    if (path)
        rc = load_file(cmd, path, opts, cfg, &n);
    c->argv[c->argc++] = argv[0];
    for (int k = 0; k < n; k++) /* owned by the process: they live as long as the command */
        c->argv[c->argc++] = cfg[k];
    free(cfg);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0) {
            i++;
            continue;
        }
        if (strncmp(argv[i], "--config=", 9) == 0)
            continue;
        c->argv[c->argc++] = argv[i];
    }
    return rc;
}

void bg_cli_config_record(bg_cli_config_t *c, const char *name, const char *value)
{
    json_object_set_new(c->effective, name, value ? json_string(value) : json_true());
}

char *bg_cli_config_json(const bg_cli_config_t *c)
{
    return json_dumps(c->effective, JSON_COMPACT | JSON_SORT_KEYS);
}

void bg_cli_config_free(bg_cli_config_t *c)
{
    json_decref(c->effective);
    free(c->argv); /* the config file's strings stay: getopt's optarg may still point into them */
    memset(c, 0, sizeof *c);
}
