#!/usr/bin/env bash
# tests/runtime/test_ps_failures.sh: failures in the parameter-server mode
# (docs/parameter_server.md, "Failures").
# - A worker SIGKILLed mid-run under brigade launch (which tolerates the
#   workers of brigade train --ps S by itself, with no --tolerate-ranks): the
#   servers go on with the live workers (the sum rescaled), the job runs all
#   its steps, the weights are finite, server 0 names the dead worker and the
#   step, the launcher says it tolerated it, no survivor fails, and the exit
#   code is the dead worker's (137), not 0.
# - A server SIGKILLed mid-run: every rank stops within seconds, the launcher
#   names the server and so do the ranks that saw it die.
# - SIGTERM to the launcher (a stop request on every rank), K = 0 and 2:
#   every rank stops at a step the servers agree on (the workers' pushes
#   carry the request), server 0 writes the checkpoint of that step, exit 143,
#   no rank killed, and no push left unreceived (UCX would warn of unmatched
#   messages at teardown).
# - A checkpoint written by the servers (full named tensors) resumes under
#   --dp: the K = 0 run resumed with --dp 2 ends bitwise where the
#   uninterrupted --dp 2 run ends, and the other way round.
set -u
B=${BRIGADE:?path of the brigade binary}
. "${BRIGADE_SOURCE_DIR:?}/tests/lib/checks.sh"
G="--model gpt --layers 2 --d-model 32 --heads 2 --seq 32 --batch 12 --microbatches 1 --threads 1 --lr 1e-3"

# rank_pid JOB R: the pid of rank R of the job started as JOB (timeout -> launcher -> ranks)
rank_pid() {
  local lp p
  for lp in $(pgrep -P "$1"); do
    for p in $(pgrep -P "$lp"); do
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "BRIGADE_RANK=$2" && echo "$p"
    done
  done
}
# kill_at_step JOB R STEP METRICS: SIGKILL rank R of JOB once the metrics reach STEP (at most 30 s)
kill_at_step() {
  local i p
  for i in $(seq 300); do
    [ -s "$4" ] && [ "$(grep -c '"role": "server"' "$4")" -ge "$3" ] && break
    sleep 0.1
  done
  p=$(rank_pid "$1" "$2")
  [ -n "$p" ] && kill -KILL "$p" && date +%s.%N
}
# finite DIR: every float of every safetensors file in DIR is finite (one file per server)
finite() {
  python3 - "$1" <<'PY'
import array, glob, json, math, struct, sys
files = sorted(glob.glob(sys.argv[1] + "/*.safetensors"))
a = array.array("f")
for name in files:
    with open(name, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        json.loads(f.read(n))
        data = f.read()
    a.frombytes(data[: len(data) // 4 * 4])
bad = sum(1 for x in a if not math.isfinite(x))
print(f"{len(files)} files, {len(a)} weights, {bad} not finite")
sys.exit(1 if bad or not a else 0)
PY
}

# ---- a worker dies: the job goes on
STEPS=5000
timeout 120 "$B" launch -n 5 -- "$B" train $G --steps $STEPS --ps 2 --quiet \
  --save "$T/wd" --metrics "$T/wd.jsonl" >"$T/wd.log" 2>&1 &
job=$!
killed=$(kill_at_step $job 3 100 "$T/wd.jsonl")
wait $job
rc=$?
[ -n "$killed" ] && ok "worker (rank 3) killed mid-run" || bad "could not kill rank 3: $(tail -3 "$T/wd.log")"
[ $rc = 137 ] && ok "exit code 137 (the dead worker's), not 0" || bad "exit code $rc, want 137: $(tail -3 "$T/wd.log")"
grep -q "rank 3 (pid [0-9]*) was killed by signal 9 (Killed); tolerated (--tolerate-ranks 2..4, the workers of --ps: the default)" "$T/wd.log" &&
  ok "the launcher tolerated it" || bad "no tolerated line: $(grep launch "$T/wd.log")"
grep -q "stopping the other" "$T/wd.log" && bad "a survivor failed: $(grep -v OpenBLAS "$T/wd.log" | tail -5)" ||
  ok "no survivor failed"
grep -q "r0 WARN ps\] worker 1 (rank 3) died at step [0-9]*; 2 workers left" "$T/wd.log" &&
  ok "server 0 names the dead worker: $(grep -o 'worker 1 (rank 3) died at step [0-9]*; 2 workers left' "$T/wd.log" | head -1)" ||
  bad "server 0 does not name the dead worker: $(grep -v OpenBLAS "$T/wd.log" | head -5)"
grep -q "trained gpt on 5 ranks (2 parameter servers + 3 workers, staleness 0): $STEPS steps" "$T/wd.log" &&
  ok "all $STEPS steps ran" || bad "not finished: $(grep -v OpenBLAS "$T/wd.log" | tail -3)"
v=$(python3 - "$T/wd.jsonl" $STEPS <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][1:]
srv = [r for r in rows if r.get("role") == "server" and r["rank"] == 0]
assert srv[-1]["step"] == int(sys.argv[2]), srv[-1]
assert srv[0]["live_workers"] == 3 and srv[-1]["live_workers"] == 2, (srv[0], srv[-1])
w3 = max(r["step"] for r in rows if r["rank"] == 3)
assert w3 < int(sys.argv[2]), w3
print(f"ok: rank 3's last step {w3}, live workers 3 -> 2, final loss {srv[-1]['loss']:.3f}")
PY
)
case $v in ok:*) ok "metrics: ${v#ok: }";; *) bad "metrics: $v";; esac
v=$(finite "$T/wd") && ok "weights after the death: $v" || bad "weights: $v"

# ---- a server dies: everyone stops, naming it
timeout 120 "$B" launch -n 5 -- "$B" train $G --steps $STEPS --ps 2 --quiet \
  --metrics "$T/sd.jsonl" >"$T/sd.log" 2>&1 &
job=$!
killed=$(kill_at_step $job 1 100 "$T/sd.jsonl")
wait $job
rc=$?
done_at=$(date +%s.%N)
if [ -z "$killed" ]; then
  bad "could not kill rank 1: $(tail -3 "$T/sd.log")"
else
  took=$(echo "$done_at - $killed" | bc)
  [ "$(echo "$took < 5" | bc)" = 1 ] && ok "the job ended ${took} s after the server died" ||
    bad "the job ended ${took} s after the server died"
fi
[ $rc = 137 ] && grep -q "rank 1 (pid [0-9]*) was killed by signal 9 (Killed); stopping the other 4 ranks" "$T/sd.log" &&
  ok "the launcher names the server and stops the others (exit $rc)" || bad "exit $rc: $(grep launch "$T/sd.log")"
# the ranks that saw it name it (a worker's pull: "parameter server 1 (rank 1) (it died; its tensors are
# gone)"; a push or a server: "rank 1 died"); the others report the rank that stopped on it
grep "^brigade train:" "$T/sd.log" | grep -q "parameter server 1 (rank 1)\|rank 1 died" &&
  ok "the ranks name the server: $(grep "^brigade train:" "$T/sd.log" | grep -o "parameter server 1 (rank 1)[^:]*\|rank 1 died[^:]*" | head -1)" ||
  bad "no rank names the server: $(grep -v OpenBLAS "$T/sd.log" | tail -4)"

# ---- a stop request (SIGTERM to the launcher, forwarded to every rank)
for k in 0 2; do
  timeout 120 "$B" launch -n 5 -- "$B" train $G --steps $STEPS --ps 2 --staleness $k --quiet \
    --checkpoint-dir "$T/st$k" --metrics "$T/st$k.jsonl" >"$T/st$k.log" 2>&1 &
  job=$!
  for i in $(seq 300); do [ -s "$T/st$k.jsonl" ] && [ "$(grep -c '"role": "server"' "$T/st$k.jsonl")" -ge 100 ] && break; sleep 0.1; done
  lp=$(pgrep -P "$job" -f "launch -n 5" | head -1)
  [ -n "$lp" ] && kill -TERM "$lp"
  wait $job
  rc=$?
  n=$(ls "$T/st$k" 2>/dev/null | grep -c '^step-')
  [ $rc = 143 ] && [ "$n" = 1 ] && grep -q "stopped after step [0-9]* on request; checkpoint written" "$T/st$k.log" &&
    ! grep -q "sending SIGKILL" "$T/st$k.log" && ! grep -q "was not matched" "$T/st$k.log" && ok "--staleness $k: SIGTERM: stopped at $(ls "$T/st$k"), exit 143" ||
    bad "--staleness $k: SIGTERM: exit $rc, $n checkpoints: $(grep -v 'OpenBLAS\|UCX' "$T/st$k.log" | tail -4)"
done

# ---- checkpoints from the servers resume under any layout (and PS resumes a --dp checkpoint)
C="--model gpt --layers 2 --d-model 16 --heads 2 --seq 16 --batch 8 --microbatches 2 --threads 1 --lr 3e-3 --quiet"
ck() { timeout 60 "$B" launch -n "$1" -- "$B" train $C "${@:2}" >"$T/ck.log" 2>&1 || bad "launch -n $1 train ${*:2}: $(tail -2 "$T/ck.log")"; }
ck 2 --dp 2 --steps 10 --save "$T/full"
ck 4 --ps 2 --steps 5 --checkpoint-dir "$T/c1"
[ "$(ls "$T/c1/step-00000005")" = "$(printf 'manifest.json\nrank-00000.safetensors\nrank-00001.safetensors')" ] &&
  ok "each server wrote its tensors, server 0 the manifest" || bad "checkpoint files: $(ls "$T/c1/step-00000005")"
ck 2 --dp 2 --steps 10 --checkpoint-dir "$T/c1" --resume --save "$T/r1"
same "$T/full" "$T/r1" "--ps 2 checkpoint at step 5 resumed with --dp 2 = --dp 2 throughout"
ck 2 --dp 2 --steps 5 --checkpoint-dir "$T/c2"
ck 4 --ps 2 --steps 10 --checkpoint-dir "$T/c2" --resume --save "$T/r2"
grep -q "resuming from .*step-00000005" "$T/ck.log" && ok "--ps resumed the --dp checkpoint" || bad "no resume: $(cat "$T/ck.log")"
same "$T/full" "$T/r2" "--dp 2 checkpoint at step 5 resumed with --ps 2 = --dp 2 throughout"

finish
