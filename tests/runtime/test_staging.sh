#!/usr/bin/env bash
# tests/runtime/test_staging.sh: transfers staged through host memory (the
# path of device buffers, forced on the CPU backend by BRIGADE_STAGING=always,
# with 1 KiB chunks so that messages split into several) give bitwise the
# weights of the direct path at pp = 2, dp = 2, pp = 2 x dp = 2 and with tied
# embeddings across ranks; the info log proves the staged path ran.
# Streams (the backend's event and *_async slots): the same cases on the
# cpu-async backend (kernels/cpu/cpu_async.c: a copy thread that runs each
# copy 200 us late and fills its destination with NaN until then), whose
# sends and reductions start when their copies' events complete and whose
# receives reach the consumer through the compute stream's wait: bitwise the
# direct path's weights, with the log showing requests that had to wait for
# their copies. A send started before its copy, or a consumer not made to wait,
# reads NaN (checked by hand by removing either; `brigade compare` refuses NaN,
# checked below).
# Parameter servers (--ps, docs/parameter_server.md): the pushes, pulls and
# the servers' receives and sends go through the same layer; with K = 0
# --ps 1 and --ps 2 (GPT with tied embeddings, one-rank workers and --pp 2
# worker pipelines) staged equal direct bitwise, and a staged K = 1 run ends
# with finite weights and staleness within [0, 1].
# Direct (BRIGADE_STAGING=direct, the path of a CUDA-aware UCX): sends and
# receives on the buffers themselves behind the backend's events, reductions
# staged, on cpu-async: bitwise the direct path's weights.
# Group collectives (runtime/devcoll.h): --tp 2 with and without
# --sequence-parallel, --zero 1 and 2, and tp 2 x dp 2 with ZeRO 2 and SP, on
# cpu-async through the staging and direct providers (and staged without
# streams on cpu, with BRIGADE_TP_OVERLAP=microbatch): bitwise the cpu
# backend's weights (--tp 2 --sequence-parallel also under the device checker,
# BRIGADE_DEVICE_CHECK=on, --save included); BRIGADE_COLL=nccl without a cuda
# backend is refused.
. "$(dirname "$0")/../lib/harness.sh"
export BRIGADE_TIMEOUT=60

GPT="--model gpt --layers 4 --d-model 24 --heads 2 --seq 16 --batch 8 --steps 6 --threads 1 --lr 3e-3 --microbatches 4"

# run NAME N STAGING ARGS...
run() {
  local name=$1 n=$2 mode=$3; shift 3
  if ! BRIGADE_STAGING=$mode BRIGADE_STAGE_CHUNK_KB=1 BRIGADE_LOG=info timeout 120 \
       "$B" launch -n "$n" -- "$B" train "$@" --quiet --save "$T/$name" >"$T/$name.log" 2>&1; then
    bad "$name: launch -n $n train $* (BRIGADE_STAGING=$mode)"; grep -v WARN "$T/$name.log" | tail -5; return 1
  fi
}

# bitwise REF RUN LABEL: RUN's weights are REF's, bit for bit (a pass, with the verdict), else a failure
bitwise() {
  local verdict
  if verdict=$("$B" compare "$1" "$2"); then pass=$((pass + 1)); echo "ok   $3 :: $verdict"; else bad "$3 :: $verdict"; fi
}

# case NAME N ARGS...: staged vs direct, same ranks and arguments (STAGED_ARGS: more for the staged run)
case_() {
  local name=$1 n=$2; shift 2
  run "$name.direct" "$n" auto "$@" || return
  run "$name.staged" "$n" always "$@" ${STAGED_ARGS:-} || return
  if grep -q "staged [1-9]" "$T/$name.direct.log"; then bad "$name: the direct run staged"; return; fi
  # more chunks than transfers: messages were split
  local line
  line=$(grep -m1 "staged [1-9][0-9]* transfers" "$T/$name.staged.log")
  if [ -z "$line" ]; then bad "$name: no staged transfers logged"; return; fi
  local nt nc
  nt=$(sed -E 's/.*staged ([0-9]+) transfers \(([0-9]+) chunks.*/\1/' <<<"$line")
  nc=$(sed -E 's/.*staged ([0-9]+) transfers \(([0-9]+) chunks.*/\2/' <<<"$line")
  if [ "$nc" -le "$nt" ] && [ "${name#async_}" != dp2 ]; then bad "$name: $nc chunks for $nt transfers: nothing was split"; return; fi
  bitwise "$T/$name.direct" "$T/$name.staged" "$name :: $line"
}

case_ pp2 2 $GPT --pp 2 --schedule 1f1b
case_ dp2 2 $GPT --dp 2
case_ pp2dp2 4 $GPT --pp 2 --dp 2 --schedule zb-h1
case_ pp2tie 2 $GPT --pp 2 --schedule 1f1b --tie-embeddings
PS="$GPT --tie-embeddings --weight-decay 0.1"
case_ ps1tie 3 $PS --ps 1
case_ ps2tie 4 $PS --ps 2
case_ ps1pp2 5 $PS --ps 1 --pp 2 --schedule 1f1b
case_ ps2pp2 6 $PS --ps 2 --pp 2 --schedule zb-h1

# streams: cpu-async staged vs cpu direct; some requests waited for their copies
streams() {
  local name=$1; shift
  STAGED_ARGS="--backend cpu-async" case_ "$name" "$@" || return
  [ -d "$T/$name.staged" ] || return
  if ! grep -q "copies on the backend's copy stream" "$T/$name.staged.log"; then
    bad "$name: the staged run did not use the streams"; return
  fi
  local late
  late=$(grep -o "[0-9]* of them later than queued" "$T/$name.staged.log" | awk '{s += $1} END {print s + 0}')
  if [ "$late" -gt 0 ]; then pass=$((pass + 1)); echo "ok   $name: $late requests started after their copies completed";
  else bad "$name: no request waited for its copy (the asynchrony was not exercised)"; fi
}
streams async_pp2 2 $GPT --pp 2 --schedule 1f1b
streams async_dp2 2 $GPT --dp 2
streams async_pp2dp2 4 $GPT --pp 2 --dp 2 --schedule zb-h1
streams async_pp2tie 2 $GPT --pp 2 --schedule 1f1b --tie-embeddings
streams async_ps1pp2 5 $PS --ps 1 --pp 2 --schedule 1f1b
streams async_inter 2 $GPT --pp 2 --schedule interleaved --chunks 2
streams async_dualpipe 2 $GPT --pp 2 --schedule dualpipe

# direct (the path of a CUDA-aware UCX, forced by BRIGADE_STAGING=direct): sends and receives hand the
# backend's buffers to the transport in the staged path's chunks, on cpu-async behind the backend's events,
# reductions staged: bitwise the direct path's weights
dcase() {
  local name=$1 ref=$2 n=$3; shift 3
  run "$name" "$n" direct "$@" --backend cpu-async || return
  local line
  line=$(grep -m1 -o "handed [1-9][0-9]* transfers ([0-9]* bytes)" "$T/$name.log")
  if [ -z "$line" ]; then bad "$name: nothing was handed to the transport directly"; return; fi
  bitwise "$T/$ref.direct" "$T/$name" "$name :: $line"
}
dcase direct_pp2 pp2 2 $GPT --pp 2 --schedule 1f1b
dcase direct_pp2dp2 pp2dp2 4 $GPT --pp 2 --dp 2 --schedule zb-h1
dcase direct_ps1pp2 ps1pp2 5 $PS --ps 1 --pp 2 --schedule 1f1b
dcase direct_dualpipe async_dualpipe 2 $GPT --pp 2 --schedule dualpipe

# the strategies' group collectives on backend buffers (runtime/devcoll.h): tensor parallelism with and
# without sequence parallelism, ZeRO 1 and 2, and both groups at once, on cpu-async through the staging
# provider (always: every collective's input copied out behind an event, the transport's collective on
# the host copy, the result copied back) and the direct one (gathers on the buffer itself, reductions
# staged), and on the cpu backend staged without streams (with BRIGADE_TP_OVERLAP=microbatch's two lanes):
# bitwise the cpu backend's weights; the log names each group's provider, and staged (handed) transfers
# counted where there is no point-to-point traffic prove the collectives took that path
# ccase NAME REF N MODE PROVIDER ARGS...: REF (run once per ARGS) is the cpu backend's run
ccase() {
  local name=$1 ref=$2 n=$3 mode=$4 prov=$5; shift 5
  [ -d "$T/$ref" ] || run "$ref" "$n" auto "$@" || return
  run "$name" "$n" "$mode" "$@" ${CARGS:---backend cpu-async} || return
  if ! grep -q "collectives of the .* group ($([ "$n" = 4 ] && echo 2 || echo "$n") members): $prov" "$T/$name.log"; then
    bad "$name: no group logged the $prov provider: $(grep 'collectives of' "$T/$name.log" | head -2)"; return
  fi
  local moved
  moved=$(grep -m1 -o "\(staged\|handed\) [1-9][0-9]* transfers" "$T/$name.log")
  if [ -z "$moved" ]; then bad "$name: no collective went through the staging layer"; return; fi
  bitwise "$T/$ref" "$T/$name" "$name ($prov) :: $moved"
}
TP="$GPT --tp 2"
ccase coll_tp2 ref_tp2 2 always staging $TP
ccase coll_tp2_direct ref_tp2 2 direct direct $TP
ccase coll_sp2 ref_sp2 2 always staging $TP --sequence-parallel
CARGS="--backend cpu" BRIGADE_TP_OVERLAP=microbatch ccase coll_sp2_sync ref_sp2 2 always staging $TP --sequence-parallel
ccase coll_sp2_direct ref_sp2 2 direct direct $TP --sequence-parallel
# under the device checker (docs/offload.md): --save's gathers of the shards stay on the backend's buffers
BRIGADE_DEVICE_CHECK=on ccase coll_sp2_checked ref_sp2 2 always staging $TP --sequence-parallel
ccase coll_zero1 ref_zero1 2 always staging $GPT --dp 2 --zero 1
ccase coll_zero1_direct ref_zero1 2 direct direct $GPT --dp 2 --zero 1
ccase coll_zero2 ref_zero2 2 always staging $GPT --dp 2 --zero 2
ccase coll_zero2_direct ref_zero2 2 direct direct $GPT --dp 2 --zero 2
ccase coll_3d ref_3d 4 always staging $TP --dp 2 --zero 2 --sequence-parallel
grep -q "handed [1-9]" "$T/coll_zero2_direct.log" && ok "ZeRO 2's all-gathers handed to the transport directly (direct)" ||
  bad "coll_zero2_direct: no gather was handed over directly"
# BRIGADE_COLL: nccl where it cannot run (no cuda stream) and an unknown value: one clear line, non-zero exit
for v in nccl sometimes; do
  out=$(BRIGADE_COLL=$v timeout 60 "$B" launch -n 2 -- "$B" train $TP --steps 1 --quiet 2>&1); rc=$?
  want='BRIGADE_COLL=nccl on backend cpu: the backend has no device stream NCCL can queue on'
  [ $v = sometimes ] && want='BRIGADE_COLL="sometimes": expected auto or nccl'
  if [ $rc -ne 0 ] && grep -qF "$want" <<<"$out"; then pass=$((pass + 1)); echo "ok   BRIGADE_COLL=$v refused"; else bad "BRIGADE_COLL=$v: rc $rc: $out"; fi
done

# a backend that queues work sums the last stage's losses at the step's end
# (runtime/executor.c, loss_dev): the same losses as summing each microbatch at once
for be in cpu cpu-async; do
  timeout 120 "$B" launch -n 2 -- "$B" train $GPT --pp 2 --schedule 1f1b --backend $be --quiet \
    --metrics "$T/loss_$be.jsonl" >"$T/loss_$be.log" 2>&1 || bad "loss run on $be: $(tail -2 "$T/loss_$be.log")"
done
if v=$(python3 - "$T/loss_cpu.jsonl" "$T/loss_cpu-async.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
assert len(a) == 12 and a == b, (a, b)
print(f"{len(a)} losses equal, {a[0]} .. {a[-1]}")
PY
); then pass=$((pass + 1)); echo "ok   losses summed at the step's end (cpu-async) = at once (cpu): $v"; else bad "losses: $v"; fi

# what a premature send or an unwaited copy gives (NaN weights) is never "equal"
if v=$(python3 - "$T/pp2.direct" "$T/nan" <<'PY'
import json, os, shutil, struct, sys
src, dst = sys.argv[1], sys.argv[2]
shutil.copytree(src, dst)
f = sorted(p for p in os.listdir(dst) if p.endswith(".safetensors"))[0]
path = os.path.join(dst, f)
with open(path, "r+b") as fh:
    n = struct.unpack("<Q", fh.read(8))[0]
    head = json.loads(fh.read(n))
    name, t = next((k, v) for k, v in head.items() if k != "__metadata__")
    fh.seek(8 + n + t["data_offsets"][0])
    fh.write(struct.pack("<f", float("nan")))
print(f"{f}:{name}[0] = NaN")
PY
) && ! "$B" compare "$T/pp2.direct" "$T/nan" >"$T/nan.out" 2>&1; then
  pass=$((pass + 1)); echo "ok   compare refuses a NaN ($v): $(tail -1 "$T/nan.out")"
else
  bad "compare accepted weights with a NaN (${v:-no copy made}): $(cat "$T/nan.out" 2>/dev/null)"
fi
# K = 1, staged: finishes, weights finite, every worker rank's staleness within [0, 1]
if BRIGADE_STAGING=always BRIGADE_STAGE_CHUNK_KB=1 timeout 120 "$B" launch -n 5 -- "$B" train $PS --ps 1 --pp 2 \
     --staleness 1 --steps 20 --quiet --save "$T/psk1" --metrics "$T/psk1.jsonl" >"$T/psk1.log" 2>&1 &&
   v=$(python3 - "$T/psk1/model.safetensors" "$T/psk1.jsonl" <<'PY'
import array, json, math, struct, sys
with open(sys.argv[1], "rb") as f:
    head = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    a = array.array("f")
    a.frombytes(f.read())
bad = sum(1 for x in a if not math.isfinite(x))
rows = [json.loads(l) for l in open(sys.argv[2]) if l.strip()][1:]
st = [r["staleness"] for r in rows if r.get("role") == "worker"]
assert len(a) and not bad, f"{bad} of {len(a)} weights not finite"
assert len(st) == 80 and min(st) >= 0 and max(st) <= 1, (len(st), min(st), max(st))
print(f"{len(a)} weights finite, staleness mean {sum(st) / len(st):.2f} max {max(st)}")
PY
); then
  pass=$((pass + 1)); echo "ok   psk1 staged --ps 1 --pp 2 --staleness 1 :: $v"
else
  bad "psk1 staged --ps 1 --pp 2 --staleness 1: ${v:-$(grep -v WARN "$T/psk1.log" | tail -3)}"
fi

# the staged path against one process too (bitwise for pp, as the direct path)
if "$B" train $GPT --quiet --save "$T/one" >"$T/one.log" 2>&1 && v=$("$B" compare "$T/one" "$T/pp2.staged"); then
  pass=$((pass + 1)); echo "ok   pp2 staged vs one process :: $v"
else
  bad "pp2 staged vs one process: ${v:-reference failed}"
fi

# bad input: one clear line, non-zero exit
out=$(BRIGADE_STAGING=sometimes "$B" train $GPT --steps 1 --quiet 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q 'BRIGADE_STAGING="sometimes"' <<<"$out"; then pass=$((pass + 1)); else bad "BRIGADE_STAGING=sometimes: rc $rc: $out"; fi

finish 44
