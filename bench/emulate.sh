#!/usr/bin/env bash
# bench/emulate.sh: emulated scale against the simulator. For each pipeline
# degree P and schedule, `brigade train --emulate` runs the real executor and
# transport at P ranks on this machine, every compute instruction a sleep of
# its stage's profiled time; the same program (brigade schedule --json built
# for the same per-stage costs, as the executor builds it) is simulated with
# those costs and the message latency measured by brigade bench p2p. Prints one row
# per run: emulated and simulated step time (median over steps, the slowest
# rank of each step) and bubble (idle / (P x step)), and their ratio.
#
#   bench/emulate.sh [--brigade PATH] [--stages "8 16 32"] [--schedules "1f1b zbv ..."]
#                    [--ms X] [--fbw F,B,W] [--steps N] [--check TOL]
# --ms: milliseconds per layer and unit of --fbw (default 1; the MLP of P
# hidden layers has 2P+1 layers); --check TOL: exit 1 when a step time is
# off by more than TOL (a fraction) from the simulator's.
set -u
B=${BRIGADE:-brigade}
PS="8 16 32"
SCHEDS="gpipe 1f1b interleaved zb-h1 zb-h2 zbv zb-interleaved dualpipev dualpipe"
MS=1 FBW=1,2,1 STEPS=4 CHECK=""
while [ $# -gt 0 ]; do
  case $1 in
    --brigade) B=$2; shift 2 ;;
    --stages) PS=$2; shift 2 ;;
    --schedules) SCHEDS=$2; shift 2 ;;
    --ms) MS=$2; shift 2 ;;
    --fbw) FBW=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --check) CHECK=$2; shift 2 ;;
    *) echo "bench/emulate.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
D=16 MBN=1
# the message time: one activation (MBN x D floats) between two ranks
timeout 60 "$B" launch -n 2 -- "$B" bench p2p --sizes $((MBN * D * 4)) --json "$T/p2p.json" >/dev/null 2>&1 ||
  { echo "bench/emulate.sh: brigade bench p2p failed" >&2; exit 1; }
LAT=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); r=r['rows'] if isinstance(r,dict) else r; print(r[0]['latency_us']*1e-6)" "$T/p2p.json")
printf "emulated vs simulated: MLP (P hidden layers, d %d), m = 2P, %s ms per layer x F,B,W = %s, latency %.1f us\n" \
  "$D" "$MS" "$FBW" "$(python3 -c "print($LAT*1e6)")"
printf "%-15s %3s %4s %11s %11s %7s %9s %9s\n" schedule P m "emu ms" "sim ms" ratio "emu bub" "sim bub"
worst=0
for P in $PS; do
  M=$((2 * P))
  for S in $SCHEDS; do
    V=1 C=1
    case $S in interleaved | zb-interleaved | zbv | dualpipev | dualpipe) V=2 ;; esac
    [ "$S" = dualpipe ] && C=2   # two copies of the model: P model stages, each on two ranks
    L=$((2 * P + 1)) NS=$((P * V / C))
    MODEL="--model mlp --layers $P --d-model $D --in-features 8 --classes 4 --batch $((MBN * M)) --microbatches $M"
    # the profile (every layer the same), the split (even by count), per-stage costs
    python3 - "$L" "$NS" "$MS" "$FBW" "$T/prof.json" "$T/costs" "$C" <<'PY'
import json, sys
L, S, ms, fbw, prof, costs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
copies = int(sys.argv[7])  # per-stage costs name every virtual stage: each copy's stages again
f, b, w = (float(x) * ms * 1e-3 for x in fbw.split(","))
json.dump({"layers": [{"name": "l%d" % i, "fwd_s": f, "bwd_input_s": b, "bwd_weight_s": w, "bwd_s": b + w}
                      for i in range(L)]}, open(prof, "w"))
n = [L // S + (1 if i < L % S else 0) for i in range(S)]
with open(costs, "w") as o:
    o.write(",".join(map(str, n)) + "\n")
    for c in (f, b, w):
        o.write(",".join("%.9g" % (k * c) for k in n * copies) + "\n")
PY
    SPLIT=$(sed -n 1p "$T/costs") FC=$(sed -n 2p "$T/costs") BC=$(sed -n 3p "$T/costs") WC=$(sed -n 4p "$T/costs")
    CH=""
    [ "$S" = interleaved ] || [ "$S" = zb-interleaved ] && CH="--chunks 2"
    # the program the executor runs: generated for the emulated per-stage costs
    "$B" schedule --schedule "$S" --stages "$P" --microbatches "$M" $CH --f-costs "$FC" --b-costs "$BC" \
      --w-costs "$WC" --json "$T/prog.json" --no-text >/dev/null ||
      { echo "$S p=$P: brigade schedule failed" >&2; exit 1; }
    SIM=$("$B" schedule --from-json "$T/prog.json" --f-costs "$FC" --b-costs "$BC" --w-costs "$WC" --latency "$LAT" \
      --no-text | sed -n 2p)
    rm -f "$T/m.json"
    if ! timeout 300 "$B" launch -n "$P" -- "$B" train $MODEL --pp "$P" --schedule "$S" $CH --split "$SPLIT" \
        --steps "$STEPS" --threads 1 --emulate "$T/prof.json" --metrics "$T/m.json" --quiet >"$T/log" 2>&1; then
      echo "$S p=$P: brigade train --emulate failed:" >&2; tail -3 "$T/log" >&2; exit 1
    fi
    row=$(python3 - "$T/m.json" "$SIM" "$P" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"rank"' in l]
P = int(sys.argv[3])
steps = sorted({r["step"] for r in rows})
steps = steps[1:] if len(steps) > 1 else steps          # the first step warms up
st, bub = [], []
for s in steps:
    rs = [r for r in rows if r["step"] == s]
    T = max(r["step_ms"] for r in rs)
    busy = sum((1 - r["bubble"]) * r["step_ms"] for r in rs)
    st.append(T), bub.append(1 - busy / (P * T))
k = st.index(statistics.median_low(st))
m = re.search(r"step time ([0-9.e+-]+)\s+bubble ([0-9.]+)%", sys.argv[2])
sim, sbub = float(m.group(1)) * 1e3, float(m.group(2)) / 100
print("%.2f %.2f %.4f %.1f%% %.1f%%" % (st[k], sim, st[k] / sim, 100 * bub[k], 100 * sbub))
PY
)
    set -- $row
    printf "%-15s %3d %4d %11s %11s %7s %9s %9s\n" "$S" "$P" "$M" "$1" "$2" "$3" "$4" "$5"
    worst=$(python3 -c "print(max($worst, abs($3 - 1)))")
  done
done
echo "worst step-time difference: $(python3 -c "print('%.1f%%' % (100 * $worst))")"
if [ -n "$CHECK" ] && python3 -c "import sys; sys.exit(0 if $worst > $CHECK else 1)"; then
  echo "bench/emulate.sh: a step time is off by more than $CHECK of the simulator's" >&2
  exit 1
fi
exit 0
