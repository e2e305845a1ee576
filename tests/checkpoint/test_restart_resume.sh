#!/usr/bin/env bash
# tests/checkpoint/test_restart_resume.sh: a crash, a restart, a resume. A
# 2-stage pipeline job runs under `brigade launch --max-restarts 2`; on the
# first attempt rank 1's trainer is SIGKILLed once a checkpoint exists
# (wherever the other rank is: mid-step, mid-save). The launcher stops the
# job and restarts it; the trainers resume from the newest complete
# checkpoint; the final weights equal, bitwise, those of a run that never
# crashed.
. "$(dirname "$0")/../lib/harness.sh"
export BRIGADE_TIMEOUT=20
GPT="--model gpt --layers 3 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 4 --threads 1 --quiet"
STEPS=150

"$B" train $GPT --steps $STEPS --save "$T/ref" >/dev/null 2>&1 || bad "reference run"

cat >"$T/job.sh" <<SH
#!/bin/bash
run() { "$B" train $GPT --steps $STEPS --pp 2 --checkpoint-dir "$T/ckpt" --checkpoint-every 4 --keep 2 --resume --save "$T/out"; }
echo "rank \$BRIGADE_RANK attempt \$BRIGADE_RESTART_COUNT" >>"$T/attempts"
if [ "\$BRIGADE_RESTART_COUNT" = 0 ] && [ "\$BRIGADE_RANK" = 1 ]; then
    run & p=\$!
    until ls "$T/ckpt"/step-*/manifest.json >/dev/null 2>&1; do kill -0 \$p 2>/dev/null || exit 99; sleep 0.005; done
    kill -KILL \$p
    wait \$p
    exit 137
fi
run
SH
chmod +x "$T/job.sh"
timeout -s KILL 100 "$B" launch -n 2 --max-restarts 2 --grace 2 -- "$T/job.sh" >"$T/out.log" 2>"$T/err"
rc=$?
cat "$T/err" | grep -v '^\[brigade' | head -20
[ $rc = 0 ] && ok "the job succeeds after a restart" || bad "launcher exit $rc"
grep -q '^brigade launch: rank 1 (pid [0-9]*) exited with status 137' "$T/err" && ok "rank 1's crash is reported" || bad "no crash report"
grep -q '^brigade launch: restart 1 of 2: ' "$T/err" && ok "restart 1 of 2" || bad "no restart line"
grep -q 'restart 2 of 2' "$T/err" && bad "a second restart" || ok "one restart was enough"
[ "$(grep -c 'attempt 1' "$T/attempts")" = 2 ] && ok "both ranks ran again" || bad "attempts: $(cat "$T/attempts")"
grep -q "resuming from " "$T/err" && ok "the trainers resumed: $(grep -m1 'resuming from ' "$T/err")" || bad "no resume"
v=$("$B" compare "$T/ref" "$T/out") && ok "final weights bitwise equal to the uninterrupted run: $v" || bad "weights differ: $v"
ls "$T/ckpt" | grep -q tmp && bad "a .tmp directory is left: $(ls "$T/ckpt")" || ok "no .tmp left: $(ls "$T/ckpt" | tr '\n' ' ')"
finish
