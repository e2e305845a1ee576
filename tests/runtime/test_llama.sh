#!/usr/bin/env bash
# tests/runtime/test_llama.sh: the Llama builder (--model llama) end to end. Pipelines give one process's
# weights bitwise (fp32, bf16, tied embeddings, recomputation, every schedule family), data parallelism
# within tolerance and ZeRO-1 bitwise that; tensor parallelism (also with
# sequence parallelism and with a pipeline) within tolerance of tp 1; a tp that does not divide --kv-heads
# is refused naming the numbers; a checkpoint resumes bitwise (also on another pipeline layout; a tp 2 one
# within tolerance); generate samples
# from a Llama checkpoint.
. "$(dirname "$0")/../lib/harness.sh"
export BRIGADE_TIMEOUT=60
L="--model llama --layers 4 --d-model 16 --heads 4 --kv-heads 2 --seq 16 --batch 8 --microbatches 4 --threads 1 --lr 3e-3"

train_save ref 1 $L --steps 8
for s in "--pp 2 --schedule gpipe" "--pp 2 --schedule 1f1b" "--pp 3 --schedule zb-h1" \
         "--pp 2 --schedule interleaved --chunks 2" "--pp 2 --schedule dualpipev" "--pp 2 --schedule zbv"; do
  n=$(echo "$s" | sed 's/--pp \([0-9]\).*/\1/')
  name=pp$(echo "$s" | tr -c 'a-z0-9' _)
  train_save "$name" "$n" $L --steps 8 $s && same "$T/ref" "$T/$name" "llama $s bitwise"
done
train_save rc 2 $L --steps 8 --pp 2 --schedule zb-h1 --recompute && same "$T/ref" "$T/rc" "llama pp 2 zb-h1 --recompute bitwise"
train_save dp2 2 $L --steps 8 --dp 2 --microbatches 2 && near "$T/ref" "$T/dp2" "llama dp 2 vs one process"
train_save z1 2 $L --steps 8 --dp 2 --microbatches 2 --zero 1 && same "$T/dp2" "$T/z1" "llama dp 2 ZeRO-1 = dp 2 bitwise"
train_save bf 1 $L --steps 8 --precision bf16
train_save bf2 2 $L --steps 8 --precision bf16 --pp 2 --schedule 1f1b && same "$T/bf" "$T/bf2" "llama bf16 pp 2 bitwise"
v=$("$B" compare "$T/ref" "$T/bf" --rel-l2 1e-2) && ! "$B" compare "$T/ref" "$T/bf" >/dev/null 2>&1 \
  && ok "bf16 near fp32, not its bits: $v" || bad "bf16 vs fp32: $v"
train_save tie 1 $L --steps 8 --tie-embeddings
train_save tie2 2 $L --steps 8 --tie-embeddings --pp 2 && same "$T/tie" "$T/tie2" "llama tied embeddings pp 2 bitwise"

# tensor parallelism: heads and kv heads split (2 kv groups over 2 members), within tolerance
train_save tp2 2 $L --steps 8 --tp 2 && near "$T/ref" "$T/tp2" "llama tp 2 vs tp 1"
train_save sp2 2 $L --steps 8 --tp 2 --sequence-parallel && near "$T/ref" "$T/sp2" "llama tp 2 sequence parallel vs tp 1"
train_save tppp 4 $L --steps 8 --tp 2 --pp 2 && near "$T/ref" "$T/tppp" "llama tp 2 x pp 2 vs one process"
# (checked before any rank connects: one process shows it)
expect 2 "tp 2: layer blocks.0.attn has 1 key/value heads (--kv-heads), which tp 2 does not divide" \
  train $L --kv-heads 1 --tp 2 --steps 1 --quiet

# checkpoints: stopped at 4, resumed to 8 (one process; and on pp 2) = the uninterrupted run, bitwise
"$B" train $L --steps 4 --quiet --checkpoint-dir "$T/c1" >/dev/null 2>&1 || bad "llama run to 4"
"$B" train $L --steps 8 --quiet --checkpoint-dir "$T/c1" --resume --save "$T/r1" >/dev/null 2>&1 || bad "llama resume"
same "$T/ref" "$T/r1" "llama resumed at 4"
timeout 120 "$B" launch -n 2 -- "$B" train $L --steps 8 --pp 2 --quiet --checkpoint-dir "$T/c1" --resume \
  --save "$T/r2" >/dev/null 2>&1 || bad "llama resume on pp 2"
same "$T/ref" "$T/r2" "llama checkpoint of one process resumed on pp 2"
# a tp 2 checkpoint (each member's slices of whole kv groups) resumed by one process
timeout 120 "$B" launch -n 2 -- "$B" train $L --steps 4 --tp 2 --quiet --checkpoint-dir "$T/c3" >/dev/null 2>&1 \
  || bad "llama tp 2 run to 4"
"$B" train $L --steps 8 --quiet --checkpoint-dir "$T/c3" --resume --save "$T/r3" >/dev/null 2>&1 || bad "tp 2 resume"
near "$T/ref" "$T/r3" "llama tp 2 checkpoint resumed by one process"

# generate: a Llama checkpoint samples; the same seed gives the same text
for i in 1 2; do
  timeout 60 "$B" generate --checkpoint "$T/c1" --prompt "And God said" --tokens 12 --seed 3 >"$T/g$i" 2>"$T/ge$i" \
    || { bad "generate from a llama checkpoint: $(cat "$T/ge$i")"; }
done
[ "$(wc -c <"$T/g1")" -ge 24 ] && cmp -s "$T/g1" "$T/g2" && ok "generate: $(head -c 40 "$T/g1" | tr '\n' ' ')" \
  || bad "generate output: $(cat "$T/g1")"
# the key/value cache gives the tokens of recomputing every context (within --seq 16 and past it)
timeout 60 "$B" generate --checkpoint "$T/c1" --prompt "And God said" --tokens 12 --seed 3 --no-kv-cache >"$T/g3" \
  2>/dev/null && cmp -s "$T/g1" "$T/g3" && ok "generate with the cache = without" || bad "cache: $(cat "$T/g1") vs $(cat "$T/g3")"
finish 21
