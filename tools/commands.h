/* tools/commands.h: the CLI's subcommands. One line per command:
 * BG_COMMAND(name, "one-line help"); the function is int bg_cmd_<name>(int argc, char **argv)
 * with argv[0] the subcommand name. Add a line and a tools/cmd_<name>.c file. */
BG_COMMAND(bench, "benchmarks: kernels, p2p, allreduce, schedule")
BG_COMMAND(info, "print version, backends and the BRIGADE_* variables")
