#!/usr/bin/env bash
# bench/ep_schedules.sh: pipeline schedules on an MoE model with expert parallelism: a GPT whose every
# block's MLP is an MoE, at pp P x dp 2 x ep 2 (2P ranks on this machine). Emulated by default (every
# compute instruction a sleep of its stage's profiled time, the messages and the experts' all-to-alls real;
# docs/executor.md); --compute runs the layers. Each schedule runs twice, without and with
# BRIGADE_TP_OVERLAP=microbatch (column "paired": the executor runs a forward and the next compute
# instruction of another microbatch as two coroutines, and a lane whose all-to-all is in flight hands the
# thread to the other). One row each: the step time (median over steps 2.., the slowest rank of each), the
# all-to-all time per rank and step (the trace's ep_a2a events), its share of the step, and the all-to-all's
# overlap ratio: the share of its time during which the rank's other lane was computing (inside one of its
# compute instructions and not in an all-to-all of its own). Under --emulate no pair is built (the
# executor warns), so its paired rows equal the unpaired ones: measure the overlap with --compute.
#
#   bench/ep_schedules.sh [--brigade PATH] [--stages P] [--schedules "1f1b zbv dualpipev dualpipe"]
#                         [--scale X] [--steps N] [--compute]
set -u
B=${BRIGADE:-brigade}
P=4 SCHEDS="1f1b zbv dualpipev dualpipe" SCALE=10 STEPS=4 COMPUTE=0
while [ $# -gt 0 ]; do
  case $1 in
    --brigade) B=$2; shift 2 ;;
    --stages) P=$2; shift 2 ;;
    --schedules) SCHEDS=$2; shift 2 ;;
    --scale) SCALE=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --compute) COMPUTE=1; shift ;;
    *) echo "bench/ep_schedules.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
M="--layers $((2 * P)) --d-model 64 --heads 4 --seq 32 --experts 8 --top-k 2"
MB=$((2 * P))
EMU=() HOW="computing"
if [ "$COMPUTE" = 0 ]; then
  # the profile of the whole layers (ep 1: one process runs every expert; a member of ep 2 runs about half)
  "$B" profile $M --json "$T/prof.json" >/dev/null 2>&1 || { echo "bench/ep_schedules.sh: brigade profile failed" >&2; exit 1; }
  EMU=(--emulate "$T/prof.json" --emulate-scale "$SCALE") HOW="emulated (profile x $SCALE)"
fi
printf "MoE GPT %s, pp %d x dp 2 x ep 2 (%d ranks), m = %d, %s\n" "$M" "$P" $((2 * P)) "$MB" "$HOW"
printf "%-10s %6s %9s %8s %13s %9s %9s\n" schedule paired "step ms" bubble "a2a ms/rank" "a2a/step" overlap
for S in $SCHEDS; do
 for PAIRED in no yes; do
  rm -f "$T/m.json" "$T/t.json"
  OV=weight; [ "$PAIRED" = yes ] && OV=microbatch
  if ! BRIGADE_TP_OVERLAP=$OV timeout 600 "$B" launch -n $((2 * P)) -- "$B" train $M --ep 2 --pp "$P" --dp 2 \
      --batch $((2 * MB)) --microbatches "$MB" --schedule "$S" --steps "$STEPS" --threads 1 "${EMU[@]}" \
      --metrics "$T/m.json" --trace "$T/t.json" --quiet >"$T/log" 2>&1; then
    echo "$S: brigade train failed:" >&2; tail -3 "$T/log" >&2; exit 1
  fi
  python3 - "$T/m.json" "$T/t.json" "$S" $((2 * P)) "$PAIRED" <<'PY'
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
# per rank and lane (trace tid 0: lane 0, tid 2: lane 1): its compute instructions and its all-to-alls
COMPUTE_OPS = {"F", "B", "b", "W"}
ops, a2as = {}, {}
for e in ev:
    if e.get("ph") != "X" or e.get("tid") not in (0, 2):
        continue
    iv = (e["ts"], e["ts"] + e["dur"])
    op = e.get("args", {}).get("op")
    if op == "ep_a2a" and e.get("args", {}).get("step", 2) in steps:
        a2as.setdefault((e["pid"], e["tid"]), []).append(iv)
    elif op in COMPUTE_OPS:
        ops.setdefault((e["pid"], e["tid"]), []).append(iv)

def minus(ivs, cuts):
    """the parts of intervals ivs outside every interval of cuts"""
    out = []
    for a, b in ivs:
        parts = [(a, b)]
        for x, y in cuts:
            parts = [p for lo, hi in parts for p in ((lo, min(hi, x)), (max(lo, y), hi)) if p[1] > p[0]]
        out += parts
    return out

a2a, hidden = 0.0, 0.0
for (pid, tid), ivs in a2as.items():
    other = 2 - tid
    busy = minus(ops.get((pid, other), []), a2as.get((pid, other), []))  # the other lane computing
    for a, b in ivs:
        a2a += b - a
        hidden += sum(max(0, min(b, y) - max(a, x)) for x, y in busy)
per = a2a / 1e3 / n / len(steps)
print("%-10s %6s %9.1f %7.1f%% %13.2f %8.1f%% %8.1f%%" % (sys.argv[3], sys.argv[5], st[k], 100 * bub[k], per,
                                                        100 * per / st[k], 100 * hidden / a2a if a2a else 0))
PY
 done
done
