#!/usr/bin/env bash
# tests/runtime/test_offload_act.sh: --offload activations (docs/offload.md).
# - The weights of no offload, bitwise (the stash's bytes go to host memory and
#   come back unchanged before its backward): pp 1 (one stage, the last: nothing
#   moves), pp 2 with 1F1B, ZB-H1 and interleaved, each at
#   BRIGADE_OFFLOAD_ACT_AHEAD 1 and at the default 0; with --offload optimizer too; with
#   --recompute (nothing to move).
# - Each rank's measured peak is exactly its prediction (--metrics: the
#   allocator's peak_bytes = predicted_bytes, the replay counting each stash off
#   the device between the points where the strategy moves it), in every
#   offloaded run; and (the summary's "peak MiB") below that of the same run
#   without offload where stashes wait for their backward: rank 0 of 1F1B and
#   ZB-H1 at ahead 0, both ranks of interleaved; never above it.
# - The prediction as a cap: 1F1B at ahead 0 trains under --device-mem equal to
#   its predicted peak and fails a byte below it.
# - --offload-dir: the host buffers are the offload store's files: the same
#   weights and peaks, the directory empty after the run; a full disk (the
#   full-disk hook) fails before the first step naming the directory and the
#   buffer, writing no weights.
# - Bad input: BRIGADE_OFFLOAD_ACT_AHEAD out of range fails in one line.
. "$(dirname "$0")/../lib/harness.sh"
GPT="--model gpt --layers 4 --d-model 64 --heads 2 --seq 32 --batch 8 --microbatches 4 --steps 2 --threads 1 --lr 3e-3"
# peak MiB per rank of a run's summary ($5), one line
peaks() { awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / { printf "%s ", $5 }' "$1"; }
# lower NONE OFF RANKS: every rank's peak in OFF <= NONE's, strictly below NONE's for the ranks listed
lower() {
  awk -v ranks=" $3 " 'FNR == NR && /^ +[0-9]+ +[0-9]+ +[0-9]+ / { n[$1] = $5; next }
    /^ +[0-9]+ +[0-9]+ +[0-9]+ / { k++; if ($5 + 0 > n[$1] + 0 || (index(ranks, " " $1 " ") && $5 + 0 >= n[$1] + 0)) bad = 1 }
    END { exit !(k > 0 && !bad) }' "$1" "$2"
}
# exact NAME RANKS WHAT: run NAME's metrics have RANKS ranks at the last step, each with peak_bytes = predicted_bytes
exact() {
  local line
  line=$(sed -n 's/.*"rank": \([0-9]*\), "step": 2,.*"peak_bytes": \([0-9]*\), "predicted_bytes": \([0-9]*\).*/\1:\2:\3/p' "$T/$1.jsonl" | sort | tr '\n' ' ')
  if [ "$(echo "$line" | wc -w)" = "$2" ] && echo "$line" | tr ' ' '\n' | awk -F: 'NF == 3 && $2 != $3 { bad = 1 } END { exit bad }'; then
    ok "$3: peak = predicted per rank (rank:peak:predicted bytes) $line"
  else
    bad "$3: peak != predicted per rank (rank:peak:predicted bytes) $line"
  fi
}
# offl NAME N ARGS...: train_save with --offload activations and its metrics
offl() { local name=$1 n=$2; shift 2; train_save "$name" "$n" $GPT "$@" --offload activations --metrics "$T/$name.jsonl"; }

for lay in "1:--pp 1::" "2:--pp 2:0:0" "2:--pp 2 --schedule zb-h1:0:0" "2:--pp 2 --schedule interleaved --chunks 2:1:0 1"; do
  IFS=: read -r n args ahead ranks <<<"$lay"
  tag=$(echo "$args" | tr -dc 'a-z0-9')
  train_save "n_$tag" $n $GPT $args || continue
  BRIGADE_OFFLOAD_ACT_AHEAD=1 offl "a_$tag" $n $args &&
    same "$T/n_$tag" "$T/a_$tag" "$args: --offload activations, BRIGADE_OFFLOAD_ACT_AHEAD=1 = none" &&
    exact "a_$tag" $n "$args"
  [ $n = 1 ] && continue
  offl "a0_$tag" $n $args &&
    same "$T/n_$tag" "$T/a0_$tag" "$args: --offload activations (ahead 0, the default) = none" &&
    exact "a0_$tag" $n "$args, ahead 0"
  [ "$ahead" = 0 ] && run="a0_$tag" || run="a_$tag"
  lower "$T/n_$tag.log" "$T/$run.log" "$ranks" &&
    ok "$args: peak MiB per rank $(peaks "$T/$run.log")(ahead $ahead) < $(peaks "$T/n_$tag.log")without offload (ranks $ranks)" ||
    bad "$args: peak MiB per rank $(peaks "$T/$run.log")with offload vs $(peaks "$T/n_$tag.log")without"
done
# the prediction as a cap: 1F1B at ahead 0 fits under --device-mem = its largest predicted peak, not a byte below
cap=$(sed -n 's/.*"step": 2,.*"predicted_bytes": \([0-9]*\).*/\1/p' "$T/a0_pp2.jsonl" | sort -n | tail -1)
if [ -n "$cap" ]; then
  BRIGADE_OFFLOAD_ACT_AHEAD=0 train_save c_pp2 2 $GPT --pp 2 --offload activations --device-mem "$cap" &&
    ok "--pp 2, ahead 0: trains under --device-mem $cap (the predicted peak)"
  BRIGADE_OFFLOAD_ACT_AHEAD=0 timeout 60 "$B" launch -n 2 -- "$B" train $GPT --pp 2 --offload activations \
    --device-mem $((cap - 1)) --quiet >"$T/c1.o" 2>"$T/c1.e"
  rc=$?
  [ $rc = 1 ] && grep -q "above the cap of $((cap - 1)) (--device-mem)" "$T/c1.e" &&
    ok "--pp 2, ahead 0: --device-mem $((cap - 1)) fails: $(grep -o 'would make [0-9]*, above the cap of [0-9]*' "$T/c1.e" | head -1)" ||
    bad "--pp 2, ahead 0: --device-mem $((cap - 1)): exit $rc: $(tail -3 "$T/c1.e")"
else
  bad "--pp 2, ahead 0: no predicted peak in $T/a0_pp2.jsonl"
fi
train_save o_pp2 2 $GPT --pp 2 --offload optimizer,activations &&
  same "$T/n_pp2" "$T/o_pp2" "--pp 2 --offload optimizer,activations = none"
train_save rn_pp2 2 $GPT --pp 2 --recompute && offl ra_pp2 2 --pp 2 --recompute &&
  same "$T/rn_pp2" "$T/ra_pp2" "--pp 2 --recompute --offload activations = --recompute" &&
  exact ra_pp2 2 "--pp 2 --recompute"

# the host buffers in files: the same weights and peaks, nothing left in the directory
OD="$T/od"
I="--pp 2 --schedule interleaved --chunks 2"
offl d_int 2 $I --offload-dir "$OD" && same "$T/n_$(echo "$I" | tr -dc 'a-z0-9')" "$T/d_int" "$I --offload-dir: = none" &&
  exact d_int 2 "$I --offload-dir" &&
  check "--offload-dir holds nothing after the run" [ -z "$(ls -A "$OD")" ]
# a full disk: the first buffer that does not fit fails before the first step, naming the directory; no weights
BRIGADE_FAULT_WRITE_BYTES=1000000 timeout 60 "$B" launch -n 2 -- "$B" train $GPT --pp 2 --offload activations \
  --offload-dir "$OD" --quiet --save "$T/never" >"$T/fd.o" 2>"$T/fd.e"
rc=$?
[ $rc = 1 ] && grep -q "^brigade train: I/O error: --offload-dir $OD has no room for the offloaded activations (stage 0, microbatch [0-9]*): cannot reserve" "$T/fd.e" &&
  [ ! -e "$T/never" ] && [ -z "$(ls -A "$OD")" ] &&
  ok "full --offload-dir: exit 1, $(grep -o 'has no room for the offloaded activations[^:]*' "$T/fd.e"), no weights, nothing left" ||
  bad "full --offload-dir: exit $rc: $(cat "$T/fd.e")"

BRIGADE_OFFLOAD_ACT_AHEAD=-1 expect 1 "BRIGADE_OFFLOAD_ACT_AHEAD=-1: expected 0 to 1000" train $GPT --offload activations
finish 27
