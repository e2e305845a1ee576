#!/usr/bin/env bash
# tests/runtime/test_clip.sh: --clip-grad X (clipping by global norm).
# Direct computation in one process: with SGD, one step's update is -lr * g,
# so the gradients are read back from the weights before and after an
# unclipped step; their norm computed here must be the reported grad_norm,
# and the clipped step's update must be min(1, X / (norm + 1e-6)) times the
# unclipped one. X above the norm changes nothing (bitwise). Across layouts
# the clipped weights are bitwise those of one process (pp 2: 1f1b, zbv,
# interleaved) or of --dp 2 (pp 2 x dp 2, --zero 1, --ps 1 and --ps 2
# servers), as the unclipped runs are; tp 2 (with and without sequence
# parallelism) within tolerance (an unclipped run is 1e-2 away); the progress
# line's gnorm is the norm before clipping.
. "$(dirname "$0")/../lib/harness.sh"

GPT="--model gpt --layers 3 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 2 --threads 1"
SGD="$GPT --optimizer sgd --lr 0.5"

train_save w0 1 $GPT --steps 0
train_save u 1 $SGD --steps 1 --metrics "$T/u.jsonl"
G=$(python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1])][1]["grad_norm"])' "$T/u.jsonl")
X=$(python3 -c "print($G / 4)")
train_save c 1 $SGD --steps 1 --clip-grad "$X" --metrics "$T/c.jsonl"
if msg=$(python3 - "$T" "$X" <<'PY' 2>&1
import json, math, struct, sys
def load(path):  # safetensors: u64 header length, JSON header, F32 data
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", v
        s, e = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
    return out
d, X = sys.argv[1], float(sys.argv[2])
w0, u, c = (load(f"{d}/{n}/model.safetensors") for n in ("w0", "u", "c"))
lr = 0.5
g = {k: [(a - b) / lr for a, b in zip(w0[k], u[k])] for k in w0}
norm = math.sqrt(sum(x * x for v in g.values() for x in v))
G = [json.loads(l) for l in open(f"{d}/u.jsonl")][1]["grad_norm"]
Gc = [json.loads(l) for l in open(f"{d}/c.jsonl")][1]["grad_norm"]
assert abs(norm - G) <= 1e-3 * G, f"norm of the gradients read back {norm} vs reported {G}"
assert abs(Gc - G) <= 1e-6 * G, f"clipped run reports {Gc}, the norm before clipping is {G}"
k = X / (G + 1e-6)
assert k < 0.3, k
num = den = 0.0
for key in w0:
    for a, b, e in zip(w0[key], u[key], c[key]):
        want = k * (a - b)  # the clipped update
        num += ((a - e) - want) ** 2
        den += want * want
rel = math.sqrt(num / den)
assert rel < 1e-4, f"clipped update vs k x unclipped update: relative L2 {rel}"
print(f"norm {G:.6g} (read back {norm:.6g}), factor {k:.4f}, update relative L2 {rel:.2e}")
PY
); then ok "one process: clipped update = min(1, X/(norm+eps)) x update, norm read back from the weights: $msg"
else bad "one process: $msg"; fi
train_save big 1 $SGD --steps 1 --clip-grad "$(python3 -c "print($G * 2)")"
same "$T/u" "$T/big" "--clip-grad above the norm changes nothing"

# layouts: 6 steps of AdamW, clipped at every step (X below every norm)
A="$GPT --steps 6 --lr 3e-3 --clip-grad 0.3"
train_save ref 1 $A --metrics "$T/ref.jsonl"
python3 - "$T/ref.jsonl" <<'PY' && ok "every step clipped (grad_norm > 0.3)" || bad "not every step was clipped"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
assert len(rows) == 6 and all(r["grad_norm"] > 0.3 for r in rows), rows
PY
train_save noclip 1 $GPT --steps 6 --lr 3e-3
if "$B" compare "$T/ref" "$T/noclip" >/dev/null; then bad "clipping changed nothing"; else ok "clipping changes the weights"; fi
train_save pp2 2 $A --pp 2 --schedule 1f1b
same "$T/ref" "$T/pp2" "pp 2 1f1b = one process (bitwise)"
train_save zbv 2 $A --pp 2 --schedule zbv
same "$T/ref" "$T/zbv" "pp 2 zbv = one process (bitwise)"
train_save il 2 $A --pp 2 --schedule interleaved --chunks 2 --tie-embeddings
train_save tie 1 $A --tie-embeddings
same "$T/tie" "$T/il" "tied embeddings, pp 2 interleaved = one process (bitwise)"
train_save dp2 2 $A --dp 2
train_save ppdp 4 $A --dp 2 --pp 2
same "$T/dp2" "$T/ppdp" "pp 2 x dp 2 = dp 2 (bitwise)"
train_save z1 2 $A --dp 2 --zero 1
same "$T/dp2" "$T/z1" "--zero 1 = dp 2 (bitwise)"
train_save z2 2 $A --dp 2 --zero 2
near "$T/dp2" "$T/z2" "--zero 2 = dp 2 (within rounding, as unclipped)"
train_save ps1 3 $A --ps 1
same "$T/dp2" "$T/ps1" "--ps 1 with 2 workers = dp 2 (bitwise)"
train_save ps2 4 $A --ps 2 --metrics "$T/ps2.jsonl"
same "$T/dp2" "$T/ps2" "--ps 2 with 2 workers = dp 2 (bitwise; the servers' norms meet)"
train_save tp2 2 $A --tp 2
near "$T/ref" "$T/tp2" "tp 2 = one process (within the tensor-parallel tolerance)" --rel-l2 1e-4
train_save sp2 2 $A --tp 2 --sequence-parallel
near "$T/ref" "$T/sp2" "tp 2 with sequence parallelism = one process (within the tensor-parallel tolerance)" --rel-l2 1e-4

expect_train 2 "--clip-grad" $GPT --steps 1 --clip-grad -1
finish 15
