#!/usr/bin/env bash
# tests/runtime/test_zero3.sh: --zero 3, parameters sharded over the dp
# replicas of a stage, each layer's weights gathered before its compute.
# - After 10 steps (AdamW) --zero 3 gives the weights of --zero 2 bitwise
#   (the same gradients and the same elementwise update; only where the
#   parameters live differs) and those of --zero 0 within the data-parallel
#   tolerance (relative L2 1e-5), at pp 1 and 2, tp 1 and 2, with tied
#   embeddings across stages, with the zero-bubble ZB-H1 schedule at pp 1
#   and 2 (a W gathers its layer again when its bucket was dropped since its
#   B) and with recomputation (the rerun forward gathers too); and at dp 4
#   with SGD, weight decay and clipping, bitwise --zero 2's; with its
#   collectives staged (BRIGADE_STAGING=always: the provider a device
#   backend uses), bitwise the host provider's.
# - The gathers shard something: on every rank the allocator's peak is below
#   --zero 2's and equal to the executor's prediction (rank table), with
#   BRIGADE_ZERO_PREFETCH=0 (one gather buffer: each gather waited for)
#   lower still and the same weights (GPT 8 x 64: two buffers fit below
#   what the shard saves).
# - Checkpoints stay full named tensors: the step-10 checkpoint of --zero 3
#   holds the tensors (weights and optimizer state) of --zero 2's, bitwise; a
#   --zero 0 checkpoint resumed under --zero 3 and a --zero 3 one resumed under
#   --zero 0 end where --zero 0 for 20 steps ends (tolerance).
# - Evaluation gathers layer by layer as training does: --eval-every under
#   --zero 3 prints the validation losses of --zero 2, its peak still the
#   prediction.
# - The gather overlap is reported on each rank (BRIGADE_LOG=info): a share in
#   [0, 1] equal to 1 - waited / in flight of the figures it prints, with the
#   time waited at most the time in flight; --zero 2 reports none.
# - DualPipe's copies with --zero 3 are refused in one line.
. "$(dirname "$0")/../lib/harness.sh"
GPT="--model gpt --layers 5 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 2 --threads 1 --lr 3e-3 --dp 2"

# three NAME N ARGS...: --zero 0, 2 and 3; 3 = 2 bitwise, 3 = 0 within the tolerance.
# like NAME N OF ARGS...: --zero 3 only, against three's OF (ZB-H1 and recomputation at pp 1 give the
# bits of 1F1B without them: the same sums in the same order)
three() {
    local name=$1 n=$2
    shift 2
    for z in 0 2 3; do
        ck=(); [ "$name" = pp1 ] && ck=(--checkpoint-dir "$T/${name}_c$z") # the checkpoints' tests below
        train_save "${name}_$z" $n $GPT --steps 10 "$@" --zero $z "${ck[@]}" || return
    done
    same "$T/${name}_2" "$T/${name}_3" "$name: --zero 3 = --zero 2"
    near "$T/${name}_0" "$T/${name}_3" "$name: --zero 3 = --zero 0"
}
like() {
    local name=$1 n=$2 of=$3
    shift 3
    train_save "${name}_3" $n $GPT --steps 10 "$@" --zero 3 || return
    same "$T/${of}_2" "$T/${name}_3" "$name: --zero 3 = --zero 2"
    near "$T/${of}_0" "$T/${name}_3" "$name: --zero 3 = --zero 0"
}
three pp1 2
three pp2 4 --pp 2
three tp2 4 --tp 2
three tie 4 --pp 2 --tie-embeddings --weight-decay 0.1
like zbh1 2 pp1 --schedule zb-h1
# one gather buffer: a W finds its bucket dropped since its B (every other bucket gathered in between)
BRIGADE_ZERO_PREFETCH=0 three zbh1pp2 4 --pp 2 --schedule zb-h1 --microbatches 4
like recompute 2 pp1 --recompute
# the gathers through the staging provider (runtime/devcoll.h; a device backend's path, here on host buffers)
BRIGADE_STAGING=always train_save pp1_staged 2 $GPT --steps 10 --zero 3 &&
    same "$T/pp1_3" "$T/pp1_staged" "BRIGADE_STAGING=always: --zero 3's weights"
# dp 4, SGD with weight decay (cut per tensor inside a shard) and clipping (the owned elements scaled)
D4="--steps 6 --dp 4 --optimizer sgd --lr 0.05 --weight-decay 0.1 --clip-grad 0.5"
train_save d4_2 4 $GPT $D4 --zero 2 && train_save d4_3 4 $GPT $D4 --zero 3 &&
    same "$T/d4_2" "$T/d4_3" "dp 4, SGD + decay + clipping: --zero 3 = --zero 2"

# memory: below --zero 2 on every rank, equal to the prediction ($5 peak MiB, $11 predicted MiB)
MEM="--model gpt --layers 8 --d-model 64 --heads 4 --seq 32 --batch 8 --microbatches 2 --steps 3 --threads 1 --dp 2 --optimizer adamw"
for z in 2 3 3p0; do
    pre=1; [ $z = 3p0 ] && pre=0
    BRIGADE_ZERO_PREFETCH=$pre TRAIN_TIMEOUT=120 train_save "mem_$z" 2 $MEM --zero ${z%p0} --metrics "$T/mem_$z.jsonl" || continue
    awk '$1 ~ /^[0-9]+$/ && NF >= 11 { n++; if ($5 != $11) bad = bad " rank " $1 ": " $5 " vs " $11 } END { if (bad || n != 2) exit 1 }' \
        "$T/mem_$z.log" && ok "--zero $z: peak = prediction on every rank" || bad "--zero $z: peak against prediction: $(grep -A3 '^rank' "$T/mem_$z.log")"
done
python3 - "$T/mem_2.jsonl" "$T/mem_3.jsonl" "$T/mem_3p0.jsonl" <<'PY' && ok "peak bytes per rank: $(cat "$T/peaks")" || bad "peak bytes per rank: $(cat "$T/peaks")"
import json, sys
def peaks(f):
    r = {}
    for d in map(json.loads, open(f)):
        if "peak_bytes" in d:
            r[d["rank"]] = max(r.get(d["rank"], 0), d["peak_bytes"])
    return [r[k] for k in sorted(r)]
z2, z3, z3p0 = (peaks(f) for f in sys.argv[1:4])
open(sys.argv[1].rsplit("/", 1)[0] + "/peaks", "w").write("--zero 2 %s > --zero 3 %s > prefetch 0 %s" % (z2, z3, z3p0))
sys.exit(0 if len(z2) == len(z3) == len(z3p0) == 2 and all(a > b > c for a, b, c in zip(z2, z3, z3p0)) else 1)
PY
same "$T/mem_3" "$T/mem_3p0" "BRIGADE_ZERO_PREFETCH=0: the weights of prefetch 1"

# checkpoints (three's): full named tensors; resume across --zero 0 and 3
same "$T/pp1_c2/step-00000010" "$T/pp1_c3/step-00000010" "step-10 checkpoints of --zero 2 and --zero 3, optimizer state included"
train_save full0 2 $GPT --steps 20 &&
    train_save r03 2 $GPT --steps 20 --zero 3 --checkpoint-dir "$T/pp1_c0" --resume &&
    near "$T/full0" "$T/r03" "--zero 0 checkpoint resumed with --zero 3"
[ -d "$T/pp1_c3/step-00000010" ] && train_save r30 2 $GPT --steps 20 --checkpoint-dir "$T/pp1_c3" --resume &&
    near "$T/full0" "$T/r30" "--zero 3 checkpoint resumed with --zero 0"

# evaluation: each layer gathered as in training (nothing held whole: the peak stays the prediction)
for z in 2 3; do
    timeout 120 "$B" launch -n 2 -- "$B" train $GPT --steps 4 --eval-every 2 --eval-batches 2 --zero $z >"$T/ev$z.o" 2>&1 ||
        bad "evaluation run --zero $z"
    grep -o " val [0-9.]*" "$T/ev$z.o" >"$T/ev$z"
done
[ "$(wc -l <"$T/ev3")" = 2 ] && cmp -s "$T/ev2" "$T/ev3" && ok "evaluation --zero 3 = --zero 2: $(tr '\n' ' ' <"$T/ev3")" ||
    bad "evaluation --zero 3: $(tr '\n' ' ' <"$T/ev3") vs --zero 2: $(tr '\n' ' ' <"$T/ev2")"
awk '$1 ~ /^[0-9]+$/ && NF >= 11 { n++; if ($5 != $11) bad = 1 } END { exit bad || n != 2 }' "$T/ev3.o" &&
    ok "evaluating under --zero 3: peak = prediction" || bad "evaluating under --zero 3: $(grep -A2 '^rank' "$T/ev3.o")"

# the gather overlap: one line per rank, consistent with its own figures
for z in 2 3; do
    BRIGADE_LOG=info timeout 120 "$B" launch -n 2 -- "$B" train $GPT --steps 2 --zero $z >/dev/null 2>"$T/ov$z.e" ||
        bad "gather overlap run --zero $z"
done
grep "INFO zero\] gather overlap" "$T/ov3.e" | tr '()' '  ' | awk '
    { n++; ov = $7; g = $10; w = $14; d = ov - (1 - w / g)
      if (ov < 0 || ov > 1 || g <= 0 || w < 0 || w > g || d * d > (0.001 + 0.1 / g)^2) bad = 1 }
    END { exit bad || n != 2 }' && ok "--zero 3 gather overlap per rank: $(grep -o 'overlap [0-9.]*' "$T/ov3.e" | tr '\n' ' ')" ||
    { bad "--zero 3 gather overlap lines"; grep "zero\]" "$T/ov3.e"; }
! grep -q "gather overlap" "$T/ov2.e" && ok "--zero 2 reports no gather overlap" || bad "--zero 2 reported a gather overlap"

# bad input: DualPipe's two copies sum whole gradients
timeout 60 "$B" launch -n 4 -- "$B" train $GPT --steps 1 --pp 2 --schedule dualpipe --microbatches 4 --zero 3 >/dev/null 2>"$T/dp.e" &&
    bad "dualpipe with --zero 3 accepted" ||
    { grep -q "with --zero 3 is not supported" "$T/dp.e" && ok "dualpipe --zero 3 refused: $(grep -m1 'zero 3' "$T/dp.e")" ||
        { bad "dualpipe --zero 3 message"; cat "$T/dp.e"; }; }
finish 20
