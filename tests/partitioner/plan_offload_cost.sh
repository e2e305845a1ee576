#!/usr/bin/env bash
# tests/partitioner/plan_offload_cost.sh: `brigade plan` weighing offload by
# its transfers over the host link (--host-bw, docs/offload.md "The planner").
# A GPT (2 x 64, seq 256) on 2 devices of 18 MiB, pp 1, fits either as dp 2
# with the optimizer state offloaded (not without it) or as tp 2 on the
# device. Each chosen plan's predicted step is checked against a closed form
# computed here from its JSON's per-layer costs: m x sum(fwd + bwd) + the
# gradient all-reduce (dp 2) + sum(opt) + the transfers, 12 bytes per
# parameter the replica updates over the host link (--offload optimizer), or
# 4 per shard parameter at the step and at each of the 2 m gathers
# (--zero 3 --offload optimizer,params).
# - a slow host link (500M): tp 2 without offload, faster than dp 2 offloaded
# - a fast host link (100G): dp 2 with the optimizer state offloaded
# - --host-bw 0: the transfers cost nothing (the cpu backend's store)
# - --choices prints each row's transfer part; bad --host-bw refused
. "$(dirname "$0")/../lib/harness.sh"
PM=(--model gpt --layers 2 --d-model 64 --heads 4 --seq 256 --batch 16 --microbatch-size 4)
LAY=(--devices 2 --pp 1 --schedule 1f1b --mem 18M --flops 1e12)

# plan NAME ARGS...: brigade plan into $T/NAME.json and $T/NAME.o
plan() {
  local n=$1
  shift
  timeout 60 "$B" plan "${PM[@]}" "${LAY[@]}" "$@" --json "$T/$n.json" >"$T/$n.o" 2>&1 ||
    die "plan $n ($*): $(tail -3 "$T/$n.o")"
}

# closed FILE HOST_BW: the closed-form step and transfer part of a pp 1 plan, "step_ms offload_ms",
# each compared with the plan's (relative 1e-9): prints "ok ..." or "bad ..."
closed() {
  python3 - "$1" "$2" <<'PY'
import json, sys
p = json.load(open(sys.argv[1])); hb = float(sys.argv[2])
assert p["pp"] == 1 and p["schedule"] == "1f1b" and not p["recompute"]
L = p["layers"]; m = p["microbatches"]; dp = p["dp"]; zero = p.get("zero", 0); off = p.get("offload", "")
dev = p["devices"]; P = sum(l["params"] for l in L)
compute = m * sum(l["fwd_ms"] + l["bwd_ms"] for l in L) + sum(l["opt_ms"] for l in L)
reduce = 0.0
if dp > 1:  # ring all-reduce of the gradients; --zero 3 (m+1)/2 + m of it
    f = (m + 1) / 2 + m if zero == 3 else (m + 1) / 2 if zero == 2 else 1.0
    reduce = 1e3 * f * (2 * (dp - 1) * dev["link_latency_s"] + 2 * (dp - 1) / dp * 4 * P / dev["link_bandwidth"])
n = P / dp if zero and dp > 1 else P  # the parameters this replica updates
xfer = 0.0
if off and hb > 0:
    xfer = 1e3 * (12 * n / hb if off == "optimizer" else (4 * n + 2 * m * 4 * n) / hb)
step = compute + reduce + xfer
got_step, got_x = p["predicted_step_ms"], p.get("predicted_offload_ms", 0.0)
good = abs(got_step - step) <= 1e-9 * step and abs(got_x - xfer) <= 1e-9 * max(xfer, 1e-12)
print("%s step %.6f ms (closed form %.6f), transfers %.6f ms (closed form %.6f; %d parameters, %s)" %
      ("ok" if good else "bad", got_step, step, got_x, xfer, n, off or "no offload"))
PY
}
verdict() { case "$1" in ok*) ok "$2: ${1#ok }" ;; *) bad "$2: $1" ;; esac; }
key() { python3 -c "import json,sys; p=json.load(open(sys.argv[1])); print(p['tp'], p['dp'], p.get('offload','none'), p['predicted_step_ms'])" "$1"; }
SLOW=524288000 FAST=107374182400 # 500M, 100G (powers of 1024)

# slow host link: tp 2 without offload beats dp 2 with it
plan slow --tp all --offload auto --host-bw 500M
plan slow1 --tp 1 --offload auto --host-bw 500M
read -r tp dp off step <<<"$(key "$T/slow.json")"
read -r tp1 dp1 off1 step1 <<<"$(key "$T/slow1.json")"
[ "$tp $dp $off" = "2 1 none" ] && [ "$tp1 $dp1 $off1" = "1 2 optimizer" ] &&
  python3 -c "import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]))" "$step" "$step1" &&
  ok "host link 500M: tp 2 without offload ($step ms) chosen over dp 2 offloaded ($step1 ms)" ||
  bad "host link 500M: chose tp $tp dp $dp offload $off ($step ms); tp 1: tp $tp1 dp $dp1 offload $off1 ($step1 ms)"
verdict "$(closed "$T/slow.json" $SLOW)" "500M, tp 2"
verdict "$(closed "$T/slow1.json" $SLOW)" "500M, dp 2 offloaded (--tp 1)"
# the layout fits either way: tp 2 on the device, dp 2 only offloaded
awk '/^memory choices/ { t = 1; next } t && $1 == 0 && $2 == "none" { print $NF }' "$T/slow.o" | grep -qx yes &&
  awk '/^memory choices/ { t = 1; next } t && $1 == 0 { print $2, $NF }' "$T/slow1.o" | tr '\n' ' ' |
  grep -qx 'none no optimizer yes ' && ok "tp 2 fits without offload, dp 2 only with it" ||
  bad "fits: $(sed -n '/^memory choices/,$p' "$T/slow.o" "$T/slow1.o" | tr '\n' ';')"

# fast host link: dp 2 offloaded beats tp 2
plan fast --tp all --offload auto --host-bw 100G
read -r tp dp off stepf <<<"$(key "$T/fast.json")"
[ "$tp $dp $off" = "1 2 optimizer" ] && python3 -c "import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]))" "$stepf" "$step" &&
  ok "host link 100G: dp 2 offloaded ($stepf ms) chosen over tp 2 ($step ms)" ||
  bad "host link 100G: chose tp $tp dp $dp offload $off ($stepf ms)"
verdict "$(closed "$T/fast.json" $FAST)" "100G, dp 2 offloaded"
# --choices: the chosen row's transfer part is the plan's, the row without offload none
x=$(python3 -c "import json,sys; print('%.3f' % json.load(open(sys.argv[1]))['predicted_offload_ms'])" "$T/fast.json")
awk '/^memory choices/ { t = 1; next } t && $1 == 0 { print $2, $6 }' "$T/fast.o" | tr '\n' ' ' | grep -qx "none 0.000 optimizer $x " &&
  ok "--choices: offload ms $x on the offloaded row, 0.000 without" || bad "--choices rows: $(sed -n '/^memory choices/,$p' "$T/fast.o" | tr '\n' ';')"

# a free host link (the cpu backend's store): no transfers, dp 2 offloaded
plan free --tp all --offload auto --host-bw 0
read -r tp dp off stepz <<<"$(key "$T/free.json")"
[ "$tp $dp $off" = "1 2 optimizer" ] && ok "host link 0 (free): dp 2 offloaded" || bad "host link 0: tp $tp dp $dp offload $off"
verdict "$(closed "$T/free.json" 0)" "free host link"

# --zero 3 --offload optimizer,params: the shard's gathers over the host link too
plan z3 --tp 1 --zero 3 --offload optimizer,params --host-bw 500M
verdict "$(closed "$T/z3.json" $SLOW)" "500M, dp 2 --zero 3 --offload optimizer,params"

# bad input
for v in -1 abc 5X; do
  "$B" plan "${PM[@]}" "${LAY[@]}" --host-bw "$v" >"$T/e.o" 2>&1
  rc=$?
  [ "$rc" = 2 ] && grep -q -- "--host-bw" "$T/e.o" && ok "--host-bw $v refused: $(head -1 "$T/e.o")" || bad "--host-bw $v: rc $rc: $(cat "$T/e.o")"
done
finish 12
