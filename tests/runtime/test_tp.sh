#!/usr/bin/env bash
# tests/runtime/test_tp.sh: tensor parallelism against one process. tp = 2
# and 4 (and a pp = 2 x dp = 2 x tp = 2 job of 8 processes) give the loss
# curve and the weights of one process after 10 steps: with SGD every tensor
# within 1e-5 of its own size; with AdamW within 1e-5 over all tensors
# (||a-b|| / ||a||), as data parallelism (test_equivalence.sh): Adam's
# m/sqrt(v) turns last-bit gradient differences of near-zero biases into
# visible steps. A tp = 2 checkpoint resumes at tp = 1 and tp = 4 onto the
# same weights. Sizes tp cannot divide fail with one line naming the layer.
# Sequence parallelism (--sequence-parallel) the same: tp 2, 4, with pp, dp,
# zb-h1 + recompute, ZeRO 1 and 2 and AdamW with tied embeddings; half the pipeline
# bytes of tp 2; its checkpoint resumes at tp 1 (and a tp 2 one under SP at
# tp 4); the memory it predicts is what it allocates, less than tp alone;
# variable lengths (--seq-min, rounded to a multiple of tp) match one process.
# BRIGADE_TP_OVERLAP=microbatch (a forward beside another microbatch's backward, two coroutines per
# rank) gives the bits of one instruction at a time, with and without SP, at tp 2 and 4 and in 3-D.
. "$(dirname "$0")/../lib/harness.sh"

# run NAME N ARGS...: N ranks (1: one process), weights to $T/NAME, losses to $T/NAME.loss
run() {
  local name=$1 n=$2; shift 2
  local cmd=("$B" train "$@" --quiet --save "$T/$name" --metrics "$T/$name.jsonl")
  [ "$n" -gt 1 ] && cmd=("$B" launch -n "$n" -- "${cmd[@]}")
  if ! timeout 120 "${cmd[@]}" >"$T/$name.log" 2>&1; then
    bad "$name: n=$n train $*"; grep -v WARN "$T/$name.log" | tail -5; return 1
  fi
  if grep -q "live allocations" "$T/$name.log"; then bad "$name: memory leaked"; return 1; fi
  grep '"rank": 0,' "$T/$name.jsonl" | sed 's/.*"loss": \([^,]*\),.*/\1/' >"$T/$name.loss"
}
# same_run REF NAME RTOL: weights (rtol, or l2:X) and loss curve (1e-5 relative) of NAME match REF
same_run() {
  local r=$1 name=$2 rtol=$3 verdict
  case "$rtol" in
    l2:*) verdict=$("$B" compare "$T/$r" "$T/$name" --rel-l2 "${rtol#l2:}") ;;
    *) verdict=$("$B" compare "$T/$r" "$T/$name" --rtol "$rtol") ;;
  esac
  [ $? = 0 ] && ok "$name vs $r: $verdict" || bad "$name vs $r: $verdict"
  if paste "$T/$r.loss" "$T/$name.loss" | awk 'NF != 2 { exit 1 } { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * ($1 < 0 ? -$1 : $1)) exit 1; n++ } END { exit n == 10 ? 0 : 1 }'; then
    ok "$name vs $r: 10 losses within 1e-5 ($(head -1 "$T/$name.loss") -> $(tail -1 "$T/$name.loss"))"
  else
    bad "$name vs $r: loss curves differ: $(paste -d/ "$T/$r.loss" "$T/$name.loss" | tr '\n' ' ')"
  fi
}

GPT="--model gpt --layers 2 --d-model 16 --heads 4 --seq 16 --batch 8 --microbatches 2 --threads 1 --lr 0.05 --optimizer sgd"
MLP="--model mlp --layers 3 --d-model 24 --in-features 12 --classes 8 --batch 16 --microbatches 2 --threads 1 --lr 0.05 --optimizer sgd"

run gpt 1 $GPT --steps 10
run gpt_tp2 2 $GPT --steps 10 --tp 2 && same_run gpt gpt_tp2 1e-5
run gpt_tp4 4 $GPT --steps 10 --tp 4 && same_run gpt gpt_tp4 1e-5
# the input-gradient sums waited for inside the layer instead of during the weight gradient: the same bits
BRIGADE_TP_OVERLAP=layer run gpt_tp2_layer 2 $GPT --steps 10 --tp 2 &&
  { v=$("$B" compare "$T/gpt_tp2" "$T/gpt_tp2_layer") && ok "BRIGADE_TP_OVERLAP=layer = weight, bitwise: $v" ||
      bad "BRIGADE_TP_OVERLAP=layer differs from weight: $v"; }
run gpt_3d 8 $GPT --steps 10 --tp 2 --dp 2 --pp 2 && same_run gpt gpt_3d 1e-5
# BRIGADE_TP_OVERLAP=microbatch: a backward beside the next microbatch's forward (or the other way), two
# coroutines on each rank's thread: the same bits as one instruction at a time; and they did overlap
# (an instruction of the second lane, on its own trace track, began before its partner ended)
bitwise() {  # REF NAME WHAT
  local v
  v=$("$B" compare "$T/$1" "$T/$2") && cmp -s "$T/$1.loss" "$T/$2.loss" && ok "$3 = one at a time, bitwise: $v" ||
    bad "$3 differs from one at a time: ${v:-} losses $(paste -d/ "$T/$1.loss" "$T/$2.loss" | tr '\n' ' ')"
}
overlapped() {  # TRACE: on every rank a compute event of lane 1 (tid 2) overlaps one of lane 0 (tid 0)
  python3 - "$1" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
comp = [e for e in ev if e.get("ph") == "X" and e.get("args", {}).get("op") in ("F", "B", "b", "W")]
ranks = {e["pid"] for e in ev if e.get("ph") == "X"}
n = {}
for r in ranks:
    l0 = [e for e in comp if e["pid"] == r and e["tid"] == 0]
    l1 = [e for e in comp if e["pid"] == r and e["tid"] == 2]
    n[r] = sum(1 for b in l1 for a in l0 if b["ts"] < a["ts"] + a["dur"] and a["ts"] < b["ts"] + b["dur"])
print(" ".join("rank %d: %d" % (r, n[r]) for r in sorted(n)))
sys.exit(0 if n and min(n.values()) > 0 else 1)
PY
}
BRIGADE_TP_OVERLAP=microbatch run gpt_tp2_mb 2 $GPT --steps 10 --tp 2 &&
  bitwise gpt_tp2 gpt_tp2_mb "tp 2, BRIGADE_TP_OVERLAP=microbatch"
# 8 microbatches: 7 pairs a step, 70 in all
BRIGADE_TP_OVERLAP=microbatch run gpt_tp2_mb8 2 ${GPT/--microbatches 2/--microbatches 8} --steps 10 --tp 2 --trace "$T/mb.json" &&
  { v=$(overlapped "$T/mb.json") && ok "paired instructions overlapped (overlapping pairs per rank: $v)" ||
      bad "no paired instructions overlapped on some rank: $v"; }
BRIGADE_TP_OVERLAP=microbatch run gpt_3d_mb 8 $GPT --steps 10 --tp 2 --dp 2 --pp 2 &&
  bitwise gpt_3d gpt_3d_mb "pp 2 x dp 2 x tp 2, BRIGADE_TP_OVERLAP=microbatch"
# split backward (B and W apart) and recomputation: the group's sums happen in B and in the rerun forward
run gpt_zb 4 $GPT --steps 10 --tp 2 --pp 2 --schedule zb-h1 --recompute && same_run gpt gpt_zb 1e-5
BRIGADE_TP_OVERLAP=microbatch run gpt_zb_mb 4 $GPT --steps 10 --tp 2 --pp 2 --schedule zb-h1 --recompute &&
  bitwise gpt_zb gpt_zb_mb "zb-h1 + recompute, pp 2 x tp 2, BRIGADE_TP_OVERLAP=microbatch"
# bf16 activations: the shards round elementwise what the whole layers round, so tp 2 stays within fp32's
# reassociation of one process (L2 1e-5; a value on a rounding edge may land one bf16 step apart)
run gpt_bf 1 $GPT --steps 10 --precision bf16
run gpt_bf_tp2 2 $GPT --steps 10 --tp 2 --precision bf16 && same_run gpt_bf gpt_bf_tp2 l2:1e-5
BRIGADE_TP_OVERLAP=microbatch run gpt_bf_tp2_mb 2 $GPT --steps 10 --tp 2 --precision bf16 &&
  bitwise gpt_bf_tp2 gpt_bf_tp2_mb "tp 2, bf16, BRIGADE_TP_OVERLAP=microbatch"
# ZeRO 2 over each tensor member's data-parallel group
run gpt_zero 4 $GPT --steps 10 --tp 2 --dp 2 --zero 2 && same_run gpt gpt_zero 1e-5
run mlp 1 $MLP --steps 10
run mlp_tp2 2 $MLP --steps 10 --tp 2 && same_run mlp mlp_tp2 1e-5
run mlp_tp4 4 $MLP --steps 10 --tp 4 && same_run mlp mlp_tp4 1e-5
# AdamW, tied embedding and head (both vocabulary-parallel), interleaved pipeline
ADAM="--model gpt --layers 2 --d-model 16 --heads 4 --seq 16 --batch 8 --microbatches 2 --threads 1 --lr 3e-3 --tie-embeddings"
run adam 1 $ADAM --steps 10
run adam_tp2 2 $ADAM --steps 10 --tp 2 && same_run adam adam_tp2 l2:1e-5
run adam_pp2_tp2 4 $ADAM --steps 10 --tp 2 --pp 2 --schedule interleaved --chunks 2 && same_run adam adam_pp2_tp2 l2:1e-5
BRIGADE_TP_OVERLAP=microbatch run adam_pp2_tp2_mb 4 $ADAM --steps 10 --tp 2 --pp 2 --schedule interleaved --chunks 2 &&
  bitwise adam_pp2_tp2 adam_pp2_tp2_mb "AdamW, tied, interleaved pp 2 x tp 2, BRIGADE_TP_OVERLAP=microbatch"

# the comparison can fail: a tp run of another learning rate differs
run gpt_tp2_lr 2 ${GPT/--lr 0.05/--lr 0.04} --steps 10 --tp 2
if "$B" compare "$T/gpt" "$T/gpt_tp2_lr" --rtol 1e-5 >/dev/null 2>&1; then bad "compare said lr 0.04 == lr 0.05"; else ok "another run differs"; fi

# a tp = 2 checkpoint (full named tensors, written once) resumes at tp = 1 and tp = 4
timeout 120 "$B" launch -n 2 -- "$B" train $GPT --steps 5 --tp 2 --quiet --checkpoint-dir "$T/ck" >"$T/ck.log" 2>&1 || bad "tp 2 checkpoint run: $(tail -3 "$T/ck.log")"
files=$(ls "$T/ck"/step-00000005/*.safetensors 2>/dev/null | wc -l)
[ "$files" = 1 ] && ok "tp 2 checkpoint: one file of full tensors" || bad "tp 2 checkpoint holds $files files"
for t in 1 4; do
  cp -r "$T/ck" "$T/ck$t"
  cmd=("$B" train $GPT --steps 10 --tp $t --quiet --checkpoint-dir "$T/ck$t" --resume --save "$T/res$t")
  [ $t -gt 1 ] && cmd=("$B" launch -n $t -- "${cmd[@]}")
  if timeout 120 "${cmd[@]}" >"$T/res$t.log" 2>&1; then
    grep -q "resuming from .*step-00000005" "$T/res$t.log" || bad "tp $t did not resume: $(head -3 "$T/res$t.log")"
    v=$("$B" compare "$T/gpt" "$T/res$t" --rtol 1e-5) && ok "tp 2 checkpoint resumed at tp $t: $v" || bad "resume at tp $t: $v"
  else
    bad "resume at tp $t: $(tail -3 "$T/res$t.log")"
  fi
done

# sequence parallelism: layernorms, residuals and the activations between blocks split along the
# sequence; the same tolerances against one process
SP="--sequence-parallel"
run gpt_sp2 2 $GPT --steps 10 --tp 2 $SP && same_run gpt gpt_sp2 1e-5
# the input gradient's reduce-scatters waited for inside the layer instead of during the weight gradient
BRIGADE_TP_OVERLAP=layer run gpt_sp2_layer 2 $GPT --steps 10 --tp 2 $SP &&
  { v=$("$B" compare "$T/gpt_sp2" "$T/gpt_sp2_layer") && ok "sequence-parallel BRIGADE_TP_OVERLAP=layer = weight, bitwise: $v" ||
      bad "sequence-parallel BRIGADE_TP_OVERLAP=layer differs from weight: $v"; }
BRIGADE_TP_OVERLAP=microbatch run gpt_sp2_mb 2 $GPT --steps 10 --tp 2 $SP &&
  bitwise gpt_sp2 gpt_sp2_mb "sequence-parallel tp 2, BRIGADE_TP_OVERLAP=microbatch"
run gpt_sp4 4 $GPT --steps 10 --tp 4 $SP && same_run gpt gpt_sp4 1e-5
BRIGADE_TP_OVERLAP=microbatch run gpt_sp4_mb 4 $GPT --steps 10 --tp 4 $SP &&
  bitwise gpt_sp4 gpt_sp4_mb "sequence-parallel tp 4, BRIGADE_TP_OVERLAP=microbatch"
run gpt_sp_pp2 4 $GPT --steps 10 --tp 2 --pp 2 $SP && same_run gpt gpt_sp_pp2 1e-5
run gpt_sp_3d 8 $GPT --steps 10 --tp 2 --dp 2 --pp 2 $SP && same_run gpt gpt_sp_3d 1e-5
run gpt_sp_zb 4 $GPT --steps 10 --tp 2 --pp 2 --schedule zb-h1 --recompute $SP && same_run gpt gpt_sp_zb 1e-5
run gpt_sp_zero 4 $GPT --steps 10 --tp 2 --dp 2 --zero 1 $SP && same_run gpt gpt_sp_zero 1e-5
# --zero 2 reduce-scatters every microbatch's buckets (one per layer here): the tensor group sums each
# microbatch's layernorm gradients first; a tied (whole) bucket once a step
BRIGADE_BUCKET_MB=0 run gpt_sp_zero2 4 $GPT --steps 10 --tp 2 --dp 2 --zero 2 $SP && same_run gpt gpt_sp_zero2 1e-5
run adam_sp2 2 $ADAM --steps 10 --tp 2 $SP && same_run adam adam_sp2 l2:1e-5
BRIGADE_BUCKET_MB=0 run adam_sp_4d 8 $ADAM --steps 10 --tp 2 --dp 2 --pp 2 --zero 2 $SP && same_run adam adam_sp_4d l2:1e-5
# one sequence per microbatch: the members' gathered rows are already in sequence order
run gpt_n1 1 ${GPT/--microbatches 2/--microbatches 8} --steps 10
run gpt_n1_sp2 2 ${GPT/--microbatches 2/--microbatches 8} --steps 10 --tp 2 $SP && same_run gpt_n1 gpt_n1_sp2 1e-5
# variable lengths (--seq-min) under SP are rounded up to a multiple of tp: one process with the same lengths
run gpt_var 1 $GPT --steps 10 --seq-min 5 --seq-multiple 2
run gpt_var_sp 4 $GPT --steps 10 --seq-min 5 --tp 2 --pp 2 $SP && same_run gpt_var gpt_var_sp 1e-5
# the pipeline carries this member's part of the sequence: half the bytes of tp 2 without it
run gpt_pp2_tp2 4 $GPT --steps 10 --tp 2 --pp 2
b0=$(grep '"rank": 0,' "$T/gpt_pp2_tp2.jsonl" | head -1 | sed 's/.*"bytes_sent": \([0-9]*\).*/\1/')
b1=$(grep '"rank": 0,' "$T/gpt_sp_pp2.jsonl" | head -1 | sed 's/.*"bytes_sent": \([0-9]*\).*/\1/')
[ -n "$b0" ] && [ -n "$b1" ] && [ "$((2 * b1))" = "$b0" ] && ok "pp 2 x tp 2: rank 0 sends $b0 bytes a step, $b1 with $SP" ||
  bad "pp 2 x tp 2: rank 0 sends ${b0:-?} bytes a step, ${b1:-?} with $SP (expected half)"
# the trace names SP's collectives: gathers, reduce-scatters (blocking ones and the waits of the overlapped)
if timeout 120 "$B" launch -n 2 -- "$B" train $GPT --steps 2 --tp 2 $SP --quiet --trace "$T/sp_trace.json" >"$T/sp_trace.log" 2>&1; then
  names=$(grep -o '"op": *"tp_[a-z_]*"' "$T/sp_trace.json" | sed 's/.*"\(tp_[a-z_]*\)"/\1/' | sort | uniq -c | tr '\n' ' ')
  grep -q '"tp_red_scatter"' "$T/sp_trace.json" && grep -q '"tp_allgather"' "$T/sp_trace.json" && grep -q '"tp_wait"' "$T/sp_trace.json" &&
    ok "SP trace: $names" || bad "SP trace lacks its collectives: $names"
else
  bad "SP trace run: $(tail -3 "$T/sp_trace.log")"
fi
# an SP checkpoint (full tensors) resumes at tp 1; a tp 2 one resumes under SP at tp 4
timeout 120 "$B" launch -n 2 -- "$B" train $GPT --steps 5 --tp 2 $SP --quiet --checkpoint-dir "$T/cksp" >"$T/cksp.log" 2>&1 ||
  bad "SP checkpoint run: $(tail -3 "$T/cksp.log")"
for v in "1 cksp" "4 ck"; do
  set -- $v
  rm -rf "$T/$2_$1" && cp -r "$T/$2" "$T/$2_$1"
  cmd=("$B" train $GPT --steps 10 --tp $1 --quiet --checkpoint-dir "$T/$2_$1" --resume --save "$T/res_$2_$1")
  [ $1 -gt 1 ] && cmd=("$B" launch -n $1 -- "${cmd[@]}" $SP)
  if timeout 120 "${cmd[@]}" >"$T/res_$2_$1.log" 2>&1 && grep -q "resuming from .*step-00000005" "$T/res_$2_$1.log"; then
    v=$("$B" compare "$T/gpt" "$T/res_$2_$1" --rtol 1e-5) && ok "$2 checkpoint resumed at tp $1: $v" || bad "$2 at tp $1: $v"
  else
    bad "$2 checkpoint at tp $1: $(tail -3 "$T/res_$2_$1.log")"
  fi
done
# memory: per rank, the measured activation peak and peak equal the predictions (the rank table's
# act / act sim and peak / mem sim, as printed), and SP holds fewer activation bytes than tp alone
MEM="--model gpt --layers 4 --d-model 64 --heads 4 --seq 32 --batch 8 --microbatches 2 --steps 3 --threads 1"
for sp in "" "$SP"; do
  for pp in 1 2; do
    name=mem_${pp}${sp:+_sp}
    if ! timeout 120 "$B" launch -n $((2 * pp)) -- "$B" train $MEM --tp 2 --pp $pp $sp --quiet >"$T/$name.o" 2>"$T/$name.e"; then
      bad "$name did not run: $(grep -v WARN "$T/$name.e" | tail -3)"; continue
    fi
    # rank peak act act_sim mem_sim
    awk '$1 ~ /^[0-9]+$/ && NF >= 11 {print $1, $5, $6, $7, $11}' "$T/$name.e" >"$T/$name.m"
    if [ "$(wc -l <"$T/$name.m")" = $((2 * pp)) ] &&
       awk -v pp=$pp '{ if (pp == 1 && ($3 != $4 || $2 != $5)) exit 1; if ($2 > 1.10 * $5 || $2 < 0.90 * $5 || $3 > 1.05 * $4 || $3 < 0.95 * $4) exit 1 }' "$T/$name.m"; then
      ok "$name: per rank peak/predicted, activations/predicted MiB: $(awk '{printf "%s/%s %s/%s; ", $2, $5, $3, $4}' "$T/$name.m")"
    else
      bad "$name: peak vs prediction: $(tr '\n' ';' <"$T/$name.m")"
    fi
  done
done
for pp in 1 2; do
  a=$(awk 'NR == 1 {print $3}' "$T/mem_$pp.m" 2>/dev/null); s=$(awk 'NR == 1 {print $3}' "$T/mem_${pp}_sp.m" 2>/dev/null)
  awk -v a="${a:-0}" -v s="${s:-0}" 'BEGIN { exit !(s > 0 && s < a) }' &&
    ok "pp $pp x tp 2: rank 0 activations $a MiB, $s MiB with $SP" || bad "pp $pp x tp 2: activations ${a:-?} MiB, ${s:-?} with $SP"
done
# the planner counts SP's split activations: brigade plan --sequence-parallel records it in the plan,
# train --plan runs it with rank 0's peak as predicted (the printed MiB equal), below the plan without SP
PM="--model gpt --layers 2 --d-model 64 --heads 4 --seq 32 --devices 2 --mem 1G --batch 8 --tp 2 --microbatch-size 4 --schedule 1f1b"
for sp in "" "$SP"; do
  name=plan${sp:+_sp}
  if "$B" plan $PM $sp --json "$T/$name.json" >"$T/$name.o" 2>&1 &&
     timeout 120 "$B" launch -n 2 -- "$B" train --plan "$T/$name.json" --steps 2 --threads 1 --quiet >"$T/$name.t" 2>&1; then
    line=$(grep "rank 0 peak" "$T/$name.t")
    echo "$line" | sed -nE 's/.*rank 0 peak ([0-9.]+) MiB, predicted ([0-9.]+) MiB.*/\1 \2/p' >"$T/$name.mp"
    awk '{ exit !($1 > 0 && $1 == $2) }' "$T/$name.mp" && ok "$name: $line" || bad "$name: $line"
  else
    bad "$name: $(tail -3 "$T/$name.o" "$T/$name.t" 2>/dev/null)"
  fi
done
grep -q '"sequence_parallel": true' "$T/plan_sp.json" && ! grep -q sequence_parallel "$T/plan.json" &&
  ok "the plan JSON records sequence parallelism" || bad "the plan JSON does not record sequence parallelism"
awk 'NR == FNR { a = $1; next } { exit !($1 < a) }' "$T/plan.mp" "$T/plan_sp.mp" 2>/dev/null &&
  ok "planned peak with SP $(cut -d' ' -f1 "$T/plan_sp.mp") MiB < $(cut -d' ' -f1 "$T/plan.mp") MiB without" ||
  bad "planned peak with SP not below without"
out=$("$B" train --plan "$T/plan.json" $SP --steps 1 2>&1) && bad "--sequence-parallel against a plan without it ran" ||
  { [ "$(wc -l <<<"$out")" = 1 ] && grep -q "counted the memory without sequence parallelism" <<<"$out" &&
    ok "SP against a plan without it: $out" || bad "SP against a plan without it: $out"; }

# bad sizes: one line naming the layer and the sizes, non-zero, no rank started
expect_error() {
  local want=$1; shift
  local out rc
  out=$(timeout 30 "$B" train "$@" --steps 1 --quiet 2>&1); rc=$?
  if [ $rc != 0 ] && [ $rc != 124 ] && grep -q -- "$want" <<<"$out" && [ "$(wc -l <<<"$out")" -le 2 ]; then
    ok "error: $out"
  else
    bad "expected '$want' (rc $rc): $out"
  fi
}
expect_error "layer blocks.0.attn has 4 heads, which tp 3 does not divide" $GPT --tp 3
expect_error "layers embed and head have a vocabulary of 258, which tp 4 does not divide" \
  ${GPT/--seq 16/--seq 16 --vocab 258} --tp 4
expect_error "layer fc.0 has 26 output features (d_model), which tp 4 does not divide" ${MLP/--d-model 24/--d-model 26} --tp 4
expect_error "layer head has 6 classes, which tp 4 does not divide" ${MLP/--classes 8/--classes 6} --tp 4
expect_error "sequence parallelism: the sequence length 18 is not divisible by tp 4" ${GPT/--seq 16/--seq 18} --tp 4 $SP
expect_error "sequence parallelism needs a GPT" $MLP --tp 2 $SP
expect_error "seq-multiple 3 does not divide the sequence length 16" $GPT --seq-min 5 --seq-multiple 3
expect_error "seq-multiple 2 with --sequence-parallel: every length must be a multiple of tp 4" $GPT --tp 4 $SP \
  --seq-min 5 --seq-multiple 2

finish
