#!/usr/bin/env bash
# tests/runtime/test_staging.sh: transfers staged through host memory (the
# path of device buffers, forced on the CPU backend by BRIGADE_STAGING=always,
# with 1 KiB chunks so that messages split into several) give bitwise the
# weights of the direct path at pp = 2, dp = 2, pp = 2 x dp = 2 and with tied
# embeddings across ranks; the info log proves the staged path ran.
set -u
B=${BRIGADE:?path of the brigade binary}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export BRIGADE_TIMEOUT=60
pass=0; fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

GPT="--model gpt --layers 4 --d-model 24 --heads 2 --seq 16 --batch 8 --steps 6 --threads 1 --lr 3e-3 --microbatches 4"

# run NAME N STAGING ARGS...
run() {
  local name=$1 n=$2 mode=$3; shift 3
  if ! BRIGADE_STAGING=$mode BRIGADE_STAGE_CHUNK_KB=1 BRIGADE_LOG=info timeout 120 \
       "$B" launch -n "$n" -- "$B" train "$@" --quiet --save "$T/$name" >"$T/$name.log" 2>&1; then
    bad "$name: launch -n $n train $* (BRIGADE_STAGING=$mode)"; grep -v WARN "$T/$name.log" | tail -5; return 1
  fi
}

# case NAME N ARGS...: staged vs direct, same ranks and arguments
case_() {
  local name=$1 n=$2; shift 2
  run "$name.direct" "$n" auto "$@" || return
  run "$name.staged" "$n" always "$@" || return
  if grep -q "staged [1-9]" "$T/$name.direct.log"; then bad "$name: the direct run staged"; return; fi
  # more chunks than transfers: messages were split
  local line
  line=$(grep -m1 "staged [1-9][0-9]* transfers" "$T/$name.staged.log")
  if [ -z "$line" ]; then bad "$name: no staged transfers logged"; return; fi
  local nt nc
  nt=$(sed -E 's/.*staged ([0-9]+) transfers \(([0-9]+) chunks.*/\1/' <<<"$line")
  nc=$(sed -E 's/.*staged ([0-9]+) transfers \(([0-9]+) chunks.*/\2/' <<<"$line")
  if [ "$nc" -le "$nt" ] && [ "$name" != dp2 ]; then bad "$name: $nc chunks for $nt transfers: nothing was split"; return; fi
  local verdict
  if verdict=$("$B" compare "$T/$name.direct" "$T/$name.staged"); then
    pass=$((pass + 1)); echo "ok   $name :: $line :: $verdict"
  else
    bad "$name :: $verdict"
  fi
}

case_ pp2 2 $GPT --pp 2 --schedule 1f1b
case_ dp2 2 $GPT --dp 2
case_ pp2dp2 4 $GPT --pp 2 --dp 2 --schedule zb-h1
case_ pp2tie 2 $GPT --pp 2 --schedule 1f1b --tie-embeddings

# the staged path against one process too (bitwise for pp, as the direct path)
if "$B" train $GPT --quiet --save "$T/one" >"$T/one.log" 2>&1 && v=$("$B" compare "$T/one" "$T/pp2.staged"); then
  pass=$((pass + 1)); echo "ok   pp2 staged vs one process :: $v"
else
  bad "pp2 staged vs one process: ${v:-reference failed}"
fi

# bad input: one clear line, non-zero exit
out=$(BRIGADE_STAGING=sometimes "$B" train $GPT --steps 1 --quiet 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q 'BRIGADE_STAGING="sometimes"' <<<"$out"; then pass=$((pass + 1)); else bad "BRIGADE_STAGING=sometimes: rc $rc: $out"; fi

echo "passed $pass, failed $fails"
[ "$fails" = 0 ] && [ "$pass" -ge 6 ]
