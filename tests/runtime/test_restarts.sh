#!/usr/bin/env bash
# tests/runtime/test_restarts.sh: fault tolerance end to end. A 2-stage x
# 2-replica job checkpointing every 3 steps runs under
# `brigade launch --max-restarts 5`; a random rank is SIGKILLed at a random
# moment, three times; the launcher restarts the job, which resumes from its
# newest complete checkpoint. The final weights equal an uninterrupted run's.
. "$(dirname "$0")/../lib/harness.sh"
# ranks of an attempt the launcher lost track of: their command lines name $T
at_exit 'pkill -9 -f "$T" 2>/dev/null'
export BRIGADE_TIMEOUT=30
GPT="--model gpt --layers 3 --d-model 32 --heads 2 --seq 32 --batch 8 --microbatches 2 --threads 1 --lr 3e-3 --quiet"
STEPS=1000
timeout 200 "$B" launch -n 4 -- "$B" train $GPT --steps $STEPS --pp 2 --dp 2 --save "$T/ref" >/dev/null 2>&1 || bad "uninterrupted run"

timeout 300 "$B" launch -n 4 --max-restarts 5 -- "$B" train $GPT --steps $STEPS --pp 2 --dp 2 \
  --checkpoint-dir "$T/ckpt" --checkpoint-every 3 --keep 2 --resume --save "$T/out" >"$T/o" 2>"$T/e" &
lpid=$!
kills=0
RANDOM=$$
prev=""
for k in 1 2 3; do
  # wait for the ranks of the current attempt (a set of pids we have not killed from)
  pids=()
  for _ in $(seq 1 100); do
    pids=($(pgrep -f -- "^$B train .*--checkpoint-dir $T/ckpt"))
    [ ${#pids[@]} -eq 4 ] && [ "${pids[*]}" != "$prev" ] && break
    kill -0 $lpid 2>/dev/null || break
    sleep 0.1
  done
  kill -0 $lpid 2>/dev/null || break
  [ ${#pids[@]} -gt 0 ] || continue
  sleep "0.$((2 + RANDOM % 6))"   # a random moment of this attempt
  victim=${pids[$((RANDOM % ${#pids[@]}))]}
  kill -9 "$victim" 2>/dev/null && kills=$((kills + 1))
  prev="${pids[*]}"
done
wait $lpid; rc=$?
[ "$rc" = 0 ] && ok "job finished after $kills kills (exit 0)" || { bad "job exit $rc after $kills kills"; tail -5 "$T/e"; }
[ "$kills" -ge 2 ] && ok "$kills ranks killed" || bad "only $kills kills happened"
n=$(grep -c "restart" "$T/e"); [ "$n" -ge 1 ] && ok "launcher restarted ($n lines)" || bad "no restart reported"
v=$("$B" compare "$T/ref" "$T/out") && ok "final weights equal the uninterrupted run: $v" || bad "weights differ: $v"
finish
