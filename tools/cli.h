/* tools/cli.h: small helpers shared by the CLI's subcommands: strict number
 * parsing that names the flag, and error printing. The CLI is the only part
 * of brigade that prints to the user or chooses an exit code. */
#ifndef BG_TOOLS_CLI_H
#define BG_TOOLS_CLI_H

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

/* Parse helpers: 0 on success, else print a message naming the flag and return -1. */
int bg_cli_int(const char *cmd, const char *flag, const char *s, long long lo, long long hi, long long *out);
int bg_cli_double(const char *cmd, const char *flag, const char *s, double lo, double hi, double *out);
/* Sizes with an optional K/M/G/T suffix (powers of 1024): "24G". */
int bg_cli_bytes(const char *cmd, const char *flag, const char *s, uint64_t *out);
/* Comma-separated integers: "3,2,2". *n_out entries written, at most max. */
int bg_cli_int_list(const char *cmd, const char *flag, const char *s, long long *out, int max, int *n_out);

#endif
