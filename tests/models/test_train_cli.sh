#!/usr/bin/env bash
# tests/models/test_train_cli.sh: `brigade train` as a user meets it: a tiny
# run with --metrics and --save, and bad input that must fail clearly,
# non-zero, before anything is written.
. "$(dirname "$0")/../lib/harness.sh"

# expect_fail "pattern" args...: non-zero exit and the pattern on stderr
expect_fail() {
  local pat=$1; shift
  if "$B" train "$@" >"$T/out" 2>"$T/err"; then
    bad "brigade train $* succeeded"; return
  fi
  if grep -q -- "$pat" "$T/err"; then ok; else bad "brigade train $*: stderr lacks '$pat':"; cat "$T/err"; fi
}

TINY="--layers 1 --d-model 16 --heads 2 --seq 16 --batch 4 --microbatches 2 --threads 1"

# a real run
if "$B" train $TINY --steps 5 --metrics "$T/m.jsonl" --save "$T/save" --quiet >"$T/out" 2>"$T/err"; then ok; else bad "tiny run failed"; cat "$T/err"; fi
[ "$(wc -l <"$T/m.jsonl")" = 6 ] && ok || bad "metrics has $(wc -l <"$T/m.jsonl") lines, expected a header and 5 steps"
python3 - "$T/m.jsonl" <<'PY' && ok || bad "metrics lines are not the expected JSON"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert lines[0]["run"]["model"] == "gpt" and lines[0]["run"]["pp"] == 1, lines[0]  # the header says what ran
rows = lines[1:]
assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
for r in rows:
    assert set(r) >= {"step", "loss", "tokens_per_s", "step_ms"}
    assert r["loss"] > 0 and r["tokens_per_s"] > 0 and r["step_ms"] > 0
PY
[ -s "$T/save/model.safetensors" ] && ok || bad "no model.safetensors"
ls "$T/save" | grep -q tmp && bad "temporary file left in save dir" || ok
grep -q "loss" "$T/out" && ok || bad "no summary printed"
"$B" train --help | grep -q -- "--microbatches" && ok || bad "--help lacks --microbatches"
"$B" train --model mlp --layers 2 --d-model 8 --batch 4 --microbatches 4 --steps 2 --quiet >/dev/null 2>&1 && ok || bad "mlp run failed"

# bad input
expect_fail "unknown option \"--bogus\"" --bogus 1
expect_fail "heads (3) must divide d_model (16)" --d-model 16 --heads 3 --steps 1
expect_fail "--seq must be in" --seq 0
expect_fail "--batch expects an integer" --batch ten
expect_fail "not divisible into 3 equal microbatches" --batch 10 --microbatches 3
expect_fail "--model must be one of gpt, mlp or llama" --model rnn
expect_fail "--precision must be fp32 or bf16" --precision fp16
expect_fail "precision bf16 needs a GPT" --model mlp --precision bf16 --steps 1
expect_fail "vocab 100 is too small" $TINY --steps 1 --vocab 100
expect_fail "cannot open data file $T/missing.txt" $TINY --steps 1 --data "$T/missing.txt"
: >"$T/empty.txt"
expect_fail "is empty" $TINY --steps 1 --data "$T/empty.txt"
echo "hello" >"$T/file"
expect_fail "is not a directory" $TINY --steps 1 --save "$T/file"
expect_fail "$T/file/sub: Not a directory\|directory $T/file/sub" $TINY --steps 1 --save "$T/file/sub"
expect_fail "cannot write metrics file" $TINY --steps 1 --metrics "$T/nodir/m.jsonl"
expect_fail "unexpected argument" $TINY stray
# a plan for another model or another world size: the mismatch is named
"$B" plan --model gpt --layers 2 --d-model 16 --heads 2 --seq 16 --devices 2 --mem 1G --pp 2 --json "$T/plan.json" >/dev/null 2>&1 || bad "plan"
expect_fail "was made for another model" --plan "$T/plan.json" --d-model 32 --steps 1
expect_fail "pp 2 x dp 1 = 2 ranks" --plan "$T/plan.json" --steps 1
# brigade profile: one row per layer with measured times, and its JSON
if "$B" profile --layers 2 --d-model 16 --heads 2 --seq 16 --threads 1 --json "$T/prof.json" >"$T/prof" 2>&1; then
  python3 - "$T/prof.json" <<'PY' && ok || bad "profile JSON"
import json, sys
d = json.load(open(sys.argv[1]))
names = [l["name"] for l in d["layers"]]
assert names == ["embed", "blocks.0", "blocks.1", "ln_f", "head"], names
for l in d["layers"]:
    assert l["fwd_s"] > 0 and l["bwd_s"] > 0 and l["bwd_input_s"] > 0 and l["params"] >= 0
PY
else bad "profile run"; cat "$T/prof"; fi
if "$B" profile --microbatch-size 0 >/dev/null 2>"$T/e"; then bad "profile --microbatch-size 0 accepted"; else ok; fi
# a failed run leaves no partial output behind
expect_fail "is empty" $TINY --steps 1 --data "$T/empty.txt" --save "$T/save2"
[ ! -e "$T/save2/model.safetensors" ] && ok || bad "a failed run wrote weights"

finish
