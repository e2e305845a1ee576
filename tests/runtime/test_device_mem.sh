#!/usr/bin/env bash
# tests/runtime/test_device_mem.sh: --device-mem caps each rank's backend
# memory on the CPU backend as on a device. A GPT whose training state needs
# 35.8 MiB in one process fails there under a 24 MiB cap, naming the buffer
# and the bytes, and trains at pp 2 (and tp 2) within it, to the weights of
# the uncapped single process; each rank's measured peak equals the
# prediction and stays under its cap (the summary, and the metrics JSON at tp 2
# on cpu-async); a per-rank list caps each rank on its own.
. "$(dirname "$0")/../lib/harness.sh"
A=(--layers 8 --d-model 128 --heads 4 --seq 64 --batch 8 --microbatches 4 --steps 3 --threads 1)
CAP=25165824 # 24M

expect 1 "cpu backend memory cap: " train "${A[@]}" --device-mem 24M
grep -qE "[0-9]+ bytes asked for [a-z].* with [0-9]+ in use would make [0-9]+, above the cap of $CAP \(--device-mem\)" "$T/err" &&
    ok "pp 1 names the buffer, the bytes and the cap: $(cut -c1-160 "$T/err")" || bad "message: $(cat "$T/err")"

train_save one 1 "${A[@]}"
train_save pp2 2 "${A[@]}" --pp 2 --split 5,6 --device-mem 24M && same "$T/one" "$T/pp2" "pp 2 under a 24M cap = one process"
train_save tp2 2 "${A[@]}" --tp 2 --device-mem 24M && near "$T/one" "$T/tp2" "tp 2 under a 24M cap ~ one process"

# measured peak = predicted, under the cap, on each rank (the summary's peak and mem sim columns, MiB)
if timeout 120 "$B" launch -n 2 -- "$B" train "${A[@]}" --pp 2 --split 5,6 --device-mem 24M >"$T/sum.log" 2>&1; then
    awk -v cap=$CAP '/^ +[0-9]+ +[0-9]+ +[0-9]+ / { n++; if ($5 != $NF) bad = bad " rank " $1 ": peak " $5 " != predicted " $NF;
        if ($5 * 1048576 > cap) bad = bad " rank " $1 " above the cap" }
        END { if (n != 2 || bad != "") { print "FAIL" bad " (" n " ranks)"; exit 1 } }' "$T/sum.log" &&
        ok "peak = prediction <= cap on both ranks: $(grep -A2 '^rank' "$T/sum.log" | tr -s ' ' | tr '\n' ';')" ||
        bad "summary: $(cat "$T/sum.log")"
else bad "pp 2 summary run failed: $(tail -3 "$T/sum.log")"; fi

# the metrics JSON's predicted_bytes and peak_bytes: equal on every rank at the last step, under the cap,
# also at tp 2 on cpu-async (a backend that queues work: the last stage's per-microbatch losses are counted)
if timeout 120 "$B" launch -n 2 -- "$B" train "${A[@]}" --tp 2 --backend cpu-async --device-mem 24M --quiet \
     --metrics "$T/tpa.jsonl" >"$T/tpa.log" 2>&1 &&
   v=$(python3 - "$T/tpa.jsonl" $CAP <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"peak_bytes"' in l]
last = {r["rank"]: r for r in rows if r["step"] == max(x["step"] for x in rows)}
assert sorted(last) == [0, 1], last.keys()
for k, r in sorted(last.items()):
    assert r["peak_bytes"] == r["predicted_bytes"] <= int(sys.argv[2]), (k, r["peak_bytes"], r["predicted_bytes"])
print(", ".join(f"rank {k}: {r['peak_bytes']}" for k, r in sorted(last.items())))
PY
); then ok "tp 2 on cpu-async: metrics peak_bytes = predicted_bytes <= cap ($v)"; else
    bad "tp 2 on cpu-async, metrics: ${v:-$(tail -3 "$T/tpa.log")}"; fi

# one cap per rank: rank 1 (18.6 MiB at this split) under 16M fails, naming it; rank 0 keeps 24M
if timeout 120 "$B" launch -n 2 -- "$B" train "${A[@]}" --pp 2 --split 5,6 --device-mem 24M,16M >"$T/pr.log" 2>&1; then
    bad "a 16M cap on rank 1 trained"
else
    grep -q "rank 1 (stage 1).*above the cap of 16777216" "$T/pr.log" && ok "per-rank caps: rank 1's 16M refused" ||
        bad "per-rank caps: $(tail -3 "$T/pr.log")"
fi
if timeout 120 "$B" launch -n 2 -- "$B" train "${A[@]}" --pp 2 --device-mem 24M,24M,24M >"$T/n.log" 2>&1; then
    bad "3 caps for 2 ranks accepted"
else
    grep -q "device memory caps: 3 given for a job of 2 ranks" "$T/n.log" && ok "3 caps for 2 ranks refused" ||
        bad "cap count: $(tail -3 "$T/n.log")"
fi
expect 2 "--device-mem entry 0 is \"0\": a size must be > 0" train "${A[@]}" --device-mem 0
expect 2 "--device-mem expects a positive size like 512M or 24G, got \"lots\"" train "${A[@]}" --device-mem lots
finish
