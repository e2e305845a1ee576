#!/usr/bin/env bash
# tests/runtime/test_offload_params_device.sh: --offload optimizer,params
# (dp 2 --zero 3) on a backend whose buffers the host may not address
# (docs/offload.md, "Device backends"), forced on cpu-async by
# BRIGADE_OFFLOAD_STEP=host, under the device checker (BRIGADE_DEVICE_CHECK=on:
# any copy or kernel given a host pointer for a device one fails the run).
# cpu-async's copy stream fills every asynchronous copy's destination with NaN
# until the copy runs, late, so a gather that does not wait for its shard's
# upload gathers NaN. The gathers read the buffers themselves
# (BRIGADE_STAGING=direct, as NCCL or a CUDA-aware UCX would; staged, the
# gather's copy out follows the upload on the one copy stream).
# - The weights of --zero 3 without offload on the same backend, bitwise: pp 1
#   (transfers direct, staged, and the shard in --offload-dir files), pp 2,
#   SGD, two buckets prefetched; the updates ran on the host-held shard in
#   place (their count in the log).
# - Mutation: BRIGADE_FAULT_UPLOAD_NOWAIT=on (the compute stream does not wait
#   for the uploads) gives weights the comparison rejects, with one and with
#   two buckets prefetched.
# - Peak = prediction per rank, within 5%.
# - Checkpoints: the step-3 checkpoint equals the one without offload; resumed
#   across offload on and off to the weights of a run that never stopped.
# - Bad input: --offload params without optimizer there.
. "$(dirname "$0")/../lib/harness.sh"
export BRIGADE_TIMEOUT=60 BRIGADE_OFFLOAD_STEP=host BRIGADE_DEVICE_CHECK=on BRIGADE_STAGING=direct
GPT="--backend cpu-async --model gpt --layers 3 --d-model 32 --heads 2 --seq 16 --batch 8 --microbatches 4 --steps 3 --threads 1 --lr 3e-3 --weight-decay 0.1 --dp 2 --zero 3"
OFF="--offload optimizer,params"

# in_place LOG: the updates made in place on the host-held shard (summed over ranks)
in_place() { sed -nE 's/.*host-held step: [0-9]+ updates on the host, ([0-9]+) of them in place.*/\1/p' "$1" | awk '{ s += $1 } END { print s + 0 }'; }

# none (BRIGADE_OFFLOAD_STEP has no effect without --offload) against offloaded
for lay in "2:" "4:--pp 2" "2:--optimizer sgd --lr 0.05"; do
  n=${lay%%:*}; args=${lay#*:}; tag=x$(echo "$args" | tr -dc 'a-z0-9')
  train_save "n_$tag" $n $GPT $args || continue
  BRIGADE_LOG=info train_save "h_$tag" $n $GPT $args $OFF || continue
  k=$(in_place "$T/h_$tag.log")
  [ "$k" -gt 0 ] && ok "dp 2 --zero 3 $args: $k updates in place on the host-held shard" ||
    bad "dp 2 --zero 3 $args: no update ran on the host-held shard"
  same "$T/n_$tag" "$T/h_$tag" "dp 2 --zero 3 $args: $OFF, host-held shard = none (cpu-async)"
done
# two buckets prefetched (6 layers: three gather buffers fit): the furthest one's upload a layer ahead of its gather
P2=${GPT/--layers 3/--layers 6}
BRIGADE_ZERO_PREFETCH=2 train_save n_p2 2 $P2 && BRIGADE_ZERO_PREFETCH=2 train_save h_p2 2 $P2 $OFF &&
  same "$T/n_p2" "$T/h_p2" "BRIGADE_ZERO_PREFETCH=2, 6 layers: $OFF = none"
BRIGADE_STAGING=always train_save h_staged 2 $GPT $OFF &&
  same "$T/n_x" "$T/h_staged" "staged transfers: $OFF = none"
mkdir -p "$T/od"
train_save h_files 2 $GPT $OFF --offload-dir "$T/od" &&
  same "$T/n_x" "$T/h_files" "$OFF --offload-dir: = none"

# mutation: without the compute stream's wait for the upload the result is wrong, and compare says so
# (transfers direct: a gather reads the pool buffer at once, NaN until the late upload lands)
for mc in "1:n_x:$GPT" "2:n_p2:$P2"; do
  pf=${mc%%:*}; rest=${mc#*:}; ref=${rest%%:*}; args=${rest#*:}
  if BRIGADE_ZERO_PREFETCH=$pf BRIGADE_FAULT_UPLOAD_NOWAIT=on timeout 120 "$B" launch -n 2 -- "$B" train $args $OFF \
       --quiet --save "$T/mut$pf" >"$T/mut$pf.log" 2>&1; then
    if v=$("$B" compare "$T/$ref" "$T/mut$pf"); then
      bad "prefetch $pf: the gathers did not wait for the uploads and the weights still agree: $v"
    else ok "prefetch $pf: mutation caught (no wait for the uploads): $(echo "$v" | tail -1)"; fi
  else ok "prefetch $pf: mutation caught (no wait for the uploads): the run failed: $(grep -v WARN "$T/mut$pf.log" | tail -1)"; fi
done

# peak = prediction per rank (summary: $5 peak MiB, $NF predicted MiB)
if timeout 120 "$B" launch -n 2 -- "$B" train $GPT $OFF >"$T/m.log" 2>&1; then
  awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / { n++; r = $5 / $NF; if (r > 1.05 || r < 0.95) bad = bad " rank " $1 ": " $5 " vs " $NF }
    END { if (n != 2 || bad != "") { print "FAIL" bad " (" n " ranks)"; exit 1 } }' "$T/m.log" &&
    ok "$OFF, host-held shard: peak/predicted MiB $(awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / {printf "%s/%s ", $5, $NF}' "$T/m.log")" ||
    bad "peak vs prediction: $(grep -A2 '^rank' "$T/m.log" | tr -s ' ' | tr '\n' ';')"
else bad "memory run: $(tail -3 "$T/m.log")"; fi

# checkpoints
G6=${GPT/--steps 3/--steps 6}
train_save ck0 2 $GPT --checkpoint-dir "$T/c0" &&
  train_save ck1 2 $GPT --checkpoint-dir "$T/c1" $OFF &&
  same "$T/c0/step-00000003" "$T/c1/step-00000003" "step-3 checkpoints with and without $OFF, optimizer state included"
train_save full 2 $G6 &&
  train_save r_on 2 $G6 --checkpoint-dir "$T/c0" --resume $OFF &&
  same "$T/full" "$T/r_on" "checkpoint of no offload resumed with $OFF"
train_save r_off 2 $G6 --checkpoint-dir "$T/c1" --resume &&
  same "$T/full" "$T/r_off" "checkpoint of $OFF resumed without offload"

# bad input
if timeout 60 "$B" launch -n 2 -- "$B" train ${GPT/--steps 3/--steps 1} --offload params >"$T/p.o" 2>"$T/p.e"; then
  bad "--offload params without optimizer with the host-held step trained"
elif grep -q "^step " "$T/p.o"; then bad "--offload params without optimizer: a step ran: $(head -2 "$T/p.o")"
elif grep -qF -- "--offload params without optimizer on backend cpu-async" "$T/p.e"; then
  ok "--offload params without optimizer refused: $(grep -m1 -F -- "--offload params" "$T/p.e")"
else bad "--offload params without optimizer: $(tail -3 "$T/p.e")"; fi

finish 16
