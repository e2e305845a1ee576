#!/usr/bin/env bash
# tests/runtime/test_ep_tp.sh: MoE layers under tensor parallelism (--tp), with and without expert parallelism
# (--ep), against one process holding every expert. Under tp every member runs the whole MoE layer (router and
# its experts, whole) on the same tokens, the experts replicated over the tensor group as a LayerNorm is; the
# ep all-to-all runs over the ranks of one tp index. The attention's tensor-parallel sums change the order of
# additions, so the weights agree within 1e-5 relative L2 after 4 AdamW steps; the routing is the same
# (moe_dropped of every step, and moe_aux at step 1, on both members of each tensor group, equal to the
# replica's of the run without tp); the gradient norm counts the replicated MoE tensors once; pipelines (1F1B,
# DualPipeV, paired or not) compose; the peak memory is the prediction; a checkpoint saved under ep 2 x tp 2 resumes under plain dp; sequence parallelism with
# MoE is refused.
. "$(dirname "$0")/../lib/harness.sh"
G="--layers 4 --d-model 16 --heads 4 --seq 16 --batch 8 --threads 1 --lr 3e-3 --experts 4 --top-k 2 --moe-every 2"
G="$G --capacity-factor 1.0 --moe-aux-coef 0.1"
L="--model llama --kv-heads 2 ${G}"

# train NAME RANKS FLAGS...: train_save with the step's metrics in $T/NAME.jsonl
train() { local n=$1 r=$2; shift 2; train_save "$n" "$r" "$@" --metrics "$T/$n.jsonl"; }
# routing_of NAME TP: "replica step moe_dropped moe_aux-at-step-1" per rank and step, the rank mapped to its
# replica (rank / TP), one line for the members of a tensor group when they agree
routing_of() {
    grep -ho '"rank": [0-9]*, "step": [0-9]*\|"moe_aux": [^,]*, "moe_dropped": [0-9]*' "$T/$1.jsonl" | paste - - |
        awk -F'[ ,\t]+' -v tp="$2" '{print int($2 / tp), $4, $10, ($4 == 1 ? $6 : "-")}' | sort -u -n -k1 -k2
}
# routing A TPA B TPB WHAT
routing() {
    local a b
    a=$(routing_of "$1" "$2") b=$(routing_of "$3" "$4")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "$5 ($(echo "$a" | wc -l) replica-steps)"
    else bad "$5: $(diff <(echo "$a") <(echo "$b") | head -4 | tr '\n' ' ')"; fi
}
# norms NAME: rank 0's gradient norm per step
norms() { grep '"rank": 0, "step"' "$T/$1.jsonl" | grep -o '"grad_norm": [^,]*' | awk '{print $2}'; }
# peak_is_predicted NAME...: peak = prediction on every rank and step
peak_is_predicted() {
    local lines off
    lines=$(for n in "$@"; do cat "$T/$n.jsonl"; done | grep -c '"peak_bytes"')
    off=$(for n in "$@"; do cat "$T/$n.jsonl"; done | grep -o '"peak_bytes": [0-9]*, "predicted_bytes": [0-9]*' |
        awk '$2 + 0 != $4 + 0' | head -3)
    [ "$lines" -gt 0 ] && [ -z "$off" ] && ok "peak memory = predicted on every rank and step of $* ($lines lines)" ||
        bad "peak memory differs from the prediction: $off"
}

train ref 1 $G --steps 4 --microbatches 2
train t2 2 $G --steps 4 --microbatches 2 --tp 2
near "$T/ref" "$T/t2" "MoE at tp 2 (ep 1) vs one process"
routing ref 1 t2 2 "tp 2: both members route as one process"
train d2 2 $G --steps 4 --dp 2 --microbatches 1
train e2t2 4 $G --steps 4 --dp 2 --ep 2 --tp 2 --microbatches 1
near "$T/ref" "$T/e2t2" "ep 2 x tp 2 (dp 2, 4 ranks) vs one process holding every expert"
routing d2 1 e2t2 2 "ep 2 x tp 2: every tensor group routes as its replica under dp 2"
a=$(norms ref) b=$(norms e2t2)
paste <(echo "$a") <(echo "$b") | awk 'NF == 2 {d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6 * $1) bad = 1; n++}
    END {exit !(n == 4 && !bad)}' && ok "ep 2 x tp 2: gradient norms $(echo $b) = one process's within 1e-6 relative" ||
    bad "gradient norms: one process $(echo $a), ep 2 x tp 2 $(echo $b)"
train lref 1 $L --steps 4 --microbatches 2
train le2t2 4 $L --steps 4 --dp 2 --ep 2 --tp 2 --microbatches 1
near "$T/lref" "$T/le2t2" "Llama: ep 2 x tp 2 vs one process"
# pipelined: pp 2 x ep 2 x dp 2 x tp 2 (8 ranks), 1F1B and DualPipeV, its all-to-alls and tensor sums overlapped
# with the paired microbatch (BRIGADE_TP_OVERLAP=microbatch) bitwise equal to it without
train r16 1 $G --steps 4 --microbatches 4 --batch 16
train p2 8 $G --steps 4 --pp 2 --dp 2 --ep 2 --tp 2 --microbatches 2 --batch 16
near "$T/r16" "$T/p2" "pp 2 x ep 2 x dp 2 x tp 2, 1F1B vs one process"
DV="--steps 4 --pp 2 --dp 2 --ep 2 --tp 2 --microbatches 4 --batch 16 --schedule dualpipev"
train r16m8 1 $G --steps 4 --microbatches 8 --batch 16
train dv 8 $G $DV && near "$T/r16m8" "$T/dv" "pp 2 x ep 2 x dp 2 x tp 2, DualPipeV vs one process"
BRIGADE_TP_OVERLAP=microbatch train dvo 8 $G $DV && same "$T/dv" "$T/dvo" \
    "pp 2 x ep 2 x dp 2 x tp 2, DualPipeV: overlapped with the paired microbatch = not overlapped, bitwise"
peak_is_predicted t2 e2t2 le2t2 p2 dv

# a checkpoint saved under ep 2 x tp 2 (the MoE tensors whole, written once) resumed under dp 2
ck() { timeout 120 "$B" launch -n "$1" -- "$B" train $G --quiet "${@:2}" >"$T/ck.log" 2>&1 || { bad "ck: $*"; tail -3 "$T/ck.log"; }; }
ck 4 --steps 2 --dp 2 --ep 2 --tp 2 --microbatches 1 --checkpoint-dir "$T/c"
ck 2 --steps 4 --dp 2 --microbatches 1 --checkpoint-dir "$T/c" --resume --save "$T/r"
near "$T/d2" "$T/r" "saved under ep 2 x tp 2, resumed under dp 2"

expect 2 "MoE layers under sequence parallelism are not built" train $G --tp 2 --sequence-parallel --steps 1 --quiet
finish 12
