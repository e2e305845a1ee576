#!/usr/bin/env bash
# bench/zero.sh: sharded data parallelism (--zero 0|1|2|3) at dp 2 and 4 on a
# GPT (8 blocks, d_model 192): rank 0's allocator peak next to the
# executor's prediction, the step time (median over the steps of a run, then
# median of R runs; the four stages alternate within each repeat so that
# they share the machine's noise) and its ratios to --zero 0 and --zero 2. Buckets of
# BRIGADE_BUCKET_MB = 1 MiB by default: the model's gradients are 15 MiB (1.7 MiB a block), and
# --zero 2 holds two buckets whole (one written, one reduced) besides its
# shard, which pays when a bucket is a small part of the gradients.
# --zero 3 also prints its gather overlap: the share of its parameter gathers'
# time in flight that no compute waited for (rank 0's, logged at
# BRIGADE_LOG=info; median of the R runs), with the step's ratio to --zero 2.
# Usage: [BRIGADE_BUCKET_MB=N] bench/zero.sh [BUILD_DIR] [REPEATS]
set -euo pipefail
export BRIGADE_BUCKET_MB=${BRIGADE_BUCKET_MB:-1}
BUILD=${1:-build}; R=${2:-3}
B="$BUILD/brigade"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
MODEL="--model gpt --layers 8 --d-model 192 --heads 4 --seq 64 --steps 12 --threads 1"
. "$(dirname "$0")/lib.sh"
echo "$(cpu_name), $(nproc) cores; buckets of $BRIGADE_BUCKET_MB MiB"
printf "%3s %5s %10s %10s %12s %8s %8s %8s\n" dp zero "peak MiB" "pred MiB" "step ms" "vs 0" "vs 2" "overlap"
for dp in 2 4; do
  for i in $(seq 1 "$R"); do
    for z in 0 1 2 3; do
      BRIGADE_LOG=$([ $z = 3 ] && echo info || echo "${BRIGADE_LOG:-warn}") \
        "$B" launch -n $dp -- "$B" train $MODEL --batch $((4 * dp)) --microbatches 2 --dp $dp --zero $z --quiet \
        >"$T/o" 2>"$T/e"
      grep -o "r0 INFO zero\] gather overlap [0-9.]*" "$T/e" | awk '{print $NF}' >>"$T/ov_${dp}_$z" || true
      grep -o "median step [0-9.]* ms" "$T/o" | awk '{print $3}' >>"$T/ms_${dp}_$z"
      awk '$1 == "0" && NF >= 11 {print $5, $11}' "$T/e" >"$T/mem_${dp}_$z"
    done
  done
  base=$(med <"$T/ms_${dp}_0"); base2=$(med <"$T/ms_${dp}_2")
  for z in 0 1 2 3; do
    ms=$(med <"$T/ms_${dp}_$z")
    read -r peak pred <"$T/mem_${dp}_$z"
    ov=$(med <"$T/ov_${dp}_$z"); ov=${ov:--}
    printf "%3d %5d %10s %10s %12s %8s %8s %8s\n" $dp $z "$peak" "$pred" "$ms" "$(awk -v a="$ms" -v b="$base" 'BEGIN{printf "%.3f", a/b}')" \
      "$(awk -v a="$ms" -v b="$base2" 'BEGIN{printf "%.3f", a/b}')" "$ov"
  done
done
