#!/usr/bin/env bash
# bench/offload.sh: --offload optimizer on 2 ranks under a --device-mem cap
# several times smaller than the model's full training state.
# 1. One process, no cap: the full training state = its allocator peak
#    (parameters, gradients, AdamW state, activations).
# 2. pp 2 --recompute --offload optimizer --offload-dir: the cap is the
#    larger rank's predicted peak (the executor's, from an uncapped run);
#    under it on every rank: each rank's high-water mark against the cap and
#    the prediction, and full state / cap. Offloading the optimizer state
#    alone leaves each of 2 pipeline ranks half the parameters and gradients
#    (8 of AdamW's 16 bytes a parameter, halved), so the ratio stays below 4
#    (16P / (4P + activations)); section 5 reaches 4x with --zero 3.
# 3. The step time of (2) against the same model at dp 2 --zero 2 with no cap
#    (median over a run's steps, median of R runs, the runs alternating so
#    they share the machine's noise), and against pp 2 --recompute with the
#    state in host memory (--offload optimizer, no --offload-dir) and with no
#    offload (no cap): what the files cost over host memory, and offloading
#    over keeping the state in the backend's memory.
# 4. The overlap of the state's disk reads with compute: the files run again
#    with the state written back and dropped from memory before every step
#    (BRIGADE_OFFLOAD_EVICT=on, as on a machine short of memory), without
#    (BRIGADE_OFFLOAD_PREFETCH=off) and with the read-ahead that starts with
#    the last microbatch's backward: the fraction of the added time it hides.
# 5. 4x: a GPT of 16 blocks on 2 ranks at dp 2 --zero 3 --recompute
#    --offload optimizer,params --offload-dir (buckets of one block, sized
#    from the shard by the default rule): each rank keeps on the device only its gradient
#    shard, the gather and bucket buffers and the activations. The cap is the
#    larger rank's prediction; full state / cap, each rank's high-water mark,
#    and the step time against the same model at dp 2 --zero 2 with no cap.
# On the CPU backend there are no explicit transfers: the kernel's page cache
# moves the files' pages.
# Usage: bench/offload.sh [BUILD_DIR] [REPEATS]
set -euo pipefail
BUILD=${1:-build}; R=${2:-3}
B="$BUILD/brigade"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
MODEL="--model gpt --layers 8 --d-model 256 --heads 4 --seq 32 --batch 4 --microbatches 4 --steps 8 --threads 1"
. "$(dirname "$0")/lib.sh"
echo "$(cpu_name), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$B" train $MODEL --steps 2 --quiet >"$T/one" 2>&1
full=$(grep -o "peak memory [0-9.]* MiB" "$T/one" | awk '{print $3}')
run() { # NAME ARGS...: one 2-rank run; its median step into $T/ms_NAME, its summary into $T/sum_NAME
  local name=$1; shift
  "$B" launch -n 2 -- "$B" train $MODEL "$@" >"$T/o" 2>&1 || { echo "run $name failed:"; tail -5 "$T/o"; exit 1; }
  grep -o "median step [0-9.]* ms" "$T/o" | awk '{print $3}' >>"$T/ms_$name"
  awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / {print $1, $5, $NF}' "$T/o" >"$T/sum_$name"
}
OFF="--pp 2 --split 5,6 --recompute --offload optimizer"
run probe $OFF --offload-dir "$T/od" --steps 2
cap=$(awk '{ if ($3 > m) m = $3 } END { printf "%d", (m + 0.01) * 1048576 }' "$T/sum_probe")
printf "full training state (one process, no cap): %s MiB; --device-mem %d bytes (%.2f MiB): full / cap = %.2f\n" \
  "$full" "$cap" "$(awk -v c="$cap" 'BEGIN{print c / 1048576}')" "$(awk -v f="$full" -v c="$cap" 'BEGIN{print f * 1048576 / c}')"
for i in $(seq 1 "$R"); do
  run files $OFF --offload-dir "$T/od" --device-mem "$cap"
  BRIGADE_OFFLOAD_EVICT=on BRIGADE_OFFLOAD_PREFETCH=off run cold $OFF --offload-dir "$T/od" --device-mem "$cap"
  BRIGADE_OFFLOAD_EVICT=on run coldpre $OFF --offload-dir "$T/od" --device-mem "$cap"
  run host $OFF --device-mem "$cap"
  run none --pp 2 --split 5,6 --recompute
  run zero2 --dp 2 --zero 2 --microbatches 2 # the same global batch: 2 replicas x 2
done
peak_table() { # SUMMARY CAP: each rank's high-water mark against the prediction and the cap
  printf "%5s %10s %10s %10s\n" rank "peak MiB" "pred MiB" "cap MiB"
  while read -r r peak pred; do
    printf "%5s %10s %10s %10.2f%s\n" "$r" "$peak" "$pred" "$(awk -v c="$2" 'BEGIN{print c / 1048576}')" \
      "$(awk -v p="$peak" -v c="$2" 'BEGIN{if (p * 1048576 > c) print "  OVER THE CAP"}')"
  done <"$1"
}
echo "pp 2 --recompute --offload optimizer --offload-dir, under the cap:"
peak_table "$T/sum_files" "$cap"
zero=$(med <"$T/ms_zero2")
printf "%-46s %10s %8s\n" run "step ms" "vs zero2"
for n in zero2 none host files; do
  ms=$(med <"$T/ms_$n")
  case $n in
    zero2) what="dp 2 --zero 2, no cap" ;; none) what="pp 2 --recompute, no cap" ;;
    host) what="pp 2 --recompute, offload to host, capped" ;; files) what="pp 2 --recompute, offload to files, capped" ;;
  esac
  printf "%-46s %10s %8s\n" "$what" "$ms" "$(awk -v a="$ms" -v b="$zero" 'BEGIN{printf "%.3f", a / b}')"
done
awk -v f="$(med <"$T/ms_files")" -v h="$(med <"$T/ms_host")" -v n="$(med <"$T/ms_none")" \
  'BEGIN{printf "files over host memory: %.3f; host offload over none: %.3f\n", f / h, h / n}'
# the state evicted before every step (BRIGADE_OFFLOAD_EVICT=on: written back and dropped, so each step
# reads it from disk), without and with the read-ahead during the last microbatch's backward
c=$(med <"$T/ms_cold"); cp=$(med <"$T/ms_coldpre"); w=$(med <"$T/ms_files")
printf "state evicted every step: %s ms without read-ahead, %s ms with; in the page cache: %s ms\n" "$c" "$cp" "$w"
awk -v c="$c" -v p="$cp" -v w="$w" 'BEGIN{printf "overlap: the read-ahead hides %.2f of the time the disk adds to a step ((cold - cold with read-ahead) / (cold - warm); the write-back counts as not hidden)\n", (c - p) / (c - w)}'

# --zero 3's gather overlap: the share of its parameter gathers' time in flight that no compute waited for
# (rank 0's line at BRIGADE_LOG=info), of run NAME's last output, into $T/ov_NAME; printed as their median
gather_overlap() { grep -o "r0 INFO zero\] gather overlap [0-9.]*" "$T/o" | awk '{print $NF}' >>"$T/ov_$1" || true; }

# 5. 4x: --zero 3 with the optimizer state and the parameter shard offloaded
MODEL="--model gpt --layers 16 --d-model 256 --heads 4 --seq 32 --batch 4 --microbatches 2 --steps 4 --threads 1"
"$B" train $MODEL --microbatches 4 --steps 1 --quiet >"$T/one3" 2>&1
full3=$(grep -o "peak memory [0-9.]* MiB" "$T/one3" | awk '{print $3}')
Z3="--dp 2 --zero 3 --recompute --offload optimizer,params"
run probe3 $Z3 --offload-dir "$T/od" --steps 1
cap3=$(awk '{ if ($3 > m) m = $3 } END { printf "%d", (m + 0.01) * 1048576 }' "$T/sum_probe3")
for i in $(seq 1 "$R"); do
  BRIGADE_LOG=info run z3 $Z3 --offload-dir "$T/od" --device-mem "$cap3"
  gather_overlap z3
  run z2big --dp 2 --zero 2
done
printf "\n16 blocks: full training state (one process, no cap): %s MiB; --device-mem %d bytes (%.2f MiB): full / cap = %.2f\n" \
  "$full3" "$cap3" "$(awk -v c="$cap3" 'BEGIN{print c / 1048576}')" "$(awk -v f="$full3" -v c="$cap3" 'BEGIN{print f * 1048576 / c}')"
echo "dp 2 --zero 3 --recompute --offload optimizer,params --offload-dir, under the cap:"
peak_table "$T/sum_z3" "$cap3"
a=$(med <"$T/ms_z3"); z=$(med <"$T/ms_z2big")
printf "step ms: dp 2 --zero 2, no cap %s; dp 2 --zero 3 offloaded, capped %s; ratio %.3f\n" "$z" "$a" "$(awk -v a="$a" -v b="$z" 'BEGIN{print a / b}')"
printf "gather overlap of the --zero 3 run (rank 0, median of its runs): %s\n" "$(med <"$T/ov_z3")"
