#!/usr/bin/env bash
# bench/ep_schedules.sh: pipeline schedules on an MoE model with expert parallelism: a GPT whose every
# block's MLP is an MoE, at pp P x dp 2 x ep 2 (2P ranks on this machine, one process each). By default two
# tables: pp 4 with the layers computed, then pp 16 emulated (32 processes: every compute instruction a
# sleep of its stage's profiled time x --scale, the messages and the experts' all-to-alls real and of their
# real sizes; docs/executor.md). --stages P with --compute or --emulate runs one table. Each schedule runs
# twice, without and with BRIGADE_TP_OVERLAP=microbatch (column "paired": the executor runs a compute
# instruction and the next one of another microbatch, exactly one a forward, as two coroutines, and a lane
# whose all-to-all is in flight hands the thread to the other). One row each: the step time (median over
# steps 2.., the slowest rank of each), the bubble, the all-to-all time per rank and step (the trace's ep_a2a
# events), its share of the step, and the all-to-all's overlap ratio: the share of its time during which the
# rank's other lane was computing (inside one of its compute instructions and not in an all-to-all of its
# own). "pairs": per step, all ranks: unpaired, the pairs the pairing rule forms on the compute order the
# trace shows (an independent count); paired, the pairs the run formed (the second lane's instructions).
# "kinds" (unpaired rows): the pairs by kind, first + second instruction (F forward, B full backward, b backward-input,
# W backward-weight). A lane runs until it waits, so when the first is a W (no all-to-all of its own) the
# second one starts first and the W computes while its all-to-alls are in flight.
#
#   bench/ep_schedules.sh [--brigade PATH] [--stages P] [--compute | --emulate]
#                         [--schedules "1f1b zbv dualpipev dualpipe"] [--scale X] [--steps N]
set -u
B=${BRIGADE:-brigade}
P="" SCHEDS="1f1b zbv dualpipev dualpipe" SCALE=10 STEPS=4 MODE=""
while [ $# -gt 0 ]; do
  case $1 in
    --brigade) B=$2; shift 2 ;;
    --stages) P=$2; shift 2 ;;
    --schedules) SCHEDS=$2; shift 2 ;;
    --scale) SCALE=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --compute) MODE=compute; shift ;;
    --emulate) MODE=emulate; shift ;;
    *) echo "bench/ep_schedules.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

table() { # table P compute|emulate
  local P=$1 MODE=$2
  local M="--layers $((2 * P)) --d-model 64 --heads 4 --seq 32 --experts 8 --top-k 2"
  local MB=$((2 * P)) EMU=() HOW="computing"
  if [ "$MODE" = emulate ]; then
    # the profile of the whole layers (ep 1: one process runs every expert; a member of ep 2 runs about half)
    "$B" profile $M --json "$T/prof.json" >/dev/null 2>&1 || { echo "bench/ep_schedules.sh: brigade profile failed" >&2; exit 1; }
    EMU=(--emulate "$T/prof.json" --emulate-scale "$SCALE") HOW="emulated (profile x $SCALE)"
  fi
  printf "\nMoE GPT %s, pp %d x dp 2 x ep 2 (%d ranks), m = %d, %s\n" "$M" "$P" $((2 * P)) "$MB" "$HOW"
  printf "%-10s %6s %9s %8s %13s %9s %9s %6s  %s\n" schedule paired "step ms" bubble "a2a ms/rank" "a2a/step" overlap \
    pairs kinds
  for S in $SCHEDS; do
   for PAIRED in no yes; do
    rm -f "$T/m.json" "$T/t.json"
    OV=weight; [ "$PAIRED" = yes ] && OV=microbatch
    if ! BRIGADE_TP_OVERLAP=$OV timeout 900 "$B" launch -n $((2 * P)) -- "$B" train $M --ep 2 --pp "$P" --dp 2 \
        --batch $((2 * MB)) --microbatches "$MB" --schedule "$S" --steps "$STEPS" --threads 1 "${EMU[@]}" \
        --metrics "$T/m.json" --trace "$T/t.json" --quiet >"$T/log" 2>&1; then
      echo "$S: brigade train failed:" >&2; tail -3 "$T/log" >&2; exit 1
    fi
    python3 "$(dirname "$0")/ep_overlap.py" "$T/m.json" "$T/t.json" "$S" $((2 * P)) "$PAIRED" || exit 1
   done
  done
}

if [ -n "$P" ] || [ -n "$MODE" ]; then
  table "${P:-4}" "${MODE:-emulate}"
else
  table 4 compute
  table 16 emulate
fi
