#!/usr/bin/env bash
# tests/partitioner/plan_offload_act.sh: `brigade plan` with activation offload
# (--offload activations, docs/offload.md "The planner"). A GPT (4 x 64, seq 32)
# on 2 devices, pp 2, 1F1B, 4 microbatches of 2, under a cap of 3,000,000 bytes:
# without offload rank 0 needs more; with the stashed activations off the
# device (or the optimizer state) it fits.
# - --offload auto with a free host link: the activations (the first choice
#   that fits; both cost nothing); with a 1 GB/s link: the optimizer state,
#   whose transfers are fewer bytes than the stashes'
# - --offload activations: the transfer part of the step is the closed form
#   1e3 x m x 2 x A / host-bw, A the bytes of one microbatch's stash, read off
#   two plans as rank 0's peak without offload less its peak with it (its
#   replay keeps one stash fewer at its peak), at two bandwidths
# - brigade train --plan with that plan: every rank's measured peak is the
#   plan's predicted peak, byte for byte (--metrics)
# - bad --offload values refused
. "$(dirname "$0")/../lib/harness.sh"
M=(--model gpt --layers 4 --d-model 64 --heads 2 --seq 32 --batch 8)
PL=("${M[@]}" --microbatch-size 2 --devices 2 --pp 2 --schedule 1f1b)

# plan NAME ARGS...: brigade plan into $T/NAME.json and $T/NAME.o
plan() {
  local n=$1
  shift
  timeout 60 "$B" plan "${PL[@]}" "$@" --json "$T/$n.json" >"$T/$n.o" 2>&1 ||
    die "plan $n ($*): $(tail -3 "$T/$n.o")"
}
# jq-like: a top-level key of a plan, or rank R's predicted peak (rank_peak R)
key() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' "$1" "$2"; }
rank_peak() {
  python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); print(max(s["predicted_peak_bytes"] for s in p["stages"] if s["rank"] == int(sys.argv[2])))' "$1" "$2"
}

plan free --mem 3000000 --offload auto --host-bw 0
[ "$(key "$T/free.json" offload)" = activations ] && ok "free host link, auto: --offload activations" ||
  bad "free host link, auto: offload '$(key "$T/free.json" offload)': $(grep 'best plan' "$T/free.o")"
plan slow --mem 3000000 --offload auto --host-bw 1e9
[ "$(key "$T/slow.json" offload)" = optimizer ] && ok "1 GB/s host link, auto: --offload optimizer (fewer bytes)" ||
  bad "1 GB/s host link, auto: offload '$(key "$T/slow.json" offload)': $(grep 'best plan' "$T/slow.o")"
plan none --mem 1G
grep -q "pp 2 x dp 1" "$T/none.o" || die "no pp 2 plan without offload: $(head -3 "$T/none.o")"
[ "$(rank_peak "$T/none.json" 0)" -gt 3000000 ] && ok "without offload rank 0 needs $(rank_peak "$T/none.json" 0) > 3000000" ||
  bad "without offload rank 0 needs $(rank_peak "$T/none.json" 0)"

A=""
for hb in 1e9 5e8; do
  plan "a$hb" --mem 3000000 --offload activations --host-bw $hb
  A=$(($(rank_peak "$T/none.json" 0) - $(rank_peak "$T/a$hb.json" 0)))
  got=$(key "$T/a$hb.json" predicted_offload_ms)
  if python3 -c "import sys; a,hb,g=map(float,sys.argv[1:]); w=1e3*4*2*a/hb; sys.exit(not (a > 0 and abs(g-w) <= 1e-9*w))" "$A" "$hb" "$got"; then
    ok "--host-bw $hb: transfers $got ms = 1e3 x 4 x 2 x $A / $hb"
  else
    bad "--host-bw $hb: transfers $got ms, stash $A bytes"
  fi
done

# the plan run: measured peak = the plan's prediction on every rank
if timeout 120 "$B" launch -n 2 -- "$B" train "${M[@]}" --steps 2 --threads 1 --plan "$T/a1e9.json" \
     --metrics "$T/m.jsonl" --quiet >"$T/run.o" 2>&1; then
  for r in 0 1; do
    got=$(sed -n "s/.*\"rank\": $r, \"step\": 2,.*\"peak_bytes\": \([0-9]*\).*/\1/p" "$T/m.jsonl")
    want=$(rank_peak "$T/a1e9.json" $r)
    [ -n "$got" ] && [ "$got" = "$want" ] && ok "train --plan (activations): rank $r peak $got = planned" ||
      bad "train --plan (activations): rank $r peak '$got', planned $want"
  done
else
  bad "train --plan: $(tail -3 "$T/run.o")"
fi

for v in activations,optimizer params optimizer,params,activations,x; do
  "$B" plan "${PL[@]}" --offload "$v" >"$T/e.o" 2>&1
  rc=$?
  [ "$rc" = 2 ] && grep -q -- "--offload" "$T/e.o" && ok "--offload $v refused: $(head -1 "$T/e.o")" || bad "--offload $v: rc $rc: $(head -2 "$T/e.o")"
done
finish 10
