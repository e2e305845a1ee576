#!/usr/bin/env bash
# bench/ep_schedules.sh: pipeline schedules on an MoE model with expert parallelism, emulated: a GPT whose
# every block's MLP is an MoE, at pp P x dp 2 x ep 2 (2P ranks on this machine, every compute instruction a
# sleep of its stage's profiled time, the messages and the experts' all-to-alls real; docs/executor.md). For
# each schedule one row: the step time (median over steps 2.., the slowest rank of each), the all-to-all
# time per rank and step (the trace's ep_a2a events), its share of the step, and the all-to-all's overlap
# ratio: the share of its time during which the rank's other compute lane ran (the all-to-all blocks the
# instruction that calls it; with no second lane it hides behind nothing).
#
#   bench/ep_schedules.sh [--brigade PATH] [--stages P] [--schedules "1f1b zbv dualpipev dualpipe"]
#                         [--scale X] [--steps N]
set -u
B=${BRIGADE:-brigade}
P=4 SCHEDS="1f1b zbv dualpipev dualpipe" SCALE=10 STEPS=4
while [ $# -gt 0 ]; do
  case $1 in
    --brigade) B=$2; shift 2 ;;
    --stages) P=$2; shift 2 ;;
    --schedules) SCHEDS=$2; shift 2 ;;
    --scale) SCALE=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    *) echo "bench/ep_schedules.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
M="--layers $((2 * P)) --d-model 64 --heads 4 --seq 32 --experts 8 --top-k 2"
MB=$((2 * P))
# the profile of the whole layers (ep 1: one process runs every expert; a member of ep 2 runs about half)
"$B" profile $M --json "$T/prof.json" >/dev/null 2>&1 || { echo "bench/ep_schedules.sh: brigade profile failed" >&2; exit 1; }
printf "MoE GPT %s, pp %d x dp 2 x ep 2 (%d ranks), m = %d, emulated (profile x %s)\n" "$M" "$P" $((2 * P)) "$MB" "$SCALE"
printf "%-10s %9s %8s %13s %9s %9s\n" schedule "step ms" bubble "a2a ms/rank" "a2a/step" overlap
for S in $SCHEDS; do
  rm -f "$T/m.json" "$T/t.json"
  if ! timeout 600 "$B" launch -n $((2 * P)) -- "$B" train $M --ep 2 --pp "$P" --dp 2 --batch $((2 * MB)) \
      --microbatches "$MB" --schedule "$S" --steps "$STEPS" --threads 1 --emulate "$T/prof.json" \
      --emulate-scale "$SCALE" --metrics "$T/m.json" --trace "$T/t.json" --quiet >"$T/log" 2>&1; then
    echo "$S: brigade train --emulate failed:" >&2; tail -3 "$T/log" >&2; exit 1
  fi
  python3 - "$T/m.json" "$T/t.json" "$S" $((2 * P)) <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"rank"' in l]
n = int(sys.argv[4])
steps = sorted({r["step"] for r in rows})[1:] or sorted({r["step"] for r in rows})  # the first step warms up
st, bub = [], []
for s in steps:
    rs = [r for r in rows if r["step"] == s]
    T = max(r["step_ms"] for r in rs)
    st.append(T), bub.append(1 - sum((1 - r["bubble"]) * r["step_ms"] for r in rs) / (n * T))
k = st.index(statistics.median_low(st))
d = json.load(open(sys.argv[2]))
ev = d["traceEvents"] if isinstance(d, dict) else d
lane = {}                                   # per rank: compute events of the second lane (tid 2), if any
for e in ev:
    if e.get("ph") == "X" and e.get("tid") == 2:
        lane.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
a2a, hidden = 0.0, 0.0
for e in ev:
    if e.get("ph") == "X" and e.get("name", "").startswith("ep_a2a") and e.get("args", {}).get("step", 2) in steps:
        a, b = e["ts"], e["ts"] + e["dur"]
        a2a += b - a
        hidden += sum(max(0, min(b, y) - max(a, x)) for x, y in lane.get(e["pid"], []))
per = a2a / 1e3 / n / len(steps)
print("%-10s %9.1f %7.1f%% %13.2f %8.1f%% %8.1f%%" % (sys.argv[3], st[k], 100 * bub[k], per, 100 * per / st[k],
                                                   100 * hidden / a2a if a2a else 0))
PY
done
