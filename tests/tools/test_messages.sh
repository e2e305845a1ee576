#!/usr/bin/env bash
# tests/tools/test_messages.sh: every command answers a usage error with exit
# 2 and one line that says what was wrong (with "did you mean" for a near
# miss); a JSON input it cannot use names the file and the reason (exit 1);
# the help claims only what is built.
. "$(dirname "$0")/../lib/harness.sh"

# misspelled flags, values, commands: exit 2 and a suggestion
expect 2 'brigade train: unknown option "--stpes" (did you mean --steps?)' train --stpes 3
expect 2 'unknown option "--stpes" (did you mean --steps?)' train --stpes=3
expect 2 'brigade train: --steps needs a value' train --steps
expect 2 'brigade train: --quiet takes no value' train --quiet=1
expect 2 'brigade train: option "--s" is ambiguous: --seq, --seed, --steps' train --s 3
expect 2 'brigade train: --schedule must be one of gpipe, 1f1b, interleaved, zb-h1, zb-h2, zbv, zb-interleaved, dualpipev or dualpipe, got "zbh1" (did you mean zb-h1?)' train --schedule zbh1
expect 2 'brigade train: --optimizer must be adamw or sgd, got "adam" (did you mean adamw?)' train --optimizer adam
expect 2 'brigade train: --model must be one of gpt, mlp or llama, got "gtp" (did you mean gpt?)' train --model gtp
expect 2 'brigade train: unknown option "--frobnicate" (see brigade train --help)' train --frobnicate
expect 2 'brigade: unknown command "trian" (did you mean train?)' trian
expect 2 'brigade schedule: --schedule must be one of gpipe, 1f1b, interleaved, zb-h1, zb-h2, zbv, zb-interleaved, dualpipev or dualpipe, got "zbh1" (did you mean zb-h1?)' \
    schedule --schedule zbh1 --stages 4 --microbatches 8
expect 2 'zbv places exactly 2 chunks per rank' schedule --schedule zbv --stages 4 --microbatches 4 --chunks 3
expect 2 'brigade schedule: invalid argument: dualpipe needs an even number of pipeline ranks (its two halves mirror each other), got 3' schedule --schedule dualpipe --stages 3 --microbatches 8
expect 1 'brigade train: invalid argument: dualpipe needs an even number of microbatches, at least 2p = 4 (m/2 enter from each end, at least p each), got 2' train --pp 2 --microbatches 2 --schedule dualpipe
expect 2 'brigade schedule: unknown option "--stage" (did you mean --stages?)' schedule --stage 4
expect 2 'brigade plan: unknown option "--devics" (did you mean --devices?)' plan --devics 2
expect 2 'brigade plan: --schedule must be one of gpipe, 1f1b, interleaved, zb-h1, zb-h2, zbv, zb-interleaved, dualpipev or dualpipe, got "zbh2" (did you mean zb-h2?)' \
    plan --devices 2 --mem 1G --schedule 1f1b,zbh2
expect 2 'brigade profile: unknown option "--microbatchsize" (did you mean --microbatch-size?)' profile --microbatchsize 2
expect 2 'brigade compare: unknown option "--rtl" (did you mean --rtol?)' compare --rtl 1 a b
expect 2 'brigade generate: unknown option "--promt" (did you mean --prompt?)' generate --promt x
expect 2 'brigade bench: unknown benchmark "kernel" (did you mean kernels?)' bench kernel
expect 2 'brigade bench kernels: unknown option "--thread" (did you mean --threads?)' bench kernels --thread 2
expect 2 'brigade bench schedule: unknown option "--stage" (did you mean --stages?)' bench schedule --stage 2
expect 2 'brigade bench p2p: --reps needs a value' bench p2p --reps
# a GEMM library brigade does not know: the backend is not created, the variable and value named
BRIGADE_GEMM=mkl expect 1 'brigade train: invalid argument: BRIGADE_GEMM="mkl": expected auto, openblas or onednn' train --steps 1
BRIGADE_FUSE=yes expect 1 'brigade train: invalid argument: BRIGADE_FUSE="yes": expected on or off' train --steps 1
expect 2 'brigade info: takes no arguments, got "x"' info x

# a split that does not fit the model is a usage error, said once
expect 2 'brigade train: --split sums to 18 layers but the model has 7 (brigade profile lists them)' train --pp 2 --split 9,9
expect 2 'brigade train: --split has 1 entries but there are 2 pipeline stages' train --pp 2 --split 7

# a parallel layout started as one process says how to launch it
expect 2 'pp 2 x dp 2 = 4 ranks, but this is a single process; start one process per rank with a launcher:' train --pp 2 --dp 2 --steps 1 --layers 1 --d-model 16 --heads 2 --seq 16
for l in 'brigade launch -n 4 -- brigade train' 'torchrun --nproc-per-node 4' 'mpirun -n 4 brigade train'; do
    grep -qF -- "$l" "$T/err" && ok "launch hint names: $l" || bad "launch hint lacks '$l': $(cat "$T/err")"
done

# JSON inputs: the file and the reason, not the parser's internals
echo '[1, 2]' >"$T/array.json"
printf '{"pp": ' >"$T/cut.json"
for c in "train --plan" "schedule --from-json"; do
    expect 1 "brigade ${c%% *}: cannot open $T/missing.json: No such file or directory" $c "$T/missing.json"
    expect 1 "brigade ${c%% *}: $T/array.json: expected a JSON object, found an array" $c "$T/array.json"
    expect 1 "brigade ${c%% *}: $T/cut.json: line 1 column" $c "$T/cut.json"
    grep -q "malformed\|line -1" "$T/err" && bad "$c: parser internals in: $(cat "$T/err")" || ok "$c: no parser internals"
done

# plan: uncalibrated predictions say so; --flops calibrates
"$B" plan --devices 2 --mem 1G >"$T/out" 2>"$T/err" || bad "plan failed: $(cat "$T/err")"
grep -q "predicted (UNCALIBRATED): step" "$T/out" && ok "plan marks uncalibrated times" || bad "plan: no UNCALIBRATED: $(cat "$T/out")"
grep -q "warning: uncalibrated" "$T/err" && ok "plan warns on stderr" || bad "plan: no warning on stderr"
"$B" plan --devices 2 --mem 1G --flops 5e10 >"$T/out" 2>"$T/err" || bad "plan --flops failed"
grep -q "UNCALIBRATED\|uncalibrated" "$T/out" "$T/err" && bad "plan --flops still says uncalibrated" || ok "plan --flops is calibrated"

# claims: the help names tensor-parallel training (brigade train --tp) and lists the backends brigade info reports
"$B" --help >"$T/help"
grep -qi "tensor-parallel training" "$T/help" && "$B" train --help | grep -q -- "--tp N" && ok "--help: tensor-parallel training, train --tp" || bad "--help lacks tensor-parallel training or train --tp"
backends=$("$B" info | sed -n 's/^backends: *//p')
grep -qF "Backends compiled in: $backends" "$T/help" && ok "--help lists backends: $backends" || bad "--help backends differ from info ($backends): $(cat "$T/help")"
"$B" train --help | grep -q "model-stageNNN.safetensors" && ok "--save help names the per-stage files" || bad "--save help lacks model-stageNNN"
"$B" train --help | grep -q "ln_f and the head count as one layer" && ok "--split help says how layers count" || bad "--split help"

finish
