#!/usr/bin/env bash
# tests/examples/test_byom.sh: a model brought by the user (examples/byom:
# its own RMSNorm and SwiGLU layers, brigade's attention blocks, a tied
# embedding/head, its own data callback), trained by the executor on 2 and 3
# pipeline stages with every schedule, gives bitwise the weights of one
# process; data and tensor parallelism (sequence parallelism too) within 1e-5; errors in the user's data stop every
# rank with the message and the step, and nothing is saved.
. "$(dirname "$0")/../lib/harness.sh"
E=${BYOM:?path of train_byom}
ARGS="--steps 8 --layers 2 --d-model 16 --heads 2 --seq 8 --vocab 32 --batch 8 --microbatches 4 --threads 1"

"$E" $ARGS --save "$T/ref" > "$T/ref.log" 2>&1 || { bad "one process"; cat "$T/ref.log"; }
# the loss falls (same run, longer)
"$E" ${ARGS/--steps 8/--steps 40} > "$T/long.log" 2>&1
if awk '/^trained/ { split($0, a, "loss "); split(a[2], b, " -> "); exit !(b[2] < b[1] - 0.3) }' "$T/long.log"; then
  ok "loss falls: $(grep '^trained' "$T/long.log" | sed 's/.*loss //')"
else
  bad "loss does not fall: $(tail -1 "$T/long.log")"
fi

runs=0
run_case() { # RTOL N ARGS...
  local rtol=$1 n=$2; shift 2
  local out="$T/run$((++runs))"
  if ! timeout 120 "$B" launch -n "$n" -- "$E" $ARGS "$@" --save "$out" > "$out.log" 2>&1; then
    bad "launch -n $n train_byom $*"; tail -5 "$out.log"; return
  fi
  if grep -q "live allocations" "$out.log"; then bad "n=$n $*: memory leaked"; return; fi
  local verdict
  case "$rtol" in
    0) verdict=$("$B" compare "$T/ref" "$out") ;;
    l2:*) verdict=$("$B" compare "$T/ref" "$out" --rel-l2 "${rtol#l2:}") ;;
  esac
  if [ $? = 0 ]; then ok "n=$n $* :: $verdict"; else bad "n=$n $* :: $verdict"; fi
}
for s in gpipe 1f1b zb-h1 zb-h2; do
  run_case 0 2 --pp 2 --schedule $s
  run_case 0 3 --pp 3 --schedule $s
done
run_case 0 2 --pp 2 --schedule interleaved --chunks 2
run_case 0 3 --pp 3 --schedule interleaved --chunks 2
run_case 0 2 --pp 2 --schedule zbv
run_case 0 3 --pp 3 --schedule zbv
run_case 0 2 --pp 2 --schedule zb-h1 --recompute
# data parallelism sums gradients in another order: AdamW within 1e-5 relative L2 (as for GPT)
run_case l2:1e-5 2 --dp 2
run_case l2:1e-5 4 --pp 2 --dp 2 --schedule 1f1b
# tensor parallelism: brigade's layers split over 2 ranks, the user's replicated (AdamW: relative L2)
run_case l2:1e-5 2 --tp 2
run_case l2:1e-5 4 --pp 2 --tp 2 --schedule zb-h1
# sequence parallelism: the user's RMSNorm and SwiGLU run on each member's part of the sequence, their
# gradients summed over the tensor group
run_case l2:1e-5 2 --tp 2 --sequence-parallel
run_case l2:1e-5 4 --pp 2 --tp 2 --sequence-parallel --schedule zb-h1

# checkpoints of the user's model by its tensor names: 4 steps on 2 stages,
# then resumed on 3 stages with ZB-V to step 8 = 8 steps of one process
if timeout 120 "$B" launch -n 2 -- "$E" ${ARGS/--steps 8/--steps 4} --pp 2 --checkpoint-dir "$T/ck" \
     --checkpoint-every 4 > "$T/ck1.log" 2>&1 &&
   timeout 120 "$B" launch -n 3 -- "$E" $ARGS --pp 3 --schedule zbv --checkpoint-dir "$T/ck" --resume \
     --save "$T/resumed" > "$T/ck2.log" 2>&1; then
  grep -q "resumed at step 4" "$T/ck2.log" || bad "resume: no 'resumed at step 4'"
  verdict=$("$B" compare "$T/ref" "$T/resumed") && ok "checkpoint at pp 2, resumed at pp 3 zbv :: $verdict" \
    || bad "resumed run differs :: $verdict"
else
  bad "checkpoint/resume runs failed"; tail -3 "$T/ck1.log" "$T/ck2.log"
fi

# errors in the host's data: every rank stops, names the step, nothing saved
fail_case() { # NAME WANT_RANK0 WANT_RANK1 ARGS...
  local name=$1 w0=$2 w1=$3; shift 3
  local out="$T/$name"
  timeout 120 "$B" launch -n 2 -- "$E" $ARGS --pp 2 --save "$out" "$@" > "$out.log" 2>&1
  local rc=$?
  if [ $rc = 0 ] || [ $rc = 124 ]; then bad "$name: exit $rc"; return; fi
  if grep -q "rank 0: .*$w0" "$out.log" && grep -q "rank 1: .*$w1" "$out.log"; then
    ok "$name: both ranks name it"
  else
    bad "$name: messages: $(grep train_byom "$out.log")"
  fi
  if [ -e "$out" ]; then bad "$name: $out was written"; else ok "$name: nothing saved"; fi
}
fail_case callback "step 3, microbatch 0, replica 0: my data loader could not read shard 0" \
  "rank 0 stopped on an error: .*my data loader could not read shard 0" --fail-at-step 3
fail_case target "rank 1 stopped on an error: .*target 0 of 16 is 39, outside the loss layer's classes \[0, 32)" \
  "step 2, microbatch 0, replica 0: target 0 of 16 is 39" --bad-target-at-step 2

finish
