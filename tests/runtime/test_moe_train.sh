#!/usr/bin/env bash
# tests/runtime/test_moe_train.sh: GPT and Llama models with MoE blocks (--experts) end to end. Pipelines
# give one process's weights bitwise (also in bf16, and with an MoE block on a middle stage, whose
# load-balancing gradient needs the step's loss scale there too); 2 threads give 1 thread's bits; data
# parallelism within tolerance; the load-balancing loss changes the weights; the MoE fields travel in the
# model's JSON, so a checkpoint resumes bitwise; tp with sequence parallelism and experts is refused (tp
# without it: test_ep_tp.sh).
. "$(dirname "$0")/../lib/harness.sh"
export BRIGADE_TIMEOUT=60
G="--layers 4 --d-model 16 --heads 4 --seq 16 --batch 8 --microbatches 4 --threads 1 --lr 3e-3 --experts 4 --top-k 2"
G="$G --moe-every 2 --capacity-factor 1.25 --moe-aux-coef 0.1"

train_save ref 1 $G --steps 8
train_save pp2 2 $G --steps 8 --pp 2 && same "$T/ref" "$T/pp2" "moe gpt pp 2 bitwise"
train_save pp3 3 $G --steps 8 --pp 3 --schedule zb-h1 && same "$T/ref" "$T/pp3" "moe gpt pp 3 zb-h1 bitwise"
train_save dp2 2 $G --steps 8 --dp 2 --microbatches 2 && near "$T/ref" "$T/dp2" "moe gpt dp 2 vs one process"
train_save th2 1 $G --steps 8 --threads 2 && same "$T/ref" "$T/th2" "moe gpt on 2 threads = 1 thread bitwise"
train_save bf 1 $G --steps 8 --precision bf16
train_save bf2 2 $G --steps 8 --precision bf16 --pp 2 && same "$T/bf" "$T/bf2" "moe gpt bf16 pp 2 bitwise"
train_save noaux 1 $G --steps 8 --moe-aux-coef 0
! "$B" compare "$T/ref" "$T/noaux" >/dev/null 2>&1 && ok "the load-balancing loss changes the weights" \
  || bad "--moe-aux-coef 0 gave the weights of 0.1"
grep -q "blocks.1.mlp.moe.router" <(strings "$T/ref/model.safetensors") && ! grep -q "blocks.0.mlp.moe" \
  <(strings "$T/ref/model.safetensors") && ok "--moe-every 2: blocks 1 and 3 are MoE" || bad "MoE blocks misplaced"

L="--model llama --layers 2 --d-model 16 --heads 4 --kv-heads 2 --seq 16 --batch 8 --microbatches 4 --threads 1"
L="$L --lr 3e-3 --experts 4 --top-k 1 --moe-gate sigmoid --ffn-hidden 24"
train_save lref 1 $L --steps 8
train_save lpp2 2 $L --steps 8 --pp 2 --schedule 1f1b && same "$T/lref" "$T/lpp2" "moe llama pp 2 bitwise"
train_save ldp2 2 $L --steps 8 --dp 2 --microbatches 2 && near "$T/lref" "$T/ldp2" "moe llama dp 2 vs one process"

# checkpoints: stopped at 4, resumed to 8 = the uninterrupted run, bitwise (the MoE fields come from the file)
"$B" train $G --steps 4 --quiet --checkpoint-dir "$T/c1" >/dev/null 2>&1 || bad "moe run to 4"
"$B" train $G --steps 8 --quiet --checkpoint-dir "$T/c1" --resume --save "$T/r1" >/dev/null 2>&1 || bad "moe resume"
same "$T/ref" "$T/r1" "moe gpt resumed at 4"
expect 2 "MoE layers under sequence parallelism are not built" train $G --tp 2 --sequence-parallel --steps 1 --quiet
expect 2 "top_k 5 must be in 1 .. min(experts 4, 64)" train $G --top-k 5 --steps 1 --quiet
finish 12
