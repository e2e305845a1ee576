/* tools/cmd_info.c: `brigade info`: version, backends, configuration table. */
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

int bg_cmd_info(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: brigade info\n  prints the version, the compiled-in backends and every BRIGADE_* variable\n");
        return 0;
    }
    if (argc > 1)
        return bg_cli_fail("info", "takes no arguments, got \"%s\"", argv[1]);
    printf("brigade %s\nbackends:", BRIGADE_VERSION_STRING);
    for (const char *const *n = bg_backend_names(); *n; n++)
        printf(" %s", *n);
    printf("\n\nenvironment variables (current value, default, meaning):\n");
    size_t count;
    const bg_config_var_t *t = bg_config_table(&count);
    for (size_t i = 0; i < count; i++) {
        const char *v = getenv(t[i].name);
        printf("  %-30s %-8s (default \"%s\")  %s\n", t[i].name, v ? v : "-", t[i].dflt, t[i].help);
    }
    return 0;
}
