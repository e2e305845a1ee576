#!/usr/bin/env bash
# tests/runtime/test_memory_growth.sh: a long run must not grow. A tiny
# pp = 2 job runs a few thousand steps; each rank's anonymous resident
# memory (RssAnon) is read at two steps after warm-up, and the slope per step
# must stay under a small threshold. (A receive completing inside UCX's
# posting call left its request on the communicator's pending list: about
# 390 bytes per step on every rank that receives.)
# Usage: BRIGADE=build/brigade test_memory_growth.sh [FROM TO MAX_BYTES_PER_STEP]
. "$(dirname "$0")/../lib/harness.sh"
FROM=${1:-2000}; TO=${2:-12000}; MAX=${3:-24}
D=$(cd "$(dirname "$0")/../.." && pwd)
export BRIGADE_TIMEOUT=60
# the loop runs to TO + a margin; the measurement needs only the two samples
timeout 120 "$B" launch -n 2 -- "$B" train --pp 2 --layers 1 --d-model 8 --heads 2 --seq 8 --batch 4 \
    --microbatches 2 --steps $((TO + 2000)) --threads 1 --quiet --data "$D/data/kjv.txt" \
    --metrics "$T/m.jsonl" >"$T/out" 2>&1 &
lpid=$!
rank_pid() { # the launcher's child with BRIGADE_RANK=$1
  for p in $(pgrep -P "$lpid" 2>/dev/null) $(for q in $(pgrep -P "$lpid" 2>/dev/null); do pgrep -P "$q"; done); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "BRIGADE_RANK=$1" && { echo "$p"; return; }
  done
}
last_step() { grep '"rank": 0,' "$T/m.jsonl" 2>/dev/null | tail -1 | sed 's/.*"step": \([0-9]*\).*/\1/'; }
rss() { awk '/^RssAnon:/ {print $2 * 1024}' "/proc/$1/status" 2>/dev/null; }
wait_step() { # until rank 0 has done $1 steps (or 100 s)
  local i=0 s
  while [ $i -lt 2000 ]; do
    s=$(last_step); [ -n "$s" ] && [ "$s" -ge "$1" ] && { echo "$s"; return 0; }
    kill -0 "$lpid" 2>/dev/null || return 1
    sleep 0.05; i=$((i + 1))
  done
  return 1
}
s1=$(wait_step "$FROM") || { echo "FAIL: the job did not reach step $FROM"; cat "$T/out"; exit 1; }
p0=$(rank_pid 0); p1=$(rank_pid 1)
[ -n "$p0" ] && [ -n "$p1" ] || { echo "FAIL: rank processes not found"; exit 1; }
a0=$(rss "$p0"); a1=$(rss "$p1"); s1=$(last_step)
s2=$(wait_step "$TO") || { echo "FAIL: the job did not reach step $TO"; cat "$T/out"; exit 1; }
b0=$(rss "$p0"); b1=$(rss "$p1"); s2=$(last_step)
wait "$lpid"; rc=$?
[ "$rc" = 0 ] || { echo "FAIL: the job exited $rc"; cat "$T/out"; exit 1; }
for r in 0 1; do
  if [ $r = 0 ]; then a=$a0; b=$b0; else a=$a1; b=$b1; fi
  slope=$(awk -v a="$a" -v b="$b" -v s1="$s1" -v s2="$s2" 'BEGIN { printf "%.1f", (b - a) / (s2 - s1) }')
  line="rank $r: RssAnon $a -> $b bytes over steps $s1 -> $s2: $slope bytes/step (limit $MAX)"
  if awk -v x="$slope" -v m="$MAX" 'BEGIN { exit !(x <= m) }'; then ok "$line"; else bad "$line"; fi
done
finish
