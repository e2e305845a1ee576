#!/usr/bin/env bash
# tests/runtime/test_offload_act.sh: --offload activations (docs/offload.md).
# - The weights of no offload, bitwise (the stash's bytes go to host memory and
#   come back unchanged before its backward): pp 1 (one stage, the last: nothing
#   moves), pp 2 with 1F1B, ZB-H1 and interleaved, each at the default
#   BRIGADE_OFFLOAD_ACT_AHEAD (1) and at 0; with --offload optimizer too; with
#   --recompute (nothing to move).
# - Each rank's measured peak (the summary's "peak MiB") is below that of the
#   same run without offload where stashes wait for their backward: rank 0 of
#   1F1B and ZB-H1 at ahead 0, both ranks of interleaved; never above it.
# - The executor's prediction ("mem sim") still counts every stash on the
#   device (docs/offload.md, what is left): each rank's peak is at most the
#   prediction, and no run warns of a peak above it.
# - Bad input: BRIGADE_OFFLOAD_ACT_AHEAD out of range fails in one line.
. "$(dirname "$0")/../lib/harness.sh"
GPT="--model gpt --layers 4 --d-model 64 --heads 2 --seq 32 --batch 8 --microbatches 4 --steps 2 --threads 1 --lr 3e-3"
# peak MiB per rank of a run's summary ($5), one line
peaks() { awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / { printf "%s ", $5 }' "$1"; }
# lower NONE OFF RANKS: every rank's peak in OFF <= NONE's and <= OFF's prediction ($NF), strictly below NONE's
# for the ranks listed; OFF warns of no peak above the prediction
lower() {
  ! grep -q "is above the predicted" "$2" &&
  awk -v ranks=" $3 " 'FNR == NR && /^ +[0-9]+ +[0-9]+ +[0-9]+ / { n[$1] = $5; next }
    /^ +[0-9]+ +[0-9]+ +[0-9]+ / { k++; if ($5 + 0 > n[$1] + 0 || $5 + 0 > $NF + 0 || (index(ranks, " " $1 " ") && $5 + 0 >= n[$1] + 0)) bad = 1 }
    END { exit !(k > 0 && !bad) }' "$1" "$2"
}

for lay in "1:--pp 1::" "2:--pp 2:0:0" "2:--pp 2 --schedule zb-h1:0:0" "2:--pp 2 --schedule interleaved --chunks 2:1:0 1"; do
  IFS=: read -r n args ahead ranks <<<"$lay"
  tag=$(echo "$args" | tr -dc 'a-z0-9')
  train_save "n_$tag" $n $GPT $args || continue
  train_save "a_$tag" $n $GPT $args --offload activations &&
    same "$T/n_$tag" "$T/a_$tag" "$args: --offload activations = none"
  [ $n = 1 ] && continue
  BRIGADE_OFFLOAD_ACT_AHEAD=0 train_save "a0_$tag" $n $GPT $args --offload activations &&
    same "$T/n_$tag" "$T/a0_$tag" "$args: --offload activations, BRIGADE_OFFLOAD_ACT_AHEAD=0 = none"
  [ "$ahead" = 0 ] && run="a0_$tag" || run="a_$tag"
  lower "$T/n_$tag.log" "$T/$run.log" "$ranks" &&
    ok "$args: peak MiB per rank $(peaks "$T/$run.log")(ahead $ahead) < $(peaks "$T/n_$tag.log")without offload (ranks $ranks), <= predicted $(awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / { printf "%s ", $NF }' "$T/$run.log")" ||
    bad "$args: peak MiB per rank $(peaks "$T/$run.log")with offload vs $(peaks "$T/n_$tag.log")without"
done
train_save o_pp2 2 $GPT --pp 2 --offload optimizer,activations &&
  same "$T/n_pp2" "$T/o_pp2" "--pp 2 --offload optimizer,activations = none"
train_save rn_pp2 2 $GPT --pp 2 --recompute && train_save ra_pp2 2 $GPT --pp 2 --recompute --offload activations &&
  same "$T/rn_pp2" "$T/ra_pp2" "--pp 2 --recompute --offload activations = --recompute"

BRIGADE_OFFLOAD_ACT_AHEAD=-1 expect 1 "BRIGADE_OFFLOAD_ACT_AHEAD=-1: expected 0 to 1000" train $GPT --offload activations
finish 13
