#!/usr/bin/env bash
# tests/runtime/test_emulate.sh: brigade train --emulate. At p = 8 the
# emulated step time (real executor and transport, compute replaced by
# sleeps of the profiled times) is within 10% of the simulator's for the same
# program, per-stage costs and measured message latency (bench/emulate.sh;
# one retry, as other jobs on a loaded machine only ever slow the emulation
# down). The messages have the real sizes: an emulated run sends the bytes
# a computing run sends, per rank. The program is the one brigade schedule
# builds for the same per-stage costs. Parameter servers (--ps 1 --pp 2,
# workers emulated, the servers' update free, transfers real): K = 0 and K =
# 1 runs complete, every worker rank reports its staleness (0 at K = 0,
# within [0, 1] at K = 1 and 1 on some step), and the bytes pushed and
# pulled per rank and step are a computing run's. Bad profiles end with one
# line.
. "$(dirname "$0")/../lib/harness.sh"
S=${BRIGADE_SOURCE_DIR:?}

# 1. emulated vs simulated, p = 8, a one-chunk and a V schedule. The
# simulator does not model a sleeping rank's wake-up, which a loaded machine
# delays: the tolerance is 10 % plus the lateness measured just before each
# try (8 processes, one per rank, each sleeping 4 ms 100 times: their mean
# lateness per sleep as a fraction of 4 ms, the shortest emulated op).
lateness() {
  python3 - <<'PY'
import multiprocessing as mp, time
def rank(q):
    late = 0.0
    for _ in range(100):
        t = time.perf_counter()
        time.sleep(0.004)
        late += time.perf_counter() - t - 0.004
    q.put(late / 100)
q = mp.Queue()
ps = [mp.Process(target=rank, args=(q,)) for _ in range(8)]
for p in ps: p.start()
r = [q.get() for _ in ps]
for p in ps: p.join()
print("%.3f" % (sum(r) / len(r) / 0.004))
PY
}
for try in 1 2; do
  late=$(lateness)
  tol=$(awk -v l="$late" 'BEGIN { printf "%.3f", 0.10 + l }')
  if out=$(BRIGADE=$B timeout 120 "$S/bench/emulate.sh" --stages 8 --schedules "1f1b zbv dualpipe" --ms 4 --steps 4 --check "$tol" 2>&1)
  then ok "emulation at p = 8 within $tol of the simulator (10 % + wake-up lateness $late; try $try):"; echo "$out"; break; fi
  echo "$out"
  [ $try = 2 ] && bad "emulation at p = 8 is off from the simulator by more than $tol (10 % + wake-up lateness $late) twice"
done

# 2. real message sizes: bytes sent per rank as in a computing run
MLP="--model mlp --layers 4 --d-model 24 --in-features 12 --classes 6 --batch 16 --microbatches 4 --steps 2 --threads 1"
"$B" profile --model mlp --layers 4 --d-model 24 --in-features 12 --classes 6 --json "$T/prof.json" >/dev/null 2>&1 ||
  bad "brigade profile"
for mode in real emu; do
  e=""
  [ $mode = emu ] && e="--emulate $T/prof.json --emulate-scale 10"
  timeout 120 "$B" launch -n 2 -- "$B" train $MLP --pp 2 --schedule zb-h1 $e --metrics "$T/$mode.json" --quiet \
    >"$T/$mode.log" 2>&1 || { bad "$mode pp 2 run failed"; tail -3 "$T/$mode.log"; }
done
bytes() { python3 -c "import json,sys; print(sorted((r['rank'], r['step'], r['bytes_sent']) for r in map(json.loads, open(sys.argv[1])) if 'rank' in r))" "$1"; }
if [ "$(bytes "$T/real.json")" = "$(bytes "$T/emu.json")" ] && [ -n "$(bytes "$T/emu.json")" ]; then
  ok "emulated messages have the real sizes: $(bytes "$T/emu.json")"
else bad "bytes sent differ: real $(bytes "$T/real.json") emulated $(bytes "$T/emu.json")"; fi

# 2b. parameter servers: emulated workers, real pushes and pulls
for mode in real emu0 emu1; do
  e="--staleness ${mode#emu}"
  [ $mode = real ] && e=""
  case $mode in emu*) e="$e --emulate $T/prof.json --emulate-scale 10";; esac
  timeout 120 "$B" launch -n 5 -- "$B" train $MLP --steps 6 --pp 2 --ps 1 $e --metrics "$T/ps_$mode.json" --quiet \
    >"$T/ps_$mode.log" 2>&1 || { bad "--ps 1 --pp 2 $mode run failed"; tail -3 "$T/ps_$mode.log"; }
done
v=$(python3 - "$T/ps_real.json" "$T/ps_emu0.json" "$T/ps_emu1.json" <<'PY'
import json, sys
def rows(f): return [json.loads(l) for l in open(f) if l.strip()][1:]
def moved(f): return sorted((r["rank"], r["step"], r["bytes_sent"], r["bytes_recv"]) for r in rows(f))
real, emu0, emu1 = (rows(f) for f in sys.argv[1:])
assert moved(sys.argv[1]) == moved(sys.argv[2]) and len(real) == 30, "bytes pushed / pulled differ from a computing run"
for k, rs in ((0, emu0), (1, emu1)):
    st = [r["staleness"] for r in rs if r.get("role") == "worker"]
    assert len(st) == 24 and min(st) >= 0 and max(st) == k, (k, len(st), min(st) if st else None, max(st) if st else None)
    assert len([r for r in rs if r.get("role") == "server"]) == 6
print("ok: K = 1 staleness mean %.2f" % (sum(r["staleness"] for r in emu1 if r.get("role") == "worker") / 24))
PY
)
case $v in ok:*) ok "emulated --ps 1 --pp 2: real bytes per rank and step, per-worker staleness (${v#ok: })";;
  *) bad "emulated --ps 1 --pp 2: $v";; esac

# 3. the executor runs the program brigade schedule builds for the same
# per-stage costs (not the unit-cost one): the compute order of every rank
# in the trace equals the generated program's
python3 - "$T" <<'PY'
import json, sys
f = [1, 3, 1, 1, 2, 1, 1, 1, 4]   # uneven layers, F:B:W = 1:2:1
json.dump({"layers": [{"fwd_s": 1e-4 * x, "bwd_input_s": 2e-4 * x, "bwd_weight_s": 1e-4 * x} for x in f]},
          open(sys.argv[1] + "/uneven.json", "w"))
n = [2, 1, 1, 1, 1, 1, 1, 1]      # the executor's even split of 9 layers over 8 stages
at, cs = 0, []
for k in n:
    cs.append(sum(f[at:at + k]) * 1e-4); at += k
open(sys.argv[1] + "/uneven.costs", "w").write(" ".join(",".join("%.9g" % (c * r) for c in cs) for r in (1, 2, 1)))
PY
read -r FC BC WC <"$T/uneven.costs"
"$B" schedule --schedule zbv --stages 4 --microbatches 8 --f-costs "$FC" --b-costs "$BC" --w-costs "$WC" \
  --json "$T/costs.json" --no-text >/dev/null || bad "brigade schedule with costs"
"$B" schedule --schedule zbv --stages 4 --microbatches 8 --json "$T/unit.json" --no-text >/dev/null
MLP8="--model mlp --layers 4 --d-model 24 --in-features 12 --classes 6 --batch 8 --microbatches 8 --steps 1 --threads 1"
timeout 120 "$B" launch -n 4 -- "$B" train $MLP8 --pp 4 --schedule zbv --emulate "$T/uneven.json" --trace "$T/tr.json" \
  --quiet >"$T/tr.log" 2>&1 || { bad "emulated zbv pp 4 failed"; tail -3 "$T/tr.log"; }
v=$(python3 - "$T/tr.json" "$T/costs.json" "$T/unit.json" <<'PY'
import json, sys
tok = {"forward": "F", "backward": "B", "backward_input": "b", "backward_weight": "W"}
def prog(path):
    return [[(tok[o["kind"]], o["microbatch"], o["stage"]) for o in r["ops"] if o["kind"] in tok]
            for r in json.load(open(path))["ranks"]]
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"] if isinstance(d, dict) else d
ran = [[] for _ in range(4)]
for e in sorted((e for e in ev if e.get("args", {}).get("op") in tok.values()), key=lambda e: e["ts"]):
    a = e["args"]
    ran[e["pid"]].append((a["op"], a["microbatch"], a["stage"]))
costs, unit = prog(sys.argv[2]), prog(sys.argv[3])
print("same" if ran == costs and costs != unit else
      "differs from the unit-cost program too" if costs == unit else "ran %s" % ran[:1])
PY
)
if [ "$v" = same ]; then ok "the executor runs brigade schedule's program for the same costs (zbv p 4, uneven)"
else bad "the executor's program: $v"; fi

# 4. bad input: one line, nothing trained
python3 - "$T/prof.json" "$T" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
json.dump({"layers": d["layers"][:-1]}, open(sys.argv[2] + "/short.json", "w"))
d["layers"][2]["bwd_input_s"] = -1
json.dump(d, open(sys.argv[2] + "/neg.json", "w"))
PY
expect_train 1 "short.json profiles 8 layers but the model has 9" $MLP --emulate "$T/short.json"
expect_train 1 "neg.json: layers[2].bwd_input_s must be a number >= 0" $MLP --emulate "$T/neg.json"
expect_train 2 "cannot open $T/none.json" $MLP --emulate "$T/none.json"
expect_train 2 "--emulate-scale" $MLP --emulate "$T/prof.json" --emulate-scale 0
finish
