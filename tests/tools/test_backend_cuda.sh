#!/usr/bin/env bash
# tests/tools/test_backend_cuda.sh: `--backend cuda` where it cannot run (no
# CUDA build, or no GPU: the CI machines) answers one line and exits 1, never
# a crash; brigade info says why the backend is unusable. On a machine with a
# GPU the same commands must succeed instead.
. "$(dirname "$0")/../lib/harness.sh"

small=(--steps 1 --layers 1 --d-model 16 --heads 2 --seq 16 --batch 2 --microbatches 1)
if ! "$B" info | grep -q '^backends:.* cuda'; then
    expect 1 'brigade train: not supported: backend "cuda" is not compiled in' train --backend cuda "${small[@]}"
elif "$B" info | grep -q '^cuda: device 0 usable'; then
    timeout -s KILL 120 "$B" train --backend cuda "${small[@]}" >"$T/out" 2>"$T/err" &&
        ok "a GPU is present: train --backend cuda ran" || bad "train --backend cuda on a GPU: $(cat "$T/err")"
else
    "$B" info | grep -q '^cuda: compiled in, not usable here: cuda backend: no CUDA device' &&
        ok "info says the cuda backend is unusable and why" || bad "info: $("$B" info | head -3)"
    expect 1 'brigade train: not supported: cuda backend: no CUDA device' train --backend cuda "${small[@]}"
    [ "$(wc -l <"$T/err")" -eq 1 ] && ok "one line" || bad "more than one line: $(cat "$T/err")"
fi
if "$B" info | grep -q '^backends:.* cuda'; then
    # the system UCX: staged; a build linking the CUDA-aware UCX wheel: direct where UCX reads CUDA memory
    "$B" info | grep -q '^cuda: device buffers between ranks: \(staged through pinned host memory\|handed to UCX directly .*CUDA-aware UCX at /\)' &&
        ok "info says how device buffers travel between ranks" || bad "info: $("$B" info | grep '^cuda')"
fi
finish
