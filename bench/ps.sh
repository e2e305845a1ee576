#!/usr/bin/env bash
# bench/ps.sh: the parameter-server mode (--ps S --staleness K) against
# synchronous data parallelism (--dp W) with the same W = 2 workers and
# global batch: S = 1 and 2 servers, K = 0 and 1; and pipelined workers
# (--ps 1 --pp 2, K = 0 and 1) against --pp 2 --dp 2 (the "vs sync" column
# compares each row with the synchronous layout of the same workers). Throughput is the global
# batch's tokens over rank 0's mean step after the first 5 (a --dp replica;
# a --ps server, whose step is the job's: it runs once per step of every
# worker; a mean, not a median: with K > 0 a server's steps alternate long
# and short), then the median of R runs; the configurations alternate within
# each repeat so that they share the machine's noise. Also the run's wall
# time (start-up included) and server 0's idle fraction (waiting for
# pushes). The servers are extra processes on the same cores: on a machine
# with fewer cores than ranks they take time from the workers, and on a
# machine loaded by other jobs a job of more processes gets a larger share
# of it (read the load average printed with the figures).
# Usage: bench/ps.sh [BUILD_DIR] [REPEATS] [STEPS]
set -euo pipefail
BUILD=${1:-build}; R=${2:-3}; STEPS=${3:-40}
B="$BUILD/brigade"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
MODEL="--model gpt --layers 4 --d-model 128 --heads 4 --seq 64 --batch 8 --microbatches 2 --steps $STEPS --threads 1"
TOKENS=$((8 * 64))
. "$(dirname "$0")/lib.sh"
# name ranks flags
CONFIGS=("dp2 2 --dp 2" "ps1_k0 3 --ps 1" "ps1_k1 3 --ps 1 --staleness 1" "ps2_k0 4 --ps 2" "ps2_k1 4 --ps 2 --staleness 1"
  "pp2dp2 4 --pp 2 --dp 2" "ps1pp2_k0 5 --ps 1 --pp 2" "ps1pp2_k1 5 --ps 1 --pp 2 --staleness 1")
echo "$(cpu_name), $(nproc) cores; GPT 4 x 128, seq 64, batch 8, $STEPS steps, $R runs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 1 "$R"); do
  for c in "${CONFIGS[@]}"; do
    read -r name n flags <<<"$c"
    t0=$(date +%s.%N)
    "$B" launch -n "$n" -- "$B" train $MODEL $flags --quiet --metrics "$T/m.jsonl" >"$T/o" 2>"$T/e"
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc >>"$T/wall_$name"
    python3 - "$T/m.jsonl" "$T/ms_$name" "$T/idle_$name" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][1:]
r0 = [r for r in rows if r["rank"] == 0 and r["step"] > 5]
with open(sys.argv[2], "a") as f:
    print(sum(r["step_ms"] for r in r0) / len(r0), file=f)
idle = sorted(r["idle"] for r in r0 if r.get("role") == "server")
with open(sys.argv[3], "a") as f:
    print(idle[len(idle) // 2] if idle else "-", file=f)
PY
  done
done
base=$(med <"$T/ms_dp2") base_pp=$(med <"$T/ms_pp2dp2")
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-10s %6s %10s %12s %8s %10s %10s\n" config ranks "step ms" "tokens/s" "vs sync" "wall s" "srv idle"
for c in "${CONFIGS[@]}"; do
  read -r name n flags <<<"$c"
  ms=$(med <"$T/ms_$name")
  ref=$base
  case $name in *pp2*) ref=$base_pp;; esac
  printf "%-10s %6d %10.1f %12.0f %8s %10.2f %10s\n" "$name" "$n" "$ms" "$(echo "$TOKENS * 1000 / $ms" | bc -l)" \
    "$(awk -v a="$ms" -v b="$ref" 'BEGIN{printf "%.3f", b/a}')" "$(med <"$T/wall_$name")" "$(med <"$T/idle_$name")"
done
