#!/usr/bin/env bash
# tests/runtime/test_offload.sh: --offload optimizer (docs/offload.md), its results.
# - The weights of no offload, bitwise (the same AdamW kernel on the same
#   elements in the same order; only where the state lives changes), in files
#   under --offload-dir: pp 1, pp 2 (1F1B, ZB-H1, interleaved), tp 2, dp 2
#   with --zero 1 and --zero 2 (each against the same layout without
#   offload), SGD with momentum (ZB-H1), dp 2 --zero 2 through the staging
#   layer (BRIGADE_STAGING=always); in host memory at pp 1 and dp 2 --zero 2.
# - Checkpoints: the step-3 checkpoint with offload holds the tensors of the
#   one without, optimizer state included (bitwise); resumed with offload off
#   (and a checkpoint without offload resumed with it on) to step 6, the
#   weights of a run that never stopped; a dp 2 --zero 2 offloaded checkpoint
#   (its shards gathered) resumed at pp 2 within the tolerance of --zero 2.
# - --offload params: dp 2 --zero 3 with each replica's parameter shard in
#   files (pp 1, pp 2) and, with the optimizer's, in host memory: the weights
#   of --zero 3 without offload, bitwise; its step-3 checkpoint is that of no
#   offload, and resumes across offload on/off to the weights of a run that
#   never stopped.
# test_offload_memory.sh: its memory, the planner, its files and bad input.
. "$(dirname "$0")/../lib/harness.sh"
GPT="--model gpt --layers 3 --d-model 32 --heads 2 --seq 16 --batch 8 --microbatches 4 --steps 3 --threads 1 --lr 3e-3 --weight-decay 0.1"
OD="$T/od"

# equivalence: no offload / host memory / files, per layout
for lay in "1:--pp 1" "2:--pp 2" "2:--dp 2 --zero 1" "2:--dp 2 --zero 2" "2:--pp 2 --schedule zb-h1 --optimizer sgd --lr 0.05" \
  "2:--pp 2 --schedule interleaved --chunks 2" "2:--tp 2"; do
  n=${lay%%:*}; args=${lay#*:}; tag=$(echo "$args" | tr -dc 'a-z0-9')
  train_save "n_$tag" $n $GPT $args || continue
  case $tag in pp1 | dp2zero2) # host memory: the same store calls as files, so two layouts suffice
    train_save "h_$tag" $n $GPT $args --offload optimizer && same "$T/n_$tag" "$T/h_$tag" "$args: --offload optimizer (host) = none" ;;
  esac
  train_save "f_$tag" $n $GPT $args --offload optimizer --offload-dir "$OD" &&
    same "$T/n_$tag" "$T/f_$tag" "$args: --offload optimizer --offload-dir = none"
done
# ZeRO's collectives through the staging layer (as on a device backend), the shard offloaded
BRIGADE_STAGING=always train_save st_n 2 $GPT --dp 2 --zero 2 &&
  BRIGADE_STAGING=always train_save st_o 2 $GPT --dp 2 --zero 2 --offload optimizer --offload-dir "$OD" &&
  same "$T/st_n" "$T/st_o" "BRIGADE_STAGING=always, dp 2 --zero 2: offloaded = none"
# the state written back and dropped from memory before every step, read back from the files (bench/offload.sh)
BRIGADE_OFFLOAD_EVICT=on train_save ev_pp1 1 $GPT --pp 1 --offload optimizer --offload-dir "$OD" &&
  same "$T/n_pp1" "$T/ev_pp1" "the state evicted to disk every step (BRIGADE_OFFLOAD_EVICT=on) = none"
left=$(ls -A "$OD" 2>/dev/null | wc -l)
[ -d "$OD" ] && [ "$left" = 0 ] && ok "--offload-dir created and left empty" || bad "--offload-dir holds $left entries"

# checkpoints: offload on/off does not change them; resume across it
CK="$GPT --pp 2"
G10=${CK/--steps 3/--steps 6}
train_save ck0 2 $CK --checkpoint-dir "$T/c0" && train_save ck1 2 $CK --checkpoint-dir "$T/c1" --offload optimizer --offload-dir "$OD" &&
  same "$T/c0/step-00000003" "$T/c1/step-00000003" "step-3 checkpoints with and without offload, optimizer state included"
train_save full 2 $G10 &&
  train_save r_off 2 $G10 --checkpoint-dir "$T/c1" --resume && same "$T/full" "$T/r_off" "offloaded checkpoint resumed without offload" &&
  train_save r_on 2 $G10 --checkpoint-dir "$T/c0" --resume --offload optimizer && same "$T/full" "$T/r_on" "checkpoint resumed with offload"
# a --zero 2 shard's offloaded state, gathered into full tensors, resumed at pp 2 (the sums of --zero 2: the tolerance)
train_save zck 2 $GPT --dp 2 --zero 2 --checkpoint-dir "$T/cz" --offload optimizer &&
  train_save zres 2 $G10 --checkpoint-dir "$T/cz" --resume && near "$T/full" "$T/zres" "dp 2 --zero 2 offloaded checkpoint resumed at pp 2 without offload"

# --offload params: the --zero 3 shard in the store, the weights of --zero 3 without it
for lay in "2:--dp 2 --zero 3" "4:--pp 2 --dp 2 --zero 3"; do
  n=${lay%%:*}; args=${lay#*:}; tag=$(echo "$args" | tr -dc 'a-z0-9')
  train_save "z3n_$tag" $n $GPT $args &&
    train_save "z3p_$tag" $n $GPT $args --offload params --offload-dir "$OD" &&
    same "$T/z3n_$tag" "$T/z3p_$tag" "$args: --offload params --offload-dir = none"
done
train_save z3h 2 $GPT --dp 2 --zero 3 --offload optimizer,params &&
  same "$T/z3n_dp2zero3" "$T/z3h" "dp 2 --zero 3: --offload optimizer,params (host) = none"
Z3="$GPT --dp 2 --zero 3"
Z6=${Z3/--steps 3/--steps 6}
train_save z3c0 2 $Z3 --checkpoint-dir "$T/z0" && train_save z3c1 2 $Z3 --checkpoint-dir "$T/z1" --offload optimizer,params --offload-dir "$OD" &&
  same "$T/z0/step-00000003" "$T/z1/step-00000003" "--zero 3 step-3 checkpoints with and without --offload optimizer,params"
train_save z3full 2 $Z6 &&
  train_save z3r_off 2 $Z6 --checkpoint-dir "$T/z1" --resume && same "$T/z3full" "$T/z3r_off" "--zero 3: offloaded checkpoint resumed without offload" &&
  train_save z3r_on 2 $Z6 --checkpoint-dir "$T/z0" --resume --offload params && same "$T/z3full" "$T/z3r_on" "--zero 3: checkpoint resumed with --offload params"
left=$(ls -A "$OD" 2>/dev/null | wc -l)
[ "$left" = 0 ] && ok "--offload-dir left empty after --offload params" || bad "--offload-dir holds $left entries after --offload params"

finish 23
