#!/usr/bin/env bash
# tests/tools/test_stop_signal.sh: a stop request (SIGTERM, SIGINT) at any
# moment of a one-process `brigade train` ends it with 128 + the signal and
# its one line, never an abort. oneDNN 2.x's JIT sgemm kernels point rsp at
# the heap while they run (a oneDNN bug, fixed in 3.11): a signal handled meanwhile
# wrote its frame there, and 6 of 40 SIGTERMs at random moments ended in
# "corrupted size vs. prev_size" (exit 134) before the CPU backend held
# signals around oneDNN (kernels/cpu/cpu_impl.h). Here d_model 128, where
# GEMMs take most of a step: with the hold made a no-op, 13 and 19 of 40 runs
# aborted; 30 signals, so a broken hold passes by chance about once in 10^6
# (where oneDNN is not used, e.g. no AVX-512, this tests the stop alone).
. "$(dirname "$0")/../lib/harness.sh"

gemm=$("$B" info | grep '^gemm:' | head -1)
echo "as installed: $gemm"
G=(--model gpt --layers 2 --d-model 128 --heads 2 --seq 64 --batch 8 --microbatches 1 --threads 1 --lr 1e-3)
n=30 wrong=0 msg=0 aborted=0
for i in $(seq $n); do
    sig=TERM code=143 line="interrupted at step"
    [ $((i % 5)) = 0 ] && sig=INT code=130
    rm -f "$T/m.jsonl"
    timeout -s KILL 60 "$B" train "${G[@]}" --steps 1000000 --quiet --metrics "$T/m.jsonl" >"$T/out" 2>"$T/err" &
    p=$!
    # training has begun (the handler is in place: a signal before it would end the run silently) ...
    for _ in $(seq 300); do [ "$(wc -l 2>/dev/null <"$T/m.jsonl" || echo 0)" -ge 2 ] && break; sleep 0.1; done
    # ... then a random moment (0-0.69 s later): inside a GEMM, or not
    sleep "$(printf '0.%02d' $((RANDOM % 70)))"
    pkill -"$sig" -P "$p" -x brigade 2>/dev/null || kill -"$sig" "$p"
    wait "$p"
    rc=$?
    if [ "$rc" != "$code" ]; then
        wrong=$((wrong + 1))
        [ "$rc" = 134 ] && aborted=$((aborted + 1))
        echo "  SIG$sig $i: exit $rc: $(tail -2 "$T/err" | tr '\n' ' ')"
    elif ! grep -q "^$line [0-9]*, nothing saved" "$T/err"; then
        msg=$((msg + 1))
        echo "  SIG$sig $i: exit $rc without '$line N, nothing saved': $(tail -2 "$T/err" | tr '\n' ' ')"
    fi
done
[ "$wrong" = 0 ] && ok "$n stop signals at random moments: each run exited 128 + the signal" ||
    bad "$wrong of $n stop signals did not end the run with 128 + the signal ($aborted aborted: heap corruption?)"
[ "$msg" = 0 ] && ok "each said where it stopped" || bad "$msg runs stopped without saying where"
finish
