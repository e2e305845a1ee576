#!/usr/bin/env bash
# tests/runtime/test_eval.sh: evaluation (brigade train --eval-every) with the
# schedule's forward-only program. The held-out loss of a pipeline (1F1B,
# ZB-V, interleaved, and the others; through staged transfers too) is
# bitwise one process's, data parallelism's within its tolerance;
# evaluating changes no weight (every step's loss and the saved weights are
# bitwise those of a run that evaluates only at its end); val_ppl =
# exp(val_loss); the progress line, summary and plot show it; bad flags are
# refused in one line.
. "$(dirname "$0")/../lib/harness.sh"

GPT="--model gpt --layers 4 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 4 --steps 4 --threads 1"
EV="--eval-every 2 --eval-batches 2"

# train_m NAME RANKS ARGS...: train_save with metrics in $T/NAME.jsonl
train_m() { local n=$1 r=$2; shift 2; train_save "$n" "$r" "$@" --metrics "$T/$n.jsonl"; }

# vals FILE: "step rank val_loss" of every line that evaluated, sorted
vals() {
  python3 - "$1" <<'PY'
import json, math, sys
for line in open(sys.argv[1]):
    o = json.loads(line)
    if "val_loss" in o:
        # the perplexity is the exponential of the loss (printed to 9 digits)
        assert abs(o["val_ppl"] - math.exp(o["val_loss"])) <= 1e-8 * o["val_ppl"], o
        print(o["step"], o["rank"], repr(o["val_loss"]))
PY
}
# per_step FILE: every step's val_loss (the ranks must agree), one line per evaluated step
per_step() { vals "$1" | awk '{ v[$1] = v[$1] " " $3 } END { for (s in v) print s, v[s] }' | sort -n |
             awk '{ for (i = 3; i <= NF; i++) if ($i != $2) { print "ranks differ at step " $1; exit 1 } print $1, $2 }'; }

train_m ref 1 $GPT $EV
if per_step "$T/ref.jsonl" >"$T/ref.val" && [ "$(cut -d' ' -f1 "$T/ref.val" | tr '\n' ' ')" = "2 4 " ]; then
  ok "one process: evaluated after steps 2 and 4: $(tr '\n' ' ' <"$T/ref.val")"
else
  bad "one process: evaluations $(cat "$T/ref.val")"
fi

# evaluating changes nothing: the same held-out split, evaluated after every step or only at the end
train_m every 1 $GPT --eval-every 1 --eval-batches 2
train_m end 1 $GPT --eval-every 100 --eval-batches 2
same "$T/every" "$T/end" "evaluating after every step leaves the weights of evaluating at the end"
losses() { python3 -c 'import json,sys; print([json.loads(l).get("loss") for l in open(sys.argv[1])][1:])' "$1"; }
if [ "$(losses "$T/every.jsonl")" = "$(losses "$T/end.jsonl")" ] && [ "$(losses "$T/ref.jsonl")" = "$(losses "$T/end.jsonl")" ]; then
  ok "every step's loss is the same whatever the evaluations"
else
  bad "losses differ: $(losses "$T/every.jsonl") vs $(losses "$T/end.jsonl")"
fi
if [ "$(per_step "$T/every.jsonl" | sed -n 4p)" = "$(sed -n 2p "$T/ref.val")" ]; then
  ok "the held-out set is the same batches each time (step 4's loss agrees across runs)"
else
  bad "step 4's held-out loss: $(per_step "$T/every.jsonl" | sed -n 4p) vs $(sed -n 2p "$T/ref.val")"
fi

train_m ppevery 2 $GPT --eval-every 1 --eval-batches 2 --pp 2 --schedule zbv
same "$T/end" "$T/ppevery" "pp 2 zbv evaluating after every step leaves one process's weights of evaluating at the end"

# pipelines: bitwise one process's held-out loss (and weights)
n=0
for layout in "2 --pp 2 --schedule 1f1b" "2 --pp 2 --schedule zbv" "2 --pp 2 --schedule interleaved --chunks 2" \
              "2 --pp 2 --schedule gpipe" "3 --pp 3 --schedule zb-h1" "2 --pp 2 --schedule dualpipev" \
              "2 --pp 2 --schedule zb-interleaved --chunks 2"; do
  n=$((n + 1)); set -- $layout; r=$1; shift
  train_m "pp$n" "$r" $GPT $EV "$@" || continue
  if got=$(per_step "$T/pp$n.jsonl") && [ "$got" = "$(cat "$T/ref.val")" ]; then
    ok "$*: held-out loss bitwise one process's on every rank"
  else
    bad "$*: held-out loss $got, one process $(cat "$T/ref.val")"
  fi
  same "$T/ref" "$T/pp$n" "$*: weights"
done

# the staged path of device buffers (forced on the CPU): the evaluation's sends go through it too
export BRIGADE_STAGING=always
train_m staged 2 $GPT $EV --pp 2 --schedule zbv
unset BRIGADE_STAGING
if got=$(per_step "$T/staged.jsonl") && [ "$got" = "$(cat "$T/ref.val")" ]; then
  ok "pp 2 zbv, BRIGADE_STAGING=always: held-out loss bitwise one process's"
else
  bad "BRIGADE_STAGING=always: held-out loss $got, one process $(cat "$T/ref.val")"
fi

# data parallelism (the replicas' shares summed), ZeRO (parameters gathered first), tensor parallelism
for layout in "2 --dp 2" "4 --pp 2 --dp 2 --zero 1" "2 --tp 2"; do
  n=$((n + 1)); set -- $layout; r=$1; shift
  train_m "dp$n" "$r" $GPT $EV "$@" || continue
  if msg=$(python3 - "$T/ref.val" <(per_step "$T/dp$n.jsonl") <<'PY'
import sys
a = [l.split() for l in open(sys.argv[1])]; b = [l.split() for l in open(sys.argv[2])]
assert [x[0] for x in a] == [x[0] for x in b], (a, b)
for x, y in zip(a, b):
    assert abs(float(x[1]) - float(y[1])) <= 1e-5 * abs(float(x[1])), (x, y)
print(b)
PY
  ); then ok "$*: held-out loss within 1e-5 of one process's: $msg"; else bad "$*: $msg"; fi
done

# the MLP (held-out samples of its task), --val-data, the progress line and the summary
if "$B" train --model mlp --layers 2 --d-model 16 --in-features 8 --classes 4 --batch 8 --microbatches 2 --steps 3 \
     --threads 1 --eval-every 3 >"$T/mlp.log" 2>&1 && grep -q "^step 3/3 loss [0-9.]* gnorm .* val [0-9.]* ppl [0-9.]*" "$T/mlp.log" &&
   grep -q "^validation loss [0-9.]*, perplexity [0-9.]*$" "$T/mlp.log"; then
  ok "mlp: progress line and summary show the held-out loss and perplexity"
else
  bad "mlp: $(tail -4 "$T/mlp.log")"
fi
head -c 20000 "$SRC/data/kjv.txt" >"$T/val.txt"
if "$B" train $GPT --eval-every 4 --val-data "$T/val.txt" --quiet >"$T/vd.log" 2>&1 && grep -q "^validation loss" "$T/vd.log"; then
  ok "--val-data: $(grep '^validation loss' "$T/vd.log")"
else
  bad "--val-data: $(tail -3 "$T/vd.log")"
fi

# the plot draws the evaluations
if "$B" plot "$T/ref.jsonl" --out "$T/ref.svg" >"$T/plot.log" 2>&1 && grep -q "validation loss" "$T/plot.log" &&
   [ "$(grep -c '<circle[^>]*ff7f0e' "$T/ref.svg")" = 3 ]; then  # two evaluations and the legend's mark
  ok "plot: $(cat "$T/plot.log")"
else
  bad "plot: $(cat "$T/plot.log")"
fi

expect 2 "--eval-batches, --val-fraction and --val-data go with --eval-every N" train $GPT --val-fraction 0.2
expect 2 "--val-data and --val-fraction both say where the held-out data is" train $GPT --eval-every 2 \
  --val-fraction 0.2 --val-data "$T/val.txt"
expect 2 "--val-data is a file of text or tokens for a GPT or Llama" train --model mlp --eval-every 2 --val-data "$T/val.txt"
expect 2 "--val-fraction must be in (0, 1), got 1.5" train $GPT --eval-every 2 --val-fraction 1.5
expect 1 "holding out 0.0005 of a 20000-byte corpus" train $GPT --eval-every 2 --val-fraction 0.0005 --data "$T/val.txt"
finish 31
