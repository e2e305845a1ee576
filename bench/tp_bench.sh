#!/usr/bin/env bash
# bench/tp_bench.sh: tensor parallelism on this machine, for a GPT of 2 blocks
# (d_model 256, 8 heads, seq 64): step time at tp = 2 (2 processes x 1
# thread) against tp = 1 (1 process x 1 thread, and 1 x 2 threads: the same
# cores), alternating, medians of R repeats; the share of the step spent in
# the tensor group's collectives, from a trace; per-device parameters and
# peak bytes at tp = 1 and 2; the planner's predicted step for the tp = 2
# plan and a tp = 2 x pp = 2 plan (layers measured here on a tensor group)
# against the measured one: predicted / measured, medians of R. Sequence parallelism
# (--sequence-parallel) beside tp = 2: its step time, collectives and per-device
# activation and peak bytes. The fused backward's overlap of the
# input-gradient sums with the weight gradients (BRIGADE_TP_OVERLAP=weight,
# the default) against waiting inside the layer (=layer): step time and the
# exposed collective time; =microbatch (a forward beside another microbatch's
# backward) against =weight at 8 microbatches. bench/tp_plan.sh makes single plan/run pairs of the
# two plans with every pair's ratio and the per-microbatch breakdown against a trace.
# Usage: bench/tp_bench.sh [BUILD_DIR] [REPEATS]
set -euo pipefail
BUILD=${1:-build}; R=${2:-3}
B="$BUILD/brigade"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export BRIGADE_TIMEOUT=120
M="--model gpt --layers 2 --d-model 256 --heads 8 --seq 64"
RUN="$M --batch 8 --microbatches 2 --steps 12 --quiet"
. "$(dirname "$0")/lib.sh"
ms() { grep -o "median step [0-9.]* ms" | awk '{print $3}'; }
for i in $(seq 1 "$R"); do
  "$B" train $RUN --threads 1 2>/dev/null | ms >>"$T/t1"
  "$B" train $RUN --threads 2 2>/dev/null | ms >>"$T/t1x2"
  "$B" launch -n 2 -- "$B" train $RUN --threads 1 --tp 2 2>/dev/null | ms >>"$T/t2"
  "$B" launch -n 2 -- "$B" train $RUN --threads 1 --tp 2 --sequence-parallel 2>/dev/null | ms >>"$T/t2sp"
  BRIGADE_TP_OVERLAP=layer "$B" launch -n 2 -- "$B" train $RUN --threads 1 --tp 2 2>/dev/null | ms >>"$T/t2l"
done
t2l=$(med <"$T/t2l")
t1=$(med <"$T/t1"); t1x2=$(med <"$T/t1x2"); t2=$(med <"$T/t2"); t2sp=$(med <"$T/t2sp")
echo "step time tp 1 (1 thread)  : $t1 ms (runs: $(tr '\n' ' ' <"$T/t1"))"
echo "step time tp 1 (2 threads) : $t1x2 ms (runs: $(tr '\n' ' ' <"$T/t1x2"))"
echo "step time tp 2 (2 x 1)     : $t2 ms (runs: $(tr '\n' ' ' <"$T/t2"))"
echo "step time tp 2 + SP (2 x 1): $t2sp ms (runs: $(tr '\n' ' ' <"$T/t2sp"))"
echo "step time tp 2, sums waited for inside the layer (BRIGADE_TP_OVERLAP=layer): $t2l ms (runs: $(tr '\n' ' ' <"$T/t2l"));" \
     "weight / layer $(awk -v a="$t2" -v b="$t2l" 'BEGIN{printf "%.3f", a/b}')"
echo "speedup tp 2 vs tp 1 x 1 thread: $(awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%.2f", a/b}');" \
     "vs tp 1 x 2 threads: $(awk -v a="$t1x2" -v b="$t2" 'BEGIN{printf "%.2f", a/b}')"

# BRIGADE_TP_OVERLAP=microbatch (a forward beside another microbatch's backward, two coroutines per rank)
# against =weight, at 8 microbatches of one sequence (7 pairs a step in 1F1B), alternating, medians of
# R; with its peak bytes (one forward's slot and a scratch more)
RUN8="$M --batch 8 --microbatches 8 --steps 24 --quiet --threads 1 --tp 2"
for i in $(seq 1 "$R"); do
  for ov in weight microbatch; do
    BRIGADE_TP_OVERLAP=$ov "$B" launch -n 2 -- "$B" train $RUN8 --metrics "$T/mb_$ov.jsonl" 2>/dev/null | ms >>"$T/mb_$ov"
  done
done
mw=$(med <"$T/mb_weight"); mm=$(med <"$T/mb_microbatch")
kw=$(python3 -c "import json,sys; print(max(json.loads(l)['peak_bytes'] for l in open(sys.argv[1]) if 'peak_bytes' in l))" "$T/mb_weight.jsonl")
km=$(python3 -c "import json,sys; print(max(json.loads(l)['peak_bytes'] for l in open(sys.argv[1]) if 'peak_bytes' in l))" "$T/mb_microbatch.jsonl")
echo "tp 2, 8 microbatches: BRIGADE_TP_OVERLAP=weight $mw ms (runs: $(tr '\n' ' ' <"$T/mb_weight")), =microbatch $mm ms" \
     "(runs: $(tr '\n' ' ' <"$T/mb_microbatch")); microbatch / weight $(awk -v a="$mm" -v b="$mw" 'BEGIN{printf "%.3f", a/b}');" \
     "peak bytes $kw and $km"

# the collectives' share of the step, from the trace (steps 3.., every rank), without and with SP
for sp in "" --sequence-parallel layer; do
ov=weight; [ "$sp" = layer ] && { ov=layer; sp=; }
echo "tp 2${sp:+ $sp} (BRIGADE_TP_OVERLAP=$ov):"
BRIGADE_TP_OVERLAP=$ov "$B" launch -n 2 -- "$B" train $RUN --threads 1 --tp 2 $sp --trace "$T/tr.json" >/dev/null 2>&1
python3 - "$T/tr.json" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
step, coll, n = {}, {}, {}
for e in ev:
    a = e.get("args", {}); op = a.get("op"); s = a.get("step", 0)
    if op is None or s < 3: continue
    k = e["pid"]
    if op == "step": step[k] = step.get(k, 0) + e["dur"]
    if op.startswith("tp_"): coll[k] = coll.get(k, 0) + e["dur"]; n[k] = n.get(k, 0) + 1
steps = len({e["args"]["step"] for e in ev if e.get("args", {}).get("op") == "step" and e["args"]["step"] >= 3})
for k in sorted(step):
    print(f"rank {k}: {coll.get(k, 0) / step[k] * 100:.1f}% of the step in the tensor group's collectives "
          f"({n.get(k, 0) / steps:.0f} per step, {coll.get(k, 0) / steps / 1e3:.2f} of {step[k] / steps / 1e3:.2f} ms)")
PY
done

# per-device parameters and peak bytes
"$B" train $RUN --threads 1 --metrics "$T/m1.jsonl" >"$T/o1" 2>&1
"$B" launch -n 2 -- "$B" train $RUN --threads 1 --tp 2 --metrics "$T/m2.jsonl" >"$T/o2" 2>&1
p1=$(grep -o "[0-9]* parameters" "$T/o1" | awk '{print $1}')
p2=$(awk '$1 == 0 && $2 == 0 {print $4}' "$T/o2")
peak() { python3 -c "import json,sys; d=[json.loads(l) for l in open(sys.argv[1])]; print(max(x['peak_bytes'] for x in d if 'peak_bytes' in x and x.get('rank', 0) == 0))" "$1"; }
k1=$(peak "$T/m1.jsonl"); k2=$(peak "$T/m2.jsonl")
echo "parameters per device: tp 1 $p1, tp 2 $p2 (ratio $(awk -v a="$p2" -v b="$p1" 'BEGIN{printf "%.3f", a/b}'))"
echo "peak bytes per device: tp 1 $k1, tp 2 $k2 (ratio $(awk -v a="$k2" -v b="$k1" 'BEGIN{printf "%.3f", a/b}'))"
grep -A3 "^rank" "$T/o2" | head -3
# with SP: the same parameters; the activations between the blocks, the layernorms' and the residuals'
# split along the sequence (activations = peak - 16 bytes per parameter: weights, gradients, AdamW)
"$B" launch -n 2 -- "$B" train $RUN --threads 1 --tp 2 --sequence-parallel --metrics "$T/m3.jsonl" >"$T/o3" 2>&1
k3=$(peak "$T/m3.jsonl")
echo "peak bytes per device: tp 2 + SP $k3 (ratio to tp 2 $(awk -v a="$k3" -v b="$k2" 'BEGIN{printf "%.3f", a/b}'))"
echo "activations and scratch per device: tp 2 $((k2 - 16 * p2)), tp 2 + SP $((k3 - 16 * p2))" \
     "(ratio $(awk -v a="$((k3 - 16 * p2))" -v b="$((k2 - 16 * p2))" 'BEGIN{printf "%.3f", a/b}'))"
grep -A3 "^rank" "$T/o3" | head -3

# the planner's prediction of the tp = 2 plan (and of a tp = 2 x pp = 2 plan, 4 processes), against the
# run: plan --measure (the tp 2 build's layers timed on a group of 2 processes with their collectives),
# then train --plan, R times alternating; medians of the predicted and measured steps and of the ratio
# predicted / measured (the target: within 10%)
plan_vs_run() { # name, devices, plan flags...
  local name=$1 n=$2; shift 2
  "$B" plan $M --devices "$n" --mem 1G --batch 8 --tp 2 "$@" --schedule 1f1b --measure --threads 1 \
      --json "$T/$name.json" >"$T/$name.plan" 2>/dev/null || { echo "plan $name failed"; return; }
  "$B" launch -n "$n" -- "$B" train --plan "$T/$name.json" --steps 12 --threads 1 --quiet 2>/dev/null |
    awk '/^plan / {for (i = 1; i <= NF; i++) {if ($i == "step") p = $(i + 1); if ($i == "measured") m = $(i + 1)}
                    print p, m, p / m}' >>"$T/$name.pm"
}
for i in $(seq 1 "$R"); do
  plan_vs_run tp2 2 --microbatch-size 4
  plan_vs_run tp2pp2 4 --microbatch-size 2 --pp 2
done
for name in tp2 tp2pp2; do
  [ -s "$T/$name.pm" ] || { echo "$name: no run"; continue; }
  grep "best plan" "$T/$name.plan"
  echo "$name: predicted $(cut -d' ' -f1 "$T/$name.pm" | med) ms, measured $(cut -d' ' -f2 "$T/$name.pm" | med) ms," \
       "predicted/measured $(cut -d' ' -f3 "$T/$name.pm" | med) (median of $(wc -l <"$T/$name.pm");" \
       "ratios: $(awk '{printf "%.3f ", $3}' "$T/$name.pm"))"
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
