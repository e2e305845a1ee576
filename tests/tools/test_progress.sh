#!/usr/bin/env bash
# tests/tools/test_progress.sh: `brigade train`'s progress when stderr is not
# a terminal: a line every --log-every steps (and the first and last) with
# loss, learning rate, throughput, elapsed time and ETA; a pipeline split
# that is unbalanced in FLOPs is warned about once per job, not per rank.
. "$(dirname "$0")/../lib/harness.sh"
TINY="--layers 1 --d-model 16 --heads 2 --seq 16 --batch 4 --microbatches 2 --threads 1"

timeout 120 "$B" train $TINY --steps 7 --lr 2e-3 --log-every 3 >"$T/out" 2>"$T/err" || bad "train failed: $(cat "$T/err")"
steps=$(sed -n 's|^step \([0-9]*\)/7 .*|\1|p' "$T/err" | tr '\n' ' ')
[ "$steps" = "1 3 6 7 " ] && ok "--log-every 3 prints steps 1 3 6 7" || bad "--log-every 3 printed steps '$steps': $(cat "$T/err")"
re='^step [0-9]+/7 loss [0-9.]+ gnorm [0-9.e+-]+ lr 2\.00e-03 tokens/s [0-9]+ step_ms [0-9.]+ elapsed [0-9]+:[0-9]{2} eta [0-9]+:[0-9]{2}$'
n=$(grep -cE "$re" "$T/err")
[ "$n" = 4 ] && ok "progress lines carry loss, gnorm, lr, tokens/s, step_ms, elapsed, eta" || bad "progress format ($n of 4 match): $(cat "$T/err")"
timeout 120 "$B" train $TINY --steps 3 --quiet >"$T/out" 2>"$T/err" || bad "quiet train failed"
# (a warning, such as OpenBLAS kernels narrower than the CPU, may still be said)
grep -qvE '^\[brigade .*(WARN|INFO)' "$T/err" && bad "--quiet printed progress: $(cat "$T/err")" || ok "--quiet prints no progress"

# the default even split of a 2-block GPT over 2 stages (embedding + 2 blocks | ln_f + head)
# leaves stage 0 with most of the FLOPs: warned once, by rank 0
MID="--layers 2 --d-model 64 --heads 2 --seq 16 --batch 4 --microbatches 2 --threads 1"
timeout 120 "$B" launch -n 2 -- "$B" train $MID --steps 1 --pp 2 >"$T/out" 2>"$T/err" || bad "pp 2 run failed: $(cat "$T/err")"
n=$(grep -c "warning: the default split (even in layers) 3,2 is unbalanced in FLOPs: stage 0" "$T/err")
[ "$n" = 1 ] && ok "unbalanced split warned once" || bad "unbalanced split warned $n times: $(cat "$T/err")"
grep -q "brigade plan --devices 2 --mem SIZE --pp 2" "$T/err" && ok "warning points to brigade plan" || bad "warning lacks brigade plan"
timeout 120 "$B" launch -n 2 -- "$B" train $MID --steps 1 --pp 2 --split 2,3 >"$T/out" 2>"$T/err" || bad "pp 2 --split 2,3 failed: $(cat "$T/err")"
grep -q "unbalanced" "$T/err" && bad "balanced --split 2,3 warned: $(cat "$T/err")" || ok "a balanced --split is not warned about"

finish
