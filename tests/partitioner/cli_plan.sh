#!/usr/bin/env bash
# tests/partitioner/cli_plan.sh: `brigade plan` end to end: one-line messages
# and non-zero exits on bad input, a heterogeneous device list, the no-fit
# answer (its smallest budget fits and one byte less does not), and the plan
# JSON's documented fields.
. "$(dirname "$0")/../lib/harness.sh"
M="--layers 6 --d-model 64 --heads 4 --seq 32 --batch 16 --microbatch-size 2"

# expect_err NEEDLE ARGS...: `brigade plan ARGS` fails with one line holding NEEDLE
expect_err() { expect_err_line plan "$@"; }

"$B" plan --help >/dev/null || fail "--help"
expect_err "--devices N is required" $M --mem 1G
expect_err "--mem is required" $M --devices 4
expect_err "a size must be > 0" $M --devices 4 --mem 0
expect_err "a size must be > 0" $M --devices 4 --mem -1G
expect_err "--mem has 2 entries but --devices is 4" $M --devices 4 --mem 1G,1G
expect_err "empty entry 1" $M --devices 2 --mem 1G,,1G
expect_err "expects a positive size" $M --devices 2 --mem 1G,abc
expect_err "--speed has 3 entries but --devices is 4" $M --devices 4 --mem 1G --speed 1,1,1
expect_err "speeds must be > 0" $M --devices 2 --mem 1G --speed 1,0
expect_err "speeds must be > 0" $M --devices 2 --mem 1G --speed 1,-2
expect_err "is not a number" $M --devices 2 --mem 1G --speed 1,x
expect_err "--devices must be in [1," $M --devices 0 --mem 1G
expect_err "--schedule must be one of gpipe, 1f1b, interleaved, zb-h1, zb-h2, zbv, zb-interleaved, dualpipev or dualpipe, got \"pipedream\"" $M --devices 2 --mem 1G --schedule pipedream
expect_err "--link-latency expects a time" $M --devices 2 --mem 1G --link-latency 5parsecs
expect_err "--model must be one of gpt, mlp or llama" --model rnn --devices 2 --mem 1G
expect_err "does not divide" $M --devices 4 --mem 1G --pp 3
expect_err "unexpected argument" $M --devices 2 --mem 1G extra

# a heterogeneous list plans and writes the documented JSON
"$B" plan $M --devices 4 --mem 64M,64M,32M,32M --speed 1,1,0.5,0.5 --json "$T/plan.json" >"$T/out" 2>"$T/err" \
    || fail "heterogeneous plan failed: $(cat "$T/err")"
grep -q "best plan: pp" "$T/out" || fail "no best plan line: $(cat "$T/out")"
grep -q "top layouts" "$T/out" || fail "no top layouts"
for k in '"world"' '"pp"' '"dp"' '"tp"' '"microbatches"' '"schedule"' '"predicted_step_ms"' '"layers"' '"stages"' \
         '"first_layer"' '"last_layer"' '"budget_bytes"' '"predicted_peak_bytes"' '"recompute"' \
         '"predicted_ms_per_microbatch"' '"model"' '"split"' '"stash_bytes"' '"fwd_flops"'; do
    grep -q "$k" "$T/plan.json" || fail "plan JSON lacks $k"
done

# the plan carries the model's description, which brigade train rebuilds and runs
python3 - "$T/plan.json" <<'PY' || fail "plan JSON's model is not the description"
import json, sys
p = json.load(open(sys.argv[1]))
m = p["model"]
assert p["version"] == 2 and m["format"] == "brigade-model" and m["builder"]["name"] == "gpt", m
assert [l["name"] for l in m["layers"]] == [l["name"] for l in p["layers"]], "layers differ"
assert m["input"]["seq_len"] == p["seq"] == 32
PY
"$B" plan --model mlp --layers 2 --d-model 16 --in-features 8 --classes 4 --devices 2 --mem 1G --pp 2 --batch 4 \
    --microbatch-size 1 --json "$T/mlp.json" >/dev/null 2>"$T/err" || fail "mlp plan failed: $(cat "$T/err")"
"$B" train --plan "$T/mlp.json" --steps 1 >"$T/out" 2>&1 && fail "a pp 2 plan ran in one process"
grep -q "pp 2 x dp 1 = 2 ranks" "$T/out" || fail "train --plan did not take the plan's layout: $(cat "$T/out")"
"$B" train --plan "$T/mlp.json" --model mlp --layers 3 --steps 1 >"$T/out" 2>&1 && fail "another model's flags ran"
grep -q "was made for another model than the flags describe: the plan is from another model" "$T/out" \
    || fail "the mismatch is not named: $(cat "$T/out")"
# a plan whose $.split contradicts its $.stages, or whose stages share a rank, is refused on load
python3 - "$T/mlp.json" "$T" <<'PY' || fail "could not write the contradicting plans"
import json, sys
p = json.load(open(sys.argv[1])); t = sys.argv[2]
a = json.loads(json.dumps(p)); a["split"] = [a["split"][0] + 1, a["split"][1] - 1]
json.dump(a, open(t + "/split.json", "w"))
b = json.loads(json.dumps(p)); b["stages"][1]["rank"] = 0
json.dump(b, open(t + "/samerank.json", "w"))
PY
"$B" train --plan "$T/split.json" --steps 1 >"$T/out" 2>&1 && fail "a plan whose split contradicts its stages ran"
grep -q 'plan: $.split\[0\] is [0-9]* but $.stages\[0\] holds layers 0\.\.[0-9]* ([0-9]* layers)' "$T/out" \
    || fail "the contradicting split is not named: $(cat "$T/out")"
"$B" train --plan "$T/samerank.json" --steps 1 >"$T/out" 2>&1 && fail "a plan with two stages on rank 0 ran"
grep -q 'plan: $.stages\[0\] and $.stages\[1\] are both rank 0.s chunk 0' "$T/out" \
    || fail "the repeated rank is not named: $(cat "$T/out")"

# nothing fits: the answer names the stage and the layer and gives the smallest budget
# (at tp = 1: by default a model that does not fit falls back to the smallest tp that fits, tested below)
"$B" plan $M --devices 4 --mem 200000 --tp 1 >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 1 ] || fail "no-fit exit code $rc (expected 1)"
[ "$(wc -l <"$T/err")" -eq 1 ] || fail "no-fit error is not one line: $(cat "$T/err")"
grep -q "short by" "$T/err" || fail "no-fit lacks the shortfall: $(cat "$T/err")"
grep -q "biggest layer is" "$T/err" || fail "no-fit lacks the layer: $(cat "$T/err")"
need=$(sed -n 's/.*Smallest budget that fits: \([0-9]*\) bytes.*/\1/p' "$T/err")
if [ -z "$need" ]; then
    fail "no smallest budget in: $(cat "$T/err")"
else
    "$B" plan $M --devices 4 --mem "$need" --tp 1 >/dev/null 2>"$T/err" || fail "--mem $need (the smallest budget) does not fit: $(cat "$T/err")"
    "$B" plan $M --devices 4 --mem "$((need - 1))" --tp 1 >/dev/null 2>&1 && fail "--mem $((need - 1)) fits: $need is not the smallest"
fi

# a layer too big for one device at tp = 1: the smallest tp that fits, said so; its plan runs
G="--model gpt --layers 2 --d-model 512 --heads 8 --seq 64 --vocab 32768 --batch 8"
"$B" plan $G --devices 4 --mem 200M --tp 1 >/dev/null 2>&1 && fail "the big head fits at tp 1 in 200M"
"$B" plan $G --devices 4 --mem 200M --json "$T/tp.json" >"$T/out" 2>"$T/err" || fail "no tp fallback: $(cat "$T/err")"
grep -q "nothing fits at tp = 1 (.*biggest layer is head); tp = 2 is the smallest tensor-parallel degree that fits" "$T/out" \
    || fail "the fallback is not said: $(head -3 "$T/out")"
grep -q "best plan: pp [0-9]* x dp [0-9]* x tp 2 = 4 devices" "$T/out" || fail "best plan is not tp 2: $(cat "$T/out")"
python3 -c "import json,sys; p=json.load(open(sys.argv[1])); assert p['tp'] == 2 and p['pp'] * p['dp'] * 2 == 4" "$T/tp.json" \
    || fail "plan JSON lacks tp 2"
"$B" plan $G --devices 4 --mem 200M --tp all >"$T/out" 2>&1 || fail "--tp all failed"
grep -q "x tp [24] = 4 devices" "$T/out" || fail "--tp all did not choose tp > 1: $(cat "$T/out")"
"$B" plan $G --devices 4 --mem 200M --tp 3 >"$T/out" 2>&1 && fail "--tp 3 of 4 devices accepted"
grep -q "tp 3 does not divide 4 devices" "$T/out" || fail "--tp 3 message: $(cat "$T/out")"

# recomputation is chosen only where needed
"$B" plan $M --devices 2 --mem 4G --recompute >"$T/out" 2>&1 || fail "recompute plan failed"
grep -q " yes$" "$T/out" && fail "recomputes although everything fits: $(cat "$T/out")"

# measured layer times: a tiny model, one thread
expect_err "--measure times one microbatch size" --layers 2 --d-model 32 --heads 4 --seq 16 --devices 2 --mem 1G --measure
"$B" plan --layers 2 --d-model 32 --heads 4 --seq 16 --batch 4 --microbatch-size 1 --devices 2 --mem 1G \
    --measure --threads 1 >"$T/out" 2>&1 || fail "--measure failed: $(cat "$T/out")"
grep -q "measured per microbatch: forward" "$T/out" || fail "--measure printed no times: $(cat "$T/out")"
grep -q "optimizer step [0-9.]* ms; [0-9]* rounds, spread" "$T/out" || fail "--measure printed no optimizer step or rounds: $(cat "$T/out")"
expect_err "--host-ranks says how many ranks --measure runs at once" $M --devices 2 --mem 1G --host-ranks 1
expect_err "--host-ranks 3 is more than the plan's 2 devices" $M --devices 2 --mem 1G --measure --host-ranks 3
expect_err "--host-ranks" $M --devices 2 --mem 1G --measure --host-ranks 0

# --measure --tp 2: the tp 2 build's layers timed on a group of 2 processes with their collectives; the
# plan's per-layer costs are those measurements (layer_times measured_tp), the collectives' share
# measured: present in the blocks and the head, none in ln_f (a layernorm sums nothing); the JSON loads
# (brigade train --plan checks it against the model before running)
export BRIGADE_TIMEOUT=${BRIGADE_TIMEOUT:-60}
if timeout 120 "$B" plan --layers 2 --d-model 32 --heads 4 --seq 16 --batch 4 --microbatch-size 2 --devices 2 \
     --mem 1G --tp 2 --measure --threads 1 --json "$T/tpm.json" >"$T/out" 2>&1; then
  grep -q "on a tensor group of 2 processes" "$T/out" || fail "--measure --tp 2 did not say it measured a group: $(cat "$T/out")"
  python3 - "$T/tpm.json" "$T/out" <<'PY' || fail "--measure --tp 2 plan JSON: see above"
import json, os, re, sys
p = json.load(open(sys.argv[1]))
# the cache rule: per process the weights, gradients and one microbatch's stash of every layer
# (the plan's own figures), times the 2 processes, against the last-level cache (sysfs): warm
# when it fits, else half of it evicted before each call
m = re.search(r"caches: ([0-9.]+) MiB per process .* x 2 processes = ([0-9.]+) MiB, last-level cache ([0-9.]+) MiB: "
              r"layers timed (warm|with half the cache evicted)", open(sys.argv[2]).read())
assert m, "no caches line"
ws = sum(2 * 4 * l["params"] + l["stash_bytes"] for l in p["layers"]) / 2**20
assert abs(float(m.group(1)) - ws) < 0.06 and abs(float(m.group(2)) - 2 * ws) < 0.11, (m.group(0), ws)
f = "/sys/devices/system/cpu/cpu0/cache/index3/size"
llc = int(open(f).read().strip().rstrip("K")) / 1024 if os.path.exists(f) else 32
assert abs(float(m.group(3)) - llc) < 0.06, (m.group(0), llc)
assert (m.group(4) == "warm") == (2 * ws <= llc), m.group(0)
assert p["tp"] == 2 and p["layer_times"] == "measured_tp", (p["tp"], p.get("layer_times"))
L = {l["name"]: l for l in p["layers"]}
for l in p["layers"]:
    assert l["fwd_ms"] > 0 and l["bwd_ms"] > 0 and l["tp_ms"] >= 0, l
assert L["blocks.0"]["tp_ms"] > 0 and L["head"]["tp_ms"] > 0, (L["blocks.0"], L["head"])
assert L["ln_f"]["tp_ms"] == 0, L["ln_f"]
assert abs(p["stages"][0]["predicted_ms_per_microbatch"] - sum(l["fwd_ms"] + l["bwd_ms"] for l in p["layers"])) < 1e-6
# the optimizer step measured: every layer with parameters has one (ln_f's is tiny but timed)
assert all(l["opt_ms"] > 0 for l in p["layers"] if l["params"] > 0), [l["opt_ms"] for l in p["layers"]]
PY
  timeout 120 "$B" launch -n 2 -- "$B" train --plan "$T/tpm.json" --steps 1 --threads 1 --quiet >"$T/run" 2>&1 \
    || fail "train --plan of the measured tp 2 plan: $(cat "$T/run")"
else
  fail "--measure --tp 2 failed: $(cat "$T/out")"
fi
# by default (tp 1, and the smallest degree that fits when nothing does): the degree found is measured too
timeout 120 "$B" plan --layers 1 --d-model 64 --heads 2 --seq 8 --vocab 16384 --batch 4 --microbatch-size 1 \
    --devices 4 --mem 12M --measure --threads 1 --json "$T/tpa.json" >"$T/out" 2>&1 || fail "--measure, tp found: $(cat "$T/out")"
grep -q "tp = 2 is the smallest" "$T/out" && grep -q '"layer_times": "measured_tp"' "$T/tpa.json" ||
  fail "--measure did not measure the degree it fell back to: $(cat "$T/out")"
# 4 ranks on this machine: measured 4 at once; where they outnumber the cores, the output says they share them
NCPU=$(getconf _NPROCESSORS_ONLN)
if [ "$NCPU" -lt 4 ]; then
  grep -q "note: 4 processes of 1 thread outnumber this machine's $NCPU cores" "$T/out" ||
    fail "--measure with more ranks than cores did not say they share them: $(cat "$T/out")"
  grep -q "note: the plan's 4 ranks outnumber this machine's $NCPU cores: .* no prediction" "$T/out" ||
    fail "a plan of more ranks than cores claimed a prediction: $(cat "$T/out")"
else
  grep -q "outnumber" "$T/out" && fail "--measure said 4 ranks outnumber $NCPU cores: $(cat "$T/out")"
fi
# a budget tp 2 fits only with sequence parallelism (22.98 MiB without, 21.47 MiB with, of which 256 KiB the
# input gradient's reduce-scatter buffer that overlaps the weight gradient: docs/benchmarks.md):
# the planner takes it, says so, measures that build, and the run stays within the budget
SPM="--layers 2 --d-model 256 --heads 8 --seq 64 --batch 8 --microbatch-size 4 --devices 2 --schedule 1f1b --threads 1"
if timeout 120 "$B" plan $SPM --mem 22M --tp 2 --measure --json "$T/sp.json" >"$T/out" 2>&1; then
  grep -q "tp = 2 fits only with sequence parallelism" "$T/out" || fail "no sequence-parallelism note: $(cat "$T/out")"
  grep -q '"sequence_parallel": true' "$T/sp.json" && grep -q '"layer_times": "measured_tp"' "$T/sp.json" ||
    fail "the plan at 22M is not a measured sequence-parallel one: $(grep -o '"sequence_parallel[^,]*\|"layer_times[^,]*' "$T/sp.json")"
  if timeout 120 "$B" launch -n 2 -- "$B" train --plan "$T/sp.json" --steps 2 --quiet --metrics "$T/sp.jsonl" \
       >"$T/run" 2>&1; then
    peak=$(python3 -c "import json,sys; print(max(json.loads(l)['peak_bytes'] for l in open(sys.argv[1]) if 'peak_bytes' in l))" "$T/sp.jsonl")
    [ -n "$peak" ] && [ "$peak" -gt 0 ] && [ "$peak" -le $((22 * 1024 * 1024)) ] ||
      fail "the sequence-parallel plan peaks at ${peak:-no figure} bytes, over 22 MiB (or none reported)"
  else
    fail "train --plan of the sequence-parallel plan: $(cat "$T/run")"
  fi
else
  fail "plan at 22M: $(cat "$T/out")"
fi
# without --tp: nothing fits at tp 1, and tp 2 only with sequence parallelism
timeout 60 "$B" plan $SPM --mem 22M >"$T/out" 2>&1 && grep -q "tp = 2 with sequence parallelism is the smallest" "$T/out" ||
  fail "the fallback degree does not name sequence parallelism: $(cat "$T/out")"
# too small even with it: the closest layout and the smallest budget are the sequence-parallel ones
timeout 60 "$B" plan $SPM --mem 20M --tp 2 >"$T/out" 2>&1
# (the figure counts the stages' canaries, BRIGADE_GUARD: 64 bytes after each buffer)
grep -q "tp=2 (sequence-parallel).*Smallest budget that fits: 22516608 bytes" "$T/out" ||
  fail "20M: the shortfall does not count sequence parallelism: $(cat "$T/out")"

# peaks_match PLAN METRICS NAME TP: every world rank's peak (the metrics' peak_bytes) within 1 % of its
# pipeline rank's predicted_peak_bytes, never above (pipeline rank r: world ranks r*TP .. r*TP + TP - 1)
peaks_match() {
  python3 - "$@" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
rows = [json.loads(l) for l in open(sys.argv[2]) if '"peak_bytes"' in l]
tp = int(sys.argv[4])
for r in p["ranks"]:
    want = r["predicted_peak_bytes"]
    for w in range(tp * r["rank"], tp * r["rank"] + tp):
        got = max(x["peak_bytes"] for x in rows if x["rank"] == w)
        if not (0.99 * want <= got <= want):
            print(f"{sys.argv[3]} rank {w}: measured {got} bytes, predicted {want}")
            sys.exit(1)
PY
}
# the predicted peak of every rank is its measured one (bytes the stage allocates, to within 1 %, never
# above): the fused-backward schedules, where the input gradient's message is rendezvous-sized (256 KiB:
# 2 x 128 x 256 floats) and the slot that sent it lingers until the next compute instruction is over (the
# executor waits for it there), and where the gradient's receive buffer is held from the forward on; and
# DualPipe, whose stages run full and split backwards both (each slot charged its own buffer)
MEM="--model gpt --layers 2 --d-model 256 --heads 4 --seq 128 --batch 16 --microbatch-size 2 --devices 2 --pp 2 --mem 1G"
for sch in gpipe 1f1b zb-h1 interleaved dualpipe; do
  ex=; [ $sch = interleaved ] && ex="--chunks 2"
  if timeout 60 "$B" plan $MEM --schedule $sch $ex --json "$T/m_$sch.json" >"$T/out" 2>&1 &&
     timeout 120 "$B" launch -n 2 -- "$B" train --plan "$T/m_$sch.json" --steps 2 --threads 1 --quiet \
       --metrics "$T/m_$sch.jsonl" >"$T/run" 2>&1; then
    peaks_match "$T/m_$sch.json" "$T/m_$sch.jsonl" "$sch" 1 || fail "$sch: the measured peaks are not the predicted ones (above)"
  else
    fail "$sch memory plan or run: $(tail -3 "$T/out" "$T/run")"
  fi
done

# --precision bf16: the blocks keep their activations in bf16; the plan records it, counts those bytes
# (a block's stash 0.50-0.55 of fp32's, the head's unchanged; every rank's peak is again its prediction;
# the fp32 temporaries in the scratch can outweigh the saving on a rank that keeps one microbatch), the
# run takes it from the plan, and
# a run that asks for another precision than its plan's is refused in one line
for sch in 1f1b zb-h1; do
  if timeout 60 "$B" plan $MEM --schedule $sch --precision bf16 --json "$T/b_$sch.json" >"$T/out" 2>&1 &&
     timeout 120 "$B" launch -n 2 -- "$B" train --plan "$T/b_$sch.json" --steps 2 --threads 1 --quiet \
       --metrics "$T/b_$sch.jsonl" >"$T/run" 2>&1; then
    grep -q '"precision": "bf16"' "$T/b_$sch.json" || fail "bf16 $sch: the plan does not record its precision"
    grep -q '"precision": "bf16"' "$T/b_$sch.jsonl" || fail "bf16 $sch: the run from the plan was not bf16"
    peaks_match "$T/b_$sch.json" "$T/b_$sch.jsonl" "bf16 $sch" 1 || fail "bf16 $sch: the measured peaks are not the predicted ones (above)"
    python3 - "$T/b_$sch.json" "$T/m_$sch.json" <<'PY' || fail "bf16 $sch: the blocks' stash is not about half of fp32's"
import json, sys
b, f = (json.load(open(x)) for x in sys.argv[1:3])
sb, sf = ({l["name"]: l["stash_bytes"] for l in p["layers"]} for p in (b, f))
r = sb["blocks.0"] / sf["blocks.0"]
print("bf16/fp32 stash of a block: %.3f" % r)
sys.exit(0 if 0.5 <= r <= 0.55 and sb["head"] == sf["head"] else 1)
PY
  else
    fail "bf16 $sch memory plan or run: $(tail -n 3 "$T/out" "$T/run")"
  fi
done
out=$("$B" train --plan "$T/b_1f1b.json" --precision fp32 --steps 1 2>&1) && fail "a bf16 plan ran in fp32"
grep -q "counted the activations in bf16, not --precision fp32" <<<"$out" && [ "$(wc -l <<<"$out")" = 1 ] ||
  fail "a bf16 plan run with --precision fp32: $out"

# BRIGADE_TP_OVERLAP=microbatch (a forward beside another microbatch's backward, tp 2 x pp 2): the plan
# counts both instructions' buffers at once and a second scratch, and every rank's peak is again its
# prediction; a plan made without it refuses to run with it. Which lane reaches what first depends on
# the timing, so 8 steps (the peak is the largest step's): each is a chance for ZB-H1's forward paired
# with a W (its lane starts first) to reach its end before the W has run, which the executor must not
# let add a gradient buffer; and a step whose pairs all waited for their receive until the partner had
# ended holds less than the prediction (a bound: both instructions' buffers at once)
TPM="--model gpt --layers 4 --d-model 64 --heads 4 --seq 32 --devices 4 --pp 2 --mem 1G --batch 16 --tp 2 --microbatch-size 2"
for sch in gpipe 1f1b zb-h1 interleaved; do
  ex=; [ $sch = interleaved ] && ex="--chunks 2"
  if BRIGADE_TP_OVERLAP=microbatch timeout 60 "$B" plan $TPM --schedule $sch $ex --json "$T/p_$sch.json" >"$T/out" 2>&1 &&
     BRIGADE_TP_OVERLAP=microbatch timeout 120 "$B" launch -n 4 -- "$B" train --plan "$T/p_$sch.json" --steps 8 \
       --threads 1 --quiet --metrics "$T/p_$sch.jsonl" >"$T/run" 2>&1; then
    grep -q '"tp_overlap": "microbatch"' "$T/p_$sch.json" || fail "paired $sch: the plan does not record tp_overlap"
    peaks_match "$T/p_$sch.json" "$T/p_$sch.jsonl" "paired $sch" 2 ||
      fail "paired $sch: the measured peaks are not the predicted ones (above)"
  else
    fail "paired $sch memory plan or run: $(tail -3 "$T/out" "$T/run")"
  fi
done
"$B" plan $TPM --schedule 1f1b --json "$T/p_plain.json" >/dev/null 2>&1 || fail "plan without pairs"
out=$(BRIGADE_TP_OVERLAP=microbatch "$B" train --plan "$T/p_plain.json" --steps 1 2>&1) && fail "a plan without pairs ran paired"
grep -q "counted the memory without BRIGADE_TP_OVERLAP=microbatch" <<<"$out" && [ "$(wc -l <<<"$out")" = 1 ] ||
  fail "a plan without pairs, run paired: $out"

finish
