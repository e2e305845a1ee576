#!/usr/bin/env bash
# tests/runtime/test_offload_ckpt_device.sh: checkpoints of host-held optimizer
# state on a device backend (docs/offload.md, "Checkpoints"), under the device
# checker: cpu-async with BRIGADE_DEVICE_CHECK=on reports device buffers (so
# the host-held step, staging and every device-only path run) and refuses any
# copy or kernel whose device-side pointer is not one of its own allocations.
# - Saved at step 3 and resumed to step 6: bitwise the weights of a run of 6
#   steps that never stopped, with --offload optimizer at dp 1, dp 2 --zero 1,
#   dp 2 --zero 2, and --zero 3 --offload optimizer,params (dp 2).
# - Across offload: a checkpoint of --offload optimizer resumed without it, and
#   one without resumed with it (dp 2 --zero 2; --zero 3 with params resumed at --zero 2), to the
#   weights of the run that never stopped (no offload: the same bits).
# - Mutation: BRIGADE_FAULT_CKPT_VIA_BACKEND=on (the save copies the host-held
#   state through the backend, as before this was built) fails under the checker
#   naming the refused copy, and passes unnoticed without it.
# - Bad input: BRIGADE_DEVICE_CHECK=bogus.
. "$(dirname "$0")/../lib/harness.sh"
export BRIGADE_TIMEOUT=60 BRIGADE_DEVICE_CHECK=on
GPT="--backend cpu-async --model gpt --layers 3 --d-model 32 --heads 2 --seq 16 --batch 8 --microbatches 4 --threads 1 --lr 3e-3 --weight-decay 0.1"

# resume_case TAG N REF SAVE_ARGS RESUME_ARGS WHAT: 3 steps with SAVE_ARGS checkpointed, resumed from that
# step-3 checkpoint to step 6 with RESUME_ARGS, the weights bitwise $T/REF (6 steps that never stopped)
resume_case() {
  local tag=$1 n=$2 ref=$3 save=$4 res=$5 what=$6
  train_save "s_$tag" "$n" $GPT --steps 3 $save --checkpoint-dir "$T/c_$tag" || return
  [ -d "$T/c_$tag/step-00000003" ] || { bad "$what: no step-3 checkpoint"; return; }
  train_save "r_$tag" "$n" $GPT --steps 6 $res --checkpoint-dir "$T/c_$tag" --resume || return
  grep -q "resuming from $T/c_$tag/step-00000003 .* at step 3" "$T/r_$tag.log" ||
    { bad "$what: did not resume from step 3: $(grep -v WARN "$T/r_$tag.log" | head -2)"; return; }
  same "$T/$ref" "$T/r_$tag" "$what"
}

# the runs that never stopped (no offload and offload give the same bits: test_offload_device.sh)
train_save f1 1 $GPT --steps 6 --offload optimizer
train_save f1z 2 $GPT --steps 6 --dp 2 --zero 1
train_save f2 2 $GPT --steps 6 --dp 2 --zero 2
train_save f3 2 $GPT --steps 6 --dp 2 --zero 3
same "$T/f2" "$T/f3" "reference: dp 2 --zero 2 = --zero 3"

resume_case a 1 f1 "--offload optimizer" "--offload optimizer" "dp 1 --offload optimizer: saved at 3, resumed = never stopped"
resume_case b 2 f1z "--dp 2 --zero 1 --offload optimizer" "--dp 2 --zero 1 --offload optimizer" \
  "dp 2 --zero 1 --offload optimizer: saved at 3, resumed = never stopped"
resume_case c 2 f2 "--dp 2 --zero 2 --offload optimizer" "--dp 2 --zero 2 --offload optimizer" \
  "dp 2 --zero 2 --offload optimizer: saved at 3, resumed = never stopped"
resume_case d 2 f3 "--dp 2 --zero 3 --offload optimizer,params" "--dp 2 --zero 3 --offload optimizer,params" \
  "dp 2 --zero 3 --offload optimizer,params: saved at 3, resumed = never stopped"
resume_case e 2 f2 "--dp 2 --zero 2 --offload optimizer" "--dp 2 --zero 2" \
  "dp 2 --zero 2: saved with --offload optimizer, resumed without = never stopped"
resume_case f 2 f2 "--dp 2 --zero 2" "--dp 2 --zero 2 --offload optimizer" \
  "dp 2 --zero 2: saved without offload, resumed with --offload optimizer = never stopped"
resume_case g 2 f3 "--dp 2 --zero 3 --offload optimizer,params" "--dp 2 --zero 2" \
  "saved under --zero 3 --offload optimizer,params, resumed under --zero 2 without offload = never stopped"
# the checkpoints themselves: with and without offload, optimizer state included, bitwise
same "$T/c_c/step-00000003" "$T/c_f/step-00000003" "step-3 checkpoints of dp 2 --zero 2 with and without --offload optimizer"

# mutation: the save through the backend's copies is refused by the checker, naming the op
if BRIGADE_FAULT_CKPT_VIA_BACKEND=on timeout 60 "$B" train $GPT --steps 3 --offload optimizer --quiet \
     --checkpoint-dir "$T/cm" >"$T/m.o" 2>"$T/m.e"; then
  bad "mutation: the save through the backend's copies was not caught: $(tail -2 "$T/m.e")"
elif grep -q "BRIGADE_DEVICE_CHECK: to_host refused: its source 0x[0-9a-f]* ([0-9]* bytes) is not in a live allocation" "$T/m.e"; then
  ok "mutation caught: $(grep -m1 -o 'BRIGADE_DEVICE_CHECK: to_host refused[^(]*' "$T/m.e")"
else bad "mutation: failed without the checker's message: $(tail -3 "$T/m.e")"; fi
# ... and without the checker the same mutation goes unnoticed (cpu-async's copies are memcpy)
if BRIGADE_DEVICE_CHECK=off BRIGADE_OFFLOAD_STEP=host BRIGADE_FAULT_CKPT_VIA_BACKEND=on timeout 60 "$B" train $GPT \
     --steps 3 --offload optimizer --quiet --checkpoint-dir "$T/cn" >"$T/n.o" 2>"$T/n.e"; then
  ok "without the checker the mutation passes unnoticed (the checker is what catches it)"
else bad "the mutation failed without the checker: $(tail -3 "$T/n.e")"; fi

# bad input
BRIGADE_DEVICE_CHECK=bogus expect_train 1 "BRIGADE_DEVICE_CHECK=bogus: expected on or off" $GPT --steps 1

finish 12
