#!/usr/bin/env bash
# tests/runtime/test_ep.sh: expert parallelism (--ep N) against one process holding every expert. Each
# replica routes its own tokens with the capacity of its own microbatch, so every comparison keeps the
# sequences per microbatch (batch / (dp x microbatches)) of its reference. Bitwise where the sums have the
# same order (dp 2 with one microbatch per replica: an expert's gradient is the sum of two blocks either
# way); within 1e-5 relative L2 elsewhere (the holder adds each microbatch's blocks of every member in
# turn, the data-parallel sum adds each replica's microbatches first). The routing is the same on every
# layout (the metrics' moe_dropped and moe_aux, rank by rank); pp 2 with 1F1B and DualPipeV (split and
# fused backwards, both copies) and ZB-V, and 1F1B's, DualPipeV's and ZB-V's all-to-alls overlapped with the
# paired microbatch (BRIGADE_TP_OVERLAP=microbatch) bitwise equal to it without; emulated paired runs form the
# pairs their programs have (1F1B, ZB-V, DualPipeV, DualPipe); on cpu-async with BRIGADE_STAGING=always (the
# all-to-alls staged through host memory) bitwise equal to the cpu backend;
# --zero 1 (the experts' optimizer state sharded over the replicas holding them) bitwise --zero 0;
# the peak memory is the prediction (expert shards, received rows); recomputation, variable lengths and bf16
# activations compose; --emulate runs the all-to-alls; checkpoints hold whole expert tensors and resume across ep 1, 2 and 4; bad
# layouts are refused.
. "$(dirname "$0")/../lib/harness.sh"
G="--layers 4 --d-model 16 --heads 4 --seq 16 --batch 8 --threads 1 --lr 3e-3 --experts 4 --top-k 2 --moe-every 2"
G="$G --capacity-factor 1.0 --moe-aux-coef 0.1"

# train NAME RANKS FLAGS...: train_save with the step's metrics in $T/NAME.jsonl
train() { local n=$1 r=$2; shift 2; train_save "$n" "$r" $G "$@" --metrics "$T/$n.jsonl"; }
# routing A B WHAT: A's and B's metrics have the same moe_dropped for every rank and step, and the same
# moe_aux bits at step 1 (later steps see weights that differ in their last bits where the runs are not bitwise)
routing_of() {
    grep -ho '"rank": [0-9]*, "step": [0-9]*\|"moe_aux": [^,]*, "moe_dropped": [0-9]*' "$T/$1.jsonl" | paste - - |
        awk -F'[ ,\t]+' '{print $2, $4, $10, ($4 == 1 ? $6 : "-")}' | sort -n -k1 -k2
}
routing() {
    local a b
    a=$(routing_of "$1") b=$(routing_of "$2")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "$3 ($(echo "$a" | wc -l) rank-steps)"
    else bad "$3: $(diff <(echo "$a") <(echo "$b") | head -4 | tr '\n' ' ')"; fi
}
# dropped NAME: each step's moe_dropped summed over the ranks, one line per step
dropped() {
    grep -ho '"step": [0-9]*\|"moe_dropped": [0-9]*' "$T/$1.jsonl" | paste - - |
        awk '{d[$2] += $4} END {for (s in d) print s, d[s]}' | sort -n
}

train ref 1 --steps 4 --microbatches 2
train d2m1 2 --steps 4 --dp 2 --microbatches 1
train e2m1 2 --steps 4 --dp 2 --ep 2 --microbatches 1
same "$T/d2m1" "$T/e2m1" "ep 2 x dp 2, one microbatch per replica = dp 2 bitwise"
near "$T/ref" "$T/e2m1" "ep 2 x dp 2 vs one process holding every expert"
routing d2m1 e2m1 "ep 2: every rank routes as under dp 2"
[ -n "$(dropped ref)" ] && [ "$(dropped ref)" = "$(dropped e2m1)" ] &&
    ok "the capacity dropped the same choices as one process, step by step: $(dropped ref | tr '\n' ' ')" ||
    bad "dropped choices: one process $(dropped ref | tr '\n' ' '), ep 2 $(dropped e2m1 | tr '\n' ' ')"

X="--steps 3 --microbatches 1 --recompute --seq-min 5 --precision bf16"
train xd 2 --dp 2 $X && train xe 2 --dp 2 --ep 2 $X &&
    same "$T/xd" "$T/xe" "ep 2 with recomputation, variable lengths and bf16 activations = dp 2 bitwise"
train d2 2 --steps 4 --dp 2 --microbatches 2
train d4 4 --steps 4 --dp 4 --microbatches 1
train e4 4 --steps 4 --dp 4 --ep 4 --microbatches 1 && near "$T/d4" "$T/e4" "ep 4 x dp 4 vs dp 4"
near "$T/d2" "$T/e4" "ep 4 x dp 4 vs dp 2 (the same microbatches)"
routing d4 e4 "ep 4: every rank routes as under dp 4"
train e24 4 --steps 4 --dp 4 --ep 2 --microbatches 1 && near "$T/d4" "$T/e24" \
    "ep 2 x dp 4: expert gradients summed over the 2 replicas holding them"
routing d4 e24 "ep 2 x dp 4: every rank routes as under dp 4"
p4=$(grep -m1 -o '"peak_bytes": [0-9]*' "$T/d4.jsonl" | grep -o '[0-9]*$')
p4e=$(grep -m1 -o '"peak_bytes": [0-9]*' "$T/e4.jsonl" | grep -o '[0-9]*$')
[ -n "$p4" ] && [ -n "$p4e" ] && [ "$p4e" -lt "$p4" ] && ok "ep 4 holds less: peak $p4e bytes against $p4 under dp 4" ||
    bad "ep 4 peak ${p4e:-?} bytes is not below dp 4's ${p4:-?}"

train p2d2 4 --steps 4 --pp 2 --dp 2 --microbatches 2
train p2e2 4 --steps 4 --pp 2 --dp 2 --ep 2 --microbatches 2 && near "$T/p2d2" "$T/p2e2" "pp 2 x ep 2 x dp 2, 1F1B"
train p2d2m4 4 --steps 4 --pp 2 --dp 2 --microbatches 4 --batch 16
DV="--steps 4 --pp 2 --dp 2 --ep 2 --microbatches 4 --batch 16 --schedule dualpipev"
train p2e2dv 4 $DV --trace "$T/dv.json" && near "$T/p2d2m4" "$T/p2e2dv" "pp 2 x ep 2 x dp 2, DualPipeV"
# BRIGADE_TP_OVERLAP=microbatch: DualPipeV's paired instructions run as two coroutines, each lane's all-to-alls
# on a group of its own, waited for by handing the thread to the other lane: the same exchanges (the trace's
# ep_a2a events, counted), some of them inside the second lane, and the weights bitwise those of the run without
a2a() { grep -o "\"tid\":$2,[^}]*\"op\":\"ep_a2a\"" "$T/$1.json" | wc -l; }
ZV="--steps 4 --pp 2 --dp 2 --ep 2 --microbatches 4 --batch 16 --schedule zbv"
train p2e2zv 4 $ZV && near "$T/p2d2m4" "$T/p2e2zv" "pp 2 x ep 2 x dp 2, ZB-V"
export BRIGADE_TP_OVERLAP=microbatch
train p2e2dvo 4 $DV --trace "$T/dvo.json" && same "$T/p2e2dv" "$T/p2e2dvo" \
    "pp 2 x ep 2 x dp 2, DualPipeV: all-to-alls overlapped with the paired microbatch = not overlapped, bitwise"
train p2e2o 4 --steps 4 --pp 2 --dp 2 --ep 2 --microbatches 2 && same "$T/p2e2" "$T/p2e2o" \
    "pp 2 x ep 2 x dp 2, 1F1B: paired = unpaired, bitwise"
# ZB-V pairs a W with the next forward: the forward's lane starts first (the W's runs second, lane 1)
train p2e2zvo 4 $ZV --trace "$T/zvo.json" && same "$T/p2e2zv" "$T/p2e2zvo" \
    "pp 2 x ep 2 x dp 2, ZB-V: paired = unpaired, bitwise"
w1=$(grep -o '"tid":2,[^}]*"op":"W"' "$T/zvo.json" | wc -l)
[ "$w1" -gt 0 ] && ok "ZB-V paired: $w1 W instructions in the second lane" || bad "ZB-V paired: no W in the second lane"
unset BRIGADE_TP_OVERLAP
n0=$(($(a2a dv 0) + $(a2a dv 2))) n1=$(($(a2a dvo 0) + $(a2a dvo 2))) l1=$(a2a dvo 2)
[ "$n0" -gt 0 ] && [ "$n0" = "$n1" ] && [ "$(a2a dv 2)" = 0 ] && [ "$l1" -gt 0 ] &&
    ok "paired: $n1 all-to-alls as unpaired, $l1 of them in the second lane" ||
    bad "all-to-alls: $n0 unpaired, $n1 paired ($l1 in the second lane)"
routing p2d2 p2e2 "pp 2 x ep 2: every rank routes as under pp 2 x dp 2"

# a backend whose buffers are staged through host memory (cpu-async with BRIGADE_STAGING=always, the stand-in
# for cuda; its copies land late and adversarially): the all-to-alls staged, the weights bitwise the cpu run's
# and the peak memory still the prediction (the staging's host blocks are not the backend's)
S="--backend cpu-async"
BRIGADE_LOG=info BRIGADE_STAGING=always train e2m1s 2 --steps 4 --dp 2 --ep 2 --microbatches 1 $S &&
    same "$T/e2m1" "$T/e2m1s" "ep 2 x dp 2 on cpu-async, staged through host memory = cpu, bitwise"
n=$(grep -c "all-to-alls staged through host memory" "$T/e2m1s.log")
[ "$n" = 2 ] && ok "both ranks staged their all-to-alls" || bad "ranks that staged their all-to-alls: ${n:-0} of 2"
BRIGADE_STAGING=always train p2e2dvs 4 $DV $S && same "$T/p2e2dv" "$T/p2e2dvs" \
    "pp 2 x ep 2 x dp 2, DualPipeV, staged on cpu-async = cpu, bitwise"
off=$(grep -o '"peak_bytes": [0-9]*, "predicted_bytes": [0-9]*' "$T/e2m1s.jsonl" | awk '$2 + 0 != $4 + 0' | head -3)
[ -s "$T/e2m1s.jsonl" ] && [ -z "$off" ] && ok "staged ep 2: peak memory = predicted on every rank and step" ||
    bad "staged ep 2: peak memory differs from the prediction: $off"

# --zero 1: the experts' optimizer state sharded over the replicas holding the same experts, the rest over dp;
# bitwise --zero 0 with the same ep (each run of a bucket reduce-scattered over its group: the owned sums are the
# all-reduce's, bit for bit); the state holds less, the peak is still the prediction, and a checkpoint resumes
train z24 4 --steps 4 --dp 4 --ep 2 --microbatches 1 --zero 1 && same "$T/e24" "$T/z24" \
    "ep 2 x dp 4, --zero 1 = --zero 0, bitwise"
train z2 2 --steps 4 --dp 2 --ep 2 --microbatches 1 --zero 1 && same "$T/e2m1" "$T/z2" \
    "ep 2 x dp 2 (experts held once: only the replicated tensors sharded), --zero 1 = --zero 0, bitwise"
train zp2 4 --steps 4 --pp 2 --dp 2 --ep 2 --microbatches 2 --zero 1 && same "$T/p2e2" "$T/zp2" \
    "pp 2 x ep 2 x dp 2, --zero 1 = --zero 0, bitwise"
pz=$(grep -m1 -o '"peak_bytes": [0-9]*' "$T/z24.jsonl" | grep -o '[0-9]*$')
pe=$(grep -m1 -o '"peak_bytes": [0-9]*' "$T/e24.jsonl" | grep -o '[0-9]*$')
off=$(cat "$T"/z24.jsonl "$T"/z2.jsonl "$T"/zp2.jsonl | grep -o '"peak_bytes": [0-9]*, "predicted_bytes": [0-9]*' |
    awk '$2 + 0 != $4 + 0' | head -3)
[ -n "$pz" ] && [ -n "$pe" ] && [ "$pz" -lt "$pe" ] && [ -z "$off" ] &&
    ok "ep 2 x dp 4, --zero 1: peak $pz bytes against $pe at --zero 0, = predicted on every rank and step" ||
    bad "ep 2 x dp 4, --zero 1: peak ${pz:-?} bytes (--zero 0: ${pe:-?}); off the prediction: $off"
timeout 120 "$B" launch -n 4 -- "$B" train $G --quiet --steps 2 --dp 4 --ep 2 --microbatches 1 --zero 1 \
    --checkpoint-dir "$T/cz" >"$T/cz.log" 2>&1 || bad "zero 1 checkpoint: $(tail -2 "$T/cz.log")"
timeout 120 "$B" launch -n 4 -- "$B" train $G --quiet --steps 4 --dp 4 --ep 2 --microbatches 1 --zero 1 \
    --checkpoint-dir "$T/cz" --resume --save "$T/czr" >"$T/cz.log" 2>&1 || bad "zero 1 resume: $(tail -2 "$T/cz.log")"
same "$T/z24" "$T/czr" "ep 2 x dp 4, --zero 1: saved at step 2, resumed to step 4 = run through, bitwise"

# the memory model counts the experts' shards and the rows a member receives: peak = prediction, to the byte
lines=$(cat "$T"/e4.jsonl "$T"/e24.jsonl "$T"/p2e2.jsonl "$T"/p2e2dv.jsonl | grep -c '"peak_bytes"')
off=$(cat "$T"/e4.jsonl "$T"/e24.jsonl "$T"/p2e2.jsonl "$T"/p2e2dv.jsonl | grep -o '"peak_bytes": [0-9]*, "predicted_bytes": [0-9]*' |
    awk '$2 + 0 != $4 + 0' | head -3)
[ "$lines" -gt 0 ] && [ -z "$off" ] && ok "peak memory = predicted on every rank and step of ep 4, ep 2 x dp 4, pp 2 x ep 2 ($lines lines)" ||
    bad "peak memory differs from the prediction: $off"

# paired, the prediction counts both lanes' buffers at once: a bound, reached or not as the lanes interleave
lines=$(grep -c '"peak_bytes"' "$T/p2e2dvo.jsonl")
off=$(grep -o '"peak_bytes": [0-9]*, "predicted_bytes": [0-9]*' "$T/p2e2dvo.jsonl" | awk '$2 + 0 > $4 + 0' | head -3)
[ "$lines" -gt 0 ] && [ -z "$off" ] && ok "paired: peak memory <= predicted on every rank and step ($lines lines)" ||
    bad "paired: peak memory above the prediction: $off"

# --emulate: the stages run no layer; the all-to-alls of the layers' expected sizes still run (bytes_sent counts
# them): within 30 % of the computing run's bytes (whose routing is not uniform)
"$B" profile --layers 4 --d-model 16 --heads 4 --seq 16 --experts 4 --top-k 2 --moe-every 2 --json "$T/prof.json" \
    >/dev/null 2>&1 || bad "brigade profile"
train p2e2emu 4 --steps 2 --pp 2 --dp 2 --ep 2 --microbatches 2 --emulate "$T/prof.json" --emulate-scale 10
mean_bytes() { grep -ho '"bytes_sent": [0-9]*' "$T/$1.jsonl" | awk '{s += $2; n++} END {if (n) printf "%d", s / n}'; }
re=$(mean_bytes p2e2) em=$(mean_bytes p2e2emu)
[ -n "$re" ] && [ -n "$em" ] && [ "$em" -gt $((re * 7 / 10)) ] && [ "$em" -lt $((re * 13 / 10)) ] &&
    ok "emulated pp 2 x ep 2 x dp 2 sends $em bytes per rank and step, computing $re" ||
    bad "emulated bytes per rank and step ${em:-?}, computing ${re:-?}"

# --emulate pairs too: under each schedule the paired run forms, in its last step, the pairs the pairing rule
# forms on the unpaired run's compute order (bench/ep_overlap.py --pairs), counted in the second lane
OV="$(dirname "$0")/../../bench/ep_overlap.py"
EM="--steps 2 --pp 2 --dp 2 --ep 2 --microbatches 4 --batch 16 --emulate $T/prof.json --emulate-scale 1"
for s in 1f1b zbv dualpipev dualpipe; do
    train em_$s 4 $EM --schedule $s --trace "$T/em_$s.json"
    BRIGADE_TP_OVERLAP=microbatch train emo_$s 4 $EM --schedule $s --trace "$T/emo_$s.json"
    read -r none want <<<"$(python3 "$OV" "$T/em_$s.jsonl" "$T/em_$s.json" "$s" 4 no --pairs)"
    read -r got _ <<<"$(python3 "$OV" "$T/emo_$s.jsonl" "$T/emo_$s.json" "$s" 4 yes --pairs)"
    [ "${none:-x}" = 0 ] && [ "${want:-0}" -gt 0 ] && [ "${got:-x}" = "$want" ] &&
        ok "emulated $s paired: $got pairs per step, as its program has" ||
        bad "emulated $s: ${got:-?} pairs formed, the program has ${want:-?} (unpaired formed ${none:-?})"
done

# checkpoints: whole expert tensors, resumed under another ep
ck() { timeout 120 "$B" launch -n "$1" -- "$B" train $G --quiet "${@:2}" >"$T/ck.log" 2>&1 || { bad "ck: $*"; tail -3 "$T/ck.log"; }; }
ck 2 --steps 2 --dp 2 --ep 2 --microbatches 1 --checkpoint-dir "$T/c2"
ck 2 --steps 4 --dp 2 --microbatches 1 --checkpoint-dir "$T/c2" --resume --save "$T/r21"
same "$T/d2m1" "$T/r21" "saved under ep 2, resumed under ep 1: bitwise"
ck 2 --steps 2 --dp 2 --microbatches 2 --checkpoint-dir "$T/c1"
ck 4 --steps 4 --dp 4 --ep 4 --microbatches 1 --checkpoint-dir "$T/c1" --resume --save "$T/r14"
near "$T/d2" "$T/r14" "saved under ep 1, resumed under ep 4"

expect 2 "ep 3 does not divide experts 4" train $G --ep 3 --steps 1 --quiet
expect 1 "ep 2 must divide dp 1" train $G --ep 2 --steps 1 --quiet
expect 1 "ep 2 with --zero 2 and 3 is not built yet" train $G --ep 2 --dp 2 --zero 2 --steps 1 --quiet
expect 1 "ep = 2 but model gpt has no expert-parallel MoE layers" train ${G/--experts 4/} --ep 2 --steps 1 --quiet
finish 42
