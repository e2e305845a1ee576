#!/usr/bin/env bash
# tests/runtime/test_agree.sh: agreement at start. Ranks of one job started
# with different settings (the learning rate, the schedule, the model, the
# optimizer, the data seed) fail at once, every rank with the same one line naming the
# first field that differs and the ranks that differ from rank 0, where they
# used to wait BRIGADE_TIMEOUT or train silently wrong; ranks that agree
# train as before.
. "$(dirname "$0")/../lib/harness.sh"
G="--model gpt --layers 4 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 4 --steps 2 --threads 1 --quiet"

# disagree NAME FIELD RANK0-FLAGS OTHER-FLAGS [N]: rank 0 gets RANK0-FLAGS, the others OTHER-FLAGS
disagree() {
    local name=$1 field=$2 a=$3 b=$4 n=${5:-2}
    local t0 ms rc
    t0=$(now_us)
    timeout -s KILL 120 "$B" launch -n "$n" -- bash -c \
        "if [ \$BRIGADE_RANK = 0 ]; then f='$a'; else f='$b'; fi; exec '$B' train $G --pp 2 --dp $((n / 2)) \$f" \
        >"$T/out" 2>"$T/err"
    rc=$? ms=$(ms_since "$t0")
    local want="the ranks of this job disagree on the $field"
    check "$name: the job fails (exit $rc)" [ "$rc" != 0 ]
    check "$name: every rank names the $field ($(grep -c "$want" "$T/err") of $n lines)" \
        [ "$(grep -c "brigade train: mismatch: $want" "$T/err")" = "$n" ]
    check "$name: at start, not after BRIGADE_TIMEOUT ($ms ms)" [ "$ms" -lt 30000 ]
    check "$name: nothing trained" [ ! -s "$T/out" ]
}
disagree "--lr" "optimizer and its hyper-parameters: rank 1 differs from rank 0" "--lr 1e-3" "--lr 2e-3"
disagree "--schedule" "schedule program: rank 1 differs from rank 0" "--schedule 1f1b" "--schedule gpipe"
disagree "--d-model" "model description: ranks 1, 2, 3 differ from rank 0" "--d-model 16" "--d-model 32" 4
disagree "--optimizer" "optimizer and its hyper-parameters: ranks 1, 2, 3 differ" "--optimizer adamw" "--optimizer sgd" 4
disagree "--data-seed" "data seed: rank 1 differs from rank 0" "--data-seed 1" "--data-seed 2"

# ranks that agree still train (and say nothing of it)
timeout -s KILL 120 "$B" launch -n 2 -- "$B" train $G --pp 2 >"$T/out" 2>"$T/err"
rc=$?
check "agreeing ranks train (exit $rc)" [ $rc = 0 ]
check "and say nothing of agreement" bash -c "! grep -q disagree '$T/err'"
finish 21
