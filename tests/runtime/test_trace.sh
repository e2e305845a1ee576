#!/usr/bin/env bash
# tests/runtime/test_trace.sh: --trace writes one Chrome trace-event file with
# one track per rank and every compute op, send, receive and reduction with
# its microbatch; `brigade simulate --from-trace` replays it; bad input fails.
. "$(dirname "$0")/../lib/harness.sh"
export BRIGADE_TIMEOUT=60
if timeout 120 "$B" launch -n 4 -- "$B" train --layers 4 --d-model 16 --heads 2 --seq 16 --batch 16 --microbatches 4 \
     --steps 3 --threads 1 --pp 2 --dp 2 --schedule zb-h1 --trace "$T/t.json" --metrics "$T/m.jsonl" --quiet >"$T/o" 2>"$T/e"; then ok "traced run"
else bad "traced run failed"; cat "$T/e"; fi
python3 - "$T/t.json" <<'PY' && ok "trace content" || bad "trace content"
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
meta = d["otherData"]
assert meta["schedule"] == "zb-h1" and meta["pp"] == 2 and meta["dp"] == 2 and meta["microbatches"] == 4
tracks = {e["pid"] for e in ev}
assert tracks == {0, 1, 2, 3}, tracks
ops = {e["args"]["op"] for e in ev if "args" in e and "op" in e["args"]}
for need in ["F", "b", "W", "send_act", "recv_act", "send_grad", "recv_grad", "reduce_grads", "optimizer_step", "step",
             "ar_start", "ar_wait"]:
    assert need in ops, (need, ops)
for e in ev:
    if e.get("ph") == "X":
        assert e["dur"] >= 0 and e["ts"] >= -1e6
        if e["args"]["op"] in ("F", "b", "W"):
            assert 0 <= e["args"]["microbatch"] < 4
# gradient buckets start their reduction inside the backward (before the step's last B/W ends)
for r in range(4):
    for step in (2, 3):
        starts = [e["ts"] for e in ev
                  if e.get("pid") == r and e.get("args", {}).get("op") == "ar_start" and e["args"]["step"] == step]
        comp = [e["ts"] + e["dur"] for e in ev if e.get("pid") == r and e.get("args", {}).get("op") in ("b", "W") and e["args"]["step"] == step]
        assert starts and comp, (r, step)
        assert min(starts) < max(comp), ("no overlap", r, step)
# every rank runs F for each of the 4 microbatches in each of 3 steps
for r in range(4):
    f = [e for e in ev if e["pid"] == r and e.get("args", {}).get("op") == "F"]
    assert len(f) == 12, (r, len(f))
PY
if "$B" simulate --from-trace "$T/t.json" >"$T/s" 2>&1 && grep -q "simulated/measured" "$T/s"; then ok "$(tail -1 "$T/s")"; else bad "simulate"; cat "$T/s"; fi
# compute and communication on separate tracks (tids) of each rank, named
python3 - "$T/t.json" <<'PY' && ok "compute on tid 0, communication on tid 1" || bad "tracks"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
assert all(names[(r, 0)] == "compute" and names[(r, 1)] == "communication" for r in range(4)), names
for e in ev:
    if e.get("ph") != "X":
        continue
    op = e["args"]["op"]
    comm = op.startswith(("send_", "recv_", "ar_")) or op == "reduce_grads"
    assert e["tid"] == (1 if comm else 0), (op, e["tid"])
PY
# a trace written before the IR's names (B = backward-input, BW = full backward) still replays the same
python3 - "$T/t.json" "$T/old.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
old = {"b": "B", "B": "BW", "optimizer_step": "optimizer", "reduce_grads": "reduce"}
for e in d["traceEvents"]:
    if "args" in e and e["args"].get("op") in old:
        e["args"]["op"] = old[e["args"]["op"]]
json.dump(d, open(sys.argv[2], "w"))
PY
"$B" simulate --from-trace "$T/old.json" >"$T/s_old" 2>&1 && [ "$(grep simulated/measured "$T/s_old")" = "$(grep simulated/measured "$T/s")" ] \
  && ok "old trace names replay identically" || { bad "old trace"; cat "$T/s_old" "$T/s"; }
# the simulated and measured pictures share scale, ticks, unit and legend layout
SVGCHECK="$(dirname "$0")/../lib/svgcheck.py"
if "$B" simulate --from-trace "$T/t.json" --svg "$T/sim.svg" --svg-measured "$T/meas.svg" >/dev/null 2>"$T/e5" \
   && python3 "$SVGCHECK" "$T/sim.svg" --unit ms --title simulated --legend "forward (F)" "backward-weight (W)" \
        --not-legend "full backward (B)" \
   && python3 "$SVGCHECK" "$T/meas.svg" --unit ms --title measured --legend "forward (F)" "backward-input (b)" \
        "optimizer step (O)" --not-legend "full backward (B)" \
   && python3 "$SVGCHECK" "$T/sim.svg" --same-axis "$T/meas.svg"; then ok "simulated and measured pictures on one axis"
else bad "simulate pictures"; cat "$T/e5"; fi
echo '{"traceEvents": []}' >"$T/bad.json"
"$B" simulate --from-trace "$T/bad.json" 2>"$T/e2" && bad "simulate accepted a trace without metadata" || { grep -q "not a brigade executor trace" "$T/e2" && ok "metadata required" || bad "message: $(cat "$T/e2")"; }
# a step out of range is refused with the event and field named (it once wrote out of bounds)
python3 - "$T/t.json" "$T/negstep.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["traceEvents"].append({"ph": "X", "pid": 0, "ts": 0, "dur": 1, "args": {"op": "step", "step": -3}})
json.dump(d, open(sys.argv[2], "w"))
PY
timeout 20 "$B" simulate --from-trace "$T/negstep.json" 2>"$T/e4" && bad "simulate accepted step -3" || { grep -q "traceEvents\[[0-9]*\].args.step is -3" "$T/e4" && ok "negative step refused: $(cat "$T/e4")" || bad "message: $(cat "$T/e4")"; }
echo '{"traceEvents": [' >"$T/broken.json"
"$B" simulate --from-trace "$T/broken.json" 2>"$T/e3" && bad "simulate accepted broken JSON" || { grep -q "line" "$T/e3" && ok "broken JSON names the line" || bad "message: $(cat "$T/e3")"; }
python3 - "$T/m.jsonl" <<'PY' && ok "metrics from every rank" || bad "metrics"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert lines[0]["run"] == {"model": "gpt", "layers": 4, "d_model": 16, "pp": 2, "dp": 2, "schedule": "zb-h1"}, lines[0]
assert lines[0]["config"]["schedule"] == "zb-h1" and lines[0]["config"]["pp"] == "2", lines[0]  # the run's flags
rows = lines[1:]
assert len(rows) == 12, len(rows)
assert sorted((r["rank"], r["step"]) for r in rows) == [(r, s) for r in range(4) for s in (1, 2, 3)]
for r in rows:
    assert set(r) >= {"rank", "step", "loss", "tokens_per_s", "step_ms", "bubble", "bytes_sent", "peak_bytes", "heap_bytes"}
    assert 0 <= r["bubble"] < 1 and r["bytes_sent"] > 0 and r["peak_bytes"] > 0 and r["heap_bytes"] > 0  # glibc (Debian)
losses = {s: {r["loss"] for r in rows if r["step"] == s} for s in (1, 2, 3)}
assert all(len(v) == 1 for v in losses.values()), losses  # every rank reports the same mean loss
PY
"$B" plot "$T/m.jsonl" --out "$T/loss.svg" >/dev/null 2>&1 && python3 -c "import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1])" "$T/loss.svg" && ok "plot" || bad "plot"
finish
