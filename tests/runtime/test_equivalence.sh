#!/usr/bin/env bash
# tests/runtime/test_equivalence.sh: every schedule and pipeline degree gives
# the weights of one process after 10 steps, bitwise (same seed, data,
# data-parallel degree and microbatch count), in fp32 and with bf16
# activations; data parallelism gives them within 1e-5 relative. Weights are compared tensor by tensor from --save.
. "$(dirname "$0")/../lib/harness.sh"
export BRIGADE_TIMEOUT=60

# ref NAME ARGS...: single-process reference run
ref() {
  local name=$1; shift
  "$B" train "$@" --quiet --save "$T/$name" >"$T/$name.log" 2>&1 || { bad "reference $name failed"; cat "$T/$name.log"; }
}
# eq_case REF RTOL N ARGS...: N ranks with ARGS must match reference REF
eq_case() {
  local r=$1 rtol=$2 n=$3; shift 3
  local out="$T/run$((pass + fails))"
  if ! timeout 120 "$B" launch -n "$n" -- "$B" train "$@" --quiet --save "$out" >"$out.log" 2>&1; then
    bad "launch -n $n train $*"; grep -v WARN "$out.log" | tail -5; return
  fi
  if grep -q "live allocations" "$out.log"; then bad "n=$n $*: memory leaked: $(grep -m1 'live allocations' "$out.log")"; return; fi
  local verdict
  case "$rtol" in
    0) verdict=$("$B" compare "$T/$r" "$out") ;;
    l2:*) verdict=$("$B" compare "$T/$r" "$out" --rel-l2 "${rtol#l2:}") ;;
    *) verdict=$("$B" compare "$T/$r" "$out" --rtol "$rtol") ;;
  esac
  if [ $? = 0 ]; then
    pass=$((pass + 1)); echo "ok   n=$n $* :: $verdict"
  else
    bad "n=$n $* :: $verdict"
  fi
}

GPT="--model gpt --layers 5 --d-model 16 --heads 2 --seq 16 --batch 8 --steps 10 --threads 1 --lr 3e-3"
MLP="--model mlp --layers 3 --d-model 24 --in-features 12 --classes 6 --batch 16 --steps 10 --threads 1 --lr 3e-3"

ref gpt4 $GPT --microbatches 4
eq_case gpt4 0 2 $GPT --microbatches 4 --pp 2 --schedule gpipe
eq_case gpt4 0 2 $GPT --microbatches 4 --pp 2 --schedule 1f1b
eq_case gpt4 0 3 $GPT --microbatches 4 --pp 3 --schedule 1f1b
eq_case gpt4 0 3 $GPT --microbatches 4 --pp 3 --schedule zb-h1 --split 1,5,2
eq_case gpt4 0 4 $GPT --microbatches 4 --pp 4 --schedule zb-h2
eq_case gpt4 0 2 $GPT --microbatches 4 --pp 2 --schedule interleaved --chunks 2
eq_case gpt4 0 4 $GPT --microbatches 4 --pp 4 --schedule interleaved --chunks 2
eq_case gpt4 0 2 $GPT --microbatches 4 --pp 2 --schedule zb-interleaved --chunks 2
eq_case gpt4 0 2 $GPT --microbatches 4 --pp 2 --schedule zb-interleaved --chunks 3 --split 1,1,1,1,2,2
eq_case gpt4 0 2 $GPT --microbatches 4 --pp 2 --schedule dualpipev
eq_case gpt4 0 2 $GPT --microbatches 4 --pp 2 --schedule zbv
eq_case gpt4 0 3 $GPT --microbatches 4 --pp 3 --schedule zbv --split 1,1,1,2,2,1

# activation recomputation changes memory, not arithmetic
eq_case gpt4 0 1 $GPT --microbatches 4 --recompute --checkpoint-dir "$T/rc1"
eq_case gpt4 0 2 $GPT --microbatches 4 --pp 2 --schedule zb-h1 --recompute
eq_case gpt4 0 3 $GPT --microbatches 4 --pp 3 --schedule zbv --recompute

# bf16 activations (--precision bf16): the blocks round what they keep, the same in every layout, so a
# pipeline still gives one process's weights bitwise; the rounding is real (not fp32's bits) and small
ref gptbf $GPT --microbatches 4 --precision bf16
eq_case gptbf 0 2 $GPT --microbatches 4 --pp 2 --schedule 1f1b --precision bf16
eq_case gptbf 0 3 $GPT --microbatches 4 --pp 3 --schedule zb-h1 --precision bf16 --recompute
eq_case gptbf 0 2 $GPT --microbatches 4 --pp 2 --schedule dualpipev --precision bf16
if "$B" compare "$T/gpt4" "$T/gptbf" >"$T/cmp" 2>&1; then bad "bf16 gave fp32's bits: $(cat "$T/cmp")"
elif v=$("$B" compare "$T/gpt4" "$T/gptbf" --rel-l2 1e-2); then pass=$((pass + 1)); echo "ok   bf16 vs fp32 after 10 steps: $v"
else bad "bf16 far from fp32: $v"; fi

# the activations cross between stages in bf16: rank 0 (it sends them) sends half of fp32's bytes, rank 1
# (it sends the gradients, fp32) the same
for p in fp32 bf16; do
  timeout 120 "$B" launch -n 2 -- "$B" train $GPT --microbatches 4 --pp 2 --steps 2 --precision $p --quiet \
    --metrics "$T/sent_$p.jsonl" >/dev/null 2>&1 || bad "pp 2 $p run for the bytes sent"
done
if v=$(python3 - "$T/sent_fp32.jsonl" "$T/sent_bf16.jsonl" <<'PY'
import json, sys
f, b = ({(r["rank"], r["step"]): r["bytes_sent"] for r in map(json.loads, open(x)) if "bytes_sent" in r} for x in sys.argv[1:3])
print("bytes sent per step, fp32 / bf16: rank 0 %d / %d, rank 1 %d / %d" % (f[0, 1], b[0, 1], f[1, 1], b[1, 1]))
sys.exit(0 if len(f) == 4 and all(b[0, s] * 2 == f[0, s] and b[1, s] == f[1, s] > 0 for s in (1, 2)) else 1)
PY
); then pass=$((pass + 1)); echo "ok   $v"; else bad "bf16 messages: $v"; fi

ref gpt2 $GPT --microbatches 2
eq_case gpt2 0 4 $GPT --microbatches 2 --pp 4 --schedule 1f1b          # m < p
eq_case gpt2 0 3 $GPT --microbatches 2 --pp 3 --schedule zb-h1

ref gptvar $GPT --microbatches 4 --seq-min 5                          # variable lengths
eq_case gptvar 0 3 $GPT --microbatches 4 --seq-min 5 --pp 3 --schedule zb-h2

# tied input embedding and output head: identical copies on the first and last stage
ref gpttie $GPT --microbatches 4 --tie-embeddings
python3 - "$T/gpttie/model.safetensors" <<'PY' && pass=$((pass + 1)) || bad "tied copies differ in the reference"
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
def get(k):
    a, b = h[k]["data_offsets"]; f.seek(8 + n + a); return f.read(b - a)
assert get("embed.wte") == get("head.weight")
PY
eq_case gpttie 0 2 $GPT --microbatches 4 --tie-embeddings --pp 2 --schedule 1f1b
eq_case gpttie 0 3 $GPT --microbatches 4 --tie-embeddings --pp 3 --schedule zb-h1
eq_case gpttie 0 2 $GPT --microbatches 4 --tie-embeddings --pp 2 --schedule zbv          # both on rank 0
eq_case gpttie 0 4 $GPT --microbatches 4 --tie-embeddings --pp 4 --schedule interleaved --chunks 2

ref mlp4 $MLP --microbatches 4
eq_case mlp4 0 2 $MLP --microbatches 4 --pp 2
eq_case mlp4 0 3 $MLP --microbatches 4 --pp 3 --split 3,3,1 --schedule gpipe
eq_case mlp4 0 4 $MLP --microbatches 4 --pp 4 --schedule zb-h1

# data parallel with AdamW: the weights within 1e-5 relative (||a-b|| / ||a||
# over all tensors); per tensor, near-zero biases differ by up to ~1e-4 of
# their own size, because Adam's m/sqrt(v) turns last-bit gradient
# differences into visible steps
eq_case gpt2 l2:1e-5 2 $GPT --microbatches 2 --dp 2
eq_case gpt4 l2:1e-5 4 $GPT --microbatches 4 --dp 2 --pp 2 --schedule 1f1b
# data parallel with SGD: every tensor within 1e-5 of its own size
ref gptsgd $GPT --microbatches 2 --optimizer sgd --lr 0.05
eq_case gptsgd 1e-5 2 $GPT --microbatches 2 --optimizer sgd --lr 0.05 --dp 2
eq_case gptsgd 1e-5 4 $GPT --microbatches 2 --optimizer sgd --lr 0.05 --dp 2 --pp 2 --schedule zb-h1
ref gptsgdtie $GPT --microbatches 2 --optimizer sgd --lr 0.05 --tie-embeddings
eq_case gptsgdtie 1e-5 4 $GPT --microbatches 2 --optimizer sgd --lr 0.05 --tie-embeddings --dp 2 --pp 2
BRIGADE_BUCKET_MB=0 eq_case gptsgd 1e-5 4 $GPT --microbatches 2 --optimizer sgd --lr 0.05 --dp 2 --pp 2   # one bucket per layer
ref mlpsgd $MLP --microbatches 2 --optimizer sgd --lr 0.05
eq_case mlpsgd 1e-5 4 $MLP --microbatches 2 --optimizer sgd --lr 0.05 --dp 4

# the thread count never changes a bit (kernels reduce in a fixed order)
G64="--model gpt --layers 3 --d-model 64 --heads 4 --seq 32 --batch 8 --microbatches 2 --steps 5 --lr 3e-3"
ref thr1 $G64 --threads 1
for n in 2 3; do
  "$B" train $G64 --threads $n --quiet --save "$T/thr$n" >/dev/null 2>&1 || bad "threads $n run"
  v=$("$B" compare "$T/thr1" "$T/thr$n") && { pass=$((pass + 1)); echo "ok   threads 1 vs $n: $v"; } || bad "threads 1 vs $n: $v"
done

# the comparison itself can fail: different microbatch counts are not bitwise equal
if "$B" compare "$T/gpt4" "$T/gpt2" >"$T/cmp" 2>&1; then bad "compare said gpt4 == gpt2: $(cat "$T/cmp")"; else pass=$((pass + 1)); echo "ok   different runs differ: $(cat "$T/cmp")"; fi
if "$B" compare "$T/gpt4" "$T/mlp4" >"$T/cmp" 2>&1; then bad "compare said gpt == mlp"; else pass=$((pass + 1)); echo "ok   different models differ"; fi

finish
