#!/usr/bin/env bash
# tests/runtime/test_rank_output.sh: a parallel run's per-rank figures come
# out once, from rank 0, as one table in rank order; an error every rank finds
# (a bad data file, an unwritable --save) is printed once, by the lowest rank,
# the others saying at most "stopped because rank 0 failed".
. "$(dirname "$0")/../lib/harness.sh"
SMALL="--model gpt --layers 3 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 2 --steps 2 --threads 1"

if timeout 120 "$B" launch -n 4 --tag-output -- "$B" train $SMALL --pp 2 --dp 2 >"$T/o" 2>"$T/e"; then
  rows=$(grep -E '^\[rank [0-9]+\] +[0-9]+ +[0-9]+ +[0-9]+ ' "$T/e")
  from=$(echo "$rows" | sed -E 's/^\[rank ([0-9]+)\].*/\1/' | sort -u | tr '\n' ' ')
  order=$(echo "$rows" | awk '{print $3 "/" $4 "/" $5}' | tr '\n' ' ')
  if [ "$(grep -c 'rank  pp  dp' "$T/e")" = 1 ] && [ "$from" = "0 " ] && [ "$order" = "0/0/0 1/0/1 2/1/0 3/1/1 " ]; then
    ok "one table from rank 0, rows in rank order: $order"
  else
    bad "rank table: from ranks '$from', rows '$order'"; cat "$T/e"
  fi
else
  bad "pp 2 x dp 2 run failed"; tail -5 "$T/e"
fi

# once: the message MSG appears exactly once, the other ranks name rank 0
once() {
  local msg=$1 n=$2; shift 2
  if timeout 120 "$B" launch -n "$n" --tag-output -- "$B" train $SMALL "$@" >"$T/o" 2>"$T/e"; then
    bad "train $* succeeded"; return
  fi
  local cnt peers
  cnt=$(grep -c -- "$msg" "$T/e"); peers=$(grep -c "stopped because rank 0 failed" "$T/e")
  if [ "$cnt" = 1 ] && grep -q "^\[rank 0\] .*$msg" "$T/e" && [ "$peers" -le $((n - 1)) ]; then
    ok "$msg: once (rank 0), $peers peer line(s)"
  else
    bad "$msg: $cnt times"; cat "$T/e"
  fi
}
once "cannot open data file $T/none" 2 --pp 2 --data "$T/none"
once "cannot open data file $T/none" 4 --pp 2 --dp 2 --data "$T/none"
mkdir -p "$T/ro" && chmod 500 "$T/ro"
if [ "$(id -u)" != 0 ]; then once "$T/ro/out" 2 --pp 2 --save "$T/ro/out"; fi
finish
