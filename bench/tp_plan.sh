#!/usr/bin/env bash
# bench/tp_plan.sh: does one `plan --measure` predict one run? R single pairs
# (plan --measure, then train --plan --trace), alternating a tp = 2 plan (2
# processes) and a tp = 2 x pp = 2 plan (4 processes), for the GPT of
# bench/tp_bench.sh (2 blocks, d_model 256, 8 heads, seq 64, batch 8, 1F1B).
# Every pair prints predicted / measured (train --plan's own figure: the
# median of its STEPS steps, default 60: a 12-step run, 0.3 s, fell in one burst of other work; the target: within 10%), the load average around
# it, and where the two differ: per microbatch the plan's
# forward and backward (sums of its layers' fwd_ms, bwd_ms) against the
# trace's F and B of rank 0 (medians of steps 3..), the plan's optimizer step
# (its stages' opt_ms) against the trace's, and the trace's step.
# Usage: bench/tp_plan.sh [BUILD_DIR] [REPEATS] [which: tp2,tp2pp2]
# (PLANNER=path/to/brigade plans with another build, to compare planners on the same runs)
set -euo pipefail
BUILD=${1:-build}; R=${2:-5}; WHICH=${3:-tp2,tp2pp2}; STEPS=${STEPS:-60}
B="$BUILD/brigade"; P=${PLANNER:-$B}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export BRIGADE_TIMEOUT=120
M="--model gpt --layers 2 --d-model 256 --heads 8 --seq 64"
pair() { # name, devices, plan flags...
  local name=$1 n=$2; shift 2
  local l0; l0=$(cut -d' ' -f1 /proc/loadavg)
  "$P" plan $M --devices "$n" --mem 1G --batch 8 --tp 2 "$@" --schedule 1f1b --measure --threads 1 \
      --json "$T/$name.json" >"$T/$name.plan" 2>"$T/$name.err" || { echo "$name: plan failed: $(cat "$T/$name.err")"; return; }
  "$B" launch -n "$n" -- "$B" train --plan "$T/$name.json" --steps "$STEPS" --threads 1 --quiet --trace "$T/$name.trace" \
      >"$T/$name.run" 2>&1 || { echo "$name: run failed: $(tail -1 "$T/$name.run")"; return; }
  python3 - "$name" "$T/$name.json" "$T/$name.trace" "$l0" "$(cut -d' ' -f1 /proc/loadavg)" "$T/$name.err" \
      "$T/$name.run" <<'PY' | tee -a "$T/$name.pairs"
import json, re, statistics as S, sys
name, plan, trace, l0, l1, err, out = sys.argv[1:]
p = json.load(open(plan)); ev = json.load(open(trace))["traceEvents"]
L = p["layers"]; st = p["stages"]; m = p["microbatches"]
f = max(sum(L[i]["fwd_ms"] for i in range(s["first_layer"], s["last_layer"] + 1)) for s in st)
b = max(sum(L[i]["bwd_ms"] for i in range(s["first_layer"], s["last_layer"] + 1)) for s in st)
o = max(sum(L[i].get("opt_ms", 0) for i in range(s["first_layer"], s["last_layer"] + 1)) for s in st)
per = {}
for e in ev:
    a = e.get("args", {}); op = a.get("op"); k = a.get("step", 0)
    if op is None or k < 3 or e["pid"] != 0: continue
    per.setdefault(k, {}); per[k][op] = per[k].get(op, 0) + e["dur"] / 1e3
med = lambda op: S.median(r.get(op, 0) for r in per.values())
run = float(re.search(r"^plan .* measured ([0-9.]+) ms", open(out).read(), re.M).group(1))
busy = " (spread warning)" if "busy while measuring" in open(err).read() else ""
print(f"{name}: predicted {p['predicted_step_ms']:.2f} ms, measured {run:.2f} ms, predicted/measured "
      f"{p['predicted_step_ms'] / run:.3f}; per microbatch F {f:.2f} / {med('F') / m:.2f}, B {b:.2f} / "
      f"{med('B') / m:.2f}, optimizer {o:.2f} / {med('optimizer_step'):.2f} ms (plan / trace rank 0), trace step {med('step'):.2f} ms "
      f"(steps 3..); "
      f"load {l0} -> {l1}{busy}")
PY
}
IFS=, read -ra names <<<"$WHICH"
for i in $(seq 1 "$R"); do
  for name in "${names[@]}"; do
    case $name in
      tp2) pair tp2 2 --microbatch-size 4 ;;
      tp2pp2) pair tp2pp2 4 --microbatch-size 2 --pp 2 ;;
      *) echo "unknown plan $name (tp2, tp2pp2)"; exit 2 ;;
    esac
  done
done
for name in "${names[@]}"; do
  [ -s "$T/$name.pairs" ] || { echo "$name: no pair"; continue; }
  grep -o "predicted/measured [0-9.]*" "$T/$name.pairs" | awk '{print $2}' | sort -g |
    awk -v n="$name" '{r[NR] = $1; if ($1 >= 0.9 && $1 <= 1.1) w++}
      END {printf "%s: %d pairs, predicted/measured median %.3f, range %.3f-%.3f, within 10%%: %d of %d\n",
           n, NR, r[int((NR + 1) / 2)], r[1], r[NR], w, NR}'
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
