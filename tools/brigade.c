/* tools/brigade.c: the `brigade` command-line tool's entry point.
 * Thin: it dispatches to tools/cmd_*.c, which parse flags and call the
 * public library API; only here do errors become messages and exit codes. */
#include <stdio.h>
#include <string.h>

#include "tools/cli.h"

typedef struct {
    const char *name;
    const char *help;
    int (*fn)(int, char **);
} bg_command_t;

static const bg_command_t bg__commands[] = {
#define BG_COMMAND(name, help) {#name, help, bg_cmd_##name},
#include "tools/commands.h"
#undef BG_COMMAND
};

static void usage(FILE *f)
{
    fprintf(f, "usage: brigade <command> [options]   (brigade <command> --help for its options)\n\n"
               "brigade " BRIGADE_VERSION_STRING ": pipeline-, data- and tensor-parallel training in C.\n"
               "Backends compiled in:");
    for (const char *const *n = bg_backend_names(); *n; n++)
        fprintf(f, " %s", *n);
    fprintf(f, "\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(bg__commands) / sizeof(bg__commands[0]); i++)
        fprintf(f, "  %-10s %s\n", bg__commands[i].name, bg__commands[i].help);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("brigade %s\n", BRIGADE_VERSION_STRING);
        return 0;
    }
    for (size_t i = 0; i < sizeof(bg__commands) / sizeof(bg__commands[0]); i++)
        if (!strcmp(argv[1], bg__commands[i].name))
            return bg__commands[i].fn(argc - 1, argv + 1);
    const char *names[sizeof(bg__commands) / sizeof(bg__commands[0]) + 1] = {0};
    for (size_t i = 0; i < sizeof(bg__commands) / sizeof(bg__commands[0]); i++)
        names[i] = bg__commands[i].name;
    const char *near = bg_cli_nearest(argv[1], names);
    if (near) {
        fprintf(stderr, "brigade: unknown command \"%s\" (did you mean %s?)\n", argv[1], near);
        return 2;
    }
    fprintf(stderr, "brigade: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}
