#!/usr/bin/env bash
# tests/runtime/test_zero.sh: sharded data parallelism (--zero 1|2).
# - After 10 steps, --zero 1 gives the weights of --zero 0 bitwise (the
#   owned sums are those of the all-reduce; the update is elementwise), and
#   --zero 2 within the data-parallel tolerance of test_equivalence (AdamW:
#   relative L2 1e-5; SGD: every tensor within 1e-5 of its size; it sums
#   replicas per microbatch, then microbatches), for dp 2 and 4 with pp 1 and
#   2, AdamW and SGD with weight decay, tied embeddings, an interleaved and a
#   zero-bubble schedule.
# - Checkpoints stay full named tensors: the step-10 checkpoint of --zero 1
#   on dp 4 holds the tensors (weights and optimizer state) of the one of
#   --zero 0, bitwise; a --zero 2 dp 4 checkpoint resumed with --zero 0 on
#   dp 2 ends where a --zero 0 dp 4 checkpoint resumed the same way ends
#   (tolerance; --zero 1: bitwise); a --zero 0 dp 2 checkpoint resumed with
#   --zero 1 on dp 4 ends where --zero 0 on dp 4 does (bitwise).
# - Memory (one bucket per layer, two bucket buffers: the layers of this small
#   model are large against its gradients): every rank's allocator peak is within 10%
#   of the executor's prediction, its activation part within 20% of the
#   simulator's (the optimizer state and, with --zero 2,
#   the gradients counted as their shards plus two buckets in flight);
#   --zero 1 lowers it by at least 0.9x the optimizer bytes it saves, and
#   --zero 2 lowers it below --zero 1.
# - grad_norm within 1e-6 relative of --zero 0's at every step.
# - The planner counts sharded bytes: a budget nothing fits at --zero 0 gets
#   a plan at --zero 1 (auto), and --zero 2 and 3 a plan too; brigade train --plan
#   measures rank 0's peak within 10% of the plan's prediction.
# - --zero with dp = 1 says it changes nothing; --zero 4, a plan's zero 4 and
#   a --zero other than the plan's are refused in one line. (--zero 3's
#   training: tests/runtime/test_zero3.sh.)
. "$(dirname "$0")/../lib/harness.sh"
GPT="--model gpt --layers 5 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 2 --steps 10 --threads 1 --lr 3e-3"

# cmp_z Z A B WHAT: --zero 1 bitwise, --zero 2 within the tolerance
cmp_z() { if [ "$1" = 1 ]; then same "$2" "$3" "$4"; else near "$2" "$3" "$4"; fi; }

for pp in 1 2; do
  for dp in 2 4; do
    n=$((pp * dp))
    train_save "z0_${pp}_${dp}" $n $GPT --pp $pp --dp $dp || continue
    for z in 1 2; do
      train_save "z${z}_${pp}_${dp}" $n $GPT --pp $pp --dp $dp --zero $z &&
        cmp_z $z "$T/z0_${pp}_${dp}" "$T/z${z}_${pp}_${dp}" "pp $pp dp $dp: --zero $z = --zero 0"
    done
  done
done
# SGD with weight decay (per-tensor decay inside a shard), tied embeddings across stages, interleaved, ZB-H1
SGD="--optimizer sgd --lr 0.05 --weight-decay 0.1"
train_save sgd0 4 $GPT --dp 4 $SGD && train_save sgd1 4 $GPT --dp 4 $SGD --zero 1 && same "$T/sgd0" "$T/sgd1" "SGD + decay, dp 4: --zero 1" &&
  train_save sgd2 4 $GPT --dp 4 $SGD --zero 2 && near "$T/sgd0" "$T/sgd2" "SGD + decay, dp 4: --zero 2" --rtol 1e-5
train_save tie0 4 $GPT --pp 2 --dp 2 --tie-embeddings --weight-decay 0.1 &&
  train_save tie1 4 $GPT --pp 2 --dp 2 --tie-embeddings --weight-decay 0.1 --zero 1 && same "$T/tie0" "$T/tie1" "tied, pp 2 dp 2: --zero 1" &&
  train_save tie2 4 $GPT --pp 2 --dp 2 --tie-embeddings --weight-decay 0.1 --zero 2 && near "$T/tie0" "$T/tie2" "tied, pp 2 dp 2: --zero 2"
train_save il0 4 $GPT --pp 2 --dp 2 --schedule interleaved --chunks 2 --microbatches 4 &&
  train_save il2 4 $GPT --pp 2 --dp 2 --schedule interleaved --chunks 2 --microbatches 4 --zero 2 &&
  near "$T/il0" "$T/il2" "interleaved, pp 2 dp 2: --zero 2"
# one bucket per layer, ring-sized buckets (reduce-scatter proper, not the small-buffer all-reduce), split backward
RING="$GPT --d-model 64 --heads 4 --dp 2 --schedule zb-h1 $SGD"
BRIGADE_BUCKET_MB=0 train_save ring0 2 $RING && BRIGADE_BUCKET_MB=0 train_save ring1 2 $RING --zero 1 &&
  same "$T/ring0" "$T/ring1" "ring buckets, zb-h1, dp 2: --zero 1" &&
  BRIGADE_BUCKET_MB=0 train_save ring2 2 $RING --zero 2 && near "$T/ring0" "$T/ring2" "ring buckets, zb-h1, dp 2: --zero 2" --rtol 1e-5

# the gradient norm (each replica's chunks, summed over the job) within 1e-6 of --zero 0's, every step
for z in 0 1 2; do
  timeout 120 "$B" launch -n 4 -- "$B" train $GPT --pp 2 --dp 2 --zero $z --quiet --metrics "$T/gn$z.jsonl" >/dev/null 2>&1 ||
    bad "grad norm run --zero $z"
done
for z in 1 2; do
  v=$(python3 - "$T/gn0.jsonl" "$T/gn$z.jsonl" <<'PY'
import json, sys
def norms(f):
    return [d["grad_norm"] for d in map(json.loads, open(f)) if d.get("rank") == 0]
a, b = norms(sys.argv[1]), norms(sys.argv[2])
worst = max(abs(x - y) / x for x, y in zip(a, b)) if a and len(a) == len(b) else 1
print("%d steps, worst relative difference %.2g" % (len(a), worst))
sys.exit(0 if worst <= 1e-6 and len(a) == 10 else 1)
PY
) && ok "grad_norm --zero $z vs 0: $v" || bad "grad_norm --zero $z vs 0: $v"
done

# checkpoints: full named tensors whatever the sharding; resume under another layout and stage
CK="$GPT --checkpoint-dir"
train_save ck0 4 $CK "$T/c0" --dp 4 && train_save ck1 4 $CK "$T/c1" --dp 4 --zero 1 &&
  same "$T/c0/step-00000010" "$T/c1/step-00000010" "step-10 checkpoints of --zero 0 and --zero 1 (dp 4), optimizer state included"
train_save ck2 4 $CK "$T/c2" --dp 4 --zero 2
if [ -d "$T/c2/step-00000010" ]; then
  n=$(python3 - "$T/c2/step-00000010" <<'PY'
import glob, json, struct, sys
names = set()
for f in glob.glob(sys.argv[1] + "/*.safetensors"):
    h = open(f, "rb"); n = struct.unpack("<Q", h.read(8))[0]; names |= set(json.loads(h.read(n)))
print(sum(1 for k in names if k.startswith("optim.v.")))
PY
)
  [ "${n:-0}" -gt 0 ] && ok "the --zero 2 checkpoint holds $n full optim.v tensors" || bad "no optimizer state in the --zero 2 checkpoint"
fi
G20=${GPT/--steps 10/--steps 20}
train_save rs0 2 $G20 --dp 2 --checkpoint-dir "$T/c0" --resume && train_save rs1 2 $G20 --dp 2 --checkpoint-dir "$T/c1" --resume &&
  same "$T/rs0" "$T/rs1" "--zero 1 dp 4 checkpoint resumed with --zero 0 dp 2" &&
  train_save rs2 2 $G20 --dp 2 --checkpoint-dir "$T/c2" --resume && near "$T/rs0" "$T/rs2" "--zero 2 dp 4 checkpoint resumed with --zero 0 dp 2"
train_save ck3 2 $CK "$T/c3" --dp 2 && train_save rt0 4 $G20 --dp 4 --checkpoint-dir "$T/c3" --resume-from "$T/c3/step-00000010" &&
  train_save rt1 4 $G20 --dp 4 --zero 1 --checkpoint-dir "$T/c3" --resume-from "$T/c3/step-00000010" &&
  same "$T/rt0" "$T/rt1" "--zero 0 dp 2 checkpoint resumed with --zero 1 dp 4"

# memory: the allocator's peak per rank against the prediction (rank table: $5 peak MiB, $11 predicted MiB)
MEM="--model gpt --layers 4 --d-model 64 --heads 4 --seq 16 --batch 8 --microbatches 2 --steps 3 --threads 1"
for dp in 2 4; do
  for z in 0 1 2; do
    BRIGADE_BUCKET_MB=0 BRIGADE_ZERO_BUFFERS=2 timeout 120 "$B" launch -n $dp -- "$B" train $MEM --dp $dp --zero $z --quiet >"$T/m.o" 2>"$T/m.e" ||
      { bad "memory run dp $dp zero $z"; tail -3 "$T/m.e"; continue; }
    awk '$1 ~ /^[0-9]+$/ && NF >= 11 {print $1, $5, $11, $6, $7}' "$T/m.e" >"$T/m_${dp}_${z}"
    rows=$(wc -l <"$T/m_${dp}_${z}")
    # and the activation column (the allocator's peak less what is held from the start) against the
    # simulator's, as test_stash does: --zero 2's gradient buckets are not counted as activations
    if [ "$rows" = "$dp" ] && awk '{ if ($2 > 1.10 * $3 || $2 < 0.90 * $3 || $4 > 1.2 * $5 || $4 < 0.8 * $5) exit 1 }' "$T/m_${dp}_${z}"; then
      ok "dp $dp zero $z: peak/predicted MiB per rank: $(awk '{printf "%s/%s ", $2, $3}' "$T/m_${dp}_${z}")"
    else
      bad "dp $dp zero $z: peak vs predicted: $(cat "$T/m_${dp}_${z}" | tr '\n' ';')"
    fi
  done
  # AdamW: 8 bytes per parameter, of which sharding keeps 1/dp
  params=$(awk '$1 ~ /^[0-9]+$/ && NF >= 11 {print $4; exit}' "$T/m.e")
  p0=$(awk 'NR == 1 {print $2}' "$T/m_${dp}_0"); p1=$(awk 'NR == 1 {print $2}' "$T/m_${dp}_1")
  p2=$(awk 'NR == 1 {print $2}' "$T/m_${dp}_2")
  awk -v a="$p0" -v b="$p1" -v c="$p2" -v n="${params:-0}" -v d=$dp \
    'BEGIN { saved = 8 * n * (1 - 1 / d) / 1048576; exit !(n > 0 && a - b >= 0.9 * saved && c < b) }' &&
    ok "dp $dp: peak MiB --zero 0 $p0, 1 $p1, 2 $p2" || bad "dp $dp: peak MiB --zero 0 $p0, 1 $p1, 2 $p2 ($params params)"
done

# the planner counts the sharded bytes: with 3 MiB per device nothing fits at --zero 0; auto picks the
# lowest stage that fits, and brigade train --plan runs it with the predicted peak (within 10%)
PM="--model gpt --layers 4 --d-model 64 --heads 4 --seq 16 --devices 4 --mem 3M --batch 8 --pp 1 --tp 1 --microbatch-size 1" # tp 1: without it the planner would fall back to tensor parallelism; microbatch 1: with 2 only --zero 2 fits
if "$B" plan $PM >/dev/null 2>"$T/p0.e"; then bad "plan at --zero 0 fits 3 MiB"
else grep -q "does not fit in memory" "$T/p0.e" && ok "plan --zero 0: does not fit" || { bad "plan --zero 0"; cat "$T/p0.e"; }; fi
for z in auto 2 3; do
  if "$B" plan $PM --zero $z --json "$T/p$z.json" >"$T/p$z.o" 2>&1; then
    want=$([ $z = auto ] && echo 1 || echo $z)
    grep -q "\"zero\": $want" "$T/p$z.json" || bad "plan --zero $z: the plan does not record zero $want"
    timeout 120 "$B" launch -n 4 -- "$B" train --plan "$T/p$z.json" --steps 3 --threads 1 --quiet >"$T/t$z.o" 2>&1 ||
      { bad "train --plan (zero $z)"; tail -3 "$T/t$z.o"; continue; }
    line=$(grep "rank 0 peak" "$T/t$z.o")
    mp=$(echo "$line" | sed -nE 's/.*rank 0 peak ([0-9.]+) MiB, predicted ([0-9.]+) MiB.*/\1 \2/p')
    echo "${mp:-0 0}" | awk '{ exit !($1 > 0 && $2 > 0 && $1 <= 1.1 * $2 && $1 >= 0.9 * $2) }' &&
      ok "plan --zero $z -> zero $want: $line" || bad "plan --zero $z: $line"
  else
    bad "plan --zero $z"; cat "$T/p$z.o"
  fi
done
if "$B" train --plan "$T/pauto.json" --zero 2 --steps 1 >/dev/null 2>"$T/pz.e"; then bad "--zero 2 against a --zero 1 plan accepted"
else [ "$(wc -l <"$T/pz.e")" = 1 ] && grep -q "counted the memory of --zero 1" "$T/pz.e" && ok "--zero against the plan's: $(cat "$T/pz.e")" ||
  { bad "--zero against the plan's"; cat "$T/pz.e"; }; fi
sed 's/"zero": 1/"zero": 4/' "$T/pauto.json" >"$T/pbad.json"
if "$B" train --plan "$T/pbad.json" --steps 1 >/dev/null 2>"$T/pbad.e"; then bad "a plan with zero 4 accepted"
else grep -q 'zero' "$T/pbad.e" && ok "plan with zero 4 refused: $(cat "$T/pbad.e")" || { bad "zero 4 message"; cat "$T/pbad.e"; }; fi

# bad input
"$B" train --model mlp --steps 1 --zero 1 >/dev/null 2>"$T/e1" && grep -q "note: --zero 1 with dp = 1 changes nothing" "$T/e1" &&
  ok "dp 1: $(grep note "$T/e1")" || { bad "dp 1 note"; cat "$T/e1"; }
if "$B" train --model mlp --steps 1 --zero 4 >/dev/null 2>"$T/e2"; then bad "--zero 4 accepted"
else [ "$(wc -l <"$T/e2")" = 1 ] && ok "--zero 4: $(cat "$T/e2")" || { bad "--zero 4 message"; cat "$T/e2"; }; fi
finish
