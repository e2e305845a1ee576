#!/usr/bin/env bash
# tests/runtime/test_dualpipe.sh: brigade train --schedule dualpipe (two copies
# of the model, the first m/2 microbatches entering at rank 0 through copy 0,
# the other m/2 at rank p-1 through copy 1, the copies' gradients summed
# before the optimizer step).
#
# Reference, bitwise: data parallelism over two replicas of m/2 microbatches
# each (brigade train --dp 2 --microbatches m/2, one pipeline stage). Its
# arithmetic is DualPipe's: each replica accumulates the same microbatches
# in the same order as one copy, the replicas' sums are added once (a + b,
# the same bits in either order), then the ties. One process accumulates
# all m microbatches in one sum, whose rounding differs: against it the
# weights agree within the data-parallel tolerance of test_equivalence.sh
# (relative L2 1e-5 over all tensors), not bitwise.
#
# Also: checkpoints (resumed bitwise), the planner's memory (measured within 5%), parameters 2x (the ranks hold twice 1F1B's parameters in all), the
# stash each rank measures equals the simulator's (PP + 1 = p + 1), and bad
# input ends in one line before any rank connects.
. "$(dirname "$0")/../lib/harness.sh"

GPT="--model gpt --layers 5 --d-model 16 --heads 2 --seq 16 --batch 8 --steps 5 --threads 1 --lr 3e-3"
MLP="--model mlp --layers 3 --d-model 24 --in-features 12 --classes 6 --batch 16 --steps 5 --threads 1 --lr 3e-3"

# GPT, p = 2 (m = 4) and p = 4 (m = 8)
train_save one4 1 $GPT --microbatches 4
train_save one8 1 $GPT --microbatches 8
train_save dp2m2 2 $GPT --microbatches 2 --dp 2
train_save dp2m4 2 $GPT --microbatches 4 --dp 2
train_save dual2 2 $GPT --microbatches 4 --pp 2 --schedule dualpipe
train_save dual4 4 $GPT --microbatches 8 --pp 4 --schedule dualpipe
same "$T/dp2m2" "$T/dual2" "dual2 vs dp2m2"
same "$T/dp2m4" "$T/dual4" "dual4 vs dp2m4"
same "$T/one4" "$T/dual2" "dual2 vs one4" --rel-l2 1e-5
same "$T/one8" "$T/dual4" "dual4 vs one8" --rel-l2 1e-5
# the copies stay identical: if copy 1 drifted, its gradients (summed into
# copy 0's from step 2 on) would move copy 0 off the reference above

# --split names the p model stages (each held by two ranks)
train_save dual2split 2 $GPT --microbatches 4 --pp 2 --schedule dualpipe --split 3,5
same "$T/dp2m2" "$T/dual2split" "dual2split vs dp2m2"

# tied embedding and head: with two copies ranks 0 and p-1 hold both tensors
train_save dp2tie 2 $GPT --microbatches 2 --dp 2 --tie-embeddings
train_save dual2tie 2 $GPT --microbatches 4 --pp 2 --schedule dualpipe --tie-embeddings
train_save dp2tie4 2 $GPT --microbatches 4 --dp 2 --tie-embeddings
train_save dual4tie 4 $GPT --microbatches 8 --pp 4 --schedule dualpipe --tie-embeddings
same "$T/dp2tie" "$T/dual2tie" "dual2tie vs dp2tie"
same "$T/dp2tie4" "$T/dual4tie" "dual4tie vs dp2tie4"

# tensor parallelism inside each stage (pp 2 x tp 2): each tensor-group member sums its shard with
# the same member of the other copy's group; bitwise equal to tp 2 x dp 2
GTP="--model gpt --layers 4 --d-model 32 --heads 4 --seq 16 --batch 8 --steps 4 --threads 1 --lr 3e-3 --tie-embeddings"
train_save tpdp 4 $GTP --microbatches 2 --dp 2 --tp 2
train_save tpdual 4 $GTP --microbatches 4 --pp 2 --tp 2 --schedule dualpipe
same "$T/tpdp" "$T/tpdual" "tpdual vs tpdp"

# loss and gradient norm per step (one copy counted, the tie's second tensor left out) as the reference's
norms() { python3 -c "import json,sys; print(' '.join('%d:%.6g:%.6g' % (r['step'], r['loss'], r['grad_norm']) for r in map(json.loads, open(sys.argv[1])) if r.get('rank') == 0))" "$1"; }
for t in "" "--tie-embeddings"; do
  timeout 120 "$B" launch -n 2 -- "$B" train $GPT --microbatches 2 --dp 2 $t --quiet --metrics "$T/nref.json" >/dev/null 2>&1 &&
  timeout 120 "$B" launch -n 2 -- "$B" train $GPT --microbatches 4 --pp 2 --schedule dualpipe $t --quiet --metrics "$T/ndual.json" \
    >/dev/null 2>&1 || { bad "metrics runs ${t:-untied}"; continue; }
  a=$(norms "$T/nref.json") b=$(norms "$T/ndual.json")
  [ -n "$a" ] && [ "$a" = "$b" ] && ok "loss and gradient norm ${t:-untied} (step:loss:norm): $b" ||
    bad "loss and gradient norm ${t:-untied}: dp 2 $a, dualpipe $b"
done

# MLP, and DualPipe under data parallelism (pp 2 x dp 2)
train_save mdp2 2 $MLP --microbatches 2 --dp 2
train_save mdual2 2 $MLP --microbatches 4 --pp 2 --schedule dualpipe
same "$T/mdp2" "$T/mdual2" "mdual2 vs mdp2"
train_save dualdp 4 $GPT --microbatches 4 --pp 2 --dp 2 --schedule dualpipe
same "$T/one4" "$T/dualdp" "dualdp vs one4" --rel-l2 1e-5
# --zero 1 (the optimizer state sharded over the two replicas; each replica's copies sum the whole
# gradient buffer, of which it updates its own shard): bitwise equal to --zero 0
train_save dualz1 4 $GPT --microbatches 4 --pp 2 --dp 2 --schedule dualpipe --zero 1 --tie-embeddings
train_save dualz0 4 $GPT --microbatches 4 --pp 2 --dp 2 --schedule dualpipe --tie-embeddings
same "$T/dualz0" "$T/dualz1" "dualz1 vs dualz0"

# checkpoints: copy 0 is written, loading fills both copies; resumed at step 3 of 5 it
# equals the uninterrupted run, and a dp 2 checkpoint resumes as dualpipe bitwise too
train_save ck1 2 $GPT --microbatches 4 --pp 2 --schedule dualpipe --steps 3 --checkpoint-dir "$T/ckd"
train_save ckr 2 $GPT --microbatches 4 --pp 2 --schedule dualpipe --checkpoint-dir "$T/ckd" --resume
grep -q "resuming from $T/ckd/step-00000003 (written by pp=2 dp=1)" "$T/ckr.log" && ok "dualpipe resumes its checkpoint" ||
  bad "no resume message: $(tail -3 "$T/ckr.log")"
same "$T/dual2" "$T/ckr" "ckr vs dual2"
train_save ck2 2 $GPT --microbatches 2 --dp 2 --steps 3 --checkpoint-dir "$T/ckdp"
train_save ckr2 2 $GPT --microbatches 4 --pp 2 --schedule dualpipe --checkpoint-dir "$T/ckdp" --resume
same "$T/dp2m2" "$T/ckr2" "ckr2 vs dp2m2"

# parameters 2x, stash as simulated: the rank table (rank pp dp params peak act act_sim stashed stash_sim ...)
table() { timeout 120 "$B" launch -n 4 -- "$B" train --layers 6 --d-model 16 --heads 2 --seq 8 --batch 16 \
            --microbatches 8 --steps 2 --threads 1 --pp 4 --schedule "$1" 2>&1 >/dev/null |
            awk '$1 ~ /^[0-9]+$/ && NF >= 10 && $10 ~ /%$/'; }
tdual=$(table dualpipe) tone=$(table 1f1b)
pd=$(echo "$tdual" | awk '{s += $4} END {print s + 0}') p1=$(echo "$tone" | awk '{s += $4} END {print s + 0}')
if [ "$(echo "$tdual" | wc -l)" = 4 ] && [ "$p1" -gt 0 ] && [ "$pd" = $((2 * p1)) ]; then
  ok "parameters: dualpipe holds $pd on 4 ranks, 1f1b $p1 (2x)"
else bad "parameters: dualpipe $pd, 1f1b $p1 (want 2x): $tdual"; fi
st=$(echo "$tdual" | awk '$8 != 5 || $9 != 5 {print "rank " $1 ": stashed " $8 ", simulated " $9}')
[ -z "$st" ] && [ -n "$tdual" ] && ok "stash: 5 = PP + 1 on every rank, measured and simulated" || bad "stash: $st"

# the planner: dualpipe's plan lists the p model stages once, predicts each rank's memory with both
# copies (parameters, gradients, optimizer state, the other copy's gradient) and brigade train --plan
# measures rank 0 within 5% of it; 1F1B's plan of the same model predicts less than 2/3 of it
PM="--model gpt --layers 5 --d-model 32 --heads 2 --seq 16 --devices 4 --mem 1G --batch 8 --pp 4 --microbatch-size 1"
if "$B" plan $PM --schedule dualpipe --json "$T/dplan.json" >"$T/dplan.o" 2>&1 &&
   "$B" plan $PM --schedule 1f1b --json "$T/fplan.json" >/dev/null 2>&1; then
  python3 - "$T/dplan.json" "$T/fplan.json" <<'PY' && ok "plan: dualpipe's 4 model stages, rank memory vs 1f1b's" || bad "plan JSON: $(cat "$T/dplan.o")"
import json, sys
d, f = (json.load(open(x)) for x in sys.argv[1:3])
assert d["schedule"] == "dualpipe" and d["chunks"] == 2 and len(d["stages"]) == 4, d["stages"]
assert [s["rank"] for s in d["stages"]] == [0, 1, 2, 3]
dm, fm = (max(r["predicted_peak_bytes"] for r in x["ranks"]) for x in (d, f))
assert fm < 2 / 3 * dm, (dm, fm)
PY
  timeout 120 "$B" launch -n 4 -- "$B" train --plan "$T/dplan.json" --steps 3 --threads 1 --quiet >"$T/dtp.o" 2>&1 ||
    bad "train --plan dualpipe: $(tail -3 "$T/dtp.o")"
  line=$(grep "rank 0 peak" "$T/dtp.o")
  mp=$(echo "$line" | sed -nE 's/.*rank 0 peak ([0-9.]+) MiB, predicted ([0-9.]+) MiB.*/\1 \2/p')
  echo "${mp:-0 0}" | awk '{ exit !($1 > 0 && $2 > 0 && $1 <= 1.05 * $2 && $1 >= 0.95 * $2) }' &&
    ok "train --plan dualpipe: $line" || bad "train --plan dualpipe: $line"
else bad "plan --schedule dualpipe: $(cat "$T/dplan.o")"; fi

# bad input: one line, nothing trained
expect_train 1 "dualpipe needs an even number of pipeline ranks (its two halves mirror each other), got 3" \
  $GPT --microbatches 6 --batch 6 --pp 3 --schedule dualpipe
expect_train 1 "dualpipe needs an even number of microbatches, at least 2p = 8 (m/2 enter from each end, at least p each), got 4" \
  $GPT --microbatches 4 --pp 4 --schedule dualpipe
expect_train 2 "--split has 4 entries but there are 2 model stages (pp 2 x 2 chunks hold 2 copies of each)" \
  $GPT --microbatches 4 --pp 2 --schedule dualpipe --split 2,2,2,2
expect_train 1 "dualpipe: 2 copies of the model with --zero 2 is not supported (--zero 1 is)" \
  $GPT --microbatches 4 --pp 2 --dp 2 --zero 2 --schedule dualpipe
finish
