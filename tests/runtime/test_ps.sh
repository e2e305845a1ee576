#!/usr/bin/env bash
# tests/runtime/test_ps.sh: the parameter-server mode (--ps S --staleness K;
# docs/parameter_server.md), against data parallelism as the reference.
# - K = 0 is synchronous data parallelism with a different reduction: after
#   10 steps --ps 1 and --ps 2 give the weights of --dp W, bitwise for W = 2
#   (a + b either way) and within the data-parallel tolerance of
#   test_equivalence for W = 3 (relative L2 1e-5: the servers sum in worker
#   order, the all-reduce in ring order), GPT and MLP (MLP with SGD and weight
#   decay too, so a tensor's decay flag reaches its server; GPT with tied
#   embeddings and zb-h1, bitwise: the tie's server adds a + b after the sum).
# - A server holds its share: with --ps 2, server 0 has about half the
#   parameters (40-60%; the map is largest first to the least loaded).
# - The metrics: every worker's line has its staleness (0 at K = 0), every
#   server's its bytes received, optimizer milliseconds and idle fraction.
# - K = 1, 2 (workers run ahead on parameters at most K steps old): after 300
#   steps on the bundled corpus the loss (mean of the last 10 steps, as the
#   servers sum it) is within 5% of K = 0's; every worker's staleness is
#   within [0, K] and some step used stale parameters; weights finite.
# - Pipelined workers (--ps S --pp 2: worker w is ranks S + 2w, S + 2w + 1,
#   each stage rank pushing and pulling its own tensors): K = 0 with 2
#   worker pipelines equals --pp 2 --dp 2 with the same schedule bitwise,
#   --ps 1 (5 processes) and --ps 2 (6), GPT with tied embeddings (the
#   embedding on stage 0, the head on stage 1: the tie's server adds a + b as
#   the executor does across stages) and MLP, under 1f1b, zb-h1 and
#   interleaved / zbv with 2 chunks per rank; a K = 1 run (100 steps) ends
#   with finite weights, staleness within [0, 1] on every rank, and the two
#   ranks of each pipeline report the same loss every step (the last stage
#   tells the first its loss and when to stop); the metrics add up (the
#   servers receive what the stage ranks push). Also --pp 3 with a middle
#   stage that holds no tensor (bitwise), and 3 worker pipelines against
#   --pp 2 --dp 3 within the data-parallel tolerance.
# - Bad input: --ps 0, --ps >= the ranks, more servers than tensors, --ps
#   with --tp > 1, --zero or dualpipe, --staleness without --ps, a worker
#   count that is not a multiple of --pp: one line each, a non-zero exit,
#   nothing trained.
. "$(dirname "$0")/../lib/harness.sh"
GPT="--model gpt --layers 2 --d-model 16 --heads 2 --seq 16 --microbatches 2 --steps 10 --threads 1 --lr 3e-3"
MLP="--model mlp --layers 3 --d-model 32 --microbatches 2 --steps 10 --threads 1 --lr 3e-3"

TRAIN_TIMEOUT=60
# finite FILE: every float of a safetensors file is finite (and there are some)
finite() {
  python3 - "$1" <<'PY'
import array, json, math, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    head = json.loads(f.read(n))
    data = f.read()
a = array.array("f")
a.frombytes(data[: len(data) // 4 * 4])
bad = sum(1 for x in a if not math.isfinite(x))
print(f"{len(a)} weights, {bad} not finite")
sys.exit(1 if bad or not a else 0)
PY
}

for m in GPT MLP; do
  args=${!m}
  # W = 2 workers: bitwise
  train_save "${m}_dp2" 2 $args --batch 8 --dp 2 || continue
  for s in 1 2; do
    train_save "${m}_ps${s}_w2" $((s + 2)) $args --batch 8 --ps $s &&
      same "$T/${m}_dp2" "$T/${m}_ps${s}_w2" "$m: --ps $s with 2 workers = --dp 2 (bitwise)"
  done
  # W = 3 workers: within the data-parallel tolerance
  train_save "${m}_dp3" 3 $args --batch 12 --dp 3 || continue
  for s in 1 2; do
    train_save "${m}_ps${s}_w3" $((s + 3)) $args --batch 12 --ps $s &&
      near "$T/${m}_dp3" "$T/${m}_ps${s}_w3" "$m: --ps $s with 3 workers = --dp 3 (relative L2 1e-5)"
  done
done
# a server holds its share: parameters (and so gradients and optimizer state) of its tensors only
p1=$(grep -A1 "^rank  pp" "$T/GPT_ps1_w2.log" | awk 'NR == 2 {print $4}')
p2=$(grep -A1 "^rank  pp" "$T/GPT_ps2_w2.log" | awk 'NR == 2 {print $4}')
[ -n "$p1" ] && [ -n "$p2" ] && [ $((p2 * 10)) -le $((p1 * 6)) ] && [ $((p2 * 10)) -ge $((p1 * 4)) ] &&
  ok "server 0 holds $p2 of $p1 parameters with --ps 2" || bad "server 0's parameters: --ps 1 $p1, --ps 2 $p2"
SGD="--optimizer sgd --lr 0.05 --weight-decay 0.1"
train_save sgd_dp2 2 $MLP $SGD --batch 8 --dp 2 && train_save sgd_ps2 4 $MLP $SGD --batch 8 --ps 2 &&
  same "$T/sgd_dp2" "$T/sgd_ps2" "MLP, SGD + weight decay: --ps 2 with 2 workers = --dp 2 (bitwise)"
# tied embeddings (the tie's two tensors on one server, which adds a + b after the workers' sum, as dp
# does after its all-reduce), weight decay, a zero-bubble schedule
TIE="$GPT --batch 8 --tie-embeddings --weight-decay 0.1 --schedule zb-h1"
train_save tie_dp2 2 $TIE --dp 2 && for s in 1 2; do
  train_save "tie_ps$s" $((s + 2)) $TIE --ps $s && same "$T/tie_dp2" "$T/tie_ps$s" "tied embeddings, zb-h1: --ps $s = --dp 2 (bitwise)"
done
# a model that would not reach the reference unless it learns: the weights moved
v=$("$B" compare "$T/GPT_dp2" "$T/GPT_ps1_w3" 2>&1) && bad "the 2- and 3-worker runs should differ: $v" ||
  ok "different batches give different weights (the comparison can fail)"

# metrics: staleness per worker, bytes / optimizer ms / idle per server
timeout 60 "$B" launch -n 4 -- "$B" train $GPT --batch 8 --ps 2 --quiet --metrics "$T/m.jsonl" >"$T/m.log" 2>&1 ||
  bad "metrics run: $(tail -2 "$T/m.log")"
v=$(python3 - "$T/m.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert lines[0]["run"]["ps"] == 2, lines[0]
rows = [l for l in lines[1:]]
srv = [r for r in rows if r.get("role") == "server"]
wrk = [r for r in rows if r.get("role") == "worker"]
assert sorted({r["rank"] for r in srv}) == [0, 1], "servers are ranks 0, 1"
assert sorted({r["rank"] for r in wrk}) == [2, 3], "workers are ranks 2, 3"
assert len(srv) == 20 and len(wrk) == 20, (len(srv), len(wrk))
assert all(r["staleness"] == 0 for r in wrk), "K = 0: staleness 0"
assert all(r["bytes_recv"] > 0 and r["optim_ms"] >= 0 and 0 <= r["idle"] <= 1 and r["live_workers"] == 2 for r in srv)
# both servers together receive each worker's whole gradient every step
for step in range(1, 11):
    got = sum(r["bytes_recv"] for r in srv if r["step"] == step)
    sent = sum(r["bytes_sent"] for r in wrk if r["step"] == step)
    assert got == sent + 2 * 2 * 8, (step, got, sent)   # + each worker's loss/stop pair to each server
# every rank reports the same global loss at K = 0, to the last digit (the servers' too)
for step in range(1, 11):
    ls = {r["loss"] for r in rows if r["step"] == step}
    assert len(ls) == 1, (step, ls)
print("ok")
PY
)
[ "$v" = ok ] && ok "metrics: per-worker staleness, per-server bytes/optimizer ms/idle" || bad "metrics: $v"

# the trace: workers' waits for parameters and pushes, servers' waits for pushes and updates, every step
timeout 60 "$B" launch -n 4 -- "$B" train $GPT --batch 8 --ps 2 --staleness 1 --quiet --trace "$T/t.json" >"$T/t.log" 2>&1 ||
  bad "trace run: $(tail -2 "$T/t.log")"
v=$(python3 - "$T/t.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"] if isinstance(d, dict) else d
def count(name, pids):
    return {p: sum(1 for e in ev if e.get("ph") != "M" and e.get("name", "").startswith(name) and e.get("pid") == p)
            for p in pids}
for name, pids in (("pull_wait", [2, 3]), ("push_pull", [2, 3]), ("push_wait", [0, 1]), ("update", [0, 1]),
                   ("step", [0, 1, 2, 3])):
    c = count(name, pids)
    assert all(v == 10 for v in c.values()), (name, c)
print("ok")
PY
)
[ "$v" = ok ] && ok "trace: pull_wait/push_pull on workers, push_wait/update on servers, 10 steps each" || bad "trace: $v"

# pipelined workers: --ps S --pp 2 with 2 worker pipelines = --pp 2 --dp 2, same schedule, bitwise
PTIE="$GPT --batch 8 --microbatches 4 --tie-embeddings --weight-decay 0.1"
PMLP="$MLP --batch 8 --microbatches 4"
for c in "PTIE 1f1b" "PMLP 1f1b" "PTIE interleaved --chunks 2" "PMLP zb-h1" "PTIE zbv --chunks 2"; do
  m=${c%% *} sch=${c#* } tag=$(echo "$c" | tr ' ' _)
  train_save "pp_dp_$tag" 4 ${!m} --pp 2 --dp 2 --schedule $sch || continue
  for s in 1 2; do
    case "$c" in *interleaved* | *zbv*) [ $s = 2 ] && continue;; esac # one server count each, for time
    train_save "pp_ps${s}_$tag" $((s + 4)) ${!m} --pp 2 --ps $s --schedule $sch &&
      same "$T/pp_dp_$tag" "$T/pp_ps${s}_$tag" "${m#P} --pp 2, $sch: --ps $s with 2 worker pipelines = --pp 2 --dp 2 (bitwise)"
  done
done
# three stages, the middle one holding no tensor (an activation alone): bitwise
train_save pp3_dp 6 $MLP --batch 8 --pp 3 --dp 2 --split 1,1,5 &&
  train_save pp3_ps 7 $MLP --batch 8 --pp 3 --ps 1 --split 1,1,5 &&
  same "$T/pp3_dp" "$T/pp3_ps" "MLP --pp 3 --split 1,1,5 (a stage without tensors): --ps 1 = --pp 3 --dp 2 (bitwise)"
# three worker pipelines: within the data-parallel tolerance (the servers sum in worker order)
train_save pp_dp3 6 $PTIE --batch 12 --pp 2 --dp 3 &&
  train_save pp_ps_w3 7 $PTIE --batch 12 --pp 2 --ps 1 &&
  near "$T/pp_dp3" "$T/pp_ps_w3" "GPT --pp 2: --ps 1 with 3 worker pipelines = --pp 2 --dp 3 (relative L2 1e-5)"
# K = 1 with pipelined workers: finite weights, staleness within [0, 1], one loss per pipeline and step,
# the servers' bytes = the stage ranks' pushes + each rank's loss/stop pair
timeout 60 "$B" launch -n 5 -- "$B" train $GPT --batch 8 --microbatches 4 --steps 100 --pp 2 --ps 1 --staleness 1 \
  --quiet --save "$T/ppk1" --metrics "$T/ppk1.jsonl" >"$T/ppk1.log" 2>&1 || bad "--pp 2 --staleness 1: $(tail -2 "$T/ppk1.log")"
v=$(python3 - "$T/ppk1.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][1:]
wrk = [r for r in rows if r.get("role") == "worker"]
srv = [r for r in rows if r.get("role") == "server"]
assert sorted({r["rank"] for r in wrk}) == [1, 2, 3, 4] and len(wrk) == 400 and len(srv) == 100, (len(wrk), len(srv))
st = [r["staleness"] for r in wrk]
assert min(st) >= 0 and max(st) <= 1 and max(st) == 1, (min(st), max(st))
loss = {}
for r in wrk:
    loss.setdefault((r["step"], (r["rank"] - 1) // 2), set()).add(r["loss"])
assert all(len(v) == 1 for v in loss.values()), "the ranks of a pipeline disagree on a step's loss"
for step in range(1, 101):
    got = sum(r["bytes_recv"] for r in srv if r["step"] == step)
    sent = sum(r["bytes_sent"] for r in wrk if r["step"] == step)
    assert got == sent + 4 * 8, (step, got, sent)
print(f"ok: staleness mean {sum(st) / len(st):.2f} max {max(st)}, one loss per pipeline and step")
PY
)
case $v in ok:*) ok "--pp 2 --staleness 1: ${v#ok: }";; *) bad "--pp 2 --staleness 1: $v";; esac
v=$(finite "$T/ppk1/model.safetensors") && ok "--pp 2 --staleness 1: $v" || bad "--pp 2 --staleness 1: $v"

# K > 0: converges like synchronous training, staleness bounded by K
SMALL="--model gpt --layers 2 --d-model 32 --heads 2 --seq 32 --batch 8 --microbatches 1 --steps 300 --threads 1 --lr 1e-3"
for k in 0 1 2; do
  timeout 120 "$B" launch -n 3 -- "$B" train $SMALL --ps 1 --staleness $k --quiet --save "$T/k$k" \
    --metrics "$T/k$k.jsonl" >"$T/k$k.log" 2>&1 || bad "--staleness $k: $(tail -2 "$T/k$k.log")"
done
for k in 1 2; do
  v=$(python3 - "$T/k0.jsonl" "$T/k$k.jsonl" $k <<'PY'
import json, sys
def rows(f): return [json.loads(l) for l in open(f) if l.strip()][1:]
def final(f):
    s = [r["loss"] for r in rows(f) if r.get("role") == "server"]
    assert len(s) == 300, len(s)
    return sum(s[-10:]) / 10
k = int(sys.argv[3])
l0, lk = final(sys.argv[1]), final(sys.argv[2])
st = [r["staleness"] for r in rows(sys.argv[2]) if r.get("role") == "worker"]
assert len(st) == 600 and min(st) >= 0 and max(st) <= k, (min(st), max(st))
assert max(st) >= 1, "no step ran ahead"
assert abs(lk - l0) <= 0.05 * l0, f"loss {lk:.4f} vs synchronous {l0:.4f}"
print(f"ok: loss {lk:.4f} vs {l0:.4f} synchronous ({100 * (lk / l0 - 1):+.1f}%), staleness mean {sum(st) / len(st):.2f} max {max(st)}")
PY
)
  case $v in ok:*) ok "--staleness $k: ${v#ok: }";; *) bad "--staleness $k: $v";; esac
  v=$(finite "$T/k$k/model.safetensors") && ok "--staleness $k: $v" || bad "--staleness $k: $v"
done

# bad input: one line each
G1="--model gpt --layers 2 --d-model 16 --heads 2 --seq 16 --steps 1 --threads 1"
expect_train 2 "--ps must be in [1, 4095], got 0" $G1 --ps 0
expect_train 1 "1 server but the job has 1 rank, so no worker is left" $G1 --ps 1
expect_train 1 "more servers than the model's 29 tensors" $G1 --ps 40
expect_train 2 "--ps with --tp 2: the servers hold whole tensors" $G1 --ps 1 --tp 2
expect_train 1 "--ps with dualpipe: its two copies of each stage" $G1 --ps 1 --pp 2 --schedule dualpipe
expect_train 2 "--ps with --zero 1" $G1 --ps 1 --zero 1
expect_train 2 "--staleness 2 needs --ps" $G1 --staleness 2
# under the launcher: more servers than ranks stops every rank (no hang)
timeout 60 "$B" launch -n 2 -- "$B" train $G1 --ps 2 >"$T/o" 2>"$T/e"
rc=$?
[ $rc != 0 ] && [ $rc != 124 ] && grep -q "no worker is left" "$T/e" && ok "--ps 2 on 2 ranks refused (exit $rc)" ||
  bad "--ps 2 on 2 ranks: exit $rc: $(cat "$T/e")"
# workers that do not fill whole pipelines: every rank says so, nobody hangs
timeout 60 "$B" launch -n 4 -- "$B" train $G1 --ps 1 --pp 2 >"$T/o" 2>"$T/e"
rc=$?
[ $rc != 0 ] && [ $rc != 124 ] && grep -q "leave 3 for the workers, not a multiple of the 2 ranks" "$T/e" &&
  ok "--ps 1 --pp 2 on 4 ranks refused (exit $rc)" || bad "--ps 1 --pp 2 on 4 ranks: exit $rc: $(cat "$T/e")"
finish
