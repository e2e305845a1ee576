#!/usr/bin/env bash
# tests/runtime/test_zero_order.sh: no ZeRO stage costs more than the one
# below it. ZeRO-2's gradient buckets and their buffers are sized from the
# shard (schedule/memory.h), so for GPTs of a few sizes, pp 1 and 2, SGD and
# AdamW, dp 2, the allocator's peak (metrics peak_bytes, to the byte) is
# strictly lower at --zero 2 than at --zero 1, and at --zero 1 than at
# --zero 0, on every rank; each rank's peak equals the executor's prediction
# (the rank table's MiB columns); --zero 2's weights are those of --zero 0
# within the data-parallel tolerance. A stage whose one block outweighs what
# the shard saves (a single-block GPT), or whose tied buckets (whole) and
# buffers do, keeps its gradients whole at --zero 2: its peak is --zero 1's,
# not more. A tie across stages holds its partner's gradient from the start,
# counted in the prediction. --zero 3 (parameters sharded, each bucket
# gathered into buffers of the largest bucket's size) is strictly below
# --zero 2 where those buffers fit below what the shard saves, and equal
# where they do not (a single-block GPT; the last stage of a 2-block pp 2
# GPT, its head one bucket), with the weights of --zero 2 bitwise.
. "$(dirname "$0")/../lib/harness.sh"

# peaks NAME: "rank:peak_bytes" per rank, the highest of the run
peaks() {
    python3 - "$T/$1.jsonl" <<'PY'
import json, sys
r = {}
for d in map(json.loads, open(sys.argv[1])):
    if "peak_bytes" in d:
        r[d["rank"]] = max(r.get(d["rank"], 0), d["peak_bytes"])
print(" ".join("%d" % r[k] for k in sorted(r)))
PY
}

# order NAME N REL ARGS...: --zero 0, 1, 2, 3 on N ranks; strict order per rank, but REL "eq12": --zero 2 =
# --zero 1 (its gradients kept whole); a REL ending in ",3=RANKS" (e.g. "eq12,3=>>==", one sign per rank):
# --zero 3 = --zero 2 on the ranks marked "=" (the stage keeps its parameters whole)
order() {
    local name=$1 n=$2 rel=$3
    shift 3
    for z in 0 1 2 3; do
        TRAIN_TIMEOUT=200 train_save "${name}_$z" $n "$@" --zero $z --metrics "$T/${name}_$z.jsonl" || return
        # the rank table: $5 peak MiB, $11 predicted MiB
        awk '$1 ~ /^[0-9]+$/ && NF >= 11 { if ($5 != $11) bad = bad " rank " $1 ": " $5 " vs " $11 } END { if (bad) { print bad; exit 1 } }' \
            "$T/${name}_$z.log" >"$T/pred" && ok "$name --zero $z: peak = prediction on every rank" ||
            bad "$name --zero $z: peak against prediction:$(cat "$T/pred")"
    done
    local p0 p1 p2 p3
    p0=$(peaks "${name}_0"); p1=$(peaks "${name}_1"); p2=$(peaks "${name}_2"); p3=$(peaks "${name}_3")
    python3 - "$p0" "$p1" "$p2" "$p3" "$rel" "$n" <<'PY' && ok "$name: peak bytes per rank --zero 0 [$p0] > 1 [$p1] > 2 [$p2] > 3 [$p3] ($rel)" || bad "$name: peak bytes per rank --zero 0 [$p0], 1 [$p1], 2 [$p2], 3 [$p3] ($rel)"
import sys
a, b, c, d = (list(map(int, s.split())) for s in sys.argv[1:5])
rel, n = sys.argv[5], int(sys.argv[6])
good = len(a) == len(b) == len(c) == len(d) == n and all(x > y for x, y in zip(a, b))
rel, signs = (rel.split(",3=") + [">" * n])[:2]
good = good and all((y == z) if rel == "eq12" else (y > z) for y, z in zip(b, c))
good = good and len(signs) == n and all((z == w) if sg == "=" else (z > w) for z, w, sg in zip(c, d, signs))
sys.exit(0 if good else 1)
PY
    near "$T/${name}_0" "$T/${name}_2" "$name: --zero 2 = --zero 0" $([ "${rel%%,*}" = sgd ] && echo --rtol 1e-5)
    same "$T/${name}_2" "$T/${name}_3" "$name: --zero 3 = --zero 2"
}

G="--model gpt --heads 4 --seq 32 --batch 8 --microbatches 2 --steps 3 --threads 1 --dp 2"
SGD="--optimizer sgd --lr 0.05"
order gpt4x64 2 sgd $G --layers 4 --d-model 64 $SGD    # the issue's model: 3 buffers of one bucket cost more than the shard saved
order gpt2x32 2 adamw $G --layers 2 --d-model 32 --optimizer adamw
order gpt6x96 2 sgd $G --layers 6 --d-model 96 $SGD
order gpt6x64pp2 4 adamw $G --layers 6 --d-model 64 --pp 2 --optimizer adamw
order gpt6x64tie 2 sgd $G --layers 6 --d-model 64 --tie-embeddings $SGD # tied buckets whole (all-reduced) beside the pool
order gpt4x64tie 2 sgd $G --layers 4 --d-model 64 --tie-embeddings $SGD # tied buckets and buffers of the smaller buckets still below the saving
order gpt2x64tiepp2 4 "eq12,3=>>==" $G --layers 2 --d-model 64 --tie-embeddings --pp 2 $SGD # the tie's partner gradient counted too
order gpt1x64 2 "eq12,3===" $G --layers 1 --d-model 64 $SGD # one block outweighs the shard's saving (gradients, parameters)
finish
