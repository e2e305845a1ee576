#!/usr/bin/env bash
# tests/runtime/test_grad_norm.sh: the step result's gradient norm (metrics
# "grad_norm", the progress line's "gnorm") is the same on every rank of a job
# and agrees with one process within 1e-6 relative for every pipeline and
# data-parallel layout (the ranks' sums of squares meet in one float32
# allreduce, as hi + lo parts; a tied tensor is counted once).
. "$(dirname "$0")/../lib/harness.sh"

GPT="--model gpt --layers 4 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 4 --steps 3 --threads 1 --tie-embeddings"
MLP="--model mlp --layers 3 --d-model 24 --in-features 12 --classes 6 --batch 16 --microbatches 4 --steps 3 --threads 1"

# same_gnorm REF RUN: every step's grad_norm of RUN (every rank) within 1e-6 of REF's
same_gnorm() {
  python3 - "$1" "$2" <<'PY'
import json, math, sys
def load(p):
    d = {}
    for line in open(p):
        o = json.loads(line)
        if "step" not in o:
            continue  # the header line: {"run": {...}}
        d.setdefault(o["step"], []).append(o["grad_norm"])
    return d
ref, run = load(sys.argv[1]), load(sys.argv[2])
assert sorted(ref) == sorted(run) == [1, 2, 3], (sorted(ref), sorted(run))
for s, (g,) in ref.items():
    assert g > 0 and math.isfinite(g), g
    for h in run[s]:
        assert abs(h - g) <= 1e-6 * g, f"step {s}: {h} vs {g}"
    assert len(set(run[s])) == 1, f"step {s}: ranks differ: {run[s]}"
PY
}

for m in gpt mlp; do
  [ $m = gpt ] && A=$GPT || A=$MLP
  if "$B" train $A --metrics "$T/$m.jsonl" >"$T/$m.log" 2>&1 && grep -q "^step 3/3 loss [0-9.]* gnorm [0-9.e+-]* lr" "$T/$m.log"; then
    ok "$m: one process, progress line has gnorm"
  else
    bad "$m: one process"; cat "$T/$m.log"
  fi
  n=0
  for layout in "2 --pp 2 --schedule 1f1b" "3 --pp 3 --schedule zb-h1" "2 --pp 2 --schedule zbv" \
                "2 --dp 2" "4 --pp 2 --dp 2 --schedule interleaved --chunks 2"; do
    n=$((n + 1)); set -- $layout; r=$1; shift
    out="$T/$m-$n"
    if ! timeout 120 "$B" launch -n "$r" -- "$B" train $A "$@" --quiet --metrics "$out.jsonl" >"$out.log" 2>&1; then
      bad "$m $*: run failed"; tail -5 "$out.log"; continue
    fi
    if msg=$(same_gnorm "$T/$m.jsonl" "$out.jsonl" 2>&1); then ok "$m $*: grad_norm agrees"; else bad "$m $*: $msg"; fi
  done
done
finish
