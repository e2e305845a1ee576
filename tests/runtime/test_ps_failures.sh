#!/usr/bin/env bash
# tests/runtime/test_ps_failures.sh: failures in the parameter-server mode
# (docs/parameter_server.md, "Failures").
# - A worker SIGKILLed mid-run under brigade launch (which tolerates the
#   workers of brigade train --ps S by itself, with no --tolerate-ranks): the
#   servers go on with the live workers (the sum rescaled), the job runs all
#   its steps, the weights are finite, server 0 names the dead worker and the
#   step, the launcher says it tolerated it, no survivor fails, and the exit
#   code is the dead worker's (137), not 0.
# - One rank of a pipelined worker SIGKILLed (--ps 1 --pp 2, 3 worker
#   pipelines on 7 ranks; rank 4, the last stage of worker 1): the rest of
#   that pipeline stops (rank 3 fails naming rank 4, and the launcher
#   tolerates it too), the servers drop worker 1 whole and go on with 2
#   workers, all steps run, weights finite, exit 137.
# - A server SIGKILLed mid-run: every rank stops within seconds, the launcher
#   names the server and so do the ranks that saw it die.
# - SIGTERM to the launcher (a stop request on every rank), K = 0 and 2:
#   every rank stops at a step the servers agree on (the workers' pushes
#   carry the request), server 0 writes the checkpoint of that step, exit 143,
#   no rank killed, and no push left unreceived (UCX would warn of unmatched
#   messages at teardown); also with pipelined workers at K = 2 (the last
#   stage tells the first when its pipeline stops).
# - A checkpoint written by the servers (full named tensors) resumes under
#   --dp: the K = 0 run resumed with --dp 2 ends bitwise where the
#   uninterrupted --dp 2 run ends, and the other way round; one written by
#   --ps 1 --pp 2 resumes under --pp 2 --dp 2 and under --dp 2, each ending
#   bitwise where its uninterrupted run ends, and --ps 1 --pp 2 resumes a
#   --dp 2 checkpoint.
. "$(dirname "$0")/../lib/harness.sh"
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
# server_rows METRICS N: wait until METRICS holds N server rows or JOB (the
# caller's $job) ended: counted in rows, not seconds (a loaded machine is slower)
server_rows() {
  while kill -0 "$job" 2>/dev/null; do
    [ -s "$1" ] && [ "$(grep -c '"role": "server"' "$1")" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}
# kill_at_step JOB R ROWS METRICS: SIGKILL rank R of JOB once the metrics hold ROWS server rows
kill_at_step() {
  local p
  server_rows "$4" "$3" || return 1
  p=$(rank_pid "$1" "$2")
  [ -n "$p" ] && kill -KILL "$p" && date +%s.%N
}
# wait_rest TOTAL AT: wait for $job, started at $t0 and killed at step AT of
# TOTAL, bounded by the pace measured up to the kill on the same machine under
# the same load (start-up included, so an overestimate): 3x that pace for the
# steps left, plus 30 s to notice the death; a job still running then has
# hung (killed, a failed check). Its exit status in rc.
wait_rest() {
  local base_ms limit
  base_ms=$(ms_since "$t0")
  limit=$(awk -v b="$base_ms" -v n="$1" -v k="$2" 'BEGIN { printf "%.1f", 30 + 3 * b / 1000 * (n - k) / k }')
  if ! wait_exit "$job" "$limit"; then
    bad "the job still runs $limit s after the kill (its first $2 steps took $base_ms ms with the start)"
    kill "$job"
  fi
  wait "$job"
  rc=$?
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
# Counted in steps: rank 3 dies at the servers' 100th metrics row (step 50 of
# 2 servers), the job runs WSTEPS in all; the rest is bounded by wait_rest.
WSTEPS=1000
t0=$(now_us)
timeout 600 "$B" launch -n 5 -- "$B" train $G --steps $WSTEPS --ps 2 --quiet \
  --save "$T/wd" --metrics "$T/wd.jsonl" >"$T/wd.log" 2>&1 &
job=$!
killed=$(kill_at_step $job 3 100 "$T/wd.jsonl")
wait_rest $WSTEPS 50
[ -n "$killed" ] && ok "worker (rank 3) killed mid-run" || bad "could not kill rank 3: $(tail -3 "$T/wd.log")"
# every rank's own account when it fails (which transfer each one waited on)
[ $rc = 137 ] && ok "exit code 137 (the dead worker's), not 0" ||
  bad "exit code $rc, want 137: $(grep -v OpenBLAS "$T/wd.log" | grep "brigade train:\|WARN\|ERROR\|brigade launch:" | head -12)"
grep -q "rank 3 (pid [0-9]*) was killed by signal 9 (Killed); tolerated (--tolerate-ranks 2..4, the workers of --ps: the default)" "$T/wd.log" &&
  ok "the launcher tolerated it" || bad "no tolerated line: $(grep launch "$T/wd.log")"
grep -q "stopping the other" "$T/wd.log" && bad "a survivor failed: $(grep -v OpenBLAS "$T/wd.log" | tail -5)" ||
  ok "no survivor failed"
grep -q "r0 WARN ps\] worker 1 (rank 3) died at step [0-9]*; 2 workers left" "$T/wd.log" &&
  ok "server 0 names the dead worker: $(grep -o 'worker 1 (rank 3) died at step [0-9]*; 2 workers left' "$T/wd.log" | head -1)" ||
  bad "server 0 does not name the dead worker: $(grep -v OpenBLAS "$T/wd.log" | head -5)"
grep -q "trained gpt on 5 ranks (2 parameter servers + 3 workers, staleness 0): $WSTEPS steps" "$T/wd.log" &&
  ok "all $WSTEPS steps ran" || bad "not finished: $(grep -v OpenBLAS "$T/wd.log" | tail -3)"
v=$(python3 - "$T/wd.jsonl" $WSTEPS <<'PY'
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

# ---- one rank of a pipelined worker dies: the rest of its pipeline stops, the job goes on
# (rank 4 dies at the server's 100th row: step 100)
PSTEPS=1000
t0=$(now_us)
timeout 600 "$B" launch -n 7 -- "$B" train $G --microbatches 2 --steps $PSTEPS --ps 1 --pp 2 --quiet \
  --save "$T/pd" --metrics "$T/pd.jsonl" >"$T/pd.log" 2>&1 &
job=$!
killed=$(kill_at_step $job 4 100 "$T/pd.jsonl")
wait_rest $PSTEPS 100
[ -n "$killed" ] && ok "rank 4 (worker 1's last stage) killed mid-run" || bad "could not kill rank 4: $(tail -3 "$T/pd.log")"
[ $rc = 137 ] && ok "pipelined: exit code 137 (the dead rank's)" || bad "pipelined: exit code $rc, want 137: $(tail -3 "$T/pd.log")"
grep -q "rank 4 (pid [0-9]*) was killed by signal 9 (Killed); tolerated" "$T/pd.log" &&
  grep -q "rank 3 (pid [0-9]*) exited with status 1; tolerated" "$T/pd.log" &&
  ok "the launcher tolerated rank 4 and its pipeline's rank 3" || bad "tolerated lines: $(grep launch "$T/pd.log")"
grep "^brigade train:" "$T/pd.log" | grep -q "rank 4 died\|rank 4 of worker 1 (ranks 3..4) died" &&
  ok "rank 3 stops naming rank 4: $(grep "^brigade train:.*rank 4" "$T/pd.log" | head -1 | cut -c1-160)" ||
  bad "rank 3's error: $(grep "^brigade train:" "$T/pd.log")"
grep -q "stopping the other" "$T/pd.log" && bad "pipelined: a rank outside worker 1 failed: $(grep -v OpenBLAS "$T/pd.log" | tail -5)" ||
  ok "pipelined: no rank outside worker 1 failed"
grep -q "r0 WARN ps\] worker 1 (ranks 3..4; gone: [0-9 ]*4[0-9 ]*) died at step [0-9]*; 2 workers left" "$T/pd.log" &&
  ok "server 0 drops the worker: $(grep -o 'worker 1 (ranks 3..4; gone:[^)]*) died at step [0-9]*; 2 workers left' "$T/pd.log" | head -1)" ||
  bad "server 0 does not name worker 1: $(grep "WARN ps" "$T/pd.log" | head -3)"
grep -q "trained gpt on 7 ranks (1 parameter server + 3 workers of pp 2 (1f1b), staleness 0): $PSTEPS steps" "$T/pd.log" &&
  ok "pipelined: all $PSTEPS steps ran" || bad "pipelined: not finished: $(grep -v OpenBLAS "$T/pd.log" | tail -3)"
v=$(python3 - "$T/pd.jsonl" $PSTEPS <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][1:]
n = int(sys.argv[2])
srv = [r for r in rows if r.get("role") == "server"]
assert srv[-1]["step"] == n and srv[0]["live_workers"] == 3 and srv[-1]["live_workers"] == 2, (srv[0], srv[-1])
last = {k: max(r["step"] for r in rows if r["rank"] == k) for k in range(1, 7)}
assert last[3] < n and last[4] < n and all(last[k] == n for k in (1, 2, 5, 6)), last
print(f"ok: worker 1's ranks stopped at steps {last[3]}, {last[4]}; live workers 3 -> 2")
PY
)
case $v in ok:*) ok "pipelined metrics: ${v#ok: }";; *) bad "pipelined metrics: $v";; esac
v=$(finite "$T/pd") && ok "pipelined: weights after the death: $v" || bad "pipelined: weights: $v"

# ---- a server dies: everyone stops, naming it
STEPS=5000 # never reached: the job ends at the kill
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
for k in 0 2 2p; do
  lay="--ps 2"
  [ $k = 2p ] && lay="--ps 1 --pp 2 --microbatches 2" # 2 worker pipelines of 2 ranks
  timeout 120 "$B" launch -n 5 -- "$B" train $G --steps $STEPS $lay --staleness ${k%p} --quiet \
    --checkpoint-dir "$T/st$k" --metrics "$T/st$k.jsonl" >"$T/st$k.log" 2>&1 &
  job=$!
  server_rows "$T/st$k.jsonl" 100
  lp=$(pgrep -P "$job" -f "launch -n 5" | head -1)
  [ -n "$lp" ] && kill -TERM "$lp"
  wait $job
  rc=$?
  n=$(ls "$T/st$k" 2>/dev/null | grep -c '^step-')
  [ $rc = 143 ] && [ "$n" = 1 ] && grep -q "stopped after step [0-9]* on request; checkpoint written" "$T/st$k.log" &&
    ! grep -q "sending SIGKILL" "$T/st$k.log" && ! grep -q "was not matched" "$T/st$k.log" && ok "--staleness $k: SIGTERM: stopped at $(ls "$T/st$k"), exit 143" ||
    bad "--staleness $k: SIGTERM: exit $rc, $n checkpoints: $(grep -v 'OpenBLAS\|UCX' "$T/st$k.log" | tail -4)"
  [ $k = 2p ] || continue
  v=$(python3 - "$T/st$k.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][1:]
last = {k: max(r["step"] for r in rows if r["rank"] == k) for k in range(1, 5)}
print(f"ok: each pipeline's ranks ran the same steps {last}" if last[1] == last[2] and last[3] == last[4] else
      f"last step per rank {last}")
PY
)
  # a rank that failed during the stop says so on stderr (the launcher's exit code is the stop's, 143)
  e=$(grep "^brigade train: \|during the stop\|error" "$T/st$k.log" | grep -v "warning:" | head -4)
  case $v in ok:*) [ -z "$e" ] && ok "--staleness 2p: ${v#ok: }" || bad "--staleness 2p: a rank failed during the stop: $e";;
    *) bad "--staleness 2p: the ranks of a pipeline stopped apart: $v; $e; log: $(grep -v 'OpenBLAS\|UCX\|warning:' "$T/st$k.log" | tail -6)";; esac
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
cp -r "$T/c2" "$T/c5" # for --ps 1 --pp 2 below (resuming writes step 10 here)
ck 4 --ps 2 --steps 10 --checkpoint-dir "$T/c2" --resume --save "$T/r2"
grep -q "resuming from .*step-00000005" "$T/ck.log" && ok "--ps resumed the --dp checkpoint" || bad "no resume: $(cat "$T/ck.log")"
same "$T/full" "$T/r2" "--dp 2 checkpoint at step 5 resumed with --ps 2 = --dp 2 throughout"
# pipelined workers' checkpoints (written by the server) resume under --pp 2 --dp 2 and under --dp 2
ck 4 --pp 2 --dp 2 --steps 10 --save "$T/fullpp"
ck 5 --ps 1 --pp 2 --steps 5 --checkpoint-dir "$T/c3"
v=$(python3 -c 'import json, sys; l = json.load(open(sys.argv[1]))["extra"]["layout"]; print(l["pp"], l["dp"], l["ps"])' \
  "$T/c3/step-00000005/manifest.json" 2>&1)
[ "$v" = "2 2 1" ] && ok "the manifest records the pipelined workers' layout (pp dp ps: $v)" || bad "manifest layout: $v"
cp -r "$T/c3" "$T/c4"
ck 4 --pp 2 --dp 2 --steps 10 --checkpoint-dir "$T/c3" --resume --save "$T/r3"
same "$T/fullpp" "$T/r3" "--ps 1 --pp 2 checkpoint at step 5 resumed with --pp 2 --dp 2 = --pp 2 --dp 2 throughout"
ck 2 --dp 2 --steps 10 --checkpoint-dir "$T/c4" --resume --save "$T/r4"
same "$T/full" "$T/r4" "--ps 1 --pp 2 checkpoint at step 5 resumed with --dp 2 = --dp 2 throughout"
ck 5 --ps 1 --pp 2 --steps 10 --checkpoint-dir "$T/c5" --resume --save "$T/r5"
grep -q "resuming from .*step-00000005" "$T/ck.log" && same "$T/full" "$T/r5" "--dp 2 checkpoint at step 5 resumed with --ps 1 --pp 2 = --dp 2 throughout" ||
  bad "--ps 1 --pp 2 did not resume the --dp 2 checkpoint: $(cat "$T/ck.log")"

finish
