#!/usr/bin/env bash
# tests/runtime/test_offload_device.sh: --offload optimizer on a backend whose
# buffers the host may not address (docs/offload.md, "Device backends"): the
# store's host-held step, forced on cpu-async (its copy stream fills every
# asynchronous copy's destination with NaN until the copy runs, late) by
# BRIGADE_OFFLOAD_STEP=host, the transfers staged as a device's
# (BRIGADE_STAGING=always), under the device checker (BRIGADE_DEVICE_CHECK=on:
# any copy or kernel given a host pointer for a device one fails the run).
# - The weights of no offload on the same backend, bitwise (the same CPU AdamW
#   on the same elements in the same order, on host copies): pp 1, pp 2, dp 2
#   with --zero 1 and --zero 2, SGD at pp 2; the host step ran (its count in
#   the log).
# - Peak = prediction per rank (dp 2 --zero 2), within 5%.
# - Checkpoints: the step-3 checkpoint equals the one without offload; resumed
#   with the host step to the weights of a run that never stopped.
# - Bad input: BRIGADE_OFFLOAD_STEP=bogus (--offload params there:
#   test_offload_params_device.sh).
. "$(dirname "$0")/../lib/harness.sh"
export BRIGADE_STAGING=always BRIGADE_TIMEOUT=60 BRIGADE_DEVICE_CHECK=on
GPT="--backend cpu-async --model gpt --layers 3 --d-model 32 --heads 2 --seq 16 --batch 8 --microbatches 4 --steps 3 --threads 1 --lr 3e-3 --weight-decay 0.1"

# host_steps LOG: the updates the host-held step made (summed over ranks)
host_steps() { sed -nE 's/.*host-held step: ([0-9]+) updates.*/\1/p' "$1" | awk '{ s += $1 } END { print s + 0 }'; }

for lay in "1:--pp 1" "2:--pp 2" "2:--dp 2 --zero 1" "2:--dp 2 --zero 2" "2:--pp 2 --optimizer sgd --lr 0.05"; do
  n=${lay%%:*}; args=${lay#*:}; tag=$(echo "$args" | tr -dc 'a-z0-9')
  train_save "n_$tag" $n $GPT $args || continue
  BRIGADE_OFFLOAD_STEP=host BRIGADE_LOG=info train_save "h_$tag" $n $GPT $args --offload optimizer || continue
  k=$(host_steps "$T/h_$tag.log")
  [ "$k" -gt 0 ] && ok "$args: $k updates on the host" || bad "$args: the host-held step did not run"
  same "$T/n_$tag" "$T/h_$tag" "$args: --offload optimizer, host-held step = none (cpu-async)"
done

# peak = prediction per rank (summary: $5 peak MiB, $NF predicted MiB)
if BRIGADE_OFFLOAD_STEP=host timeout 120 "$B" launch -n 2 -- "$B" train $GPT --dp 2 --zero 2 --offload optimizer >"$T/m.log" 2>&1; then
  awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / { n++; r = $5 / $NF; if (r > 1.05 || r < 0.95) bad = bad " rank " $1 ": " $5 " vs " $NF }
    END { if (n != 2 || bad != "") { print "FAIL" bad " (" n " ranks)"; exit 1 } }' "$T/m.log" &&
    ok "dp 2 --zero 2, host-held step: peak/predicted MiB $(awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / {printf "%s/%s ", $5, $NF}' "$T/m.log")" ||
    bad "peak vs prediction: $(grep -A2 '^rank' "$T/m.log" | tr -s ' ' | tr '\n' ';')"
else bad "memory run: $(tail -3 "$T/m.log")"; fi

# checkpoints
CK="$GPT --pp 2"
G6=${CK/--steps 3/--steps 6}
train_save ck0 2 $CK --checkpoint-dir "$T/c0" &&
  BRIGADE_OFFLOAD_STEP=host train_save ck1 2 $CK --checkpoint-dir "$T/c1" --offload optimizer &&
  same "$T/c0/step-00000003" "$T/c1/step-00000003" "step-3 checkpoints with and without the host-held step, optimizer state included"
train_save full 2 $G6 &&
  BRIGADE_OFFLOAD_STEP=host train_save r_on 2 $G6 --checkpoint-dir "$T/c0" --resume --offload optimizer &&
  same "$T/full" "$T/r_on" "checkpoint resumed with the host-held step"

# bad input
BRIGADE_OFFLOAD_STEP=bogus expect_train 1 "BRIGADE_OFFLOAD_STEP=bogus: expected auto or host" $GPT --offload optimizer

finish 14
