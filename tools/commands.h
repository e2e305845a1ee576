/* tools/commands.h: the CLI's subcommands. One line per command:
 * BG_COMMAND(name, "one-line help"); the function is int bg_cmd_<name>(int argc, char **argv)
 * with argv[0] the subcommand name. Add a line and a tools/cmd_<name>.c file. */
BG_COMMAND(train, "train a model (single process, or one rank of a pipeline/data-parallel job)")
BG_COMMAND(compare, "compare two runs' saved weights tensor by tensor")
BG_COMMAND(simulate, "replay a training trace's measured op costs in the schedule simulator")
BG_COMMAND(bench, "benchmarks: kernels, p2p, allreduce, schedule, plan")
BG_COMMAND(info, "print version, backends and the BRIGADE_* variables")
BG_COMMAND(launch, "start N ranks of a job on this machine and supervise them")
BG_COMMAND(schedule, "generate, validate and simulate pipeline schedules; text, JSON and SVG timelines")
BG_COMMAND(generate, "sample text from a trained GPT (a checkpoint or a --save directory)")
BG_COMMAND(plot, "SVG chart of loss and tokens/s against the step from a metrics file")
BG_COMMAND(profile, "each layer's parameters, bytes, FLOPs and measured F/B/W times on this machine")
BG_COMMAND(plan, "split a model over devices: exact stage partition, layout search, predicted step time and memory")
