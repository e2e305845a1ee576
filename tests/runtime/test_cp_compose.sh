#!/usr/bin/env bash
# tests/runtime/test_cp_compose.sh: context parallelism (--cp) composed with
# tensor parallelism and ZeRO, and placed by the planner. A GPT at sequence
# length 256 trained 20 AdamW steps at cp 2 with tp 2 (also with sequence
# parallelism, and with pp 2), and with dp 2 under ZeRO 1, 2 and 3 (sharded
# over the dp x cp group), gives the weights of one process within 1e-5
# relative L2 over all tensors, and a Llama at cp 2 x tp 2 too. brigade plan
# at a cap where no cp 1 layout fits (its error) finds cp 2 with --cp auto
# (said so, "cp": 2 in the JSON), and train --plan runs it within the cap
# with every rank's peak = the plan's prediction; a different --cp against
# the plan and a length not divisible by 2 cp are one-line refusals.
. "$(dirname "$0")/../lib/harness.sh"

GPT="--model gpt --layers 2 --d-model 32 --heads 4 --seq 256 --batch 4 --microbatches 2 --threads 1 --lr 0.001 --steps 20"
# run NAME N ARGS...: train_save, then its weights within 1e-5 relative L2 of one process's (cp1)
run() {
  local name=$1 n=$2; shift 2
  train_save "$name" "$n" $GPT "$@" && near "$T/cp1" "$T/$name" "$name = cp 1"
}
train_save cp1 1 $GPT || die "one process"
# with tensor parallelism (heads split over tp, a ring per tp member), sequence parallelism and pp; with ZeRO
# (gradients and optimizer state sharded over the dp x cp group that sums them)
run cp2_tp2 4 --cp 2 --tp 2
run cp2_tp2_sp 4 --cp 2 --tp 2 --sequence-parallel
run cp2_tp2_pp2 8 --cp 2 --tp 2 --pp 2
run cp2_dp2_z1 4 --cp 2 --dp 2 --zero 1
run cp2_dp2_z2 4 --cp 2 --dp 2 --zero 2
run cp2_dp2_z3 4 --cp 2 --dp 2 --zero 3

LLAMA="--model llama --layers 2 --d-model 32 --heads 4 --kv-heads 2 --seq 256 --batch 4 --microbatches 2 --threads 1 --lr 0.001 --steps 20"
train_save llama1 1 $LLAMA && train_save llama_cp2_tp2 4 $LLAMA --cp 2 --tp 2 &&
  near "$T/llama1" "$T/llama_cp2_tp2" "Llama cp 2 x tp 2 = cp 1"

# the planner places context groups: at a 14 MiB cap where no cp 1 layout of 2 devices fits (its error),
# --cp auto finds cp 2 (said so), and train --plan runs it within the cap, every rank's peak = the prediction
PM="--model gpt --layers 2 --d-model 32 --heads 4 --seq 1024 --devices 2 --batch 4 --microbatch-size 2 --schedule 1f1b --tp 1 --mem 14M"
expect_err_line plan "does not fit in memory: no layout of 2 devices of 14.00 MiB fits" $PM
if "$B" plan $PM --cp auto --json "$T/plan_cp.json" >"$T/plan_cp.o" 2>&1 &&
   grep -q "cp = 2 is the smallest context-parallel degree that fits" "$T/plan_cp.o" && grep -q '"cp": 2' "$T/plan_cp.json"; then
  ok "brigade plan --cp auto: $(grep -o 'best plan: [^,]*' "$T/plan_cp.o")"
  if timeout 120 "$B" launch -n 2 -- "$B" train --plan "$T/plan_cp.json" --steps 2 --threads 1 --quiet >"$T/plan_cp.t" 2>&1; then
    line=$(grep -m1 "rank 0 peak" "$T/plan_cp.t")
    # every rank: peak MiB (column 5) = the plan's prediction, below the 14 MiB cap
    pred=$(sed -nE 's/.*rank 0 peak [0-9.]+ MiB, predicted ([0-9.]+) MiB.*/\1/p' <<<"$line")
    awk -v p="${pred:-0}" '$1 ~ /^[0-9]+$/ && NF >= 11 { n++; if ($5 != p || $5 >= 14) bad = 1 }
        END { exit !(n == 2 && !bad && p > 0) }' "$T/plan_cp.t" && grep -q "x cp 2 x" "$T/plan_cp.t" &&
      ok "train --plan with cp 2 within 14 MiB: $line" || bad "train --plan cp 2: $line $(grep -A2 '^rank' "$T/plan_cp.t")"
  else
    bad "train --plan cp 2: $(tail -3 "$T/plan_cp.t")"
  fi
  expect_train 2 "--cp 4, but $T/plan_cp.json is a plan for cp 2" --plan "$T/plan_cp.json" --cp 4 --steps 1
else
  bad "brigade plan --cp auto: $(tail -3 "$T/plan_cp.o")"
fi
expect_err_line plan "cp 2: the sequence length 1022 is not divisible by 2 x cp = 4" ${PM/--seq 1024/--seq 1022} --cp 2
finish 12
