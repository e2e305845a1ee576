#!/usr/bin/env bash
# bench/pipeline_speedup.sh: throughput of a GPT (8 blocks, d_model 256) trained by one process
# against 2 pipeline stages and against 2 data-parallel replicas, one compute
# thread per rank, 16 microbatches, measured in the same run, alternating,
# medians of R repeats; beside them the machine's own ceiling for two ranks, two
# independent one-process runs at once (no communication: shared caches, memory
# bandwidth and clocks only), and brigade's zero-bubble ZB-H1 on the same stages. Also replays a pipeline trace in the simulator with
# free links (overlap: measured step / compute-only critical path).
# Usage: bench/pipeline_speedup.sh [BUILD_DIR] [REPEATS]
set -euo pipefail
BUILD=${1:-build}; R=${2:-3}
B="$BUILD/brigade"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
# 8 blocks so that the head (on the last stage) is a small part of a stage
MODEL="--model gpt --layers 8 --d-model 256 --heads 4 --seq 64 --batch 32 --steps 10 --threads 1 --quiet"
. "$(dirname "$0")/lib.sh"
tps() { grep -o "[0-9.]* tokens/s" | head -1 | awk '{print $1}'; }
for i in $(seq 1 "$R"); do
  "$B" train $MODEL --microbatches 16 2>/dev/null | tps >>"$T/one"
  "$B" launch -n 2 -- "$B" train $MODEL --microbatches 16 --pp 2 --split 5,6 --schedule 1f1b 2>/dev/null | tps >>"$T/pp"
  # each replica keeps the single process's microbatch size (2 sequences): 8 microbatches of its 16
  "$B" launch -n 2 -- "$B" train $MODEL --microbatches 8 --dp 2 2>/dev/null | tps >>"$T/dp"
  "$B" launch -n 2 -- "$B" train $MODEL --microbatches 16 --pp 2 --split 5,6 --schedule zb-h1 2>/dev/null | tps >>"$T/zb"
  "$B" train $MODEL --microbatches 16 2>/dev/null | tps >"$T/a" & pa=$!
  "$B" train $MODEL --microbatches 16 2>/dev/null | tps >"$T/b"; wait $pa
  awk '{s += $1} END {print s}' "$T/a" "$T/b" >>"$T/two"
done
zb=$(med <"$T/zb"); two=$(med <"$T/two")
one=$(med <"$T/one"); pp=$(med <"$T/pp"); dp=$(med <"$T/dp")
echo "one process : $one tokens/s (runs: $(tr '\n' ' ' <"$T/one"))"
echo "pp 2 (1F1B) : $pp tokens/s  speedup $(awk -v a="$pp" -v b="$one" 'BEGIN{printf "%.2f", a/b}')  (ideal with the bubble: 2*16/17 = 1.88)"
echo "dp 2        : $dp tokens/s  speedup $(awk -v a="$dp" -v b="$one" 'BEGIN{printf "%.2f", a/b}')"
echo "pp 2 (ZB-H1): $zb tokens/s  speedup $(awk -v a="$zb" -v b="$one" 'BEGIN{printf "%.2f", a/b}')"
echo "two independent processes at once: $two tokens/s together, $(awk -v a="$two" -v b="$one" 'BEGIN{printf "%.2f", a/b}') x one" \
     "(this machine's ceiling for two ranks); of it: pp 1F1B $(awk -v a="$pp" -v b="$two" 'BEGIN{printf "%.2f", a/b}')," \
     "ZB-H1 $(awk -v a="$zb" -v b="$two" 'BEGIN{printf "%.2f", a/b}'), dp $(awk -v a="$dp" -v b="$two" 'BEGIN{printf "%.2f", a/b}')" \
     "(runs: $(tr '\n' ' ' <"$T/two"))"
"$B" launch -n 2 -- "$B" train $MODEL --microbatches 16 --pp 2 --split 5,6 --schedule 1f1b --trace "$T/t.json" >/dev/null 2>&1
"$B" simulate --from-trace "$T/t.json" | tail -1
"$B" simulate --from-trace "$T/t.json" --compute-only | tail -1 | sed 's/^/compute-only critical path (free links): /'
