#!/usr/bin/env bash
# tests/runtime/test_cp.sh: context parallelism (--cp) against one process.
# A GPT at sequence length 256 trained 20 AdamW steps with each sequence split
# over cp = 2 and 4 ranks (ring attention), and cp 2 with pp 2, with dp 2 and
# with pp 2 x dp 2 (zb-h1), gives the weights of one process within 1e-5
# relative L2 over all tensors, and its loss curve within 1e-5 relative. The
# activation memory each rank allocates is what it predicts (the summary's
# act MiB and act sim columns), and falls with cp (cp 4 < cp 2 < cp 1, the
# cp 1 figure from a dp 2 run with the same sequences per rank). A cp 2
# checkpoint resumes at cp 1 and cp 4 onto the same weights; variable
# lengths (rounded to multiples of 2 cp) match one process. An emulated
# pp 2 x cp 2 run (--emulate) sends the computing run's bytes. Refusals:
# a length not divisible by 2 cp, --ps, an MoE model, each one line naming
# what. (With tp, ZeRO and the planner: test_cp_compose.sh.) A Llama (rotary
# positions) the same as GPT: cp 2 = cp 1. The backward's overlapped dK/dV
# hops give bitwise the serial order's weights; a BRIGADE_CP_OVERLAP other than on or
# off fails before the first step.
. "$(dirname "$0")/../lib/harness.sh"

GPT="--model gpt --layers 2 --d-model 32 --heads 4 --seq 256 --batch 4 --microbatches 2 --threads 1 --lr 0.001 --steps 20"

# run NAME N ARGS...: train_save with the metrics; the losses of rank 0 into $T/NAME.loss
run() {
  local name=$1 n=$2; shift 2
  train_save "$name" "$n" $GPT "$@" --metrics "$T/$name.jsonl" || return 1
  grep '"rank": 0,' "$T/$name.jsonl" | sed 's/.*"loss": \([^,]*\),.*/\1/' >"$T/$name.loss"
}
# same_run NAME: weights within 1e-5 relative L2 of cp1's, and its 20 losses within 1e-5 relative
same_run() {
  near "$T/cp1" "$T/$1" "$1 = cp 1"
  if paste "$T/cp1.loss" "$T/$1.loss" | awk 'NF != 2 { exit 1 } { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * ($1 < 0 ? -$1 : $1)) exit 1; n++ } END { exit n == 20 ? 0 : 1 }'; then
    ok "$1: 20 losses within 1e-5 of cp 1 ($(head -1 "$T/$1.loss") -> $(tail -1 "$T/$1.loss"))"
  else
    bad "$1: loss curves differ: $(paste -d/ "$T/cp1.loss" "$T/$1.loss" | tr '\n' ' ')"
  fi
}

run cp1 1
run cp2 2 --cp 2 && same_run cp2
run cp4 4 --cp 4 && same_run cp4
# the backward's ring with each dK/dV hop waited for before the next block computes: bitwise the overlapped run
BRIGADE_CP_OVERLAP=off train_save cp4_serial 4 $GPT --cp 4 && same "$T/cp4" "$T/cp4_serial" "cp 4: overlapped dK/dV hops = serial"
run cp2_pp2 4 --cp 2 --pp 2 && same_run cp2_pp2
run cp2_dp2 4 --cp 2 --dp 2 && same_run cp2_dp2
run cp2_pp2_dp2 8 --cp 2 --pp 2 --dp 2 --schedule zb-h1 && same_run cp2_pp2_dp2
# variable lengths (--seq-min): rounded to multiples of 2 cp, the weights of one process with those lengths
train_save var1 1 $GPT --seq-min 64 --seq-multiple 4 && train_save var_cp2 2 $GPT --seq-min 64 --cp 2 &&
  near "$T/var1" "$T/var_cp2" "variable lengths, cp 2 = cp 1"

# a Llama (rotary positions at the global positions, grouped-query attention on the ring)
LLAMA="--model llama --layers 2 --d-model 32 --heads 4 --kv-heads 2 --seq 256 --batch 4 --microbatches 2 --threads 1 --lr 0.001 --steps 20"
train_save llama1 1 $LLAMA && train_save llama_cp2 2 $LLAMA --cp 2 && near "$T/llama1" "$T/llama_cp2" "Llama cp 2 = cp 1"

# a cp 2 checkpoint at step 10 resumes at cp 1 and at cp 4 onto the weights of one process's 20 steps
if train_save ck 2 $GPT --steps 10 --cp 2 --checkpoint-dir "$T/ck2"; then
  cp -r "$T/ck2" "$T/ck4"
  train_save ck_cp1 1 $GPT --checkpoint-dir "$T/ck2" --resume && near "$T/cp1" "$T/ck_cp1" "cp 2 checkpoint resumed at cp 1"
  train_save ck_cp4 4 $GPT --cp 4 --checkpoint-dir "$T/ck4" --resume &&
    near "$T/cp1" "$T/ck_cp4" "cp 2 checkpoint resumed at cp 4"
fi

# activation memory: measured = predicted on every rank, and per rank it falls with cp
act() {  # NAME N ARGS...: the summary's act MiB of rank 0 into $T/NAME.act; every rank's measured = predicted
  local name=$1 n=$2; shift 2
  if ! timeout 120 "$B" launch -n "$n" -- "$B" train $GPT --steps 2 "$@" >"$T/$name.sum" 2>&1; then
    bad "$name: $(tail -3 "$T/$name.sum")"; return 1
  fi
  awk -v n="$n" '/^ +[0-9]+ +[0-9]+ +[0-9]+ / { k++; if ($6 != $7) bad = bad " rank " $1 ": act " $6 " != predicted " $7;
      if ($1 == 0) print $6 > "/dev/stderr" }
      END { if (k != n || bad != "") { print "FAIL" bad " (" k " ranks)"; exit 1 } }' "$T/$name.sum" 2>"$T/$name.act" &&
    ok "$name: activation peak = prediction on $n ranks ($(cat "$T/$name.act") MiB)" ||
    bad "$name: $(grep -A"$n" '^rank' "$T/$name.sum")"
}
act mem1 2 --dp 2 --batch 8  # cp 1's per-rank figure: 4 sequences per rank, as below
act mem2 2 --cp 2
act mem4 4 --cp 4
if awk -v a="$(cat "$T/mem1.act")" -v b="$(cat "$T/mem2.act")" -v c="$(cat "$T/mem4.act")" 'BEGIN { exit !(c < b && b < a) }'; then
  ok "activation MiB per rank: cp 1 $(cat "$T/mem1.act"), cp 2 $(cat "$T/mem2.act"), cp 4 $(cat "$T/mem4.act")"
else
  bad "activation memory does not fall with cp: $(cat "$T/mem1.act") $(cat "$T/mem2.act") $(cat "$T/mem4.act")"
fi

# --emulate: the stages run no layer; the ring's steps of the real sizes still run, so an emulated run sends
# the computing run's bytes, per rank and step, exactly (pp 2 x cp 2: a ring on every stage)
E="--model gpt --layers 4 --d-model 32 --heads 4 --seq 64 --batch 4 --microbatches 2 --threads 1 --steps 2 --pp 2 --cp 2"
"$B" profile --layers 4 --d-model 32 --heads 4 --seq 64 --json "$T/prof.json" >/dev/null 2>&1 || bad "brigade profile"
bytes_of() { grep -ho '"rank": [0-9]*, "step": [0-9]*\|"bytes_sent": [0-9]*' "$T/$1.jsonl" | paste - - | sort; }
if timeout 120 "$B" launch -n 4 -- "$B" train $E --quiet --metrics "$T/real.jsonl" >"$T/real.log" 2>&1 &&
  timeout 120 "$B" launch -n 4 -- "$B" train $E --quiet --metrics "$T/emu.jsonl" --emulate "$T/prof.json" \
    >"$T/emu.log" 2>&1; then
  n=$(bytes_of real | wc -l)
  [ "$n" -eq 8 ] && [ "$(bytes_of real)" = "$(bytes_of emu)" ] &&
    ok "emulated pp 2 x cp 2 sends the computing run's bytes on every rank and step: $(bytes_of emu | awk '{print $NF}' | sort -u | tr '\n' ' ')" ||
    bad "emulated bytes differ: computing $(bytes_of real | tr '\n\t' '; ') emulated $(bytes_of emu | tr '\n\t' '; ')"
else
  bad "pp 2 x cp 2 with and without --emulate: $(tail -2 "$T/real.log" "$T/emu.log")"
fi

# refusals, before anything trains
expect_train 1 "--cp 4: the sequence length 100 is not divisible by 2 x cp = 8" $GPT --seq 100 --cp 4
expect_train 1 "--cp 2 with --ps is not built" $GPT --cp 2 --ps 1
if timeout 60 "$B" launch -n 2 -- "$B" train $GPT --steps 1 --quiet --cp 2 --experts 4 --top-k 2 >"$T/moe.log" 2>&1; then
  bad "an MoE model trained under --cp 2"
elif grep -q "layer moe is a moe" "$T/moe.log"; then
  ok "MoE refused: $(grep -m1 -o 'context parallelism.*is a moe' "$T/moe.log")"
else
  bad "MoE under --cp 2: $(tail -3 "$T/moe.log")"
fi
# a bad BRIGADE_CP_OVERLAP fails when the context group is made, before the first step, naming it
if BRIGADE_CP_OVERLAP=maybe timeout 60 "$B" launch -n 2 -- "$B" train $GPT --steps 1 --cp 2 --metrics "$T/badov.jsonl" \
  >"$T/badov.log" 2>&1; then
  bad "BRIGADE_CP_OVERLAP=maybe trained"
elif grep -q 'BRIGADE_CP_OVERLAP=maybe: expected on or off' "$T/badov.log" && ! grep -qs '"step"' "$T/badov.jsonl"; then
  ok "BRIGADE_CP_OVERLAP=maybe refused before a step: $(grep -m1 -o 'BRIGADE_CP_OVERLAP=maybe: expected on or off' "$T/badov.log")"
else
  bad "BRIGADE_CP_OVERLAP=maybe: $(tail -3 "$T/badov.log")"
fi
finish
