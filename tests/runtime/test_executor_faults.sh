#!/usr/bin/env bash
# tests/runtime/test_executor_faults.sh: a rank that dies mid-step makes every
# other rank stop with an error naming it within the transport's deadline;
# bad layouts fail on every rank with the same message before training.
. "$(dirname "$0")/../lib/harness.sh"
pids=()
at_exit 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done'

GPT="--model gpt --layers 4 --d-model 32 --heads 2 --seq 32 --batch 8 --microbatches 4 --steps 100000 --threads 1 --quiet"
port=$((20000 + RANDOM % 20000))
# three ranks started by hand (no launcher to clean up after the victim)
for r in 0 1 2; do
  BRIGADE_RANK=$r BRIGADE_WORLD_SIZE=3 BRIGADE_MASTER_PORT=$port BRIGADE_TIMEOUT=10 BRIGADE_JOB_TOKEN=t$port \
    "$B" train $GPT --pp 3 --metrics "$T/m$r.jsonl" >"$T/r$r.out" 2>"$T/r$r.err" &
  pids+=($!)
done
# mid-step: once every rank has finished a step (not at a fixed time: under
# load the ranks may still be connecting after seconds)
for _ in $(seq 1 600); do
  n=0; for r in 0 1 2; do [ -s "$T/m$r.jsonl" ] && n=$((n + 1)); done
  [ $n = 3 ] && break; sleep 0.1
done
[ $n = 3 ] || bad "the ranks did not finish a step within 60 s"
sleep 0.3
kill -9 "${pids[1]}"
t0=$(date +%s)
for r in 0 2; do
  # each survivor must exit by itself, non-zero, within the deadline (10 s) plus slack
  for _ in $(seq 1 150); do kill -0 "${pids[$r]}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${pids[$r]}" 2>/dev/null; then bad "rank $r still running 15 s after rank 1 died"; continue; fi
  wait "${pids[$r]}"; rc=$?
  [ "$rc" != 0 ] && ok "rank $r exited with $rc" || bad "rank $r exited 0 after its peer died"
  grep -q "rank 1" "$T/r$r.err" && ok "rank $r names rank 1: $(grep -m1 'rank 1' "$T/r$r.err" | cut -c1-160)" \
    || { bad "rank $r's error does not name rank 1"; cat "$T/r$r.err"; }
done
echo "survivors stopped within $(( $(date +%s) - t0 )) s"

# bad layouts: every rank prints the same message and exits non-zero
expect_all() {
  local pat=$1 n=$2; shift 2
  if timeout 60 "$B" launch -n "$n" --tag-output -- "$B" train "$@" >"$T/o" 2>"$T/e"; then bad "launch -n $n train $* succeeded"; return; fi
  local cnt; cnt=$(grep -c -- "$pat" "$T/e")
  [ "$cnt" -ge 1 ] && ok "$pat ($cnt ranks)" || { bad "no '$pat' for train $*"; cat "$T/e"; }
}
SMALL="--layers 2 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 2 --steps 1 --threads 1"
expect_all "pp 2 x dp 2 = 4 ranks, but the job has 2" 2 $SMALL --pp 2 --dp 2
expect_all "pipeline stages but the model has only 5 layers" 2 $SMALL --pp 2 --chunks 3 --schedule interleaved
expect_all '--schedule must be one of gpipe, 1f1b, interleaved, zb-h1, zb-h2, zbv, zb-interleaved, dualpipev or dualpipe, got "nosuch"' 2 $SMALL --pp 2 --schedule nosuch
expect_all "split sums to 4 layers but the model has 5" 2 $SMALL --pp 2 --split 2,2
# single process: the same checks without a launcher
if "$B" train $SMALL --pp 2 >"$T/o" 2>"$T/e"; then bad "--pp 2 in a world of one succeeded"; else
  grep -q "brigade launch -n 2" "$T/e" && ok "single process --pp 2 says how to launch" || { bad "no launch hint"; cat "$T/e"; }
fi

finish
