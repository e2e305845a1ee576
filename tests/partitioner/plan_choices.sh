#!/usr/bin/env bash
# tests/partitioner/plan_choices.sh: `brigade plan` choosing the sharding
# stage, offload and recomputation together (--zero auto --offload auto
# --recompute) and its table of the memory choices at the chosen layout.
# - 4 devices of 12 MiB, pp 2 x dp 2: only --zero 3 with the optimizer state
#   and parameter shard offloaded fits, with recomputation or with the
#   activations offloaded too (every other row of the table says no); the
#   plan takes recomputation (no transfers, the faster), records the choice
#   and trains under --device-mem 12M on 4 ranks, each rank's peak = its
#   prediction.
# - With room (14 MiB) several choices fit: the chosen plan's predicted step
#   is the fastest of the table's fitting rows (the planner's own model,
#   enumerated by the table).
# - 10 MiB: nothing fits; the error gives the smallest budget, which fits,
#   and one byte less does not.
. "$(dirname "$0")/../lib/harness.sh"
PM=(--model gpt --layers 8 --d-model 128 --heads 4 --seq 64 --batch 16 --microbatch-size 2)
AUTO=(--devices 4 --pp 2 --tp 1 --schedule 1f1b --zero auto --offload auto --recompute)

timeout 60 "$B" plan "${PM[@]}" "${AUTO[@]}" --mem 12M --json "$T/p.json" >"$T/p.o" 2>&1 || die "plan 12M: $(tail -3 "$T/p.o")"
grep -q '"zero": 3' "$T/p.json" && grep -q '"offload": "optimizer,params"' "$T/p.json" && grep -q '"recompute": true' "$T/p.json" &&
  ok "12 MiB: the plan is --zero 3 --offload optimizer,params with recomputation" || bad "12 MiB plan: $(grep -E '"(zero|offload|recompute)"' "$T/p.json" | tr -d '\n')"
# the table's rows: zero offload recompute peak step fits
awk '/^memory choices/ { t = 1; next } t && /^ +[0-3] / { print }' "$T/p.o" >"$T/rows"
[ "$(wc -l <"$T/rows")" = 36 ] && [ "$(grep ' yes$' "$T/rows" | awk '{print $1, $2, $3}' | tr '\n' ';')" = \
  "3 optimizer,params allowed;3 optimizer,params,activations no;3 optimizer,params,activations allowed;" ] &&
  ok "12 MiB: of 36 choices only zero 3 optimizer,params with recomputation or the activations offloaded fits" ||
  bad "12 MiB table: $(cat "$T/rows" | tr '\n' ';')"
awk -v cap=12582912 '$NF == "yes" && $4 > cap { exit 1 } $NF == "no" && $4 != "-" && $4 <= cap { exit 1 }' "$T/rows" &&
  ok "12 MiB: every row's verdict agrees with its peak against the budget" || bad "verdicts: $(cat "$T/rows" | tr '\n' ';')"
if timeout 200 "$B" launch -n 4 -- "$B" train --plan "$T/p.json" --steps 2 --threads 1 --device-mem 12M >"$T/t.log" 2>&1; then
  awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / { n++; if ($5 != $NF || $5 * 1048576 > 12582912) bad = bad " rank " $1 ": " $5 " vs " $NF }
    END { if (n != 4 || bad != "") { print "FAIL" bad " (" n " ranks)"; exit 1 } }' "$T/t.log" &&
    ok "brigade train --plan under --device-mem 12M on 4 ranks: peak = predicted MiB $(awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / {printf "%s/%s ", $5, $NF}' "$T/t.log")" ||
    bad "peaks: $(grep -A4 '^rank' "$T/t.log" | tr -s ' ' | tr '\n' ';')"
else bad "train --plan under 12M: $(tail -3 "$T/t.log")"; fi

# with room: the chosen step is the fastest fitting row
timeout 60 "$B" plan "${PM[@]}" "${AUTO[@]}" --mem 14M >"$T/q.o" 2>&1 || bad "plan 14M: $(tail -3 "$T/q.o")"
best=$(sed -n 's/^predicted.*: step \([0-9.]*\) ms.*/\1/p' "$T/q.o")
min=$(awk '/^memory choices/ { t = 1; next } t && /^ +[0-3] / && $NF == "yes" { n++; if (m == "" || $5 < m) m = $5 } END { if (n > 1) print m }' "$T/q.o")
[ -n "$best" ] && [ "$best" = "$min" ] && ok "14 MiB: the chosen step $best ms is the fastest fitting choice's" ||
  bad "14 MiB: chosen '$best', fastest fitting '$min': $(sed -n '/^memory choices/,$p' "$T/q.o" | tr '\n' ';')"

# nothing fits: the smallest budget, exact
timeout 60 "$B" plan "${PM[@]}" "${AUTO[@]}" --mem 10M >"$T/n.o" 2>"$T/n.e"
rc=$?
need=$(sed -n 's/.*Smallest budget that fits: \([0-9]*\) bytes.*/\1/p' "$T/n.e")
if [ "$rc" = 1 ] && [ -n "$need" ] && [ "$(wc -l <"$T/n.e")" = 1 ]; then
  timeout 60 "$B" plan "${PM[@]}" "${AUTO[@]}" --mem "$need" >/dev/null 2>&1 &&
    ! timeout 60 "$B" plan "${PM[@]}" "${AUTO[@]}" --mem "$((need - 1))" >/dev/null 2>&1 &&
    ok "10 MiB: the smallest budget $need fits and one byte less does not" || bad "smallest budget $need is not exact"
else bad "10 MiB: rc $rc: $(cat "$T/n.e")"; fi
finish 6
