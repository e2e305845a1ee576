#!/usr/bin/env bash
# tests/runtime/test_resume.sh: checkpoints and resume. A run stopped and
# resumed ends with the weights of one that never stopped, bitwise, also when
# it resumes under another layout (resharding); SIGTERM writes a checkpoint
# at the next step boundary and exits cleanly; bad checkpoints are refused.
. "$(dirname "$0")/../lib/harness.sh"
export BRIGADE_TIMEOUT=60
GPT="--model gpt --layers 5 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 4 --threads 1 --lr 3e-3 --quiet"

"$B" train $GPT --steps 20 --save "$T/ref20" >/dev/null 2>&1 || bad "reference run"
# stopped at 10, resumed to 20, same layout (one process)
"$B" train $GPT --steps 10 --checkpoint-dir "$T/c1" >/dev/null 2>&1 && \
"$B" train $GPT --steps 20 --checkpoint-dir "$T/c1" --resume --save "$T/r1" >/dev/null 2>"$T/e1" || { bad "resume run"; cat "$T/e1"; }
grep -q "resuming from $T/c1/step-00000010 (written by pp=1 dp=1)" "$T/e1" && ok "resume says where it starts" || bad "no resume message"
same "$T/ref20" "$T/r1" "one process, resumed at 10"
# written by 2 pipeline stages (every 5 steps, keep 2), resumed by 3 stages with ZB-H1
timeout 120 "$B" launch -n 2 -- "$B" train $GPT --steps 10 --pp 2 --checkpoint-dir "$T/c2" --checkpoint-every 5 --keep 2 >/dev/null 2>&1 || bad "pp 2 run"
[ "$(ls "$T/c2" | grep -c '^step-')" = 2 ] && ok "keep 2: $(ls "$T/c2" | tr '\n' ' ')" || bad "keep 2: $(ls "$T/c2")"
# (--pp auto: 3 stages from the 3 ranks, as a job brigade launch --elastic restarts on another world)
timeout 120 "$B" launch -n 3 -- "$B" train $GPT --steps 20 --pp auto --schedule zb-h1 --checkpoint-dir "$T/c2" --resume --save "$T/r2" >/dev/null 2>"$T/e2" || { bad "pp 3 resume"; cat "$T/e2"; }
same "$T/ref20" "$T/r2" "pp 2 checkpoint resumed on pp 3 (resharding)"
grep -qF "resuming from $T/c2/step-00000010 (written by pp=2 dp=1) at step 10: layout pp=2 dp=1 -> pp=3 dp=1" "$T/e2" &&
    ok "the resume names the layout change" || { bad "no layout change said"; cat "$T/e2"; }
# --dp auto must divide: 3 ranks over pp 2 is refused on every rank before anything connects
timeout 60 "$B" launch -n 3 -- "$B" train $GPT --steps 1 --pp 2 --dp auto >/dev/null 2>"$T/e5"; rc=$?
[ $rc = 2 ] && grep -q -- "--dp auto: the job has 3 ranks, not a multiple of pp 2 x tp 1" "$T/e5" && ok "--dp auto over 3 ranks and pp 2 refused" || { bad "--dp auto: rc $rc"; cat "$T/e5"; }
# SIGTERM: checkpoint at the next step boundary, exit 143 (128 + SIGTERM), resumable
"$B" train $GPT --steps 1000000 --checkpoint-dir "$T/c3" >"$T/o3" 2>"$T/e3" &
pid=$!
sleep 2
kill -TERM $pid
wait $pid; rc=$?
[ "$rc" = 143 ] && ok "SIGTERM: exit 143" || { bad "SIGTERM: exit $rc"; cat "$T/e3"; }
k=$(ls "$T/c3" | grep '^step-' | sed 's/step-0*//' | sort -n | tail -1)
[ -n "$k" ] && grep -q "stopped after step $k" "$T/e3" && ok "SIGTERM: checkpoint of step $k" || { bad "SIGTERM: no checkpoint"; cat "$T/e3"; }
if [ -n "$k" ]; then
  "$B" train $GPT --steps $((k + 3)) --save "$T/ref3" >/dev/null 2>&1
  "$B" train $GPT --steps $((k + 3)) --checkpoint-dir "$T/c3" --resume --save "$T/r3" >/dev/null 2>&1
  same "$T/ref3" "$T/r3" "resumed after SIGTERM at step $k"
fi
# a corrupted checkpoint is refused by --resume-strict, naming the file; training does not start
# (plain --resume skips it for an older one: tests/checkpoint/test_resume_safety.sh)
f=$(ls "$(ls -d "$T/c1"/step-* | tail -1)"/rank-*.safetensors | head -1)
printf 'garbage' | dd of="$f" bs=1 seek=200 conv=notrunc 2>/dev/null
if "$B" train $GPT --steps 30 --checkpoint-dir "$T/c1" --resume --resume-strict >/dev/null 2>"$T/e4"; then bad "corrupted checkpoint accepted"
else grep -q "rank-" "$T/e4" && ok "corrupted checkpoint refused: $(tail -1 "$T/e4" | cut -c1-150)" || { bad "message"; cat "$T/e4"; }; fi
# a checkpoint of another model is refused
if "$B" train $GPT --d-model 32 --steps 30 --checkpoint-dir "$T/c2" --resume >/dev/null 2>"$T/e5"; then bad "other model's checkpoint accepted"
else ok "other model refused: $(tail -1 "$T/e5" | cut -c1-150)"; fi
finish
