#!/usr/bin/env bash
# tests/runtime/test_tp_save_device.sh: saving the weights and checkpoints of
# tensor-parallel runs on a device backend (docs/offload.md, "The device
# checker"): cpu-async with BRIGADE_DEVICE_CHECK=on reports device buffers and
# refuses any copy whose device-side pointer is not one of its own allocations,
# as a GPU would. The save gathers each shard (bg_param_gather_full) on the
# backend's buffers, where the tensor group's collectives work.
# - train --save with --tp 2 and --tp 2 --sequence-parallel under the checker:
#   the file is byte for byte the cpu backend's (no checker).
# - A checkpoint at step 3 under the checker equals the cpu backend's, and
#   resumed under the checker to step 6 gives the weights of the run that never
#   stopped (--tp 2, --tp 2 --sequence-parallel, and --tp 2 --offload optimizer,
#   whose host-held shards go through a backend buffer to be gathered).
# - Mutation: BRIGADE_FAULT_CKPT_VIA_BACKEND=on (the host-held shards handed to
#   the group's collectives as they are) is refused by the checker, naming the
#   copy, with no checkpoint published.
. "$(dirname "$0")/../lib/harness.sh"
export BRIGADE_TIMEOUT=60
GPT="--model gpt --layers 2 --d-model 24 --heads 2 --seq 16 --batch 8 --microbatches 2 --threads 1 --lr 3e-3 --weight-decay 0.1"
DEV="--backend cpu-async"

# the cpu backend's runs (no checker: host buffers): 6 steps saved, and the step-3 checkpoints
for m in tp sp; do
  a="--tp 2"; [ $m = sp ] && a="--tp 2 --sequence-parallel"
  train_save "cpu_$m" 2 $GPT $a --steps 6
  train_save "cpuc_$m" 2 $GPT $a --steps 3 --checkpoint-dir "$T/cc_$m"
done

# under the checker: train --save, the checkpoint, and its resume
export BRIGADE_DEVICE_CHECK=on
for m in tp sp; do
  a="--tp 2"; [ $m = sp ] && a="--tp 2 --sequence-parallel"
  if train_save "dev_$m" 2 $GPT $a $DEV --steps 6; then
    if cmp -s "$T/cpu_$m/model.safetensors" "$T/dev_$m/model.safetensors"; then
      ok "$a: saved under the checker, the file of the cpu backend byte for byte"
    else bad "$a: the saved file differs from the cpu backend's: $("$B" compare "$T/cpu_$m" "$T/dev_$m")"; fi
  fi
  train_save "s_$m" 2 $GPT $a $DEV --steps 3 --checkpoint-dir "$T/c_$m" || continue
  same "$T/cc_$m/step-00000003" "$T/c_$m/step-00000003" "$a: step-3 checkpoint under the checker = the cpu backend's"
  train_save "r_$m" 2 $GPT $a $DEV --steps 6 --checkpoint-dir "$T/c_$m" --resume || continue
  grep -q "resuming from $T/c_$m/step-00000003 .* at step 3" "$T/r_$m.log" ||
    { bad "$a: did not resume from step 3: $(grep -v WARN "$T/r_$m.log" | head -2)"; continue; }
  same "$T/cpu_$m" "$T/r_$m" "$a: saved at 3 and resumed under the checker = never stopped"
done

# host-held optimizer state: its shards go through a buffer of the backend
OFF="--tp 2 --offload optimizer"
if train_save s_off 2 $GPT $OFF $DEV --steps 3 --checkpoint-dir "$T/c_off"; then
  same "$T/cc_tp/step-00000003" "$T/c_off/step-00000003" "$OFF: step-3 checkpoint under the checker = the cpu backend's without offload"
  train_save r_off 2 $GPT $OFF $DEV --steps 6 --checkpoint-dir "$T/c_off" --resume &&
    same "$T/cpu_tp" "$T/r_off" "$OFF: saved at 3 and resumed under the checker = never stopped"
fi

# mutation: the host-held shards handed to the group's (staged) collectives as they are
if BRIGADE_FAULT_CKPT_VIA_BACKEND=on timeout 120 "$B" launch -n 2 -- "$B" train $GPT $OFF $DEV --steps 3 --quiet \
     --checkpoint-dir "$T/cm" >"$T/m.log" 2>&1; then
  bad "mutation: the host-held shards through the collectives were not caught: $(tail -2 "$T/m.log")"
elif ! grep -q "BRIGADE_DEVICE_CHECK: to_host_async refused: its source 0x[0-9a-f]* ([0-9]* bytes) is not in a live allocation" "$T/m.log"; then
  bad "mutation: failed without the checker's message: $(grep -v WARN "$T/m.log" | tail -3)"
elif [ -e "$T/cm/step-00000003" ]; then bad "mutation: a checkpoint was published"
else ok "mutation caught, nothing published: $(grep -m1 -o 'BRIGADE_DEVICE_CHECK: to_host_async refused[^(]*' "$T/m.log")"; fi

finish 9
