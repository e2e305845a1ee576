#!/usr/bin/env bash
# tests/runtime/compare_binaries.sh OLD NEW: the final weights of brigade
# binary NEW are bitwise those of brigade binary OLD, layout by layout: every
# schedule at pp 2-4, data parallelism, ZeRO 1 and 2, parameter servers, tensor
# parallelism with sequence parallelism, pp x dp x tp, tied embeddings,
# DualPipe's copies with ties and with dp and ZeRO, bf16,
# and a user model (examples/byom). For a refactor that must not change
# behaviour: run it with the binary before the change and the one after.
# Each layout runs once per binary with the same flags; the two saved
# directories must hold the same tensors bit for bit (brigade compare with no
# tolerance) and the same files byte for byte (cmp).
#
# The user model's programs: OLD_BYOM / NEW_BYOM, by default
# examples/byom/train_byom beside each brigade binary (skipped, and said so,
# when one is missing).
set -u
OLD=${1:?usage: compare_binaries.sh OLD_BRIGADE NEW_BRIGADE}
NEW=${2:?usage: compare_binaries.sh OLD_BRIGADE NEW_BRIGADE}
OLD_BYOM=${OLD_BYOM:-$(dirname "$OLD")/examples/byom/train_byom}
NEW_BYOM=${NEW_BYOM:-$(dirname "$NEW")/examples/byom/train_byom}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export BRIGADE_TIMEOUT=60
pass=0; fails=0; k=0

# run LAUNCHER N OUT COMMAND...: one training run of N ranks, saved to OUT
run() {
  local launcher=$1 n=$2 out=$3; shift 3
  timeout 300 "$launcher" launch -n "$n" -- "$@" --save "$out" >"$out.log" 2>&1
}

# same N PROGRAM_KIND ARGS...: OLD and NEW give the same files (PROGRAM_KIND: train | byom)
same() {
  local n=$1 kind=$2; shift 2
  k=$((k + 1))
  local a="$T/old$k" b="$T/new$k" po=("$OLD" train) pn=("$NEW" train)
  if [ "$kind" = byom ]; then po=("$OLD_BYOM"); pn=("$NEW_BYOM"); fi
  if ! run "$OLD" "$n" "$a" "${po[@]}" "$@"; then
    echo "FAIL: old binary, n=$n $kind $*"; tail -5 "$a.log"; fails=$((fails + 1)); return
  fi
  if ! run "$NEW" "$n" "$b" "${pn[@]}" "$@"; then
    echo "FAIL: new binary, n=$n $kind $*"; tail -5 "$b.log"; fails=$((fails + 1)); return
  fi
  local v files=0 diff=""
  v=$("$OLD" compare "$a" "$b" 2>&1)
  local rc=$?
  for f in "$a"/*; do
    files=$((files + 1))
    cmp -s "$f" "$b/$(basename "$f")" || diff="$diff $(basename "$f")"
  done
  if [ "$(ls "$a" | wc -l)" != "$(ls "$b" | wc -l)" ]; then diff="$diff (file lists differ)"; fi
  if [ $rc = 0 ] && [ -z "$diff" ] && [ $files -gt 0 ]; then
    pass=$((pass + 1)); echo "same n=$n $kind $* :: $v; $files file(s) identical"
  else
    fails=$((fails + 1)); echo "FAIL n=$n $kind $* :: $v; files differing:${diff:- none} ($files)"
  fi
}

GPT="--model gpt --layers 4 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 4 --steps 3 --threads 1 --lr 3e-3 --quiet"
MLP="--model mlp --layers 3 --d-model 24 --in-features 12 --classes 6 --batch 16 --microbatches 4 --steps 3 --threads 1 --lr 3e-3 --quiet"

# every schedule, pp 2-4
same 2 train $GPT --pp 2 --schedule gpipe
same 3 train $GPT --pp 3 --schedule 1f1b
same 2 train $GPT --pp 2 --schedule interleaved --chunks 2
same 3 train $GPT --pp 3 --schedule zb-h1
same 4 train $GPT --pp 4 --schedule zb-h2
same 2 train $GPT --pp 2 --schedule zbv
same 2 train $GPT --pp 2 --schedule zb-interleaved --chunks 2
same 2 train $GPT --pp 2 --schedule dualpipev
same 2 train $GPT --pp 2 --schedule dualpipe
# data parallelism, ZeRO, parameter servers
same 2 train $MLP --dp 2
same 2 train $GPT --dp 2 --zero 1
same 2 train $GPT --dp 2 --zero 2
same 4 train $MLP --ps 2
same 4 train $MLP --ps 1 --pp 3 --schedule zb-h1
# tensor parallelism (with sequence parallelism), and everything at once
same 2 train $GPT --tp 2 --sequence-parallel
same 8 train $GPT --pp 2 --dp 2 --tp 2
# ties (the embedding and head on ranks 0 and p-1, alone, in a V, with dualpipe's copies); the copies
# and a V with dp and ZeRO
same 2 train $GPT --pp 2 --tie-embeddings
same 2 train $GPT --pp 2 --schedule dualpipev --tie-embeddings
same 2 train $GPT --pp 2 --schedule dualpipe --tie-embeddings
same 4 train $GPT --pp 2 --dp 2 --schedule dualpipe --zero 1
same 4 train $GPT --pp 2 --dp 2 --schedule dualpipev --zero 1
# bf16
same 2 train $GPT --pp 2 --precision bf16
# a user model
if [ -x "$OLD_BYOM" ] && [ -x "$NEW_BYOM" ]; then
  same 2 byom --pp 2 --steps 3 --threads 1
  same 2 byom --tp 2 --sequence-parallel --steps 3 --threads 1
else
  echo "SKIP: examples/byom/train_byom not found beside both binaries ($OLD_BYOM, $NEW_BYOM)"
fi
echo "$pass same, $fails different or failed"
[ $fails = 0 ]
