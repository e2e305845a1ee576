#!/usr/bin/env bash
# tests/runtime/test_offload_memory.sh: --offload optimizer (docs/offload.md),
# its memory, the planner, its files and bad input (test_offload.sh: results).
# - Offloaded state is outside the backend's cap: a GPT that needs 35.8 MiB
#   in one process fails under --device-mem 24M without offload and trains
#   within it with --offload optimizer, measured peak = predicted; at pp 2 and
#   dp 2 --zero 2 each rank's measured peak is within 5% of the prediction.
# - The planner: nothing fits 1 device of 30 MiB, and the message says that
#   offloading would (--offload auto); with --offload auto and room to spare
#   nothing is offloaded; 2 devices of 14 MiB get a plan that offloads, shows
#   the offloaded bytes, and trains under --device-mem 14M with rank 0's peak
#   within 5% of the plan's prediction.
# - --offload params: dp 2 --zero 3 with the optimizer state and parameter
#   shard offloaded: each rank's peak = its prediction and below --zero 3
#   --offload optimizer's by the shard; a plan of 2 devices of 13 MiB
#   (--zero 3 --offload optimizer,params) shows the offloaded bytes and trains
#   under --device-mem 13M at the plan's predicted peak (within 5%).
# - Files: the --offload-dir is empty while training (each file is unlinked
#   once mapped, the mappings exist) and after the job is SIGKILLed.
# - Bad input: a full disk (RLIMIT_FSIZE, and the full-disk test hook), a
#   path that is not a directory, --offload-dir without --offload, an unknown
#   word, --offload params without --zero 3, --ps with --offload
#   fail in one line, nothing left behind.
. "$(dirname "$0")/../lib/harness.sh"
OD="$T/od"

# memory: the cap, and peak = prediction per rank (summary: $5 peak MiB, $NF predicted MiB)
A=(--layers 8 --d-model 128 --heads 4 --seq 64 --batch 8 --microbatches 4 --steps 1 --threads 1)
expect 1 "above the cap of 25165824 (--device-mem)" train "${A[@]}" --device-mem 24M
"$B" train "${A[@]}" --device-mem 24M --offload optimizer --offload-dir "$OD" >"$T/cap.o" 2>&1 &&
  grep -q "peak memory 23.14 MiB (predicted 23.14 MiB" "$T/cap.o" &&
  ok "35.8 MiB of training state under a 24 MiB cap with --offload optimizer: $(grep 'peak memory' "$T/cap.o")" ||
  bad "offloaded run under the cap: $(tail -3 "$T/cap.o")"
for lay in "--pp 2" "--dp 2 --zero 2"; do
  if timeout 120 "$B" launch -n 2 -- "$B" train "${A[@]}" $lay --offload optimizer >"$T/m.log" 2>&1; then
    awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / { n++; r = $5 / $NF; if (r > 1.05 || r < 0.95) bad = bad " rank " $1 ": " $5 " vs " $NF }
      END { if (n != 2 || bad != "") { print "FAIL" bad " (" n " ranks)"; exit 1 } }' "$T/m.log" &&
      ok "$lay --offload optimizer: peak/predicted MiB $(awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / {printf "%s/%s ", $5, $NF}' "$T/m.log")" ||
      bad "$lay: $(grep -A2 '^rank' "$T/m.log" | tr -s ' ' | tr '\n' ';')"
  else bad "$lay memory run: $(tail -3 "$T/m.log")"; fi
done

# the planner: offloading counted, chosen when nothing fits otherwise, suggested when not allowed
# plan_trained PLAN MEM WHAT: the plan trained on 2 ranks under --device-mem MEM, rank 0's peak within 5% of the plan's
plan_trained() {
  timeout 120 "$B" launch -n 2 -- "$B" train --plan "$1" --steps 2 --threads 1 --device-mem "$2" >"$T/pt.log" 2>&1 &&
    awk '/^plan .*rank 0 peak/ { for (i = 1; i <= NF; i++) { if ($i == "peak") m = $(i + 1); if ($i == "predicted" && $(i + 1) + 0 > 0) p = $(i + 1) }
         found = 1 } END { if (!found || m > 1.05 * p || m < 0.95 * p) exit 1 }' "$T/pt.log" &&
    ok "$3 under --device-mem $2: $(grep '^plan .*rank 0 peak' "$T/pt.log" | sed 's/.*; //')" ||
    bad "$3: $(tail -3 "$T/pt.log")"
}
PM="--model gpt --layers 8 --d-model 128 --heads 4 --seq 64 --batch 8"
expect 1 "with the optimizer state offloaded these devices fit (--offload auto)" plan $PM --devices 1 --mem 30M
"$B" plan $PM --devices 2 --mem 64M --offload auto --json "$T/big.json" >/dev/null 2>&1 && ! grep -q '"offload"' "$T/big.json" &&
  ok "--offload auto with room to spare: no offload" || bad "--offload auto with room: $(grep offload "$T/big.json")"
if "$B" plan $PM --devices 2 --mem 14M --offload auto --json "$T/p.json" >"$T/p.o" 2>&1 && grep -q '"offload": "optimizer"' "$T/p.json" &&
   grep -q "optimizer state offloaded (host memory or --offload-dir, outside the budgets above): stage 0" "$T/p.o"; then
  ok "2 devices of 14 MiB: the plan offloads the optimizer state and shows it"
  plan_trained "$T/p.json" 14M "brigade train --plan"
else bad "plan with --offload auto: $(tail -3 "$T/p.o")"; fi

# --offload params: the --zero 3 shard off the device, counted by the executor and the planner
peaks() { awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / { printf "%s/%s ", $5, $NF }' "$1"; }
for o in optimizer optimizer,params; do
  timeout 120 "$B" launch -n 2 -- "$B" train "${A[@]}" --dp 2 --zero 3 --offload $o >"$T/z_$o.log" 2>&1 || bad "--zero 3 --offload $o: $(tail -2 "$T/z_$o.log")"
done
awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / { n++; if ($5 != $NF) bad = 1; p[n] = $5 } END { exit !(n == 2 && !bad) }' "$T/z_optimizer,params.log" &&
  awk -v a="$(awk '/^ +0 +[0-9]+ +[0-9]+ / {print $5}' "$T/z_optimizer.log")" -v b="$(awk '/^ +0 +[0-9]+ +[0-9]+ / {print $5}' "$T/z_optimizer,params.log")" \
    'BEGIN { exit !(a - b > 3.0) }' && # the shard: 1660160 parameters / 2 x 4 bytes = 3.17 MiB
  ok "dp 2 --zero 3 --offload optimizer,params: peak = predicted $(peaks "$T/z_optimizer,params.log")MiB, below offload optimizer's $(peaks "$T/z_optimizer.log")" ||
  bad "--offload params memory: $(peaks "$T/z_optimizer,params.log") vs $(peaks "$T/z_optimizer.log")"
if "$B" plan $PM --devices 2 --mem 13M --zero 3 --pp 1 --tp 1 --offload optimizer,params --json "$T/pz.json" >"$T/pz.o" 2>&1 &&
   grep -q '"offload": "optimizer,params"' "$T/pz.json" && grep -q "optimizer state and parameter shard offloaded" "$T/pz.o"; then
  plan_trained "$T/pz.json" 13M "a plan of --zero 3 --offload optimizer,params trained"
else bad "plan --offload optimizer,params: $(tail -3 "$T/pz.o")"; fi

# files are gone even when the job is killed (unlinked as soon as mapped)
mkdir -p "$T/kd"
"$B" train "${A[@]}" --steps 100000 --offload optimizer --offload-dir "$T/kd" --metrics "$T/k.jsonl" >/dev/null 2>&1 &
kpid=$!
for _ in $(seq 600); do [ -s "$T/k.jsonl" ] && grep -q '"step"' "$T/k.jsonl" && break; sleep 0.1; done
[ -s "$T/k.jsonl" ] || bad "the killed run never stepped"
mapped=$(grep -c "brigade-offload" /proc/$kpid/maps 2>/dev/null)
[ "$(ls -A "$T/kd" | wc -l)" = 0 ] && [ "${mapped:-0}" -gt 0 ] && ok "while training: $mapped mappings of offload files, none left in the directory" ||
  bad "while training: $(ls -A "$T/kd") in the directory, ${mapped:-0} mappings"
kill -KILL $kpid 2>/dev/null; wait $kpid 2>/dev/null
[ "$(ls -A "$T/kd" | wc -l)" = 0 ] && ok "nothing left after SIGKILL" || bad "left after SIGKILL: $(ls -A "$T/kd")"

# bad input, one line each, nothing left behind
S=(--layers 2 --d-model 32 --heads 2 --seq 16 --batch 8 --microbatches 2 --steps 2 --threads 1)
# a per-process file-size limit the transport's shared memory fits in (16 MiB) and a 25 MiB moment does not
( trap '' XFSZ; ulimit -f 16384; exec "$B" train --layers 8 --d-model 256 --heads 4 --seq 16 --batch 8 --microbatches 2 --steps 1 --threads 1 --offload optimizer --offload-dir "$OD" --quiet --save "$T/never" ) >"$T/fs.o" 2>"$T/fs.e"
rc=$?
[ $rc = 1 ] && grep -q "has no room for the optimizer state.*File too large" "$T/fs.e" && [ "$(wc -l <"$T/fs.e")" = 1 ] && [ ! -e "$T/never" ] &&
  ok "a file-size limit (RLIMIT_FSIZE) hit while reserving fails in one line, nothing saved: $(cat "$T/fs.e")" ||
  bad "RLIMIT_FSIZE: rc $rc: $(cat "$T/fs.e")"
export BRIGADE_FAULT_WRITE_BYTES=250000 # the first moment's 168 KiB fit, the second's do not
expect 1 "--offload-dir $OD has no room for the optimizer state (second moment): cannot reserve" train "${S[@]}" --offload optimizer --offload-dir "$OD"
unset BRIGADE_FAULT_WRITE_BYTES
[ "$(ls -A "$OD" | wc -l)" = 0 ] && ok "nothing left in the full directory" || bad "left: $(ls -A "$OD")"
touch "$T/afile"
expect 1 "--offload-dir $T/afile: $T/afile exists and is not a directory" train "${S[@]}" --offload optimizer --offload-dir "$T/afile"
expect 1 "--offload-dir $OD without --offload" train "${S[@]}" --offload-dir "$OD"
expect 2 '--offload must be one of optimizer, activations or params, got "optimiser" (did you mean optimizer?)' train "${S[@]}" --offload optimiser
expect 1 "--offload params needs --zero 3 over dp >= 2 (got --zero 0, dp 1)" train "${S[@]}" --offload optimizer,params
timeout 60 "$B" launch -n 2 -- "$B" train "${S[@]}" --ps 1 --offload optimizer >"$T/ps.o" 2>&1 &&
  bad "--ps with --offload trained" ||
  { grep -q "offload optimizer with --ps: the servers hold the optimizer state" "$T/ps.o" && ok "--ps with --offload refused" ||
    bad "--ps with --offload: $(tail -2 "$T/ps.o")"; }
finish 18
