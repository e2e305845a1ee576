/* tools/train_config.h: `brigade train --config run.json`: a JSON object of
 * long flag names and their values, turned into arguments that go before the
 * command line's (so the command line overrides it), and the effective
 * flags recorded as one JSON object for the run's outputs. Only the CLI
 * uses it; it knows flags, never what they mean. */
#ifndef BG_TOOLS_TRAIN_CONFIG_H
#define BG_TOOLS_TRAIN_CONFIG_H

#include <getopt.h>

typedef struct bg_cli_config {
    int argc;
    char **argv;     /* argv[0], the config file's flags, then the command line's (--config dropped) */
    void *effective; /* json_t object: flag -> value (string, or true for a flag without value) */
} bg_cli_config_t;

/* Build c->argv from argv: with --config FILE (or --config=FILE) its keys
 * (long names of opts; string, number, true/false or an array joined with
 * commas) come first. 0, or a message was printed (1: the file, 2: usage). */
int bg_cli_config_args(const char *cmd, const struct option *opts, int argc, char **argv, bg_cli_config_t *c);
/* Record a parsed flag (later ones override earlier ones). */
void bg_cli_config_record(bg_cli_config_t *c, const char *name, const char *value);
/* The effective flags as compact JSON text ("{}" if none); the caller frees it. */
char *bg_cli_config_json(const bg_cli_config_t *c);
void bg_cli_config_free(bg_cli_config_t *c);

#endif
